//! `emon test`: runs a matrix of kernels x profiles, each run an `emon run` child process, in a
//! bounded pool of worker threads; parses the guests' kvm-unit-tests lines; reports a table on
//! stdout, JUnit XML and JSON.
//!
//! - [`suite`]: the TOML suite file format.
//! - [`parse`]: the kvm-unit-tests output convention and the verdict on one run.
//! - [`report`]: the table, JUnit XML and JSON.
pub mod parse;
pub mod report;
pub mod suite;

use crate::backend::BackendKind;
use crate::guests;
use crate::profile::Profile;
use parse::{Exit, Parsed, Status, Verdict};
use std::collections::HashSet;
use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Exit status of `emon test` when a run failed.
pub const STATUS_FAILED: u8 = 1;
/// The per-run timeout without `--timeout`, in seconds.
pub const DEFAULT_TIMEOUT_S: f64 = 120.0;
/// The default suite, run by `emon test` with no kernel and no `--suite`: every built-in guest on
/// every shipped profile. Built in, so it runs from any directory.
pub const DEFAULT_SUITE: &str = include_str!("../../resources/suites/default.toml");
/// How `emon test` names the default suite.
pub const DEFAULT_SUITE_ORIGIN: &str = "the default suite (resources/suites/default.toml)";
/// How long past its `--timeout` a child may take before the runner kills it.
const KILL_GRACE: Duration = Duration::from_secs(30);
/// Output kept per run; the rest is counted and dropped.
const STDOUT_CAP: usize = 32 << 20;
const STDERR_CAP: usize = 4 << 20;

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
    pub fn parse(s: &str) -> Result<Shard, String> {
        let bad = |why: &str| format!("--shard {s}: {why}");
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
    pub args: Vec<String>,
    pub timeout: f64,
    /// With `--repeat N`: this run's round (1-based) and N.
    pub round: Option<(usize, usize)>,
}

