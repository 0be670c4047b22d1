//! The guest's x87/SSE state as KVM keeps it: an XSAVE image, read and written with
//! KVM_GET_XSAVE / KVM_SET_XSAVE (their XSAVE2 forms when the image is larger than 4 KiB), and
//! XCR0 with KVM_GET_XCRS / KVM_SET_XCRS.
//!
//! Why not KVM_GET_FPU / KVM_SET_FPU: those copy the legacy FXSAVE region of the kernel's XSAVE
//! buffer and never look at the header's XSTATE_BV. When the guest's SSE state is in its initial
//! configuration at the kernel's last XSAVES, XSTATE_BV[1] is 0 and the processor does not write
//! the XMM fields (SDM Vol. 1, 13.6 "Processor Tracking of XSAVE-Managed State", the init
//! optimization). Then KVM_GET_FPU returns stale bytes, and what KVM_SET_FPU writes is discarded
//! by the next XRSTOR(S), which loads the initial configuration for every component whose
//! XSTATE_BV bit is 0 (SDM Vol. 1, 13.8.1 "Standard Form of XRSTOR"). The XSAVE ioctls go through
//! the kernel's user-ABI conversion, which honours XSTATE_BV both ways ([`Fpu::from_xsave`],
//! [`Fpu::to_xsave`]). Without XSAVE there is no XSTATE_BV, and the FPU ioctls are the whole
//! state.
use emon_x86::fpu::{Fpu, LEGACY};
use kvm_bindings::{kvm_fpu, kvm_xcr, kvm_xcrs, kvm_xsave, Xsave};
use kvm_ioctls::{Cap, VcpuFd, VmFd};

/// How this KVM hands out the guest's extended state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XsaveAbi {
    /// KVM_GET_XSAVE2 / KVM_SET_XSAVE2 with an image of this many bytes (more than 4 KiB).
    Xsave2(usize),
    /// KVM_GET_XSAVE / KVM_SET_XSAVE (a 4 KiB image).
    Xsave,
}

impl XsaveAbi {
    /// What this VM supports: the legacy 4 KiB ioctls unless KVM_CAP_XSAVE2 reports a larger
    /// image; `None` without XSAVE.
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

/// A vCPU's XSAVE image as KVM gave it.
enum Image {
    Legacy(Box<kvm_xsave>),
    Xsave2(Xsave),
}

impl Image {
    fn get(fd: &VcpuFd, abi: XsaveAbi) -> Result<Image, kvm_ioctls::Error> {
        Ok(match abi {
            XsaveAbi::Xsave => Image::Legacy(Box::new(fd.get_xsave()?)),
            XsaveAbi::Xsave2(size) => {
                let entry = std::mem::size_of::<u32>();
                let fam = (size - std::mem::size_of::<kvm_xsave>()).div_ceil(entry);
                let mut x = Xsave::new(fam).map_err(|_| kvm_ioctls::Error::new(libc::ENOMEM))?;
                // SAFETY: `x` holds `size` bytes or more, the size KVM_CAP_XSAVE2 reported for this VM.
                unsafe { fd.get_xsave2(&mut x)? };
                Image::Xsave2(x)
            }
        })
    }

    fn set(&self, fd: &VcpuFd) -> Result<(), kvm_ioctls::Error> {
        match self {
            // SAFETY: the image came from KVM_GET_XSAVE on this vCPU and only its x87/SSE fields
            // and XSTATE_BV[1:0] were changed, so it is a valid image for this VM's XCR0.
            Image::Legacy(x) => unsafe { fd.set_xsave(x) },
            // SAFETY: as above, with KVM_GET_XSAVE2 and the image size it needs.
            Image::Xsave2(x) => unsafe { fd.set_xsave2(x) },
        }
    }

