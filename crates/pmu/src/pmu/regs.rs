//! Bitfield decoding of IA32_PERFEVTSELx and IA32_FIXED_CTR_CTRL, and the writable-bit masks of
//! every PMU register computed once from a [`PmuProfile`] (everything else is reserved => #GP).

use super::counter::effective_width;
use super::msr::*;
use crate::profile::{Lbr, ModelMsrs, PmuProfile};

/// A decoded IA32_PERFEVTSELx value (SDM Figure 18-6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PerfEvtSel(pub u64);

impl PerfEvtSel {
    /// Event select, bits 7:0.
    pub fn event_select(self) -> u8 {
        (self.0 & PERFEVTSEL_EVENT_MASK) as u8
    }
    /// Unit mask, bits 15:8.
    pub fn umask(self) -> u8 {
        (self.0 >> PERFEVTSEL_UMASK_SHIFT) as u8
    }
    /// USR (bit 16).
    pub fn usr(self) -> bool {
        self.0 & PERFEVTSEL_USR != 0
    }
    /// OS (bit 17).
    pub fn os(self) -> bool {
        self.0 & PERFEVTSEL_OS != 0
    }
    /// E, edge detect (bit 18).
    pub fn edge(self) -> bool {
        self.0 & PERFEVTSEL_E != 0
    }
    /// PC, pin control (bit 19).
    pub fn pc(self) -> bool {
        self.0 & PERFEVTSEL_PC != 0
    }
    /// INT, PMI on overflow (bit 20).
    pub fn int(self) -> bool {
        self.0 & PERFEVTSEL_INT != 0
    }
    /// ANY, AnyThread (bit 21).
    pub fn any(self) -> bool {
        self.0 & PERFEVTSEL_ANY != 0
    }
    /// EN (bit 22).
    pub fn en(self) -> bool {
        self.0 & PERFEVTSEL_EN != 0
    }
    /// INV (bit 23).
    pub fn inv(self) -> bool {
        self.0 & PERFEVTSEL_INV != 0
    }
    /// Counter mask, bits 31:24.
    pub fn cmask(self) -> u8 {
        (self.0 >> PERFEVTSEL_CMASK_SHIFT) as u8
    }
    /// Adaptive_Record (bit 34, adaptive PEBS).
    pub fn adaptive(self) -> bool {
        self.0 & PERFEVTSEL_ADAPTIVE != 0
    }
}

/// FIXED_CTR_CTRL's FCi_Adaptive_Record bit (32 + 4i), 0 for a counter past the register.
pub fn fixed_adaptive_bit(i: u8) -> u64 {
    FIXED_CTR_CTRL_ADAPTIVE0.checked_shl(u32::from(i) * FIXED_CTR_CTRL_FIELD_BITS).unwrap_or(0)
}

/// One 4-bit field of IA32_FIXED_CTR_CTRL (SDM Figure 18-7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FixedCtrField(pub u8);

impl FixedCtrField {
    /// Field `i` of an IA32_FIXED_CTR_CTRL value (bits 4i+3:4i); 0 for `i >= 16`.
    pub fn of(ctrl: u64, i: u8) -> FixedCtrField {
        let shift = u32::from(i) * FIXED_CTR_CTRL_FIELD_BITS;
        FixedCtrField(ctrl.checked_shr(shift).map_or(0, |v| (v & 0xF) as u8))
    }
    /// EN\[1:0\]: 0 off, 1 OS (CPL 0), 2 USR (CPL > 0), 3 all rings.
    pub fn en(self) -> u8 {
        self.0 & FIXED_CTR_CTRL_EN_MASK as u8
    }
    /// EN bit 0: counts at CPL 0.
    pub fn os(self) -> bool {
        u64::from(self.0) & FIXED_CTR_CTRL_EN_OS != 0
    }
    /// EN bit 1: counts at CPL > 0.
    pub fn usr(self) -> bool {
        u64::from(self.0) & FIXED_CTR_CTRL_EN_USR != 0
    }
    /// AnyThread (bit 2).
    pub fn any(self) -> bool {
        u64::from(self.0) & FIXED_CTR_CTRL_ANY != 0
    }
    /// PMI on overflow (bit 3).
    pub fn pmi(self) -> bool {
        u64::from(self.0) & FIXED_CTR_CTRL_PMI != 0
    }
}

