//! The precise backend: exact, deterministic counts by single-stepping the guest, with the TCG
//! engine running most counted code (README, "The precise backend").
//!
//! While at least one counter is counting, every KVM_RUN executes one guest instruction
//! (KVM_GUESTDBG_SINGLESTEP) and ends in a debug exit; each exit is one retired instruction,
//! which is decoded (iced-x86) and attributed to the counters that were counting when it began.
//! When no counter is counting (and nothing records branches) the guest runs free.
//!
//! Its parts, one job each:
//! - [`stepper`]: arming each step, and what a debug exit retired (lost traps, event delivery);
//! - [`decode_cache`]: the stepper's decoded instructions, checked against guest memory;
//! - [`counters`]: the armed counters and the attribution of a retired instruction;
//! - [`events`]: what each event counts for an instruction, and the cost model;
//! - [`clock`]: the model clock and the guest's time-stamp counter while counting;
//! - [`emulate`]: the instructions emon completes itself (HLT, RDPMC, TSC reads, fences);
//! - [`cache_feed`] over [`cache`] over [`prefetch`]: the data accesses the cache model sees, the
//!   model, and its hardware prefetchers;
//! - [`branches`]: the LBR stack's and BTS's taken branches; [`debug_store`]: PEBS and BTS
//!   records in the guest's DS area;
//! - [`engine`] over [`tcg`]: the TCG engine's fast-forward between steps.
mod branches;
pub mod cache;
mod cache_feed;
mod clock;
mod counters;
mod debug_store;
mod decode_cache;
mod emulate;
mod engine;
pub mod events;
mod guest_debug;
mod prefetch;
mod stepper;
#[cfg(feature = "tcg")]
pub mod tcg;
#[cfg(test)]
mod tests;

use crate::{Backend, BackendError, Cx, Next};
use branches::BranchRecorder;
use cache_feed::CacheFeed;
use clock::GuestClock;
use counters::Counters;
use debug_store::DsStats;
use decode_cache::DecodeCache;
use emon_pmu::pmu::lbr::{Branch, BranchType};
use emon_pmu::profile::{Cache, Clock};
use emon_x86::insn::Special;
pub use engine::Engine;
use engine::EngineSlot;
use stepper::{decode_full, Pending, Stepper};

/// How the precise backend runs the guest's code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// What runs counted code.
    pub engine: Engine,
    /// CPL0 code runs in the TCG engine while nothing counts too (README, "CPL0 code in the TCG
    /// engine").
    pub cpl0_in_engine: bool,
    /// User-mode code runs in the TCG engine while nothing counts too, and emon completes
    /// SYSCALL: the host does not enter the kernel on SYSCALL from CPL3 (README, "User mode
    /// (CPL3)").
    pub user_in_engine: bool,
    /// What the guest's TSC and deadline timer follow.
    pub guest_time: GuestTime,
}

/// What the guest's TSC and TSC-deadline timer follow (README, "Guest time"; `--guest-time`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum GuestTime {
    /// The model clock while something counts, real time otherwise.
    #[default]
    Counted,
    /// The model clock in all the code emon runs: the whole run on a host where emon runs all of
    /// the guest's code.
    Model,
}

use emon_x86::arch::RFLAGS_TF;
use emon_x86::debug::Breakpoints;

