//! The Debug Store save area and PEBS records (SDM Vol. 3B 18.4.4 "Debug Store (DS) Mechanism"
//! and the PEBS sections; Figure 18-22 for the DS buffer management area): pure layout code. The
//! backend reads and writes guest memory; this module says what goes where.

/// The DS buffer management area's fields in the 64-bit layout (IA32_DS_AREA points at it).
pub const DS_BTS_BUFFER_BASE: u64 = 0x00;
pub const DS_BTS_INDEX: u64 = 0x08;
pub const DS_BTS_ABSOLUTE_MAXIMUM: u64 = 0x10;
pub const DS_BTS_INTERRUPT_THRESHOLD: u64 = 0x18;
pub const DS_PEBS_BUFFER_BASE: u64 = 0x20;
pub const DS_PEBS_INDEX: u64 = 0x28;
pub const DS_PEBS_ABSOLUTE_MAXIMUM: u64 = 0x30;
pub const DS_PEBS_INTERRUPT_THRESHOLD: u64 = 0x38;
/// PEBS Counter0 Reset; counter i's reset value is at 0x40 + 8 x i.
pub const DS_PEBS_COUNTER0_RESET: u64 = 0x40;
/// Adaptive PEBS: fixed counter i's reset value is at 0x80 + 8 x i, after those of 8 GP counters.
pub const DS_PEBS_FIXED0_RESET: u64 = 0x80;
/// The bytes of the area emon reads: the eight fields and the resets of up to 8 GP and 4 fixed
/// counters.
pub const DS_AREA_SIZE: usize = 0xA0;

/// The DS buffer management area's BTS and PEBS fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DsArea {
    pub bts_buffer_base: u64,
    pub bts_index: u64,
    pub bts_absolute_maximum: u64,
    pub bts_interrupt_threshold: u64,
    pub pebs_buffer_base: u64,
    pub pebs_index: u64,
    pub pebs_absolute_maximum: u64,
    pub pebs_interrupt_threshold: u64,
    pub pebs_counter_reset: [u64; 8],
    pub pebs_fixed_reset: [u64; 4],
}

fn field(bytes: &[u8; DS_AREA_SIZE], offset: u64) -> u64 {
    let o = offset as usize;
    u64::from_le_bytes(bytes[o..o + 8].try_into().expect("8 bytes"))
}

impl DsArea {
    /// The PEBS reset value of counter `id` (SDM 18.6.1.1 "PEBS Counter Reset"; 0 for a counter
    /// the area has no field for).
    pub fn counter_reset(&self, id: super::CounterId) -> u64 {
        let (resets, i): (&[u64], u8) = match id {
            super::CounterId::Gp(i) => (&self.pebs_counter_reset, i),
            super::CounterId::Fixed(i) => (&self.pebs_fixed_reset, i),
            super::CounterId::NetBurst(_) => return 0,
        };
        resets.get(usize::from(i)).copied().unwrap_or(0)
    }

    /// The area as it lies in guest memory.
    pub fn parse(bytes: &[u8; DS_AREA_SIZE]) -> DsArea {
        let mut reset = [0; 8];
        for (i, r) in (0u64..).zip(reset.iter_mut()) {
            *r = field(bytes, DS_PEBS_COUNTER0_RESET + 8 * i);
        }
        let mut fixed = [0; 4];
        for (i, r) in (0u64..).zip(fixed.iter_mut()) {
            *r = field(bytes, DS_PEBS_FIXED0_RESET + 8 * i);
        }
        DsArea {
            bts_buffer_base: field(bytes, DS_BTS_BUFFER_BASE),
            bts_index: field(bytes, DS_BTS_INDEX),
            bts_absolute_maximum: field(bytes, DS_BTS_ABSOLUTE_MAXIMUM),
            bts_interrupt_threshold: field(bytes, DS_BTS_INTERRUPT_THRESHOLD),
            pebs_fixed_reset: fixed,
            pebs_buffer_base: field(bytes, DS_PEBS_BUFFER_BASE),
            pebs_index: field(bytes, DS_PEBS_INDEX),
            pebs_absolute_maximum: field(bytes, DS_PEBS_ABSOLUTE_MAXIMUM),
            pebs_interrupt_threshold: field(bytes, DS_PEBS_INTERRUPT_THRESHOLD),
            pebs_counter_reset: reset,
        }
    }

