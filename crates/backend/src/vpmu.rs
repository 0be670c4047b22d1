//! The virtual PMU as a VMM drives it: one facade over the PMU model, the counting backend and
//! the PMI, the counterpart of KVM's `arch/x86/kvm/pmu.c`. A VMM calls it once per kind of exit,
//! and the order of the protocol is written here only:
//!
//! 1. [`VirtualPmu::rdmsr`] / [`VirtualPmu::wrmsr`] at an MSR exit: the backend first folds what
//!    it counted so far into the model ([`Backend::sync`]); the model answers or raises #GP, and
//!    a write marks only the counters it changed (`None`: not the PMU's MSR). [`Accounting`]
//!    answers, for these and for the backend that completes a RDMSR or WRMSR itself.
//! 2. [`VirtualPmu::before_entry`] before every KVM_RUN: a pending PMI goes out through the
//!    local APIC as LVTPC says ([`crate::pmi`]) and the freeze-on-PMI controls apply; then the
//!    backend reprograms the marked counters and arms for the entry, or completes the
//!    instruction at RIP itself ([`Entry::Retired`]).
//! 3. [`VirtualPmu::debug_exit`] at the backend's single-step exit.
//! 4. [`VirtualPmu::report`] when the run ends: the backend's account, and what the run summary
//!    must say about the counts.
use crate::pmi::{plan, PmiDelivery};
use crate::{Backend, BackendError, Cx, Next, PmuMsrs, Ports, Vcpu};
use emon_pmu::pmu::{GpFault, Pmu, Unmodelled};

/// What the VMM does after [`VirtualPmu::before_entry`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    /// Enter the guest.
    Run,
    /// The backend completed the instruction at RIP itself: the vCPU is at the next
    /// instruction boundary; call `before_entry` again (after checking for a stop request).
    Retired,
}

/// One guest access to a PMU MSR, as the model answered it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MsrAccess {
    pub write: bool,
    pub index: u32,
    /// The value read or written.
    pub value: u64,
    /// It raised #GP.
    pub gp: bool,
}

/// What a VMM may want to see as it happens (`--trace`): every PMU MSR access and every PMI,
/// with the model's state right after the access and right before the PMI's freeze controls.
pub trait Observer {
    fn msr(&mut self, _pmu: &Pmu, _access: MsrAccess) {}
    fn pmi(&mut self, _pmu: &Pmu, _delivery: PmiDelivery) {}
}

impl Observer for () {}

impl<O: Observer> Observer for Option<O> {
    fn msr(&mut self, pmu: &Pmu, access: MsrAccess) {
        if let Some(o) = self {
            o.msr(pmu, access);
        }
    }
    fn pmi(&mut self, pmu: &Pmu, delivery: PmiDelivery) {
        if let Some(o) = self {
            o.pmi(pmu, delivery);
        }
    }
}

/// PMIs delivered, by how.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PmiStats {
    pub fixed: u64,
    pub nmi: u64,
    pub masked: u64,
    pub dropped: u64,
}

/// PMU MSR accesses.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct MsrStats {
    pub reads: u64,
    pub writes: u64,
    /// Accesses that raised #GP.
    pub gp: u64,
}

/// What the run's report says about the PMU (see [`VirtualPmu::report`]).
#[derive(Debug, Clone)]
pub struct PmuReport {
    pub backend: &'static str,
    /// The backend's account (`--verbose`).
    pub summary: String,
    /// What the run summary must say about the counts: the backend's, and the model's
    /// configurations the guest set that emon does not produce.
    pub backend_notes: Vec<String>,
    pub model_notes: Vec<String>,
    pub pmis: PmiStats,
    pub msrs: MsrStats,
    /// Counters reprogrammed after guest writes.
    pub reprogrammed: u64,
}

/// See the module documentation.
pub struct VirtualPmu<O: Observer = ()> {
    pmu: Pmu,
    backend: Box<dyn Backend>,
    msrs: Accounting<O>,
    pmis: PmiStats,
}

