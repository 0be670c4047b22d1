//! What `emon events` lists: the events a profile's PMU model names, in sections (the
//! architectural events, the CPU's model-specific list, or the NetBurst events), each row with
//! what a backend counts for it.

use super::{Profile, ARCH_EVENTS};
use crate::events::{EventList, ModelEvent};
use crate::pmu::{CounterId, Fidelity, Semantics};

/// One section of `emon events`: a title, the columns, one row per event (its text and what it
/// counts, to which a backend adds how it counts it) and notes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventListing {
    pub title: String,
    pub columns: String,
    pub rows: Vec<Listed>,
    pub notes: Vec<String>,
}

/// One row of [`EventListing`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub text: String,
    pub semantics: Semantics,
    /// The event is defined with CMASK, INV or EDGE, which compare per cycle on silicon and per
    /// retired instruction in emon: its count is a model of silicon's even where the event it
    /// filters is exact.
    pub filtered: bool,
}

impl Listed {
    fn new(text: String, semantics: Semantics) -> Listed {
        Listed { text, semantics, filtered: false }
    }

    /// How exactly a backend that derives events from the instruction stream counts it.
    pub fn fidelity(&self) -> Fidelity {
        match self.semantics.fidelity() {
            Fidelity::Exact if self.filtered => Fidelity::Modelled,
            f => f,
        }
    }
}

/// The sections for `p`'s PMU model.
pub fn event_listing(p: &Profile) -> Vec<EventListing> {
    if p.pmu.netburst() {
        return vec![netburst_listing(p)];
    }
    let mut sections = vec![arch_listing(p)];
    if p.pmu.version >= 1 {
        sections.push(model_listing(p));
    }
    sections
}

/// The architectural events (SDM Table 18-1), with what CPUID says of each.
fn arch_listing(p: &Profile) -> EventListing {
    let title = format!(
        "architectural events under profile {} (CPUID.0AH EBX length {}, EBX {:#x}):",
        p.name, p.pmu.ebx_length, p.pmu.ebx_unavailable
    );
    let columns = format!("{:<3} {:<28} {:<12} {:<10} {:<16}", "bit", "event", "select/umask", "fixed", "CPUID");
    let rows = ARCH_EVENTS
        .iter()
        .map(|e| {
            let cpuid = if e.bit >= p.pmu.ebx_length {
                "not enumerated"
            } else if p.pmu.arch_event_available(e.bit) {
                "available"
            } else {
                "unavailable"
            };
            let fixed = match e.fixed {
                Some(i) if p.pmu.fixed_supported(i) => format!("FIXED_CTR{i}"),
                _ => "-".into(),
            };
            let text = format!(
                "{:<3} {:<28} {:<12} {:<10} {:<16}",
                e.bit,
                e.name,
                format!("{:#04x}/{:#04x}", e.event_select, e.umask),
                fixed,
                cpuid
            );
            Listed::new(text, crate::pmu::arch_semantics(CounterId::Gp(0), e.event_select, e.umask))
        })
        .collect();
    EventListing { title, columns, rows, notes: Vec::new() }
}

/// Rows that share an encoding and a qualifier MSR, named by one prefix, beyond this many are
/// listed as one (Skylake's 260 OFFCORE_RESPONSE settings of MSR_OFFCORE_RSP_0).
const COLLAPSE_OVER: usize = 16;

