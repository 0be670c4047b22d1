//! The cache model's hardware prefetchers: exact LLC references and misses of sequential, strided, scattered and page-crossing reads with the prefetchers on, off and one at a time through the CPU's control register, and that register's semantics.
//!
//! emon's cache model (README, "The cache model") runs the prefetchers of the profile's CPU: the
//! DCU next-line and IP-based stride prefetchers into L1d, the streamer and the adjacent-line
//! prefetcher into L2 and the LLC. Software turns them off through MSR_MISC_FEATURE_CONTROL
//! (0x1A4) bits 0-3 from Nehalem on, through IA32_MISC_ENABLE bits 9, 19, 37 and 39 on Core 2
//! (bits 9 and 19 on NetBurst). The guest checks that register as the profile's CPU has it, then
//! counts LLC Reference and LLC Misses (IA32_PMC0 and IA32_PMC1, one counted stretch each, which
//! starts with empty caches and untrained prefetchers) over a 64 KiB buffer of 16 pages, with
//! every count predicted from the model's documented rules:
//!
//! - a request from L1 (a demand miss, or an L1 prefetcher's fetch) is an LLC Reference when it
//!   misses L2 and an LLC Miss when it misses the LLC too; without an L2 (Core 2) every request
//!   from L1 is an LLC Reference. The L2 prefetchers' fetches are not counted;
//! - the adjacent-line prefetcher fetches a missed line's 128-byte pair; the streamer sets a
//!   page's direction on its second request and then stays up to two lines a request ahead; the
//!   IP prefetcher fetches the load's address plus its stride once the stride repeats; the DCU
//!   prefetcher fetches the next line when a load ascends within the line of the load before;
//!   none crosses a 4 KiB page.
//!
//! So a sequential sweep misses once a page with every prefetcher (64 times a page with none,
//! twice with the streamer alone, 32 times with the adjacent line alone); reads 128 bytes apart
//! miss twice a page; reads across each page boundary miss twice each, prefetchers or not; one
//! read in each page in a scattered order misses every time, and a second pass over the other
//! lines of the pairs finds them all in L2 thanks to the adjacent-line prefetcher; the L1
//! prefetchers fetch one line past the end of a buffer.
#![no_std]
#![no_main]

use core::arch::asm;
use emon_guest::cpu::{cpuid, rdmsr, wrmsr};
use emon_guest::msr::{bits, expect_gp_unchanged, expect_reserved_bits, write_reads};
use emon_guest::pmu::{
    Perfmon, EVENT_LLC_MISSES, EVENT_LLC_REFERENCE, IA32_MISC_ENABLE, IA32_PERFEVTSEL0, IA32_PERF_GLOBAL_CTRL,
    IA32_PMC0, PERFEVTSEL_EN, PERFEVTSEL_OS,
};
use emon_guest::prefetch::{
    has_l2_inside_llc, Control, ADJACENT_LINE, ALL, DCU, IP_STRIDE, MSR_MISC_FEATURE_CONTROL, STREAMER,
};
use emon_guest::{check, check_eq, dec, println, skip, BootInfo};

emon_guest::entry!(main);

/// The buffer: 16 pages from 16 MiB up, in RAM emon's default 64 MiB guest has.
const BUF: u64 = 0x0100_0000;
const PAGES: u64 = 16;
const LINE: u64 = 64;
const LINES_PER_PAGE: u64 = 4096 / LINE;

/// LLC Reference and LLC Misses (SDM Table 18-1), OS only.
const EVTSEL_REFERENCES: u64 = PERFEVTSEL_EN | PERFEVTSEL_OS | 0x4F2E;
const EVTSEL_MISSES: u64 = PERFEVTSEL_EN | PERFEVTSEL_OS | 0x412E;

/// The code a stretch counts; each reads only the buffer, with registers only around it.
#[derive(Clone, Copy)]
enum Pattern {
    /// `n` 8-byte reads from one instruction, `stride` bytes apart from `base`.
    Strided { base: u64, n: u64, stride: u64 },
    /// Two reads a line (offsets 0 and 8) over `n` lines from `base`.
    TwoPerLine { base: u64, n: u64 },
    /// One read in each page, page 5k mod 16 for k = 0..15 at line (37k + 11) mod 64 of it;
    /// then (counted apart) the same with the other line of each 128-byte pair.
    Scattered,
}