/// The guest's accesses to the PMU's MSRs, answered by the model: each is counted and shown to
/// the observer, and what a write set that emon stores without producing is kept for the report.
#[derive(Default)]
pub struct Accounting<O: Observer = ()> {
    pub observer: O,
    pub stats: MsrStats,
    /// What the guest set, over the run, that emon stores without producing.
    pub unmodelled: Unmodelled,
}

impl<O: Observer> PmuMsrs for Accounting<O> {
    fn read(&mut self, pmu: &mut Pmu, index: u32) -> Result<u64, GpFault> {
        let r = pmu.rdmsr(index);
        self.stats.reads += 1;
        self.stats.gp += u64::from(r.is_err());
        let access = MsrAccess { write: false, index, value: *r.as_ref().unwrap_or(&0), gp: r.is_err() };
        self.observer.msr(pmu, access);
        r
    }

    fn write(&mut self, pmu: &mut Pmu, index: u32, value: u64) -> Result<(), GpFault> {
        let r = pmu.wrmsr(index, value);
        self.stats.writes += 1;
        self.stats.gp += u64::from(r.is_err());
        if r.is_ok() {
            self.unmodelled = self.unmodelled.union(pmu.unmodelled());
        }
        self.observer.msr(pmu, MsrAccess { write: true, index, value, gp: r.is_err() });
        r
    }
}

impl VirtualPmu<()> {
    /// The PMU `pmu`, counted by `backend`.
    pub fn new(pmu: Pmu, backend: Box<dyn Backend>) -> VirtualPmu<()> {
        VirtualPmu::observed(pmu, backend, ())
    }
}

impl<O: Observer> VirtualPmu<O> {
    /// The PMU `pmu`, counted by `backend`, with `observer` watching.
    pub fn observed(pmu: Pmu, backend: Box<dyn Backend>, observer: O) -> VirtualPmu<O> {
        VirtualPmu {
            pmu,
            backend,
            msrs: Accounting { observer, stats: MsrStats::default(), unmodelled: Unmodelled::NONE },
            pmis: PmiStats::default(),
        }
    }

    /// The model, to read.
    pub fn pmu(&self) -> &Pmu {
        &self.pmu
    }

    /// Lets `f` look at the model with the observer (a VMM samples the counters for its trace).
    pub fn observe(&mut self, f: impl FnOnce(&mut O, &Pmu)) {
        f(&mut self.msrs.observer, &self.pmu);
    }

    /// The observer, once the run is over.
    pub fn observer(&self) -> &O {
        &self.msrs.observer
    }

    /// The backend, to read.
    pub fn backend(&self) -> &dyn Backend {
        &*self.backend
    }

    /// A guest RDMSR: `None` if `index` is not the PMU's; else its value, or #GP.
    pub fn rdmsr(&mut self, index: u32) -> Option<Result<u64, GpFault>> {
        if !Pmu::owns(index) {
            return None;
        }
        self.backend.sync(&mut self.pmu);
        Some(self.msrs.read(&mut self.pmu, index))
    }

    /// A guest WRMSR: `None` if `index` is not the PMU's; else whether it took, or #GP (no
    /// change). The counters it changed are reprogrammed before the next entry.
    pub fn wrmsr(&mut self, index: u32, value: u64) -> Option<Result<(), GpFault>> {
        if !Pmu::owns(index) {
            return None;
        }
        self.backend.sync(&mut self.pmu);
        Some(self.msrs.write(&mut self.pmu, index, value))
    }

    /// RDPMC completed outside the backend (at the guest's #GP handler): the counter's value, or
    /// #GP as the instruction would raise it.
    pub fn rdpmc(&mut self, ecx: u32, cpl: u8, pce: bool) -> Result<u64, GpFault> {
        self.backend.sync(&mut self.pmu);
        self.pmu.rdpmc(ecx, cpl, pce)
    }

