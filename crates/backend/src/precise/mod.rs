//! The precise backend: exact, deterministic counts by single-stepping the guest.
//!
//! While at least one counter is counting, every KVM_RUN executes one guest instruction
//! (KVM_GUESTDBG_SINGLESTEP) and ends in a debug exit; each exit is one retired instruction,
//! which is decoded (iced-x86) and attributed to the counters that were counting when it began.
//! An interrupt or exception delivered before a step shows up as a RIP that does not follow
//! from the instruction at the previous one: the handler's first instruction is what retired.
//! HLT (which KVM steps over) and RDPMC (which has no userspace exit) are emulated. When no
//! counter is counting the guest runs free.
pub mod cache;
mod debug_store;
pub mod events;
#[cfg(feature = "tcg")]
pub mod tcg;
#[cfg(test)]
mod tests;

use crate::vcpu::IA32_TSC_DEADLINE;
use crate::{marked, Backend, BackendError, Cx, Next};
use cache::{CacheEvents, CacheModel};
use emon_pmu::pmu::lbr::{Branch, BranchType};
use emon_pmu::pmu::{CounterId, Reprogram};
use emon_pmu::profile::{Cache, Clock, MAX_FIXED, MAX_GP, MIN_CACHE_LINE};
use emon_x86::access::{self, Access, AccessKind};
use emon_x86::insn::{self, Flow, Insn, Special, Transfer};
use emon_x86::mode::CpuMode;
use events::{cycles, mispredicted, Armed};
use std::collections::HashMap;
use std::sync::Arc;

/// An instruction that has started (the vCPU was entered at its RIP) but not yet retired.
#[derive(Debug, Clone)]
struct Pending {
    rip: u64,
    cpl: u8,
    /// The counters that were counting when it began.
    armed: Arc<[Armed]>,
    /// The vCPU cannot retire the instruction at `rip` before an event is delivered (it is
    /// halted, or an exception was injected).
    expect_event: bool,
    /// For an IRET: where it returns (read from the frame before it ran).
    iret_target: Option<u64>,
    /// For an IRET: it returns to user mode (the frame's CS.RPL is 3).
    iret_to_user: bool,
    /// Its data accesses, from the registers before it ran, while the cache model counts
    /// (`None`: emon cannot know them before it runs, such as a REP string instruction's).
    accesses: Option<Vec<Access>>,
}

/// #GP, the general-protection exception (SDM Vol. 3A 6.15).
const GP_VECTOR: u8 = 13;
/// #DB, the debug exception: where a single-step trap goes when the VMM does not get it.
const DB_VECTOR: u8 = 1;
/// CR4.TSD: RDTSC and RDTSCP fault above CPL0 (SDM Vol. 3A 2.5).
const CR4_TSD: u64 = 1 << 2;
/// IA32_TSC and IA32_TSC_AUX (SDM Vol. 4, Table 2-2).
const IA32_TSC: u64 = 0x10;
const IA32_TSC_AUX: u32 = 0xC000_0103;
/// How long emon waits, at the end of a counted stretch, for real time to catch up with a guest
/// TSC the model ran ahead (README, "Guest time").
const TSC_CATCH_UP_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Decoded instructions kept at most (about 3 MiB).
const MAX_CACHED_INSNS: usize = 65_536;

/// At most this many instructions retire in one step whose traps were lost.
const MAX_LOST_TRAPS: usize = 64;

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

/// The TCG engine, made on the vCPU thread the first time it runs.
#[cfg(feature = "tcg")]
#[derive(Default)]
struct TcgSlot {
    engine: Option<tcg::Tcg>,
    /// Boundaries to step in KVM before trying the engine again.
    cooldown: u32,
    /// The engine's last run ended in user mode and the vCPU has not run since: the engine
    /// holds the CPL3 state and can go on from it.
    at_cpl3: bool,
}

// SAFETY: the engine (which holds unicorn's non-thread-safe handle) is created in `before_run`,
// on the vCPU thread, and used only there; a `Precise` is moved to that thread before it has one.
#[cfg(feature = "tcg")]
unsafe impl Send for TcgSlot {}

/// Steps after an engine run that retired little (or nothing) before the engine is tried again.
#[cfg(feature = "tcg")]
const TCG_COOLDOWN: u32 = 16;

/// What the backend did, for the run summary.
#[derive(Debug, Default, Clone, Copy)]
pub struct Stats {
    pub steps: u64,
    pub retired: u64,
    pub events: u64,
    pub hlt: u64,
    pub rdpmc: u64,
    pub arm_changes: u64,
    /// Counters reprogrammed after guest writes marked them (one per counter per change).
    pub reprogrammed: u64,
    /// Instructions that retired without their own single-step trap.
    pub lost_traps: u64,
    /// Single-steps of user-mode (CPL3) code that did not come back to the VMM.
    pub cpl3_lost: u64,
    /// TCG engine runs, and the instructions they retired.
    pub engine_runs: u64,
    pub engine_retired: u64,
    /// RDMSR/WRMSR of IA32_TSC_DEADLINE translated between the model's and KVM's guest TSC.
    tsc_deadlines: u64,
    /// RDTSC, RDTSCP and RDMSR(IA32_TSC) answered from the modelled guest time.
    pub tsc_reads: u64,
    /// RDTSC, RDTSCP or RDMSR that retired in counted code without their own single-step trap,
    /// so in KVM, reading real time (README, "Guest time").
    pub tsc_unseen: u64,
    /// Instructions that retired while the cache model counted whose data accesses emon could
    /// not know (README, "The cache model").
    pub cache_unseen: u64,
    /// Taken branches (interrupts and exceptions included) the LBR stack recorded.
    pub lbr_recorded: u64,
    /// Entries to the guest while MSR_LBR_SELECT asked for the call-stack mode, which emon does
    /// not model: the stack then records as if it were off.
    pub lbr_call_stack: u64,
    /// PEBS assists: records written; none written because the buffer was at its absolute
    /// maximum; none because the DS area or the buffer was not mapped; and records whose
    /// registers are those after later instructions that retired without their own trap.
    pub pebs_records: u64,
    pub pebs_full: u64,
    pub pebs_lost: u64,
    pub pebs_inexact: u64,
    /// BTS records written, and branches not stored because the DS area or the buffer was not mapped.
    pub bts_records: u64,
    pub bts_lost: u64,
}