impl RunSpec {
    fn backend_name(&self) -> Option<String> {
        let b = self.backend?;
        clap::ValueEnum::to_possible_value(&b).map(|v| v.get_name().to_string())
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
pub fn main(args: TestArgs) -> Result<ExitCode, String> {
    let jobs = match args.jobs {
        Some(0) => return Err("--jobs 0: must be at least 1".into()),
        Some(n) => n,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    if !(args.timeout.is_finite() && args.timeout > 0.0) {
        return Err(format!("--timeout {}: must be a positive number of seconds", args.timeout));
    }
    if args.repeat == 0 {
        return Err("--repeat 0: must be at least 1".into());
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
    let create = |p: &PathBuf| std::fs::File::create(p).map_err(|e| format!("{}: cannot write: {e}", p.display()));
    let junit_file = args.junit.as_ref().map(create).transpose()?;
    let json_file = args.json.as_ref().map(create).transpose()?;
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the emon executable: {e}"))?;

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
        f.write_all(report::junit(&results, &meta).as_bytes())
            .map_err(|e| format!("{}: cannot write: {e}", p.display()))?;
    }
    if let (Some(mut f), Some(p)) = (json_file, &args.json) {
        f.write_all(report::json(&results, &meta).as_bytes())
            .map_err(|e| format!("{}: cannot write: {e}", p.display()))?;
    }
    Ok(if results.iter().any(RunResult::failed) { ExitCode::from(STATUS_FAILED) } else { ExitCode::SUCCESS })
}

/// The built-in default suite ([`DEFAULT_SUITE`]).
pub fn default_suite() -> Result<suite::Suite, String> {
    suite::from_toml(DEFAULT_SUITE_ORIGIN, PathBuf::new(), DEFAULT_SUITE)
}

/// The matrix `n` times over, round after round, numbered on; with `n` = 1 unchanged.
pub fn repeat(matrix: Vec<RunSpec>, n: usize) -> Vec<RunSpec> {
    if n <= 1 {
        return matrix;
    }
    let len = matrix.len();
    (0..n)
        .flat_map(|round| {
            matrix.iter().map(move |r| RunSpec {
                index: round * len + r.index,
                round: Some((round + 1, n)),
                ..r.clone()
            })
        })
        .collect()
}

/// The matrix of `emon test KERNEL... --profile ...`: kernel-major, in the order given, globs
/// expanded in sorted order, duplicates dropped.
pub fn expand_cli(args: &TestArgs) -> Result<Vec<RunSpec>, String> {
    if args.kernels.is_empty() {
        return Err("--profile needs KERNEL... (e.g. guest:cpuid-report or 'guest:pmi-*'); with neither, emon test runs the default suite".into());
    }
    let base = Path::new("");
    let kernels = expand_all(&args.kernels, |k| expand_kernel(k, base))?;
    let profiles = default_profiles(&args.profile);
    let profiles = expand_all(&profiles, |p| expand_profile(p, base))?;
    let template = RunSpec {
        index: 0,
        kernel: String::new(),
        profile: String::new(),
        pmu: args.pmu.clone(),
        backend: args.backend,
        args: args.cmdline.clone(),
        timeout: args.timeout,
        round: None,
    };
    check_profiles(&profiles, &args.pmu).map_err(|(_, m)| m)?;
    Ok(finish_matrix(cross(&kernels, &profiles, &template).collect()))
}

/// The matrix of a suite: its entries in order, each expanded kernel-major; `--pmu` applies on
/// top of an entry's own overrides; `--backend`, `--timeout` and `-- CMDLINE` where it sets none.
pub fn expand_suite(suite: &suite::Suite, args: &TestArgs) -> Result<Vec<RunSpec>, String> {
    let mut runs = Vec::new();
    for e in &suite.entries {
        let at = |field: &str, err: String| format!("{}: line {}: run.{field}: {err}", suite.origin, e.line);
        let kernels = expand_all(&e.kernels, |k| expand_kernel(k, &suite.dir)).map_err(|m| at("kernels", m))?;
        let profiles = default_profiles(&e.profiles);
        let profiles = expand_all(&profiles, |p| expand_profile(p, &suite.dir)).map_err(|m| at("profiles", m))?;
        let pmu: Vec<String> = e.pmu.iter().chain(&args.pmu).cloned().collect();
        // Each profile of the entry must load, and take the overrides.
        check_profiles(&profiles, &pmu).map_err(|(field, m)| at(field, m))?;
        let template = RunSpec {
            index: 0,
            kernel: String::new(),
            profile: String::new(),
            pmu,
            backend: e.backend.or(args.backend),
            args: e.args.clone().map_or_else(|| args.cmdline.clone(), |a| vec![a]),
            timeout: e.timeout.unwrap_or(args.timeout),
            round: None,
        };
        runs.extend(cross(&kernels, &profiles, &template));
    }
    Ok(finish_matrix(runs))
}

/// Every kernel on every profile (kernel-major), with the rest of each run from `template`.
fn cross<'a>(
    kernels: &'a [String],
    profiles: &'a [String],
    template: &'a RunSpec,
) -> impl Iterator<Item = RunSpec> + 'a {
    kernels.iter().flat_map(move |k| {
        profiles.iter().map(move |p| RunSpec { kernel: k.clone(), profile: p.clone(), ..template.clone() })
    })
}

/// Each profile loads and takes the overrides; on error, the field at fault and the message.
fn check_profiles(profiles: &[String], pmu: &[String]) -> Result<(), (&'static str, String)> {
    for profile in profiles {
        let mut p = Profile::load(profile).map_err(|m| ("profiles", m.to_string()))?;
        for o in pmu {
            p.apply_overrides(o).map_err(|m| ("pmu", m.to_string()))?;
        }
    }
    Ok(())
}

fn default_profiles(given: &[String]) -> Vec<String> {
    if given.is_empty() {
        vec![Profile::DEFAULT.to_string()]
    } else {
        given.to_vec()
    }
}

/// Drops duplicate runs (the first stays) and numbers the rest in order.
fn finish_matrix(runs: Vec<RunSpec>) -> Vec<RunSpec> {
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(runs.len());
    for mut r in runs {
        if seen.insert(r.command_args()) {
            r.index = out.len();
            out.push(r);
        }
    }
    out
}

fn expand_all(specs: &[String], f: impl Fn(&str) -> Result<Vec<String>, String>) -> Result<Vec<String>, String> {
    let mut out: Vec<String> = Vec::new();
    for s in specs {
        for x in f(s.trim())? {
            if !out.contains(&x) {
                out.push(x);
            }
        }
    }
    Ok(out)
}

/// Whether `s` has glob metacharacters.
pub fn is_pattern(s: &str) -> bool {
    s.contains(['*', '?', '['])
}

/// Names from `names` that `pattern` matches (a glob over names, e.g. `pmi-*`), sorted.
pub fn match_names(pattern: &str, names: &[&str]) -> Result<Vec<String>, String> {
    let p = glob::Pattern::new(pattern).map_err(|e| format!("{pattern}: bad pattern: {e}"))?;
    let mut m: Vec<String> = names.iter().filter(|n| p.matches(n)).map(|n| n.to_string()).collect();
    m.sort();
    Ok(m)
}

/// `guest:NAME`, `guest:GLOB`, a path or a path glob (relative to `base`) -> kernels.
pub fn expand_kernel(spec: &str, base: &Path) -> Result<Vec<String>, String> {
    if let Some(name) = spec.strip_prefix(guests::PREFIX) {
        let all: Vec<&str> = guests::list().map(|(n, _)| n).collect();
        let found = if is_pattern(name) {
            match_names(name, &all)?
        } else {
            all.iter().filter(|n| **n == name).map(|n| n.to_string()).collect()
        };
        if found.is_empty() {
            let what = if is_pattern(name) {
                format!("{spec}: matches no built-in guest")
            } else {
                format!("no built-in guest '{name}'")
            };
            return Err(format!("{what}; built-in guests: {}", all.join(", ")));
        }
        return Ok(found.into_iter().map(|n| format!("{}{n}", guests::PREFIX)).collect());
    }
    let files = expand_path(spec, base)?;
    if files.is_empty() {
        return Err(if is_pattern(spec) {
            format!("{spec}: matches no kernel file")
        } else {
            format!("{spec}: no such kernel file")
        });
    }
    Ok(files)
}

/// A built-in profile name, a glob over them, a path (anything with `/` or ending in `.toml`, as
/// `emon run --profile` decides) or a path glob (relative to `base`) -> profiles.
pub fn expand_profile(spec: &str, base: &Path) -> Result<Vec<String>, String> {
    if spec.contains('/') || spec.ends_with(".toml") {
        if !is_pattern(spec) {
            // A missing file is reported by Profile::load, naming the path.
            return Ok(vec![join(base, spec)]);
        }
        let files = expand_path(spec, base)?;
        if files.is_empty() {
            return Err(format!("{spec}: matches no profile file"));
        }
        return Ok(files);
    }
    if !is_pattern(spec) {
        Profile::load(spec).map_err(|e| e.to_string())?;
        return Ok(vec![spec.to_string()]);
    }
    let all = Profile::builtin_names();
    let found = match_names(spec, &all)?;
    if found.is_empty() {
        return Err(format!("{spec}: matches no built-in profile; built-in profiles: {}", all.join(", ")));
    }
    Ok(found)
}

fn join(base: &Path, spec: &str) -> String {
    base.join(spec).display().to_string()
}

/// Existing files `spec` names (a path or a glob, relative to `base`), sorted.
fn expand_path(spec: &str, base: &Path) -> Result<Vec<String>, String> {
    if !is_pattern(spec) {
        let p = join(base, spec);
        return Ok(if Path::new(&p).is_file() { vec![p] } else { Vec::new() });
    }
    let pattern = if base.as_os_str().is_empty() || Path::new(spec).is_absolute() {
        spec.to_string()
    } else {
        format!("{}/{spec}", glob::Pattern::escape(&base.display().to_string()))
    };
    let paths = glob::glob(&pattern).map_err(|e| format!("{spec}: bad pattern: {e}"))?;
    let mut files: Vec<String> =
        paths.filter_map(Result::ok).filter(|p| p.is_file()).map(|p| p.display().to_string()).collect();
    files.sort();
    Ok(files)
}

/// Runs `runs` on `jobs` worker threads; the results come back in the order of `runs`.
fn execute(exe: &Path, runs: Vec<RunSpec>, jobs: usize, progress: &mut Progress) -> Vec<RunResult> {
    enum Event {
        Started,
        Done(usize, Box<RunResult>),
    }
    progress.begin(runs.len());
    let next = AtomicUsize::new(0);
    let (tx, rx) = mpsc::channel::<Event>();
    let mut results: Vec<Option<RunResult>> = vec![None; runs.len()];
    std::thread::scope(|s| {
        for _ in 0..jobs.min(runs.len()) {
            let (tx, next, runs) = (tx.clone(), &next, &runs);
            s.spawn(move || loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                let Some(spec) = runs.get(i) else { break };
                if tx.send(Event::Started).is_err() {
                    break;
                }
                let r = run_one(exe, spec);
                if tx.send(Event::Done(i, Box::new(r))).is_err() {
                    break;
                }
            });
        }
        drop(tx);
        for event in rx {
            match event {
                Event::Started => progress.started(),
                Event::Done(i, r) => {
                    progress.finished(&r);
                    results[i] = Some(*r);
                }
            }
        }
    });
    progress.end();
    results.into_iter().map(|r| r.expect("every run reports")).collect()
}

