//! [`RunReport`]: how a run ended and what happened during it; its exit status, its one-line
//! summary, and [`JsonReport`], the machine-readable form `emon run --json FILE` writes.
use super::kick::StopReason;
use super::loader::Format;
use super::msr::MsrStats;
use super::rdpmc::CatchStats;
use super::vcpu::{ExitStats, Vcpu, VcpuStop};
use crate::backend::rdpmc_catch::Pass;
use crate::backend::vpmu::PmuReport;
use crate::pmu::Pmu;
use crate::status;
use serde::{Serialize, Serializer};
use std::collections::BTreeMap;
use std::time::Duration;

/// How a run ended, and what happened during it.
pub struct RunReport {
    pub stop: VcpuStop,
    pub format: Format,
    pub elapsed: Duration,
    pub exits: ExitStats,
    /// Accesses to MSRs outside the PMU.
    pub msr: MsrStats,
    pub unhandled_ports: BTreeMap<u16, u64>,
    pub serial_error: Option<String>,
    /// The PMU state at the end of the run.
    pub pmu: Pmu,
    /// The virtual PMU's account: backend, PMIs, PMU MSR accesses, notes.
    pub vpmu: PmuReport,
    /// RDPMC outside counted code, completed at the guest's #GP handler.
    pub rdpmc: CatchStats,
    /// Where the guest's CPUID differs from the profile's table (README, "CPUID fidelity").
    pub cpuid_overrides: Vec<super::cpuid_probe::Override>,
    /// Where CPUID.15H's crystal is not the profile's: the rate of the guest's TSC (README,
    /// "Guest time").
    pub tsc_note: Option<String>,
    /// The instruction sets the guest is not told of, if any (user mode in the TCG engine).
    pub isa_note: Option<String>,
    /// The guest kernel's `Kernel panic - not syncing:` line, if its console printed one.
    pub guest_panic: Option<String>,
    /// Events written to the `--trace` file, and the error writing it, if any.
    pub trace_events: u64,
    pub trace_error: Option<String>,
    /// emon's peak resident set size (VmHWM) when the run ended, in KiB; `None` if
    /// /proc/self/status does not say.
    pub peak_memory_kib: Option<u64>,
}

impl RunReport {
    /// The report of a run that ended with `stop` after `elapsed`, from the vCPU's state.
    pub(super) fn collect(stop: VcpuStop, format: Format, elapsed: Duration, vcpu: Vcpu) -> RunReport {
        let guest_panic = vcpu.bus.serial.panic_line().map(str::to_owned);
        let tracer = vcpu.pmu.observer();
        RunReport {
            stop,
            format,
            elapsed,
            exits: vcpu.stats,
            msr: vcpu.msrs.stats,
            unhandled_ports: vcpu.bus.unhandled,
            serial_error: vcpu.bus.serial.output_error,
            pmu: vcpu.pmu.pmu().clone(),
            vpmu: vcpu.pmu.report(),
            rdpmc: vcpu.catch.stats,
            cpuid_overrides: Vec::new(),
            tsc_note: None,
            isa_note: None,
            guest_panic,
            trace_events: tracer.as_ref().map_or(0, |t| t.events),
            trace_error: tracer.as_ref().and_then(|t| t.error.clone()),
            peak_memory_kib: peak_memory_kib(),
        }
    }

    /// emon's exit status: the guest's code for the debug-exit port, else 3/4/130 (see [`status`]).
    pub fn exit_status(&self) -> i32 {
        match &self.stop {
            VcpuStop::DebugExit(code) => *code as i32,
            _ if self.guest_panic.is_some() => status::PANIC.into(),
            VcpuStop::Shutdown { .. } => status::SHUTDOWN.into(),
            VcpuStop::Stopped(StopReason::Timeout) => status::TIMEOUT.into(),
            VcpuStop::Stopped(StopReason::Interrupted) => status::INTERRUPTED.into(),
            // Only a panic's end marker arms it, so `guest_panic` is set and the arm above matched.
            VcpuStop::Stopped(StopReason::PanicEnd) => status::PANIC.into(),
        }
    }

