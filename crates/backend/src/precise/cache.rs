//! A deterministic model of the guest's data caches and their hardware prefetchers, for the
//! architectural events LLC Reference (0x2E/0x4F) and LLC Misses (0x2E/0x41) and the
//! model-specific events that count lines by the level that held them (README, "The cache
//! model", "Model-specific events").
//!
//! The hierarchy is a profile's [`Cache`]: L1d, an optional L2 and the last-level cache (LLC).
//! Every level is set-associative with LRU replacement and is indexed by the physical line
//! address: a line's set is its line number modulo the number of sets (no hashing across LLC
//! slices). Reads and writes alike allocate (write-allocate), and a line that misses is filled
//! into every level. The LLC is inclusive of L1d and L2: a line it evicts is invalidated in both
//! (back-invalidation). L2 is neither inclusive nor exclusive of L1d: a line L2 evicts may stay in
//! L1d.
//!
//! Requests ([`super::prefetch`] decides the prefetchers' ones):
//! - a demand access looks its lines up in L1d; a line L1d lacks is a request from L1 to L2;
//! - after a load, the L1 prefetchers (DCU next-line, IP-based stride) may each ask for one line
//!   of the load's 4 KiB page; one L1d lacks is a request from L1 to L2 too, and fills L1d;
//! - a request from L1 looks the line up in L2, then in the LLC, and fills both. It is what the
//!   LLC events count: an LLC Reference when it reaches the LLC, an LLC Miss when it misses there
//!   too (SDM Table 18-1: requests from the core, including the first-level prefetcher's fills);
//! - each request from L1 trains the L2 prefetchers: the streamer may fetch up to two lines ahead
//!   in its page, and when the request missed L2 the spatial prefetcher fetches the other line of
//!   its 128-byte pair. Their fetches go into L2 and the LLC and are not counted (the SDM's LLC
//!   events exclude the L2 hardware prefetchers' fills). Without an L2 (Core 2) they fill the LLC.
//!
//! The model is a pure `Clone + Eq` value: the same accesses from the same state give the same
//! events and the same state, on every host.

use std::ops::{Add, AddAssign};

use super::prefetch::{Dcu, IpStride, Streamer, PAGE};
use emon_pmu::pmu;
use emon_pmu::profile::{Cache, CacheLevel, PrefetcherSet};

/// What accesses did in the cache model.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheEvents {
    /// Lookups in the LLC: requests from L1 that missed L2 (LLC Reference, 0x2E/0x4F).
    pub llc_references: u64,
    /// Lookups in the LLC that missed it too (LLC Misses, 0x2E/0x41).
    pub llc_misses: u64,
    /// What [`super::cache_feed`] counts of the accesses, knowing each one's kind and instruction
    /// (the model leaves it empty).
    pub data: DataEvents,
}

/// The levels of [`CacheModel::access_by_level`], in [`pmu::Level`] order: L1d, L2, LLC, memory.
pub const LEVELS: usize = pmu::Level::ALL.len();

/// The lines of data accesses by kind, and the retired instructions by their accesses (README,
/// "Model-specific events"), as the feed counts them from [`CacheModel::access_by_level`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DataEvents {
    /// Lines of loads, and of stores (read-modify-writes included: fetched for ownership), by
    /// the level that held each.
    pub load_lines: [u64; LEVELS],
    pub store_lines: [u64; LEVELS],
    /// Instructions with a load that is not locked, by the farthest level that held one of their
    /// load lines (a read-modify-write's line is its load's).
    pub load_insns: [u64; LEVELS],
    /// Locked instructions, by the same rule.
    pub locked_insns: [u64; LEVELS],
    /// Load accesses and store accesses that crossed a line boundary.
    pub split_loads: u64,
    pub split_stores: u64,
    /// Instructions with such a load, and with such a store.
    pub split_load_insns: u64,
    pub split_store_insns: u64,
}

fn add4(a: [u64; LEVELS], b: [u64; LEVELS]) -> [u64; LEVELS] {
    std::array::from_fn(|i| a[i] + b[i])
}

impl Add for DataEvents {
    type Output = DataEvents;

    fn add(self, o: DataEvents) -> DataEvents {
        DataEvents {
            load_lines: add4(self.load_lines, o.load_lines),
            store_lines: add4(self.store_lines, o.store_lines),
            load_insns: add4(self.load_insns, o.load_insns),
            locked_insns: add4(self.locked_insns, o.locked_insns),
            split_loads: self.split_loads + o.split_loads,
            split_stores: self.split_stores + o.split_stores,
            split_load_insns: self.split_load_insns + o.split_load_insns,
            split_store_insns: self.split_store_insns + o.split_store_insns,
        }
    }
}

impl Add for CacheEvents {
    type Output = CacheEvents;

    fn add(self, other: CacheEvents) -> CacheEvents {
        CacheEvents {
            llc_references: self.llc_references + other.llc_references,
            llc_misses: self.llc_misses + other.llc_misses,
            data: self.data + other.data,
        }
    }
}

impl AddAssign for DataEvents {
    fn add_assign(&mut self, other: DataEvents) {
        *self = *self + other;
    }
}

impl AddAssign for CacheEvents {
    fn add_assign(&mut self, other: CacheEvents) {
        *self = *self + other;
    }
}

