//! Instructions at CPL0 that a host KVM may be unable to emulate although the guest sees their
//! features (README, "Linux guests"), each as the SDM defines it: INT3 delivers #BP with the
//! address after it on the stack, POPCNT counts bits and sets only ZF, CLAC and STAC clear and
//! set RFLAGS.AC, LOCK CMPXCHG16B compares and swaps 128 bits. On kvm_pvm emon completes each one; elsewhere the CPU runs them.
#![no_std]
#![no_main]

use core::arch::asm;
use core::hint::black_box;
use core::sync::atomic::{AtomicU64, Ordering};
use emon_guest::cpu::{cpuid, max_leaf};
use emon_guest::idt::{self, Regs};
use emon_guest::{check, check_eq, skip};

emon_guest::entry!(main);

/// RFLAGS bits (SDM Vol. 1, 3.4.3).
const CF: u64 = 1 << 0;
const PF: u64 = 1 << 2;
const AF: u64 = 1 << 4;
const ZF: u64 = 1 << 6;
const SF: u64 = 1 << 7;
const OF: u64 = 1 << 11;
const AC: u64 = 1 << 18;
const ARITH: u64 = CF | PF | AF | ZF | SF | OF;

static BP_COUNT: AtomicU64 = AtomicU64::new(0);
static BP_RIP: AtomicU64 = AtomicU64::new(0);
static BP_CS: AtomicU64 = AtomicU64::new(0);

fn on_breakpoint(r: &mut Regs) {
    BP_COUNT.fetch_add(1, Ordering::SeqCst);
    BP_RIP.store(r.rip, Ordering::SeqCst);
    BP_CS.store(r.cs, Ordering::SeqCst);
}

/// INT3 is a trap (SDM Vol. 3A, 6.5 "Exception Classifications"): the handler sees the address
/// of the instruction after it, and execution resumes there.
fn int3() {
    idt::set_handler(3, on_breakpoint);
    for round in 1..=3u64 {
        let (after, rax): (u64, u64);
        // SAFETY: INT3 goes to `on_breakpoint`, which returns through IRETQ to the next
        // instruction; RAX survives the handler.
        unsafe {
            asm!(
                "mov rax, 0x1234",
                "int3",
                "2:",
                "lea {after}, [rip + 2b]",
                after = out(reg) after,
                out("rax") rax,
            );
        }
        check_eq!(BP_COUNT.load(Ordering::SeqCst), round, "INT3 #{}: one #BP", round);
        check_eq!(BP_RIP.load(Ordering::SeqCst), after, "INT3 #{}: #BP's RIP is the next instruction's", round);
        check_eq!(BP_CS.load(Ordering::SeqCst), u64::from(idt::KERNEL_CS), "INT3 #{}: #BP's CS", round);
        check_eq!(rax, 0x1234, "INT3 #{}: registers survive", round);
    }
    idt::clear_handler(3);
}

/// POPCNT `src` with every arithmetic flag set first: (count, RFLAGS after).
fn popcnt64(src: u64) -> (u64, u64) {
    let (count, flags): (u64, u64);
    // SAFETY: register-only POPCNT; the flags go through the stack.
    unsafe {
        asm!(
            "pushfq",
            "or qword ptr [rsp], {arith}",
            "popfq",
            "popcnt {count}, {src}",
            "pushfq",
            "pop {flags}",
            arith = in(reg) ARITH,
            src = in(reg) src,
            count = out(reg) count,
            flags = out(reg) flags,
        );
    }
    (count, flags)
}

