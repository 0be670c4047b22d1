//! XSAVE, XSAVEOPT, XSAVEC and XRSTOR, completed by emon: QEMU's TCG lacks XSAVEC, the compacted
//! form and every state component beyond SSE (it would drop AVX's upper halves without a word),
//! and this host's KVM does not emulate them at CPL0 (it raises #UD), although this host shows
//! the guest AVX and XSAVEC whatever emon's CPUID table says. emon moves every component the
//! host's leaf 0DH describes, between guest memory and the vCPU's XSAVE image
//! (`emon_x86::fpu`).
use super::{Completed, CpuState, TcgError};
use emon_x86::access;
use emon_x86::arch::{CR0_TS, CR4_OSXSAVE, GP_VECTOR, NM_VECTOR, PF_VECTOR, UD_VECTOR};
use emon_x86::fpu::{self, Form, Layout, XsaveFault, AREA};
use emon_x86::mode::{Access, CpuMode};

/// RFLAGS.AC: with CR4.SMAP, supervisor-mode data accesses to user pages are allowed (STAC).
const RFLAGS_AC: u64 = 1 << 18;
use iced_x86::{Decoder, DecoderOptions, Mnemonic};
use std::sync::OnceLock;
use vm_memory::GuestMemoryMmap;

/// The host's layout of the state components (KVM's XSAVE image uses it).
fn layout() -> &'static Layout {
    static LAYOUT: OnceLock<Layout> = OnceLock::new();
    LAYOUT.get_or_init(Layout::host)
}

/// Completes the XSAVE-family instruction at `state`'s RIP, if that is what is there (with the
/// vCPU's whole x87/SSE/XSAVE state in `state`); `None` for any other instruction.
pub fn complete(mem: &GuestMemoryMmap, state: &CpuState) -> Result<Option<Completed>, TcgError> {
    let (Some(f), mode) = (&state.fpu, CpuMode::from_sregs(&state.sregs)) else { return Ok(None) };
    let rip = state.regs.rip;
    let bytes = mode.fetch(mem, rip);
    let i = Decoder::with_ip(mode.bitness, &bytes, rip, DecoderOptions::NONE).decode();
    use Mnemonic::*;
    let (save, rex_w) = match i.mnemonic() {
        Xsave | Xsaveopt => (Some(Form::Standard), false),
        Xsave64 | Xsaveopt64 => (Some(Form::Standard), true),
        Xsavec => (Some(Form::Compacted), false),
        Xsavec64 => (Some(Form::Compacted), true),
        Xrstor => (None, false),
        Xrstor64 => (None, true),
        _ => return Ok(None),
    };
    let fault = |vector: u32| Ok(Some(Completed::Fault { vector }));
    // SDM Vol. 1, 13.7-13.10: #UD without CR4.OSXSAVE, #NM with CR0.TS, #GP unaligned.
    if state.sregs.cr4 & CR4_OSXSAVE == 0 {
        return fault(u32::from(UD_VECTOR));
    }
    if state.sregs.cr0 & CR0_TS != 0 {
        return fault(u32::from(NM_VECTOR));
    }
    let (fs, gs) = (state.sregs.fs.base, state.sregs.gs.base);
    let Some(ea) = access::operand_address(&i, |r| access::gpr(&state.regs, r), fs, gs) else {
        return Ok(None);
    };
    if ea % 64 != 0 {
        return fault(u32::from(GP_VECTOR));
    }
    let rfbm = (state.regs.rdx << 32 | state.regs.rax & 0xFFFF_FFFF) & f.xcr0;
    // The legacy region and the header, then the rest of the area they say it spans.
    // A page fault names the first byte the instruction cannot reach (which byte of the area
    // the CPU touches first is not architectural); the area is written for a save.
    let ac = state.regs.rflags & RFLAGS_AC != 0;
    let kind = if save.is_some() { Access::Write } else { Access::Read };
    let page_fault = |len: usize| match mode.span_page_fault(mem, ea, len as u64, kind, ac) {
        Some((error_code, cr2)) => Ok(Some(Completed::PageFault { error_code, cr2 })),
        None => fault(u32::from(PF_VECTOR)),
    };
    let mut area = vec![0u8; AREA];
    if mode.read_linear(mem, ea, &mut area).is_none() || mode.span_page_fault(mem, ea, AREA as u64, kind, ac).is_some()
    {
        return page_fault(AREA);
    }
    let size = match save {
        Some(form) => layout().size(form, rfbm),
        None if fpu::compacted(&area) => layout().size(Form::Compacted, fpu::xcomp_bv(&area)),
        None => layout().size(Form::Standard, rfbm),
    };
    area.resize(size, 0);
    if mode.read_linear(mem, ea + AREA as u64, &mut area[AREA..]).is_none()
        || mode.span_page_fault(mem, ea, size as u64, kind, ac).is_some()
    {
        return page_fault(size);
    }
    let mut after = state.clone();
    let done = match save {
        Some(form) => f
            .xsave(form, rfbm, rex_w, layout(), &mut area)
            .and_then(|()| mode.write_linear(mem, ea, &area).ok_or(XsaveFault::Gp)),
        None => f.xrstor(rfbm, rex_w, layout(), &area).map(|g| after.fpu = Some(g)),
    };
    match done {
        Ok(()) => {
            after.regs.rip = rip + i.len() as u64;
            Ok(Some(Completed::Retired(after)))
        }
        Err(XsaveFault::Gp) => fault(u32::from(GP_VECTOR)),
        Err(XsaveFault::Unsupported) => {
            Err(TcgError::Unsupported("XSAVE/XRSTOR of a state component this host's CPUID leaf 0DH does not describe"))
        }
    }
}
