//! Which MSRs exist under which profile; accesses to the others #GP on read and write.

use super::*;

/// Every MSR of the trapped ranges.
fn trapped() -> Vec<u32> {
    Pmu::TRAPPED_MSRS.iter().flat_map(|&(lo, hi)| lo..=hi).collect()
}

/// Assert read and write of `msr` both #GP with no state change.
#[track_caller]
fn assert_absent(pmu: &mut Pmu, msr: u32) {
    assert_eq!(pmu.rdmsr(msr), Err(GpFault), "rdmsr({msr:#x}) should #GP");
    for v in [0, 1, u64::MAX] {
        assert_wr_gp(pmu, msr, v);
    }
}

/// The set of MSRs that must exist (SDM Vol. 3B 18.2, by version and counter count).
fn expected(p: &PmuProfile) -> Vec<u32> {
    let mut v = vec![msr::IA32_DEBUGCTL, msr::IA32_MISC_ENABLE];
    let n = u32::from(p.gp.min(8));
    if p.version >= 1 {
        v.extend((0..n).map(|i| msr::IA32_PMC0 + i));
        v.extend((0..n).map(|i| msr::IA32_PERFEVTSEL0 + i));
        if p.fw_write() {
            v.extend((0..n).map(|i| msr::IA32_A_PMC0 + i));
        }
        v.extend([msr::IA32_PEBS_ENABLE, msr::IA32_DS_AREA]);
    }
    if p.version >= 2 {
        v.extend((0..4u8).filter(|&i| p.fixed_supported(i)).map(|i| msr::IA32_FIXED_CTR0 + u32::from(i)));
        v.extend([
            msr::IA32_FIXED_CTR_CTRL,
            msr::IA32_PERF_GLOBAL_STATUS,
            msr::IA32_PERF_GLOBAL_CTRL,
            msr::IA32_PERF_GLOBAL_OVF_CTRL,
        ]);
    }
    if p.version >= 4 {
        v.extend([msr::IA32_PERF_GLOBAL_STATUS_SET, msr::IA32_PERF_GLOBAL_INUSE]);
    }
    if p.perf_capabilities != 0 {
        v.push(msr::IA32_PERF_CAPABILITIES);
    }
    v
}

#[test]
fn existence_matches_semantics_table_for_every_profile() {
    for (name, p) in all_profiles() {
        let mut pmu = Pmu::new(&p);
        let exist = expected(&p);
        for msr in trapped() {
            let readable = pmu.rdmsr(msr).is_ok();
            assert_eq!(readable, exist.contains(&msr), "{name}: rdmsr({msr:#x})");
            if !readable {
                assert_absent(&mut pmu, msr);
            }
        }
    }
}

#[test]
fn trapped_ranges_are_the_architectural_ones() {
    let all = trapped();
    // PEBS_DATA_CFG (0x3F2) with PEBS_ENABLE; the fixed counters within the NetBurst counters.
    let architectural = 8 + 8 + 1 + 1 + 1 + 6 + 8 + 1;
    // NetBurst: 18 counters (0x300-0x311, the fixed counters' 0x309-0x30C among them), 18 CCCRs,
    // the ESCR range 0x3A0-0x3E1 with its holes, and MSR_TC_PRECISE_EVENT (0x3F0) beside
    // PEBS_ENABLE and PEBS_MATRIX_VERT (0x3F1, 0x3F2).
    let netburst = 18 + 18 + (0x3E1 - 0x3A0 + 1) + 3;
    // LBR FROM/TO at 0x40/0x60 (8 each) and 0x680/0x6C0 plus LBR_INFO (32 each); LBR_SELECT
    // and TOS; LER_FROM/TO; OFFCORE_RSP_0/1; PEBS_LD_LAT and PEBS_FRONTEND.
    let model_specific = 2 * 8 + 3 * 32 + 2 + 2 + 2 + 2;
    // MSR_MISC_FEATURE_CONTROL, which the cache model's prefetchers obey.
    let prefetch = 1;
    assert_eq!(all.len(), architectural + model_specific + netburst + prefetch);
    for msr in all {
        assert!(Pmu::owns(msr), "{msr:#x}");
        let hole = (0x3A0..=0x3E1).contains(&msr) && netburst::Reg::decode(msr).is_none();
        assert_eq!(msr_name(msr).is_some(), !hole, "{msr:#x} has a name");
    }
    // 0x48/0x49: IA32_SPEC_CTRL and IA32_PRED_CMD, between the Core 2 LBR banks; 0x1DB/0x1DC:
    // the P6 LASTBRANCHFROMIP/TOIP, which stay KVM's.
    for msr in [
        0,
        0x48,
        0x49,
        0xC0,
        0xC9,
        0x185,
        0x18E,
        0x1A5,
        0x1D8,
        0x1DA,
        0x1DB,
        0x1DC,
        0x1DF,
        0x2FF,
        0x312,
        0x35F,
        0x372,
        0x38C,
        0x393,
        0x39F,
        0x3E2,
        0x3EF,
        0x3F8,
        0x4C0,
        0x4C9,
        0x601,
        0x6A0,
        0xDE0,
        u32::MAX,
    ] {
        assert!(!Pmu::owns(msr), "{msr:#x}");
    }
}

