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
/// The bytes of the area emon reads: the eight fields and the resets of up to 8 GP counters.
pub const DS_AREA_SIZE: usize = 0x80;

/// The PEBS fields of the DS buffer management area.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DsArea {
    pub pebs_buffer_base: u64,
    pub pebs_index: u64,
    pub pebs_absolute_maximum: u64,
    pub pebs_interrupt_threshold: u64,
    pub pebs_counter_reset: [u64; 8],
}

fn field(bytes: &[u8; DS_AREA_SIZE], offset: u64) -> u64 {
    let o = offset as usize;
    u64::from_le_bytes(bytes[o..o + 8].try_into().expect("8 bytes"))
}

impl DsArea {
    /// The area as it lies in guest memory.
    pub fn parse(bytes: &[u8; DS_AREA_SIZE]) -> DsArea {
        let mut reset = [0; 8];
        for (i, r) in (0u64..).zip(reset.iter_mut()) {
            *r = field(bytes, DS_PEBS_COUNTER0_RESET + 8 * i);
        }
        DsArea {
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

/// What a PEBS record holds, from the instruction that triggered the assist.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
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
    /// Format 3: the TSC when the record was written.
    pub tsc: u64,
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

    #[test]
    fn records_have_the_sdms_layout() {
        let input = PebsInput {
            rflags: 0x46,
            rip: 0x1000,
            gprs: core::array::from_fn(|i| 0x100 + i as u64),
            eventing_ip: 0xFFE,
            status: 1,
            tsc: 0x1234,
        };
        let word = |r: &[u8], offset: usize| u64::from_le_bytes(r[offset..offset + 8].try_into().unwrap());
        for format in 0..=3 {
            let r = record(format, &input);
            assert_eq!(r.len() as u64, record_size(format).unwrap());
            assert_eq!((word(&r, 0), word(&r, 8)), (0x46, 0x1000), "RFLAGS, RIP");
            assert_eq!((word(&r, 0x10), word(&r, 0x88)), (0x100, 0x10F), "RAX .. R15");
        }
        let r = record(3, &input);
        assert_eq!((word(&r, 0x90), word(&r, 0x98)), (1, 0), "applicable counters, data linear address");
        assert_eq!((word(&r, 0xB0), word(&r, 0xC0)), (0xFFE, 0x1234), "EventingIP, TSC");
        assert_eq!(record_size(4), None, "adaptive PEBS is not written");
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
