//! Counting backends: what makes the virtual PMU's counters advance. The VMM drives a backend
//! from the PMU model: before each KVM_RUN (so it can arm itself when counters go live), on
//! single-step exits, when the guest writes a counter, and before the guest reads one.
//!
//! - [`precise`]: counts exactly by single-stepping the guest (any host, deterministic).
//! - perf: host perf events (a later issue).
pub mod perf;
pub mod precise;
pub mod probe;
pub mod stepper;

use crate::pmu::{CounterId, Pmu};
use kvm_ioctls::VcpuFd;
use thiserror::Error;
use vm_memory::GuestMemoryMmap;

/// What a backend works with at each call: the vCPU, the PMU model and guest memory.
pub struct Cx<'a> {
    pub fd: &'a mut VcpuFd,
    pub pmu: &'a mut Pmu,
    pub mem: &'a GuestMemoryMmap,
}

/// What the VMM does after `before_run`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Enter the guest.
    Run,
    /// The backend completed the instruction at RIP itself (it emulated it): the vCPU is at the
    /// next instruction boundary; call `before_run` again (after delivering any PMI).
    Retired,
    /// A PMI became pending while the backend brought the model up to date (nothing retired):
    /// deliver it, then call `before_run` again.
    Again,
}

#[derive(Debug, Error)]
pub enum BackendError {
    #[error("{op} failed: {source}")]
    Kvm { op: &'static str, source: kvm_ioctls::Error },
    #[error("{op} failed: {source}")]
    Perf { op: &'static str, source: std::io::Error },
}

pub(crate) fn kvm_err(op: &'static str) -> impl Fn(kvm_ioctls::Error) -> BackendError {
    move |source| BackendError::Kvm { op, source }
}

/// A counting backend.
pub trait Backend: Send {
    fn name(&self) -> &'static str;
    /// Before each KVM_RUN. `at_boundary`: the vCPU is between two instructions (the previous
    /// exit completed one), as opposed to in the middle of one (an MSR or I/O exit).
    fn before_run(&mut self, cx: &mut Cx, at_boundary: bool) -> Result<Next, BackendError>;
    /// A single-step exit: the vCPU retired one instruction and is at `pc`.
    fn on_debug_exit(&mut self, cx: &mut Cx, pc: u64) -> Result<(), BackendError>;
    /// The guest wrote counter `id` with WRMSR (the write does not count itself).
    fn counter_written(&mut self, _id: CounterId) {}
    /// Brings the model's counter values up to date before the guest reads one.
    fn sync(&mut self, _pmu: &mut Pmu) {}
    /// The backend's account of the run (`--verbose`).
    fn summary(&self) -> String;
    /// Short notes for the one-line run summary: what the user must know about the counts.
    fn notes(&self) -> Vec<String> {
        Vec::new()
    }
}

/// `--backend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendKind {
    /// perf when the host can count the guest's events in hardware, precise otherwise.
    Auto,
    /// Exact counts by single-stepping the guest.
    Precise,
    /// Host perf events.
    Perf,
}

/// The backend for `kind` under `profile`, and why it was chosen.
pub fn select(
    kind: BackendKind,
    profile: &crate::profile::Profile,
    allow_raw: bool,
) -> Result<(Box<dyn Backend>, String), String> {
    let perf = || -> Box<dyn Backend> {
        let caps = perf::host_caps(allow_raw);
        Box::new(perf::counting::Perf::new(caps, &profile.vendor, profile.pmu.nominal_mhz))
    };
    match kind {
        BackendKind::Precise => Ok((Box::new(precise::Precise::new()), "requested with --backend precise".into())),
        BackendKind::Perf => {
            let caps = perf::host_caps(allow_raw);
            let why = if caps.hardware.is_empty() {
                format!(
                    "requested with --backend perf; this host has no hardware events for guests, so cycles come from the vCPU thread's task-clock x {} MHz and other events count zero",
                    profile.pmu.nominal_mhz
                )
            } else {
                "requested with --backend perf".into()
            };
            Ok((perf(), why))
        }
        BackendKind::Auto => {
            let caps = perf::host_caps(allow_raw);
            match probe::auto_choice(&caps) {
                (BackendKind::Perf, why) => {
                    Ok((Box::new(perf::counting::Perf::new(caps, &profile.vendor, profile.pmu.nominal_mhz)), why))
                }
                (_, why) => Ok((Box::new(precise::Precise::new()), why)),
            }
        }
    }
}
