//! What a counter's event counts, in the terms a counting backend derives it from: the retired
//! instruction stream and its models (README, "The precise backend"). Each PMU model maps its own
//! event encodings (IA32_PERFEVTSELx, a NetBurst ESCR) to these, so that a backend counts any
//! model's events without knowing the model.

use super::lbr::BranchType;

/// What one counter counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Semantics {
    /// Every retired instruction (INST_RETIRED.ANY, fixed counter 0).
    Instructions,
    /// Retired branches whose kind and outcome the filter selects.
    Branches(BranchFilter),
    /// Unhalted core cycles: the cost model.
    CoreCycles,
    /// Cycles at the TSC's rate (fixed counter 2, CPU_CLK_UNHALTED.REF_TSC, SDM Table 18-2).
    RefTsc,
    /// Ticks of the reference clock (UnHalted Reference Cycles on a GP counter, 0x3C/0x01).
    RefXclk,
    /// Topdown slots (fixed counter 3).
    Slots,
    /// The cache model's LLC lookups and misses for the data accesses of retired instructions.
    LlcReference,
    LlcMisses,
    /// Retired instructions of a class their decoding tells (loads, stores, NOPs, FP arithmetic).
    Class(InsnClass),
    /// Cache lines of retired instructions' data accesses, by the cache model's level that held
    /// each (L1D.REPLACEMENT, L2_RQSTS.*, L2_LINES_IN).
    Lines(LineFilter),
    /// Retired load instructions by the level their data came from (MEM_LOAD_RETIRED.*).
    LoadSource(SourceFilter),
    /// Data accesses that cross a cache line, or instructions that make one (the SPLIT events).
    Split(SplitFilter),
    /// An event the cache model can never see (a fill-buffer hit, another core's cache): it
    /// counts zero, as the model has neither.
    ModelZero,
    /// An event that cannot occur where emon runs (a wrong path it never takes, µops it never
    /// tags): counts zero, exactly.
    Nothing,
    /// An event emon does not derive: it counts zero, and the run says NOT EXACT.
    Unsupported,
    /// An event of the CPU's list programmed on a counter the list does not give it: silicon's
    /// count is undefined there, emon's is zero, and the run says NOT EXACT.
    WrongCounter,
}

/// How exactly a backend that derives events from the retired instruction stream counts an
/// event (README, "Model-specific events").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Fidelity {
    /// Defined by the instruction stream alone: the count is silicon's.
    Exact,
    /// From a documented model (the cost model, the static predictor, the cache model).
    Modelled,
    /// Not counted: zero, and the run says NOT EXACT.
    NotCounted,
}

impl Fidelity {
    pub fn as_str(self) -> &'static str {
        match self {
            Fidelity::Exact => "exact",
            Fidelity::Modelled => "modelled",
            Fidelity::NotCounted => "not counted",
        }
    }
}

impl Semantics {
    /// Does counting it need the cache model to see every data access?
    pub fn uses_cache(self) -> bool {
        matches!(
            self,
            Semantics::LlcReference
                | Semantics::LlcMisses
                | Semantics::Lines(_)
                | Semantics::LoadSource(_)
                | Semantics::Split(_)
        )
    }

    /// How exactly it is counted.
    pub fn fidelity(self) -> Fidelity {
        match self {
            Semantics::Instructions | Semantics::Nothing => Fidelity::Exact,
            Semantics::Branches(f) if f.outcomes_by_prediction() => Fidelity::Modelled,
            Semantics::Branches(_) => Fidelity::Exact,
            Semantics::Class(c) if c.per_access() => Fidelity::Modelled,
            Semantics::Class(_) => Fidelity::Exact,
            Semantics::Split(s) if s.uops => Fidelity::Modelled,
            Semantics::Split(_) => Fidelity::Exact,
            Semantics::CoreCycles
            | Semantics::RefTsc
            | Semantics::RefXclk
            | Semantics::Slots
            | Semantics::LlcReference
            | Semantics::LlcMisses
            | Semantics::Lines(_)
            | Semantics::LoadSource(_)
            | Semantics::ModelZero => Fidelity::Modelled,
            Semantics::Unsupported | Semantics::WrongCounter => Fidelity::NotCounted,
        }
    }

    /// Does a counter that counts it count zero and make the run say NOT EXACT?
    pub fn not_counted(self) -> bool {
        self.fidelity() == Fidelity::NotCounted
    }
}

