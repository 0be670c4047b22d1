//! The NetBurst PMU of Pentium 4 and Xeon (SDM Vol. 3B 18.15, with Hyper-Threading 18.16): 18
//! 40-bit counters in four blocks (BPU, MS, FLAME, IQ), a CCCR per counter that enables it,
//! filters its events and selects one of the ESCRs its block can use, and the ESCRs that select
//! the event and the privilege levels. A pure register file: the write masks are those the
//! VirtualBox CPU database measured on a Pentium 4 3.00 GHz (family 0FH model 4, README "The
//! NetBurst PMU"), and counting follows the SDM's qualification order (18.15.3).

use super::counter;
use super::lbr::BranchType;
use super::msr;
use super::ops::{PmuOps, Shared, Unmodelled};
use super::semantics::{BranchFilter, Semantics};
use super::{CounterId, CounterState, GpFault};

/// MSR_BPU_COUNTER0: counter i is at 0x300 + i (SDM Table 18-63).
pub const MSR_BPU_COUNTER0: u32 = 0x300;
/// MSR_BPU_CCCR0: the CCCR of counter i is at 0x360 + i.
pub const MSR_BPU_CCCR0: u32 = 0x360;
/// The ESCRs live in 0x3A0..=0x3E1 (with holes).
pub const ESCR_FIRST: u32 = 0x3A0;
pub const ESCR_LAST: u32 = 0x3E1;
/// MSR_TC_PRECISE_EVENT, IA32_PEBS_ENABLE and MSR_PEBS_MATRIX_VERT: the at-retirement and PEBS
/// controls (SDM 18.15.6.4, 18.15.7). emon stores them; it writes no NetBurst PEBS records.
pub const MSR_TC_PRECISE_EVENT: u32 = 0x3F0;
pub const IA32_PEBS_ENABLE: u32 = 0x3F1;
pub const MSR_PEBS_MATRIX_VERT: u32 = 0x3F2;
/// 18 counters (SDM 18.15.2).
pub const COUNTERS: u8 = 18;
/// Every counter is 40 bits wide (SDM 18.15.2).
pub const WIDTH: u8 = 40;
const VALUE_MASK: u64 = (1 << WIDTH) - 1;

// ---- CCCR fields (SDM Figure 18-48, Hyper-Threading layout) ----
pub const CCCR_ENABLE: u64 = 1 << 12;
pub const CCCR_ESCR_SELECT_SHIFT: u32 = 13;
pub const CCCR_ACTIVE_THREAD_SHIFT: u32 = 16;
pub const CCCR_COMPARE: u64 = 1 << 18;
pub const CCCR_COMPLEMENT: u64 = 1 << 19;
pub const CCCR_THRESHOLD_SHIFT: u32 = 20;
pub const CCCR_EDGE: u64 = 1 << 24;
pub const CCCR_FORCE_OVF: u64 = 1 << 25;
pub const CCCR_OVF_PMI_T0: u64 = 1 << 26;
pub const CCCR_OVF_PMI_T1: u64 = 1 << 27;
pub const CCCR_CASCADE: u64 = 1 << 30;
pub const CCCR_OVF: u64 = 1 << 31;
/// The extended-cascading bits of the IQ CCCRs (SDM 18.15.5.7), writable as measured.
const CCCR_EXT_CASCADE_IQ0_IQ3: u64 = 1 << 11;
const CCCR_EXT_CASCADE_IQ4_IQ5: u64 = 0xF << 8;

// ---- ESCR fields (SDM Figure 18-47) ----
pub const ESCR_T1_USR: u64 = 1 << 0;
pub const ESCR_T1_OS: u64 = 1 << 1;
pub const ESCR_T0_USR: u64 = 1 << 2;
pub const ESCR_T0_OS: u64 = 1 << 3;
pub const ESCR_TAG_ENABLE: u64 = 1 << 4;
pub const ESCR_EVENT_MASK_SHIFT: u32 = 9;
pub const ESCR_EVENT_SELECT_SHIFT: u32 = 25;
/// ESCR bit 31 raises #GP on write (measured); bits 63:32 are ignored.
const ESCR_GP: u64 = 1 << 31;

/// One ESCR: its MSR, SDM name and the bits a WRMSR ignores (they read 0), as measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EscrDef {
    pub msr: u32,
    pub name: &'static str,
    pub ignored: u64,
}

const HI: u64 = 0xFFFF_FFFF_0000_0000;

