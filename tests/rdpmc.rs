//! RDPMC outside counted code: completed at the guest's #GP handler (a hardware breakpoint
//! there) under both backends, on every shipped profile, and in 32-bit protected mode; the run
//! summary and `--json` say what happened.
mod common;
use common::*;

/// `guest:rdpmc` under `backend` on `profile`: its checks pass; returns the `rdpmc` object of the
/// JSON report, the one-line summary and the backend's summary.
fn rdpmc_guest(profile: &str, backend: &str) -> (serde_json::Value, String, String) {
    let (r, json) = emon_json(
        &format!("rdpmc-{profile}-{backend}"),
        // CPL0 code in KVM (--cpl0 kvm): with nothing counting it runs free, and its RDPMCs reach
        // the #GP handler's breakpoint; in the TCG engine the backend steps them instead.
        &["--profile", profile, "--backend", backend, "--cpl0", "kvm", "--timeout", "120", "guest:rdpmc"],
    );
    r.assert_status(0).assert_no_failures();
    let line = r.stderr.lines().rev().find(|l| l.starts_with("emon: guest exited")).unwrap().to_owned();
    let backend_summary = json["backend"]["summary"].as_str().unwrap_or_default().to_owned();
    (json["rdpmc"].clone(), line, backend_summary)
}

#[test]
fn rdpmc_follows_the_sdm_under_both_backends_on_every_profile() {
    if !kvm_available() {
        return;
    }
    for profile in emon::profile::Profile::builtin_names() {
        if emon::profile::Profile::load(profile).unwrap().pmu.netburst() {
            // guest:rdpmc skips on NetBurst, where guest:netburst-counters reads the counters with
            // RDPMC through the same catch, and --backend perf is refused (tests/netburst.rs).
            continue;
        }
        let mut completed = Vec::new();
        for backend in ["precise", "perf"] {
            let (rdpmc, line, backend_summary) = rdpmc_guest(profile, backend);
            if profile == "no-pmu" {
                // Without a PMU every RDPMC faults, as KVM makes it: nothing to catch.
                assert_eq!(rdpmc["armed"], false, "{profile} {backend}: {rdpmc}");
                assert!(!line.contains("RDPMC completed"), "{line}");
                continue;
            }
            assert_eq!(rdpmc["armed"], true, "{profile} {backend}: {rdpmc}");
            let n = |k: &str| rdpmc[k].as_u64().unwrap_or_else(|| panic!("{k}: {rdpmc}"));
            if backend == "precise" && !emon::vmm::exec_probe::syscall_enters_kernel().unwrap() {
                // A host where user mode runs in the engine: CPL0 code is stepped even with
                // --cpl0 kvm, so that KVM never runs the user code after a return to user mode
                // (README, "User mode (CPL3)"). The backend completes every RDPMC itself, and
                // none comes to the #GP handler.
                assert_eq!(n("completed"), 0, "{profile}: {rdpmc}");
                let emulated: u64 = backend_summary
                    .split(" RDPMC and ")
                    .next()
                    .and_then(|t| t.rsplit(' ').next())
                    .and_then(|n| n.parse().ok())
                    .unwrap_or_else(|| panic!("{backend_summary}"));
                assert!(emulated >= 400, "{profile}: {backend_summary}");
                completed.push(0);
                continue;
            }
            // 300 in a row and 100 after a real #GP, at least.
            assert!(n("completed") >= 400, "{profile} {backend}: {rdpmc}");
            // The real #GPs (100 rounds, two frames), and the RDPMCs that fault (bad indexes,
            // CPL3 without CR4.PCE) with nothing counting.
            assert!(n("gp_passed") >= 102, "{profile} {backend}: {rdpmc}");
            assert!(n("gp_passed_rdpmc_faults") >= 6, "{profile} {backend}: {rdpmc}");
            // The guest's own single-step traps (RFLAGS.TF) reach it (the guest checks that); on
            // kvm_pvm they do without an exit, elsewhere KVM sends them to emon, which gives
            // them back.
            assert!(rdpmc["db_reinjected"].is_u64(), "{rdpmc}");
            assert!(
                line.contains(&format!(
                    "RDPMC completed at the #GP handler: {}; #GP passed to the guest: {}",
                    n("completed"),
                    n("gp_passed")
                )),
                "{line}"
            );
            // Its own breakpoint made emon stand aside for a while, and the summary says so.
            assert!(line.contains("the guest used the debug registers itself"), "{line}");
            completed.push(n("completed"));
        }
        if profile != "no-pmu" {
            // The precise backend emulates RDPMC in the code it counts (single-stepping); the perf
            // backend does not step, so there every RDPMC comes to the #GP handler.
            assert!(completed[1] > completed[0], "{profile}: completed at the handler {completed:?}");
        }
    }
}