/// Runs one `emon run` child and judges it.
pub fn run_one(exe: &Path, spec: &RunSpec) -> RunResult {
    let start = Instant::now();
    let mut cmd = Command::new(exe);
    cmd.args(spec.command_args()).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let (exit, stdout, stderr) = match cmd.spawn() {
        Err(e) => (Exit::Code(2), String::new(), format!("emon test: cannot start {}: {e}", exe.display())),
        Ok(mut child) => {
            let out = child.stdout.take().map(|p| std::thread::spawn(move || read_capped(p, STDOUT_CAP)));
            let err = child.stderr.take().map(|p| std::thread::spawn(move || read_capped(p, STDERR_CAP)));
            let deadline = Duration::from_secs_f64(spec.timeout) + KILL_GRACE;
            let exit = loop {
                match child.try_wait() {
                    Ok(Some(status)) => break exit_of(status),
                    Ok(None) if start.elapsed() > deadline => {
                        let _ = child.kill();
                        let _ = child.wait();
                        break Exit::Killed;
                    }
                    Ok(None) => std::thread::sleep(Duration::from_millis(5)),
                    Err(_) => break child.wait().map_or(Exit::Killed, exit_of),
                }
            };
            let collect =
                |h: Option<std::thread::JoinHandle<String>>| h.and_then(|h| h.join().ok()).unwrap_or_default();
            (exit, collect(out), collect(err))
        }
    };
    let duration = start.elapsed();
    let parsed = parse::parse(&stdout);
    let verdict = parse::judge(exit, &parsed, spec.timeout);
    RunResult { spec: spec.clone(), exit, duration, stdout, stderr, parsed, verdict }
}

