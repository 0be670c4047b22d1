//! REP string instructions retire once: every string instruction with REP/REPE/REPNE, each operand size, zero, one and many iterations, an early REPE/REPNE stop, and a REP interrupted by a #PF midway, counted with INST_RETIRED on IA32_FIXED_CTR0 and IA32_PMC0 (and no branch on IA32_PMC1).
//!
//! Intel's event description of INST_RETIRED.ANY: "an instruction with a REP prefix counts as
//! one instruction (not per iteration). Faults before the retirement of the last micro-op of a
//! multi-ops instruction are not counted." Each case runs in the same counted window:
//!
//! ```text
//! wrmsr                       ; IA32_PERF_GLOBAL_CTRL on: counting starts after it
//! mov rcx, r8                 ; the count
//! mov rdx, r9                 ; the port (INS/OUTS)
//! mov rax, r10                ; the value (STOS, SCAS)
//! <the instruction>           ; one retired instruction, whatever its iterations
//! mov r8, rcx                 ; RCX after it
//! mov ecx, 0x38F              ; the 4 instructions that stop the counters (counted)
//! xor eax, eax
//! xor edx, edx
//! wrmsr
//! ```
//!
//! so every case retires exactly 9 instructions, and 0 branches. The #PF case adds the 3
//! instructions of a raw #PF handler (`mov rdi, r11; add rsp, 8; iretq`), which points RDI at a
//! mapped buffer so that the instruction resumes there: 12, and 1 branch (the IRETQ), the same as
//! a single store that faults once on the same handler.
#![no_std]
#![no_main]

use core::arch::{asm, global_asm};
use emon_guest::cpu::{rdmsr, wrmsr};
use emon_guest::idt;
use emon_guest::pmu::*;
use emon_guest::{check_eq, dec, println, skip};

emon_guest::entry!(main);

/// Instructions every counted window retires (see the module documentation).
const WINDOW: u64 = 9;
/// The raw #PF handler's instructions.
const PF_HANDLER: u64 = 3;
/// An I/O port emon ignores writes to and reads as all-ones (POST codes).
const PORT: u64 = 0x80;
/// IA32_PERF_GLOBAL_CTRL: IA32_FIXED_CTR0, IA32_PMC0 and IA32_PMC1.
const GLOBAL_ON: u64 = 1 << 32 | 0b11;
/// #PF.
const PF_VECTOR: u8 = 14;

global_asm!(
    ".global rep_pf_handler",
    "rep_pf_handler:",
    "mov rdi, r11", // resume at the mapped buffer
    "add rsp, 8",   // the error code
    "iretq",
);

extern "C" {
    fn rep_pf_handler();
}

/// The registers a case starts with and ends with.
#[derive(Clone, Copy)]
struct Regs {
    rcx: u64,
    rsi: u64,
    rdi: u64,
    rdx: u64,
    rax: u64,
    /// Where the #PF handler points RDI (unused without a fault).
    fixup: u64,
}

/// Defines a function that runs `$insn` in the counted window (the module documentation) and
/// returns RCX, RSI and RDI after it.
macro_rules! case {
    ($name:ident, $insn:literal) => {
        fn $name(r: Regs) -> (u64, u64, u64) {
            let (rcx, rsi, rdi): (u64, u64, u64);
            // SAFETY: the instruction reads and writes the buffers the caller set up (or the
            // ignored port); only the declared registers and the PMU MSRs change.
            unsafe {
                asm!(
                    "mov ecx, 0x38F",
                    "mov eax, {on_lo}",
                    "mov edx, {on_hi}",
                    "wrmsr",
                    "mov rcx, r8",
                    "mov rdx, r9",
                    "mov rax, r10",
                    $insn,
                    "mov r8, rcx",
                    "mov ecx, 0x38F",
                    "xor eax, eax",
                    "xor edx, edx",
                    "wrmsr",
                    on_lo = const GLOBAL_ON as u32,
                    on_hi = const (GLOBAL_ON >> 32) as u32,
                    inout("r8") r.rcx => rcx,
                    in("r9") r.rdx,
                    in("r10") r.rax,
                    in("r11") r.fixup,
                    inout("rsi") r.rsi => rsi,
                    inout("rdi") r.rdi => rdi,
                    out("rax") _,
                    out("rcx") _,
                    out("rdx") _,
                );
            }
            (rcx, rsi, rdi)
        }
    };
}

case!(rep_movsb, "rep movsb");
case!(rep_movsw, "rep movsw");
case!(rep_movsd, "rep movsd");
case!(rep_movsq, "rep movsq");
case!(rep_stosb, "rep stosb");
case!(rep_stosw, "rep stosw");
case!(rep_stosd, "rep stosd");
case!(rep_stosq, "rep stosq");
case!(rep_lodsb, "rep lodsb");
case!(rep_lodsq, "rep lodsq");
case!(repe_scasb, "repe scasb");
case!(repne_scasb, "repne scasb");
case!(repe_scasq, "repe scasq");
case!(repe_cmpsb, "repe cmpsb");
case!(repne_cmpsb, "repne cmpsb");
case!(repe_cmpsd, "repe cmpsd");
case!(rep_insb, "rep insb");
case!(rep_outsb, "rep outsb");
case!(rep_movsb_32, "rep movsb byte ptr [edi], byte ptr [esi]");
case!(movsb, "movsb");
case!(store, "mov byte ptr [rdi], al");

