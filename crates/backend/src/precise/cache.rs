//! A deterministic model of the guest's data caches, for the architectural events LLC Reference
//! (0x2E/0x4F) and LLC Misses (0x2E/0x41) and the model-specific events that count lines by the
//! level that held them (README, "The cache model", "Model-specific events").
//!
//! The hierarchy is a profile's [`Cache`]: L1d, an optional L2 and the last-level cache (LLC).
//! Every level is set-associative with LRU replacement and is indexed by the physical line
//! address: a line's set is its line number modulo the number of sets (no hashing across LLC
//! slices). Reads and writes alike allocate (write-allocate), and a line that misses is filled
//! into every level. The LLC is inclusive of L1d and L2: a line it evicts is invalidated in both
//! (back-invalidation). L2 is neither inclusive nor exclusive of L1d: a line L2 evicts may stay in
//! L1d. Only the LLC's lookups are counted; the inner levels decide which accesses reach it.
//!
//! The model is a pure `Clone + Eq` value: the same accesses from the same state give the same
//! events and the same state, on every host.

use std::ops::{Add, AddAssign};

use emon_pmu::pmu;
use emon_pmu::profile::{Cache, CacheLevel};

/// What accesses did in the cache model.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheEvents {
    /// Lookups in the LLC: accesses that missed every inner level (LLC Reference, 0x2E/0x4F).
    pub llc_references: u64,
    /// Lookups in the LLC that missed it too (LLC Misses, 0x2E/0x41).
    pub llc_misses: u64,
    /// What [`super::cache_feed`] counts of the accesses, knowing each one's kind and instruction
    /// (the model leaves it empty).
    pub data: DataEvents,
}

/// The levels of [`CacheModel::access_by_level`], in [`pmu::Level`] order: L1d, L2, LLC, memory.
pub const LEVELS: usize = pmu::Level::ALL.len();

impl CacheEvents {
    /// The LLC's counts for lines held at `levels` ([`CacheModel::access_by_level`]): a line
    /// that missed the inner levels is an LLC reference, and one that missed the LLC a miss.
    pub fn at_llc(levels: [u64; LEVELS]) -> CacheEvents {
        let misses = levels[pmu::Level::Memory as usize];
        CacheEvents {
            llc_references: levels[pmu::Level::Llc as usize] + misses,
            llc_misses: misses,
            ..CacheEvents::default()
        }
    }
}

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
    #[cfg(test)]
    fn holds(&self, line: u64) -> bool {
        let start = (line & self.set_mask) as usize * self.ways;
        self.lines[start..start + self.ways].contains(&line)
    }

    fn clear(&mut self) {
        self.lines.fill(EMPTY);
    }
}

/// The data caches of one vCPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheModel {
    /// log2 of the line size.
    line_shift: u32,
    l1d: Level,
    l2: Option<Level>,
    llc: Level,
}

impl CacheModel {
    /// An empty (cold) hierarchy of `cache`, which should come from a validated profile. Its L1i
    /// is not modelled.
    pub fn new(cache: &Cache) -> CacheModel {
        let line = cache.line.max(16);
        let line_shift = line.ilog2();
        let level = |geometry: CacheLevel| Level::new(geometry, 1 << line_shift);
        CacheModel { line_shift, l1d: level(cache.l1d), l2: cache.l2.map(level), llc: level(cache.llc) }
    }

    /// One data access, a read or a write, of `size` bytes at physical address `paddr`: every
    /// line it touches (two when it crosses a line boundary) is looked up in L1d, then L2, then
    /// the LLC, and filled on the way back. `size` 0 touches nothing.
    ///
    /// The bytes must be physically contiguous: a caller translating a linear access that
    /// crosses a page boundary makes one call per page.
    pub fn access(&mut self, paddr: u64, size: u32) -> CacheEvents {
        CacheEvents::at_llc(self.access_by_level(paddr, size))
    }

