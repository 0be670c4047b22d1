//! What the host's perf events can do for emon: the events a guest's counters map to, whether
//! each opens on the calling thread, and, from the perf backend's [`HostCaps`], which backend
//! `--backend auto` chooses ([`auto_choice`], the one place that decision is made; both
//! [`super::select`] and `emon host` use it).
use super::perf::{self, fd, mapping::HostCaps};
use super::BackendKind;
use perf_event_open_sys::bindings::{
    PERF_COUNT_HW_BRANCH_INSTRUCTIONS, PERF_COUNT_HW_BRANCH_MISSES, PERF_COUNT_HW_CACHE_MISSES,
    PERF_COUNT_HW_CACHE_REFERENCES, PERF_COUNT_HW_CPU_CYCLES, PERF_COUNT_HW_INSTRUCTIONS, PERF_COUNT_HW_REF_CPU_CYCLES,
    PERF_COUNT_SW_CPU_CLOCK, PERF_COUNT_SW_TASK_CLOCK, PERF_TYPE_HARDWARE, PERF_TYPE_RAW, PERF_TYPE_SOFTWARE,
};
use std::io;

/// One host perf event emon may open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostEvent {
    /// perf's name for it (as in `perf stat -e`).
    pub name: &'static str,
    /// perf_event_attr.type.
    pub type_: u32,
    /// perf_event_attr.config.
    pub config: u64,
    /// The architectural event (CPUID.0AH:EBX bit, SDM Table 18-1) it stands for, if any.
    pub arch_bit: Option<u8>,
}

impl HostEvent {
    const fn hw(name: &'static str, config: u32, arch_bit: u8) -> Self {
        HostEvent { name, type_: PERF_TYPE_HARDWARE, config: config as u64, arch_bit: Some(arch_bit) }
    }

    const fn sw(name: &'static str, config: u32) -> Self {
        HostEvent { name, type_: PERF_TYPE_SOFTWARE, config: config as u64, arch_bit: None }
    }

    /// The topdown slots event with the raw `config` from sysfs ([`perf::slots_event`]).
    pub const fn slots(config: u64) -> Self {
        HostEvent { name: "slots", type_: PERF_TYPE_RAW, config, arch_bit: Some(7) }
    }

    /// "hardware", "software", "raw" or the type number.
    pub fn type_name(&self) -> String {
        match self.type_ {
            PERF_TYPE_HARDWARE => "hardware".into(),
            PERF_TYPE_SOFTWARE => "software".into(),
            PERF_TYPE_RAW => "raw".into(),
            t => t.to_string(),
        }
    }
}

/// The generic hardware events, one per architectural event 0-6 (slots, bit 7, comes from
/// sysfs), in the order of [`perf::mapping::generic_events`], which a test checks.
pub const HARDWARE_EVENTS: [HostEvent; 7] = [
    HostEvent::hw("cycles", PERF_COUNT_HW_CPU_CYCLES, 0),
    HostEvent::hw("instructions", PERF_COUNT_HW_INSTRUCTIONS, 1),
    HostEvent::hw("ref-cycles", PERF_COUNT_HW_REF_CPU_CYCLES, 2),
    HostEvent::hw("cache-references", PERF_COUNT_HW_CACHE_REFERENCES, 3),
    HostEvent::hw("cache-misses", PERF_COUNT_HW_CACHE_MISSES, 4),
    HostEvent::hw("branch-instructions", PERF_COUNT_HW_BRANCH_INSTRUCTIONS, 5),
    HostEvent::hw("branch-misses", PERF_COUNT_HW_BRANCH_MISSES, 6),
];

/// The software clocks (task-clock stands in for cycles on hosts without a hardware PMU).
pub const SOFTWARE_EVENTS: [HostEvent; 2] =
    [HostEvent::sw("task-clock", PERF_COUNT_SW_TASK_CLOCK), HostEvent::sw("cpu-clock", PERF_COUNT_SW_CPU_CLOCK)];

