//! Bad input gets a clear one-line error (exit status 2) and nothing runs: broken profiles name
//! the file, field and rule; broken kernels are refused with the reason.
mod common;
use common::*;

fn assert_error(r: &Run, needles: &[&str]) {
    assert_eq!(r.status, 2, "status\n--- stdout\n{}\n--- stderr\n{}", r.stdout, r.stderr);
    assert!(r.stdout.is_empty(), "something ran: {}", r.stdout);
    let msg = r.stderr.trim_end();
    assert_eq!(msg.lines().count(), 1, "not one line: {msg}");
    assert!(msg.starts_with("emon: "), "{msg}");
    for n in needles {
        assert!(msg.contains(n), "{msg:?} does not mention {n:?}");
    }
}

fn write(name: &str, bytes: &[u8]) -> String {
    let p = tmp_dir("bad-input").join(name);
    std::fs::write(&p, bytes).unwrap();
    p.to_str().unwrap().to_owned()
}

const GOOD_PROFILE: &str = r#"
description = "test"
vendor = "GenuineIntel"
family = 6
model = 0x1A
stepping = 5
[pmu]
version = 3
gp = 4
gp-width = 48
ebx-length = 7
fixed = 3
fixed-width = 48
"#;

#[test]
fn profile_with_a_bad_width_names_file_field_and_rule() {
    let p = write("wide.toml", GOOD_PROFILE.replace("gp-width = 48", "gp-width = 70").as_bytes());
    assert_error(&emon(&["run", "--profile", &p]), &[&p, "pmu.gp-width = 70", "32"]);
}

#[test]
fn profile_with_fixed_counters_at_version_1_is_refused() {
    let p = write("v1.toml", GOOD_PROFILE.replace("version = 3", "version = 1").as_bytes());
    assert_error(&emon(&["run", "--profile", &p]), &[&p, "fixed"]);
}

#[test]
fn profile_with_ebx_bits_beyond_its_length_is_refused() {
    let p =
        write("ebx.toml", GOOD_PROFILE.replace("ebx-length = 7", "ebx-length = 3\nebx-unavailable = 0x10").as_bytes());
    assert_error(&emon(&["run", "--profile", &p]), &[&p, "ebx-unavailable"]);
}

#[test]
fn profile_with_a_syntax_error_or_unknown_key_is_refused() {
    let p = write("syntax.toml", b"version = = 3\n");
    assert_error(&emon(&["run", "--profile", &p]), &[&p]);
    let p = write("unknown.toml", format!("{GOOD_PROFILE}colour = 3\n").as_bytes());
    assert_error(&emon(&["run", "--profile", &p]), &[&p, "colour"]);
}

#[test]
fn profile_with_a_bad_cache_or_clock_table_is_refused() {
    let cache = "[cache]\nl1d = { kib = 48, ways = 8 }\nllc = { kib = 8192, ways = 16 }\n";
    let p = write("sets.toml", format!("{GOOD_PROFILE}{cache}").as_bytes());
    assert_error(&emon(&["run", "--profile", &p]), &[&p, "cache.l1d = { kib = 48, ways = 8 }", "96 sets"]);
    let p = write("l3.toml", format!("{GOOD_PROFILE}{cache}l3 = {{ kib = 1, ways = 1 }}\n").as_bytes());
    assert_error(&emon(&["run", "--profile", &p]), &[&p, "l3"]);
    let p = write("ratio.toml", format!("{GOOD_PROFILE}[clock]\ntsc-per-ref = [20, 0]\n").as_bytes());
    assert_error(&emon(&["run", "--profile", &p]), &[&p, "clock.tsc-per-ref = [20, 0]", "non-zero"]);
    let p = write("triple.toml", format!("{GOOD_PROFILE}[clock]\ntsc-per-ref = [2, 1, 0]\n").as_bytes());
    assert_error(&emon(&["run", "--profile", &p]), &[&p, "tsc-per-ref", "[numerator, denominator]"]);
}

#[test]
fn bad_overrides_name_the_key() {
    assert_error(&emon(&["run", "--pmu", "gp=9"]), &["--pmu", "gp"]);
    assert_error(&emon(&["run", "--pmu", "colour=3"]), &["--pmu", "colour"]);
    assert_error(&emon(&["run", "--pmu", "gp=lots"]), &["--pmu", "gp"]);
}

#[test]
fn unknown_profile_lists_the_builtins() {
    assert_error(&emon(&["run", "--profile", "pentium"]), &["pentium", "nehalem", "skylake"]);
}

#[test]
fn missing_kernel_file() {
    assert_error(&emon(&["run", "/nonexistent/kernel"]), &["/nonexistent/kernel", "cannot read"]);
}

/// Linux's command line cannot carry a double quote, nor a second `--`, to init: refused, not
/// passed on to end init's words early.
#[test]
fn init_words_the_kernel_command_line_cannot_carry() {
    assert_error(&emon(&["run", "--", "x", "--", "sh", "-c", "echo \"hi\""]), &["echo \\\"hi\\\"", "double quote"]);
    assert_error(&emon(&["run", "--", "--", "a", "--", "b"]), &["second `--`"]);
}

#[test]
fn unknown_builtin_guest_lists_the_guests() {
    assert_error(&emon(&["run", "guest:nope"]), &["nope", "cpuid-report"]);
}

#[test]
fn kernel_that_is_neither_multiboot_nor_elf64() {
    if !kvm_available() {
        return;
    }
    let k = write("garbage.bin", &[0x90; 4096]);
    assert_error(&emon(&["run", &k]), &[&k, "neither a multiboot kernel", "ELF64"]);
    let k = write("empty.bin", b"");
    assert_error(&emon(&["run", &k]), &[&k, "neither a multiboot kernel"]);
}

#[test]
fn elf32_without_multiboot_header() {
    if !kvm_available() {
        return;
    }
    let k = assemble("plain32", ".globl _start\n_start: hlt\n", false, 0x100000);
    assert_error(&emon(&["run", k.to_str().unwrap()]), &["ELF32", "multiboot"]);
}

#[test]
fn kernel_that_does_not_fit_in_guest_ram() {
    if !kvm_available() {
        return;
    }
    let k = assemble("high64", ".globl _start\n_start: hlt\n", true, 0x4000000);
    assert_error(&emon(&["run", "--memory", "32", k.to_str().unwrap()]), &["does not fit in guest RAM", "--memory"]);
}

#[test]
fn kernel_that_overlaps_the_boot_area() {
    if !kvm_available() {
        return;
    }
    let k = assemble("low64", ".globl _start\n_start: hlt\n", true, 0x2000);
    assert_error(&emon(&["run", k.to_str().unwrap()]), &["overlaps emon's boot area"]);
}

#[test]
fn bad_memory_and_timeout_values() {
    assert_error(&emon(&["run", "--memory", "1"]), &["--memory 1"]);
    assert_error(&emon(&["run", "--timeout=-1"]), &["--timeout"]);
    assert_error(&emon(&["run", "--timeout=0"]), &["--timeout"]);
}

#[test]
fn missing_kvm_device_says_what_to_do() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_emon"))
        .args(["run", "guest:cpuid-report"])
        .env("EMON_KVM_DEVICE", "/nonexistent/kvm")
        .output()
        .unwrap();
    let r = Run {
        status: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    assert_error(&r, &["does not exist", "no KVM", "kvm_intel or kvm_amd"]);
}
