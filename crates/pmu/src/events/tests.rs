use super::*;
use crate::pmu::lbr::BranchType;
use crate::pmu::{BranchFilter, Fidelity, InsnClass, Semantics};

fn list(name: &str) -> &'static EventList {
    EventList::named(name).expect("shipped")
}

#[test]
fn the_lists_are_found_by_cpu() {
    assert_eq!(EventList::for_cpu("GenuineIntel", 6, 0x5E).map(|l| l.name), Some("skylake"));
    assert_eq!(EventList::for_cpu("GenuineIntel", 6, 0x1A).map(|l| l.name), Some("nehalem"));
    assert_eq!(EventList::for_cpu("GenuineIntel", 6, 0x17).map(|l| l.name), Some("core2"));
    assert_eq!(EventList::for_cpu("GenuineIntel", 6, 0x2A).map(|l| l.name), Some("sandybridge"));
    assert_eq!(EventList::for_cpu("GenuineIntel", 6, 0x7E).map(|l| l.name), Some("icelake"));
    assert_eq!(EventList::for_cpu("GenuineIntel", 6, 0x3C), None, "Haswell: no list shipped");
    assert_eq!(EventList::for_cpu("GenuineIntel", 0xF, 4), None, "NetBurst");
    assert_eq!(EventList::for_cpu("AuthenticAMD", 6, 0x5E), None);
    for l in LISTS {
        assert!(!l.events.is_empty() && !l.models.is_empty() && !l.source.is_empty(), "{}", l.name);
    }
}

#[test]
fn rr_counts_retired_conditional_branches_on_skylake() {
    // BR_INST_RETIRED.CONDITIONAL, the event rr counts by.
    let l = list("skylake").lookup(0, 0xC4, 0x01, 0, false, false).expect("in the list");
    assert_eq!(l.name, "BR_INST_RETIRED.CONDITIONAL");
    let jcc = BranchFilter { kinds: BranchFilter::kind_bit(BranchType::Jcc), outcomes: BranchFilter::ALL_OUTCOMES };
    assert_eq!(l.semantics, Semantics::Branches(jcc));
    assert_eq!(l.semantics.fidelity(), Fidelity::Exact);
    // Ice Lake names the same count BR_INST_RETIRED.COND (umask 0x11); its 0x01 is COND_TAKEN.
    let icl = list("icelake");
    assert_eq!(icl.lookup(0, 0xC4, 0x11, 0, false, false).map(|l| l.semantics), Some(Semantics::Branches(jcc)));
    let taken = BranchFilter { outcomes: BranchFilter::TAKEN, ..jcc };
    assert_eq!(icl.lookup(7, 0xC4, 0x01, 0, false, false).map(|l| l.semantics), Some(Semantics::Branches(taken)));
}

#[test]
fn counter_restrictions_follow_the_list() {
    let skl = list("skylake");
    // INST_RETIRED.PREC_DIST counts on IA32_PMC1 only; its TOTAL_CYCLES_PS variant (cmask 10, inv)
    // on 0, 2 and 3.
    let prec = |counter, cmask, inv| skl.lookup(counter, 0xC0, 0x01, cmask, inv, false).map(|l| l.semantics);
    assert_eq!(prec(1, 0, false), Some(Semantics::Instructions));
    assert_eq!(prec(0, 0, false), Some(Semantics::WrongCounter));
    assert_eq!(prec(0, 10, true), Some(Semantics::Instructions));
    assert_eq!(prec(1, 10, true), Some(Semantics::WrongCounter));
    // Nehalem's L1D.REPL counts on IA32_PMC0 and IA32_PMC1 only.
    let nhm = list("nehalem");
    assert!(matches!(nhm.lookup(1, 0x51, 0x01, 0, false, false).map(|l| l.semantics), Some(Semantics::Lines(_))));
    assert_eq!(nhm.lookup(2, 0x51, 0x01, 0, false, false).map(|l| l.semantics), Some(Semantics::WrongCounter));
    // Core 2 restricts an event select whatever its umask: MEM_LOAD_RETIRED to IA32_PMC0.
    let core2 = list("core2");
    let mem_load = |counter| core2.lookup(counter, 0xCB, 0x02, 0, false, false);
    assert_eq!(mem_load(0).map(|l| (l.name, l.semantics)), Some(("MEM_LOAD_RETIRED", Semantics::Unsupported)));
    assert_eq!(mem_load(1).map(|l| l.semantics), Some(Semantics::WrongCounter));
    assert_eq!(core2.lookup(0, 0xC4, 0x00, 0, false, false).map(|l| l.name), Some("BR_INST_RETIRED.ANY"));
    // Ice Lake's CPU_CLK_UNHALTED.REF_TSC is a pseudo-encoding for IA32_FIXED_CTR2 only: on a
    // general-purpose counter it is known, on a counter the list does not give it (it used to be
    // unknown, and the run's note said "not derived" where silicon's count is undefined).
    let ref_tsc = list("icelake").lookup(2, 0x00, 0x03, 0, false, false);
    assert_eq!(ref_tsc, Some(Lookup { name: "CPU_CLK_UNHALTED.REF_TSC", semantics: Semantics::WrongCounter }));
    // Nehalem's list gives 0x00/0x00 to all three fixed counters' events: no one event, unknown.
    assert_eq!(list("nehalem").lookup(0, 0x00, 0x00, 0, false, false), None);
    // Skylake's CPU_CLK_UNHALTED.THREAD_P (0x3C/0x00) shares its encoding with the fixed counter's
    // CPU_CLK_UNHALTED.THREAD: a general-purpose counter counts it, by its own name.
    assert_eq!(skl.lookup(0, 0x3C, 0x00, 0, false, false).map(|l| l.name), Some("CPU_CLK_UNHALTED.THREAD_P"));
    // An encoding the list does not know.
    assert_eq!(skl.lookup(0, 0xFF, 0xFF, 0, false, false), None);
}

