//! Delivering an interrupt or exception through the guest's IDT in IA-32e mode, as the CPU does
//! (SDM Vol. 3A 6.14, "Exception and Interrupt Handling in 64-bit Mode"): the gate, the stack
//! switch (TSS.RSPn or an IST stack), the 64-bit frame and the flags. The VMM uses it where the
//! host cannot deliver the event itself without running the guest: an interrupt taken at a
//! user-mode boundary while user code runs in emon's engine, and INT n from user mode.
use crate::arch::{GP_VECTOR, NP_VECTOR, RFLAGS_IF, RFLAGS_TF};
use crate::mode::CpuMode;
use kvm_bindings::{kvm_regs, kvm_segment, kvm_sregs};
use vm_memory::GuestMemoryMmap;

/// RFLAGS bits an event clears (SDM Vol. 3A 6.12.1.3): TF, NT, RF, VM; IF too through an
/// interrupt gate.
const RFLAGS_NT: u64 = 1 << 14;
const RFLAGS_RF: u64 = 1 << 16;
const RFLAGS_VM: u64 = 1 << 17;
/// IDT gate types in IA-32e mode (SDM Vol. 3A Table 3-2).
const INTERRUPT_GATE: u64 = 0xE;
const TRAP_GATE: u64 = 0xF;
/// Error codes for a fault on an IDT gate (SDM Vol. 3A 6.13): IDT = 1, EXT = external event.
const ERROR_IDT: u32 = 1 << 1;
const ERROR_EXT: u32 = 1;

/// What is delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// An external interrupt (or NMI) at an instruction boundary: the frame returns to RIP.
    External,
    /// INT n, INT3 or INTO, which checks the gate's DPL against the CPL, and whose frame
    /// returns to the next instruction, at `next_rip`.
    Software { next_rip: u64 },
    /// A fault-class exception of the instruction at RIP: the frame returns to it, with RF set
    /// in its RFLAGS image (SDM Vol. 3B 17.3.1.1), and the error code pushed after it where the
    /// exception has one (SDM Vol. 3A 6.13).
    Fault { error_code: Option<u32> },
}

/// Why the event was not delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotDelivered {
    /// Delivery raises this exception instead (with its error code), as on the CPU.
    Raises { vector: u8, error_code: u32 },
    /// Something emon does not deliver itself: not IA-32e mode, a gate's segment or the
    /// stack it names unreadable, a frame that would fault. The caller lets the host do it.
    Unsupported(&'static str),
}

