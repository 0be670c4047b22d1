//! The branch recorder: every taken branch the guest makes while the LBR stack records (SDM
//! 17.4.8, with MSR_LER_FROM_LIP/TO_LIP) or the BTS buffer takes records (17.4.9). Both need each
//! branch one by one: the stepper gives them one at a time, and the TCG engine keeps the LBR
//! stack's newest in an [`LbrTail`] that goes to the model after its run. BTS writes each record
//! to guest memory as the branch retires, so while it is on the guest is single-stepped
//! (README, "Model-specific PMU MSRs", "BTS").
use super::debug_store::{self, DsStats};
use super::events::{branch_kind, mispredicted};
use crate::{BackendError, Cx};
use emon_pmu::pmu::lbr::Branch;
#[cfg(feature = "tcg")]
use emon_pmu::pmu::{lbr::LbrFilter, Pmu};
use emon_x86::insn::Insn;
use emon_x86::mode::CpuMode;
#[cfg(feature = "tcg")]
use std::collections::VecDeque;

/// The record of `i` at `rip` as a branch taken to `to` and ending at CPL `cpl`, if it is a
/// control transfer and `taken`.
pub fn taken_branch(i: &Insn, rip: u64, to: u64, taken: bool, cpl: u8) -> Option<Branch> {
    (taken && i.transfer.is_some()).then(|| Branch {
        from: rip,
        to,
        kind: branch_kind(i),
        cpl,
        mispredicted: mispredicted(i, rip, true),
        cycles: 0,
        event: false,
    })
}

/// The taken branches of a stretch of code run all at once (an engine run), as the LBR stack
/// would take them: every branch its filter lets through, of which only the newest can still be
/// in the stack at the end, each with the core cycles since the one before (LBR_INFO).
#[cfg(feature = "tcg")]
#[derive(Debug, Clone, PartialEq)]
pub struct LbrTail {
    filter: LbrFilter,
    /// The newest recorded branches, at most twice the stack's depth.
    newest: VecDeque<Branch>,
    /// How many the stack recorded in all.
    recorded: u64,
    /// The last branch taken, recorded or not (the model keeps it for MSR_LER_FROM_LIP).
    last: Option<Branch>,
    /// The model clock at the last recorded branch.
    last_cycles: u64,
}

#[cfg(feature = "tcg")]
impl LbrTail {
    /// A tail for the stack recording with `filter`, whose last record was at `last_cycles`.
    pub fn new(filter: LbrFilter, last_cycles: u64) -> LbrTail {
        LbrTail { filter, newest: VecDeque::new(), recorded: 0, last: None, last_cycles }
    }

    /// `b` (whose `cycles` is ignored) was taken `times` times in a row, the first ending at model
    /// clock `cycles` and each next one `every` cycles later.
    pub fn take(&mut self, b: Branch, times: u64, cycles: u64, every: u64) {
        if times == 0 {
            return;
        }
        self.last = Some(b);
        if !self.filter.records(&b) {
            return;
        }
        let keep = 2 * self.filter.depth.max(1) as usize;
        self.recorded += times;
        let end = cycles + (times - 1) * every;
        // Only the newest `keep` of them can matter.
        let skipped = times.saturating_sub(keep as u64);
        for k in skipped..times {
            let at = cycles + k * every;
            let since = if k == 0 { at.saturating_sub(self.last_cycles) } else { every };
            if self.newest.len() == keep {
                self.newest.pop_front();
            }
            self.newest.push_back(Branch { cycles: since, ..b });
        }
        self.last_cycles = end;
    }

    /// Any branch taken?
    pub fn is_empty(&self) -> bool {
        self.last.is_none()
    }
}

/// See the module documentation.
#[derive(Debug, Default)]
pub struct BranchRecorder {
    /// The LBR stack records (DEBUGCTL.LBR, not frozen).
    pub lbr_on: bool,
    /// The BTS buffer takes branch records (DEBUGCTL.TR and BTS).
    pub bts_on: bool,
    /// The model clock when the stack last recorded a branch (LBR_INFO's cycle count).
    lbr_cycles: u64,
    /// Taken branches (interrupts and exceptions included) the LBR stack recorded.
    pub lbr_recorded: u64,
    /// Entries to the guest while MSR_LBR_SELECT asked for the call-stack mode, which emon does
    /// not model: the stack then records as if it were off.
    pub lbr_call_stack: u64,
}

impl BranchRecorder {
    /// Before an entry: what the model asks to record now.
    pub fn arm(&mut self, cx: &Cx) {
        self.lbr_on = cx.pmu.lbr_recording();
        self.bts_on = cx.pmu.bts_records(0) || cx.pmu.bts_records(3);
        if self.lbr_on && cx.pmu.lbr_call_stack() {
            self.lbr_call_stack += 1;
        }
    }

    /// Does anything record branches?
    pub fn on(&self) -> bool {
        self.lbr_on || self.bts_on
    }

    /// Records `b`, taken at CPL `from_cpl`: in the LBR stack with the cycles since the stack's
    /// last record, and in the BTS buffer.
    pub fn take(
        &mut self,
        cx: &mut Cx,
        ds: &mut DsStats,
        mode: &CpuMode,
        b: Branch,
        from_cpl: u8,
        cycles: u64,
    ) -> Result<(), BackendError> {
        if self.lbr_on {
            let b = Branch { cycles: cycles - self.lbr_cycles, ..b };
            if cx.pmu.record_branch(&b) {
                self.lbr_cycles = cycles;
                self.lbr_recorded += 1;
            }
        }
        if self.bts_on && cx.pmu.bts_records(from_cpl) {
            debug_store::bts_store(cx, ds, mode, b.from, b.to, !b.mispredicted);
        }
        Ok(())
    }

