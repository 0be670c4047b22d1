//! Profile TOML format: parsing (`Profile::from_toml`) and loading (`Profile::load`).

use std::path::Path;

use serde::Deserialize;

use super::error::one_line;
use super::{
    builtin, Cache, CacheLevel, Clock, FrequencyMhz, Lbr, ModelMsrs, MsrBits, PmuKind, PmuProfile, Prefetchers,
    Profile, ProfileError, Streamer,
};

/// Default for `pmu.nominal-mhz` when the file leaves it out.
pub const DEFAULT_NOMINAL_MHZ: u32 = 2000;

/// Top level of a profile file. Every key is required except the `[cache]` and `[clock]`
/// tables, which default to [`Cache::SKYLAKE_CLIENT`] and [`Clock::TSC`].
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct ProfileFile {
    description: String,
    vendor: String,
    family: u16,
    model: u8,
    stepping: u8,
    brand: Option<String>,
    microcode: Option<u32>,
    pmu: PmuFile,
    cache: Option<CacheFile>,
    clock: Option<ClockFile>,
}

/// The `[cache]` table. `l1d` and `llc` are required; `line` defaults to 64, `l1i` to `l1d`,
/// a file without `l2` describes a CPU whose LLC is its second level, and one without
/// `[cache.prefetchers]` a CPU without hardware prefetchers.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct CacheFile {
    #[serde(default = "default_line")]
    line: u32,
    l1d: LevelFile,
    l1i: Option<LevelFile>,
    l2: Option<LevelFile>,
    llc: LevelFile,
    prefetchers: Option<PrefetchersFile>,
}

/// The `[cache.prefetchers]` table: each prefetcher the CPU has (all default to absent), and the
/// register that turns them off (`misc-feature-control`: MSR 0x1A4's writable bits;
/// `misc-enable`: IA32_MISC_ENABLE's disable bits).
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct PrefetchersFile {
    #[serde(default)]
    dcu: bool,
    #[serde(default)]
    ip_stride: bool,
    streamer: Option<StreamerFile>,
    #[serde(default)]
    adjacent_line: bool,
    misc_feature_control: Option<u64>,
    #[serde(default)]
    misc_enable: bool,
}

/// `streamer = { distance = 20, pages = 32 }`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct StreamerFile {
    distance: u32,
    pages: u32,
}

impl From<PrefetchersFile> for Prefetchers {
    fn from(f: PrefetchersFile) -> Self {
        Prefetchers {
            dcu: f.dcu,
            ip_stride: f.ip_stride,
            streamer: f.streamer.map(|s| Streamer { distance: s.distance, pages: s.pages }),
            adjacent_line: f.adjacent_line,
            misc_feature_control: f.misc_feature_control,
            misc_enable: f.misc_enable,
        }
    }
}

fn default_line() -> u32 {
    64
}

/// One cache level, `{ kib = 32, ways = 8 }`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct LevelFile {
    kib: u32,
    ways: u32,
}

impl From<LevelFile> for CacheLevel {
    fn from(f: LevelFile) -> Self {
        CacheLevel { kib: f.kib, ways: f.ways }
    }
}

impl From<CacheFile> for Cache {
    fn from(f: CacheFile) -> Self {
        let l1d = CacheLevel::from(f.l1d);
        Cache {
            line: f.line,
            l1d,
            l1i: f.l1i.map_or(l1d, CacheLevel::from),
            l2: f.l2.map(CacheLevel::from),
            llc: f.llc.into(),
            prefetchers: f.prefetchers.map(Prefetchers::from).unwrap_or_default(),
        }
    }
}

/// The `[clock]` table. `tsc-per-ref` is required; `leaf-15h` defaults to false,
/// `crystal-hz` to 0, and without `frequency-mhz` there is no leaf 16H.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct ClockFile {
    #[serde(deserialize_with = "numerator_denominator")]
    tsc_per_ref: [u32; 2],
    #[serde(default)]
    leaf_15h: bool,
    #[serde(default)]
    crystal_hz: u32,
    frequency_mhz: Option<FrequencyFile>,
}