/// Delivers `vector` as `event` to the handler its IDT gate names: `regs` and `sregs` become
/// the handler's, and the frame is written to its stack in `mem`.
pub fn deliver(
    mode: &CpuMode,
    mem: &GuestMemoryMmap,
    regs: &mut kvm_regs,
    sregs: &mut kvm_sregs,
    vector: u8,
    event: Event,
) -> Result<(), NotDelivered> {
    use NotDelivered::Unsupported;
    if mode.bitness != 64 && sregs.efer & (1 << 10) == 0 {
        return Err(Unsupported("not in IA-32e mode"));
    }
    let ext = if matches!(event, Event::Software { .. }) { 0 } else { ERROR_EXT };
    let gate_error = u32::from(vector) * 8 + ERROR_IDT + ext;
    let off = u64::from(vector) * 16;
    if off + 15 > u64::from(mode.idt_limit) {
        return Err(NotDelivered::Raises { vector: GP_VECTOR, error_code: gate_error });
    }
    let mut gate = [0u8; 16];
    mode.read_linear(mem, mode.idt_base + off, &mut gate).ok_or(Unsupported("the IDT is unreadable"))?;
    let lo = u64::from_le_bytes(gate[..8].try_into().expect("8 bytes"));
    let hi = u64::from_le_bytes(gate[8..].try_into().expect("8 bytes"));
    let kind = (lo >> 40) & 0xF;
    if kind != INTERRUPT_GATE && kind != TRAP_GATE {
        return Err(NotDelivered::Raises { vector: GP_VECTOR, error_code: gate_error });
    }
    // INT n, INT3 and INTO check the gate's DPL (SDM Vol. 3A 6.12.1.1).
    let gate_dpl = ((lo >> 45) & 3) as u8;
    if matches!(event, Event::Software { .. }) && mode.cpl > gate_dpl {
        return Err(NotDelivered::Raises { vector: GP_VECTOR, error_code: gate_error });
    }
    if (lo >> 47) & 1 == 0 {
        return Err(NotDelivered::Raises { vector: NP_VECTOR, error_code: gate_error });
    }
    let selector = (lo >> 16) as u16;
    let handler = (lo & 0xFFFF) | ((lo >> 32) & 0xFFFF_0000) | (hi & 0xFFFF_FFFF) << 32;
    let ist = (lo >> 32) & 7;
    let mut cs =
        mode.segment(mem, sregs.gdt.base, selector).ok_or(Unsupported("the gate's code segment is unreadable"))?;
    if cs.unusable != 0 || cs.present == 0 || cs.s == 0 || cs.type_ & 8 == 0 || cs.l == 0 || cs.type_ & 4 != 0 {
        return Err(Unsupported("the gate's segment is not a present, non-conforming 64-bit code segment"));
    }
    let new_cpl = cs.dpl;
    if new_cpl > mode.cpl {
        return Err(Unsupported("the gate's code segment is less privileged than the CPL"));
    }
    cs.selector = selector & !3 | u16::from(new_cpl);
    let mut rsp = new_stack(mode, mem, sregs, ist, new_cpl)?.unwrap_or(regs.rsp) & !0xF;
    let (rip, rflags, error_code) = match event {
        Event::External => (regs.rip, regs.rflags, None),
        Event::Software { next_rip } => (next_rip, regs.rflags, None),
        Event::Fault { error_code } => (regs.rip, regs.rflags | RFLAGS_RF, error_code),
    };
    let frame = [u64::from(sregs.ss.selector), regs.rsp, rflags, u64::from(sregs.cs.selector), rip];
    for word in frame.into_iter().chain(error_code.map(u64::from)) {
        rsp -= 8;
        mode.write_linear(mem, rsp, &word.to_le_bytes()).ok_or(Unsupported("the handler's stack is not mapped"))?;
    }
    if new_cpl < mode.cpl {
        // A privilege change loads SS with a null selector whose RPL is the new CPL.
        sregs.ss = kvm_segment { selector: u16::from(new_cpl), dpl: new_cpl, unusable: 1, ..sregs.ss };
    }
    sregs.cs = cs;
    regs.rsp = rsp;
    regs.rip = handler;
    regs.rflags &= !(RFLAGS_TF | RFLAGS_NT | RFLAGS_RF | RFLAGS_VM);
    if kind == INTERRUPT_GATE {
        regs.rflags &= !RFLAGS_IF;
    }
    Ok(())
}

/// The stack a delivery switches to (before its 16-byte alignment): an IST stack, or RSPn of
/// the TSS on a privilege change (SDM Vol. 3A 6.14.4, 6.14.5); `None` where it stays on the
/// current stack.
fn new_stack(
    mode: &CpuMode,
    mem: &GuestMemoryMmap,
    sregs: &kvm_sregs,
    ist: u64,
    new_cpl: u8,
) -> Result<Option<u64>, NotDelivered> {
    let tss_slot = match (ist, new_cpl < mode.cpl) {
        (0, false) => return Ok(None),
        (0, true) => 4 + 8 * u64::from(new_cpl),
        (n, _) => 0x24 + 8 * (n - 1),
    };
    let mut b = [0u8; 8];
    mode.read_linear(mem, sregs.tr.base + tss_slot, &mut b)
        .ok_or(NotDelivered::Unsupported("the TSS is unreadable"))?;
    Ok(Some(u64::from_le_bytes(b)))
}

