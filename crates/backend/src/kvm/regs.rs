//! The vCPU's registers between two KVM_RUNs. Every KVM_RUN leaves them in `kvm_run` where the
//! host has KVM_CAP_SYNC_REGS (KVM's `store_regs` at the end of the ioctl, an EINTR included), so
//! reading them costs no ioctl; a vCPU ioctl costs 5-10 µs on a nested host (it loads the vCPU),
//! and the precise backend reads and writes them at nearly every exit and around every system
//! call it completes. A write of the general registers, the segment and control registers or the
//! events goes into `kvm_run` too, marked dirty, and KVM takes it at the start of the next KVM_RUN
//! (`sync_regs`, before it enters the guest or sees a signal), in the order general, segment,
//! events, as the same ioctls would. Any other ioctl may read what those sets hold (EFER through
//! KVM_GET_MSRS, RIP for the guest-debug control, an injected interrupt through the events), so
//! the owner flushes them first ([`RegCache::flush`]). What was written is kept as the values to
//! read until the next KVM_RUN, but for the events, which are read back from KVM (what it reads
//! back may differ from what it took: the flags, an injected exception).
//!
//! The debug registers, the MSRs of [`CACHED_MSRS`] and the x87/SSE/AVX state are kept the same
//! way, read once until the next KVM_RUN: only a guest instruction (which runs in KVM) or the VMM
//! changes them.
use kvm_bindings::{
    kvm_debugregs, kvm_regs, kvm_sregs, kvm_vcpu_events, KVM_SYNC_X86_EVENTS, KVM_SYNC_X86_REGS, KVM_SYNC_X86_SREGS,
};
use kvm_ioctls::{Cap, Kvm, SyncReg, VcpuFd};

use crate::VcpuError;
use emon_x86::arch::{
    IA32_APIC_BASE, IA32_CSTAR, IA32_EFER, IA32_FMASK, IA32_KERNEL_GS_BASE, IA32_LSTAR, IA32_STAR, IA32_TSC_AUX,
};
use emon_x86::fpu::Fpu;

/// IA32_FS_BASE, IA32_GS_BASE (SDM Vol. 4, Table 2-2).
const IA32_FS_BASE: u32 = 0xC000_0100;
const IA32_GS_BASE: u32 = 0xC000_0101;

/// MSRs whose values stay until the next KVM_RUN unless the VMM writes them: only WRMSR (and
/// SWAPGS for IA32_KERNEL_GS_BASE) changes them, not time or the segment registers' sets (EFER,
/// FS and GS bases and the APIC base are in KVM_SET_SREGS; the TSC, its deadline and the x2APIC
/// timer move on their own).
pub const CACHED_MSRS: [u32; 6] = [IA32_STAR, IA32_LSTAR, IA32_CSTAR, IA32_FMASK, IA32_KERNEL_GS_BASE, IA32_TSC_AUX];

/// MSRs KVM_SET_SREGS writes too (EFER, the APIC base, FS's and GS's bases): an access to one
/// needs the segment and control registers written into `kvm_run` in KVM's hands first.
pub const SREGS_MSRS: [u32; 4] = [IA32_EFER, IA32_APIC_BASE, IA32_FS_BASE, IA32_GS_BASE];

/// The register sets read since the last KVM_RUN, or written.
#[derive(Debug, Default)]
pub struct RegCache {
    /// The sets KVM puts in `kvm_run` at every KVM_RUN here (KVM_SYNC_X86_* bits).
    pub(super) sync: u32,
    /// The sets `kvm_run` holds as they are (as the last KVM_RUN left them, and not written since).
    fresh: u32,
    /// The sets written into `kvm_run` that KVM has not taken yet (KVM_SYNC_X86_* bits).
    dirty: u32,
    regs: Option<kvm_regs>,
    sregs: Option<kvm_sregs>,
    events: Option<kvm_vcpu_events>,
    debugregs: Option<kvm_debugregs>,
    /// Values of [`CACHED_MSRS`] read or written since the last KVM_RUN.
    msrs: Vec<(u32, u64)>,
    /// The x87/SSE/AVX state and XCR0, as read since the last KVM_RUN.
    fpu: Option<Fpu>,
    /// vCPU ioctls made through the cache (reads it could not answer, writes, flushes).
    pub ioctls: u64,
}

/// What a KVM_RUN that runs no guest instruction leaves as it was: the debug registers, the
/// MSRs and the x87/SSE/AVX state read before it.
pub struct Kept {
    debugregs: Option<kvm_debugregs>,
    msrs: Vec<(u32, u64)>,
    fpu: Option<Fpu>,
}