#[test]
fn every_meaning_names_an_event_of_its_lists() {
    for (lists, name, _) in meaning::MEANINGS {
        let found = LISTS
            .iter()
            .filter(|l| lists.is_empty() || lists.contains(&l.name))
            .any(|l| l.events.iter().any(|e| e.name == *name));
        assert!(found, "{name} is in no list it is meant for");
    }
}

#[test]
fn an_encodings_plain_events_mean_the_same() {
    for l in LISTS {
        for a in l.events.iter().filter(|e| e.plain() && !e.fixed_only()) {
            for b in l.events.iter().filter(|e| e.plain() && !e.fixed_only()) {
                if (a.select, a.umask) == (b.select, b.umask) {
                    let (ma, mb) = (meaning(l.name, a.name), meaning(l.name, b.name));
                    assert!(ma.is_none() || mb.is_none() || ma == mb, "{}: {} and {} differ", l.name, a.name, b.name);
                }
            }
        }
    }
}

#[test]
fn the_events_the_issue_names_are_counted() {
    let counted = |list_name: &str, event: &str| {
        let l = list(list_name);
        let e = l.events.iter().find(|e| e.name == event).unwrap_or_else(|| panic!("{event} in {list_name}"));
        let i = (0..8).find(|&i| e.on_gp(i)).expect("a GP counter");
        l.lookup(i, e.select, e.umask.expect("one umask"), 0, false, false).expect("found").semantics
    };
    for event in [
        "MEM_INST_RETIRED.ALL_LOADS",
        "MEM_INST_RETIRED.ALL_STORES",
        "MEM_INST_RETIRED.LOCK_LOADS",
        "MEM_INST_RETIRED.SPLIT_LOADS",
        "FP_ARITH_INST_RETIRED.SCALAR_DOUBLE",
        "BR_INST_RETIRED.NEAR_CALL",
        "BR_INST_RETIRED.FAR_BRANCH",
    ] {
        assert_eq!(counted("skylake", event).fidelity(), Fidelity::Exact, "{event}");
    }
    for event in ["MEM_LOAD_RETIRED.L1_HIT", "MEM_LOAD_RETIRED.L1_MISS", "MEM_LOAD_RETIRED.L3_MISS", "L1D.REPLACEMENT"]
    {
        assert_eq!(counted("skylake", event).fidelity(), Fidelity::Modelled, "{event}");
    }
    assert_eq!(
        counted("sandybridge", "MEM_UOPS_RETIRED.ALL_LOADS"),
        Semantics::Class(InsnClass::Loads { prefetch: true, uops: true })
    );
    assert_eq!(counted("skylake", "UOPS_ISSUED.ANY"), Semantics::Unsupported);
    // The same name means what the list it is in makes of it.
    assert_ne!(counted("skylake", "MEM_LOAD_RETIRED.L2_HIT"), counted("nehalem", "MEM_LOAD_RETIRED.L2_HIT"));
}
