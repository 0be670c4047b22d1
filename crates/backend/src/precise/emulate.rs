//! Instructions the precise backend completes itself while it counts, instead of stepping them
//! in KVM: HLT (which KVM steps over), RDPMC (which has no userspace exit), the time-stamp
//! counter's reads and IA32_TSC_DEADLINE (the guest's time follows the model, README "Guest
//! time"), RDMSR and WRMSR of the PMU's MSRs (a KVM round trip each), the fences (after which
//! some hosts lose the single-step trap), INVLPG (a KVM round trip per page on a host that
//! emulates CPL0 code), IN and OUT of the VMM's own devices (a VM exit each), and the store that
//! writes the xAPIC's LVTPC (an MMIO write KVM would step).
use super::clock::TscSource;
use super::stepper::Pending;
use super::Precise;
use crate::{BackendError, Cx, Next};
use emon_pmu::pmu::Pmu;
use emon_x86::arch::{EFER_SCE, GP_VECTOR, IA32_FMASK, IA32_LSTAR, IA32_STAR, RFLAGS_IF, UD_VECTOR};
use emon_x86::arch::{IA32_TSC, IA32_TSC_ADJUST, IA32_TSC_AUX, IA32_TSC_DEADLINE};
use emon_x86::deliver::{deliver, Event, NotDelivered};
use emon_x86::insn::{Insn, Special};
use emon_x86::mode::CpuMode;

/// CR4.TSD: RDTSC and RDTSCP fault above CPL0 (SDM Vol. 3A 2.5).
const CR4_TSD: u64 = 1 << 2;
/// RFLAGS.RF, and bit 1, always set (SDM Vol. 1, 3.4.3).
const RFLAGS_RF: u64 = 1 << 16;
const RFLAGS_FIXED: u64 = 1 << 1;

