//! One host perf event (perf_event_open(2)) counting for the calling thread: opened disabled,
//! read with its enabled/running times, armed to overflow after a period and then signal the
//! opening thread, and closed when dropped.
use perf_event_open_sys::bindings::{
    perf_event_attr, PERF_FLAG_FD_CLOEXEC, PERF_FORMAT_TOTAL_TIME_ENABLED, PERF_FORMAT_TOTAL_TIME_RUNNING,
};
use perf_event_open_sys::ioctls;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

// fcntl(2) on x86-64 Linux.
const F_SETSIG: libc::c_int = 10;
const F_SETOWN_EX: libc::c_int = 15;
const F_OWNER_TID: libc::c_int = 0;

#[repr(C)]
struct FOwnerEx {
    kind: libc::c_int,
    pid: libc::pid_t,
}

/// A period no guest counter reaches: the event does not overflow until `arm` sets one.
const NEVER: u64 = 1 << 62;

/// What to open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spec {
    pub type_: u32,
    pub config: u64,
    pub exclude_user: bool,
    pub exclude_kernel: bool,
    /// Count only while the thread runs the guest (exclude_host).
    pub exclude_host: bool,
}

/// A count with the times the kernel multiplexing reports (perf_event_open(2) "read_format").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Reading {
    pub value: u64,
    pub time_enabled: u64,
    pub time_running: u64,
}

impl Reading {
    /// The count scaled to the whole enabled time when the kernel multiplexed the event.
    pub fn scaled(&self) -> u64 {
        if self.time_running == 0 || self.time_running >= self.time_enabled {
            self.value
        } else {
            (self.value as u128 * self.time_enabled as u128 / self.time_running as u128) as u64
        }
    }

    pub fn multiplexed(&self) -> bool {
        self.time_running < self.time_enabled
    }
}

/// An open perf event.
#[derive(Debug)]
pub struct PerfFd {
    fd: OwnedFd,
}

