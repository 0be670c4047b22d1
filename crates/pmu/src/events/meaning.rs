//! What emon counts for an event of a CPU's list, by the event's name (README, "Model-specific
//! events"): the one table of meanings. An event that is not here is not counted (zero, and the
//! run says NOT EXACT). The encodings are the lists'; this table names no code.
//!
//! Every meaning is checked against what silicon retires, per Intel's event descriptions and the
//! SDM: a retired branch's kind and outcome, an instruction that reads or writes memory (SDM
//! Vol. 1 "Instruction Set Summary": explicit and implicit operands), a split access (one that
//! crosses a 64-byte line: "A line split is across 64B cache-line which includes a page split",
//! Sandy Bridge's list), the FP arithmetic instructions Skylake's and Ice Lake's lists name.
use crate::pmu::lbr::BranchType;
use crate::pmu::{BranchFilter, FpKinds, InsnClass, Level, LineFilter, Semantics, SourceFilter, SplitFilter};

/// The meaning of event `name` of the list called `list`, if emon counts it.
pub fn meaning(list: &str, name: &str) -> Option<Semantics> {
    MEANINGS.iter().find(|(lists, n, _)| *n == name && (lists.is_empty() || lists.contains(&list))).map(|m| m.2)
}

/// Every list.
const ANY: &[&str] = &[];

const fn kinds(list: &[BranchType]) -> u8 {
    let mut bits = 0;
    let mut i = 0;
    while i < list.len() {
        bits |= BranchFilter::kind_bit(list[i]);
        i += 1;
    }
    bits
}

const JCC: u8 = kinds(&[BranchType::Jcc]);
const CALLS: u8 = kinds(&[BranchType::NearRelCall, BranchType::NearIndCall]);
const RET: u8 = kinds(&[BranchType::NearRet]);
const FAR: u8 = kinds(&[BranchType::Far]);
const INDIRECT: u8 = kinds(&[BranchType::NearIndJmp, BranchType::NearIndCall]);
const IND_CALL: u8 = kinds(&[BranchType::NearIndCall]);
const NEAR: u8 = BranchFilter::NEAR_KINDS;

/// Outcomes: 1 << (2 x taken + mispredicted).
const ALL_OUT: u8 = BranchFilter::ALL_OUTCOMES;
const TAKEN: u8 = BranchFilter::TAKEN;
const NOT_TAKEN: u8 = BranchFilter::NOT_TAKEN;
const MISP: u8 = BranchFilter::MISPREDICTED;
const MISP_TAKEN: u8 = 1 << 3;
const MISP_NOT_TAKEN: u8 = 1 << 1;

const fn br(kinds: u8, outcomes: u8) -> Semantics {
    Semantics::Branches(BranchFilter { kinds, outcomes })
}

const fn lines(loads: bool, stores: bool, from: Level, to: Level) -> Semantics {
    Semantics::Lines(LineFilter { loads, stores, from, to })
}

const fn source(from: Level, to: Level, lock_prefetch_l1: bool) -> Semantics {
    Semantics::LoadSource(SourceFilter { from, to, lock_prefetch_l1 })
}

const fn fp(k: FpKinds) -> Semantics {
    Semantics::Class(InsnClass::FpArith(k))
}

const fn split(stores: bool, uops: bool) -> Semantics {
    Semantics::Split(SplitFilter { stores, uops })
}

use Level::{Llc, Memory as Mem, L1, L2};

/// Skylake's and Ice Lake's retired-load data sources (MEM_LOAD_RETIRED, MEM_LOAD_L3_HIT_RETIRED).
const SKL_ICL: &[&str] = &["skylake", "icelake"];
/// Core 2's "L2" is its last-level cache.
const CORE2: &[&str] = &["core2"];

