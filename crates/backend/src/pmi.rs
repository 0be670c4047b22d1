//! Delivering the performance-monitoring interrupt the way the guest programmed the LVT
//! Performance Counter register (SDM Vol. 3A 10.5.1, Vol. 3B 18.2.1.1): a fixed vector or an NMI,
//! nothing while masked, and LVTPC.MASK set after delivery as hardware does.
use crate::lapic::{reg, set_reg, DELIVERY_FIXED, DELIVERY_NMI, IRR, LVT_MASKED, LVT_PMC, SVR, SVR_APIC_ENABLED, TMR};

/// What happened to one PMI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PmiDelivery {
    /// Raised in the local APIC's IRR with this vector.
    Fixed(u8),
    Nmi,
    /// LVTPC is masked, or the APIC is software-disabled (which masks every LVT entry).
    Masked,
    /// A delivery mode that has no meaning for LVTPC (SMI, INIT, ExtINT, reserved), or an
    /// illegal vector (0-15): the local APIC drops it.
    Dropped {
        mode: u32,
        vector: u8,
    },
}

/// Updates the local APIC register page for one PMI and says what to deliver. For a fixed
/// vector it sets the IRR bit (edge-triggered: TMR bit clear); in every delivered case it sets
/// LVTPC.MASK.
pub fn plan(regs: &mut [u8]) -> PmiDelivery {
    let lvt = reg(regs, LVT_PMC);
    if reg(regs, SVR) & SVR_APIC_ENABLED == 0 || lvt & LVT_MASKED != 0 {
        return PmiDelivery::Masked;
    }
    let (mode, vector) = ((lvt >> 8) & 0b111, lvt as u8);
    let delivery = match mode {
        DELIVERY_FIXED if vector >= 16 => {
            let (off, bit) = (0x10 * (vector as usize / 32), vector as u32 % 32);
            set_reg(regs, IRR + off, reg(regs, IRR + off) | (1 << bit));
            set_reg(regs, TMR + off, reg(regs, TMR + off) & !(1 << bit));
            PmiDelivery::Fixed(vector)
        }
        DELIVERY_NMI => PmiDelivery::Nmi,
        _ => return PmiDelivery::Dropped { mode, vector },
    };
    set_reg(regs, LVT_PMC, lvt | LVT_MASKED);
    delivery
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(lvt: u32, svr: u32) -> Vec<u8> {
        let mut p = vec![0u8; 1024];
        set_reg(&mut p, LVT_PMC, lvt);
        set_reg(&mut p, SVR, svr);
        p
    }

    #[test]
    fn fixed_vector_sets_irr_and_masks() {
        let mut p = page(0x33, 0x1FF);
        assert_eq!(plan(&mut p), PmiDelivery::Fixed(0x33));
        assert_eq!(reg(&p, IRR + 0x10) & (1 << (0x33 - 32)), 1 << (0x33 - 32));
        assert_eq!(reg(&p, LVT_PMC), 0x33 | LVT_MASKED);
    }

    #[test]
    fn nmi_delivery_masks_without_touching_irr() {
        let mut p = page(0x400, 0x1FF);
        assert_eq!(plan(&mut p), PmiDelivery::Nmi);
        assert_eq!(reg(&p, LVT_PMC), 0x400 | LVT_MASKED);
        assert!(p[IRR..IRR + 0x80].iter().all(|&b| b == 0));
    }

    #[test]
    fn masked_or_disabled_apic_delivers_nothing() {
        let mut p = page(0x33 | LVT_MASKED, 0x1FF);
        assert_eq!(plan(&mut p), PmiDelivery::Masked);
        let mut p = page(0x33, 0xFF);
        assert_eq!(plan(&mut p), PmiDelivery::Masked);
        assert_eq!(reg(&p, LVT_PMC), 0x33, "unchanged");
    }

    #[test]
    fn illegal_vectors_and_modes_are_dropped() {
        let mut p = page(0x05, 0x1FF);
        assert_eq!(plan(&mut p), PmiDelivery::Dropped { mode: 0, vector: 5 });
        let mut p = page(0x700 | 0x40, 0x1FF);
        assert_eq!(plan(&mut p), PmiDelivery::Dropped { mode: 7, vector: 0x40 });
    }
}
