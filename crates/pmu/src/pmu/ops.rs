//! The interface every PMU model implements, as KVM's `kvm_pmu_ops` is for Intel and AMD: the
//! registers, when a counter counts, RDPMC, the register dump and what the model stores without
//! modelling. [`super::Pmu`] holds one model and dispatches to it; the state both share (the
//! pending PMI and the counters marked for reprogramming) is [`Shared`].
//!
//! Features only some models have (the LBR stack, the Debug Store) have default methods that
//! say "absent", as KVM leaves an op NULL.

use super::lbr::Branch;
use super::{CounterId, CounterState, GpFault, Reprogram};

/// The state every model has: IA32_MISC_ENABLE (the same register on every PMU model), the
/// pending PMI and the counters marked for reprogramming.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Shared {
    /// IA32_MISC_ENABLE.
    pub misc_enable: u64,
    /// A PMI waits to be delivered through the LVT performance-counter entry.
    pub pmi_pending: bool,
    /// Counters marked for reprogramming since the backend last took the marks.
    pub reprogram: Reprogram,
}

impl Shared {
    /// Marks the counters in `mask` (of the model's declared counters `declared`) for
    /// reprogramming.
    pub fn mark(&mut self, mask: u64, declared: u64) {
        self.reprogram.counters |= mask & declared;
    }

    /// Marks counter `id` as written by the guest (and so for reprogramming).
    pub fn mark_written(&mut self, id: CounterId, declared: u64) {
        self.mark(id.status_mask(), declared);
        self.reprogram.written |= id.status_mask() & declared;
    }
}

/// Configurations a guest can set that a model stores but emon does not produce; the VMM says
/// so in the run summary (README, "Model-specific PMU MSRs", "The NetBurst PMU").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Unmodelled(u32);

impl Unmodelled {
    /// IA32_DEBUGCTL.LBR: only a backend that records branches fills the LBR stack.
    pub const DEBUGCTL_LBR: Unmodelled = Unmodelled(1 << 0);
    /// IA32_DEBUGCTL.BTF: single-step on branches, which no backend emulates.
    pub const DEBUGCTL_BTF: Unmodelled = Unmodelled(1 << 1);
    /// NetBurst: an enabled CCCR's ESCR select names no ESCR of its counter's block.
    pub const UNPAIRED_CCCR: Unmodelled = Unmodelled(1 << 2);
    /// NetBurst: an ESCR has Tag Enable set (µop tagging, SDM 18.15.6).
    pub const UOP_TAGGING: Unmodelled = Unmodelled(1 << 3);
    /// NetBurst: an enabled IQ CCCR sets an extended-cascading bit (SDM 18.15.5.7).
    pub const EXTENDED_CASCADE: Unmodelled = Unmodelled(1 << 4);
    /// NetBurst: an enabled CCCR asks for OVF_PMI_T1, a PMI to logical processor 1.
    pub const PMI_T1: Unmodelled = Unmodelled(1 << 5);
    /// NetBurst: IA32_PEBS_ENABLE.ENABLE_PEBS_MY_THR (NetBurst PEBS).
    pub const NETBURST_PEBS: Unmodelled = Unmodelled(1 << 6);
    /// NetBurst: MSR_DEBUGCTLA's TR/BTS (branch trace messages and BTS).
    pub const BRANCH_TRACE_STORE: Unmodelled = Unmodelled(1 << 7);
    /// MSR_MISC_FEATURE_CONTROL or IA32_MISC_ENABLE turned hardware prefetchers off: only a
    /// backend that counts the LLC events from emon's cache model obeys it.
    pub const PREFETCHERS_OFF: Unmodelled = Unmodelled(1 << 8);

    /// Nothing.
    pub const NONE: Unmodelled = Unmodelled(0);

    /// Both sets.
    pub fn union(self, o: Unmodelled) -> Unmodelled {
        Unmodelled(self.0 | o.0)
    }

