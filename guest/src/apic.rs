//! The local APIC in xAPIC mode, at 0xFEE00000 (emon identity-maps that page).
use core::ptr::{read_volatile, write_volatile};

pub const BASE: u64 = 0xFEE0_0000;
pub const ID: u32 = 0x20;
pub const VERSION: u32 = 0x30;
pub const TPR: u32 = 0x80;
pub const EOI: u32 = 0xB0;
pub const SVR: u32 = 0xF0;
/// LVT Performance Monitoring Counters register (SDM 10.5.1).
pub const LVT_PMC: u32 = 0x340;
/// LVT Timer, the timer's initial count and its divide configuration (SDM 10.5.4).
pub const LVT_TIMER: u32 = 0x320;
pub const TIMER_INITIAL_COUNT: u32 = 0x380;
pub const TIMER_CURRENT_COUNT: u32 = 0x390;
pub const TIMER_DIVIDE: u32 = 0x3E0;
/// Divide configuration 1011b: divide by 1.
pub const TIMER_DIVIDE_BY_1: u32 = 0b1011;
pub const LVT_LINT0: u32 = 0x350;
pub const LVT_LINT1: u32 = 0x360;

pub const LVT_MASKED: u32 = 1 << 16;
pub const LVT_DELIVERY_NMI: u32 = 0b100 << 8;
pub const SVR_ENABLE: u32 = 1 << 8;

pub fn read(reg: u32) -> u32 {
    // SAFETY: the APIC page is mapped uncached by emon; registers are 32-bit aligned.
    unsafe { read_volatile((BASE + reg as u64) as *const u32) }
}

pub fn write(reg: u32, v: u32) {
    // SAFETY: as above.
    unsafe { write_volatile((BASE + reg as u64) as *mut u32, v) }
}

/// Software-enables the APIC (SVR.APIC_ENABLE) with spurious vector 0xFF and TPR 0.
pub fn enable() {
    write(SVR, SVR_ENABLE | crate::idt::SPURIOUS_VECTOR as u32);
    write(TPR, 0);
}

pub fn eoi() {
    write(EOI, 0);
}