/// Each KVM_SYNC_X86_* set and its kvm-ioctls name, in the order KVM's `sync_regs` takes them.
const SETS: [(u32, SyncReg); 3] = [
    (KVM_SYNC_X86_REGS, SyncReg::Register),
    (KVM_SYNC_X86_SREGS, SyncReg::SystemRegister),
    (KVM_SYNC_X86_EVENTS, SyncReg::VcpuEvents),
];

impl RegCache {
    /// Asks KVM to put the general, segment and control registers and the pending events in
    /// `kvm_run` at every exit, where it can.
    pub fn new(kvm: &Kvm, fd: &mut VcpuFd) -> RegCache {
        let offered =
            if kvm.check_extension(Cap::SyncRegs) { kvm.check_extension_int(Cap::SyncRegs) as u32 } else { 0 };
        let mut sync = 0;
        for (bit, set) in SETS {
            if offered & bit != 0 {
                fd.set_sync_valid_reg(set);
                sync |= bit;
            }
        }
        RegCache { sync, ..Default::default() }
    }

    /// A KVM_RUN is about to start: what was read or written is old after it. `synced`: it
    /// returned (an exit, or EINTR after a kick: KVM stores the sets on every return but a
    /// failure of its own checks).
    pub fn ran(&mut self, synced: bool) {
        // KVM takes the dirty sets before anything else in KVM_RUN, even one that ends at once
        // (`immediate_exit`, a signal).
        *self = RegCache {
            sync: self.sync,
            fresh: if synced { self.sync } else { 0 },
            ioctls: self.ioctls,
            ..Default::default()
        };
    }

    /// The debug registers and MSRs read, for a KVM_RUN that runs no guest instruction.
    pub fn kept(&self) -> Kept {
        Kept { debugregs: self.debugregs, msrs: self.msrs.clone(), fpu: self.fpu.clone() }
    }

    /// Takes back what [`Self::kept`] gave, after such a KVM_RUN.
    pub fn keep(&mut self, kept: Kept) {
        Kept { debugregs: self.debugregs, msrs: self.msrs, fpu: self.fpu } = kept;
    }

    /// Whether the sets in `bit` can be read from `kvm_run`.
    fn in_run(&self, bit: u32) -> bool {
        self.fresh & bit != 0
    }

    /// Puts `bit`'s set, written into `kvm_run`, in KVM's hands at the next KVM_RUN.
    fn mark_dirty(&mut self, fd: &mut VcpuFd, bit: u32) {
        let (_, set) = SETS.into_iter().find(|(b, _)| *b == bit).expect("a KVM_SYNC_X86_* set");
        fd.set_sync_dirty_reg(set);
        self.dirty |= bit;
        self.fresh &= !bit;
    }

    pub fn regs(&mut self, fd: &mut VcpuFd) -> Result<kvm_regs, VcpuError> {
        if let Some(r) = self.regs {
            return Ok(r);
        }
        let r = if self.in_run(KVM_SYNC_X86_REGS) {
            fd.sync_regs_mut().regs
        } else {
            self.ioctls += 1;
            fd.get_regs().map_err(VcpuError::op("KVM_GET_REGS"))?
        };
        self.regs = Some(r);
        Ok(r)
    }

    pub fn set_regs(&mut self, fd: &mut VcpuFd, r: &kvm_regs) -> Result<(), VcpuError> {
        if self.sync & KVM_SYNC_X86_REGS != 0 {
            fd.sync_regs_mut().regs = *r;
            self.mark_dirty(fd, KVM_SYNC_X86_REGS);
        } else {
            self.ioctls += 1;
            fd.set_regs(r).map_err(VcpuError::op("KVM_SET_REGS"))?;
        }
        self.regs = Some(*r);
        Ok(())
    }

    /// Gives KVM the sets written into `kvm_run` now, in `sync_regs`'s order, for an ioctl that
    /// may read them.
    pub fn flush(&mut self, fd: &mut VcpuFd) -> Result<(), VcpuError> {
        let dirty = std::mem::take(&mut self.dirty);
        for (bit, set) in SETS.into_iter().filter(|(b, _)| dirty & b != 0) {
            fd.clear_sync_dirty_reg(set);
            self.ioctls += 1;
            let s = *fd.sync_regs_mut();
            match bit {
                KVM_SYNC_X86_REGS => fd.set_regs(&s.regs).map_err(VcpuError::op("KVM_SET_REGS"))?,
                KVM_SYNC_X86_SREGS => fd.set_sregs(&s.sregs).map_err(VcpuError::op("KVM_SET_SREGS"))?,
                _ => fd.set_vcpu_events(&s.events).map_err(VcpuError::op("KVM_SET_VCPU_EVENTS"))?,
            }
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
            self.flush(fd)?;
            self.ioctls += 1;
            fd.get_sregs().map_err(VcpuError::op("KVM_GET_SREGS"))?
        };
        self.sregs = Some(s);
        Ok(s)
    }

