//! The x87, MMX and SSE state as the processor saves it: the 512-byte legacy region that FXSAVE
//! writes and that begins every XSAVE image (SDM Vol. 1, 10.5.1 "FXSAVE Area", Table 10-2), and
//! XCR0. A VMM reads it from KVM's XSAVE image and an emulator loads it with FXRSTOR.

/// The legacy region's size.
pub const LEGACY: usize = 512;
/// Bytes of the legacy region that hold state (FCW through XMM15); 416-511 are reserved or
/// available to software, and FXRSTOR ignores them.
const STATE: std::ops::Range<usize> = 0..416;
/// MXCSR_MASK (bytes 28-31): what the processor supports in MXCSR, not state.
const MXCSR_MASK: std::ops::Range<usize> = 28..32;
/// The XSAVE header's XSTATE_BV (bytes 512-519 of an XSAVE image, SDM Vol. 1, 13.4.2).
const XSTATE_BV: std::ops::Range<usize> = 512..520;
/// XSTATE_BV bits 0 (x87) and 1 (SSE).
const X87: u64 = 1;
const SSE: u64 = 2;
/// FCW at power-on and after FNINIT: every exception masked, 64-bit precision, round to nearest.
const FCW_INIT: u16 = 0x037F;

/// The x87/MMX/SSE state, XCR0, and the state components beyond them (AVX and the rest).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fpu {
    /// The legacy region, in the 64-bit (REX.W) FXSAVE layout.
    pub legacy: Box<[u8; LEGACY]>,
    /// XCR0 (1, x87 only, where the processor has no XSAVE).
    pub xcr0: u64,
    /// State components 2 and up, which only XSAVE and XRSTOR move.
    pub ext: Extended,
}

/// State components 2 and up (AVX and beyond) as a standard-format XSAVE image holds them: the
/// image's bytes from the end of the header on, and their XSTATE_BV bits (which of them are not
/// in their initial configuration, SDM Vol. 1, 13.6). Empty where the processor has no XSAVE.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Extended {
    pub bv: u64,
    pub image: Vec<u8>,
}

impl Fpu {
    /// The state in a standard-format XSAVE image (at least 576 bytes: legacy region and
    /// header). A component whose XSTATE_BV bit is 0 is in its initial configuration whatever
    /// the region's bytes hold (SDM Vol. 1, 13.6, the init optimization): x87 registers and
    /// pointers zero with FCW 037FH; XMM registers zero. MXCSR is always saved (13.7).
    pub fn from_xsave(image: &[u8], xcr0: u64) -> Fpu {
        let ext = Extended { bv: xstate_bv(image) & !(X87 | SSE), image: image[AREA..].to_vec() };
        let mut legacy = Box::new([0u8; LEGACY]);
        legacy.copy_from_slice(&image[..LEGACY]);
        let bv = xstate_bv(image);
        if bv & X87 == 0 {
            // FCW, FSW, FTW (abridged: all empty), FOP, FIP, FDP, and ST0-7.
            legacy[..24].fill(0);
            legacy[..2].copy_from_slice(&FCW_INIT.to_le_bytes());
            legacy[32..160].fill(0);
        }
        if bv & SSE == 0 {
            legacy[160..416].fill(0);
        }
        Fpu { legacy, xcr0, ext }
    }

    /// The x87/SSE state `legacy` with XCR0 `xcr0` and no other component.
    pub fn legacy_only(legacy: Box<[u8; LEGACY]>, xcr0: u64) -> Fpu {
        Fpu { legacy, xcr0, ext: Extended::default() }
    }

    /// Writes the state into a standard-format XSAVE image, marking x87 and SSE in use in
    /// XSTATE_BV so that the next XRSTOR loads them, and the other components as [`Extended`]
    /// has them. The image keeps its MXCSR_MASK (what the processor supports is not state).
    pub fn to_xsave(&self, image: &mut [u8]) {
        let mask: [u8; 4] = image[MXCSR_MASK].try_into().expect("4 bytes");
        image[STATE].copy_from_slice(&self.legacy[STATE]);
        image[MXCSR_MASK].copy_from_slice(&mask);
        let mut bv = xstate_bv(image) | X87 | SSE;
        if !self.ext.image.is_empty() {
            let n = self.ext.image.len().min(image.len() - AREA);
            image[AREA..AREA + n].copy_from_slice(&self.ext.image[..n]);
            bv = X87 | SSE | self.ext.bv;
        }
        image[XSTATE_BV].copy_from_slice(&bv.to_le_bytes());
    }