/// The sysfs file describing the topdown slots event of the core PMU (read by [`perf::slots_event`]).
pub const SLOTS_SYSFS: &str = "/sys/bus/event_source/devices/cpu/events/slots";

/// Every event to probe on this host: the hardware events, slots if the host has it, the software clocks.
pub fn host_events() -> Vec<HostEvent> {
    let mut v = HARDWARE_EVENTS.to_vec();
    v.extend(perf::slots_event().map(HostEvent::slots));
    v.extend(SOFTWARE_EVENTS);
    v
}

/// Opens `event` on the calling thread the way [`perf::host_caps`] and the perf backend do
/// ([`fd::PerfFd::open`]: disabled, a sampling event, exclude_hv), with `exclude_host` as given
/// and exclude_user/exclude_kernel clear (a guest counter with USR and OS counts both), then
/// closes it.
pub fn probe(event: &HostEvent, exclude_host: bool) -> io::Result<()> {
    let spec =
        fd::Spec { type_: event.type_, config: event.config, exclude_user: false, exclude_kernel: false, exclude_host };
    fd::PerfFd::open(&spec).map(drop)
}

/// Which backend `--backend auto` chooses given what the host's perf can count for a guest
/// (`caps`, from [`perf::host_caps`]), and why: perf when it counts every architectural event
/// in hardware ([`perf::missing_for_guests`]), precise otherwise. The reason starts with
/// "auto: " and names the events that did not open, with the errno of a fresh [`probe`].
pub fn auto_choice(caps: &HostCaps) -> (BackendKind, String) {
    auto_choice_with(caps, |e| probe(e, true).err())
}

/// [`auto_choice`], with `error_of` giving the exclude_host open error of an event.
pub fn auto_choice_with(caps: &HostCaps, error_of: impl Fn(&HostEvent) -> Option<io::Error>) -> (BackendKind, String) {
    let Some(missing) = perf::missing_for_guests(caps) else {
        return (BackendKind::Perf, "auto: the host counts every architectural event for the guest in hardware".into());
    };
    // One errno for all (the usual case), or events grouped by how they failed.
    let mut groups: Vec<(String, Vec<&str>)> = Vec::new();
    for name in missing.split(", ") {
        let text = HARDWARE_EVENTS
            .iter()
            .find(|e| e.name == name)
            .and_then(&error_of)
            .map_or_else(|| "it opens now, but did not when probed".into(), |e| errno_text(&e));
        match groups.iter_mut().find(|(t, _)| *t == text) {
            Some((_, names)) => names.push(name),
            None => groups.push((text, vec![name])),
        }
    }
    let detail = match groups.as_slice() {
        [(text, _)] => text.clone(),
        _ => groups.iter().map(|(text, names)| format!("{}: {text}", names.join(", "))).collect::<Vec<_>>().join("; "),
    };
    (
        BackendKind::Precise,
        format!(
            "auto: the host cannot count {missing} for the guest in hardware (perf_event_open with exclude_host: {detail}), so the precise backend counts"
        ),
    )
}

/// An OS error as "ENOENT (No such file or directory)"; other errors as their Display.
pub fn errno_text(err: &io::Error) -> String {
    let Some(code) = err.raw_os_error() else { return err.to_string() };
    let text = err.to_string();
    let text = text.split(" (os error").next().unwrap_or(&text);
    match errno_name(code) {
        Some(name) => format!("{name} ({text})"),
        None => format!("errno {code} ({text})"),
    }
}