/// `frequency-mhz = { base = ..., max = ..., bus = ... }`: CPUID leaf 16H, in MHz.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FrequencyFile {
    base: u16,
    max: u16,
    bus: u16,
}

/// `[numerator, denominator]`: exactly two numbers (serde's arrays would ignore a third).
fn numerator_denominator<'de, D: serde::Deserializer<'de>>(d: D) -> Result<[u32; 2], D::Error> {
    let values = Vec::<u32>::deserialize(d)?;
    <[u32; 2]>::try_from(values.as_slice())
        .map_err(|_| serde::de::Error::invalid_length(values.len(), &"2 numbers, [numerator, denominator]"))
}

impl From<ClockFile> for Clock {
    fn from(f: ClockFile) -> Self {
        let [numerator, denominator] = f.tsc_per_ref;
        Clock {
            tsc_per_ref_numerator: numerator,
            tsc_per_ref_denominator: denominator,
            leaf_15h: f.leaf_15h,
            crystal_hz: f.crystal_hz,
            frequency_mhz: f.frequency_mhz.map(|f| FrequencyMhz { base: f.base, max: f.max, bus: f.bus }),
        }
    }
}

/// `pmu.kind`: `"architectural"` (CPUID leaf 0x0A) or `"netburst"` (SDM 18.15).
#[derive(Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
enum KindFile {
    #[default]
    Architectural,
    Netburst,
}

/// The `[pmu]` table. Only `version` is required: the numeric fields default to 0 (so a
/// version 0 profile is short), `kind` to `"architectural"`, `misc-enable-perfmon` to
/// `version > 0` (true for NetBurst), `nominal-mhz` to [`DEFAULT_NOMINAL_MHZ`], and the
/// `[pmu.lbr]` and `[pmu.msrs]` tables to absent MSRs.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct PmuFile {
    #[serde(default)]
    kind: KindFile,
    version: u8,
    #[serde(default)]
    gp: u8,
    #[serde(default)]
    gp_width: u8,
    #[serde(default)]
    ebx_length: u8,
    #[serde(default)]
    ebx_unavailable: u32,
    #[serde(default)]
    fixed: u8,
    #[serde(default)]
    fixed_width: u8,
    #[serde(default)]
    fixed_bitmap: u32,
    #[serde(default)]
    perf_capabilities: u64,
    misc_enable_perfmon: Option<bool>,
    nominal_mhz: Option<u32>,
    lbr: Option<LbrFile>,
    msrs: Option<MsrsFile>,
}

/// The `[pmu.lbr]` table: `depth`, `from` and `to` are required; `info` (format 5) and
/// `select` (MSR_LBR_SELECT's writable bits) default to absent.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct LbrFile {
    depth: u8,
    from: u32,
    to: u32,
    info: Option<u32>,
    #[serde(default)]
    select: u64,
}

impl From<LbrFile> for Lbr {
    fn from(f: LbrFile) -> Self {
        Lbr { depth: f.depth, from: f.from, to: f.to, info: f.info, select: f.select }
    }
}

/// The `[pmu.msrs]` table: each model-specific MSR the CPU has, `{ bits = .., ignored = .. }`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct MsrsFile {
    offcore_rsp_0: Option<MsrBitsFile>,
    offcore_rsp_1: Option<MsrBitsFile>,
    pebs_ld_lat: Option<MsrBitsFile>,
    pebs_frontend: Option<MsrBitsFile>,
}

/// `{ bits = 0xFFFF, ignored = 0xFFFFFFFFFFFF0000 }`; `ignored` defaults to 0.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct MsrBitsFile {
    bits: u64,
    #[serde(default)]
    ignored: u64,
}

impl From<MsrBitsFile> for MsrBits {
    fn from(f: MsrBitsFile) -> Self {
        MsrBits { bits: f.bits, ignored: f.ignored }
    }
}

impl From<MsrsFile> for ModelMsrs {
    fn from(f: MsrsFile) -> Self {
        ModelMsrs {
            offcore_rsp: [f.offcore_rsp_0.map(MsrBits::from), f.offcore_rsp_1.map(MsrBits::from)],
            pebs_ld_lat: f.pebs_ld_lat.map(MsrBits::from),
            pebs_frontend: f.pebs_frontend.map(MsrBits::from),
        }
    }
}

