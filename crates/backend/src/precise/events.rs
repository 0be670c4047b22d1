//! Which events the precise backend counts, and by how much for each retired instruction
//! (the cost model and filters are documented in the README, "The precise backend").
use super::cache::{CacheEvents, LEVELS};
use emon_pmu::pmu::lbr::BranchType;
use emon_pmu::pmu::{CounterId, CounterState, InsnClass, Level, LineFilter, Semantics, SourceFilter, SplitFilter};
use emon_pmu::profile::Clock;
use emon_x86::insn::{Class, Flow, Insn, Transfer};

/// Topdown slots per core cycle in the model (a 4-wide machine).
pub const SLOTS_PER_CYCLE: u64 = 4;

/// How the precise backend derives each [`Semantics`] from a retired instruction and its models.
pub trait Derive {
    /// The event count for one retired instruction that follows from the instruction alone;
    /// [`Derive::dynamic`] adds what depends on the reference clock and the cache model.
    fn increment(self, i: &Insn, rip: u64, taken: bool) -> u64;
    /// The part of the count that depends on more than the instruction: `ref_ticks` reference
    /// clock ticks passed while it ran, and what its data accesses did in the cache model.
    fn dynamic(self, ref_ticks: u64, cache: CacheEvents) -> u64;
    /// The most [`Derive::dynamic`] can add for code of `cycles` core cycles (TSC ticks of the
    /// model) whose data accesses touch at most `lines` cache lines.
    fn dynamic_bound(self, cycles: u64, lines: u64, clock: Clock) -> u64;
}

impl Derive for Semantics {
    fn increment(self, i: &Insn, rip: u64, taken: bool) -> u64 {
        match self {
            Semantics::Instructions => 1,
            Semantics::Branches(f) => {
                u64::from(i.branch && f.counts(branch_kind(i), taken, mispredicted(i, rip, taken)))
            }
            Semantics::CoreCycles | Semantics::RefTsc => cycles(i, taken),
            Semantics::Slots => SLOTS_PER_CYCLE * cycles(i, taken),
            Semantics::Class(c) => class_count(c, &i.class),
            // A software prefetch counts as an L1 hit whatever its line (it has no access).
            Semantics::LoadSource(f) if f.lock_prefetch_l1 && f.from == Level::L1 => {
                u64::from(i.class.has(Class::PREFETCH))
            }
            Semantics::RefXclk
            | Semantics::LlcReference
            | Semantics::LlcMisses
            | Semantics::Lines(_)
            | Semantics::LoadSource(_)
            | Semantics::Split(_)
            | Semantics::ModelZero
            | Semantics::Nothing
            | Semantics::Unsupported
            | Semantics::WrongCounter => 0,
        }
    }

    fn dynamic(self, ref_ticks: u64, cache: CacheEvents) -> u64 {
        match self {
            Semantics::RefXclk => ref_ticks,
            Semantics::LlcReference => cache.llc_references,
            Semantics::LlcMisses => cache.llc_misses,
            Semantics::Lines(f) => lines(f, &cache),
            Semantics::LoadSource(f) => load_source(f, &cache),
            Semantics::Split(f) => split(f, &cache),
            _ => 0,
        }
    }

    fn dynamic_bound(self, cycles: u64, lines: u64, clock: Clock) -> u64 {
        match self {
            Semantics::RefXclk => clock.ref_ticks_at(cycles) + 1,
            // LLC requests: a line's own and one from each L1 prefetcher.
            Semantics::LlcReference | Semantics::LlcMisses => lines * super::cache::MAX_LLC_REQUESTS_PER_LINE,
            // At most one per line touched: every line, access and instruction touches one.
            Semantics::Lines(_) | Semantics::LoadSource(_) | Semantics::Split(_) => lines,
            _ => 0,
        }
    }
}

