//! CPUID, RDMSR/WRMSR, RDPMC and control-register helpers.
use core::arch::asm;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cpuid {
    pub eax: u32,
    pub ebx: u32,
    pub ecx: u32,
    pub edx: u32,
}

pub fn cpuid(leaf: u32, subleaf: u32) -> Cpuid {
    // SAFETY: CPUID is always available in long mode.
    let r = core::arch::x86_64::__cpuid_count(leaf, subleaf);
    Cpuid { eax: r.eax, ebx: r.ebx, ecx: r.ecx, edx: r.edx }
}

/// The CPUID vendor string (leaf 0: EBX, EDX, ECX).
pub fn vendor() -> [u8; 12] {
    let r = cpuid(0, 0);
    let mut v = [0u8; 12];
    v[0..4].copy_from_slice(&r.ebx.to_le_bytes());
    v[4..8].copy_from_slice(&r.edx.to_le_bytes());
    v[8..12].copy_from_slice(&r.ecx.to_le_bytes());
    v
}

pub fn max_leaf() -> u32 {
    cpuid(0, 0).eax
}

/// RDMSR. Faults with #GP on an MSR that does not exist: wrap in [`crate::catch`] to test that.
pub fn rdmsr(msr: u32) -> u64 {
    let (lo, hi): (u32, u32);
    // SAFETY: the caller chooses the MSR; a #GP is handled by the runtime's IDT.
    unsafe { asm!("rdmsr", in("ecx") msr, out("eax") lo, out("edx") hi, options(nostack)) }
    ((hi as u64) << 32) | lo as u64
}

/// WRMSR of EDX:EAX = value.
pub fn wrmsr(msr: u32, value: u64) {
    // SAFETY: as for rdmsr.
    unsafe {
        asm!("wrmsr", in("ecx") msr, in("eax") value as u32, in("edx") (value >> 32) as u32,
             options(nostack))
    }
}

pub fn rdpmc(index: u32) -> u64 {
    let (lo, hi): (u32, u32);
    // SAFETY: as for rdmsr.
    unsafe { asm!("rdpmc", in("ecx") index, out("eax") lo, out("edx") hi, options(nostack)) }
    ((hi as u64) << 32) | lo as u64
}

/// RDMSR that returns the exception instead of faulting.
pub fn rdmsr_safe(msr: u32) -> Result<u64, crate::Exception> {
    let mut v = 0;
    match crate::catch(|| v = rdmsr(msr)) {
        None => Ok(v),
        Some(e) => Err(e),
    }
}

/// WRMSR that returns the exception instead of faulting.
pub fn wrmsr_safe(msr: u32, value: u64) -> Result<(), crate::Exception> {
    match crate::catch(|| wrmsr(msr, value)) {
        None => Ok(()),
        Some(e) => Err(e),
    }
}

pub fn read_cr0() -> u64 {
    let v;
    // SAFETY: reading a control register at CPL0.
    unsafe { asm!("mov {}, cr0", out(reg) v, options(nomem, nostack)) }
    v
}

pub fn read_cr4() -> u64 {
    let v;
    // SAFETY: reading a control register at CPL0.
    unsafe { asm!("mov {}, cr4", out(reg) v, options(nomem, nostack)) }
    v
}

pub fn write_cr4(v: u64) {
    // SAFETY: the caller keeps the paging/SSE bits emon set.
    unsafe { asm!("mov cr4, {}", in(reg) v, options(nostack)) }
}

pub fn enable_interrupts() {
    // SAFETY: the runtime's IDT covers every vector.
    unsafe { asm!("sti", options(nomem, nostack)) }
}

pub fn disable_interrupts() {
    // SAFETY: always allowed at CPL0.
    unsafe { asm!("cli", options(nomem, nostack)) }
}

/// Prevents the compiler from reordering memory accesses across this point.
pub fn barrier() {
    core::sync::atomic::compiler_fence(core::sync::atomic::Ordering::SeqCst);
}
