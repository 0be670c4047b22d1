//! The ways a run ends, each with its exit status and one-line summary: the debug-exit port
//! (the guest's code), triple fault (3, registers printed), --timeout (4), Ctrl-C (130), a guest
//! kernel's panic end marker and a silent console (5); unknown MSRs: #GP, or ignored with
//! --ignore-msrs; and the `--json` report of each ending.
mod common;
use common::*;
use std::time::Duration;

fn kernel(name: &str, body: &str) -> String {
    assemble(name, &multiboot_source(body), false, 0x100000).to_str().unwrap().to_owned()
}

fn summary_line(r: &Run) -> &str {
    r.stderr.lines().rev().find(|l| l.starts_with("emon: ")).unwrap_or_else(|| panic!("no summary in {}", r.stderr))
}

#[test]
fn debug_exit_code_is_emons_exit_status() {
    if !kvm_available() {
        return;
    }
    let r = emon(&["run", &kernel("exit7", "    mov $7, %eax\n    jmp exit\n")]);
    r.assert_status(7);
    assert!(summary_line(&r).contains("guest exited with code 7"), "{}", r.stderr);
}

#[test]
fn triple_fault_exits_3_with_registers() {
    if !kvm_available() {
        return;
    }
    // #DE with an empty IDT: #DF, then a triple fault.
    let body = "    lidt null_idt\n    xor %ecx, %ecx\n    div %ecx\nnull_idt: .word 0\n    .long 0\n";
    let (r, json) = emon_json("run-end-triple", &[&kernel("triple", body)]);
    r.assert_status(3);
    assert!(summary_line(&r).contains("triple fault"), "{}", r.stderr);
    assert!(r.stderr.contains("rip=") && r.stderr.contains("cr0="), "registers not printed: {}", r.stderr);
    assert_consistent(&r, &json);
    assert_eq!(json["end"]["kind"], "shutdown", "{json:#}");
    assert!(json["end"]["reason"].as_str().is_some_and(|w| w.contains("triple fault")), "{json:#}");
    assert!(json["end"]["registers"].as_str().is_some_and(|w| w.contains("rip=")), "{json:#}");
}

#[test]
fn timeout_exits_4() {
    if !kvm_available() {
        return;
    }
    let r = emon(&["run", "--timeout", "0.5", &kernel("spin", "1:  jmp 1b\n")]);
    r.assert_status(4);
    assert!(summary_line(&r).contains("timeout"), "{}", r.stderr);
}

#[test]
fn ctrl_c_exits_130() {
    if !kvm_available() {
        return;
    }
    let k = kernel("spin2", "1:  jmp 1b\n");
    let report = json_path("run-end-ctrl-c");
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_emon"))
        .args(["run", "--timeout", "20", "--json", report.to_str().unwrap(), &k])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(700));
    // SAFETY: sending SIGINT to our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    assert!(stderr.contains("interrupted"), "{stderr}");
    let json = read_json(&report, &stderr);
    assert_eq!(json["end"], serde_json::json!({"kind": "interrupted"}), "{json:#}");
    assert_eq!(json["status"], 130, "{json:#}");
}

const READ_UNKNOWN_MSR: &str = "    mov $0x12345, %ecx\n    rdmsr\n    xor %eax, %eax\n    jmp exit\n";

#[test]
fn unknown_msr_raises_gp() {
    if !kvm_available() {
        return;
    }
    // No IDT in this kernel: the #GP becomes a triple fault.
    let r = emon(&["run", &kernel("msr-unknown", READ_UNKNOWN_MSR)]);
    r.assert_status(3);
    assert!(summary_line(&r).contains("1 #GP injected"), "{}", r.stderr);
}

#[test]
fn ignore_msrs_reads_zero() {
    if !kvm_available() {
        return;
    }
    let r = emon(&["run", "--ignore-msrs", "--verbose", &kernel("msr-ignored", READ_UNKNOWN_MSR)]);
    r.assert_status(0);
    assert!(r.stderr.contains("non-PMU MSR 0x12345: 1 accesses"), "{}", r.stderr);
}

