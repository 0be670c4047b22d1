//! The idioms of KVM's PMU test, written for emon: reference cycles calibrated against RDTSC around `loop .` with ECX preset, the 10-instruction read loop over a CLFLUSHed buffer with every architectural event on every GP and fixed counter and all counters at once (that test's bounds and emon's exact counts), and RDPMC of running and stopped counters.
//!
//! Arguments: `n=` read-loop iterations (default 10000), `calibrate=` the `loop .` count
//! (default 1e9).
//!
//! Under emon's precise backend (README, "The precise backend") the measured read loop
//!
//! ```text
//!     wrmsr               ; IA32_PERF_GLOBAL_CTRL = the counters measured: not counted
//!     mov rsi, buf        ; 1 cycle
//!     mov ecx, n          ; 1 cycle
//! 2:  mov rax, [rsi]      ; 2 cycles (a memory operand): one new cache line
//!     add rsi, 64         ; 1
//!     nop x 7             ; 7
//!     loop 2b             ; 2 taken (predicted), 1 the last time (mispredicted)
//!     mov ecx, 0x38F      ; the stop: 3 x 1 cycle
//!     xor eax, eax
//!     xor edx, edx
//!     wrmsr               ; counted: 1 + 100 cycles
//! ```
//!
//! retires 10n + 6 instructions, n branches, 1 branch miss and 12n + 105 core cycles (= fixed
//! counter 2's REF_TSC cycles; topdown slots 4x). Every counted stretch starts with empty caches
//! and untrained prefetchers in emon's model (README, "The cache model"). With the profile's
//! prefetchers on, as KVM's test runs, the loop misses the LLC once per 4 KiB page it reads (the
//! first line of each; the prefetchers have the others in L2 first and never cross a page), and
//! with an L2 those misses are its only LLC references; without one (Core 2) each of the n lines
//! is one LLC reference (its load's or the IP prefetcher's request), plus the IP prefetcher's
//! fetch past the end when the loop ends inside a page. With no prefetchers each line is one
//! reference and one miss. The CLFLUSH and working-set checks run with the prefetchers turned off
//! (MSR_MISC_FEATURE_CONTROL or IA32_MISC_ENABLE): they are about CLFLUSH and L1d, which the
//! prefetchers would mask by fetching lines before the loads ask. UnHalted
//! Reference Cycles on a GP counter ticks once per TSC-to-reference ratio of TSC ticks, which the
//! guest calibrates first as KVM's test does, and checks against CPUID leaf 0x15 where the
//! profile has it.
#![no_std]
#![no_main]

use core::arch::asm;
use emon_guest::catch::catch;
use emon_guest::cpu::{cpuid, max_leaf, rdmsr, rdpmc, wrmsr};
use emon_guest::pmu::*;
use emon_guest::prefetch::{has_l2_inside_llc, Control, ALL};
use emon_guest::{check, check_eq, dec, println, skip};

emon_guest::entry!(main);

/// Where the read loop's buffer starts: 16 MiB up, in RAM emon's default 64 MiB guest has.
const BUF: u64 = 0x0100_0000;

/// RDPMC ECX bits: fixed-function counters, fast read (SDM Vol. 2B, RDPMC).
const RDPMC_FIXED: u32 = 1 << 30;
const RDPMC_FAST: u32 = 1 << 31;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    CoreCycles,
    Instructions,
    RefXclk,
    LlcReference,
    LlcMisses,
    Branches,
    BranchMisses,
    Slots,
}

/// The architectural events by CPUID.0AH:EBX bit (SDM Table 18-1).
const EVENTS: [(Kind, &str, u64); 8] = [
    (Kind::CoreCycles, "core cycles", 0x003C),
    (Kind::Instructions, "instructions", 0x00C0),
    (Kind::RefXclk, "ref cycles", 0x013C),
    (Kind::LlcReference, "llc references", 0x4F2E),
    (Kind::LlcMisses, "llc misses", 0x412E),
    (Kind::Branches, "branches", 0x00C4),
    (Kind::BranchMisses, "branch misses", 0x00C5),
    (Kind::Slots, "topdown slots", 0x01A4),
];

