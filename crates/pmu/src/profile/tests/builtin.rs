//! Every built-in profile loads, validates, and encodes its documented registers.

use super::super::{describe_leaf_0a, Cache, CacheLevel, Clock, PmuProfile, Prefetchers, Profile, Streamer};

/// (name, CPUID.01H:EAX, CPUID.0AH [eax, ebx, ecx, edx], IA32_PERF_CAPABILITIES).
const EXPECTED: &[(&str, u32, [u32; 4], u64)] = &[
    ("core2", 0x0001_067A, [0x0728_0202, 0, 0, 0x0503], 0x10C2),
    ("icelake", 0x0007_06E5, [0x0830_0805, 0, 0xF, 0x0604], 0xF4C5),
    ("nehalem", 0x0001_06A5, [0x0730_0403, 0, 0, 0x0603], 0x11C3),
    ("nehalem-llc-masked", 0x0001_06A5, [0x0730_0403, 0x18, 0, 0x0603], 0x11C3),
    ("no-pmu", 0x0005_06E3, [0, 0, 0, 0], 0),
    ("pentium4", 0x0000_0F43, [0, 0, 0, 0], 0),
    ("sandybridge", 0x0002_06A7, [0x0730_0403, 0, 0, 0x0603], 0x31C3),
    ("skylake", 0x0005_06E3, [0x0730_0404, 0, 0, 0x0603], 0x33C5),
];

