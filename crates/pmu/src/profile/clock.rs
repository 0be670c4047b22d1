//! [`Clock`]: the reference clock of UnHalted Reference Cycles, and CPUID leaves 15H and 16H.

/// The clock the architectural event UnHalted Reference Cycles (event 0x3C, umask 0x01)
/// counts, as a ratio to the TSC, and whether the CPU enumerates CPUID leaf 15H.
///
/// The SDM leaves the reference clock to the implementation ("the core crystal clock, TSC or
/// the bus clock"): CPUs with leaf 15H count the core crystal clock, for which the leaf gives
/// TSC = crystal x EBX / EAX; earlier ones count the bus clock, which the TSC divides by the
/// non-turbo ratio. The fixed counter of the same event, IA32_FIXED_CTR2
/// (CPU_CLK_UNHALTED.REF_TSC), counts at the TSC rate instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Clock {
    /// TSC ticks per reference-clock tick, numerator (CPUID.15H:EBX when enumerated).
    pub tsc_per_ref_numerator: u32,
    /// TSC ticks per reference-clock tick, denominator (CPUID.15H:EAX when enumerated).
    pub tsc_per_ref_denominator: u32,
    /// The CPU enumerates CPUID leaf 15H (time stamp counter and core crystal clock).
    pub leaf_15h: bool,
    /// CPUID.15H:ECX, the nominal core crystal clock frequency in Hz; 0 when the CPU does not
    /// enumerate it (or has no leaf 15H).
    pub crystal_hz: u32,
    /// CPUID leaf 16H (processor frequency information), where the CPU enumerates it.
    pub frequency_mhz: Option<FrequencyMhz>,
}

/// CPUID leaf 16H, processor frequency information: EAX[15:0] the processor base frequency,
/// EBX[15:0] the maximum frequency and ECX[15:0] the bus (reference) frequency, in MHz (SDM Vol.
/// 2A, CPUID). Software without a crystal frequency in leaf 15H takes the base frequency for the
/// TSC's nominal rate (Linux derives the crystal from it: base x EAX / EBX of leaf 15H).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrequencyMhz {
    pub base: u16,
    pub max: u16,
    pub bus: u16,
}

impl FrequencyMhz {
    /// `[eax, ebx, ecx, edx]` of CPUID leaf 16H (EDX reserved).
    pub fn leaf_16h(&self) -> [u32; 4] {
        [self.base.into(), self.max.into(), self.bus.into(), 0]
    }
}

impl Clock {
    /// The reference clock is the TSC and there is no leaf 15H: what KVM's virtual PMU counts
    /// for UnHalted Reference Cycles. What a profile without `[clock]` gets.
    pub const TSC: Clock = Clock {
        tsc_per_ref_numerator: 1,
        tsc_per_ref_denominator: 1,
        leaf_15h: false,
        crystal_hz: 0,
        frequency_mhz: None,
    };

    /// `[eax, ebx, ecx, edx]` of CPUID leaf 15H (EAX denominator, EBX numerator, ECX crystal
    /// frequency, EDX reserved), or `None` when the CPU does not enumerate the leaf.
    pub fn leaf_15h(&self) -> Option<[u32; 4]> {
        self.leaf_15h.then_some([self.tsc_per_ref_denominator, self.tsc_per_ref_numerator, self.crystal_hz, 0])
    }

    /// Reference-clock ticks from TSC 0 to TSC `tsc`: floor(tsc x denominator / numerator).
    /// The ticks between two TSC values are the difference of their `ref_ticks_at`, so counts
    /// summed over many intervals lose nothing to rounding. A zero numerator (an unvalidated
    /// profile) counts nothing.
    pub fn ref_ticks_at(&self, tsc: u64) -> u64 {
        let (numerator, denominator) = (self.tsc_per_ref_numerator, self.tsc_per_ref_denominator);
        // The engine asks at every block it counts: a 64-bit division where the product fits.
        if let Some(ticks) = tsc.checked_mul(u64::from(denominator)) {
            return ticks.checked_div(u64::from(numerator)).unwrap_or(0);
        }
        let ticks = u128::from(tsc) * u128::from(denominator);
        let ticks = ticks.checked_div(u128::from(numerator)).unwrap_or(0);
        u64::try_from(ticks).unwrap_or(u64::MAX)
    }
}

impl Clock {
    /// Reference-clock ticks while the TSC goes from `from` to `from + ticks`.
    pub fn ref_ticks_between(&self, from: u64, ticks: u64) -> u64 {
        self.ref_ticks_at(from.saturating_add(ticks)) - self.ref_ticks_at(from)
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::TSC
    }
}
