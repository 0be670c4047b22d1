//! Building a VM ready to run: KVM, the VM with its in-kernel irqchip and PIT, MSR exits and the
//! PMU MSR filter, guest RAM, the vCPU with its CPUID table and local APIC, the kernel loaded and
//! its entry state, the port-I/O bus (COM1, debug-exit, fw_cfg) and the `--trace` file. `build`
//! does every step that can fail before the guest runs; `super::run` then only runs it.
use super::cpuid_probe;
use super::devices::{fw_cfg::FwCfg, serial, PioBus};
use super::error::kvm_err;
use super::loader::{self, Format};
use super::rdpmc::GpCatch;
use super::tsc_rate::TscRate;
use super::vcpu::{ExitStats, Vcpu};
use super::{boot, cpuid, host, kick, layout, msr, trace, DebugStoreMode, SerialOut, VmConfig, VmmError};
use crate::backend::guest_debug::GuestDebug;
use crate::backend::kvm::KvmCpu;
use crate::backend::vpmu::VirtualPmu;
use crate::pmu::Pmu;
use kvm_bindings::{kvm_pit_config, kvm_userspace_memory_region};
use kvm_ioctls::{Kvm, VcpuFd, VmFd};
use std::path::Path;
use std::sync::Arc;
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};
use vmm_sys_util::eventfd::EventFd;

/// KVM_SET_TSS_ADDR: three pages of guest-physical space that are not RAM (above the largest
/// `--memory`, below 4 GiB) for KVM's own use.
const TSS_ADDRESS: usize = 0xFFFB_D000;

/// A VM ready to run: its one vCPU, with everything the exit loop needs.
pub struct BuiltVm {
    pub vcpu: Vcpu,
    /// How the kernel was booted.
    pub format: Format,
    /// The VM and KVM itself, kept open for as long as the VM runs.
    pub vm: VmFd,
    pub kvm: Kvm,
    /// Where the guest's CPUID differs from the table emon set (README, "CPUID fidelity").
    pub cpuid_overrides: Vec<cpuid_probe::Override>,
    /// Where CPUID.15H's crystal is not the profile's, why (README, "Guest time").
    pub tsc_note: Option<String>,
    /// The instruction sets the guest is not told of, if any.
    pub isa_note: Option<String>,
}

/// Builds the VM `config` describes, up to the guest's first instruction.
pub fn build(config: VmConfig) -> Result<BuiltVm, VmmError> {
    let ram = guest_ram(config.memory_mib)?;
    let kvm = host::open()?;
    let vm = create_vm(&kvm)?;
    let mem = create_memory(&vm, ram)?;
    let NewVcpu { fd, cpuid, cpuid_overrides, ds: DebugStore { pebs, bts }, tsc_note, isa_note } =
        create_vcpu(&kvm, &vm, &config)?;
    let format = load_kernel(&fd, &mem, ram, &config)?;
    boot::mptable::install(&mem, &cpuid)?;
    let bus = create_bus(&vm, ram, &config)?;
    let tracer = config.trace.as_deref().map(create_tracer).transpose()?;
    let mut pmu = Pmu::new(&config.profile.pmu).with_prefetchers(config.profile.cache.prefetchers);
    pmu.set_pebs(pebs);
    pmu.set_bts(bts);
    let catch = GpCatch::new(&kvm, &pmu);
    let xsave = crate::backend::kvm::xsave::XsaveAbi::probe(&vm);
    let debug = GuestDebug::new(super::rdpmc::block_irq(&kvm));
    let mut cpu = KvmCpu::new(&kvm, fd, debug, xsave);
    cpu.step_survives_set_regs = super::exec_probe::step_survives_set_regs()?;
    cpu.cpuid = cpuid;
    // The in-kernel PIC's state, for the interrupts due in user mode (a duplicate of the VM's fd).
    cpu.vm = {
        use std::os::fd::{AsRawFd, BorrowedFd};
        // SAFETY: `vm` is an open file descriptor for the whole of this call.
        let fd = unsafe { BorrowedFd::borrow_raw(vm.as_raw_fd()) };
        Some(fd.try_clone_to_owned().map_err(VmmError::DupVmFd)?)
    };
    let vcpu = Vcpu {
        cpu,
        mem,
        bus,
        pmu: VirtualPmu::observed(pmu, config.backend, tracer),
        msrs: msr::MsrDispatch { ignore_unknown: config.ignore_msrs, stats: Default::default() },
        stats: ExitStats::default(),
        stop: Arc::new(kick::StopRequest::default()),
        completer: Default::default(),
        catch,
    };
    Ok(BuiltVm { vcpu, format, vm, kvm, cpuid_overrides, tsc_note, isa_note })
}

