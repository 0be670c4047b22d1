//! Records a known path's branches in the LBR stack and checks every entry: addresses, order, TOS, format flags, filters, wrap-around and freeze.
//!
//! The stack is the one the CPU's family and model name (`emon_guest::models`, as Linux knows it)
//! in the format IA32_PERF_CAPABILITIES[5:0] gives (SDM Vol. 3B 17.4.8 and 17.4.8.1). A path in
//! assembly sets IA32_DEBUGCTL.LBR itself, takes one branch of each kind the LBR filter knows
//! (near relative JMP, CALL, RET, JMP, an indirect JMP, a taken Jcc, a Jcc not taken, and the far
//! transfers of an exception's delivery and IRETQ), and
//! clears DEBUGCTL.LBR again; the guest then reads the stack back and compares every entry with
//! the branch it must hold, newest at MSR_LASTBRANCH_TOS. MISPRED and LBR_INFO's cycle count
//! follow emon's documented cost model (README, "The precise backend": a static predictor that
//! takes backward conditional branches and falls through forward ones; 1 cycle an instruction, +1
//! for a taken branch). The #GP copies the branch before it into MSR_LER_FROM_LIP/TO_LIP. Then
//! MSR_LBR_SELECT filters by branch type and ring, a loop wraps the stack around, and on v4+
//! GLOBAL_STATUS.LBR_Frz freezes it (SDM 17.4.7).
#![no_std]
#![no_main]

use core::arch::global_asm;
use emon_guest::cpu::cpuid;
use emon_guest::models::{self, Stack, MSR_LASTBRANCH_TOS, MSR_LBR_INFO_0, MSR_LBR_SELECT};
use emon_guest::msr::{rd, wr};
use emon_guest::{check, check_eq, println, skip, BootInfo};

emon_guest::entry!(main);

const IA32_DEBUGCTL: u32 = 0x1D9;
const MSR_LER_FROM_LIP: u32 = 0x1DD;
const MSR_LER_TO_LIP: u32 = 0x1DE;
const DEBUGCTL_LBR: u64 = 1;
const IA32_PERF_GLOBAL_STATUS: u32 = 0x38E;
const IA32_PERF_GLOBAL_STATUS_RESET: u32 = 0x390;
const IA32_PERF_GLOBAL_STATUS_SET: u32 = 0x391;
const STATUS_LBR_FRZ: u64 = 1 << 58;
/// MSR_LBR_SELECT bits (SDM Vol. 3B, "Filtering of Last Branch Records"): a set bit keeps those
/// branches out.
const SELECT_CPL_EQ_0: u64 = 1 << 0;
const SELECT_JCC: u64 = 1 << 2;
const SELECT_NEAR_REL_JMP: u64 = 1 << 7;

// The path: DEBUGCTL = rdi, then one branch of each kind, then DEBUGCTL = 0 and back. Interrupts
// stay off throughout, so that nothing else branches. `emon_lbr_loop` takes `rsi` - 1 backward
// Jcc branches and one that falls through.
global_asm!(
    ".section .text",
    // Interrupts off, DEBUGCTL = edi; and back.
    ".macro lbr_on",
    "pushfq",
    "cli",
    "mov ecx, 0x1D9",
    "mov eax, edi",
    "xor edx, edx",
    "wrmsr",
    ".endm",
    ".macro lbr_off",
    "mov ecx, 0x1D9",
    "xor eax, eax",
    "xor edx, edx",
    "wrmsr",
    "popfq",
    ".endm",
    ".global emon_lbr_path",
    "emon_lbr_path:",
    "lbr_on",
    ".global emon_lbr_b1",
    "emon_lbr_b1: jmp emon_lbr_t1",
    "ud2",
    ".global emon_lbr_t1",
    "emon_lbr_t1:",
    ".global emon_lbr_b2",
    "emon_lbr_b2: call emon_lbr_t2",
    ".global emon_lbr_b4",
    "emon_lbr_b4: jmp emon_lbr_t4",
    ".global emon_lbr_t2",
    "emon_lbr_t2:",
    ".global emon_lbr_b3",
    "emon_lbr_b3: ret",
    ".global emon_lbr_t4",
    "emon_lbr_t4:",
    "lea rax, [rip + emon_lbr_t5]",
    ".global emon_lbr_b5",
    "emon_lbr_b5: jmp rax",
    "ud2",
    ".global emon_lbr_t5",
    "emon_lbr_t5:",
    "xor ecx, ecx",
    ".global emon_lbr_b6",
    "emon_lbr_b6: jz emon_lbr_t6",
    "ud2",
    ".global emon_lbr_t6",
    "emon_lbr_t6:",
    "cmp ecx, 1",
    "je 3f",
    "mov ecx, 0xDEAD0000",
    ".global emon_lbr_b7",
    "emon_lbr_b7: rdmsr",
    ".global emon_lbr_t8",
    "emon_lbr_t8:",
    "lbr_off",
    "ret",
    "3: ud2",
    // The #GP handler: drop the error code, return past the 2-byte RDMSR.
    ".global emon_lbr_gp",
    "emon_lbr_gp:",
    "add rsp, 8",
    "add qword ptr [rsp], 2",
    ".global emon_lbr_b8",
    "emon_lbr_b8: iretq",
    ".global emon_lbr_loop",
    "emon_lbr_loop:",
    "lbr_on",
    "mov rcx, rsi",
    ".global emon_lbr_loop_top",
    "emon_lbr_loop_top:",
    "dec rcx",
    ".global emon_lbr_loop_branch",
    "emon_lbr_loop_branch: jnz emon_lbr_loop_top",
    "lbr_off",
    "ret",
);

