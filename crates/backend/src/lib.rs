//! The virtual PMU a VMM embeds: [`vpmu::VirtualPmu`], one facade over the PMU model, a counting
//! backend and the PMI (the counterpart of KVM's `pmu.c`), which a VMM calls once per kind of
//! exit; and the counting backends behind it.
//!
//! A backend drives the vCPU only through the [`Vcpu`] trait (registers, CPU mode, single-step,
//! halt, exceptions, the local APIC, guest memory), so it has no KVM file descriptor of its own
//! and its logic is unit-tested with a scripted vCPU. The protocol, modelled on KVM's own vPMU
//! (`kvm_pmu_request_counter_reprogram`, then reprogramming the marked counters before the next
//! VM entry), is written once, in [`vpmu`]:
//!
//! 1. Before a guest RDMSR/WRMSR of a PMU register reaches the model, [`Backend::sync`] folds
//!    what the backend counted so far into it; the access goes through [`PmuMsrs`], also where
//!    a backend completes the instruction itself.
//! 2. A write marks only the counters it changed ([`emon_pmu::pmu::Pmu::take_reprogram`]).
//! 3. Before the next entry a pending PMI goes out, then [`Backend::before_run`] reprograms
//!    the marked counters and says whether to enter the guest.
//! 4. A single-step exit goes to [`Backend::on_debug_exit`].
//!
//! - [`vpmu`]: the facade a VMM drives.
//! - [`precise`]: counts exactly by single-stepping the guest (any host, deterministic).
//! - [`perf`]: host perf events, as KVM's vPMU does in the kernel.
//! - [`pmi`]: how a PMI goes out through the local APIC's LVTPC (pure, over [`lapic`]'s page).
//! - [`stepper`]: a bare single-stepper, the floor `emon bench` measures the precise backend against.
//! - `kvm` (feature `kvm`, on by default): [`Vcpu`] over a KVM vCPU, and the MSR filter that
//!   traps the PMU's MSRs. `examples/embed.rs` drives a guest's PMU from a minimal exit loop.
pub mod cpuid;
pub mod guest_debug;
#[cfg(feature = "kvm")]
pub mod kvm;
pub mod lapic;
pub mod perf;
pub mod pmi;
pub mod precise;
pub mod probe;
pub mod rdpmc_catch;
pub mod stepper;
#[cfg(test)]
mod testing;
mod vcpu;
pub mod vpmu;

use emon_pmu::pmu::{GpFault, Pmu, Reprogram};
use emon_pmu::profile::Profile;
use thiserror::Error;
pub use vcpu::{host_tsc, DueEvent, TscWindow, Vcpu, VcpuError};

/// What a backend works with at each call: the vCPU, the PMU model, and the guest's way to the
/// model's MSRs.
pub struct Cx<'a> {
    pub vcpu: &'a mut dyn Vcpu,
    pub pmu: &'a mut Pmu,
    /// For a RDMSR or WRMSR of a PMU MSR the backend completes itself, instead of KVM's exit.
    pub msrs: &'a mut dyn PmuMsrs,
    /// For an IN or OUT the backend completes itself, instead of KVM's exit.
    pub ports: &'a mut dyn Ports,
}

/// The I/O ports the VMM's own devices answer (a UART, the real-time clock), as a VM exit to the
/// VMM reaches them: a backend that completes a guest's IN or OUT itself goes through these.
pub trait Ports {
    /// Whether the VMM answers `port` itself, with no effect beyond its device: not a port that
    /// KVM's in-kernel devices answer, nor one whose access ends or resets the run.
    fn completes(&self, port: u16) -> bool;
    fn read(&mut self, port: u16, data: &mut [u8]);
    fn write(&mut self, port: u16, data: &[u8]);
}

/// No ports: every IN and OUT goes to KVM.
#[derive(Debug, Default)]
pub struct NoPorts;

impl Ports for NoPorts {
    fn completes(&self, _port: u16) -> bool {
        false
    }
    fn read(&mut self, _port: u16, _data: &mut [u8]) {}
    fn write(&mut self, _port: u16, _data: &[u8]) {}
}