/// Every ESCR of the Pentium 4 3.00 GHz (model 4), by address (SDM Table 18-63; write masks from
/// the VirtualBox CPU database). MSR_IQ_ESCR0/1 exist but ignore every write from model 3 on.
pub const ESCRS: &[EscrDef] = &[
    EscrDef { msr: 0x3A0, name: "MSR_BSU_ESCR0", ignored: HI },
    EscrDef { msr: 0x3A1, name: "MSR_BSU_ESCR1", ignored: HI },
    EscrDef { msr: 0x3A2, name: "MSR_FSB_ESCR0", ignored: HI | 0x4000_0000 },
    EscrDef { msr: 0x3A3, name: "MSR_FSB_ESCR1", ignored: HI | 0x4000_0000 },
    EscrDef { msr: 0x3A4, name: "MSR_FIRM_ESCR0", ignored: HI },
    EscrDef { msr: 0x3A5, name: "MSR_FIRM_ESCR1", ignored: HI },
    EscrDef { msr: 0x3A6, name: "MSR_FLAME_ESCR0", ignored: HI },
    EscrDef { msr: 0x3A7, name: "MSR_FLAME_ESCR1", ignored: HI },
    EscrDef { msr: 0x3A8, name: "MSR_DAC_ESCR0", ignored: HI | 0x61FE_01F0 },
    EscrDef { msr: 0x3A9, name: "MSR_DAC_ESCR1", ignored: HI | 0x61FE_01F0 },
    EscrDef { msr: 0x3AA, name: "MSR_MOB_ESCR0", ignored: HI },
    EscrDef { msr: 0x3AB, name: "MSR_MOB_ESCR1", ignored: HI },
    EscrDef { msr: 0x3AC, name: "MSR_PMH_ESCR0", ignored: HI },
    EscrDef { msr: 0x3AD, name: "MSR_PMH_ESCR1", ignored: HI },
    EscrDef { msr: 0x3AE, name: "MSR_SAAT_ESCR0", ignored: HI },
    EscrDef { msr: 0x3AF, name: "MSR_SAAT_ESCR1", ignored: HI },
    EscrDef { msr: 0x3B0, name: "MSR_U2L_ESCR0", ignored: HI | 0x71C0_01F0 },
    EscrDef { msr: 0x3B1, name: "MSR_U2L_ESCR1", ignored: HI | 0x71C0_01F0 },
    EscrDef { msr: 0x3B2, name: "MSR_BPU_ESCR0", ignored: HI | 0x61FC_0000 },
    EscrDef { msr: 0x3B3, name: "MSR_BPU_ESCR1", ignored: HI | 0x61FC_0000 },
    EscrDef { msr: 0x3B4, name: "MSR_IS_ESCR0", ignored: HI | 0x71FE_01F0 },
    EscrDef { msr: 0x3B5, name: "MSR_IS_ESCR1", ignored: HI | 0x71FE_01F0 },
    EscrDef { msr: 0x3B6, name: "MSR_ITLB_ESCR0", ignored: HI | 0x0FFF_F1E0 },
    EscrDef { msr: 0x3B7, name: "MSR_ITLB_ESCR1", ignored: HI | 0x0FFF_F1E0 },
    EscrDef { msr: 0x3B8, name: "MSR_CRU_ESCR0", ignored: HI | 0x71FE_01F0 },
    EscrDef { msr: 0x3B9, name: "MSR_CRU_ESCR1", ignored: HI | 0x71FE_01F0 },
    EscrDef { msr: 0x3BA, name: "MSR_IQ_ESCR0", ignored: HI | 0x7FFF_FFFF },
    EscrDef { msr: 0x3BB, name: "MSR_IQ_ESCR1", ignored: HI | 0x7FFF_FFFF },
    EscrDef { msr: 0x3BC, name: "MSR_RAT_ESCR0", ignored: HI },
    EscrDef { msr: 0x3BD, name: "MSR_RAT_ESCR1", ignored: HI },
    EscrDef { msr: 0x3BE, name: "MSR_SSU_ESCR0", ignored: HI },
    EscrDef { msr: 0x3C0, name: "MSR_MS_ESCR0", ignored: HI | 0x61FF_81E0 },
    EscrDef { msr: 0x3C1, name: "MSR_MS_ESCR1", ignored: HI | 0x61FF_81E0 },
    EscrDef { msr: 0x3C2, name: "MSR_TBPU_ESCR0", ignored: HI | 0x71FE_01F0 },
    EscrDef { msr: 0x3C3, name: "MSR_TBPU_ESCR1", ignored: HI | 0x71FE_01F0 },
    EscrDef { msr: 0x3C4, name: "MSR_TC_ESCR0", ignored: HI | 0x61F8_01F0 },
    EscrDef { msr: 0x3C5, name: "MSR_TC_ESCR1", ignored: HI | 0x61F8_01F0 },
    EscrDef { msr: 0x3C8, name: "MSR_IX_ESCR0", ignored: HI | 0x71FE_01F0 },
    EscrDef { msr: 0x3C9, name: "MSR_IX_ESCR1", ignored: HI | 0x71FE_01F0 },
    EscrDef { msr: 0x3CA, name: "MSR_ALF_ESCR0", ignored: HI | 0x7000_01F0 },
    EscrDef { msr: 0x3CB, name: "MSR_ALF_ESCR1", ignored: HI | 0x7000_01F0 },
    EscrDef { msr: 0x3CC, name: "MSR_CRU_ESCR2", ignored: HI | 0x61F0_01F0 },
    EscrDef { msr: 0x3CD, name: "MSR_CRU_ESCR3", ignored: HI | 0x61F0_01F0 },
    EscrDef { msr: 0x3E0, name: "MSR_CRU_ESCR4", ignored: HI | 0x71FF_01F0 },
    EscrDef { msr: 0x3E1, name: "MSR_CRU_ESCR5", ignored: HI | 0x71FF_01F0 },
];

/// ESCRs a CCCR's ESCR select can name, by select value (SDM Table 18-63).
type EscrSet = [Option<u32>; 8];
const BPU0: EscrSet =
    [Some(0x3B2), Some(0x3B4), Some(0x3AA), Some(0x3B6), Some(0x3AC), Some(0x3C8), Some(0x3A2), Some(0x3A0)];
const BPU1: EscrSet =
    [Some(0x3B3), Some(0x3B5), Some(0x3AB), Some(0x3B7), Some(0x3AD), Some(0x3C9), Some(0x3A3), Some(0x3A1)];
const MS0: EscrSet = [Some(0x3C0), Some(0x3C4), Some(0x3C2), None, None, None, None, None];
const MS1: EscrSet = [Some(0x3C1), Some(0x3C5), Some(0x3C3), None, None, None, None, None];
const FLAME0: EscrSet = [Some(0x3A6), Some(0x3A4), Some(0x3AE), Some(0x3B0), None, Some(0x3A8), None, None];
const FLAME1: EscrSet = [Some(0x3A7), Some(0x3A5), Some(0x3AF), Some(0x3B1), None, Some(0x3A9), None, None];
const IQ0: EscrSet = [Some(0x3BA), Some(0x3CA), Some(0x3BC), Some(0x3BE), Some(0x3B8), Some(0x3CC), Some(0x3E0), None];
const IQ1: EscrSet = [Some(0x3BB), Some(0x3CB), Some(0x3BD), None, Some(0x3B9), Some(0x3CD), Some(0x3E1), None];

/// One counter: its name, its CCCR's name, the ESCRs it can count through, the CCCR bits a WRMSR
/// ignores (measured), and the counter whose overflow starts it when its CCCR's CASCADE is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CounterDef {
    pub name: &'static str,
    pub cccr: &'static str,
    pub escrs: EscrSet,
    pub cccr_ignored: u64,
    /// SDM 18.15.5.6: counters 0 and 2 (1 and 3) of a block cascade either way; in the IQ
    /// block, 16 only from 14 and 17 only from 15.
    pub cascade_from: u8,
}

const CCCR_IGNORED: u64 = HI | 0xFFF;

const fn def(name: &'static str, cccr: &'static str, escrs: EscrSet, cccr_ignored: u64, from: u8) -> CounterDef {
    CounterDef { name, cccr, escrs, cccr_ignored, cascade_from: from }
}

