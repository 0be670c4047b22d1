//! `emon test`'s results: the summary table, JUnit XML (written by hand, escaped) and JSON.
use super::parse::{Case, CaseResult, Exit, Status, Summary};
use super::{RunResult, Shard};
use serde::Serialize;
use std::fmt::Write as _;
use std::time::Duration;

/// Lines of emon's stderr quoted with a failure.
pub const STDERR_TAIL: usize = 5;
/// Lines of guest output quoted with a failure that has no FAIL line.
pub const OUTPUT_TAIL: usize = 10;
/// Output kept in a report for one failed run (the end of it).
const OUTPUT_CAP: usize = 1 << 20;

/// What the reports say about the whole invocation.
pub struct Meta<'a> {
    pub suite: Option<&'a str>,
    pub shard: Option<Shard>,
    pub jobs: usize,
    pub wall: Duration,
}

/// "1 run", "5 runs".
pub fn runs(n: usize) -> String {
    if n == 1 {
        "1 run".to_string()
    } else {
        format!("{n} runs")
    }
}

fn status_word(s: Status) -> &'static str {
    match s {
        Status::Pass => "pass",
        Status::Skip => "skip",
        Status::Fail => "FAIL",
    }
}

/// One line for a finished run: `pass  NAME  (9 passed, 0 failed, 0 skipped, 0.10 s)`, with the
/// reason for a failure.
pub fn result_line(r: &RunResult) -> String {
    let p = &r.parsed;
    let counts = format!(
        "{} passed, {} failed, {} skipped, {:.2} s",
        p.passed(),
        p.failed(),
        p.skipped(),
        r.duration.as_secs_f64()
    );
    match &r.verdict.reason {
        Some(why) => format!("{} {} ({counts}): {why}", status_word(r.verdict.status), r.spec.name()),
        None => format!("{} {} ({counts})", status_word(r.verdict.status), r.spec.name()),
    }
}

/// The summary table, a totals line, and then each failure with its reason, failed cases and the
/// end of emon's stderr.
pub fn table(results: &[RunResult], wall: Duration) -> String {
    let header = ["kernel", "profile", "passed", "failed", "skipped", "time", "status"];
    let rows: Vec<[String; 7]> = results
        .iter()
        .map(|r| {
            let p = &r.parsed;
            [
                r.spec.kernel_label(),
                r.spec.profile_label(),
                p.passed().to_string(),
                p.failed().to_string(),
                p.skipped().to_string(),
                format!("{:.2} s", r.duration.as_secs_f64()),
                match &r.verdict.reason {
                    Some(why) => format!("{}: {why}", status_word(r.verdict.status)),
                    None => status_word(r.verdict.status).to_string(),
                },
            ]
        })
        .collect();
    let mut width = header.map(str::len);
    for row in &rows {
        for (w, cell) in width.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let line = |out: &mut String, cells: [&str; 7]| {
        let mut s = String::new();
        for (i, (cell, w)) in cells.iter().zip(width).enumerate() {
            match i {
                0 | 1 => s += &format!("{cell:<w$}  "),
                6 => s += cell,
                _ => s += &format!("{cell:>w$}  "),
            }
        }
        out.push_str(s.trim_end());
        out.push('\n');
    };
    line(&mut out, header);
    for row in &rows {
        line(&mut out, row.each_ref().map(String::as_str));
    }
    let count = |s: Status| results.iter().filter(|r| r.verdict.status == s).count();
    let cases = |f: fn(&RunResult) -> usize| results.iter().map(f).sum::<usize>();
    let _ = writeln!(
        out,
        "{}: {} passed, {} skipped, {} failed; test cases: {} passed, {} failed, {} skipped; {:.1} s",
        runs(results.len()),
        count(Status::Pass),
        count(Status::Skip),
        count(Status::Fail),
        cases(|r| r.parsed.passed()),
        cases(|r| r.parsed.failed()),
        cases(|r| r.parsed.skipped()),
        wall.as_secs_f64()
    );
    let failed: Vec<&RunResult> = results.iter().filter(|r| r.failed()).collect();
    if !failed.is_empty() {
        let _ = writeln!(out, "\nfailures:");
        for r in failed {
            let _ = writeln!(out, "  {}: {}", r.spec.name(), r.verdict.reason.as_deref().unwrap_or("failed"));
            let mut failures = r.parsed.cases.iter().filter(|c| c.result.is_failure()).peekable();
            if failures.peek().is_none() {
                // No FAIL line to explain it (a crash, a hang, no SUMMARY): the end of the output.
                let lines: Vec<&str> = r.stdout.lines().collect();
                for l in &lines[lines.len().saturating_sub(OUTPUT_TAIL)..] {
                    let _ = writeln!(out, "    > {}", printable(l));
                }
            }
            for c in failures {
                for l in &c.output {
                    let _ = writeln!(out, "    > {}", printable(l));
                }
                let _ = writeln!(out, "    {}: {}", c.result.word(), c.name);
            }
            for l in r.stderr_tail(STDERR_TAIL) {
                let _ = writeln!(out, "    | {l}");
            }
        }
    }
    out
}

/// A line of guest output for a terminal: control characters (escape sequences) become U+FFFD.
fn printable(line: &str) -> String {
    line.chars().map(|c| if c.is_control() && c != '\t' { '\u{FFFD}' } else { c }).collect()
}

/// `s` for XML character data: `&`, `<`, `>` escaped; characters XML 1.0 cannot carry at all
/// (C0 controls other than tab, newline and carriage return; U+FFFE, U+FFFF) become U+FFFD.
pub fn xml_text(s: &str) -> String {
    escape(s, false)
}

/// `s` for an XML attribute value in double quotes: as [`xml_text`], plus quotes, and tab, newline
/// and carriage return as character references so that attribute normalisation keeps them.
pub fn xml_attr(s: &str) -> String {
    escape(s, true)
}

fn escape(s: &str, attr: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out += "&amp;",
            '<' => out += "&lt;",
            '>' => out += "&gt;",
            '"' if attr => out += "&quot;",
            '\'' if attr => out += "&apos;",
            '\t' if attr => out += "&#9;",
            '\n' if attr => out += "&#10;",
            '\r' if attr => out += "&#13;",
            '\t' | '\n' | '\r' => out.push(c),
            '\u{0}'..='\u{1F}' | '\u{FFFE}' | '\u{FFFF}' => out.push('\u{FFFD}'),
            _ => out.push(c),
        }
    }
    out
}

