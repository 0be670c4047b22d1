//! The virtual Intel architectural PMU (perfmon v1..v5): a pure state machine, no KVM, no I/O.
//!
//! [`Pmu`] owns every architectural performance-monitoring MSR of one vCPU and implements their
//! SDM semantics (Vol. 3B chapter "Performance Monitoring", 18.2 in the numbering used here):
//! existence per profile, reserved bits (#GP with no state change), legacy sign-extended and
//! full-width counter writes, global control/status, overflow, PMI and freeze-on-PMI.
//! A backend feeds counted events in with [`Pmu::add_events`], and reprograms the counters a
//! change marked ([`Pmu::take_reprogram`], as KVM's `kvm_pmu_request_counter_reprogram`).
//!
//! Files: `msr` (indices, bit names), `regs` (field decoding, writable masks from the profile),
//! `counter` (width arithmetic), `decode` (MSR index -> register), `access` (RDMSR/WRMSR),
//! `counting` (the counter API backends use), `dump` (human-readable register dump).

mod access;
pub mod counter;
mod counting;
mod decode;
pub mod ds;
mod dump;
pub mod lbr;
pub mod msr;
pub mod netburst;
pub mod rdpmc;
pub mod regs;
#[cfg(test)]
mod tests;

use std::fmt;

use crate::profile::PmuProfile;
pub use msr::msr_name;
use msr::*;
use regs::{FixedCtrField, Layout, PerfEvtSel};

/// A WRMSR/RDMSR that must raise #GP(0) in the guest. The PMU state is unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("#GP")]
pub struct GpFault;

/// A performance counter: general-purpose IA32_PMCi or fixed-function IA32_FIXED_CTRi.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CounterId {
    /// IA32_PMCi.
    Gp(u8),
    /// IA32_FIXED_CTRi.
    Fixed(u8),
    /// NetBurst counter i (MSR 0x300 + i, SDM 18.15.2): the only counters of a NetBurst profile.
    NetBurst(u8),
}

impl CounterId {
    /// The counter whose value MSR `msr` is (IA32_PMCi, IA32_A_PMCi or IA32_FIXED_CTRi).
    pub fn from_msr(msr: u32) -> Option<CounterId> {
        match decode::Reg::decode(msr)? {
            decode::Reg::Pmc(i) | decode::Reg::APmc(i) => Some(CounterId::Gp(i)),
            decode::Reg::FixedCtr(i) => Some(CounterId::Fixed(i)),
            _ => None,
        }
    }

    /// Bit of this counter in IA32_PERF_GLOBAL_CTRL / _STATUS / _OVF_CTRL / _INUSE:
    /// `Gp(i)` -> i, `Fixed(i)` -> 32 + i. A NetBurst profile has neither, and NetBurst(i) -> i
    /// stands in the same masks (the reprogramming marks), though NetBurst has no global MSRs.
    pub fn status_bit(self) -> u32 {
        match self {
            CounterId::Gp(i) | CounterId::NetBurst(i) => u32::from(i),
            CounterId::Fixed(i) => GLOBAL_FIXED_SHIFT + u32::from(i),
        }
    }

    /// `1 << status_bit()`, or 0 if the bit does not fit a 64-bit register.
    pub fn status_mask(self) -> u64 {
        1u64.checked_shl(self.status_bit()).unwrap_or(0)
    }
}

impl fmt::Display for CounterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CounterId::Gp(i) => write!(f, "IA32_PMC{i}"),
            CounterId::Fixed(i) => write!(f, "IA32_FIXED_CTR{i}"),
            CounterId::NetBurst(i) => {
                f.write_str(netburst::COUNTER_DEFS.get(usize::from(*i)).map_or("MSR_NETBURST_COUNTER?", |d| d.name))
            }
        }
    }
}

