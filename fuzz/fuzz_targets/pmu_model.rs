//! Fuzz target `pmu_model`: emon's PMU model (`emon_pmu::pmu::Pmu`) under any valid profile, driven
//! by any sequence of guest RDMSR/WRMSR and backend calls (`add_events`, `set_value`,
//! `pmi_delivered`, `rdpmc`).
//!
//! The input decodes (with `arbitrary`) into a profile and a list of operations. The profile is
//! a built-in one, or one built from the fuzz bytes: either clamped into the architectural ranges
//! or taken raw; either way only a profile that passes `Profile::validate` is used. MSR indices
//! are biased towards the trapped PMU ranges and their neighbours, values towards the bit
//! patterns the registers care about.
//!
//! The harness keeps its own model of what the SDM says must happen and panics (a finding) when
//! the PMU disagrees. After every operation:
//! - nothing panicked, and every counter value fits its width (and reads back through RDMSR);
//! - IA32_PERF_GLOBAL_INUSE (v4+), recomputed from PERFEVTSELi[7:0], the FIXED_CTR_CTRL EN
//!   fields and the INT/PMI/PEBS bits, matches the register and `global_inuse()`;
//! - IA32_PERF_GLOBAL_STATUS equals the harness's expectation: a bit is set only by an overflow
//!   from `add_events` (v2+), a STATUS_SET write (v4+), or freeze-on-PMI in `pmi_delivered`
//!   (CTR_Frz / LBR_Frz, v4+), and cleared only through OVF_CTRL / STATUS_RESET;
//! - a PMI is pending exactly when an overflow of a counter with INT/PMI set has not been
//!   delivered yet;
//! - `counter()`/`counting()` agree with the registers (EN, GLOBAL_CTRL, CTR_Frz);
//! - `pebs_adaptive()` names exactly the counters whose Adaptive_Record bit (PERFEVTSELx[34],
//!   FIXED_CTR_CTRL[32 + 4i]) is set, bits that exist exactly with PEBS_BASELINE;
//! - `prefetchers_on()` is the profile's prefetchers less those MSR_MISC_FEATURE_CONTROL bits 3:0
//!   or (Core 2, NetBurst) IA32_MISC_ENABLE bits 9, 19, 37, 39 turn off; 0x1A4 exists with the
//!   profile's writable bits, the MISC_ENABLE bits are writable exactly for present prefetchers;
//! - what a general-purpose counter counts (`CounterState::semantics`) is what the harness makes
//!   of its PERFEVTSEL: an architectural event on any counter, else the event of the profile's
//!   model-specific list its encoding names, on the counters the list gives it (else
//!   `WrongCounter`), else `Unsupported` (README, "Model-specific events");
//! - a change of how a counter counts marks that counter for reprogramming (`take_reprogram`),
//!   and a guest write of a counter's value marks it as written.
//!
//! And per operation:
//! - RDMSR is side-effect free (the whole `Pmu` compares equal before and after), succeeds exactly
//!   for the MSRs the profile declares, and only for MSRs emon traps;
//! - a WRMSR that returns #GP changes nothing (whole `Pmu` compared); one that succeeds changes
//!   only its own register (every other PMU MSR reads the same), reads back as the SDM says
//!   (sign-extended legacy PMC writes, truncated fixed counters, read-only MISC_ENABLE bits...),
//!   and is accepted or refused where the SDM decides (reserved bits, read-only registers);
//! - writing back the value an RDMSR returned is accepted and changes nothing;
//! - `add_events` wraps modulo 2^width and reports the overflow exactly; `set_value` only sets the
//!   value; RDPMC selects, truncates and faults as the SDM says.
#![no_main]

use std::fmt;
use std::sync::OnceLock;

use arbitrary::Arbitrary;
use emon_pmu::events::{meaning, EventList, ModelEvent, LISTS};
use emon_pmu::pmu::counter::width_mask;
use emon_pmu::pmu::lbr::{Branch, BranchType};
use emon_pmu::pmu::regs::{MISC_ENABLE_READ_ONLY, MISC_ENABLE_WRITABLE};
use emon_pmu::pmu::{CounterId, CounterState, GpFault, Pmu, Semantics};
use emon_pmu::profile::{
    describe_leaf_0a, Cache, Clock, Lbr, ModelMsrs, MsrBits, PmuKind, PmuProfile, PrefetcherSet, Prefetchers, Profile,
    Streamer,
};
use libfuzzer_sys::fuzz_target;

// ---------------------------------------------------------------------------------------------
// Input
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Arbitrary)]
struct Input {
    profile: ProfileChoice,
    /// The hardware prefetchers and their control register (a built-in profile keeps its own).
    prefetchers: RawPrefetchers,
    ops: Vec<Op>,
}

/// `[cache.prefetchers]` as arbitrary bytes: which prefetchers (bits 0-3: streamer, adjacent
/// line, DCU, IP stride), and the control: none, MSR_MISC_FEATURE_CONTROL with `bits` (which
/// validation wants to hold each present prefetcher's disable bit), or IA32_MISC_ENABLE.
#[derive(Debug, Clone, Copy, Arbitrary)]
struct RawPrefetchers {
    present: u8,
    control: u8,
    bits: u64,
}

impl RawPrefetchers {
    fn build(self) -> Prefetchers {
        let has = |b: u8| self.present & 1 << b != 0;
        let streamer = has(0).then_some(Streamer { distance: 20, pages: 32 });
        let (misc_feature_control, misc_enable) = match self.control % 3 {
            0 => (None, false),
            1 => (Some(self.bits), false),
            _ => (None, true),
        };
        Prefetchers { dcu: has(2), ip_stride: has(3), streamer, adjacent_line: has(1), misc_feature_control, misc_enable }
    }
}

/// The profile fields, as arbitrary bytes.
#[derive(Debug, Clone, Arbitrary)]
struct RawProfile {
    version: u8,
    gp: u8,
    gp_width: u8,
    ebx_length: u8,
    ebx_unavailable: u32,
    fixed: u8,
    fixed_width: u8,
    fixed_bitmap: u32,
    perf_capabilities: u64,
    misc_enable_perfmon: bool,
    nominal_mhz: u32,
    /// Which LBR stack (none, Core 2's, Nehalem's, Skylake's) and its LBR_SELECT bits.
    lbr: u8,
    lbr_select: u64,
    /// Which of OFFCORE_RSP_0/1, PEBS_LD_LAT, PEBS_FRONTEND exist (bits 0-3), with their
    /// stored and ignored bits.
    msrs: u8,
    msr_bits: [u64; 4],
    msr_ignored: [u64; 4],
    /// `pmu.kind = "netburst"` (validation must reject it outside family 0FH).
    netburst: bool,
    /// Which model-specific event list (none, or one of `LISTS`), whatever the counters.
    events: u8,
}

#[derive(Debug, Arbitrary)]
enum ProfileChoice {
    /// One of `Profile::builtin_names()`, modulo their number.
    Builtin(u8),
    /// Fields folded into their legal ranges (nearly always valid).
    Clamped(RawProfile),
    /// Fields as they come (mostly rejected by validation; exercises it).
    Raw(RawProfile),
    /// The NetBurst PMU (SDM 18.15) of a family 0FH part, with `nominal_mhz`.
    NetBurst(u16),
}

/// The PMU MSR ranges emon traps (inclusive): the architectural ones, then the model-specific
/// ones (LBR banks at 0x40/0x60 and 0x680/0x6C0/0xDC0, OFFCORE_RSP, LBR_SELECT/TOS, PEBS_LD_LAT
/// and PEBS_FRONTEND, LER_FROM/TO), then NetBurst's (counters, CCCRs, ESCRs, TC_PRECISE_EVENT).
const PMU_RANGES: [(u32, u32); 24] = [
    (0xC1, 0xC8),
    (0x186, 0x18D),
    (0x309, 0x30C),
    (0x345, 0x345),
    (0x38D, 0x392),
    (0x1A0, 0x1A0),
    (0x1A4, 0x1A4),
    (0x1D9, 0x1D9),
    (0x3F1, 0x3F2),
    (0x600, 0x600),
    (0x4C1, 0x4C8),
    (0x40, 0x47),
    (0x60, 0x67),
    (0x1A6, 0x1A7),
    (0x1C8, 0x1C9),
    (0x1DD, 0x1DE),
    (0x3F6, 0x3F7),
    (0x680, 0x69F),
    (0x6C0, 0x6DF),
    (0xDC0, 0xDDF),
    (0x300, 0x311),
    (0x360, 0x371),
    (0x3A0, 0x3E1),
    (0x3F0, 0x3F2),
];

#[derive(Debug, Clone, Copy, Arbitrary)]
enum Msr {
    /// An MSR of a PMU range.
    Pmu { range: u8, offset: u8 },
    /// Around a PMU range's start: its neighbours below and above.
    Near { range: u8, delta: i8 },
    /// Any index at all.
    Any(u32),
}

impl Msr {
    fn index(self) -> u32 {
        let range = |r: u8| PMU_RANGES[usize::from(r) % PMU_RANGES.len()];
        match self {
            Msr::Pmu { range: r, offset } => {
                let (lo, hi) = range(r);
                lo + u32::from(offset) % (hi - lo + 1)
            }
            Msr::Near { range: r, delta } => range(r).0.wrapping_add_signed(i32::from(delta)),
            Msr::Any(i) => i,
        }
    }
}

#[derive(Debug, Clone, Copy, Arbitrary)]
enum Value {
    Raw(u64),
    Low32(u32),
    Zero,
    Ones,
    Bit(u8),
    /// The MSR's current value (0 if it faults) with one bit flipped.
    Flip(u8),
    /// A PERFEVTSEL-shaped value: event, umask, flag byte (bits 23:16), CMASK, and
    /// Adaptive_Record (bit 34).
    EvtSel {
        event: u8,
        umask: u8,
        flags: u8,
        cmask: u8,
        adaptive: bool,
    },
    /// GLOBAL_*-shaped: GP bits 7:0, fixed bits 35:32, bits 63:48.
    Global {
        gp: u8,
        fixed: u8,
        high: u16,
    },
    /// A few chosen bits (DEBUGCTL freeze bits, CTR_Frz, INT | EN...).
    Bits([u8; 3]),
    /// The encoding of event `event` (modulo their number) of the profile's model-specific list,
    /// with its CMASK/INV/EDGE/ANY, `flags` (bits 23:16: USR, OS, E, PC, INT, ANY, EN, INV)
    /// ORed in, and `umask` for an event that names no umask (0 without a list).
    Listed {
        event: u16,
        flags: u8,
        umask: u8,
    },
    /// A NetBurst CCCR: ESCR select, active thread, and `flags` bits 0-6 for ENABLE, CASCADE,
    /// FORCE_OVF, OVF_PMI_T0, OVF, COMPARE and OVF_PMI_T1.
    Cccr {
        select: u8,
        thread: u8,
        flags: u8,
    },
    /// A NetBurst ESCR: event select (30:25), event mask (24:9), and the T0/T1 OS/USR and tag
    /// bits (4:0).
    Escr {
        event: u8,
        mask: u16,
        flags: u8,
    },
}