impl From<PmuFile> for PmuProfile {
    fn from(f: PmuFile) -> Self {
        let kind = match f.kind {
            KindFile::Architectural => PmuKind::Architectural,
            KindFile::Netburst => PmuKind::NetBurst,
        };
        PmuProfile {
            version: f.version,
            gp: f.gp,
            gp_width: f.gp_width,
            ebx_length: f.ebx_length,
            ebx_unavailable: f.ebx_unavailable,
            fixed: f.fixed,
            fixed_width: f.fixed_width,
            fixed_bitmap: f.fixed_bitmap,
            perf_capabilities: f.perf_capabilities,
            misc_enable_perfmon: f.misc_enable_perfmon.unwrap_or(f.version > 0 || kind == PmuKind::NetBurst),
            nominal_mhz: f.nominal_mhz.unwrap_or(DEFAULT_NOMINAL_MHZ),
            lbr: f.lbr.map(Lbr::from),
            msrs: f.msrs.map(ModelMsrs::from).unwrap_or_default(),
            kind,
            events: None,
        }
    }
}

impl Profile {
    /// Built-in profile names (embedded from `resources/profiles/*.toml`), sorted.
    pub fn builtin_names() -> Vec<&'static str> {
        builtin::names()
    }

    /// Load a profile: the NAME of a built-in, or a PATH to a `.toml` file (anything
    /// containing `/` or ending in `.toml`). The result is validated.
    pub fn load(spec: &str) -> Result<Profile, ProfileError> {
        if spec.contains('/') || spec.ends_with(".toml") {
            let text = std::fs::read_to_string(spec)
                .map_err(|e| ProfileError::Io { path: spec.to_string(), message: one_line(&e.to_string()) })?;
            return Profile::from_toml(spec, &text);
        }
        match builtin::text(spec) {
            Some(text) => Profile::from_toml(spec, text),
            None => Err(ProfileError::UnknownProfile {
                name: spec.to_string(),
                available: builtin::names().into_iter().map(String::from).collect(),
            }),
        }
    }

    /// Parse and validate profile TOML. `source_name` (a path or a built-in name) names the
    /// source in errors; its file stem becomes [`Profile::name`].
    pub fn from_toml(source_name: &str, text: &str) -> Result<Profile, ProfileError> {
        let file: ProfileFile = toml::from_str(text).map_err(|e| toml_error(source_name, text, &e))?;
        let mut profile = Profile {
            name: profile_name(source_name),
            description: file.description,
            vendor: file.vendor,
            family: file.family,
            model: file.model,
            stepping: file.stepping,
            brand: file.brand,
            microcode: file.microcode,
            pmu: file.pmu.into(),
            cache: file.cache.map_or_else(Cache::default, Cache::from),
            clock: file.clock.map_or_else(Clock::default, Clock::from),
        };
        profile.resolve_events();
        profile.validate_as(source_name)?;
        Ok(profile)
    }
}

/// `resources/profiles/nehalem.toml` -> `nehalem`; a built-in name stays as it is.
fn profile_name(source_name: &str) -> String {
    Path::new(source_name)
        .file_stem()
        .and_then(|s| s.to_str())
        .filter(|s| !s.is_empty())
        .unwrap_or(source_name)
        .to_string()
}

/// A one-line [`ProfileError::Toml`]: position and text of the offending line, then the
/// parser's message.
fn toml_error(origin: &str, text: &str, err: &toml::de::Error) -> ProfileError {
    let location = match err.span() {
        Some(span) => {
            let start = span.start.min(text.len());
            let before = text.get(..start).unwrap_or("");
            let line_no = before.matches('\n').count() + 1;
            let line_start = before.rfind('\n').map_or(0, |i| i + 1);
            let column = before.get(line_start..).map_or(0, |s| s.chars().count()) + 1;
            let line = text.lines().nth(line_no - 1).unwrap_or("").trim();
            format!("line {line_no}, column {column} (`{line}`)")
        }
        None => "document".to_string(),
    };
    ProfileError::Toml { origin: origin.to_string(), location, message: one_line(err.message()) }
}
