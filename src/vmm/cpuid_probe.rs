//! What a guest really sees through CPUID, against the table emon gives KVM.
//!
//! Some hosts do not apply a VMM's CPUID table to every bit: on kvm_pvm (README, "This build
//! machine") the guest's CPL0 CPUID shows the host's XSAVE, AVX, POPCNT, RDRAND, SMEP/SMAP and
//! all of leaf 7, whatever the table says. emon measures it instead of assuming: a throwaway VM
//! with the same table runs `cpuid; hlt` once per leaf and sub-leaf of the table, in 32-bit
//! protected mode at CPL0 as emon's multiboot guests start, and every bit that differs is an
//! [`Override`]. `emon host`, `emon cpuid` and the run summary report them.
use super::boot::{self, Entry, Mode};
use super::error::kvm_err;
use super::layout::HIGH_MEM_START;
use super::VmmError;
use kvm_bindings::{kvm_cpuid_entry2, CpuId};
use kvm_ioctls::{Kvm, VcpuExit};
use vm_memory::GuestMemoryMmap;

/// `cpuid; hlt`.
const PROBE_CODE: [u8; 3] = [0x0F, 0xA2, 0xF4];
/// Enough RAM for the GDT (emon's boot area) and the code at 1 MiB.
const PROBE_RAM: u64 = 2 << 20;

/// Registers of one CPUID leaf, in the order EAX, EBX, ECX, EDX.
pub const REGISTERS: [&str; 4] = ["EAX", "EBX", "ECX", "EDX"];

/// One register of one leaf where the guest's CPUID differs from the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Override {
    pub leaf: u32,
    pub subleaf: u32,
    /// Index into [`REGISTERS`].
    pub register: usize,
    /// What the table says, and what the guest reads.
    pub table: u32,
    pub guest: u32,
}

impl Override {
    /// How many bits of the register differ.
    pub fn bits(&self) -> u32 {
        (self.table ^ self.guest).count_ones()
    }
    /// Bits the guest sees set although the table clears them.
    pub fn forced_on(&self) -> u32 {
        self.guest & !self.table
    }
    /// Bits the guest sees clear although the table sets them.
    pub fn forced_off(&self) -> u32 {
        self.table & !self.guest
    }

    /// Whether it touches what the profile says about the CPU and its PMU: the vendor and
    /// signature (leaves 0 and 1 EAX), PDCM and the debug store (leaf 1 ECX[2,4,15], EDX[21]),
    /// the caches (leaf 4), leaf 0x0A or the reference clock and frequencies (leaves 0x15 and
    /// 0x16). emon's PMU presents a profile only where these follow the table.
    pub fn touches_the_profile(&self) -> bool {
        let diff = self.table ^ self.guest;
        match (self.leaf, self.register) {
            (0, _) | (1, 0) | (0x4, _) | (0xA, _) | (0x15, _) | (0x16, _) => true,
            (1, 2) => diff & (1 << 2 | 1 << 4 | 1 << 15) != 0,
            (1, 3) => diff & (1 << 21) != 0,
            _ => false,
        }
    }

    /// The names of the differing bits that have one.
    pub fn named_bits(&self) -> Vec<&'static str> {
        (0..32)
            .filter(|b| (self.table ^ self.guest) & (1 << b) != 0)
            .filter_map(|b| feature_name(self.leaf, self.subleaf, self.register, b))
            .collect()
    }

    /// `CPUID.(EAX=07H,ECX=0):EBX bits 3 (BMI1) 5 (AVX2) forced on (table ..., guest ...)`.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        for (what, bits) in [("forced on", self.forced_on()), ("forced off", self.forced_off())] {
            if bits != 0 {
                let list: Vec<String> = (0..32)
                    .filter(|b| bits & (1 << b) != 0)
                    .map(|b| match feature_name(self.leaf, self.subleaf, self.register, b) {
                        Some(name) => format!("{b} ({name})"),
                        None => b.to_string(),
                    })
                    .collect();
                parts.push(format!("bits {} {what}", list.join(" ")));
            }
        }
        format!(
            "CPUID.(EAX={:02X}H,ECX={}):{} {} (table {:#010x}, guest {:#010x})",
            self.leaf,
            self.subleaf,
            REGISTERS[self.register],
            parts.join(", "),
            self.table,
            self.guest
        )
    }
}

