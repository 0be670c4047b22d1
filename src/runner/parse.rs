//! The kvm-unit-tests output convention, parsed: `PASS: name`, `FAIL: name`, `SKIP: name`,
//! `XFAIL: name`, `XPASS: name`, `KFAIL: name`, `ABORT: why`, and the final
//! `SUMMARY: N tests[, M unexpected failures][, K known failures][, X expected failures][, S skipped]`;
//! and the verdict on one run from that and emon's exit status. Pure functions: no processes, no I/O.
use serde::Serialize;

/// How one reported test case ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CaseResult {
    Pass,
    Fail,
    Skip,
    /// An expected failure (kvm-unit-tests `report_xfail` that failed): not a failure.
    Xfail,
    /// An expected failure that passed: an unexpected result, counted as a failure.
    Xpass,
    /// A known failure (kvm-unit-tests `report_kfail`): not a failure.
    Kfail,
    /// `report_abort`: the test gave up; a failure.
    Abort,
}

impl CaseResult {
    pub fn is_failure(self) -> bool {
        matches!(self, CaseResult::Fail | CaseResult::Xpass | CaseResult::Abort)
    }

    /// The line prefix, without the colon.
    pub fn word(self) -> &'static str {
        match self {
            CaseResult::Pass => "PASS",
            CaseResult::Fail => "FAIL",
            CaseResult::Skip => "SKIP",
            CaseResult::Xfail => "XFAIL",
            CaseResult::Xpass => "XPASS",
            CaseResult::Kfail => "KFAIL",
            CaseResult::Abort => "ABORT",
        }
    }

    const PREFIXES: [(&'static str, CaseResult); 7] = [
        ("PASS:", CaseResult::Pass),
        ("FAIL:", CaseResult::Fail),
        ("SKIP:", CaseResult::Skip),
        ("XFAIL:", CaseResult::Xfail),
        ("XPASS:", CaseResult::Xpass),
        ("KFAIL:", CaseResult::Kfail),
        ("ABORT:", CaseResult::Abort),
    ];
}

/// One `PASS:`/`FAIL:`/... line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Case {
    pub name: String,
    pub result: CaseResult,
    /// For a failure: the lines the guest printed since the previous reported line (at most
    /// [`MAX_DETAIL_LINES`], the last ones), which is where guests explain a failure
    /// (`got 0x5, want 0x9`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub output: Vec<String>,
}

/// Lines kept as a failing case's [`Case::output`].
pub const MAX_DETAIL_LINES: usize = 20;

/// The `SUMMARY:` line. Fields the line leaves out are 0, as kvm-unit-tests omits zero counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Summary {
    pub tests: u64,
    pub unexpected_failures: u64,
    pub known_failures: u64,
    pub expected_failures: u64,
    pub skipped: u64,
}

/// Everything the guest reported.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Parsed {
    pub cases: Vec<Case>,
    /// The last `SUMMARY:` line, if any.
    pub summary: Option<Summary>,
}

impl Parsed {
    pub fn count(&self, r: CaseResult) -> usize {
        self.cases.iter().filter(|c| c.result == r).count()
    }
    /// PASS, XFAIL and KFAIL lines.
    pub fn passed(&self) -> usize {
        self.count(CaseResult::Pass) + self.count(CaseResult::Xfail) + self.count(CaseResult::Kfail)
    }
    /// FAIL, XPASS and ABORT lines.
    pub fn failed(&self) -> usize {
        self.cases.iter().filter(|c| c.result.is_failure()).count()
    }
    pub fn skipped(&self) -> usize {
        self.count(CaseResult::Skip)
    }
}

/// What a run's console must show (`expect`: whole lines) and must not (`forbid`: text in any
/// line), as a suite sets it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Console {
    pub expect: Vec<String>,
    pub forbid: Vec<String>,
}

impl Console {
    /// One case per rule, in the suite's order, after the guest's own.
    pub fn check(&self, output: &str, parsed: &mut Parsed) {
        let lines: Vec<&str> = output.lines().map(|l| console_line(l).trim_end()).collect();
        for want in &self.expect {
            let found = lines.iter().any(|l| l == want);
            let case = Case {
                name: format!("console shows \"{want}\""),
                result: if found { CaseResult::Pass } else { CaseResult::Fail },
                output: Vec::new(),
            };
            parsed.cases.push(case);
        }
        for bad in &self.forbid {
            let hits: Vec<String> = lines.iter().filter(|l| l.contains(bad.as_str())).map(|l| l.to_string()).collect();
            let result = if hits.is_empty() { CaseResult::Pass } else { CaseResult::Fail };
            let output = hits.into_iter().take(MAX_DETAIL_LINES).collect();
            parsed.cases.push(Case { name: format!("console never shows \"{bad}\""), result, output });
        }
    }
}

