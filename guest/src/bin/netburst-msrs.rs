//! Checks the NetBurst PMU's MSR semantics (counters, CCCRs, ESCRs, PEBS controls, DEBUGCTLA, MISC_ENABLE, ESCR pairing) against the Pentium 4's.
//!
//! The NetBurst twin of `guest:msr-semantics`. A NetBurst processor (SDM Vol. 3B 18.15, 18.16)
//! has no architectural perfmon: CPUID.0AH reads 0 and the IA32_PMCx / IA32_PERF_GLOBAL_* MSRs
//! #GP. Instead it has 18 40-bit counters (0x300-0x311), a CCCR per counter (0x360-0x371) and 45
//! ESCRs in 0x3A0-0x3E1 (with holes). The expectations are the Pentium 4 3.00 GHz's (family 0FH
//! model 4, profile `pentium4`): the write masks the VirtualBox CPU database measured on that part
//! (bits a WRMSR ignores, ESCR bit 31 #GP), the power-on values, and the SDM's pairing rules,
//! observed through counting: a CCCR counts only through an ESCR its block can select (SDM Table
//! 18-63), and with one logical processor only with active thread 01B or 11B (SDM 18.16.2).
//! Anywhere but on NetBurst the guest skips.
#![no_std]
#![no_main]

use core::arch::asm;
use emon_guest::cpu::{cpuid, rdmsr_safe, wrmsr_safe};
use emon_guest::msr::{expect_gp_unchanged, expect_reserved_bits, is_gp, rd, wr, write_reads};
use emon_guest::netburst::{
    self, escr, CCCR_ENABLE, CCCR_ESCR_SELECT_SHIFT, COUNTER_MASK, ESCR_T0_OS, ESCR_T0_USR, ESCR_T1_OS, ESCR_T1_USR,
    EVENT_INSTR_RETIRED, INSTR_RETIRED_NBOGUSNTAG, MSR_BPU_CCCR0, MSR_BPU_COUNTER0, MSR_CRU_ESCR0, MSR_CRU_ESCR1,
    MSR_PEBS_MATRIX_VERT, MSR_TC_PRECISE_EVENT,
};
use emon_guest::pmu::{
    IA32_A_PMC0, IA32_DEBUGCTL, IA32_DS_AREA, IA32_FIXED_CTR_CTRL, IA32_MISC_ENABLE, IA32_PEBS_ENABLE,
    IA32_PERFEVTSEL0, IA32_PERF_CAPABILITIES, IA32_PERF_GLOBAL_CTRL, IA32_PERF_GLOBAL_OVF_CTRL,
    IA32_PERF_GLOBAL_STATUS, IA32_PMC0,
};
use emon_guest::{check, check_eq, dec, println, skip, BootInfo};

emon_guest::entry!(main);

const COUNTERS: u32 = netburst::COUNTERS;

/// Counter i: its block and its number in the block (MSR_<block>_COUNTER<n>, MSR_<block>_CCCR<n>).
const COUNTER_NAMES: [(&str, u8); COUNTERS as usize] = [
    ("BPU", 0),
    ("BPU", 1),
    ("BPU", 2),
    ("BPU", 3),
    ("MS", 0),
    ("MS", 1),
    ("MS", 2),
    ("MS", 3),
    ("FLAME", 0),
    ("FLAME", 1),
    ("FLAME", 2),
    ("FLAME", 3),
    ("IQ", 0),
    ("IQ", 1),
    ("IQ", 2),
    ("IQ", 3),
    ("IQ", 4),
    ("IQ", 5),
];

/// The ESCR select values (bit s) that name no ESCR from counter i (SDM Table 18-63): the BPU
/// counters have all eight; the MS counters only 0-2; the FLAME counters no 4, 6, 7; the IQ
/// counters no 7, and those on the ESCR1 side (IQ_COUNTER2/3/5) no 3 either (MSR_SSU_ESCR0 has
/// no twin).
const fn invalid_selects(i: u32) -> u8 {
    match i {
        0..=3 => 0,
        4..=7 => 0b1111_1000,
        8..=11 => 0b1101_0000,
        12 | 13 | 16 => 0b1000_0000,
        _ => 0b1000_1000,
    }
}

