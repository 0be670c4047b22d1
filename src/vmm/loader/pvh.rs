//! Linux vmlinux ELF images with a PVH entry point (the Xen PVH boot ABI, xen/include/public/
//! arch-x86/hvm/start_info.h and docs/misc/pvh.pandoc): the ELF is loaded at its physical
//! addresses with linux-loader's `Elf`, `hvm_start_info` points at the command line, the memory
//! map and the initrd as module 0, and the vCPU starts at the XEN_ELFNOTE_PHYS32_ENTRY address
//! in 32-bit protected mode, paging off, with EBX = the start info.
use super::elf::Note;
use super::{check_range, e820, elf, initrd, write_cmdline, Kernel, KernelError, Module};
use crate::vmm::boot::{Entry, Mode};
use crate::vmm::layout::*;
use linux_loader::configurator::pvh::PvhBootConfigurator;
use linux_loader::configurator::{BootConfigurator, BootParams};
use linux_loader::loader::elf::start_info::{hvm_memmap_table_entry, hvm_modlist_entry, hvm_start_info};
use linux_loader::loader::{Elf, KernelLoader};
use std::io::Cursor;
use vm_memory::{GuestAddress, GuestMemoryMmap};

/// XEN_ELFNOTE_PHYS32_ENTRY: the 32-bit physical entry point of a PVH kernel.
pub const XEN_ELFNOTE_PHYS32_ENTRY: u32 = 18;
/// XEN_HVM_START_MAGIC_VALUE.
pub const XEN_HVM_START_MAGIC_VALUE: u32 = 0x336E_C578;
/// Version 1 of the start info has the memory map.
const START_INFO_VERSION: u32 = 1;
/// Linux's COMMAND_LINE_SIZE on x86 (less the NUL); PVH kernels declare no limit of their own.
const COMMAND_LINE_SIZE: usize = 2047;
/// The highest address an initrd may end at: the start info holds 64-bit addresses, but Linux's
/// PVH code reads it before it maps memory above 4 GiB.
const INITRD_ADDR_MAX: u64 = 0xFFFF_FFFF;

// The start info (56 bytes), one module (32 bytes) and the memory map (24 bytes an entry) do not
// overlap, and all fit in the start info's page.
const _: () = assert!(PVH_START_INFO_ADDR + 56 <= PVH_MODLIST_ADDR && PVH_MODLIST_ADDR + 32 <= PVH_MEMMAP_ADDR);
const _: () = assert!(PVH_MEMMAP_ADDR + 8 * 24 <= PVH_START_INFO_ADDR + 0x1000);

/// The PVH entry point among an ELF's notes: the descriptor of the "Xen" note of type 18, a
/// 32-bit address (or a 64-bit one, as some kernels write it).
pub fn entry_point(notes: &[Note]) -> Option<u64> {
    let n = notes.iter().find(|n| n.name == b"Xen" && n.kind == XEN_ELFNOTE_PHYS32_ENTRY)?;
    match n.desc.len() {
        4 => Some(u64::from(u32::from_le_bytes(n.desc[..4].try_into().ok()?))),
        8 => Some(u64::from_le_bytes(n.desc[..8].try_into().ok()?)),
        _ => None,
    }
}

/// The start info for a command line at `cmdline_addr`, `memmap_entries` memory-map entries and,
/// if there is one, the initrd as the one module.
pub fn start_info(cmdline_addr: u64, memmap_entries: usize, has_initrd: bool) -> hvm_start_info {
    hvm_start_info {
        magic: XEN_HVM_START_MAGIC_VALUE,
        version: START_INFO_VERSION,
        flags: 0,
        nr_modules: u32::from(has_initrd),
        modlist_paddr: if has_initrd { PVH_MODLIST_ADDR } else { 0 },
        cmdline_paddr: cmdline_addr,
        rsdp_paddr: 0,
        memmap_paddr: PVH_MEMMAP_ADDR,
        memmap_entries: memmap_entries as u32,
        reserved: 0,
    }
}

/// The memory map as `hvm_memmap_table_entry`s.
pub fn memmap(map: &[e820::Region]) -> Vec<hvm_memmap_table_entry> {
    map.iter().map(|r| hvm_memmap_table_entry { addr: r.addr, size: r.size, type_: r.kind, reserved: 0 }).collect()
}

