//! BTS, the Branch Trace Store: a known path's branch records in the DS area's BTS buffer, in order, with the CPL filter, the circular buffer and the threshold interrupt.
//!
//! Where BTS is available (IA32_MISC_ENABLE.BTS_UNAVAILABLE clear; SDM Vol. 3B 17.4.9 and the
//! seed's DS buffer management area), a path in assembly sets IA32_DEBUGCTL.TR and BTS itself,
//! takes four branches (JMP, CALL, RET, JMP) and clears DEBUGCTL again. Every record (branch
//! from, branch to, and bit 4 of the flags word: predicted, as emon's static predictor says for
//! unconditional branches) must be the branch it stands for, in order. Then: BTS_OFF_OS stores
//! nothing at CPL 0; without BTINT the buffer is circular and the fourth record wraps to the
//! base; with BTINT one PMI comes at the interrupt threshold, and nothing is stored past the
//! absolute maximum.
#![no_std]
#![no_main]

use core::arch::global_asm;
use core::sync::atomic::{AtomicU64, Ordering::SeqCst};
use emon_guest::cpu::{enable_interrupts, rdmsr, wrmsr};
use emon_guest::pmu::{APIC_PERFMON_VECTOR, IA32_DS_AREA, IA32_MISC_ENABLE};
use emon_guest::{apic, check, check_eq, idt, println, skip, BootInfo};

emon_guest::entry!(main);

const MISC_ENABLE_BTS_UNAVAILABLE: u64 = 1 << 11;
const DEBUGCTL_TR: u64 = 1 << 6;
const DEBUGCTL_BTS: u64 = 1 << 7;
const DEBUGCTL_BTINT: u64 = 1 << 8;
const DEBUGCTL_BTS_OFF_OS: u64 = 1 << 9;
const RECORD: u64 = 24;
/// Records the buffer has room for (the tests use fewer), and one more that must stay 0.
const ROOM: usize = 8;

// The path: DEBUGCTL = rdi, four branches, DEBUGCTL = 0. Interrupts stay off until the POPFQ.
global_asm!(
    ".section .text",
    ".global emon_bts_path",
    "emon_bts_path:",
    "pushfq",
    "cli",
    "mov ecx, 0x1D9",
    "mov eax, edi",
    "xor edx, edx",
    "wrmsr",
    ".global emon_bts_b1",
    "emon_bts_b1: jmp emon_bts_t1",
    "ud2",
    ".global emon_bts_t1",
    "emon_bts_t1:",
    ".global emon_bts_b2",
    "emon_bts_b2: call emon_bts_t2",
    ".global emon_bts_b4",
    "emon_bts_b4: jmp emon_bts_t4",
    ".global emon_bts_t2",
    "emon_bts_t2:",
    ".global emon_bts_b3",
    "emon_bts_b3: ret",
    ".global emon_bts_t4",
    "emon_bts_t4:",
    "mov ecx, 0x1D9",
    "xor eax, eax",
    "xor edx, edx",
    "wrmsr",
    "popfq",
    "ret",
);

extern "C" {
    fn emon_bts_path(debugctl: u64);
    static emon_bts_b1: u8;
    static emon_bts_t1: u8;
    static emon_bts_b2: u8;
    static emon_bts_t2: u8;
    static emon_bts_b3: u8;
    static emon_bts_b4: u8;
    static emon_bts_t4: u8;
}

fn addr(label: &u8) -> u64 {
    label as *const u8 as u64
}

/// The path's four branches, in order: (from, to).
fn path() -> [(u64, u64); 4] {
    // SAFETY: only the labels' addresses are taken.
    unsafe {
        [
            (addr(&emon_bts_b1), addr(&emon_bts_t1)),
            (addr(&emon_bts_b2), addr(&emon_bts_t2)),
            (addr(&emon_bts_b3), addr(&emon_bts_b4)),
            (addr(&emon_bts_b4), addr(&emon_bts_t4)),
        ]
    }
}

#[repr(C, align(4096))]
struct Ds {
    area: [u64; 20],
    bts: [[u64; 3]; ROOM + 1],
}