/// The `--json` report agrees with the run: the exit status, and each figure of the one-line
/// summary ("... after T s, N exits, M PMU MSR accesses, G #GP injected, backend B (status S)").
fn assert_consistent(r: &Run, json: &serde_json::Value) {
    let line = summary_line(r);
    assert_eq!(json["summary"], line, "{json:#}");
    assert_eq!(json["status"], r.status, "{json:#}");
    let after = |what: &str| {
        let (before, _) = line.split_once(what).unwrap_or_else(|| panic!("no {what:?} in {line}"));
        before.rsplit([' ', '(']).next().unwrap().to_owned()
    };
    let n = |what: &str| after(what).parse::<u64>().unwrap_or_else(|e| panic!("{what:?} in {line}: {e}"));
    assert_eq!(format!("{:.2}", json["elapsed_s"].as_f64().unwrap()), after(" s, "), "{json:#}");
    assert_eq!(json["exits"]["total"], n(" exits"), "{json:#}");
    let msr = &json["msr"];
    assert_eq!(msr["pmu_reads"].as_u64().unwrap() + msr["pmu_writes"].as_u64().unwrap(), n(" PMU MSR accesses"));
    assert_eq!(msr["gp_injected"], n(" #GP injected"), "{json:#}");
    let status = line.rsplit_once("(status ").and_then(|(_, s)| s.strip_suffix(')')).unwrap();
    assert_eq!(json["status"].to_string(), status, "{json:#}");
    let backend = json["backend"]["name"].as_str().unwrap();
    assert!(line.contains(&format!(", backend {backend}")), "{line} {json:#}");
    // Every exit is counted once, by its kind (debug and shutdown exits only in the total).
    let e = &json["exits"];
    let kinds: u64 = ["pio", "mmio", "msr", "other"].iter().map(|k| e[k].as_u64().unwrap()).sum();
    assert!(kinds <= e["total"].as_u64().unwrap(), "{e}");
    assert!(e["completed"].is_u64() && e["int3_delivered"].is_u64() && e["interrupted"].is_u64(), "{e}");
    for f in ["at_start", "at_end"] {
        assert!(json["fds"][f].as_u64().is_some_and(|n| n > 2), "{json:#}");
    }
    assert!(json["peak_memory_kib"].as_u64().is_some_and(|k| k > 0), "{json:#}");
    for k in ["fixed", "nmi", "masked", "dropped"] {
        assert!(json["pmis"][k].is_u64(), "{json:#}");
    }
    assert!(json["backend"]["summary"].as_str().is_some_and(|s| !s.is_empty()), "{json:#}");
    assert!(json["backend"]["notes"].is_array(), "{json:#}");
    assert_eq!(json["trace"], serde_json::json!({"events": 0, "error": null}), "{json:#}");
}

#[test]
fn json_report_of_a_debug_exit() {
    if !kvm_available() {
        return;
    }
    // A PMU MSR read (IA32_PERF_GLOBAL_CTRL), an ignored unknown MSR, an unhandled port, exit 5.
    let body = "    mov $0x38f, %ecx\n    rdmsr\n    mov $0x12345, %ecx\n    rdmsr\n    rdmsr\n\
                    mov $0x80, %dx\n    out %al, %dx\n    mov $5, %eax\n    jmp exit\n";
    let (r, json) = emon_json("run-end-exit", &["--ignore-msrs", &kernel("json-exit", body)]);
    r.assert_status(5);
    assert_consistent(&r, &json);
    assert_eq!(json["end"], serde_json::json!({"kind": "debug-exit", "code": 5}), "{json:#}");
    let msr = &json["msr"];
    assert_eq!(msr["pmu_reads"], 1, "{msr:#}");
    assert_eq!(msr["pmu_writes"], 0, "{msr:#}");
    assert_eq!(msr["gp_injected"], 0, "{msr:#}");
    assert_eq!(msr["unknown"], serde_json::json!([{"msr": 0x12345, "accesses": 2}]), "{msr:#}");
    assert_eq!(msr["unknown_untracked"], 0, "{msr:#}");
    assert_eq!(json["unhandled_ports"], serde_json::json!([{"port": 0x80, "accesses": 1}]), "{json:#}");
    assert_eq!(json["exits"]["msr"], 3, "{json:#}");
    assert_eq!(json["serial_error"], serde_json::Value::Null, "{json:#}");
}