const fn counter_msr(i: u32) -> u32 {
    MSR_BPU_COUNTER0 + i
}

const fn cccr_msr(i: u32) -> u32 {
    MSR_BPU_CCCR0 + i
}

/// Bits 63:32 of an ESCR or CCCR: ignored by a WRMSR (read 0).
const HI: u64 = 0xFFFF_FFFF_0000_0000;
/// The CCCR bits a WRMSR ignores: 11:0 (reserved) and 63:32.
const CCCR_IGNORED: u64 = HI | 0xFFF;
/// IQ_CCCR0/3 bit 11 and IQ_CCCR4/5 bits 11:8 are writable (extended cascading, SDM 18.15.5.7).
const fn cccr_ignored(i: u32) -> u64 {
    match i {
        12 | 15 => CCCR_IGNORED & !(1 << 11),
        16 | 17 => CCCR_IGNORED & !(0xF << 8),
        _ => CCCR_IGNORED,
    }
}

/// ESCR bit 31 raises #GP on write.
const ESCR_GP_BIT: u64 = 1 << 31;

/// Every ESCR of the Pentium 4 3.00 GHz, model 4 (SDM Table 18-63), with the bits 30:0 a WRMSR
/// ignores (VirtualBox CPU database, Intel_Pentium_4_3_00GHz.h); bits 63:32 are ignored in all.
const ESCRS: [(u32, &str, u64); 45] = [
    (0x3A0, "MSR_BSU_ESCR0", 0),
    (0x3A1, "MSR_BSU_ESCR1", 0),
    (0x3A2, "MSR_FSB_ESCR0", 0x4000_0000),
    (0x3A3, "MSR_FSB_ESCR1", 0x4000_0000),
    (0x3A4, "MSR_FIRM_ESCR0", 0),
    (0x3A5, "MSR_FIRM_ESCR1", 0),
    (0x3A6, "MSR_FLAME_ESCR0", 0),
    (0x3A7, "MSR_FLAME_ESCR1", 0),
    (0x3A8, "MSR_DAC_ESCR0", 0x61FE_01F0),
    (0x3A9, "MSR_DAC_ESCR1", 0x61FE_01F0),
    (0x3AA, "MSR_MOB_ESCR0", 0),
    (0x3AB, "MSR_MOB_ESCR1", 0),
    (0x3AC, "MSR_PMH_ESCR0", 0),
    (0x3AD, "MSR_PMH_ESCR1", 0),
    (0x3AE, "MSR_SAAT_ESCR0", 0),
    (0x3AF, "MSR_SAAT_ESCR1", 0),
    (0x3B0, "MSR_U2L_ESCR0", 0x71C0_01F0),
    (0x3B1, "MSR_U2L_ESCR1", 0x71C0_01F0),
    (0x3B2, "MSR_BPU_ESCR0", 0x61FC_0000),
    (0x3B3, "MSR_BPU_ESCR1", 0x61FC_0000),
    (0x3B4, "MSR_IS_ESCR0", 0x71FE_01F0),
    (0x3B5, "MSR_IS_ESCR1", 0x71FE_01F0),
    (0x3B6, "MSR_ITLB_ESCR0", 0x0FFF_F1E0),
    (0x3B7, "MSR_ITLB_ESCR1", 0x0FFF_F1E0),
    (0x3B8, "MSR_CRU_ESCR0", 0x71FE_01F0),
    (0x3B9, "MSR_CRU_ESCR1", 0x71FE_01F0),
    // MSR_IQ_ESCR0/1 exist but ignore every write from model 3 on.
    (0x3BA, "MSR_IQ_ESCR0", 0x7FFF_FFFF),
    (0x3BB, "MSR_IQ_ESCR1", 0x7FFF_FFFF),
    (0x3BC, "MSR_RAT_ESCR0", 0),
    (0x3BD, "MSR_RAT_ESCR1", 0),
    (0x3BE, "MSR_SSU_ESCR0", 0),
    (0x3C0, "MSR_MS_ESCR0", 0x61FF_81E0),
    (0x3C1, "MSR_MS_ESCR1", 0x61FF_81E0),
    (0x3C2, "MSR_TBPU_ESCR0", 0x71FE_01F0),
    (0x3C3, "MSR_TBPU_ESCR1", 0x71FE_01F0),
    (0x3C4, "MSR_TC_ESCR0", 0x61F8_01F0),
    (0x3C5, "MSR_TC_ESCR1", 0x61F8_01F0),
    (0x3C8, "MSR_IX_ESCR0", 0x71FE_01F0),
    (0x3C9, "MSR_IX_ESCR1", 0x71FE_01F0),
    (0x3CA, "MSR_ALF_ESCR0", 0x7000_01F0),
    (0x3CB, "MSR_ALF_ESCR1", 0x7000_01F0),
    (0x3CC, "MSR_CRU_ESCR2", 0x61F0_01F0),
    (0x3CD, "MSR_CRU_ESCR3", 0x61F0_01F0),
    (0x3E0, "MSR_CRU_ESCR4", 0x71FF_01F0),
    (0x3E1, "MSR_CRU_ESCR5", 0x71FF_01F0),
];
const ESCR_FIRST: u32 = 0x3A0;
const ESCR_LAST: u32 = 0x3E1;

