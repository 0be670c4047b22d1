//! Model-specific events: every event of the CPU's list that emon counts exactly, on every counter the list gives it, over a known instruction mix (exact values), and the cache-model events over an access pattern (the model's values).
//!
//! The events and their encodings come from the CPU's list (`emon_guest::events`, generated from
//! Intel's lists as Linux 6.1 ships them), found by CPUID's family and model; the expectations
//! below are by event name (README, "Model-specific events").
//!
//! The instruction mix ([`run_mix`]) retires 51 instructions (the 4 that stop the counter
//! included): 14 that load (POP, MOV, a read-modify-write ADD, LOCK ADD, XCHG, CMOVZ, a load that
//! splits across a cache line, PREFETCHT0, two RETs, IRETQ, LODSB, MOVSB, CMPSB), 15 that store
//! (PUSH, MOV, the ADD, LOCK ADD and XCHG, a store that splits, two CALLs, the five PUSHes of the
//! IRETQ frame, MOVSB, STOSB), two locked ones, two NOPs, a PAUSE, and 12 branches: a direct and
//! an indirect near CALL, two RETs, a direct and an indirect JMP, five conditional branches (a
//! forward JZ taken, a forward JNZ not taken, a backward JNZ taken twice and not taken once) and
//! an IRETQ to the same privilege level (a far branch). The static predictor (README, "The
//! precise backend") mispredicts the forward JZ and the last backward JNZ.
//!
//! The floating-point mix ([`run_fp`]) retires, besides its stop, two scalar single-precision
//! computations (ADDSS, MULSS), four scalar double (ADDSD, DIVSD, SQRTSD, and ADDSD from memory),
//! three packed single (ADDPS, MINPS, MAXPS) and one packed double (SUBPD), all SSE: on a host
//! whose KVM cannot run SSE at CPL0, emon's TCG engine runs or completes them, counting each as
//! any other instruction (README, "Writing a guest").
//!
//! The access pattern ([`run_pattern`]) reads W + 1 cold lines that share an L1d set (W: the L1d's
//! ways, from CPUID leaf 4), reads the first again (evicted from L1d: an L2 hit, or an LLC hit
//! where the LLC is the second level) and the last again (an L1d hit), stores to two cold lines,
//! adds to one of them (an L1d hit), and reads 8 bytes across two cold lines. It runs with the
//! hardware prefetchers turned off (MSR_MISC_FEATURE_CONTROL, or Core 2's IA32_MISC_ENABLE bits):
//! its values are those of the lines it asks for, which the prefetchers would fetch before it
//! does (README, "The cache model").
//!
//! Arguments: `misplaced=1` programs an event on a counter its list does not give it, and
//! `uncounted=1` an event emon does not count: each must read 0 (the run summary says NOT EXACT,
//! which tests/model_events.rs checks).
#![no_std]
#![no_main]

use core::arch::asm;
use emon_guest::cpu::{cpuid, rdmsr, wrmsr};
use emon_guest::events::{Event, List, LISTS};
use emon_guest::pmu::*;
use emon_guest::prefetch::{Control, ALL};
use emon_guest::{check, dec, println, skip};

emon_guest::entry!(main);

/// The mix's buffer, the floating-point mix's and the pattern's, in RAM emon's default 64 MiB
/// guest has.
const MIX_BUF: u64 = 0x0100_0000;
const FP_BUF: u64 = 0x0108_0000;
const PATTERN_BUF: u64 = 0x0110_0000;

/// Instructions the mix retires, the stop included.
const MIX_INSTRUCTIONS: u64 = 51;

/// PERFEVTSELx for `e`: EN, OS and USR, with its CMASK/INV/EDGE.
fn evtsel(e: &Event) -> u64 {
    PERFEVTSEL_EN
        | PERFEVTSEL_OS
        | PERFEVTSEL_USR
        | u64::from(e.select)
        | u64::from(e.umask) << 8
        | u64::from(e.edge) << 18
        | u64::from(e.inv) << 23
        | u64::from(e.cmask) << 24
}

