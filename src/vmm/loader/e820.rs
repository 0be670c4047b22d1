//! The guest-physical memory map given to Linux: E820 entries in `boot_params` for bzImage
//! kernels, `hvm_memmap_table_entry`s for PVH kernels (the same types: 1 RAM, 2 reserved). It
//! is the map multiboot kernels get, as QEMU's BIOS reports it: conventional memory up to the
//! EBDA, the EBDA and VGA hole, the BIOS area, then RAM from 1 MiB to the end of guest RAM.
use crate::vmm::layout::{HIGH_MEM_START, LOW_MEM_END};

/// E820_TYPE_RAM, XEN_HVM_MEMMAP_TYPE_RAM.
pub const RAM: u32 = 1;
/// E820_TYPE_RESERVED, XEN_HVM_MEMMAP_TYPE_RESERVED.
pub const RESERVED: u32 = 2;

/// One entry of the memory map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    pub addr: u64,
    pub size: u64,
    pub kind: u32,
}

/// The memory map of a guest with `ram_size` bytes of RAM from address 0.
pub fn map(ram_size: u64) -> Vec<Region> {
    vec![
        Region { addr: 0, size: LOW_MEM_END, kind: RAM },
        Region { addr: LOW_MEM_END, size: 0xA_0000 - LOW_MEM_END, kind: RESERVED },
        Region { addr: 0xF_0000, size: 0x1_0000, kind: RESERVED },
        Region { addr: HIGH_MEM_START, size: ram_size - HIGH_MEM_START, kind: RAM },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ram_below_the_ebda_and_from_1_mib_to_the_end() {
        let m = map(128 << 20);
        let ram: u64 = m.iter().filter(|r| r.kind == RAM).map(|r| r.size).sum();
        assert_eq!(ram, 0x9_FC00 + (127 << 20));
        assert_eq!(m.last().unwrap().addr + m.last().unwrap().size, 128 << 20);
        for w in m.windows(2) {
            assert!(w[0].addr + w[0].size <= w[1].addr, "sorted and disjoint: {w:?}");
        }
        assert!(m.iter().all(|r| r.kind == RESERVED || r.addr + r.size <= 0xA_0000 || r.addr >= 0x10_0000));
    }
}