/// MSR_TC_PRECISE_EVENT: power-on 0xFC00, bits 17:5 writable, the rest ignored (as measured).
const TC_PRECISE_EVENT_RESET: u64 = 0xFC00;
const TC_PRECISE_EVENT_BITS: u64 = 0x3_FFE0;
/// IA32_PEBS_ENABLE bits 26:0 and MSR_PEBS_MATRIX_VERT bits 12:0 writable, the rest ignored.
const PEBS_ENABLE_BITS: u64 = 0x7FF_FFFF;
const PEBS_MATRIX_VERT_BITS: u64 = 0x1FFF;
/// MSR_DEBUGCTLA (SDM 17.5.1): LBR, BTF, TR, BTS, BTINT, BTS_OFF_OS, BTS_OFF_USR; bits 63:7 #GP.
const DEBUGCTLA_BITS: u64 = 0x7F;

/// IA32_MISC_ENABLE read-only bits: (bit, SDM name).
const MISC_READ_ONLY: [(u32, &str); 3] =
    [(7, "Performance Monitoring Available"), (11, "Branch Trace Storage Unavailable"), (12, "PEBS Unavailable")];

/// The architectural PMU MSRs a NetBurst processor does not have.
const ARCH_MSRS: [(u32, &str); 8] = [
    (IA32_PMC0, "IA32_PMC0"),
    (IA32_PERFEVTSEL0, "IA32_PERFEVTSEL0"),
    (IA32_PERF_CAPABILITIES, "IA32_PERF_CAPABILITIES"),
    (IA32_FIXED_CTR_CTRL, "IA32_FIXED_CTR_CTRL"),
    (IA32_PERF_GLOBAL_STATUS, "IA32_PERF_GLOBAL_STATUS"),
    (IA32_PERF_GLOBAL_CTRL, "IA32_PERF_GLOBAL_CTRL"),
    (IA32_PERF_GLOBAL_OVF_CTRL, "IA32_PERF_GLOBAL_OVF_CTRL"),
    (IA32_A_PMC0, "IA32_A_PMC0"),
];

fn is_escr(msr: u32) -> bool {
    ESCRS.iter().any(|e| e.0 == msr)
}

