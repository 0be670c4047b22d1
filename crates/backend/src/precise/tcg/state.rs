//! The vCPU state an engine run starts from and gives back ([`CpuState`]), and how it goes into
//! and out of the engine: through unicorn's register API where that API can set it, through the
//! private region's trampolines ([`super::private`]) where it cannot (CPL3, XCR0, the x87/SSE
//! registers).
use super::blocks::Needs;
use super::private::{self, Mapped};
use super::{uc_err, Data, TcgError};
use emon_x86::arch::{
    CR0_EM, CR0_TS, CR4_LA57, CR4_OSXSAVE, IA32_CSTAR, IA32_EFER, IA32_FMASK, IA32_KERNEL_GS_BASE, IA32_LSTAR,
    IA32_STAR,
};
use emon_x86::fpu::{Fpu, LEGACY};
use emon_x86::mode::CpuMode;
use kvm_bindings::{kvm_regs, kvm_segment, kvm_sregs};
use unicorn_engine::{RegisterX86, Unicorn};
use vm_memory::GuestMemoryMmap;

/// The MSRs SYSCALL, SYSRET and SWAPGS use (SDM Vol. 3A 5.8.8), which the engine holds only when
/// a run may execute them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SysMsrs {
    pub star: u64,
    pub lstar: u64,
    pub cstar: u64,
    pub fmask: u64,
    pub kernel_gs_base: u64,
}

impl SysMsrs {
    /// The MSRs, in [`SysMsrs::values`] order.
    pub const INDICES: [u32; 5] = [IA32_STAR, IA32_LSTAR, IA32_CSTAR, IA32_FMASK, IA32_KERNEL_GS_BASE];

    pub fn values(&self) -> [u64; 5] {
        [self.star, self.lstar, self.cstar, self.fmask, self.kernel_gs_base]
    }

    pub fn from_values(v: [u64; 5]) -> SysMsrs {
        SysMsrs { star: v[0], lstar: v[1], cstar: v[2], fmask: v[3], kernel_gs_base: v[4] }
    }
}

/// A vCPU's state as an engine run uses it. `msrs` and `fpu` are there when the run may use them
/// (see [`super::Needs`]); the rest always.
#[derive(Debug, Clone, PartialEq)]
pub struct CpuState {
    pub regs: kvm_regs,
    pub sregs: kvm_sregs,
    pub msrs: Option<SysMsrs>,
    pub fpu: Option<Fpu>,
}

impl CpuState {
    /// The general registers and the control state, without the optional parts.
    pub fn new(regs: kvm_regs, sregs: kvm_sregs) -> CpuState {
        CpuState { regs, sregs, msrs: None, fpu: None }
    }
}

#[repr(C)]
struct Mmr {
    selector: u16,
    base: u64,
    limit: u32,
    flags: u32,
}

#[repr(C)]
struct Msr {
    rid: u32,
    value: u64,
}

fn bytes_of<T>(v: &T) -> &[u8] {
    // SAFETY: `T` is a plain repr(C) struct; its bytes (padding included) are read as the C API reads them.
    unsafe { std::slice::from_raw_parts(v as *const T as *const u8, std::mem::size_of::<T>()) }
}

pub fn write_msr(uc: &mut Unicorn<'static, Data>, rid: u32, value: u64) -> Result<(), TcgError> {
    uc.reg_write_long(RegisterX86::MSR, bytes_of(&Msr { rid, value })).map_err(uc_err("writing an MSR"))
}

pub fn read_msr(uc: &mut Unicorn<'static, Data>, rid: u32) -> Result<u64, TcgError> {
    // The register API reads an MSR whose index it is given in the same structure, which the
    // crate's safe readers do not fill in.
    let mut m = Msr { rid, value: 0 };
    // SAFETY: `m` is the uc_x86_msr the call reads the index from and writes the value to; the
    // handle is the engine's own.
    let e = unsafe { unicorn_engine::uc_reg_read(uc.get_handle(), RegisterX86::MSR as i32, (&raw mut m).cast()) };
    if e != unicorn_engine::unicorn_const::uc_error::OK {
        return Err(TcgError::Engine { what: "reading an MSR", err: e });
    }
    Ok(m.value)
}

