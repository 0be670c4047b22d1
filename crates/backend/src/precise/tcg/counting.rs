//! Counting in the engine: the state the hooks work on ([`Acc`]), the block hook that decides
//! before each translated block whether it runs (and retires the one before it), the code hook
//! that feeds the cache model, and the `loop .` fast path.
use super::blocks::{decode_block, Block, Needs, Withheld};
use super::{Counting, Data, ModelClock, Stop, MAX_BLOCKS};
use crate::precise::branches::{taken_branch, LbrTail};
use crate::precise::cache::{CacheEvents, CacheModel};
use crate::precise::events::{cycles, Armed, Derive};
use emon_pmu::pmu::Semantics;
use emon_x86::access::{self, Access};
use emon_x86::mode::CpuMode;
use iced_x86::{Decoder, DecoderOptions, Instruction};
use rustc_hash::FxHashMap;
use std::time::Instant;
use unicorn_engine::{RegisterX86, Unicorn};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

/// The blocks the engine has decoded, kept from run to run as long as its translations are
/// (the code snapshot keeps both honest: see `CodeSnapshot`): decoding each block again at each
/// run was a quarter of a Linux boot's time.
#[derive(Default)]
pub struct Decoded {
    pub blocks: Vec<Block>,
    pub index: FxHashMap<u64, u32>,
}

/// State the block hook works on.
pub struct Acc {
    pub mode: CpuMode,
    pub mem: GuestMemoryMmap,
    pub armed: Vec<Armed>,
    pub counting: Vec<bool>,
    /// Events each armed counter may still take before it would overflow.
    pub room: Vec<u64>,
    pub counts: Vec<u64>,
    pub retired: u64,
    /// Iterations of REP string instructions that have not retired yet: work the budget counts,
    /// so that a long REP hands back to KVM (for interrupts) as other code does.
    pub iterations: u64,
    /// The model clock now, and the cycles retired in this run.
    pub clock: ModelClock,
    pub cycles: u64,
    pub budget: u64,
    /// The block entered last, not yet known to have retired (an index into `blocks`).
    pub current: Option<u32>,
    /// The blocks decoded, by this run or earlier ones, and where each starts (see
    /// [`Decoded`]); and this run's number.
    pub blocks: Vec<Block>,
    pub index: FxHashMap<u64, u32>,
    pub run: u64,
    /// Something takes what the blocks do beyond the instruction count and the model clock: an
    /// armed counter, the cache model or the LBR stack (without, retiring a block is a sum).
    pub tracked: bool,
    pub stop: Option<Stop>,
    /// The privilege level the run counts at (the USR/OS filters), and whether an IRETQ or a
    /// SYSRETQ has retired (the next block may be at another level).
    pub cpl: u8,
    pub iret: bool,
    pub sysret: bool,
    /// A block with an INVLPG ran.
    pub flushed_tlb: bool,
    /// The instruction retired last is STI (its shadow covers the next one).
    pub after_sti: bool,
    /// Instruction-at-a-time execution near an overflow: the block hook stands aside, but for
    /// stopping the engine before the block after the one the step entered (`single_entered`).
    pub single: bool,
    pub single_entered: bool,
    /// The step's instruction went on to the block after it (taken for a branch to itself, where
    /// RIP alone cannot tell it from a fault that left RIP where it was).
    pub single_left: bool,
    /// The instruction that brought a counter to its overflow, where the run stopped right after
    /// it (`Stop::Overflowed`).
    pub overflowed_at: Option<u64>,
    /// The cache model (while an LLC event counts), and the data accesses of the instructions
    /// of the current block that have started, each with its RIP, in order (see [`on_insn`]).
    pub cache: Option<CacheModel>,
    pub accesses: Vec<(u64, Access)>,
    /// Instructions decoded for [`on_insn`], by address.
    pub decoded: FxHashMap<u64, Instruction>,
    /// What the run loaded beyond the general and control registers, and what the blocks it ran
    /// needed of it (what it may have changed).
    pub loaded: Needs,
    pub used: Needs,
    /// The wall-clock time at which the run hands back, checked every few blocks.
    pub deadline: Option<Instant>,
    pub blocks_run: u64,
    /// A block that runs up to an instruction the engine hands over: its address, size and the
    /// handed-over instruction's address, which the engine makes an exit (see `Tcg::run`).
    pub cut: Option<(u64, u32, u64)>,
    /// The block hook stopped before a block whose code changed behind the engine: every
    /// translation goes, and the run goes on from there (see `CodeSnapshot`).
    pub changed: bool,
    /// The LBR stack's newest records, while it records.
    pub lbr: Option<LbrTail>,
    /// What the run hands over that the engine could run.
    pub withheld: Withheld,
    /// RDTSC and RDTSCP run only with RFLAGS.IF clear ([`Counting::tsc_if_clear`]).
    pub tsc_if_clear: bool,
    /// They read the model's time: the block hook times each read of a block before it runs.
    pub model_tsc: bool,
}