    /// Whether `other` holds the same state (the reserved bytes and MXCSR_MASK aside).
    pub fn same_state(&self, other: &Fpu) -> bool {
        self.same_legacy_state(other) && self.ext == other.ext
    }

    /// Whether XCR0 and the state in the legacy region (x87, MMX, SSE) are the same: what
    /// [`Fpu::same_state`] compares but for the components only XSAVE moves.
    pub fn same_legacy_state(&self, other: &Fpu) -> bool {
        self.xcr0 == other.xcr0
            && self.legacy[..MXCSR_MASK.start] == other.legacy[..MXCSR_MASK.start]
            && self.legacy[MXCSR_MASK.end..STATE.end] == other.legacy[MXCSR_MASK.end..STATE.end]
    }

    /// XMM register `n` (0-15).
    pub fn xmm(&self, n: usize) -> [u8; 16] {
        self.legacy[160 + 16 * n..176 + 16 * n].try_into().expect("16 bytes")
    }
}

fn xstate_bv(image: &[u8]) -> u64 {
    u64::from_le_bytes(image[XSTATE_BV].try_into().expect("8 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(bv: u64) -> Vec<u8> {
        let mut x = vec![0xAAu8; 1024];
        x[XSTATE_BV].copy_from_slice(&bv.to_le_bytes());
        x
    }

    #[test]
    fn components_in_their_initial_configuration_read_as_such() {
        let f = Fpu::from_xsave(&image(0), 3);
        assert_eq!(&f.legacy[..4], &[0x7F, 0x03, 0, 0], "FCW 037FH, FSW 0");
        assert_eq!(f.xmm(0), [0; 16]);
        assert_eq!(&f.legacy[24..32], &[0xAA; 8], "MXCSR and its mask are always saved");
        let f = Fpu::from_xsave(&image(3), 3);
        assert_eq!(f.xmm(15), [0xAA; 16], "in use: the image's bytes");
    }

    #[test]
    fn writing_back_marks_the_components_in_use_and_keeps_mxcsr_mask() {
        let mut f = Fpu::from_xsave(&image(0), 3);
        f.legacy[160] = 7;
        f.legacy[28..32].copy_from_slice(&[1, 2, 3, 4]);
        let mut x = image(4);
        f.to_xsave(&mut x);
        assert_eq!(xstate_bv(&x), 3, "x87 and SSE in use; AVX as the state has it (initial)");
        assert_eq!(x[160], 7);
        assert_eq!(&x[28..32], &[0xAA; 4]);
        assert_eq!(&x[416..512], &[0xAA; 96], "reserved bytes untouched");
        assert!(Fpu::from_xsave(&x, 3).same_state(&f));
    }
}

/// The XSAVE header's XCOMP_BV (bytes 520-527): bit 63 set marks the compacted format.
const XCOMP_BV: std::ops::Range<usize> = 520..528;
const COMPACTED: u64 = 1 << 63;
/// Header bytes the compacted form of XRSTOR requires to be zero (the rest of the header).
const HEADER_RESERVED: std::ops::Range<usize> = 528..576;
/// Header bytes the standard form of XRSTOR requires to be zero: XCOMP_BV and the 8 after it
/// (SDM Vol. 1, 13.8.1).
const STANDARD_RESERVED: std::ops::Range<usize> = 520..536;
/// MXCSR after XRSTOR initializes SSE state (SDM Vol. 1, 13.6).
const MXCSR_INIT: u32 = 0x1F80;

/// Why emon's XSAVE or XRSTOR does not complete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XsaveFault {
    /// The instruction raises #GP (SDM Vol. 1, 13.7-13.11).
    Gp,
    /// It names a state component the layout does not describe (or the vCPU's image lacks).
    Unsupported,
}

/// Where a state component lives: its offset in the standard format, its size, and whether the
/// compacted format aligns it to 64 bytes (CPUID.(EAX=0DH,ECX=i): EBX, EAX and ECX[1]; SDM Vol.
/// 1, 13.4.3).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Component {
    pub offset: u32,
    pub size: u32,
    pub aligned: bool,
}

/// The layout of state components 2-62 (0 and 1 live in the legacy region).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout(pub [Component; 63]);

