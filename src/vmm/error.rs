//! [`VmmError`]: why emon could not run a guest. Every variant keeps the error it comes from
//! (`std::error::Error::source`), and its message is one line that says what to do where there
//! is something to do.
use super::layout;
use super::loader::KernelError;
use std::path::PathBuf;
use thiserror::Error;
use vm_memory::mmap::FromRangesError;
use vm_memory::GuestMemoryError;
use vmm_sys_util::errno;

/// Why emon could not run a guest.
#[derive(Debug, Error)]
pub enum VmmError {
    #[error("/dev/kvm does not exist: this machine has no KVM. Enable hardware virtualization (VT-x/AMD-V) in the firmware, or nested virtualization if this machine is itself a VM, and load the kvm_intel or kvm_amd module")]
    NoKvm,
    #[error("permission denied opening /dev/kvm: add your user to the 'kvm' group (sudo usermod -aG kvm $USER, then log in again) or run emon as root")]
    KvmPermission,
    #[error("this KVM lacks {name}, which emon needs for {why}")]
    MissingCap { name: &'static str, why: &'static str },
    #[error("{op} failed: {source}")]
    Kvm { op: &'static str, source: kvm_ioctls::Error },
    #[error("{name}: {source}")]
    Kernel { name: String, source: KernelError },
    #[error("--memory {0} MiB: guest RAM must be between {min} and {max} MiB", min = layout::MIN_RAM >> 20, max = layout::MAX_RAM >> 20)]
    MemorySize(u64),
    /// Mapping guest RAM in emon's address space.
    #[error("guest memory: allocating {mib} MiB: {source}")]
    MemoryAlloc { mib: u64, source: FromRangesError },
    /// The host address of a guest RAM region, for KVM_SET_USER_MEMORY_REGION.
    #[error("guest memory: {0}")]
    MemoryHostAddress(#[source] GuestMemoryError),
    /// Writing the boot structures (GDT, page tables) into guest RAM.
    #[error("guest memory: writing {len} bytes at {addr:#x}: {source}")]
    MemoryWrite { addr: u64, len: usize, source: GuestMemoryError },
    #[error("serial output {path}: {source}")]
    SerialFile { path: PathBuf, source: std::io::Error },
    #[error("--trace {}: {source}", path.display())]
    TraceFile { path: PathBuf, source: std::io::Error },
    /// The profile's CPUID table does not fit KVM_SET_CPUID2.
    #[error("CPUID table: {0:?}")]
    CpuidTable(#[source] vmm_sys_util::fam::Error),
    #[error("duplicating the VM's file descriptor: {0}")]
    DupVmFd(#[source] std::io::Error),
    #[error("eventfd: {0}")]
    EventFd(#[source] std::io::Error),
    /// Creating or arming the `--timeout` timer (`what` says which).
    #[error("{what}: {source}")]
    Timer { what: &'static str, source: errno::Error },
    /// `signal` names the handler: "SIGINT", "vCPU kick signal".
    #[error("installing the {signal} handler: {source}")]
    SignalHandler { signal: &'static str, source: errno::Error },
    #[error("event manager: {0:?}")]
    EventManager(#[source] event_manager::Error),
    #[error("event loop: {0:?}")]
    EventLoop(#[source] event_manager::Error),
    #[error("spawning the vCPU thread: {0}")]
    SpawnVcpu(#[source] std::io::Error),
    /// The vCPU thread panicked; `message` is the panic's message when it was a string (the
    /// panic hook has already printed it).
    #[error("the vCPU thread panicked")]
    VcpuPanicked { message: Option<String> },
    /// The guest made the run impossible to continue (VM entry failure, a KVM internal error
    /// emon could not complete); the text carries the diagnosis and the registers.
    #[error("the guest stopped unexpectedly: {0}")]
    Guest(String),
    #[error("counting backend: {0}")]
    Backend(#[from] crate::backend::BackendError),
}

impl VmmError {
    /// The error for a vCPU thread that panicked, from `JoinHandle::join`'s payload.
    pub fn vcpu_panicked(payload: Box<dyn std::any::Any + Send>) -> VmmError {
        let message = match payload.downcast::<String>() {
            Ok(s) => Some(*s),
            Err(payload) => payload.downcast_ref::<&str>().map(|s| s.to_string()),
        };
        VmmError::VcpuPanicked { message }
    }
}

/// `map_err` for a failed KVM ioctl.
pub(crate) fn kvm_err(op: &'static str) -> impl Fn(kvm_ioctls::Error) -> VmmError {
    move |source| VmmError::Kvm { op, source }
}

impl From<crate::backend::VcpuError> for VmmError {
    fn from(e: crate::backend::VcpuError) -> VmmError {
        VmmError::Kvm { op: e.op, source: e.source }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    fn enoent() -> std::io::Error {
        std::io::Error::from_raw_os_error(libc::ENOENT)
    }

    #[test]
    fn messages_are_one_line_and_sources_are_kept() {
        let e = VmmError::TraceFile { path: "/x/t.json".into(), source: enoent() };
        assert_eq!(e.to_string(), "--trace /x/t.json: No such file or directory (os error 2)");
        let io = e.source().and_then(|s| s.downcast_ref::<std::io::Error>()).expect("the io::Error");
        assert_eq!(io.raw_os_error(), Some(libc::ENOENT));
        let e = VmmError::EventFd(enoent());
        assert_eq!(e.to_string(), "eventfd: No such file or directory (os error 2)");
        assert!(e.source().is_some());
        let e = VmmError::SignalHandler { signal: "SIGINT", source: errno::Error::new(libc::EINVAL) };
        assert!(e.to_string().starts_with("installing the SIGINT handler: "), "{e}");
        assert!(e.source().is_some_and(|s| s.is::<errno::Error>()));
        let e = VmmError::CpuidTable(vmm_sys_util::fam::Error::SizeLimitExceeded);
        assert_eq!(e.to_string(), "CPUID table: SizeLimitExceeded");
        assert!(e.source().is_some());
    }

    #[test]
    fn a_panicked_vcpu_thread_keeps_its_message() {
        let payload = std::thread::spawn(|| std::panic::panic_any(String::from("boom"))).join().unwrap_err();
        let e = VmmError::vcpu_panicked(payload);
        assert_eq!(e.to_string(), "the vCPU thread panicked");
        assert!(matches!(e, VmmError::VcpuPanicked { message: Some(m) } if m == "boom"));
        let e = VmmError::vcpu_panicked(Box::new("static"));
        assert!(matches!(e, VmmError::VcpuPanicked { message: Some(m) } if m == "static"));
        let e = VmmError::vcpu_panicked(Box::new(7));
        assert!(matches!(e, VmmError::VcpuPanicked { message: None }));
    }
}
