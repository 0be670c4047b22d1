//! A userspace emulator for the instructions that KVM's in-kernel emulator cannot run (kvm_pvm
//! sends every instruction of CPL0 guest code there), one file per family:
//! - `sse.rs`: SSE2 integer instructions (that emulator knows only plain moves). The precompiled
//!   `core` of emon's Rust guests uses some of them in its formatting code.
//! - `fp.rs`: SSE/SSE2 floating-point arithmetic (ADD, SUB, MUL, DIV, MIN, MAX, SQRT), run by the
//!   host under the guest's MXCSR.
//! - `general.rs`: POPCNT, CLAC and STAC, which Linux uses once CPUID shows POPCNT and SMAP (on
//!   this host the guest sees them whatever the VMM's CPUID table says).
//!
//! The emulator is pure: it works on a [`Machine`] (GPRs, XMM registers, linear memory), so it has
//! no KVM in it and is unit-tested here. [`VcpuMachine`] is the Machine over a vCPU's registers
//! and guest memory that the exit loop uses.
//!
//! Scope and semantics:
//! - 64-bit mode only; legacy-SSE (non-VEX) encodings with XMM operands. MMX forms, VEX forms and
//!   any instruction not listed in [`emulate`] give [`EmuError::Unsupported`]. The LOCK prefix is
//!   taken only on CMPXCHG16B: with one vCPU stopped in emon, its read-compare-write is atomic.
//! - Lane semantics are those of the Intel SDM Vol. 2 (little-endian lanes).
//! - Segment bases are 0 (long mode is flat); an FS or GS override is unsupported.
//! - Alignment is not checked: a misaligned 128-bit memory operand of `movdqa`, `movaps`, `pxor`
//!   and the like, which raises #GP on hardware, is emulated like an aligned one.
//! - No exception is injected: an unmapped memory operand gives [`EmuError::Memory`], and the
//!   caller stops the guest. Nothing is written to the machine when emulation fails.
//! - The SSE instructions do not change RFLAGS; POPCNT sets its flags, CLAC/STAC set RFLAGS.AC.
//! - FP arithmetic sets MXCSR's exception flags; one the guest leaves unmasked gives
//!   [`EmuError::SimdException`] (#XM is not emulated).
use crate::mode::CpuMode;
use iced_x86::{Decoder, DecoderOptions, Formatter, Instruction, IntelFormatter, OpKind, Register};
use kvm_bindings::kvm_regs;
use thiserror::Error;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

mod fp;
mod general;
mod sse;

/// The guest state the emulator reads and writes.
pub trait Machine {
    /// The full 64-bit value of a 64-bit GPR (RAX..R15). Never called with RIP: RIP-relative
    /// operands are resolved from the instruction's own address.
    fn gpr(&self, reg: Register) -> u64;
    /// Writes a full 64-bit GPR (RAX..R15). The emulator zero-extends 32-bit results itself.
    fn set_gpr(&mut self, reg: Register, value: u64);
    fn xmm(&self, n: usize) -> [u8; 16];
    fn set_xmm(&mut self, n: usize, v: [u8; 16]);
    /// MXCSR (SDM Vol. 1 10.2.3).
    fn mxcsr(&self) -> u32;
    fn set_mxcsr(&mut self, value: u32);
    fn read_mem(&mut self, linear: u64, buf: &mut [u8]) -> Result<(), EmuError>;
    fn write_mem(&mut self, linear: u64, buf: &[u8]) -> Result<(), EmuError>;
    fn rflags(&self) -> u64;
    fn set_rflags(&mut self, value: u64);
    /// The current privilege level.
    fn cpl(&self) -> u8;
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum EmuError {
    /// The instruction, formatted (Intel syntax).
    #[error("`{0}` is not an instruction it emulates")]
    Unsupported(String),
    /// The linear address that is not mapped (or not backed by guest memory).
    #[error("linear address {0:#x} of a memory operand is not mapped")]
    Memory(u64),
    #[error("the instruction bytes do not decode to a 64-bit instruction")]
    Decode,
    /// The instruction faults at this privilege level (CLAC/STAC above CPL0: #UD); only the
    /// instructions' CPL0 forms are emulated.
    #[error("it raises #UD at CPL{0}, which is not emulated")]
    Cpl(u8),
    /// CMPXCHG16B's operand at this linear address is not 16-byte aligned: #GP on hardware.
    #[error("its 16-byte operand at {0:#x} is misaligned (#GP), which is not emulated")]
    Misaligned(u64),
    /// FP arithmetic raised these MXCSR exception flags (bits 5:0), which MXCSR does not mask:
    /// #XM on hardware.
    #[error("it raises SIMD floating-point exceptions {0:#x} that MXCSR leaves unmasked (#XM), which is not emulated")]
    SimdException(u32),
}

type Xmm = [u8; 16];

/// XMM0-15.
pub type Xmm16 = [[u8; 16]; 16];

/// Emulates the instruction in `bytes` (at least its length; extra bytes are ignored) at `rip`,
/// in 64-bit mode. On success returns the new RIP (`rip` + the instruction's length).
///
/// Supported (legacy 66/F3/F2 0F encodings, XMM register or memory operands):
/// - moves: `movd`, `movq` (all four XMM forms), `movdqa`, `movdqu`, `movaps`, `movups`,
///   `movapd`, `movupd`;
/// - arithmetic: `paddb/w/d/q`, `psubb/w/d/q`, `pmuludq`, `pmullw`, `pmulhuw`, `pavgb`, `pminub`,
///   `pmaxub`, `psadbw`;
/// - logic: `pand`, `pandn`, `por`, `pxor`;
/// - compares: `pcmpeqb/w/d`, `pcmpgtb/w/d`;
/// - shifts: `psrlw/d/q`, `psllw/d/q`, `psraw/d` (imm8 and xmm/m128 counts), `psrldq`, `pslldq`;
/// - shuffles: `pshufd`, `pshuflw`, `pshufhw`, `punpckl/hbw/wd/dq/qdq`, `packsswb`, `packssdw`,
///   `packuswb`;
/// - `pinsrw`, `pextrw` (including the SSE4.1 memory form), `pmovmskb`;
/// - floating point: `addss/sd/ps/pd`, `sub..`, `mul..`, `div..`, `min..`, `max..`, `sqrt..`;
/// - general: `popcnt` (16, 32 and 64 bits), `(lock) cmpxchg16b`, and at CPL0 `clac` and `stac`.
pub fn emulate(bytes: &[u8], rip: u64, m: &mut impl Machine) -> Result<u64, EmuError> {
    let mut decoder = Decoder::with_ip(64, bytes, rip, DecoderOptions::NONE);
    let insn = decoder.decode();
    if insn.is_invalid() || insn.len() > bytes.len() {
        return Err(EmuError::Decode);
    }
    let unsupported = || {
        let mut text = String::new();
        IntelFormatter::new().format(&insn, &mut text);
        EmuError::Unsupported(text)
    };
    // LOCK only where a lone vCPU's read-modify-write is the locked one (CMPXCHG16B).
    let lockable = insn.code() == iced_x86::Code::Cmpxchg16b_m128;
    if (insn.has_lock_prefix() && !lockable) || matches!(insn.segment_prefix(), Register::FS | Register::GS) {
        return Err(unsupported());
    }
    let mut cpu = Cpu { insn: &insn, m };
    if let Some(op) = sse::Op::for_code(insn.code()) {
        cpu.execute_sse(op)?;
    } else if let Some(op) = fp::Op::for_code(insn.code()) {
        cpu.execute_fp(op)?;
    } else if let Some(op) = general::Op::for_code(insn.code()) {
        cpu.execute_general(op)?;
    } else {
        return Err(unsupported());
    }
    Ok(insn.next_ip())
}

/// Whether the instruction in `bytes` (64-bit) is one of the SSE families, the only ones that
/// read or write the XMM registers and MXCSR: a caller can skip fetching them for the others.
pub fn uses_xmm(bytes: &[u8]) -> bool {
    let insn = Decoder::new(64, bytes, DecoderOptions::NONE).decode();
    sse::Op::for_code(insn.code()).is_some() || fp::Op::for_code(insn.code()).is_some()
}

/// An instruction being executed on a machine.
struct Cpu<'a, M: Machine> {
    insn: &'a Instruction,
    m: &'a mut M,
}

impl<M: Machine> Cpu<'_, M> {
    /// The linear address of memory operand `op`.
    fn address(&self, op: u32) -> u64 {
        let m = &*self.m;
        let value = |reg: Register, _element: usize, _size: usize| {
            Some(if reg.is_segment_register() { 0 } else { m.gpr(reg.full_register()) })
        };
        self.insn.virtual_address(op, 0, value).unwrap_or_default()
    }

    /// Operand `op`: an XMM register's 16 bytes, a GPR's value (as wide as the register), or the
    /// memory operand's bytes (as many as its size); zero-extended to 16 bytes.
    fn load(&mut self, op: u32) -> Result<Xmm, EmuError> {
        let mut out = [0u8; 16];
        match self.insn.op_kind(op) {
            OpKind::Register => {
                let reg = self.insn.op_register(op);
                if reg.is_xmm() {
                    out = self.m.xmm(reg.number());
                } else {
                    let n = reg.size();
                    out[..n].copy_from_slice(&self.m.gpr(reg.full_register()).to_le_bytes()[..n]);
                }
            }
            OpKind::Memory => {
                let n = self.insn.memory_size().size();
                let la = self.address(op);
                self.m.read_mem(la, &mut out[..n])?;
            }
            _ => return Err(EmuError::Decode),
        }
        Ok(out)
    }

    /// Writes `v` to operand `op`: a whole XMM register; a GPR, zero-extended to 64 bits when it
    /// is a 32-bit one; or as many bytes as the memory operand's size.
    fn store(&mut self, op: u32, v: &Xmm) -> Result<(), EmuError> {
        match self.insn.op_kind(op) {
            OpKind::Register => {
                let reg = self.insn.op_register(op);
                if reg.is_xmm() {
                    self.m.set_xmm(reg.number(), *v);
                } else if reg.is_gpr32() || reg.is_gpr64() {
                    let n = reg.size();
                    let mut b = [0u8; 8];
                    b[..n].copy_from_slice(&v[..n]);
                    self.m.set_gpr(reg.full_register(), u64::from_le_bytes(b));
                } else {
                    return Err(EmuError::Decode);
                }
                Ok(())
            }
            OpKind::Memory => {
                let n = self.insn.memory_size().size();
                let la = self.address(op);
                self.m.write_mem(la, &v[..n])
            }
            _ => Err(EmuError::Decode),
        }
    }
}