/// The most requests one line of a data access can make of the LLC: its own, and one from each
/// L1 prefetcher (they ask at most one line each per load). A bound on the LLC events of code
/// that touches a known number of lines.
pub const MAX_LLC_REQUESTS_PER_LINE: u64 = 3;

/// One data access of a retired instruction, as the cache model sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Touch {
    /// The instruction's address (the IP-based prefetcher keys on it).
    pub rip: u64,
    /// The linear address of its first byte, and its size in bytes.
    pub linear: u64,
    pub size: u32,
    /// A load (only loads train the L1 prefetchers); a store or a read-modify-write is not.
    pub load: bool,
}

/// A way that holds no line. Line numbers are physical addresses shifted right by at least 4
/// bits, so none of them is `u64::MAX`.
const EMPTY: u64 = u64::MAX;

/// One set-associative level.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Level {
    ways: usize,
    /// Sets - 1 (the number of sets is a power of two).
    set_mask: u64,
    /// `sets x ways` line numbers, set after set. Within a set the ways run from most to least
    /// recently used, and empty ways come last, so the last way is always the one to replace.
    lines: Vec<u64>,
}

impl Level {
    /// An empty level of `geometry` with `line`-byte lines. A validated profile gives a whole
    /// power-of-two number of sets; anything else is rounded down to one, and at least one set
    /// of one way is kept.
    fn new(geometry: CacheLevel, line: u32) -> Level {
        let sets = geometry.sets(line).max(1);
        let sets = 1u64 << sets.ilog2();
        let ways = usize::try_from(geometry.ways.max(1)).unwrap_or(1);
        let len = usize::try_from(sets).unwrap_or(1) * ways;
        Level { ways, set_mask: sets - 1, lines: vec![EMPTY; len] }
    }

    /// The ways of `line`'s set.
    fn set(&mut self, line: u64) -> &mut [u64] {
        // The set index is at most `set_mask`, which indexes `lines`.
        let start = (line & self.set_mask) as usize * self.ways;
        &mut self.lines[start..start + self.ways]
    }

    /// A lookup: on a hit `line` becomes its set's most recently used and the result is true;
    /// a miss changes nothing.
    fn lookup(&mut self, line: u64) -> bool {
        let set = self.set(line);
        match set.iter().position(|&l| l == line) {
            Some(way) => {
                set[..=way].rotate_right(1);
                true
            }
            None => false,
        }
    }

    /// Puts `line` (which is not in the level) in its set as the most recently used, replacing
    /// the least recently used line if the set is full. Returns the line it replaced.
    fn fill(&mut self, line: u64) -> Option<u64> {
        let set = self.set(line);
        set.rotate_right(1);
        let victim = std::mem::replace(&mut set[0], line);
        (victim != EMPTY).then_some(victim)
    }

    /// Removes `line` if the level holds it; the ways after it move up, and the last one empties.
    fn invalidate(&mut self, line: u64) {
        let set = self.set(line);
        if let Some(way) = set.iter().position(|&l| l == line) {
            set[way..].rotate_left(1);
            if let Some(last) = set.last_mut() {
                *last = EMPTY;
            }
        }
    }

    /// Does the level hold `line` (without touching its LRU order)?
    fn holds(&self, line: u64) -> bool {
        let start = (line & self.set_mask) as usize * self.ways;
        self.lines[start..start + self.ways].contains(&line)
    }

    fn clear(&mut self) {
        self.lines.fill(EMPTY);
    }
}

/// The prefetchers' state, and which of them are on.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Prefetchers {
    /// The profile's prefetchers, and those of them on now.
    present: PrefetcherSet,
    on: PrefetcherSet,
    dcu: Dcu,
    ip: IpStride,
    streamer: Option<Streamer>,
}

/// The data caches of one vCPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheModel {
    /// log2 of the line size.
    line_shift: u32,
    l1d: Level,
    l2: Option<Level>,
    llc: Level,
    prefetch: Prefetchers,
}

impl CacheModel {
    /// An empty (cold) hierarchy of `cache`, which should come from a validated profile, with
    /// its prefetchers all on. Its L1i is not modelled.
    pub fn new(cache: &Cache) -> CacheModel {
        let line = cache.line.max(16);
        let line_shift = line.ilog2();
        let level = |geometry: CacheLevel| Level::new(geometry, 1 << line_shift);
        let present = cache.prefetchers.present();
        let prefetch = Prefetchers {
            present,
            on: present,
            dcu: Dcu::default(),
            ip: IpStride::default(),
            streamer: cache.prefetchers.streamer.map(Streamer::new),
        };
        CacheModel { line_shift, l1d: level(cache.l1d), l2: cache.l2.map(level), llc: level(cache.llc), prefetch }
    }

    /// Turns on exactly the prefetchers of `on` the profile has (the guest's control register).
    pub fn set_prefetchers(&mut self, on: PrefetcherSet) {
        self.prefetch.on = on.intersection(self.prefetch.present);
    }

    /// Is prefetcher `p` on?
    fn on(&self, p: PrefetcherSet) -> bool {
        self.prefetch.on.contains(p)
    }

