//! Counter value arithmetic for any width 0..=64 (widths above 64 are treated as 64).
//!
//! All wrap-around math is done in `u128` so that `2^64` is representable and no shift overflows.

/// Clamp a CPUID-reported width to what a 64-bit MSR can hold.
pub fn effective_width(width: u8) -> u8 {
    width.min(64)
}

/// `2^width - 1`: the bits a counter of `width` bits can hold (`u64::MAX` for 64, 0 for 0).
pub fn width_mask(width: u8) -> u64 {
    match effective_width(width) {
        64 => u64::MAX,
        w => (1u64 << w) - 1,
    }
}

/// `2^width` as a `u128` (the modulus of a `width`-bit counter).
fn modulus(width: u8) -> u128 {
    1u128 << effective_width(width)
}

/// The value a legacy IA32_PMCx write stores: EAX\[31:0\] sign-extended to 64 bits, then truncated
/// to the counter width; EDX (bits 63:32 of `value`) is ignored (SDM 18.2.5).
pub fn legacy_write_value(value: u64, width: u8) -> u64 {
    // `as` casts here are deliberate bit reinterpretations: low 32 bits, then sign extension.
    let sign_extended = value as u32 as i32 as i64 as u64;
    sign_extended & width_mask(width)
}

/// Events left until a counter at `value` wraps past `2^width - 1`: `2^width - value`
/// (so a counter at 0 is `2^width` events away, one holding `2^width - 1` is 1 away).
///
/// The result does not fit `u64` only for a 64-bit counter at 0 (`2^64`): `u64::MAX` is returned
/// then, which callers treat as "effectively never". Bits of `value` above the width are ignored.
pub fn distance_to_overflow(value: u64, width: u8) -> u64 {
    let d = modulus(width) - u128::from(value & width_mask(width));
    u64::try_from(d).unwrap_or(u64::MAX)
}

/// Add `n` events to a `width`-bit counter at `value`: returns `((value + n) mod 2^width, overflowed)`
/// where `overflowed` is true if the counter wrapped past `2^width - 1` (reported once however many
/// times `n` wraps it).
pub fn add_events(value: u64, n: u64, width: u8) -> (u64, bool) {
    let m = modulus(width);
    let sum = u128::from(value & width_mask(width)) + u128::from(n);
    let wrapped = sum % m;
    // `wrapped < m <= 2^64`, so it fits in u64.
    (u64::try_from(wrapped).unwrap_or(0), sum >= m)
}

/// Is `value` a canonical linear address for 48-bit linear addressing (bits 63:47 all equal)?
pub fn is_canonical_48(value: u64) -> bool {
    let top = value >> 47;
    top == 0 || top == (u64::MAX >> 47)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mask_every_width() {
        assert_eq!(width_mask(0), 0);
        for w in 1..64u8 {
            assert_eq!(width_mask(w), (1u64 << w) - 1, "width {w}");
        }
        assert_eq!(width_mask(64), u64::MAX);
        assert_eq!(width_mask(200), u64::MAX);
    }

    #[test]
    fn legacy_write_sign_extends_bit31() {
        assert_eq!(legacy_write_value(0xFFFF_FFFF, 48), 0xFFFF_FFFF_FFFF);
        assert_eq!(legacy_write_value(0x7FFF_FFFF, 48), 0x7FFF_FFFF);
        assert_eq!(legacy_write_value(0x8000_0000, 40), 0xFF_8000_0000);
        assert_eq!(legacy_write_value(0xFFFF_FFFF, 32), 0xFFFF_FFFF);
        assert_eq!(legacy_write_value(0xFFFF_FFFF, 64), u64::MAX);
        // EDX is ignored.
        assert_eq!(legacy_write_value(0x1234_5678_0000_0001, 48), 1);
        assert_eq!(legacy_write_value(0xFFFF_FFFF_7FFF_FFFF, 64), 0x7FFF_FFFF);
        for w in 32..=64u8 {
            let v = legacy_write_value(0x8000_0000, w);
            assert_eq!(v, (0xFFFF_FFFF_8000_0000u64) & width_mask(w), "width {w}");
        }
    }

    #[test]
    fn distance_every_width() {
        for w in 32..=64u8 {
            let max = width_mask(w);
            assert_eq!(distance_to_overflow(max, w), 1, "width {w}");
            assert_eq!(distance_to_overflow(max - 9, w), 10, "width {w}");
            let at_zero = distance_to_overflow(0, w);
            if w == 64 {
                assert_eq!(at_zero, u64::MAX);
            } else {
                assert_eq!(u128::from(at_zero), 1u128 << w, "width {w}");
            }
        }
        assert_eq!(distance_to_overflow(1, 64), u64::MAX);
        assert_eq!(distance_to_overflow(0, 0), 1);
    }

    #[test]
    fn add_every_width() {
        for w in 32..=64u8 {
            let max = width_mask(w);
            assert_eq!(add_events(max, 1, w), (0, true), "width {w}");
            assert_eq!(add_events(max - 1, 1, w), (max, false), "width {w}");
            assert_eq!(add_events(5, 0, w), (5, false), "width {w}");
            assert_eq!(add_events(max, 3, w), (2, true), "width {w}");
            // n larger than the distance, and larger than 2^width: wraps modulo 2^width.
            let (v, o) = add_events(7, u64::MAX, w);
            let expect = ((7u128 + u128::from(u64::MAX)) % (1u128 << w)) as u64;
            assert_eq!((v, o), (expect, true), "width {w}");
        }
        assert_eq!(add_events(u64::MAX, u64::MAX, 64), (u64::MAX - 1, true));
        assert_eq!(add_events(0, u64::MAX, 64), (u64::MAX, false));
        assert_eq!(add_events(0, 0, 0), (0, false));
        assert_eq!(add_events(0, 1, 0), (0, true));
    }

    #[test]
    fn canonical_addresses() {
        assert!(is_canonical_48(0));
        assert!(is_canonical_48(0x0000_7FFF_FFFF_FFFF));
        assert!(is_canonical_48(0xFFFF_8000_0000_0000));
        assert!(is_canonical_48(u64::MAX));
        assert!(!is_canonical_48(0x0000_8000_0000_0000));
        assert!(!is_canonical_48(0x8000_0000_0000_0000));
        assert!(!is_canonical_48(0xFFFF_7FFF_FFFF_FFFF));
    }
}
