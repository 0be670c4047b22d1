//! What the engine may run: each instruction's class ([`classify`]), and the translated blocks the
//! block hook decides on, decoded once per run with what each adds to the armed counters.
use super::super::events::{cycles, Armed, Derive};
use emon_pmu::profile::MIN_CACHE_LINE;
use emon_x86::access;
use emon_x86::insn::{self, Insn};
use emon_x86::mode::CpuMode;
use iced_x86::{
    Code, CpuidFeature, Decoder, DecoderOptions, FlowControl, Instruction, InstructionInfoFactory, Mnemonic, Register,
};
use iced_x86::{OpAccess, OpKind};
use vm_memory::GuestMemoryMmap;

/// State beyond the general and control registers that an instruction needs in the engine, and
/// that a run loads only when it may execute such an instruction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Needs {
    /// The x87, MMX and SSE registers, MXCSR and XCR0.
    pub fpu: bool,
    /// IA32_STAR, LSTAR, CSTAR, FMASK and KERNEL_GS_BASE (SYSCALL, SYSRET, SWAPGS).
    pub msrs: bool,
}

impl Needs {
    pub const NONE: Needs = Needs { fpu: false, msrs: false };

    /// Whether a run that loaded `loaded` has all of this.
    pub fn met_by(self, loaded: Needs) -> bool {
        (!self.fpu || loaded.fpu) && (!self.msrs || loaded.msrs)
    }

    pub fn union(self, other: Needs) -> Needs {
        Needs { fpu: self.fpu || other.fpu, msrs: self.msrs || other.msrs }
    }

    /// Whether a block decoded for a run that loaded `self` is decoded alike for one that loaded
    /// `other`: its runnable instructions, which need `used`, have it in both, and the one it
    /// stopped at for want of `stopped_for` (if it stopped so) lacks it in both.
    pub fn alike(self, other: Needs, used: Needs, stopped_for: Needs) -> bool {
        self == other || used.met_by(other) && (stopped_for == Needs::NONE || !stopped_for.met_by(other))
    }
}

/// Whether the engine runs an instruction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// The engine runs it, given what it needs loaded.
    Runs(Needs),
    /// It must go through KVM or the VMM.
    HandedOver,
}

/// Instructions that must go through KVM or the VMM, by mnemonic: they read or set state the
/// engine does not hold or must not change behind KVM's back (the TSC, MSRs, CPUID, I/O,
/// RFLAGS.IF with an interrupt window, the TLB KVM keeps for the guest, the state components
/// beyond SSE that XSAVE and XRSTOR move), deliver an event through the IDT, or wait.
const HANDED_OVER: &[Mnemonic] = {
    use Mnemonic::*;
    &[
        Cpuid, Rdtsc, Rdtscp, Rdpmc, Rdmsr, Wrmsr, In, Out, Insb, Insw, Insd, Outsb, Outsw, Outsd, Hlt, Popf, Popfq,
        Popfd, Iret, Iretd, Syscall, Sysret, Sysretq, Sysenter, Sysexit, Int, Int1, Int3, Into, Ud0, Ud1, Ud2, Retf,
        Lss, Lfs, Lgs, Lds, Les, Xsetbv, Rdseed, Rdpid, Wbinvd, Invd, Monitor, Mwait, Umonitor, Umwait, Tpause, Enqcmd,
        Serialize, Invpcid, Xsave, Xsave64, Xsaveopt, Xsaveopt64, Xsavec, Xsavec64, Xrstor, Xrstor64,
    ]
};

/// Privileged instructions the engine runs at CPL0 all the same: their effect is registers the
/// engine holds and gives back (RFLAGS.IF, RFLAGS.AC, GS's base), or the TLB: INVLPG drops the
/// engine's own translation, and the run says so (`Run::flushed_tlb`) for KVM's. STI only where
/// the run may hold interrupts back ([`Withheld::sti`]); a run that ends right after it says so
/// (`Run::after_sti`), for its shadow.
const PRIVILEGED_IN_ENGINE: &[Mnemonic] = {
    use Mnemonic::*;
    &[Cli, Sti, Clac, Stac, Swapgs, Invlpg]
};

