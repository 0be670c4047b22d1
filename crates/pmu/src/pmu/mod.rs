//! The virtual PMU of one vCPU: a pure state machine, no KVM, no I/O.
//!
//! [`Pmu`] is one facade over the profile's PMU model, as KVM's `pmu.c` is over its vendors'
//! `kvm_pmu_ops` ([`ops::PmuOps`]): the Intel architectural PMU (perfmon v1..v5, SDM Vol. 3B
//! 18.2 in the numbering used here: existence per profile, reserved bits (#GP with no state
//! change), legacy sign-extended and full-width counter writes, global control/status, overflow,
//! PMI, freeze-on-PMI, the LBR stack and the Debug Store), or the NetBurst PMU (18.15).
//! A backend feeds counted events in with [`Pmu::add_events`], reprograms the counters a change
//! marked ([`Pmu::take_reprogram`], as KVM's `kvm_pmu_request_counter_reprogram`), and counts
//! each counter's [`Semantics`] without knowing the model.
//!
//! Files: `ops` (the model interface and the shared state), `semantics` (what a counter counts),
//! `counter` (width arithmetic); the architectural model in `arch` with `msr` (indices, bit
//! names), `regs` (field decoding, writable masks from the profile), `decode` (MSR index ->
//! register), `access` (RDMSR/WRMSR), `counting` (counter state, overflow, freeze), `rdpmc`,
//! `lbr`, `ds` (the Debug Store's records) and `dump`; the NetBurst model in `netburst`; the
//! hardware prefetchers' control register in `prefetch`.

mod access;
mod arch;
pub mod counter;
mod counting;
mod decode;
pub mod ds;
mod dump;
pub mod lbr;
pub mod msr;
pub mod netburst;
pub mod ops;
pub mod prefetch;
pub mod rdpmc;
pub mod regs;
pub mod semantics;
#[cfg(test)]
mod tests;

use std::fmt;

use crate::profile::{PmuKind, PmuProfile, PrefetcherSet, Prefetchers};
pub use counting::semantics as arch_semantics;
pub use msr::msr_name;
use msr::*;
pub use ops::Unmodelled;
use ops::{PmuOps, Shared};
use prefetch::PrefetchControl;
use regs::{MISC_ENABLE_READ_ONLY, MISC_ENABLE_WRITABLE};
pub use semantics::{
    BranchFilter, Fidelity, FpKinds, InsnClass, Level, LineFilter, Semantics, SourceFilter, SplitFilter,
};

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

    /// A dense index for per-counter state a backend keeps, below [`CounterId::SLOTS`]: GP
    /// counters, then fixed counters; a NetBurst counter by its index.
    pub fn slot(self) -> usize {
        let s = match self {
            CounterId::Gp(n) | CounterId::NetBurst(n) => usize::from(n),
            CounterId::Fixed(n) => usize::from(MAX_GP) + usize::from(n),
        };
        s.min(Self::SLOTS - 1)
    }

    /// Slots of [`CounterId::slot`].
    pub const SLOTS: usize = {
        let arch = MAX_GP as usize + MAX_FIXED as usize;
        let netburst = netburst::COUNTERS as usize;
        if arch > netburst {
            arch
        } else {
            netburst
        }
    };
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
    /// What it counts, as a backend derives it.
    pub semantics: Semantics,
}

impl CounterState {
    /// A counter the profile does not declare: all-zero, disabled, width 0.
    pub fn absent(id: CounterId) -> CounterState {
        CounterState {
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
            semantics: Semantics::Unsupported,
        }
    }
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

/// The virtual PMU of one vCPU: the profile's PMU model behind one dispatch (see [`ops`]), and
/// the state every model shares. See the module documentation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pmu {
    profile: PmuProfile,
    model: Model,
    shared: Shared,
    /// The cache model's prefetchers and MSR_MISC_FEATURE_CONTROL.
    prefetch: PrefetchControl,
}

/// The PMU models (as KVM's vendor `kvm_pmu_ops`). One per vCPU, held inline: the sizes differ,
/// and nothing is gained by boxing the larger.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(clippy::large_enum_variant)]
enum Model {
    Architectural(arch::ArchPmu),
    NetBurst(netburst::NetBurstPmu),
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
        (MSR_MISC_FEATURE_CONTROL, MSR_MISC_FEATURE_CONTROL),
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