/// A [`Machine`] over a vCPU's state as KVM gives it: KVM_GET_REGS (GPRs), the XMM registers
/// (from its XSAVE image; never from KVM_GET_FPU, which ignores XSTATE_BV) and guest memory, with linear addresses translated
/// through the guest's page tables. The caller writes `regs` and `xmm` back after a successful
/// [`emulate`].
///
/// Page permissions (R/W, U/S, NX) are not checked: the instructions come from CPL0 code.
pub struct VcpuMachine<'a> {
    pub regs: &'a mut kvm_regs,
    pub xmm: &'a mut Xmm16,
    pub mxcsr: &'a mut u32,
    pub mem: &'a GuestMemoryMmap,
    pub mode: CpuMode,
}

impl VcpuMachine<'_> {
    /// The guest-physical pieces of `len` bytes at linear `la` (split at 4 KiB pages), each with
    /// its offset in the access. Fails on the first unmapped page, before anything is accessed.
    fn pieces(&self, la: u64, len: usize) -> Result<Vec<(GuestAddress, std::ops::Range<usize>)>, EmuError> {
        let mut out = Vec::new();
        let mut done = 0;
        while done < len {
            let a = la.wrapping_add(done as u64);
            let n = (len - done).min((0x1000 - (a & 0xFFF)) as usize);
            let pa = self.mode.translate(self.mem, a).ok_or(EmuError::Memory(a))?;
            out.push((GuestAddress(pa), done..done + n));
            done += n;
        }
        Ok(out)
    }
}

/// The 64-bit general-purpose register `reg` (RAX..R15, by its iced-x86 number) in `r`.
pub fn gpr(r: &kvm_regs, reg: Register) -> u64 {
    let all =
        [r.rax, r.rcx, r.rdx, r.rbx, r.rsp, r.rbp, r.rsi, r.rdi, r.r8, r.r9, r.r10, r.r11, r.r12, r.r13, r.r14, r.r15];
    all[reg.number() & 15]
}

impl Machine for VcpuMachine<'_> {
    fn gpr(&self, reg: Register) -> u64 {
        gpr(self.regs, reg)
    }
    fn set_gpr(&mut self, reg: Register, value: u64) {
        let r = &mut *self.regs;
        let slot = match reg.number() & 15 {
            0 => &mut r.rax,
            1 => &mut r.rcx,
            2 => &mut r.rdx,
            3 => &mut r.rbx,
            4 => &mut r.rsp,
            5 => &mut r.rbp,
            6 => &mut r.rsi,
            7 => &mut r.rdi,
            8 => &mut r.r8,
            9 => &mut r.r9,
            10 => &mut r.r10,
            11 => &mut r.r11,
            12 => &mut r.r12,
            13 => &mut r.r13,
            14 => &mut r.r14,
            _ => &mut r.r15,
        };
        *slot = value;
    }
    fn xmm(&self, n: usize) -> [u8; 16] {
        self.xmm[n]
    }
    fn set_xmm(&mut self, n: usize, v: [u8; 16]) {
        self.xmm[n] = v;
    }
    fn mxcsr(&self) -> u32 {
        *self.mxcsr
    }
    fn set_mxcsr(&mut self, value: u32) {
        *self.mxcsr = value;
    }
    fn read_mem(&mut self, linear: u64, buf: &mut [u8]) -> Result<(), EmuError> {
        for (pa, range) in self.pieces(linear, buf.len())? {
            let start = range.start;
            self.mem.read_slice(&mut buf[range], pa).map_err(|_| EmuError::Memory(linear + start as u64))?;
        }
        Ok(())
    }
    fn write_mem(&mut self, linear: u64, buf: &[u8]) -> Result<(), EmuError> {
        for (pa, range) in self.pieces(linear, buf.len())? {
            let start = range.start;
            self.mem.write_slice(&buf[range], pa).map_err(|_| EmuError::Memory(linear + start as u64))?;
        }
        Ok(())
    }
    fn rflags(&self) -> u64 {
        self.regs.rflags
    }
    fn set_rflags(&mut self, value: u64) {
        self.regs.rflags = value;
    }
    fn cpl(&self) -> u8 {
        self.mode.cpl
    }
}

#[cfg(test)]
mod tests {
    use super::sse::set_lane;
    use super::*;

    const RIP: u64 = 0x1000;
    const MEM: usize = 0x10000;

    /// A machine with 16 GPRs, 16 XMM registers and 64 KiB of flat memory at linear address 0.
    struct TestMachine {
        gprs: [u64; 16],
        xmms: [Xmm; 16],
        mem: Vec<u8>,
        rflags: u64,
        cpl: u8,
        mxcsr: u32,
    }

    impl TestMachine {
        fn new() -> TestMachine {
            // Recognizable garbage everywhere, so zero-extension and partial writes show.
            TestMachine {
                gprs: [0x5A5A_5A5A_5A5A_5A5A; 16],
                xmms: [[0xA5; 16]; 16],
                mem: vec![0xEE; MEM],
                rflags: 0x2,
                cpl: 0,
                mxcsr: 0x1F80,
            }
        }
        fn mem(&self, at: usize, n: usize) -> &[u8] {
            &self.mem[at..at + n]
        }
        fn poke(&mut self, at: usize, bytes: &[u8]) {
            self.mem[at..at + bytes.len()].copy_from_slice(bytes);
        }
    }

    impl Machine for TestMachine {
        fn gpr(&self, reg: Register) -> u64 {
            assert!(reg.is_gpr64(), "gpr({reg:?})");
            self.gprs[reg.number()]
        }
        fn set_gpr(&mut self, reg: Register, value: u64) {
            assert!(reg.is_gpr64(), "set_gpr({reg:?})");
            self.gprs[reg.number()] = value;
        }
        fn xmm(&self, n: usize) -> Xmm {
            self.xmms[n]
        }
        fn set_xmm(&mut self, n: usize, v: Xmm) {
            self.xmms[n] = v;
        }
        fn mxcsr(&self) -> u32 {
            self.mxcsr
        }
        fn set_mxcsr(&mut self, value: u32) {
            self.mxcsr = value;
        }
        fn read_mem(&mut self, linear: u64, buf: &mut [u8]) -> Result<(), EmuError> {
            let at = usize::try_from(linear).ok().filter(|a| a + buf.len() <= MEM).ok_or(EmuError::Memory(linear))?;
            buf.copy_from_slice(&self.mem[at..at + buf.len()]);
            Ok(())
        }
        fn write_mem(&mut self, linear: u64, buf: &[u8]) -> Result<(), EmuError> {
            let at = usize::try_from(linear).ok().filter(|a| a + buf.len() <= MEM).ok_or(EmuError::Memory(linear))?;
            self.mem[at..at + buf.len()].copy_from_slice(buf);
            Ok(())
        }
        fn rflags(&self) -> u64 {
            self.rflags
        }
        fn set_rflags(&mut self, value: u64) {
            self.rflags = value;
        }
        fn cpl(&self) -> u8 {
            self.cpl
        }
    }

    fn x16(w: [u16; 8]) -> Xmm {
        let mut v = [0u8; 16];
        for (i, x) in w.iter().enumerate() {
            set_lane(&mut v, 2, i, *x as u64);
        }
        v
    }
    fn x32(d: [u32; 4]) -> Xmm {
        let mut v = [0u8; 16];
        for (i, x) in d.iter().enumerate() {
            set_lane(&mut v, 4, i, *x as u64);
        }
        v
    }
    fn x64(q: [u64; 2]) -> Xmm {
        let mut v = [0u8; 16];
        set_lane(&mut v, 8, 0, q[0]);
        set_lane(&mut v, 8, 1, q[1]);
        v
    }
    fn seq(from: u8) -> Xmm {
        std::array::from_fn(|i| from + i as u8)
    }

    const A: Xmm = [0xFF, 0x01, 0x80, 0x7F, 0x10, 0x20, 0x30, 0x40, 0x00, 0xFE, 0x55, 0xAA, 0x01, 0x02, 0x03, 0x04];
    const B: Xmm = [0x01, 0xFF, 0x80, 0x01, 0x01, 0x02, 0x03, 0x04, 0x00, 0x03, 0xAA, 0x55, 0x10, 0x20, 0x30, 0x40];

    /// Checks that `bytes` decode to `text` (so the test's encoding is the one meant), then
    /// emulates them at RIP and checks the returned RIP.
    fn exec(m: &mut TestMachine, bytes: &[u8], text: &str) {
        let insn = Decoder::with_ip(64, bytes, RIP, DecoderOptions::NONE).decode();
        let mut formatted = String::new();
        IntelFormatter::new().format(&insn, &mut formatted);
        assert_eq!(formatted, text, "test encoding {bytes:02x?}");
        assert_eq!(insn.len(), bytes.len(), "{text}: trailing bytes");
        assert_eq!(emulate(bytes, RIP, m), Ok(RIP + bytes.len() as u64), "{text}");
    }

