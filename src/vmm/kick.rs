//! Kicking a vCPU out of KVM_RUN from another thread: a real-time signal whose handler sets
//! `kvm_run.immediate_exit` through a thread-local pointer (the pattern Firecracker uses), so a
//! kick that lands just before KVM_RUN is not lost: KVM_RUN then returns EINTR at once.
use std::cell::Cell;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Once;
use vmm_sys_util::signal::{register_signal_handler, SIGRTMIN};

thread_local! {
    static IMMEDIATE_EXIT: Cell<*mut u8> = const { Cell::new(std::ptr::null_mut()) };
}

/// The signal used to kick vCPU threads.
pub fn kick_signal() -> libc::c_int {
    SIGRTMIN()
}

/// The signal the vCPU thread raises on itself to ask KVM which event is due without entering
/// the guest (`emon_backend::kvm::event_probe`).
pub fn event_probe_signal() -> libc::c_int {
    SIGRTMIN() + 1
}

extern "C" fn on_kick(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    let p = IMMEDIATE_EXIT.with(Cell::get);
    if !p.is_null() {
        // SAFETY: the pointer is the current thread's kvm_run.immediate_exit, registered by
        // `register` and cleared before the vCPU fd is dropped.
        unsafe { std::ptr::write_volatile(p, 1) }
    }
}

/// Installs the process-wide kick handler (idempotent).
pub fn install_handler() -> Result<(), super::VmmError> {
    static ONCE: Once = Once::new();
    let mut result = Ok(());
    ONCE.call_once(|| {
        result = register_signal_handler(kick_signal(), on_kick)
            .map_err(|source| super::VmmError::SignalHandler { signal: "vCPU kick signal", source });
    });
    result
}

/// Registers the calling thread's `immediate_exit` byte (None unregisters).
pub fn register(immediate_exit: Option<*mut u8>) {
    IMMEDIATE_EXIT.with(|c| c.set(immediate_exit.unwrap_or(std::ptr::null_mut())));
}

/// Why the supervisor stopped the vCPU.
#[derive(Debug, Default)]
pub struct StopRequest(AtomicU8);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    Timeout,
    Interrupted,
    /// The guest kernel printed its panic's end marker and its console stayed silent for
    /// [`super::supervisor::PANIC_QUIET`]: it spins forever.
    PanicEnd,
}

impl StopRequest {
    pub fn request(&self, r: StopReason) {
        let v = match r {
            StopReason::Timeout => 1,
            StopReason::Interrupted => 2,
            StopReason::PanicEnd => 3,
        };
        let _ = self.0.compare_exchange(0, v, Ordering::SeqCst, Ordering::SeqCst);
    }

    pub fn get(&self) -> Option<StopReason> {
        match self.0.load(Ordering::SeqCst) {
            1 => Some(StopReason::Timeout),
            2 => Some(StopReason::Interrupted),
            3 => Some(StopReason::PanicEnd),
            _ => None,
        }
    }
}
