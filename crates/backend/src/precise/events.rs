//! Which events the precise backend counts, and by how much for each retired instruction
//! (the cost model and filters are documented in the README, "The precise backend").
use super::cache::CacheEvents;
use emon_pmu::pmu::{CounterId, CounterState};
use emon_pmu::profile::{ArchEvent, Clock, Event};
use emon_x86::insn::{Flow, Insn};

/// Topdown slots per core cycle in the model (a 4-wide machine).
pub const SLOTS_PER_CYCLE: u64 = 4;

/// What a counter's event means to the precise backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Model {
    /// 0xC0/0x00 INST_RETIRED.ANY_P, fixed counter 0.
    Instructions,
    /// 0xC4/0x00 BR_INST_RETIRED.ALL_BRANCHES.
    Branches,
    /// 0xC5/0x00 BR_MISP_RETIRED.ALL_BRANCHES, against a static backward-taken predictor.
    BranchMisses,
    /// 0x3C/0x00 CPU_CLK_UNHALTED.THREAD_P, fixed counter 1: the cost model.
    CoreCycles,
    /// Fixed counter 2, CPU_CLK_UNHALTED.REF_TSC: counts at the TSC's rate (SDM 18.2.2, Table
    /// 18-2). The model core runs at the TSC's frequency, so this equals core cycles.
    RefTsc,
    /// 0x3C/0x01 on a GP counter, UnHalted Reference Cycles: ticks of the reference clock, one
    /// per `tsc-per-ref` TSC ticks (the profile's [`Clock`], CPUID 0x15). The model core runs at
    /// the TSC's frequency, so a core cycle is a TSC tick, and the reference clock's phase is the
    /// model clock: the core cycles of every instruction emon has counted since the VM started
    /// (deterministic, unlike the host's TSC).
    RefXclk,
    /// 0xA4/0x01 TOPDOWN.SLOTS, fixed counter 3.
    Slots,
    /// 0x2E/0x4F LLC Reference and 0x2E/0x41 LLC Misses: the cache model's LLC lookups and
    /// misses for the instruction's data accesses (README, "The cache model").
    LlcReference,
    LlcMisses,
    /// Anything else counts zero.
    Unsupported,
}

impl Model {
    /// The model of the event counter `id` counts, as its PERFEVTSELx (or the fixed counter's
    /// architectural event) selects it.
    pub fn of(id: CounterId, event_select: u8, umask: u8) -> Model {
        match ArchEvent::of(event_select, umask).map(|e| e.event) {
            Some(Event::Instructions) => Model::Instructions,
            Some(Event::Branches) => Model::Branches,
            Some(Event::BranchMisses) => Model::BranchMisses,
            Some(Event::CoreCycles) => Model::CoreCycles,
            Some(Event::RefCycles) if matches!(id, CounterId::Fixed(_)) => Model::RefTsc,
            Some(Event::RefCycles) => Model::RefXclk,
            Some(Event::LlcReference) => Model::LlcReference,
            Some(Event::LlcMisses) => Model::LlcMisses,
            Some(Event::TopdownSlots) => Model::Slots,
            None => Model::Unsupported,
        }
    }

    /// The event count for one retired instruction that follows from the instruction alone;
    /// [`Model::dynamic`] adds what depends on the reference clock and the cache model.
    pub fn increment(self, i: &Insn, rip: u64, taken: bool) -> u64 {
        match self {
            Model::Instructions => 1,
            Model::Branches => u64::from(i.branch),
            Model::BranchMisses => u64::from(mispredicted(i, rip, taken)),
            Model::CoreCycles | Model::RefTsc => cycles(i, taken),
            Model::Slots => SLOTS_PER_CYCLE * cycles(i, taken),
            Model::RefXclk | Model::LlcReference | Model::LlcMisses | Model::Unsupported => 0,
        }
    }

    /// The part of the count that depends on more than the instruction: `ref_ticks` reference
    /// clock ticks passed while it ran, and what its data accesses did in the cache model.
    pub fn dynamic(self, ref_ticks: u64, cache: CacheEvents) -> u64 {
        match self {
            Model::RefXclk => ref_ticks,
            Model::LlcReference => cache.llc_references,
            Model::LlcMisses => cache.llc_misses,
            _ => 0,
        }
    }

    /// The most [`Model::dynamic`] can add for code of `cycles` core cycles (TSC ticks of the
    /// model) whose data accesses touch at most `lines` cache lines.
    pub fn dynamic_bound(self, cycles: u64, lines: u64, clock: Clock) -> u64 {
        match self {
            Model::RefXclk => clock.ref_ticks_at(cycles) + 1,
            Model::LlcReference | Model::LlcMisses => lines,
            _ => 0,
        }
    }

    /// The event comes from the cache model, which then sees every data access.
    pub fn uses_cache(self) -> bool {
        matches!(self, Model::LlcReference | Model::LlcMisses)
    }
}

/// Core cycles of one retired instruction: 1, +1 per explicit memory operand, +1 when a branch
/// is taken, plus the class cost (MUL/IMUL 2, DIV/IDIV 20, instructions that exit to the VMM 100).
pub fn cycles(i: &Insn, taken: bool) -> u64 {
    1 + u64::from(i.mem_operands) + u64::from(taken) + u64::from(i.class_cycles)
}

