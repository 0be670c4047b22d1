//! The precise backend's TCG engine: runs counted guest code in QEMU's TCG (through unicorn) on
//! the VM's own memory, and counts it per translated block, instead of single-stepping it in KVM.
//!
//! The engine is a fast-forward between single steps. At an instruction boundary the backend
//! loads the vCPU's registers into the engine, which runs until, before any block it must not
//! run:
//! - a block holding an instruction that must go through KVM ([`runs_in_engine`]: port I/O, MSRs,
//!   CPUID, RDPMC, RDTSC, HLT, INT/IRET/SYSCALL, control and segment register loads, STI/CLI/POPF,
//!   x87/SSE/AVX, anything privileged or unknown);
//! - a block that could bring a counter to its overflow (the step that overflows it is the
//!   single-stepper's, so the PMI keeps zero skid);
//! - the end of its budget (so that KVM delivers interrupts at bounded intervals).
//!
//! It also stops at a fault (a page fault, an access outside RAM such as the local APIC): the
//! faulting instruction has not retired, and KVM runs it and delivers the real exception. The
//! registers go back to the vCPU, and single-stepping resumes exactly where the engine stopped.
//! Every count is exact: a block counts only once it has retired, and a block cut short counts
//! the instructions before the fault.
use super::cache::{CacheEvents, CacheModel};
use super::events::{cycles, Armed, Derive};
use emon_pmu::pmu::Semantics;
use emon_pmu::profile::{Clock, MIN_CACHE_LINE};
use emon_x86::access::{self, Access};
use emon_x86::insn::{self, Insn};
use emon_x86::mode::CpuMode;
use iced_x86::{Code, Decoder, DecoderOptions, FlowControl, Instruction, InstructionInfoFactory, Mnemonic, OpAccess};
use kvm_bindings::{kvm_regs, kvm_sregs};
use std::collections::HashMap;
use unicorn_engine::unicorn_const::{uc_error, Arch, Mode, Prot};
use unicorn_engine::{RegisterX86, Unicorn};
use vm_memory::{GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};

/// Instructions one engine run retires at most before handing back to KVM (about 30 ms here).
pub const BUDGET: u64 = 10_000_000;

/// Blocks decoded at most per address space (bounded like the stepper's decode cache).
const MAX_BLOCKS: usize = 16_384;

/// Why an engine run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// Before an instruction the engine must not run.
    Handover,
    /// A counter is close to its overflow.
    Overflow,
    /// The instruction budget is spent.
    Budget,
    /// A fault in the engine (the instruction at the stop did not retire).
    Fault,
    /// Before the first block at another privilege level (after an IRETQ).
    ModeChange,
    /// Right after the instruction that brought a counter to its overflow (CPL3 runs only,
    /// where the overflowing instruction cannot be single-stepped: see [`Tcg::run`]).
    Overflowed,
}

/// The model clock at the start of a run (for [`Semantics::RefXclk`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelClock {
    /// Core cycles counted since the VM started.
    pub cycles: u64,
    pub reference: Clock,
}

/// What a run counts: the armed counters (each with how far it is from overflowing), the model
/// clock, and the most instructions it may retire.
#[derive(Debug, Clone)]
pub struct Counting<'a> {
    pub armed: &'a [(Armed, u64)],
    pub clock: ModelClock,
    pub budget: u64,
    /// The cache model, while an LLC event counts: it sees every data access of the run, and
    /// comes back in [`Run::cache`].
    pub cache: Option<CacheModel>,
}

/// What one engine run retired.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    pub retired: u64,
    /// The core cycles of what it retired (the cost model), for the model clock.
    pub cycles: u64,
    /// Per armed counter, in the order given: its events (after the counter's filters).
    pub counts: Vec<u64>,
    pub regs: kvm_regs,
    pub stop: Stop,
    /// The privilege level at the stop.
    pub cpl: u8,
    /// An IRETQ retired: it may have changed the segments (see `segments`) and ends NMI blocking.
    pub iret: bool,
    /// After an IRETQ: the selectors of CS, SS, DS, ES, FS and GS, and the FS and GS bases.
    pub segments: Option<([u16; 6], u64, u64)>,
    /// The cache model given in [`Counting::cache`].
    pub cache: Option<CacheModel>,
}

/// A decoded block: each instruction's address and facts, whether the engine may run it, and
/// per armed counter what it adds when it retires whole.
#[derive(Debug, Clone)]
struct Block {
    insns: Vec<(u64, Insn)>,
    runnable: bool,
    /// Its last instruction is IRETQ.
    ends_in_iret: bool,
    /// The block is `loop .` alone (LOOP to itself, counting in RCX): see [`on_block`].
    self_loop: bool,
    /// Per armed counter: the events of every instruction but the last.
    body: Vec<u64>,
    /// Per armed counter: the last instruction's events when it branches and when it does not.
    last_taken: Vec<u64>,
    last_not: Vec<u64>,
    /// Core cycles: every instruction but the last, and the last when it branches or not.
    cycles_body: u64,
    cycles_taken: u64,
    cycles_not: u64,
    /// The most cache lines its data accesses can touch (counted only with a cache model).
    lines: u64,
}

impl Block {
    fn sums(&mut self, armed: &[Armed], counting: &[bool]) {
        let n = self.insns.len();
        let per = |a: &Armed, on: bool, (rip, i): &(u64, Insn), taken: bool| {
            if on {
                a.semantics.increment(i, *rip, taken)
            } else {
                0
            }
        };
        self.body = armed
            .iter()
            .zip(counting)
            .map(|(a, on)| self.insns[..n.saturating_sub(1)].iter().map(|x| per(a, *on, x, false)).sum())
            .collect();
        let last = self.insns.last();
        self.last_taken = armed.iter().zip(counting).map(|(a, on)| last.map_or(0, |x| per(a, *on, x, true))).collect();
        self.last_not = armed.iter().zip(counting).map(|(a, on)| last.map_or(0, |x| per(a, *on, x, false))).collect();
        self.cycles_body = self.insns[..n.saturating_sub(1)].iter().map(|(_, i)| cycles(i, false)).sum();
        self.cycles_taken = last.map_or(0, |(_, i)| cycles(i, true));
        self.cycles_not = last.map_or(0, |(_, i)| cycles(i, false));
    }
}

/// State the block hook works on.
struct Acc {
    mode: CpuMode,
    mem: GuestMemoryMmap,
    armed: Vec<Armed>,
    counting: Vec<bool>,
    /// Events each armed counter may still take before it would overflow.
    room: Vec<u64>,
    counts: Vec<u64>,
    retired: u64,
    /// The model clock now, and the cycles retired in this run.
    clock: ModelClock,
    cycles: u64,
    budget: u64,
    /// The block entered last, not yet known to have retired.
    current: Option<u64>,
    blocks: HashMap<u64, Block>,
    stop: Option<Stop>,
    /// The privilege level the run counts at (the USR/OS filters), and whether an IRETQ has
    /// retired (the next block may be at another level).
    cpl: u8,
    iret: bool,
    /// Instruction-at-a-time execution near an overflow: the block hook stands aside.
    single: bool,
    /// The cache model (while an LLC event counts), and the data accesses of the instructions
    /// of the current block that have started, each with its RIP, in order (see [`on_insn`]).
    cache: Option<CacheModel>,
    accesses: Vec<(u64, Access)>,
    /// Instructions decoded for [`on_insn`], by address.
    decoded: HashMap<u64, Instruction>,
    /// The blocks entered (linear address, size), each once: the pages the translations come from.
    entered: Vec<(u64, u32)>,
}

