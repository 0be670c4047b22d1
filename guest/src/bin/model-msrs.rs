//! Checks the model-specific PMU MSRs (the LBR stack, OFFCORE_RSP, PEBS_LD_LAT, PEBS_FRONTEND) against the named CPU's.
//!
//! Which of them a CPU has is not enumerated by CPUID: software knows them by family and model,
//! as Linux does (arch/x86/events/intel). So this guest carries its own table, by model, of what
//! SDM Vol. 4's per-model MSR tables and measurements of the real parts say: the LBR stack's depth
//! and MSR bases (SDM Vol. 3B 17.4.8), MSR_LBR_SELECT's filter bits, and which bits of each
//! qualifier MSR a WRMSR stores, ignores or rejects with #GP. It checks that exactly those MSRs
//! exist (every other candidate #GPs on read and write, with no state change), that they read 0
//! at power-on, and that writes behave as on the real part. A CPU without architectural perfmon
//! has none of them; a model the table does not know is skipped with the reason.
#![no_std]
#![no_main]

use emon_guest::cpu::{cpuid, max_leaf, rdmsr_safe, wrmsr_safe};
use emon_guest::msr::{expect_gp_unchanged, expect_reserved_bits, is_gp, rd, wr, write_reads};
use emon_guest::{check, println, skip, BootInfo};

emon_guest::entry!(main);

const IA32_DEBUGCTL: u32 = 0x1D9;
const IA32_PERF_CAPABILITIES: u32 = 0x345;
const MSR_OFFCORE_RSP_0: u32 = 0x1A6;
const MSR_LBR_SELECT: u32 = 0x1C8;
const MSR_LASTBRANCH_TOS: u32 = 0x1C9;
const MSR_PEBS_LD_LAT: u32 = 0x3F6;
const MSR_PEBS_FRONTEND: u32 = 0x3F7;
const MSR_LBR_INFO_0: u32 = 0xDC0;
/// SDM 17.4.8.1, LBR_FMT 5: MISPRED (63), IN_TX (62), TX_ABORT (61) and the cycle count (15:0).
const LBR_INFO_WRITABLE: u64 = 0xE000_0000_0000_FFFF;

/// Every MSR index where some CPU keeps one of these registers: Core 2's LBR banks (8 entries
/// each), OFFCORE_RSP_0/1, LBR_SELECT and TOS, PEBS_LD_LAT and PEBS_FRONTEND, and the 32-entry
/// banks from Nehalem on (FROM, TO, LBR_INFO).
const CANDIDATES: [(u32, u32); 8] = [
    (0x40, 8),
    (0x60, 8),
    (MSR_OFFCORE_RSP_0, 2),
    (MSR_LBR_SELECT, 2),
    (MSR_PEBS_LD_LAT, 2),
    (0x680, 32),
    (0x6C0, 32),
    (MSR_LBR_INFO_0, 32),
];

/// How a WRMSR treats one MSR's bits: `store` is kept, `ignore` is dropped, any other #GPs.
#[derive(Clone, Copy)]
struct Bits {
    store: u64,
    ignore: u64,
}

/// A 16-bit field with bits 63:16 ignored: PEBS_LD_LAT as Sandy Bridge and Skylake behave.
const LD_LAT: Bits = Bits { store: 0xFFFF, ignore: 0xFFFF_FFFF_FFFF_0000 };

#[derive(Clone, Copy)]
struct Stack {
    depth: u32,
    from: u32,
    to: u32,
    /// MSR_LBR_INFO_n exist (LBR_FMT 5).
    info: bool,
    /// MSR_LBR_SELECT's filter bits; 0: no such MSR.
    select: u64,
}

struct Cpu {
    name: &'static str,
    models: &'static [u8],
    lbr: Stack,
    offcore_rsp: [Option<Bits>; 2],
    pebs_ld_lat: Option<Bits>,
    pebs_frontend: Option<Bits>,
}

