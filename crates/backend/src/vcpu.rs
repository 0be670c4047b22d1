//! The vCPU as a backend sees it. A VMM implements [`Vcpu`] over its KVM vCPU file descriptor;
//! tests implement it with scripted registers and guest memory.
use emon_x86::arch::IA32_TSC;
use emon_x86::fpu::Fpu;
use emon_x86::mode::CpuMode;
use kvm_bindings::{kvm_regs, kvm_sregs};
use thiserror::Error;
use vm_memory::GuestMemoryMmap;

/// A vCPU operation that failed (a KVM ioctl, in a VMM).
#[derive(Debug, Error)]
#[error("{op} failed: {source}")]
pub struct VcpuError {
    /// What was attempted, named after the ioctl where there is one (`KVM_SET_REGS`).
    pub op: &'static str,
    pub source: vmm_sys_util::errno::Error,
}

impl VcpuError {
    /// A closure for `map_err` that names the operation.
    pub fn op(op: &'static str) -> impl Fn(vmm_sys_util::errno::Error) -> VcpuError {
        move |source| VcpuError { op, source }
    }
}

/// An event due at the next instruction boundary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DueEvent {
    /// An external interrupt, acknowledged: its vector is in service in the local APIC.
    Interrupt(u8),
    Nmi,
    /// An interrupt of the 8259 PIC through LINT0 in ExtINT mode (virtual wire), not
    /// acknowledged: the next entry delivers it (the PIC gives the vector when acknowledged).
    ExtInt,
}

/// What a counting backend needs of one vCPU, at an exit (the vCPU is not running).
/// The guest's time-stamp counter as the host's plus an offset, where KVM runs it at the host's
/// rate: `offset` is the least the offset may be, `floor` is above every value the guest read
/// before (in KVM, or from an earlier window). What RDTSC returns from it ([`Self::now`]) never
/// goes back, and KVM's reads after it are at least as high (the vCPU waits for that before it
/// enters KVM again).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TscWindow {
    pub offset: u64,
    pub floor: u64,
    /// IA32_TSC_AUX, which RDTSCP returns in ECX.
    pub aux: u32,
}

impl TscWindow {
    /// The guest's TSC now.
    pub fn now(&self) -> u64 {
        host_tsc().wrapping_add(self.offset).max(self.floor)
    }
}

/// This host's time-stamp counter.
pub fn host_tsc() -> u64 {
    // SAFETY: RDTSC has no memory effects; every x86-64 CPU has it.
    unsafe { core::arch::x86_64::_rdtsc() }
}

