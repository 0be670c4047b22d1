//! The hardware prefetchers' control (README, "The cache model"): MSR_MISC_FEATURE_CONTROL from
//! Nehalem on, IA32_MISC_ENABLE's disable bits on Core 2 and NetBurst, with each CPU's
//! reserved-bit behaviour.

use super::*;
use crate::profile::{PrefetcherSet, Profile};

/// The PMU of built-in profile `name` with its prefetchers.
fn with_prefetchers(name: &str) -> Pmu {
    let p = Profile::load(name).expect("built-in profile");
    Pmu::new(&p.pmu).with_prefetchers(p.cache.prefetchers)
}

#[test]
fn msr_misc_feature_control_stores_the_measured_bits_and_turns_prefetchers_off() {
    let mut pmu = with_prefetchers("skylake");
    assert!(Pmu::owns(msr::MSR_MISC_FEATURE_CONTROL), "trapped, so a guest WRMSR reaches the model");
    assert_eq!(pmu.rdmsr(msr::MSR_MISC_FEATURE_CONTROL), Ok(0), "every prefetcher on at power-on");
    assert_eq!(pmu.prefetchers_on(), PrefetcherSet::ALL);
    wr(&mut pmu, msr::MSR_MISC_FEATURE_CONTROL, 0b0101);
    assert_eq!(rd(&pmu, msr::MSR_MISC_FEATURE_CONTROL), 0b0101);
    assert_eq!(pmu.prefetchers_on(), PrefetcherSet::ADJACENT_LINE.union(PrefetcherSet::IP_STRIDE));
    assert!(pmu.unmodelled().contains(Unmodelled::PREFETCHERS_OFF));
    assert!(pmu.dump().contains("MSR_MISC_FEATURE_CONTROL") && pmu.dump().contains("prefetchers off: streamer, dcu"));
    // Bit 11 is stored (measured on the i7-6700K) and turns nothing off; every other bit #GPs
    // and changes nothing.
    wr(&mut pmu, msr::MSR_MISC_FEATURE_CONTROL, 1 << 11);
    assert_eq!(pmu.prefetchers_on(), PrefetcherSet::ALL);
    assert!(!pmu.unmodelled().contains(Unmodelled::PREFETCHERS_OFF));
    for bit in (4..64).filter(|&b| b != 11) {
        assert_wr_gp(&mut pmu, msr::MSR_MISC_FEATURE_CONTROL, 1 << bit);
    }
    assert_eq!(rd(&pmu, msr::MSR_MISC_FEATURE_CONTROL), 1 << 11);
    // IA32_MISC_ENABLE has no prefetcher bits here (the i7-6700K #GPs on them).
    let misc = rd(&pmu, msr::IA32_MISC_ENABLE);
    for bit in [9, 19, 37, 39] {
        assert_wr_gp(&mut pmu, msr::IA32_MISC_ENABLE, misc | 1 << bit);
    }
    // Nehalem: bits 3:0 only, as the disclosure says.
    let mut nhm = with_prefetchers("nehalem");
    wr(&mut nhm, msr::MSR_MISC_FEATURE_CONTROL, 0xF);
    assert_eq!(nhm.prefetchers_on(), PrefetcherSet::NONE);
    assert_wr_gp(&mut nhm, msr::MSR_MISC_FEATURE_CONTROL, 1 << 11);
}

#[test]
fn core_2_and_netburst_turn_prefetchers_off_in_misc_enable() {
    let mut pmu = with_prefetchers("core2");
    assert_eq!(pmu.rdmsr(msr::MSR_MISC_FEATURE_CONTROL), Err(GpFault), "no MSR 0x1A4 on Core 2");
    assert_wr_gp(&mut pmu, msr::MSR_MISC_FEATURE_CONTROL, 0);
    let misc = rd(&pmu, msr::IA32_MISC_ENABLE);
    wr(&mut pmu, msr::IA32_MISC_ENABLE, misc | 1 << 37 | 1 << 39);
    assert_eq!(rd(&pmu, msr::IA32_MISC_ENABLE), misc | 1 << 37 | 1 << 39, "reads back");
    assert_eq!(pmu.prefetchers_on(), PrefetcherSet::STREAMER.union(PrefetcherSet::ADJACENT_LINE));
    wr(&mut pmu, msr::IA32_MISC_ENABLE, misc | 1 << 9 | 1 << 19);
    assert_eq!(pmu.prefetchers_on(), PrefetcherSet::DCU.union(PrefetcherSet::IP_STRIDE));
    wr(&mut pmu, msr::IA32_MISC_ENABLE, misc);
    assert_eq!(pmu.prefetchers_on(), PrefetcherSet::ALL);
    assert_wr_gp(&mut pmu, msr::IA32_MISC_ENABLE, misc | 1 << 38);
    // NetBurst has bits 9 and 19 (its hardware prefetcher and adjacent line), not 37 and 39.
    let mut p4 = with_prefetchers("pentium4");
    let misc = rd(&p4, msr::IA32_MISC_ENABLE);
    wr(&mut p4, msr::IA32_MISC_ENABLE, misc | 1 << 9 | 1 << 19);
    assert_eq!(p4.prefetchers_on(), PrefetcherSet::NONE);
    assert_wr_gp(&mut p4, msr::IA32_MISC_ENABLE, misc | 1 << 37);
    // A PMU built without the profile's prefetchers has neither register's bits.
    let mut bare = Pmu::new(&Profile::load("core2").unwrap().pmu);
    let misc = rd(&bare, msr::IA32_MISC_ENABLE);
    assert_wr_gp(&mut bare, msr::IA32_MISC_ENABLE, misc | 1 << 9);
    assert_eq!(bare.prefetchers_on(), PrefetcherSet::NONE);
}
