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

    /// The TCG engine over `mem`, made the first time it is needed; `None` if it cannot be made,
    /// and then it is given up.
    #[cfg(feature = "tcg")]
    fn tcg_engine(&mut self, mem: &vm_memory::GuestMemoryMmap) -> Option<&mut super::tcg::Tcg> {
        if let Err(e) = self.tcg.engine.get(mem) {
            self.give_up(e.to_string());
            return None;
        }
        self.tcg.engine.get(mem).ok()
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
            (Engine::Tcg, _) => format!(
                "TCG engine: {engine_retired} of them in {engine_runs} runs ({} loading the whole vCPU state; the x87/SSE state loaded {} times), every translation dropped {} times",
                self.loads(),
                self.fpu_loads(),
                self.flushes()
            ),
            (Engine::Step, Some(why)) => format!("single-stepped: {why} (TCG engine before that: {engine_retired})"),
            (Engine::Step, None) => "single-stepped (--precise-engine step)".into(),
        }
    }

    /// Engine runs that loaded the whole vCPU state.
    pub fn loads(&self) -> u64 {
        #[cfg(feature = "tcg")]
        return self.tcg.engine.loads();
        #[cfg(not(feature = "tcg"))]
        0
    }

    /// Times the x87/SSE state went into the TCG engine.
    fn fpu_loads(&self) -> u64 {
        #[cfg(feature = "tcg")]
        return self.tcg.engine.fpu_loads();
        #[cfg(not(feature = "tcg"))]
        0
    }

    /// Times the TCG engine dropped every translation.
    fn flushes(&self) -> u64 {
        #[cfg(feature = "tcg")]
        return self.tcg.engine.flushes();
        #[cfg(not(feature = "tcg"))]
        0
    }

    /// Keeps the times of the event checks on `clock` (tests: see [`EventClock`]).
    #[cfg(feature = "tcg")]
    pub fn set_event_clock(&mut self, clock: EventClock) {
        self.tcg.clock = clock;
    }

    /// The vCPU enters KVM at the boundary: it delivers the interrupts due there.
    pub fn kvm_entered(&mut self) {
        #[cfg(feature = "tcg")]
        {
            self.tcg.kernel_since = None;
        }
    }

    /// The vCPU runs in KVM (a step, a completion, or free): what the guest does there may raise
    /// an interrupt that waits for RFLAGS.IF (a self-IPI, a write to the APIC's timer), which
    /// user mode asks for at its first boundary; and the engine's copy of the vCPU's state is old.
    pub fn kvm_runs(&mut self) {
        #[cfg(feature = "tcg")]
        {
            self.tcg.events_asked = None;
            self.tcg.engine.ran_elsewhere();
        }
    }

    /// emon completed an INVLPG (SDM Vol. 2A, INVLPG): the engine's translations may be old, as
    /// after KVM ran the guest.
    pub fn tlb_flushed(&mut self) {
        #[cfg(feature = "tcg")]
        self.tcg.engine.ran_elsewhere();
    }

    /// What the run summary says about the engine.
    pub fn notes(&self) -> Vec<String> {
        self.failed.iter().map(|why| format!("counted by single-stepping only ({why})")).collect()
    }
}

/// The clock that the event checks of code running without KVM entries keep (a millisecond
/// apart: "Interrupts and NMIs in user mode" in the README): real time, or, for tests that must
/// not depend on how fast the machine runs them, one they move by hand.
#[cfg(feature = "tcg")]
#[derive(Debug, Clone, Default)]
pub enum EventClock {
    #[default]
    Real,
    /// Stands at `start` plus what [`EventClock::advance`] added.
    Manual { start: std::time::Instant, nanos: std::sync::Arc<std::sync::atomic::AtomicU64> },
}

#[cfg(feature = "tcg")]
impl EventClock {
    /// A clock that stands still until it is moved.
    pub fn manual() -> EventClock {
        EventClock::Manual { start: std::time::Instant::now(), nanos: Default::default() }
    }

    /// Moves a manual clock on by `by` (a real one moves by itself).
    pub fn advance(&self, by: std::time::Duration) {
        if let EventClock::Manual { nanos, .. } = self {
            nanos.fetch_add(u64::try_from(by.as_nanos()).unwrap_or(u64::MAX), std::sync::atomic::Ordering::Relaxed);
        }
    }

    pub fn now(&self) -> std::time::Instant {
        match self {
            EventClock::Real => std::time::Instant::now(),
            EventClock::Manual { start, nanos } => {
                *start + std::time::Duration::from_nanos(nanos.load(std::sync::atomic::Ordering::Relaxed))
            }
        }
    }
}

#[cfg(feature = "tcg")]
mod tcg_slot {
    use super::super::tcg::Needs;

    /// The TCG engine, made on the vCPU thread the first time it runs.
    #[derive(Default)]
    pub struct TcgSlot {
        pub engine: super::super::tcg::EngineCell,
        /// Boundaries to step in KVM before trying the engine again.
        pub cooldown: u32,
        /// What runs load beyond the general and control registers: what recent code needed.
        pub wants: Needs,
        /// Runs since the code last used what `wants` loads (past a few, it is dropped).
        pub unused_runs: u32,
        /// When KVM was last asked for the event due at a user-mode boundary; `None` since the
        /// vCPU last entered KVM or took an event in user mode.
        pub events_asked: Option<std::time::Instant>,
        /// When the current stretch of user mode began (`None` outside user mode), the time user
        /// mode ran before it since an event was last taken in user mode, and the user-mode
        /// instructions the engine retired since then.
        pub user_since: Option<std::time::Instant>,
        pub user_ran: std::time::Duration,
        pub user_retired: u64,
        /// Whether the last event taken in user mode came before user mode had made
        /// [`USER_PROGRESS`] since the one before (the next waits for that progress).
        pub user_starved: bool,
        /// The instructions the next user-mode run may retire: what is left of
        /// [`USER_PROGRESS`] when a due event waits for it, so that KVM is asked right then.
        pub user_budget: Option<u64>,
        /// The instructions and REP iterations the next run may take, at any level (unit tests).
        pub next_budget: Option<u64>,
        /// Since when kernel code has run in the engine, and in emon, with no KVM entry (which
        /// delivers the interrupts that came meanwhile); `None` after an entry.
        pub kernel_since: Option<std::time::Instant>,
        /// An event was just taken in kernel code: another may be due as soon as the handler
        /// lets interrupts in again.
        pub kernel_recheck: bool,
        /// The clock the times above are on.
        pub clock: super::EventClock,
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
    }
}

