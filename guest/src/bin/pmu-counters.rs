//! Every GP and fixed counter the profile declares counts each available architectural event exactly, overflows into a PMI (fixed vector and NMI) and honours the USR/OS filters.
//!
//! The counted code is one asm block whose cost is known instruction by instruction under emon's
//! precise backend (1 instruction = 1 event; cycles: 1 per instruction, +1 per taken branch,
//! +100 for WRMSR; a conditional branch is mispredicted when it disagrees with a static
//! backward-taken/forward-not-taken predictor). Counting starts right after one WRMSR (not
//! counted) and stops with `mov ecx, r8d; mov eax, r9d; mov edx, r10d; wrmsr` (counted, as the
//! WRMSR that disables a counter began while it was counting):
//!
//! ```text
//!     lea rX, [rip + 4f]  ; (before counting: where a PMI on the stopping WRMSR must land)
//!     wrmsr               ; start (GLOBAL_CTRL on v2+, PERFEVTSEL.EN on v1): not counted
//!     mov r11d, N         ; 1 insn, 1 cycle
//! 2:  dec r11d            ; N insns, N cycles
//!     jnz 2b              ; N branches: N-1 taken backward (2 cycles, predicted), 1 not taken
//!                         ;   (1 cycle, mispredicted: backward is predicted taken)
//!     xor r11d, r11d      ; 1 insn, 1 cycle, ZF = 1
//!     jnz 3f              ; branch, forward not taken: predicted, 1 cycle
//!     jz 3f               ; branch, forward taken: mispredicted, 2 cycles
//!     nop                 ; skipped
//! 3:  mov ecx, r8d        ; the stop sequence: 3 x 1 cycle
//!     mov eax, r9d
//!     mov edx, r10d
//!     wrmsr               ; counted: 1 + 100 cycles
//! 4:
//! ```
//!
//! So for N >= 1: instructions 2N + 8, branches N + 2, branch misses 2, core cycles
//! (= fixed counter 2's REF_TSC cycles) 3N + 108, topdown slots 4 x (3N + 108); UnHalted
//! Reference Cycles on a GP counter: 3N + 108 over CPUID leaf 0x15's TSC-to-reference ratio,
//! rounded either way (any count from 1 up without that leaf); LLC references and misses (0x2E)
//! count 0, because the block touches no memory. Each GP counter i is measured with N = 100 + 10i
//! and each fixed counter i with N = 300 + 10i, so a counter wired to the wrong state shows.
//! On v2+ the enable is IA32_PERF_GLOBAL_CTRL; on v1 (no GLOBAL_CTRL/STATUS) it is PERFEVTSEL.EN.
//! On v2+ all counters also count together, started and stopped by one GLOBAL_CTRL write each.
//! Then every counter is loaded with its maximum (GP: a legacy 0xFFFFFFFF write, sign-extended;
//! fixed: (1 << width) - 1), enabled with PERFEVTSEL.INT / the fixed PMI bit, and must raise
//! exactly one PMI right after the first counted instruction, with fixed-vector and with NMI
//! delivery, with its own GLOBAL_STATUS bit (i or 32 + i) set, which GLOBAL_OVF_CTRL clears.
//! That pins the start of the attribution rule (the enabling WRMSR is not counted); its end (the
//! stopping WRMSR is counted) is pinned by presetting each counter to 2^width - C, where C is the
//! block's exact count: the counter must wrap to 0 on the stopping WRMSR and interrupt right
//! after it. The USR/OS filters are checked on every counter: the guest runs at CPL0, so
//! PERFEVTSEL.OS alone (fixed EN = 1) counts everything and USR alone (fixed EN = 2) nothing.
#![no_std]
#![no_main]

use core::arch::asm;
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use emon_guest::cpu::{cpuid, enable_interrupts, rdmsr, wrmsr};
use emon_guest::pmu::{
    measured_block, ref_cycles_range, start_and_retire_one, APIC_PERFMON_VECTOR, FIXED_EN_ALL, FIXED_EN_OS,
    FIXED_EN_USR, FIXED_PMI, IA32_FIXED_CTR0, IA32_FIXED_CTR_CTRL, IA32_PERFEVTSEL0, IA32_PERF_GLOBAL_CTRL,
    IA32_PERF_GLOBAL_OVF_CTRL, IA32_PERF_GLOBAL_STATUS, IA32_PMC0, PERFEVTSEL_EN, PERFEVTSEL_INT, PERFEVTSEL_OS,
    PERFEVTSEL_USR,
};
use emon_guest::{apic, check, check_eq, dec, idt, println, skip};

