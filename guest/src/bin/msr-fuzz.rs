//! Random RDMSR/WRMSR to PMU and harmless non-PMU MSRs (seed=N n=COUNT): each succeeds or raises #GP, and the PMU stays sane.
//!
//! `emon run --profile P guest:msr-fuzz -- seed=N n=COUNT stop=K` (defaults: seed=1, n=2000,
//! stop=16). The guest prints its seed, so any run can be repeated exactly. A xorshift generator
//! picks, for each of COUNT accesses, an RDMSR or a WRMSR with a random value:
//! - mostly in emon's trapped PMU ranges (0xC1-0xC8, 0x186-0x18D, 0x309-0x30C, 0x345,
//!   0x38D-0x392, 0x1A0, 0x1D9, 0x3F1, 0x600, 0x4C1-0x4C8), whatever the profile declares;
//! - sometimes an RDMSR of any other index (architectural, x86-64, KVM's, or anything at all);
//! - sometimes an access to a non-PMU MSR from a small allow-list that cannot change the guest's
//!   own mode, memory or time (never EFER, FS/GS base, APIC base, SYSENTER/STAR/LSTAR, PAT,
//!   MTRRs, KVM's paravirtual MSRs...);
//! - sometimes an access to an index nothing implements (0xDEADxxxx), which must raise #GP.
//!
//! Every access must complete or raise #GP: any other exception fails, and a hang or crash fails
//! the run. Where PEBS and BTS are available, IA32_PEBS_ENABLE is only written with 0 and
//! IA32_DEBUGCTL without TR and BTS, so that no record goes through a random IA32_DS_AREA. On registers that nothing changes behind the guest's back (PERFEVTSELx,
//! FIXED_CTR_CTRL, PEBS_ENABLE, DS_AREA) a WRMSR that succeeds must read back, and one that
//! raises #GP must leave the register as it was.
//!
//! Random PERFEVTSEL / FIXED_CTR_CTRL / GLOBAL_CTRL writes make counters count (and overflow),
//! which emon's precise backend pays for by single-stepping. So every K accesses the guest stops
//! every counter or, one time in four, enables them all in GLOBAL_CTRL, so that counting does
//! happen. At the end it checks that the PMU still answers, restores a clean PMU state and
//! reports one `PASS:` line per MSR range with its ok / #GP counts.
#![no_std]
#![no_main]

use emon_guest::cpu::{cpuid, rdmsr, rdmsr_safe, wrmsr, wrmsr_safe};
use emon_guest::pmu::*;
use emon_guest::report::report_fmt;
use emon_guest::{catch, check, check_eq, dec, println, BootInfo};

emon_guest::entry!(main);

/// By default, stop every counter after this many accesses (counting is single-stepped).
const STOP_EVERY: u64 = 16;
/// At most this many failures are described; all are counted.
const MAX_REPORTED: u32 = 20;

/// xorshift64 (Marsaglia): deterministic from the seed, no SSE.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        // A zero state would stay zero; mix the seed (splitmix64 finaliser).
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Rng((z ^ (z >> 31)) | 1)
    }
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Counts of one class of MSR accesses.
struct Range {
    name: &'static str,
    lo: u32,
    hi: u32,
    rd_ok: u32,
    rd_gp: u32,
    wr_ok: u32,
    wr_gp: u32,
    /// Exceptions other than #GP, and broken read-back / no-change rules.
    failures: u32,
}

fn range(name: &'static str, lo: u32, hi: u32) -> Range {
    Range { name, lo, hi, rd_ok: 0, rd_gp: 0, wr_ok: 0, wr_gp: 0, failures: 0 }
}

/// Non-PMU MSRs a guest may write any value to without changing its own mode, memory or time:
/// WRMSR either #GPs or does something harmless.
const ALLOWED_WRITES: [u32; 10] = [
    0x48,        // IA32_SPEC_CTRL
    0x49,        // IA32_PRED_CMD (IBPB)
    0x8B,        // IA32_BIOS_SIGN_ID (KVM ignores guest writes)
    0x10B,       // IA32_FLUSH_CMD
    0xCE,        // MSR_PLATFORM_INFO (read-only for guests)
    0xE1,        // IA32_UMWAIT_CONTROL
    0x1B0,       // IA32_ENERGY_PERF_BIAS
    0x1FC,       // MSR_IA32_POWER_CTL
    0x6E0,       // IA32_TSC_DEADLINE (the LVT timer stays masked, interrupts off)
    0xC000_0103, // IA32_TSC_AUX
];

/// Base of the indices no one implements.
const UNIMPLEMENTED: u32 = 0xDEAD_0000;

