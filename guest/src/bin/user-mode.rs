//! User mode (CPL3): a known user-mode function counted with USR-only, OS-only and both on GP and fixed counters, an overflow PMI taken from user mode with zero skid, SYSCALL/SYSRETQ round trips, a local-APIC timer interrupt taken in a long user-mode loop and one held while the kernel had IF clear (taken before the first user instruction), INT n / INT3 round trips, the guest's own single-stepping and breakpoints (DR0-DR3) in user mode, and a straight-line user run ending in each kind of exception (#GP, #UD, #DE, #PF, #BP), each counted exactly at each level and each with an overflow PMI taken in its run.
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

/// The user loop the timer interrupts: `xor ecx, ecx`, `mov rdx, SPIN_LIMIT`, then per
/// iteration `inc rcx`, `cmp byte [TIMER_SEEN], 0`, `jne`, `cmp rcx, rdx`, `jb` until the timer's
/// handler sets TIMER_SEEN (the last iteration ends at the taken `jne`), then `mov [SPINS], rcx`.
const SPIN_LIMIT: u64 = 1 << 40;
static TIMER_SEEN: AtomicU64 = AtomicU64::new(0);
static SPINS: AtomicU64 = AtomicU64::new(0);
/// User instructions of the loop for `n` iterations ended by the flag.
const fn spin_insns(n: u64) -> u64 {
    2 + 5 * (n - 1) + 3 + 1
}

global_asm!(
    ".global user_spin",
    "user_spin:",
    "xor ecx, ecx",
    "mov rdx, {limit}",
    "2: inc rcx",
    ".global user_spin_loop",
    "user_spin_loop:",
    "cmp byte ptr [rip + {seen}], 0",
    "jne 3f",
    "cmp rcx, rdx",
    "jb 2b",
    "3: mov [rip + {spins}], rcx",
    ".global user_spin_end",
    "user_spin_end:",
    "hlt", // #GP at CPL3: back to the kernel
    limit = const SPIN_LIMIT,
    seen = sym TIMER_SEEN,
    spins = sym SPINS,
);

/// INT n round trips: `mov ebx, INTS`, then INTS x (`int USER_VECTOR`; `dec ebx`; `jnz`), then
/// `int3`, whose #BP (a trap: INT3 retires) brings it back to the kernel. `user_int_kernel` is
/// `int KERNEL_VECTOR`, whose gate is DPL0: #GP(KERNEL_VECTOR * 8 + 2).
const INTS: u64 = 50;
const USER_VECTOR: u8 = 0x80;
const KERNEL_VECTOR: u8 = 0x81;
const INT_USER_INSNS: u64 = 1 + 3 * INTS + 1;

global_asm!(
    ".global user_ints",
    "user_ints:",
    "mov ebx, {n}",
    "2: int {user}",
    "dec ebx",
    "jnz 2b",
    "int3",
    ".global user_int_kernel",
    "user_int_kernel:",
    "int {kernel}",
    n = const INTS,
    user = const USER_VECTOR,
    kernel = const KERNEL_VECTOR,
);

/// Straight-line user runs of [`RUN`] NOPs ending in an exception: (name, entry, vector, user
/// instructions that retire). HLT raises #GP(0), UD2 #UD, DIV by zero #DE (after its three
/// zeroing instructions), a load from an address the user cannot reach #PF (after the NOPs
/// only), and INT3 #BP (a trap: it retires).
const RUN: u64 = 200;

global_asm!(
    ".global exit_gp", "exit_gp:", ".rept {run}", "nop", ".endr", "hlt",
    ".global exit_ud", "exit_ud:", ".rept {run}", "nop", ".endr", "ud2",
    ".global exit_de", "exit_de:", ".rept {run}", "nop", ".endr",
    "xor edx, edx", "xor eax, eax", "xor ecx, ecx", "div ecx",
    ".global exit_pf", "exit_pf:", ".rept {run}", "nop", ".endr", "mov eax, dword ptr [{apic}]",
    ".global exit_bp", "exit_bp:", ".rept {run}", "nop", ".endr", "int3",
    run = const RUN,
    apic = const apic::BASE,
);