/// Every NetBurst register, back at its power-on value.
fn reset() {
    for i in 0..COUNTERS {
        wr(cccr_msr(i), 0);
        wr(counter_msr(i), 0);
    }
    for e in &ESCRS {
        wr(e.0, 0);
    }
    wr(MSR_TC_PRECISE_EVENT, TC_PRECISE_EVENT_RESET);
    wr(IA32_PEBS_ENABLE, 0);
    wr(MSR_PEBS_MATRIX_VERT, 0);
}

/// Power-on values: counters, CCCRs, ESCRs, IA32_PEBS_ENABLE and MSR_PEBS_MATRIX_VERT 0,
/// MSR_TC_PRECISE_EVENT 0xFC00 (SDM 18.15.1; as measured).
fn check_power_on() {
    let mut nonzero = 0;
    let regs = (0..COUNTERS).flat_map(|i| [counter_msr(i), cccr_msr(i)]).chain(ESCRS.iter().map(|e| e.0));
    for msr in regs.chain([IA32_PEBS_ENABLE, MSR_PEBS_MATRIX_VERT]) {
        let v = rd(msr);
        if v != 0 {
            println!("  MSR {:#x} reads {:#x} at power-on", msr, v);
            nonzero += 1;
        }
    }
    check!(
        nonzero == 0,
        "the 18 counters, 18 CCCRs, 45 ESCRs, IA32_PEBS_ENABLE and MSR_PEBS_MATRIX_VERT read 0 at power-on"
    );
    check_eq!(rd(MSR_TC_PRECISE_EVENT), TC_PRECISE_EVENT_RESET, "MSR_TC_PRECISE_EVENT reads 0xfc00 at power-on");
}

/// No architectural perfmon: CPUID.0AH reads 0, its MSRs #GP on read and write.
fn check_no_arch_pmu() {
    let a = cpuid(0xA, 0);
    if (a.eax, a.ebx, a.ecx, a.edx) != (0, 0, 0, 0) {
        println!("  CPUID.0AH = {:#x} {:#x} {:#x} {:#x}", a.eax, a.ebx, a.ecx, a.edx);
    }
    check!((a.eax, a.ebx, a.ecx, a.edx) == (0, 0, 0, 0), "CPUID.0AH reads 0 (no architectural perfmon)");
    for (msr, name) in ARCH_MSRS {
        check!(is_gp(&rdmsr_safe(msr)) && is_gp(&wrmsr_safe(msr, 0)), "{} ({:#x}) #GPs on RDMSR and WRMSR", name, msr);
    }
    // 0x309 is MSR_FLAME_COUNTER1: a 40-bit counter, not a 48-bit IA32_FIXED_CTR0.
    write_reads(
        format_args!("MSR 0x309 is MSR_FLAME_COUNTER1: a WRMSR of all ones reads 40 bits"),
        0x309,
        u64::MAX,
        COUNTER_MASK,
    );
    wr(0x309, 0);
}

/// Every counter keeps bits 39:0 of a write and ignores 63:40, without #GP.
fn check_counters() {
    for i in 0..COUNTERS {
        let (block, n) = COUNTER_NAMES[i as usize];
        let msr = counter_msr(i);
        write_reads(
            format_args!("MSR_{}_COUNTER{} ({:#x}) keeps bits 39:0 of all ones", block, n, msr),
            msr,
            u64::MAX,
            COUNTER_MASK,
        );
        write_reads(
            format_args!("MSR_{}_COUNTER{} ignores bits 63:40", block, n),
            msr,
            0xFFFF_FF00_0000_0000 | 0x12_3456_789A,
            0x12_3456_789A,
        );
        wr(msr, 0);
    }
}

/// Every CCCR: bits 11:0 and 63:32 ignored (but the IQ extended-cascading bits), no #GP.
fn check_cccrs() {
    for i in 0..COUNTERS {
        let (block, n) = COUNTER_NAMES[i as usize];
        let msr = cccr_msr(i);
        let ignored = cccr_ignored(i);
        write_reads(
            format_args!("MSR_{}_CCCR{} ({:#x}): all ones reads {:#x}", block, n, msr, !ignored),
            msr,
            u64::MAX,
            !ignored,
        );
        write_reads(
            format_args!("MSR_{}_CCCR{}: bits 11:0 and 63:32 read {:#x}", block, n, CCCR_IGNORED & !ignored),
            msr,
            CCCR_IGNORED,
            CCCR_IGNORED & !ignored,
        );
        wr(msr, 0);
    }
}