emon_guest::entry!(main);

/// IA32_FIXED_CTR_CTRL field bits (4 per counter).

const NMI_VECTOR: u8 = 2;

/// What the precise backend counts for an architectural event.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Instructions,
    Branches,
    BranchMisses,
    Cycles,
    /// UnHalted Reference Cycles on a GP counter: core cycles over the TSC-to-reference ratio
    /// ([`ref_cycles_range`]).
    RefXclk,
    Slots,
    /// LLC events: the measured block touches no memory, so emon's cache model counts 0.
    Zero,
}

#[derive(Clone, Copy)]
struct ArchEvent {
    /// CPUID.0AH:EBX bit.
    bit: u32,
    name: &'static str,
    event: u8,
    umask: u8,
    kind: Kind,
}

const EVENTS: [ArchEvent; 8] = [
    ArchEvent { bit: 0, name: "UnHalted Core Cycles", event: 0x3C, umask: 0x00, kind: Kind::Cycles },
    ArchEvent { bit: 1, name: "Instructions Retired", event: 0xC0, umask: 0x00, kind: Kind::Instructions },
    ArchEvent { bit: 2, name: "UnHalted Reference Cycles", event: 0x3C, umask: 0x01, kind: Kind::RefXclk },
    ArchEvent { bit: 3, name: "LLC Reference", event: 0x2E, umask: 0x4F, kind: Kind::Zero },
    ArchEvent { bit: 4, name: "LLC Misses", event: 0x2E, umask: 0x41, kind: Kind::Zero },
    ArchEvent { bit: 5, name: "Branch Instructions Retired", event: 0xC4, umask: 0x00, kind: Kind::Branches },
    ArchEvent { bit: 6, name: "Branch Misses Retired", event: 0xC5, umask: 0x00, kind: Kind::BranchMisses },
    ArchEvent { bit: 7, name: "Topdown Slots", event: 0xA4, umask: 0x01, kind: Kind::Slots },
];

/// The architectural event fixed counter i counts (SDM table "Association of Fixed-Function
/// Performance Counters with Architectural Performance Events").
const FIXED_EVENT: [usize; 4] = [1, 0, 2, 7];

/// What fixed counter i counts: its architectural event, except that fixed counter 2
/// (CPU_CLK_UNHALTED.REF_TSC) counts at the TSC's rate, which is the model core's: core cycles.
fn fixed_kind(i: u32) -> Kind {
    match EVENTS[FIXED_EVENT[i as usize]].kind {
        Kind::RefXclk => Kind::Cycles,
        k => k,
    }
}

/// Checks a GP counter's count of `kind` against [`expected`], or for reference cycles against
/// the range the reference clock allows.
fn check_gp_count(got: u64, kind: Kind, n: u32, what: core::fmt::Arguments) {
    let want = expected(kind, n);
    if kind == Kind::RefXclk {
        let (lo, hi) = ref_cycles_range(want);
        check!(
            lo <= got && got <= hi,
            "{}: {} reference cycles for {} core cycles, in [{}, {}]",
            what,
            dec(got),
            dec(want),
            dec(lo),
            dec(hi)
        );
    } else {
        check_eq!(got, want, "{}: {}", what, dec(want));
    }
}

/// Expected count of `kind` for one run of the measured block with loop count `n` (see the
/// module documentation for the derivation).
fn expected(kind: Kind, n: u32) -> u64 {
    let n = n as u64;
    let cycles = 3 * n + 108;
    match kind {
        Kind::Instructions => 2 * n + 8,
        Kind::Branches => n + 2,
        Kind::BranchMisses => 2,
        // Reference cycles: the core cycles they come from (see `check_gp_count`).
        Kind::Cycles | Kind::RefXclk => cycles,
        Kind::Slots => 4 * cycles,
        Kind::Zero => 0,
    }
}

struct Pmu {
    version: u32,
    gp: u32,
    gp_width: u32,
    ebx_len: u32,
    ebx: u32,
    /// Bitmap of the fixed counters that exist.
    fixed: u32,
    fixed_width: u32,
}

