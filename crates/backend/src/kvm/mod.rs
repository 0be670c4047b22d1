//! KVM glue for a VMM that embeds the virtual PMU: [`KvmVcpu`], the backends' [`Vcpu`] over a
//! KVM vCPU file descriptor (the PMI goes through its in-kernel local APIC); [`trap_pmu_msrs`],
//! which sends every PMU MSR access to userspace; and [`apply_guest_debug`], the vCPU's one
//! KVM_SET_GUEST_DEBUG control.
pub mod event_probe;
mod regs;
pub mod tsc;
pub mod xsave;

use crate::guest_debug::GuestDebug;
use crate::{host_tsc, lapic, TscWindow, Vcpu, VcpuError};
use emon_pmu::pmu::Pmu;
use emon_x86::arch::{IA32_TSC_AUX, RFLAGS_IF};
use emon_x86::fpu::Fpu;
use kvm_bindings::{
    kvm_device_attr, kvm_enable_cap, kvm_mp_state, kvm_msr_entry, kvm_regs, kvm_sregs, kvm_vcpu_events, Msrs,
    KVM_CAP_X86_USER_SPACE_MSR, KVM_MP_STATE_HALTED, KVM_MSR_EXIT_REASON_FILTER, KVM_MSR_EXIT_REASON_INVAL,
    KVM_MSR_EXIT_REASON_UNKNOWN, KVM_VCPUEVENT_VALID_SHADOW, KVM_VCPU_TSC_CTRL, KVM_VCPU_TSC_OFFSET,
};
use kvm_ioctls::{MsrFilterDefaultAction, MsrFilterRange, MsrFilterRangeFlags, VcpuFd, VmFd};
use std::time::{Duration, Instant};
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::ioctl::ioctl_with_ref;

/// Makes RDMSR/WRMSR of every MSR in [`Pmu::TRAPPED_MSRS`] (and no other) exit to userspace
/// (`KVM_EXIT_X86_RDMSR`/`WRMSR`), whatever the profile, so that an MSR the profile lacks still
/// reaches the model and gets #GP: `KVM_CAP_X86_USER_SPACE_MSR` for unknown, invalid and filtered
/// MSRs, and a `KVM_X86_SET_MSR_FILTER` that allows everything else. Without the filter KVM
/// answers some PMU MSRs itself (on kvm_pvm: the P6 perf MSRs and DEBUGCTL, README).
pub fn trap_pmu_msrs(vm: &VmFd) -> Result<(), VcpuError> {
    let reasons = KVM_MSR_EXIT_REASON_INVAL | KVM_MSR_EXIT_REASON_UNKNOWN | KVM_MSR_EXIT_REASON_FILTER;
    let cap =
        kvm_enable_cap { cap: KVM_CAP_X86_USER_SPACE_MSR, args: [u64::from(reasons), 0, 0, 0], ..Default::default() };
    vm.enable_cap(&cap).map_err(VcpuError::op("KVM_ENABLE_CAP(KVM_CAP_X86_USER_SPACE_MSR)"))?;
    let spans = filter_spans(Pmu::TRAPPED_MSRS);
    let ranges: Vec<MsrFilterRange> = spans
        .iter()
        .map(|span| MsrFilterRange {
            flags: MsrFilterRangeFlags::READ | MsrFilterRangeFlags::WRITE,
            base: span.base,
            msr_count: span.count,
            bitmap: &span.bitmap,
        })
        .collect();
    vm.set_msr_filter(MsrFilterDefaultAction::ALLOW, &ranges).map_err(VcpuError::op("KVM_X86_SET_MSR_FILTER"))
}

/// One range of the MSR filter: `count` MSRs from `base`, bit i of `bitmap` set where KVM keeps
/// handling MSR `base + i` and clear where the access exits to userspace.
#[derive(Debug, PartialEq, Eq)]
pub struct FilterSpan {
    pub base: u32,
    pub count: u32,
    pub bitmap: Vec<u8>,
}

/// KVM_MSR_FILTER_MAX_RANGES: the most ranges one KVM_X86_SET_MSR_FILTER takes.
pub const MAX_FILTER_RANGES: usize = 16;
/// The widest span of MSRs one filter range covers when nearby trapped ranges are merged.
const MAX_SPAN: u32 = 0x400;

/// The filter ranges that trap exactly the MSRs of `trapped` (inclusive ranges in increasing
/// order): nearby ranges share one filter range, whose bitmap lets KVM keep the MSRs between
/// them, so that the PMU's many small ranges fit KVM's [`MAX_FILTER_RANGES`].
pub fn filter_spans(trapped: &[(u32, u32)]) -> Vec<FilterSpan> {
    let mut spans: Vec<FilterSpan> = Vec::new();
    for &(first, last) in trapped {
        let span = match spans.last_mut() {
            Some(span) if last - span.base < MAX_SPAN => span,
            _ => {
                spans.push(FilterSpan { base: first, count: 0, bitmap: Vec::new() });
                spans.last_mut().expect("just pushed")
            }
        };
        span.count = last - span.base + 1;
        span.bitmap.resize(span.count.div_ceil(8) as usize, 0xFF);
        for i in (first - span.base)..=(last - span.base) {
            span.bitmap[(i / 8) as usize] &= !(1 << (i % 8));
        }
    }
    spans
}