/// The guest's time-stamp counter while emon counts (README, "Guest time"): it runs with the
/// model clock, one tick per modelled core cycle, plus real time while the vCPU is halted.
#[derive(Debug, Default, Clone)]
struct GuestTime {
    /// The counted stretch under way: the guest's TSC and the model clock when it began, and
    /// the real ticks the vCPU has spent halted since.
    stretch: Option<(u64, u64, u64)>,
    /// The guest's (real) TSC when the vCPU halted, until it wakes.
    halted_at: Option<u64>,
    /// This host has shown that it cannot set the guest's TSC.
    unsettable: bool,
    /// The last IA32_TSC_DEADLINE emon translated: as the guest wrote it, and as KVM holds it.
    deadline: Option<(u64, u64)>,
    /// On a host that cannot: the stretches after which the guest's TSC jumped forward to real
    /// time, the ticks it jumped in all, and the ticks real time never caught up (backwards).
    jumps: u64,
    forward: u64,
    backward: u64,
}

/// The edge-detect slot of counter `id`.
fn slot(id: CounterId) -> usize {
    let s = match id {
        CounterId::Gp(n) | CounterId::NetBurst(n) => usize::from(n),
        CounterId::Fixed(n) => GP_SLOTS + usize::from(n),
    };
    s.min(SLOTS - 1)
}

/// NetBurst events without a model named in the run summary, at most.
const MAX_UNSUPPORTED_NOTED: usize = 8;

/// Edge-detect slots: GP counters, then fixed counters; NetBurst counters by index.
const GP_SLOTS: usize = MAX_GP as usize;
const SLOTS: usize = {
    let arch = GP_SLOTS + MAX_FIXED as usize;
    let netburst = emon_pmu::pmu::netburst::COUNTERS as usize;
    if arch > netburst {
        arch
    } else {
        netburst
    }
};

