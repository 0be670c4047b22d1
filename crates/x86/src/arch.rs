//! Architectural facts a VMM and its counting backends share, one home each: exception vectors
//! (SDM Vol. 3A 6.3.1, Table 6-1) and the non-PMU MSRs they touch (SDM Vol. 4, Table 2-2).

/// #DB, the debug exception: single-step traps and instruction breakpoints.
pub const DB_VECTOR: u8 = 1;
/// #BP, the breakpoint exception INT3 raises.
pub const BP_VECTOR: u8 = 3;
/// #UD, the invalid-opcode exception.
pub const UD_VECTOR: u8 = 6;
/// #GP, the general-protection exception.
pub const GP_VECTOR: u8 = 13;
/// #PF, the page-fault exception.
pub const PF_VECTOR: u8 = 14;

/// IA32_TSC, the time-stamp counter.
pub const IA32_TSC: u32 = 0x10;
/// IA32_TSC_DEADLINE: the local APIC timer fires when the TSC reaches it (SDM Vol. 3A 10.5.4.1).
pub const IA32_TSC_DEADLINE: u32 = 0x6E0;
/// IA32_TSC_AUX: what RDTSCP returns in ECX.
pub const IA32_TSC_AUX: u32 = 0xC000_0103;