/// Gives KVM the vCPU's guest-debug control (KVM_SET_GUEST_DEBUG) if it changed since it was
/// last given: single-stepping and the #GP handler's breakpoint in one control.
pub fn apply_guest_debug(fd: &VcpuFd, debug: &mut GuestDebug) -> Result<(), VcpuError> {
    let Some(g) = debug.take_change() else { return Ok(()) };
    fd.set_guest_debug(&g).map_err(|e| {
        debug.forget_applied();
        VcpuError { op: "KVM_SET_GUEST_DEBUG", source: e }
    })
}

/// A KVM vCPU as emon drives it: its file descriptor, its one guest-debug control, how it hands
/// out the x87/SSE state, and its registers as of the last exit (see [`regs`]). Every register
/// read and write goes through it.
pub struct KvmCpu {
    pub fd: VcpuFd,
    /// The vCPU's guest-debug control, which single-stepping shares with other users.
    pub debug: GuestDebug,
    /// How this KVM hands out the x87/SSE state (`None`: no XSAVE, the FPU ioctls).
    pub xsave: Option<xsave::XsaveAbi>,
    regs: regs::RegCache,
    /// This KVM keeps single-stepping across a KVM_SET_REGS that moves RIP (kvm_pvm does; KVM on
    /// VMX and SVM does not): measured by the VMM, assumed not until told.
    pub step_survives_set_regs: bool,
    /// The CPUID table the VMM set (KVM_SET_CPUID2), which some hosts override in KVM's copy.
    pub cpuid: Vec<kvm_bindings::kvm_cpuid_entry2>,
    /// How the vCPU's thread asks KVM for the event due at the next entry, once it installed it.
    pub event_probe: Option<event_probe::EventProbe>,
    /// The VM's file descriptor (a duplicate), for the in-kernel PIC's state.
    pub vm: Option<std::os::fd::OwnedFd>,
    /// The guest flushed translations outside the vCPU (an INVLPG emon retired): KVM drops its
    /// cached ones before the next entry ([`Self::flush_guest_tlb`]).
    tlb_stale: bool,
    /// The guest's TSC as the host's plus an offset, for the TCG engine ([`TscWindow`]).
    pub tsc: tsc::HostTsc,
}

/// CPUID bits KVM updates as the guest runs, as (leaf, sub-leaf, register 0-3, mask):
/// CPUID.01H:ECX.OSXSAVE (CR4.OSXSAVE), CPUID.(EAX=07H,ECX=0):ECX.OSPKE (CR4.PKE), and the
/// XSAVE area sizes in EBX of leaf 0DH's sub-leaves 0 and 1, which follow XCR0 and IA32_XSS.
const LIVE_CPUID: [(u32, u32, usize, u32); 4] =
    [(1, 0, 2, 1 << 27), (7, 0, 2, 1 << 4), (0xD, 0, 1, u32::MAX), (0xD, 1, 1, u32::MAX)];

impl KvmCpu {
    pub fn new(kvm: &kvm_ioctls::Kvm, mut fd: VcpuFd, debug: GuestDebug, xsave: Option<xsave::XsaveAbi>) -> KvmCpu {
        let regs = regs::RegCache::new(kvm, &mut fd);
        KvmCpu {
            fd,
            debug,
            xsave,
            regs,
            step_survives_set_regs: false,
            cpuid: Vec::new(),
            event_probe: None,
            vm: None,
            tlb_stale: false,
            tsc: tsc::HostTsc::default(),
        }
    }

    /// The vCPU with its guest memory, as the backends drive it.
    pub fn with<'a>(&'a mut self, mem: &'a GuestMemoryMmap) -> KvmVcpu<'a> {
        KvmVcpu { cpu: self, mem }
    }

