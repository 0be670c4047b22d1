//! Exact counts across everything that interrupts single-stepping: port I/O and MSR exits, a self-IPI, HLT woken by the APIC timer, RDPMC.
//!
//! Each region is counted by IA32_PMC0 (instructions retired), started by a WRMSR of
//! IA32_PERF_GLOBAL_CTRL (not counted) and stopped by `mov ecx, 0x38F; xor eax, eax; xor edx, edx;
//! wrmsr` (4, counted). Interrupts go to a raw IDT gate whose handler retires exactly 6
//! instructions (`lock inc`, `push rax`, `mov eax, EOI`, `mov [rax], 0`, `pop rax`, `iretq`), so
//! every expected count is exact.
#![no_std]
#![no_main]

use core::arch::{asm, global_asm};
use core::sync::atomic::{AtomicU64, Ordering::SeqCst};
use emon_guest::cpu::{disable_interrupts, enable_interrupts, rdmsr, rdpmc, wrmsr};
use emon_guest::pmu::{Perfmon, EVENT_INSTRUCTIONS, IA32_PERFEVTSEL0, IA32_PERF_GLOBAL_CTRL, IA32_PMC0};
use emon_guest::{apic, catch, check, check_eq, dec, idt, println, skip};

emon_guest::entry!(main);

const IPI_VECTOR: u8 = 0x41;
const TIMER_VECTOR: u8 = 0x42;
/// Instructions the raw handler retires.
const HANDLER: u64 = 6;
/// The 4 instructions that stop the counter.
const STOP: u64 = 4;

#[no_mangle]
static RAW_HITS: AtomicU64 = AtomicU64::new(0);

global_asm!(
    ".global step_events_raw_handler",
    "step_events_raw_handler:",
    "lock inc qword ptr [rip + RAW_HITS]",
    "push rax",
    "mov eax, 0xFEE000B0", // local APIC EOI
    "mov dword ptr [rax], 0",
    "pop rax",
    "iretq",
);

extern "C" {
    fn step_events_raw_handler();
}

/// Starts counting, runs `$body`, stops counting; evaluates to IA32_PMC0.
macro_rules! counted {
    ($($body:tt)*) => {{
        wrmsr(IA32_PMC0, 0);
        // SAFETY: the body only touches what it declares; the counter MSRs are the PMU's.
        unsafe {
            asm!(
                "mov ecx, 0x38F",
                "mov eax, 1",
                "xor edx, edx",
                "wrmsr", // GLOBAL_CTRL = 1: counting starts after this
                $($body)*
                "mov ecx, 0x38F",
                "xor eax, eax",
                "xor edx, edx",
                "wrmsr",
                out("eax") _, out("ecx") _, out("edx") _, out("r8") _, out("r9") _,
            );
        }
        rdmsr(IA32_PMC0)
    }};
}