/// Family 6 models, with SDM Vol. 4's tables and the real parts' measured write masks.
const CPUS: [Cpu; 5] = [
    Cpu {
        name: "Core 2",
        models: &[0x0F, 0x16, 0x17, 0x1D],
        lbr: Stack { depth: 4, from: 0x40, to: 0x60, info: false, select: 0 },
        offcore_rsp: [None, None],
        pebs_ld_lat: None,
        pebs_frontend: None,
    },
    Cpu {
        name: "Nehalem",
        models: &[0x1A, 0x1E, 0x1F, 0x2E],
        lbr: Stack { depth: 16, from: 0x680, to: 0x6C0, info: false, select: 0x1FF },
        offcore_rsp: [Some(Bits { store: 0xFFFF, ignore: 0 }), None],
        pebs_ld_lat: Some(LD_LAT),
        pebs_frontend: None,
    },
    Cpu {
        name: "Sandy Bridge",
        models: &[0x2A, 0x2D],
        lbr: Stack { depth: 16, from: 0x680, to: 0x6C0, info: false, select: 0x1FF },
        offcore_rsp: [Some(Bits { store: 0x3F_FFFF_8FFF, ignore: 0 }); 2],
        pebs_ld_lat: Some(LD_LAT),
        pebs_frontend: None,
    },
    Cpu {
        name: "Skylake",
        models: &[0x4E, 0x5E],
        lbr: Stack { depth: 32, from: 0x680, to: 0x6C0, info: true, select: 0x3FF },
        offcore_rsp: [Some(Bits { store: 0x3F_FFFF_9FFF, ignore: 0 }); 2],
        pebs_ld_lat: Some(LD_LAT),
        pebs_frontend: Some(Bits { store: 0x7F_FF17, ignore: 0 }),
    },
    Cpu {
        name: "Ice Lake",
        models: &[0x7D, 0x7E],
        lbr: Stack { depth: 32, from: 0x680, to: 0x6C0, info: true, select: 0x3FF },
        offcore_rsp: [Some(Bits { store: 0x3F_FFFF_BFFF, ignore: 0 }); 2],
        pebs_ld_lat: Some(LD_LAT),
        pebs_frontend: Some(Bits { store: 0x7F_FF17, ignore: 0 }),
    },
];

/// The MSRs `cpu` has, as (first, count) runs.
fn present(cpu: &Cpu) -> [(u32, u32); 8] {
    let l = cpu.lbr;
    let offcore = cpu.offcore_rsp.iter().filter(|b| b.is_some()).count() as u32;
    [
        (l.from, l.depth),
        (l.to, l.depth),
        (MSR_LBR_INFO_0, if l.info { l.depth } else { 0 }),
        (MSR_LASTBRANCH_TOS, 1),
        (MSR_LBR_SELECT, u32::from(l.select != 0)),
        (MSR_OFFCORE_RSP_0, offcore),
        (MSR_PEBS_LD_LAT, u32::from(cpu.pebs_ld_lat.is_some())),
        (MSR_PEBS_FRONTEND, u32::from(cpu.pebs_frontend.is_some())),
    ]
}

fn candidates() -> impl Iterator<Item = u32> {
    CANDIDATES.into_iter().flat_map(|(first, n)| first..first + n)
}

/// Exactly `expected` of the candidates exist: they read 0; the others #GP on RDMSR and on
/// WRMSR of 0.
fn check_existence(what: &str, expected: &dyn Fn(u32) -> bool) {
    let (mut wrong, mut nonzero) = (0u32, 0u32);
    for msr in candidates() {
        let r = rdmsr_safe(msr);
        let exists = expected(msr);
        if exists != r.is_ok() || !exists && !is_gp(&wrmsr_safe(msr, 0)) {
            println!("  MSR {:#x}: {}", msr, if exists { "should exist" } else { "should #GP" });
            wrong += 1;
        }
        if matches!(r, Ok(v) if v != 0) {
            println!("  MSR {:#x} reads {:#x} at power-on", msr, r.unwrap_or(0));
            nonzero += 1;
        }
    }
    check!(wrong == 0, "{}: exactly its model-specific PMU MSRs exist", what);
    check!(nonzero == 0, "{}: they read 0 at power-on", what);
}

/// Stores `b.store`, drops `b.ignore`, #GPs on every other bit without changing the MSR.
fn check_bits(name: &str, msr: u32, b: Bits) {
    write_reads(format_args!("{name}: stores bits {:#x}", b.store), msr, b.store, b.store);
    if b.ignore != 0 {
        write_reads(format_args!("{name}: ignores bits {:#x}", b.ignore), msr, b.ignore | 1, 1);
    }
    wr(msr, 0);
    expect_reserved_bits(format_args!("{name}: other bits #GP"), msr, 0, !(b.store | b.ignore), msr);
}

/// A user address with all `flags` flag bits above it set (LBR_FMT 3: 1, 4: 3): a FROM_IP value
/// in that format, a non-canonical address to TO_IP when `flags` > 0.
fn user_ip_with_flags(flags: u32) -> u64 {
    0x0000_0000_0040_1000 | !(u64::MAX >> flags)
}

/// A kernel address: canonical, bits 63:47 all set.
const KERNEL_IP: u64 = 0xFFFF_FFFF_8100_0000;
/// Bit 47 set and bits 62:48 clear: not sign-extended, in any format.
const BROKEN_IP: u64 = 0x0000_8000_0000_0000;