/// A class of retired instructions, as their decoding tells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InsnClass {
    /// Instructions that read memory (an explicit or implicit load, a read-modify-write), and
    /// with `prefetch` the software prefetches (PREFETCHh, PREFETCHW), which Skylake's and Ice
    /// Lake's lists count as loads. With `uops`, the load accesses (one micro-op each) instead.
    Loads { prefetch: bool, uops: bool },
    /// Instructions that write memory (a store, a read-modify-write); with `uops`, the store
    /// accesses.
    Stores { uops: bool },
    /// Instructions that load or store (MEM_INST_RETIRED.ANY).
    Memory { prefetch: bool },
    /// Locked read-modify-writes (a LOCK prefix, XCHG with memory); with `uops`, their accesses.
    LockedLoads { uops: bool },
    /// NOP (0x90, 0F 1F /0).
    Nop,
    /// PAUSE.
    Pause,
    /// SSE/AVX computational floating-point instructions of the kinds given
    /// (FP_ARITH_INST_RETIRED): ADD, SUB, MUL, DIV, MIN, MAX, SQRT and the others Intel's lists
    /// name; FMA and DPP count twice.
    FpArith(FpKinds),
}

impl InsnClass {
    /// Counted per access (a micro-op model) rather than per instruction.
    pub fn per_access(self) -> bool {
        matches!(
            self,
            InsnClass::Loads { uops: true, .. }
                | InsnClass::Stores { uops: true }
                | InsnClass::LockedLoads { uops: true }
        )
    }
}

/// Kinds of floating-point arithmetic by width and precision, one bit each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FpKinds(pub u8);

impl FpKinds {
    pub const SCALAR_SINGLE: FpKinds = FpKinds(1 << 0);
    pub const SCALAR_DOUBLE: FpKinds = FpKinds(1 << 1);
    pub const PACKED_128_SINGLE: FpKinds = FpKinds(1 << 2);
    pub const PACKED_128_DOUBLE: FpKinds = FpKinds(1 << 3);
    pub const PACKED_256_SINGLE: FpKinds = FpKinds(1 << 4);
    pub const PACKED_256_DOUBLE: FpKinds = FpKinds(1 << 5);
    pub const PACKED_512_SINGLE: FpKinds = FpKinds(1 << 6);
    pub const PACKED_512_DOUBLE: FpKinds = FpKinds(1 << 7);

    pub const fn union(self, other: FpKinds) -> FpKinds {
        FpKinds(self.0 | other.0)
    }
}

/// A level of the cache model: where a data access found its line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Level {
    L1,
    L2,
    Llc,
    Memory,
}

impl Level {
    /// The levels, nearest first; `level as usize` indexes arrays in this order.
    pub const ALL: [Level; 4] = [Level::L1, Level::L2, Level::Llc, Level::Memory];
}

/// Cache lines of data accesses: of loads, of stores (a read-modify-write's line is fetched for
/// ownership: a store's), or both, found at a level from `from` to `to`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LineFilter {
    pub loads: bool,
    pub stores: bool,
    pub from: Level,
    pub to: Level,
}

/// Load instructions whose data came from a level from `from` to `to` (the farthest level that
/// held one of their load lines). With `lock_prefetch_l1`, locked instructions and software
/// prefetches count at L1 whatever the level (Skylake's and Ice Lake's MEM_LOAD_RETIRED.L1_HIT:
/// "includes all SW prefetches and lock instructions regardless of the data source"), and at no
/// other level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SourceFilter {
    pub from: Level,
    pub to: Level,
    pub lock_prefetch_l1: bool,
}

/// Loads or stores that split across a cache line boundary (a page boundary is one too): the
/// instructions with such an access, or with `uops` the accesses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SplitFilter {
    pub stores: bool,
    pub uops: bool,
}

/// Which retired branches a branch event counts: by kind (the LBR filter's categories, SDM Vol.
/// 3B "Filtering of Last Branch Records") and by outcome (taken or not, predicted or not).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BranchFilter {
    /// Bit [`BranchFilter::kind_bit`] per selected kind.
    pub kinds: u8,
    /// Bit `2 * taken + mispredicted` per selected outcome (NetBurst's branch_retired mask bits
    /// MMNP, MMNM, MMTP, MMTM in that order, SDM Table 19-33).
    pub outcomes: u8,
}

