//! emon's PMU model, with no KVM and no I/O in it.
//!
//! - [`profile`]: the PMU a guest sees, from TOML profiles named after real CPUs: CPUID leaf
//!   0x0A, IA32_PERF_CAPABILITIES and the CPU's identity, checked against the SDM's rules.
//! - [`events`]: the model-specific events of the CPUs the profiles name, from Intel's
//!   published lists, and what emon counts for each.
//! - [`pmu`]: the virtual PMU of one vCPU, a pure `Clone + Eq` state machine over every
//!   architectural performance-monitoring MSR with the SDM's semantics.
//!
//! A VMM forwards the guest's RDMSR/WRMSR of [`pmu::Pmu::TRAPPED_MSRS`] to [`pmu::Pmu`], and a
//! counting backend (the `emon-backend` crate) adds the events it counts and reprograms the
//! counters [`pmu::Pmu::take_reprogram`] reports.
pub mod events;
pub mod pmu;
pub mod profile;
