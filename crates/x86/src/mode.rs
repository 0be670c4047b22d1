//! The guest CPU state that matters at instruction boundaries (CPL, code size, paging), and
//! reading guest memory at a linear address by walking the guest's page tables.
use kvm_bindings::{kvm_segment, kvm_sregs};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

const CR0_PG: u64 = 1 << 31;
const CR4_PSE: u64 = 1 << 4;
const CR4_PAE: u64 = 1 << 5;
const CR4_PCE: u64 = 1 << 8;
const CR4_SMEP: u64 = 1 << 20;
const CR4_SMAP: u64 = 1 << 21;
/// CR0.WP: supervisor-mode writes honour read-only pages.
const CR0_WP: u64 = 1 << 16;
const EFER_LMA: u64 = 1 << 10;
const PRESENT: u64 = 1;
const PAGE_SIZE_BIT: u64 = 1 << 7;
const ADDR_MASK: u64 = 0x000F_FFFF_FFFF_F000;
/// The linear-address bits that index each level of 4-level paging: PML4, PDPT, PD, PT.
const LONG_SHIFTS: [u32; 4] = [39, 30, 21, 12];

/// The parts of the vCPU's state that matter for decoding and filtering.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CpuMode {
    pub cpl: u8,
    /// Code-segment size: 16, 32 or 64.
    pub bitness: u32,
    pub cr0: u64,
    pub cr3: u64,
    pub cr4: u64,
    pub efer: u64,
    pub idt_base: u64,
    pub idt_limit: u16,
}

/// The segment register a code or data descriptor `d` loads with `selector` (SDM Vol. 3A 3.4.5,
/// Figure 3-8), as KVM represents it.
pub fn segment_from_descriptor(d: u64, selector: u16) -> kvm_segment {
    let g = ((d >> 55) & 1) as u8;
    let raw_limit = ((d & 0xFFFF) | ((d >> 32) & 0xF_0000)) as u32;
    kvm_segment {
        base: ((d >> 16) & 0xFF_FFFF) | (((d >> 56) & 0xFF) << 24),
        limit: if g == 1 { (raw_limit << 12) | 0xFFF } else { raw_limit },
        selector,
        type_: ((d >> 40) & 0xF) as u8,
        present: ((d >> 47) & 1) as u8,
        dpl: ((d >> 45) & 3) as u8,
        db: ((d >> 54) & 1) as u8,
        s: ((d >> 44) & 1) as u8,
        l: ((d >> 53) & 1) as u8,
        g,
        avl: ((d >> 52) & 1) as u8,
        unusable: 0,
        padding: 0,
    }
}

/// What an access does, for its page-fault error code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
    Fetch,
}

impl CpuMode {
    pub fn from_sregs(s: &kvm_sregs) -> CpuMode {
        let bitness = if s.efer & EFER_LMA != 0 && s.cs.l == 1 {
            64
        } else if s.cs.db == 1 {
            32
        } else {
            16
        };
        CpuMode {
            // CPL is CS.RPL in protected mode (SDM Vol. 3A 5.5); SS.DPL equals it.
            cpl: s.ss.dpl,
            bitness,
            cr0: s.cr0,
            cr3: s.cr3,
            cr4: s.cr4,
            efer: s.efer,
            idt_base: s.idt.base,
            idt_limit: s.idt.limit,
        }
    }

    /// CR4.PCE: RDPMC allowed at CPL > 0.
    pub fn pce(&self) -> bool {
        self.cr4 & CR4_PCE != 0
    }

    /// The guest-physical pieces of the `len` bytes at linear address `la`, page by page:
    /// (physical address, offset into the bytes, length); `None` if a page is not mapped.
    fn pieces(&self, mem: &GuestMemoryMmap, la: u64, len: usize) -> Option<Vec<(u64, usize, usize)>> {
        let mut pieces = Vec::new();
        let mut done = 0usize;
        while done < len {
            let at = la.wrapping_add(done as u64);
            let n = ((0x1000 - (at & 0xFFF)) as usize).min(len - done);
            pieces.push((self.translate(mem, at)?, done, n));
            done += n;
        }
        Some(pieces)
    }

