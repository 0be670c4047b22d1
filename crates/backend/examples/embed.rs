//! Embedding emon's virtual PMU in another VMM: a minimal KVM exit loop that drives
//! `emon_backend::vpmu::VirtualPmu` (the PMU model `emon_pmu::pmu::Pmu`, counted by the precise
//! backend) through `emon_backend::kvm::KvmCpu`, one call per kind of exit. It uses none of
//! emon's own VMM.
//!
//! The guest (64-bit, CPL0) programs IA32_PERFEVTSEL0 for Instructions Retired, sets
//! IA32_PERF_GLOBAL_CTRL, runs `loop .` with ECX = 1000, stops the counter, reads IA32_PMC0 with
//! RDMSR and writes to port 0xF4. GLOBAL_CTRL powers on with the GP counters' bits set (SDM
//! 18.2.2), so the counter counts from the PERFEVTSEL0 write on: the 3 instructions that set
//! GLOBAL_CTRL, `mov ecx, 1000`, 1000 LOOPs and the 3 that stop it (the stopping WRMSR counts;
//! the starting one does not): 1007.
//!
//!     cargo run -p emon-backend --example embed
use emon_backend::guest_debug::GuestDebug;
use emon_backend::kvm::{trap_pmu_msrs, KvmCpu};
use emon_backend::precise::Precise;
use emon_backend::vpmu::{Entry, VirtualPmu};
use emon_backend::NoPorts;
use emon_pmu::pmu::{msr, Pmu};
use emon_pmu::profile::Profile;
use kvm_bindings::{kvm_segment, kvm_userspace_memory_region};
use kvm_ioctls::{Kvm, VcpuExit, VcpuFd};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

const CODE: u64 = 0x10000;
const EXIT_PORT: u16 = 0xF4;

/// The guest, assembled (see the module documentation).
const GUEST: &[u8] = &[
    0xB9, 0x86, 0x01, 0x00, 0x00, // mov ecx, 0x186 (IA32_PERFEVTSEL0)
    0xB8, 0xC0, 0x00, 0x43, 0x00, // mov eax, 0x4300C0: Instructions Retired, USR | OS | EN
    0x31, 0xD2, // xor edx, edx
    0x0F, 0x30, // wrmsr: counting starts after it
    0xB9, 0x8F, 0x03, 0x00, 0x00, // mov ecx, 0x38F (IA32_PERF_GLOBAL_CTRL)
    0xB8, 0x01, 0x00, 0x00, 0x00, // mov eax, 1
    0x0F, 0x30, // wrmsr: still counting
    0xB9, 0xE8, 0x03, 0x00, 0x00, // mov ecx, 1000
    0xE2, 0xFE, // loop .
    0xB9, 0x8F, 0x03, 0x00, 0x00, // mov ecx, 0x38F
    0x31, 0xC0, // xor eax, eax
    0x0F, 0x30, // wrmsr: counting stops after it
    0xB9, 0xC1, 0x00, 0x00, 0x00, // mov ecx, 0xC1 (IA32_PMC0)
    0x0F, 0x32, // rdmsr
    0xE6, 0xF4, // out 0xF4, al
];

/// What the guest saw in IA32_PMC0, the model's own value, and the backend's account.
#[derive(Debug, PartialEq, Eq)]
pub struct Outcome {
    pub guest_read: u64,
    pub model: u64,
    pub account: String,
}

/// An exit, copied out of the vCPU's run area so that the vCPU can be borrowed again.
enum Exit {
    Msr,
    Stepped(u64),
    Done,
}