/// What the backend did, for the run summary.
#[derive(Debug, Default, Clone)]
pub struct Stats {
    pub steps: u64,
    pub retired: u64,
    pub events: u64,
    pub hlt: u64,
    pub rdpmc: u64,
    pub arm_changes: u64,
    /// Instructions that retired without their own single-step trap.
    pub lost_traps: u64,
    /// Single-steps of user-mode (CPL3) code that did not come back to the VMM.
    pub cpl3_lost: u64,
    /// User-mode instructions neither the engine nor emon ran, handed to KVM on a host where
    /// user mode runs in the engine because KVM cannot step it, by mnemonic.
    pub user_to_kvm: std::collections::BTreeMap<String, u64>,
    /// Times KVM was left to run free, on a host where user mode runs in the engine, because the
    /// guest single-steps its kernel code (RFLAGS.TF at CPL0), which only KVM makes trap.
    pub debugged_in_kvm: u64,
    /// TCG engine runs, and the counted instructions they retired.
    pub engine_runs: u64,
    pub engine_retired: u64,
    /// Instructions run with nothing counting because the engine runs this host's CPL0 code
    /// (in the engine, and stepped in KVM where the engine handed them over).
    pub free_engine: u64,
    /// User-mode instructions run in the engine with nothing counting (where the host does not
    /// enter the kernel on SYSCALL).
    pub free_user: u64,
    pub free_stepped: u64,
    /// With nothing counting and CPL0 code stepped in KVM (`--cpl0 kvm`, user mode in the
    /// engine): the returns to user mode the engine ran.
    pub free_returns: u64,
    /// RDMSR/WRMSR of IA32_TSC_DEADLINE emon completed: translated between the model's and KVM's
    /// guest TSC, or (in real time) written as the VMM.
    pub tsc_deadlines: u64,
    /// RDMSR/WRMSR of the PMU's MSRs completed by emon (not stepped in KVM).
    pub pmu_msrs: u64,
    /// IN and OUT of the VMM's own devices completed by emon (not stepped in KVM).
    pub ports: u64,
    /// Writes of the xAPIC's LVTPC completed by emon (not stepped in KVM).
    pub lvtpc_writes: u64,
    /// SYSCALLs from user mode emon completed (where the host does not enter the kernel).
    pub syscalls: u64,
    /// INT n and INT3 from user mode emon delivered (where the host swallows them).
    pub soft_interrupts: u64,
    /// Times KVM was asked for the event due at a user-mode boundary, and how many it had.
    pub event_checks: u64,
    pub user_events: u64,
    /// Single-step traps (RFLAGS.TF) emon took after user-mode instructions.
    pub single_step_traps: u64,
    /// The guest's own breakpoints (DR0-DR3) that fired where emon ran or stepped the code.
    pub breakpoints_fired: u64,
    /// Instructions that ran with a data breakpoint armed whose accesses emon could not list
    /// before they ran (XSAVE and its kin, gathers): a breakpoint they met did not fire.
    pub breakpoints_unchecked: std::collections::BTreeMap<String, u64>,
    /// Returns to user mode (SYSRET, IRET) the engine completed where KVM was to step them.
    pub returns_completed: u64,
    /// RDTSC, RDTSCP and RDMSR(IA32_TSC) emon completed (from the modelled guest time, at CPL3,
    /// or in kernel code with nothing due before them).
    pub tsc_reads: u64,
    /// RDTSC and RDTSCP the engine ran, answered from the host's TSC (`Vcpu::tsc_window`).
    pub engine_tsc_reads: u64,
    /// Reads of the model's time in a counted stretch the engine answered.
    pub engine_model_tsc_reads: u64,
    /// RDTSC, RDTSCP or RDMSR that retired in counted code without their own single-step trap,
    /// so in KVM, reading real time (README, "Guest time").
    pub tsc_unseen: u64,
}

/// The precise backend (see the module documentation).
pub struct Precise {
    step: Stepper,
    decode: DecodeCache,
    counters: Counters,
    clock: GuestClock,
    feed: CacheFeed,
    branches: BranchRecorder,
    ds: DsStats,
    engine: EngineSlot,
    /// A counter counts or a branch record records: the guest's time follows the model.
    counting: bool,
    /// Runs CPL0 code in the TCG engine even while nothing counts (a host whose KVM only
    /// emulates it: README, "CPL0 code in the TCG engine").
    cpl0_in_engine: bool,
    /// Runs user-mode code in the TCG engine even while nothing counts, and completes SYSCALL
    /// from CPL3 (a host that does not enter the kernel on it: README, "User mode (CPL3)").
    user_in_engine: bool,
    /// With [`GuestTime::Model`] the guest's time follows the model wherever emon runs all of its
    /// code ([`Self::runs_all_code`]), not only while something counts.
    guest_time: GuestTime,
    pub stats: Stats,
}

impl Default for Precise {
    fn default() -> Self {
        Self::new()
    }
}

impl Precise {
    pub fn new() -> Precise {
        Precise::with_engine(Engine::DEFAULT)
    }

    /// A precise backend that runs counted code with `engine` (TCG only when built in).
    pub fn with_engine(engine: Engine) -> Precise {
        Precise {
            step: Stepper::default(),
            decode: DecodeCache::default(),
            counters: Counters::default(),
            clock: GuestClock::default(),
            feed: CacheFeed::default(),
            branches: BranchRecorder::default(),
            ds: DsStats::default(),
            engine: EngineSlot::new(engine),
            counting: false,
            cpl0_in_engine: false,
            user_in_engine: false,
            guest_time: GuestTime::Counted,
            stats: Stats::default(),
        }
    }

