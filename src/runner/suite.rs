//! Suite files: a repeatable `emon test` matrix in TOML.
//!
//! ```toml
//! description = "what this suite is for"   # optional
//!
//! [[run]]
//! kernels = ["guest:msr-semantics", "kernels/*.elf"]   # guest:NAME, paths, globs of both
//! profiles = ["nehalem*", "skylake"]                    # names, paths, globs; default: skylake
//! args = "iterations=1000"      # optional: the kernel command line
//! pmu = "version=2,gp=2"        # optional: profile overrides, as `emon run --pmu`
//! backend = "precise"           # optional: auto, precise or perf
//! debug-store = "on"            # optional: auto, on or off, as `emon run --debug-store`
//! guest-time = "model"          # optional: counted or model, as `emon run --guest-time`
//! timeout = 30                  # optional: seconds (default: `emon test --timeout`)
//! memory = 128                  # optional: guest RAM in MiB (default: `emon run`'s)
//! initrd = "initramfs.cpio"     # optional: a Linux kernel's initrd, as `emon run --initrd`
//! expect = ["... version:                4"]   # optional: lines the console must show
//! forbid = ["Broken PMU hardware detected"]    # optional: text no console line may contain
//! ```
//!
//! `expect` and `forbid` become test cases of the run (`console shows "..."`, `console never
//! shows "..."`): an expected line matches a console line exactly, after the line's kernel log
//! timestamp (`[   1.234567] `) and trailing white space are taken off.
//!
//! Relative paths are relative to the suite file's directory. Unknown fields are errors, and every
//! error is one line naming the file, the line and the field.
use super::RunnerError;
use crate::backend::precise::GuestTime;
use crate::backend::BackendKind;
use crate::vmm::DebugStoreMode;
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// A parsed suite file.
#[derive(Debug, Clone, PartialEq)]
pub struct Suite {
    /// The file as given; errors name it.
    pub origin: String,
    /// The directory relative paths in the suite are relative to.
    pub dir: PathBuf,
    pub description: Option<String>,
    pub entries: Vec<Entry>,
}

