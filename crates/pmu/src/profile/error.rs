//! [`ProfileError`]: every way loading, overriding or validating a profile can fail.

/// A profile error. Every variant names its origin (a file path, a built-in profile name,
/// or `--pmu`) and Display is always ONE line, `<origin>: <field>: <rule>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProfileError {
    /// A field value breaks an architectural rule (after parsing or after `--pmu`).
    #[error("{origin}: {field}: {rule}")]
    Invalid {
        /// File path, built-in name or `--pmu`.
        origin: String,
        /// The offending field with its value, e.g. `pmu.gp-width = 70`.
        field: String,
        /// The rule in words, with its CPUID/MSR reference.
        rule: String,
    },
    /// A `--pmu` item could not be parsed (unknown key, missing `=`, bad or too large value).
    #[error("--pmu: {key}: {rule}")]
    Override {
        /// The key as written (or the whole item when it has no `=`).
        key: String,
        /// What is wrong.
        rule: String,
    },
    /// TOML syntax or type error (unknown keys included).
    #[error("{origin}: {location}: {message}")]
    Toml {
        /// File path or built-in name.
        origin: String,
        /// `line L, column C (`text of the line`)`, or `document` without a position.
        location: String,
        /// The TOML parser's message, collapsed onto one line.
        message: String,
    },
    /// The profile file could not be read.
    #[error("{path}: cannot read profile: {message}")]
    Io {
        /// The path as given.
        path: String,
        /// The I/O error.
        message: String,
    },
    /// NAME is not a built-in profile (and does not look like a path).
    #[error(
        "{name}: unknown profile: built-in profiles are {}; or give a path to a .toml file",
        available.join(", ")
    )]
    UnknownProfile {
        /// The name asked for.
        name: String,
        /// The built-in names, sorted.
        available: Vec<String>,
    },
}

impl ProfileError {
    /// Shorthand for [`ProfileError::Invalid`].
    pub(crate) fn invalid(origin: &str, field: String, rule: impl Into<String>) -> Self {
        ProfileError::Invalid { origin: origin.to_string(), field, rule: rule.into() }
    }

    /// Shorthand for [`ProfileError::Override`].
    pub(crate) fn bad_override(key: &str, rule: impl Into<String>) -> Self {
        ProfileError::Override { key: key.to_string(), rule: rule.into() }
    }
}

/// Collapse any run of whitespace containing newlines (and other whitespace runs) into one
/// space, so an error message fits on one line.
pub(crate) fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}
