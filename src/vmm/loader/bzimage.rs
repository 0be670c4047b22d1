//! Linux bzImage kernels, booted through the 64-bit boot protocol (Documentation/x86/boot.rst,
//! "64-bit BOOT PROTOCOL"): the protected-mode kernel is loaded at `code32_start` (1 MiB) with
//! linux-loader's `BzImage`, the zero page (`boot_params`) holds the image's setup header with
//! the command line, the initrd and the E820 map filled in, and the vCPU starts at `startup_64`
//! (the load address + 0x200) in long mode with RSI = the zero page.
use super::{check_range, e820, initrd, write_cmdline, Kernel, KernelError, Module};
use crate::vmm::boot::{Entry, Mode};
use crate::vmm::layout::*;
use linux_loader::configurator::linux::LinuxBootConfigurator;
use linux_loader::configurator::{BootConfigurator, BootParams};
use linux_loader::loader::bootparam::{boot_e820_entry, boot_params, setup_header};
use linux_loader::loader::{BzImage, KernelLoader};
use std::io::Cursor;
use vm_memory::{ByteValued, GuestAddress, GuestMemoryMmap};

/// Where the setup header starts, in the image and in `boot_params`.
pub const SETUP_HEADER_OFFSET: usize = 0x1F1;
/// `header`: "HdrS", at 0x202.
const HDRS: u32 = 0x5372_6448;
/// The first version with `cmdline_size` (and a relocatable kernel, 2.05).
const MIN_VERSION: u16 = 0x0206;
/// The first version with `xloadflags` (and so a declared 64-bit entry point).
const XLOADFLAGS_VERSION: u16 = 0x020C;
/// The first version with `pref_address` and `init_size`.
const INIT_SIZE_VERSION: u16 = 0x020A;
/// loadflags.LOADED_HIGH: the protected-mode code is loaded at 0x100000 (a bzImage, not a zImage).
const LOADED_HIGH: u8 = 1 << 0;
/// xloadflags.XLF_KERNEL_64: the kernel has the legacy 64-bit entry point at 0x200.
const XLF_KERNEL_64: u16 = 1 << 0;
/// `type_of_loader` for a boot loader without an assigned ID.
const LOADER_UNDEFINED: u8 = 0xFF;
/// `startup_64` is this far into the protected-mode kernel.
const STARTUP_64_OFFSET: u64 = 0x200;

/// The setup header of an image with "HdrS" at 0x202, or None: the image is no bzImage.
pub fn header(image: &[u8]) -> Option<setup_header> {
    let mut bytes = [0u8; std::mem::size_of::<setup_header>()];
    let tail = image.get(SETUP_HEADER_OFFSET..)?;
    let n = tail.len().min(bytes.len());
    bytes[..n].copy_from_slice(&tail[..n]);
    let hdr = *setup_header::from_slice(&bytes)?;
    (hdr.header == HDRS).then_some(hdr)
}

/// Why emon cannot boot a bzImage with header `hdr`, or Ok if it can.
pub fn check(hdr: &setup_header) -> Result<(), String> {
    let version = hdr.version;
    let v = format!("{}.{:02}", version >> 8, version & 0xFF);
    if version < MIN_VERSION {
        return Err(format!("its boot protocol is version {v}, older than 2.06"));
    }
    if hdr.loadflags & LOADED_HIGH == 0 {
        return Err("it is a zImage (loadflags.LOADED_HIGH is clear)".into());
    }
    if version < XLOADFLAGS_VERSION {
        return Err(format!("its boot protocol {v} predates xloadflags (2.12), so it declares no 64-bit entry point"));
    }
    let xloadflags = hdr.xloadflags;
    if xloadflags & XLF_KERNEL_64 == 0 {
        return Err(format!("its xloadflags ({xloadflags:#x}) declare no 64-bit entry point: it is a 32-bit kernel"));
    }
    Ok(())
}

