//! [`Prefetchers`]: the hardware data prefetchers of a profile's CPU, which the precise backend's
//! cache model runs (README, "The cache model"), and the register software turns them off with.
//!
//! Intel's optimization reference manual (order number 248966) describes four: two that fill the
//! L1 data cache (the DCU next-line prefetcher and the IP-based stride prefetcher) and two that
//! fill L2 and the LLC (the streamer and the spatial, or adjacent-line, prefetcher). Software
//! turns them off through MSR_MISC_FEATURE_CONTROL (0x1A4) from Nehalem on (Intel's "Disclosure
//! of H/W prefetcher control on some Intel processors"), and through IA32_MISC_ENABLE bits 9, 19,
//! 37 and 39 on Core 2 (SDM Vol. 4, the Core 2 table); NetBurst has bits 9 and 19 of the same.

/// A set of prefetchers: those a CPU has, or those turned on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct PrefetcherSet(u8);

impl PrefetcherSet {
    pub const NONE: PrefetcherSet = PrefetcherSet(0);
    /// The L1d next-line prefetcher ("DCU prefetcher", the streaming prefetcher of the L1).
    pub const DCU: PrefetcherSet = PrefetcherSet(1 << 0);
    /// The L1d IP-based stride prefetcher ("DCU IP prefetcher").
    pub const IP_STRIDE: PrefetcherSet = PrefetcherSet(1 << 1);
    /// The L2 streamer ("L2 hardware prefetcher"; Core 2's data prefetch logic, NetBurst's
    /// hardware prefetcher).
    pub const STREAMER: PrefetcherSet = PrefetcherSet(1 << 2);
    /// The L2 spatial prefetcher ("L2 adjacent cache line prefetcher").
    pub const ADJACENT_LINE: PrefetcherSet = PrefetcherSet(1 << 3);
    pub const ALL: PrefetcherSet = PrefetcherSet(0xF);

    /// Every prefetcher of `self` and of `other`.
    pub const fn union(self, other: PrefetcherSet) -> PrefetcherSet {
        PrefetcherSet(self.0 | other.0)
    }

    /// The prefetchers in both sets.
    pub const fn intersection(self, other: PrefetcherSet) -> PrefetcherSet {
        PrefetcherSet(self.0 & other.0)
    }

    /// The prefetchers of `self` that are not in `other`.
    pub const fn minus(self, other: PrefetcherSet) -> PrefetcherSet {
        PrefetcherSet(self.0 & !other.0)
    }

    /// Does `self` hold every prefetcher of `other`?
    pub const fn contains(self, other: PrefetcherSet) -> bool {
        self.0 & other.0 == other.0
    }

    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The names of the prefetchers in the set, in [`CONTROL_BITS`] order.
    pub fn names(self) -> Vec<&'static str> {
        CONTROL_BITS.iter().filter(|c| self.contains(c.prefetcher)).map(|c| c.name).collect()
    }
}

/// Where a prefetcher's disable bit is, in each register that has one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ControlBit {
    pub prefetcher: PrefetcherSet,
    /// Its name, as the profile file spells it.
    pub name: &'static str,
    /// Its disable bit in MSR_MISC_FEATURE_CONTROL (Nehalem on).
    pub misc_feature_control: u64,
    /// Its disable bit in IA32_MISC_ENABLE (Core 2: bits 9 "Hardware Prefetcher Disable",
    /// 19 "Adjacent Cache Line Prefetch Disable", 37 "DCU Prefetcher Disable", 39 "IP
    /// Prefetcher Disable"; SDM Vol. 4).
    pub misc_enable: u64,
}

/// The four prefetchers' disable bits: one table for both registers.
pub const CONTROL_BITS: [ControlBit; 4] = [
    ControlBit {
        prefetcher: PrefetcherSet::STREAMER,
        name: "streamer",
        misc_feature_control: 1 << 0,
        misc_enable: 1 << 9,
    },
    ControlBit {
        prefetcher: PrefetcherSet::ADJACENT_LINE,
        name: "adjacent-line",
        misc_feature_control: 1 << 1,
        misc_enable: 1 << 19,
    },
    ControlBit { prefetcher: PrefetcherSet::DCU, name: "dcu", misc_feature_control: 1 << 2, misc_enable: 1 << 37 },
    ControlBit {
        prefetcher: PrefetcherSet::IP_STRIDE,
        name: "ip-stride",
        misc_feature_control: 1 << 3,
        misc_enable: 1 << 39,
    },
];

/// The L2 streamer's reach, as the optimization manual gives it per microarchitecture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Streamer {
    /// How many lines ahead of the request it prefetches, at most (Sandy Bridge on: 20; Intel
    /// Core: 8).
    pub distance: u32,
    /// How many 4 KiB pages it tracks a stream in at once (Sandy Bridge on: 32; Intel Core: 16).
    pub pages: u32,
}