#[cfg(all(test, feature = "tcg"))]
pub(crate) use fast_forward::EVENT_CHECK;

#[cfg(feature = "tcg")]
mod fast_forward {
    use super::super::clock::TscSource;
    use super::super::stepper::Pending;
    use super::super::tcg::{self, Class, CpuState, Needs};
    use super::super::{Precise, RFLAGS_TF};
    use super::Engine;
    use crate::vcpu::DueEvent;
    use crate::{BackendError, Cx, Next};
    use emon_x86::arch::{plain_error_code, DE_VECTOR, GP_VECTOR, NMI_VECTOR, PF_VECTOR, RFLAGS_IF, UD_VECTOR};
    use emon_x86::deliver::Event;
    use emon_x86::insn::{Insn, Special};
    use emon_x86::mode::CpuMode;
    use std::time::{Duration, Instant};

    /// Steps after an engine run that retired little (or nothing) before the engine is tried
    /// again.
    const TCG_COOLDOWN: u32 = 16;
    /// Runs without using the x87/SSE state or the MSRs after which runs stop loading them.
    const WANTS_KEPT: u32 = 8;
    /// How long a run goes on while nothing counts before KVM gets a turn (to deliver the
    /// interrupts that came meanwhile): a tenth of a fast Linux timer tick.
    const FREE_SLICE: Duration = Duration::from_millis(1);
    /// How often KVM is asked for the interrupts due while user code runs in the engine.
    pub(crate) const EVENT_CHECK: Duration = FREE_SLICE;
    /// What user mode runs at least between two events it takes once one came before it had
    /// (starved): this many instructions, or this much real time.
    const USER_PROGRESS: u64 = 1000;
    const USER_RUN: Duration = Duration::from_millis(1);
    /// The instructions a run at CPL0 retires at most while emon waits to ask KVM for the next
    /// event due (`kernel_recheck`): a few blocks.
    const RECHECK_BUDGET: u64 = 4 * tcg::MAX_BLOCK;

    impl Precise {
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
            let user = mode.cpl == 3;
            if !user {
                // Whatever left user mode cleared TF (SYSCALL through IA32_FMASK, an event's
                // delivery); an IRET back to user mode sets it again if its frame has it.
                self.step.user_tf = false;
                let slot = &mut self.engine.tcg;
                let now = slot.clock.now();
                if let Some(t) = slot.user_since.take() {
                    slot.user_ran += now.saturating_duration_since(t);
                }
                let since = *slot.kernel_since.get_or_insert(now);
                let recheck = slot.kernel_recheck && cx.vcpu.regs()?.rflags & RFLAGS_IF != 0;
                if (recheck || now.saturating_duration_since(since) >= EVENT_CHECK) && self.take_kernel_event(cx)? {
                    // KVM delivers it at this boundary's entry.
                    return Ok(None);
                }
            } else {
                // User mode is asked for its events on its own clock, and the kernel code after
                // it is new code for the engine (no cooldown left from before).
                self.engine.tcg.kernel_since = None;
                self.engine.tcg.cooldown = 0;
                if self.step.user_tf {
                    // The guest's TF, which KVM_GET_REGS hides while KVM single-steps: back in
                    // the registers, for the frames emon writes and the trap below.
                    let mut regs = cx.vcpu.regs()?;
                    if regs.rflags & RFLAGS_TF == 0 {
                        regs.rflags |= RFLAGS_TF;
                        cx.vcpu.set_regs(&regs)?;
                    }
                }
                if self.take_user_event(cx, mode)? {
                    // Delivered (the vCPU is at the handler), or KVM delivers it at the next entry.
                    return Ok((!self.step.expect_event).then_some(Next::Retired));
                }
            }
            if self.engine.tcg.cooldown > 0 && !user {
                self.engine.tcg.cooldown -= 1;
                return Ok(None);
            }
            let bytes = mode.fetch(cx.vcpu.memory(), rip);
            let first = iced_x86::Decoder::with_ip(64, &bytes, rip, iced_x86::DecoderOptions::NONE).decode();
            if user && (cx.vcpu.regs()?.rflags & RFLAGS_TF != 0 || self.emons_breakpoints(cx)?.is_some()) {
                return self.traced_user_step(cx, &first, mode);
            }
            if !user && !self.counting && !self.cpl0_in_engine() && !self.returns_to_user(cx, &first, mode)? {
                // CPL0 code while nothing counts, user mode in the engine and `--cpl0 kvm`: KVM
                // steps it, all but the return to user mode, which the engine runs (it stops
                // right after it), because KVM would run the user code after it.
                return Ok(None);
            }
            // Not worth entering the engine for an instruction it would hand back at once: one it
            // cannot run, or one the run withholds (`engine_run`): what may open the kernel's
            // access to user memory while a data breakpoint watches it (`watch`), STI while
            // something counts.
            let withheld = tcg::Withheld {
                user_access: !user
                    && tcg::opens_user_access(&first)
                    && self.emons_breakpoints(cx)?.is_some_and(|b| b.watches_data()),
                sti: self.counts_here(mode),
                tsc: self.engine_run_tsc(cx, mode)?.is_none(),
            };
            if tcg::class_in(&first, &mut iced_x86::InstructionInfoFactory::new(), withheld) == Class::HandedOver {
                return if user { self.user_mode_handover(cx, &first, mode, None) } else { Ok(None) };
            }
            let Some((before, run)) = self.engine_run(cx, mode)? else { return Ok(None) };
            if run.retired == 0 {
                if run.stop == tcg::Stop::Budget && run.state.regs != before.regs {
                    // A REP string instruction's iterations outran the run's budget or time:
                    // they stay done, and the next run goes on with it (it retires once, after
                    // its last iteration: SDM Vol. 2B, REP).
                    self.take_run(cx, &before, run)?;
                    if !user {
                        self.take_kernel_event(cx)?;
                    }
                    return Ok(Some(Next::Retired));
                }
                if !user {
                    return Ok(None);
                }
                if run.stop == tcg::Stop::Untranslatable {
                    // An instruction at a time (each translated alone) up to the one that cannot
                    // be fetched, whose page fault is then raised as the CPU raises it.
                    return self.traced_user_step(cx, &first, mode);
                }
                if first.is_string_instruction()
                    && run.state.regs.rip == before.regs.rip
                    && run.state.regs != before.regs
                {
                    // Iterations of a REP string instruction ran before one faulted: their
                    // effects stay, and its registers say where it resumes, as on the CPU (SDM
                    // Vol. 2B, REP). The fault is the next iteration's.
                    cx.vcpu.set_regs(&run.state.regs)?;
                }
                return self.user_mode_handover(cx, &first, mode, run.fault);
            }
            self.take_run(cx, &before, run)?;
            Ok(Some(Next::Retired))
        }