    /// Power-on state: the profile's model with its registers at reset (SDM 18.2.2, 18.15.3),
    /// and IA32_MISC_ENABLE = fast strings | perfmon available (profile) | BTS unavailable |
    /// PEBS unavailable.
    pub fn new(profile: &PmuProfile) -> Pmu {
        let mut misc_enable = MISC_ENABLE_FAST_STRINGS | MISC_ENABLE_BTS_UNAVAILABLE | MISC_ENABLE_PEBS_UNAVAILABLE;
        if profile.misc_enable_perfmon {
            misc_enable |= MISC_ENABLE_PERFMON_AVAILABLE;
        }
        let model = match profile.kind {
            PmuKind::Architectural => Model::Architectural(arch::ArchPmu::new(profile)),
            PmuKind::NetBurst => Model::NetBurst(netburst::NetBurstPmu::default()),
        };
        Pmu {
            profile: profile.clone(),
            model,
            shared: Shared { misc_enable, ..Shared::default() },
            prefetch: PrefetchControl::default(),
        }
    }

    /// The same PMU with the profile's hardware prefetchers (its `[cache]`): their control
    /// register, MSR_MISC_FEATURE_CONTROL or IA32_MISC_ENABLE's disable bits, and which of them
    /// are on ([`Pmu::prefetchers_on`]). Without it a PMU has neither.
    pub fn with_prefetchers(mut self, prefetchers: Prefetchers) -> Pmu {
        self.prefetch = PrefetchControl::new(prefetchers);
        self
    }

    /// The hardware prefetchers the guest has left on: the profile's, less those its control
    /// register turns off (README, "The cache model").
    pub fn prefetchers_on(&self) -> PrefetcherSet {
        self.prefetch.enabled(self.shared.misc_enable)
    }

    /// The model, as its interface.
    fn ops(&self) -> &dyn PmuOps {
        match &self.model {
            Model::Architectural(m) => m,
            Model::NetBurst(m) => m,
        }
    }

    /// The model and the state it shares, for a change.
    fn ops_mut(&mut self) -> (&mut dyn PmuOps, &mut Shared) {
        let m: &mut dyn PmuOps = match &mut self.model {
            Model::Architectural(m) => m,
            Model::NetBurst(m) => m,
        };
        (m, &mut self.shared)
    }

    /// The profile this PMU was built from.
    pub fn profile(&self) -> &PmuProfile {
        &self.profile
    }

    /// Is `msr` in [`Pmu::TRAPPED_MSRS`]?
    pub fn owns(msr: u32) -> bool {
        Self::TRAPPED_MSRS.iter().any(|&(lo, hi)| (lo..=hi).contains(&msr))
    }

    /// The name of `msr` under this PMU's profile (0x309 is IA32_FIXED_CTR0, or on NetBurst
    /// MSR_FLAME_COUNTER1).
    pub fn reg_name(&self, msr: u32) -> Option<String> {
        match !Self::facade_reg(msr) && self.ops().claims(msr) {
            true => self.ops().reg_name(msr),
            false => msr_name(msr),
        }
    }

    /// The registers the facade keeps whatever the model: IA32_MISC_ENABLE and
    /// MSR_MISC_FEATURE_CONTROL.
    fn facade_reg(msr: u32) -> bool {
        matches!(msr, IA32_MISC_ENABLE | MSR_MISC_FEATURE_CONTROL)
    }

    /// RDMSR of a PMU register.
    ///
    /// # Errors
    /// [`GpFault`] if `msr` is not a PMU register that exists under the profile.
    pub fn rdmsr(&self, msr: u32) -> Result<u64, GpFault> {
        match msr {
            IA32_MISC_ENABLE => Ok(self.shared.misc_enable),
            MSR_MISC_FEATURE_CONTROL => self.prefetch.read(),
            _ if self.ops().claims(msr) => self.ops().rdmsr(msr),
            _ => Err(GpFault),
        }
    }

    /// WRMSR of a PMU register.
    ///
    /// # Errors
    /// [`GpFault`], with no state change, if `msr` does not exist under the profile, is
    /// read-only (PERF_CAPABILITIES, GLOBAL_STATUS, GLOBAL_INUSE), or `value` sets a reserved bit.
    pub fn wrmsr(&mut self, msr: u32, value: u64) -> Result<(), GpFault> {
        if !Self::facade_reg(msr) && self.ops().claims(msr) {
            let (m, s) = self.ops_mut();
            return m.wrmsr(s, msr, value);
        }
        if msr == MSR_MISC_FEATURE_CONTROL {
            return self.prefetch.write(value);
        }
        // Core 2 and NetBurst turn their prefetchers off here (SDM Vol. 4: bits 9, 19, 37, 39).
        let writable = MISC_ENABLE_WRITABLE | self.prefetch.misc_enable_bits();
        if msr != IA32_MISC_ENABLE || value & !(writable | MISC_ENABLE_READ_ONLY) != 0 {
            return Err(GpFault);
        }
        let m = &mut self.shared.misc_enable;
        *m = (value & writable) | (*m & MISC_ENABLE_READ_ONLY);
        Ok(())
    }