/// The event fixed counter i counts: instructions, core cycles, REF_TSC, slots.
const FIXED: [(Kind, &str); 4] = [
    (Kind::Instructions, "fixed instructions"),
    (Kind::CoreCycles, "fixed core cycles"),
    (Kind::CoreCycles, "fixed ref cycles (REF_TSC)"),
    (Kind::Slots, "fixed topdown slots"),
];

/// The reference clock as calibrated: `tsc` TSC ticks passed while the counter took `refs`.
#[derive(Clone, Copy)]
struct Calibration {
    tsc: u64,
    refs: u64,
}

fn rdtsc() -> u64 {
    let (lo, hi): (u32, u32);
    // SAFETY: RDTSC reads the time-stamp counter only.
    unsafe { asm!("lfence", "rdtsc", "lfence", out("eax") lo, out("edx") hi, options(nostack, nomem)) };
    ((hi as u64) << 32) | lo as u64
}

/// CLFLUSHes the `n` lines of the buffer (not counted), so that the loop reads from memory.
fn flush(n: u32) {
    // SAFETY: CLFLUSH of RAM the guest owns; no data changes.
    unsafe {
        asm!(
            "2: clflush [rsi]",
            "add rsi, 64",
            "loop 2b",
            "mfence",
            inout("rsi") BUF => _, inout("ecx") n => _,
            options(nostack),
        );
    }
}

/// The measured read loop (see the module documentation), counting with the counters in `mask`
/// (IA32_PERF_GLOBAL_CTRL layout).
fn read_loop(mask: u64, n: u32) {
    flush(n);
    // SAFETY: PMU MSRs, and reads of n lines of RAM from BUF.
    unsafe {
        asm!(
            "mov ecx, 0x38F",
            "mov eax, r8d",
            "mov edx, r9d",
            "wrmsr",
            "mov rsi, r10",
            "mov ecx, r11d",
            "2: mov rax, [rsi]",
            "add rsi, 64",
            "nop", "nop", "nop", "nop", "nop", "nop", "nop",
            "loop 2b",
            "mov ecx, 0x38F",
            "xor eax, eax",
            "xor edx, edx",
            "wrmsr",
            in("r8") mask as u32, in("r9") (mask >> 32) as u32, in("r10") BUF, in("r11") n,
            out("eax") _, out("ecx") _, out("edx") _, out("rsi") _,
            options(nostack, readonly),
        );
    }
}

/// `loop .` with ECX = `count`, counted by the counters in `mask` and timed with RDTSC as
/// KVM's test does: t0 before the start, t1 and t2 inside, t3 after the stop.
fn timed_loop_dot(mask: u64, count: u32) -> [u64; 4] {
    let t0 = rdtsc();
    let (t1, t2): (u64, u64);
    // SAFETY: PMU MSRs and RDTSC only.
    unsafe {
        asm!(
            "mov ecx, 0x38F",
            "mov eax, r8d",
            "mov edx, r9d",
            "wrmsr",
            // KVM's test reads the TSC fenced; some hosts lose the single-step trap after a fence.
            "lfence",
            "rdtsc",
            "lfence",
            "shl rdx, 32",
            "or rax, rdx",
            "mov r10, rax",
            "mov ecx, r11d",
            "2: loop 2b",
            "lfence",
            "rdtsc",
            "lfence",
            "shl rdx, 32",
            "or rax, rdx",
            "mov r11, rax",
            "mov ecx, 0x38F",
            "xor eax, eax",
            "xor edx, edx",
            "wrmsr",
            in("r8") mask as u32, in("r9") (mask >> 32) as u32, inout("r11") count as u64 => t2,
            out("r10") t1, out("eax") _, out("ecx") _, out("edx") _,
            options(nostack, nomem),
        );
    }
    let t3 = rdtsc();
    [t0, t1, t2, t3]
}

struct Setup {
    pmu: Perfmon,
    n: u64,
    /// How the prefetchers are controlled (and so whether the profile has them), and whether an
    /// L2 sits inside the LLC.
    prefetch: Control,
    l2: bool,
    /// TSC ticks per reference tick from CPUID leaf 0x15 (EBX / EAX), if the CPU has it.
    leaf_15h: Option<(u64, u64)>,
    cal: Option<Calibration>,
}

impl Setup {
    fn core_cycles(&self) -> u64 {
        12 * self.n + 105
    }

