//! The API counting backends use: counter enumeration and state, event accounting, overflow,
//! PMI, freeze-on-PMI, and the counters marked for reprogramming.

use super::counter::{self, width_mask};
use super::msr::*;
use super::regs::{FixedCtrField, PerfEvtSel};
use super::{netburst, CounterId, CounterState, Pmu, Reprogram};
use crate::profile::ArchEvent;

impl Pmu {
    /// Every counter the profile declares: `Gp(0..N)` then each supported `Fixed(i)` (v2+).
    pub fn counter_ids(&self) -> Vec<CounterId> {
        if self.nb.is_some() {
            return (0..netburst::COUNTERS).map(CounterId::NetBurst).collect();
        }
        let gp = (0..self.layout.gp).map(CounterId::Gp);
        let fixed = (0..MAX_FIXED).filter(|&i| self.layout.fixed_exists(i)).map(CounterId::Fixed);
        gp.chain(fixed).collect()
    }

    /// Does the profile declare counter `id`?
    pub fn counter_exists(&self, id: CounterId) -> bool {
        match id {
            CounterId::Gp(i) => self.layout.gp_exists(i),
            CounterId::Fixed(i) => self.layout.fixed_exists(i),
            CounterId::NetBurst(i) => self.nb.is_some() && i < netburst::COUNTERS,
        }
    }

    /// The state of counter `id`. A counter the profile does not declare reads as all-zero,
    /// disabled, width 0.
    pub fn counter(&self, id: CounterId) -> CounterState {
        let mut s = CounterState {
            id,
            event_select: 0,
            umask: 0,
            usr: false,
            os: false,
            edge: false,
            inv: false,
            cmask: 0,
            any: false,
            int: false,
            enabled: false,
            counting: false,
            value: 0,
            width: 0,
            netburst: None,
        };
        if !self.counter_exists(id) {
            return s;
        }
        match id {
            CounterId::Gp(i) => {
                let sel = PerfEvtSel(self.perfevtsel[usize::from(i)]);
                s.event_select = sel.event_select();
                s.umask = sel.umask();
                s.usr = sel.usr();
                s.os = sel.os();
                s.edge = sel.edge();
                s.inv = sel.inv();
                s.cmask = sel.cmask();
                s.any = sel.any();
                s.int = sel.int();
                s.enabled = sel.en();
                s.value = self.pmc[usize::from(i)];
                s.width = self.layout.gp_width;
            }
            CounterId::Fixed(i) => {
                let field = FixedCtrField::of(self.fixed_ctr_ctrl, i);
                if let Some(e) = ArchEvent::fixed(i) {
                    (s.event_select, s.umask) = (e.event_select, e.umask);
                }
                s.usr = field.usr();
                s.os = field.os();
                s.any = field.any();
                s.int = field.pmi();
                s.enabled = field.en() != 0;
                s.value = self.fixed_ctr[usize::from(i)];
                s.width = self.layout.fixed_width;
            }
            CounterId::NetBurst(i) => {
                let nb = self.nb.as_ref().expect("exists");
                return netburst_state(nb, s, i);
            }
        }
        // SDM 18.2.2 / 18.2.4.1: EN AND GLOBAL_CTRL enable AND NOT CTR_Frz (v1: EN alone).
        let global = self.layout.version == 1 || self.global_ctrl & id.status_mask() != 0;
        s.counting = s.enabled && global && !self.frozen();
        s
    }

    /// The counters that are counting now.
    pub fn counting(&self) -> Vec<CounterState> {
        self.counter_ids().into_iter().map(|id| self.counter(id)).filter(|s| s.counting).collect()
    }

    /// Events until counter `id` overflows: `2^width - value` (value 0 => `2^width`).
    /// Returns `u64::MAX` when that is `2^64` (a 64-bit counter at 0: "effectively never") and
    /// for a counter the profile does not declare.
    pub fn distance_to_overflow(&self, id: CounterId) -> u64 {
        if !self.counter_exists(id) {
            return u64::MAX;
        }
        if let (Some(nb), CounterId::NetBurst(i)) = (&self.nb, id) {
            return nb.distance(i);
        }
        let s = self.counter(id);
        counter::distance_to_overflow(s.value, s.width)
    }

