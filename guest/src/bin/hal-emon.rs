//! The Windows HAL's Emon profile interface: which KPROFILE_SOURCEs CPUID.0AH makes supported, and that each supported source's PERFEVTSEL value counts on IA32_PMC0.
//!
//! This follows the rule the Windows 10 HAL applies (seed 000, "The Emon Profile Interface").
//! The HAL picks the Emon interface on an Intel processor with architectural perfmon
//! (CPUID.0AH:EAX[7:0] >= 1) and at least one general-purpose counter. It loads zero into every
//! declared IA32_PERFEVTSELx. Then each profile source (except ProfileTime 0x00, which the HAL
//! serves with a separate timer mechanism) is supported iff its CPUID.0AH:EBX bit is meaningful
//! (bit < EAX[31:24]) and clear. With no Emon interface (no perfmon, or no GP counter) every
//! source is unsupported and nothing is programmed.
//!
//! For each supported source the guest loads the HAL's PERFEVTSEL value into IA32_PERFEVTSEL0.
//! The HAL's values have USR|OS (bits 16-17) but not EN (bit 22). When the HAL starts profiling
//! it ORs in EN (0x400000), so here the WRMSR of `select | EN` starts the counter and the WRMSR of
//! `select` stops it. On v2+ the HAL never writes IA32_PERF_GLOBAL_CTRL: it relies on the
//! power-on value, which has every GP enable set, and this guest does the same. The counted
//! block (see guest:pmu-counters for the derivation) is
//! `mov r11d, N; 2: dec r11d; jnz 2b; xor r11d, r11d; jnz 3f; jz 3f; nop; 3:` followed by the
//! stop sequence `mov ecx, r8d; mov eax, r9d; mov edx, r10d; wrmsr` (counted). Under emon's
//! precise backend that is exactly 2N+8 instructions (0xC0), N+2 branches (0xC4), 2 branch
//! misses (0xC5: the loop's final not-taken backward JNZ and the taken forward JZ), 3N+108 core
//! cycles (0x3C/0x00), and those cycles over the TSC-to-reference ratio of CPUID leaf 0x15 in
//! reference cycles (0x3C/0x01, rounded either way; any count from 1 up without that leaf). The
//! block touches no memory, so ProfileCacheMisses, ProfileLLCReference and ProfileLLCMisses
//! count 0 in emon's cache model.
#![no_std]
#![no_main]

use emon_guest::cpu::{cpuid, rdmsr, vendor, wrmsr};
use emon_guest::pmu::{
    measured_block, ref_cycles_range, IA32_PERFEVTSEL0, IA32_PERF_GLOBAL_CTRL, IA32_PMC0, PERFEVTSEL_EN,
};
use emon_guest::{check, check_eq, dec, println, skip};

emon_guest::entry!(main);

/// PERFEVTSEL.EN, which the HAL ORs into a source's value to start counting.

struct Source {
    value: u8,
    name: &'static str,
    /// CPUID.0AH:EBX bit; None for ProfileTime (not an Emon source).
    bit: Option<u32>,
    select: u32,
}

/// The Windows 10 HAL's Emon profile sources (seed 000's table).
const SOURCES: [Source; 13] = [
    Source { value: 0x00, name: "ProfileTime", bit: None, select: 0x0003_003C },
    Source { value: 0x02, name: "ProfileTotalIssues", bit: Some(1), select: 0x0003_00C0 },
    Source { value: 0x06, name: "ProfileBranchInstructions", bit: Some(5), select: 0x0003_00C4 },
    Source { value: 0x0A, name: "ProfileCacheMisses", bit: Some(4), select: 0x0003_412E },
    Source { value: 0x0B, name: "ProfileBranchMispredictions", bit: Some(6), select: 0x0003_00C5 },
    Source { value: 0x13, name: "ProfileTotalCycles", bit: Some(0), select: 0x0003_003C },
    Source { value: 0x19, name: "ProfileUnhaltedCoreCycles", bit: Some(0), select: 0x0003_003C },
    Source { value: 0x1A, name: "ProfileInstructionRetired", bit: Some(1), select: 0x0003_00C0 },
    Source { value: 0x1B, name: "ProfileUnhaltedReferenceCycles", bit: Some(2), select: 0x0003_013C },
    Source { value: 0x1C, name: "ProfileLLCReference", bit: Some(3), select: 0x0003_4F2E },
    Source { value: 0x1D, name: "ProfileLLCMisses", bit: Some(4), select: 0x0003_412E },
    Source { value: 0x1E, name: "ProfileBranchInstructionRetired", bit: Some(5), select: 0x0003_00C4 },
    Source { value: 0x1F, name: "ProfileBranchMispredictsRetired", bit: Some(6), select: 0x0003_00C5 },
];

