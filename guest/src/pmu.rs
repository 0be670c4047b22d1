//! The architectural performance-monitoring MSRs (SDM names) and what CPUID leaf 0x0A says about
//! them, for guests that program the PMU.
use crate::cpu::{cpuid, rdmsr_safe};

pub const IA32_PMC0: u32 = 0xC1;
pub const IA32_PERFEVTSEL0: u32 = 0x186;
pub const IA32_MISC_ENABLE: u32 = 0x1A0;
pub const IA32_DEBUGCTL: u32 = 0x1D9;
pub const IA32_FIXED_CTR0: u32 = 0x309;
pub const IA32_PERF_CAPABILITIES: u32 = 0x345;
pub const IA32_FIXED_CTR_CTRL: u32 = 0x38D;
pub const IA32_PERF_GLOBAL_STATUS: u32 = 0x38E;
pub const IA32_PERF_GLOBAL_CTRL: u32 = 0x38F;
/// IA32_PERF_GLOBAL_OVF_CTRL; IA32_PERF_GLOBAL_STATUS_RESET from version 4.
pub const IA32_PERF_GLOBAL_OVF_CTRL: u32 = 0x390;
pub const IA32_PERF_GLOBAL_STATUS_RESET: u32 = 0x390;
pub const IA32_PERF_GLOBAL_STATUS_SET: u32 = 0x391;
pub const IA32_PERF_GLOBAL_INUSE: u32 = 0x392;
pub const IA32_PEBS_ENABLE: u32 = 0x3F1;
pub const IA32_A_PMC0: u32 = 0x4C1;
pub const IA32_DS_AREA: u32 = 0x600;

pub const PERFEVTSEL_USR: u64 = 1 << 16;
pub const PERFEVTSEL_OS: u64 = 1 << 17;
pub const PERFEVTSEL_INT: u64 = 1 << 20;
pub const PERFEVTSEL_EN: u64 = 1 << 22;
/// Instructions retired (event 0xC0) at every privilege level, enabled: 0x4300C0.
pub const EVTSEL_INSTRUCTIONS: u64 = PERFEVTSEL_EN | PERFEVTSEL_OS | PERFEVTSEL_USR | 0xC0;
/// The walkthrough's 0x5300C0: instructions retired with a PMI on overflow.
pub const EVTSEL_INSTRUCTIONS_INT: u64 = EVTSEL_INSTRUCTIONS | PERFEVTSEL_INT;
pub const DEBUGCTL_FREEZE_PERFMON_ON_PMI: u64 = 1 << 12;
pub const GLOBAL_STATUS_CTR_FRZ: u64 = 1 << 59;
/// IA32_PERF_CAPABILITIES.FW_WRITE: full-width writes through IA32_A_PMCx.
pub const PERF_CAPABILITIES_FW_WRITE: u64 = 1 << 13;
/// The walkthrough's APIC_PERFMON_VECTOR.
pub const APIC_PERFMON_VECTOR: u8 = 0x33;

/// Architectural events, by their CPUID.0AH:EBX bit (SDM Table 18-1).
pub const EVENT_CORE_CYCLES: u8 = 0;
pub const EVENT_INSTRUCTIONS: u8 = 1;
pub const EVENT_REF_CYCLES: u8 = 2;
pub const EVENT_LLC_REFERENCE: u8 = 3;
pub const EVENT_LLC_MISSES: u8 = 4;
pub const EVENT_BRANCHES: u8 = 5;
pub const EVENT_BRANCH_MISSES: u8 = 6;
pub const EVENT_TOPDOWN_SLOTS: u8 = 7;

/// The PMU as CPUID describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Perfmon {
    /// CPUID.0AH:EAX[7:0].
    pub version: u8,
    /// EAX[15:8]: general-purpose counters.
    pub gp: u8,
    /// EAX[23:16].
    pub gp_width: u8,
    /// EAX[31:24]: length of the EBX event vector.
    pub ebx_length: u8,
    /// EBX: set bits mark unavailable events.
    pub ebx: u32,
    /// EDX[4:0] (v2+): contiguous fixed counters.
    pub fixed: u8,
    /// EDX[12:5] (v2+).
    pub fixed_width: u8,
    /// ECX (v5): fixed-counter bitmap.
    pub fixed_bitmap: u32,
    /// CPUID.01H:ECX.PDCM: IA32_PERF_CAPABILITIES exists.
    pub pdcm: bool,
}

impl Perfmon {
    pub fn from_cpuid() -> Perfmon {
        let a = cpuid(0xA, 0);
        let v = (a.eax & 0xFF) as u8;
        Perfmon {
            version: v,
            gp: (a.eax >> 8) as u8,
            gp_width: (a.eax >> 16) as u8,
            ebx_length: (a.eax >> 24) as u8,
            ebx: a.ebx,
            fixed: if v >= 2 { (a.edx & 0x1F) as u8 } else { 0 },
            fixed_width: if v >= 2 { (a.edx >> 5) as u8 } else { 0 },
            fixed_bitmap: if v >= 5 { a.ecx } else { 0 },
            pdcm: cpuid(1, 0).ecx & (1 << 15) != 0,
        }
    }