    /// Reads `buf.len()` bytes of guest memory at linear address `la`, through the guest's page
    /// tables; `None` if any of it is not mapped.
    pub fn read_linear(&self, mem: &GuestMemoryMmap, la: u64, buf: &mut [u8]) -> Option<()> {
        for (pa, at, n) in self.pieces(mem, la, buf.len())? {
            mem.read_slice(&mut buf[at..at + n], GuestAddress(pa)).ok()?;
        }
        Some(())
    }

    /// Writes `buf` to guest memory at linear address `la`, through the guest's page tables;
    /// `None`, with nothing written, if any of it is not mapped.
    pub fn write_linear(&self, mem: &GuestMemoryMmap, la: u64, buf: &[u8]) -> Option<()> {
        for (pa, at, n) in self.pieces(mem, la, buf.len())? {
            mem.write_slice(&buf[at..at + n], GuestAddress(pa)).ok()?;
        }
        Some(())
    }

    /// Guest-physical address of linear address `la`, walking the guest's page tables
    /// (SDM Vol. 3A 4.3-4.5: 32-bit, PAE and 4-level paging; large pages).
    pub fn translate(&self, mem: &GuestMemoryMmap, la: u64) -> Option<u64> {
        if self.cr0 & CR0_PG == 0 {
            return Some(la & 0xFFFF_FFFF);
        }
        let read64 = |a: u64| mem.read_obj::<u64>(GuestAddress(a)).ok();
        let read32 = |a: u64| mem.read_obj::<u32>(GuestAddress(a)).ok().map(u64::from);
        if self.efer & EFER_LMA != 0 {
            let (entries, n) = self.long_walk(mem, la);
            let leaf = entries[n - 1];
            if leaf & PRESENT == 0 {
                return None;
            }
            let size = 1u64 << LONG_SHIFTS[n - 1];
            return Some((leaf & ADDR_MASK & !(size - 1)) | (la & (size - 1)));
        }
        if self.cr4 & CR4_PAE != 0 {
            let pdpte = read64((self.cr3 & 0xFFFF_FFE0) + ((la >> 30) & 3) * 8)?;
            if pdpte & PRESENT == 0 {
                return None;
            }
            let pde = read64((pdpte & ADDR_MASK) + ((la >> 21) & 0x1FF) * 8)?;
            if pde & PRESENT == 0 {
                return None;
            }
            if pde & PAGE_SIZE_BIT != 0 {
                return Some((pde & ADDR_MASK & !0x1F_FFFF) | (la & 0x1F_FFFF));
            }
            let pte = read64((pde & ADDR_MASK) + ((la >> 12) & 0x1FF) * 8)?;
            return (pte & PRESENT != 0).then_some((pte & ADDR_MASK) | (la & 0xFFF));
        }
        let pde = read32((self.cr3 & 0xFFFF_F000) + ((la >> 22) & 0x3FF) * 4)?;
        if pde & PRESENT == 0 {
            return None;
        }
        if pde & PAGE_SIZE_BIT != 0 && self.cr4 & CR4_PSE != 0 {
            return Some((pde & 0xFFC0_0000) | (la & 0x3F_FFFF));
        }
        let pte = read32((pde & 0xFFFF_F000) + ((la >> 12) & 0x3FF) * 4)?;
        (pte & PRESENT != 0).then_some((pte & 0xFFFF_F000) | (la & 0xFFF))
    }

