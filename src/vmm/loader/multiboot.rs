//! Multiboot v1: header detection, loading (ELF or the a.out kludge), and the information
//! structure, built the way QEMU's `-kernel` does.
use super::{check_range, e820, elf, write_cmdline, write_mem, Kernel, KernelError, Module};
use crate::vmm::boot::{Entry, Mode};
use crate::vmm::layout::*;
use vm_memory::GuestMemoryMmap;

const HEADER_MAGIC: u32 = 0x1BAD_B002;
/// EAX at entry (Multiboot spec 3.2).
pub const MULTIBOOT_BOOTLOADER_MAGIC: u32 = 0x2BAD_B002;
const SEARCH_LIMIT: usize = 8192;
const FLAG_PAGE_ALIGN: u32 = 1 << 0;
const FLAG_MEMORY_INFO: u32 = 1 << 1;
const FLAG_VIDEO_MODE: u32 = 1 << 2;
const FLAG_AOUT_KLUDGE: u32 = 1 << 16;
/// Requirement bits (0-15) emon satisfies: page-aligned modules, memory info; a video-mode
/// request is ignored as QEMU does.
const SUPPORTED_REQUIREMENTS: u32 = FLAG_PAGE_ALIGN | FLAG_MEMORY_INFO | FLAG_VIDEO_MODE;

// multiboot_info.flags bits (Multiboot spec 3.3).
const INFO_MEMORY: u32 = 1 << 0;
const INFO_BOOTDEV: u32 = 1 << 1;
const INFO_CMDLINE: u32 = 1 << 2;
const INFO_MODS: u32 = 1 << 3;
const INFO_MMAP: u32 = 1 << 6;
const INFO_LOADER_NAME: u32 = 1 << 9;

/// A multiboot header found in a kernel image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MultibootHeader {
    /// File offset of the header.
    pub offset: usize,
    pub flags: u32,
    /// The a.out kludge address fields, when flags bit 16 is set.
    pub addresses: Option<[u32; 5]>,
}

fn u32_at(b: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(off..off + 4)?.try_into().ok()?))
}

impl MultibootHeader {
    /// Finds a header with a valid checksum, 32-bit aligned in the first 8 KiB (spec 3.1.1).
    pub fn find(image: &[u8]) -> Option<MultibootHeader> {
        (0..SEARCH_LIMIT.min(image.len()).saturating_sub(11)).step_by(4).find_map(|offset| {
            let magic = u32_at(image, offset)?;
            let flags = u32_at(image, offset + 4)?;
            let checksum = u32_at(image, offset + 8)?;
            if magic != HEADER_MAGIC || magic.wrapping_add(flags).wrapping_add(checksum) != 0 {
                return None;
            }
            let addresses = if flags & FLAG_AOUT_KLUDGE != 0 {
                let f = |i: usize| u32_at(image, offset + 12 + 4 * i);
                Some([f(0)?, f(1)?, f(2)?, f(3)?, f(4)?])
            } else {
                None
            };
            Some(MultibootHeader { offset, flags, addresses })
        })
    }
}

pub fn load(
    mem: &GuestMemoryMmap,
    ram_size: u64,
    kernel: &Kernel,
    header: &MultibootHeader,
    args: &str,
    modules: &[Module],
) -> Result<Entry, KernelError> {
    let required = header.flags & 0xFFFF;
    if required & !SUPPORTED_REQUIREMENTS != 0 {
        return Err(KernelError::MultibootFlags(header.flags));
    }
    let (entry, kernel_end) = match header.addresses {
        Some(a) => load_aout_kludge(mem, ram_size, &kernel.image, header.offset, a)?,
        None => {
            let image = elf::parse(&kernel.image)?;
            let end = elf::load(mem, ram_size, &kernel.image, &image)?;
            (image.entry, end)
        }
    };
    if entry > u32::MAX as u64 {
        return Err(KernelError::MultibootAddresses(format!("entry {entry:#x} is above 4 GiB")));
    }
    // QEMU passes "<kernel path> <user arguments>" (hw/i386/multiboot.c).
    write_cmdline(mem, CMDLINE_ADDR, &format!("{} {}", kernel.name, args))?;
    let info = build_info(mem, ram_size, kernel_end, modules)?;
    write_mem(mem, MB_INFO_ADDR, &info)?;
    Ok(Entry {
        mode: Mode::Protected,
        rip: entry,
        rax: MULTIBOOT_BOOTLOADER_MAGIC as u64,
        rbx: MB_INFO_ADDR,
        rdi: 0,
        rsi: 0,
        rsp: BOOT_STACK_TOP,
    })
}

