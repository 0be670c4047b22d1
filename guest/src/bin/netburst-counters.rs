//! The NetBurst PMU (Pentium 4, SDM 18.15/18.16): instr_retired, global_power_events, branch_retired and mispred_branch_retired counted exactly, the OS/USR filters, COMPARE/THRESHOLD/EDGE, the overflow PMI, FORCE_OVF, cascading and RDPMC.
//!
//! Every check expects an exact number from emon's precise backend (README, "The precise
//! backend" and "The NetBurst PMU"): one event per retired instruction, the cost model's cycles,
//! the static branch predictor. Counting starts after the WRMSR that enables a counter, and the
//! WRMSR that stops it is counted. The measured code shapes:
//!
//! - `foo(N)`: `call foo` (`mov r11d, N; 2: dec r11d; jnz 2b; ret`) and a 4-instruction stop
//!   sequence: 2N+7 instructions, 3N+108 cycles (call 2, ret 2, taken jnz 2, WRMSR 101).
//! - `measured_block(N)` (emon_guest::pmu): 2N+8 instructions, 3N+108 cycles, N+2 branches:
//!   MMNP 1 (forward jnz not taken), MMNM 1 (the loop's last jnz), MMTP N-1, MMTM 1 (forward jz
//!   taken); 2 mispredicted.
//! - `branchy(N)`, N a multiple of 4: `mov r11d, N; 2: test r11d, 3; jnz 3f; add rax, [rsi];
//!   3: imul eax, eax; dec r11d; jnz 2b; jmp 4f; nop; 4:` and the stop sequence. The forward jnz
//!   is taken (and mispredicted) 3N/4 times and falls through N/4 times; the loop's jnz is taken
//!   N-1 times and falls through (mispredicted) once; the jmp is taken. 6+5N+N/4 instructions,
//!   106+37N/4 cycles (add with a memory operand 2, imul 3), 2N+1 branches: MMNP N/4, MMNM 1,
//!   MMTP N, MMTM 3N/4; 3N/4+1 mispredicted. Instructions costing more than 1 cycle: 3N+1 (more
//!   than 2: N+1, the imuls and the WRMSR; more than 3: the WRMSR); rising edges of "more than 1
//!   cycle": 2N+1.
//!
//! CPL3 code runs in the TCG engine (see guest:user-mode); `user=0` on the command line skips the
//! user-mode part (single-stepping cannot count CPL3 code on some hosts).
#![no_std]
#![no_main]

use core::arch::{asm, global_asm};
use core::sync::atomic::{AtomicU64, Ordering::SeqCst};
use emon_guest::cpu::{rdmsr, rdpmc, wrmsr};
use emon_guest::netburst::*;
use emon_guest::pmu::{measured_block, APIC_PERFMON_VECTOR};
use emon_guest::user::{make_user_accessible, run_user};
use emon_guest::{apic, catch, check, check_eq, dec, idt, println, skip};

emon_guest::entry!(main);

const MASK: u64 = COUNTER_MASK;
const IQ_COUNTER3: u32 = 15;
const IQ_COUNTER5: u32 = 17;
/// CCCR active thread field (bits 17:16).
const ACTIVE_THREAD_SHIFT: u32 = 16;

fn counter(i: u32) -> u32 {
    MSR_BPU_COUNTER0 + i
}
fn cccr_msr(i: u32) -> u32 {
    MSR_BPU_CCCR0 + i
}

/// instr_retired NBOGUSNTAG.
fn instr(os: bool, usr: bool) -> u64 {
    escr(EVENT_INSTR_RETIRED, INSTR_RETIRED_NBOGUSNTAG, os, usr)
}
/// global_power_events RUNNING.
fn power(os: bool, usr: bool) -> u64 {
    escr(EVENT_GLOBAL_POWER_EVENTS, GLOBAL_POWER_RUNNING, os, usr)
}

/// Every CCCR, counter and the ESCRs used here back to 0.
fn reset() {
    for i in 0..COUNTERS {
        wrmsr(cccr_msr(i), 0);
        wrmsr(counter(i), 0);
    }
    for e in [MSR_FSB_ESCR0, MSR_FSB_ESCR1, MSR_CRU_ESCR0, MSR_CRU_ESCR1, MSR_CRU_ESCR2, MSR_CRU_ESCR3] {
        wrmsr(e, 0);
    }
}

/// A measured code shape.
#[derive(Clone, Copy)]
enum Block {
    Foo(u32),
    Measured(u32),
    Branchy(u32),
}

static MEMORY: AtomicU64 = AtomicU64::new(1);

impl Block {
    /// Runs the block: WRMSR(`start`) (not counted), the code, then a 4-instruction stop
    /// sequence ending in WRMSR(`stop`) (counted).
    fn run(self, start: (u32, u64), stop: (u32, u64)) {
        match self {
            Block::Foo(n) => foo(n, start, stop),
            Block::Measured(n) => {
                measured_block(n, start.0, start.1, stop.0, stop.1);
            }
            Block::Branchy(n) => branchy(n, start, stop),
        }
    }

    fn insns(self) -> u64 {
        match self {
            Block::Foo(n) => 2 * n as u64 + 7,
            Block::Measured(n) => 2 * n as u64 + 8,
            Block::Branchy(n) => 6 + 5 * n as u64 + n as u64 / 4,
        }
    }

    fn cycles(self) -> u64 {
        match self {
            Block::Foo(n) | Block::Measured(n) => 3 * n as u64 + 108,
            Block::Branchy(n) => 106 + 37 * n as u64 / 4,
        }
    }

    fn name(self) -> (&'static str, u64) {
        match self {
            Block::Foo(n) => ("foo", n as u64),
            Block::Measured(n) => ("measured_block", n as u64),
            Block::Branchy(n) => ("branchy", n as u64),
        }
    }
}

