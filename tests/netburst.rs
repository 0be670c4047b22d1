//! The NetBurst PMU end to end (README, "The NetBurst PMU"): the `pentium4` profile's guests pass
//! exactly and deterministically, the architectural guests skip with the reason, `emon cpuid` and
//! `emon events` show the NetBurst registers and events, the perf backend is refused, and what emon
//! does not model is said in the run summary.
mod common;
use common::*;

fn run(args: &[&str]) -> Run {
    let mut a = vec!["run", "--backend", "precise", "--timeout", "120", "--profile", "pentium4"];
    a.extend(args);
    emon(&a)
}

#[test]
fn the_netburst_guests_pass_exactly_and_alike_twice() {
    if !kvm_available() {
        return;
    }
    for guest in ["guest:netburst-counters", "guest:netburst-msrs"] {
        let a = run(&[guest]);
        a.assert_status(0).assert_no_failures();
        assert!(!a.stdout.contains("SKIP:"), "{guest}: {}", a.stdout);
        assert!(!a.summary().starts_with("SUMMARY: 0 tests"), "{guest} ran nothing");
        // netburst-msrs sets every writable bit, the unmodelled ones too, and the summary says so.
        let not_exact = a.stderr.contains("NOT EXACT: NetBurst: the guest set");
        assert_eq!(not_exact, guest == "guest:netburst-msrs", "{guest}: {}", a.stderr);
        let b = run(&[guest]);
        assert_eq!(a.stdout, b.stdout, "{guest}: two runs differ");
    }
    // The walkthrough's function, counted by instr_retired on IQ_COUNTER0 through CRU_ESCR0.
    let r = run(&["guest:netburst-counters", "--", "user=0"]);
    r.assert_status(0).assert_no_failures();
}

#[test]
fn the_netburst_guests_skip_elsewhere_and_the_architectural_ones_skip_on_netburst() {
    if !kvm_available() {
        return;
    }
    for guest in ["guest:netburst-counters", "guest:netburst-msrs"] {
        let r = emon(&["run", "--profile", "skylake", guest]);
        r.assert_status(0).assert_no_failures();
        assert!(r.stdout.contains("SKIP: ") && r.stdout.contains("NetBurst"), "{guest}: {}", r.stdout);
    }
    for guest in ["guest:msr-semantics", "guest:rdpmc", "guest:count-instructions", "guest:pmu-counters"] {
        let r = run(&[guest]);
        r.assert_status(0).assert_no_failures();
        assert!(r.stdout.contains("SKIP: "), "{guest}: {}", r.stdout);
    }
    let r = run(&["guest:hal-emon"]);
    r.assert_status(0).assert_no_failures();
    assert!(r.stdout.contains("PASS: the HAL does not choose the Emon profile interface on a NetBurst processor"));
    assert!(r.stdout.contains("hal-emon: 0 of 12 Emon profile sources supported"), "{}", r.stdout);
}

#[test]
fn cpuid_and_events_show_the_netburst_pmu() {
    let r = emon(&["cpuid", "--profile", "pentium4"]);
    r.assert_status(0);
    for want in
        ["NetBurst PMU: 18 counters x 40 bits", "MSR_IQ_CCCR4 (0x370)", "4:MSR_CRU_ESCR0", "MSR_CRU_ESCR5 (0x3E1)"]
    {
        assert!(r.stdout.contains(want), "emon cpuid lacks {want:?}\n{}", r.stdout);
    }
    let r = emon(&["events", "--profile", "pentium4"]);
    r.assert_status(0);
    for want in ["global_power_events", "retired_branch_type", "Any other ESCR event counts 0"] {
        assert!(r.stdout.contains(want), "emon events lacks {want:?}\n{}", r.stdout);
    }
    let line = |event: &str, bit: &str| {
        r.stdout.lines().find(|l| l.starts_with(event) && l.contains(bit)).unwrap_or_else(|| panic!("{event} {bit}"))
    };
    assert!(line("instr_retired", "NBOGUSNTAG").ends_with("counted exactly"));
    assert!(line("instr_retired", "BOGUSTAG").contains("counts 0 exactly"));
    assert!(line("retired_branch_type", "CONDITIONAL").ends_with("counted exactly"));
}

#[test]
fn the_perf_backend_refuses_netburst_and_auto_chooses_precise() {
    let r = emon(&["run", "--backend", "perf", "--profile", "pentium4", "guest:netburst-counters"]);
    r.assert_status(2);
    assert!(r.stderr.contains("--backend perf: profile pentium4 presents the NetBurst PMU"), "{}", r.stderr);
    assert_eq!(r.stderr.lines().count(), 1, "one line: {}", r.stderr);
    if !kvm_available() {
        return;
    }
    let r = emon(&["run", "--verbose", "--profile", "pentium4", "guest:netburst-msrs"]);
    r.assert_status(0);
    assert!(r.stderr.contains("emon: backend precise: the profile presents the NetBurst PMU"), "{}", r.stderr);
}

/// An ESCR event emon does not derive counts 0 and the summary says so, naming it.
#[test]
fn an_event_emon_does_not_derive_is_not_exact() {
    if !kvm_available() {
        return;
    }
    let (r, json) = emon_json(
        "netburst-unsupported",
        &["--backend", "precise", "--profile", "pentium4", "guest:netburst-counters", "--", "unsupported=1"],
    );
    r.assert_status(0);
    let summary = json["summary"].as_str().unwrap_or_default().to_string();
    assert!(summary.contains("NOT EXACT: counters counted events emon does not derive"), "{summary}");
    assert!(summary.contains("MSR_BSU_ESCR0 event 0x05"), "{summary}");
}

/// `--trace` names the NetBurst registers as the profile has them: 0x309 is MSR_FLAME_COUNTER1
/// here, not IA32_FIXED_CTR0, and the counters' values are sampled under their NetBurst names.
#[test]
fn the_trace_names_the_netburst_registers() {
    if !kvm_available() {
        return;
    }
    let trace = tmp_dir("netburst").join("netburst-msrs.trace.json");
    let r = run(&["--trace", trace.to_str().unwrap(), "guest:netburst-msrs"]);
    r.assert_status(0).assert_no_failures();
    let text = std::fs::read_to_string(&trace).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let names: Vec<&str> = v["traceEvents"].as_array().unwrap().iter().filter_map(|e| e["name"].as_str()).collect();
    for want in ["wrmsr MSR_FLAME_COUNTER1", "wrmsr MSR_IQ_CCCR0", "wrmsr MSR_CRU_ESCR0", "MSR_IQ_COUNTER0"] {
        assert!(names.contains(&want), "the trace lacks {want:?}");
    }
    assert!(!names.contains(&"wrmsr IA32_FIXED_CTR0"), "0x309 is not a fixed counter on NetBurst");
}
