//! The stepper: single-stepping the vCPU in KVM, one retired instruction per debug exit
//! (README, "The precise backend"). At each boundary it notes the instruction about to run
//! ([`Pending`]); at the debug exit it decides what retired: that instruction, a straight-line
//! run after it whose traps the host lost, or the first instruction of an interrupt or exception
//! handler delivered before it.
use super::branches::taken_branch;
use super::events::Armed;
use super::Precise;
use crate::{BackendError, Cx};
use emon_x86::access::Access;
use emon_x86::arch::DB_VECTOR;
use emon_x86::insn::{Flow, Insn, Special};
use emon_x86::mode::CpuMode;
use std::sync::Arc;

/// At most this many instructions retire in one step whose traps were lost.
const MAX_LOST_TRAPS: usize = 64;

/// An instruction that has started (the vCPU was entered at its RIP) but not yet retired.
#[derive(Debug, Clone)]
pub struct Pending {
    pub rip: u64,
    pub cpl: u8,
    /// It began while something counted (else it is stepped only because the engine handed it
    /// over: nothing counts it).
    pub counting: bool,
    /// The counters that were counting when it began.
    pub armed: Arc<[Armed]>,
    /// The vCPU cannot retire the instruction at `rip` before an event is delivered (it is
    /// halted, or an exception was injected).
    pub expect_event: bool,
    /// For an IRET: where it returns (read from the frame before it ran), and whether to user
    /// mode (the frame's CS.RPL is 3).
    pub iret_target: Option<u64>,
    pub iret_to_user: bool,
    /// Its data accesses, from the registers before it ran, while the cache model counts
    /// (`None`: emon cannot know them before it runs, such as a REP string instruction's).
    pub accesses: Option<Vec<Access>>,
    /// Its data accesses (or its next iteration's) while the guest has a data breakpoint armed
    /// that emon makes fire: checked once it retires.
    pub watched: Vec<Access>,
    /// For a PUSHF: the guest's own RFLAGS.TF, which the image it pushes must hold.
    pub guest_tf: Option<bool>,
}

impl Pending {
    /// A counter the instruction wrote (`written`: IA32_PERF_GLOBAL_STATUS bits) does not count
    /// it.
    pub fn uncount_written(&mut self, written: u64) {
        if self.armed.iter().any(|a| written & a.id.status_mask() != 0) {
            self.armed = self.armed.iter().filter(|a| written & a.id.status_mask() == 0).copied().collect();
        }
    }
}

/// The stepper's state between exits.
#[derive(Debug, Default)]
pub struct Stepper {
    /// The vCPU single-steps.
    pub stepping: bool,
    /// RIP at the current instruction boundary, when known without a register read.
    pub rip: Option<u64>,
    /// The CPU mode, cached; `None` after anything that may change it.
    pub mode: Option<CpuMode>,
    pub pending: Option<Pending>,
    /// The next instruction to retire is an event handler's: the vCPU halted, an exception was
    /// injected, or a PMI is due before the vCPU runs on.
    pub expect_event: bool,
    /// The VMM queued a PMI in KVM (see [`crate::Backend::event_queued`]): the next counted
    /// instruction is stepped in KVM, which delivers the PMI first if the guest can take it.
    pub event_queued: bool,
    /// The guest's own RFLAGS.TF in user mode, where user mode runs in the engine and emon takes
    /// its single-step traps: KVM_GET_REGS hides it while KVM single-steps, so emon keeps it from
    /// the IRET that set it (in the engine or stepped) and puts it back (see `traced_user_step`).
    pub user_tf: bool,
    /// The guest's own breakpoints (DR0-DR3, DR7), as last read; `None` after anything that may
    /// have changed them (KVM running free, a MOV to a debug register).
    pub guest_breakpoints: Option<emon_x86::debug::Breakpoints>,
}

