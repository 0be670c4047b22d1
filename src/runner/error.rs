//! [`RunnerError`]: every way `emon test` can fail before or after its runs, as one line for the user.
//!
//! A failed run is not an error: it is a result (exit status [`super::STATUS_FAILED`]). These are
//! errors in the input (options, kernels, profiles, suite files) and in writing the reports, which
//! `emon` reports on one line with exit status 2.
use crate::profile::ProfileError;
use std::path::PathBuf;

/// An `emon test` error. Display is one line; variants with a cause keep it as their source.
#[derive(Debug, thiserror::Error)]
pub enum RunnerError {
    /// `--jobs 0`.
    #[error("--jobs 0: must be at least 1")]
    NoJobs,
    /// `--timeout` is not a positive number of seconds.
    #[error("--timeout {0}: must be a positive number of seconds")]
    Timeout(f64),
    /// `--repeat 0`.
    #[error("--repeat 0: must be at least 1")]
    NoRepeat,
    /// `--shard` is not `I/N` with 1 <= I <= N.
    #[error("--shard {spec}: {rule}")]
    Shard {
        /// The value as given.
        spec: String,
        /// What is wrong.
        rule: String,
    },
    /// `--profile` without a kernel.
    #[error(
        "--profile needs KERNEL... (e.g. guest:cpuid-report or 'guest:pmi-*'); with neither, emon test runs the \
         default suite"
    )]
    ProfileWithoutKernel,
    /// `guest:NAME` names no built-in guest.
    #[error("no built-in guest '{name}'; built-in guests: {}", available.join(", "))]
    UnknownGuest {
        /// NAME, without the `guest:` prefix.
        name: String,
        /// The built-in guests.
        available: Vec<&'static str>,
    },
    /// `guest:GLOB` matches no built-in guest.
    #[error("{spec}: matches no built-in guest; built-in guests: {}", available.join(", "))]
    NoGuestMatches {
        /// The pattern as given, with the `guest:` prefix.
        spec: String,
        /// The built-in guests.
        available: Vec<&'static str>,
    },
    /// A kernel path names no file.
    #[error("{0}: no such kernel file")]
    NoKernelFile(String),
    /// A kernel path made from an environment variable (or its default) names no file.
    #[error("{file}: no such kernel file (from {spec}: set {var} to the directory that holds it)")]
    NoKernelFileFromVariable { spec: String, file: String, var: String },
    /// A kernel path names an environment variable that is not set and has no default.
    #[error("{spec}: the environment variable {var} is not set")]
    UnsetVariable { spec: String, var: String },
    /// A kernel path glob matches no file.
    #[error("{0}: matches no kernel file")]
    NoKernelMatches(String),
    /// A profile path glob matches no file.
    #[error("{0}: matches no profile file")]
    NoProfileFileMatches(String),
    /// A profile name glob matches no built-in profile.
    #[error("{spec}: matches no built-in profile; built-in profiles: {}", available.join(", "))]
    NoProfileMatches {
        /// The pattern as given.
        spec: String,
        /// The built-in profiles.
        available: Vec<&'static str>,
    },
    /// A glob that does not parse.
    #[error("{spec}: bad pattern: {source}")]
    Pattern {
        /// The pattern as given.
        spec: String,
        source: glob::PatternError,
    },
    /// A profile that does not load, or an override it does not take.
    #[error(transparent)]
    Profile(#[from] ProfileError),
    /// The suite file cannot be read.
    #[error("{origin}: cannot read the suite file: {source}")]
    ReadSuite {
        /// The suite file as given.
        origin: String,
        source: std::io::Error,
    },
    /// The suite is not valid TOML, or has fields of the wrong type, unknown or missing.
    #[error("{origin}: {}{}", position(.at), one_line(.source.message()))]
    SuiteSyntax {
        /// The suite file as given.
        origin: String,
        /// The line (1-based) and its text, when the parser gives a position.
        at: Option<(usize, String)>,
        source: Box<toml::de::Error>,
    },
    /// A suite with no `[[run]]` entries.
    #[error("{origin}: run: no [[run]] entries")]
    NoRuns {
        /// The suite file as given.
        origin: String,
    },
    /// A field of a suite entry with a value it cannot have.
    #[error("{origin}: line {line}: run.{field} = {value}: {rule}")]
    SuiteField {
        /// The suite file as given.
        origin: String,
        /// The entry's line (1-based).
        line: usize,
        field: &'static str,
        /// The value, as Rust's `{:?}` shows it.
        value: String,
        rule: &'static str,
    },
    /// A suite entry whose kernels, profiles or overrides fail to expand or load.
    #[error("{origin}: line {line}: run.{field}: {source}")]
    InEntry {
        /// The suite file as given.
        origin: String,
        /// The entry's line (1-based).
        line: usize,
        /// `kernels`, `profiles` or `pmu`.
        field: &'static str,
        source: Box<RunnerError>,
    },
    /// A report file (`--junit`, `--json`) cannot be created or written.
    #[error("{}: cannot write: {source}", path.display())]
    Write { path: PathBuf, source: std::io::Error },
    /// The path of the running `emon`, which each run starts as a child, is unknown.
    #[error("cannot find the emon executable: {0}")]
    CurrentExe(#[source] std::io::Error),
}

/// `line L (`text`): `, or nothing without a position.
fn position(at: &Option<(usize, String)>) -> String {
    match at {
        Some((line, text)) => format!("line {line} (`{text}`): "),
        None => String::new(),
    }
}

/// The TOML parser's message (which names the field, e.g. "unknown field `kernel`, expected one
/// of ..."), collapsed onto one line.
fn one_line(message: &str) -> String {
    message.split_whitespace().collect::<Vec<_>>().join(" ")
}
