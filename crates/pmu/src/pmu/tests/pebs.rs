//! PEBS in the model (SDM 18.6.1.1): an overflow of a PEBS-enabled counter arms PEBS instead of
//! raising a PMI, the next event makes the assist due, and the assist reloads the counter and, at
//! the threshold, sets OvfBuffer with a PMI.

use super::*;
use crate::profile::Profile;

fn skylake_with_pebs() -> Pmu {
    let mut pmu = Pmu::new(&Profile::load("skylake").unwrap().pmu);
    pmu.set_pebs(true);
    wr(&mut pmu, msr::IA32_PERFEVTSEL0, 0x53_00C0);
    wr(&mut pmu, msr::IA32_PEBS_ENABLE, 1);
    wr(&mut pmu, msr::IA32_A_PMC0, 0xFFFF_FFFF_FFFF);
    pmu
}

#[test]
fn presenting_pebs_clears_pebs_unavailable_which_stays_read_only() {
    let mut pmu = Pmu::new(&Profile::load("skylake").unwrap().pmu);
    assert_ne!(rd(&pmu, msr::IA32_MISC_ENABLE) & msr::MISC_ENABLE_PEBS_UNAVAILABLE, 0);
    pmu.set_pebs(true);
    assert!(pmu.pebs_on());
    let misc = rd(&pmu, msr::IA32_MISC_ENABLE);
    assert_eq!(misc & msr::MISC_ENABLE_PEBS_UNAVAILABLE, 0);
    wr(&mut pmu, msr::IA32_MISC_ENABLE, misc | msr::MISC_ENABLE_PEBS_UNAVAILABLE);
    assert_eq!(rd(&pmu, msr::IA32_MISC_ENABLE), misc, "read-only");
}

#[test]
fn an_overflow_arms_pebs_and_the_next_event_makes_the_assist_due() {
    let mut pmu = skylake_with_pebs();
    assert!(pmu.add_events(CounterId::Gp(0), 1), "overflowed");
    assert_eq!(pmu.global_status() & 1, 0, "no overflow bit: PEBS was armed instead");
    assert!(!pmu.pmi_pending(), "no PMI");
    assert_eq!(pmu.pebs_due(), 0, "armed, not yet due: the counter is at 0");
    pmu.add_events(CounterId::Gp(0), 1);
    assert_eq!(pmu.pebs_due(), 1, "the first event after the overflow triggers the assist");
    pmu.pebs_assisted(1, |id| if id == CounterId::Gp(0) { 0xFFFF_FFFF_FFF0 } else { 0 }, false);
    assert_eq!(pmu.pebs_due(), 0);
    assert_eq!(rd(&pmu, msr::IA32_PMC0), 0xFFFF_FFFF_FFF0, "reloaded from the DS area's reset value");
    assert!(!pmu.pmi_pending() && pmu.global_status() == 0, "below the threshold: no PMI");
    // An overflow that counts past 0 in one go is due at once.
    assert!(pmu.add_events(CounterId::Gp(0), 0x12));
    assert_eq!(pmu.pebs_due(), 1);
    pmu.pebs_assisted(1, |_| 0xFFFF_FFFF_FFF0, true);
    assert_eq!(pmu.global_status(), msr::GLOBAL_STATUS_OVF_BUFFER, "the threshold sets OvfBuffer");
    assert!(pmu.pmi_pending(), "and raises a PMI");
}

#[test]
fn writes_disarm_and_without_pebs_presented_an_overflow_is_an_overflow() {
    let mut pmu = skylake_with_pebs();
    pmu.add_events(CounterId::Gp(0), 1);
    wr(&mut pmu, msr::IA32_A_PMC0, 5);
    pmu.add_events(CounterId::Gp(0), 1);
    assert_eq!(pmu.pebs_due(), 0, "a counter write disarms it");
    wr(&mut pmu, msr::IA32_A_PMC0, 0xFFFF_FFFF_FFFF);
    pmu.add_events(CounterId::Gp(0), 1);
    wr(&mut pmu, msr::IA32_PEBS_ENABLE, 0);
    pmu.add_events(CounterId::Gp(0), 1);
    assert_eq!(pmu.pebs_due(), 0, "clearing its PEBS_ENABLE bit disarms it");

    let mut plain = Pmu::new(&Profile::load("skylake").unwrap().pmu);
    wr(&mut plain, msr::IA32_PERFEVTSEL0, 0x53_00C0);
    wr(&mut plain, msr::IA32_PEBS_ENABLE, 1);
    wr(&mut plain, msr::IA32_A_PMC0, 0xFFFF_FFFF_FFFF);
    plain.add_events(CounterId::Gp(0), 2);
    assert_eq!(plain.global_status() & 1, 1, "PEBS not presented: the overflow sets the status bit");
    assert_eq!(plain.pebs_due(), 0);
}

