//! emon: a minimal KVM virtual machine monitor that virtualizes the Intel architectural
//! performance-monitoring unit in userspace.
//!
//! - [`profile`]: the PMU a guest sees (CPUID leaf 0x0A and friends), from TOML profiles.
//! - [`pmu`]: the virtual PMU, a pure state machine over the architectural perfmon MSRs.
//! - [`backend`]: what makes the counters count (precise single-stepping; host perf events).
//! - [`vmm`]: KVM setup, boot paths, devices, MSR trapping and the exit loop.
//! - [`host_report`]: `emon host`, what this host offers emon.
//! - [`runner`]: `emon test`, the test-matrix runner.
//! - [`cli`]: the `emon` command line.
//! - [`status`]: emon's exit statuses.
pub mod backend;
pub mod bench;
pub mod cli;
pub mod guests;
pub mod host_report;
pub mod pmu;
pub mod profile;
pub mod runner;
pub mod status;
pub mod vmm;
