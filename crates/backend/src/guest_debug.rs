//! The one KVM guest-debug control of a vCPU (KVM_SET_GUEST_DEBUG), shared by the two things
//! that need it: a backend's single-stepping ([`crate::Vcpu::set_single_step`]) and the
//! breakpoint on the guest's #GP handler that completes RDPMC outside counted code
//! ([`crate::rdpmc_catch`]). Whoever changes a field applies the whole control; a debug exit is
//! attributed to its owner by [`GuestDebug::classify`].
use kvm_bindings::{
    kvm_guest_debug, KVM_GUESTDBG_BLOCKIRQ, KVM_GUESTDBG_ENABLE, KVM_GUESTDBG_SINGLESTEP, KVM_GUESTDBG_USE_HW_BP,
};

/// DR6.B0: breakpoint 0's condition was met (SDM Vol. 3B, "Debug Status Register (DR6)").
pub const DR6_B0: u64 = 1 << 0;
/// DR6.BD: a debug-register access was detected (DR7.GD).
pub const DR6_BD: u64 = 1 << 13;
/// DR6.BS: single-step trap (RFLAGS.TF).
pub const DR6_BS: u64 = 1 << 14;
/// DR6.BT: task switch to a TSS with its T flag set.
pub const DR6_BT: u64 = 1 << 15;
/// DR6 bits that say why a #DB was raised: B0-B3, BD, BS, BT.
pub const DR6_CAUSES: u64 = 0xF | DR6_BD | DR6_BS | DR6_BT;
/// DR7.L0: breakpoint 0 enabled; R/W0 = 00 and LEN0 = 00 make it an instruction breakpoint.
pub const DR7_L0: u64 = 1 << 0;
/// DR7 bit 10 reads as 1.
pub const DR7_FIXED_1: u64 = 1 << 10;
/// DR7.L0-L3 and G0-G3: a breakpoint is enabled.
pub const DR7_ENABLES: u64 = 0xFF;

/// What KVM_SET_GUEST_DEBUG should say for one vCPU.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GuestDebug {
    /// A backend single-steps the guest (every entry retires one instruction and exits).
    pub step: bool,
    /// The RDPMC catch steps over the #GP handler's first instruction (a #GP it passes on to the
    /// guest): breakpoints off, interrupts held, for one instruction.
    pub pass: bool,
    /// A hardware instruction breakpoint (DR0) at this linear address: the #GP handler's first
    /// instruction. Not armed while stepping, where every instruction exits anyway.
    pub breakpoint: Option<u64>,
    /// KVM can hold interrupts during a step (KVM_GUESTDBG_BLOCKIRQ, Linux 5.16; it lists it in
    /// KVM_CAP_SET_GUEST_DEBUG2). Without it an interrupt may come before the handler's first
    /// instruction: the step then ends in the interrupt's handler, and the breakpoint, back on,
    /// meets the #GP handler again when the interrupt returns to it.
    pub block_irq: bool,
    /// The control last given to KVM (`None` before the first).
    applied: Option<(u32, u64)>,
}

/// Whose a debug exit is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DebugExit {
    /// The backend's single step: one instruction retired.
    Step,
    /// The RDPMC catch's step over the #GP handler's first instruction has retired.
    Passed,
    /// The breakpoint on the #GP handler: a #GP was just delivered, the handler has not run.
    Breakpoint,
    /// None of emon's: the guest's own #DB (its RFLAGS.TF, ICEBP, ...), which KVM sends to
    /// userspace while guest debugging is on. It goes back to the guest.
    Guest,
}

impl GuestDebug {
    /// Nothing on yet, for a KVM that can (`block_irq`) or cannot hold interrupts during a step.
    pub fn new(block_irq: bool) -> GuestDebug {
        GuestDebug { block_irq, ..Default::default() }
    }

    /// The KVM_SET_GUEST_DEBUG argument for the current fields. Stepping wins over the
    /// breakpoint: a step exits at every instruction, and a breakpoint exit would not be one.
    pub fn control(&self) -> kvm_guest_debug {
        let mut g = kvm_guest_debug::default();
        if self.step || self.pass {
            g.control = KVM_GUESTDBG_ENABLE | KVM_GUESTDBG_SINGLESTEP;
            if self.pass && !self.step && self.block_irq {
                // Only the handler's first instruction: no interrupt may come in between.
                g.control |= KVM_GUESTDBG_BLOCKIRQ;
            }
        } else if let Some(addr) = self.breakpoint {
            g.control = KVM_GUESTDBG_ENABLE | KVM_GUESTDBG_USE_HW_BP;
            g.arch.debugreg[0] = addr;
            g.arch.debugreg[7] = DR7_FIXED_1 | DR7_L0;
        }
        g
    }

