//! The KVM side of emon: VM and vCPU setup, the boot paths, devices, MSR trapping and the
//! exit loop. `run` boots one kernel under one profile and reports why the run ended.
pub mod boot;
pub mod cpuid;
pub mod devices;
pub mod host;
pub mod kick;
pub mod layout;
pub mod loader;
pub mod msr;
pub mod supervisor;
pub mod trace;
pub mod vcpu;
pub mod xsave;

use crate::pmu::Pmu;
use crate::profile::Profile;
use devices::{fw_cfg::FwCfg, serial, PioBus};
use event_manager::{EventManager, SubscriberOps};
use kvm_bindings::{kvm_pit_config, kvm_userspace_memory_region, KVM_MAX_CPUID_ENTRIES};
use kvm_ioctls::{Kvm, VcpuFd, VmFd};
use loader::{Format, Kernel, KernelError, Module};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use thiserror::Error;
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};
use vmm_sys_util::eventfd::EventFd;

pub use kick::StopReason;
pub use vcpu::{ExitStats, VcpuStop};

/// Why emon could not run a guest. Each message says what to do where there is something to do.
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
    #[error("guest memory: {0}")]
    Memory(String),
    #[error("serial output {path}: {source}")]
    SerialFile { path: PathBuf, source: std::io::Error },
    #[error("{0}")]
    Setup(String),
    #[error("the guest stopped unexpectedly: {0}")]
    Guest(String),
    #[error("counting backend: {0}")]
    Backend(#[from] crate::backend::BackendError),
}

impl From<crate::backend::VcpuError> for VmmError {
    fn from(e: crate::backend::VcpuError) -> VmmError {
        VmmError::Kvm { op: e.op, source: e.source }
    }
}

/// Where the guest's COM1 output goes.
#[derive(Debug, Clone)]
pub enum SerialOut {
    Stdout,
    File(PathBuf),
}

/// Everything one run needs.
pub struct VmConfig {
    pub profile: Profile,
    pub kernel: Kernel,
    /// Arguments for the kernel (multiboot kernels get "<kernel path> <cmdline>", as from QEMU).
    pub cmdline: String,
    pub modules: Vec<Module>,
    pub memory_mib: u64,
    pub timeout: Option<Duration>,
    pub serial: SerialOut,
    /// Unknown non-PMU MSRs read as 0 and ignore writes instead of raising #GP.
    pub ignore_msrs: bool,
    /// What makes the counters count.
    pub backend: Box<dyn crate::backend::Backend>,
    /// `--trace FILE`.
    pub trace: Option<PathBuf>,
}

/// How a run ended, and what happened during it.
pub struct RunReport {
    pub stop: VcpuStop,
    pub format: Format,
    pub elapsed: Duration,
    pub exits: ExitStats,
    pub msr: msr::MsrStats,
    pub unhandled_ports: std::collections::BTreeMap<u16, u64>,
    pub serial_error: Option<String>,
    /// The PMU state at the end of the run.
    pub pmu: Pmu,
    pub pmis: vcpu::PmiStats,
    /// The backend's account of the run.
    pub backend: String,
    pub backend_name: &'static str,
    pub backend_notes: Vec<String>,
    /// Events written to the `--trace` file, and the error writing it, if any.
    pub trace_events: u64,
    pub trace_error: Option<String>,
}

/// Exit statuses for the ways a run can end other than the debug-exit port.
pub const STATUS_SHUTDOWN: i32 = 3;
pub const STATUS_TIMEOUT: i32 = 4;
pub const STATUS_INTERRUPTED: i32 = 130;

impl RunReport {
    /// emon's exit status: the guest's code for the debug-exit port, else 3/4/130.
    pub fn exit_status(&self) -> i32 {
        match &self.stop {
            VcpuStop::DebugExit(code) => *code as i32,
            VcpuStop::Shutdown { .. } => STATUS_SHUTDOWN,
            VcpuStop::Stopped(StopReason::Timeout) => STATUS_TIMEOUT,
            VcpuStop::Stopped(StopReason::Interrupted) => STATUS_INTERRUPTED,
        }
    }

