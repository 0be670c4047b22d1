//! The vCPU thread's exit loop: port I/O to the device bus, MSR exits to the virtual PMU,
//! and the conditions that end a run.
use super::devices::{PioAction, PioBus};
use super::kick::{self, StopReason, StopRequest};
use super::msr::MsrDispatch;
use super::rdpmc::GpCatch;
use super::VmmError;
use crate::backend::guest_debug::DebugExit;
use crate::backend::kvm::{event_probe::EventProbe, KvmCpu};
use crate::backend::precise::tcg::{self, Completed, EngineCell, Needs};
use crate::backend::vpmu::{Entry, VirtualPmu};
use crate::backend::Vcpu as _;
use crate::x86::arch::BP_VECTOR;
use crate::x86::mode::CpuMode;
use kvm_ioctls::{VcpuExit, VcpuFd};
use std::sync::Arc;
use vm_memory::GuestMemoryMmap;

/// Exit counts, for the summary and `--verbose`.
#[derive(Debug, Default, Clone)]
pub struct ExitStats {
    pub total: u64,
    pub pio: u64,
    pub mmio: u64,
    pub msr: u64,
    pub interrupted: u64,
    pub other: u64,
    /// Instructions KVM could not emulate that emon completed itself (in the TCG engine), INT3
    /// included.
    pub completed: u64,
    /// Of those, INT3s that emon delivered to the guest as #BP.
    pub int3_delivered: u64,
    /// This process's open file descriptors at the first KVM_RUN and at the end of the run
    /// (a backend that leaks host events shows here).
    pub fds_at_start: usize,
    pub fds_at_end: usize,
    /// vCPU ioctls made to read or write registers (README, "Registers between exits").
    pub register_ioctls: u64,
    /// How the TCG engine read the guest's TSC (README, "Guest time").
    pub engine_tsc: String,
}

/// The number of open file descriptors of this process.
pub fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map(|d| d.count()).unwrap_or(0)
}

/// Why the vCPU stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VcpuStop {
    /// The guest wrote to the debug-exit port.
    DebugExit(u32),
    /// Triple fault, or a shutdown/reset system event; with the registers at that point.
    Shutdown {
        why: String,
        registers: String,
    },
    Stopped(StopReason),
}

/// The vCPU and everything its exit loop drives.
pub struct Vcpu {
    /// The KVM vCPU: its fd, its one KVM_SET_GUEST_DEBUG control (the backend's single-stepping
    /// and the breakpoint on the guest's #GP handler), and its registers as of the last exit.
    pub cpu: KvmCpu,
    pub mem: GuestMemoryMmap,
    pub bus: PioBus,
    /// The virtual PMU, observed by the `--trace` file if there is one.
    pub pmu: VirtualPmu<Option<super::trace::Tracer>>,
    /// The MSRs outside the PMU that reach userspace.
    pub msrs: MsrDispatch,
    pub stats: ExitStats,
    pub stop: Arc<StopRequest>,
    /// The TCG engine that completes instructions KVM cannot emulate, made at the first.
    pub completer: EngineCell,
    /// RDPMC outside counted code, completed at the guest's #GP handler.
    pub catch: GpCatch,
}

/// How often (in exits) the tracer samples the counters between PMU events.
const TRACE_SAMPLE_EXITS: u64 = 4096;

/// What the exit loop does after an exit.
enum ExitAction {
    Continue,
    /// One instruction retired outside the vCPU (emon completed it): the vCPU is at this RIP,
    /// as after a single step.
    Stepped(u64),
    /// KVM_EXIT_DEBUG: a single step, the breakpoint on the #GP handler, or the guest's own #DB.
    Debug {
        pc: u64,
        dr6: u64,
    },
    /// KVM_RUN returned EINTR (a kick or a signal): nothing retired.
    Interrupted,
    Stop(VcpuStop),
    Shutdown(String),
}