    /// Before every entry to the guest (see the module documentation). `at_boundary`: the vCPU is
    /// between two instructions (the previous exit completed one), as opposed to in the middle of
    /// one (an MSR or I/O exit). `ports`: the VMM's devices, for an IN or OUT the backend
    /// completes itself ([`crate::NoPorts`] for none).
    pub fn before_entry(
        &mut self,
        vcpu: &mut dyn Vcpu,
        ports: &mut dyn Ports,
        at_boundary: bool,
    ) -> Result<Entry, BackendError> {
        loop {
            if self.pmu.pmi_pending() {
                self.deliver_pmi(vcpu)?;
            }
            let mut cx = Cx { vcpu, pmu: &mut self.pmu, msrs: &mut self.msrs, ports: &mut *ports };
            match self.backend.before_run(&mut cx, at_boundary)? {
                Next::Run => return Ok(Entry::Run),
                Next::Retired => return Ok(Entry::Retired),
                // A PMI became pending while the backend brought the model up to date.
                Next::Again => continue,
            }
        }
    }

    /// The backend's single step (or an instruction the VMM completed itself): one instruction
    /// retired and the vCPU is at `pc`.
    pub fn debug_exit(&mut self, vcpu: &mut dyn Vcpu, pc: u64) -> Result<(), BackendError> {
        let cx = &mut Cx { vcpu, pmu: &mut self.pmu, msrs: &mut self.msrs, ports: &mut crate::NoPorts };
        self.backend.on_debug_exit(cx, pc)
    }

    /// The VMM injected an event itself (the #BP of an INT3 it completed, a #DB it gives back):
    /// the next entry must be KVM's, which delivers it, not a stretch of code run elsewhere.
    pub fn event_injected(&mut self) {
        self.backend.event_queued();
    }

    /// Delivers the pending PMI as LVTPC says (a fixed vector into the IRR, or an NMI), then
    /// applies the freeze-on-PMI controls.
    fn deliver_pmi(&mut self, vcpu: &mut dyn Vcpu) -> Result<(), BackendError> {
        let read = vcpu.lapic()?;
        let mut page = read;
        let delivery = plan(&mut page);
        if delivery != PmiDelivery::Masked {
            vcpu.set_lapic(&page, &read)?;
        }
        if delivery == PmiDelivery::Nmi {
            vcpu.nmi()?;
        }
        self.msrs.observer.pmi(&self.pmu, delivery);
        match delivery {
            PmiDelivery::Fixed(_) => self.pmis.fixed += 1,
            PmiDelivery::Nmi => self.pmis.nmi += 1,
            PmiDelivery::Masked => self.pmis.masked += 1,
            PmiDelivery::Dropped { mode, vector } => {
                self.pmis.dropped += 1;
                tracing::debug!("PMI dropped: LVTPC delivery mode {mode:#b}, vector {vector}");
            }
        }
        if matches!(delivery, PmiDelivery::Fixed(_) | PmiDelivery::Nmi) {
            // KVM delivers it at the next entry: the backend enters KVM first.
            self.backend.event_queued();
        }
        self.pmu.pmi_delivered();
        Ok(())
    }

    /// The configurations the backend produces of those the model stores without producing:
    /// the LBR stack where it records branches, the prefetchers' control where it counts from
    /// the cache model.
    fn produced(&self) -> Unmodelled {
        let of = |on: bool, u: Unmodelled| if on { u } else { Unmodelled::NONE };
        of(self.backend.records_branches(), Unmodelled::DEBUGCTL_LBR)
            .union(of(self.backend.models_caches(), Unmodelled::PREFETCHERS_OFF))
    }

