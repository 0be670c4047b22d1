//! RDPMC outside counted code (README, "RDPMC at the #GP handler"). KVM without a vPMU raises
//! #GP for RDPMC and has no userspace exit for it, so emon keeps a hardware instruction
//! breakpoint on the guest's #GP handler. At that breakpoint it completes the RDPMC as if it had
//! retired, or passes the #GP on to the guest untouched. What to do is decided by
//! `backend::rdpmc_catch` (pure); this is the KVM side: keeping the breakpoint in step with the
//! guest's IDT before every entry, and carrying out the decisions.
use super::VmmError;
use crate::backend::guest_debug::{DebugExit, DR6_BS, DR6_CAUSES, DR7_ENABLES};
use crate::backend::kvm::KvmCpu;
use crate::backend::rdpmc_catch::{self, Aside, Decision, Pass};
use crate::backend::vpmu::{Observer, VirtualPmu};
use crate::backend::Vcpu;
use crate::pmu::Pmu;
use crate::x86::arch::DB_VECTOR;
use crate::x86::insn::{self, Special};
use crate::x86::mode::CpuMode;
use kvm_bindings::{KVM_CAP_SET_GUEST_DEBUG2, KVM_GUESTDBG_BLOCKIRQ, KVM_GUESTDBG_USE_HW_BP};
use kvm_ioctls::{Cap, Kvm};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use vm_memory::GuestMemoryMmap;

/// How often emon looks at the guest's DR7 at most (see [`GpCatch::before_run`]).
pub const DR7_CHECK_INTERVAL: Duration = Duration::from_millis(1);

/// What the catch did, for the run summary and `--json`.
#[derive(Debug, Default, Clone)]
pub struct CatchStats {
    /// Why emon cannot catch RDPMC in this run although the profile has a PMU (a host without
    /// hardware breakpoints for guests). Without a PMU there is nothing to catch: RDPMC faults.
    pub off: Option<&'static str>,
    /// The breakpoint was on the #GP handler at some point.
    pub armed: bool,
    /// RDPMCs completed at the #GP handler.
    pub completed: u64,
    /// #GPs passed on to the guest's handler, by why.
    pub passed: BTreeMap<Pass, u64>,
    /// The guest's own #DBs, which KVM sends to userspace while guest debugging is on, given back.
    pub db_reinjected: u64,
    /// Times the breakpoint came off after it had been on, by why: RDPMC outside counted code
    /// got KVM's #GP until it was back.
    pub aside: BTreeMap<Aside, u64>,
}

impl CatchStats {
    pub fn passed_total(&self) -> u64 {
        self.passed.values().sum()
    }

    /// The clause of the one-line run summary, when there is something to say.
    pub fn summary(&self) -> Option<String> {
        self.armed.then(|| {
            format!(
                "RDPMC completed at the #GP handler: {}; #GP passed to the guest: {}",
                self.completed,
                self.passed_total()
            )
        })
    }

    /// The account `--verbose` prints.
    pub fn detail(&self) -> String {
        if let Some(why) = self.off {
            return format!("RDPMC at the #GP handler: off ({why})");
        }
        let passed: Vec<String> = self.passed.iter().map(|(p, n)| format!("{n} {p}")).collect();
        let aside: Vec<String> = self.aside.iter().map(|(a, n)| format!("{n}x while {a}")).collect();
        format!(
            "RDPMC at the #GP handler: breakpoint {}; {} RDPMC completed; #GP passed to the guest: {} ({}); the guest's own #DB given back: {}; breakpoint taken off: {}",
            if self.armed { "armed" } else { "never armed (no #GP handler, or no PMU)" },
            self.completed,
            self.passed_total(),
            if passed.is_empty() { "none".into() } else { passed.join(", ") },
            self.db_reinjected,
            if aside.is_empty() { "never".into() } else { aside.join(", ") },
        )
    }

    /// What the user must know: the stretches where RDPMC outside counted code was not available.
    pub fn notes(&self) -> Vec<String> {
        let mut notes: Vec<String> =
            self.off.map(|why| format!("RDPMC outside counted code not available: {why}")).into_iter().collect();
        if !self.aside.is_empty() {
            let whys: Vec<String> = self.aside.iter().map(|(a, n)| format!("{a} ({n}x)")).collect();
            notes.push(format!("RDPMC outside counted code not available (KVM's #GP) while {}", whys.join("; ")));
        }
        notes
    }
}