#[test]
fn json_report_of_a_timeout() {
    if !kvm_available() {
        return;
    }
    let (r, json) = emon_json("run-end-timeout", &["--timeout", "0.5", &kernel("json-spin", "1:  jmp 1b\n")]);
    r.assert_status(4);
    assert_consistent(&r, &json);
    assert_eq!(json["end"], serde_json::json!({"kind": "timeout"}), "{json:#}");
    assert!(json["elapsed_s"].as_f64().is_some_and(|s| s >= 0.45), "{json:#}");
}

/// Prints `lines` (each NUL-terminated in the kernel's data) to COM1, then runs `after`.
fn printing_kernel(name: &str, lines: &[&str], after: &str) -> String {
    let mut body = String::new();
    for i in 0..lines.len() {
        body += &format!("    mov $line{i}, %edi\n    call puts\n");
    }
    body += after;
    body += "    jmp 9f\n";
    for (i, l) in lines.iter().enumerate() {
        body += &format!("line{i}: .asciz \"{l}\\n\"\n");
    }
    body += "9:\n    jmp 9b\n";
    kernel(name, &body)
}

const PANIC: &str = "[    2.500000] Kernel panic - not syncing: emon test";
const PANIC_END: &str = "[    2.600000] ---[ end Kernel panic - not syncing: emon test ]---";

/// Linux's `panic()` without a reboot prints its end marker and spins: the run ends a second of
/// console silence later with status 5, not at the timeout, with the panic line in the summary
/// and the report.
#[test]
fn a_panic_end_marker_then_silence_ends_the_run_with_status_5() {
    if !kvm_available() {
        return;
    }
    let k = printing_kernel("panic-end", &["booting", PANIC, PANIC_END], "");
    let (r, json) = emon_json("run-end-panic-end", &["--timeout", "60", &k]);
    r.assert_status(5);
    assert_consistent(&r, &json);
    let line = summary_line(&r);
    assert!(
        line.contains("guest kernel panic, \"Kernel panic - not syncing: emon test\"; then the kernel printed its panic's end marker and nothing for 1 s after it"),
        "{line}"
    );
    assert_eq!(json["end"], serde_json::json!({"kind": "panic-end"}), "{json:#}");
    assert_eq!(json["guest_panic"], "Kernel panic - not syncing: emon test", "{json:#}");
    let elapsed = json["elapsed_s"].as_f64().unwrap();
    assert!((1.0..30.0).contains(&elapsed), "ended {elapsed} s after start, not a second after the marker");
}

/// Console output after the end marker is progress: the run goes on (here to its timeout, still
/// status 5 after the panic line).
#[test]
fn output_after_the_panic_end_marker_keeps_the_run_going() {
    if !kvm_available() {
        return;
    }
    let chatter = "1:  mov $dot, %edi\n    call puts\n    jmp 1b\ndot: .asciz \".\"\n";
    let k = printing_kernel("panic-end-chatter", &[PANIC, PANIC_END], chatter);
    let (r, json) = emon_json("run-end-panic-chatter", &["--timeout", "3", &k]);
    r.assert_status(5);
    assert_eq!(json["end"], serde_json::json!({"kind": "timeout"}), "{json:#}");
    assert!(summary_line(&r).contains("; then timeout"), "{}", r.stderr);
}

/// The end marker counts only after a panic line: alone, it is console text like any other.
#[test]
fn a_panic_end_marker_without_a_panic_is_text() {
    if !kvm_available() {
        return;
    }
    let k = printing_kernel("panic-end-alone", &[PANIC_END], "");
    let (r, json) = emon_json("run-end-panic-end-alone", &["--timeout", "3", &k]);
    r.assert_status(4);
    assert_eq!(json["end"], serde_json::json!({"kind": "timeout"}), "{json:#}");
    assert_eq!(json["guest_panic"], serde_json::Value::Null, "{json:#}");
}