/// How many of `class` an instruction of `c` counts (README, "Model-specific events").
fn class_count(class: InsnClass, c: &Class) -> u64 {
    let prefetch = u8::from(c.has(Class::PREFETCH));
    match class {
        InsnClass::Loads { prefetch: with, uops } => {
            let loads = c.loads + if with { prefetch } else { 0 };
            if uops {
                u64::from(loads)
            } else {
                u64::from(loads > 0)
            }
        }
        InsnClass::Stores { uops: true } => u64::from(c.stores),
        InsnClass::Stores { uops: false } => u64::from(c.stores > 0),
        InsnClass::Memory { prefetch: with } => u64::from(c.loads > 0 || c.stores > 0 || with && prefetch > 0),
        // A locked read-modify-write is one access: one instruction, one locked load.
        InsnClass::LockedLoads { .. } => u64::from(c.has(Class::LOCKED)),
        InsnClass::Nop => u64::from(c.has(Class::NOP)),
        InsnClass::Pause => u64::from(c.has(Class::PAUSE)),
        InsnClass::FpArith(kinds) => {
            if c.fp & kinds.0 != 0 {
                u64::from(c.fp_count)
            } else {
                0
            }
        }
    }
}

/// The levels from `from` to `to`, as indices of the cache's per-level counts.
fn levels(from: Level, to: Level) -> std::ops::RangeInclusive<usize> {
    from as usize..=(to as usize).min(LEVELS - 1)
}

fn lines(f: LineFilter, cache: &CacheEvents) -> u64 {
    let d = &cache.data;
    levels(f.from, f.to)
        .map(|l| if f.loads { d.load_lines[l] } else { 0 } + if f.stores { d.store_lines[l] } else { 0 })
        .sum()
}

fn load_source(f: SourceFilter, cache: &CacheEvents) -> u64 {
    let d = &cache.data;
    let at: u64 = levels(f.from, f.to).map(|l| d.load_insns[l]).sum();
    let locked: u64 = if !f.lock_prefetch_l1 {
        levels(f.from, f.to).map(|l| d.locked_insns[l]).sum()
    } else if f.from == Level::L1 {
        // Locked instructions count as L1 hits whatever the level, and only as that.
        d.locked_insns.iter().sum()
    } else {
        0
    };
    at + locked
}

fn split(f: SplitFilter, cache: &CacheEvents) -> u64 {
    let d = &cache.data;
    match (f.stores, f.uops) {
        (false, false) => d.split_load_insns,
        (true, false) => d.split_store_insns,
        (false, true) => d.split_loads,
        (true, true) => d.split_stores,
    }
}

/// The LBR filter's kind of branch `i` (a branch that makes no transfer emon classifies counts
/// as far).
pub fn branch_kind(i: &Insn) -> BranchType {
    match i.transfer {
        Some(Transfer::Conditional) => BranchType::Jcc,
        Some(Transfer::RelCall) => BranchType::NearRelCall,
        Some(Transfer::IndCall) => BranchType::NearIndCall,
        Some(Transfer::Ret) => BranchType::NearRet,
        Some(Transfer::RelJmp) => BranchType::NearRelJmp,
        Some(Transfer::IndJmp) => BranchType::NearIndJmp,
        Some(Transfer::Far) | None => BranchType::Far,
    }
}

/// How the precise backend counts an event of `semantics`, for `emon events`.
pub fn support(semantics: Semantics) -> &'static str {
    match semantics {
        Semantics::Unsupported => "unsupported: counts 0",
        Semantics::WrongCounter => "not on this counter (the CPU's list): counts 0",
        Semantics::Nothing => "counts 0 exactly: nothing emon models (no wrong path, no tagged µops)",
        Semantics::ModelZero => "counted (cache model: 0, it has no fill buffer and no other core)",
        // Which branches count depends on the predictor unless every outcome counts.
        Semantics::Branches(f) if f.outcomes_by_prediction() => "counted (static predictor)",
        Semantics::CoreCycles | Semantics::RefTsc | Semantics::Slots => "counted (cost model)",
        Semantics::RefXclk => "counted (cost model, reference clock)",
        Semantics::LlcReference | Semantics::LlcMisses | Semantics::Lines(_) | Semantics::LoadSource(_) => {
            "counted (cache model)"
        }
        Semantics::Class(c) if c.per_access() => "counted (one micro-op per access)",
        Semantics::Split(f) if f.uops => "counted exactly (one micro-op per access)",
        Semantics::Instructions | Semantics::Branches(_) | Semantics::Class(_) | Semantics::Split(_) => {
            "counted exactly"
        }
    }
}

/// Core cycles of one retired instruction: 1, +1 per explicit memory operand, +1 when a branch
/// is taken, plus the class cost (MUL/IMUL 2, DIV/IDIV 20, instructions that exit to the VMM 100).
pub fn cycles(i: &Insn, taken: bool) -> u64 {
    1 + u64::from(i.mem_operands) + u64::from(taken) + u64::from(i.class_cycles)
}