impl Acc {
    /// The counting state of a run at `mode` for `counting`.
    fn new(mode: CpuMode, mem: GuestMemoryMmap, counting: Counting) -> Acc {
        let Counting { armed, clock, budget, cache } = counting;
        Acc {
            mode,
            mem,
            armed: armed.iter().map(|(a, _)| *a).collect(),
            counting: armed.iter().map(|(a, _)| if mode.cpl == 0 { a.os } else { a.usr }).collect(),
            room: armed.iter().map(|(_, d)| *d).collect(),
            counts: vec![0; armed.len()],
            retired: 0,
            clock,
            cycles: 0,
            budget,
            current: None,
            blocks: HashMap::new(),
            stop: None,
            cpl: mode.cpl,
            iret: false,
            single: false,
            accesses: Vec::new(),
            decoded: HashMap::new(),
            cache,
            entered: Vec::new(),
        }
    }

    fn block(&mut self, addr: u64, size: u32) -> &Block {
        if self.blocks.len() >= MAX_BLOCKS {
            self.blocks.clear();
        }
        let (mode, mem, armed, counting) = (&self.mode, &self.mem, &self.armed, &self.counting);
        let cache = self.cache.is_some();
        let entered = &mut self.entered;
        self.blocks.entry(addr).or_insert_with(|| {
            // Once per block and run (the hook runs at every execution of every block).
            entered.push((addr, size));
            let mut b = decode_block(mode, mem, addr, size as usize, cache);
            b.sums(armed, counting);
            b
        })
    }

    /// Counts the whole block at `addr` as retired; control went on to `next`.
    fn retire_block(&mut self, addr: u64, next: u64) {
        let b = &self.blocks[&addr];
        self.iret |= b.ends_in_iret;
        let Some((rip, last)) = b.insns.last() else { return };
        let taken = super::stepper::taken(last, *rip, next);
        self.retired += b.insns.len() as u64;
        let c = b.cycles_body + if taken { b.cycles_taken } else { b.cycles_not };
        let ticks = self.clock.reference.ref_ticks_between(self.clock.cycles, c);
        let cache = self.feed(None);
        let b = &self.blocks[&addr];
        for (k, count) in self.counts.iter_mut().enumerate() {
            *count += b.body[k] + if taken { b.last_taken[k] } else { b.last_not[k] };
            if self.counting[k] {
                *count += self.armed[k].semantics.dynamic(ticks, cache);
            }
        }
        self.advance_clock(c);
    }

    /// Feeds the data accesses of the instructions that have started to the cache model, all of
    /// them or those before the one at `fault` (which did not retire); what they did at the LLC.
    fn feed(&mut self, fault: Option<u64>) -> CacheEvents {
        let accesses = std::mem::take(&mut self.accesses);
        let Some(cache) = &mut self.cache else { return CacheEvents::default() };
        let retired = accesses.iter().take_while(|(rip, _)| Some(*rip) != fault).count();
        super::cache_feed::feed_each(cache, &self.mode, &self.mem, &accesses[..retired])
    }

    fn advance_clock(&mut self, c: u64) {
        self.clock.cycles += c;
        self.cycles += c;
    }

    /// Counts the first `n` instructions of the block at `addr` (none of them a taken branch:
    /// the block was cut short by a fault at the next one).
    fn retire_first(&mut self, addr: u64, n: usize) {
        let fault = self.blocks[&addr].insns.get(n).map(|(rip, _)| *rip);
        let cache = self.feed(fault);
        let insns = &self.blocks[&addr].insns[..n];
        self.retired += n as u64;
        let c = insns.iter().map(|(_, i)| cycles(i, false)).sum();
        let ticks = self.clock.reference.ref_ticks_between(self.clock.cycles, c);
        for (k, (a, on)) in self.armed.iter().zip(&self.counting).enumerate() {
            if *on {
                self.counts[k] += insns.iter().map(|(rip, i)| a.semantics.increment(i, *rip, false)).sum::<u64>();
                self.counts[k] += a.semantics.dynamic(ticks, cache);
            }
        }
        self.advance_clock(c);
    }

    /// Whether the block at `addr` could bring a counter to its overflow.
    fn could_overflow(&self, addr: u64) -> bool {
        let b = &self.blocks[&addr];
        let c = b.cycles_body + b.cycles_taken.max(b.cycles_not);
        (0..self.counts.len()).any(|k| {
            let dynamic = if self.counting[k] {
                self.armed[k].semantics.dynamic_bound(c, b.lines, self.clock.reference)
            } else {
                0
            };
            self.counts[k] + b.body[k] + b.last_taken[k].max(b.last_not[k]) + dynamic >= self.room[k]
        })
    }
}

/// Decodes the block of `size` bytes at linear `addr`.
/// With `cache` (the cache model counts), an instruction whose data accesses cannot be known
/// before it runs (a REP string instruction) ends the runnable part: it is stepped.
fn decode_block(mode: &CpuMode, mem: &GuestMemoryMmap, addr: u64, size: usize, cache: bool) -> Block {
    let mut bytes = Vec::with_capacity(size + 15);
    let mut a = addr;
    while bytes.len() < size + 15 {
        let chunk = mode.fetch(mem, a);
        if chunk.is_empty() {
            break;
        }
        a += chunk.len() as u64;
        bytes.extend(chunk);
    }
    let mut insns = Vec::new();
    let mut runnable = true;
    let mut lines = 0;
    let mut self_loop = false;
    let mut ends_in_iret = false;
    let mut d = Decoder::with_ip(64, &bytes, addr, DecoderOptions::NONE);
    let mut info = InstructionInfoFactory::new();
    while d.ip() < addr + size as u64 {
        let i = d.decode();
        // The smallest line a profile may have: the bound holds whatever the profile's line.
        let accesses = if cache { access::max_lines(&i, MIN_CACHE_LINE).ok() } else { Some(0) };
        match (!i.is_invalid()).then(|| insn::of(&i)) {
            Some(f) if runs_in_engine(&i, &mut info) && accesses.is_some() => {
                lines += accesses.unwrap_or(0);
                self_loop = i.code() == Code::Loop_rel8_64_RCX && i.near_branch_target() == i.ip();
                ends_in_iret = i.code() == Code::Iretq;
                insns.push((i.ip(), f));
            }
            _ => {
                runnable = false;
                break;
            }
        }
    }
    let self_loop = self_loop && insns.len() == 1;
    Block {
        insns,
        runnable,
        ends_in_iret,
        self_loop,
        body: Vec::new(),
        last_taken: Vec::new(),
        last_not: Vec::new(),
        cycles_body: 0,
        cycles_taken: 0,
        cycles_not: 0,
        lines,
    }
}