/// Every ESCR: its ignored bits read 0, bit 31 #GPs without a change; the holes #GP.
fn check_escrs() {
    for &(msr, name, ignored) in &ESCRS {
        let writable = 0x7FFF_FFFF & !ignored;
        write_reads(
            format_args!("{} ({:#x}): bits 30:0 and 63:32 read {:#x}", name, msr, writable),
            msr,
            u64::MAX & !ESCR_GP_BIT,
            writable,
        );
        expect_gp_unchanged(format_args!("{}: bit 31 #GPs, no change", name), msr, u64::MAX, msr);
        expect_gp_unchanged(format_args!("{}: bit 31 alone #GPs, no change", name), msr, ESCR_GP_BIT, msr);
        wr(msr, 0);
    }
    let mut holes = 0;
    let mut wrong = 0;
    for msr in (ESCR_FIRST..=ESCR_LAST).filter(|&m| !is_escr(m)) {
        holes += 1;
        if !is_gp(&rdmsr_safe(msr)) || !is_gp(&wrmsr_safe(msr, 0)) {
            println!("  MSR {:#x}: no #GP", msr);
            wrong += 1;
        }
    }
    check!(
        holes == 21 && wrong == 0,
        "the {} holes in 0x3a0-0x3e1 (0x3bf, 0x3c6, 0x3c7, 0x3ce-0x3df) #GP on RDMSR and WRMSR",
        holes
    );
}

/// MSR_TC_PRECISE_EVENT, IA32_PEBS_ENABLE, MSR_PEBS_MATRIX_VERT: their writable bits, the rest
/// ignored.
fn check_pebs_controls() {
    let regs: [(u32, &str, u64, u64); 3] = [
        (MSR_TC_PRECISE_EVENT, "MSR_TC_PRECISE_EVENT", TC_PRECISE_EVENT_BITS, TC_PRECISE_EVENT_RESET),
        (IA32_PEBS_ENABLE, "IA32_PEBS_ENABLE", PEBS_ENABLE_BITS, 0),
        (MSR_PEBS_MATRIX_VERT, "MSR_PEBS_MATRIX_VERT", PEBS_MATRIX_VERT_BITS, 0),
    ];
    for (msr, name, bits, reset) in regs {
        write_reads(format_args!("{} ({:#x}): all ones reads {:#x}", name, msr, bits), msr, u64::MAX, bits);
        write_reads(format_args!("{}: the other bits are ignored", name), msr, !bits, 0);
        write_reads(format_args!("{}: {:#x} again", name, reset), msr, reset, reset);
    }
}

/// MSR_DEBUGCTLA bits 6:0, every other bit #GP; IA32_DS_AREA exists.
fn check_debugctl_ds() {
    let mut bad = 0;
    for b in 0..7 {
        if wrmsr_safe(IA32_DEBUGCTL, 1 << b).is_err() || rd(IA32_DEBUGCTL) != 1 << b {
            println!("  DEBUGCTL bit {} not writable", b);
            bad += 1;
        }
    }
    check!(bad == 0, "IA32_DEBUGCTL (MSR_DEBUGCTLA) bits 6:0 are each writable");
    write_reads(format_args!("IA32_DEBUGCTL holds bits 6:0 together"), IA32_DEBUGCTL, DEBUGCTLA_BITS, DEBUGCTLA_BITS);
    wr(IA32_DEBUGCTL, 0);
    expect_reserved_bits(
        format_args!("IA32_DEBUGCTL bits 63:7 #GP, no change"),
        IA32_DEBUGCTL,
        0,
        !DEBUGCTLA_BITS,
        IA32_DEBUGCTL,
    );
    check_eq!(rd(IA32_DS_AREA), 0u64, "IA32_DS_AREA exists and reads 0 at power-on");
    write_reads(format_args!("IA32_DS_AREA holds an address"), IA32_DS_AREA, 0x1000, 0x1000);
    wr(IA32_DS_AREA, 0);
}