impl Precise {
    /// Completes the pending instruction `i` if it is one emon completes, and says what the VMM
    /// does next; `None`: KVM runs it. `queued`: the VMM queued a PMI in KVM for this entry.
    pub(super) fn emulate(
        &mut self,
        cx: &mut Cx,
        p: &mut Pending,
        i: &Insn,
        mode: &CpuMode,
        queued: bool,
    ) -> Result<Option<Next>, BackendError> {
        let virtual_time = self.clock.virtual_time;
        Ok(Some(match i.special {
            Special::Hlt => self.emulate_hlt(cx, p, i)?,
            Special::Rdpmc => self.emulate_rdpmc(cx, p, i, mode)?,
            // At CPL3 on a host where user mode runs in the engine, always: KVM cannot step it.
            Special::Rdtsc | Special::Rdtscp if virtual_time || (p.cpl == 3 && self.user_in_engine()) => {
                self.emulate_tsc_read(cx, p, i, mode)?
            }
            // Kernel code's where nothing KVM holds may come in before it, as for the PMU's MSRs
            // below: a step in KVM would only read the same clock.
            Special::Rdtsc | Special::Rdtscp if p.cpl < 3 && Self::nothing_due(cx, queued)? => {
                self.emulate_tsc_read(cx, p, i, mode)?
            }
            Special::Fence => {
                let regs = cx.vcpu.regs()?;
                self.complete(cx, p, i, regs)?
            }
            #[cfg(feature = "tcg")]
            Special::Xsave => return self.emulate_xsave(cx, p, i),
            Special::Syscall if p.cpl == 3 && self.user_in_engine => self.emulate_syscall(cx, p, i, mode)?,
            // KVM would run the user code after a return to user mode, which it cannot step on a
            // host where user mode runs in the engine (README, "User mode (CPL3)").
            #[cfg(feature = "tcg")]
            Special::Iret | Special::Sysret if p.cpl == 0 && self.user_in_engine => {
                return self.emulate_return_to_user(cx, p, i, mode)
            }
            Special::Int(vector) if p.cpl == 3 && self.user_in_engine => {
                match self.emulate_int(cx, p, i, mode, vector)? {
                    Some(next) => next,
                    None => return Ok(None),
                }
            }
            // At CPL3 it raises #GP(0), which KVM raises.
            Special::Invlpg if p.cpl == 0 => {
                cx.vcpu.flush_tlb()?;
                self.engine.tlb_flushed();
                let regs = cx.vcpu.regs()?;
                self.complete(cx, p, i, regs)?
            }
            // User mode on a host where it runs in the engine (README, "User mode (CPL3)").
            Special::Cpuid if p.cpl == 3 && self.user_in_engine() => {
                let table = cx.vcpu.cpuid_entries()?;
                if table.is_empty() {
                    return Ok(None);
                }
                let mut regs = cx.vcpu.regs()?;
                let [a, b, c, d] = crate::cpuid::lookup(&table, regs.rax as u32, regs.rcx as u32);
                (regs.rax, regs.rbx, regs.rcx, regs.rdx) = (a.into(), b.into(), c.into(), d.into());
                self.complete(cx, p, i, regs)?
            }
            // RDMSR and WRMSR at CPL0 (at CPL3 they are a #GP, which KVM raises).
            Special::Rdmsr | Special::Wrmsr if p.cpl == 0 => {
                let regs = cx.vcpu.regs()?;
                let msr = (regs.rcx & 0xFFFF_FFFF) as u32;
                let nothing_due = Self::nothing_due(cx, queued)?;
                let deadline_write = i.special == Special::Wrmsr && nothing_due;
                if i.special == Special::Rdmsr && virtual_time && msr == IA32_TSC {
                    self.emulate_tsc_read(cx, p, i, mode)?
                } else if msr == IA32_TSC_DEADLINE && (self.clock.in_stretch() || deadline_write) {
                    // The deadline timer's MSR: on the model's side of the guest's time, or
                    // written as the VMM (KVM arms its timer as at the guest's WRMSR).
                    self.emulate_tsc_deadline(cx, p, i, regs)?
                } else if Pmu::owns(msr) && nothing_due {
                    self.emulate_pmu_msr(cx, p, i, msr, regs)?
                } else {
                    if i.special == Special::Wrmsr && matches!(msr, IA32_TSC | IA32_TSC_ADJUST) {
                        // KVM moves the guest's TSC (SDM Vol. 3B 18.17.3): the engine's bounds on
                        // it go (`Vcpu::tsc_window`).
                        cx.vcpu.tsc_written();
                    }
                    return Ok(None);
                }
            }
            // The ports the VMM's own devices answer, at CPL0 (where IOPL never refuses it, SDM
            // Vol. 1 19.5.1).
            Special::Port(access) if p.cpl == 0 => {
                let mut regs = cx.vcpu.regs()?;
                let port = access.port.map_or(regs.rdx as u16, u16::from);
                if !self.device_access_now(cx, queued)? || !cx.ports.completes(port) {
                    return Ok(None);
                }
                let size = usize::from(access.size);
                if access.out {
                    cx.ports.write(port, &regs.rax.to_le_bytes()[..size]);
                } else {
                    let mut data = [0u8; 4];
                    cx.ports.read(port, &mut data[..size]);
                    let value = u64::from(u32::from_le_bytes(data));
                    // A 32-bit destination clears RAX's upper half (SDM Vol. 1 3.4.1.1); AL and
                    // AX leave the rest of it.
                    let kept = if size == 4 { 0 } else { !0u64 << (8 * size) };
                    regs.rax = regs.rax & kept | value;
                }
                self.stats.ports += 1;
                self.complete(cx, p, i, regs)?
            }
            // A store to the local APIC's page at CPL0: its LVTPC, the PMU's own interrupt
            // register, emon writes itself.
            Special::None if p.cpl == 0 && i.mem_operands == 1 => {
                match self.emulate_lvtpc_write(cx, p, i, mode, queued)? {
                    Some(next) => next,
                    None => return Ok(None),
                }
            }
            _ => return Ok(None),
        }))
    }