    /// Add `n` events to counter `id`: value = (value + n) mod 2^width. On a wrap past
    /// 2^width - 1 (reported once however far `n` goes): set the IA32_PERF_GLOBAL_STATUS bit
    /// (v2+), and if the counter's INT/PMI bit is set mark a PMI pending. Returns true if it
    /// overflowed. A no-op returning false for a counter the profile does not declare.
    /// Marks nothing for reprogramming (the backend made the change itself).
    pub fn add_events(&mut self, id: CounterId, n: u64) -> bool {
        if !self.counter_exists(id) {
            return false;
        }
        if let (Some(nb), CounterId::NetBurst(i)) = (&mut self.nb, id) {
            let added = nb.add_events(i, n);
            self.pmi_pending |= added.pmi;
            self.mark(added.started);
            return added.overflowed;
        }
        let s = self.counter(id);
        let (value, overflowed) = counter::add_events(s.value, n, s.width);
        self.store_value(id, value);
        let bit = id.status_mask();
        if self.pebs_on && self.pebs_enable & self.layout.pebs_enable_valid & bit != 0 {
            // SDM 18.6.1.1 (PEBS): the overflow arms PEBS instead of raising a PMI or setting the
            // counter's overflow bit; the first event after it (a 0 to 1 transition) triggers
            // the assist, which the backend performs (`pebs_due`, `pebs_assisted`).
            if self.pebs.armed & bit != 0 && n > 0 {
                self.pebs.due |= bit;
            }
            if overflowed {
                self.pebs.armed |= bit;
                if value > 0 {
                    self.pebs.due |= bit;
                }
            }
            return overflowed;
        }
        if overflowed {
            if self.layout.version >= 2 {
                self.global_status |= id.status_mask();
            }
            if s.int {
                self.pmi_pending = true;
            }
        }
        overflowed
    }

    /// PEBS-enabled counters whose assist is due: they overflowed and have counted an event
    /// since. The backend writes the record and calls [`Pmu::pebs_assisted`].
    pub fn pebs_due(&self) -> u64 {
        self.pebs.due
    }

    /// Is PEBS presented to the guest (MISC_ENABLE.PEBS_UNAVAILABLE clear)?
    pub fn pebs_on(&self) -> bool {
        self.pebs_on
    }

    /// Presents PEBS (`on`: the backend writes PEBS records) or not, through
    /// MISC_ENABLE.PEBS_UNAVAILABLE (bit 12, read-only to the guest). Before the guest runs.
    pub fn set_pebs(&mut self, on: bool) {
        self.pebs_on = on;
        self.set_misc_unavailable(MISC_ENABLE_PEBS_UNAVAILABLE, !on);
    }

    /// Sets (`unavailable`) or clears a read-only "unavailable" bit of IA32_MISC_ENABLE.
    fn set_misc_unavailable(&mut self, bit: u64, unavailable: bool) {
        self.misc_enable = if unavailable { self.misc_enable | bit } else { self.misc_enable & !bit };
    }

    /// Presents BTS (`on`: the backend writes branch records into the BTS buffer) or not,
    /// through MISC_ENABLE.BTS_UNAVAILABLE (bit 11, read-only to the guest). Before the guest runs.
    pub fn set_bts(&mut self, on: bool) {
        self.bts_on = on;
        self.set_misc_unavailable(MISC_ENABLE_BTS_UNAVAILABLE, !on);
    }

    /// Is BTS presented?
    pub fn bts_on(&self) -> bool {
        self.bts_on
    }

    /// Does a branch taken at CPL `cpl` go into the BTS buffer? DEBUGCTL.TR and BTS are set, and
    /// BTS_OFF_OS / BTS_OFF_USR do not skip that CPL (SDM 17.4.9).
    pub fn bts_records(&self, cpl: u8) -> bool {
        let d = self.debugctl;
        let off = if cpl == 0 { DEBUGCTL_BTS_OFF_OS } else { DEBUGCTL_BTS_OFF_USR };
        self.bts_on && d & (DEBUGCTL_TR | DEBUGCTL_BTS) == DEBUGCTL_TR | DEBUGCTL_BTS && d & off == 0
    }

    /// DEBUGCTL.BTINT: the BTS buffer interrupts at its threshold instead of wrapping around.
    pub fn bts_interrupts(&self) -> bool {
        self.debugctl & DEBUGCTL_BTINT != 0
    }

    /// The BTS index reached the interrupt threshold with BTINT set: a DS interrupt, the PMI
    /// through LVTPC (SDM 17.4.9).
    pub fn bts_threshold_reached(&mut self) {
        self.pmi_pending = true;
    }

    /// MSR_PEBS_DATA_CFG: the adaptive record's groups.
    pub fn pebs_data_cfg(&self) -> u64 {
        self.pebs_data_cfg
    }

    /// The backend performed the PEBS assist for `counters` (of [`Pmu::pebs_due`], in the
    /// GLOBAL_STATUS layout; SDM 18.6.1.1 "PEBS Counter Reset"): each is reloaded with
    /// `reset(id)`, its reset value in the DS area. `threshold`: the record brought the PEBS
    /// index to the interrupt threshold, which sets GLOBAL_STATUS.OvfBuffer and raises a PMI.
    pub fn pebs_assisted(&mut self, counters: u64, reset: impl Fn(CounterId) -> u64, threshold: bool) {
        let counters = counters & self.pebs.due;
        for id in self.counter_ids().into_iter().filter(|id| counters & id.status_mask() != 0) {
            self.store_value(id, reset(id));
        }
        self.pebs.disarm(counters);
        if threshold {
            self.global_status |= GLOBAL_STATUS_OVF_BUFFER;
            self.pmi_pending = true;
        }
    }