/// Names of the feature flags a host is known to force (SDM Vol. 2A, CPUID, Tables 3-10, 3-11
/// and the leaf 07H listing); other bits are reported by number.
fn feature_name(leaf: u32, subleaf: u32, register: usize, bit: u32) -> Option<&'static str> {
    Some(match (leaf, subleaf, register, bit) {
        (1, _, 2, 0) => "SSE3",
        (1, _, 2, 2) => "DTES64",
        (1, _, 2, 4) => "DS-CPL",
        (1, _, 2, 12) => "FMA",
        (1, _, 2, 15) => "PDCM",
        (1, _, 2, 19) => "SSE4.1",
        (1, _, 2, 20) => "SSE4.2",
        (1, _, 2, 22) => "MOVBE",
        (1, _, 2, 23) => "POPCNT",
        (1, _, 2, 25) => "AES",
        (1, _, 2, 26) => "XSAVE",
        (1, _, 2, 27) => "OSXSAVE",
        (1, _, 2, 28) => "AVX",
        (1, _, 2, 29) => "F16C",
        (1, _, 2, 30) => "RDRAND",
        (1, _, 2, 31) => "hypervisor",
        (1, _, 3, 21) => "DS",
        (7, 0, 1, 0) => "FSGSBASE",
        (7, 0, 1, 3) => "BMI1",
        (7, 0, 1, 5) => "AVX2",
        (7, 0, 1, 7) => "SMEP",
        (7, 0, 1, 8) => "BMI2",
        (7, 0, 1, 9) => "ERMS",
        (7, 0, 1, 16) => "AVX512F",
        (7, 0, 1, 18) => "RDSEED",
        (7, 0, 1, 19) => "ADX",
        (7, 0, 1, 20) => "SMAP",
        (7, 0, 1, 29) => "SHA",
        (7, 0, 2, 2) => "UMIP",
        (7, 0, 2, 4) => "OSPKE",
        _ => return None,
    })
}

/// Runs the probe VM with `table` and returns every register the guest sees differently, in
/// table order. One KVM_RUN per entry: about a millisecond for a whole table here.
pub fn probe(kvm: &Kvm, table: &CpuId) -> Result<Vec<Override>, VmmError> {
    let vm = kvm.create_vm().map_err(kvm_err("KVM_CREATE_VM"))?;
    let mem = super::builder::create_memory(&vm, PROBE_RAM)?;
    let mut vcpu = vm.create_vcpu(0).map_err(kvm_err("KVM_CREATE_VCPU"))?;
    vcpu.set_cpuid2(table).map_err(kvm_err("KVM_SET_CPUID2"))?;
    boot::write(&mem, HIGH_MEM_START, &PROBE_CODE)?;
    let entry = Entry { mode: Mode::Protected, rip: HIGH_MEM_START, rax: 0, rbx: 0, rdi: 0, rsi: 0, rsp: 0x8_0000 };
    let mut found = Vec::new();
    for e in table.as_slice() {
        let guest = run_cpuid(&mut vcpu, &mem, &entry, e)?;
        let want = [e.eax, e.ebx, e.ecx, e.edx];
        for (register, (&table, &guest)) in want.iter().zip(&guest).enumerate() {
            let per_vcpu = per_vcpu_state(e.function, e.index, register);
            if (table ^ guest) & !per_vcpu != 0 {
                found.push(Override { leaf: e.function, subleaf: e.index, register, table, guest });
            }
        }
    }
    Ok(found)
}

/// Bits CPUID computes from the vCPU's own state rather than from the table (SDM Vol. 2A, CPUID):
/// the initial APIC ID (leaf 1 EBX[31:24]) and x2APIC ID (leaves 0xB and 0x1F EDX), OSXSAVE
/// (leaf 1 ECX[27], CR4.OSXSAVE), the local APIC's presence (leaf 1 EDX[9], IA32_APIC_BASE.EN),
/// OSPKE (leaf 7 ECX[4], CR4.PKE) and the XSAVE area sizes for the enabled features (leaf 0xD
/// sub-leaves 0 and 1, EBX: XCR0 and IA32_XSS).
pub fn per_vcpu_state(leaf: u32, subleaf: u32, register: usize) -> u32 {
    match (leaf, subleaf, register) {
        (1, _, 1) => 0xFF00_0000,
        (1, _, 2) => 1 << 27,
        (1, _, 3) => 1 << 9,
        (7, 0, 2) => 1 << 4,
        (0xD, 0 | 1, 1) => u32::MAX,
        (0xB | 0x1F, _, 3) => u32::MAX,
        _ => 0,
    }
}