/// A console line without its CR and leading blanks, and without the kernel log timestamp Linux
/// puts first (`[   13.356713] `).
fn console_line(raw: &str) -> &str {
    let line = raw.trim_end_matches('\r').trim_start();
    let stamped = line.strip_prefix('[').and_then(|rest| rest.split_once("] ")).filter(|(stamp, _)| {
        let stamp = stamp.trim_start();
        !stamp.is_empty() && stamp.chars().all(|c| c.is_ascii_digit() || c == '.')
    });
    stamped.map_or(line, |(_, after)| after.trim_start())
}

/// Parses a guest's serial output. Lines that are not reports are ignored, so third-party kernels
/// that print other things (boot banners, `INFO:` lines, CRLF line ends, kernel log timestamps)
/// parse too.
pub fn parse(output: &str) -> Parsed {
    let mut parsed = Parsed::default();
    let mut since_last: Vec<&str> = Vec::new();
    for raw in output.lines() {
        let line = console_line(raw);
        if let Some(summary) = parse_summary(line) {
            parsed.summary = Some(summary);
            since_last.clear();
            continue;
        }
        let Some((result, name)) = parse_case(line) else {
            since_last.push(line);
            continue;
        };
        let output = if result.is_failure() {
            let skip = since_last.len().saturating_sub(MAX_DETAIL_LINES);
            since_last[skip..].iter().map(|s| s.to_string()).collect()
        } else {
            Vec::new()
        };
        since_last.clear();
        parsed.cases.push(Case { name: name.to_string(), result, output });
    }
    parsed
}

fn parse_case(line: &str) -> Option<(CaseResult, &str)> {
    CaseResult::PREFIXES.iter().find_map(|(prefix, r)| line.strip_prefix(prefix).map(|name| (*r, name.trim())))
}

/// `SUMMARY: 12 tests, 1 unexpected failures, 2 expected failures, 3 skipped`; the parts after the
/// test count are optional and may come in any order; unknown parts are ignored.
pub fn parse_summary(line: &str) -> Option<Summary> {
    let rest = line.strip_prefix("SUMMARY:")?;
    let mut parts = rest.split(',').map(str::trim);
    let count = |part: &str, unit: &[&str]| -> Option<u64> {
        let (n, word) = part.split_once(char::is_whitespace)?;
        unit.contains(&word.trim()).then_some(())?;
        n.parse().ok()
    };
    let mut s = Summary { tests: count(parts.next()?, &["tests", "test"])?, ..Summary::default() };
    for part in parts {
        if let Some(n) = count(part, &["unexpected failures", "unexpected failure"]) {
            s.unexpected_failures = n;
        } else if let Some(n) = count(part, &["known failures", "known failure"]) {
            s.known_failures = n;
        } else if let Some(n) = count(part, &["expected failures", "expected failure"]) {
            s.expected_failures = n;
        } else if let Some(n) = count(part, &["skipped"]) {
            s.skipped = n;
        }
    }
    Some(s)
}

/// How the `emon run` child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Exit status (emon's: the guest's code, 2 error, 3 triple fault, 4 timeout, 130 Ctrl-C).
    Code(i32),
    /// Killed by a signal.
    Signal(i32),
    /// Still running well past its `--timeout`: the runner killed it.
    Killed,
}

/// The exit status of a kvm-unit-tests kernel whose tests were all skipped: `report_summary()`
/// returns 77 >> 1, which QEMU's debug-exit device turns into 77; emon passes the guest's code
/// through, so it is 38 under emon (77 from kernels that write 77 themselves).
pub const SKIP_STATUSES: [i32; 2] = [77, 77 >> 1];

/// The outcome of one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Pass,
    /// Nothing failed, nothing passed, something was skipped: the guest does not apply here.
    Skip,
    Fail,
}

