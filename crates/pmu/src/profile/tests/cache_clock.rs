//! The `[cache]` and `[clock]` tables: parsing, defaults, validation, CPUID leaves 04H, 15H and 16H.

use super::super::{Cache, CacheLevel, Clock, FrequencyMhz, PrefetcherSet, Prefetchers, Profile, Streamer};
use super::{assert_mentions, err, error_of, sample};

/// A minimal valid profile text, to which a test appends `[cache]` / `[clock]` tables.
const BASE: &str = "description = \"d\"\nvendor = \"GenuineIntel\"\nfamily = 6\nmodel = 0x5E\nstepping = 3\n\
                    [pmu]\nversion = 0\n";

fn parse(tables: &str) -> Result<Profile, super::super::ProfileError> {
    Profile::from_toml("x.toml", &format!("{BASE}{tables}"))
}

/// The sample profile with `f` applied to its cache.
fn with_cache(f: impl FnOnce(&mut Cache)) -> Profile {
    let mut p = sample();
    f(&mut p.cache);
    p
}

/// The sample profile with `f` applied to its clock.
fn with_clock(f: impl FnOnce(&mut Clock)) -> Profile {
    let mut p = sample();
    f(&mut p.clock);
    p
}

#[test]
fn a_file_without_the_tables_gets_skylake_client_caches_and_the_tsc_clock() {
    let p = parse("").expect("loads");
    assert_eq!(p.cache, Cache::SKYLAKE_CLIENT);
    assert_eq!(p.cache, Cache::default());
    assert_eq!(p.clock, Clock::TSC);
    assert_eq!(p.clock, Clock::default());
    assert_eq!((p.clock.tsc_per_ref_numerator, p.clock.tsc_per_ref_denominator), (1, 1));
    assert!(!p.clock.leaf_15h);
    assert_eq!(p.clock.leaf_15h(), None);
}

#[test]
fn tables_parse_with_their_defaults() {
    let p = parse(
        "[cache]\nl1d = { kib = 48, ways = 12 }\nllc = { kib = 6144, ways = 24 }\n\
         [clock]\ntsc-per-ref = [9, 1]\n",
    )
    .expect("loads");
    assert_eq!(p.cache.line, 64, "line defaults to 64");
    assert_eq!(p.cache.l1d, CacheLevel { kib: 48, ways: 12 });
    assert_eq!(p.cache.l1i, p.cache.l1d, "l1i defaults to l1d");
    assert_eq!(p.cache.l2, None);
    assert_eq!(p.cache.llc, CacheLevel { kib: 6144, ways: 24 });
    assert_eq!(
        p.clock,
        Clock {
            tsc_per_ref_numerator: 9,
            tsc_per_ref_denominator: 1,
            leaf_15h: false,
            crystal_hz: 0,
            frequency_mhz: None
        }
    );

    let p = parse(
        "[cache]\nline = 128\nl1d = { kib = 32, ways = 8 }\nl1i = { kib = 32, ways = 4 }\n\
         l2 = { kib = 1024, ways = 16 }\nllc = { kib = 32768, ways = 16 }\n\
         [clock]\ntsc-per-ref = [78, 2]\nleaf-15h = true\ncrystal-hz = 38400000\n",
    )
    .expect("loads");
    assert_eq!(p.cache.line, 128);
    assert_eq!(p.cache.l1i, CacheLevel { kib: 32, ways: 4 });
    assert_eq!(p.cache.l2, Some(CacheLevel { kib: 1024, ways: 16 }));
    assert_eq!(p.clock.leaf_15h(), Some([2, 78, 38_400_000, 0]));
    assert_eq!(p.clock.frequency_mhz, None, "no leaf 16H without frequency-mhz");

    let p = parse(
        "[clock]\ntsc-per-ref = [334, 2]\nleaf-15h = true\nfrequency-mhz = { base = 4000, max = 4200, bus = 100 }\n",
    )
    .expect("loads");
    assert_eq!(p.clock.frequency_mhz, Some(FrequencyMhz { base: 4000, max: 4200, bus: 100 }));
    assert_eq!(p.clock.frequency_mhz.map(|f| f.leaf_16h()), Some([4000, 4200, 100, 0]));
}