/// Loads a PVH kernel (an ELF64 `image` with the PVH note at `entry`), its command line and
/// initrd, and writes the start info; returns the 32-bit entry state.
pub fn load(
    mem: &GuestMemoryMmap,
    ram_size: u64,
    kernel: &Kernel,
    image: &elf::Image,
    entry: u64,
    cmdline: &str,
    initrd: Option<&Module>,
) -> Result<Entry, KernelError> {
    for (i, s) in image.segments.iter().enumerate() {
        check_range(&format!("segment {i}"), s.paddr, s.memsz, ram_size)?;
    }
    let loaded = Elf::load(mem, None, &mut Cursor::new(&kernel.image), Some(GuestAddress(HIGH_MEM_START)))
        .map_err(|e| KernelError::Load(e.to_string()))?;
    if cmdline.len() > COMMAND_LINE_SIZE {
        return Err(KernelError::LinuxCmdlineTooLong { len: cmdline.len(), max: COMMAND_LINE_SIZE });
    }
    write_cmdline(mem, CMDLINE_ADDR, cmdline)?;
    let initrd = initrd.map(|i| initrd::load(mem, i, ram_size, INITRD_ADDR_MAX, loaded.kernel_end)).transpose()?;
    let map = memmap(&e820::map(ram_size));
    let info = start_info(CMDLINE_ADDR, map.len(), initrd.is_some());
    let mut params = BootParams::new(&info, GuestAddress(PVH_START_INFO_ADDR));
    params.set_sections(&map, GuestAddress(PVH_MEMMAP_ADDR));
    if let Some((paddr, size)) = initrd {
        let module = hvm_modlist_entry { paddr, size, cmdline_paddr: 0, reserved: 0 };
        params.set_modules(&[module], GuestAddress(PVH_MODLIST_ADDR));
    }
    PvhBootConfigurator::write_bootparams::<GuestMemoryMmap>(&params, mem)
        .map_err(|e| KernelError::Memory(e.to_string()))?;
    // The ABI gives no stack; emon's boot stack is there anyway, as for its other kernels.
    Ok(Entry {
        mode: Mode::Protected,
        rip: entry,
        rax: 0,
        rbx: PVH_START_INFO_ADDR,
        rdi: 0,
        rsi: 0,
        rsp: BOOT_STACK_TOP,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::ByteValued;

    fn note(name: &[u8], kind: u32, desc: &[u8]) -> Note {
        Note { name: name.to_vec(), kind, desc: desc.to_vec() }
    }

    #[test]
    fn the_entry_is_the_xen_note_of_type_18() {
        let notes = [note(b"GNU", 3, &[1; 20]), note(b"Xen", 18, &0x100_0280u32.to_le_bytes())];
        assert_eq!(entry_point(&notes), Some(0x100_0280));
        assert_eq!(entry_point(&[note(b"Xen", 18, &0x1234u64.to_le_bytes())]), Some(0x1234));
        assert_eq!(entry_point(&[note(b"Xen", 17, &[0; 4])]), None);
        assert_eq!(entry_point(&[note(b"Linux", 18, &[0; 4])]), None);
    }

    #[test]
    fn start_info_has_the_magic_the_map_and_the_initrd_module() {
        let s = start_info(CMDLINE_ADDR, 4, true);
        let b = s.as_slice();
        assert_eq!(b.len(), 56);
        assert_eq!(u32::from_le_bytes(b[0..4].try_into().unwrap()), 0x336E_C578);
        assert_eq!(u32::from_le_bytes(b[4..8].try_into().unwrap()), 1);
        assert_eq!(u32::from_le_bytes(b[12..16].try_into().unwrap()), 1, "nr_modules");
        assert_eq!(u64::from_le_bytes(b[16..24].try_into().unwrap()), PVH_MODLIST_ADDR);
        assert_eq!(u64::from_le_bytes(b[24..32].try_into().unwrap()), CMDLINE_ADDR);
        assert_eq!(u64::from_le_bytes(b[40..48].try_into().unwrap()), PVH_MEMMAP_ADDR);
        assert_eq!(u32::from_le_bytes(b[48..52].try_into().unwrap()), 4);
        let none = start_info(CMDLINE_ADDR, 4, false);
        assert_eq!(({ none.nr_modules }, { none.modlist_paddr }), (0, 0));
    }

    #[test]
    fn the_memmap_mirrors_the_e820_map() {
        let m = memmap(&e820::map(64 << 20));
        assert_eq!(m.len(), 4);
        assert_eq!(({ m[3].addr }, { m[3].size }, { m[3].type_ }), (0x10_0000, 63 << 20, e820::RAM));
        assert_eq!({ m[1].type_ }, e820::RESERVED);
    }
}
