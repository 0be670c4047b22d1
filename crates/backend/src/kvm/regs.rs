//! The vCPU's registers between two KVM_RUNs. Every KVM_RUN leaves them in `kvm_run` where the
//! host has KVM_CAP_SYNC_REGS (KVM's `store_regs` at the end of the ioctl), so reading them costs
//! no ioctl; a vCPU ioctl costs 5-10 µs on a nested host (it loads the vCPU), and the precise
//! backend reads the registers at nearly every exit. Writes go to KVM at once (KVM_SET_REGS,
//! KVM_SET_SREGS, KVM_SET_VCPU_EVENTS), in the order they are made, and are kept as the values to
//! read until the next KVM_RUN.
use kvm_bindings::{kvm_regs, kvm_sregs, kvm_vcpu_events, KVM_SYNC_X86_EVENTS, KVM_SYNC_X86_REGS, KVM_SYNC_X86_SREGS};
use kvm_ioctls::{Cap, Kvm, SyncReg, VcpuFd};

use crate::VcpuError;

/// The register sets read since the last KVM_RUN, or written.
#[derive(Debug, Default)]
pub struct RegCache {
    /// The sets KVM puts in `kvm_run` at every KVM_RUN here (KVM_SYNC_X86_* bits).
    sync: u32,
    /// The sets `kvm_run` holds as they are (as the last KVM_RUN left them, and not written since).
    fresh: u32,
    regs: Option<kvm_regs>,
    sregs: Option<kvm_sregs>,
    events: Option<kvm_vcpu_events>,
}

impl RegCache {
    /// Asks KVM to put the general, segment and control registers and the pending events in
    /// `kvm_run` at every exit, where it can.
    pub fn new(kvm: &Kvm, fd: &mut VcpuFd) -> RegCache {
        let offered =
            if kvm.check_extension(Cap::SyncRegs) { kvm.check_extension_int(Cap::SyncRegs) as u32 } else { 0 };
        let mut sync = 0;
        for (bit, set) in [
            (KVM_SYNC_X86_REGS, SyncReg::Register),
            (KVM_SYNC_X86_SREGS, SyncReg::SystemRegister),
            (KVM_SYNC_X86_EVENTS, SyncReg::VcpuEvents),
        ] {
            if offered & bit != 0 {
                fd.set_sync_valid_reg(set);
                sync |= bit;
            }
        }
        RegCache { sync, ..Default::default() }
    }

    /// A KVM_RUN is about to start: what was read or written is old after it. `synced`: it
    /// returned (an exit, or EINTR after a kick: KVM stores the sets on every return but a
    /// failure).
    pub fn ran(&mut self, synced: bool) {
        *self = RegCache { sync: self.sync, fresh: if synced { self.sync } else { 0 }, ..Default::default() };
    }

    /// Whether the sets in `bit` can be read from `kvm_run`.
    fn in_run(&self, bit: u32) -> bool {
        self.fresh & bit != 0
    }

    pub fn regs(&mut self, fd: &mut VcpuFd) -> Result<kvm_regs, VcpuError> {
        if let Some(r) = self.regs {
            return Ok(r);
        }
        let r = if self.in_run(KVM_SYNC_X86_REGS) {
            fd.sync_regs_mut().regs
        } else {
            fd.get_regs().map_err(VcpuError::op("KVM_GET_REGS"))?
        };
        self.regs = Some(r);
        Ok(r)
    }

    pub fn set_regs(&mut self, fd: &mut VcpuFd, r: &kvm_regs) -> Result<(), VcpuError> {
        fd.set_regs(r).map_err(VcpuError::op("KVM_SET_REGS"))?;
        self.regs = Some(*r);
        Ok(())
    }

    pub fn sregs(&mut self, fd: &mut VcpuFd) -> Result<kvm_sregs, VcpuError> {
        if let Some(s) = self.sregs {
            return Ok(s);
        }
        let s = if self.in_run(KVM_SYNC_X86_SREGS) {
            fd.sync_regs_mut().sregs
        } else {
            fd.get_sregs().map_err(VcpuError::op("KVM_GET_SREGS"))?
        };
        self.sregs = Some(s);
        Ok(s)
    }

    pub fn set_sregs(&mut self, fd: &mut VcpuFd, s: &kvm_sregs) -> Result<(), VcpuError> {
        fd.set_sregs(s).map_err(VcpuError::op("KVM_SET_SREGS"))?;
        self.sregs = Some(*s);
        Ok(())
    }

    pub fn events(&mut self, fd: &mut VcpuFd) -> Result<kvm_vcpu_events, VcpuError> {
        if let Some(e) = self.events {
            return Ok(e);
        }
        let e = if self.in_run(KVM_SYNC_X86_EVENTS) {
            fd.sync_regs_mut().events
        } else {
            fd.get_vcpu_events().map_err(VcpuError::op("KVM_GET_VCPU_EVENTS"))?
        };
        self.events = Some(e);
        Ok(e)
    }

    pub fn set_events(&mut self, fd: &mut VcpuFd, e: &kvm_vcpu_events) -> Result<(), VcpuError> {
        fd.set_vcpu_events(e).map_err(VcpuError::op("KVM_SET_VCPU_EVENTS"))?;
        // What KVM reads back may differ from what it took (the flags, an injected exception).
        self.events = None;
        self.fresh &= !KVM_SYNC_X86_EVENTS;
        Ok(())
    }
}