const EMON_SOURCES: u64 = 12;

/// What CPUID.0AH tells the HAL.
struct Leaf {
    version: u32,
    gp: u32,
    ebx_len: u32,
    ebx: u32,
}

/// The HAL's decision, as it makes it: start from every Emon source and drop each whose EBX bit
/// is not meaningful or is set. Returns a bitmap indexed like SOURCES.
fn hal_supported(emon: bool, l: &Leaf) -> u32 {
    if !emon {
        return 0;
    }
    let mut supported = 0u32;
    for (k, s) in SOURCES.iter().enumerate() {
        if let Some(bit) = s.bit {
            supported |= 1 << k;
            if bit >= l.ebx_len || l.ebx & (1 << bit) != 0 {
                supported &= !(1 << k);
            }
        }
    }
    supported
}

/// Why a source is, or is not, supported (the rule stated per source).
fn reason(emon: bool, l: &Leaf, s: &Source) -> (bool, &'static str) {
    match s.bit {
        None => (false, "ProfileTime is the HAL's timer source, not an Emon source"),
        Some(_) if !emon => (false, "the HAL has no Emon profile interface here"),
        Some(b) if b >= l.ebx_len => (false, "its EBX bit is beyond CPUID.0AH:EAX[31:24] (not meaningful)"),
        Some(b) if l.ebx & (1 << b) != 0 => (false, "its EBX bit is set in CPUID.0AH:EBX (event unavailable)"),
        Some(_) => (true, "its EBX bit is meaningful and clear in CPUID.0AH:EBX"),
    }
}

/// Expected count of `select`'s event for one run of the measured block with loop count `n`,
/// what is counted, and the formula.
fn expected(select: u32, n: u32) -> (u64, &'static str, &'static str) {
    let n = n as u64;
    match select & 0xFFFF {
        0x00C0 => (2 * n + 8, "instructions", "2N+8"),
        0x00C4 => (n + 2, "branches", "N+2"),
        0x00C5 => (2, "mispredicted branches", "static predictor"),
        0x003C => (3 * n + 108, "cycles", "cost model 3N+108"),
        0x013C => (3 * n + 108, "core cycles' worth of reference cycles", "cost model 3N+108 / CPUID.15H ratio"),
        _ => (0, "events", "the block touches no memory: no LLC events"),
    }
}