fn foo(n: u32, start: (u32, u64), stop: (u32, u64)) {
    // SAFETY: writes two PMU MSRs; every register the block touches is declared.
    unsafe {
        asm!(
            "wrmsr",          // start: counting begins after this instruction
            "call 2f",
            "mov ecx, r8d",   // the stop sequence (counted)
            "mov eax, r9d",
            "mov edx, r10d",
            "wrmsr",
            "jmp 3f",
            "2:",
            "mov r11d, {n:e}",
            "4:",
            "dec r11d",
            "jnz 4b",
            "ret",
            "3:",
            n = in(reg) n,
            inout("ecx") start.0 => _,
            inout("eax") start.1 as u32 => _,
            inout("edx") (start.1 >> 32) as u32 => _,
            in("r8") stop.0,
            in("r9") stop.1 as u32,
            in("r10") (stop.1 >> 32) as u32,
            out("r11") _,
        );
    }
}

fn branchy(n: u32, start: (u32, u64), stop: (u32, u64)) {
    // SAFETY: as for foo; RSI points at a static.
    unsafe {
        asm!(
            "wrmsr",          // start
            "mov r11d, {n:e}",
            "2:",
            "test r11d, 3",
            "jnz 3f",         // forward: taken (mispredicted) unless r11d % 4 == 0
            "add rax, [rsi]", // 2 cycles
            "3:",
            "imul eax, eax",  // 3 cycles
            "dec r11d",
            "jnz 2b",         // backward: taken N-1 times, falls through (mispredicted) once
            "jmp 4f",
            "nop",
            "4:",
            "mov ecx, r8d",   // the stop sequence (counted)
            "mov eax, r9d",
            "mov edx, r10d",
            "wrmsr",
            n = in(reg) n,
            in("rsi") MEMORY.as_ptr(),
            inout("ecx") start.0 => _,
            inout("eax") start.1 as u32 => _,
            inout("edx") (start.1 >> 32) as u32 => _,
            in("r8") stop.0,
            in("r9") stop.1 as u32,
            in("r10") (stop.1 >> 32) as u32,
            out("r11") _,
            options(nostack),
        );
    }
}

/// Programs counter `i` with `escr_val` in `escr_msr` and CCCR `cccr_val`, runs `b` started by
/// the CCCR write and stopped by a CCCR write of 0; returns the count.
fn count(i: u32, escr_msr: u32, escr_val: u64, cccr_val: u64, b: Block) -> u64 {
    wrmsr(cccr_msr(i), 0);
    wrmsr(escr_msr, escr_val);
    wrmsr(counter(i), 0);
    b.run((cccr_msr(i), cccr_val), (cccr_msr(i), 0));
    let v = rdmsr(counter(i));
    wrmsr(escr_msr, 0);
    v
}

/// 10 nops after WRMSR(`start`), then two 4-instruction stop sequences, WRMSR(`stop1`) and
/// WRMSR(`stop2`, 0).
fn nops(start: (u32, u64), stop1: (u32, u64), stop2: u32) {
    // SAFETY: writes PMU MSRs; the clobbered registers are declared.
    unsafe {
        asm!(
            "wrmsr",
            "nop", "nop", "nop", "nop", "nop", "nop", "nop", "nop", "nop", "nop",
            "mov ecx, r8d",
            "mov eax, r9d",
            "mov edx, r10d",
            "wrmsr",
            "mov ecx, r11d",
            "xor eax, eax",
            "xor edx, edx",
            "wrmsr",
            inout("ecx") start.0 => _,
            inout("eax") start.1 as u32 => _,
            inout("edx") (start.1 >> 32) as u32 => _,
            in("r8") stop1.0,
            in("r9") stop1.1 as u32,
            in("r10") (stop1.1 >> 32) as u32,
            in("r11") stop2,
            options(nostack),
        );
    }
}

fn basic_counting() {
    println!("-- instr_retired on MSR_IQ_COUNTER0 through MSR_CRU_ESCR0");
    let iq0 = cccr(CRU_ESCR01_SELECT);
    for n in [1u32, 2, 100, 1000] {
        let b = Block::Foo(n);
        let got = count(IQ_COUNTER0, MSR_CRU_ESCR0, instr(true, true), iq0, b);
        println!("foo(N={}): MSR_IQ_COUNTER0 = {}", dec(n as u64), dec(got));
        check_eq!(
            got,
            b.insns(),
            "instr_retired counts call + foo(N={}) + the 4 stopping instructions: {}",
            dec(n as u64),
            dec(b.insns())
        );
    }
    let b = Block::Foo(100);
    check_eq!(
        count(IQ_COUNTER2, MSR_CRU_ESCR1, instr(true, true), cccr(CRU_ESCR01_SELECT), b),
        b.insns(),
        "instr_retired on MSR_IQ_COUNTER2 through MSR_CRU_ESCR1: {}",
        dec(b.insns())
    );
    check_eq!(
        count(IQ_COUNTER4, MSR_CRU_ESCR0, instr(true, true), cccr(CRU_ESCR01_SELECT), b),
        b.insns(),
        "instr_retired on MSR_IQ_COUNTER4 through MSR_CRU_ESCR0: {}",
        dec(b.insns())
    );
    for b in [Block::Measured(50), Block::Branchy(100)] {
        let (name, n) = b.name();
        check_eq!(
            count(IQ_COUNTER0, MSR_CRU_ESCR0, instr(true, true), iq0, b),
            b.insns(),
            "instr_retired counts {}(N={}): {}",
            name,
            dec(n),
            dec(b.insns())
        );
    }
    let first = count(IQ_COUNTER0, MSR_CRU_ESCR0, instr(true, true), iq0, Block::Foo(500));
    check_eq!(
        count(IQ_COUNTER0, MSR_CRU_ESCR0, instr(true, true), iq0, Block::Foo(500)),
        first,
        "the same function counts the same twice: {}",
        dec(first)
    );

    // What counts nothing.
    let tagged = escr(EVENT_INSTR_RETIRED, INSTR_RETIRED_NBOGUSTAG, true, true);
    check_eq!(
        count(IQ_COUNTER0, MSR_CRU_ESCR0, tagged, iq0, b),
        0u64,
        "instr_retired NBOGUSTAG alone counts 0 (emon tags no µops)"
    );
    check_eq!(
        count(IQ_COUNTER0, MSR_CRU_ESCR0, escr(EVENT_INSTR_RETIRED, 0b1110, true, true), iq0, b),
        0u64,
        "instr_retired NBOGUSTAG|BOGUSNTAG|BOGUSTAG counts 0 (no wrong path)"
    );
    check_eq!(
        count(IQ_COUNTER0, MSR_CRU_ESCR0, instr(true, true), iq0 & !CCCR_ENABLE, b),
        0u64,
        "CCCR.ENABLE clear: counts 0"
    );
    let thread = |t: u64| iq0 & !CCCR_ACTIVE_THREAD_ANY | t << ACTIVE_THREAD_SHIFT;
    for (t, want, what) in
        [(0b00u64, 0, "none"), (0b01, b.insns(), "single"), (0b10, 0, "both"), (0b11, b.insns(), "any")]
    {
        check_eq!(
            count(IQ_COUNTER0, MSR_CRU_ESCR0, instr(true, true), thread(t), b),
            want,
            "active thread {:02b}B ({}) with one logical processor: {}",
            t,
            what,
            dec(want)
        );
    }
}