    /// Architectural event `bit` is available: meaningful (below the EBX length) and clear.
    pub fn event_available(&self, bit: u8) -> bool {
        self.version >= 1 && bit < self.ebx_length && self.ebx & (1 << bit) == 0
    }

    /// Fixed counter `i` exists (SDM 18.2.5: v5 ECX bitmap, else EDX[4:0]).
    pub fn fixed_supported(&self, i: u8) -> bool {
        self.version >= 2 && (i < self.fixed || (i < 32 && self.fixed_bitmap & (1 << i) != 0))
    }

    /// IA32_PERF_CAPABILITIES, if it exists.
    pub fn perf_capabilities(&self) -> Option<u64> {
        self.pdcm.then(|| rdmsr_safe(IA32_PERF_CAPABILITIES).ok()).flatten()
    }

    pub fn fw_write(&self) -> bool {
        self.perf_capabilities().is_some_and(|c| c & PERF_CAPABILITIES_FW_WRITE != 0)
    }

    /// All ones in `width` bits: a counter's maximum.
    pub fn max(width: u8) -> u64 {
        if width >= 64 {
            u64::MAX
        } else {
            (1u64 << width) - 1
        }
    }
}

/// TSC ticks per tick of the reference clock that UnHalted Reference Cycles (0x3C/0x01) counts on
/// a GP counter, as CPUID leaf 0x15 gives it (EBX / EAX), if the CPU has that leaf.
pub fn tsc_per_ref() -> Option<(u64, u64)> {
    let l = (crate::cpu::max_leaf() >= 0x15).then(|| cpuid(0x15, 0))?;
    (l.eax != 0 && l.ebx != 0).then_some((l.ebx as u64, l.eax as u64))
}

/// UnHalted Reference Cycles on a GP counter for counted code of `core_cycles` cycles under emon's
/// precise backend (README, "Guest time"): the model core runs at the TSC's rate, so the count is
/// core_cycles / (TSC ticks per reference tick), rounded either way (the reference clock's phase
/// is not the guest's to know). Without CPUID leaf 0x15 the ratio is not either: 1 to core_cycles.
pub fn ref_cycles_range(core_cycles: u64) -> (u64, u64) {
    match tsc_per_ref() {
        Some((num, den)) => {
            let floor = (core_cycles as u128 * den as u128 / num as u128) as u64;
            (floor, floor + 1)
        }
        None => (1, core_cycles),
    }
}

/// IA32_FIXED_CTR_CTRL field bits (per fixed counter, 4 bits each): EN (1 = OS, 2 = USR, 3 = all), PMI.
pub const FIXED_EN_OS: u64 = 1;
pub const FIXED_EN_USR: u64 = 2;
pub const FIXED_EN_ALL: u64 = 3;
pub const FIXED_PMI: u64 = 8;

/// WRMSR(`msr`, `value`) to start counting, then one `nop`: the first counted instruction.
/// Returns the address right after that `nop`, where a PMI from a counter that the `nop` wrapped
/// arrives with zero skid (emon's precise backend).
pub fn start_and_retire_one(msr: u32, value: u64) -> u64 {
    let after_first: u64;
    // SAFETY: writes one PMU MSR; the clobbered registers are declared.
    unsafe {
        core::arch::asm!(
            "lea {after}, [rip + 2f]",
            "wrmsr",  // counting starts after this instruction
            "nop",    // the first counted instruction
            "2:",
            "nop",
            "nop",
            "nop",
            after = out(reg) after_first,
            in("ecx") msr,
            in("eax") value as u32,
            in("edx") (value >> 32) as u32,
        );
    }
    after_first
}

/// The measured block of emon's counting guests: WRMSR(`start_msr`, `start`) (not counted),
/// `mov r11d, N; 2: dec r11d; jnz 2b; xor r11d, r11d; jnz 3f; jz 3f; nop; 3:`, and the stop
/// sequence ending in WRMSR(`stop_msr`, `stop`) (counted). Under emon's precise backend it retires
/// 2N+8 instructions, N+2 branches, 2 mispredicted branches (static predictor) and 3N+108 cycles
/// (cost model). Returns the address right after the stopping WRMSR.
pub fn measured_block(n: u32, start_msr: u32, start: u64, stop_msr: u32, stop: u64) -> u64 {
    let after_stop: u64;
    // SAFETY: writes two PMU MSRs; every register the block touches is declared.
    unsafe {
        core::arch::asm!(
            "lea {after}, [rip + 4f]",
            "wrmsr",            // start: counting begins after this instruction
            "mov r11d, {n:e}",
            "2:",
            "dec r11d",
            "jnz 2b",
            "xor r11d, r11d",
            "jnz 3f",
            "jz 3f",
            "nop",
            "3:",
            "mov ecx, r8d",     // the stop sequence (counted)
            "mov eax, r9d",
            "mov edx, r10d",
            "wrmsr",
            "4:",
            after = out(reg) after_stop,
            n = in(reg) n,
            inout("ecx") start_msr => _,
            inout("eax") start as u32 => _,
            inout("edx") (start >> 32) as u32 => _,
            in("r8") stop_msr,
            in("r9") stop as u32,
            in("r10") (stop >> 32) as u32,
            out("r11") _,
            options(nostack),
        );
    }
    after_stop
}
