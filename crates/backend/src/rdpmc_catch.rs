//! RDPMC outside counted code, completed at the guest's #GP handler: the pure part (no KVM).
//!
//! KVM without a vPMU has no userspace exit for RDPMC: it raises #GP, which the guest's IDT
//! delivers to its #GP handler. A VMM that keeps a hardware instruction breakpoint on that
//! handler's first instruction (at [`gp_handler`], through [`crate::guest_debug`]) exits there
//! before the handler runs, with the exception frame on the handler's stack. [`decide`] reads the
//! frame and the instruction it points at. If that is RDPMC and the PMU model completes it, the
//! vCPU gets the registers RDPMC would have left had it simply retired: EDX:EAX, RIP past it,
//! and RFLAGS, RSP, CS and SS from the frame, as if the exception delivery had not happened.
//! Otherwise the #GP goes on to the guest's handler as it was delivered.
use emon_pmu::pmu::GpFault;
use emon_x86::arch::GP_VECTOR;
use emon_x86::insn::{self, Special};
use emon_x86::mode::{segment_from_descriptor, CpuMode};
use kvm_bindings::{kvm_regs, kvm_segment, kvm_sregs};
use std::fmt;
use vm_memory::GuestMemoryMmap;

const CR0_PE: u64 = 1;
const EFER_LMA: u64 = 1 << 10;
const RFLAGS_TF: u64 = 1 << 8;
const RFLAGS_RF: u64 = 1 << 16;
const RFLAGS_VM: u64 = 1 << 17;
/// Selector bit 2 (TI): the descriptor is in the LDT.
const SELECTOR_TI: u16 = 1 << 2;

/// Why emon cannot keep the breakpoint on the guest's #GP handler. RDPMC outside counted code
/// then gets the #GP that KVM raises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Aside {
    /// Real-address mode: interrupts go through the IVT.
    RealMode,
    /// The IDT does not reach vector 13 (IDTR.limit): no IDT yet.
    NoIdt,
    /// IDT\[13\] is on a page that is not mapped.
    IdtUnmapped,
    /// IDT\[13\] is not present, a task gate or a 16-bit gate.
    UnsupportedGate,
    /// The handler's first instruction is on a page that is not mapped.
    HandlerUnmapped,
    /// The guest's DR7 enables a breakpoint: the debug registers are the guest's.
    GuestDebugRegisters,
}

impl fmt::Display for Aside {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(match self {
            Aside::RealMode => "the guest ran in real-address mode",
            Aside::NoIdt => "the guest's IDT had no #GP entry",
            Aside::IdtUnmapped => "the guest's IDT entry for #GP was not mapped",
            Aside::UnsupportedGate => "the guest's #GP gate was not present, a task gate or a 16-bit gate",
            Aside::HandlerUnmapped => "the guest's #GP handler was not mapped",
            Aside::GuestDebugRegisters => "the guest used the debug registers itself (DR7 enabled a breakpoint)",
        })
    }
}

fn read_u64(mode: &CpuMode, mem: &GuestMemoryMmap, la: u64) -> Option<u64> {
    let mut b = [0u8; 8];
    mode.read_linear(mem, la, &mut b)?;
    Some(u64::from_le_bytes(b))
}

fn read_u32(mode: &CpuMode, mem: &GuestMemoryMmap, la: u64) -> Option<u32> {
    let mut b = [0u8; 4];
    mode.read_linear(mem, la, &mut b)?;
    Some(u32::from_le_bytes(b))
}

