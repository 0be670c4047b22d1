//! What counting needs to know about one guest instruction, decoded with iced-x86.
use iced_x86::{Decoder, DecoderOptions, FlowControl, Instruction, Mnemonic, OpKind, Register};

/// How an instruction may transfer control.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// Falls through to the next instruction.
    Next,
    /// A branch with a known target (direct JMP/CALL/Jcc/LOOP); `conditional` for Jcc/LOOP/JRCXZ.
    Direct { target: u64, conditional: bool },
    /// A branch whose target is not known before it executes (indirect, RET, IRET, far, ...).
    Indirect,
    /// Not a branch, but may not fall through (INT n, UD2, SYSCALL...): any next RIP is possible.
    Other,
}

/// The kind of control transfer a taken branch makes, as the LBR stack's filter (MSR_LBR_SELECT,
/// SDM Vol. 3B "Filtering of Last Branch Records") sorts them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transfer {
    /// Jcc, LOOP, JrCXZ.
    Conditional,
    /// Near relative CALL.
    RelCall,
    /// Near indirect CALL.
    IndCall,
    /// Near RET.
    Ret,
    /// Near relative JMP.
    RelJmp,
    /// Near indirect JMP.
    IndJmp,
    /// Far JMP, CALL and RET, IRET, INT n, SYSCALL/SYSRET, SYSENTER/SYSEXIT.
    Far,
}

/// Instructions the backend emulates or treats specially.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Special {
    None,
    /// KVM steps over HLT: emon emulates it.
    Hlt,
    /// No userspace exit exists for RDPMC: emon emulates it while stepping.
    Rdpmc,
    /// IRET restores RFLAGS.TF, so the single-step trap lands after the instruction it returns
    /// to: emon reads the return address from the frame before it executes.
    Iret,
    /// POPF may set RFLAGS.TF: the guest then single-steps itself.
    Popf,
    /// STI: maskable interrupts wait until the instruction after it has retired (SDM Vol. 2B,
    /// STI), a shadow the vCPU must keep where STI retired outside it.
    Sti,
    /// PUSHF pushes RFLAGS, TF included: one KVM single-steps pushes the TF of KVM's step.
    Pushf,
    /// RDTSC, RDTSCP and RDMSR read the time-stamp counter, which runs with the cost model while
    /// emon counts (README, "Guest time"): emon emulates them (RDMSR only of IA32_TSC).
    Rdtsc,
    Rdtscp,
    Rdmsr,
    /// WRMSR of IA32_TSC_DEADLINE takes a deadline on the guest's TSC, which the model may
    /// hold apart from KVM's: emon translates it (README, "Guest time").
    Wrmsr,
    /// LFENCE, MFENCE and SFENCE order memory for other processors and devices, which a lone
    /// vCPU's counted code cannot observe: emon retires them itself, because some hosts lose the
    /// single-step trap after them (kvm_pvm), and with it the RDTSC that usually follows.
    Fence,
    /// XSAVE, XSAVEOPT, XSAVEC and XRSTOR: QEMU's TCG lacks XSAVEC, the compacted form and every
    /// component beyond SSE (AVX), and some hosts' KVM emulates none of them at CPL0 (kvm_pvm
    /// raises #UD): emon completes them itself.
    Xsave,
    /// SYSCALL from CPL3 does not enter the kernel on some hosts (kvm_pvm: RIP moves to
    /// IA32_LSTAR at CPL3): emon completes it there.
    Syscall,
    /// SYSRET returns to user mode: where emon runs user mode in the TCG engine, KVM must not
    /// execute it (it would run the user code after it), so emon completes it.
    Sysret,
    /// INT n and INT3 (the vector): from CPL3 some hosts swallow them (kvm_pvm: execution goes
    /// on after the instruction): emon delivers them there.
    Int(u8),
    /// CPUID: some hosts override the table the VMM gives KVM (README, "CPUID fidelity"); where
    /// emon runs user-mode code in the TCG engine, it answers from that table itself.
    Cpuid,
    /// INVLPG drops the translations of one page (SDM Vol. 3A 4.10.4.1). At CPL0 emon retires it
    /// and has KVM drop all the guest's cached translations before its next entry, as a MOV to
    /// CR3 would: a round trip through KVM per page costs tens of microseconds on a host that
    /// emulates CPL0 code, and Linux flushes tens of thousands of pages one by one.
    Invlpg,
    /// IN and OUT of one port (not the string forms INS and OUTS): a VM exit each, and on a host
    /// that emulates CPL0 code a round trip through KVM. At CPL0 emon completes those to the
    /// ports the VMM's own devices answer, such as a UART polled a character at a time.
    Port(PortAccess),
}

