//! The data accesses of one instruction: where it reads and writes memory, computed from the
//! registers before it executes, for the precise backend's cache model.
//!
//! iced-x86 lists an instruction's memory operands, explicit and implicit (the stack of
//! PUSH/POP/CALL/RET/ENTER/IRET, the string operands of MOVS/STOS/...); this module turns them
//! into linear addresses, in the order the instruction makes them.
use std::cell::RefCell;

use iced_x86::{Instruction, InstructionInfoFactory, Mnemonic, OpAccess, OpKind, Register};

/// What an access does to its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessKind {
    /// A load (including one a mask or condition may suppress, such as CMOVcc's).
    Read,
    /// A store.
    Write,
    /// A read-modify-write of the same bytes (ADD [m], r; CMPXCHG): one access, whose line is
    /// fetched once, for ownership.
    Update,
    /// A locked read-modify-write (a LOCK prefix, or XCHG with memory, SDM Vol. 3A 9.1.2.2).
    Locked,
    /// CLFLUSH or CLFLUSHOPT: the line that holds the byte leaves every cache.
    Flush,
}

/// One data access of an instruction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Access {
    /// The linear address of its first byte (segment base included).
    pub linear: u64,
    /// Its size in bytes (1 for a flush).
    pub size: u32,
    pub kind: AccessKind,
}

impl Access {
    /// The number of `line`-byte cache lines its bytes touch (`line` a power of two).
    pub fn lines(&self, line: u32) -> u64 {
        let line = u64::from(line.max(1));
        let last = self.linear.saturating_add(u64::from(self.size.max(1)) - 1);
        last / line - self.linear / line + 1
    }
}

/// Why an instruction's accesses cannot be listed before it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum UnknownAccesses {
    /// A REP/REPE/REPNE string instruction: how many accesses it makes depends on RCX (and, for
    /// CMPS/SCAS, on the data).
    #[error("a REP string instruction: how many accesses it makes depends on RCX")]
    Rep,
    /// XSAVE, XRSTOR and their kin: how many bytes they access depends on XCR0 and the state
    /// components in use.
    #[error("an XSAVE-family instruction: how many bytes it accesses depends on the processor state")]
    StateSize,
    /// A gather or scatter (VSIB addressing): its addresses come from a vector register and a
    /// mask decides which elements it accesses.
    #[error("a gather or scatter: its addresses come from a vector register")]
    Vsib,
}

thread_local! {
    /// iced-x86's scratch space for instruction info, kept so that no call allocates it again.
    static INFO: RefCell<InstructionInfoFactory> = RefCell::new(InstructionInfoFactory::new());
}

/// The value of the 64-bit general-purpose register `reg` (any of its sizes names it) in `r`.
pub fn gpr(r: &kvm_bindings::kvm_regs, reg: Register) -> u64 {
    let all =
        [r.rax, r.rcx, r.rdx, r.rbx, r.rsp, r.rbp, r.rsi, r.rdi, r.r8, r.r9, r.r10, r.r11, r.r12, r.r13, r.r14, r.r15];
    all[reg.number() & 15]
}