#[test]
fn unknown_and_missing_keys_in_the_tables_are_rejected() {
    let e = err(parse("[cache]\nl1d = { kib = 32, ways = 8 }\nllc = { kib = 8192, ways = 16 }\nl3 = 1\n"));
    assert_mentions(&e.to_string(), &["x.toml: ", "unknown field", "l3"]);
    let e = err(parse("[cache]\nl1d = { kib = 32, ways = 8, sets = 64 }\nllc = { kib = 8192, ways = 16 }\n"));
    assert_mentions(&e.to_string(), &["unknown field", "sets"]);
    let e = err(parse("[cache]\nl1d = { kib = 32, ways = 8 }\n"));
    assert_mentions(&e.to_string(), &["missing field", "llc"]);
    let e = err(parse("[clock]\nleaf-15h = true\n"));
    assert_mentions(&e.to_string(), &["missing field", "tsc-per-ref"]);
    let e = err(parse("[clock]\ntsc-per-ref = [1, 2, 3]\n"));
    assert_mentions(&e.to_string(), &["x.toml: line 9", "tsc-per-ref"]);
    let e = err(parse("[clock]\ntsc-per-ref = [1]\nturbo = true\n"));
    assert!(!e.to_string().contains('\n'), "{e}");
}

#[test]
fn cache_line_is_a_power_of_two_from_16_to_4096() {
    for line in [0, 48, 8, 8192] {
        let e = error_of(&with_cache(|c| c.line = line));
        assert_mentions(&e, &["skylake: ", &format!("cache.line = {line}: "), "power of two", "CPUID.04H:EBX[11:0]"]);
    }
    for line in [16, 32, 128] {
        with_cache(|c| c.line = line).validate().unwrap_or_else(|e| panic!("line {line}: {e}"));
    }
}

#[test]
fn cache_ways_1_to_1024() {
    let e = error_of(&with_cache(|c| c.l1d.ways = 0));
    assert_eq!(
        e,
        "skylake: cache.l1d.ways = 0: ways of associativity must be 1..=1024 (CPUID.04H:EBX[31:22] holds ways - 1)"
    );
    let e = error_of(&with_cache(|c| c.llc.ways = 2048));
    assert_mentions(&e, &["cache.llc.ways = 2048", "1..=1024"]);
    let e = error_of(&with_cache(|c| c.l1i.ways = 0));
    assert_mentions(&e, &["cache.l1i.ways = 0"]);
}

#[test]
fn cache_size_1_kib_to_1_gib() {
    let e = error_of(&with_cache(|c| c.l1d.kib = 0));
    assert_mentions(&e, &["cache.l1d.kib = 0", "1..=1048576 KiB"]);
    let e = error_of(&with_cache(|c| c.llc.kib = (1 << 20) * 2));
    assert_mentions(&e, &["cache.llc.kib = 2097152", "1 GiB"]);
}

#[test]
fn sets_must_be_a_whole_power_of_two() {
    // 48 KiB / (64 x 8) = 96 sets.
    let e = error_of(&with_cache(|c| c.l1d = CacheLevel { kib: 48, ways: 8 }));
    assert_mentions(&e, &["cache.l1d = { kib = 48, ways = 8 }", "= 96 sets", "whole power of two"]);
    // 1 KiB / (64 x 24) is not whole.
    let e = error_of(&with_cache(|c| c.l1i = CacheLevel { kib: 1, ways: 24 }));
    assert_mentions(&e, &["cache.l1i = { kib = 1, ways = 24 }", "not a whole number of sets of 24 64-byte lines"]);
    // 48 KiB 12-way and 6 MiB 24-way are whole powers of two (64 and 4096 sets).
    with_cache(|c| c.l1d = CacheLevel { kib: 48, ways: 12 }).validate().expect("Ice Lake L1d");
    with_cache(|c| c.llc = CacheLevel { kib: 6144, ways: 24 }).validate().expect("Penryn L2");
    // One set: fully associative.
    with_cache(|c| c.l1d = CacheLevel { kib: 1, ways: 16 }).validate().expect("1 set");
}

