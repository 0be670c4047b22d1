//! Shared helpers for emon's integration tests: running the `emon` binary, the /dev/kvm policy,
//! and assembling small test kernels with GNU as/ld.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Set to 1 to skip (loudly) the tests that need /dev/kvm on a machine without it.
pub const OPT_OUT: &str = "EMON_SKIP_KVM_TESTS";

/// Whether KVM tests can run. Without /dev/kvm they FAIL, unless the user opted out with
/// EMON_SKIP_KVM_TESTS=1, in which case they are reported as skipped on stderr.
pub fn kvm_available() -> bool {
    let ok = std::fs::OpenOptions::new().read(true).write(true).open("/dev/kvm").is_ok();
    if ok {
        return true;
    }
    if std::env::var(OPT_OUT).is_ok_and(|v| v == "1") {
        eprintln!("\n!!! SKIPPED: /dev/kvm is not usable here and {OPT_OUT}=1: this test did NOT run !!!\n");
        return false;
    }
    panic!("/dev/kvm is not usable on this machine: emon's integration tests need KVM. Set {OPT_OUT}=1 to skip them explicitly.");
}

/// Whether this host's KVM emulates CPL0 guest code (`emon host`'s measurement), where the TCG
/// engine runs it instead.
pub fn host_emulates_cpl0() -> bool {
    let r = emon(&["host"]);
    r.assert_status(0);
    r.stdout.lines().any(|l| l.trim_start().starts_with("CPL0 guest code: emulated by KVM"))
}

/// The result of one emon invocation.
pub struct Run {
    pub status: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub fn assert_status(&self, want: i32) -> &Self {
        assert_eq!(
            self.status, want,
            "unexpected exit status\n--- stdout\n{}\n--- stderr\n{}",
            self.stdout, self.stderr
        );
        self
    }

    /// The guest's kvm-unit-tests style SUMMARY line.
    pub fn summary(&self) -> &str {
        self.stdout
            .lines()
            .rev()
            .find(|l| l.starts_with("SUMMARY:"))
            .unwrap_or_else(|| panic!("no SUMMARY line\n--- stdout\n{}\n--- stderr\n{}", self.stdout, self.stderr))
    }

    pub fn assert_no_failures(&self) -> &Self {
        let failed: Vec<&str> = self.stdout.lines().filter(|l| l.starts_with("FAIL")).collect();
        assert!(failed.is_empty(), "guest reported failures:\n{}\n--- stderr\n{}", failed.join("\n"), self.stderr);
        assert!(self.summary().contains(" 0 unexpected failures"), "{}", self.summary());
        self
    }
}

pub fn emon(args: &[&str]) -> Run {
    let out: Output = Command::new(env!("CARGO_BIN_EXE_emon")).args(args).output().expect("run emon");
    Run {
        status: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Where a test's `emon run --json` report goes: `name` must be unique among all tests.
pub fn json_path(name: &str) -> PathBuf {
    let p = tmp_dir("json").join(format!("{name}.json"));
    let _ = std::fs::remove_file(&p);
    p
}

/// The `--json` report at `path`, parsed; `stderr` is emon's, for the failure message.
pub fn read_json(path: &Path, stderr: &str) -> serde_json::Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("no JSON report at {}: {e}\n--- stderr\n{stderr}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: not JSON: {e}\n{text}", path.display()))
}

/// `emon run --json FILE ARGS...`: the run and its JSON report (`name` as for [`json_path`]).
pub fn emon_json(name: &str, args: &[&str]) -> (Run, serde_json::Value) {
    let path = json_path(name);
    let mut a = vec!["run", "--json", path.to_str().unwrap()];
    a.extend_from_slice(args);
    let r = emon(&a);
    let json = read_json(&path, &r.stderr);
    (r, json)
}

