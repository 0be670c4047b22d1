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
