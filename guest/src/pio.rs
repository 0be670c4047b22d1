//! Port I/O.
use core::arch::asm;

pub fn outb(port: u16, v: u8) {
    // SAFETY: port I/O has no memory effects in emon's guests.
    unsafe { asm!("out dx, al", in("dx") port, in("al") v, options(nomem, nostack, preserves_flags)) }
}

pub fn outw(port: u16, v: u16) {
    // SAFETY: as above.
    unsafe { asm!("out dx, ax", in("dx") port, in("ax") v, options(nomem, nostack, preserves_flags)) }
}

pub fn outl(port: u16, v: u32) {
    // SAFETY: as above.
    unsafe { asm!("out dx, eax", in("dx") port, in("eax") v, options(nomem, nostack, preserves_flags)) }
}

pub fn inb(port: u16) -> u8 {
    let v: u8;
    // SAFETY: as above.
    unsafe { asm!("in al, dx", in("dx") port, out("al") v, options(nomem, nostack, preserves_flags)) }
    v
}
