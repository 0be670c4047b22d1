//! PEBS through the DS save area: records of a known loop checked against the instructions that triggered them (IP, EventingIP, registers, status, TSC), the counter reset, the absolute maximum and the threshold PMI with OvfBuffer.
//!
//! Where PEBS is presented (CPUID.01H:EDX.DS, IA32_MISC_ENABLE.PEBS_UNAVAILABLE clear; SDM Vol. 3B
//! 18.4.4 and 18.6.1.1, the seed's "PEBS Programming Environment"), the guest points IA32_DS_AREA
//! at a buffer management area of its own, makes IA32_PMC0 count instructions retired with
//! IA32_PEBS_ENABLE[0] set, and runs a loop of `dec rcx; jnz` with RCX counting down from a known
//! value and R14/R15 holding markers. The counter reset in the DS area is -(2K - 1), so after the
//! first assist every record is 2K instructions, K iterations, after the previous one: every
//! record must name the same instruction (EventingIP, format 2+), with RIP the instruction after
//! it (PEBS is trap-like, PERF_CAPABILITIES.PEBS_TRAP), RCX exactly K below the previous record's,
//! the markers intact, the record's status (formats 1-2: GLOBAL_STATUS, format 3: the applicable
//! counters) naming IA32_PMC0, and (format 3) a TSC that grows. The buffer holds 8 records: the
//! PEBS index stops at the absolute maximum and no record is written past it. The interrupt
//! threshold is the last record: its PMI sets GLOBAL_STATUS.OvfBuffer, and not the counter's own
//! overflow bit (the overflow armed PEBS instead of raising a PMI).
#![no_std]
#![no_main]

use core::arch::asm;
use core::sync::atomic::{AtomicU64, Ordering::SeqCst};
use emon_guest::cpu::{cpuid, disable_interrupts, enable_interrupts, rdmsr, wrmsr};
use emon_guest::pmu::{
    Perfmon, APIC_PERFMON_VECTOR, EVENT_INSTRUCTIONS, IA32_DS_AREA, IA32_MISC_ENABLE, IA32_PEBS_ENABLE,
    IA32_PERFEVTSEL0, IA32_PERF_GLOBAL_CTRL, IA32_PERF_GLOBAL_STATUS, IA32_PERF_GLOBAL_STATUS_RESET, IA32_PMC0,
    PERFEVTSEL_EN, PERFEVTSEL_OS,
};
use emon_guest::{apic, check, check_eq, idt, println, skip, BootInfo};

emon_guest::entry!(main);

const MISC_ENABLE_PEBS_UNAVAILABLE: u64 = 1 << 12;
const GLOBAL_STATUS_OVF_BUFFER: u64 = 1 << 62;
/// Instructions retired, OS only, no PMI of its own.
const EVTSEL_INSTRUCTIONS_OS: u64 = PERFEVTSEL_EN | PERFEVTSEL_OS | 0xC0;
/// Loop iterations between two records.
const K: u64 = 10;
/// Records the buffer holds.
const RECORDS: usize = 8;
/// The largest record emon writes (format 3).
const MAX_RECORD: usize = 0xC8;
const MARKER_R14: u64 = 0x5EB5_0000_0000_0F14;
const MARKER_R15: u64 = 0x5EB5_0000_0000_0F15;

/// The DS buffer management area (Figure 18-22) and the PEBS buffer, with room for one record
/// past the absolute maximum that must stay untouched.
#[repr(C, align(4096))]
struct Ds {
    area: [u64; 16],
    pebs: [u8; (RECORDS + 1) * MAX_RECORD],
}

static mut DS: Ds = Ds { area: [0; 16], pebs: [0; (RECORDS + 1) * MAX_RECORD] };

static PMIS: AtomicU64 = AtomicU64::new(0);
static STATUS_IN_PMI: AtomicU64 = AtomicU64::new(0);