fn cycles() {
    println!("-- global_power_events on MSR_BPU_COUNTER0 through MSR_FSB_ESCR0");
    let bpu = cccr(FSB_ESCR_SELECT);
    for b in [Block::Foo(1), Block::Foo(100), Block::Measured(50), Block::Branchy(100)] {
        let (name, n) = b.name();
        let got = count(BPU_COUNTER0, MSR_FSB_ESCR0, power(true, true), bpu, b);
        check_eq!(got, b.cycles(), "global_power_events counts {}(N={}): {} cycles", name, dec(n), dec(b.cycles()));
    }
    let b = Block::Measured(50);
    check_eq!(
        count(BPU_COUNTER2, MSR_FSB_ESCR1, power(true, true), bpu, b),
        b.cycles(),
        "global_power_events on MSR_BPU_COUNTER2 through MSR_FSB_ESCR1: {}",
        dec(b.cycles())
    );
    check_eq!(
        count(BPU_COUNTER0, MSR_FSB_ESCR0, escr(EVENT_GLOBAL_POWER_EVENTS, 0, true, true), bpu, b),
        0u64,
        "global_power_events without RUNNING counts 0"
    );
}

fn filters() {
    println!("-- T0_OS / T0_USR at CPL0");
    let iq0 = cccr(CRU_ESCR01_SELECT);
    let b = Block::Foo(100);
    check_eq!(
        count(IQ_COUNTER0, MSR_CRU_ESCR0, instr(true, false), iq0, b),
        b.insns(),
        "T0_OS alone counts CPL0 instructions: {}",
        dec(b.insns())
    );
    check_eq!(
        count(IQ_COUNTER0, MSR_CRU_ESCR0, instr(false, true), iq0, b),
        0u64,
        "T0_USR alone counts nothing at CPL0"
    );
    let t1 = instr(false, false) | ESCR_T1_OS | ESCR_T1_USR;
    check_eq!(count(IQ_COUNTER0, MSR_CRU_ESCR0, t1, iq0, b), 0u64, "T1_OS|T1_USR (T0 bits clear) count nothing");
    let bpu = cccr(FSB_ESCR_SELECT);
    check_eq!(
        count(BPU_COUNTER0, MSR_FSB_ESCR0, power(true, false), bpu, b),
        b.cycles(),
        "global_power_events T0_OS alone: {} cycles",
        dec(b.cycles())
    );
    check_eq!(
        count(BPU_COUNTER0, MSR_FSB_ESCR0, power(false, true), bpu, b),
        0u64,
        "global_power_events T0_USR alone at CPL0: 0"
    );
}