impl Acc {
    /// The counting state of run number `run` at `mode` for `counting`, with the blocks decoded
    /// before.
    pub fn new(
        mode: CpuMode,
        mem: GuestMemoryMmap,
        counting: Counting,
        loaded: Needs,
        (decoded, run): (Decoded, u64),
    ) -> Acc {
        let tracked = counting.tracks();
        let Counting { armed, clock, budget, cache, deadline, lbr, watch, withhold_sti, tsc, tsc_if_clear } = counting;
        Acc {
            mode,
            mem,
            armed: armed.iter().map(|(a, _)| *a).collect(),
            counting: armed.iter().map(|(a, _)| if mode.cpl == 0 { a.os } else { a.usr }).collect(),
            room: armed.iter().map(|(_, d)| *d).collect(),
            counts: vec![0; armed.len()],
            retired: 0,
            iterations: 0,
            clock,
            cycles: 0,
            budget,
            current: None,
            blocks: decoded.blocks,
            index: decoded.index,
            run,
            tracked,
            stop: None,
            cpl: mode.cpl,
            iret: false,
            flushed_tlb: false,
            after_sti: false,
            sysret: false,
            single: false,
            single_entered: false,
            single_left: false,
            overflowed_at: None,
            accesses: Vec::new(),
            decoded: FxHashMap::default(),
            cache,
            loaded,
            used: Needs::NONE,
            deadline,
            blocks_run: 0,
            cut: None,
            changed: false,
            lbr,
            withheld: Withheld { user_access: watch.user_data, sti: withhold_sti, tsc: tsc.is_none() },
            tsc_if_clear,
            model_tsc: matches!(tsc, Some(super::TscSource::Model { .. })),
        }
    }

    /// The block at `addr` (of `size` bytes, its pages at `from`) the first time this run
    /// enters it (the hook runs at every execution of every block): decoded again unless an
    /// earlier run decoded it alike from the same pages, and summed for this run's counters
    /// unless an earlier run armed the same. Its index in `blocks`.
    pub fn enter(&mut self, found: Option<u32>, addr: u64, size: u32, from: [Option<u64>; 2]) -> u32 {
        let wanted = (self.cache.is_some(), self.loaded, self.withheld);
        let k = match found {
            Some(k) if self.blocks[k as usize].serves(from, wanted, size) => k,
            _ => {
                if self.blocks.len() >= MAX_BLOCKS {
                    self.blocks.clear();
                    self.index.clear();
                }
                let mut b = decode_block(&self.mode, &self.mem, (addr, size as usize), wanted.0, wanted.1, wanted.2);
                b.from = from;
                match found.filter(|k| (*k as usize) < self.blocks.len()) {
                    Some(k) => {
                        self.blocks[k as usize] = b;
                        k
                    }
                    None => {
                        self.blocks.push(b);
                        let k = self.blocks.len() as u32 - 1;
                        self.index.insert(addr, k);
                        k
                    }
                }
            }
        };
        let b = &mut self.blocks[k as usize];
        b.seen = self.run;
        if self.tracked {
            b.sums(&self.armed, &self.counting);
        }
        k
    }

