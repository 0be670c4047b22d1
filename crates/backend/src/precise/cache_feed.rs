//! What the cache model (README, "The cache model") sees while an LLC event counts: the data
//! accesses of every retired instruction, computed from the registers before it ran and
//! translated through the guest's page tables. (The model itself is [`super::cache`].)
use super::cache::{CacheEvents, CacheModel, Touch};
use crate::{BackendError, Cx};
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
    /// An LLC event counts: the model sees every data access.
    pub on: bool,
    /// What the accesses of the instruction about to retire did at the LLC.
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

    /// An LLC event starts or stops counting. emon sees no access made while none counts, so the
    /// caches start empty, and the prefetchers untrained, each time one starts to.
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
    /// they go to the model, for the LLC events it counts.
    pub fn retire(&mut self, cx: &Cx, mode: &CpuMode, rip: u64, accesses: &[Access]) {
        if self.on {
            self.retiring = feed(self.model(), mode, cx.vcpu.memory(), accesses.iter().map(|a| (rip, *a)));
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
            "NOT EXACT: LLC events: {} instructions retired while an LLC event counted whose data accesses emon could not see (an event handler's first instruction, an instruction without its own single-step trap, or a REP string instruction); the cache model missed them (README, \"The cache model\")",
            self.unseen
        )]
    }
}

/// Whether `i` accesses data memory (or may: emon cannot tell before it runs).
fn touches_memory(i: &iced_x86::Instruction) -> bool {
    access::max_lines(i, MIN_CACHE_LINE) != Ok(0)
}

/// Feeds data accesses, each with the RIP of its instruction, to the cache model, translating
/// them through the guest's page tables; what they did at the LLC.
pub(crate) fn feed(
    cache: &mut CacheModel,
    mode: &CpuMode,
    mem: &vm_memory::GuestMemoryMmap,
    accesses: impl IntoIterator<Item = (u64, Access)>,
) -> CacheEvents {
    let mut events = CacheEvents::default();
    for (rip, a) in accesses {
        if a.kind == AccessKind::Flush {
            if let Some(pa) = mode.translate(mem, a.linear) {
                cache.flush(pa);
            }
            continue;
        }
        // An access through no mapping faults, and its instruction does not retire.
        let touch = Touch { rip, linear: a.linear, size: a.size, load: a.kind == AccessKind::Read };
        events += cache.access(touch, |la| mode.translate(mem, la));
    }
    events
}
