//! MSR checks that turn every outcome into a report line: an unexpected fault becomes a FAIL,
//! never the end of the run.
use crate::cpu::{rdmsr_safe, wrmsr_safe};
use crate::report::report_fmt;
use crate::{check, println, Exception};
use core::fmt;

/// The value an RDMSR helper returns after an unexpected fault (already reported as a FAIL).
pub const POISON: u64 = 0xDEAD_BEEF_DEAD_BEEF;

/// Bits set in `mask`, lowest first.
pub fn bits(mask: u64) -> impl Iterator<Item = u32> {
    (0..64).filter(move |&b| mask & (1u64 << b) != 0)
}

pub fn is_gp<T>(r: &Result<T, Exception>) -> bool {
    matches!(r, Err(e) if e.is_gp())
}

/// RDMSR that must succeed; a fault is reported and [`POISON`] returned.
pub fn rd(msr: u32) -> u64 {
    match rdmsr_safe(msr) {
        Ok(v) => v,
        Err(e) => {
            check!(false, "RDMSR {:#x} succeeds (got vector {})", msr, e.vector);
            POISON
        }
    }
}

/// WRMSR that must succeed (setup and restore); a fault is reported.
pub fn wr(msr: u32, value: u64) {
    if let Err(e) = wrmsr_safe(msr, value) {
        check!(false, "WRMSR {:#x} <- {:#x} succeeds (got vector {})", msr, value, e.vector);
    }
}

/// Check: WRMSR `msr` = `value` succeeds and RDMSR `msr` then returns `want`.
pub fn write_reads(name: fmt::Arguments, msr: u32, value: u64, want: u64) -> bool {
    let ok = match wrmsr_safe(msr, value) {
        Err(e) => {
            println!("  WRMSR {:#x} <- {:#x}: unexpected vector {}", msr, value, e.vector);
            false
        }
        Ok(()) => match rdmsr_safe(msr) {
            Ok(got) if got == want => true,
            Ok(got) => {
                println!("  WRMSR {:#x} <- {:#x}: reads {:#x}, want {:#x}", msr, value, got, want);
                false
            }
            Err(e) => {
                println!("  RDMSR {:#x}: unexpected vector {}", msr, e.vector);
                false
            }
        },
    };
    report_fmt(ok, name)
}

/// The outcome of one WRMSR that must #GP without changing `observe`; prints why it did not.
pub fn gp_without_change(msr: u32, value: u64, observe: u32) -> bool {
    let before = rd(observe);
    let r = wrmsr_safe(msr, value);
    let after = rd(observe);
    match r {
        Ok(()) => println!("  WRMSR {:#x} <- {:#x}: no exception", msr, value),
        Err(e) if !e.is_gp() => {
            println!("  WRMSR {:#x} <- {:#x}: vector {} instead of #GP", msr, value, e.vector)
        }
        Err(_) => {}
    }
    if after != before {
        println!("  MSR {:#x} changed from {:#x} to {:#x}", observe, before, after);
    }
    is_gp(&r) && after == before
}

/// Check: WRMSR `msr` = `value` #GPs and leaves MSR `observe` unchanged.
pub fn expect_gp_unchanged(name: fmt::Arguments, msr: u32, value: u64, observe: u32) -> bool {
    let ok = gp_without_change(msr, value, observe);
    report_fmt(ok, name)
}

/// Check: for each bit in `reserved`, WRMSR `msr` = `base | bit` #GPs and leaves MSR `observe`
/// unchanged. One report for all the bits (the failing ones are printed). No report if
/// `reserved` is empty.
pub fn expect_reserved_bits(name: fmt::Arguments, msr: u32, base: u64, reserved: u64, observe: u32) {
    if reserved == 0 {
        return;
    }
    let bad =
        bits(reserved).filter(|&b| !gp_without_change(msr, base | 1u64 << b, observe)).fold(0u64, |m, b| m | 1u64 << b);
    if bad != 0 {
        println!("  bits {:#x} (of {:#x}) did not #GP cleanly", bad, reserved);
    }
    report_fmt(bad == 0, name);
}
