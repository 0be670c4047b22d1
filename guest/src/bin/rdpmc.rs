//! RDPMC as the SDM has it, with nothing counting and while counters count: every GP and fixed counter, fast reads, #GP for bad indexes and at CPL3 without CR4.PCE, real #GPs still reaching the guest, hundreds in a row.
//!
//! Without a vPMU, KVM raises #GP for every RDPMC. emon completes it at the guest's #GP handler
//! (a hardware breakpoint there) outside counted code, and emulates it while its precise backend
//! single-steps counted code; this guest checks both the same way. Each phase (nothing
//! counting, then PMC0 counting instructions and FIXED_CTR1, or PMC1, counting core cycles):
//!
//! - every GP counter after a legacy write of 0x89ABCD00 | i (sign-extended from bit 31 to the
//!   width) and, with FW_WRITE, a full-width write of 0xFF0123456700 | i; every fixed counter
//!   after a write of 0xFF0123456789AB00 | i (truncated to the width); ECX\[30\] selects the fixed
//!   counters, ECX\[31\] returns bits 31:0 with EDX = 0; a counter that counts reads between the
//!   RDMSRs before and after;
//! - #GP for the first GP index past CPUID.0AH:EAX\[15:8\], for index 0x1234, for the first
//!   fixed index the profile lacks and for fixed index 0xFF;
//! - at CPL3, #GP with CR4.PCE clear and the counter's value with it set;
//! - a #GP from another instruction (a non-canonical load, error code 0 like RDPMC's) and from
//!   an RDPMC with a bad index reach the guest's handler with the frame the processor pushed;
//! - 300 RDPMCs in a row, and 100 rounds of a real #GP followed by an RDPMC.
//!
//! With nothing counting it also checks that the guest's own single-step traps (RFLAGS.TF)
//! reach its #DB handler with DR6.BS, that its own hardware breakpoint (DR0/DR7) fires once
//! emon has seen DR7 (after some exits), and that RDPMC works again once DR7 is clear.
//! Without a PMU, every RDPMC raises #GP, at CPL0 and at CPL3 with CR4.PCE.
#![no_std]
#![no_main]

use core::arch::{asm, global_asm};
use core::sync::atomic::{AtomicU64, AtomicU8, Ordering::SeqCst};
use emon_guest::cpu::{rdmsr, rdpmc, read_cr4, write_cr4, wrmsr};
use emon_guest::idt::{self, Regs, KERNEL_CS, KERNEL_DS};
use emon_guest::pmu::*;
use emon_guest::user::{make_user_accessible, run_user};
use emon_guest::{catch, check, check_eq, println, Exception};

emon_guest::entry!(main);

/// ECX\[30\]: the fixed-function counters; ECX\[31\]: fast read (bits 31:0).
const FIXED: u32 = 1 << 30;
const FAST: u32 = 1 << 31;
const CR4_PCE: u64 = 1 << 8;
const RFLAGS_TF: u64 = 1 << 8;
const RFLAGS_RF: u64 = 1 << 16;
const DR6_B0: u64 = 1 << 0;
const DR6_BS: u64 = 1 << 14;
const DB_VECTOR: u8 = 1;
const GP_VECTOR: u8 = 13;
/// A non-canonical address: a load from it raises #GP(0).
const NON_CANONICAL: u64 = 0x8000_0000_0000_0000;
/// Where a counter that counts starts (small, so that its bits 31:0 do not wrap).
const COUNTING_START: u64 = 0x1000;

// The user-mode RDPMC: RCX comes from the kernel; EDX:EAX and a "done" flag go to memory
// (RAM is user-accessible); HLT then raises #GP, which brings the CPU back to the kernel.
global_asm!(
    ".global user_rdpmc",
    "user_rdpmc:",
    "rdpmc",
    "mov [rip + {lo}], eax",
    "mov [rip + {hi}], edx",
    "mov byte ptr [rip + {done}], 1",
    "hlt",
    lo = sym USER_LO,
    hi = sym USER_HI,
    done = sym USER_DONE,
);

extern "C" {
    fn user_rdpmc();
}