    /// One data access: every line it touches (two when it crosses a line boundary) is looked up
    /// in L1d, then L2, then the LLC, and filled on the way back; a load then lets the L1
    /// prefetchers ask for their lines. `translate` gives the physical address of a linear one
    /// (`None`: not mapped, and nothing is looked up there). `size` 0 touches nothing.
    pub fn access(&mut self, t: Touch, translate: impl Fn(u64) -> Option<u64>) -> CacheEvents {
        self.access_by_level(t, translate).0
    }

    /// [`CacheModel::access`], with the access's own lines counted by the level that held each
    /// ([`LEVELS`]: L1d, L2, LLC, memory; a line a prefetcher fetched before is held where it
    /// put it, and the lines the prefetchers fetch now are not the access's).
    pub fn access_by_level(
        &mut self,
        t: Touch,
        translate: impl Fn(u64) -> Option<u64>,
    ) -> (CacheEvents, [u64; LEVELS]) {
        let mut events = CacheEvents::default();
        let mut levels = [0; LEVELS];
        let end = t.linear.saturating_add(u64::from(t.size));
        let mut la = t.linear;
        let mut first = None;
        while la < end {
            // Each 4 KiB page of the access by itself: its bytes are physically contiguous.
            let piece = (PAGE - la % PAGE).min(end - la);
            if let Some(pa) = translate(la) {
                first = first.or((la == t.linear).then_some(pa));
                let (from, to) = (pa >> self.line_shift, pa.saturating_add(piece - 1) >> self.line_shift);
                for line in from..=to {
                    let (level, e) = self.demand(line);
                    levels[level as usize] += 1;
                    events += e;
                }
            }
            la += piece;
        }
        if let (true, Some(pa)) = (t.load, first) {
            events += self.l1_prefetchers(t, pa);
        }
        (events, levels)
    }

    /// CLFLUSH or CLFLUSHOPT of the line that holds `paddr`: the line leaves every level. It
    /// counts nothing (the SDM does not count a flush as an LLC reference).
    pub fn flush(&mut self, paddr: u64) {
        let line = paddr >> self.line_shift;
        self.l1d.invalidate(line);
        if let Some(l2) = &mut self.l2 {
            l2.invalidate(line);
        }
        self.llc.invalidate(line);
    }

    /// WBINVD or INVD: every level empties. Counts nothing.
    pub fn flush_all(&mut self) {
        self.l1d.clear();
        if let Some(l2) = &mut self.l2 {
            l2.clear();
        }
        self.llc.clear();
    }

    /// The caches empty and the prefetchers untrained, as when emon starts to model them.
    pub fn reset(&mut self) {
        self.flush_all();
        let p = &mut self.prefetch;
        p.dcu = Dcu::default();
        p.ip = IpStride::default();
        if let Some(s) = &mut p.streamer {
            *s = Streamer::new(s.params());
        }
    }

    /// One line of a demand access: the level that held it, and what it did at the LLC.
    fn demand(&mut self, line: u64) -> (pmu::Level, CacheEvents) {
        if self.l1d.lookup(line) {
            return (pmu::Level::L1, CacheEvents::default());
        }
        self.l1_request(line)
    }

    /// The L1 prefetchers after a load at `t.linear` (physical `paddr`): the DCU prefetcher's
    /// request, then the IP-based one's, each within the load's 4 KiB page.
    fn l1_prefetchers(&mut self, t: Touch, paddr: u64) -> CacheEvents {
        let dcu = if self.on(PrefetcherSet::DCU) { self.prefetch.dcu.load(t.linear, self.line_shift) } else { None };
        let ip = if self.on(PrefetcherSet::IP_STRIDE) { self.prefetch.ip.load(t.rip, t.linear) } else { None };
        // The DCU prefetcher's offset is from the load's line; the IP one's from its address.
        let line_base = paddr >> self.line_shift << self.line_shift;
        let targets = [dcu.map(|o| line_base.wrapping_add(o)), ip.map(|s| paddr.wrapping_add_signed(s))];
        let mut events = CacheEvents::default();
        for target in targets.into_iter().flatten().filter(|&a| a / PAGE == paddr / PAGE) {
            let line = target >> self.line_shift;
            // A line L1d holds needs no fetch (and its LRU order stays).
            if !self.l1d.holds(line) {
                events += self.l1_request(line).1;
            }
        }
        events
    }

    /// A request from L1 for `line` (a demand miss or an L1 prefetch): looked up in L2 and the
    /// LLC, filled into every level, counted at the LLC; then the L2 prefetchers act on it. The
    /// level that held the line: L2, the LLC, or memory.
    fn l1_request(&mut self, line: u64) -> (pmu::Level, CacheEvents) {
        let l2_hit = self.l2.as_mut().is_some_and(|l2| l2.lookup(line));
        let mut events = CacheEvents::default();
        let mut level = pmu::Level::L2;
        // The level the L2 prefetchers serve missed: L2, or the LLC where it is the second level.
        let mut missed = false;
        if !l2_hit {
            events.llc_references = 1;
            level = pmu::Level::Llc;
            if !self.llc.lookup(line) {
                events.llc_misses = 1;
                level = pmu::Level::Memory;
                self.fill_llc(line);
            }
            if let Some(l2) = &mut self.l2 {
                l2.fill(line);
                missed = true;
            } else {
                missed = events.llc_misses == 1;
            }
        }
        self.l1d.fill(line);
        self.l2_prefetchers(line, missed);
        (level, events)
    }