/// The general-purpose registers and RFLAGS, each with its unicorn name (RIP is set apart).
pub fn gprs(r: &mut kvm_regs) -> [(RegisterX86, &mut u64); 17] {
    [
        (RegisterX86::RAX, &mut r.rax),
        (RegisterX86::RBX, &mut r.rbx),
        (RegisterX86::RCX, &mut r.rcx),
        (RegisterX86::RDX, &mut r.rdx),
        (RegisterX86::RSI, &mut r.rsi),
        (RegisterX86::RDI, &mut r.rdi),
        (RegisterX86::RSP, &mut r.rsp),
        (RegisterX86::RBP, &mut r.rbp),
        (RegisterX86::R8, &mut r.r8),
        (RegisterX86::R9, &mut r.r9),
        (RegisterX86::R10, &mut r.r10),
        (RegisterX86::R11, &mut r.r11),
        (RegisterX86::R12, &mut r.r12),
        (RegisterX86::R13, &mut r.r13),
        (RegisterX86::R14, &mut r.r14),
        (RegisterX86::R15, &mut r.r15),
        (RegisterX86::RFLAGS, &mut r.rflags),
    ]
}

/// `emu_start` from `pc` (with unicorn's instruction count `count`, 0 for none), CR2 the vCPU's
/// ([`Data::cr2`]). No exception is delivered inside the engine (each stops it), so nothing a run
/// does sets CR2; but unicorn's own page walks outside the guest's instructions set it where they
/// fault: dropping a translation (`ctl_remove_cache`, e.g. at a user-mode breakpoint while the
/// engine is at CPL0) and dropping the translation before the run's `until` after every run.
/// Kernel code reads CR2 in the engine (`blocks::classify`).
pub fn start(uc: &mut Unicorn<'static, Data>, pc: u64, count: usize) -> Result<(), unicorn_engine::uc_error> {
    uc.reg_write(RegisterX86::CR2, uc.get_data().cr2)?;
    uc.emu_start(pc, u64::MAX, 0, count)
}

/// The privilege level the engine's CPU is at.
pub fn cpl(uc: &Unicorn<'static, Data>) -> Result<u8, TcgError> {
    Ok((uc.reg_read(RegisterX86::CS).map_err(uc_err("reading CS"))? & 3) as u8)
}

/// Loads `s` into the engine (see the module documentation).
pub fn load(uc: &mut Unicorn<'static, Data>, s: &CpuState) -> Result<(), TcgError> {
    let w = uc_err("loading the vCPU state");
    if cpl(uc)? == 3 {
        leave_user(uc)?;
    }
    let r = &s.sregs;
    uc.reg_write(RegisterX86::CR4, r.cr4).map_err(&w)?;
    write_msr(uc, IA32_EFER, r.efer)?;
    uc.reg_write(RegisterX86::CR3, r.cr3).map_err(&w)?;
    uc.reg_write(RegisterX86::CR0, r.cr0).map_err(&w)?;
    // CR2 is written at each start ([`start`]).
    uc.get_data_mut().cr2 = r.cr2;
    for (reg, dt) in [(RegisterX86::GDTR, &r.gdt), (RegisterX86::IDTR, &r.idt)] {
        let m = Mmr { selector: 0, base: dt.base, limit: u32::from(dt.limit), flags: 0 };
        uc.reg_write_long(reg, bytes_of(&m)).map_err(&w)?;
    }
    for (reg, seg) in [(RegisterX86::LDTR, &r.ldt), (RegisterX86::TR, &r.tr)] {
        let m = Mmr { selector: seg.selector, base: seg.base, limit: seg.limit, flags: descriptor_flags(seg) };
        uc.reg_write_long(reg, bytes_of(&m)).map_err(&w)?;
    }
    load_msrs(uc, s.msrs.as_ref())?;
    if let Some(f) = &s.fpu {
        if !uc.get_data().fpu.as_ref().is_some_and(|held| held.same_legacy_state(f)) {
            load_fpu(uc, f, r)?;
        }
    }
    // Data segments first: at CPL0 every descriptor a CPL3 program may use loads. A selector
    // whose descriptor no longer loads (the GDT changed under a loaded segment) goes in as null:
    // in 64-bit mode only FS's and GS's bases matter, and those are written below.
    for (reg, seg) in
        [(RegisterX86::DS, &r.ds), (RegisterX86::ES, &r.es), (RegisterX86::FS, &r.fs), (RegisterX86::GS, &r.gs)]
    {
        if uc.reg_write(reg, u64::from(seg.selector)).is_err() {
            uc.reg_write(reg, 0).map_err(&w)?;
        }
    }
    if r.cs.selector & 3 == 3 {
        enter_user(uc, s)?;
    } else {
        uc.reg_write(RegisterX86::SS, u64::from(r.ss.selector)).map_err(&w)?;
        uc.reg_write(RegisterX86::CS, u64::from(r.cs.selector)).map_err(&w)?;
    }
    uc.reg_write(RegisterX86::FS_BASE, r.fs.base).map_err(&w)?;
    uc.reg_write(RegisterX86::GS_BASE, r.gs.base).map_err(&w)?;
    load_gprs(uc, &s.regs)
}