    /// `MOV m32, r32` or `MOV m32, imm32` to the xAPIC's LVTPC (Linux unmasks it so at the end of
    /// each PMI): an MMIO write, and so a KVM step, and on a host whose kernel code runs in the
    /// engine a load of the whole vCPU state after it. The register takes the written vector,
    /// delivery mode and mask (its delivery status is read-only), and is masked whatever was
    /// written while the APIC is software-disabled (SDM Vol. 3A 11.5.1, 11.4.7.2). `None`: any
    /// other store, or one whose translation the processor would set an accessed or dirty flag
    /// on (SDM Vol. 3A 4.8), KVM's.
    fn emulate_lvtpc_write(
        &mut self,
        cx: &mut Cx,
        p: &mut Pending,
        i: &Insn,
        mode: &CpuMode,
        queued: bool,
    ) -> Result<Option<Next>, BackendError> {
        use crate::lapic::{self, LVT_MASKED, LVT_PMC, SVR, SVR_APIC_ENABLED};
        use emon_x86::arch::{APIC_BASE_EN, APIC_BASE_EXTD};
        use iced_x86::{MemorySize, Mnemonic, OpKind};
        /// The LVTPC's writable bits: vector, delivery mode and mask.
        const WRITABLE: u32 = 0xFF | 0b111 << lapic::DELIVERY_MODE_SHIFT | LVT_MASKED;
        if !self.device_access_now(cx, queued)? {
            return Ok(None);
        }
        let regs = cx.vcpu.regs()?;
        let full = super::stepper::decode_full(cx, mode, p.rip);
        if full.mnemonic() != Mnemonic::Mov
            || full.op0_kind() != OpKind::Memory
            || full.memory_size() != MemorySize::UInt32
        {
            return Ok(None);
        }
        let value = match full.op1_kind() {
            OpKind::Register => emon_x86::access::gpr(&regs, full.op1_register()) as u32,
            OpKind::Immediate32 => full.immediate32(),
            _ => return Ok(None),
        };
        let sregs = cx.vcpu.sregs()?;
        let reg = |r| emon_x86::access::gpr(&regs, r);
        let Ok(&[access]) = emon_x86::access::data_accesses(&full, reg, sregs.fs.base, sregs.gs.base).as_deref() else {
            return Ok(None);
        };
        let store = emon_x86::mode::Access::Write;
        let Some(phys) = mode.quiet_translation(cx.vcpu.memory(), access.linear, store, false) else { return Ok(None) };
        let xapic = sregs.apic_base & (APIC_BASE_EN | APIC_BASE_EXTD) == APIC_BASE_EN;
        let page = sregs.apic_base & !0xFFF;
        if !xapic || phys != page + LVT_PMC as u64 {
            return Ok(None);
        }
        let read = cx.vcpu.lapic()?;
        let mut apic = read;
        let masked = if lapic::reg(&apic, SVR) & SVR_APIC_ENABLED == 0 { LVT_MASKED } else { 0 };
        lapic::set_reg(&mut apic, LVT_PMC, value & WRITABLE | masked);
        cx.vcpu.set_lapic(&apic, &read)?;
        self.stats.lvtpc_writes += 1;
        self.complete(cx, p, i, regs).map(Some)
    }

    /// Whether emon may complete a device access (a port's, the LVTPC's) at this CPL0 boundary
    /// itself: where nothing KVM holds may come in before it ([`Self::nothing_due`]), or where
    /// this host's kernel code runs in the engine, which asks KVM for the events due only every
    /// so often anyway ("CPL0 code in the TCG engine"); never with a PMI queued, nor with the
    /// guest's breakpoints armed (an I/O or data breakpoint is KVM's to raise).
    fn device_access_now(&mut self, cx: &mut Cx, queued: bool) -> Result<bool, BackendError> {
        let soon = Self::nothing_due(cx, queued)? || !queued && self.cpl0_in_engine();
        Ok(soon && !self.guest_breakpoints(cx)?.armed())
    }

