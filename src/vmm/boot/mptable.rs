//! The MP configuration table (Intel MultiProcessor Specification 1.4, chapter 4) that PC firmware
//! leaves in the EBDA: the one CPU, the ISA bus, the I/O APIC KVM_CREATE_IRQCHIP put at
//! 0xFEC00000, and how the ISA interrupts reach it. Without it Linux finds no I/O APIC and runs
//! its devices through the 8259 PIC in virtual wire mode (LINT0 as ExtINT), which no platform
//! these profiles name does (README, "The guest's platform").
use super::super::layout::{APIC_BASE, IOAPIC_BASE, MP_TABLE_ADDR};
use vm_memory::GuestMemoryMmap;

/// The floating pointer's and the table header's signatures (MP spec 4.1, 4.2).
const FLOATING_SIGNATURE: &[u8; 4] = b"_MP_";
const TABLE_SIGNATURE: &[u8; 4] = b"PCMP";
/// MP spec revision 1.4.
const SPEC_REV: u8 = 4;
/// Entry types (MP spec Table 4-3), each entry's length after them.
const PROCESSOR: u8 = 0;
const BUS: u8 = 1;
const IOAPIC: u8 = 2;
const IO_INTERRUPT: u8 = 3;
const LOCAL_INTERRUPT: u8 = 4;
/// Interrupt types (MP spec Table 4-8).
const INT: u8 = 0;
const NMI: u8 = 1;
const EXTINT: u8 = 3;
/// CPU flags (MP spec Table 4-5): enabled, the bootstrap processor.
const CPU_EN: u8 = 1 << 0;
const CPU_BP: u8 = 1 << 1;
/// I/O APIC flags: enabled.
const IOAPIC_EN: u8 = 1 << 0;
/// The local APIC version KVM's in-kernel APIC reports (its version register, bits 7:0), and
/// its I/O APIC's (the I/O APIC version register).
const LAPIC_VERSION: u8 = 0x14;
const IOAPIC_VERSION: u8 = 0x11;
/// The I/O APIC's ID: the next after the one CPU's local APIC ID 0.
const IOAPIC_ID: u8 = 1;
const ISA_BUS_ID: u8 = 0;
/// Every local APIC (MP spec Table 4-10).
const ALL_LAPICS: u8 = 0xFF;
/// IRQ 2 is the PICs' cascade, which reaches no I/O APIC input. The others reach the INTIN of
/// their number, as KVM's default GSI routing wires them: the PIT's IRQ 0 too, which PC chipsets
/// wire to INTIN2 instead (and say so in their tables).
const CASCADE_IRQ: u8 = 2;

/// The floating pointer at `MP_TABLE_ADDR` and the configuration table right after it, for a CPU
/// whose CPUID.01H gives `signature` (EAX) and `features` (EDX).
pub fn bytes(signature: u32, features: u32) -> Vec<u8> {
    let mut entries = Vec::new();
    let mut count = 0u16;
    let mut entry = |e: &[u8]| {
        entries.extend_from_slice(e);
        count += 1;
    };
    let mut cpu = vec![PROCESSOR, 0, LAPIC_VERSION, CPU_EN | CPU_BP];
    cpu.extend_from_slice(&signature.to_le_bytes());
    cpu.extend_from_slice(&features.to_le_bytes());
    cpu.extend_from_slice(&[0; 8]);
    entry(&cpu);
    entry(&[BUS, ISA_BUS_ID, b'I', b'S', b'A', b' ', b' ', b' ']);
    let mut ioapic = vec![IOAPIC, IOAPIC_ID, IOAPIC_VERSION, IOAPIC_EN];
    ioapic.extend_from_slice(&(IOAPIC_BASE as u32).to_le_bytes());
    entry(&ioapic);
    // Flags 0: polarity and trigger conform to the ISA bus (active high, edge).
    for irq in (0..16u8).filter(|&i| i != CASCADE_IRQ) {
        entry(&[IO_INTERRUPT, INT, 0, 0, ISA_BUS_ID, irq, IOAPIC_ID, irq]);
    }
    entry(&[LOCAL_INTERRUPT, EXTINT, 0, 0, ISA_BUS_ID, 0, ALL_LAPICS, 0]);
    entry(&[LOCAL_INTERRUPT, NMI, 0, 0, ISA_BUS_ID, 0, ALL_LAPICS, 1]);

    let table_addr = MP_TABLE_ADDR + 16;
    let mut table = Vec::with_capacity(44 + entries.len());
    table.extend_from_slice(TABLE_SIGNATURE);
    table.extend_from_slice(&((44 + entries.len()) as u16).to_le_bytes());
    table.push(SPEC_REV);
    table.push(0); // checksum, below
    table.extend_from_slice(b"EMON    "); // OEM ID
    table.extend_from_slice(b"KVM VM      "); // product ID
    table.extend_from_slice(&[0; 4]); // OEM table pointer
    table.extend_from_slice(&[0; 2]); // OEM table size
    table.extend_from_slice(&count.to_le_bytes());
    table.extend_from_slice(&(APIC_BASE as u32).to_le_bytes());
    table.extend_from_slice(&[0; 4]); // extended table length and checksum, reserved
    table.extend_from_slice(&entries);
    table[7] = checksum(&table);

    let mut floating = Vec::with_capacity(16);
    floating.extend_from_slice(FLOATING_SIGNATURE);
    floating.extend_from_slice(&(table_addr as u32).to_le_bytes());
    floating.push(1); // length in 16-byte paragraphs
    floating.push(SPEC_REV);
    floating.push(0); // checksum, below
                      // Feature bytes 1-5: 0, the configuration table is present; IMCRP clear, virtual wire mode.
    floating.extend_from_slice(&[0; 5]);
    floating[10] = checksum(&floating);
    floating.extend_from_slice(&table);
    floating
}

