//! Page-table writes the kernel makes are seen by user mode, as on silicon: a 4 KiB mapping that
//! user code has used is moved to another page, removed, restored and moved again, each followed by
//! the flush the SDM asks for (INVLPG, a MOV to CR3, or none for a not-present entry made present,
//! SDM Vol. 3A 4.10.4.3), and a page-directory entry is pointed at another page table. After each
//! change, user code reads the address again (uncounted, and counted) and must see the new mapping.
#![no_std]
#![no_main]

use core::arch::{asm, global_asm};
use core::sync::atomic::{AtomicU64, Ordering::SeqCst};
use emon_guest::cpu::wrmsr;
use emon_guest::pmu::*;
use emon_guest::user::{self, make_user_accessible};
use emon_guest::{check_eq, println};

emon_guest::entry!(main);

/// The virtual address the test maps with 4 KiB pages: the first 2 MiB of the fourth GiB, which the
/// boot-time identity map covers with a 2 MiB page and no RAM.
const VA: u64 = 0xC000_0000;

#[repr(C, align(4096))]
struct Page([u64; 512]);

static mut PT: Page = Page([0; 512]);
static mut PT2: Page = Page([0; 512]);
static mut DATA_A: Page = Page([0; 512]);
static mut DATA_B: Page = Page([0; 512]);
static mut DATA_C: Page = Page([0; 512]);

const PRESENT: u64 = 1;
const WRITABLE: u64 = 1 << 1;
const USER: u64 = 1 << 2;
const LEAF: u64 = PRESENT | WRITABLE | USER;

/// What the user read at [`VA`].
static SEEN: AtomicU64 = AtomicU64::new(0);

global_asm!(
    ".global user_read",
    "user_read:",
    "mov rax, qword ptr [{va}]",
    "mov [rip + {seen}], rax",
    "hlt", // #GP at CPL3: back to the kernel
    va = const VA,
    seen = sym SEEN,
);

extern "C" {
    fn user_read();
}

fn page_addr(p: *const Page) -> u64 {
    p as u64
}

fn invlpg(va: u64) {
    // SAFETY: INVLPG only drops translations.
    unsafe { asm!("invlpg [{}]", in(reg) va, options(nostack)) };
}

fn reload_cr3() {
    // SAFETY: writing CR3 with its own value flushes the non-global translations.
    unsafe { asm!("mov {0}, cr3", "mov cr3, {0}", out(reg) _, options(nostack)) };
}

fn read_cr2() -> u64 {
    let v: u64;
    // SAFETY: reading CR2.
    unsafe { asm!("mov {}, cr2", out(reg) v, options(nostack)) };
    v
}

/// The page-directory entry that maps [`VA`] (the boot map: PD pages from CR3's PDPT).
fn pde() -> *mut u64 {
    const ADDR: u64 = 0x000F_FFFF_FFFF_F000;
    let cr3: u64;
    // SAFETY: reading CR3.
    unsafe { asm!("mov {}, cr3", out(reg) cr3) };
    // SAFETY: the boot page tables are identity-mapped RAM the kernel owns.
    unsafe {
        let pml4e = *((cr3 & ADDR) as *const u64).add((VA >> 39) as usize & 511);
        let pdpte = *((pml4e & ADDR) as *const u64).add((VA >> 30) as usize & 511);
        ((pdpte & ADDR) as *mut u64).add((VA >> 21) as usize & 511)
    }
}

fn set_pte(table: *mut Page, value: u64) {
    // SAFETY: the test's own page table; a volatile store, as a kernel writes a PTE.
    unsafe { core::ptr::write_volatile(&raw mut (*table).0[0], value) };
}