/// The 18 counters, by index (MSR 0x300 + i, CCCR 0x360 + i).
pub const COUNTER_DEFS: [CounterDef; COUNTERS as usize] = [
    def("MSR_BPU_COUNTER0", "MSR_BPU_CCCR0", BPU0, CCCR_IGNORED, 2),
    def("MSR_BPU_COUNTER1", "MSR_BPU_CCCR1", BPU0, CCCR_IGNORED, 3),
    def("MSR_BPU_COUNTER2", "MSR_BPU_CCCR2", BPU1, CCCR_IGNORED, 0),
    def("MSR_BPU_COUNTER3", "MSR_BPU_CCCR3", BPU1, CCCR_IGNORED, 1),
    def("MSR_MS_COUNTER0", "MSR_MS_CCCR0", MS0, CCCR_IGNORED, 6),
    def("MSR_MS_COUNTER1", "MSR_MS_CCCR1", MS0, CCCR_IGNORED, 7),
    def("MSR_MS_COUNTER2", "MSR_MS_CCCR2", MS1, CCCR_IGNORED, 4),
    def("MSR_MS_COUNTER3", "MSR_MS_CCCR3", MS1, CCCR_IGNORED, 5),
    def("MSR_FLAME_COUNTER0", "MSR_FLAME_CCCR0", FLAME0, CCCR_IGNORED, 10),
    def("MSR_FLAME_COUNTER1", "MSR_FLAME_CCCR1", FLAME0, CCCR_IGNORED, 11),
    def("MSR_FLAME_COUNTER2", "MSR_FLAME_CCCR2", FLAME1, CCCR_IGNORED, 8),
    def("MSR_FLAME_COUNTER3", "MSR_FLAME_CCCR3", FLAME1, CCCR_IGNORED, 9),
    def("MSR_IQ_COUNTER0", "MSR_IQ_CCCR0", IQ0, CCCR_IGNORED & !CCCR_EXT_CASCADE_IQ0_IQ3, 14),
    def("MSR_IQ_COUNTER1", "MSR_IQ_CCCR1", IQ0, CCCR_IGNORED, 15),
    def("MSR_IQ_COUNTER2", "MSR_IQ_CCCR2", IQ1, CCCR_IGNORED, 12),
    def("MSR_IQ_COUNTER3", "MSR_IQ_CCCR3", IQ1, CCCR_IGNORED & !CCCR_EXT_CASCADE_IQ0_IQ3, 13),
    def("MSR_IQ_COUNTER4", "MSR_IQ_CCCR4", IQ0, CCCR_IGNORED & !CCCR_EXT_CASCADE_IQ4_IQ5, 14),
    def("MSR_IQ_COUNTER5", "MSR_IQ_CCCR5", IQ1, CCCR_IGNORED & !CCCR_EXT_CASCADE_IQ4_IQ5, 15),
];

/// The writable bits of the storage-only controls (measured), and their power-on values.
const TC_PRECISE_EVENT_BITS: u64 = 0x3_FFE0;
const TC_PRECISE_EVENT_RESET: u64 = 0xFC00;
const PEBS_ENABLE_BITS: u64 = 0x7FF_FFFF;
/// IA32_PEBS_ENABLE.ENABLE_PEBS_MY_THR (bit 24): PEBS for this logical processor (SDM 18.15.7).
pub const PEBS_ENABLE_MY_THR: u64 = 1 << 24;
const PEBS_MATRIX_VERT_BITS: u64 = 0x1FFF;

/// A NetBurst event that emon's precise backend derives (SDM Table 19-33, the at-retirement and
/// non-retirement events of NetBurst): its ESCRs, event select and event-mask bit names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventDef {
    pub name: &'static str,
    /// ESCR0 and ESCR1 of the pair that selects it.
    pub escrs: [u32; 2],
    pub event: u8,
    /// Event-mask bits, from bit 0.
    pub mask_bits: &'static [&'static str],
}

/// The events emon counts on NetBurst; any other ESCR event counts 0 (README, "The NetBurst PMU").
pub const EVENTS: &[EventDef] = &[
    EventDef {
        name: "instr_retired",
        escrs: [0x3B8, 0x3B9],
        event: 0x02,
        mask_bits: &["NBOGUSNTAG", "NBOGUSTAG", "BOGUSNTAG", "BOGUSTAG"],
    },
    EventDef { name: "mispred_branch_retired", escrs: [0x3B8, 0x3B9], event: 0x03, mask_bits: &["NBOGUS"] },
    EventDef {
        name: "branch_retired",
        escrs: [0x3CC, 0x3CD],
        event: 0x06,
        mask_bits: &["MMNP", "MMNM", "MMTP", "MMTM"],
    },
    EventDef { name: "global_power_events", escrs: [0x3A2, 0x3A3], event: 0x13, mask_bits: &["RUNNING"] },
    EventDef {
        name: "retired_branch_type",
        escrs: [0x3C2, 0x3C3],
        event: 0x04,
        mask_bits: &["(reserved)", "CONDITIONAL", "CALL", "RETURN", "INDIRECT"],
    },
    EventDef {
        name: "retired_mispred_branch_type",
        escrs: [0x3C2, 0x3C3],
        event: 0x05,
        mask_bits: &["(reserved)", "CONDITIONAL", "CALL", "RETURN", "INDIRECT"],
    },
];

/// The event `s` selects, if emon derives it.
pub fn event(s: Selection) -> Option<&'static EventDef> {
    EVENTS.iter().find(|e| e.event == s.event && e.escrs.contains(&s.escr))
}

/// A NetBurst PMU register, decoded from an MSR index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reg {
    Counter(u8),
    Cccr(u8),
    /// Index into [`ESCRS`].
    Escr(usize),
    TcPreciseEvent,
    PebsEnable,
    PebsMatrixVert,
}

impl Reg {
    /// The NetBurst register at `msr`, if there is one (an index in the ESCR range that names no
    /// ESCR is not a register: #GP).
    pub fn decode(msr: u32) -> Option<Reg> {
        let index = |base: u32| msr.checked_sub(base).filter(|&i| i < u32::from(COUNTERS)).map(|i| i as u8);
        match msr {
            MSR_TC_PRECISE_EVENT => Some(Reg::TcPreciseEvent),
            IA32_PEBS_ENABLE => Some(Reg::PebsEnable),
            MSR_PEBS_MATRIX_VERT => Some(Reg::PebsMatrixVert),
            _ => index(MSR_BPU_COUNTER0)
                .map(Reg::Counter)
                .or_else(|| index(MSR_BPU_CCCR0).map(Reg::Cccr))
                .or_else(|| escr_index(msr).map(Reg::Escr)),
        }
    }

    /// Is `msr` in one of the NetBurst register ranges (existing or not)?
    pub fn in_ranges(msr: u32) -> bool {
        (MSR_BPU_COUNTER0..MSR_BPU_COUNTER0 + u32::from(COUNTERS)).contains(&msr)
            || (MSR_BPU_CCCR0..MSR_BPU_CCCR0 + u32::from(COUNTERS)).contains(&msr)
            || (ESCR_FIRST..=ESCR_LAST).contains(&msr)
            || (MSR_TC_PRECISE_EVENT..=MSR_PEBS_MATRIX_VERT).contains(&msr)
    }
}

/// The index in [`ESCRS`] of the ESCR at `msr`.
pub fn escr_index(msr: u32) -> Option<usize> {
    ESCRS.iter().position(|e| e.msr == msr)
}

/// The SDM name of NetBurst register `msr`.
pub fn msr_name(msr: u32) -> Option<&'static str> {
    Some(match Reg::decode(msr)? {
        Reg::Counter(i) => COUNTER_DEFS[usize::from(i)].name,
        Reg::Cccr(i) => COUNTER_DEFS[usize::from(i)].cccr,
        Reg::Escr(e) => ESCRS[e].name,
        Reg::TcPreciseEvent => "MSR_TC_PRECISE_EVENT",
        Reg::PebsEnable => "IA32_PEBS_ENABLE",
        Reg::PebsMatrixVert => "MSR_PEBS_MATRIX_VERT",
    })
}