    /// The one-line summary of why the run ended.
    pub fn summary(&self) -> String {
        let why = match &self.stop {
            VcpuStop::DebugExit(code) => {
                format!("guest exited with code {code} through the debug-exit port")
            }
            VcpuStop::Shutdown { why, .. } => format!("guest shut down: {why}"),
            VcpuStop::Stopped(StopReason::Timeout) => "timeout: the guest was stopped".into(),
            VcpuStop::Stopped(StopReason::Interrupted) => "interrupted (Ctrl-C)".into(),
        };
        let mut backend = self.backend_name.to_owned();
        for n in &self.backend_notes {
            backend += &format!("; {n}");
        }
        format!(
            "emon: {why} after {:.2} s, {} exits, {} PMU MSR accesses, {} #GP injected, backend {backend} (status {})",
            self.elapsed.as_secs_f64(),
            self.exits.total,
            self.msr.pmu_reads + self.msr.pmu_writes,
            self.msr.gp_injected,
            self.exit_status()
        )
    }
}

/// The CPUID table the guest gets under `profile`.
pub fn guest_cpuid(kvm: &Kvm, profile: &Profile) -> Result<kvm_bindings::CpuId, VmmError> {
    let supported = kvm
        .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
        .map_err(|source| VmmError::Kvm { op: "KVM_GET_SUPPORTED_CPUID", source })?;
    let mut entries = supported.as_slice().to_vec();
    cpuid::apply_profile(&mut entries, profile);
    kvm_bindings::CpuId::from_entries(&entries).map_err(|e| VmmError::Setup(format!("CPUID table: {e:?}")))
}

fn kvm_err(op: &'static str) -> impl Fn(kvm_ioctls::Error) -> VmmError {
    move |source| VmmError::Kvm { op, source }
}

fn create_memory(vm: &VmFd, ram: u64) -> Result<GuestMemoryMmap, VmmError> {
    let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), ram as usize)])
        .map_err(|e| VmmError::Memory(format!("allocating {} MiB: {e}", ram >> 20)))?;
    for (slot, region) in mem.iter().enumerate() {
        let host = mem.get_host_address(region.start_addr()).map_err(|e| VmmError::Memory(e.to_string()))?;
        let r = kvm_userspace_memory_region {
            slot: slot as u32,
            guest_phys_addr: region.start_addr().0,
            memory_size: region.len(),
            userspace_addr: host as u64,
            flags: 0,
        };
        // SAFETY: the mapping lives as long as `mem`, which outlives the VM's use of it.
        unsafe { vm.set_user_memory_region(r) }.map_err(kvm_err("KVM_SET_USER_MEMORY_REGION"))?;
    }
    Ok(mem)
}

/// Wires LINT0 as ExtINT and LINT1 as NMI, as firmware leaves them for the boot CPU.
fn setup_lapic(vcpu: &VcpuFd) -> Result<(), VmmError> {
    use crate::backend::lapic::{self, DELIVERY_EXTINT, DELIVERY_MODE_SHIFT, DELIVERY_NMI, LVT_LINT0, LVT_LINT1};
    let mut state = vcpu.get_lapic().map_err(kvm_err("KVM_GET_LAPIC"))?;
    let page = lapic::bytes(&mut state.regs);
    for (off, mode) in [(LVT_LINT0, DELIVERY_EXTINT), (LVT_LINT1, DELIVERY_NMI)] {
        let v = (lapic::reg(page, off) & !(0b111 << DELIVERY_MODE_SHIFT)) | mode << DELIVERY_MODE_SHIFT;
        lapic::set_reg(page, off, v);
    }
    vcpu.set_lapic(&state).map_err(kvm_err("KVM_SET_LAPIC"))
}