    /// Does this set hold all of `o`?
    pub fn contains(self, o: Unmodelled) -> bool {
        self.0 & o.0 == o.0
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// What the run summary says about these configurations, but those in `produced`, which
    /// the backend produced (DEBUGCTL.LBR where it fills the LBR stack, PREFETCHERS_OFF where it
    /// counts from the cache model).
    pub fn notes(self, produced: Unmodelled) -> Vec<String> {
        const DEBUGCTL: &[(Unmodelled, &str)] = &[
            (Unmodelled::DEBUGCTL_LBR, "DEBUGCTL.LBR: this backend records no branches in the LBR stack"),
            (Unmodelled::DEBUGCTL_BTF, "DEBUGCTL.BTF: single-step on branches is not emulated"),
        ];
        const NETBURST: &[(Unmodelled, &str)] = &[
            (
                Unmodelled::UNPAIRED_CCCR,
                "a CCCR's ESCR select named no ESCR of its counter's block (the counter counted nothing)",
            ),
            (Unmodelled::UOP_TAGGING, "ESCR Tag Enable (µop tagging for at-retirement events: tagged µops count 0)"),
            (Unmodelled::EXTENDED_CASCADE, "an IQ CCCR's extended-cascading bits (the counters did not cascade)"),
            (
                Unmodelled::PMI_T1,
                "CCCR.OVF_PMI_T1 (a PMI to logical processor 1, which emon does not run: none was sent)",
            ),
            (Unmodelled::NETBURST_PEBS, "IA32_PEBS_ENABLE.ENABLE_PEBS_MY_THR (NetBurst PEBS: no record was written)"),
            (
                Unmodelled::BRANCH_TRACE_STORE,
                "MSR_DEBUGCTLA.TR/BTS (NetBurst branch trace messages and BTS: none were stored)",
            ),
        ];
        let named = |table: &[(Unmodelled, &'static str)]| -> Vec<&'static str> {
            table.iter().filter(|(u, _)| self.contains(*u) && !produced.contains(*u)).map(|&(_, s)| s).collect()
        };
        let mut notes = Vec::new();
        let debugctl = named(DEBUGCTL);
        if !debugctl.is_empty() {
            notes.push(format!(
                "NOT EXACT: the guest set {} (README, \"Model-specific PMU MSRs\")",
                debugctl.join("; ")
            ));
        }
        if self.contains(Unmodelled::PREFETCHERS_OFF) && !produced.contains(Unmodelled::PREFETCHERS_OFF) {
            notes.push(
                "NOT EXACT: the guest turned hardware prefetchers off (MSR_MISC_FEATURE_CONTROL or IA32_MISC_ENABLE); this backend's LLC events come from the host's caches, whose prefetchers it cannot turn off (README, \"The cache model\")".to_string(),
            );
        }
        let netburst = named(NETBURST);
        if !netburst.is_empty() {
            notes.push(format!(
                "NOT EXACT: NetBurst: the guest set {}, which emon does not model (README, \"The NetBurst PMU\")",
                netburst.join("; ")
            ));
        }
        notes
    }
}

/// One PMU model: a register file and how its counters count.
pub trait PmuOps {
    /// Does the model have register `msr` (existing or a hole that #GPs)? MSRs it does not claim
    /// go to the register both models share (IA32_MISC_ENABLE) or #GP.
    fn claims(&self, msr: u32) -> bool;
    /// RDMSR of one of its registers.
    fn rdmsr(&self, msr: u32) -> Result<u64, GpFault>;
    /// WRMSR of one of its registers, validated completely before anything is stored (a #GP
    /// changes nothing), marking the counters it changes in `s`.
    fn wrmsr(&mut self, s: &mut Shared, msr: u32, value: u64) -> Result<(), GpFault>;
    /// The name of its register `msr`.
    fn reg_name(&self, msr: u32) -> Option<String>;

    /// Every counter it declares, in IA32_PERF_GLOBAL_CTRL bit order.
    fn counter_ids(&self) -> Vec<CounterId>;
    /// Does it declare counter `id`?
    fn exists(&self, id: CounterId) -> bool;
    /// The state of one of its declared counters.
    fn counter(&self, id: CounterId) -> CounterState;
    /// Events until counter `id` must be looked at event by event (its overflow).
    fn distance_to_overflow(&self, id: CounterId) -> u64;
    /// Adds `n` events to declared counter `id`; returns whether it overflowed.
    fn add_events(&mut self, s: &mut Shared, id: CounterId, n: u64) -> bool;
    /// Sets declared counter `id` to `value` (masked to its width) with no side effects.
    fn set_value(&mut self, id: CounterId, value: u64);
    /// The PMI went out: apply the model's freeze-on-PMI controls.
    fn pmi_delivered(&mut self, s: &mut Shared);
    /// RDPMC's value for `ecx`, privilege already checked; #GP when ECX selects no counter.
    fn rdpmc(&self, ecx: u32) -> Result<u64, GpFault>;
    /// A description of the event counter `id` counts, for a run-summary note.
    fn event_name(&self, id: CounterId) -> String;

    /// [`super::Pmu::dump`]: every register that exists, decoded, then each counter's state.
    fn dump(&self, s: &Shared, out: &mut String);
    /// What the guest has set now that emon stores without producing.
    fn unmodelled(&self) -> Unmodelled;

    // ---- Features only some models have: "absent" by default. ----

    /// IA32_DEBUGCTL as stored.
    fn debugctl(&self) -> u64 {
        0
    }
    /// IA32_DS_AREA.
    fn ds_area(&self) -> u64 {
        0
    }
    /// IA32_PERF_GLOBAL_CTRL, _STATUS, IA32_FIXED_CTR_CTRL, IA32_PERFEVTSELi, INUSE.
    fn global_ctrl(&self) -> u64 {
        0
    }
    fn global_status(&self) -> u64 {
        0
    }
    fn fixed_ctr_ctrl(&self) -> u64 {
        0
    }
    fn perfevtsel(&self, _i: u8) -> Option<u64> {
        None
    }
    fn global_inuse(&self) -> u64 {
        0
    }
    fn frozen(&self) -> bool {
        false
    }
    /// Presents PEBS or BTS (the backend writes them); `false`: the model has none to present.
    fn set_pebs(&mut self, _on: bool) -> bool {
        false
    }
    fn set_bts(&mut self, _on: bool) -> bool {
        false
    }
    fn pebs_on(&self) -> bool {
        false
    }
    fn bts_on(&self) -> bool {
        false
    }
    fn pebs_enable(&self) -> u64 {
        0
    }
    fn pebs_data_cfg(&self) -> u64 {
        0
    }
    /// The counters whose PEBS records use MSR_PEBS_DATA_CFG's groups (their Adaptive_Record
    /// bit is set; [`super::Pmu::pebs_adaptive`]).
    fn pebs_adaptive(&self) -> u64 {
        0
    }
    fn pebs_due(&self) -> u64 {
        0
    }
    /// PEBS-enabled counters whose overflow armed an assist not yet performed.
    fn pebs_armed(&self) -> u64 {
        0
    }
    fn pebs_assisted(&mut self, _s: &mut Shared, _counters: u64, _reset: &dyn Fn(CounterId) -> u64, _threshold: bool) {}
    fn bts_records(&self, _cpl: u8) -> bool {
        false
    }
    fn bts_interrupts(&self) -> bool {
        false
    }
    fn lbr_filter(&self) -> Option<super::lbr::LbrFilter> {
        None
    }
    fn lbr_call_stack(&self) -> bool {
        false
    }
    fn lbr_newest(&self, _n: usize) -> Vec<(u64, u64, u64)> {
        Vec::new()
    }
    fn record_branch(&mut self, _b: &Branch) -> bool {
        false
    }
}