/// Counts `run` on IA32_PMCi programmed with `sel`, started and stopped by IA32_PERF_GLOBAL_CTRL
/// writes inside `run` (its argument is the GLOBAL_CTRL value that starts the counter).
fn count(i: u8, sel: u64, run: impl FnOnce(u64)) -> u64 {
    let i32 = u32::from(i);
    wrmsr(IA32_PERF_GLOBAL_CTRL, 0);
    wrmsr(IA32_PMC0 + i32, 0);
    wrmsr(IA32_PERFEVTSEL0 + i32, sel);
    run(1 << i);
    let n = rdmsr(IA32_PMC0 + i32);
    wrmsr(IA32_PERFEVTSEL0 + i32, 0);
    n
}

/// The instruction mix (see the module documentation), between the WRMSR of GLOBAL_CTRL that
/// starts counting (not counted) and the four instructions that stop it (counted).
fn run_mix(start: u64) {
    // SAFETY: PMU MSRs, the mix buffer, and the stack (an IRETQ frame, popped by the IRETQ).
    unsafe {
        asm!(
            "cld",
            "wrmsr",                  // start: not counted
            "push rbx",               // store
            "pop rbx",                // load
            "mov rax, [rsi]",         // load
            "mov [rsi + 8], rax",     // store
            "add [rsi + 16], rax",    // load and store
            "lock add [rsi + 24], rax", // locked
            "xchg [rsi + 32], rax",   // locked (implicitly)
            "cmovz rax, [rsi]",       // loads whatever the condition
            "mov rax, [rsi + 60]",    // a split load
            "mov [rsi + 126], eax",   // a split store
            "lea rax, [rsi + 8]",
            "prefetcht0 [rsi]",       // a software prefetch: a load
            "nop",
            "nop dword ptr [rax]",
            "pause",
            "call 20f",               // near call (direct), and its RET
            "lea rax, [rip + 20f]",
            "call rax",               // near call (indirect), and its RET
            "jmp 21f",                // near jump (direct)
            "ud2",
            "21:",
            "lea rax, [rip + 22f]",
            "jmp rax",                // near jump (indirect)
            "ud2",
            "22:",
            "xor eax, eax",
            "jz 23f",                 // forward, taken: mispredicted
            "ud2",
            "23:",
            "jnz 24f",                // forward, not taken
            "mov ecx, 3",
            "25:",
            "dec ecx",
            "jnz 25b",                // backward: taken twice, then not taken (mispredicted)
            "24:",
            "mov eax, ss",            // an IRETQ to the next instruction, same privilege level
            "mov rdx, rsp",
            "push rax",
            "push rdx",
            "push 2",                 // RFLAGS: interrupts off, as the guest runs
            "mov eax, cs",
            "push rax",
            "lea rax, [rip + 26f]",
            "push rax",
            "iretq",                  // a far branch
            "26:",
            "lodsb",
            "movsb",
            "stosb",
            "cmpsb",                  // two loads
            "mov ecx, r8d",           // stop: counted
            "mov eax, r9d",
            "mov edx, r10d",
            "wrmsr",
            "jmp 27f",
            "20:",
            "ret",
            "27:",
            inout("ecx") IA32_PERF_GLOBAL_CTRL => _,
            inout("eax") start as u32 => _,
            inout("edx") (start >> 32) as u32 => _,
            inout("rsi") MIX_BUF => _,
            inout("rdi") MIX_BUF + 256 => _,
            in("r8") IA32_PERF_GLOBAL_CTRL,
            in("r9") 0u32,
            in("r10") 0u32,
        );
    }
}