    /// Runs CPL0 code in the TCG engine while nothing counts too (where the TCG engine is built
    /// in and chosen).
    pub fn with_cpl0_in_engine(mut self, on: bool) -> Precise {
        self.cpl0_in_engine = on;
        self
    }

    /// What the guest's TSC and deadline timer follow (README, "Guest time").
    pub fn with_guest_time(mut self, guest_time: GuestTime) -> Precise {
        self.guest_time = guest_time;
        self
    }

    /// Keeps the times of the event checks of code that runs without KVM entries on `clock`
    /// (tests that must not depend on how fast the machine runs them).
    #[cfg(feature = "tcg")]
    pub fn with_event_clock(mut self, clock: engine::EventClock) -> Precise {
        self.engine.set_event_clock(clock);
        self
    }

    /// Runs user-mode code in the TCG engine even while nothing counts, and completes SYSCALL
    /// from CPL3 (where the TCG engine is built in and chosen).
    pub fn with_user_in_engine(mut self, on: bool) -> Precise {
        self.user_in_engine = on;
        self
    }

    /// Whether CPL0 code runs in the TCG engine while nothing counts.
    pub fn cpl0_in_engine(&self) -> bool {
        self.cpl0_in_engine && self.engine.engine() == Engine::Tcg
    }

    /// Whether user-mode code runs in the TCG engine while nothing counts.
    pub fn user_in_engine(&self) -> bool {
        self.user_in_engine && self.engine.engine() == Engine::Tcg
    }

    /// Whether emon runs all of the guest's 64-bit code, in the engine or a step at a time: where
    /// user mode runs in the engine, KVM runs no kernel code free either (`engine_takes`), but
    /// where the guest single-steps its own kernel code.
    fn runs_all_code(&self) -> bool {
        self.user_in_engine()
    }

    /// Whether some code runs in the TCG engine while nothing counts.
    fn runs_free_in_engine(&self) -> bool {
        self.cpl0_in_engine() || self.user_in_engine()
    }

    /// The engine that runs counted code.
    pub fn engine(&self) -> Engine {
        self.engine.engine()
    }

    /// Counts UnHalted Reference Cycles on GP counters by `clock` (the profile's `[clock]`).
    pub fn with_ref_clock(mut self, clock: Clock) -> Precise {
        self.clock.reference = clock;
        self
    }

    /// Leaves the guest's TSC at real time while counting: for `emon bench`, which measures the
    /// backend's speed with the guest's RDTSC.
    pub fn with_real_time(mut self) -> Precise {
        self.clock.virtual_time = false;
        self
    }

    /// Models the profile's data caches (its `[cache]`) for the LLC events.
    pub fn with_cache(mut self, cache: &Cache) -> Precise {
        self.feed = CacheFeed::new(cache);
        self
    }

