//! The branch recorder: every taken branch the guest makes while the LBR stack records (SDM
//! 17.4.8, with MSR_LER_FROM_LIP/TO_LIP) or the BTS buffer takes records (17.4.9). Both need each
//! branch one by one, so while either is on the guest is single-stepped, counted or not
//! (README, "Model-specific PMU MSRs", "BTS").
use super::debug_store::{self, DsStats};
use super::events::{branch_kind, mispredicted};
use crate::{BackendError, Cx};
use emon_pmu::pmu::lbr::Branch;
use emon_x86::insn::Insn;
use emon_x86::mode::CpuMode;

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