    /// What the guest has set now that emon stores without producing (the VMM collects it over
    /// the run for its summary).
    pub fn unmodelled(&self) -> Unmodelled {
        let prefetchers = if self.prefetchers_on() == self.prefetch.prefetchers().present() {
            Unmodelled::NONE
        } else {
            Unmodelled::PREFETCHERS_OFF
        };
        self.ops().unmodelled().union(prefetchers)
    }

    /// A description of the event counter `id` counts, for a run-summary note (IA32_PERFEVTSELx
    /// event and umask; a NetBurst ESCR and event select).
    pub fn event_name(&self, id: CounterId) -> String {
        self.ops().event_name(id)
    }

    /// IA32_PERF_GLOBAL_CTRL as stored (v1 has no such MSR; counting then ignores it).
    pub fn global_ctrl(&self) -> u64 {
        self.ops().global_ctrl()
    }

    /// IA32_PERF_GLOBAL_STATUS.
    pub fn global_status(&self) -> u64 {
        self.ops().global_status()
    }

    /// IA32_FIXED_CTR_CTRL.
    pub fn fixed_ctr_ctrl(&self) -> u64 {
        self.ops().fixed_ctr_ctrl()
    }

    /// IA32_PERFEVTSELi, `None` if general-purpose counter i does not exist.
    pub fn perfevtsel(&self, i: u8) -> Option<u64> {
        self.ops().perfevtsel(i)
    }

    /// IA32_DEBUGCTL (MSR_DEBUGCTLA on NetBurst).
    pub fn debugctl(&self) -> u64 {
        self.ops().debugctl()
    }

    /// IA32_MISC_ENABLE.
    pub fn misc_enable(&self) -> u64 {
        self.shared.misc_enable
    }

    /// IA32_PEBS_ENABLE.
    pub fn pebs_enable(&self) -> u64 {
        self.ops().pebs_enable()
    }

    /// IA32_DS_AREA.
    pub fn ds_area(&self) -> u64 {
        self.ops().ds_area()
    }

    /// Counters are frozen by IA32_PERF_GLOBAL_STATUS.CTR_Frz (v4+ only, SDM 18.2.4.1).
    pub fn frozen(&self) -> bool {
        self.ops().frozen()
    }

    /// IA32_PERF_GLOBAL_INUSE as computed from the registers (SDM 18.2.4.3), for every version;
    /// the MSR itself exists only on v4+.
    pub fn global_inuse(&self) -> u64 {
        self.ops().global_inuse()
    }

    /// Every counter the profile declares: `Gp(0..N)` then each supported `Fixed(i)` (v2+), or
    /// the model's own counters.
    pub fn counter_ids(&self) -> Vec<CounterId> {
        self.ops().counter_ids()
    }

    /// Does the profile declare counter `id`?
    pub fn counter_exists(&self, id: CounterId) -> bool {
        self.ops().exists(id)
    }

    /// The state of counter `id`. A counter the profile does not declare reads as all-zero,
    /// disabled, width 0.
    pub fn counter(&self, id: CounterId) -> CounterState {
        match self.counter_exists(id) {
            true => self.ops().counter(id),
            false => CounterState::absent(id),
        }
    }

    /// The counters that are counting now.
    pub fn counting(&self) -> Vec<CounterState> {
        self.counter_ids().into_iter().map(|id| self.counter(id)).filter(|s| s.counting).collect()
    }

    /// Events counter `id` may count before one of them needs the backend at its instruction:
    /// the distance to its overflow, or 1 while its overflow has armed a PEBS assist, which the
    /// first event after it triggers (SDM 18.6.1.1). An executor that runs code in bulk stops
    /// short of that many.
    pub fn events_before_attention(&self, id: CounterId) -> u64 {
        if self.ops().pebs_armed() & id.status_mask() != 0 {
            return 1;
        }
        self.distance_to_overflow(id)
    }

    /// Events until counter `id` overflows: `2^width - value` (value 0 => `2^width`).
    /// Returns `u64::MAX` when that is `2^64` (a 64-bit counter at 0: "effectively never") and
    /// for a counter the profile does not declare.
    pub fn distance_to_overflow(&self, id: CounterId) -> u64 {
        match self.counter_exists(id) {
            true => self.ops().distance_to_overflow(id),
            false => u64::MAX,
        }
    }