/// The data accesses of `i`, in the order it makes them, given the registers before it executes:
/// `reg` returns a 64-bit general-purpose register's value (RAX..R15), `fs_base` and `gs_base`
/// the FS and GS bases. ES, CS, SS and DS have base 0 (64-bit mode, or a flat segment model).
/// `i` must have been decoded at its RIP, which RIP-relative operands are resolved against.
///
/// Memory operands that access nothing (LEA, NOP with a memory operand, PREFETCHh, CLDEMOTE)
/// give no access, and neither does CLWB (it writes a line back and may keep it; the cache model
/// has no dirty state). A read-modify-write operand is one [`AccessKind::Update`] (or
/// [`AccessKind::Locked`]).
pub fn data_accesses(
    i: &Instruction,
    reg: impl Fn(Register) -> u64,
    fs_base: u64,
    gs_base: u64,
) -> Result<Vec<Access>, UnknownAccesses> {
    check(i)?;
    let m = i.mnemonic();
    if matches!(m, Mnemonic::Clwb) || registers_only(i) {
        return Ok(Vec::new());
    }
    let flush = matches!(m, Mnemonic::Clflush | Mnemonic::Clflushopt);
    let locked = i.has_lock_prefix() || m == Mnemonic::Xchg;
    let value = |r: Register| component(r, &reg, fs_base, gs_base);
    INFO.with(|factory| {
        let mut factory = factory.borrow_mut();
        let info = factory.info(i);
        let mut accesses = Vec::with_capacity(info.used_memory().len());
        for mem in info.used_memory() {
            let size = mem.memory_size().size();
            if size == 0 {
                return Err(UnknownAccesses::StateSize);
            }
            let Some(linear) = mem.virtual_address(0, |r, _, _| value(r)) else {
                // Only a VSIB operand is addressed with another register, and `check` refused those.
                return Err(UnknownAccesses::Vsib);
            };
            let kind = match mem.access() {
                _ if flush => AccessKind::Flush,
                OpAccess::Read | OpAccess::CondRead => AccessKind::Read,
                OpAccess::ReadWrite | OpAccess::ReadCondWrite if locked => AccessKind::Locked,
                OpAccess::ReadWrite | OpAccess::ReadCondWrite => AccessKind::Update,
                _ => AccessKind::Write,
            };
            let size = if flush { 1 } else { u32::try_from(size).unwrap_or(u32::MAX) };
            accesses.push(Access { linear, size, kind });
        }
        // iced-x86 lists the destination of POP m and MOVS before their source; both read their
        // source first.
        if m == Mnemonic::Pop || (i.is_string_instruction() && is_movs(m)) {
            accesses.reverse();
        }
        Ok(accesses)
    })
}

/// The data accesses `i` makes next: for a REP string instruction with a count left, those of
/// its next iteration (one element at RSI and RDI as `reg` gives them; none with the count at
/// 0), as
/// the CPU makes them one iteration at a time (SDM Vol. 2B, REP); otherwise [`data_accesses`].
pub fn next_accesses(
    i: &Instruction,
    reg: impl Fn(Register) -> u64,
    fs_base: u64,
    gs_base: u64,
) -> Result<Vec<Access>, UnknownAccesses> {
    if !(i.is_string_instruction() && (i.has_rep_prefix() || i.has_repne_prefix())) {
        return data_accesses(i, reg, fs_base, gs_base);
    }
    // The count is RCX, ECX or CX, as the address size (the string operands' registers) says.
    let kinds: Vec<OpKind> = (0..i.op_count()).map(|n| i.op_kind(n)).collect();
    let count = reg(Register::RCX)
        & if kinds.iter().any(|k| matches!(k, OpKind::MemorySegESI | OpKind::MemoryESEDI)) {
            0xFFFF_FFFF
        } else if kinds.iter().any(|k| matches!(k, OpKind::MemorySegSI | OpKind::MemoryESDI)) {
            0xFFFF
        } else {
            u64::MAX
        };
    if count == 0 {
        return Ok(Vec::new());
    }
    let mut one = *i;
    one.set_has_rep_prefix(false);
    one.set_has_repne_prefix(false);
    data_accesses(&one, reg, fs_base, gs_base)
}

/// The linear address of `i`'s explicit memory operand, whatever its size (XSAVE's area
/// included); `None` without one.
pub fn operand_address(i: &Instruction, reg: impl Fn(Register) -> u64, fs_base: u64, gs_base: u64) -> Option<u64> {
    let n = (0..i.op_count()).find(|&n| i.op_kind(n) == OpKind::Memory)?;
    i.virtual_address(n, 0, |r, _, _| component(r, &reg, fs_base, gs_base))
}

/// A register's value as an address component: segment bases, and general-purpose registers of
/// any width read from their 64-bit register. Nothing else (RIP-relative operands come resolved
/// from iced-x86).
fn component(r: Register, reg: &impl Fn(Register) -> u64, fs_base: u64, gs_base: u64) -> Option<u64> {
    match r {
        Register::ES | Register::CS | Register::SS | Register::DS => Some(0),
        Register::FS => Some(fs_base),
        Register::GS => Some(gs_base),
        Register::AH | Register::CH | Register::DH | Register::BH => Some(reg(r.full_register()) >> 8 & 0xFF),
        _ if r.is_gpr() => {
            let bits = 8 * r.size() as u32;
            Some(reg(r.full_register()) & u64::MAX.checked_shr(64 - bits).unwrap_or(u64::MAX))
        }
        _ => None,
    }
}