/// Counts `p` with IA32_PMC0 on LLC Reference and IA32_PMC1 on LLC Misses: (references,
/// misses), and for [`Pattern::Scattered`] the second pass's apart.
fn count(p: Pattern) -> [(u64, u64); 2] {
    wrmsr(IA32_PERFEVTSEL0, EVTSEL_REFERENCES);
    wrmsr(IA32_PERFEVTSEL0 + 1, EVTSEL_MISSES);
    wrmsr(IA32_PMC0, 0);
    wrmsr(IA32_PMC0 + 1, 0);
    let (mut refs1, mut misses1) = (0u64, 0u64);
    // SAFETY: PMU MSRs, RDPMC and reads of the guest's own RAM at BUF; only registers change.
    unsafe {
        match p {
            Pattern::Strided { base, n, stride } => asm!(
                "mov ecx, 0x38F", "mov eax, 3", "xor edx, edx", "wrmsr",
                "mov rcx, r9",
                "2: mov rax, [rsi]",
                "add rsi, r8",
                "loop 2b",
                "mov ecx, 0x38F", "xor eax, eax", "xor edx, edx", "wrmsr",
                inout("rsi") base => _, in("r8") stride, in("r9") n,
                out("eax") _, out("ecx") _, out("edx") _,
                options(nostack, readonly),
            ),
            Pattern::TwoPerLine { base, n } => asm!(
                "mov ecx, 0x38F", "mov eax, 3", "xor edx, edx", "wrmsr",
                "mov rcx, r9",
                "2: mov rax, [rsi]",
                "mov rax, [rsi + 8]",
                "add rsi, 64",
                "loop 2b",
                "mov ecx, 0x38F", "xor eax, eax", "xor edx, edx", "wrmsr",
                inout("rsi") base => _, in("r9") n,
                out("eax") _, out("ecx") _, out("edx") _,
                options(nostack, readonly),
            ),
            Pattern::Scattered => asm!(
                "mov ecx, 0x38F", "mov eax, 3", "xor edx, edx", "wrmsr",
                "xor r10d, r10d",             // the line itself; then its pair (64)
                "4: xor r9d, r9d",            // k
                "2: imul rax, r9, 5",
                "and eax, 15",
                "shl rax, 12",                // page 5k mod 16
                "imul rdx, r9, 37",
                "add rdx, 11",
                "and edx, 63",
                "shl rdx, 6",                 // line (37k + 11) mod 64
                "xor rdx, r10",
                "add rax, rdx",
                "mov rax, [rsi + rax]",
                "inc r9",
                "cmp r9, 16",
                "jb 2b",
                "test r10d, r10d",
                "jnz 3f",
                "xor ecx, ecx", "rdpmc", "mov r11d, eax", "shl rdx, 32", "or r11, rdx",
                "mov ecx, 1", "rdpmc", "mov r12d, eax", "shl rdx, 32", "or r12, rdx",
                "mov r10d, 64",
                "jmp 4b",
                "3: mov ecx, 0x38F", "xor eax, eax", "xor edx, edx", "wrmsr",
                in("rsi") BUF,
                out("r9") _, out("r10") _, out("r11") refs1, out("r12") misses1,
                out("eax") _, out("ecx") _, out("edx") _,
                options(nostack, readonly),
            ),
        }
    }
    wrmsr(IA32_PERFEVTSEL0, 0);
    wrmsr(IA32_PERFEVTSEL0 + 1, 0);
    let (refs, misses) = (rdmsr(IA32_PMC0), rdmsr(IA32_PMC0 + 1));
    match p {
        Pattern::Scattered => [(refs1, misses1), (refs - refs1, misses - misses1)],
        _ => [(refs, misses), (0, 0)],
    }
}

/// The names of the prefetchers of a set.
fn names(set: u8) -> &'static str {
    match set {
        ALL => "every prefetcher",
        0 => "no prefetcher",
        STREAMER => "the streamer alone",
        ADJACENT_LINE => "the adjacent line alone",
        DCU => "the DCU prefetcher alone",
        IP_STRIDE => "the IP prefetcher alone",
        s if s == STREAMER | ADJACENT_LINE => "the L2 prefetchers",
        s if s == DCU | IP_STRIDE => "the L1 prefetchers",
        _ => "some prefetchers",
    }
}

