//! core's SSE2 formatting paths and hand-written SSE2 at CPL0, completed by emon's SSE emulator where the host KVM cannot run them.
#![no_std]
#![no_main]

use core::arch::asm;
use core::fmt::{self, Write};
use core::hint::black_box;
use emon_guest::cpu::{rdmsr, wrmsr};
use emon_guest::{check, check_eq, println};

emon_guest::entry!(main);

struct Buf {
    b: [u8; 512],
    n: usize,
}

impl Write for Buf {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let end = self.n + s.len();
        if end > self.b.len() {
            return Err(fmt::Error);
        }
        self.b[self.n..end].copy_from_slice(s.as_bytes());
        self.n = end;
        Ok(())
    }
}

fn fmt_is(want: &str, args: fmt::Arguments) {
    let mut buf = Buf { b: [0; 512], n: 0 };
    let ok = buf.write_fmt(args).is_ok();
    let got = core::str::from_utf8(&buf.b[..buf.n]).unwrap_or("<not utf-8>");
    if !ok || got != want {
        println!("  got  \"{}\"", got);
        println!("  want \"{}\"", want);
    }
    check!(ok && got == want, "formats as \"{}\"", want);
}

/// A 512-byte FXSAVE image: every x87 and XMM register zero, MXCSR at its reset value 0x1F80.
#[repr(C, align(16))]
struct FxImage([u8; 512]);

/// Completed instructions that start from SSE's initial configuration (every XMM register zero,
/// which XSAVE records as XSTATE_BV[1] = 0 without writing the XMM fields). emon must read the
/// registers as zero, not as the stale fields, and its results must survive the next XRSTOR.
fn initial_state_round_trips() {
    let mut zero = FxImage([0; 512]);
    zero.0[24..26].copy_from_slice(&0x1F80u16.to_le_bytes());
    let stale: [u64; 2] = black_box([0x2020_2020_2020_2020, 0x3131_3131_3131_3131]);
    let mut wrong = 0;
    for _ in 0..20 {
        let (mut ones, mut sum) = ([0u64; 2], [0u64; 2]);
        // SAFETY: FXRSTOR of a valid image; reads `stale`, writes `ones` and `sum`. The guest never
        // uses XMM registers itself.
        unsafe {
            asm!(
                "movdqu xmm3, [{stale}]",  // leaves non-zero bytes in XMM3's save field
                "movdqu [{sum}], xmm3",
                "fxrstor [{zero}]",        // every XMM register zero: the initial configuration
                "pcmpeqd xmm2, xmm2",      // completed by emon: all ones
                "movdqu [{ones}], xmm2",   // stored by KVM after XRSTOR
                "fxrstor [{zero}]",
                "paddq xmm1, xmm3",        // completed by emon: 0 + 0
                "movdqu [{sum}], xmm1",
                stale = in(reg) stale.as_ptr(),
                zero = in(reg) zero.0.as_ptr(),
                ones = in(reg) ones.as_mut_ptr(),
                sum = in(reg) sum.as_mut_ptr(),
            );
        }
        if ones != [u64::MAX; 2] || sum != [0; 2] {
            wrong += 1;
            println!("  pcmpeqd gave {:x} {:x}, paddq gave {:x} {:x}", ones[0], ones[1], sum[0], sum[1]);
        }
    }
    check!(wrong == 0, "SSE completed from the initial configuration reads zeros and its result stays (20 rounds)");
}

