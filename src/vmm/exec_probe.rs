//! How this host's KVM runs a guest's kernel code, measured rather than assumed: natively, or
//! in KVM's instruction emulator (kvm_pvm runs every CPL0 instruction there, about a microsecond
//! each; README, "CPL0 code in the TCG engine"). A throwaway long-mode VM runs `dec ecx; jnz` at
//! CPL0 a few thousand times, and again with none, and emon compares the two.
use super::boot::{self, Entry, Mode};
use super::error::kvm_err;
use super::layout::HIGH_MEM_START;
use super::VmmError;
use crate::backend::guest_debug::GuestDebug;
use crate::backend::kvm::KvmCpu;
use crate::backend::Vcpu as _;
use kvm_ioctls::{Kvm, VcpuExit};
use std::time::{Duration, Instant};
use vm_memory::GuestMemoryMmap;

/// Iterations of the timed loop: 2N instructions, a few milliseconds where KVM emulates them.
const ITERATIONS: u32 = 4000;
/// Time per instruction above which KVM emulates CPL0 code: a native core runs `dec; jnz` at well
/// under a nanosecond, an emulator at hundreds.
const EMULATED_NS: f64 = 20.0;
const PROBE_RAM: u64 = 2 << 20;

/// What the probe measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cpl0Speed {
    /// Nanoseconds per CPL0 instruction, the cost of the VM entry and exit taken out.
    pub ns_per_insn: f64,
}

impl Cpl0Speed {
    /// Whether KVM emulates CPL0 code here.
    pub fn emulated(&self) -> bool {
        self.ns_per_insn > EMULATED_NS
    }

    /// `emon host`'s line.
    pub fn describe(&self) -> String {
        let how = if self.emulated() { "emulated by KVM" } else { "run natively" };
        format!("CPL0 guest code: {how} ({:.1} ns per instruction, measured)", self.ns_per_insn)
    }
}

/// Times `mov ecx, n; 1: dec ecx; jnz 1b; hlt` at CPL0 in long mode (best of three runs).
fn time_loop(kvm: &Kvm, n: u32) -> Result<Duration, VmmError> {
    let vm = kvm.create_vm().map_err(kvm_err("KVM_CREATE_VM"))?;
    let mem = super::builder::create_memory(&vm, PROBE_RAM)?;
    let mut vcpu = vm.create_vcpu(0).map_err(kvm_err("KVM_CREATE_VCPU"))?;
    let mut code = vec![0xB9];
    code.extend(n.max(1).to_le_bytes());
    code.extend([0xFF, 0xC9, 0x75, 0xFC, 0xF4]);
    boot::write(&mem, HIGH_MEM_START, &code)?;
    let entry = Entry { mode: Mode::Long, rip: HIGH_MEM_START, rax: 0, rbx: 0, rdi: 0, rsi: 0, rsp: 0x8_0000 };
    let mut best = Duration::MAX;
    for _ in 0..3 {
        boot::enter(&vcpu, &mem, PROBE_RAM, &entry)?;
        let start = Instant::now();
        loop {
            match vcpu.run().map_err(kvm_err("KVM_RUN"))? {
                VcpuExit::Hlt => break,
                VcpuExit::Intr => continue,
                other => return Err(VmmError::Guest(format!("the CPL0 probe stopped on {other:?} instead of HLT"))),
            }
        }
        best = best.min(start.elapsed());
    }
    Ok(best)
}

/// Measures how fast this host runs CPL0 guest code (see the module documentation), once per
/// process.
pub fn cpl0() -> Result<Cpl0Speed, VmmError> {
    static MEASURED: std::sync::OnceLock<Cpl0Speed> = std::sync::OnceLock::new();
    if let Some(s) = MEASURED.get() {
        return Ok(*s);
    }
    let s = measure(&super::host::open()?)?;
    Ok(*MEASURED.get_or_init(|| s))
}

fn measure(kvm: &Kvm) -> Result<Cpl0Speed, VmmError> {
    let looped = time_loop(kvm, ITERATIONS)?;
    let bare = time_loop(kvm, 1)?;
    let insns = f64::from(2 * ITERATIONS);
    let ns = looped.saturating_sub(bare).as_nanos() as f64 / insns;
    Ok(Cpl0Speed { ns_per_insn: ns })
}