/// How many loads and stores `i` makes, as iced-x86 lists its memory operands (explicit and
/// implicit): a read-modify-write operand is one of each, an operand that accesses nothing
/// (LEA, a hinted NOP, PREFETCHh) neither, and CLFLUSH, CLFLUSHOPT and CLWB neither (no data
/// moves). Whatever the registers: a REP string instruction's operands count once.
pub fn loads_and_stores(i: &Instruction) -> (u8, u8) {
    if matches!(i.mnemonic(), Mnemonic::Clflush | Mnemonic::Clflushopt | Mnemonic::Clwb) || registers_only(i) {
        return (0, 0);
    }
    INFO.with(|factory| {
        let mut factory = factory.borrow_mut();
        let (mut loads, mut stores) = (0u8, 0u8);
        for mem in factory.info(i).used_memory() {
            let (load, store) = match mem.access() {
                OpAccess::Read | OpAccess::CondRead => (true, false),
                OpAccess::Write | OpAccess::CondWrite => (false, true),
                OpAccess::ReadWrite | OpAccess::ReadCondWrite => (true, true),
                _ => (false, false),
            };
            loads = loads.saturating_add(u8::from(load));
            stores = stores.saturating_add(u8::from(store));
        }
        (loads, stores)
    })
}

/// The most `line`-byte cache lines `i` can touch, whatever its registers: every access at its
/// worst alignment. An upper bound for the LLC events one instruction can add (at most one
/// reference and one miss per line).
pub fn max_lines(i: &Instruction, line: u32) -> Result<u64, UnknownAccesses> {
    check(i)?;
    if registers_only(i) {
        return Ok(0);
    }
    let line = u64::from(line.max(1));
    INFO.with(|factory| {
        let mut factory = factory.borrow_mut();
        let info = factory.info(i);
        info.used_memory().iter().try_fold(0u64, |total, mem| {
            let size = mem.memory_size().size() as u64;
            if size == 0 {
                return Err(UnknownAccesses::StateSize);
            }
            // `size` bytes starting at the last byte of a line.
            Ok(total + (size + line - 2) / line + 1)
        })
    })
}

/// Instructions that access memory with no memory operand and no change of RSP, as iced-x86
/// lists their accesses (every opcode decoded: `registers_only_agrees_with_the_operand_lists`).
const IMPLICIT_MEMORY: &[Mnemonic] = {
    use Mnemonic::*;
    &[
        Leave,
        Umonitor,
        Rdmsrlist,
        Wrmsrlist,
        Rmpupdate,
        Pbndkb,
        Ccs_encrypt,
        Ccs_hash,
        Xcryptcbc,
        Xcryptcfb,
        Xcryptctr,
        Xcryptecb,
        Xcryptofb,
        Xsha1,
        Xsha256,
        Xsha512,
        Xsha512_alt,
        Xstore,
        Xstore_alt,
    ]
};

/// Whether `i` surely accesses no memory: no memory operand (explicit or a string one), no
/// change of RSP (the stack), and none of [`IMPLICIT_MEMORY`]. The counting hot path asks this
/// before building iced-x86's operand lists, which most instructions would find empty.
fn registers_only(i: &Instruction) -> bool {
    let memory = (0..i.op_count()).any(|n| {
        matches!(
            i.op_kind(n),
            OpKind::Memory
                | OpKind::MemorySegSI
                | OpKind::MemorySegESI
                | OpKind::MemorySegRSI
                | OpKind::MemorySegDI
                | OpKind::MemorySegEDI
                | OpKind::MemorySegRDI
                | OpKind::MemoryESDI
                | OpKind::MemoryESEDI
                | OpKind::MemoryESRDI
        )
    });
    !memory && i.stack_pointer_increment() == 0 && !IMPLICIT_MEMORY.contains(&i.mnemonic())
}

/// Refuses what cannot be listed before it runs.
fn check(i: &Instruction) -> Result<(), UnknownAccesses> {
    if i.is_string_instruction() && (i.has_rep_prefix() || i.has_repne_prefix()) {
        return Err(UnknownAccesses::Rep);
    }
    if i.is_vsib() {
        return Err(UnknownAccesses::Vsib);
    }
    Ok(())
}

fn is_movs(m: Mnemonic) -> bool {
    matches!(m, Mnemonic::Movsb | Mnemonic::Movsw | Mnemonic::Movsd | Mnemonic::Movsq)
}