#[test]
fn levels_do_not_shrink_outward() {
    let e = error_of(&with_cache(|c| c.l2 = Some(CacheLevel { kib: 16, ways: 4 })));
    assert_mentions(&e, &["cache.l2.kib = 16", "cache.l1d.kib = 32", "inclusive"]);
    let e = error_of(&with_cache(|c| c.llc = CacheLevel { kib: 128, ways: 16 }));
    assert_mentions(&e, &["cache.llc.kib = 128", "cache.l2.kib = 256"]);
    let e = error_of(&with_cache(|c| {
        c.l2 = None;
        c.llc = CacheLevel { kib: 16, ways: 4 };
    }));
    assert_mentions(&e, &["cache.llc.kib = 16", "cache.l1d.kib = 32"]);
    // Equal sizes are allowed, and L1i may be larger than L2 (it is not part of the model).
    with_cache(|c| c.l2 = Some(CacheLevel { kib: 32, ways: 8 })).validate().expect("L2 = L1d");
    with_cache(|c| c.l1i = CacheLevel { kib: 512, ways: 8 }).validate().expect("large L1i");
}

#[test]
fn clock_ratio_is_non_zero() {
    for (n, d) in [(0, 1), (1, 0), (0, 0)] {
        let e = error_of(&with_clock(|c| {
            c.tsc_per_ref_numerator = n;
            c.tsc_per_ref_denominator = d;
        }));
        assert_mentions(&e, &[&format!("clock.tsc-per-ref = [{n}, {d}]: "), "non-zero", "CPUID.15H:EBX and EAX"]);
    }
}

#[test]
fn crystal_frequency_needs_leaf_15h() {
    let e = error_of(&with_clock(|c| {
        c.leaf_15h = false;
        c.crystal_hz = 24_000_000;
    }));
    assert_mentions(&e, &["clock.crystal-hz = 24000000", "clock.leaf-15h = false", "CPUID.15H:ECX"]);
    with_clock(|c| c.crystal_hz = 24_000_000).validate().expect("skylake has leaf 15H");
}

#[test]
fn leaf_16h_has_a_base_frequency_at_most_its_maximum() {
    let with = |base, max| with_clock(|c| c.frequency_mhz = Some(FrequencyMhz { base, max, bus: 100 }));
    with(4000, 4200).validate().expect("the i7-6700K's");
    with(4000, 4000).validate().expect("no turbo");
    for (base, max) in [(0, 4200), (4300, 4200)] {
        let e = error_of(&with(base, max));
        assert_mentions(
            &e,
            &[&format!("clock.frequency-mhz = {{ base = {base}, max = {max}, bus = 100 }}"), "CPUID.16H"],
        );
    }
    let e = err(parse("[clock]\ntsc-per-ref = [1, 1]\nfrequency-mhz = { base = 70000, max = 70000, bus = 100 }\n"));
    assert_mentions(&e.to_string(), &["x.toml: ", "frequency-mhz"]);
    let e = err(parse("[clock]\ntsc-per-ref = [1, 1]\nfrequency-mhz = { base = 1000, max = 1000 }\n"));
    assert_mentions(&e.to_string(), &["x.toml: ", "bus"]);
}

