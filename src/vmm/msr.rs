//! RDMSR/WRMSR exits that reach userspace (the MSR filter is `backend::kvm::trap_pmu_msrs`):
//! each access goes to the virtual PMU, or gets #GP / `--ignore-msrs` for unknown MSRs.
use crate::pmu::Pmu;

/// Counts of MSR exits, for `--verbose`.
#[derive(Debug, Default, Clone)]
pub struct MsrStats {
    pub pmu_reads: u64,
    pub pmu_writes: u64,
    pub gp_injected: u64,
    /// Accesses per non-PMU MSR, for the first `MAX_TRACKED_MSRS` distinct ones (a guest can
    /// touch 2^32 indices; emon's memory stays bounded).
    pub unknown: std::collections::BTreeMap<u32, u64>,
    /// Accesses to non-PMU MSRs beyond those.
    pub unknown_untracked: u64,
    /// IA32_DEBUGCTL bits the guest set whose effect emon does not produce (LBR, BTF): the
    /// union over the run.
    pub debugctl_unmodelled: u64,
    /// NetBurst configurations emon stores but does not model (unpaired CCCRs, µop tagging,
    /// extended cascading, OVF_PMI_T1, PEBS), and MSR_DEBUGCTLA's branch-trace bits 6:2: the
    /// union over the run.
    pub netburst_unmodelled: crate::pmu::netburst::Unmodelled,
    pub netburst_branch_trace: bool,
}

/// MSR_DEBUGCTLA's TR, BTS, BTINT, BTS_OFF_OS and BTS_OFF_USR (bits 6:2, SDM 17.5.1): NetBurst
/// branch trace messages and BTS, which emon stores and does not produce.
const DEBUGCTLA_BRANCH_TRACE: u64 = 0x7C;

/// IA32_DEBUGCTL bits the model stores but a backend may not act on: only the precise backend
/// records branches in the LBR stack, and no backend emulates single-step on branches (BTF)
/// (README, "Model-specific PMU MSRs").
pub const DEBUGCTL_UNMODELLED: &[(u64, &str)] = &[
    (crate::pmu::msr::DEBUGCTL_LBR, "DEBUGCTL.LBR: this backend records no branches in the LBR stack"),
    (crate::pmu::msr::DEBUGCTL_BTF, "DEBUGCTL.BTF: single-step on branches is not emulated"),
];

/// Distinct non-PMU MSRs counted individually.
pub const MAX_TRACKED_MSRS: usize = 256;

impl MsrStats {
    /// What the run summary must say about the guest's MSR use: DEBUGCTL features it enabled
    /// that the run did not produce (`records_branches`: the backend's LBR recording), so that
    /// nothing the guest reads back is taken as recorded.
    pub fn notes(&self, records_branches: bool) -> Vec<String> {
        let produced = if records_branches { crate::pmu::msr::DEBUGCTL_LBR } else { 0 };
        let unmodelled: Vec<&str> = DEBUGCTL_UNMODELLED
            .iter()
            .filter(|&&(bit, _)| self.debugctl_unmodelled & bit & !produced != 0)
            .map(|&(_, what)| what)
            .collect();
        let mut notes = Vec::new();
        if !unmodelled.is_empty() {
            notes.push(format!(
                "NOT EXACT: the guest set {} (README, \"Model-specific PMU MSRs\")",
                unmodelled.join("; ")
            ));
        }
        let mut netburst = self.netburst_unmodelled.describe();
        if self.netburst_branch_trace {
            netburst.push("MSR_DEBUGCTLA.TR/BTS (NetBurst branch trace messages and BTS: none were stored)");
        }
        if !netburst.is_empty() {
            notes.push(format!(
                "NOT EXACT: NetBurst: the guest set {}, which emon does not model (README, \"The NetBurst PMU\")",
                netburst.join("; ")
            ));
        }
        notes
    }

    /// Counts one access; true the first time an MSR is seen (while tracking), for logging.
    fn count_unknown(&mut self, index: u32) -> bool {
        if let Some(n) = self.unknown.get_mut(&index) {
            *n += 1;
            false
        } else if self.unknown.len() < MAX_TRACKED_MSRS {
            self.unknown.insert(index, 1);
            true
        } else {
            self.unknown_untracked += 1;
            false
        }
    }
}

/// Answers the MSR accesses that reach userspace.
pub struct MsrDispatch {
    pub ignore_unknown: bool,
    pub stats: MsrStats,
}

impl MsrDispatch {
    /// The value for a RDMSR, or `None` to inject #GP.
    pub fn read(&mut self, pmu: &mut Pmu, index: u32) -> Option<u64> {
        let r = if Pmu::owns(index) {
            self.stats.pmu_reads += 1;
            pmu.rdmsr(index).ok()
        } else {
            if self.stats.count_unknown(index) {
                tracing::debug!(
                    "rdmsr {index:#x}: not emulated{} (logged once per MSR)",
                    if self.ignore_unknown { ", reads 0" } else { ", #GP" }
                );
            }
            self.ignore_unknown.then_some(0)
        };
        if r.is_none() {
            self.stats.gp_injected += 1;
        }
        r
    }

