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
    Perfmon, APIC_PERFMON_VECTOR, EVENT_INSTRUCTIONS, FIXED_EN_OS, IA32_DS_AREA, IA32_FIXED_CTR0, IA32_FIXED_CTR_CTRL,
    IA32_MISC_ENABLE, IA32_PEBS_ENABLE, IA32_PERFEVTSEL0, IA32_PERF_GLOBAL_CTRL, IA32_PERF_GLOBAL_STATUS,
    IA32_PERF_GLOBAL_STATUS_RESET, IA32_PMC0, PERFEVTSEL_EN, PERFEVTSEL_OS,
};
use emon_guest::{apic, check, check_eq, idt, println, skip, BootInfo};

emon_guest::entry!(main);

const MISC_ENABLE_PEBS_UNAVAILABLE: u64 = 1 << 12;
const GLOBAL_STATUS_OVF_BUFFER: u64 = 1 << 62;
/// Instructions retired, OS only, no PMI of its own.
const EVTSEL_INSTRUCTIONS_OS: u64 = PERFEVTSEL_EN | PERFEVTSEL_OS | 0xC0;
/// IA32_PERFEVTSELx.Adaptive_Record (bit 34) and IA32_FIXED_CTR_CTRL.FC0_Adaptive_Record (bit 32).
const PERFEVTSEL_ADAPTIVE: u64 = 1 << 34;
const FIXED0_ADAPTIVE: u64 = 1 << 32;
/// Loop iterations between two records.
const K: u64 = 10;
/// Records the buffer holds.
const RECORDS: usize = 8;
/// The largest record emon writes here (format 4 with every group and 4 LBR entries).
const MAX_RECORD: usize = 0x20 + 0x20 + 0x90 + 0x100 + 4 * 0x18;
const MARKER_R14: u64 = 0x5EB5_0000_0000_0F14;
const MARKER_R15: u64 = 0x5EB5_0000_0000_0F15;

/// The DS buffer management area (Figure 18-22, with the PEBS counter resets of 8 GP and 4 fixed
/// counters) and the PEBS buffer, with room for one record past the absolute maximum that must
/// stay untouched.
#[repr(C, align(4096))]
struct Ds {
    area: [u64; 20],
    pebs: [u8; (RECORDS + 1) * MAX_RECORD],
}

static mut DS: Ds = Ds { area: [0; 20], pebs: [0; (RECORDS + 1) * MAX_RECORD] };

/// The counter a run samples with: IA32_PMC0, or (adaptive PEBS) IA32_FIXED_CTR0; both count
/// instructions retired at CPL 0.
#[derive(Clone, Copy, PartialEq)]
enum Sampler {
    Pmc0,
    FixedCtr0,
}

impl Sampler {
    /// Its bit in IA32_PEBS_ENABLE, IA32_PERF_GLOBAL_CTRL and GLOBAL_STATUS.
    fn bit(self) -> u64 {
        match self {
            Sampler::Pmc0 => 1,
            Sampler::FixedCtr0 => 1 << 32,
        }
    }

    /// Its PEBS counter reset's index in the DS area (0x40 + 8i, or 0x80 + 8i for fixed counter i).
    fn reset_slot(self) -> usize {
        match self {
            Sampler::Pmc0 => 8,
            Sampler::FixedCtr0 => 16,
        }
    }

    /// Starts it 100 instructions before its first overflow, counting with Adaptive_Record as
    /// `adaptive` says.
    fn program(self, adaptive: bool) {
        match self {
            // A 32-bit legacy write sign-extends.
            Sampler::Pmc0 => {
                wrmsr(IA32_PMC0, 100u64.wrapping_neg() & 0xFFFF_FFFF);
                wrmsr(IA32_PERFEVTSEL0, EVTSEL_INSTRUCTIONS_OS | if adaptive { PERFEVTSEL_ADAPTIVE } else { 0 });
            }
            // Fixed counters take the low 48 bits (their width under every profile with PEBS).
            Sampler::FixedCtr0 => {
                wrmsr(IA32_FIXED_CTR0, 100u64.wrapping_neg() & ((1 << 48) - 1));
                wrmsr(IA32_FIXED_CTR_CTRL, FIXED_EN_OS | if adaptive { FIXED0_ADAPTIVE } else { 0 });
            }
        }
    }

