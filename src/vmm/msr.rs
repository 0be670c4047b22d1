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
}

/// Distinct non-PMU MSRs counted individually.
pub const MAX_TRACKED_MSRS: usize = 256;

impl MsrStats {
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
            pmu.wrmsr(index, value).is_ok()
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
