//! Entry from emon (long mode, RDI = command line or 0, RSI = RAM size) and the panic handler.
use core::arch::global_asm;

/// What emon passes at entry.
#[repr(C)]
pub struct BootInfo {
    cmdline: *const u8,
    cmdline_len: usize,
    /// Guest RAM size in bytes.
    pub mem_size: u64,
}

impl BootInfo {
    /// The command line given after `--` on emon's command line ("" if none).
    pub fn cmdline(&self) -> &str {
        if self.cmdline.is_null() {
            return "";
        }
        // SAFETY: emon wrote `cmdline_len` bytes of valid UTF-8 (it comes from a Rust String).
        let bytes = unsafe { core::slice::from_raw_parts(self.cmdline, self.cmdline_len) };
        core::str::from_utf8(bytes).unwrap_or("")
    }

    /// The value of `key=value` on the command line.
    pub fn arg(&self, key: &str) -> Option<&str> {
        self.cmdline().split_whitespace().find_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            (k == key).then_some(v)
        })
    }
}

global_asm!(
    ".section .text.start, \"ax\"",
    ".global _start",
    "_start:",
    "and rsp, -16",
    "call {start}",
    "ud2",
    start = sym rt_start,
);

extern "C" {
    fn emon_guest_main(boot: &BootInfo) -> i32;
}

extern "C" fn rt_start(cmdline: *const u8, mem_size: u64) -> ! {
    crate::idt::init();
    let mut cmdline_len = 0;
    if !cmdline.is_null() {
        // SAFETY: emon NUL-terminates the command line.
        while unsafe { *cmdline.add(cmdline_len) } != 0 {
            cmdline_len += 1;
        }
    }
    let boot = BootInfo { cmdline, cmdline_len, mem_size };
    // SAFETY: every guest binary defines it with `entry!`.
    let code = unsafe { emon_guest_main(&boot) };
    crate::exit::exit(code)
}

/// Prints the SUMMARY line and ends the run with its exit code.
pub fn summary_and_exit() -> ! {
    crate::exit::exit(crate::summary())
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo) -> ! {
    crate::println!("FAIL: guest panic: {}", info);
    crate::report::note_failure();
    summary_and_exit()
}

/// `core` is built with unwinding and references this symbol; guests abort on panic.
#[no_mangle]
pub extern "C" fn rust_eh_personality() {}
