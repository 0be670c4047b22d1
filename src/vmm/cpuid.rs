//! The CPUID table the guest gets: KVM_GET_SUPPORTED_CPUID with the profile applied on top.
use super::error::kvm_err;
use super::tsc_rate::TscRate;
use super::VmmError;
use crate::profile::Profile;
use kvm_bindings::{kvm_cpuid_entry2, KVM_CPUID_FLAG_SIGNIFCANT_INDEX, KVM_MAX_CPUID_ENTRIES};
use kvm_ioctls::Kvm;

/// CPUID leaf 04H, deterministic cache parameters (one sub-leaf per cache, ECX = index).
const LEAF_CACHE: u32 = 0x4;
const LEAF_PERFMON: u32 = 0xA;
/// CPUID leaf 15H, time stamp counter and core crystal clock.
const LEAF_TSC_CRYSTAL: u32 = 0x15;
/// CPUID leaf 16H, processor frequency information.
const LEAF_FREQUENCY: u32 = 0x16;
/// CPUID.01H:ECX.PDCM: IA32_PERF_CAPABILITIES exists.
const LEAF1_ECX_PDCM: u32 = 1 << 15;
/// CPUID.01H:ECX.DTES64 and DS-CPL, EDX.DS: the debug store. DS and DTES64 (the 64-bit DS
/// layout) are set where emon presents PEBS; DS-CPL (CPL-qualified BTS) never.
const LEAF1_ECX_DTES64: u32 = 1 << 2;
const LEAF1_ECX_DS_CPL: u32 = 1 << 4;
const LEAF1_EDX_DS: u32 = 1 << 21;
/// AMD's core/NB/LLC performance-counter extensions (CPUID.80000001H:ECX[23,24,28]).
const EXT1_ECX_AMD_PERFCTR: u32 = (1 << 23) | (1 << 24) | (1 << 28);
/// The processor brand string's leaves (SDM Vol. 2A, CPUID, "The Processor Brand String Method").
const BRAND_LEAVES: std::ops::RangeInclusive<u32> = 0x8000_0002..=0x8000_0004;
/// Leaves that describe PMUs other than architectural perfmon v0-v5: Intel's leaf 0x23
/// (architectural perfmon extended) and AMD's 0x80000022 (PerfMonV2).
const HIDDEN_LEAVES: [u32; 2] = [0x23, 0x8000_0022];

/// The CPUID table the guest gets under `profile`; `ds`: emon presents the Debug Store (PEBS, BTS);
/// `tsc`: the rate the guest's TSC runs at.
pub fn guest_cpuid(kvm: &Kvm, profile: &Profile, ds: bool, tsc: TscRate) -> Result<kvm_bindings::CpuId, VmmError> {
    let supported = kvm.get_supported_cpuid(KVM_MAX_CPUID_ENTRIES).map_err(kvm_err("KVM_GET_SUPPORTED_CPUID"))?;
    let mut entries = supported.as_slice().to_vec();
    apply_profile(&mut entries, profile, ds, tsc);
    kvm_bindings::CpuId::from_entries(&entries).map_err(VmmError::CpuidTable)
}

