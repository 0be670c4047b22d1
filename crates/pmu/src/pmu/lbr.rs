//! The LBR stack recording branches (SDM Vol. 3B 17.4.8 "LBR Stack", 17.4.8.1 the record
//! formats, and "Filtering of Last Branch Records" for MSR_LBR_SELECT).

use super::arch::ArchPmu;
use super::msr::*;

/// The branch categories of MSR_LBR_SELECT, in its bit order (bits 2-8; bit 0 and 1 filter by
/// the CPL the branch ends in).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BranchType {
    /// JCC: conditional branches (Jcc, LOOP, JrCXZ).
    Jcc,
    /// NEAR_REL_CALL.
    NearRelCall,
    /// NEAR_IND_CALL.
    NearIndCall,
    /// NEAR_RET.
    NearRet,
    /// NEAR_IND_JMP.
    NearIndJmp,
    /// NEAR_REL_JMP.
    NearRelJmp,
    /// FAR_BRANCH: far jumps, calls and returns, IRET, INT n, SYSCALL/SYSRET, and interrupts
    /// and exceptions.
    Far,
}

impl BranchType {
    /// The MSR_LBR_SELECT bit that, set, keeps this type out of the stack.
    fn select_bit(self) -> u64 {
        1 << match self {
            BranchType::Jcc => 2,
            BranchType::NearRelCall => 3,
            BranchType::NearIndCall => 4,
            BranchType::NearRet => 5,
            BranchType::NearIndJmp => 6,
            BranchType::NearRelJmp => 7,
            BranchType::Far => 8,
        }
    }
}

/// MSR_LBR_SELECT.CPL_EQ_0 (bit 0): do not capture branches ending in ring 0.
pub const LBR_SELECT_CPL_EQ_0: u64 = 1 << 0;
/// MSR_LBR_SELECT.CPL_NEQ_0 (bit 1): do not capture branches ending in ring > 0.
pub const LBR_SELECT_CPL_NEQ_0: u64 = 1 << 1;
/// MSR_LBR_SELECT.EN_CALLSTACK (bit 9, Haswell on): the stack works as a call stack.
pub const LBR_SELECT_EN_CALLSTACK: u64 = 1 << 9;
/// The cycle count of MSR_LBR_INFO_n saturates at 16 bits.
const LBR_INFO_CYCLES: u64 = 0xFFFF;
/// MSR_LBR_INFO_n.MISPRED.
const LBR_INFO_MISPRED: u64 = 1 << 63;

/// One taken branch, as the processor would report it to the LBR stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Branch {
    /// The branch instruction's address (for an interrupt or exception: the instruction it
    /// interrupted).
    pub from: u64,
    /// Where it went.
    pub to: u64,
    pub kind: BranchType,
    /// The CPL the branch ends in.
    pub cpl: u8,
    /// Predicted wrongly (the cost model's predictor).
    pub mispredicted: bool,
    /// Core cycles since the last branch the stack recorded (LBR_INFO's cycle count).
    pub cycles: u64,
    /// The delivery of an interrupt or exception (`kind` is [`BranchType::Far`]): it copies the
    /// last branch taken before it into MSR_LER_FROM_LIP/TO_LIP.
    pub event: bool,
}

/// Which taken branches the LBR stack records while it records: MSR_LBR_SELECT's filter, and the
/// stack's depth (SDM 17.4.8, "Filtering of Last Branch Records"). An executor that records
/// branches in bulk keeps the records it lets through, and gives the model the newest ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LbrFilter {
    pub select: u64,
    pub depth: u32,
}

impl LbrFilter {
    /// Whether the stack takes `b`: a set CPL_EQ_0/CPL_NEQ_0 bit or a set branch-type bit keeps
    /// it out.
    pub fn records(&self, b: &Branch) -> bool {
        let ring = if b.cpl == 0 { LBR_SELECT_CPL_EQ_0 } else { LBR_SELECT_CPL_NEQ_0 };
        self.select & (ring | b.kind.select_bit()) == 0
    }
}

impl ArchPmu {
    /// What the LBR stack records now, if it records (see [`ArchPmu::recording`]).
    pub(super) fn filter(&self) -> Option<LbrFilter> {
        let lbr = self.layout.lbr?;
        self.recording().then_some(LbrFilter { select: self.lbr.select, depth: u32::from(lbr.depth) })
    }

    /// Is the LBR stack recording? DEBUGCTL.LBR is set and, on v4+, GLOBAL_STATUS.LBR_Frz is
    /// clear (SDM 17.4.7: v1-v3 freeze by clearing DEBUGCTL.LBR instead).
    pub(super) fn recording(&self) -> bool {
        self.layout.lbr.is_some()
            && self.debugctl & DEBUGCTL_LBR != 0
            && !(self.layout.version >= 4 && self.global_status & GLOBAL_STATUS_LBR_FRZ != 0)
    }

    /// The newest `n` entries of the stack (at most its depth), newest first: (FROM_IP, TO_IP,
    /// LBR_INFO or 0). Adaptive PEBS's LBR group copies them.
    pub(super) fn newest(&self, n: usize) -> Vec<(u64, u64, u64)> {
        let Some(lbr) = self.layout.lbr else { return Vec::new() };
        let depth = u64::from(lbr.depth);
        (0..(n as u64).min(depth))
            .map(|back| {
                let i = ((self.lbr.tos + depth - back) % depth) as usize;
                (self.lbr.from[i], self.lbr.to[i], if lbr.info.is_some() { self.lbr.info[i] } else { 0 })
            })
            .collect()
    }

    /// Records `b` in the LBR stack if it is recording and MSR_LBR_SELECT lets `b` through:
    /// MSR_LASTBRANCH_TOS advances (modulo the depth) to the new entry, whose FROM_IP, TO_IP and
    /// LBR_INFO take the record in the profile's format (SDM 17.4.8.1). Returns whether it did.
    /// An interrupt's or exception's delivery first copies the last branch taken before it, as
    /// addresses, into MSR_LER_FROM_LIP/TO_LIP, whatever the filter.
    pub(super) fn record(&mut self, b: &Branch) -> bool {
        let (Some(lbr), Some(filter)) = (self.layout.lbr, self.filter()) else { return false };
        if b.event {
            self.lbr.ler = self.lbr.last;
        }
        self.lbr.last = (b.from, b.to);
        if !filter.records(b) {
            return false;
        }
        let tos = (self.lbr.tos + 1) % u64::from(lbr.depth);
        let n = tos as usize;
        // MISPRED is bit 63 of FROM_IP in formats 3 and 4 (format 4's IN_TSX and TSX_ABORT, bits
        // 62:61, are 0 without TSX) and bit 63 of LBR_INFO in format 5; the others have no flags.
        let mispred = if b.mispredicted { LBR_INFO_MISPRED } else { 0 };
        let (address_bits, flags) = match self.layout.lbr_format {
            3 => (u64::MAX >> 1, mispred),
            4 => (u64::MAX >> 3, mispred),
            _ => (u64::MAX, 0),
        };
        self.lbr.from[n] = b.from & address_bits | flags;
        self.lbr.to[n] = b.to;
        if lbr.info.is_some() {
            self.lbr.info[n] = mispred | b.cycles.min(LBR_INFO_CYCLES);
        }
        self.lbr.tos = tos;
        true
    }
}