impl Value {
    fn resolve(self, msr: u32, pmu: &Pmu) -> u64 {
        match self {
            Value::Raw(v) => v,
            Value::Low32(v) => u64::from(v),
            Value::Zero => 0,
            Value::Ones => u64::MAX,
            Value::Bit(b) => 1u64 << (b % 64),
            Value::Flip(b) => pmu.rdmsr(msr).unwrap_or(0) ^ (1u64 << (b % 64)),
            Value::EvtSel { event, umask, flags, cmask, adaptive } => {
                u64::from(event)
                    | u64::from(umask) << 8
                    | u64::from(flags) << 16
                    | u64::from(cmask) << 24
                    | u64::from(adaptive) << 34
            }
            Value::Global { gp, fixed, high } => u64::from(gp) | u64::from(fixed & 0xF) << 32 | u64::from(high) << 48,
            Value::Bits(bits) => bits.iter().fold(0, |v, b| v | 1u64 << (b % 64)),
            Value::Listed { event, flags, umask } => {
                listed(pmu.profile().events, event).map_or(0, |e| encoding(e, umask) | u64::from(flags) << 16)
            }
            Value::Cccr { select, thread, flags } => {
                let f = |b: u8, at: u32| u64::from(flags >> b & 1) << at;
                u64::from(select & 7) << 13
                    | u64::from(thread & 3) << 16
                    | f(0, 12)
                    | f(1, 30)
                    | f(2, 25)
                    | f(3, 26)
                    | f(4, 31)
                    | f(5, 18)
                    | f(6, 27)
            }
            Value::Escr { event, mask, flags } => {
                u64::from(event & 0x3F) << 25 | u64::from(mask) << 9 | u64::from(flags & 0x1F)
            }
        }
    }
}

#[derive(Debug, Clone, Copy, Arbitrary)]
enum Ctr {
    /// IA32_PMC(i % 10): some beyond any profile.
    Gp(u8),
    /// IA32_FIXED_CTR(i % 6): some beyond any profile.
    Fixed(u8),
    /// Any id.
    RawGp(u8),
    RawFixed(u8),
    /// NetBurst counter i % 20: some beyond the 18.
    NetBurst(u8),
}

impl Ctr {
    fn id(self) -> CounterId {
        match self {
            Ctr::Gp(i) => CounterId::Gp(i % 10),
            Ctr::Fixed(i) => CounterId::Fixed(i % 6),
            Ctr::RawGp(i) => CounterId::Gp(i),
            Ctr::RawFixed(i) => CounterId::Fixed(i),
            Ctr::NetBurst(i) => CounterId::NetBurst(i % 20),
        }
    }
}

#[derive(Debug, Clone, Copy, Arbitrary)]
enum Count {
    Raw(u64),
    Small(u16),
    /// Exactly `distance_to_overflow`.
    ToOverflow,
    /// `distance_to_overflow - 1 - k`.
    Short(u8),
    /// `distance_to_overflow + k`.
    Past(u32),
}

#[derive(Debug, Arbitrary)]
enum Op {
    Rdmsr(Msr),
    Wrmsr(Msr, Value),
    /// RDMSR, then WRMSR of the value read.
    WriteBack(Msr),
    AddEvents(Ctr, Count),
    SetValue(Ctr, u64),
    PmiDelivered,
    Rdpmc {
        ecx: u32,
        cpl: u8,
        pce: bool,
    },
    /// Make a counter count, as a guest does: WRMSRs of its PERFEVTSEL (event, USR, OS, EN,
    /// INT if `int`) or its FIXED_CTR_CTRL field, then of its GLOBAL_CTRL bit (v2+).
    Arm {
        ctr: Ctr,
        event: u8,
        int: bool,
    },
    /// Make a general-purpose counter count event `event` (modulo their number) of the profile's
    /// model-specific list, as a guest programs it (its encoding with USR, OS, EN, INT if `int`,
    /// `umask` for an event that names none), then its GLOBAL_CTRL bit: on the counters the list
    /// gives it or on any other.
    ArmListed {
        ctr: u8,
        event: u16,
        umask: u8,
        int: bool,
    },
    /// WRMSR IA32_DEBUGCTL with FREEZE_LBRS_ON_PMI / FREEZE_PERFMON_ON_PMI / LBR from `bits`.
    Freeze(u8),
    /// A taken branch the backend hands the LBR stack (addresses made canonical, `kind` modulo
    /// the seven LBR_SELECT types, `cpl` modulo 4).
    Branch {
        from: u64,
        to: u64,
        kind: u8,
        cpl: u8,
        mispredicted: bool,
        cycles: u32,
        event: bool,
    },
}

/// The LBR_SELECT types in bit order (bits 2-8).
const BRANCH_TYPES: [BranchType; 7] = [
    BranchType::Jcc,
    BranchType::NearRelCall,
    BranchType::NearIndCall,
    BranchType::NearRet,
    BranchType::NearIndJmp,
    BranchType::NearRelJmp,
    BranchType::Far,
];

/// `v` sign-extended from bit 47: a canonical address.
fn canonical(v: u64) -> u64 {
    (((v << 16) as i64) >> 16) as u64
}

// ---------------------------------------------------------------------------------------------
// Profiles
// ---------------------------------------------------------------------------------------------

fn builtins() -> &'static [Profile] {
    static BUILTINS: OnceLock<Vec<Profile>> = OnceLock::new();
    BUILTINS.get_or_init(|| {
        Profile::builtin_names().into_iter().map(|n| Profile::load(n).expect("built-in profiles are valid")).collect()
    })
}

impl RawProfile {
    fn raw(&self) -> PmuProfile {
        PmuProfile {
            version: self.version,
            gp: self.gp,
            gp_width: self.gp_width,
            ebx_length: self.ebx_length,
            ebx_unavailable: self.ebx_unavailable,
            fixed: self.fixed,
            fixed_width: self.fixed_width,
            fixed_bitmap: self.fixed_bitmap,
            perf_capabilities: self.perf_capabilities,
            misc_enable_perfmon: self.misc_enable_perfmon,
            nominal_mhz: self.nominal_mhz,
            lbr: self.stack(self.perf_capabilities & 0x3F == 5),
            msrs: self.model_msrs(|bits, ignored| MsrBits { bits, ignored }),
            kind: if self.netburst { PmuKind::NetBurst } else { PmuKind::Architectural },
            events: self.events(),
        }
    }

    /// The event list `events` picks: none, or one of the shipped lists.
    fn events(&self) -> Option<&'static EventList> {
        usize::from(self.events).checked_rem(LISTS.len() + 1).and_then(|i| i.checked_sub(1)).map(|i| LISTS[i])
    }

    /// The LBR stack `lbr` picks, with LBR_INFO if `info`.
    fn stack(&self, info: bool) -> Option<Lbr> {
        let (depth, from, to) = match self.lbr % 4 {
            0 => return None,
            1 => (4, 0x40, 0x60),
            2 => (16, 0x680, 0x6C0),
            _ => (32, 0x680, 0x6C0),
        };
        Some(Lbr { depth, from, to, info: info.then_some(0xDC0), select: self.lbr_select })
    }

    /// The model-specific MSRs `msrs` picks, their bits made by `make`.
    fn model_msrs(&self, make: impl Fn(u64, u64) -> MsrBits) -> ModelMsrs {
        let pick = |i: usize| (self.msrs & 1 << i != 0).then(|| make(self.msr_bits[i], self.msr_ignored[i]));
        ModelMsrs { offcore_rsp: [pick(0), pick(1)], pebs_ld_lat: pick(2), pebs_frontend: pick(3) }
    }

    /// Fold every field into the range `validate.rs` accepts for the chosen version.
    fn clamped(&self) -> PmuProfile {
        let version = self.version % 6;
        let width = |w: u8| 32 + w % 33;
        let mut p = PmuProfile {
            version,
            gp: 0,
            gp_width: 0,
            ebx_length: 0,
            ebx_unavailable: 0,
            fixed: 0,
            fixed_width: 0,
            fixed_bitmap: 0,
            perf_capabilities: 0,
            misc_enable_perfmon: self.misc_enable_perfmon,
            nominal_mhz: 100 + self.nominal_mhz % 9901,
            ..PmuProfile::default()
        };
        if version == 0 {
            return p;
        }
        p.gp = 1 + self.gp % 8;
        p.gp_width = width(self.gp_width);
        p.ebx_length = 1 + self.ebx_length % 8;
        p.ebx_unavailable = self.ebx_unavailable & ((1u32 << p.ebx_length) - 1);
        if version >= 2 {
            p.fixed = self.fixed % 5;
            if version >= 5 {
                p.fixed_bitmap = self.fixed_bitmap & 0xF;
            }
            if p.fixed > 0 || p.fixed_bitmap != 0 {
                p.fixed_width = width(self.fixed_width);
            }
        }
        p.perf_capabilities = self.perf_capabilities & emon_pmu::profile::PERF_CAPABILITIES_ACCEPTED;
        if version < 2 {
            p.perf_capabilities &= !PmuProfile::FW_WRITE;
        }
        // An LBR stack in a format emon models (or none named, without PDCM).
        let format = p.perf_capabilities & 0x3F;
        if p.perf_capabilities == 0 || (1..=5).contains(&format) {
            p.lbr = self.stack(format == 5).map(|l| Lbr { select: l.select & 0x3FF, ..l });
        }
        p.msrs = self.model_msrs(|bits, ignored| MsrBits { bits, ignored: ignored & !bits });
        p.events = self.events();
        p
    }
}