/// One check: `p` under the prefetchers `on` gives `misses` LLC misses, and as many LLC
/// references with an L2 (every reference misses in these patterns), `requests` without one
/// (every request from L1 reaches the LLC).
fn expect(c: Control, l2: bool, what: &str, p: Pattern, on: u8, (misses, requests): (u64, u64)) {
    c.set(on);
    let [(refs, got_misses), _] = count(p);
    let want_refs = if l2 { misses } else { requests };
    println!("  {} with {}: {} references, {} misses", what, names(on), dec(refs), dec(got_misses));
    check_eq!(refs, want_refs, "{} with {}: LLC references", what, names(on));
    check_eq!(got_misses, misses, "{} with {}: LLC misses", what, names(on));
}

/// The LLC counts of every pattern (see the module documentation), under the prefetchers the
/// control register reaches.
fn counts(c: Control, l2: bool) {
    let lines = PAGES * LINES_PER_PAGE;
    let sweep = Pattern::Strided { base: BUF, n: lines, stride: LINE };
    for (on, misses) in [
        (ALL, PAGES),
        (0, lines),
        (STREAMER | ADJACENT_LINE, PAGES),
        (STREAMER, 2 * PAGES),
        (ADJACENT_LINE, lines / 2),
        (DCU | IP_STRIDE, lines),
        (IP_STRIDE, lines),
        (DCU, lines),
    ] {
        // Every line is requested from L1 once (by its load or the IP prefetcher).
        expect(c, l2, "sequential reads of 16 pages", sweep, on, (misses, lines));
    }
    let strided = Pattern::Strided { base: BUF, n: lines / 2, stride: 2 * LINE };
    expect(c, l2, "reads 128 bytes apart", strided, ALL, (2 * PAGES, lines / 2));
    expect(c, l2, "reads 128 bytes apart", strided, 0, (lines / 2, lines / 2));
    let crossing = Pattern::Strided { base: BUF + 4092, n: PAGES, stride: 4096 };
    expect(c, l2, "8-byte reads across each page boundary", crossing, ALL, (2 * PAGES, 2 * PAGES));
    expect(c, l2, "8-byte reads across each page boundary", crossing, 0, (2 * PAGES, 2 * PAGES));
    // 16 lines in the middle of a page: an L1 prefetcher fetches the 17th.
    let mid = BUF + 16 * LINE;
    let one = Pattern::Strided { base: mid, n: 16, stride: LINE };
    expect(c, l2, "16 lines, one read each", one, IP_STRIDE, (17, 17));
    expect(c, l2, "16 lines, one read each", one, 0, (16, 16));
    expect(c, l2, "16 lines, one read each", one, ALL, (1, 17));
    let two = Pattern::TwoPerLine { base: mid, n: 16 };
    expect(c, l2, "16 lines, two ascending reads each", two, DCU, (17, 17));
    // Each of the two loads repeats its own 64-byte stride.
    expect(c, l2, "16 lines, two ascending reads each", two, IP_STRIDE, (17, 17));
    expect(c, l2, "16 lines, two ascending reads each", two, 0, (16, 16));
    // One line a page in a scattered order, then the other line of each pair.
    for on in [ALL, 0] {
        c.set(on);
        let [(r1, m1), (r2, m2)] = count(Pattern::Scattered);
        println!("  scattered with {}: {}/{}, then their pairs: {}/{}", names(on), dec(r1), dec(m1), dec(r2), dec(m2));
        check!((r1, m1) == (PAGES, PAGES), "one read in each of 16 pages, scattered, with {}: each misses", names(on));
        let want = match (on, l2) {
            (0, _) => (PAGES, PAGES),
            (_, true) => (0, 0),
            (_, false) => (PAGES, 0),
        };
        check!(
            (r2, m2) == want,
            "then the other line of each pair, with {}: {} references, {} misses",
            names(on),
            want.0,
            want.1
        );
    }
    c.set(ALL);
}

