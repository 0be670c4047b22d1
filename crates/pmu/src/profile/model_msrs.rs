//! [`Lbr`] and [`ModelMsrs`]: the model-specific PMU MSRs a profile presents beyond the
//! architectural ones, as the named CPU has them (SDM Vol. 4, the per-model MSR tables; SDM
//! Vol. 3B 17.4.8 for the LBR stack). Absent ones #GP.

/// How a WRMSR treats the bits of one model-specific MSR, as measured on the real CPU: bits it
/// stores, bits it ignores (they read back 0); setting any other bit raises #GP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MsrBits {
    /// Bits a write stores.
    pub bits: u64,
    /// Bits a write ignores.
    pub ignored: u64,
}

impl MsrBits {
    /// The value a WRMSR of `value` stores, or `None` for #GP.
    pub fn write(self, value: u64) -> Option<u64> {
        (value & !(self.bits | self.ignored) == 0).then_some(value & self.bits)
    }
}

/// MSR_LBR_CORE_FROM: LASTBRANCH_0_FROM_IP of Core 2 and Atom (at most 8 entries).
pub const LBR_CORE_FROM: u32 = 0x40;
/// MSR_LBR_CORE_TO: LASTBRANCH_0_TO_IP of Core 2 and Atom.
pub const LBR_CORE_TO: u32 = 0x60;
/// Entries at the Core 2 bases before LASTBRANCH_0_TO_IP (0x60) and IA32_SPEC_CTRL (0x48).
pub const LBR_CORE_MAX_DEPTH: u8 = 8;
/// MSR_LASTBRANCH_0_FROM_IP from Nehalem on (0x680-0x69F).
pub const LBR_NHM_FROM: u32 = 0x680;
/// MSR_LASTBRANCH_0_TO_IP from Nehalem on (0x6C0-0x6DF).
pub const LBR_NHM_TO: u32 = 0x6C0;
/// MSR_LBR_INFO_0 (0xDC0-0xDDF), with LBR format 5 (Skylake on).
pub const LBR_INFO_0: u32 = 0xDC0;
/// The deepest LBR stack emon models (Skylake's 32 entries fill 0x680-0x69F).
pub const LBR_MAX_DEPTH: u8 = 32;
/// MSR_LBR_SELECT bits a profile may make writable: CPL_EQ_0 .. FAR_BRANCH (bits 8:0,
/// Nehalem on) and EN_CALLSTACK (bit 9, Haswell on).
pub const LBR_SELECT_BITS: u64 = 0x3FF;
/// IA32_PERF_CAPABILITIES\[5:0\] LBR_FMT values emon models (SDM 17.4.8.1): 1 64-bit LIP,
/// 2 64-bit EIP, 3 EIP with flags (MISPRED in FROM bit 63), 4 EIP with flags and TSX (FROM bits
/// 63:61), 5 EIP with LBR_INFO.
pub const LBR_FORMATS: std::ops::RangeInclusive<u8> = 1..=5;
/// LBR_FMT 5: the flags live in MSR_LBR_INFO_n.
pub const LBR_FORMAT_INFO: u8 = 5;

/// The last-branch-record stack's MSRs (SDM Vol. 3B 17.4.8; the bases and depth from SDM
/// Vol. 4's table of the named CPU). MSR_LASTBRANCH_TOS (0x1C9) exists with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lbr {
    /// Entries: LASTBRANCH_n for n < depth (4, 8, 16 or 32).
    pub depth: u8,
    /// MSR of LASTBRANCH_0_FROM_IP: [`LBR_CORE_FROM`] or [`LBR_NHM_FROM`].
    pub from: u32,
    /// MSR of LASTBRANCH_0_TO_IP: [`LBR_CORE_TO`] or [`LBR_NHM_TO`].
    pub to: u32,
    /// MSR of LBR_INFO_0 ([`LBR_INFO_0`]) for LBR_FMT 5, else `None`.
    pub info: Option<u32>,
    /// Writable bits of MSR_LBR_SELECT (0x1C8); 0 when the CPU has no such MSR (before Nehalem).
    pub select: u64,
}

/// The model-specific MSRs that qualify events, each `None` where the CPU lacks it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ModelMsrs {
    /// MSR_OFFCORE_RSP_0 (0x1A6) and MSR_OFFCORE_RSP_1 (0x1A7): the OFFCORE_RESPONSE events'
    /// request and response filters (Nehalem has RSP_0 only).
    pub offcore_rsp: [Option<MsrBits>; 2],
    /// MSR_PEBS_LD_LAT (0x3F6): the load-latency threshold of PEBS load-latency sampling.
    pub pebs_ld_lat: Option<MsrBits>,
    /// MSR_PEBS_FRONTEND (0x3F7): the FRONTEND_RETIRED event's qualifiers (Skylake on).
    pub pebs_frontend: Option<MsrBits>,
}
