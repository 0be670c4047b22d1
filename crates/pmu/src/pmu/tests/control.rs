//! Control and status registers: reserved bits, read-only registers, W1C / W1S, INUSE,
//! DEBUGCTL, MISC_ENABLE, PEBS_ENABLE, DS_AREA.

use super::*;

#[test]
fn perfevtsel_high_bits_gp() {
    for p in [core2(), nehalem(), skylake(), icelake(), v1()] {
        let mut pmu = Pmu::new(&p);
        for bit in 32..64 {
            assert_wr_gp(&mut pmu, msr::IA32_PERFEVTSEL0, 1 << bit);
        }
        assert_wr_gp(&mut pmu, msr::IA32_PERFEVTSEL0 + 1, 0x1_0043_00C0);
        wr(&mut pmu, msr::IA32_PERFEVTSEL0 + 1, 0xFFDF_FFFF);
        assert_eq!(rd(&pmu, msr::IA32_PERFEVTSEL0 + 1), 0xFFDF_FFFF);
    }
}

#[test]
fn perfevtsel_any_gps_before_v3() {
    for p in [core2(), v1()] {
        let mut pmu = Pmu::new(&p);
        assert_wr_gp(&mut pmu, msr::IA32_PERFEVTSEL0, msr::PERFEVTSEL_ANY);
        assert_wr_gp(&mut pmu, msr::IA32_PERFEVTSEL0, 0x0063_00C0); // EN | ANY | USR | OS
    }
    for p in [nehalem(), skylake(), icelake()] {
        let mut pmu = Pmu::new(&p);
        wr(&mut pmu, msr::IA32_PERFEVTSEL0, 0x0063_00C0);
        assert_eq!(rd(&pmu, msr::IA32_PERFEVTSEL0), 0x0063_00C0);
        assert!(pmu.counter(CounterId::Gp(0)).any);
        wr(&mut pmu, msr::IA32_PERFEVTSEL0, 0xFFFF_FFFF);
    }
}

#[test]
fn fixed_ctr_ctrl_reserved_fields() {
    // core2: fixed 0..2, no ANY.
    let mut pmu = Pmu::new(&core2());
    wr(&mut pmu, msr::IA32_FIXED_CTR_CTRL, 0xBBB);
    assert_eq!(rd(&pmu, msr::IA32_FIXED_CTR_CTRL), 0xBBB);
    for i in 0..3 {
        assert_wr_gp(&mut pmu, msr::IA32_FIXED_CTR_CTRL, 0x4 << (4 * i)); // ANY before v3
    }
    assert_wr_gp(&mut pmu, msr::IA32_FIXED_CTR_CTRL, 0x1000); // field of FIXED_CTR3
    assert_wr_gp(&mut pmu, msr::IA32_FIXED_CTR_CTRL, 1 << 63);
    // nehalem: ANY allowed, field 3 still reserved.
    let mut pmu = Pmu::new(&nehalem());
    wr(&mut pmu, msr::IA32_FIXED_CTR_CTRL, 0xFFF);
    assert_wr_gp(&mut pmu, msr::IA32_FIXED_CTR_CTRL, 0x1FFF);
    assert_wr_gp(&mut pmu, msr::IA32_FIXED_CTR_CTRL, 1 << 16);
    // icelake: 4 fields.
    let mut pmu = Pmu::new(&icelake());
    wr(&mut pmu, msr::IA32_FIXED_CTR_CTRL, 0xFFFF);
    assert_wr_gp(&mut pmu, msr::IA32_FIXED_CTR_CTRL, 0x1_FFFF);
    // v5 sparse: only fields 0 and 3.
    let mut pmu = Pmu::new(&v5_sparse());
    wr(&mut pmu, msr::IA32_FIXED_CTR_CTRL, 0xF00F);
    assert_wr_gp(&mut pmu, msr::IA32_FIXED_CTR_CTRL, 0x0010);
    assert_wr_gp(&mut pmu, msr::IA32_FIXED_CTR_CTRL, 0x0100);
    assert_eq!(rd(&pmu, msr::IA32_FIXED_CTR_CTRL), 0xF00F);
}