/// Instructions that must go through KVM or the VMM (see the module documentation), by
/// mnemonic: they read or set state the engine does not hold (the TSC, MSRs, CPUID, I/O, RFLAGS.IF,
/// segments, XCR0), transfer control through the IDT or to another privilege level, or wait.
const HANDED_OVER: &[Mnemonic] = {
    use Mnemonic::*;
    &[
        Cpuid, Rdtsc, Rdtscp, Rdpmc, Rdmsr, Wrmsr, In, Out, Insb, Insw, Insd, Outsb, Outsw, Outsd, Hlt, Sti, Cli, Popf,
        Popfq, Popfd, Iret, Iretd, Iretq, Syscall, Sysret, Sysretq, Sysenter, Sysexit, Int, Int1, Int3, Into, Ud0, Ud1,
        Ud2, Retf, Lss, Lfs, Lgs, Lds, Les, Swapgs, Rdfsbase, Rdgsbase, Wrfsbase, Wrgsbase, Xgetbv, Xsetbv, Rdrand,
        Rdseed, Rdpid, Pause, Wbinvd, Invd, Monitor, Mwait, Umonitor, Umwait, Tpause, Enqcmd, Serialize,
    ]
};

/// The instruction sets the engine runs: the base integer ones.
const ENGINE_FEATURES: &[iced_x86::CpuidFeature] = {
    use iced_x86::CpuidFeature::*;
    &[
        INTEL8086,
        INTEL8086_ONLY,
        INTEL186,
        INTEL286,
        INTEL386,
        INTEL486,
        X64,
        CMOV,
        CX8,
        CMPXCHG16B,
        MULTIBYTENOP,
        BMI1,
        BMI2,
        LZCNT,
        POPCNT,
        ADX,
        MOVBE,
        // CLFLUSH, CLFLUSHOPT, CLWB: no effect on memory; the code hook gives the cache model
        // their flush (`on_insn`).
        CLFSH,
        CLFLUSHOPT,
        CLWB,
    ]
};

/// Whether the engine may run `i`: plain integer instructions whose effects are registers, flags
/// and memory, nothing KVM or the VMM must see (see the module documentation).
pub fn runs_in_engine(i: &Instruction, info: &mut InstructionInfoFactory) -> bool {
    // IRETQ runs in the engine, so that a return to user mode stays under its control (KVM
    // cannot single-step CPL3 code on some hosts); the run stops before the first block at the
    // new privilege level, and the VMM writes the segments back and ends NMI blocking.
    if i.code() == Code::Iretq {
        return true;
    }
    let far = i.is_jmp_far() || i.is_call_far() || i.is_jmp_far_indirect() || i.is_call_far_indirect();
    let plain_flow = matches!(
        i.flow_control(),
        FlowControl::Next
            | FlowControl::UnconditionalBranch
            | FlowControl::ConditionalBranch
            | FlowControl::IndirectBranch
            | FlowControl::Call
            | FlowControl::IndirectCall
            | FlowControl::Return
    );
    // PUSHF: RFLAGS.VIF/VM/RF read differently under TCG; KVM keeps the truth.
    let pushf = matches!(i.code(), Code::Pushfq | Code::Pushfd | Code::Pushfw);
    if i.is_invalid() || i.is_privileged() || far || !plain_flow || pushf || HANDED_OVER.contains(&i.mnemonic()) {
        return false;
    }
    // Segment register loads and any x87/MMX/SSE/AVX register (not moved into the engine).
    let touches_outside = info.info(i).used_registers().iter().any(|r| {
        let reg = r.register();
        (reg.is_segment_register() && r.access() != OpAccess::Read)
            || reg.is_xmm()
            || reg.is_ymm()
            || reg.is_zmm()
            || reg.is_mm()
            || reg.is_st()
            || reg.is_k()
            || reg.is_cr()
            || reg.is_dr()
            || reg.is_tr()
    });
    !touches_outside && i.cpuid_features().iter().all(|f| ENGINE_FEATURES.contains(f))
}

/// The engine: one unicorn instance over the VM's memory, made on the vCPU thread.
pub struct Tcg {
    uc: Unicorn<'static, Option<Acc>>,
    mem: GuestMemoryMmap,
    /// The last run ended at CPL3. unicorn's API cannot bring its CPU back to CPL0 (segment loads
    /// are checked against the current CPL), so a kernel run after it starts on a fresh engine.
    at_cpl3: bool,
    /// What the engine's translations were made from (README, "The TCG engine").
    code: CodeSnapshot,
}

/// The guest-physical pages the engine's translations were made from, as they were then: between
/// runs KVM and the VMM may write guest memory behind the engine's back, so a run keeps the
/// translations only while every one of these pages still holds the same bytes. Re-translating
/// at every run made interrupt-heavy counted code (a run every ~80 instructions) cost about
/// 0.7 ms a run, slower than a Linux timer tick on this host.
struct CodeSnapshot {
    pages: HashMap<u64, Box<[u8]>>,
    /// The translations must go whatever the pages hold: none are known to be clean (a new
    /// engine, or instruction-counting translations made by `step_to_overflow`).
    stale: bool,
    /// The translations were made with the code hook (the cache model counts).
    hooked: bool,
}

/// Code pages compared before a run, at most; past that the translations are dropped instead.
const MAX_CODE_PAGES: usize = 256;
const PAGE: u64 = 4096;

impl CodeSnapshot {
    fn new() -> CodeSnapshot {
        CodeSnapshot { pages: HashMap::new(), stale: true, hooked: false }
    }

    /// Are the translations still those of the guest's code, for a run `hooked` or not?
    fn valid(&self, mem: &GuestMemoryMmap, hooked: bool) -> bool {
        use vm_memory::Bytes;
        let mut now = vec![0u8; PAGE as usize];
        !self.stale
            && self.hooked == hooked
            && self.pages.iter().all(|(&page, then)| {
                mem.read_slice(&mut now, vm_memory::GuestAddress(page)).is_ok() && now[..] == then[..]
            })
    }

    /// Records the pages of the blocks a run entered (`entered`: linear address and size).
    fn record(&mut self, mem: &GuestMemoryMmap, mode: &CpuMode, entered: &[(u64, u32)]) {
        use vm_memory::Bytes;
        for &(addr, size) in entered {
            for la in [addr, addr + u64::from(size.max(1)) - 1] {
                let Some(page) = mode.translate(mem, la).map(|pa| pa & !(PAGE - 1)) else {
                    // A page the engine ran but emon cannot find again: trust nothing next time.
                    self.stale = true;
                    continue;
                };
                if self.pages.contains_key(&page) {
                    continue;
                }
                let mut bytes = vec![0u8; PAGE as usize].into_boxed_slice();
                if mem.read_slice(&mut bytes, vm_memory::GuestAddress(page)).is_err() {
                    self.stale = true;
                    continue;
                }
                self.pages.insert(page, bytes);
            }
        }
        if self.pages.len() > MAX_CODE_PAGES {
            self.stale = true;
        }
    }
}