/// MSR_MISC_FEATURE_CONTROL as the disclosure and the measured CPUs have it.
fn misc_feature_control() {
    let msr = MSR_MISC_FEATURE_CONTROL;
    check_eq!(rdmsr(msr), 0u64, "MSR_MISC_FEATURE_CONTROL reads 0 at power-on: every prefetcher on");
    for b in 0..4 {
        write_reads(
            format_args!("MSR_MISC_FEATURE_CONTROL bit {} (a prefetcher's disable) is writable", b),
            msr,
            1 << b,
            1 << b,
        );
    }
    wrmsr(msr, 0xF);
    // Bit 11: stored on the i7-2635QM and i7-6700K (VirtualBox's measurement); reserved on
    // Nehalem (the disclosure: "other bits of this MSR are reserved").
    let f = cpuid(1, 0).eax;
    let model = ((f >> 4) & 0xF) | ((f >> 12) & 0xF0);
    let nehalem = matches!(model, 0x1A | 0x1E | 0x1F | 0x2E);
    let bit11 = 1 << 11;
    if nehalem {
        expect_gp_unchanged(format_args!("MSR_MISC_FEATURE_CONTROL bit 11 #GPs on Nehalem"), msr, 0xF | bit11, msr);
    } else {
        write_reads(
            format_args!("MSR_MISC_FEATURE_CONTROL bit 11 is stored (as measured)"),
            msr,
            0xF | bit11,
            0xF | bit11,
        );
        wrmsr(msr, 0xF);
    }
    let reserved = !0xFu64 & !bit11;
    expect_reserved_bits(
        format_args!("MSR_MISC_FEATURE_CONTROL's other bits each #GP, value unchanged"),
        msr,
        0xF,
        reserved,
        msr,
    );
    wrmsr(msr, 0);
}

/// Core 2's and NetBurst's disable bits in IA32_MISC_ENABLE (and no MSR_MISC_FEATURE_CONTROL).
fn misc_enable(present: u8) {
    expect_gp_unchanged(
        format_args!("MSR_MISC_FEATURE_CONTROL does not exist (#GP)"),
        MSR_MISC_FEATURE_CONTROL,
        0,
        IA32_MISC_ENABLE,
    );
    let netburst = (cpuid(1, 0).eax >> 8) & 0xF == 0xF;
    let want = if netburst { STREAMER | ADJACENT_LINE } else { ALL };
    check_eq!(present, want, "IA32_MISC_ENABLE takes the disable bits of the CPU's prefetchers");
    let misc = rdmsr(IA32_MISC_ENABLE);
    for b in bits(Control::misc_enable_bits(present)) {
        let v = misc | 1u64 << b;
        write_reads(
            format_args!("IA32_MISC_ENABLE bit {} (a prefetcher's disable) reads back", b),
            IA32_MISC_ENABLE,
            v,
            v,
        );
        wrmsr(IA32_MISC_ENABLE, misc);
    }
    expect_reserved_bits(
        format_args!("IA32_MISC_ENABLE's disable bits of prefetchers the CPU lacks #GP"),
        IA32_MISC_ENABLE,
        misc,
        Control::misc_enable_bits(ALL & !present),
        IA32_MISC_ENABLE,
    );
}

fn main(_boot: &BootInfo) -> i32 {
    let c = Control::probe();
    println!("prefetcher control: {:?}", c);
    match c {
        Control::MiscFeatureControl => misc_feature_control(),
        Control::MiscEnable(present) => misc_enable(present),
        Control::None => {
            skip!("no prefetcher control register (MSR_MISC_FEATURE_CONTROL or IA32_MISC_ENABLE's bits)");
            return emon_guest::summary();
        }
    }
    let pmu = Perfmon::from_cpuid();
    if pmu.version < 2 || pmu.gp < 2 {
        skip!("LLC counts: needs architectural perfmon v2+ and two GP counters");
        return emon_guest::summary();
    }
    if !pmu.event_available(EVENT_LLC_REFERENCE) || !pmu.event_available(EVENT_LLC_MISSES) {
        skip!("LLC counts: CPUID.0AH:EBX marks LLC Reference or LLC Misses unavailable");
        return emon_guest::summary();
    }
    let l2 = has_l2_inside_llc();
    println!("an L2 inside the LLC: {}", l2);
    wrmsr(IA32_PERF_GLOBAL_CTRL, 0);
    counts(c, l2);
    emon_guest::summary()
}