/// One `[[run]]` table.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// 1-based line of the entry in the file.
    pub line: usize,
    pub kernels: Vec<String>,
    /// Empty: the default profile.
    pub profiles: Vec<String>,
    pub args: Option<String>,
    pub pmu: Option<String>,
    pub backend: Option<BackendKind>,
    pub debug_store: Option<DebugStoreMode>,
    pub guest_time: Option<GuestTime>,
    pub timeout: Option<f64>,
    /// Guest RAM in MiB.
    pub memory: Option<u64>,
    /// A Linux kernel's initrd, as written (relative to the suite's directory).
    pub initrd: Option<String>,
    /// Lines the console must show, and text it must not.
    pub expect: Vec<String>,
    pub forbid: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SuiteFile {
    description: Option<String>,
    run: Vec<toml::Spanned<EntryFile>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EntryFile {
    kernels: Vec<String>,
    profiles: Option<Vec<String>>,
    args: Option<String>,
    pmu: Option<String>,
    backend: Option<String>,
    #[serde(rename = "debug-store")]
    debug_store: Option<String>,
    #[serde(rename = "guest-time")]
    guest_time: Option<String>,
    timeout: Option<f64>,
    memory: Option<u64>,
    initrd: Option<String>,
    expect: Option<Vec<String>>,
    forbid: Option<Vec<String>>,
}

/// An entry's `emon run` option (`backend`, `debug-store`, `guest-time`) as the command line
/// spells its values; `bad` makes the error for a value it does not take.
fn enum_option<T: clap::ValueEnum>(
    value: Option<String>,
    bad: impl FnOnce(&str) -> RunnerError,
) -> Result<Option<T>, RunnerError> {
    value.map(|v| T::from_str(&v, false).map_err(|_| bad(&v))).transpose()
}

/// Reads and parses the suite file at `path`.
pub fn load(path: &Path) -> Result<Suite, RunnerError> {
    let origin = path.display().to_string();
    let text =
        std::fs::read_to_string(path).map_err(|source| RunnerError::ReadSuite { origin: origin.clone(), source })?;
    let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
    from_toml(&origin, dir, &text)
}

/// Parses suite TOML; `origin` names the source in errors, `dir` anchors relative paths.
pub fn from_toml(origin: &str, dir: PathBuf, text: &str) -> Result<Suite, RunnerError> {
    let file: SuiteFile = toml::from_str(text).map_err(|e| toml_error(origin, text, e))?;
    if file.run.is_empty() {
        return Err(RunnerError::NoRuns { origin: origin.to_string() });
    }
    let mut entries = Vec::with_capacity(file.run.len());
    for spanned in file.run {
        let line = line_of(text, spanned.span().start);
        let e = spanned.into_inner();
        let bad = |field: &'static str, value: &dyn std::fmt::Debug, rule: &'static str| RunnerError::SuiteField {
            origin: origin.to_string(),
            line,
            field,
            value: format!("{value:?}"),
            rule,
        };
        if e.kernels.is_empty() {
            return Err(bad("kernels", &e.kernels, "give at least one kernel (guest:NAME, a path or a glob)"));
        }
        if let Some(k) = e.kernels.iter().find(|k| k.trim().is_empty()) {
            return Err(bad("kernels", k, "an empty kernel"));
        }
        let profiles = e.profiles.unwrap_or_default();
        if let Some(p) = profiles.iter().find(|p| p.trim().is_empty()) {
            return Err(bad("profiles", p, "an empty profile"));
        }
        let backend: Option<BackendKind> =
            enum_option(e.backend, |v| bad("backend", &v, "must be auto, precise or perf"))?;
        let debug_store: Option<DebugStoreMode> =
            enum_option(e.debug_store, |v| bad("debug-store", &v, "must be auto, on or off"))?;
        let guest_time: Option<GuestTime> =
            enum_option(e.guest_time, |v| bad("guest-time", &v, "must be counted or model"))?;
        if let Some(t) = e.timeout {
            if !(t.is_finite() && t > 0.0) {
                return Err(bad("timeout", &t, "must be a positive number of seconds"));
            }
        }
        let (expect, forbid) = (e.expect.unwrap_or_default(), e.forbid.unwrap_or_default());
        if let Some(x) = expect.iter().chain(&forbid).find(|x| x.trim().is_empty()) {
            let field = if expect.contains(x) { "expect" } else { "forbid" };
            return Err(bad(field, x, "an empty line matches nothing useful"));
        }
        entries.push(Entry {
            line,
            kernels: e.kernels,
            profiles,
            args: e.args,
            pmu: e.pmu,
            backend,
            debug_store,
            guest_time,
            timeout: e.timeout,
            memory: e.memory,
            initrd: e.initrd,
            expect,
            forbid,
        });
    }
    Ok(Suite { origin: origin.to_string(), dir, description: file.description, entries })
}

fn line_of(text: &str, offset: usize) -> usize {
    text.get(..offset.min(text.len())).unwrap_or("").matches('\n').count() + 1
}

/// The parser's error, with the position and text of the offending line when it gives one.
fn toml_error(origin: &str, text: &str, source: toml::de::Error) -> RunnerError {
    let at = source.span().map(|span| {
        let line = line_of(text, span.start);
        (line, text.lines().nth(line - 1).unwrap_or("").trim().to_string())
    });
    RunnerError::SuiteSyntax { origin: origin.to_string(), at, source: Box::new(source) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Suite, RunnerError> {
        from_toml("s.toml", PathBuf::from("suites"), text)
    }

    #[test]
    fn full_entry() {
        let s = parse(
            "description = \"d\"\n\n[[run]]\nkernels = [\"guest:*\"]\n\n[[run]]\nkernels = [\"k.elf\"]\n\
             profiles = [\"nehalem*\", \"p.toml\"]\nargs = \"a b\"\npmu = \"version=2\"\nbackend = \"precise\"\ndebug-store = \"on\"\ntimeout = 5\n\
             initrd = \"initrd.img\"\nexpect = [\"... version: 4\"]\nforbid = [\"Broken PMU\"]\n",
        )
        .unwrap();
        assert_eq!(s.description.as_deref(), Some("d"));
        assert_eq!(s.dir, PathBuf::from("suites"));
        assert_eq!(s.entries.len(), 2);
        assert_eq!(s.entries[0].kernels, ["guest:*"]);
        assert!(s.entries[0].profiles.is_empty());
        let e = &s.entries[1];
        assert_eq!(e.line, 6);
        assert_eq!(e.profiles, ["nehalem*", "p.toml"]);
        assert_eq!(e.args.as_deref(), Some("a b"));
        assert_eq!(e.pmu.as_deref(), Some("version=2"));
        assert_eq!(e.backend, Some(BackendKind::Precise));
        assert_eq!(e.debug_store, Some(DebugStoreMode::On));
        assert_eq!(s.entries[0].debug_store, None);
        assert_eq!(e.timeout, Some(5.0));
        assert_eq!(e.initrd.as_deref(), Some("initrd.img"));
        assert_eq!(s.entries[0].initrd, None);
        assert_eq!(
            (e.expect.as_slice(), e.forbid.as_slice()),
            (&["... version: 4".to_string()][..], &["Broken PMU".to_string()][..])
        );
        assert!(s.entries[0].expect.is_empty() && s.entries[0].forbid.is_empty());
    }

    #[test]
    fn an_empty_console_rule_is_an_error() {
        let e = error("[[run]]\nkernels = [\"k\"]\nforbid = [\" \"]\n");
        assert!(e.contains("forbid") && e.contains("line 1"), "{e}");
    }

    fn error(text: &str) -> String {
        let e = parse(text).unwrap_err().to_string();
        assert!(!e.contains('\n'), "one line: {e}");
        assert!(e.starts_with("s.toml: "), "names the file: {e}");
        e
    }

    #[test]
    fn errors_name_the_file_line_and_field() {
        let e = error("[[run]]\nkernels = [\"guest:x\"]\nkernel = \"guest:y\"\n");
        assert!(e.contains("line 3") && e.contains("unknown field `kernel`"), "{e}");
        let e = error("[[run]]\nkernels = [\"guest:x\"]\ntimeout = \"long\"\n");
        assert!(e.contains("line 3") && e.contains("timeout"), "{e}");
        let e = error("[[run]]\nprofiles = [\"nehalem\"]\n");
        assert!(e.contains("missing field `kernels`"), "{e}");
        let e = error("[[run]]\nkernels = [\"guest:x\"]\n\n[[run]]\nkernels = [\"guest:x\"]\ntimeout = -1\n");
        assert_eq!(e, "s.toml: line 4: run.timeout = -1.0: must be a positive number of seconds");
        let e = error("[[run]]\nkernels = [\"guest:x\"]\nbackend = \"fast\"\n");
        assert_eq!(e, "s.toml: line 1: run.backend = \"fast\": must be auto, precise or perf");
        let e = parse("[[run]]\nkernels = [\"k\"]\ndebug-store = \"yes\"\n").unwrap_err().to_string();
        assert_eq!(e, "s.toml: line 1: run.debug-store = \"yes\": must be auto, on or off");
        let e = parse("[[run]]\nkernels = [\"k\"]\nguest-time = \"fast\"\n").unwrap_err().to_string();
        assert_eq!(e, "s.toml: line 1: run.guest-time = \"fast\": must be counted or model");
        let e = error("[[run]]\nkernels = []\n");
        assert!(e.contains("run.kernels = []"), "{e}");
        let e = error("[[run]]\nkernels = [\"guest:x\"]\nprofiles = [\"\"]\n");
        assert!(e.contains("run.profiles"), "{e}");
        let e = error("description = \"no runs\"\n");
        assert!(e.contains("missing field `run`"), "{e}");
        let e = error("run = []\n");
        assert_eq!(e, "s.toml: run: no [[run]] entries");
        let e = error("[[run]\n");
        assert!(e.contains("line 1"), "{e}");
        let e = error("[suite]\n");
        assert!(e.contains("unknown field `suite`"), "{e}");
    }

    #[test]
    fn a_missing_file_is_one_line() {
        let e = load(Path::new("/nonexistent/suite.toml")).unwrap_err();
        assert!(
            matches!(&e, RunnerError::ReadSuite { source, .. } if source.kind() == std::io::ErrorKind::NotFound),
            "the I/O error is kept: {e:?}"
        );
        let e = e.to_string();
        assert!(e.starts_with("/nonexistent/suite.toml: cannot read the suite file"), "{e}");
    }
}