/// A user run traced with RFLAGS.TF: two NOPs, `mov eax, 0x5A`, `mov ecx, 3`, `lea rdi, [TRACED_BUF]`, `rep
/// stosb` (three iterations), then HLT's #GP. A single-step trap follows each instruction and
/// each iteration of the REP: TRACED_TRAPS of them, over TRACED_INSNS retired instructions.
const TRACED_TRAPS: u64 = 3 + 2 + 3;
const TRACED_INSNS: u64 = 3 + 2 + 1;
static mut TRACED_BUF: [u8; 16] = [0; 16];
static DB_TRAPS: AtomicU64 = AtomicU64::new(0);
static DB_FROM_USER: AtomicU64 = AtomicU64::new(0);
static DB_STEP_STATUS: AtomicU64 = AtomicU64::new(0);
static DB_LAST_RIP: AtomicU64 = AtomicU64::new(0);

global_asm!(
    ".global user_traced",
    "user_traced:",
    "nop",
    "nop",
    "mov eax, 0x5A",
    "mov ecx, 3",
    "lea rdi, [rip + {buf}]",
    "rep stosb",
    ".global user_traced_end",
    "user_traced_end:",
    "hlt", // #GP at CPL3: back to the kernel
    buf = sym TRACED_BUF,
);

/// A user run under the guest's own breakpoints (SDM Vol. 3B 17.2.4, 17.3.1): DR0 an
/// instruction breakpoint on `user_bp_exec`, DR1 a 4-byte write breakpoint on BP_WORD, DR2 an
/// 8-byte read/write breakpoint on BP_QUAD, DR3 a 1-byte write breakpoint on BP_BYTES[2]. Four
/// #DBs: before `user_bp_exec` (a fault: the handler sets RF in the frame so that it runs once),
/// after the store to BP_WORD (its load does not meet the write breakpoint), after the load
/// from BP_QUAD + 4, and after the third iteration of `rep stosb` (its frame at the REP, RCX 1).
/// Then HLT's #GP. USR counts the BP_INSNS retired instructions, the REP once.
const BP_INSNS: u64 = 9;
#[repr(align(8))]
struct Watched([u8; 8]);
static mut BP_WORD: Watched = Watched([0; 8]);
static mut BP_QUAD: Watched = Watched([0; 8]);
static mut BP_BYTES: Watched = Watched([0; 8]);
/// DR7: L0 (R/W0 00, LEN0 00: execution), L1 (R/W1 01: writes, LEN1 11: 4 bytes), L2 (R/W2 11:
/// reads and writes, LEN2 10: 8 bytes), L3 (R/W3 01, LEN3 00: 1 byte), and bit 10, which reads 1.
const BP_DR7: u64 = 1 | 1 << 2 | 1 << 4 | 1 << 6 | 1 << 10 | 0b1101 << 20 | 0b1011 << 24 | 0b0001 << 28;
/// Per #DB taken (up to 8): its frame's RIP, DR6.B0-B3 and RCX.
static BP_SEEN: [[AtomicU64; 3]; 8] = [const { [const { AtomicU64::new(0) }; 3] }; 8];
static BP_TRAPS: AtomicU64 = AtomicU64::new(0);

global_asm!(
    ".global user_bp",
    "user_bp:",
    "nop",
    ".global user_bp_exec",
    "user_bp_exec:",
    "mov eax, 7",
    "mov dword ptr [rip + {word}], eax",
    ".global user_bp_after_write",
    "user_bp_after_write:",
    "mov ebx, dword ptr [rip + {word}]",
    "mov ecx, dword ptr [rip + {quad} + 4]",
    ".global user_bp_after_read",
    "user_bp_after_read:",
    "lea rdi, [rip + {bytes}]",
    "mov ecx, 4",
    "mov al, 0x11",
    ".global user_bp_rep",
    "user_bp_rep:",
    "rep stosb",
    "hlt", // #GP at CPL3: back to the kernel
    word = sym BP_WORD,
    quad = sym BP_QUAD,
    bytes = sym BP_BYTES,
);