#[cfg(test)]
mod tests {
    use super::*;
    use iced_x86::{Decoder, DecoderOptions};
    use AccessKind::{Flush, Locked, Read, Update, Write};

    const RIP: u64 = 0x40_1000;
    const FS_BASE: u64 = 0x7F00_0000_0000;
    const GS_BASE: u64 = 0xFFFF_8880_0000_0000;

    fn decode(bytes: &[u8], bitness: u32) -> Instruction {
        let i = Decoder::with_ip(bitness, bytes, RIP, DecoderOptions::NONE).decode();
        assert!(!i.is_invalid(), "{bytes:x?}");
        assert_eq!(i.len(), bytes.len(), "{bytes:x?} is one instruction");
        i
    }

    /// Registers: RAX = 0x1000, RCX = 0x2000, ..., 0x1000 apart in register-number order, but
    /// RSP = 0x9_0000.
    fn regs(r: Register) -> u64 {
        match r {
            Register::RSP => RSP,
            Register::RIP => RIP,
            r if r.is_gpr64() => 0x1000 * (r.number() as u64 + 1),
            r => panic!("asked for {r:?}"),
        }
    }

    fn acc64(bytes: &[u8]) -> Result<Vec<Access>, UnknownAccesses> {
        data_accesses(&decode(bytes, 64), regs, FS_BASE, GS_BASE)
    }

    fn one(linear: u64, size: u32, kind: AccessKind) -> Vec<Access> {
        vec![Access { linear, size, kind }]
    }

    const RAX: u64 = 0x1000;
    const RBX: u64 = 0x4000;
    const RSP: u64 = 0x9_0000;
    const RBP: u64 = 0x6000;
    const RSI: u64 = 0x7000;
    const RDI: u64 = 0x8000;

    #[test]
    fn loads_and_stores() {
        assert_eq!(acc64(&[0x48, 0x8B, 0x06]), Ok(one(RSI, 8, Read))); // mov rax, [rsi]
        assert_eq!(acc64(&[0x48, 0x89, 0x5C, 0x24, 0x08]), Ok(one(RSP + 8, 8, Write))); // mov [rsp+8], rbx
        assert_eq!(acc64(&[0x88, 0x43, 0xFF]), Ok(one(RBX - 1, 1, Write))); // mov [rbx-1], al
        assert_eq!(acc64(&[0x0F, 0x11, 0x07]), Ok(one(RDI, 16, Write))); // movups [rdi], xmm0
                                                                         // mov rax, [rbx + rsi*4 + 0x10]
        assert_eq!(acc64(&[0x48, 0x8B, 0x44, 0xB3, 0x10]), Ok(one(RBX + RSI * 4 + 0x10, 8, Read)));
        // mov rax, [rip + 0x10]: resolved against the instruction's own RIP.
        assert_eq!(acc64(&[0x48, 0x8B, 0x05, 0x10, 0, 0, 0]), Ok(one(RIP + 7 + 0x10, 8, Read)));
        // cmovz rax, [rbx]: read whether or not the condition holds.
        assert_eq!(acc64(&[0x48, 0x0F, 0x44, 0x03]), Ok(one(RBX, 8, Read)));
    }

    #[test]
    fn read_modify_write_is_one_access() {
        assert_eq!(acc64(&[0x48, 0x83, 0x00, 0x01]), Ok(one(RAX, 8, Update))); // add qword [rax], 1
        assert_eq!(acc64(&[0xF0, 0x01, 0x08]), Ok(one(RAX, 4, Locked))); // lock add [rax], ecx
        assert_eq!(acc64(&[0x48, 0x87, 0x08]), Ok(one(RAX, 8, Locked))); // xchg [rax], rcx: locked
        assert_eq!(acc64(&[0x48, 0x0F, 0xB1, 0x08]), Ok(one(RAX, 8, Update))); // cmpxchg [rax], rcx
    }