/// The byte that makes `b`'s bytes sum to zero (MP spec 4.1, 4.2).
fn checksum(b: &[u8]) -> u8 {
    0u8.wrapping_sub(b.iter().fold(0u8, |s, x| s.wrapping_add(*x)))
}

/// Writes the MP table for the CPUID table `cpuid` into guest RAM.
pub fn install(mem: &GuestMemoryMmap, cpuid: &[kvm_bindings::kvm_cpuid_entry2]) -> Result<(), super::super::VmmError> {
    let leaf1 = cpuid.iter().find(|e| e.function == 1);
    let (signature, features) = leaf1.map_or((0, 0), |e| (e.eax, e.edx));
    super::write(mem, MP_TABLE_ADDR, &bytes(signature, features))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u32_at(b: &[u8], at: usize) -> u32 {
        u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
    }

    #[test]
    fn the_floating_pointer_finds_a_table_whose_checksums_hold() {
        let b = bytes(0x1067A, 0xBFEBFBFF);
        assert_eq!(&b[..4], b"_MP_");
        assert_eq!(b.iter().take(16).fold(0u8, |s, x| s.wrapping_add(*x)), 0);
        let table = (u32_at(&b, 4) as u64 - MP_TABLE_ADDR) as usize;
        assert_eq!(table, 16);
        assert_eq!(&b[table..table + 4], b"PCMP");
        let len = u16::from_le_bytes([b[table + 4], b[table + 5]]) as usize;
        assert_eq!(table + len, b.len());
        assert_eq!(b[table..].iter().fold(0u8, |s, x| s.wrapping_add(*x)), 0);
        assert_eq!(u32_at(&b, table + 36), 0xFEE0_0000, "the local APIC's address");
        // It fits in the EBDA's 1 KiB, where Linux looks for it (MP spec 4.1).
        assert!(b.len() <= 0x400);
    }

    #[test]
    fn one_cpu_the_isa_bus_and_the_io_apic_with_each_irq_on_its_intin() {
        let b = bytes(0x506E3, 0x1234);
        let count = u16::from_le_bytes([b[16 + 34], b[16 + 35]]) as usize;
        let mut at = 16 + 44;
        let mut kinds = Vec::new();
        let mut routes = Vec::new();
        for _ in 0..count {
            let len = if b[at] == PROCESSOR { 20 } else { 8 };
            match b[at] {
                PROCESSOR => {
                    assert_eq!(b[at + 3], CPU_EN | CPU_BP);
                    assert_eq!((u32_at(&b, at + 4), u32_at(&b, at + 8)), (0x506E3, 0x1234));
                }
                IOAPIC => {
                    assert_eq!(b[at + 1], IOAPIC_ID);
                    assert_eq!(u32_at(&b, at + 4), 0xFEC0_0000);
                }
                IO_INTERRUPT => routes.push((b[at + 5], b[at + 7])),
                _ => {}
            }
            kinds.push(b[at]);
            at += len;
        }
        assert_eq!(at, b.len());
        // Entries in the order the spec requires (MP spec 4.3).
        assert!(kinds.windows(2).all(|w| w[0] <= w[1]), "{kinds:?}");
        assert_eq!(routes.len(), 15);
        assert!(routes.iter().all(|&(irq, intin)| irq == intin), "{routes:?}");
        assert!(!routes.iter().any(|&(irq, _)| irq == 2), "the cascade is no I/O APIC input");
    }
}
