//! The worker pool of `emon test`: each run an `emon run` child process, at most `jobs` at a time,
//! its output captured (up to a cap) and judged.
use super::parse::{self, Exit};
use super::progress::Progress;
use super::{RunResult, RunSpec};
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long past its `--timeout` a child may take before the runner kills it.
const KILL_GRACE: Duration = Duration::from_secs(30);
/// Output kept per run; the rest is counted and dropped.
const STDOUT_CAP: usize = 32 << 20;
const STDERR_CAP: usize = 4 << 20;

/// Runs `runs` on `jobs` worker threads; the results come back in the order of `runs`.
pub(super) fn execute(exe: &Path, runs: Vec<RunSpec>, jobs: usize, progress: &mut Progress) -> Vec<RunResult> {
    enum Event {
        Started,
        Done(usize, Box<RunResult>),
    }
    progress.begin(runs.len());
    let next = AtomicUsize::new(0);
    let (tx, rx) = mpsc::channel::<Event>();
    let mut results: Vec<Option<RunResult>> = vec![None; runs.len()];
    std::thread::scope(|s| {
        for _ in 0..jobs.min(runs.len()) {
            let (tx, next, runs) = (tx.clone(), &next, &runs);
            s.spawn(move || loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                let Some(spec) = runs.get(i) else { break };
                if tx.send(Event::Started).is_err() {
                    break;
                }
                let r = run_one(exe, spec);
                if tx.send(Event::Done(i, Box::new(r))).is_err() {
                    break;
                }
            });
        }
        drop(tx);
        for event in rx {
            match event {
                Event::Started => progress.started(),
                Event::Done(i, r) => {
                    progress.finished(&r);
                    results[i] = Some(*r);
                }
            }
        }
    });
    progress.end();
    results.into_iter().map(|r| r.expect("every run reports")).collect()
}

/// Runs one `emon run` child and judges it.
pub fn run_one(exe: &Path, spec: &RunSpec) -> RunResult {
    let start = Instant::now();
    let mut cmd = Command::new(exe);
    cmd.args(spec.command_args()).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let (exit, stdout, stderr) = match cmd.spawn() {
        Err(e) => (Exit::Code(2), String::new(), format!("emon test: cannot start {}: {e}", exe.display())),
        Ok(mut child) => {
            let out = child.stdout.take().map(|p| std::thread::spawn(move || read_capped(p, STDOUT_CAP)));
            let err = child.stderr.take().map(|p| std::thread::spawn(move || read_capped(p, STDERR_CAP)));
            let deadline = Duration::from_secs_f64(spec.timeout) + KILL_GRACE;
            let exit = loop {
                match child.try_wait() {
                    Ok(Some(status)) => break exit_of(status),
                    Ok(None) if start.elapsed() > deadline => {
                        let _ = child.kill();
                        let _ = child.wait();
                        break Exit::Killed;
                    }
                    Ok(None) => std::thread::sleep(Duration::from_millis(5)),
                    Err(_) => break child.wait().map_or(Exit::Killed, exit_of),
                }
            };
            let collect =
                |h: Option<std::thread::JoinHandle<String>>| h.and_then(|h| h.join().ok()).unwrap_or_default();
            (exit, collect(out), collect(err))
        }
    };
    let duration = start.elapsed();
    let mut parsed = parse::parse(&stdout);
    spec.console.check(&stdout, &mut parsed);
    let verdict = parse::judge(exit, &parsed, spec.timeout);
    RunResult { spec: spec.clone(), exit, duration, stdout, stderr, parsed, verdict }
}

fn exit_of(status: std::process::ExitStatus) -> Exit {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => Exit::Code(c),
        (None, Some(s)) => Exit::Signal(s),
        (None, None) => Exit::Killed,
    }
}

/// Reads `r` to the end, keeping the first `cap` bytes, as (lossy) UTF-8.
fn read_capped(mut r: impl Read, cap: usize) -> String {
    let mut kept = Vec::new();
    let mut dropped = 0usize;
    let mut buf = [0u8; 64 * 1024];
    loop {
        match r.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                let room = cap.saturating_sub(kept.len()).min(n);
                kept.extend_from_slice(&buf[..room]);
                dropped += n - room;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
    let mut s = String::from_utf8_lossy(&kept).into_owned();
    if dropped > 0 {
        s += &format!("\n[emon test: {dropped} further bytes of output were not kept]\n");
    }
    s
}