/// The floating-point mix (see the module documentation). XMM0-2 are saved before and restored
/// after it (the guest is built without SSE: nothing else holds values there).
fn run_fp(start: u64) {
    // SAFETY: PMU MSRs and the FP buffer: XMM0-2 are put back as they were, MXCSR's sticky
    // exception flags may be set (every exception is masked: MXCSR's power-on 0x1F80).
    unsafe {
        asm!(
            "movups [rsi + 64], xmm0",
            "movups [rsi + 80], xmm1",
            "movups [rsi + 96], xmm2",
            "wrmsr",                  // start: not counted
            "addss xmm0, xmm1",       // scalar single
            "mulss xmm0, xmm1",
            "addsd xmm0, xmm1",       // scalar double
            "divsd xmm0, xmm1",
            "sqrtsd xmm2, xmm1",
            "addsd xmm0, [rsi]",      // scalar double, from memory
            "addps xmm0, xmm1",       // packed single
            "minps xmm0, xmm1",
            "maxps xmm0, xmm1",
            "subpd xmm0, xmm1",       // packed double
            "mov ecx, r8d",           // stop: counted
            "mov eax, r9d",
            "mov edx, r10d",
            "wrmsr",
            "movups xmm0, [rsi + 64]",
            "movups xmm1, [rsi + 80]",
            "movups xmm2, [rsi + 96]",
            inout("ecx") IA32_PERF_GLOBAL_CTRL => _,
            inout("eax") start as u32 => _,
            inout("edx") (start >> 32) as u32 => _,
            in("rsi") FP_BUF,
            in("r8") IA32_PERF_GLOBAL_CTRL,
            in("r9") 0u32,
            in("r10") 0u32,
            options(nostack),
        );
    }
}

/// What an FP arithmetic event counts over the floating-point mix.
fn fp_expected(name: &str) -> Option<u64> {
    Some(match name {
        "FP_ARITH_INST_RETIRED.SCALAR_SINGLE" => 2,
        "FP_ARITH_INST_RETIRED.SCALAR_DOUBLE" => 4,
        "FP_ARITH_INST_RETIRED.128B_PACKED_SINGLE" => 3,
        "FP_ARITH_INST_RETIRED.128B_PACKED_DOUBLE" => 1,
        // The mix has no AVX: this host's KVM runs none at CPL0, and emon completes none.
        "FP_ARITH_INST_RETIRED.256B_PACKED_SINGLE"
        | "FP_ARITH_INST_RETIRED.256B_PACKED_DOUBLE"
        | "FP_ARITH_INST_RETIRED.512B_PACKED_SINGLE"
        | "FP_ARITH_INST_RETIRED.512B_PACKED_DOUBLE" => 0,
        _ => return None,
    })
}

/// The L1d's ways and sets and whether an L2 lies between it and the LLC, from CPUID leaf 4
/// (emon presents the profile's cache model there), and how the prefetchers are turned off.
#[derive(Clone, Copy)]
struct Geometry {
    ways: u64,
    sets: u64,
    l2: bool,
    prefetch: Control,
}

fn geometry() -> Geometry {
    let (mut g, mut top) = (Geometry { ways: 8, sets: 64, l2: false, prefetch: Control::probe() }, 0);
    for sub in 0..8 {
        let l = cpuid(4, sub);
        let (kind, level) = (l.eax & 0x1F, (l.eax >> 5) & 7);
        if kind == 0 {
            break;
        }
        if level == 1 && kind == 1 {
            g.ways = u64::from(l.ebx >> 22) + 1;
            g.sets = u64::from(l.ecx) + 1;
        }
        top = top.max(level);
    }
    g.l2 = top >= 3;
    g
}

/// Counts the access pattern on IA32_PMCi programmed with `sel`, with the prefetchers off (and
/// on again after it).
fn count_pattern(i: u8, sel: u64, g: Geometry) -> u64 {
    g.prefetch.set(0);
    let n = count(i, sel, |s| run_pattern(s, g));
    g.prefetch.set(ALL);
    n
}

