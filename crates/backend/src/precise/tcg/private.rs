//! The engine's private region: a few pages of memory only the engine maps, above any guest RAM,
//! with page tables and the short trampolines through which emon loads and reads state that
//! unicorn's API cannot reach directly. unicorn checks a segment load through its API as the
//! instruction would be checked (an SS with RPL 3 at CPL 0 is refused), has no API for XCR0, and
//! reads the x87 registers by physical number. So emon lets the engine's own instructions do it,
//! as the guest's would:
//! - FXRSTOR64 / FXSAVE64 move the x87, MMX and SSE state (the legacy region of an XSAVE image);
//! - XSETBV / XGETBV set and read XCR0;
//! - IRETQ enters CPL3 with the guest's own descriptors (read from its GDT, as on silicon);
//! - a far CALL through a call gate of the region's own GDT brings the engine back from CPL3 to
//!   CPL0 (unicorn's SYSCALL and SYSENTER only call hooks).
//!
//! During a trampoline CR3 points at a copy of the guest's top-level page table with one free
//! slot mapping this region, so that the guest's mappings (its GDT, for IRETQ) stay reachable; the
//! guest's CR3 is put back before the guest's code runs. The guest never sees the region: it is
//! not guest-physical memory, and no guest page table maps it.
use super::{uc_err, Data, TcgError};
use unicorn_engine::unicorn_const::Prot;
use unicorn_engine::{RegisterX86, Unicorn};

/// Where the region lives in the engine's physical address space: 1 MiB below 2^40, the
/// smallest physical-address width an x86-64 CPU has, and far above the guest's RAM (at most
/// 3 GiB, below 4 GiB) and MMIO.
pub const PHYS: u64 = 0xFF_FFF0_0000;
const PAGE: u64 = 0x1000;
/// Pages: the top-level table (the guest's copy), the tables that map the region, code for CPL0,
/// code for CPL3, a data page (the FXSAVE image), a stack page (the IRETQ frame, and the call
/// gate's stack), and the GDT and TSS of the call-gate trampoline.
const TOP: u64 = 0;
const L3: u64 = 1;
const L2: u64 = 2;
const L1: u64 = 3;
pub const CODE: u64 = 4;
pub const USER_CODE: u64 = 5;
pub const DATA: u64 = 6;
pub const STACK: u64 = 7;
pub const GDT: u64 = 8;
pub const TSS: u64 = 9;
const PAGES: u64 = 10;
pub const SIZE: u64 = PAGES * PAGE;

/// Supervisor trampolines, at their offsets in the CPL0 code page; each ends in UD2, whose #UD
/// stops the engine there.
pub const XSETBV: u64 = 0x00;
pub const FXRSTOR: u64 = 0x10;
pub const FXSAVE: u64 = 0x20;
pub const XGETBV: u64 = 0x30;
pub const IRETQ: u64 = 0x40;
/// Where the call gate from the CPL3 page lands.
pub const GATE_TARGET: u64 = 0x50;
const CODE_BYTES: &[(u64, &[u8])] = &[
    (XSETBV, &[0x0F, 0x01, 0xD1, 0x0F, 0x0B]),        // xsetbv; ud2
    (FXRSTOR, &[0x48, 0x0F, 0xAE, 0x0F, 0x0F, 0x0B]), // fxrstor64 [rdi]; ud2
    (FXSAVE, &[0x48, 0x0F, 0xAE, 0x07, 0x0F, 0x0B]),  // fxsave64 [rdi]; ud2
    (XGETBV, &[0x0F, 0x01, 0xD0, 0x0F, 0x0B]),        // xgetbv; ud2
    (IRETQ, &[0x48, 0xCF]),                           // iretq (the run stops at the first block after it)
    (GATE_TARGET, &[0x0F, 0x0B]),                     // ud2
];
/// The CPL3 trampoline: `call far qword [rip + 9]`, through the far pointer at [`FAR_POINTER`].
const USER_CODE_BYTES: &[u8] = &[0x48, 0xFF, 0x1D, 0x09, 0x00, 0x00, 0x00];
pub const FAR_POINTER: u64 = 0x10;
/// The trampoline GDT's selectors: a 64-bit CPL0 code segment, and a 64-bit call gate to it
/// that CPL3 may use (SDM Vol. 3A 5.8.3.1 "IA-32e Mode Call Gates").
pub const GATE_CS: u16 = 0x08;
pub const GATE: u16 = 0x10;

const PRESENT: u64 = 1;
const WRITABLE: u64 = 1 << 1;
const USER: u64 = 1 << 2;
/// The physical-address bits of a paging-structure entry.
const ADDR: u64 = 0x000F_FFFF_FFFF_F000;

/// Maps the region into `uc` and writes its code and the tables below the top level.
pub fn map(uc: &mut Unicorn<'static, Data>) -> Result<(), TcgError> {
    uc.mem_map(PHYS, SIZE, Prot::ALL).map_err(uc_err("mapping the private region"))?;
    for (off, bytes) in CODE_BYTES {
        uc.mem_write(PHYS + CODE * PAGE + off, bytes).map_err(uc_err("writing the trampolines"))?;
    }
    uc.mem_write(PHYS + USER_CODE * PAGE, USER_CODE_BYTES).map_err(uc_err("writing the trampolines"))?;
    // The region's own chain: L3[0] -> L2[0] -> L1[i] -> page i, user-accessible only where CPL3
    // code runs (the user code page), so that SMEP and SMAP never object.
    let entry = |page: u64, user: bool| (PHYS + page * PAGE) | PRESENT | WRITABLE | if user { USER } else { 0 };
    let code64 = 0x0020_9A00_0000_0000u64; // present, DPL0, execute/read, L
    uc.mem_write(PHYS + GDT * PAGE + u64::from(GATE_CS), &code64.to_le_bytes()).map_err(uc_err("writing the GDT"))?;
    uc.mem_write(PHYS + L3 * PAGE, &entry(L2, true).to_le_bytes()).map_err(uc_err("writing the tables"))?;
    uc.mem_write(PHYS + L2 * PAGE, &entry(L1, true).to_le_bytes()).map_err(uc_err("writing the tables"))?;
    for page in 0..PAGES {
        let e = entry(page, page == USER_CODE);
        uc.mem_write(PHYS + L1 * PAGE + 8 * page, &e.to_le_bytes()).map_err(uc_err("writing the tables"))?;
    }
    Ok(())
}

