//! Loading by name and by path, TOML defaults, TOML errors.

use std::path::PathBuf;

use super::super::{Profile, ProfileError, DEFAULT_NOMINAL_MHZ};
use super::{assert_mentions, err};

/// A file in a directory of its own in the system temp directory, both removed on drop.
struct TempFile(PathBuf);

impl TempFile {
    fn new(name: &str, text: &str) -> TempFile {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("emon-profile-test-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create temp dir");
        let path = dir.join(name);
        std::fs::write(&path, text).expect("write temp file");
        TempFile(path)
    }

    fn path(&self) -> &str {
        self.0.to_str().expect("utf-8 temp path")
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if let Some(dir) = self.0.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

const NEHALEM: &str = r#"
description = "Intel Core i7-920 (Nehalem-EP, Bloomfield)"
vendor = "GenuineIntel"
family = 6
model = 0x1A
stepping = 5
[pmu]
version = 3
gp = 4
gp-width = 48
ebx-length = 7
ebx-unavailable = 0x00
fixed = 3
fixed-width = 48
fixed-bitmap = 0
perf-capabilities = 0x0
misc-enable-perfmon = true
nominal-mhz = 2667
"#;

#[test]
fn load_by_path_names_the_profile_after_the_file_stem() {
    let file = TempFile::new("my-cpu.toml", NEHALEM);
    let p = Profile::load(file.path()).expect("loads");
    assert_eq!(p.name, "my-cpu");
    assert_eq!(p.description, "Intel Core i7-920 (Nehalem-EP, Bloomfield)");
    assert_eq!(p.leaf1_eax(), 0x0001_06A5);
    assert_eq!(p.pmu.leaf_0a(), [0x0730_0403, 0, 0, 0x0603]);
    assert_eq!(p.pmu.nominal_mhz, 2667);
}

#[test]
fn load_by_name() {
    let p = Profile::load("nehalem").expect("loads");
    assert_eq!(p.name, "nehalem");
    assert_eq!(Profile::load(Profile::DEFAULT).expect("default").name, "skylake");
}

#[test]
fn unknown_name_lists_the_builtins() {
    let e = err(Profile::load("pentium3"));
    assert!(matches!(e, ProfileError::UnknownProfile { .. }));
    let msg = e.to_string();
    assert_mentions(&msg, &["pentium3", "unknown profile", ".toml"]);
    for name in Profile::builtin_names() {
        assert!(msg.contains(name), "{msg} lacks {name}");
    }
}

#[test]
fn missing_file_names_the_path() {
    let e = err(Profile::load("/nonexistent/emon/x.toml"));
    assert!(matches!(e, ProfileError::Io { .. }));
    assert_mentions(&e.to_string(), &["/nonexistent/emon/x.toml", "cannot read"]);
}

#[test]
fn toml_syntax_error_names_the_file_on_one_line() {
    let file = TempFile::new("broken.toml", "description = \"x\nvendor = 1\n");
    let e = err(Profile::load(file.path()));
    assert!(matches!(e, ProfileError::Toml { .. }), "{e:?}");
    assert_mentions(&e.to_string(), &[file.path(), "line 1"]);
}

#[test]
fn toml_type_error_names_the_line() {
    let text = NEHALEM.replace("gp = 4", "gp = 300");
    let e = err(Profile::from_toml("resources/profiles/bad.toml", &text));
    assert_mentions(&e.to_string(), &["resources/profiles/bad.toml: line 9, column 6", "`gp = 300`", "u8"]);
}

#[test]
fn unknown_key_is_rejected() {
    let text = NEHALEM.replace("gp = 4", "gp = 4\nanythread-deprecated = true");
    let e = err(Profile::from_toml("x.toml", &text));
    assert_mentions(&e.to_string(), &["x.toml: ", "unknown field", "anythread-deprecated"]);
    let text = NEHALEM.replace("stepping = 5", "stepping = 5\ncodename = \"x\"");
    assert_mentions(&err(Profile::from_toml("x.toml", &text)).to_string(), &["unknown field", "codename"]);
}

#[test]
fn a_brand_string_longer_than_cpuid_holds_is_rejected() {
    let long = "x".repeat(48);
    let text = NEHALEM.replace("stepping = 5", &format!("stepping = 5\nbrand = \"{long}\""));
    assert_mentions(&err(Profile::from_toml("x.toml", &text)).to_string(), &["x.toml", "brand", "47"]);
    let text = NEHALEM.replace("stepping = 5", &format!("stepping = 5\nbrand = \"{}\"", &long[..47]));
    let p = Profile::from_toml("x.toml", &text).unwrap();
    assert_eq!(p.brand_regs().unwrap()[2][3] >> 24, 0, "the 48th byte is the NUL");
}

#[test]
fn missing_required_key_is_rejected() {
    let text = NEHALEM.replace("version = 3\n", "");
    assert_mentions(&err(Profile::from_toml("x.toml", &text)).to_string(), &["x.toml: ", "version"]);
}

#[test]
fn validation_errors_name_the_file() {
    let text = NEHALEM.replace("gp-width = 48", "gp-width = 70");
    let e = err(Profile::from_toml("resources/profiles/bad.toml", &text));
    assert_eq!(
        e.to_string(),
        "resources/profiles/bad.toml: pmu.gp-width = 70: counter width must be 32..=64 bits (CPUID.0AH:EAX[23:16])"
    );
}

#[test]
fn pmu_defaults_make_version_0_short() {
    let text =
        "description = \"d\"\nvendor = \"GenuineIntel\"\nfamily = 6\nmodel = 0x5E\nstepping = 3\n[pmu]\nversion = 0\n";
    let p = Profile::from_toml("short.toml", text).expect("loads");
    assert_eq!(p.pmu.leaf_0a(), [0; 4]);
    assert!(!p.pmu.misc_enable_perfmon, "default is version > 0");
    assert_eq!(p.pmu.nominal_mhz, DEFAULT_NOMINAL_MHZ);
}

#[test]
fn misc_enable_perfmon_defaults_to_true_from_version_1() {
    let text = NEHALEM.replace("misc-enable-perfmon = true\n", "").replace("nominal-mhz = 2667\n", "");
    let p = Profile::from_toml("x.toml", &text).expect("loads");
    assert!(p.pmu.misc_enable_perfmon);
    assert_eq!(p.pmu.nominal_mhz, 2000);
}
