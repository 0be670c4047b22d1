//! Counting with the precise backend: the walkthrough experiments (README) and the other counting
//! guests pass under every shipped profile, and give identical output on every run.
mod common;
use common::*;
use emon::profile::{Profile, ARCH_EVENTS};

const COUNTING_GUESTS: &[&str] = &["count-instructions", "pmi-overflow", "freeze-on-pmi", "step-events"];

fn run_guest(profile: &str, guest: &str) -> Run {
    let g = format!("guest:{guest}");
    emon(&["run", "--backend", "precise", "--timeout", "120", "--profile", profile, &g])
}

#[test]
fn counting_guests_pass_under_every_profile() {
    if !kvm_available() {
        return;
    }
    for guest in COUNTING_GUESTS {
        for profile in Profile::builtin_names() {
            let r = run_guest(profile, guest);
            r.assert_status(0).assert_no_failures();
            if Profile::load(profile).unwrap().pmu.version >= 2 {
                assert!(!r.summary().starts_with("SUMMARY: 0 tests"), "{guest} under {profile} ran nothing");
            }
        }
    }
}

#[test]
fn counts_are_identical_on_every_run() {
    if !kvm_available() {
        return;
    }
    for guest in COUNTING_GUESTS {
        let a = run_guest("nehalem", guest);
        let b = run_guest("nehalem", guest);
        a.assert_status(0);
        assert_eq!(a.stdout, b.stdout, "{guest}: two runs differ");
    }
}

#[test]
fn seed_experiment_counts() {
    if !kvm_available() {
        return;
    }
    // 15-2: call + foo(N=100) (2N+2) + the 4 instructions that stop the counter.
    let r = run_guest("nehalem", "count-instructions");
    assert!(r.stdout.contains("foo(N=100): IA32_PMC0 = 207 (0xcf)"), "{}", r.stdout);
    // 15-4: the counter advances by the handler's 104 instructions, then is frozen.
    let r = run_guest("nehalem", "freeze-on-pmi");
    assert!(r.stdout.contains("first PMI (no freeze): IA32_PMC0 36 then 140"), "{}", r.stdout);
    assert!(r.stdout.contains("second PMI (freeze): IA32_PMC0 0 then 0"), "{}", r.stdout);
}

#[test]
fn events_lists_support_per_profile() {
    let r = emon(&["events", "--profile", "nehalem-llc-masked"]);
    r.assert_status(0);
    let line = |bit: &str| r.stdout.lines().find(|l| l.starts_with(bit)).unwrap_or_else(|| panic!("{}", r.stdout));
    assert!(line("1 ").contains("Instructions Retired") && line("1 ").contains("counted exactly"), "{}", r.stdout);
    assert!(line("1 ").contains("FIXED_CTR0"), "{}", r.stdout);
    assert!(line("3 ").contains("unavailable") && line("3 ").contains("counted (cache model)"), "{}", r.stdout);
    assert!(line("2 ").contains("counted (cost model, reference clock)"), "{}", r.stdout);
    assert!(r.stdout.contains("one tick per 20/1 TSC ticks of the model (no CPUID leaf 0x15)"), "{}", r.stdout);
    assert!(r.stdout.contains("Cache model (LLC events and the cache-model events): L1d 32 KiB 8-way"), "{}", r.stdout);
}

#[test]
fn max_valued_counters_overflow_at_every_width() {
    if !kvm_available() {
        return;
    }
    // Legacy 32-bit writes sign-extend to the width; full-width writes go through IA32_A_PMC0.
    for w in ["32", "40", "48", "63", "64"] {
        let spec = format!("gp-width={w}");
        let r = emon(&["run", "--profile", "skylake", "--pmu", &spec, "guest:pmi-overflow"]);
        r.assert_status(0).assert_no_failures();
        assert!(
            r.stdout.contains("PASS: instructions full-width write through IA32_A_PMC0: the PMI handler ran once"),
            "{w}"
        );
    }
    // Version 1: no GLOBAL_CTRL/STATUS, the PMI still arrives.
    let r = emon(&["run", "--profile", "core2", "--pmu", "version=1,fixed=0,fixed-width=0", "guest:pmi-overflow"]);
    r.assert_status(0).assert_no_failures();
}

