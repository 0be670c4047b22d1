//! Debian's perf inside Linux under every shipped profile: `resources/suites/linux-tools.toml`
//! boots emon's Linux test kernel with the initramfs `scripts/linux-initramfs --tools` builds,
//! whose `emon-tools-test` checks perf stat and perf record of a known loop exactly (README,
//! "Linux user space").
mod common;
use common::*;
use emon::profile::Profile;
use emon::runner::suite;
use std::path::Path;

const SUITE: &str = "resources/suites/linux-tools.toml";

/// Every shipped profile once, with the tools image, the memory it needs and the test as
/// `/init`'s command; the profiles with a PMU but NetBurst expect every exact check to pass; one
/// run adds perf's breakpoint and watchpoint tests (Sigtrap among them) and its test 26, on the
/// model's time, and expects each to pass.
#[test]
fn the_suite_runs_the_tools_test_under_every_shipped_profile() {
    let s = suite::load(Path::new(SUITE)).unwrap();
    let mut seen = Vec::new();
    let mut breakpoints = 0;
    for e in &s.entries {
        assert_eq!(e.initrd.as_deref(), Some("../../target/emon-initramfs-tools/initramfs.cpio"), "line {}", e.line);
        let args = e.args.as_deref().unwrap_or_default();
        assert!(args.starts_with("console=ttyS0 emon_perf_test.run=0 -- emon-tools-test"), "line {}", e.line);
        if args.ends_with("--perf-test Breakpoint,Watchpoint,modify,Object,Sigtrap") {
            let tests = [
                "20: Breakpoint overflow signal handler",
                "23.2: Write Only Watchpoint",
                "26: Object code reading",
                "73: Sigtrap",
            ];
            for test in tests.into_iter().chain(["77: x86 bp modify"]) {
                assert!(e.expect.contains(&format!("PASS: perf test {test}")), "line {}: {test}", e.line);
            }
            assert_eq!(e.guest_time, Some(emon::backend::precise::GuestTime::Model), "line {}", e.line);
            breakpoints += e.profiles.len();
        }
        assert_eq!(e.memory, Some(512), "line {}", e.line);
        assert!(e.expect.contains(&"emon-init: emon-tools-test exited with status 0".to_string()), "line {}", e.line);
        let exact =
            e.expect.contains(&"PASS: perf stat instructions:u of emon-loop: exactly 2 per iteration".to_string());
        for name in &e.profiles {
            let p = Profile::load(name).unwrap();
            let arch = !p.pmu.netburst() && p.pmu.leaf_0a()[0] & 0xFF != 0;
            assert_eq!(exact, arch, "line {}: {name} expects the exact checks iff it has an architectural PMU", e.line);
            seen.push(name.clone());
        }
    }
    seen.sort();
    assert_eq!(seen, Profile::builtin_names(), "every shipped profile, once");
    assert_eq!(breakpoints, 1, "perf's breakpoint tests under one profile");
}

/// Builds (or finds cached) the kernel and the tools image, then runs the suite: every run
/// passes.
#[test]
fn perf_counts_a_known_loop_exactly_inside_linux_under_every_profile() {
    if !kvm_available() {
        return;
    }
    script(&["scripts/linux-kernel"]);
    script(&["scripts/linux-initramfs", "--tools"]);
    for run in run_suite_once_per_profile(SUITE, "linux-tools") {
        let summary = run["emon_summary"].as_str().unwrap_or_default();
        assert!(!summary.contains("user-mode instructions went to KVM"), "user code left to KVM: {summary}");
    }
}
