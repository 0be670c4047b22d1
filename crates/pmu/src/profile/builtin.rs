//! Built-in profiles, embedded at compile time from `resources/profiles/*.toml`.

/// `(name, TOML text)` of every built-in profile, sorted by name.
const BUILTINS: &[(&str, &str)] = &[
    ("core2", include_str!("../../../../resources/profiles/core2.toml")),
    ("icelake", include_str!("../../../../resources/profiles/icelake.toml")),
    ("nehalem", include_str!("../../../../resources/profiles/nehalem.toml")),
    ("nehalem-llc-masked", include_str!("../../../../resources/profiles/nehalem-llc-masked.toml")),
    ("no-pmu", include_str!("../../../../resources/profiles/no-pmu.toml")),
    ("pentium4", include_str!("../../../../resources/profiles/pentium4.toml")),
    ("sandybridge", include_str!("../../../../resources/profiles/sandybridge.toml")),
    ("skylake", include_str!("../../../../resources/profiles/skylake.toml")),
];

/// Built-in profile names, sorted.
pub fn names() -> Vec<&'static str> {
    let mut names: Vec<&'static str> = BUILTINS.iter().map(|(name, _)| *name).collect();
    names.sort_unstable();
    names
}

/// The TOML text of built-in profile `name`.
pub fn text(name: &str) -> Option<&'static str> {
    BUILTINS.iter().find(|(builtin, _)| *builtin == name).map(|(_, text)| *text)
}