/// The access pattern (see the module documentation).
fn run_pattern(start: u64, g: Geometry) {
    let stride = g.sets * 64;
    let last = PATTERN_BUF + g.ways * stride;
    // The stores and the split load go to lines of other L1d sets, cold too.
    let (stores, split) = (PATTERN_BUF + 64, PATTERN_BUF + 192);
    // SAFETY: PMU MSRs and the pattern buffer.
    unsafe {
        asm!(
            "wrmsr",                  // start: not counted
            "2:",
            "mov rax, [r11]",         // W + 1 cold lines of one L1d set
            "add r11, r12",
            "dec r13d",
            "jnz 2b",
            "mov rax, [r14]",         // the first again: evicted from L1d
            "mov rax, [r15]",         // the last again: in L1d
            "mov [rsi], rax",         // two cold lines, stored to
            "mov [rsi + 64], rax",
            "add qword ptr [rsi], 1", // in L1d
            "mov rax, [rdi + 60]",    // across two cold lines
            "mov ecx, r8d",           // stop: counted
            "mov eax, r9d",
            "mov edx, r10d",
            "wrmsr",
            inout("ecx") IA32_PERF_GLOBAL_CTRL => _,
            inout("eax") start as u32 => _,
            inout("edx") (start >> 32) as u32 => _,
            inout("r11") PATTERN_BUF => _,
            in("r12") stride,
            inout("r13") g.ways + 1 => _,
            in("r14") PATTERN_BUF,
            in("r15") last,
            in("rsi") stores,
            in("rdi") split,
            in("r8") IA32_PERF_GLOBAL_CTRL,
            in("r9") 0u32,
            in("r10") 0u32,
            options(nostack),
        );
    }
}

/// What an event counts over the mix, by its name in `list`.
fn mix_expected(list: &str, name: &str) -> Option<u64> {
    let snb = list == "sandybridge";
    Some(match name {
        "INST_RETIRED.ANY_P" | "INST_RETIRED.PREC_DIST" => MIX_INSTRUCTIONS,
        "INST_RETIRED.NOP" => 2,
        "ROB_MISC_EVENTS.PAUSE_INST" | "MISC_RETIRED.PAUSE_INST" => 1,
        "BR_INST_RETIRED.ANY" | "BR_INST_RETIRED.ALL_BRANCHES" | "BR_INST_RETIRED.ALL_BRANCHES_PEBS" => 12,
        "BR_INST_RETIRED.CONDITIONAL" | "BR_INST_RETIRED.COND" => 5,
        "BR_INST_RETIRED.COND_TAKEN" => 3,
        "BR_INST_RETIRED.COND_NTAKEN" | "BR_INST_RETIRED.NOT_TAKEN" => 2,
        "BR_INST_RETIRED.NEAR_CALL" | "BR_INST_RETIRED.NEAR_CALL_R3" => 2,
        "BR_INST_RETIRED.NEAR_RETURN" => 2,
        // CALL x2, RET x2, JMP x2, the JZ and the two taken JNZs.
        "BR_INST_RETIRED.NEAR_TAKEN" => 9,
        "BR_INST_RETIRED.FAR_BRANCH" => 1,
        "BR_INST_RETIRED.INDIRECT" => 2,
        // The static predictor: the forward JZ (taken) and the last backward JNZ (not taken).
        "BR_INST_RETIRED.MISPRED" | "BR_MISP_RETIRED.ALL_BRANCHES" | "BR_MISP_RETIRED.ALL_BRANCHES_PEBS" => 2,
        "BR_MISP_RETIRED.CONDITIONAL" | "BR_MISP_RETIRED.COND" => 2,
        "BR_MISP_RETIRED.COND_TAKEN" | "BR_MISP_RETIRED.TAKEN" | "BR_MISP_RETIRED.NEAR_TAKEN" => 1,
        "BR_MISP_RETIRED.COND_NTAKEN" | "BR_MISP_RETIRED.NOT_TAKEN" => 1,
        "BR_MISP_RETIRED.NEAR_CALL" | "BR_MISP_RETIRED.INDIRECT" | "BR_MISP_RETIRED.INDIRECT_CALL" => 0,
        "MEM_INST_RETIRED.ALL_LOADS" | "MEM_INST_RETIRED.LOADS" => 14,
        "MEM_INST_RETIRED.ALL_STORES" | "MEM_INST_RETIRED.STORES" => 15,
        // 14 + 15, less the four that do both (ADD, LOCK ADD, XCHG, MOVSB).
        "MEM_INST_RETIRED.ANY" => 25,
        "MEM_INST_RETIRED.LOCK_LOADS" => 2,
        "MEM_INST_RETIRED.SPLIT_LOADS" => 1,
        "MEM_INST_RETIRED.SPLIT_STORES" => 1,
        // Sandy Bridge counts micro-ops: one per access (IRETQ reads five quadwords, CMPSB two).
        "MEM_UOPS_RETIRED.ALL_LOADS" if snb => 19,
        "MEM_UOPS_RETIRED.ALL_STORES" if snb => 15,
        "MEM_UOPS_RETIRED.LOCK_LOADS" if snb => 2,
        "MEM_UOPS_RETIRED.SPLIT_LOADS" if snb => 1,
        "MEM_UOPS_RETIRED.SPLIT_STORES" if snb => 1,
        _ => return None,
    })
}

