//! COM1 16550 output and the `print!`/`println!` macros.
use crate::pio::{inb, outb};
use core::fmt;

const COM1: u16 = 0x3F8;
const LSR: u16 = 5;
const LSR_THRE: u8 = 1 << 5;

/// Writes one byte to COM1 once the transmit holding register is empty.
pub fn putb(b: u8) {
    while inb(COM1 + LSR) & LSR_THRE == 0 {}
    outb(COM1, b);
}

pub struct Serial;

impl fmt::Write for Serial {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        s.bytes().for_each(putb);
        Ok(())
    }
}

#[doc(hidden)]
pub fn _print(args: fmt::Arguments) {
    let _ = fmt::Write::write_fmt(&mut Serial, args);
}

#[macro_export]
macro_rules! print {
    ($($arg:tt)*) => { $crate::serial::_print(format_args!($($arg)*)) };
}

#[macro_export]
macro_rules! println {
    () => { $crate::print!("\n") };
    ($($arg:tt)*) => { $crate::serial::_print(format_args!("{}\n", format_args!($($arg)*))) };
}
