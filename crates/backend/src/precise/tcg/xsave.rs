//! XSAVEC and the compacted form of XRSTOR, which QEMU's TCG lacks (it raises #UD for XSAVEC and
//! #GP for a compacted area) although this host shows the guest XSAVEC whatever emon's CPUID table
//! says, and Linux uses both once it sees it. emon completes them itself for x87 and SSE state
//! (`emon_x86::fpu`), the only components of an XCR0 the engine can run with.
use super::{Completed, CpuState, TcgError};
use emon_x86::access;
use emon_x86::arch::{CR0_TS, CR4_OSXSAVE, GP_VECTOR, UD_VECTOR};
use emon_x86::fpu::{self, XsaveFault, AREA};
use emon_x86::mode::CpuMode;
use iced_x86::{Decoder, DecoderOptions, Mnemonic};
use vm_memory::GuestMemoryMmap;

/// #NM, the device-not-available exception.
const NM_VECTOR: u32 = 7;
/// #PF.
const PF_VECTOR: u32 = 14;

/// Completes the XSAVEC or compacted XRSTOR at `state`'s RIP, if that is what is there (with
/// the x87/SSE state in `state`); `None` for any other instruction (a standard-form XRSTOR runs
/// in the engine).
pub fn complete(mem: &GuestMemoryMmap, state: &CpuState) -> Result<Option<Completed>, TcgError> {
    let (Some(f), mode) = (&state.fpu, CpuMode::from_sregs(&state.sregs)) else { return Ok(None) };
    let rip = state.regs.rip;
    let bytes = mode.fetch(mem, rip);
    let i = Decoder::with_ip(mode.bitness, &bytes, rip, DecoderOptions::NONE).decode();
    let (save, rex_w) = match i.mnemonic() {
        Mnemonic::Xsavec => (true, false),
        Mnemonic::Xsavec64 => (true, true),
        Mnemonic::Xrstor => (false, false),
        Mnemonic::Xrstor64 => (false, true),
        _ => return Ok(None),
    };
    let fault = |vector: u8| Ok(Some(Completed::Fault { vector: u32::from(vector) }));
    // SDM Vol. 1, 13.10 and 13.8: #UD without CR4.OSXSAVE, #NM with CR0.TS, #GP unaligned.
    if state.sregs.cr4 & CR4_OSXSAVE == 0 {
        return fault(UD_VECTOR);
    }
    if state.sregs.cr0 & CR0_TS != 0 {
        return Ok(Some(Completed::Fault { vector: NM_VECTOR }));
    }
    let (fs, gs) = (state.sregs.fs.base, state.sregs.gs.base);
    let Some(ea) = access::data_accesses(&i, |r| access::gpr(&state.regs, r), fs, gs)
        .ok()
        .and_then(|a| a.first().map(|a| a.linear))
    else {
        return Ok(None);
    };
    if ea % 64 != 0 {
        return fault(GP_VECTOR);
    }
    let mut area = vec![0u8; AREA];
    if mode.read_linear(mem, ea, &mut area).is_none() {
        return Ok(Some(Completed::Fault { vector: PF_VECTOR }));
    }
    if !save && !fpu::compacted(&area) {
        return Ok(None);
    }
    let rfbm = (state.regs.rdx << 32 | state.regs.rax & 0xFFFF_FFFF) & f.xcr0;
    let mut after = state.clone();
    let done = if save {
        f.xsavec(rfbm, rex_w, &mut area).and_then(|()| mode.write_linear(mem, ea, &area).ok_or(XsaveFault::Gp))
    } else {
        f.xrstor_compacted(rfbm, rex_w, &area).map(|g| after.fpu = Some(g))
    };
    match done {
        Ok(()) => {
            after.regs.rip = rip + i.len() as u64;
            Ok(Some(Completed::Retired(after)))
        }
        Err(XsaveFault::Gp) => fault(GP_VECTOR),
        Err(XsaveFault::Unsupported) => {
            Err(TcgError::Unsupported("XSAVEC/XRSTOR of state components beyond x87 and SSE"))
        }
    }
}