    /// xmm0 = a, xmm1 = b; runs `op xmm0,xmm1` (66 0F `opcode` C1); returns xmm0. Then the same
    /// with b in memory at a misaligned address (66 0F `opcode` 00: `[rax]`), which must agree.
    fn binop(opcode: u8, name: &str, a: Xmm, b: Xmm) -> Xmm {
        let mut m = TestMachine::new();
        m.xmms[0] = a;
        m.xmms[1] = b;
        exec(&mut m, &[0x66, 0x0F, opcode, 0xC1], &format!("{name} xmm0,xmm1"));
        assert_eq!(m.xmms[1], b, "{name}: source unchanged");
        let by_reg = m.xmms[0];
        let mut m = TestMachine::new();
        m.xmms[0] = a;
        m.gprs[0] = 0x2003;
        m.poke(0x2003, &b);
        exec(&mut m, &[0x66, 0x0F, opcode, 0x00], &format!("{name} xmm0,[rax]"));
        assert_eq!(m.xmms[0], by_reg, "{name}: memory operand");
        by_reg
    }

    #[test]
    fn movd_zero_extends_into_xmm_and_gpr() {
        let mut m = TestMachine::new();
        m.gprs[1] = 0xDEAD_BEEF_1234_5678;
        exec(&mut m, &[0x66, 0x0F, 0x6E, 0xC1], "movd xmm0,ecx");
        assert_eq!(m.xmms[0], x32([0x1234_5678, 0, 0, 0]));
        m.xmms[1] = seq(0x80);
        exec(&mut m, &[0x66, 0x0F, 0x7E, 0xC8], "movd eax,xmm1");
        assert_eq!(m.gprs[0], 0x8382_8180, "upper half of RAX zeroed");
        exec(&mut m, &[0x66, 0x41, 0x0F, 0x7E, 0xC8], "movd r8d,xmm1");
        assert_eq!(m.gprs[8], 0x8382_8180);
    }