    /// Backend sync: set counter `id` to `value` masked to its width, with no side effects
    /// (no status, no PMI, nothing marked). Ignored for an undeclared counter.
    pub fn set_value(&mut self, id: CounterId, value: u64) {
        if self.counter_exists(id) {
            self.store_value(id, value);
        }
    }

    fn store_value(&mut self, id: CounterId, value: u64) {
        match id {
            CounterId::Gp(i) => {
                self.pmc[usize::from(i)] = value & width_mask(self.layout.gp_width);
            }
            CounterId::Fixed(i) => {
                self.fixed_ctr[usize::from(i)] = value & width_mask(self.layout.fixed_width);
            }
            CounterId::NetBurst(i) => {
                if let Some(nb) = &mut self.nb {
                    nb.set_value(i, value);
                }
            }
        }
    }

    /// Is a PMI waiting to be delivered through the LVT performance-counter entry?
    pub fn pmi_pending(&self) -> bool {
        self.pmi_pending
    }

    /// The VMM delivered (or tried to deliver) the LVT PMI: clear pending and apply the
    /// IA32_DEBUGCTL freeze controls (SDM 17.4.7, 18.2.4.1). No-op if no PMI is pending.
    /// - FREEZE_PERFMON_ON_PMI: v2/v3 (legacy) clear IA32_PERF_GLOBAL_CTRL; v4+ (streamlined)
    ///   set GLOBAL_STATUS.CTR_Frz, which stops every counter until software clears it through
    ///   IA32_PERF_GLOBAL_STATUS_RESET. GLOBAL_CTRL is unchanged on v4+.
    /// - FREEZE_LBRS_ON_PMI: v1..v3 (legacy) clear IA32_DEBUGCTL.LBR; v4+ set GLOBAL_STATUS.LBR_Frz.
    pub fn pmi_delivered(&mut self) {
        if !std::mem::take(&mut self.pmi_pending) {
            return;
        }
        let streamlined = self.layout.version >= 4;
        if self.debugctl & DEBUGCTL_FREEZE_LBRS_ON_PMI != 0 {
            if streamlined {
                self.global_status |= GLOBAL_STATUS_LBR_FRZ;
            } else {
                self.debugctl &= !DEBUGCTL_LBR;
            }
        }
        if self.debugctl & DEBUGCTL_FREEZE_PERFMON_ON_PMI != 0 {
            if streamlined {
                self.set_status(self.global_status | GLOBAL_STATUS_CTR_FRZ);
            } else {
                let old = std::mem::take(&mut self.global_ctrl);
                self.mark(old);
            }
        }
    }

    /// The counters marked for reprogramming since the last [`Pmu::take_reprogram`]: a guest
    /// write to a counter (always, even of the same value: the backend must resync), a change of
    /// its PERFEVTSELx, its FIXED_CTR_CTRL field or its GLOBAL_CTRL bit, a CTR_Frz change
    /// (STATUS_SET, STATUS_RESET, freeze-on-PMI: every counter) and the legacy GLOBAL_CTRL clear
    /// on PMI. Nothing else marks a counter, and a write that raises #GP marks nothing.
    pub fn reprogram_pending(&self) -> Reprogram {
        self.reprogram
    }

    /// Takes the counters marked for reprogramming (see [`Pmu::reprogram_pending`]) and clears
    /// the marks: a backend calls it before each VM entry and reprograms exactly those counters.
    pub fn take_reprogram(&mut self) -> Reprogram {
        std::mem::take(&mut self.reprogram)
    }
}

/// The state of NetBurst counter `i` (SDM 18.15.3's qualification order): the ESCR's event and
/// T0 privilege flags, the CCCR's threshold filter (compare, complement, edge: the filter applies
/// to the per-instruction count, as CMASK does), and whether it counts.
fn netburst_state(nb: &netburst::Regs, mut s: CounterState, i: u8) -> CounterState {
    let c = nb.cccr(i);
    let sel = nb.selection(i);
    (s.usr, s.os) = nb.t0_usr_os(i);
    s.event_select = sel.map_or(0, |e| e.event);
    s.netburst = sel;
    // Compare: count 1 when the event count exceeds the threshold (or, complemented, does not).
    if c.compare() {
        s.cmask = c.threshold() + 1;
        s.inv = c.complement();
        s.edge = c.edge();
    }
    s.int = c.ovf_pmi_t0();
    s.enabled = c.enabled();
    s.counting = nb.counting(i);
    s.value = nb.value(i);
    s.width = netburst::WIDTH;
    s
}
