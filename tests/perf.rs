//! The perf backend: guest counters on host perf events. On a host without hardware events (this
//! build machine) cycles are backed by the vCPU thread's task-clock, so the whole path runs:
//! open, reprogram, overflow signal, PMI. Tests that need hardware events say by name that they
//! did not run here.
mod common;
use common::*;

fn perf_run(args: &[&str]) -> Run {
    let mut a = vec!["run", "--backend", "perf", "--verbose", "--timeout", "120"];
    a.extend_from_slice(args);
    emon(&a)
}

fn host_has_hardware_events() -> bool {
    emon::backend::perf::host_caps(false)
        .hardware
        .contains(&(perf_event_open_sys::bindings::PERF_COUNT_HW_INSTRUCTIONS as u64))
}

#[test]
fn pmi_overflow_passes_on_the_perf_backend() {
    if !kvm_available() {
        return;
    }
    let r = perf_run(&["guest:pmi-overflow"]);
    r.assert_status(0).assert_no_failures();
    assert!(r.stdout.contains("PASS: cycles fixed vector 0x33: the PMI handler ran once"), "{}", r.stdout);
    assert!(r.stdout.contains("PASS: cycles NMI delivery: the PMI handler ran once"), "{}", r.stdout);
    let summary = r.stderr.lines().find(|l| l.starts_with("perf backend:")).unwrap_or_else(|| panic!("{}", r.stderr));
    assert!(!summary.contains(" 0 overflows"), "{summary}");
    if !host_has_hardware_events() {
        assert!(summary.contains("task-clock"), "{summary}");
        assert!(
            summary.contains("counting zero: ") && summary.contains("the host cannot count instructions"),
            "{summary}"
        );
        assert!(r.stdout.contains("SKIP: instructions: this backend cannot count it here"), "{}", r.stdout);
        let line = r.stderr.lines().rev().find(|l| l.starts_with("emon: guest exited")).unwrap();
        assert!(line.contains("backend perf; cycles from the vCPU thread's task-clock"), "{line}");
    }
}

#[test]
fn hardware_event_tests_say_they_did_not_run_here() {
    if host_has_hardware_events() {
        if !kvm_available() {
            return;
        }
        // On a host with a PMU, instructions are counted in hardware for the guest.
        let r = perf_run(&["guest:pmi-overflow"]);
        r.assert_status(0).assert_no_failures();
        assert!(r.stdout.contains("PASS: instructions fixed vector 0x33: the PMI handler ran once"), "{}", r.stdout);
    } else {
        eprintln!(
            "NOT RUN HERE: perf backend instructions-retired in hardware (this host has no hardware PMU for guests)"
        );
    }
}

fn counted(r: &Run) -> u64 {
    let line = r.stdout.lines().find(|l| l.starts_with("bench cycles")).unwrap_or_else(|| panic!("{}", r.stdout));
    line.rsplit("counted=").next().unwrap().parse().unwrap()
}

#[test]
fn cycles_grow_with_guest_work() {
    if !kvm_available() {
        return;
    }
    let small = perf_run(&["guest:bench", "--", "mode=cycles", "n=1000"]);
    let large = perf_run(&["guest:bench", "--", "mode=cycles", "n=300000"]);
    small.assert_status(0);
    large.assert_status(0);
    let (s, l) = (counted(&small), counted(&large));
    assert!(s > 0, "the cycles counter counted nothing");
    assert!(l > 5 * s, "300x the work counted {l} cycles against {s}");
}

#[test]
fn reprogramming_100000_times_leaves_file_descriptors_flat() {
    if !kvm_available() {
        return;
    }
    let (r, report) = emon_json(
        "perf-reprogram",
        &["--backend", "perf", "--timeout", "120", "guest:bench", "--", "mode=reprogram", "n=100000"],
    );
    r.assert_status(0);
    assert!(r.stdout.contains("bench reprogram n=100000"), "{}", r.stdout);
    let summary = report["backend"]["summary"].as_str().unwrap_or_else(|| panic!("{report:#}"));
    assert!(summary.contains("100000 host events opened"), "{summary}");
    assert!(summary.contains("(at most 1 open at once)"), "{summary}");
    let fds = &report["fds"];
    assert!(fds["at_start"].as_u64().is_some_and(|n| n > 0), "{fds}");
    assert_eq!(fds["at_start"], fds["at_end"], "file descriptors grew during the run: {fds}");
}

#[test]
fn pmu_counters_passes_on_the_perf_backend() {
    if !kvm_available() {
        return;
    }
    let r = perf_run(&["guest:pmu-counters"]);
    r.assert_status(0).assert_no_failures();
    // Cycles count and grow with work on every GP counter, and every overflow raises its PMI.
    for i in 0..4 {
        assert!(
            r.stdout.contains(&format!("PASS: IA32_PMC{i} counts UnHalted Core Cycles growing with work")),
            "{}",
            r.stdout
        );
        assert!(
            r.stdout.contains(&format!("PASS: IA32_PMC{i} overflow raises an NMI PMI: the handler ran once")),
            "{}",
            r.stdout
        );
    }
    assert!(r.stdout.contains("PASS: IA32_FIXED_CTR1 counts UnHalted Core Cycles growing with work"), "{}", r.stdout);
}