/// The breakpoints' #DB: notes where it came from and which breakpoints DR6 names (clearing
/// them, as the CPU never does), and resumes past an instruction breakpoint with RF.
fn on_bp(regs: &mut Regs) {
    let n = BP_TRAPS.fetch_add(1, SeqCst) as usize;
    let dr6: u64;
    // SAFETY: DR6 at CPL0.
    unsafe { core::arch::asm!("mov {}, dr6", "mov dr6, {}", out(reg) dr6, in(reg) 0xFFFF_0FF0u64) };
    if let Some(seen) = BP_SEEN.get(n) {
        seen[0].store(regs.rip, SeqCst);
        seen[1].store(dr6 & 0xF, SeqCst);
        seen[2].store(regs.rcx, SeqCst);
    }
    if dr6 & 1 != 0 {
        // An instruction breakpoint is a fault: RF lets the instruction run (SDM Vol. 3B 17.3.1.1).
        regs.rflags |= 1 << 16;
    }
}

/// Sets DR0-DR3 and DR7.
fn set_breakpoints(addr: [u64; 4], dr7: u64) {
    // SAFETY: the debug registers at CPL0; the breakpoints are the test's own.
    unsafe {
        core::arch::asm!(
            "mov dr0, {}", "mov dr1, {}", "mov dr2, {}", "mov dr3, {}", "mov dr7, {}",
            in(reg) addr[0], in(reg) addr[1], in(reg) addr[2], in(reg) addr[3], in(reg) dr7,
        )
    };
}

/// The single-step #DB: counts it, from user mode, with DR6.BS (SDM Vol. 3B 17.2.3), which it
/// clears (the CPU never does).
fn on_db(regs: &mut Regs) {
    DB_TRAPS.fetch_add(1, SeqCst);
    if regs.cs & 3 == 3 {
        DB_FROM_USER.fetch_add(1, SeqCst);
    }
    DB_LAST_RIP.store(regs.rip, SeqCst);
    let dr6: u64;
    // SAFETY: DR6 at CPL0.
    unsafe { core::arch::asm!("mov {}, dr6", "mov dr6, {}", out(reg) dr6, in(reg) 0xFFFF_0FF0u64) };
    if dr6 & (1 << 14) != 0 {
        DB_STEP_STATUS.fetch_add(1, SeqCst);
    }
}

