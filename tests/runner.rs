//! `emon test`: a small matrix passes and writes valid JUnit and JSON; failing, hanging, crashing
//! and summary-less kernels fail with their reasons; shards partition the matrix; the default
//! suite passes; bad input is a one-line error with status 2.
mod common;
use common::*;
use emon::profile::Profile;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Instant;

fn kernel(name: &str, body: &str) -> PathBuf {
    assemble(name, &multiboot_source(body), false, 0x100000)
}

/// Prints each string to COM1, then exits with `code`.
fn printing_kernel(name: &str, lines: &[&str], code: u32) -> PathBuf {
    let mut body = String::new();
    let mut data = String::from("    .section .data\n");
    for (i, l) in lines.iter().enumerate() {
        body += &format!("    mov $msg{i}, %edi\n    call puts\n");
        data += &format!("msg{i}: .asciz \"{l}\\n\"\n");
    }
    body += &format!("    mov ${code}, %eax\n    jmp exit\n");
    let source = multiboot_source(&body) + &data;
    assemble(name, &source, false, 0x100000)
}

fn read_json(p: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: invalid JSON: {e}\n{text}", p.display()))
}

/// (suite name, [(case name, failure/skipped/none, failure message)]) for every <testsuite>.
type Cases = Vec<(String, Option<String>, Option<String>)>;
fn read_junit(p: &Path) -> (Vec<(String, Cases)>, String) {
    let text = std::fs::read_to_string(p).unwrap();
    let doc = roxmltree::Document::parse(&text).unwrap_or_else(|e| panic!("{}: invalid XML: {e}\n{text}", p.display()));
    let root = doc.root_element();
    assert_eq!(root.tag_name().name(), "testsuites");
    let suites = root
        .children()
        .filter(|n| n.has_tag_name("testsuite"))
        .map(|s| {
            let cases = s
                .children()
                .filter(|n| n.has_tag_name("testcase"))
                .map(|c| {
                    let kind = c.children().find(|n| n.has_tag_name("failure") || n.has_tag_name("skipped"));
                    (
                        c.attribute("name").unwrap().to_string(),
                        kind.map(|k| k.tag_name().name().to_string()),
                        kind.and_then(|k| k.attribute("message")).map(str::to_string),
                    )
                })
                .collect();
            (s.attribute("name").unwrap().to_string(), cases)
        })
        .collect();
    (suites, text)
}

fn out_files(name: &str) -> (PathBuf, PathBuf) {
    let d = tmp_dir("runner");
    (d.join(format!("{name}.xml")), d.join(format!("{name}.json")))
}

#[test]
fn small_matrix_passes_with_junit_and_json() {
    if !kvm_available() {
        return;
    }
    let (xml, json) = out_files("small");
    let r = emon(&[
        "test",
        "guest:cpuid-report,guest:count-instructions",
        "--profile",
        "nehalem,no-pmu",
        "--jobs",
        "2",
        "--junit",
        xml.to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
    ]);
    r.assert_status(0);
    // Not a terminal: one plain line per result, then the table.
    assert_eq!(r.stdout.lines().filter(|l| l.starts_with('[') && l.contains("/4] ")).count(), 4, "{}", r.stdout);
    assert!(!r.stdout.contains('\r'), "no progress redraws off a terminal");
    assert!(r.stdout.contains("4 runs: 3 passed, 1 skipped, 0 failed"), "{}", r.stdout);

    let (suites, _) = read_junit(&xml);
    let names: Vec<&str> = suites.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "guest:cpuid-report on nehalem",
            "guest:cpuid-report on no-pmu",
            "guest:count-instructions on nehalem",
            "guest:count-instructions on no-pmu"
        ]
    );
    let count = |i: usize, kind: Option<&str>| suites[i].1.iter().filter(|c| c.1.as_deref() == kind).count();
    assert_eq!((count(0, None), count(1, None)), (1, 0));
    assert_eq!((count(2, None), count(2, Some("failure"))), (9, 0), "count-instructions: 9 checks on nehalem");
    assert_eq!((count(3, None), count(3, Some("skipped"))), (0, 1), "count-instructions skips without a PMU");

    let v = read_json(&json);
    assert_eq!(v["totals"]["runs"], 4);
    assert_eq!(v["totals"]["failed"], 0);
    assert_eq!(v["totals"]["cases_passed"], 10);
    assert_eq!(v["totals"]["cases_skipped"], 1);
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs[2]["kernel"], "guest:count-instructions");
    assert_eq!(runs[2]["profile"], "nehalem");
    assert_eq!(runs[2]["status"], "pass");
    assert_eq!(runs[2]["cases"].as_array().unwrap().len(), 9);
    assert_eq!(runs[2]["summary"]["tests"], 9);
    assert_eq!(runs[3]["status"], "skip");
    assert!(runs[2]["emon_summary"].as_str().unwrap().contains("guest exited with code 0"));
}