/// The linear address of the #GP handler's first instruction: where IDT\[13\] sends a #GP (SDM
/// Vol. 3A 6.11 and 6.14.1: 8-byte gates in protected mode, 16-byte gates in IA-32e mode, whose
/// code segment's base is 0).
pub fn gp_handler(sregs: &kvm_sregs, mem: &GuestMemoryMmap) -> Result<u64, Aside> {
    if sregs.cr0 & CR0_PE == 0 {
        return Err(Aside::RealMode);
    }
    let mode = CpuMode::from_sregs(sregs);
    let long = sregs.efer & EFER_LMA != 0;
    let size: u64 = if long { 16 } else { 8 };
    let gate = sregs.idt.base + u64::from(GP_VECTOR) * size;
    if u64::from(GP_VECTOR) * size + size - 1 > u64::from(sregs.idt.limit) {
        return Err(Aside::NoIdt);
    }
    let lo = read_u64(&mode, mem, gate).ok_or(Aside::IdtUnmapped)?;
    let present = (lo >> 47) & 1 == 1;
    // Interrupt (0xE) and trap (0xF) gates; in protected mode, the 32-bit ones.
    if !present || !matches!((lo >> 40) & 0xF, 0xE | 0xF) {
        return Err(Aside::UnsupportedGate);
    }
    let offset = (lo & 0xFFFF) | ((lo >> 32) & 0xFFFF_0000);
    let linear = if long {
        let hi = read_u64(&mode, mem, gate + 8).ok_or(Aside::IdtUnmapped)?;
        offset | ((hi & 0xFFFF_FFFF) << 32)
    } else {
        let cs = descriptor(&mode, mem, sregs, (lo >> 16) as u16).ok_or(Aside::UnsupportedGate)?;
        (cs.base + offset) & 0xFFFF_FFFF
    };
    mode.translate(mem, linear).ok_or(Aside::HandlerUnmapped)?;
    Ok(linear)
}

/// The segment register `selector` loads from the GDT, as KVM represents it; `None` for a
/// selector beyond the GDT's limit, in the LDT, or on a page that is not mapped. A null
/// selector gives an unusable segment.
fn descriptor(mode: &CpuMode, mem: &GuestMemoryMmap, sregs: &kvm_sregs, selector: u16) -> Option<kvm_segment> {
    if selector & !3 == 0 {
        return Some(kvm_segment { selector, unusable: 1, ..Default::default() });
    }
    let off = u64::from(selector & !7);
    if selector & SELECTOR_TI != 0 || off + 7 > u64::from(sregs.gdt.limit) {
        return None;
    }
    Some(segment_from_descriptor(read_u64(mode, mem, sregs.gdt.base + off)?, selector))
}

/// The frame the processor pushed when it delivered a #GP, read at the handler's first
/// instruction (RSP points at the error code).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame {
    pub error_code: u64,
    pub rip: u64,
    pub cs: u16,
    pub rflags: u64,
    /// The interrupted stack pointer and stack segment.
    pub rsp: u64,
    pub ss: u16,
}

impl Frame {
    /// IA-32e mode: error code, RIP, CS, RFLAGS, RSP and SS in 8-byte slots, always (SDM Vol. 3A
    /// 6.14.2). Protected mode: error code, EIP, CS and EFLAGS in 4-byte slots, then ESP and SS
    /// only when the privilege level changed; otherwise the interrupted ESP is just above the
    /// frame (SDM Vol. 3A 6.12.1, "Exception- or Interrupt-Handler Procedures"). `None` when the
    /// stack cannot be read, or is a 16-bit stack.
    pub fn read(regs: &kvm_regs, sregs: &kvm_sregs, mem: &GuestMemoryMmap) -> Option<Frame> {
        let mode = CpuMode::from_sregs(sregs);
        if sregs.efer & EFER_LMA != 0 {
            let slot = |k: u64| read_u64(&mode, mem, regs.rsp.wrapping_add(8 * k));
            return Some(Frame {
                error_code: slot(0)?,
                rip: slot(1)?,
                cs: slot(2)? as u16,
                rflags: slot(3)?,
                rsp: slot(4)?,
                ss: slot(5)? as u16,
            });
        }
        if sregs.ss.db == 0 {
            return None;
        }
        let esp = regs.rsp & 0xFFFF_FFFF;
        let slot = |k: u64| {
            let la = (sregs.ss.base + ((esp + 4 * k) & 0xFFFF_FFFF)) & 0xFFFF_FFFF;
            read_u32(&mode, mem, la).map(u64::from)
        };
        let cs = slot(2)? as u16;
        let (rsp, ss) = if (cs & 3) as u8 > mode.cpl {
            (slot(4)?, slot(5)? as u16)
        } else {
            ((esp + 16) & 0xFFFF_FFFF, sregs.ss.selector)
        };
        Some(Frame { error_code: slot(0)?, rip: slot(1)?, cs, rflags: slot(3)?, rsp, ss })
    }
}

/// What to do at the breakpoint on the #GP handler.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// The #GP came from an RDPMC the PMU model completes: it retires.
    Complete(Box<Completion>),
    /// The #GP goes on to the guest's handler, as delivered.
    Pass(Pass),
}

