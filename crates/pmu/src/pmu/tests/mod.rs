//! Unit tests of the PMU state machine under several profiles.

mod control;
mod counters;
mod counting;
mod dump;
mod existence;
mod freeze;
mod model_msrs;
mod netburst_pmu;
mod pebs;
mod prefetch;
mod random;
mod reprogram;

use super::*;
use crate::profile::PmuProfile;

/// A profile with every field spelled out.
#[allow(clippy::too_many_arguments)]
fn profile(
    version: u8,
    gp: u8,
    gp_width: u8,
    fixed: u8,
    fixed_width: u8,
    fixed_bitmap: u32,
    perf_capabilities: u64,
) -> PmuProfile {
    PmuProfile {
        version,
        gp,
        gp_width,
        ebx_length: if version == 0 { 0 } else { 7 },
        ebx_unavailable: 0,
        fixed,
        fixed_width,
        fixed_bitmap,
        perf_capabilities,
        misc_enable_perfmon: version > 0,
        nominal_mhz: 2000,
        ..PmuProfile::default()
    }
}

/// Core 2 like: v2, 2 GP x 40 bits, 3 fixed x 40 bits, no PDCM.
fn core2() -> PmuProfile {
    profile(2, 2, 40, 3, 40, 0, 0)
}

/// Nehalem: v3, 4 GP x 48, 3 fixed x 48, PERF_CAPABILITIES without FW_WRITE (FREEZE_WHILE_SMM set).
fn nehalem() -> PmuProfile {
    profile(3, 4, 48, 3, 48, 0, 0x10c3)
}

/// Skylake: v4, 4 GP x 48, 3 fixed x 48, PERF_CAPABILITIES 0x33c5 (FW_WRITE).
fn skylake() -> PmuProfile {
    profile(4, 4, 48, 3, 48, 0, 0x33c5)
}

/// Ice Lake: v5, 8 GP x 48, 4 fixed x 48 (topdown slots), FW_WRITE.
fn icelake() -> PmuProfile {
    let mut p = profile(5, 8, 48, 4, 48, 0, 0x33c5);
    p.ebx_length = 8;
    p
}

/// v5 with no contiguous fixed counters but ECX bitmap 0b1001 (fixed 0 and 3).
fn v5_sparse() -> PmuProfile {
    profile(5, 4, 48, 0, 48, 0b1001, 0x33c5)
}

/// v1: 2 GP x 32 bits, no fixed counters, no globals.
fn v1() -> PmuProfile {
    profile(1, 2, 32, 0, 0, 0, 0)
}

/// No architectural perfmon at all.
fn v0() -> PmuProfile {
    profile(0, 0, 0, 0, 0, 0, 0)
}

/// v4 with 64-bit counters and FW_WRITE (edge cases of the arithmetic).
fn wide64() -> PmuProfile {
    profile(4, 2, 64, 3, 64, 0, 0x33c5)
}

/// Every profile above.
fn all_profiles() -> Vec<(&'static str, PmuProfile)> {
    vec![
        ("core2", core2()),
        ("nehalem", nehalem()),
        ("skylake", skylake()),
        ("icelake", icelake()),
        ("v5_sparse", v5_sparse()),
        ("v1", v1()),
        ("v0", v0()),
        ("wide64", wide64()),
    ]
}

/// Assert a write #GPs and leaves the PMU exactly as it was (the reprogram marks included).
#[track_caller]
fn assert_wr_gp(pmu: &mut Pmu, msr: u32, value: u64) {
    let before = pmu.clone();
    assert_eq!(pmu.wrmsr(msr, value), Err(GpFault), "wrmsr({msr:#x}, {value:#x}) should #GP");
    assert_eq!(*pmu, before, "wrmsr({msr:#x}, {value:#x}) changed state on #GP");
}

/// Assert a write succeeds.
#[track_caller]
fn wr(pmu: &mut Pmu, msr: u32, value: u64) {
    assert_eq!(pmu.wrmsr(msr, value), Ok(()), "wrmsr({msr:#x}, {value:#x}) should succeed");
}

/// Read that must succeed.
#[track_caller]
fn rd(pmu: &Pmu, msr: u32) -> u64 {
    match pmu.rdmsr(msr) {
        Ok(v) => v,
        Err(GpFault) => panic!("rdmsr({msr:#x}) #GP"),
    }
}
