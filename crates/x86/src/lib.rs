//! The x86 side of a guest, as emon sees it from outside the vCPU.
//!
//! - [`arch`]: exception vectors and the non-PMU MSRs a VMM touches, one home each.
//! - [`mode`]: the CPU mode that matters at an instruction boundary (CPL, code size, paging) and
//!   reading guest memory at a linear address through the guest's page tables.
//! - [`insn`]: what counting needs to know about an instruction (length, control flow, memory
//!   operands, the instructions a VMM must handle itself), decoded with iced-x86.
//! - [`access`]: the data accesses of an instruction (linear address, size, read/write/flush)
//!   from the registers before it executes, for the precise backend's cache model.
//! - [`fpu`]: the x87/MMX/SSE state as FXSAVE and XSAVE lay it out.
//! - [`debug`]: the guest's own breakpoints (DR0-DR3, DR7), which an instruction meets.
pub mod access;
pub mod arch;
pub mod debug;
pub mod deliver;
pub mod fpu;
pub mod insn;
pub mod mode;