/// Loads the SYSCALL MSRs, where the state has them.
pub fn load_msrs(uc: &mut Unicorn<'static, Data>, m: Option<&SysMsrs>) -> Result<(), TcgError> {
    for (rid, v) in m.iter().flat_map(|m| SysMsrs::INDICES.iter().zip(m.values())) {
        write_msr(uc, *rid, v)?;
    }
    Ok(())
}

/// Loads the general registers, RFLAGS and RIP.
pub fn load_gprs(uc: &mut Unicorn<'static, Data>, r: &kvm_regs) -> Result<(), TcgError> {
    let w = uc_err("loading the vCPU state");
    let mut values = *r;
    for (reg, v) in gprs(&mut values) {
        uc.reg_write(reg, *v).map_err(&w)?;
    }
    uc.reg_write(RegisterX86::RIP, r.rip).map_err(&w)
}

/// The access-rights word of a system segment as unicorn's descriptor-table registers take it
/// (the descriptor's bits 8-23 in place, as QEMU keeps them).
fn descriptor_flags(s: &kvm_segment) -> u32 {
    u32::from(s.type_) << 8
        | u32::from(s.s) << 12
        | u32::from(s.dpl) << 13
        | u32::from(s.present) << 15
        | u32::from(s.avl) << 20
        | u32::from(s.l) << 21
        | u32::from(s.db) << 22
        | u32::from(s.g) << 23
}

/// The region mapped over the guest's page tables now, or an error naming why it cannot be.
fn mapped(uc: &mut Unicorn<'static, Data>, cr3: u64, cr4: u64) -> Result<Mapped, TcgError> {
    private::map_over(uc, cr3, cr4 & CR4_LA57 != 0)?
        .ok_or(TcgError::Unsupported("the guest's page tables leave no slot for the engine's private region"))
}

/// Runs a trampoline and checks it ended where it should; puts the guest's CR3 back.
fn trampoline(
    uc: &mut Unicorn<'static, Data>,
    m: Mapped,
    (page, entry, end): (u64, u64, u64),
    regs: &[(RegisterX86, u64)],
    cr3: u64,
    what: &'static str,
) -> Result<(), TcgError> {
    let stopped = private::run(uc, m, m.at(page, entry), regs)?;
    uc.reg_write(RegisterX86::CR3, cr3).map_err(uc_err("leaving the private region"))?;
    if stopped != end {
        return Err(TcgError::Trampoline { what, at: stopped });
    }
    Ok(())
}

/// XCR0, then the legacy region with FXRSTOR64 (at CPL0, CR0.TS and EM clear for the while).
fn load_fpu(uc: &mut Unicorn<'static, Data>, f: &Fpu, s: &kvm_sregs) -> Result<(), TcgError> {
    let m = mapped(uc, s.cr3, s.cr4)?;
    uc.reg_write(RegisterX86::CR0, s.cr0 & !(CR0_TS | CR0_EM)).map_err(uc_err("loading CR0"))?;
    if s.cr4 & CR4_OSXSAVE != 0 {
        let regs = [(RegisterX86::RCX, 0), (RegisterX86::RAX, f.xcr0 & 0xFFFF_FFFF), (RegisterX86::RDX, f.xcr0 >> 32)];
        let end = m.at(private::CODE, private::XSETBV + 3);
        trampoline(
            uc,
            m,
            (private::CODE, private::XSETBV, end),
            &regs,
            s.cr3,
            "XSETBV (XCR0 has bits the engine lacks)",
        )?;
    }
    uc.mem_write(Mapped::phys(private::DATA, 0), &f.legacy[..]).map_err(uc_err("writing the FXSAVE image"))?;
    let end = m.at(private::CODE, private::FXRSTOR + 4);
    let regs = [(RegisterX86::RDI, m.at(private::DATA, 0))];
    trampoline(uc, m, (private::CODE, private::FXRSTOR, end), &regs, s.cr3, "FXRSTOR64")?;
    uc.get_data_mut().fpu_loads += 1;
    hold_fpu(uc, s, Fpu::legacy_only(f.legacy.clone(), f.xcr0));
    uc.reg_write(RegisterX86::CR0, s.cr0).map_err(uc_err("loading CR0"))
}

