//! Randomized property test: thousands of random MSR accesses and backend calls per profile,
//! checking invariants after each step.

use super::*;

/// Knuth's MMIX linear congruential generator.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        // Mix the high bits down: the low bits of an LCG are weak.
        self.0 ^ (self.0 >> 29)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A random MSR index: usually a trapped one, sometimes anything.
fn random_msr(rng: &mut Lcg) -> u32 {
    if rng.below(10) == 0 {
        return rng.next() as u32;
    }
    let ranges = Pmu::TRAPPED_MSRS;
    let (lo, hi) = ranges[rng.below(ranges.len() as u64) as usize];
    // Occasionally step just outside the range.
    let span = u64::from(hi - lo) + 3;
    (u64::from(lo) + rng.below(span)).wrapping_sub(1) as u32
}

/// A random value biased toward interesting bit patterns.
fn random_value(rng: &mut Lcg, pmu: &Pmu) -> u64 {
    match rng.below(8) {
        0 => 0,
        1 => u64::MAX,
        2 => 1u64 << rng.below(64),
        3 => rng.next() & 0xFFFF_FFFF,
        // A plausible value: the current one with one bit flipped.
        4 | 5 => {
            let msr = random_msr(rng);
            pmu.rdmsr(msr).unwrap_or(0) ^ (1u64 << rng.below(64))
        }
        6 => rng.next() & 0x00FF_FFFF,
        _ => rng.next(),
    }
}

/// INUSE recomputed independently from the readable registers.
fn expected_inuse(pmu: &Pmu) -> u64 {
    let mut inuse = 0;
    let mut pmi = pmu.pebs_enable() != 0;
    for id in pmu.counter_ids() {
        let s = pmu.counter(id);
        let in_use = match id {
            CounterId::Gp(_) => s.event_select != 0,
            CounterId::Fixed(_) => s.enabled,
            CounterId::NetBurst(_) => unreachable!("architectural profiles only"),
        };
        if in_use {
            inuse |= 1u64 << id.status_bit();
        }
        pmi |= s.int;
    }
    if pmi {
        inuse |= 1 << 63;
    }
    inuse
}

fn check_invariants(pmu: &Pmu, ctx: &str) {
    let p = pmu.profile();
    for id in pmu.counter_ids() {
        let s = pmu.counter(id);
        let mask = counter::width_mask(s.width);
        assert_eq!(s.value & !mask, 0, "{ctx}: {id} value {:#x} exceeds width {}", s.value, s.width);
        let global = p.version == 1 || pmu.global_ctrl() & (1 << id.status_bit()) != 0;
        assert_eq!(s.counting, s.enabled && global && !pmu.frozen(), "{ctx}: {id} counting");
        let msr = match id {
            CounterId::Gp(i) => msr::IA32_PMC0 + u32::from(i),
            CounterId::Fixed(i) => msr::IA32_FIXED_CTR0 + u32::from(i),
            CounterId::NetBurst(i) => netburst::MSR_BPU_COUNTER0 + u32::from(i),
        };
        assert_eq!(pmu.rdmsr(msr), Ok(s.value), "{ctx}: {id} rdmsr");
        assert!(pmu.distance_to_overflow(id) >= 1);
    }
    let inuse = expected_inuse(pmu);
    assert_eq!(pmu.global_inuse(), inuse, "{ctx}: INUSE");
    if p.version >= 4 {
        assert_eq!(pmu.rdmsr(msr::IA32_PERF_GLOBAL_INUSE), Ok(inuse), "{ctx}: INUSE rdmsr");
    }
    if p.version >= 2 {
        let l = regs::Layout::new(p);
        assert_eq!(pmu.global_ctrl() & !l.global_ctrl_valid, 0, "{ctx}: GLOBAL_CTRL");
        assert_eq!(pmu.fixed_ctr_ctrl() & !l.fixed_ctr_ctrl_valid, 0, "{ctx}: FIXED_CTR_CTRL");
        // CondChgd is never set and ASCI never exists.
        assert_eq!(pmu.global_status() & (1 << 63 | 1 << 60), 0, "{ctx}: STATUS");
    }
    if p.version < 4 {
        assert!(!pmu.frozen());
    }
    let misc = pmu.misc_enable();
    assert_eq!(misc & (1 << 11 | 1 << 12), 1 << 11 | 1 << 12, "{ctx}: MISC_ENABLE RO bits");
    assert_eq!(misc & (1 << 7) != 0, p.misc_enable_perfmon, "{ctx}: MISC_ENABLE[7]");
    assert!(counter::is_canonical_48(pmu.ds_area()));
}