/// An index for an RDMSR outside the PMU (reads change nothing): an architectural or x86-64 MSR,
/// one of KVM's, a neighbour of a PMU range, or anything at all.
fn random_other(rng: &mut Rng) -> u32 {
    match rng.below(6) {
        0 => rng.next() as u32,
        1 | 2 => rng.below(0x1000) as u32,
        3 => 0xC000_0000 + rng.below(0x200) as u32,
        4 => 0x4B56_4D00 + rng.below(0x10) as u32, // KVM's paravirtual MSRs
        _ => {
            // A neighbour of a PMU range.
            let r = &PMU_RANGES[rng.below(PMU_RANGES.len() as u64) as usize];
            if rng.below(2) == 0 {
                r.0 - 1
            } else {
                r.1 + 1
            }
        }
    }
}

/// The trapped PMU ranges (inclusive), in the order of the `Range` table.
const PMU_RANGES: [(u32, u32, &str); 10] = [
    (0xC1, 0xC8, "IA32_PMCx"),
    (0x186, 0x18D, "IA32_PERFEVTSELx"),
    (0x309, 0x30C, "IA32_FIXED_CTRx"),
    (0x345, 0x345, "IA32_PERF_CAPABILITIES"),
    (0x38D, 0x392, "IA32_FIXED_CTR_CTRL..IA32_PERF_GLOBAL_INUSE"),
    (0x1A0, 0x1A0, "IA32_MISC_ENABLE"),
    (0x1D9, 0x1D9, "IA32_DEBUGCTL"),
    (0x3F1, 0x3F1, "IA32_PEBS_ENABLE"),
    (0x600, 0x600, "IA32_DS_AREA"),
    (0x4C1, 0x4C8, "IA32_A_PMCx"),
];

/// A random value biased towards the bit patterns PMU registers care about.
fn random_value(rng: &mut Rng, msr: u32) -> u64 {
    match rng.below(11) {
        0 => 0,
        1 => u64::MAX,
        2 => 1u64 << rng.below(64),
        3 | 4 => rng.next() & 0xFFFF_FFFF,
        // The current value with one bit flipped.
        5 => rdmsr_safe(msr).unwrap_or(0) ^ (1u64 << rng.below(64)),
        // PERFEVTSEL-shaped: an event, USR/OS, maybe INT, EN.
        6 => (rng.next() & 0xFF_FFFF) | PERFEVTSEL_USR | PERFEVTSEL_OS,
        // Counter bits (GLOBAL_CTRL / OVF_CTRL shaped), sometimes with a status flag (55-63).
        7 => (rng.next() & 0xFF) | (rng.next() & 0xF) << 32,
        8 => (rng.next() & 0xFF) | (rng.next() & 0xF) << 32 | 1u64 << (55 + rng.below(9)),
        // FIXED_CTR_CTRL-shaped: fields of fixed counters 0-2 (0-1, 0).
        9 => (rng.next() & 0xFFF) >> (4 * rng.below(3)),
        _ => rng.next(),
    }
}

/// Every counter's bit in IA32_PERF_GLOBAL_CTRL.
fn all_counters(pmu: &Perfmon) -> u64 {
    let gp = (1u64 << pmu.gp.min(8)) - 1;
    (0..4u8).filter(|&i| pmu.fixed_supported(i)).fold(gp, |m, i| m | 1u64 << (32 + u32::from(i)))
}

/// Stops every counter: IA32_PERF_GLOBAL_CTRL = 0 (v2+), PERFEVTSELx.EN = 0 (v1).
fn stop_counting(pmu: &Perfmon) {
    if pmu.version >= 2 {
        let _ = wrmsr_safe(IA32_PERF_GLOBAL_CTRL, 0);
    } else {
        for i in 0..u32::from(pmu.gp.min(8)) {
            let _ = wrmsr_safe(IA32_PERFEVTSEL0 + i, 0);
        }
    }
}

/// Registers nothing but a guest WRMSR changes: a write that succeeds reads back, one that
/// raises #GP leaves them as they were. On NetBurst IA32_PEBS_ENABLE ignores bits 63:27 (as the
/// Pentium 4 does), so a write need not read back.
fn stable(msr: u32, netburst: bool) -> bool {
    (IA32_PERFEVTSEL0..IA32_PERFEVTSEL0 + 8).contains(&msr)
        || msr == IA32_FIXED_CTR_CTRL
        || msr == IA32_PEBS_ENABLE && !netburst
        || msr == IA32_DS_AREA
}

fn fail(r: &mut Range, reported: &mut u32, what: core::fmt::Arguments) {
    r.failures += 1;
    *reported += 1;
    if *reported <= MAX_REPORTED {
        report_fmt(false, what);
    } else {
        emon_guest::report::note_failure();
    }
}