fn errno_name(code: i32) -> Option<&'static str> {
    Some(match code {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::E2BIG => "E2BIG",
        libc::EBADF => "EBADF",
        libc::EACCES => "EACCES",
        libc::EFAULT => "EFAULT",
        libc::EBUSY => "EBUSY",
        libc::ENODEV => "ENODEV",
        libc::EINVAL => "EINVAL",
        libc::EMFILE => "EMFILE",
        libc::ENOSPC => "ENOSPC",
        libc::ENOSYS => "ENOSYS",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::EOVERFLOW => "EOVERFLOW",
        libc::ESRCH => "ESRCH",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use emon_pmu::profile::ARCH_EVENTS;

    #[test]
    fn the_table_is_the_perf_backends_generic_events_in_order() {
        let backend: Vec<(&str, u64)> = perf::mapping::generic_events().collect();
        let table: Vec<(&str, u64)> = HARDWARE_EVENTS.iter().map(|e| (e.name, e.config)).collect();
        assert_eq!(table, backend);
    }

    #[test]
    fn hardware_events_cover_architectural_events_0_to_6_in_order() {
        for (i, e) in HARDWARE_EVENTS.iter().enumerate() {
            assert_eq!(e.arch_bit, Some(i as u8), "{}", e.name);
            assert_eq!(ARCH_EVENTS[i].bit, i as u8);
            assert_eq!(e.type_name(), "hardware");
        }
        assert_eq!(HostEvent::slots(0x400).arch_bit, Some(7));
        assert_eq!(ARCH_EVENTS[7].name, "Topdown Slots");
        assert_eq!(HostEvent::slots(0x400).type_name(), "raw");
        let mut names: Vec<&str> = HARDWARE_EVENTS.iter().chain(&SOFTWARE_EVENTS).map(|e| e.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), HARDWARE_EVENTS.len() + SOFTWARE_EVENTS.len(), "names are unique");
        assert!(SOFTWARE_EVENTS.iter().all(|e| e.type_name() == "software" && e.arch_bit.is_none()));
    }

    #[test]
    fn slots_comes_from_the_sysfs_file_the_backend_reads() {
        let config = std::fs::read_to_string(SLOTS_SYSFS).ok().and_then(|t| perf::parse_event_config(&t));
        assert_eq!(perf::slots_event(), config);
        assert_eq!(host_events().iter().any(|e| e.name == "slots"), config.is_some());
    }

    fn caps(names: &[&str]) -> HostCaps {
        HostCaps {
            hardware: HARDWARE_EVENTS.iter().filter(|e| names.contains(&e.name)).map(|e| e.config).collect(),
            ..HostCaps::default()
        }
    }

    #[test]
    fn auto_is_perf_when_every_architectural_event_opens() {
        let all: Vec<&str> = HARDWARE_EVENTS.iter().map(|e| e.name).collect();
        let (kind, why) = auto_choice_with(&caps(&all), |_| panic!("nothing failed"));
        assert_eq!(kind, BackendKind::Perf);
        assert!(why.starts_with("auto: the host counts"), "{why}");
    }

    #[test]
    fn auto_is_precise_and_names_each_event_that_failed_with_its_errno() {
        let c = caps(&["cycles", "instructions", "ref-cycles", "cache-references", "branch-instructions"]);
        let (kind, why) = auto_choice_with(&c, |e| {
            Some(io::Error::from_raw_os_error(if e.name == "cache-misses" { libc::EACCES } else { libc::ENOENT }))
        });
        assert_eq!(kind, BackendKind::Precise);
        assert!(why.starts_with("auto: the host cannot count cache-misses, branch-misses for the guest"), "{why}");
        assert!(
            why.contains("(perf_event_open with exclude_host: cache-misses: EACCES (Permission denied); branch-misses: ENOENT (No such file or directory)), so the precise backend counts"),
            "{why}"
        );
        let (_, why) = auto_choice_with(&caps(&[]), |_| Some(io::Error::from_raw_os_error(libc::ENOENT)));
        assert_eq!(why, "auto: the host cannot count cycles, instructions, ref-cycles, cache-references, cache-misses, branch-instructions, branch-misses for the guest in hardware (perf_event_open with exclude_host: ENOENT (No such file or directory)), so the precise backend counts");
    }

    #[test]
    fn errno_text_names_the_errno() {
        assert_eq!(errno_text(&io::Error::from_raw_os_error(libc::EACCES)), "EACCES (Permission denied)");
        assert!(errno_text(&io::Error::from_raw_os_error(4095)).starts_with("errno 4095 ("));
        assert_eq!(errno_text(&io::Error::other("x")), "x");
    }
}
