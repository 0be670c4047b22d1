//! What the cache model (README, "The cache model") sees while an event that reads it counts
//! (the LLC events, and the model-specific line, data-source and split events): the data
//! accesses of every retired instruction, computed from the registers before it ran and
//! translated through the guest's page tables, and what they did there, by access kind and by
//! instruction. (The model itself is [`super::cache`].)
use super::cache::{CacheEvents, CacheModel, DataEvents, Touch};
use crate::{BackendError, Cx};
use emon_pmu::pmu::Level;
use emon_pmu::profile::{Cache, PrefetcherSet, MIN_CACHE_LINE};
use emon_x86::access::{self, Access, AccessKind};
use emon_x86::mode::CpuMode;

/// The cache model and what feeds it.
#[derive(Debug, Default)]
pub struct CacheFeed {
    /// The model (lent to the TCG engine during its runs), made when first needed, and the
    /// profile's geometry it is made from.
    model: Option<CacheModel>,
    geometry: Cache,
    /// The prefetchers the guest has left on (its MSR_MISC_FEATURE_CONTROL or IA32_MISC_ENABLE).
    prefetchers: PrefetcherSet,
    /// An event that reads the model counts: the model sees every data access.
    pub on: bool,
    /// What the accesses of the instruction about to retire did in the model.
    pub retiring: CacheEvents,
    /// Instructions that retired while the model counted whose data accesses emon could not
    /// know (README, "The cache model").
    pub unseen: u64,
}

impl CacheFeed {
    /// A feed for a model of `geometry` (the profile's `[cache]`, prefetchers all on).
    pub fn new(geometry: &Cache) -> CacheFeed {
        CacheFeed { geometry: *geometry, prefetchers: geometry.prefetchers.present(), ..CacheFeed::default() }
    }

    /// The model, made (empty) when first needed.
    fn model(&mut self) -> &mut CacheModel {
        let (geometry, on) = (&self.geometry, self.prefetchers);
        self.model.get_or_insert_with(|| {
            let mut m = CacheModel::new(geometry);
            m.set_prefetchers(on);
            m
        })
    }

    /// An event that reads the model starts or stops counting. emon sees no access made while
    /// none counts, so the caches start empty, and the prefetchers untrained, each time one
    /// starts to.
    pub fn set_on(&mut self, on: bool) {
        if on && !self.on {
            self.model().reset();
        }
        self.on = on;
    }

    /// The guest's control register leaves `on` of the prefetchers on.
    pub fn set_prefetchers(&mut self, on: PrefetcherSet) {
        if on != self.prefetchers {
            self.prefetchers = on;
            if let Some(m) = &mut self.model {
                m.set_prefetchers(on);
            }
        }
    }

    /// Lends the model to a TCG engine run while it counts.
    #[cfg(feature = "tcg")]
    pub fn lend(&mut self) -> Option<CacheModel> {
        if self.on {
            self.model();
            self.model.take()
        } else {
            None
        }
    }

    /// Takes the model back after an engine run.
    #[cfg(feature = "tcg")]
    pub fn give_back(&mut self, model: Option<CacheModel>) {
        if let Some(m) = model {
            self.model = Some(m);
        }
    }

    /// The data accesses of `i` at `rip`, from the vCPU's registers now (before it runs);
    /// `None` if they cannot be known before it runs. Nothing unless the model counts.
    pub fn accesses_at(&self, cx: &mut Cx, i: &iced_x86::Instruction) -> Result<Option<Vec<Access>>, BackendError> {
        if !self.on || !touches_memory(i) {
            return Ok(Some(Vec::new()));
        }
        let regs = cx.vcpu.regs()?;
        let (fs, gs) = match i.memory_segment() {
            iced_x86::Register::FS | iced_x86::Register::GS => {
                let s = cx.vcpu.sregs()?;
                (s.fs.base, s.gs.base)
            }
            _ => (0, 0),
        };
        Ok(access::data_accesses(i, |r| access::gpr(&regs, r), fs, gs).ok())
    }

    /// The instruction at `rip` retires with the accesses `accesses` (known from before it ran):
    /// they go to the model, for the events that read it.
    pub fn retire(&mut self, cx: &Cx, mode: &CpuMode, rip: u64, accesses: &[Access]) {
        if self.on {
            self.retiring = feed(self.model(), mode, cx.vcpu.memory(), rip, accesses);
        }
    }

