//! Checks the virtual PMU's MSR semantics (existence, reset values, widths, reserved bits, status, INUSE) against CPUID.
//!
//! The guest derives the PMU it should see from CPUID alone (CPUID.0AH for the version, the
//! general-purpose and fixed counters and their widths, CPUID.01H:ECX.PDCM and
//! IA32_PERF_CAPABILITIES for FW_WRITE and FREEZE_WHILE_SMM) and then checks, register by
//! register, the semantics of the SDM Vol. 3B "Performance Monitoring" chapter (18.2 in the
//! numbering used here), as the README's "PMU semantics" lists them: which MSRs exist (#GP otherwise), power-on
//! values, counter widths (legacy sign-extended and full-width writes), reserved bits (#GP with no
//! state change), IA32_PERF_GLOBAL_STATUS set/reset, IA32_PERF_GLOBAL_INUSE, IA32_DEBUGCTL,
//! IA32_MISC_ENABLE, IA32_PEBS_ENABLE and IA32_DS_AREA. Because nothing is hard-coded, the same
//! binary is correct under every profile, including one without a PMU (version 0). No counter
//! is expected to advance: counting and overflow are checked by other guests. Every group starts
//! from, and restores, the power-on state, so groups are independent.
#![no_std]
#![no_main]

use core::fmt;
use emon_guest::cpu::{cpuid, max_leaf, rdmsr_safe, wrmsr_safe, Cpuid};
use emon_guest::msr::{bits, expect_gp_unchanged, expect_reserved_bits, is_gp, rd, wr, write_reads};
use emon_guest::{check, check_eq, println, skip, BootInfo};

emon_guest::entry!(main);

// ---- MSR indices (SDM Vol. 4, Table 2-2 "IA-32 Architectural MSRs") ----
const IA32_PMC0: u32 = 0xC1;
const IA32_PERFEVTSEL0: u32 = 0x186;
const IA32_MISC_ENABLE: u32 = 0x1A0;
const IA32_DEBUGCTL: u32 = 0x1D9;
const IA32_FIXED_CTR0: u32 = 0x309;
const IA32_PERF_CAPABILITIES: u32 = 0x345;
const IA32_FIXED_CTR_CTRL: u32 = 0x38D;
const IA32_PERF_GLOBAL_STATUS: u32 = 0x38E;
const IA32_PERF_GLOBAL_CTRL: u32 = 0x38F;
/// IA32_PERF_GLOBAL_OVF_CTRL; called IA32_PERF_GLOBAL_STATUS_RESET from version 4 (SDM 18.2.4.2).
const IA32_PERF_GLOBAL_OVF_CTRL: u32 = 0x390;
const IA32_PERF_GLOBAL_STATUS_RESET: u32 = IA32_PERF_GLOBAL_OVF_CTRL;
const IA32_PERF_GLOBAL_STATUS_SET: u32 = 0x391;
const IA32_PERF_GLOBAL_INUSE: u32 = 0x392;
const IA32_PEBS_ENABLE: u32 = 0x3F1;
const IA32_A_PMC0: u32 = 0x4C1;
const IA32_DS_AREA: u32 = 0x600;

/// IA32_PMC0-7 / IA32_PERFEVTSEL0-7 / IA32_A_PMC0-7: the architectural MSR ranges checked.
const MAX_GP: u8 = 8;
/// IA32_FIXED_CTR0-3.
const MAX_FIXED: u8 = 4;

// ---- IA32_PERFEVTSELx (SDM Figure 18-6) ----
const EVTSEL_USR: u64 = 1 << 16;
const EVTSEL_OS: u64 = 1 << 17;
const EVTSEL_INT: u64 = 1 << 20;
const EVTSEL_ANY: u64 = 1 << 21;
/// IA32_PERFEVTSELx.Adaptive_Record (bit 34, adaptive PEBS; SDM 18.9.2.2).
const EVTSEL_ADAPTIVE: u64 = 1 << 34;
const EVTSEL_EN: u64 = 1 << 22;
/// Event 0xC0 (instructions retired), umask 0.
const EVENT_INST_RETIRED: u64 = 0xC0;
/// 0x4300C0: instructions retired, USR | OS | EN, no PMI.
const EVTSEL_COUNT_INSTRUCTIONS: u64 = EVTSEL_EN | EVTSEL_OS | EVTSEL_USR | EVENT_INST_RETIRED;

// ---- IA32_FIXED_CTR_CTRL: one 4-bit field per fixed counter (SDM Figure 18-7) ----
const FIXED_EN_OS: u64 = 0b0001;
const FIXED_EN_USR: u64 = 0b0010;
const FIXED_EN_ALL: u64 = FIXED_EN_OS | FIXED_EN_USR;
const FIXED_ANY: u64 = 0b0100;
const FIXED_PMI: u64 = 0b1000;

/// `field` placed in the IA32_FIXED_CTR_CTRL field of fixed counter `i`.
fn fixed_field(i: u8, field: u64) -> u64 {
    field << (4 * u32::from(i))
}

// ---- IA32_PERF_GLOBAL_STATUS bits beyond the counter overflow bits (SDM Figure 18-11/18-12) ----
const STATUS_TRACE_TOPA_PMI: u32 = 55;
const STATUS_LBR_FRZ: u32 = 58;
const STATUS_CTR_FRZ: u32 = 59;
const STATUS_ASCI: u32 = 60;
const STATUS_OVF_UNCORE: u32 = 61;
const STATUS_OVF_BUFFER: u32 = 62;
const STATUS_COND_CHGD: u32 = 63;
/// IA32_PERF_GLOBAL_INUSE.PMI_InUse (SDM 18.2.4.3).
const INUSE_PMI: u64 = 1 << 63;

// ---- IA32_DEBUGCTL (SDM 17.4.1) and IA32_PERF_CAPABILITIES ----
const DEBUGCTL_LBR: u32 = 0;
const DEBUGCTL_BTF: u32 = 1;
const DEBUGCTL_FREEZE_LBRS_ON_PMI: u32 = 11;
const DEBUGCTL_FREEZE_PERFMON_ON_PMI: u32 = 12;
const DEBUGCTL_FREEZE_WHILE_SMM: u32 = 14;
const PERF_CAPABILITIES_SMM_FRZ: u64 = 1 << 12;
const PERF_CAPABILITIES_FW_WRITE: u64 = 1 << 13;
const PERF_CAPABILITIES_PERF_METRICS: u64 = 1 << 15;

// ---- IA32_MISC_ENABLE (SDM Vol. 4 Table 2-2) ----
const MISC_FAST_STRINGS: u64 = 1 << 0;
const MISC_PERFMON_AVAILABLE: u64 = 1 << 7;
const MISC_BTS_UNAVAILABLE: u64 = 1 << 11;
const MISC_PEBS_UNAVAILABLE: u64 = 1 << 12;
/// Bits a guest may change: (bit, SDM name).
const MISC_WRITABLE: [(u32, &str); 7] = [
    (0, "Fast-Strings Enable"),
    (3, "Automatic Thermal Control Circuit Enable"),
    (16, "Enhanced Intel SpeedStep Enable"),
    (18, "ENABLE MONITOR FSM"),
    (22, "Limit CPUID Maxval"),
    (23, "xTPR Message Disable"),
    (34, "XD Bit Disable"),
];
/// Core 2's prefetcher disable bits (SDM Vol. 4, the Core 2 table), writable there only: later
/// CPUs move them to MSR_MISC_FEATURE_CONTROL and #GP on them (measured on Sandy Bridge and
/// Skylake). emon's cache model obeys them (README, "The cache model").
const MISC_PREFETCH: [(u32, &str); 4] = [
    (9, "Hardware Prefetcher Disable"),
    (19, "Adjacent Cache Line Prefetch Disable"),
    (37, "DCU Prefetcher Disable"),
    (39, "IP Prefetcher Disable"),
];

