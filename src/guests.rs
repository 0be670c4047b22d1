//! emon's built-in test guests, built from `guest/` by build.rs and embedded in the binary.
include!(concat!(env!("OUT_DIR"), "/guests.rs"));

/// The prefix that names a built-in guest on the command line.
pub const PREFIX: &str = "guest:";

/// The image of built-in guest `name`.
pub fn find(name: &str) -> Option<&'static [u8]> {
    GUESTS.iter().find(|(n, _, _)| *n == name).map(|(_, _, image)| *image)
}

/// Names and descriptions of all built-in guests.
pub fn list() -> impl Iterator<Item = (&'static str, &'static str)> {
    GUESTS.iter().map(|(n, d, _)| (*n, *d))
}