    /// The one-line summary of why the run ended.
    pub fn summary(&self) -> String {
        let why = match &self.stop {
            VcpuStop::DebugExit(code) => {
                format!("guest exited with code {code} through the debug-exit port")
            }
            VcpuStop::Shutdown { why, .. } => format!("guest shut down: {why}"),
            VcpuStop::Stopped(StopReason::Timeout) => "timeout: the guest was stopped".into(),
            VcpuStop::Stopped(StopReason::Interrupted) => "interrupted (Ctrl-C)".into(),
            VcpuStop::Stopped(StopReason::PanicEnd) => format!(
                "the kernel printed its panic's end marker and nothing for {} s after it (it spins)",
                super::supervisor::PANIC_QUIET.as_secs()
            ),
        };
        let why = match (&self.guest_panic, &self.stop) {
            (Some(line), stop) if !matches!(stop, VcpuStop::DebugExit(_)) => {
                format!("guest kernel panic, \"{line}\"; then {why}")
            }
            _ => why,
        };
        let v = &self.vpmu;
        let mut backend = v.backend.to_owned();
        for n in v.backend_notes.iter().chain(&self.rdpmc.notes()).chain(&v.model_notes) {
            backend += &format!("; {n}");
        }
        let rdpmc = self.rdpmc.summary().map(|s| format!(", {s}")).unwrap_or_default();
        let cpuid = self
            .cpuid_note()
            .iter()
            .chain(&self.tsc_note)
            .chain(&self.isa_note)
            .map(|n| format!("; {n}"))
            .collect::<String>();
        format!(
            "emon: {why} after {:.2} s, {} exits, {} PMU MSR accesses, {} #GP injected{rdpmc}, backend {backend}{cpuid} (status {})",
            self.elapsed.as_secs_f64(),
            self.exits.total,
            v.msrs.reads + v.msrs.writes,
            self.gp_injected(),
            self.exit_status()
        )
    }

    /// What the run summary says when the host showed the guest CPUID bits other than the
    /// profile's table: how many, and the first few feature names.
    pub fn cpuid_note(&self) -> Option<String> {
        if self.cpuid_overrides.is_empty() {
            return None;
        }
        if let Some(o) = self.cpuid_overrides.iter().find(|o| o.touches_the_profile()) {
            return Some(format!(
                "NOT AS PROFILED: this host shows the guest CPUID other than the profile's, {} (emon cpuid; README, \"CPUID fidelity\")",
                o.describe()
            ));
        }
        let bits: u32 = self.cpuid_overrides.iter().map(|o| o.bits()).sum();
        let names: Vec<&str> = self.cpuid_overrides.iter().flat_map(|o| o.named_bits()).collect();
        let some = if names.is_empty() { String::new() } else { format!(", among them {}", names.join(" ")) };
        Some(format!(
            "CPUID: this host overrides {bits} bits of the profile's table{some} (emon cpuid --profile ...; README, \"CPUID fidelity\")"
        ))
    }

    /// #GPs injected for RDMSR/WRMSR, the PMU's and the others'.
    pub fn gp_injected(&self) -> u64 {
        self.vpmu.msrs.gp + self.msr.gp_injected
    }

    /// The machine-readable report (`emon run --json`).
    pub fn json(&self) -> JsonReport<'_> {
        let end = match &self.stop {
            VcpuStop::DebugExit(code) => End::DebugExit { code: *code },
            VcpuStop::Shutdown { why, registers } => End::Shutdown { reason: why, registers },
            VcpuStop::Stopped(StopReason::Timeout) => End::Timeout,
            VcpuStop::Stopped(StopReason::Interrupted) => End::Interrupted,
            VcpuStop::Stopped(StopReason::PanicEnd) => End::PanicEnd,
        };
        let (e, p, v) = (&self.exits, &self.vpmu.pmis, &self.vpmu);
        JsonReport {
            end,
            status: self.exit_status(),
            summary: self.summary(),
            elapsed_s: self.elapsed.as_secs_f64(),
            exits: Counts([
                ("total", e.total),
                ("pio", e.pio),
                ("mmio", e.mmio),
                ("msr", e.msr),
                ("interrupted", e.interrupted),
                ("other", e.other),
                ("completed", e.completed),
                ("int3_delivered", e.int3_delivered),
            ]),
            msr: JsonMsrs {
                pmu_reads: v.msrs.reads,
                pmu_writes: v.msrs.writes,
                gp_injected: self.gp_injected(),
                unknown: self.msr.unknown.iter().map(|(&msr, &accesses)| UnknownMsr { msr, accesses }).collect(),
                unknown_untracked: self.msr.unknown_untracked,
                notes: v.model_notes.clone(),
            },
            pmis: Counts([("fixed", p.fixed), ("nmi", p.nmi), ("masked", p.masked), ("dropped", p.dropped)]),
            backend: JsonBackend { name: v.backend, notes: &v.backend_notes, summary: &v.summary },
            rdpmc: JsonRdpmc {
                armed: self.rdpmc.armed,
                completed: self.rdpmc.completed,
                gp_passed: self.rdpmc.passed_total(),
                gp_passed_rdpmc_faults: self.rdpmc.passed.get(&Pass::RdpmcFaults).copied().unwrap_or(0),
                db_reinjected: self.rdpmc.db_reinjected,
                notes: self.rdpmc.notes(),
            },
            fds: Counts([("at_start", e.fds_at_start as u64), ("at_end", e.fds_at_end as u64)]),
            peak_memory_kib: self.peak_memory_kib,
            unhandled_ports: self
                .unhandled_ports
                .iter()
                .map(|(&port, &accesses)| UnhandledPort { port, accesses })
                .collect(),
            trace: JsonTrace { events: self.trace_events, error: self.trace_error.as_deref() },
            serial_error: self.serial_error.as_deref(),
            guest_panic: self.guest_panic.as_deref(),
            cpuid_overrides: self
                .cpuid_overrides
                .iter()
                .map(|o| JsonCpuidOverride {
                    leaf: o.leaf,
                    subleaf: o.subleaf,
                    register: super::cpuid_probe::REGISTERS[o.register],
                    table: o.table,
                    guest: o.guest,
                    description: o.describe(),
                })
                .collect(),
        }
    }
}

