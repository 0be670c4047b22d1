//! Which host perf event backs a guest counter, and how host counts become guest events.
use super::fd::Spec;
use emon_pmu::events::EventList;
use emon_pmu::pmu::CounterState;
use emon_pmu::profile::{ArchEvent, Event};
use perf_event_open_sys::bindings::{
    PERF_COUNT_HW_BRANCH_INSTRUCTIONS, PERF_COUNT_HW_BRANCH_MISSES, PERF_COUNT_HW_CACHE_MISSES,
    PERF_COUNT_HW_CACHE_REFERENCES, PERF_COUNT_HW_CPU_CYCLES, PERF_COUNT_HW_INSTRUCTIONS, PERF_COUNT_HW_REF_CPU_CYCLES,
    PERF_COUNT_SW_TASK_CLOCK, PERF_TYPE_HARDWARE, PERF_TYPE_RAW, PERF_TYPE_SOFTWARE,
};
use std::collections::BTreeSet;

/// What backs cycles on a host without hardware events (see [`Source::Host::what`]).
pub const TASK_CLOCK_BACKING: &str = "task-clock x nominal MHz";

/// How a host count converts to guest events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scale {
    /// One host event is one guest event.
    One,
    /// The vCPU thread's task-clock (nanoseconds) at the profile's nominal frequency:
    /// cycles = ns * MHz / 1000.
    TaskClock { mhz: u32 },
}

impl Scale {
    pub fn to_guest(self, host: u64) -> u64 {
        match self {
            Scale::One => host,
            Scale::TaskClock { mhz } => (host as u128 * mhz as u128 / 1000) as u64,
        }
    }

    /// Host units after which `guest` more events will have happened (rounded up).
    pub fn to_host(self, guest: u64) -> u64 {
        match self {
            Scale::One => guest,
            Scale::TaskClock { mhz } => {
                (guest as u128 * 1000).div_ceil(mhz.max(1) as u128).min(u64::MAX as u128) as u64
            }
        }
    }
}

/// What backs one guest counter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    Host {
        spec: Spec,
        scale: Scale,
        what: &'static str,
    },
    /// Nothing on this host can count it: it counts zero (reported once per run).
    Zero {
        why: String,
    },
}

/// What this host's perf can count for a guest.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostCaps {
    /// PERF_COUNT_HW_* events that open with exclude_host.
    pub hardware: BTreeSet<u64>,
    /// The software task-clock event opens.
    pub task_clock: bool,
    /// The raw config of the topdown `slots` event, from sysfs.
    pub slots: Option<u64>,
    /// The host CPU's vendor string (CPUID leaf 0).
    pub vendor: String,
    /// The host CPU's model-specific event list, by its vendor, family and model (README,
    /// "Model-specific events"), if emon ships one.
    pub events: Option<&'static EventList>,
    /// `--allow-raw-events`.
    pub allow_raw: bool,
}

/// The perf generic hardware event of each architectural event that has one.
const GENERIC: [(Event, u64, &str); 7] = [
    (Event::CoreCycles, PERF_COUNT_HW_CPU_CYCLES as u64, "cycles"),
    (Event::Instructions, PERF_COUNT_HW_INSTRUCTIONS as u64, "instructions"),
    (Event::RefCycles, PERF_COUNT_HW_REF_CPU_CYCLES as u64, "ref-cycles"),
    (Event::LlcReference, PERF_COUNT_HW_CACHE_REFERENCES as u64, "cache-references"),
    (Event::LlcMisses, PERF_COUNT_HW_CACHE_MISSES as u64, "cache-misses"),
    (Event::Branches, PERF_COUNT_HW_BRANCH_INSTRUCTIONS as u64, "branch-instructions"),
    (Event::BranchMisses, PERF_COUNT_HW_BRANCH_MISSES as u64, "branch-misses"),
];

/// The generic hardware events emon maps architectural events to (for probing).
pub fn generic_events() -> impl Iterator<Item = (&'static str, u64)> {
    GENERIC.iter().map(|&(_, config, name)| (name, config))
}

/// The guest CPU a counter counts for: the profile's vendor, its event list and its nominal MHz.
#[derive(Debug, Clone)]
pub struct GuestCpu {
    pub vendor: String,
    pub events: Option<&'static EventList>,
    pub mhz: u32,
}