/// Is this a Core 2 (family 6, models 0FH, 16H, 17H, 1DH; SDM Vol. 4)?
fn core_2() -> bool {
    let eax = cpuid(1, 0).eax;
    let family = (eax >> 8) & 0xF;
    let model = ((eax >> 4) & 0xF) | ((eax >> 12) & 0xF0);
    family == 6 && matches!(model, 0x0F | 0x16 | 0x17 | 0x1D)
}

/// Read-only bits: (bit, SDM name).
const MISC_READ_ONLY: [(u32, &str); 3] =
    [(7, "Performance Monitoring Available"), (11, "Branch Trace Storage Unavailable"), (12, "PEBS Unavailable")];

/// `(1 << width) - 1`, all ones for a width of 64 or more.
fn width_mask(width: u8) -> u64 {
    if width >= 64 {
        u64::MAX
    } else {
        (1u64 << width) - 1
    }
}

/// The PMU as CPUID (and IA32_PERF_CAPABILITIES) enumerate it: every expectation comes from here.
struct Pmu {
    /// CPUID.0AH:EAX[7:0].
    version: u8,
    /// CPUID.0AH:EAX[15:8], capped at the 8 architectural IA32_PMCx MSRs.
    gp: u8,
    /// CPUID.0AH:EAX[23:16].
    gp_width: u8,
    /// CPUID.0AH:EDX[4:0] (version 2+).
    fixed_count: u8,
    /// CPUID.0AH:EDX[12:5] (version 2+).
    fixed_width: u8,
    /// CPUID.0AH:ECX fixed-counter bitmap (version 5+).
    fixed_bitmap: u32,
    /// `fixed[i]`: IA32_FIXED_CTRi exists (SDM 18.2.5: ECX[i] || EDX[4:0] > i, version 2+).
    fixed: [bool; MAX_FIXED as usize],
    /// CPUID.0AH:EDX[15]: AnyThread deprecation (ANY bits reserved when set).
    any_thread_deprecated: bool,
    /// CPUID.01H:ECX.PDCM[15]: IA32_PERF_CAPABILITIES exists.
    pdcm: bool,
    /// IA32_PERF_CAPABILITIES (0 without PDCM).
    perf_capabilities: u64,
    /// Width of a canonical linear address in an MSR: 57 with LA57 support, else 48.
    linear_bits: u8,
}

impl Pmu {
    fn from_cpuid() -> Pmu {
        let pdcm = cpuid(1, 0).ecx & (1 << 15) != 0;
        let a = if max_leaf() >= 0xA { cpuid(0xA, 0) } else { Cpuid { eax: 0, ebx: 0, ecx: 0, edx: 0 } };
        let version = (a.eax & 0xFF) as u8;
        let (gp, gp_width) = if version >= 1 {
            ((((a.eax >> 8) & 0xFF) as u8).min(MAX_GP), ((a.eax >> 16) & 0xFF) as u8)
        } else {
            (0, 0)
        };
        // CPUID.0AH:EDX is reserved before version 2, ECX before version 5.
        let (fixed_count, fixed_width) =
            if version >= 2 { ((a.edx & 0x1F) as u8, ((a.edx >> 5) & 0xFF) as u8) } else { (0, 0) };
        let fixed_bitmap = if version >= 5 { a.ecx } else { 0 };
        let mut fixed = [false; MAX_FIXED as usize];
        for (i, f) in (0u8..).zip(fixed.iter_mut()) {
            *f = version >= 2 && (i < fixed_count || fixed_bitmap & (1 << i) != 0);
        }
        let perf_capabilities = if pdcm { rdmsr_safe(IA32_PERF_CAPABILITIES).unwrap_or(0) } else { 0 };
        // A processor that supports 5-level paging (CPUID.(EAX=07H,ECX=0):ECX.LA57[16]) checks
        // linear addresses written to MSRs for 57-bit canonicality, whatever CR4.LA57.
        let la57 = max_leaf() >= 7 && cpuid(7, 0).ecx & (1 << 16) != 0;
        Pmu {
            version,
            gp,
            gp_width,
            fixed_count,
            fixed_width,
            fixed_bitmap,
            fixed,
            any_thread_deprecated: version >= 2 && a.edx & (1 << 15) != 0,
            pdcm,
            perf_capabilities,
            linear_bits: if la57 { 57 } else { 48 },
        }
    }

    /// IA32_PERF_GLOBAL_CTRL/STATUS bit 48 (EN_PERF_METRICS / PERF_METRICS_OVF), with
    /// IA32_PERF_CAPABILITIES.PERF_METRICS_AVAILABLE[15] (SDM 18.3.9.3).
    fn perf_metrics_bit(&self) -> u64 {
        if self.version >= 2 && self.perf_capabilities & PERF_CAPABILITIES_PERF_METRICS != 0 {
            1 << 48
        } else {
            0
        }
    }

    /// IA32_A_PMCx exist (IA32_PERF_CAPABILITIES.FW_WRITE, SDM 18.2.5).
    fn fw_write(&self) -> bool {
        self.perf_capabilities & PERF_CAPABILITIES_FW_WRITE != 0
    }

    fn fixed_exists(&self, i: u8) -> bool {
        self.fixed.get(usize::from(i)).copied().unwrap_or(false)
    }

