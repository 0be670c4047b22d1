//! Which engine runs counted code (README, "The TCG engine"): the TCG engine fast-forwards
//! between single steps where it may, and hands back to the stepper exactly where it stops.
/// How the precise backend runs the code it counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Engine {
    /// Runs counted code in QEMU's TCG (through unicorn) and single-steps only what must go
    /// through KVM (README, "The TCG engine").
    Tcg,
    /// Single-steps every counted instruction in KVM: the reference.
    Step,
}

impl Engine {
    /// The engine this build runs by default: TCG when it is built in.
    pub const DEFAULT: Engine = if cfg!(feature = "tcg") { Engine::Tcg } else { Engine::Step };
}

/// The engine chosen, the TCG engine itself once made, and why it was given up if it was.
pub struct EngineSlot {
    kind: Engine,
    /// Why the TCG engine was given up for stepping, if it was.
    failed: Option<String>,
    #[cfg(feature = "tcg")]
    tcg: tcg_slot::TcgSlot,
}

impl EngineSlot {
    /// `engine`, where this build has it.
    pub fn new(engine: Engine) -> EngineSlot {
        let built_in = engine == Engine::Step || cfg!(feature = "tcg");
        EngineSlot {
            kind: if built_in { engine } else { Engine::Step },
            failed: (!built_in).then(|| "this emon was built without the tcg feature".to_string()),
            #[cfg(feature = "tcg")]
            tcg: tcg_slot::TcgSlot::default(),
        }
    }

    /// The engine that runs counted code.
    pub fn engine(&self) -> Engine {
        self.kind
    }

    /// The engine failed: every count from here on comes from single-stepping, and the run
    /// summary says why.
    #[cfg(feature = "tcg")]
    pub fn give_up(&mut self, why: String) {
        tracing::warn!("{why}; single-stepping instead");
        self.failed = Some(why);
        self.kind = Engine::Step;
    }

    /// The clause of the backend's account that says what ran counted code.
    pub fn account(&self, engine_retired: u64, engine_runs: u64) -> String {
        match (self.engine(), &self.failed) {
            (Engine::Tcg, _) => format!("TCG engine: {engine_retired} of them in {engine_runs} runs"),
            (Engine::Step, Some(why)) => format!("single-stepped: {why} (TCG engine before that: {engine_retired})"),
            (Engine::Step, None) => "single-stepped (--precise-engine step)".into(),
        }
    }

    /// What the run summary says about the engine.
    pub fn notes(&self) -> Vec<String> {
        self.failed.iter().map(|why| format!("counted by single-stepping only ({why})")).collect()
    }
}

#[cfg(feature = "tcg")]
mod tcg_slot {
    /// The TCG engine, made on the vCPU thread the first time it runs.
    #[derive(Default)]
    pub struct TcgSlot {
        pub engine: Option<super::super::tcg::Tcg>,
        /// Boundaries to step in KVM before trying the engine again.
        pub cooldown: u32,
        /// The engine's last run ended in user mode and the vCPU has not run since: the engine
        /// holds the CPL3 state and can go on from it.
        pub at_cpl3: bool,
    }

    // SAFETY: the engine (which holds unicorn's non-thread-safe handle) is created in
    // `before_run`, on the vCPU thread, and used only there; a `Precise` is moved to that thread
    // before it has one.
    unsafe impl Send for TcgSlot {}
}

/// Without the TCG engine every counted instruction is stepped.
#[cfg(not(feature = "tcg"))]
mod step_only {
    use super::super::Precise;
    use crate::{BackendError, Cx, Next};
    use emon_x86::mode::CpuMode;

    impl Precise {
        pub(in super::super) fn fast_forward(
            &mut self,
            _cx: &mut Cx,
            _rip: u64,
            _mode: &CpuMode,
        ) -> Result<Option<Next>, BackendError> {
            Ok(None)
        }

        pub(in super::super) fn vcpu_runs(&mut self) {}
    }
}

#[cfg(feature = "tcg")]
mod fast_forward {
    use super::super::tcg::{self, Tcg};
    use super::super::Precise;
    use super::Engine;
    use crate::{BackendError, Cx, Next};
    use emon_x86::arch::GP_VECTOR;
    use emon_x86::mode::CpuMode;

    /// Steps after an engine run that retired little (or nothing) before the engine is tried
    /// again.
    const TCG_COOLDOWN: u32 = 16;