    /// The error code of the page fault an access of `kind` to linear address `la` at the CPL
    /// raises under 4-level paging, or `None` if it does not fault (SDM Vol. 3A 4.6 and 4.7): P
    /// where the translation was present (a protection violation), W/R for a write, U/S for a
    /// user-mode access, RSVD for a reserved bit set, I/D for a fetch with EFER.NXE. A user-mode
    /// access needs every level to allow user mode; a supervisor-mode one faults on a write to a
    /// read-only page with CR0.WP, a data access to a user page with CR4.SMAP unless RFLAGS.AC
    /// (`ac`) is set, and a fetch from a user page with CR4.SMEP.
    pub fn page_fault(&self, mem: &GuestMemoryMmap, la: u64, kind: Access, ac: bool) -> Option<u32> {
        const WRITABLE: u64 = 1 << 1;
        const USER: u64 = 1 << 2;
        const XD: u64 = 1 << 63;
        const EFER_NXE: u64 = 1 << 11;
        let user_mode = self.cpl == 3;
        let code = |present: bool, rsvd: bool| {
            u32::from(present)
                | u32::from(kind == Access::Write) << 1
                | u32::from(user_mode) << 2
                | u32::from(rsvd) << 3
                | u32::from(kind == Access::Fetch && self.efer & EFER_NXE != 0) << 4
        };
        if self.cr0 & CR0_PG == 0 || self.efer & EFER_LMA == 0 {
            return None;
        }
        let (entries, n) = self.long_walk(mem, la);
        // PS is reserved in a PML4 entry, which the walk reads first.
        if entries[0] & PRESENT != 0 && entries[0] & PAGE_SIZE_BIT != 0 {
            return Some(code(true, true));
        }
        let entries = &entries[..n];
        if entries[n - 1] & PRESENT == 0 {
            return Some(code(false, false));
        }
        let user_page = entries.iter().all(|e| e & USER != 0);
        let writable = entries.iter().all(|e| e & WRITABLE != 0);
        let exec = self.efer & EFER_NXE == 0 || entries.iter().all(|e| e & XD == 0);
        let denied = match kind {
            Access::Fetch if !exec => true,
            _ if user_mode => !user_page || kind == Access::Write && !writable,
            Access::Fetch => user_page && self.cr4 & CR4_SMEP != 0,
            _ => {
                kind == Access::Write && !writable && self.cr0 & CR0_WP != 0
                    || user_page && self.cr4 & CR4_SMAP != 0 && !ac
            }
        };
        denied.then(|| code(true, false))
    }

    /// The guest-physical address linear address `la` translates to for an access of `kind` at
    /// the CPL that neither faults ([`Self::page_fault`]) nor has the processor set an accessed
    /// or dirty flag on its way (SDM Vol. 3A 4.8: every paging-structure entry the translation
    /// uses has A set, and the entry that maps the page has D set for a write): an access that
    /// may go straight to guest memory, as the processor's would. `None` otherwise, and outside
    /// 4-level paging.
    pub fn quiet_translation(&self, mem: &GuestMemoryMmap, la: u64, kind: Access, ac: bool) -> Option<u64> {
        const ACCESSED: u64 = 1 << 5;
        const DIRTY: u64 = 1 << 6;
        /// CR4.LA57: 5-level paging, which this walk does not do.
        const CR4_LA57: u64 = 1 << 12;
        if self.cr0 & CR0_PG == 0
            || self.efer & EFER_LMA == 0
            || self.cr4 & CR4_LA57 != 0
            || self.page_fault(mem, la, kind, ac).is_some()
        {
            return None;
        }
        let (entries, n) = self.long_walk(mem, la);
        let leaf = entries[n - 1];
        if entries[..n].iter().any(|e| e & ACCESSED == 0) || kind == Access::Write && leaf & DIRTY == 0 {
            return None;
        }
        let size = 1u64 << LONG_SHIFTS[n - 1];
        Some((leaf & ADDR_MASK & !(size - 1)) | (la & (size - 1)))
    }

    /// The page fault an access of `kind` to the `len` bytes at linear address `la` raises, if
    /// one does: its error code ([`Self::page_fault`]) and the address CR2 takes, the first byte
    /// it cannot reach.
    pub fn span_page_fault(
        &self,
        mem: &GuestMemoryMmap,
        la: u64,
        len: u64,
        kind: Access,
        ac: bool,
    ) -> Option<(u32, u64)> {
        let end = la.saturating_add(len.max(1));
        let mut page = la & !0xFFF;
        while page < end {
            let at = page.max(la);
            if let Some(code) = self.page_fault(mem, at, kind, ac) {
                return Some((code, at));
            }
            page += 0x1000;
        }
        None
    }

    /// The 4-level paging walk of linear address `la` (SDM Vol. 3A 4.5): the entries it reads,
    /// from the PML4 entry to the one that maps the page or the first that is not present (an
    /// entry outside guest memory reads as not present), and how many. The PML4 entry's PS bit
    /// (reserved) does not end it.
    fn long_walk(&self, mem: &GuestMemoryMmap, la: u64) -> ([u64; 4], usize) {
        let mut entries = [0u64; 4];
        let mut table = self.cr3 & ADDR_MASK;
        for (n, shift) in LONG_SHIFTS.into_iter().enumerate() {
            let e = mem.read_obj::<u64>(GuestAddress(table + ((la >> shift) & 0x1FF) * 8)).unwrap_or(0);
            entries[n] = e;
            if e & PRESENT == 0 || n == 3 || n > 0 && e & PAGE_SIZE_BIT != 0 {
                return (entries, n + 1);
            }
            table = e & ADDR_MASK;
        }
        unreachable!("the walk ends at the fourth entry")
    }