/// Applies `profile` to a supported-CPUID table: vendor and signature (leaves 0, 1), leaf 0xA,
/// PDCM, the modelled caches (leaf 4, Intel profiles), reference clock and frequencies (leaves 0x15
/// and 0x16, whose crystal and base frequency give the rate `tsc` the guest's TSC runs at), and
/// hides every other PMU the host's table may advertise.
pub fn apply_profile(entries: &mut Vec<kvm_cpuid_entry2>, profile: &Profile, ds: bool, tsc: TscRate) {
    let intel = profile.vendor == "GenuineIntel";
    entries.retain(|e| {
        !HIDDEN_LEAVES.contains(&e.function)
            && e.function != LEAF_TSC_CRYSTAL
            && e.function != LEAF_FREQUENCY
            && !(intel && e.function == LEAF_CACHE)
    });
    if !entries.iter().any(|e| e.function == LEAF_PERFMON) {
        entries.push(kvm_cpuid_entry2 { function: LEAF_PERFMON, ..Default::default() });
    }
    // The guest must see the profile's caches, clock and frequencies, never the host's.
    if intel {
        entries.extend(profile.cache.leaf_04().into_iter().zip(0..).map(|(regs, index)| cache_subleaf(index, regs)));
    }
    if let Some([eax, ebx, _, edx]) = profile.clock.leaf_15h() {
        let ecx = tsc.crystal_hz(&profile.clock);
        entries.push(kvm_cpuid_entry2 { function: LEAF_TSC_CRYSTAL, eax, ebx, ecx, edx, ..Default::default() });
    }
    if let Some([eax, ebx, ecx, edx]) = tsc.leaf_16h(&profile.clock) {
        entries.push(kvm_cpuid_entry2 { function: LEAF_FREQUENCY, eax, ebx, ecx, edx, ..Default::default() });
    }
    let max_basic = if profile.clock.frequency_mhz.is_some() {
        LEAF_FREQUENCY
    } else if profile.clock.leaf_15h {
        LEAF_TSC_CRYSTAL
    } else {
        LEAF_PERFMON
    };
    let [vb, vd, vc] = profile.vendor_regs();
    let [a, b, c, d] = profile.pmu.leaf_0a();
    if profile.brand.is_some() {
        // The brand string's leaves, and a maximum extended leaf that reaches them.
        for function in BRAND_LEAVES {
            if !entries.iter().any(|e| e.function == function) {
                entries.push(kvm_cpuid_entry2 { function, ..Default::default() });
            }
        }
        match entries.iter_mut().find(|e| e.function == 0x8000_0000) {
            Some(e) => e.eax = e.eax.max(*BRAND_LEAVES.end()),
            None => {
                entries.push(kvm_cpuid_entry2 { function: 0x8000_0000, eax: *BRAND_LEAVES.end(), ..Default::default() })
            }
        }
    }
    for e in entries.iter_mut() {
        match e.function {
            0 => {
                e.eax = e.eax.max(max_basic);
                (e.ebx, e.edx, e.ecx) = (vb, vd, vc);
            }
            1 => {
                e.eax = profile.leaf1_eax();
                e.ecx &= !(LEAF1_ECX_PDCM | LEAF1_ECX_DTES64 | LEAF1_ECX_DS_CPL);
                if profile.pmu.perf_capabilities != 0 {
                    e.ecx |= LEAF1_ECX_PDCM;
                }
                e.edx &= !LEAF1_EDX_DS;
                if ds {
                    e.ecx |= LEAF1_ECX_DTES64;
                    e.edx |= LEAF1_EDX_DS;
                }
            }
            LEAF_PERFMON => {
                (e.eax, e.ebx, e.ecx, e.edx) = (a, b, c, d);
                e.flags &= !KVM_CPUID_FLAG_SIGNIFCANT_INDEX;
            }
            0x8000_0000 if intel => {
                // Intel reports no vendor string in the extended range.
                (e.ebx, e.ecx, e.edx) = (0, 0, 0);
            }
            f if BRAND_LEAVES.contains(&f) => {
                if let Some(brand) = profile.brand_regs() {
                    [e.eax, e.ebx, e.ecx, e.edx] = brand[(f - BRAND_LEAVES.start()) as usize];
                }
            }
            0x8000_0001 => e.ecx &= !EXT1_ECX_AMD_PERFCTR,
            _ => {}
        }
    }
}