    #[test]
    fn no_access_for_operands_that_touch_no_memory() {
        for bytes in [
            &[0x48, 0x8D, 0x43, 0x08][..], // lea rax, [rbx+8]
            &[0x0F, 0x1F, 0x40, 0x00],     // nop dword [rax]
            &[0x0F, 0x18, 0x08],           // prefetcht0 [rax]
            &[0x0F, 0x0D, 0x08],           // prefetchw [rax]
            &[0x0F, 0x1C, 0x00],           // cldemote [rax]
            &[0x66, 0x0F, 0xAE, 0x30],     // clwb [rax]
            &[0x0F, 0x01, 0x38],           // invlpg [rax]
            &[0x48, 0x01, 0xC8],           // add rax, rcx
        ] {
            assert_eq!(acc64(bytes), Ok(vec![]), "{bytes:x?}");
        }
    }

    #[test]
    fn stack_accesses() {
        assert_eq!(acc64(&[0x50]), Ok(one(RSP - 8, 8, Write))); // push rax
        assert_eq!(acc64(&[0x58]), Ok(one(RSP, 8, Read))); // pop rax
        assert_eq!(acc64(&[0xE8, 0, 0, 0, 0]), Ok(one(RSP - 8, 8, Write))); // call rel32
        assert_eq!(acc64(&[0xC3]), Ok(one(RSP, 8, Read))); // ret
                                                           // push qword [rax]: reads its operand, then pushes it.
        assert_eq!(
            acc64(&[0xFF, 0x30]),
            Ok(vec![Access { linear: RAX, size: 8, kind: Read }, Access { linear: RSP - 8, size: 8, kind: Write }])
        );
        // call [rax]: reads the target, then pushes the return address.
        assert_eq!(
            acc64(&[0xFF, 0x10]),
            Ok(vec![Access { linear: RAX, size: 8, kind: Read }, Access { linear: RSP - 8, size: 8, kind: Write }])
        );
        // pop qword [rax]: pops, then stores.
        assert_eq!(
            acc64(&[0x8F, 0x00]),
            Ok(vec![Access { linear: RSP, size: 8, kind: Read }, Access { linear: RAX, size: 8, kind: Write }])
        );
        // pop qword [rsp+8]: the destination is addressed with RSP after the pop (SDM Vol. 2B,
        // POP), which iced-x86's operand already includes.
        assert_eq!(
            acc64(&[0x8F, 0x44, 0x24, 0x08]),
            Ok(vec![Access { linear: RSP, size: 8, kind: Read }, Access { linear: RSP + 16, size: 8, kind: Write }])
        );
        // leave: reads the saved RBP at the frame pointer.
        assert_eq!(acc64(&[0xC9]), Ok(one(RBP, 8, Read)));
        // iretq: five quadwords of its frame.
        let frame: Vec<Access> = (0..5).map(|n| Access { linear: RSP + 8 * n, size: 8, kind: Read }).collect();
        assert_eq!(acc64(&[0x48, 0xCF]), Ok(frame));
    }

    #[test]
    fn segment_bases_apply() {
        assert_eq!(acc64(&[0x64, 0x8B, 0x04, 0x25, 8, 0, 0, 0]), Ok(one(FS_BASE + 8, 4, Read))); // mov eax, fs:[8]
        assert_eq!(acc64(&[0x65, 0x48, 0x8B, 0x03]), Ok(one(GS_BASE + RBX, 8, Read)));
        // mov rax, gs:[rbx]
    }

    #[test]
    fn clflush_and_clflushopt_flush_their_operand() {
        assert_eq!(acc64(&[0x0F, 0xAE, 0x3F]), Ok(one(RDI, 1, Flush))); // clflush [rdi]
        assert_eq!(acc64(&[0x66, 0x0F, 0xAE, 0x7B, 0x40]), Ok(one(RBX + 0x40, 1, Flush)));
        // clflushopt [rbx+0x40]
    }

    #[test]
    fn string_instructions_without_rep_read_then_write() {
        // movsb: reads [rsi], then writes es:[rdi].
        assert_eq!(
            acc64(&[0xA4]),
            Ok(vec![Access { linear: RSI, size: 1, kind: Read }, Access { linear: RDI, size: 1, kind: Write }])
        );
        assert_eq!(acc64(&[0x48, 0xAB]), Ok(one(RDI, 8, Write))); // stosq
        assert_eq!(acc64(&[0xAC]), Ok(one(RSI, 1, Read))); // lodsb
    }

