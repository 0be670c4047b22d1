//! Opening /dev/kvm and checking the capabilities emon needs, with errors that say what to do.
use super::VmmError;
use kvm_ioctls::{Cap, Kvm};

/// (capability, name, why emon needs it)
pub const REQUIRED_CAPS: &[(Cap, &str, &str)] = &[
    (Cap::Irqchip, "KVM_CAP_IRQCHIP", "the in-kernel local APIC delivers the PMU interrupt"),
    (Cap::Pit2, "KVM_CAP_PIT2", "the in-kernel PIT"),
    (Cap::ExtCpuid, "KVM_CAP_EXT_CPUID", "installing the profile's CPUID table"),
    (Cap::X86UserSpaceMsr, "KVM_CAP_X86_USER_SPACE_MSR", "PMU MSR accesses must exit to userspace"),
    (Cap::X86MsrFilter, "KVM_CAP_X86_MSR_FILTER", "trapping the PMU MSRs KVM would otherwise handle (Linux 5.10+)"),
    (Cap::ImmediateExit, "KVM_CAP_IMMEDIATE_EXIT", "stopping the vCPU on a timeout or Ctrl-C"),
];

pub const KVM_PATH: &str = "/dev/kvm";
/// Overrides the KVM device path (for unusual hosts, and to test emon's errors).
pub const KVM_DEVICE_ENV: &str = "EMON_KVM_DEVICE";

pub fn open() -> Result<Kvm, VmmError> {
    let path = std::env::var(KVM_DEVICE_ENV).unwrap_or_else(|_| KVM_PATH.into());
    let cpath = std::ffi::CString::new(path).map_err(|_| VmmError::NoKvm)?;
    let kvm = Kvm::new_with_path(&cpath).map_err(|e| match e.errno() {
        libc::ENOENT => VmmError::NoKvm,
        libc::EACCES | libc::EPERM => VmmError::KvmPermission,
        _ => VmmError::Kvm { op: "open /dev/kvm", source: e },
    })?;
    for (cap, name, why) in REQUIRED_CAPS {
        if !kvm.check_extension(*cap) {
            return Err(VmmError::MissingCap { name, why });
        }
    }
    Ok(kvm)
}
