//! SSE2 integer instructions (legacy 66/F3/F2 0F encodings, XMM register or memory operands):
//! what an instruction does to its lanes, independent of its operand forms.
use super::{Cpu, EmuError, Machine, Xmm};
use iced_x86::{Code, OpKind};

/// What an instruction does, independent of its operand forms.
#[derive(Debug, Clone, Copy)]
pub(super) enum Op {
    /// 128-bit copy (movdqa, movups, ...), either direction.
    Mov128,
    /// movd and movq, all forms: the low `width` bytes of the source, zero-extended to the
    /// destination (an XMM register's upper bytes are zeroed, a 32-bit GPR write zero-extends).
    MovLow(usize),
    /// dest = f(dest, src), lane-wise over `width`-byte lanes.
    Lanes(usize, fn(u64, u64, usize) -> u64),
    /// dest = f(dest, src) over the whole register.
    Whole(fn(&Xmm, &Xmm) -> Xmm),
    /// Shift by a count (imm8 or the low qword of xmm/m128) of `width`-byte lanes.
    Shift(usize, ShiftKind),
    /// Byte shift of the whole register by imm8 (psrldq, pslldq); `true` = left.
    ByteShift(bool),
    /// pshufd, pshuflw, pshufhw: dest = f(src, imm8).
    Shuffle(fn(&Xmm, u8) -> Xmm),
    Pinsrw,
    Pextrw,
    Pmovmskb,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ShiftKind {
    Left,
    Right,
    Arithmetic,
}

impl Op {
    pub(super) fn for_code(code: Code) -> Option<Op> {
        use Code::*;
        use Op::*;
        Some(match code {
            Movdqa_xmm_xmmm128 | Movdqa_xmmm128_xmm | Movdqu_xmm_xmmm128 | Movdqu_xmmm128_xmm | Movaps_xmm_xmmm128
            | Movaps_xmmm128_xmm | Movups_xmm_xmmm128 | Movups_xmmm128_xmm | Movapd_xmm_xmmm128
            | Movapd_xmmm128_xmm | Movupd_xmm_xmmm128 | Movupd_xmmm128_xmm => Mov128,
            Movd_xmm_rm32 | Movd_rm32_xmm => MovLow(4),
            Movq_xmm_rm64 | Movq_rm64_xmm | Movq_xmm_xmmm64 | Movq_xmmm64_xmm => MovLow(8),

            Paddb_xmm_xmmm128 => Lanes(1, |a, b, _| a.wrapping_add(b)),
            Paddw_xmm_xmmm128 => Lanes(2, |a, b, _| a.wrapping_add(b)),
            Paddd_xmm_xmmm128 => Lanes(4, |a, b, _| a.wrapping_add(b)),
            Paddq_xmm_xmmm128 => Lanes(8, |a, b, _| a.wrapping_add(b)),
            Psubb_xmm_xmmm128 => Lanes(1, |a, b, _| a.wrapping_sub(b)),
            Psubw_xmm_xmmm128 => Lanes(2, |a, b, _| a.wrapping_sub(b)),
            Psubd_xmm_xmmm128 => Lanes(4, |a, b, _| a.wrapping_sub(b)),
            Psubq_xmm_xmmm128 => Lanes(8, |a, b, _| a.wrapping_sub(b)),
            Pand_xmm_xmmm128 => Lanes(8, |a, b, _| a & b),
            Pandn_xmm_xmmm128 => Lanes(8, |a, b, _| !a & b),
            Por_xmm_xmmm128 => Lanes(8, |a, b, _| a | b),
            Pxor_xmm_xmmm128 => Lanes(8, |a, b, _| a ^ b),
            Pcmpeqb_xmm_xmmm128 => Lanes(1, cmpeq),
            Pcmpeqw_xmm_xmmm128 => Lanes(2, cmpeq),
            Pcmpeqd_xmm_xmmm128 => Lanes(4, cmpeq),
            Pcmpgtb_xmm_xmmm128 => Lanes(1, cmpgt),
            Pcmpgtw_xmm_xmmm128 => Lanes(2, cmpgt),
            Pcmpgtd_xmm_xmmm128 => Lanes(4, cmpgt),
            // The low 16 bits of the product are the same signed or unsigned.
            Pmullw_xmm_xmmm128 => Lanes(2, |a, b, _| a.wrapping_mul(b)),
            Pmulhuw_xmm_xmmm128 => Lanes(2, |a, b, _| (a * b) >> 16),
            // Each qword lane: the product of the low (even) dwords.
            Pmuludq_xmm_xmmm128 => Lanes(8, |a, b, _| (a & 0xFFFF_FFFF) * (b & 0xFFFF_FFFF)),
            Pavgb_xmm_xmmm128 => Lanes(1, |a, b, _| (a + b + 1) >> 1),
            Pminub_xmm_xmmm128 => Lanes(1, |a, b, _| a.min(b)),
            Pmaxub_xmm_xmmm128 => Lanes(1, |a, b, _| a.max(b)),
            Psadbw_xmm_xmmm128 => Whole(psadbw),
            Punpcklbw_xmm_xmmm128 => Whole(|a, b| unpack(a, b, 1, false)),
            Punpcklwd_xmm_xmmm128 => Whole(|a, b| unpack(a, b, 2, false)),
            Punpckldq_xmm_xmmm128 => Whole(|a, b| unpack(a, b, 4, false)),
            Punpcklqdq_xmm_xmmm128 => Whole(|a, b| unpack(a, b, 8, false)),
            Punpckhbw_xmm_xmmm128 => Whole(|a, b| unpack(a, b, 1, true)),
            Punpckhwd_xmm_xmmm128 => Whole(|a, b| unpack(a, b, 2, true)),
            Punpckhdq_xmm_xmmm128 => Whole(|a, b| unpack(a, b, 4, true)),
            Punpckhqdq_xmm_xmmm128 => Whole(|a, b| unpack(a, b, 8, true)),
            Packsswb_xmm_xmmm128 => Whole(|a, b| pack(a, b, 2, -0x80, 0x7F)),
            Packuswb_xmm_xmmm128 => Whole(|a, b| pack(a, b, 2, 0, 0xFF)),
            Packssdw_xmm_xmmm128 => Whole(|a, b| pack(a, b, 4, -0x8000, 0x7FFF)),

            Psrlw_xmm_imm8 | Psrlw_xmm_xmmm128 => Shift(2, ShiftKind::Right),
            Psrld_xmm_imm8 | Psrld_xmm_xmmm128 => Shift(4, ShiftKind::Right),
            Psrlq_xmm_imm8 | Psrlq_xmm_xmmm128 => Shift(8, ShiftKind::Right),
            Psllw_xmm_imm8 | Psllw_xmm_xmmm128 => Shift(2, ShiftKind::Left),
            Pslld_xmm_imm8 | Pslld_xmm_xmmm128 => Shift(4, ShiftKind::Left),
            Psllq_xmm_imm8 | Psllq_xmm_xmmm128 => Shift(8, ShiftKind::Left),
            Psraw_xmm_imm8 | Psraw_xmm_xmmm128 => Shift(2, ShiftKind::Arithmetic),
            Psrad_xmm_imm8 | Psrad_xmm_xmmm128 => Shift(4, ShiftKind::Arithmetic),
            Psrldq_xmm_imm8 => ByteShift(false),
            Pslldq_xmm_imm8 => ByteShift(true),

            Pshufd_xmm_xmmm128_imm8 => Shuffle(pshufd),
            Pshuflw_xmm_xmmm128_imm8 => Shuffle(|s, imm| pshufw4(s, imm, 0)),
            Pshufhw_xmm_xmmm128_imm8 => Shuffle(|s, imm| pshufw4(s, imm, 4)),
            Pinsrw_xmm_r32m16_imm8 | Pinsrw_xmm_r64m16_imm8 => Pinsrw,
            Pextrw_r32_xmm_imm8 | Pextrw_r64_xmm_imm8 | Pextrw_r32m16_xmm_imm8 | Pextrw_r64m16_xmm_imm8 => Pextrw,
            Pmovmskb_r32_xmm | Pmovmskb_r64_xmm => Pmovmskb,
            _ => return None,
        })
    }
}

/// Lane `i` of `width` bytes, zero-extended.
pub(super) fn lane(v: &Xmm, width: usize, i: usize) -> u64 {
    let mut b = [0u8; 8];
    b[..width].copy_from_slice(&v[i * width..(i + 1) * width]);
    u64::from_le_bytes(b)
}

/// Sets lane `i` of `width` bytes to the low bytes of `x`.
pub(super) fn set_lane(v: &mut Xmm, width: usize, i: usize, x: u64) {
    v[i * width..(i + 1) * width].copy_from_slice(&x.to_le_bytes()[..width]);
}

/// A `width`-byte lane value, sign-extended.
fn signed(x: u64, width: usize) -> i64 {
    let unused = 64 - 8 * width as u32;
    ((x << unused) as i64) >> unused
}

fn cmpeq(a: u64, b: u64, _width: usize) -> u64 {
    if a == b {
        u64::MAX
    } else {
        0
    }
}

fn cmpgt(a: u64, b: u64, width: usize) -> u64 {
    if signed(a, width) > signed(b, width) {
        u64::MAX
    } else {
        0
    }
}

fn psadbw(a: &Xmm, b: &Xmm) -> Xmm {
    let mut out = [0u8; 16];
    for half in 0..2 {
        let sum: u64 = (0..8).map(|i| a[half * 8 + i].abs_diff(b[half * 8 + i]) as u64).sum();
        set_lane(&mut out, 8, half, sum);
    }
    out
}

/// punpckl*/punpckh*: interleaves the low (or high) halves' `width`-byte lanes, dest first.
fn unpack(a: &Xmm, b: &Xmm, width: usize, high: bool) -> Xmm {
    let n = 16 / width / 2;
    let first = if high { n } else { 0 };
    let mut out = [0u8; 16];
    for i in 0..n {
        set_lane(&mut out, width, 2 * i, lane(a, width, first + i));
        set_lane(&mut out, width, 2 * i + 1, lane(b, width, first + i));
    }
    out
}

/// pack*: the signed `width`-byte lanes of dest then src, saturated to [lo, hi], in lanes half as wide.
fn pack(a: &Xmm, b: &Xmm, width: usize, lo: i64, hi: i64) -> Xmm {
    let n = 16 / width;
    let mut out = [0u8; 16];
    for (k, src) in [a, b].into_iter().enumerate() {
        for i in 0..n {
            let x = signed(lane(src, width, i), width).clamp(lo, hi);
            set_lane(&mut out, width / 2, k * n + i, x as u64);
        }
    }
    out
}

fn pshufd(s: &Xmm, imm: u8) -> Xmm {
    let mut out = [0u8; 16];
    for i in 0..4 {
        set_lane(&mut out, 4, i, lane(s, 4, (imm as usize >> (2 * i)) & 3));
    }
    out
}

/// pshuflw (`base` 0) and pshufhw (`base` 4): shuffles the four words from `base`; the other
/// qword is copied from the source.
fn pshufw4(s: &Xmm, imm: u8, base: usize) -> Xmm {
    let mut out = *s;
    for i in 0..4 {
        set_lane(&mut out, 2, base + i, lane(s, 2, base + ((imm as usize >> (2 * i)) & 3)));
    }
    out
}

fn shift(v: &Xmm, width: usize, kind: ShiftKind, count: u64) -> Xmm {
    let bits = 8 * width as u64;
    let mut out = [0u8; 16];
    for i in 0..16 / width {
        let x = lane(v, width, i);
        let r = match kind {
            _ if count >= bits && kind != ShiftKind::Arithmetic => 0,
            ShiftKind::Left => x << count,
            ShiftKind::Right => x >> count,
            ShiftKind::Arithmetic => (signed(x, width) >> count.min(bits - 1)) as u64,
        };
        set_lane(&mut out, width, i, r);
    }
    out
}

/// `x` in the low qword, the rest zero.
fn scalar(x: u64) -> Xmm {
    let mut out = [0u8; 16];
    set_lane(&mut out, 8, 0, x);
    out
}

fn byte_shift(v: &Xmm, left: bool, count: u8) -> Xmm {
    let n = count.min(16) as usize;
    let mut out = [0u8; 16];
    if left {
        out[n..].copy_from_slice(&v[..16 - n]);
    } else {
        out[..16 - n].copy_from_slice(&v[n..]);
    }
    out
}

impl<M: Machine> Cpu<'_, M> {
    pub(super) fn execute_sse(&mut self, op: Op) -> Result<(), EmuError> {
        match op {
            Op::Mov128 => {
                let v = self.load(1)?;
                self.store(0, &v)
            }
            Op::MovLow(width) => {
                let v = self.load(1)?;
                self.store(0, &scalar(lane(&v, width, 0)))
            }
            Op::Lanes(width, f) => {
                let (a, b) = (self.load(0)?, self.load(1)?);
                let mut out = [0u8; 16];
                for i in 0..16 / width {
                    set_lane(&mut out, width, i, f(lane(&a, width, i), lane(&b, width, i), width));
                }
                self.store(0, &out)
            }
            Op::Whole(f) => {
                let (a, b) = (self.load(0)?, self.load(1)?);
                self.store(0, &f(&a, &b))
            }
            Op::Shift(width, kind) => {
                let count = match self.insn.op1_kind() {
                    OpKind::Immediate8 => self.insn.immediate8() as u64,
                    _ => lane(&self.load(1)?, 8, 0),
                };
                let v = shift(&self.load(0)?, width, kind, count);
                self.store(0, &v)
            }
            Op::ByteShift(left) => {
                let v = byte_shift(&self.load(0)?, left, self.insn.immediate8());
                self.store(0, &v)
            }
            Op::Shuffle(f) => {
                let v = f(&self.load(1)?, self.insn.immediate8());
                self.store(0, &v)
            }
            Op::Pinsrw => {
                let mut v = self.load(0)?;
                let w = lane(&self.load(1)?, 2, 0);
                set_lane(&mut v, 2, (self.insn.immediate8() & 7) as usize, w);
                self.store(0, &v)
            }
            Op::Pextrw => {
                let w = lane(&self.load(1)?, 2, (self.insn.immediate8() & 7) as usize);
                self.store(0, &scalar(w))
            }
            Op::Pmovmskb => {
                let v = self.load(1)?;
                let mask = v.iter().enumerate().fold(0u64, |acc, (i, b)| acc | ((*b as u64 >> 7) << i));
                self.store(0, &scalar(mask))
            }
        }
    }
}
