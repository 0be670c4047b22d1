//! Overflow and PMI (the walkthrough experiment in the README): a counter written with its maximum overflows on the next instruction and the PMI handler runs once.
//!
//! IA32_PMC0 is written with 0xFFFFFFFF (sign-extended to the counter width, SDM 18.2.5) and
//! counts instructions with PERFEVTSEL.INT set. The first counted instruction wraps it; the LVT
//! performance-counter interrupt arrives right after that instruction (emon's precise backend has
//! zero skid). The handler checks GLOBAL_STATUS bit 0 is set and LVTPC is masked, clears the
//! status through GLOBAL_OVF_CTRL, unmasks LVTPC and sends EOI, as the walkthrough's handler does.
//! The experiment runs with a fixed vector (0x33, the walkthrough's APIC_PERFMON_VECTOR), with NMI
//! delivery, with a full-width write through IA32_A_PMC0 when FW_WRITE is set, and with LVTPC
//! masked (no interrupt, status still set).
//!
//! Then sampling as Linux's perf does it: instructions with a period, PMIs as NMIs while the
//! counted loop runs with interrupts disabled, each handler reloading the counter and going on.
//! Every period gives one PMI, each right after the overflowing instruction.
#![no_std]
#![no_main]

use core::sync::atomic::{AtomicU64, Ordering::SeqCst};
use emon_guest::cpu::{enable_interrupts, rdmsr, wrmsr};
use emon_guest::pmu::{
    measured_block, start_and_retire_one, Perfmon, APIC_PERFMON_VECTOR, EVENT_CORE_CYCLES, EVENT_INSTRUCTIONS,
    IA32_A_PMC0, IA32_PERFEVTSEL0, IA32_PERF_GLOBAL_CTRL, IA32_PERF_GLOBAL_OVF_CTRL, IA32_PERF_GLOBAL_STATUS,
    IA32_PMC0, PERFEVTSEL_EN, PERFEVTSEL_INT, PERFEVTSEL_OS, PERFEVTSEL_USR,
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

/// How the backend counts an event: exactly (emon's precise backend), approximately (host perf
/// events), or not at all (the host cannot count it).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Counting {
    Exact,
    Approximate,
    No,
}

/// Counts the measured block (2N+8 instructions, 3N+108 cycles under the precise model).
fn probe(version: u8, event: u64) -> Counting {
    const N: u32 = 20;
    wrmsr(IA32_PMC0, 0);
    let got = if version >= 2 {
        wrmsr(IA32_PERFEVTSEL0, PERFEVTSEL_EN | PERFEVTSEL_OS | PERFEVTSEL_USR | event);
        measured_block(N, IA32_PERF_GLOBAL_CTRL, 1, IA32_PERF_GLOBAL_CTRL, 0);
        rdmsr(IA32_PMC0)
    } else {
        let sel = PERFEVTSEL_OS | PERFEVTSEL_USR | event;
        measured_block(N, IA32_PERFEVTSEL0, sel | PERFEVTSEL_EN, IA32_PERFEVTSEL0, sel);
        rdmsr(IA32_PMC0)
    };
    wrmsr(IA32_PERFEVTSEL0, 0);
    if got == exact_for(event, N) {
        Counting::Exact
    } else if got > 0 {
        Counting::Approximate
    } else {
        Counting::No
    }
}

fn exact_for(event: u64, n: u32) -> u64 {
    let n = n as u64;
    if event == EVENT_SELECT_INSTRUCTIONS {
        2 * n + 8
    } else {
        3 * n + 108
    }
}

const EVENT_SELECT_INSTRUCTIONS: u64 = 0xC0;
const EVENT_SELECT_CYCLES: u64 = 0x3C;

/// Waits, boundedly, for a PMI that arrives with skid (host perf events).
fn wait_for_pmi() {
    for _ in 0..50_000_000u64 {
        if HANDLED.load(SeqCst) != 0 {
            return;
        }
        core::hint::spin_loop();
    }
}