static USER_LO: AtomicU64 = AtomicU64::new(0);
static USER_HI: AtomicU64 = AtomicU64::new(0);
static USER_DONE: AtomicU8 = AtomicU8::new(0);

/// RDPMC(`ecx`) at CPL3: the value, or `None` if the RDPMC raised #GP.
fn user_read(ecx: u32) -> Option<u64> {
    USER_DONE.store(0, SeqCst);
    USER_LO.store(0, SeqCst);
    USER_HI.store(0, SeqCst);
    let v = run_user(user_rdpmc, u64::from(ecx));
    if v != GP_VECTOR {
        println!("  (user mode came back with vector {v})");
    }
    (USER_DONE.load(SeqCst) == 1)
        .then(|| (USER_HI.load(SeqCst) & 0xFFFF_FFFF) << 32 | (USER_LO.load(SeqCst) & 0xFFFF_FFFF))
}

/// RDPMC(`ecx`), or the exception it raised.
fn try_rdpmc(ecx: u32) -> Result<u64, Exception> {
    let mut v = 0;
    match catch(|| v = rdpmc(ecx)) {
        None => Ok(v),
        Some(e) => Err(e),
    }
}

/// The #GP frame the guest's handler saw: error code, RIP, CS, RFLAGS, RSP, SS.
static FRAME: [AtomicU64; 6] = [const { AtomicU64::new(0) }; 6];
static GP_SEEN: AtomicU64 = AtomicU64::new(0);
/// Where the #GP handler resumes (past the faulting instruction).
static RESUME: AtomicU64 = AtomicU64::new(0);

fn on_gp(regs: &mut Regs) {
    for (slot, v) in FRAME.iter().zip([regs.error_code, regs.rip, regs.cs, regs.rflags, regs.rsp, regs.ss]) {
        slot.store(v, SeqCst);
    }
    GP_SEEN.fetch_add(1, SeqCst);
    regs.rip = RESUME.load(SeqCst);
}

/// What a faulting instruction must find in the frame: its own address and the stack pointer
/// it ran with.
struct Faulted {
    rip: u64,
    rsp: u64,
    rflags: u64,
}

/// A non-canonical load (#GP(0)), taken by [`on_gp`].
fn non_canonical_load() -> Faulted {
    let (rip, rsp, rflags): (u64, u64, u64);
    // SAFETY: the load faults; `on_gp` resumes at 4:, past it. RAX is clobbered.
    unsafe {
        asm!(
            "lea rax, [rip + 4f]",
            "mov [rip + {resume}], rax",
            "lea {rip}, [rip + 3f]",
            "mov {rsp}, rsp",
            "pushfq",
            "pop {rflags}",
            "3: mov rax, [{bad}]",
            "4:",
            resume = sym RESUME,
            rip = out(reg) rip,
            rsp = out(reg) rsp,
            rflags = out(reg) rflags,
            bad = in(reg) NON_CANONICAL,
            out("rax") _,
        );
    }
    Faulted { rip, rsp, rflags }
}

/// An RDPMC of `ecx` that faults, taken by [`on_gp`].
fn faulting_rdpmc(ecx: u32) -> Faulted {
    let (rip, rsp, rflags): (u64, u64, u64);
    // SAFETY: as above; RDPMC clobbers EAX/EDX only if it completes.
    unsafe {
        asm!(
            "lea rax, [rip + 4f]",
            "mov [rip + {resume}], rax",
            "lea {rip}, [rip + 3f]",
            "mov {rsp}, rsp",
            "pushfq",
            "pop {rflags}",
            "3: rdpmc",
            "4:",
            resume = sym RESUME,
            rip = out(reg) rip,
            rsp = out(reg) rsp,
            rflags = out(reg) rflags,
            in("ecx") ecx,
            out("rax") _,
            out("rdx") _,
        );
    }
    Faulted { rip, rsp, rflags }
}