        /// Takes the interrupt or NMI due at this user-mode boundary, if one is: true if one was.
        /// KVM gets no turn while user code runs in the engine, and an entry at CPL3 with nothing
        /// due would run user code unseen, so KVM is asked without entering the guest: at the
        /// first user-mode boundary after the vCPU was in KVM or took an event (where an
        /// interrupt the guest raised with them masked, a self-IPI, is taken: SDM Vol. 3A
        /// 6.8.1), then every [`EVENT_CHECK`] of real time (engine runs at CPL3 hand back as
        /// often), across system calls the kernel runs in the engine without KVM: an interrupt
        /// from a device or a timer comes at most that much later in the instruction stream, as
        /// in kernel code ("CPL0 code in the TCG engine"), where nothing guarantees when it
        /// comes. One exception keeps user mode going: after an event that came before user mode
        /// had run [`USER_PROGRESS`] instructions or for [`USER_RUN`] since the one before, the
        /// next waits until it has.
        /// Kernel code is slow where the host emulates it (and slower still on a loaded machine)
        /// while the local APIC's timer keeps real time: taken at once on every return to user
        /// mode, ticks that take the kernel longer than their period would leave user code no
        /// time at all (measured: four such VMs on this machine's two CPUs hung in
        /// emon-perf-user's loops, or its queued overflow signals overran RLIMIT_SIGPENDING).
        /// Otherwise an event is taken where the CPU takes it. emon delivers it through the
        /// IDT itself (where it cannot, KVM's next entry does: `expect_event`), so that the
        /// vCPU's next entry is at CPL0, where it can be stepped.
        fn take_user_event(&mut self, cx: &mut Cx, mode: &CpuMode) -> Result<bool, BackendError> {
            let slot = &mut self.engine.tcg;
            let now = slot.clock.now();
            let since = *slot.user_since.get_or_insert(now);
            let progressed = slot.user_retired >= USER_PROGRESS || slot.user_ran + (now - since) >= USER_RUN;
            let starved = slot.user_starved && !progressed;
            if starved && !self.interrupt_raised_by_guest(cx)? {
                let slot = &mut self.engine.tcg;
                // The engine checks its budget before each block: a block's worth more, so that
                // the run retires at least the first whatever its length.
                slot.user_budget = Some(USER_PROGRESS - slot.user_retired + tcg::MAX_BLOCK);
                return Ok(false);
            }
            let slot = &mut self.engine.tcg;
            if slot.events_asked.is_some_and(|t| now - t < EVENT_CHECK) {
                return Ok(false);
            }
            slot.events_asked = Some(now);
            self.stats.event_checks += 1;
            let Some(due) = cx.vcpu.due_event()? else { return Ok(false) };
            self.stats.user_events += 1;
            let slot = &mut self.engine.tcg;
            (slot.user_since, slot.user_ran, slot.user_retired) = (None, Duration::ZERO, 0);
            slot.user_starved = !progressed;
            let vector = match due {
                DueEvent::Interrupt(v) => v,
                DueEvent::Nmi => NMI_VECTOR,
                // The PIC gives its vector when the CPU acknowledges it: KVM's next entry does.
                DueEvent::ExtInt => {
                    tracing::debug!(rip = format_args!("{:#x}", cx.vcpu.regs()?.rip), "ExtINT due in user mode");
                    self.step.expect_event = true;
                    return Ok(true);
                }
            };
            // The vCPU leaves user mode for the handler: the next boundary there is a first one.
            self.engine.tcg.events_asked = None;
            let from = cx.vcpu.regs()?.rip;
            match self.deliver_event(cx, mode, vector, Event::External)? {
                Ok(handler) => {
                    self.step.rip = Some(handler);
                    self.stats.events += 1;
                    self.take_event_branch(cx, from, handler, mode.cpl)?;
                }
                Err(why) => {
                    tracing::debug!(?why, vector, "KVM delivers the event due in user mode");
                    cx.vcpu.queue_event(due)?;
                    self.step.expect_event = true;
                }
            }
            Ok(true)
        }

