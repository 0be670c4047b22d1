//! Architectural performance-monitoring MSR indices and bit positions, with their SDM names
//! (SDM Vol. 4, Table 2-2 "IA-32 Architectural MSRs"; SDM Vol. 3B chapter 20/18 "Performance Monitoring").

/// IA32_PMC0: first general-purpose counter (legacy 32-bit-sign-extended write path). PMCi = 0xC1 + i.
pub const IA32_PMC0: u32 = 0xC1;
/// IA32_PERFEVTSEL0: event select for IA32_PMC0. PERFEVTSELi = 0x186 + i.
pub const IA32_PERFEVTSEL0: u32 = 0x186;
/// IA32_MISC_ENABLE.
pub const IA32_MISC_ENABLE: u32 = 0x1A0;
/// MSR_MISC_FEATURE_CONTROL: bit 0 L2 hardware prefetcher disable, 1 L2 adjacent cache line
/// prefetcher disable, 2 DCU prefetcher disable, 3 DCU IP prefetcher disable (Intel's "Disclosure
/// of H/W prefetcher control on some Intel processors"; Nehalem on). Not a PMU register: the PMU
/// keeps it for the cache model (`prefetch.rs`).
pub const MSR_MISC_FEATURE_CONTROL: u32 = 0x1A4;
/// IA32_DEBUGCTL.
pub const IA32_DEBUGCTL: u32 = 0x1D9;
/// IA32_FIXED_CTR0 (instructions retired). FIXED_CTRi = 0x309 + i.
pub const IA32_FIXED_CTR0: u32 = 0x309;
/// IA32_PERF_CAPABILITIES (read-only; exists when CPUID.1:ECX.PDCM = 1).
pub const IA32_PERF_CAPABILITIES: u32 = 0x345;
/// IA32_FIXED_CTR_CTRL.
pub const IA32_FIXED_CTR_CTRL: u32 = 0x38D;
/// IA32_PERF_GLOBAL_STATUS (read-only).
pub const IA32_PERF_GLOBAL_STATUS: u32 = 0x38E;
/// IA32_PERF_GLOBAL_CTRL.
pub const IA32_PERF_GLOBAL_CTRL: u32 = 0x38F;
/// IA32_PERF_GLOBAL_OVF_CTRL (v2, v3): write 1 to clear IA32_PERF_GLOBAL_STATUS bits.
pub const IA32_PERF_GLOBAL_OVF_CTRL: u32 = 0x390;
/// IA32_PERF_GLOBAL_STATUS_RESET: the v4+ name of IA32_PERF_GLOBAL_OVF_CTRL (SDM 18.2.4.2).
pub const IA32_PERF_GLOBAL_STATUS_RESET: u32 = IA32_PERF_GLOBAL_OVF_CTRL;
/// IA32_PERF_GLOBAL_STATUS_SET (v4+): write 1 to set IA32_PERF_GLOBAL_STATUS bits.
pub const IA32_PERF_GLOBAL_STATUS_SET: u32 = 0x391;
/// IA32_PERF_GLOBAL_INUSE (v4+, read-only, SDM 18.2.4.3).
pub const IA32_PERF_GLOBAL_INUSE: u32 = 0x392;
/// IA32_PEBS_ENABLE.
pub const IA32_PEBS_ENABLE: u32 = 0x3F1;
/// MSR_PEBS_DATA_CFG (adaptive PEBS, PERF_CAPABILITIES.PEBS_BASELINE): the record groups.
pub const MSR_PEBS_DATA_CFG: u32 = 0x3F2;
/// MSR_PEBS_DATA_CFG bits (SDM 18.9.2.2): Memory Info (0), GPRs (1), XMMs (2), LBRs (3), and the
/// number of LBR entries minus one (31:24).
pub const PEBS_DATA_CFG_VALID: u64 = 0xFF00_000F;
/// IA32_PERF_CAPABILITIES.PEBS_BASELINE (bit 14): adaptive PEBS, on every counter.
pub const PERF_CAPABILITIES_PEBS_BASELINE: u64 = 1 << 14;
/// IA32_A_PMC0: full-width alias of IA32_PMC0 (exists when IA32_PERF_CAPABILITIES.FW_WRITE = 1, SDM 18.2.5).
pub const IA32_A_PMC0: u32 = 0x4C1;
/// IA32_DS_AREA.
pub const IA32_DS_AREA: u32 = 0x600;

