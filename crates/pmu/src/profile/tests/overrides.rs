//! `--pmu` overrides: every key, every error, validation with origin `--pmu`.

use super::super::{PmuProfile, ProfileError, OVERRIDE_KEYS};
use super::{assert_mentions, err, sample};

#[test]
fn example_from_the_contract() {
    let mut p = sample();
    p.apply_overrides("version=4,gp=8,gp-width=48,fixed=3,ebx-unavailable=0x18").expect("applies");
    assert_eq!((p.pmu.version, p.pmu.gp, p.pmu.gp_width, p.pmu.fixed), (4, 8, 48, 3));
    assert_eq!(p.pmu.ebx_unavailable, 0x18);
    assert_eq!(p.pmu.leaf_0a(), [0x0730_0804, 0x18, 0, 0x0603]);
}

#[test]
fn empty_spec_is_a_no_op() {
    let mut p = sample();
    let before = p.clone();
    p.apply_overrides("").expect("no-op");
    p.apply_overrides("  ").expect("no-op");
    assert_eq!(p, before);
}

#[test]
fn every_key_sets_its_field() {
    let mut p = sample();
    p.apply_overrides(
        "version=5, gp=6, gp-width=40, ebx-length=8, ebx-unavailable=0b1000_0000, fixed=2, \
         fixed-width=36, fixed-bitmap=0x8, perf-capabilities=0x10C5, misc-enable-perfmon=false, \
         nominal-mhz=3200, fw-write=true, vendor=GenuineIotel, family=0x19, model=0x21, stepping=2",
    )
    .expect("applies");
    let expected = PmuProfile {
        version: 5,
        gp: 6,
        gp_width: 40,
        ebx_length: 8,
        ebx_unavailable: 0x80,
        fixed: 2,
        fixed_width: 36,
        fixed_bitmap: 0x8,
        perf_capabilities: 0x10C5 | PmuProfile::FW_WRITE,
        misc_enable_perfmon: false,
        nominal_mhz: 3200,
        // Another vendor, family and model: no CPU's event list.
        events: None,
        ..sample().pmu
    };
    assert!(sample().pmu.events.is_some());
    assert_eq!(p.pmu, expected);
    assert_eq!((p.vendor.as_str(), p.family, p.model, p.stepping), ("GenuineIotel", 0x19, 0x21, 2));
    assert_eq!(OVERRIDE_KEYS.len(), 16);
}

#[test]
fn fw_write_clears_and_sets_bit_13() {
    let mut p = sample();
    p.apply_overrides("fw-write=0").expect("applies");
    assert_eq!(p.pmu.perf_capabilities, 0x33C5 & !PmuProfile::FW_WRITE);
    p.apply_overrides("fw-write=1").expect("applies");
    assert_eq!(p.pmu.perf_capabilities, 0x33C5);
    p.apply_overrides("fw-write=false,misc-enable-perfmon=0,misc-enable-perfmon=true").expect("applies");
    assert!(!p.pmu.fw_write());
    assert!(p.pmu.misc_enable_perfmon, "later items win");
}

#[test]
fn result_is_validated_with_origin_pmu() {
    let mut p = sample();
    let before = p.clone();
    let e = err(p.apply_overrides("version=1"));
    assert!(matches!(e, ProfileError::Invalid { .. }));
    assert_mentions(
        &e.to_string(),
        &["--pmu: pmu.version = 1: version 1 has no fixed-function counters", "set fixed=0 and fixed-width=0"],
    );
    assert_eq!(p, before, "a failed override leaves the profile unchanged");
    p.apply_overrides("version=1,fixed=0,fixed-width=0,fw-write=0").expect("valid version 1");
    assert_eq!(p.pmu.leaf_0a()[3], 0);
}

#[test]
fn unknown_key() {
    let e = err(sample().apply_overrides("version=4,anythread=1"));
    assert!(matches!(e, ProfileError::Override { .. }));
    assert_mentions(&e.to_string(), &["--pmu: anythread: unknown key", "fw-write", "stepping"]);
}

#[test]
fn missing_equals() {
    let e = err(sample().apply_overrides("gp=4,fixed"));
    assert_mentions(&e.to_string(), &["--pmu: fixed: ", "key=value"]);
}

#[test]
fn bad_numbers() {
    for (spec, key) in [
        ("gp=four", "gp"),
        ("gp=", "gp"),
        ("gp=-1", "gp"),
        ("ebx-unavailable=0x", "ebx-unavailable"),
        ("fixed-bitmap=0b102", "fixed-bitmap"),
        ("family=1.5", "family"),
    ] {
        let e = err(sample().apply_overrides(spec));
        assert_mentions(&e.to_string(), &[&format!("--pmu: {key}: "), "is not a number"]);
    }
}

#[test]
fn values_out_of_the_field_type() {
    for (spec, key, range) in [
        ("gp=256", "gp", "0..=255"),
        ("family=0x10000", "family", "0..=65535"),
        ("ebx-unavailable=0x1_0000_0000", "ebx-unavailable", "0..=4294967295"),
        ("nominal-mhz=99999999999", "nominal-mhz", "32-bit"),
        ("perf-capabilities=0x1_0000_0000_0000_0000", "perf-capabilities", "64-bit"),
    ] {
        let e = err(sample().apply_overrides(spec));
        assert_mentions(&e.to_string(), &[&format!("--pmu: {key}: "), "out of range", range]);
    }
}

#[test]
fn bad_booleans() {
    for key in ["fw-write", "misc-enable-perfmon"] {
        let e = err(sample().apply_overrides(&format!("{key}=yes")));
        assert_mentions(&e.to_string(), &[&format!("--pmu: {key}: "), "not a boolean"]);
    }
}

#[test]
fn identity_overrides_are_validated() {
    let e = err(sample().apply_overrides("vendor=Intel"));
    assert_mentions(&e.to_string(), &["--pmu: vendor = \"Intel\"", "12 printable ASCII"]);
    let e = err(sample().apply_overrides("stepping=16"));
    assert_mentions(&e.to_string(), &["--pmu: stepping = 0x10"]);
}

#[test]
fn number_syntaxes() {
    use super::super::{parse_u64, NumberError};
    assert_eq!(parse_u64("42"), Ok(42));
    assert_eq!(parse_u64("0x2A"), Ok(42));
    assert_eq!(parse_u64("0X2a"), Ok(42));
    assert_eq!(parse_u64("0b10_1010"), Ok(42));
    assert_eq!(parse_u64("+42"), Err(NumberError::NotANumber));
    assert_eq!(parse_u64("18446744073709551616"), Err(NumberError::TooLarge));
}