/// This process's peak resident set size (VmHWM in /proc/self/status), in KiB.
fn peak_memory_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// `emon run --json FILE`: the run report as one JSON object (README, "Command line").
#[derive(Debug, Serialize)]
pub struct JsonReport<'a> {
    /// How the run ended.
    pub end: End<'a>,
    /// emon's exit status.
    pub status: i32,
    /// The one-line summary emon printed on stderr.
    pub summary: String,
    pub elapsed_s: f64,
    /// [`ExitStats`]' exit counts: total, pio, mmio, msr, interrupted, other, completed, int3_delivered.
    pub exits: Counts<8>,
    pub msr: JsonMsrs,
    /// PMIs by how they were delivered: fixed, nmi, masked, dropped.
    pub pmis: Counts<4>,
    pub backend: JsonBackend<'a>,
    pub rdpmc: JsonRdpmc,
    /// Open file descriptors at the first KVM_RUN and at the end of the run: at_start, at_end.
    pub fds: Counts<2>,
    /// emon's peak resident set size (VmHWM), in KiB; null if the kernel does not report it.
    pub peak_memory_kib: Option<u64>,
    /// Ports nothing emulates, which read as all-ones and ignore writes.
    pub unhandled_ports: Vec<UnhandledPort>,
    pub trace: JsonTrace<'a>,
    /// Writing the guest's serial output failed with this error.
    pub serial_error: Option<&'a str>,
    /// Every CPUID register the guest reads differently from the profile's table.
    pub cpuid_overrides: Vec<JsonCpuidOverride>,
    /// The guest kernel's panic line, if its console printed one.
    pub guest_panic: Option<&'a str>,
}

/// One register of [`JsonReport::cpuid_overrides`].
#[derive(Debug, Serialize)]
pub struct JsonCpuidOverride {
    pub leaf: u32,
    pub subleaf: u32,
    /// EAX, EBX, ECX or EDX.
    pub register: &'static str,
    pub table: u32,
    pub guest: u32,
    pub description: String,
}

/// How the run ended: `{"kind": "debug-exit", "code": N}`, `{"kind": "shutdown", "reason": ...,
/// "registers": ...}`, `{"kind": "timeout"}`, `{"kind": "interrupted"}` or `{"kind":
/// "panic-end"}` (a kernel panic's end marker, then a silent console).
#[derive(Debug, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum End<'a> {
    DebugExit { code: u32 },
    Shutdown { reason: &'a str, registers: &'a str },
    Timeout,
    Interrupted,
    PanicEnd,
}

/// Named counts, serialized as one JSON object with the names as keys, in this order.
#[derive(Debug)]
pub struct Counts<const N: usize>(pub [(&'static str, u64); N]);

impl<const N: usize> Serialize for Counts<N> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().copied())
    }
}

/// PMU MSR accesses, #GPs injected, and the non-PMU MSRs ([`MsrStats`]).
#[derive(Debug, Serialize)]
pub struct JsonMsrs {
    pub pmu_reads: u64,
    pub pmu_writes: u64,
    pub gp_injected: u64,
    /// The first [`super::msr::MAX_TRACKED_MSRS`] distinct non-PMU MSRs, by index.
    pub unknown: Vec<UnknownMsr>,
    /// Accesses to the non-PMU MSRs beyond those.
    pub unknown_untracked: u64,
    /// What the guest enabled that emon does not produce (the run summary's NOT EXACT notes).
    pub notes: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct UnknownMsr {
    pub msr: u32,
    pub accesses: u64,
}

#[derive(Debug, Serialize)]
pub struct JsonBackend<'a> {
    pub name: &'a str,
    /// The notes in the one-line summary.
    pub notes: &'a [String],
    /// The backend's account of the run, as `--verbose` prints it.
    pub summary: &'a str,
}

/// RDPMC outside counted code ([`CatchStats`]).
#[derive(Debug, Serialize)]
pub struct JsonRdpmc {
    /// The breakpoint was on the guest's #GP handler at some point.
    pub armed: bool,
    /// RDPMCs completed at the #GP handler.
    pub completed: u64,
    /// #GPs passed on to the guest's handler, and how many of them came from an RDPMC that
    /// faults on hardware too.
    pub gp_passed: u64,
    pub gp_passed_rdpmc_faults: u64,
    /// The guest's own #DBs given back to it.
    pub db_reinjected: u64,
    /// When RDPMC outside counted code was not available, and why.
    pub notes: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct UnhandledPort {
    pub port: u16,
    pub accesses: u64,
}

/// `--trace`: events written, and the error that stopped the writing, if any.
#[derive(Debug, Serialize)]
pub struct JsonTrace<'a> {
    pub events: u64,
    pub error: Option<&'a str>,
}