impl Pmu {
    fn available(&self, e: &ArchEvent) -> bool {
        e.bit < self.ebx_len && self.ebx & (1 << e.bit) == 0
    }

    fn global(&self) -> bool {
        self.version >= 2
    }

    /// GLOBAL_STATUS bits that belong to counters.
    fn counter_status_mask(&self) -> u64 {
        ((1u64 << self.gp) - 1) | ((self.fixed as u64) << 32)
    }

    fn stop_all(&self) {
        if self.global() {
            wrmsr(IA32_PERF_GLOBAL_CTRL, 0);
        }
        for i in 0..self.gp {
            wrmsr(IA32_PERFEVTSEL0 + i, 0);
        }
        if self.fixed != 0 {
            wrmsr(IA32_FIXED_CTR_CTRL, 0);
        }
        if self.global() {
            wrmsr(IA32_PERF_GLOBAL_OVF_CTRL, self.counter_status_mask());
        }
    }
}

fn max_value(width: u32) -> u64 {
    if width >= 64 {
        u64::MAX
    } else {
        (1u64 << width) - 1
    }
}

/// Counts `evtsel` (event, umask and filter bits, without EN) once on GP counter i; returns the
/// count.
fn count_gp(p: &Pmu, i: u32, evtsel: u64, n: u32) -> u64 {
    wrmsr(IA32_PMC0 + i, 0);
    if p.global() {
        wrmsr(IA32_PERFEVTSEL0 + i, evtsel | PERFEVTSEL_EN);
        measured_block(n, IA32_PERF_GLOBAL_CTRL, 1 << i, IA32_PERF_GLOBAL_CTRL, 0);
    } else {
        measured_block(n, IA32_PERFEVTSEL0 + i, evtsel | PERFEVTSEL_EN, IA32_PERFEVTSEL0 + i, evtsel);
    }
    wrmsr(IA32_PERFEVTSEL0 + i, 0);
    rdmsr(IA32_PMC0 + i)
}

/// Counts fixed counter i once with FIXED_CTR_CTRL field `field`; returns the count.
fn count_fixed(i: u32, field: u64, n: u32) -> u64 {
    wrmsr(IA32_FIXED_CTR0 + i, 0);
    wrmsr(IA32_FIXED_CTR_CTRL, field << (4 * i));
    measured_block(n, IA32_PERF_GLOBAL_CTRL, 1 << (32 + i), IA32_PERF_GLOBAL_CTRL, 0);
    wrmsr(IA32_FIXED_CTR_CTRL, 0);
    rdmsr(IA32_FIXED_CTR0 + i)
}

fn gp_n(i: u32) -> u32 {
    100 + 10 * i
}

fn fixed_n(i: u32) -> u32 {
    300 + 10 * i
}

fn gp_counting(p: &Pmu) {
    println!("-- GP counters: each available architectural event, counted alone");
    for i in 0..p.gp {
        let n = gp_n(i);
        for e in EVENTS.iter().filter(|e| p.available(e)) {
            let sel = e.event as u64 | (e.umask as u64) << 8 | PERFEVTSEL_USR | PERFEVTSEL_OS;
            let got = count_gp(p, i, sel, n);
            let (name, ev, um) = (e.name, e.event, e.umask);
            check_gp_count(
                got,
                e.kind,
                n,
                format_args!("IA32_PMC{} counts {} (0x{:02X}/0x{:02X}), N={}", i, name, ev, um, dec(n as u64)),
            );
        }
    }
}

fn fixed_counting(p: &Pmu) {
    println!("-- fixed counters: each counts its architectural event");
    for i in (0..4).filter(|i| p.fixed & (1 << i) != 0) {
        let n = fixed_n(i);
        let e = &EVENTS[FIXED_EVENT[i as usize]];
        let want = expected(fixed_kind(i), n);
        let got = count_fixed(i, FIXED_EN_ALL, n);
        check_eq!(got, want, "IA32_FIXED_CTR{} counts {} (EN=3), N={}: {}", i, e.name, dec(n as u64), dec(want));
    }
}

/// The event a GP counter uses for the filter and overflow tests: one that advances on every
/// instruction (instructions, cycles or slots), if the profile has one.
fn per_instruction_event(p: &Pmu) -> Option<&'static ArchEvent> {
    [1usize, 0, 7].iter().map(|&b| &EVENTS[b]).find(|e| p.available(e))
}