impl Vcpu {
    /// Runs the guest until something ends the run. Call on the vCPU's own thread.
    pub fn run(&mut self) -> Result<VcpuStop, VmmError> {
        let immediate_exit = &mut self.cpu.fd.get_kvm_run().immediate_exit as *mut u8;
        kick::register(Some(immediate_exit));
        self.cpu.event_probe = Some(EventProbe::install(&self.cpu.fd, kick::event_probe_signal())?);
        self.stats.fds_at_start = open_fds();
        let r = self.run_loop();
        self.stats.fds_at_end = open_fds();
        self.stats.register_ioctls = self.cpu.register_ioctls();
        self.stats.engine_tsc = self.cpu.tsc.describe();
        self.pmu.observe(|t, pmu| {
            if let Some(t) = t {
                t.sample(pmu);
                t.finish();
            }
        });
        kick::register(None);
        self.bus.serial.flush();
        r
    }

    fn run_loop(&mut self) -> Result<VcpuStop, VmmError> {
        // Whether the vCPU is between instructions (rather than inside one, at an MSR or I/O exit).
        let mut at_boundary = true;
        loop {
            if let Some(reason) = self.stop.get() {
                if let (Ok(r), Ok(s)) = (self.cpu.regs(), self.cpu.sregs()) {
                    tracing::debug!(
                        rip = format_args!("{:#x}", r.rip),
                        cs = format_args!("{:#x}", s.cs.selector),
                        rflags = format_args!("{:#x}", r.rflags),
                        "the vCPU stopped ({reason:?})"
                    );
                }
                return Ok(VcpuStop::Stopped(reason));
            }
            let mut vcpu = self.cpu.with(&self.mem);
            if self.pmu.before_entry(&mut vcpu, &mut self.bus, at_boundary)? == Entry::Retired {
                at_boundary = true;
                continue;
            }
            self.catch.before_run(&mut self.cpu, &self.mem)?;
            let step = self.step()?;
            if self.stats.total % TRACE_SAMPLE_EXITS == 0 {
                self.pmu.observe(|t, pmu| t.iter_mut().for_each(|t| t.sample(pmu)));
            }
            match step {
                ExitAction::Continue => at_boundary = false,
                ExitAction::Interrupted => {}
                ExitAction::Stepped(pc) => {
                    self.backend_step(pc)?;
                    at_boundary = true;
                }
                ExitAction::Debug { pc, dr6 } => {
                    match self.cpu.debug.classify(dr6, pc) {
                        DebugExit::Step => {
                            // The backend's step; a step over the #GP handler it overlapped is over.
                            self.cpu.debug.pass = false;
                            self.backend_step(pc)?;
                        }
                        kind => self.catch.on_debug_exit(kind, dr6, &mut self.cpu, &self.mem, &mut self.pmu)?,
                    }
                    at_boundary = true;
                }
                ExitAction::Stop(s) => return Ok(s),
                ExitAction::Shutdown(mut why) => {
                    if let Some(rdpmc) = self.catch.explain_shutdown(&mut self.cpu, &self.mem) {
                        why += &format!("; {rdpmc}");
                    }
                    return Ok(VcpuStop::Shutdown { why, registers: dump_registers(&mut self.cpu) });
                }
            }
        }
    }

    /// The backend's single step (or an instruction emon completed): it retired one instruction
    /// and the vCPU is at `pc`.
    fn backend_step(&mut self, pc: u64) -> Result<(), VmmError> {
        let mut vcpu = self.cpu.with(&self.mem);
        Ok(self.pmu.debug_exit(&mut vcpu, pc)?)
    }

