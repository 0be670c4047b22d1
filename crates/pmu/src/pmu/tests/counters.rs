//! Counter writes (legacy, full-width, fixed), add_events, overflow, distance, set_value.

use super::*;

const EN_INT: u64 = msr::PERFEVTSEL_EN | msr::PERFEVTSEL_INT | msr::PERFEVTSEL_USR | msr::PERFEVTSEL_OS | 0xC0;
const EN_ONLY: u64 = msr::PERFEVTSEL_EN | msr::PERFEVTSEL_USR | msr::PERFEVTSEL_OS | 0xC0;

#[test]
fn legacy_write_ffffffff_gives_max_w() {
    for (p, max) in [
        (core2(), 0xFF_FFFF_FFFFu64),
        (nehalem(), 0xFFFF_FFFF_FFFF),
        (skylake(), 0xFFFF_FFFF_FFFF),
        (v1(), 0xFFFF_FFFF),
        (wide64(), u64::MAX),
    ] {
        let mut pmu = Pmu::new(&p);
        wr(&mut pmu, msr::IA32_PMC0, 0xFFFF_FFFF);
        assert_eq!(rd(&pmu, msr::IA32_PMC0), max, "v{}", p.version);
        wr(&mut pmu, msr::IA32_PMC0 + 1, 0x7FFF_FFFF);
        assert_eq!(rd(&pmu, msr::IA32_PMC0 + 1), 0x7FFF_FFFF);
    }
}

#[test]
fn legacy_write_ignores_edx() {
    let mut pmu = Pmu::new(&nehalem());
    wr(&mut pmu, msr::IA32_PMC0, 0xFFFF_FFFF_0000_0010);
    assert_eq!(rd(&pmu, msr::IA32_PMC0), 0x10);
    wr(&mut pmu, msr::IA32_PMC0, 0x0000_1234_8000_0000);
    assert_eq!(rd(&pmu, msr::IA32_PMC0), 0xFFFF_8000_0000);
}

#[test]
fn max_then_one_event_overflows_with_pmi_iff_int() {
    for int in [true, false] {
        let mut pmu = Pmu::new(&nehalem());
        wr(&mut pmu, msr::IA32_PERFEVTSEL0, if int { EN_INT } else { EN_ONLY });
        wr(&mut pmu, msr::IA32_PMC0, 0xFFFF_FFFF);
        assert_eq!(pmu.distance_to_overflow(CounterId::Gp(0)), 1);
        assert!(pmu.add_events(CounterId::Gp(0), 1));
        assert_eq!(rd(&pmu, msr::IA32_PMC0), 0);
        assert_eq!(rd(&pmu, msr::IA32_PERF_GLOBAL_STATUS), 1);
        assert_eq!(pmu.pmi_pending(), int);
    }
}

#[test]
fn add_events_without_wrap_changes_nothing_else() {
    let mut pmu = Pmu::new(&skylake());
    wr(&mut pmu, msr::IA32_PERFEVTSEL0, EN_INT);
    wr(&mut pmu, msr::IA32_PMC0, 0x7FFF_FFFF);
    pmu.take_reprogram();
    assert!(!pmu.add_events(CounterId::Gp(0), 10));
    assert_eq!(rd(&pmu, msr::IA32_PMC0), 0x8000_0009);
    assert_eq!(pmu.global_status(), 0);
    assert!(!pmu.pmi_pending());
    assert!(pmu.reprogram_pending().is_empty());
}

#[test]
fn add_events_wraps_modulo_and_reports_once() {
    let mut pmu = Pmu::new(&core2()); // 40-bit
    wr(&mut pmu, msr::IA32_PMC0, 0xFFFF_FFF0); // sign-extended: 2^40 - 16
                                               // n = 3 * 2^40 + 20 wraps several times; reported once.
    let n = 3u64 * (1 << 40) + 20;
    assert!(pmu.add_events(CounterId::Gp(0), n));
    assert_eq!(rd(&pmu, msr::IA32_PMC0), 4);
    assert_eq!(pmu.global_status(), 1);
    assert!(!pmu.pmi_pending(), "INT not set");
    assert!(!pmu.add_events(CounterId::Gp(0), 0));
}

