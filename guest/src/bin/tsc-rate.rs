//! Checks that the TSC runs at the rate CPUID gives: leaf 15H's crystal x EBX / EAX, and leaf 16H's base frequency, timed against channel 2 of the 8254 PIT.
//! First, under every profile, that port 61h gates counter 2 and reads its output as the PC's
//! does, since Linux times the TSC against it where CPUID gives no rate.
//!
//! A guest that finds its TSC frequency in leaf 15H measures time with the TSC alone (Linux then
//! runs its clock and its TSC-deadline tick on it); one whose leaf 15H names no crystal takes
//! leaf 16H's base frequency for the TSC's rate (Linux derives the crystal from it). A TSC that
//! runs at another rate makes all of the guest's time run fast or slow. emon gives the crystal and
//! the base frequency that make the leaves say the rate the guest's TSC really has (README, "Guest
//! time").
//!
//! Each window reads PIT channel 2 (mode 0, counting down at 1.193182 MHz and on from 0xFFFF
//! after it reaches 0) at its start and end, each read between two RDTSCs, and in between as
//! often as it can, so that it sees every wrap of the 16-bit count (one every 54.9 ms) and the
//! window can be longer than one. A window whose first or last read took long, or whose reads
//! were far apart (the vCPU was descheduled), is tried again. A window is 250 ms, so that a read
//! may take 0.5 ms: with the precise backend running CPL0 code in its TCG engine (README, "CPL0
//! code in the TCG engine"), every RDTSC and port access is handed to KVM, and a read takes about
//! 150 us here.
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
/// Port 61h (system control port B): bit 0 gates counter 2, bit 1 drives the speaker from it;
/// bit 5 reads counter 2's output (OUT2).
const PORT_B: u16 = 0x61;
const PORT_B_GATE2: u8 = 1 << 0;
const PORT_B_SPEAKER: u8 = 1 << 1;
const PORT_B_OUT2: u8 = 1 << 5;
/// The count [`out2_follows_counter2`] loads: 1.7 ms of the PIT's clock.
const OUT2_COUNT: u16 = 0x800;
/// Reads of port 61h it makes at most while waiting for OUT2 (each a VM exit or more).
const OUT2_READS: u32 = 200_000;
/// Loads it tries at most for one whose OUT2 read it can judge, and the TSC ticks such a load and
/// its reads may take: under 20 ms at any TSC of 1 GHz or more, well under the 54.9 ms the count
/// takes to come round again.
const OUT2_TRIES: usize = 40;
const OUT2_SPAN: u64 = 20_000_000;

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

/// One window of at least `wait` TSC ticks: the TSC ticks per second it measured, or `None` where
/// the vCPU was descheduled: the first or last read took longer than `slack`, or two reads were
/// more than `gap` apart (less than a wrap of the count).
fn window(wait: u64, slack: u64, gap: u64) -> Option<u64> {
    // The speaker stays off; the gate enables counting (8254 mode 0).
    outb(PORT_B, (inb(PORT_B) & !PORT_B_SPEAKER) | PORT_B_GATE2);
    outb(PIT_CONTROL, COUNTER2_MODE0);
    outb(PIT_COUNTER2, 0xFF);
    outb(PIT_COUNTER2, 0xFF);
    let (a0, start, b0) = read_counter2();
    // PIT ticks since the first read, counted across the count's wraps.
    let mut pit_ticks = 0u64;
    let (mut count, mut last) = (start, b0);
    loop {
        let (a, now, b) = read_counter2();
        if a - last > gap {
            return None;
        }
        // The count runs down and wraps from 0 to 0xFFFF: the ticks since the last read.
        pit_ticks += u64::from(count.wrapping_sub(now));
        (count, last) = (now, b);
        if b.wrapping_sub(b0) >= wait {
            if b0 - a0 > slack || b - a > slack {
                return None;
            }
            let ticks = u128::from(b + a - b0 - a0) / 2;
            return Some((ticks * u128::from(PIT_HZ) / u128::from(pit_ticks)) as u64);
        }
    }
}

