//! ELF32/ELF64 program headers (parsed with goblin) and loading PT_LOAD segments at their
//! physical addresses.
use super::{check_range, write_mem, KernelError};
use goblin::elf::{header, program_header::PT_LOAD, program_header::PT_NOTE, Elf};
use vm_memory::GuestMemoryMmap;

pub struct Segment {
    pub paddr: u64,
    pub offset: u64,
    pub filesz: u64,
    pub memsz: u64,
}

pub struct Image {
    pub is_64: bool,
    pub entry: u64,
    pub segments: Vec<Segment>,
    /// The ELF notes of its PT_NOTE segments.
    pub notes: Vec<Note>,
}

/// An ELF note: its owner's name (without the NUL), type and descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    pub name: Vec<u8>,
    pub kind: u32,
    pub desc: Vec<u8>,
}

/// The notes of one PT_NOTE segment's bytes (namesz, descsz, type, then the name and the
/// descriptor, each padded to 4 bytes). A truncated note ends the list.
pub fn parse_notes(mut b: &[u8]) -> Vec<Note> {
    let pad = |n: usize| n.div_ceil(4) * 4;
    let mut notes = Vec::new();
    while b.len() >= 12 {
        let word = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap()) as usize;
        let (namesz, descsz, kind) = (word(0), word(4), word(8) as u32);
        let desc_at = 12 + pad(namesz);
        let Some(desc) = b.get(desc_at..desc_at + descsz) else { break };
        let name = &b[12..12 + namesz];
        notes.push(Note { name: name.strip_suffix(b"\0").unwrap_or(name).to_vec(), kind, desc: desc.to_vec() });
        b = b.get(desc_at + pad(descsz)..).unwrap_or(&[]);
    }
    notes
}

pub fn parse(bytes: &[u8]) -> Result<Image, KernelError> {
    if bytes.len() < 4 || &bytes[..4] != b"\x7FELF" {
        return Err(KernelError::NotBootable("no ELF magic at offset 0".into()));
    }
    let elf = Elf::parse(bytes).map_err(|e| KernelError::BadElf(e.to_string()))?;
    if !elf.little_endian {
        return Err(KernelError::BadElf("big-endian image".into()));
    }
    if elf.header.e_machine != header::EM_X86_64 && elf.header.e_machine != header::EM_386 {
        return Err(KernelError::WrongMachine(elf.header.e_machine));
    }
    let segments: Vec<Segment> = elf
        .program_headers
        .iter()
        .filter(|p| p.p_type == PT_LOAD && p.p_memsz > 0)
        .map(|p| Segment { paddr: p.p_paddr, offset: p.p_offset, filesz: p.p_filesz, memsz: p.p_memsz })
        .collect();
    if segments.is_empty() {
        return Err(KernelError::NoLoadableSegments);
    }
    let notes = elf
        .program_headers
        .iter()
        .filter(|p| p.p_type == PT_NOTE)
        .filter_map(|p| bytes.get(usize::try_from(p.p_offset).ok()?..)?.get(..usize::try_from(p.p_filesz).ok()?))
        .flat_map(parse_notes)
        .collect();
    Ok(Image { is_64: elf.is_64, entry: elf.entry, segments, notes })
}

/// Loads every segment (zero-filling memsz beyond filesz); returns the end of the highest one.
pub fn load(mem: &GuestMemoryMmap, ram_size: u64, bytes: &[u8], image: &Image) -> Result<u64, KernelError> {
    let mut end = 0;
    for (i, s) in image.segments.iter().enumerate() {
        let what = format!("segment {i}");
        if s.filesz > s.memsz {
            return Err(KernelError::BadElf(format!(
                "{what}: file size {:#x} exceeds memory size {:#x}",
                s.filesz, s.memsz
            )));
        }
        check_range(&what, s.paddr, s.memsz, ram_size)?;
        let data = usize::try_from(s.offset)
            .ok()
            .and_then(|o| bytes.get(o..o.checked_add(usize::try_from(s.filesz).ok()?)?))
            .ok_or_else(|| KernelError::BadElf(format!("{what}: file data beyond the end of the image")))?;
        write_mem(mem, s.paddr, data)?;
        write_mem(mem, s.paddr + s.filesz, &vec![0; (s.memsz - s.filesz) as usize])?;
        end = end.max(s.paddr + s.memsz);
    }
    let inside = image.segments.iter().any(|s| (s.paddr..s.paddr + s.memsz).contains(&image.entry));
    if !inside {
        return Err(KernelError::EntryOutside(image.entry));
    }
    Ok(end)
}
