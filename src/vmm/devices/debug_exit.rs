//! An isa-debug-exit compatible port: a write of `code` ends the run, and emon exits with
//! `code` (unlike QEMU, which exits with `(code << 1) | 1`).
pub const PORT: u16 = 0xF4;

/// The value written, little-endian, whatever the access size.
pub fn code(data: &[u8]) -> u32 {
    data.iter().rev().fold(0, |acc, &b| (acc << 8) | b as u32)
}

#[cfg(test)]
mod tests {
    #[test]
    fn decodes_every_access_size() {
        assert_eq!(super::code(&[3]), 3);
        assert_eq!(super::code(&[1, 2]), 0x201);
        assert_eq!(super::code(&[1, 0, 0, 0]), 1);
    }
}
