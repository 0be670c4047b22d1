//! The NetBurst PMU through the `Pmu` API a backend uses: counter state, reprogramming marks,
//! overflow, the PMI and RDPMC.

use super::*;
use crate::profile::{PmuKind, Profile};

const CRU_ESCR0: u32 = 0x3B8;
const IQ_CCCR0: u32 = 0x36C;
const IQ_COUNTER0: u32 = 0x30C;
/// instr_retired NBOGUSNTAG, T0_OS only.
const INSTR_RETIRED_OS: u64 = 2 << 25 | 1 << 9 | netburst::ESCR_T0_OS;
/// Enable, ESCR select 4 (CRU_ESCR0), active thread "any".
const CCCR_CRU0: u64 = netburst::CCCR_ENABLE | 4 << 13 | 3 << 16;

fn pentium4() -> Pmu {
    let p = Profile::load("pentium4").expect("built-in").pmu;
    assert_eq!(p.kind, PmuKind::NetBurst);
    Pmu::new(&p)
}

#[test]
fn a_netburst_counter_decodes_its_cccr_and_escr() {
    let mut pmu = pentium4();
    wr(&mut pmu, CRU_ESCR0, INSTR_RETIRED_OS);
    // COMPARE threshold 2, COMPLEMENT, EDGE, OVF_PMI_T0.
    let cccr = CCCR_CRU0
        | netburst::CCCR_COMPARE
        | netburst::CCCR_COMPLEMENT
        | 2 << 20
        | netburst::CCCR_EDGE
        | netburst::CCCR_OVF_PMI_T0;
    wr(&mut pmu, IQ_CCCR0, cccr);
    let s = pmu.counter(CounterId::NetBurst(12));
    assert!(s.counting && s.enabled && s.int && s.os && !s.usr);
    assert_eq!((s.cmask, s.inv, s.edge, s.width), (3, true, true, 40));
    assert_eq!(s.semantics, Semantics::Instructions);
    assert_eq!(pmu.event_name(CounterId::NetBurst(12)), "MSR_CRU_ESCR0 event 0x02");
    assert_eq!(pmu.counting().len(), 1);
    assert_eq!(CounterId::NetBurst(12).to_string(), "MSR_IQ_COUNTER0");
}

#[test]
fn writes_mark_the_counters_they_change() {
    let mut pmu = pentium4();
    wr(&mut pmu, IQ_CCCR0, CCCR_CRU0);
    assert_eq!(pmu.take_reprogram().counters, 1 << 12);
    // An ESCR write marks the counters whose CCCR selects it.
    wr(&mut pmu, CRU_ESCR0, INSTR_RETIRED_OS);
    assert_eq!(pmu.take_reprogram().counters, 1 << 12);
    wr(&mut pmu, IQ_COUNTER0, 5);
    assert_eq!(pmu.take_reprogram(), Reprogram { counters: 1 << 12, written: 1 << 12 });
    // A #GP (ESCR bit 31) marks nothing and changes nothing.
    assert_wr_gp(&mut pmu, CRU_ESCR0, 1 << 31);
    assert!(pmu.take_reprogram().is_empty());
}