#[repr(C)]
struct Mmr {
    selector: u16,
    base: u64,
    limit: u32,
    flags: u32,
}

#[repr(C)]
struct Msr {
    rid: u32,
    value: u64,
}

fn bytes_of<T>(v: &T) -> &[u8] {
    // SAFETY: `T` is a plain repr(C) struct; its bytes (padding included) are read as the C API reads them.
    unsafe { std::slice::from_raw_parts(v as *const T as *const u8, std::mem::size_of::<T>()) }
}

/// Why the engine cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("the TCG engine: {what}: {err:?}")]
pub struct TcgError {
    pub what: &'static str,
    pub err: uc_error,
}

fn uc_err(what: &'static str) -> impl Fn(uc_error) -> TcgError {
    move |err| TcgError { what, err }
}

impl Tcg {
    /// An engine with every region of `mem` mapped at its guest-physical address.
    pub fn new(mem: &GuestMemoryMmap) -> Result<Tcg, TcgError> {
        let mut uc = Unicorn::new_with_data(Arch::X86, Mode::MODE_64, None).map_err(uc_err("creating the engine"))?;
        for region in mem.iter() {
            let host = mem
                .get_host_address(region.start_addr())
                .map_err(|_| TcgError { what: "guest memory", err: uc_error::ARG })?;
            // SAFETY: the mapping lives as long as `mem`, which the engine keeps a handle to.
            unsafe { uc.mem_map_ptr(region.start_addr().0, region.len(), Prot::ALL, host.cast()) }
                .map_err(uc_err("mapping guest memory"))?;
        }
        uc.add_block_hook(1, 0, on_block).map_err(uc_err("adding the block hook"))?;
        // An exception (#PF, #GP, #DE ...) stops the engine before the faulting instruction retires.
        uc.add_intr_hook(|uc, _vector| {
            if let Some(acc) = uc.get_data_mut() {
                acc.stop = Some(Stop::Fault);
            }
            let _ = uc.emu_stop();
        })
        .map_err(uc_err("adding the interrupt hook"))?;
        Ok(Tcg { uc, mem: mem.clone(), at_cpl3: false, code: CodeSnapshot::new() })
    }

    /// Runs from the vCPU state `regs`/`sregs` for at most `budget` instructions, counting for
    /// `armed` (each with how far it is from overflowing) at CPL `mode.cpl`. Never crosses an
    /// overflow: see the module documentation.
    ///
    /// `resume`: the engine already holds the segment and control state (its last run ended
    /// here, at CPL3, and the vCPU has not run since); only the general registers are loaded.
    /// At CPL3 the engine does not stop short of an overflow: it runs on an instruction at a
    /// time up to the one that overflows a counter, and stops after it ([`Stop::Overflowed`]).
    pub fn run(
        &mut self,
        regs: &kvm_regs,
        sregs: &kvm_sregs,
        mode: CpuMode,
        counting: Counting,
        resume: bool,
    ) -> Result<Run, TcgError> {
        if resume {
            self.load_gprs(regs)?;
        } else {
            if self.at_cpl3 {
                *self = Tcg::new(&self.mem)?;
            }
            self.load(regs, sregs)?;
        }
        *self.uc.get_data_mut() = Some(Acc::new(mode, self.mem.clone(), counting));
        // The code hook costs a call per instruction: only while the cache model counts.
        let hook = if self.uc.get_data().as_ref().is_some_and(|a| a.cache.is_some()) {
            Some(self.uc.add_code_hook(1, 0, on_insn).map_err(uc_err("adding the code hook"))?)
        } else {
            None
        };
        // Page tables may have changed since the last run (KVM ran the guest), and code too: the
        // translations stay only if every page they were made from holds the same bytes.
        if !self.code.valid(&self.mem, hook.is_some()) {
            self.uc.ctl_flush_tb().map_err(uc_err("flushing translations"))?;
            self.code = CodeSnapshot { stale: false, hooked: hook.is_some(), ..CodeSnapshot::new() };
        }
        self.uc.ctl_flush_tlb().map_err(uc_err("flushing the TLB"))?;
        let started = self.uc.emu_start(regs.rip, u64::MAX, 0, 0);
        let (acc, stop, pc) = self.finish_run(started, mode)?;
        self.code.record(&self.mem, &mode, &acc.entered);
        if let Some(h) = hook {
            self.uc.remove_hook(h).map_err(uc_err("removing the code hook"))?;
        }
        self.collect(regs, acc, stop, pc)
    }

    /// Where a run stopped and what it retired: the block entered last is counted when the stop
    /// did not come from the block hook, and near an overflow at CPL3 the run goes on an
    /// instruction at a time up to it.
    fn finish_run(&mut self, started: Result<(), uc_error>, mode: CpuMode) -> Result<(Acc, Stop, u64), TcgError> {
        let pc = self.uc.reg_read(RegisterX86::RIP).map_err(uc_err("reading RIP"))?;
        let mut acc = self.uc.get_data_mut().take().expect("set by run");
        let mut stop = match (started, acc.stop) {
            (_, Some(s)) => s,
            // Memory outside RAM (the local APIC), or an instruction the engine cannot run.
            (Err(_), None) => Stop::Fault,
            (Ok(()), None) => Stop::Budget,
        };
        // The block hook stops before a block and has retired the one before it; otherwise the
        // engine left the block entered last at `pc`. If `pc` is one of its instructions, that
        // instruction faulted (unicorn reports some faults, such as a #PF on a page that is not
        // present, only by ending the run there) and the ones before it retired; otherwise the
        // block retired whole.
        if let Some(addr) = acc.current.take() {
            match acc.blocks[&addr].insns.iter().position(|(rip, _)| *rip == pc) {
                Some(k) => {
                    acc.retire_first(addr, k);
                    stop = Stop::Fault;
                }
                None => acc.retire_block(addr, pc),
            }
        }
        if stop != Stop::Overflow || mode.cpl != 3 {
            return Ok((acc, stop, pc));
        }
        acc.single = true;
        *self.uc.get_data_mut() = Some(acc);
        let stepped = self.step_to_overflow(pc);
        let acc = self.uc.get_data_mut().take().expect("set above");
        // Its translations count instructions one at a time: not for the next run.
        self.code.stale = true;
        let (stop, pc) = stepped?;
        Ok((acc, stop, pc))
    }