/// The host event for guest counter `c` of `guest`.
pub fn source(c: &CounterState, caps: &HostCaps, guest: &GuestCpu) -> Source {
    let (vendor, mhz) = (guest.vendor.as_str(), guest.mhz);
    let spec = |type_, config| Spec { type_, config, exclude_user: !c.usr, exclude_kernel: !c.os, exclude_host: true };
    let (e, u) = (c.event_select, c.umask);
    let arch = ArchEvent::of(e, u).map(|a| a.event);
    if let Some(&(event, config, what)) = GENERIC.iter().find(|g| Some(g.0) == arch) {
        if caps.hardware.contains(&config) {
            return Source::Host { spec: spec(PERF_TYPE_HARDWARE, config), scale: Scale::One, what };
        }
        if matches!(event, Event::CoreCycles | Event::RefCycles) && caps.task_clock {
            // Without hardware cycles: the vCPU thread's CPU time at the nominal frequency. No
            // exclude flags: they do not filter a task-clock count, but exclude_kernel stops its
            // overflow signals while the thread is in KVM_RUN (guest time looks like kernel mode
            // to the timer), so USR/OS cannot be honoured here.
            return Source::Host {
                spec: Spec {
                    type_: PERF_TYPE_SOFTWARE,
                    config: PERF_COUNT_SW_TASK_CLOCK as u64,
                    exclude_user: false,
                    exclude_kernel: false,
                    exclude_host: false,
                },
                scale: Scale::TaskClock { mhz },
                what: TASK_CLOCK_BACKING,
            };
        }
        return Source::Zero { why: format!("the host cannot count {what} in hardware (use --backend precise)") };
    }
    if arch == Some(Event::TopdownSlots) {
        return match caps.slots {
            Some(config) => Source::Host { spec: spec(PERF_TYPE_RAW, config), scale: Scale::One, what: "slots" },
            None => Source::Zero { why: "the host has no topdown slots event".into() },
        };
    }
    // A model-specific event of the guest CPU's list: its encoding names the same event on a host
    // of the same microarchitecture (the same list), and nothing known on another.
    let spec_raw = |c: &CounterState| {
        // PERFEVTSEL's event, umask, E, INV and CMASK fields, as the host's raw config.
        let raw =
            e as u64 | (u as u64) << 8 | u64::from(c.edge) << 18 | u64::from(c.inv) << 23 | (c.cmask as u64) << 24;
        spec(PERF_TYPE_RAW, raw)
    };
    if let Some((list, name)) = guest.events.and_then(|l| l.name_of(e, u).map(|n| (l, n))) {
        if caps.events == Some(list) {
            return Source::Host { spec: spec_raw(c), scale: Scale::One, what: "raw (same microarchitecture)" };
        }
        if !caps.allow_raw {
            let host = caps
                .events
                .map_or_else(|| "has none of the event lists emon ships".to_string(), |h| format!("is {}", h.cpu));
            return Source::Zero {
                why: format!(
                    "{name} ({e:#04x}/{u:#04x}) is an event of {}, and the host CPU {host}: a model-specific event maps to the host's only on the same microarchitecture (--allow-raw-events passes it anyway)",
                    list.cpu
                ),
            };
        }
    }
    if !caps.allow_raw {
        return Source::Zero {
            why: format!(
                "event {e:#04x}/umask {u:#04x} is not architectural; --allow-raw-events passes it to the host"
            ),
        };
    }
    if caps.vendor != vendor {
        return Source::Zero {
            why: format!("raw event {e:#04x}/{u:#04x}: the host is {} but the profile is {vendor}", caps.vendor),
        };
    }
    Source::Host { spec: spec_raw(c), scale: Scale::One, what: "raw" }
}

#[cfg(test)]
mod tests {
    use super::*;
    use emon_pmu::pmu::CounterId;

    fn counter(event_select: u8, umask: u8) -> CounterState {
        CounterState {
            id: CounterId::Gp(0),
            event_select,
            umask,
            usr: true,
            os: false,
            edge: false,
            inv: false,
            cmask: 2,
            any: false,
            int: true,
            enabled: true,
            counting: true,
            value: 0,
            width: 48,
            semantics: emon_pmu::pmu::Semantics::Unsupported,
        }
    }

    fn caps(hardware: &[u64]) -> HostCaps {
        HostCaps {
            hardware: hardware.iter().copied().collect(),
            task_clock: true,
            slots: None,
            vendor: "GenuineIntel".into(),
            events: None,
            allow_raw: false,
        }
    }