extern "C" {
    fn emon_lbr_path(debugctl: u64);
    fn emon_lbr_loop(debugctl: u64, iterations: u64);
    static emon_lbr_b1: u8;
    static emon_lbr_t1: u8;
    static emon_lbr_b2: u8;
    static emon_lbr_t2: u8;
    static emon_lbr_b3: u8;
    static emon_lbr_b4: u8;
    static emon_lbr_t4: u8;
    static emon_lbr_b5: u8;
    static emon_lbr_t5: u8;
    static emon_lbr_b6: u8;
    static emon_lbr_t6: u8;
    static emon_lbr_b7: u8;
    static emon_lbr_gp: u8;
    static emon_lbr_b8: u8;
    static emon_lbr_t8: u8;
    static emon_lbr_loop_top: u8;
    static emon_lbr_loop_branch: u8;
}

fn addr(label: &u8) -> u64 {
    label as *const u8 as u64
}

/// One record the stack must hold: from, to, MISPRED, and LBR_INFO's cycle count (`None`: not
/// checked, the first record's count reaches back before the path).
#[derive(Clone, Copy)]
struct Expected {
    name: &'static str,
    from: u64,
    to: u64,
    mispredicted: bool,
    cycles: Option<u64>,
}

/// The path's eight taken branches, in order: the #GP that RDMSR of a missing MSR raises is
/// delivered as a far branch from the RDMSR to the handler, which returns with IRETQ. Cycles:
/// CALL, RET and JMP are 2 each (1 + taken); LEA + indirect JMP 1 + 2; XOR + taken JZ 1 + 2; CMP,
/// JE not taken and MOV 1 each (the faulting RDMSR does not retire); the handler's two ADDs
/// 1 + 2 (a memory operand) and IRETQ 2. The forward taken JZ is the one the static predictor
/// gets wrong.
fn path_records() -> [Expected; 8] {
    let e = |name, from: &u8, to: &u8, mispredicted, cycles| Expected {
        name,
        from: addr(from),
        to: addr(to),
        mispredicted,
        cycles,
    };
    // SAFETY: only the labels' addresses are taken.
    unsafe {
        [
            e("JMP rel", &emon_lbr_b1, &emon_lbr_t1, false, None),
            e("CALL rel", &emon_lbr_b2, &emon_lbr_t2, false, Some(2)),
            e("RET", &emon_lbr_b3, &emon_lbr_b4, false, Some(2)),
            e("JMP rel 2", &emon_lbr_b4, &emon_lbr_t4, false, Some(2)),
            e("JMP RAX", &emon_lbr_b5, &emon_lbr_t5, false, Some(3)),
            e("JZ taken", &emon_lbr_b6, &emon_lbr_t6, true, Some(3)),
            e("#GP", &emon_lbr_b7, &emon_lbr_gp, false, Some(3)),
            e("IRETQ", &emon_lbr_b8, &emon_lbr_t8, false, Some(5)),
        ]
    }
}

