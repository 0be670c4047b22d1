//! The Intel architectural PMU (perfmon v1..v5, SDM Vol. 3B 18.2), with the model-specific
//! registers around it (the LBR stack, the Debug Store's PEBS and BTS controls, OFFCORE_RSP,
//! PEBS_LD_LAT, PEBS_FRONTEND): its register file, and [`PmuOps`] over the files that implement
//! each concern (`access`, `counting`, `rdpmc`, `lbr`, `dump`).

use super::lbr::Branch;
use super::msr::*;
use super::ops::{PmuOps, Shared, Unmodelled};
use super::regs::Layout;
use super::{CounterId, CounterState, GpFault};
use crate::events::EventList;
use crate::profile::PmuProfile;

/// The architectural PMU's registers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchPmu {
    pub(super) layout: Layout,
    pub(super) pmc: [u64; MAX_GP as usize],
    pub(super) perfevtsel: [u64; MAX_GP as usize],
    pub(super) fixed_ctr: [u64; MAX_FIXED as usize],
    pub(super) fixed_ctr_ctrl: u64,
    pub(super) global_ctrl: u64,
    pub(super) global_status: u64,
    pub(super) debugctl: u64,
    pub(super) pebs_enable: u64,
    pub(super) ds_area: u64,
    pub(super) lbr: LbrRegs,
    /// PEBS is presented (the backend writes records): MISC_ENABLE.PEBS_UNAVAILABLE is clear.
    pub(super) pebs_on: bool,
    /// BTS is presented (the backend writes branch records): MISC_ENABLE.BTS_UNAVAILABLE is
    /// clear and DEBUGCTL takes TR, BTS, BTINT and BTS_OFF_OS/USR.
    pub(super) bts_on: bool,
    /// PEBS-enabled counters that overflowed, and those of them whose assist is due.
    pub(super) pebs: PebsArmed,
    pub(super) pebs_data_cfg: u64,
    pub(super) offcore_rsp: [u64; 2],
    pub(super) pebs_ld_lat: u64,
    pub(super) pebs_frontend: u64,
    /// The CPU's model-specific event list (README, "Model-specific events").
    pub(super) events: Option<&'static EventList>,
}

/// PEBS-enabled counters (GLOBAL_STATUS layout) that overflowed (armed), and those of them that
/// have counted an event since (the assist is due).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct PebsArmed {
    pub(super) armed: u64,
    pub(super) due: u64,
}

impl PebsArmed {
    /// `counters` are no longer armed: the guest wrote them, or cleared their PEBS_ENABLE bits,
    /// or the assist ran.
    pub(super) fn disarm(&mut self, counters: u64) {
        self.armed &= !counters;
        self.due &= !counters;
    }
}

/// The LBR stack's MSRs (0 at power-on): what the guest wrote, and the branches a backend
/// recorded through [`PmuOps::record_branch`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(super) struct LbrRegs {
    pub(super) from: [u64; LBR_MAX_DEPTH as usize],
    pub(super) to: [u64; LBR_MAX_DEPTH as usize],
    pub(super) info: [u64; LBR_MAX_DEPTH as usize],
    pub(super) tos: u64,
    pub(super) select: u64,
    /// MSR_LER_FROM_LIP and MSR_LER_TO_LIP.
    pub(super) ler: (u64, u64),
    /// The last taken branch while the stack recorded, filtered or not: what an exception or
    /// interrupt copies into the LER MSRs.
    pub(super) last: (u64, u64),
}

impl ArchPmu {
    /// Power-on state (SDM 18.2.2): counters, PERFEVTSELx, FIXED_CTR_CTRL, GLOBAL_STATUS and
    /// DEBUGCTL 0; GLOBAL_CTRL = (1 << N) - 1 (GP enables set for v1 software compatibility).
    pub fn new(profile: &PmuProfile) -> ArchPmu {
        let layout = Layout::new(profile);
        ArchPmu {
            global_ctrl: layout.gp_bits,
            layout,
            pmc: [0; MAX_GP as usize],
            perfevtsel: [0; MAX_GP as usize],
            fixed_ctr: [0; MAX_FIXED as usize],
            fixed_ctr_ctrl: 0,
            global_status: 0,
            debugctl: 0,
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
            events: profile.events,
        }
    }

    /// The counters the profile declares, in the GLOBAL_CTRL layout.
    pub(super) fn declared(&self) -> u64 {
        self.layout.gp_bits | self.layout.fixed_bits
    }
}