    /// Indices of the supported fixed counters.
    fn fixed_indices(&self) -> impl Iterator<Item = u8> + '_ {
        (0..MAX_FIXED).filter(move |&i| self.fixed_exists(i))
    }

    /// Bits 0..N-1.
    fn gp_bits(&self) -> u64 {
        width_mask(self.gp)
    }

    /// Bits 32+i of the supported fixed counters.
    fn fixed_bits(&self) -> u64 {
        self.fixed_indices().fold(0, |m, i| m | 1u64 << (32 + u32::from(i)))
    }

    /// Every counter's bit in GLOBAL_CTRL / GLOBAL_STATUS / OVF_CTRL / INUSE.
    fn counter_bits(&self) -> u64 {
        self.gp_bits() | self.fixed_bits()
    }

    /// AnyThread came with version 3 (SDM 18.2.3) and is reserved again with CPUID.0AH:EDX[15].
    fn any_allowed(&self) -> bool {
        self.version >= 3 && !self.any_thread_deprecated
    }

    /// Why ANY is reserved, for test names.
    fn any_reserved_reason(&self) -> &'static str {
        if self.version < 3 {
            "before v3"
        } else {
            "with AnyThread deprecated (CPUID.0AH:EDX[15])"
        }
    }

    /// Writable bits of IA32_PERFEVTSELx: 31:0, minus ANY when it is reserved.
    fn perfevtsel_valid(&self) -> u64 {
        let all = 0xFFFF_FFFF;
        if self.any_allowed() {
            all
        } else {
            all & !EVTSEL_ANY
        }
    }

    /// Writable bits of IA32_FIXED_CTR_CTRL: EN | PMI (| ANY) in each supported counter's field,
    /// and with adaptive PEBS its FCi_Adaptive_Record bit (32 + 4i).
    fn fixed_ctr_ctrl_valid(&self) -> u64 {
        let field = FIXED_EN_ALL | FIXED_PMI | if self.any_allowed() { FIXED_ANY } else { 0 };
        self.fixed_indices().fold(0, |m, i| m | fixed_field(i, field) | self.fixed_adaptive(i))
    }

    /// PERF_CAPABILITIES.PEBS_BASELINE (bit 14): adaptive PEBS (SDM 18.9.2.2).
    fn pebs_baseline(&self) -> bool {
        self.perf_capabilities & (1 << 14) != 0
    }

    /// IA32_PERFEVTSELx.Adaptive_Record (bit 34), where adaptive PEBS exists.
    fn perfevtsel_adaptive(&self) -> u64 {
        if self.pebs_baseline() {
            EVTSEL_ADAPTIVE
        } else {
            0
        }
    }

    /// IA32_FIXED_CTR_CTRL.FCi_Adaptive_Record (bit 32 + 4i), where adaptive PEBS exists.
    fn fixed_adaptive(&self, i: u8) -> u64 {
        if self.pebs_baseline() {
            1 << (32 + 4 * u32::from(i))
        } else {
            0
        }
    }

    /// Bits IA32_PERF_GLOBAL_OVF_CTRL / STATUS_RESET may clear (SDM Figures 18-5, 18-11).
    fn ovf_ctrl_valid(&self) -> u64 {
        let mut v = self.counter_bits() | self.perf_metrics_bit() | 1 << STATUS_OVF_BUFFER | 1 << STATUS_COND_CHGD;
        if self.version >= 3 {
            v |= 1 << STATUS_OVF_UNCORE;
        }
        if self.version >= 4 {
            v |= 1 << STATUS_TRACE_TOPA_PMI | 1 << STATUS_LBR_FRZ | 1 << STATUS_CTR_FRZ;
        }
        v
    }

    /// Bits IA32_PERF_GLOBAL_STATUS_SET may set (v4+, SDM Figure 18-12): not CondChgd (63),
    /// not ASCI (60, SGX only). OvfUncore (61) is settable per the SDM.
    fn status_set_valid(&self) -> u64 {
        self.counter_bits()
            | self.perf_metrics_bit()
            | 1 << STATUS_TRACE_TOPA_PMI
            | 1 << STATUS_LBR_FRZ
            | 1 << STATUS_CTR_FRZ
            | 1 << STATUS_OVF_UNCORE
            | 1 << STATUS_OVF_BUFFER
    }

    /// IA32_DEBUGCTL bits emon implements, with whether this PMU allows them.
    fn debugctl_bits(&self) -> [(u32, &'static str, bool); 10] {
        // TR, BTS, BTINT, BTS_OFF_OS and BTS_OFF_USR exist where BTS is available (SDM 17.4.9:
        // MISC_ENABLE.BTS_UNAVAILABLE clear).
        let bts = emon_guest::cpu::rdmsr(IA32_MISC_ENABLE) & MISC_BTS_UNAVAILABLE == 0;
        [
            (DEBUGCTL_LBR, "LBR", true),
            (DEBUGCTL_BTF, "BTF", true),
            (6, "TR", bts),
            (7, "BTS", bts),
            (8, "BTINT", bts),
            (9, "BTS_OFF_OS", bts),
            (10, "BTS_OFF_USR", bts),
            (DEBUGCTL_FREEZE_LBRS_ON_PMI, "FREEZE_LBRS_ON_PMI", true),
            (DEBUGCTL_FREEZE_PERFMON_ON_PMI, "FREEZE_PERFMON_ON_PMI", self.version >= 2),
            (DEBUGCTL_FREEZE_WHILE_SMM, "FREEZE_WHILE_SMM", self.perf_capabilities & PERF_CAPABILITIES_SMM_FRZ != 0),
        ]
    }

    fn debugctl_valid(&self) -> u64 {
        self.debugctl_bits().iter().filter(|b| b.2).fold(0, |m, b| m | 1 << b.0)
    }

    /// IA32_MISC_ENABLE at power-on: fast strings, BTS and PEBS unavailable (no DS emulation),
    /// and "performance monitoring available" exactly when CPUID.0AH reports a PMU.
    /// BTS and PEBS Unavailable (bits 11, 12) are as the platform presents the Debug Store, which
    /// CPUID does not always tell (a host may hide CPUID.01H:EDX.DS): taken as read, and checked
    /// read-only.
    fn misc_enable_power_on(&self) -> u64 {
        let perfmon = if self.version >= 1 { MISC_PERFMON_AVAILABLE } else { 0 };
        let ds = emon_guest::cpu::rdmsr(IA32_MISC_ENABLE) & (MISC_BTS_UNAVAILABLE | MISC_PEBS_UNAVAILABLE);
        MISC_FAST_STRINGS | perfmon | ds
    }
}

/// A register of the architectural PMU (the MSRs emon traps).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Reg {
    Pmc(u8),
    APmc(u8),
    PerfEvtSel(u8),
    FixedCtr(u8),
    PerfCapabilities,
    FixedCtrCtrl,
    GlobalStatus,
    GlobalCtrl,
    GlobalOvfCtrl,
    GlobalStatusSet,
    GlobalInuse,
    DebugCtl,
    MiscEnable,
    PebsEnable,
    DsArea,
}

impl Reg {
    /// Every register, including the IA32_PMCx / IA32_FIXED_CTRx no profile may have.
    fn all() -> impl Iterator<Item = Reg> {
        const SINGLE: [Reg; 11] = [
            Reg::PerfCapabilities,
            Reg::FixedCtrCtrl,
            Reg::GlobalStatus,
            Reg::GlobalCtrl,
            Reg::GlobalOvfCtrl,
            Reg::GlobalStatusSet,
            Reg::GlobalInuse,
            Reg::DebugCtl,
            Reg::MiscEnable,
            Reg::PebsEnable,
            Reg::DsArea,
        ];
        (0..MAX_GP)
            .map(Reg::Pmc)
            .chain((0..MAX_GP).map(Reg::APmc))
            .chain((0..MAX_GP).map(Reg::PerfEvtSel))
            .chain((0..MAX_FIXED).map(Reg::FixedCtr))
            .chain(SINGLE)
    }

    fn msr(self) -> u32 {
        match self {
            Reg::Pmc(i) => IA32_PMC0 + u32::from(i),
            Reg::APmc(i) => IA32_A_PMC0 + u32::from(i),
            Reg::PerfEvtSel(i) => IA32_PERFEVTSEL0 + u32::from(i),
            Reg::FixedCtr(i) => IA32_FIXED_CTR0 + u32::from(i),
            Reg::PerfCapabilities => IA32_PERF_CAPABILITIES,
            Reg::FixedCtrCtrl => IA32_FIXED_CTR_CTRL,
            Reg::GlobalStatus => IA32_PERF_GLOBAL_STATUS,
            Reg::GlobalCtrl => IA32_PERF_GLOBAL_CTRL,
            Reg::GlobalOvfCtrl => IA32_PERF_GLOBAL_OVF_CTRL,
            Reg::GlobalStatusSet => IA32_PERF_GLOBAL_STATUS_SET,
            Reg::GlobalInuse => IA32_PERF_GLOBAL_INUSE,
            Reg::DebugCtl => IA32_DEBUGCTL,
            Reg::MiscEnable => IA32_MISC_ENABLE,
            Reg::PebsEnable => IA32_PEBS_ENABLE,
            Reg::DsArea => IA32_DS_AREA,
        }
    }

    /// Does the register exist on `p`? (SDM 18.2.)
    fn exists(self, p: &Pmu) -> bool {
        let v = p.version;
        match self {
            Reg::Pmc(i) | Reg::PerfEvtSel(i) => v >= 1 && i < p.gp,
            Reg::APmc(i) => v >= 1 && i < p.gp && p.fw_write(),
            Reg::FixedCtr(i) => p.fixed_exists(i),
            Reg::PerfCapabilities => p.pdcm,
            Reg::FixedCtrCtrl | Reg::GlobalStatus | Reg::GlobalCtrl | Reg::GlobalOvfCtrl => v >= 2,
            Reg::GlobalStatusSet | Reg::GlobalInuse => v >= 4,
            Reg::DebugCtl | Reg::MiscEnable => true,
            Reg::PebsEnable | Reg::DsArea => v >= 1,
        }
    }