struct Lbr {
    stack: Stack,
    format: u64,
}

/// The path's #GP copied the last branch taken before it, the JZ (filtered out of the stack or
/// not), into MSR_LER_FROM_LIP/TO_LIP (SDM 17.4.8). Clears them for the next check.
fn expect_ler(what: &str, path: &[Expected; 8]) {
    let ler = (rd(MSR_LER_FROM_LIP), rd(MSR_LER_TO_LIP));
    check!(ler == (path[5].from, path[5].to), "{}: LER_FROM/TO_LIP hold the JZ before the #GP", what);
    wr(MSR_LER_FROM_LIP, 0);
    wr(MSR_LER_TO_LIP, 0);
}

impl Lbr {
    fn tos(&self) -> u64 {
        rd(MSR_LASTBRANCH_TOS)
    }

    /// Entry `back` places behind TOS: (FROM_IP, TO_IP, LBR_INFO or 0).
    fn entry(&self, tos: u64, back: u64) -> (u64, u64, u64) {
        let depth = u64::from(self.stack.depth);
        let n = ((tos + depth - back % depth) % depth) as u32;
        let info = if self.stack.info { rd(MSR_LBR_INFO_0 + n) } else { 0 };
        (rd(self.stack.from + n), rd(self.stack.to + n), info)
    }

    /// FROM_IP's address and MISPRED in this format (SDM 17.4.8.1): formats 3 and 4 keep MISPRED
    /// in bit 63 (and format 4 two TSX flags below it) above a sign-extended address; format 5
    /// keeps it in LBR_INFO.
    fn decode(&self, from: u64, info: u64) -> (u64, bool) {
        let sign_extend = |v: u64, bits: u32| (((v << (64 - bits)) as i64) >> (64 - bits)) as u64;
        match self.format {
            3 => (sign_extend(from, 63), from >> 63 != 0),
            4 => (sign_extend(from, 61), from >> 63 != 0),
            5 => (from, info >> 63 != 0),
            _ => (from, false),
        }
    }

    /// Checks that the newest `want.len()` records (as many as the stack holds) are `want`, in
    /// order, and that TOS moved by `want.len()` from `tos0`.
    fn expect(&self, what: &str, tos0: u64, want: &[Expected]) {
        let depth = u64::from(self.stack.depth);
        let tos = self.tos();
        check_eq!(tos, (tos0 + want.len() as u64) % depth, "{}: TOS moved by {} entries", what, want.len());
        let held = want.len().min(self.stack.depth as usize);
        for (back, w) in want.iter().rev().take(held).enumerate() {
            let (from, to, info) = self.entry(tos, back as u64);
            let (address, mispredicted) = self.decode(from, info);
            let flags_kept = matches!(self.format, 3..=5);
            let cycles = if self.stack.info { w.cycles } else { None };
            let ok = address == w.from
                && to == w.to
                && (!flags_kept || mispredicted == w.mispredicted)
                && cycles.is_none_or(|c| info & 0xFFFF == c);
            if !ok {
                println!(
                    "  got FROM {:#x} TO {:#x} MISPRED {} cycles {}; want {:#x} -> {:#x} MISPRED {} cycles {:?}",
                    address,
                    to,
                    mispredicted,
                    info & 0xFFFF,
                    w.from,
                    w.to,
                    w.mispredicted,
                    cycles
                );
            }
            check!(ok, "{}: {} entry {} behind TOS", what, w.name, back);
        }
    }
}