/// Runs `f` with [`on_gp`] as the #GP handler; reports whether the handler saw exactly one #GP
/// with error code 0 and the frame of the instruction `f` made fault.
fn check_frame(what: &str, phase: &Phase, f: impl FnOnce() -> Faulted) {
    GP_SEEN.store(0, SeqCst);
    idt::set_handler(GP_VECTOR, on_gp);
    let at = phase.counted(f);
    idt::clear_handler(GP_VECTOR);
    let frame: [u64; 6] = core::array::from_fn(|k| FRAME[k].load(SeqCst));
    // A fault's frame has RFLAGS.RF set (SDM Vol. 3A 6.13, "Error Code"... "RF"): the
    // processor's, not emon's.
    let want = [0, at.rip, u64::from(KERNEL_CS), at.rflags | RFLAGS_RF, at.rsp, u64::from(KERNEL_DS)];
    let ok = GP_SEEN.load(SeqCst) == 1 && frame == want;
    if !ok {
        println!("  #GPs seen {}; frame {:x?}, want {:x?}", GP_SEEN.load(SeqCst), frame, want);
    }
    check!(ok, "{}: {} reaches the guest's #GP handler with its frame", phase.name, what);
}

/// Which counters count in a phase, and how the phase starts and stops them around each check.
struct Phase {
    name: &'static str,
    pmu: Perfmon,
    /// GLOBAL_CTRL bits of the counters that count (PERFEVTSEL.EN on v1).
    counting: u64,
}

impl Phase {
    fn counts(&self, id: Counter) -> bool {
        self.counting & id.mask() != 0
    }

    fn start(&self) {
        if self.counting == 0 {
            return;
        }
        if self.pmu.version >= 2 {
            wrmsr(IA32_PERF_GLOBAL_CTRL, self.counting);
        } else {
            wrmsr(IA32_PERFEVTSEL0, EVTSEL_INSTRUCTIONS);
        }
    }

    fn stop(&self) {
        if self.counting == 0 {
            return;
        }
        if self.pmu.version >= 2 {
            wrmsr(IA32_PERF_GLOBAL_CTRL, 0);
        } else {
            wrmsr(IA32_PERFEVTSEL0, EVTSEL_INSTRUCTIONS & !PERFEVTSEL_EN);
        }
    }