/// Whether this KVM keeps single-stepping the guest across a KVM_SET_REGS that moves RIP, tried
/// once per process on a throwaway long-mode VM: `nop` x4, `hlt`, stepped once, then moved on by
/// one `nop` and run again. KVM on VMX and SVM keeps its trap flag only at the RIP where guest
/// debugging was set (the step then ends at the HLT), and emon then sets guest debugging again
/// after each such write; kvm_pvm keeps stepping. The answer sets
/// [`crate::backend::kvm::KvmCpu::step_survives_set_regs`].
pub fn step_survives_set_regs() -> Result<bool, VmmError> {
    static MEASURED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if let Some(s) = MEASURED.get() {
        return Ok(*s);
    }
    let s = try_step_across_set_regs(&super::host::open()?)?;
    Ok(*MEASURED.get_or_init(|| s))
}

/// `nop` x4, `hlt`: the single-step probe's guest.
const STEP_PROBE_CODE: [u8; 5] = [0x90, 0x90, 0x90, 0x90, 0xF4];

/// A throwaway long-mode VM about to run [`STEP_PROBE_CODE`], as a [`KvmCpu`] single-stepping it.
fn step_probe_vm(kvm: &Kvm) -> Result<(kvm_ioctls::VmFd, GuestMemoryMmap, KvmCpu), VmmError> {
    let vm = kvm.create_vm().map_err(kvm_err("KVM_CREATE_VM"))?;
    let mem = super::builder::create_memory(&vm, PROBE_RAM)?;
    let fd = vm.create_vcpu(0).map_err(kvm_err("KVM_CREATE_VCPU"))?;
    boot::write(&mem, HIGH_MEM_START, &STEP_PROBE_CODE)?;
    let entry = Entry { mode: Mode::Long, rip: HIGH_MEM_START, rax: 0, rbx: 0, rdi: 0, rsi: 0, rsp: 0x8_0000 };
    boot::enter(&fd, &mem, PROBE_RAM, &entry)?;
    let mut cpu = KvmCpu::new(kvm, fd, GuestDebug::default(), None);
    cpu.with(&mem).set_single_step(true)?;
    Ok((vm, mem, cpu))
}

/// Runs the vCPU to its next stop: the linear RIP of a debug exit, `None` for any other exit.
fn step(cpu: &mut KvmCpu) -> Result<Option<u64>, VmmError> {
    loop {
        return match cpu.run().map_err(kvm_err("KVM_RUN"))? {
            VcpuExit::Debug(d) => Ok(Some(d.pc)),
            VcpuExit::Intr => continue,
            _ => Ok(None),
        };
    }
}

fn try_step_across_set_regs(kvm: &Kvm) -> Result<bool, VmmError> {
    let (_vm, _mem, mut cpu) = step_probe_vm(kvm)?;
    if step(&mut cpu)? != Some(HIGH_MEM_START + 1) {
        return Err(VmmError::Guest("the single-step probe did not stop after its first instruction".into()));
    }
    let mut regs = cpu.fd.get_regs().map_err(kvm_err("KVM_GET_REGS"))?;
    regs.rip = HIGH_MEM_START + 3;
    cpu.fd.set_regs(&regs).map_err(kvm_err("KVM_SET_REGS"))?;
    Ok(step(&mut cpu)? == Some(HIGH_MEM_START + 4))
}

/// Whether SYSCALL executed at CPL3 enters the kernel as on hardware (SDM Vol. 2B, SYSCALL: CS
/// from IA32_STAR[47:32], CPL 0, RIP from IA32_LSTAR), tried once per process on a throwaway
/// long-mode VM with every page user-accessible: the vCPU starts at CPL3 on `syscall`, and LSTAR
/// points at `hlt`. On hardware the HLT runs at CPL0 and exits to the VMM; kvm_pvm arrives at
/// LSTAR still at CPL3, where HLT raises #GP and the VM, with no IDT, shuts down. The answer
/// decides whether emon completes SYSCALL itself (README, "User mode (CPL3)").
pub fn syscall_enters_kernel() -> Result<bool, VmmError> {
    static MEASURED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if let Some(s) = MEASURED.get() {
        return Ok(*s);
    }
    let s = try_syscall(&super::host::open()?)?;
    Ok(*MEASURED.get_or_init(|| s))
}