pub struct Precise {
    stepping: bool,
    /// RIP at the current instruction boundary, when known without a register read.
    rip: Option<u64>,
    /// Cached CPU mode; `None` after anything that may change it.
    mode: Option<CpuMode>,
    /// The counting counters, in IA32_PERF_GLOBAL_CTRL bit order.
    armed: Arc<[Armed]>,
    pending: Option<Pending>,
    /// Set when HLT was emulated: the next retired instruction is an event handler's.
    halted: bool,
    /// The VMM queued a PMI in KVM (see [`Backend::event_queued`]): the next counted
    /// instruction is stepped in KVM, which delivers the PMI first if the guest can take it.
    event_queued: bool,
    /// CMASK condition of the previous counted instruction, per counter (edge detect).
    edges: [bool; SLOTS],
    cache: HashMap<u64, Option<Insn>>,
    cache_cr3: u64,
    engine: Engine,
    /// The reference clock of UnHalted Reference Cycles, and the model clock: the core cycles
    /// of every instruction counted since the VM started.
    ref_clock: Clock,
    cycles: u64,
    time: GuestTime,
    /// The guest's TSC follows the model while emon counts (README, "Guest time"); off only for
    /// `emon bench`, which times the backend itself with the guest's RDTSC.
    virtual_time: bool,
    /// The cache model, which sees every data access while an LLC event counts (lent to the
    /// TCG engine during its runs), and the geometry it was made from.
    data_cache: Option<CacheModel>,
    cache_geometry: Cache,
    cache_on: bool,
    /// The cache events of the instruction about to retire.
    retiring: CacheEvents,
    /// Why the TCG engine was given up for stepping, if it was.
    engine_failed: Option<String>,
    /// The LBR stack records (DEBUGCTL.LBR, not frozen): every taken branch goes to the model,
    /// so the guest is single-stepped whether a counter counts or not (README, "Model-specific
    /// PMU MSRs").
    lbr_on: bool,
    /// The BTS buffer takes branch records (DEBUGCTL.TR and BTS): stepped likewise.
    bts_on: bool,
    /// The model clock when the stack last recorded a branch (LBR_INFO's cycle count).
    lbr_cycles: u64,
    /// NetBurst events a counter counted that emon does not derive (they count 0): ESCR and
    /// event select, at most [`MAX_UNSUPPORTED_NOTED`] of them.
    netburst_unsupported: std::collections::BTreeSet<(u32, u8)>,
    #[cfg(feature = "tcg")]
    tcg: TcgSlot,
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
            stepping: false,
            rip: None,
            mode: None,
            armed: Arc::from(Vec::new()),
            pending: None,
            halted: false,
            event_queued: false,
            edges: [false; SLOTS],
            cache: HashMap::new(),
            cache_cr3: 0,
            engine: if cfg!(feature = "tcg") { engine } else { Engine::Step },
            ref_clock: Clock::TSC,
            cycles: 0,
            time: GuestTime::default(),
            virtual_time: true,
            data_cache: None,
            cache_geometry: Cache::default(),
            cache_on: false,
            retiring: CacheEvents::default(),
            engine_failed: (engine == Engine::Tcg && !cfg!(feature = "tcg"))
                .then(|| "this emon was built without the tcg feature".to_string()),
            lbr_on: false,
            bts_on: false,
            lbr_cycles: 0,
            netburst_unsupported: Default::default(),
            #[cfg(feature = "tcg")]
            tcg: TcgSlot::default(),
            stats: Stats::default(),
        }
    }

    /// The engine that runs counted code.
    pub fn engine(&self) -> Engine {
        self.engine
    }

    /// Counts UnHalted Reference Cycles on GP counters by `clock` (the profile's `[clock]`).
    pub fn with_ref_clock(mut self, clock: Clock) -> Precise {
        self.ref_clock = clock;
        self
    }

    /// Leaves the guest's TSC at real time while counting: for `emon bench`, which measures the
    /// backend's speed with the guest's RDTSC.
    pub fn with_real_time(mut self) -> Precise {
        self.virtual_time = false;
        self
    }

    /// The cache model, made (empty) when first needed.
    fn cache_model(&mut self) -> &mut CacheModel {
        self.data_cache.get_or_insert_with(|| CacheModel::new(&self.cache_geometry))
    }

    /// Models the profile's data caches (its `[cache]`) for the LLC events.
    pub fn with_cache(mut self, cache: &Cache) -> Precise {
        self.cache_geometry = *cache;
        self.data_cache = None;
        self
    }

    /// The guest's TSC as the model has it: where the counted stretch began, plus the model
    /// clock since, plus real time halted.
    fn virtual_tsc(&self) -> Option<u64> {
        self.time.stretch.map(|(tsc, cycles, halted)| tsc.wrapping_add(self.cycles - cycles).wrapping_add(halted))
    }

    /// A counted stretch begins: the guest's TSC follows the model from here.
    fn begin_stretch(&mut self, cx: &mut Cx) -> Result<(), BackendError> {
        self.time.stretch = Some((cx.vcpu.guest_tsc()?, self.cycles, 0));
        Ok(())
    }

    /// The vCPU wakes from an emulated HLT: the time it slept passes on the guest's TSC.
    fn wake(&mut self, cx: &mut Cx) -> Result<(), BackendError> {
        if let Some(at) = self.time.halted_at.take() {
            let slept = cx.vcpu.guest_tsc()?.saturating_sub(at);
            if let Some((_, _, halted)) = &mut self.time.stretch {
                *halted += slept;
            }
        }
        Ok(())
    }

    /// The counted stretch ends: the guest's TSC goes on from the model's value with real time.
    /// A host that cannot set it (kvm_pvm) leaves it at real time: emon waits for real time to
    /// reach the model's value if the model ran ahead (so it never goes backwards), and records
    /// the forward jump otherwise.
    fn end_stretch(&mut self, cx: &mut Cx) -> Result<(), BackendError> {
        self.wake(cx)?;
        let Some(target) = self.virtual_tsc() else { return Ok(()) };
        self.time.stretch = None;
        if !self.time.unsettable {
            if cx.vcpu.set_guest_tsc(target)? {
                return Ok(());
            }
            self.time.unsettable = true;
        }
        let mut now = cx.vcpu.guest_tsc()?;
        if now < target {
            now = cx.vcpu.wait_for_guest_tsc(target, TSC_CATCH_UP_LIMIT)?;
        }
        if now < target {
            self.time.backward += target - now;
        } else {
            self.time.forward += now - target;
        }
        self.time.jumps += 1;
        Ok(())
    }

    /// Runs counted code in the TCG engine from the boundary at `rip`, when it may (see
    /// [`tcg`]): `Some(Next::Retired)` if it retired anything, `None` to single-step instead.
    #[cfg(feature = "tcg")]
    fn fast_forward(&mut self, cx: &mut Cx, rip: u64, mode: &CpuMode) -> Result<Option<Next>, BackendError> {
        // The engine counts but does not report branches or registers per instruction: while the
        // LBR stack records or a counter is PEBS-enabled, every instruction is stepped.
        let pebs = cx.pmu.pebs_on() && cx.pmu.pebs_enable() != 0;
        if self.engine != Engine::Tcg
            || mode.bitness != 64
            || self.armed.iter().any(|a| a.cmask != 0)
            || self.lbr_on
            || self.bts_on
            || pebs
        {
            return Ok(None);
        }
        // User mode runs in the engine only where the engine entered it (through an IRETQ):
        // unicorn's API cannot load CPL3 state (it refuses an SS with RPL 3 at CPL0).
        let resume = mode.cpl == 3;
        if resume && !self.tcg.at_cpl3 {
            return Ok(None);
        }
        let bytes = mode.fetch(cx.vcpu.memory(), rip);
        let first = iced_x86::Decoder::with_ip(64, &bytes, rip, iced_x86::DecoderOptions::NONE).decode();
        let iret = first.code() == iced_x86::Code::Iretq;
        if self.tcg.cooldown > 0 && !resume && !iret {
            self.tcg.cooldown -= 1;
            return Ok(None);
        }
        // Not worth entering the engine for an instruction it would hand back at once.
        if !tcg::runs_in_engine(&first, &mut iced_x86::InstructionInfoFactory::new()) {
            return Ok(if resume { self.user_mode_handover(cx, &first)? } else { None });
        }
        if self.tcg.engine.is_none() {
            match tcg::Tcg::new(cx.vcpu.memory()) {
                Ok(e) => self.tcg.engine = Some(e),
                Err(e) => return Ok(self.give_up_engine(e.to_string())),
            }
        }
        let cache = if self.cache_on {
            self.cache_model();
            self.data_cache.take()
        } else {
            None
        };
        let engine = self.tcg.engine.as_mut().expect("made above");
        let regs = cx.vcpu.regs()?;
        let mut sregs = cx.vcpu.sregs()?;
        let armed: Vec<(Armed, u64)> = self.armed.iter().map(|a| (*a, cx.pmu.distance_to_overflow(a.id))).collect();
        let clock = tcg::ModelClock { cycles: self.cycles, reference: self.ref_clock };

        let counting = tcg::Counting { armed: &armed, clock, budget: tcg::BUDGET, cache };
        let mut run = match engine.run(&regs, &sregs, *mode, counting, resume) {
            Ok(run) => run,
            Err(e) => return Ok(self.give_up_engine(e.to_string())),
        };
        if let Some(cache) = run.cache.take() {
            self.data_cache = Some(cache);
        }
        self.stats.engine_runs += 1;
        tracing::trace!(
            rip = format_args!("{rip:#x}"),
            cpl = mode.cpl,
            stop = ?run.stop,
            retired = run.retired,
            to = format_args!("{:#x}", run.regs.rip),
            "TCG engine run"
        );
        // KVM runs at least the next kernel instruction: it delivers interrupts and runs what the
        // engine handed over. (At CPL3 the engine goes on: KVM cannot step user mode here.)
        self.tcg.cooldown = if run.retired < 64 { TCG_COOLDOWN } else { 1 };
        self.tcg.at_cpl3 = run.cpl == 3;
        if run.retired == 0 {
            return Ok(if resume { self.user_mode_handover(cx, &first)? } else { None });
        }
        for ((a, _), n) in armed.iter().zip(&run.counts) {
            // At CPL0 the engine stops short of every overflow, and the overflowing instruction
            // is stepped; at CPL3 it stops right after it (`Stop::Overflowed`).
            if *n > 0 && cx.pmu.add_events(a.id, *n) && run.stop != tcg::Stop::Overflowed {
                tracing::error!("{}: the TCG engine crossed an overflow", a.id);
            }
        }
        self.stats.retired += run.retired;
        self.stats.engine_retired += run.retired;
        self.cycles += run.cycles;
        cx.vcpu.set_regs(&run.regs)?;
        if let Some((sel, fs_base, gs_base)) = run.segments {
            // An IRETQ ran in the engine: the segments it loaded go to the vCPU, and NMI
            // blocking ends as the IRETQ ends it.
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
            self.mode = None;
        }
        self.rip = Some(run.regs.rip);
        if run.stop == tcg::Stop::Overflowed && cx.pmu.pmi_pending() {
            // The PMI goes out before the next entry; the vCPU takes it first thing.
            self.halted = true;
        }
        Ok(Some(Next::Retired))
    }

    /// User mode in the engine reached an instruction the engine does not run. Privileged ones
    /// raise #GP(0) at CPL3 (SDM Vol. 3A 5.9): emon delivers it, and the vCPU enters the kernel's
    /// handler, which it can step. RDPMC is emulated as when stepping. Anything else is stepped,
    /// which this host may not do (the run then says NOT EXACT).
    #[cfg(feature = "tcg")]
    fn user_mode_handover(&mut self, cx: &mut Cx, i: &iced_x86::Instruction) -> Result<Option<Next>, BackendError> {
        use iced_x86::Mnemonic::*;
        let iopl = (cx.vcpu.regs()?.rflags >> 12) & 3;
        let privileged = i.is_privileged()
            || matches!(i.mnemonic(), Hlt | Rdmsr | Wrmsr)
            || (iopl < 3 && matches!(i.mnemonic(), Cli | Sti | In | Out | Insb | Insw | Insd | Outsb | Outsw | Outsd));
        if privileged {
            cx.vcpu.inject_exception(GP_VECTOR, Some(0))?;
            self.halted = true;
            self.tcg.at_cpl3 = false;
            return Ok(Some(Next::Retired));
        }
        // Emulated without KVM (see `arm`): the engine goes on after them.
        if !matches!(i.mnemonic(), Rdpmc | Rdtsc | Rdtscp) {
            self.tcg.at_cpl3 = false;
        }
        Ok(None)
    }

    #[cfg(not(feature = "tcg"))]
    fn fast_forward(&mut self, _cx: &mut Cx, _rip: u64, _mode: &CpuMode) -> Result<Option<Next>, BackendError> {
        Ok(None)
    }

    /// The engine failed: every count from here on comes from single-stepping, and the run
    /// summary says why.
    #[cfg(feature = "tcg")]
    fn give_up_engine(&mut self, why: String) -> Option<Next> {
        tracing::warn!("{why}; single-stepping instead");
        self.engine_failed = Some(why);
        self.engine = Engine::Step;
        None
    }

    fn set_stepping(&mut self, cx: &mut Cx, on: bool) -> Result<(), BackendError> {
        // `emon bench` keeps real time (`with_real_time`).
        if self.virtual_time {
            if on {
                self.begin_stretch(cx)?;
            } else {
                self.end_stretch(cx)?;
            }
        }
        cx.vcpu.set_single_step(on)?;
        self.stepping = on;
        self.stats.arm_changes += 1;
        if on {
            self.mode = None;
            self.rip = None;
        }
        Ok(())
    }

    /// Reprograms the counters the model marked: each one leaves the armed set, and comes back
    /// with its new configuration if it counts. A counter the pending instruction wrote does not
    /// count that instruction (a WRMSR to a counter is not counted by it).
    fn reprogram(&mut self, cx: &Cx, r: Reprogram) {
        if r.counters == 0 {
            return;
        }
        let mut armed: Vec<Armed> =
            self.armed.iter().filter(|a| r.counters & a.id.status_mask() == 0).copied().collect();
        for id in marked(cx.pmu, r) {
            self.stats.reprogrammed += 1;
            // A reprogrammed counter's edge detect starts afresh: no condition held before it.
            self.edges[slot(id)] = false;
            let c = cx.pmu.counter(id);
            if c.counting {
                let a = Armed::new(&c);
                if let (events::Model::Unsupported, Some(s)) = (a.model, c.netburst) {
                    if self.netburst_unsupported.len() < MAX_UNSUPPORTED_NOTED {
                        self.netburst_unsupported.insert((s.escr, s.event));
                    }
                }
                armed.push(a);
            }
        }
        armed.sort_by_key(|a| a.id.status_bit());
        // emon sees no access made while no LLC event counts, so the caches start empty each time
        // one starts to (README, "The cache model").
        let cache_on = armed.iter().any(|a| a.model.uses_cache());
        if cache_on && !self.cache_on {
            self.cache_model().flush_all();
        }
        self.cache_on = cache_on;
        self.armed = armed.into();
        if let Some(p) = &mut self.pending {
            if p.armed.iter().any(|a| r.written & a.id.status_mask() != 0) {
                p.armed =
                    p.armed.iter().filter(|a| r.written & a.id.status_mask() == 0).copied().collect::<Vec<_>>().into();
            }
        }
    }

    fn mode(&mut self, cx: &mut Cx) -> Result<CpuMode, BackendError> {
        if let Some(m) = self.mode {
            return Ok(m);
        }
        let m = cx.vcpu.mode()?;
        if m.cr3 != self.cache_cr3 {
            self.cache.clear();
            self.cache_cr3 = m.cr3;
        }
        self.mode = Some(m);
        Ok(m)
    }

    fn rip(&mut self, cx: &mut Cx) -> Result<u64, BackendError> {
        match self.rip {
            Some(r) => Ok(r),
            None => {
                let r = cx.vcpu.regs()?.rip;
                self.rip = Some(r);
                Ok(r)
            }
        }
    }

    /// The instruction at linear address `rip` (decoded once per address and CR3; the cache is
    /// bounded so that a guest cannot grow emon's memory by executing at many addresses).
    fn decode(&mut self, cx: &Cx, mode: &CpuMode, rip: u64) -> Option<Insn> {
        if let Some(i) = self.cache.get(&rip) {
            return *i;
        }
        if self.cache.len() >= MAX_CACHED_INSNS {
            self.cache.clear();
        }
        let i = insn::decode(&mode.fetch(cx.vcpu.memory(), rip), rip, mode.bitness);
        self.cache.insert(rip, i);
        i
    }

    /// Attributes one retired instruction to the counters in `armed`, and runs the model clock.
    fn retire(&mut self, cx: &mut Cx, armed: &[Armed], i: &Insn, rip: u64, cpl: u8, taken: bool) {
        self.stats.retired += 1;
        let cache = std::mem::take(&mut self.retiring);
        let c = cycles(i, taken);
        let ticks = self.ref_clock.ref_ticks_between(self.cycles, c);
        self.cycles += c;
        for a in armed {
            let n = a.model.increment(i, rip, taken) + a.model.dynamic(ticks, cache);
            let inc = a.advance(n, cpl, &mut self.edges[slot(a.id)]);
            if inc > 0 {
                cx.pmu.add_events(a.id, inc);
            }
        }
    }

    /// Gives the LBR stack and the BTS buffer the branch `i` at `rip`, taken at CPL `from_cpl`,
    /// made if it was taken to `to`, ending at CPL `cpl` (SDM 17.4.8, 17.4.9).
    fn record_branch(
        &mut self,
        cx: &mut Cx,
        i: &Insn,
        rip: u64,
        to: u64,
        from_cpl: u8,
        cpl: u8,
    ) -> Result<(), BackendError> {
        let on = self.lbr_on || self.bts_on;
        let Some(transfer) = i.transfer.filter(|_| on && taken(i, rip, to)) else { return Ok(()) };
        let kind = match transfer {
            Transfer::Conditional => BranchType::Jcc,
            Transfer::RelCall => BranchType::NearRelCall,
            Transfer::IndCall => BranchType::NearIndCall,
            Transfer::Ret => BranchType::NearRet,
            Transfer::RelJmp => BranchType::NearRelJmp,
            Transfer::IndJmp => BranchType::NearIndJmp,
            Transfer::Far => BranchType::Far,
        };
        let mispredicted = mispredicted(i, rip, true);
        self.take_branch(cx, Branch { from: rip, to, kind, cpl, mispredicted, cycles: 0, event: false }, from_cpl)
    }

    /// Records `b`, taken at CPL `from_cpl`: in the LBR stack with the cycles since the stack's
    /// last record, and in the BTS buffer.
    fn take_branch(&mut self, cx: &mut Cx, b: Branch, from_cpl: u8) -> Result<(), BackendError> {
        if self.lbr_on {
            let b = Branch { cycles: self.cycles - self.lbr_cycles, ..b };
            if cx.pmu.record_branch(&b) {
                self.lbr_cycles = self.cycles;
                self.stats.lbr_recorded += 1;
            }
        }
        if self.bts_on && cx.pmu.bts_records(from_cpl) {
            self.bts_store(cx, b.from, b.to, !b.mispredicted)?;
        }
        Ok(())
    }

    /// The handler whose first instruction, retired, leaves the vCPU at `pc`: the event that
    /// was delivered before the pending instruction.
    fn event_handler(&mut self, cx: &Cx, mode: &CpuMode, pc: u64) -> Option<(u8, u64, Insn)> {
        let mut branch_match = None;
        for v in 0..=255u8 {
            let Some(h) = mode.idt_handler(cx.vcpu.memory(), v) else { continue };
            let Some(i) = self.decode(cx, mode, h) else { continue };
            if h + i.len as u64 == pc && matches!(i.flow, Flow::Next) {
                return Some((v, h, i));
            }
            if branch_match.is_none() && follows(&i, h, pc) {
                branch_match = Some((v, h, i));
            }
        }
        branch_match
    }

    /// The RIP an IRET at the current boundary returns to: the first slot of its frame.
    /// The RIP an IRET at the current boundary returns to, and whether it returns to user mode:
    /// the first two slots of its frame (RIP, CS).
    fn iret_target(&mut self, cx: &mut Cx, mode: &CpuMode) -> Result<Option<(u64, bool)>, BackendError> {
        let rsp = cx.vcpu.regs()?.rsp;
        let width = if mode.bitness == 64 { 8 } else { 4 };
        let slot = |k: u64| -> Option<u64> {
            let pa = mode.translate(cx.vcpu.memory(), rsp + k * width as u64)?;
            let mut b = [0u8; 8];
            vm_memory::Bytes::read_slice(cx.vcpu.memory(), &mut b[..width], vm_memory::GuestAddress(pa)).ok()?;
            Some(u64::from_le_bytes(b))
        };
        Ok(slot(0).map(|rip| (rip, slot(1).is_some_and(|cs| cs & 3 == 3))))
    }

    /// The instructions that retired from `from` up to `pc` along straight-line code (the
    /// last one may be a direct branch to `pc`): what a step retired beyond its first
    /// instruction when the host lost single-step traps (after port I/O completes, and after
    /// IRET, whose restored TF traps one instruction late).
    fn walk(&mut self, cx: &Cx, mode: &CpuMode, from: u64, pc: u64) -> Option<Vec<(u64, Insn)>> {
        let mut out = Vec::new();
        let mut a = from;
        while out.len() <= MAX_LOST_TRAPS {
            if a == pc {
                return Some(out);
            }
            let i = self.decode(cx, mode, a)?;
            out.push((a, i));
            match i.flow {
                Flow::Next => a += i.len as u64,
                Flow::Direct { target, .. } if target == pc || a + i.len as u64 == pc => return Some(out),
                _ => return None,
            }
        }
        None
    }

    /// The data accesses of the instruction at `rip`, from the vCPU's registers now (before it
    /// runs); `None` if they cannot be known before it runs.
    fn accesses_at(&mut self, cx: &mut Cx, mode: &CpuMode, rip: u64) -> Result<Option<Vec<Access>>, BackendError> {
        let i = decode_full(cx, mode, rip);
        if !touches_memory(&i) {
            return Ok(Some(Vec::new()));
        }
        let regs = cx.vcpu.regs()?;
        let (fs, gs) = match i.memory_segment() {
            iced_x86::Register::FS | iced_x86::Register::GS => {
                let s = cx.vcpu.sregs()?;
                (s.fs.base, s.gs.base)
            }
            _ => (0, 0),
        };
        Ok(access::data_accesses(&i, |r| emon_x86::emulator::gpr(&regs, r), fs, gs).ok())
    }

    /// The pending instruction at `rip` retires: its data accesses (known from before it ran) go
    /// to the cache model, for the LLC events it counts.
    fn pending_accesses(&mut self, cx: &Cx, mode: &CpuMode, rip: u64, accesses: &Option<Vec<Access>>) {
        if !self.cache_on {
            return;
        }
        match accesses {
            Some(a) => self.retiring = feed_cache(self.cache_model(), mode, cx.vcpu.memory(), a),
            None => self.unseen_accesses(cx, mode, rip),
        }
    }

    /// The instruction at `rip` retired while the cache model counts, with data accesses emon
    /// did not see (it knew no registers from before it ran).
    fn unseen_accesses(&mut self, cx: &Cx, mode: &CpuMode, rip: u64) {
        if self.cache_on && touches_memory(&decode_full(cx, mode, rip)) {
            self.stats.cache_unseen += 1;
        }
    }

    /// An instruction emon emulated retires: its effect on the registers, `regs`, is written back
    /// with RIP past it.
    fn complete(
        &mut self,
        cx: &mut Cx,
        p: &Pending,
        i: &Insn,
        mut regs: kvm_bindings::kvm_regs,
    ) -> Result<Next, BackendError> {
        regs.rip = p.rip + i.len as u64;
        cx.vcpu.set_regs(&regs)?;
        self.retire(cx, &p.armed, i, p.rip, p.cpl, false);
        self.pebs_assist(cx, p.rip, true)?;
        self.rip = Some(regs.rip);
        Ok(Next::Retired)
    }

    /// The pending instruction raises #GP(0), as on hardware, and does not retire.
    fn raise_gp(&mut self, cx: &mut Cx, mut p: Pending) -> Result<Next, BackendError> {
        cx.vcpu.inject_exception(GP_VECTOR, Some(0))?;
        p.expect_event = true;
        self.pending = Some(p);
        Ok(Next::Run)
    }

    fn emulate_hlt(&mut self, cx: &mut Cx, p: Pending, i: &Insn) -> Result<Next, BackendError> {
        let regs = cx.vcpu.regs()?;
        self.complete(cx, &p, i, regs)?;
        cx.vcpu.halt()?;
        self.time.halted_at = Some(cx.vcpu.guest_tsc()?);
        self.halted = true;
        self.stats.hlt += 1;
        Ok(Next::Retired)
    }

    /// LFENCE, MFENCE or SFENCE: retires with no effect a lone vCPU could observe (see
    /// [`Special::Fence`]).
    fn emulate_fence(&mut self, cx: &mut Cx, p: Pending, i: &Insn) -> Result<Next, BackendError> {
        let regs = cx.vcpu.regs()?;
        self.complete(cx, &p, i, regs)
    }

    /// RDTSC, RDTSCP, and RDMSR of IA32_TSC (`rdmsr`): the guest's TSC as the model has it
    /// (README, "Guest time"). RDTSC and RDTSCP fault above CPL0 with CR4.TSD set.
    fn emulate_tsc_read(&mut self, cx: &mut Cx, p: Pending, i: &Insn, mode: &CpuMode) -> Result<Next, BackendError> {
        if p.cpl > 0 && i.special != Special::Rdmsr && mode.cr4 & CR4_TSD != 0 {
            return self.raise_gp(cx, p);
        }
        self.stats.tsc_reads += 1;
        let mut regs = cx.vcpu.regs()?;
        let tsc = match self.virtual_tsc() {
            Some(t) => t,
            None => cx.vcpu.guest_tsc()?,
        };
        regs.rax = tsc & 0xFFFF_FFFF;
        regs.rdx = tsc >> 32;
        if i.special == Special::Rdtscp {
            regs.rcx = cx.vcpu.get_msr(IA32_TSC_AUX)? & 0xFFFF_FFFF;
        }
        self.complete(cx, &p, i, regs)
    }

    /// RDMSR and WRMSR of IA32_TSC_DEADLINE while the guest's TSC follows the model: KVM's
    /// timer fires on KVM's guest TSC, so a deadline the guest computed from the model's TSC
    /// moves by the difference between the two (both ways), and the timer fires as far ahead
    /// as the guest asked. Without this, a guest that counts with the deadline timer armed sets
    /// deadlines already past on KVM's side: an interrupt storm. 0 disarms it either way.
    fn emulate_tsc_deadline(&mut self, cx: &mut Cx, p: Pending, i: &Insn) -> Result<Next, BackendError> {
        let virtual_now = self.virtual_tsc().expect("checked by the caller");
        let kvm_ahead = cx.vcpu.guest_tsc()?.wrapping_sub(virtual_now);
        let mut regs = cx.vcpu.regs()?;
        if i.special == Special::Wrmsr {
            let deadline = (regs.rdx << 32) | (regs.rax & 0xFFFF_FFFF);
            let on_kvm = if deadline == 0 { 0 } else { deadline.wrapping_add(kvm_ahead) };
            cx.vcpu.set_msr(IA32_TSC_DEADLINE, on_kvm)?;
            self.time.deadline = Some((deadline, on_kvm));
        } else {
            // The value written reads back until the timer fires (then 0), SDM Vol. 3A 10.5.4.1.
            let on_kvm = cx.vcpu.get_msr(IA32_TSC_DEADLINE)?;
            let deadline = match self.time.deadline {
                _ if on_kvm == 0 => 0,
                Some((written, set)) if set == on_kvm => written,
                _ => on_kvm.wrapping_sub(kvm_ahead),
            };
            regs.rax = deadline & 0xFFFF_FFFF;
            regs.rdx = deadline >> 32;
        }
        self.stats.tsc_deadlines += 1;
        self.complete(cx, &p, i, regs)
    }

    fn emulate_rdpmc(&mut self, cx: &mut Cx, p: Pending, i: &Insn, mode: &CpuMode) -> Result<Next, BackendError> {
        self.stats.rdpmc += 1;
        let mut regs = cx.vcpu.regs()?;
        match cx.pmu.rdpmc(regs.rcx as u32, p.cpl, mode.pce()) {
            Ok(v) => {
                regs.rax = v & 0xFFFF_FFFF;
                regs.rdx = v >> 32;
                self.complete(cx, &p, i, regs)
            }
            Err(_) => self.raise_gp(cx, p),
        }
    }
}