#[test]
fn global_ctrl_reserved_bits() {
    let mut pmu = Pmu::new(&nehalem());
    wr(&mut pmu, msr::IA32_PERF_GLOBAL_CTRL, 0x7_0000_000F);
    assert_eq!(rd(&pmu, msr::IA32_PERF_GLOBAL_CTRL), 0x7_0000_000F);
    assert_wr_gp(&mut pmu, msr::IA32_PERF_GLOBAL_CTRL, 1 << 4);
    assert_wr_gp(&mut pmu, msr::IA32_PERF_GLOBAL_CTRL, 1 << 35);
    assert_wr_gp(&mut pmu, msr::IA32_PERF_GLOBAL_CTRL, 1 << 31);
    assert_wr_gp(&mut pmu, msr::IA32_PERF_GLOBAL_CTRL, 1 << 63);
    let mut pmu = Pmu::new(&v5_sparse());
    wr(&mut pmu, msr::IA32_PERF_GLOBAL_CTRL, 0x9_0000_000F);
    assert_wr_gp(&mut pmu, msr::IA32_PERF_GLOBAL_CTRL, 1 << 33);
    assert_wr_gp(&mut pmu, msr::IA32_PERF_GLOBAL_CTRL, 1 << 34);
    let mut pmu = Pmu::new(&icelake());
    wr(&mut pmu, msr::IA32_PERF_GLOBAL_CTRL, 0xF_0000_00FF);
    assert_wr_gp(&mut pmu, msr::IA32_PERF_GLOBAL_CTRL, 1 << 36);
}

#[test]
fn global_status_is_read_only() {
    for p in [core2(), nehalem(), skylake(), icelake()] {
        let mut pmu = Pmu::new(&p);
        assert_wr_gp(&mut pmu, msr::IA32_PERF_GLOBAL_STATUS, 0);
        assert_wr_gp(&mut pmu, msr::IA32_PERF_GLOBAL_STATUS, 1);
    }
}

#[test]
fn perf_capabilities_is_read_only() {
    let mut pmu = Pmu::new(&skylake());
    assert_eq!(rd(&pmu, msr::IA32_PERF_CAPABILITIES), 0x33c5);
    assert_wr_gp(&mut pmu, msr::IA32_PERF_CAPABILITIES, 0x33c5);
    assert_wr_gp(&mut pmu, msr::IA32_PERF_CAPABILITIES, 0);
    let pmu = Pmu::new(&nehalem());
    assert_eq!(rd(&pmu, msr::IA32_PERF_CAPABILITIES), 0x10c3);
}

/// Overflow the given counters (leaves status bits set).
fn overflow(pmu: &mut Pmu, ids: &[CounterId]) {
    for &id in ids {
        let d = pmu.distance_to_overflow(id);
        assert!(pmu.add_events(id, d));
    }
}

#[test]
fn ovf_ctrl_clears_status_bits() {
    for p in [core2(), nehalem(), skylake()] {
        let mut pmu = Pmu::new(&p);
        overflow(&mut pmu, &[CounterId::Gp(0), CounterId::Gp(1), CounterId::Fixed(0), CounterId::Fixed(2)]);
        assert_eq!(pmu.global_status(), 0x5_0000_0003);
        wr(&mut pmu, msr::IA32_PERF_GLOBAL_OVF_CTRL, 0x1_0000_0001);
        assert_eq!(rd(&pmu, msr::IA32_PERF_GLOBAL_STATUS), 0x4_0000_0002);
        assert_eq!(rd(&pmu, msr::IA32_PERF_GLOBAL_OVF_CTRL), 0, "reads as 0");
        // Clearing an already-clear bit is fine.
        wr(&mut pmu, msr::IA32_PERF_GLOBAL_OVF_CTRL, 0x7_0000_0003 | 3 << 62);
        assert_eq!(pmu.global_status(), 0);
    }
}