fn try_syscall(kvm: &Kvm) -> Result<bool, VmmError> {
    use crate::x86::arch::{EFER_SCE, IA32_FMASK, IA32_LSTAR, IA32_STAR};
    use kvm_bindings::{kvm_msr_entry, Msrs};
    const USER: u64 = 1 << 2;
    const LSTAR: u64 = HIGH_MEM_START + 0x100;
    let vm = kvm.create_vm().map_err(kvm_err("KVM_CREATE_VM"))?;
    let mem = super::builder::create_memory(&vm, PROBE_RAM)?;
    let mut fd = vm.create_vcpu(0).map_err(kvm_err("KVM_CREATE_VCPU"))?;
    boot::write(&mem, HIGH_MEM_START, &[0x0F, 0x05])?; // syscall
    boot::write(&mem, LSTAR, &[0xF4])?; // hlt
    let entry = Entry { mode: Mode::Long, rip: HIGH_MEM_START, rax: 0, rbx: 0, rdi: 0, rsi: 0, rsp: 0x8_0000 };
    boot::enter(&fd, &mem, PROBE_RAM, &entry)?;
    // The PML4, PDPT and PD entries that map the first 2 MiB (present, writable), user-accessible.
    use super::layout::{PDPT_ADDR, PD_ADDR, PML4_ADDR};
    for (at, e) in [(PML4_ADDR, PDPT_ADDR | 3), (PDPT_ADDR, PD_ADDR | 3), (PD_ADDR, 0x83)] {
        boot::write(&mem, at, &(e | USER).to_le_bytes())?;
    }
    let msrs = [(IA32_STAR, 0x10u64 << 48 | 0x08 << 32), (IA32_LSTAR, LSTAR), (IA32_FMASK, 0)];
    let entries: Vec<kvm_msr_entry> =
        msrs.iter().map(|&(index, data)| kvm_msr_entry { index, data, ..Default::default() }).collect();
    let msrs = Msrs::from_entries(&entries).map_err(|_| VmmError::Guest("the SYSCALL probe's MSRs".into()))?;
    fd.set_msrs(&msrs).map_err(kvm_err("KVM_SET_MSRS"))?;
    let mut sregs = fd.get_sregs().map_err(kvm_err("KVM_GET_SREGS"))?;
    sregs.efer |= EFER_SCE;
    sregs.cs.selector = 0x1B;
    sregs.cs.dpl = 3;
    for s in [&mut sregs.ss, &mut sregs.ds, &mut sregs.es] {
        s.selector = 0x23;
        s.dpl = 3;
    }
    fd.set_sregs(&sregs).map_err(kvm_err("KVM_SET_SREGS"))?;
    loop {
        return match fd.run().map_err(kvm_err("KVM_RUN"))? {
            VcpuExit::Intr => continue,
            VcpuExit::Hlt => {
                let s = fd.get_sregs().map_err(kvm_err("KVM_GET_SREGS"))?;
                Ok(s.cs.selector == 0x08 && s.cs.dpl == 0)
            }
            _ => Ok(false),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whatever the host does with its trap flag, a [`KvmCpu`] told what the probe found goes on
    /// single-stepping after a KVM_SET_REGS that moves RIP: the next run retires one instruction.
    #[test]
    fn single_stepping_goes_on_after_registers_are_set() {
        let kvm = super::super::host::open().unwrap();
        let (_vm, _mem, mut cpu) = step_probe_vm(&kvm).unwrap();
        cpu.step_survives_set_regs = step_survives_set_regs().unwrap();
        assert_eq!(step(&mut cpu).unwrap(), Some(HIGH_MEM_START + 1));
        let mut regs = cpu.regs().unwrap();
        regs.rip = HIGH_MEM_START + 3;
        cpu.set_regs(&regs).unwrap();
        assert_eq!(step(&mut cpu).unwrap(), Some(HIGH_MEM_START + 4), "one instruction, then the debug exit");
    }

    /// The probe answers on any host (true on hardware-virtualized KVM, false on kvm_pvm), and
    /// agrees with itself.
    #[test]
    fn the_syscall_probe_answers() {
        let kvm = super::super::host::open().unwrap();
        assert_eq!(try_syscall(&kvm).unwrap(), syscall_enters_kernel().unwrap());
    }

    #[test]
    fn tells_emulation_from_native_speed() {
        assert!(Cpl0Speed { ns_per_insn: 800.0 }.emulated());
        assert!(!Cpl0Speed { ns_per_insn: 0.4 }.emulated());
        assert_eq!(
            Cpl0Speed { ns_per_insn: 812.25 }.describe(),
            "CPL0 guest code: emulated by KVM (812.2 ns per instruction, measured)"
        );
    }
}
