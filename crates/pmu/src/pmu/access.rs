//! RDMSR / WRMSR of the PMU registers. Every write is validated completely before anything is
//! stored, so a #GP never changes state.

use super::arch::ArchPmu;
use super::counter::{is_canonical_48, legacy_write_value, width_mask};
use super::decode::Reg;
use super::msr::*;
use super::ops::Shared;
use super::regs::FixedCtrField;
use super::{CounterId, GpFault};
use crate::profile::MsrBits;

/// #GP if `value` sets any bit outside `valid`.
fn check(value: u64, valid: u64) -> Result<u64, GpFault> {
    if value & !valid == 0 {
        Ok(value)
    } else {
        Err(GpFault)
    }
}

/// The value a model-specific MSR stores for a WRMSR of `value`, or #GP.
fn model_write(bits: Option<MsrBits>, value: u64) -> Result<u64, GpFault> {
    bits.and_then(|b| b.write(value)).ok_or(GpFault)
}

/// Can LASTBRANCH_n_FROM_IP hold `value` in LBR format `format`? SDM 17.4.8.1: format 3 keeps
/// MISPRED in bit 63 and format 4 MISPRED, IN_TSX and TSX_ABORT in bits 63:61; the address
/// below the flags is sign-extended from bit 47, as in every other format.
fn lbr_from_ok(format: u8, value: u64) -> bool {
    let flags = match format {
        3 => 1,
        4 => 3,
        _ => 0,
    };
    let address = u64::MAX >> flags;
    let sign_extended = (((value << 16) as i64) >> 16) as u64;
    value & address == sign_extended & address
}

impl ArchPmu {
    /// The register `msr` names, if it is trapped and exists under the profile.
    fn reg(&self, msr: u32) -> Result<Reg, GpFault> {
        Reg::decode(msr).filter(|r| r.exists(&self.layout)).ok_or(GpFault)
    }

    /// RDMSR of a PMU register: [`GpFault`] if `msr` is not one that exists under the profile.
    pub(super) fn read(&self, msr: u32) -> Result<u64, GpFault> {
        Ok(match self.reg(msr)? {
            Reg::Pmc(i) | Reg::APmc(i) => self.pmc[usize::from(i)],
            Reg::PerfEvtSel(i) => self.perfevtsel[usize::from(i)],
            Reg::FixedCtr(i) => self.fixed_ctr[usize::from(i)],
            Reg::PerfCapabilities => self.layout.perf_capabilities,
            Reg::FixedCtrCtrl => self.fixed_ctr_ctrl,
            Reg::GlobalStatus => self.global_status,
            Reg::GlobalCtrl => self.global_ctrl,
            // Write-only command registers read as 0.
            Reg::GlobalOvfCtrl | Reg::GlobalStatusSet => 0,
            Reg::GlobalInuse => self.inuse(),
            Reg::DebugCtl => self.debugctl,
            Reg::PebsEnable => self.pebs_enable,
            Reg::DsArea => self.ds_area,
            Reg::PebsDataCfg => self.pebs_data_cfg,
            Reg::OffcoreRsp(i) => self.offcore_rsp[usize::from(i)],
            Reg::PebsLdLat => self.pebs_ld_lat,
            Reg::PebsFrontend => self.pebs_frontend,
            Reg::LbrSelect => self.lbr.select,
            Reg::LbrTos => self.lbr.tos,
            Reg::LbrFrom { i, .. } => self.lbr.from[usize::from(i)],
            Reg::LbrTo { i, .. } => self.lbr.to[usize::from(i)],
            Reg::LbrInfo(i) => self.lbr.info[usize::from(i)],
            Reg::LerFrom => self.lbr.ler.0,
            Reg::LerTo => self.lbr.ler.1,
        })
    }

