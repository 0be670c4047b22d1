//! The seed walkthrough's experiment 15-3: a counter written with its maximum overflows on the next instruction and the PMI handler runs once.
//!
//! IA32_PMC0 is written with 0xFFFFFFFF (sign-extended to the counter width, SDM 18.2.5) and
//! counts instructions with PERFEVTSEL.INT set. The first counted instruction wraps it; the LVT
//! performance-counter interrupt arrives right after that instruction (emon's precise backend has
//! zero skid). The handler checks GLOBAL_STATUS bit 0 is set and LVTPC is masked, clears the
//! status through GLOBAL_OVF_CTRL, unmasks LVTPC and sends EOI, as the walkthrough's handler does.
//! The experiment runs with a fixed vector (0x33, the walkthrough's APIC_PERFMON_VECTOR), with NMI
//! delivery, with a full-width write through IA32_A_PMC0 when FW_WRITE is set, and with LVTPC
//! masked (no interrupt, status still set).
#![no_std]
#![no_main]

use core::sync::atomic::{AtomicU64, Ordering::SeqCst};
use emon_guest::cpu::{enable_interrupts, rdmsr, wrmsr};
use emon_guest::pmu::{
    start_and_retire_one, Perfmon, APIC_PERFMON_VECTOR, EVENT_INSTRUCTIONS, EVTSEL_INSTRUCTIONS_INT, IA32_A_PMC0,
    IA32_PERFEVTSEL0, IA32_PERF_GLOBAL_CTRL, IA32_PERF_GLOBAL_OVF_CTRL, IA32_PERF_GLOBAL_STATUS, IA32_PMC0,
};
use emon_guest::{apic, check, check_eq, dec, idt, println, skip};

emon_guest::entry!(main);

const NMI_VECTOR: u8 = 2;

static HANDLED: AtomicU64 = AtomicU64::new(0);
static STATUS_IN_HANDLER: AtomicU64 = AtomicU64::new(0);
static LVTPC_IN_HANDLER: AtomicU64 = AtomicU64::new(0);
static INTERRUPTED_RIP: AtomicU64 = AtomicU64::new(0);
static VERSION: AtomicU64 = AtomicU64::new(0);

/// The walkthrough's perfmon_handler: record, clear the overflow, unmask LVTPC, EOI.
fn pmi_handler(regs: &mut idt::Regs) {
    HANDLED.fetch_add(1, SeqCst);
    INTERRUPTED_RIP.store(regs.rip, SeqCst);
    LVTPC_IN_HANDLER.store(apic::read(apic::LVT_PMC) as u64, SeqCst);
    if VERSION.load(SeqCst) >= 2 {
        let status = rdmsr(IA32_PERF_GLOBAL_STATUS);
        STATUS_IN_HANDLER.store(status, SeqCst);
        wrmsr(IA32_PERF_GLOBAL_OVF_CTRL, status & 0xFF); // RESET_COUNTER_OVERFLOW for the PMCs that overflowed
    }
    // Stop the counter so the rest of the handler does not overflow it again.
    wrmsr(IA32_PERFEVTSEL0, 0);
    apic::write(apic::LVT_PMC, apic::read(apic::LVT_PMC) & !apic::LVT_MASKED);
    if regs.vector != NMI_VECTOR as u64 {
        apic::eoi();
    }
}

struct Case {
    name: &'static str,
    lvtpc: u32,
    full_width: bool,
}