fn filters(p: &Pmu) {
    println!("-- USR/OS filters (the guest runs at CPL0)");
    match per_instruction_event(p) {
        Some(e) => {
            for i in 0..p.gp {
                let n = gp_n(i);
                let base = e.event as u64 | (e.umask as u64) << 8;
                let want = expected(e.kind, n);
                let got = count_gp(p, i, base | PERFEVTSEL_OS, n);
                check_eq!(got, want, "IA32_PMC{} with PERFEVTSEL.OS only counts {} at CPL0: {}", i, e.name, dec(want));
                let got = count_gp(p, i, base | PERFEVTSEL_USR, n);
                check_eq!(got, 0u64, "IA32_PMC{} with PERFEVTSEL.USR only counts nothing at CPL0", i);
            }
        }
        None if p.gp > 0 => skip!("USR/OS filters on GP counters: no per-instruction architectural event available"),
        None => {}
    }
    for i in (0..4).filter(|i| p.fixed & (1 << i) != 0) {
        let n = fixed_n(i);
        let e = &EVENTS[FIXED_EVENT[i as usize]];
        let want = expected(fixed_kind(i), n);
        check_eq!(
            count_fixed(i, FIXED_EN_OS, n),
            want,
            "IA32_FIXED_CTR{} with EN=1 (OS) counts {} at CPL0: {}",
            i,
            e.name,
            dec(want)
        );
        check_eq!(count_fixed(i, FIXED_EN_USR, n), 0u64, "IA32_FIXED_CTR{} with EN=2 (USR) counts nothing at CPL0", i);
    }
}

/// Every counter at once, started and stopped by one GLOBAL_CTRL write each (v2+).
fn all_together(p: &Pmu) {
    println!("-- all counters at once, one GLOBAL_CTRL write starts and stops them");
    if !p.global() {
        skip!("all counters at once: version 1 has no IA32_PERF_GLOBAL_CTRL");
        return;
    }
    let avail: [Option<&ArchEvent>; 8] = core::array::from_fn(|b| Some(&EVENTS[b]).filter(|e| p.available(e)));
    let mut chosen: [Option<&ArchEvent>; 8] = [None; 8];
    let mut k = 0;
    let n = 250;
    let mut global = 0u64;
    for i in 0..p.gp {
        // Counter i takes the (i mod #available)-th available event.
        let list = avail.iter().flatten();
        let count = list.clone().count();
        if count == 0 {
            break;
        }
        let e = list.clone().nth((i as usize) % count).copied();
        chosen[i as usize] = e;
        if let Some(e) = e {
            wrmsr(IA32_PMC0 + i, 0);
            wrmsr(
                IA32_PERFEVTSEL0 + i,
                e.event as u64 | (e.umask as u64) << 8 | PERFEVTSEL_USR | PERFEVTSEL_OS | PERFEVTSEL_EN,
            );
            global |= 1 << i;
            k += 1;
        }
    }
    let mut ctrl = 0;
    for i in (0..4).filter(|i| p.fixed & (1 << i) != 0) {
        wrmsr(IA32_FIXED_CTR0 + i, 0);
        ctrl |= FIXED_EN_ALL << (4 * i);
        global |= 1 << (32 + i);
        k += 1;
    }
    if k == 0 {
        skip!("all counters at once: no counter can count an available event");
        return;
    }
    wrmsr(IA32_FIXED_CTR_CTRL, ctrl);
    measured_block(n, IA32_PERF_GLOBAL_CTRL, global, IA32_PERF_GLOBAL_CTRL, 0);
    for i in 0..p.gp {
        if let Some(e) = chosen[i as usize] {
            check_gp_count(
                rdmsr(IA32_PMC0 + i),
                e.kind,
                n,
                format_args!(
                    "all at once: IA32_PMC{} counts {} (0x{:02X}/0x{:02X}), N={}",
                    i,
                    e.name,
                    e.event,
                    e.umask,
                    dec(n as u64)
                ),
            );
        }
    }
    for i in (0..4).filter(|i| p.fixed & (1 << i) != 0) {
        let e = &EVENTS[FIXED_EVENT[i as usize]];
        let want = expected(fixed_kind(i), n);
        check_eq!(
            rdmsr(IA32_FIXED_CTR0 + i),
            want,
            "all at once: IA32_FIXED_CTR{} counts {}, N={}: {}",
            i,
            e.name,
            dec(n as u64),
            dec(want)
        );
    }
    p.stop_all();
}

