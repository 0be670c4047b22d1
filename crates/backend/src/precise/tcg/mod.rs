//! The TCG engine: runs guest code in QEMU's TCG (through unicorn) on the VM's own memory,
//! counting it per translated block, instead of single-stepping it in KVM; and completes single
//! instructions KVM cannot run.
//!
//! The engine is a fast-forward between single steps. At an instruction boundary the backend
//! loads the vCPU's state into the engine ([`state`]), which runs until, before any block it
//! must not run:
//! - a block holding an instruction that must go through KVM ([`blocks::classify`]: port I/O,
//!   MSRs, CPUID, RDPMC, RDTSC, HLT, STI/POPF, INT/SYSCALL, control and segment register loads,
//!   TLB invalidations, AVX and what else TCG lacks);
//! - a block that needs state the run did not load (the x87/SSE registers, the SYSCALL MSRs):
//!   the caller runs again with it ([`Stop::Needs`]);
//! - a block that could bring a counter to its overflow (the step that overflows it is the
//!   single-stepper's, so the PMI keeps zero skid);
//! - the end of its budget or its wall-clock deadline (so that KVM delivers interrupts on time).
//!
//! It also stops at a fault (a page fault, an access outside RAM such as the local APIC): the
//! faulting instruction has not retired, and KVM runs it and delivers the real exception. The
//! state goes back to the vCPU, and single-stepping resumes exactly where the engine stopped.
//! Every count is exact: a block counts only once it has retired, and a block cut short counts
//! the instructions before the fault.
mod blocks;
mod counting;
mod private;
mod snapshot;
mod state;
#[cfg(test)]
mod tests;
mod tsc;
mod xsave;

use super::branches::LbrTail;
use super::cache::CacheModel;
use super::events::Armed;
pub use blocks::{class_in, classify, hide_lacking, opens_user_access, runs_in_engine, Class, Needs, Withheld};
use counting::{on_block, on_breakpoint, on_insn, on_stop, Acc, Decoded};
use emon_pmu::profile::{Clock, MIN_CACHE_LINE};
use emon_x86::access;
use emon_x86::arch::{DB_VECTOR, RFLAGS_TF};
use emon_x86::insn;
use emon_x86::mode::CpuMode;
use iced_x86::{Code, Decoder, DecoderOptions, InstructionInfoFactory};
use rustc_hash::{FxHashMap, FxHashSet};
use snapshot::CodeSnapshot;
pub use state::{CpuState, SysMsrs};
use std::time::Instant;
pub use tsc::{Given as TscGiven, Source as TscSource};
use unicorn_engine::unicorn_const::{uc_error, Arch, Mode, Prot};
use unicorn_engine::{RegisterX86, UcHookId, Unicorn, X86CpuModel};
use vm_memory::{GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};
pub use xsave::complete as complete_xsave;

/// Instructions one engine run retires at most before handing back to KVM (about 30 ms here).
pub const BUDGET: u64 = 10_000_000;

/// Blocks decoded at most per address space (bounded like the stepper's decode cache).
const MAX_BLOCKS: usize = 16_384;
/// The most instructions QEMU translates into one block (its TCG_MAX_INSNS).
pub const MAX_BLOCK: u64 = 512;

/// Why an engine run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// Before an instruction the engine must not run.
    Handover,
    /// Before a block that needs state the run did not load.
    Needs(Needs),
    /// A counter is close to its overflow.
    Overflow,
    /// The instruction budget or the run's time is spent.
    Budget,
    /// A fault in the engine (the instruction at the stop did not retire).
    Fault,
    /// Before the first block at another privilege level, or with RFLAGS.TF set (after an
    /// IRETQ).
    ModeChange,
    /// Right after the instruction that brought a counter to its overflow (CPL3 runs only,
    /// where the overflowing instruction cannot be single-stepped: see [`Tcg::run`]).
    Overflowed,
    /// Before an instruction at one of the guest's instruction breakpoints ([`Watch::exec`]).
    Breakpoint,
    /// Before a block that reads the TSC, with RFLAGS.IF set by an STI or IRETQ the run ran,
    /// where its window serves only code with IF clear ([`Counting::tsc_if_clear`]).
    InterruptsOn,
    /// Before a block TCG could not translate: an instruction in it crosses into a page that
    /// cannot be fetched from. TCG then ends the run with no exception, where the CPU would run
    /// the instructions before that one and fault on it (SDM Vol. 3A 6.15, #PF): the caller
    /// takes the code an instruction at a time ([`Tcg::complete`] translates each alone).
    Untranslatable,
}

/// The guest's breakpoints a run honours, where emon makes them fire (README, "The guest's own
/// debugging"): the engine stops before each instruction breakpoint's address, and, while a
/// data breakpoint on user-mode memory is armed, before what may open the kernel's access to
/// user memory ([`blocks::opens_user_access`]): the caller steps such code and checks its
/// accesses. (A run with other data breakpoints armed is not made.)
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Watch {
    pub exec: Vec<u64>,
    pub user_data: bool,
}

/// The model clock at the start of a run (for UnHalted Reference Cycles).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelClock {
    /// Core cycles counted since the VM started.
    pub cycles: u64,
    pub reference: Clock,
}