/// The last `cap` bytes of `s` (at a character boundary), saying how much was cut.
fn tail(s: &str, cap: usize) -> String {
    if s.len() <= cap {
        return s.to_string();
    }
    let mut start = s.len() - cap;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    format!("[emon test: the first {start} bytes are cut]\n{}", &s[start..])
}

fn secs(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64())
}

/// JUnit XML: one `<testsuite>` per run (kernel + profile), one `<testcase>` per PASS/FAIL/SKIP
/// line; a run that failed for another reason (crash, timeout, no SUMMARY, ...) gets a test case
/// `emon run` whose `<failure>` carries the reason, with the captured output.
pub fn junit(results: &[RunResult], meta: &Meta) -> String {
    let cases_of = |r: &RunResult| r.parsed.cases.len() + usize::from(r.verdict.run_error);
    let failures_of = |r: &RunResult| r.parsed.failed() + usize::from(r.verdict.run_error);
    let total = |f: &dyn Fn(&RunResult) -> usize| results.iter().map(f).sum::<usize>();
    let mut x = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let name = match (meta.suite, meta.shard) {
        (Some(s), Some(sh)) => format!("emon test {s} (shard {sh})"),
        (Some(s), None) => format!("emon test {s}"),
        (None, Some(sh)) => format!("emon test (shard {sh})"),
        (None, None) => "emon test".to_string(),
    };
    let _ = writeln!(
        x,
        "<testsuites name=\"{}\" tests=\"{}\" failures=\"{}\" errors=\"0\" skipped=\"{}\" time=\"{}\">",
        xml_attr(&name),
        total(&cases_of),
        total(&failures_of),
        total(&|r| r.parsed.skipped()),
        secs(meta.wall)
    );
    for r in results {
        let suite = r.spec.name();
        let _ = writeln!(
            x,
            "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{}\" errors=\"0\" skipped=\"{}\" time=\"{}\">",
            xml_attr(&suite),
            cases_of(r),
            failures_of(r),
            r.parsed.skipped(),
            secs(r.duration)
        );
        x += "    <properties>\n";
        let mut props: Vec<(&str, String)> =
            vec![("kernel", r.spec.kernel.clone()), ("profile", r.spec.profile.clone())];
        props.extend(r.spec.pmu.iter().map(|p| ("pmu", p.clone())));
        props.extend(r.spec.backend_name().map(|b| ("backend", b)));
        if !r.spec.args.is_empty() {
            props.push(("args", r.spec.args.join(" ")));
        }
        props.push(("status", status_word(r.verdict.status).to_lowercase()));
        props.push(("exit", exit_text(r.exit)));
        for (k, v) in props {
            let _ = writeln!(x, "      <property name=\"{k}\" value=\"{}\"/>", xml_attr(&v));
        }
        x += "    </properties>\n";
        let classname = xml_attr(&suite);
        for c in &r.parsed.cases {
            let open = format!("    <testcase name=\"{}\" classname=\"{classname}\"", xml_attr(&c.name));
            match c.result {
                CaseResult::Pass => {
                    let _ = writeln!(x, "{open}/>");
                }
                CaseResult::Xfail => {
                    let _ = writeln!(x, "{open}><system-out>XFAIL: an expected failure</system-out></testcase>");
                }
                CaseResult::Kfail => {
                    let _ = writeln!(x, "{open}><system-out>KFAIL: a known failure</system-out></testcase>");
                }
                CaseResult::Skip => {
                    let _ = writeln!(
                        x,
                        "{open}><skipped message=\"{}\"/></testcase>",
                        xml_attr(&format!("SKIP: {}", c.name))
                    );
                }
                CaseResult::Fail | CaseResult::Xpass | CaseResult::Abort => {
                    let word = c.result.word();
                    let body: String = c.output.iter().map(|l| format!("{l}\n")).collect();
                    let _ = writeln!(
                        x,
                        "{open}><failure message=\"{}\" type=\"{word}\">{}</failure></testcase>",
                        xml_attr(&format!("{word}: {}", c.name)),
                        xml_text(&body)
                    );
                }
            }
        }
        if r.verdict.run_error {
            let reason = r.verdict.reason.as_deref().unwrap_or("failed");
            let body: String = r.stderr_tail(STDERR_TAIL).iter().map(|l| format!("{l}\n")).collect();
            let _ = writeln!(
                x,
                "    <testcase name=\"emon run\" classname=\"{classname}\" time=\"{}\">\n      \
                 <failure message=\"{}\" type=\"run\">{}</failure>\n      \
                 <system-out>{}</system-out>\n      <system-err>{}</system-err>\n    </testcase>",
                secs(r.duration),
                xml_attr(reason),
                xml_text(&format!("{reason}\n{body}")),
                xml_text(&tail(&r.stdout, OUTPUT_CAP)),
                xml_text(&tail(&r.stderr, OUTPUT_CAP)),
            );
        }
        x += "  </testsuite>\n";
    }
    x += "</testsuites>\n";
    x
}