fn branches() {
    println!("-- branch_retired through MSR_CRU_ESCR2/3, mispred_branch_retired through MSR_CRU_ESCR0/1");
    const N: u32 = 100;
    let b = Block::Branchy(N);
    let n = N as u64;
    let classes = [
        ("MMNP", BRANCH_RETIRED_MMNP, n / 4),
        ("MMNM", BRANCH_RETIRED_MMNM, 1),
        ("MMTP", BRANCH_RETIRED_MMTP, n),
        ("MMTM", BRANCH_RETIRED_MMTM, 3 * n / 4),
        ("MMTP|MMTM", BRANCH_RETIRED_MMTP | BRANCH_RETIRED_MMTM, n + 3 * n / 4),
        ("MMNM|MMTM", BRANCH_RETIRED_MMNM | BRANCH_RETIRED_MMTM, 1 + 3 * n / 4),
        ("all four", 0xF, 2 * n + 1),
    ];
    let iq = cccr(CRU_ESCR23_SELECT);
    for (name, mask, want) in classes {
        check_eq!(
            count(IQ_COUNTER0, MSR_CRU_ESCR2, escr(EVENT_BRANCH_RETIRED, mask, true, true), iq, b),
            want,
            "branch_retired {} on branchy(N={}): {}",
            name,
            dec(n),
            dec(want)
        );
    }
    check_eq!(
        count(IQ_COUNTER3, MSR_CRU_ESCR3, escr(EVENT_BRANCH_RETIRED, 0xF, true, true), iq, b),
        2 * n + 1,
        "branch_retired (all classes) on MSR_IQ_COUNTER3 through MSR_CRU_ESCR3: {}",
        dec(2 * n + 1)
    );
    let m = Block::Measured(50);
    for (name, mask, want) in
        [("MMNP", 1u64, 1u64), ("MMNM", 2, 1), ("MMTP", 4, 49), ("MMTM", 8, 1), ("all four", 0xF, 52)]
    {
        check_eq!(
            count(IQ_COUNTER5, MSR_CRU_ESCR3, escr(EVENT_BRANCH_RETIRED, mask, true, true), iq, m),
            want,
            "branch_retired {} on measured_block(N=50) (MSR_IQ_COUNTER5): {}",
            name,
            dec(want)
        );
    }
    check_eq!(
        count(IQ_COUNTER0, MSR_CRU_ESCR2, escr(EVENT_BRANCH_RETIRED, 0xF, false, true), iq, b),
        0u64,
        "branch_retired T0_USR alone at CPL0: 0"
    );
    let mispred = escr(EVENT_MISPRED_BRANCH_RETIRED, 1, true, true);
    let iq0 = cccr(CRU_ESCR01_SELECT);
    check_eq!(
        count(IQ_COUNTER0, MSR_CRU_ESCR0, mispred, iq0, b),
        3 * n / 4 + 1,
        "mispred_branch_retired on branchy(N={}): {}",
        dec(n),
        dec(3 * n / 4 + 1)
    );
    check_eq!(
        count(IQ_COUNTER2, MSR_CRU_ESCR1, mispred, iq0, m),
        2u64,
        "mispred_branch_retired on measured_block(N=50) through MSR_CRU_ESCR1: 2"
    );
    check_eq!(
        count(IQ_COUNTER0, MSR_CRU_ESCR0, escr(EVENT_MISPRED_BRANCH_RETIRED, 0, true, true), iq0, b),
        0u64,
        "mispred_branch_retired without NBOGUS counts 0"
    );
}

fn compare() {
    println!("-- CCCR COMPARE / COMPLEMENT / THRESHOLD / EDGE");
    const N: u32 = 100;
    let b = Block::Branchy(N);
    let n = N as u64;
    let bpu = cccr(FSB_ESCR_SELECT);
    let cmp = |t: u64| bpu | CCCR_COMPARE | t << CCCR_THRESHOLD_SHIFT;
    let cases = [
        ("cycles > 1", cmp(1), 3 * n + 1),
        ("cycles > 2", cmp(2), n + 1),
        ("cycles > 3", cmp(3), 1),
        ("cycles > 15", cmp(15), 1),
        ("cycles > 0", cmp(0), b.insns()),
        ("cycles <= 1 (COMPLEMENT)", cmp(1) | CCCR_COMPLEMENT, b.insns() - (3 * n + 1)),
        ("cycles <= 15 (COMPLEMENT)", cmp(15) | CCCR_COMPLEMENT, b.insns() - 1),
        ("cycles <= 0 (COMPLEMENT)", cmp(0) | CCCR_COMPLEMENT, 0),
        ("rising edges of cycles > 1 (EDGE)", cmp(1) | CCCR_EDGE, 2 * n + 1),
        ("rising edges of cycles > 2 (EDGE)", cmp(2) | CCCR_EDGE, n + 1),
        ("EDGE without COMPARE is ignored", bpu | CCCR_EDGE | 1 << CCCR_THRESHOLD_SHIFT, b.cycles()),
    ];
    for (name, c, want) in cases {
        check_eq!(
            count(BPU_COUNTER0, MSR_FSB_ESCR0, power(true, true), c, b),
            want,
            "global_power_events, {}, on branchy(N={}): {}",
            name,
            dec(n),
            dec(want)
        );
    }
    let iq0 = cccr(CRU_ESCR01_SELECT);
    let icmp = |t: u64| iq0 | CCCR_COMPARE | t << CCCR_THRESHOLD_SHIFT;
    check_eq!(
        count(IQ_COUNTER0, MSR_CRU_ESCR0, instr(true, true), icmp(0), b),
        b.insns(),
        "instr_retired > 0 per instruction: every instruction, {}",
        dec(b.insns())
    );
    check_eq!(
        count(IQ_COUNTER0, MSR_CRU_ESCR0, instr(true, true), icmp(1), b),
        0u64,
        "instr_retired > 1 per instruction: 0"
    );
}

fn rdpmc_checks() {
    println!("-- RDPMC");
    const V: u64 = 0xAB_1234_5678;
    wrmsr(cccr_msr(IQ_COUNTER0), 0);
    wrmsr(counter(IQ_COUNTER0), V);
    check_eq!(rdmsr(counter(IQ_COUNTER0)), V, "MSR_IQ_COUNTER0 holds the 40-bit value {:#x}", V);
    check_eq!(rdpmc(IQ_COUNTER0), V, "RDPMC(12) of the stopped counter reads {:#x}", V);
    let (lo, hi): (u32, u32);
    // SAFETY: RDPMC of an existing counter at CPL0.
    unsafe { asm!("rdpmc", in("ecx") IQ_COUNTER0 | 1 << 31, out("eax") lo, out("edx") hi, options(nostack)) };
    check_eq!(lo, V as u32, "fast RDPMC(12 | 1<<31): EAX = the low 32 bits, {:#x}", V as u32);
    check_eq!(hi, 0u32, "fast RDPMC: EDX = 0");
    wrmsr(counter(IQ_COUNTER0), MASK);
    check_eq!(rdpmc(IQ_COUNTER0), MASK, "RDPMC(12) reads 2^40-1 after a write of all ones");
    wrmsr(counter(BPU_COUNTER0), 0x12_3456_789A);
    check_eq!(rdpmc(BPU_COUNTER0), 0x12_3456_789Au64, "RDPMC(0) reads MSR_BPU_COUNTER0");
    wrmsr(counter(IQ_COUNTER5), 0xFF_FFFF_FFFF_FFFF);
    check_eq!(rdpmc(IQ_COUNTER5), MASK, "RDPMC(17) reads MSR_IQ_COUNTER5 (bits 63:40 of the write dropped)");
    for ecx in [18u32, 18 | 1 << 31, 1 << 30] {
        let e = catch(|| {
            rdpmc(ecx);
        });
        check!(e.is_some_and(|e| e.is_gp()), "RDPMC({:#x}) raises #GP", ecx);
    }
    let b = Block::Foo(100);
    let got = count(IQ_COUNTER0, MSR_CRU_ESCR0, instr(true, true), cccr(CRU_ESCR01_SELECT), b);
    check_eq!(rdpmc(IQ_COUNTER0), got, "RDPMC after counting reads the count, {}", dec(b.insns()));
    check_eq!(rdpmc(IQ_COUNTER0 | 1 << 31), b.insns(), "fast RDPMC after counting: {}", dec(b.insns()));
    for i in [IQ_COUNTER0, BPU_COUNTER0, IQ_COUNTER5] {
        wrmsr(counter(i), 0);
    }
}