    #[test]
    fn what_cannot_be_listed_is_refused() {
        assert_eq!(acc64(&[0xF3, 0xA4]), Err(UnknownAccesses::Rep)); // rep movsb
                                                                     // Its next iteration: one byte read at RSI, one written at RDI; none with RCX at 0.
        let rep_movsb = Decoder::new(64, &[0xF3, 0xA4], DecoderOptions::NONE).decode();
        let at = |rcx: u64| {
            move |r: Register| match r {
                Register::RSI => 0x1000,
                Register::RDI => 0x2000,
                Register::RCX => rcx,
                _ => 0,
            }
        };
        assert_eq!(
            next_accesses(&rep_movsb, at(5), 0, 0),
            Ok(vec![Access { linear: 0x1000, size: 1, kind: Read }, Access { linear: 0x2000, size: 1, kind: Write }])
        );
        assert_eq!(next_accesses(&rep_movsb, at(0), 0, 0), Ok(vec![]));
        assert_eq!(acc64(&[0xF3, 0x48, 0xAB]), Err(UnknownAccesses::Rep)); // rep stosq
        assert_eq!(acc64(&[0xF2, 0xAE]), Err(UnknownAccesses::Rep)); // repne scasb
        assert_eq!(acc64(&[0xF3, 0xA6]), Err(UnknownAccesses::Rep)); // repe cmpsb
        assert_eq!(acc64(&[0x0F, 0xAE, 0x20]), Err(UnknownAccesses::StateSize)); // xsave [rax]
        assert_eq!(acc64(&[0x0F, 0xAE, 0x28]), Err(UnknownAccesses::StateSize)); // xrstor [rax]
        let xrstor = Decoder::with_ip(64, &[0x48, 0x0F, 0xAE, 0x6F, 0x40], 0, DecoderOptions::NONE).decode();
        let regs = |r: Register| if r == Register::RDI { 0x1000 } else { 0 };
        assert_eq!(operand_address(&xrstor, regs, 0, 0), Some(0x1040), "xrstor64 [rdi+0x40]");
        let gather = [0xC4, 0xE2, 0x75, 0x92, 0x04, 0x90]; // vgatherdps ymm0, [rax+ymm2*4], ymm1
        assert_eq!(acc64(&gather), Err(UnknownAccesses::Vsib));
        assert_eq!(max_lines(&decode(&gather, 64), 64), Err(UnknownAccesses::Vsib));
        assert_eq!(max_lines(&decode(&[0xF3, 0xA4], 64), 64), Err(UnknownAccesses::Rep));
        // A REP prefix on what is not a string instruction is no repetition.
        assert_eq!(acc64(&[0xF3, 0xC3]), Ok(one(RSP, 8, Read))); // rep ret
        assert!(!UnknownAccesses::Rep.to_string().contains('\n'));
    }

    #[test]
    fn narrow_addresses_use_the_low_bits_of_their_registers() {
        let high = |r: Register| regs(r) | 0xFFFF_FFFF_0000_0000;
        // mov eax, [esi] (address-size prefix): ESI is RSI's low 32 bits.
        let i = decode(&[0x67, 0x8B, 0x06], 64);
        assert_eq!(data_accesses(&i, high, 0, 0), Ok(one(RSI, 4, Read)));
        // 32-bit code: push eax below ESP = 0 wraps to the top of the 4 GiB space.
        let zero_esp = |r: Register| if r == Register::RSP { 0xFFFF_FFFF_0000_0000 } else { high(r) };
        assert_eq!(data_accesses(&decode(&[0x50], 32), zero_esp, 0, 0), Ok(one(0xFFFF_FFFC, 4, Write)));
        // 16-bit code: mov ax, [bx+si].
        let i = decode(&[0x8B, 0x00], 16);
        assert_eq!(data_accesses(&i, high, 0, 0), Ok(one((RBX + RSI) & 0xFFFF, 2, Read)));
        // xlat: [rbx + al].
        let al = |r: Register| if r == Register::RAX { 0x1234_5678_9ABC_DE42 } else { regs(r) };
        assert_eq!(data_accesses(&decode(&[0xD7], 64), al, 0, 0), Ok(one(RBX + 0x42, 1, Read)));
    }

