//! The guest's SSE registers as KVM keeps them: an XSAVE image, read and written with
//! KVM_GET_XSAVE / KVM_SET_XSAVE (their XSAVE2 forms when the image is larger than 4 KiB).
//!
//! Why not KVM_GET_FPU / KVM_SET_FPU: those copy the legacy FXSAVE region of the kernel's XSAVE
//! buffer and never look at the header's XSTATE_BV. When the guest's SSE state is in its initial
//! configuration at the kernel's last XSAVES, XSTATE_BV[1] is 0 and the processor does not write
//! the XMM fields (SDM Vol. 1, 13.6 "Processor Tracking of XSAVE-Managed State", the init
//! optimization). Then KVM_GET_FPU returns stale bytes, and what KVM_SET_FPU writes is discarded
//! by the next XRSTOR(S), which loads the initial configuration for every component whose
//! XSTATE_BV bit is 0 (SDM Vol. 1, 13.8.1 "Standard Form of XRSTOR"). The XSAVE ioctls go through
//! the kernel's user-ABI conversion, which honours XSTATE_BV both ways; writing XMM registers here
//! sets XSTATE_BV[1].
use kvm_bindings::{kvm_xsave, Xsave};
use kvm_ioctls::{Cap, VcpuFd, VmFd};

/// XMM0-15 in the standard-format XSAVE image: bytes 160-415 of the legacy region (SDM Vol. 1,
/// Table 13-1 / 10-2), in 32-bit words.
const XMM_WORD: usize = 160 / 4;
/// MXCSR, bytes 24-27 of the legacy region (SDM Vol. 1, Table 10-2): saved and restored with the
/// SSE or AVX component, whatever XSTATE_BV says of the XMM registers (SDM Vol. 1, 13.7, 13.8).
const MXCSR_WORD: usize = 24 / 4;
/// XSTATE_BV, bytes 512-519: the XSAVE header's first field (SDM Vol. 1, 13.4.2).
const XSTATE_BV_WORD: usize = 512 / 4;
/// XSTATE_BV bit 1: state component 1, SSE (XMM registers and MXCSR).
const XSTATE_SSE: u32 = 1 << 1;

pub use emon_x86::emulator::Xmm16 as Xmm;

/// How this KVM hands out the guest's extended state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XsaveAbi {
    /// KVM_GET_XSAVE2 / KVM_SET_XSAVE2 with an image of this many bytes (more than 4 KiB).
    Xsave2(usize),
    /// KVM_GET_XSAVE / KVM_SET_XSAVE (a 4 KiB image).
    Xsave,
}

impl XsaveAbi {
    /// What this VM supports: the legacy 4 KiB ioctls unless KVM_CAP_XSAVE2 reports a larger image.
    pub fn probe(vm: &VmFd) -> Option<XsaveAbi> {
        if !vm.check_extension(Cap::Xsave) {
            return None;
        }
        let size = vm.check_extension_int(Cap::Xsave2);
        Some(if size as usize > std::mem::size_of::<kvm_xsave>() {
            XsaveAbi::Xsave2(size as usize)
        } else {
            XsaveAbi::Xsave
        })
    }
}

/// A vCPU's XSAVE image, taken with [`SseState::get`] and written back with [`SseState::set`].
pub struct SseState {
    image: Image,
}

enum Image {
    Legacy(Box<kvm_xsave>),
    Xsave2(Xsave),
}

impl SseState {
    pub fn get(fd: &VcpuFd, abi: XsaveAbi) -> Result<SseState, kvm_ioctls::Error> {
        let image = match abi {
            XsaveAbi::Xsave => Image::Legacy(Box::new(fd.get_xsave()?)),
            XsaveAbi::Xsave2(size) => {
                let entry = std::mem::size_of::<u32>();
                let fam = (size - std::mem::size_of::<kvm_xsave>()).div_ceil(entry);
                let mut x = Xsave::new(fam).map_err(|_| kvm_ioctls::Error::new(libc::ENOMEM))?;
                // SAFETY: `x` holds `size` bytes or more, the size KVM_CAP_XSAVE2 reported for this VM.
                unsafe { fd.get_xsave2(&mut x)? };
                Image::Xsave2(x)
            }
        };
        Ok(SseState { image })
    }

    pub fn set(&self, fd: &VcpuFd) -> Result<(), kvm_ioctls::Error> {
        match &self.image {
            // SAFETY: the image came from KVM_GET_XSAVE on this vCPU and only its XMM fields and
            // XSTATE_BV[1] were changed, so it is a valid image for this VM's XCR0.
            Image::Legacy(x) => unsafe { fd.set_xsave(x) },
            // SAFETY: as above, with KVM_GET_XSAVE2 and the image size it needs.
            Image::Xsave2(x) => unsafe { fd.set_xsave2(x) },
        }
    }

