//! Linux under every shipped profile: `resources/suites/linux.toml` boots emon's Linux test kernel
//! (scripts/linux-kernel) once per profile, checks the lines Linux's perf driver prints against
//! what Linux's source says for that profile, and runs the kernel's built-in perf self-test
//! (README, "Linux guests").
mod common;
use common::*;
use emon::profile::Profile;
use emon::runner::suite;
use std::path::Path;

const SUITE: &str = "resources/suites/linux.toml";

/// Builds emon's Linux test kernel, or finds it cached: scripts/linux-kernel links it at
/// target/emon-linux/.
fn build_the_kernel() {
    let built =
        std::process::Command::new("bash").arg("scripts/linux-kernel").output().expect("run scripts/linux-kernel");
    assert!(built.status.success(), "scripts/linux-kernel failed:\n{}", String::from_utf8_lossy(&built.stderr));
}

/// Text no console line of a Linux run may contain: the perf driver's complaints about the PMU
/// it was given (arch/x86/events/core.c `check_hw_exists`), an MSR access that faulted where Linux
/// did not expect it (arch/x86/mm/extable.c), and any oops or warning.
const FORBIDDEN: &[&str] = &[
    "Broken PMU hardware detected",
    "Failed to access perfctr msr",
    "Broken BIOS detected",
    "unchecked MSR access error",
    "PEBS disabled due to CPU errata",
    "WARNING:",
    "BUG:",
    "Oops",
    "Call Trace",
    "Kernel panic",
];

