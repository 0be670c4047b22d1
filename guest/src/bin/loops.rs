//! Full-size loops as KVM's PMU test runs them: `loop .` with ECX = 1e9, and a 10-instruction read loop of 1e6 iterations measured many times, with exact instruction and branch counts.
#![no_std]
#![no_main]

use core::arch::asm;
use emon_guest::cpu::{rdmsr, wrmsr};
use emon_guest::pmu::{
    Perfmon, EVENT_BRANCHES, EVENT_INSTRUCTIONS, IA32_PERFEVTSEL0, IA32_PERF_GLOBAL_CTRL, IA32_PMC0,
};
use emon_guest::{check_eq, dec, println, skip};

emon_guest::entry!(main);

/// PERFEVTSEL: EN | OS | USR with this event select.
const fn evtsel(event: u64) -> u64 {
    (1 << 22) | (1 << 17) | (1 << 16) | event
}

/// The sequence that starts IA32_PMC0 and IA32_PMC1 (GLOBAL_CTRL = 0b11; counting starts after
/// its WRMSR), and the one that stops them (4 instructions that count, none a branch).
macro_rules! start_counting {
    () => {
        "mov ecx, 0x38F\n mov eax, 3\n xor edx, edx\n wrmsr"
    };
}
macro_rules! stop_counting {
    () => {
        "mov ecx, 0x38F\n xor eax, eax\n xor edx, edx\n wrmsr"
    };
}
const STOP: u64 = 4;

fn read_counters() -> (u64, u64) {
    (rdmsr(IA32_PMC0), rdmsr(IA32_PMC0 + 1))
}

/// `mov ecx, n; 1: loop 1b`, counted: 1 + n instructions, n branches.
fn loop_dot(n: u32) -> (u64, u64) {
    wrmsr(IA32_PMC0, 0);
    wrmsr(IA32_PMC0 + 1, 0);
    // SAFETY: PMU MSRs and registers only.
    unsafe {
        asm!(
            start_counting!(),
            "mov ecx, r8d",
            "2: loop 2b",
            stop_counting!(),
            in("r8") n, out("eax") _, out("ecx") _, out("edx") _,
            options(nostack, nomem),
        );
    }
    read_counters()
}

/// `mov rsi, buf; mov ecx, n; 1: mov rax, [rsi]; add rsi, 64; nop x 7; loop 1b`, counted:
/// 2 + 10n instructions, n branches.
fn read_loop(buf: u64, n: u32) -> (u64, u64) {
    wrmsr(IA32_PMC0, 0);
    wrmsr(IA32_PMC0 + 1, 0);
    // SAFETY: reads n x 64 bytes of guest RAM from `buf` (the run gives the guest enough).
    unsafe {
        asm!(
            start_counting!(),
            "mov rsi, r9",
            "mov ecx, r8d",
            "2: mov rax, [rsi]",
            "add rsi, 64",
            "nop", "nop", "nop", "nop", "nop", "nop", "nop",
            "loop 2b",
            stop_counting!(),
            in("r8") n, in("r9") buf, out("eax") _, out("ecx") _, out("edx") _, out("rsi") _,
            options(nostack, readonly),
        );
    }
    read_counters()
}

fn main(boot: &emon_guest::BootInfo) -> i32 {
    let arg = |k: &str, d: u64| boot.arg(k).and_then(|v| v.parse().ok()).unwrap_or(d);
    let (calibrate, iterations, passes) =
        (arg("calibrate", 1_000_000_000), arg("iterations", 1_000_000), arg("passes", 60));
    let pmu = Perfmon::from_cpuid();
    if pmu.version < 2 || pmu.gp < 2 || !pmu.event_available(EVENT_INSTRUCTIONS) || !pmu.event_available(EVENT_BRANCHES)
    {
        skip!("loops: needs perfmon v2+, 2 GP counters, instructions and branches");
        return emon_guest::summary();
    }
    println!("loops: calibrate={} iterations={} passes={}", dec(calibrate), dec(iterations), dec(passes));
    wrmsr(IA32_PERF_GLOBAL_CTRL, 0);
    wrmsr(IA32_PERFEVTSEL0, evtsel(0xC0));
    wrmsr(IA32_PERFEVTSEL0 + 1, evtsel(0xC4));

    // `loop .` with ECX preset: ECX LOOPs, each a branch.
    let (insns, branches) = loop_dot(calibrate as u32);
    check_eq!(insns, 1 + calibrate + STOP, "`loop .` x {}: instructions", dec(calibrate));
    check_eq!(branches, calibrate, "`loop .` x {}: branches", dec(calibrate));

    // The 10-instruction read loop over a buffer, 64 bytes a step.
    let buf = 0x0200_0000u64; // 32 MiB up; the loop reads `iterations` x 64 bytes from it
    let mut wrong = 0;
    for pass in 0..passes {
        let (insns, branches) = read_loop(buf, iterations as u32);
        if (insns, branches) != (2 + 10 * iterations + STOP, iterations) {
            wrong += 1;
            println!("  pass {}: {} instructions, {} branches", dec(pass), dec(insns), dec(branches));
        }
    }
    check_eq!(wrong, 0u64, "{} passes of 10 x {} instructions, each counted exactly", dec(passes), dec(iterations));
    emon_guest::summary()
}
