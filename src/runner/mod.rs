//! `emon test`: runs a matrix of kernels x profiles, each run an `emon run` child process, in a
//! bounded pool of worker threads; parses the guests' kvm-unit-tests lines; reports a table on
//! stdout, JUnit XML and JSON.
//!
//! - `args.rs`: the command line, [`TestArgs`] and `--shard` ([`Shard`]).
//! - [`suite`]: the TOML suite file format.
//! - `matrix.rs`: the runs, from the command line ([`expand_cli`]) or a suite ([`expand_suite`]),
//!   globs expanded, duplicates dropped, `--repeat` rounds.
//! - `pool.rs`: the worker threads, each run an `emon run` child ([`run_one`]).
//! - `progress.rs`: the progress line while the runs go.
//! - [`parse`]: the kvm-unit-tests output convention and the verdict on one run.
//! - [`report`]: the table, JUnit XML and JSON.
//! - `error.rs`: [`RunnerError`], every way `emon test` fails on its input or its report files.
mod args;
mod error;
mod matrix;
pub mod parse;
mod pool;
mod progress;
pub mod report;
pub mod suite;

pub use args::{Shard, TestArgs, DEFAULT_TIMEOUT_S};
pub use error::RunnerError;
pub use matrix::{
    default_suite, expand_cli, expand_kernel, expand_profile, expand_suite, is_pattern, match_names, repeat,
    DEFAULT_SUITE, DEFAULT_SUITE_ORIGIN,
};
pub use pool::run_one;

use crate::backend::BackendKind;
use parse::{Exit, Parsed, Status, Verdict};
use pool::execute;
use progress::Progress;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// Exit status of `emon test` when a run failed.
pub const STATUS_FAILED: u8 = 1;

/// One cell of the matrix: what `emon run` is asked to do.
#[derive(Debug, Clone, PartialEq)]
pub struct RunSpec {
    /// Position in the expanded matrix (before sharding), 0-based.
    pub index: usize,
    /// `guest:NAME` or a path.
    pub kernel: String,
    /// A built-in profile name or a path.
    pub profile: String,
    pub pmu: Vec<String>,
    pub backend: Option<BackendKind>,
    /// `--debug-store`, where the suite sets it.
    pub debug_store: Option<crate::vmm::DebugStoreMode>,
    /// `--guest-time`, where the suite sets it.
    pub guest_time: Option<crate::backend::precise::GuestTime>,
    pub args: Vec<String>,
    pub timeout: f64,
    /// `--memory` in MiB, where the suite sets it.
    pub memory: Option<u64>,
    /// `--initrd` (a path), where the suite sets it.
    pub initrd: Option<String>,
    /// Lines the console must and must not show, where the suite sets them.
    pub console: parse::Console,
    /// With `--repeat N`: this run's round (1-based) and N.
    pub round: Option<(usize, usize)>,
}

/// An `emon run` option's value as its command line spells it, where one is set.
fn option_name<T: clap::ValueEnum>(value: Option<T>) -> Option<String> {
    value?.to_possible_value().map(|v| v.get_name().to_string())
}

impl RunSpec {
    fn backend_name(&self) -> Option<String> {
        option_name(self.backend)
    }

    fn debug_store_name(&self) -> Option<String> {
        option_name(self.debug_store)
    }

    fn guest_time_name(&self) -> Option<String> {
        option_name(self.guest_time)
    }

    /// The kernel, with its command line if it has one.
    pub fn kernel_label(&self) -> String {
        if self.args.is_empty() {
            self.kernel.clone()
        } else {
            format!("{} -- {}", self.kernel, self.args.join(" "))
        }
    }

    /// The profile, with the overrides and backend it runs with (and its round, with `--repeat`).
    pub fn profile_label(&self) -> String {
        let mut s = self.profile.clone();
        for p in &self.pmu {
            s += &format!(" --pmu {p}");
        }
        if let Some(b) = self.backend_name() {
            s += &format!(" --backend {b}");
        }
        if let Some(p) = self.debug_store_name() {
            s += &format!(" --debug-store {p}");
        }
        if let Some(t) = self.guest_time_name() {
            s += &format!(" --guest-time {t}");
        }
        if let Some((round, of)) = self.round {
            s += &format!(" (round {round}/{of})");
        }
        s
    }

    /// `KERNEL on PROFILE`, unique within a matrix.
    pub fn name(&self) -> String {
        format!("{} on {}", self.kernel_label(), self.profile_label())
    }

    /// The arguments of the `emon run` child.
    pub fn command_args(&self) -> Vec<String> {
        let mut a: Vec<String> = vec!["run".into(), "--profile".into(), self.profile.clone()];
        for p in &self.pmu {
            a.extend(["--pmu".into(), p.clone()]);
        }
        if let Some(b) = self.backend_name() {
            a.extend(["--backend".into(), b]);
        }
        if let Some(p) = self.debug_store_name() {
            a.extend(["--debug-store".into(), p]);
        }
        if let Some(t) = self.guest_time_name() {
            a.extend(["--guest-time".into(), t]);
        }
        if let Some(m) = self.memory {
            a.extend(["--memory".into(), m.to_string()]);
        }
        if let Some(i) = &self.initrd {
            a.extend(["--initrd".into(), i.clone()]);
        }
        a.extend(["--timeout".into(), self.timeout.to_string(), self.kernel.clone()]);
        if !self.args.is_empty() {
            a.push("--".into());
            a.extend(self.args.iter().cloned());
        }
        a
    }
}

