//! Freeze on PMI (SDM 17.4.7, the walkthrough experiment in the README): the counter advances inside a PMI handler, and does not with DEBUGCTL.FREEZE_PERFMON_ON_PMI.
//!
//! Two PMIs from IA32_PMC0 (written with its maximum, counting instructions with INT set). Inside
//! each handler, IA32_PMC0 is read, a known 104 instructions retire, and it is read again. The
//! first PMI runs without FREEZE_PERFMON_ON_PMI: the counter advances by exactly 104. The second
//! runs with IA32_DEBUGCTL[12] set: the counter is frozen in the handler. How it is frozen depends
//! on the version (SDM 18.2.4.1 and 17.4.7): v2/v3 clear IA32_PERF_GLOBAL_CTRL (the walkthrough's
//! Westmere); v4+ ("streamlined freeze") set IA32_PERF_GLOBAL_STATUS.CTR_Frz (bit 59) and leave
//! GLOBAL_CTRL alone, and software unfreezes through IA32_PERF_GLOBAL_STATUS_RESET.
//!
//! Then, where the CPU has an LBR stack (`emon_guest::models`), two more PMIs with DEBUGCTL.LBR
//! set: without FREEZE_LBRS_ON_PMI the stack goes on recording the handler's branches; with it
//! (bit 11) the stack is frozen from the PMI on: v2/v3 clear DEBUGCTL.LBR, v4+ set
//! GLOBAL_STATUS.LBR_Frz (bit 58), and MSR_LASTBRANCH_TOS does not move in the handler.
#![no_std]
#![no_main]

use core::arch::asm;
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use emon_guest::cpu::{enable_interrupts, rdmsr, wrmsr};
use emon_guest::models::{self, MSR_LASTBRANCH_TOS};
use emon_guest::pmu::{
    Perfmon, APIC_PERFMON_VECTOR, DEBUGCTL_FREEZE_PERFMON_ON_PMI, EVENT_INSTRUCTIONS, EVTSEL_INSTRUCTIONS_INT,
    GLOBAL_STATUS_CTR_FRZ, IA32_DEBUGCTL, IA32_PERFEVTSEL0, IA32_PERF_GLOBAL_CTRL, IA32_PERF_GLOBAL_STATUS,
    IA32_PERF_GLOBAL_STATUS_RESET, IA32_PMC0,
};
use emon_guest::{apic, check, check_eq, dec, idt, println, skip};

emon_guest::entry!(main);

/// Instructions retired between the two reads of IA32_PMC0 in the handler.
const WORK: u64 = 104;

static FIRST: AtomicU64 = AtomicU64::new(0);
static SECOND: AtomicU64 = AtomicU64::new(0);
static CTRL_IN_HANDLER: AtomicU64 = AtomicU64::new(0);
static STATUS_IN_HANDLER: AtomicU64 = AtomicU64::new(0);
static HANDLED: AtomicU64 = AtomicU64::new(0);
/// MSR_LASTBRANCH_TOS when the handler starts and after its work, and IA32_DEBUGCTL in it.
static TOS_AT_ENTRY: AtomicU64 = AtomicU64::new(0);
static TOS_AFTER_WORK: AtomicU64 = AtomicU64::new(0);
static DEBUGCTL_IN_HANDLER: AtomicU64 = AtomicU64::new(0);
/// MSR_LASTBRANCH_0_TO_IP of the stack and its depth; whether, when the handler starts, an entry
/// holds the PMI's delivery (TO_IP = the vector's handler).
static LBR_TO_BASE: AtomicU64 = AtomicU64::new(0);
static LBR_DEPTH: AtomicU64 = AtomicU64::new(0);
static DELIVERY_RECORDED: AtomicBool = AtomicBool::new(false);
const DEBUGCTL_LBR: u64 = 1 << 0;
const DEBUGCTL_FREEZE_LBRS_ON_PMI: u64 = 1 << 11;
const GLOBAL_STATUS_LBR_FRZ: u64 = 1 << 58;

/// Reads IA32_PMC0, retires WORK instructions after that read, reads it again.
fn measure_in_handler() -> (u64, u64) {
    let (first, second): (u32, u32);
    // SAFETY: reads one PMU MSR twice; clobbers are declared.
    unsafe {
        asm!(
            "mov ecx, 0xC1",
            "rdmsr",            // first read: the value before this RDMSR retires
            "mov r8d, eax",     // 1 (the RDMSR itself) + 1
            "mov ecx, 50",      // + 1
            "2:",
            "dec ecx",          // + 50
            "jnz 2b",           // + 50
            "mov ecx, 0xC1",    // + 1 = 104
            "rdmsr",
            out("r8d") first,
            out("eax") second,
            out("ecx") _,
            out("edx") _,
        );
    }
    (first as u64, second as u64)
}

fn pmi_handler(_regs: &mut idt::Regs) {
    let (a, b) = measure_in_handler();
    FIRST.store(a, SeqCst);
    SECOND.store(b, SeqCst);
    finish_pmi();
}

