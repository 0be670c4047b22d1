//! The matrix of `emon test`: kernels x profiles from the command line or a suite, globs
//! expanded, duplicates dropped, with `--repeat` rounds.
use super::args::TestArgs;
use super::{suite, RunSpec, RunnerError};
use crate::guests;
use crate::profile::{Profile, ProfileError};
use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// The default suite, run by `emon test` with no kernel and no `--suite`: every built-in guest on
/// every shipped profile. Built in, so it runs from any directory.
pub const DEFAULT_SUITE: &str = include_str!("../../resources/suites/default.toml");
/// How `emon test` names the default suite.
pub const DEFAULT_SUITE_ORIGIN: &str = "the default suite (resources/suites/default.toml)";

/// The built-in default suite ([`DEFAULT_SUITE`]).
pub fn default_suite() -> Result<suite::Suite, RunnerError> {
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
pub fn expand_cli(args: &TestArgs) -> Result<Vec<RunSpec>, RunnerError> {
    if args.kernels.is_empty() {
        return Err(RunnerError::ProfileWithoutKernel);
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
        debug_store: None,
        guest_time: None,
        args: args.cmdline.clone(),
        timeout: args.timeout,
        memory: None,
        initrd: None,
        console: Default::default(),
        round: None,
    };
    check_profiles(&profiles, &args.pmu).map_err(|(_, e)| e)?;
    Ok(finish_matrix(cross(&kernels, &profiles, &template).collect()))
}

/// The matrix of a suite: its entries in order, each expanded kernel-major; `--pmu` applies on
/// top of an entry's own overrides; `--backend`, `--timeout` and `-- CMDLINE` where it sets none.
pub fn expand_suite(suite: &suite::Suite, args: &TestArgs) -> Result<Vec<RunSpec>, RunnerError> {
    let mut runs = Vec::new();
    for e in &suite.entries {
        let at = |field: &'static str, err: RunnerError| RunnerError::InEntry {
            origin: suite.origin.clone(),
            line: e.line,
            field,
            source: Box::new(err),
        };
        let kernels = expand_all(&e.kernels, |k| expand_kernel(k, &suite.dir)).map_err(|m| at("kernels", m))?;
        let profiles = default_profiles(&e.profiles);
        let profiles = expand_all(&profiles, |p| expand_profile(p, &suite.dir)).map_err(|m| at("profiles", m))?;
        let pmu: Vec<String> = e.pmu.iter().chain(&args.pmu).cloned().collect();
        // Each profile of the entry must load, and take the overrides.
        check_profiles(&profiles, &pmu).map_err(|(field, e)| at(field, e.into()))?;
        let template = RunSpec {
            index: 0,
            kernel: String::new(),
            profile: String::new(),
            pmu,
            backend: e.backend.or(args.backend),
            debug_store: e.debug_store,
            guest_time: e.guest_time,
            args: e.args.clone().map_or_else(|| args.cmdline.clone(), |a| vec![a]),
            timeout: e.timeout.unwrap_or(args.timeout),
            memory: e.memory,
            initrd: e.initrd.as_ref().map(|i| suite.dir.join(i).display().to_string()),
            console: super::parse::Console { expect: e.expect.clone(), forbid: e.forbid.clone() },
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
fn check_profiles(profiles: &[String], pmu: &[String]) -> Result<(), (&'static str, ProfileError)> {
    for profile in profiles {
        let mut p = Profile::load(profile).map_err(|e| ("profiles", e))?;
        for o in pmu {
            p.apply_overrides(o).map_err(|e| ("pmu", e))?;
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

fn expand_all(
    specs: &[String],
    f: impl Fn(&str) -> Result<Vec<String>, RunnerError>,
) -> Result<Vec<String>, RunnerError> {
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
pub fn match_names(pattern: &str, names: &[&str]) -> Result<Vec<String>, RunnerError> {
    let p = glob::Pattern::new(pattern).map_err(|source| RunnerError::Pattern { spec: pattern.to_string(), source })?;
    let mut m: Vec<String> = names.iter().filter(|n| p.matches(n)).map(|n| n.to_string()).collect();
    m.sort();
    Ok(m)
}

/// `guest:NAME`, `guest:GLOB`, a path or a path glob (relative to `base`) -> kernels.
pub fn expand_kernel(spec: &str, base: &Path) -> Result<Vec<String>, RunnerError> {
    if let Some(name) = spec.strip_prefix(guests::PREFIX) {
        let all: Vec<&str> = guests::list().map(|(n, _)| n).collect();
        let found = if is_pattern(name) {
            match_names(name, &all)?
        } else {
            all.iter().filter(|n| **n == name).map(|n| n.to_string()).collect()
        };
        if found.is_empty() {
            return Err(if is_pattern(name) {
                RunnerError::NoGuestMatches { spec: spec.to_string(), available: all }
            } else {
                RunnerError::UnknownGuest { name: name.to_string(), available: all }
            });
        }
        return Ok(found.into_iter().map(|n| format!("{}{n}", guests::PREFIX)).collect());
    }
    let (path, var) = expand_variables(spec)?;
    let files = expand_path(&path, base)?;
    if files.is_empty() {
        return Err(match var {
            Some(var) if !is_pattern(&path) => {
                RunnerError::NoKernelFileFromVariable { spec: spec.to_string(), file: join(base, &path), var }
            }
            _ if is_pattern(spec) => RunnerError::NoKernelMatches(spec.to_string()),
            _ => RunnerError::NoKernelFile(spec.to_string()),
        });
    }
    Ok(files)
}

/// A kernel path with `${NAME}` or `${NAME:-default}` replaced by the environment variable's
/// value (or the default where it is unset or empty), as a shell does; and the variable's name.
/// Test data that lives outside the repository (kvm-unit-tests' programs) is found so.
fn expand_variables(spec: &str) -> Result<(String, Option<String>), RunnerError> {
    let Some(start) = spec.find("${") else { return Ok((spec.to_string(), None)) };
    let Some(len) = spec[start..].find('}') else { return Ok((spec.to_string(), None)) };
    let inner = &spec[start + 2..start + len];
    let (var, default) = match inner.split_once(":-") {
        Some((v, d)) => (v, Some(d)),
        None => (inner, None),
    };
    let value = match (std::env::var(var).ok().filter(|v| !v.is_empty()), default) {
        (Some(v), _) => v,
        (None, Some(d)) => d.to_string(),
        (None, None) => return Err(RunnerError::UnsetVariable { spec: spec.to_string(), var: var.to_string() }),
    };
    Ok((format!("{}{value}{}", &spec[..start], &spec[start + len + 1..]), Some(var.to_string())))
}

/// A built-in profile name, a glob over them, a path (anything with `/` or ending in `.toml`, as
/// `emon run --profile` decides) or a path glob (relative to `base`) -> profiles.
pub fn expand_profile(spec: &str, base: &Path) -> Result<Vec<String>, RunnerError> {
    if spec.contains('/') || spec.ends_with(".toml") {
        if !is_pattern(spec) {
            // A missing file is reported by Profile::load, naming the path.
            return Ok(vec![join(base, spec)]);
        }
        let files = expand_path(spec, base)?;
        if files.is_empty() {
            return Err(RunnerError::NoProfileFileMatches(spec.to_string()));
        }
        return Ok(files);
    }
    if !is_pattern(spec) {
        Profile::load(spec)?;
        return Ok(vec![spec.to_string()]);
    }
    let all = Profile::builtin_names();
    let found = match_names(spec, &all)?;
    if found.is_empty() {
        return Err(RunnerError::NoProfileMatches { spec: spec.to_string(), available: all });
    }
    Ok(found)
}

fn join(base: &Path, spec: &str) -> String {
    base.join(spec).display().to_string()
}

/// Existing files `spec` names (a path or a glob, relative to `base`), sorted.
fn expand_path(spec: &str, base: &Path) -> Result<Vec<String>, RunnerError> {
    if !is_pattern(spec) {
        let p = join(base, spec);
        return Ok(if Path::new(&p).is_file() { vec![p] } else { Vec::new() });
    }
    let pattern = if base.as_os_str().is_empty() || Path::new(spec).is_absolute() {
        spec.to_string()
    } else {
        format!("{}/{spec}", glob::Pattern::escape(&base.display().to_string()))
    };
    let paths = glob::glob(&pattern).map_err(|source| RunnerError::Pattern { spec: spec.to_string(), source })?;
    let mut files: Vec<String> =
        paths.filter_map(Result::ok).filter(|p| p.is_file()).map(|p| p.display().to_string()).collect();
    files.sort();
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::BackendKind;
    use crate::runner::DEFAULT_TIMEOUT_S;

    /// `${NAME:-default}` in a kernel path takes the variable or the default; a path that names
    /// no file says which variable to set, and an unset variable without a default is an error.
    #[test]
    fn kernel_paths_take_environment_variables() {
        let dir = std::env::temp_dir().join(format!("emon-matrix-vars-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("k.flat"), b"x").unwrap();
        let base = Path::new("");
        let d = dir.display().to_string();
        let var = "EMON_TEST_MATRIX_VAR_SET";
        std::env::set_var(var, &d);
        assert_eq!(expand_kernel(&format!("${{{var}:-/nowhere}}/k.flat"), base).unwrap(), vec![format!("{d}/k.flat")]);
        assert_eq!(expand_kernel(&format!("${{EMON_TEST_MATRIX_VAR_UNSET:-{d}}}/k.flat"), base).unwrap().len(), 1);
        let e = expand_kernel("${EMON_TEST_MATRIX_VAR_UNSET:-/nowhere}/k.flat", base).unwrap_err().to_string();
        assert_eq!(
            e,
            "/nowhere/k.flat: no such kernel file (from ${EMON_TEST_MATRIX_VAR_UNSET:-/nowhere}/k.flat: set EMON_TEST_MATRIX_VAR_UNSET to the directory that holds it)"
        );
        let e = expand_kernel("${EMON_TEST_MATRIX_VAR_UNSET}/k.flat", base).unwrap_err().to_string();
        assert_eq!(
            e,
            "${EMON_TEST_MATRIX_VAR_UNSET}/k.flat: the environment variable EMON_TEST_MATRIX_VAR_UNSET is not set"
        );
        std::fs::remove_dir_all(&dir).unwrap();
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
        let e = expand_kernel("guest:nope", base).unwrap_err().to_string();
        assert!(e.starts_with("no built-in guest 'nope'; built-in guests: ") && e.contains("cpuid-report"), "{e}");
        let e = expand_kernel("guest:nope-*", base).unwrap_err().to_string();
        assert!(e.starts_with("guest:nope-*: matches no built-in guest"), "{e}");
        let e = expand_kernel("/nonexistent/k.elf", base).unwrap_err().to_string();
        assert_eq!(e, "/nonexistent/k.elf: no such kernel file");
        let e = expand_kernel("/nonexistent/*.elf", base).unwrap_err().to_string();
        assert_eq!(e, "/nonexistent/*.elf: matches no kernel file");

        assert_eq!(expand_profile("nehalem*", base).unwrap(), ["nehalem", "nehalem-llc-masked"]);
        assert_eq!(expand_profile("*", base).unwrap().len(), Profile::builtin_names().len());
        assert_eq!(expand_profile("core2", base).unwrap(), ["core2"]);
        assert!(expand_profile("nehalm", base).unwrap_err().to_string().contains("unknown profile"));
        assert!(expand_profile("zen*", base).unwrap_err().to_string().starts_with("zen*: matches no built-in profile"));
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
        assert!(expand_cli(&cli(&[], &["nehalem"])).unwrap_err().to_string().starts_with("--profile needs KERNEL"));
        let mut bad = cli(&["guest:cpuid-report"], &["nehalem"]);
        bad.pmu = vec!["gp=99".into()];
        assert!(expand_cli(&bad).unwrap_err().to_string().contains("gp"), "a bad override is an input error");
    }

    #[test]
    fn suite_matrix() {
        let s = suite::from_toml(
            "s.toml",
            PathBuf::new(),
            "[[run]]\nkernels = [\"guest:cpuid-report\"]\nprofiles = [\"nehalem*\"]\npmu = \"gp=2\"\n\
             [[run]]\nkernels = [\"guest:pmi-*\"]\nargs = \"x=1\"\ntimeout = 5\nbackend = \"precise\"\n\
             initrd = \"i.cpio\"\nguest-time = \"model\"\n",
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
        assert_eq!((runs[0].initrd.as_deref(), runs[2].initrd.as_deref()), (None, Some("i.cpio")));
        assert!(runs[2].command_args().windows(2).any(|w| w == ["--initrd", "i.cpio"]));
        assert!(runs[2].command_args().windows(2).any(|w| w == ["--guest-time", "model"]));
        assert!(runs[2].name().contains(" --guest-time model"), "{}", runs[2].name());
        assert!(!runs[0].command_args().iter().any(|a| a == "--guest-time"));

        let error = |text: &str| {
            expand_suite(&suite::from_toml("s.toml", PathBuf::new(), text).unwrap(), &cli(&[], &[])).unwrap_err()
        };
        let bad = |text: &str| error(text).to_string();
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
        let e = error("[[run]]\nkernels = [\"guest:cpuid-report\"]\npmu = \"nope=1\"\n");
        assert!(
            matches!(&e, RunnerError::InEntry { field: "pmu", source, .. }
                if matches!(**source, RunnerError::Profile(ProfileError::Override { .. }))),
            "the profile error is kept: {e:?}"
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
            match expand_suite(&s, &cli(&[], &[])) {
                Ok(runs) => assert!(!runs.is_empty(), "{}", s.origin),
                // Test data from outside the project (kvm-unit-tests' programs) that is not where
                // the suite's default looks: scripts/test finds it or fails.
                Err(RunnerError::InEntry { source, .. })
                    if matches!(*source, RunnerError::NoKernelFileFromVariable { .. }) => {}
                Err(e) => panic!("{}: {e}", s.origin),
            }
        }
    }
}
