//! Which events the precise backend counts, and by how much for each retired instruction
//! (the cost model and filters are documented in the README, "The precise backend").
use super::cache::CacheEvents;
use emon_pmu::pmu::netburst::{self, Selection};
use emon_pmu::pmu::{CounterId, CounterState};
use emon_pmu::profile::{ArchEvent, Clock, Event};
use emon_x86::insn::{Flow, Insn, Transfer};

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
    /// NetBurst branch_retired: the retired branches whose (taken, mispredicted) class is in the
    /// event mask (bit 0 MMNP, 1 MMNM, 2 MMTP, 3 MMTM), against the static predictor.
    NetBurstBranches(u8),
    /// NetBurst retired_branch_type (`mispredicted`: retired_mispred_branch_type): near branches
    /// whose type is in the event mask (bit 1 CONDITIONAL, 2 CALL, 3 RETURN, 4 INDIRECT; an
    /// indirect CALL is both CALL and INDIRECT, and counts once); direct JMPs and far transfers
    /// are none of these types.
    NetBurstBranchType {
        mask: u8,
        mispredicted: bool,
    },
    /// An event the model has none of: bogus (wrong-path) or tagged µops on NetBurst, where emon
    /// runs no wrong path and tags nothing. Counts zero, exactly.
    Nothing,
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

    /// The model of the NetBurst event `s` selects (SDM Table 19-33): instr_retired NBOGUSNTAG is
    /// the instructions, mispred_branch_retired NBOGUS the mispredicted branches, branch_retired
    /// the branches of the mask's classes, global_power_events RUNNING the core cycles.
    pub fn of_netburst(s: Selection) -> Model {
        let Some(e) = netburst::event(s) else { return Model::Unsupported };
        let bit0 = s.mask & 1 != 0;
        match e.name {
            "instr_retired" if bit0 => Model::Instructions,
            "mispred_branch_retired" if bit0 => Model::BranchMisses,
            "global_power_events" if bit0 => Model::CoreCycles,
            "branch_retired" if s.mask & 0xF != 0 => Model::NetBurstBranches((s.mask & 0xF) as u8),
            "retired_branch_type" | "retired_mispred_branch_type" if s.mask & 0x1E != 0 => {
                Model::NetBurstBranchType { mask: (s.mask & 0x1E) as u8, mispredicted: e.event == 0x05 }
            }
            _ => Model::Nothing,
        }
    }

    /// The model of what counter state `c` counts.
    pub fn of_counter(c: &CounterState) -> Model {
        match c.netburst {
            Some(s) => Model::of_netburst(s),
            None if matches!(c.id, CounterId::NetBurst(_)) => Model::Unsupported,
            None => Model::of(c.id, c.event_select, c.umask),
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
            Model::NetBurstBranches(mask) => {
                let class = 2 * u8::from(taken) + u8::from(mispredicted(i, rip, taken));
                u64::from(i.branch && mask >> class & 1 != 0)
            }
            Model::NetBurstBranchType { mask, mispredicted: m } => {
                let types = match i.transfer {
                    Some(Transfer::Conditional) => 1 << 1,
                    Some(Transfer::RelCall) => 1 << 2,
                    Some(Transfer::IndCall) => 1 << 2 | 1 << 4,
                    Some(Transfer::Ret) => 1 << 3,
                    Some(Transfer::IndJmp) => 1 << 4,
                    Some(Transfer::RelJmp | Transfer::Far) | None => 0,
                };
                u64::from(types & mask != 0 && (!m || mispredicted(i, rip, taken)))
            }
            Model::Nothing => 0,
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
        Armed { id: c.id, model: Model::of_counter(c), usr: c.usr, os: c.os, cmask: c.cmask, inv: c.inv, edge: c.edge }
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
    fn maps_the_netburst_events() {
        let sel = |escr, event, mask| Selection { escr, event, mask };
        assert_eq!(Model::of_netburst(sel(0x3B8, 2, 1)), Model::Instructions);
        assert_eq!(Model::of_netburst(sel(0x3B9, 2, 0b1110)), Model::Nothing, "bogus and tagged");
        assert_eq!(Model::of_netburst(sel(0x3CC, 2, 1)), Model::Unsupported, "instr_retired is a CRU_ESCR0/1 event");
        assert_eq!(Model::of_netburst(sel(0x3B9, 3, 1)), Model::BranchMisses);
        assert_eq!(Model::of_netburst(sel(0x3A3, 0x13, 1)), Model::CoreCycles);
        assert_eq!(Model::of_netburst(sel(0x3CD, 6, 0xC)), Model::NetBurstBranches(0xC));
        assert_eq!(Model::of_netburst(sel(0x3A0, 5, 1)), Model::Unsupported);
        // branch_retired by class: a backward JNZ is predicted taken (static predictor).
        let back = decode(&[0x75, 0xFE], 0x1000, 64).unwrap();
        let taken_only = Model::NetBurstBranches(0b0100);
        assert_eq!(taken_only.increment(&back, 0x1000, true), 1, "MMTP");
        assert_eq!(taken_only.increment(&back, 0x1000, false), 0, "MMNM");
        assert_eq!(Model::NetBurstBranches(0b0010).increment(&back, 0x1000, false), 1);
        let nop = decode(&[0x90], 0, 64).unwrap();
        assert_eq!(Model::NetBurstBranches(0xF).increment(&nop, 0, false), 0);
        // retired_branch_type / retired_mispred_branch_type by type.
        let types = |mask| Model::of_netburst(sel(0x3C2, 4, mask));
        let call_ind = decode(&[0xFF, 0xD0], 0, 64).unwrap(); // call rax
        let ret = decode(&[0xC3], 0, 64).unwrap();
        let jmp = decode(&[0xEB, 0x10], 0, 64).unwrap();
        assert_eq!(types(1 << 1).increment(&back, 0x1000, true), 1, "CONDITIONAL");
        assert_eq!(types(1 << 2).increment(&call_ind, 0, true), 1, "CALL");
        assert_eq!(types(1 << 2 | 1 << 4).increment(&call_ind, 0, true), 1, "an indirect call counts once");
        assert_eq!(types(1 << 3).increment(&ret, 0, true), 1, "RETURN");
        assert_eq!(types(0x1E).increment(&jmp, 0, true), 0, "a direct JMP has none of the types");
        assert_eq!(types(1), Model::Nothing, "bit 0 alone selects no type");
        let mispred = Model::of_netburst(sel(0x3C3, 5, 1 << 1));
        assert_eq!(mispred.increment(&back, 0x1000, false), 1, "the loop's fall-through is mispredicted");
        assert_eq!(mispred.increment(&back, 0x1000, true), 0);
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
