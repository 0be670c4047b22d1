//! The architectural rules a profile must obey (`Profile::validate`).
//!
//! Rules are checked in a fixed order and the first broken one is reported, naming the
//! origin, the field with its value, and the rule with its CPUID/MSR reference.

use super::model_msrs::*;
use super::{Cache, CacheLevel, Clock, PmuProfile, Prefetchers, Profile, ProfileError, ARCH_EVENTS, CONTROL_BITS};

/// Highest architectural perfmon version emon models (CPUID.0AH:EAX[7:0]).
pub const MAX_VERSION: u8 = 5;
/// IA32_PMC0-7 (0xC1-0xC8) and IA32_PERFEVTSEL0-7 (0x186-0x18D).
pub const MAX_GP: u8 = 8;
/// IA32_FIXED_CTR0-3 (0x309-0x30C).
pub const MAX_FIXED: u8 = 4;
/// The architectural events of SDM Table 18-1 that emon knows.
pub const MAX_EBX_LENGTH: u8 = ARCH_EVENTS.len() as u8;
/// Legal counter widths (CPUID.0AH:EAX[23:16], EDX[12:5]).
pub const WIDTHS: std::ops::RangeInclusive<u8> = 32..=64;
/// Legal display family: 1..=0xF, or 0xF + extended family 0x01..=0xFF.
pub const FAMILIES: std::ops::RangeInclusive<u16> = 1..=0x10E;
/// Legal `pmu.nominal-mhz`.
pub const NOMINAL_MHZ: std::ops::RangeInclusive<u32> = 100..=10_000;

/// Largest cache line, in bytes (CPUID.04H:EBX[11:0] holds line size - 1).
pub const MAX_CACHE_LINE: u32 = 4096;
/// Smallest cache line, in bytes: an access of up to 64 bytes touches a handful of lines.
pub const MIN_CACHE_LINE: u32 = 16;
/// Most ways of associativity (CPUID.04H:EBX[31:22] holds ways - 1).
pub const MAX_CACHE_WAYS: u32 = 1024;
/// Largest cache level, in KiB (1 GiB): the model keeps 8 bytes per line, 128 MiB at most.
pub const MAX_CACHE_KIB: u32 = 1 << 20;
/// Most 4 KiB pages the streamer can track (the optimization manual's largest is 32).
pub const MAX_STREAMER_PAGES: u32 = 64;

/// IA32_PERF_CAPABILITIES (MSR 0x345) bits emon accepts in a profile (SDM Vol. 3B
/// Figure 18-63 "IA32_PERF_CAPABILITIES", field names as in Linux `union perf_capabilities`):
/// [5:0] LBR_FMT, 6 PEBS_TRAP, 7 PEBS_ARCH_REG, [11:8] PEBS_FMT, 12 SMM_FRZ, 13 FW_WRITE,
/// 14 PEBS_BASELINE, 15 PERF_METRICS (Ice Lake), 16 PEBS_OUTPUT_PT_AVAIL, 17 PEBS_TIMING_INFO,
/// 19 RDPMC_METRICS_CLEAR. Bit 18 (a Linux-only software flag, reserved in hardware) and
/// bits 20-63 are reserved.
pub const PERF_CAPABILITIES_ACCEPTED: u64 = 0x000B_FFFF;

const VERSION0: &str =
    "must be 0 when pmu.version = 0 (version 0 means no architectural perfmon: CPUID.0AH reads all zero)";

impl Profile {
    /// Check every rule; errors name [`Profile::name`] as the source.
    pub fn validate(&self) -> Result<(), ProfileError> {
        self.validate_as(&self.name)
    }

    /// Check every rule; errors name `origin` (a file path, a built-in name or `--pmu`).
    pub fn validate_as(&self, origin: &str) -> Result<(), ProfileError> {
        let c = Check { origin };
        c.pmu(&self.pmu)?;
        c.identity(self)?;
        c.cache(&self.cache)?;
        c.clock(&self.clock)
    }
}

/// Builds the errors of one validation run.
struct Check<'a> {
    origin: &'a str,
}

/// `pmu.<name> = <value>`.
fn field(name: &str, value: impl std::fmt::Display) -> String {
    format!("pmu.{name} = {value}")
}