impl BranchFilter {
    /// Every kind.
    pub const ALL_KINDS: u8 = 0x7F;
    /// Every outcome.
    pub const ALL_OUTCOMES: u8 = 0xF;
    /// The mispredicted outcomes, taken or not.
    pub const MISPREDICTED: u8 = 1 << 1 | 1 << 3;
    /// Every retired branch (BR_INST_RETIRED.ALL_BRANCHES).
    pub const ALL: BranchFilter = BranchFilter { kinds: Self::ALL_KINDS, outcomes: Self::ALL_OUTCOMES };
    /// Every mispredicted branch (BR_MISP_RETIRED.ALL_BRANCHES).
    pub const MISSES: BranchFilter = BranchFilter { kinds: Self::ALL_KINDS, outcomes: Self::MISPREDICTED };

    /// Every near kind (all but far transfers).
    pub const NEAR_KINDS: u8 = Self::ALL_KINDS & !(1 << 6);
    /// The taken outcomes, predicted or not.
    pub const TAKEN: u8 = 1 << 2 | 1 << 3;
    /// The not-taken outcomes, predicted or not.
    pub const NOT_TAKEN: u8 = 1 << 0 | 1 << 1;

    /// Does the filter tell outcomes by the prediction (and so count from the predictor's model)?
    pub fn outcomes_by_prediction(self) -> bool {
        let predicted = self.outcomes & !Self::MISPREDICTED;
        let mispredicted = (self.outcomes & Self::MISPREDICTED) >> 1;
        predicted != mispredicted
    }

    /// The bit of `kind` in [`BranchFilter::kinds`].
    pub const fn kind_bit(kind: BranchType) -> u8 {
        1 << match kind {
            BranchType::Jcc => 0,
            BranchType::NearRelCall => 1,
            BranchType::NearIndCall => 2,
            BranchType::NearRet => 3,
            BranchType::NearIndJmp => 4,
            BranchType::NearRelJmp => 5,
            BranchType::Far => 6,
        }
    }

    /// Does a retired branch of `kind` with this outcome count?
    pub fn counts(self, kind: BranchType, taken: bool, mispredicted: bool) -> bool {
        let outcome = 2 * u8::from(taken) + u8::from(mispredicted);
        self.kinds & Self::kind_bit(kind) != 0 && self.outcomes >> outcome & 1 != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn branch_filters_select_by_kind_and_outcome() {
        assert!(BranchFilter::ALL.counts(BranchType::Far, false, false));
        assert!(!BranchFilter::MISSES.counts(BranchType::Jcc, true, false));
        assert!(BranchFilter::MISSES.counts(BranchType::Jcc, false, true));
        let calls = BranchFilter {
            kinds: BranchFilter::kind_bit(BranchType::NearRelCall) | BranchFilter::kind_bit(BranchType::NearIndCall),
            outcomes: BranchFilter::ALL_OUTCOMES,
        };
        assert!(calls.counts(BranchType::NearIndCall, true, false));
        assert!(!calls.counts(BranchType::NearRet, true, false));
        assert!(Semantics::LlcMisses.uses_cache() && !Semantics::Instructions.uses_cache());
    }

    #[test]
    fn fidelity_follows_what_decides_the_count() {
        assert_eq!(Semantics::Branches(BranchFilter::ALL).fidelity(), Fidelity::Exact);
        assert_eq!(Semantics::Branches(BranchFilter::MISSES).fidelity(), Fidelity::Modelled);
        let taken = BranchFilter { kinds: BranchFilter::NEAR_KINDS, outcomes: BranchFilter::TAKEN };
        assert_eq!(Semantics::Branches(taken).fidelity(), Fidelity::Exact, "taken or not is the stream's");
        assert_eq!(Semantics::Class(InsnClass::Loads { prefetch: true, uops: false }).fidelity(), Fidelity::Exact);
        assert_eq!(Semantics::Class(InsnClass::Stores { uops: true }).fidelity(), Fidelity::Modelled);
        assert_eq!(Semantics::Split(SplitFilter { stores: false, uops: false }).fidelity(), Fidelity::Exact);
        assert_eq!(Semantics::ModelZero.fidelity(), Fidelity::Modelled);
        assert!(Semantics::WrongCounter.not_counted() && Semantics::Unsupported.not_counted());
        assert!(Semantics::Split(SplitFilter { stores: true, uops: false }).uses_cache());
    }
}
