//! Which PMU register an MSR index names, and whether it exists under a profile
//! (when each exists follows SDM Vol. 3B 18.2 and the README's "PMU semantics").

use super::msr::*;
use super::regs::Layout;

/// A register of the virtual PMU, decoded from an MSR index (profile-independent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reg {
    /// IA32_PMCi (legacy write path).
    Pmc(u8),
    /// IA32_A_PMCi (full-width write path).
    APmc(u8),
    /// IA32_PERFEVTSELi.
    PerfEvtSel(u8),
    /// IA32_FIXED_CTRi.
    FixedCtr(u8),
    /// IA32_PERF_CAPABILITIES.
    PerfCapabilities,
    /// IA32_FIXED_CTR_CTRL.
    FixedCtrCtrl,
    /// IA32_PERF_GLOBAL_STATUS.
    GlobalStatus,
    /// IA32_PERF_GLOBAL_CTRL.
    GlobalCtrl,
    /// IA32_PERF_GLOBAL_OVF_CTRL / IA32_PERF_GLOBAL_STATUS_RESET.
    GlobalOvfCtrl,
    /// IA32_PERF_GLOBAL_STATUS_SET.
    GlobalStatusSet,
    /// IA32_PERF_GLOBAL_INUSE.
    GlobalInuse,
    /// IA32_DEBUGCTL.
    DebugCtl,
    /// IA32_PEBS_ENABLE.
    PebsEnable,
    /// IA32_DS_AREA.
    DsArea,
    /// MSR_PEBS_DATA_CFG.
    PebsDataCfg,
    /// MSR_OFFCORE_RSP_i.
    OffcoreRsp(u8),
    /// MSR_PEBS_LD_LAT.
    PebsLdLat,
    /// MSR_PEBS_FRONTEND.
    PebsFrontend,
    /// MSR_LBR_SELECT.
    LbrSelect,
    /// MSR_LASTBRANCH_TOS.
    LbrTos,
    /// MSR_LASTBRANCH_i_FROM_IP in the bank at `base` (0x40 or 0x680).
    LbrFrom { base: u32, i: u8 },
    /// MSR_LASTBRANCH_i_TO_IP in the bank at `base` (0x60 or 0x6C0).
    LbrTo { base: u32, i: u8 },
    /// MSR_LBR_INFO_i.
    LbrInfo(u8),
    /// MSR_LER_FROM_LIP.
    LerFrom,
    /// MSR_LER_TO_LIP.
    LerTo,
}

/// Index `msr - base` if it is below `count`.
fn index_in(msr: u32, base: u32, count: u8) -> Option<u8> {
    let i = msr.checked_sub(base)?;
    u8::try_from(i).ok().filter(|&i| i < count)
}

impl Reg {
    /// Decode an MSR index; `None` if it is outside the PMU's trapped ranges.
    pub fn decode(msr: u32) -> Option<Reg> {
        let reg = match msr {
            IA32_PERF_CAPABILITIES => Reg::PerfCapabilities,
            IA32_FIXED_CTR_CTRL => Reg::FixedCtrCtrl,
            IA32_PERF_GLOBAL_STATUS => Reg::GlobalStatus,
            IA32_PERF_GLOBAL_CTRL => Reg::GlobalCtrl,
            IA32_PERF_GLOBAL_OVF_CTRL => Reg::GlobalOvfCtrl,
            IA32_PERF_GLOBAL_STATUS_SET => Reg::GlobalStatusSet,
            IA32_PERF_GLOBAL_INUSE => Reg::GlobalInuse,
            IA32_DEBUGCTL => Reg::DebugCtl,
            IA32_PEBS_ENABLE => Reg::PebsEnable,
            IA32_DS_AREA => Reg::DsArea,
            MSR_PEBS_DATA_CFG => Reg::PebsDataCfg,
            MSR_PEBS_LD_LAT => Reg::PebsLdLat,
            MSR_PEBS_FRONTEND => Reg::PebsFrontend,
            MSR_LBR_SELECT => Reg::LbrSelect,
            MSR_LASTBRANCH_TOS => Reg::LbrTos,
            MSR_LER_FROM_LIP => Reg::LerFrom,
            MSR_LER_TO_LIP => Reg::LerTo,
            _ => {
                let from = |base, count| index_in(msr, base, count).map(|i| Reg::LbrFrom { base, i });
                let to = |base, count| index_in(msr, base, count).map(|i| Reg::LbrTo { base, i });
                return index_in(msr, IA32_PMC0, MAX_GP)
                    .map(Reg::Pmc)
                    .or_else(|| index_in(msr, IA32_A_PMC0, MAX_GP).map(Reg::APmc))
                    .or_else(|| index_in(msr, IA32_PERFEVTSEL0, MAX_GP).map(Reg::PerfEvtSel))
                    .or_else(|| index_in(msr, IA32_FIXED_CTR0, MAX_FIXED).map(Reg::FixedCtr))
                    .or_else(|| index_in(msr, MSR_OFFCORE_RSP_0, 2).map(Reg::OffcoreRsp))
                    .or_else(|| index_in(msr, LBR_INFO_0, LBR_MAX_DEPTH).map(Reg::LbrInfo))
                    .or_else(|| from(LBR_CORE_FROM, LBR_CORE_MAX_DEPTH))
                    .or_else(|| from(LBR_NHM_FROM, LBR_MAX_DEPTH))
                    .or_else(|| to(LBR_CORE_TO, LBR_CORE_MAX_DEPTH))
                    .or_else(|| to(LBR_NHM_TO, LBR_MAX_DEPTH));
            }
        };
        Some(reg)
    }

    /// Does this register exist under `l`? (An access to one that does not => #GP.)
    pub fn exists(self, l: &Layout) -> bool {
        let v = l.version;
        match self {
            Reg::Pmc(i) | Reg::PerfEvtSel(i) => v >= 1 && l.gp_exists(i),
            Reg::APmc(i) => v >= 1 && l.gp_exists(i) && l.fw_write,
            Reg::FixedCtr(i) => v >= 2 && l.fixed_exists(i),
            // CPUID.1:ECX.PDCM = (perf_capabilities != 0) enumerates the MSR (SDM 18.2.5 / 20.x).
            Reg::PerfCapabilities => l.perf_capabilities != 0,
            Reg::FixedCtrCtrl | Reg::GlobalStatus | Reg::GlobalCtrl | Reg::GlobalOvfCtrl => v >= 2,
            Reg::GlobalStatusSet | Reg::GlobalInuse => v >= 4,
            Reg::DebugCtl => true,
            Reg::PebsEnable => v >= 1,
            Reg::DsArea => v >= 1,
            Reg::PebsDataCfg => v >= 1 && l.pebs_baseline,
            Reg::OffcoreRsp(i) => l.msrs.offcore_rsp[usize::from(i)].is_some(),
            Reg::PebsLdLat => l.msrs.pebs_ld_lat.is_some(),
            Reg::PebsFrontend => l.msrs.pebs_frontend.is_some(),
            Reg::LbrSelect => l.lbr.is_some_and(|s| s.select != 0),
            Reg::LbrTos | Reg::LerFrom | Reg::LerTo => l.lbr.is_some(),
            Reg::LbrFrom { base, i } => l.lbr.is_some_and(|s| s.from == base && i < s.depth),
            Reg::LbrTo { base, i } => l.lbr.is_some_and(|s| s.to == base && i < s.depth),
            Reg::LbrInfo(i) => l.lbr.is_some_and(|s| s.info.is_some() && i < s.depth),
        }
    }
}