    /// The read loop's LLC references and misses with the profile's prefetchers on (see the
    /// module documentation): n lines from a page boundary.
    fn read_loop_llc(&self) -> (u64, u64) {
        let n = self.n;
        if self.prefetch.prefetchers() != ALL {
            return (n, n);
        }
        let pages = n.div_ceil(64);
        let past_the_end = u64::from(n % 64 != 0);
        (if self.l2 { pages } else { n + past_the_end }, pages)
    }

    /// emon's exact count of `kind` for one read loop, or for reference cycles the range the
    /// calibration allows (the reference clock's phase is not the guest's to know).
    fn exact(&self, kind: Kind) -> (u64, u64) {
        let c = self.core_cycles();
        let one = |v| (v, v);
        match kind {
            Kind::CoreCycles => one(c),
            Kind::Instructions => one(10 * self.n + 6),
            Kind::Branches => one(self.n),
            Kind::BranchMisses => one(1),
            Kind::Slots => one(4 * c),
            Kind::LlcReference => one(self.read_loop_llc().0),
            Kind::LlcMisses => one(self.read_loop_llc().1),
            // floor or ceil of c / ratio: the ratio from CPUID leaf 0x15, or else as calibrated,
            // where the calibration's reference count may be one tick off either way.
            Kind::RefXclk => match (self.leaf_15h, self.cal) {
                (Some((num, den)), _) => {
                    let floor = (c as u128 * den as u128 / num as u128) as u64;
                    (floor, floor + 1)
                }
                (None, Some(cal)) => (
                    (c as u128 * (cal.refs - 1) as u128 / cal.tsc as u128) as u64,
                    (c as u128 * (cal.refs + 1) as u128 / cal.tsc as u128) as u64 + 1,
                ),
                (None, None) => (0, u64::MAX),
            },
        }
    }

    /// KVM's test's bounds for the read loop, for n iterations (reference cycles scaled by the
    /// calibration, as it does).
    fn kvm_bounds(&self, kind: Kind, fixed: bool) -> (u64, u64) {
        let n = self.n;
        match (kind, fixed) {
            (Kind::CoreCycles, false) => (n, 50 * n),
            (Kind::CoreCycles, true) => (n, 30 * n),
            (Kind::Instructions, _) => (10 * n, 10 * n + n / 5),
            (Kind::RefXclk, _) => match self.cal {
                Some(cal) => (
                    (n as u128 * cal.refs as u128 / cal.tsc as u128) as u64,
                    (30 * n as u128 * cal.refs as u128 / cal.tsc as u128) as u64,
                ),
                None => (0, u64::MAX),
            },
            (Kind::LlcReference, _) => (1, 2 * n + n / 2),
            (Kind::LlcMisses, _) => (1, n),
            (Kind::Branches, _) => (n, n + n / 10),
            (Kind::BranchMisses, _) => (0, n / 10),
            (Kind::Slots, _) => (4 * n, 4 * 50 * n),
        }
    }

    fn check(&self, kind: Kind, fixed: bool, name: &str, counter: CounterName, got: u64) {
        let (lo, hi) = self.kvm_bounds(kind, fixed);
        check!(
            lo <= got && got <= hi,
            "{} on {}: {} within KVM's test's bounds [{}, {}]",
            name,
            counter,
            dec(got),
            dec(lo),
            dec(hi)
        );
        let (lo, hi) = self.exact(kind);
        if lo == hi {
            check_eq!(got, lo, "{} on {}: emon's exact count", name, counter);
        } else {
            check!(
                lo <= got && got <= hi,
                "{} on {}: {} in [{}, {}] by the reference clock",
                name,
                counter,
                dec(got),
                dec(lo),
                dec(hi)
            );
        }
    }
}

fn evtsel(event: u64) -> u64 {
    PERFEVTSEL_EN | PERFEVTSEL_OS | PERFEVTSEL_USR | event
}