const LEN: usize = 4096;
static mut SRC: [u8; LEN] = [0; LEN];
static mut DST: [u8; LEN] = [0; LEN];
static mut FIXUP: [u8; 64] = [0; 64];

fn src() -> u64 {
    (&raw const SRC) as u64
}
fn dst() -> u64 {
    (&raw mut DST) as u64
}

/// Counts one case and checks it retired `want` instructions on both counters, and `branches`
/// branches (the #PF handler's IRETQ is one).
fn counted(
    name: core::fmt::Arguments,
    (want, branches): (u64, u64),
    run: impl FnOnce() -> (u64, u64, u64),
) -> (u64, u64, u64) {
    for msr in [IA32_FIXED_CTR0, IA32_PMC0, IA32_PMC0 + 1] {
        wrmsr(msr, 0);
    }
    let out = run();
    check_eq!(rdmsr(IA32_FIXED_CTR0), want, "{name}: IA32_FIXED_CTR0 counts {} instructions", dec(want));
    check_eq!(rdmsr(IA32_PMC0), want, "{name}: IA32_PMC0 (INST_RETIRED) counts {} instructions", dec(want));
    check_eq!(rdmsr(IA32_PMC0 + 1), branches, "{name}: IA32_PMC1 (BR_INST_RETIRED) counts {} branches", dec(branches));
    out
}

fn regs(rcx: u64) -> Regs {
    // Every byte of RAX is the buffers' byte, so stores keep them uniform.
    Regs { rcx, rsi: src(), rdi: dst(), rdx: PORT, rax: 0x5A5A_5A5A_5A5A_5A5A, fixup: 0 }
}