/// The port access of an IN or OUT (SDM Vol. 2A, IN; Vol. 2B, OUT).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortAccess {
    /// OUT: from AL, AX or EAX to the port; IN: from the port into them.
    pub out: bool,
    /// Bytes: 1, 2 or 4.
    pub size: u8,
    /// The port an immediate names; `None`: the port in DX.
    pub port: Option<u8>,
}

impl PortAccess {
    fn of(i: &Instruction) -> Option<PortAccess> {
        let out = i.mnemonic() == Mnemonic::Out;
        // IN's data register is its first operand, OUT's its second; the port is the other.
        let (data, port) = if out { (1, 0) } else { (0, 1) };
        let size = match i.op_register(data) {
            Register::AL => 1,
            Register::AX => 2,
            Register::EAX => 4,
            _ => return None,
        };
        let port = match i.op_kind(port) {
            OpKind::Immediate8 => Some(i.immediate8()),
            OpKind::Register if i.op_register(port) == Register::DX => None,
            _ => return None,
        };
        Some(PortAccess { out, size, port })
    }
}

/// A decoded guest instruction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Insn {
    pub len: u8,
    pub flow: Flow,
    /// Counts as a retired branch (0xC4).
    pub branch: bool,
    /// Explicit memory operands.
    pub mem_operands: u8,
    /// Cost-model cycles beyond the base, for the instruction's class.
    pub class_cycles: u32,
    pub special: Special,
    /// May change CPL, paging, the code segment or the debug registers: emon re-reads the CPU
    /// state after it.
    pub changes_mode: bool,
    /// The transfer it makes when it branches; `None` for any other instruction.
    pub transfer: Option<Transfer>,
    /// A string instruction with a REP/REPE/REPNE prefix: it runs one iteration at a time at the
    /// same RIP (an interrupt or a fault may come between iterations), and retires once, after
    /// its last iteration. Intel's INST_RETIRED.ANY: "an instruction with a REP prefix counts as
    /// one instruction (not per iteration). Faults before the retirement of the last micro-op of
    /// a multi-ops instruction are not counted."
    pub repeats: bool,
    /// The instruction classes model-specific events count (README, "Model-specific events").
    pub class: Class,
}

impl Insn {
    /// Whether this instruction at `rip`, having left the vCPU at `pc`, retired: a REP string
    /// instruction that is still at its own RIP only ended an iteration (see [`Insn::repeats`]).
    pub fn retired_at(&self, rip: u64, pc: u64) -> bool {
        !(self.repeats && pc == rip)
    }
}

/// What an instruction is to the model-specific events that count instruction classes: its
/// loads and stores, whether it is locked, a software prefetch, a NOP or PAUSE, and the kind of
/// floating-point arithmetic it does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Class {
    /// Load accesses: explicit and implicit reads of memory (the stack of POP and RET, string
    /// operands), a read-modify-write counting one (iced-x86's operand list).
    pub loads: u8,
    /// Store accesses: writes of memory, a read-modify-write counting one.
    pub stores: u8,
    /// [`Class::LOCKED`], [`Class::PREFETCH`], [`Class::NOP`], [`Class::PAUSE`].
    pub flags: u8,
    /// The kind of FP arithmetic (one of the `FP_*` bits), 0 for none.
    pub fp: u8,
    /// How many times an FP arithmetic event counts it: 2 for FMA and DPP (two operations per
    /// element, as Intel's FP_ARITH_INST_RETIRED descriptions say), else 1.
    pub fp_count: u8,
}

impl Class {
    /// A locked read-modify-write: a LOCK prefix, or XCHG with a memory operand (SDM Vol. 2B,
    /// XCHG: "the processor's locking protocol is automatically implemented").
    pub const LOCKED: u8 = 1 << 0;
    /// PREFETCHh or PREFETCHW: an access to no data, which Intel's lists count as a load.
    pub const PREFETCH: u8 = 1 << 1;
    /// NOP (0x90 and 0F 1F /0).
    pub const NOP: u8 = 1 << 2;
    pub const PAUSE: u8 = 1 << 3;