        /// Whether the local APIC holds a deliverable interrupt the guest raised itself: a
        /// self-IPI (such as the one Linux's irq_work sends), not its timer's nor a device's
        /// through the I/O APIC. The wait for user-mode progress (`take_user_event`) is for those,
        /// which come on real time however long the kernel takes over them (the PIT's tick comes
        /// through the I/O APIC where Linux finds the local APIC's timer unusable); an interrupt
        /// the guest's own code raised is taken where the CPU takes it.
        fn interrupt_raised_by_guest(&mut self, cx: &mut Cx) -> Result<bool, BackendError> {
            use crate::lapic;
            let page = cx.vcpu.lapic()?;
            let timer = lapic::reg(&page, lapic::LVT_TIMER) & 0xFF;
            let Some(v) = lapic::deliverable(&page).filter(|v| u32::from(*v) != timer) else { return Ok(false) };
            // The I/O APIC is read only for a vector that is not the timer's.
            let devices = cx.vcpu.device_vectors()?;
            Ok(devices[usize::from(v) / 64] & 1 << (v % 64) == 0)
        }

        /// Kernel code that emon runs (in the engine, or completing an instruction such as RDTSC
        /// itself) with no KVM entry for [`EVENT_CHECK`], or a REP string instruction at CPL0
        /// stopped mid-way for KVM's turn: KVM is asked for the event due, without entering the
        /// guest, as at a user-mode boundary. A polling loop (`pause; rdtsc` while waiting for
        /// the timer's interrupt) would otherwise never take one. KVM stepping a REP string
        /// instruction would run all its remaining iterations (its single-step trap comes when it
        /// retires), a thousand times slower than the engine where the host emulates CPL0 code.
        /// An event due is queued for the next entry, between two iterations of a REP string
        /// instruction, where the CPU takes it too (SDM Vol. 2B, REP); true if one was.
        fn take_kernel_event(&mut self, cx: &mut Cx) -> Result<bool, BackendError> {
            self.engine.tcg.cooldown = 0;
            self.engine.tcg.kernel_since = Some(self.engine.tcg.clock.now());
            self.stats.event_checks += 1;
            let due = cx.vcpu.due_event()?;
            // The CPU takes the next one at the first boundary where RFLAGS.IF lets it in (SDM
            // Vol. 3A 6.8.1), such as right after the handler's IRET: until emon has asked again
            // there, runs at CPL0 are short.
            self.engine.tcg.kernel_recheck = due.is_some();
            let Some(due) = due else { return Ok(false) };
            cx.vcpu.queue_event(due)?;
            self.step.expect_event = true;
            Ok(true)
        }

        /// User mode as after an event that came before it made progress (unit tests).
        #[cfg(test)]
        pub(in super::super) fn starve_user_mode(&mut self) {
            let slot = &mut self.engine.tcg;
            slot.user_starved = true;
            (slot.user_since, slot.user_ran, slot.user_retired, slot.events_asked) = (None, Duration::ZERO, 0, None);
        }

        /// The next engine run takes at most `n` instructions and REP iterations (unit tests).
        #[cfg(test)]
        pub(in super::super) fn limit_next_run(&mut self, n: u64) {
            self.engine.tcg.next_budget = Some(n);
        }

        /// A return to user mode (SYSRET, or IRET to CPL3) where user mode runs in the engine: the
        /// engine completes it, so that no user instruction runs in KVM. Anything else, and a return
        /// that faults (SDM Vol. 2B, IRET and SYSRET: #GP where the frame or RCX does not hold), KVM
        /// runs, as any other CPL0 instruction.
        pub(in super::super) fn emulate_return_to_user(
            &mut self,
            cx: &mut Cx,
            p: &mut Pending,
            i: &Insn,
            mode: &CpuMode,
        ) -> Result<Option<Next>, BackendError> {
            if i.special == Special::Iret && !self.iret_target(cx, mode)?.is_some_and(|(_, user)| user) {
                return Ok(None);
            }
            let before = tcg::state_of(cx.vcpu, Needs { fpu: false, msrs: i.special == Special::Sysret })?;
            let Some(engine) = self.engine.tcg_engine(cx.vcpu.memory()) else { return Ok(None) };
            let after = match engine.complete(&before) {
                Ok(tcg::Completed::Retired(after)) if CpuMode::from_sregs(&after.sregs).cpl == 3 => after,
                Ok(_) => return Ok(None),
                Err(e) => {
                    tracing::debug!("{e}: KVM runs the return to user mode");
                    return Ok(None);
                }
            };
            // The guest's TF, popped by IRET or restored from R11 by SYSRET: emon takes its traps in
            // user mode (`traced_user_step`).
            self.step.user_tf = after.regs.rflags & RFLAGS_TF != 0;
            tcg::write_back(cx.vcpu, &before, &after, false)?;
            if i.special == Special::Iret {
                // IRET ends NMI blocking (SDM Vol. 3A 6.7.1).
                cx.vcpu.end_nmi_blocking()?;
            }
            self.stats.returns_completed += 1;
            self.retire_one(cx, p, (i, p.rip, p.cpl), after.regs.rip, true)?;
            Ok(Some(Next::Retired))
        }