/// A static predictor: conditional branches predicted taken when backward, not taken when
/// forward; everything else predicted correctly.
pub fn mispredicted(i: &Insn, rip: u64, taken: bool) -> bool {
    match i.flow {
        Flow::Direct { target, conditional: true } => (target <= rip) != taken,
        _ => false,
    }
}

/// A counting counter as the precise backend applies it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Armed {
    pub id: CounterId,
    pub model: Model,
    pub usr: bool,
    pub os: bool,
    pub cmask: u8,
    pub inv: bool,
    pub edge: bool,
}

impl Armed {
    pub fn new(c: &CounterState) -> Armed {
        Armed {
            id: c.id,
            model: Model::of(c.id, c.event_select, c.umask),
            usr: c.usr,
            os: c.os,
            cmask: c.cmask,
            inv: c.inv,
            edge: c.edge,
        }
    }

    /// How much the counter advances for an instruction with event count `n` retired at `cpl`.
    /// `last` holds the CMASK condition of the previous counted instruction, for edge detect.
    /// (SDM 18.2.1.1: CMASK compares the per-cycle count; here the unit is one instruction.)
    pub fn advance(&self, n: u64, cpl: u8, last: &mut bool) -> u64 {
        if !(if cpl == 0 { self.os } else { self.usr }) {
            return 0;
        }
        if self.cmask == 0 {
            return n;
        }
        let cond = (n >= u64::from(self.cmask)) != self.inv;
        let rising = cond && !*last;
        *last = cond;
        u64::from(if self.edge { rising } else { cond })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use emon_x86::insn::decode;

    fn armed(model: Model) -> Armed {
        Armed { id: CounterId::Gp(0), model, usr: true, os: true, cmask: 0, inv: false, edge: false }
    }

    #[test]
    fn maps_the_architectural_events() {
        let gp = CounterId::Gp(0);
        assert_eq!(Model::of(gp, 0xC0, 0), Model::Instructions);
        assert_eq!(Model::of(gp, 0x3C, 1), Model::RefXclk);
        assert_eq!(Model::of(CounterId::Fixed(2), 0x3C, 1), Model::RefTsc);
        assert_eq!(Model::of(gp, 0x2E, 0x4F), Model::LlcReference);
        assert_eq!(Model::of(gp, 0x2E, 0x41), Model::LlcMisses);
        assert_eq!(Model::of(gp, 0x2E, 0x3F), Model::Unsupported);
    }

    #[test]
    fn reference_cycles_are_bounded_by_the_clock() {
        let c = Clock { tsc_per_ref_numerator: 334, tsc_per_ref_denominator: 2, ..Clock::TSC };
        assert_eq!(Model::RefXclk.dynamic_bound(167 * 3, 9, c), 4);
        let cache = CacheEvents { llc_references: 3, llc_misses: 2 };
        assert_eq!(Model::RefXclk.dynamic(7, cache), 7);
        assert_eq!(Model::LlcReference.dynamic(7, cache), 3);
        assert_eq!(Model::LlcMisses.dynamic(7, cache), 2);
        assert_eq!(Model::LlcMisses.dynamic_bound(100, 9, c), 9);
        assert_eq!(Model::CoreCycles.dynamic(7, cache), 0);
    }

    #[test]
    fn cost_model() {
        let nop = decode(&[0x90], 0, 64).unwrap();
        let load = decode(&[0x48, 0x8B, 0x03], 0, 64).unwrap();
        let div = decode(&[0x48, 0xF7, 0xF1], 0, 64).unwrap();
        let jnz_back = decode(&[0x75, 0xFE], 0x1000, 64).unwrap();
        assert_eq!(cycles(&nop, false), 1);
        assert_eq!(cycles(&load, false), 2);
        assert_eq!(cycles(&div, false), 21);
        assert_eq!(cycles(&jnz_back, true), 2);
        assert_eq!(Model::Slots.increment(&nop, 0, false), 4);
    }

    #[test]
    fn static_predictor_mispredicts() {
        let back = decode(&[0x75, 0xFE], 0x1000, 64).unwrap();
        let fwd = decode(&[0x75, 0x10], 0x1000, 64).unwrap();
        assert_eq!(Model::BranchMisses.increment(&back, 0x1000, true), 0);
        assert_eq!(Model::BranchMisses.increment(&back, 0x1000, false), 1);
        assert_eq!(Model::BranchMisses.increment(&fwd, 0x1000, false), 0);
        assert_eq!(Model::BranchMisses.increment(&fwd, 0x1000, true), 1);
    }

    #[test]
    fn usr_os_cmask_inv_edge() {
        let mut last = false;
        let mut a = armed(Model::CoreCycles);
        a.usr = false;
        assert_eq!(a.advance(5, 3, &mut last), 0);
        assert_eq!(a.advance(5, 0, &mut last), 5);
        a.cmask = 2;
        assert_eq!(a.advance(1, 0, &mut last), 0);
        assert_eq!(a.advance(3, 0, &mut last), 1);
        a.inv = true;
        assert_eq!(a.advance(1, 0, &mut last), 1);
        a.inv = false;
        a.edge = true;
        let mut last = false;
        assert_eq!(a.advance(3, 0, &mut last), 1);
        assert_eq!(a.advance(3, 0, &mut last), 0, "no new rising edge");
        assert_eq!(a.advance(1, 0, &mut last), 0);
        assert_eq!(a.advance(3, 0, &mut last), 1);
    }
}