/// Sub-leaf `index` of CPUID leaf 4 (deterministic cache parameters) with EAX..EDX `regs`.
fn cache_subleaf(index: u32, [eax, ebx, ecx, edx]: [u32; 4]) -> kvm_cpuid_entry2 {
    kvm_cpuid_entry2 {
        function: LEAF_CACHE,
        index,
        flags: KVM_CPUID_FLAG_SIGNIFCANT_INDEX,
        eax,
        ebx,
        ecx,
        edx,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rate this build machine runs a guest's TSC at (it cannot scale it).
    const HOST: TscRate = TscRate { khz: 2_445_424 };

    fn entry(function: u32, eax: u32, ebx: u32, ecx: u32, edx: u32) -> kvm_cpuid_entry2 {
        kvm_cpuid_entry2 { function, eax, ebx, ecx, edx, ..Default::default() }
    }

    /// The profile's brand string replaces the host's in leaves 8000_0002H-8000_0004H (48 bytes,
    /// NUL-padded), added with a maximum extended leaf that reaches them where the host has none.
    #[test]
    fn the_brand_string_is_the_profiles() {
        for name in ["skylake", "sandybridge", "pentium4"] {
            let p = Profile::load(name).expect("built-in");
            let mut t = vec![entry(0x8000_0000, 0x8000_0001, 0, 0, 0), entry(0x8000_0002, 1, 2, 3, 4)];
            apply_profile(&mut t, &p, false, HOST);
            assert_eq!(t.iter().find(|e| e.function == 0x8000_0000).unwrap().eax, 0x8000_0004);
            let bytes: Vec<u8> = (0x8000_0002..=0x8000_0004)
                .flat_map(|f| {
                    let e = t.iter().find(|e| e.function == f).unwrap();
                    [e.eax, e.ebx, e.ecx, e.edx].into_iter().flat_map(u32::to_le_bytes)
                })
                .collect();
            let brand = p.brand.as_deref().unwrap();
            assert_eq!(&bytes[..brand.len()], brand.as_bytes(), "{name}");
            assert!(bytes[brand.len()..].iter().all(|&b| b == 0), "{name}: NUL-padded");
        }
        // The i7-2635QM's leaves as VBoxCpuReport read them: six spaces, then the name.
        let p = Profile::load("sandybridge").unwrap();
        assert_eq!(p.brand_regs().unwrap()[0], [0x2020_2020, 0x6E49_2020, 0x286C_6574, 0x4320_2952]);
        assert_eq!(p.brand_regs().unwrap()[2], [0x5043_204D, 0x2040_2055, 0x3030_2E32, 0x007A_4847]);
    }

    #[test]
    fn profile_replaces_vendor_signature_and_leaf_0a() {
        let p = Profile::load("skylake").expect("built-in");
        let mut t = vec![
            entry(0, 0x10, 0x6874_7541, 0x444D_4163, 0x6974_6E65),
            entry(1, 0x00A0_0F11, 0, 0xFFFF_FFFF, 0xFFFF_FFFF),
            entry(0x8000_0001, 0, 0, 0xFFFF_FFFF, 0),
            entry(0x8000_0022, 1, 2, 3, 4),
        ];
        apply_profile(&mut t, &p, false, HOST);
        let get = |f| t.iter().find(|e| e.function == f).copied();
        let l0 = get(0).unwrap();
        assert_eq!([l0.ebx, l0.edx, l0.ecx], p.vendor_regs());
        let l1 = get(1).unwrap();
        assert_eq!(l1.eax, p.leaf1_eax());
        assert_eq!(l1.ecx & LEAF1_ECX_PDCM != 0, p.pmu.perf_capabilities != 0);
        assert_eq!(l1.edx & LEAF1_EDX_DS, 0);
        assert_eq!(l1.ecx & (LEAF1_ECX_DTES64 | LEAF1_ECX_DS_CPL), 0);
        // Where emon presents PEBS: DS and the 64-bit layout, never DS-CPL.
        let mut t = vec![entry(1, 0x00A0_0F11, 0, 0xFFFF_FFFF, 0xFFFF_FFFF)];
        apply_profile(&mut t, &p, true, HOST);
        let l1 = t.iter().find(|e| e.function == 1).copied().unwrap();
        assert_eq!(
            (l1.edx & LEAF1_EDX_DS, l1.ecx & (LEAF1_ECX_DTES64 | LEAF1_ECX_DS_CPL)),
            (LEAF1_EDX_DS, LEAF1_ECX_DTES64)
        );
        let a = get(LEAF_PERFMON).expect("leaf 0xA added");
        assert_eq!([a.eax, a.ebx, a.ecx, a.edx], p.pmu.leaf_0a());
        assert_eq!(get(0x8000_0001).unwrap().ecx & EXT1_ECX_AMD_PERFCTR, 0);
        assert!(get(0x8000_0022).is_none());
    }
    /// The leaf's sub-leaves as `(index, [eax, ebx, ecx, edx])`, sorted by index, checking
    /// each one is marked as indexed.
    fn subleaves(t: &[kvm_cpuid_entry2], function: u32) -> Vec<(u32, [u32; 4])> {
        let mut out: Vec<(u32, [u32; 4])> = t
            .iter()
            .filter(|e| e.function == function)
            .inspect(|e| assert_ne!(e.flags & KVM_CPUID_FLAG_SIGNIFCANT_INDEX, 0, "{e:?}"))
            .map(|e| (e.index, [e.eax, e.ebx, e.ecx, e.edx]))
            .collect();
        out.sort_unstable_by_key(|(index, _)| *index);
        out
    }

    /// A host table with its own caches (5 sub-leaves, a 2 MiB L2 and 30 MiB L3) and leaves 0x15
    /// and 0x16.
    fn host_table(max_basic: u32) -> Vec<kvm_cpuid_entry2> {
        let host_leaf_4 = [
            [0x1C00_4121, 0x02C0_003F, 0x3F, 0],
            [0x1C00_4122, 0x01C0_003F, 0x3F, 0],
            [0x1C00_4143, 0x03C0_003F, 0x7FF, 0],
            [0x1C03_C163, 0x02C0_003F, 0x9FFF, 6],
            [0; 4],
        ];
        let mut t = vec![entry(0, max_basic, 0x756E_6547, 0x6C65_746E, 0x4965_6E69), entry(1, 0x000A_06A4, 0, 0, 0)];
        t.extend(host_leaf_4.iter().zip(0..).map(|(&regs, index)| cache_subleaf(index, regs)));
        t.push(entry(LEAF_TSC_CRYSTAL, 2, 200, 25_000_000, 0));
        t.push(entry(LEAF_FREQUENCY, 2500, 4900, 100, 0));
        t
    }

    #[test]
    fn leaf_4_presents_the_modelled_caches() {
        for name in Profile::builtin_names() {
            let p = Profile::load(name).expect("built-in");
            let mut t = host_table(0x20);
            apply_profile(&mut t, &p, false, HOST);
            let ours = subleaves(&t, LEAF_CACHE);
            let expected: Vec<(u32, [u32; 4])> = (0..).zip(p.cache.leaf_04()).collect();
            assert_eq!(ours, expected, "{name}");
            // Every sub-leaf before the null one describes its cache: size from the encoding.
            let sizes: Vec<u64> = ours
                .iter()
                .take_while(|(_, [eax, ..])| eax & 0x1F != 0)
                .map(|(_, [_, ebx, ecx, _])| {
                    u64::from((ebx >> 22) + 1)
                        * u64::from(((ebx >> 12) & 0x3FF) + 1)
                        * u64::from((ebx & 0xFFF) + 1)
                        * (u64::from(*ecx) + 1)
                })
                .collect();
            let mut bytes = vec![p.cache.l1d.bytes(), p.cache.l1i.bytes()];
            bytes.extend(p.cache.l2.map(|l2| l2.bytes()));
            bytes.push(p.cache.llc.bytes());
            assert_eq!(sizes, bytes, "{name}");
        }
        // Nehalem: L1i 4-way, L3 8 MiB 16-way inclusive, as CPUID.04H of the real part.
        let mut t = host_table(0x20);
        apply_profile(&mut t, &Profile::load("nehalem").expect("built-in"), false, HOST);
        let ours = subleaves(&t, LEAF_CACHE);
        assert_eq!(ours[1].1[1..3], [0x00C0_003F, 0x7F]);
        assert_eq!(ours[3].1, [0x0000_0163, 0x03C0_003F, 0x1FFF, 2]);
        assert_eq!(ours[4].1, [0; 4]);
    }

    #[test]
    fn leaf_4_of_a_non_intel_profile_is_the_hosts() {
        let mut p = Profile::load("skylake").expect("built-in");
        p.vendor = "AuthenticAMD".to_string();
        let mut t = host_table(0x20);
        let host = subleaves(&t, LEAF_CACHE);
        apply_profile(&mut t, &p, false, HOST);
        assert_eq!(subleaves(&t, LEAF_CACHE), host);
    }

    #[test]
    fn leaf_15h_is_the_profiles_and_raises_the_max_basic_leaf() {
        let p = Profile::load("icelake").expect("built-in");
        let leaf_15h = |tsc: TscRate| {
            let mut t = host_table(0xD);
            t.retain(|e| e.function != LEAF_TSC_CRYSTAL);
            apply_profile(&mut t, &p, false, tsc);
            let max = t.iter().find(|e| e.function == 0).map(|e| e.eax);
            assert_eq!(max, Some(0x16), "icelake has leaf 0x16");
            let leaf: Vec<[u32; 4]> =
                t.iter().filter(|e| e.function == LEAF_TSC_CRYSTAL).map(|e| [e.eax, e.ebx, e.ecx, e.edx]).collect();
            leaf
        };
        // Where the guest's TSC runs at the profile's 1497.6 MHz, the real CPU's leaf.
        assert_eq!(leaf_15h(TscRate { khz: 1_497_600 }), [[2, 78, 38_400_000, 0]]);
        // Elsewhere its ratio, and the crystal that makes ECX x EBX / EAX the TSC's real rate.
        assert_eq!(leaf_15h(HOST), [[2, 78, 62_703_179, 0]]);
        // A host max above 0x15 stays.
        let mut t = host_table(0x20);
        apply_profile(&mut t, &Profile::load("skylake").expect("built-in"), false, HOST);
        assert_eq!(t.iter().find(|e| e.function == 0).map(|e| e.eax), Some(0x20));
        let leaf: Vec<[u32; 4]> =
            t.iter().filter(|e| e.function == LEAF_TSC_CRYSTAL).map(|e| [e.eax, e.ebx, e.ecx, e.edx]).collect();
        assert_eq!(leaf, [[2, 334, 0, 0]]);
    }

    /// Leaf 0x16 is the profile's, with the base frequency the rate the guest's TSC runs at, and
    /// the max basic leaf reaches it; a profile without it hides the host's.
    #[test]
    fn leaf_16h_is_the_profiles_with_the_tscs_base_frequency() {
        let leaf_16h = |name: &str, tsc: TscRate| {
            let mut t = host_table(0xD);
            apply_profile(&mut t, &Profile::load(name).expect("built-in"), false, tsc);
            let max = t.iter().find(|e| e.function == 0).map(|e| e.eax);
            let leaf: Vec<[u32; 4]> =
                t.iter().filter(|e| e.function == LEAF_FREQUENCY).map(|e| [e.eax, e.ebx, e.ecx, e.edx]).collect();
            (max, leaf)
        };
        assert_eq!(leaf_16h("skylake", TscRate { khz: 4_000_000 }), (Some(0x16), vec![[4000, 4200, 100, 0]]));
        assert_eq!(leaf_16h("skylake", HOST), (Some(0x16), vec![[2445, 4200, 100, 0]]));
        assert_eq!(leaf_16h("no-pmu", HOST), (Some(0x16), vec![[2445, 4200, 100, 0]]));
        assert_eq!(leaf_16h("icelake", HOST), (Some(0x16), vec![[2445, 3900, 100, 0]]));
        assert_eq!(leaf_16h("sandybridge", HOST), (Some(0xD), vec![]), "the host's leaf 0x16 is hidden");
        assert_eq!(leaf_16h("core2", HOST), (Some(0xD), vec![]));
    }

    #[test]
    fn leaf_15h_of_the_host_is_hidden_when_the_profile_has_none() {
        for name in ["core2", "nehalem", "sandybridge"] {
            let p = Profile::load(name).expect("built-in");
            assert!(!p.clock.leaf_15h, "{name}");
            let mut t = host_table(0x20);
            apply_profile(&mut t, &p, false, HOST);
            assert!(t.iter().all(|e| e.function != LEAF_TSC_CRYSTAL), "{name}: host leaf 0x15 visible");
            // The max basic leaf is not lowered: the host's other leaves (XSAVE, ...) stay.
            assert_eq!(t.iter().find(|e| e.function == 0).map(|e| e.eax), Some(0x20), "{name}");
        }
        // A profile without [clock] has no leaf 0x15 either.
        let text = "description = \"d\"\nvendor = \"GenuineIntel\"\nfamily = 6\nmodel = 0x5E\nstepping = 3\n[pmu]\nversion = 0\n";
        let p = Profile::from_toml("plain.toml", text).expect("loads");
        let mut t = host_table(0x20);
        apply_profile(&mut t, &p, false, HOST);
        assert!(t.iter().all(|e| e.function != LEAF_TSC_CRYSTAL));
    }
}