/// The whole instruction at `rip`, as iced-x86 decodes it (for its data accesses).
fn decode_full(cx: &Cx, mode: &CpuMode, rip: u64) -> iced_x86::Instruction {
    let bytes = mode.fetch(cx.vcpu.memory(), rip);
    iced_x86::Decoder::with_ip(mode.bitness, &bytes, rip, iced_x86::DecoderOptions::NONE).decode()
}

/// Whether `i` accesses data memory (or may: emon cannot tell before it runs).
fn touches_memory(i: &iced_x86::Instruction) -> bool {
    access::max_lines(i, MIN_CACHE_LINE) != Ok(0)
}

/// Feeds an instruction's data accesses to the cache model, translating each through the guest's
/// page tables (an access that crosses a page is one per page); what it did at the LLC.
pub(crate) fn feed_cache(
    cache: &mut CacheModel,
    mode: &CpuMode,
    mem: &vm_memory::GuestMemoryMmap,
    accesses: &[Access],
) -> CacheEvents {
    const PAGE: u64 = 4096;
    let mut events = CacheEvents::default();
    for a in accesses {
        if a.kind == AccessKind::Flush {
            if let Some(pa) = mode.translate(mem, a.linear) {
                cache.flush(pa);
            }
            continue;
        }
        let (mut la, end) = (a.linear, a.linear.saturating_add(u64::from(a.size)));
        while la < end {
            let piece = (PAGE - la % PAGE).min(end - la);
            // An access through no mapping faults, and its instruction does not retire.
            if let Some(pa) = mode.translate(mem, la) {
                events += cache.access(pa, piece as u32);
            }
            la += piece;
        }
    }
    events
}