/// The guest's RDMSR and WRMSR of the PMU's MSRs ([`Pmu::owns`]), as the facade answers them:
/// the model answers or raises #GP, and the access is counted and observed
/// ([`vpmu::Accounting`]). A VMM's MSR exits reach it through [`vpmu::VirtualPmu::rdmsr`] and
/// `wrmsr`, which first [`Backend::sync`]; a backend that completes the instruction itself calls
/// it through [`Cx::msrs`], with the model already up to date.
pub trait PmuMsrs {
    fn read(&mut self, pmu: &mut Pmu, index: u32) -> Result<u64, GpFault>;
    /// A write that took marks the counters it changed (see [`Pmu::take_reprogram`]).
    fn write(&mut self, pmu: &mut Pmu, index: u32, value: u64) -> Result<(), GpFault>;
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
    #[error(transparent)]
    Vcpu(#[from] VcpuError),
    #[error("{op} failed: {source}")]
    Perf { op: &'static str, source: std::io::Error },
}

/// A counting backend.
pub trait Backend: Send {
    fn name(&self) -> &'static str;
    /// Before each KVM_RUN: reprogram the counters the model marked, then arm for the entry.
    /// `at_boundary`: the vCPU is between two instructions (the previous exit completed one), as
    /// opposed to in the middle of one (an MSR or I/O exit).
    fn before_run(&mut self, cx: &mut Cx, at_boundary: bool) -> Result<Next, BackendError>;
    /// A single-step exit: the vCPU retired one instruction and is at `pc`.
    fn on_debug_exit(&mut self, cx: &mut Cx, pc: u64) -> Result<(), BackendError>;
    /// The VMM queued an interrupt or NMI (a PMI) for the guest: the next entry must be KVM's,
    /// which delivers it, not a stretch of counted code run anywhere else.
    fn event_queued(&mut self) {}
    /// Brings the model's counter values up to date before the guest reads or writes a PMU MSR.
    fn sync(&mut self, _pmu: &mut Pmu) {}
    /// Counters reprogrammed so far, one per counter per change: the cost of the guest's writes.
    fn reprogrammed(&self) -> u64;
    /// The backend's account of the run (`--verbose`).
    fn summary(&self) -> String;
    /// Short notes for the one-line run summary: what the user must know about the counts.
    fn notes(&self) -> Vec<String> {
        Vec::new()
    }
    /// Does this backend record the guest's taken branches in the LBR stack while DEBUGCTL.LBR
    /// is set?
    fn records_branches(&self) -> bool {
        false
    }
    /// Does this backend count the LLC events from emon's cache model, whose prefetchers obey the
    /// guest's MSR_MISC_FEATURE_CONTROL and IA32_MISC_ENABLE (README, "The cache model")?
    fn models_caches(&self) -> bool {
        false
    }
    /// Does this backend write PEBS records into the guest's DS area (formats 0-4)?
    fn writes_pebs(&self) -> bool {
        false
    }
    /// Does this backend run user-mode code in the TCG engine whatever counts (a host that does
    /// not enter the kernel on SYSCALL from CPL3)? The guest is then not told of instruction
    /// sets the engine lacks.
    fn runs_user_in_engine(&self) -> bool {
        false
    }
}

/// The counters `r` marks, in IA32_PERF_GLOBAL_CTRL bit order (GP counters, then fixed).
pub fn marked(pmu: &Pmu, r: Reprogram) -> impl Iterator<Item = emon_pmu::pmu::CounterId> + '_ {
    pmu.counter_ids().into_iter().filter(move |id| r.counters & id.status_mask() != 0)
}

/// `--backend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum BackendKind {
    /// perf when the host can count the guest's events in hardware, precise otherwise.
    Auto,
    /// Exact counts by single-stepping the guest.
    Precise,
    /// Host perf events.
    Perf,
}

/// The backend for `kind` under `profile`, and why it was chosen. The perf backend's overflow
/// signals go to the vCPU thread as `kick_signal`, whose handler must make KVM_RUN return.
pub fn select(
    kind: BackendKind,
    profile: &Profile,
    allow_raw: bool,
    kick_signal: i32,
    precise: precise::Options,
) -> (Box<dyn Backend>, String) {
    let caps = perf::host_caps(allow_raw);
    let perf = |caps| -> Box<dyn Backend> {
        let guest = perf::mapping::GuestCpu {
            vendor: profile.vendor.clone(),
            events: profile.pmu.events,
            mhz: profile.pmu.nominal_mhz,
        };
        Box::new(perf::counting::Perf::new(caps, guest, kick_signal))
    };
    let precise = || -> Box<dyn Backend> {
        Box::new(
            precise::Precise::with_engine(precise.engine)
                .with_cpl0_in_engine(precise.cpl0_in_engine)
                .with_user_in_engine(precise.user_in_engine)
                .with_guest_time(precise.guest_time)
                .with_ref_clock(profile.clock)
                .with_cache(&profile.cache),
        )
    };
    match kind {
        BackendKind::Precise => (precise(), "requested with --backend precise".into()),
        // Host perf has no events for this model's encodings; the VMM refuses --backend perf.
        BackendKind::Auto if profile.pmu.precise_only().is_some() => {
            (precise(), profile.pmu.precise_only().map_or_else(String::new, |o| o.auto.into()))
        }
        BackendKind::Perf => {
            let why = if caps.hardware.is_empty() {
                format!(
                    "requested with --backend perf; this host has no hardware events for guests, so cycles come from the vCPU thread's task-clock x {} MHz and other events count zero",
                    profile.pmu.nominal_mhz
                )
            } else {
                "requested with --backend perf".into()
            };
            (perf(caps), why)
        }
        BackendKind::Auto => match probe::auto_choice(&caps) {
            (BackendKind::Perf, why) => (perf(caps), why),
            (_, why) => (precise(), why),
        },
    }
}
