//! A change marks exactly the counters whose counting it changes (KVM's
//! `kvm_pmu_request_counter_reprogram` / `reprogram_counters(pmu, diff)`), and nothing else does.

use super::*;

/// The GLOBAL_CTRL-layout mask of `ids`.
fn mask(ids: &[CounterId]) -> u64 {
    ids.iter().fold(0, |m, id| m | id.status_mask())
}

#[track_caller]
fn marks(pmu: &mut Pmu, msr: u32, value: u64, counters: &[CounterId], written: &[CounterId]) {
    pmu.take_reprogram();
    wr(pmu, msr, value);
    let r = pmu.take_reprogram();
    assert_eq!((r.counters, r.written), (mask(counters), mask(written)), "wrmsr({msr:#x}, {value:#x}) marked {r:x?}");
}

use CounterId::{Fixed, Gp};

#[test]
fn a_configuration_change_marks_only_its_counter() {
    let mut pmu = Pmu::new(&skylake());
    marks(&mut pmu, msr::IA32_PERFEVTSEL0, 0x0043_00C0, &[Gp(0)], &[]);
    marks(&mut pmu, msr::IA32_PERFEVTSEL0, 0x0043_00C0, &[], &[]); // same value
    marks(&mut pmu, msr::IA32_PERFEVTSEL0 + 2, 0x0003_00C0, &[Gp(2)], &[]);
    // Each 4-bit FIXED_CTR_CTRL field on its own.
    marks(&mut pmu, msr::IA32_FIXED_CTR_CTRL, 0x030, &[Fixed(1)], &[]);
    marks(&mut pmu, msr::IA32_FIXED_CTR_CTRL, 0x333, &[Fixed(0), Fixed(2)], &[]);
    marks(&mut pmu, msr::IA32_FIXED_CTR_CTRL, 0x333, &[], &[]);
    marks(&mut pmu, msr::IA32_FIXED_CTR_CTRL, 0xB33, &[Fixed(2)], &[]); // PMI bit of field 2
                                                                        // GLOBAL_CTRL: the bits that differ (it powers on with the GP enables set, SDM 18.2.2).
    marks(&mut pmu, msr::IA32_PERF_GLOBAL_CTRL, 0x7_0000_000F, &[Fixed(0), Fixed(1), Fixed(2)], &[]);
    marks(&mut pmu, msr::IA32_PERF_GLOBAL_CTRL, 0x7_0000_000F, &[], &[]);
    marks(&mut pmu, msr::IA32_PERF_GLOBAL_CTRL, 0x5_0000_0007, &[Gp(3), Fixed(1)], &[]);
}

#[test]
fn counter_writes_always_mark_and_say_written() {
    let mut pmu = Pmu::new(&skylake());
    marks(&mut pmu, msr::IA32_PMC0, 0, &[Gp(0)], &[Gp(0)]);
    marks(&mut pmu, msr::IA32_PMC0, 0, &[Gp(0)], &[Gp(0)]);
    marks(&mut pmu, msr::IA32_A_PMC0 + 1, 7, &[Gp(1)], &[Gp(1)]);
    marks(&mut pmu, msr::IA32_FIXED_CTR0 + 2, 7, &[Fixed(2)], &[Fixed(2)]);
}

#[test]
fn marks_accumulate_until_taken() {
    let mut pmu = Pmu::new(&skylake());
    pmu.take_reprogram();
    wr(&mut pmu, msr::IA32_PERFEVTSEL0 + 1, 0x0043_00C4);
    wr(&mut pmu, msr::IA32_FIXED_CTR0, 5);
    assert_eq!(pmu.reprogram_pending(), Reprogram { counters: mask(&[Gp(1), Fixed(0)]), written: mask(&[Fixed(0)]) });
    assert_eq!(pmu.take_reprogram().counters, mask(&[Gp(1), Fixed(0)]));
    assert!(pmu.take_reprogram().is_empty());
}