/// What a run hands over that the engine could run: what must not happen outside KVM's or
/// emon's sight under the run's conditions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Withheld {
    /// A data breakpoint watches user memory: what may open the kernel's access to it
    /// ([`opens_user_access`]).
    pub user_access: bool,
    /// Interrupts must be taken where the CPU takes them (something counts at this privilege
    /// level): STI, after whose shadow KVM delivers those it let in. Other runs run it, and the
    /// interrupts wait for the run's end, as they wait while code with RFLAGS.IF set runs.
    pub sti: bool,
    /// RDTSC and RDTSCP: the run has no window on the guest's TSC (`Counting::tsc`: it follows
    /// emon's model, or this host's TSC cannot bound it). [`classify`] hands them over; a run with
    /// a window runs them.
    pub tsc: bool,
}

impl Withheld {
    /// What decides whether the engine runs `i` among the run's conditions: each flag set where
    /// `i` is what it withholds.
    fn deciding(i: &Instruction) -> Withheld {
        Withheld { user_access: opens_user_access(i), sti: i.mnemonic() == Mnemonic::Sti, tsc: reads_tsc(i) }
    }

    fn union(self, other: Withheld) -> Withheld {
        Withheld {
            user_access: self.user_access || other.user_access,
            sti: self.sti || other.sti,
            tsc: self.tsc || other.tsc,
        }
    }

    /// Whether code decoded for `self` is decoded alike for `other`, where only the flags set in
    /// `deciding` decide anything of it.
    pub fn alike(self, other: Withheld, deciding: Withheld) -> bool {
        (!deciding.user_access || self.user_access == other.user_access)
            && (!deciding.sti || self.sti == other.sti)
            && (!deciding.tsc || self.tsc == other.tsc)
    }
}

/// Whether `i` reads the time-stamp counter: RDTSC or RDTSCP (RDMSR of IA32_TSC is handed over
/// as any RDMSR).
pub fn reads_tsc(i: &Instruction) -> bool {
    matches!(i.mnemonic(), Mnemonic::Rdtsc | Mnemonic::Rdtscp)
}

/// Whether the engine may run `i` in a run that withholds `withheld` (see [`classify`]).
pub fn class_in(i: &Instruction, info: &mut InstructionInfoFactory, withheld: Withheld) -> Class {
    let is = Withheld::deciding(i);
    if withheld.user_access && is.user_access || withheld.sti && is.sti {
        return Class::HandedOver;
    }
    if !withheld.tsc && is.tsc && !i.has_lock_prefix() {
        return Class::Runs(Needs::NONE);
    }
    classify(i, info)
}

/// The instruction sets the engine runs: what QEMU's TCG implements of what a guest may be told
/// it has (integer, x87, MMX, SSE to SSE4.2, AES-NI, PCLMULQDQ, FXSAVE and XSAVE/XSAVEOPT).
/// Not AVX, AVX2, FMA, F16C, SHA, XSAVEC/XSAVES or RDSEED: TCG has none of them.
const ENGINE_FEATURES: &[CpuidFeature] = {
    use CpuidFeature::*;
    &[
        INTEL8086,
        INTEL8086_ONLY,
        INTEL186,
        INTEL286,
        INTEL386,
        INTEL486,
        X64,
        CMOV,
        CX8,
        CMPXCHG16B,
        MULTIBYTENOP,
        BMI1,
        BMI2,
        LZCNT,
        POPCNT,
        ADX,
        MOVBE,
        CLFSH,
        CLFLUSHOPT,
        CLWB,
        // PREFETCH and PREFETCHW (0F 0D): TCG translates them as the hints they are.
        PREFETCHW,
        PAUSE,
        CET_IBT,
        SMAP,
        FSGSBASE,
        RDRAND,
        FPU,
        FPU287,
        FPU387,
        MMX,
        SSE,
        SSE2,
        SSE3,
        SSSE3,
        SSE4_1,
        SSE4_2,
        AES,
        PCLMULQDQ,
        FXSR,
        XSAVE,
        XSAVEOPT,
    ]
};