    /// Read-only registers: every WRMSR #GPs.
    fn read_only(self) -> bool {
        matches!(self, Reg::PerfCapabilities | Reg::GlobalStatus | Reg::GlobalInuse)
    }

    /// Write-1-to-clear/set command registers (they read as 0 and hold no state).
    fn command(self) -> bool {
        matches!(self, Reg::GlobalOvfCtrl | Reg::GlobalStatusSet)
    }

    /// The power-on value (SDM 18.2.2); `None` for PERF_CAPABILITIES,
    /// whose value is the profile's.
    fn power_on(self, p: &Pmu) -> Option<u64> {
        match self {
            Reg::PerfCapabilities => None,
            // SDM 18.2.2: the GP enables are set at reset for version 1 software compatibility.
            Reg::GlobalCtrl => Some(p.gp_bits()),
            Reg::MiscEnable => Some(p.misc_enable_power_on()),
            _ => Some(0),
        }
    }
}

impl fmt::Display for Reg {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match *self {
            Reg::Pmc(i) => write!(f, "IA32_PMC{}", i),
            Reg::APmc(i) => write!(f, "IA32_A_PMC{}", i),
            Reg::PerfEvtSel(i) => write!(f, "IA32_PERFEVTSEL{}", i),
            Reg::FixedCtr(i) => write!(f, "IA32_FIXED_CTR{}", i),
            Reg::PerfCapabilities => f.write_str("IA32_PERF_CAPABILITIES"),
            Reg::FixedCtrCtrl => f.write_str("IA32_FIXED_CTR_CTRL"),
            Reg::GlobalStatus => f.write_str("IA32_PERF_GLOBAL_STATUS"),
            Reg::GlobalCtrl => f.write_str("IA32_PERF_GLOBAL_CTRL"),
            Reg::GlobalOvfCtrl => f.write_str("IA32_PERF_GLOBAL_OVF_CTRL"),
            Reg::GlobalStatusSet => f.write_str("IA32_PERF_GLOBAL_STATUS_SET"),
            Reg::GlobalInuse => f.write_str("IA32_PERF_GLOBAL_INUSE"),
            Reg::DebugCtl => f.write_str("IA32_DEBUGCTL"),
            Reg::MiscEnable => f.write_str("IA32_MISC_ENABLE"),
            Reg::PebsEnable => f.write_str("IA32_PEBS_ENABLE"),
            Reg::DsArea => f.write_str("IA32_DS_AREA"),
        }
    }
}

/// The SDM name of an IA32_PERF_GLOBAL_STATUS bit.
struct StatusBit(u32);

impl fmt::Display for StatusBit {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self.0 {
            b @ 0..=31 => write!(f, "Ovf_PMC{}", b),
            48 => f.write_str("PERF_METRICS_OVF"),
            b @ 32..=54 => write!(f, "Ovf_FixedCtr{}", b - 32),
            STATUS_TRACE_TOPA_PMI => f.write_str("Trace_ToPA_PMI"),
            STATUS_LBR_FRZ => f.write_str("LBR_Frz"),
            STATUS_CTR_FRZ => f.write_str("CTR_Frz"),
            STATUS_ASCI => f.write_str("ASCI"),
            STATUS_OVF_UNCORE => f.write_str("OvfUncore"),
            STATUS_OVF_BUFFER => f.write_str("OvfBuffer"),
            STATUS_COND_CHGD => f.write_str("CondChgd"),
            _ => f.write_str("reserved"),
        }
    }
}

/// Puts every register back to its power-on value (counting stopped first, GLOBAL_STATUS cleared).
fn reset(p: &Pmu) {
    // Stop every counter through its own enable first: counters really count under emon, and
    // v1 has no GLOBAL_CTRL, so only PERFEVTSEL.EN stops them.
    for i in 0..p.gp {
        wr(IA32_PERFEVTSEL0 + u32::from(i), 0);
    }
    if p.version >= 2 {
        wr(IA32_FIXED_CTR_CTRL, 0);
        wr(IA32_PERF_GLOBAL_CTRL, 0);
    }
    for r in Reg::all().filter(|r| r.exists(p) && !r.read_only() && !r.command()) {
        if let Some(v) = r.power_on(p) {
            if r != Reg::GlobalCtrl {
                wr(r.msr(), v);
            }
        }
    }
    if p.version >= 2 {
        wr(IA32_PERF_GLOBAL_STATUS_RESET, p.ovf_ctrl_valid());
        wr(IA32_PERF_GLOBAL_CTRL, p.gp_bits());
    }
}

fn needs_version(p: &Pmu, min: u8, what: &str) -> bool {
    if p.version < min {
        skip!("{} (needs perfmon v{}, CPUID.0AH reports v{})", what, min, p.version);
        false
    } else {
        true
    }
}

// ---- Check groups ----

fn header(p: &Pmu) {
    println!(
        "msr-semantics: perfmon v{}: {} GP counters x {} bits; fixed counters {:#x} (EDX[4:0] {}, ECX bitmap {:#x}) x {} bits",
        p.version,
        p.gp,
        p.gp_width,
        p.fixed_bits() >> 32,
        p.fixed_count,
        p.fixed_bitmap,
        p.fixed_width
    );
    println!(
        "msr-semantics: PDCM {}, IA32_PERF_CAPABILITIES {:#x}, FW_WRITE {}, AnyThread {}, canonical MSR address width {} bits",
        u8::from(p.pdcm),
        p.perf_capabilities,
        u8::from(p.fw_write()),
        if p.any_allowed() { "allowed" } else { "reserved" },
        p.linear_bits
    );
}

/// Group 1 (run before anything is written): power-on values (SDM 18.2.2).
fn check_power_on(p: &Pmu) {
    for r in Reg::all().filter(|r| r.exists(p)) {
        if let Some(want) = r.power_on(p) {
            check_eq!(rd(r.msr()), want, "{} power-on value is {:#x}", r, want);
        }
    }
}

/// Group 2: each MSR can be read (and written with its current value) exactly when it exists.
fn check_existence(p: &Pmu) {
    for r in Reg::all() {
        let msr = r.msr();
        let read = rdmsr_safe(msr);
        // IA32_PERF_CAPABILITIES is enumerated by CPUID.01H:ECX.PDCM, whatever the version.
        let why = if r == Reg::PerfCapabilities {
            if p.pdcm {
                " (PDCM = 1)"
            } else {
                " (PDCM = 0)"
            }
        } else {
            ""
        };
        if r.exists(p) {
            check!(read.is_ok(), "{} ({:#x}) exists{}: RDMSR succeeds", r, msr, why);
            if let (Ok(v), false) = (read, r.read_only()) {
                check!(wrmsr_safe(msr, v).is_ok(), "{} exists: WRMSR of its current value succeeds", r);
            }
        } else {
            check!(is_gp(&read), "{} ({:#x}) absent{}: RDMSR #GPs", r, msr, why);
            check!(is_gp(&wrmsr_safe(msr, 0)), "{} absent{}: WRMSR #GPs", r, why);
        }
    }
}

