//! The emon guest runtime: what a bare-metal test guest needs to run under emon and report
//! like kvm-unit-tests (`PASS:`/`FAIL:`/`SKIP:` lines and a final `SUMMARY:`).
//!
//! A guest is a `#![no_std] #![no_main]` binary in `src/bin/` that calls [`entry!`] with its
//! main function; emon enters `_start` in 64-bit long mode (see the README's "Guest entry state").
#![no_std]

pub mod apic;
pub mod catch;
pub mod cpu;
pub mod events;
pub mod exit;
pub mod fmt;
pub mod idt;
mod mem;
pub mod models;
pub mod msr;
pub mod netburst;
pub mod pio;
pub mod pmu;
pub mod prefetch;
pub mod report;
pub mod serial;
mod start;
pub mod user;
pub use start::summary_and_exit;

pub use catch::{catch, expect_gp, expect_no_fault, Exception};
pub use fmt::{dec, Dec};
pub use report::{report, report_skip, summary};
pub use start::BootInfo;

/// Declares the guest's main function: `fn main(boot: &BootInfo) -> i32`.
/// Its return value is the exit code emon exits with (0 = success).
#[macro_export]
macro_rules! entry {
    ($main:path) => {
        #[no_mangle]
        pub extern "C" fn emon_guest_main(boot: &$crate::BootInfo) -> i32 {
            let f: fn(&$crate::BootInfo) -> i32 = $main;
            f(boot)
        }
    };
}