    fn guest(mhz: u32) -> GuestCpu {
        GuestCpu { vendor: "GenuineIntel".into(), events: None, mhz }
    }

    #[test]
    fn architectural_events_map_to_generic_hardware_events() {
        let c = caps(&[PERF_COUNT_HW_INSTRUCTIONS as u64, PERF_COUNT_HW_CPU_CYCLES as u64]);
        let Source::Host { spec, scale, .. } = source(&counter(0xC0, 0), &c, &guest(3000)) else { panic!() };
        assert_eq!(
            (spec.type_, spec.config, scale),
            (PERF_TYPE_HARDWARE, PERF_COUNT_HW_INSTRUCTIONS as u64, Scale::One)
        );
        assert!(spec.exclude_host && spec.exclude_kernel && !spec.exclude_user, "USR only, guest only");
    }

    #[test]
    fn cycles_fall_back_to_task_clock_without_hardware() {
        let Source::Host { spec, scale, .. } = source(&counter(0x3C, 1), &caps(&[]), &guest(2000)) else { panic!() };
        assert_eq!((spec.type_, spec.config), (PERF_TYPE_SOFTWARE, PERF_COUNT_SW_TASK_CLOCK as u64));
        assert_eq!(scale, Scale::TaskClock { mhz: 2000 });
        // exclude_kernel would stop the overflow signal while the guest runs.
        assert!(!spec.exclude_kernel && !spec.exclude_user && !spec.exclude_host, "{spec:?}");
        assert!(matches!(source(&counter(0xC0, 0), &caps(&[]), &guest(2000)), Source::Zero { .. }));
    }

    #[test]
    fn raw_events_need_permission_and_a_matching_vendor() {
        assert!(matches!(source(&counter(0xD1, 0x01), &caps(&[]), &guest(2000)), Source::Zero { .. }));
        let mut c = caps(&[]);
        c.allow_raw = true;
        let Source::Host { spec, .. } = source(&counter(0xD1, 0x01), &c, &guest(2000)) else { panic!() };
        assert_eq!((spec.type_, spec.config), (PERF_TYPE_RAW, 0x0200_01D1));
        c.vendor = "AuthenticAMD".into();
        assert!(matches!(source(&counter(0xD1, 0x01), &c, &guest(2000)), Source::Zero { .. }));
    }

    /// A model-specific event of the profile's CPU goes to the host as the same raw event on a
    /// host of the same microarchitecture, and is refused with the reason on any other.
    #[test]
    fn model_specific_events_map_on_the_same_microarchitecture() {
        let skylake = EventList::named("skylake");
        let g = GuestCpu { events: skylake, ..guest(2000) };
        // MEM_LOAD_RETIRED.L1_HIT (0xD1/0x01), CMASK 2, USR.
        let mut c = caps(&[]);
        c.events = skylake;
        let Source::Host { spec, what, .. } = source(&counter(0xD1, 0x01), &c, &g) else { panic!() };
        assert_eq!((spec.type_, spec.config, what), (PERF_TYPE_RAW, 0x0200_01D1, "raw (same microarchitecture)"));
        c.events = EventList::named("icelake");
        let Source::Zero { why } = source(&counter(0xD1, 0x01), &c, &g) else { panic!() };
        assert!(
            why.starts_with("MEM_LOAD_RETIRED.L1_HIT (0xd1/0x01) is an event of Skylake, and the host CPU is Ice Lake"),
            "{why}"
        );
        c.events = None;
        let Source::Zero { why } = source(&counter(0xD1, 0x01), &c, &g) else { panic!() };
        assert!(why.contains("the host CPU has none of the event lists emon ships"), "{why}");
        // --allow-raw-events passes it anyway (today's rule: the vendors match).
        c.allow_raw = true;
        assert!(matches!(source(&counter(0xD1, 0x01), &c, &g), Source::Host { what: "raw", .. }));
    }

    #[test]
    fn task_clock_scaling_round_trips() {
        let s = Scale::TaskClock { mhz: 2667 };
        assert_eq!(s.to_guest(1_000_000), 2_667_000); // 1 ms at 2.667 GHz
        assert_eq!(s.to_host(2_667_000), 1_000_000);
        assert_eq!(s.to_host(1), 1, "rounded up");
        assert!(s.to_guest(s.to_host(12345)) >= 12345);
        assert_eq!(Scale::One.to_host(7), 7);
    }
}