impl ProfileChoice {
    /// The profile to fuzz under, with `prefetchers` unless it is a built-in one, if it is valid.
    fn build(&self, mut prefetchers: Prefetchers) -> Option<(PmuProfile, Prefetchers)> {
        let mut family = 6;
        if !matches!(self, ProfileChoice::Raw(_)) {
            // Folded valid: MSR_MISC_FEATURE_CONTROL can turn off every prefetcher present.
            let required = required_disable_bits(&prefetchers);
            prefetchers.misc_feature_control = prefetchers.misc_feature_control.map(|b| b | required);
        }
        let pmu = match self {
            ProfileChoice::Builtin(i) => {
                let all = builtins();
                let p = &all[usize::from(*i) % all.len()];
                return Some((p.pmu.clone(), p.cache.prefetchers));
            }
            ProfileChoice::Clamped(raw) => raw.clamped(),
            ProfileChoice::Raw(raw) => raw.raw(),
            ProfileChoice::NetBurst(mhz) => {
                family = 0xF;
                PmuProfile {
                    kind: PmuKind::NetBurst,
                    misc_enable_perfmon: true,
                    nominal_mhz: 100 + u32::from(*mhz) % 9901,
                    ..PmuProfile::default()
                }
            }
        };
        let profile = Profile {
            name: "fuzz".into(),
            description: "fuzz".into(),
            vendor: "GenuineIntel".into(),
            family,
            model: if family == 0xF { 4 } else { 0x5E },
            stepping: 3,
            brand: None,
            microcode: None,
            pmu,
            cache: Cache { prefetchers, ..Cache::default() },
            clock: Clock::default(),
        };
        // Exercise the description code too: it must not panic on any profile.
        let _ = describe_leaf_0a(&profile.pmu);
        let valid = profile.validate().is_ok();
        if let ProfileChoice::Clamped(_) | ProfileChoice::NetBurst(_) = self {
            assert!(valid, "clamped profile rejected by validation: {:?}", profile.validate());
        }
        valid.then_some((profile.pmu, prefetchers))
    }
}

// ---------------------------------------------------------------------------------------------
// The harness's own view of the PMU a profile declares (SDM 18.2, independent of emon's Layout)
// ---------------------------------------------------------------------------------------------

struct Shape {
    /// The hardware prefetchers and their control (restated below, not emon's tables).
    prefetchers: Prefetchers,
    version: u8,
    gp: u8,
    gp_width: u8,
    fixed_width: u8,
    fixed: [bool; 4],
    fw_write: bool,
    perf_capabilities: u64,
    misc_enable_perfmon: bool,
    lbr: Option<Lbr>,
    msrs: ModelMsrs,
    /// The NetBurst PMU (then `version` is 0 and none of the architectural counters exist).
    netburst: bool,
    /// The CPU's model-specific event list.
    events: Option<&'static EventList>,
}

/// Event `event` (modulo their number) of `list`.
fn listed(list: Option<&'static EventList>, event: u16) -> Option<&'static ModelEvent> {
    let l = list?;
    l.events.get(usize::from(event) % l.events.len().max(1))
}

/// PERFEVTSEL's encoding of `e` (event, umask or `umask` where it names none, E, ANY, INV,
/// CMASK).
fn encoding(e: &ModelEvent, umask: u8) -> u64 {
    u64::from(e.select)
        | u64::from(e.umask.unwrap_or(umask)) << 8
        | u64::from(e.edge) << 18
        | u64::from(e.any) << 21
        | u64::from(e.inv) << 23
        | u64::from(e.cmask) << 24
}

/// What general-purpose counter `i` counts with PERFEVTSEL `sel` under `list`, as README "Model-
/// specific events" says it, restated from the list's rows: an architectural event (SDM Table
/// 18-1) counts on any counter; an encoding of the list counts its plain event's meaning on the
/// counters of its rows defined with the same CMASK/INV/EDGE (else of its plain rows, else of any
/// of them), and on those the list's whole-select rows allow, and is `WrongCounter` elsewhere; any
/// other encoding is `Unsupported`.
fn expected_semantics(list: Option<&'static EventList>, i: u8, sel: u64) -> Semantics {
    let (select, umask) = (sel as u8, (sel >> 8) as u8);
    let (edge, inv, cmask) = (sel >> 18 & 1 == 1, sel >> 23 & 1 == 1, (sel >> 24) as u8);
    let arch = emon_pmu::pmu::arch_semantics(CounterId::Gp(i), select, umask);
    if arch != Semantics::Unsupported {
        return arch;
    }
    let Some(list) = list else { return Semantics::Unsupported };
    let gp = |r: &&ModelEvent| r.counters & 0xFF != 0;
    let on = |r: &&ModelEvent| r.counters >> i & 1 == 1;
    let whole: Vec<&ModelEvent> =
        list.events.iter().filter(gp).filter(|r| r.select == select && r.umask.is_none()).collect();
    let select_allows = whole.is_empty() || whole.iter().any(on);
    let rows: Vec<&ModelEvent> =
        list.events.iter().filter(gp).filter(|r| r.select == select && r.umask == Some(umask)).collect();
    let plain = |r: &&&ModelEvent| r.cmask == 0 && !r.inv && !r.edge && !r.any;
    if rows.is_empty() {
        // README, "Model-specific events": the pseudo-encoding of one fixed counter's event.
        let fixed: Vec<&ModelEvent> = list
            .events
            .iter()
            .filter(|r| r.counters & 0xFF == 0 && r.select == select && r.umask == Some(umask))
            .collect();
        let one_fixed_event = fixed.first().is_some_and(|f| fixed.iter().all(|r| r.counters == f.counters));
        return if one_fixed_event || !(whole.is_empty() || select_allows) {
            Semantics::WrongCounter
        } else {
            Semantics::Unsupported
        };
    }
    let same: Vec<&&ModelEvent> = rows.iter().filter(|r| (r.cmask, r.inv, r.edge) == (cmask, inv, edge)).collect();
    let plains: Vec<&&ModelEvent> = rows.iter().filter(plain).collect();
    let chosen = if !same.is_empty() {
        same
    } else if !plains.is_empty() {
        plains.clone()
    } else {
        rows.iter().collect()
    };
    if !(chosen.iter().any(|r| on(r)) && select_allows) {
        return Semantics::WrongCounter;
    }
    plains.iter().find_map(|r| meaning(list.name, r.name)).unwrap_or(Semantics::Unsupported)
}

/// What an MSR index names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reg {
    Pmc(u8),
    APmc(u8),
    EvtSel(u8),
    FixedCtr(u8),
    PerfCap,
    FixedCtrCtrl,
    Status,
    Ctrl,
    OvfCtrl,
    StatusSet,
    Inuse,
    DebugCtl,
    MiscEnable,
    /// MSR_MISC_FEATURE_CONTROL: the prefetchers' control, where the profile's CPU has it.
    MiscFeatureControl,
    PebsEnable,
    DsArea,
    /// MSR_PEBS_DATA_CFG (adaptive PEBS).
    PebsDataCfg,
    /// MSR_LASTBRANCH_i_FROM_IP / TO_IP of the bank at `base`; MSR_LBR_INFO_i.
    LbrFrom {
        base: u32,
        i: u8,
    },
    LbrTo {
        base: u32,
        i: u8,
    },
    LbrInfo(u8),
    LbrSelect,
    LbrTos,
    /// MSR_LER_FROM_LIP (0), MSR_LER_TO_LIP (1).
    Ler(u8),
    /// OFFCORE_RSP_0/1 (0, 1), PEBS_LD_LAT (2), PEBS_FRONTEND (3).
    Qualifier(u8),
}

fn reg(msr: u32) -> Option<Reg> {
    let idx = |base: u32, n: u32| msr.checked_sub(base).filter(|&i| i < n).map(|i| i as u8);
    Some(match msr {
        0x345 => Reg::PerfCap,
        0x38D => Reg::FixedCtrCtrl,
        0x38E => Reg::Status,
        0x38F => Reg::Ctrl,
        0x390 => Reg::OvfCtrl,
        0x391 => Reg::StatusSet,
        0x392 => Reg::Inuse,
        0x1D9 => Reg::DebugCtl,
        0x1A0 => Reg::MiscEnable,
        0x1A4 => Reg::MiscFeatureControl,
        0x3F1 => Reg::PebsEnable,
        0x600 => Reg::DsArea,
        0x3F2 => Reg::PebsDataCfg,
        0x1C8 => Reg::LbrSelect,
        0x1C9 => Reg::LbrTos,
        0x1DD | 0x1DE => Reg::Ler((msr - 0x1DD) as u8),
        0x1A6 | 0x1A7 => Reg::Qualifier((msr - 0x1A6) as u8),
        0x3F6 | 0x3F7 => Reg::Qualifier((msr - 0x3F6 + 2) as u8),
        _ => {
            return idx(0xC1, 8)
                .map(Reg::Pmc)
                .or_else(|| idx(0x4C1, 8).map(Reg::APmc))
                .or_else(|| idx(0x186, 8).map(Reg::EvtSel))
                .or_else(|| idx(0x309, 4).map(Reg::FixedCtr))
                .or_else(|| idx(0x40, 8).map(|i| Reg::LbrFrom { base: 0x40, i }))
                .or_else(|| idx(0x680, 32).map(|i| Reg::LbrFrom { base: 0x680, i }))
                .or_else(|| idx(0x60, 8).map(|i| Reg::LbrTo { base: 0x60, i }))
                .or_else(|| idx(0x6C0, 32).map(|i| Reg::LbrTo { base: 0x6C0, i }))
                .or_else(|| idx(0xDC0, 32).map(Reg::LbrInfo))
        }
    })
}

/// Do bits 47..=top of `value` all equal bit 47?
fn sign_extended_from_47(value: u64, top: u32) -> bool {
    let field = (value >> 47) & ((1u64 << (top - 47 + 1)) - 1);
    field == 0 || field == (1u64 << (top - 47 + 1)) - 1
}

/// Every MSR index of the trapped ranges.
fn all_pmu_msrs() -> impl Iterator<Item = u32> {
    PMU_RANGES.iter().flat_map(|&(lo, hi)| lo..=hi)
}

const INUSE_PMI: u64 = 1 << 63;

/// Each prefetcher's disable bit in MSR_MISC_FEATURE_CONTROL and in IA32_MISC_ENABLE (Intel's
/// disclosure; SDM Vol. 4, Core 2).
const PREFETCH_BITS: [(PrefetcherSet, u64, u64); 4] = [
    (PrefetcherSet::STREAMER, 1 << 0, 1 << 9),
    (PrefetcherSet::ADJACENT_LINE, 1 << 1, 1 << 19),
    (PrefetcherSet::DCU, 1 << 2, 1 << 37),
    (PrefetcherSet::IP_STRIDE, 1 << 3, 1 << 39),
];