/// Port 61h as the PC has it, where Linux's PIT calibration of the TSC reads OUT2: the gate and
/// speaker bits read back as written, and in mode 0 (interrupt on terminal count) OUT2 is low from
/// the count's load until it runs down to 0, then high. A read of OUT2 is judged only where the
/// count, latched right after it, has not run out (it then wraps to 0xFFFF) and the load and both
/// reads took under [`OUT2_SPAN`] TSC ticks; a load whose reads the vCPU was descheduled across is
/// tried again, as [`window`] does.
fn out2_follows_counter2() {
    let speaker_off = inb(PORT_B) & !PORT_B_SPEAKER;
    outb(PORT_B, speaker_off | PORT_B_GATE2);
    let b = inb(PORT_B);
    check!(
        b & (PORT_B_GATE2 | PORT_B_SPEAKER) == PORT_B_GATE2,
        "port 61h reads back counter 2's gate on and the speaker off: {b:#04x}"
    );
    let judged = (0..OUT2_TRIES).find_map(|_| {
        let start = rdtsc();
        outb(PIT_CONTROL, COUNTER2_MODE0);
        let [lo, hi] = OUT2_COUNT.to_le_bytes();
        outb(PIT_COUNTER2, lo);
        outb(PIT_COUNTER2, hi);
        let b = inb(PORT_B);
        let (_, count, end) = read_counter2();
        (count <= OUT2_COUNT && end - start < OUT2_SPAN).then_some((b, count))
    });
    let Some((b, count)) = judged else {
        check!(false, "a load of counter 2 read within {OUT2_SPAN} TSC ticks in {OUT2_TRIES} tries");
        return;
    };
    check!(
        b & PORT_B_OUT2 == 0,
        "OUT2 is low while counter 2 runs down in mode 0: port 61h {b:#04x} with {count:#x} of {OUT2_COUNT:#x} left"
    );
    let reads = (1..=OUT2_READS).find(|_| inb(PORT_B) & PORT_B_OUT2 != 0);
    check!(reads.is_some(), "OUT2 goes high when counter 2 has run down (within {OUT2_READS} reads of port 61h)");
    if let Some(n) = reads {
        println!("tsc-rate: OUT2 went high after {n} reads of port 61h ({OUT2_COUNT} PIT ticks)");
    }
    outb(PORT_B, speaker_off & !PORT_B_GATE2);
}

/// The TSC's rate against the PIT: the median of [`WINDOWS`] good windows, if [`TRIES`] give as
/// many.
fn measure(nominal_hz: u64) -> Option<u64> {
    // 250 ms at the nominal rate; the first and last reads within 0.2% of it; reads at most 25 ms
    // apart (the count wraps every 54.9 ms).
    let wait = nominal_hz / 4;
    let slack = wait / 500;
    let gap = nominal_hz / 40;
    let mut rates = [0u64; WINDOWS];
    let mut good = 0;
    for _ in 0..TRIES {
        if let Some(hz) = window(wait, slack, gap) {
            rates[good] = hz;
            good += 1;
            if good == WINDOWS {
                rates.sort_unstable();
                return Some(rates[WINDOWS / 2]);
            }
        }
    }
    None
}

fn main(_boot: &emon_guest::BootInfo) -> i32 {
    out2_follows_counter2();
    let max = max_leaf();
    let leaf_15h = (max >= 0x15).then(|| cpuid(0x15, 0));
    // TSC = crystal x EBX / EAX, where the leaf names the crystal (SDM Vol. 2A, CPUID leaf 15H).
    let crystal = leaf_15h.filter(|l| l.eax != 0 && l.ebx != 0 && l.ecx != 0).map(|l| {
        let hz = u64::from(l.ecx) * u64::from(l.ebx) / u64::from(l.eax);
        println!("tsc-rate: CPUID.15H: crystal {} Hz x {} / {} = TSC {} Hz", l.ecx, l.ebx, l.eax, hz);
        hz
    });
    // The processor base frequency, EAX[15:0] of leaf 16H, in MHz.
    let base =
        (max >= 0x16).then(|| cpuid(0x16, 0)).map(|l| u64::from(l.eax & 0xFFFF) * 1_000_000).filter(|&hz| hz != 0);
    if let Some(hz) = base {
        println!("tsc-rate: CPUID.16H: base frequency {hz} Hz");
    }
    let Some(nominal) = crystal.or(base) else {
        skip!(
            "CPUID leaves 15H and 16H give no TSC frequency (max leaf {max:#x}, leaf 15H {:?})",
            leaf_15h.map(|l| [l.eax, l.ebx, l.ecx])
        );
        return emon_guest::summary();
    };
    let Some(measured) = measure(nominal) else {
        check!(false, "{WINDOWS} PIT windows of {TRIES} read without the vCPU descheduled mid-read");
        return emon_guest::summary();
    };
    println!("tsc-rate: against the PIT the TSC runs at {measured} Hz");
    for (given, what) in [(crystal, "the rate CPUID.15H gives"), (base, "the base frequency CPUID.16H gives")] {
        if let Some(hz) = given {
            let ppm = measured.abs_diff(hz) * 1_000_000 / hz;
            check!(ppm <= TOLERANCE_PPM, "the TSC runs at {what} ({hz} Hz) within {TOLERANCE_PPM} ppm: {ppm} ppm off");
        }
    }
    emon_guest::summary()
}