fn exit_of(status: std::process::ExitStatus) -> Exit {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => Exit::Code(c),
        (None, Some(s)) => Exit::Signal(s),
        (None, None) => Exit::Killed,
    }
}

/// Reads `r` to the end, keeping the first `cap` bytes, as (lossy) UTF-8.
fn read_capped(mut r: impl Read, cap: usize) -> String {
    let mut kept = Vec::new();
    let mut dropped = 0usize;
    let mut buf = [0u8; 64 * 1024];
    loop {
        match r.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                let room = cap.saturating_sub(kept.len()).min(n);
                kept.extend_from_slice(&buf[..room]);
                dropped += n - room;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
    let mut s = String::from_utf8_lossy(&kept).into_owned();
    if dropped > 0 {
        s += &format!("\n[emon test: {dropped} further bytes of output were not kept]\n");
    }
    s
}

/// The live progress line on a terminal (redrawn with \r), or one line per result otherwise.
struct Progress<'a> {
    tty: bool,
    out: &'a mut dyn Write,
    total: usize,
    done: usize,
    running: usize,
    passed: usize,
    failed: usize,
    skipped: usize,
}

impl<'a> Progress<'a> {
    fn new(tty: bool, out: &'a mut dyn Write) -> Self {
        Progress { tty, out, total: 0, done: 0, running: 0, passed: 0, failed: 0, skipped: 0 }
    }