/// The MSR_MISC_FEATURE_CONTROL bits of the prefetchers `p` has (validation wants them writable).
fn required_disable_bits(p: &Prefetchers) -> u64 {
    PREFETCH_BITS.iter().filter(|(s, ..)| p.present().contains(*s)).fold(0, |m, (_, b, _)| m | b)
}

impl Shape {
    /// IA32_MISC_ENABLE's bits that turn prefetchers off: those of the present ones, where the
    /// CPU controls them there.
    fn misc_enable_prefetch(&self) -> u64 {
        if !self.prefetchers.misc_enable {
            return 0;
        }
        PREFETCH_BITS.iter().filter(|(s, ..)| self.prefetchers.present().contains(*s)).fold(0, |m, (.., b)| m | b)
    }

    /// The prefetchers left on by MSR_MISC_FEATURE_CONTROL = `feature` and IA32_MISC_ENABLE = `misc`.
    fn prefetchers_on(&self, feature: u64, misc: u64) -> PrefetcherSet {
        let feature = if self.prefetchers.misc_feature_control.is_some() { feature } else { 0 };
        let misc = misc & self.misc_enable_prefetch();
        PREFETCH_BITS
            .iter()
            .filter(|(s, f, m)| self.prefetchers.present().contains(*s) && feature & f == 0 && misc & m == 0)
            .fold(PrefetcherSet::NONE, |on, (s, ..)| on.union(*s))
    }

    fn new(p: &PmuProfile, prefetchers: Prefetchers) -> Shape {
        let mut fixed = [false; 4];
        for (i, f) in fixed.iter_mut().enumerate() {
            // SDM 18.2.5: counter i exists if EDX[4:0] > i, or (v5) ECX bit i.
            *f = p.version >= 2 && (i < usize::from(p.fixed) || (p.version >= 5 && p.fixed_bitmap & (1 << i) != 0));
        }
        Shape {
            prefetchers,
            version: p.version,
            gp: if p.version >= 1 { p.gp } else { 0 },
            gp_width: p.gp_width,
            fixed_width: p.fixed_width,
            fixed,
            fw_write: p.perf_capabilities & (1 << 13) != 0,
            perf_capabilities: p.perf_capabilities,
            misc_enable_perfmon: p.misc_enable_perfmon,
            lbr: p.lbr,
            msrs: p.msrs,
            netburst: p.kind == PmuKind::NetBurst,
            events: p.events,
        }
    }

    /// The bits of model-specific qualifier MSR `i` (OFFCORE_RSP_0/1, PEBS_LD_LAT, PEBS_FRONTEND).
    fn qualifier(&self, i: u8) -> Option<MsrBits> {
        let m = &self.msrs;
        [m.offcore_rsp[0], m.offcore_rsp[1], m.pebs_ld_lat, m.pebs_frontend][usize::from(i)]
    }

    fn gp_bits(&self) -> u64 {
        (1u64 << self.gp) - 1
    }

    fn fixed_bits(&self) -> u64 {
        (0..4).filter(|&i| self.fixed[i]).fold(0, |m, i| m | 1u64 << (32 + i))
    }

    fn counter_exists(&self, id: CounterId) -> bool {
        match id {
            CounterId::Gp(i) => i < self.gp,
            CounterId::Fixed(i) => self.fixed.get(usize::from(i)).copied().unwrap_or(false),
            CounterId::NetBurst(i) => self.netburst && i < NB_COUNTERS,
        }
    }

    fn width(&self, id: CounterId) -> u8 {
        match id {
            CounterId::Gp(_) => self.gp_width,
            CounterId::Fixed(_) => self.fixed_width,
            CounterId::NetBurst(_) => 40,
        }
    }

    fn ids(&self) -> Vec<CounterId> {
        if self.netburst {
            return (0..NB_COUNTERS).map(CounterId::NetBurst).collect();
        }
        let gp = (0..self.gp).map(CounterId::Gp);
        let fixed = (0..4u8).filter(|&i| self.fixed[usize::from(i)]).map(CounterId::Fixed);
        gp.chain(fixed).collect()
    }

    /// Does RDMSR of `msr` succeed under this profile?
    fn exists(&self, msr: u32) -> bool {
        let v = self.version;
        if self.netburst && nb_in_ranges(msr) {
            return nb_reg(msr).is_some();
        }
        match reg(msr) {
            None => false,
            Some(Reg::Pmc(i) | Reg::EvtSel(i)) => i < self.gp,
            Some(Reg::APmc(i)) => i < self.gp && self.fw_write,
            Some(Reg::FixedCtr(i)) => self.fixed[usize::from(i)],
            Some(Reg::PerfCap) => self.perf_capabilities != 0,
            Some(Reg::FixedCtrCtrl | Reg::Status | Reg::Ctrl | Reg::OvfCtrl) => v >= 2,
            Some(Reg::StatusSet | Reg::Inuse) => v >= 4,
            Some(Reg::DebugCtl | Reg::MiscEnable) => true,
            Some(Reg::MiscFeatureControl) => self.prefetchers.misc_feature_control.is_some(),
            // IA32_DS_AREA exists on NetBurst too (SDM 18.15.7).
            Some(Reg::DsArea) => v >= 1 || self.netburst,
            Some(Reg::PebsEnable) => v >= 1,
            // PERF_CAPABILITIES.PEBS_BASELINE (bit 14) enumerates it (SDM 18.9.2.2).
            Some(Reg::PebsDataCfg) => v >= 1 && self.perf_capabilities & 1 << 14 != 0,
            Some(Reg::LbrFrom { base, i }) => self.lbr.is_some_and(|l| l.from == base && i < l.depth),
            Some(Reg::LbrTo { base, i }) => self.lbr.is_some_and(|l| l.to == base && i < l.depth),
            Some(Reg::LbrInfo(i)) => self.lbr.is_some_and(|l| l.info.is_some() && i < l.depth),
            Some(Reg::LbrTos | Reg::Ler(_)) => self.lbr.is_some(),
            Some(Reg::LbrSelect) => self.lbr.is_some_and(|l| l.select != 0),
            Some(Reg::Qualifier(i)) => self.qualifier(i).is_some(),
        }
    }

    /// PERF_CAPABILITIES.PEBS_BASELINE (bit 14): adaptive PEBS, under architectural perfmon.
    fn baseline(&self) -> bool {
        self.version >= 1 && self.perf_capabilities & 1 << 14 != 0
    }