extern "C" {
    fn user_traced();
    fn user_traced_end();
    fn user_bp();
    fn user_bp_exec();
    fn user_bp_after_write();
    fn user_bp_after_read();
    fn user_bp_rep();
    fn exit_gp();
    fn exit_ud();
    fn exit_de();
    fn exit_pf();
    fn exit_bp();
    fn user_spin();
    fn user_spin_loop();
    fn user_spin_end();
    fn user_ints();
    fn user_int_kernel();
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

static TIMER_RIP: AtomicU64 = AtomicU64::new(0);
static TIMER_CS: AtomicU64 = AtomicU64::new(0);
static TIMERS: AtomicU64 = AtomicU64::new(0);
/// The local-APIC timer's vector.
const TIMER_VECTOR: u8 = 0x40;

fn on_timer(regs: &mut Regs) {
    TIMERS.fetch_add(1, SeqCst);
    TIMER_RIP.store(regs.rip, SeqCst);
    TIMER_CS.store(regs.cs, SeqCst);
    TIMER_SEEN.store(1, SeqCst);
    apic::eoi();
}

static INTS_SEEN: AtomicU64 = AtomicU64::new(0);

fn on_user_int(regs: &mut Regs) {
    if regs.cs & 3 == 3 {
        INTS_SEEN.fetch_add(1, SeqCst);
    }
}

/// Programs PMC0 USR, PMC1 OS and PMC2 (where there is one) both for instructions retired, from
/// 0; returns how many it programmed.
fn count_usr_os(pmu: &Perfmon) -> u32 {
    let used = if pmu.gp >= 3 { 3 } else { 2 };
    let sel = [PERFEVTSEL_USR, PERFEVTSEL_OS, PERFEVTSEL_USR | PERFEVTSEL_OS];
    wrmsr(IA32_PERF_GLOBAL_CTRL, 0);
    for i in 0..used {
        wrmsr(IA32_PMC0 + i, 0);
        wrmsr(IA32_PERFEVTSEL0 + i, PERFEVTSEL_EN | sel[i as usize] | 0xC0);
    }
    wrmsr(IA32_PERF_GLOBAL_CTRL, (1 << used) - 1);
    used
}

/// Stops the counters [`count_usr_os`] programmed and checks USR = `user` exactly, OS > 0, and
/// USR|OS = both; `what` names the run and `user_insns` its user instructions.
fn check_usr_os(used: u32, user: u64, what: &str, user_insns: &str) {
    wrmsr(IA32_PERF_GLOBAL_CTRL, 0);
    let (u, o) = (rdmsr(IA32_PMC0), rdmsr(IA32_PMC0 + 1));
    check_eq!(u, user, "{what}: USR counts exactly {user_insns}");
    check!(o > 0, "{what}: OS counts the kernel's instructions");
    if used == 3 {
        check_eq!(rdmsr(IA32_PMC0 + 2), u + o, "{what}: USR|OS counts both");
    }
    for i in 0..used {
        wrmsr(IA32_PERFEVTSEL0 + i, 0);
    }
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

    // A local-APIC timer interrupt (one-shot, about 1 ms) taken in a user-mode loop that spins
    // until the handler says so, counted.
    idt::set_handler(TIMER_VECTOR, on_timer);
    apic::write(apic::TIMER_DIVIDE, apic::TIMER_DIVIDE_BY_1);
    let used = count_usr_os(&pmu);
    apic::write(apic::LVT_TIMER, TIMER_VECTOR as u32);
    apic::write(apic::TIMER_INITIAL_COUNT, 1_000_000);
    // IF is set in user mode only: however long the way to CPL3 takes, the interrupt is taken there.
    let v = user::run_user_interruptible(user_spin, 0);
    let spins = SPINS.load(SeqCst);
    check_eq!(v, 13u8, "timer run: back from user mode through #GP");
    check_eq!(TIMERS.load(SeqCst), 1u64, "one timer interrupt");
    check_eq!(TIMER_CS.load(SeqCst) & 3, 3u64, "the timer interrupted user mode (CS.RPL = 3)");
    let rip = TIMER_RIP.load(SeqCst);
    check!(
        (user_spin as *const () as u64..user_spin_end as *const () as u64).contains(&rip),
        "the interrupted RIP is in the user loop"
    );
    check!(spins > 0 && spins < SPIN_LIMIT, "the loop ended when the handler said so");
    check_usr_os(used, spin_insns(spins.max(1)), "timer run", "the loop's user instructions (5 an iteration)");

    // The same interrupt come due while the kernel had IF clear: held until IRETQ sets IF, then
    // taken at the first user-mode instruction boundary, before the loop's first instruction
    // (SDM Vol. 3A 6.8.1), so the loop sees the flag on its first iteration.
    TIMER_SEEN.store(0, SeqCst);
    TIMERS.store(0, SeqCst);
    let used = count_usr_os(&pmu);
    apic::write(apic::TIMER_INITIAL_COUNT, 1_000);
    while apic::read(apic::TIMER_CURRENT_COUNT) != 0 {}
    let v = user::run_user_interruptible(user_spin, 0);
    check_eq!(v, 13u8, "held-timer run: back from user mode through #GP");
    check_eq!(TIMERS.load(SeqCst), 1u64, "held-timer run: one timer interrupt");
    check_eq!(TIMER_CS.load(SeqCst) & 3, 3u64, "held-timer run: taken in user mode (CS.RPL = 3)");
    check_eq!(
        TIMER_RIP.load(SeqCst),
        user_spin as *const () as u64,
        "held-timer run: taken before the first user instruction"
    );
    check_eq!(SPINS.load(SeqCst), 1u64, "held-timer run: the loop saw the flag on its first iteration");
    check_usr_os(used, spin_insns(1), "held-timer run", "the loop's first iteration");
    let _ = user_spin_loop;

    // INT n to a DPL3 gate, INT3, and INT n to a DPL0 gate (#GP(n * 8 + 2)) from user mode.
    idt::allow_user(USER_VECTOR);
    idt::set_handler(USER_VECTOR, on_user_int);
    idt::allow_user(3);
    let used = count_usr_os(&pmu);
    let v = user::run_user(user_ints, 0);
    check_eq!(v, 3u8, "INT n run: back from user mode through INT3's #BP");
    check_eq!(INTS_SEEN.load(SeqCst), INTS, "every INT n entered its handler from user mode");
    check_usr_os(used, INT_USER_INSNS, "INT n run", "the user instructions, each INT and the INT3 once");

    // Straight-line user runs ending in each kind of exception: exact USR/OS counts, then the same
    // run with PMC0 (USR, INT) overflowing at its 100th instruction, a NOP: the PMI interrupts user
    // mode right after it (zero skid), and the run still ends in its exception.
    let exits: [(&str, unsafe extern "C" fn(), u8, u64); 5] = [
        ("#GP", exit_gp, 13, RUN),
        ("#UD", exit_ud, 6, RUN),
        ("#DE", exit_de, 0, RUN + 3),
        ("#PF", exit_pf, 14, RUN),
        ("#BP", exit_bp, 3, RUN + 1),
    ];
    for (name, entry, vector, user_insns) in exits {
        let used = count_usr_os(&pmu);
        let v = user::run_user(entry, 0);
        check_eq!(v, vector, "{name} run: the exception brings it back");
        check_usr_os(used, user_insns, name, "the run's user instructions");
        PMIS.store(0, SeqCst);
        wrmsr(IA32_PERF_GLOBAL_OVF_CTRL, 1);
        apic::write(apic::LVT_PMC, APIC_PERFMON_VECTOR as u32);
        wrmsr(IA32_PMC0, (max - 99) & 0xFFFF_FFFF);
        wrmsr(IA32_PERFEVTSEL0, usr | PERFEVTSEL_INT);
        wrmsr(IA32_PERF_GLOBAL_CTRL, 1);
        emon_guest::cpu::enable_interrupts();
        let v = user::run_user(entry, 0);
        emon_guest::cpu::disable_interrupts();
        wrmsr(IA32_PERF_GLOBAL_CTRL, 0);
        wrmsr(IA32_PERFEVTSEL0, 0);
        check_eq!(v, vector, "{name} run with a PMI: the exception brings it back");
        check_eq!(PMIS.load(SeqCst), 1u64, "{name} run: one PMI");
        check_eq!(PMI_CS.load(SeqCst) & 3, 3u64, "{name} run: the PMI interrupted user mode");
        check_eq!(
            PMI_RIP.load(SeqCst),
            entry as *const () as u64 + 100,
            "{name} run: zero skid, the PMI comes right after the 100th NOP"
        );
    }
    // User code that single-steps itself (RFLAGS.TF): a #DB after each instruction and each REP
    // iteration, from user mode, with DR6.BS; USR counts the retired instructions exactly.
    idt::set_handler(1, on_db);
    let used = count_usr_os(&pmu);
    let v = user::run_user_traced(user_traced, 0);
    check_eq!(v, 13u8, "traced run: back from user mode through HLT's #GP (no trap after it)");
    check_eq!(DB_TRAPS.load(SeqCst), TRACED_TRAPS, "traced run: a #DB after each instruction and each REP iteration");
    check_eq!(DB_FROM_USER.load(SeqCst), TRACED_TRAPS, "traced run: every #DB from user mode (CS.RPL = 3)");
    check_eq!(DB_STEP_STATUS.load(SeqCst), TRACED_TRAPS, "traced run: every #DB with DR6.BS");
    check_eq!(
        DB_LAST_RIP.load(SeqCst),
        user_traced_end as *const () as u64,
        "traced run: the last trap after the REP's last iteration"
    );
    // SAFETY: user mode has finished with the buffer.
    let buf = unsafe { core::ptr::read_volatile(&raw const TRACED_BUF) };
    check_eq!(
        u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]),
        0x005A_5A5Au32,
        "traced run: REP STOSB stored its three bytes and no more"
    );
    check_usr_os(used, TRACED_INSNS, "traced run", "the run's retired user instructions, the REP once");

    // The guest's own breakpoints in user mode: each #DB where the CPU raises it, with DR6.Bn.
    idt::set_handler(1, on_bp);
    let addr = |p: *const Watched| p as u64;
    set_breakpoints(
        [
            user_bp_exec as *const () as u64,
            addr(&raw const BP_WORD),
            addr(&raw const BP_QUAD),
            addr(&raw const BP_BYTES) + 2,
        ],
        BP_DR7,
    );
    let used = count_usr_os(&pmu);
    let v = user::run_user(user_bp, 0);
    set_breakpoints([0; 4], 0x400);
    check_eq!(v, 13u8, "breakpoint run: back from user mode through HLT's #GP");
    check_eq!(BP_TRAPS.load(SeqCst), 4u64, "breakpoint run: four #DBs (the instruction breakpoint once)");
    let expected = [
        (user_bp_exec as *const () as u64, 0b0001, "before the instruction breakpoint's instruction (DR0)"),
        (user_bp_after_write as *const () as u64, 0b0010, "after the store to the write breakpoint (DR1)"),
        (user_bp_after_read as *const () as u64, 0b0100, "after the load in the read/write breakpoint (DR2)"),
        (user_bp_rep as *const () as u64, 0b1000, "after the REP STOSB iteration that wrote DR3's byte"),
    ];
    for (k, (rip, b, what)) in expected.into_iter().enumerate() {
        check_eq!(BP_SEEN[k][0].load(SeqCst), rip, "breakpoint #DB {k}: frame RIP {what}");
        check_eq!(BP_SEEN[k][1].load(SeqCst), b, "breakpoint #DB {k}: DR6.B0-B3 {what}");
    }
    check_eq!(BP_SEEN[3][2].load(SeqCst), 1u64, "breakpoint #DB 3: RCX 1, one iteration left");
    // SAFETY: user mode has finished with the bytes.
    let bytes = unsafe { core::ptr::read_volatile(&raw const BP_BYTES) };
    check_eq!(u64::from_le_bytes(bytes.0), 0x1111_1111u64, "breakpoint run: REP STOSB stored its four bytes");
    check_usr_os(used, BP_INSNS, "breakpoint run", "the run's retired user instructions, the REP once");

    let e = user::run_user_caught(user_int_kernel, 0);
    check_eq!(e.map_or(0xFF, |e| e.vector), 13u8, "INT to a DPL0 gate from user mode raises #GP");
    check_eq!(
        e.map_or(0, |e| e.error_code),
        u32::from(KERNEL_VECTOR) * 8 + 2,
        "its error code names the gate (vector * 8 + 2)"
    );
    emon_guest::summary()
}
