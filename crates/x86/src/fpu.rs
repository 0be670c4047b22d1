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

/// The x87/MMX/SSE state and XCR0.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fpu {
    /// The legacy region, in the 64-bit (REX.W) FXSAVE layout.
    pub legacy: Box<[u8; LEGACY]>,
    /// XCR0 (1, x87 only, where the processor has no XSAVE).
    pub xcr0: u64,
}

impl Fpu {
    /// The state in a standard-format XSAVE image (at least 576 bytes: legacy region and
    /// header). A component whose XSTATE_BV bit is 0 is in its initial configuration whatever
    /// the region's bytes hold (SDM Vol. 1, 13.6, the init optimization): x87 registers and
    /// pointers zero with FCW 037FH; XMM registers zero. MXCSR is always saved (13.7).
    pub fn from_xsave(image: &[u8], xcr0: u64) -> Fpu {
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
        Fpu { legacy, xcr0 }
    }

    /// Writes the state into a standard-format XSAVE image, marking x87 and SSE in use in
    /// XSTATE_BV so that the next XRSTOR loads them. The image keeps its MXCSR_MASK (what the
    /// processor supports is not state).
    pub fn to_xsave(&self, image: &mut [u8]) {
        let mask: [u8; 4] = image[MXCSR_MASK].try_into().expect("4 bytes");
        image[STATE].copy_from_slice(&self.legacy[STATE]);
        image[MXCSR_MASK].copy_from_slice(&mask);
        let bv = xstate_bv(image) | X87 | SSE;
        image[XSTATE_BV].copy_from_slice(&bv.to_le_bytes());
    }

    /// Whether `other` holds the same state (the reserved bytes and MXCSR_MASK aside).
    pub fn same_state(&self, other: &Fpu) -> bool {
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
        assert_eq!(xstate_bv(&x), 7);
        assert_eq!(x[160], 7);
        assert_eq!(&x[28..32], &[0xAA; 4]);
        assert_eq!(&x[416..512], &[0xAA; 96], "reserved bytes untouched");
        assert!(Fpu::from_xsave(&x, 3).same_state(&f));
    }
}

/// The XSAVE header's XCOMP_BV (bytes 520-527): bit 63 set marks the compacted format.
const XCOMP_BV: std::ops::Range<usize> = 520..528;
const COMPACTED: u64 = 1 << 63;
/// Header bytes XRSTOR requires to be zero (the rest of the 64-byte header).
const HEADER_RESERVED: std::ops::Range<usize> = 528..576;
/// The state components emon's own XSAVEC and compacted XRSTOR handle: x87 and SSE, which both
/// live in the legacy region, so that the compacted and standard formats differ only in the header.
const HANDLED: u64 = X87 | SSE;
/// MXCSR after XRSTOR initializes SSE state (SDM Vol. 1, 13.6).
const MXCSR_INIT: u32 = 0x1F80;