    /// Up to 15 bytes of code at linear address `la` (fewer if a page is unmapped).
    pub fn fetch(&self, mem: &GuestMemoryMmap, la: u64) -> Vec<u8> {
        let mut out = Vec::with_capacity(15);
        let mut a = la;
        while out.len() < 15 {
            let Some(pa) = self.translate(mem, a) else { break };
            let n = (15 - out.len()).min((0x1000 - (a & 0xFFF)) as usize);
            let mut buf = vec![0u8; n];
            if mem.read_slice(&mut buf, GuestAddress(pa)).is_err() {
                break;
            }
            out.extend_from_slice(&buf);
            a += n as u64;
        }
        out
    }

    /// The segment register `selector` loads from the GDT at `gdt_base` (SDM Vol. 3A 3.4.5,
    /// Figure 3-8), as KVM represents it; a null selector gives an unusable segment. `None` when
    /// the descriptor cannot be read.
    pub fn segment(&self, mem: &GuestMemoryMmap, gdt_base: u64, selector: u16) -> Option<kvm_segment> {
        if selector & !3 == 0 {
            return Some(kvm_segment { selector, unusable: 1, ..Default::default() });
        }
        let pa = self.translate(mem, gdt_base + u64::from(selector & !7))?;
        Some(segment_from_descriptor(mem.read_obj::<u64>(GuestAddress(pa)).ok()?, selector))
    }

