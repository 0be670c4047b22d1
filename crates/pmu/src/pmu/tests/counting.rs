//! Power-on state, the counting rules and the CounterState decoding.

use super::*;

#[test]
fn power_on_state() {
    for (name, p) in all_profiles() {
        let pmu = Pmu::new(&p);
        let n = p.gp.min(8);
        for id in pmu.counter_ids() {
            let s = pmu.counter(id);
            assert_eq!((s.value, s.enabled, s.counting), (0, false, false), "{name} {id}");
        }
        for i in 0..n {
            assert_eq!(rd(&pmu, msr::IA32_PERFEVTSEL0 + u32::from(i)), 0);
            assert_eq!(rd(&pmu, msr::IA32_PMC0 + u32::from(i)), 0);
        }
        assert_eq!(rd(&pmu, msr::IA32_DEBUGCTL), 0, "{name}");
        if p.version >= 2 {
            // SDM 18.2.2: GP enables set at power-on, fixed enables clear.
            assert_eq!(rd(&pmu, msr::IA32_PERF_GLOBAL_CTRL), (1u64 << n) - 1, "{name}");
            assert_eq!(rd(&pmu, msr::IA32_PERF_GLOBAL_STATUS), 0, "{name}");
            assert_eq!(rd(&pmu, msr::IA32_FIXED_CTR_CTRL), 0, "{name}");
        }
        if p.version >= 4 {
            assert_eq!(rd(&pmu, msr::IA32_PERF_GLOBAL_INUSE), 0, "{name}");
        }
        if p.version >= 1 {
            assert_eq!(rd(&pmu, msr::IA32_DS_AREA), 0, "{name}");
            assert_eq!(rd(&pmu, msr::IA32_PEBS_ENABLE), 0, "{name}");
        }
        assert!(!pmu.pmi_pending());
        assert!(pmu.reprogram_pending().is_empty());
        assert!(pmu.counting().is_empty());
        assert_eq!(pmu.profile(), &p);
    }
}

#[test]
fn gp_counts_with_en_and_global_ctrl() {
    let mut pmu = Pmu::new(&nehalem());
    let id = CounterId::Gp(2);
    // Power-on GLOBAL_CTRL has the GP bits: EN alone starts counting (v1-style software works).
    wr(&mut pmu, msr::IA32_PERFEVTSEL0 + 2, 0x0041_00C0);
    assert!(pmu.counter(id).counting);
    assert_eq!(pmu.counting().len(), 1);
    wr(&mut pmu, msr::IA32_PERF_GLOBAL_CTRL, 0b1011);
    assert!(!pmu.counter(id).counting);
    assert!(pmu.counter(id).enabled);
    wr(&mut pmu, msr::IA32_PERF_GLOBAL_CTRL, 0b0100);
    assert!(pmu.counter(id).counting);
    wr(&mut pmu, msr::IA32_PERFEVTSEL0 + 2, 0x0001_00C0);
    assert!(!pmu.counter(id).counting);
    assert!(pmu.counting().is_empty());
}

#[test]
fn v1_counts_with_en_alone() {
    let mut pmu = Pmu::new(&v1());
    wr(&mut pmu, msr::IA32_PERFEVTSEL0 + 1, msr::PERFEVTSEL_EN | msr::PERFEVTSEL_OS | 0x3C);
    let s = pmu.counter(CounterId::Gp(1));
    assert!(s.counting && s.enabled && s.os && !s.usr);
    assert_eq!((s.event_select, s.width), (0x3C, 32));
    assert!(!pmu.counter(CounterId::Gp(0)).counting);
}

#[test]
fn fixed_counts_with_en_field_and_global_ctrl() {
    let mut pmu = Pmu::new(&skylake());
    let id = CounterId::Fixed(1);
    wr(&mut pmu, msr::IA32_FIXED_CTR_CTRL, 0x20); // field 1: EN=2 (USR)
    let s = pmu.counter(id);
    assert!(s.enabled && !s.counting, "power-on GLOBAL_CTRL has no fixed bits");
    wr(&mut pmu, msr::IA32_PERF_GLOBAL_CTRL, 1 << 33);
    let s = pmu.counter(id);
    assert!(s.counting && s.usr && !s.os && !s.int && !s.any);
    assert_eq!((s.event_select, s.umask, s.width), (0x3C, 0x00, 48));
    wr(&mut pmu, msr::IA32_FIXED_CTR_CTRL, 0);
    assert!(!pmu.counter(id).counting);
    assert!(!pmu.counter(id).enabled);
}

#[test]
fn fixed_counter_events() {
    let mut pmu = Pmu::new(&icelake());
    wr(&mut pmu, msr::IA32_FIXED_CTR_CTRL, 0xFFFF);
    wr(&mut pmu, msr::IA32_PERF_GLOBAL_CTRL, 0xF_0000_0000);
    let events: Vec<(u8, u8)> = (0..4)
        .map(|i| {
            let s = pmu.counter(CounterId::Fixed(i));
            assert!(s.counting && s.usr && s.os && s.any && s.int);
            (s.event_select, s.umask)
        })
        .collect();
    assert_eq!(events, [(0xC0, 0x00), (0x3C, 0x00), (0x3C, 0x01), (0xA4, 0x01)]);
    assert_eq!(pmu.counting().len(), 4);
}

#[test]
fn gp_counter_state_decodes_perfevtsel() {
    let mut pmu = Pmu::new(&nehalem());
    wr(&mut pmu, msr::IA32_PERF_GLOBAL_CTRL, 0);
    wr(&mut pmu, msr::IA32_PMC0 + 3, 42);
    // CMASK=0x05, INV, EN, ANY, INT, E, USR, umask 0x4F, event 0x2E.
    wr(&mut pmu, msr::IA32_PERFEVTSEL0 + 3, 0x05F5_4F2E);
    let s = pmu.counter(CounterId::Gp(3));
    assert_eq!(
        s,
        CounterState {
            id: CounterId::Gp(3),
            event_select: 0x2E,
            umask: 0x4F,
            usr: true,
            os: false,
            edge: true,
            inv: true,
            cmask: 5,
            any: true,
            int: true,
            enabled: true,
            counting: false,
            value: 42,
            width: 48,
            semantics: Semantics::LlcReference,
        }
    );
}

#[test]
fn architectural_events_say_what_they_count() {
    let gp = CounterId::Gp(0);
    assert_eq!(arch_semantics(gp, 0xC0, 0), Semantics::Instructions);
    assert_eq!(arch_semantics(gp, 0xC4, 0), Semantics::Branches(BranchFilter::ALL));
    assert_eq!(arch_semantics(gp, 0xC5, 0), Semantics::Branches(BranchFilter::MISSES));
    assert_eq!(arch_semantics(gp, 0x3C, 1), Semantics::RefXclk);
    assert_eq!(arch_semantics(CounterId::Fixed(2), 0x3C, 1), Semantics::RefTsc);
    assert_eq!(arch_semantics(gp, 0x2E, 0x4F), Semantics::LlcReference);
    assert_eq!(arch_semantics(gp, 0x2E, 0x41), Semantics::LlcMisses);
    assert_eq!(arch_semantics(gp, 0x2E, 0x3F), Semantics::Unsupported);
    let mut pmu = Pmu::new(&skylake());
    wr(&mut pmu, msr::IA32_PERFEVTSEL0 + 1, 0x43_01C4);
    assert_eq!(pmu.event_name(CounterId::Gp(1)), "IA32_PMC1 event 0xc4 umask 0x01");
}