    /// Reprograms the marked counters and arms for the next entry (see [`Backend::before_run`]).
    fn arm(&mut self, cx: &mut Cx, at_boundary: bool) -> Result<Next, BackendError> {
        let written = self.reprogram(cx);
        if let Some(p) = &mut self.step.pending {
            p.uncount_written(written);
        }
        self.feed.set_on(self.counters.use_cache());
        self.feed.set_prefetchers(cx.pmu.prefetchers_on());
        self.branches.arm(cx);
        let counting = !self.counters.armed.is_empty() || self.branches.on();
        if !at_boundary {
            // In the middle of an instruction (an MSR or I/O exit): start counting and stepping as
            // soon as a counter goes live, but never stop before the instruction retires (the
            // WRMSR that disables a counter still counts).
            if counting && !self.counting {
                self.set_counting(cx, true)?;
            }
            if counting && !self.step.stepping {
                self.set_stepping(cx, true)?;
            }
            if !counting && !self.step.stepping && self.runs_free_in_engine() {
                // KVM ran free since the last boundary (it may have left 32-bit code or user
                // mode): the engine takes over after this instruction if it takes the code.
                self.step.mode = None;
                self.step.guest_breakpoints = None;
                if self.engine_takes(cx)? {
                    self.set_stepping(cx, true)?;
                }
            }
            return Ok(Next::Run);
        }
        if counting != self.counting {
            self.set_counting(cx, counting)?;
        }
        if self.guest_time == GuestTime::Model && self.runs_all_code() != self.clock.throughout() {
            if self.clock.throughout() {
                self.clock.end_throughout(cx, self.counting)?;
            } else {
                self.clock.begin_throughout(cx)?;
            }
        }
        self.clock.fire_deadline(cx)?;
        // Nothing counts, but this host's CPL0 (or user) code runs in the engine.
        let executing = !counting && self.runs_free_in_engine() && self.engine_takes(cx)?;
        if !counting && !executing {
            if self.step.stepping {
                if self.guest_debugs(cx)? {
                    self.run_free_for_guest_debug(cx)?;
                } else {
                    self.set_stepping(cx, false)?;
                }
            }
            self.step.pending = None;
            self.step.expect_event = false;
            self.step.event_queued = false;
            return Ok(Next::Run);
        }
        if !self.step.stepping {
            self.set_stepping(cx, true)?;
        }
        let rip = self.rip(cx)?;
        let mode = self.mode(cx)?;
        let queued = std::mem::take(&mut self.step.event_queued);
        if !self.step.expect_event && !queued {
            if let Some(next) = self.fast_forward(cx, rip, &mode)? {
                return Ok(next);
            }
        }
        let next = self.pend(cx, rip, &mode, queued)?;
        if next == Next::Run {
            self.engine.kvm_entered();
        }
        Ok(next)
    }

    /// Reprograms the counters the model marked since the last call, and says which it wrote
    /// (IA32_PERF_GLOBAL_STATUS bits): a counter the pending instruction wrote does not count it.
    fn reprogram(&mut self, cx: &mut Cx) -> u64 {
        let r = cx.pmu.take_reprogram();
        self.counters.reprogram(cx, r);
        r.written
    }

    /// Whether the guest single-steps itself (RFLAGS.TF) or has breakpoints on (DR7).
    fn guest_debugs(&mut self, cx: &mut Cx) -> Result<bool, BackendError> {
        Ok(cx.vcpu.regs()?.rflags & RFLAGS_TF != 0 || self.guest_breakpoints(cx)?.armed())
    }

    /// The guest's breakpoints (DR0-DR3, DR7), read once until something may have changed them:
    /// KVM running free, or an instruction that may write a debug register.
    fn guest_breakpoints(&mut self, cx: &mut Cx) -> Result<Breakpoints, BackendError> {
        if let Some(b) = self.step.guest_breakpoints {
            return Ok(b);
        }
        let b = cx.vcpu.guest_breakpoints()?;
        self.step.guest_breakpoints = Some(b);
        Ok(b)
    }

    /// The guest's breakpoints where emon makes them fire: where user mode runs in the engine,
    /// emon runs or steps all of the guest's code while they are armed (user code an instruction
    /// at a time; kernel code in engine runs that honour them, `tcg::Watch`, or stepped), and
    /// raises the #DB each meets as the CPU does. Elsewhere they are KVM's (it runs free while
    /// they are armed and nothing counts), and this is `None`.
    fn emons_breakpoints(&mut self, cx: &mut Cx) -> Result<Option<Breakpoints>, BackendError> {
        if !self.user_in_engine() {
            return Ok(None);
        }
        Ok(Some(self.guest_breakpoints(cx)?).filter(Breakpoints::armed))
    }

    /// Whether the engine takes the code at the boundary while nothing counts: 64-bit CPL0 code
    /// (and user code where [`Self::user_in_engine`]), unless the guest single-steps its kernel
    /// code (RFLAGS.TF), or has breakpoints on (DR7) where only KVM makes them fire.
    fn engine_takes(&mut self, cx: &mut Cx) -> Result<bool, BackendError> {
        let mode = self.mode(cx)?;
        let level = match mode.cpl {
            // With user mode in the engine, CPL0 code is at least stepped in KVM (where it does
            // not run in the engine), so that every return to user mode is seen: KVM running free
            // would run user code after it, which it cannot do right on such a host.
            0 => self.cpl0_in_engine() || self.user_in_engine(),
            3 => self.user_in_engine(),
            _ => false,
        };
        // The guest's own single-stepping is KVM's to make trap, but in user mode where that runs
        // in the engine: there emon takes the traps (`traced_user_step`).
        let tf_is_kvms = !(mode.cpl == 3 && self.user_in_engine());
        if !level || mode.bitness != 64 || tf_is_kvms && cx.vcpu.regs()?.rflags & RFLAGS_TF != 0 {
            return Ok(false);
        }
        if !self.step.stepping {
            self.step.guest_breakpoints = None;
        }
        // Breakpoints are emon's where user mode runs in the engine (`emons_breakpoints`).
        Ok(!self.guest_breakpoints(cx)?.armed() || self.user_in_engine())
    }

