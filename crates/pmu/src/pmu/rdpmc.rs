//! RDPMC (SDM Vol. 2B "RDPMC"; 18.2.1): which counter ECX selects and when the instruction
//! faults. The VMM's precise backend emulates the instruction with this.
use super::{CounterId, GpFault, Pmu};

/// ECX\[30\]: select the fixed-function counters.
pub const RDPMC_FIXED: u32 = 1 << 30;
/// ECX\[31\]: fast read, only bits 31:0 are returned (EDX = 0), as KVM implements it.
pub const RDPMC_FAST: u32 = 1 << 31;

impl Pmu {
    /// The value RDPMC returns in EDX:EAX for `ecx`, executed at `cpl` with CR4.PCE = `pce`.
    /// #GP when CPL > 0 and CR4.PCE is clear, or when ECX selects no counter of the profile.
    pub fn rdpmc(&self, ecx: u32, cpl: u8, pce: bool) -> Result<u64, GpFault> {
        if cpl > 0 && !pce {
            return Err(GpFault);
        }
        if self.nb.is_some() {
            // NetBurst (SDM Vol. 2B "RDPMC"): ECX[30:0] selects counter 0-17, ECX[31] a fast read.
            let index = u8::try_from(ecx & !RDPMC_FAST).ok().filter(|&i| i < super::netburst::COUNTERS);
            let value = self.counter(CounterId::NetBurst(index.ok_or(GpFault)?)).value;
            return Ok(if ecx & RDPMC_FAST != 0 { value & 0xFFFF_FFFF } else { value });
        }
        let index = ecx & !(RDPMC_FIXED | RDPMC_FAST);
        let index = u8::try_from(index).map_err(|_| GpFault)?;
        let id = if ecx & RDPMC_FIXED != 0 { CounterId::Fixed(index) } else { CounterId::Gp(index) };
        if !self.counter_exists(id) {
            return Err(GpFault);
        }
        let value = self.counter(id).value;
        Ok(if ecx & RDPMC_FAST != 0 { value & 0xFFFF_FFFF } else { value })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pmu::msr::{IA32_FIXED_CTR0, IA32_PMC0};
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