    /// Where the next record of `size` bytes goes, or `None` when it would not fit below the
    /// absolute maximum (the processor then writes no record).
    pub fn next_record(&self, size: u64) -> Option<u64> {
        let end = self.pebs_index.checked_add(size)?;
        (end <= self.pebs_absolute_maximum).then_some(self.pebs_index)
    }
}

/// A BTS record (64-bit layout): branch from, branch to, and a flags word whose bit 4 says the
/// branch was predicted (SDM 17.4.9.1).
pub const BTS_RECORD_SIZE: u64 = 24;

/// The BTS record of a branch from `from` to `to`.
pub fn bts_record(from: u64, to: u64, predicted: bool) -> [u8; 24] {
    let mut r = [0u8; 24];
    r[..8].copy_from_slice(&from.to_le_bytes());
    r[8..16].copy_from_slice(&to.to_le_bytes());
    r[16..].copy_from_slice(&(u64::from(predicted) << 4).to_le_bytes());
    r
}

impl DsArea {
    /// Where the next BTS record goes. A record that would pass the absolute maximum goes to the
    /// buffer base when the buffer is circular (`interrupts` clear: DEBUGCTL.BTINT = 0); with
    /// BTINT set it is not written (SDM 17.4.9).
    pub fn next_bts(&self, interrupts: bool) -> Option<u64> {
        let fits = |at: u64| at.checked_add(BTS_RECORD_SIZE).is_some_and(|end| end <= self.bts_absolute_maximum);
        if fits(self.bts_index) {
            Some(self.bts_index)
        } else if !interrupts && fits(self.bts_buffer_base) {
            Some(self.bts_buffer_base)
        } else {
            None
        }
    }
}

/// What a PEBS record holds, from the instruction that triggered the assist.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PebsInput {
    /// RFLAGS after the instruction.
    pub rflags: u64,
    /// RIP after the instruction (PEBS is trap-like: PERF_CAPABILITIES.PEBS_TRAP).
    pub rip: u64,
    /// RAX, RBX, RCX, RDX, RSI, RDI, RBP, RSP, R8-R15 after the instruction, in record order.
    pub gprs: [u64; 16],
    /// The address of the instruction that triggered the assist (format 2+: EventingIP).
    pub eventing_ip: u64,
    /// Format 1-2: IA32_PERF_GLOBAL_STATUS as the record stores it; format 3: the counters the
    /// record applies to.
    pub status: u64,
    /// Format 3 and 4: the TSC when the record was written.
    pub tsc: u64,
    /// Format 4: XMM0-15 (the XMM group).
    pub xmm: [[u8; 16]; 16],
    /// Format 4: the LBR stack's newest entries, newest first (the LBR group).
    pub lbr: Vec<(u64, u64, u64)>,
}

/// MSR_PEBS_DATA_CFG groups (SDM 18.9.2.2).
pub const PEBS_DATA_CFG_MEMINFO: u64 = 1 << 0;
pub const PEBS_DATA_CFG_GPRS: u64 = 1 << 1;
pub const PEBS_DATA_CFG_XMMS: u64 = 1 << 2;
pub const PEBS_DATA_CFG_LBRS: u64 = 1 << 3;
/// Bits 31:24: LBR entries in the LBR group, minus one.
pub const PEBS_DATA_CFG_LBR_SHIFT: u32 = 24;

/// LBR entries the LBR group of MSR_PEBS_DATA_CFG `cfg` holds (0 without the group).
pub fn adaptive_lbr_entries(cfg: u64) -> usize {
    if cfg & PEBS_DATA_CFG_LBRS == 0 {
        return 0;
    }
    ((cfg >> PEBS_DATA_CFG_LBR_SHIFT) & 0xFF) as usize + 1
}

/// The size of an adaptive (format 4) record with groups `cfg`: the basic group (format and
/// size, IP, applicable counters, TSC: 0x20 bytes), then memory info (0x20), GPRs (0x90), XMMs
/// (0x100) and the LBR entries (0x18 each) that `cfg` selects.
pub fn adaptive_record_size(cfg: u64) -> u64 {
    let group = |bit: u64, size: u64| if cfg & bit != 0 { size } else { 0 };
    0x20 + group(PEBS_DATA_CFG_MEMINFO, 0x20)
        + group(PEBS_DATA_CFG_GPRS, 0x90)
        + group(PEBS_DATA_CFG_XMMS, 0x100)
        + 0x18 * adaptive_lbr_entries(cfg) as u64
}

