//! The built-in guests under every shipped profile: cpuid-report shows exactly the profile's
//! leaf 0x0A from inside the guest, and msr-semantics passes everywhere.
mod common;
use common::*;
use emon::profile::{Profile, ARCH_EVENTS};

/// Checks cpuid-report's decoded lines against the profile.
fn check_cpuid_report(r: &Run, p: &Profile) {
    let out = &r.stdout;
    let pmu = &p.pmu;
    let [a, b, c, d] = pmu.leaf_0a();
    assert!(
        out.contains(&format!("CPUID.0AH: eax={a:#010x} ebx={b:#010x} ecx={c:#010x} edx={d:#010x}")),
        "{}: raw leaf 0xA\n{out}",
        p.name
    );
    assert!(out.contains(&format!("architectural perfmon version: {}", pmu.version)), "{out}");
    assert!(out.contains(&format!("vendor {}", p.vendor)), "{out}");
    if let Some(brand) = &p.brand {
        assert!(out.contains(&format!("cpuid-report: brand [{brand}]")), "{}: the brand string\n{out}", p.name);
    }
    assert!(out.contains(&format!("(leaf 1 eax {:#010x})", p.leaf1_eax())), "{out}");
    assert!(out.contains(&format!("CPUID.01H:ECX.PDCM = {}", u8::from(pmu.perf_capabilities != 0))), "{out}");
    if pmu.version == 0 {
        assert!(out.contains("no architectural performance monitoring"), "{out}");
        return;
    }
    assert!(out.contains(&format!("general-purpose counters: {} x {} bits", pmu.gp, pmu.gp_width)), "{out}");
    if pmu.version >= 2 {
        assert!(out.contains(&format!("fixed-function counters: {} x {} bits", pmu.fixed, pmu.fixed_width)), "{out}");
    }
    assert!(out.contains(&format!("EBX event vector length: {}", pmu.ebx_length)), "{out}");
    for e in &ARCH_EVENTS {
        let state = if e.bit >= pmu.ebx_length {
            "not enumerated"
        } else if pmu.arch_event_available(e.bit) {
            "available"
        } else {
            "unavailable"
        };
        let line = format!("  event {}: {}: {state}", e.bit, e.name);
        assert!(out.lines().any(|l| l == line), "{}: missing {line:?}\n{out}", p.name);
    }
    if pmu.perf_capabilities != 0 {
        assert!(out.contains(&format!("IA32_PERF_CAPABILITIES = {:#x}", pmu.perf_capabilities)), "{out}");
    }
}

#[test]
fn cpuid_report_shows_each_profile_from_inside_the_guest() {
    if !kvm_available() {
        return;
    }
    for name in Profile::builtin_names() {
        let r = emon(&["run", "--profile", name, "guest:cpuid-report"]);
        r.assert_status(0);
        check_cpuid_report(&r, &Profile::load(name).unwrap());
    }
}

#[test]
fn default_run_is_cpuid_report_on_the_default_profile() {
    if !kvm_available() {
        return;
    }
    let r = emon(&[]);
    r.assert_status(0);
    check_cpuid_report(&r, &Profile::load(Profile::DEFAULT).unwrap());
    assert!(r.stderr.contains("guest exited with code 0"), "{}", r.stderr);
}

#[test]
fn overrides_reach_the_guest() {
    if !kvm_available() {
        return;
    }
    let spec = "version=4,gp=8,gp-width=48,fixed=3,ebx-unavailable=0x18";
    let r = emon(&["run", "--profile", "nehalem", "--pmu", spec, "guest:cpuid-report"]);
    r.assert_status(0);
    let mut p = Profile::load("nehalem").unwrap();
    p.apply_overrides(spec).unwrap();
    check_cpuid_report(&r, &p);
    assert!(r.stdout.contains("event 3: LLC Reference: unavailable"), "{}", r.stdout);
}

#[test]
fn llc_masked_profile_hides_the_llc_events() {
    if !kvm_available() {
        return;
    }
    let r = emon(&["run", "--profile", "nehalem-llc-masked"]);
    r.assert_status(0);
    assert!(r.stdout.contains("event 3: LLC Reference: unavailable"), "{}", r.stdout);
    assert!(r.stdout.contains("event 4: LLC Misses: unavailable"), "{}", r.stdout);
    assert!(r.stdout.contains("event 1: Instructions Retired: available"), "{}", r.stdout);
}

