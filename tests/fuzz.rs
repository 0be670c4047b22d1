//! guest:msr-fuzz under every built-in profile (and the PMU shapes no built-in profile has) with
//! two seeds: thousands of random RDMSR/WRMSR, each of which must complete or raise #GP, and emon
//! must keep running to the guest's clean exit.
mod common;
use common::*;
use emon::profile::Profile;

const SEEDS: [u64; 2] = [1, 0x5EED_2026];

/// The `PASS:` lines msr-fuzz reports per MSR range.
const RANGES: [&str; 13] = [
    "IA32_PMCx",
    "IA32_PERFEVTSELx",
    "IA32_FIXED_CTRx",
    "IA32_PERF_CAPABILITIES",
    "IA32_FIXED_CTR_CTRL..IA32_PERF_GLOBAL_INUSE",
    "IA32_MISC_ENABLE",
    "IA32_DEBUGCTL",
    "IA32_PEBS_ENABLE",
    "IA32_DS_AREA",
    "IA32_A_PMCx",
    "non-PMU MSRs, any index (RDMSR)",
    "non-PMU allow-list (RDMSR, WRMSR)",
    "unimplemented MSRs 0xDEAD0000-0xDEADFFFF (#GP)",
];

/// Runs msr-fuzz with `args` (profile options) and `seed`, and checks the whole report.
fn msr_fuzz(args: &[&str], seed: u64) {
    let seed_arg = format!("seed={seed}");
    let mut a = vec!["run", "--timeout", "120"];
    a.extend_from_slice(args);
    a.extend(["guest:msr-fuzz", "--", &seed_arg]);
    let r = emon(&a);
    let ctx = format!("emon {}", a.join(" "));
    assert_eq!(r.status, 0, "{ctx}: exit status\n--- stdout\n{}\n--- stderr\n{}", r.stdout, r.stderr);
    r.assert_no_failures();
    assert!(r.stdout.contains(&format!("msr-fuzz: seed={seed} n=2000")), "{ctx}: seed not printed\n{}", r.stdout);
    for range in RANGES {
        let prefix = format!("PASS: {range}: ");
        assert!(r.stdout.lines().any(|l| l.starts_with(&prefix)), "{ctx}: no line {prefix:?}\n{}", r.stdout);
    }
    assert!(r.stdout.contains("PASS: guest alive after 2000 accesses"), "{ctx}\n{}", r.stdout);
}

/// Runs every case on two threads (each run is one single-threaded VM).
fn run_all(cases: Vec<Vec<&str>>) {
    let cases: Vec<(Vec<&str>, u64)> = cases.into_iter().flat_map(|c| SEEDS.map(|s| (c.clone(), s))).collect();
    let (a, b) = cases.split_at(cases.len() / 2);
    std::thread::scope(|s| {
        for half in [a, b] {
            s.spawn(move || half.iter().for_each(|(args, seed)| msr_fuzz(args, *seed)));
        }
    });
}

#[test]
fn msr_fuzz_under_every_profile() {
    if !kvm_available() {
        return;
    }
    run_all(Profile::builtin_names().into_iter().map(|name| vec!["--profile", name]).collect());
}

#[test]
fn msr_fuzz_under_unusual_pmus() {
    if !kvm_available() {
        return;
    }
    run_all(vec![
        // Version 1 (no globals, no fixed counters), which no built-in profile is.
        vec!["--profile", "core2", "--pmu", "version=1,fixed=0,fixed-width=0"],
        // Version 5 with a sparse fixed-counter bitmap; 64-bit counters.
        vec!["--profile", "icelake", "--pmu", "fixed=0,fixed-bitmap=0x9,gp-width=64,fixed-width=64"],
    ]);
}