/// IA32_MISC_ENABLE: performance monitoring available, BTS and PEBS unavailable, read-only.
fn check_misc_enable() {
    let misc = rd(IA32_MISC_ENABLE);
    for (bit, name) in MISC_READ_ONLY {
        check!(misc & 1 << bit != 0, "IA32_MISC_ENABLE bit {} ({}) is set", bit, name);
        write_reads(
            format_args!("IA32_MISC_ENABLE bit {} ({}) is read-only", bit, name),
            IA32_MISC_ENABLE,
            misc & !(1 << bit),
            misc,
        );
    }
    check_eq!(rd(IA32_MISC_ENABLE), misc, "IA32_MISC_ENABLE unchanged");
}

/// foo() of `guest:count-instructions`: `mov ecx, N; 1: dec ecx; jnz 1b; ret`, 2N+2 instructions.
/// Counting starts after the WRMSR that writes `cccr` to CCCR `msr`; the 4 instructions that
/// stop it (`mov ecx, msr; xor eax, eax; xor edx, edx; wrmsr`) count: 1 + 2N+2 + 4 in all.
fn run_counted(msr: u32, cccr: u64, n: u32) {
    // SAFETY: only PMU MSRs and registers declared as clobbered are touched.
    unsafe {
        asm!(
            "xor edx, edx",
            "mov ecx, {msr:e}",
            "wrmsr",
            "call 2f",
            "mov ecx, {msr:e}",
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
            msr = in(reg) msr,
            n = in(reg) n,
            inout("eax") cccr as u32 => _,
            out("ecx") _,
            out("edx") _,
        );
    }
}

fn expected(n: u32) -> u64 {
    1 + (2 * u64::from(n) + 2) + 4
}

/// Counter `i` from 0 through a run of foo(N) with CCCR `cccr`: its count.
fn count(i: u32, cccr: u64, n: u32) -> u64 {
    wr(counter_msr(i), 0);
    run_counted(cccr_msr(i), cccr, n);
    let got = rd(counter_msr(i));
    wr(counter_msr(i), 0);
    got
}

/// A CCCR enabled through ESCR select `select` with active thread `thread`.
fn cccr(select: u32, thread: u64) -> u64 {
    CCCR_ENABLE | u64::from(select) << CCCR_ESCR_SELECT_SHIFT | thread << 16
}

/// Select 4 names MSR_CRU_ESCR0 (IQ counters 0, 1, 4) or MSR_CRU_ESCR1 (2, 3, 5).
const CRU_ESCR01_SELECT: u32 = netburst::CRU_ESCR01_SELECT as u32;