// ---- The overflow PMI ----

static PMIS: AtomicU64 = AtomicU64::new(0);
static PMI_RIP: AtomicU64 = AtomicU64::new(0);
static PMI_LVTPC: AtomicU64 = AtomicU64::new(0);
static PMI_CCCR: AtomicU64 = AtomicU64::new(0);
/// Instructions the handler retires up to and including the WRMSR that stops MSR_IQ_COUNTER0.
const HANDLER_COUNTED: u64 = 9;

// The PMI handler, a raw gate so that its counted instructions are known: it reads
// MSR_IQ_CCCR0 (OVF), stops the counter (HANDLER_COUNTED instructions from its entry), records the
// interrupted RIP and LVTPC, and sends EOI. It leaves LVTPC as delivery left it.
global_asm!(
    ".global nb_pmi_handler",
    "nb_pmi_handler:",
    "push rax",
    "push rcx",
    "push rdx",
    "mov ecx, 0x36C",
    "rdmsr",
    "mov [rip + {cccr}], eax",
    "xor eax, eax",
    "xor edx, edx",
    "wrmsr", // MSR_IQ_CCCR0 = 0: the counter stops (this WRMSR counted)
    "mov rax, [rsp + 24]",
    "mov [rip + {rip}], rax",
    "mov rax, 0xFEE00340",
    "mov eax, [rax]",
    "mov [rip + {lvtpc}], rax",
    "mov rax, 0xFEE000B0",
    "mov dword ptr [rax], 0",
    "inc qword ptr [rip + {pmis}]",
    "pop rdx",
    "pop rcx",
    "pop rax",
    "iretq",
    cccr = sym PMI_CCCR,
    rip = sym PMI_RIP,
    lvtpc = sym PMI_LVTPC,
    pmis = sym PMIS,
);

extern "C" {
    fn nb_pmi_handler();
}

/// WRMSR(`start`), then 6 nops; returns the address after each of the first 5.
fn start_and_nops(start: (u32, u64)) -> [u64; 5] {
    let (a1, a2, a3, a4, a5): (u64, u64, u64, u64, u64);
    // SAFETY: writes one PMU MSR; the clobbered registers are declared.
    unsafe {
        asm!(
            "lea {a1}, [rip + 21f]",
            "lea {a2}, [rip + 22f]",
            "lea {a3}, [rip + 23f]",
            "lea {a4}, [rip + 24f]",
            "lea {a5}, [rip + 25f]",
            "wrmsr",
            "nop", "21:",
            "nop", "22:",
            "nop", "23:",
            "nop", "24:",
            "nop", "25:",
            "nop",
            a1 = out(reg) a1, a2 = out(reg) a2, a3 = out(reg) a3, a4 = out(reg) a4, a5 = out(reg) a5,
            in("ecx") start.0,
            in("eax") start.1 as u32,
            in("edx") (start.1 >> 32) as u32,
        );
    }
    [a1, a2, a3, a4, a5]
}

/// Counter 12 (instr_retired, OS) starts at `initial` with CCCR `extra` bits; the first `k`
/// counted instructions bring its overflow (the k-th wraps it, or with FORCE_OVF k = 1). With
/// OVF_PMI_T0 the PMI must come after the next counted instruction, the (k+1)-th nop.
fn pmi_case(name: &str, initial: u64, extra: u64, k: usize) {
    PMIS.store(0, SeqCst);
    PMI_RIP.store(0, SeqCst);
    PMI_CCCR.store(0, SeqCst);
    PMI_LVTPC.store(0, SeqCst);
    apic::write(apic::LVT_PMC, APIC_PERFMON_VECTOR as u32);
    wrmsr(MSR_CRU_ESCR0, instr(true, false));
    wrmsr(counter(IQ_COUNTER0), initial);
    let after = start_and_nops((cccr_msr(IQ_COUNTER0), cccr(CRU_ESCR01_SELECT) | CCCR_OVF_PMI_T0 | extra));
    wrmsr(cccr_msr(IQ_COUNTER0), 0); // in case no PMI stopped it
    check_eq!(PMIS.load(SeqCst), 1u64, "{}: one PMI", name);
    check_eq!(
        PMI_RIP.load(SeqCst),
        after[k],
        "{}: the PMI came after the counted instruction following the overflowing one (nop {} of 6)",
        name,
        k + 1
    );
    check!(PMI_CCCR.load(SeqCst) & CCCR_OVF != 0, "{}: CCCR.OVF set in the handler", name);
    check!(PMI_LVTPC.load(SeqCst) & apic::LVT_MASKED as u64 != 0, "{}: LVTPC masked on entry to the handler", name);
    check!(apic::read(apic::LVT_PMC) & apic::LVT_MASKED != 0, "{}: LVTPC stays masked after the handler", name);
    // The counter counted k+1 nops and the handler's first HANDLER_COUNTED instructions.
    let want = (initial + k as u64 + 1 + HANDLER_COUNTED) & MASK;
    check_eq!(rdmsr(counter(IQ_COUNTER0)), want, "{}: the counter stopped by the handler holds {}", name, dec(want));
    check_eq!(rdmsr(cccr_msr(IQ_COUNTER0)) & CCCR_OVF, 0u64, "{}: the handler's CCCR write cleared OVF", name);
    wrmsr(MSR_CRU_ESCR0, 0);
}

