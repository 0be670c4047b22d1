//! One test per validation rule: the error names the origin, the field and the rule.

use super::super::{MsrBits, PmuProfile, Profile};
use super::{assert_mentions, error_of, sample};

/// The sample profile with `f` applied to its PMU.
fn with(f: impl FnOnce(&mut PmuProfile)) -> Profile {
    let mut p = sample();
    f(&mut p.pmu);
    p
}

/// A valid version `v` profile to start from.
fn version(v: u8) -> Profile {
    with(|p| {
        p.version = v;
        p.perf_capabilities = 0;
        p.lbr = None;
        p.msrs = Default::default();
        if v < 2 {
            p.fixed = 0;
            p.fixed_width = 0;
        }
        if v == 0 {
            *p = PmuProfile { misc_enable_perfmon: false, ..zero_pmu() };
        }
    })
}

/// A field name and how to make it nonzero.
type Mutation = (&'static str, fn(&mut PmuProfile));

fn zero_pmu() -> PmuProfile {
    PmuProfile {
        version: 0,
        gp: 0,
        gp_width: 0,
        ebx_length: 0,
        ebx_unavailable: 0,
        fixed: 0,
        fixed_width: 0,
        fixed_bitmap: 0,
        perf_capabilities: 0,
        misc_enable_perfmon: false,
        nominal_mhz: 2000,
        ..PmuProfile::default()
    }
}

#[test]
fn starting_points_are_valid() {
    for v in 0..=5 {
        let p = version(v);
        p.validate().unwrap_or_else(|e| panic!("version {v}: {e}"));
    }
}

#[test]
fn version_above_5() {
    let e = error_of(&with(|p| p.version = 6));
    assert_mentions(&e, &["skylake: ", "pmu.version = 6", "0..=5", "CPUID.0AH:EAX[7:0]"]);
}

#[test]
fn version_0_needs_every_field_zero() {
    let cases: [Mutation; 8] = [
        ("pmu.gp = 2", |p| p.gp = 2),
        ("pmu.gp-width = 48", |p| p.gp_width = 48),
        ("pmu.ebx-length = 7", |p| p.ebx_length = 7),
        ("pmu.ebx-unavailable = 0x1", |p| p.ebx_unavailable = 1),
        ("pmu.fixed = 3", |p| p.fixed = 3),
        ("pmu.fixed-width = 48", |p| p.fixed_width = 48),
        ("pmu.fixed-bitmap = 0x1", |p| p.fixed_bitmap = 1),
        ("pmu.perf-capabilities = 0x2000", |p| p.perf_capabilities = 0x2000),
    ];
    for (field, f) in cases {
        let mut p = version(0);
        f(&mut p.pmu);
        let e = error_of(&p);
        assert_mentions(&e, &[field, "pmu.version = 0", "no architectural perfmon"]);
    }
}

#[test]
fn gp_count_1_to_8() {
    for gp in [0, 9] {
        let e = error_of(&with(|p| p.gp = gp));
        assert_mentions(&e, &[&format!("pmu.gp = {gp}"), "1..=8", "CPUID.0AH:EAX[15:8]", "0xC1-0xC8", "0x186-0x18D"]);
    }
}

#[test]
fn gp_width_32_to_64() {
    let e = error_of(&with(|p| p.gp_width = 70));
    assert_eq!(e, "skylake: pmu.gp-width = 70: counter width must be 32..=64 bits (CPUID.0AH:EAX[23:16])");
    let e = error_of(&with(|p| p.gp_width = 31));
    assert_mentions(&e, &["pmu.gp-width = 31", "32..=64"]);
}

#[test]
fn version_1_has_no_fixed_counters() {
    for (fixed, width) in [(3, 48), (0, 48), (3, 0)] {
        let mut p = version(1);
        p.pmu.fixed = fixed;
        p.pmu.fixed_width = width;
        let e = error_of(&p);
        assert_mentions(
            &e,
            &[
                "pmu.version = 1",
                "version 1 has no fixed-function counters",
                "CPUID.0AH:EDX",
                "set fixed=0 and fixed-width=0",
            ],
        );
    }
}

#[test]
fn fixed_count_at_most_4() {
    let e = error_of(&with(|p| p.fixed = 5));
    assert_mentions(&e, &["pmu.fixed = 5", "0..=4", "CPUID.0AH:EDX[4:0]", "0x309-0x30C"]);
}

#[test]
fn fixed_width_32_to_64_when_fixed_counters_exist() {
    let e = error_of(&with(|p| p.fixed_width = 16));
    assert_mentions(&e, &["pmu.fixed-width = 16", "32..=64", "CPUID.0AH:EDX[12:5]"]);
    let mut p = version(5);
    p.pmu.fixed = 0;
    p.pmu.fixed_bitmap = 0b1000;
    p.pmu.fixed_width = 0;
    assert_mentions(&error_of(&p), &["pmu.fixed-width = 0", "32..=64"]);
}

#[test]
fn fixed_width_0_without_fixed_counters() {
    let e = error_of(&with(|p| p.fixed = 0));
    assert_mentions(&e, &["pmu.fixed-width = 48", "must be 0 when there are no fixed-function counters"]);
}

#[test]
fn fixed_bitmap_only_from_version_5() {
    let e = error_of(&with(|p| p.fixed_bitmap = 0b1000));
    assert_mentions(&e, &["pmu.fixed-bitmap = 0x8", "before version 5", "CPUID.0AH:ECX"]);
}

#[test]
fn fixed_bitmap_only_bits_0_to_3() {
    let mut p = version(5);
    p.pmu.fixed_bitmap = 0x10;
    assert_mentions(&error_of(&p), &["pmu.fixed-bitmap = 0x10", "bits 0..=3", "IA32_FIXED_CTR0-3"]);
}

#[test]
fn ebx_length_at_most_8() {
    let e = error_of(&with(|p| p.ebx_length = 9));
    assert_mentions(&e, &["pmu.ebx-length = 9", "0..=8", "Table 18-1", "CPUID.0AH:EAX[31:24]"]);
}

#[test]
fn ebx_length_at_least_1_from_version_1() {
    let e = error_of(&with(|p| p.ebx_length = 0));
    assert_mentions(&e, &["pmu.ebx-length = 0", ">= 1 for version >= 1", "bit 0"]);
}

#[test]
fn ebx_unavailable_only_below_ebx_length() {
    let e = error_of(&with(|p| p.ebx_unavailable = 0x80));
    assert_mentions(&e, &["pmu.ebx-unavailable = 0x80", "pmu.ebx-length = 7", "EBX bits beyond EAX[31:24]"]);
    with(|p| p.ebx_unavailable = 0x7F).validate().expect("bits 0-6 may be set");
}

#[test]
fn perf_capabilities_reserved_bits() {
    for bit in [18, 20, 63] {
        let e = error_of(&with(|p| p.perf_capabilities |= 1 << bit));
        assert_mentions(&e, &["pmu.perf-capabilities = ", "reserved", "MSR 0x345", "0xBFFFF"]);
    }
    for bit in [15, 16, 17, 19] {
        with(|p| p.perf_capabilities |= 1 << bit).validate().unwrap_or_else(|e| panic!("bit {bit}: {e}"));
    }
}

#[test]
fn fw_write_needs_version_2() {
    let mut p = version(1);
    p.pmu.perf_capabilities = PmuProfile::FW_WRITE | 0xC1;
    assert_mentions(&error_of(&p), &["pmu.perf-capabilities = 0x20C1", "FW_WRITE (bit 13)", "version >= 2", "18.2.5"]);
    p.pmu.perf_capabilities = 0xC1;
    p.validate().expect("version 1 may have PERF_CAPABILITIES without FW_WRITE");
}

#[test]
fn nominal_mhz_100_to_10000() {
    for mhz in [99, 10_001] {
        let e = error_of(&with(|p| p.nominal_mhz = mhz));
        assert_mentions(&e, &[&format!("pmu.nominal-mhz = {mhz}"), "100..=10000 MHz"]);
    }
    let mut p = version(0);
    p.pmu.nominal_mhz = 0;
    assert_mentions(&error_of(&p), &["pmu.nominal-mhz = 0"]);
}

#[test]
fn vendor_12_printable_ascii() {
    for vendor in ["GenuineInte", "GenuineIntel!", "Genuine\tntel", "GenuineIntél"] {
        let mut p = sample();
        p.vendor = vendor.to_string();
        let e = error_of(&p);
        assert_mentions(&e, &["vendor = ", "exactly 12 printable ASCII", "CPUID.0"]);
    }
}

#[test]
fn family_1_to_0x10e() {
    for family in [0, 0x10F] {
        let mut p = sample();
        p.family = family;
        let e = error_of(&p);
        assert_mentions(&e, &[&format!("family = 0x{family:X}"), "0x1..=0x10E", "CPUID.01H:EAX"]);
    }
}

#[test]
fn extended_model_only_for_family_6_and_f() {
    let mut p = sample();
    p.family = 5;
    let e = error_of(&p);
    assert_mentions(&e, &["model = 0x5E", "family 0x6 or >= 0xF", "extended model"]);
    p.family = 0x19;
    p.validate().expect("family 0x19 may use the extended model");
}

#[test]
fn stepping_at_most_0xf() {
    let mut p = sample();
    p.stepping = 0x10;
    assert_mentions(&error_of(&p), &["stepping = 0x10", "CPUID.01H:EAX[3:0]"]);
}

#[test]
fn validate_names_the_profile() {
    let mut p = with(|p| p.gp = 0);
    p.name = "mine".to_string();
    assert!(error_of(&p).starts_with("mine: pmu.gp = 0: "));
}

#[test]
fn lbr_stacks_are_ones_the_sdm_names() {
    let depth = error_of(&with(|p| p.lbr.as_mut().unwrap().depth = 12));
    assert_mentions(&depth, &["pmu.lbr.depth = 12", "4, 8, 16 or 32"]);
    let core = error_of(&with(|p| {
        let l = p.lbr.as_mut().unwrap();
        (l.from, l.to) = (0x40, 0x60);
    }));
    assert_mentions(&core, &["pmu.lbr.depth = 32", "at most 8 entries fit at 0x40/0x60"]);
    let bases = error_of(&with(|p| p.lbr.as_mut().unwrap().to = 0x6A0));
    assert_mentions(&bases, &["pmu.lbr.from = 0x680, pmu.lbr.to = 0x6A0", "0x40/0x60", "0x680/0x6C0"]);
    let select = error_of(&with(|p| p.lbr.as_mut().unwrap().select = 0x7FF));
    assert_mentions(&select, &["pmu.lbr.select = 0x7FF", "0x3FF"]);
}

#[test]
fn lbr_info_goes_with_format_5() {
    // Skylake's stack with Sandy Bridge's LBR format 3: LBR_INFO cannot be there.
    let e = error_of(&with(|p| p.perf_capabilities = 0x31C3));
    assert_mentions(&e, &["pmu.lbr.info = 0xDC0", "LBR_FMT 5", "LBR_FMT = 3"]);
    let e = error_of(&with(|p| p.lbr.as_mut().unwrap().info = None));
    assert_mentions(&e, &["pmu.lbr.info = absent", "LBR_FMT = 5"]);
    let e = error_of(&with(|p| p.perf_capabilities = 0x33C7));
    assert_mentions(&e, &["pmu.perf-capabilities = 0x33C7", "LBR_FMT", "1..=5"]);
    // A profile that hides PERF_CAPABILITIES keeps the CPU's stack.
    with(|p| p.perf_capabilities = 0).validate().expect("PDCM hidden, stack kept");
}

#[test]
fn model_msrs_store_or_ignore_a_bit_not_both() {
    let e = error_of(&with(|p| p.msrs.pebs_ld_lat = Some(MsrBits { bits: 0x1FFFF, ignored: 0xFFFF_0000 })));
    assert_mentions(&e, &["pmu.msrs.pebs-ld-lat = { bits = 0x1FFFF, ignored = 0xFFFF0000 }", "not both"]);
    let mut v0 = version(0);
    v0.pmu.msrs.offcore_rsp[0] = Some(MsrBits { bits: 0xFFFF, ignored: 0 });
    let e = error_of(&v0);
    assert_mentions(&e, &["pmu.lbr / pmu.msrs", "pmu.version = 0"]);
}