    impl Precise {
        /// The vCPU runs: whatever user-mode state the engine held is the vCPU's now.
        pub(in super::super) fn vcpu_runs(&mut self) {
            self.engine.tcg.at_cpl3 = false;
        }

        /// Runs counted code in the TCG engine from the boundary at `rip`, when it may (see
        /// [`tcg`]): `Some(Next::Retired)` if it retired anything, `None` to single-step instead.
        pub(in super::super) fn fast_forward(
            &mut self,
            cx: &mut Cx,
            rip: u64,
            mode: &CpuMode,
        ) -> Result<Option<Next>, BackendError> {
            if !self.engine_may_run(cx, mode) {
                return Ok(None);
            }
            // User mode runs in the engine only where the engine entered it (through an IRETQ):
            // unicorn's API cannot load CPL3 state (it refuses an SS with RPL 3 at CPL0).
            let resume = mode.cpl == 3;
            if resume && !self.engine.tcg.at_cpl3 {
                return Ok(None);
            }
            let bytes = mode.fetch(cx.vcpu.memory(), rip);
            let first = iced_x86::Decoder::with_ip(64, &bytes, rip, iced_x86::DecoderOptions::NONE).decode();
            let iret = first.code() == iced_x86::Code::Iretq;
            if self.engine.tcg.cooldown > 0 && !resume && !iret {
                self.engine.tcg.cooldown -= 1;
                return Ok(None);
            }
            // Not worth entering the engine for an instruction it would hand back at once.
            if !tcg::runs_in_engine(&first, &mut iced_x86::InstructionInfoFactory::new()) {
                return if resume { self.user_mode_handover(cx, &first) } else { Ok(None) };
            }
            let Some(run) = self.engine_run(cx, mode, resume)? else { return Ok(None) };
            if run.retired == 0 {
                return if resume { self.user_mode_handover(cx, &first) } else { Ok(None) };
            }
            self.take_run(cx, mode, run)?;
            Ok(Some(Next::Retired))
        }

        /// Whether the engine may run now. It counts but does not report branches or registers
        /// per instruction: while the LBR stack or BTS records, or a counter is PEBS-enabled,
        /// or one counts with CMASK, every instruction is stepped; and it runs 64-bit code only.
        fn engine_may_run(&self, cx: &Cx, mode: &CpuMode) -> bool {
            let pebs = cx.pmu.pebs_on() && cx.pmu.pebs_enable() != 0;
            self.engine.engine() == Engine::Tcg
                && mode.bitness == 64
                && !self.counters.armed.iter().any(|a| a.cmask != 0)
                && !self.branches.on()
                && !pebs
        }

        /// One engine run from the vCPU's state, counting for the armed counters; `None` if the
        /// engine failed (and was given up).
        fn engine_run(&mut self, cx: &mut Cx, mode: &CpuMode, resume: bool) -> Result<Option<tcg::Run>, BackendError> {
            if self.engine.tcg.engine.is_none() {
                match Tcg::new(cx.vcpu.memory()) {
                    Ok(e) => self.engine.tcg.engine = Some(e),
                    Err(e) => {
                        self.engine.give_up(e.to_string());
                        return Ok(None);
                    }
                }
            }
            let regs = cx.vcpu.regs()?;
            let sregs = cx.vcpu.sregs()?;
            let armed: Vec<_> = self.counters.armed.iter().map(|a| (*a, cx.pmu.distance_to_overflow(a.id))).collect();
            let clock = tcg::ModelClock { cycles: self.clock.cycles, reference: self.clock.reference };
            let counting = tcg::Counting { armed: &armed, clock, budget: tcg::BUDGET, cache: self.feed.lend() };
            let engine = self.engine.tcg.engine.as_mut().expect("made above");
            let mut run = match engine.run(&regs, &sregs, *mode, counting, resume) {
                Ok(run) => run,
                Err(e) => {
                    self.engine.give_up(e.to_string());
                    return Ok(None);
                }
            };
            self.feed.give_back(run.cache.take());
            self.stats.engine_runs += 1;
            tracing::trace!(
                rip = format_args!("{:#x}", regs.rip),
                cpl = mode.cpl,
                stop = ?run.stop,
                retired = run.retired,
                to = format_args!("{:#x}", run.regs.rip),
                "TCG engine run"
            );
            // KVM runs at least the next kernel instruction: it delivers interrupts and runs what
            // the engine handed over. (At CPL3 the engine goes on: KVM cannot step user mode here.)
            self.engine.tcg.cooldown = if run.retired < 64 { TCG_COOLDOWN } else { 1 };
            self.engine.tcg.at_cpl3 = run.cpl == 3;
            Ok(Some(run))
        }