/// What a cache-model event counts over the access pattern, by its name in `list`.
fn pattern_expected(list: &str, name: &str, g: Geometry) -> Option<u64> {
    let w = g.ways;
    // The loads' lines: W + 1 and two (the split load) from memory, the first again from L2 (or
    // the LLC), the last again from L1d. The stores': two from memory, one (the ADD) from L1d.
    let (l2_hits, llc_hits) = if g.l2 { (1, 0) } else { (0, 1) };
    let load_lines_missing_l1 = w + 3 + 1;
    let skl_icl = matches!(list, "skylake" | "icelake");
    Some(match name {
        "L1D.REPLACEMENT" | "L1D.REPL" => load_lines_missing_l1 + 2,
        "L1D_ALL_REF.ANY" => load_lines_missing_l1 + 1 + 3,
        "L1D_CACHE_LD.MESI" => load_lines_missing_l1 + 1,
        "L1D_CACHE_LD.I_STATE" => load_lines_missing_l1,
        "L1D_CACHE_ST.MESI" => 3,
        "L1D_CACHE_ST.I_STATE" => 2,
        "L2_RQSTS.DEMAND_DATA_RD_HIT" | "L2_RQSTS.LD_HIT" => l2_hits,
        "L2_RQSTS.DEMAND_DATA_RD_MISS" | "L2_RQSTS.LD_MISS" => w + 3,
        "L2_RQSTS.ALL_DEMAND_DATA_RD" | "L2_RQSTS.LOADS" => load_lines_missing_l1,
        "L2_RQSTS.RFO_HIT" => 0,
        "L2_RQSTS.RFO_MISS" | "L2_RQSTS.ALL_RFO" | "L2_RQSTS.RFOS" => 2,
        "L2_LINES_IN.ALL" | "L2_LINES_IN.ANY" => w + 3 + llc_hits + 2,
        // Core 2's "L2" is its LLC.
        "L2_LD.MESI" => w + 3 + llc_hits,
        "L2_LD.ISTATE" => w + 3,
        "L2_ST.MESI" | "L2_ST.ISTATE" => 2,
        "LONGEST_LAT_CACHE.REFERENCE" => w + 3 + llc_hits + 2,
        "LONGEST_LAT_CACHE.MISS" => w + 3 + 2,
        // Load instructions by data source: W + 1 and the split one from memory, the first again
        // from L2 (or the LLC), the last again and the ADD from L1d.
        "MEM_LOAD_RETIRED.L1_HIT" | "MEM_LOAD_RETIRED.L1D_HIT" | "MEM_LOAD_UOPS_RETIRED.L1_HIT" => 2,
        "MEM_LOAD_RETIRED.L2_HIT" | "MEM_LOAD_UOPS_RETIRED.L2_HIT" => l2_hits,
        "MEM_LOAD_RETIRED.L3_HIT"
        | "MEM_LOAD_RETIRED.LLC_UNSHARED_HIT"
        | "MEM_LOAD_UOPS_RETIRED.LLC_HIT"
        | "MEM_LOAD_L3_HIT_RETIRED.XSNP_NONE"
        | "MEM_LOAD_UOPS_LLC_HIT_RETIRED.XSNP_NONE" => llc_hits,
        "MEM_LOAD_RETIRED.L1_MISS" if skl_icl => w + 2 + 1,
        "MEM_LOAD_RETIRED.L2_MISS" if skl_icl => w + 2 + llc_hits,
        "MEM_LOAD_RETIRED.L3_MISS" | "MEM_LOAD_RETIRED.LLC_MISS" => w + 2,
        // One core, no fill buffer in the model.
        "MEM_LOAD_RETIRED.FB_HIT"
        | "MEM_LOAD_RETIRED.HIT_LFB"
        | "MEM_LOAD_UOPS_RETIRED.HIT_LFB"
        | "MEM_LOAD_RETIRED.OTHER_CORE_L2_HIT_HITM"
        | "MEM_LOAD_L3_HIT_RETIRED.XSNP_HIT"
        | "MEM_LOAD_L3_HIT_RETIRED.XSNP_HITM"
        | "MEM_LOAD_L3_HIT_RETIRED.XSNP_MISS"
        | "MEM_LOAD_UOPS_LLC_HIT_RETIRED.XSNP_HIT"
        | "MEM_LOAD_UOPS_LLC_HIT_RETIRED.XSNP_HITM"
        | "MEM_LOAD_UOPS_LLC_HIT_RETIRED.XSNP_MISS" => 0,
        _ => return None,
    })
}