/// The handler of the LBR part: it looks at the stack around the same work.
fn lbr_pmi_handler(_regs: &mut idt::Regs) {
    DEBUGCTL_IN_HANDLER.store(rdmsr(IA32_DEBUGCTL), SeqCst);
    TOS_AT_ENTRY.store(rdmsr(MSR_LASTBRANCH_TOS), SeqCst);
    let (base, depth) = (LBR_TO_BASE.load(SeqCst) as u32, LBR_DEPTH.load(SeqCst) as u32);
    let entry = idt::gate_address(APIC_PERFMON_VECTOR);
    DELIVERY_RECORDED.store((0..depth).any(|i| rdmsr(base + i) == entry), SeqCst);
    let (a, b) = measure_in_handler();
    TOS_AFTER_WORK.store(rdmsr(MSR_LASTBRANCH_TOS), SeqCst);
    FIRST.store(a, SeqCst);
    SECOND.store(b, SeqCst);
    finish_pmi();
}

/// What both handlers do last: note the state, stop the counter, clear what the PMI reported.
fn finish_pmi() {
    CTRL_IN_HANDLER.store(rdmsr(IA32_PERF_GLOBAL_CTRL), SeqCst);
    let status = rdmsr(IA32_PERF_GLOBAL_STATUS);
    STATUS_IN_HANDLER.store(status, SeqCst);
    HANDLED.fetch_add(1, SeqCst);
    wrmsr(IA32_PERFEVTSEL0, 0);
    // Clear the overflow (and, v4+, CTR_Frz and LBR_Frz: unfreeze), as the walkthrough's handler does.
    wrmsr(IA32_PERF_GLOBAL_STATUS_RESET, status & (1 | GLOBAL_STATUS_CTR_FRZ | GLOBAL_STATUS_LBR_FRZ));
    apic::write(apic::LVT_PMC, apic::read(apic::LVT_PMC) & !apic::LVT_MASKED);
    apic::eoi();
}

/// One PMI from IA32_PMC0 written with its maximum.
fn overflow_once() {
    HANDLED.store(0, SeqCst);
    wrmsr(IA32_PERF_GLOBAL_CTRL, 0);
    wrmsr(IA32_PMC0, 0xFFFF_FFFF);
    wrmsr(IA32_PERFEVTSEL0, EVTSEL_INSTRUCTIONS_INT);
    wrmsr(IA32_PERF_GLOBAL_CTRL, 1);
    // SAFETY: plain instructions for the counter to count.
    unsafe { asm!("nop", "nop", "nop") };
    wrmsr(IA32_PERFEVTSEL0, 0);
    wrmsr(IA32_PERF_GLOBAL_CTRL, 0);
}

fn main(_boot: &emon_guest::BootInfo) -> i32 {
    let pmu = Perfmon::from_cpuid();
    let (version, gp) = (pmu.version, pmu.gp);
    println!("freeze-on-pmi: perfmon v{version}, {gp} GP counters");
    if version < 2 || gp == 0 || !pmu.event_available(EVENT_INSTRUCTIONS) {
        skip!("FREEZE_PERFMON_ON_PMI: needs perfmon v2+ and the instructions-retired event");
        return emon_guest::summary();
    }
    idt::set_handler(APIC_PERFMON_VECTOR, pmi_handler);
    apic::enable();
    apic::write(apic::LVT_PMC, APIC_PERFMON_VECTOR as u32);
    enable_interrupts();

    // First PMI: no freeze; the counter goes on counting in the handler.
    wrmsr(IA32_DEBUGCTL, 0);
    overflow_once();
    let (f, s) = (FIRST.load(SeqCst), SECOND.load(SeqCst));
    println!("first PMI (no freeze): IA32_PMC0 {} then {} in the handler", dec(f), dec(s));
    check_eq!(HANDLED.load(SeqCst), 1u64, "first PMI handled once");
    check_eq!(
        s - f,
        WORK,
        "without FREEZE_PERFMON_ON_PMI the counter advances by the handler's {} instructions",
        dec(WORK)
    );
    check_eq!(CTRL_IN_HANDLER.load(SeqCst), 1u64, "without freeze IA32_PERF_GLOBAL_CTRL stays enabled in the handler");
    check_eq!(STATUS_IN_HANDLER.load(SeqCst) & GLOBAL_STATUS_CTR_FRZ, 0u64, "without freeze CTR_Frz is clear");

    // Second PMI: FREEZE_PERFMON_ON_PMI; the counter is frozen in the handler.
    wrmsr(IA32_DEBUGCTL, DEBUGCTL_FREEZE_PERFMON_ON_PMI);
    overflow_once();
    let (f, s) = (FIRST.load(SeqCst), SECOND.load(SeqCst));
    println!("second PMI (freeze): IA32_PMC0 {} then {} in the handler", dec(f), dec(s));
    check_eq!(HANDLED.load(SeqCst), 1u64, "second PMI handled once");
    check_eq!(s, f, "with FREEZE_PERFMON_ON_PMI the counter does not advance in the handler");
    if version >= 4 {
        check!(
            STATUS_IN_HANDLER.load(SeqCst) & GLOBAL_STATUS_CTR_FRZ != 0,
            "v4+: GLOBAL_STATUS.CTR_Frz is set in the handler"
        );
        check_eq!(CTRL_IN_HANDLER.load(SeqCst), 1u64, "v4+: IA32_PERF_GLOBAL_CTRL is left alone (streamlined freeze)");
        check_eq!(rdmsr(IA32_PERF_GLOBAL_STATUS) & GLOBAL_STATUS_CTR_FRZ, 0u64, "v4+: STATUS_RESET cleared CTR_Frz");
    } else {
        check_eq!(CTRL_IN_HANDLER.load(SeqCst), 0u64, "v2/v3: the PMI cleared IA32_PERF_GLOBAL_CTRL (legacy freeze)");
    }
    check!(rdmsr(IA32_DEBUGCTL) & DEBUGCTL_FREEZE_PERFMON_ON_PMI != 0, "DEBUGCTL.FREEZE_PERFMON_ON_PMI stays set");
    wrmsr(IA32_DEBUGCTL, 0);
    freeze_lbrs(version);
    emon_guest::summary()
}

