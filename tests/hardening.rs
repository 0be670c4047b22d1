//! Hardening: a guest cannot grow emon's memory or file descriptors without bound, and every
//! malformed input gets a one-line error naming what was wrong (status 2), never a panic.
mod common;
use common::*;

fn peak_kib(report: &serde_json::Value) -> u64 {
    report["peak_memory_kib"].as_u64().unwrap_or_else(|| panic!("no peak memory in {report:#}"))
}

#[test]
fn a_guest_touching_many_msrs_does_not_grow_emons_memory() {
    if !kvm_available() {
        return;
    }
    let args = |n| ["--ignore-msrs", "guest:bench", "--", "mode=unknown-msrs", n];
    let (few_run, few) = emon_json("hardening-msrs-few", &args("n=1000"));
    let (many_run, many) = emon_json("hardening-msrs-many", &args("n=100000"));
    few_run.assert_status(0);
    many_run.assert_status(0);
    // Statistics keep the first 256 distinct MSRs and aggregate the rest.
    let msr = &many["msr"];
    assert_eq!(msr["unknown"].as_array().map(Vec::len), Some(256), "{msr:#}");
    assert_eq!(msr["unknown_untracked"], 100_000 - 256, "{msr:#}");
    let (a, b) = (peak_kib(&few), peak_kib(&many));
    assert!(b < a + 2048, "100x the distinct MSRs grew emon's peak memory from {a} KiB to {b} KiB");
}

fn assert_error(r: &Run, needles: &[&str]) {
    assert_eq!(r.status, 2, "status\n--- stdout\n{}\n--- stderr\n{}", r.stdout, r.stderr);
    let msg = r.stderr.trim_end();
    assert_eq!(msg.lines().count(), 1, "not one line: {msg}");
    assert!(!msg.contains("panicked"), "{msg}");
    for n in needles {
        assert!(msg.contains(n), "{msg:?} does not mention {n:?}");
    }
}

fn file(name: &str, bytes: &[u8]) -> String {
    let p = tmp_dir("hardening").join(name);
    std::fs::write(&p, bytes).unwrap();
    p.to_str().unwrap().to_owned()
}

fn elf64() -> Vec<u8> {
    std::fs::read(assemble("hard64", ".globl _start\n_start: hlt\n", true, 0x100000)).unwrap()
}

#[test]
fn elf_for_another_machine() {
    if !kvm_available() {
        return;
    }
    let mut e = elf64();
    e[18..20].copy_from_slice(&183u16.to_le_bytes()); // EM_AARCH64
    let k = file("arm.elf", &e);
    assert_error(&emon(&["run", &k]), &[&k, "machine 183"]);
}

#[test]
fn truncated_elf() {
    if !kvm_available() {
        return;
    }
    let k = file("truncated.elf", &elf64()[..80]);
    assert_error(&emon(&["run", &k]), &[&k, "ELF"]);
}

fn multiboot_header(flags: u32, addresses: [u32; 5]) -> Vec<u8> {
    let magic: u32 = 0x1BAD_B002;
    let mut v = Vec::new();
    for w in [magic, flags, 0u32.wrapping_sub(magic).wrapping_sub(flags)] {
        v.extend_from_slice(&w.to_le_bytes());
    }
    for w in addresses {
        v.extend_from_slice(&w.to_le_bytes());
    }
    v.resize(4096, 0);
    v
}

#[test]
fn multiboot_kernel_requiring_unknown_features() {
    if !kvm_available() {
        return;
    }
    let k = file("mb-flags.bin", &multiboot_header(1 << 3, [0; 5]));
    assert_error(&emon(&["run", &k]), &[&k, "requires features emon does not provide", "0x8"]);
}

#[test]
fn multiboot_aout_kludge_with_inconsistent_addresses() {
    if !kvm_available() {
        return;
    }
    // load_addr above header_addr.
    let k = file("mb-aout.bin", &multiboot_header(1 << 16, [0x10_0000, 0x20_0000, 0, 0, 0x20_0000]));
    assert_error(&emon(&["run", &k]), &[&k, "load_addr", "header_addr"]);
    // An entry point outside what is loaded.
    let k = file("mb-entry.bin", &multiboot_header(1 << 16, [0x10_0000, 0x10_0000, 0, 0, 0x90_0000]));
    assert_error(&emon(&["run", &k]), &[&k, "entry point"]);
}

#[test]
fn unwritable_serial_or_json_file_and_missing_module() {
    if !kvm_available() {
        return;
    }
    assert_error(&emon(&["run", "--serial", "/nonexistent/dir/out.txt"]), &["/nonexistent/dir/out.txt"]);
    assert_error(
        &emon(&["run", "--json", "/nonexistent/dir/report.json"]),
        &["--json", "/nonexistent/dir/report.json"],
    );
    // A run that never reaches the guest leaves no report behind.
    let report = json_path("hardening-no-guest");
    let truncated = file("truncated-for-json.elf", &elf64()[..80]);
    assert_error(&emon(&["run", "--json", report.to_str().unwrap(), &truncated]), &[&truncated]);
    assert!(!report.exists(), "{} was left behind", report.display());
    let k = assemble("mb-ok", &multiboot_source("    xor %eax, %eax\n    jmp exit\n"), false, 0x100000);
    assert_error(&emon(&["run", "--module", "/nonexistent/mod", k.to_str().unwrap()]), &["/nonexistent/mod"]);
}

#[test]
fn malformed_overrides_and_profiles_in_every_command() {
    for spec in ["=5", "version", "version=", "version=9", "gp=0x", "gp-width=-1", "fixed=1e3"] {
        let r = emon(&["cpuid", "--pmu", spec]);
        assert_error(&r, &["--pmu"]);
    }
    let dir = tmp_dir("hardening").join("a-directory.toml");
    std::fs::create_dir_all(&dir).unwrap();
    let d = dir.to_str().unwrap();
    for cmd in ["run", "cpuid", "events", "bench"] {
        assert_error(&emon(&[cmd, "--profile", d]), &[d]);
    }
    let huge = u64::MAX.to_string();
    assert_error(&emon(&["run", "--memory", &huge]), &["--memory"]);
}
