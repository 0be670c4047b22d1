//! Checks the model-specific PMU MSRs (the LBR stack, OFFCORE_RSP, PEBS_LD_LAT, PEBS_FRONTEND) against the named CPU's.
//!
//! Which of them a CPU has is not enumerated by CPUID: software knows them by family and model,
//! as Linux does (arch/x86/events/intel). So this guest carries its own table, by model, of what
//! SDM Vol. 4's per-model MSR tables and measurements of the real parts say: the LBR stack's depth
//! and MSR bases (SDM Vol. 3B 17.4.8), MSR_LBR_SELECT's filter bits, and which bits of each
//! qualifier MSR a WRMSR stores, ignores or rejects with #GP. It checks that exactly those MSRs
//! exist (every other candidate #GPs on read and write, with no state change), that they read 0
//! at power-on, and that writes behave as on the real part. A CPU without architectural perfmon
//! has none of them; a model the table does not know is skipped with the reason. The stack's
//! recording is `guest:lbr`'s.
#![no_std]
#![no_main]

use emon_guest::cpu::{rdmsr_safe, wrmsr_safe};
use emon_guest::models::{
    self, Bits, Cpu, MSR_LASTBRANCH_TOS, MSR_LBR_INFO_0, MSR_LBR_SELECT, MSR_OFFCORE_RSP_0, MSR_PEBS_FRONTEND,
    MSR_PEBS_LD_LAT,
};
use emon_guest::msr::{expect_gp_unchanged, expect_reserved_bits, is_gp, wr, write_reads};
use emon_guest::{check, println, skip, BootInfo};

emon_guest::entry!(main);

/// MSR_LER_FROM_LIP; MSR_LER_TO_LIP follows (present with the LBR stack).
const MSR_LER_FROM_LIP: u32 = 0x1DD;

/// SDM 17.4.8.1, LBR_FMT 5: MISPRED (63), IN_TX (62), TX_ABORT (61) and the cycle count (15:0).
const LBR_INFO_WRITABLE: u64 = 0xE000_0000_0000_FFFF;

/// Every MSR index where some CPU keeps one of these registers: Core 2's LBR banks (8 entries
/// each), OFFCORE_RSP_0/1, LBR_SELECT and TOS, LER_FROM/TO_LIP, PEBS_LD_LAT and PEBS_FRONTEND, and the 32-entry
/// banks from Nehalem on (FROM, TO, LBR_INFO).
const CANDIDATES: [(u32, u32); 9] = [
    (0x40, 8),
    (0x60, 8),
    (MSR_OFFCORE_RSP_0, 2),
    (MSR_LBR_SELECT, 2),
    (MSR_LER_FROM_LIP, 2),
    (MSR_PEBS_LD_LAT, 2),
    (0x680, 32),
    (0x6C0, 32),
    (MSR_LBR_INFO_0, 32),
];

/// The MSRs `cpu` has, as (first, count) runs.
fn present(cpu: &Cpu) -> [(u32, u32); 9] {
    let l = cpu.lbr;
    let offcore = cpu.offcore_rsp.iter().filter(|b| b.is_some()).count() as u32;
    [
        (l.from, l.depth),
        (l.to, l.depth),
        (MSR_LBR_INFO_0, if l.info { l.depth } else { 0 }),
        (MSR_LASTBRANCH_TOS, 1),
        (MSR_LER_FROM_LIP, 2),
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
    // LER_FROM/TO_LIP: read/write, no reserved bits (as measured on the i7-6700K, i7-2635QM and
    // Xeon X5482).
    for msr in [MSR_LER_FROM_LIP, MSR_LER_FROM_LIP + 1] {
        write_reads(format_args!("LER MSR {:#x} stores any value", msr), msr, u64::MAX, u64::MAX);
        wr(msr, 0);
    }
}

fn main(_boot: &BootInfo) -> i32 {
    let cpu = match models::identify() {
        models::Identified::NoPerfmon => {
            check_existence("no architectural perfmon", &|_| false);
            return emon_guest::summary();
        }
        models::Identified::Unknown { family, model } => {
            skip!("model-specific PMU MSRs: family {:#x} model {:#x} is not in this guest's table", family, model);
            return emon_guest::summary();
        }
        models::Identified::Known(cpu) => cpu,
    };
    let format = models::lbr_format();
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