/// The profile-derived shape of the PMU: which counters exist, their widths, and for every
/// writable register the mask of bits a WRMSR may set (any other bit set => #GP).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// CPUID.0AH:EAX\[7:0\].
    pub version: u8,
    /// Number of general-purpose counters, capped at [`MAX_GP`].
    pub gp: u8,
    /// Width of IA32_PMCx, clamped to 64.
    pub gp_width: u8,
    /// Width of IA32_FIXED_CTRx, clamped to 64.
    pub fixed_width: u8,
    /// `fixed[i]`: IA32_FIXED_CTRi exists (v2+ and `fixed_supported(i)`), i < [`MAX_FIXED`].
    pub fixed: [bool; MAX_FIXED as usize],
    /// IA32_A_PMCx exist (IA32_PERF_CAPABILITIES.FW_WRITE).
    pub fw_write: bool,
    /// IA32_PERF_CAPABILITIES value; the MSR exists iff non-zero (CPUID.1:ECX.PDCM).
    pub perf_capabilities: u64,
    /// Bits 0..gp-1.
    pub gp_bits: u64,
    /// Bits 32+i for each existing fixed counter i.
    pub fixed_bits: u64,
    /// Writable bits of IA32_PERFEVTSELx.
    pub perfevtsel_valid: u64,
    /// Writable bits of IA32_FIXED_CTR_CTRL.
    pub fixed_ctr_ctrl_valid: u64,
    /// Writable bits of IA32_PERF_GLOBAL_CTRL.
    pub global_ctrl_valid: u64,
    /// Bits IA32_PERF_GLOBAL_OVF_CTRL / STATUS_RESET may clear.
    pub ovf_ctrl_valid: u64,
    /// Bits IA32_PERF_GLOBAL_STATUS_SET may set.
    pub status_set_valid: u64,
    /// Writable bits of IA32_DEBUGCTL.
    pub debugctl_valid: u64,
    /// Writable bits of IA32_PEBS_ENABLE: the GP counters, and with adaptive PEBS the fixed ones.
    pub pebs_enable_valid: u64,
    /// PERF_CAPABILITIES.PEBS_BASELINE: adaptive PEBS (MSR_PEBS_DATA_CFG, PEBS on fixed counters).
    pub pebs_baseline: bool,
    /// The LBR stack's MSRs, if the profile has them.
    pub lbr: Option<Lbr>,
    /// IA32_PERF_CAPABILITIES\[5:0\] LBR_FMT.
    pub lbr_format: u8,
    /// OFFCORE_RSP, PEBS_LD_LAT and PEBS_FRONTEND.
    pub msrs: ModelMsrs,
}

/// MISC_ENABLE bits a guest may change.
pub const MISC_ENABLE_WRITABLE: u64 = MISC_ENABLE_FAST_STRINGS
    | MISC_ENABLE_TCC
    | MISC_ENABLE_EIST
    | MISC_ENABLE_MONITOR
    | MISC_ENABLE_LIMIT_CPUID
    | MISC_ENABLE_XTPR_DISABLE
    | MISC_ENABLE_XD_DISABLE;
/// MISC_ENABLE bits that read as the profile says and ignore writes.
pub const MISC_ENABLE_READ_ONLY: u64 =
    MISC_ENABLE_PERFMON_AVAILABLE | MISC_ENABLE_BTS_UNAVAILABLE | MISC_ENABLE_PEBS_UNAVAILABLE;