    /// KVM_RUN.
    pub fn run(&mut self) -> Result<kvm_ioctls::VcpuExit<'_>, vmm_sys_util::errno::Error> {
        if std::mem::take(&mut self.tlb_stale) {
            self.flush_guest_tlb().map_err(|e| e.source)?;
        }
        self.regs.ran(true);
        self.tsc.before_entry();
        let r = self.fd.run();
        self.tsc.after_exit(self.debug.step);
        if r.as_ref().is_err_and(|e| e.errno() != libc::EINTR) {
            // An error before KVM stored the registers: read them anew. (A kick's EINTR comes
            // through the end of KVM_RUN, which stores them.)
            self.regs.ran(false);
        }
        r
    }

    /// vCPU ioctls made for register reads and writes, which `kvm_run` and the cache spare most
    /// of (KVM_RUN not included).
    pub fn register_ioctls(&self) -> u64 {
        self.regs.ioctls
    }

    /// The vCPU's file descriptor for an ioctl that may read the register sets written into
    /// `kvm_run`: they go to KVM first.
    fn fd_synced(&mut self) -> Result<&VcpuFd, VcpuError> {
        self.regs.flush(&mut self.fd)?;
        Ok(&self.fd)
    }

    /// The vCPU's file descriptor for KVM_GET_MSRS or KVM_SET_MSRS of `indices`: synced first if
    /// one of them is also in the segment and control registers' set.
    fn fd_for_msrs<'a>(&mut self, indices: impl IntoIterator<Item = &'a u32>) -> Result<&VcpuFd, VcpuError> {
        if indices.into_iter().any(|i| regs::SREGS_MSRS.contains(i)) {
            return self.fd_synced();
        }
        Ok(&self.fd)
    }

    /// The debug registers (DR0-DR3, DR6, DR7), read once until the next KVM_RUN.
    pub fn debug_regs(&mut self) -> Result<kvm_bindings::kvm_debugregs, VcpuError> {
        self.regs.debug_regs(&mut self.fd)
    }

    pub fn set_debug_regs(&mut self, d: &kvm_bindings::kvm_debugregs) -> Result<(), VcpuError> {
        self.regs.set_debug_regs(&mut self.fd, d)
    }

    /// MSRs `indices` as KVM has them (those of [`regs::CACHED_MSRS`] read once until the next
    /// KVM_RUN).
    pub fn get_msrs(&mut self, indices: &[u32]) -> Result<Vec<u64>, VcpuError> {
        let failed = || VcpuError { op: "KVM_GET_MSRS", source: vmm_sys_util::errno::Error::new(libc::EINVAL) };
        let cached: Vec<Option<u64>> = indices.iter().map(|&i| self.regs.msr(i)).collect();
        let missing: Vec<kvm_msr_entry> = indices
            .iter()
            .zip(&cached)
            .filter(|(_, c)| c.is_none())
            .map(|(&index, _)| kvm_msr_entry { index, ..Default::default() })
            .collect();
        let mut read = Vec::new();
        if !missing.is_empty() {
            let mut msrs = Msrs::from_entries(&missing).map_err(|_| failed())?;
            self.regs.ioctls += 1;
            if self.fd_for_msrs(indices)?.get_msrs(&mut msrs).map_err(VcpuError::op("KVM_GET_MSRS"))? != missing.len() {
                return Err(failed());
            }
            read = msrs.as_slice().iter().map(|e| (e.index, e.data)).collect();
            for &(index, data) in &read {
                self.regs.keep_msr(index, data);
            }
        }
        let mut read = read.into_iter();
        Ok(cached.into_iter().map(|c| c.unwrap_or_else(|| read.next().expect("one per missing MSR").1)).collect())
    }

    /// Sets MSRs as the VMM (a host-initiated KVM_SET_MSRS); EINVAL when KVM does not take one.
    pub fn set_msrs(&mut self, values: &[(u32, u64)]) -> Result<(), VcpuError> {
        let failed = || VcpuError { op: "KVM_SET_MSRS", source: vmm_sys_util::errno::Error::new(libc::EINVAL) };
        let entries: Vec<kvm_msr_entry> =
            values.iter().map(|&(index, data)| kvm_msr_entry { index, data, ..Default::default() }).collect();
        let msrs = Msrs::from_entries(&entries).map_err(|_| failed())?;
        self.regs.ioctls += 1;
        let taken =
            self.fd_for_msrs(values.iter().map(|(i, _)| i))?.set_msrs(&msrs).map_err(VcpuError::op("KVM_SET_MSRS"))?;
        for &(index, data) in &values[..taken.min(values.len())] {
            self.regs.keep_msr(index, data);
        }
        if taken != values.len() {
            return Err(failed());
        }
        Ok(())
    }

    /// Takes the interrupt or NMI due at this instruction boundary, as the CPU takes one when
    /// it delivers it (an NMI's blocking begins; an interrupt goes from the local APIC's IRR to
    /// its ISR), without running a guest instruction: which one, if any. `None` where the vCPU's
    /// thread has no [`event_probe`].
    ///
    /// An expired local-APIC timer reaches the IRR only inside KVM_RUN, so the probe runs one
    /// that stops short of the entry, with RFLAGS.IF clear and NMIs masked meanwhile so that KVM
    /// delivers nothing itself (a host may deliver an event when it injects it, before the entry
    /// it then cancels); then emon decides, from the APIC's registers, what the CPU would take.
    pub fn due_event(&mut self) -> Result<Option<crate::DueEvent>, VcpuError> {
        let Some(probe) = self.event_probe.take() else { return Ok(None) };
        // The probe runs no guest instruction: the debug registers and MSRs read stay.
        let kept = self.regs.kept();
        let regs = self.regs()?;
        let events = self.events()?;
        self.set_regs(&kvm_regs { rflags: regs.rflags & !RFLAGS_IF, ..regs })?;
        self.set_events(&kvm_vcpu_events {
            nmi: kvm_bindings::kvm_vcpu_events__bindgen_ty_3 { masked: 1, ..events.nmi },
            ..events
        })?;
        let ran = probe.raise().and_then(|()| match self.run() {
            Err(e) if e.errno() == libc::EINTR => Ok(()),
            Err(source) => Err(VcpuError { op: "KVM_RUN (the event probe)", source }),
            // The signal was pending before the entry: KVM never enters the guest with one.
            Ok(_) => Err(VcpuError {
                op: "KVM_RUN (the event probe: the guest ran with a signal pending)",
                source: vmm_sys_util::errno::Error::new(libc::EIO),
            }),
        });
        let taken = probe.take_back();
        self.event_probe = Some(probe);
        ran?;
        taken?;
        self.regs.keep(kept);
        self.set_regs(&regs)?;
        let mut after = self.events()?;
        after.nmi.masked = events.nmi.masked;
        let nmi = after.nmi.pending != 0 && after.nmi.masked == 0 && after.nmi.injected == 0;
        if nmi {
            after.nmi.pending -= 1;
            after.nmi.masked = 1;
        }
        self.set_events(&after)?;
        if nmi {
            return Ok(Some(crate::DueEvent::Nmi));
        }
        if regs.rflags & RFLAGS_IF == 0 || after.interrupt.shadow != 0 {
            return Ok(None);
        }
        let mut state = self.fd.get_lapic().map_err(VcpuError::op("KVM_GET_LAPIC"))?;
        let page = lapic::bytes(&mut state.regs);
        let read = *page;
        let Some(v) = lapic::accept_interrupt(page) else {
            // The PIC's interrupt through LINT0 (virtual wire), which KVM takes from the PIC at
            // the next entry; after the APIC's own, so that an interrupt a handler raised for
            // user mode (a self-IPI) is not held back behind a device's.
            let extint = lapic::accepts_extint(page)
                && self.vm.as_ref().map(event_probe::pic_asserts).transpose()?.unwrap_or(false);
            return Ok(extint.then_some(crate::DueEvent::ExtInt));
        };
        self.set_lapic(page, &read)?;
        Ok(Some(crate::DueEvent::Interrupt(v)))
    }

    /// KVM_SET_LAPIC of a register page read with KVM_GET_LAPIC (see
    /// [`lapic::without_expired_timer`]).
    /// The requests that came in after `read` stay ([`lapic::keep_new_requests`]); one that comes
    /// between the second read and the write is still lost: KVM has no call to write one register
    /// of the xAPIC page.
    pub fn set_lapic(&mut self, page: &[u8; 1024], read: &[u8; 1024]) -> Result<(), VcpuError> {
        let mut now = self.fd.get_lapic().map_err(VcpuError::op("KVM_GET_LAPIC"))?;
        let mut state = kvm_bindings::kvm_lapic_state::default();
        let regs = lapic::bytes(&mut state.regs);
        *regs = *page;
        lapic::keep_new_requests(regs, read, lapic::bytes(&mut now.regs));
        lapic::without_expired_timer(regs);
        self.fd.set_lapic(&state).map_err(VcpuError::op("KVM_SET_LAPIC"))
    }

    /// Has KVM deliver `event`, taken by [`Self::due_event`], at the next entry.
    pub fn queue_event(&mut self, event: crate::DueEvent) -> Result<(), VcpuError> {
        let mut ev = self.events()?;
        match event {
            crate::DueEvent::Interrupt(v) => {
                ev.interrupt.injected = 1;
                ev.interrupt.nr = v;
                ev.interrupt.soft = 0;
            }
            crate::DueEvent::Nmi => ev.nmi.injected = 1,
            // Not acknowledged: KVM takes it from the PIC at the next entry.
            crate::DueEvent::ExtInt => return Ok(()),
        }
        self.set_events(&ev)
    }

    pub fn regs(&mut self) -> Result<kvm_regs, VcpuError> {
        self.regs.regs(&mut self.fd)
    }

    pub fn set_regs(&mut self, r: &kvm_regs) -> Result<(), VcpuError> {
        let moved = self.regs.regs(&mut self.fd)?.rip != r.rip;
        self.regs.set_regs(&mut self.fd, r)?;
        if moved && self.debug.stepping() && !self.step_survives_set_regs {
            // KVM keeps its single-step trap (RFLAGS.TF) only at the RIP where guest debugging
            // was last set (`singlestep_rip`): KVM_SET_REGS with another RIP drops it, and the
            // guest would run on free. Setting the control again puts it back.
            self.debug.forget_applied();
            self.apply_guest_debug()?;
        }
        Ok(())
    }

    pub fn sregs(&mut self) -> Result<kvm_sregs, VcpuError> {
        self.regs.sregs(&mut self.fd)
    }

    pub fn set_sregs(&mut self, s: &kvm_sregs) -> Result<(), VcpuError> {
        self.regs.set_sregs(&mut self.fd, s)
    }

    pub fn events(&mut self) -> Result<kvm_vcpu_events, VcpuError> {
        self.regs.events(&mut self.fd)
    }

    /// Makes KVM drop every translation it caches for the guest, as a flushing MOV to CR3 makes
    /// it (SDM Vol. 3A 4.10.4.1). KVM has no call for that alone; KVM_SET_SREGS with another CR3
    /// resets the vCPU's MMU context: its shadow roots are unloaded and synced again from the
    /// guest's page tables, and the TLB is flushed, before the next entry. So CR3 is set to
    /// another value (PWT toggled) and back, with no entry between. The interrupt bitmap is left
    /// empty, which queues nothing.
    fn flush_guest_tlb(&mut self) -> Result<(), VcpuError> {
        /// CR3.PWT (SDM Vol. 3A 4.5): any bit KVM takes in CR3 would do.
        const CR3_PWT: u64 = 1 << 3;
        let sregs = kvm_sregs { interrupt_bitmap: [0; 4], ..self.sregs()? };
        self.regs.set_sregs_now(&mut self.fd, &kvm_sregs { cr3: sregs.cr3 ^ CR3_PWT, ..sregs })?;
        self.regs.set_sregs_now(&mut self.fd, &sregs)
    }

    pub fn set_events(&mut self, e: &kvm_vcpu_events) -> Result<(), VcpuError> {
        self.regs.set_events(&mut self.fd, e)
    }

    /// Applies the guest-debug control if it changed (KVM reads RIP and RFLAGS for it: the
    /// registers written go first).
    pub fn apply_guest_debug(&mut self) -> Result<(), VcpuError> {
        if self.debug.changed() {
            self.regs.flush(&mut self.fd)?;
        }
        apply_guest_debug(&self.fd, &mut self.debug)
    }
}

