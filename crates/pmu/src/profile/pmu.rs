//! [`PmuProfile`]: CPUID leaf 0x0A and the MSR-visible PMU capabilities of a profile.

use super::{Lbr, ModelMsrs};
use crate::events::EventList;

/// Which performance-monitoring architecture a profile presents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PmuKind {
    /// Architectural performance monitoring, described by CPUID leaf 0x0A (version 0: none).
    #[default]
    Architectural,
    /// The Intel NetBurst PMU of Pentium 4 and Xeon (family 0FH, SDM 18.15-18.16): 18 counters,
    /// their CCCRs and the ESCRs that select events, and no CPUID leaf 0x0A.
    NetBurst,
}

/// Why a PMU model is counted by the precise backend only (see [`PmuProfile::precise_only`]):
/// what `--backend perf` says refusing it, why `--backend auto` chooses precise, and what
/// `emon host` says of such profiles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PreciseOnly {
    pub refusal: &'static str,
    pub auto: &'static str,
    pub host: &'static str,
}

/// CPUID leaf 0x0A and the MSR-visible PMU capabilities of a profile.
///
/// The fields are the raw register fields; [`PmuProfile::leaf_0a`] packs them back into
/// the four registers the guest sees. A value loaded through [`super::Profile`] has been
/// validated (see `validate.rs`), so the invariants stated there hold.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PmuProfile {
    /// CPUID.0AH:EAX[7:0], version ID of architectural performance monitoring (0..=5).
    pub version: u8,
    /// CPUID.0AH:EAX[15:8], number of IA32_PMCx / IA32_PERFEVTSELx pairs per logical processor.
    pub gp: u8,
    /// CPUID.0AH:EAX[23:16], bit width of the IA32_PMCx counters.
    pub gp_width: u8,
    /// CPUID.0AH:EAX[31:24], length of the EBX architectural-event vector.
    pub ebx_length: u8,
    /// CPUID.0AH:EBX, a set bit means the architectural event is NOT available.
    pub ebx_unavailable: u32,
    /// CPUID.0AH:EDX[4:0], number of contiguous fixed-function counters (version 2+).
    pub fixed: u8,
    /// CPUID.0AH:EDX[12:5], bit width of the fixed-function counters (version 2+).
    pub fixed_width: u8,
    /// CPUID.0AH:ECX, fixed-counter support bitmap (version 5; 0 before).
    pub fixed_bitmap: u32,
    /// IA32_PERF_CAPABILITIES (MSR 0x345); CPUID.01H:ECX.PDCM[15] = (value != 0).
    pub perf_capabilities: u64,
    /// IA32_MISC_ENABLE[7], "performance monitoring available".
    pub misc_enable_perfmon: bool,
    /// Nominal core frequency in MHz, for cycle cost models.
    pub nominal_mhz: u32,
    /// The LBR stack's MSRs, `None` where the profile presents none.
    pub lbr: Option<Lbr>,
    /// OFFCORE_RSP, PEBS_LD_LAT and PEBS_FRONTEND, where the CPU has them.
    pub msrs: ModelMsrs,
    /// The PMU architecture: architectural perfmon, or NetBurst (then `version` is 0).
    pub kind: PmuKind,
    /// The CPU's model-specific event list (README, "Model-specific events"), chosen by its
    /// vendor, family and model ([`super::Profile::resolve_events`]); `None` where emon ships
    /// none, and under the NetBurst PMU, whose events are its own.
    pub events: Option<&'static EventList>,
}

impl PmuProfile {
    /// IA32_PERF_CAPABILITIES.FW_WRITE[13]: IA32_A_PMCx full-width write aliases exist (SDM 18.2.5).
    pub const FW_WRITE: u64 = 1 << 13;

    /// Does IA32_PERF_CAPABILITIES advertise full-width writes (FW_WRITE, bit 13)?
    pub fn fw_write(&self) -> bool {
        self.perf_capabilities & Self::FW_WRITE != 0
    }