fn main(boot: &BootInfo) -> i32 {
    let seed: u64 = boot.arg("seed").and_then(|v| v.parse().ok()).unwrap_or(1);
    let n: u64 = boot.arg("n").and_then(|v| v.parse().ok()).unwrap_or(2000);
    let stop: u64 = boot.arg("stop").and_then(|v| v.parse().ok()).filter(|&s| s > 0).unwrap_or(STOP_EVERY);
    println!("msr-fuzz: seed={} n={} stop={}", dec(seed), dec(n), dec(stop));
    let pmu = Perfmon::from_cpuid();
    let leaf_a = cpuid(0xA, 0);
    println!("msr-fuzz: perfmon version {}, {} GP counters", pmu.version, pmu.gp);
    // Where PEBS is available, a random IA32_PEBS_ENABLE with a random IA32_DS_AREA would have
    // the processor write PEBS records into whatever memory that points at, this guest's own
    // included: PEBS_ENABLE is then only ever written with 0.
    let pebs_available = rdmsr(IA32_MISC_ENABLE) & (1 << 12) == 0;
    // Likewise BTS: DEBUGCTL.TR and BTS (bits 6, 7) are never set where BTS is available.
    let bts_available = rdmsr(IA32_MISC_ENABLE) & (1 << 11) == 0;
    let netburst = emon_guest::netburst::present();

    // The PMU ranges, then RDMSR anywhere else, the non-PMU write allow-list, unimplemented.
    let pmu_ranges = PMU_RANGES.len();
    let (other, allowed, unimplemented) = (pmu_ranges, pmu_ranges + 1, pmu_ranges + 2);
    let mut ranges: [Range; PMU_RANGES.len() + 3] = core::array::from_fn(|i| match PMU_RANGES.get(i) {
        Some(&(lo, hi, name)) => range(name, lo, hi),
        None if i == other => range("non-PMU MSRs, any index (RDMSR)", 0, 0),
        None if i == allowed => range("non-PMU allow-list (RDMSR, WRMSR)", 0, 0),
        None => range("unimplemented MSRs 0xDEAD0000-0xDEADFFFF (#GP)", UNIMPLEMENTED, UNIMPLEMENTED + 0xFFFF),
    });

    let mut rng = Rng::new(seed);
    let mut reported = 0u32;
    let mut unimplemented_ok = 0u32;
    for i in 0..n {
        // Every `stop` accesses: stop every counter, or (one time in four, v2+) enable every
        // counter in GLOBAL_CTRL so that whatever PERFEVTSELx / FIXED_CTR_CTRL enable counts.
        if i % stop == 0 {
            if pmu.version >= 2 && rng.below(4) == 0 {
                let _ = wrmsr_safe(IA32_PERF_GLOBAL_CTRL, all_counters(&pmu));
            } else {
                stop_counting(&pmu);
            }
        }
        // Where: 80% PMU, 8% any other RDMSR, 8% allow-listed non-PMU, 4% unimplemented.
        let pick = rng.below(100);
        let (slot, msr, write) = if pick < 80 {
            let slot = rng.below(pmu_ranges as u64) as usize;
            let r = &ranges[slot];
            let msr = r.lo + rng.below(u64::from(r.hi - r.lo) + 1) as u32;
            (slot, msr, rng.below(2) == 0)
        } else if pick < 88 {
            let msr = random_other(&mut rng);
            // An index inside a PMU range is counted there (it is a PMU access).
            let slot = PMU_RANGES.iter().position(|&(lo, hi, _)| (lo..=hi).contains(&msr)).unwrap_or(other);
            (slot, msr, false)
        } else if pick < 96 {
            (allowed, ALLOWED_WRITES[rng.below(ALLOWED_WRITES.len() as u64) as usize], rng.below(4) != 0)
        } else {
            (unimplemented, UNIMPLEMENTED + rng.below(0x1_0000) as u32, rng.below(2) == 0)
        };
        let r = &mut ranges[slot];
        if write {
            let value = match random_value(&mut rng, msr) {
                _ if msr == IA32_PEBS_ENABLE && pebs_available => 0,
                v if msr == IA32_DEBUGCTL && bts_available => v & !(3 << 6),
                v => v,
            };
            let check_stable = stable(msr, netburst);
            let before = if check_stable { rdmsr_safe(msr).ok() } else { None };
            let e = catch(|| wrmsr(msr, value));
            match e {
                None => {
                    r.wr_ok += 1;
                    if check_stable {
                        let after = rdmsr_safe(msr);
                        if after != Ok(value) {
                            fail(
                                r,
                                &mut reported,
                                format_args!("WRMSR {:#x} = {:#x} succeeded but reads back {:x?}", msr, value, after),
                            );
                        }
                    }
                }
                Some(e) if e.is_gp() => {
                    r.wr_gp += 1;
                    if check_stable {
                        let after = rdmsr_safe(msr).ok();
                        if after != before {
                            fail(
                                r,
                                &mut reported,
                                format_args!(
                                    "WRMSR {:#x} = {:#x} raised #GP but changed it: {:x?} -> {:x?}",
                                    msr, value, before, after
                                ),
                            );
                        }
                    }
                }
                Some(e) => fail(
                    r,
                    &mut reported,
                    format_args!(
                        "WRMSR {:#x} = {:#x} raised vector {} (error {:#x})",
                        msr, value, e.vector, e.error_code
                    ),
                ),
            }
        } else {
            match catch(|| {
                let _ = rdmsr(msr);
            }) {
                None => r.rd_ok += 1,
                Some(e) if e.is_gp() => r.rd_gp += 1,
                Some(e) => fail(
                    r,
                    &mut reported,
                    format_args!("RDMSR {:#x} raised vector {} (error {:#x})", msr, e.vector, e.error_code),
                ),
            }
        }
        if slot == unimplemented && r.rd_ok + r.wr_ok > unimplemented_ok {
            unimplemented_ok = r.rd_ok + r.wr_ok;
            fail(r, &mut reported, format_args!("unimplemented MSR {:#x} did not raise #GP", msr));
        }
    }
    stop_counting(&pmu);

    // Still alive, and the PMU still answers as CPUID says.
    check!(true, "guest alive after {} accesses", dec(n));
    let now = cpuid(0xA, 0);
    check_eq!(
        (u64::from(now.eax) << 32) | u64::from(now.edx),
        (u64::from(leaf_a.eax) << 32) | u64::from(leaf_a.edx),
        "CPUID.0AH unchanged"
    );
    for r in &ranges {
        let total = u64::from(r.rd_ok + r.rd_gp + r.wr_ok + r.wr_gp + r.failures);
        report_fmt(
            r.failures == 0,
            format_args!(
                "{}: {} accesses: RDMSR {} ok {} #GP, WRMSR {} ok {} #GP, {} failures",
                r.name,
                dec(total),
                dec(u64::from(r.rd_ok)),
                dec(u64::from(r.rd_gp)),
                dec(u64::from(r.wr_ok)),
                dec(u64::from(r.wr_gp)),
                dec(u64::from(r.failures))
            ),
        );
    }
    restore(&pmu);
    emon_guest::summary()
}