/// A KVM vCPU and its guest memory, as the backends drive it.
pub struct KvmVcpu<'a> {
    pub cpu: &'a mut KvmCpu,
    pub mem: &'a GuestMemoryMmap,
}

impl Vcpu for KvmVcpu<'_> {
    fn regs(&mut self) -> Result<kvm_regs, VcpuError> {
        self.cpu.regs()
    }

    fn fpu(&mut self) -> Result<Fpu, VcpuError> {
        let (fd, abi) = (&self.cpu.fd, self.cpu.xsave);
        self.cpu.regs.fpu(|| xsave::get(fd, abi).map_err(VcpuError::op("KVM_GET_XSAVE")))
    }

    fn set_fpu(&mut self, f: &Fpu) -> Result<(), VcpuError> {
        self.cpu.regs.fpu_written();
        xsave::set(&self.cpu.fd, self.cpu.xsave, f).map_err(VcpuError::op("KVM_SET_XSAVE"))
    }

    fn set_regs(&mut self, regs: &kvm_regs) -> Result<(), VcpuError> {
        self.cpu.set_regs(regs)
    }

    fn sregs(&mut self) -> Result<kvm_sregs, VcpuError> {
        self.cpu.sregs()
    }

    fn set_sregs(&mut self, sregs: &kvm_sregs) -> Result<(), VcpuError> {
        self.cpu.set_sregs(sregs)
    }

    fn end_nmi_blocking(&mut self) -> Result<(), VcpuError> {
        let mut ev = self.cpu.events()?;
        if ev.nmi.masked != 0 {
            ev.nmi.masked = 0;
            self.cpu.set_events(&ev)?;
        }
        Ok(())
    }

    fn set_single_step(&mut self, on: bool) -> Result<(), VcpuError> {
        self.cpu.debug.step = on;
        self.cpu.apply_guest_debug()
    }

    fn halt(&mut self) -> Result<(), VcpuError> {
        // `sti; hlt`: STI's interrupt shadow covers the HLT, which has retired, so the shadow ends
        // here (SDM Vol. 2, STI). KVM would keep it, and no interrupt could wake the vCPU.
        self.set_interrupt_shadow(false)?;
        self.cpu
            .fd_synced()?
            .set_mp_state(kvm_mp_state { mp_state: KVM_MP_STATE_HALTED })
            .map_err(VcpuError::op("KVM_SET_MP_STATE"))
    }

    /// The table the VMM set, with the bits KVM keeps up to date taken from KVM's copy.
    fn cpuid_entries(&mut self) -> Result<Vec<kvm_bindings::kvm_cpuid_entry2>, VcpuError> {
        let mut table = self.cpu.cpuid.clone();
        if table.is_empty() {
            return Ok(table);
        }
        let live = self
            .cpu
            .fd_synced()?
            .get_cpuid2(kvm_bindings::KVM_MAX_CPUID_ENTRIES)
            .map_err(VcpuError::op("KVM_GET_CPUID2"))?;
        for &(leaf, subleaf, reg, mask) in &LIVE_CPUID {
            let Some(mut l) = live.as_slice().iter().find(|l| crate::cpuid::answers(l, leaf, subleaf)).copied() else {
                continue;
            };
            let theirs = *crate::cpuid::reg_mut(&mut l, reg);
            for e in table.iter_mut().filter(|e| crate::cpuid::answers(e, leaf, subleaf)) {
                let mine = crate::cpuid::reg_mut(e, reg);
                *mine = *mine & !mask | theirs & mask;
            }
        }
        Ok(table)
    }

    fn due_event(&mut self) -> Result<Option<crate::DueEvent>, VcpuError> {
        self.cpu.due_event()
    }

    fn queue_event(&mut self, event: crate::DueEvent) -> Result<(), VcpuError> {
        self.cpu.queue_event(event)
    }

    fn guest_breakpoints(&mut self) -> Result<emon_x86::debug::Breakpoints, VcpuError> {
        let d = self.cpu.debug_regs()?;
        Ok(emon_x86::debug::Breakpoints { addr: d.db, dr7: d.dr7 })
    }

    fn add_debug_status(&mut self, status: u64) -> Result<(), VcpuError> {
        let mut d = self.cpu.debug_regs()?;
        d.dr6 |= status;
        self.cpu.set_debug_regs(&d)
    }

    fn flush_tlb(&mut self) -> Result<(), VcpuError> {
        self.cpu.tlb_stale = true;
        Ok(())
    }

    fn set_interrupt_shadow(&mut self, sti: bool) -> Result<(), VcpuError> {
        let shadow = if sti { kvm_bindings::KVM_X86_SHADOW_INT_STI as u8 } else { 0 };
        let mut ev = self.cpu.events()?;
        if ev.interrupt.shadow != shadow {
            ev.interrupt.shadow = shadow;
            ev.flags |= KVM_VCPUEVENT_VALID_SHADOW;
            self.cpu.set_events(&ev)?;
        }
        Ok(())
    }

    fn inject_exception(&mut self, vector: u8, error_code: Option<u32>) -> Result<(), VcpuError> {
        if is_fault(vector) {
            // The frame of a fault has RFLAGS.RF set, so that the instruction can be restarted
            // past an instruction breakpoint (SDM Vol. 3A 6.5, "Exception Classifications"; Vol. 3B,
            // "Instruction-Breakpoint Exception Condition"). KVM sets it for the exceptions it
            // raises itself, not for one injected this way.
            let mut regs = self.regs()?;
            regs.rflags |= RFLAGS_RF;
            self.set_regs(&regs)?;
        }
        let mut ev = self.cpu.events()?;
        ev.exception.injected = 1;
        ev.exception.nr = vector;
        ev.exception.has_error_code = u8::from(error_code.is_some());
        ev.exception.error_code = error_code.unwrap_or(0);
        self.cpu.set_events(&ev)
    }

    fn memory(&self) -> &GuestMemoryMmap {
        self.mem
    }

    fn lapic(&mut self) -> Result<[u8; 1024], VcpuError> {
        let mut state = self.cpu.fd.get_lapic().map_err(VcpuError::op("KVM_GET_LAPIC"))?;
        Ok(*lapic::bytes(&mut state.regs))
    }

    fn set_lapic(&mut self, page: &[u8; 1024], read: &[u8; 1024]) -> Result<(), VcpuError> {
        self.cpu.set_lapic(page, read)
    }

    fn device_vectors(&mut self) -> Result<[u64; 4], VcpuError> {
        self.cpu.vm.as_ref().map_or(Ok([0; 4]), event_probe::ioapic_vectors)
    }

    fn nmi(&mut self) -> Result<(), VcpuError> {
        // A KVM_SET_VCPU_EVENTS still in `kvm_run` would drop the NMI KVM_NMI queues.
        self.cpu.fd_synced()?.nmi().map_err(VcpuError::op("KVM_NMI"))
    }

    fn get_msr(&mut self, index: u32) -> Result<u64, VcpuError> {
        Ok(self.cpu.get_msrs(&[index])?[0])
    }

    fn set_msr(&mut self, index: u32, value: u64) -> Result<(), VcpuError> {
        self.cpu.set_msrs(&[(index, value)])
    }

    fn get_msrs(&mut self, indices: &[u32]) -> Result<Vec<u64>, VcpuError> {
        self.cpu.get_msrs(indices)
    }

    fn set_msrs(&mut self, values: &[(u32, u64)]) -> Result<(), VcpuError> {
        self.cpu.set_msrs(values)
    }

    fn guest_tsc(&mut self) -> Result<u64, VcpuError> {
        let kvm = self.get_msr(emon_x86::arch::IA32_TSC)?;
        // Whatever emon does with it, the guest may see it: the engine's values stay above it.
        let tsc = self.cpu.tsc.after_given(kvm);
        self.cpu.tsc.given(tsc);
        Ok(tsc)
    }

    fn tsc_window(&mut self) -> Result<Option<TscWindow>, VcpuError> {
        let Some(w) = self.cpu.tsc.window(&self.cpu.fd) else { return Ok(None) };
        let aux = self.get_msr(IA32_TSC_AUX)? as u32;
        Ok(Some(TscWindow { aux, ..w }))
    }

    fn tsc_given(&mut self, value: u64) {
        self.cpu.tsc.given(value);
    }

    fn tsc_written(&mut self) {
        self.cpu.tsc.written();
    }

    fn set_guest_tsc(&mut self, value: u64) -> Result<bool, VcpuError> {
        self.cpu.tsc.written();
        // Some hosts accept KVM_VCPU_TSC_OFFSET and ignore it (kvm_pvm): believe only the guest's
        // TSC. Near the TSC the guest has, an ignored offset looks like one that took, so the
        // first value set is far away (the guest runs no instruction in between and sees only
        // `value`).
        let before = self.guest_tsc()?;
        let probe = before.wrapping_add(TSC_PROBE_DISTANCE);
        if !self.set_tsc_offset(probe)? {
            return Ok(false);
        }
        let after = self.guest_tsc()?;
        if after.wrapping_sub(before) < TSC_PROBE_DISTANCE / 2 {
            return Ok(false);
        }
        let set = self.set_tsc_offset(value)?;
        // Back from the probe: the values read there were never the guest's.
        self.cpu.tsc.written();
        match set {
            true => Ok(true),
            false => Err(VcpuError {
                op: "KVM_SET_DEVICE_ATTR(KVM_VCPU_TSC_OFFSET)",
                source: vmm_sys_util::errno::Error::last(),
            }),
        }
    }

    fn wait_for_guest_tsc(&mut self, value: u64, limit: Duration) -> Result<u64, VcpuError> {
        let khz = u64::from(self.cpu.fd.get_tsc_khz().unwrap_or(1_000_000).max(1));
        let deadline = Instant::now() + limit;
        loop {
            let now = self.guest_tsc()?;
            if now >= value || Instant::now() >= deadline {
                return Ok(now);
            }
            let ms = ((value - now) / khz).clamp(1, 50);
            std::thread::sleep(Duration::from_millis(ms));
        }
    }
}