fn popcnt() {
    if cpuid(1, 0).ecx & (1 << 23) == 0 {
        skip!("POPCNT: CPUID.01H:ECX.POPCNT[bit 23] is clear");
        return;
    }
    for (src, want) in [(0u64, 0u64), (1, 1), (u64::MAX, 64), (0x8000_0000_0000_0001, 2), (0xF0F0_1234, 13)] {
        let (count, flags) = popcnt64(black_box(src));
        check_eq!(count, want, "POPCNT of {:#x}", src);
        let zf = if src == 0 { ZF } else { 0 };
        check_eq!(flags & ARITH, zf, "POPCNT of {:#x}: OF SF AF CF PF clear, ZF = (source = 0)", src);
    }
    // 32-bit: the upper half of the destination is zeroed; 16-bit: it keeps the upper 48 bits;
    // memory source.
    let mem: u64 = black_box(0x0000_0003_0000_0007);
    let (d32, d16, dm): (u64, u64, u64);
    // SAFETY: POPCNT of registers and of `mem`.
    unsafe {
        asm!(
            "mov {d32}, -1",
            "popcnt {d32:e}, {s:e}",
            "mov {d16}, -1",
            "popcnt {d16:x}, {s:x}",
            "popcnt {dm}, qword ptr [{m}]",
            s = in(reg) 0xFFFF_FFFF_0000_0F0Fu64,
            m = in(reg) &mem,
            d32 = out(reg) d32,
            d16 = out(reg) d16,
            dm = out(reg) dm,
        );
    }
    check_eq!(d32, 8, "POPCNT r32: 8 bits, upper half zeroed");
    check_eq!(d16, 0xFFFF_FFFF_FFFF_0008, "POPCNT r16: 8 bits, the other 48 kept");
    check_eq!(dm, 5, "POPCNT r64, m64");
}

#[repr(C, align(16))]
struct Pair([u64; 2]);

/// LOCK CMPXCHG16B of `m` with RDX:RAX = `expect`, RCX:RBX = `new`: (RDX:RAX after, ZF).
fn cmpxchg16b(m: &mut Pair, expect: [u64; 2], new: [u64; 2]) -> ([u64; 2], bool) {
    let (lo, hi, flags): (u64, u64, u64);
    // SAFETY: `m` is 16-byte aligned and ours; RBX is saved around the instruction (LLVM reserves
    // it).
    unsafe {
        asm!(
            "xchg {b}, rbx",
            "lock cmpxchg16b [{m}]",
            "xchg {b}, rbx",
            "pushfq",
            "pop {f}",
            m = in(reg) m as *mut Pair,
            b = inout(reg) new[0] => _,
            f = out(reg) flags,
            inout("rax") expect[0] => lo,
            inout("rdx") expect[1] => hi,
            in("rcx") new[1],
        );
    }
    ([lo, hi], flags & ZF != 0)
}

fn cmpxchg16b_checks() {
    if cpuid(1, 0).ecx & (1 << 13) == 0 {
        skip!("CMPXCHG16B: CPUID.01H:ECX.CX16[bit 13] is clear");
        return;
    }
    let mut m = Pair([1, 2]);
    let (old, zf) = cmpxchg16b(&mut m, [1, 2], [0xB, 0xC]);
    check!(zf && m.0 == [0xB, 0xC] && old == [1, 2], "LOCK CMPXCHG16B: equal, so it swaps and sets ZF");
    let (old, zf) = cmpxchg16b(&mut m, [1, 2], [7, 7]);
    check!(
        !zf && m.0 == [0xB, 0xC] && old == [0xB, 0xC],
        "LOCK CMPXCHG16B: not equal, so it loads RDX:RAX and clears ZF"
    );
}

fn rflags() -> u64 {
    let f: u64;
    // SAFETY: reads RFLAGS through the stack.
    unsafe { asm!("pushfq", "pop {}", out(reg) f) };
    f
}

fn clac_stac() {
    if max_leaf() < 7 || cpuid(7, 0).ebx & (1 << 20) == 0 {
        skip!("CLAC/STAC: CPUID.(EAX=07H,ECX=0):EBX.SMAP[bit 20] is clear (they would #UD)");
        return;
    }
    // SAFETY: at CPL0 with SMAP enumerated, STAC and CLAC only change RFLAGS.AC (alignment
    // checking needs CPL3).
    unsafe { asm!("stac") };
    let set = rflags();
    unsafe { asm!("clac") };
    let clear = rflags();
    check_eq!(set & AC, AC, "STAC sets RFLAGS.AC");
    check_eq!(clear & AC, 0, "CLAC clears RFLAGS.AC");
    check_eq!(set & !AC, clear & !AC, "CLAC and STAC change no other flag");
}

fn main(_boot: &emon_guest::BootInfo) -> i32 {
    int3();
    popcnt();
    clac_stac();
    cmpxchg16b_checks();
    emon_guest::summary()
}
