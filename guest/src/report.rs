//! kvm-unit-tests-style reporting: `PASS: name`, `FAIL: name`, `SKIP: name`, and a final
//! `SUMMARY: N tests, M unexpected failures, K skipped`.
use core::fmt;
use core::sync::atomic::{AtomicU32, Ordering};

static TESTS: AtomicU32 = AtomicU32::new(0);
static FAILURES: AtomicU32 = AtomicU32::new(0);
static SKIPPED: AtomicU32 = AtomicU32::new(0);

/// Reports one test; returns `ok`.
pub fn report(ok: bool, name: &str) -> bool {
    report_fmt(ok, format_args!("{name}"))
}

pub fn report_fmt(ok: bool, name: fmt::Arguments) -> bool {
    TESTS.fetch_add(1, Ordering::SeqCst);
    if ok {
        crate::println!("PASS: {}", name);
    } else {
        FAILURES.fetch_add(1, Ordering::SeqCst);
        crate::println!("FAIL: {}", name);
    }
    ok
}

pub fn report_skip(name: fmt::Arguments) {
    SKIPPED.fetch_add(1, Ordering::SeqCst);
    crate::println!("SKIP: {}", name);
}

/// Records a failure reported by other means (e.g. an unexpected exception).
pub fn note_failure() {
    TESTS.fetch_add(1, Ordering::SeqCst);
    FAILURES.fetch_add(1, Ordering::SeqCst);
}

/// Prints the SUMMARY line; returns the exit code (0 when nothing failed, 1 otherwise).
pub fn summary() -> i32 {
    let (t, f, s) = (TESTS.load(Ordering::SeqCst), FAILURES.load(Ordering::SeqCst), SKIPPED.load(Ordering::SeqCst));
    crate::println!("SUMMARY: {t} tests, {f} unexpected failures, {s} skipped");
    i32::from(f != 0)
}

/// `check!(cond, "name {}", x)`: reports a test named by the format string.
#[macro_export]
macro_rules! check {
    ($ok:expr, $($arg:tt)*) => { $crate::report::report_fmt($ok, format_args!($($arg)*)) };
}

/// `check_eq!(got, want, "name {}", x)`: reports, printing both values when they differ.
#[macro_export]
macro_rules! check_eq {
    ($got:expr, $want:expr, $($arg:tt)*) => {{
        let (g, w) = ($got, $want);
        if g != w {
            $crate::println!("  got {:#x}, want {:#x}", g, w);
        }
        $crate::report::report_fmt(g == w, format_args!($($arg)*))
    }};
}

/// `skip!("name {}", x)`
#[macro_export]
macro_rules! skip {
    ($($arg:tt)*) => { $crate::report::report_skip(format_args!($($arg)*)) };
}