fn pmi_handler(_regs: &mut idt::Regs) {
    let status = rdmsr(IA32_PERF_GLOBAL_STATUS);
    STATUS_IN_PMI.store(status, SeqCst);
    PMIS.fetch_add(1, SeqCst);
    // Stop PEBS and counting, then clear what the PMI reported.
    wrmsr(IA32_PEBS_ENABLE, 0);
    wrmsr(IA32_PERF_GLOBAL_CTRL, 0);
    wrmsr(IA32_PERF_GLOBAL_STATUS_RESET, status);
    apic::write(apic::LVT_PMC, apic::read(apic::LVT_PMC) & !apic::LVT_MASKED);
    apic::eoi();
}

/// The loop the counter samples: RCX counts down from `iterations`; R14 and R15 hold markers.
/// Returns the addresses of its two instructions.
fn sampled_loop(iterations: u64) -> (u64, u64) {
    let (dec, jnz): (u64, u64);
    // SAFETY: a register-only loop; every register it touches is declared.
    unsafe {
        asm!(
            "lea {dec}, [rip + 2f]",
            "lea {jnz}, [rip + 3f]",
            "mov r14, {m1}",
            "mov r15, {m2}",
            "mov ecx, 0x38F",
            "mov eax, 1",
            "xor edx, edx",
            "wrmsr",             // IA32_PERF_GLOBAL_CTRL = PMC0: counting starts
            "mov rcx, {n}",
            "2: dec rcx",
            "3: jnz 2b",
            "mov ecx, 0x38F",
            "xor eax, eax",
            "wrmsr",
            dec = out(reg) dec,
            jnz = out(reg) jnz,
            m1 = in(reg) MARKER_R14,
            m2 = in(reg) MARKER_R15,
            n = in(reg) iterations,
            out("rax") _, out("rcx") _, out("rdx") _, out("r14") _, out("r15") _,
        );
    }
    (dec, jnz)
}

fn word(record: &[u8], offset: usize) -> u64 {
    u64::from_le_bytes(record[offset..offset + 8].try_into().expect("8 bytes"))
}