impl PerfFd {
    /// Opens `spec` for the calling thread, disabled (see [`PerfFd::arm`] and [`PerfFd::enable`]).
    pub fn open(spec: &Spec) -> io::Result<PerfFd> {
        let mut attr = perf_event_attr {
            type_: spec.type_,
            size: std::mem::size_of::<perf_event_attr>() as u32,
            config: spec.config,
            read_format: (PERF_FORMAT_TOTAL_TIME_ENABLED | PERF_FORMAT_TOTAL_TIME_RUNNING) as u64,
            // A sampling event (the period is set by `arm`), so that it can overflow and signal.
            __bindgen_anon_1: perf_event_open_sys::bindings::perf_event_attr__bindgen_ty_1 { sample_period: NEVER },
            ..Default::default()
        };
        attr.set_disabled(1);
        attr.set_exclude_user(u64::from(spec.exclude_user));
        attr.set_exclude_kernel(u64::from(spec.exclude_kernel));
        attr.set_exclude_host(u64::from(spec.exclude_host));
        attr.set_exclude_hv(1);
        // SAFETY: `attr` is fully initialized; pid 0 / cpu -1 means the calling thread, no group.
        let fd = unsafe { perf_event_open_sys::perf_event_open(&mut attr, 0, -1, -1, PERF_FLAG_FD_CLOEXEC as _) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: perf_event_open returned a new descriptor that nothing else owns.
        Ok(PerfFd { fd: unsafe { OwnedFd::from_raw_fd(fd) } })
    }

    pub fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Delivers `signal` to thread `tid` when this event overflows (F_SETSIG + F_SETOWN_EX with
    /// F_OWNER_TID + O_ASYNC).
    pub fn signal_on_overflow(&self, signal: libc::c_int, tid: libc::pid_t) -> io::Result<()> {
        let fd = self.raw();
        let owner = FOwnerEx { kind: F_OWNER_TID, pid: tid };
        // SAFETY: fcntl on a descriptor we own, with valid arguments.
        unsafe {
            if libc::fcntl(fd, F_SETOWN_EX, &owner as *const FOwnerEx) < 0
                || libc::fcntl(fd, F_SETSIG, signal) < 0
                || libc::fcntl(fd, libc::F_SETFL, libc::fcntl(fd, libc::F_GETFL) | libc::O_ASYNC) < 0
            {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    }

    /// Counts until `period` more events have happened, then overflows once (signalling, if set
    /// up) and disables itself (PERF_EVENT_IOC_PERIOD + PERF_EVENT_IOC_REFRESH 1).
    pub fn arm(&self, period: u64) -> io::Result<()> {
        let period = period.max(1);
        // SAFETY: the PERIOD ioctl takes a pointer to a u64; REFRESH takes an int.
        let r = unsafe {
            let steps = [
                ioctls::DISABLE(self.raw(), 0),
                libc::ioctl(self.raw(), perf_event_open_sys::bindings::PERIOD as _, &period as *const u64),
                ioctls::REFRESH(self.raw(), 1),
            ];
            steps.into_iter().find(|&r| r < 0).unwrap_or(0)
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    pub fn enable(&self) -> io::Result<()> {
        // SAFETY: ENABLE on a descriptor we own.
        if unsafe { ioctls::ENABLE(self.raw(), 0) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    pub fn read(&self) -> io::Result<Reading> {
        let mut buf = [0u64; 3];
        // SAFETY: reading 24 bytes into a 24-byte buffer.
        let n = unsafe { libc::read(self.raw(), buf.as_mut_ptr() as *mut libc::c_void, 24) };
        if n != 24 {
            return Err(if n < 0 { io::Error::last_os_error() } else { io::Error::other("short perf read") });
        }
        Ok(Reading { value: buf[0], time_enabled: buf[1], time_running: buf[2] })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use perf_event_open_sys::bindings::{PERF_COUNT_SW_TASK_CLOCK, PERF_TYPE_SOFTWARE};

    fn task_clock() -> Spec {
        Spec {
            type_: PERF_TYPE_SOFTWARE,
            config: PERF_COUNT_SW_TASK_CLOCK as u64,
            exclude_user: false,
            exclude_kernel: false,
            exclude_host: false,
        }
    }

    /// Burns CPU until `done` holds (task-clock counts CPU time, not wall time), for at most 5 s.
    fn spin_until(mut done: impl FnMut() -> bool) {
        let t = std::time::Instant::now();
        while !done() && t.elapsed() < std::time::Duration::from_secs(5) {
            std::hint::black_box(0);
        }
    }

    #[test]
    fn task_clock_counts_this_thread() {
        let e = PerfFd::open(&task_clock()).unwrap();
        e.enable().unwrap();
        spin_until(|| e.read().unwrap().value > 10_000_000);
        let r = e.read().unwrap();
        assert!(r.value > 10_000_000, "{r:?}");
        assert!(r.time_enabled >= r.time_running && r.time_running > 0, "{r:?}");
    }

    #[test]
    fn scaling_by_enabled_over_running() {
        let r = Reading { value: 100, time_enabled: 300, time_running: 100 };
        assert_eq!(r.scaled(), 300);
        assert!(r.multiplexed());
        let r = Reading { value: 100, time_enabled: 100, time_running: 100 };
        assert_eq!(r.scaled(), 100);
        assert!(!r.multiplexed());
        assert_eq!(Reading { value: 7, time_enabled: 5, time_running: 0 }.scaled(), 7);
    }

    #[test]
    fn overflow_signals_the_opening_thread_once_per_armed_period() {
        use std::sync::atomic::{AtomicU32, Ordering};
        static HITS: AtomicU32 = AtomicU32::new(0);
        extern "C" fn on_signal(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
            HITS.fetch_add(1, Ordering::SeqCst);
        }
        let sig = vmm_sys_util::signal::SIGRTMIN() + 5;
        vmm_sys_util::signal::register_signal_handler(sig, on_signal).unwrap();
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        for round in 1..=2 {
            let e = PerfFd::open(&task_clock()).unwrap();
            e.signal_on_overflow(sig, tid).unwrap();
            e.arm(5_000_000).unwrap(); // 5 ms of this thread's CPU time; REFRESH enables it
            spin_until(|| HITS.load(Ordering::SeqCst) == round);
            assert_eq!(HITS.load(Ordering::SeqCst), round, "one overflow per armed period");
            let before = e.read().unwrap().value;
            let other = PerfFd::open(&task_clock()).unwrap();
            other.enable().unwrap();
            spin_until(|| other.read().unwrap().value > 10_000_000);
            assert_eq!(e.read().unwrap().value, before, "the event disabled itself after its overflow");
            assert_eq!(HITS.load(Ordering::SeqCst), round, "and did not signal again");
        }
    }
}
