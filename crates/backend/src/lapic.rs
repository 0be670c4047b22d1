//! The local APIC register page as KVM hands it out (`KVM_GET_LAPIC`: 1 KiB, each register a
//! little-endian 32-bit word at its xAPIC MMIO offset; SDM Vol. 3A Table 11-1).

/// Spurious-interrupt vector register.
pub const SVR: usize = 0xF0;
/// SVR bit 8: APIC software enable.
pub const SVR_APIC_ENABLED: u32 = 1 << 8;
/// Task-priority register.
pub const TPR: usize = 0x80;
/// In-service registers (8 x 32 bits, 16 bytes apart).
pub const ISR: usize = 0x100;
/// Trigger-mode registers (8 x 32 bits, 16 bytes apart).
pub const TMR: usize = 0x180;
/// Interrupt-request registers (8 x 32 bits, 16 bytes apart).
pub const IRR: usize = 0x200;
/// LVT Timer, the timer's initial and current counts (SDM Vol. 3A 11.5.4).
pub const LVT_TIMER: usize = 0x320;
pub const TIMER_INITIAL_COUNT: usize = 0x380;
pub const TIMER_CURRENT_COUNT: usize = 0x390;
/// LVT Timer bits 18:17: the timer mode (00b one-shot, 10b TSC-deadline).
pub const LVT_TIMER_MODE: u32 = 0b11 << 17;
pub const LVT_TIMER_TSC_DEADLINE: u32 = 0b10 << 17;
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

/// The highest vector set in the 256-bit register (IRR, ISR, TMR) at `base`.
fn highest(page: &[u8], base: usize) -> Option<u8> {
    (0..8).rev().find_map(|i| {
        let word = reg(page, base + 16 * i);
        (word != 0).then(|| (32 * i + 31 - word.leading_zeros() as usize) as u8)
    })
}

/// Whether LINT0 passes the 8259 PIC's interrupts through (unmasked, ExtINT delivery: virtual
/// wire mode, SDM Vol. 3A 11.5.1).
pub fn accepts_extint(page: &[u8]) -> bool {
    let lint0 = reg(page, LVT_LINT0);
    lint0 & LVT_MASKED == 0 && (lint0 >> DELIVERY_MODE_SHIFT) & 0b111 == DELIVERY_EXTINT
}

/// Whether an 8259 PIC with these registers asserts its output: its highest-priority request
/// that is not masked is above everything in service (priorities rotate with `priority_add`;
/// in special fully nested mode the master ignores the cascade input in service).
pub fn pic_output(irr: u8, imr: u8, isr: u8, priority_add: u8, master_fully_nested: bool) -> bool {
    let priority = |mask: u8| (0..8u8).find(|p| mask & (1 << ((p + priority_add) & 7)) != 0).unwrap_or(8);
    let request = priority(irr & !imr);
    let in_service = priority(if master_fully_nested { isr & !(1 << 2) } else { isr });
    request < 8 && request < in_service
}

/// Accepts the interrupt the processor takes at an instruction boundary where RFLAGS.IF allows
/// one: the highest-priority vector in the IRR whose priority class is above the processor
/// priority (the TPR's class or the highest in-service vector's, whichever is higher), moved
/// from the IRR to the ISR (SDM Vol. 3A 11.8.3, 11.8.3.1). `None` when none qualifies, or the
/// APIC is software-disabled.
pub fn accept_interrupt(page: &mut [u8]) -> Option<u8> {
    let v = deliverable(page)?;
    let (word, bit) = (usize::from(v) / 32 * 16, v % 32);
    set_reg(page, IRR + word, reg(page, IRR + word) & !(1 << bit));
    set_reg(page, ISR + word, reg(page, ISR + word) | 1 << bit);
    Some(v)
}

/// The vector [`accept_interrupt`] would accept, left in the IRR.
pub fn deliverable(page: &[u8]) -> Option<u8> {
    if reg(page, SVR) & SVR_APIC_ENABLED == 0 {
        return None;
    }
    let v = highest(page, IRR)?;
    let tpr_class = reg(page, TPR) & 0xF0;
    let isr_class = highest(page, ISR).map_or(0, |i| u32::from(i) & 0xF0);
    (u32::from(v) & 0xF0 > tpr_class.max(isr_class)).then_some(v)
}

/// Makes a register page read with KVM_GET_LAPIC safe to write back with KVM_SET_LAPIC, which
/// restarts the timer from the current count it holds: a one-shot timer that has expired
/// (current count 0) would fire again at once. Its initial count goes as 0 instead, which stops
/// it, as expired; the guest reads 0 back from it until it writes it again.
pub fn without_expired_timer(page: &mut [u8]) {
    let one_shot = reg(page, LVT_TIMER) & LVT_TIMER_MODE == 0;
    if one_shot && reg(page, TIMER_CURRENT_COUNT) == 0 {
        set_reg(page, TIMER_INITIAL_COUNT, 0);
    }
}

/// A register page read (`read`) and changed (`page`) is about to be written back while KVM's
/// in-kernel devices may have requested interrupts since (an I/O APIC's delivery sets IRR bits
/// from another thread): each request that came in between, as the page reads `now`, stays
/// requested, with its trigger mode (TMR), instead of being lost to the write.
pub fn keep_new_requests(page: &mut [u8], read: &[u8], now: &[u8]) {
    for i in 0..8 {
        let (irr, tmr) = (IRR + 16 * i, TMR + 16 * i);
        let new = reg(now, irr) & !reg(read, irr);
        if new != 0 {
            set_reg(page, irr, reg(page, irr) | new);
            set_reg(page, tmr, reg(page, tmr) & !new | reg(now, tmr) & new);
        }
    }
}

