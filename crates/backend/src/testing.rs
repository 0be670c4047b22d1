//! A scripted vCPU for the backends' unit tests: the test sets the registers, the CPU mode and
//! guest memory, and reads back what the backend did to them.
use crate::{Vcpu, VcpuError};
use emon_x86::mode::CpuMode;
use kvm_bindings::{kvm_regs, kvm_sregs};
use vm_memory::GuestMemoryMmap;

/// A vCPU whose state the test sets.
pub struct Script {
    pub mem: GuestMemoryMmap,
    pub regs: kvm_regs,
    /// The segment and system registers as set (the CPU mode is `mode`, set apart).
    pub sregs: kvm_sregs,
    pub mode: CpuMode,
    pub single_step: bool,
    pub halted: bool,
    /// STI's interrupt shadow, where an STI that retired outside the vCPU left it.
    pub sti_shadow: bool,
    pub injected: Vec<(u8, Option<u32>)>,
    /// The guest's TSC, which the test moves on by hand (`tsc_settable`: whether
    /// `set_guest_tsc` may change it, as on a host with KVM_VCPU_TSC_OFFSET).
    pub tsc: u64,
    pub tsc_settable: bool,
    /// IA32_TSC_DEADLINE as KVM holds it (on KVM's side of the guest's time).
    pub tsc_deadline: u64,
    /// The engine's window on the guest's TSC (`Vcpu::tsc_window`), and the last value given.
    pub tsc_window: Option<crate::TscWindow>,
    pub tsc_given: u64,
    /// The local APIC's register page, and the NMIs queued.
    pub lapic: [u8; 1024],
    /// The vectors of the devices' interrupts (`Vcpu::device_vectors`).
    pub device_vectors: [u64; 4],
    pub nmis: u32,
    /// Events KVM would deliver at the next entries, one per `due_event` (`None`: nothing due),
    /// how many times the backend asked, and the event handed back for the next entry.
    pub due_events: std::collections::VecDeque<Option<crate::DueEvent>>,
    pub event_probes: u32,
    pub queued_event: Option<crate::DueEvent>,
    /// How many times the backend had the guest's cached translations dropped.
    pub tlb_flushes: u32,
    /// The guest's DR0-DR3, DR6 and DR7.
    pub dr: [u64; 4],
    pub dr6: u64,
    pub dr7: u64,
    /// Other MSRs the guest has set (the SYSCALL MSRs), read back as set; 0 where unset.
    pub msrs: std::collections::BTreeMap<u32, u64>,
}

impl Vcpu for Script {
    fn regs(&mut self) -> Result<kvm_regs, VcpuError> {
        Ok(self.regs)
    }
    fn set_regs(&mut self, regs: &kvm_regs) -> Result<(), VcpuError> {
        self.regs = *regs;
        Ok(())
    }
    fn sregs(&mut self) -> Result<kvm_sregs, VcpuError> {
        Ok(self.sregs)
    }
    fn set_sregs(&mut self, sregs: &kvm_sregs) -> Result<(), VcpuError> {
        self.sregs = *sregs;
        Ok(())
    }
    fn end_nmi_blocking(&mut self) -> Result<(), VcpuError> {
        Ok(())
    }
    fn mode(&mut self) -> Result<CpuMode, VcpuError> {
        Ok(self.mode)
    }
    fn set_single_step(&mut self, on: bool) -> Result<(), VcpuError> {
        self.single_step = on;
        Ok(())
    }
    fn halt(&mut self) -> Result<(), VcpuError> {
        self.halted = true;
        Ok(())
    }
    fn set_interrupt_shadow(&mut self, sti: bool) -> Result<(), VcpuError> {
        self.sti_shadow = sti;
        Ok(())
    }
    fn guest_breakpoints(&mut self) -> Result<emon_x86::debug::Breakpoints, VcpuError> {
        Ok(emon_x86::debug::Breakpoints { addr: self.dr, dr7: self.dr7 })
    }
    fn add_debug_status(&mut self, status: u64) -> Result<(), VcpuError> {
        self.dr6 |= status;
        Ok(())
    }
    fn flush_tlb(&mut self) -> Result<(), VcpuError> {
        self.tlb_flushes += 1;
        Ok(())
    }
    fn inject_exception(&mut self, vector: u8, error_code: Option<u32>) -> Result<(), VcpuError> {
        self.injected.push((vector, error_code));
        Ok(())
    }
    fn memory(&self) -> &GuestMemoryMmap {
        &self.mem
    }
    fn lapic(&mut self) -> Result<[u8; 1024], VcpuError> {
        Ok(self.lapic)
    }
    fn device_vectors(&mut self) -> Result<[u64; 4], VcpuError> {
        Ok(self.device_vectors)
    }
    fn set_lapic(&mut self, page: &[u8; 1024], read: &[u8; 1024]) -> Result<(), VcpuError> {
        // Nothing requests interrupts behind the script's back: what it holds is what was read.
        assert_eq!(&self.lapic, read, "the page written back was read from this APIC");
        self.lapic = *page;
        Ok(())
    }
    fn nmi(&mut self) -> Result<(), VcpuError> {
        self.nmis += 1;
        Ok(())
    }
    fn due_event(&mut self) -> Result<Option<crate::DueEvent>, VcpuError> {
        self.event_probes += 1;
        Ok(self.due_events.pop_front().flatten())
    }
    fn queue_event(&mut self, event: crate::DueEvent) -> Result<(), VcpuError> {
        self.queued_event = Some(event);
        Ok(())
    }
    fn get_msr(&mut self, index: u32) -> Result<u64, VcpuError> {
        Ok(match index {
            emon_x86::arch::IA32_TSC => self.tsc,
            emon_x86::arch::IA32_TSC_DEADLINE => self.tsc_deadline,
            _ => self.msrs.get(&index).copied().unwrap_or(0),
        })
    }
    fn set_msr(&mut self, index: u32, value: u64) -> Result<(), VcpuError> {
        assert_eq!(index, emon_x86::arch::IA32_TSC_DEADLINE, "the backends set no other MSR");
        self.tsc_deadline = value;
        Ok(())
    }
    fn tsc_window(&mut self) -> Result<Option<crate::TscWindow>, VcpuError> {
        Ok(self.tsc_window)
    }

    fn tsc_given(&mut self, value: u64) {
        self.tsc_given = self.tsc_given.max(value);
    }

    fn set_guest_tsc(&mut self, value: u64) -> Result<bool, VcpuError> {
        if self.tsc_settable {
            self.tsc = value;
        }
        Ok(self.tsc_settable)
    }
    fn wait_for_guest_tsc(&mut self, value: u64, _limit: std::time::Duration) -> Result<u64, VcpuError> {
        self.tsc = self.tsc.max(value);
        Ok(self.tsc)
    }
}

impl Script {
    /// A vCPU over `mem`, all registers zero.
    pub fn new(mem: GuestMemoryMmap) -> Script {
        Script {
            mem,
            regs: kvm_regs::default(),
            sregs: kvm_sregs::default(),
            mode: CpuMode::default(),
            single_step: false,
            halted: false,
            sti_shadow: false,
            injected: Vec::new(),
            tsc: 0,
            tsc_deadline: 0,
            tsc_window: None,
            tsc_given: 0,
            tsc_settable: true,
            lapic: [0; 1024],
            device_vectors: [0; 4],
            nmis: 0,
            due_events: Default::default(),
            event_probes: 0,
            queued_event: None,
            dr: [0; 4],
            dr6: 0xFFFF_0FF0,
            dr7: 0x400,
            tlb_flushes: 0,
            msrs: Default::default(),
        }
    }
}