    /// The run's result: the registers and, after an IRETQ, the segments the engine holds.
    fn collect(&mut self, regs: &kvm_regs, acc: Acc, stop: Stop, pc: u64) -> Result<Run, TcgError> {
        let mut out = *regs;
        for (r, slot) in gprs(&mut out) {
            *slot = self.uc.reg_read(r).map_err(uc_err("reading registers"))?;
        }
        out.rip = pc;
        let cs = self.uc.reg_read(RegisterX86::CS).map_err(uc_err("reading CS"))?;
        let segments = if acc.iret { Some(self.segments()?) } else { None };
        self.at_cpl3 = cs & 3 == 3;
        Ok(Run {
            retired: acc.retired,
            cycles: acc.cycles,
            counts: acc.counts,
            regs: out,
            stop,
            cpl: (cs & 3) as u8,
            iret: acc.iret,
            segments,
            cache: acc.cache,
        })
    }

    /// The selectors of CS, SS, DS, ES, FS and GS, and the FS and GS bases.
    fn segments(&mut self) -> Result<([u16; 6], u64, u64), TcgError> {
        let mut sel = [0u16; 6];
        let regs6 =
            [RegisterX86::CS, RegisterX86::SS, RegisterX86::DS, RegisterX86::ES, RegisterX86::FS, RegisterX86::GS];
        for (s, r) in sel.iter_mut().zip(regs6) {
            *s = self.uc.reg_read(r).map_err(uc_err("reading segments"))? as u16;
        }
        let fs = self.uc.reg_read(RegisterX86::FS_BASE).map_err(uc_err("reading FS"))?;
        let gs = self.uc.reg_read(RegisterX86::GS_BASE).map_err(uc_err("reading GS"))?;
        Ok((sel, fs, gs))
    }

    /// Runs one instruction at a time from `pc` (CPL3, a counter near its overflow) until one
    /// brings a counter to its overflow, counting each in the engine's counting state (set, with
    /// `single`, so that the block hook stands aside); returns the stop and the new RIP.
    fn step_to_overflow(&mut self, mut pc: u64) -> Result<(Stop, u64), TcgError> {
        let mut info = InstructionInfoFactory::new();
        // unicorn counts instructions with a hook compiled into each translation: blocks made
        // without it would run whole.
        self.uc.ctl_flush_tb().map_err(uc_err("flushing translations"))?;
        fn acc<'a>(uc: &'a mut Unicorn<'static, Option<Acc>>) -> &'a mut Acc {
            uc.get_data_mut().as_mut().expect("set by run")
        }
        let (mode, mem, cache) = {
            let a = acc(&mut self.uc);
            // Accesses of a block the block hook stopped before.
            a.accesses.clear();
            (a.mode, a.mem.clone(), a.cache.is_some())
        };
        loop {
            let bytes = mode.fetch(&mem, pc);
            let i = Decoder::with_ip(64, &bytes, pc, DecoderOptions::NONE).decode();
            if i.is_invalid()
                || i.code() == Code::Iretq
                || !runs_in_engine(&i, &mut info)
                || cache && access::max_lines(&i, MIN_CACHE_LINE).is_err()
            {
                return Ok((Stop::Handover, pc));
            }
            let facts = insn::of(&i);
            acc(&mut self.uc).stop = None;
            let r = self.uc.emu_start(pc, u64::MAX, 0, 1);
            let faulted = acc(&mut self.uc).stop == Some(Stop::Fault) || r.is_err();
            let next = self.uc.reg_read(RegisterX86::RIP).map_err(uc_err("reading RIP"))?;
            // No progress but for a branch to itself: the instruction faulted (unicorn ends a run
            // at some faults without calling the interrupt hook).
            if faulted || next == pc && !matches!(facts.flow, emon_x86::insn::Flow::Direct { .. }) {
                acc(&mut self.uc).accesses.clear();
                return Ok((Stop::Fault, next));
            }
            let taken = super::stepper::taken(&facts, pc, next);
            let a = acc(&mut self.uc);
            a.retired += 1;
            let c = cycles(&facts, taken);
            let ticks = a.clock.reference.ref_ticks_between(a.clock.cycles, c);
            let cache = a.feed(None);
            let mut hit = false;
            for k in 0..a.counts.len() {
                if a.counting[k] {
                    let m = a.armed[k].semantics;
                    a.counts[k] += m.increment(&facts, pc, taken) + m.dynamic(ticks, cache);
                    hit |= a.counts[k] >= a.room[k];
                }
            }
            a.advance_clock(c);
            pc = next;
            if hit {
                return Ok((Stop::Overflowed, pc));
            }
        }
    }

    /// Loads the general registers, RFLAGS and RIP.
    fn load_gprs(&mut self, r: &kvm_regs) -> Result<(), TcgError> {
        let w = uc_err("loading the vCPU state");
        let mut values = *r;
        for (reg, v) in gprs(&mut values) {
            self.uc.reg_write(reg, *v).map_err(&w)?;
        }
        self.uc.reg_write(RegisterX86::RIP, r.rip).map_err(&w)
    }

    fn load(&mut self, r: &kvm_regs, s: &kvm_sregs) -> Result<(), TcgError> {
        let uc = &mut self.uc;
        let w = uc_err("loading the vCPU state");
        let msr = |uc: &mut Unicorn<'static, Option<Acc>>, rid: u32, value: u64| {
            uc.reg_write_long(RegisterX86::MSR, bytes_of(&Msr { rid, value }))
        };
        uc.reg_write(RegisterX86::CR4, s.cr4).map_err(&w)?;
        msr(uc, 0xC000_0080, s.efer).map_err(&w)?; // IA32_EFER
        uc.reg_write(RegisterX86::CR3, s.cr3).map_err(&w)?;
        uc.reg_write(RegisterX86::CR0, s.cr0).map_err(&w)?;
        for (reg, dt) in [(RegisterX86::GDTR, &s.gdt), (RegisterX86::IDTR, &s.idt)] {
            let m = Mmr { selector: 0, base: dt.base, limit: u32::from(dt.limit), flags: 0 };
            uc.reg_write_long(reg, bytes_of(&m)).map_err(&w)?;
        }
        for (reg, seg) in
            [(RegisterX86::SS, &s.ss), (RegisterX86::CS, &s.cs), (RegisterX86::DS, &s.ds), (RegisterX86::ES, &s.es)]
        {
            uc.reg_write(reg, u64::from(seg.selector)).map_err(&w)?;
        }
        uc.reg_write(RegisterX86::FS_BASE, s.fs.base).map_err(&w)?;
        uc.reg_write(RegisterX86::GS_BASE, s.gs.base).map_err(&w)?;
        self.load_gprs(r)
    }
}

/// The general-purpose registers and RFLAGS, each with its unicorn name (RIP is set apart).
fn gprs(r: &mut kvm_regs) -> [(RegisterX86, &mut u64); 17] {
    [
        (RegisterX86::RAX, &mut r.rax),
        (RegisterX86::RBX, &mut r.rbx),
        (RegisterX86::RCX, &mut r.rcx),
        (RegisterX86::RDX, &mut r.rdx),
        (RegisterX86::RSI, &mut r.rsi),
        (RegisterX86::RDI, &mut r.rdi),
        (RegisterX86::RSP, &mut r.rsp),
        (RegisterX86::RBP, &mut r.rbp),
        (RegisterX86::R8, &mut r.r8),
        (RegisterX86::R9, &mut r.r9),
        (RegisterX86::R10, &mut r.r10),
        (RegisterX86::R11, &mut r.r11),
        (RegisterX86::R12, &mut r.r12),
        (RegisterX86::R13, &mut r.r13),
        (RegisterX86::R14, &mut r.r14),
        (RegisterX86::R15, &mut r.r15),
        (RegisterX86::RFLAGS, &mut r.rflags),
    ]
}

