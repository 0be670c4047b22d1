//! Unit tests of the profile module, one file per concern.

mod builtin;
mod cache_clock;
mod load;
mod overrides;
mod pmu;
mod validate;

use super::{Profile, ProfileError};

/// A valid version 4 profile to mutate in rule tests.
pub(super) fn sample() -> Profile {
    Profile::load("skylake").expect("built-in skylake loads")
}

/// Validate `profile` and return the error's Display, failing the test if it validated.
pub(super) fn error_of(profile: &Profile) -> String {
    match profile.validate() {
        Ok(()) => panic!("expected a validation error for {profile:?}"),
        Err(e) => e.to_string(),
    }
}

/// Assert that `message` is one line and contains every needle.
pub(super) fn assert_mentions(message: &str, needles: &[&str]) {
    assert!(!message.contains('\n'), "not one line: {message}");
    for needle in needles {
        assert!(message.contains(needle), "{message:?} does not mention {needle:?}");
    }
}

/// Unwrap the error of a result, failing the test on Ok.
pub(super) fn err<T: std::fmt::Debug>(result: Result<T, ProfileError>) -> ProfileError {
    match result {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => e,
    }
}