/// Runs `cpuid; hlt` with EAX/ECX = `e`'s leaf and sub-leaf; returns EAX..EDX.
fn run_cpuid(
    vcpu: &mut kvm_ioctls::VcpuFd,
    mem: &GuestMemoryMmap,
    entry: &Entry,
    e: &kvm_cpuid_entry2,
) -> Result<[u32; 4], VmmError> {
    boot::enter(vcpu, mem, PROBE_RAM, &Entry { rax: u64::from(e.function), ..*entry })?;
    let mut regs = vcpu.get_regs().map_err(kvm_err("KVM_GET_REGS"))?;
    regs.rcx = u64::from(e.index);
    vcpu.set_regs(&regs).map_err(kvm_err("KVM_SET_REGS"))?;
    loop {
        match vcpu.run().map_err(kvm_err("KVM_RUN"))? {
            VcpuExit::Hlt => break,
            VcpuExit::Intr => continue,
            other => {
                return Err(VmmError::Guest(format!(
                    "the CPUID probe stopped on {other:?} instead of HLT (leaf {:#x})",
                    e.function
                )))
            }
        }
    }
    let r = vcpu.get_regs().map_err(kvm_err("KVM_GET_REGS"))?;
    Ok([r.rax as u32, r.rbx as u32, r.rcx as u32, r.rdx as u32])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn o(leaf: u32, register: usize, table: u32, guest: u32) -> Override {
        Override { leaf, subleaf: 0, register, table, guest }
    }

    #[test]
    fn an_override_names_the_bits_it_forces_each_way() {
        let popcnt_on = o(1, 2, 0x8000_0000, 0x8080_0000);
        assert_eq!(popcnt_on.forced_on(), 1 << 23);
        assert_eq!(popcnt_on.forced_off(), 0);
        assert_eq!(popcnt_on.named_bits(), ["POPCNT"]);
        assert_eq!(
            popcnt_on.describe(),
            "CPUID.(EAX=01H,ECX=0):ECX bits 23 (POPCNT) forced on (table 0x80000000, guest 0x80800000)"
        );
        let mixed = o(7, 1, 1 << 20 | 1 << 1, 1 << 7 | 1 << 1);
        assert_eq!(
            mixed.describe(),
            "CPUID.(EAX=07H,ECX=0):EBX bits 7 (SMEP) forced on, bits 20 (SMAP) forced off (table 0x00100002, guest 0x00000082)"
        );
    }

    #[test]
    fn only_what_a_profile_sets_counts_as_touching_it() {
        assert!(!o(1, 2, 0, 1 << 23).touches_the_profile(), "POPCNT is not the profile's");
        assert!(o(1, 2, 0, 1 << 15).touches_the_profile(), "PDCM is");
        assert!(o(1, 3, 0, 1 << 21).touches_the_profile(), "DS is");
        assert!(!o(1, 3, 0, 1 << 28).touches_the_profile(), "HTT is not");
        assert!(o(0xA, 0, 0x0730_0404, 0).touches_the_profile(), "leaf 0x0A is");
        assert!(o(1, 0, 0x506E3, 0x306C3).touches_the_profile(), "the signature is");
        assert!(!o(7, 1, 0, 1 << 20).touches_the_profile(), "SMAP is not");
    }

    #[test]
    fn state_dependent_bits_are_not_overrides() {
        assert_eq!(per_vcpu_state(1, 0, 2), 1 << 27, "OSXSAVE follows CR4");
        assert_eq!(per_vcpu_state(0xD, 0, 1), u32::MAX, "the XSAVE size follows XCR0");
        assert_eq!(per_vcpu_state(0xD, 2, 1), 0, "a component's offset does not");
        assert_eq!(per_vcpu_state(0xA, 0, 0), 0);
    }
}