/// The code hook, installed while the cache model counts: the data accesses of the instruction
/// about to run at `addr`, from the registers now, join those of the block's earlier instructions
/// (fed to the cache model when they retire: [`Acc::feed`]).
fn on_insn(uc: &mut Unicorn<'_, Option<Acc>>, addr: u64, _size: u32) {
    let Some(acc) = uc.get_data_mut() else { return };
    if acc.decoded.len() >= MAX_BLOCKS {
        acc.decoded.clear();
    }
    let (mode, mem) = (&acc.mode, &acc.mem);
    let i = *acc.decoded.entry(addr).or_insert_with(|| {
        let bytes = mode.fetch(mem, addr);
        Decoder::with_ip(64, &bytes, addr, DecoderOptions::NONE).decode()
    });
    let (fs, gs) = match i.memory_segment() {
        iced_x86::Register::FS | iced_x86::Register::GS => {
            (uc.reg_read(RegisterX86::FS_BASE).unwrap_or(0), uc.reg_read(RegisterX86::GS_BASE).unwrap_or(0))
        }
        _ => (0, 0),
    };
    let accesses = access::data_accesses(&i, |r| unicorn_gpr(r).and_then(|r| uc.reg_read(r).ok()).unwrap_or(0), fs, gs);
    if let (Ok(a), Some(acc)) = (accesses, uc.get_data_mut()) {
        acc.accesses.extend(a.into_iter().map(|x| (addr, x)));
    }
}

/// unicorn's name for a 64-bit general-purpose register (or RIP).
fn unicorn_gpr(r: iced_x86::Register) -> Option<RegisterX86> {
    use iced_x86::Register::*;
    Some(match r {
        RAX => RegisterX86::RAX,
        RBX => RegisterX86::RBX,
        RCX => RegisterX86::RCX,
        RDX => RegisterX86::RDX,
        RSI => RegisterX86::RSI,
        RDI => RegisterX86::RDI,
        RSP => RegisterX86::RSP,
        RBP => RegisterX86::RBP,
        R8 => RegisterX86::R8,
        R9 => RegisterX86::R9,
        R10 => RegisterX86::R10,
        R11 => RegisterX86::R11,
        R12 => RegisterX86::R12,
        R13 => RegisterX86::R13,
        R14 => RegisterX86::R14,
        R15 => RegisterX86::R15,
        RIP => RegisterX86::RIP,
        _ => return Option::None,
    })
}

/// The block hook: the block entered before this one has retired; this one runs only if the
/// engine may run all of it, no counter could overflow in it, and budget remains.
fn on_block(uc: &mut Unicorn<'_, Option<Acc>>, addr: u64, size: u32) {
    let Some(acc) = uc.get_data_mut() else { return };
    if acc.single {
        return;
    }
    if let Some(prev) = acc.current.take() {
        acc.retire_block(prev, addr);
    }
    if acc.iret {
        let cpl = uc.reg_read(RegisterX86::CS).map_or(0, |cs| (cs & 3) as u8);
        let Some(acc) = uc.get_data_mut() else { return };
        if cpl != acc.cpl {
            acc.stop = Some(Stop::ModeChange);
            let _ = uc.emu_stop();
            return;
        }
    }
    let Some(acc) = uc.get_data_mut() else { return };
    let block = acc.block(addr, size);
    let (runnable, n) = (block.runnable, block.insns.len());
    let stop = if !runnable || n == 0 {
        Some(Stop::Handover)
    } else if acc.could_overflow(addr) {
        Some(Stop::Overflow)
    } else if acc.retired + n as u64 > acc.budget {
        Some(Stop::Budget)
    } else {
        None
    };
    match stop {
        Some(s) => {
            acc.stop = Some(s);
            acc.accesses.clear();
            let _ = uc.emu_stop();
        }
        None => {
            acc.current = Some(addr);
            if acc.blocks[&addr].self_loop {
                loop_ahead(uc, addr);
            }
        }
    }
}

/// `loop .` with RCX = c: c - 1 taken LOOPs, then one that falls through. The engine retires as
/// many of the taken ones at once as the budget and every counter's room allow (each exactly as
/// the block would, for every counter), leaves RCX as they would, and lets the block run on.
fn loop_ahead(uc: &mut Unicorn<'_, Option<Acc>>, addr: u64) {
    let Ok(c) = uc.reg_read(RegisterX86::RCX) else { return };
    let Some(acc) = uc.get_data_mut() else { return };
    let b = &acc.blocks[&addr];
    let reference = acc.clock.reference;
    // Each skipped iteration is one taken LOOP of `cyc` core cycles.
    let cyc = b.cycles_taken;
    // The block itself still runs once after the skipped iterations: keep room for it.
    let mut k = c.saturating_sub(1).min(acc.budget.saturating_sub(acc.retired + 1));
    for j in 0..acc.counts.len() {
        let per = b.last_taken[j];
        let once = b.last_taken[j].max(b.last_not[j])
            + if acc.counting[j] { acc.armed[j].semantics.dynamic_bound(cyc, 0, reference) } else { 0 };
        let left = acc.room[j].saturating_sub(acc.counts[j] + once + 1);
        if let Some(most) = left.checked_div(per) {
            k = k.min(most);
        }
        if acc.counting[j] && acc.armed[j].semantics == Semantics::RefXclk {
            // Reference ticks over k iterations are at most ticks(k * cyc) + 1.
            let most_cycles = (u128::from(left.saturating_sub(1)) * u128::from(reference.tsc_per_ref_numerator)
                / u128::from(reference.tsc_per_ref_denominator.max(1))) as u64;
            k = k.min(most_cycles.checked_div(cyc).unwrap_or(u64::MAX));
        }
    }
    if k == 0 {
        return;
    }
    let per: Vec<u64> = b.last_taken.clone();
    let ticks = reference.ref_ticks_between(acc.clock.cycles, k * cyc);
    acc.retired += k;
    for (j, (count, p)) in acc.counts.iter_mut().zip(per).enumerate() {
        *count += k * p;
        if acc.counting[j] {
            *count += acc.armed[j].semantics.dynamic(ticks, CacheEvents::default());
        }
    }
    acc.advance_clock(k * cyc);
    let _ = uc.reg_write(RegisterX86::RCX, c - k);
}

#[cfg(test)]
mod tests {
    use super::*;
    use emon_pmu::pmu::BranchFilter;
    use emon_pmu::pmu::CounterId;
    use kvm_bindings::{kvm_dtable, kvm_segment};
    use vm_memory::{Bytes, GuestAddress};