    fn step(&mut self) -> Result<ExitAction, VmmError> {
        let exit = match self.cpu.run() {
            Ok(exit) => exit,
            Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {
                // Nothing retired: the boundary state is unchanged.
                self.stats.interrupted += 1;
                self.cpu.fd.set_kvm_immediate_exit(0);
                return Ok(ExitAction::Interrupted);
            }
            Err(source) => return Err(VmmError::Kvm { op: "KVM_RUN", source }),
        };
        self.stats.total += 1;
        Ok(match exit {
            VcpuExit::IoOut(port, data) => {
                self.stats.pio += 1;
                tracing::trace!("out {port:#x}");
                match self.bus.write(port, data) {
                    PioAction::Continue => ExitAction::Continue,
                    PioAction::Exit(code) => ExitAction::Stop(VcpuStop::DebugExit(code)),
                    PioAction::Reset => {
                        ExitAction::Shutdown("reset through the i8042 keyboard controller (0xFE to port 0x64)".into())
                    }
                }
            }
            VcpuExit::IoIn(port, data) => {
                self.stats.pio += 1;
                tracing::trace!("in {port:#x}");
                self.bus.read(port, data);
                ExitAction::Continue
            }
            VcpuExit::X86Rdmsr(exit) => {
                self.stats.msr += 1;
                let r = match self.pmu.rdmsr(exit.index) {
                    Some(r) => r.ok(),
                    None => self.msrs.read(exit.index),
                };
                match r {
                    Some(v) => *exit.data = v,
                    None => *exit.error = 1,
                }
                ExitAction::Continue
            }
            VcpuExit::X86Wrmsr(exit) => {
                self.stats.msr += 1;
                let ok = match self.pmu.wrmsr(exit.index, exit.data) {
                    Some(r) => r.is_ok(),
                    None => self.msrs.write(exit.index, exit.data),
                };
                if !ok {
                    *exit.error = 1;
                }
                ExitAction::Continue
            }
            VcpuExit::MmioRead(addr, data) => {
                self.stats.mmio += 1;
                tracing::debug!("unhandled MMIO read at {addr:#x}");
                data.fill(0xFF);
                ExitAction::Continue
            }
            VcpuExit::MmioWrite(addr, _) => {
                self.stats.mmio += 1;
                tracing::debug!("unhandled MMIO write at {addr:#x}");
                ExitAction::Continue
            }
            VcpuExit::Debug(d) => ExitAction::Debug { pc: d.pc, dr6: d.dr6 },
            VcpuExit::Shutdown => ExitAction::Shutdown("triple fault (KVM_EXIT_SHUTDOWN)".into()),
            VcpuExit::SystemEvent(kind, _) => ExitAction::Shutdown(format!("system event {kind} (shutdown or reset)")),
            VcpuExit::Hlt => ExitAction::Shutdown("HLT with no interrupt source".into()),
            VcpuExit::FailEntry(reason, cpu) => {
                return Err(VmmError::Guest(format!(
                    "VM entry failed (hardware reason {reason:#x}, cpu {cpu})\n{}",
                    dump_registers(&mut self.cpu)
                )))
            }
            VcpuExit::InternalError => {
                let (suberror, data) = internal_error_data(&mut self.cpu.fd);
                match self.complete_emulation(suberror, &data) {
                    Ok(Some(rip)) => {
                        self.stats.completed += 1;
                        // One instruction retired, as after a single step.
                        ExitAction::Stepped(rip)
                    }
                    // One iteration of a REP string instruction: it has not retired.
                    Ok(None) => ExitAction::Continue,
                    Err(failure) => {
                        let long_mode = self.cpu.sregs().map(|s| s.cs.l == 1).unwrap_or(true);
                        let why = explain_internal_error(suberror, &data, long_mode);
                        let failure = failure.map(|f| format!("; emon's emulator failed too: {f}")).unwrap_or_default();
                        return Err(VmmError::Guest(format!(
                            "KVM internal error ({why}{failure})\n{}",
                            dump_registers(&mut self.cpu)
                        )));
                    }
                }
            }
            other => {
                self.stats.other += 1;
                tracing::debug!("unhandled exit {other:?}");
                ExitAction::Continue
            }
        })
    }
}

