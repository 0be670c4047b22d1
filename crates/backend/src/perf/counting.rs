//! The perf backend: guest counters on host perf events, the way KVM's vPMU does it in the
//! kernel, from userspace.
//!
//! Each counting guest counter is one host event, opened on the vCPU thread with exclude_host
//! and USR/OS as exclude_user/exclude_kernel. Each event is armed to
//! overflow after exactly the distance to the guest counter's overflow, and then signals the
//! vCPU thread, which kicks KVM_RUN; emon folds the counts into the model (scaled by
//! time_enabled/time_running when the kernel multiplexes), which sets GLOBAL_STATUS and makes
//! the PMI pending. Only the counters a guest write changed, and a counter that overflowed, are
//! reprogrammed: their host event is closed and, if the counter counts, opened again in the group.
use super::fd::PerfFd;
use super::mapping::{source, GuestCpu, HostCaps, Scale, Source, TASK_CLOCK_BACKING};
use crate::{marked, Backend, BackendError, Cx, Next};
use emon_pmu::pmu::{CounterId, Pmu};
use std::collections::BTreeSet;

/// A period no guest counter needs (the kernel rejects periods with bit 63 set).
const MAX_PERIOD: u64 = 1 << 62;

struct Member {
    id: CounterId,
    fd: PerfFd,
    scale: Scale,
    /// Host count (scaled for multiplexing) already folded into the model.
    folded: u64,
}

/// What the perf backend did, for the run summary.
#[derive(Debug, Default, Clone)]
pub struct Stats {
    /// Counters reprogrammed (one per counter per change or overflow).
    pub reprogrammed: u64,
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
    guest: GuestCpu,
    /// One host event per counting guest counter.
    members: Vec<Member>,
    /// Counters whose host event overflowed (GLOBAL_CTRL layout): they are opened again, armed
    /// for the guest counter's next wrap.
    overflowed: u64,
    tid: libc::pid_t,
    /// The signal that makes the vCPU thread's KVM_RUN return.
    kick_signal: i32,
    pub stats: Stats,
}

impl Perf {
    /// A perf backend for `guest`; overflow signals go to the vCPU thread as `kick_signal`,
    /// whose handler must make KVM_RUN return.
    pub fn new(caps: HostCaps, guest: GuestCpu, kick_signal: i32) -> Perf {
        Perf { caps, guest, members: Vec::new(), overflowed: 0, tid: 0, kick_signal, stats: Stats::default() }
    }

    /// Folds what the host counted since the last fold into the model.
    fn fold(&mut self, pmu: &mut Pmu) {
        for m in &mut self.members {
            let Ok(r) = m.fd.read() else { continue };
            if r.multiplexed() {
                self.stats.multiplexed_reads += 1;
            }
            let total = r.scaled();
            let delta = m.scale.to_guest(total).saturating_sub(m.scale.to_guest(m.folded));
            m.folded = total;
            if delta > 0 && pmu.add_events(m.id, delta) {
                self.stats.overflows += 1;
                self.overflowed |= m.id.status_mask();
            }
        }
    }

    /// Reprograms counter `id`: closes its host event and, if the guest counter counts, opens a
    /// new one armed to overflow where the guest counter does. Each counter has an event of its
    /// own, as in KVM's vPMU: a sibling added to a running perf group would not be scheduled
    /// until the group's next sched-in, and REFRESH re-arms only a standalone event.
    fn reprogram(&mut self, pmu: &Pmu, id: CounterId) -> Result<(), BackendError> {
        self.stats.reprogrammed += 1;
        self.members.retain(|m| m.id != id);
        let c = pmu.counter(id);
        if !c.counting {
            return Ok(());
        }
        let perf_err = |op: &'static str| move |e: std::io::Error| BackendError::Perf { op, source: e };
        match source(&c, &self.caps, &self.guest) {
            Source::Host { spec, scale, what } => match PerfFd::open(&spec) {
                Ok(fd) => {
                    fd.signal_on_overflow(self.kick_signal, self.tid)
                        .map_err(perf_err("fcntl(F_SETOWN_EX/F_SETSIG/O_ASYNC)"))?;
                    // PERIOD + REFRESH: armed and enabled.
                    let period = scale.to_host(pmu.distance_to_overflow(id)).min(MAX_PERIOD);
                    fd.arm(period).map_err(perf_err("PERF_EVENT_IOC_PERIOD/REFRESH"))?;
                    self.stats.backed_by.insert(what);
                    self.stats.events_opened += 1;
                    self.members.push(Member { id, fd, scale, folded: 0 });
                    self.stats.max_open = self.stats.max_open.max(self.members.len());
                }
                Err(e) => {
                    self.stats.zero.insert(format!("{id} ({what}): perf_event_open failed: {e}"));
                }
            },
            Source::Zero { why } => {
                if self.stats.zero.insert(why.clone()) {
                    tracing::warn!("{id} counts zero: {why}");
                }
            }
        }
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
        let mut r = cx.pmu.take_reprogram();
        r.counters |= std::mem::take(&mut self.overflowed);
        let ids: Vec<CounterId> = marked(cx.pmu, r).collect();
        for id in ids {
            self.reprogram(cx.pmu, id)?;
        }
        // A counter overflowed with its PMI enabled: deliver it before entering the guest.
        Ok(if cx.pmu.pmi_pending() { Next::Again } else { Next::Run })
    }