/// Group 3a: IA32_PMCx legacy writes sign-extend EAX and ignore EDX; IA32_A_PMCx full-width
/// writes (SDM 18.2.5 "Full-Width Writes to Performance Counter Registers").
fn check_gp_widths(p: &Pmu) {
    if p.gp == 0 {
        skip!("IA32_PMCx widths (no general-purpose counters)");
        return;
    }
    let w = p.gp_width;
    let m = width_mask(w);
    // (EDX:EAX written, value read back, what it shows)
    let legacy: [(u64, u64, &str); 5] = [
        (0xFFFF_FFFF, m, "0xffffffff sign-extends to all ones"),
        (0x7FFF_FFFF, 0x7FFF_FFFF, "0x7fffffff stays positive"),
        (0x8000_0000, 0xFFFF_FFFF_8000_0000 & m, "0x80000000 sign-extends"),
        (0x0000_1234_0000_0005, 5, "EDX=0x1234 is ignored"),
        (0xFFFF_FFFF_7FFF_FFFF, 0x7FFF_FFFF, "EDX=0xffffffff is ignored"),
    ];
    for i in 0..p.gp {
        let pmc = IA32_PMC0 + u32::from(i);
        for (value, want, what) in legacy {
            write_reads(format_args!("IA32_PMC{} legacy write {} ({} bits)", i, what, w), pmc, value, want);
        }
        if p.fw_write() {
            let apmc = IA32_A_PMC0 + u32::from(i);
            wr(pmc, 0xFFFF_FFFF);
            check_eq!(rd(apmc), m, "IA32_A_PMC{} reads the value written through IA32_PMC{}", i, i);
            let top = 1u64 << (w - 1) | 0x5A5A;
            write_reads(
                format_args!("IA32_A_PMC{} full-width write with bit {} set reads back", i, w - 1),
                apmc,
                top,
                top,
            );
            check_eq!(rd(pmc), top, "IA32_PMC{} reads the value written through IA32_A_PMC{}", i, i);
            write_reads(format_args!("IA32_A_PMC{} full-width write of all {} bits reads back", i, w), apmc, m, m);
            if w < 64 {
                wr(apmc, 0x1234);
                expect_reserved_bits(
                    format_args!("IA32_A_PMC{} write with any bit {}..63 set #GPs, counter unchanged", i, w),
                    apmc,
                    0x1234,
                    !m,
                    pmc,
                );
            } else {
                skip!("IA32_A_PMC{} bits above the width (the counters are 64 bits wide)", i);
            }
        }
        wr(pmc, 0);
    }
    if !p.fw_write() {
        skip!("IA32_A_PMCx full-width writes (IA32_PERF_CAPABILITIES.FW_WRITE = 0)");
    }
    reset(p);
}

/// Group 3b: IA32_FIXED_CTRx keep the fixed width; higher bits are dropped without #GP.
fn check_fixed_widths(p: &Pmu) {
    if p.fixed_indices().next().is_none() {
        skip!("IA32_FIXED_CTRx widths (no fixed-function counters)");
        return;
    }
    let w = p.fixed_width;
    let m = width_mask(w);
    for i in p.fixed_indices() {
        let msr = IA32_FIXED_CTR0 + u32::from(i);
        write_reads(format_args!("IA32_FIXED_CTR{} write of all ones truncates to {} bits", i, w), msr, u64::MAX, m);
        let top = 1u64 << (w - 1) | 3;
        write_reads(format_args!("IA32_FIXED_CTR{} write with bit {} set reads back", i, w - 1), msr, top, top);
        if w < 64 {
            write_reads(
                format_args!("IA32_FIXED_CTR{} bits above {} are dropped without #GP", i, w),
                msr,
                1u64 << w | 7,
                7,
            );
        }
        wr(msr, 0);
    }
    reset(p);
}

/// Group 4a: IA32_PERFEVTSELx reserved bits (SDM Figure 18-6).
fn check_perfevtsel(p: &Pmu) {
    if p.gp == 0 {
        skip!("IA32_PERFEVTSELx reserved bits (no general-purpose counters)");
        return;
    }
    let base = EVTSEL_COUNT_INSTRUCTIONS;
    for i in 0..p.gp {
        let msr = IA32_PERFEVTSEL0 + u32::from(i);
        write_reads(format_args!("IA32_PERFEVTSEL{} = 0x4300c0 reads back", i), msr, base, base);
        let adaptive = p.perfevtsel_adaptive();
        expect_reserved_bits(
            format_args!(
                "IA32_PERFEVTSEL{} bits 63:32 each #GP (but Adaptive_Record with PEBS_BASELINE), state unchanged",
                i
            ),
            msr,
            base,
            0xFFFF_FFFF_0000_0000 & !adaptive,
            msr,
        );
        if adaptive != 0 {
            let v = base | adaptive;
            write_reads(
                format_args!("IA32_PERFEVTSEL{}.Adaptive_Record (bit 34) accepted (PEBS_BASELINE)", i),
                msr,
                v,
                v,
            );
            wr(msr, base);
        }
        if p.any_allowed() {
            write_reads(
                format_args!("IA32_PERFEVTSEL{}.ANY (bit 21) accepted (v3+)", i),
                msr,
                base | EVTSEL_ANY,
                base | EVTSEL_ANY,
            );
            wr(msr, base);
        } else {
            expect_gp_unchanged(
                format_args!("IA32_PERFEVTSEL{}.ANY (bit 21) #GPs {}, state unchanged", i, p.any_reserved_reason()),
                msr,
                base | EVTSEL_ANY,
                msr,
            );
        }
        let all = p.perfevtsel_valid();
        write_reads(format_args!("IA32_PERFEVTSEL{} every defined bit of 31:0 accepted", i), msr, all, all);
        wr(msr, 0);
    }
    reset(p);
}

/// Group 4b: IA32_FIXED_CTR_CTRL fields (SDM Figure 18-7).
fn check_fixed_ctr_ctrl(p: &Pmu) {
    if !needs_version(p, 2, "IA32_FIXED_CTR_CTRL fields") {
        return;
    }
    let msr = IA32_FIXED_CTR_CTRL;
    let valid = p.fixed_ctr_ctrl_valid();
    if valid != 0 {
        write_reads(
            format_args!("IA32_FIXED_CTR_CTRL all fields of the supported counters accepted ({:#x})", valid),
            msr,
            valid,
            valid,
        );
    }
    // A non-zero state for the "unchanged" checks: the first supported counter enabled for CPL0.
    let base = p.fixed_indices().next().map_or(0, |i| fixed_field(i, FIXED_EN_OS));
    for i in 0..MAX_FIXED {
        if p.fixed_exists(i) {
            let v = fixed_field(i, FIXED_EN_ALL | FIXED_PMI);
            write_reads(format_args!("IA32_FIXED_CTR_CTRL field {} EN=3|PMI accepted", i), msr, v, v);
            wr(msr, base);
            let any = base | fixed_field(i, FIXED_ANY);
            if p.any_allowed() {
                write_reads(format_args!("IA32_FIXED_CTR_CTRL field {} ANY accepted (v3+)", i), msr, any, any);
            } else {
                expect_gp_unchanged(
                    format_args!(
                        "IA32_FIXED_CTR_CTRL field {} ANY #GPs {}, state unchanged",
                        i,
                        p.any_reserved_reason()
                    ),
                    msr,
                    any,
                    msr,
                );
            }
            wr(msr, base);
        } else {
            wr(msr, base);
            expect_reserved_bits(
                format_args!("IA32_FIXED_CTR_CTRL field {} (no IA32_FIXED_CTR{}) bits each #GP, state unchanged", i, i),
                msr,
                base,
                fixed_field(i, 0xF),
                msr,
            );
        }
    }
    let adaptive = p.fixed_indices().fold(0, |m, i| m | p.fixed_adaptive(i));
    for i in p.fixed_indices().filter(|&i| p.fixed_adaptive(i) != 0) {
        let v = base | p.fixed_adaptive(i);
        write_reads(
            format_args!("IA32_FIXED_CTR_CTRL.FC{}_Adaptive_Record (bit {}) accepted (PEBS_BASELINE)", i, 32 + 4 * i),
            msr,
            v,
            v,
        );
        wr(msr, base);
    }
    expect_reserved_bits(
        format_args!(
            "IA32_FIXED_CTR_CTRL bits 63:16 each #GP (but the supported counters' Adaptive_Record bits {:#x}), state unchanged",
            adaptive
        ),
        msr,
        base,
        !0xFFFF & !adaptive,
        msr,
    );
    reset(p);
}

