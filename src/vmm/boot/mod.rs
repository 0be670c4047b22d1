//! The CPU state kernels are entered with: 64-bit long mode for ELF64 kernels and Linux bzImages,
//! 32-bit protected mode for multiboot and PVH kernels.
mod gdt;
pub mod mptable;
mod paging;

use super::layout::*;
use kvm_bindings::{kvm_regs, kvm_sregs};
use kvm_ioctls::VcpuFd;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

pub use gdt::Mode;

const CR0_PE: u64 = 1 << 0;
const CR0_MP: u64 = 1 << 1;
const CR0_ET: u64 = 1 << 4;
const CR0_NE: u64 = 1 << 5;
const CR0_WP: u64 = 1 << 16;
const CR0_PG: u64 = 1 << 31;
const CR4_PAE: u64 = 1 << 5;
const CR4_OSFXSR: u64 = 1 << 9;
const CR4_OSXMMEXCPT: u64 = 1 << 10;
const EFER_LME: u64 = 1 << 8;
const EFER_LMA: u64 = 1 << 10;
const EFER_NXE: u64 = 1 << 11;
const RFLAGS_RESERVED: u64 = 1 << 1;

/// Register values for entry, beyond what the mode implies.
#[derive(Debug, Clone, Copy)]
pub struct Entry {
    pub mode: Mode,
    pub rip: u64,
    pub rax: u64,
    pub rbx: u64,
    pub rdi: u64,
    pub rsi: u64,
    pub rsp: u64,
}

/// Writes the GDT (and, for long mode, the page tables) and loads the vCPU's registers.
pub fn enter(vcpu: &VcpuFd, mem: &GuestMemoryMmap, ram_size: u64, e: &Entry) -> Result<(), super::VmmError> {
    let kvm = |op| move |source| super::VmmError::Kvm { op, source };
    let mut sregs: kvm_sregs = vcpu.get_sregs().map_err(kvm("KVM_GET_SREGS"))?;
    gdt::install(mem, &mut sregs, e.mode)?;
    match e.mode {
        Mode::Long | Mode::LinuxLong => {
            paging::install(mem, ram_size)?;
            sregs.cr3 = PML4_ADDR;
            // Long mode with SSE usable: the guest runtime's Rust code needs it.
            sregs.cr0 = CR0_PE | CR0_MP | CR0_ET | CR0_NE | CR0_WP | CR0_PG;
            sregs.cr4 = CR4_PAE | CR4_OSFXSR | CR4_OSXMMEXCPT;
            sregs.efer = EFER_LME | EFER_LMA | EFER_NXE;
        }
        Mode::Protected => {
            // Multiboot spec 3.2 and the PVH ABI alike: protected mode, paging off, flat 4 GiB
            // segments.
            sregs.cr0 = CR0_PE | CR0_ET;
            sregs.cr4 = 0;
            sregs.efer = 0;
        }
    }
    vcpu.set_sregs(&sregs).map_err(kvm("KVM_SET_SREGS"))?;
    let regs = kvm_regs {
        rip: e.rip,
        rax: e.rax,
        rbx: e.rbx,
        rdi: e.rdi,
        rsi: e.rsi,
        rsp: e.rsp,
        rflags: RFLAGS_RESERVED,
        ..Default::default()
    };
    vcpu.set_regs(&regs).map_err(kvm("KVM_SET_REGS"))
}

pub(crate) fn write(mem: &GuestMemoryMmap, addr: u64, bytes: &[u8]) -> Result<(), super::VmmError> {
    mem.write_slice(bytes, GuestAddress(addr)).map_err(|source| super::VmmError::MemoryWrite {
        addr,
        len: bytes.len(),
        source,
    })
}