/// What a counter counts, as its CCCR and the ESCR it selects say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Selection {
    /// The ESCR's MSR.
    pub escr: u32,
    /// ESCR bits 30:25, the event class.
    pub event: u8,
    /// ESCR bits 24:9, the event mask.
    pub mask: u16,
}

/// A CCCR value, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cccr(pub u64);

impl Cccr {
    pub fn enabled(self) -> bool {
        self.0 & CCCR_ENABLE != 0
    }
    pub fn escr_select(self) -> usize {
        ((self.0 >> CCCR_ESCR_SELECT_SHIFT) & 7) as usize
    }
    /// SDM 18.16.2 active thread: 00 none, 01 single, 10 both, 11 any. emon runs one logical
    /// processor (T0; T1 is never active), so "single" and "any" count and the others never do.
    pub fn counts_with_one_thread(self) -> bool {
        matches!((self.0 >> CCCR_ACTIVE_THREAD_SHIFT) & 3, 0b01 | 0b11)
    }
    pub fn compare(self) -> bool {
        self.0 & CCCR_COMPARE != 0
    }
    pub fn complement(self) -> bool {
        self.0 & CCCR_COMPLEMENT != 0
    }
    pub fn threshold(self) -> u8 {
        ((self.0 >> CCCR_THRESHOLD_SHIFT) & 0xF) as u8
    }
    pub fn edge(self) -> bool {
        self.0 & CCCR_EDGE != 0
    }
    pub fn force_ovf(self) -> bool {
        self.0 & CCCR_FORCE_OVF != 0
    }
    pub fn ovf_pmi_t0(self) -> bool {
        self.0 & CCCR_OVF_PMI_T0 != 0
    }
    pub fn cascade(self) -> bool {
        self.0 & CCCR_CASCADE != 0
    }
}

/// The NetBurst registers of one vCPU (all 0 at reset, SDM 18.15.1 and 18.15.3, but
/// MSR_TC_PRECISE_EVENT as measured), and the counting state behind them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Regs {
    counter: [u64; COUNTERS as usize],
    cccr: [u64; COUNTERS as usize],
    escr: [u64; ESCRS.len()],
    tc_precise_event: u64,
    pebs_enable: u64,
    pebs_matrix_vert: u64,
    /// Counters whose CASCADE start came: their alternate overflowed since their CCCR was written.
    cascaded: u32,
    /// Counters that overflowed with OVF_PMI_T0: the PMI goes out at their next event (SDM
    /// 18.15.3, OVF_PMI: "the PMI is generated on the next event count after the counter has
    /// overflowed").
    pmi_armed: u32,
}

impl Default for Regs {
    fn default() -> Self {
        Regs {
            counter: [0; COUNTERS as usize],
            cccr: [0; COUNTERS as usize],
            escr: [0; ESCRS.len()],
            tc_precise_event: TC_PRECISE_EVENT_RESET,
            pebs_enable: 0,
            pebs_matrix_vert: 0,
            cascaded: 0,
            pmi_armed: 0,
        }
    }
}

/// What a WRMSR changed: counters to reprogram (bit i: counter i), and those whose value the guest
/// wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Changed {
    pub counters: u64,
    pub written: u64,
}

/// What [`Regs::add_events`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Added {
    pub overflowed: bool,
    /// A PMI is due now.
    pub pmi: bool,
    /// Counters a cascade started (bit i: counter i).
    pub started: u64,
}

fn bit(i: u8) -> u32 {
    1 << i
}

impl Regs {
    /// RDMSR.
    pub fn rdmsr(&self, r: Reg) -> u64 {
        match r {
            Reg::Counter(i) => self.counter[usize::from(i)],
            Reg::Cccr(i) => self.cccr[usize::from(i)],
            Reg::Escr(e) => self.escr[e],
            Reg::TcPreciseEvent => self.tc_precise_event,
            Reg::PebsEnable => self.pebs_enable,
            Reg::PebsMatrixVert => self.pebs_matrix_vert,
        }
    }

    /// WRMSR: bits the part ignores are dropped, ESCR bit 31 raises #GP (`None`, no change).
    pub fn wrmsr(&mut self, r: Reg, value: u64) -> Option<Changed> {
        let mut changed = Changed::default();
        match r {
            Reg::Counter(i) => {
                self.counter[usize::from(i)] = value & VALUE_MASK;
                self.pmi_armed &= !bit(i);
                changed.counters = 1 << i;
                changed.written = 1 << i;
            }
            Reg::Cccr(i) => {
                let v = value & !COUNTER_DEFS[usize::from(i)].cccr_ignored;
                let old = std::mem::replace(&mut self.cccr[usize::from(i)], v);
                // A CCCR write re-arms a cascade: the counter waits for its alternate again,
                // whatever value it wrote.
                let was_started = self.cascaded & bit(i) != 0;
                self.cascaded &= !bit(i);
                // Clearing OVF or OVF_PMI_T0 takes the overflow's pending PMI back (the SDM is
                // silent; the PMI belongs to the overflow software acknowledged or did not ask
                // an interrupt for).
                if Cccr(v).0 & CCCR_OVF == 0 || !Cccr(v).ovf_pmi_t0() {
                    self.pmi_armed &= !bit(i);
                }
                if old != v || was_started {
                    changed.counters = 1 << i;
                }
            }
            Reg::Escr(e) => {
                if value & ESCR_GP != 0 {
                    return None;
                }
                let v = value & !ESCRS[e].ignored;
                if std::mem::replace(&mut self.escr[e], v) != v {
                    let msr = ESCRS[e].msr;
                    changed.counters =
                        (0..COUNTERS).filter(|&i| self.selected_escr(i) == Some(msr)).fold(0, |m, i| m | 1 << i);
                }
            }
            Reg::TcPreciseEvent => self.tc_precise_event = value & TC_PRECISE_EVENT_BITS,
            Reg::PebsEnable => self.pebs_enable = value & PEBS_ENABLE_BITS,
            Reg::PebsMatrixVert => self.pebs_matrix_vert = value & PEBS_MATRIX_VERT_BITS,
        }
        Some(changed)
    }

    pub fn cccr(&self, i: u8) -> Cccr {
        Cccr(self.cccr[usize::from(i)])
    }

    pub fn value(&self, i: u8) -> u64 {
        self.counter[usize::from(i)]
    }

    /// Backend sync: set the value, no side effects.
    pub fn set_value(&mut self, i: u8, value: u64) {
        self.counter[usize::from(i)] = value & VALUE_MASK;
    }

    /// The ESCR counter `i`'s CCCR selects, if its block has one at that select value.
    pub fn selected_escr(&self, i: u8) -> Option<u32> {
        COUNTER_DEFS[usize::from(i)].escrs[self.cccr(i).escr_select()]
    }

    /// The ESCR value at `msr`.
    pub fn escr(&self, msr: u32) -> Option<u64> {
        escr_index(msr).map(|e| self.escr[e])
    }