/// What a run counts: the armed counters (each with how far it is from overflowing), the model
/// clock, the most instructions it may retire, and when it must hand back at the latest.
#[derive(Debug, Clone)]
pub struct Counting<'a> {
    pub armed: &'a [(Armed, u64)],
    pub clock: ModelClock,
    pub budget: u64,
    /// The cache model, while an LLC event counts: it sees every data access of the run, and
    /// comes back in [`Run::cache`].
    pub cache: Option<CacheModel>,
    pub deadline: Option<Instant>,
    /// The LBR stack's records while it records: the run's taken branches go to it, and it
    /// comes back in [`Run::lbr`].
    pub lbr: Option<LbrTail>,
    /// The guest's breakpoints the run honours.
    pub watch: Watch,
    /// STI is handed over: something counts at this privilege level ([`Withheld::sti`]).
    pub withhold_sti: bool,
    /// Where RDTSC and RDTSCP read the guest's TSC in the engine; `None`: they are handed over
    /// ([`Withheld::tsc`]).
    pub tsc: Option<TscSource>,
    /// The source serves only code with RFLAGS.IF clear: the run stops before a block that reads
    /// the TSC once IF is set ([`Stop::InterruptsOn`]).
    pub tsc_if_clear: bool,
}

impl Counting<'_> {
    /// Whether something takes what the run's blocks do beyond the instruction count: an armed
    /// counter, the cache model or the LBR stack (`Acc::tracked`).
    pub fn tracks(&self) -> bool {
        !self.armed.is_empty() || self.cache.is_some() || self.lbr.is_some()
    }
}

/// What one engine run retired, and the vCPU state it left.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    pub retired: u64,
    /// Blocks the run entered (each REP iteration TCG runs is one).
    pub blocks: u64,
    /// The core cycles of what it retired (the cost model), for the model clock.
    pub cycles: u64,
    /// Per armed counter, in the order given: its events (after the counter's filters).
    pub counts: Vec<u64>,
    /// The state after the run: what it started from, with what the run changed.
    pub state: CpuState,
    pub stop: Stop,
    /// The privilege level at the stop.
    pub cpl: u8,
    /// An IRETQ retired: it may have changed the segments and ends NMI blocking.
    pub iret: bool,
    /// The run ended right after STI: its shadow covers the next instruction, which KVM must
    /// keep (SDM Vol. 2B, STI).
    pub after_sti: bool,
    /// An INVLPG ran (or the block that has it was entered): the translations KVM caches for
    /// the guest are to be dropped before it runs the guest again.
    pub flushed_tlb: bool,
    /// What the code that ran needed of the state the run loaded.
    pub used: Needs,
    /// The cache model given in [`Counting::cache`].
    pub cache: Option<CacheModel>,
    /// The LBR records given in [`Counting::lbr`], with the run's.
    pub lbr: Option<LbrTail>,
    /// The exception that stopped the run, where the engine said which.
    pub fault: Option<u32>,
    /// With `Stop::Overflowed`: the instruction that brought a counter to its overflow.
    pub overflowed_at: Option<u64>,
    /// What RDTSC and RDTSCP gave in the run ([`Counting::tsc`]).
    pub tsc: tsc::Given,
}

/// What the hooks work on: a run's counting state, or the bounds of a trampoline (see
/// [`private`]).
pub struct Data {
    acc: Option<Acc>,
    trampoline: Option<(u64, u64)>,
    /// Where the engine has stop hooks (see [`Tcg::run`]), and which of them are before RDTSC or
    /// RDTSCP: those are not stops in a run with a window on the TSC ([`on_stop`]).
    stops: FxHashSet<u64>,
    tsc_stops: FxHashSet<u64>,
    /// What the engine's translations were made from (README, "The TCG engine").
    code: CodeSnapshot,
    /// The vector of the exception that stopped the engine, if one did.
    fault: Option<u32>,
    /// The blocks decoded (while a run goes on, its `Acc` has them), and the runs so far.
    decoded: Decoded,
    runs: u64,
    /// Times every translation was dropped.
    flushes: u64,
    /// The vCPU's CR2, which the engine holds through every run ([`state::start`]).
    cr2: u64,
    /// What the engine's x87/SSE registers and XCR0 hold, where emon knows: as loaded or read
    /// last. Only the guest's code changes them in the engine, and a run whose code may have
    /// reads them back ([`state::collect`]); a load that would put the same state back skips
    /// its trampolines ([`state::load`]).
    fpu: Option<emon_x86::fpu::Fpu>,
    /// Times the x87/SSE state went into the engine.
    fpu_loads: u64,
    /// Where a run reads the model's time, the model clock at each read of the block about to
    /// run, for the RDTSC hooks ([`tsc::ModelReads`]).
    model_reads: tsc::ModelReads,
}