// --- guest:hal-emon and guest:pmu-counters (issue 3) ---

/// The Windows HAL's Emon profile sources (value, name, CPUID.0AH:EBX bit, PERFEVTSEL value),
/// as in guest:hal-emon; ProfileTime (0x00) is not an Emon source.
const HAL_SOURCES: [(u8, &str, u8, u32); 12] = [
    (0x02, "ProfileTotalIssues", 1, 0x0003_00C0),
    (0x06, "ProfileBranchInstructions", 5, 0x0003_00C4),
    (0x0A, "ProfileCacheMisses", 4, 0x0003_412E),
    (0x0B, "ProfileBranchMispredictions", 6, 0x0003_00C5),
    (0x13, "ProfileTotalCycles", 0, 0x0003_003C),
    (0x19, "ProfileUnhaltedCoreCycles", 0, 0x0003_003C),
    (0x1A, "ProfileInstructionRetired", 1, 0x0003_00C0),
    (0x1B, "ProfileUnhaltedReferenceCycles", 2, 0x0003_013C),
    (0x1C, "ProfileLLCReference", 3, 0x0003_4F2E),
    (0x1D, "ProfileLLCMisses", 4, 0x0003_412E),
    (0x1E, "ProfileBranchInstructionRetired", 5, 0x0003_00C4),
    (0x1F, "ProfileBranchMispredictsRetired", 6, 0x0003_00C5),
];

/// What emon's precise backend counts for (event, umask) over the guests' measured block with
/// loop count `n` (see guest:pmu-counters): 2N+8 instructions, N+2 branches, 2 misses,
/// 3N+108 cycles, 4x that in slots, 0 for the LLC events it does not model.
fn block_count(event: u8, umask: u8, n: u64) -> u64 {
    match (event, umask) {
        (0xC0, 0x00) => 2 * n + 8,
        (0xC4, 0x00) => n + 2,
        (0xC5, 0x00) => 2,
        (0x3C, 0x00) | (0x3C, 0x01) => 3 * n + 108,
        (0xA4, 0x01) => 4 * (3 * n + 108),
        _ => 0,
    }
}

/// Runs `guest` twice with the same arguments: it must pass, and print the same both times.
fn run_twice_deterministic(args: &[&str]) -> Run {
    let first = emon(args);
    first.assert_status(0).assert_no_failures();
    let second = emon(args);
    second.assert_status(0);
    assert_eq!(first.stdout, second.stdout, "{args:?}: two runs printed different output");
    first
}

/// Checks guest:hal-emon's table, decisions and counts against the profile, from the host side.
fn check_hal_emon(r: &Run, p: &Profile) {
    let out = &r.stdout;
    let pmu = &p.pmu;
    let emon = p.vendor == "GenuineIntel" && pmu.version >= 1 && pmu.gp >= 1;
    let mut supported = 0;
    for (value, name, bit, select) in HAL_SOURCES {
        let ok = emon && pmu.arch_event_available(bit);
        supported += u32::from(ok);
        let state = if ok { "supported" } else { "unsupported" };
        let line = format!("  0x{value:02X} {name}: EBX bit {bit}, PERFEVTSEL 0x{select:08X}: {state}");
        assert!(out.lines().any(|l| l == line), "{}: missing {line:?}\n{out}", p.name);
        let decision = format!("PASS: 0x{value:02X} {name} is {state}: ");
        assert!(out.lines().any(|l| l.starts_with(&decision)), "{}: missing {decision:?}\n{out}", p.name);
        let counted = format!("PASS: 0x{value:02X} {name} counts ");
        if ok {
            let n = 100 + u64::from(value);
            let want = block_count((select & 0xFF) as u8, (select >> 8) as u8, n);
            let line = format!("{counted}{want} ");
            assert!(out.lines().any(|l| l.starts_with(&line)), "{}: missing {line:?}\n{out}", p.name);
        } else {
            assert!(!out.contains(&counted), "{}: unsupported source {name} was counted\n{out}", p.name);
        }
    }
    assert!(out.contains("  0x00 ProfileTime: no EBX bit, PERFEVTSEL 0x0003003C: timer (not an Emon source)"), "{out}");
    let line = format!("hal-emon: {supported} of 12 Emon profile sources supported");
    assert!(out.contains(&line), "{}: missing {line:?}\n{out}", p.name);
}