/// (name, [l1d, l1i], l2, llc as (KiB, ways), CPUID.15H [eax, ebx, ecx, edx] or None, TSC ticks
/// per reference tick as numerator/denominator). Every profile has 64-byte lines.
type CacheClock = (&'static str, [(u32, u32); 2], Option<(u32, u32)>, (u32, u32), Option<[u32; 4]>, (u32, u32));

const CACHE_CLOCK: &[CacheClock] = &[
    ("core2", [(32, 8), (32, 8)], None, (6144, 24), None, (9, 1)),
    ("icelake", [(48, 12), (32, 8)], Some((512, 8)), (8192, 16), Some([2, 78, 38_400_000, 0]), (78, 2)),
    ("nehalem", [(32, 8), (32, 4)], Some((256, 8)), (8192, 16), None, (20, 1)),
    ("nehalem-llc-masked", [(32, 8), (32, 4)], Some((256, 8)), (8192, 16), None, (20, 1)),
    ("no-pmu", [(32, 8), (32, 8)], Some((256, 4)), (8192, 16), Some([2, 334, 0, 0]), (334, 2)),
    ("pentium4", [(16, 8), (16, 8)], None, (2048, 8), None, (1, 1)),
    ("sandybridge", [(32, 8), (32, 8)], Some((256, 8)), (6144, 12), None, (20, 1)),
    ("skylake", [(32, 8), (32, 8)], Some((256, 4)), (8192, 16), Some([2, 334, 0, 0]), (334, 2)),
];

#[test]
fn builtin_names_are_sorted_and_complete() {
    let names = Profile::builtin_names();
    let expected: Vec<&str> = EXPECTED.iter().map(|(name, ..)| *name).collect();
    assert_eq!(names, expected);
    assert!(names.contains(&Profile::DEFAULT));
}

#[test]
fn every_builtin_loads_validates_and_matches_its_documented_registers() {
    for &(name, leaf1, leaf_0a, caps) in EXPECTED {
        let p = Profile::load(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(p.name, name);
        p.validate().unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(p.leaf1_eax(), leaf1, "{name} CPUID.01H:EAX");
        assert_eq!(p.pmu.leaf_0a(), leaf_0a, "{name} CPUID.0AH");
        assert_eq!(p.pmu.perf_capabilities, caps, "{name} IA32_PERF_CAPABILITIES");
        assert_eq!(p.vendor, "GenuineIntel");
        assert_eq!(p.vendor_regs(), [0x756E_6547, 0x4965_6E69, 0x6C65_746E]);
        assert!(!p.description.is_empty());
        assert_eq!(p.pmu.misc_enable_perfmon, p.pmu.version > 0 || p.pmu.netburst(), "{name}");
        // Only Sandy Bridge's revision changes what a guest does (Linux's PEBS erratum check).
        let microcode = if name == "sandybridge" { Some(0x28) } else { None };
        assert_eq!(p.microcode, microcode, "{name} IA32_BIOS_SIGN_ID revision");
    }
}

/// (name, [dcu, ip-stride, adjacent-line], streamer (distance, pages), MSR_MISC_FEATURE_CONTROL's
/// writable bits, IA32_MISC_ENABLE control): each file's `[cache.prefetchers]` as its comments
/// source it.
type PrefetchRow = (&'static str, [bool; 3], Option<(u32, u32)>, Option<u64>, bool);

const PREFETCHERS: &[PrefetchRow] = &[
    ("core2", [true; 3], Some((8, 16)), None, true),
    ("icelake", [true; 3], Some((20, 32)), Some(0x80F), false),
    ("nehalem", [true; 3], Some((8, 16)), Some(0xF), false),
    ("nehalem-llc-masked", [true; 3], Some((8, 16)), Some(0xF), false),
    ("no-pmu", [true; 3], Some((20, 32)), Some(0x80F), false),
    ("pentium4", [false, false, true], Some((2, 8)), None, true),
    ("sandybridge", [true; 3], Some((20, 32)), Some(0x80F), false),
    ("skylake", [true; 3], Some((20, 32)), Some(0x80F), false),
];

#[test]
fn every_builtin_has_its_documented_caches_and_clock() {
    let level = |(kib, ways): (u32, u32)| CacheLevel { kib, ways };
    let names: Vec<&str> = CACHE_CLOCK.iter().map(|(name, ..)| *name).collect();
    assert_eq!(names, Profile::builtin_names());
    for (&(name, [l1d, l1i], l2, llc, leaf_15h, (numerator, denominator)), prefetch) in
        CACHE_CLOCK.iter().zip(PREFETCHERS)
    {
        let p = Profile::load(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        let &(prefetch_name, [dcu, ip_stride, adjacent_line], streamer, misc_feature_control, misc_enable) = prefetch;
        assert_eq!(prefetch_name, name);
        let prefetchers = Prefetchers {
            dcu,
            ip_stride,
            streamer: streamer.map(|(distance, pages)| Streamer { distance, pages }),
            adjacent_line,
            misc_feature_control,
            misc_enable,
        };
        let cache =
            Cache { line: 64, l1d: level(l1d), l1i: level(l1i), l2: l2.map(level), llc: level(llc), prefetchers };
        assert_eq!(p.cache, cache, "{name} [cache]");
        assert_eq!(p.clock.leaf_15h(), leaf_15h, "{name} CPUID.15H");
        assert_eq!(
            (p.clock.tsc_per_ref_numerator, p.clock.tsc_per_ref_denominator),
            (numerator, denominator),
            "{name}"
        );
    }
    // CPUID.16H, where the real part has it: the VirtualBox database's i7-6700K (also no-pmu's
    // identity) and the Bochs model's i7-1065G7 (base, maximum and bus frequencies in MHz).
    for name in Profile::builtin_names() {
        let leaf_16h = match name {
            "skylake" | "no-pmu" => Some([4000, 4200, 100, 0]),
            "icelake" => Some([1500, 3900, 100, 0]),
            _ => None,
        };
        let p = Profile::load(name).expect("built-in");
        assert_eq!(p.clock.frequency_mhz.map(|f| f.leaf_16h()), leaf_16h, "{name} CPUID.16H");
    }
    // The default profile's hierarchy is the documented default.
    assert_eq!(Profile::load(Profile::DEFAULT).map(|p| p.cache).ok(), Some(Cache::SKYLAKE_CLIENT));
    assert_ne!(Profile::load("nehalem").map(|p| p.clock).ok(), Some(Clock::TSC));
}

#[test]
fn full_width_writes_start_with_sandy_bridge() {
    let fw = |name: &str| Profile::load(name).map(|p| p.pmu.fw_write()).ok();
    assert_eq!(fw("core2"), Some(false));
    assert_eq!(fw("nehalem"), Some(false));
    assert_eq!(fw("sandybridge"), Some(true));
    assert_eq!(fw("skylake"), Some(true));
    assert_eq!(fw("icelake"), Some(true));
    assert_eq!(fw("no-pmu"), Some(false));
}

#[test]
fn icelake_has_four_fixed_counters_and_eight_events() {
    let p = Profile::load("icelake").map(|p| p.pmu).ok();
    let p: PmuProfile = p.expect("icelake loads");
    assert_eq!(p.fixed_msr_count(), 4);
    assert!((0..4).all(|i| p.fixed_supported(i)));
    assert!((0..8).all(|bit| p.arch_event_available(bit)));
}

#[test]
fn pentium4_is_netburst_without_architectural_perfmon() {
    let p = Profile::load("pentium4").expect("pentium4 loads");
    assert!(p.pmu.netburst());
    assert_eq!((p.family, p.pmu.version), (0xF, 0));
    assert!(p.pmu.misc_enable_perfmon);
    assert!(!p.pmu.pdcm());
    // NetBurst only in family 0xF, and never with a CPUID.0AH version.
    let text = include_str!("../../../../../resources/profiles/pentium4.toml");
    let e = Profile::from_toml("x.toml", &text.replace("family = 0xF", "family = 6")).unwrap_err().to_string();
    assert!(e.contains("family 0xF"), "{e}");
    let e = Profile::from_toml(
        "x.toml",
        &text.replace("version = 0", "version = 2\ngp = 2\ngp-width = 40\nebx-length = 7"),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("must be 0 when pmu.kind"), "{e}");
    let e =
        Profile::from_toml("x.toml", &text.replace("kind = \"netburst\"", "kind = \"p6\"")).unwrap_err().to_string();
    assert!(e.contains("kind"), "{e}");
}

#[test]
fn no_pmu_is_version_0_without_pdcm() {
    let p = Profile::load("no-pmu").expect("no-pmu loads").pmu;
    assert_eq!(p.version, 0);
    assert!(!p.pdcm());
    assert!(!p.misc_enable_perfmon);
    assert_eq!(p.fixed_msr_count(), 0);
    assert!((0..8).all(|bit| !p.arch_event_available(bit)));
}

#[test]
fn describe_decodes_leaf_0a() {
    let nehalem = Profile::load("nehalem-llc-masked").expect("loads").pmu;
    let lines = describe_leaf_0a(&nehalem);
    let text = lines.join("\n");
    assert!(text.contains("EAX=0x07300403"), "{text}");
    assert!(text.contains("version 3"), "{text}");
    assert!(text.contains("4 general-purpose counters x 48 bits"), "{text}");
    assert!(text.contains("3 fixed-function counters x 48 bits"), "{text}");
    assert!(text.contains("EBX length 7"), "{text}");
    let llc = lines.iter().find(|l| l.contains("LLC Misses")).expect("LLC line");
    assert!(llc.contains("unavailable"), "{llc}");
    let slots = lines.iter().find(|l| l.contains("Topdown Slots")).expect("slots line");
    assert!(slots.contains("not enumerated"), "{slots}");

    let icelake = Profile::load("icelake").expect("loads").pmu;
    let text = describe_leaf_0a(&icelake).join("\n");
    assert!(text.contains("ECX bitmap=0b1111"), "{text}");
    assert!(text.contains("FW_WRITE yes"), "{text}");

    let p4 = Profile::load("pentium4").expect("loads").pmu;
    let text = describe_leaf_0a(&p4).join("\n");
    assert!(text.contains("NetBurst PMU: 18 counters x 40 bits"), "{text}");
    assert!(text.contains("MSR_IQ_COUNTER4 (0x310)"), "{text}");
    assert!(text.contains("MSR_CRU_ESCR0 (0x3B8)"), "{text}");
    assert!(text.contains("IA32_MISC_ENABLE[7] performance monitoring available: yes"), "{text}");

    let none = Profile::load("no-pmu").expect("loads").pmu;
    let text = describe_leaf_0a(&none).join("\n");
    assert!(text.contains("no architectural performance monitoring"), "{text}");
    assert!(text.contains("PDCM = 0"), "{text}");
}
