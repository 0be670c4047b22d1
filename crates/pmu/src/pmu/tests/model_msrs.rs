//! The model-specific PMU MSRs of the built-in profiles: the LBR stack's registers, OFFCORE_RSP,
//! PEBS_LD_LAT and PEBS_FRONTEND, present where the named CPU has them and writing as it does.

use super::*;
use crate::profile::Profile;

fn builtin(name: &str) -> Pmu {
    Pmu::new(&Profile::load(name).expect("built-in profile").pmu)
}

/// Every trapped MSR that reads without #GP and is not architectural.
fn model_specific(pmu: &Pmu) -> Vec<u32> {
    let architectural = |m: u32| matches!(m, 0xC1..=0xC8 | 0x186..=0x18D | 0x1A0 | 0x1D9 | 0x309..=0x30C | 0x345 | 0x38D..=0x392 | 0x3F1 | 0x3F2 | 0x4C1..=0x4C8 | 0x600);
    Pmu::TRAPPED_MSRS
        .iter()
        .flat_map(|&(lo, hi)| lo..=hi)
        .filter(|&m| !architectural(m) && pmu.rdmsr(m).is_ok())
        .collect()
}

fn span(first: u32, n: u32) -> impl Iterator<Item = u32> {
    first..first + n
}

#[test]
fn each_profile_has_its_cpus_msrs_and_no_others() {
    let expect = |lbr: Vec<u32>, others: &[u32]| {
        let mut v: Vec<u32> = lbr.into_iter().chain(others.iter().copied()).collect();
        v.sort_unstable();
        v
    };
    let skl: Vec<u32> =
        span(0x680, 32).chain(span(0x6C0, 32)).chain(span(0xDC0, 32)).chain([0x1C8, 0x1C9, 0x1DD, 0x1DE]).collect();
    let snb: Vec<u32> = span(0x680, 16).chain(span(0x6C0, 16)).chain([0x1C8, 0x1C9, 0x1DD, 0x1DE]).collect();
    let core2: Vec<u32> = span(0x40, 4).chain(span(0x60, 4)).chain([0x1C9, 0x1DD, 0x1DE]).collect();
    let cases = [
        ("skylake", expect(skl.clone(), &[0x1A6, 0x1A7, 0x3F6, 0x3F7])),
        ("icelake", expect(skl, &[0x1A6, 0x1A7, 0x3F6, 0x3F7])),
        ("sandybridge", expect(snb.clone(), &[0x1A6, 0x1A7, 0x3F6])),
        ("nehalem", expect(snb.clone(), &[0x1A6, 0x3F6])),
        ("nehalem-llc-masked", expect(snb, &[0x1A6, 0x3F6])),
        ("core2", expect(core2, &[])),
        ("no-pmu", vec![]),
    ];
    for (name, want) in cases {
        let mut pmu = builtin(name);
        let got = model_specific(&pmu);
        assert_eq!(got, want, "{name}");
        for &m in &got {
            assert_eq!(rd(&pmu, m), 0, "{name}: {m:#x} is 0 at power-on");
        }
        let absent: Vec<u32> =
            Pmu::TRAPPED_MSRS.iter().flat_map(|&(lo, hi)| lo..=hi).filter(|m| pmu.rdmsr(*m).is_err()).collect();
        for m in absent {
            assert_wr_gp(&mut pmu, m, 0);
        }
    }
}

