//! RDMSR/WRMSR exits of MSRs outside the PMU that reach userspace (KVM does not know them; the
//! PMU's own go to the virtual PMU): #GP, or `--ignore-msrs`.

/// Accesses to MSRs outside the PMU that reach userspace, for `--verbose` and `--json`.
#[derive(Debug, Default, Clone)]
pub struct MsrStats {
    /// Of them, the ones that got #GP.
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

/// Answers the accesses to MSRs outside the PMU that reach userspace (KVM does not know them):
/// #GP, or with `--ignore-msrs` reads of 0 and ignored writes.
pub struct MsrDispatch {
    pub ignore_unknown: bool,
    pub stats: MsrStats,
}

impl MsrDispatch {
    /// The value for a RDMSR, or `None` to inject #GP.
    pub fn read(&mut self, index: u32) -> Option<u64> {
        if self.stats.count_unknown(index) {
            tracing::debug!(
                "rdmsr {index:#x}: not emulated{} (logged once per MSR)",
                if self.ignore_unknown { ", reads 0" } else { ", #GP" }
            );
        }
        let r = self.ignore_unknown.then_some(0);
        self.stats.gp_injected += u64::from(r.is_none());
        r
    }

    /// Whether a WRMSR succeeds (`false` injects #GP).
    pub fn write(&mut self, index: u32, value: u64) -> bool {
        if self.stats.count_unknown(index) {
            tracing::debug!(
                "wrmsr {index:#x} = {value:#x}: not emulated{} (logged once per MSR)",
                if self.ignore_unknown { ", ignored" } else { ", #GP" }
            );
        }
        self.stats.gp_injected += u64::from(!self.ignore_unknown);
        self.ignore_unknown
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_msrs_raise_gp_unless_ignored() {
        let mut d = MsrDispatch { ignore_unknown: false, stats: MsrStats::default() };
        assert_eq!(d.read(0x12345), None);
        assert!(!d.write(0x12345, 1));
        assert_eq!((d.stats.gp_injected, d.stats.unknown[&0x12345]), (2, 2));
        let mut d = MsrDispatch { ignore_unknown: true, stats: MsrStats::default() };
        assert_eq!(d.read(0x12345), Some(0));
        assert!(d.write(0x12345, 1));
        assert_eq!(d.stats.gp_injected, 0);
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
