//! The rate the guest's TSC runs at, and the core crystal clock CPUID leaf 15H gives for it
//! (README, "Guest time").
//!
//! A guest that finds a crystal frequency in CPUID.15H:ECX takes its TSC to run at ECX x EBX / EAX
//! Hz (SDM Vol. 2A, CPUID leaf 15H) and measures time with it. KVM runs the guest's TSC at the
//! host's rate unless it can scale it, which not every host can. emon keeps the profile's
//! EBX / EAX (the reference clock's ratio, which the model counts with) and gives the crystal that
//! makes the product the rate the guest's TSC really has.
use super::error::kvm_err;
use super::VmmError;
use crate::profile::Clock;
use kvm_ioctls::{Kvm, VcpuFd};

/// The rate of a vCPU's TSC, in kHz, as KVM runs it (KVM_GET_TSC_KHZ).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TscRate {
    pub khz: u32,
}

impl TscRate {
    /// The rate of `vcpu`'s TSC.
    pub fn of_vcpu(vcpu: &VcpuFd) -> Result<TscRate, VmmError> {
        Ok(TscRate { khz: vcpu.get_tsc_khz().map_err(kvm_err("KVM_GET_TSC_KHZ"))? })
    }

    /// The rate a new vCPU's TSC runs at on this host (a throwaway VM's).
    pub fn of_host(kvm: &Kvm) -> Result<TscRate, VmmError> {
        let vm = kvm.create_vm().map_err(kvm_err("KVM_CREATE_VM"))?;
        TscRate::of_vcpu(&vm.create_vcpu(0).map_err(kvm_err("KVM_CREATE_VCPU"))?)
    }

    /// CPUID.15H:ECX under `clock`: the crystal, in Hz, whose ECX x EBX / EAX is this rate, where
    /// the profile enumerates a crystal frequency and its TSC frequency is not this rate to the kHz
    /// (KVM's precision); the profile's otherwise (0 where it enumerates none: the guest then
    /// measures its TSC itself).
    pub fn crystal_hz(&self, clock: &Clock) -> u32 {
        if self.differs_from(clock).is_none() {
            return clock.crystal_hz;
        }
        let hz = u128::from(self.khz) * 1000 * u128::from(clock.tsc_per_ref_denominator);
        let crystal = (hz + u128::from(clock.tsc_per_ref_numerator) / 2) / u128::from(clock.tsc_per_ref_numerator);
        u32::try_from(crystal).unwrap_or(u32::MAX)
    }

    /// The profile's TSC frequency in Hz (crystal x EBX / EAX) where it enumerates one and that
    /// is not this rate to the kHz.
    fn differs_from(&self, clock: &Clock) -> Option<u64> {
        let [eax, ebx, ecx, _] = clock.leaf_15h()?;
        if ecx == 0 || eax == 0 {
            return None;
        }
        let hz = u64::from(ecx) * u64::from(ebx) / u64::from(eax);
        (hz.abs_diff(u64::from(self.khz) * 1000) >= 1000).then_some(hz)
    }

    /// What the run summary says where leaf 15H's crystal is not the profile's.
    pub fn note(&self, clock: &Clock) -> Option<String> {
        let profiled = self.differs_from(clock)?;
        Some(format!(
            "guest time: this host runs the guest's TSC at {} kHz, not the profile's {} kHz, so CPUID.15H:ECX gives a {} Hz crystal instead of {} Hz (README, \"Guest time\")",
            self.khz,
            profiled / 1000,
            self.crystal_hz(clock),
            clock.crystal_hz
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::Profile;

    fn clock(name: &str) -> Clock {
        Profile::load(name).expect("built-in").clock
    }

    #[test]
    fn the_crystal_makes_leaf_15h_give_the_rate_the_tsc_runs_at() {
        // Ice Lake: 38.4 MHz x 78 / 2 = 1497.6 MHz. This build machine runs the TSC at 2445.424 MHz.
        let icelake = clock("icelake");
        let host = TscRate { khz: 2_445_424 };
        let crystal = host.crystal_hz(&icelake);
        assert_eq!(crystal, 62_703_179);
        let tsc_hz = u64::from(crystal) * 78 / 2;
        assert!(tsc_hz.abs_diff(2_445_424_000) < 39, "{tsc_hz}");
        let note = host.note(&icelake).expect("a note");
        assert!(note.contains("2445424 kHz, not the profile's 1497600 kHz"), "{note}");
        assert!(note.contains("a 62703179 Hz crystal instead of 38400000 Hz"), "{note}");
    }

    #[test]
    fn a_tsc_at_the_profiles_rate_keeps_the_profiles_crystal() {
        let icelake = clock("icelake");
        let rate = TscRate { khz: 1_497_600 };
        assert_eq!(rate.crystal_hz(&icelake), 38_400_000);
        assert_eq!(rate.note(&icelake), None);
        // One kHz off is another rate: 1497.601 MHz x 2 / 78.
        assert_eq!(TscRate { khz: 1_497_601 }.crystal_hz(&icelake), 38_400_026);
    }

    #[test]
    fn profiles_that_enumerate_no_crystal_keep_none() {
        // skylake and no-pmu have leaf 15H with ECX = 0; the others have no leaf 15H.
        for name in Profile::builtin_names() {
            let c = clock(name);
            if c.crystal_hz == 0 {
                let rate = TscRate { khz: 2_445_424 };
                assert_eq!(rate.crystal_hz(&c), 0, "{name}");
                assert_eq!(rate.note(&c), None, "{name}");
            }
        }
    }
}