fn check_stack(cpu: &Cpu, format: u64) {
    let l = cpu.lbr;
    let last = l.depth - 1;
    // MSR_LASTBRANCH_TOS: an index into the stack; bits above it #GP.
    write_reads(format_args!("MSR_LASTBRANCH_TOS takes {}", last), MSR_LASTBRANCH_TOS, last.into(), last.into());
    expect_gp_unchanged(
        format_args!("MSR_LASTBRANCH_TOS #GPs at {}", l.depth),
        MSR_LASTBRANCH_TOS,
        l.depth.into(),
        MSR_LASTBRANCH_TOS,
    );
    wr(MSR_LASTBRANCH_TOS, 0);
    // FROM_IP/TO_IP hold canonical addresses (the flags of LBR_FMT 3 and 4 above them in FROM_IP).
    let flags = match format {
        3 => 1,
        4 => 3,
        _ => 0,
    };
    for (bank, with_flags) in [(l.from, flags), (l.to, 0)] {
        for i in [0, last] {
            let msr = bank + i;
            for ip in [user_ip_with_flags(with_flags), KERNEL_IP] {
                write_reads(format_args!("LBR entry {:#x} holds {:#x}", msr, ip), msr, ip, ip);
            }
            expect_gp_unchanged(format_args!("LBR entry {:#x} #GPs on {:#x}", msr, BROKEN_IP), msr, BROKEN_IP, msr);
            wr(msr, 0);
        }
    }
    if flags != 0 {
        let flagged = user_ip_with_flags(flags);
        expect_gp_unchanged(format_args!("TO_IP has no flag bits ({:#x})", flagged), l.to, flagged, l.to);
    }
    if l.info {
        let msr = MSR_LBR_INFO_0 + last;
        write_reads(
            format_args!("MSR_LBR_INFO_{} stores {:#x}", last, LBR_INFO_WRITABLE),
            msr,
            LBR_INFO_WRITABLE,
            LBR_INFO_WRITABLE,
        );
        wr(msr, 0);
        expect_reserved_bits(format_args!("MSR_LBR_INFO_{}: other bits #GP", last), msr, 0, !LBR_INFO_WRITABLE, msr);
    }
    if l.select != 0 {
        check_bits("MSR_LBR_SELECT", MSR_LBR_SELECT, Bits { store: l.select, ignore: 0 });
    }
    // DEBUGCTL.LBR is accepted (emon does not record branches yet; the run summary says so).
    write_reads(format_args!("IA32_DEBUGCTL.LBR can be set"), IA32_DEBUGCTL, 1, 1);
    wr(IA32_DEBUGCTL, 0);
}

fn main(_boot: &BootInfo) -> i32 {
    let leaf1 = cpuid(1, 0);
    let family = (leaf1.eax >> 8) & 0xF;
    let model = ((leaf1.eax >> 4) & 0xF) | ((leaf1.eax >> 12) & 0xF0);
    let perfmon = max_leaf() >= 0xA && cpuid(0xA, 0).eax & 0xFF != 0;
    println!("family {:#x} model {:#x}, architectural perfmon: {}", family, model, perfmon);
    if !perfmon {
        check_existence("no architectural perfmon", &|_| false);
        return emon_guest::summary();
    }
    let Some(cpu) = CPUS.iter().find(|c| family == 6 && c.models.contains(&(model as u8))) else {
        skip!("model-specific PMU MSRs: family {:#x} model {:#x} is not in this guest's table", family, model);
        return emon_guest::summary();
    };
    let pdcm = leaf1.ecx & (1 << 15) != 0;
    let format = if pdcm { rd(IA32_PERF_CAPABILITIES) & 0x3F } else { 0 };
    println!("{}: LBR format {}", cpu.name, format);
    let runs = present(cpu);
    check_existence(cpu.name, &|msr| runs.iter().any(|&(first, n)| (first..first + n).contains(&msr)));
    check_stack(cpu, format);
    for (i, b) in cpu.offcore_rsp.iter().enumerate() {
        if let Some(b) = b {
            check_bits(
                if i == 0 { "MSR_OFFCORE_RSP_0" } else { "MSR_OFFCORE_RSP_1" },
                MSR_OFFCORE_RSP_0 + i as u32,
                *b,
            );
        }
    }
    if let Some(b) = cpu.pebs_ld_lat {
        check_bits("MSR_PEBS_LD_LAT", MSR_PEBS_LD_LAT, b);
    }
    if let Some(b) = cpu.pebs_frontend {
        check_bits("MSR_PEBS_FRONTEND", MSR_PEBS_FRONTEND, b);
    }
    let leftover = candidates().filter(|&m| matches!(rdmsr_safe(m), Ok(v) if v != 0)).count();
    check!(leftover == 0, "every model-specific MSR is back at 0");
    emon_guest::summary()
}
