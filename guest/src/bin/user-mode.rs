//! User mode (CPL3): a known user-mode function counted with USR-only, OS-only and both on GP and fixed counters, an overflow PMI taken from user mode with zero skid, and SYSCALL/SYSRETQ round trips counted exactly at each level.
#![no_std]
#![no_main]

use core::arch::global_asm;
use core::sync::atomic::{AtomicU64, Ordering::SeqCst};
use emon_guest::cpu::{rdmsr, wrmsr};
use emon_guest::idt::{self, Regs};
use emon_guest::pmu::*;
use emon_guest::user::{self, make_user_accessible};
use emon_guest::{apic, check, check_eq, dec, println, skip};

emon_guest::entry!(main);

/// Iterations of the user function's loop.
const N: u64 = 1000;
/// User instructions before the HLT: `mov ecx, N`, then N x (`add rax, 1`; `loop`).
const USER_INSNS: u64 = 1 + 2 * N;

global_asm!(
    ".global user_fn",
    "user_fn:",
    "mov ecx, {n}",
    "2: add rax, 1",
    ".global user_fn_loop",
    "user_fn_loop:",
    "loop 2b",
    "hlt", // #GP at CPL3: back to the kernel
    n = const N,
);

/// SYSCALL round trips of the user function `user_syscalls`.
const SYSCALLS: u64 = 100;
/// Its user instructions before the HLT: `mov ebx, SYSCALLS`, then SYSCALLS x (`syscall`; `dec
/// ebx`; `jnz`). The kernel's entry runs 2 per call: `lock inc` and `sysretq`.
const SYSCALL_USER_INSNS: u64 = 1 + 3 * SYSCALLS;

static SYSCALLS_SEEN: AtomicU64 = AtomicU64::new(0);

global_asm!(
    ".global user_syscalls",
    "user_syscalls:",
    "mov ebx, {n}",
    "2: syscall",
    "dec ebx",
    "jnz 2b",
    "hlt", // #GP at CPL3: back to the kernel
    ".global syscall_entry",
    "syscall_entry:",
    "lock inc qword ptr [rip + {seen}]",
    "sysretq",
    n = const SYSCALLS,
    seen = sym SYSCALLS_SEEN,
);

extern "C" {
    fn user_fn();
    fn user_fn_loop();
    fn user_syscalls();
    fn syscall_entry();
}

const IA32_EFER: u32 = 0xC000_0080;
const IA32_STAR: u32 = 0xC000_0081;
const IA32_LSTAR: u32 = 0xC000_0082;
const IA32_FMASK: u32 = 0xC000_0084;
/// EFER.SCE: SYSCALL and SYSRET enabled.
const EFER_SCE: u64 = 1;

/// SYSCALL enters `syscall_entry` at CPL0 with the kernel's selectors, and SYSRETQ returns to
/// the user's (SDM Vol. 2B: CS from STAR[47:32], SS that + 8; SYSRETQ's CS from STAR[63:48] + 16,
/// SS that + 8), with IF masked.
fn enable_syscall() {
    wrmsr(IA32_EFER, rdmsr(IA32_EFER) | EFER_SCE);
    let sysret_base = u64::from(idt::USER_DS & !3) - 8;
    wrmsr(IA32_STAR, sysret_base << 48 | u64::from(idt::KERNEL_CS) << 32);
    wrmsr(IA32_LSTAR, syscall_entry as *const () as u64);
    wrmsr(IA32_FMASK, 1 << 9);
}

/// Runs `user_fn` at CPL3 until its HLT raises #GP; returns the vector.
fn run_user() -> u8 {
    user::run_user(user_fn, 0)
}

static PMI_RIP: AtomicU64 = AtomicU64::new(0);
static PMI_CS: AtomicU64 = AtomicU64::new(0);
static PMIS: AtomicU64 = AtomicU64::new(0);

fn on_pmi(regs: &mut Regs) {
    PMIS.fetch_add(1, SeqCst);
    PMI_RIP.store(regs.rip, SeqCst);
    PMI_CS.store(regs.cs, SeqCst);
    wrmsr(IA32_PERFEVTSEL0, 0); // stop PMC0
    apic::eoi();
}