    fn region(&self) -> &[u32; 1024] {
        match &self.image {
            Image::Legacy(x) => &x.region,
            Image::Xsave2(x) => &x.as_fam_struct_ref().xsave.region,
        }
    }

    fn region_mut(&mut self) -> &mut [u32; 1024] {
        match &mut self.image {
            Image::Legacy(x) => &mut x.region,
            // SAFETY: the header's length is not changed, only words of the fixed region.
            Image::Xsave2(x) => unsafe { &mut x.as_mut_fam_struct().xsave.region },
        }
    }

    pub fn xmm(&self) -> Xmm {
        xmm_of(self.region())
    }

    pub fn set_xmm(&mut self, xmm: &Xmm) {
        put_xmm(self.region_mut(), xmm);
    }

    pub fn mxcsr(&self) -> u32 {
        self.region()[MXCSR_WORD]
    }

    /// Sets MXCSR; the SSE component is marked in use by [`SseState::set_xmm`], which the
    /// emulator's callers always write back with it.
    pub fn set_mxcsr(&mut self, mxcsr: u32) {
        self.region_mut()[MXCSR_WORD] = mxcsr;
    }
}

/// XMM0-15 of a standard-format XSAVE image. Where XSTATE_BV[1] is 0 the registers are in their
/// initial configuration, all zero, whatever the image's XMM fields hold.
pub fn xmm_of(region: &[u32; 1024]) -> Xmm {
    let mut xmm = [[0u8; 16]; 16];
    if region[XSTATE_BV_WORD] & XSTATE_SSE == 0 {
        return xmm;
    }
    for (i, reg) in xmm.iter_mut().enumerate() {
        for (k, word) in reg.chunks_exact_mut(4).enumerate() {
            word.copy_from_slice(&region[XMM_WORD + i * 4 + k].to_le_bytes());
        }
    }
    xmm
}

/// Writes XMM0-15 into a standard-format XSAVE image and marks the SSE component in use, so that
/// XRSTOR loads them (MXCSR, in the same component, keeps its field's value).
pub fn put_xmm(region: &mut [u32; 1024], xmm: &Xmm) {
    for (i, reg) in xmm.iter().enumerate() {
        for (k, word) in reg.chunks_exact(4).enumerate() {
            region[XMM_WORD + i * 4 + k] = u32::from_le_bytes(word.try_into().expect("4-byte chunk"));
        }
    }
    region[XSTATE_BV_WORD] |= XSTATE_SSE;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern() -> Xmm {
        let mut x = [[0u8; 16]; 16];
        for (i, r) in x.iter_mut().enumerate() {
            for (j, b) in r.iter_mut().enumerate() {
                *b = (i * 16 + j) as u8;
            }
        }
        x
    }

    #[test]
    fn sse_in_its_initial_configuration_reads_as_zero_whatever_the_fields_hold() {
        let mut region = [0u32; 1024];
        // Stale XMM fields, as XSAVES leaves them when it skips a component in its initial state.
        for w in &mut region[XMM_WORD..XMM_WORD + 64] {
            *w = 0x2020_2020;
        }
        assert_eq!(xmm_of(&region), [[0u8; 16]; 16]);
        region[XSTATE_BV_WORD] = XSTATE_SSE;
        assert_eq!(xmm_of(&region), [[0x20u8; 16]; 16]);
    }

    #[test]
    fn writing_xmm_marks_the_sse_component_in_use_and_keeps_the_rest() {
        let mut region = [0u32; 1024];
        region[XSTATE_BV_WORD] = 0b101; // x87 and AVX in use, SSE initial
        region[MXCSR_WORD] = 0x1F80;
        region[XSTATE_BV_WORD + 1] = 0xAA; // XSTATE_BV[63:32]
        put_xmm(&mut region, &pattern());
        assert_eq!(region[XSTATE_BV_WORD], 0b111);
        assert_eq!(region[XSTATE_BV_WORD + 1], 0xAA);
        assert_eq!(region[MXCSR_WORD], 0x1F80);
        assert_eq!(xmm_of(&region), pattern());
        // XMM0's bytes 0-3 are at byte offset 160, little-endian.
        assert_eq!(region[XMM_WORD], 0x0302_0100);
        assert_eq!(region[XMM_WORD + 63], 0xFFFE_FDFC);
    }
}
