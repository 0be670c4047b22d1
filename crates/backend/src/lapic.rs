//! The local APIC register page as KVM hands it out (`KVM_GET_LAPIC`: 1 KiB, each register a
//! little-endian 32-bit word at its xAPIC MMIO offset; SDM Vol. 3A Table 11-1).

/// Spurious-interrupt vector register.
pub const SVR: usize = 0xF0;
/// SVR bit 8: APIC software enable.
pub const SVR_APIC_ENABLED: u32 = 1 << 8;
/// Trigger-mode registers (8 x 32 bits, 16 bytes apart).
pub const TMR: usize = 0x180;
/// Interrupt-request registers (8 x 32 bits, 16 bytes apart).
pub const IRR: usize = 0x200;
/// LVT Performance Monitoring Counters register (LVTPC).
pub const LVT_PMC: usize = 0x340;
/// LVT LINT0 and LINT1.
pub const LVT_LINT0: usize = 0x350;
pub const LVT_LINT1: usize = 0x360;
/// LVT bit 16: masked.
pub const LVT_MASKED: u32 = 1 << 16;
/// LVT delivery modes, bits 10:8.
pub const DELIVERY_MODE_SHIFT: u32 = 8;
pub const DELIVERY_FIXED: u32 = 0b000;
pub const DELIVERY_NMI: u32 = 0b100;
pub const DELIVERY_EXTINT: u32 = 0b111;

/// The register at `off` of a register page.
pub fn reg(page: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([page[off], page[off + 1], page[off + 2], page[off + 3]])
}

pub fn set_reg(page: &mut [u8], off: usize, v: u32) {
    page[off..off + 4].copy_from_slice(&v.to_le_bytes());
}

/// `kvm_lapic_state.regs` (C chars) as bytes.
pub fn bytes(regs: &mut [std::os::raw::c_char; 1024]) -> &mut [u8; 1024] {
    // SAFETY: c_char and u8 have the same size and alignment, and every bit pattern is valid
    // for both.
    unsafe { &mut *(regs as *mut [std::os::raw::c_char; 1024] as *mut [u8; 1024]) }
}