// --- overflow and PMI ---

static HANDLED: AtomicU64 = AtomicU64::new(0);
static STATUS_IN_HANDLER: AtomicU64 = AtomicU64::new(0);
static LVTPC_IN_HANDLER: AtomicU64 = AtomicU64::new(0);
static INTERRUPTED_RIP: AtomicU64 = AtomicU64::new(0);
static VECTOR_IN_HANDLER: AtomicU64 = AtomicU64::new(0);
static VERSION: AtomicU64 = AtomicU64::new(0);
/// Whether the backend counts exactly (emon's precise backend); host perf events count
/// approximately and deliver PMIs with skid.
static EXACT: AtomicBool = AtomicBool::new(true);

/// Waits, boundedly, for a PMI that arrives with skid.
fn wait_for_pmi() {
    for _ in 0..50_000_000u64 {
        if HANDLED.load(SeqCst) != 0 {
            return;
        }
        core::hint::spin_loop();
    }
}
/// The PERFEVTSEL the handler clears to stop the counter on v1.
static STOP_EVTSEL: AtomicU64 = AtomicU64::new(0);

/// Records what it sees, stops counting, clears the overflow through GLOBAL_OVF_CTRL, unmasks
/// LVTPC and sends EOI (not for an NMI).
fn pmi_handler(regs: &mut idt::Regs) {
    HANDLED.fetch_add(1, SeqCst);
    INTERRUPTED_RIP.store(regs.rip, SeqCst);
    VECTOR_IN_HANDLER.store(regs.vector, SeqCst);
    LVTPC_IN_HANDLER.store(apic::read(apic::LVT_PMC) as u64, SeqCst);
    if VERSION.load(SeqCst) >= 2 {
        wrmsr(IA32_PERF_GLOBAL_CTRL, 0);
        let status = rdmsr(IA32_PERF_GLOBAL_STATUS);
        STATUS_IN_HANDLER.store(status, SeqCst);
        wrmsr(IA32_PERF_GLOBAL_OVF_CTRL, status & 0x0000_000F_0000_00FF);
    } else {
        wrmsr(STOP_EVTSEL.load(SeqCst) as u32, 0);
    }
    apic::write(apic::LVT_PMC, apic::read(apic::LVT_PMC) & !apic::LVT_MASKED);
    if regs.vector != NMI_VECTOR as u64 {
        apic::eoi();
    }
}

#[derive(Clone, Copy)]
enum Counter {
    Gp(u32),
    Fixed(u32),
}