#[test]
fn skylake_writes_as_the_i7_6700k_measured() {
    let mut pmu = builtin("skylake");
    // MSR_LASTBRANCH_TOS: 5 bits for 32 entries.
    wr(&mut pmu, 0x1C9, 31);
    assert_eq!(rd(&pmu, 0x1C9), 31);
    assert_wr_gp(&mut pmu, 0x1C9, 32);
    // FROM/TO take canonical addresses only.
    for msr in [0x680, 0x69F, 0x6C0, 0x6DF] {
        wr(&mut pmu, msr, 0xFFFF_8000_0000_1234);
        assert_eq!(rd(&pmu, msr), 0xFFFF_8000_0000_1234);
        wr(&mut pmu, msr, 0x0000_7FFF_FFFF_FFFF);
        for bit in 47..64 {
            assert_wr_gp(&mut pmu, msr, 1 << bit);
        }
    }
    // LBR_INFO: MISPRED, IN_TX, TX_ABORT and the cycle count.
    wr(&mut pmu, 0xDC5, 0xE000_0000_0000_FFFF);
    assert_eq!(rd(&pmu, 0xDC5), 0xE000_0000_0000_FFFF);
    assert_wr_gp(&mut pmu, 0xDC5, 1 << 16);
    assert_wr_gp(&mut pmu, 0xDC5, 1 << 60);
    // LBR_SELECT: bits 9:0.
    wr(&mut pmu, 0x1C8, 0x3FF);
    assert_wr_gp(&mut pmu, 0x1C8, 0x400);
    // OFFCORE_RSP: #GP mask 0xFFFFFFC000006000.
    wr(&mut pmu, 0x1A7, 0x3F_FFFF_9FFF);
    assert_eq!(rd(&pmu, 0x1A7), 0x3F_FFFF_9FFF);
    assert_wr_gp(&mut pmu, 0x1A6, 1 << 13);
    assert_wr_gp(&mut pmu, 0x1A6, 1 << 38);
    // PEBS_LD_LAT: bits 63:16 are ignored, not #GP.
    wr(&mut pmu, 0x3F6, 0xFFFF_FFFF_0001_0003);
    assert_eq!(rd(&pmu, 0x3F6), 0x3);
    // PEBS_FRONTEND: #GP mask 0xFFFFFFFFFF8000E8.
    wr(&mut pmu, 0x3F7, 0x7F_FF17);
    assert_wr_gp(&mut pmu, 0x3F7, 0x8);
    assert_wr_gp(&mut pmu, 0x3F7, 1 << 23);
    // None of it touches the counters.
    assert!(pmu.take_reprogram().is_empty());
}

#[test]
fn sandy_bridge_keeps_mispred_in_from_ip_bit_63() {
    let mut pmu = builtin("sandybridge");
    // LBR format 3: bit 63 is MISPRED, the address below it is sign-extended from bit 47.
    for ok in [0x8000_0000_0000_1000, 0xFFFF_8000_0000_0000, 0x7FFF_8000_0000_0000, 0x0000_7FFF_FFFF_FFFF] {
        wr(&mut pmu, 0x68F, ok);
        assert_eq!(rd(&pmu, 0x68F), ok);
    }
    assert_wr_gp(&mut pmu, 0x680, 0x0000_8000_0000_0000);
    assert_wr_gp(&mut pmu, 0x680, 0x4000_0000_0000_0000);
    // TO_IP has no flags.
    assert_wr_gp(&mut pmu, 0x6C0, 0x8000_0000_0000_1000);
    wr(&mut pmu, 0x1C9, 15);
    assert_wr_gp(&mut pmu, 0x1C9, 16);
    wr(&mut pmu, 0x1C8, 0x1FF);
    assert_wr_gp(&mut pmu, 0x1C8, 0x200);
    assert_wr_gp(&mut pmu, 0x1A6, 1 << 12);
}

#[test]
fn core2_has_a_four_entry_stack_at_0x40() {
    let mut pmu = builtin("core2");
    wr(&mut pmu, 0x43, 0xFFFF_FFFF_8000_0000);
    wr(&mut pmu, 0x63, 0x1000);
    wr(&mut pmu, 0x1C9, 3);
    assert_wr_gp(&mut pmu, 0x1C9, 4);
    assert_eq!((rd(&pmu, 0x43), rd(&pmu, 0x63), rd(&pmu, 0x1C9)), (0xFFFF_FFFF_8000_0000, 0x1000, 3));
    assert!(pmu.dump().contains("MSR_LASTBRANCH_3_FROM_IP"), "{}", pmu.dump());
}

use crate::pmu::lbr::{Branch, BranchType};

