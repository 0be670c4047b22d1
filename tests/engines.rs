//! The precise backend's TCG engine against its single-stepping reference: every counting guest
//! prints the same output (its counts and checks), delivers the same PMIs and makes the same PMU
//! accesses with the same values under both, under several profiles; and the engine really ran.
mod common;
use common::*;

/// Each counting guest, with arguments that keep the stepping reference quick.
const GUESTS: &[(&str, &[&str])] = &[
    ("count-instructions", &[]),
    ("pmi-overflow", &[]),
    ("freeze-on-pmi", &[]),
    ("step-events", &[]),
    ("pmu-counters", &[]),
    ("hal-emon", &[]),
    ("msr-fuzz", &[]),
    ("sse-completion", &[]),
    ("rep-string", &[]),
    ("lbr", &[]),
    ("loops", &["calibrate=20000", "iterations=2000", "passes=3"]),
    ("pmu-idioms", &["n=200", "calibrate=2000"]),
    ("prefetchers", &[]),
    ("model-events", &[]),
];

/// The trace's instant events (every PMU MSR access with its value, every PMI) without their
/// timestamps: what the guest saw, in order. Overflow instants are left out: emon traces one when
/// it next samples GLOBAL_STATUS (at a PMU access, a PMI, or every 4096 exits), so where it lands
/// depends on the exit count, in which the engines differ by design; the guest's reads of
/// GLOBAL_STATUS, which are compared, show the overflows themselves.
fn pmu_events(trace: &std::path::Path) -> Vec<String> {
    let text = std::fs::read_to_string(trace).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "i" && !e["name"].as_str().unwrap().starts_with("overflow"))
        .map(|e| format!("{} {}", e["name"], e["args"]))
        .collect()
}

fn run(engine: &str, profile: &str, guest: &str, args: &[&str]) -> (Run, serde_json::Value, Vec<String>) {
    let name = format!("engines-{engine}-{profile}-{guest}");
    let trace = tmp_dir("engines").join(format!("{name}.trace.json"));
    let g = format!("guest:{guest}");
    let mut a = vec!["--backend", "precise", "--precise-engine", engine, "--profile", profile];
    a.extend(["--trace", trace.to_str().unwrap(), "--timeout", "300", &g, "--"]);
    a.extend(args);
    let (r, report) = emon_json(&name, &a);
    let events = pmu_events(&trace);
    (r, report, events)
}

fn same_under_both_engines(profile: &str) {
    same_under_both_engines_for(profile, GUESTS);
}

fn same_under_both_engines_for(profile: &str, guests: &[(&str, &[&str])]) {
    if !kvm_available() {
        return;
    }
    for (guest, args) in guests {
        let (tcg, tcg_report, tcg_events) = run("tcg", profile, guest, args);
        let (step, step_report, step_events) = run("step", profile, guest, args);
        tcg.assert_status(step.status);
        assert_eq!(tcg.stdout, step.stdout, "{guest} on {profile}: the guest saw different counts");
        assert_eq!(tcg_report["pmis"], step_report["pmis"], "{guest} on {profile}: PMIs");
        assert_eq!(tcg_events, step_events, "{guest} on {profile}: PMU accesses and PMIs in the trace");
        let summary = |r: &serde_json::Value| r["backend"]["summary"].as_str().unwrap().to_string();
        assert!(summary(&step_report).contains("single-stepped (--precise-engine step)"), "{}", summary(&step_report));
        assert!(summary(&tcg_report).contains("TCG engine:"), "{}", summary(&tcg_report));
    }
}

#[test]
fn same_counts_under_nehalem() {
    same_under_both_engines("nehalem");
}

#[test]
fn same_counts_under_skylake() {
    same_under_both_engines("skylake");
}

#[test]
fn same_counts_under_icelake() {
    same_under_both_engines("icelake");
}

#[test]
fn same_counts_under_core2() {
    same_under_both_engines("core2");
}

/// The NetBurst PMU: the counting guest without its user-mode part (single-stepping cannot count
/// CPL3 code on a host like this build machine), and the register guest.
#[test]
fn same_counts_under_pentium4() {
    same_under_both_engines_for("pentium4", &[("netburst-counters", &["user=0"]), ("netburst-msrs", &[])]);
}

/// The engine is not a no-op: on the loops it retires nearly everything.
#[test]
fn the_engine_runs_the_loops() {
    if !kvm_available() {
        return;
    }
    let (r, report, _) = run("tcg", "skylake", "loops", &["calibrate=1000000", "iterations=100000", "passes=2"]);
    r.assert_status(0).assert_no_failures();
    let summary = report["backend"]["summary"].as_str().unwrap();
    let number_after = |key: &str| -> u64 {
        let rest = summary.split(key).nth(1).unwrap_or_else(|| panic!("{summary}"));
        rest.trim_start().split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap()
    };
    let (counted, by_engine) = (number_after("precise backend:"), number_after("TCG engine:"));
    assert!(counted > 3_000_000, "{summary}");
    assert!(by_engine * 1000 > counted * 999, "the engine retired {by_engine} of {counted}: {summary}");
}