        /// User code with RFLAGS.TF set, or with breakpoints armed, where it runs in the engine
        /// (KVM neither steps it nor makes its traps here): emon runs the one instruction
        /// (completing it as it completes others, or alone in the engine), then takes the trap
        /// the CPU takes after it (`debug_trap`): the single-step trap (SDM Vol. 3B 17.3.1.4),
        /// DR6.BS and #DB with the frame at the next boundary, TF still set in its RFLAGS; and
        /// DR6.Bn for the data breakpoints it met. An instruction breakpoint faults before it
        /// (`instruction_breakpoint`). A REP string instruction traps after each iteration. One
        /// that leaves user mode (SYSCALL, whose IA32_FMASK clears TF; INT n; a fault) takes no
        /// single-step trap there.
        fn traced_user_step(
            &mut self,
            cx: &mut Cx,
            first: &iced_x86::Instruction,
            mode: &CpuMode,
        ) -> Result<Option<Next>, BackendError> {
            let rip = first.ip();
            // An instruction breakpoint comes before a fault fetching the instruction (SDM Vol.
            // 3A 6.9, priority 5), which is raised as when untraced.
            if self.instruction_breakpoint(cx, rip)? {
                return Ok(Some(Next::Retired));
            }
            let Some(i) = self.decode(cx, mode, rip) else { return self.user_mode_handover(cx, first, mode, None) };
            let watched = self.watched_accesses(cx, mode, rip)?;
            let p = self.pending_at(rip, mode.cpl);
            let needs = match tcg::classify(first, &mut iced_x86::InstructionInfoFactory::new()) {
                Class::Runs(needs) => needs,
                Class::HandedOver => {
                    // As untraced: a privileged instruction, a page fault, an invalid opcode
                    // raise their exception (and do not retire: no trap); what emon completes
                    // (SYSCALL, INT n, RDTSC, ...) traps after it if it stayed in user mode.
                    if let Some(raised) = self.user_mode_handover(cx, first, mode, None)? {
                        return Ok(Some(raised));
                    }
                    let mut p = p;
                    // (`queued` only gates RDMSR and WRMSR, which raise #GP at CPL3.)
                    let Some(next) = self.emulate(cx, &mut p, &i, mode, false)? else { return Ok(None) };
                    if next == Next::Retired {
                        self.debug_trap(cx, &watched, true)?;
                    }
                    return Ok(Some(next));
                }
            };
            let before = tcg::state_of(cx.vcpu, needs)?;
            let Some(engine) = self.engine.tcg_engine(cx.vcpu.memory()) else { return Ok(None) };
            // TF set: TCG stops after the instruction, or after one iteration of a REP string
            // instruction; the trap is emon's. A REP string instruction under a data breakpoint
            // runs one iteration at a time too (it traps after the iteration that met it).
            let mut run = before.clone();
            if first.is_string_instruction() && !watched.is_empty() {
                run.regs.rflags |= RFLAGS_TF;
            }
            let done = match engine.complete(&run) {
                Ok(done) => done,
                Err(e) => {
                    tracing::debug!("{e}: KVM runs the traced user instruction");
                    return Ok(None);
                }
            };
            // The guest's TF as before (TCG may clear it after its trap, or keep the one set for
            // an iteration).
            let tf = before.regs.rflags & RFLAGS_TF;
            let with_tf = |mut s: tcg::CpuState| {
                s.regs.rflags = s.regs.rflags & !RFLAGS_TF | tf;
                s
            };
            match done {
                tcg::Completed::Retired(after) => {
                    let after = with_tf(after);
                    tcg::write_back(cx.vcpu, &before, &after, false)?;
                    self.retire_one(cx, &p, (&i, rip, mode.cpl), after.regs.rip, true)?;
                }
                // An iteration of a REP string instruction: it has not retired.
                tcg::Completed::Iteration(after) => tcg::write_back(cx.vcpu, &before, &with_tf(after), false)?,
                tcg::Completed::Fault { .. } | tcg::Completed::PageFault { .. } => {
                    // Raised as when untraced (the engine runs it again, and hands it back).
                    return self.user_mode_handover(cx, first, mode, None);
                }
            }
            self.debug_trap(cx, &watched, true)?;
            Ok(Some(Next::Retired))
        }

        /// Whether `i`, at CPL0, is IRETQ to user mode or SYSRETQ.
        fn returns_to_user(
            &mut self,
            cx: &mut Cx,
            i: &iced_x86::Instruction,
            mode: &CpuMode,
        ) -> Result<bool, BackendError> {
            Ok(match i.code() {
                iced_x86::Code::Sysretq => true,
                iced_x86::Code::Iretq => self.iret_target(cx, mode)?.is_some_and(|(_, user)| user),
                _ => false,
            })
        }

        /// Whether the engine may run now. It counts, and keeps the LBR stack's records, but does
        /// not write records to guest memory or report registers per instruction: while BTS
        /// records, or one counter counts with an edge-detected CMASK (or CMASK on reference ticks
        /// or the cache model, which the engine sums per block), every instruction is stepped; and
        /// it runs 64-bit code only. A PEBS assist comes with a counter's overflow, and the
        /// record holds the registers right after the overflowing instruction: at CPL0 the engine
        /// stops short of every overflow, so the stepper retires that instruction and writes the
        /// record; at CPL3 the engine stops right after it (`Stop::Overflowed`) and `take_run`
        /// writes it.
        fn engine_may_run(&self, cx: &Cx, mode: &CpuMode) -> bool {
            let pebs = cx.pmu.pebs_on() && cx.pmu.pebs_enable() != 0;
            self.engine.engine() == Engine::Tcg
                && mode.bitness == 64
                && self.counters.armed.iter().all(|a| a.sums_per_instruction())
                && !self.branches.bts_on
                && (!pebs || matches!(mode.cpl, 0 | 3))
        }