// ---- Model-specific PMU MSRs (SDM Vol. 4, the per-model tables; present per profile) ----
/// MSR_OFFCORE_RSP_0 (Nehalem on); MSR_OFFCORE_RSP_1 is the next index (Westmere on).
pub const MSR_OFFCORE_RSP_0: u32 = 0x1A6;
/// MSR_LBR_SELECT (Nehalem on): which branches the LBR stack records.
pub const MSR_LBR_SELECT: u32 = 0x1C8;
/// MSR_LASTBRANCH_TOS: index of the most recent LBR entry.
pub const MSR_LASTBRANCH_TOS: u32 = 0x1C9;
/// MSR_LER_FROM_LIP and MSR_LER_TO_LIP: the last branch taken before the last exception or
/// interrupt, while DEBUGCTL.LBR is set (SDM 17.4.8; present with the LBR stack).
pub const MSR_LER_FROM_LIP: u32 = 0x1DD;
pub const MSR_LER_TO_LIP: u32 = 0x1DE;
/// MSR_PEBS_LD_LAT (Nehalem on): load-latency threshold.
pub const MSR_PEBS_LD_LAT: u32 = 0x3F6;
/// MSR_PEBS_FRONTEND (Skylake on).
pub const MSR_PEBS_FRONTEND: u32 = 0x3F7;
pub use crate::profile::{
    LBR_CORE_FROM, LBR_CORE_MAX_DEPTH, LBR_CORE_TO, LBR_INFO_0, LBR_MAX_DEPTH, LBR_NHM_FROM, LBR_NHM_TO,
};
/// MSR_LBR_INFO_n bits a write may set: MISPRED (63), IN_TX (62), TX_ABORT (61) and the cycle
/// count (15:0); the i7-6700K #GPs on any other (its measured write-#GP mask is 0x1FFFFFFFFFFF0000).
pub const LBR_INFO_WRITABLE: u64 = 0xE000_0000_0000_FFFF;

/// The architectural maxima of counters, each with a trapped MSR range: 8 general-purpose
/// (0xC1..=0xC8) and 4 fixed (0x309..=0x30C). The profile's rules own them.
pub use crate::profile::{MAX_FIXED, MAX_GP};

// ---- IA32_PERFEVTSELx fields (SDM Figure 18-6) ----
/// PERFEVTSEL\[7:0\] event select.
pub const PERFEVTSEL_EVENT_MASK: u64 = 0xFF;
/// PERFEVTSEL\[15:8\] unit mask.
pub const PERFEVTSEL_UMASK_SHIFT: u32 = 8;
/// PERFEVTSEL.USR (bit 16): count at CPL > 0.
pub const PERFEVTSEL_USR: u64 = 1 << 16;
/// PERFEVTSEL.OS (bit 17): count at CPL 0.
pub const PERFEVTSEL_OS: u64 = 1 << 17;
/// PERFEVTSEL.E (bit 18): edge detect.
pub const PERFEVTSEL_E: u64 = 1 << 18;
/// PERFEVTSEL.PC (bit 19): pin control.
pub const PERFEVTSEL_PC: u64 = 1 << 19;
/// PERFEVTSEL.INT (bit 20): APIC interrupt (PMI) on overflow.
pub const PERFEVTSEL_INT: u64 = 1 << 20;
/// PERFEVTSEL.ANY (bit 21): AnyThread (v3+).
pub const PERFEVTSEL_ANY: u64 = 1 << 21;
/// PERFEVTSEL.EN (bit 22): enable counter.
pub const PERFEVTSEL_EN: u64 = 1 << 22;
/// PERFEVTSEL.INV (bit 23): invert counter mask.
pub const PERFEVTSEL_INV: u64 = 1 << 23;
/// PERFEVTSEL\[31:24\] counter mask (CMASK).
pub const PERFEVTSEL_CMASK_SHIFT: u32 = 24;
/// PERFEVTSEL\[63:32\]: reserved in architectural perfmon.
pub const PERFEVTSEL_RESERVED_HIGH: u64 = 0xFFFF_FFFF_0000_0000;
/// PERFEVTSEL.Adaptive_Record (bit 34; with PERF_CAPABILITIES.PEBS_BASELINE): the counter's PEBS
/// records take the groups MSR_PEBS_DATA_CFG selects; clear, the basic group only (SDM 18.9.2.2).
pub const PERFEVTSEL_ADAPTIVE: u64 = 1 << 34;

