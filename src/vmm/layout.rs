//! Guest-physical memory layout used by emon's boot paths (documented in the README).
//!
//! ```text
//! 0x0000_0500  GDT (null, code, data, TSS)
//! 0x0000_1000  PML4, 0x2000 PDPT, 0x3000-0x6FFF four page directories (2 MiB pages, 4 GiB)
//! 0x0000_7000  command line, NUL-terminated (at most 4 KiB)
//! 0x0000_8000  multiboot information structure, memory map and module list
//! 0x0000_A000  Linux boot_params (the "zero page", 4 KiB) for bzImage kernels
//! 0x0000_B000  PVH hvm_start_info, 0xB040 its module list, 0xB080 its memory map
//! 0x0008_0000  top of the boot stack (long-mode entry RSP)
//! 0x0009_FC00  the MP table, in the EBDA (MP spec 4.1)
//! 0x0010_0000  kernels load here or above
//! 0xFEC0_0000  I/O APIC (KVM's in-kernel one)
//! 0xFEE0_0000  local APIC (identity-mapped, uncached)
//! ```
pub const GDT_ADDR: u64 = 0x500;
pub const PML4_ADDR: u64 = 0x1000;
pub const PDPT_ADDR: u64 = 0x2000;
pub const PD_ADDR: u64 = 0x3000;
pub const CMDLINE_ADDR: u64 = 0x7000;
pub const CMDLINE_MAX: usize = 0x1000;
pub const MB_INFO_ADDR: u64 = 0x8000;
pub const MB_MMAP_ADDR: u64 = 0x8100;
pub const MB_MODS_ADDR: u64 = 0x8400;
pub const MB_STRINGS_ADDR: u64 = 0x9000;
pub const MB_STRINGS_END: u64 = 0xA000;
pub const ZERO_PAGE_ADDR: u64 = 0xA000;
pub const PVH_START_INFO_ADDR: u64 = 0xB000;
pub const PVH_MODLIST_ADDR: u64 = 0xB040;
pub const PVH_MEMMAP_ADDR: u64 = 0xB080;
pub const BOOT_STACK_TOP: u64 = 0x8_0000;
/// Everything below this belongs to emon's boot structures; kernels may not load there.
pub const BOOT_AREA_END: u64 = 0x8_0000;
/// End of conventional memory reported to multiboot kernels (mem_lower = 639 KiB).
pub const LOW_MEM_END: u64 = 0x9_FC00;
pub const HIGH_MEM_START: u64 = 0x10_0000;
pub const APIC_BASE: u64 = 0xFEE0_0000;
/// The I/O APIC KVM_CREATE_IRQCHIP creates.
pub const IOAPIC_BASE: u64 = 0xFEC0_0000;
/// The MP floating pointer and configuration table: the first KiB of the EBDA, which the memory
/// map reserves.
pub const MP_TABLE_ADDR: u64 = LOW_MEM_END;
/// Guest RAM must end below the 32-bit MMIO hole (the APIC lives at the top of it).
pub const MAX_RAM: u64 = 0xC000_0000;
pub const MIN_RAM: u64 = 2 << 20;
