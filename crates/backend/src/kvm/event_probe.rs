//! Bringing KVM's interrupt state up to date without entering the guest. KVM_RUN with a signal
//! pending that the vCPU's signal mask lets through (KVM API, KVM_SET_SIGNAL_MASK) does what an
//! entry does up to the last moment, among it moving an expired local-APIC timer into the IRR
//! and the NMIs queued with KVM_NMI to pending; then it sees the signal and returns EINTR before
//! the guest runs one instruction. `KvmCpu::due_event` runs it with RFLAGS.IF clear and NMIs
//! masked, so that KVM injects nothing (a host may deliver an event when it injects it, and not
//! undo that when it cancels the entry: kvm_pvm), and decides itself what the CPU would take;
//! [`pic_asserts`] reads the in-kernel PIC for the interrupts of virtual wire mode.
//!
//! The precise backend needs this where it runs user mode in the TCG engine and the host cannot
//! single-step user mode (README, "User mode (CPL3)"): an ordinary KVM_RUN at CPL3 would run user
//! code unseen whenever nothing was due.
use crate::VcpuError;
use kvm_ioctls::VcpuFd;
use vmm_sys_util::errno::Error as Errno;
use vmm_sys_util::ioctl::ioctl_with_ref;

vmm_sys_util::ioctl_iow_nr!(KVM_SET_SIGNAL_MASK, kvm_bindings::KVMIO, 0x8b, kvm_bindings::kvm_signal_mask);
vmm_sys_util::ioctl_iowr_nr!(KVM_GET_IRQCHIP, kvm_bindings::KVMIO, 0x62, kvm_bindings::kvm_irqchip);

/// The state of the in-kernel interrupt controller `chip_id` of the VM `vm` (a VM file
/// descriptor).
fn irqchip(vm: &std::os::fd::OwnedFd, chip_id: u32) -> Result<kvm_bindings::kvm_irqchip, VcpuError> {
    let mut chip = kvm_bindings::kvm_irqchip { chip_id, ..Default::default() };
    // SAFETY: KVM_GET_IRQCHIP fills the kvm_irqchip it is given, which outlives the call.
    if unsafe { vmm_sys_util::ioctl::ioctl_with_mut_ref(vm, KVM_GET_IRQCHIP(), &mut chip) } != 0 {
        return Err(VcpuError { op: "KVM_GET_IRQCHIP", source: Errno::last() });
    }
    Ok(chip)
}

/// Whether the in-kernel 8259 master PIC of the VM `vm` asserts its output
/// ([`crate::lapic::pic_output`]).
pub fn pic_asserts(vm: &std::os::fd::OwnedFd) -> Result<bool, VcpuError> {
    let chip = irqchip(vm, kvm_bindings::KVM_IRQCHIP_PIC_MASTER)?;
    // SAFETY: chip_id PIC_MASTER makes `pic` the member KVM filled.
    let pic = unsafe { chip.chip.pic };
    Ok(crate::lapic::pic_output(pic.irr, pic.imr, pic.isr, pic.priority_add, pic.special_fully_nested_mode != 0))
}

/// The vectors of the in-kernel I/O APIC's unmasked redirection entries (its devices'
/// interrupts, 82093AA I/O APIC datasheet 3.2.4: vector in bits 7:0, mask in bit 16), as a
/// 256-bit set.
pub fn ioapic_vectors(vm: &std::os::fd::OwnedFd) -> Result<[u64; 4], VcpuError> {
    let chip = irqchip(vm, kvm_bindings::KVM_IRQCHIP_IOAPIC)?;
    let mut set = [0u64; 4];
    // SAFETY: chip_id IOAPIC makes `ioapic` the member KVM filled; every redirection entry is
    // plain bits.
    for entry in unsafe { chip.chip.ioapic.redirtbl } {
        let bits = unsafe { entry.bits };
        if bits & 1 << 16 == 0 {
            let v = (bits & 0xFF) as usize;
            set[v / 64] |= 1 << (v % 64);
        }
    }
    Ok(set)
}

/// `struct kvm_signal_mask` with the kernel's 64-bit sigset after its length.
#[repr(C)]
struct SignalMask {
    len: u32,
    sigset: [u8; 8],
}

/// The signal that makes KVM_RUN stop short of the entry, blocked on the vCPU's thread outside
/// KVM_RUN, so that it never reaches a handler: it is raised right before the probing KVM_RUN
/// and taken back right after.
#[derive(Debug)]
pub struct EventProbe {
    signal: libc::c_int,
}

extern "C" fn never_delivered(_: libc::c_int) {}

impl EventProbe {
    /// Blocks `signal` on the calling thread (the vCPU's, which runs KVM_RUN) and makes KVM_RUN
    /// of `fd` run with the thread's mask without it. A handler that does nothing is installed
    /// too: an ignored signal would never be pending, and an unhandled one would end the process
    /// if it were ever delivered.
    pub fn install(fd: &VcpuFd, signal: libc::c_int) -> Result<EventProbe, VcpuError> {
        let failed = |op| move |_| VcpuError { op, source: Errno::last() };
        // SAFETY: plain libc calls on local, initialised signal sets; the handler is async-signal
        // safe (it does nothing).
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = never_delivered as extern "C" fn(libc::c_int) as usize;
            libc::sigemptyset(&mut action.sa_mask);
            if libc::sigaction(signal, &action, std::ptr::null_mut()) != 0 {
                return Err(failed("sigaction (the event probe's signal)")(()));
            }
            let mut probe: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut probe);
            libc::sigaddset(&mut probe, signal);
            let e = libc::pthread_sigmask(libc::SIG_BLOCK, &probe, &mut old);
            if e != 0 {
                return Err(VcpuError { op: "pthread_sigmask", source: Errno::new(e) });
            }
            libc::sigdelset(&mut old, signal);
            // The kernel's sigset is the first 64 bits of glibc's (bit n - 1 for signal n).
            let mut sigset = [0u8; 8];
            sigset.copy_from_slice(&std::slice::from_raw_parts((&old as *const libc::sigset_t).cast::<u8>(), 8)[..8]);
            let mask = SignalMask { len: 8, sigset };
            if ioctl_with_ref(fd, KVM_SET_SIGNAL_MASK(), &mask) != 0 {
                return Err(failed("KVM_SET_SIGNAL_MASK")(()));
            }
        }
        Ok(EventProbe { signal })
    }

    /// Makes the probe's signal pending on the calling thread.
    pub(super) fn raise(&self) -> Result<(), VcpuError> {
        // SAFETY: tgkill to the calling thread with a signal it blocks.
        let r = unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), libc::gettid(), self.signal) };
        if r != 0 {
            return Err(VcpuError { op: "tgkill (the event probe's signal)", source: Errno::last() });
        }
        Ok(())
    }

    /// Takes the probe's signal back (it stays pending after KVM_RUN, blocked).
    pub(super) fn take_back(&self) -> Result<(), VcpuError> {
        // SAFETY: sigtimedwait with a zero timeout on a set holding the blocked signal.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, self.signal);
            let now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
            if libc::sigtimedwait(&set, std::ptr::null_mut(), &now) != self.signal {
                return Err(VcpuError { op: "sigtimedwait (the event probe's signal)", source: Errno::last() });
            }
        }
        Ok(())
    }
}