impl PmuOps for ArchPmu {
    fn claims(&self, msr: u32) -> bool {
        msr != IA32_MISC_ENABLE
    }
    fn rdmsr(&self, msr: u32) -> Result<u64, GpFault> {
        self.read(msr)
    }
    fn wrmsr(&mut self, s: &mut Shared, msr: u32, value: u64) -> Result<(), GpFault> {
        self.write(s, msr, value)
    }
    fn reg_name(&self, msr: u32) -> Option<String> {
        msr_name(msr)
    }
    fn counter_ids(&self) -> Vec<CounterId> {
        self.ids()
    }
    fn exists(&self, id: CounterId) -> bool {
        match id {
            CounterId::Gp(i) => self.layout.gp_exists(i),
            CounterId::Fixed(i) => self.layout.fixed_exists(i),
            CounterId::NetBurst(_) => false,
        }
    }
    fn counter(&self, id: CounterId) -> CounterState {
        self.state(id)
    }
    fn distance_to_overflow(&self, id: CounterId) -> u64 {
        let s = self.state(id);
        super::counter::distance_to_overflow(s.value, s.width)
    }
    fn add_events(&mut self, s: &mut Shared, id: CounterId, n: u64) -> bool {
        self.add(s, id, n)
    }
    fn set_value(&mut self, id: CounterId, value: u64) {
        self.store_value(id, value);
    }
    fn pmi_delivered(&mut self, s: &mut Shared) {
        self.freeze_on_pmi(s);
    }
    fn rdpmc(&self, ecx: u32) -> Result<u64, GpFault> {
        self.read_pmc(ecx)
    }
    fn event_name(&self, id: CounterId) -> String {
        let s = self.state(id);
        let named = self.events.and_then(|l| l.name_of(s.event_select, s.umask));
        match (id, named) {
            (CounterId::Fixed(_), _) => id.to_string(),
            (_, Some(name)) => format!("{id} {name} ({:#04x}/{:#04x})", s.event_select, s.umask),
            (_, None) => format!("{id} event {:#04x} umask {:#04x}", s.event_select, s.umask),
        }
    }
    fn dump(&self, s: &Shared, out: &mut String) {
        self.dump_registers(s, out);
    }
    fn unmodelled(&self) -> Unmodelled {
        let mut u = Unmodelled::NONE;
        if self.debugctl & DEBUGCTL_LBR != 0 {
            u = u.union(Unmodelled::DEBUGCTL_LBR);
        }
        if self.debugctl & DEBUGCTL_BTF != 0 {
            u = u.union(Unmodelled::DEBUGCTL_BTF);
        }
        u
    }

    fn debugctl(&self) -> u64 {
        self.debugctl
    }
    fn ds_area(&self) -> u64 {
        self.ds_area
    }
    fn global_ctrl(&self) -> u64 {
        self.global_ctrl
    }
    fn global_status(&self) -> u64 {
        self.global_status
    }
    fn fixed_ctr_ctrl(&self) -> u64 {
        self.fixed_ctr_ctrl
    }
    fn perfevtsel(&self, i: u8) -> Option<u64> {
        self.layout.gp_exists(i).then(|| self.perfevtsel[usize::from(i)])
    }
    fn global_inuse(&self) -> u64 {
        self.inuse()
    }
    fn frozen(&self) -> bool {
        self.layout.version >= 4 && self.global_status & GLOBAL_STATUS_CTR_FRZ != 0
    }
    fn set_pebs(&mut self, on: bool) -> bool {
        self.pebs_on = on;
        on
    }
    fn set_bts(&mut self, on: bool) -> bool {
        self.bts_on = on;
        on
    }
    fn pebs_on(&self) -> bool {
        self.pebs_on
    }
    fn bts_on(&self) -> bool {
        self.bts_on
    }
    fn pebs_enable(&self) -> u64 {
        self.pebs_enable
    }
    fn pebs_data_cfg(&self) -> u64 {
        self.pebs_data_cfg
    }
    fn pebs_adaptive(&self) -> u64 {
        self.adaptive_record()
    }
    fn pebs_due(&self) -> u64 {
        self.pebs.due
    }
    fn pebs_armed(&self) -> u64 {
        self.pebs.armed
    }
    fn pebs_assisted(&mut self, s: &mut Shared, counters: u64, reset: &dyn Fn(CounterId) -> u64, threshold: bool) {
        self.assisted(s, counters, reset, threshold);
    }
    fn bts_records(&self, cpl: u8) -> bool {
        let d = self.debugctl;
        let off = if cpl == 0 { DEBUGCTL_BTS_OFF_OS } else { DEBUGCTL_BTS_OFF_USR };
        self.bts_on && d & (DEBUGCTL_TR | DEBUGCTL_BTS) == DEBUGCTL_TR | DEBUGCTL_BTS && d & off == 0
    }
    fn bts_interrupts(&self) -> bool {
        self.debugctl & DEBUGCTL_BTINT != 0
    }
    fn lbr_filter(&self) -> Option<super::lbr::LbrFilter> {
        self.filter()
    }
    fn lbr_call_stack(&self) -> bool {
        self.lbr.select & super::lbr::LBR_SELECT_EN_CALLSTACK != 0
    }
    fn lbr_newest(&self, n: usize) -> Vec<(u64, u64, u64)> {
        self.newest(n)
    }
    fn record_branch(&mut self, b: &Branch) -> bool {
        self.record(b)
    }
}