/// CPUID.01H:EDX.DS, the debug store.
const LEAF1_EDX_DS: u32 = 1 << 21;

/// `--memory` in bytes, within what emon's memory layout allows.
fn guest_ram(mib: u64) -> Result<u64, VmmError> {
    let ram = mib.checked_mul(1 << 20).ok_or(VmmError::MemorySize(mib))?;
    if !(layout::MIN_RAM..=layout::MAX_RAM).contains(&ram) {
        return Err(VmmError::MemorySize(mib));
    }
    Ok(ram)
}

/// The VM with the in-kernel local APIC, I/O APIC, PIC and PIT, and every PMU MSR access
/// exiting to userspace (README, "How a guest's PMU access reaches the model").
fn create_vm(kvm: &Kvm) -> Result<VmFd, VmmError> {
    let vm = kvm.create_vm().map_err(kvm_err("KVM_CREATE_VM"))?;
    vm.set_tss_address(TSS_ADDRESS).map_err(kvm_err("KVM_SET_TSS_ADDR"))?;
    vm.create_irq_chip().map_err(kvm_err("KVM_CREATE_IRQCHIP"))?;
    // With its speaker port (61h): the gate of counter 2 and its output, OUT2, which Linux times
    // the TSC against where CPUID gives no rate (README, "Guest time").
    let pit = kvm_pit_config { flags: kvm_bindings::KVM_PIT_SPEAKER_DUMMY, ..Default::default() };
    vm.create_pit2(pit).map_err(kvm_err("KVM_CREATE_PIT2"))?;
    pit_without_reinjection(&vm)?;
    crate::backend::kvm::trap_pmu_msrs(&vm)?;
    Ok(vm)
}

vmm_sys_util::ioctl_io_nr!(KVM_REINJECT_CONTROL, kvm_bindings::KVMIO, 0x71);

/// The PIT raises IRQ 0 as an 8254 does: a tick that comes while the last is still unacknowledged
/// is lost, as in the PIC's or the I/O APIC's IRR. KVM's default instead counts the ticks the guest
/// missed and delivers them later, back to back, as soon as each is acknowledged: slow kernel code
/// here then sees jiffies race ahead of real time, and Linux calibrates its local APIC timer
/// against them wrongly ("APIC timer disabled due to verification failure").
fn pit_without_reinjection(vm: &VmFd) -> Result<(), VmmError> {
    let control = kvm_bindings::kvm_reinject_control { pit_reinject: 0, ..Default::default() };
    // SAFETY: KVM_REINJECT_CONTROL reads the kvm_reinject_control it is given, which outlives the
    // call.
    if unsafe { vmm_sys_util::ioctl::ioctl_with_ref(vm, KVM_REINJECT_CONTROL(), &control) } != 0 {
        return Err(VmmError::Kvm { op: "KVM_REINJECT_CONTROL", source: vmm_sys_util::errno::Error::last() });
    }
    Ok(())
}

/// `ram` bytes of guest RAM from address 0, registered with the VM.
pub(super) fn create_memory(vm: &VmFd, ram: u64) -> Result<GuestMemoryMmap, VmmError> {
    let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), ram as usize)])
        .map_err(|source| VmmError::MemoryAlloc { mib: ram >> 20, source })?;
    for (slot, region) in mem.iter().enumerate() {
        let host = mem.get_host_address(region.start_addr()).map_err(VmmError::MemoryHostAddress)?;
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

/// What of the Debug Store a run presents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct DebugStore {
    pebs: bool,
    bts: bool,
}

/// vCPU 0 with the profile's CPUID table and its local APIC wired as firmware leaves it.
struct NewVcpu {
    fd: VcpuFd,
    /// The CPUID table set.
    cpuid: Vec<kvm_bindings::kvm_cpuid_entry2>,
    /// What a probe VM with the same table reads differently.
    cpuid_overrides: Vec<cpuid_probe::Override>,
    /// What of the Debug Store is presented: PEBS where the backend writes the profile's PEBS
    /// format, BTS where it records branches, as `--debug-store` allows (`auto`: only if the
    /// guest sees the DS bit the table sets; README, "PEBS", "BTS").
    ds: DebugStore,
    /// Where leaf 15H gives the rate the vCPU's TSC runs at rather than the profile's.
    tsc_note: Option<String>,
    /// The instruction sets the guest is not told of, if any (see `runs_user_in_engine`).
    isa_note: Option<String>,
}