        /// Whether a counter counts, or the LBR stack records, at this privilege level. Then STI
        /// goes to KVM, which delivers the interrupts it lets in right after the instruction its
        /// shadow covers. Elsewhere the engine runs it, and those interrupts wait for the run's
        /// end, which comes on time (`FREE_SLICE`), as for any code with RFLAGS.IF set there: an
        /// interrupt taken later, in code nothing counts.
        fn counts_here(&self, mode: &CpuMode) -> bool {
            self.branches.lbr_on || self.counters.armed.iter().any(|a| if mode.cpl == 0 { a.os } else { a.usr })
        }

        /// What an engine run must honour of the guest's breakpoints (DR7), or `None` where it
        /// may not run while they are armed. Where they are KVM's (user mode not in the engine),
        /// the engine stands aside. Where they are emon's, a run stops before each instruction
        /// breakpoint; with a data breakpoint armed, user code goes an instruction at a time
        /// (`traced_user_step`, which knows each one's accesses), and kernel code runs only where
        /// it reaches user memory with RFLAGS.AC set alone (SMAP on, every data breakpoint in user
        /// memory, AC clear now): the run stops where AC may be set, and that code is stepped.
        fn watch(&mut self, cx: &mut Cx, mode: &CpuMode) -> Result<Option<tcg::Watch>, BackendError> {
            use emon_x86::debug::{CR4_SMAP, RFLAGS_AC};
            let b = self.guest_breakpoints(cx)?;
            if !b.armed() {
                return Ok(Some(tcg::Watch::default()));
            }
            if !self.user_in_engine() {
                return Ok(None);
            }
            if b.watches_data()
                && (mode.cpl == 3
                    || mode.cr4 & CR4_SMAP == 0
                    || !b.data_in_lower_half()
                    || cx.vcpu.regs()?.rflags & RFLAGS_AC != 0)
            {
                return Ok(None);
            }
            Ok(Some(tcg::Watch { exec: b.instruction_addresses(), user_data: b.watches_data() }))
        }

        /// One engine run from the vCPU's state, counting for the armed counters (and again,
        /// with more state loaded, when the code needs it): the state it started from and the
        /// run; `None` if the engine failed (and was given up).
        fn engine_run(&mut self, cx: &mut Cx, mode: &CpuMode) -> Result<Option<(CpuState, tcg::Run)>, BackendError> {
            if self.engine.tcg_engine(cx.vcpu.memory()).is_none() {
                return Ok(None);
            }
            let Some(watch) = self.watch(cx, mode)? else { return Ok(None) };
            let armed: Vec<_> =
                self.counters.armed.iter().map(|a| (*a, cx.pmu.events_before_attention(a.id))).collect();
            let counts_here = self.counts_here(mode);
            loop {
                let state = tcg::state_of(cx.vcpu, self.engine.tcg.wants)?;
                if state.regs.rflags & RFLAGS_TF != 0 {
                    return Ok(None);
                }
                let clock = tcg::ModelClock { cycles: self.clock.cycles, reference: self.clock.reference };
                // Where nothing counts at this privilege level, or in user mode, the run hands back
                // on time for interrupts too (at CPL0 KVM delivers them at the next step; at CPL3
                // KVM is asked): STI runs there, and what it lets in waits for the run's end.
                let deadline = (mode.cpl == 3 || !counts_here).then(|| Instant::now() + FREE_SLICE);
                let tsc = self.engine_run_tsc(cx, mode)?;
                let counting = tcg::Counting {
                    armed: &armed,
                    clock,
                    budget: match mode.cpl {
                        3 => self.engine.tcg.user_budget.take().unwrap_or(tcg::BUDGET),
                        _ if self.engine.tcg.kernel_recheck => RECHECK_BUDGET,
                        _ => tcg::BUDGET,
                    }
                    .min(self.engine.tcg.next_budget.take().unwrap_or(u64::MAX))
                    // Up to the guest's deadline timer on the model's time (a block may overrun it).
                    .min(self.clock.cycles_to_deadline().map_or(u64::MAX, |c| c.max(tcg::MAX_BLOCK))),
                    cache: self.feed.lend(),
                    deadline,
                    lbr: self.branches.tail(cx.pmu),
                    watch: watch.clone(),
                    withhold_sti: counts_here,
                    tsc,
                    tsc_if_clear: mode.cpl < 3 && matches!(tsc, Some(TscSource::Host(_))),
                };
                let engine = self.engine.tcg.engine.get(cx.vcpu.memory()).expect("made above");
                let run = match engine.run(&state, *mode, counting) {
                    Ok(run) => run,
                    Err(e) => {
                        self.engine.give_up(e.to_string());
                        return Ok(None);
                    }
                };
                self.feed.give_back(run.cache.clone());
                self.stats.engine_runs += 1;
                if let Some(last) = run.tsc.last {
                    cx.vcpu.tsc_given(last);
                    self.stats.engine_tsc_reads += run.tsc.reads;
                }
                self.stats.engine_model_tsc_reads += run.tsc.model_reads;
                tracing::trace!(
                    rip = format_args!("{:#x}", state.regs.rip),
                    cpl = mode.cpl,
                    stop = ?run.stop,
                    retired = run.retired,
                    fault = ?run.fault,
                    to = format_args!("{:#x}", run.state.regs.rip),
                    "TCG engine run"
                );
                let slot = &mut self.engine.tcg;
                if let tcg::Stop::Needs(n) = run.stop {
                    if !n.met_by(slot.wants) {
                        slot.wants = slot.wants.union(n);
                        slot.unused_runs = 0;
                        if run.retired == 0 {
                            continue;
                        }
                    }
                }
                slot.unused_runs += 1;
                if slot.unused_runs > WANTS_KEPT {
                    slot.wants = Needs::NONE;
                }
                // KVM runs at least the next kernel instruction: it delivers interrupts, and runs
                // what the engine handed over or faulted on (after a handover that is the next
                // instruction anyway). A run that retired nothing is not tried again for a while.
                // (At CPL3 the engine goes on: KVM cannot step user mode here. What a user-mode
                // run retired says nothing of the kernel code after it.) A run that stopped for
                // state it did not load goes on in the next, which loads it (`wants`): the
                // SWAPGS before Linux's return to user mode was a KVM step on every return.
                slot.cooldown = match (mode.cpl, run.retired, run.stop) {
                    (3, ..) => 0,
                    (_, 0, _) => TCG_COOLDOWN,
                    (_, _, tcg::Stop::Handover | tcg::Stop::InterruptsOn | tcg::Stop::Needs(_)) => 0,
                    _ => 1,
                };
                return Ok(Some((state, run)));
            }
        }