/// The two forms of an XSAVE area (SDM Vol. 1, 13.4.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    Standard,
    Compacted,
}

impl Layout {
    /// This processor's layout, which KVM's XSAVE image uses and a guest told this processor's
    /// leaf 0DH sees.
    #[cfg(target_arch = "x86_64")]
    pub fn host() -> Layout {
        let mut l = Layout([Component::default(); 63]);
        for (i, c) in l.0.iter_mut().enumerate().skip(2) {
            let r = std::arch::x86_64::__cpuid_count(0xD, i as u32);
            *c = Component { offset: r.ebx, size: r.eax, aligned: r.ecx & 2 != 0 };
        }
        l
    }

    /// Where component `i` (2 and up) begins in a compacted area holding `xcomp` (SDM Vol. 1,
    /// 13.4.3: the components XCOMP_BV names, in order, after the header).
    fn compacted_offset(&self, xcomp: u64, i: usize) -> usize {
        let mut at = AREA;
        for j in 2..=i {
            let c = self.0[j];
            if xcomp >> j & 1 == 0 {
                continue;
            }
            if c.aligned {
                at = at.next_multiple_of(64);
            }
            if j == i {
                break;
            }
            at += c.size as usize;
        }
        at
    }

    /// The bytes an area of `form` holding the components of `bv` spans.
    pub fn size(&self, form: Form, bv: u64) -> usize {
        (2..63).filter(|i| bv >> i & 1 != 0).fold(AREA, |end, i| {
            let at = match form {
                Form::Standard => self.0[i].offset as usize,
                Form::Compacted => self.compacted_offset(bv, i),
            };
            end.max(at + self.0[i].size as usize)
        })
    }

    /// Component `i`'s place in an area of `form` with XCOMP_BV `xcomp`, and in the standard
    /// image of [`Extended`]; `None` if the layout or the image lacks it.
    fn places(
        &self,
        form: Form,
        xcomp: u64,
        i: usize,
        ext: &Extended,
    ) -> Option<(std::ops::Range<usize>, std::ops::Range<usize>)> {
        let c = self.0[i];
        let at = match form {
            Form::Standard => c.offset as usize,
            Form::Compacted => self.compacted_offset(xcomp, i),
        };
        let image = (c.offset as usize).checked_sub(AREA)?;
        let n = c.size as usize;
        (n > 0 && image + n <= ext.image.len()).then_some((at..at + n, image..image + n))
    }
}

impl Fpu {
    /// Whether x87 state is in its initial configuration (SDM Vol. 1, 13.6): FCW 037FH, FSW, FTW
    /// (all empty), FOP, FIP, FDP and ST0-7 zero.
    fn x87_init(&self) -> bool {
        self.legacy[..2] == FCW_INIT.to_le_bytes()
            && self.legacy[2..24].iter().all(|b| *b == 0)
            && self.legacy[32..160].iter().all(|b| *b == 0)
    }

    /// Whether SSE state is in its initial configuration: every XMM register zero (MXCSR is not
    /// part of the tracking).
    fn sse_init(&self) -> bool {
        self.legacy[160..416].iter().all(|b| *b == 0)
    }

    /// XINUSE: the components not in their initial configuration.
    fn in_use(&self) -> u64 {
        (if self.x87_init() { 0 } else { X87 }) | if self.sse_init() { 0 } else { SSE } | self.ext.bv
    }