    /// Whether nothing KVM holds may be delivered before the instruction at this CPL0 boundary: no
    /// PMI queued (`queued`), and interrupts masked (an interrupt the guest raised, a self-IPI
    /// say, comes in before the next instruction where RFLAGS.IF lets it, SDM Vol. 3A 6.8.1).
    /// emon may then complete the instruction itself instead of a step in KVM, an entry that
    /// would deliver it first.
    fn nothing_due(cx: &mut Cx, queued: bool) -> Result<bool, BackendError> {
        Ok(!queued && cx.vcpu.regs()?.rflags & RFLAGS_IF == 0)
    }

    /// An instruction emon emulated retires: its effect on the registers, `regs`, is written back
    /// with RIP past it.
    fn complete(
        &mut self,
        cx: &mut Cx,
        p: &Pending,
        i: &Insn,
        mut regs: kvm_bindings::kvm_regs,
    ) -> Result<Next, BackendError> {
        regs.rip = p.rip + i.len as u64;
        cx.vcpu.set_regs(&regs)?;
        self.retire_one(cx, p, (i, p.rip, p.cpl), regs.rip, true)?;
        Ok(Next::Retired)
    }

    /// The pending instruction raises #GP(0), as on hardware, and does not retire.
    fn raise_gp(&mut self, cx: &mut Cx, p: &mut Pending) -> Result<Next, BackendError> {
        self.raise(cx, p, GP_VECTOR, Some(0))
    }

    /// The pending instruction raises exception `vector`, as on hardware, and does not retire.
    fn raise(&mut self, cx: &mut Cx, p: &mut Pending, vector: u8, code: Option<u32>) -> Result<Next, BackendError> {
        cx.vcpu.inject_exception(vector, code)?;
        Ok(self.raised(p))
    }

    /// The pending instruction raised the exception just injected: the next step delivers it.
    fn raised(&mut self, p: &mut Pending) -> Next {
        p.expect_event = true;
        self.step.pending = Some(p.clone());
        Next::Run
    }

    /// SYSCALL at CPL3 on a host that does not enter the kernel on it (SDM Vol. 2B, SYSCALL, in
    /// 64-bit mode): RCX takes the next RIP and R11 RFLAGS, RFLAGS is masked with IA32_FMASK,
    /// CS and SS take IA32_STAR[47:32] (RPL cleared) and that plus 8 with flat descriptors at
    /// DPL 0, and RIP takes IA32_LSTAR. #UD without EFER.SCE or outside 64-bit mode.
    fn emulate_syscall(
        &mut self,
        cx: &mut Cx,
        p: &mut Pending,
        i: &Insn,
        mode: &CpuMode,
    ) -> Result<Next, BackendError> {
        let mut sregs = cx.vcpu.sregs()?;
        if sregs.efer & EFER_SCE == 0 || mode.bitness != 64 {
            return self.raise(cx, p, UD_VECTOR, None);
        }
        let [star, lstar, fmask]: [u64; 3] =
            cx.vcpu.get_msrs(&[IA32_STAR, IA32_LSTAR, IA32_FMASK])?.try_into().expect("three MSRs");
        let mut regs = cx.vcpu.regs()?;
        regs.rcx = p.rip + i.len as u64;
        regs.r11 = regs.rflags & !RFLAGS_RF;
        regs.rflags = regs.rflags & !fmask & !RFLAGS_RF | RFLAGS_FIXED;
        regs.rip = lstar;
        let selector = (star >> 32) as u16 & !3;
        let flat = kvm_bindings::kvm_segment {
            base: 0,
            limit: 0xFFFF_FFFF,
            present: 1,
            dpl: 0,
            s: 1,
            g: 1,
            ..Default::default()
        };
        sregs.cs = kvm_bindings::kvm_segment { selector, type_: 11, l: 1, ..flat };
        sregs.ss = kvm_bindings::kvm_segment { selector: selector + 8, type_: 3, db: 1, ..flat };
        cx.vcpu.set_sregs(&sregs)?;
        cx.vcpu.set_regs(&regs)?;
        self.step.mode = None;
        self.stats.syscalls += 1;
        self.retire_one(cx, p, (i, p.rip, p.cpl), lstar, true)?;
        Ok(Next::Retired)
    }