        /// What an engine run retired goes to the counters, the model clock and the vCPU (the
        /// state the run changed: registers always, the rest where it differs).
        fn take_run(&mut self, cx: &mut Cx, before: &CpuState, run: tcg::Run) -> Result<(), BackendError> {
            for (a, n) in self.counters.armed.iter().zip(&run.counts) {
                // At CPL0 the engine stops short of every overflow, and the overflowing
                // instruction is stepped; at CPL3 it stops right after it (`Stop::Overflowed`).
                if *n > 0 && cx.pmu.add_events(a.id, *n) && run.stop != tcg::Stop::Overflowed {
                    tracing::error!("{}: the TCG engine crossed an overflow", a.id);
                }
            }
            let cpl = CpuMode::from_sregs(&before.sregs).cpl;
            if self.counting || self.clock.throughout() {
                self.clock.cycles += run.cycles;
            }
            if self.counting {
                self.stats.retired += run.retired;
                self.stats.engine_retired += run.retired;
            } else {
                match cpl {
                    0 if self.cpl0_in_engine() => self.stats.free_engine += run.retired,
                    0 => self.stats.free_returns += run.retired,
                    _ => self.stats.free_user += run.retired,
                }
            }
            if cpl == 3 {
                self.engine.tcg.user_retired += run.retired;
            }
            if run.used != Needs::NONE {
                self.engine.tcg.unused_runs = 0;
            }
            if let Some(tail) = run.lbr {
                self.branches.take_tail(cx.pmu, tail);
            }
            let tf = run.state.regs.rflags & RFLAGS_TF != 0;
            if CpuMode::from_sregs(&run.state.sregs).cpl == 3 && self.user_in_engine() {
                // In user mode emon takes the guest's single-step traps (`traced_user_step`).
                self.step.user_tf = tf;
            } else if !self.counting && tf {
                // An IRETQ set the guest's own TF: KVM runs on free (its single-step would hide
                // and clobber the guest's TF), so the guest's #DBs reach it.
                self.run_free_for_guest_debug(cx)?;
            }
            // A run that ends on STI leaves its shadow also where IF was set before the STI, when
            // the CPU sets none (SDM Vol. 2B, STI): the engine does not know IF before an STI
            // inside a block, and an interrupt then only waits one instruction more.
            tcg::write_back(cx.vcpu, before, &run.state, run.after_sti)?;
            if run.flushed_tlb {
                cx.vcpu.flush_tlb()?;
            }
            if run.iret {
                cx.vcpu.end_nmi_blocking()?;
            }
            if run.state.sregs != before.sregs {
                self.step.mode = None;
            }
            self.step.rip = Some(run.state.regs.rip);
            if let Some(at) = run.overflowed_at {
                // The run stopped right after the overflowing instruction, the registers its
                // results: the PEBS assist due writes its record as after a step.
                self.pebs_assist(cx, at, true)?;
            }
            if run.stop == tcg::Stop::Overflowed && cx.pmu.pmi_pending() {
                // The PMI goes out before the next entry; the vCPU takes it first thing.
                self.step.expect_event = true;
            }
            Ok(())
        }

        /// User mode in the engine reached an instruction the engine does not run, or that
        /// faulted there (`fault`: the exception, where the engine said which). Privileged ones
        /// raise #GP(0) at CPL3 (SDM Vol. 3A 5.9); a page fault and the exceptions the engine
        /// names are raised as on the CPU: emon delivers them, and the vCPU enters the kernel's
        /// handler, which it can step, without running a user instruction in KVM (which cannot
        /// step it on some hosts, and whose view of the page tables may lag the engine's writes).
        /// RDPMC is emulated as when stepping, and #UD raised for an invalid opcode. Anything
        /// else goes to KVM, which such a host may not step (the run then says NOT EXACT).
        fn user_mode_handover(
            &mut self,
            cx: &mut Cx,
            i: &iced_x86::Instruction,
            mode: &CpuMode,
            fault: Option<u32>,
        ) -> Result<Option<Next>, BackendError> {
            use iced_x86::Mnemonic::*;
            if matches!(i.mnemonic(), Int | Int3) {
                // Delivered through the IDT when it retires (`emulate_int`).
                return Ok(None);
            }
            let regs = cx.vcpu.regs()?;
            let iopl = (regs.rflags >> 12) & 3;
            let privileged = i.is_privileged()
                || matches!(i.mnemonic(), Hlt | Rdmsr | Wrmsr)
                || (iopl < 3
                    && matches!(i.mnemonic(), Cli | Sti | In | Out | Insb | Insw | Insd | Outsb | Outsw | Outsd));
            let (vector, code) = if privileged {
                (GP_VECTOR, Some(0))
            } else if let Some((code, cr2)) = self.user_page_fault(cx, i, mode, &regs)? {
                return self.raise_user_fault(cx, mode, PF_VECTOR, Some(code), Some(cr2));
            } else if i.is_invalid() || matches!(i.mnemonic(), Ud0 | Ud1 | Ud2) {
                // An invalid opcode, UD0/1/2 (SDM Vol. 2B, UD): #UD.
                (UD_VECTOR, None)
            } else if self.divide_error(cx, i, mode, &regs)? {
                // The engine stops on a divide error without naming it.
                (DE_VECTOR, None)
            } else {
                match fault.and_then(|v| Some((v as u8, plain_error_code(v)?))) {
                    Some(raised) => raised,
                    None => return Ok(None),
                }
            };
            self.raise_user_fault(cx, mode, vector, code, None)
        }