/// The breakpoint on the guest's #GP handler, and what happens at it.
pub struct GpCatch {
    on: bool,
    /// Why the breakpoint was off at the last look, if it was.
    aside: Option<Aside>,
    /// The guest's own DR7 when emon last looked, and when that was.
    guest_dr7: u64,
    dr7_checked: Option<Instant>,
    pub stats: CatchStats,
}

impl GpCatch {
    /// The catch for a vCPU whose PMU is `pmu`: off when the profile has no counters (RDPMC then
    /// faults on hardware too, as KVM makes it) or when this KVM cannot put a hardware breakpoint
    /// in a guest.
    pub fn new(kvm: &Kvm, pmu: &Pmu) -> GpCatch {
        let pmu_present = !pmu.counter_ids().is_empty();
        let host = hardware_breakpoints(kvm);
        let on = pmu_present && host;
        GpCatch {
            on,
            aside: None,
            guest_dr7: 0,
            dr7_checked: None,
            stats: CatchStats {
                off: (pmu_present && !host)
                    .then_some("this KVM cannot put hardware breakpoints in a guest (KVM_CAP_SET_GUEST_DEBUG)"),
                ..Default::default()
            },
        }
    }

    /// Before every KVM_RUN: puts the breakpoint on the #GP handler the guest has now, or takes
    /// it off (and says why) when there is none emon can use. The guest changes its IDTR and IDT
    /// without exits, so this looks again each time.
    pub fn before_run(&mut self, cpu: &mut KvmCpu, mem: &GuestMemoryMmap) -> Result<(), VmmError> {
        if !self.on || cpu.debug.step || cpu.debug.pass {
            // Stepping: the backend's single-step sees every instruction (and emulates RDPMC), so
            // the breakpoint waits.
            return Ok(());
        }
        let sregs = cpu.sregs()?;
        let want = rdpmc_catch::gp_handler(&sregs, mem);
        let want = match want {
            Ok(_) if self.guest_breakpoints(cpu)? => Err(Aside::GuestDebugRegisters),
            w => w,
        };
        let debug = &mut cpu.debug;
        match want {
            Ok(addr) => {
                if debug.breakpoint != Some(addr) {
                    tracing::debug!("RDPMC catch: breakpoint on the #GP handler at {addr:#x}");
                }
                debug.breakpoint = Some(addr);
                self.stats.armed = true;
                self.aside = None;
            }
            Err(why) => {
                if debug.breakpoint.is_some() {
                    tracing::debug!("RDPMC catch: breakpoint off: {why}");
                    *self.stats.aside.entry(why).or_default() += 1;
                }
                debug.breakpoint = None;
                self.aside = Some(why);
            }
        }
        Ok(cpu.apply_guest_debug()?)
    }

    /// Whether the guest's own DR7 enables a breakpoint, as of the last look. KVM_GET_DEBUGREGS
    /// costs about 7 µs here (as much as an exit), and the guest writes DR7 without an exit
    /// whatever emon does, so emon looks at most every [`DR7_CHECK_INTERVAL`].
    fn guest_breakpoints(&mut self, cpu: &mut KvmCpu) -> Result<bool, VmmError> {
        let now = Instant::now();
        if self.dr7_checked.is_none_or(|t| now.duration_since(t) >= DR7_CHECK_INTERVAL) {
            let dr = cpu.debug_regs()?;
            self.guest_dr7 = dr.dr7;
            self.dr7_checked = Some(now);
        }
        Ok(self.guest_dr7 & DR7_ENABLES != 0)
    }

    /// Why a guest that shut down (a triple fault) at an RDPMC did: emon had no #GP handler to
    /// complete it at, so KVM's #GP found no handler either. `None` for any other shutdown.
    pub fn explain_shutdown(&self, cpu: &mut KvmCpu, mem: &GuestMemoryMmap) -> Option<String> {
        let why = self.aside.filter(|_| self.on)?;
        let (regs, sregs) = (cpu.regs().ok()?, cpu.sregs().ok()?);
        let mode = CpuMode::from_sregs(&sregs);
        let i = insn::decode(&mode.fetch(mem, sregs.cs.base + regs.rip), regs.rip, mode.bitness)?;
        (i.special == Special::Rdpmc)
            .then(|| format!("the instruction at RIP is RDPMC, which emon could not complete at a #GP handler: {why}"))
    }