    /// Must WRMSR(`msr`, `value`) succeed (`Some(true)`) or #GP (`Some(false)`) by the SDM?
    /// `None` where emon's choice is a policy beyond the SDM (DEBUGCTL, MISC_ENABLE,
    /// PEBS_ENABLE and DS_AREA bits), checked by read-back only.
    fn write_ok(&self, msr: u32, value: u64) -> Option<bool> {
        if !self.exists(msr) {
            return Some(false);
        }
        let v = self.version;
        if self.netburst {
            match nb_reg(msr) {
                // ESCR bit 31 #GPs (as measured); everything else is ignored, never #GP.
                Some(NbReg::Escr { .. }) => return Some(value & 1 << 31 == 0),
                Some(_) => return Some(true),
                None => {}
            }
            // MSR_DEBUGCTLA (SDM 17.5.1): bits 6:0, the others #GP (as measured).
            if reg(msr) == Some(Reg::DebugCtl) {
                return Some(value & !0x7F == 0);
            }
        }
        // Bit 48, EN_PERF_METRICS / PERF_METRICS_OVF, with PERF_CAPABILITIES[15] (SDM 18.3.9.3).
        let metrics = if v >= 2 && self.perf_capabilities & 1 << 15 != 0 { 1 << 48 } else { 0 };
        let counters = self.gp_bits() | self.fixed_bits() | metrics;
        let fits = |valid: u64| Some(value & !valid == 0);
        match reg(msr)? {
            // Legacy writes take EAX sign-extended: any value; fixed counters drop high bits.
            Reg::Pmc(_) | Reg::FixedCtr(_) => Some(true),
            Reg::APmc(_) => fits(width_mask(self.gp_width)),
            // Bits 63:32 reserved but Adaptive_Record (bit 34) with PEBS_BASELINE (SDM 18.9.2.2);
            // ANY (bit 21) only from v3.
            Reg::EvtSel(_) => {
                let any = if v >= 3 { 0xFFFF_FFFF } else { 0xFFFF_FFFF & !(1 << 21) };
                fits(any | if self.baseline() { 1 << 34 } else { 0 })
            }
            Reg::PerfCap | Reg::Status | Reg::Inuse => Some(false),
            // Each counter's field, and its Adaptive_Record bit (32 + 4i) with PEBS_BASELINE.
            Reg::FixedCtrCtrl => {
                let field = if v >= 3 { 0xF } else { 0xB };
                let adaptive = if self.baseline() { 1 << 32 } else { 0 };
                fits((0..4).filter(|&i| self.fixed[i]).fold(0, |m, i| m | (field | adaptive) << (4 * i)))
            }
            Reg::Ctrl => fits(counters),
            // SDM Figures 18-5 / 18-11: OvfBuffer, CondChgd; OvfUncore (v3+); ToPA, LBR_Frz,
            // CTR_Frz (v4+). ASCI needs SGX, which emon never exposes.
            Reg::OvfCtrl => {
                let mut valid = counters | 1 << 62 | 1 << 63;
                if v >= 3 {
                    valid |= 1 << 61;
                }
                if v >= 4 {
                    valid |= 1 << 55 | 1 << 58 | 1 << 59;
                }
                fits(valid)
            }
            // SDM Figure 18-12 (CondChgd cannot be set).
            Reg::StatusSet => fits(counters | 1 << 55 | 1 << 58 | 1 << 59 | 1 << 61 | 1 << 62),
            Reg::DebugCtl | Reg::MiscEnable | Reg::PebsEnable | Reg::DsArea => None,
            // The profile's writable bits (measured on the parts that have them); others #GP.
            Reg::MiscFeatureControl => fits(self.prefetchers.misc_feature_control?),
            // Memory info, GPRs, XMMs, LBRs (bits 3:0) and the LBR count (31:24).
            Reg::PebsDataCfg => fits(0xFF00_000F),
            // SDM 17.4.8.1: the address bits below the format's flags (LBR_FMT 3: bit 63; 4:
            // bits 63:61) repeat bit 47; TO_IP has no flags.
            Reg::LbrFrom { .. } => {
                let flags = match self.perf_capabilities & 0x3F {
                    3 => 1,
                    4 => 3,
                    _ => 0,
                };
                Some(sign_extended_from_47(value, 63 - flags))
            }
            Reg::LbrTo { .. } => Some(sign_extended_from_47(value, 63)),
            Reg::LbrInfo(_) => fits(0xE000_0000_0000_FFFF),
            Reg::LbrTos => fits(u64::from(self.lbr?.depth) - 1),
            Reg::LbrSelect => fits(self.lbr?.select),
            // Read/write with no reserved bits (the VirtualBox database's measurements).
            Reg::Ler(_) => Some(true),
            Reg::Qualifier(i) => self.qualifier(i).map(|b| value & !(b.bits | b.ignored) == 0),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// NetBurst (SDM 18.15-18.16), restated independently of emon's netburst module
// ---------------------------------------------------------------------------------------------

const NB_COUNTERS: u8 = 18;
const NB_WIDTH_MASK: u64 = (1 << 40) - 1;
const CCCR_ENABLE: u64 = 1 << 12;
const CCCR_FORCE_OVF: u64 = 1 << 25;
const CCCR_OVF_PMI_T0: u64 = 1 << 26;
const CCCR_CASCADE: u64 = 1 << 30;
const CCCR_OVF: u64 = 1 << 31;

/// The ESCRs of the Pentium 4 3.00 GHz, model 4 (SDM Table 18-63), with the bits 30:0 a WRMSR
/// ignores as the VirtualBox CPU database measured them (Intel_Pentium_4_3_00GHz.h); bits 63:32
/// are ignored everywhere and bit 31 #GPs.
const NB_ESCRS: [(u32, u64); 45] = [
    (0x3A0, 0),
    (0x3A1, 0),
    (0x3A2, 0x4000_0000),
    (0x3A3, 0x4000_0000),
    (0x3A4, 0),
    (0x3A5, 0),
    (0x3A6, 0),
    (0x3A7, 0),
    (0x3A8, 0x61FE_01F0),
    (0x3A9, 0x61FE_01F0),
    (0x3AA, 0),
    (0x3AB, 0),
    (0x3AC, 0),
    (0x3AD, 0),
    (0x3AE, 0),
    (0x3AF, 0),
    (0x3B0, 0x71C0_01F0),
    (0x3B1, 0x71C0_01F0),
    (0x3B2, 0x61FC_0000),
    (0x3B3, 0x61FC_0000),
    (0x3B4, 0x71FE_01F0),
    (0x3B5, 0x71FE_01F0),
    (0x3B6, 0x0FFF_F1E0),
    (0x3B7, 0x0FFF_F1E0),
    (0x3B8, 0x71FE_01F0),
    (0x3B9, 0x71FE_01F0),
    (0x3BA, 0x7FFF_FFFF),
    (0x3BB, 0x7FFF_FFFF),
    (0x3BC, 0),
    (0x3BD, 0),
    (0x3BE, 0),
    (0x3C0, 0x61FF_81E0),
    (0x3C1, 0x61FF_81E0),
    (0x3C2, 0x71FE_01F0),
    (0x3C3, 0x71FE_01F0),
    (0x3C4, 0x61F8_01F0),
    (0x3C5, 0x61F8_01F0),
    (0x3C8, 0x71FE_01F0),
    (0x3C9, 0x71FE_01F0),
    (0x3CA, 0x7000_01F0),
    (0x3CB, 0x7000_01F0),
    (0x3CC, 0x61F0_01F0),
    (0x3CD, 0x61F0_01F0),
    (0x3E0, 0x71FF_01F0),
    (0x3E1, 0x71FF_01F0),
];

/// A NetBurst register.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NbReg {
    Counter(u8),
    Cccr(u8),
    Escr { ignored: u64 },
    TcPreciseEvent,
    PebsEnable,
    PebsMatrixVert,
}

fn nb_in_ranges(msr: u32) -> bool {
    matches!(msr, 0x300..=0x311 | 0x360..=0x371 | 0x3A0..=0x3E1 | 0x3F0..=0x3F2)
}

fn nb_reg(msr: u32) -> Option<NbReg> {
    Some(match msr {
        0x300..=0x311 => NbReg::Counter((msr - 0x300) as u8),
        0x360..=0x371 => NbReg::Cccr((msr - 0x360) as u8),
        0x3F0 => NbReg::TcPreciseEvent,
        0x3F1 => NbReg::PebsEnable,
        0x3F2 => NbReg::PebsMatrixVert,
        _ => NbReg::Escr { ignored: NB_ESCRS.iter().find(|e| e.0 == msr)?.1 },
    })
}

/// The bits a WRMSR of `r` ignores (they read 0).
fn nb_ignored(r: NbReg) -> u64 {
    const HI: u64 = 0xFFFF_FFFF_0000_0000;
    match r {
        NbReg::Counter(_) => !NB_WIDTH_MASK,
        // Bits 11:0 reserved, but the IQ extended-cascading bits (SDM 18.15.5.7): IQ_CCCR0/3 bit
        // 11, IQ_CCCR4/5 bits 11:8.
        NbReg::Cccr(12 | 15) => HI | 0x7FF,
        NbReg::Cccr(16 | 17) => HI | 0xFF,
        NbReg::Cccr(_) => HI | 0xFFF,
        NbReg::Escr { ignored } => HI | ignored,
        NbReg::TcPreciseEvent => !0x3_FFE0,
        NbReg::PebsEnable => !0x7FF_FFFF,
        NbReg::PebsMatrixVert => !0x1FFF,
    }
}

/// Does ESCR select `s` name an ESCR of counter `i`'s block (SDM Table 18-63)? BPU: all eight;
/// MS: 0-2; FLAME: not 4, 6, 7; IQ: not 7, and on the ESCR1 side (IQ counters 2, 3, 5) not 3.
fn nb_select_valid(i: u8, s: u64) -> bool {
    let invalid: u8 = match i {
        0..=3 => 0,
        4..=7 => 0b1111_1000,
        8..=11 => 0b1101_0000,
        12 | 13 | 16 => 0b1000_0000,
        _ => 0b1000_1000,
    };
    invalid & 1 << s == 0
}

/// The counter whose overflow starts counter `j` when its CCCR sets CASCADE (SDM 18.15.5.6):
/// counters 0 and 2, 1 and 3 of a block either way; in the IQ block, 4 only from 2 and 5 only
/// from 3.
fn nb_cascade_from(j: u8) -> u8 {
    match j {
        16 => 14,
        17 => 15,
        _ => {
            let base = j & !3;
            base + (j - base + 2) % 4
        }
    }
}

/// Is NetBurst counter `i` counting (SDM 18.15.3, 18.16.2)? CCCR enable, an ESCR select its block
/// has, active thread 01B or 11B (emon runs logical processor 0 only), and with CASCADE the start
/// its alternate's overflow gave.
fn nb_counting(cccr: u64, i: u8, cascaded: u32) -> bool {
    let thread = cccr >> 16 & 3;
    cccr & CCCR_ENABLE != 0
        && nb_select_valid(i, cccr >> 13 & 7)
        && (thread == 1 || thread == 3)
        && (cccr & CCCR_CASCADE == 0 || cascaded & 1 << i != 0)
}

/// A successful WRMSR of NetBurst register `r`: it stores the written bits it does not ignore,
/// a counter write disarms a pending overflow PMI, a CCCR write re-arms the cascade start (and
/// disarms the PMI unless it keeps OVF and OVF_PMI_T0).
fn nb_written(pmu: &Pmu, model: &mut Model, msr: u32, r: NbReg, value: u64, ctx: &Ctx) {
    assert_eq!(rd(pmu, msr, ctx), value & !nb_ignored(r), "{ctx}: NetBurst {msr:#x} stores the written bits");
    match r {
        NbReg::Counter(i) => {
            model.nb_armed &= !(1 << i);
            assert_ne!(pmu.reprogram_pending().written & 1 << i, 0, "{ctx}: a counter write must mark it written");
        }
        NbReg::Cccr(i) => {
            model.nb_cascaded &= !(1 << i);
            // emon's policy where the SDM is silent: a CCCR written with OVF or OVF_PMI_T0 clear
            // takes back the PMI an overflow armed.
            let stored = value & !nb_ignored(r);
            if stored & CCCR_OVF == 0 || stored & CCCR_OVF_PMI_T0 == 0 {
                model.nb_armed &= !(1 << i);
            }
        }
        _ => {}
    }
}

/// `add_events(NetBurst(i), n)` (SDM 18.15.3): the counter wraps modulo 2^40; a wrap, or any
/// increment with FORCE_OVF, sets CCCR.OVF and starts the counters cascading from it; with
/// OVF_PMI_T0 the PMI comes at the first event after the overflow (at once if the batch has
/// one). Returns (overflowed, counters started).
fn nb_add_events(pmu: &Pmu, model: &mut Model, i: u8, n: u64, ctx: &Ctx) -> (bool, u64, u64) {
    let cccr = rd(pmu, 0x360 + u32::from(i), ctx);
    let old = rd(pmu, 0x300 + u32::from(i), ctx);
    if n == 0 {
        return (false, 0, old);
    }
    let sum = u128::from(old) + u128::from(n);
    let wrapped = sum > u128::from(NB_WIDTH_MASK);
    let value = (sum & u128::from(NB_WIDTH_MASK)) as u64;
    let force = cccr & CCCR_FORCE_OVF != 0;
    if model.nb_armed & 1 << i != 0 {
        model.nb_armed &= !(1 << i);
        model.pmi_pending = true;
    }
    let overflowed = wrapped || force;
    let mut started = 0;
    if overflowed {
        if cccr & CCCR_OVF_PMI_T0 != 0 {
            let after = if force { n - 1 } else { value };
            if after > 0 {
                model.pmi_pending = true;
            } else {
                model.nb_armed |= 1 << i;
            }
        }
        for j in (0..NB_COUNTERS).filter(|&j| nb_cascade_from(j) == i) {
            let cj = rd(pmu, 0x360 + u32::from(j), ctx);
            if cj & CCCR_CASCADE != 0 && cj & CCCR_ENABLE != 0 && model.nb_cascaded & 1 << j == 0 {
                model.nb_cascaded |= 1 << j;
                started |= 1 << j;
            }
        }
    }
    (overflowed, started, value)
}

// ---------------------------------------------------------------------------------------------
// The run
// ---------------------------------------------------------------------------------------------

/// Where a check failed: the step and the operation.
struct Ctx<'a> {
    step: usize,
    op: Option<&'a Op>,
}

impl fmt::Display for Ctx<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.op {
            Some(op) => write!(f, "step {} {:?}", self.step, op),
            None => write!(f, "power-on"),
        }
    }
}