    /// [`CacheModel::access`], counting the lines it touched by the level that held each
    /// ([`LEVELS`]: L1d, L2, LLC, memory).
    pub fn access_by_level(&mut self, paddr: u64, size: u32) -> [u64; LEVELS] {
        let mut levels = [0; LEVELS];
        let Some(last_byte) = u64::from(size).checked_sub(1) else {
            return levels;
        };
        let first = paddr >> self.line_shift;
        let last = paddr.saturating_add(last_byte) >> self.line_shift;
        for line in first..=last {
            levels[self.access_line(line) as usize] += 1;
        }
        levels
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

    /// One line's lookup through the hierarchy: the level that held it.
    fn access_line(&mut self, line: u64) -> pmu::Level {
        if self.l1d.lookup(line) {
            return pmu::Level::L1;
        }
        if let Some(l2) = &mut self.l2 {
            if l2.lookup(line) {
                self.l1d.fill(line);
                return pmu::Level::L2;
            }
        }
        let mut level = pmu::Level::Llc;
        if !self.llc.lookup(line) {
            level = pmu::Level::Memory;
            if let Some(victim) = self.llc.fill(line) {
                // Inclusive LLC: what it evicts leaves the inner levels too.
                self.l1d.invalidate(victim);
                if let Some(l2) = &mut self.l2 {
                    l2.invalidate(victim);
                }
            }
        }
        if let Some(l2) = &mut self.l2 {
            l2.fill(line);
        }
        self.l1d.fill(line);
        level
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

    const LINE: u64 = 64;
    const KIB: u64 = 1024;

    /// The default profile's hierarchy: 32 KiB 8-way L1d, 256 KiB 4-way L2, 8 MiB 16-way LLC.
    fn skylake() -> CacheModel {
        CacheModel::new(&Cache::SKYLAKE_CLIENT)
    }

    /// Reads `bytes` from `base` at a 64-byte stride, one 8-byte read per line.
    fn sweep(m: &mut CacheModel, base: u64, bytes: u64) -> CacheEvents {
        (0..bytes / LINE).map(|i| m.access(base + i * LINE, 8)).fold(CacheEvents::default(), |a, b| a + b)
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
        let e = (0..512u64).map(|i| m.access(0x10_0000 + i * 8, 8)).fold(CacheEvents::default(), |a, b| a + b);
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
        m.access(0x8000, 8);
        let before = m.clone();
        m.flush(0x8010); // any byte of the line
        assert_ne!(m, before);
        assert_eq!(m.holds(0x8000), (false, false, false));
        assert_eq!(m.access(0x8000, 8), events(1, 1));
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
        let pass =
            |m: &mut CacheModel, n: u64| (0..n).map(|i| m.access(i * stride, 8)).fold(events(0, 0), |a, b| a + b);
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
        m.access(a, 8);
        // Keep `a` hot in L1d while 15 other lines fill its LLC set: L1d hits do not reach
        // the LLC, so there `a` ages to least recently used.
        for i in 1..16 {
            m.access(i * stride, 8);
            assert_eq!(m.access(a, 8), events(0, 0), "a stays in L1d");
        }
        assert!(m.holds(a).0);
        // The 17th line evicts `a` from the LLC, and inclusion takes it out of L1d too.
        assert_eq!(m.access(16 * stride, 8), events(1, 1));
        assert_eq!(m.holds(a), (false, false, false));
        assert_eq!(m.access(a, 8), events(1, 1));
    }

    #[test]
    fn inner_levels_stay_inside_the_llc() {
        let mut m = CacheModel::new(&Cache {
            line: 64,
            l1d: CacheLevel { kib: 1, ways: 2 },
            l1i: CacheLevel { kib: 1, ways: 2 },
            l2: Some(CacheLevel { kib: 2, ways: 4 }),
            llc: CacheLevel { kib: 4, ways: 4 },
        });
        // Every other access goes to one of three hot lines of LLC set 0, which L1d keeps while
        // the LLC, which does not see L1d hits, ages them out: back-invalidations happen.
        let hot = [0, 16 * LINE, 32 * LINE];
        for (i, a) in addresses(7, 20_000, 16 * KIB).into_iter().enumerate() {
            if i % 2 == 0 {
                m.access(hot[i / 2 % 3], 8);
            } else {
                m.access(a, 8);
            }
            if a % 5 == 0 {
                m.flush(a ^ 0x40);
            }
        }
        let llc: Vec<u64> = m.llc.lines.iter().copied().filter(|&l| l != EMPTY).collect();
        let l2 = m.l2.as_ref().map(|l2| l2.lines.clone()).unwrap_or_default();
        for line in m.l1d.lines.iter().chain(&l2).filter(|&&l| l != EMPTY) {
            assert!(llc.contains(line), "line {line:#x} is in an inner level but not the LLC");
        }
        // Empty ways are always at the end of their set.
        for level in [&m.l1d, m.l2.as_ref().expect("l2"), &m.llc] {
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
        assert_eq!(m.access(0x1000 + 60, 8), events(2, 2));
        assert_eq!(m.holds(0x1000), (true, true, true));
        assert_eq!(m.holds(0x1040), (true, true, true));
        // Within one line: one lookup, now a hit.
        assert_eq!(m.access(0x1000 + 56, 8), events(0, 0));
        // A 64-byte access that is not aligned touches two lines; an aligned one, one.
        assert_eq!(m.access(0x2000 + 32, 64), events(2, 2));
        assert_eq!(m.access(0x3000, 64), events(1, 1));
        // Size 0 touches nothing; the top of the address space does not overflow.
        assert_eq!(m.access(0x5000, 0), events(0, 0));
        assert_eq!(m.access(u64::MAX - 3, 8), events(1, 1));
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
                    total += m.access(a, 1 + (i % 16) as u32);
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
        d.flush_all();
        assert_eq!(d, skylake(), "flush_all leaves a cold hierarchy");
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
        });
        assert_eq!(m.line_shift, 4);
        assert_eq!(m.llc.set_mask, 255);
        assert_eq!((m.l1d.set_mask, m.l1d.ways), (0, 1));
    }
}