/// The adaptive (format 4) record of `input` with groups `cfg` (SDM 18.9.2.2). The basic group's
/// first word holds the record's format (`cfg`) in bits 47:0 and its size in 63:48; its IP is the
/// instruction that triggered the assist. The memory info group is 0 (README, "PEBS"); the GPR
/// group holds RFLAGS, RIP and RAX, RCX, RDX, RBX, RSP, RBP, RSI, RDI, R8-R15 (this group's own
/// order); LBR entries missing from a shallower stack are 0.
pub fn adaptive_record(cfg: u64, input: &PebsInput) -> Vec<u8> {
    let size = adaptive_record_size(cfg);
    let mut words = vec![size << 48 | (cfg & 0xFFFF_FFFF_FFFF), input.eventing_ip, input.status, input.tsc];
    if cfg & PEBS_DATA_CFG_MEMINFO != 0 {
        words.extend([0, 0, 0, 0]);
    }
    if cfg & PEBS_DATA_CFG_GPRS != 0 {
        let g = &input.gprs; // RAX, RBX, RCX, RDX, RSI, RDI, RBP, RSP, R8-R15
        words.extend([input.rflags, input.rip, g[0], g[2], g[3], g[1], g[7], g[6], g[4], g[5]]);
        words.extend_from_slice(&g[8..]);
    }
    let mut bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    if cfg & PEBS_DATA_CFG_XMMS != 0 {
        bytes.extend(input.xmm.iter().flatten());
    }
    for n in 0..adaptive_lbr_entries(cfg) {
        let (from, to, info) = input.lbr.get(n).copied().unwrap_or_default();
        bytes.extend([from, to, info].iter().flat_map(|w| w.to_le_bytes()));
    }
    debug_assert_eq!(bytes.len() as u64, size);
    bytes
}

/// The size of a record in PEBS format `format` (PERF_CAPABILITIES[11:8]), for the formats emon
/// writes: 0 (Core 2: RFLAGS, RIP and the 16 GPRs), 1 (Nehalem: + IA32_PERF_GLOBAL_STATUS, data
/// linear address, data source, latency), 2 (+ EventingIP, TX abort information), 3 (Skylake:
/// + TSC, and the status field holds the applicable counters).
pub fn record_size(format: u8) -> Option<u64> {
    match format {
        0 => Some(0x90),
        1 => Some(0xB0),
        2 => Some(0xC0),
        3 => Some(0xC8),
        _ => None,
    }
}

