//! Prints CPUID leaf 0x0A decoded: what a guest OS learns about the PMU it runs on.
#![no_std]
#![no_main]

use emon_guest::cpu::{cpuid, max_leaf, rdmsr_safe, vendor};
use emon_guest::{check, println};

emon_guest::entry!(main);

/// Architectural events in CPUID.0AH:EBX bit order (SDM Table 18-1).
const ARCH_EVENTS: [&str; 8] = [
    "UnHalted Core Cycles",
    "Instructions Retired",
    "UnHalted Reference Cycles",
    "LLC Reference",
    "LLC Misses",
    "Branch Instructions Retired",
    "Branch Misses Retired",
    "Topdown Slots",
];

fn main(_boot: &emon_guest::BootInfo) -> i32 {
    let v = vendor();
    let sig = cpuid(1, 0);
    let family = ((sig.eax >> 8) & 0xF) + if (sig.eax >> 8) & 0xF == 0xF { (sig.eax >> 20) & 0xFF } else { 0 };
    let model = ((sig.eax >> 4) & 0xF) | (((sig.eax >> 16) & 0xF) << 4);
    println!(
        "cpuid-report: vendor {} family {:#x} model {:#x} stepping {} (leaf 1 eax {:#010x})",
        core::str::from_utf8(&v).unwrap_or("?"),
        family,
        model,
        sig.eax & 0xF,
        sig.eax
    );
    // The processor brand string (leaves 8000_0002H-8000_0004H, NUL-terminated).
    if cpuid(0x8000_0000, 0).eax >= 0x8000_0004 {
        let mut brand = [0u8; 48];
        for (n, leaf) in (0x8000_0002u32..=0x8000_0004).enumerate() {
            let r = cpuid(leaf, 0);
            for (k, reg) in [r.eax, r.ebx, r.ecx, r.edx].into_iter().enumerate() {
                brand[16 * n + 4 * k..16 * n + 4 * k + 4].copy_from_slice(&reg.to_le_bytes());
            }
        }
        let len = brand.iter().position(|&b| b == 0).unwrap_or(48);
        println!("cpuid-report: brand [{}]", core::str::from_utf8(&brand[..len]).unwrap_or("?"));
    }
    // The feature leaves as this guest reads them (README, "CPUID fidelity").
    println!("CPUID.01H: eax={:#010x} ebx={:#010x} ecx={:#010x} edx={:#010x}", sig.eax, sig.ebx, sig.ecx, sig.edx);
    if max_leaf() >= 7 {
        let l7 = cpuid(7, 0);
        println!("CPUID.07H.0: eax={:#010x} ebx={:#010x} ecx={:#010x} edx={:#010x}", l7.eax, l7.ebx, l7.ecx, l7.edx);
    }
    let pdcm = sig.ecx & (1 << 15) != 0;
    println!("CPUID.01H:ECX.PDCM = {}", u32::from(pdcm));
    if max_leaf() < 0xA {
        println!("CPUID leaf 0x0A: not present (max basic leaf {:#x})", max_leaf());
        return emon_guest::summary();
    }
    let a = cpuid(0xA, 0);
    println!("CPUID.0AH: eax={:#010x} ebx={:#010x} ecx={:#010x} edx={:#010x}", a.eax, a.ebx, a.ecx, a.edx);
    let version = a.eax & 0xFF;
    println!("architectural perfmon version: {version}");
    if version == 0 {
        println!("no architectural performance monitoring");
        return emon_guest::summary();
    }
    println!("general-purpose counters: {} x {} bits", (a.eax >> 8) & 0xFF, (a.eax >> 16) & 0xFF);
    if version >= 2 {
        println!("fixed-function counters: {} x {} bits", a.edx & 0x1F, (a.edx >> 5) & 0xFF);
    }
    if version >= 5 {
        println!("fixed-counter bitmap (ecx): {:#x}", a.ecx);
    }
    let len = a.eax >> 24;
    println!("EBX event vector length: {len}");
    for (bit, name) in ARCH_EVENTS.iter().enumerate() {
        let state = if bit as u32 >= len {
            "not enumerated"
        } else if a.ebx & (1 << bit) != 0 {
            "unavailable"
        } else {
            "available"
        };
        println!("  event {bit}: {name}: {state}");
    }
    if pdcm {
        let caps = rdmsr_safe(0x345);
        match caps {
            Ok(caps) => println!("IA32_PERF_CAPABILITIES = {caps:#x} (FW_WRITE {})", u64::from(caps & (1 << 13) != 0)),
            Err(e) => println!("IA32_PERF_CAPABILITIES: exception {}", e.vector),
        }
        check!(caps.is_ok(), "IA32_PERF_CAPABILITIES is readable when CPUID.01H:ECX.PDCM = 1");
    }
    // A SUMMARY line, so that `emon test` (and any kvm-unit-tests-style runner) can judge the run.
    emon_guest::summary()
}
