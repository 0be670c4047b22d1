//! General-purpose and system instructions that kvm_pvm's in-kernel emulator lacks although
//! CPUID shows their features to the guest (README, "Linux guests"): POPCNT, and SMAP's CLAC and
//! STAC.
use super::{Cpu, EmuError, Machine};
use iced_x86::{Code, Register};

/// RFLAGS bits (SDM Vol. 1, 3.4.3 "EFLAGS Register").
const CF: u64 = 1 << 0;
const PF: u64 = 1 << 2;
const AF: u64 = 1 << 4;
const ZF: u64 = 1 << 6;
const SF: u64 = 1 << 7;
const OF: u64 = 1 << 11;
/// RFLAGS.AC: with CR4.SMAP, supervisor accesses to user pages are allowed while it is set.
pub const AC: u64 = 1 << 18;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Op {
    /// POPCNT r, r/m (16, 32 or 64 bits).
    Popcnt,
    /// CLAC (false) and STAC (true): RFLAGS.AC.
    SetAc(bool),
    /// (LOCK) CMPXCHG16B m128: one vCPU, so emon's read-compare-write is atomic.
    Cmpxchg16b,
}

impl Op {
    pub(super) fn for_code(code: Code) -> Option<Op> {
        Some(match code {
            Code::Popcnt_r16_rm16 | Code::Popcnt_r32_rm32 | Code::Popcnt_r64_rm64 => Op::Popcnt,
            Code::Clac => Op::SetAc(false),
            Code::Stac => Op::SetAc(true),
            Code::Cmpxchg16b_m128 => Op::Cmpxchg16b,
            _ => return None,
        })
    }
}

impl<M: Machine> Cpu<'_, M> {
    pub(super) fn execute_general(&mut self, op: Op) -> Result<(), EmuError> {
        match op {
            // SDM Vol. 2B, POPCNT: ZF = (source = 0); OF, SF, AF, CF, PF cleared.
            Op::Popcnt => {
                let src = u64::from_le_bytes(self.load(1)?[..8].try_into().expect("8 bytes"));
                let reg = self.insn.op0_register();
                let full = reg.full_register();
                let count = u64::from(src.count_ones());
                let value = match reg.size() {
                    // A 16-bit destination keeps the register's other bits.
                    2 => (self.m.gpr(full) & !0xFFFF) | count,
                    _ => count,
                };
                self.m.set_gpr(full, value);
                let flags = self.m.rflags() & !(OF | SF | ZF | AF | CF | PF);
                self.m.set_rflags(if src == 0 { flags | ZF } else { flags });
                Ok(())
            }
            // SDM Vol. 2A, CMPXCHG8B/CMPXCHG16B: RDX:RAX against m128; equal: ZF = 1 and m128 =
            // RCX:RBX; else ZF = 0 and RDX:RAX = m128. A misaligned operand raises #GP.
            Op::Cmpxchg16b => {
                let la = self.address(0);
                if la % 16 != 0 {
                    return Err(EmuError::Misaligned(la));
                }
                let mut m = [0u8; 16];
                self.m.read_mem(la, &mut m)?;
                let (lo, hi) = (
                    u64::from_le_bytes(m[..8].try_into().expect("8")),
                    u64::from_le_bytes(m[8..].try_into().expect("8")),
                );
                let (rax, rdx) = (self.m.gpr(Register::RAX), self.m.gpr(Register::RDX));
                let flags = self.m.rflags() & !ZF;
                if (lo, hi) == (rax, rdx) {
                    let mut new = [0u8; 16];
                    new[..8].copy_from_slice(&self.m.gpr(Register::RBX).to_le_bytes());
                    new[8..].copy_from_slice(&self.m.gpr(Register::RCX).to_le_bytes());
                    self.m.write_mem(la, &new)?;
                    self.m.set_rflags(flags | ZF);
                } else {
                    self.m.set_gpr(Register::RAX, lo);
                    self.m.set_gpr(Register::RDX, hi);
                    self.m.set_rflags(flags);
                }
                Ok(())
            }
            // SDM Vol. 2A, CLAC / Vol. 2B, STAC: #UD if CPL > 0.
            Op::SetAc(set) => {
                if self.m.cpl() != 0 {
                    return Err(EmuError::Cpl(self.m.cpl()));
                }
                let flags = self.m.rflags();
                self.m.set_rflags(if set { flags | AC } else { flags & !AC });
                Ok(())
            }
        }
    }
}
