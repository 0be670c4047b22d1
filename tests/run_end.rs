//! The ways a run ends, each with its exit status and one-line summary: the debug-exit port
//! (the guest's code), triple fault (3, registers printed), --timeout (4), Ctrl-C (130);
//! and unknown MSRs: #GP, or ignored with --ignore-msrs.
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
    let r = emon(&["run", &kernel("triple", body)]);
    r.assert_status(3);
    assert!(summary_line(&r).contains("triple fault"), "{}", r.stderr);
    assert!(r.stderr.contains("rip=") && r.stderr.contains("cr0="), "registers not printed: {}", r.stderr);
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
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_emon"))
        .args(["run", "--timeout", "20", &k])
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