    pub fn set_sregs(&mut self, fd: &mut VcpuFd, s: &kvm_sregs) -> Result<(), VcpuError> {
        if self.sync & KVM_SYNC_X86_SREGS != 0 {
            fd.sync_regs_mut().sregs = *s;
            self.mark_dirty(fd, KVM_SYNC_X86_SREGS);
        } else {
            self.ioctls += 1;
            fd.set_sregs(s).map_err(VcpuError::op("KVM_SET_SREGS"))?;
        }
        self.sregs = Some(*s);
        Ok(())
    }

    /// KVM_SET_SREGS now, past `kvm_run`: for a change KVM must see as a step of its own (a CR3
    /// write it compares with the one before).
    pub fn set_sregs_now(&mut self, fd: &mut VcpuFd, s: &kvm_sregs) -> Result<(), VcpuError> {
        self.flush(fd)?;
        self.ioctls += 1;
        fd.set_sregs(s).map_err(VcpuError::op("KVM_SET_SREGS"))?;
        self.sregs = Some(*s);
        self.fresh &= !KVM_SYNC_X86_SREGS;
        Ok(())
    }

    pub fn events(&mut self, fd: &mut VcpuFd) -> Result<kvm_vcpu_events, VcpuError> {
        if let Some(e) = self.events {
            return Ok(e);
        }
        let e = if self.in_run(KVM_SYNC_X86_EVENTS) {
            fd.sync_regs_mut().events
        } else {
            // Written ones are read back as KVM took them.
            self.flush(fd)?;
            self.ioctls += 1;
            fd.get_vcpu_events().map_err(VcpuError::op("KVM_GET_VCPU_EVENTS"))?
        };
        self.events = Some(e);
        Ok(e)
    }

    pub fn set_events(&mut self, fd: &mut VcpuFd, e: &kvm_vcpu_events) -> Result<(), VcpuError> {
        if self.sync & KVM_SYNC_X86_EVENTS != 0 {
            fd.sync_regs_mut().events = *e;
            self.mark_dirty(fd, KVM_SYNC_X86_EVENTS);
        } else {
            self.ioctls += 1;
            fd.set_vcpu_events(e).map_err(VcpuError::op("KVM_SET_VCPU_EVENTS"))?;
            self.fresh &= !KVM_SYNC_X86_EVENTS;
        }
        // Read back from KVM where the write injects an event (KVM may hold it otherwise:
        // pending rather than injected, with a payload); kept as written where it does not.
        let injects =
            e.exception.injected != 0 || e.exception.pending != 0 || e.interrupt.injected != 0 || e.nmi.injected != 0;
        self.events = (!injects).then_some(*e);
        Ok(())
    }

    pub fn debug_regs(&mut self, fd: &mut VcpuFd) -> Result<kvm_debugregs, VcpuError> {
        if let Some(d) = self.debugregs {
            return Ok(d);
        }
        self.ioctls += 1;
        let d = fd.get_debug_regs().map_err(VcpuError::op("KVM_GET_DEBUGREGS"))?;
        self.debugregs = Some(d);
        Ok(d)
    }

    /// KVM_SET_DEBUGREGS; they are read back from KVM, which keeps DR6's and DR7's fixed bits.
    pub fn set_debug_regs(&mut self, fd: &mut VcpuFd, d: &kvm_debugregs) -> Result<(), VcpuError> {
        self.flush(fd)?;
        self.ioctls += 1;
        self.debugregs = None;
        fd.set_debug_regs(d).map_err(VcpuError::op("KVM_SET_DEBUGREGS"))
    }

    /// The x87/SSE/AVX state, read with `get` once until the next KVM_RUN or write.
    pub fn fpu(&mut self, get: impl FnOnce() -> Result<Fpu, VcpuError>) -> Result<Fpu, VcpuError> {
        if let Some(f) = &self.fpu {
            return Ok(f.clone());
        }
        self.ioctls += 1;
        let f = get()?;
        self.fpu = Some(f.clone());
        Ok(f)
    }

    /// The x87/SSE/AVX state is written: read back from KVM, which normalizes the XSAVE header.
    pub fn fpu_written(&mut self) {
        self.ioctls += 1;
        self.fpu = None;
    }

    /// The value of MSR `index` if it was read or written since the last KVM_RUN and is one of
    /// [`CACHED_MSRS`].
    pub fn msr(&self, index: u32) -> Option<u64> {
        self.msrs.iter().find(|(i, _)| *i == index).map(|(_, v)| *v)
    }

    /// MSR `index` holds `value` (read from KVM or written to it).
    pub fn keep_msr(&mut self, index: u32, value: u64) {
        if !CACHED_MSRS.contains(&index) {
            return;
        }
        match self.msrs.iter_mut().find(|(i, _)| *i == index) {
            Some(slot) => slot.1 = value,
            None => self.msrs.push((index, value)),
        }
    }
}