#[test]
fn random_accesses_keep_invariants() {
    let mut rng = Lcg(0x0123_4567_89AB_CDEF);
    for (name, p) in all_profiles() {
        let mut pmu = Pmu::new(&p);
        let ids = pmu.counter_ids();
        let (mut writes_ok, mut faults) = (0u32, 0u32);
        for step in 0..20_000 {
            let ctx = format!("{name} step {step}");
            match rng.below(10) {
                0..=5 => {
                    let msr = random_msr(&mut rng);
                    let value = random_value(&mut rng, &pmu);
                    let before = pmu.clone();
                    match pmu.wrmsr(msr, value) {
                        Ok(()) => {
                            writes_ok += 1;
                            assert!(Pmu::owns(msr), "{ctx}: wrote unowned {msr:#x}");
                            assert!(pmu.rdmsr(msr).is_ok(), "{ctx}: {msr:#x} writable, not readable");
                        }
                        Err(GpFault) => {
                            faults += 1;
                            assert_eq!(pmu, before, "{ctx}: #GP on wrmsr({msr:#x}, {value:#x}) changed state");
                        }
                    }
                }
                6 | 7 => {
                    let msr = random_msr(&mut rng);
                    let before = pmu.clone();
                    if pmu.rdmsr(msr).is_ok() {
                        assert!(Pmu::owns(msr));
                    }
                    assert_eq!(pmu, before);
                }
                8 => {
                    if !ids.is_empty() {
                        let id = ids[rng.below(ids.len() as u64) as usize];
                        let n = match rng.below(3) {
                            0 => pmu.distance_to_overflow(id),
                            1 => rng.below(1000),
                            _ => rng.next(),
                        };
                        let before = pmu.counter(id);
                        let overflowed = pmu.add_events(id, n);
                        let expect = counter::add_events(before.value, n, before.width);
                        assert_eq!((pmu.counter(id).value, overflowed), expect, "{ctx}: add_events");
                        if overflowed && p.version >= 2 {
                            assert_ne!(pmu.global_status() & (1 << id.status_bit()), 0, "{ctx}");
                        }
                        if overflowed && before.int {
                            assert!(pmu.pmi_pending(), "{ctx}: PMI");
                        }
                    }
                }
                _ => pmu.pmi_delivered(),
            }
            check_invariants(&pmu, &ctx);
        }
        assert!(faults > 0, "{name}");
        if p.version > 0 {
            assert!(writes_ok > 100, "{name}: only {writes_ok} writes succeeded");
        }
    }
}

#[test]
fn arbitrary_msr_indices_never_panic() {
    let mut rng = Lcg(42);
    for (_, p) in all_profiles() {
        let mut pmu = Pmu::new(&p);
        for _ in 0..20_000 {
            let msr = rng.next() as u32;
            let value = rng.next();
            let _ = pmu.rdmsr(msr);
            let before = pmu.clone();
            if pmu.wrmsr(msr, value).is_err() {
                assert_eq!(pmu, before);
            }
            if pmu.rdmsr(msr).is_ok() {
                assert!(Pmu::owns(msr), "{msr:#x} readable but not trapped");
            }
        }
        // Every u32 boundary of every range.
        for &(lo, hi) in Pmu::TRAPPED_MSRS {
            for msr in [lo.wrapping_sub(1), lo, hi, hi.wrapping_add(1)] {
                let _ = pmu.rdmsr(msr);
                let _ = pmu.wrmsr(msr, u64::MAX);
            }
        }
    }
}