/// A run's [`Status`], why it failed, and whether the reason is something other than the guest's
/// own FAIL lines (a crash, a timeout, no SUMMARY, an exit status its lines do not explain): the
/// reports then show the run itself as a failed test case.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub status: Status,
    pub reason: Option<String>,
    pub run_error: bool,
}

/// Judges one run from its exit and what the guest printed.
pub fn judge(exit: Exit, parsed: &Parsed, timeout_s: f64) -> Verdict {
    let failed = parsed.failed();
    let summary_failures = parsed.summary.map_or(0, |s| s.unexpected_failures);
    let guest_failed = failed > 0 || summary_failures > 0;
    // Reasons other than the guest's own FAIL lines.
    let mut errors: Vec<String> = Vec::new();
    match exit {
        Exit::Code(0) => {}
        Exit::Code(4) => errors.push(format!("timed out after {timeout_s} s (emon exit status 4)")),
        Exit::Code(3) => errors.push("crashed: triple fault or shutdown (emon exit status 3)".into()),
        Exit::Code(5) => errors.push("the guest kernel panicked (emon exit status 5)".into()),
        Exit::Code(2) => errors.push("emon could not run it (exit status 2)".into()),
        Exit::Code(130) => errors.push("interrupted (exit status 130)".into()),
        Exit::Code(n)
            if SKIP_STATUSES.contains(&n)
                && !guest_failed
                && parsed.summary.is_some_and(|s| s.skipped > 0 && s.skipped >= s.tests) => {}
        // The guest's failures explain a non-zero exit status.
        Exit::Code(_) if guest_failed => {}
        Exit::Code(n) if parsed.summary.is_none() => {
            errors.push(format!("guest exited with status {n}, no SUMMARY line"))
        }
        Exit::Code(n) => errors.push(format!("guest exited with status {n} but reported no failure")),
        Exit::Signal(s) => errors.push(format!("emon was killed by signal {s}")),
        Exit::Killed => {
            errors.push(format!("emon did not stop within its {timeout_s} s timeout; killed by the runner"))
        }
    }
    // A crash or timeout explains a missing SUMMARY.
    if parsed.summary.is_none() && errors.is_empty() {
        errors.push("no SUMMARY line".into());
    }
    if summary_failures > 0 && failed == 0 {
        errors.push(format!("SUMMARY reports {summary_failures} unexpected failures but no FAIL line"));
    }
    let run_error = !errors.is_empty();
    let mut reasons = Vec::new();
    if failed > 0 {
        let mut what = if failed == 1 { "1 failed test".to_string() } else { format!("{failed} failed tests") };
        match exit {
            Exit::Code(c) if c != 0 && !run_error => what += &format!(" (exit status {c})"),
            _ => {}
        }
        reasons.push(what);
    }
    reasons.extend(errors);
    if !reasons.is_empty() {
        return Verdict { status: Status::Fail, reason: Some(reasons.join("; ")), run_error };
    }
    let status = if parsed.passed() == 0 && parsed.skipped() > 0 { Status::Skip } else { Status::Pass };
    Verdict { status, reason: None, run_error: false }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn case(name: &str, result: CaseResult) -> Case {
        Case { name: name.into(), result, output: Vec::new() }
    }

    #[test]
    fn emon_guest_output() {
        let out = "msr-semantics: profile v3\nPASS: IA32_PMC0 exists\n  got 0x5, want 0x9\nFAIL: PMC0 counts\n\
                   SKIP: PMC4 (not declared)\nSUMMARY: 2 tests, 1 unexpected failures, 1 skipped\n";
        let p = parse(out);
        assert_eq!(
            p.cases,
            vec![
                case("IA32_PMC0 exists", CaseResult::Pass),
                Case { name: "PMC0 counts".into(), result: CaseResult::Fail, output: vec!["got 0x5, want 0x9".into()] },
                case("PMC4 (not declared)", CaseResult::Skip),
            ]
        );
        assert_eq!(p.summary, Some(Summary { tests: 2, unexpected_failures: 1, skipped: 1, ..Summary::default() }));
        assert_eq!((p.passed(), p.failed(), p.skipped()), (1, 1, 1));
    }

    #[test]
    fn third_party_output_with_extra_lines() {
        // kvm-unit-tests style: a banner, INFO lines, CRLF, prefixes in names, XFAIL/XPASS, and a
        // SUMMARY that leaves out zero counts.
        let out = "enabling apic\r\nSeaBIOS (version 1.16)\r\nINFO: pmu: PMU version: 2\r\n\
                   PASS: pmu: core cycles-0\r\n   PASS: pmu: indented\r\nXFAIL: pmu: llc misses\r\n\
                   XPASS: pmu: branch misses\r\nnot a PASS: line\r\nPASSED: not a case either\r\n\
                   KFAIL: pmu: known bug\r\nABORT: pmu: gave up\r\n\
                   SUMMARY: 6 tests, 2 unexpected failures, 1 known failures, 1 expected failures\r\n";
        let p = parse(out);
        let names: Vec<(&str, CaseResult)> = p.cases.iter().map(|c| (c.name.as_str(), c.result)).collect();
        assert_eq!(
            names,
            vec![
                ("pmu: core cycles-0", CaseResult::Pass),
                ("pmu: indented", CaseResult::Pass),
                ("pmu: llc misses", CaseResult::Xfail),
                ("pmu: branch misses", CaseResult::Xpass),
                ("pmu: known bug", CaseResult::Kfail),
                ("pmu: gave up", CaseResult::Abort),
            ]
        );
        assert!(p.cases[3].output.is_empty(), "no lines between XFAIL and XPASS");
        assert_eq!(
            p.summary,
            Some(Summary { tests: 6, unexpected_failures: 2, known_failures: 1, expected_failures: 1, skipped: 0 })
        );
        assert_eq!((p.passed(), p.failed(), p.skipped()), (4, 2, 0));
    }

    #[test]
    fn summary_variants() {
        let s = |l| parse_summary(l);
        assert_eq!(s("SUMMARY: 5 tests"), Some(Summary { tests: 5, ..Summary::default() }));
        assert_eq!(s("SUMMARY: 1 test, 3 skipped"), Some(Summary { tests: 1, skipped: 3, ..Summary::default() }));
        assert_eq!(
            s("SUMMARY: 9 tests, 2 skipped, 1 unexpected failures, 7 widgets"),
            Some(Summary { tests: 9, unexpected_failures: 1, skipped: 2, ..Summary::default() })
        );
        assert_eq!(s("SUMMARY: lots of tests"), None);
        assert_eq!(s("SUMMARY:"), None);
        assert_eq!(s("summary: 5 tests"), None);
        // The last SUMMARY wins.
        assert_eq!(parse("SUMMARY: 1 tests\nSUMMARY: 2 tests\n").summary.map(|s| s.tests), Some(2));
    }

    #[test]
    fn failure_detail_is_bounded() {
        let mut out: String = (0..50).map(|i| format!("line {i}\n")).collect();
        out += "FAIL: x\n";
        let p = parse(&out);
        assert_eq!(p.cases[0].output.len(), MAX_DETAIL_LINES);
        assert_eq!(p.cases[0].output.last().map(String::as_str), Some("line 49"));
    }

    fn parsed(out: &str) -> Parsed {
        parse(out)
    }

    #[test]
    fn kernel_log_timestamps_are_not_part_of_a_line() {
        let p = parsed("[    0.000000] Linux version 6.1\n[   13.356713] PASS: instructions (200085)\n[   13.4] SUMMARY: 1 tests, 0 unexpected failures\n");
        assert_eq!(p.cases.len(), 1);
        assert_eq!(p.cases[0].name, "instructions (200085)");
        assert_eq!(p.summary.map(|s| s.tests), Some(1));
        assert_eq!(console_line("[not a stamp] PASS: x"), "[not a stamp] PASS: x");
        assert_eq!(console_line("[] x"), "[] x");
    }

    #[test]
    fn console_rules_become_cases() {
        let out = "[    1.3] Performance Events: Skylake events, Intel PMU driver.\r\n[    1.4] ... version:                4  \nPASS: a\n";
        let mut p = parsed(out);
        let rules = Console {
            expect: vec!["... version:                4".into(), "... version:                5".into()],
            forbid: vec!["Broken PMU hardware".into(), "Intel PMU".into()],
        };
        rules.check(out, &mut p);
        let got: Vec<(&str, CaseResult)> = p.cases.iter().map(|c| (c.name.as_str(), c.result)).collect();
        assert_eq!(
            got,
            [
                ("a", CaseResult::Pass),
                ("console shows \"... version:                4\"", CaseResult::Pass),
                ("console shows \"... version:                5\"", CaseResult::Fail),
                ("console never shows \"Broken PMU hardware\"", CaseResult::Pass),
                ("console never shows \"Intel PMU\"", CaseResult::Fail),
            ]
        );
        assert_eq!(p.cases[4].output, ["Performance Events: Skylake events, Intel PMU driver."]);
        assert_eq!(judge(Exit::Code(0), &p, 1.0).status, Status::Fail);
    }

    #[test]
    fn verdicts() {
        let ok = parsed("PASS: a\nSUMMARY: 1 tests, 0 unexpected failures, 0 skipped\n");
        assert_eq!(judge(Exit::Code(0), &ok, 120.0), Verdict { status: Status::Pass, reason: None, run_error: false });

        let skipped = parsed("SKIP: no PMU\nSUMMARY: 0 tests, 0 unexpected failures, 1 skipped\n");
        assert_eq!(judge(Exit::Code(0), &skipped, 120.0).status, Status::Skip);
        assert_eq!(judge(Exit::Code(77), &skipped, 120.0).status, Status::Skip);
        let kut_skipped = parsed("SKIP: pmu: no PMU\nSUMMARY: 1 tests, 1 skipped\n");
        assert_eq!(judge(Exit::Code(38), &kut_skipped, 120.0).status, Status::Skip);
        // 38 after a run that passed something is not a skip.
        assert_eq!(judge(Exit::Code(38), &ok, 120.0).status, Status::Fail);

        // An empty SUMMARY passes: the guest checked nothing and said so.
        assert_eq!(judge(Exit::Code(0), &parsed("SUMMARY: 0 tests\n"), 1.0).status, Status::Pass);

        let failing = parsed("PASS: a\nFAIL: b\nSUMMARY: 2 tests, 1 unexpected failures, 0 skipped\n");
        let v = judge(Exit::Code(1), &failing, 120.0);
        assert_eq!(
            v,
            Verdict { status: Status::Fail, reason: Some("1 failed test (exit status 1)".into()), run_error: false }
        );
        // A FAIL line fails the run even when the exit status is 0.
        assert_eq!(judge(Exit::Code(0), &failing, 120.0).status, Status::Fail);

        let panicked = judge(Exit::Code(5), &parsed("PASS: a\n"), 2.0);
        assert_eq!(panicked.reason.as_deref(), Some("the guest kernel panicked (emon exit status 5)"));
        let v = judge(Exit::Code(4), &parsed("PASS: a\n"), 2.0);
        assert_eq!(v.status, Status::Fail);
        assert!(v.run_error);
        assert_eq!(v.reason.as_deref(), Some("timed out after 2 s (emon exit status 4)"));

        let v = judge(Exit::Code(3), &ok, 1.0);
        assert!(v.run_error && v.reason.unwrap().starts_with("crashed"));

        let v = judge(Exit::Code(0), &parsed("PASS: a\n"), 1.0);
        assert_eq!((v.status, v.reason.as_deref(), v.run_error), (Status::Fail, Some("no SUMMARY line"), true));

        let v = judge(Exit::Code(7), &ok, 1.0);
        assert_eq!(v.reason.as_deref(), Some("guest exited with status 7 but reported no failure"));
        assert!(v.run_error);

        let v = judge(Exit::Code(1), &parsed("SUMMARY: 3 tests, 2 unexpected failures\n"), 1.0);
        assert_eq!(v.reason.as_deref(), Some("SUMMARY reports 2 unexpected failures but no FAIL line"));
        assert!(v.run_error);

        let v = judge(Exit::Code(3), &failing, 1.0);
        assert_eq!(v.reason.as_deref(), Some("1 failed test; crashed: triple fault or shutdown (emon exit status 3)"));
        assert!(v.run_error);

        assert!(judge(Exit::Signal(9), &ok, 1.0).run_error);
        assert!(judge(Exit::Killed, &ok, 1.0).reason.unwrap().contains("killed by the runner"));
        // 77 without a SUMMARY is not a skip.
        let v = judge(Exit::Code(77), &parsed(""), 1.0);
        assert_eq!(v.reason.as_deref(), Some("guest exited with status 77, no SUMMARY line"));
        assert_eq!(v.status, Status::Fail);
        let v = judge(Exit::Code(6), &parsed("PASS: a\n"), 1.0);
        assert_eq!(v.reason.as_deref(), Some("guest exited with status 6, no SUMMARY line"));
    }
}
