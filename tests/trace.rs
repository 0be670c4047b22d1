//! `--trace FILE`: a Chrome/Perfetto trace-event JSON file with counter tracks, overflows, PMIs,
//! GLOBAL_CTRL changes and MSR accesses.
mod common;
use common::*;

#[test]
fn trace_is_valid_json_with_counters_overflows_and_pmis() {
    if !kvm_available() {
        return;
    }
    let path = tmp_dir("trace").join("pmi-overflow.json");
    let r = emon(&["run", "--profile", "nehalem", "--trace", path.to_str().unwrap(), "guest:pmi-overflow"]);
    r.assert_status(0);
    let text = std::fs::read_to_string(&path).unwrap();
    let doc: serde_json::Value = serde_json::from_str(&text).expect("the trace is valid JSON");
    let events = doc["traceEvents"].as_array().expect("traceEvents");
    let named = |ph: &str, name: &str| events.iter().filter(|e| e["ph"] == ph && e["name"] == name).count();
    // Counter tracks: the guest counter and GLOBAL_CTRL over time.
    assert!(named("C", "IA32_PMC0") >= 4, "counter samples of IA32_PMC0");
    assert!(named("C", "IA32_PERF_GLOBAL_CTRL") >= 2, "GLOBAL_CTRL changes");
    // Each overflow and each delivered PMI (nehalem: 2 events x fixed-vector and NMI runs).
    assert!(named("i", "overflow IA32_PMC0") >= 4, "overflows");
    // Each PMI is traced with how it went: 2 events x (fixed vector, NMI, masked LVTPC), and
    // the 20 NMIs of the instructions event's sampling run (200,000 instructions, period 10,000).
    let pmis: Vec<&str> =
        events.iter().filter(|e| e["name"] == "PMI").filter_map(|e| e["args"]["delivery"].as_str()).collect();
    assert_eq!(pmis.iter().filter(|d| d.starts_with("Fixed(51)")).count(), 2, "{pmis:?}");
    assert_eq!(pmis.iter().filter(|d| **d == "Nmi").count(), 2 + 20, "{pmis:?}");
    assert_eq!(pmis.iter().filter(|d| **d == "Masked").count(), 2, "{pmis:?}");
    assert!(named("i", "wrmsr IA32_PERFEVTSEL0") > 0 && named("i", "rdmsr IA32_PMC0") > 0, "MSR accesses");
    // Timestamps never go backwards.
    let ts: Vec<f64> = events.iter().filter_map(|e| e["ts"].as_f64()).collect();
    assert!(ts.windows(2).all(|w| w[0] <= w[1]), "timestamps are monotonic");
}

#[test]
fn trace_to_an_unwritable_path_is_a_clear_error() {
    let r = emon(&["run", "--trace", "/nonexistent/dir/t.json"]);
    assert_eq!(r.status, 2, "{}", r.stderr);
    assert!(r.stderr.contains("--trace /nonexistent/dir/t.json"), "{}", r.stderr);
}

#[test]
fn verbose_prints_the_pmu_state_at_the_end() {
    if !kvm_available() {
        return;
    }
    let r = emon(&["run", "--verbose", "--profile", "nehalem", "guest:freeze-on-pmi"]);
    r.assert_status(0);
    assert!(r.stderr.contains("PMU state at the end of the run:"), "{}", r.stderr);
    assert!(r.stderr.contains("IA32_PERF_GLOBAL_CTRL"), "{}", r.stderr);
    assert!(r.stderr.contains("IA32_PERFEVTSEL0"), "{}", r.stderr);
    assert!(r.stderr.contains("IA32_DEBUGCTL"), "{}", r.stderr);
}