/// Events that count what an architectural event counts (one logical processor per core: the
/// other thread is always halted), checked against it on the same counter over the mix: core
/// cycles (0x3C/0x00) or reference cycles (0x3C/0x01, whose phase may differ by one tick).
fn like_architectural(name: &str) -> Option<(u64, u64)> {
    match name {
        "CPU_CLK_UNHALTED.THREAD_P" | "CPU_CLK_UNHALTED.DISTRIBUTED" => Some((0x3C, 0)),
        "CPU_CLK_UNHALTED.REF_P"
        | "CPU_CLK_UNHALTED.REF_XCLK"
        | "CPU_CLK_THREAD_UNHALTED.REF_XCLK"
        | "CPU_CLK_UNHALTED.ONE_THREAD_ACTIVE"
        | "CPU_CLK_THREAD_UNHALTED.ONE_THREAD_ACTIVE"
        | "CPU_CLK_UNHALTED.REF_DISTRIBUTED" => Some((0x013C, 1)),
        _ => None,
    }
}

/// The list of this CPU (CPUID family 6 model), if emon's guests know it.
fn cpu_list() -> Option<&'static List> {
    let leaf1 = cpuid(1, 0).eax;
    let (family, model) = ((leaf1 >> 8) & 0xF, ((leaf1 >> 4) & 0xF) | ((leaf1 >> 12) & 0xF0));
    LISTS.iter().find(|l| family == 6 && l.models.contains(&(model as u8)))
}

/// The counters of `e` the CPU has.
fn counters(e: &Event, gp: u8) -> impl Iterator<Item = u8> + '_ {
    (0..gp.min(8)).filter(move |i| e.counters & (1 << i) != 0)
}

/// Counts `e` on each of its counters with `run`, and checks every count is `want` (within
/// `tolerance`).
fn check_event(e: &Event, gp: u8, want: u64, tolerance: u64, run: impl Fn(u8) -> u64) {
    let mut ok = true;
    let mut on = 0u32;
    for i in counters(e, gp) {
        let got = run(i);
        if got.abs_diff(want) > tolerance {
            println!("  {} on IA32_PMC{}: got {}, want {}", e.name, i, dec(got), dec(want));
            ok = false;
        }
        on |= 1 << i;
    }
    check!(ok, "{} = {} on IA32_PMC {:#04x}", e.name, dec(want), on);
}