/// The harness's expectations beyond the registers.
struct Model {
    status: u64,
    pmi_pending: bool,
    /// The last branch taken while the LBR stack recorded (what an exception copies to LER).
    last_branch: (u64, u64),
    /// NetBurst: counters whose cascade start came (bit i), and counters that overflowed with
    /// OVF_PMI_T0 and raise the PMI at their next event.
    nb_cascaded: u32,
    nb_armed: u32,
}

/// Every PMU MSR and what RDMSR gives for it.
fn snapshot(pmu: &Pmu) -> Vec<(u32, Result<u64, GpFault>)> {
    all_pmu_msrs().map(|m| (m, pmu.rdmsr(m))).collect()
}

/// The counting configuration a backend sees: every counter's state, value left out.
fn config(pmu: &Pmu) -> Vec<CounterState> {
    pmu.counter_ids().into_iter().map(|id| CounterState { value: 0, ..pmu.counter(id) }).collect()
}

fn value_msrs(id: CounterId) -> Vec<u32> {
    match id {
        CounterId::Gp(i) => vec![0xC1 + u32::from(i), 0x4C1 + u32::from(i)],
        CounterId::Fixed(i) => vec![0x309 + u32::from(i)],
        CounterId::NetBurst(i) => vec![0x300 + u32::from(i)],
    }
}

/// Every PMU MSR reads the same in `a` and `b`, except those in `except`.
fn same_except(a: &[(u32, Result<u64, GpFault>)], b: &[(u32, Result<u64, GpFault>)], except: &[u32], ctx: &Ctx) {
    for ((msr, x), (_, y)) in a.iter().zip(b) {
        if !except.contains(msr) {
            assert_eq!(x, y, "{ctx}: MSR {msr:#x} changed");
        }
    }
}

fn sign_extend_32(v: u64) -> u64 {
    v as u32 as i32 as i64 as u64
}

fn rd(pmu: &Pmu, msr: u32, ctx: &Ctx) -> u64 {
    pmu.rdmsr(msr).unwrap_or_else(|_| panic!("{ctx}: RDMSR {msr:#x} faulted but the profile declares it"))
}

fn run(input: &Input) {
    let Some((profile, prefetchers)) = input.profile.build(input.prefetchers.build()) else { return };
    let shape = Shape::new(&profile, prefetchers);
    let mut pmu = Pmu::new(&profile).with_prefetchers(prefetchers);
    let mut model = Model { status: 0, pmi_pending: false, last_branch: (0, 0), nb_cascaded: 0, nb_armed: 0 };
    check_power_on(&pmu, &shape);
    check(&pmu, &shape, &model, &Ctx { step: 0, op: None });
    for (step, op) in input.ops.iter().enumerate() {
        let ctx = Ctx { step, op: Some(op) };
        pmu.take_reprogram();
        let config_before = config(&pmu);
        apply(&mut pmu, &shape, &mut model, op, &ctx);
        let marked = pmu.take_reprogram();
        for (before, after) in config_before.iter().zip(config(&pmu)) {
            if *before != after {
                assert_ne!(
                    marked.counters & before.id.status_mask(),
                    0,
                    "{ctx}: {} changed how it counts without being marked for reprogramming",
                    before.id
                );
            }
        }
        assert_eq!(marked.written & !marked.counters, 0, "{ctx}: written but not marked");
        check(&pmu, &shape, &model, &ctx);
    }
    let _ = pmu.dump();
}

/// SDM 18.2.2 power-on values.
fn check_power_on(pmu: &Pmu, shape: &Shape) {
    let ctx = Ctx { step: 0, op: None };
    for msr in all_pmu_msrs().filter(|&m| shape.exists(m)) {
        let v = rd(pmu, msr, &ctx);
        if shape.netburst && nb_in_ranges(msr) {
            // All 0 (SDM 18.15.1), but MSR_TC_PRECISE_EVENT as measured.
            assert_eq!(v, if msr == 0x3F0 { 0xFC00 } else { 0 }, "power-on NetBurst MSR {msr:#x}");
            continue;
        }
        let want = match reg(msr).unwrap() {
            Reg::PerfCap => shape.perf_capabilities,
            Reg::Ctrl => shape.gp_bits(),
            Reg::MiscEnable => continue, // checked below
            _ => 0,
        };
        assert_eq!(v, want, "power-on MSR {msr:#x}");
    }
    let misc = rd(pmu, 0x1A0, &ctx);
    assert_eq!(misc & (1 << 7) != 0, shape.misc_enable_perfmon, "power-on MISC_ENABLE[7]");
    // Fast strings (bit 0), BTS unavailable (11), PEBS unavailable (12), and bit 7 per profile.
    assert_eq!(misc & !(1 << 7), 1 | 3 << 11, "power-on MISC_ENABLE");
}

/// SDM 17.4.8: a branch goes into the stack iff DEBUGCTL.LBR is set, LBR_Frz is clear (v4+) and
/// MSR_LBR_SELECT does not filter its ring or type; TOS advances modulo the depth and the new
/// entry holds the record in the profile's format (17.4.8.1). Nothing else changes.
fn record_branch(pmu: &mut Pmu, shape: &Shape, model: &mut Model, b: &Branch, ctx: &Ctx) {
    let before = snapshot(pmu);
    let recorded = pmu.record_branch(b);
    let Some(lbr) = shape.lbr else {
        assert!(!recorded, "{ctx}: a profile without an LBR stack recorded a branch");
        return;
    };
    let frozen = shape.version >= 4 && model.status & (1 << 58) != 0;
    let on = rd(pmu, 0x1D9, ctx) & 1 != 0 && !frozen;
    let select = if lbr.select != 0 { rd(pmu, 0x1C8, ctx) } else { 0 };
    let ring = if b.cpl == 0 { 1 } else { 2 };
    let kind = 4 << BRANCH_TYPES.iter().position(|&t| t == b.kind).expect("a known type");
    assert_eq!(recorded, on && select & (ring | kind) == 0, "{ctx}: recorded");
    // An exception or interrupt copies the last branch taken before it (filtered or not) into
    // LER_FROM/TO while the stack records.
    let mut except = Vec::new();
    if on {
        if b.event {
            let (from, to) = model.last_branch;
            assert_eq!((rd(pmu, 0x1DD, ctx), rd(pmu, 0x1DE, ctx)), (from, to), "{ctx}: LER");
            except.extend([0x1DD, 0x1DE]);
        }
        model.last_branch = (b.from, b.to);
    }
    if !recorded {
        same_except(&before, &snapshot(pmu), &except, ctx);
        return;
    }
    let old_tos = before.iter().find(|(m, _)| *m == 0x1C9).and_then(|(_, v)| v.ok()).expect("TOS exists");
    let tos = (old_tos + 1) % u64::from(lbr.depth);
    assert_eq!(rd(pmu, 0x1C9, ctx), tos, "{ctx}: TOS advances modulo the depth");
    let n = tos as u32;
    let mispred = u64::from(b.mispredicted) << 63;
    let from = match shape.perf_capabilities & 0x3F {
        3 => b.from & !(1 << 63) | mispred,
        4 => b.from & (u64::MAX >> 3) | mispred,
        _ => b.from,
    };
    assert_eq!(rd(pmu, lbr.from + n, ctx), from, "{ctx}: FROM_IP in the format");
    assert_eq!(rd(pmu, lbr.to + n, ctx), b.to, "{ctx}: TO_IP");
    except.extend([0x1C9, lbr.from + n, lbr.to + n]);
    if let Some(info) = lbr.info {
        assert_eq!(rd(pmu, info + n, ctx), mispred | b.cycles.min(0xFFFF), "{ctx}: LBR_INFO");
        except.push(info + n);
    }
    same_except(&before, &snapshot(pmu), &except, ctx);
}