impl KvmVcpu<'_> {
    /// Sets KVM_VCPU_TSC_OFFSET (guest TSC = host TSC + offset) so that the guest's TSC reads
    /// `value` now, without KVM's TSC synchronization heuristics (which may ignore an IA32_TSC
    /// write near the expected value). `Ok(false)`: the host refused the attribute.
    fn set_tsc_offset(&mut self, value: u64) -> Result<bool, VcpuError> {
        let mut offset = value.wrapping_sub(host_tsc());
        let attr = kvm_device_attr {
            group: KVM_VCPU_TSC_CTRL,
            attr: u64::from(KVM_VCPU_TSC_OFFSET),
            addr: &mut offset as *mut u64 as u64,
            flags: 0,
        };
        // SAFETY: KVM_SET_DEVICE_ATTR on a vCPU fd reads the attribute and, through `addr`, the
        // u64 offset, both of which outlive the call.
        Ok(unsafe { ioctl_with_ref(&self.cpu.fd, KVM_SET_DEVICE_ATTR(), &attr) } == 0)
    }
}

/// Sets one of the vCPU's MSRs as the VMM (a host-initiated KVM_SET_MSRS); EINVAL when KVM does
/// not take it.
pub fn set_msr(fd: &VcpuFd, index: u32, value: u64) -> Result<(), VcpuError> {
    let failed = || VcpuError { op: "KVM_SET_MSRS", source: vmm_sys_util::errno::Error::new(libc::EINVAL) };
    let msrs =
        Msrs::from_entries(&[kvm_msr_entry { index, data: value, ..Default::default() }]).map_err(|_| failed())?;
    match fd.set_msrs(&msrs).map_err(VcpuError::op("KVM_SET_MSRS"))? {
        1 => Ok(()),
        _ => Err(failed()),
    }
}