/// CPUID bits of what [`ENGINE_FEATURES`] leaves out (and of XSAVES, XRSTORS and the state
/// components only they or VEX/EVEX code use), as (leaf, sub-leaf, register: 0-3 for EAX-EDX,
/// bit, name): where user code runs in the engine the guest is not told of them (see
/// [`hide_lacking`]).
const LACKING_CPUID: &[(u32, u32, usize, u32, &str)] = &[
    (1, 0, 2, 12, "FMA"),
    (1, 0, 2, 28, "AVX"),
    (1, 0, 2, 29, "F16C"),
    (7, 0, 1, 5, "AVX2"),
    (7, 0, 1, 16, "AVX512F"),
    (7, 0, 1, 17, "AVX512DQ"),
    (7, 0, 1, 18, "RDSEED"),
    (7, 0, 1, 21, "AVX512_IFMA"),
    (7, 0, 1, 26, "AVX512PF"),
    (7, 0, 1, 27, "AVX512ER"),
    (7, 0, 1, 28, "AVX512CD"),
    (7, 0, 1, 29, "SHA"),
    (7, 0, 1, 30, "AVX512BW"),
    (7, 0, 1, 31, "AVX512VL"),
    (7, 0, 2, 1, "AVX512_VBMI"),
    (7, 0, 2, 6, "AVX512_VBMI2"),
    (7, 0, 2, 8, "GFNI"),
    (7, 0, 2, 9, "VAES"),
    (7, 0, 2, 10, "VPCLMULQDQ"),
    (7, 0, 2, 11, "AVX512_VNNI"),
    (7, 0, 2, 12, "AVX512_BITALG"),
    (7, 0, 2, 14, "AVX512_VPOPCNTDQ"),
    (7, 0, 3, 2, "AVX512_4VNNIW"),
    (7, 0, 3, 3, "AVX512_4FMAPS"),
    (7, 0, 3, 8, "AVX512_VP2INTERSECT"),
    (7, 0, 3, 22, "AMX_BF16"),
    (7, 0, 3, 23, "AVX512_FP16"),
    (7, 0, 3, 24, "AMX_TILE"),
    (7, 0, 3, 25, "AMX_INT8"),
    (7, 1, 0, 4, "AVX_VNNI"),
    (7, 1, 0, 5, "AVX512_BF16"),
    (0xD, 0, 0, 2, "XCR0.AVX"),
    (0xD, 0, 0, 5, "XCR0.opmask"),
    (0xD, 0, 0, 6, "XCR0.ZMM_Hi256"),
    (0xD, 0, 0, 7, "XCR0.Hi16_ZMM"),
    (0xD, 0, 0, 17, "XCR0.XTILECFG"),
    (0xD, 0, 0, 18, "XCR0.XTILEDATA"),
    (0xD, 1, 0, 3, "XSAVES"),
];

/// Clears from a CPUID table what the engine cannot run (see [`LACKING_CPUID`]), and says what
/// was set.
pub fn hide_lacking(table: &mut [kvm_bindings::kvm_cpuid_entry2]) -> Vec<&'static str> {
    let mut hidden = Vec::new();
    for &(leaf, subleaf, reg, bit, name) in LACKING_CPUID {
        for e in table.iter_mut().filter(|e| crate::cpuid::answers(e, leaf, subleaf)) {
            let r = crate::cpuid::reg_mut(e, reg);
            if *r & 1 << bit != 0 {
                *r &= !(1 << bit);
                hidden.push(name);
            }
        }
    }
    hidden
}

/// Instructions that read or write the x87/SSE state or XCR0 without naming an x87, MMX or XMM
/// register.
const FPU_STATE: &[Mnemonic] = {
    use Mnemonic::*;
    &[Ldmxcsr, Stmxcsr, Fxsave, Fxsave64, Fxrstor, Fxrstor64, Xgetbv]
};

/// Whether the engine may run `i` (see [`Class`]).
pub fn classify(i: &Instruction, info: &mut InstructionInfoFactory) -> Class {
    let m = i.mnemonic();
    // IRETQ runs in the engine, so that a return to user mode stays under its control (KVM
    // cannot single-step CPL3 code on some hosts); the run stops before the first block at the
    // new privilege level, and the VMM writes the segments back and ends NMI blocking.
    if i.code() == Code::Iretq {
        return Class::Runs(Needs::NONE);
    }
    // SYSRETQ too, for the same reason (QEMU's is SDM Vol. 2B's, from IA32_STAR).
    if i.code() == Code::Sysretq {
        return Class::Runs(Needs { fpu: false, msrs: true });
    }
    let far = i.is_jmp_far() || i.is_call_far() || i.is_jmp_far_indirect() || i.is_call_far_indirect();
    let plain_flow = matches!(
        i.flow_control(),
        FlowControl::Next
            | FlowControl::UnconditionalBranch
            | FlowControl::ConditionalBranch
            | FlowControl::IndirectBranch
            | FlowControl::Call
            | FlowControl::IndirectCall
            | FlowControl::Return
    );
    let reads_cr = reads_cr2(i);
    let privileged = i.is_privileged() && !PRIVILEGED_IN_ENGINE.contains(&m) && !reads_cr;
    if i.is_invalid() || privileged || far || !plain_flow || HANDED_OVER.contains(&m) {
        return Class::HandedOver;
    }
    let used = info.info(i).used_registers().to_vec();
    // Segment register loads, and registers the engine does not hold or hand back.
    let outside = used.iter().any(|r| {
        let reg = r.register();
        (reg.is_segment_register() && r.access() != OpAccess::Read)
            || reg.is_ymm()
            || reg.is_zmm()
            || reg.is_k()
            || reg.is_cr() && !reads_cr
            || reg.is_dr()
            || reg.is_tr()
    });
    if outside || !i.cpuid_features().iter().all(|f| ENGINE_FEATURES.contains(f)) {
        return Class::HandedOver;
    }
    let fpu = FPU_STATE.contains(&m)
        || used.iter().any(|r| r.register().is_xmm() || r.register().is_mm() || r.register().is_st())
        || i.cpuid_features()
            .iter()
            .any(|f| matches!(f, CpuidFeature::FPU | CpuidFeature::FPU287 | CpuidFeature::FPU387 | CpuidFeature::MMX));
    Class::Runs(Needs { fpu, msrs: m == Mnemonic::Swapgs })
}

