//! Running code that is expected to fault: `catch(|| wrmsr(...))` returns the exception it raised.
//!
//! `emon_catch_call` saves the callee-saved registers and the stack pointer, then calls the
//! closure. If an exception arrives while a catch is active, the IDT dispatcher resumes at
//! `emon_catch_recover` on the saved stack, which returns the exception to the caller
//! (a setjmp/longjmp across the fault). Catches do not nest.
use crate::idt::Regs;
use core::arch::global_asm;
use core::sync::atomic::{AtomicU64, Ordering};

/// An exception raised by code run under [`catch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exception {
    pub vector: u8,
    pub error_code: u32,
}

impl Exception {
    pub const GP: u8 = 13;
    pub const UD: u8 = 6;
    pub fn is_gp(&self) -> bool {
        self.vector == Self::GP
    }
}

static CATCH_RSP: AtomicU64 = AtomicU64::new(0);
const CAUGHT: u64 = 1 << 63;

global_asm!(
    ".section .text",
    ".global emon_catch_call",
    "emon_catch_call:",
    "push rbx",
    "push rbp",
    "push r12",
    "push r13",
    "push r14",
    "push r15",
    "sub rsp, 8",
    "mov [rip + {rsp}], rsp",
    "mov rax, rdi",
    "mov rdi, rsi",
    "call rax",
    "xor eax, eax",
    ".global emon_catch_recover",
    "emon_catch_recover:",
    "mov qword ptr [rip + {rsp}], 0",
    "add rsp, 8",
    "pop r15",
    "pop r14",
    "pop r13",
    "pop r12",
    "pop rbp",
    "pop rbx",
    "ret",
    rsp = sym CATCH_RSP,
);

extern "C" {
    fn emon_catch_call(f: extern "C" fn(*mut u8), data: *mut u8) -> u64;
    fn emon_catch_recover();
}

/// Runs `f`; returns the exception it raised, or `None` if it ran to completion.
pub fn catch<F: FnOnce()>(f: F) -> Option<Exception> {
    extern "C" fn trampoline<F: FnOnce()>(data: *mut u8) {
        // SAFETY: `data` points at the `Option<F>` below, alive for the whole call.
        let f = unsafe { &mut *(data as *mut Option<F>) };
        if let Some(f) = f.take() {
            f()
        }
    }
    let mut f = Some(f);
    // SAFETY: the trampoline matches the data pointer's type.
    let r = unsafe { emon_catch_call(trampoline::<F>, &mut f as *mut Option<F> as *mut u8) };
    (r & CAUGHT != 0).then_some(Exception { vector: r as u8, error_code: (r >> 8) as u32 })
}

/// Called by the dispatcher for exceptions: if a catch is active, arrange for the `iretq` to
/// resume in `emon_catch_recover` with the exception in RAX.
pub(crate) fn recover(regs: &mut Regs) -> bool {
    let rsp = CATCH_RSP.load(Ordering::SeqCst);
    if rsp == 0 {
        return false;
    }
    regs.rax = CAUGHT | ((regs.error_code & 0xFFFF_FFFF) << 8) | (regs.vector & 0xFF);
    regs.rip = emon_catch_recover as *const () as u64;
    regs.rsp = rsp;
    // The catch runs in the kernel even when the fault came from user mode (CPL3), and does not
    // single-step itself when user mode did (RFLAGS.TF).
    regs.cs = crate::idt::KERNEL_CS as u64;
    regs.ss = crate::idt::KERNEL_DS as u64;
    regs.rflags &= !(1 << 8);
    true
}

/// Reports `name` as passed if `f` raises #GP.
pub fn expect_gp<F: FnOnce()>(name: core::fmt::Arguments, f: F) -> bool {
    let e = catch(f);
    let ok = matches!(e, Some(e) if e.is_gp());
    if !ok {
        match e {
            None => crate::println!("  (no exception)"),
            Some(e) => crate::println!("  (got vector {} instead of #GP)", e.vector),
        }
    }
    crate::report::report_fmt(ok, name)
}

/// Reports `name` as passed if `f` runs without an exception.
pub fn expect_no_fault<F: FnOnce()>(name: core::fmt::Arguments, f: F) -> bool {
    let e = catch(f);
    if let Some(e) = e {
        crate::println!("  (unexpected vector {} error {:#x})", e.vector, e.error_code);
    }
    crate::report::report_fmt(e.is_none(), name)
}