/// Group 4c: IA32_PERF_GLOBAL_CTRL (SDM Figure 18-3).
fn check_global_ctrl(p: &Pmu) {
    if !needs_version(p, 2, "IA32_PERF_GLOBAL_CTRL") {
        return;
    }
    let msr = IA32_PERF_GLOBAL_CTRL;
    let valid = p.counter_bits() | p.perf_metrics_bit();
    write_reads(
        format_args!("IA32_PERF_GLOBAL_CTRL enables of every counter accepted ({:#x})", valid),
        msr,
        valid,
        valid,
    );
    write_reads(format_args!("IA32_PERF_GLOBAL_CTRL = 0 reads back"), msr, 0, 0);
    wr(msr, 1);
    expect_reserved_bits(
        format_args!("IA32_PERF_GLOBAL_CTRL bits of absent counters and reserved bits each #GP, state unchanged"),
        msr,
        1,
        !valid,
        msr,
    );
    reset(p);
}

/// Group 4d: IA32_PERF_GLOBAL_OVF_CTRL / STATUS_RESET reserved bits per version
/// (SDM Figures 18-5 (v2), 18-8 (v3), 18-11 (v4)).
fn check_ovf_ctrl(p: &Pmu) {
    if !needs_version(p, 2, "IA32_PERF_GLOBAL_OVF_CTRL") {
        return;
    }
    let msr = IA32_PERF_GLOBAL_OVF_CTRL;
    let valid = p.ovf_ctrl_valid();
    // On v4+, a status bit set through STATUS_SET shows that a faulting write cleared nothing.
    let pre = if p.version >= 4 { 1u64 << STATUS_OVF_BUFFER } else { 0 };
    let set_pre = || {
        if pre != 0 {
            wr(IA32_PERF_GLOBAL_STATUS_SET, pre);
        }
    };
    let named: [(u32, u8); 6] = [
        (STATUS_OVF_BUFFER, 2),
        (STATUS_COND_CHGD, 2),
        (STATUS_OVF_UNCORE, 3),
        (STATUS_TRACE_TOPA_PMI, 4),
        (STATUS_LBR_FRZ, 4),
        (STATUS_CTR_FRZ, 4),
    ];
    for (b, since) in named {
        set_pre();
        if p.version >= since {
            check!(
                wrmsr_safe(msr, 1u64 << b).is_ok(),
                "IA32_PERF_GLOBAL_OVF_CTRL bit {} (Clr {}) accepted (v{}+)",
                b,
                StatusBit(b),
                since
            );
        } else {
            // The write also asks to clear the pre-set OvfBuffer bit: nothing may be cleared.
            expect_gp_unchanged(
                format_args!(
                    "IA32_PERF_GLOBAL_OVF_CTRL bit {} (Clr {}) #GPs before v{}, status unchanged",
                    b,
                    StatusBit(b),
                    since
                ),
                msr,
                pre | 1u64 << b,
                IA32_PERF_GLOBAL_STATUS,
            );
        }
    }
    set_pre();
    check!(
        wrmsr_safe(msr, p.counter_bits()).is_ok(),
        "IA32_PERF_GLOBAL_OVF_CTRL clear bits of every counter accepted ({:#x})",
        p.counter_bits()
    );
    set_pre();
    let named_mask = named.iter().fold(0u64, |m, &(b, _)| m | 1u64 << b);
    expect_reserved_bits(
        format_args!("IA32_PERF_GLOBAL_OVF_CTRL reserved bits each #GP, IA32_PERF_GLOBAL_STATUS unchanged"),
        msr,
        pre,
        !valid & !named_mask,
        IA32_PERF_GLOBAL_STATUS,
    );
    check_eq!(rd(msr), 0, "IA32_PERF_GLOBAL_OVF_CTRL reads 0");
    reset(p);
}

/// Group 5: IA32_PERF_GLOBAL_STATUS_SET / _RESET (v4+, SDM 18.2.4.2).
fn check_status_set_reset(p: &Pmu) {
    if !needs_version(p, 4, "IA32_PERF_GLOBAL_STATUS_SET/RESET") {
        return;
    }
    let (set, reset_msr, status) =
        (IA32_PERF_GLOBAL_STATUS_SET, IA32_PERF_GLOBAL_STATUS_RESET, IA32_PERF_GLOBAL_STATUS);
    let valid = p.status_set_valid();
    for b in bits(valid) {
        let bit = 1u64 << b;
        wr(set, bit);
        check_eq!(rd(status), bit, "IA32_PERF_GLOBAL_STATUS_SET bit {} sets GLOBAL_STATUS.{}", b, StatusBit(b));
        wr(reset_msr, bit);
        check_eq!(rd(status), 0, "IA32_PERF_GLOBAL_STATUS_RESET bit {} clears GLOBAL_STATUS.{}", b, StatusBit(b));
    }
    wr(set, valid);
    check_eq!(rd(status), valid, "IA32_PERF_GLOBAL_STATUS_SET of every settable bit at once");
    check_eq!(rd(set), 0, "IA32_PERF_GLOBAL_STATUS_SET reads 0");
    wr(reset_msr, 0);
    check_eq!(rd(status), valid, "IA32_PERF_GLOBAL_STATUS_RESET of 0 clears nothing");
    wr(reset_msr, p.gp_bits());
    check_eq!(rd(status), valid & !p.gp_bits(), "IA32_PERF_GLOBAL_STATUS_RESET clears only the bits written");
    wr(reset_msr, p.ovf_ctrl_valid());
    check_eq!(rd(status), 0, "IA32_PERF_GLOBAL_STATUS_RESET of every bit clears GLOBAL_STATUS");
    wr(set, 1);
    wr(set, 1 << STATUS_OVF_BUFFER);
    check_eq!(
        rd(status),
        1 | 1 << STATUS_OVF_BUFFER,
        "IA32_PERF_GLOBAL_STATUS_SET is write-1-to-set (earlier bits stay set)"
    );
    // The write also sets a valid bit (Ovf_PMC1 or Ovf_FixedCtr) that must not take effect.
    let extra = bits(valid & !1).next().map_or(0, |b| 1u64 << b);
    expect_gp_unchanged(
        format_args!("IA32_PERF_GLOBAL_STATUS_SET bit 63 (CondChgd) #GPs, status unchanged"),
        set,
        1u64 << STATUS_COND_CHGD | extra,
        status,
    );
    expect_gp_unchanged(
        format_args!("IA32_PERF_GLOBAL_STATUS_SET bit 60 (ASCI, no SGX) #GPs, status unchanged"),
        set,
        1u64 << STATUS_ASCI | extra,
        status,
    );
    let named = 1u64 << STATUS_COND_CHGD | 1u64 << STATUS_ASCI;
    expect_reserved_bits(
        format_args!("IA32_PERF_GLOBAL_STATUS_SET reserved bits each #GP, status unchanged"),
        set,
        extra,
        !valid & !named,
        status,
    );
    reset(p);
    check_eq!(rd(status), 0, "IA32_PERF_GLOBAL_STATUS is 0 again after the reset");
}