#[test]
fn failing_hanging_crashing_and_silent_kernels_fail_with_reasons() {
    if !kvm_available() {
        return;
    }
    let fail = printing_kernel(
        "runner-fail",
        &["PASS: a", "  got 1, want 2", "FAIL: b", "SUMMARY: 2 tests, 1 unexpected failures, 0 skipped"],
        1,
    );
    printing_kernel("runner-no-summary", &["PASS: a"], 0);
    kernel("runner-hang", "    mov $started, %edi\n    call puts\n1:  jmp 1b\nstarted: .asciz \"PASS: started\\n\"\n");

    kernel("runner-crash", "    lidt null_idt\n    xor %ecx, %ecx\n    div %ecx\nnull_idt: .word 0\n    .long 0\n");
    // A suite next to the kernels, with relative paths and a per-entry timeout.
    let dir = fail.parent().unwrap();
    let suite = dir.join("runner-failing.toml");
    std::fs::write(
        &suite,
        "[[run]]\nkernels = [\"guest:count-instructions\", \"runner-fail\", \"runner-no-summary\", \"runner-crash\"]\n\
         profiles = [\"nehalem\"]\n\n[[run]]\nkernels = [\"runner-hang\"]\nprofiles = [\"nehalem\"]\ntimeout = 1.5\n",
    )
    .unwrap();
    let (xml, json) = out_files("failing");
    let start = Instant::now();
    let r = emon(&[
        "test",
        "--suite",
        suite.to_str().unwrap(),
        "--jobs",
        "3",
        "--junit",
        xml.to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(start.elapsed().as_secs() < 60, "the hanging kernel's timeout applies");
    r.assert_status(1);
    assert!(r.stdout.contains("5 runs: 1 passed, 0 skipped, 4 failed"), "{}", r.stdout);
    assert!(r.stdout.contains("\nfailures:\n"), "{}", r.stdout);
    assert!(r.stdout.contains("    FAIL: b\n"), "{}", r.stdout);
    assert!(r.stdout.contains("| emon: guest exited with code 1"), "emon's summary line is quoted\n{}", r.stdout);

    let (suites, text) = read_junit(&xml);
    let by_kernel = |k: &str| -> &Cases {
        &suites
            .iter()
            .find(|(n, _)| n.starts_with(&format!("{}/{k} ", dir.display())))
            .unwrap_or_else(|| panic!("{k}\n{text}"))
            .1
    };
    let owned =
        |n: &str, k: Option<&str>, m: Option<&str>| (n.to_string(), k.map(str::to_string), m.map(str::to_string));
    assert_eq!(*by_kernel("runner-fail"), [owned("a", None, None), owned("b", Some("failure"), Some("FAIL: b"))]);
    let silent_cases = by_kernel("runner-no-summary");
    assert_eq!(silent_cases[0], owned("a", None, None));
    assert_eq!(silent_cases[1], owned("emon run", Some("failure"), Some("no SUMMARY line")));
    let hang_cases = by_kernel("runner-hang");
    assert_eq!(hang_cases[1].1.as_deref(), Some("failure"));
    assert!(hang_cases[1].2.as_deref().unwrap().starts_with("timed out after 1.5 s"), "{hang_cases:?}");
    let crash_cases = by_kernel("runner-crash");
    assert!(crash_cases[0].2.as_deref().unwrap().starts_with("crashed: triple fault"), "{crash_cases:?}");
    assert!(text.contains("<system-out>PASS: started\n</system-out>"), "captured output of the run\n{text}");
    assert!(text.contains("triple fault") && text.contains("<system-err>"), "{text}");

    let v = read_json(&json);
    let runs = v["runs"].as_array().unwrap();
    let status: Vec<(&str, &str)> =
        runs.iter().map(|r| (r["status"].as_str().unwrap(), r["reason"].as_str().unwrap_or(""))).collect();
    assert_eq!(status[0], ("pass", ""));
    assert_eq!(status[1], ("fail", "1 failed test (exit status 1)"));
    assert_eq!(status[2], ("fail", "no SUMMARY line"));
    assert!(status[3].1.starts_with("crashed"), "{status:?}");
    assert!(status[4].1.starts_with("timed out after 1.5 s"), "{status:?}");
    assert_eq!(runs[4]["timeout_s"], 1.5);
    assert_eq!(runs[4]["exit_code"], 4);
    assert_eq!(runs[1]["cases"][1]["output"][0], "got 1, want 2");
    assert_eq!(runs[1]["summary"]["unexpected_failures"], 1);
    assert!(runs[3]["stderr"].as_str().unwrap().contains("rip="), "a failed run keeps emon's stderr");
    assert_eq!(v["totals"]["failed"], 4);
}

#[test]
fn shards_partition_the_matrix() {
    if !kvm_available() {
        return;
    }
    let matrix = ["guest:cpuid-report,guest:step-events,guest:freeze-on-pmi", "--profile", "nehalem,no-pmu,core2"];
    let mut seen: Vec<BTreeSet<(u64, String)>> = Vec::new();
    for shard in ["1/2", "2/2"] {
        let (_, json) = out_files(&format!("shard-{}", &shard[..1]));
        let mut args = vec!["test", "--jobs", "2", "--shard", shard, "--json", json.to_str().unwrap()];
        args.extend(matrix);
        emon(&args).assert_status(0);
        let v = read_json(&json);
        assert_eq!(v["shard"], shard);
        seen.push(
            v["runs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| (r["index"].as_u64().unwrap(), r["name"].as_str().unwrap().to_string()))
                .collect(),
        );
    }
    assert!(seen[0].is_disjoint(&seen[1]), "{seen:?}");
    let all: BTreeSet<u64> = seen.iter().flatten().map(|(i, _)| *i).collect();
    assert_eq!(all, (0..9).collect(), "{seen:?}");
    assert_eq!((seen[0].len(), seen[1].len()), (5, 4), "round-robin by matrix index");
    assert!(seen[0].iter().all(|(i, _)| i % 2 == 0));
}

#[test]
fn the_default_suite_passes() {
    if !kvm_available() {
        return;
    }
    let (xml, json) = out_files("default");
    let start = Instant::now();
    // `emon test` alone runs the built-in default suite, from any directory.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_emon"))
        .args(["test", "--jobs", "2", "--junit", xml.to_str().unwrap(), "--json", json.to_str().unwrap()])
        .current_dir(tmp_dir("default-suite-cwd"))
        .output()
        .expect("run emon");
    let wall = start.elapsed();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stdout));
    let v = read_json(&json);
    assert_eq!(v["suite"], "the default suite (resources/suites/default.toml)");
    let runs = v["runs"].as_array().unwrap();
    eprintln!("default suite: {} runs in {:.1} s with --jobs 2", runs.len(), wall.as_secs_f64());
    read_junit(&xml);
    // It covers every built-in guest but bench on every shipped profile.
    let cells: BTreeSet<(String, String)> = runs
        .iter()
        .map(|r| (r["kernel"].as_str().unwrap().to_string(), r["profile"].as_str().unwrap().to_string()))
        .collect();
    for (guest, _) in emon::guests::list().filter(|(g, _)| *g != "bench") {
        for profile in Profile::builtin_names() {
            assert!(
                cells.contains(&(format!("guest:{guest}"), profile.to_string())),
                "guest:{guest} on {profile} missing"
            );
        }
    }
    assert!(!cells.iter().any(|(k, _)| k == "guest:bench"));
}

fn assert_one_line_error(args: &[&str], want: &str) {
    let r = emon(args);
    r.assert_status(2);
    let lines: Vec<&str> = r.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line: {}", r.stderr);
    assert!(lines[0].starts_with("emon: ") && lines[0].contains(want), "{args:?}: want {want:?} in {}", r.stderr);
    assert!(r.stdout.is_empty(), "nothing ran: {}", r.stdout);
}

#[test]
fn bad_input_is_a_one_line_error() {
    assert_one_line_error(&["test", "guest:nope"], "no built-in guest 'nope'; built-in guests: ");
    assert_one_line_error(&["test", "guest:nope-*"], "guest:nope-*: matches no built-in guest");
    assert_one_line_error(&["test", "/nonexistent/*.elf"], "/nonexistent/*.elf: matches no kernel file");
    assert_one_line_error(&["test", "/nonexistent/k.elf"], "/nonexistent/k.elf: no such kernel file");
    assert_one_line_error(&["test", "guest:cpuid-report", "--profile", "zen*"], "zen*: matches no built-in profile");
    assert_one_line_error(&["test", "guest:cpuid-report", "--profile", "zen"], "zen: unknown profile");
    assert_one_line_error(&["test", "guest:cpuid-report", "--shard", "3/2"], "--shard 3/2: I must be from 1 to 2");
    assert_one_line_error(&["test", "guest:cpuid-report", "--shard", "0/2"], "--shard 0/2: I must be from 1 to 2");
    assert_one_line_error(&["test", "guest:cpuid-report", "--shard", "x"], "--shard x: expected I/N");
    assert_one_line_error(&["test", "guest:cpuid-report", "--jobs", "0"], "--jobs 0");
    assert_one_line_error(&["test", "guest:cpuid-report", "--timeout", "0"], "--timeout 0");
    assert_one_line_error(&["test", "guest:cpuid-report", "--pmu", "gp=99"], "pmu.gp = 99");
    assert_one_line_error(&["test", "--profile", "nehalem"], "--profile needs KERNEL");
    assert_one_line_error(&["test", "guest:cpuid-report", "--repeat", "0"], "--repeat 0");
    let dir = tmp_dir("runner");
    let suite = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p.to_str().unwrap().to_string()
    };
    let s = suite("typo.toml", "[[run]]\nkernels = [\"guest:cpuid-report\"]\nprofile = [\"nehalem\"]\n");
    assert_one_line_error(
        &["test", "--suite", &s],
        &format!("{s}: line 3 (`profile = [\"nehalem\"]`): unknown field `profile`"),
    );
    let s = suite("type.toml", "[[run]]\nkernels = \"guest:cpuid-report\"\n");
    assert_one_line_error(&["test", "--suite", &s], &format!("{s}: line 2"));
    let s = suite("glob.toml", "[[run]]\nkernels = [\"guest:cpuid-report\"]\n[[run]]\nkernels = [\"guest:x*\"]\n");
    assert_one_line_error(
        &["test", "--suite", &s],
        &format!("{s}: line 3: run.kernels: guest:x*: matches no built-in guest"),
    );
    let s = suite("timeout.toml", "[[run]]\nkernels = [\"guest:cpuid-report\"]\ntimeout = 0\n");
    assert_one_line_error(
        &["test", "--suite", &s],
        &format!("{s}: line 1: run.timeout = 0.0: must be a positive number"),
    );
    assert_one_line_error(&["test", "--suite", "/nonexistent.toml"], "/nonexistent.toml: cannot read the suite file");
}