/// Runs one of the repository's build scripts (`scripts/...` and its arguments) with bash;
/// returns its stdout.
#[allow(dead_code)]
pub fn script(args: &[&str]) -> String {
    let out = std::process::Command::new("bash").args(args).output().unwrap_or_else(|e| panic!("run {args:?}: {e}"));
    assert!(out.status.success(), "{args:?} failed:\n{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs the suite file `suite` with `--jobs 2` (its `--json` report named `name`): it must pass
/// whole, once per shipped profile; returns the report's runs.
#[allow(dead_code)]
pub fn run_suite_once_per_profile(suite: &str, name: &str) -> Vec<serde_json::Value> {
    let json = tmp_dir(name).join(format!("{name}.json"));
    let r = emon(&["test", "--suite", suite, "--jobs", "2", "--json", json.to_str().unwrap()]);
    assert_eq!(r.status, 0, "{}\n{}", r.stdout, r.stderr);
    let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let runs = doc["runs"].as_array().expect("runs").clone();
    assert_eq!(runs.len(), emon::profile::Profile::builtin_names().len());
    for run in &runs {
        assert_eq!(run["status"], "pass", "{run}");
    }
    runs
}

pub fn tmp_dir(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::create_dir_all(&d).expect("create test dir");
    d
}

fn tool(name: &str) -> &str {
    let found = Command::new(name).arg("--version").output().is_ok_and(|o| o.status.success());
    assert!(found, "GNU {name} is needed to build test kernels: install binutils (scripts/test does this)");
    name
}

/// Assembles AT&T-syntax `source` (32-bit unless `bits64`) and links it at `text_addr`.
pub fn assemble(name: &str, source: &str, bits64: bool, text_addr: u64) -> PathBuf {
    let dir = tmp_dir("kernels");
    let (s, o, elf) = (dir.join(format!("{name}.S")), dir.join(format!("{name}.o")), dir.join(name));
    std::fs::write(&s, source).expect("write assembly");
    let st = Command::new(tool("as"))
        .args(if bits64 { ["--64"] } else { ["--32"] })
        .arg("-o")
        .arg(&o)
        .arg(&s)
        .status()
        .expect("run as");
    assert!(st.success(), "as failed on {}", s.display());
    let st = Command::new(tool("ld"))
        .args([
            "-m",
            if bits64 { "elf_x86_64" } else { "elf_i386" },
            "-e",
            "_start",
            "--build-id=none",
            "-z",
            "noexecstack",
        ])
        .arg(format!("-Ttext={text_addr:#x}"))
        .arg("-o")
        .arg(&elf)
        .arg(&o)
        .status()
        .expect("run ld");
    assert!(st.success(), "ld failed on {}", o.display());
    elf
}

/// A multiboot v1 header (flags: page-align, memory info) and serial/exit helpers, in 32-bit
/// AT&T syntax. `body` runs at `_start` with EAX/EBX as the boot loader left them.
pub fn multiboot_source(body: &str) -> String {
    format!(
        r#"
    .code32
    .section .text
    .align 4
mb_header:
    .long 0x1BADB002
    .long 0x00000003
    .long -(0x1BADB002 + 0x00000003)
    .globl _start
_start:
{body}
{HELPERS32}"#
    )
}

/// 32-bit helpers for test kernels: `exit(%eax)` through the debug-exit port, `puts(%edi)` of a
/// NUL-terminated string to COM1, `print_hex(%eax)` of 8 hex digits and a newline.
pub const HELPERS32: &str = r#"
/* exit(%eax) through the debug-exit port */
exit:
    mov $0xf4, %dx
    out %eax, %dx
1:  hlt
    jmp 1b
/* puts(%edi): NUL-terminated string to COM1 */
puts:
    push %eax
    push %edx
    mov $0x3f8, %dx
2:  movb (%edi), %al
    test %al, %al
    jz 3f
    out %al, %dx
    inc %edi
    jmp 2b
3:  pop %edx
    pop %eax
    ret
/* print_hex(%eax): 8 hex digits and a newline */
print_hex:
    push %ecx
    push %edx
    push %eax
    mov $8, %ecx
4:  rol $4, %eax
    push %eax
    and $0xf, %eax
    cmp $10, %eax
    jb 5f
    add $('a' - '0' - 10), %eax
5:  add $'0', %eax
    mov $0x3f8, %dx
    out %al, %dx
    pop %eax
    dec %ecx
    jnz 4b
    mov $'\n', %al
    out %al, %dx
    pop %eax
    pop %edx
    pop %ecx
    ret
"#;