/// The vCPU state after the RDPMC retires.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    pub regs: kvm_regs,
    /// The segment registers, when the RDPMC ran with another CS or SS than the handler (user
    /// mode, say); `None` when they stay as they are.
    pub sregs: Option<kvm_sregs>,
    /// What RDPMC was asked (ECX) at which CPL, and what it returned in EDX:EAX.
    pub ecx: u32,
    pub cpl: u8,
    pub value: u64,
    /// RFLAGS.TF was set: the RDPMC ends in a single-step trap (a #DB with DR6.BS), which the
    /// VMM delivers.
    pub single_step_trap: bool,
}

/// Why a #GP goes on to the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Pass {
    /// The frame's RIP is not at an RDPMC, or the error code is not RDPMC's 0.
    NotRdpmc,
    /// RDPMC faults on hardware too: an index beyond the counters, CPL > 0 with CR4.PCE clear,
    /// or no PMU.
    RdpmcFaults,
    /// A frame or an interrupted state emon does not complete: an unreadable stack, virtual-8086
    /// or 16-bit code, an LDT code segment, or descriptors that do not fit the frame.
    Unsupported,
}

impl fmt::Display for Pass {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(match self {
            Pass::NotRdpmc => "not from RDPMC",
            Pass::RdpmcFaults => "RDPMC faults",
            Pass::Unsupported => "a frame emon does not complete",
        })
    }
}

/// Decides what a #GP just delivered to the handler at RIP (`regs`, `sregs`: the vCPU at the
/// breakpoint) is. `rdpmc(ecx, cpl, cr4_pce)` is the PMU model's RDPMC (`Pmu::rdpmc`, after the
/// backend has brought the counts up to date); it is called only for an RDPMC.
pub fn decide(
    regs: &kvm_regs,
    sregs: &kvm_sregs,
    mem: &GuestMemoryMmap,
    rdpmc: impl FnOnce(u32, u8, bool) -> Result<u64, GpFault>,
) -> Decision {
    let Some(frame) = Frame::read(regs, sregs, mem) else { return Decision::Pass(Pass::Unsupported) };
    // RDPMC's #GP has error code 0 (SDM Vol. 2B, RDPMC); INT 13 pushes none, so its "error code"
    // is a return address.
    if frame.error_code != 0 {
        return Decision::Pass(Pass::NotRdpmc);
    }
    if frame.rflags & RFLAGS_VM != 0 {
        return Decision::Pass(Pass::Unsupported);
    }
    let mode = CpuMode::from_sregs(sregs);
    let long = sregs.efer & EFER_LMA != 0;
    let cpl = (frame.cs & 3) as u8;
    let cs = if frame.cs == sregs.cs.selector { Some(sregs.cs) } else { descriptor(&mode, mem, sregs, frame.cs) };
    let Some(cs) = cs.filter(|cs| is_code(cs, cpl)) else { return Decision::Pass(Pass::Unsupported) };
    let bitness = match (long && cs.l == 1, cs.db == 1) {
        (true, _) => 64,
        (false, true) => 32,
        (false, false) => return Decision::Pass(Pass::Unsupported),
    };
    let la = if bitness == 64 { frame.rip } else { (cs.base + frame.rip) & 0xFFFF_FFFF };
    let i = match insn::decode(&mode.fetch(mem, la), la, bitness) {
        Some(i) if i.special == Special::Rdpmc => i,
        _ => return Decision::Pass(Pass::NotRdpmc),
    };
    let ss = if frame.ss == sregs.ss.selector {
        Some(sregs.ss)
    } else if frame.ss & !3 == 0 {
        // A null SS (IA-32e mode below CPL3): KVM takes the CPL from SS.DPL.
        Some(kvm_segment { selector: frame.ss, unusable: 1, dpl: cpl, db: 1, ..Default::default() })
    } else {
        descriptor(&mode, mem, sregs, frame.ss).filter(|ss| is_stack(ss, cpl))
    };
    let Some(ss) = ss else { return Decision::Pass(Pass::Unsupported) };
    let ecx = regs.rcx as u32;
    let Ok(value) = rdpmc(ecx, cpl, mode.pce()) else { return Decision::Pass(Pass::RdpmcFaults) };
    let mut new = *regs;
    new.rax = value & 0xFFFF_FFFF;
    new.rdx = value >> 32;
    let next = frame.rip + u64::from(i.len);
    new.rip = if bitness == 64 { next } else { next & 0xFFFF_FFFF };
    // The image of a fault has RF set; an instruction that completes clears it (SDM Vol. 3B,
    // "Instruction-Breakpoint Exception Condition").
    new.rflags = frame.rflags & !RFLAGS_RF;
    new.rsp = frame.rsp;
    let sregs = (cs != sregs.cs || ss != sregs.ss).then_some(kvm_sregs { cs, ss, ..*sregs });
    Decision::Complete(Box::new(Completion {
        regs: new,
        sregs,
        ecx,
        cpl,
        value,
        single_step_trap: frame.rflags & RFLAGS_TF != 0,
    }))
}