/// Group 4e: read-only registers #GP on any write and keep their value.
fn check_read_only(p: &Pmu) {
    if p.version >= 2 {
        if p.version >= 4 {
            wr(IA32_PERF_GLOBAL_STATUS_SET, 1);
        }
        for v in [0, 1, 1u64 << STATUS_OVF_BUFFER] {
            expect_gp_unchanged(
                format_args!("IA32_PERF_GLOBAL_STATUS is read-only: WRMSR of {:#x} #GPs, status unchanged", v),
                IA32_PERF_GLOBAL_STATUS,
                v,
                IA32_PERF_GLOBAL_STATUS,
            );
        }
    } else {
        skip!("IA32_PERF_GLOBAL_STATUS read-only (needs perfmon v2)");
    }
    if p.version >= 4 {
        if p.gp > 0 {
            wr(IA32_PERFEVTSEL0, EVENT_INST_RETIRED);
        }
        for v in [0, 1, INUSE_PMI] {
            expect_gp_unchanged(
                format_args!("IA32_PERF_GLOBAL_INUSE is read-only: WRMSR of {:#x} #GPs, unchanged", v),
                IA32_PERF_GLOBAL_INUSE,
                v,
                IA32_PERF_GLOBAL_INUSE,
            );
        }
    } else {
        skip!("IA32_PERF_GLOBAL_INUSE read-only (needs perfmon v4)");
    }
    if p.pdcm {
        for v in [0, p.perf_capabilities] {
            expect_gp_unchanged(
                format_args!("IA32_PERF_CAPABILITIES is read-only: WRMSR of {:#x} #GPs, unchanged", v),
                IA32_PERF_CAPABILITIES,
                v,
                IA32_PERF_CAPABILITIES,
            );
        }
    } else {
        skip!("IA32_PERF_CAPABILITIES read-only (CPUID.01H:ECX.PDCM = 0)");
    }
    reset(p);
}

/// Group 6: IA32_PERF_GLOBAL_INUSE follows the control registers (v4+, SDM 18.2.4.3).
fn check_inuse(p: &Pmu) {
    if !needs_version(p, 4, "IA32_PERF_GLOBAL_INUSE") {
        return;
    }
    let inuse = IA32_PERF_GLOBAL_INUSE;
    check_eq!(rd(inuse), 0, "IA32_PERF_GLOBAL_INUSE is 0 with nothing programmed");
    for i in 0..p.gp {
        let sel = IA32_PERFEVTSEL0 + u32::from(i);
        let bit = 1u64 << i;
        // (IA32_PERFEVTSELi value, expected INUSE, what it shows)
        let cases: [(u64, u64, &str); 6] = [
            (EVENT_INST_RETIRED, bit, "event select alone sets the counter's bit"),
            (EVTSEL_COUNT_INSTRUCTIONS, bit, "EN|OS|USR event 0xc0 sets the counter's bit"),
            (0x100, 0, "umask without event select sets nothing"),
            (EVTSEL_EN | EVTSEL_OS | EVTSEL_USR, 0, "EN with event select 0 sets nothing"),
            (EVTSEL_INT, INUSE_PMI, "INT alone sets only PMI_InUse"),
            (
                EVTSEL_INT | EVENT_INST_RETIRED,
                bit | INUSE_PMI,
                "INT and event select set the counter's bit and PMI_InUse",
            ),
        ];
        for (v, want, what) in cases {
            wr(sel, v);
            check_eq!(rd(inuse), want, "IA32_PERF_GLOBAL_INUSE with IA32_PERFEVTSEL{} = {:#x}: {}", i, v, what);
        }
        wr(sel, 0);
        check_eq!(rd(inuse), 0, "IA32_PERF_GLOBAL_INUSE clears when IA32_PERFEVTSEL{} is 0 again", i);
    }
    for i in p.fixed_indices() {
        let bit = 1u64 << (32 + i);
        let cases: [(u64, u64, &str); 6] = [
            (FIXED_EN_OS, bit, "EN=1 (OS) sets the counter's bit"),
            (FIXED_EN_USR, bit, "EN=2 (USR) sets the counter's bit"),
            (FIXED_EN_ALL, bit, "EN=3 sets the counter's bit"),
            (FIXED_PMI, INUSE_PMI, "PMI alone sets only PMI_InUse"),
            (FIXED_EN_ALL | FIXED_PMI, bit | INUSE_PMI, "EN=3|PMI set the counter's bit and PMI_InUse"),
            (FIXED_ANY, 0, "ANY alone sets nothing"),
        ];
        let n = if p.any_allowed() { cases.len() } else { cases.len() - 1 };
        for &(field, want, what) in &cases[..n] {
            let v = fixed_field(i, field);
            wr(IA32_FIXED_CTR_CTRL, v);
            check_eq!(rd(inuse), want, "IA32_PERF_GLOBAL_INUSE with IA32_FIXED_CTR_CTRL = {:#x}: {}", v, what);
        }
        wr(IA32_FIXED_CTR_CTRL, 0);
        check_eq!(rd(inuse), 0, "IA32_PERF_GLOBAL_INUSE clears when IA32_FIXED_CTR_CTRL field {} is 0 again", i);
    }
    for i in 0..p.gp {
        wr(IA32_PEBS_ENABLE, 1 << i);
        check_eq!(rd(inuse), INUSE_PMI, "IA32_PERF_GLOBAL_INUSE.PMI_InUse follows IA32_PEBS_ENABLE bit {}", i);
    }
    wr(IA32_PEBS_ENABLE, 0);
    // Everything at once: each counter's bit, and PMI_InUse only from the one INT bit.
    let mut want = 0;
    for i in 0..p.gp {
        wr(IA32_PERFEVTSEL0 + u32::from(i), EVTSEL_COUNT_INSTRUCTIONS);
        want |= 1u64 << i;
    }
    let mut ctrl = 0;
    for i in p.fixed_indices() {
        ctrl |= fixed_field(i, FIXED_EN_ALL);
        want |= 1u64 << (32 + i);
    }
    wr(IA32_FIXED_CTR_CTRL, ctrl);
    check_eq!(rd(inuse), want, "IA32_PERF_GLOBAL_INUSE with every counter programmed");
    if p.gp > 0 {
        wr(IA32_PERFEVTSEL0, EVTSEL_COUNT_INSTRUCTIONS | EVTSEL_INT);
        check_eq!(rd(inuse), want | INUSE_PMI, "IA32_PERF_GLOBAL_INUSE with every counter programmed and PMC0 INT");
    }
    reset(p);
    check_eq!(rd(inuse), 0, "IA32_PERF_GLOBAL_INUSE is 0 again after the reset");
}

/// Group 4f: IA32_DEBUGCTL (SDM 17.4.1; FREEZE_PERFMON_ON_PMI needs v2, FREEZE_WHILE_SMM needs
/// IA32_PERF_CAPABILITIES[12]).
fn check_debugctl(p: &Pmu) {
    let msr = IA32_DEBUGCTL;
    for (b, name, allowed) in p.debugctl_bits() {
        let v = 1u64 << b;
        if allowed {
            write_reads(format_args!("IA32_DEBUGCTL.{} (bit {}) is writable", name, b), msr, v, v);
        } else {
            wr(msr, 1 << DEBUGCTL_LBR);
            expect_gp_unchanged(
                format_args!("IA32_DEBUGCTL.{} (bit {}) #GPs on this PMU, state unchanged", name, b),
                msr,
                v,
                msr,
            );
        }
        wr(msr, 0);
    }
    let valid = p.debugctl_valid();
    write_reads(format_args!("IA32_DEBUGCTL all allowed bits at once ({:#x})", valid), msr, valid, valid);
    let base = 1u64 << DEBUGCTL_LBR;
    wr(msr, base);
    let named = p.debugctl_bits().iter().fold(0u64, |m, b| m | 1u64 << b.0);
    expect_reserved_bits(format_args!("IA32_DEBUGCTL other bits each #GP, state unchanged"), msr, base, !named, msr);
    reset(p);
}