    /// What counter `i` counts: its ESCR, event and mask (`None` if the select names no ESCR).
    pub fn selection(&self, i: u8) -> Option<Selection> {
        let msr = self.selected_escr(i)?;
        let v = self.escr(msr)?;
        Some(Selection {
            escr: msr,
            event: ((v >> ESCR_EVENT_SELECT_SHIFT) & 0x3F) as u8,
            mask: ((v >> ESCR_EVENT_MASK_SHIFT) & 0xFFFF) as u16,
        })
    }

    /// The ESCR's T0_USR and T0_OS (the T1 bits are stored and ignored: emon runs T0 only).
    pub fn t0_usr_os(&self, i: u8) -> (bool, bool) {
        let v = self.selected_escr(i).and_then(|m| self.escr(m)).unwrap_or(0);
        (v & ESCR_T0_USR != 0, v & ESCR_T0_OS != 0)
    }

    /// Is counter `i` counting: enabled, paired with an ESCR, counting with one active thread,
    /// and (with CASCADE) started by its alternate's overflow (SDM 18.15.5.3, 18.15.5.6).
    pub fn counting(&self, i: u8) -> bool {
        let c = self.cccr(i);
        c.enabled()
            && self.selected_escr(i).is_some()
            && c.counts_with_one_thread()
            && (!c.cascade() || self.cascaded & bit(i) != 0)
    }

    /// Events until counter `i` must be looked at event by event: the wrap past 2^40 - 1, or the
    /// next event when that event overflows anyway (FORCE_OVF) or raises an armed PMI.
    pub fn distance(&self, i: u8) -> u64 {
        if self.cccr(i).force_ovf() || self.pmi_armed & bit(i) != 0 {
            1
        } else {
            (1 << WIDTH) - self.counter[usize::from(i)]
        }
    }

    /// Adds `n` events to counter `i` (SDM 18.15.3): on a wrap past 2^40 - 1, or on every
    /// increment with FORCE_OVF, CCCR.OVF sets, counters cascading from this one start, and with
    /// OVF_PMI_T0 a PMI arms, to go out at the counter's next event.
    pub fn add_events(&mut self, i: u8, n: u64) -> Added {
        let mut out = Added::default();
        if n == 0 {
            return out;
        }
        let c = self.cccr(i);
        let slot = usize::from(i);
        let sum = u128::from(self.counter[slot]) + u128::from(n);
        let wrapped = sum >> WIDTH != 0;
        self.counter[slot] = (sum as u64) & VALUE_MASK;
        // Events after the first overflow in this batch: a real wrap leaves `value` of them, a
        // forced overflow happens at the first event and leaves n - 1.
        let after = if c.force_ovf() {
            n - 1
        } else if wrapped {
            self.counter[slot]
        } else {
            0
        };
        if self.pmi_armed & bit(i) != 0 {
            out.pmi = true;
            self.pmi_armed &= !bit(i);
        }
        if wrapped || c.force_ovf() {
            out.overflowed = true;
            self.cccr[slot] |= CCCR_OVF;
            if c.ovf_pmi_t0() {
                if after > 0 {
                    out.pmi = true;
                } else {
                    self.pmi_armed |= bit(i);
                }
            }
            for j in 0..COUNTERS {
                let cj = self.cccr(j);
                if COUNTER_DEFS[usize::from(j)].cascade_from == i
                    && cj.cascade()
                    && cj.enabled()
                    && self.cascaded & bit(j) == 0
                {
                    self.cascaded |= bit(j);
                    out.started |= 1 << j;
                }
            }
        }
        out
    }

    /// The configurations of enabled counters (and PEBS) that emon does not model.
    pub fn unmodelled(&self) -> Unmodelled {
        let mut u = Unmodelled::NONE;
        let mut add = |on: bool, what: Unmodelled| {
            if on {
                u = u.union(what);
            }
        };
        add(self.pebs_enable & PEBS_ENABLE_MY_THR != 0, Unmodelled::NETBURST_PEBS);
        for i in (0..COUNTERS).filter(|&i| self.cccr(i).enabled()) {
            let c = self.cccr(i);
            add(self.selected_escr(i).is_none(), Unmodelled::UNPAIRED_CCCR);
            add(c.0 & CCCR_OVF_PMI_T1 != 0, Unmodelled::PMI_T1);
            let ext = match i {
                12 | 15 => CCCR_EXT_CASCADE_IQ0_IQ3,
                16 | 17 => CCCR_EXT_CASCADE_IQ4_IQ5,
                _ => 0,
            };
            add(c.0 & ext != 0, Unmodelled::EXTENDED_CASCADE);
        }
        add(self.escr.iter().any(|v| v & ESCR_TAG_ENABLE != 0), Unmodelled::UOP_TAGGING);
        u
    }
}

/// MSR_DEBUGCTLA (SDM 17.5.1): LBR, BTF, TR, BTS, BTINT, BTS_OFF_OS, BTS_OFF_USR; the Pentium 4
/// 3.00 GHz #GPs on bits 63:7 (VirtualBox CPU database).
const DEBUGCTLA_VALID: u64 = 0x7F;
/// MSR_DEBUGCTLA's TR, BTS, BTINT, BTS_OFF_OS and BTS_OFF_USR (bits 6:2): branch trace messages
/// and BTS, which emon stores and does not produce.
const DEBUGCTLA_BRANCH_TRACE: u64 = 0x7C;

/// The NetBurst PMU model: its register file, and the two architectural-looking registers it
/// has too, MSR_DEBUGCTLA at IA32_DEBUGCTL's address and IA32_DS_AREA (SDM 17.5.1, 18.15.7).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NetBurstPmu {
    regs: Regs,
    debugctla: u64,
    ds_area: u64,
}

impl NetBurstPmu {
    /// The register file.
    pub fn regs(&self) -> &Regs {
        &self.regs
    }

    fn index(id: CounterId) -> Option<u8> {
        match id {
            CounterId::NetBurst(i) if i < COUNTERS => Some(i),
            _ => None,
        }
    }
}

impl PmuOps for NetBurstPmu {
    fn claims(&self, msr: u32) -> bool {
        Reg::in_ranges(msr) || msr == msr::IA32_DEBUGCTL || msr == msr::IA32_DS_AREA
    }

    fn rdmsr(&self, msr: u32) -> Result<u64, GpFault> {
        match msr {
            msr::IA32_DEBUGCTL => Ok(self.debugctla),
            msr::IA32_DS_AREA => Ok(self.ds_area),
            _ => Reg::decode(msr).map(|r| self.regs.rdmsr(r)).ok_or(GpFault),
        }
    }