    /// The index of the block at `addr`, which control reached from block `prev`: where it went
    /// from there before, else from the index (a hash lookup, most of the block hook's time when
    /// it was the only way).
    fn lookup(&self, prev: Option<u32>, addr: u64) -> Option<u32> {
        let memo = prev.and_then(|p| self.blocks.get(p as usize)).map_or([None; 2], |b| b.next);
        match memo.into_iter().flatten().find(|&(at, _)| at == addr) {
            Some((_, k)) => Some(k),
            None => self.index.get(&addr).copied(),
        }
    }

    /// Control went on from block `prev` to block `k` at `addr`: remembered in `prev` for the
    /// next time. (Any pair it holds agrees with the index, which maps an address to the same
    /// block until both are cleared together.)
    fn went_on(&mut self, prev: Option<u32>, addr: u64, k: u32) {
        if let Some(b) = prev.and_then(|p| self.blocks.get_mut(p as usize)) {
            if b.next[0] != Some((addr, k)) {
                if b.next[0].is_some_and(|(at, _)| at != addr) {
                    b.next[1] = b.next[0];
                }
                b.next[0] = Some((addr, k));
            }
        }
    }

    /// The decoded blocks, for the next run.
    pub fn take_decoded(&mut self) -> Decoded {
        Decoded { blocks: std::mem::take(&mut self.blocks), index: std::mem::take(&mut self.index) }
    }

    /// Counts the whole block `k` as retired; control went on to `next`, at CPL `to_cpl`.
    pub fn retire_block(&mut self, k: u32, next: u64, to_cpl: u8) {
        let b = &self.blocks[k as usize];
        self.iret |= b.ends_in_iret;
        self.sysret |= b.ends_in_sysret;
        let Some((rip, last)) = &b.last else { return };
        if !last.retired_at(*rip, next) {
            // The block ends in a REP string instruction that only ended an iteration (TCG runs
            // one iteration per block execution): the instructions before it retired, it did not.
            let n = b.insns.len() - 1;
            self.iterations += 1;
            return self.retire_first(k, n);
        }
        let taken = crate::precise::stepper::taken(last, *rip, next);
        self.retired += b.insns.len() as u64;
        self.after_sti = b.ends_in_sti;
        let c = b.cycles_body + if taken { b.cycles_taken } else { b.cycles_not };
        if !self.tracked {
            return self.advance_clock(c);
        }
        if !self.counts.is_empty() || self.cache.is_some() {
            let ticks = self.clock.reference.ref_ticks_between(self.clock.cycles, c);
            let cache = self.feed(None);
            let b = &self.blocks[k as usize];
            for (j, count) in self.counts.iter_mut().enumerate() {
                *count += b.body[j] + if taken { b.last_taken[j] } else { b.last_not[j] };
                if self.counting[j] {
                    *count += self.armed[j].semantics.dynamic(ticks, cache);
                }
            }
        }
        let branch = self
            .lbr
            .as_ref()
            .and(self.blocks[k as usize].last.as_ref())
            .and_then(|(rip, last)| taken_branch(last, *rip, next, taken, to_cpl));
        self.advance_clock(c);
        if let (Some(lbr), Some(branch)) = (&mut self.lbr, branch) {
            lbr.take(branch, 1, self.clock.cycles, 0);
        }
    }

