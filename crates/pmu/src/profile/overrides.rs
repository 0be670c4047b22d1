//! `--pmu k=v,k=v` overrides (`Profile::apply_overrides`).

use super::{PmuProfile, Profile, ProfileError};

/// The origin named in errors about overrides.
pub const ORIGIN: &str = "--pmu";

/// Every key `--pmu` accepts: the `[pmu]` keys of a profile file, `fw-write`, and the CPU
/// identity keys.
pub const KEYS: &[&str] = &[
    "version",
    "gp",
    "gp-width",
    "ebx-length",
    "ebx-unavailable",
    "fixed",
    "fixed-width",
    "fixed-bitmap",
    "perf-capabilities",
    "misc-enable-perfmon",
    "nominal-mhz",
    "fw-write",
    "vendor",
    "family",
    "model",
    "stepping",
];

impl Profile {
    /// Apply `"k=v,k=v"` overrides (keys: [`KEYS`]; numbers decimal, `0x..` or `0b..`;
    /// booleans `true`/`false`/`1`/`0`), then validate the result with origin `--pmu`.
    /// An empty spec is a no-op. On any error `self` is left unchanged.
    pub fn apply_overrides(&mut self, spec: &str) -> Result<(), ProfileError> {
        if spec.trim().is_empty() {
            return Ok(());
        }
        let mut next = self.clone();
        for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let Some((key, value)) = item.split_once('=') else {
                return Err(ProfileError::bad_override(item, "expected key=value (e.g. version=4)"));
            };
            next.set(key.trim(), value.trim())?;
        }
        next.resolve_events();
        next.validate_as(ORIGIN)?;
        *self = next;
        Ok(())
    }

    /// Set one key.
    fn set(&mut self, key: &str, value: &str) -> Result<(), ProfileError> {
        let p: &mut PmuProfile = &mut self.pmu;
        match key {
            "version" => p.version = number(key, value)?,
            "gp" => p.gp = number(key, value)?,
            "gp-width" => p.gp_width = number(key, value)?,
            "ebx-length" => p.ebx_length = number(key, value)?,
            "ebx-unavailable" => p.ebx_unavailable = number(key, value)?,
            "fixed" => p.fixed = number(key, value)?,
            "fixed-width" => p.fixed_width = number(key, value)?,
            "fixed-bitmap" => p.fixed_bitmap = number(key, value)?,
            "perf-capabilities" => p.perf_capabilities = number(key, value)?,
            "misc-enable-perfmon" => p.misc_enable_perfmon = boolean(key, value)?,
            "nominal-mhz" => p.nominal_mhz = number(key, value)?,
            "fw-write" => {
                if boolean(key, value)? {
                    p.perf_capabilities |= PmuProfile::FW_WRITE;
                } else {
                    p.perf_capabilities &= !PmuProfile::FW_WRITE;
                }
            }
            "vendor" => self.vendor = value.to_string(),
            "family" => self.family = number(key, value)?,
            "model" => self.model = number(key, value)?,
            "stepping" => self.stepping = number(key, value)?,
            _ => return Err(ProfileError::bad_override(key, format!("unknown key (known keys: {})", KEYS.join(", ")))),
        }
        Ok(())
    }
}

/// Parse a non-negative integer written in decimal, `0x` hex or `0b` binary (`_` separators
/// allowed) and check it fits the field's type `T`.
fn number<T: TryFrom<u64>>(key: &str, value: &str) -> Result<T, ProfileError> {
    let bits = 8 * std::mem::size_of::<T>();
    let max = if bits >= 64 { u64::MAX } else { (1u64 << bits) - 1 };
    let out_of_range =
        || ProfileError::bad_override(key, format!("{value} is out of range for this {bits}-bit field (0..={max})"));
    match parse_u64(value) {
        Ok(parsed) => T::try_from(parsed).map_err(|_| out_of_range()),
        Err(NumberError::TooLarge) => Err(out_of_range()),
        Err(NumberError::NotANumber) => Err(ProfileError::bad_override(
            key,
            format!("{value:?} is not a number (write decimal, 0x.. hex or 0b.. binary)"),
        )),
    }
}

/// Why [`parse_u64`] failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NumberError {
    /// Not digits of the radix (or empty, or signed).
    NotANumber,
    /// Valid digits, but more than 64 bits.
    TooLarge,
}

/// Decimal, `0x`/`0X` hex, or `0b`/`0B` binary; `_` separators allowed; no sign.
pub fn parse_u64(text: &str) -> Result<u64, NumberError> {
    let (digits, radix) = if let Some(hex) = text.strip_prefix("0x").or(text.strip_prefix("0X")) {
        (hex, 16)
    } else if let Some(bin) = text.strip_prefix("0b").or(text.strip_prefix("0B")) {
        (bin, 2)
    } else {
        (text, 10)
    };
    let digits: String = digits.chars().filter(|&c| c != '_').collect();
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return Err(NumberError::NotANumber);
    }
    u64::from_str_radix(&digits, radix).map_err(|_| NumberError::TooLarge)
}

/// `true`/`false`/`1`/`0`.
fn boolean(key: &str, value: &str) -> Result<bool, ProfileError> {
    match value {
        "true" | "1" => Ok(true),
        "false" | "0" => Ok(false),
        _ => Err(ProfileError::bad_override(key, format!("{value:?} is not a boolean (write true, false, 1 or 0)"))),
    }
}
