//! The command line of `emon test`: [`TestArgs`] and `--shard` ([`Shard`]).
use super::RunnerError;
use crate::backend::BackendKind;
use std::path::PathBuf;

/// The per-run timeout without `--timeout`, in seconds.
pub const DEFAULT_TIMEOUT_S: f64 = 120.0;

/// `emon test`.
#[derive(clap::Args, Debug, Default)]
pub struct TestArgs {
    /// Kernels: guest:NAME, paths, and globs of both (guest:*, guest:pmi-*, 'kernels/*.elf');
    /// repeat or separate with commas.
    #[arg(value_name = "KERNEL", value_delimiter = ',')]
    pub kernels: Vec<String>,
    /// Profiles: built-in names, paths, and globs of both ('nehalem*'); repeat or separate with
    /// commas [default: skylake].
    #[arg(long, value_name = "NAME|PATH|GLOB", value_delimiter = ',')]
    pub profile: Vec<String>,
    /// Run the matrix of a suite file (TOML; see resources/suites/default.toml) instead. With no
    /// KERNEL and no --suite, emon test runs the built-in default suite.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["kernels", "profile"])]
    pub suite: Option<PathBuf>,
    /// Profile overrides for every run, applied after a suite entry's own `pmu`.
    #[arg(long, value_name = "K=V,...")]
    pub pmu: Vec<String>,
    /// The backend of every run that does not set its own in the suite [default: auto].
    #[arg(long, value_enum)]
    pub backend: Option<BackendKind>,
    /// VMs run in parallel [default: the number of CPUs].
    #[arg(long, short, value_name = "N")]
    pub jobs: Option<usize>,
    /// Per-run timeout in seconds, unless a suite entry sets its own.
    #[arg(long, value_name = "S", default_value_t = DEFAULT_TIMEOUT_S)]
    pub timeout: f64,
    /// Run the whole matrix N times, in N rounds (to shake out flaky tests: use more --jobs than
    /// CPUs so that the runs preempt each other).
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub repeat: usize,
    /// Run only shard I of N (1-based): the runs whose index in the matrix is I-1 modulo N.
    #[arg(long, value_name = "I/N")]
    pub shard: Option<String>,
    /// Write JUnit XML: one <testsuite> per run, one <testcase> per PASS/FAIL/SKIP line.
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,
    /// Write every run and its test cases as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// The kernel command line of every run that does not set `args` in the suite.
    #[arg(last = true, value_name = "CMDLINE")]
    pub cmdline: Vec<String>,
}

/// `--shard I/N`: run I (1-based) of N.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    pub index: usize,
    pub count: usize,
}

impl Shard {
    pub fn parse(s: &str) -> Result<Shard, RunnerError> {
        let bad = |why: &str| RunnerError::Shard { spec: s.to_string(), rule: why.to_string() };
        let (i, n) = s.split_once('/').ok_or_else(|| bad("expected I/N, e.g. 1/2"))?;
        let num = |x: &str| x.trim().parse::<usize>().map_err(|_| bad("expected I/N with whole numbers, e.g. 1/2"));
        let (index, count) = (num(i)?, num(n)?);
        if count == 0 {
            return Err(bad("N must be at least 1"));
        }
        if index == 0 || index > count {
            return Err(bad(&format!("I must be from 1 to {count} (I is 1-based)")));
        }
        Ok(Shard { index, count })
    }

    /// Whether the run at `matrix_index` (0-based, in expanded matrix order) is in this shard.
    pub fn contains(&self, matrix_index: usize) -> bool {
        matrix_index % self.count == self.index - 1
    }
}

impl std::fmt::Display for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards() {
        assert_eq!(Shard::parse("1/2").unwrap(), Shard { index: 1, count: 2 });
        assert_eq!(Shard::parse("3/3").unwrap(), Shard { index: 3, count: 3 });
        for bad in ["3/2", "0/2", "1/0", "0/0", "1", "a/2", "1/b", "-1/2", "", "1/2/3"] {
            let e = Shard::parse(bad).unwrap_err().to_string();
            assert!(e.starts_with(&format!("--shard {bad}: ")), "{e}");
        }
        // Every index is in exactly one shard, and shards are balanced round-robin.
        for n in 1..6 {
            let shards: Vec<Shard> = (1..=n).map(|i| Shard { index: i, count: n }).collect();
            for idx in 0..50 {
                assert_eq!(shards.iter().filter(|s| s.contains(idx)).count(), 1);
            }
        }
        let s = Shard { index: 2, count: 3 };
        assert_eq!((0..9).filter(|&i| s.contains(i)).collect::<Vec<_>>(), [1, 4, 7]);
    }
}