/// What a backend needs to know about one counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CounterState {
    /// Which counter.
    pub id: CounterId,
    /// GP: PERFEVTSEL\[7:0\]; Fixed(i): event of the architectural event fixed counter i counts
    /// (0xC0, 0x3C, 0x3C, 0xA4).
    pub event_select: u8,
    /// GP: PERFEVTSEL\[15:8\]; Fixed(i): 0x00, 0x00, 0x01, 0x01.
    pub umask: u8,
    /// GP: PERFEVTSEL.USR; fixed: EN field bit 1 (CPL > 0).
    pub usr: bool,
    /// GP: PERFEVTSEL.OS; fixed: EN field bit 0 (CPL 0).
    pub os: bool,
    /// PERFEVTSEL.E (false for fixed counters).
    pub edge: bool,
    /// PERFEVTSEL.INV (false for fixed counters).
    pub inv: bool,
    /// PERFEVTSEL.CMASK (0 for fixed counters).
    pub cmask: u8,
    /// PERFEVTSEL.ANY or the fixed field's AnyThread bit.
    pub any: bool,
    /// PERFEVTSEL.INT or FIXED_CTR_CTRL.PMI.
    pub int: bool,
    /// PERFEVTSEL.EN, or fixed EN field != 0.
    pub enabled: bool,
    /// enabled && GLOBAL_CTRL bit (v1: enabled) && not frozen (v4+ CTR_Frz).
    pub counting: bool,
    /// Current value (fits `width` bits).
    pub value: u64,
    /// Counter width in bits (0 for a counter the profile does not declare).
    pub width: u8,
    /// A NetBurst counter: the ESCR, event and mask its CCCR selects (`event_select` is then the
    /// ESCR's event select and `umask` 0).
    pub netburst: Option<netburst::Selection>,
}

/// Counters a change marked for reprogramming, as bit masks in the IA32_PERF_GLOBAL_CTRL layout
/// (bit i: IA32_PMCi; bit 32 + i: IA32_FIXED_CTRi).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Reprogram {
    /// Counters whose counting changed: a guest write of the value, its PERFEVTSELx or
    /// FIXED_CTR_CTRL field, its GLOBAL_CTRL bit, or a freeze.
    pub counters: u64,
    /// Of those, the counters whose value the guest wrote (WRMSR of IA32_PMCi, IA32_A_PMCi or
    /// IA32_FIXED_CTRi), whatever the value.
    pub written: u64,
}

impl Reprogram {
    pub fn is_empty(self) -> bool {
        self.counters == 0
    }
}

/// The virtual PMU of one vCPU. See the module documentation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pmu {
    profile: PmuProfile,
    layout: Layout,
    pmc: [u64; MAX_GP as usize],
    perfevtsel: [u64; MAX_GP as usize],
    fixed_ctr: [u64; MAX_FIXED as usize],
    fixed_ctr_ctrl: u64,
    global_ctrl: u64,
    global_status: u64,
    debugctl: u64,
    misc_enable: u64,
    pebs_enable: u64,
    ds_area: u64,
    lbr: LbrRegs,
    /// PEBS is presented (the backend writes records): MISC_ENABLE.PEBS_UNAVAILABLE is clear.
    pebs_on: bool,
    /// BTS is presented (the backend writes branch records): MISC_ENABLE.BTS_UNAVAILABLE is
    /// clear and DEBUGCTL takes TR, BTS, BTINT and BTS_OFF_OS/USR.
    bts_on: bool,
    /// PEBS-enabled counters that overflowed, and those of them whose assist is due.
    pebs: PebsArmed,
    pebs_data_cfg: u64,
    offcore_rsp: [u64; 2],
    pebs_ld_lat: u64,
    pebs_frontend: u64,
    pmi_pending: bool,
    reprogram: Reprogram,
    /// The NetBurst registers, under a NetBurst profile.
    nb: Option<netburst::Regs>,
}

/// PEBS-enabled counters (GLOBAL_STATUS layout) that overflowed (armed), and those of them that
/// have counted an event since (the assist is due).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct PebsArmed {
    armed: u64,
    due: u64,
}

impl PebsArmed {
    /// `counters` are no longer armed: the guest wrote them, or cleared their PEBS_ENABLE bits,
    /// or the assist ran.
    fn disarm(&mut self, counters: u64) {
        self.armed &= !counters;
        self.due &= !counters;
    }
}

/// The LBR stack's MSRs (0 at power-on): what the guest wrote, and the branches a backend
/// recorded through [`Pmu::record_branch`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct LbrRegs {
    from: [u64; LBR_MAX_DEPTH as usize],
    to: [u64; LBR_MAX_DEPTH as usize],
    info: [u64; LBR_MAX_DEPTH as usize],
    tos: u64,
    select: u64,
    /// MSR_LER_FROM_LIP and MSR_LER_TO_LIP.
    ler: (u64, u64),
    /// The last taken branch while the stack recorded, filtered or not: what an exception or
    /// interrupt copies into the LER MSRs.
    last: (u64, u64),
}