    /// XSAVE (and XSAVEOPT, whose modified optimization may skip writes that would not change
    /// the area) in the standard form, or XSAVEC in the compacted form, with requested-feature
    /// bitmap `rfbm` (EDX:EAX AND XCR0) into `area` (the area's first [`Layout::size`] bytes;
    /// SDM Vol. 1, 13.7 and 13.10). XSTATE_BV = RFBM AND XINUSE (the standard form keeps its
    /// bits outside RFBM); XSAVEC writes XCOMP_BV = RFBM with bit 63 and no component in its
    /// initial configuration. `rex_w`: the 64-bit forms, whose x87 pointers are 64-bit (else
    /// FIP/FDP are 32-bit offsets with FCS/FDS, zero in 64-bit mode: 13.5.1).
    pub fn xsave(
        &self,
        form: Form,
        rfbm: u64,
        rex_w: bool,
        layout: &Layout,
        area: &mut [u8],
    ) -> Result<(), XsaveFault> {
        let in_use = self.in_use();
        let writes = |i: u64| rfbm & i != 0 && (form == Form::Standard || in_use & i != 0);
        if writes(X87) {
            area[..8].copy_from_slice(&self.legacy[..8]);
            area[32..160].copy_from_slice(&self.legacy[32..160]);
            if rex_w {
                area[8..24].copy_from_slice(&self.legacy[8..24]);
            } else {
                area[8..12].copy_from_slice(&self.legacy[8..12]);
                area[12..16].fill(0);
                area[16..20].copy_from_slice(&self.legacy[16..20]);
                area[20..24].fill(0);
            }
        }
        // MXCSR goes with SSE, and in the standard form with AVX too (13.7).
        if rfbm & SSE != 0 || form == Form::Standard && rfbm & 4 != 0 {
            area[24..32].copy_from_slice(&self.legacy[24..32]);
        }
        if writes(SSE) {
            area[160..416].copy_from_slice(&self.legacy[160..416]);
        }
        let xcomp = rfbm | COMPACTED;
        for i in (2..63).filter(|i| rfbm >> i & 1 != 0) {
            let (at, image) = layout.places(form, xcomp, i, &self.ext).ok_or(XsaveFault::Unsupported)?;
            if writes(1 << i) {
                area[at].copy_from_slice(&self.ext.image[image]);
            }
        }
        let bv = match form {
            Form::Standard => xstate_bv(area) & !rfbm | rfbm & in_use,
            Form::Compacted => rfbm & in_use,
        };
        area[XSTATE_BV].copy_from_slice(&bv.to_le_bytes());
        if form == Form::Compacted {
            area[XCOMP_BV].copy_from_slice(&xcomp.to_le_bytes());
        }
        Ok(())
    }

    /// XRSTOR with requested-feature bitmap `rfbm` from `area` (its first [`Layout::size`] bytes;
    /// the form as XCOMP_BV bit 63 says, SDM Vol. 1, 13.8): the state after it. A component RFBM
    /// requests is loaded from the area where XSTATE_BV has it, else initialized (SSE's MXCSR
    /// to 1F80H in the compacted form; the standard form loads MXCSR with SSE or AVX). #GP for
    /// a header that names components beyond XCR0, non-zero reserved header bytes (and in the
    /// compacted form XSTATE_BV bits beyond XCOMP_BV), or an MXCSR with bits MXCSR_MASK does not
    /// allow.
    pub fn xrstor(&self, rfbm: u64, rex_w: bool, layout: &Layout, area: &[u8]) -> Result<Fpu, XsaveFault> {
        let comp = xcomp_bv(area);
        let bv = xstate_bv(area);
        let form = if comp & COMPACTED != 0 { Form::Compacted } else { Form::Standard };
        let bad_header = match form {
            Form::Compacted => {
                comp & !COMPACTED & !self.xcr0 != 0 || bv & !comp != 0 || area[HEADER_RESERVED].iter().any(|b| *b != 0)
            }
            Form::Standard => bv & !self.xcr0 != 0 || area[STANDARD_RESERVED].iter().any(|b| *b != 0),
        };
        if bad_header {
            return Err(XsaveFault::Gp);
        }
        let mut out = self.clone();
        if rfbm & X87 != 0 {
            if bv & X87 != 0 {
                out.legacy[..8].copy_from_slice(&area[..8]);
                out.legacy[32..160].copy_from_slice(&area[32..160]);
                if rex_w {
                    out.legacy[8..24].copy_from_slice(&area[8..24]);
                } else {
                    out.legacy[8..24].fill(0);
                    out.legacy[8..12].copy_from_slice(&area[8..12]);
                    out.legacy[16..20].copy_from_slice(&area[16..20]);
                }
            } else {
                out.legacy[..24].fill(0);
                out.legacy[..2].copy_from_slice(&FCW_INIT.to_le_bytes());
                out.legacy[32..160].fill(0);
            }
        }
        let mxcsr_from_area = match form {
            Form::Compacted => rfbm & SSE != 0 && bv & SSE != 0,
            Form::Standard => rfbm & (SSE | 4) != 0,
        };
        if mxcsr_from_area {
            let mxcsr = u32::from_le_bytes(area[24..28].try_into().expect("4 bytes"));
            let mask = u32::from_le_bytes(self.legacy[MXCSR_MASK].try_into().expect("4 bytes"));
            if mxcsr & !mask != 0 {
                return Err(XsaveFault::Gp);
            }
            out.legacy[24..28].copy_from_slice(&area[24..28]);
        } else if form == Form::Compacted && rfbm & SSE != 0 {
            out.legacy[24..28].copy_from_slice(&MXCSR_INIT.to_le_bytes());
        }
        if rfbm & SSE != 0 {
            if bv & SSE != 0 {
                out.legacy[160..416].copy_from_slice(&area[160..416]);
            } else {
                out.legacy[160..416].fill(0);
            }
        }
        for i in 2..63 {
            let bit = 1u64 << i;
            if rfbm & bit == 0 {
                continue;
            }
            let (at, image) = layout.places(form, comp, i, &out.ext).ok_or(XsaveFault::Unsupported)?;
            if bv & bit != 0 {
                out.ext.image[image].copy_from_slice(&area[at]);
                out.ext.bv |= bit;
            } else {
                // Every component beyond SSE initializes to zeros (13.6).
                out.ext.image[image].fill(0);
                out.ext.bv &= !bit;
            }
        }
        Ok(out)
    }
}

