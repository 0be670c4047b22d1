//! The model-specific PMU facts of the CPUs emon's profiles present, by family and model, as
//! SDM Vol. 4's per-model MSR tables and measurements of the real parts give them: software knows
//! them this way, not from CPUID (Linux's arch/x86/events/intel does the same).
use crate::cpu::{cpuid, max_leaf, rdmsr_safe};

pub const IA32_PERF_CAPABILITIES: u32 = 0x345;
pub const MSR_OFFCORE_RSP_0: u32 = 0x1A6;
pub const MSR_LBR_SELECT: u32 = 0x1C8;
pub const MSR_LASTBRANCH_TOS: u32 = 0x1C9;
pub const MSR_PEBS_LD_LAT: u32 = 0x3F6;
pub const MSR_PEBS_FRONTEND: u32 = 0x3F7;
pub const MSR_LBR_INFO_0: u32 = 0xDC0;

/// How a WRMSR treats one MSR's bits: `store` is kept, `ignore` is dropped, any other #GPs.
#[derive(Clone, Copy)]
pub struct Bits {
    pub store: u64,
    pub ignore: u64,
}

/// A 16-bit field with bits 63:16 ignored: PEBS_LD_LAT as Sandy Bridge and Skylake behave.
pub const LD_LAT: Bits = Bits { store: 0xFFFF, ignore: 0xFFFF_FFFF_FFFF_0000 };

/// The LBR stack (SDM Vol. 3B 17.4.8): depth and MSR bases.
#[derive(Clone, Copy)]
pub struct Stack {
    pub depth: u32,
    pub from: u32,
    pub to: u32,
    /// MSR_LBR_INFO_n exist (LBR_FMT 5).
    pub info: bool,
    /// MSR_LBR_SELECT's filter bits; 0: no such MSR.
    pub select: u64,
}

/// One microarchitecture's model-specific PMU MSRs.
pub struct Cpu {
    pub name: &'static str,
    pub models: &'static [u8],
    pub lbr: Stack,
    pub offcore_rsp: [Option<Bits>; 2],
    pub pebs_ld_lat: Option<Bits>,
    pub pebs_frontend: Option<Bits>,
}

/// Family 6 models, with SDM Vol. 4's tables and the real parts' measured write masks.
pub const CPUS: [Cpu; 5] = [
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

/// What CPUID says this CPU is.
pub enum Identified {
    /// No architectural perfmon (CPUID.0AH version 0): none of these MSRs.
    NoPerfmon,
    /// A family and model the table does not know.
    Unknown {
        family: u32,
        model: u32,
    },
    Known(&'static Cpu),
}

/// The CPU by CPUID.01H's family and model.
pub fn identify() -> Identified {
    let leaf1 = cpuid(1, 0);
    let family = (leaf1.eax >> 8) & 0xF;
    let model = ((leaf1.eax >> 4) & 0xF) | ((leaf1.eax >> 12) & 0xF0);
    let perfmon = max_leaf() >= 0xA && cpuid(0xA, 0).eax & 0xFF != 0;
    crate::println!("family {:#x} model {:#x}, architectural perfmon: {}", family, model, perfmon);
    if !perfmon {
        return Identified::NoPerfmon;
    }
    match CPUS.iter().find(|c| family == 6 && c.models.contains(&(model as u8))) {
        Some(cpu) => Identified::Known(cpu),
        None => Identified::Unknown { family, model },
    }
}

/// IA32_PERF_CAPABILITIES[5:0] LBR_FMT (0 without PDCM).
pub fn lbr_format() -> u64 {
    if cpuid(1, 0).ecx & (1 << 15) == 0 {
        return 0;
    }
    rdmsr_safe(IA32_PERF_CAPABILITIES).map_or(0, |v| v & 0x3F)
}