#[test]
fn hal_emon_follows_the_windows_rule_under_every_profile() {
    if !kvm_available() {
        return;
    }
    for name in Profile::builtin_names() {
        let r = run_twice_deterministic(&["run", "--profile", name, "guest:hal-emon"]);
        check_hal_emon(&r, &Profile::load(name).unwrap());
    }
    let masked = emon(&["run", "--profile", "nehalem-llc-masked", "guest:hal-emon"]);
    for src in ["0x0A ProfileCacheMisses", "0x1C ProfileLLCReference", "0x1D ProfileLLCMisses"] {
        assert!(masked.stdout.contains(&format!("PASS: {src} is unsupported")), "{}", masked.stdout);
    }
    let none = emon(&["run", "--profile", "no-pmu", "guest:hal-emon"]);
    assert!(none.stdout.contains("hal-emon: 0 of 12 Emon profile sources supported"), "{}", none.stdout);
    assert!(!none.stdout.contains("IA32_PMC0"), "no-pmu: nothing may be counted\n{}", none.stdout);
}

/// Checks that guest:pmu-counters measured every declared counter with every available event.
fn check_pmu_counters(r: &Run, p: &Profile) {
    let out = &r.stdout;
    let pmu = &p.pmu;
    let has = |line: String| assert!(out.lines().any(|l| l == line), "{}: missing {line:?}\n{out}", p.name);
    if pmu.version == 0 {
        assert!(out.contains("SKIP: every counter: no architectural performance monitoring"), "{out}");
        return;
    }
    let per_insn = [1u8, 0, 7].into_iter().any(|b| pmu.arch_event_available(b));
    for i in 0..u64::from(pmu.gp) {
        let n = 100 + 10 * i;
        for e in ARCH_EVENTS.iter().filter(|e| pmu.arch_event_available(e.bit)) {
            let want = block_count(e.event_select, e.umask, n);
            let head =
                format!("PASS: IA32_PMC{i} counts {} (0x{:02X}/0x{:02X}), N={n}: ", e.name, e.event_select, e.umask);
            if (e.event_select, e.umask) == (0x3C, 0x01) {
                // Reference cycles: the core cycles over the profile's CPUID.15H ratio, either way
                // rounded (the reference clock's phase is the model clock's).
                let c = &p.clock;
                let (lo, hi) = match c.leaf_15h {
                    true => {
                        let floor = want * u64::from(c.tsc_per_ref_denominator) / u64::from(c.tsc_per_ref_numerator);
                        (floor, floor + 1)
                    }
                    false => (1, want),
                };
                let tail = format!(" reference cycles for {want} core cycles, in [{lo}, {hi}]");
                assert!(
                    out.lines().any(|l| l.starts_with(&head) && l.ends_with(&tail)),
                    "{}: missing {head}...{tail}\n{out}",
                    p.name
                );
            } else {
                has(format!("{head}{want}"));
            }
        }
        if per_insn {
            has(format!("PASS: IA32_PMC{i} with PERFEVTSEL.USR only counts nothing at CPL0"));
            has(format!("PASS: IA32_PMC{i} overflow raises a fixed-vector 0x33 PMI: the handler ran once"));
            has(format!("PASS: IA32_PMC{i} overflow raises an NMI PMI: the handler ran once"));
            has(format!("PASS: IA32_PMC{i}: the PMI arrived right after the stopping WRMSR"));
            if pmu.version >= 2 {
                has(format!("PASS: IA32_PMC{i} overflow: only IA32_PERF_GLOBAL_STATUS bit {i} set in the handler"));
            }
        }
    }
    for i in (0..4u8).filter(|&i| pmu.fixed_supported(i)) {
        let n = 300 + 10 * u64::from(i);
        let e = ARCH_EVENTS.iter().find(|e| e.fixed == Some(i)).unwrap();
        let want = block_count(e.event_select, e.umask, n);
        has(format!("PASS: IA32_FIXED_CTR{i} counts {} (EN=3), N={n}: {want}", e.name));
        has(format!("PASS: IA32_FIXED_CTR{i} with EN=1 (OS) counts {} at CPL0: {want}", e.name));
        has(format!("PASS: IA32_FIXED_CTR{i} with EN=2 (USR) counts nothing at CPL0"));
        has(format!("PASS: IA32_FIXED_CTR{i} overflow raises a fixed-vector 0x33 PMI: the handler ran once"));
        has(format!("PASS: IA32_FIXED_CTR{i} overflow raises an NMI PMI: the handler ran once"));
        has(format!(
            "PASS: IA32_FIXED_CTR{i} overflow: only IA32_PERF_GLOBAL_STATUS bit {} set in the handler",
            32 + i
        ));
        has(format!("PASS: IA32_FIXED_CTR{i}: the PMI arrived right after the stopping WRMSR"));
    }
    assert!(!out.contains("IA32_FIXED_CTR") || pmu.version >= 2, "{}: fixed counters on v1\n{out}", p.name);
}

