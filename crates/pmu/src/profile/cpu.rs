//! [`Profile`]: the CPU identity (CPUID leaves 0 and 1) plus its [`PmuProfile`], [`Cache`] and
//! [`Clock`].

use super::{Cache, Clock, PmuProfile};

/// A complete emon CPU profile: who the guest thinks it runs on, its PMU, the cache hierarchy
/// the precise backend models and the reference clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Profile {
    /// Profile name: the file stem (e.g. `nehalem`) or the built-in name.
    pub name: String,
    /// The real CPU this models, e.g. `Intel Core i7-920 (Nehalem-EP, Bloomfield)`.
    pub description: String,
    /// CPUID.0 vendor string, 12 ASCII characters, e.g. `GenuineIntel`.
    pub vendor: String,
    /// Display family (e.g. 0x6); values above 0xF use the extended family field.
    pub family: u16,
    /// Display model (e.g. 0x1A); values above 0xF use the extended model field.
    pub model: u8,
    /// Stepping ID, CPUID.01H:EAX[3:0].
    pub stepping: u8,
    /// The processor brand string of CPUID leaves 8000_0002H-8000_0004H, as the real CPU returns
    /// it (up to 47 ASCII characters, leading spaces included where the CPU has them), e.g.
    /// `Intel(R) Core(TM) i7-6700K CPU @ 4.00GHz`; `None` leaves the hypervisor's leaves.
    pub brand: Option<String>,
    /// The microcode update revision the real CPU reported in IA32_BIOS_SIGN_ID (MSR 0x8B,
    /// bits 63:32), where a guest's behaviour depends on it (Linux turns PEBS off on Sandy
    /// Bridge below revision 0x28); `None` leaves the hypervisor's value.
    pub microcode: Option<u32>,
    /// CPUID leaf 0x0A and the PMU MSR capabilities.
    pub pmu: PmuProfile,
    /// The data-cache hierarchy (CPUID leaf 04H; the precise backend's cache model).
    pub cache: Cache,
    /// The reference clock of UnHalted Reference Cycles (CPUID leaf 15H).
    pub clock: Clock,
}

impl Profile {
    /// The built-in profile used when none is asked for.
    pub const DEFAULT: &'static str = "skylake";

    /// CPUID.01H:EAX version signature built from family/model/stepping (SDM Vol. 2A CPUID,
    /// Figure 3-6): family > 0xF is encoded as 0xF + extended family [27:20]; the high model
    /// nibble goes to extended model [19:16]. Processor type [13:12] is 0 (original OEM).
    pub fn leaf1_eax(&self) -> u32 {
        let family = u32::from(self.family);
        let (base_family, ext_family) = if family >= 0xF { (0xF, (family - 0xF) & 0xFF) } else { (family, 0) };
        let model = u32::from(self.model);
        u32::from(self.stepping & 0xF) | (model & 0xF) << 4 | base_family << 8 | (model >> 4) << 16 | ext_family << 20
    }

    /// Gives the PMU its CPU's model-specific event list, by vendor, family and model as Linux's
    /// perf chooses one (README, "Model-specific events"); none for the NetBurst PMU.
    pub fn resolve_events(&mut self) {
        self.pmu.events = match self.pmu.kind {
            super::PmuKind::Architectural => crate::events::EventList::for_cpu(&self.vendor, self.family, self.model),
            super::PmuKind::NetBurst => None,
        };
    }

    /// The brand string as CPUID leaves 8000_0002H-8000_0004H return it: 48 bytes, NUL-padded,
    /// 16 per leaf in EAX, EBX, ECX, EDX order, little endian (SDM Vol. 2A, CPUID, "The Processor
    /// Brand String Method").
    pub fn brand_regs(&self) -> Option<[[u32; 4]; 3]> {
        let brand = self.brand.as_ref()?;
        let mut bytes = [0u8; 48];
        for (dst, src) in bytes.iter_mut().zip(brand.bytes().take(47)) {
            *dst = src;
        }
        let reg = |i: usize| u32::from_le_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
        Some(std::array::from_fn(|leaf| std::array::from_fn(|r| reg(16 * leaf + 4 * r))))
    }

    /// The vendor string as CPUID.0 returns it: `[ebx, edx, ecx]`, 4 bytes each, little
    /// endian ("Genu", "ineI", "ntel"). A string that is not 12 bytes (an unvalidated
    /// profile) is cut or padded with NULs.
    pub fn vendor_regs(&self) -> [u32; 3] {
        let mut bytes = [0u8; 12];
        for (dst, src) in bytes.iter_mut().zip(self.vendor.bytes()) {
            *dst = src;
        }
        let reg = |i: usize| u32::from_le_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
        [reg(0), reg(4), reg(8)]
    }
}
