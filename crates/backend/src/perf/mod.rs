//! The perf backend: guest counters on host perf events (`counting`), the perf_event_open
//! wrapper (`fd`), the mapping of guest events to host events (`mapping`), and what this host
//! can count for a guest.
pub mod counting;
pub mod fd;
pub mod mapping;

/// The generic hardware events `auto` needs the host to count for the guest before it picks
/// perf, or `None` when it can count them all.
pub fn missing_for_guests(caps: &mapping::HostCaps) -> Option<String> {
    let missing: Vec<&str> =
        mapping::generic_events().filter(|(_, c)| !caps.hardware.contains(c)).map(|(name, _)| name).collect();
    (!missing.is_empty()).then(|| missing.join(", "))
}

/// What this host's perf can count for a guest: each generic hardware event opened with
/// exclude_host, the task-clock software event, and the topdown slots event from sysfs.
pub fn host_caps(allow_raw: bool) -> mapping::HostCaps {
    use perf_event_open_sys::bindings::{PERF_COUNT_SW_TASK_CLOCK, PERF_TYPE_HARDWARE, PERF_TYPE_SOFTWARE};
    let opens = |type_, config, exclude_host| {
        let spec = fd::Spec { type_, config, exclude_user: false, exclude_kernel: false, exclude_host };
        fd::PerfFd::open(&spec).is_ok()
    };
    mapping::HostCaps {
        hardware: mapping::generic_events()
            .filter(|&(_, c)| opens(PERF_TYPE_HARDWARE, c, true))
            .map(|(_, c)| c)
            .collect(),
        task_clock: opens(PERF_TYPE_SOFTWARE, PERF_COUNT_SW_TASK_CLOCK as u64, false),
        slots: slots_event(),
        vendor: host_vendor(),
        events: host_events(),
        allow_raw,
    }
}

/// The host CPU's model-specific event list, by its CPUID vendor, family and model, if emon
/// ships one (a host of the same microarchitecture as a profile counts its events natively).
pub fn host_events() -> Option<&'static emon_pmu::events::EventList> {
    let eax = core::arch::x86_64::__cpuid(1).eax;
    let base_family = (eax >> 8) & 0xF;
    let family = if base_family == 0xF { base_family + ((eax >> 20) & 0xFF) } else { base_family };
    let model = if base_family == 6 || base_family == 0xF {
        ((eax >> 4) & 0xF) | ((eax >> 12) & 0xF0)
    } else {
        (eax >> 4) & 0xF
    };
    emon_pmu::events::EventList::for_cpu(&host_vendor(), family as u16, model as u8)
}

/// The topdown `slots` event's raw config, from /sys/bus/event_source/devices/cpu/events/slots.
pub fn slots_event() -> Option<u64> {
    parse_event_config(&std::fs::read_to_string("/sys/bus/event_source/devices/cpu/events/slots").ok()?)
}

/// "event=0x00,umask=0x4" as a raw config (event bits 7:0, umask bits 15:8).
pub fn parse_event_config(text: &str) -> Option<u64> {
    let mut config = 0;
    for term in text.trim().split(',') {
        let (k, v) = term.split_once('=')?;
        let v = u64::from_str_radix(v.trim_start_matches("0x"), 16).ok()?;
        match k {
            "event" => config |= v & 0xFF,
            "umask" => config |= (v & 0xFF) << 8,
            _ => return None,
        }
    }
    Some(config)
}

/// The host CPU's CPUID vendor string.
pub fn host_vendor() -> String {
    let r = core::arch::x86_64::__cpuid(0);
    let bytes: Vec<u8> = [r.ebx, r.edx, r.ecx].iter().flat_map(|w| w.to_le_bytes()).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses_sysfs_event_terms() {
        assert_eq!(super::parse_event_config("event=0x00,umask=0x4\n"), Some(0x400));
        assert_eq!(super::parse_event_config("event=0xa4,umask=0x01"), Some(0x01A4));
        assert_eq!(super::parse_event_config("event=0x3c,cmask=1"), None);
    }

    #[test]
    fn this_host_has_a_task_clock() {
        assert!(super::host_caps(false).task_clock);
    }
}
