//! The informational commands: guests, profiles, cpuid.
mod common;
use common::*;
use emon::profile::Profile;

#[test]
fn guests_lists_the_builtin_guests_with_descriptions() {
    let r = emon(&["guests"]);
    r.assert_status(0);
    assert!(
        r.stdout.lines().any(|l| l.starts_with("guest:cpuid-report") && l.contains("CPUID leaf 0x0A")),
        "{}",
        r.stdout
    );
}

#[test]
fn profiles_lists_every_builtin_and_marks_the_default() {
    let r = emon(&["profiles"]);
    r.assert_status(0);
    for name in Profile::builtin_names() {
        assert!(r.stdout.lines().any(|l| l.split_whitespace().next() == Some(name)), "{name}\n{}", r.stdout);
    }
    assert!(r.stdout.lines().any(|l| l.starts_with(Profile::DEFAULT) && l.ends_with("(default)")), "{}", r.stdout);
}

#[test]
fn cpuid_shows_the_table_the_guest_gets() {
    if !kvm_available() {
        return;
    }
    let r = emon(&["cpuid", "--profile", "nehalem"]);
    r.assert_status(0);
    let leaf_a = r.stdout.lines().find(|l| l.trim_start().starts_with("0xa ")).expect("leaf 0xa row");
    assert!(leaf_a.contains("0x07300403") && leaf_a.contains("0x00000603"), "{leaf_a}");
    let leaf_0 = r.stdout.lines().find(|l| l.trim_start().starts_with("0x0 ")).expect("leaf 0 row");
    // "Genu" "ineI" "ntel" as EBX, EDX, ECX.
    assert!(
        leaf_0.contains("0x756e6547") && leaf_0.contains("0x49656e69") && leaf_0.contains("0x6c65746e"),
        "{leaf_0}"
    );
    assert!(r.stdout.contains("leaf 0x0A decoded"), "{}", r.stdout);
}