    /// FP arithmetic kinds by width and precision.
    pub const FP_SCALAR_SINGLE: u8 = 1 << 0;
    pub const FP_SCALAR_DOUBLE: u8 = 1 << 1;
    pub const FP_128_SINGLE: u8 = 1 << 2;
    pub const FP_128_DOUBLE: u8 = 1 << 3;
    pub const FP_256_SINGLE: u8 = 1 << 4;
    pub const FP_256_DOUBLE: u8 = 1 << 5;
    pub const FP_512_SINGLE: u8 = 1 << 6;
    pub const FP_512_DOUBLE: u8 = 1 << 7;

    pub fn has(self, flag: u8) -> bool {
        self.flags & flag != 0
    }
}

/// Cycles added for instructions that exit to the VMM (CPUID, MSR and port accesses, RDPMC).
pub const EXITING_CYCLES: u32 = 100;
pub const MUL_CYCLES: u32 = 2;
pub const DIV_CYCLES: u32 = 20;

/// Decodes the instruction in `bytes` at `rip` for a `bitness`-bit code segment.
pub fn decode(bytes: &[u8], rip: u64, bitness: u32) -> Option<Insn> {
    let mut d = Decoder::with_ip(bitness, bytes, rip, DecoderOptions::NONE);
    let i = d.decode();
    if i.is_invalid() {
        return None;
    }
    Some(of(&i))
}

/// The facts of an instruction already decoded (and valid).
pub fn of(i: &Instruction) -> Insn {
    use Mnemonic::*;
    let m = i.mnemonic();
    let fc = i.flow_control();
    let flow = match fc {
        FlowControl::Next => Flow::Next,
        FlowControl::UnconditionalBranch | FlowControl::Call if is_near_direct(i) => {
            Flow::Direct { target: i.near_branch_target(), conditional: false }
        }
        FlowControl::ConditionalBranch if is_near_direct(i) => {
            Flow::Direct { target: i.near_branch_target(), conditional: true }
        }
        FlowControl::UnconditionalBranch
        | FlowControl::ConditionalBranch
        | FlowControl::Call
        | FlowControl::IndirectBranch
        | FlowControl::IndirectCall
        | FlowControl::Return => Flow::Indirect,
        _ => Flow::Other,
    };
    let branch = !matches!(fc, FlowControl::Next | FlowControl::Exception | FlowControl::XbeginXabortXend)
        && !matches!(m, Ud0 | Ud1 | Ud2 | Int3 | Into | Int1);
    // LEA and hinted NOPs have a memory operand but access no memory.
    let mem_operands = if matches!(m, Lea | Nop) {
        0
    } else {
        (0..i.op_count()).filter(|&n| i.op_kind(n) == OpKind::Memory).count() as u8
    };
    let class_cycles = match m {
        Mul | Imul | Mulx => MUL_CYCLES,
        Div | Idiv => DIV_CYCLES,
        Cpuid | Rdmsr | Wrmsr | Rdpmc | In | Out | Insb | Insw | Insd | Outsb | Outsw | Outsd => EXITING_CYCLES,
        _ => 0,
    };
    let special = match m {
        Hlt => Special::Hlt,
        Rdpmc => Special::Rdpmc,
        Iret | Iretd | Iretq => Special::Iret,
        Popf | Popfd | Popfq => Special::Popf,
        Sti => Special::Sti,
        Pushf | Pushfd | Pushfq => Special::Pushf,
        Rdtsc => Special::Rdtsc,
        Rdtscp => Special::Rdtscp,
        Rdmsr => Special::Rdmsr,
        Wrmsr => Special::Wrmsr,
        Lfence | Mfence | Sfence => Special::Fence,
        Xsave | Xsave64 | Xsaveopt | Xsaveopt64 | Xsavec | Xsavec64 | Xrstor | Xrstor64 => Special::Xsave,
        Syscall => Special::Syscall,
        Sysret | Sysretq => Special::Sysret,
        Cpuid => Special::Cpuid,
        Int => Special::Int(i.immediate8()),
        Int3 => Special::Int(3),
        Invlpg => Special::Invlpg,
        In | Out => PortAccess::of(i).map_or(Special::None, Special::Port),
        _ => Special::None,
    };
    let changes_mode = is_far_transfer(i)
        || matches!(m, Lgdt | Lidt | Lldt | Ltr | Rsm | Swapgs | Wrmsr)
        || (m == Mov
            && (0..i.op_count()).any(|n| {
                i.op_kind(n) == OpKind::Register
                    && (i.op_register(n).is_segment_register() || i.op_register(n).is_cr() || i.op_register(n).is_dr())
            }));
    let repeats = i.is_string_instruction() && (i.has_rep_prefix() || i.has_repne_prefix());
    Insn {
        len: i.len() as u8,
        flow,
        branch,
        mem_operands,
        class_cycles,
        special,
        changes_mode,
        transfer: transfer(i),
        repeats,
        class: class(i),
    }
}