    /// Whether a WRMSR succeeds (`false` injects #GP).
    pub fn write(&mut self, pmu: &mut Pmu, index: u32, value: u64) -> bool {
        let ok = if Pmu::owns(index) {
            self.stats.pmu_writes += 1;
            let ok = pmu.wrmsr(index, value).is_ok();
            if ok && index == crate::pmu::msr::IA32_DEBUGCTL {
                self.stats.debugctl_unmodelled |= DEBUGCTL_UNMODELLED.iter().fold(0, |m, &(bit, _)| m | bit) & value;
                self.stats.netburst_branch_trace |= pmu.netburst().is_some() && value & DEBUGCTLA_BRANCH_TRACE != 0;
            }
            if let Some(nb) = pmu.netburst().filter(|_| ok) {
                self.stats.netburst_unmodelled = self.stats.netburst_unmodelled.union(nb.unmodelled());
            }
            ok
        } else {
            if self.stats.count_unknown(index) {
                tracing::debug!(
                    "wrmsr {index:#x} = {value:#x}: not emulated{} (logged once per MSR)",
                    if self.ignore_unknown { ", ignored" } else { ", #GP" }
                );
            }
            self.ignore_unknown
        };
        if !ok {
            self.stats.gp_injected += 1;
        }
        ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debugctl_features_emon_does_not_produce_are_reported() {
        let mut pmu = Pmu::new(&crate::profile::Profile::load("skylake").unwrap().pmu);
        let mut d = MsrDispatch { ignore_unknown: false, stats: MsrStats::default() };
        assert!(d.write(&mut pmu, 0x1D9, 1 << 12), "FREEZE_PERFMON_ON_PMI is modelled");
        assert!(d.stats.notes(false).is_empty());
        assert!(!d.write(&mut pmu, 0x1D9, 1 | 1 << 5), "a reserved bit #GPs and records nothing");
        assert!(d.stats.notes(false).is_empty());
        assert!(d.write(&mut pmu, 0x1D9, 1));
        assert!(d.write(&mut pmu, 0x1D9, 0));
        let notes = d.stats.notes(false);
        assert_eq!(notes.len(), 1);
        assert!(
            notes[0].starts_with("NOT EXACT: the guest set DEBUGCTL.LBR: this backend records no branches"),
            "{notes:?}"
        );
        assert!(d.stats.notes(true).is_empty(), "a backend that records branches leaves nothing to say");
        assert!(d.write(&mut pmu, 0x1D9, 2));
        assert!(d.stats.notes(false)[0].contains("; DEBUGCTL.BTF"), "{:?}", d.stats.notes(false));
        let with_lbr = d.stats.notes(true);
        assert!(with_lbr[0].starts_with("NOT EXACT: the guest set DEBUGCTL.BTF"), "{with_lbr:?}");
    }

    #[test]
    fn netburst_configurations_emon_does_not_model_are_reported() {
        let p = crate::profile::Profile::load("pentium4").expect("built-in");
        let mut pmu = Pmu::new(&p.pmu);
        let mut d = MsrDispatch { ignore_unknown: false, stats: MsrStats::default() };
        // instr_retired on IQ_COUNTER0 through CRU_ESCR0: modelled, nothing to say.
        assert!(d.write(&mut pmu, 0x3B8, 2 << 25 | 1 << 9 | 0xC));
        assert!(d.write(&mut pmu, 0x36C, 1 << 12 | 4 << 13 | 3 << 16));
        assert!(d.stats.notes(true).is_empty(), "{:?}", d.stats.notes(true));
        // OVF_PMI_T1 on an enabled CCCR, Tag Enable (FSB_ESCR0 keeps it; CRU_ESCR0 ignores it),
        // and MSR_DEBUGCTLA.BTS.
        assert!(d.write(&mut pmu, 0x36C, 1 << 12 | 4 << 13 | 3 << 16 | 1 << 27));
        assert!(d.write(&mut pmu, 0x3A2, 0x13 << 25 | 1 << 9 | 0xC | 1 << 4));
        assert!(d.write(&mut pmu, 0x1D9, 1 << 3));
        let notes = d.stats.notes(true);
        assert_eq!(notes.len(), 1, "{notes:?}");
        for what in ["OVF_PMI_T1", "Tag Enable", "MSR_DEBUGCTLA.TR/BTS", "The NetBurst PMU"] {
            assert!(notes[0].contains(what), "{notes:?} lacks {what}");
        }
        // A write that #GPs (ESCR bit 31) changes nothing.
        assert!(!d.write(&mut pmu, 0x3B9, 1 << 31));
    }

    #[test]
    fn unknown_msr_statistics_stay_bounded() {
        let mut s = MsrStats::default();
        for i in 0..100_000u32 {
            s.count_unknown(i);
        }
        s.count_unknown(0);
        assert_eq!(s.unknown.len(), MAX_TRACKED_MSRS);
        assert_eq!(s.unknown[&0], 2);
        assert_eq!(s.unknown_untracked, 100_000 - MAX_TRACKED_MSRS as u64);
    }
}