/// User mode: the engine counts it exactly (`guest:user-mode` checks the counts and a PMI from
/// CPL3); single-stepping cannot on a host like this build machine, and then says so instead of
/// counting wrong in silence.
#[test]
fn user_mode_counts_in_the_engine_and_stepping_says_when_it_cannot() {
    if !kvm_available() {
        return;
    }
    let (tcg, report, _) = run("tcg", "skylake", "user-mode", &[]);
    tcg.assert_status(0).assert_no_failures();
    assert!(!report["summary"].as_str().unwrap().contains("NOT EXACT"), "{report:#}");
    let (step, report, _) = run("step", "skylake", "user-mode", &[]);
    if step.status != 0 {
        let summary = report["summary"].as_str().unwrap();
        assert!(
            summary.contains("NOT EXACT: user-mode (CPL3) code"),
            "stepping miscounted user mode silently: {summary}"
        );
    }
}

/// `--cpl0`: whether CPL0 code runs in KVM or in the TCG engine while nothing counts changes
/// nothing a guest can see but speed: every guest that runs CPL0 code with nothing counting
/// (completions, RDPMC at the #GP handler, the guest's own single-stepping and breakpoints,
/// INT3, XSAVE) prints the same under both; and the engine really ran that code.
#[test]
fn cpl0_in_kvm_or_in_the_engine_gives_the_same_output() {
    if !kvm_available() {
        return;
    }
    let mut guests: Vec<(&str, &[&str])> = GUESTS.to_vec();
    // Not guest:cpuid-report, which prints CPUID.01H:EBX whole: this host puts the APIC ID of the
    // physical CPU the vCPU happens to run on in bits 31:24, whatever emon's table says.
    guests.extend([
        ("cpl0-completion", &[][..]),
        ("rdpmc", &[]),
        ("user-mode", &[]),
        ("msr-semantics", &[]),
        ("model-msrs", &[]),
        ("page-tables", &[]),
    ]);
    for (guest, args) in guests {
        let g = format!("guest:{guest}");
        let outputs: Vec<(Run, serde_json::Value)> = ["kvm", "tcg"]
            .iter()
            .map(|cpl0| {
                let mut a = vec!["--profile", "skylake", "--cpl0", cpl0, "--timeout", "300", &g, "--"];
                a.extend(args);
                emon_json(&format!("cpl0-{cpl0}-{guest}"), &a)
            })
            .collect();
        let (kvm, tcg) = (&outputs[0], &outputs[1]);
        tcg.0.assert_status(kvm.0.status);
        assert_eq!(tcg.0.stdout, kvm.0.stdout, "{guest}: the guest saw something else with CPL0 in the engine");
        let summary = tcg.1["backend"]["summary"].as_str().unwrap();
        let in_engine: u64 = summary
            .split("with nothing counting, ")
            .nth(1)
            .and_then(|t| t.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{guest}: {summary}"));
        assert!(in_engine > 0, "{guest}: no CPL0 code ran in the engine: {summary}");
        let kvm_summary = kvm.1["backend"]["summary"].as_str().unwrap();
        assert!(
            !kvm_summary.contains("nothing counting") || kvm_summary.contains("nothing counting, 0 CPL0"),
            "{guest}"
        );
    }
}

/// PEBS at CPL0 runs in the engine, which stops short of every overflow and of the event that
/// triggers an armed assist (SDM 18.6.1.1), so the stepper writes every record: the records, the
/// index, the thresholds and the PMIs `guest:pebs` checks are the same as when every instruction
/// is stepped, in every PEBS format, and the engine ran some of the counted code.
#[test]
fn pebs_records_are_the_same_under_both_engines() {
    if !kvm_available() {
        return;
    }
    for profile in ["core2", "nehalem", "skylake", "icelake"] {
        let run = |engine: &str| {
            let name = format!("engines-pebs-{engine}-{profile}");
            let args = ["--backend", "precise", "--precise-engine", engine, "--profile", profile];
            let mut a = args.to_vec();
            a.extend(["--debug-store", "on", "--timeout", "300", "guest:pebs"]);
            emon_json(&name, &a)
        };
        let ((tcg, report), (step, _)) = (run("tcg"), run("step"));
        tcg.assert_status(0);
        step.assert_status(0);
        // Where emon runs the code it answers CPUID from its table, and where KVM runs it (the
        // stepper, while nothing counts) this host may override bits such as DS (README, "CPUID
        // fidelity"): the records are what must agree.
        let records = |out: &str| out.lines().filter(|l| !l.starts_with("CPUID.")).collect::<Vec<_>>().join("\n");
        assert_eq!(records(&tcg.stdout), records(&step.stdout), "{profile}: guest:pebs differs between the engines");
        let summary = report["backend"]["summary"].as_str().unwrap();
        assert!(!summary.contains("TCG engine: 0 of them"), "{profile}: the engine ran nothing: {summary}");
    }
}
