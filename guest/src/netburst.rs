//! The NetBurst PMU of Pentium 4 and Xeon (SDM Vol. 3B 18.15, 18.16): register addresses and
//! fields, and how a guest tells that it runs on one. Guests of the architectural PMU skip there.
use crate::cpu::{cpuid, rdmsr_safe, vendor};
use crate::pmu::IA32_MISC_ENABLE;

/// Counter i is MSR 0x300 + i, its CCCR 0x360 + i (SDM Table 18-63).
pub const MSR_BPU_COUNTER0: u32 = 0x300;
pub const MSR_BPU_CCCR0: u32 = 0x360;
pub const COUNTERS: u32 = 18;
/// Counter indices by name (SDM Table 18-63).
pub const BPU_COUNTER0: u32 = 0;
pub const BPU_COUNTER2: u32 = 2;
pub const IQ_COUNTER0: u32 = 12;
pub const IQ_COUNTER1: u32 = 13;
pub const IQ_COUNTER2: u32 = 14;
pub const IQ_COUNTER4: u32 = 16;
/// Some ESCRs (SDM Table 18-63) and the ESCR select value that names them from their counters.
pub const MSR_FSB_ESCR0: u32 = 0x3A2;
pub const MSR_FSB_ESCR1: u32 = 0x3A3;
pub const FSB_ESCR_SELECT: u64 = 6;
pub const MSR_CRU_ESCR0: u32 = 0x3B8;
pub const MSR_CRU_ESCR1: u32 = 0x3B9;
pub const CRU_ESCR01_SELECT: u64 = 4;
pub const MSR_CRU_ESCR2: u32 = 0x3CC;
pub const MSR_CRU_ESCR3: u32 = 0x3CD;
pub const CRU_ESCR23_SELECT: u64 = 5;
pub const MSR_TC_PRECISE_EVENT: u32 = 0x3F0;
pub const IA32_PEBS_ENABLE: u32 = 0x3F1;
pub const MSR_PEBS_MATRIX_VERT: u32 = 0x3F2;

// CCCR fields (SDM Figure 18-48).
pub const CCCR_ENABLE: u64 = 1 << 12;
pub const CCCR_ESCR_SELECT_SHIFT: u32 = 13;
/// Active thread "any" (11B): count whichever logical processor runs.
pub const CCCR_ACTIVE_THREAD_ANY: u64 = 3 << 16;
pub const CCCR_COMPARE: u64 = 1 << 18;
pub const CCCR_COMPLEMENT: u64 = 1 << 19;
pub const CCCR_THRESHOLD_SHIFT: u32 = 20;
pub const CCCR_EDGE: u64 = 1 << 24;
pub const CCCR_FORCE_OVF: u64 = 1 << 25;
pub const CCCR_OVF_PMI_T0: u64 = 1 << 26;
pub const CCCR_OVF_PMI_T1: u64 = 1 << 27;
pub const CCCR_CASCADE: u64 = 1 << 30;
pub const CCCR_OVF: u64 = 1 << 31;

// ESCR fields (SDM Figure 18-47).
pub const ESCR_T1_USR: u64 = 1 << 0;
pub const ESCR_T1_OS: u64 = 1 << 1;
pub const ESCR_T0_USR: u64 = 1 << 2;
pub const ESCR_T0_OS: u64 = 1 << 3;
pub const ESCR_TAG_ENABLE: u64 = 1 << 4;
pub const ESCR_EVENT_MASK_SHIFT: u32 = 9;
pub const ESCR_EVENT_SELECT_SHIFT: u32 = 25;

/// The events emon counts (SDM Table 19-33): event select and event-mask bits.
pub const EVENT_INSTR_RETIRED: u64 = 0x02;
pub const INSTR_RETIRED_NBOGUSNTAG: u64 = 1 << 0;
pub const INSTR_RETIRED_NBOGUSTAG: u64 = 1 << 1;
pub const EVENT_MISPRED_BRANCH_RETIRED: u64 = 0x03;
pub const EVENT_BRANCH_RETIRED: u64 = 0x06;
pub const BRANCH_RETIRED_MMNP: u64 = 1 << 0;
pub const BRANCH_RETIRED_MMNM: u64 = 1 << 1;
pub const BRANCH_RETIRED_MMTP: u64 = 1 << 2;
pub const BRANCH_RETIRED_MMTM: u64 = 1 << 3;
pub const EVENT_GLOBAL_POWER_EVENTS: u64 = 0x13;
pub const GLOBAL_POWER_RUNNING: u64 = 1 << 0;

/// An ESCR value: `event` with `mask`, counting at `os` (CPL 0) and `usr` (CPL > 0) on thread 0.
pub const fn escr(event: u64, mask: u64, os: bool, usr: bool) -> u64 {
    event << ESCR_EVENT_SELECT_SHIFT
        | mask << ESCR_EVENT_MASK_SHIFT
        | if os { ESCR_T0_OS } else { 0 }
        | if usr { ESCR_T0_USR } else { 0 }
}

/// A CCCR value that enables the counter through ESCR select `select`, active thread "any".
pub const fn cccr(select: u64) -> u64 {
    CCCR_ENABLE | select << CCCR_ESCR_SELECT_SHIFT | CCCR_ACTIVE_THREAD_ANY
}

/// The counters are 40 bits wide (SDM 18.15.2).
pub const COUNTER_MASK: u64 = (1 << 40) - 1;

/// Is this a NetBurst processor with its PMU: GenuineIntel family 0FH with IA32_MISC_ENABLE[7]
/// (performance monitoring available), as Linux's `p4` driver decides?
pub fn present() -> bool {
    let family = (cpuid(1, 0).eax >> 8) & 0xF;
    &vendor() == b"GenuineIntel" && family == 0xF && rdmsr_safe(IA32_MISC_ENABLE).is_ok_and(|v| v & (1 << 7) != 0)
}