/// Why emon's XSAVEC or compacted XRSTOR does not complete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XsaveFault {
    /// The instruction raises #GP (SDM Vol. 1, 13.8.2 and 13.10).
    Gp,
    /// It names state components beyond x87 and SSE, which emon does not handle.
    Unsupported,
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

    /// XSAVEC with requested-feature bitmap `rfbm` (EDX:EAX AND XCR0) into an area whose first
    /// 576 bytes are `area` (SDM Vol. 1, 13.10): the x87 state if RFBM[0], MXCSR and the XMM
    /// registers if RFBM[1], XSTATE_BV = RFBM AND XINUSE, XCOMP_BV = RFBM with bit 63 set; no
    /// other byte. `rex_w`: XSAVEC64, whose x87 pointers are 64-bit (else FIP/FDP are 32-bit
    /// offsets with FCS/FDS, zero in 64-bit mode: 13.5.1).
    pub fn xsavec(&self, rfbm: u64, rex_w: bool, area: &mut [u8]) -> Result<(), XsaveFault> {
        if rfbm & !HANDLED != 0 {
            return Err(XsaveFault::Unsupported);
        }
        if rfbm & X87 != 0 {
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
        if rfbm & SSE != 0 {
            area[24..32].copy_from_slice(&self.legacy[24..32]);
            area[160..416].copy_from_slice(&self.legacy[160..416]);
        }
        let in_use = if self.x87_init() { 0 } else { X87 } | if self.sse_init() { 0 } else { SSE };
        area[XSTATE_BV].copy_from_slice(&(rfbm & in_use).to_le_bytes());
        area[XCOMP_BV].copy_from_slice(&(rfbm | COMPACTED).to_le_bytes());
        Ok(())
    }

    /// The compacted form of XRSTOR (XCOMP_BV bit 63 set in `area`, its first 576 bytes) with
    /// requested-feature bitmap `rfbm` (SDM Vol. 1, 13.8.2): the state after it. A component
    /// RFBM requests is loaded from the area where XSTATE_BV has it, else initialized (SSE's
    /// MXCSR to 1F80H, unlike the standard form). #GP for XCOMP_BV bits beyond `xcr0`,
    /// XSTATE_BV bits beyond XCOMP_BV, non-zero reserved header bytes, or an MXCSR with bits
    /// MXCSR_MASK does not allow.
    pub fn xrstor_compacted(&self, rfbm: u64, rex_w: bool, area: &[u8]) -> Result<Fpu, XsaveFault> {
        let comp = u64::from_le_bytes(area[XCOMP_BV].try_into().expect("8 bytes"));
        let bv = xstate_bv(area);
        if comp & !COMPACTED & !self.xcr0 != 0 || bv & !comp != 0 || area[HEADER_RESERVED].iter().any(|b| *b != 0) {
            return Err(XsaveFault::Gp);
        }
        if (rfbm | comp & !COMPACTED) & !HANDLED != 0 {
            return Err(XsaveFault::Unsupported);
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
        if rfbm & SSE != 0 {
            if bv & SSE != 0 {
                let mxcsr = u32::from_le_bytes(area[24..28].try_into().expect("4 bytes"));
                let mask = u32::from_le_bytes(self.legacy[MXCSR_MASK].try_into().expect("4 bytes"));
                if mxcsr & !mask != 0 {
                    return Err(XsaveFault::Gp);
                }
                out.legacy[24..28].copy_from_slice(&area[24..28]);
                out.legacy[160..416].copy_from_slice(&area[160..416]);
            } else {
                out.legacy[24..28].copy_from_slice(&MXCSR_INIT.to_le_bytes());
                out.legacy[160..416].fill(0);
            }
        }
        Ok(out)
    }
}

/// Whether an XSAVE area (its first 576 bytes) is in the compacted format.
pub fn compacted(area: &[u8]) -> bool {
    u64::from_le_bytes(area[XCOMP_BV].try_into().expect("8 bytes")) & COMPACTED != 0
}

/// Bytes of an XSAVE area that XSAVEC and XRSTOR use here: the legacy region and the header.
pub const AREA: usize = 576;

#[cfg(test)]
mod compacted_tests {
    use super::*;

    fn state() -> Fpu {
        let mut legacy = Box::new([0u8; LEGACY]);
        legacy[..2].copy_from_slice(&FCW_INIT.to_le_bytes());
        legacy[24..28].copy_from_slice(&0x1F80u32.to_le_bytes());
        legacy[28..32].copy_from_slice(&0xFFFFu32.to_le_bytes());
        Fpu { legacy, xcr0: 3 }
    }

    #[test]
    fn xsavec_marks_only_what_is_in_use_and_restores_through_the_compacted_form() {
        let mut f = state();
        f.legacy[160] = 0x42; // XMM0 in use, x87 initial
        let mut area = vec![0xEEu8; AREA];
        area[HEADER_RESERVED].fill(0);
        f.xsavec(3, true, &mut area).unwrap();
        assert_eq!(xstate_bv(&area), SSE, "x87 is in its initial configuration");
        assert!(compacted(&area));
        assert_eq!(u64::from_le_bytes(area[XCOMP_BV].try_into().unwrap()), 3 | COMPACTED);
        assert_eq!(&area[416..512], &[0xEE; 96][..], "XSAVEC writes nothing past the XMM registers");
        // Restore into a different state: XMM0 back, x87 initialized.
        let mut other = state();
        other.legacy[..2].copy_from_slice(&0x0272u16.to_le_bytes());
        other.legacy[176] = 9;
        let back = other.xrstor_compacted(3, true, &area).unwrap();
        assert_eq!(back.legacy[160], 0x42);
        assert_eq!(back.legacy[176], 0, "XMM1 from the area");
        assert_eq!(&back.legacy[..2], &FCW_INIT.to_le_bytes(), "x87 initialized (XSTATE_BV[0] clear)");
        // SSE not in XSTATE_BV: XMM zero and MXCSR 1F80H (the compacted form's rule).
        area[XSTATE_BV].copy_from_slice(&0u64.to_le_bytes());
        area[24..28].copy_from_slice(&0x1FBFu32.to_le_bytes());
        let init = f.xrstor_compacted(2, true, &area).unwrap();
        assert_eq!((init.legacy[160], &init.legacy[24..28]), (0, &0x1F80u32.to_le_bytes()[..]));
    }

    #[test]
    fn bad_headers_fault_and_wider_features_are_not_handled() {
        let f = state();
        let mut area = vec![0u8; AREA];
        f.xsavec(3, true, &mut area).unwrap();
        let mut bad = area.clone();
        bad[XCOMP_BV].copy_from_slice(&(COMPACTED | 1 << 5).to_le_bytes());
        assert_eq!(f.xrstor_compacted(3, true, &bad), Err(XsaveFault::Gp), "XCOMP_BV beyond XCR0");
        let mut bad = area.clone();
        bad[XSTATE_BV].copy_from_slice(&3u64.to_le_bytes());
        bad[XCOMP_BV].copy_from_slice(&(COMPACTED | 1).to_le_bytes());
        assert_eq!(f.xrstor_compacted(3, true, &bad), Err(XsaveFault::Gp), "XSTATE_BV beyond XCOMP_BV");
        let mut bad = area.clone();
        bad[540] = 1;
        assert_eq!(f.xrstor_compacted(3, true, &bad), Err(XsaveFault::Gp), "reserved header bytes");
        assert_eq!(f.xsavec(7, true, &mut area), Err(XsaveFault::Unsupported), "AVX");
    }
}
