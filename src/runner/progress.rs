//! The progress of `emon test` on stdout: a live line redrawn in place on a terminal, one line per
//! finished run otherwise.
use super::parse::Status;
use super::report;
use super::RunResult;
use std::io::Write;

/// The live progress line on a terminal (redrawn with \r), or one line per result otherwise.
pub(super) struct Progress<'a> {
    tty: bool,
    out: &'a mut dyn Write,
    total: usize,
    done: usize,
    running: usize,
    passed: usize,
    failed: usize,
    skipped: usize,
}

impl<'a> Progress<'a> {
    pub(super) fn new(tty: bool, out: &'a mut dyn Write) -> Self {
        Progress { tty, out, total: 0, done: 0, running: 0, passed: 0, failed: 0, skipped: 0 }
    }

    pub(super) fn begin(&mut self, total: usize) {
        self.total = total;
        self.redraw();
    }

    pub(super) fn started(&mut self) {
        self.running += 1;
        self.redraw();
    }

    pub(super) fn finished(&mut self, r: &RunResult) {
        self.running -= 1;
        self.done += 1;
        match r.verdict.status {
            Status::Pass => self.passed += 1,
            Status::Skip => self.skipped += 1,
            Status::Fail => self.failed += 1,
        }
        let line = report::result_line(r);
        if self.tty {
            if r.failed() {
                let _ = writeln!(self.out, "\r\x1b[2K{line}");
            }
            self.redraw();
        } else {
            let _ = writeln!(self.out, "[{}/{}] {line}", self.done, self.total);
        }
    }

    fn redraw(&mut self) {
        if !self.tty {
            return;
        }
        let skipped = if self.skipped > 0 { format!(", skipped {}", self.skipped) } else { String::new() };
        let _ = write!(
            self.out,
            "\r\x1b[2K[{}/{}] running {}, passed {}, failed {}{skipped}",
            self.done, self.total, self.running, self.passed, self.failed
        );
        let _ = self.out.flush();
    }

    pub(super) fn end(&mut self) {
        if self.tty {
            let _ = write!(self.out, "\r\x1b[2K");
            let _ = self.out.flush();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runner::parse::{self, Exit};
    use crate::runner::{RunSpec, DEFAULT_TIMEOUT_S};
    use std::time::Duration;

    fn finished(kernel: &str, out: &str, code: i32) -> RunResult {
        let spec = RunSpec { kernel: kernel.into(), profile: "nehalem".into(), timeout: 1.0, ..cli_spec() };
        let parsed = parse::parse(out);
        let verdict = parse::judge(Exit::Code(code), &parsed, 1.0);
        RunResult {
            spec,
            exit: Exit::Code(code),
            duration: Duration::from_millis(250),
            stdout: out.into(),
            stderr: String::new(),
            parsed,
            verdict,
        }
    }

    fn cli_spec() -> RunSpec {
        RunSpec {
            index: 0,
            kernel: String::new(),
            profile: String::new(),
            pmu: vec![],
            backend: None,
            debug_store: None,
            guest_time: None,
            args: vec![],
            timeout: DEFAULT_TIMEOUT_S,
            memory: None,
            initrd: None,
            console: Default::default(),
            round: None,
        }
    }

    fn progress(tty: bool) -> String {
        let mut buf: Vec<u8> = Vec::new();
        let mut p = Progress::new(tty, &mut buf);
        p.begin(2);
        p.started();
        p.started();
        p.finished(&finished("guest:a", "PASS: x\nSUMMARY: 1 tests\n", 0));
        p.finished(&finished("guest:b", "FAIL: y\nSUMMARY: 1 tests, 1 unexpected failures\n", 1));
        p.end();
        String::from_utf8(buf).unwrap()
    }

    #[test]
    fn progress_on_a_terminal_and_off() {
        let clear = "\r\x1b[2K";
        assert_eq!(
            progress(true),
            format!(
                "{clear}[0/2] running 0, passed 0, failed 0{clear}[0/2] running 1, passed 0, failed 0\
                 {clear}[0/2] running 2, passed 0, failed 0{clear}[1/2] running 1, passed 1, failed 0\
                 {clear}FAIL guest:b on nehalem (0 passed, 1 failed, 0 skipped, 0.25 s): 1 failed test (exit status 1)\n\
                 {clear}[2/2] running 0, passed 1, failed 1{clear}"
            )
        );
        assert_eq!(
            progress(false),
            "[1/2] pass guest:a on nehalem (1 passed, 0 failed, 0 skipped, 0.25 s)\n\
             [2/2] FAIL guest:b on nehalem (0 passed, 1 failed, 0 skipped, 0.25 s): 1 failed test (exit status 1)\n"
        );
    }
}