fn main(_boot: &emon_guest::BootInfo) -> i32 {
    let pmu = Perfmon::from_cpuid();
    let (version, gp) = (pmu.version, pmu.gp);
    println!("step-events: perfmon v{version}, {gp} GP counters");
    if version < 2 || gp == 0 || !pmu.event_available(EVENT_INSTRUCTIONS) {
        skip!("step events: needs perfmon v2+ and the instructions-retired event");
        return emon_guest::summary();
    }
    idt::set_raw_gate(IPI_VECTOR, step_events_raw_handler as *const () as u64);
    idt::set_raw_gate(TIMER_VECTOR, step_events_raw_handler as *const () as u64);
    apic::enable();
    wrmsr(IA32_PERF_GLOBAL_CTRL, 0);
    wrmsr(IA32_PERFEVTSEL0, 0x4300C0); // EN | OS | USR, instructions retired, no INT

    let n = counted!("nop", "nop", "nop",);
    check_eq!(n, 3 + STOP, "plain instructions: 3 + {}", dec(STOP));

    let n = counted!("mov dx, 0x80", "out dx, al", "out dx, al", "in al, dx",);
    check_eq!(n, 4 + STOP, "port I/O exits in the middle of stepping count once each");

    let n = counted!("mov ecx, 0xC1", "rdmsr", "mov r8, rax",);
    check_eq!(n, 3 + STOP, "RDMSR exits in the middle of stepping count once each");
    // RDMSR of the counting counter reads what retired before it: `mov ecx, 0xC1` (1).
    let mid: u64;
    wrmsr(IA32_PMC0, 0);
    // SAFETY: as in `counted!`.
    unsafe {
        asm!(
            "mov ecx, 0x38F", "mov eax, 1", "xor edx, edx", "wrmsr",
            "mov ecx, 0xC1", "rdmsr", "mov r8d, eax",
            "mov ecx, 0x38F", "xor eax, eax", "xor edx, edx", "wrmsr",
            out("r8") mid, out("eax") _, out("ecx") _, out("edx") _,
        );
    }
    check_eq!(mid, 1u64, "RDMSR of a counting counter reads the instructions retired before it");

    enable_interrupts();
    RAW_HITS.store(0, SeqCst);
    // Self-IPI: ICR = vector | fixed | shorthand "self"; delivered right after the store retires.
    let n = counted!("mov r9d, 0xFEE00300", "mov dword ptr [r9], 0x40041", "nop",);
    check_eq!(RAW_HITS.load(SeqCst), 1u64, "the self-IPI was handled once");
    check_eq!(
        n,
        3 + HANDLER + STOP,
        "a self-IPI in the middle of stepping: its handler's {} instructions count",
        dec(HANDLER)
    );

    // HLT woken by the APIC timer: HLT retires, the vCPU halts until the interrupt. Interrupts
    // are off until the `sti` right before the HLT, whose one-instruction shadow holds an interrupt
    // that is already pending until HLT has retired (SDM Vol. 2, STI). So the interrupt comes after
    // the HLT whenever the timer fires, however slowly the host runs the guest.
    disable_interrupts();
    apic::write(0x3E0, 0xB); // timer divide by 1
    apic::write(0x320, TIMER_VECTOR as u32); // one-shot
    for (pending_first, what) in [(false, "while halted"), (true, "already pending at STI")] {
        RAW_HITS.store(0, SeqCst);
        apic::write(0x380, 100_000);
        if pending_first {
            // Wait until the timer's vector is requested (APIC IRR), held off by IF = 0.
            let irr = 0x200 + 0x10 * u32::from(TIMER_VECTOR / 32);
            while apic::read(irr) & (1 << (TIMER_VECTOR % 32)) == 0 {
                core::hint::spin_loop();
            }
        }
        let n = counted!("sti", "hlt", "nop",);
        disable_interrupts();
        check_eq!(RAW_HITS.load(SeqCst), 1u64, "the APIC timer woke the HLT ({})", what);
        check_eq!(
            n,
            3 + HANDLER + STOP,
            "STI and HLT count once and the timer handler's instructions count ({})",
            what
        );
    }

    // RDPMC while counting: the count so far, for GP and (ECX[30]) fixed counters.
    wrmsr(IA32_PMC0, 0);
    let (v, fast): (u64, u64);
    // SAFETY: as in `counted!`.
    unsafe {
        asm!(
            "mov ecx, 0x38F", "mov eax, 1", "xor edx, edx", "wrmsr",
            "nop", "nop",
            "xor ecx, ecx", "rdpmc", "shl rdx, 32", "or rax, rdx", "mov r8, rax",
            "mov ecx, 0x80000000", "rdpmc", "mov r9d, eax",
            "mov ecx, 0x38F", "xor eax, eax", "xor edx, edx", "wrmsr",
            out("r8") v, out("r9") fast, out("eax") _, out("ecx") _, out("edx") _,
        );
    }
    check_eq!(v, 3u64, "RDPMC 0 while counting returns the 3 instructions retired before it");
    check_eq!(fast, 8u64, "RDPMC with ECX[31] (fast read) returns the low 32 bits");
    let e = catch(|| {
        wrmsr(IA32_PERF_GLOBAL_CTRL, 1);
        let _ = rdpmc(u32::from(gp) + 1);
    });
    wrmsr(IA32_PERF_GLOBAL_CTRL, 0);
    check!(e.is_some_and(|e| e.is_gp()), "RDPMC of a counter beyond CPUID.0AH:EAX[15:8] raises #GP");
    wrmsr(IA32_PERFEVTSEL0, 0);
    // Exceptions in counted code: #UD and a #PF on a page that is not mapped, each taken by
    // the runtime's handler. The counts (printed) must be the same however emon runs the code.
    wrmsr(IA32_PERFEVTSEL0, 0x4300C0); // EN | OS | USR, instructions retired
    for (what, expect) in [("#UD", 6u8), ("#PF", 14u8)] {
        wrmsr(IA32_PMC0, 0);
        wrmsr(IA32_PERF_GLOBAL_CTRL, 1);
        let e = catch::catch(|| {
            // SAFETY: each raises the exception the catch takes; nothing is written.
            unsafe {
                if expect == 6 {
                    asm!("nop", "nop", "ud2", options(nostack));
                } else {
                    asm!("nop", "mov rax, [{a}]", a = in(reg) 0x40_0000_0000u64, out("rax") _, options(nostack, readonly));
                }
            }
        });
        wrmsr(IA32_PERF_GLOBAL_CTRL, 0);
        let n = rdmsr(IA32_PMC0);
        check!(
            e.is_some_and(|e| e.vector == expect) && n > 3,
            "{} in counted code is taken and its handler counted: {} instructions",
            what,
            dec(n)
        );
    }
    emon_guest::summary()
}
