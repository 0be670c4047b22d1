//! The generation counter bumps on every change that affects counting, and only then.

use super::*;

#[track_caller]
fn bumps(pmu: &mut Pmu, msr: u32, value: u64, expect: bool) {
    let gen = pmu.generation();
    wr(pmu, msr, value);
    assert_eq!(pmu.generation() != gen, expect, "wrmsr({msr:#x}, {value:#x})");
}

#[test]
fn config_changes_bump() {
    let mut pmu = Pmu::new(&skylake());
    bumps(&mut pmu, msr::IA32_PERFEVTSEL0, 0x0043_00C0, true);
    bumps(&mut pmu, msr::IA32_PERFEVTSEL0, 0x0043_00C0, false); // same value
    bumps(&mut pmu, msr::IA32_PERFEVTSEL0, 0x0003_00C0, true);
    bumps(&mut pmu, msr::IA32_FIXED_CTR_CTRL, 0x333, true);
    bumps(&mut pmu, msr::IA32_FIXED_CTR_CTRL, 0x333, false);
    bumps(&mut pmu, msr::IA32_PERF_GLOBAL_CTRL, 0x7_0000_000F, true);
    bumps(&mut pmu, msr::IA32_PERF_GLOBAL_CTRL, 0x7_0000_000F, false);
    bumps(&mut pmu, msr::IA32_PERF_GLOBAL_CTRL, 0, true);
}

#[test]
fn counter_writes_always_bump() {
    let mut pmu = Pmu::new(&skylake());
    bumps(&mut pmu, msr::IA32_PMC0, 0, true);
    bumps(&mut pmu, msr::IA32_PMC0, 0, true);
    bumps(&mut pmu, msr::IA32_A_PMC0 + 1, 7, true);
    bumps(&mut pmu, msr::IA32_FIXED_CTR0 + 2, 7, true);
}

#[test]
fn freeze_changes_bump() {
    let mut pmu = Pmu::new(&skylake());
    bumps(&mut pmu, msr::IA32_PERF_GLOBAL_STATUS_SET, msr::GLOBAL_STATUS_CTR_FRZ, true);
    bumps(&mut pmu, msr::IA32_PERF_GLOBAL_STATUS_SET, msr::GLOBAL_STATUS_CTR_FRZ, false);
    bumps(&mut pmu, msr::IA32_PERF_GLOBAL_STATUS_RESET, msr::GLOBAL_STATUS_CTR_FRZ, true);
    bumps(&mut pmu, msr::IA32_PERF_GLOBAL_STATUS_RESET, msr::GLOBAL_STATUS_CTR_FRZ, false);
}

#[test]
fn non_counting_changes_do_not_bump() {
    let mut pmu = Pmu::new(&skylake());
    bumps(&mut pmu, msr::IA32_PERF_GLOBAL_STATUS_SET, 1, false);
    bumps(&mut pmu, msr::IA32_PERF_GLOBAL_OVF_CTRL, 1, false);
    bumps(&mut pmu, msr::IA32_DEBUGCTL, msr::DEBUGCTL_FREEZE_PERFMON_ON_PMI, false);
    bumps(&mut pmu, msr::IA32_MISC_ENABLE, 1, false);
    bumps(&mut pmu, msr::IA32_PEBS_ENABLE, 1, false);
    bumps(&mut pmu, msr::IA32_DS_AREA, 0x1000, false);
    let gen = pmu.generation();
    pmu.set_value(CounterId::Gp(0), 5);
    pmu.add_events(CounterId::Gp(0), u64::MAX);
    let _ = pmu.rdmsr(msr::IA32_PERF_GLOBAL_INUSE);
    assert_eq!(pmu.generation(), gen);
}

#[test]
fn failed_writes_do_not_bump() {
    let mut pmu = Pmu::new(&nehalem());
    let gen = pmu.generation();
    assert!(pmu.wrmsr(msr::IA32_PERFEVTSEL0, 1 << 32).is_err());
    assert!(pmu.wrmsr(msr::IA32_A_PMC0, 0).is_err());
    assert!(pmu.wrmsr(msr::IA32_PERF_GLOBAL_CTRL, 1 << 40).is_err());
    assert_eq!(pmu.generation(), gen);
}

#[test]
fn legacy_freeze_bumps_only_if_global_ctrl_changes() {
    let mut pmu = Pmu::new(&nehalem());
    wr(&mut pmu, msr::IA32_DEBUGCTL, msr::DEBUGCTL_FREEZE_PERFMON_ON_PMI);
    wr(&mut pmu, msr::IA32_PERFEVTSEL0, msr::PERFEVTSEL_INT | msr::PERFEVTSEL_EN);
    wr(&mut pmu, msr::IA32_PERF_GLOBAL_CTRL, 0);
    wr(&mut pmu, msr::IA32_PMC0, 0xFFFF_FFFF);
    pmu.add_events(CounterId::Gp(0), 1);
    let gen = pmu.generation();
    pmu.pmi_delivered();
    assert_eq!(pmu.generation(), gen, "GLOBAL_CTRL was already 0");
}