/// instr_retired at no privilege level: an ESCR value that stops its counters.
const OFF: u64 = escr(EVENT_INSTR_RETIRED, INSTR_RETIRED_NBOGUSNTAG, false, false);

fn overflow() {
    println!("-- overflow: CCCR.OVF, OVF_PMI_T0 through LVTPC, FORCE_OVF");
    idt::set_raw_gate(APIC_PERFMON_VECTOR, nb_pmi_handler as *const () as u64);
    apic::enable();
    emon_guest::cpu::enable_interrupts();

    pmi_case("wrap at the 1st instruction (counter = 2^40-1)", MASK, 0, 1);
    pmi_case("wrap at the 3rd instruction (counter = 2^40-3)", MASK - 2, 0, 3);
    pmi_case("FORCE_OVF from 0", 0, CCCR_FORCE_OVF, 1);
    pmi_case("FORCE_OVF from 2^40-1", MASK, CCCR_FORCE_OVF, 1);

    // LVTPC masked: nothing is delivered, OVF sets and the counter wraps and counts on.
    let b = Block::Measured(10);
    let iq0 = cccr(CRU_ESCR01_SELECT);
    PMIS.store(0, SeqCst);
    apic::write(apic::LVT_PMC, apic::LVT_MASKED | APIC_PERFMON_VECTOR as u32);
    wrmsr(MSR_CRU_ESCR0, instr(true, false));
    wrmsr(counter(IQ_COUNTER0), MASK - 4);
    // Stopped through the ESCR (instr_retired with T0_OS and T0_USR clear), so that the CCCR keeps
    // OVF.
    b.run((cccr_msr(IQ_COUNTER0), iq0 | CCCR_OVF_PMI_T0), (MSR_CRU_ESCR0, OFF));
    check_eq!(PMIS.load(SeqCst), 0u64, "LVTPC masked: no PMI");
    check!(rdmsr(cccr_msr(IQ_COUNTER0)) & CCCR_OVF != 0, "LVTPC masked: CCCR.OVF set");
    let want = b.insns() - 5;
    check_eq!(
        rdmsr(counter(IQ_COUNTER0)),
        want,
        "LVTPC masked: the counter wrapped at the 5th instruction and holds {}",
        dec(want)
    );
    wrmsr(cccr_msr(IQ_COUNTER0), iq0 & !CCCR_ENABLE | CCCR_OVF_PMI_T0);
    wrmsr(counter(IQ_COUNTER0), 0);
    apic::write(apic::LVT_PMC, APIC_PERFMON_VECTOR as u32);
    check_eq!(PMIS.load(SeqCst), 0u64, "LVTPC unmasked afterwards: the masked PMI is not delivered late");
    check!(rdmsr(cccr_msr(IQ_COUNTER0)) & CCCR_OVF == 0, "a CCCR write without OVF clears it");

    // An overflow without OVF_PMI_T0: OVF sets, no PMI.
    wrmsr(MSR_CRU_ESCR0, instr(true, false));
    wrmsr(counter(IQ_COUNTER0), MASK);
    b.run((cccr_msr(IQ_COUNTER0), iq0), (MSR_CRU_ESCR0, OFF));
    check_eq!(PMIS.load(SeqCst), 0u64, "overflow without OVF_PMI_T0: no PMI");
    check!(rdmsr(cccr_msr(IQ_COUNTER0)) & CCCR_OVF != 0, "overflow without OVF_PMI_T0: CCCR.OVF set");
    check_eq!(
        rdmsr(counter(IQ_COUNTER0)),
        b.insns() - 1,
        "overflow without OVF_PMI_T0: the counter holds {}",
        dec(b.insns() - 1)
    );
    // OVF is sticky: counting on without a wrap keeps it.
    wrmsr(MSR_CRU_ESCR0, instr(true, false));
    b.run((counter(IQ_COUNTER0), 0), (MSR_CRU_ESCR0, OFF));
    check!(rdmsr(cccr_msr(IQ_COUNTER0)) & CCCR_OVF != 0, "CCCR.OVF is sticky across counting without a wrap");
    check_eq!(rdmsr(counter(IQ_COUNTER0)), b.insns(), "and the counter counted {}", dec(b.insns()));

    // FORCE_OVF without OVF_PMI_T0: OVF on the first increment, the count itself is normal.
    wrmsr(cccr_msr(IQ_COUNTER0), 0);
    wrmsr(counter(IQ_COUNTER0), 0);
    wrmsr(MSR_CRU_ESCR0, instr(true, false));
    b.run((cccr_msr(IQ_COUNTER0), iq0 | CCCR_FORCE_OVF), (MSR_CRU_ESCR0, OFF));
    check_eq!(PMIS.load(SeqCst), 0u64, "FORCE_OVF without OVF_PMI_T0: no PMI");
    check!(rdmsr(cccr_msr(IQ_COUNTER0)) & CCCR_OVF != 0, "FORCE_OVF: CCCR.OVF set");
    check_eq!(rdmsr(counter(IQ_COUNTER0)), b.insns(), "FORCE_OVF: the counter counts normally, {}", dec(b.insns()));
    wrmsr(cccr_msr(IQ_COUNTER0), 0);
    wrmsr(counter(IQ_COUNTER0), 0);

    emon_guest::cpu::disable_interrupts();
    idt::set_default_gate(APIC_PERFMON_VECTOR);
}