#[test]
fn overflow_sets_status_of_every_counter_kind() {
    let mut pmu = Pmu::new(&icelake());
    wr(&mut pmu, msr::IA32_PMC0 + 7, 0xFFFF_FFFF);
    assert!(pmu.add_events(CounterId::Gp(7), 1));
    wr(&mut pmu, msr::IA32_FIXED_CTR0 + 3, 0xFFFF_FFFF_FFFF);
    assert!(pmu.add_events(CounterId::Fixed(3), 2));
    assert_eq!(rd(&pmu, msr::IA32_FIXED_CTR0 + 3), 1);
    assert_eq!(pmu.global_status(), 1 << 7 | 1 << 35);
    assert!(!pmu.pmi_pending());
}

#[test]
fn fixed_overflow_pmi_follows_pmi_bit() {
    let mut pmu = Pmu::new(&nehalem());
    // FIXED_CTR1: EN=3, no PMI; FIXED_CTR2: EN=3, PMI.
    wr(&mut pmu, msr::IA32_FIXED_CTR_CTRL, 0xB30);
    wr(&mut pmu, msr::IA32_FIXED_CTR0 + 1, u64::MAX);
    assert!(pmu.add_events(CounterId::Fixed(1), 1));
    assert!(!pmu.pmi_pending());
    wr(&mut pmu, msr::IA32_FIXED_CTR0 + 2, u64::MAX);
    assert!(pmu.add_events(CounterId::Fixed(2), 1));
    assert!(pmu.pmi_pending());
    assert_eq!(pmu.global_status(), 0b11 << 33);
}

#[test]
fn v1_overflow_has_no_status_but_pmi_if_int() {
    let mut pmu = Pmu::new(&v1());
    wr(&mut pmu, msr::IA32_PERFEVTSEL0, EN_INT);
    wr(&mut pmu, msr::IA32_PMC0, 0xFFFF_FFFF);
    assert_eq!(rd(&pmu, msr::IA32_PMC0), 0xFFFF_FFFF);
    assert!(pmu.add_events(CounterId::Gp(0), 1));
    assert_eq!(pmu.global_status(), 0);
    assert!(pmu.pmi_pending());
}

#[test]
fn full_width_alias_writes() {
    let mut pmu = Pmu::new(&skylake());
    wr(&mut pmu, msr::IA32_A_PMC0, 0xFFFF_FFFF_FFFF);
    assert_eq!(rd(&pmu, msr::IA32_PMC0), 0xFFFF_FFFF_FFFF);
    assert_eq!(rd(&pmu, msr::IA32_A_PMC0), 0xFFFF_FFFF_FFFF);
    wr(&mut pmu, msr::IA32_A_PMC0 + 3, 0x1234_5678_9ABC);
    assert_eq!(rd(&pmu, msr::IA32_PMC0 + 3), 0x1234_5678_9ABC);
    // Bit 48 on a 48-bit counter: #GP, nothing changes.
    assert_wr_gp(&mut pmu, msr::IA32_A_PMC0, 1 << 48);
    assert_wr_gp(&mut pmu, msr::IA32_A_PMC0, u64::MAX);
    assert_wr_gp(&mut pmu, msr::IA32_A_PMC0 + 1, 1 << 63);
    // The legacy path still sign-extends on an FW_WRITE profile.
    wr(&mut pmu, msr::IA32_PMC0, 0x8000_0000);
    assert_eq!(rd(&pmu, msr::IA32_A_PMC0), 0xFFFF_8000_0000);
}

#[test]
fn sixty_four_bit_counters() {
    let mut pmu = Pmu::new(&wide64());
    let id = CounterId::Gp(0);
    // Anything goes through the alias.
    wr(&mut pmu, msr::IA32_A_PMC0, u64::MAX);
    assert_eq!(pmu.distance_to_overflow(id), 1);
    assert!(pmu.add_events(id, 1));
    assert_eq!(rd(&pmu, msr::IA32_PMC0), 0);
    // 2^64 events away does not fit: u64::MAX ("never").
    assert_eq!(pmu.distance_to_overflow(id), u64::MAX);
    assert!(!pmu.add_events(id, u64::MAX));
    assert_eq!(rd(&pmu, msr::IA32_PMC0), u64::MAX);
    assert!(pmu.add_events(id, u64::MAX));
    assert_eq!(rd(&pmu, msr::IA32_PMC0), u64::MAX - 1);
    wr(&mut pmu, msr::IA32_PMC0, 0x8000_0000);
    assert_eq!(rd(&pmu, msr::IA32_PMC0), 0xFFFF_FFFF_8000_0000);
    assert_eq!(pmu.distance_to_overflow(id), 0x8000_0000);
    // Fixed counters at 64 bits keep every bit.
    wr(&mut pmu, msr::IA32_FIXED_CTR0, u64::MAX);
    assert_eq!(rd(&pmu, msr::IA32_FIXED_CTR0), u64::MAX);
    assert_eq!(pmu.distance_to_overflow(CounterId::Fixed(0)), 1);
}