    fn begin(&mut self, total: usize) {
        self.total = total;
        self.redraw();
    }

    fn started(&mut self) {
        self.running += 1;
        self.redraw();
    }

    fn finished(&mut self, r: &RunResult) {
        self.running -= 1;
        self.done += 1;
        match r.verdict.status {
            Status::Pass => self.passed += 1,
            Status::Skip => self.skipped += 1,
            Status::Fail => self.failed += 1,
        }
        let line = report::result_line(r);
        if self.tty {
            if r.failed() {
                let _ = writeln!(self.out, "\r\x1b[2K{line}");
            }
            self.redraw();
        } else {
            let _ = writeln!(self.out, "[{}/{}] {line}", self.done, self.total);
        }
    }

    fn redraw(&mut self) {
        if !self.tty {
            return;
        }
        let skipped = if self.skipped > 0 { format!(", skipped {}", self.skipped) } else { String::new() };
        let _ = write!(
            self.out,
            "\r\x1b[2K[{}/{}] running {}, passed {}, failed {}{skipped}",
            self.done, self.total, self.running, self.passed, self.failed
        );
        let _ = self.out.flush();
    }

    fn end(&mut self) {
        if self.tty {
            let _ = write!(self.out, "\r\x1b[2K");
            let _ = self.out.flush();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards() {
        assert_eq!(Shard::parse("1/2"), Ok(Shard { index: 1, count: 2 }));
        assert_eq!(Shard::parse("3/3"), Ok(Shard { index: 3, count: 3 }));
        for bad in ["3/2", "0/2", "1/0", "0/0", "1", "a/2", "1/b", "-1/2", "", "1/2/3"] {
            let e = Shard::parse(bad).unwrap_err();
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

    #[test]
    fn name_globs() {
        let names = ["pmi-overflow", "pmu-counters", "cpuid-report", "pmi-a"];
        assert_eq!(match_names("pmi-*", &names).unwrap(), ["pmi-a", "pmi-overflow"]);
        assert_eq!(match_names("pm?-*", &names).unwrap(), ["pmi-a", "pmi-overflow", "pmu-counters"]);
        assert_eq!(match_names("*", &names).unwrap().len(), 4);
        assert!(match_names("x*", &names).unwrap().is_empty());
        assert!(match_names("[", &names).is_err());
        assert!(is_pattern("guest:*") && is_pattern("a?") && is_pattern("[ab]") && !is_pattern("guest:pmi"));
    }

    #[test]
    fn builtin_guest_and_profile_expansion() {
        let base = Path::new("");
        let all = expand_kernel("guest:*", base).unwrap();
        assert_eq!(all.len(), guests::list().count());
        assert!(all.iter().all(|k| k.starts_with("guest:")));
        assert_eq!(expand_kernel("guest:cpuid-report", base).unwrap(), ["guest:cpuid-report"]);
        let e = expand_kernel("guest:nope", base).unwrap_err();
        assert!(e.starts_with("no built-in guest 'nope'; built-in guests: ") && e.contains("cpuid-report"), "{e}");
        let e = expand_kernel("guest:nope-*", base).unwrap_err();
        assert!(e.starts_with("guest:nope-*: matches no built-in guest"), "{e}");
        let e = expand_kernel("/nonexistent/k.elf", base).unwrap_err();
        assert_eq!(e, "/nonexistent/k.elf: no such kernel file");
        let e = expand_kernel("/nonexistent/*.elf", base).unwrap_err();
        assert_eq!(e, "/nonexistent/*.elf: matches no kernel file");

        assert_eq!(expand_profile("nehalem*", base).unwrap(), ["nehalem", "nehalem-llc-masked"]);
        assert_eq!(expand_profile("*", base).unwrap().len(), Profile::builtin_names().len());
        assert_eq!(expand_profile("core2", base).unwrap(), ["core2"]);
        assert!(expand_profile("nehalm", base).unwrap_err().contains("unknown profile"));
        assert!(expand_profile("zen*", base).unwrap_err().starts_with("zen*: matches no built-in profile"));
        assert_eq!(expand_profile("p.toml", Path::new("suites")).unwrap(), ["suites/p.toml"]);
    }

    #[test]
    fn path_globs_are_relative_to_the_base() {
        let dir = std::env::temp_dir().join(format!("emon-runner-glob-{}", std::process::id()));
        let sub = dir.join("k[1]");
        std::fs::create_dir_all(&sub).unwrap();
        for f in ["b.elf", "a.elf", "c.txt"] {
            std::fs::write(sub.join(f), b"x").unwrap();
        }
        std::fs::create_dir_all(sub.join("d.elf")).unwrap();
        let got = expand_kernel("*.elf", &sub).unwrap();
        let want: Vec<String> = ["a.elf", "b.elf"].iter().map(|f| sub.join(f).display().to_string()).collect();
        assert_eq!(got, want, "sorted, files only, base escaped");
        let abs = format!("{}/*.txt", glob::Pattern::escape(&sub.display().to_string()));
        assert_eq!(expand_kernel(&abs, Path::new("elsewhere")).unwrap().len(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn cli(kernels: &[&str], profiles: &[&str]) -> TestArgs {
        TestArgs {
            kernels: kernels.iter().map(|s| s.to_string()).collect(),
            profile: profiles.iter().map(|s| s.to_string()).collect(),
            timeout: DEFAULT_TIMEOUT_S,
            ..TestArgs::default()
        }
    }

    #[test]
    fn cli_matrix_is_kernel_major_and_deduplicated() {
        let runs =
            expand_cli(&cli(&["guest:cpuid-report", "guest:count-*", "guest:cpuid-report"], &["no-pmu", "nehalem"]))
                .unwrap();
        let cells: Vec<(usize, &str, &str)> =
            runs.iter().map(|r| (r.index, r.kernel.as_str(), r.profile.as_str())).collect();
        assert_eq!(
            cells,
            [
                (0, "guest:cpuid-report", "no-pmu"),
                (1, "guest:cpuid-report", "nehalem"),
                (2, "guest:count-instructions", "no-pmu"),
                (3, "guest:count-instructions", "nehalem"),
            ]
        );
        let runs = expand_cli(&cli(&["guest:cpuid-report"], &[])).unwrap();
        assert_eq!(runs[0].profile, Profile::DEFAULT);
        assert!(expand_cli(&cli(&[], &["nehalem"])).unwrap_err().starts_with("--profile needs KERNEL"));
        let mut bad = cli(&["guest:cpuid-report"], &["nehalem"]);
        bad.pmu = vec!["gp=99".into()];
        assert!(expand_cli(&bad).unwrap_err().contains("gp"), "a bad override is an input error");
    }

    #[test]
    fn command_line_of_a_run() {
        let r = RunSpec {
            index: 0,
            kernel: "guest:bench".into(),
            profile: "nehalem".into(),
            pmu: vec!["version=2".into()],
            backend: Some(BackendKind::Precise),
            args: vec!["a".into(), "b".into()],
            timeout: 2.5,
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

    #[test]
    fn suite_matrix() {
        let s = suite::from_toml(
            "s.toml",
            PathBuf::new(),
            "[[run]]\nkernels = [\"guest:cpuid-report\"]\nprofiles = [\"nehalem*\"]\npmu = \"gp=2\"\n\
             [[run]]\nkernels = [\"guest:pmi-*\"]\nargs = \"x=1\"\ntimeout = 5\nbackend = \"precise\"\n",
        )
        .unwrap();
        let mut args = cli(&[], &[]);
        args.pmu = vec!["fixed=2".into()];
        args.backend = Some(BackendKind::Perf);
        let runs = expand_suite(&s, &args).unwrap();
        assert_eq!(runs.len(), 3);
        assert_eq!(runs[0].pmu, ["gp=2", "fixed=2"], "--pmu applies after the entry's own");
        assert_eq!(runs[0].backend, Some(BackendKind::Perf));
        assert_eq!(runs[0].timeout, DEFAULT_TIMEOUT_S);
        assert_eq!(runs[1].profile, "nehalem-llc-masked");
        assert_eq!((runs[2].kernel.as_str(), runs[2].profile.as_str()), ("guest:pmi-overflow", Profile::DEFAULT));
        assert_eq!(
            (runs[2].args.clone(), runs[2].timeout, runs[2].backend),
            (vec!["x=1".to_string()], 5.0, Some(BackendKind::Precise))
        );

        let bad = |text: &str| {
            expand_suite(&suite::from_toml("s.toml", PathBuf::new(), text).unwrap(), &cli(&[], &[])).unwrap_err()
        };
        assert_eq!(
            bad("[[run]]\nkernels = [\"guest:cpuid-report\"]\n\n[[run]]\nkernels = [\"guest:zz*\"]\n"),
            format!(
                "s.toml: line 4: run.kernels: guest:zz*: matches no built-in guest; built-in guests: {}",
                guests::list().map(|(n, _)| n).collect::<Vec<_>>().join(", ")
            )
        );
        assert!(bad("[[run]]\nkernels = [\"guest:cpuid-report\"]\nprofiles = [\"zen\"]\n")
            .starts_with("s.toml: line 1: run.profiles: zen: unknown profile"));
        assert!(bad("[[run]]\nkernels = [\"guest:cpuid-report\"]\npmu = \"nope=1\"\n")
            .starts_with("s.toml: line 1: run.pmu: --pmu: nope"));
    }

    fn finished(kernel: &str, out: &str, code: i32) -> RunResult {
        let spec = RunSpec { kernel: kernel.into(), profile: "nehalem".into(), timeout: 1.0, ..cli_spec() };
        let parsed = parse::parse(out);
        let verdict = parse::judge(Exit::Code(code), &parsed, 1.0);
        RunResult {
            spec,
            exit: Exit::Code(code),
            duration: Duration::from_millis(250),
            stdout: out.into(),
            stderr: String::new(),
            parsed,
            verdict,
        }
    }

    fn cli_spec() -> RunSpec {
        RunSpec {
            index: 0,
            kernel: String::new(),
            profile: String::new(),
            pmu: vec![],
            backend: None,
            args: vec![],
            timeout: DEFAULT_TIMEOUT_S,
            round: None,
        }
    }

    fn progress(tty: bool) -> String {
        let mut buf: Vec<u8> = Vec::new();
        let mut p = Progress::new(tty, &mut buf);
        p.begin(2);
        p.started();
        p.started();
        p.finished(&finished("guest:a", "PASS: x\nSUMMARY: 1 tests\n", 0));
        p.finished(&finished("guest:b", "FAIL: y\nSUMMARY: 1 tests, 1 unexpected failures\n", 1));
        p.end();
        String::from_utf8(buf).unwrap()
    }

    #[test]
    fn progress_on_a_terminal_and_off() {
        let clear = "\r\x1b[2K";
        assert_eq!(
            progress(true),
            format!(
                "{clear}[0/2] running 0, passed 0, failed 0{clear}[0/2] running 1, passed 0, failed 0\
                 {clear}[0/2] running 2, passed 0, failed 0{clear}[1/2] running 1, passed 1, failed 0\
                 {clear}FAIL guest:b on nehalem (0 passed, 1 failed, 0 skipped, 0.25 s): 1 failed test (exit status 1)\n\
                 {clear}[2/2] running 0, passed 1, failed 1{clear}"
            )
        );
        assert_eq!(
            progress(false),
            "[1/2] pass guest:a on nehalem (1 passed, 0 failed, 0 skipped, 0.25 s)\n\
             [2/2] FAIL guest:b on nehalem (0 passed, 1 failed, 0 skipped, 0.25 s): 1 failed test (exit status 1)\n"
        );
    }

    #[test]
    fn repeat_runs_the_matrix_in_rounds_with_distinct_names() {
        let m = expand_cli(&cli(&["guest:cpuid-report", "guest:hal-emon"], &["nehalem"])).unwrap();
        assert_eq!(repeat(m.clone(), 1), m);
        let r = repeat(m, 3);
        assert_eq!(r.len(), 6);
        assert_eq!(r.iter().map(|r| r.index).collect::<Vec<_>>(), (0..6).collect::<Vec<_>>());
        assert_eq!(r[2].kernel, "guest:cpuid-report");
        assert_eq!(r[2].round, Some((2, 3)));
        assert_eq!(r[2].name(), "guest:cpuid-report on nehalem (round 2/3)");
        assert_eq!(r[2].command_args(), r[0].command_args(), "a round runs the same command");
        let names: HashSet<String> = r.iter().map(RunSpec::name).collect();
        assert_eq!(names.len(), 6);
    }

    /// The README states the default suite's size and what it leaves out; it must stay true.
    #[test]
    fn the_readme_tells_the_default_suite_as_it_is() {
        let runs = expand_suite(&default_suite().unwrap(), &cli(&[], &[])).unwrap();
        let readme = include_str!("../../README.md");
        let said = readme
            .split("**The default suite**")
            .nth(1)
            .and_then(|t| t.split("That is ").nth(1))
            .and_then(|t| t.split(" runs").next())
            .and_then(|n| n.parse::<usize>().ok())
            .expect("the README says `That is N runs` of the default suite");
        assert_eq!(said, runs.len(), "the README's default-suite size");
        let kernels: HashSet<&str> = runs.iter().map(|r| r.kernel.as_str()).collect();
        let profiles: HashSet<&str> = runs.iter().map(|r| r.profile.as_str()).collect();
        assert_eq!(runs.len(), kernels.len() * profiles.len(), "every guest of the suite runs on every profile");
        for (guest, _) in guests::list() {
            let named = readme.contains(&format!("It leaves out `guest:{guest}`"));
            assert_eq!(named, !kernels.contains(format!("guest:{guest}").as_str()), "guest:{guest}");
        }
    }

    #[test]
    fn shipped_suites_expand() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("resources/suites");
        for entry in std::fs::read_dir(&dir).unwrap() {
            let s = suite::load(&entry.unwrap().path()).unwrap();
            let runs = expand_suite(&s, &cli(&[], &[])).unwrap();
            assert!(!runs.is_empty(), "{}", s.origin);
        }
    }
}