pub fn run() -> Result<Outcome, Box<dyn std::error::Error>> {
    let kvm = Kvm::new()?;
    let vm = kvm.create_vm()?;
    vm.set_tss_address(0xFFFB_D000)?;
    vm.create_irq_chip()?; // the in-kernel local APIC takes the PMI
    trap_pmu_msrs(&vm)?;
    let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 2 << 20)])?;
    let host = mem.get_host_address(GuestAddress(0))? as u64;
    let region = kvm_userspace_memory_region {
        slot: 0,
        guest_phys_addr: 0,
        memory_size: 2 << 20,
        userspace_addr: host,
        flags: 0,
    };
    // SAFETY: `mem` outlives the VM's use of it.
    unsafe { vm.set_user_memory_region(region)? };
    let fd = vm.create_vcpu(0)?;
    enter_long_mode(&fd, &mem)?;
    // The vCPU with its KVM_SET_GUEST_DEBUG control, which the backend's single-stepping goes
    // through, and its registers as of the last exit.
    let mut cpu = KvmCpu::new(&kvm, fd, GuestDebug::default(), None);

    // The component: a PMU model for a profile, counted by a backend, behind one facade.
    let mut vpmu = VirtualPmu::new(Pmu::new(&Profile::load("skylake")?.pmu), Box::new(Precise::new()));
    let mut at_boundary = true;
    let guest_read = loop {
        // Delivers a pending PMI, reprograms what the guest changed, and arms the backend.
        if vpmu.before_entry(&mut cpu.with(&mem), &mut NoPorts, at_boundary)? == Entry::Retired {
            at_boundary = true;
            continue;
        }
        let exit = match cpu.run()? {
            // Every PMU MSR (and any MSR KVM does not know) exits here.
            VcpuExit::X86Rdmsr(e) => {
                match vpmu.rdmsr(e.index) {
                    Some(Ok(v)) => *e.data = v,
                    _ => *e.error = 1, // #GP (this VMM knows no other MSR)
                }
                Exit::Msr
            }
            VcpuExit::X86Wrmsr(e) => {
                if !matches!(vpmu.wrmsr(e.index, e.data), Some(Ok(()))) {
                    *e.error = 1;
                }
                Exit::Msr
            }
            VcpuExit::Debug(d) => Exit::Stepped(d.pc),
            VcpuExit::IoOut(EXIT_PORT, _) => Exit::Done,
            other => return Err(format!("unexpected exit {other:?}").into()),
        };
        match exit {
            Exit::Msr => at_boundary = false,
            Exit::Stepped(pc) => {
                vpmu.debug_exit(&mut cpu.with(&mem), pc)?;
                at_boundary = true;
            }
            Exit::Done => break cpu.regs()?.rax,
        }
    };
    let steps = vpmu.report().summary;
    Ok(Outcome { guest_read, model: vpmu.pmu().rdmsr(msr::IA32_PMC0)?, account: steps })
}

/// 64-bit mode at CPL0 with the first 2 MiB identity-mapped (one 2 MiB page), entered at [`CODE`].
fn enter_long_mode(fd: &VcpuFd, mem: &GuestMemoryMmap) -> Result<(), Box<dyn std::error::Error>> {
    mem.write_obj(0x2003u64, GuestAddress(0x1000))?; // PML4[0] -> PDPT
    mem.write_obj(0x3003u64, GuestAddress(0x2000))?; // PDPT[0] -> PD
    mem.write_obj(0x83u64, GuestAddress(0x3000))?; // PD[0]: 2 MiB page at 0, present, writable
    mem.write_slice(GUEST, GuestAddress(CODE))?;
    let mut sregs = fd.get_sregs()?;
    let code = kvm_segment {
        base: 0,
        limit: 0xFFFF_FFFF,
        selector: 0x08,
        type_: 0xB,
        present: 1,
        s: 1,
        l: 1,
        g: 1,
        ..Default::default()
    };
    let data = kvm_segment { selector: 0x10, type_: 0x3, l: 0, db: 1, ..code };
    sregs.cs = code;
    (sregs.ds, sregs.es, sregs.fs, sregs.gs, sregs.ss) = (data, data, data, data, data);
    sregs.cr3 = 0x1000;
    sregs.cr4 = 1 << 5; // PAE
    sregs.cr0 = 1 << 31 | 1 << 4 | 1; // PG, ET, PE
    sregs.efer = 1 << 10 | 1 << 8; // LMA, LME
    fd.set_sregs(&sregs)?;
    let regs = kvm_bindings::kvm_regs { rip: CODE, rsp: 0x8000, rflags: 2, ..Default::default() };
    fd.set_regs(&regs)?;
    Ok(())
}

#[cfg_attr(test, allow(dead_code))]
fn main() {
    match run() {
        Ok(o) => println!("IA32_PMC0 = {} (the guest read {}); {}", o.model, o.guest_read, o.account),
        Err(e) => {
            eprintln!("embed: {e}");
            std::process::exit(1);
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_embedded_pmu_counts_the_guest_loop_exactly() {
        if !std::path::Path::new("/dev/kvm").exists() && std::env::var("EMON_SKIP_KVM_TESTS").as_deref() == Ok("1") {
            eprintln!("SKIPPED: no /dev/kvm (EMON_SKIP_KVM_TESTS=1)");
            return;
        }
        let o = super::run().expect("the example runs");
        assert_eq!((o.model, o.guest_read), (1007, 1007), "{o:?}");
    }
}