/// Whether executing `i` at `rip` can leave the vCPU at `pc`.
pub fn follows(i: &Insn, rip: u64, pc: u64) -> bool {
    let next = rip + i.len as u64;
    match i.flow {
        Flow::Next => pc == next,
        Flow::Direct { target, .. } => pc == target || pc == next,
        Flow::Indirect | Flow::Other => true,
    }
}

/// Whether `i` at `rip`, having left the vCPU at `pc`, was a taken branch.
pub fn taken(i: &Insn, rip: u64, pc: u64) -> bool {
    match i.flow {
        Flow::Next => false,
        Flow::Direct { target, .. } => pc == target && target != rip + i.len as u64,
        Flow::Indirect => true,
        Flow::Other => pc != rip + i.len as u64,
    }
}

/// An instruction emon could not fetch or decode: it still counts as one instruction.
pub const UNKNOWN: Insn = Insn {
    len: 0,
    flow: Flow::Other,
    branch: false,
    mem_operands: 0,
    class_cycles: 0,
    special: Special::None,
    changes_mode: true,
    transfer: None,
    repeats: false,
    class: emon_x86::insn::Class { loads: 0, stores: 0, flags: 0, fp: 0, fp_count: 0 },
};

/// The whole instruction at `rip`, as iced-x86 decodes it (for its data accesses).
pub fn decode_full(cx: &Cx, mode: &CpuMode, rip: u64) -> iced_x86::Instruction {
    let bytes = mode.fetch(cx.vcpu.memory(), rip);
    iced_x86::Decoder::with_ip(mode.bitness, &bytes, rip, iced_x86::DecoderOptions::NONE).decode()
}

impl Precise {
    /// The CPU mode at the boundary (read once until something may change it).
    pub(super) fn mode(&mut self, cx: &mut Cx) -> Result<CpuMode, BackendError> {
        match self.step.mode {
            Some(m) => Ok(m),
            None => {
                let m = cx.vcpu.mode()?;
                self.step.mode = Some(m);
                Ok(m)
            }
        }
    }

    /// RIP at the boundary (read once until the vCPU runs).
    pub(super) fn rip(&mut self, cx: &mut Cx) -> Result<u64, BackendError> {
        match self.step.rip {
            Some(r) => Ok(r),
            None => {
                let r = cx.vcpu.regs()?.rip;
                self.step.rip = Some(r);
                Ok(r)
            }
        }
    }

    /// The instruction at linear address `rip` (see [`super::decode_cache`]).
    pub(super) fn decode(&mut self, cx: &Cx, mode: &CpuMode, rip: u64) -> Option<Insn> {
        self.decode.get(cx.vcpu.memory(), mode, rip)
    }

    /// A single-step exit at `pc` (see [`crate::Backend::on_debug_exit`]).
    pub(super) fn debug_exit(&mut self, cx: &mut Cx, pc: u64) -> Result<(), BackendError> {
        self.stats.steps += 1;
        let Some(p) = self.step.pending.take() else {
            tracing::trace!(pc = format_args!("{pc:#x}"), "step with nothing pending");
            // The first step after counting started mid-instruction: that instruction began
            // before any counter was counting.
            self.step.rip = Some(pc);
            return Ok(());
        };
        let mode = self.mode(cx)?;
        let at_rip = self.decode(cx, &mode, p.rip);
        if at_rip.is_some_and(|i| !p.expect_event && !i.retired_at(p.rip, pc)) {
            // An iteration of a REP string instruction ended: the instruction goes on from here,
            // and retires once, after its last iteration (`Insn::repeats`). A data breakpoint
            // the iteration met traps after it (SDM Vol. 3B 17.3.1.2).
            self.step.rip = Some(pc);
            return self.debug_trap(cx, &p.watched, false);
        }
        let iret_elsewhere = |i: &Insn| i.special == Special::Iret && p.iret_target.is_some_and(|t| t != pc);
        if let Some(i) = at_rip.filter(|i| !p.expect_event && (!follows(i, p.rip, pc) || iret_elsewhere(i))) {
            if self.retire_lost_traps(cx, &mode, &p, &i, pc)? {
                return Ok(());
            }
            let to_user = (i.special == Special::Iret && p.iret_to_user)
                || (i.special == Special::Sysret && self.user_in_engine());
            if to_user {
                // The IRET or SYSRET went to user mode and the step came back only somewhere the
                // user code led to: it ran unseen (README, "User mode (CPL3)").
                self.stats.cpl3_lost += 1;
            }
        }
        let mut retired_pending = false;
        let (i, rip, cpl) = match at_rip {
            Some(i) if !p.expect_event && follows(&i, p.rip, pc) => {
                self.feed_pending(cx, &mode, &p);
                retired_pending = true;
                (i, p.rip, p.cpl)
            }
            None if !p.expect_event => {
                self.feed_unseen(cx, &mode, p.rip);
                (UNKNOWN, p.rip, p.cpl)
            }
            _ => self.event_delivered(cx, &p, pc)?,
        };
        tracing::trace!(
            pending = format_args!("{:#x}", p.rip),
            retired = format_args!("{rip:#x}"),
            pc = format_args!("{pc:#x}"),
            "step"
        );
        self.retire_one(cx, &p, (&i, rip, cpl), pc, true)?;
        if retired_pending {
            if let Some(tf) = p.guest_tf {
                self.pushed_tf(cx, &mode, tf)?;
            }
            self.debug_trap(cx, &p.watched, false)?;
        }
        Ok(())
    }