fn branch(from: u64, to: u64, kind: BranchType) -> Branch {
    Branch { from, to, kind, cpl: 0, mispredicted: false, cycles: 7, event: false }
}

#[test]
fn the_stack_records_only_while_debugctl_lbr_is_set() {
    let mut pmu = builtin("skylake");
    let before = pmu.clone();
    assert!(!pmu.lbr_recording());
    assert!(!pmu.record_branch(&branch(0x1000, 0x2000, BranchType::NearRelJmp)));
    assert_eq!(pmu, before, "nothing recorded with DEBUGCTL.LBR clear");
    wr(&mut pmu, msr::IA32_DEBUGCTL, msr::DEBUGCTL_LBR);
    for k in 1..=34u64 {
        let b =
            Branch { mispredicted: k == 2, cycles: 1000 * k * k, ..branch(0x1000 + k, 0x2000 + k, BranchType::Jcc) };
        assert!(pmu.record_branch(&b));
        let tos = rd(&pmu, 0x1C9);
        assert_eq!(tos, k % 32, "TOS advances modulo the depth");
        assert_eq!(rd(&pmu, 0x680 + tos as u32), 0x1000 + k, "format 5: FROM_IP is the address alone");
        assert_eq!(rd(&pmu, 0x6C0 + tos as u32), 0x2000 + k);
        let info = rd(&pmu, 0xDC0 + tos as u32);
        assert_eq!(info >> 63, u64::from(k == 2), "LBR_INFO.MISPRED");
        assert_eq!(info & 0xFFFF, (1000 * k * k).min(0xFFFF), "the cycle count saturates");
    }
    assert!(pmu.take_reprogram().is_empty(), "recording touches no counter");
}

#[test]
fn lbr_select_filters_by_ring_and_branch_type() {
    let mut pmu = builtin("skylake");
    wr(&mut pmu, msr::IA32_DEBUGCTL, msr::DEBUGCTL_LBR);
    wr(&mut pmu, 0x1C8, 1 << 2 | 1 << 1); // no JCC, nothing that ends in ring > 0
    assert!(!pmu.record_branch(&branch(1, 2, BranchType::Jcc)));
    assert!(!pmu.record_branch(&Branch { cpl: 3, ..branch(1, 2, BranchType::NearRet) }));
    assert!(pmu.record_branch(&branch(1, 2, BranchType::NearRet)));
    wr(&mut pmu, 0x1C8, 1 << 0 | 1 << 8); // nothing that ends in ring 0, no far branches
    assert!(!pmu.record_branch(&branch(1, 2, BranchType::NearIndCall)));
    assert!(!pmu.record_branch(&Branch { cpl: 3, ..branch(1, 2, BranchType::Far) }));
    assert!(pmu.record_branch(&Branch { cpl: 3, ..branch(1, 2, BranchType::NearIndJmp) }));
    assert_eq!(rd(&pmu, 0x1C9), 2);
}

#[test]
fn freeze_lbrs_on_pmi_stops_the_stack_as_the_version_says() {
    // v4 (Skylake): GLOBAL_STATUS.LBR_Frz freezes it until software clears the bit.
    let mut pmu = builtin("skylake");
    wr(&mut pmu, msr::IA32_DEBUGCTL, msr::DEBUGCTL_LBR | msr::DEBUGCTL_FREEZE_LBRS_ON_PMI);
    wr(&mut pmu, msr::IA32_PERFEVTSEL0, 0x53_00C0);
    wr(&mut pmu, msr::IA32_A_PMC0, 0xFFFF_FFFF_FFFF);
    pmu.add_events(CounterId::Gp(0), 1);
    pmu.pmi_delivered();
    assert!(!pmu.lbr_recording());
    assert!(!pmu.record_branch(&branch(1, 2, BranchType::Jcc)));
    wr(&mut pmu, msr::IA32_PERF_GLOBAL_STATUS_RESET, msr::GLOBAL_STATUS_LBR_FRZ);
    assert!(pmu.record_branch(&branch(1, 2, BranchType::Jcc)));
    // v3 (Nehalem): the PMI clears DEBUGCTL.LBR.
    let mut pmu = builtin("nehalem");
    wr(&mut pmu, msr::IA32_DEBUGCTL, msr::DEBUGCTL_LBR | msr::DEBUGCTL_FREEZE_LBRS_ON_PMI);
    wr(&mut pmu, msr::IA32_PERFEVTSEL0, 0x53_00C0);
    wr(&mut pmu, msr::IA32_PMC0, 0xFFFF_FFFF);
    pmu.add_events(CounterId::Gp(0), 1);
    pmu.pmi_delivered();
    assert_eq!(rd(&pmu, msr::IA32_DEBUGCTL) & msr::DEBUGCTL_LBR, 0);
    assert!(!pmu.record_branch(&branch(1, 2, BranchType::Jcc)));
}