// ---- IA32_FIXED_CTR_CTRL fields (SDM Figure 18-2 / 18-7): 4 bits per fixed counter ----
/// Width in bits of one FIXED_CTR_CTRL field.
pub const FIXED_CTR_CTRL_FIELD_BITS: u32 = 4;
/// Field EN\[1:0\]: 0 off, 1 OS (CPL 0), 2 USR (CPL > 0), 3 all rings.
pub const FIXED_CTR_CTRL_EN_MASK: u64 = 0b0011;
/// Field EN bit 0: count at CPL 0.
pub const FIXED_CTR_CTRL_EN_OS: u64 = 0b0001;
/// Field EN bit 1: count at CPL > 0.
pub const FIXED_CTR_CTRL_EN_USR: u64 = 0b0010;
/// Field bit 2: AnyThread (v3+).
pub const FIXED_CTR_CTRL_ANY: u64 = 0b0100;
/// Field bit 3: PMI on overflow.
pub const FIXED_CTR_CTRL_PMI: u64 = 0b1000;
/// FIXED_CTR_CTRL bit 32 + 4i, FCi_Adaptive_Record (with PERF_CAPABILITIES.PEBS_BASELINE): as
/// PERFEVTSEL.Adaptive_Record, for fixed counter i (SDM 18.9.2.2).
pub const FIXED_CTR_CTRL_ADAPTIVE0: u64 = 1 << 32;

// ---- IA32_PERF_GLOBAL_STATUS bits beyond the per-counter overflow bits ----
/// Bit of fixed counter 0 in GLOBAL_CTRL / GLOBAL_STATUS / OVF_CTRL / INUSE.
pub const GLOBAL_FIXED_SHIFT: u32 = 32;
/// GLOBAL_STATUS.Trace_ToPA_PMI (bit 55, v4+).
pub const GLOBAL_STATUS_TRACE_TOPA_PMI: u64 = 1 << 55;
/// GLOBAL_STATUS.LBR_Frz (bit 58, v4+): LBRs frozen on PMI.
pub const GLOBAL_STATUS_LBR_FRZ: u64 = 1 << 58;
/// GLOBAL_STATUS.CTR_Frz (bit 59, v4+): counters frozen on PMI (SDM 18.2.4.1).
pub const GLOBAL_STATUS_CTR_FRZ: u64 = 1 << 59;
/// GLOBAL_STATUS.ASCI (bit 60): SGX contribution; only with SGX, which emon never exposes.
pub const GLOBAL_STATUS_ASCI: u64 = 1 << 60;
/// GLOBAL_STATUS.OvfUncore (bit 61, v3+).
pub const GLOBAL_STATUS_OVF_UNCORE: u64 = 1 << 61;
/// GLOBAL_STATUS.OvfBuffer (bit 62): DS buffer overflow.
pub const GLOBAL_STATUS_OVF_BUFFER: u64 = 1 << 62;
/// GLOBAL_STATUS.CondChgd (bit 63).
pub const GLOBAL_STATUS_COND_CHGD: u64 = 1 << 63;
/// GLOBAL_INUSE.PMI_InUse (bit 63, SDM 18.2.4.3; seed 002's "bit 32" is a typo).
pub const GLOBAL_INUSE_PMI: u64 = 1 << 63;

// ---- IA32_DEBUGCTL bits (SDM 17.4.1) ----
/// DEBUGCTL.LBR (bit 0).
pub const DEBUGCTL_LBR: u64 = 1 << 0;
/// DEBUGCTL.BTF (bit 1).
pub const DEBUGCTL_BTF: u64 = 1 << 1;
/// DEBUGCTL.TR (bit 6): branch trace messages; with BTS (bit 7) they go to the BTS buffer.
pub const DEBUGCTL_TR: u64 = 1 << 6;
/// DEBUGCTL.BTS (bit 7).
pub const DEBUGCTL_BTS: u64 = 1 << 7;
/// DEBUGCTL.BTINT (bit 8): a DS interrupt at the BTS threshold; clear, the buffer is circular.
pub const DEBUGCTL_BTINT: u64 = 1 << 8;
/// DEBUGCTL.BTS_OFF_OS (bit 9) and BTS_OFF_USR (bit 10): no records at CPL 0 / CPL > 0.
pub const DEBUGCTL_BTS_OFF_OS: u64 = 1 << 9;
pub const DEBUGCTL_BTS_OFF_USR: u64 = 1 << 10;
/// The DEBUGCTL bits that exist where BTS is presented.
pub const DEBUGCTL_BTS_BITS: u64 =
    DEBUGCTL_TR | DEBUGCTL_BTS | DEBUGCTL_BTINT | DEBUGCTL_BTS_OFF_OS | DEBUGCTL_BTS_OFF_USR;