#[test]
fn pmu_counters_counts_exactly_on_every_counter_of_every_profile() {
    if !kvm_available() {
        return;
    }
    for name in Profile::builtin_names() {
        let r = run_twice_deterministic(&["run", "--profile", name, "guest:pmu-counters"]);
        check_pmu_counters(&r, &Profile::load(name).unwrap());
    }
}

#[test]
fn hal_emon_and_pmu_counters_pass_under_unusual_pmus() {
    if !kvm_available() {
        return;
    }
    let cases = [
        ("core2", "version=1,fixed=0,fixed-width=0"),
        ("core2", "version=2,fixed=0,fixed-width=0"),
        ("skylake", "version=5,fixed=0,fixed-bitmap=0x9,fixed-width=48"),
        ("nehalem", "version=5,fixed-bitmap=0x8"),
        ("skylake", "gp-width=32"),
        ("icelake", "gp=1,gp-width=64,fixed-width=64"),
        ("icelake", "fixed-width=32,gp-width=33"),
        ("skylake", "ebx-length=2"),
        ("skylake", "ebx-unavailable=0x43"),
        ("skylake", "ebx-unavailable=0x7"),
        ("skylake", "ebx-length=1,ebx-unavailable=1"),
    ];
    for (profile, spec) in cases {
        let mut p = Profile::load(profile).unwrap();
        p.apply_overrides(spec).unwrap();
        let r = emon(&["run", "--profile", profile, "--pmu", spec, "guest:hal-emon"]);
        r.assert_status(0).assert_no_failures();
        check_hal_emon(&r, &p);
        let r = emon(&["run", "--profile", profile, "--pmu", spec, "guest:pmu-counters"]);
        r.assert_status(0).assert_no_failures();
        check_pmu_counters(&r, &p);
    }
}

#[test]
fn auto_says_which_backend_it_chose_and_why() {
    if !kvm_available() {
        return;
    }
    let r = emon(&["run", "--verbose"]);
    r.assert_status(0);
    let line = r.stderr.lines().find(|l| l.starts_with("emon: backend ")).unwrap_or_else(|| panic!("{}", r.stderr));
    assert!(line.starts_with("emon: backend precise: auto: the host"), "{line}");
    assert!(r.stderr.contains("precise backend:"), "{}", r.stderr);
}

/// KVM's PMU test's idioms (`guest:pmu-idioms`) pass under every shipped profile, twice alike, and
/// the TSC-to-reference ratio the guest measures is the profile's `[clock]` ratio, also where the
/// CPU has no CPUID leaf 0x15 to tell the guest (README, "Guest time").
#[test]
fn pmu_idioms_see_the_profiles_reference_clock() {
    if !kvm_available() {
        return;
    }
    for name in Profile::builtin_names() {
        let p = Profile::load(name).unwrap();
        let r = run_twice_deterministic(&[
            "run",
            "--profile",
            name,
            "guest:pmu-idioms",
            "--",
            "n=1000",
            "calibrate=10000000",
        ]);
        if p.pmu.version < 2 || !p.pmu.arch_event_available(2) {
            continue;
        }
        let (num, den) = (u64::from(p.clock.tsc_per_ref_numerator), u64::from(p.clock.tsc_per_ref_denominator));
        let milli = num * 1000 / den;
        let want = format!("TSC ticks per reference tick: {}.{:03}", milli / 1000, milli % 1000);
        assert!(r.stdout.lines().any(|l| l == want), "{name}: missing {want:?}\n{}", r.stdout);
    }
}