/// Whole lines Linux 6.1's x86 perf code prints at boot for `p`, after the kernel log timestamp,
/// derived from its source as the guest sees the profile (CPUID leaf 0xA and PDCM as emon sets
/// them, the profile's LBR MSRs, the hypervisor bit KVM sets, one vCPU, and no DS/PEBS yet):
/// - arch/x86/kernel/cpu/intel.c `init_intel`: X86_FEATURE_ARCH_PERFMON needs a version and
///   more than one GP counter;
/// - arch/x86/events/intel/core.c `intel_pmu_init`: without it, family 6 goes to `p6_pmu_init`
///   (intel/p6.c), which knows only P6 models; with it, the model's event table name, then
///   "AnyThread deprecated, " (v5, CPUID.0AH:EDX[15]), "<n>-deep LBR, " (the model's
///   `intel_pmu_lbr_init_*` stack, kept only if `check_msr`, which runs under a hypervisor, can
///   flip bits 1:0 of MSR_LASTBRANCH_TOS and bits 15:0 of every FROM_IP/TO_IP), "full-width counters, "
///   (PERF_CAPABILITIES.FW_WRITE, which also makes the max period the counter mask >> 1),
///   PERF_METRICS adds bit 48 to the event mask; v2-v4 in a hypervisor trust EDX's fixed
///   counter count, v5 takes the ECX bitmap;
/// - arch/x86/events/core.c `init_hw_perf_events`: "<driver> PMU driver.", then the quirks
///   (`intel_nehalem_quirk`'s AAJ80 line, `intel_arch_events_quirk`'s "CPUID marked event"
///   lines, with the "core: " prefix of intel/core.c), then `x86_pmu_show_pmu_cap`;
/// - `fixup_ht_bug` (Sandy Bridge, Ivy Bridge, Haswell): one thread per core here.
fn linux_6_1_pmu_lines(p: &Profile) -> Vec<String> {
    if p.pmu.netburst() {
        return netburst_lines();
    }
    let [eax, ebx, ecx, edx] = p.pmu.leaf_0a();
    let (version, gp, width, mask_length) = (eax & 0xFF, (eax >> 8) & 0xFF, (eax >> 16) & 0xFF, eax >> 24);
    if version == 0 || gp <= 1 {
        assert_eq!(p.family, 6, "{}: only family 6 is derived here", p.name);
        let p6 = matches!(p.model, 1 | 3 | 5 | 6 | 7 | 8 | 9 | 11 | 13);
        assert!(!p6, "{}: a P6 model has a P6 PMU driver", p.name);
        return vec![format!(
            "Performance Events: unsupported p6 CPU model {} no PMU driver, software events only.",
            p.model
        )];
    }
    if mask_length < 7 {
        return vec!["Performance Events: no PMU driver, software events only.".into()];
    }
    let caps = p.pmu.perf_capabilities; // non-zero sets PDCM, so Linux reads it
    let full_width = caps & (1 << 13) != 0;
    let perf_metrics = caps & (1 << 15) != 0;
    let (fixed, fixed_mask) = match version {
        1 => (0, u64::from(ecx)),
        2..=4 => (edx & 0x1F, (1u64 << (edx & 0x1F)) - 1),
        _ => (32 - ecx.leading_zeros(), u64::from(ecx)),
    };
    let events = match p.model {
        0x0F | 0x16 | 0x17 | 0x1D => "Core2 events, ",
        0x1A | 0x1E | 0x1F | 0x2E => "Nehalem events, ",
        0x2A | 0x2D => "SandyBridge events, ",
        0x4E | 0x5E => "Skylake events, ",
        0x7D | 0x7E => "Icelake events, ",
        _ if version == 1 => "generic architected perfmon v1, ",
        _ => "generic architected perfmon, ",
    };
    let anythread = if version >= 5 && edx & (1 << 15) != 0 { "AnyThread deprecated, " } else { "" };
    // (entries, LASTBRANCH_0_FROM_IP, LASTBRANCH_0_TO_IP): intel/lbr.c's init for the model.
    let linux_lbr = match p.model {
        0x0F | 0x16 | 0x17 | 0x1D => Some((4, 0x40, 0x60)),
        0x1A | 0x1E | 0x1F | 0x2E | 0x2A | 0x2D => Some((16, 0x680, 0x6C0)),
        0x4E | 0x5E | 0x7D | 0x7E => Some((32, 0x680, 0x6C0)),
        _ => None,
    };
    let lbr = match (linux_lbr, p.pmu.lbr) {
        // The TOS takes bits depth-1:0; FROM/TO take any canonical address.
        (Some((n, from, to)), Some(l)) if (l.from, l.to) == (from, to) && l.depth >= n && l.depth > 3 => {
            format!("{n}-deep LBR, ")
        }
        _ => String::new(),
    };
    let fw = if full_width { "full-width counters, " } else { "" };
    let mut lines = vec![format!("Performance Events: {events}{anythread}{lbr}{fw}Intel PMU driver.")];
    let mut unavailable = ebx;
    if matches!(p.model, 0x1A | 0x1E | 0x1F | 0x2E) && unavailable & (1 << 6) != 0 {
        lines.push("core: CPU erratum AAJ80 worked around".into());
        unavailable &= !(1 << 6);
    }
    let names = [
        "cpu cycles",
        "instructions",
        "bus cycles",
        "cache references",
        "cache misses",
        "branch instructions",
        "branch misses",
    ];
    for (bit, name) in names.iter().enumerate() {
        if unavailable & (1 << bit) != 0 {
            lines.push(format!("core: CPUID marked event: '{name}' unavailable"));
        }
    }
    let value_mask = if width >= 64 { u64::MAX } else { (1u64 << width) - 1 };
    let max_period = if full_width { value_mask >> 1 } else { (1 << 31) - 1 };
    let mut intel_ctrl = ((1u64 << gp.min(32)) - 1) | fixed_mask << 32;
    if perf_metrics {
        intel_ctrl |= 1 << 48;
    }
    let fixed_events = ((((1u64 << fixed) - 1) << 32) & intel_ctrl).count_ones();
    lines.extend([
        format!("... version:                {version}"),
        format!("... bit width:              {width}"),
        format!("... generic registers:      {}", gp.min(32)),
        format!("... value mask:             {value_mask:016x}"),
        format!("... max period:             {max_period:016x}"),
        format!("... fixed-purpose events:   {fixed_events}"),
        format!("... event mask:             {intel_ctrl:016x}"),
    ]);
    if matches!(p.model, 0x2A | 0x2D | 0x3A | 0x3E | 0x3C | 0x3F | 0x45 | 0x46) {
        lines.push("core: PMU erratum BJ122, BV98, HSD29 workaround disabled, HT off".into());
    }
    lines
}

/// emon's Linux test kernel run with the options `emon_args` and `console=ttyS0` and
/// `cmdline` on its command line, for at most 280 s.
fn boot(emon_args: &[&str], cmdline: &[&str]) -> Run {
    let mut a = vec!["run", "--timeout", "280"];
    a.extend(emon_args);
    a.extend(["target/emon-linux/vmlinux", "--", "console=ttyS0"]);
    a.extend(cmdline);
    emon(&a)
}