/// Where the kernel runs once it has decompressed itself (arch/x86/boot/compressed/head_64.S):
/// a relocatable kernel at its load address aligned up to `kernel_alignment`, but not below
/// `pref_address` (LOAD_PHYSICAL_ADDR); another at `pref_address`. It needs `init_size` bytes
/// there. None before protocol 2.10, which does not say.
pub fn run_area(hdr: &setup_header, load_addr: u64) -> Option<(u64, u64)> {
    if hdr.version < INIT_SIZE_VERSION {
        return None;
    }
    let pref = hdr.pref_address;
    let start = if hdr.relocatable_kernel != 0 {
        let align = u64::from(hdr.kernel_alignment.max(1));
        load_addr.div_ceil(align).saturating_mul(align).max(pref)
    } else {
        pref
    };
    Some((start, u64::from(hdr.init_size)))
}

/// The zero page: the image's setup header with the loader's fields filled in, and the memory
/// map.
pub fn boot_params(
    hdr: setup_header,
    cmdline_addr: u64,
    initrd: Option<(u64, u64)>,
    map: &[e820::Region],
) -> boot_params {
    let mut p = boot_params { hdr, ..Default::default() };
    p.hdr.type_of_loader = LOADER_UNDEFINED;
    p.hdr.cmd_line_ptr = cmdline_addr as u32;
    p.ext_cmd_line_ptr = (cmdline_addr >> 32) as u32;
    let (image, size) = initrd.unwrap_or((0, 0));
    p.hdr.ramdisk_image = image as u32;
    p.hdr.ramdisk_size = size as u32;
    p.ext_ramdisk_image = (image >> 32) as u32;
    p.ext_ramdisk_size = (size >> 32) as u32;
    for (slot, r) in p.e820_table.iter_mut().zip(map) {
        *slot = boot_e820_entry { addr: r.addr, size: r.size, r#type: r.kind };
    }
    p.e820_entries = map.len().min(p.e820_table.len()) as u8;
    p
}

/// Loads a bzImage whose header `check` accepted, its command line and initrd, and writes the
/// zero page; returns the 64-bit entry state.
pub fn load(
    mem: &GuestMemoryMmap,
    ram_size: u64,
    kernel: &Kernel,
    hdr: setup_header,
    cmdline: &str,
    initrd: Option<&Module>,
) -> Result<Entry, KernelError> {
    let setup_sects = u64::from(if hdr.setup_sects == 0 { 4 } else { hdr.setup_sects });
    let kernel_size = (kernel.image.len() as u64)
        .checked_sub((setup_sects + 1) * 512)
        .ok_or_else(|| KernelError::Load("the bzImage is shorter than its setup sectors".into()))?;
    let load_addr = u64::from(hdr.code32_start);
    check_range("the protected-mode kernel", load_addr, kernel_size, ram_size)?;
    let run = run_area(&hdr, load_addr);
    if let Some((start, size)) = run {
        check_range("the decompressed kernel (start to init_size)", start, size, ram_size)?;
    }
    let loaded = BzImage::load(mem, None, &mut Cursor::new(&kernel.image), Some(GuestAddress(HIGH_MEM_START)))
        .map_err(|e| KernelError::Load(e.to_string()))?;
    let max = usize::try_from(hdr.cmdline_size).unwrap_or(usize::MAX).min(CMDLINE_MAX - 1);
    if cmdline.len() > max {
        return Err(KernelError::LinuxCmdlineTooLong { len: cmdline.len(), max });
    }
    write_cmdline(mem, CMDLINE_ADDR, cmdline)?;
    let kernel_end = run.map_or(loaded.kernel_end, |(start, size)| loaded.kernel_end.max(start + size));
    let initrd =
        initrd.map(|i| initrd::load(mem, i, ram_size, u64::from(hdr.initrd_addr_max), kernel_end)).transpose()?;
    let params = boot_params(loaded.setup_header.unwrap_or(hdr), CMDLINE_ADDR, initrd, &e820::map(ram_size));
    LinuxBootConfigurator::write_bootparams::<GuestMemoryMmap>(
        &BootParams::new(&params, GuestAddress(ZERO_PAGE_ADDR)),
        mem,
    )
    .map_err(|e| KernelError::Memory(e.to_string()))?;
    Ok(Entry {
        mode: Mode::LinuxLong,
        rip: loaded.kernel_load.0 + STARTUP_64_OFFSET,
        rax: 0,
        rbx: 0,
        rdi: 0,
        rsi: ZERO_PAGE_ADDR,
        rsp: BOOT_STACK_TOP,
    })
}

#[cfg(test)]
pub mod tests {
    use super::*;

    /// A synthetic bzImage: `setup_sects` 4, the given header fields, and `payload` bytes of
    /// protected-mode kernel.
    pub fn image(version: u16, loadflags: u8, xloadflags: u16, payload: usize) -> Vec<u8> {
        let mut img = vec![0u8; 5 * 512 + payload];
        let hdr = setup_header {
            setup_sects: 4,
            boot_flag: 0xAA55,
            header: HDRS,
            version,
            loadflags,
            code32_start: 0x10_0000,
            initrd_addr_max: 0x7FFF_FFFF,
            kernel_alignment: 0x20_0000,
            relocatable_kernel: 1,
            xloadflags,
            cmdline_size: 2047,
            pref_address: 0x100_0000,
            init_size: 0x100_0000,
            ..Default::default()
        };
        img[SETUP_HEADER_OFFSET..SETUP_HEADER_OFFSET + std::mem::size_of::<setup_header>()]
            .copy_from_slice(hdr.as_slice());
        img
    }

    #[test]
    fn a_64_bit_bzimage_is_accepted() {
        let hdr = header(&image(0x020F, 1, 0x7F, 4096)).unwrap();
        assert_eq!(check(&hdr), Ok(()));
        assert_eq!({ hdr.version }, 0x020F);
    }

    #[test]
    fn bzimages_emon_cannot_boot_say_why() {
        let why = |v, lf, xlf| check(&header(&image(v, lf, xlf, 0)).unwrap()).unwrap_err();
        assert!(why(0x0204, 1, 1).contains("version 2.04, older than 2.06"));
        assert!(why(0x020F, 0, 1).contains("zImage"));
        assert!(why(0x020A, 1, 1).contains("predates xloadflags"));
        assert!(why(0x020F, 1, 0x2).contains("32-bit kernel"));
    }

    #[test]
    fn images_without_hdrs_are_no_bzimage() {
        let mut img = image(0x020F, 1, 1, 0);
        img[0x202] = b'X';
        assert!(header(&img).is_none());
        assert!(header(&[0u8; 16]).is_none());
    }

    #[test]
    fn a_relocatable_kernel_runs_at_its_aligned_load_address_but_not_below_pref_address() {
        let hdr = header(&image(0x020F, 1, 1, 0)).unwrap();
        assert_eq!(run_area(&hdr, 0x10_0000), Some((0x100_0000, 0x100_0000)));
        assert_eq!(run_area(&hdr, 0x210_0000), Some((0x220_0000, 0x100_0000)));
    }

    #[test]
    fn boot_params_carry_the_header_command_line_initrd_and_map() {
        let hdr = header(&image(0x020F, 1, 1, 0)).unwrap();
        let map = e820::map(256 << 20);
        let p = boot_params(hdr, CMDLINE_ADDR, Some((0x0F00_0000, 0x12_3456)), &map);
        let bytes = p.as_slice();
        assert_eq!(bytes.len(), 4096);
        assert_eq!(&bytes[0x202..0x206], b"HdrS");
        assert_eq!(bytes[0x210], 0xFF, "type_of_loader");
        assert_eq!(u32::from_le_bytes(bytes[0x228..0x22C].try_into().unwrap()), CMDLINE_ADDR as u32);
        assert_eq!(u32::from_le_bytes(bytes[0x218..0x21C].try_into().unwrap()), 0x0F00_0000, "ramdisk_image");
        assert_eq!(u32::from_le_bytes(bytes[0x21C..0x220].try_into().unwrap()), 0x12_3456, "ramdisk_size");
        assert_eq!(bytes[0x1E8] as usize, map.len(), "e820_entries");
        let e = |i: usize, f: usize| u64::from_le_bytes(bytes[0x2D0 + 20 * i + f..][..8].try_into().unwrap());
        assert_eq!((e(3, 0), e(3, 8)), (0x10_0000, (256 << 20) - 0x10_0000));
        assert_eq!(u32::from_le_bytes(bytes[0x2D0 + 20 * 3 + 16..][..4].try_into().unwrap()), e820::RAM);
        let none = boot_params(hdr, CMDLINE_ADDR, None, &map);
        assert_eq!(({ none.hdr.ramdisk_image }, { none.hdr.ramdisk_size }), (0, 0));
    }
}