#[test]
fn ovf_ctrl_reserved_bits_per_version() {
    let clr = |v: u8| -> Vec<u32> {
        let mut bits = vec![62, 63];
        if v >= 3 {
            bits.push(61);
        }
        if v >= 4 {
            bits.extend([55, 58, 59]);
        }
        bits
    };
    for p in [core2(), nehalem(), skylake(), icelake()] {
        let mut pmu = Pmu::new(&p);
        let ok = clr(p.version);
        for bit in 0..64u32 {
            let is_counter = bit < u32::from(p.gp) || (32..32 + u32::from(p.fixed)).contains(&bit);
            if is_counter || ok.contains(&bit) {
                wr(&mut pmu, msr::IA32_PERF_GLOBAL_OVF_CTRL, 1 << bit);
            } else {
                assert_wr_gp(&mut pmu, msr::IA32_PERF_GLOBAL_OVF_CTRL, 1 << bit);
            }
        }
    }
}

#[test]
fn status_set_sets_bits_on_v4() {
    let mut pmu = Pmu::new(&skylake());
    wr(&mut pmu, msr::IA32_PERF_GLOBAL_STATUS_SET, 0x2_0000_0004);
    assert_eq!(rd(&pmu, msr::IA32_PERF_GLOBAL_STATUS), 0x2_0000_0004);
    assert_eq!(rd(&pmu, msr::IA32_PERF_GLOBAL_STATUS_SET), 0, "reads as 0");
    assert!(!pmu.pmi_pending(), "setting status raises no PMI");
    wr(&mut pmu, msr::IA32_PERF_GLOBAL_STATUS_SET, msr::GLOBAL_STATUS_OVF_BUFFER);
    assert_eq!(pmu.global_status(), 0x4000_0002_0000_0004);
    for bit in [55, 58, 59, 61, 62] {
        wr(&mut pmu, msr::IA32_PERF_GLOBAL_STATUS_SET, 1 << bit);
        assert_ne!(pmu.global_status() & 1 << bit, 0);
    }
    // CondChgd cannot be set; ASCI (no SGX), counters beyond the profile, other bits reserved.
    for bit in [63, 60, 4, 8, 31, 35, 40, 54, 56, 57] {
        assert_wr_gp(&mut pmu, msr::IA32_PERF_GLOBAL_STATUS_SET, 1 << bit);
    }
    let status = pmu.global_status();
    wr(&mut pmu, msr::IA32_PERF_GLOBAL_STATUS_RESET, status);
    assert_eq!(pmu.global_status(), 0);
    // Ice Lake: PMC7 and FIXED_CTR3 bits are settable.
    let mut pmu = Pmu::new(&icelake());
    wr(&mut pmu, msr::IA32_PERF_GLOBAL_STATUS_SET, 0x8_0000_0080);
    assert_eq!(pmu.global_status(), 0x8_0000_0080);
}

#[test]
fn status_set_gps_before_v4() {
    for p in [core2(), nehalem()] {
        let mut pmu = Pmu::new(&p);
        assert_wr_gp(&mut pmu, msr::IA32_PERF_GLOBAL_STATUS_SET, 1);
        assert_eq!(pmu.rdmsr(msr::IA32_PERF_GLOBAL_STATUS_SET), Err(GpFault));
    }
}

