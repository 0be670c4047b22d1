//! Freeze on PMI (SDM 17.4.7, the walkthrough experiment in the README): the counter advances inside a PMI handler, and does not with DEBUGCTL.FREEZE_PERFMON_ON_PMI.
//!
//! Two PMIs from IA32_PMC0 (written with its maximum, counting instructions with INT set). Inside
//! each handler, IA32_PMC0 is read, a known 104 instructions retire, and it is read again. The
//! first PMI runs without FREEZE_PERFMON_ON_PMI: the counter advances by exactly 104. The second
//! runs with IA32_DEBUGCTL[12] set: the counter is frozen in the handler. How it is frozen depends
//! on the version (SDM 18.2.4.1 and 17.4.7): v2/v3 clear IA32_PERF_GLOBAL_CTRL (the walkthrough's
//! Westmere); v4+ ("streamlined freeze") set IA32_PERF_GLOBAL_STATUS.CTR_Frz (bit 59) and leave
//! GLOBAL_CTRL alone, and software unfreezes through IA32_PERF_GLOBAL_STATUS_RESET.
#![no_std]
#![no_main]

use core::arch::asm;
use core::sync::atomic::{AtomicU64, Ordering::SeqCst};
use emon_guest::cpu::{enable_interrupts, rdmsr, wrmsr};
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
    CTRL_IN_HANDLER.store(rdmsr(IA32_PERF_GLOBAL_CTRL), SeqCst);
    let status = rdmsr(IA32_PERF_GLOBAL_STATUS);
    STATUS_IN_HANDLER.store(status, SeqCst);
    HANDLED.fetch_add(1, SeqCst);
    wrmsr(IA32_PERFEVTSEL0, 0);
    // Clear the overflow (and, v4+, CTR_Frz: unfreeze), as the walkthrough's handler does.
    wrmsr(IA32_PERF_GLOBAL_STATUS_RESET, status & (1 | GLOBAL_STATUS_CTR_FRZ));
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
    emon_guest::summary()
}
