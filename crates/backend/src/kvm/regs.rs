//! The vCPU's registers between two KVM_RUNs. Every KVM_RUN leaves them in `kvm_run` where the
//! host has KVM_CAP_SYNC_REGS (KVM's `store_regs` at the end of the ioctl), so reading them costs
//! no ioctl; a vCPU ioctl costs 5-10 µs on a nested host (it loads the vCPU), and the precise
//! backend reads the registers at nearly every exit. A write of the general registers goes into
//! `kvm_run` too, marked dirty, and KVM takes it at the start of the next KVM_RUN (`sync_regs`,
//! before it enters the guest): the precise backend writes them after every TCG engine run, and
//! KVM_SET_REGS was a seventh of a Linux boot's time. An ioctl that must see them first (the
//! guest-debug control, which looks at RIP and RFLAGS) flushes them ([`RegCache::flush`]). The
//! segment registers and the events go to KVM at once (KVM_SET_SREGS, KVM_SET_VCPU_EVENTS). What
//! was written is kept as the values to read until the next KVM_RUN.
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
    /// The general registers were written into `kvm_run` and KVM has not taken them yet.
    dirty: bool,
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
        // KVM takes the dirty registers before anything else in KVM_RUN, even one that ends at
        // once (`immediate_exit`, a signal).
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
        if self.sync & KVM_SYNC_X86_REGS != 0 {
            fd.sync_regs_mut().regs = *r;
            fd.set_sync_dirty_reg(SyncReg::Register);
            self.dirty = true;
        } else {
            fd.set_regs(r).map_err(VcpuError::op("KVM_SET_REGS"))?;
        }
        self.regs = Some(*r);
        Ok(())
    }

    /// Gives KVM the general registers written into `kvm_run` now, for an ioctl that reads them.
    pub fn flush(&mut self, fd: &mut VcpuFd) -> Result<(), VcpuError> {
        if let (true, Some(r)) = (std::mem::take(&mut self.dirty), self.regs) {
            fd.clear_sync_dirty_reg(SyncReg::Register);
            fd.set_regs(&r).map_err(VcpuError::op("KVM_SET_REGS"))?;
        }
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