pub trait Vcpu {
    /// The general-purpose registers, RIP and RFLAGS.
    fn regs(&mut self) -> Result<kvm_regs, VcpuError>;
    fn set_regs(&mut self, regs: &kvm_regs) -> Result<(), VcpuError>;
    /// The segment, control and descriptor-table registers, and EFER.
    fn sregs(&mut self) -> Result<kvm_sregs, VcpuError>;
    fn set_sregs(&mut self, sregs: &kvm_sregs) -> Result<(), VcpuError>;
    /// An IRET ran outside the vCPU (in an emulator): NMI blocking ends, as the IRET would have
    /// ended it (SDM Vol. 3A 6.7.1).
    fn end_nmi_blocking(&mut self) -> Result<(), VcpuError>;
    /// The CPU mode (CPL, code size, paging, IDT) from the segment and control registers.
    fn mode(&mut self) -> Result<CpuMode, VcpuError> {
        Ok(CpuMode::from_sregs(&self.sregs()?))
    }
    /// Single-step from the next entry on (each entry then retires one instruction and exits),
    /// or stop single-stepping.
    fn set_single_step(&mut self, on: bool) -> Result<(), VcpuError>;
    /// The vCPU has just retired HLT: it waits for an interrupt, and any interrupt shadow (STI's)
    /// has ended with the HLT it covered.
    fn halt(&mut self) -> Result<(), VcpuError>;
    /// Instructions retired outside the vCPU: any interrupt shadow (STI's, MOV SS's) the first
    /// was under has ended (SDM Vol. 3A 6.8.3), and where the last was STI (`sti`), its shadow
    /// begins: the interrupts it lets in wait until the next instruction has retired (SDM Vol.
    /// 2B, STI), as under the shadow the vCPU sets itself.
    fn set_interrupt_shadow(&mut self, sti: bool) -> Result<(), VcpuError>;
    /// The guest's translations KVM caches (its TLB, and the shadow page tables of a KVM without
    /// nested paging) are dropped before the next entry, as a MOV to CR3 that flushes drops them
    /// (SDM Vol. 3A 4.10.4.1): the guest changed its page tables and flushed, outside the vCPU.
    fn flush_tlb(&mut self) -> Result<(), VcpuError>;
    /// The vCPU's CPUID table as KVM holds it (with the bits KVM keeps up to date as the guest
    /// runs, such as OSXSAVE); empty where there is none to read.
    fn cpuid_entries(&mut self) -> Result<Vec<kvm_bindings::kvm_cpuid_entry2>, VcpuError> {
        Ok(Vec::new())
    }
    /// The guest's own breakpoints: DR0-DR3 and DR7.
    fn guest_breakpoints(&mut self) -> Result<emon_x86::debug::Breakpoints, VcpuError> {
        Ok(Default::default())
    }
    /// Sets the DR6 bits `status` as a debug exception does (SDM Vol. 3B 17.2.3): BS for a
    /// single-step trap, Bn for breakpoint n met. The others stay as they were.
    fn add_debug_status(&mut self, status: u64) -> Result<(), VcpuError>;
    /// Takes the interrupt or NMI due at this instruction boundary as the CPU takes one to
    /// deliver it (an interrupt goes in service in the local APIC; an NMI's blocking begins),
    /// without running a guest instruction: which one, if any. The caller delivers it, or hands
    /// it back with [`Self::queue_event`]. `None` where the vCPU cannot be asked.
    fn due_event(&mut self) -> Result<Option<DueEvent>, VcpuError> {
        Ok(None)
    }
    /// Delivers `event` (taken by [`Self::due_event`]) at the next entry.
    fn queue_event(&mut self, _event: DueEvent) -> Result<(), VcpuError> {
        Ok(())
    }
    /// Delivers exception `vector` (with `error_code` where it has one) at the next entry, through
    /// the guest's IDT; the instruction at RIP does not retire.
    fn inject_exception(&mut self, vector: u8, error_code: Option<u32>) -> Result<(), VcpuError>;
    /// Delivers a page fault with `error_code` at the next entry, CR2 taking `cr2`, the address
    /// that faulted (SDM Vol. 3A 4.7).
    fn inject_page_fault(&mut self, error_code: u32, cr2: u64) -> Result<(), VcpuError> {
        let mut sregs = self.sregs()?;
        sregs.cr2 = cr2;
        self.set_sregs(&sregs)?;
        self.inject_exception(emon_x86::arch::PF_VECTOR, Some(error_code))
    }
    /// Guest-physical memory.
    fn memory(&self) -> &GuestMemoryMmap;
    /// The local APIC's register page (KVM_GET_LAPIC: each register a little-endian word at its
    /// xAPIC offset, [`crate::lapic`]).
    fn lapic(&mut self) -> Result<[u8; 1024], VcpuError>;
    /// The vectors devices' interrupts arrive with (the I/O APIC's unmasked redirection
    /// entries), as a 256-bit set; none where there is no I/O APIC.
    fn device_vectors(&mut self) -> Result<[u64; 4], VcpuError> {
        Ok([0; 4])
    }
    /// Writes back `page`, changed from `read` (what [`Self::lapic`] gave): an interrupt KVM's
    /// devices requested since stays requested ([`crate::lapic::keep_new_requests`]).
    fn set_lapic(&mut self, page: &[u8; 1024], read: &[u8; 1024]) -> Result<(), VcpuError>;
    /// Queues an NMI for the vCPU (delivered at the next entry if it can take one).
    fn nmi(&mut self) -> Result<(), VcpuError>;
    /// The x87/MMX/SSE state and XCR0 (the TCG engine's instructions, adaptive PEBS's XMM group).
    fn fpu(&mut self) -> Result<Fpu, VcpuError> {
        Err(VcpuError { op: "reading the x87/SSE state", source: vmm_sys_util::errno::Error::new(libc::ENOTSUP) })
    }
    fn set_fpu(&mut self, _f: &Fpu) -> Result<(), VcpuError> {
        Err(VcpuError { op: "writing the x87/SSE state", source: vmm_sys_util::errno::Error::new(libc::ENOTSUP) })
    }
    /// XMM0-15 (adaptive PEBS's XMM group).
    fn xmm(&mut self) -> Result<[[u8; 16]; 16], VcpuError> {
        let f = self.fpu()?;
        Ok(std::array::from_fn(|n| f.xmm(n)))
    }
    /// The guest's MSR `index`, as the guest would read it where KVM answers it (IA32_TSC_AUX).
    fn get_msr(&mut self, index: u32) -> Result<u64, VcpuError>;
    /// Sets the guest's MSR `index` as the VMM (a host-initiated write: IA32_TSC_DEADLINE).
    fn set_msr(&mut self, index: u32, value: u64) -> Result<(), VcpuError>;
    /// Several MSRs at once, in `indices` order.
    fn get_msrs(&mut self, indices: &[u32]) -> Result<Vec<u64>, VcpuError> {
        indices.iter().map(|&i| self.get_msr(i)).collect()
    }
    fn set_msrs(&mut self, values: &[(u32, u64)]) -> Result<(), VcpuError> {
        values.iter().try_for_each(|&(i, v)| self.set_msr(i, v))
    }
    /// The guest's time-stamp counter now: what RDTSC would return.
    fn guest_tsc(&mut self) -> Result<u64, VcpuError> {
        self.get_msr(IA32_TSC)
    }
    /// Makes the guest's time-stamp counter read `value` now and run on from it with real time.
    /// `Ok(false)`: this host cannot move the guest's TSC (it stays where it was).
    fn set_guest_tsc(&mut self, value: u64) -> Result<bool, VcpuError>;
    /// Where the TCG engine may answer RDTSC and RDTSCP itself, from the host's TSC ([`TscWindow`]);
    /// `None`: only KVM, or emon through KVM, reads the guest's TSC here.
    fn tsc_window(&mut self) -> Result<Option<TscWindow>, VcpuError> {
        Ok(None)
    }
    /// The guest was given TSC values up to `value` outside KVM (from a [`TscWindow`]).
    fn tsc_given(&mut self, _value: u64) {}
    /// The guest's TSC was written (WRMSR of IA32_TSC or IA32_TSC_ADJUST): it may go back.
    fn tsc_written(&mut self) {}
    /// Waits (real time) until the guest's time-stamp counter reads at least `value`, or for
    /// `limit` at most; returns what it reads then.
    fn wait_for_guest_tsc(&mut self, value: u64, limit: std::time::Duration) -> Result<u64, VcpuError>;
}