impl Pmu {
    /// MSR ranges (inclusive) the VMM must trap, in increasing order: the full architectural
    /// ranges and every place a profile can put a model-specific PMU MSR, independent of profile
    /// (an MSR the profile lacks must still #GP rather than reach KVM).
    pub const TRAPPED_MSRS: &'static [(u32, u32)] = &[
        (LBR_CORE_FROM, LBR_CORE_FROM + LBR_CORE_MAX_DEPTH as u32 - 1),
        (LBR_CORE_TO, LBR_CORE_TO + LBR_CORE_MAX_DEPTH as u32 - 1),
        (IA32_PMC0, IA32_PMC0 + MAX_GP as u32 - 1),
        (IA32_PERFEVTSEL0, IA32_PERFEVTSEL0 + MAX_GP as u32 - 1),
        (IA32_MISC_ENABLE, IA32_MISC_ENABLE),
        (MSR_OFFCORE_RSP_0, MSR_OFFCORE_RSP_0 + 1),
        (MSR_LBR_SELECT, MSR_LASTBRANCH_TOS),
        (IA32_DEBUGCTL, IA32_DEBUGCTL),
        (MSR_LER_FROM_LIP, MSR_LER_TO_LIP),
        // The NetBurst counters (0x300-0x311) hold the fixed counters' indices.
        (netburst::MSR_BPU_COUNTER0, netburst::MSR_BPU_COUNTER0 + netburst::COUNTERS as u32 - 1),
        (IA32_PERF_CAPABILITIES, IA32_PERF_CAPABILITIES),
        (netburst::MSR_BPU_CCCR0, netburst::MSR_BPU_CCCR0 + netburst::COUNTERS as u32 - 1),
        (IA32_FIXED_CTR_CTRL, IA32_PERF_GLOBAL_INUSE),
        (netburst::ESCR_FIRST, netburst::ESCR_LAST),
        (netburst::MSR_TC_PRECISE_EVENT, MSR_PEBS_DATA_CFG),
        (MSR_PEBS_LD_LAT, MSR_PEBS_FRONTEND),
        (IA32_A_PMC0, IA32_A_PMC0 + MAX_GP as u32 - 1),
        (IA32_DS_AREA, IA32_DS_AREA),
        (LBR_NHM_FROM, LBR_NHM_FROM + LBR_MAX_DEPTH as u32 - 1),
        (LBR_NHM_TO, LBR_NHM_TO + LBR_MAX_DEPTH as u32 - 1),
        (LBR_INFO_0, LBR_INFO_0 + LBR_MAX_DEPTH as u32 - 1),
    ];

    /// Power-on state (SDM 18.2.2): counters, PERFEVTSELx, FIXED_CTR_CTRL, GLOBAL_STATUS and
    /// DEBUGCTL 0; GLOBAL_CTRL = (1 << N) - 1 (GP enables set for v1 software compatibility);
    /// MISC_ENABLE = fast strings | perfmon available (profile) | BTS unavailable | PEBS unavailable.
    pub fn new(profile: &PmuProfile) -> Pmu {
        let layout = Layout::new(profile);
        let mut misc_enable = MISC_ENABLE_FAST_STRINGS | MISC_ENABLE_BTS_UNAVAILABLE | MISC_ENABLE_PEBS_UNAVAILABLE;
        if profile.misc_enable_perfmon {
            misc_enable |= MISC_ENABLE_PERFMON_AVAILABLE;
        }
        Pmu {
            profile: profile.clone(),
            global_ctrl: layout.gp_bits,
            layout,
            pmc: [0; MAX_GP as usize],
            perfevtsel: [0; MAX_GP as usize],
            fixed_ctr: [0; MAX_FIXED as usize],
            fixed_ctr_ctrl: 0,
            global_status: 0,
            debugctl: 0,
            misc_enable,
            pebs_enable: 0,
            ds_area: 0,
            lbr: LbrRegs::default(),
            pebs_on: false,
            bts_on: false,
            pebs: PebsArmed::default(),
            pebs_data_cfg: 0,
            offcore_rsp: [0; 2],
            pebs_ld_lat: 0,
            pebs_frontend: 0,
            pmi_pending: false,
            reprogram: Reprogram::default(),
            nb: profile.netburst().then(netburst::Regs::default),
        }
    }

    /// The profile this PMU was built from.
    pub fn profile(&self) -> &PmuProfile {
        &self.profile
    }

    /// Is `msr` in [`Pmu::TRAPPED_MSRS`]?
    pub fn owns(msr: u32) -> bool {
        Self::TRAPPED_MSRS.iter().any(|&(lo, hi)| (lo..=hi).contains(&msr))
    }

    /// The name of `msr` under this PMU's profile (0x309 is IA32_FIXED_CTR0 or, on NetBurst,
    /// MSR_FLAME_COUNTER1).
    pub fn reg_name(&self, msr: u32) -> Option<String> {
        match self.nb {
            Some(_) if netburst::Reg::in_ranges(msr) => netburst::msr_name(msr).map(str::to_string),
            _ => msr_name(msr),
        }
    }

    /// The NetBurst registers, under a NetBurst profile.
    pub fn netburst(&self) -> Option<&netburst::Regs> {
        self.nb.as_ref()
    }

    /// IA32_PERF_GLOBAL_CTRL as stored (v1 has no such MSR; counting then ignores it).
    pub fn global_ctrl(&self) -> u64 {
        self.global_ctrl
    }

    /// IA32_PERF_GLOBAL_STATUS.
    pub fn global_status(&self) -> u64 {
        self.global_status
    }

    /// IA32_FIXED_CTR_CTRL.
    pub fn fixed_ctr_ctrl(&self) -> u64 {
        self.fixed_ctr_ctrl
    }

    /// IA32_PERFEVTSELi, `None` if general-purpose counter i does not exist.
    pub fn perfevtsel(&self, i: u8) -> Option<u64> {
        self.layout.gp_exists(i).then(|| self.perfevtsel[usize::from(i)])
    }

    /// IA32_DEBUGCTL.
    pub fn debugctl(&self) -> u64 {
        self.debugctl
    }

    /// IA32_MISC_ENABLE.
    pub fn misc_enable(&self) -> u64 {
        self.misc_enable
    }

    /// IA32_PEBS_ENABLE.
    pub fn pebs_enable(&self) -> u64 {
        self.pebs_enable
    }

    /// IA32_DS_AREA.
    pub fn ds_area(&self) -> u64 {
        self.ds_area
    }

    /// Counters are frozen by IA32_PERF_GLOBAL_STATUS.CTR_Frz (v4+ only, SDM 18.2.4.1).
    pub fn frozen(&self) -> bool {
        self.layout.version >= 4 && self.global_status & GLOBAL_STATUS_CTR_FRZ != 0
    }

    /// IA32_PERF_GLOBAL_INUSE as computed from the registers (SDM 18.2.4.3): bit i =
    /// PERFEVTSELi\[7:0\] != 0; bit 32+i = FIXED_CTR_CTRL field i EN != 0; bit 63 (PMI_InUse) =
    /// any PERFEVTSELi.INT, fixed PMI bit, or IA32_PEBS_ENABLE bit of a PMC.
    /// Computed for every version; the MSR itself exists only on v4+.
    pub fn global_inuse(&self) -> u64 {
        let mut inuse = 0u64;
        let mut pmi = self.pebs_enable & self.layout.gp_bits != 0;
        for i in 0..self.layout.gp {
            let sel = PerfEvtSel(self.perfevtsel[usize::from(i)]);
            if sel.event_select() != 0 {
                inuse |= CounterId::Gp(i).status_mask();
            }
            pmi |= sel.int();
        }
        for i in (0..MAX_FIXED).filter(|&i| self.layout.fixed_exists(i)) {
            let field = FixedCtrField::of(self.fixed_ctr_ctrl, i);
            if field.en() != 0 {
                inuse |= CounterId::Fixed(i).status_mask();
            }
            pmi |= field.pmi();
        }
        if pmi {
            inuse |= GLOBAL_INUSE_PMI;
        }
        inuse
    }

    /// Marks the counters in `mask` (GLOBAL_CTRL layout) for reprogramming; bits of counters the
    /// profile does not declare are ignored.
    fn mark(&mut self, mask: u64) {
        let declared = if self.nb.is_some() {
            (1 << netburst::COUNTERS) - 1
        } else {
            self.layout.gp_bits | self.layout.fixed_bits
        };
        self.reprogram.counters |= mask & declared;
    }

    /// Marks counter `id` as written by the guest (and so for reprogramming).
    fn mark_written(&mut self, id: CounterId) {
        self.mark(id.status_mask());
        self.reprogram.written |= id.status_mask();
    }
}