    fn wrmsr(&mut self, s: &mut Shared, msr: u32, value: u64) -> Result<(), GpFault> {
        match msr {
            msr::IA32_DEBUGCTL if value & !DEBUGCTLA_VALID == 0 => self.debugctla = value,
            msr::IA32_DS_AREA if counter::is_canonical_48(value) => self.ds_area = value,
            msr::IA32_DEBUGCTL | msr::IA32_DS_AREA => return Err(GpFault),
            _ => {
                let r = Reg::decode(msr).ok_or(GpFault)?;
                let changed = self.regs.wrmsr(r, value).ok_or(GpFault)?;
                s.mark(changed.counters, ALL_COUNTERS);
                s.reprogram.written |= changed.written;
            }
        }
        Ok(())
    }

    fn reg_name(&self, msr: u32) -> Option<String> {
        match msr {
            msr::IA32_DEBUGCTL | msr::IA32_DS_AREA => msr::msr_name(msr),
            _ => msr_name(msr).map(str::to_string),
        }
    }

    fn counter_ids(&self) -> Vec<CounterId> {
        (0..COUNTERS).map(CounterId::NetBurst).collect()
    }

    fn exists(&self, id: CounterId) -> bool {
        Self::index(id).is_some()
    }

    /// SDM 18.15.3's qualification order: the ESCR's event and T0 privilege flags, the CCCR's
    /// threshold filter (compare, complement, edge: the filter applies to the per-instruction
    /// count, as CMASK does), and whether it counts.
    fn counter(&self, id: CounterId) -> CounterState {
        let mut s = CounterState::absent(id);
        let Some(i) = Self::index(id) else { return s };
        let nb = &self.regs;
        let c = nb.cccr(i);
        let sel = nb.selection(i);
        (s.usr, s.os) = nb.t0_usr_os(i);
        s.event_select = sel.map_or(0, |e| e.event);
        s.semantics = sel.map_or(Semantics::Unsupported, semantics);
        // Compare: count 1 when the event count exceeds the threshold (or, complemented, does not).
        if c.compare() {
            s.cmask = c.threshold() + 1;
            s.inv = c.complement();
            s.edge = c.edge();
        }
        s.int = c.ovf_pmi_t0();
        s.enabled = c.enabled();
        s.counting = nb.counting(i);
        s.value = nb.value(i);
        s.width = WIDTH;
        s
    }

    fn distance_to_overflow(&self, id: CounterId) -> u64 {
        Self::index(id).map_or(u64::MAX, |i| self.regs.distance(i))
    }

    fn add_events(&mut self, s: &mut Shared, id: CounterId, n: u64) -> bool {
        let Some(i) = Self::index(id) else { return false };
        let added = self.regs.add_events(i, n);
        s.pmi_pending |= added.pmi;
        s.mark(added.started, ALL_COUNTERS);
        added.overflowed
    }

    fn set_value(&mut self, id: CounterId, value: u64) {
        if let Some(i) = Self::index(id) {
            self.regs.set_value(i, value);
        }
    }

    /// NetBurst has no freeze-on-PMI controls (MSR_DEBUGCTLA has none).
    fn pmi_delivered(&mut self, _s: &mut Shared) {}

    /// SDM Vol. 2B "RDPMC": ECX\[30:0\] selects counter 0-17, ECX\[31\] a fast read.
    fn rdpmc(&self, ecx: u32) -> Result<u64, GpFault> {
        let index = u8::try_from(ecx & !super::rdpmc::RDPMC_FAST).ok().filter(|&i| i < COUNTERS);
        Ok(super::rdpmc::fast(ecx, self.regs.value(index.ok_or(GpFault)?)))
    }

    fn event_name(&self, id: CounterId) -> String {
        let Some(sel) = Self::index(id).and_then(|i| self.regs.selection(i)) else { return id.to_string() };
        format!("{} event {:#04x}", msr_name(sel.escr).unwrap_or("ESCR"), sel.event)
    }

    fn dump(&self, sh: &Shared, out: &mut String) {
        self.dump_registers(sh, out);
    }

    fn unmodelled(&self) -> Unmodelled {
        let mut u = self.regs.unmodelled();
        for (bits, what) in [
            (msr::DEBUGCTL_LBR, Unmodelled::DEBUGCTL_LBR),
            (msr::DEBUGCTL_BTF, Unmodelled::DEBUGCTL_BTF),
            (DEBUGCTLA_BRANCH_TRACE, Unmodelled::BRANCH_TRACE_STORE),
        ] {
            if self.debugctla & bits != 0 {
                u = u.union(what);
            }
        }
        u
    }

    fn debugctl(&self) -> u64 {
        self.debugctla
    }

    fn ds_area(&self) -> u64 {
        self.ds_area
    }
}

impl NetBurstPmu {
    /// [`super::Pmu::dump`] under NetBurst: DEBUGCTLA, MISC_ENABLE, every ESCR that holds
    /// something, and each counter with its CCCR.
    fn dump_registers(&self, sh: &Shared, out: &mut String) {
        use super::dump::{counter_text, flags, DEBUGCTL_FLAGS, MISC_ENABLE_FLAGS};
        use std::fmt::Write as _;
        let nb = &self.regs;
        let _ = writeln!(out, "NetBurst PMU: {} counters x {} bits, {} ESCRs", COUNTERS, WIDTH, ESCRS.len());
        let mut line = |name: &str, msr: u32, value: u64, text: String| {
            let text = format!("{name:<27} ({msr:#05x}) = {value:#018x}  {text}");
            let _ = writeln!(out, "{}", text.trim_end());
        };
        line("IA32_DEBUGCTL", msr::IA32_DEBUGCTL, self.debugctla, flags(self.debugctla, &DEBUGCTL_FLAGS[..2]));
        line("IA32_MISC_ENABLE", msr::IA32_MISC_ENABLE, sh.misc_enable, flags(sh.misc_enable, MISC_ENABLE_FLAGS));
        for m in [MSR_TC_PRECISE_EVENT, IA32_PEBS_ENABLE, MSR_PEBS_MATRIX_VERT] {
            let r = Reg::decode(m).expect("a NetBurst register");
            line(msr_name(m).unwrap_or_default(), m, nb.rdmsr(r), String::new());
        }
        for e in ESCRS {
            let v = nb.escr(e.msr).unwrap_or(0);
            if v != 0 {
                line(e.name, e.msr, v, escr_text(v));
            }
        }
        for i in 0..COUNTERS {
            let d = &COUNTER_DEFS[usize::from(i)];
            let cccr = nb.cccr(i).0;
            let s = self.counter(CounterId::NetBurst(i));
            line(d.cccr, MSR_BPU_CCCR0 + u32::from(i), cccr, cccr_text(i, cccr));
            line(d.name, MSR_BPU_COUNTER0 + u32::from(i), s.value, counter_text(s.counting, s.enabled, nb.distance(i)));
        }
    }
}

