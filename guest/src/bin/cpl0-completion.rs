//! Instructions at CPL0 that a host KVM may be unable to emulate although the guest sees their
//! features (README, "Linux guests"), each as the SDM defines it: INT3 delivers #BP with the
//! address after it on the stack, POPCNT counts bits and sets only ZF, CLAC and STAC clear and
//! set RFLAGS.AC, LOCK CMPXCHG16B compares and swaps 128 bits, x87 arithmetic, CRC32 (SSE4.2),
//! XSETBV/XGETBV, and XSAVE/XRSTOR of the x87 and SSE state. On kvm_pvm emon completes each one; elsewhere the CPU runs them.
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

/// x87 arithmetic on the FPU stack: (1.5 + 1.5) x 3.0 stored as a double, and the stack empty
/// again (FSW.TOP back to 0).
fn x87() {
    let (a, b, mut out): (u64, u64, u64) = (1.5f64.to_bits(), 3.0f64.to_bits(), 0);
    let fsw: u16;
    // SAFETY: x87 instructions on the guest's own doubles; the FPU stack is left empty.
    unsafe {
        asm!(
            "fninit",
            "fld qword ptr [{a}]",
            "fadd st(0), st(0)",
            "fld qword ptr [{b}]",
            "fmulp st(1), st(0)",
            "fstp qword ptr [{out}]",
            "fnstsw ax",
            a = in(reg) &a,
            b = in(reg) &b,
            out = in(reg) &mut out,
            out("ax") fsw,
        );
    }
    check_eq!(out, 9.0f64.to_bits(), "x87: FLD, FADD, FMULP, FSTP compute (1.5 + 1.5) x 3 = 9");
    check_eq!(u64::from((fsw >> 11) & 7), 0u64, "x87: FSTP popped the stack back to TOP 0");
}

/// CRC32C of `data` a byte at a time (SDM Vol. 2A, CRC32: the polynomial 11EDC6F41H, bit
/// reflected), for checking the instruction.
fn crc32c(mut crc: u32, data: u32) -> u32 {
    for byte in data.to_le_bytes() {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 != 0 { (crc >> 1) ^ 0x82F6_3B78 } else { crc >> 1 };
        }
    }
    crc
}

fn crc32() {
    if cpuid(1, 0).ecx & (1 << 20) == 0 {
        skip!("CRC32: CPUID.01H:ECX.SSE4_2[bit 20] is clear");
        return;
    }
    for (init, data) in [(0xFFFF_FFFFu32, 0u32), (0, 0x1234_5678), (0xDEAD_BEEF, 0xFFFF_FFFF)] {
        let mut crc = init;
        // SAFETY: CRC32 of registers.
        unsafe { asm!("crc32 {c:e}, {d:e}", c = inout(reg) crc, d = in(reg) black_box(data)) };
        check_eq!(u64::from(crc), u64::from(crc32c(init, data)), "CRC32 r32 of {:#x} from {:#x}", data, init);
    }
}

fn xgetbv() -> u64 {
    let (lo, hi): (u32, u32);
    // SAFETY: XCR0 read, CR4.OSXSAVE set by the caller.
    unsafe { asm!("xgetbv", in("ecx") 0, out("eax") lo, out("edx") hi) };
    u64::from(hi) << 32 | u64::from(lo)
}

/// XSAVE's standard-format image: legacy region, header, (no extended components at XCR0 = 3).
#[repr(C, align(64))]
struct XsaveArea([u8; 1024]);

/// XSETBV and XGETBV, then XSAVE and XRSTOR of XMM0 through memory.
fn xsave() {
    if cpuid(1, 0).ecx & (1 << 26) == 0 {
        skip!("XSAVE: CPUID.01H:ECX.XSAVE[bit 26] is clear");
        return;
    }
    // SAFETY: CR4.OSXSAVE (bit 18) enables XSETBV/XGETBV and the XSAVE family; the guest runs
    // no other SSE code that XCR0 could disturb.
    unsafe { asm!("mov {t}, cr4", "bts {t}, 18", "mov cr4, {t}", t = out(reg) _) };
    // SAFETY: XCR0 = x87 | SSE, which every XSAVE processor supports.
    unsafe { asm!("xsetbv", in("ecx") 0, in("eax") 3, in("edx") 0) };
    check_eq!(xgetbv(), 3u64, "XSETBV then XGETBV: XCR0 = x87 | SSE");
    let mut area = XsaveArea([0; 1024]);
    let before: u64;
    // SAFETY: XMM0 is the guest's to use (its code has no other SSE); the area is 64-byte aligned.
    unsafe {
        asm!(
            "movq xmm0, {v}",
            "xsave [{area}]",
            v = in(reg) 0x1111_2222_3333_4444u64,
            area = in(reg) &mut area,
            in("eax") 3,
            in("edx") 0,
        );
        asm!("movq {}, xmm0", out(reg) before);
    }
    check_eq!(before, 0x1111_2222_3333_4444u64, "MOVQ to and from XMM0");
    let saved = u64::from_le_bytes(area.0[160..168].try_into().unwrap());
    check_eq!(saved, 0x1111_2222_3333_4444u64, "XSAVE stores XMM0 at byte 160 of the legacy region");
    check_eq!(u64::from(area.0[512] & 2), 2u64, "XSAVE marks SSE in use in XSTATE_BV");
    area.0[160..168].copy_from_slice(&0x5555_6666_7777_8888u64.to_le_bytes());
    let after: u64;
    // SAFETY: XRSTOR of the image XSAVE made, with one XMM0 field changed.
    unsafe {
        asm!("xrstor [{area}]", area = in(reg) &area, in("eax") 3, in("edx") 0);
        asm!("movq {}, xmm0", out(reg) after);
    }
    check_eq!(after, 0x5555_6666_7777_8888u64, "XRSTOR loads XMM0 from the image");
}

fn main(_boot: &emon_guest::BootInfo) -> i32 {
    int3();
    popcnt();
    clac_stac();
    cmpxchg16b_checks();
    x87();
    crc32();
    xsave();
    emon_guest::summary()
}