fn cascade() {
    println!("-- CASCADE");
    let iq = cccr(CRU_ESCR01_SELECT);
    let casc = iq | CCCR_CASCADE;
    let setup = |first: u32, first_escr: u32, second: u32, second_escr: u32, initial: u64| {
        reset();
        wrmsr(first_escr, instr(true, true));
        wrmsr(second_escr, instr(true, true));
        wrmsr(counter(first), initial);
        wrmsr(cccr_msr(second), casc);
    };
    // 12 overflows at the 3rd nop: 14 counts nops 4-10 and its 4 stopping instructions.
    setup(IQ_COUNTER0, MSR_CRU_ESCR0, IQ_COUNTER2, MSR_CRU_ESCR1, MASK - 2);
    nops((cccr_msr(IQ_COUNTER0), iq), (cccr_msr(IQ_COUNTER2), 0), cccr_msr(IQ_COUNTER0));
    check_eq!(
        rdmsr(counter(IQ_COUNTER2)),
        11u64,
        "MSR_IQ_COUNTER2 cascaded from IQ_COUNTER0 counts after its overflow: 11"
    );
    check_eq!(rdmsr(counter(IQ_COUNTER0)), 15u64, "MSR_IQ_COUNTER0 wrapped and counted on: 15");

    // No overflow: the cascaded counter never starts.
    setup(IQ_COUNTER0, MSR_CRU_ESCR0, IQ_COUNTER2, MSR_CRU_ESCR1, 0);
    nops((cccr_msr(IQ_COUNTER0), iq), (cccr_msr(IQ_COUNTER2), 0), cccr_msr(IQ_COUNTER0));
    check_eq!(rdmsr(counter(IQ_COUNTER2)), 0u64, "no overflow of IQ_COUNTER0: cascaded IQ_COUNTER2 counts 0");
    check_eq!(rdmsr(counter(IQ_COUNTER0)), 18u64, "IQ_COUNTER0 counted 18");

    // The other way: 14 overflows, 12 (CASCADE) starts.
    setup(IQ_COUNTER2, MSR_CRU_ESCR1, IQ_COUNTER0, MSR_CRU_ESCR0, MASK - 2);
    nops((cccr_msr(IQ_COUNTER2), iq), (cccr_msr(IQ_COUNTER0), 0), cccr_msr(IQ_COUNTER2));
    check_eq!(rdmsr(counter(IQ_COUNTER0)), 11u64, "MSR_IQ_COUNTER0 cascaded from IQ_COUNTER2: 11");

    // 16 cascades only from 14, not from 12.
    setup(IQ_COUNTER0, MSR_CRU_ESCR0, IQ_COUNTER4, MSR_CRU_ESCR0, MASK - 2);
    nops((cccr_msr(IQ_COUNTER0), iq), (cccr_msr(IQ_COUNTER4), 0), cccr_msr(IQ_COUNTER0));
    check_eq!(rdmsr(counter(IQ_COUNTER4)), 0u64, "IQ_COUNTER4 does not cascade from IQ_COUNTER0's overflow: 0");
    setup(IQ_COUNTER2, MSR_CRU_ESCR1, IQ_COUNTER4, MSR_CRU_ESCR0, MASK - 2);
    nops((cccr_msr(IQ_COUNTER2), iq), (cccr_msr(IQ_COUNTER4), 0), cccr_msr(IQ_COUNTER2));
    check_eq!(rdmsr(counter(IQ_COUNTER4)), 11u64, "IQ_COUNTER4 cascades from IQ_COUNTER2's overflow: 11");

    // A CCCR write re-arms: 14 started, its CCCR rewritten (same value), then 12 counts without
    // overflowing: 14 waits again.
    setup(IQ_COUNTER0, MSR_CRU_ESCR0, IQ_COUNTER2, MSR_CRU_ESCR1, MASK - 2);
    nops((cccr_msr(IQ_COUNTER0), iq), (cccr_msr(IQ_COUNTER2), casc), cccr_msr(IQ_COUNTER0));
    check_eq!(rdmsr(counter(IQ_COUNTER2)), 11u64, "re-arm: IQ_COUNTER2 started by the overflow counted 11");
    wrmsr(counter(IQ_COUNTER0), 0);
    nops((cccr_msr(IQ_COUNTER0), iq), (cccr_msr(IQ_COUNTER2), 0), cccr_msr(IQ_COUNTER0));
    check_eq!(
        rdmsr(counter(IQ_COUNTER2)),
        11u64,
        "re-arm: after its CCCR was rewritten, IQ_COUNTER2 waits again (still 11)"
    );

    // The same with a CCCR write that changes the value (active thread 11B -> 01B).
    setup(IQ_COUNTER0, MSR_CRU_ESCR0, IQ_COUNTER2, MSR_CRU_ESCR1, MASK - 2);
    let single = casc & !CCCR_ACTIVE_THREAD_ANY | 1 << ACTIVE_THREAD_SHIFT;
    nops((cccr_msr(IQ_COUNTER0), iq), (cccr_msr(IQ_COUNTER2), single), cccr_msr(IQ_COUNTER0));
    check_eq!(rdmsr(counter(IQ_COUNTER2)), 11u64, "re-arm (new CCCR value): IQ_COUNTER2 counted 11");
    wrmsr(counter(IQ_COUNTER0), 0);
    nops((cccr_msr(IQ_COUNTER0), iq), (cccr_msr(IQ_COUNTER2), 0), cccr_msr(IQ_COUNTER0));
    check_eq!(rdmsr(counter(IQ_COUNTER2)), 11u64, "re-arm (new CCCR value): IQ_COUNTER2 waits again (still 11)");

    // Cascading in the BPU block: 0 -> 2 with global_power_events.
    reset();
    wrmsr(MSR_FSB_ESCR0, power(true, true));
    wrmsr(MSR_FSB_ESCR1, power(true, true));
    wrmsr(counter(BPU_COUNTER0), MASK - 2); // 3 nops of 1 cycle
    wrmsr(cccr_msr(BPU_COUNTER2), cccr(FSB_ESCR_SELECT) | CCCR_CASCADE);
    nops((cccr_msr(BPU_COUNTER0), cccr(FSB_ESCR_SELECT)), (cccr_msr(BPU_COUNTER2), 0), cccr_msr(BPU_COUNTER0));
    // 7 nops + mov, mov, mov (1 each) + WRMSR (101).
    check_eq!(rdmsr(counter(BPU_COUNTER2)), 111u64, "MSR_BPU_COUNTER2 cascaded from BPU_COUNTER0 counts 111 cycles");
    reset();
}