#[test]
fn freeze_changes_mark_every_counter() {
    let mut pmu = Pmu::new(&skylake());
    let ids = pmu.counter_ids();
    let all = mask(&ids);
    marks(&mut pmu, msr::IA32_PERF_GLOBAL_STATUS_SET, msr::GLOBAL_STATUS_CTR_FRZ, &ids, &[]);
    marks(&mut pmu, msr::IA32_PERF_GLOBAL_STATUS_SET, msr::GLOBAL_STATUS_CTR_FRZ, &[], &[]);
    pmu.take_reprogram();
    wr(&mut pmu, msr::IA32_PERF_GLOBAL_STATUS_RESET, msr::GLOBAL_STATUS_CTR_FRZ);
    assert_eq!(pmu.take_reprogram().counters, all);
    marks(&mut pmu, msr::IA32_PERF_GLOBAL_STATUS_RESET, msr::GLOBAL_STATUS_CTR_FRZ, &[], &[]);
}

#[test]
fn non_counting_changes_mark_nothing() {
    let mut pmu = Pmu::new(&skylake());
    marks(&mut pmu, msr::IA32_PERF_GLOBAL_STATUS_SET, 1, &[], &[]);
    marks(&mut pmu, msr::IA32_PERF_GLOBAL_OVF_CTRL, 1, &[], &[]);
    marks(&mut pmu, msr::IA32_DEBUGCTL, msr::DEBUGCTL_FREEZE_PERFMON_ON_PMI, &[], &[]);
    marks(&mut pmu, msr::IA32_MISC_ENABLE, 1, &[], &[]);
    marks(&mut pmu, msr::IA32_PEBS_ENABLE, 1, &[], &[]);
    marks(&mut pmu, msr::IA32_DS_AREA, 0x1000, &[], &[]);
    pmu.set_value(Gp(0), 5);
    pmu.add_events(Gp(0), u64::MAX);
    let _ = pmu.rdmsr(msr::IA32_PERF_GLOBAL_INUSE);
    assert!(pmu.take_reprogram().is_empty());
}

#[test]
fn failed_writes_mark_nothing() {
    let mut pmu = Pmu::new(&nehalem());
    pmu.take_reprogram();
    assert!(pmu.wrmsr(msr::IA32_PERFEVTSEL0, 1 << 32).is_err());
    assert!(pmu.wrmsr(msr::IA32_A_PMC0, 0).is_err());
    assert!(pmu.wrmsr(msr::IA32_PERF_GLOBAL_CTRL, 1 << 40).is_err());
    assert!(pmu.take_reprogram().is_empty());
}

#[test]
fn legacy_freeze_marks_only_the_counters_global_ctrl_stopped() {
    let mut pmu = Pmu::new(&nehalem());
    wr(&mut pmu, msr::IA32_DEBUGCTL, msr::DEBUGCTL_FREEZE_PERFMON_ON_PMI);
    wr(&mut pmu, msr::IA32_PERFEVTSEL0, msr::PERFEVTSEL_INT | msr::PERFEVTSEL_EN);
    wr(&mut pmu, msr::IA32_PERF_GLOBAL_CTRL, 0b101);
    wr(&mut pmu, msr::IA32_PMC0, 0xFFFF_FFFF);
    pmu.add_events(Gp(0), 1);
    pmu.take_reprogram();
    pmu.pmi_delivered();
    assert_eq!(pmu.take_reprogram().counters, mask(&[Gp(0), Gp(2)]));
    // GLOBAL_CTRL already 0: nothing to stop.
    wr(&mut pmu, msr::IA32_PERF_GLOBAL_CTRL, 0);
    wr(&mut pmu, msr::IA32_PERF_GLOBAL_OVF_CTRL, 1);
    pmu.add_events(Gp(0), 1 << 47);
    pmu.take_reprogram();
    pmu.pmi_delivered();
    assert!(pmu.take_reprogram().is_empty());
}

#[test]
fn undeclared_counters_are_never_marked() {
    // skylake: 4 GP counters, 3 fixed. A freeze marks only the declared ones.
    let mut pmu = Pmu::new(&skylake());
    wr(&mut pmu, msr::IA32_PERF_GLOBAL_STATUS_SET, msr::GLOBAL_STATUS_CTR_FRZ);
    assert_eq!(pmu.take_reprogram().counters, 0x7_0000_000F);
}