fn main(_boot: &BootInfo) -> i32 {
    let pmu = Perfmon::from_cpuid();
    let ds_cpuid = cpuid(1, 0).edx & (1 << 21) != 0;
    let misc = rdmsr(IA32_MISC_ENABLE);
    let available = misc & MISC_ENABLE_PEBS_UNAVAILABLE == 0;
    // emon sets CPUID.01H:EDX.DS where it presents PEBS; a host may still hide it from the
    // guest (the run summary then says NOT AS PROFILED), so only MISC_ENABLE decides here.
    println!("CPUID.01H:EDX.DS = {}, MISC_ENABLE.PEBS_UNAVAILABLE = {}", ds_cpuid, !available);
    if pmu.version == 0 || !pmu.event_available(EVENT_INSTRUCTIONS) {
        skip!("PEBS: no architectural perfmon with the instructions-retired event");
        return emon_guest::summary();
    }
    if !available {
        skip!("PEBS unavailable according to MISC_ENABLE");
        return emon_guest::summary();
    }
    let caps = pmu.perf_capabilities().unwrap_or(0);
    let format = ((caps >> 8) & 0xF) as u8;
    let size = match format {
        0 => 0x90,
        1 => 0xB0,
        2 => 0xC0,
        3 => 0xC8,
        _ => {
            check!(false, "PEBS is presented only in a format emon writes (got format {})", format);
            return emon_guest::summary();
        }
    };
    println!("PEBS format {} ({:#x}-byte records), PEBS_TRAP {}", format, size, caps >> 6 & 1);
    check!(caps & (1 << 6) != 0, "PERF_CAPABILITIES.PEBS_TRAP: records hold the state after the instruction");

    // The DS area: PEBS buffer base = index, absolute maximum after RECORDS records, interrupt
    // threshold at the last one; counter 0 reloads -(2K - 1).
    let ds = &raw mut DS;
    // SAFETY: the guest's own statics, single CPU, not in use by PEBS yet.
    let (area, base) = unsafe { ((*ds).area.as_mut_ptr(), (*ds).pebs.as_ptr() as u64) };
    let absmax = base + RECORDS as u64 * size;
    let reset = (2 * K - 1).wrapping_neg();
    let fields = [0, 0, 0, 0, base, base, absmax, absmax, reset];
    for (i, v) in fields.into_iter().enumerate() {
        // SAFETY: within the area.
        unsafe { area.add(i).write_volatile(v) };
    }
    idt::set_handler(APIC_PERFMON_VECTOR, pmi_handler);
    apic::enable();
    apic::write(apic::LVT_PMC, APIC_PERFMON_VECTOR as u32);
    wrmsr(IA32_DS_AREA, area as u64);
    // The first overflow 100 instructions in, as a 32-bit legacy write sign-extends.
    wrmsr(IA32_PMC0, 100u64.wrapping_neg() & 0xFFFF_FFFF);
    wrmsr(IA32_PERFEVTSEL0, EVTSEL_INSTRUCTIONS_OS);
    wrmsr(IA32_PEBS_ENABLE, 1);
    let iterations = 1000;
    disable_interrupts();
    let (dec, jnz) = sampled_loop(iterations);
    wrmsr(IA32_PEBS_ENABLE, 0);
    let status_before_pmi = rdmsr(IA32_PERF_GLOBAL_STATUS);
    enable_interrupts();
    wrmsr(IA32_PERFEVTSEL0, 0);

    // SAFETY: PEBS is off; the guest reads what emon wrote.
    let (index, pebs) = unsafe { ((*ds).area[5], &(*ds).pebs) };
    check_eq!(index, absmax, "the PEBS index stopped at the absolute maximum");
    check!(pebs[RECORDS * size as usize..].iter().all(|&b| b == 0), "nothing is written past the absolute maximum");
    check_eq!(status_before_pmi & 1, 0u64, "PMC0's overflows armed PEBS instead of setting its overflow bit");
    check!(
        status_before_pmi & GLOBAL_STATUS_OVF_BUFFER != 0,
        "reaching the interrupt threshold set GLOBAL_STATUS.OvfBuffer"
    );
    check_eq!(PMIS.load(SeqCst), 1u64, "one PMI at the interrupt threshold");
    check!(STATUS_IN_PMI.load(SeqCst) & GLOBAL_STATUS_OVF_BUFFER != 0, "the PMI handler sees OvfBuffer");

    let mut previous: Option<(u64, u64, u64)> = None; // (eventing IP, RCX, TSC)
    for n in 0..RECORDS {
        let r = &pebs[n * size as usize..(n + 1) * size as usize];
        let (rip, rcx) = (word(r, 0x08), word(r, 0x20));
        // Trap-like: RIP follows the instruction that counted the event.
        let eventing = if rip == jnz { dec } else { jnz };
        let in_loop = rip == jnz || rip == dec || rip == jnz + 2;
        let markers = word(r, 0x80) == MARKER_R14 && word(r, 0x88) == MARKER_R15;
        let mut ok = in_loop && markers;
        if format >= 1 {
            ok &= word(r, 0x90) & 1 != 0;
        }
        if format >= 2 {
            ok &= word(r, 0xB0) == eventing;
        }
        let tsc = if format >= 3 { word(r, 0xC0) } else { 0 };
        if let Some((prev_ip, prev_rcx, prev_tsc)) = previous {
            ok &= eventing == prev_ip && prev_rcx.wrapping_sub(rcx) == K;
            ok &= format < 3 || tsc > prev_tsc;
        }
        if !ok {
            println!(
                "  record {}: RIP {:#x} RCX {} R14 {:#x} R15 {:#x} status {:#x} EventingIP {:#x} TSC {}; loop at {:#x}/{:#x}",
                n,
                rip,
                rcx,
                word(r, 0x80),
                word(r, 0x88),
                if format >= 1 { word(r, 0x90) } else { 0 },
                if format >= 2 { word(r, 0xB0) } else { 0 },
                tsc,
                dec,
                jnz
            );
        }
        check!(ok, "record {}: the sampled instruction, {} iterations after the one before", n, K);
        previous = Some((eventing, rcx, tsc));
    }
    wrmsr(IA32_DS_AREA, 0);
    emon_guest::summary()
}