/// The CPU's model-specific events, each with the counters it counts on and how emon counts it.
fn model_listing(p: &Profile) -> EventListing {
    let columns = format!("{:<52} {:<22} {:<10} {:<4}", "event", "encoding", "counters", "PEBS");
    let Some(list) = p.pmu.events else {
        let title = format!(
            "model-specific events under profile {}: none; emon ships the lists of Core 2, Nehalem, Sandy Bridge, Skylake and Ice Lake (family 6), and this profile's CPU (vendor {}, family {:#x}, model {:#x}) has none of them",
            p.name, p.vendor, p.family, p.model
        );
        let notes = vec!["Any event select/umask that is not architectural counts 0 under the precise backend, and the run summary says NOT EXACT.".into()];
        return EventListing { title, columns, rows: Vec::new(), notes };
    };
    let title = format!("model-specific events of {} under profile {} (from {}):", list.cpu, p.name, list.source);
    let mut rows = Vec::new();
    let mut done = vec![false; list.events.len()];
    for (k, e) in list.events.iter().enumerate() {
        if done[k] {
            continue;
        }
        let group: Vec<usize> = (k..list.events.len())
            .filter(|&j| {
                let o = &list.events[j];
                e.msr.is_some()
                    && (o.select, o.umask, o.msr.map(|m| m.0)) == (e.select, e.umask, e.msr.map(|m| m.0))
                    && prefix(o.name) == prefix(e.name)
            })
            .collect();
        let name = if group.len() > COLLAPSE_OVER {
            group.iter().for_each(|&j| done[j] = true);
            let (msr, _) = e.msr.unwrap_or_default();
            format!("{}.* ({} events: MSR {msr:#x} settings)", prefix(e.name), group.len())
        } else {
            e.name.to_string()
        };
        let text = format!("{:<52} {:<22} {:<10} {:<4}", name, e.encoding(), counters(e.counters), pebs(e.pebs));
        let filtered = e.cmask != 0 || e.inv || e.edge;
        rows.push(Listed { text, semantics: row_semantics(list, e, p), filtered });
    }
    let notes = vec![
        "An event counts only on the counters its list gives it: programmed on another, it counts 0 and the run summary says NOT EXACT (silicon's count is undefined there).".into(),
        "Not counted: 0, and a run whose counter counts one says NOT EXACT with the event's name; so does any encoding the list does not name.".into(),
        "CMASK, INV, EDGE, USR/OS and ANY apply to every event as on the architectural ones, per retired instruction (README, \"Model-specific events\").".into(),
    ];
    EventListing { title, columns, rows, notes }
}

/// The first component of an event's name (`OFFCORE_RESPONSE` of `OFFCORE_RESPONSE.DEMAND...`).
fn prefix(name: &str) -> &str {
    name.split('.').next().unwrap_or(name)
}

/// What the backend counts for event `e` of `list` on the first counter the list gives it.
fn row_semantics(list: &'static EventList, e: &ModelEvent, p: &Profile) -> Semantics {
    if e.msr.is_some() {
        // Qualified by an MSR (OFFCORE_RSP, PEBS_LD_LAT, PEBS_FRONTEND) emon does not apply.
        return Semantics::Unsupported;
    }
    if e.fixed_only() {
        let i = (0..4u8).find(|&i| e.counters & 1 << (32 + i) != 0).unwrap_or(0);
        let fixed = crate::profile::ArchEvent::fixed(i);
        return fixed.map_or(Semantics::Unsupported, |f| {
            crate::pmu::arch_semantics(CounterId::Fixed(i), f.event_select, f.umask)
        });
    }
    let Some(counter) = (0..8u8).find(|&i| e.on_gp(i) && i < p.pmu.gp.max(1)) else {
        return Semantics::WrongCounter;
    };
    let arch = crate::pmu::arch_semantics(CounterId::Gp(counter), e.select, e.umask.unwrap_or(0));
    if arch != Semantics::Unsupported && e.umask.is_some() {
        return arch;
    }
    match e.umask {
        Some(umask) => list
            .lookup(counter, e.select, umask, e.cmask, e.inv, e.edge)
            .map_or(Semantics::Unsupported, |l| l.semantics),
        None => Semantics::Unsupported,
    }
}

/// The counters of a [`ModelEvent`]: `0-3`, `1`, `0,2,3`, `FIXED_CTR0`.
fn counters(bits: u64) -> String {
    let fixed: Vec<String> = (0..4).filter(|i| bits & 1 << (32 + i) != 0).map(|i| format!("FIXED_CTR{i}")).collect();
    if !fixed.is_empty() {
        return fixed.join(",");
    }
    if bits & 0xFF == 0xFF {
        return "any".into();
    }
    let gp: Vec<u32> = (0..8).filter(|i| bits & 1 << i != 0).collect();
    match (gp.first(), gp.last()) {
        (Some(&a), Some(&b)) if gp.len() > 2 && (b - a) as usize + 1 == gp.len() => format!("{a}-{b}"),
        _ => gp.iter().map(u32::to_string).collect::<Vec<_>>().join(","),
    }
}

fn pebs(p: u8) -> &'static str {
    match p {
        0 => "-",
        1 => "yes",
        _ => "dist",
    }
}