/// Records that the engine's x87/SSE registers and XCR0 hold `f` (`Data::fpu`), as just loaded
/// or read. Without CR4.OSXSAVE neither XSETBV nor XGETBV ran, so emon does not know XCR0.
fn hold_fpu(uc: &mut Unicorn<'static, Data>, s: &kvm_sregs, f: Fpu) {
    uc.get_data_mut().fpu = (s.cr4 & CR4_OSXSAVE != 0).then_some(f);
}

/// The legacy region (FXSAVE64) and XCR0 the engine holds now. Clobbers the general registers:
/// call after reading them. Leaves the engine at CPL0.
pub fn store_fpu(uc: &mut Unicorn<'static, Data>, s: &kvm_sregs) -> Result<Fpu, TcgError> {
    if cpl(uc)? == 3 {
        leave_user(uc)?;
    }
    let m = mapped(uc, s.cr3, s.cr4)?;
    uc.reg_write(RegisterX86::CR0, s.cr0 & !(CR0_TS | CR0_EM)).map_err(uc_err("loading CR0"))?;
    let end = m.at(private::CODE, private::FXSAVE + 4);
    let regs = [(RegisterX86::RDI, m.at(private::DATA, 0))];
    trampoline(uc, m, (private::CODE, private::FXSAVE, end), &regs, s.cr3, "FXSAVE64")?;
    let mut legacy = Box::new([0u8; LEGACY]);
    uc.mem_read(Mapped::phys(private::DATA, 0), &mut legacy[..]).map_err(uc_err("reading the FXSAVE image"))?;
    let mut xcr0 = 1;
    if s.cr4 & CR4_OSXSAVE != 0 {
        let end = m.at(private::CODE, private::XGETBV + 3);
        trampoline(uc, m, (private::CODE, private::XGETBV, end), &[(RegisterX86::RCX, 0)], s.cr3, "XGETBV")?;
        let lo = uc.reg_read(RegisterX86::RAX).map_err(uc_err("reading XCR0"))?;
        let hi = uc.reg_read(RegisterX86::RDX).map_err(uc_err("reading XCR0"))?;
        xcr0 = (hi << 32) | (lo & 0xFFFF_FFFF);
    }
    uc.reg_write(RegisterX86::CR0, s.cr0).map_err(uc_err("loading CR0"))?;
    let f = Fpu::legacy_only(legacy, xcr0);
    hold_fpu(uc, s, f.clone());
    Ok(f)
}

/// Enters CPL3 with the state's CS, SS, RIP, RSP and RFLAGS through an IRETQ at CPL0, which
/// loads CS and SS from the guest's GDT as the processor would.
fn enter_user(uc: &mut Unicorn<'static, Data>, s: &CpuState) -> Result<(), TcgError> {
    let r = &s.sregs;
    let m = mapped(uc, r.cr3, r.cr4)?;
    // The engine is at CPL0 here (see `load`), with the guest's CS for a flat 64-bit CPL0 code
    // segment it already had; the frame is the one IRETQ pops (SDM Vol. 3A 6.14.3).
    let frame = [s.regs.rip, u64::from(r.cs.selector), s.regs.rflags, s.regs.rsp, u64::from(r.ss.selector)];
    let top = 4096 - 8 * frame.len() as u64;
    let bytes: Vec<u8> = frame.iter().flat_map(|v| v.to_le_bytes()).collect();
    uc.mem_write(Mapped::phys(private::STACK, top), &bytes).map_err(uc_err("writing the IRETQ frame"))?;
    let regs = [(RegisterX86::RSP, m.at(private::STACK, top))];
    trampoline(uc, m, (private::CODE, private::IRETQ, s.regs.rip), &regs, r.cr3, "IRETQ to CPL3")?;
    if cpl(uc)? != 3 {
        return Err(TcgError::Trampoline { what: "IRETQ to CPL3", at: s.regs.rip });
    }
    Ok(())
}