    /// The instruction at `rip`, at `cpl`, as it begins (the event the entry expects goes with it).
    fn pending_at(&mut self, rip: u64, cpl: u8) -> Pending {
        Pending {
            rip,
            cpl,
            counting: self.counting,
            armed: self.counters.armed.clone(),
            expect_event: std::mem::take(&mut self.step.expect_event),
            iret_target: None,
            iret_to_user: false,
            accesses: Some(Vec::new()),
            watched: Vec::new(),
            guest_tf: None,
        }
    }

    /// Notes the instruction at `rip` as the one the next step retires, unless emon completes it
    /// itself (`queued`: the VMM queued a PMI in KVM for this entry).
    fn pend(
        &mut self,
        cx: &mut Cx,
        rip: u64,
        mode: &emon_x86::mode::CpuMode,
        queued: bool,
    ) -> Result<Next, BackendError> {
        let mut p = self.pending_at(rip, mode.cpl);
        if !p.expect_event {
            if self.instruction_breakpoint(cx, rip)? {
                return Ok(Next::Retired);
            }
            p.watched = self.watched_accesses(cx, mode, rip)?;
            if let Some(i) = self.decode(cx, mode, rip) {
                if let Some(next) = self.emulate(cx, &mut p, &i, mode, queued)? {
                    return Ok(next);
                }
                if i.special == Special::Pushf {
                    // KVM's step pushes its own TF (`pushed_tf`): the guest's, where emon traces
                    // user mode, and as KVM_GET_REGS shows it otherwise (KVM hides only its own).
                    p.guest_tf = Some(if p.cpl == 3 && self.user_in_engine() {
                        self.step.user_tf
                    } else {
                        cx.vcpu.regs()?.rflags & RFLAGS_TF != 0
                    });
                }
                let sets_tf = matches!(i.special, Special::Popf | Special::Iret)
                    && self.popped_rflags(cx, mode, &i)?.is_some_and(|f| f & RFLAGS_TF != 0);
                if i.special == Special::Iret {
                    let target = self.iret_target(cx, mode)?;
                    p.iret_target = target.map(|(rip, _)| rip);
                    p.iret_to_user = target.is_some_and(|(_, user)| user);
                }
                // Where user mode runs in the engine, emon takes its single-step traps: it keeps
                // the TF an IRET to user mode pops, which KVM_GET_REGS will hide.
                let traced_by_emon = self.user_in_engine() && (p.cpl == 3 || p.iret_to_user);
                if traced_by_emon && p.iret_to_user {
                    self.step.user_tf = sets_tf;
                } else if !self.counting && sets_tf && !traced_by_emon {
                    // The guest turns on its own single-stepping: KVM's single-step would hide
                    // and clobber its TF, so KVM runs on free, and its #DBs reach the guest.
                    self.run_free_for_guest_debug(cx)?;
                    return Ok(Next::Run);
                }
            }
            if self.feed.on {
                p.accesses = self.feed.accesses_at(cx, &decode_full(cx, mode, rip))?;
            }
            // An entry that delivers a queued PMI first runs no user instruction (where RFLAGS.IF
            // lets it in): `event_delivered` checks the handler's frame, and counts any user code
            // KVM ran before it.
            let delivers_first = queued && cx.vcpu.regs()?.rflags & emon_x86::arch::RFLAGS_IF != 0;
            if p.cpl == 3 && self.user_in_engine() && !delivers_first {
                // Whatever KVM runs from here is user code it cannot step on this host.
                let m = format!("{:?}", decode_full(cx, mode, rip).mnemonic()).to_lowercase();
                tracing::debug!(rip = format_args!("{rip:#x}"), insn = %m, "a user-mode instruction goes to KVM");
                *self.stats.user_to_kvm.entry(m).or_default() += 1;
            }
        }
        self.step.pending = Some(p);
        Ok(Next::Run)
    }