/// A NetBurst CCCR, decoded (SDM Figure 18-48).
fn cccr_text(i: u8, v: u64) -> String {
    let c = Cccr(v);
    let escr = COUNTER_DEFS[usize::from(i)].escrs[c.escr_select()];
    let mut text = format!(
        "ESCR select {} ({}) active thread {}",
        c.escr_select(),
        escr.and_then(msr_name).unwrap_or("no ESCR"),
        (v >> CCCR_ACTIVE_THREAD_SHIFT) & 3
    );
    if c.compare() {
        let _ = std::fmt::Write::write_fmt(&mut text, format_args!(" COMPARE threshold={}", c.threshold()));
    }
    let named = [
        (CCCR_ENABLE, "ENABLE"),
        (CCCR_COMPLEMENT, "COMPLEMENT"),
        (CCCR_EDGE, "EDGE"),
        (CCCR_FORCE_OVF, "FORCE_OVF"),
        (CCCR_OVF_PMI_T0, "OVF_PMI_T0"),
        (CCCR_OVF_PMI_T1, "OVF_PMI_T1"),
        (CCCR_CASCADE, "CASCADE"),
        (CCCR_OVF, "OVF"),
    ];
    super::dump::with_flags(text, v, &named)
}

/// A NetBurst ESCR, decoded (SDM Figure 18-47).
fn escr_text(v: u64) -> String {
    let text = format!(
        "event select=0x{:02x} event mask=0x{:04x}",
        (v >> ESCR_EVENT_SELECT_SHIFT) & 0x3F,
        (v >> ESCR_EVENT_MASK_SHIFT) & 0xFFFF
    );
    let named = [
        (ESCR_T0_OS, "T0_OS"),
        (ESCR_T0_USR, "T0_USR"),
        (ESCR_T1_OS, "T1_OS"),
        (ESCR_T1_USR, "T1_USR"),
        (ESCR_TAG_ENABLE, "TAG_ENABLE"),
    ];
    super::dump::with_flags(text, v, &named)
}

/// Every counter, in the reprogramming marks' layout (bit i: counter i).
const ALL_COUNTERS: u64 = (1 << COUNTERS) - 1;

/// What the NetBurst event `s` selects counts (SDM Table 19-33): instr_retired NBOGUSNTAG is the
/// instructions, mispred_branch_retired NBOGUS the mispredicted branches, branch_retired the
/// branches of the mask's (taken, mispredicted) classes, retired_branch_type and
/// retired_mispred_branch_type the near branches of the mask's types, global_power_events
/// RUNNING the core cycles. Bogus (wrong-path) and tagged µops never occur where emon runs.
pub fn semantics(s: Selection) -> Semantics {
    let Some(e) = event(s) else { return Semantics::Unsupported };
    let bit0 = s.mask & 1 != 0;
    match e.name {
        "instr_retired" if bit0 => Semantics::Instructions,
        "mispred_branch_retired" if bit0 => Semantics::Branches(BranchFilter::MISSES),
        "global_power_events" if bit0 => Semantics::CoreCycles,
        "branch_retired" if s.mask & 0xF != 0 => {
            Semantics::Branches(BranchFilter { kinds: BranchFilter::ALL_KINDS, outcomes: (s.mask & 0xF) as u8 })
        }
        "retired_branch_type" | "retired_mispred_branch_type" if s.mask & 0x1E != 0 => {
            let outcomes = if e.event == 0x05 { BranchFilter::MISPREDICTED } else { BranchFilter::ALL_OUTCOMES };
            Semantics::Branches(BranchFilter { kinds: branch_types(s.mask), outcomes })
        }
        _ => Semantics::Nothing,
    }
}