    /// The handler address of IDT vector `v` in long mode (16-byte gates).
    pub fn idt_handler(&self, mem: &GuestMemoryMmap, v: u8) -> Option<u64> {
        let (size, off) = if self.efer & EFER_LMA != 0 { (16u64, v as u64 * 16) } else { (8, v as u64 * 8) };
        if off + size - 1 > self.idt_limit as u64 {
            return None;
        }
        let pa = self.translate(mem, self.idt_base + off)?;
        let lo = mem.read_obj::<u64>(GuestAddress(pa)).ok()?;
        let mut addr = (lo & 0xFFFF) | ((lo >> 32) & 0xFFFF_0000);
        if size == 16 {
            let hi = mem.read_obj::<u64>(GuestAddress(pa + 8)).ok()?;
            addr |= (hi & 0xFFFF_FFFF) << 32;
        }
        Some(addr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mem() -> GuestMemoryMmap {
        GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 8 << 20)]).unwrap()
    }

    #[test]
    fn walks_4_level_tables_with_4k_and_2m_pages() {
        let m = mem();
        // PML4 at 0x1000 -> PDPT 0x2000 -> PD 0x3000: PDE 0 is a 2 MiB page at 4 MiB,
        // PDE 1 -> PT 0x4000 whose entry 5 maps 0x60_0000.
        m.write_obj(0x2000u64 | 3, GuestAddress(0x1000)).unwrap();
        m.write_obj(0x3000u64 | 3, GuestAddress(0x2000)).unwrap();
        m.write_obj(0x40_0000u64 | 0x83, GuestAddress(0x3000)).unwrap();
        m.write_obj(0x4000u64 | 3, GuestAddress(0x3008)).unwrap();
        m.write_obj(0x60_0000u64 | 3, GuestAddress(0x4000 + 5 * 8)).unwrap();
        let c = CpuMode { cr0: CR0_PG, cr3: 0x1000, cr4: CR4_PAE, efer: EFER_LMA, ..Default::default() };
        assert_eq!(c.translate(&m, 0x1234), Some(0x40_1234));
        assert_eq!(c.translate(&m, 0x20_5678), Some(0x60_0678));
        assert_eq!(c.translate(&m, 0x40_0000), None);
        let off = CpuMode::default();
        assert_eq!(off.translate(&m, 0x1234), Some(0x1234));
    }

    #[test]
    fn page_faults_carry_the_error_code_of_the_walk() {
        let m = mem();
        // PML4 -> PDPT -> PD, user and writable; PDE 0 a 2 MiB supervisor page; PDE 1 -> a PT
        // whose entry 5 is a user, read-only page and entry 6 is not present.
        m.write_obj(0x2000u64 | 7, GuestAddress(0x1000)).unwrap();
        m.write_obj(0x3000u64 | 7, GuestAddress(0x2000)).unwrap();
        m.write_obj(0x40_0000u64 | 0x83, GuestAddress(0x3000)).unwrap();
        m.write_obj(0x4000u64 | 7, GuestAddress(0x3008)).unwrap();
        m.write_obj(0x60_0000u64 | 5, GuestAddress(0x4000 + 5 * 8)).unwrap();
        let c = CpuMode { cpl: 3, cr0: CR0_PG, cr3: 0x1000, cr4: CR4_PAE, efer: EFER_LMA, ..Default::default() };
        assert_eq!(c.page_fault(&m, 0x20_5000, Access::Read, false), None);
        assert_eq!(c.page_fault(&m, 0x20_5000, Access::Write, false), Some(0b111), "P, W, U");
        assert_eq!(c.page_fault(&m, 0x20_6000, Access::Read, false), Some(0b100), "not present");
        assert_eq!(c.page_fault(&m, 0x1000, Access::Fetch, false), Some(0b101), "supervisor page, no NXE: no I/D");

        // Supervisor-mode accesses: no U/S; CR0.WP for writes to read-only pages; SMAP and SMEP.
        let k = CpuMode { cpl: 0, ..c };
        assert_eq!(k.page_fault(&m, 0x1000, Access::Write, false), None);
        assert_eq!(k.page_fault(&m, 0x20_5000, Access::Write, false), None, "read-only without CR0.WP");
        assert_eq!(k.page_fault(&m, 0x20_6000, Access::Write, true), Some(0b010), "not present, W");
        let wp = CpuMode { cr0: CR0_PG | CR0_WP, ..k };
        assert_eq!(wp.page_fault(&m, 0x20_5000, Access::Write, true), Some(0b011), "read-only with CR0.WP");
        let smap = CpuMode { cr4: CR4_PAE | CR4_SMAP | CR4_SMEP, ..k };
        assert_eq!(smap.page_fault(&m, 0x20_5000, Access::Read, false), Some(0b001), "SMAP without AC");
        assert_eq!(smap.page_fault(&m, 0x20_5000, Access::Read, true), None, "SMAP with AC (STAC)");
        assert_eq!(smap.page_fault(&m, 0x20_5000, Access::Fetch, true), Some(0b001), "SMEP");
        m.write_obj(0x2000u64 | 0x87, GuestAddress(0x1000)).unwrap();
        assert_eq!(c.page_fault(&m, 0x20_5000, Access::Read, false), Some(0b1101), "PS in the PML4E: RSVD");
    }

    #[test]
    fn decodes_segment_descriptors() {
        let m = mem();
        m.write_obj(0x00AF_FA00_0000_FFFFu64, GuestAddress(0x5020)).unwrap(); // user code, 64-bit, DPL 3
        m.write_obj(0x00CF_F200_0000_FFFFu64, GuestAddress(0x5018)).unwrap(); // user data, DPL 3
        let c = CpuMode::default();
        let cs = c.segment(&m, 0x5000, 0x23).unwrap();
        assert_eq!((cs.type_, cs.dpl, cs.l, cs.db, cs.s, cs.present, cs.g), (0xB - 1, 3, 1, 0, 1, 1, 1));
        assert_eq!((cs.base, cs.limit, cs.selector, cs.unusable), (0, 0xFFFF_FFFF, 0x23, 0));
        let ds = c.segment(&m, 0x5000, 0x1B).unwrap();
        assert_eq!((ds.type_, ds.dpl, ds.db, ds.l), (0x2, 3, 1, 0));
        assert_eq!(c.segment(&m, 0x5000, 0).unwrap().unusable, 1);
    }

    #[test]
    fn fetch_stops_at_an_unmapped_page() {
        let m = mem();
        m.write_slice(&[0x90; 16], GuestAddress(0x7FF8)).unwrap();
        let c = CpuMode::default();
        assert_eq!(c.fetch(&m, 0x7FF8).len(), 15);
    }
}