#[test]
fn inuse_reflects_registers() {
    let mut pmu = Pmu::new(&skylake());
    assert_eq!(rd(&pmu, msr::IA32_PERF_GLOBAL_INUSE), 0);
    // PERFEVTSEL1[7:0] != 0 -> bit 1 (EN does not matter).
    wr(&mut pmu, msr::IA32_PERFEVTSEL0 + 1, 0x2E);
    assert_eq!(rd(&pmu, msr::IA32_PERF_GLOBAL_INUSE), 0b10);
    // umask alone does not count as in use.
    wr(&mut pmu, msr::IA32_PERFEVTSEL0 + 2, 0x4F00 | msr::PERFEVTSEL_EN);
    assert_eq!(rd(&pmu, msr::IA32_PERF_GLOBAL_INUSE), 0b10);
    // FIXED_CTR_CTRL field 2 EN != 0 -> bit 34; a PMI bit alone is not "in use" but sets bit 63.
    wr(&mut pmu, msr::IA32_FIXED_CTR_CTRL, 0x200);
    assert_eq!(rd(&pmu, msr::IA32_PERF_GLOBAL_INUSE), 1 << 34 | 0b10);
    wr(&mut pmu, msr::IA32_FIXED_CTR_CTRL, 0x208);
    assert_eq!(rd(&pmu, msr::IA32_PERF_GLOBAL_INUSE), 1 << 63 | 1 << 34 | 0b10);
    wr(&mut pmu, msr::IA32_FIXED_CTR_CTRL, 0);
    // PERFEVTSEL.INT -> bit 63.
    wr(&mut pmu, msr::IA32_PERFEVTSEL0 + 3, msr::PERFEVTSEL_INT);
    assert_eq!(rd(&pmu, msr::IA32_PERF_GLOBAL_INUSE), 1 << 63 | 0b10);
    wr(&mut pmu, msr::IA32_PERFEVTSEL0 + 3, 0);
    // PEBS_ENABLE bit of a PMC -> bit 63.
    wr(&mut pmu, msr::IA32_PEBS_ENABLE, 0b1000);
    assert_eq!(rd(&pmu, msr::IA32_PERF_GLOBAL_INUSE), 1 << 63 | 0b10);
    wr(&mut pmu, msr::IA32_PEBS_ENABLE, 0);
    assert_eq!(rd(&pmu, msr::IA32_PERF_GLOBAL_INUSE), 0b10);
    // Read-only.
    assert_wr_gp(&mut pmu, msr::IA32_PERF_GLOBAL_INUSE, 0);
    assert_wr_gp(&mut pmu, msr::IA32_PERF_GLOBAL_INUSE, 0b10);
}

#[test]
fn inuse_all_bits_icelake() {
    let mut pmu = Pmu::new(&icelake());
    for i in 0..8 {
        wr(&mut pmu, msr::IA32_PERFEVTSEL0 + i, 0xC0);
    }
    wr(&mut pmu, msr::IA32_FIXED_CTR_CTRL, 0x1111);
    assert_eq!(rd(&pmu, msr::IA32_PERF_GLOBAL_INUSE), 0xF_0000_00FF);
    wr(&mut pmu, msr::IA32_FIXED_CTR_CTRL, 0x9111);
    assert_eq!(rd(&pmu, msr::IA32_PERF_GLOBAL_INUSE), 1 << 63 | 0xF_0000_00FF);
}

#[test]
fn debugctl_allowed_bits() {
    let base = [0u32, 1, 11];
    for (p, freeze_pm, smm) in [
        (v0(), false, false),
        (v1(), false, false),
        (core2(), true, false),
        (nehalem(), true, true), // PERF_CAPABILITIES 0x10c3 has FREEZE_WHILE_SMM
        (skylake(), true, true),
    ] {
        let mut pmu = Pmu::new(&p);
        for bit in 0..64u32 {
            let ok = base.contains(&bit) || (bit == 12 && freeze_pm) || (bit == 14 && smm);
            if ok {
                wr(&mut pmu, msr::IA32_DEBUGCTL, 1 << bit);
                assert_eq!(rd(&pmu, msr::IA32_DEBUGCTL), 1 << bit);
            } else {
                assert_wr_gp(&mut pmu, msr::IA32_DEBUGCTL, 1 << bit);
            }
        }
    }
}