/// The hardware data prefetchers of a profile's CPU and how software controls them (the
/// `[cache.prefetchers]` table). The default has none, and no control register.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Prefetchers {
    pub dcu: bool,
    pub ip_stride: bool,
    pub streamer: Option<Streamer>,
    pub adjacent_line: bool,
    /// MSR_MISC_FEATURE_CONTROL (0x1A4) exists, and a WRMSR stores these bits (the others #GP);
    /// bits 3:0 turn the prefetchers off ([`CONTROL_BITS`]).
    pub misc_feature_control: Option<u64>,
    /// IA32_MISC_ENABLE's disable bits of the prefetchers the CPU has are writable and turn them
    /// off (Core 2, NetBurst).
    pub misc_enable: bool,
}

impl Prefetchers {
    /// The prefetchers the CPU has.
    pub fn present(&self) -> PrefetcherSet {
        let of = |on: bool, p: PrefetcherSet| if on { p } else { PrefetcherSet::NONE };
        of(self.dcu, PrefetcherSet::DCU)
            .union(of(self.ip_stride, PrefetcherSet::IP_STRIDE))
            .union(of(self.streamer.is_some(), PrefetcherSet::STREAMER))
            .union(of(self.adjacent_line, PrefetcherSet::ADJACENT_LINE))
    }

    /// The IA32_MISC_ENABLE bits that turn prefetchers off, if that is how this CPU controls them.
    pub fn misc_enable_bits(&self) -> u64 {
        if !self.misc_enable {
            return 0;
        }
        let present = self.present();
        CONTROL_BITS.iter().filter(|c| present.contains(c.prefetcher)).fold(0, |m, c| m | c.misc_enable)
    }

    /// The prefetchers still on when MSR_MISC_FEATURE_CONTROL holds `misc_feature_control` and
    /// IA32_MISC_ENABLE holds `misc_enable` (a register the CPU lacks turns nothing off).
    pub fn enabled(&self, misc_feature_control: u64, misc_enable: u64) -> PrefetcherSet {
        let feature = if self.misc_feature_control.is_some() { misc_feature_control } else { 0 };
        let misc = misc_enable & self.misc_enable_bits();
        let off = CONTROL_BITS
            .iter()
            .filter(|c| feature & c.misc_feature_control != 0 || misc & c.misc_enable != 0)
            .fold(PrefetcherSet::NONE, |s, c| s.union(c.prefetcher));
        self.present().minus(off)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SANDY_BRIDGE: Prefetchers = Prefetchers {
        dcu: true,
        ip_stride: true,
        streamer: Some(Streamer { distance: 20, pages: 32 }),
        adjacent_line: true,
        misc_feature_control: Some(0x80F),
        misc_enable: false,
    };

    #[test]
    fn msr_misc_feature_control_bits_3_0_turn_each_prefetcher_off() {
        let p = SANDY_BRIDGE;
        assert_eq!(p.present(), PrefetcherSet::ALL);
        assert_eq!(p.enabled(0, 0), PrefetcherSet::ALL);
        assert_eq!(p.enabled(1 << 0, 0), PrefetcherSet::ALL.minus(PrefetcherSet::STREAMER));
        assert_eq!(p.enabled(1 << 1, 0), PrefetcherSet::ALL.minus(PrefetcherSet::ADJACENT_LINE));
        assert_eq!(p.enabled(1 << 2, 0), PrefetcherSet::ALL.minus(PrefetcherSet::DCU));
        assert_eq!(p.enabled(1 << 3, 0), PrefetcherSet::ALL.minus(PrefetcherSet::IP_STRIDE));
        assert_eq!(p.enabled(0xF, 0), PrefetcherSet::NONE);
        // Bit 11 is stored (as measured) and turns nothing off; MISC_ENABLE's bits mean nothing here.
        assert_eq!(p.enabled(1 << 11, 1 << 9 | 1 << 39), PrefetcherSet::ALL);
        assert_eq!(p.misc_enable_bits(), 0);
    }

    #[test]
    fn core_2_turns_its_prefetchers_off_in_misc_enable() {
        let p = Prefetchers { misc_feature_control: None, misc_enable: true, ..SANDY_BRIDGE };
        assert_eq!(p.misc_enable_bits(), 1 << 9 | 1 << 19 | 1 << 37 | 1 << 39);
        assert_eq!(p.enabled(0xF, 0), PrefetcherSet::ALL, "no MSR_MISC_FEATURE_CONTROL");
        assert_eq!(p.enabled(0, 1 << 37 | 1 << 39), PrefetcherSet::STREAMER.union(PrefetcherSet::ADJACENT_LINE));
        // NetBurst: a hardware prefetcher and the adjacent line, bits 9 and 19 only.
        let p4 = Prefetchers { dcu: false, ip_stride: false, ..p };
        assert_eq!(p4.misc_enable_bits(), 1 << 9 | 1 << 19);
        assert_eq!(p4.enabled(0, u64::MAX), PrefetcherSet::NONE);
        assert_eq!(p4.enabled(0, 1 << 19).names(), ["streamer"]);
    }

    #[test]
    fn a_cpu_without_prefetchers_has_none_to_turn_on() {
        let p = Prefetchers::default();
        assert!(p.present().is_empty());
        assert_eq!(p.enabled(0, 0), PrefetcherSet::NONE);
        assert_eq!(PrefetcherSet::ALL.names(), ["streamer", "adjacent-line", "dcu", "ip-stride"]);
    }
}
