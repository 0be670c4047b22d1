//! CPU profiles: the CPUID identity and architectural-perfmon (CPUID leaf 0x0A) model a
//! guest sees, loaded from TOML (`resources/profiles/*.toml` are built in), adjusted with
//! `--pmu k=v,...` overrides, and validated against the SDM's rules.
//!
//! - `pmu.rs`: [`PmuProfile`], leaf 0x0A encoding and fixed-counter enumeration.
//! - `arch_event.rs`: [`ARCH_EVENTS`], SDM Table 18-1.
//! - `cache.rs`: [`Cache`], the modelled data-cache hierarchy and its CPUID leaf 04H.
//! - `prefetch.rs`: [`Prefetchers`], the hardware prefetchers that fill it, and their control.
//! - `clock.rs`: [`Clock`], the reference clock and CPUID leaves 15H and 16H.
//! - `model_msrs.rs`: [`Lbr`] and [`ModelMsrs`], the model-specific PMU MSRs.
//! - `cpu.rs`: [`Profile`], CPUID leaf 0 / leaf 1 encoding.
//! - `file.rs`: TOML format, [`Profile::load`], [`Profile::from_toml`].
//! - `builtin.rs`: the embedded profiles.
//! - `validate.rs`: the rules, [`Profile::validate`].
//! - `overrides.rs`: [`Profile::apply_overrides`].
//! - `describe.rs`: [`describe_leaf_0a`].
//! - `listing.rs`: [`event_listing`], what `emon events` lists.
//! - `error.rs`: [`ProfileError`].

mod arch_event;
mod builtin;
mod cache;
mod clock;
mod cpu;
mod describe;
mod error;
mod file;
mod listing;
mod model_msrs;
mod overrides;
mod pmu;
mod prefetch;
mod validate;

#[cfg(test)]
mod tests;

pub use arch_event::{ArchEvent, Event, ARCH_EVENTS};
pub use cache::{Cache, CacheLevel};
pub use clock::{Clock, FrequencyMhz};
pub use cpu::Profile;
pub use describe::describe_leaf_0a;
pub use error::ProfileError;
pub use file::DEFAULT_NOMINAL_MHZ;
pub use listing::{event_listing, EventListing, Listed};
pub use model_msrs::{
    Lbr, ModelMsrs, MsrBits, LBR_CORE_FROM, LBR_CORE_MAX_DEPTH, LBR_CORE_TO, LBR_FORMATS, LBR_FORMAT_INFO, LBR_INFO_0,
    LBR_MAX_DEPTH, LBR_NHM_FROM, LBR_NHM_TO, LBR_SELECT_BITS,
};
pub use overrides::{parse_u64, NumberError, KEYS as OVERRIDE_KEYS};
pub use pmu::{PmuKind, PmuProfile, PreciseOnly};
pub use prefetch::{ControlBit, PrefetcherSet, Prefetchers, Streamer, CONTROL_BITS};
pub use validate::{
    MAX_CACHE_KIB, MAX_CACHE_LINE, MAX_CACHE_WAYS, MAX_EBX_LENGTH, MAX_FIXED, MAX_GP, MAX_STREAMER_PAGES, MAX_VERSION,
    MIN_CACHE_LINE, PERF_CAPABILITIES_ACCEPTED,
};