fn main(boot: &emon_guest::BootInfo) -> i32 {
    let pmu = Perfmon::from_cpuid();
    if pmu.version < 2 || pmu.gp == 0 {
        skip!("model-specific events: needs architectural perfmon v2+ (CPUID.0AH version {})", pmu.version);
        return emon_guest::summary();
    }
    let Some(list) = cpu_list() else {
        skip!("model-specific events: emon ships no event list for this CPU");
        return emon_guest::summary();
    };
    println!("event list: {}", list.name);
    if boot.arg("misplaced") == Some("1") {
        misplaced(list, pmu.gp);
        return emon_guest::summary();
    }
    if boot.arg("uncounted") == Some("1") {
        uncounted(list);
        return emon_guest::summary();
    }
    let g = geometry();
    println!("L1d {} ways x {} sets, L2 {}", dec(g.ways), dec(g.sets), if g.l2 { "yes" } else { "no" });
    let plain = list.events.iter().filter(|e| e.cmask == 0 && !e.inv && !e.edge);
    for e in plain {
        if let Some(want) = mix_expected(list.name, e.name) {
            check_event(e, pmu.gp, want, 0, |i| count(i, evtsel(e), run_mix));
        } else if let Some(want) = pattern_expected(list.name, e.name, g) {
            check_event(e, pmu.gp, want, 0, |i| count_pattern(i, evtsel(e), g));
        } else if let Some((arch, tolerance)) = like_architectural(e.name) {
            for i in counters(e, pmu.gp) {
                let want = count(i, PERFEVTSEL_EN | PERFEVTSEL_OS | PERFEVTSEL_USR | arch, run_mix);
                let got = count(i, evtsel(e), run_mix);
                check!(
                    got.abs_diff(want) <= tolerance,
                    "{} on IA32_PMC{} = {} (architectural {:#06x}: {})",
                    e.name,
                    i,
                    dec(got),
                    arch,
                    dec(want)
                );
            }
        } else if let Some(want) = fp_expected(e.name) {
            check_event(e, pmu.gp, want, 0, |i| count(i, evtsel(e), run_fp));
        }
    }
    emon_guest::summary()
}

/// An event programmed on a counter its list does not give it counts 0.
fn misplaced(list: &List, gp: u8) {
    let g = geometry();
    let elsewhere = |e: &Event| (0..gp.min(8)).find(|i| e.counters & (1 << i) == 0);
    let counted =
        |e: &&Event| mix_expected(list.name, e.name).is_some() || pattern_expected(list.name, e.name, g).is_some();
    let Some((e, i)) = list.events.iter().filter(counted).find_map(|e| elsewhere(e).map(|i| (e, i))) else {
        skip!("misplaced: every counted event of {} counts on every counter", list.name);
        return;
    };
    let got = if mix_expected(list.name, e.name).is_some() {
        count(i, evtsel(e), run_mix)
    } else {
        count_pattern(i, evtsel(e), g)
    };
    check!(got == 0, "{} on IA32_PMC{} (not its counter) counted {}", e.name, i, dec(got));
}

/// Events emon does not count, one of which each list has.
const UNCOUNTED: [&str; 2] = ["UOPS_ISSUED.ANY", "DTLB_MISSES.MISS_LD"];

/// An event emon does not count reads 0.
fn uncounted(list: &List) {
    let Some(e) = list.events.iter().find(|e| UNCOUNTED.contains(&e.name) && e.counters & 1 != 0) else {
        skip!("uncounted: {} has none of {:?}", list.name, UNCOUNTED);
        return;
    };
    let got = count(0, evtsel(e), run_mix);
    check!(got == 0, "{} (not counted by emon) counted {}", e.name, dec(got));
}