#[test]
fn msr_semantics_passes_under_every_profile() {
    if !kvm_available() {
        return;
    }
    for name in Profile::builtin_names() {
        let r = emon(&["run", "--profile", name, "guest:msr-semantics"]);
        r.assert_status(0).assert_no_failures();
        if Profile::load(name).unwrap().pmu.netburst() {
            // The NetBurst twin, guest:netburst-msrs, checks that PMU (tests/netburst.rs).
            assert!(r.stdout.contains("SKIP: msr-semantics: a NetBurst processor"), "{name}: {}", r.stdout);
            continue;
        }
        let tests: u32 = r.summary()["SUMMARY: ".len()..].split(' ').next().unwrap().parse().unwrap();
        assert!(tests >= 90, "{name}: only {tests} checks ran: {}", r.summary());
    }
}

#[test]
fn msr_semantics_passes_under_unusual_pmus() {
    if !kvm_available() {
        return;
    }
    let cases = [
        ("skylake", "version=4,gp=8,gp-width=48,fixed=3"),
        ("skylake", "version=5,fixed=0,fixed-bitmap=0x9,fixed-width=48"),
        ("core2", "version=1,fixed=0,fixed-width=0"),
        ("skylake", "gp-width=32"),
        ("skylake", "gp-width=64"),
        ("skylake", "fw-write=0"),
        ("icelake", "gp=1,gp-width=64,fixed-width=64"),
        ("nehalem", "version=5,fixed-bitmap=0x8"),
    ];
    for (profile, spec) in cases {
        let r = emon(&["run", "--profile", profile, "--pmu", spec, "guest:msr-semantics"]);
        r.assert_status(0).assert_no_failures();
    }
}

/// CPUID leaf 15H's crystal and leaf 16H's base frequency give the rate the guest's TSC really
/// runs at (README, "Guest time"): timed against the PIT, under every profile that has either;
/// the others skip. Under all, port 61h gates counter 2 and reads its output (OUT2).
#[test]
fn the_tsc_runs_at_the_rate_leaves_15h_and_16h_give() {
    if !kvm_available() {
        return;
    }
    for name in Profile::builtin_names() {
        let r = emon(&["run", "--profile", name, "guest:tsc-rate"]);
        r.assert_status(0).assert_no_failures();
        assert!(r.stdout.contains("PASS: OUT2 goes high when counter 2 has run down"), "{name}: {}", r.stdout);
        let clock = Profile::load(name).unwrap().clock;
        let (crystal, base) = (clock.crystal_hz != 0, clock.frequency_mhz.is_some());
        let passes = |what: &str| r.stdout.contains(&format!("PASS: the TSC runs at {what}"));
        assert_eq!(passes("the rate CPUID.15H gives"), crystal, "{name}: {}", r.stdout);
        assert_eq!(passes("the base frequency CPUID.16H gives"), base, "{name}: {}", r.stdout);
        let skipped = r.stdout.contains("SKIP: CPUID leaves 15H and 16H give no TSC frequency");
        assert_eq!(skipped, !crystal && !base, "{name}: {}", r.stdout);
    }
}

/// INT3, POPCNT, CLAC and STAC at CPL0 behave as the SDM says: on kvm_pvm, whose emulator lacks
/// them, emon completes them (INT3 as the #BP it raises); elsewhere the CPU runs them.
#[test]
fn cpl0_instructions_the_host_kvm_cannot_run_are_completed_by_emon() {
    if !kvm_available() {
        return;
    }
    let r = emon(&["run", "--verbose", "guest:cpl0-completion"]);
    r.assert_status(0).assert_no_failures();
    assert!(r.stdout.contains("PASS: INT3 #3: #BP's RIP is the next instruction's"), "{}", r.stdout);
    assert!(r.stderr.contains("of which INT3 delivered as #BP:"), "{}", r.stderr);
}

#[test]
fn sse_the_host_kvm_cannot_run_is_completed_by_emon() {
    if !kvm_available() {
        return;
    }
    // core's SSE2 formatting paths (large decimals, padding) and hand-written SSE2 at CPL0; on
    // kvm_pvm each one is completed in userspace by emon, elsewhere the CPU runs them.
    let r = emon(&["run", "--verbose", "guest:sse-completion"]);
    r.assert_status(0).assert_no_failures();
    assert!(r.stderr.contains("instructions completed by emon"), "{}", r.stderr);
}