fn main(_boot: &emon_guest::BootInfo) -> i32 {
    // Integer Display: core's decimal code uses SSE2 for u64/i64 (and smaller).
    fmt_is("18446744073709551615", format_args!("{}", black_box(u64::MAX)));
    fmt_is("-9223372036854775808", format_args!("{}", black_box(i64::MIN)));
    fmt_is("9223372036854775807", format_args!("{}", black_box(i64::MAX)));
    fmt_is("1234567890123456789", format_args!("{}", black_box(1234567890123456789u64)));
    fmt_is("10000000000", format_args!("{}", black_box(10_000_000_000u64)));
    fmt_is(
        "4294967295 -2147483648 0",
        format_args!("{} {} {}", black_box(u32::MAX), black_box(i32::MIN), black_box(0u8)),
    );
    fmt_is("340282366920938463463374607431768211455", format_args!("{}", black_box(u128::MAX)));
    fmt_is("00000000000000012345678901", format_args!("{:026}", black_box(12345678901u64)));
    fmt_is("+98765432109876", format_args!("{:+}", black_box(98765432109876i64)));
    fmt_is("-00000098765432109876", format_args!("{:021}", black_box(-98765432109876i64)));
    fmt_is("      18446744073709551615|", format_args!("{:>26}|", black_box(u64::MAX)));
    fmt_is("1.234567e6", format_args!("{:e}", black_box(1234567u64)));
    // Width, alignment and precision on long strings: core::str::count uses SSE2.
    let long = black_box("a string longer than fifteen");
    fmt_is("  a string longer than fifteen", format_args!("{:>30}", long));
    fmt_is("a string longer than fifteen            |", format_args!("{:<40}|", long));
    fmt_is("****a string longer than fifteen****", format_args!("{:*^36}", long));
    fmt_is("a string longer", format_args!("{:.15}", long));
    let uni = black_box("ünïcödé strings are counted in chars, not bytes");
    fmt_is("   ünïcödé strings are counted in chars, not bytes", format_args!("{:>50}", uni));
    fmt_is("ünïcödé strings", format_args!("{:.15}", uni));
    // Debug of arrays, tuples and strings.
    fmt_is(
        "[18446744073709551615, 0, 12345678901234, 42]",
        format_args!("{:?}", black_box([u64::MAX, 0, 12345678901234, 42])),
    );
    fmt_is("[-1, 9223372036854775807, -42]", format_args!("{:?}", black_box([-1i64, i64::MAX, -42])));
    fmt_is(
        "(\"tab\\there\", 'x', 1000000000000)",
        format_args!("{:?}", black_box(("tab\there", 'x', 1_000_000_000_000u64))),
    );
    fmt_is("[\n    1,\n    22222222222,\n]", format_args!("{:#?}", black_box([1u64, 22222222222])));
    fmt_is("0x00000000deadbeef", format_args!("{:#018x}", black_box(0xDEAD_BEEFu64)));

    // Hand-written SSE2, with memory operands.
    let src: [u64; 2] = black_box([0x0000_0001_FFFF_FFFF, 0x8000_0000_0000_0000]);
    let mut out = [0u64; 3]; // out[1..3] is a misaligned 16-byte destination on purpose
    let out_ptr = (out.as_mut_ptr() as *mut u8).wrapping_add(4);
    let (low, mask): (u64, u32);
    // SAFETY: reads `src`, writes 16 bytes inside `out`; the guest never uses XMM registers itself.
    unsafe {
        asm!(
            "movdqu xmm0, [{src}]",
            "paddq xmm0, [{src}]",          // [0x3_FFFF_FFFE, 0]
            "pshufd xmm1, xmm0, 0x4E",       // swap qwords
            "por xmm1, xmm0",               // both qwords 0x3_FFFF_FFFE
            "pcmpeqd xmm2, xmm2",
            "psrlq xmm2, 60",               // 0xF in each qword
            "pand xmm1, xmm2",              // 0xE, 0xE
            "movdqu [{dst}], xmm1",
            "movq {low}, xmm0",
            "pmovmskb {mask:e}, xmm2",
            src = in(reg) src.as_ptr(),
            dst = in(reg) out_ptr,
            low = out(reg) low,
            mask = out(reg) mask,
        );
    }
    check_eq!(low, 0x3_FFFF_FFFEu64, "movdqu/paddq m128/movq");
    check_eq!(mask, 0u32, "pmovmskb of small qwords");
    let mut bytes = [0u8; 24];
    for (i, q) in out.iter().enumerate() {
        bytes[i * 8..i * 8 + 8].copy_from_slice(&q.to_le_bytes());
    }
    check!(
        bytes[..4] == [0; 4] && bytes[4] == 0xE && bytes[5..12] == [0; 7] && bytes[12] == 0xE && bytes[13..] == [0; 11],
        "misaligned movdqu store of pshufd/por/pand/psrlq result"
    );

    initial_state_round_trips();

    // An emulated SSE instruction retires exactly once for the PMU (precise backend).
    let pmu = emon_guest::pmu::Perfmon::from_cpuid();
    if pmu.version >= 2 && pmu.gp > 0 && pmu.event_available(emon_guest::pmu::EVENT_INSTRUCTIONS) {
        wrmsr(0x38F, 1); // GLOBAL_CTRL: PMC0
        wrmsr(0xC1, 0);
        let v: u32;
        // SAFETY: PMU MSRs and the declared registers only (XMM registers are not used by the guest).
        unsafe {
            asm!(
                "mov ecx, 0x186",
                "xor edx, edx",
                "wrmsr",                  // PERFEVTSEL0 = INST_RETIRED, OS+USR+EN: counting starts after this
                "movd xmm3, {v:e}",
                "paddd xmm3, xmm3",
                "pshufd xmm4, xmm3, 0",
                "paddd xmm4, xmm3",
                "movd {v:e}, xmm4",
                "mov ecx, 0x186",          // the 4 stopping instructions (counted)
                "rdmsr",
                "btr eax, 22",
                "wrmsr",
                v = inout(reg) 5u32 => v,
                inout("eax") 0x5300C0u32 => _,
                out("ecx") _,
                out("edx") _,
            );
        }
        check_eq!(v, 20u32, "movd/paddd/pshufd result");
        check_eq!(rdmsr(0xC1), 9u64, "IA32_PMC0 counts the 5 emulated SSE instructions once each, + 4");
    } else {
        emon_guest::skip!("IA32_PMC0 counting emulated SSE instructions: needs perfmon v2+ and instructions retired");
    }
    emon_guest::summary()
}
