//! A vCPU's CPUID table as KVM holds it (`kvm_cpuid_entry2`): which entry answers a leaf and
//! sub-leaf, and an entry's registers by number.
use kvm_bindings::{kvm_cpuid_entry2, KVM_CPUID_FLAG_SIGNIFCANT_INDEX};

/// Whether entry `e` answers CPUID leaf `leaf`, sub-leaf `subleaf`: the sub-leaf counts only
/// where the entry says its index is significant.
pub fn answers(e: &kvm_cpuid_entry2, leaf: u32, subleaf: u32) -> bool {
    e.function == leaf && (e.flags & KVM_CPUID_FLAG_SIGNIFCANT_INDEX == 0 || e.index == subleaf)
}

/// Register `reg` of entry `e`: 0-3 for EAX, EBX, ECX, EDX.
pub fn reg_mut(e: &mut kvm_cpuid_entry2, reg: usize) -> &mut u32 {
    match reg {
        0 => &mut e.eax,
        1 => &mut e.ebx,
        2 => &mut e.ecx,
        _ => &mut e.edx,
    }
}

/// CPUID leaf `leaf`, sub-leaf `subleaf`, from a KVM table (SDM Vol. 2A, CPUID): the entry that
/// [`answers`] it; a leaf above the highest basic
/// (or extended) leaf returns the highest basic leaf's data, as Intel processors do; a leaf in
/// range with no entry reads zero.
pub fn lookup(table: &[kvm_cpuid_entry2], leaf: u32, subleaf: u32) -> [u32; 4] {
    let find = |leaf: u32, subleaf: u32| {
        table.iter().find(|e| {
            e.function == leaf && (e.flags & kvm_bindings::KVM_CPUID_FLAG_SIGNIFCANT_INDEX == 0 || e.index == subleaf)
        })
    };
    let max = |base: u32| find(base, 0).map_or(0, |e| e.eax);
    let (max_basic, max_ext) = (max(0), max(0x8000_0000));
    let leaf =
        if leaf > max_basic && leaf < 0x8000_0000 || leaf > max_ext && leaf >= 0x8000_0000 { max_basic } else { leaf };
    find(leaf, subleaf).map_or([0; 4], |e| [e.eax, e.ebx, e.ecx, e.edx])
}

#[cfg(test)]
mod tests {
    use super::lookup;
    use kvm_bindings::{kvm_cpuid_entry2, KVM_CPUID_FLAG_SIGNIFCANT_INDEX};

    fn e(function: u32, index: u32, eax: u32, flags: u32) -> kvm_cpuid_entry2 {
        kvm_cpuid_entry2 { function, index, eax, flags, ..Default::default() }
    }

    #[test]
    fn answers_as_intel_processors_do() {
        let sig = KVM_CPUID_FLAG_SIGNIFCANT_INDEX;
        let t = [
            e(0, 0, 0xD, 0),
            e(1, 0, 0x506E3, 0),
            e(0xD, 0, 7, sig),
            e(0xD, 1, 0xF, sig),
            e(0x8000_0000, 0, 0x8000_0008, 0),
        ];
        assert_eq!(lookup(&t, 1, 9)[0], 0x506E3, "index ignored where it is not significant");
        assert_eq!(lookup(&t, 0xD, 1)[0], 0xF);
        assert_eq!(lookup(&t, 0xD, 2), [0; 4], "no such sub-leaf");
        assert_eq!(lookup(&t, 0x20, 0)[0], 7, "beyond the highest basic leaf: the highest basic leaf's data");
        assert_eq!(lookup(&t, 0x8000_0009, 0)[0], 7, "beyond the highest extended leaf too");
        assert_eq!(lookup(&t, 5, 0), [0; 4], "in range, no entry");
    }
}