/// MOV from CR2 (SDM Vol. 2B, "MOV—Move to/from Control Registers"), where Linux's page-fault
/// handler reads the faulting address first: the engine holds the vCPU's CR2 through every run
/// (`state::start`). Not CR0, CR3 or CR4, which unicorn keeps as its own CPU model allows (it
/// drops CR4 bits its model lacks), nor the LOCK form, which reads CR8 (CR8LEG).
fn reads_cr2(i: &Instruction) -> bool {
    i.code() == Code::Mov_r64_cr && !i.has_lock_prefix() && i.op1_register() == Register::CR2
}

/// A REP string instruction whose iterations emon may run on guest memory itself (`rep_ahead`):
/// each stores an element of `size` bytes (RAX's low bytes for STOS, the element at RSI for
/// MOVS) at RDI, whatever the data (SDM Vol. 2B, REP/STOS/MOVS).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RepString {
    pub movs: bool,
    pub size: u8,
}

impl RepString {
    /// `i` as such an instruction, if it is one.
    pub fn of(i: &Instruction) -> Option<RepString> {
        let (movs, size) = match i.code() {
            Code::Stosb_m8_AL => (false, 1),
            Code::Stosw_m16_AX => (false, 2),
            Code::Stosd_m32_EAX => (false, 4),
            Code::Stosq_m64_RAX => (false, 8),
            Code::Movsb_m8_m8 => (true, 1),
            Code::Movsw_m16_m16 => (true, 2),
            Code::Movsd_m32_m32 => (true, 4),
            Code::Movsq_m64_m64 => (true, 8),
            _ => return None,
        };
        // ES:RDI, and DS:RSI (FS or GS would add a base).
        let plain = i.op0_kind() == OpKind::MemoryESRDI
            && (!movs || i.op1_kind() == OpKind::MemorySegRSI && i.memory_segment() == Register::DS);
        (i.has_rep_prefix() && plain).then_some(RepString { movs, size })
    }
}

/// Whether `i` may open the kernel's access to user-mode memory while SMAP is on (SDM Vol. 3A
/// 4.6.1): STAC sets RFLAGS.AC, and IRETQ and POPF may restore it. While a data breakpoint on
/// user-mode memory is armed the engine hands them over, so that kernel code with AC set is
/// stepped and its accesses checked (`Watch::user_data`).
pub fn opens_user_access(i: &Instruction) -> bool {
    matches!(i.mnemonic(), Mnemonic::Stac | Mnemonic::Popf | Mnemonic::Popfq | Mnemonic::Iret)
        || i.code() == Code::Iretq
}

/// Whether the engine runs `i` with nothing but the general and control registers loaded.
pub fn runs_in_engine(i: &Instruction, info: &mut InstructionInfoFactory) -> bool {
    classify(i, info) == Class::Runs(Needs::NONE)
}