    #[test]
    fn a_cross_line_access_touches_two_lines() {
        let unaligned = |r: Register| if r == Register::RSI { 0x103C } else { regs(r) };
        let accesses = data_accesses(&decode(&[0x48, 0x8B, 0x06], 64), unaligned, 0, 0).expect("listed");
        assert_eq!(accesses, one(0x103C, 8, Read));
        assert_eq!(accesses[0].lines(64), 2);
        assert_eq!(Access { linear: 0x1038, size: 8, kind: Read }.lines(64), 1);
        assert_eq!(Access { linear: 0x1020, size: 64, kind: Write }.lines(64), 2);
        assert_eq!(Access { linear: 0x1000, size: 512, kind: Write }.lines(64), 8);
        assert_eq!(Access { linear: u64::MAX, size: 8, kind: Read }.lines(64), 1);
    }

    /// The fast path never takes an instruction whose accesses iced-x86 lists for one that has
    /// none: every one- to three-byte opcode map, with prefixes and ModRM forms, and VEX.
    #[test]
    fn registers_only_agrees_with_the_operand_lists() {
        let mut factory = InstructionInfoFactory::new();
        let prefixes: [&[u8]; 8] = [&[], &[0x66], &[0xF2], &[0xF3], &[0x48], &[0x66, 0x48], &[0xF3, 0x48], &[0xF0]];
        let maps: [&[u8]; 5] = [&[], &[0x0F], &[0x0F, 0x38], &[0x0F, 0x3A], &[0x0F, 0x01]];
        let modrms = [0x00u8, 0x08, 0x10, 0x18, 0x20, 0x28, 0x30, 0x38, 0xC0, 0xC8, 0xD0, 0xD8, 0xE0, 0xE8, 0xF0, 0xF8];
        let mut encodings = Vec::new();
        for p in prefixes {
            for m in maps {
                for op in 0..=255u8 {
                    for modrm in modrms.iter().chain(&[0xC1, 0xD1, 0xD5, 0xCA, 0xCB, 0xEE, 0xEF, 0xF9, 0xFA]) {
                        encodings.push([p, m, &[op, *modrm]].concat());
                    }
                }
            }
        }
        for (pp, mm) in (0..4u8).flat_map(|pp| (1..4u8).map(move |mm| (pp, mm))) {
            for op in 0..=255u8 {
                for modrm in [0x00u8, 0x08, 0xC0, 0xC8] {
                    encodings.push(vec![0xC4, 0xE0 | mm, 0x78 | pp, op, modrm]);
                }
            }
        }
        let mut decoded = 0;
        for mut bytes in encodings {
            bytes.extend_from_slice(&[0; 10]);
            let i = iced_x86::Decoder::with_ip(64, &bytes, RIP, iced_x86::DecoderOptions::NONE).decode();
            if i.is_invalid() {
                continue;
            }
            decoded += 1;
            if registers_only(&i) {
                assert!(factory.info(&i).used_memory().is_empty(), "{:?} ({bytes:02x?})", i.mnemonic());
            }
        }
        assert!(decoded > 100_000, "{decoded}");
    }

    #[test]
    fn max_lines_bounds_every_alignment() {
        let bound = |bytes: &[u8]| max_lines(&decode(bytes, 64), 64);
        assert_eq!(bound(&[0x48, 0x8D, 0x43, 0x08]), Ok(0)); // lea
        assert_eq!(bound(&[0x48, 0x8B, 0x06]), Ok(2)); // mov rax, [rsi]: 8 bytes may cross
        assert_eq!(bound(&[0x8A, 0x06]), Ok(1)); // mov al, [rsi]: 1 byte cannot
        assert_eq!(bound(&[0xFF, 0x30]), Ok(4)); // push qword [rax]: two 8-byte accesses
        assert_eq!(bound(&[0x0F, 0xAE, 0x00]), Ok(9)); // fxsave [rax]: 512 bytes
        assert_eq!(bound(&[0x48, 0xCF]), Ok(10)); // iretq
        assert_eq!(max_lines(&decode(&[0x48, 0x8B, 0x06], 64), 128), Ok(2));
        // The bound holds for the accesses at every alignment.
        for offset in 0..64 {
            let at = |r: Register| if r == Register::RSI { 0x1000 + offset } else { regs(r) };
            let i = decode(&[0x48, 0xA5], 64); // movsq: [rsi] and [rdi]
            let lines: u64 = data_accesses(&i, at, 0, 0).expect("listed").iter().map(|a| a.lines(64)).sum();
            assert!(lines <= max_lines(&i, 64).expect("bounded"), "offset {offset}");
        }
    }
}