/// Reference cycles against the TSC, around `loop .` with ECX preset.
fn calibrate(s: &mut Setup, count: u32) {
    if !s.pmu.event_available(EVENT_REF_CYCLES) {
        skip!("ref cycles against the TSC: the profile has no UnHalted Reference Cycles");
        return;
    }
    wrmsr(IA32_PERF_GLOBAL_CTRL, 0);
    wrmsr(IA32_PMC0, 0);
    wrmsr(IA32_PERFEVTSEL0, evtsel(0x013C));
    let [t0, t1, t2, t3] = timed_loop_dot(1, count);
    wrmsr(IA32_PERFEVTSEL0, 0);
    let refs = rdmsr(IA32_PMC0);
    check!(t0 <= t1 && t1 <= t2 && t2 <= t3, "the TSC never goes backwards as counting starts and stops");
    let tsc = t2 - t1;
    // From t1's RDTSC: it, LFENCE, 3 moves, `mov ecx`, `loop .` (2 cycles a taken LOOP, 1 the
    // last), LFENCE.
    check_eq!(
        tsc,
        1 + 1 + 3 + 1 + 2 * (count as u64 - 1) + 1 + 1,
        "TSC ticks inside the counted stretch: the modelled cycles"
    );
    check!(refs > 0, "`loop .` x {}: {} reference cycles", dec(count), dec(refs));
    if refs == 0 {
        return;
    }
    // The counter also counts the LFENCE before t1, and what follows t2: its RDTSC, LFENCE, 3
    // moves, 3 more and the 101-cycle WRMSR.
    let stretch = 1 + tsc + 109;
    let milli = (stretch as u128 * 1000 / refs as u128) as u64;
    let frac = milli % 1000;
    let pad = if frac < 10 {
        "00"
    } else if frac < 100 {
        "0"
    } else {
        ""
    };
    println!("TSC ticks per reference tick: {}.{}{}", dec(milli / 1000), pad, dec(frac));
    if let Some((num, den)) = s.leaf_15h {
        // One reference tick per num/den TSC ticks, give or take the reference clock's phase.
        let want = stretch as u128 * den as u128 / num as u128;
        check!(
            want <= refs as u128 + 1 && refs as u128 <= want + 1,
            "reference cycles x CPUID.15H EBX/EAX ({}/{}) = the TSC ticks",
            dec(num),
            dec(den)
        );
    }
    s.cal = Some(Calibration { tsc: stretch, refs });
}

/// Each available event on each GP counter, then each fixed counter, over the read loop.
fn every_counter(s: &Setup) {
    let n = s.n as u32;
    for (bit, (kind, name, event)) in EVENTS.iter().enumerate() {
        if !s.pmu.event_available(bit as u8) {
            println!("GP event '{}' is unavailable", name);
            continue;
        }
        for i in 0..s.pmu.gp as u32 {
            wrmsr(IA32_PMC0 + i, 0);
            wrmsr(IA32_PERFEVTSEL0 + i, evtsel(*event));
            read_loop(1 << i, n);
            wrmsr(IA32_PERFEVTSEL0 + i, 0);
            s.check(*kind, false, name, format_counter(false, i), rdmsr(IA32_PMC0 + i));
        }
    }
    for (i, (kind, name)) in FIXED.iter().enumerate() {
        if !s.pmu.fixed_supported(i as u8) {
            continue;
        }
        let i = i as u32;
        wrmsr(IA32_FIXED_CTR0 + i, 0);
        wrmsr(IA32_FIXED_CTR_CTRL, FIXED_EN_ALL << (4 * i));
        read_loop(1 << (32 + i), n);
        wrmsr(IA32_FIXED_CTR_CTRL, 0);
        s.check(*kind, true, name, format_counter(true, i), rdmsr(IA32_FIXED_CTR0 + i));
    }
}

/// Every counter at once, GP counter i on the i-th available event (as KVM's test's
/// "all counters").
fn all_counters(s: &Setup) {
    let n = s.n as u32;
    let (mut events, mut len) = ([0usize; 8], 0);
    for bit in 0..8 {
        if s.pmu.event_available(bit as u8) {
            events[len] = bit;
            len += 1;
        }
    }
    if len == 0 {
        return;
    }
    let mut mask = 0u64;
    for i in 0..s.pmu.gp as u32 {
        let (_, _, event) = EVENTS[events[i as usize % len]];
        wrmsr(IA32_PMC0 + i, 0);
        wrmsr(IA32_PERFEVTSEL0 + i, evtsel(event));
        mask |= 1 << i;
    }
    let mut ctrl = 0;
    for i in 0..4u32 {
        if s.pmu.fixed_supported(i as u8) {
            wrmsr(IA32_FIXED_CTR0 + i, 0);
            ctrl |= FIXED_EN_ALL << (4 * i);
            mask |= 1 << (32 + i);
        }
    }
    wrmsr(IA32_FIXED_CTR_CTRL, ctrl);
    read_loop(mask, n);
    wrmsr(IA32_FIXED_CTR_CTRL, 0);
    for i in 0..s.pmu.gp as u32 {
        wrmsr(IA32_PERFEVTSEL0 + i, 0);
        let (kind, name, _) = EVENTS[events[i as usize % len]];
        s.check(kind, false, name, format_counter(false, i), rdmsr(IA32_PMC0 + i));
    }
    for (i, (kind, name)) in FIXED.iter().enumerate() {
        if s.pmu.fixed_supported(i as u8) {
            s.check(*kind, true, name, format_counter(true, i as u32), rdmsr(IA32_FIXED_CTR0 + i as u32));
        }
    }
}