    /// The run's account of the PMU.
    pub fn report(&self) -> PmuReport {
        PmuReport {
            backend: self.backend.name(),
            summary: self.backend.summary(),
            backend_notes: self.backend.notes(),
            model_notes: self.msrs.unmodelled.notes(self.produced()),
            pmis: self.pmis,
            msrs: self.msrs.stats,
            reprogrammed: self.backend.reprogrammed(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lapic::{reg, set_reg, IRR, LVT_MASKED, LVT_PMC, SVR};
    use crate::testing::Script;
    use emon_pmu::pmu::{msr, CounterId};
    use emon_pmu::profile::Profile;
    use vm_memory::{GuestAddress, GuestMemoryMmap};

    /// A backend that records what the facade asks of it; its first `before_run` counts one
    /// event on IA32_PMC0 (as a backend bringing the model up to date would).
    #[derive(Default)]
    struct Recorder {
        syncs: u32,
        runs: u32,
        queued: u32,
        records_branches: bool,
        models_caches: bool,
    }

    impl Backend for Recorder {
        fn name(&self) -> &'static str {
            "recorder"
        }
        fn before_run(&mut self, cx: &mut Cx, _at_boundary: bool) -> Result<Next, BackendError> {
            self.runs += 1;
            if self.runs == 1 {
                cx.pmu.add_events(CounterId::Gp(0), 1);
                if cx.pmu.pmi_pending() {
                    return Ok(Next::Again);
                }
            }
            Ok(Next::Run)
        }
        fn on_debug_exit(&mut self, _cx: &mut Cx, _pc: u64) -> Result<(), BackendError> {
            Ok(())
        }
        fn event_queued(&mut self) {
            self.queued += 1;
        }
        fn sync(&mut self, _pmu: &mut Pmu) {
            self.syncs += 1;
        }
        fn reprogrammed(&self) -> u64 {
            0
        }
        fn summary(&self) -> String {
            format!("syncs {} runs {} queued {}", self.syncs, self.runs, self.queued)
        }
        fn records_branches(&self) -> bool {
            self.records_branches
        }
        fn models_caches(&self) -> bool {
            self.models_caches
        }
    }

    fn vcpu(lvtpc: u32) -> Script {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        let mut v = Script::new(mem);
        set_reg(&mut v.lapic, SVR, 0x1FF);
        set_reg(&mut v.lapic, LVT_PMC, lvtpc);
        v
    }

    /// Skylake with IA32_PMC0 one event from its overflow, counting with INT, and
    /// FREEZE_PERFMON_ON_PMI set.
    fn armed(records_branches: bool) -> VirtualPmu {
        let pmu = Pmu::new(&Profile::load("skylake").unwrap().pmu);
        let mut v = VirtualPmu::new(pmu, Box::new(Recorder { records_branches, ..Recorder::default() }));
        for (m, value) in [
            (msr::IA32_PMC0, 0xFFFF_FFFF),
            (msr::IA32_PERFEVTSEL0, 0x53_00C0),
            (msr::IA32_DEBUGCTL, msr::DEBUGCTL_FREEZE_PERFMON_ON_PMI),
        ] {
            assert_eq!(v.wrmsr(m, value), Some(Ok(())));
        }
        v
    }

    #[test]
    fn msrs_outside_the_pmu_are_not_its_and_the_backend_syncs_before_each_access() {
        let mut v = armed(false);
        assert_eq!(v.rdmsr(0x10), None, "IA32_TSC is not the PMU's");
        assert_eq!(v.wrmsr(0x10, 0), None);
        assert_eq!(v.rdmsr(msr::IA32_PMC0), Some(Ok(0xFFFF_FFFF_FFFF)));
        assert_eq!(v.wrmsr(msr::IA32_PERFEVTSEL0, 1 << 40), Some(Err(GpFault)));
        let r = v.report();
        assert_eq!((r.msrs.reads, r.msrs.writes, r.msrs.gp), (1, 4, 1));
        assert_eq!(r.summary, "syncs 5 runs 0 queued 0", "one sync per PMU access, none for others");
    }

    #[test]
    fn a_pmi_goes_out_through_lvtpc_then_freezes_and_kvm_runs_first() {
        let mut v = armed(false);
        let mut cpu = vcpu(0x33);
        assert_eq!(v.before_entry(&mut cpu, &mut crate::NoPorts, true).unwrap(), Entry::Run);
        assert_ne!(reg(&cpu.lapic, IRR + 0x10) & 1 << (0x33 - 32), 0, "the vector is requested");
        assert_eq!(reg(&cpu.lapic, LVT_PMC), 0x33 | LVT_MASKED, "LVTPC masks itself");
        assert!(v.pmu().frozen(), "FREEZE_PERFMON_ON_PMI (v4: CTR_Frz)");
        let r = v.report();
        assert_eq!((r.pmis.fixed, r.pmis.nmi), (1, 0));
        assert_eq!(r.summary, "syncs 3 runs 2 queued 1", "the backend was told to enter KVM first");
    }

    #[test]
    fn an_nmi_pmi_and_a_masked_one() {
        let mut v = armed(false);
        let mut cpu = vcpu(0x400);
        v.before_entry(&mut cpu, &mut crate::NoPorts, true).unwrap();
        assert_eq!(cpu.nmis, 1);
        let mut v = armed(false);
        let mut cpu = vcpu(0x33 | LVT_MASKED);
        v.before_entry(&mut cpu, &mut crate::NoPorts, true).unwrap();
        assert_eq!(reg(&cpu.lapic, IRR + 0x10), 0, "nothing requested");
        assert_eq!((v.report().pmis.masked, cpu.nmis), (1, 0));
        assert_eq!(v.report().summary, "syncs 3 runs 2 queued 0");
    }

    #[test]
    fn debugctl_features_the_backend_does_not_produce_are_noted() {
        let mut v = armed(false);
        assert_eq!(v.wrmsr(msr::IA32_DEBUGCTL, msr::DEBUGCTL_LBR), Some(Ok(())));
        assert_eq!(v.wrmsr(msr::IA32_DEBUGCTL, 0), Some(Ok(())));
        let notes = v.report().model_notes;
        assert_eq!(notes.len(), 1);
        assert!(
            notes[0].starts_with("NOT EXACT: the guest set DEBUGCTL.LBR: this backend records no branches"),
            "set once over the run: {notes:?}"
        );
        let mut v = armed(true);
        v.wrmsr(msr::IA32_DEBUGCTL, msr::DEBUGCTL_LBR);
        assert!(v.report().model_notes.is_empty(), "a backend that records branches leaves nothing to say");
        assert_eq!(v.wrmsr(msr::IA32_DEBUGCTL, 1 << 5), Some(Err(GpFault)), "a reserved bit #GPs");
    }

    #[test]
    fn prefetchers_turned_off_are_noted_unless_the_backend_counts_from_the_cache_model() {
        let profile = Profile::load("skylake").unwrap();
        for models_caches in [false, true] {
            let pmu = Pmu::new(&profile.pmu).with_prefetchers(profile.cache.prefetchers);
            let mut v = VirtualPmu::new(pmu, Box::new(Recorder { models_caches, ..Recorder::default() }));
            assert_eq!(v.wrmsr(msr::MSR_MISC_FEATURE_CONTROL, 0), Some(Ok(())), "the PMU's own");
            assert!(v.report().model_notes.is_empty(), "every prefetcher on");
            assert_eq!(v.wrmsr(msr::MSR_MISC_FEATURE_CONTROL, 0xF), Some(Ok(())));
            assert_eq!(v.wrmsr(msr::MSR_MISC_FEATURE_CONTROL, 0), Some(Ok(())));
            let notes = v.report().model_notes;
            if models_caches {
                assert!(notes.is_empty(), "{notes:?}");
            } else {
                assert!(notes.len() == 1 && notes[0].contains("turned hardware prefetchers off"), "{notes:?}");
            }
        }
    }
}