/// The instruction's [`Class`].
fn class(i: &Instruction) -> Class {
    use Mnemonic::*;
    let (loads, stores) = crate::access::loads_and_stores(i);
    let m = i.mnemonic();
    let memory_operand = (0..i.op_count()).any(|n| i.op_kind(n) == OpKind::Memory);
    let mut flags = 0;
    if memory_operand && (i.has_lock_prefix() || m == Xchg) {
        flags |= Class::LOCKED;
    }
    if matches!(m, Prefetchnta | Prefetcht0 | Prefetcht1 | Prefetcht2 | Prefetchw) {
        flags |= Class::PREFETCH;
    }
    if m == Nop {
        flags |= Class::NOP;
    }
    if m == Pause {
        flags |= Class::PAUSE;
    }
    let (fp, fp_count) = fp_arith(i);
    Class { loads, stores, flags, fp, fp_count }
}

/// The FP arithmetic kind of `i` and how many times it counts, as Intel's FP_ARITH_INST_RETIRED
/// descriptions (Skylake, Ice Lake) list them: ADD SUB MUL DIV MIN MAX SQRT, RSQRT and RCP
/// (single precision, up to 256 bits), HADD HSUB ADDSUB (packed), DPP (counts twice, up to 256
/// bits), FM(N)ADD/SUB and their ADDSUB/SUBADD forms (count twice), RSQRT14 and RCP14 (512 bits
/// only); SSE, VEX and EVEX forms, the width being the destination register's.
fn fp_arith(i: &Instruction) -> (u8, u8) {
    use Mnemonic::*;
    // (double precision, packed, counts, widths it counts at: bit 0 = 128, 1 = 256, 2 = 512).
    const ALL: u8 = 0b111;
    const UP_TO_256: u8 = 0b011;
    const ONLY_512: u8 = 0b100;
    let (double, packed, count, widths) = match i.mnemonic() {
        Addss | Subss | Mulss | Divss | Minss | Maxss | Sqrtss | Rsqrtss | Rcpss | Vaddss | Vsubss | Vmulss
        | Vdivss | Vminss | Vmaxss | Vsqrtss | Vrsqrtss | Vrcpss => (false, false, 1, ALL),
        Addsd | Subsd | Mulsd | Divsd | Minsd | Maxsd | Sqrtsd | Vaddsd | Vsubsd | Vmulsd | Vdivsd | Vminsd
        | Vmaxsd | Vsqrtsd => (true, false, 1, ALL),
        Addps | Subps | Mulps | Divps | Minps | Maxps | Sqrtps | Haddps | Hsubps | Addsubps | Vaddps | Vsubps
        | Vmulps | Vdivps | Vminps | Vmaxps | Vsqrtps | Vhaddps | Vhsubps | Vaddsubps => (false, true, 1, ALL),
        Rsqrtps | Rcpps | Vrsqrtps | Vrcpps => (false, true, 1, UP_TO_256),
        Vrsqrt14ps | Vrcp14ps => (false, true, 1, ONLY_512),
        Addpd | Subpd | Mulpd | Divpd | Minpd | Maxpd | Sqrtpd | Haddpd | Hsubpd | Addsubpd | Vaddpd | Vsubpd
        | Vmulpd | Vdivpd | Vminpd | Vmaxpd | Vsqrtpd | Vhaddpd | Vhsubpd | Vaddsubpd => (true, true, 1, ALL),
        Vrsqrt14pd | Vrcp14pd => (true, true, 1, ONLY_512),
        Dpps | Vdpps => (false, true, 2, UP_TO_256),
        Dppd | Vdppd => (true, true, 2, UP_TO_256),
        Vfmadd132ss | Vfmadd213ss | Vfmadd231ss | Vfmsub132ss | Vfmsub213ss | Vfmsub231ss | Vfnmadd132ss
        | Vfnmadd213ss | Vfnmadd231ss | Vfnmsub132ss | Vfnmsub213ss | Vfnmsub231ss => (false, false, 2, ALL),
        Vfmadd132sd | Vfmadd213sd | Vfmadd231sd | Vfmsub132sd | Vfmsub213sd | Vfmsub231sd | Vfnmadd132sd
        | Vfnmadd213sd | Vfnmadd231sd | Vfnmsub132sd | Vfnmsub213sd | Vfnmsub231sd => (true, false, 2, ALL),
        Vfmadd132ps | Vfmadd213ps | Vfmadd231ps | Vfmsub132ps | Vfmsub213ps | Vfmsub231ps | Vfnmadd132ps
        | Vfnmadd213ps | Vfnmadd231ps | Vfnmsub132ps | Vfnmsub213ps | Vfnmsub231ps | Vfmaddsub132ps
        | Vfmaddsub213ps | Vfmaddsub231ps | Vfmsubadd132ps | Vfmsubadd213ps | Vfmsubadd231ps => (false, true, 2, ALL),
        Vfmadd132pd | Vfmadd213pd | Vfmadd231pd | Vfmsub132pd | Vfmsub213pd | Vfmsub231pd | Vfnmadd132pd
        | Vfnmadd213pd | Vfnmadd231pd | Vfnmsub132pd | Vfnmsub213pd | Vfnmsub231pd | Vfmaddsub132pd
        | Vfmaddsub213pd | Vfmaddsub231pd | Vfmsubadd132pd | Vfmsubadd213pd | Vfmsubadd231pd => (true, true, 2, ALL),
        _ => return (0, 0),
    };
    if !packed {
        return (if double { Class::FP_SCALAR_DOUBLE } else { Class::FP_SCALAR_SINGLE }, count);
    }
    let reg = i.op0_register();
    let (width_bit, kind) = if reg.is_zmm() {
        (ONLY_512, if double { Class::FP_512_DOUBLE } else { Class::FP_512_SINGLE })
    } else if reg.is_ymm() {
        (0b010, if double { Class::FP_256_DOUBLE } else { Class::FP_256_SINGLE })
    } else {
        (0b001, if double { Class::FP_128_DOUBLE } else { Class::FP_128_SINGLE })
    };
    if widths & width_bit == 0 {
        return (0, 0);
    }
    (kind, count)
}

