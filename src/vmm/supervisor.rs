//! The main thread's event loop (rust-vmm event-manager) while the vCPU runs: the --timeout
//! timer, Ctrl-C, the end of a guest kernel's panic on the console, and the vCPU thread's
//! "finished" notification.
use super::devices::serial::ConsoleWatch;
use super::kick::{kick_signal, StopReason, StopRequest};
use super::VmmError;
use event_manager::{EventManager, EventOps, EventSet, Events, MutEventSubscriber, SubscriberOps};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::timerfd::TimerFd;

/// How long the console must stay silent after a guest kernel's panic end marker
/// ([`super::devices::serial::PANIC_END_MARK`]) before the run ends: Linux prints nothing after it
/// and spins, so a kernel without `panic=` would otherwise run to the timeout.
pub const PANIC_QUIET: Duration = Duration::from_secs(1);

/// The eventfd SIGINT writes to (async-signal-safe: one write(2)).
static SIGINT_FD: AtomicI32 = AtomicI32::new(-1);

extern "C" fn on_sigint(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    let fd = SIGINT_FD.load(Ordering::SeqCst);
    if fd >= 0 {
        let one: u64 = 1;
        // SAFETY: writing 8 bytes from a valid u64 to an eventfd.
        unsafe { libc::write(fd, &one as *const u64 as *const libc::c_void, 8) };
    }
}

/// The main thread's event loop, made with every file descriptor it uses before the vCPU thread
/// starts: the vCPU counts the process's open descriptors when it starts and when it ends (a
/// backend that leaks host events shows), and nothing may open one in between but the run.
pub struct Supervision {
    supervisor: Arc<Mutex<Supervisor>>,
    events: EventManager<Arc<Mutex<Supervisor>>>,
}

impl Supervision {
    pub fn new(
        timeout: Option<Duration>,
        vcpu_done: EventFd,
        stop: Arc<StopRequest>,
        console: Arc<ConsoleWatch>,
    ) -> Result<Self, VmmError> {
        let supervisor = Arc::new(Mutex::new(Supervisor::new(timeout, vcpu_done, stop, console)?));
        let mut events = EventManager::<Arc<Mutex<Supervisor>>>::new().map_err(VmmError::EventManager)?;
        events.add_subscriber(supervisor.clone());
        Ok(Supervision { supervisor, events })
    }

    /// Runs the event loop until the vCPU thread writes `vcpu_done`, stopping the vCPU (the
    /// thread `vcpu_thread`) through `stop` and a kick on the timeout or Ctrl-C.
    pub fn run(mut self, vcpu_thread: libc::pthread_t) -> Result<(), VmmError> {
        if let Ok(mut s) = self.supervisor.lock() {
            s.vcpu_thread = Some(vcpu_thread);
        }
        while !self.supervisor.lock().map(|s| s.finished).unwrap_or(true) {
            self.events.run().map_err(VmmError::EventLoop)?;
        }
        Ok(())
    }
}

pub struct Supervisor {
    timer: Option<TimerFd>,
    sigint: EventFd,
    vcpu_done: EventFd,
    stop: Arc<StopRequest>,
    /// The vCPU thread, once it runs.
    vcpu_thread: Option<libc::pthread_t>,
    pub finished: bool,
    /// The console: its byte count and the panic end marker's eventfd.
    console: Arc<ConsoleWatch>,
    /// Armed for [`PANIC_QUIET`] once the panic end marker is seen, with the console's byte count
    /// then in `quiet_from`; re-armed while the console still writes.
    quiet: TimerFd,
    quiet_from: u64,
}

impl Supervisor {
    pub fn new(
        timeout: Option<Duration>,
        vcpu_done: EventFd,
        stop: Arc<StopRequest>,
        console: Arc<ConsoleWatch>,
    ) -> Result<Self, VmmError> {
        let timer = match timeout {
            Some(t) => {
                let mut fd = TimerFd::new().map_err(|source| VmmError::Timer { what: "timerfd", source })?;
                fd.reset(t, None).map_err(|source| VmmError::Timer { what: "arming the timeout", source })?;
                Some(fd)
            }
            None => None,
        };
        let sigint = EventFd::new(libc::EFD_NONBLOCK).map_err(VmmError::EventFd)?;
        SIGINT_FD.store(sigint.as_raw_fd(), Ordering::SeqCst);
        vmm_sys_util::signal::register_signal_handler(libc::SIGINT, on_sigint)
            .map_err(|source| VmmError::SignalHandler { signal: "SIGINT", source })?;
        let quiet = TimerFd::new().map_err(|source| VmmError::Timer { what: "timerfd", source })?;
        Ok(Supervisor {
            timer,
            sigint,
            vcpu_done,
            stop,
            vcpu_thread: None,
            finished: false,
            console,
            quiet,
            quiet_from: 0,
        })
    }

    /// Waits [`PANIC_QUIET`] from the console's present byte count.
    fn arm_quiet(&mut self) {
        self.quiet_from = self.console.bytes.load(Ordering::SeqCst);
        if let Err(e) = self.quiet.reset(PANIC_QUIET, None) {
            tracing::error!("arming the panic quiet timer: {e}");
        }
    }

    fn stop_vcpu(&self, reason: StopReason) {
        self.stop.request(reason);
        if let Some(thread) = self.vcpu_thread {
            // SAFETY: the vCPU thread is alive until it writes `vcpu_done`, which we have not seen.
            unsafe { libc::pthread_kill(thread, kick_signal()) };
        }
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        SIGINT_FD.store(-1, Ordering::SeqCst);
    }
}

impl MutEventSubscriber for Supervisor {
    fn process(&mut self, events: Events, _ops: &mut EventOps) {
        let fd = events.fd();
        if self.timer.as_ref().is_some_and(|t| t.as_raw_fd() == fd) {
            if let Some(t) = self.timer.as_mut() {
                let _ = t.wait();
            }
            self.stop_vcpu(StopReason::Timeout);
        } else if fd == self.sigint.as_raw_fd() {
            let _ = self.sigint.read();
            self.stop_vcpu(StopReason::Interrupted);
        } else if fd == self.console.panic_end.as_raw_fd() {
            let _ = self.console.panic_end.read();
            self.arm_quiet();
        } else if fd == self.quiet.as_raw_fd() {
            let _ = self.quiet.wait();
            if self.console.bytes.load(Ordering::SeqCst) == self.quiet_from {
                self.stop_vcpu(StopReason::PanicEnd);
            } else {
                self.arm_quiet();
            }
        } else if fd == self.vcpu_done.as_raw_fd() {
            let _ = self.vcpu_done.read();
            self.finished = true;
        }
    }

    fn init(&mut self, ops: &mut EventOps) {
        let mut add = |fd: &dyn AsRawFd| {
            if let Err(e) = ops.add(Events::new_raw(fd.as_raw_fd(), EventSet::IN)) {
                tracing::error!("event-manager: cannot watch fd {}: {e:?}", fd.as_raw_fd());
            }
        };
        if let Some(t) = &self.timer {
            add(t);
        }
        add(&self.sigint);
        add(&self.console.panic_end);
        add(&self.quiet);
        add(&self.vcpu_done);
    }
}