    /// The image's fixed 4 KiB (the legacy region and the header are at its start).
    fn bytes(&mut self) -> &mut [u8] {
        let region: &mut [u32; 1024] = match self {
            Image::Legacy(x) => &mut x.region,
            // SAFETY: the header's length is not changed, only words of the fixed region.
            Image::Xsave2(x) => unsafe { &mut x.as_mut_fam_struct().xsave.region },
        };
        // SAFETY: a [u32; 1024] is 4096 initialised bytes, and u8 has no alignment requirement.
        unsafe { std::slice::from_raw_parts_mut(region.as_mut_ptr().cast::<u8>(), 4096) }
    }
}

/// XCR0, the only extended control register (KVM_GET_XCRS).
fn xcr0(fd: &VcpuFd) -> Result<u64, kvm_ioctls::Error> {
    let x = fd.get_xcrs()?;
    Ok(x.xcrs[..x.nr_xcrs as usize].iter().find(|x| x.xcr == 0).map_or(1, |x| x.value))
}

/// The vCPU's x87/SSE state and XCR0 (see the module documentation).
pub fn get(fd: &VcpuFd, abi: Option<XsaveAbi>) -> Result<Fpu, kvm_ioctls::Error> {
    match abi {
        Some(abi) => Ok(Fpu::from_xsave(Image::get(fd, abi)?.bytes(), xcr0(fd)?)),
        None => Ok(Fpu::legacy_only(Box::new(legacy_of(&fd.get_fpu()?)), 1)),
    }
}

/// Writes `f` into the vCPU (and XCR0 where it changed).
pub fn set(fd: &VcpuFd, abi: Option<XsaveAbi>, f: &Fpu) -> Result<(), kvm_ioctls::Error> {
    match abi {
        Some(abi) => {
            if xcr0(fd)? != f.xcr0 {
                let mut x = kvm_xcrs { nr_xcrs: 1, ..Default::default() };
                x.xcrs[0] = kvm_xcr { xcr: 0, value: f.xcr0, ..Default::default() };
                fd.set_xcrs(&x)?;
            }
            let mut image = Image::get(fd, abi)?;
            f.to_xsave(image.bytes());
            image.set(fd)
        }
        None => fd.set_fpu(&fpu_of(&f.legacy)),
    }
}

/// The legacy region of KVM's FPU state (SDM Vol. 1, Table 10-2; 64-bit layout).
fn legacy_of(f: &kvm_fpu) -> [u8; LEGACY] {
    let mut l = [0u8; LEGACY];
    l[0..2].copy_from_slice(&f.fcw.to_le_bytes());
    l[2..4].copy_from_slice(&f.fsw.to_le_bytes());
    l[4] = f.ftwx;
    l[6..8].copy_from_slice(&f.last_opcode.to_le_bytes());
    l[8..16].copy_from_slice(&f.last_ip.to_le_bytes());
    l[16..24].copy_from_slice(&f.last_dp.to_le_bytes());
    l[24..28].copy_from_slice(&f.mxcsr.to_le_bytes());
    for (i, st) in f.fpr.iter().enumerate() {
        l[32 + 16 * i..48 + 16 * i].copy_from_slice(st);
    }
    for (i, x) in f.xmm.iter().enumerate() {
        l[160 + 16 * i..176 + 16 * i].copy_from_slice(x);
    }
    l
}

fn fpu_of(l: &[u8; LEGACY]) -> kvm_fpu {
    let word = |r: std::ops::Range<usize>| u16::from_le_bytes(l[r].try_into().expect("2 bytes"));
    let quad = |r: std::ops::Range<usize>| u64::from_le_bytes(l[r].try_into().expect("8 bytes"));
    let mut f = kvm_fpu {
        fcw: word(0..2),
        fsw: word(2..4),
        ftwx: l[4],
        last_opcode: word(6..8),
        last_ip: quad(8..16),
        last_dp: quad(16..24),
        mxcsr: u32::from_le_bytes(l[24..28].try_into().expect("4 bytes")),
        ..Default::default()
    };
    for (i, st) in f.fpr.iter_mut().enumerate() {
        st.copy_from_slice(&l[32 + 16 * i..48 + 16 * i]);
    }
    for (i, x) in f.xmm.iter_mut().enumerate() {
        x.copy_from_slice(&l[160 + 16 * i..176 + 16 * i]);
    }
    f
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_fpu_ioctls_layout_round_trips() {
        let mut l = [0u8; super::LEGACY];
        for (i, b) in l[..416].iter_mut().enumerate() {
            *b = i as u8;
        }
        // Bytes KVM_GET_FPU has no field for: FTW's reserved byte, FCS/FDS halves and
        // MXCSR_MASK (28-31), and the ST registers' padding.
        let back = super::legacy_of(&super::fpu_of(&l));
        for (i, (a, b)) in l[..416].iter().zip(&back[..416]).enumerate() {
            let padding = i == 5 || (28..32).contains(&i) || (32..160).contains(&i) && (i - 32) % 16 >= 10;
            if !padding {
                assert_eq!(a, b, "byte {i}");
            }
        }
    }
}