fn experiment(version: u32, width: u32, event: (&str, u64), counting: Counting, c: &Case) {
    let (ev, select) = event;
    HANDLED.store(0, SeqCst);
    STATUS_IN_HANDLER.store(0, SeqCst);
    apic::write(apic::LVT_PMC, c.lvtpc);
    let max = Perfmon::max(width as u8);
    if c.full_width {
        wrmsr(IA32_A_PMC0, max);
    } else {
        wrmsr(IA32_PMC0, 0xFFFF_FFFF); // sign-extends to the full width (seed listing 15-7)
    }
    check_eq!(rdmsr(IA32_PMC0), max, "{} {}: IA32_PMC0 holds its maximum", ev, c.name);
    let evtsel = PERFEVTSEL_EN | PERFEVTSEL_INT | PERFEVTSEL_OS | PERFEVTSEL_USR | select;
    let expected_rip = if version >= 2 {
        wrmsr(IA32_PERFEVTSEL0, evtsel);
        start_and_retire_one(IA32_PERF_GLOBAL_CTRL, 1)
    } else {
        start_and_retire_one(IA32_PERFEVTSEL0, evtsel)
    };
    if counting != Counting::Exact && c.lvtpc & apic::LVT_MASKED == 0 {
        wait_for_pmi();
    } else if counting != Counting::Exact {
        // Masked: give the host event time to overflow.
        for _ in 0..2_000_000u64 {
            core::hint::spin_loop();
        }
    }
    wrmsr(IA32_PERFEVTSEL0, 0);
    if version >= 2 {
        wrmsr(IA32_PERF_GLOBAL_CTRL, 0);
    }
    let masked = c.lvtpc & apic::LVT_MASKED != 0;
    if masked {
        check_eq!(HANDLED.load(SeqCst), 0u64, "{} {}: no PMI while LVTPC is masked", ev, c.name);
        if version >= 2 {
            check!(rdmsr(IA32_PERF_GLOBAL_STATUS) & 1 != 0, "{} {}: GLOBAL_STATUS bit 0 set without a PMI", ev, c.name);
            wrmsr(IA32_PERF_GLOBAL_OVF_CTRL, 1);
        }
        return;
    }
    check_eq!(HANDLED.load(SeqCst), 1u64, "{} {}: the PMI handler ran once", ev, c.name);
    if counting == Counting::Exact {
        check_eq!(
            INTERRUPTED_RIP.load(SeqCst),
            expected_rip,
            "{} {}: the PMI arrived right after the overflowing instruction",
            ev,
            c.name
        );
    }
    check!(
        LVTPC_IN_HANDLER.load(SeqCst) & apic::LVT_MASKED as u64 != 0,
        "{} {}: LVTPC was masked on entry to the handler",
        ev,
        c.name
    );
    check_eq!(apic::read(apic::LVT_PMC) & apic::LVT_MASKED, 0u32, "{} {}: the handler unmasked LVTPC", ev, c.name);
    if version >= 2 {
        check!(STATUS_IN_HANDLER.load(SeqCst) & 1 != 0, "{} {}: GLOBAL_STATUS bit 0 set in the handler", ev, c.name);
        check_eq!(rdmsr(IA32_PERF_GLOBAL_STATUS) & 1, 0u64, "{} {}: GLOBAL_OVF_CTRL cleared it", ev, c.name);
    }
    // The counter wrapped to 0 and went on counting in the handler until it stopped it
    // (no FREEZE_PERFMON_ON_PMI here; see guest:freeze-on-pmi).
    let after = rdmsr(IA32_PMC0);
    let bound = if counting == Counting::Exact { 1000 } else { 1 << 40 };
    check!(
        after > 0 && after < bound,
        "{} {}: IA32_PMC0 wrapped and counted on in the handler ({})",
        ev,
        c.name,
        dec(after)
    );
}

/// Sampling: the period, and the loop's iterations (`dec; jnz`, two instructions each).
const PERIOD: u64 = 10_000;
const SAMPLED_ITERATIONS: u64 = 100_000;

static SAMPLES: AtomicU64 = AtomicU64::new(0);
/// IA32_PMC0 at each handler's entry: what was counted since the overflow (the handler's entry
/// code), the same every time when the PMI has zero skid; u64::MAX once two differed.
static COUNT_AT_ENTRY: AtomicU64 = AtomicU64::new(0);
static LOOP_START: AtomicU64 = AtomicU64::new(0);
static LOOP_END: AtomicU64 = AtomicU64::new(0);
static OUTSIDE_LOOP: AtomicU64 = AtomicU64::new(0);

/// A perf-style sampling handler: note the sample, reload the counter with -PERIOD, clear the
/// overflow, unmask LVTPC; the counter keeps counting.
fn sampling_handler(regs: &mut idt::Regs) {
    let at_entry = rdmsr(IA32_PMC0);
    let n = SAMPLES.fetch_add(1, SeqCst);
    if n == 0 {
        COUNT_AT_ENTRY.store(at_entry, SeqCst);
    } else if COUNT_AT_ENTRY.load(SeqCst) != at_entry {
        COUNT_AT_ENTRY.store(u64::MAX, SeqCst);
    }
    if !(LOOP_START.load(SeqCst)..LOOP_END.load(SeqCst)).contains(&regs.rip) {
        OUTSIDE_LOOP.fetch_add(1, SeqCst);
    }
    wrmsr(IA32_PMC0, PERIOD.wrapping_neg() & 0xFFFF_FFFF); // sign-extends (SDM 18.2.5)
    wrmsr(IA32_PERF_GLOBAL_OVF_CTRL, 1);
    apic::write(apic::LVT_PMC, apic::read(apic::LVT_PMC) & !apic::LVT_MASKED);
}