/// A present code segment that CPL `cpl` runs with (non-conforming: DPL = CPL).
fn is_code(s: &kvm_segment, cpl: u8) -> bool {
    let conforming = s.type_ & 0x4 != 0;
    s.unusable == 0 && s.present == 1 && s.s == 1 && s.type_ & 0x8 != 0 && (conforming || s.dpl == cpl)
}

/// A present writable data segment that CPL `cpl` can use as its stack (DPL = CPL).
fn is_stack(s: &kvm_segment, cpl: u8) -> bool {
    s.unusable == 0 && s.present == 1 && s.s == 1 && s.type_ & 0xA == 0x2 && s.dpl == cpl
}

#[cfg(test)]
mod tests {
    use super::*;
    use emon_pmu::pmu::msr::{IA32_FIXED_CTR0, IA32_PMC0};
    use emon_pmu::pmu::rdpmc::{RDPMC_FAST, RDPMC_FIXED};
    use emon_pmu::pmu::Pmu;
    use emon_pmu::profile::Profile;
    use vm_memory::{Bytes, GuestAddress};

    const PML4: u64 = 0x1000;
    const GDT: u64 = 0x5000;
    const IDT: u64 = 0x6000;
    const HANDLER: u64 = 0x20_0000;
    const CODE: u64 = 0x10_0000;
    /// The handler's stack (an IST stack's top minus the frame).
    const STACK: u64 = 0x30_0000 - 48;
    const KERNEL_CS: u16 = 0x08;
    const KERNEL_DS: u16 = 0x10;
    const USER_DS: u16 = 0x18 | 3;
    const USER_CS: u16 = 0x20 | 3;
    const CR0_PG: u64 = 1 << 31;
    const CR4_PAE: u64 = 1 << 5;
    const CR4_PCE: u64 = 1 << 8;
    const RDPMC: [u8; 2] = [0x0F, 0x33];
    const HLT: u8 = 0xF4;