/// Whether executing `i` at `rip` can leave the vCPU at `pc`.
fn follows(i: &Insn, rip: u64, pc: u64) -> bool {
    let next = rip + i.len as u64;
    match i.flow {
        Flow::Next => pc == next,
        Flow::Direct { target, .. } => pc == target || pc == next,
        Flow::Indirect | Flow::Other => true,
    }
}

/// Whether `i` at `rip`, having left the vCPU at `pc`, was a taken branch.
fn taken(i: &Insn, rip: u64, pc: u64) -> bool {
    match i.flow {
        Flow::Next => false,
        Flow::Direct { target, .. } => pc == target && target != rip + i.len as u64,
        Flow::Indirect => true,
        Flow::Other => pc != rip + i.len as u64,
    }
}

/// An instruction emon could not fetch or decode: it still counts as one instruction.
const UNKNOWN: Insn = Insn {
    len: 0,
    flow: Flow::Other,
    branch: false,
    mem_operands: 0,
    class_cycles: 0,
    special: Special::None,
    changes_mode: true,
    transfer: None,
};

impl Precise {
    /// Reprograms the marked counters and arms for the next entry (see [`Backend::before_run`]).
    fn arm(&mut self, cx: &mut Cx, at_boundary: bool) -> Result<Next, BackendError> {
        let r = cx.pmu.take_reprogram();
        self.reprogram(cx, r);
        self.lbr_on = cx.pmu.lbr_recording();
        self.bts_on = cx.pmu.bts_records(0) || cx.pmu.bts_records(3);
        if self.lbr_on && cx.pmu.lbr_call_stack() {
            self.stats.lbr_call_stack += 1;
        }
        let active = !self.armed.is_empty() || self.lbr_on || self.bts_on;
        if !at_boundary {
            // In the middle of an instruction (an MSR or I/O exit): start stepping as soon as a
            // counter goes live, but never stop before the instruction retires (the WRMSR that
            // disables a counter still counts).
            if active && !self.stepping {
                self.set_stepping(cx, true)?;
            }
            return Ok(Next::Run);
        }
        if !active {
            if self.stepping {
                self.set_stepping(cx, false)?;
            }
            self.pending = None;
            self.halted = false;
            self.event_queued = false;
            return Ok(Next::Run);
        }
        if !self.stepping {
            self.set_stepping(cx, true)?;
        }
        let rip = self.rip(cx)?;
        let mode = self.mode(cx)?;
        if !self.halted && !std::mem::take(&mut self.event_queued) {
            if let Some(next) = self.fast_forward(cx, rip, &mode)? {
                return Ok(next);
            }
        }
        let mut p = Pending {
            rip,
            cpl: mode.cpl,
            armed: self.armed.clone(),
            expect_event: std::mem::take(&mut self.halted),
            iret_target: None,
            iret_to_user: false,
            accesses: Some(Vec::new()),
        };
        if !p.expect_event {
            match self.decode(cx, &mode, rip) {
                Some(i) if i.special == Special::Hlt => return self.emulate_hlt(cx, p, &i),
                Some(i) if i.special == Special::Rdpmc => return self.emulate_rdpmc(cx, p, &i, &mode),
                Some(i) if matches!(i.special, Special::Rdtsc | Special::Rdtscp) && self.virtual_time => {
                    return self.emulate_tsc_read(cx, p, &i, &mode)
                }
                Some(i) if i.special == Special::Fence => return self.emulate_fence(cx, p, &i),
                // RDMSR and WRMSR at CPL0 (at CPL3 they are a #GP, which KVM raises).
                Some(i) if matches!(i.special, Special::Rdmsr | Special::Wrmsr) && p.cpl == 0 => {
                    let msr = cx.vcpu.regs()?.rcx & 0xFFFF_FFFF;
                    if i.special == Special::Rdmsr && self.virtual_time && msr == IA32_TSC {
                        return self.emulate_tsc_read(cx, p, &i, &mode);
                    }
                    // The deadline timer's MSR, on the model's side of the guest's time.
                    if msr == u64::from(IA32_TSC_DEADLINE) && self.virtual_tsc().is_some() {
                        return self.emulate_tsc_deadline(cx, p, &i);
                    }
                }
                Some(i) if i.special == Special::Iret => {
                    let target = self.iret_target(cx, &mode)?;
                    p.iret_target = target.map(|(rip, _)| rip);
                    p.iret_to_user = target.is_some_and(|(_, user)| user);
                }
                _ => {}
            }
            if self.cache_on {
                p.accesses = self.accesses_at(cx, &mode, rip)?;
            }
        }
        self.pending = Some(p);
        Ok(Next::Run)
    }

