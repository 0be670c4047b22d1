//! Kernel images: detection (a Linux bzImage, multiboot v1, a Linux vmlinux with a PVH entry
//! point, or a bare ELF64), placement in guest RAM, and the entry state.
mod bzimage;
mod e820;
mod elf;
mod initrd;
mod multiboot;
mod pvh;

use super::boot::{Entry, Mode};
use super::layout::*;
use thiserror::Error;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

pub use multiboot::{MultibootHeader, MULTIBOOT_BOOTLOADER_MAGIC};

/// Why a kernel image is refused. Each message says what is wrong and, where it helps, what to do.
#[derive(Debug, Error)]
pub enum KernelError {
    #[error("cannot read it: {0}")]
    Read(std::io::Error),
    #[error("it is neither a multiboot kernel (no multiboot header in its first 8 KiB) nor an ELF64 image ({0})")]
    NotBootable(String),
    #[error("it is an ELF32 image without a multiboot header: emon boots 32-bit kernels only through multiboot")]
    Elf32WithoutMultiboot,
    #[error("it is an ELF image for machine {0} (not x86, 3, or x86-64, 62)")]
    WrongMachine(u16),
    #[error("its ELF headers are broken: {0}")]
    BadElf(String),
    #[error("it has no loadable segments")]
    NoLoadableSegments,
    #[error(
        "{what} at {start:#x}..{end:#x} does not fit in guest RAM ({ram_mib} MiB); use --memory to give the guest more"
    )]
    DoesNotFit { what: String, start: u64, end: u64, ram_mib: u64 },
    #[error("{what} at {start:#x}..{end:#x} overlaps emon's boot area below {BOOT_AREA_END:#x}; link the kernel at 1 MiB or above")]
    OverlapsBootArea { what: String, start: u64, end: u64 },
    #[error("its entry point {0:#x} is not inside a loaded segment")]
    EntryOutside(u64),
    #[error("its multiboot header requires features emon does not provide (flags {0:#x}; emon supports bits 0, 1, 2 and 16)")]
    MultibootFlags(u32),
    #[error("its multiboot header's address fields are inconsistent: {0}")]
    MultibootAddresses(String),
    #[error("the command line is too long ({0} bytes; at most {max})", max = CMDLINE_MAX - 1)]
    CmdlineTooLong(usize),
    #[error("the command line is not valid: {0}")]
    BadCmdline(String),
    #[error("module {0}: {1}")]
    Module(String, String),
    #[error("writing guest memory: {0}")]
    Memory(String),
    #[error(
        "it is a Linux vmlinux without a PVH entry point (no XEN_ELFNOTE_PHYS32_ENTRY note), which emon cannot boot; \
         boot the kernel's bzImage (arch/x86/boot/bzImage, /boot/vmlinuz-*) or a vmlinux built with CONFIG_PVH=y"
    )]
    LinuxWithoutPvh,
    #[error(
        "it is a Linux bzImage emon cannot boot: {0}; emon boots x86-64 bzImages with boot protocol 2.12 or later \
         (Linux 3.8+), or a vmlinux built with CONFIG_PVH=y"
    )]
    BzImageUnsupported(String),
    #[error(
        "--initrd is for Linux kernels (a bzImage or a PVH vmlinux); give a multiboot kernel its files with --module"
    )]
    InitrdNotLinux,
    #[error("--module is for multiboot kernels; give a Linux kernel its initramfs with --initrd")]
    ModulesNotMultiboot,
    #[error(
        "the initrd ({size} bytes) does not fit between the kernel's end at {lowest:#x} and {top:#x} \
         (the end of its {ram_mib} MiB of RAM or of what the kernel accepts); use --memory to give the guest more"
    )]
    InitrdDoesNotFit { size: u64, lowest: u64, top: u64, ram_mib: u64 },
    #[error("the command line is too long for Linux ({len} bytes; this kernel takes at most {max})")]
    LinuxCmdlineTooLong { len: usize, max: usize },
    #[error("loading it: {0}")]
    Load(String),
}

