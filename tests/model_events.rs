//! Model-specific events (README, "Model-specific events"): guest:model-events under every
//! profile, what emon says of an event it does not count or that a guest programs on a counter
//! its list does not give it, and that the guest checks every event emon counts exactly.
mod common;
use common::*;
use emon::pmu::Fidelity;
use emon::profile::Profile;

/// Every exact event of every shipped list is one the guest counts (its expectations name it): the
/// guest's coverage follows the lists and the meanings.
#[test]
fn the_guest_checks_every_exact_event() {
    let guest = include_str!("../guest/src/bin/model-events.rs");
    let mut missing = Vec::new();
    for name in Profile::builtin_names() {
        let p = Profile::load(name).expect("built in");
        // The architectural and NetBurst events are the other guests'.
        for section in emon::profile::event_listing(&p).into_iter().filter(|s| s.title.starts_with("model-specific")) {
            for row in section.rows.iter().filter(|r| r.fidelity() == Fidelity::Exact && !r.filtered) {
                let event = row.text.split_whitespace().next().unwrap_or("");
                let quoted = format!("\"{event}\"");
                // The fixed counters' events are the architectural guests'.
                let fixed = row.text.contains("FIXED_CTR");
                if !fixed && !guest.contains(&quoted) {
                    missing.push(format!("{event} ({name})"));
                }
            }
        }
    }
    assert!(missing.is_empty(), "exact events guest:model-events does not check: {missing:?}");
}

#[test]
fn every_profile_counts_its_cpus_events() {
    if !kvm_available() {
        return;
    }
    for profile in ["core2", "nehalem", "sandybridge", "skylake", "icelake"] {
        let r = emon(&["run", "--profile", profile, "guest:model-events"]);
        r.assert_status(0).assert_no_failures();
        assert!(r.stdout.contains(&format!("event list: {profile}")), "{}", r.stdout);
        assert!(!r.stderr.contains("NOT EXACT"), "{profile}: {}", r.stderr);
    }
    // rr's event, exactly, on every counter.
    let r = emon(&["run", "--profile", "skylake", "guest:model-events"]);
    assert!(r.stdout.contains("PASS: BR_INST_RETIRED.CONDITIONAL = 5 on IA32_PMC 0x0f"), "{}", r.stdout);
}

/// An event emon does not count reads 0 and is named NOT EXACT in the summary and --json; so is
/// an event programmed on a counter its list does not give it.
#[test]
fn uncounted_and_misplaced_events_are_not_exact_by_name() {
    if !kvm_available() {
        return;
    }
    let (r, json) =
        emon_json("model-events-uncounted", &["--profile", "skylake", "guest:model-events", "--", "uncounted=1"]);
    r.assert_status(0).assert_no_failures();
    let note =
        "NOT EXACT: counters counted events emon does not derive, and counted 0: IA32_PMC0 UOPS_ISSUED.ANY (0x0e/0x01)";
    assert!(r.stderr.contains(note), "{}", r.stderr);
    let notes = json["backend"]["notes"].to_string();
    assert!(notes.contains("UOPS_ISSUED.ANY (0x0e/0x01)"), "{json:#}");

    let (r, json) =
        emon_json("model-events-misplaced", &["--profile", "skylake", "guest:model-events", "--", "misplaced=1"]);
    r.assert_status(0).assert_no_failures();
    assert!(r.stdout.contains("PASS: INST_RETIRED.PREC_DIST on IA32_PMC0 (not its counter) counted 0"), "{}", r.stdout);
    let note = "does not give them (silicon's count is undefined there), and counted 0: IA32_PMC0 INST_RETIRED.PREC_DIST (0xc0/0x01)";
    assert!(r.stderr.contains(note), "{}", r.stderr);
    assert!(json["backend"]["notes"].to_string().contains("INST_RETIRED.PREC_DIST"), "{json:#}");
}

#[test]
fn emon_events_lists_the_cpus_events_with_their_class() {
    let r = emon(&["events", "--profile", "skylake"]);
    r.assert_status(0);
    let line = |event: &str| {
        r.stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some(event))
            .unwrap_or_else(|| panic!("{event}\n{}", r.stdout))
    };
    assert!(
        line("BR_INST_RETIRED.CONDITIONAL").contains("0xc4/0x01")
            && line("BR_INST_RETIRED.CONDITIONAL").contains(" exact ")
    );
    assert!(line("MEM_LOAD_RETIRED.L3_MISS").contains(" modelled "), "{}", line("MEM_LOAD_RETIRED.L3_MISS"));
    assert!(line("UOPS_ISSUED.ANY").contains(" not counted "), "{}", line("UOPS_ISSUED.ANY"));
    assert!(
        r.stdout.contains("model-specific events of Skylake under profile skylake (from Linux 6.1"),
        "{}",
        r.stdout
    );
    assert!(r.stdout.lines().any(|l| l.starts_with("Events listed: ") && l.contains(" exact, ")), "{}", r.stdout);
}
