//! The rate the guest's TSC runs at, and what CPUID leaves 15H and 16H say of it (README, "Guest
//! time").
//!
//! A guest that finds a crystal frequency in CPUID.15H:ECX takes its TSC to run at ECX x EBX / EAX
//! Hz (SDM Vol. 2A, CPUID leaf 15H) and measures time with it; one that finds no crystal there
//! takes leaf 16H's processor base frequency for it (Linux derives the crystal from it). KVM runs
//! the guest's TSC at the host's rate unless it can scale it, which not every host can. emon keeps
//! the profile's EBX / EAX (the reference clock's ratio, which the model counts with) and gives
//! the crystal, and the base frequency, that make the leaves say the rate the guest's TSC really
//! has.
use super::error::kvm_err;
use super::VmmError;
use crate::profile::Clock;
use kvm_ioctls::{Kvm, VcpuFd};

/// The rate of a vCPU's TSC, in kHz, as KVM runs it (KVM_GET_TSC_KHZ).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TscRate {
    pub khz: u32,
}

/// The TSC frequency a profile's CPUID gives, where that is not the rate the TSC runs at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Profiled {
    /// Leaf 15H's crystal x EBX / EAX, in Hz.
    Crystal(u64),
    /// Leaf 16H's base frequency, in MHz (leaf 15H names no crystal).
    Base(u16),
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
    /// takes leaf 16H's base frequency, or measures its TSC itself).
    pub fn crystal_hz(&self, clock: &Clock) -> u32 {
        if !matches!(self.differs_from(clock), Some(Profiled::Crystal(_))) {
            return clock.crystal_hz;
        }
        let hz = u128::from(self.khz) * 1000 * u128::from(clock.tsc_per_ref_denominator);
        let crystal = (hz + u128::from(clock.tsc_per_ref_numerator) / 2) / u128::from(clock.tsc_per_ref_numerator);
        u32::try_from(crystal).unwrap_or(u32::MAX)
    }

    /// CPUID leaf 16H under `clock`, where the profile has it: the profile's, except that the
    /// processor base frequency is this rate to the MHz wherever the profile's TSC frequency is
    /// not this rate (so that the two leaves agree), and the maximum frequency no lower than it.
    pub fn leaf_16h(&self, clock: &Clock) -> Option<[u32; 4]> {
        let mut f = clock.frequency_mhz?;
        if self.differs_from(clock).is_some() {
            f.base = self.mhz();
            f.max = f.max.max(f.base);
        }
        Some(f.leaf_16h())
    }

    /// This rate to the MHz, as leaf 16H gives frequencies.
    fn mhz(&self) -> u16 {
        u16::try_from((self.khz + 500) / 1000).unwrap_or(u16::MAX).max(1)
    }

    /// The profile's TSC frequency where it gives one and that is not this rate: leaf 15H's where
    /// it names a crystal (to the kHz), leaf 16H's base frequency otherwise (to the MHz, all that
    /// leaf can say).
    fn differs_from(&self, clock: &Clock) -> Option<Profiled> {
        match clock.leaf_15h() {
            Some([eax, ebx, ecx, _]) if ecx != 0 && eax != 0 => {
                let hz = u64::from(ecx) * u64::from(ebx) / u64::from(eax);
                (hz.abs_diff(u64::from(self.khz) * 1000) >= 1000).then_some(Profiled::Crystal(hz))
            }
            _ => clock.frequency_mhz.map(|f| f.base).filter(|&base| base != self.mhz()).map(Profiled::Base),
        }
    }

    /// What the run summary says where leaf 15H's crystal or leaf 16H's base frequency is not the
    /// profile's.
    pub fn note(&self, clock: &Clock) -> Option<String> {
        let mut leaves = Vec::new();
        let profiled_khz = match self.differs_from(clock)? {
            Profiled::Crystal(hz) => {
                let crystal = self.crystal_hz(clock);
                leaves.push(format!("CPUID.15H:ECX gives a {crystal} Hz crystal instead of {} Hz", clock.crystal_hz));
                hz / 1000
            }
            Profiled::Base(mhz) => u64::from(mhz) * 1000,
        };
        if let Some(f) = clock.frequency_mhz {
            leaves.push(format!("CPUID.16H gives a base frequency of {} MHz instead of {} MHz", self.mhz(), f.base));
        }
        Some(format!(
            "guest time: this host runs the guest's TSC at {} kHz, not the profile's {} kHz, so {} (README, \"Guest time\")",
            self.khz,
            profiled_khz,
            leaves.join(" and ")
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
                assert_eq!(TscRate { khz: 2_445_424 }.crystal_hz(&c), 0, "{name}");
            }
        }
    }

    /// Leaf 16H's base frequency, which software without a crystal in leaf 15H takes for the
    /// TSC's rate, is the rate the TSC runs at to the MHz, unless the TSC runs at the profile's.
    #[test]
    fn the_base_frequency_of_leaf_16h_is_the_rate_the_tsc_runs_at() {
        let host = TscRate { khz: 2_445_424 };
        // Skylake: no crystal, base 4000 MHz: the base and the note follow the TSC.
        let skylake = clock("skylake");
        assert_eq!(host.leaf_16h(&skylake), Some([2445, 4200, 100, 0]));
        let note = host.note(&skylake).expect("a note");
        assert!(note.contains("2445424 kHz, not the profile's 4000000 kHz"), "{note}");
        assert!(note.contains("so CPUID.16H gives a base frequency of 2445 MHz instead of 4000 MHz"), "{note}");
        assert!(!note.contains("15H"), "{note}");
        // At the profile's base to the MHz (all the leaf can say), the profile's leaf and no note.
        for khz in [3_999_500, 4_000_000, 4_000_499] {
            assert_eq!(TscRate { khz }.leaf_16h(&skylake), Some([4000, 4200, 100, 0]), "{khz}");
            assert_eq!(TscRate { khz }.note(&skylake), None, "{khz}");
        }
        // Above the maximum frequency, the maximum is raised to the base.
        assert_eq!(TscRate { khz: 4_600_000 }.leaf_16h(&skylake), Some([4600, 4600, 100, 0]));
        // Ice Lake names its crystal: both leaves follow where its TSC frequency (1497.6 MHz, not
        // the 1500 MHz base) is not the rate; both are the profile's where it is.
        let icelake = clock("icelake");
        assert_eq!(host.leaf_16h(&icelake), Some([2445, 3900, 100, 0]));
        let note = host.note(&icelake).expect("a note");
        assert!(note.contains("CPUID.15H:ECX gives a 62703179 Hz crystal instead of 38400000 Hz and CPUID.16H gives a base frequency of 2445 MHz instead of 1500 MHz"), "{note}");
        assert_eq!(TscRate { khz: 1_497_600 }.leaf_16h(&icelake), Some([1500, 3900, 100, 0]));
        // Profiles without leaf 16H or a crystal give the guest nothing to change, and no note.
        for name in ["core2", "nehalem", "nehalem-llc-masked", "sandybridge", "pentium4"] {
            assert_eq!(host.leaf_16h(&clock(name)), None, "{name}");
            assert_eq!(host.note(&clock(name)), None, "{name}");
        }
    }
}
