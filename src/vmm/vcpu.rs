//! The vCPU thread's exit loop: port I/O to the device bus, MSR exits to the virtual PMU,
//! and the conditions that end a run.
use super::devices::{PioAction, PioBus};
use super::kick::{self, StopReason, StopRequest};
use super::msr::MsrDispatch;
use super::VmmError;
use crate::pmu::Pmu;
use kvm_ioctls::{VcpuExit, VcpuFd};
use std::sync::Arc;

/// Exit counts, for the summary and `--verbose`.
#[derive(Debug, Default, Clone)]
pub struct ExitStats {
    pub total: u64,
    pub pio: u64,
    pub mmio: u64,
    pub msr: u64,
    pub interrupted: u64,
    pub other: u64,
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

pub struct Vcpu {
    pub fd: VcpuFd,
    pub bus: PioBus,
    pub pmu: Pmu,
    pub msrs: MsrDispatch,
    pub stats: ExitStats,
    pub stop: Arc<StopRequest>,
}

enum Next {
    Continue,
    Stop(VcpuStop),
    Shutdown(String),
}

impl Vcpu {
    /// Runs the guest until something ends the run. Call on the vCPU's own thread.
    pub fn run(&mut self) -> Result<VcpuStop, VmmError> {
        let immediate_exit = &mut self.fd.get_kvm_run().immediate_exit as *mut u8;
        kick::register(Some(immediate_exit));
        let r = self.run_loop();
        kick::register(None);
        self.bus.serial.flush();
        r
    }

    fn run_loop(&mut self) -> Result<VcpuStop, VmmError> {
        loop {
            if let Some(reason) = self.stop.get() {
                return Ok(VcpuStop::Stopped(reason));
            }
            match self.step()? {
                Next::Continue => {}
                Next::Stop(s) => return Ok(s),
                Next::Shutdown(why) => {
                    return Ok(VcpuStop::Shutdown {
                        why,
                        registers: dump_registers(&self.fd),
                    });
                }
            }
        }
    }

    fn step(&mut self) -> Result<Next, VmmError> {
        let exit = match self.fd.run() {
            Ok(exit) => exit,
            Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {
                self.stats.interrupted += 1;
                self.fd.set_kvm_immediate_exit(0);
                return Ok(Next::Continue);
            }
            Err(source) => {
                return Err(VmmError::Kvm {
                    op: "KVM_RUN",
                    source,
                })
            }
        };
        self.stats.total += 1;
        Ok(match exit {
            VcpuExit::IoOut(port, data) => {
                self.stats.pio += 1;
                match self.bus.write(port, data) {
                    PioAction::Continue => Next::Continue,
                    PioAction::Exit(code) => Next::Stop(VcpuStop::DebugExit(code)),
                }
            }
            VcpuExit::IoIn(port, data) => {
                self.stats.pio += 1;
                self.bus.read(port, data);
                Next::Continue
            }
            VcpuExit::X86Rdmsr(exit) => {
                self.stats.msr += 1;
                match self.msrs.read(&mut self.pmu, exit.index) {
                    Some(v) => *exit.data = v,
                    None => *exit.error = 1,
                }
                Next::Continue
            }
            VcpuExit::X86Wrmsr(exit) => {
                self.stats.msr += 1;
                if !self.msrs.write(&mut self.pmu, exit.index, exit.data) {
                    *exit.error = 1;
                }
                Next::Continue
            }
            VcpuExit::MmioRead(addr, data) => {
                self.stats.mmio += 1;
                tracing::debug!("unhandled MMIO read at {addr:#x}");
                data.fill(0xFF);
                Next::Continue
            }
            VcpuExit::MmioWrite(addr, _) => {
                self.stats.mmio += 1;
                tracing::debug!("unhandled MMIO write at {addr:#x}");
                Next::Continue
            }
            VcpuExit::Shutdown => Next::Shutdown("triple fault (KVM_EXIT_SHUTDOWN)".into()),
            VcpuExit::SystemEvent(kind, _) => {
                Next::Shutdown(format!("system event {kind} (shutdown or reset)"))
            }
            VcpuExit::Hlt => Next::Shutdown("HLT with no interrupt source".into()),
            VcpuExit::FailEntry(reason, cpu) => {
                return Err(VmmError::Guest(format!(
                    "VM entry failed (hardware reason {reason:#x}, cpu {cpu})\n{}",
                    dump_registers(&self.fd)
                )))
            }
            VcpuExit::InternalError => {
                let why = internal_error(&mut self.fd);
                return Err(VmmError::Guest(format!(
                    "KVM internal error ({why})\n{}",
                    dump_registers(&self.fd)
                )));
            }
            other => {
                self.stats.other += 1;
                tracing::debug!("unhandled exit {other:?}");
                Next::Continue
            }
        })
    }
}

/// KVM_EXIT_INTERNAL_ERROR's suberror and data words.
fn internal_error(fd: &mut VcpuFd) -> String {
    // SAFETY: called right after KVM_RUN returned KVM_EXIT_INTERNAL_ERROR, so `internal` is the
    // active member of the exit union.
    let i = unsafe { fd.get_kvm_run().__bindgen_anon_1.internal };
    let kind = match i.suberror {
        1 => "emulation failure",
        2 => "simultaneous exceptions",
        3 => "delivery event",
        4 => "unexpected exit reason",
        _ => "unknown suberror",
    };
    let n = (i.ndata as usize).min(i.data.len());
    format!("suberror {} {kind}, data {:x?}", i.suberror, &i.data[..n])
}

/// The vCPU's registers, for a crash report.
pub fn dump_registers(fd: &VcpuFd) -> String {
    let (Ok(r), Ok(s)) = (fd.get_regs(), fd.get_sregs()) else {
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