#[test]
fn adaptive_pebs_adds_the_fixed_counters_and_pebs_data_cfg() {
    let mut pmu = Pmu::new(&Profile::load("icelake").unwrap().pmu);
    pmu.set_pebs(true);
    wr(&mut pmu, msr::IA32_PEBS_ENABLE, 0xF_0000_00FF);
    assert_wr_gp(&mut pmu, msr::IA32_PEBS_ENABLE, 1 << 36);
    wr(&mut pmu, msr::MSR_PEBS_DATA_CFG, 0xFF00_000F);
    assert_wr_gp(&mut pmu, msr::MSR_PEBS_DATA_CFG, 1 << 4);
    assert_eq!(pmu.pebs_data_cfg(), 0xFF00_000F);
    wr(&mut pmu, msr::IA32_FIXED_CTR_CTRL, 0x3);
    wr(&mut pmu, msr::IA32_PERF_GLOBAL_CTRL, 1 << 32);
    wr(&mut pmu, msr::IA32_FIXED_CTR0, 0xFFFF_FFFF_FFFF);
    pmu.add_events(CounterId::Fixed(0), 2);
    assert_eq!(pmu.pebs_due(), 1 << 32, "a fixed counter's PEBS assist");
    pmu.pebs_assisted(1 << 32, |id| if id == CounterId::Fixed(0) { 0xFFFF_FFFF_FF00 } else { 0 }, false);
    assert_eq!(rd(&pmu, msr::IA32_FIXED_CTR0), 0xFFFF_FFFF_FF00);
    // Skylake has no adaptive PEBS: no PEBS_DATA_CFG, no fixed-counter PEBS.
    let mut skl = Pmu::new(&Profile::load("skylake").unwrap().pmu);
    assert_eq!(skl.rdmsr(msr::MSR_PEBS_DATA_CFG), Err(GpFault));
    assert_wr_gp(&mut skl, msr::IA32_PEBS_ENABLE, 1 << 32);
}

#[test]
fn adaptive_record_bits_exist_with_pebs_baseline_and_name_the_adaptive_counters() {
    let mut pmu = Pmu::new(&Profile::load("icelake").unwrap().pmu);
    assert_eq!(pmu.pebs_adaptive(), 0);
    wr(&mut pmu, msr::IA32_PERFEVTSEL0 + 3, 0x4_0043_00C0);
    assert_eq!(rd(&pmu, msr::IA32_PERFEVTSEL0 + 3), 0x4_0043_00C0, "Adaptive_Record (bit 34) reads back");
    assert_wr_gp(&mut pmu, msr::IA32_PERFEVTSEL0, 1 << 33);
    // FCi_Adaptive_Record is bit 32 + 4i.
    wr(&mut pmu, msr::IA32_FIXED_CTR_CTRL, 1 << 44 | 1 << 36 | 0x3);
    assert_wr_gp(&mut pmu, msr::IA32_FIXED_CTR_CTRL, 1 << 33);
    assert_wr_gp(&mut pmu, msr::IA32_FIXED_CTR_CTRL, 1 << 48);
    assert_eq!(pmu.pebs_adaptive(), 1 << 3 | 1 << 33 | 1 << 35);
    assert!(pmu.dump().contains("ADAPTIVE"), "the dump names the bit");
    // Without PEBS_BASELINE (Skylake) the bits are reserved.
    let mut skl = Pmu::new(&Profile::load("skylake").unwrap().pmu);
    assert_wr_gp(&mut skl, msr::IA32_PERFEVTSEL0, 0x4_0043_00C0);
    assert_wr_gp(&mut skl, msr::IA32_FIXED_CTR_CTRL, 1 << 32);
    assert_eq!(skl.pebs_adaptive(), 0);
}

#[test]
fn bts_adds_its_debugctl_bits_and_filters_by_cpl() {
    let mut pmu = Pmu::new(&Profile::load("nehalem").unwrap().pmu);
    assert_wr_gp(&mut pmu, msr::IA32_DEBUGCTL, msr::DEBUGCTL_TR);
    assert_ne!(rd(&pmu, msr::IA32_MISC_ENABLE) & msr::MISC_ENABLE_BTS_UNAVAILABLE, 0);
    pmu.set_bts(true);
    assert_eq!(rd(&pmu, msr::IA32_MISC_ENABLE) & msr::MISC_ENABLE_BTS_UNAVAILABLE, 0);
    wr(&mut pmu, msr::IA32_DEBUGCTL, msr::DEBUGCTL_BTS_BITS);
    assert!(!pmu.bts_records(0) && !pmu.bts_records(3), "BTS_OFF_OS and BTS_OFF_USR");
    assert!(pmu.bts_interrupts());
    wr(&mut pmu, msr::IA32_DEBUGCTL, msr::DEBUGCTL_TR | msr::DEBUGCTL_BTS | msr::DEBUGCTL_BTS_OFF_USR);
    assert!(pmu.bts_records(0) && !pmu.bts_records(3));
    wr(&mut pmu, msr::IA32_DEBUGCTL, msr::DEBUGCTL_BTS);
    assert!(!pmu.bts_records(0), "BTS without TR stores nothing");
    assert!(!pmu.pmi_pending());
    pmu.bts_threshold_reached();
    assert!(pmu.pmi_pending(), "the DS interrupt is the PMI");
    assert_eq!(pmu.global_status(), 0, "with no status bit");
}