#[test]
fn overflow_pmi_and_cascade_through_the_pmu() {
    let mut pmu = pentium4();
    wr(&mut pmu, CRU_ESCR0, INSTR_RETIRED_OS);
    wr(&mut pmu, IQ_CCCR0, CCCR_CRU0 | netburst::CCCR_OVF_PMI_T0);
    // IQ_COUNTER2 (select 4 = CRU_ESCR1), cascaded from IQ_COUNTER0.
    wr(&mut pmu, 0x3B9, INSTR_RETIRED_OS);
    wr(&mut pmu, 0x36E, CCCR_CRU0 | netburst::CCCR_CASCADE);
    wr(&mut pmu, IQ_COUNTER0, (1 << 40) - 1);
    pmu.take_reprogram();
    assert!(!pmu.counter(CounterId::NetBurst(14)).counting);
    assert_eq!(pmu.distance_to_overflow(CounterId::NetBurst(12)), 1);
    assert!(pmu.add_events(CounterId::NetBurst(12), 1));
    assert!(!pmu.pmi_pending(), "the PMI waits for the next event");
    assert_eq!(rd(&pmu, IQ_CCCR0) & netburst::CCCR_OVF, netburst::CCCR_OVF);
    assert_eq!(pmu.take_reprogram().counters, 1 << 14, "the cascade starts IQ_COUNTER2");
    assert!(pmu.counter(CounterId::NetBurst(14)).counting);
    assert!(!pmu.add_events(CounterId::NetBurst(12), 1));
    assert!(pmu.pmi_pending());
    // RDPMC: ECX = counter index, bit 31 fast read; 18 and up #GP.
    wr(&mut pmu, IQ_COUNTER0, 0x12_3456_789A);
    assert_eq!(pmu.rdpmc(12, 0, false), Ok(0x12_3456_789A));
    assert_eq!(pmu.rdpmc(12 | 1 << 31, 0, false), Ok(0x3456_789A));
    assert_eq!(pmu.rdpmc(18, 0, false), Err(GpFault));
    assert_eq!(pmu.rdpmc(1 << 30, 0, false), Err(GpFault));
}

#[test]
fn the_dump_decodes_the_netburst_registers() {
    let mut pmu = pentium4();
    wr(&mut pmu, CRU_ESCR0, INSTR_RETIRED_OS);
    wr(&mut pmu, IQ_CCCR0, CCCR_CRU0 | netburst::CCCR_OVF_PMI_T0);
    let d = pmu.dump();
    assert!(d.contains("NetBurst PMU: 18 counters x 40 bits"), "{d}");
    assert!(d.contains("MSR_CRU_ESCR0"), "{d}");
    assert!(d.contains("event select=0x02 event mask=0x0001 T0_OS"), "{d}");
    assert!(d.contains("ESCR select 4 (MSR_CRU_ESCR0) active thread 3"), "{d}");
    assert!(d.contains("ENABLE OVF_PMI_T0"), "{d}");
    assert!(d.lines().any(|l| l.starts_with("MSR_IQ_COUNTER0") && l.contains("counting")), "{d}");
}

/// What the guest sets that emon stores without modelling is what the run summary names.
#[test]
fn configurations_emon_does_not_model_are_named() {
    let mut pmu = pentium4();
    // instr_retired on IQ_COUNTER0 through CRU_ESCR0: modelled, nothing to say.
    wr(&mut pmu, CRU_ESCR0, 2 << 25 | 1 << 9 | 0xC);
    wr(&mut pmu, IQ_CCCR0, CCCR_CRU0);
    assert!(pmu.unmodelled().is_empty());
    // OVF_PMI_T1 on an enabled CCCR, Tag Enable (FSB_ESCR0 keeps it; CRU_ESCR0 ignores it), and
    // MSR_DEBUGCTLA.BTS.
    wr(&mut pmu, IQ_CCCR0, CCCR_CRU0 | netburst::CCCR_OVF_PMI_T1);
    wr(&mut pmu, 0x3A2, 0x13 << 25 | 1 << 9 | 0xC | netburst::ESCR_TAG_ENABLE);
    wr(&mut pmu, msr::IA32_DEBUGCTL, 1 << 3);
    let notes = pmu.unmodelled().notes(Unmodelled::DEBUGCTL_LBR);
    assert_eq!(notes.len(), 1, "{notes:?}");
    for what in ["OVF_PMI_T1", "Tag Enable", "MSR_DEBUGCTLA.TR/BTS", "The NetBurst PMU"] {
        assert!(notes[0].contains(what), "{notes:?} lacks {what}");
    }
    // A write that #GPs (ESCR bit 31) changes nothing; DEBUGCTLA has bits 6:0 only.
    assert_wr_gp(&mut pmu, 0x3B9, 1 << 31);
    assert_wr_gp(&mut pmu, msr::IA32_DEBUGCTL, 1 << 7);
}