/// Whether DIV or IDIV `i` raises #DE with the registers `r` and its memory operand's value
/// `memory` (read with the operand's size; `None` if it cannot be read): a divisor of 0, or a
/// quotient that does not fit the destination (SDM Vol. 2A, DIV and IDIV). `None` for any other
/// instruction, or when the divisor cannot be read.
pub fn divide_error(i: &Instruction, r: &kvm_bindings::kvm_regs, memory: Option<u64>) -> Option<bool> {
    let signed = match i.mnemonic() {
        Mnemonic::Div => false,
        Mnemonic::Idiv => true,
        _ => return None,
    };
    let (divisor, size) = match i.op0_kind() {
        OpKind::Register => {
            let reg = i.op0_register();
            (component(reg, &|x| gpr(r, x), 0, 0)?, reg.size())
        }
        OpKind::Memory => (memory?, i.memory_size().size()),
        _ => return None,
    };
    let bits = 8 * size as u32;
    let mask = |v: u128| if bits == 64 { v & u128::from(u64::MAX) } else { v & ((1u128 << bits) - 1) };
    let divisor = mask(u128::from(divisor));
    if divisor == 0 {
        return Some(true);
    }
    // The dividend: AX for a byte divisor, else rDX:rAX of the divisor's size.
    let dividend =
        if size == 1 { u128::from(r.rax & 0xFFFF) } else { mask(u128::from(r.rdx)) << bits | mask(u128::from(r.rax)) };
    Some(if signed {
        let sext = |v: u128, width: u32| ((v << (128 - width)) as i128) >> (128 - width);
        let (n, d) = (sext(dividend, 2 * bits), sext(divisor, bits));
        // i128 cannot overflow here: the dividend has at most 128 bits only for 64-bit operands,
        // and MIN / -1 is the one case checked apart.
        let q = if n == i128::MIN && d == -1 { return Some(true) } else { n / d };
        let limit = 1i128 << (bits - 1);
        q < -limit || q >= limit
    } else {
        dividend / divisor > mask(u128::MAX)
    })
}

#[cfg(test)]
mod divide_tests {
    use super::*;
    use iced_x86::{Decoder, DecoderOptions};

    fn insn(bytes: &[u8]) -> Instruction {
        Decoder::new(64, bytes, DecoderOptions::NONE).decode()
    }

    #[test]
    fn divide_errors_as_the_sdm_defines_them() {
        let regs = |rax: u64, rdx: u64, rcx: u64| kvm_bindings::kvm_regs { rax, rdx, rcx, ..Default::default() };
        let div_ecx = insn(&[0xF7, 0xF1]);
        let idiv_ecx = insn(&[0xF7, 0xF9]);
        let div_ch = insn(&[0xF6, 0xF5]);
        let div_mem = insn(&[0x48, 0xF7, 0x33]); // div qword [rbx]
        assert_eq!(divide_error(&div_ecx, &regs(10, 0, 0), None), Some(true), "by zero");
        assert_eq!(divide_error(&div_ecx, &regs(10, 0, 1 << 32), None), Some(true), "ECX is 0");
        assert_eq!(divide_error(&div_ecx, &regs(10, 0, 3), None), Some(false));
        assert_eq!(divide_error(&div_ecx, &regs(0, 1, 1), None), Some(true), "2^32 / 1 does not fit EAX");
        assert_eq!(
            divide_error(&idiv_ecx, &regs(0x8000_0000, 0xFFFF_FFFF, 0xFFFF_FFFF), None),
            Some(true),
            "-2^31 / -1"
        );
        assert_eq!(
            divide_error(&idiv_ecx, &regs(0xFFFF_FFF6, 0xFFFF_FFFF, 0xFFFF_FFFE), None),
            Some(false),
            "-10 / -2"
        );
        assert_eq!(divide_error(&div_ch, &regs(0x200, 0, 0x100), None), Some(true), "AX 512 / CH 1 does not fit AL");
        assert_eq!(divide_error(&div_ch, &regs(0x200, 0, 0x300), None), Some(false), "512 / 3");
        assert_eq!(divide_error(&div_mem, &regs(5, 0, 0), Some(0)), Some(true));
        assert_eq!(divide_error(&div_mem, &regs(5, 0, 0), None), None, "unreadable");
        assert_eq!(divide_error(&insn(&[0x90]), &regs(0, 0, 0), None), None);
    }
}
