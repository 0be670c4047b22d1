//! The hardware prefetchers' control register, MSR_MISC_FEATURE_CONTROL (0x1A4), which the
//! virtual PMU keeps because the cache model its LLC events count from obeys it (README, "The
//! cache model"). Core 2's and NetBurst's control bits live in IA32_MISC_ENABLE, which the PMU
//! keeps anyway ([`super::Pmu::wrmsr`] makes the profile's bits writable there).

use super::GpFault;
use crate::profile::{PrefetcherSet, Prefetchers};

/// The profile's prefetchers and MSR_MISC_FEATURE_CONTROL's value.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PrefetchControl {
    prefetchers: Prefetchers,
    /// 0 at power-on: every prefetcher on (the disclosure: what BIOSes leave).
    misc_feature_control: u64,
}

impl PrefetchControl {
    pub fn new(prefetchers: Prefetchers) -> PrefetchControl {
        PrefetchControl { prefetchers, misc_feature_control: 0 }
    }

    /// The profile's prefetchers.
    pub fn prefetchers(&self) -> &Prefetchers {
        &self.prefetchers
    }

    /// Does the CPU have MSR_MISC_FEATURE_CONTROL?
    pub fn exists(&self) -> bool {
        self.prefetchers.misc_feature_control.is_some()
    }

    /// RDMSR of MSR_MISC_FEATURE_CONTROL: #GP where the CPU lacks it (Core 2).
    pub fn read(&self) -> Result<u64, GpFault> {
        self.exists().then_some(self.misc_feature_control).ok_or(GpFault)
    }

    /// WRMSR of MSR_MISC_FEATURE_CONTROL: stores the profile's bits; any other bit, or a CPU
    /// without the MSR, #GPs with nothing changed (the VirtualBox database measured bits 3:0 and
    /// 11 stored, every other bit #GP, on the i7-2635QM and the i7-6700K).
    pub fn write(&mut self, value: u64) -> Result<(), GpFault> {
        let bits = self.prefetchers.misc_feature_control.ok_or(GpFault)?;
        if value & !bits != 0 {
            return Err(GpFault);
        }
        self.misc_feature_control = value;
        Ok(())
    }

    /// The IA32_MISC_ENABLE bits that turn the profile's prefetchers off, writable there.
    pub fn misc_enable_bits(&self) -> u64 {
        self.prefetchers.misc_enable_bits()
    }

    /// The prefetchers on, with IA32_MISC_ENABLE = `misc_enable`.
    pub fn enabled(&self, misc_enable: u64) -> PrefetcherSet {
        self.prefetchers.enabled(self.misc_feature_control, misc_enable)
    }
}