    fn stop(self) {
        match self {
            Sampler::Pmc0 => wrmsr(IA32_PERFEVTSEL0, 0),
            Sampler::FixedCtr0 => wrmsr(IA32_FIXED_CTR_CTRL, 0),
        }
    }
}

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

/// The loop the counter samples: IA32_PERF_GLOBAL_CTRL = `ctrl` around it, RCX counts down from
/// `iterations`; R14 and R15 hold markers. Returns the addresses of its two instructions.
fn sampled_loop(ctrl: u64, iterations: u64) -> (u64, u64) {
    let (dec, jnz): (u64, u64);
    // SAFETY: a register-only loop; every register it touches is declared.
    unsafe {
        asm!(
            "lea {dec}, [rip + 2f]",
            "lea {jnz}, [rip + 3f]",
            "mov r14, {m1}",
            "movq xmm0, r14",
            "mov r15, {m2}",
            "mov ecx, 0x38F",
            "mov eax, {lo:e}",
            "mov edx, {hi:e}",
            "wrmsr",             // IA32_PERF_GLOBAL_CTRL = the sampler: counting starts
            "mov rcx, {n}",
            "2: dec rcx",
            "3: jnz 2b",
            "mov ecx, 0x38F",
            "xor eax, eax",
            "xor edx, edx",
            "wrmsr",
            dec = out(reg) dec,
            jnz = out(reg) jnz,
            m1 = in(reg) MARKER_R14,
            m2 = in(reg) MARKER_R15,
            n = in(reg) iterations,
            lo = in(reg) ctrl & 0xFFFF_FFFF,
            hi = in(reg) ctrl >> 32,
            out("rax") _, out("rcx") _, out("rdx") _, out("r14") _, out("r15") _, out("xmm0") _,
        );
    }
    (dec, jnz)
}

fn word(record: &[u8], offset: usize) -> u64 {
    u64::from_le_bytes(record[offset..offset + 8].try_into().expect("8 bytes"))
}

const IA32_DEBUGCTL: u32 = 0x1D9;
const MSR_PEBS_DATA_CFG: u32 = 0x3F2;
/// MSR_PEBS_DATA_CFG groups (SDM 18.9.2.2) and the LBR entry count field.
const CFG_MEMINFO: u64 = 1 << 0;
const CFG_GPRS: u64 = 1 << 1;
const CFG_XMMS: u64 = 1 << 2;
const CFG_LBRS: u64 = 1 << 3;
const CFG_LBR_SHIFT: u32 = 24;

/// Where a record's fields are, by format (and, for the adaptive format 4, MSR_PEBS_DATA_CFG).
#[derive(Default)]
struct Fields {
    size: u64,
    /// Format 4: the basic group's format and size word.
    format_size: Option<u64>,
    rip: Option<usize>,
    rcx: Option<usize>,
    r14: Option<usize>,
    r15: Option<usize>,
    status: Option<usize>,
    eventing_ip: Option<usize>,
    tsc: Option<usize>,
    xmm0: Option<usize>,
    /// The newest LBR entry's FROM_IP; its TO_IP follows.
    lbr0: Option<usize>,
}

impl Fields {
    /// Formats 0-3: RFLAGS, RIP, RAX..R15, then status (1+), EventingIP (2+) and TSC (3).
    fn legacy(format: u8) -> Option<Fields> {
        let size = [0x90, 0xB0, 0xC0, 0xC8].get(usize::from(format))?;
        Some(Fields {
            size: *size,
            rip: Some(0x08),
            rcx: Some(0x20),
            r14: Some(0x80),
            r15: Some(0x88),
            status: (format >= 1).then_some(0x90),
            eventing_ip: (format >= 2).then_some(0xB0),
            tsc: (format >= 3).then_some(0xC0),
            ..Fields::default()
        })
    }

