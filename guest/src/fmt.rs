//! Formatting that is safe on every host emon runs on.
//!
//! Guests are compiled without SSE, but the precompiled `core` is not: its `Display` for large
//! 64-bit integers executes SSE2 instructions, which some KVMs cannot run for a guest at CPL0
//! (kvm_pvm traps them into an emulator that knows only plain SSE moves; see the README). Print
//! 64-bit decimals with [`Dec`]; hex (`{:#x}`), strings, widths and small integers are fine.
use core::fmt;

/// A 64-bit integer printed in decimal without `core`'s SSE code paths.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dec(pub i128);

impl From<u64> for Dec {
    fn from(v: u64) -> Self {
        Dec(v as i128)
    }
}

impl From<u32> for Dec {
    fn from(v: u32) -> Self {
        Dec(v as i128)
    }
}

impl From<i64> for Dec {
    fn from(v: i64) -> Self {
        Dec(v as i128)
    }
}

impl fmt::Display for Dec {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let mut buf = [0u8; 40];
        let mut i = buf.len();
        let neg = self.0 < 0;
        let mut v = self.0.unsigned_abs();
        loop {
            i -= 1;
            buf[i] = b'0' + (v % 10) as u8;
            v /= 10;
            if v == 0 {
                break;
            }
        }
        if neg {
            i -= 1;
            buf[i] = b'-';
        }
        // The digits are ASCII.
        f.write_str(core::str::from_utf8(&buf[i..]).unwrap_or("?"))
    }
}

/// `dec(x)`: shorthand for `Dec::from(x)`.
pub fn dec<T: Into<Dec>>(v: T) -> Dec {
    v.into()
}