    /// A debug exit that is not the backend's single step (see [`crate::backend::guest_debug::GuestDebug::classify`]). The
    /// vCPU is at an instruction boundary afterwards.
    pub fn on_debug_exit<O: Observer>(
        &mut self,
        kind: DebugExit,
        dr6: u64,
        cpu: &mut KvmCpu,
        mem: &GuestMemoryMmap,
        pmu: &mut VirtualPmu<O>,
    ) -> Result<(), VmmError> {
        match kind {
            DebugExit::Step => {}
            DebugExit::Passed => {
                // The handler's first instruction retired: the #GP is the guest's now. The
                // breakpoint goes back on before the next entry.
                cpu.debug.pass = false;
            }
            DebugExit::Breakpoint => self.at_breakpoint(cpu, mem, pmu)?,
            DebugExit::Guest => {
                tracing::debug!("the guest's own #DB (DR6 {dr6:#x}) given back to it");
                self.stats.db_reinjected += 1;
                inject_db(cpu, mem, dr6)?;
                pmu.event_injected();
            }
        }
        Ok(())
    }

    /// At the #GP handler's first instruction, with the frame on its stack.
    fn at_breakpoint<O: Observer>(
        &mut self,
        cpu: &mut KvmCpu,
        mem: &GuestMemoryMmap,
        pmu: &mut VirtualPmu<O>,
    ) -> Result<(), VmmError> {
        let (regs, sregs) = (cpu.regs()?, cpu.sregs()?);
        let decision = rdpmc_catch::decide(&regs, &sregs, mem, |ecx, cpl, pce| pmu.rdpmc(ecx, cpl, pce));
        match decision {
            Decision::Complete(c) => {
                tracing::trace!(
                    rip = format_args!("{:#x}", c.regs.rip),
                    ecx = format_args!("{:#x}", c.ecx),
                    cpl = c.cpl,
                    value = format_args!("{:#x}", c.value),
                    "RDPMC completed at the #GP handler"
                );
                cpu.set_regs(&c.regs)?;
                if let Some(s) = &c.sregs {
                    cpu.set_sregs(s)?;
                }
                if c.single_step_trap {
                    inject_db(cpu, mem, DR6_BS)?;
                    pmu.event_injected();
                }
                self.stats.completed += 1;
            }
            Decision::Pass(why) => {
                tracing::debug!(rip = format_args!("{:#x}", regs.rip), "#GP passed to the guest: {why}");
                *self.stats.passed.entry(why).or_default() += 1;
                // On this host RF does not suppress the breakpoint: it comes off for one step.
                cpu.debug.pass = true;
                cpu.apply_guest_debug()?;
            }
        }
        Ok(())
    }
}

/// Whether `kvm` can hold interrupts during a guest-debug step (KVM_GUESTDBG_BLOCKIRQ).
pub fn block_irq(kvm: &Kvm) -> bool {
    kvm.check_extension_raw(u64::from(KVM_CAP_SET_GUEST_DEBUG2)).max(0) as u32 & KVM_GUESTDBG_BLOCKIRQ != 0
}

/// Whether `kvm` can put a hardware instruction breakpoint in a guest
/// (KVM_CAP_SET_GUEST_DEBUG2 lists KVM_GUESTDBG_USE_HW_BP; kernels before it have x86 hardware
/// breakpoints with KVM_CAP_SET_GUEST_DEBUG).
pub fn hardware_breakpoints(kvm: &Kvm) -> bool {
    let flags = kvm.check_extension_raw(u64::from(KVM_CAP_SET_GUEST_DEBUG2));
    if flags > 0 {
        return flags as u32 & KVM_GUESTDBG_USE_HW_BP != 0;
    }
    kvm.check_extension(Cap::SetGuestDebug)
}

/// Delivers a #DB to the guest with `dr6`'s causes in its DR6 (B0-B3 replaced, the others
/// added: SDM Vol. 3B, "Debug Status Register (DR6)").
fn inject_db(cpu: &mut KvmCpu, mem: &GuestMemoryMmap, dr6: u64) -> Result<(), VmmError> {
    let mut dr = cpu.debug_regs()?;
    dr.dr6 = (dr.dr6 & !0xF) | (dr6 & DR6_CAUSES);
    cpu.set_debug_regs(&dr)?;
    Ok(cpu.with(mem).inject_exception(DB_VECTOR, None)?)
}
