//! Checks that the TSC runs at the rate CPUID leaf 15H gives (crystal x EBX / EAX), timed against channel 2 of the 8254 PIT.
//!
//! A guest that finds its TSC frequency in leaf 15H measures time with the TSC alone (Linux then
//! runs its clock and its TSC-deadline tick on it), so a TSC that runs at another rate makes all
//! of the guest's time run fast or slow. emon gives the crystal that makes the leaf say the rate
//! the guest's TSC really has (README, "Guest time").
//!
//! Each window reads PIT channel 2 (mode 0, counting down from 0xFFFF at 1.193182 MHz) at its
//! start and end, each read between two RDTSCs; a window whose reads took long (the vCPU was
//! descheduled in between) is tried again. OUT2, read back from the PIT, says whether the count
//! ran out (wrapped) during the window.
#![no_std]
#![no_main]

use core::arch::asm;
use emon_guest::cpu::{cpuid, max_leaf};
use emon_guest::pio::{inb, outb};
use emon_guest::{check, println, skip};

emon_guest::entry!(main);

/// The 8254's input clock in the PC: 14.31818 MHz / 12.
const PIT_HZ: u64 = 1_193_182;
/// Counter 2's data port, and the control word register.
const PIT_COUNTER2: u16 = 0x42;
const PIT_CONTROL: u16 = 0x43;
/// Control word: counter 2, LSB then MSB, mode 0 (interrupt on terminal count), binary.
const COUNTER2_MODE0: u8 = 0b10_11_000_0;
/// Control word: counter 2, counter latch command.
const COUNTER2_LATCH: u8 = 0b10_00_000_0;
/// Control word: read-back command, counter 2's status only (COUNT bit 5 set: no count latched).
const COUNTER2_READ_STATUS: u8 = 0b11_10_100_0;
/// The status byte's bit 7: the counter's OUT pin.
const STATUS_OUT: u8 = 1 << 7;
/// Port 61h (system control port B): bit 0 gates counter 2, bit 1 drives the speaker from it.
const PORT_B: u16 = 0x61;
const PORT_B_GATE2: u8 = 1 << 0;
const PORT_B_SPEAKER: u8 = 1 << 1;

/// Good windows measured, and windows tried at most.
const WINDOWS: usize = 5;
const TRIES: usize = 40;
/// How far the TSC and the PIT may disagree, in parts per million.
const TOLERANCE_PPM: u64 = 10_000;

fn rdtsc() -> u64 {
    let (lo, hi): (u32, u32);
    // SAFETY: LFENCE and RDTSC only read the time-stamp counter.
    unsafe { asm!("lfence", "rdtsc", "lfence", out("eax") lo, out("edx") hi, options(nostack, nomem)) };
    (u64::from(hi) << 32) | u64::from(lo)
}

/// Counter 2's count, with the TSC just before and just after reading it.
fn read_counter2() -> (u64, u16, u64) {
    let before = rdtsc();
    outb(PIT_CONTROL, COUNTER2_LATCH);
    let lo = inb(PIT_COUNTER2);
    let hi = inb(PIT_COUNTER2);
    (before, u16::from_le_bytes([lo, hi]), rdtsc())
}

/// Why a window measured nothing.
#[derive(Debug, Clone, Copy)]
enum Bad {
    /// A read took longer than the slack: the vCPU was descheduled in the middle of it.
    Descheduled,
    /// The count ran out before the TSC had ticked the window's length.
    RanOut,
}

/// One window of `wait` TSC ticks: the TSC ticks per second it measured.
fn window(wait: u64, slack: u64) -> Result<u64, Bad> {
    // The speaker stays off; the gate enables counting (8254 mode 0).
    outb(PORT_B, (inb(PORT_B) & !PORT_B_SPEAKER) | PORT_B_GATE2);
    outb(PIT_CONTROL, COUNTER2_MODE0);
    outb(PIT_COUNTER2, 0xFF);
    outb(PIT_COUNTER2, 0xFF);
    let (a0, start, b0) = read_counter2();
    while rdtsc().wrapping_sub(b0) < wait {}
    let (a1, end, b1) = read_counter2();
    outb(PIT_CONTROL, COUNTER2_READ_STATUS);
    if inb(PIT_COUNTER2) & STATUS_OUT != 0 || end >= start {
        return Err(Bad::RanOut);
    }
    if b0 - a0 > slack || b1 - a1 > slack {
        return Err(Bad::Descheduled);
    }
    let ticks = u128::from(b1 + a1 - b0 - a0) / 2;
    Ok((ticks * u128::from(PIT_HZ) / u128::from(start - end)) as u64)
}

/// The TSC's rate against the PIT: the median of [`WINDOWS`] good windows.
fn measure(nominal_hz: u64) -> Result<u64, Bad> {
    // 40 ms at the nominal rate (the count runs out after 54.9 ms); reads within 0.2% of it.
    let wait = nominal_hz / 25;
    let slack = wait / 500;
    let mut rates = [0u64; WINDOWS];
    let mut good = 0;
    let mut last = Bad::Descheduled;
    for _ in 0..TRIES {
        match window(wait, slack) {
            Ok(hz) => {
                rates[good] = hz;
                good += 1;
                if good == WINDOWS {
                    rates.sort_unstable();
                    return Ok(rates[WINDOWS / 2]);
                }
            }
            Err(why) => last = why,
        }
    }
    Err(last)
}

fn main(_boot: &emon_guest::BootInfo) -> i32 {
    let leaf = (max_leaf() >= 0x15).then(|| cpuid(0x15, 0));
    let enumerated = leaf.filter(|l| l.eax != 0 && l.ebx != 0 && l.ecx != 0);
    let Some(l) = enumerated else {
        skip!(
            "CPUID leaf 15H gives no TSC frequency (max leaf {:#x}, leaf 15H {:?})",
            max_leaf(),
            leaf.map(|l| [l.eax, l.ebx, l.ecx])
        );
        return emon_guest::summary();
    };
    let nominal = u64::from(l.ecx) * u64::from(l.ebx) / u64::from(l.eax);
    println!("tsc-rate: CPUID.15H: crystal {} Hz x {} / {} = TSC {} Hz", l.ecx, l.ebx, l.eax, nominal);
    let measured = match measure(nominal) {
        Ok(hz) => hz,
        Err(Bad::RanOut) => {
            check!(
                false,
                "the TSC runs at the rate CPUID.15H gives ({nominal} Hz): the PIT ran out (54.9 ms) before 40 ms of it"
            );
            return emon_guest::summary();
        }
        Err(Bad::Descheduled) => {
            check!(false, "{WINDOWS} PIT windows of {TRIES} read without the vCPU descheduled mid-read");
            return emon_guest::summary();
        }
    };
    let ppm = measured.abs_diff(nominal) * 1_000_000 / nominal;
    println!("tsc-rate: against the PIT the TSC runs at {measured} Hz: {ppm} ppm from leaf 15H");
    check!(
        ppm <= TOLERANCE_PPM,
        "the TSC runs at the rate CPUID.15H gives ({nominal} Hz) within {TOLERANCE_PPM} ppm: {measured} Hz"
    );
    emon_guest::summary()
}