/// A kernel to boot: its name (a path, or `guest:NAME`) and its bytes.
pub struct Kernel {
    pub name: String,
    pub image: Vec<u8>,
}

/// A multiboot module, or a Linux initrd: its path (a module's command line) and contents.
pub struct Module {
    pub name: String,
    pub data: Vec<u8>,
}

/// How a kernel was recognized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Multiboot,
    Elf64,
    /// A Linux vmlinux entered at its PVH entry point.
    Pvh,
    /// A Linux bzImage entered through the 64-bit boot protocol.
    BzImage,
}

/// What a kernel image is, as `detect` recognizes it.
enum Kind {
    BzImage(linux_loader::loader::bootparam::setup_header),
    Multiboot(MultibootHeader),
    Pvh { image: elf::Image, entry: u64 },
    Elf64(elf::Image),
}

/// Recognizes a kernel image, or says why emon cannot boot it. A bzImage ("HdrS" at 0x202) is
/// looked for first, then a multiboot header, then an ELF image: with a PVH note it is a Linux
/// PVH kernel; a Linux vmlinux without one is refused (entered as a bare ELF64 it would hang);
/// any other ELF64 is a bare kernel.
fn detect(image: &[u8]) -> Result<Kind, KernelError> {
    if let Some(hdr) = bzimage::header(image) {
        bzimage::check(&hdr).map_err(KernelError::BzImageUnsupported)?;
        return Ok(Kind::BzImage(hdr));
    }
    if let Some(header) = MultibootHeader::find(image) {
        return Ok(Kind::Multiboot(header));
    }
    let parsed = elf::parse(image)?;
    if let Some(entry) = pvh::entry_point(&parsed.notes) {
        if !parsed.is_64 {
            return Err(KernelError::BadElf("a PVH note in an ELF32 image: emon boots 64-bit Linux kernels".into()));
        }
        return Ok(Kind::Pvh { image: parsed, entry });
    }
    if is_linux(image, &parsed) {
        return Err(KernelError::LinuxWithoutPvh);
    }
    if !parsed.is_64 {
        return Err(KernelError::Elf32WithoutMultiboot);
    }
    Ok(Kind::Elf64(parsed))
}

/// A Linux vmlinux: it has notes owned by "Linux" or "Xen" (the build salt, the Xen entry notes),
/// or the banner's "Linux version " somewhere in its bytes.
fn is_linux(bytes: &[u8], image: &elf::Image) -> bool {
    const BANNER: &[u8] = b"Linux version ";
    image.notes.iter().any(|n| n.name == b"Linux" || n.name == b"Xen")
        || bytes.windows(BANNER.len()).any(|w| w == BANNER)
}

/// Loads `kernel` into guest memory and returns how to enter it.
pub fn load(
    mem: &GuestMemoryMmap,
    ram_size: u64,
    kernel: &Kernel,
    cmdline: &str,
    modules: &[Module],
    initrd: Option<&Module>,
) -> Result<(Format, Entry), KernelError> {
    let kind = detect(&kernel.image)?;
    let linux = matches!(kind, Kind::BzImage(_) | Kind::Pvh { .. });
    if linux && !modules.is_empty() {
        return Err(KernelError::ModulesNotMultiboot);
    }
    if !linux && initrd.is_some() {
        return Err(KernelError::InitrdNotLinux);
    }
    let image = match kind {
        Kind::BzImage(hdr) => {
            return Ok((Format::BzImage, bzimage::load(mem, ram_size, kernel, hdr, cmdline, initrd)?));
        }
        Kind::Pvh { image, entry } => {
            return Ok((Format::Pvh, pvh::load(mem, ram_size, kernel, &image, entry, cmdline, initrd)?));
        }
        Kind::Multiboot(header) => {
            return Ok((Format::Multiboot, multiboot::load(mem, ram_size, kernel, &header, cmdline, modules)?));
        }
        Kind::Elf64(image) => image,
    };
    let end = elf::load(mem, ram_size, &kernel.image, &image)?;
    let _ = end;
    let cmdline_addr = if cmdline.is_empty() {
        0
    } else {
        write_cmdline(mem, CMDLINE_ADDR, cmdline)?;
        CMDLINE_ADDR
    };
    Ok((
        Format::Elf64,
        Entry {
            mode: Mode::Long,
            rip: image.entry,
            rax: 0,
            rbx: 0,
            rdi: cmdline_addr,
            rsi: ram_size,
            rsp: BOOT_STACK_TOP,
        },
    ))
}