/// Flags bit 16: load the file from `header_addr - (header offset)` as the header's address
/// fields say (spec 3.1.3).
fn load_aout_kludge(
    mem: &GuestMemoryMmap,
    ram_size: u64,
    image: &[u8],
    offset: usize,
    [header_addr, load_addr, load_end_addr, bss_end_addr, entry_addr]: [u32; 5],
) -> Result<(u64, u64), KernelError> {
    let bad = |m: String| Err(KernelError::MultibootAddresses(m));
    if load_addr > header_addr {
        return bad(format!("load_addr {load_addr:#x} is above header_addr {header_addr:#x}"));
    }
    let file_start = (offset as u64).checked_sub((header_addr - load_addr) as u64);
    let Some(file_start) = file_start else {
        return bad(format!(
            "header_addr - load_addr ({:#x}) exceeds the header's file offset {offset:#x}",
            header_addr - load_addr
        ));
    };
    let load_end =
        if load_end_addr == 0 { load_addr as u64 + (image.len() as u64 - file_start) } else { load_end_addr as u64 };
    if load_end < load_addr as u64 || file_start + (load_end - load_addr as u64) > image.len() as u64 {
        return bad(format!("load_end_addr {load_end:#x} is outside the file"));
    }
    let end = if bss_end_addr == 0 { load_end } else { bss_end_addr as u64 };
    if end < load_end {
        return bad(format!("bss_end_addr {end:#x} is below load_end_addr {load_end:#x}"));
    }
    check_range("kernel image", load_addr as u64, end - load_addr as u64, ram_size)?;
    let data = &image[file_start as usize..(file_start + load_end - load_addr as u64) as usize];
    write_mem(mem, load_addr as u64, data)?;
    write_mem(mem, load_end, &vec![0; (end - load_end) as usize])?;
    if !(load_addr as u64..end).contains(&(entry_addr as u64)) {
        return Err(KernelError::EntryOutside(entry_addr as u64));
    }
    Ok((entry_addr as u64, end))
}

fn build_info(
    mem: &GuestMemoryMmap,
    ram_size: u64,
    kernel_end: u64,
    modules: &[Module],
) -> Result<Vec<u8>, KernelError> {
    let mut strings = MB_STRINGS_ADDR;
    let mut put_string = |s: &str| -> Result<u32, KernelError> {
        let addr = strings;
        let mut bytes = s.as_bytes().to_vec();
        bytes.push(0);
        if addr + bytes.len() as u64 > MB_STRINGS_END {
            return Err(KernelError::Module(s.into(), "module names are too long for the boot area".into()));
        }
        write_mem(mem, addr, &bytes)?;
        strings += bytes.len() as u64;
        Ok(addr as u32)
    };
    let loader_name = put_string("emon")?;

    // Modules go page-aligned after the kernel.
    let mut next = (kernel_end + 0xFFF) & !0xFFF;
    let mut mods = Vec::new();
    for m in modules {
        check_range(&format!("module {}", m.name), next, m.data.len() as u64, ram_size)
            .map_err(|e| KernelError::Module(m.name.clone(), e.to_string()))?;
        write_mem(mem, next, &m.data)?;
        let name = put_string(&m.name)?;
        for v in [next as u32, (next + m.data.len() as u64) as u32, name, 0] {
            mods.extend_from_slice(&v.to_le_bytes());
        }
        next = (next + m.data.len() as u64 + 0xFFF) & !0xFFF;
    }
    if mods.len() as u64 > MB_STRINGS_ADDR - MB_MODS_ADDR {
        return Err(KernelError::Module("(all)".into(), "too many modules".into()));
    }
    write_mem(mem, MB_MODS_ADDR, &mods)?;

    // The multiboot memory map's types are E820's (1 available, 2 reserved).
    let mut mmap = Vec::new();
    for r in e820::map(ram_size) {
        mmap.extend_from_slice(&20u32.to_le_bytes());
        mmap.extend_from_slice(&r.addr.to_le_bytes());
        mmap.extend_from_slice(&r.size.to_le_bytes());
        mmap.extend_from_slice(&r.kind.to_le_bytes());
    }
    write_mem(mem, MB_MMAP_ADDR, &mmap)?;

    let mut info = [0u32; 22];
    info[0] = INFO_MEMORY | INFO_BOOTDEV | INFO_CMDLINE | INFO_MODS | INFO_MMAP | INFO_LOADER_NAME;
    info[1] = (LOW_MEM_END >> 10) as u32; // mem_lower, KiB
    info[2] = ((ram_size - HIGH_MEM_START) >> 10) as u32; // mem_upper, KiB above 1 MiB
    info[3] = 0x8000_FFFF; // boot_device, as QEMU
    info[4] = CMDLINE_ADDR as u32;
    info[5] = modules.len() as u32;
    info[6] = MB_MODS_ADDR as u32;
    info[11] = mmap.len() as u32;
    info[12] = MB_MMAP_ADDR as u32;
    info[16] = loader_name;
    Ok(info.iter().flat_map(|v| v.to_le_bytes()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(flags: u32) -> Vec<u8> {
        let mut v = vec![0u8; 64];
        v.extend_from_slice(&HEADER_MAGIC.to_le_bytes());
        v.extend_from_slice(&flags.to_le_bytes());
        v.extend_from_slice(&(0u32.wrapping_sub(HEADER_MAGIC).wrapping_sub(flags)).to_le_bytes());
        v.extend_from_slice(&[0; 20]);
        v
    }

    #[test]
    fn finds_an_aligned_header_with_a_valid_checksum() {
        let h = MultibootHeader::find(&header(3)).expect("header");
        assert_eq!((h.offset, h.flags, h.addresses), (64, 3, None));
        assert!(MultibootHeader::find(&header(1 << 16)).unwrap().addresses.is_some());
    }

    #[test]
    fn ignores_a_bad_checksum_or_misalignment() {
        let mut bad = header(3);
        bad[72] ^= 1;
        assert_eq!(MultibootHeader::find(&bad), None);
        let mut shifted = vec![0u8; 2];
        shifted.extend(header(3));
        assert_eq!(MultibootHeader::find(&shifted), None);
    }

    #[test]
    fn only_searches_the_first_8_kib() {
        let mut late = vec![0u8; 8192];
        late.extend(header(3));
        assert_eq!(MultibootHeader::find(&late), None);
    }
}