    /// The spatial prefetcher (after a miss) and the streamer, on a request from L1 for `line`.
    fn l2_prefetchers(&mut self, line: u64, missed: bool) {
        if missed && self.on(PrefetcherSet::ADJACENT_LINE) {
            self.l2_prefetch(line ^ 1);
        }
        if !self.on(PrefetcherSet::STREAMER) {
            return;
        }
        let per_page = (PAGE >> self.line_shift).max(1);
        let Some(s) = &mut self.prefetch.streamer else { return };
        for target in s.request(line, per_page).into_iter().flatten() {
            self.l2_prefetch(target);
        }
    }

    /// An L2 prefetcher's fetch of `line` into L2 and the LLC (the LLC alone without an L2): a
    /// line already there needs none. Not counted.
    fn l2_prefetch(&mut self, line: u64) {
        let there = match &self.l2 {
            Some(l2) => l2.holds(line),
            None => self.llc.holds(line),
        };
        if there {
            return;
        }
        if !self.llc.lookup(line) {
            self.fill_llc(line);
        }
        if let Some(l2) = &mut self.l2 {
            l2.fill(line);
        }
    }

    /// Fills `line` into the LLC; what that evicts leaves the inner levels too (inclusion).
    fn fill_llc(&mut self, line: u64) {
        if let Some(victim) = self.llc.fill(line) {
            self.l1d.invalidate(victim);
            if let Some(l2) = &mut self.l2 {
                l2.invalidate(victim);
            }
        }
    }

