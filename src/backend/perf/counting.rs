//! The perf backend: guest counters on host perf events, the way KVM's vPMU does it in the
//! kernel, from userspace.
//!
//! Each counting guest counter is one host event, opened on the vCPU thread with exclude_host
//! and USR/OS as exclude_user/exclude_kernel, in one group (behind a software dummy leader) so
//! that counters the guest enables together are scheduled together. Each event is armed to
//! overflow after exactly the distance to the guest counter's overflow, and then signals the
//! vCPU thread, which kicks KVM_RUN; emon folds the counts into the model (scaled by
//! time_enabled/time_running when the kernel multiplexes), which sets GLOBAL_STATUS and makes
//! the PMI pending. On every configuration change or overflow the group is rebuilt.
use super::fd::{PerfFd, Spec};
use super::mapping::{source, HostCaps, Scale, Source};
use crate::backend::{Backend, BackendError, Cx, Next};
use crate::pmu::{CounterId, Pmu};
use perf_event_open_sys::bindings::{PERF_COUNT_SW_DUMMY, PERF_TYPE_SOFTWARE};
use std::collections::BTreeSet;

/// A period no guest counter needs (the kernel rejects periods with bit 63 set).
const MAX_PERIOD: u64 = 1 << 62;

struct Member {
    id: CounterId,
    fd: PerfFd,
    scale: Scale,
    /// Host count (scaled for multiplexing) already folded into the model.
    folded: u64,
    /// The guest wrote the counter: drop what the host counted before the write.
    rebase: bool,
}

struct Group {
    _leader: PerfFd,
    members: Vec<Member>,
}

/// What the perf backend did, for the run summary.
#[derive(Debug, Default, Clone)]
pub struct Stats {
    pub groups_built: u64,
    pub events_opened: u64,
    pub max_open: usize,
    pub overflows: u64,
    /// Reads whose event the kernel had not run for all of its enabled time.
    pub multiplexed_reads: u64,
    /// Why guest events count zero here (each reason reported once).
    pub zero: BTreeSet<String>,
    /// Host events, by what backs them.
    pub backed_by: BTreeSet<&'static str>,
}

pub struct Perf {
    caps: HostCaps,
    vendor: String,
    mhz: u32,
    group: Option<Group>,
    generation: Option<u64>,
    overflowed: bool,
    tid: libc::pid_t,
    pub stats: Stats,
}

impl Perf {
    pub fn new(caps: HostCaps, profile_vendor: &str, nominal_mhz: u32) -> Perf {
        Perf {
            caps,
            vendor: profile_vendor.into(),
            mhz: nominal_mhz,
            group: None,
            generation: None,
            overflowed: false,
            tid: 0,
            stats: Stats::default(),
        }
    }

    /// Folds what the host counted since the last fold into the model.
    fn fold(&mut self, pmu: &mut Pmu) {
        let Some(g) = &mut self.group else { return };
        for m in &mut g.members {
            let Ok(r) = m.fd.read() else { continue };
            if r.multiplexed() {
                self.stats.multiplexed_reads += 1;
            }
            let total = r.scaled();
            if m.rebase {
                m.rebase = false;
                m.folded = total;
                continue;
            }
            let delta = m.scale.to_guest(total).saturating_sub(m.scale.to_guest(m.folded));
            m.folded = total;
            if delta > 0 && pmu.add_events(m.id, delta) {
                self.stats.overflows += 1;
                self.overflowed = true;
            }
        }
    }

