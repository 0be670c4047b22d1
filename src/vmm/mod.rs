//! The KVM side of emon: VM and vCPU setup, the boot paths, devices, MSR trapping and the
//! exit loop. `run` boots one kernel under one profile and reports why the run ended.
//!
//! - [`builder`]: every set-up step, up to a vCPU ready to run.
//! - `run` (here): the vCPU thread and the supervisor's event loop, then the report.
//! - [`report`]: [`RunReport`], its exit status, one-line summary and JSON form.
//! - [`error`]: why a run could not happen ([`VmmError`]).
pub mod boot;
pub mod builder;
pub mod cpuid;
pub mod cpuid_probe;
pub mod devices;
pub mod error;
pub mod exec_probe;
pub mod host;
pub mod kick;
pub mod layout;
pub mod loader;
pub mod msr;
pub mod rdpmc;
pub mod report;
pub mod supervisor;
pub mod trace;
pub mod tsc_rate;
pub mod vcpu;

use loader::{Kernel, Module};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use vmm_sys_util::eventfd::EventFd;

pub use cpuid::guest_cpuid;
pub use error::VmmError;
pub use kick::StopReason;
pub use report::{JsonReport, RunReport};
pub use vcpu::{ExitStats, VcpuStop};

/// `--debug-store`: when emon presents the Debug Store (CPUID.01H:EDX.DS and ECX.DTES64 set):
/// PEBS (IA32_MISC_ENABLE.PEBS_UNAVAILABLE clear) under a backend that writes the profile's PEBS
/// format, and BTS (MISC_ENABLE.BTS_UNAVAILABLE clear) under one that records branches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum DebugStoreMode {
    /// Where the guest sees CPUID.01H:EDX.DS: a host that hides it hides PEBS and BTS.
    #[default]
    Auto,
    /// Even where the host hides CPUID.01H:EDX.DS from the guest (the run summary then says NOT
    /// AS PROFILED): for guests that look only at MISC_ENABLE and PERF_CAPABILITIES.
    On,
    /// Never.
    Off,
}

/// Where the guest's COM1 output goes.
#[derive(Debug, Clone)]
pub enum SerialOut {
    Stdout,
    File(PathBuf),
}

/// Everything one run needs.
pub struct VmConfig {
    pub profile: crate::profile::Profile,
    pub kernel: Kernel,
    /// Arguments for the kernel (multiboot kernels get "<kernel path> <cmdline>", as from QEMU;
    /// Linux kernels get them as they are).
    pub cmdline: String,
    pub modules: Vec<Module>,
    /// `--initrd`: a Linux kernel's initial ramdisk.
    pub initrd: Option<Module>,
    pub memory_mib: u64,
    pub timeout: Option<Duration>,
    pub serial: SerialOut,
    /// Unknown non-PMU MSRs read as 0 and ignore writes instead of raising #GP.
    pub ignore_msrs: bool,
    /// `--debug-store`: whether PEBS and BTS are presented (README, "PEBS", "BTS").
    pub debug_store: DebugStoreMode,
    /// How fast this host runs CPL0 guest code (emulated or native: what the CPUID table can
    /// offer of XSAVE depends on it, README "CPUID fidelity").
    pub cpl0: exec_probe::Cpl0Speed,
    /// What makes the counters count.
    pub backend: Box<dyn crate::backend::Backend>,
    /// `--trace`.
    pub trace: Option<PathBuf>,
}

/// Boots `config.kernel` and runs it to the end: builds the VM, runs its vCPU on a thread of its
/// own while this thread's event loop watches the timeout, Ctrl-C and the console for the end of a
/// kernel panic, and reports the run.
pub fn run(config: VmConfig) -> Result<RunReport, VmmError> {
    let timeout = config.timeout;
    // `_vm` and `_kvm` stay open until the run is over.
    let builder::BuiltVm { mut vcpu, format, vm: _vm, kvm: _kvm, cpuid_overrides, tsc_note, isa_note } =
        builder::build(config)?;
    kick::install_handler()?;
    let stop = vcpu.stop.clone();
    let console = vcpu.bus.serial.watch();
    let done = EventFd::new(libc::EFD_NONBLOCK).map_err(VmmError::EventFd)?;
    let done_vcpu = done.try_clone().map_err(VmmError::EventFd)?;
    let supervision = supervisor::Supervision::new(timeout, done, stop, console)?;
    let started = Instant::now();
    let thread = std::thread::Builder::new()
        .name("vcpu0".into())
        .spawn(move || {
            let r = vcpu.run();
            let _ = done_vcpu.write(1);
            r.map(|stop| (stop, vcpu))
        })
        .map_err(VmmError::SpawnVcpu)?;
    {
        use std::os::unix::thread::JoinHandleExt;
        supervision.run(thread.as_pthread_t())?;
    }
    let (stop, vcpu) = thread.join().map_err(VmmError::vcpu_panicked)??;
    let mut report = RunReport::collect(stop, format, started.elapsed(), vcpu);
    report.cpuid_overrides = cpuid_overrides;
    report.tsc_note = tsc_note;
    report.isa_note = isa_note;
    Ok(report)
}