/// `emon events` under a NetBurst profile: the events the precise backend derives, by ESCR and
/// event-mask bit, and that every other event counts 0.
fn netburst_listing(p: &Profile) -> EventListing {
    use crate::pmu::netburst::{self, Selection, EVENTS};
    let title = format!("NetBurst events under profile {} ({}), SDM Table 19-33:", p.name, p.description);
    let columns = format!("{:<28} {:<32} {:<6} {:<14}", "event", "ESCRs", "select", "mask bit");
    let mut rows = Vec::new();
    for e in EVENTS {
        let escrs = e.escrs.map(|m| netburst::msr_name(m).unwrap_or("?")).join(", ");
        for (bit, name) in e.mask_bits.iter().enumerate() {
            let s = Selection { escr: e.escrs[0], event: e.event, mask: 1 << bit };
            rows.push(Listed::new(
                format!("{:<28} {:<32} {:#04x}   {bit:<2} {name:<11}", e.name, escrs, e.event),
                netburst::semantics(s),
            ));
        }
    }
    let notes = vec![
        "Any other ESCR event counts 0 under the precise backend, and the run summary says NOT EXACT when a counter counts one.".into(),
        "CCCR filters (COMPARE, COMPLEMENT, THRESHOLD, EDGE) apply per retired instruction; T0_OS/T0_USR by CPL; the T1 bits, \
         OVF_PMI_T1 and active-thread 10B (both threads) never count: emon runs logical processor 0 only. \
         The perf backend cannot count the NetBurst PMU and refuses it (README, \"The NetBurst PMU\").".into(),
    ];
    EventListing { title, columns, rows, notes }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(profile: &str) -> Vec<Listed> {
        let p = Profile::load(profile).expect("built in");
        event_listing(&p).into_iter().flat_map(|s| s.rows).collect()
    }

    fn listed(profile: &str, event: &str) -> Listed {
        rows(profile)
            .into_iter()
            .find(|r| r.text.split_whitespace().next() == Some(event))
            .unwrap_or_else(|| panic!("{event} under {profile}"))
    }

    fn row(profile: &str, event: &str) -> Semantics {
        listed(profile, event).semantics
    }

    #[test]
    fn every_profile_with_a_pmu_lists_its_cpus_events() {
        assert_eq!(row("skylake", "BR_INST_RETIRED.CONDITIONAL").fidelity(), Fidelity::Exact);
        assert_eq!(row("skylake", "MEM_LOAD_RETIRED.L1_MISS").fidelity(), Fidelity::Modelled);
        assert_eq!(row("skylake", "UOPS_ISSUED.ANY").fidelity(), Fidelity::NotCounted);
        assert_eq!(row("skylake", "INST_RETIRED.ANY").fidelity(), Fidelity::Exact, "fixed counter 0");
        assert_eq!(row("nehalem", "MEM_INST_RETIRED.LOADS").fidelity(), Fidelity::Exact);
        assert_eq!(row("core2", "L1D_CACHE_LD.MESI").fidelity(), Fidelity::Modelled);
        assert_eq!(row("core2", "MEM_LOAD_RETIRED"), Semantics::Unsupported);
        assert_eq!(row("icelake", "FP_ARITH_INST_RETIRED.512B_PACKED_SINGLE").fidelity(), Fidelity::Exact);
        assert_eq!(row("sandybridge", "MEM_UOPS_RETIRED.ALL_LOADS").fidelity(), Fidelity::Modelled);
        // Skylake's 260 OFFCORE_RESPONSE settings of each MSR are one row each.
        let offcore: Vec<String> =
            rows("skylake").into_iter().map(|r| r.text).filter(|t| t.starts_with("OFFCORE_RESPONSE.*")).collect();
        assert_eq!(offcore.len(), 2, "{offcore:?}");
        assert!(offcore[0].contains("MSR 0x1a6") || offcore[1].contains("MSR 0x1a6"), "{offcore:?}");
        // Counters as the list gives them.
        let prec = listed("skylake", "INST_RETIRED.PREC_DIST");
        assert_eq!(prec.text.split_whitespace().nth(2), Some("1"), "{}", prec.text);
        // An event defined with CMASK/INV counts per instruction: a model of silicon's cycles.
        let total = listed("skylake", "INST_RETIRED.TOTAL_CYCLES_PS");
        assert!(total.filtered && total.semantics == Semantics::Instructions);
        assert_eq!(total.fidelity(), Fidelity::Modelled);
        assert_eq!(counters(0x0D), "0,2,3");
        assert_eq!(counters(0x0F), "0-3");
        assert_eq!(counters(0xFF), "any");
        assert_eq!(counters(1 << 33), "FIXED_CTR1");
    }

    #[test]
    fn a_cpu_without_a_list_says_so() {
        let mut p = Profile::load("skylake").expect("built in");
        p.apply_overrides("model=0x3C").expect("Haswell");
        let sections = event_listing(&p);
        assert_eq!(sections.len(), 2);
        assert!(sections[1].rows.is_empty() && sections[1].title.contains("has none of them"), "{}", sections[1].title);
        assert_eq!(event_listing(&Profile::load("pentium4").expect("built in")).len(), 1);
        assert_eq!(event_listing(&Profile::load("no-pmu").expect("built in")).len(), 1);
    }
}