    /// Instruction `i` retired while the model counts, with data accesses emon did not see (it
    /// knew no registers from before it ran).
    pub fn unseen(&mut self, i: &iced_x86::Instruction) {
        if self.on && touches_memory(i) {
            self.unseen += 1;
        }
    }

    /// What the run summary says about the model's inputs.
    pub fn notes(&self) -> Vec<String> {
        if self.unseen == 0 {
            return Vec::new();
        }
        vec![format!(
            "NOT EXACT: LLC events: {} instructions retired while an event that reads the cache model counted (the LLC events, and the model-specific line, data-source and split events) whose data accesses emon could not see (an event handler's first instruction, an instruction without its own single-step trap, or a REP string instruction); the cache model missed them (README, \"The cache model\")",
            self.unseen
        )]
    }
}

/// Whether `i` accesses data memory (or may: emon cannot tell before it runs).
fn touches_memory(i: &iced_x86::Instruction) -> bool {
    access::max_lines(i, MIN_CACHE_LINE) != Ok(0)
}

/// Feeds the data accesses of one instruction, at `rip`, to the cache model, translating each
/// through the guest's page tables; what they did there: at the LLC, and by kind and instruction
/// ([`DataEvents`], README "Model-specific events").
pub(crate) fn feed(
    cache: &mut CacheModel,
    mode: &CpuMode,
    mem: &vm_memory::GuestMemoryMmap,
    rip: u64,
    accesses: &[Access],
) -> CacheEvents {
    feed_one(cache, mode, mem, rip, accesses.iter().copied())
}

fn feed_one(
    cache: &mut CacheModel,
    mode: &CpuMode,
    mem: &vm_memory::GuestMemoryMmap,
    rip: u64,
    accesses: impl Iterator<Item = Access>,
) -> CacheEvents {
    let mut events = CacheEvents::default();
    let mut data = DataEvents::default();
    // The farthest level that held one of its load lines, whether it is locked, and whether a
    // load and a store of it crossed a line.
    let (mut load_level, mut locked, mut split_load, mut split_store) = (None, false, false, false);
    for a in accesses {
        if a.kind == AccessKind::Flush {
            if let Some(pa) = mode.translate(mem, a.linear) {
                cache.flush(pa);
            }
            continue;
        }
        // An access through no mapping faults, and its instruction does not retire. Only loads
        // train the L1 prefetchers: a read-modify-write is a store to them.
        let touch = Touch { rip, linear: a.linear, size: a.size, load: a.kind == AccessKind::Read };
        let (at_llc, levels) = cache.access_by_level(touch, |la| mode.translate(mem, la));
        events += at_llc;
        // A page boundary is a line boundary: the pieces' lines are the access's.
        let split = levels.iter().sum::<u64>() > 1;
        let loads = matches!(a.kind, AccessKind::Read | AccessKind::Update | AccessKind::Locked);
        let stores = !matches!(a.kind, AccessKind::Read);
        let lines = if stores { &mut data.store_lines } else { &mut data.load_lines };
        *lines = std::array::from_fn(|i| lines[i] + levels[i]);
        if loads {
            let farthest = Level::ALL.into_iter().rev().find(|l| levels[*l as usize] > 0);
            load_level = load_level.max(farthest);
            data.split_loads += u64::from(split);
            split_load |= split;
        }
        if stores {
            data.split_stores += u64::from(split);
            split_store |= split;
        }
        locked |= a.kind == AccessKind::Locked;
    }
    if let Some(level) = load_level {
        let insns = if locked { &mut data.locked_insns } else { &mut data.load_insns };
        insns[level as usize] += 1;
    }
    data.split_load_insns = u64::from(split_load);
    data.split_store_insns = u64::from(split_store);
    events.data = data;
    events
}

/// [`feed`] for the accesses of several instructions in the order they ran, each with its
/// instruction's address (the accesses of one instruction are consecutive, and no two
/// consecutive instructions share an address: the TCG engine feeds one block run at a time): the
/// TCG engine's.
#[cfg(feature = "tcg")]
pub(crate) fn feed_each(
    cache: &mut CacheModel,
    mode: &CpuMode,
    mem: &vm_memory::GuestMemoryMmap,
    accesses: &[(u64, Access)],
) -> CacheEvents {
    let mut events = CacheEvents::default();
    for insn in accesses.chunk_by(|a, b| a.0 == b.0) {
        events += feed_one(cache, mode, mem, insn[0].0, insn.iter().map(|(_, a)| *a));
    }
    events
}