    /// 8 MiB of guest RAM, identity-mapped with 2 MiB pages (4-level paging), with a GDT as
    /// emon's guest runtime has it, an IDT whose gate 13 goes to [`HANDLER`], RDPMC at [`CODE`]
    /// and HLT after it.
    fn long_mode() -> (GuestMemoryMmap, kvm_regs, kvm_sregs) {
        let m = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 8 << 20)]).unwrap();
        m.write_obj(0x2003u64, GuestAddress(PML4)).unwrap();
        m.write_obj(0x3003u64, GuestAddress(0x2000)).unwrap();
        for i in 0..4u64 {
            m.write_obj((i << 21) | 0x83, GuestAddress(0x3000 + 8 * i)).unwrap();
        }
        let gdt: [u64; 5] =
            [0, 0x00AF_9A00_0000_FFFF, 0x00CF_9200_0000_FFFF, 0x00CF_F200_0000_FFFF, 0x00AF_FA00_0000_FFFF];
        m.write_obj(gdt, GuestAddress(GDT)).unwrap();
        let lo = (HANDLER & 0xFFFF) | (u64::from(KERNEL_CS) << 16) | (0x8E << 40) | (((HANDLER >> 16) & 0xFFFF) << 48);
        m.write_obj([lo, HANDLER >> 32], GuestAddress(IDT + 13 * 16)).unwrap();
        m.write_slice(&RDPMC, GuestAddress(CODE)).unwrap();
        m.write_obj(HLT, GuestAddress(CODE + 2)).unwrap();
        let mut s = kvm_sregs {
            cr0: CR0_PE | CR0_PG,
            cr3: PML4,
            cr4: CR4_PAE,
            efer: EFER_LMA | (1 << 8),
            ..Default::default()
        };
        s.cs = segment_from_descriptor(gdt[1], KERNEL_CS);
        s.ss = segment_from_descriptor(gdt[2], KERNEL_DS);
        s.gdt.base = GDT;
        s.gdt.limit = 5 * 8 - 1;
        s.idt.base = IDT;
        s.idt.limit = 256 * 16 - 1;
        let regs =
            kvm_regs { rip: HANDLER, rsp: STACK, rflags: 2, rcx: 1, rax: 0xAAAA, rdx: 0xDDDD, ..Default::default() };
        (m, regs, s)
    }

    /// Writes a 64-bit #GP frame at the handler's stack.
    fn frame64(m: &GuestMemoryMmap, error: u64, rip: u64, cs: u16, rflags: u64, rsp: u64, ss: u16) {
        m.write_obj([error, rip, u64::from(cs), rflags, rsp, u64::from(ss)], GuestAddress(STACK)).unwrap();
    }

    fn complete(d: Decision) -> Completion {
        match d {
            Decision::Complete(c) => *c,
            Decision::Pass(p) => panic!("passed: {p:?}"),
        }
    }

    #[test]
    fn finds_the_gp_handler_or_says_why_not() {
        let (m, _, mut s) = long_mode();
        assert_eq!(gp_handler(&s, &m), Ok(HANDLER));
        let mut real = s;
        real.cr0 = 0;
        assert_eq!(gp_handler(&real, &m), Err(Aside::RealMode));
        let mut short = s;
        short.idt.limit = 13 * 16 + 14;
        assert_eq!(gp_handler(&short, &m), Err(Aside::NoIdt));
        let mut unmapped = s;
        unmapped.idt.base = 0xC0_0000;
        assert_eq!(gp_handler(&unmapped, &m), Err(Aside::IdtUnmapped));
        // Not present, then a handler beyond the mapped 8 MiB.
        m.write_obj(0u64, GuestAddress(IDT + 13 * 16)).unwrap();
        assert_eq!(gp_handler(&s, &m), Err(Aside::UnsupportedGate));
        let far = 0x100_0000u64;
        let lo = (far & 0xFFFF) | (u64::from(KERNEL_CS) << 16) | (0x8F << 40) | (((far >> 16) & 0xFFFF) << 48);
        m.write_obj(lo, GuestAddress(IDT + 13 * 16)).unwrap();
        assert_eq!(gp_handler(&s, &m), Err(Aside::HandlerUnmapped));
        // A trap gate with the offset's upper half set.
        m.write_obj([lo & !(0xFFFF << 48), 0u64], GuestAddress(IDT + 13 * 16)).unwrap();
        s.idt.limit = 13 * 16 + 15;
        assert_eq!(gp_handler(&s, &m), Ok(far & 0xFFFF));
    }

    #[test]
    fn completes_rdpmc_at_cpl0() {
        let (m, regs, s) = long_mode();
        frame64(&m, 0, CODE, KERNEL_CS, 0x1_0046, 0x8_0000, KERNEL_DS);
        let mut asked = None;
        let c = complete(decide(&regs, &s, &m, |ecx, cpl, pce| {
            asked = Some((ecx, cpl, pce));
            Ok(0x12_3456_789A)
        }));
        assert_eq!(asked, Some((1, 0, false)));
        assert_eq!((c.regs.rax, c.regs.rdx), (0x3456_789A, 0x12));
        assert_eq!(c.regs.rip, CODE + 2, "past the RDPMC");
        assert_eq!(c.regs.rsp, 0x8_0000, "the interrupted stack");
        assert_eq!(c.regs.rflags, 0x46, "RFLAGS from the frame, RF clear");
        assert_eq!(c.regs.rcx, 1);
        assert_eq!(c.sregs, None, "same CS and SS as the handler");
        assert!(!c.single_step_trap);
    }

    #[test]
    fn completes_rdpmc_at_cpl3_back_in_user_mode() {
        let (m, mut regs, mut s) = long_mode();
        s.cr4 |= CR4_PCE;
        regs.rcx = u64::from(RDPMC_FIXED | 1);
        // From CPL3 the handler runs on the kernel stack with a null SS.
        s.ss = kvm_segment { selector: 0, unusable: 1, ..Default::default() };
        frame64(&m, 0, CODE, USER_CS, 0x202, 0x7_FF00, USER_DS);
        let c = complete(decide(&regs, &s, &m, |ecx, cpl, pce| {
            assert_eq!((ecx, cpl, pce), (RDPMC_FIXED | 1, 3, true));
            Ok(7)
        }));
        assert_eq!((c.regs.rax, c.regs.rdx, c.regs.rip, c.regs.rsp, c.regs.rflags), (7, 0, CODE + 2, 0x7_FF00, 0x202));
        let back = c.sregs.expect("user segments");
        assert_eq!((back.cs.selector, back.cs.dpl, back.cs.l, back.cs.type_), (USER_CS, 3, 1, 0xA));
        assert_eq!((back.ss.selector, back.ss.dpl, back.ss.unusable, back.ss.type_), (USER_DS, 3, 0, 0x2));
        assert_eq!(CpuMode::from_sregs(&back).cpl, 3);
        assert_eq!((back.cr4, back.idt.base, back.gdt.base), (s.cr4, s.idt.base, s.gdt.base));
    }

    #[test]
    fn passes_a_gp_from_another_instruction() {
        let (m, regs, s) = long_mode();
        frame64(&m, 0, CODE + 2, KERNEL_CS, 0x1_0002, 0x8_0000, KERNEL_DS);
        let d = decide(&regs, &s, &m, |_, _, _| panic!("not an RDPMC"));
        assert_eq!(d, Decision::Pass(Pass::NotRdpmc));
        // RDPMC at RIP, but the error code of a selector (not RDPMC's #GP).
        frame64(&m, 0x18, CODE, KERNEL_CS, 0x1_0002, 0x8_0000, KERNEL_DS);
        assert_eq!(decide(&regs, &s, &m, |_, _, _| panic!()), Decision::Pass(Pass::NotRdpmc));
        // A frame whose CS is not a code segment: not a frame emon completes.
        frame64(&m, 0, CODE, KERNEL_DS, 0x1_0002, 0x8_0000, KERNEL_DS);
        assert_eq!(decide(&regs, &s, &m, |_, _, _| panic!()), Decision::Pass(Pass::Unsupported));
        // An unreadable stack.
        let far = kvm_regs { rsp: 0x90_0000, ..regs };
        assert_eq!(decide(&far, &s, &m, |_, _, _| panic!()), Decision::Pass(Pass::Unsupported));
    }

    #[test]
    fn passes_an_rdpmc_that_faults() {
        let (m, mut regs, s) = long_mode();
        let pmu = Pmu::new(&Profile::load("nehalem").unwrap().pmu);
        frame64(&m, 0, CODE, KERNEL_CS, 0x1_0002, 0x8_0000, KERNEL_DS);
        regs.rcx = 4; // nehalem has 4 GP counters
        assert_eq!(decide(&regs, &s, &m, |e, c, p| pmu.rdpmc(e, c, p)), Decision::Pass(Pass::RdpmcFaults));
        // CPL3 with CR4.PCE clear.
        regs.rcx = 0;
        frame64(&m, 0, CODE, USER_CS, 0x202, 0x7_FF00, USER_DS);
        assert_eq!(decide(&regs, &s, &m, |e, c, p| pmu.rdpmc(e, c, p)), Decision::Pass(Pass::RdpmcFaults));
        let none = Pmu::new(&Profile::load("no-pmu").unwrap().pmu);
        frame64(&m, 0, CODE, KERNEL_CS, 0x1_0002, 0x8_0000, KERNEL_DS);
        assert_eq!(decide(&regs, &s, &m, |e, c, p| none.rdpmc(e, c, p)), Decision::Pass(Pass::RdpmcFaults));
    }

    #[test]
    fn returns_what_the_pmu_model_reads() {
        let (m, mut regs, s) = long_mode();
        let mut pmu = Pmu::new(&Profile::load("skylake").unwrap().pmu);
        // A legacy write sign-extends bit 31; the fixed counter truncates to 48 bits.
        pmu.wrmsr(IA32_PMC0 + 2, 0x8123_4567).unwrap();
        pmu.wrmsr(IA32_FIXED_CTR0 + 1, 0xFF01_2345_6789_ABCD & ((1 << 48) - 1)).unwrap();
        frame64(&m, 0, CODE, KERNEL_CS, 0x1_0002, 0x8_0000, KERNEL_DS);
        let read = |regs: &kvm_regs| complete(decide(regs, &s, &m, |e, c, p| pmu.rdpmc(e, c, p))).regs;
        regs.rcx = 2;
        let r = read(&regs);
        assert_eq!((r.rdx, r.rax), (0xFFFF, 0x8123_4567), "48-bit PMC2 = 0xFFFF_8123_4567");
        regs.rcx = u64::from(RDPMC_FIXED | 1);
        let r = read(&regs);
        assert_eq!((r.rdx, r.rax), (0x2345, 0x6789_ABCD));
        regs.rcx = u64::from(RDPMC_FAST | RDPMC_FIXED | 1);
        let r = read(&regs);
        assert_eq!((r.rdx, r.rax), (0, 0x6789_ABCD), "a fast read returns bits 31:0");
    }

    #[test]
    fn a_single_stepped_rdpmc_ends_in_its_trap() {
        let (m, regs, s) = long_mode();
        frame64(&m, 0, CODE, KERNEL_CS, 0x1_0102, 0x8_0000, KERNEL_DS);
        let c = complete(decide(&regs, &s, &m, |_, _, _| Ok(0)));
        assert!(c.single_step_trap);
        assert_eq!(c.regs.rflags, 0x102);
    }

    /// Protected mode, paging off, flat 32-bit segments: 8-byte gates and 4-byte frame slots.
    fn protected_mode() -> (GuestMemoryMmap, kvm_regs, kvm_sregs) {
        let (m, mut regs, mut s) = long_mode();
        let gdt: [u64; 5] =
            [0, 0x00CF_9A00_0000_FFFF, 0x00CF_9200_0000_FFFF, 0x00CF_F200_0000_FFFF, 0x00CF_FA00_0000_FFFF];
        m.write_obj(gdt, GuestAddress(GDT)).unwrap();
        let lo = (HANDLER & 0xFFFF) | (u64::from(KERNEL_CS) << 16) | (0x8E << 40) | (((HANDLER >> 16) & 0xFFFF) << 48);
        m.write_obj(lo, GuestAddress(IDT + 13 * 8)).unwrap();
        s.cr0 = CR0_PE;
        s.cr4 = 0;
        s.efer = 0;
        s.cs = segment_from_descriptor(gdt[1], KERNEL_CS);
        s.ss = segment_from_descriptor(gdt[2], KERNEL_DS);
        s.idt.limit = 256 * 8 - 1;
        regs.rsp = STACK;
        (m, regs, s)
    }

    #[test]
    fn protected_mode_frames_with_and_without_a_stack_switch() {
        let (m, regs, s) = protected_mode();
        assert_eq!(gp_handler(&s, &m), Ok(HANDLER));
        // Same privilege: no ESP/SS in the frame; the interrupted ESP is above it.
        m.write_obj([0u32, CODE as u32, u32::from(KERNEL_CS), 0x1_0002], GuestAddress(STACK)).unwrap();
        let c = complete(decide(&regs, &s, &m, |_, cpl, _| {
            assert_eq!(cpl, 0);
            Ok(0x1_0000_0002)
        }));
        assert_eq!((c.regs.rax, c.regs.rdx, c.regs.rip), (2, 1, CODE + 2));
        assert_eq!(c.regs.rsp, STACK + 16);
        assert_eq!(c.sregs, None);
        // From CPL3: ESP and SS pushed.
        let mut s3 = s;
        s3.cr4 = CR4_PCE;
        m.write_obj([0u32, CODE as u32, u32::from(USER_CS), 0x202, 0x7_FF00, u32::from(USER_DS)], GuestAddress(STACK))
            .unwrap();
        let c = complete(decide(&regs, &s3, &m, |_, cpl, _| {
            assert_eq!(cpl, 3);
            Ok(5)
        }));
        assert_eq!((c.regs.rax, c.regs.rip, c.regs.rsp), (5, CODE + 2, 0x7_FF00));
        let back = c.sregs.unwrap();
        assert_eq!(
            (back.cs.selector, back.cs.db, back.cs.l, back.ss.selector, back.ss.dpl),
            (USER_CS, 1, 0, USER_DS, 3)
        );
    }
}