    #[test]
    fn movd_memory_forms_move_four_bytes() {
        let mut m = TestMachine::new();
        m.gprs[0] = 0x3000;
        m.poke(0x3000, &[1, 2, 3, 4, 5, 6, 7, 8]);
        exec(&mut m, &[0x66, 0x0F, 0x6E, 0x10], "movd xmm2,[rax]");
        assert_eq!(m.xmms[2], [1, 2, 3, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        m.gprs[3] = 0x3100;
        m.xmms[3] = seq(0x40);
        exec(&mut m, &[0x66, 0x0F, 0x7E, 0x1B], "movd [rbx],xmm3");
        assert_eq!(m.mem(0x3100, 6), [0x40, 0x41, 0x42, 0x43, 0xEE, 0xEE]);
    }

    #[test]
    fn movq_between_gpr_and_xmm() {
        let mut m = TestMachine::new();
        m.gprs[1] = 0xDEAD_BEEF_1234_5678;
        exec(&mut m, &[0x66, 0x48, 0x0F, 0x6E, 0xC1], "movq xmm0,rcx");
        assert_eq!(m.xmms[0], x64([0xDEAD_BEEF_1234_5678, 0]));
        m.xmms[1] = x64([0x0102_0304_0506_0708, 0x1111]);
        exec(&mut m, &[0x66, 0x48, 0x0F, 0x7E, 0xC8], "movq rax,xmm1");
        assert_eq!(m.gprs[0], 0x0102_0304_0506_0708);
        exec(&mut m, &[0x66, 0x4D, 0x0F, 0x6E, 0xFF], "movq xmm15,r15");
        assert_eq!(m.xmms[15], x64([0x5A5A_5A5A_5A5A_5A5A, 0]));
    }

    #[test]
    fn movq_xmm_forms_zero_the_upper_qword() {
        let mut m = TestMachine::new();
        m.xmms[3] = x64([0x1122_3344_5566_7788, 0x99]);
        exec(&mut m, &[0xF3, 0x0F, 0x7E, 0xD3], "movq xmm2,xmm3");
        assert_eq!(m.xmms[2], x64([0x1122_3344_5566_7788, 0]));
        m.xmms[7] = x64([7, 8]);
        exec(&mut m, &[0x66, 0x0F, 0xD6, 0xFE], "movq xmm6,xmm7");
        assert_eq!(m.xmms[6], x64([7, 0]));
        m.gprs[0] = 0x3000;
        m.xmms[5] = seq(0x30);
        exec(&mut m, &[0x66, 0x0F, 0xD6, 0x28], "movq [rax],xmm5");
        assert_eq!(m.mem(0x3000, 9), [0x30, 0x31, 0x32, 0x33, 0x34, 0x35, 0x36, 0x37, 0xEE]);
    }

    #[test]
    fn movq_rip_relative_load_uses_the_next_instruction_address() {
        let mut m = TestMachine::new();
        // movq xmm4,[rip+0x10]: 8 bytes long, so the operand is at RIP + 8 + 0x10.
        m.poke(RIP as usize + 0x18, &[9, 8, 7, 6, 5, 4, 3, 2, 1]);
        exec(&mut m, &[0xF3, 0x0F, 0x7E, 0x25, 0x10, 0, 0, 0], "movq xmm4,[1018h]");
        assert_eq!(m.xmms[4], [9, 8, 7, 6, 5, 4, 3, 2, 0, 0, 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn moves_of_128_bits_both_ways_without_alignment_checks() {
        // (load opcode, store opcode, prefix, name)
        let forms: [(&[u8], &[u8], &str); 6] = [
            (&[0x66, 0x0F, 0x6F], &[0x66, 0x0F, 0x7F], "movdqa"),
            (&[0xF3, 0x0F, 0x6F], &[0xF3, 0x0F, 0x7F], "movdqu"),
            (&[0x0F, 0x28], &[0x0F, 0x29], "movaps"),
            (&[0x0F, 0x10], &[0x0F, 0x11], "movups"),
            (&[0x66, 0x0F, 0x28], &[0x66, 0x0F, 0x29], "movapd"),
            (&[0x66, 0x0F, 0x10], &[0x66, 0x0F, 0x11], "movupd"),
        ];
        for (load, store, name) in forms {
            let mut m = TestMachine::new();
            m.gprs[0] = 0x2001; // misaligned on purpose
            m.poke(0x2001, &seq(0x60));
            exec(&mut m, &[load, &[0x00]].concat(), &format!("{name} xmm0,[rax]"));
            assert_eq!(m.xmms[0], seq(0x60), "{name} load");
            m.xmms[1] = seq(0x90);
            exec(&mut m, &[store, &[0x08]].concat(), &format!("{name} [rax],xmm1"));
            assert_eq!(m.mem(0x2001, 16), seq(0x90), "{name} store");
            assert_eq!(m.mem(0x2011, 1), [0xEE], "{name} store size");
            exec(&mut m, &[load, &[0xD1]].concat(), &format!("{name} xmm2,xmm1"));
            assert_eq!(m.xmms[2], seq(0x90), "{name} register");
        }
    }

    #[test]
    fn paddb_paddw_paddd_paddq_wrap() {
        assert_eq!(
            binop(0xFC, "paddb", A, B),
            [0x00, 0x00, 0x00, 0x80, 0x11, 0x22, 0x33, 0x44, 0x00, 0x01, 0xFF, 0xFF, 0x11, 0x22, 0x33, 0x44]
        );
        assert_eq!(
            binop(0xFD, "paddw", x16([0xFFFF, 0x8000, 1, 2, 3, 4, 5, 0x7FFF]), x16([1, 0x8000, 0xFFFF, 2, 3, 4, 5, 1])),
            x16([0, 0, 0, 4, 6, 8, 10, 0x8000])
        );
        assert_eq!(
            binop(
                0xFE,
                "paddd",
                x32([0xFFFF_FFFF, 0x8000_0000, 1, 0x1234_5678]),
                x32([1, 0x8000_0000, 2, 0x1111_1111])
            ),
            x32([0, 0, 3, 0x2345_6789])
        );
        assert_eq!(
            binop(0xD4, "paddq", x64([u64::MAX, 0x1_0000_0000]), x64([2, 0xFFFF_FFFF])),
            x64([1, 0x1_FFFF_FFFF])
        );
    }

    #[test]
    fn psubb_psubw_psubd_psubq_wrap() {
        assert_eq!(
            binop(0xF8, "psubb", A, B),
            [0xFE, 0x02, 0x00, 0x7E, 0x0F, 0x1E, 0x2D, 0x3C, 0x00, 0xFB, 0xAB, 0x55, 0xF1, 0xE2, 0xD3, 0xC4]
        );
        assert_eq!(
            binop(0xF9, "psubw", x16([0, 1, 0x8000, 5, 100, 200, 300, 400]), x16([1, 2, 1, 5, 1, 2, 3, 4])),
            x16([0xFFFF, 0xFFFF, 0x7FFF, 0, 99, 198, 297, 396])
        );
        assert_eq!(
            binop(0xFA, "psubd", x32([0, 10, 0x8000_0000, 7]), x32([1, 3, 1, 7])),
            x32([0xFFFF_FFFF, 7, 0x7FFF_FFFF, 0])
        );
        assert_eq!(binop(0xFB, "psubq", x64([0, 100]), x64([1, 1])), x64([u64::MAX, 99]));
    }

    #[test]
    fn pand_pandn_por_pxor() {
        let a = x64([0xFF00_FF00_F0F0_F0F0, 0x1234_5678_9ABC_DEF0]);
        let b = x64([0x0FF0_0FF0_FF00_FF00, 0xFFFF_0000_FFFF_0000]);
        assert_eq!(binop(0xDB, "pand", a, b), x64([0x0F00_0F00_F000_F000, 0x1234_0000_9ABC_0000]));
        assert_eq!(binop(0xDF, "pandn", a, b), x64([0x00F0_00F0_0F00_0F00, 0xEDCB_0000_6543_0000]));
        assert_eq!(binop(0xEB, "por", a, b), x64([0xFFF0_FFF0_FFF0_FFF0, 0xFFFF_5678_FFFF_DEF0]));
        assert_eq!(binop(0xEF, "pxor", a, b), x64([0xF0F0_F0F0_0FF0_0FF0, 0xEDCB_5678_6543_DEF0]));
        let mut m = TestMachine::new();
        exec(&mut m, &[0x66, 0x0F, 0xEF, 0xC0], "pxor xmm0,xmm0");
        assert_eq!(m.xmms[0], [0; 16]);
    }

    #[test]
    fn pshufd_pshuflw_pshufhw() {
        let mut m = TestMachine::new();
        m.xmms[1] = x32([1, 2, 3, 4]);
        exec(&mut m, &[0x66, 0x0F, 0x70, 0xC1, 0x1B], "pshufd xmm0,xmm1,1Bh");
        assert_eq!(m.xmms[0], x32([4, 3, 2, 1]), "0x1B reverses the dwords");
        m.gprs[0] = 0x2000;
        m.poke(0x2000, &x32([0xAABB_CCDD, 2, 3, 4]));
        exec(&mut m, &[0x66, 0x0F, 0x70, 0x10, 0x00], "pshufd xmm2,[rax],0");
        assert_eq!(m.xmms[2], x32([0xAABB_CCDD; 4]), "0 broadcasts dword 0");
        exec(&mut m, &[0x66, 0x0F, 0x70, 0x10, 0x9C], "pshufd xmm2,[rax],9Ch");
        // 0x9C = 10 01 11 00: dwords 0, 3, 1, 2.
        assert_eq!(m.xmms[2], x32([0xAABB_CCDD, 4, 2, 3]));

        m.xmms[1] = x16([1, 2, 3, 4, 5, 6, 7, 8]);
        exec(&mut m, &[0xF2, 0x0F, 0x70, 0xC1, 0x1B], "pshuflw xmm0,xmm1,1Bh");
        assert_eq!(m.xmms[0], x16([4, 3, 2, 1, 5, 6, 7, 8]));
        exec(&mut m, &[0xF3, 0x0F, 0x70, 0xC1, 0x1B], "pshufhw xmm0,xmm1,1Bh");
        assert_eq!(m.xmms[0], x16([1, 2, 3, 4, 8, 7, 6, 5]));
        m.poke(0x2000, &x16([1, 2, 3, 4, 5, 6, 7, 8]));
        exec(&mut m, &[0xF3, 0x0F, 0x70, 0x18, 0x55], "pshufhw xmm3,[rax],55h");
        assert_eq!(m.xmms[3], x16([1, 2, 3, 4, 6, 6, 6, 6]));
        exec(&mut m, &[0xF2, 0x0F, 0x70, 0x18, 0xE4], "pshuflw xmm3,[rax],0E4h");
        assert_eq!(m.xmms[3], x16([1, 2, 3, 4, 5, 6, 7, 8]), "0xE4 is the identity");
    }

    #[test]
    fn punpckl_interleaves_the_low_halves() {
        let (a, b) = (seq(0x00), seq(0x10));
        assert_eq!(
            binop(0x60, "punpcklbw", a, b),
            [0x00, 0x10, 0x01, 0x11, 0x02, 0x12, 0x03, 0x13, 0x04, 0x14, 0x05, 0x15, 0x06, 0x16, 0x07, 0x17]
        );
        assert_eq!(
            binop(0x61, "punpcklwd", a, b),
            [0x00, 0x01, 0x10, 0x11, 0x02, 0x03, 0x12, 0x13, 0x04, 0x05, 0x14, 0x15, 0x06, 0x07, 0x16, 0x17]
        );
        assert_eq!(
            binop(0x62, "punpckldq", a, b),
            [0x00, 0x01, 0x02, 0x03, 0x10, 0x11, 0x12, 0x13, 0x04, 0x05, 0x06, 0x07, 0x14, 0x15, 0x16, 0x17]
        );
        assert_eq!(
            binop(0x6C, "punpcklqdq", a, b),
            [0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17]
        );
    }

    #[test]
    fn punpckh_interleaves_the_high_halves() {
        let (a, b) = (seq(0x00), seq(0x10));
        assert_eq!(
            binop(0x68, "punpckhbw", a, b),
            [0x08, 0x18, 0x09, 0x19, 0x0A, 0x1A, 0x0B, 0x1B, 0x0C, 0x1C, 0x0D, 0x1D, 0x0E, 0x1E, 0x0F, 0x1F]
        );
        assert_eq!(
            binop(0x69, "punpckhwd", a, b),
            [0x08, 0x09, 0x18, 0x19, 0x0A, 0x0B, 0x1A, 0x1B, 0x0C, 0x0D, 0x1C, 0x1D, 0x0E, 0x0F, 0x1E, 0x1F]
        );
        assert_eq!(
            binop(0x6A, "punpckhdq", a, b),
            [0x08, 0x09, 0x0A, 0x0B, 0x18, 0x19, 0x1A, 0x1B, 0x0C, 0x0D, 0x0E, 0x0F, 0x1C, 0x1D, 0x1E, 0x1F]
        );
        assert_eq!(
            binop(0x6D, "punpckhqdq", a, b),
            [0x08, 0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x0E, 0x0F, 0x18, 0x19, 0x1A, 0x1B, 0x1C, 0x1D, 0x1E, 0x1F]
        );
    }

    #[test]
    fn pcmpgt_is_signed() {
        let mut a = [0u8; 16];
        let mut b = [0u8; 16];
        a[..4].copy_from_slice(&[0x01, 0x80, 0x7F, 0xFF]);
        b[..4].copy_from_slice(&[0xFF, 0x01, 0x80, 0x00]);
        let mut want = [0u8; 16];
        want[..4].copy_from_slice(&[0xFF, 0x00, 0xFF, 0x00]);
        assert_eq!(binop(0x64, "pcmpgtb", a, b), want);
        assert_eq!(
            binop(
                0x65,
                "pcmpgtw",
                x16([0x8000, 1, 0x7FFF, 0xFFFF, 0, 0, 0, 0]),
                x16([0x7FFF, 0xFFFF, 0x8000, 0, 0, 0, 0, 0])
            ),
            x16([0, 0xFFFF, 0xFFFF, 0, 0, 0, 0, 0])
        );
        assert_eq!(
            binop(0x66, "pcmpgtd", x32([0x8000_0000, 2, 0xFFFF_FFFF, 5]), x32([0, 1, 0xFFFF_FFFE, 5])),
            x32([0, 0xFFFF_FFFF, 0xFFFF_FFFF, 0])
        );
    }

    #[test]
    fn pcmpeq_bytes_words_dwords() {
        let mut want = [0u8; 16];
        want[2] = 0xFF;
        want[8] = 0xFF;
        assert_eq!(binop(0x74, "pcmpeqb", A, B), want);
        assert_eq!(
            binop(0x75, "pcmpeqw", x16([1, 2, 3, 4, 5, 6, 7, 8]), x16([1, 0, 3, 0, 5, 0, 7, 0])),
            x16([0xFFFF, 0, 0xFFFF, 0, 0xFFFF, 0, 0xFFFF, 0])
        );
        assert_eq!(binop(0x76, "pcmpeqd", x32([1, 2, 3, 4]), x32([1, 2, 0, 4])), x32([!0, !0, 0, !0]));
        let mut m = TestMachine::new();
        exec(&mut m, &[0x66, 0x0F, 0x76, 0xC0], "pcmpeqd xmm0,xmm0");
        assert_eq!(m.xmms[0], [0xFF; 16]);
    }

    /// `op xmm0,imm` with xmm0 = v: 66 0F `opcode` /`ext` ib.
    fn shift_imm(opcode: u8, ext: u8, name: &str, v: Xmm, imm: u8) -> Xmm {
        let mut m = TestMachine::new();
        m.xmms[0] = v;
        exec(&mut m, &[0x66, 0x0F, opcode, 0xC0 | ext << 3, imm], &format!("{name} xmm0,{}", fmt_imm(imm)));
        m.xmms[0]
    }

    fn fmt_imm(imm: u8) -> String {
        // iced's Intel syntax: decimal below 10, else hex with a leading 0 before a letter.
        match format!("{imm:X}h") {
            _ if imm < 10 => imm.to_string(),
            h if h.starts_with(|c: char| c.is_ascii_alphabetic()) => format!("0{h}"),
            h => h,
        }
    }

    #[test]
    fn word_shifts_by_immediate() {
        let w = x16([0x8001, 0x00F0, 0xFFFF, 0x1234, 0, 0, 0, 0x0010]);
        assert_eq!(shift_imm(0x71, 2, "psrlw", w, 4), x16([0x0800, 0x000F, 0x0FFF, 0x0123, 0, 0, 0, 0x0001]));
        assert_eq!(shift_imm(0x71, 4, "psraw", w, 4), x16([0xF800, 0x000F, 0xFFFF, 0x0123, 0, 0, 0, 0x0001]));
        assert_eq!(shift_imm(0x71, 6, "psllw", w, 4), x16([0x0010, 0x0F00, 0xFFF0, 0x2340, 0, 0, 0, 0x0100]));
        assert_eq!(shift_imm(0x71, 6, "psllw", w, 15), x16([0x8000, 0, 0x8000, 0, 0, 0, 0, 0]));
        assert_eq!(shift_imm(0x71, 6, "psllw", w, 16), [0; 16], "count >= 16 clears");
        assert_eq!(shift_imm(0x71, 2, "psrlw", w, 0xFF), [0; 16]);
        assert_eq!(shift_imm(0x71, 4, "psraw", w, 16), x16([0xFFFF, 0, 0xFFFF, 0, 0, 0, 0, 0]), "sign fill");
        assert_eq!(shift_imm(0x71, 4, "psraw", w, 0xC8), x16([0xFFFF, 0, 0xFFFF, 0, 0, 0, 0, 0]));
    }

    #[test]
    fn dword_shifts_by_immediate() {
        let d = x32([0x8000_0001, 0x1234_5678, 0xFFFF_FFFF, 0x100]);
        assert_eq!(shift_imm(0x72, 2, "psrld", d, 8), x32([0x0080_0000, 0x0012_3456, 0x00FF_FFFF, 0x1]));
        assert_eq!(shift_imm(0x72, 4, "psrad", d, 8), x32([0xFF80_0000, 0x0012_3456, 0xFFFF_FFFF, 0x1]));
        assert_eq!(shift_imm(0x72, 6, "pslld", d, 8), x32([0x0000_0100, 0x3456_7800, 0xFFFF_FF00, 0x1_0000]));
        assert_eq!(shift_imm(0x72, 2, "psrld", d, 32), [0; 16]);
        assert_eq!(shift_imm(0x72, 6, "pslld", d, 32), [0; 16]);
        assert_eq!(shift_imm(0x72, 4, "psrad", d, 0xFF), x32([0xFFFF_FFFF, 0, 0xFFFF_FFFF, 0]));
    }

    #[test]
    fn qword_shifts_by_immediate() {
        let q = x64([0x8000_0000_0000_0001, 0x1234_5678_9ABC_DEF0]);
        assert_eq!(shift_imm(0x73, 2, "psrlq", q, 4), x64([0x0800_0000_0000_0000, 0x0123_4567_89AB_CDEF]));
        assert_eq!(shift_imm(0x73, 6, "psllq", q, 4), x64([0x0000_0000_0000_0010, 0x2345_6789_ABCD_EF00]));
        assert_eq!(shift_imm(0x73, 2, "psrlq", q, 63), x64([1, 0]));
        assert_eq!(shift_imm(0x73, 2, "psrlq", q, 64), [0; 16], "psrlq by 64 gives 0");
        assert_eq!(shift_imm(0x73, 6, "psllq", q, 64), [0; 16]);
    }

    #[test]
    fn byte_shifts_psrldq_pslldq() {
        let v = seq(0);
        assert_eq!(shift_imm(0x73, 3, "psrldq", v, 3), [3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 0, 0, 0]);
        assert_eq!(shift_imm(0x73, 7, "pslldq", v, 3), [0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]);
        assert_eq!(shift_imm(0x73, 3, "psrldq", v, 15), [15, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(shift_imm(0x73, 3, "psrldq", v, 16), [0; 16], "count > 15 clears");
        assert_eq!(shift_imm(0x73, 7, "pslldq", v, 0xFF), [0; 16]);
        assert_eq!(shift_imm(0x73, 7, "pslldq", v, 0), v);
    }

    #[test]
    fn shifts_by_xmm_count_use_the_whole_low_qword() {
        let w = x16([0x8001, 0x00F0, 0xFFFF, 0x1234, 0, 0, 0, 0x0010]);
        let d = x32([0x8000_0001, 0x1234_5678, 0xFFFF_FFFF, 0x100]);
        let q = x64([0x8000_0000_0000_0001, 0x1234_5678_9ABC_DEF0]);
        let count = |n: u64| x64([n, 0xFFFF_FFFF_FFFF_FFFF]); // the high qword is ignored
        assert_eq!(binop(0xD1, "psrlw", w, count(4)), x16([0x0800, 0x000F, 0x0FFF, 0x0123, 0, 0, 0, 0x0001]));
        assert_eq!(binop(0xF1, "psllw", w, count(4)), x16([0x0010, 0x0F00, 0xFFF0, 0x2340, 0, 0, 0, 0x0100]));
        assert_eq!(binop(0xE1, "psraw", w, count(4)), x16([0xF800, 0x000F, 0xFFFF, 0x0123, 0, 0, 0, 0x0001]));
        assert_eq!(binop(0xE1, "psraw", w, count(100)), x16([0xFFFF, 0, 0xFFFF, 0, 0, 0, 0, 0]));
        assert_eq!(binop(0xD2, "psrld", d, count(8)), x32([0x0080_0000, 0x0012_3456, 0x00FF_FFFF, 0x1]));
        assert_eq!(binop(0xF2, "pslld", d, count(8)), x32([0x0000_0100, 0x3456_7800, 0xFFFF_FF00, 0x1_0000]));
        assert_eq!(binop(0xE2, "psrad", d, count(8)), x32([0xFF80_0000, 0x0012_3456, 0xFFFF_FFFF, 0x1]));
        assert_eq!(binop(0xE2, "psrad", d, count(1 << 40)), x32([0xFFFF_FFFF, 0, 0xFFFF_FFFF, 0]));
        assert_eq!(binop(0xD3, "psrlq", q, count(4)), x64([0x0800_0000_0000_0000, 0x0123_4567_89AB_CDEF]));
        assert_eq!(binop(0xF3, "psllq", q, count(4)), x64([0x0000_0000_0000_0010, 0x2345_6789_ABCD_EF00]));
        assert_eq!(binop(0xD3, "psrlq", q, count(64)), [0; 16]);
        // A count of 2^32 + 4 is not 4: the whole 64-bit count is compared.
        assert_eq!(binop(0xF3, "psllq", q, count((1 << 32) + 4)), [0; 16]);
        assert_eq!(binop(0xD2, "psrld", d, count(0x104)), [0; 16]);
    }

    #[test]
    fn pinsrw_from_gpr_and_memory() {
        let mut m = TestMachine::new();
        m.xmms[0] = x16([0, 1, 2, 3, 4, 5, 6, 7]);
        m.gprs[0] = 0xABCD_1234;
        exec(&mut m, &[0x66, 0x0F, 0xC4, 0xC0, 0x03], "pinsrw xmm0,eax,3");
        assert_eq!(m.xmms[0], x16([0, 1, 2, 0x1234, 4, 5, 6, 7]));
        m.gprs[0] = 0x2000;
        m.poke(0x2000, &[0xEF, 0xBE, 0xAD, 0xDE]);
        exec(&mut m, &[0x66, 0x0F, 0xC4, 0x00, 0x09], "pinsrw xmm0,[rax],9");
        assert_eq!(m.xmms[0], x16([0, 0xBEEF, 2, 0x1234, 4, 5, 6, 7]), "imm & 7 selects the word");
    }

    #[test]
    fn pextrw_zero_extends() {
        let mut m = TestMachine::new();
        m.xmms[1] = x16([0x1111, 0x2222, 0xF333, 0x4444, 0x5555, 0xA666, 0x7777, 0x8888]);
        exec(&mut m, &[0x66, 0x0F, 0xC5, 0xC1, 0x0A], "pextrw eax,xmm1,0Ah");
        assert_eq!(m.gprs[0], 0xF333, "word 10 & 7 = 2, upper bits of RAX cleared");
        exec(&mut m, &[0x66, 0x44, 0x0F, 0xC5, 0xD9, 0x07], "pextrw r11d,xmm1,7");
        assert_eq!(m.gprs[11], 0x8888);
        // The SSE4.1 form with a memory destination writes 2 bytes.
        m.gprs[0] = 0x2000;
        exec(&mut m, &[0x66, 0x0F, 0x3A, 0x15, 0x08, 0x05], "pextrw [rax],xmm1,5");
        assert_eq!(m.mem(0x2000, 3), [0x66, 0xA6, 0xEE]);
    }

    #[test]
    fn pmovmskb_gathers_byte_sign_bits() {
        let mut m = TestMachine::new();
        m.xmms[1] = A;
        exec(&mut m, &[0x66, 0x0F, 0xD7, 0xC1], "pmovmskb eax,xmm1");
        assert_eq!(m.gprs[0], 0x0A05);
        m.xmms[9] = [0x80; 16];
        exec(&mut m, &[0x66, 0x41, 0x0F, 0xD7, 0xD1], "pmovmskb edx,xmm9");
        assert_eq!(m.gprs[2], 0xFFFF);
    }

    #[test]
    fn pmuludq_pmullw_pmulhuw() {
        assert_eq!(
            binop(0xF4, "pmuludq", x32([0xFFFF_FFFF, 0xDEAD, 3, 0xBEEF]), x32([0xFFFF_FFFF, 1, 5, 2])),
            x64([0xFFFF_FFFE_0000_0001, 15])
        );
        let a = x16([0x8000, 3, 0xFFFF, 0x100, 0, 0, 0, 0x7FFF]);
        let b = x16([2, 4, 0xFFFF, 0x100, 0, 0, 0, 0x7FFF]);
        assert_eq!(binop(0xD5, "pmullw", a, b), x16([0, 12, 1, 0, 0, 0, 0, 1]));
        assert_eq!(binop(0xE4, "pmulhuw", a, b), x16([1, 0, 0xFFFE, 1, 0, 0, 0, 0x3FFF]));
    }

    #[test]
    fn pavgb_pminub_pmaxub_psadbw() {
        let mut a = [0u8; 16];
        let mut b = [0u8; 16];
        a[..5].copy_from_slice(&[0, 1, 0xFF, 0xFE, 10]);
        b[..5].copy_from_slice(&[1, 2, 0xFF, 0xFF, 20]);
        let mut want = [0u8; 16];
        want[..5].copy_from_slice(&[1, 2, 0xFF, 0xFF, 15]);
        assert_eq!(binop(0xE0, "pavgb", a, b), want, "rounds up, no overflow");
        assert_eq!(
            binop(0xDA, "pminub", A, B),
            [0x01, 0x01, 0x80, 0x01, 0x01, 0x02, 0x03, 0x04, 0x00, 0x03, 0x55, 0x55, 0x01, 0x02, 0x03, 0x04]
        );
        assert_eq!(
            binop(0xDE, "pmaxub", A, B),
            [0xFF, 0xFF, 0x80, 0x7F, 0x10, 0x20, 0x30, 0x40, 0x00, 0xFE, 0xAA, 0xAA, 0x10, 0x20, 0x30, 0x40]
        );
        assert_eq!(binop(0xF6, "psadbw", A, B), x64([784, 571]));
    }

    #[test]
    fn packs_saturate() {
        let a = x16([0xFFFF, 0x0100, 0x007F, 0x0080, 0x8000, 0x7FFF, 0, 0x00FF]);
        let b = x16([1, 2, 3, 4, 5, 6, 7, 0xFFF0]);
        assert_eq!(binop(0x67, "packuswb", a, b), [0, 0xFF, 0x7F, 0x80, 0, 0xFF, 0, 0xFF, 1, 2, 3, 4, 5, 6, 7, 0]);
        assert_eq!(
            binop(0x63, "packsswb", a, b),
            [0xFF, 0x7F, 0x7F, 0x7F, 0x80, 0x7F, 0, 0x7F, 1, 2, 3, 4, 5, 6, 7, 0xF0]
        );
        assert_eq!(
            binop(
                0x6B,
                "packssdw",
                x32([0xFFFF_FFFF, 0x0001_0000, 0x8000_0000, 0x7FFF]),
                x32([0xFFFF_8000, 0xFFFF_7FFF, 1, 0x8000])
            ),
            x16([0xFFFF, 0x7FFF, 0x8000, 0x7FFF, 0x8000, 0x8000, 1, 0x7FFF])
        );
    }

    #[test]
    fn addressing_with_rex_sib_displacement_and_32_bit_addresses() {
        let mut m = TestMachine::new();
        m.xmms[9] = x32([1, 2, 3, 4]);
        m.gprs[12] = 0x2000;
        m.gprs[13] = 3;
        // [r12 + r13*8 - 8] = 0x2010
        m.poke(0x2010, &x32([10, 20, 30, 40]));
        exec(&mut m, &[0x66, 0x47, 0x0F, 0xFE, 0x4C, 0xEC, 0xF8], "paddd xmm9,[r12+r13*8-8]");
        assert_eq!(m.xmms[9], x32([11, 22, 33, 44]));
        // A 32-bit address (67 prefix) ignores the upper half of RAX.
        m.gprs[0] = 0xFFFF_FFFF_0000_2010;
        m.xmms[0] = [0; 16];
        exec(&mut m, &[0x67, 0x66, 0x0F, 0xFE, 0x00], "paddd xmm0,[eax]");
        assert_eq!(m.xmms[0], x32([10, 20, 30, 40]));
        // A DS override is harmless in 64-bit mode.
        m.gprs[0] = 0x2010;
        exec(&mut m, &[0x3E, 0x66, 0x0F, 0x6F, 0x18], "movdqa xmm3,[rax]");
        assert_eq!(m.xmms[3], x32([10, 20, 30, 40]));
    }

    /// RFLAGS with every arithmetic flag set (CF PF AF ZF SF OF), bit 1 and IF.
    const ALL_ARITH: u64 = 0x2 | 0x1 | 0x4 | 0x10 | 0x40 | 0x80 | 0x800 | 0x200;

    #[test]
    fn popcnt_counts_bits_and_sets_only_zf() {
        let mut m = TestMachine::new();
        m.gprs[1] = 0xF0F0_0000_0000_0001;
        m.rflags = ALL_ARITH;
        exec(&mut m, &[0xF3, 0x48, 0x0F, 0xB8, 0xC1], "popcnt rax,rcx");
        assert_eq!(m.gprs[0], 9);
        assert_eq!(m.rflags, 0x2 | 0x200, "OF SF ZF AF CF PF cleared, the rest kept");
        exec(&mut m, &[0xF3, 0x0F, 0xB8, 0xC1], "popcnt eax,ecx");
        assert_eq!(m.gprs[0], 1, "the low 32 bits of RCX; the upper half of RAX zeroed");
        m.gprs[2] = 0x5A5A_5A5A_5A5A_0000;
        m.gprs[3] = 0x1234_5678_9ABC_0000;
        exec(&mut m, &[0x66, 0xF3, 0x0F, 0xB8, 0xDA], "popcnt bx,dx");
        assert_eq!(m.gprs[3], 0x1234_5678_9ABC_0000, "a 16-bit destination keeps the other 48 bits");
        assert_eq!(m.rflags & 0x40, 0x40, "ZF: the 16-bit source is 0");
        m.gprs[0] = 0x3000;
        m.poke(0x3000, &0x8000_0000_0000_0003u64.to_le_bytes());
        exec(&mut m, &[0xF3, 0x4C, 0x0F, 0xB8, 0x00], "popcnt r8,[rax]");
        assert_eq!(m.gprs[8], 3);
        assert_eq!(m.rflags & 0x40, 0, "ZF clear for a non-zero source");
    }

    #[test]
    fn clac_and_stac_set_rflags_ac_at_cpl0_only() {
        let mut m = TestMachine::new();
        exec(&mut m, &[0x0F, 0x01, 0xCB], "stac");
        assert_eq!(m.rflags, 0x2 | general::AC);
        exec(&mut m, &[0x0F, 0x01, 0xCA], "clac");
        assert_eq!(m.rflags, 0x2);
        m.cpl = 3;
        assert_eq!(emulate(&[0x0F, 0x01, 0xCB], RIP, &mut m), Err(EmuError::Cpl(3)));
        assert_eq!(m.rflags, 0x2, "nothing written when it faults");
    }

    #[test]
    fn lock_cmpxchg16b_compares_and_swaps_128_bits() {
        let mut m = TestMachine::new();
        m.gprs[7] = 0x3000; // rdi
        m.poke(0x3000, &[1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0]);
        (m.gprs[0], m.gprs[2], m.gprs[3], m.gprs[1]) = (1, 2, 0xB, 0xC); // rax rdx rbx rcx
        exec(&mut m, &[0xF0, 0x48, 0x0F, 0xC7, 0x0F], "lock cmpxchg16b [rdi]");
        assert_eq!(m.mem(0x3000, 16), [0xB, 0, 0, 0, 0, 0, 0, 0, 0xC, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(m.rflags & 0x40, 0x40, "ZF: swapped");
        exec(&mut m, &[0xF0, 0x48, 0x0F, 0xC7, 0x0F], "lock cmpxchg16b [rdi]");
        assert_eq!((m.gprs[0], m.gprs[2]), (0xB, 0xC), "RDX:RAX loaded from memory");
        assert_eq!(m.rflags & 0x40, 0, "ZF clear: not equal");
        m.gprs[7] = 0x3008;
        assert_eq!(emulate(&[0xF0, 0x48, 0x0F, 0xC7, 0x0F], RIP, &mut m), Err(EmuError::Misaligned(0x3008)));
    }

    #[test]
    fn only_sse_instructions_use_the_xmm_registers() {
        assert!(uses_xmm(&[0x66, 0x0F, 0xEF, 0xC1]), "pxor xmm0,xmm1");
        assert!(uses_xmm(&[0x66, 0x0F, 0x7E, 0xC8]), "movd eax,xmm1");
        assert!(!uses_xmm(&[0xF3, 0x48, 0x0F, 0xB8, 0xC1]), "popcnt rax,rcx");
        assert!(!uses_xmm(&[0x0F, 0x01, 0xCB]), "stac");
        assert!(!uses_xmm(&[0xF0, 0x48, 0x0F, 0xC7, 0x0F]), "lock cmpxchg16b [rdi]");
    }

    #[test]
    fn other_locked_instructions_are_never_emulated() {
        let mut m = TestMachine::new();
        let got = emulate(&[0xF0, 0x0F, 0xC1, 0x07], RIP, &mut m);
        assert_eq!(got, Err(EmuError::Unsupported("lock xadd [rdi],eax".into())));
    }

    #[test]
    fn unsupported_instructions_are_named() {
        let mut m = TestMachine::new();
        let before = (m.gprs, m.xmms);
        assert_eq!(
            emulate(&[0xF2, 0x0F, 0x7C, 0xC1], RIP, &mut m),
            Err(EmuError::Unsupported("haddps xmm0,xmm1".into()))
        );
        // MMX forms are not emulated.
        assert_eq!(emulate(&[0x0F, 0x6E, 0xC1], RIP, &mut m), Err(EmuError::Unsupported("movd mm0,ecx".into())));
        // Nor VEX forms.
        assert_eq!(
            emulate(&[0xC5, 0xF9, 0xEF, 0xC1], RIP, &mut m),
            Err(EmuError::Unsupported("vpxor xmm0,xmm0,xmm1".into()))
        );
        assert_eq!(
            emulate(&[0x64, 0x66, 0x0F, 0x6F, 0x00], RIP, &mut m),
            Err(EmuError::Unsupported("movdqa xmm0,fs:[rax]".into())),
            "FS/GS overrides"
        );
        assert_eq!((m.gprs, m.xmms), before);
        let msg = EmuError::Unsupported("haddps xmm0,xmm1".into()).to_string();
        assert!(msg.contains("`haddps xmm0,xmm1`"), "{msg}");
    }

    #[test]
    fn truncated_or_invalid_bytes_do_not_decode() {
        let mut m = TestMachine::new();
        assert_eq!(emulate(&[0x66, 0x0F, 0xEF], RIP, &mut m), Err(EmuError::Decode));
        assert_eq!(emulate(&[], RIP, &mut m), Err(EmuError::Decode));
        assert_eq!(emulate(&[0x0F, 0xFF], RIP, &mut m), Err(EmuError::Decode));
    }

    #[test]
    fn extra_bytes_after_the_instruction_are_ignored() {
        let mut m = TestMachine::new();
        m.xmms[1] = seq(1);
        assert_eq!(emulate(&[0x66, 0x0F, 0xEF, 0xC1, 0x90, 0x90, 0x90], RIP, &mut m), Ok(RIP + 4));
    }

    #[test]
    fn unmapped_memory_fails_without_side_effects() {
        let mut m = TestMachine::new();
        m.gprs[0] = 0xFFFF_8000_0000_0000;
        let before = m.xmms;
        assert_eq!(emulate(&[0x66, 0x0F, 0xFE, 0x00], RIP, &mut m), Err(EmuError::Memory(0xFFFF_8000_0000_0000)));
        assert_eq!(emulate(&[0x66, 0x0F, 0x7F, 0x08], RIP, &mut m), Err(EmuError::Memory(0xFFFF_8000_0000_0000)));
        assert_eq!(m.xmms, before);
        assert!(EmuError::Memory(0x10).to_string().contains("0x10"));
    }

    #[test]
    fn vcpu_machine_maps_registers_and_walks_page_tables() {
        use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 8 << 20)]).unwrap();
        // 4-level paging: PML4 0x1000 -> PDPT 0x2000 -> PD 0x3000 -> PT 0x4000. Linear page
        // 0x40_0000 maps to 0x20_0000 and linear 0x40_1000 to 0x10_0000 (not contiguous).
        mem.write_obj(0x2003u64, GuestAddress(0x1000)).unwrap();
        mem.write_obj(0x3003u64, GuestAddress(0x2000)).unwrap();
        mem.write_obj(0x4003u64, GuestAddress(0x3000 + 2 * 8)).unwrap();
        mem.write_obj(0x20_0003u64, GuestAddress(0x4000)).unwrap();
        mem.write_obj(0x10_0003u64, GuestAddress(0x4008)).unwrap();
        let mode = CpuMode {
            bitness: 64,
            cr0: 1 << 31 | 1,
            cr3: 0x1000,
            cr4: 1 << 5,
            efer: 1 << 10 | 1 << 8,
            ..Default::default()
        };
        let mut regs = kvm_regs { rbx: 0x40_0FF8, r14: 0x1234, ..Default::default() };
        let mut xmm = [[0u8; 16]; 16];
        xmm[3] = seq(0x30);
        mem.write_slice(&seq(0x70)[..8], GuestAddress(0x20_0FF8)).unwrap();
        mem.write_slice(&seq(0x70)[8..], GuestAddress(0x10_0000)).unwrap();
        let mut m = VcpuMachine { regs: &mut regs, xmm: &mut xmm, mxcsr: &mut 0x1F80, mem: &mem, mode };
        // movdqu xmm9,[rbx]: a load across the page boundary.
        assert_eq!(emulate(&[0xF3, 0x44, 0x0F, 0x6F, 0x0B], 0, &mut m), Ok(5));
        assert_eq!(m.xmm[9], seq(0x70));
        // movdqu [rbx],xmm3: a store across it.
        assert_eq!(emulate(&[0xF3, 0x0F, 0x7F, 0x1B], 0, &mut m), Ok(4));
        let mut back = [0u8; 16];
        mem.read_slice(&mut back[..8], GuestAddress(0x20_0FF8)).unwrap();
        mem.read_slice(&mut back[8..], GuestAddress(0x10_0000)).unwrap();
        assert_eq!(back, seq(0x30));
        // movq r14,xmm9 and movd xmm0,r14d.
        let mut m = VcpuMachine { regs: &mut regs, xmm: &mut xmm, mxcsr: &mut 0x1F80, mem: &mem, mode };
        assert_eq!(emulate(&[0x66, 0x4D, 0x0F, 0x7E, 0xCE], 0, &mut m), Ok(5));
        assert_eq!(m.regs.r14, 0x7776_7574_7372_7170);
        assert_eq!(emulate(&[0x66, 0x41, 0x0F, 0x6E, 0xC6], 0, &mut m), Ok(5));
        assert_eq!(m.xmm[0], x32([0x7372_7170, 0, 0, 0]));
        // An unmapped second page fails before anything is written.
        m.regs.rbx = 0x40_1FF8;
        assert_eq!(emulate(&[0xF3, 0x0F, 0x7F, 0x1B], 0, &mut m), Err(EmuError::Memory(0x40_2000)));
        assert_eq!(mem.read_obj::<u64>(GuestAddress(0x10_0FF8)).unwrap(), 0);
    }

    /// Differential tests against the host CPU, which runs SSE2 natively in userspace.
    #[cfg(target_arch = "x86_64")]
    mod versus_host {
        use super::*;
        use core::arch::asm;
        use core::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_storeu_si128};

        fn to_m128(v: Xmm) -> __m128i {
            // SAFETY: an unaligned 16-byte load from a 16-byte array.
            unsafe { _mm_loadu_si128(v.as_ptr().cast()) }
        }
        fn from_m128(v: __m128i) -> Xmm {
            let mut out = [0u8; 16];
            // SAFETY: an unaligned 16-byte store to a 16-byte array.
            unsafe { _mm_storeu_si128(out.as_mut_ptr().cast(), v) };
            out
        }

        /// An instruction on two XMM registers, run on the host.
        type HostOp = fn(Xmm, Xmm) -> Xmm;

        /// `insn a, b` (with an optional immediate) run on the host.
        macro_rules! native {
            ($insn:literal, $a:expr, $b:expr $(, $imm:literal)?) => {{
                let mut a = to_m128($a);
                let b = to_m128($b);
                // SAFETY: an SSE2 instruction on registers only.
                unsafe {
                    asm!(concat!($insn, " {a}, {b}" $(, ", ", stringify!($imm))?), a = inout(xmm_reg) a, b = in(xmm_reg) b,
                         options(pure, nomem, nostack));
                }
                from_m128(a)
            }};
        }

        /// A xorshift generator biased towards the lane values where saturation, sign and
        /// carries matter.
        struct Rng(u64);
        impl Rng {
            fn next(&mut self) -> u64 {
                self.0 ^= self.0 << 13;
                self.0 ^= self.0 >> 7;
                self.0 ^= self.0 << 17;
                self.0
            }
            fn xmm(&mut self) -> Xmm {
                const EDGES: [u8; 6] = [0x00, 0x01, 0x7F, 0x80, 0xFE, 0xFF];
                std::array::from_fn(|_| {
                    let r = self.next();
                    if r & 1 == 0 {
                        EDGES[(r >> 8) as usize % EDGES.len()]
                    } else {
                        (r >> 16) as u8
                    }
                })
            }
        }

        /// Runs `bytes` (an instruction on xmm0 and xmm1) in the emulator with xmm0 = a, xmm1 = b.
        fn emulated(bytes: &[u8], a: Xmm, b: Xmm) -> Xmm {
            let mut m = TestMachine::new();
            m.xmms[0] = a;
            m.xmms[1] = b;
            assert_eq!(emulate(bytes, RIP, &mut m), Ok(RIP + bytes.len() as u64));
            m.xmms[0]
        }

        #[test]
        fn two_operand_instructions_match_the_host() {
            let table: [(u8, HostOp); 46] = [
                (0xFC, |a, b| native!("paddb", a, b)),
                (0xFD, |a, b| native!("paddw", a, b)),
                (0xFE, |a, b| native!("paddd", a, b)),
                (0xD4, |a, b| native!("paddq", a, b)),
                (0xF8, |a, b| native!("psubb", a, b)),
                (0xF9, |a, b| native!("psubw", a, b)),
                (0xFA, |a, b| native!("psubd", a, b)),
                (0xFB, |a, b| native!("psubq", a, b)),
                (0xDB, |a, b| native!("pand", a, b)),
                (0xDF, |a, b| native!("pandn", a, b)),
                (0xEB, |a, b| native!("por", a, b)),
                (0xEF, |a, b| native!("pxor", a, b)),
                (0x60, |a, b| native!("punpcklbw", a, b)),
                (0x61, |a, b| native!("punpcklwd", a, b)),
                (0x62, |a, b| native!("punpckldq", a, b)),
                (0x6C, |a, b| native!("punpcklqdq", a, b)),
                (0x68, |a, b| native!("punpckhbw", a, b)),
                (0x69, |a, b| native!("punpckhwd", a, b)),
                (0x6A, |a, b| native!("punpckhdq", a, b)),
                (0x6D, |a, b| native!("punpckhqdq", a, b)),
                (0x64, |a, b| native!("pcmpgtb", a, b)),
                (0x65, |a, b| native!("pcmpgtw", a, b)),
                (0x66, |a, b| native!("pcmpgtd", a, b)),
                (0x74, |a, b| native!("pcmpeqb", a, b)),
                (0x75, |a, b| native!("pcmpeqw", a, b)),
                (0x76, |a, b| native!("pcmpeqd", a, b)),
                (0xF4, |a, b| native!("pmuludq", a, b)),
                (0xD5, |a, b| native!("pmullw", a, b)),
                (0xE4, |a, b| native!("pmulhuw", a, b)),
                (0xE0, |a, b| native!("pavgb", a, b)),
                (0xDA, |a, b| native!("pminub", a, b)),
                (0xDE, |a, b| native!("pmaxub", a, b)),
                (0xF6, |a, b| native!("psadbw", a, b)),
                (0x67, |a, b| native!("packuswb", a, b)),
                (0x63, |a, b| native!("packsswb", a, b)),
                (0x6B, |a, b| native!("packssdw", a, b)),
                (0xD1, |a, b| native!("psrlw", a, b)),
                (0xD2, |a, b| native!("psrld", a, b)),
                (0xD3, |a, b| native!("psrlq", a, b)),
                (0xF1, |a, b| native!("psllw", a, b)),
                (0xF2, |a, b| native!("pslld", a, b)),
                (0xF3, |a, b| native!("psllq", a, b)),
                (0xE1, |a, b| native!("psraw", a, b)),
                (0xE2, |a, b| native!("psrad", a, b)),
                (0x6F, |_, b| native!("movdqa", b, b)),
                (0x70, |a, b| native!("pshufd", a, b, 0x4E)),
            ];
            let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
            for (opcode, host) in table {
                let bytes: Vec<u8> = match opcode {
                    0x70 => vec![0x66, 0x0F, 0x70, 0xC1, 0x4E],
                    _ => vec![0x66, 0x0F, opcode, 0xC1],
                };
                for _ in 0..500 {
                    let (a, mut b) = (rng.xmm(), rng.xmm());
                    if matches!(opcode, 0xD1 | 0xD2 | 0xD3 | 0xF1 | 0xF2 | 0xF3 | 0xE1 | 0xE2) && rng.next() & 3 != 0 {
                        // Mostly in-range shift counts, with random upper qwords.
                        b[..8].copy_from_slice(&(rng.next() % 70).to_le_bytes());
                    }
                    assert_eq!(emulated(&bytes, a, b), host(a, b), "66 0f {opcode:02x} c1 on a={a:02x?} b={b:02x?}");
                }
            }
        }

        /// `op xmm0, imm` for several immediates: emulated versus host.
        macro_rules! imm_forms {
            ($rng:expr, $insn:literal, $opcode:literal, $ext:literal, [$($imm:literal),*]) => {$(
                for _ in 0..50 {
                    let a = $rng.xmm();
                    let bytes = [0x66, 0x0F, $opcode, 0xC0 | ($ext << 3), $imm];
                    let mut m = TestMachine::new();
                    m.xmms[0] = a;
                    assert_eq!(emulate(&bytes, RIP, &mut m), Ok(RIP + 5));
                    let mut x = to_m128(a);
                    // SAFETY: an SSE2 instruction on a register only.
                    unsafe {
                        asm!(concat!($insn, " {x}, ", stringify!($imm)), x = inout(xmm_reg) x, options(pure, nomem, nostack));
                    }
                    assert_eq!(m.xmms[0], from_m128(x), "{} xmm0,{} on {a:02x?}", $insn, $imm);
                }
            )*};
        }

        /// `op xmm0, xmm1, imm` shuffles for several immediates: emulated versus host.
        macro_rules! shuffles {
            ($rng:expr, $insn:literal, $prefix:literal, [$($imm:literal),*]) => {$(
                for _ in 0..50 {
                    let (a, b) = ($rng.xmm(), $rng.xmm());
                    assert_eq!(
                        emulated(&[$prefix, 0x0F, 0x70, 0xC1, $imm], a, b),
                        native!($insn, a, b, $imm),
                        "{} xmm0,xmm1,{}", $insn, $imm
                    );
                }
            )*};
        }

        #[test]
        fn immediate_forms_match_the_host() {
            let mut rng = Rng(0x0123_4567_89AB_CDEF);
            imm_forms!(rng, "psrlw", 0x71, 2, [0, 1, 7, 15, 16, 255]);
            imm_forms!(rng, "psraw", 0x71, 4, [0, 1, 7, 15, 16, 255]);
            imm_forms!(rng, "psllw", 0x71, 6, [0, 1, 7, 15, 16, 255]);
            imm_forms!(rng, "psrld", 0x72, 2, [0, 1, 17, 31, 32, 255]);
            imm_forms!(rng, "psrad", 0x72, 4, [0, 1, 17, 31, 32, 255]);
            imm_forms!(rng, "pslld", 0x72, 6, [0, 1, 17, 31, 32, 255]);
            imm_forms!(rng, "psrlq", 0x73, 2, [0, 1, 33, 63, 64, 255]);
            imm_forms!(rng, "psllq", 0x73, 6, [0, 1, 33, 63, 64, 255]);
            imm_forms!(rng, "psrldq", 0x73, 3, [0, 1, 5, 15, 16, 255]);
            imm_forms!(rng, "pslldq", 0x73, 7, [0, 1, 5, 15, 16, 255]);
            shuffles!(rng, "pshufd", 0x66, [0x00, 0x1B, 0x4E, 0xB1, 0xE4, 0xFF]);
            shuffles!(rng, "pshuflw", 0xF2, [0x00, 0x1B, 0x4E, 0xB1, 0xE4, 0xFF]);
            shuffles!(rng, "pshufhw", 0xF3, [0x00, 0x1B, 0x4E, 0xB1, 0xE4, 0xFF]);
        }

        #[test]
        fn pmovmskb_pextrw_pinsrw_match_the_host() {
            let mut rng = Rng(0xDEAD_BEEF_CAFE_F00D);
            for _ in 0..200 {
                let (a, r) = (rng.xmm(), rng.next());
                let mut m = TestMachine::new();
                m.xmms[1] = a;
                m.gprs[2] = r;
                emulate(&[0x66, 0x0F, 0xD7, 0xC1], RIP, &mut m).unwrap(); // pmovmskb eax,xmm1
                emulate(&[0x66, 0x0F, 0xC5, 0xD9, 0x05], RIP, &mut m).unwrap(); // pextrw ebx,xmm1,5
                emulate(&[0x66, 0x0F, 0xC4, 0xCA, 0x06], RIP, &mut m).unwrap(); // pinsrw xmm1,edx,6
                let (mask, word): (u64, u64);
                let mut x = to_m128(a);
                // SAFETY: SSE2 instructions on registers only.
                unsafe {
                    asm!("pmovmskb {m:e}, {x}", "pextrw {w:e}, {x}, 5", "pinsrw {x}, {r:e}, 6",
                         x = inout(xmm_reg) x, m = out(reg) mask, w = out(reg) word, r = in(reg) r,
                         options(pure, nomem, nostack));
                }
                assert_eq!((m.gprs[0], m.gprs[3], m.xmms[1]), (mask, word, from_m128(x)), "{a:02x?} {r:#x}");
            }
        }
    }

    fn f64s(a: f64, b: f64) -> Xmm {
        x64([a.to_bits(), b.to_bits()])
    }
    fn f32s(v: [f32; 4]) -> Xmm {
        x32(v.map(f32::to_bits))
    }

    #[test]
    fn fp_arithmetic_is_the_processors() {
        let mut m = TestMachine::new();
        m.xmms[0] = f64s(1.5, 7.0);
        m.xmms[1] = f64s(2.25, -1.0);
        exec(&mut m, &[0xF2, 0x0F, 0x58, 0xC1], "addsd xmm0,xmm1");
        assert_eq!(m.xmms[0], f64s(3.75, 7.0), "scalar: the upper lane is kept");
        exec(&mut m, &[0x66, 0x0F, 0x59, 0xC1], "mulpd xmm0,xmm1");
        assert_eq!(m.xmms[0], f64s(3.75 * 2.25, -7.0));
        m.xmms[2] = f32s([4.0, 9.0, 2.0, 0.25]);
        assert_eq!(m.mxcsr, 0x1F80, "exact results raise nothing");
        exec(&mut m, &[0x0F, 0x51, 0xDA], "sqrtps xmm3,xmm2");
        assert_eq!(m.xmms[3], f32s([2.0, 3.0, 2.0f32.sqrt(), 0.5]));
        assert_eq!(m.mxcsr, 0x1F80 | 0x20, "the square root of 2 is inexact: PE");
        m.mxcsr = 0x1F80;
        m.xmms[4] = f32s([1.0, 5.0, -3.0, 8.0]);
        exec(&mut m, &[0x0F, 0x5D, 0xE2], "minps xmm4,xmm2");
        assert_eq!(m.xmms[4], f32s([1.0, 5.0, -3.0, 0.25]));
        // A memory operand: 8 bytes for a scalar double.
        m.gprs[0] = 0x2000;
        m.poke(0x2000, &0.5f64.to_bits().to_le_bytes());
        m.xmms[5] = f64s(10.0, 1.0);
        exec(&mut m, &[0xF2, 0x0F, 0x5E, 0x28], "divsd xmm5,[rax]");
        assert_eq!(m.xmms[5], f64s(20.0, 1.0));
        assert_eq!(m.mxcsr, 0x1F80, "exact results raise nothing");
    }

    #[test]
    fn fp_arithmetic_follows_mxcsr() {
        let third = |mxcsr: u32| {
            let mut m = TestMachine::new();
            m.mxcsr = mxcsr;
            m.xmms[0] = f32s([1.0, 0.0, 0.0, 0.0]);
            m.xmms[1] = f32s([3.0, 0.0, 0.0, 0.0]);
            exec(&mut m, &[0xF3, 0x0F, 0x5E, 0xC1], "divss xmm0,xmm1");
            (f32::from_bits(x32_lanes(m.xmms[0])[0]), m.mxcsr)
        };
        let (nearest, flags) = third(0x1F80);
        assert_eq!((nearest, flags), (1.0f32 / 3.0, 0x1F80 | 0x20), "round to nearest, PE set");
        let (down, _) = third(0x1F80 | 1 << 13);
        assert!(down < nearest, "RC = toward negative infinity");
        // Division by zero with ZM clear: #XM, which emon does not emulate; nothing changes.
        let mut m = TestMachine::new();
        m.mxcsr = 0x1F80 & !(1 << 9);
        m.xmms[0] = f64s(1.0, 0.0);
        m.xmms[1] = f64s(0.0, 0.0);
        assert_eq!(emulate(&[0xF2, 0x0F, 0x5E, 0xC1], RIP, &mut m), Err(EmuError::SimdException(0x4)));
        assert_eq!((m.xmms[0], m.mxcsr), (f64s(1.0, 0.0), 0x1F80 & !(1 << 9)));
        // Masked, it gives infinity and sets ZE (sticky).
        m.mxcsr = 0x1F80;
        emulate(&[0xF2, 0x0F, 0x5E, 0xC1], RIP, &mut m).unwrap();
        assert_eq!((f64::from_bits(x64_lanes(m.xmms[0])[0]), m.mxcsr), (f64::INFINITY, 0x1F84));
        assert!(uses_xmm(&[0xF2, 0x0F, 0x5E, 0xC1]), "the caller must fetch XMM and MXCSR");
    }

    fn x32_lanes(v: Xmm) -> [u32; 4] {
        std::array::from_fn(|i| u32::from_le_bytes([v[4 * i], v[4 * i + 1], v[4 * i + 2], v[4 * i + 3]]))
    }
    fn x64_lanes(v: Xmm) -> [u64; 2] {
        std::array::from_fn(|i| u64::from_le_bytes(v[8 * i..8 * i + 8].try_into().unwrap()))
    }
}
