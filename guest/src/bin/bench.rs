//! Benchmark probes for `emon bench`: a counted or stepped instruction loop, the cost of trapped PMU MSR, port I/O and in-kernel MSR exits, and of RDPMC and #GP at the #GP handler's breakpoint, and a code shape counted with four given events, timed with RDTSC.
#![no_std]
#![no_main]

use core::arch::{asm, global_asm};
use emon_guest::cpu::{cpuid, rdmsr, wrmsr};
use emon_guest::pmu::{IA32_FIXED_CTR0, IA32_FIXED_CTR_CTRL, IA32_PERFEVTSEL0, IA32_PERF_GLOBAL_CTRL, IA32_PMC0};
use emon_guest::{dec, idt, println};

emon_guest::entry!(main);

const IA32_TIME_STAMP_COUNTER: u32 = 0x10;

fn rdtsc() -> u64 {
    let (lo, hi): (u32, u32);
    // SAFETY: RDTSC has no side effects.
    unsafe { asm!("lfence", "rdtsc", out("eax") lo, out("edx") hi, options(nostack)) };
    ((hi as u64) << 32) | lo as u64
}

/// `mov rcx, n; 1: dec rcx; jnz 1b`: 2n + 1 instructions.
fn spin(n: u64) {
    // SAFETY: register-only loop.
    unsafe { asm!("2:", "dec {n}", "jnz 2b", n = inout(reg) n => _, options(nostack, nomem)) };
}

/// The code shapes `emon bench` compares the engines on, `n` iterations each:
/// - `straight`: 64 ALU instructions and a loop branch (straight-line code);
/// - `loop10`: KVM's PMU test loop, `mov rax, [rsi]; add rsi, 64; nop x 7; loop` (reads n x 64 bytes);
/// - `loopdot`: `loop .`;
/// - `branchy`: a loop whose conditional branch alternates taken and not taken;
/// - `kernel`: what kernel code is full of, `endbr64; pause; lfence; add rax, 1` and a loop branch.
fn run_shape(shape: &str, n: u64) {
    // SAFETY: registers only, except loop10, which reads n x 64 bytes of RAM from 16 MiB up.
    unsafe {
        match shape {
            "straight" => asm!(
                "2:",
                ".rept 64", "add rax, 1", ".endr",
                "dec rcx", "jnz 2b",
                inout("rcx") n => _, out("rax") _, options(nostack, nomem),
            ),
            "loop10" => asm!(
                "2: mov rax, [rsi]", "add rsi, 64",
                "nop", "nop", "nop", "nop", "nop", "nop", "nop",
                "loop 2b",
                inout("rcx") n => _, inout("rsi") 0x100_0000u64 => _, out("rax") _, options(nostack, readonly),
            ),
            "loopdot" => asm!("2: loop 2b", inout("rcx") n => _, options(nostack, nomem)),
            "kernel" => asm!(
                "2:", "endbr64", "pause", "lfence", "add rax, 1", "dec rcx", "jnz 2b",
                inout("rcx") n => _, out("rax") _, options(nostack, nomem),
            ),
            "branchy" => asm!(
                "2: test rcx, 1", "jz 3f", "add rax, 1", "3: add rdx, 1", "dec rcx", "jnz 2b",
                inout("rcx") n => _, out("rax") _, out("rdx") _, options(nostack, nomem),
            ),
            _ => {}
        }
    }
}

/// `n` port I/O exits (OUT to emon's ignored POST-code port 0x80).
fn port_io(n: u64) {
    // SAFETY: port 0x80 is ignored.
    (0..n).for_each(|_| unsafe { asm!("out 0x80, al", in("al") 0u8, options(nostack, nomem)) });
}

// A #GP handler entered straight from the IDT: drops the error code and returns past the 3-byte
// `mov rax, [rax]` that faulted.
global_asm!(".global skip_load_gp", "skip_load_gp:", "add rsp, 8", "add qword ptr [rsp], 3", "iretq",);

extern "C" {
    fn skip_load_gp();
}

/// A load from a non-canonical address: #GP(0), which [`skip_load_gp`] skips.
fn non_canonical_load() {
    // SAFETY: the load faults and the handler returns past it.
    unsafe { asm!("mov rax, [rax]", inout("rax") 0x8000_0000_0000_0000u64 => _, options(nostack)) };
}

/// RAM from 32 MiB up, mapped and touched a 4 KiB page at a time by [`map_and_touch`].
const TOUCH_BASE: u64 = 32 << 20;
/// Page-table entries for up to 64 MiB of 4 KiB pages.
static mut PTES: [u64; 16384] = [0; 16384];