fn apply(pmu: &mut Pmu, shape: &Shape, model: &mut Model, op: &Op, ctx: &Ctx) {
    match *op {
        Op::Branch { from, to, kind, cpl, mispredicted, cycles, event } => {
            let kind = if event { BranchType::Far } else { BRANCH_TYPES[usize::from(kind) % BRANCH_TYPES.len()] };
            let (from, to, cpl, cycles) = (canonical(from), canonical(to), cpl % 4, cycles.into());
            let b = Branch { from, to, kind, cpl, mispredicted, cycles, event };
            record_branch(pmu, shape, model, &b, ctx);
        }
        Op::Rdmsr(m) => {
            let msr = m.index();
            let before = pmu.clone();
            let r = pmu.rdmsr(msr);
            assert!(*pmu == before, "{ctx}: RDMSR {msr:#x} changed state");
            assert_eq!(r.is_ok(), shape.exists(msr), "{ctx}: RDMSR {msr:#x} existence ({r:?})");
            if r.is_ok() {
                assert!(Pmu::owns(msr), "{ctx}: RDMSR {msr:#x} succeeded outside the trapped ranges");
            }
            assert_eq!(pmu.rdmsr(msr), r, "{ctx}: RDMSR {msr:#x} not repeatable");
        }
        Op::Wrmsr(m, v) => {
            let msr = m.index();
            let value = v.resolve(msr, pmu);
            wrmsr(pmu, shape, model, msr, value, ctx);
        }
        Op::WriteBack(m) => {
            let msr = m.index();
            let Ok(value) = pmu.rdmsr(msr) else { return };
            if shape.netburst {
                // Every NetBurst register and MSR_DEBUGCTLA, MISC_ENABLE, DS_AREA take back what
                // they read; a counter or CCCR write still has its side effects (the model's).
                let before = snapshot(pmu);
                wrmsr(pmu, shape, model, msr, value, ctx);
                same_except(&before, &snapshot(pmu), &[], ctx);
                return;
            }
            let writable =
                !matches!(reg(msr), Some(Reg::PerfCap | Reg::Status | Reg::Inuse | Reg::OvfCtrl | Reg::StatusSet));
            if !writable {
                return;
            }
            let before = snapshot(pmu);
            assert_eq!(pmu.wrmsr(msr, value), Ok(()), "{ctx}: writing back RDMSR {msr:#x} = {value:#x} faulted");
            // A legacy IA32_PMCx write sign-extends bit 31, so only the other registers must
            // read back unchanged.
            let except: Vec<u32> = match reg(msr) {
                Some(Reg::Pmc(i)) => vec![msr, 0x4C1 + u32::from(i), 0x392],
                _ => vec![],
            };
            same_except(&before, &snapshot(pmu), &except, ctx);
            if let Some(Reg::Pmc(i)) = reg(msr) {
                let want = sign_extend_32(value) & width_mask(shape.gp_width);
                assert_eq!(rd(pmu, msr, ctx), want, "{ctx}: write-back of PMC{i}");
            }
        }
        Op::AddEvents(c, count) => {
            let id = c.id();
            let before = pmu.clone();
            let snap = snapshot(pmu);
            let distance = pmu.distance_to_overflow(id);
            let n = match count {
                Count::Raw(n) => n,
                Count::Small(n) => u64::from(n),
                Count::ToOverflow => distance,
                Count::Short(k) => distance.saturating_sub(1 + u64::from(k)),
                Count::Past(k) => distance.saturating_add(u64::from(k)),
            };
            let overflowed = pmu.add_events(id, n);
            if !shape.counter_exists(id) {
                assert!(!overflowed && *pmu == before, "{ctx}: add_events on an undeclared counter");
                return;
            }
            if let CounterId::NetBurst(i) = id {
                let armed = model.nb_armed & 1 << i != 0;
                let cccr = rd(&before, 0x360 + u32::from(i), ctx);
                let (want_overflow, started, value) = nb_add_events(&before, model, i, n, ctx);
                assert_eq!(pmu.counter(id).value, value, "{ctx}: add_events value");
                assert_eq!(overflowed, want_overflow, "{ctx}: add_events overflow report");
                // The next event that matters: the wrap, or the very next one with FORCE_OVF or
                // an armed PMI.
                let old = before.counter(id).value;
                let want_distance = if cccr & CCCR_FORCE_OVF != 0 || armed { 1 } else { (1 << 40) - old };
                assert_eq!(distance, want_distance, "{ctx}: NetBurst distance_to_overflow");
                let mut except = vec![0x300 + u32::from(i)];
                if overflowed {
                    assert_ne!(rd(pmu, 0x360 + u32::from(i), ctx) & CCCR_OVF, 0, "{ctx}: CCCR.OVF sets on overflow");
                    except.push(0x360 + u32::from(i));
                }
                same_except(&snap, &snapshot(pmu), &except, ctx);
                let marked = pmu.reprogram_pending();
                assert_eq!(marked.written, before.reprogram_pending().written, "{ctx}: add_events marked a write");
                assert_eq!(
                    marked.counters,
                    before.reprogram_pending().counters | started,
                    "{ctx}: add_events marks exactly the counters a cascade started"
                );
                return;
            }
            let width = shape.width(id);
            let old = before.counter(id).value;
            let modulus = 1u128 << width;
            let sum = u128::from(old) + u128::from(n);
            assert_eq!(u128::from(pmu.counter(id).value), sum % modulus, "{ctx}: add_events value");
            assert_eq!(overflowed, sum >= modulus, "{ctx}: add_events overflow report");
            // distance_to_overflow: 2^width - value, u64::MAX when that is 2^64.
            let want_distance = u64::try_from(modulus - u128::from(old)).unwrap_or(u64::MAX);
            assert_eq!(distance, want_distance, "{ctx}: distance_to_overflow");
            if overflowed {
                if shape.version >= 2 {
                    model.status |= 1u64 << id.status_bit();
                }
                if int_bit(&before, id, ctx) {
                    model.pmi_pending = true;
                }
            }
            let mut except = value_msrs(id);
            except.push(0x38E);
            same_except(&snap, &snapshot(pmu), &except, ctx);
            assert_eq!(pmu.reprogram_pending(), before.reprogram_pending(), "{ctx}: add_events marked a counter");
        }
        Op::SetValue(c, value) => {
            let id = c.id();
            let before = pmu.clone();
            let snap = snapshot(pmu);
            pmu.set_value(id, value);
            if !shape.counter_exists(id) {
                assert!(*pmu == before, "{ctx}: set_value on an undeclared counter");
                return;
            }
            assert_eq!(pmu.counter(id).value, value & width_mask(shape.width(id)), "{ctx}: set_value");
            same_except(&snap, &snapshot(pmu), &value_msrs(id), ctx);
            assert_eq!(pmu.reprogram_pending(), before.reprogram_pending(), "{ctx}: set_value marked a counter");
        }
        Op::PmiDelivered => {
            let before = pmu.clone();
            let snap = snapshot(pmu);
            let debugctl = rd(pmu, 0x1D9, ctx);
            pmu.pmi_delivered();
            if !std::mem::take(&mut model.pmi_pending) {
                assert!(*pmu == before, "{ctx}: pmi_delivered with no PMI pending changed state");
                return;
            }
            let (freeze_lbrs, freeze_perfmon) = (debugctl & 1 << 11 != 0, debugctl & 1 << 12 != 0);
            let mut except = vec![0x38E];
            if shape.version >= 4 {
                // Streamlined freeze (SDM 18.2.4.1, 17.4.7): status bits, GLOBAL_CTRL unchanged.
                if freeze_lbrs {
                    model.status |= 1 << 58;
                }
                if freeze_perfmon {
                    model.status |= 1 << 59;
                }
            } else {
                // Legacy freeze: clear DEBUGCTL.LBR / GLOBAL_CTRL.
                if freeze_lbrs {
                    assert_eq!(rd(pmu, 0x1D9, ctx), debugctl & !1, "{ctx}: legacy LBR freeze");
                    except.push(0x1D9);
                }
                if freeze_perfmon {
                    assert_eq!(rd(pmu, 0x38F, ctx), 0, "{ctx}: legacy perfmon freeze");
                    except.push(0x38F);
                }
            }
            except.push(0x392);
            same_except(&snap, &snapshot(pmu), &except, ctx);
        }
        Op::Arm { ctr, event, int } => {
            let int = if int { 1 << 20 } else { 0 };
            let id = ctr.id();
            match id {
                CounterId::Gp(i) => {
                    let sel = u64::from(event.max(1)) | 1 << 16 | 1 << 17 | 1 << 22 | int;
                    wrmsr(pmu, shape, model, 0x186 + u32::from(i), sel, ctx);
                }
                CounterId::Fixed(i) => {
                    let shift = 4 * u32::from(i);
                    let field = 3 | int >> 17; // EN = all rings, PMI (bit 3)
                    let ctrl = pmu.rdmsr(0x38D).unwrap_or(0);
                    let ctrl = (ctrl & !0xFu64.checked_shl(shift).unwrap_or(0)) | field.checked_shl(shift).unwrap_or(0);
                    wrmsr(pmu, shape, model, 0x38D, ctrl, ctx);
                }
                // NetBurst: the CCCR, enabled through ESCR select `event % 8`, active thread
                // "any", OVF_PMI_T0 if `int` (no GLOBAL_CTRL).
                CounterId::NetBurst(i) => {
                    let cccr =
                        CCCR_ENABLE | u64::from(event % 8) << 13 | 3 << 16 | if int != 0 { CCCR_OVF_PMI_T0 } else { 0 };
                    wrmsr(pmu, shape, model, 0x360 + u32::from(i), cccr, ctx);
                    return;
                }
            }
            let ctrl = pmu.rdmsr(0x38F).unwrap_or(0);
            wrmsr(pmu, shape, model, 0x38F, ctrl | 1u64.checked_shl(id.status_bit()).unwrap_or(0), ctx);
        }
        Op::ArmListed { ctr, event, umask, int } => {
            let Some(e) = listed(shape.events, event) else { return };
            let i = ctr % 10;
            let sel = encoding(e, umask) | 1 << 16 | 1 << 17 | 1 << 22 | if int { 1 << 20 } else { 0 };
            wrmsr(pmu, shape, model, 0x186 + u32::from(i), sel, ctx);
            let ctrl = pmu.rdmsr(0x38F).unwrap_or(0);
            wrmsr(pmu, shape, model, 0x38F, ctrl | 1 << i, ctx);
        }
        Op::Freeze(bits) => {
            let value = u64::from(bits & 1) | u64::from(bits >> 1 & 3) << 11;
            wrmsr(pmu, shape, model, 0x1D9, value, ctx);
        }
        Op::Rdpmc { ecx, cpl, pce } => {
            let before = pmu.clone();
            let r = pmu.rdpmc(ecx, cpl, pce);
            assert!(*pmu == before, "{ctx}: RDPMC changed state");
            let index = ecx & !(3 << 30);
            let want = if cpl > 0 && !pce {
                Err(GpFault)
            } else if shape.netburst {
                // NetBurst: ECX[30:0] is the counter number, ECX[31] the fast (32-bit) read.
                match u8::try_from(ecx & !(1 << 31)) {
                    Ok(i) if i < NB_COUNTERS => {
                        let v = pmu.counter(CounterId::NetBurst(i)).value;
                        Ok(if ecx & 1 << 31 != 0 { v & 0xFFFF_FFFF } else { v })
                    }
                    _ => Err(GpFault),
                }
            } else {
                match u8::try_from(index) {
                    Err(_) => Err(GpFault),
                    Ok(i) => {
                        let id = if ecx & 1 << 30 != 0 { CounterId::Fixed(i) } else { CounterId::Gp(i) };
                        if shape.counter_exists(id) {
                            let v = pmu.counter(id).value;
                            Ok(if ecx & 1 << 31 != 0 { v & 0xFFFF_FFFF } else { v })
                        } else {
                            Err(GpFault)
                        }
                    }
                }
            };
            assert_eq!(r, want, "{ctx}: RDPMC");
        }
    }
}

/// The INT bit of a GP counter's PERFEVTSEL, or the PMI bit of a fixed counter's field.
fn int_bit(pmu: &Pmu, id: CounterId, ctx: &Ctx) -> bool {
    match id {
        CounterId::Gp(i) => rd(pmu, 0x186 + u32::from(i), ctx) & 1 << 20 != 0,
        CounterId::Fixed(i) => rd(pmu, 0x38D, ctx) >> (4 * u32::from(i)) & 8 != 0,
        CounterId::NetBurst(i) => rd(pmu, 0x360 + u32::from(i), ctx) & CCCR_OVF_PMI_T0 != 0,
    }
}

