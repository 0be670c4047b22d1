//! What the engine's translations were made from, so that they outlive a run only while the
//! guest's code is unchanged (README, "The TCG engine").
use emon_x86::mode::CpuMode;
use rustc_hash::{FxHashMap, FxHashSet};
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

/// The guest-physical pages the engine's translations were made from, as they were then: between
/// runs KVM and the VMM may write guest memory behind the engine's back. A run checks each page
/// the first time it enters a block from it, before the block runs ([`CodeSnapshot::enter`]);
/// a page that changed drops every translation. Re-translating at every run made
/// interrupt-heavy counted code (a run every ~80 instructions) cost about 0.7 ms a run, and
/// comparing every page at the start of each run cost a Linux boot an eighth of its time.
///
/// The pages are compared where they are, copied only when they join or change; and a run walks
/// the guest's page tables once per linear page it enters, not twice per block (walking and
/// copying were a fifth of the time of a system-call-heavy guest).
pub struct CodeSnapshot {
    pub pages: FxHashMap<u64, Box<[u8]>>,
    /// The pages the current run has checked.
    entered: FxHashSet<u64>,
    /// The current run's walks: linear page to guest-physical page, for the pages it found
    /// mapped, kept as the engine's own TLB keeps them: until the next run begins, or this one
    /// runs an INVLPG ([`CodeSnapshot::walks_stale`]).
    walks: FxHashMap<u64, u64>,
    /// The translations must go whatever the pages hold: none are known to be clean (a new
    /// engine, or instruction-counting translations made by `step_to_overflow`).
    pub stale: bool,
    /// The translations were made with the code hook (the cache model counts).
    pub hooked: bool,
}

/// Code pages kept at most (16 MiB); past that the translations are dropped instead.
const MAX_CODE_PAGES: usize = 4096;
const PAGE: u64 = 4096;

/// A page of the block a run is about to enter holds other bytes than its translations came
/// from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Changed;

impl CodeSnapshot {
    pub fn new() -> CodeSnapshot {
        CodeSnapshot {
            pages: FxHashMap::default(),
            entered: FxHashSet::default(),
            walks: FxHashMap::default(),
            stale: true,
            hooked: false,
        }
    }

    /// Before a run `hooked` or not: whether the translations may stay (else the caller drops
    /// them all and the snapshot starts again).
    pub fn begin(&mut self, hooked: bool) -> bool {
        self.entered.clear();
        self.walks.clear();
        if self.stale || self.hooked != hooked {
            *self = CodeSnapshot { stale: false, hooked, ..CodeSnapshot::new() };
            return false;
        }
        true
    }

    /// Every translation has gone (a page changed): the snapshot starts again, from the pages
    /// the run enters from now on.
    pub fn restart(&mut self) {
        self.pages.clear();
        self.entered.clear();
        self.walks.clear();
    }

    /// The run is about to run an INVLPG: the walks made so far may be old after it.
    pub fn walks_stale(&mut self) {
        self.walks.clear();
    }

    /// The run enters the block at `addr` of `size` bytes: each of its pages, the first time
    /// the run enters it, holds what the snapshot has of it (or joins the snapshot). Returns
    /// the guest-physical pages of its first and last byte.
    pub fn enter(
        &mut self,
        mem: &GuestMemoryMmap,
        mode: &CpuMode,
        addr: u64,
        size: u32,
    ) -> Result<[Option<u64>; 2], Changed> {
        let mut phys = [None; 2];
        for (k, la) in [addr, addr + u64::from(size.max(1)) - 1].into_iter().enumerate() {
            let linear = la & !(PAGE - 1);
            let page = match self.walks.get(&linear) {
                Some(&page) => page,
                None => {
                    let Some(pa) = mode.translate(mem, la) else {
                        // A page the engine runs but emon cannot find: trust nothing next time.
                        self.stale = true;
                        continue;
                    };
                    self.walks.insert(linear, pa & !(PAGE - 1));
                    pa & !(PAGE - 1)
                }
            };
            phys[k] = Some(page);
            if !self.entered.insert(page) {
                continue;
            }
            let Some(now) = guest_page(mem, page) else {
                self.stale = true;
                continue;
            };
            match self.pages.get(&page) {
                Some(then) if **then != *now => return Err(Changed),
                Some(_) => {}
                None => {
                    self.pages.insert(page, now.into());
                }
            }
        }
        Ok(phys)
    }

    /// After a run: the pages it entered hold what the engine left in them (its own writes to
    /// code it has translated are TCG's to handle). Returns whether the run wrote to any of them:
    /// what was decoded from them before is then old.
    pub fn end(&mut self, mem: &GuestMemoryMmap) -> bool {
        let mut written = false;
        for page in self.entered.drain() {
            if let Some(bytes) = self.pages.get_mut(&page) {
                match guest_page(mem, page) {
                    None => self.stale = true,
                    Some(now) if **bytes != *now => {
                        bytes.copy_from_slice(now);
                        written = true;
                    }
                    Some(_) => {}
                }
            }
        }
        if self.pages.len() > MAX_CODE_PAGES {
            self.stale = true;
        }
        written
    }

    /// Whether any page of the snapshot holds other bytes now (tests).
    #[cfg(test)]
    pub fn changed(&self, mem: &GuestMemoryMmap) -> bool {
        use vm_memory::Bytes;
        let mut now = vec![0u8; PAGE as usize];
        self.pages
            .iter()
            .any(|(&page, then)| mem.read_slice(&mut now, GuestAddress(page)).is_err() || now[..] != then[..])
    }
}

/// The guest-physical page at `page` as it is in guest memory, read in place; `None` outside RAM.
fn guest_page(mem: &GuestMemoryMmap, page: u64) -> Option<&[u8]> {
    let slice = mem.get_slice(GuestAddress(page), PAGE as usize).ok()?;
    // SAFETY: the slice is `PAGE` bytes of guest RAM, mapped for as long as `mem` lives (the
    // borrow ties the result to it). It is compared or copied in the block hook or between
    // engine runs, on the vCPU's thread: no guest code runs meanwhile, and nothing else writes
    // guest memory.
    Some(unsafe { std::slice::from_raw_parts(slice.ptr_guard().as_ptr(), PAGE as usize) })
}
