//! PMI pending / delivered and IA32_DEBUGCTL freeze-on-PMI, legacy (v2/v3) and streamlined (v4+).

use super::*;

const EN_INT: u64 = msr::PERFEVTSEL_EN | msr::PERFEVTSEL_INT | msr::PERFEVTSEL_USR | msr::PERFEVTSEL_OS | 0xC0;

/// PMC0 counting with INT, one event from overflow.
fn armed(p: &PmuProfile) -> Pmu {
    let mut pmu = Pmu::new(p);
    wr(&mut pmu, msr::IA32_PERFEVTSEL0, EN_INT);
    wr(&mut pmu, msr::IA32_PMC0, 0xFFFF_FFFF);
    pmu
}

#[test]
fn pmi_delivered_clears_pending_without_freeze() {
    for p in [v1(), core2(), nehalem(), skylake()] {
        let mut pmu = armed(&p);
        let ctrl = pmu.global_ctrl();
        assert!(pmu.add_events(CounterId::Gp(0), 1));
        assert!(pmu.pmi_pending());
        pmu.pmi_delivered();
        assert!(!pmu.pmi_pending());
        assert_eq!(pmu.global_ctrl(), ctrl);
        assert!(!pmu.frozen());
        assert!(pmu.counter(CounterId::Gp(0)).counting);
    }
}

#[test]
fn legacy_freeze_clears_global_ctrl_v2_v3() {
    for p in [core2(), nehalem()] {
        let mut pmu = armed(&p);
        wr(&mut pmu, msr::IA32_FIXED_CTR_CTRL, 0x3);
        wr(&mut pmu, msr::IA32_PERF_GLOBAL_CTRL, 1 << 32 | 1);
        wr(&mut pmu, msr::IA32_DEBUGCTL, msr::DEBUGCTL_FREEZE_PERFMON_ON_PMI);
        assert_eq!(pmu.counting().len(), 2);
        assert!(pmu.add_events(CounterId::Gp(0), 1));
        // Not frozen until the PMI is delivered.
        assert_eq!(pmu.counting().len(), 2);
        pmu.take_reprogram();
        pmu.pmi_delivered();
        assert_eq!(rd(&pmu, msr::IA32_PERF_GLOBAL_CTRL), 0);
        assert!(pmu.counting().is_empty());
        assert_eq!(pmu.take_reprogram().counters, 1 << 32 | 1, "the counters GLOBAL_CTRL stopped");
        // CTR_Frz does not exist before v4; the status keeps just the overflow.
        assert_eq!(rd(&pmu, msr::IA32_PERF_GLOBAL_STATUS), 1);
        // Software re-enables through GLOBAL_CTRL.
        wr(&mut pmu, msr::IA32_PERF_GLOBAL_CTRL, 1);
        assert!(pmu.counter(CounterId::Gp(0)).counting);
    }
}

#[test]
fn streamlined_freeze_sets_ctr_frz_v4() {
    for p in [skylake(), icelake()] {
        let mut pmu = armed(&p);
        wr(&mut pmu, msr::IA32_FIXED_CTR_CTRL, 0x3);
        wr(&mut pmu, msr::IA32_PERF_GLOBAL_CTRL, 1 << 32 | 1);
        wr(&mut pmu, msr::IA32_DEBUGCTL, msr::DEBUGCTL_FREEZE_PERFMON_ON_PMI);
        assert!(pmu.add_events(CounterId::Gp(0), 1));
        pmu.take_reprogram();
        pmu.pmi_delivered();
        assert!(pmu.frozen());
        assert_eq!(pmu.take_reprogram().counters, all_counters(&pmu), "CTR_Frz stops every counter");
        // GLOBAL_CTRL unchanged, CTR_Frz set, nothing counts.
        assert_eq!(rd(&pmu, msr::IA32_PERF_GLOBAL_CTRL), 1 << 32 | 1);
        assert_eq!(rd(&pmu, msr::IA32_PERF_GLOBAL_STATUS), msr::GLOBAL_STATUS_CTR_FRZ | 1);
        assert!(pmu.counting().is_empty());
        let s = pmu.counter(CounterId::Gp(0));
        assert!(s.enabled && !s.counting);
        // Clearing only the overflow bit does not unfreeze.
        wr(&mut pmu, msr::IA32_PERF_GLOBAL_STATUS_RESET, 1);
        assert!(pmu.frozen());
        // Clearing CTR_Frz does.
        pmu.take_reprogram();
        wr(&mut pmu, msr::IA32_PERF_GLOBAL_STATUS_RESET, msr::GLOBAL_STATUS_CTR_FRZ);
        assert!(!pmu.frozen());
        assert_eq!(pmu.take_reprogram().counters, all_counters(&pmu));
        assert_eq!(pmu.counting().len(), 2);
    }
}