    /// WRMSR of a PMU register: [`GpFault`], with no state change, if `msr` does not exist under
    /// the profile, is read-only (PERF_CAPABILITIES, GLOBAL_STATUS, GLOBAL_INUSE), or `value`
    /// sets a reserved bit. The counters it changes are marked in `s`.
    pub(super) fn write(&mut self, s: &mut Shared, msr: u32, value: u64) -> Result<(), GpFault> {
        let declared = self.declared();
        let l = &self.layout;
        match self.reg(msr)? {
            // SDM 18.2.5: a legacy write stores EAX[31:0] sign-extended; EDX is ignored.
            Reg::Pmc(i) => {
                self.pebs.disarm(CounterId::Gp(i).status_mask());
                self.pmc[usize::from(i)] = legacy_write_value(value, l.gp_width);
                s.mark_written(CounterId::Gp(i), declared);
            }
            // SDM 18.2.5: full-width write; bits above the counter width are reserved.
            Reg::APmc(i) => {
                let v = check(value, width_mask(l.gp_width))?;
                self.pebs.disarm(CounterId::Gp(i).status_mask());
                self.pmc[usize::from(i)] = v;
                s.mark_written(CounterId::Gp(i), declared);
            }
            Reg::PerfEvtSel(i) => {
                let v = check(value, l.perfevtsel_valid)?;
                let old = std::mem::replace(&mut self.perfevtsel[usize::from(i)], v);
                if old != v {
                    s.mark(CounterId::Gp(i).status_mask(), declared);
                }
            }
            // Like KVM (pmu_intel.c), bits above the fixed width are dropped, not #GP.
            Reg::FixedCtr(i) => {
                self.pebs.disarm(CounterId::Fixed(i).status_mask());
                self.fixed_ctr[usize::from(i)] = value & width_mask(l.fixed_width);
                s.mark_written(CounterId::Fixed(i), declared);
            }
            Reg::PerfCapabilities | Reg::GlobalStatus | Reg::GlobalInuse => return Err(GpFault),
            Reg::FixedCtrCtrl => {
                let v = check(value, l.fixed_ctr_ctrl_valid)?;
                let old = std::mem::replace(&mut self.fixed_ctr_ctrl, v);
                // Each fixed counter's 4-bit field (SDM 18.2.2) that changed.
                let changed = (0..MAX_FIXED)
                    .filter(|&i| FixedCtrField::of(old, i) != FixedCtrField::of(v, i))
                    .fold(0, |m, i| m | CounterId::Fixed(i).status_mask());
                s.mark(changed, declared);
            }
            Reg::GlobalCtrl => {
                let v = check(value, l.global_ctrl_valid)?;
                let old = std::mem::replace(&mut self.global_ctrl, v);
                s.mark(old ^ v, declared);
            }
            // Write 1 to clear (SDM 18.2.2; v4: IA32_PERF_GLOBAL_STATUS_RESET, 18.2.4.2).
            Reg::GlobalOvfCtrl => {
                let v = check(value, l.ovf_ctrl_valid)?;
                self.set_status(s, self.global_status & !v);
            }
            // Write 1 to set (SDM 18.2.4.2); setting an overflow bit raises no PMI.
            Reg::GlobalStatusSet => {
                let v = check(value, l.status_set_valid)?;
                self.set_status(s, self.global_status | v);
            }
            Reg::DebugCtl => {
                let bts = if self.bts_on { DEBUGCTL_BTS_BITS } else { 0 };
                self.debugctl = check(value, l.debugctl_valid | bts)?;
            }
            Reg::PebsEnable => {
                self.pebs_enable = check(value, l.pebs_enable_valid)?;
                self.pebs.disarm(!self.pebs_enable);
            }
            Reg::DsArea => {
                if !is_canonical_48(value) {
                    return Err(GpFault);
                }
                self.ds_area = value;
            }
            Reg::PebsDataCfg => self.pebs_data_cfg = check(value, PEBS_DATA_CFG_VALID)?,
            // The model-specific MSRs store, ignore and #GP bits as the profile measured them.
            Reg::OffcoreRsp(i) => {
                self.offcore_rsp[usize::from(i)] = model_write(l.msrs.offcore_rsp[usize::from(i)], value)?
            }
            Reg::PebsLdLat => self.pebs_ld_lat = model_write(l.msrs.pebs_ld_lat, value)?,
            Reg::PebsFrontend => self.pebs_frontend = model_write(l.msrs.pebs_frontend, value)?,
            Reg::LbrSelect => self.lbr.select = check(value, l.lbr.map_or(0, |s| s.select))?,
            // SDM 17.4.8: the TOS counts modulo the depth; the bits above it #GP (as measured on
            // Sandy Bridge and Skylake).
            Reg::LbrTos => self.lbr.tos = check(value, l.lbr.map_or(0, |s| u64::from(s.depth) - 1))?,
            Reg::LbrFrom { i, .. } => {
                if !lbr_from_ok(l.lbr_format, value) {
                    return Err(GpFault);
                }
                self.lbr.from[usize::from(i)] = value;
            }
            Reg::LbrTo { i, .. } => {
                if !is_canonical_48(value) {
                    return Err(GpFault);
                }
                self.lbr.to[usize::from(i)] = value;
            }
            Reg::LbrInfo(i) => self.lbr.info[usize::from(i)] = check(value, LBR_INFO_WRITABLE)?,
            // Read/write with no reserved bits, as the i7-6700K, i7-2635QM and Xeon X5482 measured.
            Reg::LerFrom => self.lbr.ler.0 = value,
            Reg::LerTo => self.lbr.ler.1 = value,
        }
        Ok(())
    }

    /// Store a new IA32_PERF_GLOBAL_STATUS; a CTR_Frz change freezes/unfreezes every counter.
    pub(super) fn set_status(&mut self, s: &mut Shared, status: u64) {
        let old = std::mem::replace(&mut self.global_status, status);
        if (old ^ status) & GLOBAL_STATUS_CTR_FRZ != 0 {
            s.mark(u64::MAX, self.declared());
        }
    }
}
