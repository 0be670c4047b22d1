//! The architectural PMU's counters: enumeration and state, event accounting, overflow, the
//! PMI, freeze-on-PMI and the PEBS assist's counter reset.

use super::arch::ArchPmu;
use super::counter::{self, width_mask};
use super::msr::*;
use super::ops::Shared;
use super::regs::{fixed_adaptive_bit, FixedCtrField, PerfEvtSel};
use super::semantics::{BranchFilter, Semantics};
use super::{CounterId, CounterState};
use crate::profile::{ArchEvent, Event};

impl ArchPmu {
    /// Every counter the profile declares: `Gp(0..N)` then each supported `Fixed(i)` (v2+).
    pub(super) fn ids(&self) -> Vec<CounterId> {
        let gp = (0..self.layout.gp).map(CounterId::Gp);
        let fixed = (0..MAX_FIXED).filter(|&i| self.layout.fixed_exists(i)).map(CounterId::Fixed);
        gp.chain(fixed).collect()
    }

    /// The state of declared counter `id`.
    pub(super) fn state(&self, id: CounterId) -> CounterState {
        let mut s = CounterState::absent(id);
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
            CounterId::NetBurst(_) => return s,
        }
        s.semantics = match id {
            CounterId::Gp(i) => self.gp_semantics(i, &s),
            _ => semantics(id, s.event_select, s.umask),
        };
        // SDM 18.2.2 / 18.2.4.1: EN AND GLOBAL_CTRL enable AND NOT CTR_Frz (v1: EN alone).
        let global = self.layout.version == 1 || self.global_ctrl & id.status_mask() != 0;
        let frozen = self.layout.version >= 4 && self.global_status & GLOBAL_STATUS_CTR_FRZ != 0;
        s.counting = s.enabled && global && !frozen;
        s
    }

    /// What general-purpose counter `i` counts: an architectural event (SDM Table 18-1, on any
    /// counter), else the event of the CPU's list its encoding names, on the counters the list
    /// gives it (README, "Model-specific events"), else nothing emon derives.
    fn gp_semantics(&self, i: u8, s: &CounterState) -> Semantics {
        let arch = semantics(s.id, s.event_select, s.umask);
        if arch != Semantics::Unsupported {
            return arch;
        }
        self.events
            .and_then(|l| l.lookup(i, s.event_select, s.umask, s.cmask, s.inv, s.edge))
            .map_or(Semantics::Unsupported, |l| l.semantics)
    }

    /// Add `n` events to declared counter `id` (see [`super::Pmu::add_events`]): on a wrap past
    /// 2^width - 1 set the IA32_PERF_GLOBAL_STATUS bit (v2+) and, with the counter's INT/PMI bit,
    /// mark a PMI pending; a PEBS-enabled counter arms PEBS instead.
    pub(super) fn add(&mut self, sh: &mut Shared, id: CounterId, n: u64) -> bool {
        let s = self.state(id);
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
                sh.pmi_pending = true;
            }
        }
        overflowed
    }

    /// The counters whose Adaptive_Record bit is set (PERFEVTSELx bit 34, FIXED_CTR_CTRL bit
    /// 32 + 4i), in the GLOBAL_STATUS layout: their PEBS records take MSR_PEBS_DATA_CFG's groups
    /// (SDM 18.9.2.2). The bits exist only with PERF_CAPABILITIES.PEBS_BASELINE.
    pub(super) fn adaptive_record(&self) -> u64 {
        self.ids().into_iter().fold(0, |m, id| {
            let on = match id {
                CounterId::Gp(i) => PerfEvtSel(self.perfevtsel[usize::from(i)]).adaptive(),
                CounterId::Fixed(i) => self.fixed_ctr_ctrl & fixed_adaptive_bit(i) != 0,
                CounterId::NetBurst(_) => false,
            };
            if on {
                m | id.status_mask()
            } else {
                m
            }
        })
    }

    /// The backend performed the PEBS assist for `counters` (see [`super::Pmu::pebs_assisted`]).
    pub(super) fn assisted(
        &mut self,
        sh: &mut Shared,
        counters: u64,
        reset: &dyn Fn(CounterId) -> u64,
        threshold: bool,
    ) {
        let counters = counters & self.pebs.due;
        for id in self.ids().into_iter().filter(|id| counters & id.status_mask() != 0) {
            self.store_value(id, reset(id));
        }
        self.pebs.disarm(counters);
        if threshold {
            self.global_status |= GLOBAL_STATUS_OVF_BUFFER;
            sh.pmi_pending = true;
        }
    }

    pub(super) fn store_value(&mut self, id: CounterId, value: u64) {
        match id {
            CounterId::Gp(i) => {
                self.pmc[usize::from(i)] = value & width_mask(self.layout.gp_width);
            }
            CounterId::Fixed(i) => {
                self.fixed_ctr[usize::from(i)] = value & width_mask(self.layout.fixed_width);
            }
            CounterId::NetBurst(_) => {}
        }
    }

    /// The PMI went out: apply the IA32_DEBUGCTL freeze controls (SDM 17.4.7, 18.2.4.1).
    /// - FREEZE_PERFMON_ON_PMI: v2/v3 (legacy) clear IA32_PERF_GLOBAL_CTRL; v4+ (streamlined)
    ///   set GLOBAL_STATUS.CTR_Frz, which stops every counter until software clears it through
    ///   IA32_PERF_GLOBAL_STATUS_RESET. GLOBAL_CTRL is unchanged on v4+.
    /// - FREEZE_LBRS_ON_PMI: v1..v3 (legacy) clear IA32_DEBUGCTL.LBR; v4+ set GLOBAL_STATUS.LBR_Frz.
    pub(super) fn freeze_on_pmi(&mut self, sh: &mut Shared) {
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
                self.set_status(sh, self.global_status | GLOBAL_STATUS_CTR_FRZ);
            } else {
                let old = std::mem::take(&mut self.global_ctrl);
                sh.mark(old, self.declared());
            }
        }
    }

    /// IA32_PERF_GLOBAL_INUSE as computed from the registers (SDM 18.2.4.3): bit i =
    /// PERFEVTSELi\[7:0\] != 0; bit 32+i = FIXED_CTR_CTRL field i EN != 0; bit 63 (PMI_InUse) =
    /// any PERFEVTSELi.INT, fixed PMI bit, or IA32_PEBS_ENABLE bit of a PMC.
    pub(super) fn inuse(&self) -> u64 {
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
}

/// What an architectural counter counts: an architectural event (SDM Table 18-1) by its
/// encoding; on a fixed counter, REF_TSC rather than the reference clock (SDM Table 18-2).
pub fn semantics(id: CounterId, event_select: u8, umask: u8) -> Semantics {
    match ArchEvent::of(event_select, umask).map(|e| e.event) {
        Some(Event::Instructions) => Semantics::Instructions,
        Some(Event::Branches) => Semantics::Branches(BranchFilter::ALL),
        Some(Event::BranchMisses) => Semantics::Branches(BranchFilter::MISSES),
        Some(Event::CoreCycles) => Semantics::CoreCycles,
        Some(Event::RefCycles) if matches!(id, CounterId::Fixed(_)) => Semantics::RefTsc,
        Some(Event::RefCycles) => Semantics::RefXclk,
        Some(Event::LlcReference) => Semantics::LlcReference,
        Some(Event::LlcMisses) => Semantics::LlcMisses,
        Some(Event::TopdownSlots) => Semantics::Slots,
        None => Semantics::Unsupported,
    }
}