/// One finished run.
#[derive(Debug, Clone)]
pub struct RunResult {
    pub spec: RunSpec,
    pub exit: Exit,
    pub duration: Duration,
    pub stdout: String,
    pub stderr: String,
    pub parsed: Parsed,
    pub verdict: Verdict,
}

impl RunResult {
    pub fn failed(&self) -> bool {
        self.verdict.status == Status::Fail
    }

    /// The last `n` non-empty lines of emon's stderr (its one-line run summary is the last).
    pub fn stderr_tail(&self, n: usize) -> Vec<&str> {
        let lines: Vec<&str> = self.stderr.lines().filter(|l| !l.trim().is_empty()).collect();
        lines[lines.len().saturating_sub(n)..].to_vec()
    }
}

/// `emon test`. Errors in the input are returned (exit status 2); failed runs give status 1.
pub fn main(args: TestArgs) -> Result<ExitCode, RunnerError> {
    let jobs = match args.jobs {
        Some(0) => return Err(RunnerError::NoJobs),
        Some(n) => n,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    if !(args.timeout.is_finite() && args.timeout > 0.0) {
        return Err(RunnerError::Timeout(args.timeout));
    }
    if args.repeat == 0 {
        return Err(RunnerError::NoRepeat);
    }
    let shard = args.shard.as_deref().map(Shard::parse).transpose()?;
    let (matrix, suite) = match &args.suite {
        Some(path) => {
            let suite = suite::load(path)?;
            (expand_suite(&suite, &args)?, Some(suite))
        }
        None if args.kernels.is_empty() && args.profile.is_empty() => {
            let suite = default_suite()?;
            (expand_suite(&suite, &args)?, Some(suite))
        }
        None => (expand_cli(&args)?, None),
    };
    let matrix = repeat(matrix, args.repeat);
    let matrix_len = matrix.len();
    let runs: Vec<RunSpec> = matrix.into_iter().filter(|r| shard.is_none_or(|s| s.contains(r.index))).collect();
    // Create the report files now, so that a bad path fails before anything runs.
    let create = |p: &PathBuf| std::fs::File::create(p).map_err(cannot_write(p));
    let junit_file = args.junit.as_ref().map(create).transpose()?;
    let json_file = args.json.as_ref().map(create).transpose()?;
    let exe = std::env::current_exe().map_err(RunnerError::CurrentExe)?;

    let tty = std::io::stdout().is_terminal();
    let mut out = std::io::stdout().lock();
    let what = match (&suite, shard) {
        (Some(s), Some(sh)) => format!("{}, shard {sh}: {} of {}", s.origin, runs.len(), report::runs(matrix_len)),
        (Some(s), None) => format!("{}: {}", s.origin, report::runs(runs.len())),
        (None, Some(sh)) => format!("shard {sh}: {} of {}", runs.len(), report::runs(matrix_len)),
        (None, None) => report::runs(runs.len()),
    };
    match jobs.min(runs.len()) {
        0 => writeln!(out, "emon test: {what}"),
        n => writeln!(out, "emon test: {what}, {n} at a time"),
    }
    .ok();
    let start = Instant::now();
    let results = execute(&exe, runs, jobs, &mut Progress::new(tty, &mut out));
    let wall = start.elapsed();
    let _ = write!(out, "{}", report::table(&results, wall));
    drop(out);

    let meta = report::Meta { suite: suite.as_ref().map(|s| s.origin.as_str()), shard, jobs, wall };
    if let (Some(mut f), Some(p)) = (junit_file, &args.junit) {
        f.write_all(report::junit(&results, &meta).as_bytes()).map_err(cannot_write(p))?;
    }
    if let (Some(mut f), Some(p)) = (json_file, &args.json) {
        f.write_all(report::json(&results, &meta).as_bytes()).map_err(cannot_write(p))?;
    }
    Ok(if results.iter().any(RunResult::failed) { ExitCode::from(STATUS_FAILED) } else { ExitCode::SUCCESS })
}

/// The error for a report file that cannot be created or written.
fn cannot_write(path: &Path) -> impl FnOnce(std::io::Error) -> RunnerError + '_ {
    move |source| RunnerError::Write { path: path.to_path_buf(), source }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_line_of_a_run() {
        let r = RunSpec {
            index: 0,
            kernel: "guest:bench".into(),
            profile: "nehalem".into(),
            pmu: vec!["version=2".into()],
            backend: Some(BackendKind::Precise),
            debug_store: None,
            guest_time: None,
            args: vec!["a".into(), "b".into()],
            timeout: 2.5,
            memory: None,
            initrd: None,
            console: Default::default(),
            round: None,
        };
        assert_eq!(
            r.command_args(),
            [
                "run",
                "--profile",
                "nehalem",
                "--pmu",
                "version=2",
                "--backend",
                "precise",
                "--timeout",
                "2.5",
                "guest:bench",
                "--",
                "a",
                "b"
            ]
        );
        assert_eq!(r.name(), "guest:bench -- a b on nehalem --pmu version=2 --backend precise");
    }
}