/// Checks that `[start, start+len)` is in RAM and above the boot area.
fn check_range(what: &str, start: u64, len: u64, ram_size: u64) -> Result<(), KernelError> {
    let end = start.checked_add(len).ok_or_else(|| KernelError::BadElf(format!("{what} wraps around")))?;
    if end > ram_size {
        return Err(KernelError::DoesNotFit { what: what.into(), start, end, ram_mib: ram_size >> 20 });
    }
    if start < BOOT_AREA_END && len > 0 {
        return Err(KernelError::OverlapsBootArea { what: what.into(), start, end });
    }
    Ok(())
}

fn write_mem(mem: &GuestMemoryMmap, addr: u64, bytes: &[u8]) -> Result<(), KernelError> {
    mem.write_slice(bytes, GuestAddress(addr)).map_err(|e| KernelError::Memory(e.to_string()))
}

/// Writes a NUL-terminated command line exactly as given (QEMU keeps the trailing space of
/// "<path> " for multiboot), after linux-loader's `Cmdline` has validated its characters.
fn write_cmdline(mem: &GuestMemoryMmap, addr: u64, cmdline: &str) -> Result<(), KernelError> {
    if cmdline.len() >= CMDLINE_MAX {
        return Err(KernelError::CmdlineTooLong(cmdline.len()));
    }
    let mut c = linux_loader::cmdline::Cmdline::new(CMDLINE_MAX).map_err(|e| KernelError::BadCmdline(e.to_string()))?;
    c.insert_str(cmdline).map_err(|e| KernelError::BadCmdline(e.to_string()))?;
    let mut bytes = cmdline.as_bytes().to_vec();
    bytes.push(0);
    write_mem(mem, addr, &bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal little-endian ELF image for x86-64 (`is_64`) or x86: one PT_LOAD segment of
    /// `text` at physical 1 MiB (the entry point), a PT_NOTE segment with `notes` (owner, type,
    /// descriptor), no section headers.
    fn elf(is_64: bool, notes: &[(&str, u32, &[u8])], text: &[u8]) -> Vec<u8> {
        let pad = |v: &mut Vec<u8>| v.resize(v.len().div_ceil(4) * 4, 0);
        let mut note_bytes = Vec::new();
        for (name, kind, desc) in notes {
            note_bytes.extend((name.len() as u32 + 1).to_le_bytes());
            note_bytes.extend((desc.len() as u32).to_le_bytes());
            note_bytes.extend(kind.to_le_bytes());
            note_bytes.extend(name.as_bytes());
            note_bytes.push(0);
            pad(&mut note_bytes);
            note_bytes.extend(*desc);
            pad(&mut note_bytes);
        }
        let (ehsize, phentsize) = if is_64 { (64u64, 56u64) } else { (52, 32) };
        let note_off = ehsize + 2 * phentsize;
        let text_off = note_off + note_bytes.len() as u64;
        let mut b = Vec::new();
        let w = |b: &mut Vec<u8>, v: u64, n: usize| b.extend(&v.to_le_bytes()[..n]);
        let word = if is_64 { 8 } else { 4 };
        b.extend(b"\x7FELF");
        b.extend([if is_64 { 2 } else { 1 }, 1, 1, 0]);
        b.extend([0; 8]);
        w(&mut b, 2, 2); // e_type: ET_EXEC
        w(&mut b, if is_64 { 62 } else { 3 }, 2); // e_machine
        w(&mut b, 1, 4); // e_version
        w(&mut b, 0x10_0000, word); // e_entry
        w(&mut b, ehsize, word); // e_phoff
        w(&mut b, 0, word); // e_shoff
        w(&mut b, 0, 4); // e_flags
        w(&mut b, ehsize, 2);
        w(&mut b, phentsize, 2);
        w(&mut b, 2, 2); // e_phnum
        w(&mut b, 64, 2); // e_shentsize
        w(&mut b, 0, 2); // e_shnum
        w(&mut b, 0, 2); // e_shstrndx
        let phdr = |b: &mut Vec<u8>, kind: u64, off: u64, addr: u64, size: u64| {
            w(b, kind, 4);
            if is_64 {
                w(b, 5, 4); // p_flags
            }
            for v in [off, addr, addr, size, size] {
                w(b, v, word);
            }
            if !is_64 {
                w(b, 5, 4);
            }
            w(b, 4, word); // p_align
        };
        phdr(&mut b, 1, text_off, 0x10_0000, text.len() as u64);
        phdr(&mut b, 4, note_off, 0, note_bytes.len() as u64);
        b.extend(note_bytes);
        b.extend(text);
        b
    }

    const PVH_ENTRY: &[u8] = &0x10_0000u32.to_le_bytes();

    #[test]
    fn a_vmlinux_with_the_pvh_note_boots_through_pvh() {
        let img = elf(true, &[("Linux", 0x100, &[0; 4]), ("Xen", 18, PVH_ENTRY)], &[0xF4; 16]);
        match detect(&img).unwrap() {
            Kind::Pvh { entry, image } => {
                assert_eq!(entry, 0x10_0000);
                assert_eq!(image.notes.len(), 2);
            }
            _ => panic!("not detected as PVH"),
        }
    }

    #[test]
    fn a_vmlinux_without_the_pvh_note_is_refused_with_what_to_use() {
        for img in [
            elf(true, &[("Linux", 0x100, &[0; 4])], &[0xF4; 16]),
            elf(true, &[("Xen", 6, b"linux\0\0\0")], &[0xF4; 16]),
            elf(true, &[("GNU", 3, &[7; 20])], b"\xF4Linux version 6.1.0 (gcc)"),
        ] {
            let e = detect(&img).err().expect("refused").to_string();
            assert!(
                e.contains("without a PVH entry point") && e.contains("bzImage") && e.contains("CONFIG_PVH"),
                "{e}"
            );
        }
    }

    #[test]
    fn a_bare_elf64_kernel_is_still_a_bare_elf64_kernel() {
        assert!(matches!(detect(&elf(true, &[("GNU", 3, &[7; 20])], &[0xF4; 16])), Ok(Kind::Elf64(_))));
        assert!(matches!(detect(&elf(true, &[], &[0xF4; 16])), Ok(Kind::Elf64(_))));
        assert!(matches!(detect(&elf(false, &[], &[0xF4; 16])), Err(KernelError::Elf32WithoutMultiboot)));
    }

    #[test]
    fn bzimages_are_detected_or_refused_with_the_reason() {
        assert!(matches!(detect(&bzimage::tests::image(0x020F, 1, 0x7F, 4096)), Ok(Kind::BzImage(_))));
        let e = detect(&bzimage::tests::image(0x020F, 1, 0, 4096)).err().unwrap().to_string();
        assert!(e.starts_with("it is a Linux bzImage emon cannot boot: its xloadflags (0x0)"), "{e}");
        assert!(e.contains("CONFIG_PVH"), "{e}");
    }

    #[test]
    fn a_multiboot_header_still_means_multiboot() {
        let mut img = elf(false, &[], &[0; 64]);
        let flags = 0u32;
        let header: Vec<u8> = [0x1BAD_B002u32, flags, 0u32.wrapping_sub(0x1BAD_B002 + flags)]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let at = img.len() - 64;
        img[at..at + 12].copy_from_slice(&header);
        assert!(matches!(detect(&img), Ok(Kind::Multiboot(_))));
    }

    #[test]
    fn initrd_and_modules_go_to_the_kernels_that_take_them() {
        use vm_memory::GuestMemoryMmap;
        let ram = 32 << 20;
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), ram as usize)]).unwrap();
        let file = || Module { name: "f".into(), data: vec![1; 100] };
        let bare = Kernel { name: "k".into(), image: elf(true, &[], &[0xF4; 16]) };
        let e = load(&mem, ram, &bare, "", &[], Some(&file())).err().unwrap();
        assert!(matches!(e, KernelError::InitrdNotLinux));
        let pvh = Kernel { name: "k".into(), image: elf(true, &[("Xen", 18, PVH_ENTRY)], &[0xF4; 16]) };
        let e = load(&mem, ram, &pvh, "", &[file()], None).err().unwrap();
        assert!(matches!(e, KernelError::ModulesNotMultiboot));
    }

    #[test]
    fn a_pvh_kernel_is_entered_in_protected_mode_with_ebx_at_the_start_info() {
        use vm_memory::GuestMemoryMmap;
        let ram = 32 << 20;
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), ram as usize)]).unwrap();
        let pvh = Kernel { name: "k".into(), image: elf(true, &[("Xen", 18, PVH_ENTRY)], &[0xF4; 16]) };
        let initrd = Module { name: "i".into(), data: vec![0xAB; 5000] };
        let (format, entry) = load(&mem, ram, &pvh, "console=ttyS0", &[], Some(&initrd)).unwrap();
        assert_eq!(format, Format::Pvh);
        assert_eq!((entry.mode, entry.rip, entry.rbx), (Mode::Protected, 0x10_0000, PVH_START_INFO_ADDR));
        let info: u32 = mem.read_obj(GuestAddress(PVH_START_INFO_ADDR)).unwrap();
        assert_eq!(info, pvh::XEN_HVM_START_MAGIC_VALUE);
        let module: [u64; 2] = mem.read_obj(GuestAddress(PVH_MODLIST_ADDR)).unwrap();
        assert_eq!(module, [ram - 0x2000, 5000]);
        let byte: u8 = mem.read_obj(GuestAddress(ram - 0x2000)).unwrap();
        assert_eq!(byte, 0xAB);
        let mut cmdline = [0u8; 14];
        mem.read_slice(&mut cmdline, GuestAddress(CMDLINE_ADDR)).unwrap();
        assert_eq!(&cmdline, b"console=ttyS0\0");
    }

    #[test]
    fn a_bzimage_is_entered_at_startup_64_with_rsi_at_the_zero_page() {
        use vm_memory::GuestMemoryMmap;
        let ram = 64 << 20;
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), ram as usize)]).unwrap();
        let k = Kernel { name: "k".into(), image: bzimage::tests::image(0x020F, 1, 1, 4096) };
        let (format, entry) = load(&mem, ram, &k, "console=ttyS0", &[], None).unwrap();
        assert_eq!(format, Format::BzImage);
        assert_eq!((entry.mode, entry.rip, entry.rsi), (Mode::LinuxLong, 0x10_0200, ZERO_PAGE_ADDR));
        let hdrs: u32 = mem.read_obj(GuestAddress(ZERO_PAGE_ADDR + 0x202)).unwrap();
        assert_eq!(&hdrs.to_le_bytes(), b"HdrS");
        let cmd_line_ptr: u32 = mem.read_obj(GuestAddress(ZERO_PAGE_ADDR + 0x228)).unwrap();
        assert_eq!(u64::from(cmd_line_ptr), CMDLINE_ADDR);
        let e = load(&mem, 16 << 20, &k, "", &[], None).err().unwrap().to_string();
        assert!(e.contains("init_size") && e.contains("--memory"), "{e}");
    }
}