fn overflow(p: &Pmu, c: Counter, nmi: bool, gp_event: Option<&ArchEvent>) {
    let (name, status_bit, width) = match c {
        Counter::Gp(i) => (("IA32_PMC", i), i, p.gp_width),
        Counter::Fixed(i) => (("IA32_FIXED_CTR", i), 32 + i, p.fixed_width),
    };
    let how = if nmi { "an NMI PMI" } else { "a fixed-vector 0x33 PMI" };
    HANDLED.store(0, SeqCst);
    STATUS_IN_HANDLER.store(0, SeqCst);
    VECTOR_IN_HANDLER.store(0, SeqCst);
    apic::write(apic::LVT_PMC, if nmi { apic::LVT_DELIVERY_NMI } else { APIC_PERFMON_VECTOR as u32 });
    let max = max_value(width);
    let rip = match c {
        Counter::Gp(i) => {
            let e = gp_event.expect("caller checked");
            wrmsr(IA32_PMC0 + i, 0xFFFF_FFFF); // legacy write: sign-extends to the width
            check_eq!(
                rdmsr(IA32_PMC0 + i),
                max,
                "{}{}: a 0xFFFFFFFF write reads back as its maximum {:#x}",
                name.0,
                name.1,
                max
            );
            let sel = e.event as u64
                | (e.umask as u64) << 8
                | PERFEVTSEL_USR
                | PERFEVTSEL_OS
                | PERFEVTSEL_INT
                | PERFEVTSEL_EN;
            STOP_EVTSEL.store((IA32_PERFEVTSEL0 + i) as u64, SeqCst);
            if p.global() {
                wrmsr(IA32_PERFEVTSEL0 + i, sel);
                start_and_retire_one(IA32_PERF_GLOBAL_CTRL, 1 << i)
            } else {
                start_and_retire_one(IA32_PERFEVTSEL0 + i, sel)
            }
        }
        Counter::Fixed(i) => {
            wrmsr(IA32_FIXED_CTR0 + i, max);
            check_eq!(rdmsr(IA32_FIXED_CTR0 + i), max, "{}{}: holds its maximum {:#x}", name.0, name.1, max);
            wrmsr(IA32_FIXED_CTR_CTRL, (FIXED_EN_ALL | FIXED_PMI) << (4 * i));
            start_and_retire_one(IA32_PERF_GLOBAL_CTRL, 1 << (32 + i))
        }
    };
    let exact = EXACT.load(SeqCst);
    if !exact {
        wait_for_pmi();
    }
    p.stop_all();
    let handled = HANDLED.load(SeqCst);
    check_eq!(handled, 1u64, "{}{} overflow raises {}: the handler ran once", name.0, name.1, how);
    if handled != 1 {
        return;
    }
    let want_vector = if nmi { NMI_VECTOR } else { APIC_PERFMON_VECTOR } as u64;
    let vector_name = if nmi { "2 (NMI)" } else { "0x33 (LVTPC vector)" };
    check_eq!(
        VECTOR_IN_HANDLER.load(SeqCst),
        want_vector,
        "{}{} overflow: delivered on vector {}",
        name.0,
        name.1,
        vector_name
    );
    if exact {
        check_eq!(
            INTERRUPTED_RIP.load(SeqCst),
            rip,
            "{}{} overflow: the PMI arrived right after the first counted instruction",
            name.0,
            name.1
        );
    }
    check!(
        LVTPC_IN_HANDLER.load(SeqCst) & apic::LVT_MASKED as u64 != 0,
        "{}{} overflow: LVTPC was masked on entry to the handler",
        name.0,
        name.1
    );
    if p.global() {
        let seen = STATUS_IN_HANDLER.load(SeqCst) & p.counter_status_mask();
        check_eq!(
            seen,
            1u64 << status_bit,
            "{}{} overflow: only IA32_PERF_GLOBAL_STATUS bit {} set in the handler",
            name.0,
            name.1,
            status_bit
        );
        check_eq!(
            rdmsr(IA32_PERF_GLOBAL_STATUS) & (1 << status_bit),
            0u64,
            "{}{} overflow: IA32_PERF_GLOBAL_OVF_CTRL cleared GLOBAL_STATUS bit {}",
            name.0,
            name.1,
            status_bit
        );
    }
}