/// An XSAVE area's XCOMP_BV (its header's second quadword).
pub fn xcomp_bv(area: &[u8]) -> u64 {
    u64::from_le_bytes(area[XCOMP_BV].try_into().expect("8 bytes"))
}

/// Whether an XSAVE area (its first 576 bytes) is in the compacted format.
pub fn compacted(area: &[u8]) -> bool {
    xcomp_bv(area) & COMPACTED != 0
}

/// Bytes of an XSAVE area before any component beyond SSE: the legacy region and the header.
pub const AREA: usize = 576;

#[cfg(test)]
mod xsave_tests {
    use super::*;

    /// AVX (component 2) at 576, 256 bytes, and component 9 (PKRU) at 2688, 8 bytes, aligned
    /// to 64 in the compacted form.
    fn layout() -> Layout {
        let mut l = Layout([Component::default(); 63]);
        l.0[2] = Component { offset: 576, size: 256, aligned: false };
        l.0[9] = Component { offset: 2688, size: 8, aligned: true };
        l
    }

    fn state() -> Fpu {
        let mut legacy = Box::new([0u8; LEGACY]);
        legacy[..2].copy_from_slice(&FCW_INIT.to_le_bytes());
        legacy[24..28].copy_from_slice(&0x1F80u32.to_le_bytes());
        legacy[28..32].copy_from_slice(&0xFFFFu32.to_le_bytes());
        Fpu { legacy, xcr0: 3 | 4 | 1 << 9, ext: Extended { bv: 0, image: vec![0; 4096 - AREA] } }
    }

    #[test]
    fn compacted_offsets_follow_xcomp_bv_and_alignment() {
        let l = layout();
        assert_eq!(l.compacted_offset(COMPACTED | 7, 2), 576);
        assert_eq!(l.compacted_offset(COMPACTED | 7 | 1 << 9, 9), 832, "576 + 256, already aligned");
        assert_eq!(l.compacted_offset(COMPACTED | 3 | 1 << 9, 9), 576, "no AVX before it");
        assert_eq!(l.size(Form::Compacted, 7 | 1 << 9), 840);
        assert_eq!(l.size(Form::Standard, 7 | 1 << 9), 2696);
        assert_eq!(l.size(Form::Standard, 3), AREA);
    }