fn experiment(version: u32, width: u32, c: &Case) {
    HANDLED.store(0, SeqCst);
    STATUS_IN_HANDLER.store(0, SeqCst);
    apic::write(apic::LVT_PMC, c.lvtpc);
    let max = Perfmon::max(width as u8);
    if c.full_width {
        wrmsr(IA32_A_PMC0, max);
    } else {
        wrmsr(IA32_PMC0, 0xFFFF_FFFF); // sign-extends to the full width (seed listing 15-7)
    }
    check_eq!(rdmsr(IA32_PMC0), max, "{}: IA32_PMC0 holds its maximum", c.name);
    let expected_rip = if version >= 2 {
        wrmsr(IA32_PERFEVTSEL0, EVTSEL_INSTRUCTIONS_INT);
        start_and_retire_one(IA32_PERF_GLOBAL_CTRL, 1)
    } else {
        start_and_retire_one(IA32_PERFEVTSEL0, EVTSEL_INSTRUCTIONS_INT)
    };
    wrmsr(IA32_PERFEVTSEL0, 0);
    if version >= 2 {
        wrmsr(IA32_PERF_GLOBAL_CTRL, 0);
    }
    let masked = c.lvtpc & apic::LVT_MASKED != 0;
    if masked {
        check_eq!(HANDLED.load(SeqCst), 0u64, "{}: no PMI while LVTPC is masked", c.name);
        if version >= 2 {
            check!(rdmsr(IA32_PERF_GLOBAL_STATUS) & 1 != 0, "{}: GLOBAL_STATUS bit 0 set without a PMI", c.name);
            wrmsr(IA32_PERF_GLOBAL_OVF_CTRL, 1);
        }
        return;
    }
    check_eq!(HANDLED.load(SeqCst), 1u64, "{}: the PMI handler ran once", c.name);
    check_eq!(
        INTERRUPTED_RIP.load(SeqCst),
        expected_rip,
        "{}: the PMI arrived right after the overflowing instruction",
        c.name
    );
    check!(
        LVTPC_IN_HANDLER.load(SeqCst) & apic::LVT_MASKED as u64 != 0,
        "{}: LVTPC was masked on entry to the handler",
        c.name
    );
    check_eq!(apic::read(apic::LVT_PMC) & apic::LVT_MASKED, 0u32, "{}: the handler unmasked LVTPC", c.name);
    if version >= 2 {
        check!(STATUS_IN_HANDLER.load(SeqCst) & 1 != 0, "{}: GLOBAL_STATUS bit 0 set in the handler", c.name);
        check_eq!(rdmsr(IA32_PERF_GLOBAL_STATUS) & 1, 0u64, "{}: GLOBAL_OVF_CTRL cleared it", c.name);
    }
    // The counter wrapped to 0 and went on counting in the handler until it stopped it
    // (no FREEZE_PERFMON_ON_PMI here; see guest:freeze-on-pmi).
    let after = rdmsr(IA32_PMC0);
    check!(
        after > 0 && after < 1000,
        "{}: IA32_PMC0 wrapped and counted the handler's instructions ({})",
        c.name,
        dec(after)
    );
}

fn main(_boot: &emon_guest::BootInfo) -> i32 {
    let pmu = Perfmon::from_cpuid();
    let (version, gp, width) = (pmu.version as u32, pmu.gp, pmu.gp_width as u32);
    VERSION.store(version as u64, SeqCst);
    println!("pmi-overflow: perfmon v{version}, {gp} GP counters x {width} bits");
    if gp == 0 || !pmu.event_available(EVENT_INSTRUCTIONS) {
        skip!("PMI on counter overflow: no architectural instructions-retired event");
        return emon_guest::summary();
    }
    idt::set_handler(APIC_PERFMON_VECTOR, pmi_handler);
    idt::set_handler(NMI_VECTOR, pmi_handler);
    apic::enable();
    enable_interrupts();
    if version >= 2 {
        wrmsr(IA32_PERF_GLOBAL_CTRL, 0);
    }
    let fw_write = pmu.fw_write();
    let cases = [
        Case { name: "fixed vector 0x33", lvtpc: APIC_PERFMON_VECTOR as u32, full_width: false },
        Case { name: "NMI delivery", lvtpc: apic::LVT_DELIVERY_NMI, full_width: false },
        Case { name: "full-width write through IA32_A_PMC0", lvtpc: APIC_PERFMON_VECTOR as u32, full_width: true },
        Case { name: "LVTPC masked", lvtpc: apic::LVT_MASKED | APIC_PERFMON_VECTOR as u32, full_width: false },
    ];
    for c in &cases {
        if c.full_width && !fw_write {
            skip!("{}: IA32_PERF_CAPABILITIES.FW_WRITE is clear", c.name);
            continue;
        }
        experiment(version, width, c);
    }
    emon_guest::summary()
}