/// DEBUGCTL.FREEZE_LBRS_ON_PMI (bit 11).
pub const DEBUGCTL_FREEZE_LBRS_ON_PMI: u64 = 1 << 11;
/// DEBUGCTL.FREEZE_PERFMON_ON_PMI (bit 12).
pub const DEBUGCTL_FREEZE_PERFMON_ON_PMI: u64 = 1 << 12;
/// DEBUGCTL.FREEZE_WHILE_SMM (bit 14; needs IA32_PERF_CAPABILITIES.FREEZE_WHILE_SMM).
pub const DEBUGCTL_FREEZE_WHILE_SMM: u64 = 1 << 14;

// ---- IA32_PERF_CAPABILITIES bits ----
/// PERF_CAPABILITIES.FREEZE_WHILE_SMM (bit 12).
pub const PERF_CAPABILITIES_FREEZE_WHILE_SMM: u64 = 1 << 12;
/// IA32_PERF_CAPABILITIES[15] PERF_METRICS_AVAILABLE: the topdown metrics of fixed counter 3
/// (Ice Lake); IA32_PERF_GLOBAL_CTRL[48] enables them and GLOBAL_STATUS[48] reports their
/// overflow (SDM 18.3.9.3, "Performance Metrics").
pub const PERF_CAPABILITIES_PERF_METRICS: u64 = 1 << 15;
/// IA32_PERF_GLOBAL_CTRL[48] EN_PERF_METRICS and IA32_PERF_GLOBAL_STATUS[48] PERF_METRICS_OVF.
pub const GLOBAL_PERF_METRICS: u64 = 1 << 48;
/// PERF_CAPABILITIES.FW_WRITE (bit 13).
pub const PERF_CAPABILITIES_FW_WRITE: u64 = 1 << 13;

// ---- IA32_MISC_ENABLE bits ----
/// MISC_ENABLE bit 0: fast-strings enable.
pub const MISC_ENABLE_FAST_STRINGS: u64 = 1 << 0;
/// MISC_ENABLE bit 3: automatic thermal control circuit enable.
pub const MISC_ENABLE_TCC: u64 = 1 << 3;
/// MISC_ENABLE bit 7: performance monitoring available (read-only).
pub const MISC_ENABLE_PERFMON_AVAILABLE: u64 = 1 << 7;
/// MISC_ENABLE bit 11: branch trace storage unavailable (read-only).
pub const MISC_ENABLE_BTS_UNAVAILABLE: u64 = 1 << 11;
/// MISC_ENABLE bit 12: processor event based sampling (PEBS) unavailable (read-only).
pub const MISC_ENABLE_PEBS_UNAVAILABLE: u64 = 1 << 12;
/// MISC_ENABLE bit 16: Enhanced Intel SpeedStep enable.
pub const MISC_ENABLE_EIST: u64 = 1 << 16;
/// MISC_ENABLE bit 18: ENABLE MONITOR FSM.
pub const MISC_ENABLE_MONITOR: u64 = 1 << 18;
/// MISC_ENABLE bit 22: limit CPUID maxval.
pub const MISC_ENABLE_LIMIT_CPUID: u64 = 1 << 22;
/// MISC_ENABLE bit 23: xTPR message disable.
pub const MISC_ENABLE_XTPR_DISABLE: u64 = 1 << 23;
/// MISC_ENABLE bit 34: XD bit disable.
pub const MISC_ENABLE_XD_DISABLE: u64 = 1 << 34;

