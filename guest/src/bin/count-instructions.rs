//! Exact counts (the walkthrough experiment in the README): IA32_PMC0 (and IA32_FIXED_CTR0) count exactly the instructions a function retires.
//!
//! As in the walkthrough, IA32_PERFEVTSEL0 = 0x5300C0 (INST_RETIRED, USR, OS, INT, EN) is written
//! right before `call foo`, and the counter is stopped by `mov ecx, IA32_PERFEVTSEL0; rdmsr;
//! btr eax, 22; wrmsr`. The count starts after the enabling WRMSR and includes the 4 instructions
//! that stop the counter, so it is: 1 (call) + 2N+2 (foo: mov, N x (dec, jnz), ret) + 4.
#![no_std]
#![no_main]

use core::arch::asm;
use emon_guest::cpu::{rdmsr, wrmsr};
use emon_guest::pmu::{
    Perfmon, EVENT_INSTRUCTIONS, IA32_FIXED_CTR0, IA32_FIXED_CTR_CTRL, IA32_PERFEVTSEL0, IA32_PERF_GLOBAL_CTRL,
    IA32_PERF_GLOBAL_OVF_CTRL, IA32_PMC0,
};
use emon_guest::{check_eq, dec, println, skip};

emon_guest::entry!(main);

/// foo(): `mov ecx, N; 1: dec ecx; jnz 1b; ret` — 2N+2 instructions (N >= 1).
fn expected(n: u32, stop_insns: u64) -> u64 {
    1 + (2 * n as u64 + 2) + stop_insns
}

/// Runs `call foo` with PMC0 enabled by the WRMSR right before it (seed listing 15-2/15-3).
fn run_pmc0(n: u32, evtsel: u32) {
    // SAFETY: only PMU MSRs and registers declared as clobbered are touched.
    unsafe {
        asm!(
            "mov ecx, 0x186",
            "xor edx, edx",
            "wrmsr",           // IA32_PERFEVTSEL0 = evtsel: counting starts after this
            "call 2f",
            "mov ecx, 0x186",  // the 4 instructions that stop the counter (counted)
            "rdmsr",
            "btr eax, 22",
            "wrmsr",
            "jmp 3f",
            "2:",
            "mov ecx, {n:e}",
            "4:",
            "dec ecx",
            "jnz 4b",
            "ret",
            "3:",
            n = in(reg) n,
            inout("eax") evtsel => _,
            out("ecx") _,
            out("edx") _,
        );
    }
}

/// The same function counted by IA32_FIXED_CTR0, started and stopped through GLOBAL_CTRL.
fn run_fixed0(n: u32, global: u64) {
    // SAFETY: as above.
    unsafe {
        asm!(
            "mov ecx, 0x38F",
            "wrmsr",           // GLOBAL_CTRL = global: counting starts after this
            "call 2f",
            "mov ecx, 0x38F",  // 4 instructions that stop it (counted)
            "xor eax, eax",
            "xor edx, edx",
            "wrmsr",
            "jmp 3f",
            "2:",
            "mov ecx, {n:e}",
            "4:",
            "dec ecx",
            "jnz 4b",
            "ret",
            "3:",
            n = in(reg) n,
            inout("eax") global as u32 => _,
            inout("edx") (global >> 32) as u32 => _,
            out("ecx") _,
        );
    }
}

fn main(_boot: &emon_guest::BootInfo) -> i32 {
    let pmu = Perfmon::from_cpuid();
    let (version, gp) = (pmu.version, pmu.gp);
    let inst_available = pmu.event_available(EVENT_INSTRUCTIONS);
    println!("count-instructions: perfmon v{version}, {gp} GP counters, instructions-retired event available: {inst_available}");
    if version == 0 || gp == 0 || !inst_available {
        skip!("instructions retired on IA32_PMC0: no architectural instructions-retired event");
        return emon_guest::summary();
    }
    if version >= 2 {
        wrmsr(IA32_PERF_GLOBAL_CTRL, 1);
    }
    for n in [1u32, 2, 100, 1000] {
        wrmsr(IA32_PMC0, 0);
        run_pmc0(n, 0x5300C0);
        let got = rdmsr(IA32_PMC0);
        println!("foo(N={}): IA32_PMC0 = {} ({:#x})", dec(n as u64), dec(got), got);
        check_eq!(
            got,
            expected(n, 4),
            "IA32_PMC0 counts call + foo(N={}) + the 4 stopping instructions",
            dec(n as u64)
        );
    }
    // OS only / USR only (the guest runs at CPL0).
    wrmsr(IA32_PMC0, 0);
    run_pmc0(100, 0x4200C0);
    check_eq!(rdmsr(IA32_PMC0), expected(100, 4), "PERFEVTSEL.OS alone counts CPL0 instructions");
    wrmsr(IA32_PMC0, 0);
    run_pmc0(100, 0x4100C0);
    check_eq!(rdmsr(IA32_PMC0), 0u64, "PERFEVTSEL.USR alone counts nothing at CPL0");
    // Repeatable: the same code gives the same count.
    wrmsr(IA32_PMC0, 0);
    run_pmc0(500, 0x5300C0);
    let first = rdmsr(IA32_PMC0);
    wrmsr(IA32_PMC0, 0);
    run_pmc0(500, 0x5300C0);
    check_eq!(rdmsr(IA32_PMC0), first, "the same function counts the same twice");

    if pmu.fixed_supported(0) {
        wrmsr(IA32_PERF_GLOBAL_CTRL, 0);
        wrmsr(IA32_FIXED_CTR_CTRL, 0x3); // FIXED_CTR0 EN = 3 (all rings)
        for n in [1u32, 100] {
            wrmsr(IA32_FIXED_CTR0, 0);
            run_fixed0(n, 1 << 32);
            let got = rdmsr(IA32_FIXED_CTR0);
            check_eq!(
                got,
                expected(n, 4),
                "IA32_FIXED_CTR0 counts call + foo(N={}) + 4 via GLOBAL_CTRL",
                dec(n as u64)
            );
        }
        wrmsr(IA32_FIXED_CTR_CTRL, 0);
        wrmsr(IA32_PERF_GLOBAL_OVF_CTRL, (1 << 32) | 1);
    } else {
        skip!("IA32_FIXED_CTR0: the profile has no fixed counter 0");
    }
    wrmsr(IA32_PERFEVTSEL0, 0);
    emon_guest::summary()
}