    /// A PUSHF KVM stepped pushed the TF of KVM's own single-step (KVM steps with RFLAGS.TF
    /// and hides it only from KVM_GET_REGS): the image on the stack gets the guest's own TF
    /// back, `tf`, so that a POPF of it does not turn on single-stepping the guest never asked
    /// for. TF is bit 8, in the image's second byte whatever the operand size.
    fn pushed_tf(&mut self, cx: &mut Cx, mode: &CpuMode, tf: bool) -> Result<(), BackendError> {
        let at = cx.vcpu.regs()?.rsp + 1;
        let mut b = [0u8; 1];
        if mode.read_linear(cx.vcpu.memory(), at, &mut b).is_some() && (b[0] & 1 != 0) != tf {
            b[0] = b[0] & !1 | u8::from(tf);
            mode.write_linear(cx.vcpu.memory(), at, &b);
        }
        Ok(())
    }

    /// One instruction `i` at `rip`, begun at CPL `cpl` while `p` was pending (its counters
    /// counting), retired and left the vCPU at `next`: it counts, the mode is re-read if it may
    /// have changed, a taken branch
    /// is recorded, and a PEBS assist it triggers writes its record (`exact`: the vCPU's
    /// registers are those right after it).
    pub(super) fn retire_one(
        &mut self,
        cx: &mut Cx,
        p: &Pending,
        (i, rip, cpl): (&Insn, u64, u8),
        next: u64,
        exact: bool,
    ) -> Result<(), BackendError> {
        let taken = taken(i, rip, next);
        let cache = std::mem::take(&mut self.feed.retiring);
        if p.counting {
            self.stats.retired += 1;
            self.counters.retire(cx, &mut self.clock, &p.armed, (i, rip, cpl), taken, cache);
        } else {
            // Stepped only because the engine handed it over: nothing counts it, but the guest's
            // time may follow the model throughout.
            self.stats.free_stepped += 1;
            if self.clock.throughout() {
                self.clock.advance(crate::precise::events::cycles(i, taken));
            }
        }
        if i.changes_mode {
            self.step.mode = None;
            self.step.guest_breakpoints = None;
        }
        self.end_resume_flag(cx, i)?;
        if self.branches.on() && i.transfer.is_some() {
            let to_cpl = self.mode(cx)?.cpl;
            if let Some(b) = taken_branch(i, rip, next, taken, to_cpl) {
                self.take_branch(cx, b, cpl)?;
            }
        }
        self.pebs_assist(cx, rip, exact)?;
        self.step.rip = Some(next);
        Ok(())
    }