/// `pmu.<name> = 0x<value>` for bit vectors.
fn hex_field(name: &str, value: u64) -> String {
    format!("pmu.{name} = 0x{value:X}")
}

impl Check<'_> {
    fn fail(&self, field: String, rule: impl Into<String>) -> Result<(), ProfileError> {
        Err(ProfileError::invalid(self.origin, field, rule))
    }

    fn pmu(&self, p: &PmuProfile) -> Result<(), ProfileError> {
        if p.version > MAX_VERSION {
            return self.fail(
                field("version", p.version),
                "architectural perfmon version must be 0..=5 (CPUID.0AH:EAX[7:0]; emon models versions 0-5)",
            );
        }
        if p.version == 0 {
            self.version0(p)?;
            return self.netburst(p);
        }
        if p.netburst() {
            return self.fail(
                field("version", p.version),
                "must be 0 when pmu.kind = \"netburst\" (NetBurst processors have no architectural perfmon: CPUID.0AH reads all zero)",
            );
        }
        self.gp(p)?;
        self.ebx(p)?;
        self.fixed(p)?;
        self.perf_capabilities(p)?;
        self.lbr(p)?;
        self.model_msrs(&p.msrs)?;
        self.nominal_mhz(p)
    }

    /// Version 0: every leaf 0x0A field and PERF_CAPABILITIES must be zero.
    fn version0(&self, p: &PmuProfile) -> Result<(), ProfileError> {
        let numeric: [(&str, u64); 5] = [
            ("gp", p.gp.into()),
            ("gp-width", p.gp_width.into()),
            ("ebx-length", p.ebx_length.into()),
            ("fixed", p.fixed.into()),
            ("fixed-width", p.fixed_width.into()),
        ];
        for (name, value) in numeric {
            if value != 0 {
                return self.fail(field(name, value), VERSION0);
            }
        }
        let vectors: [(&str, u64); 3] = [
            ("ebx-unavailable", p.ebx_unavailable.into()),
            ("fixed-bitmap", p.fixed_bitmap.into()),
            ("perf-capabilities", p.perf_capabilities),
        ];
        for (name, value) in vectors {
            if value != 0 {
                return self.fail(hex_field(name, value), VERSION0);
            }
        }
        if p.lbr.is_some() || p.msrs != ModelMsrs::default() {
            return self.fail(
                "pmu.lbr / pmu.msrs".into(),
                "must be absent when pmu.version = 0: a CPU without architectural perfmon presents none of its model-specific PMU MSRs here",
            );
        }
        self.nominal_mhz(p)
    }

    /// The NetBurst PMU (SDM 18.15) exists only in family 0FH, where IA32_MISC_ENABLE[7] says
    /// performance monitoring is available.
    fn netburst(&self, p: &PmuProfile) -> Result<(), ProfileError> {
        if p.netburst() && !p.misc_enable_perfmon {
            return self.fail(
                field("misc-enable-perfmon", false),
                "must be true when pmu.kind = \"netburst\" (IA32_MISC_ENABLE[7] is set on every NetBurst processor with its PMU)",
            );
        }
        Ok(())
    }

    /// General-purpose counters, version >= 1.
    fn gp(&self, p: &PmuProfile) -> Result<(), ProfileError> {
        if !(1..=MAX_GP).contains(&p.gp) {
            return self.fail(
                field("gp", p.gp),
                "number of general-purpose counters must be 1..=8 for version >= 1 (CPUID.0AH:EAX[15:8]; emon models IA32_PMC0-7 at 0xC1-0xC8 and IA32_PERFEVTSEL0-7 at 0x186-0x18D)",
            );
        }
        if !WIDTHS.contains(&p.gp_width) {
            return self
                .fail(field("gp-width", p.gp_width), "counter width must be 32..=64 bits (CPUID.0AH:EAX[23:16])");
        }
        Ok(())
    }

    /// The architectural-event vector, version >= 1.
    fn ebx(&self, p: &PmuProfile) -> Result<(), ProfileError> {
        if p.ebx_length > MAX_EBX_LENGTH {
            return self.fail(
                field("ebx-length", p.ebx_length),
                "EBX length must be 0..=8 (CPUID.0AH:EAX[31:24]; SDM Table 18-1 defines 8 architectural events in EBX and emon knows these 8)",
            );
        }
        if p.ebx_length == 0 {
            return self.fail(
                field("ebx-length", p.ebx_length),
                "EBX length must be >= 1 for version >= 1 (CPUID.0AH:EAX[31:24]; the Windows HAL and Linux assume EBX bit 0, UnHalted Core Cycles, is meaningful)",
            );
        }
        let meaningful = (1u32 << p.ebx_length) - 1; // ebx_length is 1..=8 here
        if p.ebx_unavailable & !meaningful != 0 {
            return self.fail(
                hex_field("ebx-unavailable", p.ebx_unavailable.into()),
                format!(
                    "bits at or above pmu.ebx-length = {} must be 0 (CPUID.0AH:EBX bits beyond EAX[31:24] are not meaningful)",
                    p.ebx_length
                ),
            );
        }
        Ok(())
    }

    /// Fixed-function counters: EDX (version >= 2) and the ECX bitmap (version 5).
    fn fixed(&self, p: &PmuProfile) -> Result<(), ProfileError> {
        if p.version == 1 {
            if p.fixed != 0 || p.fixed_width != 0 {
                return self.fail(
                    field("version", p.version),
                    format!(
                        "version 1 has no fixed-function counters (CPUID.0AH:EDX is reserved before version 2) but pmu.fixed = {} and pmu.fixed-width = {}: set fixed=0 and fixed-width=0",
                        p.fixed, p.fixed_width
                    ),
                );
            }
        } else if p.fixed > MAX_FIXED {
            return self.fail(
                field("fixed", p.fixed),
                "number of fixed-function counters must be 0..=4 (CPUID.0AH:EDX[4:0]; emon models IA32_FIXED_CTR0-3 at 0x309-0x30C)",
            );
        }
        if p.version < 5 && p.fixed_bitmap != 0 {
            return self.fail(
                hex_field("fixed-bitmap", p.fixed_bitmap.into()),
                "the fixed-counter bitmap must be 0 before version 5 (CPUID.0AH:ECX enumerates fixed counters only from version 5, SDM 18.2.5)",
            );
        }
        if p.fixed_bitmap & !0xF != 0 {
            return self.fail(
                hex_field("fixed-bitmap", p.fixed_bitmap.into()),
                "only bits 0..=3 may be set (CPUID.0AH:ECX; emon models 4 fixed counters, IA32_FIXED_CTR0-3)",
            );
        }
        if p.version >= 2 {
            let any_fixed = p.fixed > 0 || p.fixed_bitmap != 0;
            if any_fixed && !WIDTHS.contains(&p.fixed_width) {
                return self.fail(
                    field("fixed-width", p.fixed_width),
                    "fixed-counter width must be 32..=64 bits when fixed-function counters exist (CPUID.0AH:EDX[12:5])",
                );
            }
            if !any_fixed && p.fixed_width != 0 {
                return self.fail(
                    field("fixed-width", p.fixed_width),
                    "fixed-counter width must be 0 when there are no fixed-function counters (CPUID.0AH:EDX[12:5])",
                );
            }
        }
        Ok(())
    }

    /// IA32_PERF_CAPABILITIES (MSR 0x345), version >= 1.
    fn perf_capabilities(&self, p: &PmuProfile) -> Result<(), ProfileError> {
        let reserved = p.perf_capabilities & !PERF_CAPABILITIES_ACCEPTED;
        if reserved != 0 {
            return self.fail(
                hex_field("perf-capabilities", p.perf_capabilities),
                format!(
                    "bits 0x{reserved:X} are reserved in IA32_PERF_CAPABILITIES (MSR 0x345); emon accepts mask 0x{PERF_CAPABILITIES_ACCEPTED:X}: LBR_FMT[5:0], PEBS_TRAP 6, PEBS_ARCH_REG 7, PEBS_FMT[11:8], SMM_FRZ 12, FW_WRITE 13, PEBS_BASELINE 14, PERF_METRICS 15, PEBS_OUTPUT_PT_AVAIL 16, PEBS_TIMING_INFO 17, RDPMC_METRICS_CLEAR 19"
                ),
            );
        }
        if p.fw_write() && p.version < 2 {
            return self.fail(
                hex_field("perf-capabilities", p.perf_capabilities),
                "FW_WRITE (bit 13) requires version >= 2 (full-width writes through IA32_A_PMCx at 0x4C1, SDM 18.2.5, came with version 2-era PERF_CAPABILITIES)",
            );
        }
        Ok(())
    }

    /// `[pmu.lbr]`: a stack Linux and the SDM recognise, in the format PERF_CAPABILITIES names.
    fn lbr(&self, p: &PmuProfile) -> Result<(), ProfileError> {
        let Some(l) = p.lbr else { return Ok(()) };
        // Without PDCM (a profile that hides IA32_PERF_CAPABILITIES) the stack is still there,
        // but nothing names its format: entries then take plain canonical addresses.
        let format = p.lbr_format();
        if p.pdcm() && !LBR_FORMATS.contains(&format) {
            return self.fail(
                hex_field("perf-capabilities", p.perf_capabilities),
                format!(
                    "with [pmu.lbr], IA32_PERF_CAPABILITIES' LBR_FMT (bits 5:0) must be {}..={}, the record formats emon models (SDM 17.4.8.1)",
                    LBR_FORMATS.start(),
                    LBR_FORMATS.end()
                ),
            );
        }
        if ![4, 8, 16, 32].contains(&l.depth) {
            return self.fail(
                field("lbr.depth", l.depth),
                "the LBR stack has 4, 8, 16 or 32 entries (MSR_LASTBRANCH_TOS counts modulo the depth, SDM 17.4.8)",
            );
        }
        let max = match (l.from, l.to) {
            (LBR_CORE_FROM, LBR_CORE_TO) => LBR_CORE_MAX_DEPTH,
            (LBR_NHM_FROM, LBR_NHM_TO) => LBR_MAX_DEPTH,
            _ => return self.fail(
                format!("pmu.lbr.from = 0x{:X}, pmu.lbr.to = 0x{:X}", l.from, l.to),
                "LASTBRANCH_0_FROM_IP/TO_IP are at 0x40/0x60 (Core 2, Atom) or 0x680/0x6C0 (Nehalem on), SDM Vol. 4",
            ),
        };
        if l.depth > max {
            return self.fail(
                field("lbr.depth", l.depth),
                format!("at most {max} entries fit at 0x{:X}/0x{:X} (SDM Vol. 4)", l.from, l.to),
            );
        }
        let wants_info = format == LBR_FORMAT_INFO;
        if p.pdcm() && l.info != wants_info.then_some(LBR_INFO_0) || l.info.is_some_and(|m| m != LBR_INFO_0) {
            return self.fail(
                format!("pmu.lbr.info = {}", l.info.map_or("absent".into(), |m| format!("0x{m:X}"))),
                format!(
                    "MSR_LBR_INFO_0 is at 0x{LBR_INFO_0:X} with LBR_FMT {LBR_FORMAT_INFO} and absent with any other format (PERF_CAPABILITIES LBR_FMT = {format}, SDM 17.4.8.1)"
                ),
            );
        }
        if l.select & !LBR_SELECT_BITS != 0 {
            return self.fail(
                hex_field("lbr.select", l.select),
                format!("MSR_LBR_SELECT has bits 0x{LBR_SELECT_BITS:X} at most (SDM Vol. 3B, \"Filtering of Last Branch Records\")"),
            );
        }
        Ok(())
    }

    /// `[pmu.msrs]`: no bit both stored and ignored.
    fn model_msrs(&self, m: &ModelMsrs) -> Result<(), ProfileError> {
        let named = [
            ("msrs.offcore-rsp-0", m.offcore_rsp[0]),
            ("msrs.offcore-rsp-1", m.offcore_rsp[1]),
            ("msrs.pebs-ld-lat", m.pebs_ld_lat),
            ("msrs.pebs-frontend", m.pebs_frontend),
        ];
        for (name, bits) in named {
            if let Some(b) = bits.filter(|b| b.bits & b.ignored != 0) {
                return self.fail(
                    format!("pmu.{name} = {{ bits = 0x{:X}, ignored = 0x{:X} }}", b.bits, b.ignored),
                    "a bit is either stored or ignored by a write, not both",
                );
            }
        }
        Ok(())
    }

    fn nominal_mhz(&self, p: &PmuProfile) -> Result<(), ProfileError> {
        if !NOMINAL_MHZ.contains(&p.nominal_mhz) {
            return self.fail(field("nominal-mhz", p.nominal_mhz), "nominal core frequency must be 100..=10000 MHz");
        }
        Ok(())
    }

    /// Vendor string and CPUID.01H:EAX signature.
    fn identity(&self, profile: &Profile) -> Result<(), ProfileError> {
        let vendor = &profile.vendor;
        if vendor.len() != 12 || !vendor.bytes().all(|b| (0x20..=0x7E).contains(&b)) {
            return self.fail(
                format!("vendor = {vendor:?}"),
                "vendor string must be exactly 12 printable ASCII characters (CPUID.0:EBX,EDX,ECX)",
            );
        }
        if let Some(brand) = &profile.brand {
            if brand.len() > 47 || !brand.bytes().all(|b| (0x20..=0x7E).contains(&b)) {
                return self.fail(
                    format!("brand = {brand:?}"),
                    "brand string must be at most 47 printable ASCII characters (CPUID.80000002H-80000004H, NUL-terminated)",
                );
            }
        }
        if !FAMILIES.contains(&profile.family) {
            return self.fail(
                format!("family = 0x{:X}", profile.family),
                "display family must be 0x1..=0x10E (CPUID.01H:EAX[11:8] family, 0xF + extended family EAX[27:20] up to 0xFF)",
            );
        }
        if profile.model > 0xF && profile.family != 0x6 && profile.family < 0xF {
            return self.fail(
                format!("model = 0x{:X}", profile.model),
                format!(
                    "display model above 0xF needs family 0x6 or >= 0xF, not 0x{:X} (CPUID.01H:EAX extended model [19:16] is used only for those families)",
                    profile.family
                ),
            );
        }
        if profile.stepping > 0xF {
            return self.fail(
                format!("stepping = 0x{:X}", profile.stepping),
                "stepping must be 0x0..=0xF (CPUID.01H:EAX[3:0])",
            );
        }
        if profile.pmu.netburst() && (profile.family != 0xF || profile.vendor != "GenuineIntel") {
            return self.fail(
                format!("family = 0x{:X}", profile.family),
                "pmu.kind = \"netburst\" needs an Intel family 0xF processor (SDM 18.15: the NetBurst PMU of Pentium 4 and Xeon)",
            );
        }
        Ok(())
    }
}

