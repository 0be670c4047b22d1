//! SSE/SSE2 floating-point arithmetic (legacy F3/F2/66 0F 51-5F encodings): ADD, SUB, MUL,
//! DIV, MIN, MAX and SQRT, scalar and packed, single and double precision. The host runs the same
//! instruction under the guest's MXCSR (rounding, DAZ, FTZ), with every exception masked, so the
//! result and the flags are the processor's (SDM Vol. 1 11.5 "SSE, SSE2 and SSE3 Exceptions");
//! an exception the guest leaves unmasked (#XM) is not emulated.
use super::{Cpu, EmuError, Machine, Xmm};
use core::arch::asm;
use iced_x86::Code;

/// What an instruction computes: its host form, and whether it is scalar (the destination's
/// upper lanes are kept) with its lane width.
#[derive(Debug, Clone, Copy)]
pub(super) struct Op {
    run: HostOp,
    /// Scalar: the bytes of the low lane it computes (4 or 8); packed: 16.
    bytes: usize,
}

/// The host's run of an instruction: destination, source, MXCSR -> result, exception flags raised.
type HostOp = fn(Xmm, Xmm, u32) -> (Xmm, u32);

/// MXCSR: the exception flags (bits 5:0) and masks (bits 12:7).
const FLAGS: u32 = 0x3F;
const MASKS: u32 = 0x3F << 7;

/// `insn xmm0, xmm1` on the host under MXCSR `mxcsr` (all exceptions masked, flags cleared):
/// xmm0's result and the flags it raised. The host's own MXCSR is restored.
macro_rules! host {
    ($insn:literal) => {{
        fn run(a: Xmm, b: Xmm, mxcsr: u32) -> (Xmm, u32) {
            let mut out = a;
            let mut csr = (mxcsr | MASKS) & !FLAGS;
            let mut saved = 0u32;
            // SAFETY: loads and stores 16 bytes of `out` and `b` and the two MXCSR words; xmm0 and
            // xmm1 are declared clobbered; the host's MXCSR is put back before the block ends.
            unsafe {
                asm!(
                    "stmxcsr [{saved}]",
                    "ldmxcsr [{csr}]",
                    "movups xmm0, [{a}]",
                    "movups xmm1, [{b}]",
                    concat!($insn, " xmm0, xmm1"),
                    "movups [{a}], xmm0",
                    "stmxcsr [{csr}]",
                    "ldmxcsr [{saved}]",
                    saved = in(reg) &mut saved,
                    csr = in(reg) &mut csr,
                    a = in(reg) &mut out,
                    b = in(reg) &b,
                    out("xmm0") _,
                    out("xmm1") _,
                    options(nostack),
                );
            }
            (out, csr & FLAGS)
        }
        run
    }};
}

impl Op {
    pub(super) fn for_code(code: Code) -> Option<Op> {
        use Code::*;
        let (run, bytes): (HostOp, usize) = match code {
            Addss_xmm_xmmm32 => (host!("addss"), 4),
            Addsd_xmm_xmmm64 => (host!("addsd"), 8),
            Addps_xmm_xmmm128 => (host!("addps"), 16),
            Addpd_xmm_xmmm128 => (host!("addpd"), 16),
            Subss_xmm_xmmm32 => (host!("subss"), 4),
            Subsd_xmm_xmmm64 => (host!("subsd"), 8),
            Subps_xmm_xmmm128 => (host!("subps"), 16),
            Subpd_xmm_xmmm128 => (host!("subpd"), 16),
            Mulss_xmm_xmmm32 => (host!("mulss"), 4),
            Mulsd_xmm_xmmm64 => (host!("mulsd"), 8),
            Mulps_xmm_xmmm128 => (host!("mulps"), 16),
            Mulpd_xmm_xmmm128 => (host!("mulpd"), 16),
            Divss_xmm_xmmm32 => (host!("divss"), 4),
            Divsd_xmm_xmmm64 => (host!("divsd"), 8),
            Divps_xmm_xmmm128 => (host!("divps"), 16),
            Divpd_xmm_xmmm128 => (host!("divpd"), 16),
            Minss_xmm_xmmm32 => (host!("minss"), 4),
            Minsd_xmm_xmmm64 => (host!("minsd"), 8),
            Minps_xmm_xmmm128 => (host!("minps"), 16),
            Minpd_xmm_xmmm128 => (host!("minpd"), 16),
            Maxss_xmm_xmmm32 => (host!("maxss"), 4),
            Maxsd_xmm_xmmm64 => (host!("maxsd"), 8),
            Maxps_xmm_xmmm128 => (host!("maxps"), 16),
            Maxpd_xmm_xmmm128 => (host!("maxpd"), 16),
            Sqrtss_xmm_xmmm32 => (host!("sqrtss"), 4),
            Sqrtsd_xmm_xmmm64 => (host!("sqrtsd"), 8),
            Sqrtps_xmm_xmmm128 => (host!("sqrtps"), 16),
            Sqrtpd_xmm_xmmm128 => (host!("sqrtpd"), 16),
            _ => return None,
        };
        Some(Op { run, bytes })
    }
}

impl<M: Machine> Cpu<'_, M> {
    pub(super) fn execute_fp(&mut self, op: Op) -> Result<(), EmuError> {
        let (dst, src) = (self.load(0)?, self.load(1)?);
        let mxcsr = self.m.mxcsr();
        let (result, raised) = (op.run)(dst, src, mxcsr);
        // An exception the guest has not masked would be #XM (or #UD without CR4.OSXMMEXCPT),
        // with the destination unchanged (SDM Vol. 1 11.5.1).
        let unmasked = raised & !(mxcsr >> 7) & FLAGS;
        if unmasked != 0 {
            return Err(EmuError::SimdException(unmasked));
        }
        // The host computed the whole register from the destination's upper lanes, which a
        // scalar operation keeps: the result is the guest's register as it must be.
        debug_assert!(op.bytes == 16 || result[op.bytes..] == dst[op.bytes..]);
        self.store(0, &result)?;
        self.m.set_mxcsr(mxcsr | raised);
        Ok(())
    }
}