    /// INT n and INT3 at CPL3 on a host that swallows them: delivered through the guest's IDT
    /// (SDM Vol. 3A 6.12.1: the gate's DPL is checked; the frame returns past the instruction),
    /// retiring as one user-mode instruction. A gate that faults raises its exception instead
    /// (#GP(vector * 8 + 2) for a DPL below the CPL), and the instruction does not retire.
    /// `None`: emon does not deliver this one itself (KVM steps it).
    fn emulate_int(
        &mut self,
        cx: &mut Cx,
        p: &mut Pending,
        i: &Insn,
        mode: &CpuMode,
        vector: u8,
    ) -> Result<Option<Next>, BackendError> {
        let next_rip = p.rip + i.len as u64;
        match self.deliver_event(cx, mode, vector, Event::Software { next_rip })? {
            Ok(handler) => {
                self.stats.soft_interrupts += 1;
                self.retire_one(cx, p, (i, p.rip, p.cpl), handler, true)?;
                Ok(Some(Next::Retired))
            }
            Err(NotDelivered::Raises { vector, error_code }) => self.raise(cx, p, vector, Some(error_code)).map(Some),
            Err(NotDelivered::Unsupported(why)) => {
                tracing::debug!(why, "INT {vector:#x} from user mode: KVM runs it");
                Ok(None)
            }
        }
    }

    /// Delivers `vector` as `event` through the guest's IDT from the vCPU's state
    /// ([`emon_x86::deliver`]): the vCPU is at the handler, whose address it returns; or why
    /// emon did not deliver it (and nothing changed).
    pub(super) fn deliver_event(
        &mut self,
        cx: &mut Cx,
        mode: &CpuMode,
        vector: u8,
        event: Event,
    ) -> Result<Result<u64, NotDelivered>, BackendError> {
        let (mut regs, mut sregs) = (cx.vcpu.regs()?, cx.vcpu.sregs()?);
        if let Err(why) = deliver(mode, cx.vcpu.memory(), &mut regs, &mut sregs, vector, event) {
            return Ok(Err(why));
        }
        cx.vcpu.set_sregs(&sregs)?;
        cx.vcpu.set_regs(&regs)?;
        self.step.mode = None;
        Ok(Ok(regs.rip))
    }

    fn emulate_hlt(&mut self, cx: &mut Cx, p: &Pending, i: &Insn) -> Result<Next, BackendError> {
        let regs = cx.vcpu.regs()?;
        self.complete(cx, p, i, regs)?;
        cx.vcpu.halt()?;
        self.clock.halt(cx)?;
        self.step.expect_event = true;
        self.stats.hlt += 1;
        Ok(Next::Retired)
    }

    /// RDTSC, RDTSCP, and RDMSR of IA32_TSC (`rdmsr`): the guest's TSC as the model has it
    /// (README, "Guest time"). RDTSC and RDTSCP fault above CPL0 with CR4.TSD set.
    fn emulate_tsc_read(
        &mut self,
        cx: &mut Cx,
        p: &mut Pending,
        i: &Insn,
        mode: &CpuMode,
    ) -> Result<Next, BackendError> {
        if p.cpl > 0 && i.special != Special::Rdmsr && mode.cr4 & CR4_TSD != 0 {
            return self.raise_gp(cx, p);
        }
        self.stats.tsc_reads += 1;
        let mut regs = cx.vcpu.regs()?;
        let tsc = match self.engine_tsc(cx)? {
            // From the host's TSC, as the engine answers it: no ioctl, and in step with the
            // engine's values.
            Some(TscSource::Host(w)) => {
                let tsc = w.now();
                cx.vcpu.tsc_given(tsc);
                tsc
            }
            _ => self.clock.guest_tsc(cx)?,
        };
        regs.rax = tsc & 0xFFFF_FFFF;
        regs.rdx = tsc >> 32;
        if i.special == Special::Rdtscp {
            regs.rcx = cx.vcpu.get_msr(IA32_TSC_AUX)? & 0xFFFF_FFFF;
        }
        self.complete(cx, p, i, regs)
    }