/// The pairing rules, observed: instr_retired counts exactly through a valid select, not at all
/// through a select that names no ESCR of the counter's block, nor with active thread 00B/10B.
fn check_pairing() {
    let instr = escr(EVENT_INSTR_RETIRED, INSTR_RETIRED_NBOGUSNTAG, true, false);
    wr(MSR_CRU_ESCR0, instr);
    wr(MSR_CRU_ESCR1, instr);
    for n in [1u32, 100, 1000] {
        let got = count(12, cccr(CRU_ESCR01_SELECT, 3), n);
        println!("instr_retired on MSR_IQ_COUNTER0, foo(N={}): {}", dec(u64::from(n)), dec(got));
        check_eq!(
            got,
            expected(n),
            "MSR_IQ_COUNTER0 select 4 (CRU_ESCR0, instr_retired T0_OS) counts call + foo(N={}) + 4",
            dec(u64::from(n))
        );
    }
    for i in 12..COUNTERS {
        let (block, n) = COUNTER_NAMES[i as usize];
        check_eq!(
            count(i, cccr(CRU_ESCR01_SELECT, 3), 100),
            expected(100),
            "MSR_{}_COUNTER{} select 4 (MSR_CRU_ESCR{}) counts instr_retired exactly",
            block,
            n,
            if matches!(i, 12 | 13 | 16) { 0 } else { 1 }
        );
    }
    // Active thread (SDM 18.16.2): with one logical processor, 01B (single) and 11B (any) count,
    // 00B (none) and 10B (both) do not.
    for (thread, what, counts) in [
        (0b00, "00B (none)", false),
        (0b01, "01B (single)", true),
        (0b10, "10B (both)", false),
        (0b11, "11B (any)", true),
    ] {
        let want = if counts { expected(100) } else { 0 };
        check_eq!(
            count(12, cccr(CRU_ESCR01_SELECT, thread), 100),
            want,
            "MSR_IQ_CCCR0 active thread {} {}",
            what,
            if counts { "counts" } else { "counts nothing" }
        );
    }
    // The ESCR's privilege flags: T0_USR alone at CPL 0 and the T1 flags (logical processor 1 is
    // never running) count nothing.
    for (flags, what) in [(ESCR_T0_USR, "T0_USR"), (ESCR_T1_OS | ESCR_T1_USR, "T1_OS | T1_USR")] {
        wr(MSR_CRU_ESCR0, instr & !(ESCR_T0_OS | ESCR_T0_USR) | flags);
        check_eq!(
            count(12, cccr(CRU_ESCR01_SELECT, 3), 100),
            0u64,
            "CRU_ESCR0 instr_retired with {} alone counts nothing at CPL 0",
            what
        );
    }
    wr(MSR_CRU_ESCR0, instr);
    // Selects that name no ESCR of the counter's block count nothing.
    for i in 0..COUNTERS {
        let invalid = invalid_selects(i);
        if invalid == 0 {
            continue;
        }
        let (block, n) = COUNTER_NAMES[i as usize];
        let mut counted = 0;
        for s in (0..8).filter(|s| invalid & 1 << s != 0) {
            let got = count(i, cccr(s, 3), 100);
            if got != 0 {
                println!("  MSR_{}_COUNTER{} with ESCR select {} counted {}", block, n, s, dec(got));
                counted += 1;
            }
        }
        check!(
            counted == 0,
            "MSR_{}_CCCR{} enabled with an ESCR select its block lacks ({:#010b}) counts nothing",
            block,
            n,
            invalid
        );
    }
    wr(MSR_CRU_ESCR0, 0);
    wr(MSR_CRU_ESCR1, 0);
}

fn main(_boot: &BootInfo) -> i32 {
    if !netburst::present() {
        let family = (cpuid(1, 0).eax >> 8) & 0xF;
        skip!(
            "netburst-msrs: not a NetBurst processor (CPUID family {:#x}; NetBurst is GenuineIntel family 0xf with IA32_MISC_ENABLE[7])",
            family
        );
        return emon_guest::summary();
    }
    println!("netburst-msrs: NetBurst PMU, 18 counters, 18 CCCRs, {} ESCRs", ESCRS.len());
    check_power_on();
    check_no_arch_pmu();
    check_counters();
    check_cccrs();
    check_escrs();
    check_pebs_controls();
    check_debugctl_ds();
    check_misc_enable();
    reset();
    check_pairing();
    reset();
    let mut wrong = 0;
    let regs = (0..COUNTERS).flat_map(|i| [counter_msr(i), cccr_msr(i)]).chain(ESCRS.iter().map(|e| e.0));
    for msr in regs.chain([IA32_PEBS_ENABLE, MSR_PEBS_MATRIX_VERT]) {
        if rd(msr) != 0 {
            wrong += 1;
        }
    }
    check!(
        wrong == 0 && rd(MSR_TC_PRECISE_EVENT) == TC_PRECISE_EVENT_RESET,
        "every NetBurst register is back at its power-on value"
    );
    emon_guest::summary()
}