fn main(_boot: &BootInfo) -> i32 {
    let cpu = match models::identify() {
        models::Identified::Known(cpu) => cpu,
        models::Identified::NoPerfmon => {
            skip!("LBR stack: this CPU has no architectural perfmon and emon presents no LBR stack with it");
            return emon_guest::summary();
        }
        models::Identified::Unknown { family, model } => {
            skip!("LBR stack: family {:#x} model {:#x} is not in this guest's table", family, model);
            return emon_guest::summary();
        }
    };
    let lbr = Lbr { stack: cpu.lbr, format: models::lbr_format() };
    println!("{}: {}-entry LBR stack, format {}", cpu.name, lbr.stack.depth, lbr.format);
    let version = cpuid(0xA, 0).eax & 0xFF;
    let path = path_records();
    // SAFETY: only the handler's address is taken; it is the path's own, and returns past the RDMSR.
    emon_guest::idt::set_raw_gate(13, unsafe { addr(&emon_lbr_gp) });

    // Off: DEBUGCTL.LBR clear records nothing.
    let tos0 = lbr.tos();
    // SAFETY: the path only branches within itself and writes IA32_DEBUGCTL.
    unsafe { emon_lbr_path(0) };
    check_eq!(lbr.tos(), tos0, "DEBUGCTL.LBR clear: nothing recorded");

    // On: every taken branch, in order.
    let tos0 = lbr.tos();
    unsafe { emon_lbr_path(DEBUGCTL_LBR) };
    lbr.expect("the path", tos0, &path);
    expect_ler("the path", &path);

    if lbr.stack.select != 0 {
        // No Jcc and no near relative JMP: the CALL, the RET and the indirect JMP remain.
        wr(MSR_LBR_SELECT, SELECT_JCC | SELECT_NEAR_REL_JMP);
        let tos0 = lbr.tos();
        unsafe { emon_lbr_path(DEBUGCTL_LBR) };
        // Their cycle counts reach back to the last recorded branch: not checked here.
        let kept = [path[1], path[2], path[4], path[6], path[7]].map(|e| Expected { cycles: None, ..e });
        lbr.expect("LBR_SELECT without JCC and NEAR_REL_JMP", tos0, &kept);
        expect_ler("LBR_SELECT without JCC and NEAR_REL_JMP", &path);
        // Nothing that ends in ring 0.
        wr(MSR_LBR_SELECT, SELECT_CPL_EQ_0);
        let tos0 = lbr.tos();
        unsafe { emon_lbr_path(DEBUGCTL_LBR) };
        check_eq!(lbr.tos(), tos0, "LBR_SELECT.CPL_EQ_0: nothing recorded at ring 0");
        expect_ler("LBR_SELECT.CPL_EQ_0", &path);
        wr(MSR_LBR_SELECT, 0);
    } else {
        skip!("MSR_LBR_SELECT: {} has none", cpu.name);
    }

    // Wrap-around: depth + 3 iterations take depth + 2 backward branches, all predicted.
    let iterations = u64::from(lbr.stack.depth) + 3;
    let tos0 = lbr.tos();
    unsafe { emon_lbr_loop(DEBUGCTL_LBR, iterations) };
    // SAFETY: only the labels' addresses are taken.
    let (top, branch) = unsafe { (addr(&emon_lbr_loop_top), addr(&emon_lbr_loop_branch)) };
    let taken = Expected { name: "loop JNZ", from: branch, to: top, mispredicted: false, cycles: Some(3) };
    let mut loop_records = [taken; 35];
    loop_records[0].cycles = None;
    lbr.expect("a loop around the stack", tos0, &loop_records[..(iterations - 1) as usize]);

    // Freeze (v4+): GLOBAL_STATUS.LBR_Frz stops the stack until it is cleared.
    if version >= 4 {
        wr(IA32_PERF_GLOBAL_STATUS_SET, STATUS_LBR_FRZ);
        check_eq!(rd(IA32_PERF_GLOBAL_STATUS) & STATUS_LBR_FRZ, STATUS_LBR_FRZ, "LBR_Frz set");
        let tos0 = lbr.tos();
        unsafe { emon_lbr_path(DEBUGCTL_LBR) };
        check_eq!(lbr.tos(), tos0, "LBR_Frz: the stack is frozen");
        wr(IA32_PERF_GLOBAL_STATUS_RESET, STATUS_LBR_FRZ);
        let tos0 = lbr.tos();
        unsafe { emon_lbr_path(DEBUGCTL_LBR) };
        lbr.expect("after LBR_Frz is cleared", tos0, &path.map(|e| Expected { cycles: None, ..e }));
    } else {
        skip!("LBR_Frz: version {} freezes by clearing DEBUGCTL.LBR on a PMI", version);
    }
    emon_guest::idt::set_default_gate(13);
    check_eq!(rd(IA32_DEBUGCTL), 0, "DEBUGCTL is back at 0");
    emon_guest::summary()
}