impl Vcpu {
    /// Completes an instruction KVM's emulator failed on in 64-bit code (kvm_pvm sends all of
    /// CPL0 code to its emulator), in the TCG engine on the vCPU's whole state (x87/SSE and the
    /// SYSCALL MSRs included), and writes back what it changed; INT3 becomes the #BP it raises.
    /// Returns the RIP after the instruction, or `None` after one iteration of a REP string
    /// instruction (which has not retired). `Err(None)`: not such a failure (no instruction
    /// bytes, not 64-bit); `Err(Some(why))`: emon could not complete it either.
    fn complete_emulation(&mut self, suberror: u32, data: &[u64]) -> Result<Option<u64>, Option<String>> {
        let bytes = &emulated_bytes(suberror, data).ok_or(None)?;
        let mut vcpu = self.cpu.with(&self.mem);
        let all = Needs { fpu: true, msrs: true };
        let before = tcg::state_of(&mut vcpu, all).map_err(|e| Some(e.to_string()))?;
        if CpuMode::from_sregs(&before.sregs).bitness != 64 {
            return Err(None);
        }
        if bytes.first() == Some(&INT3) {
            return self.deliver_int3(before.regs).map(Some).map_err(Some);
        }
        let engine = self.completer.get(&self.mem).map_err(|e| Some(e.to_string()))?;
        let (after, retired) = match engine.complete(&before).map_err(|e| Some(e.to_string()))? {
            Completed::Retired(after) => (after, true),
            Completed::Iteration(after) => (after, false),
            Completed::PageFault { error_code, cr2 } => {
                let mut vcpu = self.cpu.with(&self.mem);
                vcpu.inject_page_fault(error_code, cr2).map_err(|e| Some(e.to_string()))?;
                self.pmu.event_injected();
                return Ok(None);
            }
            Completed::Fault { vector } => {
                // An exception the engine raised, as emon delivers it; not #PF, whose error code
                // and CR2 the engine does not give back (emon's own completions do).
                let code = crate::x86::arch::plain_error_code(vector);
                let Some(code) = code.filter(|_| !(vector == 6 && lacks(bytes))) else {
                    return Err(Some(format!(
                        "the TCG engine raised {} on it (README, \"Instructions the TCG engine lacks\")",
                        crate::x86::arch::exception_name(vector)
                    )));
                };
                // The instruction faults as it would on the CPU: the exception goes to the guest.
                let mut vcpu = self.cpu.with(&self.mem);
                vcpu.inject_exception(vector as u8, code).map_err(|e| Some(e.to_string()))?;
                self.pmu.event_injected();
                return Ok(None);
            }
        };
        let mut vcpu = self.cpu.with(&self.mem);
        tcg::write_back(&mut vcpu, &before, &after, false).map_err(|e| Some(e.to_string()))?;
        Ok(retired.then_some(after.regs.rip))
    }

    /// INT3 retires and raises #BP, a trap: the guest's handler sees the address after it
    /// (SDM Vol. 3A, 6.5 "Exception Classifications"). KVM delivers the exception at the next
    /// entry, through the guest's IDT, with RIP already past the INT3.
    fn deliver_int3(&mut self, mut regs: kvm_bindings::kvm_regs) -> Result<u64, String> {
        regs.rip += 1;
        let mut vcpu = self.cpu.with(&self.mem);
        vcpu.set_regs(&regs).map_err(|e| e.to_string())?;
        vcpu.inject_exception(BP_VECTOR, None).map_err(|e| e.to_string())?;
        self.pmu.event_injected();
        self.stats.int3_delivered += 1;
        Ok(regs.rip)
    }
}

/// Whether the engine's #UD on `bytes` is its own lack rather than the instruction's: an
/// instruction the guest was told it has (AVX and the rest of "Instructions the TCG engine
/// lacks") stops the run with the reason instead of faulting in the guest.
fn lacks(bytes: &[u8]) -> bool {
    let i = iced_x86::Decoder::new(64, bytes, iced_x86::DecoderOptions::NONE).decode();
    !i.is_invalid() && tcg::classify(&i, &mut iced_x86::InstructionInfoFactory::new()) == tcg::Class::HandedOver
}

/// INT3's opcode (SDM Vol. 2A, "INT n/INTO/INT3/INT1"), which raises #BP.
const INT3: u8 = 0xCC;

/// KVM_EXIT_INTERNAL_ERROR's suberror and data.
fn internal_error_data(fd: &mut VcpuFd) -> (u32, Vec<u64>) {
    // SAFETY: called right after KVM_RUN returned KVM_EXIT_INTERNAL_ERROR, so `internal` is the
    // active member of the exit union.
    let i = unsafe { fd.get_kvm_run().__bindgen_anon_1.internal };
    let n = (i.ndata as usize).min(i.data.len());
    (i.suberror, i.data[..n].to_vec())
}

/// KVM_INTERNAL_ERROR_EMULATION: KVM's emulator failed on an instruction.
const EMULATION: u32 = 1;