    /// Add `n` events to counter `id`: value = (value + n) mod 2^width. On a wrap past
    /// 2^width - 1 (reported once however far `n` goes) the model records the overflow and may
    /// mark a PMI pending. Returns true if it overflowed. A no-op returning false for a counter
    /// the profile does not declare. Marks nothing for reprogramming (the backend made the
    /// change itself), unless the overflow starts another counter (a NetBurst cascade).
    pub fn add_events(&mut self, id: CounterId, n: u64) -> bool {
        if !self.counter_exists(id) {
            return false;
        }
        let (m, s) = self.ops_mut();
        m.add_events(s, id, n)
    }

    /// Backend sync: set counter `id` to `value` masked to its width, with no side effects
    /// (no status, no PMI, nothing marked). Ignored for an undeclared counter.
    pub fn set_value(&mut self, id: CounterId, value: u64) {
        if self.counter_exists(id) {
            self.ops_mut().0.set_value(id, value);
        }
    }

    /// Is a PMI waiting to be delivered through the LVT performance-counter entry?
    pub fn pmi_pending(&self) -> bool {
        self.shared.pmi_pending
    }

    /// The VMM delivered (or tried to deliver) the LVT PMI: clear pending and apply the model's
    /// freeze controls (architectural: IA32_DEBUGCTL's, SDM 17.4.7, 18.2.4.1). No-op if no PMI
    /// is pending.
    pub fn pmi_delivered(&mut self) {
        if !std::mem::take(&mut self.shared.pmi_pending) {
            return;
        }
        let (m, s) = self.ops_mut();
        m.pmi_delivered(s);
    }

    /// The counters marked for reprogramming since the last [`Pmu::take_reprogram`]: a guest
    /// write to a counter (always, even of the same value: the backend must resync), a change of
    /// what it counts or whether it counts, and a freeze. Nothing else marks a counter, and a
    /// write that raises #GP marks nothing.
    pub fn reprogram_pending(&self) -> Reprogram {
        self.shared.reprogram
    }

    /// Takes the counters marked for reprogramming (see [`Pmu::reprogram_pending`]) and clears
    /// the marks: a backend calls it before each VM entry and reprograms exactly those counters.
    pub fn take_reprogram(&mut self) -> Reprogram {
        std::mem::take(&mut self.shared.reprogram)
    }

    /// The value RDPMC returns in EDX:EAX for `ecx`, executed at `cpl` with CR4.PCE = `pce`.
    /// #GP when CPL > 0 and CR4.PCE is clear, or when ECX selects no counter of the profile
    /// (SDM Vol. 2B "RDPMC").
    pub fn rdpmc(&self, ecx: u32, cpl: u8, pce: bool) -> Result<u64, GpFault> {
        if cpl > 0 && !pce {
            return Err(GpFault);
        }
        self.ops().rdpmc(ecx)
    }

    /// A multi-line description of every readable register that exists under the profile,
    /// decoded, followed by the counters' derived state, the pending PMI and the counters marked
    /// for reprogramming.
    pub fn dump(&self) -> String {
        let mut out = String::new();
        self.ops().dump(&self.shared, &mut out);
        if let Ok(v) = self.prefetch.read() {
            let off = self.prefetch.prefetchers().present().minus(self.prefetchers_on());
            let _ = std::fmt::Write::write_fmt(
                &mut out,
                format_args!(
                    "{:<28} {MSR_MISC_FEATURE_CONTROL:#05x} = {v:#018x}  prefetchers off: {}\n",
                    "MSR_MISC_FEATURE_CONTROL",
                    if off.is_empty() { "none".to_string() } else { off.names().join(", ") }
                ),
            );
        }
        let _ = std::fmt::Write::write_fmt(
            &mut out,
            format_args!(
                "PMI pending: {}; marked for reprogramming: {:#x}\n",
                if self.shared.pmi_pending { "yes" } else { "no" },
                self.shared.reprogram.counters
            ),
        );
        out
    }

    // ---- The Debug Store and the LBR stack, where the model has them. ----

    /// Presents PEBS (`on`: the backend writes PEBS records) or not, through
    /// MISC_ENABLE.PEBS_UNAVAILABLE (bit 12, read-only to the guest). Before the guest runs.
    pub fn set_pebs(&mut self, on: bool) {
        let on = self.ops_mut().0.set_pebs(on);
        self.set_misc_unavailable(MISC_ENABLE_PEBS_UNAVAILABLE, !on);
    }