/// Group 4g: IA32_MISC_ENABLE: writable, read-only and reserved bits.
fn check_misc_enable(p: &Pmu) {
    let msr = IA32_MISC_ENABLE;
    let cur = p.misc_enable_power_on();
    let prefetch: &[(u32, &str)] = if core_2() { &MISC_PREFETCH } else { &[] };
    for (b, name) in MISC_WRITABLE.iter().chain(prefetch) {
        let v = cur ^ 1u64 << b;
        write_reads(format_args!("IA32_MISC_ENABLE bit {} ({}) is writable", b, name), msr, v, v);
        wr(msr, cur);
    }
    for (b, name) in MISC_READ_ONLY {
        write_reads(
            format_args!("IA32_MISC_ENABLE bit {} ({}) is read-only: a write flipping it is ignored", b, name),
            msr,
            cur ^ 1u64 << b,
            cur,
        );
    }
    // The writable part of such a write is stored.
    let tcc = 1u64 << 3;
    write_reads(
        format_args!("IA32_MISC_ENABLE write flipping read-only bits still stores the writable bits"),
        msr,
        cur ^ MISC_PERFMON_AVAILABLE ^ MISC_BTS_UNAVAILABLE ^ MISC_PEBS_UNAVAILABLE ^ tcc,
        cur ^ tcc,
    );
    wr(msr, cur);
    let known = MISC_WRITABLE.iter().chain(MISC_READ_ONLY.iter()).chain(prefetch).fold(0u64, |m, b| m | 1u64 << b.0);
    expect_reserved_bits(
        format_args!("IA32_MISC_ENABLE reserved bits each #GP, state unchanged"),
        msr,
        cur,
        !known,
        msr,
    );
    reset(p);
}

/// Group 4h: IA32_PEBS_ENABLE: one enable bit per general-purpose counter (stored only).
fn check_pebs_enable(p: &Pmu) {
    if !needs_version(p, 1, "IA32_PEBS_ENABLE") {
        return;
    }
    let msr = IA32_PEBS_ENABLE;
    // With adaptive PEBS (PERF_CAPABILITIES.PEBS_BASELINE, bit 14) the fixed counters' bits too.
    let baseline = p.perf_capabilities & (1 << 14) != 0;
    let valid = p.gp_bits() | if baseline { p.fixed_bits() } else { 0 };
    write_reads(format_args!("IA32_PEBS_ENABLE bits {:#x} accepted", valid), msr, valid, valid);
    wr(msr, 1);
    expect_reserved_bits(format_args!("IA32_PEBS_ENABLE's other bits each #GP, state unchanged"), msr, 1, !valid, msr);
    reset(p);
}

/// Group 4i: IA32_DS_AREA holds a linear address: non-canonical values #GP (WRMSR, SDM Vol. 2).
/// On a processor that supports 5-level paging (CPUID.07H:ECX.LA57), MSRs holding a linear
/// address take any 57-bit canonical value even while CR4.LA57 = 0 (Intel's 5-level paging white
/// paper; KVM's is_noncanonical_msr_address and kvm-unit-tests x86/la57.c do the same).
fn check_ds_area(p: &Pmu) {
    if !needs_version(p, 1, "IA32_DS_AREA") {
        return;
    }
    let msr = IA32_DS_AREA;
    let la = u32::from(p.linear_bits);
    let top = (1u64 << (la - 1)) - 1; // highest canonical positive address
    let low_negative = !top; // lowest canonical negative address
    for v in [0x1000, top & !0xFFF, low_negative, !0xFFF] {
        write_reads(format_args!("IA32_DS_AREA canonical {:#x} ({} address bits) accepted", v, la), msr, v, v);
    }
    wr(msr, 0x1000);
    for v in [top + 1, low_negative - 0x1000, 0x8000_0000_0000_0000] {
        expect_gp_unchanged(
            format_args!("IA32_DS_AREA non-canonical {:#x} ({} address bits) #GPs, unchanged", v, la),
            msr,
            v,
            msr,
        );
    }
    reset(p);
}

/// Group 7: the configuration of a counter set up to overflow on its next event round-trips
/// (IA32_PMCx preset to its maximum, PERFEVTSEL EN without INT, GLOBAL_CTRL enables). Nothing
/// here depends on whether the counters advance.
fn check_counting_config(p: &Pmu) {
    if !needs_version(p, 1, "counter configuration round-trip") {
        return;
    }
    let m = width_mask(p.gp_width);
    for i in 0..p.gp {
        write_reads(
            format_args!("IA32_PMC{} preset to its maximum by a legacy write of 0xffffffff", i),
            IA32_PMC0 + u32::from(i),
            0xFFFF_FFFF,
            m,
        );
        write_reads(
            format_args!("IA32_PERFEVTSEL{} = 0x4300c0 (EN|OS|USR, no INT) reads back", i),
            IA32_PERFEVTSEL0 + u32::from(i),
            EVTSEL_COUNT_INSTRUCTIONS,
            EVTSEL_COUNT_INSTRUCTIONS,
        );
    }
    if p.version >= 2 {
        let fm = width_mask(p.fixed_width);
        let mut ctrl = 0;
        for i in p.fixed_indices() {
            write_reads(
                format_args!("IA32_FIXED_CTR{} preset to its maximum", i),
                IA32_FIXED_CTR0 + u32::from(i),
                fm,
                fm,
            );
            ctrl |= fixed_field(i, FIXED_EN_ALL);
        }
        write_reads(
            format_args!("IA32_FIXED_CTR_CTRL EN=3 for every fixed counter reads back"),
            IA32_FIXED_CTR_CTRL,
            ctrl,
            ctrl,
        );
        let all = p.counter_bits();
        write_reads(
            format_args!("IA32_PERF_GLOBAL_CTRL enabling every counter reads back"),
            IA32_PERF_GLOBAL_CTRL,
            all,
            all,
        );
        if p.version >= 4 {
            check_eq!(rd(IA32_PERF_GLOBAL_INUSE), all, "IA32_PERF_GLOBAL_INUSE shows every configured counter, no PMI");
        }
    }
    reset(p);
    for r in Reg::all().filter(|r| r.exists(p) && !r.read_only() && !r.command()) {
        if let Some(want) = r.power_on(p) {
            check_eq!(rd(r.msr()), want, "{} back at its power-on value after the round-trip", r);
        }
    }
}

fn main(_boot: &BootInfo) -> i32 {
    if emon_guest::netburst::present() {
        skip!("msr-semantics: a NetBurst processor has no architectural perfmon MSRs (CPUID.0AH reads 0); guest:netburst-msrs checks its PMU");
        return emon_guest::summary();
    }
    let p = Pmu::from_cpuid();
    header(&p);
    check_power_on(&p);
    check_existence(&p);
    check_gp_widths(&p);
    check_fixed_widths(&p);
    check_perfevtsel(&p);
    check_fixed_ctr_ctrl(&p);
    check_global_ctrl(&p);
    check_ovf_ctrl(&p);
    check_status_set_reset(&p);
    check_read_only(&p);
    check_inuse(&p);
    check_debugctl(&p);
    check_misc_enable(&p);
    check_pebs_enable(&p);
    check_ds_area(&p);
    check_counting_config(&p);
    emon_guest::summary()
}