/// Why the engine cannot be used, or could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum TcgError {
    #[error("the TCG engine: {what}: {err:?}")]
    Engine { what: &'static str, err: uc_error },
    #[error("the TCG engine: {what} did not end where it should (RIP {at:#x})")]
    Trampoline { what: &'static str, at: u64 },
    #[error("the TCG engine: {0}")]
    Unsupported(&'static str),
}

impl Data {
    fn new() -> Data {
        Data {
            acc: None,
            trampoline: None,
            stops: Default::default(),
            tsc_stops: Default::default(),
            code: CodeSnapshot::new(),
            fault: None,
            decoded: Decoded::default(),
            runs: 0,
            flushes: 0,
            cr2: 0,
            fpu: None,
            fpu_loads: 0,
            model_reads: tsc::ModelReads::default(),
        }
    }
}

fn uc_err(what: &'static str) -> impl Fn(uc_error) -> TcgError {
    move |err| TcgError::Engine { what, err }
}

/// How a single instruction completed in the engine ([`Tcg::complete`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Completed {
    /// It retired, leaving this state.
    Retired(CpuState),
    /// One iteration of a REP string instruction ran; the instruction goes on from this state.
    Iteration(CpuState),
    /// It raised exception `vector` in the engine and did not retire.
    Fault { vector: u32 },
    /// It raised a page fault with this error code and CR2, and did not retire.
    PageFault { error_code: u32, cr2: u64 },
}

/// Writes back to the vCPU what an engine run (or completion) that retired at least one
/// instruction changed of the state it started from: the general registers always; the segments,
/// the x87/SSE state and the MSRs where they differ. And KVM's interrupt shadow ends: STI's and
/// MOV SS's cover only the instruction after them (SDM Vol. 3A 6.8.3), which has now retired
/// outside KVM; unless the last instruction was STI (`after_sti`), whose own shadow begins.
pub fn write_back(
    vcpu: &mut dyn crate::Vcpu,
    before: &CpuState,
    after: &CpuState,
    after_sti: bool,
) -> Result<(), crate::VcpuError> {
    vcpu.set_interrupt_shadow(after_sti)?;
    vcpu.set_regs(&after.regs)?;
    if after.sregs != before.sregs {
        vcpu.set_sregs(&after.sregs)?;
    }
    if let (Some(a), Some(b)) = (&after.fpu, &before.fpu) {
        if !a.same_state(b) {
            vcpu.set_fpu(a)?;
        }
    }
    if let (Some(a), Some(b)) = (&after.msrs, &before.msrs) {
        let changed: Vec<(u32, u64)> = SysMsrs::INDICES
            .iter()
            .zip(a.values().iter().zip(b.values()))
            .filter(|(_, (x, y))| *x != y)
            .map(|(i, (x, _))| (*i, *x))
            .collect();
        if !changed.is_empty() {
            vcpu.set_msrs(&changed)?;
        }
    }
    Ok(())
}

/// The vCPU's whole state as an engine run or completion uses it: with the x87/SSE state and
/// the SYSCALL MSRs when `wants` says so.
pub fn state_of(vcpu: &mut dyn crate::Vcpu, wants: Needs) -> Result<CpuState, crate::VcpuError> {
    let mut s = CpuState::new(vcpu.regs()?, vcpu.sregs()?);
    if wants.fpu {
        s.fpu = Some(vcpu.fpu()?);
    }
    if wants.msrs {
        let v = vcpu.get_msrs(&SysMsrs::INDICES)?;
        s.msrs = Some(SysMsrs::from_values(v.try_into().expect("one value per MSR")));
    }
    Ok(s)
}

/// An engine made the first time it is needed, on the thread that uses it.
#[derive(Default)]
pub struct EngineCell(Option<Tcg>);

// SAFETY: the engine (which holds unicorn's non-thread-safe handle) is made by `get`, on the
// vCPU thread, and used only there; an `EngineCell` is moved to that thread before it has one.
unsafe impl Send for EngineCell {}

impl EngineCell {
    /// The engine over `mem`, made now if it was not yet.
    pub fn get(&mut self, mem: &GuestMemoryMmap) -> Result<&mut Tcg, TcgError> {
        if self.0.is_none() {
            self.0 = Some(Tcg::new(mem)?);
        }
        Ok(self.0.as_mut().expect("made above"))
    }

    /// Whether the engine has been made.
    pub fn made(&self) -> bool {
        self.0.is_some()
    }

    /// Times the engine dropped every translation (0 before it is made).
    pub fn flushes(&self) -> u64 {
        self.0.as_ref().map_or(0, Tcg::flushes)
    }

    /// Runs that loaded the whole vCPU state (0 before the engine is made).
    pub fn loads(&self) -> u64 {
        self.0.as_ref().map_or(0, |t| t.loads)
    }

    /// Times the x87/SSE state went into the engine (a load skips it where the engine holds it).
    pub fn fpu_loads(&self) -> u64 {
        self.0.as_ref().map_or(0, |t| t.uc.get_data().fpu_loads)
    }

    /// The guest ran in KVM: what the engine holds of the vCPU's state may be old (KVM's TLB
    /// and page-table writes, registers).
    pub fn ran_elsewhere(&mut self) {
        if let Some(t) = &mut self.0 {
            t.ran_elsewhere();
        }
    }
}

/// The engine: one unicorn instance over the VM's memory, made on the vCPU thread.
pub struct Tcg {
    uc: Unicorn<'static, Data>,
    /// RDTSC and RDTSCP's hooks in `uc` (declared after it: dropped after it).
    tsc: tsc::TscHooks,
    mem: GuestMemoryMmap,
    /// The instructions the engine hands over that follow others in a block, each with the code
    /// hook that stops the engine before it, so that the engine runs the block up to it.
    /// (unicorn's exits would do, but unicorn drops every translation that holds one after every
    /// run, and the code space they took is not reused until a full flush: measured, about 350
    /// bytes a run of memory growth, and a translation per exit per run.)
    stops: FxHashMap<u64, UcHookId>,
    /// The vCPU state the engine holds as the last run left it; `None` once the guest ran
    /// elsewhere (KVM) or the engine did anything else. A run from the same control state needs
    /// only its general registers loaded (and no TLB flush): after a SYSRETQ or IRETQ to user mode
    /// in the engine, the user-mode run that follows. Loading it all (control registers, which
    /// flush TCG's TLB, and a trampoline out of and back into user mode) was a sixth of a system
    /// call's time.
    held: Option<CpuState>,
    /// Runs that loaded the whole state.
    loads: u64,
}

/// Stop hooks kept at most; past that they go, with every translation.
const MAX_STOPS: usize = 4096;

impl Tcg {
    /// An engine with every region of `mem` mapped at its guest-physical address.
    pub fn new(mem: &GuestMemoryMmap) -> Result<Tcg, TcgError> {
        let mut uc =
            Unicorn::new_with_data(Arch::X86, Mode::MODE_64, Data::new()).map_err(uc_err("creating the engine"))?;
        // A CPU with what the engine runs (XSAVE, SMAP, FSGSBASE, MOVBE, ...); TCG drops from it
        // what it does not implement (AVX and the like: see `blocks`).
        uc.ctl_set_cpu_model(X86CpuModel::SKYLAKE_SERVER as i32).map_err(uc_err("choosing the CPU model"))?;
        for region in mem.iter() {
            let host = mem
                .get_host_address(region.start_addr())
                .map_err(|_| TcgError::Engine { what: "guest memory", err: uc_error::ARG })?;
            // SAFETY: the mapping lives as long as `mem`, which the engine keeps a handle to.
            unsafe { uc.mem_map_ptr(region.start_addr().0, region.len(), Prot::ALL, host.cast()) }
                .map_err(uc_err("mapping guest memory"))?;
        }
        private::map(&mut uc)?;
        uc.add_block_hook(1, 0, on_block).map_err(uc_err("adding the block hook"))?;
        // An exception (#PF, #GP, #DE ...) stops the engine before the faulting instruction retires.
        uc.add_intr_hook(|uc, vector| {
            let data = uc.get_data_mut();
            data.fault = Some(vector);
            if let Some(acc) = data.acc.as_mut() {
                acc.stop = Some(Stop::Fault);
            }
            let _ = uc.emu_stop();
        })
        .map_err(uc_err("adding the interrupt hook"))?;
        let tsc = tsc::TscHooks::add(&mut uc)?;
        uc.get_data_mut().model_reads = tsc.model_reads();
        Ok(Tcg { uc, tsc, mem: mem.clone(), stops: FxHashMap::default(), held: None, loads: 0 })
    }

    /// Runs from the vCPU state `state` (at `mode`) counting for `counting` (each armed counter
    /// with how far it is from overflowing), never across an overflow: see the module
    /// documentation. At CPL3 the engine does not stop short of an overflow: it runs on an
    /// instruction at a time up to the one that overflows a counter, and stops after it
    /// ([`Stop::Overflowed`]).
    pub fn run(&mut self, state: &CpuState, mode: CpuMode, counting: Counting) -> Result<Run, TcgError> {
        let held = self.held.take();
        let same = held.is_some_and(|h| h.sregs == state.sregs && (state.fpu.is_none() || h.fpu == state.fpu));
        if same {
            state::load_gprs(&mut self.uc, &state.regs)?;
            state::load_msrs(&mut self.uc, state.msrs.as_ref())?;
        } else {
            state::load(&mut self.uc, state)?;
            self.loads += 1;
        }
        let loaded = Needs { fpu: state.fpu.is_some(), msrs: state.msrs.is_some() };
        // A hook before each instruction breakpoint, in translations made for it (and none after).
        // Only a mapped address's translations can be dropped (unicorn translates the address with
        // the engine's state; another address space's breakpoint would raise a page fault outside
        // any run), and only there can the run meet it.
        let exec: Vec<u64> =
            counting.watch.exec.iter().copied().filter(|&at| mode.translate(&self.mem, at).is_some()).collect();
        let mut breakpoints = Vec::with_capacity(exec.len());
        for &at in &exec {
            breakpoints.push(self.uc.add_code_hook(at, at, on_breakpoint).map_err(uc_err("adding a breakpoint"))?);
            self.uc.ctl_remove_cache(at, at + 1).map_err(uc_err("dropping a translation"))?;
        }
        let data = self.uc.get_data_mut();
        data.fault = None;
        data.runs += 1;
        let decoded = (std::mem::take(&mut data.decoded), data.runs);
        self.tsc.begin(counting.tsc);
        data.acc = Some(Acc::new(mode, self.mem.clone(), counting, loaded, decoded));
        // The code hook costs a call per instruction: only while the cache model counts.
        let hooked = data.acc.as_ref().is_some_and(|a| a.cache.is_some());
        let hook = if hooked {
            Some(self.uc.add_code_hook(1, 0, on_insn).map_err(uc_err("adding the code hook"))?)
        } else {
            None
        };
        // Page tables may have changed since the last run (KVM ran the guest), and code too: the
        // translations stay while each page they come from holds the same bytes, checked as the
        // run enters it (see `CodeSnapshot`).
        if !self.uc.get_data_mut().code.begin(hooked) {
            self.flush()?;
        }
        if !same {
            self.uc.ctl_flush_tlb().map_err(uc_err("flushing the TLB"))?;
        }
        let started = self.run_to_stop(state.regs.rip, &mode)?;
        let (mut acc, stop, pc) = self.finish_run(started, mode)?;
        let tsc = self.tsc.end()?;
        let data = self.uc.get_data_mut();
        data.decoded = acc.take_decoded();
        if data.code.end(&self.mem) {
            // The run wrote code it had entered (Linux patches its own text): the blocks decoded
            // from it are decoded again (TCG drops its own translations of it).
            data.decoded = Decoded::default();
        }
        if let Some(h) = hook {
            self.uc.remove_hook(h).map_err(uc_err("removing the code hook"))?;
        }
        for (h, at) in breakpoints.into_iter().zip(exec) {
            self.uc.remove_hook(h).map_err(uc_err("removing a breakpoint"))?;
            self.uc.ctl_remove_cache(at, at + 1).map_err(uc_err("dropping a translation"))?;
        }
        let cpl = state::cpl(&self.uc)?;
        let after = state::collect(&mut self.uc, &self.mem, state, pc, (acc.used, acc.iret || acc.sysret))?;
        // Reading the x87/SSE state back goes through a trampoline, which leaves other state.
        self.held = (!(acc.used.fpu && state.fpu.is_some())).then(|| after.clone());
        Ok(Run {
            retired: acc.retired,
            blocks: acc.blocks_run,
            cycles: acc.cycles,
            counts: acc.counts,
            state: after,
            stop,
            cpl,
            iret: acc.iret,
            after_sti: acc.after_sti,
            flushed_tlb: acc.flushed_tlb,
            used: acc.used,
            cache: acc.cache,
            lbr: acc.lbr,
            fault: self.uc.get_data().fault,
            overflowed_at: acc.overflowed_at,
            tsc,
        })
    }

    /// The guest ran in KVM since the last run: the next run loads the whole state.
    pub fn ran_elsewhere(&mut self) {
        self.held = None;
    }

    /// Runs the one instruction at `state`'s RIP (which KVM could not run), with the x87/SSE
    /// state and the SYSCALL MSRs loaded when `state` has them, and says how it ended.
    pub fn complete(&mut self, state: &CpuState) -> Result<Completed, TcgError> {
        self.held = None;
        if let Some(done) = xsave::complete(&self.mem, state)? {
            return Ok(done);
        }
        let rip = state.regs.rip;
        let mode = CpuMode::from_sregs(&state.sregs);
        let bytes = mode.fetch(&self.mem, rip);
        let i = Decoder::with_ip(64, &bytes, rip, DecoderOptions::NONE).decode();
        let facts = insn::of(&i);
        let next = rip + i.len() as u64;
        // Where the next instruction is known before this one runs, a code hook there stops the
        // engine: right after the instruction, or at SYSRETQ's RCX (SDM Vol. 2B, SYSRET), after
        // which TCG checks the TF SYSRETQ loaded, not the one it ran with. No translation made
        // here outlives it (its page is not in the code snapshot).
        let stop_before = match facts.flow {
            insn::Flow::Next => Some(next),
            _ if i.code() == Code::Sysretq => Some(state.regs.rcx),
            _ => None,
        };
        // A translation runs on from the instruction up to a branch, and may cross into the next
        // page; where that page cannot be fetched from, TCG fails to translate it at all (nothing
        // runs, no exception: `Stop::Untranslatable`). Such an instruction, and a branch (whose
        // next instruction is not known before it runs), is translated alone: with RFLAGS.TF set
        // in the engine, TCG ends the translation after it, and the single-step trap it raises
        // there is the engine's. (A branch used to run counted by unicorn, whose counting hook is
        // compiled into every translation: every translation was dropped before and after it,
        // and a program traced an instruction at a time had its kernel code translated again at
        // every branch.)
        let next_page = (rip | 0xFFF).wrapping_add(1);
        let alone = mode.page_fault(&self.mem, next_page, emon_x86::mode::Access::Fetch, false).is_some()
            || stop_before.is_none();
        let tf = state.regs.rflags & RFLAGS_TF;
        if alone && tf == 0 {
            let mut s = state.clone();
            s.regs.rflags |= RFLAGS_TF;
            state::load(&mut self.uc, &s)?;
        } else {
            state::load(&mut self.uc, state)?;
        }
        let data = self.uc.get_data_mut();
        data.fault = None;
        data.acc = None;
        let started = if let Some(at) = stop_before {
            // The block hook stops nothing here (no run is counting): where TCG ends the
            // instruction's translation right after it (POPF, STI, a page's end), the engine goes
            // on in the translation at `at`, so one made before the hook goes too. (It did not:
            // a completion then ran on through the code after it, unseen and uncounted; with
            // every translation dropped at each branch until then, rarely.)
            let hook = self.stop_at(at, (rip, next))?;
            self.uc.ctl_remove_cache(at, at + 1).map_err(uc_err("dropping a translation"))?;
            let started = state::start(&mut self.uc, rip, 0);
            self.remove_stop_at(((rip, next), hook))?;
            self.uc.ctl_remove_cache(at, at + 1).map_err(uc_err("dropping a translation"))?;
            started
        } else {
            // A branch, alone under TF: translated from the bytes there now, and dropped after
            // the run as above. (unicorn finds a translation by the address the engine's state
            // maps it to, and one the branch left, such as IRETQ to user mode, may not reach the
            // kernel's page: the drop before the run is the one that always finds it.)
            self.uc.ctl_remove_cache(rip, next).map_err(uc_err("dropping a translation"))?;
            let started = state::start(&mut self.uc, rip, 0);
            self.uc.ctl_remove_cache(rip, next).map_err(uc_err("dropping a translation"))?;
            started
        };
        let pc = self.uc.reg_read(RegisterX86::RIP).map_err(uc_err("reading RIP"))?;
        // With RFLAGS.TF set, TCG raises the single-step trap after the instruction, or after a
        // REP string instruction's iteration (SDM Vol. 3B 17.3.1.4): it completed, and the trap
        // is the caller's to take.
        let single_step = tf != 0 || alone;
        match self.uc.get_data().fault {
            Some(vector) if !(single_step && vector == u32::from(DB_VECTOR)) => return Ok(Completed::Fault { vector }),
            _ => {}
        }
        // No progress but for a branch to itself or a REP iteration: the instruction faulted.
        let moved = pc != rip || matches!(facts.flow, insn::Flow::Direct { .. }) || facts.repeats;
        if started.is_err() || !moved {
            return Ok(Completed::Fault { vector: u32::from(emon_x86::arch::UD_VECTOR) });
        }
        let all = Needs { fpu: state.fpu.is_some(), msrs: state.msrs.is_some() };
        // IRETQ and SYSRETQ load segments: written back.
        let moved = matches!(i.code(), Code::Iretq | Code::Sysretq);
        let mut after = state::collect(&mut self.uc, &self.mem, state, pc, (all, moved))?;
        // The engine's TF off again, unless the instruction loaded RFLAGS itself.
        let loads_rflags = matches!(facts.special, insn::Special::Popf | insn::Special::Iret | insn::Special::Sysret);
        if alone && tf == 0 && !loads_rflags {
            after.regs.rflags &= !RFLAGS_TF;
        }
        Ok(if facts.retired_at(rip, pc) { Completed::Retired(after) } else { Completed::Iteration(after) })
    }

    /// Runs from `pc` until a real stop: a block that runs up to an instruction the engine hands
    /// over gets a stop hook there and runs again (nothing of it had run); a stop at a hook whose
    /// instruction the engine would run after all (other code at that address now) drops the hook
    /// and goes on.
    fn run_to_stop(&mut self, mut pc: u64, mode: &CpuMode) -> Result<Result<(), uc_error>, TcgError> {
        loop {
            let started = state::start(&mut self.uc, pc, 0);
            let now = self.uc.reg_read(RegisterX86::RIP).map_err(uc_err("reading RIP"))?;
            let acc = self.uc.get_data_mut().acc.as_mut().expect("set by run");
            if std::mem::take(&mut acc.changed) {
                // The block hook stopped before a block whose code changed behind the engine.
                acc.stop = None;
                self.flush()?;
                self.uc.get_data_mut().code.restart();
                pc = now;
                continue;
            }
            let acc = self.uc.get_data_mut().acc.as_mut().expect("set by run");
            if let Some((block, size, at)) = acc.cut.take() {
                // The block hook stopped before the block: nothing of it ran.
                acc.stop = None;
                let bytes = mode.fetch(&self.mem, at);
                let reads_tsc = blocks::reads_tsc(&Decoder::with_ip(64, &bytes, at, DecoderOptions::NONE).decode());
                self.add_stop(at, block, size, reads_tsc)?;
                pc = now;
                continue;
            }
            if acc.stop == Some(Stop::Handover) && self.stops.contains_key(&now) {
                let bytes = mode.fetch(&self.mem, now);
                let i = Decoder::with_ip(64, &bytes, now, DecoderOptions::NONE).decode();
                if class_in(&i, &mut InstructionInfoFactory::new(), acc.withheld) != Class::HandedOver
                    && !i.is_invalid()
                {
                    acc.stop = None;
                    // The block entered last ran up to the stop: what of it came before retired
                    // (the run goes on from the stop, in another block).
                    if let Some(block) = acc.current.take() {
                        acc.retire_entered(block, now, acc.cpl);
                    }
                    self.drop_stop(now)?;
                    pc = now;
                    continue;
                }
            }
            return Ok(started);
        }
    }

    /// Stops the engine before the handed-over instruction at `at` from now on, and drops the
    /// translation of the block at `block` (of `size` bytes) that was made without the stop;
    /// `reads_tsc`: the instruction is RDTSC or RDTSCP.
    fn add_stop(&mut self, at: u64, block: u64, size: u32, reads_tsc: bool) -> Result<(), TcgError> {
        if self.stops.len() >= MAX_STOPS {
            self.flush()?;
        }
        let hook = self.uc.add_code_hook(at, at, on_stop).map_err(uc_err("adding a stop"))?;
        self.stops.insert(at, hook);
        let data = self.uc.get_data_mut();
        data.stops.insert(at);
        if reads_tsc {
            data.tsc_stops.insert(at);
        }
        self.uc.ctl_remove_cache(block, block + u64::from(size).max(1)).map_err(uc_err("dropping a translation"))
    }

    /// Removes the stop at `at`, and the translations made with it: with a single code hook,
    /// unicorn calls it straight from the translation, and the hook's data goes with the hook
    /// (a translation that outlived it called freed memory: emon died of SIGSEGV).
    fn drop_stop(&mut self, at: u64) -> Result<(), TcgError> {
        let data = self.uc.get_data_mut();
        data.stops.remove(&at);
        data.tsc_stops.remove(&at);
        if let Some(hook) = self.stops.remove(&at) {
            self.uc.remove_hook(hook).map_err(uc_err("removing a stop"))?;
            self.uc.ctl_remove_cache(at, at + 1).map_err(uc_err("dropping a translation"))?;
        }
        Ok(())
    }

    /// Times every translation was dropped, since the engine was made.
    pub fn flushes(&self) -> u64 {
        self.uc.get_data().flushes
    }

    /// Drops every translation, and the stops made for them.
    fn flush(&mut self) -> Result<(), TcgError> {
        for (_, hook) in std::mem::take(&mut self.stops) {
            self.uc.remove_hook(hook).map_err(uc_err("removing a stop"))?;
        }
        let data = self.uc.get_data_mut();
        data.flushes += 1;
        data.stops.clear();
        data.tsc_stops.clear();
        // The decoded blocks go with the translations.
        data.decoded = Decoded::default();
        if let Some(acc) = data.acc.as_mut() {
            acc.take_decoded();
        }
        self.uc.ctl_flush_tb().map_err(uc_err("flushing translations"))
    }

    /// Where a run stopped and what it retired: the block entered last is counted when the stop
    /// did not come from the block hook, and near an overflow at CPL3 the run goes on an
    /// instruction at a time up to it.
    fn finish_run(&mut self, started: Result<(), uc_error>, mode: CpuMode) -> Result<(Acc, Stop, u64), TcgError> {
        let pc = self.uc.reg_read(RegisterX86::RIP).map_err(uc_err("reading RIP"))?;
        let mut acc = self.uc.get_data_mut().acc.take().expect("set by run");
        let mut stop = match (started, acc.stop) {
            (_, Some(s)) => s,
            // Memory outside RAM (the local APIC), or an instruction the engine cannot run.
            (Err(_), None) => Stop::Fault,
            // Every other stop is a hook's; TCG ends a run on its own where it fails to translate.
            (Ok(()), None) => Stop::Untranslatable,
        };
        // The block hook stops before a block and has retired the one before it; otherwise the
        // engine left the block entered last at `pc`. If `pc` is one of its instructions, that
        // instruction faulted (unicorn reports some faults, such as a #PF on a page that is not
        // present, only by ending the run there) and the ones before it retired; otherwise the
        // block retired whole.
        if let Some(block) = acc.current.take() {
            let to_cpl = state::cpl(&self.uc)?;
            if acc.retire_entered(block, pc, to_cpl) && stop != Stop::Breakpoint {
                stop = Stop::Fault;
            }
        }
        if stop != Stop::Overflow || mode.cpl != 3 {
            return Ok((acc, stop, pc));
        }
        acc.single = true;
        self.uc.get_data_mut().acc = Some(acc);
        let mut stop_after = None;
        let stepped = self.step_to_overflow(pc, &mut stop_after);
        if let Some(stop) = stop_after {
            self.remove_stop_at(stop)?;
        }
        let acc = self.uc.get_data_mut().acc.take().expect("set above");
        let (stop, pc) = stepped?;
        Ok((acc, stop, pc))
    }

    /// Stops the engine before the instruction at `at`: a code hook there, and the translations
    /// of the bytes in `drop` (those that reach `at` without the hook) dropped so that they are
    /// made again with it.
    fn stop_at(&mut self, at: u64, (from, to): (u64, u64)) -> Result<UcHookId, TcgError> {
        let hook = self
            .uc
            .add_code_hook(at, at, |uc, _, _| {
                let _ = uc.emu_stop();
            })
            .map_err(uc_err("adding a code hook"))?;
        self.uc.ctl_remove_cache(from, to).map_err(uc_err("dropping a translation"))?;
        Ok(hook)
    }

    /// Removes a hook [`Self::stop_at`] added, and the translation made with it: with a single
    /// code hook, unicorn calls it directly from the translation, which must not outlive it.
    fn remove_stop_at(&mut self, ((pc, next), hook): ((u64, u64), UcHookId)) -> Result<(), TcgError> {
        self.uc.remove_hook(hook).map_err(uc_err("removing a code hook"))?;
        self.uc.ctl_remove_cache(pc, next).map_err(uc_err("dropping a translation"))
    }

    /// Runs one instruction at a time from `pc` (CPL3, a counter near its overflow) until one
    /// brings a counter to its overflow, counting each in the engine's counting state (set, with
    /// `single`, so that the block hook stands aside); returns the stop and the new RIP.
    ///
    /// Each step runs from `pc` with the engine stopped before the block after the one it enters
    /// (`single`), and, where the instruction does not end its block, by a code hook on the
    /// instruction after it (`stop_after`: the instruction's address and the next one's, and the
    /// hook, which the caller removes at the end with [`Self::remove_stop_at`]). Only the
    /// translation starting at `pc` is made again for a step, and dropped with the hook; every
    /// other translation stays. (unicorn's own instruction count compiles a hook into every
    /// translation made while it counts, and drops them all when it stops counting: two flushes
    /// of every translation per sample, measured as most of the time `perf record` of a user loop
    /// took.)
    fn step_to_overflow(
        &mut self,
        mut pc: u64,
        stop_after: &mut Option<((u64, u64), UcHookId)>,
    ) -> Result<(Stop, u64), TcgError> {
        use super::events::{cycles, Derive};
        let mut info = InstructionInfoFactory::new();
        fn acc<'a>(uc: &'a mut Unicorn<'static, Data>) -> &'a mut Acc {
            uc.get_data_mut().acc.as_mut().expect("set by run")
        }
        let (mode, mem, cache, loaded, withheld) = {
            let a = acc(&mut self.uc);
            // Accesses of a block the block hook stopped before.
            a.accesses.clear();
            (a.mode, a.mem.clone(), a.cache.is_some(), a.loaded, a.withheld)
        };
        loop {
            let bytes = mode.fetch(&mem, pc);
            let i = Decoder::with_ip(64, &bytes, pc, DecoderOptions::NONE).decode();
            let runs = matches!(class_in(&i, &mut info, withheld), Class::Runs(n) if n.met_by(loaded));
            if i.is_invalid()
                || i.code() == Code::Iretq
                || !runs
                || cache && access::max_lines(&i, MIN_CACHE_LINE).is_err()
            {
                return Ok((Stop::Handover, pc));
            }
            let facts = insn::of(&i);
            // The code it runs is checked against the snapshot, as a run's blocks are, with the
            // page tables walked again (the block hook, which drops its walks at an INVLPG,
            // stands aside here).
            let len = i.len() as u32;
            let code = &mut self.uc.get_data_mut().code;
            code.walks_stale();
            if code.enter(&mem, &mode, pc, len).is_err() {
                self.flush()?;
                self.uc.get_data_mut().code.restart();
            }
            // The hook stays for the next iteration of a REP string instruction, and goes before
            // any other instruction (it would stop the engine before the instruction at it).
            let next = pc + u64::from(len);
            let wanted = (facts.flow == insn::Flow::Next).then_some((pc, next));
            if stop_after.is_some_and(|(at, _)| Some(at) != wanted) {
                self.remove_stop_at(stop_after.take().expect("checked"))?;
            }
            if let (Some(span), None) = (wanted, &stop_after) {
                *stop_after = Some((span, self.stop_at(next, span)?));
            }
            let data = self.uc.get_data_mut();
            let a = data.acc.as_mut().expect("set by run");
            if a.model_tsc && blocks::reads_tsc(&i) {
                data.model_reads.block(a.clock.cycles, &[(pc, 0)]);
            }
            (a.stop, a.single_entered, a.single_left) = (None, false, false);
            let r = state::start(&mut self.uc, pc, 0);
            let faulted = acc(&mut self.uc).stop == Some(Stop::Fault) || r.is_err();
            let next = self.uc.reg_read(RegisterX86::RIP).map_err(uc_err("reading RIP"))?;
            if !faulted && !facts.retired_at(pc, next) {
                // One iteration of a REP string instruction: it retires after its last.
                continue;
            }
            // No progress but for a branch to itself (which entered the block after it): the
            // instruction faulted (unicorn ends a run at some faults without calling the interrupt
            // hook; a CALL whose push faults leaves RIP at the CALL, as any direct branch to itself).
            if faulted || next == pc && !acc(&mut self.uc).single_left {
                acc(&mut self.uc).accesses.clear();
                return Ok((Stop::Fault, next));
            }
            let taken = super::stepper::taken(&facts, pc, next);
            let a = acc(&mut self.uc);
            a.retired += 1;
            a.after_sti = facts.special == insn::Special::Sti;
            a.used = a.used.union(match classify(&i, &mut info) {
                Class::Runs(n) => n,
                Class::HandedOver => Needs::NONE,
            });
            let c = cycles(&facts, taken);
            let ticks = a.clock.reference.ref_ticks_between(a.clock.cycles, c);
            let cache = a.feed(None);
            let mut hit = false;
            for k in 0..a.counts.len() {
                if a.counting[k] {
                    let m = a.armed[k].semantics;
                    a.counts[k] += a.armed[k].per_instruction(m.increment(&facts, pc, taken) + m.dynamic(ticks, cache));
                    hit |= a.counts[k] >= a.room[k];
                }
            }
            a.advance_clock(c);
            if let Some(lbr) = &mut a.lbr {
                if let Some(b) = super::branches::taken_branch(&facts, pc, next, taken, a.cpl) {
                    lbr.take(b, 1, a.clock.cycles, 0);
                }
            }
            if hit {
                acc(&mut self.uc).overflowed_at = Some(pc);
                return Ok((Stop::Overflowed, next));
            }
            pc = next;
        }
    }
}
