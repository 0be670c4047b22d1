//! `--trace FILE`: a Chrome trace-event JSON file (opens in the Perfetto UI and chrome://tracing)
//! of the run: a counter track per guest counter and for IA32_PERF_GLOBAL_CTRL/STATUS, an instant
//! for every overflow and PMI, and every PMU MSR access. Events stream to the file as they happen,
//! so a long run does not grow emon's memory.
use crate::backend::pmi::PmiDelivery;
use crate::backend::vpmu::{MsrAccess, Observer};
use crate::pmu::{CounterId, Pmu};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::time::Instant;

const PID: u32 = 1;
const TID_VCPU: u32 = 1;

pub struct Tracer {
    out: BufWriter<File>,
    start: Instant,
    first: bool,
    /// Last values emitted, to emit counter tracks only on change.
    last_counters: Vec<(CounterId, u64)>,
    last_ctrl: Option<u64>,
    last_status: u64,
    pub error: Option<String>,
    pub events: u64,
}

impl Tracer {
    pub fn create(path: &Path) -> std::io::Result<Tracer> {
        let mut out = BufWriter::new(File::create(path)?);
        out.write_all(b"{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n")?;
        let mut t = Tracer {
            out,
            start: Instant::now(),
            first: true,
            last_counters: Vec::new(),
            last_ctrl: None,
            last_status: 0,
            error: None,
            events: 0,
        };
        t.raw(r#"{"name":"process_name","ph":"M","pid":1,"args":{"name":"emon guest"}}"#.into());
        t.raw(r#"{"name":"thread_name","ph":"M","pid":1,"tid":1,"args":{"name":"vCPU 0"}}"#.into());
        Ok(t)
    }

    fn ts(&self) -> f64 {
        self.start.elapsed().as_nanos() as f64 / 1000.0
    }

    fn raw(&mut self, event: String) {
        let sep: &[u8] = if self.first { b"" } else { b",\n" };
        self.first = false;
        self.events += 1;
        if let Err(e) = self.out.write_all(sep).and_then(|_| self.out.write_all(event.as_bytes())) {
            self.error.get_or_insert_with(|| e.to_string());
        }
    }

    fn counter(&mut self, name: &str, value: u64) {
        let ts = self.ts();
        self.raw(format!(r#"{{"name":"{name}","ph":"C","ts":{ts:.3},"pid":{PID},"args":{{"value":{value}}}}}"#));
    }

    fn instant(&mut self, name: &str, args: &str) {
        let ts = self.ts();
        self.raw(format!(
            r#"{{"name":"{name}","ph":"i","s":"t","ts":{ts:.3},"pid":{PID},"tid":{TID_VCPU},"args":{{{args}}}}}"#
        ));
    }

    /// A PMU MSR access (`value` is what was read or written; `gp`: it raised #GP), named as the
    /// profile names it (the model names its own registers: 0x309 is not IA32_FIXED_CTR0 everywhere).
    pub fn msr(&mut self, pmu: &Pmu, write: bool, msr: u32, value: u64, gp: bool) {
        let name = pmu.reg_name(msr).unwrap_or_else(|| format!("MSR {msr:#x}"));
        let kind = if write { "wrmsr" } else { "rdmsr" };
        self.instant(&format!("{kind} {name}"), &format!(r#""msr":"{msr:#x}","value":"{value:#x}","gp":{gp}"#));
    }

    pub fn pmi(&mut self, delivery: &str) {
        self.instant("PMI", &format!(r#""delivery":"{delivery}""#));
    }

    /// Emits what changed since the last sample: counter values, GLOBAL_CTRL, GLOBAL_STATUS (and
    /// an overflow instant for each status bit that became set).
    pub fn sample(&mut self, pmu: &Pmu) {
        for id in pmu.counter_ids() {
            let v = pmu.counter(id).value;
            match self.last_counters.iter_mut().find(|(i, _)| *i == id) {
                Some((_, last)) if *last == v => continue,
                Some((_, last)) => *last = v,
                None => self.last_counters.push((id, v)),
            }
            self.counter(&id.to_string(), v);
        }
        if pmu.profile().version >= 2 {
            let ctrl = pmu.global_ctrl();
            if self.last_ctrl != Some(ctrl) {
                self.last_ctrl = Some(ctrl);
                self.counter("IA32_PERF_GLOBAL_CTRL", ctrl);
            }
            let status = pmu.global_status();
            if status != self.last_status {
                let new = status & !self.last_status;
                for bit in (0..64).filter(|b| new & (1 << b) != 0) {
                    let what = match bit {
                        0..=31 => format!("overflow IA32_PMC{bit}"),
                        32..=47 => format!("overflow IA32_FIXED_CTR{}", bit - 32),
                        _ => format!("GLOBAL_STATUS bit {bit}"),
                    };
                    self.instant(&what, &format!(r#""status":"{status:#x}""#));
                }
                self.last_status = status;
                self.counter("IA32_PERF_GLOBAL_STATUS", status);
            }
        }
    }

    /// Closes the JSON document.
    pub fn finish(&mut self) {
        if let Err(e) = self.out.write_all(b"\n]}\n").and_then(|_| self.out.flush()) {
            self.error.get_or_insert_with(|| e.to_string());
        }
    }
}

impl Observer for Tracer {
    fn msr(&mut self, pmu: &Pmu, a: MsrAccess) {
        Tracer::msr(self, pmu, a.write, a.index, a.value, a.gp);
        if a.write {
            self.sample(pmu);
        }
    }

    fn pmi(&mut self, pmu: &Pmu, delivery: PmiDelivery) {
        self.sample(pmu);
        Tracer::pmi(self, &format!("{delivery:?}"));
    }
}