/// Every form with 0, 1 and `n` iterations: one retired instruction each time.
fn iteration_counts() {
    type Case = (&'static str, fn(Regs) -> (u64, u64, u64), u64);
    let cases: [Case; 16] = [
        ("rep movsb", rep_movsb, 1),
        ("rep movsw", rep_movsw, 2),
        ("rep movsd", rep_movsd, 4),
        ("rep movsq", rep_movsq, 8),
        ("rep stosb", rep_stosb, 1),
        ("rep stosw", rep_stosw, 2),
        ("rep stosd", rep_stosd, 4),
        ("rep stosq", rep_stosq, 8),
        ("rep lodsb", rep_lodsb, 1),
        ("rep lodsq", rep_lodsq, 8),
        ("repe scasb", repe_scasb, 1),
        ("repe scasq", repe_scasq, 8),
        ("repe cmpsb", repe_cmpsb, 1),
        ("repe cmpsd", repe_cmpsd, 4),
        ("rep movsb (32-bit addresses)", rep_movsb_32, 1),
        ("rep outsb", rep_outsb, 1),
    ];
    // SAFETY: single CPU; the buffers are the guest's own.
    unsafe {
        (*(&raw mut SRC)).fill(0x5A);
        (*(&raw mut DST)).fill(0x5A);
    }
    for (name, f, size) in cases {
        // Port I/O exits once per iteration: a few are enough.
        let many = if name.contains("outs") { 8 } else { (LEN as u64 / size).min(500) };
        for n in [0, 1, many] {
            let (rcx, rsi, _) = counted(format_args!("{name} x {}", dec(n)), (WINDOW, 0), || f(regs(n)));
            // Every byte compares equal, so REPE runs to the end like REP.
            check_eq!(rcx, 0u64, "{name} x {}: RCX counted down to 0", dec(n));
            if name.contains("movs") || name.contains("lods") || name.contains("cmps") || name.contains("outs") {
                check_eq!(rsi - src(), n * size, "{name} x {}: RSI advanced by every iteration", dec(n));
            }
        }
    }
    // INS reads all-ones from the ignored port.
    for n in [0, 1, 8] {
        let (rcx, _, rdi) = counted(format_args!("rep insb"), (WINDOW, 0), || rep_insb(regs(n)));
        check_eq!(rcx, 0u64, "rep insb x {}: every iteration ran (RCX)", dec(n));
        check_eq!(rdi - dst(), n, "rep insb x {}: every iteration ran (pointer)", dec(n));
    }
    // SAFETY: as above.
    let inb = unsafe { (*(&raw const DST))[0] };
    check_eq!(inb as u64, 0xFFu64, "rep insb stored what the port read");
}

/// REPE/REPNE stop early on the condition: still one instruction.
fn early_stops() {
    // SAFETY: single CPU; the buffers are the guest's own.
    unsafe {
        (*(&raw mut SRC)).fill(0);
        (*(&raw mut DST)).fill(0);
        (*(&raw mut SRC))[100] = 1;
        (*(&raw mut DST))[200] = 0x5A;
    }
    let (rcx, rsi, _) = counted(format_args!("repe cmpsb (mismatch at 100)"), (WINDOW, 0), || repe_cmpsb(regs(1000)));
    check_eq!(rcx, 1000u64 - 101, "repe cmpsb stopped after the mismatch (RCX)");
    check_eq!(rsi - src(), 101u64, "repe cmpsb stopped after the mismatch (pointer)");
    let (rcx, rsi, _) = counted(format_args!("repne cmpsb (match at 0)"), (WINDOW, 0), || repne_cmpsb(regs(1000)));
    check_eq!(rcx, 999u64, "repne cmpsb stopped after the first equal pair (RCX)");
    check_eq!(rsi - src(), 1u64, "repne cmpsb stopped after the first equal pair (pointer)");
    let (rcx, _, rdi) = counted(format_args!("repne scasb (found at 200)"), (WINDOW, 0), || repne_scasb(regs(1000)));
    check_eq!(rcx, 1000u64 - 201, "repne scasb stopped after the byte it looked for (RCX)");
    check_eq!(rdi - dst(), 201u64, "repne scasb stopped after the byte it looked for (pointer)");
    let (rcx, _, rdi) = counted(format_args!("repe scasb (first differs)"), (WINDOW, 0), || repe_scasb(regs(1000)));
    check_eq!(rcx, 999u64, "repe scasb stopped after the first different byte (RCX)");
    check_eq!(rdi - dst(), 1u64, "repe scasb stopped after the first different byte (pointer)");
    // Without REP: one iteration, one instruction.
    let (rcx, rsi, _) = counted(format_args!("movsb"), (WINDOW, 0), || movsb(regs(7)));
    check_eq!(rcx, 7u64, "movsb moved once and left RCX alone (RCX)");
    check_eq!(rsi - src(), 1u64, "movsb moved once and left RCX alone (pointer)");
}

/// A REP STOSB whose 17th byte is on a page that is not mapped: the #PF stops it midway, the
/// handler points RDI at a mapped buffer, and it resumes and completes. It retires once, like a
/// store that faults once on the same handler.
fn fault_midway(mem_size: u64) {
    // The last 16 bytes of RAM; the guest's page tables map nothing above RAM.
    let edge = mem_size - 16;
    let fixup = (&raw mut FIXUP) as u64;
    idt::set_raw_gate(PF_VECTOR, rep_pf_handler as *const () as u64);
    let r = Regs { rcx: 32, rsi: 0, rdi: edge, rdx: 0, rax: 0xA5, fixup };
    let (rcx, _, rdi) = counted(format_args!("rep stosb faulting midway"), (WINDOW + PF_HANDLER, 1), || rep_stosb(r));
    check_eq!(rcx, 0u64, "rep stosb resumed after the #PF and completed (RCX)");
    check_eq!(rdi, fixup + 16, "rep stosb resumed after the #PF and completed (RDI)");
    // SAFETY: single CPU; FIXUP is the guest's own.
    let fixed: [u8; 64] = unsafe { *(&raw const FIXUP) };
    let tail = fixed[..16].iter().all(|b| *b == 0xA5);
    check_eq!(u64::from(tail), 1u64, "the 16 bytes after the fault went to the handler's buffer");
    let r = Regs { rdi: mem_size, ..r };
    counted(format_args!("a store faulting once"), (WINDOW + PF_HANDLER, 1), || store(r));
    idt::set_default_gate(PF_VECTOR);
}

fn main(boot: &emon_guest::BootInfo) -> i32 {
    let pmu = Perfmon::from_cpuid();
    println!("rep-string: perfmon v{}, {} GP counters, {} fixed", pmu.version, pmu.gp, pmu.fixed);
    if pmu.version < 2 || pmu.gp < 2 || pmu.fixed < 1 || !pmu.event_available(EVENT_INSTRUCTIONS) {
        skip!("REP string instructions: needs perfmon v2+, 2 GP counters, fixed counter 0 and instructions retired");
        return emon_guest::summary();
    }
    wrmsr(IA32_PERF_GLOBAL_CTRL, 0);
    wrmsr(IA32_FIXED_CTR_CTRL, 0b11); // FIXED_CTR0 at every level
    wrmsr(IA32_PERFEVTSEL0, EVTSEL_INSTRUCTIONS);
    wrmsr(IA32_PERFEVTSEL0 + 1, PERFEVTSEL_EN | PERFEVTSEL_OS | PERFEVTSEL_USR | 0xC4);
    iteration_counts();
    early_stops();
    fault_midway(boot.mem_size);
    wrmsr(IA32_PERF_GLOBAL_CTRL, 0);
    emon_guest::summary()
}