    /// Which levels hold the line of `paddr`: (L1d, L2, LLC); L2 is false without one.
    #[cfg(test)]
    fn holds(&self, paddr: u64) -> (bool, bool, bool) {
        let line = paddr >> self.line_shift;
        (self.l1d.holds(line), self.l2.as_ref().is_some_and(|l2| l2.holds(line)), self.llc.holds(line))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use emon_pmu::profile::{Prefetchers, Streamer};

    const LINE: u64 = 64;
    const KIB: u64 = 1024;

    /// The default profile's hierarchy: 32 KiB 8-way L1d, 256 KiB 4-way L2, 8 MiB 16-way LLC,
    /// with its prefetchers off (the hierarchy's own behaviour).
    fn skylake() -> CacheModel {
        let mut m = CacheModel::new(&Cache::SKYLAKE_CLIENT);
        m.set_prefetchers(PrefetcherSet::NONE);
        m
    }

    /// The same with the prefetchers of `on`.
    fn skylake_with(on: PrefetcherSet) -> CacheModel {
        let mut m = CacheModel::new(&Cache::SKYLAKE_CLIENT);
        m.set_prefetchers(on);
        m
    }

    /// An access of `size` bytes at `paddr` (identity-mapped) by the instruction at `rip`.
    fn read_at(m: &mut CacheModel, rip: u64, paddr: u64, size: u32) -> CacheEvents {
        m.access(Touch { rip, linear: paddr, size, load: true }, Some)
    }

    /// An 8-byte read at `paddr` from one load instruction.
    fn read(m: &mut CacheModel, paddr: u64) -> CacheEvents {
        read_at(m, 0x400, paddr, 8)
    }

    /// A store of 8 bytes at `paddr`.
    fn write(m: &mut CacheModel, paddr: u64) -> CacheEvents {
        m.access(Touch { rip: 0x500, linear: paddr, size: 8, load: false }, Some)
    }

    /// Reads `bytes` from `base` at a 64-byte stride, one 8-byte read per line.
    fn sweep(m: &mut CacheModel, base: u64, bytes: u64) -> CacheEvents {
        strided(m, base, bytes / LINE, LINE)
    }

    /// `n` 8-byte reads from one instruction, `stride` bytes apart.
    fn strided(m: &mut CacheModel, base: u64, n: u64, stride: u64) -> CacheEvents {
        (0..n).map(|i| read(m, base + i * stride)).fold(CacheEvents::default(), |a, b| a + b)
    }

    fn events(llc_references: u64, llc_misses: u64) -> CacheEvents {
        CacheEvents { llc_references, llc_misses, ..CacheEvents::default() }
    }

    /// A small xorshift, so that "random" accesses are the same on every run.
    fn addresses(seed: u64, n: usize, span: u64) -> Vec<u64> {
        let mut x = seed;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x % span
            })
            .collect()
    }

    #[test]
    fn a_fresh_buffer_misses_the_llc_once_per_line() {
        let mut m = skylake();
        assert_eq!(sweep(&mut m, 0x10_0000, 64 * KIB), events(1024, 1024));
        // Reads within lines already fetched count nothing.
        let mut m = skylake();
        let e = (0..512u64).map(|i| read(&mut m, 0x10_0000 + i * 8)).fold(CacheEvents::default(), |a, b| a + b);
        assert_eq!(e, events(64, 64));
    }

    #[test]
    fn a_reread_small_buffer_hits_l1d() {
        let mut m = skylake();
        sweep(&mut m, 0x4000, 16 * KIB);
        assert_eq!(sweep(&mut m, 0x4000, 16 * KIB), events(0, 0));
        for i in 0..16 * KIB / LINE {
            assert!(m.holds(0x4000 + i * LINE).0, "line {i} not in L1d");
        }
    }

    #[test]
    fn clflush_then_read_is_an_llc_reference_and_miss() {
        let mut m = skylake();
        read(&mut m, 0x8000);
        let before = m.clone();
        m.flush(0x8010); // any byte of the line
        assert_ne!(m, before);
        assert_eq!(m.holds(0x8000), (false, false, false));
        assert_eq!(read(&mut m, 0x8000), events(1, 1));
        // Flushing a line that is not cached changes nothing.
        let before = m.clone();
        m.flush(0x9_0000);
        assert_eq!(m, before);
    }

    #[test]
    fn a_working_set_beyond_l1d_but_inside_l2_does_not_reach_the_llc_again() {
        let mut m = skylake();
        assert_eq!(sweep(&mut m, 0, 128 * KIB), events(2048, 2048));
        assert_eq!(sweep(&mut m, 0, 128 * KIB), events(0, 0));
        // It did miss L1d (32 KiB): the first lines are no longer there.
        assert_eq!(m.holds(0), (false, true, true));
    }

    #[test]
    fn a_working_set_beyond_l2_but_inside_the_llc_references_without_missing() {
        let mut m = skylake();
        assert_eq!(sweep(&mut m, 0, 1024 * KIB), events(16384, 16384));
        assert_eq!(sweep(&mut m, 0, 1024 * KIB), events(16384, 0));
    }

    #[test]
    fn a_working_set_beyond_the_llc_thrashes_under_lru() {
        let mut m = skylake();
        let bytes = 9 * 1024 * KIB; // 9 MiB against an 8 MiB LLC
        let lines = bytes / LINE;
        assert_eq!(sweep(&mut m, 0, bytes), events(lines, lines));
        // A cyclic sweep bigger than the cache evicts every line just before it is needed.
        assert_eq!(sweep(&mut m, 0, bytes), events(lines, lines));
    }

    #[test]
    fn one_set_holds_exactly_its_ways() {
        // Lines 512 KiB apart share an LLC set (8192 sets x 64 bytes), an L2 set and an L1d set.
        let stride = 8192 * LINE;
        let mut m = skylake();
        let pass = |m: &mut CacheModel, n: u64| (0..n).map(|i| read(m, i * stride)).fold(events(0, 0), |a, b| a + b);
        assert_eq!(pass(&mut m, 16), events(16, 16));
        // 16 ways: the second pass misses L1d (8 ways) and L2 (4 ways) but hits the LLC.
        assert_eq!(pass(&mut m, 16), events(16, 0));
        // 17 lines in a 16-way set: LRU evicts each one before its turn comes.
        let mut m = skylake();
        pass(&mut m, 17);
        assert_eq!(pass(&mut m, 17), events(17, 17));
    }

    #[test]
    fn an_llc_eviction_back_invalidates_the_inner_levels() {
        let stride = 8192 * LINE;
        let mut m = skylake();
        let a = 0;
        read(&mut m, a);
        // Keep `a` hot in L1d while 15 other lines fill its LLC set: L1d hits do not reach
        // the LLC, so there `a` ages to least recently used.
        for i in 1..16 {
            read(&mut m, i * stride);
            assert_eq!(read(&mut m, a), events(0, 0), "a stays in L1d");
        }
        assert!(m.holds(a).0);
        // The 17th line evicts `a` from the LLC, and inclusion takes it out of L1d too.
        assert_eq!(read(&mut m, 16 * stride), events(1, 1));
        assert_eq!(m.holds(a), (false, false, false));
        assert_eq!(read(&mut m, a), events(1, 1));
    }

    #[test]
    fn inner_levels_stay_inside_the_llc() {
        for with_l2 in [true, false] {
            // Tiny levels and every prefetcher, so that their fills evict all the time.
            let mut m = CacheModel::new(&Cache {
                line: 64,
                l1d: CacheLevel { kib: 1, ways: 2 },
                l1i: CacheLevel { kib: 1, ways: 2 },
                l2: with_l2.then_some(CacheLevel { kib: 2, ways: 4 }),
                llc: CacheLevel { kib: 4, ways: 4 },
                ..Cache::SKYLAKE_CLIENT
            });
            // Every other access goes to one of three hot lines of LLC set 0, which L1d keeps
            // while the LLC, which does not see L1d hits, ages them out: back-invalidations
            // happen. The others sweep, stride and jump, from a few instructions.
            let hot = [0, 16 * LINE, 32 * LINE];
            for (i, a) in addresses(7, 20_000, 16 * KIB).into_iter().enumerate() {
                let a = if i % 7 < 3 { (i as u64 * 72) % (16 * KIB) } else { a };
                if i % 2 == 0 {
                    read(&mut m, hot[i / 2 % 3]);
                } else if i % 3 == 0 {
                    write(&mut m, a);
                } else {
                    read_at(&mut m, 0x400 + (i % 5) as u64, a, 1 + (i % 16) as u32);
                }
                if a % 5 == 0 {
                    m.flush(a ^ 0x40);
                }
            }
            check_inclusion(&m);
        }
    }

    /// Every line of L1d and L2 is in the LLC, and empty ways come last in every set.
    fn check_inclusion(m: &CacheModel) {
        let llc: Vec<u64> = m.llc.lines.iter().copied().filter(|&l| l != EMPTY).collect();
        let l2 = m.l2.as_ref().map(|l2| l2.lines.clone()).unwrap_or_default();
        for line in m.l1d.lines.iter().chain(&l2).filter(|&&l| l != EMPTY) {
            assert!(llc.contains(line), "line {line:#x} is in an inner level but not the LLC");
        }
        // Empty ways are always at the end of their set.
        for level in [Some(&m.l1d), m.l2.as_ref(), Some(&m.llc)].into_iter().flatten() {
            for set in level.lines.chunks(level.ways) {
                let first_empty = set.iter().position(|&l| l == EMPTY).unwrap_or(set.len());
                assert!(set[first_empty..].iter().all(|&l| l == EMPTY), "{set:x?}");
            }
        }
    }

    #[test]
    fn lru_replaces_the_least_recently_used_way() {
        let mut level = Level::new(CacheLevel { kib: 1, ways: 4 }, 64); // 4 sets of 4 ways
        let (a, b, c, d, e) = (0, 4, 8, 12, 16); // all in set 0
        for line in [a, b, c, d] {
            assert!(!level.lookup(line));
            assert_eq!(level.fill(line), None, "the set had room");
        }
        assert!(level.lookup(a)); // a is now the most recently used
        assert_eq!(level.fill(e), Some(b));
        assert_eq!(level.fill(b), Some(c));
        level.invalidate(d);
        assert_eq!(level.fill(d), None, "invalidating freed a way");
        assert!([a, e, b, d].iter().all(|&line| level.holds(line)));
        assert!(!level.holds(c));
        assert_eq!(level.lines[4..], [EMPTY; 12], "the other sets are untouched");
    }

    #[test]
    fn an_access_crossing_a_line_boundary_touches_two_lines() {
        let mut m = skylake();
        assert_eq!(read_at(&mut m, 0x400, 0x1000 + 60, 8), events(2, 2));
        assert_eq!(m.holds(0x1000), (true, true, true));
        assert_eq!(m.holds(0x1040), (true, true, true));
        // Within one line: one lookup, now a hit.
        assert_eq!(read_at(&mut m, 0x401, 0x1000 + 56, 8), events(0, 0));
        // A 64-byte access that is not aligned touches two lines; an aligned one, one.
        assert_eq!(read_at(&mut m, 0x402, 0x2000 + 32, 64), events(2, 2));
        assert_eq!(read_at(&mut m, 0x403, 0x3000, 64), events(1, 1));
        // Size 0 touches nothing; the top of the address space does not overflow.
        assert_eq!(read_at(&mut m, 0x404, 0x5000, 0), events(0, 0));
        assert_eq!(read_at(&mut m, 0x405, u64::MAX - 3, 8), events(1, 1));
        // An access crossing a page boundary is one lookup per page, each where its page maps.
        let mut m = skylake();
        let split = |la: u64| Some(if la < 0x8000 { la } else { la + 0x10_0000 });
        let e = m.access(Touch { rip: 0x406, linear: 0x8000 - 4, size: 8, load: true }, split);
        assert_eq!(e, events(2, 2));
        assert_eq!((m.holds(0x7FC0).0, m.holds(0x10_8000).0, m.holds(0x8000).0), (true, true, false));
        // A page that is not mapped is not looked up.
        let e = m.access(Touch { rip: 0x407, linear: 0x20_0000 - 4, size: 8, load: true }, |la| {
            (la < 0x20_0000).then_some(la)
        });
        assert_eq!(e, events(1, 1));
    }

    #[test]
    fn without_an_l2_every_l1d_miss_is_an_llc_reference() {
        // Core 2: 32 KiB 8-way L1d, 6 MiB 24-way L2 as the last level.
        let mut m = CacheModel::new(&Cache {
            line: 64,
            l1d: CacheLevel { kib: 32, ways: 8 },
            l1i: CacheLevel { kib: 32, ways: 8 },
            l2: None,
            llc: CacheLevel { kib: 6144, ways: 24 },
            prefetchers: Default::default(),
        });
        assert_eq!(sweep(&mut m, 0, 64 * KIB), events(1024, 1024));
        assert_eq!(sweep(&mut m, 0, 64 * KIB), events(1024, 0));
        assert_eq!(sweep(&mut m, 0, 16 * KIB), events(256, 0), "the sweep's tail displaced its head from L1d");
        assert_eq!(sweep(&mut m, 0, 16 * KIB), events(0, 0));
    }

    #[test]
    fn the_same_accesses_give_the_same_state_and_events() {
        let run = |seed: u64| {
            let mut m = skylake();
            let mut total = CacheEvents::default();
            for (i, a) in addresses(seed, 50_000, 32 * 1024 * KIB).into_iter().enumerate() {
                if i % 97 == 0 {
                    m.flush(a);
                } else {
                    total += read_at(&mut m, 0x400 + (i % 3) as u64, a, 1 + (i % 16) as u32);
                }
            }
            (m, total)
        };
        let (a, a_events) = run(1);
        let (b, b_events) = run(1);
        assert_eq!(a, b);
        assert_eq!(a_events, b_events);
        assert!(a_events.llc_misses > 0 && a_events.llc_misses <= a_events.llc_references);
        let (c, _) = run(2);
        assert_ne!(a, c, "a different sequence leaves a different state");
        let mut d = a.clone();
        assert_eq!(d, a);
        d.reset();
        assert_eq!(d, skylake(), "reset leaves a cold hierarchy and untrained prefetchers");
        let mut e = skylake_with(PrefetcherSet::ALL);
        strided(&mut e, 0, 100, 64);
        let mut cold = e.clone();
        cold.reset();
        assert_eq!(cold, skylake_with(PrefetcherSet::ALL));
        e.flush_all();
        assert_ne!(e, cold, "flush_all (WBINVD) empties the caches, not the prefetchers' tables");
    }

    /// 16 KiB of 4 KiB pages: what the prefetcher tests sweep, from 1 MiB up.
    const BASE: u64 = 0x10_0000;
    const PAGES: u64 = 16;

    /// Each prefetcher set alone, by name.
    fn only(p: PrefetcherSet) -> CacheModel {
        skylake_with(p)
    }

    #[test]
    fn a_sequential_sweep_misses_once_per_page_with_the_prefetchers() {
        let lines = PAGES * 64;
        let sweep_with = |on| sweep(&mut only(on), BASE, PAGES * 4096);
        // Every prefetcher: each page's first line misses; the adjacent line and the streamer
        // have the next ones in L2 before the loads ask, and none crosses into the next page.
        assert_eq!(sweep_with(PrefetcherSet::ALL), events(PAGES, PAGES));
        assert_eq!(sweep_with(PrefetcherSet::NONE), events(lines, lines));
        // The L2 prefetchers alone do the same; the streamer alone needs two misses a page (the
        // second sets its direction); the adjacent line alone halves the misses.
        let l2 = PrefetcherSet::STREAMER.union(PrefetcherSet::ADJACENT_LINE);
        assert_eq!(sweep_with(l2), events(PAGES, PAGES));
        assert_eq!(sweep_with(PrefetcherSet::STREAMER), events(2 * PAGES, 2 * PAGES));
        assert_eq!(sweep_with(PrefetcherSet::ADJACENT_LINE), events(lines / 2, lines / 2));
        // The L1 prefetchers fetch the lines before the loads do, but their requests are counted
        // as the loads' would be (SDM: the first-level prefetcher's fills are LLC references).
        let l1 = PrefetcherSet::DCU.union(PrefetcherSet::IP_STRIDE);
        assert_eq!(sweep_with(l1), events(lines, lines));
        assert_eq!(sweep_with(PrefetcherSet::IP_STRIDE), events(lines, lines));
        // One load a line never ascends within a line: the DCU prefetcher stays idle.
        assert_eq!(sweep_with(PrefetcherSet::DCU), events(lines, lines));
        // Backward: the same, one miss a page (the top line; its pair and the stream follow).
        let mut m = only(PrefetcherSet::ALL);
        let back = (0..lines).map(|i| read(&mut m, BASE + (lines - 1 - i) * LINE)).fold(events(0, 0), |a, b| a + b);
        assert_eq!(back, events(PAGES, PAGES));
    }

    #[test]
    fn by_level_the_access_lines_are_where_they_were_held() {
        let level = |m: &mut CacheModel, paddr: u64, size: u32| {
            m.access_by_level(Touch { rip: 0x400, linear: paddr, size, load: true }, Some)
        };
        let at = |l1, l2, llc, mem| [l1, l2, llc, mem];
        // Without prefetchers: a cold line from memory, again from L1d; a line split over a cold
        // and a held line; the LLC events are those of the lines that missed L2.
        let mut m = skylake();
        assert_eq!(level(&mut m, BASE, 8), (events(1, 1), at(0, 0, 0, 1)));
        assert_eq!(level(&mut m, BASE, 8), (events(0, 0), at(1, 0, 0, 0)));
        assert_eq!(level(&mut m, BASE + 60, 8), (events(1, 1), at(1, 0, 0, 1)));
        // With every prefetcher, over a page read line by line: its first line from memory, every
        // other one where a prefetcher put it first, never the LLC; the prefetchers' own fetches
        // are not the access's lines. The second and third come from L2 (the adjacent line, the
        // streamer); from the fourth on the IP prefetcher, its stride seen twice, has each in L1d.
        let mut m = only(PrefetcherSet::ALL);
        let mut total = (events(0, 0), at(0, 0, 0, 0));
        for i in 0..64 {
            let (e, l) = level(&mut m, BASE + i * LINE, 8);
            total = (total.0 + e, std::array::from_fn(|k| total.1[k] + l[k]));
        }
        assert_eq!(total.0, events(1, 1));
        assert_eq!(total.1, at(61, 2, 0, 1));
    }

    #[test]
    fn without_an_l2_every_request_from_l1_is_an_llc_reference() {
        // Core 2: the prefetchers fill the L2, which is the LLC: the misses are one a page, but
        // every line is still one request from L1 (a demand miss or an IP prefetch).
        let mut m = CacheModel::new(&Cache {
            l2: None,
            llc: CacheLevel { kib: 6144, ways: 24 },
            prefetchers: Prefetchers {
                streamer: Some(Streamer { distance: 8, pages: 16 }),
                misc_feature_control: None,
                misc_enable: true,
                ..Cache::SKYLAKE_CLIENT.prefetchers
            },
            ..Cache::SKYLAKE_CLIENT
        });
        assert_eq!(sweep(&mut m, BASE, PAGES * 4096), events(PAGES * 64, PAGES));
    }

    #[test]
    fn the_l1_prefetchers_fetch_past_the_end_of_a_buffer() {
        // 16 lines in the middle of a page: the prefetch after the last load is a 17th line.
        let base = BASE + 16 * LINE;
        let two_loads_a_line = |m: &mut CacheModel| {
            (0..16u64).map(|i| read(m, base + i * LINE) + read(m, base + i * LINE + 8)).fold(events(0, 0), |a, b| a + b)
        };
        assert_eq!(two_loads_a_line(&mut only(PrefetcherSet::NONE)), events(16, 16));
        // The second load of each line ascends: the DCU prefetcher fetches the next line.
        assert_eq!(two_loads_a_line(&mut only(PrefetcherSet::DCU)), events(17, 17));
        // Strides of 8 and 56 bytes alternate: the IP-based prefetcher never sees one repeat.
        assert_eq!(two_loads_a_line(&mut only(PrefetcherSet::IP_STRIDE)), events(16, 16));
        // One load a line repeats its stride from the third load on.
        assert_eq!(strided(&mut only(PrefetcherSet::IP_STRIDE), base, 16, LINE), events(17, 17));
        // Stores train no L1 prefetcher.
        let mut m = only(PrefetcherSet::IP_STRIDE.union(PrefetcherSet::DCU));
        let stores = (0..16u64).map(|i| write(&mut m, base + i * LINE)).fold(events(0, 0), |a, b| a + b);
        assert_eq!(stores, events(16, 16));
        // A stride past 2 KiB is not followed; nor is one that lands on the next page.
        assert_eq!(strided(&mut only(PrefetcherSet::IP_STRIDE), BASE, 16, 4096 + LINE), events(16, 16));
    }

    #[test]
    fn strided_page_crossing_and_scattered_reads() {
        // Every other line: the first two lines of a page miss (the IP prefetcher asks for the
        // second), then the streamer stays ahead of the stride.
        assert_eq!(strided(&mut only(PrefetcherSet::ALL), BASE, PAGES * 32, 2 * LINE), events(2 * PAGES, 2 * PAGES));
        assert_eq!(strided(&mut only(PrefetcherSet::NONE), BASE, PAGES * 32, 2 * LINE), events(PAGES * 32, PAGES * 32));
        // Reads across each page boundary touch a page's last line and the next page's first:
        // two misses each, prefetchers or not (4 KiB strides, and no line used twice).
        for on in [PrefetcherSet::ALL, PrefetcherSet::NONE] {
            let mut m = only(on);
            let e = (0..PAGES).map(|k| read(&mut m, BASE + k * 4096 + 4092)).fold(events(0, 0), |a, b| a + b);
            assert_eq!(e, events(2 * PAGES, 2 * PAGES));
        }
        // One line in each page, pages in a scattered order (5k mod 16: neighbours 5 or 11
        // pages apart) at scattered offsets: every read misses, with prefetchers or without.
        // Then the other line of each line's pair: the adjacent-line prefetcher fetched them all.
        let offsets = addresses(3, PAGES as usize, 64);
        let line_of = |k: u64, pair: u64| BASE + (5 * k % PAGES) * 4096 + ((offsets[k as usize] ^ pair) * LINE);
        for (on, second) in [(PrefetcherSet::ALL, events(0, 0)), (PrefetcherSet::NONE, events(PAGES, PAGES))] {
            let mut m = only(on);
            let first = (0..PAGES).map(|k| read(&mut m, line_of(k, 0))).fold(events(0, 0), |a, b| a + b);
            assert_eq!(first, events(PAGES, PAGES));
            let pairs = (0..PAGES).map(|k| read(&mut m, line_of(k, 1))).fold(events(0, 0), |a, b| a + b);
            assert_eq!(pairs, second);
        }
    }

    #[test]
    fn prefetchers_turned_off_stop_and_those_the_cpu_lacks_never_start() {
        let mut m = only(PrefetcherSet::ALL);
        m.set_prefetchers(PrefetcherSet::NONE);
        assert_eq!(sweep(&mut m, BASE, 4096), events(64, 64));
        // A CPU without prefetchers stays without, whatever the control says.
        let mut bare = CacheModel::new(&Cache { prefetchers: Prefetchers::default(), ..Cache::SKYLAKE_CLIENT });
        bare.set_prefetchers(PrefetcherSet::ALL);
        assert_eq!(sweep(&mut bare, BASE, 4096), events(64, 64));
    }

    #[test]
    fn events_add_up() {
        let mut e = events(1, 0);
        e += events(2, 1);
        assert_eq!(e, events(3, 1));
        assert_eq!(e + events(10, 10), events(13, 11));
    }

    #[test]
    fn an_unvalidated_geometry_still_builds() {
        let m = CacheModel::new(&Cache {
            line: 0,
            l1d: CacheLevel { kib: 0, ways: 0 },
            l1i: CacheLevel { kib: 0, ways: 0 },
            l2: None,
            llc: CacheLevel { kib: 48, ways: 8 }, // 384 sets of 16-byte lines, rounded down to 256
            prefetchers: Default::default(),
        });
        assert_eq!(m.line_shift, 4);
        assert_eq!(m.llc.set_mask, 255);
        assert_eq!((m.l1d.set_mask, m.l1d.ways), (0, 1));
    }
}