/// Counted code of two shapes, on IA32_PMC0: `flushed`, a loop over n lines that reads each,
/// CLFLUSHes it and reads it again; or two passes over 256 lines (16 KiB, inside every profile's
/// L1d).
fn cache_shape(event: u64, flushed: bool, n: u32) -> u64 {
    wrmsr(IA32_PMC0, 0);
    wrmsr(IA32_PERFEVTSEL0, evtsel(event));
    // SAFETY: PMU MSRs, reads and CLFLUSHes of RAM from BUF.
    unsafe {
        if flushed {
            asm!(
                "mov ecx, 0x38F", "mov eax, 1", "xor edx, edx", "wrmsr",
                "mov rsi, r10",
                "mov ecx, r11d",
                "2: mov rax, [rsi]",
                "clflush [rsi]",
                "mov rax, [rsi]",
                "add rsi, 64",
                "loop 2b",
                "mov ecx, 0x38F", "xor eax, eax", "xor edx, edx", "wrmsr",
                in("r10") BUF, in("r11") n, out("eax") _, out("ecx") _, out("edx") _, out("rsi") _,
                options(nostack),
            );
        } else {
            asm!(
                "mov ecx, 0x38F", "mov eax, 1", "xor edx, edx", "wrmsr",
                "mov rsi, r10",
                "mov ecx, 256",
                "2: mov rax, [rsi]",
                "add rsi, 64",
                "loop 2b",
                "mov rsi, r10",
                "mov ecx, 256",
                "3: mov rax, [rsi]",
                "add rsi, 64",
                "loop 3b",
                "mov ecx, 0x38F", "xor eax, eax", "xor edx, edx", "wrmsr",
                in("r10") BUF, out("eax") _, out("ecx") _, out("edx") _, out("rsi") _,
                options(nostack, readonly),
            );
        }
    }
    wrmsr(IA32_PERFEVTSEL0, 0);
    rdmsr(IA32_PMC0)
}

/// The cache model (README, "The cache model"), with its prefetchers off: a CLFLUSH in counted
/// code evicts the line from every level, and a working set inside L1d reaches the LLC only the
/// first time.
fn cache_model(s: &Setup) {
    let n = s.n as u32;
    // The prefetchers would fetch the lines before the loads ask: these checks are about
    // CLFLUSH and L1d, so they run without them.
    s.prefetch.set(0);
    for (bit, (_, name, event)) in EVENTS.iter().enumerate().filter(|(b, _)| *b == 3 || *b == 4) {
        if !s.pmu.event_available(bit as u8) {
            continue;
        }
        check_eq!(
            cache_shape(*event, true, n),
            2 * s.n,
            "{}: read, CLFLUSH, read again x {}: every read misses",
            name,
            dec(s.n)
        );
        check_eq!(cache_shape(*event, false, n), 256u64, "{}: 16 KiB read twice: the second pass hits L1d", name);
    }
    s.prefetch.set(ALL);
}