#[test]
fn each_format_keeps_mispred_where_the_sdm_says() {
    for (name, from_flag) in [("sandybridge", 1u64 << 63), ("nehalem", 1 << 63), ("core2", 0)] {
        let mut pmu = builtin(name);
        wr(&mut pmu, msr::IA32_DEBUGCTL, msr::DEBUGCTL_LBR);
        let b = Branch { mispredicted: true, ..branch(0xFFFF_FFFF_8100_0000, 0x40_1000, BranchType::NearRet) };
        assert!(pmu.record_branch(&b), "{name}");
        let (tos, from) = if name == "core2" { (1, 0x40) } else { (1, 0x680) };
        assert_eq!(rd(&pmu, 0x1C9), tos, "{name}");
        let want =
            if from_flag != 0 { 0xFFFF_FFFF_8100_0000 & (u64::MAX >> 1) | from_flag } else { 0xFFFF_FFFF_8100_0000 };
        assert_eq!(rd(&pmu, from + 1), want, "{name}: FROM_IP");
        assert_eq!(pmu.wrmsr(from + 1, want), Ok(()), "{name}: a recorded FROM_IP can be written back");
    }
    assert!(!builtin("no-pmu").record_branch(&branch(1, 2, BranchType::Jcc)));
}

#[test]
fn an_exception_copies_the_last_branch_into_the_ler_msrs() {
    let mut pmu = builtin("sandybridge");
    wr(&mut pmu, 0x1DD, 0xFFFF_FFFF_FFFF_FFFF);
    assert_eq!(rd(&pmu, 0x1DD), u64::MAX, "LER_FROM_LIP is read/write with no reserved bits");
    wr(&mut pmu, 0x1DD, 0);
    wr(&mut pmu, msr::IA32_DEBUGCTL, msr::DEBUGCTL_LBR);
    // Filtered Jcc: not in the stack, but still the last branch taken.
    wr(&mut pmu, 0x1C8, 1 << 2);
    assert!(!pmu.record_branch(&Branch { mispredicted: true, ..branch(0x1000, 0x2000, BranchType::Jcc) }));
    let fault = Branch { event: true, ..branch(0x2005, 0x9000, BranchType::Far) };
    assert!(pmu.record_branch(&fault));
    assert_eq!((rd(&pmu, 0x1DD), rd(&pmu, 0x1DE)), (0x1000, 0x2000), "LER: the branch before the exception");
    // Branches that are not events leave the LER as it is.
    assert!(pmu.record_branch(&branch(0x9010, 0x9100, BranchType::NearRelJmp)));
    assert_eq!((rd(&pmu, 0x1DD), rd(&pmu, 0x1DE)), (0x1000, 0x2000));
    assert!(pmu.record_branch(&fault));
    assert_eq!((rd(&pmu, 0x1DD), rd(&pmu, 0x1DE)), (0x9010, 0x9100));
    // With DEBUGCTL.LBR clear nothing changes.
    wr(&mut pmu, msr::IA32_DEBUGCTL, 0);
    assert!(!pmu.record_branch(&fault));
    assert_eq!((rd(&pmu, 0x1DD), rd(&pmu, 0x1DE)), (0x9010, 0x9100));
}