    /// Format 4: the basic group (format and size, IP, applicable counters, TSC), then memory
    /// info, GPRs (RFLAGS, RIP, RAX, RCX, RDX, RBX, RSP, RBP, RSI, RDI, R8-R15), XMMs and LBRs.
    fn adaptive(cfg: u64) -> Fields {
        let mut f = Fields { eventing_ip: Some(0x08), status: Some(0x10), tsc: Some(0x18), ..Fields::default() };
        let mut at = 0x20;
        if cfg & CFG_MEMINFO != 0 {
            at += 0x20;
        }
        if cfg & CFG_GPRS != 0 {
            (f.rip, f.rcx, f.r14, f.r15) = (Some(at + 0x08), Some(at + 0x18), Some(at + 0x80), Some(at + 0x88));
            at += 0x90;
        }
        if cfg & CFG_XMMS != 0 {
            f.xmm0 = Some(at);
            at += 0x100;
        }
        if cfg & CFG_LBRS != 0 {
            f.lbr0 = Some(at);
            at += 0x18 * (((cfg >> CFG_LBR_SHIFT) & 0xFF) as usize + 1);
        }
        f.size = at as u64;
        f.format_size = Some(f.size << 48 | cfg);
        f
    }
}

/// One sampling run: the DS area, `sampler` counting instructions with PEBS (and in format 4 the
/// record groups `cfg`, which its records take when `adaptive`: `f` says where the fields are),
/// the loop, and every record checked.
fn sample(what: (&str, u64), (format, cfg, adaptive): (u8, u64, bool), sampler: Sampler, f: &Fields) {
    let size = f.size;
    // The DS area: PEBS buffer base = index, absolute maximum after RECORDS records, interrupt
    // threshold at the last one; the sampler reloads -(2K - 1).
    let ds = &raw mut DS;
    // SAFETY: the guest's own statics, single CPU, not in use by PEBS now.
    let (area, base) = unsafe {
        (*ds).pebs.fill(0);
        ((*ds).area.as_mut_ptr(), (*ds).pebs.as_ptr() as u64)
    };
    let absmax = base + RECORDS as u64 * size;
    let reset = (2 * K - 1).wrapping_neg();
    let mut fields = [0; 20];
    fields[4..8].copy_from_slice(&[base, base, absmax, absmax]);
    fields[sampler.reset_slot()] = reset;
    for (i, v) in fields.into_iter().enumerate() {
        // SAFETY: within the area.
        unsafe { area.add(i).write_volatile(v) };
    }
    PMIS.store(0, SeqCst);
    wrmsr(IA32_DS_AREA, area as u64);
    if format >= 4 {
        wrmsr(MSR_PEBS_DATA_CFG, cfg);
    }
    let lbr = cfg & CFG_LBRS != 0;
    sampler.program(adaptive);
    wrmsr(IA32_PEBS_ENABLE, sampler.bit());
    disable_interrupts();
    if lbr {
        wrmsr(IA32_DEBUGCTL, 1);
    }
    let (dec, jnz) = sampled_loop(sampler.bit(), 1000);
    wrmsr(IA32_DEBUGCTL, 0);
    wrmsr(IA32_PEBS_ENABLE, 0);
    let status_before_pmi = rdmsr(IA32_PERF_GLOBAL_STATUS);
    enable_interrupts();
    sampler.stop();

    // SAFETY: PEBS is off; the guest reads what emon wrote.
    let (index, pebs) = unsafe { ((*ds).area[5], &(*ds).pebs) };
    check_eq!(index, absmax, "{} {:#x}: the PEBS index stopped at the absolute maximum", what.0, what.1);
    check!(
        pebs[RECORDS * size as usize..].iter().all(|&b| b == 0),
        "{} {:#x}: nothing is written past the absolute maximum",
        what.0,
        what.1
    );
    check_eq!(
        status_before_pmi & sampler.bit(),
        0u64,
        "{} {:#x}: the counter's overflows armed PEBS instead of setting its overflow bit",
        what.0,
        what.1
    );
    check!(
        status_before_pmi & GLOBAL_STATUS_OVF_BUFFER != 0,
        "{} {:#x}: reaching the interrupt threshold set GLOBAL_STATUS.OvfBuffer",
        what.0,
        what.1
    );
    check_eq!(PMIS.load(SeqCst), 1u64, "{} {:#x}: one PMI at the interrupt threshold", what.0, what.1);
    check!(
        STATUS_IN_PMI.load(SeqCst) & GLOBAL_STATUS_OVF_BUFFER != 0,
        "{} {:#x}: the PMI handler sees OvfBuffer",
        what.0,
        what.1
    );

    let mut previous: Option<(u64, u64, u64)> = None; // (eventing IP, RCX, TSC)
    for n in 0..RECORDS {
        let r = &pebs[n * size as usize..(n + 1) * size as usize];
        let get = |at: Option<usize>| at.map(|o| word(r, o));
        // Trap-like: RIP follows the instruction that counted the event.
        let eventing = match (get(f.eventing_ip), get(f.rip)) {
            (Some(ip), _) => ip,
            (None, Some(rip)) if rip == jnz => dec,
            _ => jnz,
        };
        let mut ok = eventing == dec || eventing == jnz;
        if let Some(rip) = get(f.rip) {
            ok &= rip == if eventing == dec { jnz } else { dec } || eventing == jnz && rip == jnz + 2;
        }
        ok &= get(f.r14).is_none_or(|v| v == MARKER_R14) && get(f.r15).is_none_or(|v| v == MARKER_R15);
        ok &= get(f.status).is_none_or(|v| v & sampler.bit() != 0);
        ok &= f.format_size.is_none_or(|fs| word(r, 0) == fs);
        ok &= f.xmm0.is_none_or(|o| word(r, o) == MARKER_R14);
        // The newest LBR entry: the loop's JNZ back to the DEC.
        ok &= f.lbr0.is_none_or(|o| (word(r, o), word(r, o + 8)) == (jnz, dec));
        let rcx = get(f.rcx).unwrap_or(0);
        let tsc = get(f.tsc).unwrap_or(0);
        if let Some((prev_ip, prev_rcx, prev_tsc)) = previous {
            ok &= eventing == prev_ip;
            ok &= f.rcx.is_none() || prev_rcx.wrapping_sub(rcx) == K;
            ok &= f.tsc.is_none() || tsc > prev_tsc;
        }
        if !ok {
            println!(
                "  record {}: IP {:#x} RIP {:#x} RCX {} status {:#x} TSC {}; loop at {:#x}/{:#x}",
                n,
                eventing,
                get(f.rip).unwrap_or(0),
                rcx,
                get(f.status).unwrap_or(0),
                tsc,
                dec,
                jnz
            );
        }
        check!(
            ok,
            "{} {:#x}: record {}: the sampled instruction, {} iterations after the one before",
            what.0,
            what.1,
            n,
            K
        );
        previous = Some((eventing, rcx, tsc));
    }
    wrmsr(IA32_DS_AREA, 0);
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
    let baseline = caps & (1 << 14) != 0;
    println!("PEBS format {}, PEBS_TRAP {}, PEBS_BASELINE {}", format, caps >> 6 & 1, baseline);
    check!(caps & (1 << 6) != 0, "PERF_CAPABILITIES.PEBS_TRAP: records hold the state after the instruction");
    idt::set_handler(APIC_PERFMON_VECTOR, pmi_handler);
    apic::enable();
    apic::write(apic::LVT_PMC, APIC_PERFMON_VECTOR as u32);
    if let Some(f) = Fields::legacy(format) {
        sample(("format", u64::from(format)), (format, 0, false), Sampler::Pmc0, &f);
    } else if format == 4 && baseline {
        let every = CFG_MEMINFO | CFG_GPRS | CFG_XMMS | CFG_LBRS | 3 << CFG_LBR_SHIFT;
        for cfg in [0, CFG_GPRS, every] {
            sample(("adaptive, PEBS_DATA_CFG", cfg), (format, cfg, true), Sampler::Pmc0, &Fields::adaptive(cfg));
        }
        // Adaptive_Record clear: the basic group only, whatever MSR_PEBS_DATA_CFG selects.
        let basic = Fields::adaptive(0);
        sample(("Adaptive_Record clear, PEBS_DATA_CFG", every), (format, every, false), Sampler::Pmc0, &basic);
        let gprs = Fields::adaptive(CFG_GPRS);
        sample(
            ("IA32_FIXED_CTR0, adaptive, PEBS_DATA_CFG", CFG_GPRS),
            (format, CFG_GPRS, true),
            Sampler::FixedCtr0,
            &gprs,
        );
    } else {
        check!(false, "PEBS is presented only in a format emon writes (got format {})", format);
    }
    emon_guest::summary()
}