/// FREEZE_LBRS_ON_PMI (SDM 17.4.7): the LBR stack records the handler's branches without it and
/// is frozen from the PMI on with it.
fn freeze_lbrs(version: u8) {
    let models::Identified::Known(cpu) = models::identify() else {
        skip!("FREEZE_LBRS_ON_PMI: no LBR stack this guest knows");
        return;
    };
    LBR_TO_BASE.store(cpu.lbr.to.into(), SeqCst);
    LBR_DEPTH.store(cpu.lbr.depth.into(), SeqCst);
    idt::set_handler(APIC_PERFMON_VECTOR, lbr_pmi_handler);
    wrmsr(IA32_DEBUGCTL, DEBUGCTL_LBR);
    overflow_once();
    check_eq!(HANDLED.load(SeqCst), 1u64, "PMI with DEBUGCTL.LBR handled once");
    check!(
        TOS_AFTER_WORK.load(SeqCst) != TOS_AT_ENTRY.load(SeqCst),
        "without FREEZE_LBRS_ON_PMI the LBR stack records the handler's branches"
    );
    check!(DEBUGCTL_IN_HANDLER.load(SeqCst) & DEBUGCTL_LBR != 0, "without FREEZE_LBRS_ON_PMI DEBUGCTL.LBR stays set");
    // The handler's entry takes a few branches before it reads the stack: a 4-entry stack has
    // lost the delivery by then.
    if cpu.lbr.depth >= 16 {
        check!(
            DELIVERY_RECORDED.load(SeqCst),
            "without FREEZE_LBRS_ON_PMI the PMI's delivery is a recorded far branch"
        );
    }

    // An empty stack, so that an entry of the PMI's delivery could only come from this PMI.
    for i in 0..cpu.lbr.depth {
        wrmsr(cpu.lbr.to + i, 0);
    }
    wrmsr(IA32_DEBUGCTL, DEBUGCTL_LBR | DEBUGCTL_FREEZE_LBRS_ON_PMI);
    overflow_once();
    check_eq!(HANDLED.load(SeqCst), 1u64, "PMI with FREEZE_LBRS_ON_PMI handled once");
    check_eq!(
        TOS_AFTER_WORK.load(SeqCst),
        TOS_AT_ENTRY.load(SeqCst),
        "with FREEZE_LBRS_ON_PMI the LBR stack is frozen in the handler"
    );
    check!(!DELIVERY_RECORDED.load(SeqCst), "with FREEZE_LBRS_ON_PMI the PMI's own delivery is not recorded");
    if version >= 4 {
        check!(
            STATUS_IN_HANDLER.load(SeqCst) & GLOBAL_STATUS_LBR_FRZ != 0,
            "v4+: GLOBAL_STATUS.LBR_Frz is set in the handler"
        );
        check!(DEBUGCTL_IN_HANDLER.load(SeqCst) & DEBUGCTL_LBR != 0, "v4+: DEBUGCTL.LBR is left set");
        check_eq!(rdmsr(IA32_PERF_GLOBAL_STATUS) & GLOBAL_STATUS_LBR_FRZ, 0u64, "v4+: STATUS_RESET cleared LBR_Frz");
    } else {
        check_eq!(DEBUGCTL_IN_HANDLER.load(SeqCst) & DEBUGCTL_LBR, 0u64, "v2/v3: the PMI cleared DEBUGCTL.LBR");
    }
    idt::set_handler(APIC_PERFMON_VECTOR, pmi_handler);
    wrmsr(IA32_DEBUGCTL, 0);
}