/// Brings the engine from CPL3 to CPL0 with a far CALL through the region's call gate (its own
/// GDT and TSS for the while; the caller loads the guest's descriptor tables after).
fn leave_user(uc: &mut Unicorn<'static, Data>) -> Result<(), TcgError> {
    let w = uc_err("leaving CPL3");
    let cr3 = uc.reg_read(RegisterX86::CR3).map_err(&w)?;
    let cr4 = uc.reg_read(RegisterX86::CR4).map_err(&w)?;
    let m = mapped(uc, cr3, cr4)?;
    private::aim_gate(uc, m)?;
    let gdt = Mmr { selector: 0, base: m.at(private::GDT, 0), limit: 0x1F, flags: 0 };
    uc.reg_write_long(RegisterX86::GDTR, bytes_of(&gdt)).map_err(&w)?;
    // A busy 64-bit TSS (type 0xB), present.
    let tss = Mmr { selector: 0, base: m.at(private::TSS, 0), limit: 0x67, flags: 0x8B << 8 };
    uc.reg_write_long(RegisterX86::TR, bytes_of(&tss)).map_err(&w)?;
    let end = m.at(private::CODE, private::GATE_TARGET);
    trampoline(uc, m, (private::USER_CODE, 0, end), &[], cr3, "the call gate to CPL0")
}

/// The state after a run that started from `before` and stopped at `pc`: the general registers,
/// RIP and RFLAGS the engine holds, and FS's and GS's bases; the segments where `moved` (an
/// IRETQ or SYSRETQ retired: a selector it loaded is decoded from the guest's GDT, as IRETQ
/// loads it; SYSRETQ loads fixed descriptors, SDM Vol. 2B, which a flat GDT holds too); the MSRs and the x87/SSE state where the run had them and `used` says its code may have
/// changed them. The control registers and EFER are `before`'s: the engine hands over every
/// instruction that writes them. Reading the x87/SSE state clobbers the engine's general
/// registers and leaves it at CPL0.
pub fn collect(
    uc: &mut Unicorn<'static, Data>,
    mem: &GuestMemoryMmap,
    before: &CpuState,
    pc: u64,
    (used, moved): (Needs, bool),
) -> Result<CpuState, TcgError> {
    let r = uc_err("reading the engine's state");
    let mut out = before.clone();
    for (reg, slot) in gprs(&mut out.regs) {
        *slot = uc.reg_read(reg).map_err(&r)?;
    }
    out.regs.rip = pc;
    let s = &mut out.sregs;
    if moved {
        let mode = CpuMode::from_sregs(s);
        let gdt = s.gdt.base;
        let slots = [
            (RegisterX86::CS, &mut s.cs),
            (RegisterX86::SS, &mut s.ss),
            (RegisterX86::DS, &mut s.ds),
            (RegisterX86::ES, &mut s.es),
            (RegisterX86::FS, &mut s.fs),
            (RegisterX86::GS, &mut s.gs),
        ];
        for (reg, slot) in slots {
            let selector = uc.reg_read(reg).map_err(&r)? as u16;
            if slot.selector != selector || slot.unusable == 1 {
                match mode.segment(mem, gdt, selector) {
                    Some(seg) => *slot = seg,
                    None => *slot = kvm_segment { selector, unusable: 1, ..kvm_segment::default() },
                }
            }
        }
    }
    s.fs.base = uc.reg_read(RegisterX86::FS_BASE).map_err(&r)?;
    s.gs.base = uc.reg_read(RegisterX86::GS_BASE).map_err(&r)?;
    if used.msrs && before.msrs.is_some() {
        let mut v = [0u64; 5];
        for (rid, slot) in SysMsrs::INDICES.iter().zip(v.iter_mut()) {
            *slot = read_msr(uc, *rid)?;
        }
        out.msrs = Some(SysMsrs::from_values(v));
    }
    if used.fpu && before.fpu.is_some() {
        // The engine holds the x87/SSE state only; the other components are as they were.
        let mut f = store_fpu(uc, &out.sregs)?;
        f.ext = before.fpu.as_ref().map(|b| b.ext.clone()).unwrap_or_default();
        out.fpu = Some(f);
    }
    Ok(out)
}