    /// Feeds the data accesses of the instructions that have started to the cache model, one
    /// instruction at a time, all of them or those before the one at `fault` (which did not
    /// retire); what they did there.
    pub fn feed(&mut self, fault: Option<u64>) -> CacheEvents {
        let accesses = std::mem::take(&mut self.accesses);
        let Some(cache) = &mut self.cache else { return CacheEvents::default() };
        let retired = accesses.iter().take_while(|(rip, _)| Some(*rip) != fault).count();
        crate::precise::cache_feed::feed_each(cache, &self.mode, &self.mem, &accesses[..retired])
    }

    pub fn advance_clock(&mut self, c: u64) {
        self.clock.cycles += c;
        self.cycles += c;
    }

    /// The block `k` entered last ran up to `pc`: if `pc` is one of its instructions, those
    /// before it retired (and true); otherwise the block retired whole, leaving the vCPU at `pc`
    /// at `to_cpl`.
    pub fn retire_entered(&mut self, k: u32, pc: u64, to_cpl: u8) -> bool {
        match self.blocks[k as usize].insns.iter().position(|(rip, _)| *rip == pc) {
            Some(n) => {
                self.retire_first(k, n);
                true
            }
            None => {
                self.retire_block(k, pc, to_cpl);
                false
            }
        }
    }

    /// Counts the first `n` instructions of block `k` (none of them a taken branch: the block
    /// was cut short at the next one, by a fault or a REP iteration).
    pub fn retire_first(&mut self, k: u32, n: usize) {
        let fault = self.blocks[k as usize].insns.get(n).map(|(rip, _)| *rip);
        let cache = self.feed(fault);
        let insns = &self.blocks[k as usize].insns[..n];
        self.retired += n as u64;
        self.after_sti &= n == 0;
        let c = insns.iter().map(|(_, i)| cycles(i, false)).sum();
        let ticks = self.clock.reference.ref_ticks_between(self.clock.cycles, c);
        for (j, (a, on)) in self.armed.iter().zip(&self.counting).enumerate() {
            if *on {
                self.counts[j] +=
                    insns.iter().map(|(rip, i)| a.per_instruction(a.semantics.increment(i, *rip, false))).sum::<u64>();
                self.counts[j] += a.semantics.dynamic(ticks, cache);
            }
        }
        self.advance_clock(c);
    }

    /// Whether block `k` could bring a counter to its overflow.
    pub fn could_overflow(&self, k: u32) -> bool {
        if self.counts.is_empty() {
            return false;
        }
        let b = &self.blocks[k as usize];
        let c = b.cycles_body + b.cycles_taken.max(b.cycles_not);
        (0..self.counts.len()).any(|j| {
            let dynamic = if self.counting[j] {
                self.armed[j].semantics.dynamic_bound(c, b.lines, self.clock.reference)
            } else {
                0
            };
            self.counts[j] + b.body[j] + b.last_taken[j].max(b.last_not[j]) + dynamic >= self.room[j]
        })
    }
}

