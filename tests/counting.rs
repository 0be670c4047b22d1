//! Counting with the precise backend: the seed walkthrough's experiments and the other counting
//! guests pass under every shipped profile, and give identical output on every run.
mod common;
use common::*;
use emon::profile::Profile;

const COUNTING_GUESTS: &[&str] = &["count-instructions", "pmi-overflow", "freeze-on-pmi", "step-events"];

fn run_guest(profile: &str, guest: &str) -> Run {
    let g = format!("guest:{guest}");
    emon(&["run", "--backend", "precise", "--timeout", "120", "--profile", profile, &g])
}

#[test]
fn counting_guests_pass_under_every_profile() {
    if !kvm_available() {
        return;
    }
    for guest in COUNTING_GUESTS {
        for profile in Profile::builtin_names() {
            let r = run_guest(profile, guest);
            r.assert_status(0).assert_no_failures();
            if Profile::load(profile).unwrap().pmu.version >= 2 {
                assert!(!r.summary().starts_with("SUMMARY: 0 tests"), "{guest} under {profile} ran nothing");
            }
        }
    }
}

#[test]
fn counts_are_identical_on_every_run() {
    if !kvm_available() {
        return;
    }
    for guest in COUNTING_GUESTS {
        let a = run_guest("nehalem", guest);
        let b = run_guest("nehalem", guest);
        a.assert_status(0);
        assert_eq!(a.stdout, b.stdout, "{guest}: two runs differ");
    }
}

#[test]
fn seed_experiment_counts() {
    if !kvm_available() {
        return;
    }
    // 15-2: call + foo(N=100) (2N+2) + the 4 instructions that stop the counter.
    let r = run_guest("nehalem", "count-instructions");
    assert!(r.stdout.contains("foo(N=100): IA32_PMC0 = 207 (0xcf)"), "{}", r.stdout);
    // 15-4: the counter advances by the handler's 104 instructions, then is frozen.
    let r = run_guest("nehalem", "freeze-on-pmi");
    assert!(r.stdout.contains("first PMI (no freeze): IA32_PMC0 36 then 140"), "{}", r.stdout);
    assert!(r.stdout.contains("second PMI (freeze): IA32_PMC0 0 then 0"), "{}", r.stdout);
}

#[test]
fn perf_backend_is_refused_clearly_until_it_exists() {
    let r = emon(&["run", "--backend", "perf"]);
    assert_eq!(r.status, 2, "{}", r.stderr);
    assert!(r.stderr.contains("--backend perf"), "{}", r.stderr);
}

#[test]
fn events_lists_support_per_profile() {
    let r = emon(&["events", "--profile", "nehalem-llc-masked"]);
    r.assert_status(0);
    let line = |bit: &str| r.stdout.lines().find(|l| l.starts_with(bit)).unwrap_or_else(|| panic!("{}", r.stdout));
    assert!(line("1 ").contains("Instructions Retired") && line("1 ").contains("counted exactly"), "{}", r.stdout);
    assert!(line("1 ").contains("FIXED_CTR0"), "{}", r.stdout);
    assert!(line("3 ").contains("unavailable") && line("3 ").contains("unsupported: counts 0"), "{}", r.stdout);
}

#[test]
fn bench_reports_ratios_from_one_run() {
    if !kvm_available() {
        return;
    }
    let r = emon(&["bench", "--iterations", "5000", "--exits", "2000"]);
    r.assert_status(0);
    let ratio = |key: &str| -> f64 {
        let l = r.stdout.lines().find(|l| l.contains(key)).unwrap_or_else(|| panic!("no {key}: {}", r.stdout));
        l.rsplit(' ').next().unwrap().trim_end_matches('x').parse().unwrap()
    };
    // The precise backend's own work per step is small next to a single-step exit (release
    // build, as scripts/test runs it; the README has the full-size figures).
    assert!(ratio("precise / bare single-step rate") > 0.8, "{}", r.stdout);
    assert!(ratio("PMU MSR exit / port I/O exit") > 0.0, "{}", r.stdout);
}

#[test]
fn max_valued_counters_overflow_at_every_width() {
    if !kvm_available() {
        return;
    }
    // Legacy 32-bit writes sign-extend to the width; full-width writes go through IA32_A_PMC0.
    for w in ["32", "40", "48", "63", "64"] {
        let spec = format!("gp-width={w}");
        let r = emon(&["run", "--profile", "skylake", "--pmu", &spec, "guest:pmi-overflow"]);
        r.assert_status(0).assert_no_failures();
        assert!(r.stdout.contains("PASS: full-width write through IA32_A_PMC0: the PMI handler ran once"), "{w}");
    }
    // Version 1: no GLOBAL_CTRL/STATUS, the PMI still arrives.
    let r = emon(&["run", "--profile", "core2", "--pmu", "version=1,fixed=0,fixed-width=0", "guest:pmi-overflow"]);
    r.assert_status(0).assert_no_failures();
}