    /// Nothing counts and the guest debugs its own code where only KVM makes it trap (RFLAGS.TF
    /// in kernel code; DR7 breakpoints where user mode does not run in the engine): KVM runs
    /// free. Where user mode runs in the engine because KVM cannot run it right, that is noted
    /// (KVM will run user code).
    fn run_free_for_guest_debug(&mut self, cx: &mut Cx) -> Result<(), BackendError> {
        if self.user_in_engine() {
            self.stats.debugged_in_kvm += 1;
        }
        self.set_stepping(cx, false)
    }

    fn set_stepping(&mut self, cx: &mut Cx, on: bool) -> Result<(), BackendError> {
        cx.vcpu.set_single_step(on)?;
        self.step.stepping = on;
        self.stats.arm_changes += 1;
        if on {
            self.step.mode = None;
            self.step.rip = None;
            self.step.guest_breakpoints = None;
        }
        Ok(())
    }

    /// Counting starts or stops: the guest's time follows the model while it counts (README,
    /// "Guest time").
    fn set_counting(&mut self, cx: &mut Cx, on: bool) -> Result<(), BackendError> {
        if on {
            self.clock.begin_stretch(cx)?;
        } else {
            self.clock.end_stretch(cx)?;
        }
        self.counting = on;
        Ok(())
    }

    /// Records the taken branch `b` (from CPL `from_cpl`) in the LBR stack and the BTS buffer.
    fn take_branch(&mut self, cx: &mut Cx, b: Branch, from_cpl: u8) -> Result<(), BackendError> {
        let mode = self.mode(cx)?;
        self.branches.take(cx, &mut self.ds, &mode, b, from_cpl, self.clock.cycles)
    }

    /// An event (an interrupt, an exception) was delivered from `from` (at CPL `from_cpl`) to
    /// its handler at `to`, where the vCPU now is: a far branch, for the LBR stack and BTS.
    fn take_event_branch(&mut self, cx: &mut Cx, from: u64, to: u64, from_cpl: u8) -> Result<(), BackendError> {
        if !self.branches.on() {
            return Ok(());
        }
        let cpl = self.mode(cx)?.cpl;
        let b = Branch { from, to, kind: BranchType::Far, cpl, mispredicted: false, cycles: 0, event: true };
        self.take_branch(cx, b, from_cpl)
    }

    /// Performs a PEBS assist due after the instruction at `eventing_ip` (see
    /// [`debug_store::pebs_assist`]).
    fn pebs_assist(&mut self, cx: &mut Cx, eventing_ip: u64, exact: bool) -> Result<(), BackendError> {
        if cx.pmu.pebs_due() == 0 {
            return Ok(());
        }
        let mode = self.mode(cx)?;
        let tsc = self.clock.guest_tsc(cx)?;
        debug_store::pebs_assist(cx, &mut self.ds, &mode, (eventing_ip, exact), tsc)
    }
}