/// Name of a trapped MSR ("IA32_PMC0", "IA32_PERF_GLOBAL_CTRL" ...), `None` outside the PMU's ranges.
/// 0x390 is reported by its v2/v3 name IA32_PERF_GLOBAL_OVF_CTRL (v4+: IA32_PERF_GLOBAL_STATUS_RESET).
pub fn msr_name(msr: u32) -> Option<String> {
    let indexed = |base: u32, count: u8, prefix: &str| -> Option<String> {
        let i = msr.checked_sub(base)?;
        (i < u32::from(count)).then(|| format!("{prefix}{i}"))
    };
    let fixed = match msr {
        IA32_MISC_ENABLE => Some("IA32_MISC_ENABLE"),
        MSR_MISC_FEATURE_CONTROL => Some("MSR_MISC_FEATURE_CONTROL"),
        IA32_DEBUGCTL => Some("IA32_DEBUGCTL"),
        IA32_PERF_CAPABILITIES => Some("IA32_PERF_CAPABILITIES"),
        IA32_FIXED_CTR_CTRL => Some("IA32_FIXED_CTR_CTRL"),
        IA32_PERF_GLOBAL_STATUS => Some("IA32_PERF_GLOBAL_STATUS"),
        IA32_PERF_GLOBAL_CTRL => Some("IA32_PERF_GLOBAL_CTRL"),
        IA32_PERF_GLOBAL_OVF_CTRL => Some("IA32_PERF_GLOBAL_OVF_CTRL"),
        IA32_PERF_GLOBAL_STATUS_SET => Some("IA32_PERF_GLOBAL_STATUS_SET"),
        IA32_PERF_GLOBAL_INUSE => Some("IA32_PERF_GLOBAL_INUSE"),
        IA32_PEBS_ENABLE => Some("IA32_PEBS_ENABLE"),
        MSR_PEBS_DATA_CFG => Some("MSR_PEBS_DATA_CFG"),
        IA32_DS_AREA => Some("IA32_DS_AREA"),
        MSR_LBR_SELECT => Some("MSR_LBR_SELECT"),
        MSR_LASTBRANCH_TOS => Some("MSR_LASTBRANCH_TOS"),
        MSR_LER_FROM_LIP => Some("MSR_LER_FROM_LIP"),
        MSR_LER_TO_LIP => Some("MSR_LER_TO_LIP"),
        MSR_PEBS_LD_LAT => Some("MSR_PEBS_LD_LAT"),
        MSR_PEBS_FRONTEND => Some("MSR_PEBS_FRONTEND"),
        _ => None,
    };
    let lbr = |base: u32, count: u8, suffix: &str| -> Option<String> {
        let i = msr.checked_sub(base)?;
        (i < u32::from(count)).then(|| format!("MSR_LASTBRANCH_{i}_{suffix}"))
    };
    fixed
        .map(str::to_string)
        .or_else(|| indexed(IA32_PMC0, MAX_GP, "IA32_PMC"))
        .or_else(|| indexed(IA32_A_PMC0, MAX_GP, "IA32_A_PMC"))
        .or_else(|| indexed(IA32_PERFEVTSEL0, MAX_GP, "IA32_PERFEVTSEL"))
        .or_else(|| indexed(IA32_FIXED_CTR0, MAX_FIXED, "IA32_FIXED_CTR"))
        .or_else(|| indexed(MSR_OFFCORE_RSP_0, 2, "MSR_OFFCORE_RSP_"))
        .or_else(|| indexed(LBR_INFO_0, LBR_MAX_DEPTH, "MSR_LBR_INFO_"))
        .or_else(|| lbr(LBR_CORE_FROM, LBR_CORE_MAX_DEPTH, "FROM_IP"))
        .or_else(|| lbr(LBR_NHM_FROM, LBR_MAX_DEPTH, "FROM_IP"))
        .or_else(|| lbr(LBR_CORE_TO, LBR_CORE_MAX_DEPTH, "TO_IP"))
        .or_else(|| lbr(LBR_NHM_TO, LBR_MAX_DEPTH, "TO_IP"))
        .or_else(|| super::netburst::msr_name(msr).map(str::to_string))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn msr_names() {
        assert_eq!(msr_name(0xC1).as_deref(), Some("IA32_PMC0"));
        assert_eq!(msr_name(0xC8).as_deref(), Some("IA32_PMC7"));
        assert_eq!(msr_name(0xC9), None);
        assert_eq!(msr_name(0x4C3).as_deref(), Some("IA32_A_PMC2"));
        assert_eq!(msr_name(0x18D).as_deref(), Some("IA32_PERFEVTSEL7"));
        assert_eq!(msr_name(0x30C).as_deref(), Some("IA32_FIXED_CTR3"));
        assert_eq!(msr_name(0x30D).as_deref(), Some("MSR_IQ_COUNTER1"), "NetBurst names past the fixed counters");
        assert_eq!(msr_name(0x390).as_deref(), Some("IA32_PERF_GLOBAL_OVF_CTRL"));
        assert_eq!(msr_name(0x392).as_deref(), Some("IA32_PERF_GLOBAL_INUSE"));
        assert_eq!(msr_name(0x600).as_deref(), Some("IA32_DS_AREA"));
        assert_eq!(msr_name(0x1A7).as_deref(), Some("MSR_OFFCORE_RSP_1"));
        assert_eq!(msr_name(0x43).as_deref(), Some("MSR_LASTBRANCH_3_FROM_IP"));
        assert_eq!(msr_name(0x6DF).as_deref(), Some("MSR_LASTBRANCH_31_TO_IP"));
        assert_eq!(msr_name(0xDC1).as_deref(), Some("MSR_LBR_INFO_1"));
        assert_eq!(msr_name(0x3F7).as_deref(), Some("MSR_PEBS_FRONTEND"));
        assert_eq!(msr_name(0x1A4).as_deref(), Some("MSR_MISC_FEATURE_CONTROL"));
        assert_eq!(msr_name(0x48), None);
        assert_eq!(msr_name(0), None);
        assert_eq!(msr_name(u32::MAX), None);
    }
}
