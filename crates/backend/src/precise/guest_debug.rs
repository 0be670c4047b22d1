//! The guest's own debugging where emon runs or steps its code (README, "The guest's own
//! debugging"): the single-step traps of user code with RFLAGS.TF set, and the breakpoints in
//! DR0-DR3 that DR7 arms. The CPU checks them as it executes; code that runs in the engine,
//! or that emon completes, never meets the CPU's breakpoint logic, so emon checks them at each
//! boundary and raises #DB as the CPU raises it (SDM Vol. 3B 17.3).
use super::Precise;
use crate::{BackendError, Cx};
use emon_x86::access::{self, Access, AccessKind, UnknownAccesses};
use emon_x86::arch::{DB_VECTOR, DR6_BS, RFLAGS_TF};
use emon_x86::debug::RFLAGS_RF;
use emon_x86::deliver::Event;
use emon_x86::insn::{Insn, Special};
use emon_x86::mode::CpuMode;

/// An XSAVE area is at most this large: CPUID.(EAX=0DH,ECX=0):ECX, the size for every state
/// component a processor supports, is under 12 KiB on every Intel CPU (AMX's tile data included).
const XSAVE_AREA_MAX: u32 = 16 * 1024;

impl Precise {
    /// The instruction at `rip` (the boundary) meets an instruction breakpoint emon makes fire:
    /// #DB is raised before it, a fault, with DR6.Bn set and the frame at `rip` (SDM Vol. 3B
    /// 17.3.1.1). RFLAGS.RF set lets the instruction run once (the handler sets it in the frame
    /// to resume). True if it was raised.
    pub(super) fn instruction_breakpoint(&mut self, cx: &mut Cx, rip: u64) -> Result<bool, BackendError> {
        let Some(b) = self.emons_breakpoints(cx)? else { return Ok(false) };
        let hits = b.instruction_hits(rip, cx.vcpu.regs()?.rflags);
        if hits == 0 {
            return Ok(false);
        }
        self.stats.breakpoints_fired += 1;
        self.raise_debug(cx, hits)?;
        Ok(true)
    }

    /// The data accesses the instruction at `rip` makes next (a REP string instruction's next
    /// iteration), from the registers before it runs, while a data breakpoint emon makes fire is
    /// armed; none otherwise. Where they cannot be listed before it runs (XSAVE and its kin,
    /// gathers), none, and the run says so (`breakpoints_unchecked`).
    pub(super) fn watched_accesses(
        &mut self,
        cx: &mut Cx,
        mode: &CpuMode,
        rip: u64,
    ) -> Result<Vec<Access>, BackendError> {
        if !self.emons_breakpoints(cx)?.is_some_and(|b| b.watches_data()) {
            return Ok(Vec::new());
        }
        let i = super::stepper::decode_full(cx, mode, rip);
        let (regs, sregs) = (cx.vcpu.regs()?, cx.vcpu.sregs()?);
        let reg = |r| access::gpr(&regs, r);
        match access::next_accesses(&i, reg, sregs.fs.base, sregs.gs.base) {
            Ok(a) => Ok(a),
            // An XSAVE-family area lies within XSAVE_AREA_MAX bytes of its operand: where no
            // breakpoint is that close, none can be met.
            Err(UnknownAccesses::StateSize)
                if access::operand_address(&i, reg, sregs.fs.base, sregs.gs.base).is_some_and(|a| {
                    let area = Access { linear: a, size: XSAVE_AREA_MAX, kind: AccessKind::Update };
                    self.step.guest_breakpoints.is_some_and(|b| b.data_hits(&[area]) == 0)
                }) =>
            {
                Ok(Vec::new())
            }
            Err(why) => {
                tracing::debug!(rip = format_args!("{rip:#x}"), %why, "data breakpoints not checked");
                let m = format!("{:?}", i.mnemonic()).to_lowercase();
                *self.stats.breakpoints_unchecked.entry(m).or_default() += 1;
                Ok(Vec::new())
            }
        }
    }

    /// An instruction (or a REP string instruction's iteration) that made the accesses `watched`
    /// completed: the trap the CPU takes after it, if any. DR6.Bn for each data breakpoint it
    /// met (SDM Vol. 3B 17.3.1.2), and DR6.BS when `traced` (it began in user mode with TF set,
    /// where emon takes the single-step traps) and it is still in user mode with TF set (SDM
    /// Vol. 3B 17.3.1.4): one #DB for both, its frame at the next boundary.
    pub(super) fn debug_trap(&mut self, cx: &mut Cx, watched: &[Access], traced: bool) -> Result<(), BackendError> {
        let hits = if watched.is_empty() { 0 } else { self.guest_breakpoints(cx)?.data_hits(watched) };
        if hits == 0 && !traced {
            return Ok(());
        }
        self.step.mode = None;
        let mode = self.mode(cx)?;
        let stepped = traced && mode.cpl == 3 && cx.vcpu.regs()?.rflags & RFLAGS_TF != 0;
        if stepped {
            self.stats.single_step_traps += 1;
        }
        if hits != 0 {
            self.stats.breakpoints_fired += 1;
        }
        match hits | if stepped { DR6_BS } else { 0 } {
            0 => Ok(()),
            status => self.raise_debug(cx, status),
        }
    }

    /// The CPU clears RFLAGS.RF once an instruction completes, but for IRET and POPF, which load
    /// it (SDM Vol. 3B 17.3.1.1): for the instructions emon runs itself while breakpoints it
    /// makes fire are armed (KVM's steps clear it as the CPU does).
    pub(super) fn end_resume_flag(&mut self, cx: &mut Cx, i: &Insn) -> Result<(), BackendError> {
        if matches!(i.special, Special::Iret | Special::Popf) || !self.step.guest_breakpoints.is_some_and(|b| b.armed())
        {
            return Ok(());
        }
        let mut regs = cx.vcpu.regs()?;
        if regs.rflags & RFLAGS_RF != 0 {
            regs.rflags &= !RFLAGS_RF;
            cx.vcpu.set_regs(&regs)?;
        }
        Ok(())
    }

    /// Raises #DB at the current boundary with the DR6 bits `status` set: delivered through the
    /// IDT, or by KVM's next entry where emon cannot deliver it.
    fn raise_debug(&mut self, cx: &mut Cx, status: u64) -> Result<(), BackendError> {
        cx.vcpu.add_debug_status(status)?;
        // The delivery clears TF (SDM Vol. 3A 6.12.1.3).
        self.step.user_tf = false;
        self.step.mode = None;
        let mode = self.mode(cx)?;
        let from = cx.vcpu.regs()?.rip;
        match self.deliver_event(cx, &mode, DB_VECTOR, Event::External)? {
            Ok(handler) => {
                self.step.rip = Some(handler);
                self.take_event_branch(cx, from, handler, mode.cpl)?;
            }
            Err(why) => {
                tracing::debug!(?why, "KVM delivers the #DB");
                cx.vcpu.inject_exception(DB_VECTOR, None)?;
                self.step.expect_event = true;
            }
        }
        Ok(())
    }
}