/// Reads [`VA`] from user mode, with counting off (user code runs where the host runs it) and
/// with PMC0 counting user-mode instructions (the precise backend runs it in its engine); both
/// must see `want`, and the counted run counts the reader's 2 instructions before its HLT.
fn check_read(want: u64, what: &str) {
    for counted in [false, true] {
        SEEN.store(0, SeqCst);
        if counted {
            wrmsr(IA32_PERF_GLOBAL_CTRL, 0);
            wrmsr(IA32_PMC0, 0);
            wrmsr(IA32_PERFEVTSEL0, PERFEVTSEL_EN | PERFEVTSEL_USR | 0xC0);
            wrmsr(IA32_PERF_GLOBAL_CTRL, 1);
        }
        let v = user::run_user(user_read, 0);
        if counted {
            wrmsr(IA32_PERF_GLOBAL_CTRL, 0);
            wrmsr(IA32_PERFEVTSEL0, 0);
        }
        let how = if counted { "counted" } else { "uncounted" };
        check_eq!(v, 13u8, "{what} ({how}): the reader ends in its #GP");
        check_eq!(SEEN.load(SeqCst), want, "{what} ({how}): user mode reads the new mapping");
    }
}

/// As [`check_read`] for a mapping that is gone: the read raises #PF with CR2 = [`VA`].
fn check_fault(what: &str) {
    let e = user::run_user_caught(user_read, 0);
    check_eq!(e.map_or(0xFF, |e| e.vector), 14u8, "{what}: user mode's read raises #PF");
    check_eq!(read_cr2(), VA, "{what}: CR2 is the address");
    // SDM Vol. 3A 4.7: not present, a read, from user mode.
    check_eq!(e.map_or(0, |e| e.error_code), 0b100u32, "{what}: the error code says not present, read, user");
}

fn main(_boot: &emon_guest::BootInfo) -> i32 {
    let pmu = Perfmon::from_cpuid();
    let counts = pmu.version >= 1 && pmu.gp >= 1 && pmu.event_available(EVENT_INSTRUCTIONS);
    make_user_accessible();
    // SAFETY: the test's own pages, written before any use.
    let (pt, pt2, a, b, c) = unsafe {
        let fill = |p: *mut Page, v: u64| (*p).0[0] = v;
        fill(&raw mut DATA_A, 0xAAAA);
        fill(&raw mut DATA_B, 0xBBBB);
        fill(&raw mut DATA_C, 0xCCCC);
        (
            &raw mut PT,
            &raw mut PT2,
            page_addr(&raw const DATA_A),
            page_addr(&raw const DATA_B),
            page_addr(&raw const DATA_C),
        )
    };
    set_pte(pt, a | LEAF);
    let pde = pde();
    // SAFETY: the boot PD entry for VA (a 2 MiB page over no RAM) now points at the test's table.
    unsafe { core::ptr::write_volatile(pde, page_addr(pt) | LEAF) };
    reload_cr3();
    let check = |want: u64, what: &str| {
        if counts {
            check_read(want, what);
        } else {
            SEEN.store(0, SeqCst);
            check_eq!(user::run_user(user_read, 0), 13u8, "{what}: the reader ends in its #GP");
            check_eq!(SEEN.load(SeqCst), want, "{what}: user mode reads the new mapping");
        }
    };
    check(0xAAAA, "first mapping");
    set_pte(pt, b | LEAF);
    invlpg(VA);
    check(0xBBBB, "PTE moved, INVLPG");
    set_pte(pt, c | LEAF);
    reload_cr3();
    check(0xCCCC, "PTE moved, MOV to CR3");
    set_pte(pt, 0);
    invlpg(VA);
    check_fault("PTE cleared, INVLPG");
    // A not-present entry made present needs no flush (SDM Vol. 3A 4.10.4.3).
    set_pte(pt, a | LEAF);
    check(0xAAAA, "PTE made present, no flush");
    // The page-directory entry moved to another table (INVLPG drops the paging-structure caches
    // for the address too, SDM Vol. 3A 4.10.4.1).
    set_pte(pt2, b | LEAF);
    // SAFETY: as above.
    unsafe { core::ptr::write_volatile(pde, page_addr(pt2) | LEAF) };
    invlpg(VA);
    check(0xBBBB, "PDE moved to another table, INVLPG");
    // And the first table, changed while the PDE pointed elsewhere, is used again.
    set_pte(pt, c | LEAF);
    // SAFETY: as above.
    unsafe { core::ptr::write_volatile(pde, page_addr(pt) | LEAF) };
    reload_cr3();
    check(0xCCCC, "PDE back on the first table, changed meanwhile, MOV to CR3");
    println!("page tables: every change seen by user mode");
    emon_guest::summary()
}