/// What a kvm-unit-tests program's set-up does to its RAM: a page-table entry for every 4 KiB
/// page of `pages`, and a write to each page.
fn map_and_touch(pages: u64) {
    let ptes = (&raw mut PTES).cast::<u64>();
    for i in 0..pages.min(16384) {
        let page = TOUCH_BASE + i * 4096;
        // SAFETY: PTES is the guest's own; the page is RAM (the run gives enough).
        unsafe {
            ptes.add(i as usize).write_volatile(page | 3);
            (page as *mut u8).write_volatile(i as u8);
        }
    }
}

fn time(f: impl FnOnce()) -> u64 {
    let t0 = rdtsc();
    f();
    rdtsc() - t0
}

fn main(boot: &emon_guest::BootInfo) -> i32 {
    let n: u64 = boot.arg("n").and_then(|v| v.parse().ok()).unwrap_or(10_000);
    match boot.arg("mode").unwrap_or("") {
        "loop-counted" => {
            let version = cpuid(0xA, 0).eax & 0xFF;
            wrmsr(IA32_PMC0, 0);
            if version >= 2 {
                wrmsr(IA32_PERF_GLOBAL_CTRL, 1);
            }
            wrmsr(IA32_PERFEVTSEL0, 0x4300C0); // EN | OS | USR, instructions retired
            let tsc = time(|| spin(n));
            wrmsr(IA32_PERFEVTSEL0, 0);
            println!("bench loop instructions={} tsc={} counted={}", dec(2 * n + 1), dec(tsc), dec(rdmsr(IA32_PMC0)));
        }
        "loop" => {
            let tsc = time(|| spin(n));
            println!("bench loop instructions={} tsc={}", dec(2 * n + 1), dec(tsc));
        }
        "exits" => {
            let pmu = time(|| {
                (0..n).for_each(|_| {
                    let _ = rdmsr(IA32_PERF_GLOBAL_CTRL);
                })
            });
            // SAFETY: port 0x80 is emon's ignored POST-code port.
            let pio =
                time(|| (0..n).for_each(|_| unsafe { asm!("out 0x80, al", in("al") 0u8, options(nostack, nomem)) }));
            let kvm = time(|| {
                (0..n).for_each(|_| {
                    let _ = rdmsr(IA32_TIME_STAMP_COUNTER);
                })
            });
            println!(
                "bench exits n={} pmu_msr_tsc={} port_io_tsc={} kvm_msr_tsc={}",
                dec(n),
                dec(pmu),
                dec(pio),
                dec(kvm)
            );
        }
        "cycles" => {
            // IA32_PMC0 counts core cycles (0x3C) over the loop.
            wrmsr(IA32_PMC0, 0);
            if cpuid(0xA, 0).eax & 0xFF >= 2 {
                wrmsr(IA32_PERF_GLOBAL_CTRL, 1);
            }
            wrmsr(IA32_PERFEVTSEL0, 0x43003C);
            spin(n);
            wrmsr(IA32_PERFEVTSEL0, 0);
            println!("bench cycles n={} counted={}", dec(n), dec(rdmsr(IA32_PMC0)));
        }
        "reprogram" => {
            // Reconfigures IA32_PMC0 n times: enable and disable a cycles event, and rewrite the counter.
            if cpuid(0xA, 0).eax & 0xFF >= 2 {
                wrmsr(IA32_PERF_GLOBAL_CTRL, 1);
            }
            for i in 0..n {
                wrmsr(IA32_PMC0, i & 0xFFFF);
                wrmsr(IA32_PERFEVTSEL0, 0x43003C);
                wrmsr(IA32_PERFEVTSEL0, 0);
            }
            println!("bench reprogram n={}", dec(n));
        }
        "unknown-msrs" => {
            // n accesses to n distinct MSRs emon does not know (run with --ignore-msrs).
            for i in 0..n {
                let _ = emon_guest::cpu::rdmsr_safe(0x4000_0000 + i as u32 * 7);
            }
            println!("bench unknown-msrs n={}", dec(n));
        }
        "shape" => {
            // A code shape for the precise backend's engines, counted on IA32_PMC0 (instructions).
            let shape = boot.arg("shape").unwrap_or("");
            let version = cpuid(0xA, 0).eax & 0xFF;
            wrmsr(IA32_PMC0, 0);
            if version >= 2 {
                wrmsr(IA32_PERF_GLOBAL_CTRL, 1);
            }
            wrmsr(IA32_PERFEVTSEL0, 0x4300C0);
            let tsc = time(|| run_shape(shape, n));
            wrmsr(IA32_PERFEVTSEL0, 0);
            println!("bench shape={} n={} counted={} tsc={}", shape, dec(n), dec(rdmsr(IA32_PMC0)), dec(tsc));
        }
        "events" => {
            // A code shape counted with the PERFEVTSEL values `sels` (comma-separated hex, one per
            // GP counter from IA32_PMC0) and instructions on IA32_FIXED_CTR0, for `emon bench`'s
            // model-specific events against architectural ones.
            let shape = boot.arg("shape").unwrap_or("");
            let mut sels = [0u64; 4];
            let mut k = 0;
            for (slot, v) in sels.iter_mut().zip(boot.arg("sels").unwrap_or("").split(',')) {
                *slot = u64::from_str_radix(v.trim_start_matches("0x"), 16).unwrap_or(0);
                k += 1;
            }
            for (i, sel) in sels.iter().take(k).enumerate() {
                wrmsr(IA32_PMC0 + i as u32, 0);
                wrmsr(IA32_PERFEVTSEL0 + i as u32, *sel);
            }
            wrmsr(IA32_FIXED_CTR0, 0);
            wrmsr(IA32_FIXED_CTR_CTRL, 3); // FIXED_CTR0 at every privilege level
            let enable = (1u64 << k) - 1 | 1 << 32;
            let tsc = time(|| {
                wrmsr(IA32_PERF_GLOBAL_CTRL, enable);
                run_shape(shape, n);
                wrmsr(IA32_PERF_GLOBAL_CTRL, 0);
            });
            let c = |i: u32| rdmsr(IA32_PMC0 + i);
            println!(
                "bench events shape={} n={} counted={} tsc={} c0={} c1={} c2={} c3={}",
                shape,
                dec(n),
                dec(rdmsr(IA32_FIXED_CTR0)),
                dec(tsc),
                dec(c(0)),
                dec(c(1)),
                dec(c(2)),
                dec(c(3))
            );
        }
        "rdpmc" => {
            // RDPMC completed at the #GP handler; a #GP passed on to the guest (a non-canonical
            // load, to a minimal raw handler that skips it), with emon's breakpoint on the handler
            // and with emon standing aside (the guest's DR7 enables a breakpoint of its own, on an
            // address never run); and a port I/O exit, for scale.
            idt::set_raw_gate(13, skip_load_gp as *const () as u64);
            // emon looks at the IDT at exits: one exit, and its breakpoint is on the new handler.
            port_io(1);
            let rdpmc = time(|| (0..n).for_each(|_| drop(emon_guest::cpu::rdpmc(0))));
            let gp = time(|| (0..n).for_each(|_| non_canonical_load()));
            // SAFETY: DR0 = 8 (never executed), L0: emon stands aside once it has seen DR7.
            unsafe { asm!("mov dr0, {}", "mov dr7, {}", in(reg) 8u64, in(reg) 0x401u64) };
            port_io(300);
            let gp_aside = time(|| (0..n).for_each(|_| non_canonical_load()));
            // SAFETY: DR7 off again.
            unsafe { asm!("mov dr7, {}", in(reg) 0x400u64) };
            let pio = time(|| port_io(n));
            println!(
                "bench rdpmc n={} rdpmc_tsc={} gp_tsc={} gp_aside_tsc={} port_io_tsc={}",
                dec(n),
                dec(rdpmc),
                dec(gp),
                dec(gp_aside),
                dec(pio)
            );
        }
        "pio" => {
            let pio = time(|| port_io(n));
            println!("bench pio n={} port_io_tsc={}", dec(n), dec(pio));
        }
        "free" => {
            // Nothing counts: a CPL0 loop of 2n + 1 instructions, run wherever emon runs CPL0
            // code (KVM, or the TCG engine: --cpl0).
            let tsc = time(|| spin(n));
            println!("bench free n={} tsc={}", dec(n), dec(tsc));
        }
        "touch" => {
            // Nothing counts: n pages mapped and touched, as a kvm-unit-tests set-up does.
            let tsc = time(|| map_and_touch(n));
            println!("bench touch n={} tsc={}", dec(n), dec(tsc));
        }
        m => println!(
            "bench: unknown mode '{m}' (loop, loop-counted, exits, cycles, reprogram, unknown-msrs, shape, events, rdpmc, pio, free, touch)"
        ),
    }
    0
}