/// The instruction bytes of an emulation failure that carries them
/// (KVM_INTERNAL_ERROR_EMULATION_FLAG_INSTRUCTION_BYTES: data[0] = flags, data[1] = instruction
/// length in its low byte followed by the bytes).
fn emulated_bytes(suberror: u32, data: &[u64]) -> Option<Vec<u8>> {
    const FLAG_INSTRUCTION_BYTES: u64 = 1;
    let raw: Vec<u8> = data.iter().skip(1).flat_map(|w| w.to_le_bytes()).collect();
    if suberror != EMULATION || data.first().is_none_or(|f| f & FLAG_INSTRUCTION_BYTES == 0) || raw.is_empty() {
        return None;
    }
    Some(raw[1..1 + (raw[0] as usize).min(raw.len() - 1)].to_vec())
}

/// What KVM_EXIT_INTERNAL_ERROR's suberror and data say, with the instruction decoded when the
/// data carries it.
pub fn explain_internal_error(suberror: u32, data: &[u64], long_mode: bool) -> String {
    let kind = match suberror {
        EMULATION => "emulation failure",
        2 => "simultaneous exceptions",
        3 => "event delivery",
        4 => "unexpected exit reason",
        _ => "unknown suberror",
    };
    let Some(bytes) = emulated_bytes(suberror, data) else {
        return format!("suberror {suberror} ({kind}), data {data:x?}");
    };
    let mut decoder = iced_x86::Decoder::new(if long_mode { 64 } else { 32 }, &bytes, iced_x86::DecoderOptions::NONE);
    let insn = decoder.decode();
    let mut text = String::new();
    iced_x86::Formatter::format(&mut iced_x86::IntelFormatter::new(), &insn, &mut text);
    let hex: Vec<String> = bytes[..insn.len().min(bytes.len())].iter().map(|b| format!("{b:02x}")).collect();
    let sse = (0..insn.op_count()).any(|i| {
        let reg = format!("{:?}", insn.op_register(i));
        reg.starts_with("XMM") || reg.starts_with("MM")
    });
    let hint = if sse {
        "; this host's KVM sends SSE instructions of CPL0 guest code to its instruction emulator, which \
         handles only plain SSE moves (see the README: kvm_pvm)"
    } else {
        ""
    };
    format!("KVM could not emulate `{text}` ({}){hint}", hex.join(" "))
}

/// The vCPU's registers, for a crash report.
pub fn dump_registers(cpu: &mut KvmCpu) -> String {
    let (Ok(r), Ok(s)) = (cpu.regs(), cpu.sregs()) else {
        return "registers unavailable".into();
    };
    format!(
        "rip={:#018x} rsp={:#018x} rflags={:#010x}\n\
         rax={:#018x} rbx={:#018x} rcx={:#018x} rdx={:#018x}\n\
         rsi={:#018x} rdi={:#018x} rbp={:#018x}\n\
         r8 ={:#018x} r9 ={:#018x} r10={:#018x} r11={:#018x}\n\
         r12={:#018x} r13={:#018x} r14={:#018x} r15={:#018x}\n\
         cs={:#06x} ss={:#06x} cr0={:#x} cr2={:#x} cr3={:#x} cr4={:#x} efer={:#x}\n\
         idt base={:#x} limit={:#x} gdt base={:#x} limit={:#x}",
        r.rip,
        r.rsp,
        r.rflags,
        r.rax,
        r.rbx,
        r.rcx,
        r.rdx,
        r.rsi,
        r.rdi,
        r.rbp,
        r.r8,
        r.r9,
        r.r10,
        r.r11,
        r.r12,
        r.r13,
        r.r14,
        r.r15,
        s.cs.selector,
        s.ss.selector,
        s.cr0,
        s.cr2,
        s.cr3,
        s.cr4,
        s.efer,
        s.idt.base,
        s.idt.limit,
        s.gdt.base,
        s.gdt.limit
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn explains_an_sse_emulation_failure() {
        // What kvm_pvm reports for `movd xmm0, ecx` at CPL0.
        let data = [1, 0x4eb7_0fc1_6e0f_660f, 0x6f0f_66c9_6e0f_6602, 0x1000];
        let msg = super::explain_internal_error(1, &data, true);
        assert!(msg.starts_with("KVM could not emulate `movd xmm0,ecx` (66 0f 6e c1)"), "{msg}");
        assert!(msg.contains("SSE"), "{msg}");
    }

    #[test]
    fn other_internal_errors_show_their_data() {
        assert_eq!(super::explain_internal_error(2, &[7], true), "suberror 2 (simultaneous exceptions), data [7]");
    }
}