        /// Raises the fault `vector` (with its error code, and for a page fault the address CR2
        /// takes) of the user-mode instruction at RIP, as the CPU raises it: emon delivers it
        /// through the IDT, so that the handler runs on in the engine (KVM's delivery entered the
        /// vCPU, which stepped the handler's first instruction in KVM's emulator and asked for
        /// the events due again at the next user-mode boundary, per page fault); KVM delivers it
        /// where emon cannot (a fault on the way: a double fault, or a stack not mapped).
        fn raise_user_fault(
            &mut self,
            cx: &mut Cx,
            mode: &CpuMode,
            vector: u8,
            error_code: Option<u32>,
            cr2: Option<u64>,
        ) -> Result<Option<Next>, BackendError> {
            let from = cx.vcpu.regs()?.rip;
            match self.deliver_event(cx, mode, vector, Event::Fault { error_code })? {
                Ok(handler) => {
                    if let Some(cr2) = cr2 {
                        let sregs = cx.vcpu.sregs()?;
                        cx.vcpu.set_sregs(&kvm_bindings::kvm_sregs { cr2, ..sregs })?;
                    }
                    self.step.rip = Some(handler);
                    self.stats.events += 1;
                    self.take_event_branch(cx, from, handler, mode.cpl)?;
                }
                Err(why) => {
                    tracing::debug!(?why, vector, "KVM delivers the fault in user mode");
                    match cr2 {
                        Some(cr2) => cx.vcpu.inject_page_fault(error_code.unwrap_or(0), cr2)?,
                        None => cx.vcpu.inject_exception(vector, error_code)?,
                    }
                    self.step.expect_event = true;
                }
            }
            Ok(Some(Next::Retired))
        }

        /// Whether `i` is DIV or IDIV and raises #DE ([`emon_x86::access::divide_error`]).
        fn divide_error(
            &self,
            cx: &mut Cx,
            i: &iced_x86::Instruction,
            mode: &CpuMode,
            regs: &kvm_bindings::kvm_regs,
        ) -> Result<bool, BackendError> {
            use emon_x86::access;
            if !matches!(i.mnemonic(), iced_x86::Mnemonic::Div | iced_x86::Mnemonic::Idiv) {
                return Ok(false);
            }
            let sregs = cx.vcpu.sregs()?;
            let memory =
                access::operand_address(i, |r| access::gpr(regs, r), sregs.fs.base, sregs.gs.base).and_then(|a| {
                    let mut b = [0u8; 8];
                    mode.read_linear(cx.vcpu.memory(), a, &mut b[..i.memory_size().size()])?;
                    Some(u64::from_le_bytes(b))
                });
            Ok(access::divide_error(i, regs, memory) == Some(true))
        }

        /// The page fault user-mode instruction `i` raises, if it does: its error code and the
        /// address CR2 takes (the first byte it cannot reach). The fetch comes first, then its
        /// data accesses in order.
        fn user_page_fault(
            &self,
            cx: &mut Cx,
            i: &iced_x86::Instruction,
            mode: &CpuMode,
            regs: &kvm_bindings::kvm_regs,
        ) -> Result<Option<(u32, u64)>, BackendError> {
            use emon_x86::access::{self, AccessKind};
            use emon_x86::mode::Access;
            let sregs = cx.vcpu.sregs()?;
            // An instruction that runs into a page it cannot be fetched from decodes as invalid
            // for want of bytes: its fetch reaches the first byte past those it has (a #PF, not
            // the #UD of an invalid opcode).
            let mut fetched = i.len().max(1) as u64;
            if i.is_invalid() {
                let bytes = mode.fetch(cx.vcpu.memory(), i.ip());
                let mut d = iced_x86::Decoder::with_ip(64, &bytes, i.ip(), iced_x86::DecoderOptions::NONE);
                let _ = d.decode();
                if d.last_error() == iced_x86::DecoderError::NoMoreBytes {
                    fetched = bytes.len() as u64 + 1;
                }
            }
            let mut spans = vec![(i.ip(), fetched, Access::Fetch)];
            if let Ok(accesses) = access::next_accesses(i, |r| access::gpr(regs, r), sregs.fs.base, sregs.gs.base) {
                spans.extend(accesses.iter().map(|a| {
                    let kind = match a.kind {
                        AccessKind::Read | AccessKind::Flush => Access::Read,
                        _ => Access::Write,
                    };
                    (a.linear, u64::from(a.size.max(1)), kind)
                }));
            }
            let mem = cx.vcpu.memory();
            Ok(spans.into_iter().find_map(|(start, len, kind)| mode.span_page_fault(mem, start, len, kind, false)))
        }
    }
}