/// The RIP in the frame of an event `vector` delivered from user mode (`from`: the CPL3 mode
/// it was delivered in) to a CPL0 handler, read back after the delivery: the user-mode
/// instruction boundary it interrupted. `None` where the gate or the stack is unreadable.
pub fn interrupted_user_rip(from: &CpuMode, mem: &GuestMemoryMmap, sregs: &kvm_sregs, vector: u8) -> Option<u64> {
    let mut gate = [0u8; 8];
    from.read_linear(mem, from.idt_base + u64::from(vector) * 16, &mut gate)?;
    let ist = (u64::from_le_bytes(gate) >> 32) & 7;
    let top = new_stack(from, mem, sregs, ist, 0).ok()?? & !0xF;
    // The frame: SS, RSP, RFLAGS, CS, RIP pushed from the top down (SDM Vol. 3A Figure 6-9).
    let mut rip = [0u8; 8];
    from.read_linear(mem, top - 40, &mut rip)?;
    Some(u64::from_le_bytes(rip))
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::{Bytes, GuestAddress};

    const IDT: u64 = 0x1000;
    const GDT: u64 = 0x2000;
    const TSS: u64 = 0x3000;
    const KERNEL_CS: u16 = 0x10;
    const USER_CS: u16 = 0x33;
    const USER_SS: u16 = 0x2B;

    /// Flat memory without paging, an IDT, a GDT with a 64-bit kernel code segment, and a TSS
    /// with RSP0 at 0x9000 and IST1 at 0xA000.
    fn machine() -> (GuestMemoryMmap, CpuMode, kvm_regs, kvm_sregs) {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        // 64-bit code, DPL0, present, readable (SDM Vol. 3A Figure 3-8).
        mem.write_obj(0x00AF_9B00_0000_FFFFu64, GuestAddress(GDT + u64::from(KERNEL_CS))).unwrap();
        mem.write_obj(0x9000u64, GuestAddress(TSS + 4)).unwrap();
        mem.write_obj(0xA000u64, GuestAddress(TSS + 0x24)).unwrap();
        let mode =
            CpuMode { cpl: 3, bitness: 64, efer: 1 << 10, idt_base: IDT, idt_limit: 0xFFF, ..Default::default() };
        let regs =
            kvm_regs { rip: 0x40_0000, rsp: 0x7FF8, rflags: 0x202 | RFLAGS_TF | RFLAGS_RF, ..Default::default() };
        let sregs = kvm_sregs {
            cs: kvm_segment { selector: USER_CS, dpl: 3, l: 1, s: 1, type_: 11, present: 1, ..Default::default() },
            ss: kvm_segment { selector: USER_SS, dpl: 3, db: 1, s: 1, type_: 3, present: 1, ..Default::default() },
            gdt: kvm_bindings::kvm_dtable { base: GDT, ..Default::default() },
            tr: kvm_segment { base: TSS, ..Default::default() },
            efer: 1 << 10 | 1 << 8,
            ..Default::default()
        };
        (mem, mode, regs, sregs)
    }

    /// A 64-bit gate (SDM Vol. 3A Figure 6-8).
    fn gate(mem: &GuestMemoryMmap, v: u8, handler: u64, kind: u64, dpl: u64, ist: u64) {
        let lo = (handler & 0xFFFF)
            | u64::from(KERNEL_CS) << 16
            | ist << 32
            | kind << 40
            | dpl << 45
            | 1 << 47
            | (handler >> 16 & 0xFFFF) << 48;
        mem.write_obj(lo, GuestAddress(IDT + u64::from(v) * 16)).unwrap();
        mem.write_obj(handler >> 32, GuestAddress(IDT + u64::from(v) * 16 + 8)).unwrap();
    }

    fn frame(mem: &GuestMemoryMmap, rsp: u64) -> [u64; 5] {
        std::array::from_fn(|i| mem.read_obj(GuestAddress(rsp + 8 * i as u64)).unwrap())
    }

    #[test]
    fn an_interrupt_from_user_mode_switches_to_rsp0_and_masks_if() {
        let (mem, mode, mut regs, mut sregs) = machine();
        gate(&mem, 0xEC, 0xFFFF_FFFF_8120_0C70, INTERRUPT_GATE, 0, 0);
        deliver(&mode, &mem, &mut regs, &mut sregs, 0xEC, Event::External).unwrap();
        assert_eq!(regs.rip, 0xFFFF_FFFF_8120_0C70);
        assert_eq!(regs.rsp, 0x9000 - 40);
        // RIP, CS, RFLAGS, RSP, SS from the top.
        assert_eq!(
            frame(&mem, regs.rsp),
            [0x40_0000, u64::from(USER_CS), 0x202 | RFLAGS_TF | RFLAGS_RF, 0x7FF8, u64::from(USER_SS)]
        );
        assert_eq!(regs.rflags, 0x2, "TF, RF and IF cleared");
        assert_eq!((sregs.cs.selector, sregs.cs.dpl, sregs.cs.l), (KERNEL_CS, 0, 1));
        assert_eq!((sregs.ss.selector, sregs.ss.unusable), (0, 1), "a null SS at CPL0");
        assert_eq!(interrupted_user_rip(&mode, &mem, &sregs, 0xEC), Some(0x40_0000), "read back from RSP0's frame");
    }

    #[test]
    fn a_page_fault_from_user_mode_pushes_its_error_code_and_rf() {
        let (mem, mode, mut regs, mut sregs) = machine();
        gate(&mem, 14, 0xFFFF_FFFF_8120_0AF0, INTERRUPT_GATE, 0, 0);
        deliver(&mode, &mem, &mut regs, &mut sregs, 14, Event::Fault { error_code: Some(6) }).unwrap();
        assert_eq!((regs.rip, regs.rsp), (0xFFFF_FFFF_8120_0AF0, 0x9000 - 48));
        let rf_set = 0x202 | RFLAGS_TF | RFLAGS_RF;
        // The error code, then RIP (the faulting instruction), CS, RFLAGS, RSP, SS.
        assert_eq!(frame(&mem, regs.rsp), [6, 0x40_0000, u64::from(USER_CS), rf_set, 0x7FF8]);
        assert_eq!(mem.read_obj::<u64>(GuestAddress(regs.rsp + 40)).unwrap(), u64::from(USER_SS));
        assert_eq!(regs.rflags, 0x2);
        // #UD has no error code.
        let (mem, mode, mut regs, mut sregs) = machine();
        gate(&mem, 6, 0xFFFF_FFFF_8120_0B00, INTERRUPT_GATE, 0, 0);
        regs.rflags = 0x202;
        deliver(&mode, &mem, &mut regs, &mut sregs, 6, Event::Fault { error_code: None }).unwrap();
        assert_eq!(frame(&mem, regs.rsp)[..3], [0x40_0000, u64::from(USER_CS), 0x202 | RFLAGS_RF]);
    }

    #[test]
    fn int_n_returns_past_itself_through_a_trap_gate_on_an_ist_stack() {
        let (mem, mode, mut regs, mut sregs) = machine();
        gate(&mem, 0x80, 0xFFFF_FFFF_8100_0000, TRAP_GATE, 3, 1);
        deliver(&mode, &mem, &mut regs, &mut sregs, 0x80, Event::Software { next_rip: 0x40_0002 }).unwrap();
        assert_eq!(regs.rsp, 0xA000 - 40, "IST1");
        assert_eq!(frame(&mem, regs.rsp)[0], 0x40_0002);
        assert_eq!(regs.rflags & RFLAGS_IF, RFLAGS_IF, "a trap gate keeps IF");
        assert_eq!(interrupted_user_rip(&mode, &mem, &sregs, 0x80), Some(0x40_0002), "read back from IST1's frame");
    }

    #[test]
    fn faults_on_the_gate_are_raised_as_on_the_cpu() {
        let (mem, mode, mut regs, mut sregs) = machine();
        let before = (regs, sregs);
        gate(&mem, 0x81, 0xFFFF_FFFF_8100_0000, INTERRUPT_GATE, 0, 0);
        let int = Event::Software { next_rip: 0x40_0002 };
        // INT n to a DPL0 gate from CPL3: #GP(vector * 8 + 2).
        assert_eq!(
            deliver(&mode, &mem, &mut regs, &mut sregs, 0x81, int),
            Err(NotDelivered::Raises { vector: GP_VECTOR, error_code: 0x81 * 8 + 2 })
        );
        // An external interrupt does not check the DPL.
        assert_eq!(deliver(&mode, &mem, &mut regs.clone(), &mut sregs.clone(), 0x81, Event::External), Ok(()));
        // Not present: #NP, with EXT for an external interrupt.
        mem.write_obj(0u64, GuestAddress(IDT + 0x82 * 16)).unwrap();
        gate(&mem, 0x83, 0xFFFF_FFFF_8100_0000, INTERRUPT_GATE, 3, 0);
        let mut g: u64 = mem.read_obj(GuestAddress(IDT + 0x83 * 16)).unwrap();
        g &= !(1 << 47);
        mem.write_obj(g, GuestAddress(IDT + 0x83 * 16)).unwrap();
        assert_eq!(
            deliver(&mode, &mem, &mut regs, &mut sregs, 0x83, Event::External),
            Err(NotDelivered::Raises { vector: NP_VECTOR, error_code: 0x83 * 8 + 3 })
        );
        // Not an interrupt or trap gate: #GP.
        assert_eq!(
            deliver(&mode, &mem, &mut regs, &mut sregs, 0x82, int),
            Err(NotDelivered::Raises { vector: GP_VECTOR, error_code: 0x82 * 8 + 2 })
        );
        assert_eq!((regs, sregs), before, "nothing changes when delivery raises");
    }
}