    /// A single-step exit at `pc` (see [`Backend::on_debug_exit`]).
    fn debug_exit(&mut self, cx: &mut Cx, pc: u64) -> Result<(), BackendError> {
        self.stats.steps += 1;
        let Some(p) = self.pending.take() else {
            tracing::trace!(pc = format_args!("{pc:#x}"), "step with nothing pending");
            // The first step after counting started mid-instruction: that instruction began
            // before any counter was counting.
            self.rip = Some(pc);
            return Ok(());
        };
        let mode = self.mode(cx)?;
        let at_rip = self.decode(cx, &mode, p.rip);
        let iret_elsewhere = |i: &Insn| i.special == Special::Iret && p.iret_target.is_some_and(|t| t != pc);
        if let Some(i) = at_rip.filter(|i| !p.expect_event && (!follows(i, p.rip, pc) || iret_elsewhere(i))) {
            // Traps lost: the pending instruction and a straight-line run after it retired.
            let landing = match i.special {
                Special::Iret => p.iret_target,
                _ if i.flow == Flow::Next => Some(p.rip + i.len as u64),
                _ => None,
            };
            if let Some(run) = landing.and_then(|l| self.walk(cx, &mode, l, pc)) {
                tracing::trace!(
                    pending = format_args!("{:#x}", p.rip),
                    pc = format_args!("{pc:#x}"),
                    extra = run.len(),
                    "lost traps"
                );
                let end = run.first().map_or(pc, |(a, _)| *a);
                self.pending_accesses(cx, &mode, p.rip, &p.accesses);
                self.retire(cx, &p.armed, &i, p.rip, p.cpl, taken(&i, p.rip, end));
                if i.changes_mode {
                    self.mode = None;
                }
                let cpl = self.mode(cx)?.cpl;
                self.record_branch(cx, &i, p.rip, end, p.cpl, cpl)?;
                self.pebs_assist(cx, p.rip, run.is_empty())?;
                for (n, (a, j)) in run.iter().enumerate() {
                    let next = run.get(n + 1).map_or(pc, |(b, _)| *b);
                    self.unseen_accesses(cx, &mode, *a);
                    if matches!(j.special, Special::Rdtsc | Special::Rdtscp | Special::Rdmsr) && self.virtual_time {
                        // It ran in KVM without its own trap: it read the host's time.
                        self.stats.tsc_unseen += 1;
                    }
                    self.retire(cx, &p.armed, j, *a, cpl, taken(j, *a, next));
                    self.record_branch(cx, j, *a, next, cpl, cpl)?;
                    self.pebs_assist(cx, *a, n + 1 == run.len())?;
                }
                self.stats.lost_traps += run.len() as u64;
                self.rip = Some(pc);
                return Ok(());
            }
            if i.special == Special::Iret && p.iret_to_user {
                // The IRET went to user mode and the step came back only somewhere the user code
                // led to: it ran unseen (README, "User mode (CPL3) on this host").
                self.stats.cpl3_lost += 1;
            }
        }
        let (i, rip, cpl) = match at_rip {
            Some(i) if !p.expect_event && follows(&i, p.rip, pc) => {
                self.pending_accesses(cx, &mode, p.rip, &p.accesses);
                (i, p.rip, p.cpl)
            }
            None if !p.expect_event => {
                self.unseen_accesses(cx, &mode, p.rip);
                (UNKNOWN, p.rip, p.cpl)
            }
            _ => {
                // An interrupt or exception was delivered first: its handler's first
                // instruction retired, at the handler's privilege level.
                self.stats.events += 1;
                self.wake(cx)?;
                self.mode = None;
                let mode = self.mode(cx)?;
                let handler = self.event_handler(cx, &mode, pc);
                // A user-mode instruction whose single-step trap went into the guest's own #DB
                // handler (or to no handler emon can find): this host cannot step CPL3 code, and
                // what it ran is not counted (README, "User mode (CPL3) on this host").
                if p.cpl == 3 && handler.as_ref().is_none_or(|(v, _, _)| *v == DB_VECTOR) {
                    self.stats.cpl3_lost += 1;
                }
                // The handler's first instruction ran with registers emon never saw.
                let first = handler.as_ref().map_or(pc, |(_, h, _)| *h);
                self.unseen_accesses(cx, &mode, first);
                // The delivery is a far branch from the interrupted instruction to the handler.
                if self.lbr_on || self.bts_on {
                    let b = Branch {
                        from: p.rip,
                        to: first,
                        kind: BranchType::Far,
                        cpl: mode.cpl,
                        mispredicted: false,
                        cycles: 0,
                        event: true,
                    };
                    self.take_branch(cx, b, p.cpl)?;
                }
                match handler {
                    Some((_, h, i)) => (i, h, mode.cpl),
                    None => (UNKNOWN, pc, mode.cpl),
                }
            }
        };
        tracing::trace!(
            pending = format_args!("{:#x}", p.rip),
            retired = format_args!("{rip:#x}"),
            pc = format_args!("{pc:#x}"),
            "step"
        );
        self.retire(cx, &p.armed, &i, rip, cpl, taken(&i, rip, pc));
        if i.changes_mode {
            self.mode = None;
        }
        if (self.lbr_on || self.bts_on) && i.transfer.is_some() {
            let to_cpl = self.mode(cx)?.cpl;
            self.record_branch(cx, &i, rip, pc, cpl, to_cpl)?;
        }
        self.pebs_assist(cx, rip, true)?;
        self.rip = Some(pc);
        Ok(())
    }
}