/// The branch kinds retired_branch_type's mask selects (SDM Table 19-33): CONDITIONAL (bit 1),
/// CALL (bit 2: direct and indirect), RETURN (bit 3), INDIRECT (bit 4: indirect calls and jumps).
/// Direct JMPs and far transfers are none of these types.
fn branch_types(mask: u16) -> u8 {
    let kind = BranchFilter::kind_bit;
    [
        (1, kind(BranchType::Jcc)),
        (2, kind(BranchType::NearRelCall) | kind(BranchType::NearIndCall)),
        (3, kind(BranchType::NearRet)),
        (4, kind(BranchType::NearIndCall) | kind(BranchType::NearIndJmp)),
    ]
    .iter()
    .filter(|(bit, _)| mask >> bit & 1 != 0)
    .fold(0, |m, (_, kinds)| m | kinds)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_map_to_what_they_count() {
        let sel = |escr, event, mask| Selection { escr, event, mask };
        assert_eq!(semantics(sel(0x3B8, 2, 1)), Semantics::Instructions);
        assert_eq!(semantics(sel(0x3B9, 2, 0b1110)), Semantics::Nothing, "bogus and tagged");
        assert_eq!(semantics(sel(0x3CC, 2, 1)), Semantics::Unsupported, "instr_retired is a CRU_ESCR0/1 event");
        assert_eq!(semantics(sel(0x3B9, 3, 1)), Semantics::Branches(BranchFilter::MISSES));
        assert_eq!(semantics(sel(0x3A3, 0x13, 1)), Semantics::CoreCycles);
        assert_eq!(
            semantics(sel(0x3CD, 6, 0xC)),
            Semantics::Branches(BranchFilter { kinds: BranchFilter::ALL_KINDS, outcomes: 0xC })
        );
        assert_eq!(semantics(sel(0x3A0, 5, 1)), Semantics::Unsupported);
        let Semantics::Branches(calls) = semantics(sel(0x3C2, 4, 1 << 2 | 1 << 4)) else { panic!() };
        assert!(calls.counts(BranchType::NearIndCall, true, false), "an indirect call is both");
        assert!(calls.counts(BranchType::NearIndJmp, true, false));
        assert!(!calls.counts(BranchType::NearRelJmp, true, false), "a direct JMP has none of the types");
        assert!(!calls.counts(BranchType::NearRet, true, false));
        assert_eq!(semantics(sel(0x3C2, 4, 1)), Semantics::Nothing, "bit 0 alone selects no type");
        let Semantics::Branches(mispred) = semantics(sel(0x3C3, 5, 1 << 1)) else { panic!() };
        assert!(mispred.counts(BranchType::Jcc, false, true) && !mispred.counts(BranchType::Jcc, true, false));
    }

    const CRU_ESCR0: u32 = 0x3B8;
    /// instr_retired (event 2) NBOGUSNTAG on CRU_ESCR0, T0_OS and T0_USR.
    const INSTR_RETIRED: u64 = 2 << 25 | 1 << 9 | ESCR_T0_OS | ESCR_T0_USR;
    /// IQ_CCCR enable, ESCR select 4 (CRU_ESCR0), active thread "any".
    const IQ_CCCR: u64 = CCCR_ENABLE | 4 << 13 | 3 << 16;

    fn wr(r: &mut Regs, msr: u32, v: u64) -> Option<Changed> {
        r.wrmsr(Reg::decode(msr).expect("a NetBurst register"), v)
    }

    #[test]
    fn decodes_every_register_and_the_holes() {
        assert_eq!(ESCRS.len(), 45);
        assert_eq!(Reg::decode(0x300), Some(Reg::Counter(0)));
        assert_eq!(Reg::decode(0x311), Some(Reg::Counter(17)));
        assert_eq!(Reg::decode(0x312), None);
        assert_eq!(Reg::decode(0x371), Some(Reg::Cccr(17)));
        for hole in [0x3BF, 0x3C6, 0x3C7, 0x3CE, 0x3DF] {
            assert_eq!(Reg::decode(hole), None, "{hole:#x}");
            assert!(Reg::in_ranges(hole));
        }
        assert_eq!(msr_name(0x3E1), Some("MSR_CRU_ESCR5"));
        assert_eq!(msr_name(0x30C), Some("MSR_IQ_COUNTER0"));
        // Every ESCR a counter can select exists.
        for d in &COUNTER_DEFS {
            for m in d.escrs.iter().flatten() {
                assert!(escr_index(*m).is_some(), "{} -> {m:#x}", d.name);
            }
        }
    }

    #[test]
    fn write_masks_as_measured() {
        let mut r = Regs::default();
        assert_eq!(r.rdmsr(Reg::TcPreciseEvent), 0xFC00);
        wr(&mut r, 0x300, u64::MAX).unwrap();
        assert_eq!(r.value(0), 0xFF_FFFF_FFFF);
        wr(&mut r, 0x360, u64::MAX).unwrap();
        assert_eq!(r.cccr(0).0, 0xFFFF_F000);
        wr(&mut r, 0x36C, u64::MAX).unwrap();
        assert_eq!(r.cccr(12).0, 0xFFFF_F800);
        wr(&mut r, 0x370, u64::MAX).unwrap();
        assert_eq!(r.cccr(16).0, 0xFFFF_FF00);
        assert_eq!(wr(&mut r, CRU_ESCR0, 1 << 31), None, "ESCR bit 31 #GPs");
        assert_eq!(r.escr(CRU_ESCR0), Some(0));
        wr(&mut r, CRU_ESCR0, 0xFFFF_FFFF_7FFF_FFFF).unwrap();
        assert_eq!(r.escr(CRU_ESCR0), Some(0x7FFF_FFFF & !0x71FE_01F0));
        wr(&mut r, 0x3BA, 0x7FFF_FFFF).unwrap();
        assert_eq!(r.escr(0x3BA), Some(0), "IQ_ESCR0 ignores every write on model 4");
    }

    #[test]
    fn counts_when_enabled_paired_and_active() {
        let mut r = Regs::default();
        wr(&mut r, CRU_ESCR0, INSTR_RETIRED).unwrap();
        let changed = wr(&mut r, 0x36C, IQ_CCCR).unwrap();
        assert_eq!(changed.counters, 1 << 12);
        assert!(r.counting(12));
        assert_eq!(r.selection(12), Some(Selection { escr: CRU_ESCR0, event: 2, mask: 1 }));
        assert_eq!(r.t0_usr_os(12), (true, true));
        // An ESCR write marks the counters that select it.
        assert_eq!(wr(&mut r, CRU_ESCR0, INSTR_RETIRED & !ESCR_T0_USR).unwrap().counters, 1 << 12);
        // Active thread "both" never counts with one logical processor; "none" neither.
        wr(&mut r, 0x36C, IQ_CCCR & !(3 << 16) | 2 << 16).unwrap();
        assert!(!r.counting(12));
        wr(&mut r, 0x36C, IQ_CCCR & !(3 << 16) | 1 << 16).unwrap();
        assert!(r.counting(12));
        // Select 7 names no ESCR in the IQ block.
        wr(&mut r, 0x36C, IQ_CCCR | 7 << 13).unwrap();
        assert!(!r.counting(12));
        assert!(r.unmodelled().contains(Unmodelled::UNPAIRED_CCCR));
    }

    #[test]
    fn overflow_sets_ovf_and_the_pmi_comes_at_the_next_event() {
        let mut r = Regs::default();
        wr(&mut r, CRU_ESCR0, INSTR_RETIRED).unwrap();
        wr(&mut r, 0x36C, IQ_CCCR | CCCR_OVF_PMI_T0).unwrap();
        wr(&mut r, 0x30C, VALUE_MASK - 1).unwrap();
        assert_eq!(r.distance(12), 2);
        assert_eq!(r.add_events(12, 1), Added::default());
        let a = r.add_events(12, 1);
        assert!(a.overflowed && !a.pmi);
        assert_ne!(r.cccr(12).0 & CCCR_OVF, 0);
        assert_eq!(r.distance(12), 1);
        assert!(r.add_events(12, 1).pmi);
        assert_eq!(r.value(12), 1);
        // Clearing OVF takes an armed PMI back.
        wr(&mut r, 0x30C, VALUE_MASK).unwrap();
        assert!(r.add_events(12, 1).overflowed);
        wr(&mut r, 0x36C, IQ_CCCR | CCCR_OVF_PMI_T0).unwrap();
        assert!(!r.add_events(12, 1).pmi);
        // Past the overflow in one batch: the PMI is due at once.
        wr(&mut r, 0x30C, VALUE_MASK).unwrap();
        let a = r.add_events(12, 3);
        assert!(a.overflowed && a.pmi);
    }

    #[test]
    fn force_ovf_overflows_on_every_increment() {
        let mut r = Regs::default();
        wr(&mut r, CRU_ESCR0, INSTR_RETIRED).unwrap();
        wr(&mut r, 0x36C, IQ_CCCR | CCCR_FORCE_OVF | CCCR_OVF_PMI_T0).unwrap();
        assert_eq!(r.distance(12), 1);
        let a = r.add_events(12, 1);
        assert!(a.overflowed && !a.pmi);
        let a = r.add_events(12, 1);
        assert!(a.overflowed && a.pmi);
        assert_eq!(r.value(12), 2);
    }

    #[test]
    fn cascade_starts_the_alternate_counter() {
        let mut r = Regs::default();
        wr(&mut r, CRU_ESCR0, INSTR_RETIRED).unwrap();
        wr(&mut r, 0x36C, IQ_CCCR).unwrap();
        // IQ_COUNTER2 through CRU_ESCR1, cascaded from IQ_COUNTER0.
        wr(&mut r, 0x3B9, INSTR_RETIRED).unwrap();
        wr(&mut r, 0x36E, IQ_CCCR | CCCR_CASCADE).unwrap();
        assert!(!r.counting(14));
        wr(&mut r, 0x30C, VALUE_MASK).unwrap();
        let a = r.add_events(12, 1);
        assert_eq!(a.started, 1 << 14);
        assert!(r.counting(14));
        // Rewriting the CCCR, even with the same value, re-arms the cascade and says so.
        assert_eq!(wr(&mut r, 0x36E, IQ_CCCR | CCCR_CASCADE).unwrap().counters, 1 << 14);
        assert!(!r.counting(14));
        // Counter 16 cascades from 14, not from 12.
        assert_eq!(COUNTER_DEFS[16].cascade_from, 14);
        assert_eq!(COUNTER_DEFS[17].cascade_from, 15);
    }
}