    /// Where RDTSC and RDTSCP read the guest's TSC in the engine (and where emon answers them
    /// at CPL3, alike): in a counted stretch whose time follows the model, the model clock at the
    /// instruction (README, "Guest time"); otherwise the host's TSC, where it bounds the guest's;
    /// `None`: they are handed over.
    pub(super) fn engine_tsc(&mut self, cx: &mut Cx) -> Result<Option<TscSource>, BackendError> {
        let window = cx.vcpu.tsc_window()?;
        let Some(base) = self.clock.model_base() else { return Ok(window.map(TscSource::Host)) };
        let aux = match window {
            Some(w) => w.aux,
            None => cx.vcpu.get_msr(IA32_TSC_AUX)? as u32,
        };
        Ok(Some(TscSource::Model { base, aux }))
    }

    /// [`Self::engine_tsc`] for an engine run at `mode`. None above CPL0 with CR4.TSD set, where
    /// RDTSC and RDTSCP raise #GP (SDM Vol. 2B, RDTSC), which emon raises (`emulate_tsc_read`)
    /// without a run that would only stop at the fault. Real time for kernel code (below CPL3)
    /// only with RFLAGS.IF clear (the run stops before a read once IF is set:
    /// `Counting::tsc_if_clear`): where IF is set, KVM may hold an interrupt the CPU would take
    /// before the read (SDM Vol. 3A 6.8.1), and a step in KVM is an entry that delivers it first,
    /// where the engine takes events only between runs, a millisecond apart (README, "Real time in
    /// the engine"). The model's time at an instruction is the same whenever an interrupt comes.
    pub(super) fn engine_run_tsc(&mut self, cx: &mut Cx, mode: &CpuMode) -> Result<Option<TscSource>, BackendError> {
        if mode.cpl > 0 && mode.cr4 & CR4_TSD != 0 {
            return Ok(None);
        }
        let source = self.engine_tsc(cx)?;
        if mode.cpl < 3 && matches!(source, Some(TscSource::Host(_))) && cx.vcpu.regs()?.rflags & RFLAGS_IF != 0 {
            return Ok(None);
        }
        Ok(source)
    }

    /// RDMSR and WRMSR of IA32_TSC_DEADLINE. While the guest's TSC follows the model, the timer
    /// is on the model's time: emon holds the deadline and fires it when the model's TSC reaches
    /// it (`GuestClock::fire_deadline`); KVM's timer, on KVM's guest TSC, would fire it early or
    /// late by however far the two TSCs have moved apart, and a guest that rearms an early timer
    /// would take a storm of them. In real time (the guest's TSC is KVM's) a WRMSR goes to KVM as
    /// it is, as the VMM's write, where nothing KVM holds is due first: the timer's deadline on
    /// every Linux tick, a step each otherwise.
    fn emulate_tsc_deadline(
        &mut self,
        cx: &mut Cx,
        p: &Pending,
        i: &Insn,
        mut regs: kvm_bindings::kvm_regs,
    ) -> Result<Next, BackendError> {
        let model = self.clock.in_stretch();
        if i.special == Special::Wrmsr {
            let deadline = (regs.rdx << 32) | (regs.rax & 0xFFFF_FFFF);
            if model {
                self.clock.write_deadline(cx, deadline)?;
            } else {
                cx.vcpu.set_msr(IA32_TSC_DEADLINE, deadline)?;
            }
        } else {
            let deadline = if model { self.clock.read_deadline(cx)? } else { cx.vcpu.get_msr(IA32_TSC_DEADLINE)? };
            regs.rax = deadline & 0xFFFF_FFFF;
            regs.rdx = deadline >> 32;
        }
        self.stats.tsc_deadlines += 1;
        self.complete(cx, p, i, regs)
    }