        /// What an engine run retired goes to the counters, the model clock and the vCPU.
        fn take_run(&mut self, cx: &mut Cx, mode: &CpuMode, run: tcg::Run) -> Result<(), BackendError> {
            for (a, n) in self.counters.armed.iter().zip(&run.counts) {
                // At CPL0 the engine stops short of every overflow, and the overflowing
                // instruction is stepped; at CPL3 it stops right after it (`Stop::Overflowed`).
                if *n > 0 && cx.pmu.add_events(a.id, *n) && run.stop != tcg::Stop::Overflowed {
                    tracing::error!("{}: the TCG engine crossed an overflow", a.id);
                }
            }
            self.stats.retired += run.retired;
            self.stats.engine_retired += run.retired;
            self.clock.cycles += run.cycles;
            cx.vcpu.set_regs(&run.regs)?;
            if let Some(segments) = run.segments {
                self.iret_ran(cx, mode, segments)?;
            }
            self.step.rip = Some(run.regs.rip);
            if run.stop == tcg::Stop::Overflowed && cx.pmu.pmi_pending() {
                // The PMI goes out before the next entry; the vCPU takes it first thing.
                self.step.expect_event = true;
            }
            Ok(())
        }

        /// An IRETQ ran in the engine: the segments it loaded (selectors of CS, SS, DS, ES, FS,
        /// GS, and the FS and GS bases) go to the vCPU, decoded from the guest's GDT, and NMI
        /// blocking ends as the IRETQ ends it.
        fn iret_ran(
            &mut self,
            cx: &mut Cx,
            mode: &CpuMode,
            (sel, fs_base, gs_base): ([u16; 6], u64, u64),
        ) -> Result<(), BackendError> {
            let mut sregs = cx.vcpu.sregs()?;
            let mem = cx.vcpu.memory();
            let slots = [&mut sregs.cs, &mut sregs.ss, &mut sregs.ds, &mut sregs.es, &mut sregs.fs, &mut sregs.gs];
            for (slot, selector) in slots.into_iter().zip(sel) {
                if slot.selector != selector || slot.unusable == 1 {
                    if let Some(seg) = mode.segment(mem, sregs.gdt.base, selector) {
                        *slot = seg;
                    }
                }
            }
            sregs.fs.base = fs_base;
            sregs.gs.base = gs_base;
            cx.vcpu.set_sregs(&sregs)?;
            cx.vcpu.end_nmi_blocking()?;
            self.step.mode = None;
            Ok(())
        }

        /// User mode in the engine reached an instruction the engine does not run. Privileged
        /// ones raise #GP(0) at CPL3 (SDM Vol. 3A 5.9): emon delivers it, and the vCPU enters the
        /// kernel's handler, which it can step. RDPMC is emulated as when stepping. Anything else
        /// is stepped, which this host may not do (the run then says NOT EXACT).
        fn user_mode_handover(&mut self, cx: &mut Cx, i: &iced_x86::Instruction) -> Result<Option<Next>, BackendError> {
            use iced_x86::Mnemonic::*;
            let iopl = (cx.vcpu.regs()?.rflags >> 12) & 3;
            let privileged = i.is_privileged()
                || matches!(i.mnemonic(), Hlt | Rdmsr | Wrmsr)
                || (iopl < 3
                    && matches!(i.mnemonic(), Cli | Sti | In | Out | Insb | Insw | Insd | Outsb | Outsw | Outsd));
            if privileged {
                cx.vcpu.inject_exception(GP_VECTOR, Some(0))?;
                self.step.expect_event = true;
                self.engine.tcg.at_cpl3 = false;
                return Ok(Some(Next::Retired));
            }
            // Emulated without KVM (see `arm`): the engine goes on after them.
            if !matches!(i.mnemonic(), Rdpmc | Rdtsc | Rdtscp) {
                self.engine.tcg.at_cpl3 = false;
            }
            Ok(None)
        }
    }
}
