//! emon: a minimal KVM virtual machine monitor that virtualizes the Intel architectural
//! performance-monitoring unit in userspace.
//!
//! The layers, each depending only on those before it:
//! - [`profile`] and [`pmu`] (crate `emon-pmu`): the PMU a guest sees, from TOML profiles, and
//!   the virtual PMU, a pure state machine over the architectural perfmon MSRs.
//! - [`x86`] (crate `emon-x86`): the guest's CPU mode and page walk, instruction facts, and the
//!   x87/SSE state layout.
//! - [`backend`] (crate `emon-backend`): what makes the counters count (precise single-stepping;
//!   host perf events), driving the vCPU through its `Vcpu` trait.
//! - [`vmm`]: KVM setup, boot paths, devices, MSR trapping and the exit loop.
//! - [`host_report`]: `emon host`, what this host offers emon.
//! - [`runner`]: `emon test`, the test-matrix runner.
//! - [`cli`]: the `emon` command line.
//! - [`status`]: emon's exit statuses.
pub use emon_backend as backend;
pub use emon_pmu::{pmu, profile};
pub use emon_x86 as x86;
pub mod bench;
pub mod cli;
pub mod guests;
pub mod host_report;
pub mod runner;
pub mod status;
pub mod vmm;