fn exit_text(e: Exit) -> String {
    match e {
        Exit::Code(c) => c.to_string(),
        Exit::Signal(s) => format!("signal {s}"),
        Exit::Killed => "killed".to_string(),
    }
}

#[derive(Serialize)]
struct JsonReport<'a> {
    emon_version: &'static str,
    suite: Option<&'a str>,
    shard: Option<String>,
    jobs: usize,
    wall_time_s: f64,
    totals: Totals,
    runs: Vec<JsonRun<'a>>,
}

#[derive(Serialize)]
struct Totals {
    runs: usize,
    passed: usize,
    skipped: usize,
    failed: usize,
    cases_passed: usize,
    cases_failed: usize,
    cases_skipped: usize,
}

#[derive(Serialize)]
struct JsonRun<'a> {
    /// Position in the expanded matrix (before sharding).
    index: usize,
    name: String,
    kernel: &'a str,
    profile: &'a str,
    pmu: &'a [String],
    backend: Option<String>,
    args: &'a [String],
    timeout_s: f64,
    command: Vec<String>,
    status: Status,
    reason: Option<&'a str>,
    exit_code: Option<i32>,
    signal: Option<i32>,
    killed: bool,
    time_s: f64,
    passed: usize,
    failed: usize,
    skipped: usize,
    summary: Option<Summary>,
    cases: &'a [Case],
    /// emon's own one-line summary of the run (the last line of its stderr).
    emon_summary: Option<&'a str>,
    /// The guest's output and emon's stderr, for failed runs only.
    #[serde(skip_serializing_if = "Option::is_none")]
    stdout: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stderr: Option<String>,
}

