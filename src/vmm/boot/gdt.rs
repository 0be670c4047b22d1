//! The boot GDT and the segment registers loaded from it.
use super::super::layout::GDT_ADDR;
use crate::x86::mode::segment_from_descriptor;
use kvm_bindings::kvm_sregs;
use vm_memory::GuestMemoryMmap;

/// The mode a kernel is entered in, and the GDT layout it expects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// 64-bit long mode (ELF64 kernels without a multiboot header).
    Long,
    /// 64-bit long mode with the selectors of Linux's 64-bit boot protocol (Documentation/x86/
    /// boot.rst): CS = __BOOT_CS (0x10), DS/ES/SS = __BOOT_DS (0x18).
    LinuxLong,
    /// 32-bit protected mode, paging off (multiboot kernels, and PVH kernels, whose ABI asks for
    /// the same state).
    Protected,
}

pub const CODE_SEL: u16 = 0x08;
pub const DATA_SEL: u16 = 0x10;
pub const TSS_SEL: u16 = 0x18;
/// Linux's boot GDT (arch/x86/include/asm/segment.h: GDT_ENTRY_BOOT_CS = 2, GDT_ENTRY_BOOT_DS = 3).
pub const LINUX_BOOT_CS: u16 = 0x10;
pub const LINUX_BOOT_DS: u16 = 0x18;
pub const LINUX_BOOT_TSS: u16 = 0x20;

/// A GDT descriptor from its fields (SDM Vol. 3A 3.4.5).
fn descriptor(flags: u64, base: u64, limit: u64) -> u64 {
    ((base & 0xFF00_0000) << 32)
        | ((base & 0x00FF_FFFF) << 16)
        | ((flags & 0xF0FF) << 40)
        | ((limit & 0xF_0000) << 32)
        | (limit & 0xFFFF)
}

pub fn install(mem: &GuestMemoryMmap, sregs: &mut kvm_sregs, mode: Mode) -> Result<(), super::super::VmmError> {
    let code_flags = match mode {
        Mode::Long | Mode::LinuxLong => 0xA09B, // present, code exec/read, L=1, G=1
        Mode::Protected => 0xC09B,              // present, code exec/read, D=1, G=1
    };
    let code = descriptor(code_flags, 0, 0xF_FFFF);
    let data = descriptor(0xC093, 0, 0xF_FFFF); // present, data read/write, B=1, G=1
    let tss = descriptor(0x008B, 0, 0x67); // present, busy TSS (VM entry needs a usable TR)
    let (gdt, [code_sel, data_sel, tss_sel]) = match mode {
        Mode::LinuxLong => (vec![0, 0, code, data, tss], [LINUX_BOOT_CS, LINUX_BOOT_DS, LINUX_BOOT_TSS]),
        Mode::Long | Mode::Protected => (vec![0, code, data, tss], [CODE_SEL, DATA_SEL, TSS_SEL]),
    };
    let bytes: Vec<u8> = gdt.iter().flat_map(|d| d.to_le_bytes()).collect();
    super::write(mem, GDT_ADDR, &bytes)?;
    sregs.gdt.base = GDT_ADDR;
    sregs.gdt.limit = (bytes.len() - 1) as u16;
    sregs.idt.base = 0;
    sregs.idt.limit = 0;
    sregs.cs = segment_from_descriptor(code, code_sel);
    let data = segment_from_descriptor(data, data_sel);
    sregs.ds = data;
    sregs.es = data;
    sregs.fs = data;
    sregs.gs = data;
    sregs.ss = data;
    sregs.tr = segment_from_descriptor(tss, tss_sel);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_match_the_well_known_encodings() {
        assert_eq!(descriptor(0xA09B, 0, 0xF_FFFF), 0x00AF_9B00_0000_FFFF);
        assert_eq!(descriptor(0xC093, 0, 0xF_FFFF), 0x00CF_9300_0000_FFFF);
        assert_eq!(descriptor(0xC09B, 0, 0xF_FFFF), 0x00CF_9B00_0000_FFFF);
    }

    #[test]
    fn segments_decode_their_descriptor() {
        let cs = segment_from_descriptor(descriptor(0xA09B, 0, 0xF_FFFF), CODE_SEL);
        assert_eq!((cs.l, cs.db, cs.g, cs.present, cs.type_, cs.s), (1, 0, 1, 1, 0xB, 1));
        assert_eq!(cs.limit, 0xFFFF_FFFF);
        let ds = segment_from_descriptor(descriptor(0xC093, 0, 0xF_FFFF), DATA_SEL);
        assert_eq!((ds.l, ds.db, ds.type_), (0, 1, 3));
    }
}
