//! User mode (CPL3) for tests: making RAM reachable from CPL3, and running a function there
//! until it traps back into the kernel.
use crate::idt::{USER_CS, USER_DS};
use core::arch::asm;

#[repr(C, align(16))]
struct Stack([u8; 4096]);
static mut USER_STACK: Stack = Stack([0; 4096]);

/// Sets the user/supervisor bit on every present page-table entry reachable from CR3 (the
/// identity map of RAM; the local APIC page is left to the kernel).
pub fn make_user_accessible() {
    const PRESENT: u64 = 1;
    const USER: u64 = 1 << 2;
    const PAGE_SIZE: u64 = 1 << 7;
    const PCD: u64 = 1 << 4;
    const ADDR: u64 = 0x000F_FFFF_FFFF_F000;
    let cr3: u64;
    // SAFETY: reading CR3.
    unsafe { asm!("mov {}, cr3", out(reg) cr3) };
    // SAFETY: the page tables are identity-mapped RAM the kernel owns; entries only gain USER.
    unsafe {
        let pml4 = (cr3 & ADDR) as *mut u64;
        for i in 0..512 {
            let e = pml4.add(i);
            if *e & PRESENT == 0 {
                continue;
            }
            *e |= USER;
            let pdpt = (*e & ADDR) as *mut u64;
            for j in 0..512 {
                let e = pdpt.add(j);
                if *e & PRESENT == 0 {
                    continue;
                }
                *e |= USER;
                let pd = (*e & ADDR) as *mut u64;
                for k in 0..512 {
                    let e = pd.add(k);
                    if *e & PRESENT != 0 && *e & PAGE_SIZE != 0 && *e & PCD == 0 {
                        *e |= USER;
                    }
                }
            }
        }
        asm!("mov {0}, cr3", "mov cr3, {0}", out(reg) _);
    }
}

/// Enters `entry` at CPL3 (with IRETQ, on a user stack, RCX = `rcx`), and returns the vector of
/// the exception that brings it back to the kernel (a function ends with HLT, which raises #GP
/// at CPL3); 0xFF if none did. Call [`make_user_accessible`] first.
pub fn run_user(entry: unsafe extern "C" fn(), rcx: u64) -> u8 {
    run_user_caught(entry, rcx).map_or(0xFF, |e| e.vector)
}

/// As [`run_user`], with the exception's error code.
pub fn run_user_caught(entry: unsafe extern "C" fn(), rcx: u64) -> Option<crate::catch::Exception> {
    enter_user(entry, rcx, 0)
}

/// As [`run_user`], with RFLAGS.IF set in user mode only: the kernel keeps interrupts off, so one
/// that comes due on the way is held until IRETQ sets IF and is taken at the first user-mode
/// instruction boundary (SDM Vol. 3A 6.8.1), never in the kernel.
/// The kernel goes on with IF clear (the catch resumes with user mode's RFLAGS).
pub fn run_user_interruptible(entry: unsafe extern "C" fn(), rcx: u64) -> u8 {
    let e = enter_user(entry, rcx, RFLAGS_IF);
    crate::cpu::disable_interrupts();
    e.map_or(0xFF, |e| e.vector)
}

/// As [`run_user`], with RFLAGS.TF set in user mode: a single-step #DB after each user
/// instruction (SDM Vol. 3B 17.3.1.4), whose handler returns with TF still set.
pub fn run_user_traced(entry: unsafe extern "C" fn(), rcx: u64) -> u8 {
    enter_user(entry, rcx, RFLAGS_TF).map_or(0xFF, |e| e.vector)
}

/// RFLAGS.TF and RFLAGS.IF (SDM Vol. 1 3.4.3.3).
const RFLAGS_TF: u64 = 1 << 8;
const RFLAGS_IF: u64 = 1 << 9;

/// IRETQ to `entry` at CPL3 with the current RFLAGS plus `set_flags`.
fn enter_user(entry: unsafe extern "C" fn(), rcx: u64, set_flags: u64) -> Option<crate::catch::Exception> {
    crate::catch(|| {
        // SAFETY: IRETQ to CPL3 with a user stack; the user code ends in an exception, which the
        // catch takes.
        unsafe {
            let top = (&raw mut USER_STACK) as u64 + 4096;
            asm!(
                "push {ss}",
                "push {rsp}",
                "pushfq",
                "or qword ptr [rsp], {flags}",
                "push {cs}",
                "push {rip}",
                "iretq",
                ss = in(reg) USER_DS as u64,
                rsp = in(reg) top,
                cs = in(reg) USER_CS as u64,
                rip = in(reg) entry as *const () as u64,
                flags = in(reg) set_flags,
                inout("rcx") rcx => _,
                out("rax") _, out("rdx") _,
            );
        }
    })
}