// kvm-ioctls offers KVM_SET_DEVICE_ATTR on vCPU fds only for aarch64.
vmm_sys_util::ioctl_iow_nr!(KVM_SET_DEVICE_ATTR, kvm_bindings::KVMIO, 0xe1, kvm_device_attr);

/// How far from the wanted value [`KvmVcpu::set_guest_tsc`] first sets the guest's TSC, to see
/// whether the host honours the offset: 2^40 TSC ticks (minutes at any TSC frequency), far beyond
/// any delay between two reads.
const TSC_PROBE_DISTANCE: u64 = 1 << 40;

/// Whether this host lets a VMM set a vCPU's TSC (`KVM_VCPU_TSC_OFFSET`, and the guest's TSC then
/// reads as set), tried on a throwaway VM. kvm_pvm accepts the offset and ignores it.
pub fn guest_tsc_settable(kvm: &kvm_ioctls::Kvm) -> Result<bool, VcpuError> {
    let vm = kvm.create_vm().map_err(VcpuError::op("KVM_CREATE_VM"))?;
    let fd = vm.create_vcpu(0).map_err(VcpuError::op("KVM_CREATE_VCPU"))?;
    let mem = GuestMemoryMmap::default();
    let mut cpu = KvmCpu::new(kvm, fd, GuestDebug::default(), None);
    let mut vcpu = cpu.with(&mem);
    let now = vcpu.guest_tsc()?;
    vcpu.set_guest_tsc(now)
}