/// Puts the PMU back in a clean state (nothing counting, no status, no PMI source) and checks
/// that each step works.
fn restore(pmu: &Perfmon) {
    if pmu.version == 0 {
        check!(rdmsr_safe(IA32_PERF_GLOBAL_CTRL).is_err(), "no PMU: IA32_PERF_GLOBAL_CTRL still #GP");
        return;
    }
    let ok = |msr: u32, v: u64| wrmsr_safe(msr, v).is_ok();
    let gp = pmu.gp.min(8);
    let mut clean = true;
    if pmu.version >= 2 {
        check!(rdmsr_safe(IA32_PERF_GLOBAL_CTRL).is_ok(), "IA32_PERF_GLOBAL_CTRL readable");
        clean &= ok(IA32_PERF_GLOBAL_CTRL, 0);
        clean &= ok(IA32_FIXED_CTR_CTRL, 0);
        for i in 0..4u8 {
            if pmu.fixed_supported(i) {
                clean &= ok(IA32_FIXED_CTR0 + u32::from(i), 0);
            }
        }
    }
    for i in 0..u32::from(gp) {
        clean &= ok(IA32_PERFEVTSEL0 + i, 0);
        clean &= ok(IA32_PMC0 + i, 0);
    }
    clean &= ok(IA32_PEBS_ENABLE, 0) && ok(IA32_DS_AREA, 0) && ok(IA32_DEBUGCTL, 0);
    if pmu.version >= 2 {
        // Clear every status bit (OVF_CTRL / STATUS_RESET takes any bit STATUS can hold).
        let status = rdmsr_safe(IA32_PERF_GLOBAL_STATUS).unwrap_or(u64::MAX);
        clean &= ok(IA32_PERF_GLOBAL_OVF_CTRL, status);
        check_eq!(rdmsr_safe(IA32_PERF_GLOBAL_STATUS).unwrap_or(u64::MAX), 0, "IA32_PERF_GLOBAL_STATUS cleared");
    }
    if pmu.version >= 4 {
        check_eq!(rdmsr_safe(IA32_PERF_GLOBAL_INUSE).unwrap_or(u64::MAX), 0, "IA32_PERF_GLOBAL_INUSE 0 when clean");
    }
    check!(clean, "PMU restored to a clean state (every WRMSR accepted)");
}