/// A NetBurst processor (family 0FH without ARCH_PERFMON): intel/core.c `intel_pmu_init` calls
/// intel/p4.c `p4_pmu_init`, which needs IA32_MISC_ENABLE[7] and prints "Netburst events, "; the
/// driver is `p4_pmu` ("Netburst P4/Xeon", 18 counters of 40 bits, max period 2^39 - 1, no
/// version, no fixed counters), whose event mask `init_hw_perf_events` makes (1 << 18) - 1.
fn netburst_lines() -> Vec<String> {
    [
        "Performance Events: Netburst events, Netburst P4/Xeon PMU driver.",
        "... version:                0",
        "... bit width:              40",
        "... generic registers:      18",
        "... value mask:             000000ffffffffff",
        "... max period:             0000007fffffffff",
        "... fixed-purpose events:   0",
        "... event mask:             000000000003ffff",
    ]
    .map(String::from)
    .to_vec()
}

/// The suite runs every shipped profile once, and expects exactly what Linux's source says for
/// it and forbids what no profile may provoke.
#[test]
fn the_suite_expects_what_linuxs_source_says_for_every_profile() {
    let s = suite::load(Path::new(SUITE)).unwrap();
    let mut seen = Vec::new();
    for e in &s.entries {
        assert_eq!(e.profiles.len(), 1, "line {}: one profile per entry, so that each has its lines", e.line);
        let name = &e.profiles[0];
        let p = Profile::load(name).unwrap();
        assert_eq!(e.expect, linux_6_1_pmu_lines(&p), "line {}: the lines for {name}", e.line);
        assert_eq!(e.forbid, FORBIDDEN, "line {}: what {name} must not provoke", e.line);
        assert_eq!(e.kernels, ["../../target/emon-linux/vmlinux"], "line {}", e.line);
        // Without the Debug Store the lines do not depend on whether the host shows DS.
        assert_eq!(e.debug_store, Some(emon::vmm::DebugStoreMode::Off), "line {}", e.line);
        seen.push(name.clone());
    }
    seen.sort();
    // pentium4 boots in its own test below: Linux 6.1's p4 driver fails the sampling self-test
    // on NetBurst whatever the PMU does, so its run cannot pass as a suite entry.
    let architectural: Vec<&str> =
        Profile::builtin_names().into_iter().filter(|n| !Profile::load(n).unwrap().pmu.netburst()).collect();
    assert_eq!(seen, architectural, "every shipped profile with architectural perfmon, once");
}

/// The lines of a few profiles, written out: the derivation itself, checked against what real
/// CPUs make Linux print (the i7-6700K's line in resources/profiles/skylake.toml, less what emon
/// does not present yet: PEBS).
#[test]
fn the_derivation_gives_linuxs_known_lines() {
    let lines = |name: &str| linux_6_1_pmu_lines(&Profile::load(name).unwrap());
    let skylake = lines("skylake");
    assert_eq!(skylake[0], "Performance Events: Skylake events, 32-deep LBR, full-width counters, Intel PMU driver.");
    assert_eq!(skylake[5], "... max period:             00007fffffffffff");
    assert_eq!(skylake[7], "... event mask:             000000070000000f");
    let core2 = lines("core2");
    assert_eq!(core2[0], "Performance Events: Core2 events, 4-deep LBR, Intel PMU driver.");
    assert_eq!(lines("nehalem")[0], "Performance Events: Nehalem events, 16-deep LBR, Intel PMU driver.");
    assert_eq!(core2[5], "... max period:             000000007fffffff");
    let masked = lines("nehalem-llc-masked");
    assert_eq!(
        masked[1..3],
        [
            "core: CPUID marked event: 'cache references' unavailable",
            "core: CPUID marked event: 'cache misses' unavailable"
        ]
    );
    let icelake = lines("icelake");
    assert_eq!(icelake[6], "... fixed-purpose events:   4");
    assert_eq!(icelake[7], "... event mask:             0001000f000000ff");
    assert_eq!(
        lines("no-pmu"),
        ["Performance Events: unsupported p6 CPU model 94 no PMU driver, software events only."]
    );
}