/// (lists it applies to, or every list; event name; what emon counts).
#[rustfmt::skip]
pub(super) const MEANINGS: &[(&[&str], &str, Semantics)] = &[
    // Instructions and their classes (exact).
    (ANY, "INST_RETIRED.ANY_P", Semantics::Instructions),
    (ANY, "INST_RETIRED.PREC_DIST", Semantics::Instructions),
    (ANY, "INST_RETIRED.NOP", Semantics::Class(InsnClass::Nop)),
    (ANY, "ROB_MISC_EVENTS.PAUSE_INST", Semantics::Class(InsnClass::Pause)),
    (ANY, "MISC_RETIRED.PAUSE_INST", Semantics::Class(InsnClass::Pause)),
    // Branches by kind and taken or not (exact), and by the static predictor (modelled).
    (ANY, "BR_INST_RETIRED.ANY", br(BranchFilter::ALL_KINDS, ALL_OUT)),
    (ANY, "BR_INST_RETIRED.ALL_BRANCHES", br(BranchFilter::ALL_KINDS, ALL_OUT)),
    (ANY, "BR_INST_RETIRED.ALL_BRANCHES_PEBS", br(BranchFilter::ALL_KINDS, ALL_OUT)),
    (ANY, "BR_INST_RETIRED.CONDITIONAL", br(JCC, ALL_OUT)),
    (ANY, "BR_INST_RETIRED.COND", br(JCC, ALL_OUT)),
    (ANY, "BR_INST_RETIRED.COND_TAKEN", br(JCC, TAKEN)),
    (ANY, "BR_INST_RETIRED.COND_NTAKEN", br(JCC, NOT_TAKEN)),
    (ANY, "BR_INST_RETIRED.NOT_TAKEN", br(JCC, NOT_TAKEN)),
    (ANY, "BR_INST_RETIRED.NEAR_CALL", br(CALLS, ALL_OUT)),
    (ANY, "BR_INST_RETIRED.NEAR_CALL_R3", br(CALLS, ALL_OUT)),
    (ANY, "BR_INST_RETIRED.NEAR_RETURN", br(RET, ALL_OUT)),
    (ANY, "BR_INST_RETIRED.NEAR_TAKEN", br(NEAR, TAKEN)),
    (ANY, "BR_INST_RETIRED.FAR_BRANCH", br(FAR, ALL_OUT)),
    (ANY, "BR_INST_RETIRED.INDIRECT", br(INDIRECT, ALL_OUT)),
    (ANY, "BR_INST_RETIRED.MISPRED", br(BranchFilter::ALL_KINDS, MISP)),
    (ANY, "BR_MISP_RETIRED.ALL_BRANCHES", br(BranchFilter::ALL_KINDS, MISP)),
    (ANY, "BR_MISP_RETIRED.ALL_BRANCHES_PEBS", br(BranchFilter::ALL_KINDS, MISP)),
    (ANY, "BR_MISP_RETIRED.CONDITIONAL", br(JCC, MISP)),
    (ANY, "BR_MISP_RETIRED.COND", br(JCC, MISP)),
    (ANY, "BR_MISP_RETIRED.COND_TAKEN", br(JCC, MISP_TAKEN)),
    (ANY, "BR_MISP_RETIRED.COND_NTAKEN", br(JCC, MISP_NOT_TAKEN)),
    (ANY, "BR_MISP_RETIRED.NOT_TAKEN", br(JCC, MISP_NOT_TAKEN)),
    (ANY, "BR_MISP_RETIRED.TAKEN", br(NEAR, MISP_TAKEN)),
    (ANY, "BR_MISP_RETIRED.NEAR_TAKEN", br(NEAR, MISP_TAKEN)),
    (ANY, "BR_MISP_RETIRED.NEAR_CALL", br(CALLS, MISP)),
    (ANY, "BR_MISP_RETIRED.INDIRECT", br(INDIRECT, MISP)),
    (ANY, "BR_MISP_RETIRED.INDIRECT_CALL", br(IND_CALL, MISP)),
    // Cycles (the cost model; one logical processor per core, so the other thread is halted).
    (ANY, "CPU_CLK_UNHALTED.THREAD_P", Semantics::CoreCycles),
    (ANY, "CPU_CLK_UNHALTED.DISTRIBUTED", Semantics::CoreCycles),
    (ANY, "CPU_CLK_UNHALTED.REF_P", Semantics::RefXclk),
    (ANY, "CPU_CLK_UNHALTED.REF_XCLK", Semantics::RefXclk),
    (ANY, "CPU_CLK_THREAD_UNHALTED.REF_XCLK", Semantics::RefXclk),
    (ANY, "CPU_CLK_UNHALTED.ONE_THREAD_ACTIVE", Semantics::RefXclk),
    (ANY, "CPU_CLK_THREAD_UNHALTED.ONE_THREAD_ACTIVE", Semantics::RefXclk),
    (ANY, "CPU_CLK_UNHALTED.REF_DISTRIBUTED", Semantics::RefXclk),
    (ANY, "TOPDOWN.SLOTS_P", Semantics::Slots),
    // Memory instructions (exact), or their accesses as micro-ops (Sandy Bridge's, modelled).
    (ANY, "MEM_INST_RETIRED.ALL_LOADS", Semantics::Class(InsnClass::Loads { prefetch: true, uops: false })),
    (ANY, "MEM_INST_RETIRED.LOADS", Semantics::Class(InsnClass::Loads { prefetch: true, uops: false })),
    (ANY, "MEM_INST_RETIRED.ALL_STORES", Semantics::Class(InsnClass::Stores { uops: false })),
    (ANY, "MEM_INST_RETIRED.STORES", Semantics::Class(InsnClass::Stores { uops: false })),
    (ANY, "MEM_INST_RETIRED.ANY", Semantics::Class(InsnClass::Memory { prefetch: true })),
    (ANY, "MEM_INST_RETIRED.LOCK_LOADS", Semantics::Class(InsnClass::LockedLoads { uops: false })),
    (ANY, "MEM_INST_RETIRED.SPLIT_LOADS", split(false, false)),
    (ANY, "MEM_INST_RETIRED.SPLIT_STORES", split(true, false)),
    (ANY, "MEM_UOPS_RETIRED.ALL_LOADS", Semantics::Class(InsnClass::Loads { prefetch: true, uops: true })),
    (ANY, "MEM_UOPS_RETIRED.ALL_STORES", Semantics::Class(InsnClass::Stores { uops: true })),
    (ANY, "MEM_UOPS_RETIRED.LOCK_LOADS", Semantics::Class(InsnClass::LockedLoads { uops: true })),
    (ANY, "MEM_UOPS_RETIRED.SPLIT_LOADS", split(false, true)),
    (ANY, "MEM_UOPS_RETIRED.SPLIT_STORES", split(true, true)),
    // FP arithmetic by width and precision (exact).
    (ANY, "FP_ARITH_INST_RETIRED.SCALAR_SINGLE", fp(FpKinds::SCALAR_SINGLE)),
    (ANY, "FP_ARITH_INST_RETIRED.SCALAR_DOUBLE", fp(FpKinds::SCALAR_DOUBLE)),
    (ANY, "FP_ARITH_INST_RETIRED.128B_PACKED_SINGLE", fp(FpKinds::PACKED_128_SINGLE)),
    (ANY, "FP_ARITH_INST_RETIRED.128B_PACKED_DOUBLE", fp(FpKinds::PACKED_128_DOUBLE)),
    (ANY, "FP_ARITH_INST_RETIRED.256B_PACKED_SINGLE", fp(FpKinds::PACKED_256_SINGLE)),
    (ANY, "FP_ARITH_INST_RETIRED.256B_PACKED_DOUBLE", fp(FpKinds::PACKED_256_DOUBLE)),
    (ANY, "FP_ARITH_INST_RETIRED.512B_PACKED_SINGLE", fp(FpKinds::PACKED_512_SINGLE)),
    (ANY, "FP_ARITH_INST_RETIRED.512B_PACKED_DOUBLE", fp(FpKinds::PACKED_512_DOUBLE)),
    // Cache lines by the level that held them (the cache model).
    (ANY, "L1D.REPLACEMENT", lines(true, true, L2, Mem)),
    (ANY, "L1D.REPL", lines(true, true, L2, Mem)),
    (ANY, "L1D_ALL_REF.ANY", lines(true, true, L1, Mem)),
    (ANY, "L1D_CACHE_LD.MESI", lines(true, false, L1, Mem)),
    (ANY, "L1D_CACHE_LD.I_STATE", lines(true, false, L2, Mem)),
    (ANY, "L1D_CACHE_ST.MESI", lines(false, true, L1, Mem)),
    (ANY, "L1D_CACHE_ST.I_STATE", lines(false, true, L2, Mem)),
    (ANY, "L2_RQSTS.DEMAND_DATA_RD_HIT", lines(true, false, L2, L2)),
    (ANY, "L2_RQSTS.DEMAND_DATA_RD_MISS", lines(true, false, Llc, Mem)),
    (ANY, "L2_RQSTS.ALL_DEMAND_DATA_RD", lines(true, false, L2, Mem)),
    (ANY, "L2_RQSTS.LD_HIT", lines(true, false, L2, L2)),
    (ANY, "L2_RQSTS.LD_MISS", lines(true, false, Llc, Mem)),
    (ANY, "L2_RQSTS.LOADS", lines(true, false, L2, Mem)),
    (ANY, "L2_RQSTS.RFO_HIT", lines(false, true, L2, L2)),
    (ANY, "L2_RQSTS.RFO_MISS", lines(false, true, Llc, Mem)),
    (ANY, "L2_RQSTS.ALL_RFO", lines(false, true, L2, Mem)),
    (ANY, "L2_RQSTS.RFOS", lines(false, true, L2, Mem)),
    (ANY, "L2_LINES_IN.ALL", lines(true, true, Llc, Mem)),
    (ANY, "L2_LINES_IN.ANY", lines(true, true, Llc, Mem)),
    (CORE2, "L2_LD.MESI", lines(true, false, Llc, Mem)),
    (CORE2, "L2_LD.ISTATE", lines(true, false, Mem, Mem)),
    (CORE2, "L2_ST.MESI", lines(false, true, Llc, Mem)),
    (CORE2, "L2_ST.ISTATE", lines(false, true, Mem, Mem)),
    // Retired loads by data source (the cache model).
    (SKL_ICL, "MEM_LOAD_RETIRED.L1_HIT", source(L1, L1, true)),
    (SKL_ICL, "MEM_LOAD_RETIRED.L2_HIT", source(L2, L2, true)),
    (SKL_ICL, "MEM_LOAD_RETIRED.L3_HIT", source(Llc, Llc, true)),
    (SKL_ICL, "MEM_LOAD_RETIRED.L1_MISS", source(L2, Mem, true)),
    (SKL_ICL, "MEM_LOAD_RETIRED.L2_MISS", source(Llc, Mem, true)),
    (SKL_ICL, "MEM_LOAD_RETIRED.L3_MISS", source(Mem, Mem, true)),
    (SKL_ICL, "MEM_LOAD_L3_HIT_RETIRED.XSNP_NONE", source(Llc, Llc, true)),
    (ANY, "MEM_LOAD_RETIRED.L1D_HIT", source(L1, L1, false)),
    (ANY, "MEM_LOAD_RETIRED.L2_HIT", source(L2, L2, false)),
    (ANY, "MEM_LOAD_RETIRED.LLC_UNSHARED_HIT", source(Llc, Llc, false)),
    (ANY, "MEM_LOAD_RETIRED.LLC_MISS", source(Mem, Mem, false)),
    (ANY, "MEM_LOAD_UOPS_RETIRED.L1_HIT", source(L1, L1, false)),
    (ANY, "MEM_LOAD_UOPS_RETIRED.L2_HIT", source(L2, L2, false)),
    (ANY, "MEM_LOAD_UOPS_RETIRED.LLC_HIT", source(Llc, Llc, false)),
    (ANY, "MEM_LOAD_UOPS_LLC_HIT_RETIRED.XSNP_NONE", source(Llc, Llc, false)),
    // What the cache model cannot hold: fill buffers and other cores' caches (zero).
    (ANY, "MEM_LOAD_RETIRED.FB_HIT", Semantics::ModelZero),
    (ANY, "MEM_LOAD_RETIRED.HIT_LFB", Semantics::ModelZero),
    (ANY, "MEM_LOAD_UOPS_RETIRED.HIT_LFB", Semantics::ModelZero),
    (ANY, "MEM_LOAD_RETIRED.OTHER_CORE_L2_HIT_HITM", Semantics::ModelZero),
    (ANY, "MEM_LOAD_L3_HIT_RETIRED.XSNP_HIT", Semantics::ModelZero),
    (ANY, "MEM_LOAD_L3_HIT_RETIRED.XSNP_HITM", Semantics::ModelZero),
    (ANY, "MEM_LOAD_L3_HIT_RETIRED.XSNP_MISS", Semantics::ModelZero),
    (ANY, "MEM_LOAD_UOPS_LLC_HIT_RETIRED.XSNP_HIT", Semantics::ModelZero),
    (ANY, "MEM_LOAD_UOPS_LLC_HIT_RETIRED.XSNP_HITM", Semantics::ModelZero),
    (ANY, "MEM_LOAD_UOPS_LLC_HIT_RETIRED.XSNP_MISS", Semantics::ModelZero),
];
