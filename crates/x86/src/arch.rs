//! Architectural facts a VMM and its counting backends share, one home each: exception vectors
//! (SDM Vol. 3A 6.3.1, Table 6-1) and the non-PMU MSRs they touch (SDM Vol. 4, Table 2-2).

/// #DB, the debug exception: single-step traps and instruction breakpoints.
pub const DB_VECTOR: u8 = 1;
/// RFLAGS.TF, the trap flag: a single-step #DB after each instruction; RFLAGS.IF, maskable
/// interrupts let in (SDM Vol. 1 3.4.3.3).
pub const RFLAGS_TF: u64 = 1 << 8;
pub const RFLAGS_IF: u64 = 1 << 9;
/// DR6.BS, set by a single-step trap (SDM Vol. 3B 17.2.3); DR6's other status bits stay as
/// they were (the CPU never clears them).
pub const DR6_BS: u64 = 1 << 14;
/// #DE, the divide error.
pub const DE_VECTOR: u8 = 0;
/// The non-maskable interrupt.
pub const NMI_VECTOR: u8 = 2;
/// #BP, the breakpoint exception INT3 raises.
pub const BP_VECTOR: u8 = 3;
/// #UD, the invalid-opcode exception.
pub const UD_VECTOR: u8 = 6;
/// #NM, the device-not-available exception.
pub const NM_VECTOR: u8 = 7;
/// #NP, segment not present (of an IDT gate, too).
pub const NP_VECTOR: u8 = 11;
/// #GP, the general-protection exception.
pub const GP_VECTOR: u8 = 13;
/// #PF, the page-fault exception.
pub const PF_VECTOR: u8 = 14;

/// The error code exception `vector` carries when an instruction raises it on an ordinary
/// operand (SDM Vol. 3A 6.15): none for #DE, #UD, #NM, #MF and #XM; 0 for #SS, #GP and #AC (a
/// memory operand, an alignment check). `None` for any other vector, whose code depends on more
/// than the vector (#PF's on the access, a segment fault's on the selector).
pub fn plain_error_code(vector: u32) -> Option<Option<u32>> {
    match vector {
        0 | 6 | 7 | 16 | 19 => Some(None),
        12 | 13 | 17 => Some(Some(0)),
        _ => None,
    }
}

/// IA32_TSC, the time-stamp counter.
pub const IA32_TSC: u32 = 0x10;
/// IA32_TSC_DEADLINE: the local APIC timer fires when the TSC reaches it (SDM Vol. 3A 10.5.4.1).
pub const IA32_TSC_DEADLINE: u32 = 0x6E0;
/// IA32_TSC_ADJUST: writes move IA32_TSC by the same amount (SDM Vol. 3B 18.17.3).
pub const IA32_TSC_ADJUST: u32 = 0x3B;

/// IA32_APIC_BASE: where the local APIC's xAPIC page is, EN (the APIC on) and EXTD (x2APIC mode,
/// which has no page) (SDM Vol. 3A 11.4.4, 11.12.1).
pub const IA32_APIC_BASE: u32 = 0x1B;
pub const APIC_BASE_EXTD: u64 = 1 << 10;
pub const APIC_BASE_EN: u64 = 1 << 11;

/// IA32_TSC_AUX: what RDTSCP returns in ECX.
pub const IA32_TSC_AUX: u32 = 0xC000_0103;
/// IA32_EFER: SCE (SYSCALL enable), LME/LMA (IA-32e mode), NXE.
pub const IA32_EFER: u32 = 0xC000_0080;
/// IA32_STAR, IA32_LSTAR, IA32_CSTAR, IA32_FMASK: SYSCALL's and SYSRET's selectors, targets and
/// RFLAGS mask (SDM Vol. 3A 5.8.8 "Fast System Calls in 64-Bit Mode").
pub const IA32_STAR: u32 = 0xC000_0081;
pub const IA32_LSTAR: u32 = 0xC000_0082;
pub const IA32_CSTAR: u32 = 0xC000_0083;
pub const IA32_FMASK: u32 = 0xC000_0084;
/// IA32_KERNEL_GS_BASE: what SWAPGS exchanges with GS's base.
pub const IA32_KERNEL_GS_BASE: u32 = 0xC000_0102;
/// EFER.SCE.
pub const EFER_SCE: u64 = 1;
/// CR0.EM and CR0.TS: x87 emulation and task switched (FXSAVE/FXRSTOR fault on either).
pub const CR0_EM: u64 = 1 << 2;
pub const CR0_TS: u64 = 1 << 3;
/// CR4.OSXSAVE: XSETBV/XGETBV and the XSAVE family are enabled.
pub const CR4_OSXSAVE: u64 = 1 << 18;
/// CR4.LA57: 5-level paging.
pub const CR4_LA57: u64 = 1 << 12;

/// The mnemonic of exception `vector` (SDM Vol. 3A, Table 6-1), or "interrupt N" past them.
pub fn exception_name(vector: u32) -> String {
    const NAMES: [&str; 22] = [
        "#DE", "#DB", "NMI", "#BP", "#OF", "#BR", "#UD", "#NM", "#DF", "#CSO", "#TS", "#NP", "#SS", "#GP", "#PF",
        "#15", "#MF", "#AC", "#MC", "#XM", "#VE", "#CP",
    ];
    NAMES.get(vector as usize).map_or_else(|| format!("interrupt {vector}"), |n| (*n).to_string())
}