fn wrmsr(pmu: &mut Pmu, shape: &Shape, model: &mut Model, msr: u32, value: u64, ctx: &Ctx) {
    let before = pmu.clone();
    let snap = snapshot(pmu);
    let r = pmu.wrmsr(msr, value);
    let must = shape.write_ok(msr, value);
    if let Some(ok) = must {
        assert_eq!(r.is_ok(), ok, "{ctx}: WRMSR {msr:#x} = {value:#x} gave {r:?}");
    }
    if r.is_err() {
        assert!(*pmu == before, "{ctx}: WRMSR {msr:#x} = {value:#x} raised #GP but changed state");
        return;
    }
    assert!(Pmu::owns(msr), "{ctx}: WRMSR {msr:#x} succeeded outside the trapped ranges");
    if shape.netburst {
        if let Some(r) = nb_reg(msr) {
            nb_written(pmu, model, msr, r, value, ctx);
            same_except(&snap, &snapshot(pmu), &[msr], ctx);
            return;
        }
    }
    let reg = reg(msr).expect("owned MSRs decode");
    let read = |pmu: &Pmu| rd(pmu, msr, ctx);
    // The MSRs this write may change: itself, INUSE (derived), and its aliases.
    let mut except = vec![msr, 0x392];
    match reg {
        Reg::Pmc(i) => {
            let want = sign_extend_32(value) & width_mask(shape.gp_width);
            assert_eq!(read(pmu), want, "{ctx}: legacy PMC write");
            except.push(0x4C1 + u32::from(i));
        }
        Reg::APmc(i) => {
            assert_eq!(read(pmu), value, "{ctx}: full-width write");
            except.push(0xC1 + u32::from(i));
        }
        Reg::FixedCtr(_) => assert_eq!(read(pmu), value & width_mask(shape.fixed_width), "{ctx}: fixed write"),
        Reg::EvtSel(_)
        | Reg::FixedCtrCtrl
        | Reg::Ctrl
        | Reg::DebugCtl
        | Reg::PebsEnable
        | Reg::DsArea
        | Reg::PebsDataCfg
        | Reg::MiscFeatureControl => assert_eq!(read(pmu), value, "{ctx}: read-back"),
        Reg::OvfCtrl => {
            model.status &= !value;
            assert_eq!(read(pmu), 0, "{ctx}: OVF_CTRL reads 0");
            except.push(0x38E);
        }
        Reg::StatusSet => {
            model.status |= value;
            assert_eq!(read(pmu), 0, "{ctx}: STATUS_SET reads 0");
            except.push(0x38E);
        }
        Reg::MiscEnable => {
            let writable = MISC_ENABLE_WRITABLE | shape.misc_enable_prefetch();
            assert_eq!(value & !(writable | MISC_ENABLE_READ_ONLY), 0, "{ctx}: MISC_ENABLE reserved bits");
            let old = rd(&before, msr, ctx);
            let want = (value & writable) | (old & MISC_ENABLE_READ_ONLY);
            assert_eq!(read(pmu), want, "{ctx}: MISC_ENABLE read-only bits");
        }
        Reg::PerfCap | Reg::Status | Reg::Inuse => panic!("{ctx}: WRMSR to read-only {msr:#x} succeeded"),
        Reg::LbrFrom { .. } | Reg::LbrTo { .. } | Reg::LbrInfo(_) | Reg::LbrTos | Reg::LbrSelect | Reg::Ler(_) => {
            assert_eq!(read(pmu), value, "{ctx}: LBR read-back")
        }
        Reg::Qualifier(i) => {
            let b = shape.qualifier(i).expect("exists");
            assert_eq!(read(pmu), value & b.bits, "{ctx}: stored bits, ignored bits dropped")
        }
    }
    same_except(&snap, &snapshot(pmu), &except, ctx);
    if let Reg::Pmc(i) | Reg::APmc(i) | Reg::FixedCtr(i) = reg {
        let id = if matches!(reg, Reg::FixedCtr(_)) { CounterId::Fixed(i) } else { CounterId::Gp(i) };
        assert_ne!(
            pmu.reprogram_pending().written & id.status_mask(),
            0,
            "{ctx}: a counter write must mark it written"
        );
    }
}

/// The invariants that hold after every operation.
fn check(pmu: &Pmu, shape: &Shape, model: &Model, ctx: &Ctx) {
    let v = shape.version;
    // GLOBAL_STATUS: only overflow, STATUS_SET and freeze-on-PMI set bits.
    assert_eq!(pmu.global_status(), model.status, "{ctx}: GLOBAL_STATUS");
    if v >= 2 {
        assert_eq!(pmu.rdmsr(0x38E), Ok(model.status), "{ctx}: RDMSR GLOBAL_STATUS");
    }
    assert_eq!(pmu.pmi_pending(), model.pmi_pending, "{ctx}: PMI pending");
    let frozen = v >= 4 && model.status & 1 << 59 != 0;
    assert_eq!(pmu.frozen(), frozen, "{ctx}: frozen");

    // Counters: existence, width, values, counting.
    let ids = shape.ids();
    assert_eq!(pmu.counter_ids(), ids, "{ctx}: counter ids");
    let global_ctrl = if v >= 2 { rd(pmu, 0x38F, ctx) } else { 0 };
    let fixed_ctrl = if v >= 2 { rd(pmu, 0x38D, ctx) } else { 0 };
    let mut inuse = 0u64;
    let mut adaptive = 0u64;
    let mut pmi_in_use = v >= 1 && rd(pmu, 0x3F1, ctx) & shape.gp_bits() != 0;
    for &id in &ids {
        let s = pmu.counter(id);
        let width = shape.width(id);
        if let CounterId::NetBurst(i) = id {
            assert_eq!(s.width, 40, "{ctx}: {id} width");
            assert_eq!(s.value & !NB_WIDTH_MASK, 0, "{ctx}: {id} value {:#x} exceeds 40 bits", s.value);
            assert_eq!(rd(pmu, 0x300 + u32::from(i), ctx), s.value, "{ctx}: {id} RDMSR");
            assert!(pmu.distance_to_overflow(id) >= 1, "{ctx}: {id} distance 0");
            let cccr = rd(pmu, 0x360 + u32::from(i), ctx);
            assert_eq!(
                (s.enabled, s.int),
                (cccr & CCCR_ENABLE != 0, cccr & CCCR_OVF_PMI_T0 != 0),
                "{ctx}: {id} enable/OVF_PMI_T0"
            );
            assert_eq!(s.counting, nb_counting(cccr, i, model.nb_cascaded), "{ctx}: {id} counting (CCCR {cccr:#x})");
            continue;
        }
        assert_eq!(s.width, width, "{ctx}: {id} width");
        assert_eq!(s.value & !width_mask(width), 0, "{ctx}: {id} value {:#x} exceeds {width} bits", s.value);
        for msr in value_msrs(id) {
            if shape.exists(msr) {
                assert_eq!(rd(pmu, msr, ctx), s.value, "{ctx}: {id} RDMSR {msr:#x}");
            }
        }
        assert!(pmu.distance_to_overflow(id) >= 1, "{ctx}: {id} distance 0");
        let (enabled, int, in_use, adaptive_record) = match id {
            CounterId::Gp(i) => {
                let sel = rd(pmu, 0x186 + u32::from(i), ctx);
                let want = expected_semantics(shape.events, i, sel);
                assert_eq!(s.semantics, want, "{ctx}: {id} counts PERFEVTSEL {sel:#x} as");
                (sel & 1 << 22 != 0, sel & 1 << 20 != 0, sel & 0xFF != 0, sel & 1 << 34 != 0)
            }
            CounterId::Fixed(i) => {
                let field = fixed_ctrl >> (4 * u32::from(i)) & 0xF;
                (field & 3 != 0, field & 8 != 0, field & 3 != 0, fixed_ctrl >> (32 + 4 * u32::from(i)) & 1 != 0)
            }
            CounterId::NetBurst(_) => unreachable!("NetBurst counters are checked above"),
        };
        if adaptive_record {
            adaptive |= 1 << id.status_bit();
        }
        assert_eq!((s.enabled, s.int), (enabled, int), "{ctx}: {id} enable/int");
        let global = v == 1 || global_ctrl & 1 << id.status_bit() != 0;
        assert_eq!(s.counting, enabled && global && !frozen, "{ctx}: {id} counting");
        if in_use {
            inuse |= 1 << id.status_bit();
        }
        pmi_in_use |= int;
    }
    // Adaptive PEBS: the counters whose records take MSR_PEBS_DATA_CFG's groups.
    assert_eq!(pmu.pebs_adaptive(), adaptive, "{ctx}: pebs_adaptive()");
    // The prefetchers left on, from the two control registers.
    let feature = pmu.rdmsr(0x1A4).unwrap_or(0);
    let on = shape.prefetchers_on(feature, rd(pmu, 0x1A0, ctx));
    assert_eq!(pmu.prefetchers_on(), on, "{ctx}: prefetchers_on()");
    let counting: Vec<CounterId> = pmu.counting().iter().map(|s| s.id).collect();
    let want: Vec<CounterId> = ids.iter().copied().filter(|&id| pmu.counter(id).counting).collect();
    assert_eq!(counting, want, "{ctx}: counting()");
    for id in (0..12).map(CounterId::Gp).chain((0..8).map(CounterId::Fixed)).chain((0..20).map(CounterId::NetBurst)) {
        if !shape.counter_exists(id) {
            let s = pmu.counter(id);
            assert!(s.value == 0 && s.width == 0 && !s.counting, "{ctx}: undeclared {id} {s:?}");
            assert_eq!(pmu.distance_to_overflow(id), u64::MAX, "{ctx}: undeclared {id} distance");
        }
    }

    // INUSE (SDM 18.2.4.3), from the registers.
    if pmi_in_use {
        inuse |= INUSE_PMI;
    }
    assert_eq!(pmu.global_inuse(), inuse, "{ctx}: global_inuse()");
    if v >= 4 {
        assert_eq!(pmu.rdmsr(0x392), Ok(inuse), "{ctx}: RDMSR GLOBAL_INUSE");
    }
}

fuzz_target!(|input: Input| run(&input));
