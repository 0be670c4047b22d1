//! The hardware prefetchers as a guest controls them, and the cache shape their effect depends on
//! (README, "The cache model").
//!
//! From Nehalem on, MSR_MISC_FEATURE_CONTROL (0x1A4) bits 0-3 turn off the L2 streamer, the L2
//! adjacent-line prefetcher, the DCU prefetcher and the DCU IP prefetcher (Intel's "Disclosure of
//! H/W prefetcher control on some Intel processors"); Core 2 has no such MSR and uses
//! IA32_MISC_ENABLE bits 9, 19, 37 and 39 (SDM Vol. 4).

use crate::cpu::{cpuid, rdmsr, rdmsr_safe, wrmsr, wrmsr_safe};
use crate::pmu::IA32_MISC_ENABLE;

pub const MSR_MISC_FEATURE_CONTROL: u32 = 0x1A4;

/// The four prefetchers, as bits of a set (the order of MSR_MISC_FEATURE_CONTROL's bits).
pub const STREAMER: u8 = 1 << 0;
pub const ADJACENT_LINE: u8 = 1 << 1;
pub const DCU: u8 = 1 << 2;
pub const IP_STRIDE: u8 = 1 << 3;
pub const ALL: u8 = 0xF;

/// Each prefetcher's disable bit in IA32_MISC_ENABLE (Core 2), in [`STREAMER`]..[`IP_STRIDE`] order.
const MISC_ENABLE_BITS: [u64; 4] = [1 << 9, 1 << 19, 1 << 37, 1 << 39];

/// How this CPU turns its prefetchers off.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Control {
    /// MSR_MISC_FEATURE_CONTROL exists.
    MiscFeatureControl,
    /// IA32_MISC_ENABLE takes the disable bits of these prefetchers (Core 2: all four;
    /// NetBurst: the streamer's and the adjacent line's).
    MiscEnable(u8),
    /// Neither: no prefetchers to control.
    None,
}

impl Control {
    /// Finds out by trying: RDMSR of 0x1A4, else a WRMSR of IA32_MISC_ENABLE with each disable
    /// bit (undone at once).
    pub fn probe() -> Control {
        if rdmsr_safe(MSR_MISC_FEATURE_CONTROL).is_ok() {
            return Control::MiscFeatureControl;
        }
        let misc = rdmsr(IA32_MISC_ENABLE);
        let mut writable = 0;
        for (i, bit) in MISC_ENABLE_BITS.iter().enumerate() {
            if wrmsr_safe(IA32_MISC_ENABLE, misc | bit).is_ok() {
                wrmsr(IA32_MISC_ENABLE, misc);
                writable |= 1 << i;
            }
        }
        if writable != 0 {
            Control::MiscEnable(writable)
        } else {
            Control::None
        }
    }

    /// The IA32_MISC_ENABLE bits that turn the prefetchers of `set` off.
    pub fn misc_enable_bits(set: u8) -> u64 {
        (0..4).filter(|i| set & (1 << i) != 0).fold(0, |m, i| m | MISC_ENABLE_BITS[i])
    }

    /// Leaves on exactly the prefetchers of `on`.
    pub fn set(self, on: u8) {
        let off = !on & ALL;
        match self {
            Control::MiscFeatureControl => wrmsr(MSR_MISC_FEATURE_CONTROL, u64::from(off)),
            Control::MiscEnable(present) => {
                let all = Control::misc_enable_bits(present);
                let bits = Control::misc_enable_bits(off & present);
                wrmsr(IA32_MISC_ENABLE, (rdmsr(IA32_MISC_ENABLE) & !all) | bits);
            }
            Control::None => {}
        }
    }

    /// The prefetchers a guest can expect: those the register controls (the four behind
    /// MSR_MISC_FEATURE_CONTROL, as on every profile emon ships with it), else none.
    pub fn prefetchers(self) -> u8 {
        match self {
            Control::MiscFeatureControl => ALL,
            Control::MiscEnable(present) => present,
            Control::None => 0,
        }
    }
}

/// Does the data-cache hierarchy have an L2 inside the LLC (CPUID leaf 4 lists a level-3
/// cache)? Without one (Core 2), the L2 is the last level.
pub fn has_l2_inside_llc() -> bool {
    (0..8).map(|i| cpuid(4, i).eax).take_while(|eax| eax & 0x1F != 0).any(|eax| (eax >> 5) & 7 == 3)
}