    /// Closes the group and opens one for the counters counting now, each armed to overflow
    /// where its guest counter does.
    fn rebuild(&mut self, pmu: &Pmu) -> Result<(), BackendError> {
        self.group = None;
        let counting = pmu.counting();
        if counting.is_empty() {
            return Ok(());
        }
        let dummy = Spec {
            type_: PERF_TYPE_SOFTWARE,
            config: PERF_COUNT_SW_DUMMY as u64,
            exclude_user: false,
            exclude_kernel: false,
            exclude_host: false,
        };
        let perf_err = |op: &'static str| move |e: std::io::Error| BackendError::Perf { op, source: e };
        let leader = PerfFd::open(&dummy, None).map_err(perf_err("perf_event_open(group leader)"))?;
        let mut members = Vec::new();
        for c in &counting {
            match source(c, &self.caps, &self.vendor, self.mhz) {
                Source::Host { spec, scale, what } => {
                    let fd = match PerfFd::open(&spec, Some(&leader)) {
                        Ok(fd) => fd,
                        Err(e) => {
                            self.stats.zero.insert(format!("{} ({what}): perf_event_open failed: {e}", c.id));
                            continue;
                        }
                    };
                    fd.signal_on_overflow(crate::vmm::kick::kick_signal(), self.tid)
                        .map_err(perf_err("fcntl(F_SETOWN_EX/F_SETSIG/O_ASYNC)"))?;
                    let period = scale.to_host(pmu.distance_to_overflow(c.id)).min(MAX_PERIOD);
                    fd.arm(period).map_err(perf_err("PERF_EVENT_IOC_PERIOD/REFRESH"))?;
                    self.stats.backed_by.insert(what);
                    members.push(Member { id: c.id, fd, scale, folded: 0, rebase: false });
                }
                Source::Zero { why } => {
                    if self.stats.zero.insert(why.clone()) {
                        tracing::warn!("{} counts zero: {why}", c.id);
                    }
                }
            }
        }
        leader.enable().map_err(perf_err("PERF_EVENT_IOC_ENABLE"))?;
        self.stats.groups_built += 1;
        self.stats.events_opened += members.len() as u64;
        self.stats.max_open = self.stats.max_open.max(members.len() + 1);
        self.group = Some(Group { _leader: leader, members });
        Ok(())
    }
}

impl Backend for Perf {
    fn name(&self) -> &'static str {
        "perf"
    }

    fn before_run(&mut self, cx: &mut Cx, _at_boundary: bool) -> Result<Next, BackendError> {
        if self.tid == 0 {
            // SAFETY: gettid has no preconditions; backends run on the vCPU thread.
            self.tid = unsafe { libc::gettid() };
        }
        self.fold(cx.pmu);
        let g = cx.pmu.generation();
        if self.overflowed || self.generation != Some(g) {
            self.rebuild(cx.pmu)?;
            self.generation = Some(g);
            self.overflowed = false;
        }
        // A counter overflowed with its PMI enabled: deliver it before entering the guest.
        Ok(if cx.pmu.pmi_pending() { Next::Again } else { Next::Run })
    }

    fn on_debug_exit(&mut self, _cx: &mut Cx, _pc: u64) -> Result<(), BackendError> {
        Ok(())
    }

    fn counter_written(&mut self, id: CounterId) {
        if let Some(g) = &mut self.group {
            g.members.iter_mut().filter(|m| m.id == id).for_each(|m| m.rebase = true);
        }
    }

    fn sync(&mut self, pmu: &mut Pmu) {
        self.fold(pmu);
    }

    fn notes(&self) -> Vec<String> {
        let s = &self.stats;
        let mut notes = Vec::new();
        if s.backed_by.contains("task-clock x nominal MHz") {
            notes.push(format!("cycles from the vCPU thread's task-clock x {} MHz", self.mhz));
        }
        if !s.zero.is_empty() {
            notes.push("some guest events count zero on this host (see --verbose)".into());
        }
        if s.multiplexed_reads > 0 {
            notes.push("the host multiplexed the counters; counts are scaled".into());
        }
        notes
    }

    fn summary(&self) -> String {
        let s = &self.stats;
        let mut line = format!(
            "perf backend: {} host events opened in {} groups (at most {} open at once), {} overflows, backed by {}",
            s.events_opened,
            s.groups_built,
            s.max_open,
            s.overflows,
            if s.backed_by.is_empty() {
                "nothing".into()
            } else {
                s.backed_by.iter().copied().collect::<Vec<_>>().join(", ")
            }
        );
        if s.multiplexed_reads > 0 {
            line += &format!(
                "; multiplexed by the host kernel ({} reads scaled by time_enabled/time_running)",
                s.multiplexed_reads
            );
        }
        if !s.zero.is_empty() {
            line += &format!("; counting zero: {}", s.zero.iter().cloned().collect::<Vec<_>>().join("; "));
        }
        line
    }
}