#[test]
fn leaf_04_encodes_the_skylake_client_hierarchy_as_the_i7_6700k_reports_it() {
    // CPUID.04H of a real i7-6700K (VirtualBox CPU database), with the fields emon sets
    // differently masked: EAX[31:14] (sharing/cores: emon's VM has one vCPU) and EDX bit 2
    // (complex indexing: the model indexes sets directly).
    let real: [[u32; 4]; 5] = [
        [0x1C00_4121, 0x01C0_003F, 0x0000_003F, 0],
        [0x1C00_4122, 0x01C0_003F, 0x0000_003F, 0],
        [0x1C00_4143, 0x00C0_003F, 0x0000_03FF, 0],
        [0x1C03_C163, 0x03C0_003F, 0x0000_1FFF, 6],
        [0, 0, 0, 0],
    ];
    let leaves = Cache::SKYLAKE_CLIENT.leaf_04();
    assert_eq!(leaves.len(), real.len());
    for (i, (ours, real)) in leaves.iter().zip(real).enumerate() {
        assert_eq!(ours[0], real[0] & 0x3FFF, "sub-leaf {i} EAX");
        assert_eq!(ours[1], real[1], "sub-leaf {i} EBX");
        assert_eq!(ours[2], real[2], "sub-leaf {i} ECX");
        assert_eq!(ours[3], real[3] & !4, "sub-leaf {i} EDX");
    }
}

#[test]
fn leaf_04_without_l2_puts_the_llc_at_level_2() {
    let core2 = Cache {
        line: 64,
        l1d: CacheLevel { kib: 32, ways: 8 },
        l1i: CacheLevel { kib: 32, ways: 8 },
        l2: None,
        llc: CacheLevel { kib: 6144, ways: 24 },
        prefetchers: Default::default(),
    };
    assert_eq!(core2.llc_level(), 2);
    let leaves = core2.leaf_04();
    assert_eq!(leaves.len(), 4);
    // The Xeon X5482's (Penryn) L2 sub-leaf: unified, level 2, 24 ways, 4096 sets.
    assert_eq!(leaves[2], [0x0000_0143, 0x05C0_003F, 0x0000_0FFF, 2]);
    assert_eq!(leaves[3], [0; 4]);
    assert_eq!(core2.data_levels(), vec![(1, core2.l1d), (2, core2.llc)]);
    assert_eq!(Cache::SKYLAKE_CLIENT.data_levels().iter().map(|(level, _)| *level).collect::<Vec<_>>(), [1, 2, 3]);
}

#[test]
fn leaf_04_marks_a_single_set_fully_associative() {
    let c = Cache { l1d: CacheLevel { kib: 1, ways: 16 }, ..Cache::SKYLAKE_CLIENT };
    let l1d = c.leaf_04()[0];
    assert_eq!(l1d[0] & (1 << 9), 1 << 9, "EAX[9] fully associative");
    assert_eq!(l1d[2], 0, "one set");
    assert_eq!(Cache::SKYLAKE_CLIENT.leaf_04()[0][0] & (1 << 9), 0);
}

#[test]
fn cache_level_size_and_sets() {
    let l = CacheLevel { kib: 6144, ways: 24 };
    assert_eq!(l.bytes(), 6 << 20);
    assert_eq!(l.sets(64), 4096);
    assert_eq!(CacheLevel { kib: 32, ways: 0 }.sets(64), 0, "no division by zero");
}

#[test]
fn reference_ticks_follow_the_ratio_without_losing_remainders() {
    let skylake = Clock {
        tsc_per_ref_numerator: 334,
        tsc_per_ref_denominator: 2,
        leaf_15h: true,
        crystal_hz: 0,
        frequency_mhz: Some(FrequencyMhz { base: 4000, max: 4200, bus: 100 }),
    };
    assert_eq!(skylake.ref_ticks_at(0), 0);
    assert_eq!(skylake.ref_ticks_at(166), 0);
    assert_eq!(skylake.ref_ticks_at(167), 1);
    assert_eq!(skylake.ref_ticks_at(167 * 1000 + 5), 1000);
    // Intervals of 100 TSC ticks: each one's share is a difference, and they sum exactly.
    let total: u64 = (0..1000u64).map(|i| skylake.ref_ticks_at((i + 1) * 100) - skylake.ref_ticks_at(i * 100)).sum();
    assert_eq!(total, skylake.ref_ticks_at(100_000));
    assert_eq!(total, 100_000 / 167);
    assert_eq!(Clock::TSC.ref_ticks_at(u64::MAX), u64::MAX);
    let nehalem = Clock { tsc_per_ref_numerator: 20, ..Clock::TSC };
    assert_eq!(nehalem.ref_ticks_at(2_667_000_000), 133_350_000);
    let unvalidated = Clock { tsc_per_ref_numerator: 0, ..Clock::TSC };
    assert_eq!(unvalidated.ref_ticks_at(1000), 0);
    // Either side of where TSC x denominator stops fitting in 64 bits, the same floor.
    let wide = Clock { tsc_per_ref_numerator: 3, tsc_per_ref_denominator: 2, ..Clock::TSC };
    let edge = u64::MAX / 2;
    for tsc in [edge - 1, edge, edge + 1, edge + 2, u64::MAX] {
        assert_eq!(u128::from(wide.ref_ticks_at(tsc)), u128::from(tsc) * 2 / 3, "at {tsc:#x}");
    }
}