impl Layout {
    /// Compute the layout of `p`. Never panics: counts and widths beyond the architectural MSR
    /// ranges are capped (at most 8 IA32_PMCx, 4 IA32_FIXED_CTRx, 64-bit widths).
    pub fn new(p: &PmuProfile) -> Layout {
        let version = p.version;
        let gp = if version >= 1 { p.gp.min(MAX_GP) } else { 0 };
        let mut fixed = [false; MAX_FIXED as usize];
        for (i, f) in (0u8..).zip(fixed.iter_mut()) {
            *f = version >= 2 && p.fixed_supported(i);
        }
        let gp_bits = (1u64 << gp) - 1; // gp <= 8
        let fixed_bits = (0u8..)
            .zip(fixed)
            .filter(|&(_, f)| f)
            .fold(0u64, |m, (i, _)| m | 1u64 << (GLOBAL_FIXED_SHIFT + u32::from(i)));

        // PERFEVTSELx: bits 31:0 minus ANY before v3 (AnyThread came with v3, SDM 18.2.3;
        // emon never sets CPUID.0AH:EDX[15] "AnyThread deprecation").
        let mut perfevtsel_valid = !PERFEVTSEL_RESERVED_HIGH;
        if version < 3 {
            perfevtsel_valid &= !PERFEVTSEL_ANY;
        }
        let baseline = version >= 1 && p.perf_capabilities & PERF_CAPABILITIES_PEBS_BASELINE != 0;
        if baseline {
            perfevtsel_valid |= PERFEVTSEL_ADAPTIVE;
        }

        // FIXED_CTR_CTRL: EN | PMI (| ANY on v3+) in the field of each supported counter.
        let mut field = FIXED_CTR_CTRL_EN_MASK | FIXED_CTR_CTRL_PMI;
        if version >= 3 {
            field |= FIXED_CTR_CTRL_ANY;
        }
        // With adaptive PEBS, each supported counter's FCi_Adaptive_Record bit too.
        let fixed_ctr_ctrl_valid = (0u8..).zip(fixed).filter(|&(_, f)| f).fold(0u64, |m, (i, _)| {
            let adaptive = if baseline { fixed_adaptive_bit(i) } else { 0 };
            m | field << (u32::from(i) * FIXED_CTR_CTRL_FIELD_BITS) | adaptive
        });

        let counters = gp_bits | fixed_bits;
        // With PERF_METRICS, bit 48 of GLOBAL_CTRL, OVF_CTRL/STATUS_RESET and STATUS_SET is the
        // metrics' (SDM 18.3.9.3). emon does not count the metrics: they never overflow.
        let metrics = if version >= 2 && p.perf_capabilities & PERF_CAPABILITIES_PERF_METRICS != 0 {
            GLOBAL_PERF_METRICS
        } else {
            0
        };
        // OVF_CTRL (v2/v3) / STATUS_RESET (v4+): SDM Figures 18-5, 18-11.
        let mut ovf_ctrl_valid = counters | metrics | GLOBAL_STATUS_OVF_BUFFER | GLOBAL_STATUS_COND_CHGD;
        if version >= 3 {
            ovf_ctrl_valid |= GLOBAL_STATUS_OVF_UNCORE;
        }
        if version >= 4 {
            ovf_ctrl_valid |= GLOBAL_STATUS_TRACE_TOPA_PMI | GLOBAL_STATUS_LBR_FRZ | GLOBAL_STATUS_CTR_FRZ;
        }
        // STATUS_SET (v4+): SDM Figure 18-12 / Table 2-2 (CondChgd cannot be set; ASCI needs SGX).
        let status_set_valid = if version >= 4 {
            counters
                | metrics
                | GLOBAL_STATUS_TRACE_TOPA_PMI
                | GLOBAL_STATUS_LBR_FRZ
                | GLOBAL_STATUS_CTR_FRZ
                | GLOBAL_STATUS_OVF_UNCORE
                | GLOBAL_STATUS_OVF_BUFFER
        } else {
            0
        };

        let mut debugctl_valid = DEBUGCTL_LBR | DEBUGCTL_BTF | DEBUGCTL_FREEZE_LBRS_ON_PMI;
        if version >= 2 {
            debugctl_valid |= DEBUGCTL_FREEZE_PERFMON_ON_PMI;
        }
        if p.perf_capabilities & PERF_CAPABILITIES_FREEZE_WHILE_SMM != 0 {
            debugctl_valid |= DEBUGCTL_FREEZE_WHILE_SMM;
        }

        Layout {
            version,
            gp,
            gp_width: effective_width(p.gp_width),
            fixed_width: effective_width(p.fixed_width),
            fixed,
            fw_write: p.fw_write(),
            perf_capabilities: p.perf_capabilities,
            gp_bits,
            fixed_bits,
            perfevtsel_valid,
            fixed_ctr_ctrl_valid,
            global_ctrl_valid: if version >= 2 { counters | metrics } else { 0 },
            ovf_ctrl_valid: if version >= 2 { ovf_ctrl_valid } else { 0 },
            status_set_valid,
            debugctl_valid,
            pebs_enable_valid: if baseline { gp_bits | fixed_bits } else { gp_bits },
            pebs_baseline: baseline,
            lbr: p.lbr,
            lbr_format: p.lbr_format(),
            msrs: p.msrs,
        }
    }

    /// Does general-purpose counter `i` exist?
    pub fn gp_exists(&self, i: u8) -> bool {
        i < self.gp
    }

    /// Does fixed counter `i` exist?
    pub fn fixed_exists(&self, i: u8) -> bool {
        self.fixed.get(usize::from(i)).copied().unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perfevtsel_fields() {
        let s = PerfEvtSel(0xA5F3_3C2E);
        assert_eq!(s.event_select(), 0x2E);
        assert_eq!(s.umask(), 0x3C);
        assert!(s.usr() && s.os() && !s.edge() && !s.pc());
        assert!(s.int() && s.any() && s.en() && s.inv());
        assert_eq!(s.cmask(), 0xA5);
        assert!(!s.adaptive());
        let s = PerfEvtSel(0x4_0053_00C0);
        assert!(s.usr() && s.os() && s.int() && s.en() && !s.any() && !s.inv() && s.adaptive());
        assert_eq!((s.event_select(), s.umask(), s.cmask()), (0xC0, 0, 0));
    }

    #[test]
    fn fixed_fields() {
        let ctrl = 0xB0E3;
        let f0 = FixedCtrField::of(ctrl, 0);
        assert_eq!(f0.en(), 3);
        assert!(f0.os() && f0.usr() && !f0.any() && !f0.pmi());
        let f1 = FixedCtrField::of(ctrl, 1);
        assert_eq!(f1.en(), 2);
        assert!(f1.usr() && !f1.os() && f1.any() && f1.pmi());
        assert_eq!(FixedCtrField::of(ctrl, 2).0, 0);
        let f3 = FixedCtrField::of(ctrl, 3);
        assert_eq!(f3.en(), 3);
        assert!(f3.pmi() && !f3.any());
        assert_eq!(FixedCtrField::of(u64::MAX, 16).0, 0);
        assert_eq!(FixedCtrField::of(u64::MAX, 255).0, 0);
        assert_eq!([0, 1, 2, 3].map(fixed_adaptive_bit), [1 << 32, 1 << 36, 1 << 40, 1 << 44]);
        assert_eq!(fixed_adaptive_bit(8), 0);
    }
}
