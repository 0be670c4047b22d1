//! emon's exit statuses, in one place. The README ("Command line") documents them:
//!
//! | how the run ended | status |
//! |---|---|
//! | the guest wrote `code` to the debug-exit port 0xF4 | `code` (unlike QEMU's `(code << 1) \| 1`) |
//! | triple fault or shutdown; the vCPU registers are printed | 3 ([`SHUTDOWN`]) |
//! | `--timeout` | 4 ([`TIMEOUT`]) |
//! | the guest kernel printed `Kernel panic - not syncing:` and then stopped (a reset, a triple fault, the timeout, or its panic's end marker and a second of console silence) | 5 ([`PANIC`]) |
//! | Ctrl-C | 130 ([`INTERRUPTED`]) |
//! | an error in emon's input or set-up (profile, kernel, options, no KVM) | 2 ([`ERROR`]), with a one-line message |
//!
//! `emon test` exits 1 ([`FAILED`]) when a run failed, and 2 for bad input (README, "`emon test`").

/// An error in emon's input or set-up (a bad profile, kernel, option, no KVM).
pub const ERROR: u8 = 2;
/// The guest triple-faulted or shut down.
pub const SHUTDOWN: u8 = 3;
/// `--timeout` stopped the guest.
pub const TIMEOUT: u8 = 4;
/// The guest kernel panicked (its console said so), whatever stopped it after that.
pub const PANIC: u8 = 5;
/// Ctrl-C stopped the guest (128 + SIGINT, as a shell reports it).
pub const INTERRUPTED: u8 = 130;
/// `emon test`: at least one run failed.
pub use crate::runner::STATUS_FAILED as FAILED;