/// RFLAGS.RF, the resume flag.
const RFLAGS_RF: u64 = 1 << 16;

/// Exceptions of the fault class (SDM Vol. 3A, Table 6-1): #DE, #BR, #UD, #NM, #TS, #NP, #SS,
/// #GP, #PF, #MF, #AC, #XM, #VE. (#DB is a fault or a trap depending on its cause.)
fn is_fault(vector: u8) -> bool {
    matches!(vector, 0 | 5 | 6 | 7 | 10..=14 | 16 | 17 | 19 | 20)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Does the filter send `msr` to userspace?
    fn trapped_by(spans: &[FilterSpan], msr: u32) -> bool {
        spans.iter().any(|s| {
            let i = msr.wrapping_sub(s.base);
            i < s.count && s.bitmap[(i / 8) as usize] & (1 << (i % 8)) == 0
        })
    }

    #[test]
    fn the_filter_traps_exactly_the_pmus_msrs_within_kvms_range_limit() {
        let spans = filter_spans(Pmu::TRAPPED_MSRS);
        assert!(spans.len() <= MAX_FILTER_RANGES, "{} ranges", spans.len());
        assert!(Pmu::TRAPPED_MSRS.len() > MAX_FILTER_RANGES, "the merge is needed");
        for msr in (0..0x1000).chain(0xC000_0000..0xC000_0200) {
            assert_eq!(trapped_by(&spans, msr), Pmu::owns(msr), "{msr:#x}");
        }
        for s in &spans {
            assert_eq!(s.bitmap.len(), s.count.div_ceil(8) as usize);
            assert!(trapped_by(&spans, s.base) && trapped_by(&spans, s.base + s.count - 1));
        }
    }

    /// The register cache against this host's KVM: writes of the segment and control registers
    /// wait in `kvm_run` (no ioctl) yet an MSR that mirrors them reads what was written; MSRs
    /// of [`regs::CACHED_MSRS`], the debug registers and the written sets are read once until
    /// the next KVM_RUN.
    #[test]
    fn the_register_cache_spares_ioctls_and_keeps_kvm_in_step() {
        use emon_x86::arch::{IA32_EFER, IA32_LSTAR};
        let kvm = kvm_ioctls::Kvm::new().expect("/dev/kvm (the suite runs where KVM does)");
        let vm = kvm.create_vm().unwrap();
        let mut cpu = KvmCpu::new(&kvm, vm.create_vcpu(0).unwrap(), GuestDebug::default(), None);
        let deferred = cpu.regs.sync & kvm_bindings::KVM_SYNC_X86_SREGS != 0;
        let sregs = cpu.sregs().unwrap();
        let before = cpu.register_ioctls();
        let written = kvm_sregs { efer: sregs.efer ^ 1, ..sregs }; // EFER.SCE
        cpu.set_sregs(&written).unwrap();
        cpu.set_sregs(&written).unwrap();
        assert_eq!(cpu.sregs().unwrap().efer, written.efer);
        assert_eq!(cpu.register_ioctls() - before, if deferred { 0 } else { 2 });
        // EFER through KVM_GET_MSRS: the written set goes to KVM first.
        assert_eq!(cpu.get_msrs(&[IA32_EFER]).unwrap(), [written.efer]);
        let before = cpu.register_ioctls();
        let lstar = cpu.get_msrs(&[IA32_LSTAR]).unwrap()[0];
        assert_eq!(cpu.get_msrs(&[IA32_LSTAR, IA32_LSTAR]).unwrap(), [lstar, lstar]);
        cpu.set_msrs(&[(IA32_LSTAR, 0xFFFF_FFFF_8100_0000)]).unwrap();
        assert_eq!(cpu.get_msrs(&[IA32_LSTAR]).unwrap(), [0xFFFF_FFFF_8100_0000]);
        let d = cpu.debug_regs().unwrap();
        assert_eq!(cpu.debug_regs().unwrap().dr7, d.dr7);
        assert_eq!(cpu.register_ioctls() - before, 3, "one KVM_GET_MSRS, one KVM_SET_MSRS, one KVM_GET_DEBUGREGS");
        // Read anew after a KVM_RUN (one that fails its entry checks, with nothing to run).
        cpu.regs.ran(false);
        let before = cpu.register_ioctls();
        assert_eq!(cpu.get_msrs(&[IA32_LSTAR]).unwrap(), [0xFFFF_FFFF_8100_0000]);
        assert_eq!(cpu.register_ioctls() - before, 1);
    }

    /// The guest's TSC from the host's, against this host's KVM: a window's values are at or
    /// above KVM's reads before it and at or below KVM's after the next entry's wait, and go up;
    /// after the guest's TSC is written (here far back), the next window follows it there.
    #[test]
    fn the_engine_reads_the_guests_tsc_from_the_hosts_in_step_with_kvm() {
        let kvm = kvm_ioctls::Kvm::new().expect("/dev/kvm (the suite runs where KVM does)");
        let vm = kvm.create_vm().unwrap();
        let mut cpu = KvmCpu::new(&kvm, vm.create_vcpu(0).unwrap(), GuestDebug::default(), None);
        let mem = GuestMemoryMmap::default();
        let mut vcpu = cpu.with(&mem);
        let Some(w) = vcpu.tsc_window().unwrap() else {
            // A host whose guest TSC runs at another rate than its own (TSC scaling) says why.
            let why = vcpu.cpu.tsc.unusable.expect("a reason");
            assert!(why.contains("TSC"), "{why}");
            return;
        };
        let mut last = 0;
        for _ in 0..200 {
            let before = vcpu.guest_tsc().unwrap();
            let w = vcpu.tsc_window().unwrap().expect("still bounded");
            let v = w.now();
            vcpu.tsc_given(v);
            assert!(v > before && v > last, "{v} after KVM's {before} and the last {last}");
            vcpu.cpu.tsc.before_entry();
            let after = vcpu.get_msr(emon_x86::arch::IA32_TSC).unwrap();
            assert!(after >= v, "KVM's {after} after the window's {v}");
            last = v;
        }
        assert_eq!(vcpu.cpu.tsc.calibrations, 1);
        // The guest writes its TSC back to 2^32 (which kvm_pvm ignores): the bounds go, and the
        // next window's values are KVM's again, wherever that is now (within a few seconds).
        set_msr(&vcpu.cpu.fd, emon_x86::arch::IA32_TSC, 1 << 32).unwrap();
        vcpu.tsc_written();
        let kvm = vcpu.get_msr(emon_x86::arch::IA32_TSC).unwrap();
        let v = vcpu.tsc_window().unwrap().expect("bounded again").now();
        assert!(v.abs_diff(kvm) < 10_000_000_000, "{v:#x} against KVM's {kvm:#x}, {w:?}");
        assert_eq!(vcpu.cpu.tsc.calibrations, 2);
    }

    #[test]
    fn ranges_far_apart_stay_apart() {
        let spans = filter_spans(&[(0x10, 0x11), (0x2000, 0x2000)]);
        assert_eq!(
            spans,
            [
                FilterSpan { base: 0x10, count: 2, bitmap: vec![0xFC] },
                FilterSpan { base: 0x2000, count: 1, bitmap: vec![0xFE] }
            ]
        );
    }
}