/// The record of `input` in PEBS format `format` (one [`record_size`] emon writes). The data
/// linear address, data source, latency and TX abort fields are 0: emon models no memory
/// latency, and the events PEBS samples here are not memory events (README, "PEBS").
pub fn record(format: u8, input: &PebsInput) -> Vec<u8> {
    let size = record_size(format).expect("a format emon writes") as usize;
    let mut words = vec![input.rflags, input.rip];
    words.extend_from_slice(&input.gprs);
    if format >= 1 {
        words.extend([input.status, 0, 0, 0]);
    }
    if format >= 2 {
        words.extend([input.eventing_ip, 0]);
    }
    if format >= 3 {
        words.push(input.tsc);
    }
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    debug_assert_eq!(bytes.len(), size);
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Registers 0x100 + i, and known IP, flags, status and TSC.
    fn sample_input(status: u64) -> PebsInput {
        PebsInput {
            rflags: 0x46,
            rip: 0x1000,
            gprs: core::array::from_fn(|i| 0x100 + i as u64),
            eventing_ip: 0xFFE,
            status,
            tsc: 0x1234,
            ..Default::default()
        }
    }

    fn word(r: &[u8], offset: usize) -> u64 {
        u64::from_le_bytes(r[offset..offset + 8].try_into().unwrap())
    }

    #[test]
    fn records_have_the_sdms_layout() {
        let input = sample_input(1);
        for format in 0..=3 {
            let r = record(format, &input);
            assert_eq!(r.len() as u64, record_size(format).unwrap());
            assert_eq!((word(&r, 0), word(&r, 8)), (0x46, 0x1000), "RFLAGS, RIP");
            assert_eq!((word(&r, 0x10), word(&r, 0x88)), (0x100, 0x10F), "RAX .. R15");
        }
        let r = record(3, &input);
        assert_eq!((word(&r, 0x90), word(&r, 0x98)), (1, 0), "applicable counters, data linear address");
        assert_eq!((word(&r, 0xB0), word(&r, 0xC0)), (0xFFE, 0x1234), "EventingIP, TSC");
        assert_eq!(record_size(4), None, "adaptive PEBS has its own layout");
    }

    #[test]
    fn bts_records_wrap_without_btint_and_stop_with_it() {
        let ds = DsArea {
            bts_buffer_base: 0x1000,
            bts_index: 0x1000 + 48,
            bts_absolute_maximum: 0x1000 + 72,
            ..Default::default()
        };
        assert_eq!(ds.next_bts(false), Some(0x1000 + 48));
        let full = DsArea { bts_index: 0x1000 + 72, ..ds };
        assert_eq!(full.next_bts(false), Some(0x1000), "circular");
        assert_eq!(full.next_bts(true), None, "BTINT: no record past the absolute maximum");
        assert_eq!(bts_record(1, 2, true)[16..], (1u64 << 4).to_le_bytes(), "predicted: bit 4 of the flags");
    }

    #[test]
    fn adaptive_records_have_the_groups_the_data_cfg_selects() {
        let input = PebsInput {
            xmm: core::array::from_fn(|i| [i as u8; 16]),
            lbr: vec![(0xA, 0xB, 0xC)],
            ..sample_input(1 << 32)
        };
        let basic = adaptive_record(0, &input);
        assert_eq!(basic.len(), 0x20);
        assert_eq!(
            (word(&basic, 0), word(&basic, 8), word(&basic, 0x10), word(&basic, 0x18)),
            (0x20 << 48, 0xFFE, 1 << 32, 0x1234)
        );
        let cfg = PEBS_DATA_CFG_MEMINFO | PEBS_DATA_CFG_GPRS | PEBS_DATA_CFG_XMMS | PEBS_DATA_CFG_LBRS | 1 << 24;
        let r = adaptive_record(cfg, &input);
        assert_eq!(r.len() as u64, 0x20 + 0x20 + 0x90 + 0x100 + 2 * 0x18);
        assert_eq!(word(&r, 0), (r.len() as u64) << 48 | cfg);
        assert_eq!((word(&r, 0x40), word(&r, 0x48)), (0x46, 0x1000), "GPRs: RFLAGS, RIP");
        assert_eq!(
            (word(&r, 0x50), word(&r, 0x58), word(&r, 0x60), word(&r, 0x68)),
            (0x100, 0x102, 0x103, 0x101),
            "RAX RCX RDX RBX"
        );
        assert_eq!((word(&r, 0x70), word(&r, 0x78)), (0x107, 0x106), "RSP RBP");
        assert_eq!(word(&r, 0xC8), 0x10F, "R15");
        assert_eq!(r[0xD0..0xE0], [0; 16], "XMM0");
        assert_eq!(r[0x1C0..0x1D0], [15; 16], "XMM15");
        assert_eq!((word(&r, 0x1D0), word(&r, 0x1D8), word(&r, 0x1E0)), (0xA, 0xB, 0xC), "newest LBR");
        assert_eq!(word(&r, 0x1E8), 0, "a missing LBR entry is 0");
    }

    #[test]
    fn records_stop_at_the_absolute_maximum() {
        let mut bytes = [0u8; DS_AREA_SIZE];
        for (offset, v) in
            [(0x20, 0x5000u64), (0x28, 0x5000 + 0xC8), (0x30, 0x5000 + 2 * 0xC8), (0x38, 0x5000 + 0xC8), (0x48, 7)]
        {
            bytes[offset..offset + 8].copy_from_slice(&u64::to_le_bytes(v));
        }
        let ds = DsArea::parse(&bytes);
        assert_eq!(ds.pebs_counter_reset[1], 7);
        assert_eq!(ds.next_record(0xC8), Some(0x5000 + 0xC8));
        let full = DsArea { pebs_index: 0x5000 + 2 * 0xC8, ..ds };
        assert_eq!(full.next_record(0xC8), None);
        assert_eq!(DsArea { pebs_index: u64::MAX, ..ds }.next_record(0xC8), None);
    }
}