/// The model-specific PMU MSRs are the named CPU's under every profile, and the precise backend
/// records the guest's branches in the LBR stack exactly; under the perf backend, which does not
/// record them, the run summary and --json say so.
#[test]
fn model_specific_msrs_and_the_lbr_stack_are_the_named_cpus() {
    if !kvm_available() {
        return;
    }
    for profile in Profile::builtin_names() {
        for guest in ["guest:model-msrs", "guest:lbr"] {
            let (r, doc) = emon_json(&format!("{guest}-{profile}"), &["--profile", profile, guest]);
            r.assert_status(0).assert_no_failures();
            assert_eq!(doc["msr"]["notes"], serde_json::json!([]), "{guest} under {profile}");
        }
    }
    let (r, doc) = emon_json("lbr-perf", &["--backend", "perf", "guest:lbr"]);
    assert_eq!(r.status, 1, "the stack stays empty under the perf backend: {}", r.stdout);
    let note = "NOT EXACT: the guest set DEBUGCTL.LBR: this backend records no branches in the LBR stack";
    assert!(doc["msr"]["notes"][0].as_str().is_some_and(|n| n.starts_with(note)), "{}", doc["msr"]);
    assert!(r.stderr.lines().last().unwrap_or_default().contains(note), "{}", r.stderr);
}

/// PEBS under the precise backend: with `--debug-store on`, guest:pebs's records are the sampled
/// instructions under every profile with PEBS, formats 0, 1 and 3 and icelake's adaptive format 4
/// with its record groups (no-pmu and pentium4 skip, saying why). With `--debug-store auto`, PEBS is presented exactly where the guest
/// sees CPUID's debug store: this host hides it (`emon cpuid` says so), so there it is not.
#[test]
fn pebs_records_are_the_sampled_instructions() {
    if !kvm_available() {
        return;
    }
    for profile in Profile::builtin_names() {
        let r = emon(&["run", "--profile", profile, "--debug-store", "on", "guest:pebs"]);
        r.assert_status(0).assert_no_failures();
        // No architectural perfmon (no-pmu, and pentium4's NetBurst PMU): skipped, saying why.
        let skips = Profile::load(profile).unwrap().pmu.version == 0;
        assert_eq!(r.stdout.contains("SKIP: "), skips, "{profile}: {}", r.stdout);
        if !skips {
            assert!(r.stdout.contains(": record 7: the sampled instruction"), "{profile}: {}", r.stdout);
        }
    }
    let cpuid = emon(&["cpuid", "--profile", "skylake"]);
    let hidden = cpuid.stdout.contains("21 (DS) forced off");
    let r = emon(&["run", "--profile", "skylake", "guest:pebs"]);
    r.assert_status(0).assert_no_failures();
    assert_eq!(r.stdout.contains("SKIP: PEBS unavailable according to MISC_ENABLE"), hidden, "{}", r.stdout);
    assert!(!r.stderr.contains("NOT AS PROFILED"), "auto presents what the guest can see: {}", r.stderr);
    let off = emon(&["run", "--profile", "skylake", "--debug-store", "off", "guest:pebs"]);
    assert!(off.stdout.contains("SKIP: PEBS unavailable according to MISC_ENABLE"), "{}", off.stdout);
}

/// BTS under the precise backend: with `--debug-store on`, guest:bts's records are the path's
/// branches under every profile with architectural perfmon (no-pmu and pentium4 skip); under `auto` BTS is
/// presented exactly where the guest sees CPUID's DS bit, and never under the perf backend.
#[test]
fn bts_records_are_the_paths_branches() {
    if !kvm_available() {
        return;
    }
    for profile in Profile::builtin_names() {
        let r = emon(&["run", "--profile", profile, "--debug-store", "on", "guest:bts"]);
        r.assert_status(0).assert_no_failures();
        let skips = Profile::load(profile).unwrap().pmu.version == 0;
        assert_eq!(r.stdout.contains("SKIP: "), skips, "{profile}: {}", r.stdout);
    }
    let hidden = emon(&["cpuid", "--profile", "skylake"]).stdout.contains("21 (DS) forced off");
    let r = emon(&["run", "guest:bts"]);
    assert_eq!(r.stdout.contains("SKIP: BTS unavailable according to MISC_ENABLE"), hidden, "{}", r.stdout);
    let perf = emon(&["run", "--backend", "perf", "--debug-store", "on", "guest:bts"]);
    assert!(perf.stdout.contains("SKIP: BTS unavailable according to MISC_ENABLE"), "{}", perf.stdout);
}