#[test]
fn the_prefetchers_table_parses_and_defaults_to_none() {
    let geometry = "[cache]\nl1d = { kib = 32, ways = 8 }\nllc = { kib = 8192, ways = 16 }\n";
    let p = parse(geometry).expect("loads");
    assert_eq!(p.cache.prefetchers, Prefetchers::default(), "a [cache] without the table: none");
    assert!(p.cache.prefetchers.present().is_empty());
    let p = parse(&format!(
        "{geometry}[cache.prefetchers]\ndcu = true\nstreamer = {{ distance = 20, pages = 32 }}\nmisc-feature-control = 0x80F\n"
    ))
    .expect("loads");
    let want = Prefetchers {
        dcu: true,
        streamer: Some(Streamer { distance: 20, pages: 32 }),
        misc_feature_control: Some(0x80F),
        ..Prefetchers::default()
    };
    assert_eq!(p.cache.prefetchers, want);
    assert_eq!(p.cache.prefetchers.present(), PrefetcherSet::DCU.union(PrefetcherSet::STREAMER));
    let e = err(parse(&format!("{geometry}[cache.prefetchers]\nl3 = true\n")));
    assert_mentions(&e.to_string(), &["x.toml: ", "unknown field", "l3"]);
}

#[test]
fn prefetcher_rules() {
    let streamer = |distance, pages| with_cache(|c| c.prefetchers.streamer = Some(Streamer { distance, pages }));
    let e = error_of(&streamer(0, 32));
    assert_mentions(&e, &["skylake: cache.prefetchers.streamer.distance = 0: must be 1..=63", "4 KiB page"]);
    let e = error_of(&streamer(64, 32));
    assert_mentions(&e, &["streamer.distance = 64"]);
    let e = error_of(&streamer(20, 0));
    assert_mentions(&e, &["cache.prefetchers.streamer.pages = 0: must be 1..=64"]);
    streamer(63, 64).validate().expect("the largest");
    // 1 KiB lines: 4 to a page, so the streamer reaches 3 ahead at most.
    let e = error_of(&with_cache(|c| {
        c.line = 1024;
        c.l1d = CacheLevel { kib: 32, ways: 8 };
    }));
    assert_mentions(&e, &["streamer.distance = 20: must be 1..=3"]);
    let e = error_of(&with_cache(|c| c.prefetchers.misc_enable = true));
    assert_mentions(&e, &["cache.prefetchers.misc-enable = true", "not both"]);
    let e = error_of(&with_cache(|c| c.prefetchers.misc_feature_control = Some(0x807)));
    assert_mentions(&e, &["misc-feature-control = 0x807: must hold bit 3", "ip-stride"]);
    // A control register with nothing to control is allowed; so is a CPU with none.
    with_cache(|c| c.prefetchers = Prefetchers { misc_feature_control: Some(0), ..Prefetchers::default() })
        .validate()
        .expect("no prefetchers, an MSR");
    with_cache(|c| c.prefetchers.misc_feature_control = None).validate().expect("no control register");
}