    /// Runs `f` with the phase's counters counting (printing happens between, not counted).
    fn counted<T>(&self, f: impl FnOnce() -> T) -> T {
        self.start();
        let r = f();
        self.stop();
        r
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Counter {
    Gp(u32),
    Fixed(u32),
}

impl Counter {
    fn mask(self) -> u64 {
        match self {
            Counter::Gp(i) => 1 << i,
            Counter::Fixed(i) => 1 << (32 + i),
        }
    }

    fn ecx(self) -> u32 {
        match self {
            Counter::Gp(i) => i,
            Counter::Fixed(i) => FIXED | i,
        }
    }

    fn msr(self) -> u32 {
        match self {
            Counter::Gp(i) => IA32_PMC0 + i,
            Counter::Fixed(i) => IA32_FIXED_CTR0 + i,
        }
    }
}

impl core::fmt::Display for Counter {
    fn fmt(&self, f: &mut core::fmt::Formatter) -> core::fmt::Result {
        match self {
            Counter::Gp(i) => write!(f, "IA32_PMC{i}"),
            Counter::Fixed(i) => write!(f, "IA32_FIXED_CTR{i}"),
        }
    }
}

/// The counters the profile has: GP, then fixed.
fn counters(pmu: &Perfmon) -> impl Iterator<Item = Counter> + '_ {
    (0..u32::from(pmu.gp)).map(Counter::Gp).chain((0..32).filter(|&i| pmu.fixed_supported(i as u8)).map(Counter::Fixed))
}

/// Sign-extends bit 31 of `v` and truncates to `width` bits: what a legacy IA32_PMCx write
/// leaves (SDM 18.2.5).
fn sign_extended(v: u32, width: u8) -> u64 {
    (v as i32 as i64 as u64) & Perfmon::max(width)
}

/// Writes a known value to every counter the phase does not count (and a small start to those
/// it does); returns what each must read.
fn load(phase: &Phase, full_width: bool) -> [(Counter, u64); 12] {
    let pmu = &phase.pmu;
    let mut out = [(Counter::Gp(0), 0u64); 12];
    for (n, c) in counters(pmu).enumerate() {
        let want = match c {
            _ if phase.counts(c) => {
                wrmsr(c.msr(), COUNTING_START);
                COUNTING_START
            }
            Counter::Gp(i) if full_width => {
                let v = (0xFF01_2345_6700 | u64::from(i)) & Perfmon::max(pmu.gp_width);
                wrmsr(IA32_A_PMC0 + i, v);
                v
            }
            Counter::Gp(i) => {
                wrmsr(c.msr(), u64::from(0x89AB_CD00 | i));
                sign_extended(0x89AB_CD00 | i, pmu.gp_width)
            }
            Counter::Fixed(i) => {
                let v = 0xFF01_2345_6789_AB00 | u64::from(i);
                wrmsr(c.msr(), v & Perfmon::max(pmu.fixed_width));
                v & Perfmon::max(pmu.fixed_width)
            }
        };
        out[n] = (c, want);
    }
    out
}

/// RDPMC of every counter, full and fast, against what was written (or, for a counter that
/// counts, against the RDMSRs around it).
fn check_reads(phase: &Phase, full_width: bool) {
    let how = if full_width { "full-width write" } else { "write" };
    let loaded = load(phase, full_width);
    for &(c, want) in loaded.iter().take(counters(&phase.pmu).count()) {
        if phase.counts(c) {
            let (before, v, fast, after) =
                phase.counted(|| (rdmsr(c.msr()), rdpmc(c.ecx()), rdpmc(FAST | c.ecx()), rdmsr(c.msr())));
            let ok = COUNTING_START <= before
                && before <= v
                && v <= after
                && before as u32 <= fast as u32
                && fast <= after & 0xFFFF_FFFF;
            if !ok {
                println!("  RDMSR {before:#x}, RDPMC {v:#x}, fast {fast:#x}, RDMSR {after:#x}");
            }
            check!(
                ok,
                "{}: RDPMC {:#x} of counting {} reads between the RDMSRs around it, fast too",
                phase.name,
                c.ecx(),
                c
            );
            continue;
        }
        let (v, fast) = phase.counted(|| (rdpmc(c.ecx()), rdpmc(FAST | c.ecx())));
        check_eq!(v, want, "{}: RDPMC {:#x} reads {} after a {}", phase.name, c.ecx(), c, how);
        check_eq!(
            fast,
            want & 0xFFFF_FFFF,
            "{}: RDPMC {:#x} (fast) reads bits 31:0 of {}",
            phase.name,
            FAST | c.ecx(),
            c
        );
    }
}

fn check_faults(phase: &Phase) {
    let pmu = &phase.pmu;
    let no_fixed = (0..32).find(|&i| !pmu.fixed_supported(i as u8)).unwrap_or(31);
    for (ecx, what) in [
        (u32::from(pmu.gp), "the first GP index past the counters"),
        (0x1234, "GP index 0x1234"),
        (FIXED | no_fixed, "the first fixed index the profile lacks"),
        (FIXED | 0xFF, "fixed index 0xFF"),
        (FAST | u32::from(pmu.gp), "a fast read past the GP counters"),
    ] {
        let r = phase.counted(|| try_rdpmc(ecx));
        check!(matches!(r, Err(e) if e.is_gp()), "{}: RDPMC {:#x} ({}) raises #GP", phase.name, ecx, what);
    }
}

fn check_user_mode(phase: &Phase, want0: u64) {
    let cr4 = read_cr4();
    write_cr4(cr4 & !CR4_PCE);
    let r = phase.counted(|| user_read(0));
    check!(r.is_none(), "{}: RDPMC at CPL3 with CR4.PCE clear raises #GP", phase.name);
    write_cr4(cr4 | CR4_PCE);
    let c = Counter::Gp(0);
    let (before, r, after) = phase.counted(|| (rdmsr(c.msr()), user_read(0), rdmsr(c.msr())));
    write_cr4(cr4);
    let ok = match r {
        Some(v) if phase.counts(c) => before <= v && v <= after,
        Some(v) => v == want0,
        None => false,
    };
    if !ok {
        println!("  RDMSR {before:#x}, RDPMC at CPL3 {r:x?}, RDMSR {after:#x}; want {want0:#x}");
    }
    check!(ok, "{}: RDPMC 0 at CPL3 with CR4.PCE set reads IA32_PMC0", phase.name);
}

fn check_many(phase: &Phase) {
    let loaded = load(phase, false);
    let n = counters(&phase.pmu).count();
    let table: [(Counter, u64); 12] = loaded;
    let bad = phase.counted(|| {
        let mut bad = 0u32;
        for k in 0..300 {
            let (c, want) = table[k % n];
            if !phase.counts(c) && rdpmc(c.ecx()) != want {
                bad += 1;
            }
        }
        bad
    });
    check_eq!(bad, 0u32, "{}: 300 RDPMCs in a row read their counters", phase.name);
    let gp = table.iter().take(n).find(|(c, _)| !phase.counts(*c)).copied();
    GP_SEEN.store(0, SeqCst);
    idt::set_handler(GP_VECTOR, on_gp);
    let bad = phase.counted(|| {
        let mut bad = 0u32;
        for _ in 0..100 {
            non_canonical_load();
            if let Some((c, want)) = gp {
                if rdpmc(c.ecx()) != want {
                    bad += 1;
                }
            }
        }
        bad
    });
    idt::clear_handler(GP_VECTOR);
    check!(
        bad == 0 && GP_SEEN.load(SeqCst) == 100,
        "{}: 100 rounds of a real #GP (to the guest) and an RDPMC ({} #GPs seen, {} bad reads)",
        phase.name,
        GP_SEEN.load(SeqCst),
        bad
    );
}

fn run_phase(phase: &Phase) {
    check_reads(phase, false);
    if phase.pmu.fw_write() {
        check_reads(phase, true);
    }
    check_faults(phase);
    let loaded = load(phase, false);
    check_user_mode(phase, loaded[0].1);
    check_frame("a non-canonical load's #GP", phase, non_canonical_load);
    let bad = u32::from(phase.pmu.gp);
    check_frame("an RDPMC with a bad index's #GP", phase, || faulting_rdpmc(bad));
    check_many(phase);
}

static DB_SEEN: AtomicU64 = AtomicU64::new(0);
static DB_DR6: AtomicU64 = AtomicU64::new(0);

fn on_db(_regs: &mut Regs) {
    DB_SEEN.fetch_add(1, SeqCst);
    let dr6: u64;
    // SAFETY: reading and clearing DR6 at CPL0, as a #DB handler does. An instruction breakpoint
    // is a fault whose frame has RF clear, so it would fire again on return: it is turned off.
    unsafe {
        asm!("mov {}, dr6", out(reg) dr6);
        asm!("mov dr6, {}", in(reg) 0xFFFF_0FF0u64);
        if dr6 & DR6_B0 != 0 {
            asm!("mov dr7, {}", in(reg) 0x400u64);
        }
    }
    DB_DR6.fetch_or(dr6, SeqCst);
}

/// The guest's own #DBs: single-step traps from RFLAGS.TF, and its own hardware breakpoint.
fn check_guest_debug(pmu: &Perfmon) {
    idt::set_handler(DB_VECTOR, on_db);
    DB_SEEN.store(0, SeqCst);
    DB_DR6.store(0, SeqCst);
    // SAFETY: TF traps after each instruction from the first NOP to the POPFQ that clears it
    // (five), each taken by `on_db`.
    unsafe {
        asm!(
            "pushfq",
            "or qword ptr [rsp], {tf}",
            "popfq",
            "nop",
            "nop",
            "pushfq",
            "and qword ptr [rsp], {not_tf}",
            "popfq",
            tf = const RFLAGS_TF,
            not_tf = const !RFLAGS_TF,
        );
    }
    check_eq!(DB_SEEN.load(SeqCst), 5u64, "the guest's own single-step traps (RFLAGS.TF) reach its #DB handler");
    check!(DB_DR6.load(SeqCst) & DR6_BS != 0, "with DR6.BS set ({:#x})", DB_DR6.load(SeqCst));

    // The guest's own breakpoint: emon sees DR7 within a millisecond (and an exit) and stands
    // aside, so that the breakpoint fires in the guest.
    DB_SEEN.store(0, SeqCst);
    DB_DR6.store(0, SeqCst);
    let target: u64;
    // SAFETY: DR0 = the address of the NOP at 5: below (an instruction breakpoint, L0).
    unsafe {
        asm!("lea {t}, [rip + 5f]", "mov dr0, {t}", "jmp 6f", "5: nop", "ret", "6:", t = out(reg) target);
        asm!("mov dr7, {}", in(reg) 0x401u64);
    }
    let exits = || {
        for _ in 0..300 {
            emon_guest::pio::outb(0x80, 0);
        }
    };
    exits();
    // SAFETY: calls the NOP; RET after it (the breakpoint fires before the NOP, once).
    unsafe { asm!("call {}", in(reg) target, clobber_abi("C")) };
    check_eq!(DB_SEEN.load(SeqCst), 1u64, "the guest's own hardware breakpoint (DR7.L0) fires");
    check!(DB_DR6.load(SeqCst) & DR6_B0 != 0, "with DR6.B0 set ({:#x})", DB_DR6.load(SeqCst));
    // The handler turned the breakpoint off (DR7 = 0x400): emon puts its own back.
    exits();
    idt::clear_handler(DB_VECTOR);
    wrmsr(IA32_PMC0, 0x1234);
    let r = try_rdpmc(0);
    check!(r == Ok(sign_extended(0x1234, pmu.gp_width)), "RDPMC works again once the guest's DR7 is clear ({:x?})", r);
}

fn no_pmu() -> i32 {
    for ecx in [0, 1, FIXED, FAST, FAST | FIXED | 1] {
        check!(try_rdpmc(ecx).is_err_and(|e| e.is_gp()), "no PMU: RDPMC {:#x} raises #GP", ecx);
    }
    make_user_accessible();
    let cr4 = read_cr4();
    write_cr4(cr4 | CR4_PCE);
    let r = user_read(0);
    write_cr4(cr4);
    check!(r.is_none(), "no PMU: RDPMC 0 at CPL3 with CR4.PCE set raises #GP");
    emon_guest::summary()
}

fn main(_boot: &emon_guest::BootInfo) -> i32 {
    let pmu = Perfmon::from_cpuid();
    println!(
        "rdpmc: perfmon v{}, {} GP x {} bits, {} fixed x {} bits",
        pmu.version, pmu.gp, pmu.gp_width, pmu.fixed, pmu.fixed_width
    );
    if emon_guest::netburst::present() {
        emon_guest::skip!("RDPMC: a NetBurst processor has no architectural perfmon (CPUID.0AH reads 0); guest:netburst-counters reads its counters with RDPMC");
        return emon_guest::summary();
    }
    if pmu.version == 0 {
        return no_pmu();
    }
    if pmu.gp == 0 {
        emon_guest::skip!("RDPMC: the checks need IA32_PMC0");
        return emon_guest::summary();
    }
    make_user_accessible();
    if pmu.version >= 2 {
        wrmsr(IA32_PERF_GLOBAL_CTRL, 0);
    }
    run_phase(&Phase { name: "idle", pmu, counting: 0 });

    // PMC0 counts instructions; core cycles on FIXED_CTR1, else on PMC1.
    let mut counting = Counter::Gp(0).mask();
    wrmsr(IA32_PERFEVTSEL0, EVTSEL_INSTRUCTIONS);
    if pmu.version >= 2 && pmu.fixed_supported(1) {
        wrmsr(IA32_FIXED_CTR_CTRL, FIXED_EN_ALL << 4);
        counting |= Counter::Fixed(1).mask();
    } else if pmu.gp >= 2 && pmu.version >= 2 {
        wrmsr(IA32_PERFEVTSEL0 + 1, PERFEVTSEL_EN | PERFEVTSEL_OS | PERFEVTSEL_USR | 0x3C);
        counting |= Counter::Gp(1).mask();
    }
    if pmu.version == 1 {
        wrmsr(IA32_PERFEVTSEL0, EVTSEL_INSTRUCTIONS & !PERFEVTSEL_EN);
    }
    run_phase(&Phase { name: "counting", pmu, counting });
    wrmsr(IA32_PERFEVTSEL0, 0);
    wrmsr(IA32_PERFEVTSEL0 + 1, 0);
    if pmu.version >= 2 {
        wrmsr(IA32_FIXED_CTR_CTRL, 0);
    }
    check_guest_debug(&pmu);
    emon_guest::summary()
}