/// Every run with its cases, as pretty-printed JSON.
pub fn json(results: &[RunResult], meta: &Meta) -> String {
    let count = |s: Status| results.iter().filter(|r| r.verdict.status == s).count();
    let sum = |f: fn(&RunResult) -> usize| results.iter().map(f).sum::<usize>();
    let report = JsonReport {
        emon_version: env!("CARGO_PKG_VERSION"),
        suite: meta.suite,
        shard: meta.shard.map(|s| s.to_string()),
        jobs: meta.jobs,
        wall_time_s: meta.wall.as_secs_f64(),
        totals: Totals {
            runs: results.len(),
            passed: count(Status::Pass),
            skipped: count(Status::Skip),
            failed: count(Status::Fail),
            cases_passed: sum(|r| r.parsed.passed()),
            cases_failed: sum(|r| r.parsed.failed()),
            cases_skipped: sum(|r| r.parsed.skipped()),
        },
        runs: results
            .iter()
            .map(|r| JsonRun {
                index: r.spec.index,
                name: r.spec.name(),
                kernel: &r.spec.kernel,
                profile: &r.spec.profile,
                pmu: &r.spec.pmu,
                backend: r.spec.backend_name(),
                args: &r.spec.args,
                timeout_s: r.spec.timeout,
                command: r.spec.command_args(),
                status: r.verdict.status,
                reason: r.verdict.reason.as_deref(),
                exit_code: if let Exit::Code(c) = r.exit { Some(c) } else { None },
                signal: if let Exit::Signal(s) = r.exit { Some(s) } else { None },
                killed: r.exit == Exit::Killed,
                time_s: r.duration.as_secs_f64(),
                passed: r.parsed.passed(),
                failed: r.parsed.failed(),
                skipped: r.parsed.skipped(),
                summary: r.parsed.summary,
                cases: &r.parsed.cases,
                emon_summary: r.stderr_tail(1).first().copied(),
                stdout: r.failed().then(|| tail(&r.stdout, OUTPUT_CAP)),
                stderr: r.failed().then(|| tail(&r.stderr, OUTPUT_CAP)),
            })
            .collect(),
    };
    let mut s = serde_json::to_string_pretty(&report).expect("the report serializes");
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    use super::super::parse::{self, Verdict};
    use super::super::RunSpec;
    use super::*;

    #[test]
    fn escaping() {
        assert_eq!(xml_text("a<b>&c \"q\" 'a'"), "a&lt;b&gt;&amp;c \"q\" 'a'");
        assert_eq!(xml_attr("a<b>&c \"q\" 'a'"), "a&lt;b&gt;&amp;c &quot;q&quot; &apos;a&apos;");
        assert_eq!(xml_text("l1\n\tl2\r\n"), "l1\n\tl2\r\n");
        assert_eq!(xml_attr("l1\n\tl2\r"), "l1&#10;&#9;l2&#13;");
        assert_eq!(
            xml_text("esc\u{1b}[0m nul\u{0} bell\u{7} \u{FFFF}"),
            "esc\u{FFFD}[0m nul\u{FFFD} bell\u{FFFD} \u{FFFD}"
        );
        assert_eq!(xml_text("ünïcode ✓ ]]>"), "ünïcode ✓ ]]&gt;");
    }

    #[test]
    fn tail_cuts_at_a_character_boundary() {
        assert_eq!(tail("short", 10), "short");
        let t = tail("ééé", 3);
        assert!(t.ends_with("\né") && t.starts_with("[emon test: the first 4 bytes are cut]"), "{t}");
    }

    fn result(kernel: &str, out: &str, exit: Exit, stderr: &str) -> RunResult {
        let spec = RunSpec {
            index: 0,
            kernel: kernel.into(),
            profile: "nehalem".into(),
            pmu: vec![],
            backend: None,
            debug_store: None,
            guest_time: None,
            args: vec![],
            timeout: 5.0,
            memory: None,
            initrd: None,
            console: Default::default(),
            round: None,
        };
        let parsed = parse::parse(out);
        let verdict: Verdict = parse::judge(exit, &parsed, 5.0);
        RunResult {
            spec,
            exit,
            duration: Duration::from_millis(1500),
            stdout: out.into(),
            stderr: stderr.into(),
            parsed,
            verdict,
        }
    }

    fn sample() -> Vec<RunResult> {
        vec![
            result(
                "guest:ok",
                "PASS: a & b\nSKIP: <c>\nSUMMARY: 1 tests, 0 unexpected failures, 1 skipped\n",
                Exit::Code(0),
                "emon: ok\n",
            ),
            result(
                "k\"1\".elf",
                "PASS: a\n  got 1, want <2>\nFAIL: b\nSUMMARY: 2 tests, 1 unexpected failures, 0 skipped\n",
                Exit::Code(1),
                "emon: guest exited with code 1\n",
            ),
            result(
                "hang.elf",
                "booting\u{1b}[0m\n",
                Exit::Code(4),
                "noise\nemon: stopped by --timeout after 5 s (status 4)\n",
            ),
        ]
    }

    #[test]
    fn junit_structure() {
        let meta = Meta {
            suite: Some("s & t.toml"),
            shard: Some(Shard { index: 1, count: 2 }),
            jobs: 2,
            wall: Duration::from_secs(3),
        };
        let xml = junit(&sample(), &meta);
        let doc = roxmltree::Document::parse(&xml).expect("well-formed XML");
        let root = doc.root_element();
        assert_eq!(root.tag_name().name(), "testsuites");
        assert_eq!(root.attribute("name"), Some("emon test s & t.toml (shard 1/2)"));
        assert_eq!(
            (root.attribute("tests"), root.attribute("failures"), root.attribute("skipped")),
            (Some("5"), Some("2"), Some("1"))
        );
        let suites: Vec<_> = root.children().filter(|n| n.has_tag_name("testsuite")).collect();
        assert_eq!(suites.len(), 3);
        assert_eq!(suites[1].attribute("name"), Some("k\"1\".elf on nehalem"));
        let cases = |s: &roxmltree::Node| -> Vec<(String, Option<String>)> {
            s.children()
                .filter(|n| n.has_tag_name("testcase"))
                .map(|c| {
                    let kind = c
                        .children()
                        .find(|n| n.is_element() && !n.has_tag_name("system-out") && !n.has_tag_name("system-err"));
                    (c.attribute("name").unwrap().to_string(), kind.map(|k| k.tag_name().name().to_string()))
                })
                .collect()
        };
        assert_eq!(cases(&suites[0]), [("a & b".into(), None), ("<c>".into(), Some("skipped".into()))]);
        assert_eq!(cases(&suites[1]), [("a".into(), None), ("b".into(), Some("failure".into()))]);
        let failure = suites[1].descendants().find(|n| n.has_tag_name("failure")).unwrap();
        assert_eq!(failure.attribute("message"), Some("FAIL: b"));
        assert_eq!(failure.text(), Some("got 1, want <2>\n"));
        assert_eq!(cases(&suites[2]), [("emon run".into(), Some("failure".into()))]);
        let run = suites[2].descendants().find(|n| n.has_tag_name("failure")).unwrap();
        assert_eq!(run.attribute("message"), Some("timed out after 5 s (emon exit status 4)"));
        assert!(run.text().unwrap().contains("emon: stopped by --timeout"));
        let out = suites[2].descendants().find(|n| n.has_tag_name("system-out")).unwrap();
        assert_eq!(out.text(), Some("booting\u{FFFD}[0m\n"));
        let props: Vec<_> = suites[2].descendants().filter(|n| n.has_tag_name("property")).collect();
        assert!(props.iter().any(|p| p.attribute("name") == Some("exit") && p.attribute("value") == Some("4")));
    }

    #[test]
    fn json_structure() {
        let meta = Meta { suite: None, shard: None, jobs: 2, wall: Duration::from_secs(3) };
        let v: serde_json::Value = serde_json::from_str(&json(&sample(), &meta)).unwrap();
        assert_eq!(v["totals"]["runs"], 3);
        assert_eq!(v["totals"]["failed"], 2);
        assert_eq!(v["totals"]["cases_skipped"], 1);
        let runs = v["runs"].as_array().unwrap();
        assert_eq!(runs[0]["status"], "pass");
        assert_eq!(runs[0]["cases"][1]["result"], "skip");
        assert_eq!(runs[0]["emon_summary"], "emon: ok");
        assert!(runs[0].get("stdout").is_none(), "output only for failures");
        assert_eq!(runs[1]["cases"][1]["output"][0], "got 1, want <2>");
        assert_eq!(runs[1]["summary"]["unexpected_failures"], 1);
        assert_eq!(runs[2]["exit_code"], 4);
        assert_eq!(runs[2]["summary"], serde_json::Value::Null);
        assert_eq!(runs[2]["stdout"], "booting\u{1b}[0m\n");
    }

    #[test]
    fn table_lists_runs_and_failures() {
        let t = table(&sample(), Duration::from_secs(3));
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].starts_with("kernel") && lines[0].ends_with("status"), "{t}");
        assert!(lines[1].starts_with("guest:ok") && lines[1].ends_with("pass"), "{t}");
        assert!(lines[2].contains("FAIL: 1 failed test (exit status 1)"), "{t}");
        assert!(t.contains("3 runs: 1 passed, 0 skipped, 2 failed"), "{t}");
        assert!(t.contains("\nfailures:\n  k\"1\".elf on nehalem: 1 failed test"), "{t}");
        assert!(t.contains("    > got 1, want <2>\n    FAIL: b\n"), "the guest's explanation comes with its FAIL: {t}");
        assert!(t.contains("    > booting\u{FFFD}[0m\n"), "a run without a FAIL line shows its output's end: {t}");
        assert!(t.contains("    | emon: stopped by --timeout after 5 s (status 4)\n"), "{t}");
    }
}
