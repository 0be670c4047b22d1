//! The main thread's event loop (rust-vmm event-manager) while the vCPU runs: the --timeout
//! timer, Ctrl-C, and the vCPU thread's "finished" notification.
use super::kick::{kick_signal, StopReason, StopRequest};
use super::VmmError;
use event_manager::{EventManager, EventOps, EventSet, Events, MutEventSubscriber, SubscriberOps};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::timerfd::TimerFd;

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
    pub fn new(timeout: Option<Duration>, vcpu_done: EventFd, stop: Arc<StopRequest>) -> Result<Self, VmmError> {
        let supervisor = Arc::new(Mutex::new(Supervisor::new(timeout, vcpu_done, stop)?));
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
}

impl Supervisor {
    pub fn new(timeout: Option<Duration>, vcpu_done: EventFd, stop: Arc<StopRequest>) -> Result<Self, VmmError> {
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
        Ok(Supervisor { timer, sigint, vcpu_done, stop, vcpu_thread: None, finished: false })
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
        add(&self.vcpu_done);
    }
}