/// The stop side of the attribution rule: a counter preset to 2^width - C, where C is the
/// block's exact count, wraps on the very last counted instruction, the stopping WRMSR, so its
/// PMI arrives right after that WRMSR. (The start side, the enabling WRMSR not being counted, is
/// checked by the overflow tests: their PMI arrives right after the first instruction that
/// follows the enabling WRMSR.)
fn attribution(p: &Pmu) {
    println!("-- the stopping WRMSR is the last counted instruction: a counter preset to 2^width - C overflows on it");
    let gp_event = per_instruction_event(p);
    apic::write(apic::LVT_PMC, APIC_PERFMON_VECTOR as u32);
    let run = |c: Counter, n: u32| {
        HANDLED.store(0, SeqCst);
        let (name, i) = match c {
            Counter::Gp(i) => ("IA32_PMC", i),
            Counter::Fixed(i) => ("IA32_FIXED_CTR", i),
        };
        let (rip, kind) = match c {
            Counter::Gp(i) => {
                let e = gp_event.expect("caller checked");
                let c = expected(e.kind, n);
                let sel = e.event as u64 | (e.umask as u64) << 8 | PERFEVTSEL_USR | PERFEVTSEL_OS | PERFEVTSEL_INT;
                wrmsr(IA32_PMC0 + i, (0u64.wrapping_sub(c)) & 0xFFFF_FFFF); // sign-extends to 2^w - C
                STOP_EVTSEL.store((IA32_PERFEVTSEL0 + i) as u64, SeqCst);
                let rip = if p.global() {
                    wrmsr(IA32_PERFEVTSEL0 + i, sel | PERFEVTSEL_EN);
                    measured_block(n, IA32_PERF_GLOBAL_CTRL, 1 << i, IA32_PERF_GLOBAL_CTRL, 0)
                } else {
                    measured_block(n, IA32_PERFEVTSEL0 + i, sel | PERFEVTSEL_EN, IA32_PERFEVTSEL0 + i, sel)
                };
                (rip, (e.name, c))
            }
            Counter::Fixed(i) => {
                let e = &EVENTS[FIXED_EVENT[i as usize]];
                let c = expected(fixed_kind(i), n);
                wrmsr(IA32_FIXED_CTR0 + i, max_value(p.fixed_width) - c + 1);
                wrmsr(IA32_FIXED_CTR_CTRL, (FIXED_EN_ALL | FIXED_PMI) << (4 * i));
                (measured_block(n, IA32_PERF_GLOBAL_CTRL, 1 << (32 + i), IA32_PERF_GLOBAL_CTRL, 0), (e.name, c))
            }
        };
        let value = match c {
            Counter::Gp(i) => rdmsr(IA32_PMC0 + i),
            Counter::Fixed(i) => rdmsr(IA32_FIXED_CTR0 + i),
        };
        p.stop_all();
        let handled = HANDLED.load(SeqCst);
        check_eq!(
            handled,
            1u64,
            "{}{} preset to 2^width - {} ({}, N={}): one PMI",
            name,
            i,
            dec(kind.1),
            kind.0,
            dec(n as u64)
        );
        if handled == 1 {
            check_eq!(
                INTERRUPTED_RIP.load(SeqCst),
                rip,
                "{}{}: the PMI arrived right after the stopping WRMSR",
                name,
                i
            );
        }
        check_eq!(value, 0u64, "{}{}: wrapped exactly to 0 on the stopping WRMSR", name, i);
    };
    match gp_event {
        Some(_) => (0..p.gp).for_each(|i| run(Counter::Gp(i), gp_n(i))),
        None if p.gp > 0 => skip!("stopping WRMSR on GP counters: no per-instruction architectural event available"),
        None => {}
    }
    for i in (0..4).filter(|i| p.fixed & (1 << i) != 0) {
        run(Counter::Fixed(i), fixed_n(i));
    }
    apic::write(apic::LVT_PMC, apic::LVT_MASKED | APIC_PERFMON_VECTOR as u32);
}

fn overflows(p: &Pmu) {
    println!("-- overflow and PMI on every counter (fixed vector 0x33, then NMI)");
    let gp_event = per_instruction_event(p);
    if gp_event.is_none() && p.gp > 0 {
        skip!("overflow on GP counters: no per-instruction architectural event available");
    }
    for nmi in [false, true] {
        if gp_event.is_some() {
            for i in 0..p.gp {
                overflow(p, Counter::Gp(i), nmi, gp_event);
            }
        }
        for i in (0..4).filter(|i| p.fixed & (1 << i) != 0) {
            overflow(p, Counter::Fixed(i), nmi, None);
        }
    }
    apic::write(apic::LVT_PMC, apic::LVT_MASKED | APIC_PERFMON_VECTOR as u32);
}