/// The region as mapped for one trampoline: the CR3 to run it with, and the linear address of
/// its first page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mapped {
    pub cr3: u64,
    pub base: u64,
}

impl Mapped {
    /// The linear address of `offset` in `page`.
    pub fn at(&self, page: u64, offset: u64) -> u64 {
        self.base + page * PAGE + offset
    }

    /// The physical address of `offset` in `page`.
    pub fn phys(page: u64, offset: u64) -> u64 {
        PHYS + page * PAGE + offset
    }
}

/// Copies the guest's top-level page table (at `guest_cr3`; with 5-level paging when `la57`)
/// into the region and maps the region in a slot the guest leaves free. `None` when the guest
/// uses every slot of its lower half (then nothing is left to map the region with).
pub fn map_over(uc: &mut Unicorn<'static, Data>, guest_cr3: u64, la57: bool) -> Result<Option<Mapped>, TcgError> {
    let mut top = vec![0u8; PAGE as usize];
    uc.mem_read(guest_cr3 & ADDR, &mut top).map_err(uc_err("reading the guest's page table"))?;
    let entry = |i: usize| u64::from_le_bytes(top[8 * i..8 * i + 8].try_into().expect("8 bytes"));
    // A free slot of the lower half (canonical addresses with bit 47, or 56, clear); not 0, which
    // guests use most.
    let Some(slot) = (1..256).find(|&i| entry(i) & PRESENT == 0) else { return Ok(None) };
    // With 5-level paging the top level maps 256 TiB a slot: its entry points at a level-4 table
    // whose first entry is the region's L3 chain. The region's L3 page serves as that table's
    // copy-free second level by pointing its entry 0 at L2, so the chain is one level deeper;
    // emon keeps 4-level tables and does not run 5-level guests in the engine.
    if la57 {
        return Ok(None);
    }
    let chain = (PHYS + L3 * PAGE) | PRESENT | WRITABLE | USER;
    top[8 * slot..8 * slot + 8].copy_from_slice(&chain.to_le_bytes());
    uc.mem_write(PHYS + TOP * PAGE, &top).map_err(uc_err("writing the private page table"))?;
    Ok(Some(Mapped { cr3: PHYS + TOP * PAGE, base: (slot as u64) << 39 }))
}

/// Points the call-gate trampoline at the region as mapped by `m`: the far pointer in the CPL3
/// page, the gate's target and the TSS's RSP0.
pub fn aim_gate(uc: &mut Unicorn<'static, Data>, m: Mapped) -> Result<(), TcgError> {
    let w = uc_err("writing the call gate");
    let target = m.at(CODE, GATE_TARGET);
    let mut far = target.to_le_bytes().to_vec();
    far.extend((GATE | 3).to_le_bytes());
    uc.mem_write(Mapped::phys(USER_CODE, FAR_POINTER), &far).map_err(&w)?;
    // A 64-bit call gate: offset 15:0, selector, type 0xC, DPL3, present, offset 31:16; then
    // offset 63:32 (SDM Vol. 3A, Figure 5-9).
    let lo = (target & 0xFFFF) | u64::from(GATE_CS) << 16 | 0xEC << 40 | ((target >> 16) & 0xFFFF) << 48;
    let hi = target >> 32;
    uc.mem_write(Mapped::phys(GDT, u64::from(GATE)), &lo.to_le_bytes()).map_err(&w)?;
    uc.mem_write(Mapped::phys(GDT, u64::from(GATE) + 8), &hi.to_le_bytes()).map_err(&w)?;
    // RSP0 of a 64-bit TSS (byte 4): where the gate switches the stack to.
    uc.mem_write(Mapped::phys(TSS, 4), &m.at(STACK, 0xF00).to_le_bytes()).map_err(&w)
}

/// Runs the trampoline at `entry` (a linear address in the region) with the registers in
/// `regs`, under `mapped.cr3`, until it stops; the RIP it stopped at. The caller restores CR3.
pub fn run(
    uc: &mut Unicorn<'static, Data>,
    mapped: Mapped,
    entry: u64,
    regs: &[(RegisterX86, u64)],
) -> Result<u64, TcgError> {
    uc.reg_write(RegisterX86::CR3, mapped.cr3).map_err(uc_err("entering the private region"))?;
    for (r, v) in regs {
        uc.reg_write(*r, *v).map_err(uc_err("loading a trampoline's registers"))?;
    }
    uc.get_data_mut().trampoline = Some((mapped.base, mapped.base + SIZE));
    // The run ends at the trampoline's UD2 (an error return) or before the first block outside
    // the region (the block hook); either way the RIP says where.
    let _ = super::state::start(uc, entry, 0);
    uc.get_data_mut().trampoline = None;
    uc.reg_read(RegisterX86::RIP).map_err(uc_err("reading RIP after a trampoline"))
}