/// Boots `config.kernel` and runs it to the end.
pub fn run(config: VmConfig) -> Result<RunReport, VmmError> {
    let ram = config.memory_mib.checked_mul(1 << 20).ok_or(VmmError::MemorySize(config.memory_mib))?;
    if !(layout::MIN_RAM..=layout::MAX_RAM).contains(&ram) {
        return Err(VmmError::MemorySize(config.memory_mib));
    }
    let kvm = host::open()?;
    let vm = kvm.create_vm().map_err(kvm_err("KVM_CREATE_VM"))?;
    vm.set_tss_address(0xFFFB_D000).map_err(kvm_err("KVM_SET_TSS_ADDR"))?;
    vm.create_irq_chip().map_err(kvm_err("KVM_CREATE_IRQCHIP"))?;
    vm.create_pit2(kvm_pit_config::default()).map_err(kvm_err("KVM_CREATE_PIT2"))?;
    msr::install_filter(&vm)?;
    let mem = create_memory(&vm, ram)?;

    let vcpu_fd = vm.create_vcpu(0).map_err(kvm_err("KVM_CREATE_VCPU"))?;
    vcpu_fd.set_cpuid2(&guest_cpuid(&kvm, &config.profile)?).map_err(kvm_err("KVM_SET_CPUID2"))?;
    setup_lapic(&vcpu_fd)?;

    let (format, entry) = loader::load(&mem, ram, &config.kernel, &config.cmdline, &config.modules)
        .map_err(|source| VmmError::Kernel { name: config.kernel.name.clone(), source })?;
    boot::enter(&vcpu_fd, &mem, ram, &entry)?;

    let out: serial::Output = match &config.serial {
        SerialOut::Stdout => Box::new(std::io::stdout()),
        SerialOut::File(path) => {
            Box::new(std::fs::File::create(path).map_err(|source| VmmError::SerialFile { path: path.clone(), source })?)
        }
    };
    let irq = EventFd::new(libc::EFD_NONBLOCK).map_err(|e| VmmError::Setup(format!("eventfd: {e}")))?;
    vm.register_irqfd(&irq, serial::COM1_IRQ).map_err(kvm_err("KVM_IRQFD"))?;
    let bus = PioBus::new(serial::SerialPort::new(serial::IrqTrigger(irq), out), FwCfg::new(ram, 1, &config.cmdline));

    let tracer = match &config.trace {
        Some(path) => {
            Some(trace::Tracer::create(path).map_err(|e| VmmError::Setup(format!("--trace {}: {e}", path.display())))?)
        }
        None => None,
    };
    kick::install_handler()?;
    let stop = Arc::new(kick::StopRequest::default());
    let done = EventFd::new(libc::EFD_NONBLOCK).map_err(|e| VmmError::Setup(format!("eventfd: {e}")))?;
    let done_vcpu = done.try_clone().map_err(|e| VmmError::Setup(format!("eventfd: {e}")))?;
    let mut vcpu = vcpu::Vcpu {
        fd: vcpu_fd,
        mem: mem.clone(),
        bus,
        pmu: Pmu::new(&config.profile.pmu),
        backend: config.backend,
        pmis: Default::default(),
        tracer,
        msrs: msr::MsrDispatch { ignore_unknown: config.ignore_msrs, stats: Default::default() },
        stats: ExitStats::default(),
        stop: stop.clone(),
        xsave: xsave::XsaveAbi::probe(&vm),
    };

    let started = Instant::now();
    let thread = std::thread::Builder::new()
        .name("vcpu0".into())
        .spawn(move || {
            let r = vcpu.run();
            let _ = done_vcpu.write(1);
            r.map(|stop| (stop, vcpu))
        })
        .map_err(|e| VmmError::Setup(format!("spawning the vCPU thread: {e}")))?;
    {
        use std::os::unix::thread::JoinHandleExt;
        let supervisor = Supervisor::new(config.timeout, done, stop, thread.as_pthread_t())?;
        let supervisor = Arc::new(Mutex::new(supervisor));
        let mut events = EventManager::<Arc<Mutex<Supervisor>>>::new()
            .map_err(|e| VmmError::Setup(format!("event manager: {e:?}")))?;
        events.add_subscriber(supervisor.clone());
        while !supervisor.lock().map(|s| s.finished).unwrap_or(true) {
            events.run().map_err(|e| VmmError::Setup(format!("event loop: {e:?}")))?;
        }
    }
    let (stop, vcpu) = thread.join().map_err(|_| VmmError::Setup("the vCPU thread panicked".into()))??;
    let elapsed = started.elapsed();
    drop(mem);
    Ok(RunReport {
        stop,
        format,
        elapsed,
        exits: vcpu.stats,
        msr: vcpu.msrs.stats,
        unhandled_ports: vcpu.bus.unhandled,
        serial_error: vcpu.bus.serial.output_error,
        pmu: vcpu.pmu,
        pmis: vcpu.pmis,
        backend: vcpu.backend.summary(),
        backend_name: vcpu.backend.name(),
        backend_notes: vcpu.backend.notes(),
        trace_events: vcpu.tracer.as_ref().map_or(0, |t| t.events),
        trace_error: vcpu.tracer.as_ref().and_then(|t| t.error.clone()),
    })
}

use supervisor::Supervisor;