    fn on_debug_exit(&mut self, _cx: &mut Cx, _pc: u64) -> Result<(), BackendError> {
        Ok(())
    }

    fn reprogrammed(&self) -> u64 {
        self.stats.reprogrammed
    }

    fn sync(&mut self, pmu: &mut Pmu) {
        self.fold(pmu);
    }

    fn notes(&self) -> Vec<String> {
        let s = &self.stats;
        let mut notes = Vec::new();
        if s.backed_by.contains(TASK_CLOCK_BACKING) {
            notes.push(format!("cycles from the vCPU thread's task-clock x {} MHz", self.guest.mhz));
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
            "perf backend: {} host events opened (at most {} open at once), {} counters reprogrammed, {} overflows, backed by {}",
            s.events_opened,
            s.max_open,
            s.reprogrammed,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::Script;
    use emon_pmu::pmu::msr;
    use emon_pmu::profile::Profile;
    use vm_memory::{GuestAddress, GuestMemoryMmap};

    /// Host events backed by this thread's task-clock, which every Linux host can open.
    fn task_clock_caps() -> HostCaps {
        HostCaps { task_clock: true, ..HostCaps::default() }
    }

    #[test]
    fn a_write_reopens_only_the_host_event_of_the_counter_it_changed() {
        let mut vcpu = Script::new(GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x1000)]).unwrap());
        let mut pmu = Pmu::new(&Profile::load("skylake").unwrap().pmu);
        let guest = GuestCpu { vendor: "GenuineIntel".into(), events: None, mhz: 1000 };
        let mut perf = Perf::new(task_clock_caps(), guest, libc::SIGUSR2);
        let mut before_run = |perf: &mut Perf, pmu: &mut Pmu| {
            let msrs = &mut crate::vpmu::Accounting::<()>::default();
            assert_eq!(
                perf.before_run(&mut Cx { vcpu: &mut vcpu, pmu, msrs, ports: &mut crate::NoPorts }, true).unwrap(),
                Next::Run
            );
        };
        // Core cycles on PMC0 and on FIXED_CTR1, both backed by task-clock.
        pmu.wrmsr(msr::IA32_PERFEVTSEL0, 0x43_003C).unwrap();
        pmu.wrmsr(msr::IA32_FIXED_CTR_CTRL, 0x30).unwrap();
        pmu.wrmsr(msr::IA32_PERF_GLOBAL_CTRL, 1 << 33 | 1).unwrap();
        before_run(&mut perf, &mut pmu);
        // GLOBAL_CTRL powers on as 0xF, so the write also changed PMC1-3's bits: five counters
        // marked, two counting.
        assert_eq!((perf.stats.reprogrammed, perf.stats.events_opened, perf.members.len()), (5, 2, 2));
        let fixed_fd = perf.members.iter().find(|m| m.id == CounterId::Fixed(1)).unwrap().fd.raw();
        // PMC0's OS bit: one counter reprogrammed, one event reopened; FIXED_CTR1's stays open.
        pmu.wrmsr(msr::IA32_PERFEVTSEL0, 0x41_003C).unwrap();
        before_run(&mut perf, &mut pmu);
        assert_eq!((perf.stats.reprogrammed, perf.stats.events_opened, perf.members.len()), (6, 3, 2));
        assert_eq!(perf.members.iter().find(|m| m.id == CounterId::Fixed(1)).unwrap().fd.raw(), fixed_fd);
        // Nothing written: nothing reprogrammed.
        before_run(&mut perf, &mut pmu);
        assert_eq!(perf.stats.reprogrammed, 6);
        // GLOBAL_CTRL stops PMC0 only: its event closes.
        pmu.wrmsr(msr::IA32_PERF_GLOBAL_CTRL, 1 << 33).unwrap();
        before_run(&mut perf, &mut pmu);
        assert_eq!((perf.stats.reprogrammed, perf.members.len()), (7, 1));
    }
}