#[test]
fn status_set_ctr_frz_freezes_v4() {
    let mut pmu = armed(&skylake());
    assert!(pmu.counter(CounterId::Gp(0)).counting);
    wr(&mut pmu, msr::IA32_PERF_GLOBAL_STATUS_SET, msr::GLOBAL_STATUS_CTR_FRZ);
    assert!(pmu.frozen());
    assert!(!pmu.counter(CounterId::Gp(0)).counting);
}

#[test]
fn freeze_lbrs_on_pmi() {
    // Legacy: DEBUGCTL.LBR cleared.
    let mut pmu = armed(&nehalem());
    let dbg = msr::DEBUGCTL_LBR | msr::DEBUGCTL_FREEZE_LBRS_ON_PMI;
    wr(&mut pmu, msr::IA32_DEBUGCTL, dbg);
    assert!(pmu.add_events(CounterId::Gp(0), 1));
    pmu.pmi_delivered();
    assert_eq!(rd(&pmu, msr::IA32_DEBUGCTL), msr::DEBUGCTL_FREEZE_LBRS_ON_PMI);
    assert_eq!(pmu.global_ctrl(), 0xF, "perfmon not frozen without bit 12");
    // Streamlined: LBR_Frz set, DEBUGCTL unchanged, counters not frozen.
    let mut pmu = armed(&skylake());
    wr(&mut pmu, msr::IA32_DEBUGCTL, dbg);
    assert!(pmu.add_events(CounterId::Gp(0), 1));
    pmu.pmi_delivered();
    assert_eq!(rd(&pmu, msr::IA32_DEBUGCTL), dbg);
    assert_eq!(pmu.global_status(), msr::GLOBAL_STATUS_LBR_FRZ | 1);
    assert!(!pmu.frozen());
}

#[test]
fn no_freeze_without_a_pending_pmi() {
    for p in [nehalem(), skylake()] {
        let mut pmu = armed(&p);
        wr(&mut pmu, msr::IA32_DEBUGCTL, msr::DEBUGCTL_FREEZE_PERFMON_ON_PMI);
        let before = pmu.clone();
        pmu.pmi_delivered();
        assert_eq!(pmu, before);
        // Overflow without INT: no PMI, so nothing to freeze either.
        wr(&mut pmu, msr::IA32_PERFEVTSEL0, EN_INT & !msr::PERFEVTSEL_INT);
        assert!(pmu.add_events(CounterId::Gp(0), 1));
        assert!(!pmu.pmi_pending());
        pmu.pmi_delivered();
        assert!(!pmu.frozen());
        assert_ne!(pmu.global_ctrl(), 0);
    }
}

#[test]
fn overflow_of_counter_written_to_max_w() {
    // SDM 18.2.5: a counter holding its maximum overflows on the next counted event.
    for p in [core2(), nehalem(), skylake(), icelake(), v1(), wide64()] {
        let mut pmu = armed(&p);
        assert_eq!(pmu.distance_to_overflow(CounterId::Gp(0)), 1);
        assert!(pmu.add_events(CounterId::Gp(0), 1));
        assert!(pmu.pmi_pending());
        assert_eq!(pmu.global_status() & 1, u64::from(p.version >= 2));
    }
}

/// Every declared counter, as a GLOBAL_CTRL-layout mask.
fn all_counters(pmu: &Pmu) -> u64 {
    pmu.counter_ids().iter().fold(0, |m, id| m | id.status_mask())
}