/// For a backend that counts approximately (host perf events): every counter's cycles count and
/// grow with the work, events the backend cannot count are reported, and every counter's
/// overflow raises a PMI (with skid).
fn approximate(p: &Pmu) {
    println!("-- this backend counts approximately: cycles grow with work on every counter, and overflows raise PMIs");
    let (small, large) = (100, 30_000);
    for i in 0..p.gp {
        for e in EVENTS.iter().filter(|e| p.available(e)) {
            let sel = e.event as u64 | (e.umask as u64) << 8 | PERFEVTSEL_USR | PERFEVTSEL_OS;
            let (a, b) = (count_gp(p, i, sel, small), count_gp(p, i, sel, large));
            if a == 0 && b == 0 {
                skip!("IA32_PMC{} {}: this backend cannot count it here (the counter stays 0)", i, e.name);
            } else if e.kind != Kind::Zero {
                check!(b > a, "IA32_PMC{} counts {} growing with work: {} then {}", i, e.name, dec(a), dec(b));
            }
        }
    }
    for i in (0..4u32).filter(|i| p.fixed & (1 << i) != 0) {
        let e = &EVENTS[FIXED_EVENT[i as usize]];
        let (a, b) = (count_fixed(i, FIXED_EN_ALL, small), count_fixed(i, FIXED_EN_ALL, large));
        if a == 0 && b == 0 {
            skip!("IA32_FIXED_CTR{} ({}): this backend cannot count it here", i, e.name);
        } else {
            check!(b > a, "IA32_FIXED_CTR{} counts {} growing with work: {} then {}", i, e.name, dec(a), dec(b));
        }
    }
    idt::set_handler(APIC_PERFMON_VECTOR, pmi_handler);
    idt::set_handler(NMI_VECTOR, pmi_handler);
    apic::enable();
    enable_interrupts();
    let cycles = &EVENTS[0];
    for nmi in [false, true] {
        if p.available(cycles) {
            for i in 0..p.gp {
                overflow(p, Counter::Gp(i), nmi, Some(cycles));
            }
        }
        for i in (0..4u32).filter(|i| p.fixed & (1 << i) != 0) {
            let e = &EVENTS[FIXED_EVENT[i as usize]];
            if p.available(e) && count_fixed(i, FIXED_EN_ALL, small) > 0 {
                overflow(p, Counter::Fixed(i), nmi, None);
            }
        }
    }
    apic::write(apic::LVT_PMC, apic::LVT_MASKED | APIC_PERFMON_VECTOR as u32);
}

fn main(_boot: &emon_guest::BootInfo) -> i32 {
    let a = cpuid(0xA, 0);
    let version = a.eax & 0xFF;
    let mut p = Pmu {
        version,
        gp: (a.eax >> 8) & 0xFF,
        gp_width: (a.eax >> 16) & 0xFF,
        ebx_len: a.eax >> 24,
        ebx: a.ebx,
        fixed: 0,
        fixed_width: 0,
    };
    if version >= 2 {
        let n = a.edx & 0x1F;
        for i in 0..4 {
            if i < n || (version >= 5 && a.ecx & (1 << i) != 0) {
                p.fixed |= 1 << i;
            }
        }
        p.fixed_width = (a.edx >> 5) & 0xFF;
    }
    VERSION.store(version as u64, SeqCst);
    println!(
        "pmu-counters: perfmon v{}, {} GP counters x {} bits, fixed counters {:#x} (bitmap) x {} bits, EBX length {}, EBX {:#x}",
        version, p.gp, p.gp_width, p.fixed, p.fixed_width, p.ebx_len, p.ebx
    );
    if version == 0 {
        skip!("every counter: no architectural performance monitoring (CPUID.0AH:EAX[7:0] = 0)");
        return emon_guest::summary();
    }
    println!("measured block with loop count N: instructions 2N+8, branches N+2, branch misses 2, cycles 3N+108, slots 4(3N+108)");
    for e in EVENTS.iter().filter(|e| !p.available(e) && e.bit < p.ebx_len) {
        skip!("{} (0x{:02X}/0x{:02X}): CPUID.0AH:EBX bit {} marks it unavailable", e.name, e.event, e.umask, e.bit);
    }
    for e in EVENTS.iter().filter(|e| e.bit >= p.ebx_len) {
        println!("not enumerated (EBX bit {} >= EBX length {}): {}", e.bit, p.ebx_len, e.name);
    }
    p.stop_all();
    let cycles = &EVENTS[0];
    if p.available(cycles) && p.gp > 0 {
        let sel = cycles.event as u64 | PERFEVTSEL_USR | PERFEVTSEL_OS;
        EXACT.store(count_gp(&p, 0, sel, 20) == expected(Kind::Cycles, 20), SeqCst);
    }
    if !EXACT.load(SeqCst) {
        approximate(&p);
        p.stop_all();
        return emon_guest::summary();
    }
    gp_counting(&p);
    fixed_counting(&p);
    filters(&p);
    all_together(&p);
    idt::set_handler(APIC_PERFMON_VECTOR, pmi_handler);
    idt::set_handler(NMI_VECTOR, pmi_handler);
    apic::write(apic::LVT_PMC, apic::LVT_MASKED | APIC_PERFMON_VECTOR as u32);
    apic::enable();
    enable_interrupts();
    overflows(&p);
    attribution(&p);
    p.stop_all();
    emon_guest::summary()
}