#[test]
fn untrapped_msrs_gp() {
    let mut pmu = Pmu::new(&icelake());
    for msr in [0u32, 0x10, 0xC0, 0xC9, 0x30D, 0x393, 0xC000_0080, u32::MAX] {
        assert_eq!(pmu.rdmsr(msr), Err(GpFault));
        assert_wr_gp(&mut pmu, msr, 0);
    }
}

#[test]
fn version0_gps_everything_but_debugctl_and_misc_enable() {
    let mut pmu = Pmu::new(&v0());
    for msr in trapped() {
        if msr == msr::IA32_DEBUGCTL || msr == msr::IA32_MISC_ENABLE {
            assert!(pmu.rdmsr(msr).is_ok());
        } else {
            assert_absent(&mut pmu, msr);
        }
    }
    assert_eq!(rd(&pmu, msr::IA32_MISC_ENABLE) & msr::MISC_ENABLE_PERFMON_AVAILABLE, 0);
    assert!(pmu.counter_ids().is_empty());
}

#[test]
fn pmc_beyond_profile_gps_on_read_and_write() {
    let mut pmu = Pmu::new(&skylake()); // 4 GP counters
    for msr in [0xC5, 0xC8, 0x18A, 0x18D, 0x4C5, 0x4C8] {
        assert_absent(&mut pmu, msr);
    }
    for msr in [0xC1, 0xC4, 0x186, 0x189, 0x4C1, 0x4C4] {
        assert!(pmu.rdmsr(msr).is_ok(), "{msr:#x}");
    }
    // IA32_FIXED_CTR3 does not exist with 3 fixed counters.
    assert_absent(&mut pmu, 0x30C);
    // Ice Lake has all 8 and FIXED_CTR3.
    let pmu = Pmu::new(&icelake());
    for msr in [0xC8, 0x18D, 0x4C8, 0x30C] {
        assert!(pmu.rdmsr(msr).is_ok(), "{msr:#x}");
    }
}

#[test]
fn a_pmc_requires_fw_write() {
    for p in [core2(), nehalem(), v1()] {
        let mut pmu = Pmu::new(&p);
        assert_absent(&mut pmu, msr::IA32_A_PMC0);
        assert_absent(&mut pmu, msr::IA32_A_PMC0 + 1);
    }
    let mut pmu = Pmu::new(&skylake());
    wr(&mut pmu, msr::IA32_A_PMC0, 5);
    assert_eq!(rd(&pmu, msr::IA32_PMC0), 5);
}

#[test]
fn v5_sparse_fixed_bitmap() {
    let mut pmu = Pmu::new(&v5_sparse());
    assert!(pmu.rdmsr(0x309).is_ok());
    assert!(pmu.rdmsr(0x30C).is_ok());
    assert_absent(&mut pmu, 0x30A);
    assert_absent(&mut pmu, 0x30B);
    assert_eq!(
        pmu.counter_ids(),
        vec![
            CounterId::Gp(0),
            CounterId::Gp(1),
            CounterId::Gp(2),
            CounterId::Gp(3),
            CounterId::Fixed(0),
            CounterId::Fixed(3)
        ]
    );
}