    /// The pending instruction `i` did not end where it leads: the host lost single-step traps,
    /// and a straight-line run after it retired too, up to `pc`. Counts them all and returns
    /// true, or false if no such run leads to `pc` (then an event was delivered).
    fn retire_lost_traps(
        &mut self,
        cx: &mut Cx,
        mode: &CpuMode,
        p: &Pending,
        i: &Insn,
        pc: u64,
    ) -> Result<bool, BackendError> {
        let landing = match i.special {
            Special::Iret => p.iret_target,
            _ if i.flow == Flow::Next => Some(p.rip + i.len as u64),
            _ => None,
        };
        let Some(run) = landing.and_then(|l| self.walk(cx, mode, l, pc)) else { return Ok(false) };
        tracing::trace!(
            pending = format_args!("{:#x}", p.rip),
            pc = format_args!("{pc:#x}"),
            extra = run.len(),
            "lost traps"
        );
        self.feed_pending(cx, mode, p);
        let end = run.first().map_or(pc, |(a, _)| *a);
        self.retire_one(cx, p, (i, p.rip, p.cpl), end, run.is_empty())?;
        let cpl = self.mode(cx)?.cpl;
        for (n, (a, j)) in run.iter().enumerate() {
            let next = run.get(n + 1).map_or(pc, |(b, _)| *b);
            self.feed_unseen(cx, mode, *a);
            if matches!(j.special, Special::Rdtsc | Special::Rdtscp | Special::Rdmsr) && self.clock.virtual_time {
                // It ran in KVM without its own trap: it read the host's time.
                self.stats.tsc_unseen += 1;
            }
            self.retire_one(cx, p, (j, *a, cpl), next, n + 1 == run.len())?;
        }
        self.stats.lost_traps += run.len() as u64;
        self.step.rip = Some(pc);
        Ok(true)
    }

    /// An interrupt or exception was delivered before the pending instruction: its handler's
    /// first instruction retired, at the handler's privilege level. Returns that instruction,
    /// its address and CPL.
    fn event_delivered(&mut self, cx: &mut Cx, p: &Pending, pc: u64) -> Result<(Insn, u64, u8), BackendError> {
        self.stats.events += 1;
        self.clock.wake(cx)?;
        self.step.mode = None;
        let mode = self.mode(cx)?;
        let handler = self.event_handler(cx, &mode, pc);
        // A user-mode instruction whose single-step trap went into the guest's own #DB handler
        // (or to no handler emon can find): this host cannot step CPL3 code, and what it ran is
        // not counted (README, "User mode (CPL3)").
        if p.cpl == 3 && handler.as_ref().is_none_or(|(v, _, _)| *v == DB_VECTOR) {
            self.stats.cpl3_lost += 1;
        } else if let Some((v, _, _)) = handler.filter(|_| p.cpl == 3 && self.user_in_engine()) {
            // The event KVM was to deliver before any user instruction: its frame says where
            // user mode was interrupted, and anything else means KVM ran user code first, which
            // this host cannot step (whatever the event, and whatever the code).
            let user = CpuMode { cpl: 3, ..mode };
            let sregs = cx.vcpu.sregs()?;
            let at = emon_x86::deliver::interrupted_user_rip(&user, cx.vcpu.memory(), &sregs, v);
            if at != Some(p.rip) {
                tracing::debug!(vector = v, pending = format_args!("{:#x}", p.rip), frame = ?at, "user code ran in KVM before the event");
                self.stats.cpl3_lost += 1;
            }
        }
        // The handler's first instruction ran with registers emon never saw.
        let first = handler.as_ref().map_or(pc, |(_, h, _)| *h);
        self.feed_unseen(cx, &mode, first);
        // The delivery is a far branch from the interrupted instruction to the handler.
        self.take_event_branch(cx, p.rip, first, p.cpl)?;
        Ok(match handler {
            Some((_, h, i)) => (i, h, mode.cpl),
            None => (UNKNOWN, pc, mode.cpl),
        })
    }