    /// RDMSR or WRMSR of the PMU's MSR `msr` at CPL0, with nothing due before it (`regs`: the
    /// vCPU's): the facade's model answers it as at KVM's MSR exit ([`crate::PmuMsrs`]), or it
    /// raises #GP. In 64-bit mode RDMSR clears the upper halves of RAX and RDX, and WRMSR writes
    /// EDX:EAX (SDM Vol. 2B, RDMSR and WRMSR). A counter the WRMSR wrote does not count it, as
    /// where KVM steps it (`Precise::arm`).
    fn emulate_pmu_msr(
        &mut self,
        cx: &mut Cx,
        p: &mut Pending,
        i: &Insn,
        msr: u32,
        mut regs: kvm_bindings::kvm_regs,
    ) -> Result<Next, BackendError> {
        let took = if i.special == Special::Wrmsr {
            let value = (regs.rdx << 32) | (regs.rax & 0xFFFF_FFFF);
            let took = cx.msrs.write(cx.pmu, msr, value).is_ok();
            let written = self.reprogram(cx);
            p.uncount_written(written);
            took
        } else {
            cx.msrs.read(cx.pmu, msr).map(|v| (regs.rax, regs.rdx) = (v & 0xFFFF_FFFF, v >> 32)).is_ok()
        };
        if !took {
            return self.raise_gp(cx, p);
        }
        self.stats.pmu_msrs += 1;
        self.complete(cx, p, i, regs)
    }

    /// XSAVE, XSAVEOPT, XSAVEC and XRSTOR, which neither QEMU's TCG nor every host's KVM runs
    /// whole (see [`super::tcg::complete_xsave`]): completed on the vCPU's XSAVE state, or the
    /// exception they raise delivered (a #PF with its error code and CR2); `None` where emon
    /// leaves the instruction to KVM.
    #[cfg(feature = "tcg")]
    fn emulate_xsave(&mut self, cx: &mut Cx, p: &mut Pending, i: &Insn) -> Result<Option<Next>, BackendError> {
        use super::tcg::{self, Completed, Needs};
        let before = tcg::state_of(cx.vcpu, Needs { fpu: true, msrs: false })?;
        let done = match tcg::complete_xsave(cx.vcpu.memory(), &before) {
            Ok(done) => done,
            Err(e) => {
                tracing::debug!("{e}: KVM runs it");
                return Ok(None);
            }
        };
        match done {
            Some(Completed::Retired(after)) => {
                tcg::write_back(cx.vcpu, &before, &after, false)?;
                self.retire_one(cx, p, (i, p.rip, p.cpl), after.regs.rip, true)?;
                Ok(Some(Next::Retired))
            }
            // #UD, #NM, #GP(0) (SDM Vol. 1, 13.8 and 13.10).
            Some(Completed::Fault { vector }) => match emon_x86::arch::plain_error_code(vector) {
                Some(code) => self.raise(cx, p, vector as u8, code).map(Some),
                None => Ok(None),
            },
            Some(Completed::PageFault { error_code, cr2 }) => {
                cx.vcpu.inject_page_fault(error_code, cr2)?;
                Ok(Some(self.raised(p)))
            }
            Some(Completed::Iteration(_)) | None => Ok(None),
        }
    }

    fn emulate_rdpmc(&mut self, cx: &mut Cx, p: &mut Pending, i: &Insn, mode: &CpuMode) -> Result<Next, BackendError> {
        self.stats.rdpmc += 1;
        let mut regs = cx.vcpu.regs()?;
        match cx.pmu.rdpmc(regs.rcx as u32, p.cpl, mode.pce()) {
            Ok(v) => {
                regs.rax = v & 0xFFFF_FFFF;
                regs.rdx = v >> 32;
                self.complete(cx, p, i, regs)
            }
            Err(_) => self.raise_gp(cx, p),
        }
    }
}