#[test]
fn v1_has_no_global_registers() {
    let mut pmu = Pmu::new(&v1());
    for msr in [0x309, 0x38D, 0x38E, 0x38F, 0x390, 0x391, 0x392, 0x345] {
        assert_absent(&mut pmu, msr);
    }
    assert_eq!(pmu.counter_ids(), vec![CounterId::Gp(0), CounterId::Gp(1)]);
}

#[test]
fn status_set_and_inuse_need_v4() {
    for p in [core2(), nehalem()] {
        let mut pmu = Pmu::new(&p);
        assert_absent(&mut pmu, msr::IA32_PERF_GLOBAL_STATUS_SET);
        assert_absent(&mut pmu, msr::IA32_PERF_GLOBAL_INUSE);
    }
}

#[test]
fn oversized_profile_is_capped_without_panic() {
    // Nonsense a validated profile would reject: must still not panic.
    let p = profile(5, 255, 255, 31, 255, u32::MAX, u64::MAX);
    let mut pmu = Pmu::new(&p);
    assert_eq!(pmu.counter_ids().len(), 8 + 4);
    wr(&mut pmu, msr::IA32_A_PMC0, u64::MAX);
    assert_eq!(rd(&pmu, msr::IA32_PMC0), u64::MAX);
    assert_eq!(pmu.counter(CounterId::Gp(7)).width, 64);
    assert_eq!(pmu.counter(CounterId::Fixed(3)).width, 64);
    let _ = pmu.dump();
}

#[test]
fn perf_capabilities_follows_pdcm() {
    // The MSR exists iff CPUID.1:ECX.PDCM (= perf_capabilities != 0), whatever the version.
    let mut p = v0();
    p.perf_capabilities = 0x1000;
    let mut pmu = Pmu::new(&p);
    assert_eq!(rd(&pmu, msr::IA32_PERF_CAPABILITIES), 0x1000);
    assert_wr_gp(&mut pmu, msr::IA32_PERF_CAPABILITIES, 0x1000);
    // ... and FREEZE_WHILE_SMM then makes DEBUGCTL bit 14 writable.
    wr(&mut pmu, msr::IA32_DEBUGCTL, msr::DEBUGCTL_FREEZE_WHILE_SMM);
    let mut pmu = Pmu::new(&core2());
    assert_absent(&mut pmu, msr::IA32_PERF_CAPABILITIES);
}

#[test]
fn netburst_registers_exist_and_the_architectural_ones_do_not() {
    let p = PmuProfile { kind: crate::profile::PmuKind::NetBurst, misc_enable_perfmon: true, ..PmuProfile::default() };
    let mut pmu = Pmu::new(&p);
    for msr in trapped() {
        let exists = netburst::Reg::decode(msr).is_some()
            || [msr::IA32_DEBUGCTL, msr::IA32_MISC_ENABLE, msr::IA32_DS_AREA].contains(&msr);
        assert_eq!(pmu.rdmsr(msr).is_ok(), exists, "rdmsr({msr:#x})");
        if !exists {
            assert_absent(&mut pmu, msr);
        }
    }
    // 0x309 is MSR_FLAME_COUNTER1 here, not IA32_FIXED_CTR0; 0x3F2 MSR_PEBS_MATRIX_VERT.
    assert_eq!(pmu.reg_name(0x309).as_deref(), Some("MSR_FLAME_COUNTER1"));
    assert_eq!(pmu.reg_name(0x3F2).as_deref(), Some("MSR_PEBS_MATRIX_VERT"));
    assert_eq!(Pmu::new(&skylake()).reg_name(0x309).as_deref(), Some("IA32_FIXED_CTR0"));
    // MSR_DEBUGCTLA: bits 6:0.
    wr(&mut pmu, msr::IA32_DEBUGCTL, 0x7F);
    assert_wr_gp(&mut pmu, msr::IA32_DEBUGCTL, 0x80);
    assert_eq!(pmu.counter_ids().len(), 18);
    assert_eq!(
        rd(&pmu, msr::IA32_MISC_ENABLE) & msr::MISC_ENABLE_PERFMON_AVAILABLE,
        msr::MISC_ENABLE_PERFMON_AVAILABLE
    );
}