/// Counts `SAMPLED_ITERATIONS` of `dec; jnz` with interrupts disabled, sampling every PERIOD
/// instructions through NMIs.
fn sampling(counting: Counting) {
    SAMPLES.store(0, SeqCst);
    OUTSIDE_LOOP.store(0, SeqCst);
    idt::set_handler(NMI_VECTOR, sampling_handler);
    apic::write(apic::LVT_PMC, apic::LVT_DELIVERY_NMI);
    wrmsr(IA32_PMC0, PERIOD.wrapping_neg() & 0xFFFF_FFFF);
    wrmsr(
        IA32_PERFEVTSEL0,
        PERFEVTSEL_EN | PERFEVTSEL_INT | PERFEVTSEL_OS | PERFEVTSEL_USR | EVENT_SELECT_INSTRUCTIONS,
    );
    // SAFETY: PMU MSRs and a register-only loop; the NMIs return to it.
    unsafe {
        core::arch::asm!(
            "lea {start}, [rip + 2f]",
            "lea {end}, [rip + 3f]",
            "mov [{ls}], {start}",
            "mov [{le}], {end}",
            "cli",
            "mov ecx, 0x38F",
            "mov eax, 1",
            "xor edx, edx",
            "wrmsr",
            "mov {n}, {iterations}",
            "2: dec {n}",
            "jnz 2b",
            "3: mov ecx, 0x38F",
            "xor eax, eax",
            "xor edx, edx",
            "wrmsr",
            "sti",
            start = out(reg) _,
            end = out(reg) _,
            ls = in(reg) LOOP_START.as_ptr(),
            le = in(reg) LOOP_END.as_ptr(),
            iterations = in(reg) SAMPLED_ITERATIONS,
            n = out(reg) _,
            out("eax") _, out("ecx") _, out("edx") _,
        );
    }
    wrmsr(IA32_PERFEVTSEL0, 0);
    idt::set_handler(NMI_VECTOR, pmi_handler);
    let samples = SAMPLES.load(SeqCst);
    let (lo, hi) = (2 * SAMPLED_ITERATIONS / PERIOD, 2 * SAMPLED_ITERATIONS / PERIOD + 2);
    check!(
        (lo..=hi).contains(&samples),
        "sampling: {} NMIs for {} instructions at a period of {} (want {}..{})",
        dec(samples),
        dec(2 * SAMPLED_ITERATIONS),
        dec(PERIOD),
        dec(lo),
        dec(hi)
    );
    check_eq!(OUTSIDE_LOOP.load(SeqCst), 0u64, "sampling: every NMI interrupted the counted loop");
    if counting == Counting::Exact {
        let at_entry = COUNT_AT_ENTRY.load(SeqCst);
        check!(
            at_entry != u64::MAX && at_entry < 1000,
            "sampling: every NMI arrived right after its overflow (the handler's entry counted {} instructions each time)",
            dec(at_entry)
        );
    }
}

fn main(_boot: &emon_guest::BootInfo) -> i32 {
    let pmu = Perfmon::from_cpuid();
    let (version, gp, width) = (pmu.version as u32, pmu.gp, pmu.gp_width as u32);
    VERSION.store(version as u64, SeqCst);
    println!("pmi-overflow: perfmon v{version}, {gp} GP counters x {width} bits");
    if gp == 0 {
        skip!("PMI on counter overflow: no general-purpose counters");
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
    let events = [
        ("instructions", EVENT_SELECT_INSTRUCTIONS, EVENT_INSTRUCTIONS),
        ("cycles", EVENT_SELECT_CYCLES, EVENT_CORE_CYCLES),
    ];
    for (ev, select, bit) in events {
        if !pmu.event_available(bit) {
            skip!("{}: the architectural event is unavailable (CPUID.0AH:EBX)", ev);
            continue;
        }
        let counting = probe(pmu.version, select);
        match counting {
            Counting::No => {
                skip!("{}: this backend cannot count it here (the counter stays 0)", ev);
                continue;
            }
            Counting::Exact => println!("{ev}: counted exactly: the PMI must arrive with zero skid"),
            Counting::Approximate => println!("{ev}: counted approximately: the PMI may arrive with skid"),
        }
        for c in &cases {
            if c.full_width && !fw_write {
                skip!("{} {}: IA32_PERF_CAPABILITIES.FW_WRITE is clear", ev, c.name);
                continue;
            }
            experiment(version, width, (ev, select), counting, c);
        }
        if select == EVENT_SELECT_INSTRUCTIONS {
            if version >= 2 {
                sampling(counting);
            } else {
                skip!("sampling: the loop is started through IA32_PERF_GLOBAL_CTRL (perfmon v2)");
            }
        }
    }
    emon_guest::summary()
}
