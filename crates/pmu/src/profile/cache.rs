//! [`Cache`]: the data-cache hierarchy the precise backend models, and its CPUID leaf 04H
//! (deterministic cache parameters) encoding.

use super::prefetch::{Prefetchers, Streamer};

/// One level of the cache hierarchy: its size and associativity. The line size is the
/// hierarchy's ([`Cache::line`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheLevel {
    /// Size in KiB.
    pub kib: u32,
    /// Ways of associativity (lines per set).
    pub ways: u32,
}

impl CacheLevel {
    /// Size in bytes.
    pub fn bytes(&self) -> u64 {
        u64::from(self.kib) * 1024
    }

    /// Number of sets with `line`-byte lines: size / (line x ways), rounded down (a validated
    /// profile divides exactly).
    pub fn sets(&self, line: u32) -> u64 {
        let per_set = u64::from(line) * u64::from(self.ways);
        self.bytes().checked_div(per_set).unwrap_or(0)
    }
}

/// The data-cache hierarchy of a profile: L1d, an optional L2, and the last-level cache (LLC),
/// all with the same line size. L1i is described only so that CPUID leaf 04H can enumerate it;
/// the model does not cache instruction fetches.
///
/// A CPU whose second level is its last (Core 2: L1 and a shared L2) has no `l2`: its LLC is
/// level 2, and the architectural LLC events count the accesses that miss L1d.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cache {
    /// Line size in bytes (CPUID.04H:EBX[11:0] + 1).
    pub line: u32,
    /// Level-1 data cache.
    pub l1d: CacheLevel,
    /// Level-1 instruction cache (CPUID leaf 04H only; defaults to `l1d`'s geometry).
    pub l1i: CacheLevel,
    /// Level-2 unified cache, when the LLC is a third level.
    pub l2: Option<CacheLevel>,
    /// Last-level unified cache: what LLC Reference and LLC Misses (event 0x2E) count.
    pub llc: CacheLevel,
    /// The hardware data prefetchers that fill these caches, and their control register.
    pub prefetchers: Prefetchers,
}

/// CPUID.04H:EAX[4:0] cache types.
const TYPE_DATA: u32 = 1;
const TYPE_INSTRUCTION: u32 = 2;
const TYPE_UNIFIED: u32 = 3;
/// CPUID.04H:EAX[8]: self-initializing cache level (needs no software initialization).
const SELF_INITIALIZING: u32 = 1 << 8;
/// CPUID.04H:EAX[9]: fully associative cache.
const FULLY_ASSOCIATIVE: u32 = 1 << 9;
/// CPUID.04H:EDX[1]: the cache is inclusive of lower cache levels.
const INCLUSIVE: u32 = 1 << 1;

impl Cache {
    /// The hierarchy of a Skylake client core (i7-6700K): 32 KiB 8-way L1d and L1i, 256 KiB
    /// 4-way L2, 8 MiB 16-way LLC, 64-byte lines, with its four prefetchers and
    /// MSR_MISC_FEATURE_CONTROL (as `resources/profiles/skylake.toml` has them). What a profile
    /// without `[cache]` gets.
    pub const SKYLAKE_CLIENT: Cache = Cache {
        line: 64,
        l1d: CacheLevel { kib: 32, ways: 8 },
        l1i: CacheLevel { kib: 32, ways: 8 },
        l2: Some(CacheLevel { kib: 256, ways: 4 }),
        llc: CacheLevel { kib: 8192, ways: 16 },
        prefetchers: Prefetchers {
            dcu: true,
            ip_stride: true,
            streamer: Some(Streamer { distance: 20, pages: 32 }),
            adjacent_line: true,
            misc_feature_control: Some(0x80F),
            misc_enable: false,
        },
    };

    /// The cache level of the LLC: 3 with an L2, else 2.
    pub fn llc_level(&self) -> u8 {
        if self.l2.is_some() {
            3
        } else {
            2
        }
    }

    /// The data caches from the core outward, with their level: L1d, L2 (if any), LLC.
    pub fn data_levels(&self) -> Vec<(u8, CacheLevel)> {
        let mut levels = vec![(1, self.l1d)];
        levels.extend(self.l2.map(|l2| (2, l2)));
        levels.push((self.llc_level(), self.llc));
        levels
    }

    /// CPUID leaf 04H as the guest sees it: `[eax, ebx, ecx, edx]` of sub-leaf 0, 1, ... in
    /// order (L1d, L1i, L2 if any, LLC), then the null sub-leaf (cache type 0) that ends the
    /// enumeration (SDM Vol. 2A CPUID, "Deterministic Cache Parameters Leaf").
    ///
    /// Fields emon fills in:
    /// - EAX: type, level, self-initializing, fully associative (one set); EAX[25:14] and
    ///   EAX[31:26] (logical processors sharing the cache, cores per package, each minus 1) are
    ///   0: emon's VM has one vCPU.
    /// - EBX: line size - 1, one physical line partition, ways - 1. ECX: sets - 1.
    /// - EDX: only bit 1 on the LLC, which the model keeps inclusive of L1d and L2. Bit 2
    ///   (complex indexing) stays clear: the model indexes a set with the line address's low
    ///   bits.
    pub fn leaf_04(&self) -> Vec<[u32; 4]> {
        let mut leaves = vec![self.subleaf(TYPE_DATA, 1, self.l1d, 0), self.subleaf(TYPE_INSTRUCTION, 1, self.l1i, 0)];
        leaves.extend(self.l2.map(|l2| self.subleaf(TYPE_UNIFIED, 2, l2, 0)));
        leaves.push(self.subleaf(TYPE_UNIFIED, self.llc_level(), self.llc, INCLUSIVE));
        leaves.push([0; 4]);
        leaves
    }

    fn subleaf(&self, cache_type: u32, level: u8, c: CacheLevel, edx: u32) -> [u32; 4] {
        let sets = c.sets(self.line);
        let fully = if sets == 1 { FULLY_ASSOCIATIVE } else { 0 };
        let eax = cache_type | u32::from(level) << 5 | SELF_INITIALIZING | fully;
        // A validated profile keeps every field in range; the masks only keep an unvalidated
        // one from spilling into the next field.
        let ebx = (self.line.wrapping_sub(1) & 0xFFF) | (c.ways.wrapping_sub(1) & 0x3FF) << 22;
        let ecx = u32::try_from(sets.saturating_sub(1)).unwrap_or(u32::MAX);
        [eax, ebx, ecx, edx]
    }
}

impl Default for Cache {
    fn default() -> Self {
        Cache::SKYLAKE_CLIENT
    }
}
