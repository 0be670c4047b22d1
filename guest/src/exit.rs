//! Ending the run through emon's isa-debug-exit compatible port.
use crate::pio::outl;

/// isa-debug-exit compatible port: a 32-bit write of `code` ends the run with that status.
pub const DEBUG_EXIT_PORT: u16 = 0xF4;

pub fn exit(code: i32) -> ! {
    outl(DEBUG_EXIT_PORT, code as u32);
    // Not reached under emon; under anything else, stop here.
    loop {
        // SAFETY: halting with interrupts disabled parks the CPU.
        unsafe { core::arch::asm!("cli; hlt", options(nomem, nostack)) }
    }
}