/// A decoded block: each instruction's address and facts, whether the engine may run it, and
/// per armed counter what it adds when it retires whole.
#[derive(Debug, Clone)]
pub struct Block {
    pub insns: Vec<(u64, Insn)>,
    /// The last of them, kept here too: the block hook reads it each time the block retires,
    /// where `insns` is mostly out of the host's cache.
    pub last: Option<(u64, Insn)>,
    pub runnable: bool,
    /// What the block needs loaded that the run did not load (when that alone stops it).
    pub needs: Needs,
    /// What its runnable instructions need (the state the block may change).
    pub insns_need: Needs,
    /// The instruction that ends its runnable part, where the engine hands over.
    pub stops_at: Option<u64>,
    /// Its last instruction is IRETQ.
    pub ends_in_iret: bool,
    /// Its last instruction is STI.
    pub ends_in_sti: bool,
    /// Its last instruction is SYSRETQ.
    pub ends_in_sysret: bool,
    /// The block is `loop .` alone (LOOP to itself, counting in RCX): see `loop_ahead`.
    pub self_loop: bool,
    /// The block is a REP STOS or REP MOVS alone, with 64-bit addresses and no segment
    /// override: see `rep_ahead`.
    pub rep_string: Option<RepString>,
    /// It has an INVLPG.
    pub flushes_tlb: bool,
    /// Each of its reads of the TSC (RDTSC or RDTSCP) in the engine, and the core cycles of the
    /// instructions before it in the block (the cost model): where a run reads the model's time,
    /// the model clock there.
    pub tsc_at: Vec<(u64, u64)>,
    /// Per armed counter: the events of every instruction but the last.
    pub body: Vec<u64>,
    /// Per armed counter: the last instruction's events when it branches and when it does not.
    pub last_taken: Vec<u64>,
    pub last_not: Vec<u64>,
    /// Core cycles: every instruction but the last, and the last when it branches or not.
    pub cycles_body: u64,
    pub cycles_taken: u64,
    pub cycles_not: u64,
    /// The armed counters, and whether each counts at the run's privilege level, that the sums
    /// above are for: a run that arms the same finds them made.
    pub summed_for: Option<(Vec<Armed>, Vec<bool>)>,
    /// The most cache lines its data accesses can touch (counted only with a cache model).
    pub lines: u64,
    /// What it was decoded from and for: the guest-physical pages of its first and last byte,
    /// and the run's cache model, loaded state and what it withholds (see [`decode_block`]).
    pub from: [Option<u64>; 2],
    pub decoded_for: (bool, Needs, Withheld),
    /// The run's conditions its instructions are subject to: a run that withholds otherwise
    /// only where these are the same decodes it alike (runs at CPL0 with and without a window on
    /// the TSC share every block that does not read it).
    pub deciding: Withheld,
    /// The size of the translated block it was decoded for (TCG translates code it has seen
    /// written again, often to another size).
    pub size: u32,
    /// The run that last entered it (its sums are that run's).
    pub seen: u64,
    /// The blocks control went on to after it last, by address and index in the blocks: the
    /// block hook finds the next block here before it looks it up.
    pub next: [Option<(u64, u32)>; 2],
}

impl Block {
    /// Whether it reads the TSC in the engine.
    pub fn reads_tsc(&self) -> bool {
        !self.tsc_at.is_empty()
    }

    /// Whether the block serves a run that enters `size` bytes from the pages `from`, decoded for
    /// `wanted` (see [`decode_block`]).
    pub fn serves(&self, from: [Option<u64>; 2], wanted: (bool, Needs, Withheld), size: u32) -> bool {
        let (cache, loaded, withheld) = self.decoded_for;
        self.from == from
            && self.size == size
            && cache == wanted.0
            && loaded.alike(wanted.1, self.insns_need, self.needs)
            && withheld.alike(wanted.2, self.deciding)
    }

    /// Sums what the block adds to each armed counter (`counting`: the counter counts at the
    /// run's privilege level).
    pub fn sums(&mut self, armed: &[Armed], counting: &[bool]) {
        if self.summed_for.as_ref().is_some_and(|(a, c)| a[..] == *armed && c[..] == *counting) {
            return;
        }
        let n = self.insns.len();
        let per = |a: &Armed, on: bool, (rip, i): &(u64, Insn), taken: bool| {
            if on {
                a.per_instruction(a.semantics.increment(i, *rip, taken))
            } else {
                0
            }
        };
        self.body = armed
            .iter()
            .zip(counting)
            .map(|(a, on)| self.insns[..n.saturating_sub(1)].iter().map(|x| per(a, *on, x, false)).sum())
            .collect();
        let last = self.insns.last();
        self.last_taken = armed.iter().zip(counting).map(|(a, on)| last.map_or(0, |x| per(a, *on, x, true))).collect();
        self.last_not = armed.iter().zip(counting).map(|(a, on)| last.map_or(0, |x| per(a, *on, x, false))).collect();
        self.summed_for = Some((armed.to_vec(), counting.to_vec()));
    }
}