fn create_vcpu(kvm: &Kvm, vm: &VmFd, config: &VmConfig) -> Result<NewVcpu, VmmError> {
    let fd = vm.create_vcpu(0).map_err(kvm_err("KVM_CREATE_VCPU"))?;
    let allowed = config.debug_store != DebugStoreMode::Off;
    let pmu = &config.profile.pmu;
    let mut ds = DebugStore {
        pebs: allowed && pmu.presents_pebs(config.backend.writes_pebs()),
        bts: allowed && pmu.version >= 1 && config.backend.records_branches(),
    };
    let tsc = TscRate::of_vcpu(&fd)?;
    // The table, without what the TCG engine lacks where user mode runs there; and what that hid.
    let table_for = |ds: bool| -> Result<_, VmmError> {
        let mut table = cpuid::guest_cpuid(kvm, &config.profile, ds, tsc)?;
        let hidden = if config.backend.runs_user_in_engine() {
            crate::backend::precise::tcg::hide_lacking(table.as_mut_slice())
        } else {
            Vec::new()
        };
        Ok((table, hidden))
    };
    let (mut table, mut hidden) = table_for(ds.pebs || ds.bts)?;
    let mut overrides = cpuid_probe::probe(kvm, &table)?;
    let ds_hidden = |o: &[cpuid_probe::Override]| {
        o.iter().any(|o| (o.leaf, o.register) == (1, 3) && o.table & !o.guest & LEAF1_EDX_DS != 0)
    };
    if (ds.pebs || ds.bts) && config.debug_store == DebugStoreMode::Auto && ds_hidden(&overrides) {
        tracing::info!(
            "the Debug Store (PEBS, BTS) is not presented: this host hides CPUID.01H:EDX.DS from the guest (--debug-store on presents it anyway)"
        );
        ds = DebugStore::default();
        (table, hidden) = table_for(false)?;
        overrides = cpuid_probe::probe(kvm, &table)?;
    }
    fd.set_cpuid2(&table).map_err(kvm_err("KVM_SET_CPUID2"))?;
    let cpuid = table.as_slice().to_vec();
    setup_lapic(&fd)?;
    if let Some(revision) = config.profile.microcode {
        set_microcode_revision(&fd, revision)?;
    }
    let isa_note = (!hidden.is_empty()).then(|| {
        format!(
            "CPUID: {} not presented: user mode runs in emon's TCG engine on this host, which lacks them (README, \"User mode (CPL3)\")",
            hidden.join(" ")
        )
    });
    Ok(NewVcpu { fd, cpuid, cpuid_overrides: overrides, ds, tsc_note: tsc.note(&config.profile.clock), isa_note })
}

/// IA32_BIOS_SIGN_ID (SDM Vol. 4, Table 2-2): the guest reads the microcode update revision in
/// bits 63:32. KVM keeps it per vCPU and takes it from a host-initiated write only.
const IA32_BIOS_SIGN_ID: u32 = 0x8B;

fn set_microcode_revision(vcpu: &VcpuFd, revision: u32) -> Result<(), VmmError> {
    crate::backend::kvm::set_msr(vcpu, IA32_BIOS_SIGN_ID, u64::from(revision) << 32).map_err(|e| {
        VmmError::Guest(format!(
            "this KVM does not let the VMM set IA32_BIOS_SIGN_ID (the profile's microcode revision): {e}"
        ))
    })
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

/// Loads the kernel and its modules into guest RAM and sets the vCPU at its entry point.
fn load_kernel(fd: &VcpuFd, mem: &GuestMemoryMmap, ram: u64, config: &VmConfig) -> Result<Format, VmmError> {
    let (format, entry) =
        loader::load(mem, ram, &config.kernel, &config.cmdline, &config.modules, config.initrd.as_ref())
            .map_err(|source| VmmError::Kernel { name: config.kernel.name.clone(), source })?;
    boot::enter(fd, mem, ram, &entry)?;
    Ok(format)
}

/// The port-I/O bus: COM1 on its IRQ line (an irqfd), and fw_cfg.
fn create_bus(vm: &VmFd, ram: u64, config: &VmConfig) -> Result<PioBus, VmmError> {
    let out: serial::Output = match &config.serial {
        SerialOut::Stdout => Box::new(std::io::stdout()),
        SerialOut::File(path) => {
            Box::new(std::fs::File::create(path).map_err(|source| VmmError::SerialFile { path: path.clone(), source })?)
        }
    };
    let irq = EventFd::new(libc::EFD_NONBLOCK).map_err(VmmError::EventFd)?;
    vm.register_irqfd(&irq, serial::COM1_IRQ).map_err(kvm_err("KVM_IRQFD"))?;
    let serial = serial::SerialPort::new(serial::IrqTrigger(irq), out).map_err(VmmError::EventFd)?;
    Ok(PioBus::new(serial, FwCfg::new(ram, 1, &config.cmdline)))
}

/// `--trace FILE`.
fn create_tracer(path: &Path) -> Result<trace::Tracer, VmmError> {
    trace::Tracer::create(path).map_err(|source| VmmError::TraceFile { path: path.to_owned(), source })
}