    const CODE: u64 = 0x10000;
    const GDT: u64 = 0x5000;

    /// Long mode at CPL0 with the first 2 MiB identity-mapped and a flat GDT, `code` at CODE.
    fn machine(code: &[u8]) -> (GuestMemoryMmap, kvm_regs, kvm_sregs, CpuMode) {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 2 << 20)]).unwrap();
        mem.write_obj(0x2003u64, GuestAddress(0x1000)).unwrap();
        mem.write_obj(0x3003u64, GuestAddress(0x2000)).unwrap();
        mem.write_obj(0x83u64, GuestAddress(0x3000)).unwrap();
        mem.write_obj(0x0020_9A00_0000_0000u64, GuestAddress(GDT + 8)).unwrap(); // 64-bit code
        mem.write_obj(0x0000_9200_0000_0000u64, GuestAddress(GDT + 16)).unwrap(); // data
        mem.write_slice(code, GuestAddress(CODE)).unwrap();
        let cs = kvm_segment { selector: 8, type_: 0xB, present: 1, s: 1, l: 1, ..Default::default() };
        let ds = kvm_segment { selector: 0x10, type_: 0x3, present: 1, s: 1, db: 1, ..Default::default() };
        let sregs = kvm_sregs {
            cs,
            ds,
            es: ds,
            ss: ds,
            fs: ds,
            gs: ds,
            gdt: kvm_dtable { base: GDT, limit: 23, ..Default::default() },
            cr0: 1 << 31 | 1 << 4 | 1,
            cr3: 0x1000,
            cr4: 1 << 5,
            efer: 1 << 10 | 1 << 8,
            ..Default::default()
        };
        let regs = kvm_regs { rip: CODE, rsp: 0x8000, rflags: 2, ..Default::default() };
        let mode = CpuMode {
            bitness: 64,
            cr0: sregs.cr0,
            cr3: 0x1000,
            cr4: sregs.cr4,
            efer: sregs.efer,
            ..Default::default()
        };
        (mem, regs, sregs, mode)
    }

    fn armed(semantics: Semantics) -> Armed {
        Armed { id: CounterId::Gp(0), semantics, usr: true, os: true, cmask: 0, inv: false, edge: false }
    }

    const CLOCK: ModelClock = ModelClock { cycles: 0, reference: Clock::TSC };

    /// Counting `armed` from model clock 0, with the full budget and no cache model.
    fn counting(armed: &[(Armed, u64)]) -> Counting<'_> {
        Counting { armed, clock: CLOCK, budget: BUDGET, cache: None }
    }

    /// mov ecx, 1000; loop .; out dx, al
    const LOOP: &[u8] = &[0xB9, 0xE8, 0x03, 0x00, 0x00, 0xE2, 0xFE, 0xEE];

    #[test]
    fn runs_a_loop_exactly_and_hands_port_io_to_kvm() {
        let (mem, regs, sregs, mode) = machine(LOOP);
        let mut tcg = Tcg::new(&mem).unwrap();
        let counters =
            [(armed(Semantics::Instructions), u64::MAX), (armed(Semantics::Branches(BranchFilter::ALL)), u64::MAX)];
        let r = tcg.run(&regs, &sregs, mode, counting(&counters), false).unwrap();
        assert_eq!(r.stop, Stop::Handover);
        assert_eq!((r.regs.rip, r.regs.rcx), (CODE + 7, 0), "stopped before the OUT, after the loop");
        assert_eq!((r.retired, r.counts.clone()), (1001, vec![1001, 1000]), "{r:?}");
    }

    /// Translations outlive a run only while their code is unchanged: code written behind the
    /// engine (as KVM or the VMM may write it between runs) is translated again.
    #[test]
    fn code_written_between_runs_is_translated_again() {
        use vm_memory::{Bytes, GuestAddress};
        let (mem, regs, sregs, mode) = machine(LOOP);
        let mut tcg = Tcg::new(&mem).unwrap();
        let counters = [(armed(Semantics::Instructions), u64::MAX)];
        let r = tcg.run(&regs, &sregs, mode, counting(&counters), false).unwrap();
        assert_eq!(r.retired, 1001);
        assert!(!tcg.code.stale && !tcg.code.pages.is_empty(), "the run's code pages are recorded");
        // Unchanged code: the translations stay, and count the same.
        let r = tcg.run(&regs, &sregs, mode, counting(&counters), false).unwrap();
        assert_eq!(r.retired, 1001);
        // mov ecx, 10 instead of 1000, written behind the engine's back.
        let pa = mode.translate(&mem, CODE).unwrap();
        mem.write_slice(&[0xB9, 10, 0, 0, 0], GuestAddress(pa)).unwrap();
        assert!(!tcg.code.valid(&mem, false), "the snapshot sees the write");
        let r = tcg.run(&regs, &sregs, mode, counting(&counters), false).unwrap();
        assert_eq!((r.retired, r.regs.rip), (11, CODE + 7), "the new code ran: {r:?}");
    }

    #[test]
    fn reference_cycles_follow_the_model_clock_through_loop_dot() {
        // mov ecx, 1000 (1 cycle); 999 taken LOOPs (2 cycles each) and the last (1): 2000 cycles.
        let (mem, regs, sregs, mode) = machine(LOOP);
        let mut tcg = Tcg::new(&mem).unwrap();
        let reference = Clock { tsc_per_ref_numerator: 167, tsc_per_ref_denominator: 1, ..Clock::TSC };
        let xclk = Armed { id: CounterId::Gp(1), ..armed(Semantics::RefXclk) };
        let counters = [(armed(Semantics::CoreCycles), u64::MAX), (xclk, u64::MAX)];
        let c = Counting { clock: ModelClock { cycles: 100, reference }, ..counting(&counters) };
        let r = tcg.run(&regs, &sregs, mode, c, false).unwrap();
        assert_eq!((r.cycles, r.counts.clone()), (2000, vec![2000, 12]), "{r:?}");
        // Near its overflow the counter stops the fast path short, and the count stays exact.
        let near = [(xclk, 5)];
        let c = Counting { clock: ModelClock { cycles: 0, reference }, ..counting(&near) };
        let r = tcg.run(&regs, &sregs, mode, c, false).unwrap();
        assert_eq!(r.stop, Stop::Overflow, "{r:?}");
        assert_eq!(r.counts[0], reference.ref_ticks_at(r.cycles));
        assert!(r.counts[0] < 5);
    }

    #[test]
    fn the_cache_model_sees_the_engines_data_accesses() {
        // mov ecx, 100; 2: mov rax, [rsi]; add rsi, 64; loop 2b; clflush [rsi-64];
        // mov rax, [rsi-64]; jmp +0 (ends the block); out dx, al
        let code = [
            0xB9, 100, 0, 0, 0, 0x48, 0x8B, 0x06, 0x48, 0x83, 0xC6, 0x40, 0xE2, 0xF7, 0x0F, 0xAE, 0x7E, 0xC0, 0x48,
            0x8B, 0x46, 0xC0, 0xEB, 0x00, 0xEE,
        ];
        let (mem, mut regs, sregs, mode) = machine(&code);
        regs.rsi = 0x40000;
        let mut tcg = Tcg::new(&mem).unwrap();
        let misses = Armed { id: CounterId::Gp(1), ..armed(Semantics::LlcMisses) };
        let counters = [(armed(Semantics::LlcReference), u64::MAX), (misses, u64::MAX)];
        let cache = Some(CacheModel::new(&emon_pmu::profile::Cache::default()));
        let r = tcg.run(&regs, &sregs, mode, Counting { cache, ..counting(&counters) }, false).unwrap();
        assert_eq!((r.stop, r.regs.rip), (Stop::Handover, CODE + 24), "{:?}", r.regs);
        // 100 cold lines, then the last one again after its CLFLUSH.
        assert_eq!(r.counts, vec![101, 101]);
        assert!(r.cache.is_some(), "the model comes back");
        // Without the model the engine counts no LLC event.
        let r = tcg.run(&regs, &sregs, mode, counting(&counters), false).unwrap();
        assert_eq!(r.counts, vec![0, 0]);
    }

    #[test]
    fn a_stop_leaves_registers_and_counts_in_agreement() {
        // The first block is `mov ecx, 1000; loop .` (2 instructions); later ones the LOOP alone.
        for budget in [2, 3, 50, 777] {
            let (mem, regs, sregs, mode) = machine(LOOP);
            let mut tcg = Tcg::new(&mem).unwrap();
            let counters = [(armed(Semantics::Instructions), u64::MAX)];
            let c = Counting { budget, ..counting(&counters) };
            let r = tcg.run(&regs, &sregs, mode, c, false).unwrap();
            assert_eq!(r.stop, Stop::Budget, "{budget}");
            assert!(r.retired <= budget && r.retired + 1 >= budget, "{budget}: {r:?}");
            // Every retired LOOP decremented RCX once.
            assert_eq!(1000 - r.regs.rcx, r.retired - 1, "{budget}: {r:?}");
            assert_eq!(r.regs.rip, CODE + 5);
        }
    }

    #[test]
    fn stops_short_of_a_counters_overflow() {
        let (mem, regs, sregs, mode) = machine(LOOP);
        let mut tcg = Tcg::new(&mem).unwrap();
        let r = tcg.run(&regs, &sregs, mode, counting(&[(armed(Semantics::Instructions), 300)]), false).unwrap();
        assert_eq!(r.stop, Stop::Overflow);
        assert!(r.counts[0] < 300 && r.counts[0] >= 290, "{r:?}");
        assert_eq!(1000 - r.regs.rcx, r.retired - 1);
    }

    #[test]
    fn a_fault_stops_before_the_faulting_instruction() {
        // mov ecx, 5; mov eax, [0xFEE00030] (the local APIC, not RAM); nop
        let code = [0xB9, 0x05, 0x00, 0x00, 0x00, 0x8B, 0x04, 0x25, 0x30, 0x00, 0xE0, 0xFE, 0x90];
        let (mem, regs, sregs, mode) = machine(&code);
        let mut tcg = Tcg::new(&mem).unwrap();
        let r = tcg.run(&regs, &sregs, mode, counting(&[(armed(Semantics::Instructions), u64::MAX)]), false).unwrap();
        assert_eq!((r.stop, r.regs.rip, r.regs.rcx, r.retired), (Stop::Fault, CODE + 5, 5, 1), "{r:?}");
    }

    #[test]
    fn iretq_within_the_kernel_runs_and_counts_once() {
        // iretq (frame at the stack: RIP = CODE+0x20, CS = 8, RFLAGS = 2, RSP, SS = 0x10); at
        // CODE+0x20: nop; out dx, al.
        let mut code = vec![0x48, 0xCF];
        code.resize(0x20, 0x90);
        code.extend([0x90, 0xEE]);
        let (mem, mut regs, sregs, mode) = machine(&code);
        regs.rsp = 0x7000;
        for (i, v) in [CODE + 0x20, 8, 0x2, 0x8000, 0x10].iter().enumerate() {
            mem.write_obj(*v, GuestAddress(0x7000 + 8 * i as u64)).unwrap();
        }
        let mut tcg = Tcg::new(&mem).unwrap();
        let r = tcg.run(&regs, &sregs, mode, counting(&[(armed(Semantics::Instructions), u64::MAX)]), false).unwrap();
        // The block after the IRETQ (nop; out) holds an OUT: the engine stops before it.
        assert_eq!((r.stop, r.regs.rip, r.retired, r.iret, r.cpl), (Stop::Handover, CODE + 0x20, 1, true, 0), "{r:?}");
        assert_eq!(r.regs.rsp, 0x8000);
    }

    #[test]
    fn a_page_fault_stops_before_the_faulting_instruction() {
        // nop; mov rax, [0x40_0000_0000] (no page maps it); nop
        let code = [0x90, 0x48, 0xA1, 0, 0, 0, 0, 0x40, 0, 0, 0, 0x90];
        let (mem, regs, sregs, mode) = machine(&code);
        let mut tcg = Tcg::new(&mem).unwrap();
        let r = tcg.run(&regs, &sregs, mode, counting(&[(armed(Semantics::Instructions), u64::MAX)]), false).unwrap();
        assert_eq!((r.stop, r.regs.rip, r.retired, r.counts[0]), (Stop::Fault, CODE + 1, 1, 1), "{r:?}");
    }

    #[test]
    fn decides_what_runs_in_the_engine() {
        let runs = |bytes: &[u8]| {
            let i = Decoder::with_ip(64, bytes, 0, DecoderOptions::NONE).decode();
            runs_in_engine(&i, &mut InstructionInfoFactory::new())
        };
        assert!(runs(&[0xE2, 0xFE])); // loop
        assert!(runs(&[0x48, 0x8B, 0x06])); // mov rax, [rsi]
        assert!(runs(&[0x0F, 0x1F, 0x00])); // nop dword [rax]
        assert!(!runs(&[0xEE])); // out
        assert!(!runs(&[0x0F, 0x30])); // wrmsr
        assert!(!runs(&[0x0F, 0xA2])); // cpuid
        assert!(!runs(&[0x0F, 0x31])); // rdtsc
        assert!(!runs(&[0xF4])); // hlt
        assert!(!runs(&[0xFB])); // sti
        assert!(runs(&[0x48, 0xCF])); // iretq: the way into user mode (see runs_in_engine)
        assert!(!runs(&[0xCF])); // iretd
        assert!(!runs(&[0x66, 0x0F, 0xEF, 0xC0])); // pxor xmm0, xmm0
        assert!(!runs(&[0x8E, 0xD8])); // mov ds, ax
        assert!(!runs(&[0x0F, 0x22, 0xD8])); // mov cr3, rax
        assert!(!runs(&[0xCD, 0x80])); // int 0x80
        assert!(runs(&[0x0F, 0xAE, 0x3F])); // clflush [rdi]: the cache model's flush
    }
}