    /// Is fixed-function counter `i` (IA32_FIXED_CTRi) supported?
    ///
    /// SDM 18.2.5 (version 5): counter i is supported if ECX[i] is set or EDX[4:0] > i.
    /// Before version 5 only the contiguous `i < EDX[4:0]` rule applies; version 0 and 1
    /// have no fixed counters at all.
    pub fn fixed_supported(&self, i: u8) -> bool {
        if self.version < 2 {
            return false;
        }
        let contiguous = i < self.fixed;
        let in_bitmap =
            self.version >= 5 && 1u32.checked_shl(u32::from(i)).is_some_and(|bit| self.fixed_bitmap & bit != 0);
        contiguous || in_bitmap
    }

    /// 1 + the highest supported fixed-counter index (0 if none): how many IA32_FIXED_CTRx
    /// MSR indices exist (some may be holes when the version 5 bitmap is sparse).
    pub fn fixed_msr_count(&self) -> u8 {
        (0..32u8).rev().find(|&i| self.fixed_supported(i)).map_or(0, |i| i + 1)
    }

    /// `[eax, ebx, ecx, edx]` of CPUID leaf 0x0A as the guest sees it.
    pub fn leaf_0a(&self) -> [u32; 4] {
        let eax = u32::from(self.version)
            | u32::from(self.gp) << 8
            | u32::from(self.gp_width) << 16
            | u32::from(self.ebx_length) << 24;
        // EDX[4:0] fixed count, EDX[12:5] fixed width. EDX[15] (AnyThread deprecation) is
        // not modelled and always reads 0.
        let edx = u32::from(self.fixed & 0x1F) | u32::from(self.fixed_width) << 5;
        [eax, self.ebx_unavailable, self.fixed_bitmap, edx]
    }

    /// Is architectural event `bit` (its CPUID.0AH:EBX bit index, SDM Table 18-1) available?
    /// True iff `bit < ebx_length` and the EBX bit is clear.
    pub fn arch_event_available(&self, bit: u8) -> bool {
        bit < self.ebx_length && 1u32.checked_shl(u32::from(bit)).is_some_and(|mask| self.ebx_unavailable & mask == 0)
    }

    /// IA32_PERF_CAPABILITIES[5:0] LBR_FMT: the format of the LBR stack's records.
    pub fn lbr_format(&self) -> u8 {
        (self.perf_capabilities & 0x3F) as u8
    }

    /// IA32_PERF_CAPABILITIES[11:8] PEBS_FMT: the format of PEBS records.
    pub fn pebs_format(&self) -> u8 {
        ((self.perf_capabilities >> 8) & 0xF) as u8
    }

    /// Is PEBS presented when the backend writes PEBS records (`backend_writes`)? The profile
    /// must enumerate a PEBS format emon writes through IA32_PERF_CAPABILITIES, on a CPU with
    /// architectural perfmon: 0-3 (SDM 18.6: Core 2 to Skylake), or 4 with PEBS_BASELINE
    /// (adaptive PEBS, Ice Lake).
    pub fn presents_pebs(&self, backend_writes: bool) -> bool {
        let baseline = self.perf_capabilities & (1 << 14) != 0;
        let format = self.pebs_format();
        backend_writes && self.version >= 1 && self.pdcm() && (format <= 3 || format == 4 && baseline)
    }

    /// Is this the NetBurst PMU (SDM 18.15)?
    pub fn netburst(&self) -> bool {
        self.kind == PmuKind::NetBurst
    }

    /// Why only a backend that derives events from the instruction stream can count this PMU,
    /// if so: host perf has no event for a guest that the model's event encodings name.
    pub fn precise_only(&self) -> Option<PreciseOnly> {
        self.netburst().then_some(PreciseOnly {
            refusal: "presents the NetBurst PMU, whose ESCR events host perf cannot count for a guest; use --backend precise (README, \"The NetBurst PMU\")",
            auto: "the profile presents the NetBurst PMU, which only the precise backend counts",
            host: "a NetBurst profile (pentium4) is counted by the precise backend only: host perf has no ESCR events for a guest, so auto chooses precise and --backend perf is refused; ESCR events emon does not derive count 0 and the run summary says NOT EXACT (emon events --profile pentium4)",
        })
    }

    /// CPUID.01H:ECX.PDCM[15]: IA32_PERF_CAPABILITIES exists.
    pub fn pdcm(&self) -> bool {
        self.perf_capabilities != 0
    }
}