/// A far transfer: far JMP/CALL/RET, IRET, software interrupts, SYSCALL/SYSRET and
/// SYSENTER/SYSEXIT. They may change CPL and the code segment.
fn is_far_transfer(i: &Instruction) -> bool {
    use Mnemonic::*;
    let m = i.mnemonic();
    matches!(
        m,
        Iret | Iretd
            | Iretq
            | Retf
            | Syscall
            | Sysret
            | Sysretq
            | Sysenter
            | Sysexit
            | Sysexitq
            | Int
            | Into
            | Int1
            | Int3
    ) || (matches!(m, Jmp | Call) && is_far(i))
}

/// The LBR filter's kind of the transfer `i` makes, if it is a branch.
fn transfer(i: &Instruction) -> Option<Transfer> {
    if is_far_transfer(i) {
        return Some(Transfer::Far);
    }
    Some(match i.flow_control() {
        FlowControl::ConditionalBranch => Transfer::Conditional,
        FlowControl::UnconditionalBranch => Transfer::RelJmp,
        FlowControl::IndirectBranch => Transfer::IndJmp,
        FlowControl::Call => Transfer::RelCall,
        FlowControl::IndirectCall => Transfer::IndCall,
        FlowControl::Return => Transfer::Ret,
        _ => return None,
    })
}