    /// The LBR stack's tail for an engine run from now, if it records.
    #[cfg(feature = "tcg")]
    pub fn tail(&self, pmu: &Pmu) -> Option<LbrTail> {
        pmu.lbr_filter().filter(|_| self.lbr_on).map(|f| LbrTail::new(f, self.lbr_cycles))
    }

    /// What an engine run recorded goes to the model: the newest records, as many as leave the
    /// stack as the whole sequence would (its depth plus the rest modulo the depth, so that
    /// MSR_LASTBRANCH_TOS ends where it would), then the last branch if the filter kept it out.
    #[cfg(feature = "tcg")]
    pub fn take_tail(&mut self, pmu: &mut Pmu, tail: LbrTail) {
        let depth = u64::from(tail.filter.depth.max(1));
        let fed = if tail.recorded <= tail.newest.len() as u64 {
            tail.recorded
        } else {
            depth + (tail.recorded - depth) % depth
        };
        for b in tail.newest.iter().skip(tail.newest.len() - fed as usize) {
            pmu.record_branch(b);
        }
        if let Some(last) = tail.last.filter(|b| !tail.filter.records(b)) {
            pmu.record_branch(&last);
        }
        self.lbr_recorded += tail.recorded;
        if tail.recorded > 0 {
            self.lbr_cycles = tail.last_cycles;
        }
    }

    /// What the run summary says about the recording.
    pub fn notes(&self) -> Vec<String> {
        let mut notes = Vec::new();
        if self.lbr_call_stack > 0 {
            notes.push(
                "NOT EXACT: the LBR stack was asked for its call-stack mode (MSR_LBR_SELECT.EN_CALLSTACK), which emon does not model; it recorded every branch the filter let through (README, \"Model-specific PMU MSRs\")".into(),
            );
        }
        notes
    }
}

#[cfg(all(test, feature = "tcg"))]
mod tests {
    use super::*;
    use emon_pmu::pmu::lbr::BranchType;
    use emon_pmu::profile::Profile;

    /// A stack recording with `select` under skylake (32 entries, LBR_INFO's cycle counts).
    fn recording(select: u64) -> Pmu {
        let mut pmu = Pmu::new(&Profile::load("skylake").unwrap().pmu);
        pmu.wrmsr(0x1C8, select).unwrap(); // MSR_LBR_SELECT
        pmu.wrmsr(0x1D9, 1).unwrap(); // IA32_DEBUGCTL.LBR
        pmu
    }

    /// A branch of each kind in turn, ending at CPL 0 or 3, some mispredicted.
    fn branch(n: u64) -> Branch {
        let kinds = [
            BranchType::Jcc,
            BranchType::NearRelCall,
            BranchType::NearIndCall,
            BranchType::NearRet,
            BranchType::NearIndJmp,
            BranchType::NearRelJmp,
            BranchType::Far,
        ];
        Branch {
            from: 0x1000 + n * 7,
            to: 0x2000 + n * 13,
            kind: kinds[(n % 7) as usize],
            cpl: if n % 5 == 0 { 3 } else { 0 },
            mispredicted: n % 3 == 0,
            cycles: 0,
            event: false,
        }
    }

    /// Branches taken in bulk (an engine run) leave the model exactly as taking them one at a
    /// time does: the stack's entries and LBR_INFO cycles, MSR_LASTBRANCH_TOS and the last
    /// branch, for any number of branches around the stack's depth, filtered or not, repeated or
    /// not.
    #[test]
    fn a_tail_leaves_the_stack_as_the_branches_one_by_one() {
        for select in [0, 1 << 2, 1 << 0, (1 << 1) | (1 << 5)] {
            for n in [0u64, 1, 5, 31, 32, 33, 63, 64, 65, 100, 1000] {
                for repeat in [1u64, 3] {
                    let mut one_by_one = recording(select);
                    let mut recorder = BranchRecorder { lbr_on: true, lbr_cycles: 7, ..Default::default() };
                    let mut bulk = one_by_one.clone();
                    let mut tail = recorder.tail(&bulk).unwrap();
                    let mut reference = BranchRecorder { lbr_on: true, lbr_cycles: 7, ..Default::default() };
                    let mut clock = 10;
                    for k in 0..n {
                        let b = branch(k);
                        tail.take(b, repeat, clock + 2, 2);
                        for _ in 0..repeat {
                            clock += 2;
                            let b = Branch { cycles: clock - reference.lbr_cycles, ..b };
                            if one_by_one.record_branch(&b) {
                                reference.lbr_cycles = clock;
                                reference.lbr_recorded += 1;
                            }
                        }
                    }
                    recorder.take_tail(&mut bulk, tail);
                    assert_eq!(bulk, one_by_one, "select {select:#x}, {n} branches x{repeat}");
                    assert_eq!(recorder.lbr_recorded, reference.lbr_recorded);
                    assert_eq!(recorder.lbr_cycles, reference.lbr_cycles);
                }
            }
        }
    }
}