#[test]
fn distance_to_overflow_values() {
    let mut pmu = Pmu::new(&nehalem());
    assert_eq!(pmu.distance_to_overflow(CounterId::Gp(0)), 1 << 48);
    wr(&mut pmu, msr::IA32_PMC0, 0xFFFF_FF00);
    assert_eq!(pmu.distance_to_overflow(CounterId::Gp(0)), 0x100);
    assert_eq!(pmu.distance_to_overflow(CounterId::Fixed(0)), 1 << 48);
    let pmu = Pmu::new(&v1());
    assert_eq!(pmu.distance_to_overflow(CounterId::Gp(1)), 1 << 32);
}

#[test]
fn fixed_counter_writes_truncate_to_fixed_width() {
    let mut pmu = Pmu::new(&core2());
    wr(&mut pmu, msr::IA32_FIXED_CTR0, u64::MAX);
    assert_eq!(rd(&pmu, msr::IA32_FIXED_CTR0), 0xFF_FFFF_FFFF);
    wr(&mut pmu, msr::IA32_FIXED_CTR0 + 2, 0x1234_5678_9ABC_DEF0);
    assert_eq!(rd(&pmu, msr::IA32_FIXED_CTR0 + 2), 0x78_9ABC_DEF0);
    let mut pmu = Pmu::new(&skylake());
    wr(&mut pmu, msr::IA32_FIXED_CTR0 + 1, 0xFFFF_0000_0000_0001);
    assert_eq!(rd(&pmu, msr::IA32_FIXED_CTR0 + 1), 1);
}

#[test]
fn set_value_masks_and_has_no_side_effects() {
    let mut pmu = Pmu::new(&skylake());
    wr(&mut pmu, msr::IA32_PERFEVTSEL0, EN_INT);
    pmu.take_reprogram();
    pmu.set_value(CounterId::Gp(0), u64::MAX);
    assert_eq!(rd(&pmu, msr::IA32_PMC0), 0xFFFF_FFFF_FFFF);
    pmu.set_value(CounterId::Fixed(2), u64::MAX);
    assert_eq!(rd(&pmu, msr::IA32_FIXED_CTR0 + 2), 0xFFFF_FFFF_FFFF);
    assert!(pmu.reprogram_pending().is_empty());
    assert_eq!(pmu.global_status(), 0);
    assert!(!pmu.pmi_pending());
}

#[test]
fn undeclared_counters_are_inert() {
    let mut pmu = Pmu::new(&nehalem());
    let before = pmu.clone();
    for id in [CounterId::Gp(4), CounterId::Gp(255), CounterId::Fixed(3), CounterId::Fixed(200)] {
        assert!(!pmu.add_events(id, u64::MAX));
        pmu.set_value(id, 5);
        assert_eq!(pmu.distance_to_overflow(id), u64::MAX);
        let s = pmu.counter(id);
        assert_eq!((s.id, s.value, s.width, s.enabled, s.counting), (id, 0, 0, false, false));
    }
    assert_eq!(pmu, before);
    let mut pmu = Pmu::new(&v1());
    assert!(!pmu.add_events(CounterId::Fixed(0), 1));
}

#[test]
fn status_bit_numbering() {
    assert_eq!(CounterId::Gp(0).status_bit(), 0);
    assert_eq!(CounterId::Gp(7).status_bit(), 7);
    assert_eq!(CounterId::Fixed(0).status_bit(), 32);
    assert_eq!(CounterId::Fixed(3).status_bit(), 35);
    assert_eq!(CounterId::Fixed(255).status_mask(), 0);
    assert_eq!(CounterId::Gp(0).to_string(), "IA32_PMC0");
    assert_eq!(CounterId::Fixed(2).to_string(), "IA32_FIXED_CTR2");
}