fn main(_boot: &emon_guest::BootInfo) -> i32 {
    let a = cpuid(0xA, 0);
    let l = Leaf { version: a.eax & 0xFF, gp: (a.eax >> 8) & 0xFF, ebx_len: a.eax >> 24, ebx: a.ebx };
    let v = vendor();
    let intel = &v == b"GenuineIntel";
    println!(
        "hal-emon: vendor {}, CPUID.0AH: EAX {:#x} EBX {:#x}: perfmon v{}, {} GP counters, EBX length {}",
        core::str::from_utf8(&v).unwrap_or("?"),
        a.eax,
        a.ebx,
        l.version,
        l.gp,
        l.ebx_len
    );
    let emon = intel && l.version >= 1 && l.gp >= 1;
    if emon {
        println!("the HAL chooses the Emon profile interface (Intel, perfmon v1+, at least one GP counter)");
    } else if emon_guest::netburst::present() {
        // Seed 000: the Emon interface reads CPUID leaf 0x0A, whose version "is known already to be
        // at least 1"; a NetBurst processor has no such leaf, so the HAL does not choose it.
        println!("no Emon profile interface: a NetBurst processor (family 0FH) has no CPUID.0AH architectural perfmon, which the HAL's Emon interface reads");
        check!(!emon, "the HAL does not choose the Emon profile interface on a NetBurst processor");
    } else {
        println!("no Emon profile interface: needs an Intel processor with perfmon v1+ and at least one GP counter");
    }

    // (1) The HAL's initialisation: zero into each declared PERFEVTSEL.
    if emon {
        for i in 0..l.gp {
            wrmsr(IA32_PERFEVTSEL0 + i, 0);
            check_eq!(rdmsr(IA32_PERFEVTSEL0 + i), 0u64, "HAL initialisation: IA32_PERFEVTSEL{} loaded with 0", i);
        }
    }

    // (2) The table, and (3) each source checked against the rule.
    let supported = hal_supported(emon, &l);
    println!("profile sources (value, name, EBX bit, PERFEVTSEL value, HAL decision):");
    for (k, s) in SOURCES.iter().enumerate() {
        let state = if s.bit.is_none() {
            "timer (not an Emon source)"
        } else if supported & (1 << k) != 0 {
            "supported"
        } else {
            "unsupported"
        };
        match s.bit {
            Some(b) => {
                println!("  0x{:02X} {}: EBX bit {}, PERFEVTSEL 0x{:08X}: {}", s.value, s.name, b, s.select, state)
            }
            None => println!("  0x{:02X} {}: no EBX bit, PERFEVTSEL 0x{:08X}: {}", s.value, s.name, s.select, state),
        }
    }
    for (k, s) in SOURCES.iter().enumerate() {
        let (want, why) = reason(emon, &l, s);
        let got = supported & (1 << k) != 0;
        check!(
            got == want,
            "0x{:02X} {} is {}: {}",
            s.value,
            s.name,
            if want { "supported" } else { "unsupported" },
            why
        );
    }

    // (4) Each supported source counts on IA32_PMC0.
    if supported != 0 {
        if l.version >= 2 {
            let g = rdmsr(IA32_PERF_GLOBAL_CTRL);
            println!("IA32_PERF_GLOBAL_CTRL = {:#x} (power-on value; the HAL does not write it)", g);
            check!(g & 1 != 0, "IA32_PERF_GLOBAL_CTRL powers on with IA32_PMC0's enable set, as the HAL relies on");
        }
        for (k, s) in SOURCES.iter().enumerate() {
            if supported & (1 << k) == 0 {
                continue;
            }
            let n = 100 + s.value as u32;
            let (want, what, rule) = expected(s.select, n);
            wrmsr(IA32_PERFEVTSEL0, s.select as u64);
            wrmsr(IA32_PMC0, 0);
            measured_block(n, IA32_PERFEVTSEL0, s.select as u64 | PERFEVTSEL_EN, IA32_PERFEVTSEL0, s.select as u64);
            wrmsr(IA32_PERFEVTSEL0, 0);
            let got = rdmsr(IA32_PMC0);
            println!(
                "  0x{:02X} {}: PERFEVTSEL0 = 0x{:08X} | EN, N={}: IA32_PMC0 = {}",
                s.value,
                s.name,
                s.select,
                dec(n as u64),
                dec(got)
            );
            let (lo, hi) = if s.select & 0xFFFF == 0x013C { ref_cycles_range(want) } else { (want, want) };
            check!(
                lo <= got && got <= hi,
                "0x{:02X} {} counts {} {} on IA32_PMC0 (N={}, {})",
                s.value,
                s.name,
                dec(want),
                what,
                dec(n as u64),
                rule
            );
        }
    } else if emon {
        skip!("counting: no Emon profile source is supported");
    }

    let count = supported.count_ones();
    println!(
        "hal-emon: {} of {} Emon profile sources supported (ProfileTime 0x00, the HAL's timer source, is not counted)",
        count, EMON_SOURCES
    );
    emon_guest::summary()
}