    /// The handler whose first instruction, retired, leaves the vCPU at `pc`: the event that
    /// was delivered before the pending instruction. (vector, handler address, its instruction)
    fn event_handler(&mut self, cx: &Cx, mode: &CpuMode, pc: u64) -> Option<(u8, u64, Insn)> {
        let mut branch_match = None;
        for v in 0..=255u8 {
            let Some(h) = mode.idt_handler(cx.vcpu.memory(), v) else { continue };
            let Some(i) = self.decode(cx, mode, h) else { continue };
            if h + i.len as u64 == pc && matches!(i.flow, Flow::Next) {
                return Some((v, h, i));
            }
            if branch_match.is_none() && follows(&i, h, pc) {
                branch_match = Some((v, h, i));
            }
        }
        branch_match
    }

    /// The RIP an IRET at the current boundary returns to, and whether it returns to user mode:
    /// the first two slots of its frame (RIP, CS).
    /// The RFLAGS a POPF or IRET at the boundary pops (its TF, bit 8, is in the low word whatever
    /// the operand size).
    pub(super) fn popped_rflags(&mut self, cx: &mut Cx, mode: &CpuMode, i: &Insn) -> Result<Option<u64>, BackendError> {
        let rsp = cx.vcpu.regs()?.rsp;
        let width: u64 = if mode.bitness == 64 { 8 } else { 4 };
        let at = match i.special {
            Special::Popf => rsp,
            Special::Iret => rsp + 2 * width,
            _ => return Ok(None),
        };
        let mut b = [0u8; 8];
        Ok(mode.read_linear(cx.vcpu.memory(), at, &mut b[..width as usize]).map(|()| u64::from_le_bytes(b)))
    }

    pub(super) fn iret_target(&mut self, cx: &mut Cx, mode: &CpuMode) -> Result<Option<(u64, bool)>, BackendError> {
        let rsp = cx.vcpu.regs()?.rsp;
        let width = if mode.bitness == 64 { 8 } else { 4 };
        let slot = |k: u64| -> Option<u64> {
            let mut b = [0u8; 8];
            mode.read_linear(cx.vcpu.memory(), rsp + k * width as u64, &mut b[..width])?;
            Some(u64::from_le_bytes(b))
        };
        Ok(slot(0).map(|rip| (rip, slot(1).is_some_and(|cs| cs & 3 == 3))))
    }

    /// The instructions that retired from `from` up to `pc` along straight-line code (the
    /// last one may be a direct branch to `pc`): what a step retired beyond its first
    /// instruction when the host lost single-step traps (after port I/O completes, and after
    /// IRET, whose restored TF traps one instruction late).
    fn walk(&mut self, cx: &Cx, mode: &CpuMode, from: u64, pc: u64) -> Option<Vec<(u64, Insn)>> {
        let mut out = Vec::new();
        let mut a = from;
        while out.len() <= MAX_LOST_TRAPS {
            if a == pc {
                return Some(out);
            }
            let i = self.decode(cx, mode, a)?;
            out.push((a, i));
            match i.flow {
                Flow::Next => a += i.len as u64,
                Flow::Direct { target, .. } if target == pc || a + i.len as u64 == pc => return Some(out),
                _ => return None,
            }
        }
        None
    }

    /// The pending instruction retires: its data accesses (known from before it ran) go to the
    /// cache model, for the LLC events it counts.
    fn feed_pending(&mut self, cx: &mut Cx, mode: &CpuMode, p: &Pending) {
        match &p.accesses {
            Some(a) => self.feed.retire(cx, mode, p.rip, a),
            None => self.feed_unseen(cx, mode, p.rip),
        }
    }

    /// The instruction at `rip` retired while the cache model counts, with data accesses emon
    /// did not see (it knew no registers from before it ran).
    pub(super) fn feed_unseen(&mut self, cx: &Cx, mode: &CpuMode, rip: u64) {
        if self.feed.on {
            self.feed.unseen(&decode_full(cx, mode, rip));
        }
    }
}