    /// The control to give KVM if it differs from the one it has, and records it as given.
    pub fn take_change(&mut self) -> Option<kvm_guest_debug> {
        if !self.changed() {
            return None;
        }
        let g = self.control();
        self.applied = Some((g.control, g.arch.debugreg[0]));
        Some(g)
    }

    /// Whether the control differs from the one KVM has.
    pub fn changed(&self) -> bool {
        let g = self.control();
        self.applied != Some((g.control, g.arch.debugreg[0]))
    }

    /// Whether KVM single-steps the guest now (for the backend or the catch).
    pub fn stepping(&self) -> bool {
        self.applied.is_some_and(|(control, _)| control & KVM_GUESTDBG_SINGLESTEP != 0)
    }

    /// Forgets what KVM has, so that the next [`GuestDebug::take_change`] gives it again (after
    /// a KVM_SET_GUEST_DEBUG that failed).
    pub fn forget_applied(&mut self) {
        self.applied = None;
    }

    /// Whose a debug exit with DR6 `dr6` at linear address `pc` is.
    pub fn classify(&self, dr6: u64, pc: u64) -> DebugExit {
        if self.step {
            return DebugExit::Step;
        }
        if self.pass {
            return if dr6 & DR6_BS != 0 { DebugExit::Passed } else { DebugExit::Guest };
        }
        match self.breakpoint {
            // An instruction breakpoint is a fault: the exit comes before the instruction, at its
            // address. (DR6.B0 says so too, but the address alone decides: a trap from the
            // guest's own TF that lands on the handler has BS set.)
            Some(addr) if pc == addr && dr6 & DR6_BS == 0 => DebugExit::Breakpoint,
            _ => DebugExit::Guest,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stepping_wins_over_the_breakpoint() {
        let mut d = GuestDebug { breakpoint: Some(0x1000), ..Default::default() };
        let g = d.control();
        assert_eq!(g.control, KVM_GUESTDBG_ENABLE | KVM_GUESTDBG_USE_HW_BP);
        assert_eq!((g.arch.debugreg[0], g.arch.debugreg[7]), (0x1000, 0x401));
        d.step = true;
        assert_eq!(d.control().control, KVM_GUESTDBG_ENABLE | KVM_GUESTDBG_SINGLESTEP);
        assert_eq!(d.control().arch.debugreg[7], 0);
        d.step = false;
        d.pass = true;
        assert_eq!(d.control().control, KVM_GUESTDBG_ENABLE | KVM_GUESTDBG_SINGLESTEP, "no BLOCKIRQ on this KVM");
        d.block_irq = true;
        assert_eq!(d.control().control, KVM_GUESTDBG_ENABLE | KVM_GUESTDBG_SINGLESTEP | KVM_GUESTDBG_BLOCKIRQ);
        assert_eq!(GuestDebug::default().control().control, 0);
    }

    #[test]
    fn a_control_is_given_once_until_it_changes() {
        let mut d = GuestDebug::default();
        assert_eq!(d.take_change().map(|g| g.control), Some(0));
        assert!(d.take_change().is_none());
        d.breakpoint = Some(0x2000);
        assert!(d.take_change().is_some());
        assert!(d.take_change().is_none());
        d.breakpoint = Some(0x3000);
        assert_eq!(d.take_change().map(|g| g.arch.debugreg[0]), Some(0x3000));
        d.forget_applied();
        assert!(d.take_change().is_some());
    }

    #[test]
    fn debug_exits_go_to_their_owner() {
        let bp = GuestDebug { breakpoint: Some(0x5000), ..Default::default() };
        assert_eq!(bp.classify(0xFFFF_0FF1, 0x5000), DebugExit::Breakpoint);
        assert_eq!(bp.classify(0xFFFF_4FF0, 0x5000), DebugExit::Guest, "the guest's TF trap landing there");
        assert_eq!(bp.classify(0xFFFF_4FF0, 0x6000), DebugExit::Guest);
        let pass = GuestDebug { pass: true, ..bp };
        assert_eq!(pass.classify(0xFFFF_4FF0, 0x5004), DebugExit::Passed);
        let step = GuestDebug { step: true, ..bp };
        assert_eq!(step.classify(0xFFFF_4FF0, 0x5000), DebugExit::Step);
        assert_eq!(GuestDebug::default().classify(0xFFFF_4FF0, 0x10), DebugExit::Guest);
    }
}