// ---- CPL3 ----

/// Iterations of the user function's loop.
const USER_N: u64 = 1000;
/// User instructions before the HLT: `mov ecx, N`, then N x (`add rax, 1`; `loop`).
const USER_INSNS: u64 = 1 + 2 * USER_N;
/// Their cycles: mov 1, N adds, N-1 taken LOOPs (2) and the last (1).
const USER_CYCLES: u64 = 3 * USER_N;

global_asm!(
    ".global nb_user_fn",
    "nb_user_fn:",
    "mov ecx, {n}",
    "2: add rax, 1",
    "loop 2b",
    "hlt", // #GP at CPL3: back to the kernel
    n = const USER_N,
);

extern "C" {
    fn nb_user_fn();
}

/// Runs the user function with counter 12 on instr_retired (`os`, `usr`) and counter 0 on
/// global_power_events (`os`, `usr`); returns both counts.
fn user_run(os: bool, usr: bool) -> (u64, u64) {
    reset();
    wrmsr(MSR_CRU_ESCR0, instr(os, usr));
    wrmsr(MSR_FSB_ESCR0, power(os, usr));
    wrmsr(cccr_msr(BPU_COUNTER0), cccr(FSB_ESCR_SELECT));
    wrmsr(cccr_msr(IQ_COUNTER0), cccr(CRU_ESCR01_SELECT));
    let v = run_user(nb_user_fn, 0);
    wrmsr(cccr_msr(IQ_COUNTER0), 0);
    wrmsr(cccr_msr(BPU_COUNTER0), 0);
    check_eq!(v, 13u8, "user function (T0_OS {}, T0_USR {}): back from CPL3 through #GP", os as u8, usr as u8);
    (rdmsr(counter(IQ_COUNTER0)), rdmsr(counter(BPU_COUNTER0)))
}

fn user_mode() {
    println!("-- T0_USR / T0_OS with CPL3 code");
    make_user_accessible();
    let (i, c) = user_run(false, true);
    check_eq!(i, USER_INSNS, "instr_retired T0_USR alone counts the user function's {} instructions", dec(USER_INSNS));
    check_eq!(c, USER_CYCLES, "global_power_events T0_USR alone counts its {} cycles", dec(USER_CYCLES));
    let (oi, oc) = user_run(true, false);
    println!("T0_OS alone around the user run: {} instructions, {} cycles", dec(oi), dec(oc));
    check!(oi > 0 && oc > oi, "T0_OS alone counts the kernel's instructions and cycles around the user run");
    let (oi2, oc2) = user_run(true, false);
    check_eq!(oi2, oi, "T0_OS alone again: the same kernel code counts the same, {}", dec(oi));
    check_eq!(oc2, oc, "T0_OS alone again: the same cycles, {}", dec(oc));
    let (bi, bc) = user_run(true, true);
    check_eq!(bi, oi + USER_INSNS, "T0_OS|T0_USR counts both: {} + {}", dec(oi), dec(USER_INSNS));
    check_eq!(bc, oc + USER_CYCLES, "T0_OS|T0_USR cycles: {} + {}", dec(oc), dec(USER_CYCLES));
    let (ni, nc) = user_run(false, false);
    check_eq!(ni, 0u64, "instr_retired with neither T0_OS nor T0_USR: 0");
    check_eq!(nc, 0u64, "global_power_events with neither T0_OS nor T0_USR: 0");
}

/// BSU_ESCR0 (select 7 on BPU_COUNTER0) event 0x05, an event emon does not derive: it counts 0,
/// and the run summary says so (README, "The NetBurst PMU"); run with `unsupported=1`.
fn unsupported() {
    const MSR_BSU_ESCR0: u32 = 0x3A0;
    let v = count(BPU_COUNTER0, MSR_BSU_ESCR0, escr(0x05, 1, true, true), cccr(7), Block::Foo(10));
    check_eq!(v, 0u64, "BSU_ESCR0 event 0x05 on BPU_COUNTER0: emon does not derive it, it counts 0");
}

fn main(boot: &emon_guest::BootInfo) -> i32 {
    if !present() {
        skip!("netburst-counters: not a NetBurst processor (CPUID family != 0FH or IA32_MISC_ENABLE[7] clear)");
        return emon_guest::summary();
    }
    println!("netburst-counters: a NetBurst PMU, {} counters x 40 bits", COUNTERS);
    reset();
    if boot.arg("unsupported") == Some("1") {
        unsupported();
        reset();
        return emon_guest::summary();
    }
    basic_counting();
    cycles();
    filters();
    branches();
    compare();
    rdpmc_checks();
    overflow();
    cascade();
    if boot.arg("user") == Some("0") {
        skip!("T0_USR / T0_OS with CPL3 code: user=0 on the command line");
    } else {
        user_mode();
    }
    reset();
    emon_guest::summary()
}
