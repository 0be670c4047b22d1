//! Identity-mapping page tables for long-mode entry: all guest RAM plus the local APIC page,
//! with 2 MiB pages.
use super::super::layout::*;
use vm_memory::GuestMemoryMmap;

const PRESENT: u64 = 1 << 0;
const WRITABLE: u64 = 1 << 1;
const PWT: u64 = 1 << 3;
const PCD: u64 = 1 << 4;
const PAGE_SIZE_2M: u64 = 1 << 7;
const HUGE: u64 = 2 << 20;

/// The PDE for guest-physical 2 MiB page `n`, if it is mapped.
pub fn pde(n: u64, ram_size: u64) -> Option<u64> {
    let addr = n * HUGE;
    if addr < ram_size {
        Some(addr | PRESENT | WRITABLE | PAGE_SIZE_2M)
    } else if addr == APIC_BASE & !(HUGE - 1) {
        Some(addr | PRESENT | WRITABLE | PAGE_SIZE_2M | PCD | PWT)
    } else {
        None
    }
}

pub fn install(mem: &GuestMemoryMmap, ram_size: u64) -> Result<(), super::super::VmmError> {
    super::write(mem, PML4_ADDR, &(PDPT_ADDR | PRESENT | WRITABLE).to_le_bytes())?;
    let pdpt: Vec<u8> = (0..4u64).flat_map(|i| ((PD_ADDR + i * 0x1000) | PRESENT | WRITABLE).to_le_bytes()).collect();
    super::write(mem, PDPT_ADDR, &pdpt)?;
    let pds: Vec<u8> = (0..4 * 512u64).flat_map(|n| pde(n, ram_size).unwrap_or(0).to_le_bytes()).collect();
    super::write(mem, PD_ADDR, &pds)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_ram_and_the_apic_only() {
        let ram = 64 << 20;
        assert_eq!(pde(0, ram), Some(0x83));
        assert_eq!(pde(31, ram), Some((31 << 21) | 0x83));
        assert_eq!(pde(32, ram), None);
        assert_eq!(pde(0xFEE0_0000 >> 21, ram), Some(0xFEE0_0000 | 0x9B));
    }
}