fn is_near_direct(i: &Instruction) -> bool {
    matches!(i.op0_kind(), OpKind::NearBranch16 | OpKind::NearBranch32 | OpKind::NearBranch64)
}

fn is_far(i: &Instruction) -> bool {
    matches!(i.op0_kind(), OpKind::FarBranch16 | OpKind::FarBranch32)
        || i.op0_kind() == OpKind::Memory && i.is_jmp_far_indirect()
        || i.is_call_far_indirect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(bytes: &[u8]) -> Insn {
        decode(bytes, 0x1000, 64).expect("valid")
    }

    #[test]
    fn classifies_flow() {
        assert_eq!(d(&[0x90]).flow, Flow::Next); // nop
        assert_eq!(d(&[0xEB, 0x10]).flow, Flow::Direct { target: 0x1012, conditional: false }); // jmp
        assert_eq!(d(&[0x75, 0xFE]).flow, Flow::Direct { target: 0x1000, conditional: true }); // jnz $
        assert_eq!(d(&[0xC3]).flow, Flow::Indirect); // ret
        assert_eq!(d(&[0xFF, 0xE0]).flow, Flow::Indirect); // jmp rax
        assert_eq!(d(&[0xE8, 0, 0, 0, 0]).flow, Flow::Direct { target: 0x1005, conditional: false });
        // call
    }

    #[test]
    fn classifies_transfers_as_the_lbr_filter_does() {
        let t = |bytes: &[u8]| d(bytes).transfer;
        assert_eq!(t(&[0x90]), None); // nop
        assert_eq!(t(&[0x75, 0xFE]), Some(Transfer::Conditional)); // jnz
        assert_eq!(t(&[0xE2, 0xFE]), Some(Transfer::Conditional)); // loop
        assert_eq!(t(&[0xEB, 0x10]), Some(Transfer::RelJmp));
        assert_eq!(t(&[0xFF, 0xE0]), Some(Transfer::IndJmp)); // jmp rax
        assert_eq!(t(&[0xE8, 0, 0, 0, 0]), Some(Transfer::RelCall));
        assert_eq!(t(&[0xFF, 0xD0]), Some(Transfer::IndCall)); // call rax
        assert_eq!(t(&[0xC3]), Some(Transfer::Ret));
        assert_eq!(t(&[0x48, 0xCF]), Some(Transfer::Far)); // iretq
        assert_eq!(t(&[0xCB]), Some(Transfer::Far)); // retf
        assert_eq!(t(&[0xCD, 0x80]), Some(Transfer::Far)); // int 0x80
        assert_eq!(t(&[0x0F, 0x05]), Some(Transfer::Far)); // syscall
        assert_eq!(t(&[0xFF, 0x28]), Some(Transfer::Far)); // jmp far [rax]
    }

    #[test]
    fn counts_branches_but_not_faults() {
        for b in [&[0xC3][..], &[0xEB, 0], &[0x75, 0], &[0xE8, 0, 0, 0, 0], &[0x48, 0xCF], &[0xCD, 0x80], &[0x0F, 0x05]]
        {
            assert!(d(b).branch, "{b:x?}");
        }
        for b in [&[0x90][..], &[0x0F, 0x0B], &[0xCC], &[0x0F, 0xA2]] {
            assert!(!d(b).branch, "{b:x?}");
        }
    }

    #[test]
    fn classes_and_specials() {
        assert_eq!(d(&[0xF4]).special, Special::Hlt);
        assert_eq!(d(&[0x0F, 0x33]).special, Special::Rdpmc);
        assert_eq!(d(&[0xCD, 0x80]).special, Special::Int(0x80));
        assert_eq!(d(&[0xCC]).special, Special::Int(3));
        assert_eq!(d(&[0x0F, 0x31]).special, Special::Rdtsc);
        assert_eq!(d(&[0x0F, 0x01, 0xF9]).special, Special::Rdtscp);
        assert_eq!(d(&[0x0F, 0x32]).special, Special::Rdmsr);
        assert_eq!(d(&[0x0F, 0xAE, 0xE8]).special, Special::Fence);
        assert_eq!(d(&[0x48, 0x0F, 0xAE, 0x2F]).special, Special::Xsave);
        let port = |out, size, port| Special::Port(PortAccess { out, size, port });
        assert_eq!(d(&[0xEC]).special, port(false, 1, None)); // in al, dx
        assert_eq!(d(&[0x66, 0xED]).special, port(false, 2, None)); // in ax, dx
        assert_eq!(d(&[0xE5, 0x71]).special, port(false, 4, Some(0x71))); // in eax, 0x71
        assert_eq!(d(&[0xEE]).special, port(true, 1, None)); // out dx, al
        assert_eq!(d(&[0xE6, 0x80]).special, port(true, 1, Some(0x80))); // out 0x80, al
        assert_eq!(d(&[0xEF]).special, port(true, 4, None)); // out dx, eax
        assert_eq!(d(&[0xF3, 0x6E]).special, Special::None); // rep outsb: KVM's
        assert_eq!(d(&[0x6C]).special, Special::None); // insb
        assert_eq!(d(&[0x0F, 0x30]).class_cycles, EXITING_CYCLES); // wrmsr
        assert_eq!(d(&[0x48, 0xF7, 0xF1]).class_cycles, DIV_CYCLES); // div rcx
        assert_eq!(d(&[0x48, 0x8B, 0x03]).mem_operands, 1); // mov rax, [rbx]
        assert_eq!(d(&[0x48, 0x8D, 0x03]).mem_operands, 0); // lea rax, [rbx]
        assert_eq!(d(&[0x0F, 0x1F, 0x40, 0x00]).mem_operands, 0); // nop dword [rax]
        assert!(d(&[0x48, 0xCF]).changes_mode); // iretq
        assert!(d(&[0x0F, 0x22, 0xD8]).changes_mode); // mov cr3, rax
        assert!(d(&[0x0F, 0x23, 0xF8]).changes_mode); // mov dr7, rax
        assert!(!d(&[0x90]).changes_mode);
        assert_eq!(decode(&[0x0F, 0xFF], 0, 64), None.or(decode(&[0x0F, 0xFF], 0, 64)));
    }

    #[test]
    fn rep_string_instructions_repeat_and_retire_once() {
        // rep movsb, repe cmpsb, repne scasb, rep stosq, rep insb, rep outsb (32-bit addresses)
        for b in
            [&[0xF3, 0xA4][..], &[0xF3, 0xA6], &[0xF2, 0xAE], &[0xF3, 0x48, 0xAB], &[0xF3, 0x6C], &[0x67, 0xF3, 0x6E]]
        {
            let i = d(b);
            assert!(i.repeats, "{b:x?}");
            assert!(!i.retired_at(0x1000, 0x1000) && i.retired_at(0x1000, 0x1000 + i.len as u64), "{b:x?}");
        }
        // movsb without REP, a REP-prefixed non-string instruction (pause), and SSE's MOVSD.
        for b in [&[0xA4][..], &[0xF3, 0x90], &[0xF2, 0x0F, 0x10, 0xC1]] {
            assert!(!d(b).repeats, "{b:x?}");
        }
    }

    #[test]
    fn loads_stores_and_their_qualifiers() {
        let c = |bytes: &[u8]| d(bytes).class;
        let ls = |bytes: &[u8]| (c(bytes).loads, c(bytes).stores);
        assert_eq!(ls(&[0x48, 0x8B, 0x03]), (1, 0)); // mov rax, [rbx]
        assert_eq!(ls(&[0x48, 0x89, 0x03]), (0, 1)); // mov [rbx], rax
        assert_eq!(ls(&[0x48, 0x01, 0x03]), (1, 1)); // add [rbx], rax: read-modify-write
        assert_eq!(ls(&[0x58]), (1, 0)); // pop rax
        assert_eq!(ls(&[0x50]), (0, 1)); // push rax
        assert_eq!(ls(&[0xC3]), (1, 0)); // ret
        assert_eq!(ls(&[0xE8, 0, 0, 0, 0]), (0, 1)); // call: pushes the return address
        assert_eq!(ls(&[0xFF, 0x30]), (1, 1)); // push qword [rax]
        assert_eq!(ls(&[0xA4]), (1, 1)); // movsb
        assert_eq!(ls(&[0xA6]), (2, 0)); // cmpsb
        assert_eq!(ls(&[0xF3, 0xA4]), (1, 1)); // rep movsb: one instruction, one load and one store
        assert_eq!(ls(&[0x48, 0x8D, 0x03]), (0, 0)); // lea
        assert_eq!(ls(&[0x0F, 0x1F, 0x40, 0x00]), (0, 0)); // nop dword [rax]
        assert_eq!(ls(&[0x48, 0x0F, 0x44, 0x03]), (1, 0)); // cmovz rax, [rbx]: loads either way
        assert!(c(&[0xF0, 0x48, 0x01, 0x03]).has(Class::LOCKED)); // lock add [rbx], rax
        assert!(c(&[0x48, 0x87, 0x03]).has(Class::LOCKED)); // xchg [rbx], rax
        assert!(!c(&[0x48, 0x87, 0xC3]).has(Class::LOCKED)); // xchg rbx, rax
        assert!(!c(&[0x48, 0x01, 0x03]).has(Class::LOCKED));
        assert!(c(&[0x0F, 0x18, 0x08]).has(Class::PREFETCH)); // prefetcht0 [rax]
        assert!(c(&[0x0F, 0x0D, 0x08]).has(Class::PREFETCH)); // prefetchw [rax]
        assert_eq!(ls(&[0x0F, 0x18, 0x08]), (0, 0));
        assert!(c(&[0x90]).has(Class::NOP) && c(&[0x0F, 0x1F, 0x40, 0x00]).has(Class::NOP));
        assert!(c(&[0xF3, 0x90]).has(Class::PAUSE) && !c(&[0xF3, 0x90]).has(Class::NOP));
        assert_eq!(c(&[0x90]).flags & !Class::NOP, 0);
    }

    #[test]
    fn fp_arithmetic_by_width_and_precision() {
        let fp = |bytes: &[u8]| (d(bytes).class.fp, d(bytes).class.fp_count);
        assert_eq!(fp(&[0xF2, 0x0F, 0x58, 0xC1]), (Class::FP_SCALAR_DOUBLE, 1)); // addsd xmm0, xmm1
        assert_eq!(fp(&[0xF3, 0x0F, 0x59, 0xC1]), (Class::FP_SCALAR_SINGLE, 1)); // mulss
        assert_eq!(fp(&[0x0F, 0x5E, 0xC1]), (Class::FP_128_SINGLE, 1)); // divps xmm0, xmm1
        assert_eq!(fp(&[0x66, 0x0F, 0x51, 0xC1]), (Class::FP_128_DOUBLE, 1)); // sqrtpd
        assert_eq!(fp(&[0xC5, 0xF4, 0x58, 0xC2]), (Class::FP_256_SINGLE, 1)); // vaddps ymm0, ymm1, ymm2
        assert_eq!(fp(&[0xC5, 0xF5, 0x5C, 0xC2]), (Class::FP_256_DOUBLE, 1)); // vsubpd ymm0, ymm1, ymm2
        assert_eq!(fp(&[0x62, 0xF1, 0x74, 0x48, 0x58, 0xC2]), (Class::FP_512_SINGLE, 1)); // vaddps zmm0, zmm1, zmm2
        assert_eq!(fp(&[0xC4, 0xE2, 0xF1, 0xA9, 0xC2]), (Class::FP_SCALAR_DOUBLE, 2)); // vfmadd213sd: twice
        assert_eq!(fp(&[0x66, 0x0F, 0x3A, 0x41, 0xC1, 0x31]), (Class::FP_128_DOUBLE, 2)); // dppd: twice
        assert_eq!(fp(&[0x0F, 0x53, 0xC1]), (Class::FP_128_SINGLE, 1)); // rcpps
        assert_eq!(fp(&[0x62, 0xF2, 0x7D, 0x08, 0x4C, 0xC1]), (0, 0)); // vrcp14ps xmm0, xmm1: 512 bits only
        assert_eq!(fp(&[0x0F, 0x28, 0xC1]), (0, 0)); // movaps: no arithmetic
        assert_eq!(fp(&[0x0F, 0xC2, 0xC1, 0x00]), (0, 0)); // cmpps: not in the lists
        assert_eq!(fp(&[0x48, 0x01, 0xC8]), (0, 0)); // add rax, rcx
    }
}