/// A static predictor: conditional branches predicted taken when backward, not taken when
/// forward; everything else predicted correctly.
pub fn mispredicted(i: &Insn, rip: u64, taken: bool) -> bool {
    match i.flow {
        Flow::Direct { target, conditional: true } => (target <= rip) != taken,
        _ => false,
    }
}

/// A counting counter as the precise backend applies it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Armed {
    pub id: CounterId,
    pub semantics: Semantics,
    pub usr: bool,
    pub os: bool,
    pub cmask: u8,
    pub inv: bool,
    pub edge: bool,
}

impl Armed {
    pub fn new(c: &CounterState) -> Armed {
        Armed { id: c.id, semantics: c.semantics, usr: c.usr, os: c.os, cmask: c.cmask, inv: c.inv, edge: c.edge }
    }

    /// How much the counter advances for an instruction with event count `n` retired at `cpl`.
    /// `last` holds the CMASK condition of the previous counted instruction, for edge detect.
    /// (SDM 18.2.1.1: CMASK compares the per-cycle count; here the unit is one instruction.)
    pub fn advance(&self, n: u64, cpl: u8, last: &mut bool) -> u64 {
        if !(if cpl == 0 { self.os } else { self.usr }) {
            return 0;
        }
        if self.cmask == 0 {
            return n;
        }
        let cond = self.condition(n);
        let rising = cond && !*last;
        *last = cond;
        u64::from(if self.edge { rising } else { cond })
    }

    /// The CMASK condition for an instruction with event count `n` (INV inverts it).
    fn condition(&self, n: u64) -> bool {
        (n >= u64::from(self.cmask)) != self.inv
    }

    /// What the counter adds for an instruction with event count `n`, where that depends on the
    /// instruction alone: `n`, or with CMASK (and no edge detect) 1 when the condition holds.
    pub fn per_instruction(&self, n: u64) -> u64 {
        if self.cmask == 0 {
            n
        } else {
            u64::from(self.condition(n))
        }
    }