/// RDPMC of stopped counters (plain, fast, fixed; truncated to the width) and of a running one.
fn rdpmc_reads(s: &Setup) {
    let val: u64 = 0xff01_2345_6789;
    let fw = s.pmu.fw_write();
    for i in 0..s.pmu.gp as u32 {
        // The legacy IA32_PERFCTRx write sign-extends bit 31; IA32_A_PMCx (full-width) does not.
        let (msr, written) = if fw { (IA32_A_PMC0 + i, val) } else { (IA32_PMC0 + i, val as u32 as i32 as i64 as u64) };
        wrmsr(msr, val);
        let want = written & Perfmon::max(s.pmu.gp_width);
        check_eq!(rdpmc(i), want, "RDPMC({}) of a stopped counter", dec(i));
        check_eq!(rdpmc(i | RDPMC_FAST), want & 0xFFFF_FFFF, "RDPMC({} | fast) reads the low 32 bits", dec(i));
    }
    for i in 0..4u32 {
        if !s.pmu.fixed_supported(i as u8) {
            continue;
        }
        let want = val & Perfmon::max(s.pmu.fixed_width);
        wrmsr(IA32_FIXED_CTR0 + i, want);
        check_eq!(rdpmc(i | RDPMC_FIXED), want, "RDPMC(fixed {}) of a stopped counter", dec(i));
        check_eq!(rdpmc(i | RDPMC_FIXED | RDPMC_FAST), want & 0xFFFF_FFFF, "RDPMC(fixed {} | fast)", dec(i));
    }
    let past = s.pmu.gp as u32;
    check!(
        catch(|| {
            rdpmc(past);
        })
        .is_some_and(|e| e.is_gp()),
        "RDPMC({}) past the last GP counter raises #GP",
        dec(past)
    );
    // A running counter: GP0 counts instructions; RDPMC reads it after one counted instruction.
    wrmsr(IA32_PMC0, 0);
    wrmsr(IA32_PERFEVTSEL0, evtsel(0x00C0));
    let (lo, hi): (u32, u32);
    // SAFETY: PMU MSRs and RDPMC only.
    unsafe {
        asm!(
            "mov ecx, 0x38F",
            "mov eax, 1",
            "xor edx, edx",
            "wrmsr",
            "xor ecx, ecx",
            "rdpmc",
            "mov r8d, eax",
            "mov r9d, edx",
            "mov ecx, 0x38F",
            "xor eax, eax",
            "xor edx, edx",
            "wrmsr",
            out("r8") lo, out("r9") hi, out("eax") _, out("ecx") _, out("edx") _,
            options(nostack, nomem),
        );
    }
    wrmsr(IA32_PERFEVTSEL0, 0);
    check_eq!(((hi as u64) << 32) | lo as u64, 1u64, "RDPMC(0) of a running counter, after one counted instruction");
    // After the stop: the 1 + RDPMC + 2 moves + 3 + WRMSR counted.
    check_eq!(rdpmc(0), 8u64, "RDPMC(0) once it has stopped");
}

fn format_counter(fixed: bool, i: u32) -> CounterName {
    CounterName { fixed, i }
}

/// "GP counter i" / "fixed counter i", without an allocator.
struct CounterName {
    fixed: bool,
    i: u32,
}

impl core::fmt::Display for CounterName {
    fn fmt(&self, f: &mut core::fmt::Formatter) -> core::fmt::Result {
        write!(f, "{} counter {}", if self.fixed { "fixed" } else { "GP" }, self.i)
    }
}

fn main(boot: &emon_guest::BootInfo) -> i32 {
    let arg = |k: &str, d: u64| boot.arg(k).and_then(|v| v.parse().ok()).unwrap_or(d);
    let (n, count) = (arg("n", 10_000), arg("calibrate", 1_000_000_000));
    let pmu = Perfmon::from_cpuid();
    if pmu.version < 2 || pmu.gp == 0 {
        skip!("pmu-idioms: needs architectural perfmon v2+ (IA32_PERF_GLOBAL_CTRL) and a GP counter");
        return emon_guest::summary();
    }
    let leaf_15h = (max_leaf() >= 0x15).then(|| cpuid(0x15, 0)).filter(|l| l.eax != 0 && l.ebx != 0);
    let prefetch = Control::probe();
    let l2 = has_l2_inside_llc();
    let mut s = Setup { pmu, n, prefetch, l2, leaf_15h: leaf_15h.map(|l| (l.ebx as u64, l.eax as u64)), cal: None };
    println!("pmu-idioms: n={} calibrate={} prefetchers={:?} L2={}", dec(n), dec(count), prefetch, l2);
    wrmsr(IA32_PERF_GLOBAL_CTRL, 0);
    calibrate(&mut s, count as u32);
    every_counter(&s);
    all_counters(&s);
    cache_model(&s);
    rdpmc_reads(&s);
    emon_guest::summary()
}