fn main(_boot: &emon_guest::BootInfo) -> i32 {
    let pmu = Perfmon::from_cpuid();
    if pmu.version < 2 || pmu.gp < 2 || !pmu.event_available(EVENT_INSTRUCTIONS) {
        skip!("user mode: needs perfmon v2+, 2 GP counters and instructions retired");
        return emon_guest::summary();
    }
    make_user_accessible();
    check_eq!(run_user(), 13u8, "user_fn runs at CPL3 and its HLT raises #GP");

    // PMC0 USR only, PMC1 OS only, PMC2 (where there is one) both, FIXED_CTR0 USR only.
    let both = pmu.gp >= 3;
    let fixed = pmu.fixed >= 1;
    let usr = PERFEVTSEL_EN | PERFEVTSEL_USR | 0xC0;
    let os = PERFEVTSEL_EN | PERFEVTSEL_OS | 0xC0;
    let mut global = 0b11u64;
    let used = if both { 3 } else { 2 };
    wrmsr(IA32_PERF_GLOBAL_CTRL, 0);
    for i in 0..used {
        wrmsr(IA32_PMC0 + i, 0);
    }
    wrmsr(IA32_PERFEVTSEL0, usr);
    wrmsr(IA32_PERFEVTSEL0 + 1, os);
    if both {
        wrmsr(IA32_PERFEVTSEL0 + 2, usr | os);
        global |= 0b100;
    }
    if fixed {
        wrmsr(IA32_FIXED_CTR0, 0);
        wrmsr(IA32_FIXED_CTR_CTRL, 0x2); // FIXED_CTR0: USR only
        global |= 1 << 32;
    }
    wrmsr(IA32_PERF_GLOBAL_CTRL, global);
    let v = run_user();
    wrmsr(IA32_PERF_GLOBAL_CTRL, 0);
    check_eq!(v, 13u8, "counted run: back from user mode through #GP");
    let (u, o) = (rdmsr(IA32_PMC0), rdmsr(IA32_PMC0 + 1));
    println!("user {} os {}", dec(u), dec(o));
    check_eq!(u, USER_INSNS, "USR-only counts exactly the user function's {} instructions", dec(USER_INSNS));
    check!(o > 0, "OS-only counts the kernel's instructions ({})", dec(o));
    if both {
        check_eq!(rdmsr(IA32_PMC0 + 2), u + o, "USR|OS counts both");
    }
    if fixed {
        check_eq!(rdmsr(IA32_FIXED_CTR0), u, "FIXED_CTR0 with EN = USR counts the user function");
        wrmsr(IA32_FIXED_CTR_CTRL, 0);
    }
    for i in 0..used {
        wrmsr(IA32_PERFEVTSEL0 + i, 0);
    }

    // An overflow PMI from user mode: PMC0 (USR, INT) overflows at the 500th user instruction,
    // an `add` (even instructions are adds: 1 is the MOV); the PMI comes before the LOOP after it.
    idt::set_handler(APIC_PERFMON_VECTOR, on_pmi);
    apic::enable();
    apic::write(apic::LVT_PMC, APIC_PERFMON_VECTOR as u32);
    let width = pmu.gp_width;
    let max = Perfmon::max(width);
    // Legacy writes sign-extend bit 31: (2^w - 500) written as its low 32 bits.
    wrmsr(IA32_PMC0, (max - 499) & 0xFFFF_FFFF);
    wrmsr(IA32_PERFEVTSEL0, usr | PERFEVTSEL_INT);
    wrmsr(IA32_PERF_GLOBAL_CTRL, 1);
    emon_guest::cpu::enable_interrupts();
    let v = run_user();
    emon_guest::cpu::disable_interrupts();
    wrmsr(IA32_PERF_GLOBAL_CTRL, 0);
    wrmsr(IA32_PERFEVTSEL0, 0);
    check_eq!(v, 13u8, "PMI run: back from user mode through #GP");
    check_eq!(PMIS.load(SeqCst), 1u64, "one PMI");
    check_eq!(PMI_CS.load(SeqCst) & 3, 3u64, "the PMI interrupted user mode (CS.RPL = 3)");
    check_eq!(
        PMI_RIP.load(SeqCst),
        user_fn_loop as *const () as u64,
        "zero skid: the PMI comes right after the overflowing instruction"
    );

    // SYSCALL and SYSRETQ: PMC0 USR, PMC1 OS, PMC2 (where there is one) both.
    enable_syscall();
    for i in 0..used {
        wrmsr(IA32_PMC0 + i, 0);
    }
    wrmsr(IA32_PERFEVTSEL0, usr);
    wrmsr(IA32_PERFEVTSEL0 + 1, os);
    let mut global = 0b11;
    if both {
        wrmsr(IA32_PERFEVTSEL0 + 2, usr | os);
        global |= 0b100;
    }
    wrmsr(IA32_PERF_GLOBAL_CTRL, global);
    let v = user::run_user(user_syscalls, 0);
    wrmsr(IA32_PERF_GLOBAL_CTRL, 0);
    check_eq!(v, 13u8, "SYSCALL run: back from user mode through #GP");
    check_eq!(SYSCALLS_SEEN.load(SeqCst), SYSCALLS, "every SYSCALL entered the kernel at LSTAR");
    let (u, o) = (rdmsr(IA32_PMC0), rdmsr(IA32_PMC0 + 1));
    println!("syscalls: user {} os {}", dec(u), dec(o));
    check_eq!(u, SYSCALL_USER_INSNS, "USR counts {} user instructions, each SYSCALL once", dec(SYSCALL_USER_INSNS));
    check!(o >= 2 * SYSCALLS, "OS counts the entry's 2 instructions per call and the #GP's ({})", dec(o));
    if both {
        check_eq!(rdmsr(IA32_PMC0 + 2), u + o, "USR|OS counts both across SYSCALL and SYSRETQ");
    }
    for i in 0..used {
        wrmsr(IA32_PERFEVTSEL0 + i, 0);
    }
    emon_guest::summary()
}