    /// Whether a stretch of instructions adds the sum of [`Armed::per_instruction`] over them,
    /// whatever ran before: no edge detect, and with CMASK, nothing counted beyond the
    /// instruction itself (reference ticks, the cache model), which only comes per stretch.
    pub fn sums_per_instruction(&self) -> bool {
        self.cmask == 0 || !self.edge && self.semantics.dynamic_bound(1, 1, Clock::default()) == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use emon_pmu::pmu::BranchFilter;
    use emon_x86::insn::decode;

    fn armed(semantics: Semantics) -> Armed {
        Armed { id: CounterId::Gp(0), semantics, usr: true, os: true, cmask: 0, inv: false, edge: false }
    }

    #[test]
    fn branch_filters_count_by_outcome_and_type() {
        // branch_retired by class: a backward JNZ is predicted taken (static predictor).
        let back = decode(&[0x75, 0xFE], 0x1000, 64).unwrap();
        let class = |outcomes| Semantics::Branches(BranchFilter { kinds: BranchFilter::ALL_KINDS, outcomes });
        assert_eq!(class(0b0100).increment(&back, 0x1000, true), 1, "taken, predicted");
        assert_eq!(class(0b0100).increment(&back, 0x1000, false), 0, "not taken: mispredicted");
        assert_eq!(class(0b0010).increment(&back, 0x1000, false), 1);
        let nop = decode(&[0x90], 0, 64).unwrap();
        assert_eq!(class(0xF).increment(&nop, 0, false), 0);
        let calls = Semantics::Branches(BranchFilter {
            kinds: BranchFilter::kind_bit(BranchType::NearRelCall) | BranchFilter::kind_bit(BranchType::NearIndCall),
            outcomes: BranchFilter::ALL_OUTCOMES,
        });
        let call_ind = decode(&[0xFF, 0xD0], 0, 64).unwrap(); // call rax
        let ret = decode(&[0xC3], 0, 64).unwrap();
        assert_eq!(calls.increment(&call_ind, 0, true), 1);
        assert_eq!(calls.increment(&ret, 0, true), 0);
        // INT n is a branch the filter sees as far.
        let int = decode(&[0xCD, 0x80], 0, 64).unwrap();
        assert_eq!(Semantics::Branches(BranchFilter::ALL).increment(&int, 0, true), 1);
    }

    #[test]
    fn reference_cycles_are_bounded_by_the_clock() {
        let c = Clock { tsc_per_ref_numerator: 334, tsc_per_ref_denominator: 2, ..Clock::TSC };
        assert_eq!(Semantics::RefXclk.dynamic_bound(167 * 3, 9, c), 4);
        let cache = CacheEvents { llc_references: 3, llc_misses: 2, ..CacheEvents::default() };
        assert_eq!(Semantics::RefXclk.dynamic(7, cache), 7);
        assert_eq!(Semantics::LlcReference.dynamic(7, cache), 3);
        assert_eq!(Semantics::LlcMisses.dynamic(7, cache), 2);
        // A line's own request and one from each L1 prefetcher.
        assert_eq!(Semantics::LlcMisses.dynamic_bound(100, 9, c), 27);
        assert_eq!(Semantics::CoreCycles.dynamic(7, cache), 0);
    }

    #[test]
    fn fp_kinds_are_the_decoders_bits() {
        use emon_pmu::pmu::FpKinds;
        let pairs = [
            (FpKinds::SCALAR_SINGLE, Class::FP_SCALAR_SINGLE),
            (FpKinds::SCALAR_DOUBLE, Class::FP_SCALAR_DOUBLE),
            (FpKinds::PACKED_128_SINGLE, Class::FP_128_SINGLE),
            (FpKinds::PACKED_128_DOUBLE, Class::FP_128_DOUBLE),
            (FpKinds::PACKED_256_SINGLE, Class::FP_256_SINGLE),
            (FpKinds::PACKED_256_DOUBLE, Class::FP_256_DOUBLE),
            (FpKinds::PACKED_512_SINGLE, Class::FP_512_SINGLE),
            (FpKinds::PACKED_512_DOUBLE, Class::FP_512_DOUBLE),
        ];
        for (kinds, bit) in pairs {
            assert_eq!(kinds.0, bit);
        }
    }

    #[test]
    fn instruction_classes_count_per_instruction_or_per_access() {
        let cmps = decode(&[0xA6], 0, 64).unwrap(); // cmpsb: two loads
        let rmw = decode(&[0xF0, 0x48, 0x01, 0x03], 0, 64).unwrap(); // lock add [rbx], rax
        let prefetch = decode(&[0x0F, 0x18, 0x08], 0, 64).unwrap();
        let loads = |uops| Semantics::Class(InsnClass::Loads { prefetch: true, uops });
        assert_eq!(loads(false).increment(&cmps, 0, false), 1);
        assert_eq!(loads(true).increment(&cmps, 0, false), 2);
        assert_eq!(loads(false).increment(&rmw, 0, false), 1);
        assert_eq!(loads(false).increment(&prefetch, 0, false), 1);
        assert_eq!(
            Semantics::Class(InsnClass::Loads { prefetch: false, uops: false }).increment(&prefetch, 0, false),
            0
        );
        assert_eq!(Semantics::Class(InsnClass::Stores { uops: false }).increment(&rmw, 0, false), 1);
        assert_eq!(Semantics::Class(InsnClass::Stores { uops: false }).increment(&cmps, 0, false), 0);
        assert_eq!(Semantics::Class(InsnClass::LockedLoads { uops: false }).increment(&rmw, 0, false), 1);
        assert_eq!(Semantics::Class(InsnClass::Memory { prefetch: true }).increment(&prefetch, 0, false), 1);
        let fma = decode(&[0xC4, 0xE2, 0xF1, 0xA9, 0xC2], 0, 64).unwrap(); // vfmadd213sd
        let sd = Semantics::Class(InsnClass::FpArith(emon_pmu::pmu::FpKinds::SCALAR_DOUBLE));
        assert_eq!(sd.increment(&fma, 0, false), 2);
        let ps = Semantics::Class(InsnClass::FpArith(emon_pmu::pmu::FpKinds::PACKED_128_SINGLE));
        assert_eq!(ps.increment(&fma, 0, false), 0);
    }

    #[test]
    fn cache_events_by_level_and_kind() {
        use super::super::cache::DataEvents;
        use emon_pmu::pmu::LineFilter;
        let data = DataEvents {
            load_lines: [5, 4, 3, 2],
            store_lines: [50, 40, 30, 20],
            load_insns: [7, 6, 1, 1],
            locked_insns: [0, 1, 0, 2],
            split_loads: 3,
            split_stores: 4,
            split_load_insns: 2,
            split_store_insns: 1,
        };
        let cache = CacheEvents { data, ..CacheEvents::default() };
        let l = |loads, stores, from, to| Semantics::Lines(LineFilter { loads, stores, from, to }).dynamic(0, cache);
        assert_eq!(l(true, true, Level::L2, Level::Memory), 4 + 3 + 2 + 40 + 30 + 20, "L1D.REPLACEMENT");
        assert_eq!(l(true, false, Level::L2, Level::L2), 4, "L2 demand data read hits");
        assert_eq!(l(false, true, Level::Llc, Level::Memory), 50, "RFO misses");
        let src = |from, to, lock_prefetch_l1| {
            Semantics::LoadSource(SourceFilter { from, to, lock_prefetch_l1 }).dynamic(0, cache)
        };
        assert_eq!(src(Level::L1, Level::L1, false), 7);
        assert_eq!(src(Level::L2, Level::Memory, false), 6 + 1 + 1 + 1 + 2);
        assert_eq!(src(Level::L1, Level::L1, true), 7 + 3, "locked instructions are L1 hits on Skylake");
        assert_eq!(src(Level::L2, Level::Memory, true), 6 + 1 + 1, "and nothing else");
        let prefetch = decode(&[0x0F, 0x18, 0x08], 0, 64).unwrap();
        let l1_hit = Semantics::LoadSource(SourceFilter { from: Level::L1, to: Level::L1, lock_prefetch_l1: true });
        assert_eq!(l1_hit.increment(&prefetch, 0, false), 1, "a software prefetch is an L1 hit");
        let sp = |stores, uops| Semantics::Split(SplitFilter { stores, uops }).dynamic(0, cache);
        assert_eq!((sp(false, false), sp(true, false), sp(false, true), sp(true, true)), (2, 1, 3, 4));
    }

    #[test]
    fn cost_model() {
        let nop = decode(&[0x90], 0, 64).unwrap();
        let load = decode(&[0x48, 0x8B, 0x03], 0, 64).unwrap();
        let div = decode(&[0x48, 0xF7, 0xF1], 0, 64).unwrap();
        let jnz_back = decode(&[0x75, 0xFE], 0x1000, 64).unwrap();
        assert_eq!(cycles(&nop, false), 1);
        assert_eq!(cycles(&load, false), 2);
        assert_eq!(cycles(&div, false), 21);
        assert_eq!(cycles(&jnz_back, true), 2);
        assert_eq!(Semantics::Slots.increment(&nop, 0, false), 4);
    }

    #[test]
    fn static_predictor_mispredicts() {
        let back = decode(&[0x75, 0xFE], 0x1000, 64).unwrap();
        let fwd = decode(&[0x75, 0x10], 0x1000, 64).unwrap();
        let misses = Semantics::Branches(BranchFilter::MISSES);
        assert_eq!(misses.increment(&back, 0x1000, true), 0);
        assert_eq!(misses.increment(&back, 0x1000, false), 1);
        assert_eq!(misses.increment(&fwd, 0x1000, false), 0);
        assert_eq!(misses.increment(&fwd, 0x1000, true), 1);
    }

    #[test]
    fn usr_os_cmask_inv_edge() {
        let mut last = false;
        let mut a = armed(Semantics::CoreCycles);
        a.usr = false;
        assert_eq!(a.advance(5, 3, &mut last), 0);
        assert_eq!(a.advance(5, 0, &mut last), 5);
        a.cmask = 2;
        assert_eq!(a.advance(1, 0, &mut last), 0);
        assert_eq!(a.advance(3, 0, &mut last), 1);
        a.inv = true;
        assert_eq!(a.advance(1, 0, &mut last), 1);
        a.inv = false;
        a.edge = true;
        let mut last = false;
        assert_eq!(a.advance(3, 0, &mut last), 1);
        assert_eq!(a.advance(3, 0, &mut last), 0, "no new rising edge");
        assert_eq!(a.advance(1, 0, &mut last), 0);
        assert_eq!(a.advance(3, 0, &mut last), 1);
    }
}
