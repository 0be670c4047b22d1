//! The human-readable register dump.

use super::*;

#[test]
fn dump_names_and_decodes_registers() {
    let mut pmu = Pmu::new(&skylake());
    wr(&mut pmu, msr::IA32_PERFEVTSEL0, 0x0053_00C0);
    wr(&mut pmu, msr::IA32_PMC0, 0xFFFF_FFFF);
    wr(&mut pmu, msr::IA32_FIXED_CTR_CTRL, 0xB);
    wr(&mut pmu, msr::IA32_PERF_GLOBAL_CTRL, 1 << 32 | 1);
    pmu.add_events(CounterId::Gp(0), 1);
    let d = pmu.dump();
    for needle in [
        "architectural perfmon v4: 4 GP x 48 bits, fixed [0,1,2] x 48 bits",
        "IA32_PERF_CAPABILITIES",
        "FW_WRITE",
        "IA32_PERF_GLOBAL_CTRL",
        "enable: PMC0 FIXED_CTR0",
        "overflow: PMC0",
        "IA32_PERF_GLOBAL_INUSE",
        "PMI_InUse",
        "[0] EN=3 (all rings) PMI",
        "IA32_PERFEVTSEL0",
        "event=0xc0 umask=0x00 USR OS INT EN cmask=0x00",
        "IA32_PMC3",
        "IA32_FIXED_CTR2",
        "counting",
        "PMI pending: yes",
        "IA32_MISC_ENABLE",
        "PERFMON_AVAILABLE",
    ] {
        assert!(d.contains(needle), "missing {needle:?} in\n{d}");
    }
    assert!(!d.contains("IA32_PMC4"));
}

#[test]
fn dump_every_profile() {
    for (name, p) in all_profiles() {
        let d = Pmu::new(&p).dump();
        assert!(d.contains("IA32_DEBUGCTL"), "{name}");
        assert_eq!(d.contains("IA32_PERF_GLOBAL_CTRL"), p.version >= 2, "{name}");
        assert_eq!(d.contains("IA32_PMC0"), p.version >= 1, "{name}");
    }
}