impl Check<'_> {
    /// The `[cache]` table: line size, each level's geometry, and sizes growing outward.
    fn cache(&self, c: &Cache) -> Result<(), ProfileError> {
        if !c.line.is_power_of_two() || !(MIN_CACHE_LINE..=MAX_CACHE_LINE).contains(&c.line) {
            return self.fail(
                format!("cache.line = {}", c.line),
                format!(
                    "line size must be a power of two from {MIN_CACHE_LINE} to {MAX_CACHE_LINE} bytes (CPUID.04H:EBX[11:0] holds line size - 1)"
                ),
            );
        }
        let mut levels = vec![("l1d", c.l1d), ("l1i", c.l1i)];
        levels.extend(c.l2.map(|l2| ("l2", l2)));
        levels.push(("llc", c.llc));
        for (name, level) in levels {
            self.cache_level(name, level, c.line)?;
        }
        let mut inner = ("l1d", c.l1d);
        for outer in c.l2.map(|l2| ("l2", l2)).into_iter().chain([("llc", c.llc)]) {
            if outer.1.kib < inner.1.kib {
                return self.fail(
                    format!("cache.{}.kib = {}", outer.0, outer.1.kib),
                    format!(
                        "a level must be at least as large as the one inside it, cache.{}.kib = {} (the LLC is inclusive of L1d and L2)",
                        inner.0, inner.1.kib
                    ),
                );
            }
            inner = outer;
        }
        self.prefetchers(&c.prefetchers, c.line)
    }

    /// The `[cache.prefetchers]` table: a streamer that reaches within a 4 KiB page, and at most
    /// one control register, which can turn off every prefetcher the CPU has.
    fn prefetchers(&self, p: &Prefetchers, line: u32) -> Result<(), ProfileError> {
        if let Some(s) = p.streamer {
            // The streamer does not cross a 4 KiB page (the optimization manual, "Data Prefetching").
            let reach = (4096 / line).saturating_sub(1);
            if !(1..=reach).contains(&s.distance) {
                return self.fail(
                    format!("cache.prefetchers.streamer.distance = {}", s.distance),
                    format!("must be 1..={reach}: the streamer prefetches lines ahead within a 4 KiB page ({line}-byte lines)"),
                );
            }
            if !(1..=MAX_STREAMER_PAGES).contains(&s.pages) {
                return self.fail(
                    format!("cache.prefetchers.streamer.pages = {}", s.pages),
                    format!("must be 1..={MAX_STREAMER_PAGES} (the 4 KiB pages it tracks a stream in)"),
                );
            }
        }
        if let Some(bits) = p.misc_feature_control {
            if p.misc_enable {
                return self.fail(
                    "cache.prefetchers.misc-enable = true".to_string(),
                    "a CPU controls its prefetchers through MSR_MISC_FEATURE_CONTROL (0x1A4, Nehalem on) or IA32_MISC_ENABLE (Core 2, NetBurst), not both",
                );
            }
            let present = p.present();
            if let Some(c) =
                CONTROL_BITS.iter().find(|c| present.contains(c.prefetcher) && bits & c.misc_feature_control == 0)
            {
                return self.fail(
                    format!("cache.prefetchers.misc-feature-control = {bits:#x}"),
                    format!(
                        "must hold bit {}, which turns the {} prefetcher off (Intel's disclosure of MSR 0x1A4)",
                        c.misc_feature_control.trailing_zeros(),
                        c.name
                    ),
                );
            }
        }
        Ok(())
    }

    /// One level: size, ways, and a whole power-of-two number of sets.
    fn cache_level(&self, name: &str, level: CacheLevel, line: u32) -> Result<(), ProfileError> {
        if !(1..=MAX_CACHE_KIB).contains(&level.kib) {
            return self.fail(
                format!("cache.{name}.kib = {}", level.kib),
                format!("cache size must be 1..={MAX_CACHE_KIB} KiB (1 GiB)"),
            );
        }
        if !(1..=MAX_CACHE_WAYS).contains(&level.ways) {
            return self.fail(
                format!("cache.{name}.ways = {}", level.ways),
                "ways of associativity must be 1..=1024 (CPUID.04H:EBX[31:22] holds ways - 1)",
            );
        }
        let per_set = u64::from(line) * u64::from(level.ways);
        let field = || format!("cache.{name} = {{ kib = {}, ways = {} }}", level.kib, level.ways);
        const WHY: &str = "the number of sets must be a whole power of two (the model picks a set by the low bits of the line address)";
        if level.bytes() % per_set != 0 {
            return self.fail(
                field(),
                format!("{} KiB is not a whole number of sets of {} {line}-byte lines: {WHY}", level.kib, level.ways),
            );
        }
        let sets = level.sets(line);
        if !sets.is_power_of_two() {
            return self.fail(
                field(),
                format!("{} KiB / ({} ways x {line}-byte lines) = {sets} sets: {WHY}", level.kib, level.ways),
            );
        }
        Ok(())
    }

    /// The `[clock]` table.
    fn clock(&self, c: &Clock) -> Result<(), ProfileError> {
        if c.tsc_per_ref_numerator == 0 || c.tsc_per_ref_denominator == 0 {
            return self.fail(
                format!("clock.tsc-per-ref = [{}, {}]", c.tsc_per_ref_numerator, c.tsc_per_ref_denominator),
                "numerator and denominator must both be non-zero (TSC ticks per reference-clock tick; with leaf-15h they are CPUID.15H:EBX and EAX)",
            );
        }
        if !c.leaf_15h && c.crystal_hz != 0 {
            return self.fail(
                format!("clock.crystal-hz = {}", c.crystal_hz),
                "must be 0 when clock.leaf-15h = false (it is CPUID.15H:ECX, and a CPU without leaf 15H enumerates no crystal frequency)",
            );
        }
        if let Some(f) = c.frequency_mhz {
            if f.base == 0 || f.base > f.max {
                return self.fail(
                    format!("clock.frequency-mhz = {{ base = {}, max = {}, bus = {} }}", f.base, f.max, f.bus),
                    "base must be non-zero and at most max (CPUID.16H: the processor's base and maximum frequencies in MHz)",
                );
            }
        }
        Ok(())
    }
}