    /// Presents BTS (`on`: the backend writes branch records into the BTS buffer) or not,
    /// through MISC_ENABLE.BTS_UNAVAILABLE (bit 11, read-only to the guest). Before the guest runs.
    pub fn set_bts(&mut self, on: bool) {
        let on = self.ops_mut().0.set_bts(on);
        self.set_misc_unavailable(MISC_ENABLE_BTS_UNAVAILABLE, !on);
    }

    /// Sets (`unavailable`) or clears a read-only "unavailable" bit of IA32_MISC_ENABLE.
    fn set_misc_unavailable(&mut self, bit: u64, unavailable: bool) {
        let m = &mut self.shared.misc_enable;
        *m = if unavailable { *m | bit } else { *m & !bit };
    }

    /// Is PEBS presented to the guest (MISC_ENABLE.PEBS_UNAVAILABLE clear)?
    pub fn pebs_on(&self) -> bool {
        self.ops().pebs_on()
    }

    /// Is BTS presented?
    pub fn bts_on(&self) -> bool {
        self.ops().bts_on()
    }

    /// MSR_PEBS_DATA_CFG: the adaptive record's groups.
    pub fn pebs_data_cfg(&self) -> u64 {
        self.ops().pebs_data_cfg()
    }

    /// The counters whose PEBS records take MSR_PEBS_DATA_CFG's groups: those whose
    /// Adaptive_Record bit (PERFEVTSELx bit 34, FIXED_CTR_CTRL bit 32 + 4i) is set. The others'
    /// records hold the basic group only (SDM 18.9.2.2).
    pub fn pebs_adaptive(&self) -> u64 {
        self.ops().pebs_adaptive()
    }

    /// PEBS-enabled counters whose assist is due: they overflowed and have counted an event
    /// since. The backend writes the record and calls [`Pmu::pebs_assisted`].
    pub fn pebs_due(&self) -> u64 {
        self.ops().pebs_due()
    }

    /// The backend performed the PEBS assist for `counters` (of [`Pmu::pebs_due`], in the
    /// GLOBAL_STATUS layout; SDM 18.6.1.1 "PEBS Counter Reset"): each is reloaded with
    /// `reset(id)`, its reset value in the DS area. `threshold`: the record brought the PEBS
    /// index to the interrupt threshold, which sets GLOBAL_STATUS.OvfBuffer and raises a PMI.
    pub fn pebs_assisted(&mut self, counters: u64, reset: impl Fn(CounterId) -> u64, threshold: bool) {
        let (m, s) = self.ops_mut();
        m.pebs_assisted(s, counters, &reset, threshold);
    }

    /// Does a branch taken at CPL `cpl` go into the BTS buffer? DEBUGCTL.TR and BTS are set, and
    /// BTS_OFF_OS / BTS_OFF_USR do not skip that CPL (SDM 17.4.9).
    pub fn bts_records(&self, cpl: u8) -> bool {
        self.ops().bts_records(cpl)
    }

    /// DEBUGCTL.BTINT: the BTS buffer interrupts at its threshold instead of wrapping around.
    pub fn bts_interrupts(&self) -> bool {
        self.ops().bts_interrupts()
    }

    /// The BTS index reached the interrupt threshold with BTINT set: a DS interrupt, the PMI
    /// through LVTPC (SDM 17.4.9).
    pub fn bts_threshold_reached(&mut self) {
        self.shared.pmi_pending = true;
    }

    /// Is the LBR stack recording? DEBUGCTL.LBR is set and, on v4+, GLOBAL_STATUS.LBR_Frz is
    /// clear (SDM 17.4.7: v1-v3 freeze by clearing DEBUGCTL.LBR instead).
    pub fn lbr_recording(&self) -> bool {
        self.lbr_filter().is_some()
    }

    /// Which branches the LBR stack records now, if it records.
    pub fn lbr_filter(&self) -> Option<lbr::LbrFilter> {
        self.ops().lbr_filter()
    }

    /// Does MSR_LBR_SELECT ask for the call-stack mode, which emon does not model?
    pub fn lbr_call_stack(&self) -> bool {
        self.ops().lbr_call_stack()
    }

    /// The newest `n` entries of the LBR stack (at most its depth), newest first: (FROM_IP,
    /// TO_IP, LBR_INFO or 0). Adaptive PEBS's LBR group copies them.
    pub fn lbr_newest(&self, n: usize) -> Vec<(u64, u64, u64)> {
        self.ops().lbr_newest(n)
    }

    /// Records `b` in the LBR stack if it is recording and MSR_LBR_SELECT lets `b` through
    /// (SDM 17.4.8); returns whether it did.
    pub fn record_branch(&mut self, b: &lbr::Branch) -> bool {
        self.ops_mut().0.record_branch(b)
    }
}