/// `kvm_lapic_state.regs` (C chars) as bytes.
pub fn bytes(regs: &mut [std::os::raw::c_char; 1024]) -> &mut [u8; 1024] {
    // SAFETY: c_char and u8 have the same size and alignment, and every bit pattern is valid
    // for both.
    unsafe { &mut *(regs as *mut [std::os::raw::c_char; 1024] as *mut [u8; 1024]) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(irr: &[u8], isr: &[u8], tpr: u32) -> [u8; 1024] {
        let mut p = [0u8; 1024];
        set_reg(&mut p, SVR, SVR_APIC_ENABLED | 0xFF);
        set_reg(&mut p, TPR, tpr);
        for (base, vs) in [(IRR, irr), (ISR, isr)] {
            for &v in vs {
                let off = base + usize::from(v) / 32 * 16;
                let word = reg(&p, off) | 1 << (v % 32);
                set_reg(&mut p, off, word);
            }
        }
        p
    }

    #[test]
    fn the_highest_request_above_the_processor_priority_goes_in_service() {
        let mut p = page(&[0x31, 0xEC, 0x41], &[], 0);
        assert_eq!(accept_interrupt(&mut p), Some(0xEC));
        assert_eq!((highest(&p, IRR), highest(&p, ISR)), (Some(0x41), Some(0xEC)));
        // 0x41's class (4) is below the in-service 0xEC's: nothing until the EOI.
        assert_eq!(accept_interrupt(&mut p), None);
    }

    #[test]
    fn the_pic_asserts_its_highest_unmasked_request_above_what_is_in_service() {
        assert!(pic_output(0b1, 0, 0, 0, false), "IRQ0");
        assert!(!pic_output(0b1, 0b1, 0, 0, false), "masked");
        assert!(!pic_output(0b10, 0, 0b1, 0, false), "IRQ1 below IRQ0 in service");
        assert!(pic_output(0b1, 0, 0b10, 0, false), "IRQ0 above IRQ1 in service");
        assert!(!pic_output(0, 0, 0, 0, false));
        // Rotated: priority_add 1 makes IRQ1 the highest, IRQ0 the lowest.
        assert!(!pic_output(0b1, 0, 0b10, 1, false));
        // Special fully nested: the master takes the slave's next request with IRQ2 in service.
        assert!(pic_output(0b100, 0, 0b100, 0, true));
        assert!(!pic_output(0b100, 0, 0b100, 0, false));
    }

    #[test]
    fn requests_that_came_in_after_the_read_survive_the_write_back() {
        let read = page(&[0x31, 0xEC], &[], 0);
        // emon took 0xEC into service; 0x41 (level-triggered) and 0x62 came in meanwhile.
        let mut changed = read;
        assert_eq!(accept_interrupt(&mut changed), Some(0xEC));
        let mut now = page(&[0x31, 0xEC, 0x41, 0x62], &[], 0);
        set_reg(&mut now, TMR + 16 * 2, 1 << 1);
        keep_new_requests(&mut changed, &read, &now);
        let requested = |p: &[u8], v: u8| reg(p, IRR + usize::from(v) / 32 * 16) & 1 << (v % 32) != 0;
        assert!(requested(&changed, 0x41) && requested(&changed, 0x62) && requested(&changed, 0x31));
        assert!(!requested(&changed, 0xEC), "the one taken stays taken");
        assert_eq!(highest(&changed, ISR), Some(0xEC));
        assert_eq!(highest(&changed, TMR), Some(0x41), "level-triggered, as it came");
    }

    #[test]
    fn an_expired_one_shot_timer_is_not_restarted() {
        let mut p = [0u8; 1024];
        set_reg(&mut p, TIMER_INITIAL_COUNT, 1_000_000);
        without_expired_timer(&mut p);
        assert_eq!(reg(&p, TIMER_INITIAL_COUNT), 0, "one-shot, expired");
        set_reg(&mut p, TIMER_INITIAL_COUNT, 1_000_000);
        set_reg(&mut p, TIMER_CURRENT_COUNT, 5);
        without_expired_timer(&mut p);
        assert_eq!(reg(&p, TIMER_INITIAL_COUNT), 1_000_000, "one-shot, running");
        set_reg(&mut p, TIMER_CURRENT_COUNT, 0);
        set_reg(&mut p, LVT_TIMER, 1 << 17);
        without_expired_timer(&mut p);
        assert_eq!(reg(&p, TIMER_INITIAL_COUNT), 1_000_000, "periodic");
    }

    #[test]
    fn the_task_priority_and_the_same_class_in_service_hold_requests_back() {
        assert_eq!(accept_interrupt(&mut page(&[0x45], &[], 0x40)), None, "class 4 at TPR class 4");
        assert_eq!(accept_interrupt(&mut page(&[0x45], &[], 0x3F)), Some(0x45));
        assert_eq!(accept_interrupt(&mut page(&[0x45], &[0x41], 0)), None, "same class in service");
        let mut off = page(&[0x45], &[], 0);
        set_reg(&mut off, SVR, 0xFF);
        assert_eq!(accept_interrupt(&mut off), None, "software-disabled");
        assert_eq!(accept_interrupt(&mut page(&[], &[], 0)), None);
    }
}