static mut DS: Ds = Ds { area: [0; 20], bts: [[0; 3]; ROOM + 1] };
static PMIS: AtomicU64 = AtomicU64::new(0);

fn pmi_handler(_regs: &mut idt::Regs) {
    PMIS.fetch_add(1, SeqCst);
    apic::write(apic::LVT_PMC, apic::read(apic::LVT_PMC) & !apic::LVT_MASKED);
    apic::eoi();
}

/// Runs the path with `debugctl` over a BTS buffer of `room` records with the interrupt
/// threshold after `threshold` records; returns the BTS index, in records, and the buffer.
fn run(debugctl: u64, room: u64, threshold: u64) -> (u64, [[u64; 3]; ROOM + 1]) {
    let ds = &raw mut DS;
    // SAFETY: the guest's own statics, single CPU; BTS writes them only while the path runs.
    unsafe {
        (*ds).bts = [[0; 3]; ROOM + 1];
        let base = (*ds).bts.as_ptr() as u64;
        (&mut (*ds).area)[..4].copy_from_slice(&[base, base, base + room * RECORD, base + threshold * RECORD]);
        wrmsr(IA32_DS_AREA, (*ds).area.as_ptr() as u64);
        PMIS.store(0, SeqCst);
        emon_bts_path(debugctl);
        wrmsr(IA32_DS_AREA, 0);
        (((*ds).area[1] - base) / RECORD, (*ds).bts)
    }
}

/// The record for branch `b`: from, to, and bit 4 of the flags (predicted).
fn record(b: (u64, u64)) -> [u64; 3] {
    [b.0, b.1, 1 << 4]
}

fn main(_boot: &BootInfo) -> i32 {
    if rdmsr(IA32_MISC_ENABLE) & MISC_ENABLE_BTS_UNAVAILABLE != 0 {
        skip!("BTS unavailable according to MISC_ENABLE");
        return emon_guest::summary();
    }
    idt::set_handler(APIC_PERFMON_VECTOR, pmi_handler);
    apic::enable();
    apic::write(apic::LVT_PMC, APIC_PERFMON_VECTOR as u32);
    enable_interrupts();
    let branches = path();
    let on = DEBUGCTL_TR | DEBUGCTL_BTS;

    let (index, buf) = run(on, ROOM as u64, ROOM as u64);
    check_eq!(index, 4u64, "four branches, four records");
    for (n, b) in branches.iter().enumerate() {
        let ok = buf[n] == record(*b);
        if !ok {
            println!("  record {}: {:#x?}, want {:#x?}", n, buf[n], record(*b));
        }
        check!(ok, "record {}: the path's branch {} (from, to, predicted)", n, n);
    }
    check!(buf[4..].iter().all(|r| *r == [0; 3]), "nothing past the last record");
    check_eq!(PMIS.load(SeqCst), 0u64, "no interrupt without BTINT");

    let (index, _) = run(on | DEBUGCTL_BTS_OFF_OS, ROOM as u64, ROOM as u64);
    check_eq!(index, 0u64, "BTS_OFF_OS: nothing stored at CPL 0");

    // Circular: room for three; the fourth record goes to the base.
    let (index, buf) = run(on, 3, 3);
    check_eq!(index, 1u64, "without BTINT the index wraps to the base");
    let want = [record(branches[3]), record(branches[1]), record(branches[2])];
    check!(buf[..3] == want, "the fourth record overwrote the first");

    // BTINT: one PMI when the index reaches the threshold; records go on to the maximum.
    let (index, _) = run(on | DEBUGCTL_BTINT, ROOM as u64, 2);
    check_eq!(index, 4u64, "with BTINT records go on past the threshold");
    check_eq!(PMIS.load(SeqCst), 1u64, "one PMI at the BTS interrupt threshold");
    let (index, buf) = run(on | DEBUGCTL_BTINT, 2, 2);
    check_eq!(index, 2u64, "with BTINT nothing is stored at the absolute maximum");
    check!(buf[2] == [0; 3], "no record past the absolute maximum");
    check_eq!(PMIS.load(SeqCst), 1u64, "one PMI when the buffer fills");
    emon_guest::summary()
}