/// Builds (or finds cached) the kernel, then runs the suite: every profile boots to the end of
/// the self-test with the expected lines; then Linux under the NetBurst profile.
#[test]
fn linux_boots_under_every_profile_with_the_lines_its_source_predicts() {
    if !kvm_available() {
        return;
    }
    build_the_kernel();
    let json = tmp_dir("linux-suite").join("linux.json");
    let r = emon(&["test", "--suite", SUITE, "--jobs", "2", "--json", json.to_str().unwrap()]);
    assert_eq!(r.status, 0, "{}\n{}", r.stdout, r.stderr);
    let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let runs = doc["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), Profile::builtin_names().len() - 1, "all but pentium4");
    for run in runs {
        assert_eq!(run["status"], "pass", "{run}");
    }
    linux_drives_the_netburst_pmu_with_its_p4_driver();
}

/// Linux under the NetBurst profile: its p4 driver finds the PMU (the lines its source predicts),
/// and the self-test counts instructions, branches (retired_branch_type) and cycles
/// (global_power_events) through ESCRs and CCCRs. Its sampling test gets no overflow: Linux 6.1's
/// `p4_pmu_set_period` reads `pmc_prev_left` before `x86_perf_event_set_period` updates it, so its
/// erratum-N15 second write reloads the counter with the previous event's period (here the
/// counting test's 2^39 - 1, visible as `wrmsr MSR_IQ_COUNTER0 0x8000000001` in `--trace`). That
/// is Linux's doing, as it would be on a Pentium 4: emon counts the 2^39 + loop instructions
/// exactly, and the callback count is 0 (README, "The NetBurst PMU").
fn linux_drives_the_netburst_pmu_with_its_p4_driver() {
    let r = boot(&["--profile", "pentium4", "--debug-store", "off"], &[]);
    // Linux's console lines, without their timestamps.
    let lines: Vec<&str> = r.stdout.lines().map(|l| l.split_once("] ").map_or(l, |(_, rest)| rest)).collect();
    for want in netburst_lines() {
        assert!(lines.contains(&want.as_str()), "missing {want:?}\n{}", r.stdout);
    }
    for pass in [
        "PASS: instructions (",
        "PASS: branches (",
        "PASS: cycles (",
        "PASS: instructions sampling: the loop was counted (",
    ] {
        assert!(lines.iter().any(|l| l.starts_with(pass)), "missing {pass:?}\n{}", r.stdout);
    }
    let fail = "FAIL: instructions sampling: overflow callbacks (0, expected 5497560";
    assert!(lines.iter().any(|l| l.starts_with(fail)), "missing {fail:?}\n{}", r.stdout);
    assert!(lines.contains(&"SUMMARY: 5 tests, 1 unexpected failures, 0 skipped"), "{}", r.stdout);
    assert_eq!(r.status, 1, "the self-test's one failure: {}", r.stderr);
    for bad in FORBIDDEN {
        assert!(!r.stdout.contains(bad), "{bad:?}\n{}", r.stdout);
    }
}

/// With the self-test's exit turned off, the boot goes on to the panic of a kernel without an
/// init; Linux reboots through the i8042 and the run ends at once with status 5 and the panic
/// line in the summary, not at the timeout.
#[test]
fn a_linux_panic_ends_the_run_with_its_line() {
    if !kvm_available() {
        return;
    }
    build_the_kernel();
    let r = boot(&[], &["emon_perf_test.exit=0"]);
    assert_eq!(r.status, 5, "{}", r.stderr);
    let summary = r.stderr.lines().last().unwrap_or_default();
    assert!(summary.contains("guest kernel panic, \"Kernel panic - not syncing: No working init found."), "{summary}");
    assert!(summary.contains("reset through the i8042 keyboard controller"), "{summary}");
}

/// A kernel that does not reboot on a panic (`panic=0`, most kernels' default) prints the panic's
/// end marker and spins forever: the run ends a second after it with status 5, the panic line in
/// the summary and `panic-end` in the report, not at the timeout.
#[test]
fn a_linux_panic_without_reboot_ends_at_its_end_marker() {
    if !kvm_available() {
        return;
    }
    build_the_kernel();
    let json = json_path("linux-panic-end");
    let r = boot(&["--json", json.to_str().unwrap()], &["emon_perf_test.run=0", "panic=0"]);
    assert_eq!(r.status, 5, "{}", r.stderr);
    let summary = r.stderr.lines().last().unwrap_or_default();
    assert!(summary.contains("guest kernel panic, \"Kernel panic - not syncing: No working init found."), "{summary}");
    assert!(
        summary.contains("then the kernel printed its panic's end marker and nothing for 1 s after it"),
        "{summary}"
    );
    assert!(r.stdout.contains("---[ end Kernel panic - not syncing: No working init found."), "{}", r.stdout);
    let doc = read_json(&json, &r.stderr);
    assert_eq!(doc["end"], serde_json::json!({"kind": "panic-end"}), "{doc:#}");
    assert_eq!(doc["status"], 5, "{doc:#}");
}