/// A multiboot kernel in 32-bit protected mode (paging off) whose #GP handler ends the run with
/// status 13: RDPMC of IA32_PMC0 after a legacy write, then a fast read of IA32_FIXED_CTR1.
const PROTECTED_MODE_RDPMC: &str = r#"
    mov $0x90000, %esp
    /* IDT[13]: a 32-bit interrupt gate to gp, with the boot code segment */
    mov %cs, %ax
    movzwl %ax, %eax
    shl $16, %eax
    lea gp, %ecx
    mov %ecx, %edx
    and $0xffff, %edx
    or %edx, %eax
    mov %eax, idt + 13 * 8
    and $0xffff0000, %ecx
    or $0x8e00, %ecx
    mov %ecx, idt + 13 * 8 + 4
    lidt idtr
    lea hello, %edi
    call puts              /* an exit: emon finds the new #GP handler */
    mov $0xc1, %ecx        /* IA32_PMC0 = 0x12345678 */
    mov $0x12345678, %eax
    xor %edx, %edx
    wrmsr
    mov $0x30a, %ecx       /* IA32_FIXED_CTR1 = 0x1_8765_4321 */
    mov $0x87654321, %eax
    mov $1, %edx
    wrmsr
    xor %ecx, %ecx
    rdpmc
    call print_hex
    mov %edx, %eax
    call print_hex
    mov $0xc0000001, %ecx  /* fast read of fixed counter 1 */
    rdpmc
    call print_hex
    mov %edx, %eax
    call print_hex
    xor %eax, %eax
    jmp exit
gp:
    mov $13, %eax
    jmp exit
    .data
    .align 8
idt: .fill 256 * 8, 1, 0
idtr: .word 256 * 8 - 1
    .long idt
hello: .asciz "protected mode\n"
    .text
"#;

#[test]
fn rdpmc_completes_in_32_bit_protected_mode() {
    if !kvm_available() {
        return;
    }
    let kernel = assemble("rdpmc-pm32", &multiboot_source(PROTECTED_MODE_RDPMC), false, 0x100000);
    let r = emon(&["run", "--timeout", "60", kernel.to_str().unwrap()]);
    r.assert_status(0);
    assert_eq!(r.stdout, "protected mode\n12345678\n00000000\n87654321\n00000000\n", "{}", r.stderr);
    assert!(r.stderr.contains("RDPMC completed at the #GP handler: 2; #GP passed to the guest: 0"), "{}", r.stderr);
}

#[test]
fn a_guest_without_a_gp_handler_shuts_down_at_rdpmc_and_the_summary_says_why() {
    if !kvm_available() {
        return;
    }
    // No IDT: KVM's #GP for the RDPMC becomes a triple fault, where a CPU with a PMU would have
    // read the counter.
    let body = "    mov $0x3f8, %dx\n    mov $'x', %al\n    out %al, %dx\n    xor %ecx, %ecx\n    rdpmc\n    xor %eax, %eax\n    jmp exit\n";
    let kernel = assemble("rdpmc-no-idt", &multiboot_source(body), false, 0x100000);
    let r = emon(&["run", "--timeout", "60", kernel.to_str().unwrap()]);
    r.assert_status(3);
    assert!(
        r.stderr.contains(
            "triple fault (KVM_EXIT_SHUTDOWN); the instruction at RIP is RDPMC, which emon could not complete at a #GP handler: the guest's IDT had no #GP entry"
        ),
        "{}",
        r.stderr
    );
}
