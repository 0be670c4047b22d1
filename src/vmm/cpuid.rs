//! The CPUID table the guest gets: KVM_GET_SUPPORTED_CPUID with the profile applied on top.
use super::error::kvm_err;
use super::VmmError;
use crate::profile::Profile;
use kvm_bindings::{kvm_cpuid_entry2, KVM_CPUID_FLAG_SIGNIFCANT_INDEX, KVM_MAX_CPUID_ENTRIES};
use kvm_ioctls::Kvm;

const LEAF_PERFMON: u32 = 0xA;
/// CPUID.01H:ECX.PDCM: IA32_PERF_CAPABILITIES exists.
const LEAF1_ECX_PDCM: u32 = 1 << 15;
/// CPUID.01H:ECX.DTES64 and DS-CPL, EDX.DS: the debug store (BTS/PEBS), not emulated yet.
const LEAF1_ECX_DTES64: u32 = 1 << 2;
const LEAF1_ECX_DS_CPL: u32 = 1 << 4;
const LEAF1_EDX_DS: u32 = 1 << 21;
/// AMD's core/NB/LLC performance-counter extensions (CPUID.80000001H:ECX[23,24,28]).
const EXT1_ECX_AMD_PERFCTR: u32 = (1 << 23) | (1 << 24) | (1 << 28);
/// Leaves that describe PMUs other than architectural perfmon v0-v5: Intel's leaf 0x23
/// (architectural perfmon extended) and AMD's 0x80000022 (PerfMonV2).
const HIDDEN_LEAVES: [u32; 2] = [0x23, 0x8000_0022];

/// The CPUID table the guest gets under `profile`.
pub fn guest_cpuid(kvm: &Kvm, profile: &Profile) -> Result<kvm_bindings::CpuId, VmmError> {
    let supported = kvm.get_supported_cpuid(KVM_MAX_CPUID_ENTRIES).map_err(kvm_err("KVM_GET_SUPPORTED_CPUID"))?;
    let mut entries = supported.as_slice().to_vec();
    apply_profile(&mut entries, profile);
    kvm_bindings::CpuId::from_entries(&entries).map_err(VmmError::CpuidTable)
}

/// Applies `profile` to a supported-CPUID table: vendor and signature (leaves 0, 1), leaf 0xA,
/// PDCM, and hides every other PMU the host's table may advertise.
pub fn apply_profile(entries: &mut Vec<kvm_cpuid_entry2>, profile: &Profile) {
    entries.retain(|e| !HIDDEN_LEAVES.contains(&e.function));
    if !entries.iter().any(|e| e.function == LEAF_PERFMON) {
        entries.push(kvm_cpuid_entry2 { function: LEAF_PERFMON, ..Default::default() });
    }
    let [vb, vd, vc] = profile.vendor_regs();
    let [a, b, c, d] = profile.pmu.leaf_0a();
    let intel = profile.vendor == "GenuineIntel";
    for e in entries.iter_mut() {
        match e.function {
            0 => {
                e.eax = e.eax.max(LEAF_PERFMON);
                (e.ebx, e.edx, e.ecx) = (vb, vd, vc);
            }
            1 => {
                e.eax = profile.leaf1_eax();
                e.ecx &= !(LEAF1_ECX_PDCM | LEAF1_ECX_DTES64 | LEAF1_ECX_DS_CPL);
                if profile.pmu.perf_capabilities != 0 {
                    e.ecx |= LEAF1_ECX_PDCM;
                }
                e.edx &= !LEAF1_EDX_DS;
            }
            LEAF_PERFMON => {
                (e.eax, e.ebx, e.ecx, e.edx) = (a, b, c, d);
                e.flags &= !KVM_CPUID_FLAG_SIGNIFCANT_INDEX;
            }
            0x8000_0000 if intel => {
                // Intel reports no vendor string in the extended range.
                (e.ebx, e.ecx, e.edx) = (0, 0, 0);
            }
            0x8000_0001 => e.ecx &= !EXT1_ECX_AMD_PERFCTR,
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(function: u32, eax: u32, ebx: u32, ecx: u32, edx: u32) -> kvm_cpuid_entry2 {
        kvm_cpuid_entry2 { function, eax, ebx, ecx, edx, ..Default::default() }
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
        apply_profile(&mut t, &p);
        let get = |f| t.iter().find(|e| e.function == f).copied();
        let l0 = get(0).unwrap();
        assert_eq!([l0.ebx, l0.edx, l0.ecx], p.vendor_regs());
        let l1 = get(1).unwrap();
        assert_eq!(l1.eax, p.leaf1_eax());
        assert_eq!(l1.ecx & LEAF1_ECX_PDCM != 0, p.pmu.perf_capabilities != 0);
        assert_eq!(l1.edx & LEAF1_EDX_DS, 0);
        let a = get(LEAF_PERFMON).expect("leaf 0xA added");
        assert_eq!([a.eax, a.ebx, a.ecx, a.edx], p.pmu.leaf_0a());
        assert_eq!(get(0x8000_0001).unwrap().ecx & EXT1_ECX_AMD_PERFCTR, 0);
        assert!(get(0x8000_0022).is_none());
    }
}