/// Decodes the block of `size` bytes at linear `addr` for a run that loaded `loaded`.
/// With `cache` (the cache model counts), an instruction whose data accesses cannot be known
/// before it runs (a REP string instruction) ends the runnable part: it is stepped. What the run
/// withholds is handed over ([`class_in`]).
pub fn decode_block(
    mode: &CpuMode,
    mem: &GuestMemoryMmap,
    (addr, size): (u64, usize),
    cache: bool,
    loaded: Needs,
    withheld: Withheld,
) -> Block {
    let mut bytes = Vec::with_capacity(size + 15);
    let mut a = addr;
    while bytes.len() < size + 15 {
        let chunk = mode.fetch(mem, a);
        if chunk.is_empty() {
            break;
        }
        a += chunk.len() as u64;
        bytes.extend(chunk);
    }
    let mut insns = Vec::new();
    let mut runnable = true;
    let mut needs = Needs::NONE;
    let mut insns_need = Needs::NONE;
    let mut stops_at = None;
    let mut lines = 0;
    let mut self_loop = false;
    let mut ends_in_iret = false;
    let mut ends_in_sti = false;
    let mut ends_in_sysret = false;
    let mut flushes_tlb = false;
    let mut tsc_at = Vec::new();
    let mut deciding = Withheld::default();
    // The first two instructions, to tell a lone one.
    let mut single: Vec<Instruction> = Vec::with_capacity(2);
    let mut d = Decoder::with_ip(64, &bytes, addr, DecoderOptions::NONE);
    let mut info = InstructionInfoFactory::new();
    while d.ip() < addr + size as u64 {
        let i = d.decode();
        // The smallest line a profile may have: the bound holds whatever the profile's line.
        let accesses = if cache { access::max_lines(&i, MIN_CACHE_LINE).ok() } else { Some(0) };
        let class = class_in(&i, &mut info, withheld);
        deciding = deciding.union(Withheld::deciding(&i));
        match (i.is_invalid(), class, accesses) {
            (false, Class::Runs(n), Some(l)) if n.met_by(loaded) => {
                lines += l;
                insns_need = insns_need.union(n);
                self_loop = i.code() == Code::Loop_rel8_64_RCX && i.near_branch_target() == i.ip();
                ends_in_iret = i.code() == Code::Iretq;
                ends_in_sti = i.mnemonic() == Mnemonic::Sti;
                ends_in_sysret = i.code() == Code::Sysretq;
                flushes_tlb |= i.mnemonic() == Mnemonic::Invlpg;
                if reads_tsc(&i) {
                    tsc_at.push((i.ip(), insns.iter().map(|(_, x)| cycles(x, false)).sum()));
                }
                insns.push((i.ip(), insn::of(&i)));
                if single.len() < 2 {
                    single.push(i);
                }
            }
            (false, Class::Runs(n), Some(_)) => {
                needs = n;
                runnable = false;
                break;
            }
            _ => {
                runnable = false;
                // Where the engine hands over (not where only this run's cache model stops it).
                stops_at = (class == Class::HandedOver).then_some(i.ip());
                break;
            }
        }
    }
    let self_loop = self_loop && insns.len() == 1;
    let rep_string = match (&single[..], runnable) {
        ([i], true) => RepString::of(i),
        _ => None,
    };
    // Core cycles, whatever counts: the model clock runs on them in every run that keeps it.
    let n = insns.len();
    let cycles_body = insns[..n.saturating_sub(1)].iter().map(|(_, i)| cycles(i, false)).sum();
    let (cycles_taken, cycles_not) = insns.last().map_or((0, 0), |(_, i)| (cycles(i, true), cycles(i, false)));
    Block {
        last: insns.last().copied(),
        insns,
        runnable,
        needs,
        insns_need,
        stops_at,
        ends_in_iret,
        ends_in_sti,
        ends_in_sysret,
        self_loop,
        rep_string,
        flushes_tlb,
        tsc_at,
        body: Vec::new(),
        last_taken: Vec::new(),
        last_not: Vec::new(),
        cycles_body,
        cycles_taken,
        cycles_not,
        summed_for: None,
        lines,
        from: [None; 2],
        decoded_for: (cache, loaded, withheld),
        deciding,
        size: size as u32,
        seen: 0,
        next: [None; 2],
    }
}