#[test]
fn misc_enable_rules() {
    for p in [v0(), v1(), nehalem(), skylake()] {
        let mut pmu = Pmu::new(&p);
        let perfmon = if p.misc_enable_perfmon { 1 << 7 } else { 0 };
        let power_on = 1 | perfmon | 1 << 11 | 1 << 12;
        assert_eq!(rd(&pmu, msr::IA32_MISC_ENABLE), power_on);
        // Writable bits are stored.
        let writable = 1u64 | 1 << 3 | 1 << 16 | 1 << 18 | 1 << 22 | 1 << 23 | 1 << 34;
        wr(&mut pmu, msr::IA32_MISC_ENABLE, writable);
        // Read-only bits keep their value even when the write clears them.
        assert_eq!(rd(&pmu, msr::IA32_MISC_ENABLE), writable | perfmon | 1 << 11 | 1 << 12);
        wr(&mut pmu, msr::IA32_MISC_ENABLE, 1 << 7 | 1 << 11 | 1 << 12);
        assert_eq!(rd(&pmu, msr::IA32_MISC_ENABLE), perfmon | 1 << 11 | 1 << 12);
        for bit in [1u32, 2, 4, 5, 6, 8, 9, 10, 13, 17, 19, 20, 21, 24, 33, 35, 38, 63] {
            assert_wr_gp(&mut pmu, msr::IA32_MISC_ENABLE, 1 << bit);
        }
    }
}

#[test]
fn pebs_enable_bits() {
    let mut pmu = Pmu::new(&nehalem());
    wr(&mut pmu, msr::IA32_PEBS_ENABLE, 0xF);
    assert_eq!(rd(&pmu, msr::IA32_PEBS_ENABLE), 0xF);
    for bit in [4u32, 7, 32, 35, 63] {
        assert_wr_gp(&mut pmu, msr::IA32_PEBS_ENABLE, 1 << bit);
    }
    let mut pmu = Pmu::new(&v1());
    wr(&mut pmu, msr::IA32_PEBS_ENABLE, 0b11);
    assert_wr_gp(&mut pmu, msr::IA32_PEBS_ENABLE, 0b100);
}

#[test]
fn ds_area_must_be_canonical() {
    let mut pmu = Pmu::new(&skylake());
    for v in [0u64, 0x1000, 0x7FFF_FFFF_F000, 0xFFFF_8000_0000_0000, u64::MAX] {
        wr(&mut pmu, msr::IA32_DS_AREA, v);
        assert_eq!(rd(&pmu, msr::IA32_DS_AREA), v);
    }
    for v in [0x8000_0000_0000u64, 0x8000_0000_0000_0000, 0x00FF_0000_0000_0000] {
        assert_wr_gp(&mut pmu, msr::IA32_DS_AREA, v);
    }
}

/// Bit 48 of GLOBAL_CTRL, STATUS_RESET and STATUS_SET belongs to the topdown metrics where
/// IA32_PERF_CAPABILITIES.PERF_METRICS is set (Ice Lake, SDM 18.3.9.3), and is reserved elsewhere.
#[test]
fn perf_metrics_bit_48_exists_only_with_perf_metrics() {
    let mut metrics = icelake();
    metrics.perf_capabilities |= msr::PERF_CAPABILITIES_PERF_METRICS;
    let mut pmu = Pmu::new(&metrics);
    wr(&mut pmu, msr::IA32_PERF_GLOBAL_CTRL, msr::GLOBAL_PERF_METRICS | 0xFF);
    assert_eq!(rd(&pmu, msr::IA32_PERF_GLOBAL_CTRL), msr::GLOBAL_PERF_METRICS | 0xFF);
    wr(&mut pmu, msr::IA32_PERF_GLOBAL_STATUS_SET, msr::GLOBAL_PERF_METRICS);
    assert_eq!(rd(&pmu, msr::IA32_PERF_GLOBAL_STATUS), msr::GLOBAL_PERF_METRICS);
    wr(&mut pmu, msr::IA32_PERF_GLOBAL_STATUS_RESET, msr::GLOBAL_PERF_METRICS);
    assert_eq!(rd(&pmu, msr::IA32_PERF_GLOBAL_STATUS), 0);
    for p in [skylake(), nehalem(), icelake()] {
        let mut pmu = Pmu::new(&p);
        assert_wr_gp(&mut pmu, msr::IA32_PERF_GLOBAL_CTRL, msr::GLOBAL_PERF_METRICS);
        assert_wr_gp(&mut pmu, msr::IA32_PERF_GLOBAL_OVF_CTRL, msr::GLOBAL_PERF_METRICS);
    }
}