impl Backend for Precise {
    fn name(&self) -> &'static str {
        "precise"
    }

    fn before_run(&mut self, cx: &mut Cx, at_boundary: bool) -> Result<Next, BackendError> {
        let next = self.arm(cx, at_boundary)?;
        // The vCPU runs: whatever user-mode state the engine held is the vCPU's now.
        #[cfg(feature = "tcg")]
        if next == Next::Run {
            self.tcg.at_cpl3 = false;
        }
        Ok(next)
    }

    fn on_debug_exit(&mut self, cx: &mut Cx, pc: u64) -> Result<(), BackendError> {
        self.debug_exit(cx, pc)
    }

    fn event_queued(&mut self) {
        self.event_queued = true;
    }

    fn records_branches(&self) -> bool {
        true
    }

    fn writes_pebs(&self) -> bool {
        true
    }

    fn reprogrammed(&self) -> u64 {
        self.stats.reprogrammed
    }

    fn summary(&self) -> String {
        let s = &self.stats;
        let engine = match (self.engine, &self.engine_failed) {
            (Engine::Tcg, _) => format!("TCG engine: {} of them in {} runs", s.engine_retired, s.engine_runs),
            (Engine::Step, Some(why)) => {
                format!("single-stepped: {why} (TCG engine before that: {})", s.engine_retired)
            }
            (Engine::Step, None) => "single-stepped (--precise-engine step)".into(),
        };
        format!(
            "precise backend: {} instructions counted ({engine}; {} without their own single-step trap), {} interrupts/exceptions seen while stepping, {} HLT, {} RDPMC and {} TSC reads emulated, {} TSC deadline accesses translated, {} branches recorded in the LBR stack, {} PEBS records written ({} not, the buffer full), stepping switched {} times, {} counters reprogrammed",
            s.retired, s.lost_traps, s.events, s.hlt, s.rdpmc, s.tsc_reads, s.tsc_deadlines, s.lbr_recorded, s.pebs_records, s.pebs_full, s.arm_changes, s.reprogrammed
        )
    }

    fn notes(&self) -> Vec<String> {
        let mut notes = Vec::new();
        if let Some(why) = &self.engine_failed {
            notes.push(format!("counted by single-stepping only ({why})"));
        }
        if !self.netburst_unsupported.is_empty() {
            let events: Vec<String> = self
                .netburst_unsupported
                .iter()
                .map(|&(escr, event)| {
                    format!("{} event {event:#04x}", emon_pmu::pmu::netburst::msr_name(escr).unwrap_or("ESCR"))
                })
                .collect();
            notes.push(format!(
                "NOT EXACT: NetBurst counters counted events emon does not derive, and counted 0: {} (emon events --profile pentium4; README, \"The NetBurst PMU\")",
                events.join(", ")
            ));
        }
        let t = &self.time;
        if t.jumps > 0 {
            notes.push(format!(
                "guest time: this host cannot set the guest's TSC, so after each of {} counted stretches it went on from real time, {} ticks ahead of the model's TSC in all (README, \"Guest time\")",
                t.jumps, t.forward
            ));
        }
        if t.backward > 0 {
            notes.push(format!(
                "NOT EXACT: guest time went backwards by {} ticks when counting stopped: real time did not catch up with the model's TSC within {} s (README, \"Guest time\")",
                t.backward,
                TSC_CATCH_UP_LIMIT.as_secs()
            ));
        }
        if self.stats.tsc_unseen > 0 {
            notes.push(format!(
                "NOT EXACT: guest time: {} TSC reads in counted code ran in KVM without their own single-step trap and read the host's time, not the model's (README, \"Guest time\")",
                self.stats.tsc_unseen
            ));
        }
        if self.stats.cache_unseen > 0 {
            notes.push(format!(
                "NOT EXACT: LLC events: {} instructions retired while an LLC event counted whose data accesses emon could not see (an event handler's first instruction, an instruction without its own single-step trap, or a REP string instruction); the cache model missed them (README, \"The cache model\")",
                self.stats.cache_unseen
            ));
        }
        if self.stats.lbr_call_stack > 0 {
            notes.push(
                "NOT EXACT: the LBR stack was asked for its call-stack mode (MSR_LBR_SELECT.EN_CALLSTACK), which emon does not model; it recorded every branch the filter let through (README, \"Model-specific PMU MSRs\")".into(),
            );
        }
        if self.stats.pebs_lost > 0 {
            notes.push(format!(
                "NOT EXACT: PEBS: {} assists wrote no record: the DS area (the counter then reloaded 0) or the PEBS buffer was not mapped (README, \"PEBS\")",
                self.stats.pebs_lost
            ));
        }
        if self.stats.bts_lost > 0 {
            notes.push(format!(
                "NOT EXACT: BTS: {} branches were not stored: the DS area or the BTS buffer was not mapped (README, \"BTS\")",
                self.stats.bts_lost
            ));
        }
        if self.stats.pebs_inexact > 0 {
            notes.push(format!(
                "NOT EXACT: PEBS: {} records hold the registers after instructions that retired without their own single-step trap, not the sampled instruction's (README, \"PEBS\")",
                self.stats.pebs_inexact
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
