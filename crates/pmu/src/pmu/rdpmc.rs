//! RDPMC (SDM Vol. 2B "RDPMC"; 18.2.1) on the architectural PMU: which counter ECX selects.
//! The privilege check is [`super::Pmu::rdpmc`]'s. The VMM's precise backend emulates the
//! instruction with this.
use super::arch::ArchPmu;
use super::ops::PmuOps;
use super::{CounterId, GpFault};

/// ECX\[30\]: select the fixed-function counters.
pub const RDPMC_FIXED: u32 = 1 << 30;
/// ECX\[31\]: fast read, only bits 31:0 are returned (EDX = 0), as KVM implements it.
pub const RDPMC_FAST: u32 = 1 << 31;

impl ArchPmu {
    /// The value RDPMC returns in EDX:EAX for `ecx`: #GP when ECX selects no counter of the
    /// profile.
    pub(super) fn read_pmc(&self, ecx: u32) -> Result<u64, GpFault> {
        let index = ecx & !(RDPMC_FIXED | RDPMC_FAST);
        let index = u8::try_from(index).map_err(|_| GpFault)?;
        let id = if ecx & RDPMC_FIXED != 0 { CounterId::Fixed(index) } else { CounterId::Gp(index) };
        if !self.exists(id) {
            return Err(GpFault);
        }
        Ok(fast(ecx, self.state(id).value))
    }
}

/// A fast read (ECX\[31\]) returns bits 31:0 only.
pub(super) fn fast(ecx: u32, value: u64) -> u64 {
    if ecx & RDPMC_FAST != 0 {
        value & 0xFFFF_FFFF
    } else {
        value
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pmu::msr::{IA32_FIXED_CTR0, IA32_PMC0};
    use crate::pmu::Pmu;
    use crate::profile::Profile;

    fn pmu(name: &str) -> Pmu {
        Pmu::new(&Profile::load(name).expect("built-in").pmu)
    }

    #[test]
    fn reads_gp_and_fixed_counters() {
        let mut p = pmu("skylake");
        p.wrmsr(IA32_PMC0 + 1, 0x1234).unwrap();
        p.wrmsr(IA32_FIXED_CTR0 + 2, 0x5_0000_0007).unwrap();
        assert_eq!(p.rdpmc(1, 0, false), Ok(0x1234));
        assert_eq!(p.rdpmc(RDPMC_FIXED | 2, 0, false), Ok(0x5_0000_0007));
        assert_eq!(p.rdpmc(RDPMC_FAST | RDPMC_FIXED | 2, 0, false), Ok(7));
    }

    #[test]
    fn faults_beyond_the_profile_counters() {
        let p = pmu("nehalem");
        assert_eq!(p.rdpmc(4, 0, false), Err(GpFault));
        assert_eq!(p.rdpmc(RDPMC_FIXED | 3, 0, false), Err(GpFault));
        assert_eq!(p.rdpmc(0x100, 0, false), Err(GpFault));
        assert_eq!(pmu("no-pmu").rdpmc(0, 0, false), Err(GpFault));
    }

    #[test]
    fn user_mode_needs_cr4_pce() {
        let p = pmu("nehalem");
        assert_eq!(p.rdpmc(0, 3, false), Err(GpFault));
        assert_eq!(p.rdpmc(0, 3, true), Ok(0));
    }
}