/// The code hook, installed while the cache model counts: the data accesses of the instruction
/// about to run at `addr`, from the registers now, join those of the block's earlier instructions
/// (fed to the cache model when they retire: [`Acc::feed`]).
pub fn on_insn(uc: &mut Unicorn<'_, Data>, addr: u64, _size: u32) {
    let Some(acc) = uc.get_data_mut().acc.as_mut() else { return };
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
    if let (Ok(a), Some(acc)) = (accesses, uc.get_data_mut().acc.as_mut()) {
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

use emon_x86::arch::{RFLAGS_IF, RFLAGS_TF};

/// Blocks between two looks at the clock (a look costs about as much as a short block).
const DEADLINE_EVERY: u64 = 256;

/// The block hook: the block entered before this one has retired; this one runs only if the
/// engine may run all of it with what the run loaded, no counter could overflow in it, and
/// budget and time remain. During a trampoline it stops the engine at the first block outside
/// the private region.
pub fn on_block(uc: &mut Unicorn<'_, Data>, addr: u64, size: u32) {
    let data = uc.get_data_mut();
    if let Some((lo, hi)) = data.trampoline {
        if !(lo..hi).contains(&addr) {
            let _ = uc.emu_stop();
        }
        return;
    }
    let Some(acc) = data.acc.as_mut() else { return };
    if acc.single {
        // One instruction (`Tcg::step_to_overflow`): whatever block follows it does not run.
        if std::mem::replace(&mut acc.single_entered, true) {
            acc.single_left = true;
            let _ = uc.emu_stop();
        }
        return;
    }
    let prev = acc.current.take();
    // The CPL the block before this one left: the run's, unless it ended in IRETQ or SYSRETQ.
    let after_iret = prev.is_some_and(|p| {
        let b = &acc.blocks[p as usize];
        b.ends_in_iret || b.ends_in_sysret
    });
    let cs = if after_iret { uc.reg_read(RegisterX86::CS).ok() } else { None };
    let Some(acc) = uc.get_data_mut().acc.as_mut() else { return };
    if let Some(prev) = prev {
        let to_cpl = cs.map_or(acc.cpl, |cs| (cs & 3) as u8);
        acc.retire_block(prev, addr, to_cpl);
    }
    if acc.iret || acc.sysret {
        // An IRETQ or SYSRETQ may have changed the privilege level, or set RFLAGS.TF (the guest
        // then single-steps itself, which only KVM makes trap).
        let cpl = uc.reg_read(RegisterX86::CS).map_or(0, |cs| (cs & 3) as u8);
        let tf = uc.reg_read(RegisterX86::RFLAGS).is_ok_and(|f| f & RFLAGS_TF != 0);
        let Some(acc) = uc.get_data_mut().acc.as_mut() else { return };
        if cpl != acc.cpl || tf {
            acc.stop = Some(Stop::ModeChange);
            let _ = uc.emu_stop();
            return;
        }
    }
    let data = uc.get_data_mut();
    let Some(acc) = data.acc.as_mut() else { return };
    let k = match acc.lookup(prev, addr) {
        Some(k) if acc.blocks[k as usize].seen == acc.run && acc.blocks[k as usize].size == size => k,
        found => match data.code.enter(&acc.mem, &acc.mode, addr, size) {
            Ok(from) => acc.enter(found, addr, size, from),
            Err(_) => {
                acc.changed = true;
                let _ = uc.emu_stop();
                return;
            }
        },
    };
    acc.went_on(prev, addr, k);
    if acc.tsc_if_clear && acc.blocks[k as usize].reads_tsc() {
        // RFLAGS.IF as at its RDTSC: only STI and IRETQ set IF in a run, and each ends its block.
        let interrupts_on = uc.reg_read(RegisterX86::RFLAGS).map_or(true, |f| f & RFLAGS_IF != 0);
        if interrupts_on {
            let Some(acc) = uc.get_data_mut().acc.as_mut() else { return };
            acc.stop = Some(Stop::InterruptsOn);
            acc.accesses.clear();
            let _ = uc.emu_stop();
            return;
        }
    }
    let data = uc.get_data_mut();
    let data_stops = &data.stops;
    let Some(acc) = data.acc.as_mut() else { return };
    let block = &acc.blocks[k as usize];
    let (runnable, n, needs, stops_at) = (block.runnable, block.insns.len(), block.needs, block.stops_at);
    let (insns_need, self_loop, flushes_tlb) = (block.insns_need, block.self_loop, block.flushes_tlb);
    let rep_string = block.rep_string.filter(|_| !acc.tracked && !acc.withheld.user_access);
    acc.blocks_run += 1;
    let late = acc.blocks_run % DEADLINE_EVERY == 0 && acc.deadline.is_some_and(|d| Instant::now() >= d);
    // A block that runs up to a handed-over instruction runs only where a stop hook waits there.
    let stopped_inside = stops_at.is_some_and(|x| data_stops.contains(&x));
    let stop = if !runnable && needs != Needs::NONE {
        // The block needs state the run did not load: the caller runs again with it.
        Some(Stop::Needs(needs))
    } else if n == 0 || !runnable && stops_at.is_none() {
        Some(Stop::Handover)
    } else if !runnable && !stopped_inside {
        // Instructions the engine runs, then one it hands over: the caller puts a stop hook on
        // that one and runs again.
        acc.cut = stops_at.map(|x| (addr, size, x));
        Some(Stop::Handover)
    } else if acc.could_overflow(k) {
        Some(Stop::Overflow)
    } else if acc.retired + acc.iterations + n as u64 > acc.budget || late {
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
            acc.current = Some(k);
            if acc.model_tsc && acc.blocks[k as usize].reads_tsc() {
                data.model_reads.block(acc.clock.cycles, &acc.blocks[k as usize].tsc_at);
            }
            acc.used = acc.used.union(insns_need);
            acc.flushed_tlb |= flushes_tlb;
            if flushes_tlb {
                data.code.walks_stale();
            }
            if self_loop {
                loop_ahead(uc, k, addr);
            }
            if let Some(rep) = rep_string {
                rep_ahead(uc, rep);
            }
        }
    }
}

/// A breakpoint hook: the engine stops before the guest's instruction breakpoint at `addr`
/// (see [`super::Watch`]), in a run only.
pub fn on_breakpoint(uc: &mut Unicorn<'_, Data>, _addr: u64, _size: u32) {
    let Some(acc) = uc.get_data_mut().acc.as_mut() else { return };
    acc.stop = Some(Stop::Breakpoint);
    let _ = uc.emu_stop();
}

/// A stop hook: the engine stops before the handed-over instruction at `addr`, which a block it
/// ran leads to (only during a run: not in a trampoline or a completion).
pub fn on_stop(uc: &mut Unicorn<'_, Data>, addr: u64, _size: u32) {
    let data = uc.get_data_mut();
    let tsc = data.tsc_stops.contains(&addr);
    let Some(acc) = data.acc.as_mut() else { return };
    if tsc && !acc.withheld.tsc {
        // RDTSC or RDTSCP, stopped at for a run without a window on the TSC; this run has one
        // (and its block hook saw RFLAGS.IF where the window needs it clear).
        return;
    }
    acc.stop = Some(Stop::Handover);
    let _ = uc.emu_stop();
}

/// A REP STOS or REP MOVS (`rep`) about to run an iteration, where nothing watches its
/// iterations (no counter, cache model or LBR stack takes them, no data breakpoint): emon runs
/// all but the last on guest memory itself, as the CPU would, and leaves RCX, RDI and RSI as they
/// would (SDM Vol. 2B, REP). TCG runs one iteration per block execution, each through the block
/// hook: the 4,096 of the REP STOSB that clears a page cost Linux's page faults most of their
/// time. Iterations go on page by page, while RFLAGS.DF is clear, within the run's budget, and
/// only where the CPU's would go straight to memory: no fault, no accessed or dirty flag to set
/// ([`CpuMode::quiet_translation`]), RAM, not a page the engine has translated code from (TCG
/// would not see the write), and for MOVS no overlap that copying element by element would tell
/// from a block copy. The rest, and the last iteration, are TCG's.
fn rep_ahead(uc: &mut Unicorn<'_, Data>, rep: super::blocks::RepString) {
    use emon_x86::debug::RFLAGS_AC;
    use emon_x86::mode::Access as PageAccess;
    /// RFLAGS.DF: string instructions go down.
    const RFLAGS_DF: u64 = 1 << 10;
    const PAGE: u64 = 0x1000;
    let reg = |uc: &Unicorn<'_, Data>, r| uc.reg_read(r).ok();
    let (Some(rcx), Some(rdi), Some(rsi), Some(rax), Some(rflags)) = (
        reg(uc, RegisterX86::RCX),
        reg(uc, RegisterX86::RDI),
        reg(uc, RegisterX86::RSI),
        reg(uc, RegisterX86::RAX),
        reg(uc, RegisterX86::RFLAGS),
    ) else {
        return;
    };
    let size = u64::from(rep.size);
    let data = uc.get_data_mut();
    let Some(acc) = data.acc.as_mut() else { return };
    let budget = acc.budget.saturating_sub(acc.retired + acc.iterations + 1);
    let n = rcx.saturating_sub(1).min(budget);
    let forward_overlap = rdi > rsi && rdi - rsi < n.saturating_mul(size);
    if rflags & RFLAGS_DF != 0 || n == 0 || data.code.stale || rep.movs && forward_overlap {
        return;
    }
    let ac = rflags & RFLAGS_AC != 0;
    let pattern = rax.to_le_bytes();
    let mut buf = [0u8; PAGE as usize];
    let mut done = 0u64;
    while done < n {
        let (d, s) = (rdi.wrapping_add(done * size), rsi.wrapping_add(done * size));
        let mut room = PAGE - (d & (PAGE - 1));
        if rep.movs {
            room = room.min(PAGE - (s & (PAGE - 1)));
        }
        // Whole elements within one page of each side; an element across two is TCG's.
        let elems = (room / size).min(n - done);
        let bytes = (elems * size) as usize;
        let Some(dst) = acc.mode.quiet_translation(&acc.mem, d, PageAccess::Write, ac) else { break };
        if elems == 0 || data.code.pages.contains_key(&(dst & !(PAGE - 1))) {
            break;
        }
        let chunk = &mut buf[..bytes];
        if rep.movs {
            let Some(src) = acc.mode.quiet_translation(&acc.mem, s, PageAccess::Read, ac) else { break };
            if dst > src && dst - src < bytes as u64 || acc.mem.read_slice(chunk, GuestAddress(src)).is_err() {
                break;
            }
        } else {
            for (j, b) in chunk.iter_mut().enumerate() {
                *b = pattern[j % rep.size as usize];
            }
        }
        if acc.mem.write_slice(chunk, GuestAddress(dst)).is_err() {
            break;
        }
        done += elems;
    }
    if done == 0 {
        return;
    }
    acc.iterations += done;
    let _ = uc.reg_write(RegisterX86::RCX, rcx - done);
    let _ = uc.reg_write(RegisterX86::RDI, rdi.wrapping_add(done * size));
    if rep.movs {
        let _ = uc.reg_write(RegisterX86::RSI, rsi.wrapping_add(done * size));
    }
}

/// `loop .` with RCX = c: c - 1 taken LOOPs, then one that falls through. The engine retires as
/// many of the taken ones at once as the budget and every counter's room allow (each exactly as
/// the block would, for every counter), leaves RCX as they would, and lets the block run on.
fn loop_ahead(uc: &mut Unicorn<'_, Data>, block: u32, addr: u64) {
    let Ok(c) = uc.reg_read(RegisterX86::RCX) else { return };
    let Some(acc) = uc.get_data_mut().acc.as_mut() else { return };
    let b = &acc.blocks[block as usize];
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
    acc.after_sti = false;
    for (j, (count, p)) in acc.counts.iter_mut().zip(per).enumerate() {
        *count += k * p;
        if acc.counting[j] {
            *count += acc.armed[j].semantics.dynamic(ticks, CacheEvents::default());
        }
    }
    let start = acc.clock.cycles;
    acc.advance_clock(k * cyc);
    if let Some(lbr) = &mut acc.lbr {
        let (rip, last) = acc.blocks[block as usize].insns.last().expect("one instruction");
        if let Some(branch) = taken_branch(last, *rip, addr, true, acc.cpl) {
            lbr.take(branch, k, start + cyc, cyc);
        }
    }
    let _ = uc.reg_write(RegisterX86::RCX, c - k);
}