    #[test]
    fn xsavec_marks_only_what_is_in_use_and_restores_through_the_compacted_form() {
        let l = layout();
        let mut f = state();
        f.legacy[160] = 0x42; // XMM0 in use, x87 initial
        f.ext.image[0] = 0x55; // YMM0's upper half in use
        f.ext.bv = 4;
        let mut area = vec![0xEEu8; l.size(Form::Compacted, 7)];
        area[HEADER_RESERVED].fill(0);
        f.xsave(Form::Compacted, 7, true, &l, &mut area).unwrap();
        assert_eq!(xstate_bv(&area), SSE | 4, "x87 is in its initial configuration");
        assert!(compacted(&area));
        assert_eq!(xcomp_bv(&area), 7 | COMPACTED);
        assert_eq!(&area[416..512], &[0xEE; 96][..], "XSAVEC writes nothing past the XMM registers");
        assert_eq!(area[576], 0x55, "YMM0's upper half right after the header");
        // Restore into a different state: XMM0 and YMM0 back, x87 initialized.
        let mut other = state();
        other.legacy[..2].copy_from_slice(&0x0272u16.to_le_bytes());
        other.legacy[176] = 9;
        let back = other.xrstor(7, true, &l, &area).unwrap();
        assert_eq!((back.legacy[160], back.ext.image[0], back.ext.bv), (0x42, 0x55, 4));
        assert_eq!(back.legacy[176], 0, "XMM1 from the area");
        assert_eq!(&back.legacy[..2], &FCW_INIT.to_le_bytes(), "x87 initialized (XSTATE_BV[0] clear)");
        // SSE and AVX not in XSTATE_BV: XMM zero, YMM zero and MXCSR 1F80H (the compacted rule).
        area[XSTATE_BV].copy_from_slice(&0u64.to_le_bytes());
        area[24..28].copy_from_slice(&0x1FBFu32.to_le_bytes());
        let init = f.xrstor(6, true, &l, &area).unwrap();
        assert_eq!((init.legacy[160], &init.legacy[24..28]), (0, &0x1F80u32.to_le_bytes()[..]));
        assert_eq!((init.ext.image[0], init.ext.bv), (0, 0));
    }

    #[test]
    fn the_standard_form_saves_every_requested_component_and_keeps_other_bits() {
        let l = layout();
        let mut f = state();
        f.ext.image[2688 - AREA] = 0x11; // PKRU
        f.ext.bv = 1 << 9;
        let mut area = vec![0xEEu8; l.size(Form::Standard, f.xcr0)];
        area[XSTATE_BV].copy_from_slice(&(1u64 << 5).to_le_bytes());
        area[STANDARD_RESERVED].fill(0);
        f.xsave(Form::Standard, f.xcr0, true, &l, &mut area).unwrap();
        assert_eq!(xstate_bv(&area), 1 << 5 | 1 << 9, "bits outside RFBM kept; only PKRU in use");
        assert_eq!((area[160], area[576], area[2688]), (0, 0, 0x11), "initial components written too");
        area[XSTATE_BV].copy_from_slice(&(1u64 << 9 | 4).to_le_bytes());
        area[600] = 0x77;
        area[24..28].copy_from_slice(&0x1FBFu32.to_le_bytes());
        let back = state().xrstor(4 | 1 << 9, true, &l, &area).unwrap();
        assert_eq!((back.ext.bv, back.ext.image[24], back.ext.image[2688 - AREA]), (4 | 1 << 9, 0x77, 0x11));
        assert_eq!(&back.legacy[24..28], &0x1FBFu32.to_le_bytes(), "the standard form loads MXCSR with AVX");
    }

    #[test]
    fn bad_headers_fault_and_undescribed_components_are_not_handled() {
        let l = layout();
        let f = state();
        let mut area = vec![0u8; l.size(Form::Compacted, 3)];
        f.xsave(Form::Compacted, 3, true, &l, &mut area).unwrap();
        let mut bad = area.clone();
        bad[XCOMP_BV].copy_from_slice(&(COMPACTED | 1 << 5).to_le_bytes());
        assert_eq!(f.xrstor(3, true, &l, &bad), Err(XsaveFault::Gp), "XCOMP_BV beyond XCR0");
        let mut bad = area.clone();
        bad[XSTATE_BV].copy_from_slice(&3u64.to_le_bytes());
        bad[XCOMP_BV].copy_from_slice(&(COMPACTED | 1).to_le_bytes());
        assert_eq!(f.xrstor(3, true, &l, &bad), Err(XsaveFault::Gp), "XSTATE_BV beyond XCOMP_BV");
        let mut bad = area.clone();
        bad[540] = 1;
        assert_eq!(f.xrstor(3, true, &l, &bad), Err(XsaveFault::Gp), "reserved header bytes");
        let mut bad = area.clone();
        bad[XCOMP_BV].fill(0);
        bad[XSTATE_BV].copy_from_slice(&(1u64 << 5).to_le_bytes());
        assert_eq!(f.xrstor(3, true, &l, &bad), Err(XsaveFault::Gp), "standard: XSTATE_BV beyond XCR0");
        let mut area = vec![0u8; 4096];
        assert_eq!(f.xsave(Form::Compacted, 1 << 5, true, &l, &mut area), Err(XsaveFault::Unsupported));
    }
}