impl Backend for Precise {
    fn name(&self) -> &'static str {
        "precise"
    }

    fn before_run(&mut self, cx: &mut Cx, at_boundary: bool) -> Result<Next, BackendError> {
        let next = self.arm(cx, at_boundary)?;
        if next == Next::Run {
            self.engine.kvm_runs();
        }
        Ok(next)
    }

    fn on_debug_exit(&mut self, cx: &mut Cx, pc: u64) -> Result<(), BackendError> {
        self.debug_exit(cx, pc)
    }

    fn event_queued(&mut self) {
        self.step.event_queued = true;
    }

    fn records_branches(&self) -> bool {
        true
    }

    fn writes_pebs(&self) -> bool {
        true
    }

    fn models_caches(&self) -> bool {
        true
    }

    fn runs_user_in_engine(&self) -> bool {
        self.user_in_engine()
    }

    fn reprogrammed(&self) -> u64 {
        self.counters.reprogrammed
    }

    fn summary(&self) -> String {
        let s = &self.stats;
        let engine = self.engine.account(s.engine_retired, s.engine_runs);
        format!(
            "precise backend: {} instructions counted ({engine}; {} without their own single-step trap), {} interrupts/exceptions seen while stepping, {} HLT, {} RDPMC and {} TSC reads emulated ({} more in the engine from the host's TSC, {} from the model's), {} TSC deadline accesses completed, {} PMU MSR accesses, {} port accesses and {} LVTPC writes completed, {} branches recorded in the LBR stack, {} PEBS records written ({} not, the buffer full), stepping switched {} times, {} counters reprogrammed",
            s.retired,
            s.lost_traps,
            s.events,
            s.hlt,
            s.rdpmc,
            s.tsc_reads,
            s.engine_tsc_reads,
            s.engine_model_tsc_reads,
            s.tsc_deadlines,
            s.pmu_msrs,
            s.ports,
            s.lvtpc_writes,
            self.branches.lbr_recorded,
            self.ds.pebs_records,
            self.ds.pebs_full,
            s.arm_changes,
            self.counters.reprogrammed
        ) + &if self.runs_free_in_engine() {
            format!(
                "; with nothing counting, {} CPL0 instructions ran in the TCG engine and {} handed over (stepped in KVM or completed by emon), {} user-mode instructions and {} returns to user mode in the engine; {} SYSCALLs and {} INT n from user mode completed",
                s.free_engine, s.free_stepped, s.free_user, s.free_returns, s.syscalls, s.soft_interrupts
            )
        } else {
            String::new()
        } + &if s.single_step_traps + s.breakpoints_fired > 0 {
            format!(
                "; the guest's own #DBs raised by emon: {} single-step traps in user mode, {} breakpoints met",
                s.single_step_traps, s.breakpoints_fired
            )
        } else {
            String::new()
        } + &if s.event_checks > 0 {
            format!(
                "; {} interrupts and NMIs taken in user mode (KVM asked {} times at user-mode boundaries)",
                s.user_events, s.event_checks
            )
        } else {
            String::new()
        }
    }

    fn notes(&self) -> Vec<String> {
        let mut notes = self.engine.notes();
        notes.extend(self.counters.notes());
        notes.extend(self.clock.notes());
        if self.guest_time == GuestTime::Model {
            notes.push(if self.clock.throughout() {
                "guest time: the guest's TSC and TSC-deadline timer followed the model clock throughout (--guest-time model): the PIT, the RTC and the local APIC timer's other modes kept real time (README, \"Guest time\")".into()
            } else {
                "guest time: --guest-time model: KVM runs some of the guest's code itself on this host, so the guest's TSC followed the model clock only where something counted (README, \"Guest time\")".into()
            });
        }
        if self.stats.tsc_unseen > 0 {
            notes.push(format!(
                "NOT EXACT: guest time: {} TSC reads in counted code ran in KVM without their own single-step trap and read the host's time, not the model's (README, \"Guest time\")",
                self.stats.tsc_unseen
            ));
        }
        notes.extend(self.feed.notes());
        notes.extend(self.branches.notes());
        notes.extend(self.ds.notes());
        if !self.stats.user_to_kvm.is_empty() {
            let n: u64 = self.stats.user_to_kvm.values().sum();
            let which: Vec<String> = self.stats.user_to_kvm.iter().map(|(m, n)| format!("{m} x{n}")).collect();
            notes.push(format!(
                "NOT EXACT: {n} user-mode instructions went to KVM, which cannot single-step user mode on this host, and what KVM ran of user code then was not counted ({}; README, \"User mode (CPL3)\")",
                which.join(", ")
            ));
        }
        if self.stats.debugged_in_kvm > 0 {
            notes.push(format!(
                "NOT AS ON SILICON: the guest single-stepped its own kernel code (RFLAGS.TF at CPL0) {} times; KVM runs it then, and on this host KVM neither single-steps user mode nor makes breakpoints fire there, and a SYSCALL there does not enter the kernel (README, \"User mode (CPL3)\")",
                self.stats.debugged_in_kvm
            ));
        }
        if !self.stats.breakpoints_unchecked.is_empty() {
            let n: u64 = self.stats.breakpoints_unchecked.values().sum();
            let which: Vec<String> =
                self.stats.breakpoints_unchecked.iter().map(|(m, n)| format!("{m} x{n}")).collect();
            notes.push(format!(
                "NOT AS ON SILICON: {n} instructions ran with the guest's data breakpoints armed whose accesses emon cannot list before they run ({}); a data breakpoint they met did not fire (README, \"The guest's own debugging\")",
                which.join(", ")
            ));
        }
        if self.stats.cpl3_lost > 0 {
            notes.push(format!(
                "NOT EXACT: user-mode (CPL3) code could not be single-stepped on this host ({} times it ran unseen); its instructions are not counted, nor its branches recorded",
                self.stats.cpl3_lost
            ));
        }
        notes
    }
}
