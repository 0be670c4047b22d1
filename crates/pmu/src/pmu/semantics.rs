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
    /// An event that cannot occur where emon runs (a wrong path it never takes, µops it never
    /// tags): counts zero, exactly.
    Nothing,
    /// An event emon does not derive: it counts zero, and the run says NOT EXACT.
    Unsupported,
}

impl Semantics {
    /// Does counting it need the cache model to see every data access?
    pub fn uses_cache(self) -> bool {
        matches!(self, Semantics::LlcReference | Semantics::LlcMisses)
    }
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

    /// The bit of `kind` in [`BranchFilter::kinds`].
    pub fn kind_bit(kind: BranchType) -> u8 {
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
}
