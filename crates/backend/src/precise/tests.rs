//! The precise backend's boundary logic against a scripted vCPU: each test says where the vCPU
//! stopped after an entry, as KVM would report it, and checks what retired and what was counted.
//! No KVM is involved.
#[cfg(feature = "tcg")]
use super::engine::{EventClock, EVENT_CHECK};
use super::*;
use crate::testing::Script;
use crate::vpmu::{Accounting, MsrStats};
use emon_pmu::pmu::{msr, Pmu};
use emon_pmu::profile::Profile;
use emon_x86::arch::{DB_VECTOR, GP_VECTOR, RFLAGS_IF};
use emon_x86::mode::CpuMode;
use kvm_bindings::kvm_regs;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

const CODE: u64 = 0x10000;
const HANDLER: u64 = 0x11000;
const GP_HANDLER: u64 = 0x12000;
const DB_HANDLER: u64 = 0x13000;
const STACK: u64 = 0x20000;
const IDT: u64 = 0x4000;
const TIMER: u8 = 0x20;

/// A precise backend, a PMU and a scripted vCPU running `code` at [`CODE`].
struct Rig {
    vcpu: Script,
    pmu: Pmu,
    /// The facade's answer to the guest's PMU MSR accesses the backend completes.
    msrs: Accounting,
    /// The VMM's devices, for the guest's port accesses the backend completes.
    ports: TestPorts,
    precise: Precise,
}

/// One device at [`TestPorts::PORT`]: it keeps what was written to it and reads back
/// [`TestPorts::READS`]; every other port is KVM's.
#[derive(Debug, Default)]
struct TestPorts {
    written: Vec<(u16, Vec<u8>)>,
    reads: u64,
}

impl TestPorts {
    const PORT: u16 = 0x3F8;
    const READS: u8 = 0x60;
}

impl crate::Ports for TestPorts {
    fn completes(&self, port: u16) -> bool {
        port == Self::PORT
    }
    fn read(&mut self, _port: u16, data: &mut [u8]) {
        self.reads += 1;
        data.fill(Self::READS);
    }
    fn write(&mut self, port: u16, data: &[u8]) {
        self.written.push((port, data.to_vec()));
    }
}

impl Rig {
    fn new(code: &[u8]) -> Rig {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 2 << 20)]).unwrap();
        // PML4 0x1000 -> PDPT 0x2000 -> PD 0x3000, whose entry 0 maps 0-2 MiB (a 2 MiB page).
        mem.write_obj(0x2003u64, GuestAddress(0x1000)).unwrap();
        mem.write_obj(0x3003u64, GuestAddress(0x2000)).unwrap();
        mem.write_obj(0x83u64, GuestAddress(0x3000)).unwrap();
        mem.write_slice(code, GuestAddress(CODE)).unwrap();
        let mut rig = Rig {
            vcpu: Script {
                regs: kvm_regs { rip: CODE, rsp: STACK, rflags: 2, ..Default::default() },
                mode: CpuMode {
                    cpl: 0,
                    bitness: 64,
                    cr0: 1 << 31 | 1,
                    cr3: 0x1000,
                    cr4: 1 << 5,
                    efer: 1 << 10 | 1 << 8,
                    idt_base: IDT,
                    idt_limit: 256 * 16 - 1,
                },
                ..Script::new(mem)
            },
            pmu: Pmu::new(&Profile::load("skylake").unwrap().pmu),
            msrs: Accounting::default(),
            ports: TestPorts::default(),
            precise: Precise::with_engine(Engine::Step),
        };
        rig.gate(TIMER, HANDLER);
        rig.gate(GP_VECTOR, GP_HANDLER);
        rig.gate(DB_VECTOR, DB_HANDLER);
        rig.vcpu.mem.write_slice(&[0x90, 0x90], GuestAddress(DB_HANDLER)).unwrap();
        // Both handlers start with two NOPs.
        rig.vcpu.mem.write_slice(&[0x90, 0x90], GuestAddress(HANDLER)).unwrap();
        rig.vcpu.mem.write_slice(&[0x90, 0x90], GuestAddress(GP_HANDLER)).unwrap();
        rig
    }

    /// A 64-bit interrupt gate for vector `v` (SDM Vol. 3A Figure 6-8).
    fn gate(&mut self, v: u8, handler: u64) {
        let lo = (handler & 0xFFFF) | 0x08 << 16 | 0x8E << 40 | ((handler >> 16) & 0xFFFF) << 48;
        let at = GuestAddress(IDT + u64::from(v) * 16);
        self.vcpu.mem.write_obj(lo, at).unwrap();
        self.vcpu.mem.write_obj(handler >> 32, GuestAddress(at.0 + 8)).unwrap();
    }

    fn wrmsr(&mut self, msr: u32, value: u64) {
        self.pmu.wrmsr(msr, value).unwrap();
    }

    /// IA32_PMC0 counts instructions retired at any CPL; IA32_PMC1 counts branches.
    fn count(&mut self) {
        self.wrmsr(msr::IA32_PERFEVTSEL0, 0x43_00C0);
        self.wrmsr(msr::IA32_PERFEVTSEL0 + 1, 0x43_00C4);
        self.wrmsr(msr::IA32_PERF_GLOBAL_CTRL, 0b11);
    }

    fn before(&mut self, at_boundary: bool) -> Next {
        let mut cx = Cx { vcpu: &mut self.vcpu, pmu: &mut self.pmu, msrs: &mut self.msrs, ports: &mut self.ports };
        self.precise.before_run(&mut cx, at_boundary).unwrap()
    }

    /// The entry ended in a single-step exit with the vCPU at `pc`.
    fn exit_at(&mut self, pc: u64) {
        self.vcpu.regs.rip = pc;
        let mut cx = Cx { vcpu: &mut self.vcpu, pmu: &mut self.pmu, msrs: &mut self.msrs, ports: &mut self.ports };
        self.precise.on_debug_exit(&mut cx, pc).unwrap();
    }

    /// One entry from a boundary that stops at `pc`.
    fn step(&mut self, pc: u64) {
        assert_eq!(self.before(true), Next::Run);
        assert!(self.vcpu.single_step, "stepping while a counter counts");
        self.exit_at(pc);
    }

    fn pmc(&self, i: u32) -> u64 {
        self.pmu.rdmsr(msr::IA32_PMC0 + i).unwrap()
    }

    /// The local APIC's timer in TSC-deadline mode, on the timer's vector.
    fn tsc_deadline_mode(&mut self) {
        use crate::lapic::{set_reg, LVT_TIMER, LVT_TIMER_TSC_DEADLINE};
        set_reg(&mut self.vcpu.lapic, LVT_TIMER, LVT_TIMER_TSC_DEADLINE | u32::from(TIMER));
    }
}

const NOP: u8 = 0x90;

#[test]
fn each_step_retires_one_instruction() {
    let mut r = Rig::new(&[NOP, NOP, NOP]);
    r.count();
    for n in 1..=3 {
        r.step(CODE + n);
    }
    assert_eq!((r.pmc(0), r.pmc(1)), (3, 0));
    assert_eq!(r.precise.stats.lost_traps, 0);
}

#[test]
fn stepping_stops_when_nothing_counts() {
    let mut r = Rig::new(&[NOP, NOP]);
    assert_eq!(r.before(true), Next::Run);
    assert!(!r.vcpu.single_step, "the guest runs free");
    r.count();
    r.step(CODE + 1);
    r.wrmsr(msr::IA32_PERF_GLOBAL_CTRL, 0);
    assert_eq!(r.before(true), Next::Run);
    assert!(!r.vcpu.single_step);
}

#[test]
fn lost_traps_after_port_io_count_the_straight_line_run() {
    // out dx,al; nop; nop; nop: the host lost the traps of the OUT and the next two NOPs.
    let mut r = Rig::new(&[0xEE, NOP, NOP, NOP]);
    r.count();
    r.step(CODE + 3);
    assert_eq!(r.pmc(0), 3);
    assert_eq!(r.precise.stats.lost_traps, 2);
    r.step(CODE + 4);
    assert_eq!(r.pmc(0), 4);
}

#[test]
fn lost_traps_through_a_direct_jump_count_the_jump_as_a_branch() {
    // out dx,al; jmp +1; (skipped byte) ; nop
    let mut r = Rig::new(&[0xEE, 0xEB, 0x01, 0xCC, NOP]);
    r.count();
    r.step(CODE + 4);
    assert_eq!((r.pmc(0), r.pmc(1)), (2, 1), "OUT and the taken JMP");
}

#[test]
fn an_interrupt_before_a_step_retires_the_handlers_first_instruction() {
    let mut r = Rig::new(&[NOP, NOP]);
    r.count();
    // The NOP at CODE did not retire: the interrupt was delivered first, and the step retired
    // the handler's first NOP.
    r.step(HANDLER + 1);
    assert_eq!(r.pmc(0), 1);
    assert_eq!(r.precise.stats.events, 1);
    r.step(HANDLER + 2);
    assert_eq!(r.pmc(0), 2);
}

#[test]
fn iret_counts_the_instruction_it_returns_to_when_its_trap_lands_late() {
    // iretq at CODE returns to CODE + 0x10 (nop; nop); the restored TF traps one instruction late.
    let mut code = vec![0x48, 0xCF];
    code.resize(0x10, 0xCC);
    code.extend([NOP, NOP]);
    let mut r = Rig::new(&code);
    // The frame: RIP, CS, RFLAGS, RSP, SS.
    for (i, v) in [CODE + 0x10, 0x08, 0x102, STACK, 0x10].iter().enumerate() {
        r.vcpu.mem.write_obj(*v, GuestAddress(STACK + 8 * i as u64)).unwrap();
    }
    r.count();
    r.step(CODE + 0x11);
    assert_eq!((r.pmc(0), r.pmc(1)), (2, 1), "IRET (a branch) and the NOP it returned to");
    assert_eq!(r.precise.stats.lost_traps, 1);
}

#[test]
fn hlt_retires_halts_the_vcpu_and_the_waking_interrupt_counts() {
    let mut r = Rig::new(&[0xF4, NOP]);
    r.count();
    assert_eq!(r.before(true), Next::Retired, "HLT is emulated");
    assert!(r.vcpu.halted);
    assert_eq!(r.vcpu.regs.rip, CODE + 1);
    assert_eq!(r.pmc(0), 1);
    // The vCPU waits; the timer interrupt wakes it and its handler's first NOP retires.
    r.step(HANDLER + 1);
    assert_eq!(r.pmc(0), 2);
    assert_eq!(r.precise.stats.hlt, 1);
}

#[test]
fn rdpmc_is_emulated_at_cpl0() {
    let mut r = Rig::new(&[NOP, 0x0F, 0x33, 0x0F, 0x33]);
    r.count();
    r.step(CODE + 1);
    r.vcpu.regs.rcx = 0;
    assert_eq!(r.before(true), Next::Retired);
    assert_eq!((r.vcpu.regs.rax, r.vcpu.regs.rdx), (1, 0), "RDPMC 0 reads what retired before it");
    assert_eq!(r.vcpu.regs.rip, CODE + 3);
    assert_eq!(r.pmc(0), 2, "and retires itself");
    // Fixed counters through ECX[30]: FIXED_CTR0 is not enabled, so it reads 0.
    r.vcpu.regs.rcx = 1 << 30;
    r.vcpu.regs.rax = 7;
    assert_eq!(r.before(true), Next::Retired);
    assert_eq!((r.vcpu.regs.rax, r.vcpu.regs.rip), (0, CODE + 5));
    assert_eq!(r.pmc(0), 3);
}

#[test]
fn rdpmc_at_cpl3_without_cr4_pce_raises_gp_and_does_not_retire() {
    let mut r = Rig::new(&[0x0F, 0x33, NOP]);
    r.count();
    r.vcpu.mode.cpl = 3;
    r.vcpu.regs.rcx = 0;
    assert_eq!(r.before(true), Next::Run);
    assert_eq!(r.vcpu.injected, [(GP_VECTOR, Some(0))]);
    assert_eq!(r.pmc(0), 0);
    // The entry delivers #GP: the handler's first instruction retires, at CPL0.
    r.vcpu.mode.cpl = 0;
    r.exit_at(GP_HANDLER + 1);
    assert_eq!(r.pmc(0), 1);
}

#[test]
fn a_wrmsr_that_writes_a_counting_counter_is_not_counted_by_it() {
    // wrmsr; nop
    let mut r = Rig::new(&[0x0F, 0x30, NOP]);
    r.count();
    assert_eq!(r.before(true), Next::Run);
    // The WRMSR exits to the VMM in the middle of the instruction and writes IA32_PMC0.
    r.wrmsr(msr::IA32_PMC0, 100);
    assert_eq!(r.before(false), Next::Run);
    r.exit_at(CODE + 2);
    assert_eq!(r.pmc(0), 100, "not counted by the counter it wrote");
    r.step(CODE + 3);
    assert_eq!(r.pmc(0), 101);
}

#[test]
fn the_wrmsr_that_stops_a_counter_counts_and_the_one_that_starts_it_does_not() {
    let mut r = Rig::new(&[0x0F, 0x30, NOP, 0x0F, 0x30, NOP]);
    r.wrmsr(msr::IA32_PERFEVTSEL0, 0x43_00C0);
    r.wrmsr(msr::IA32_PERF_GLOBAL_CTRL, 0);
    assert_eq!(r.before(true), Next::Run);
    assert!(!r.vcpu.single_step);
    // The starting WRMSR, mid-instruction: stepping starts, the WRMSR itself is not counted.
    r.wrmsr(msr::IA32_PERF_GLOBAL_CTRL, 1);
    assert_eq!(r.before(false), Next::Run);
    assert!(r.vcpu.single_step);
    r.exit_at(CODE + 2);
    r.step(CODE + 3);
    assert_eq!(r.before(true), Next::Run);
    // The stopping WRMSR, mid-instruction: it still counts.
    r.wrmsr(msr::IA32_PERF_GLOBAL_CTRL, 0);
    assert_eq!(r.before(false), Next::Run);
    r.exit_at(CODE + 5);
    assert_eq!(r.pmc(0), 2, "the NOP and the stopping WRMSR");
    assert_eq!(r.before(true), Next::Run);
    assert!(!r.vcpu.single_step);
}

#[test]
fn a_write_reprograms_only_the_counters_it_changed() {
    let mut r = Rig::new(&[NOP; 8]);
    r.count();
    r.wrmsr(msr::IA32_FIXED_CTR_CTRL, 0x3);
    r.wrmsr(msr::IA32_PERF_GLOBAL_CTRL, 1 << 32 | 0b11);
    r.step(CODE + 1);
    let before = r.precise.counters.reprogrammed;
    // One PERFEVTSEL write: one counter reprogrammed; the others keep counting.
    r.wrmsr(msr::IA32_PERFEVTSEL0 + 1, 0x43_00C0);
    r.step(CODE + 2);
    assert_eq!(r.precise.counters.reprogrammed - before, 1);
    // One fixed field: one counter. The same value again: none.
    r.wrmsr(msr::IA32_FIXED_CTR_CTRL, 0x2);
    r.wrmsr(msr::IA32_PERFEVTSEL0 + 1, 0x43_00C0);
    r.step(CODE + 3);
    assert_eq!(r.precise.counters.reprogrammed - before, 2);
    assert_eq!((r.pmc(0), r.pmc(1)), (3, 2), "PMC1 counts instructions since its reprogramming");
    assert_eq!(r.pmu.rdmsr(msr::IA32_FIXED_CTR0).unwrap(), 2, "FIXED_CTR0 counted CPL0 until set to USR only");
}

#[test]
fn a_user_mode_step_lost_to_the_guests_db_handler_is_reported() {
    let mut r = Rig::new(&[NOP, NOP]);
    r.count();
    r.vcpu.mode.cpl = 3;
    assert_eq!(r.before(true), Next::Run);
    // This host delivers the single-step trap of CPL3 code into the guest's #DB handler.
    r.vcpu.mode.cpl = 0;
    r.exit_at(DB_HANDLER + 1);
    assert_eq!(r.precise.stats.cpl3_lost, 1);
    assert!(
        r.precise.notes().iter().any(|n| n.starts_with("NOT EXACT: user-mode (CPL3) code")),
        "{:?}",
        r.precise.notes()
    );
}

/// `nop; rdtsc; nop; rdtsc`, counted from a guest TSC of 1000.
fn tsc_rig(settable: bool) -> Rig {
    let mut r = Rig::new(&[NOP, 0x0F, 0x31, NOP, 0x0F, 0x31, NOP]);
    r.vcpu.tsc = 1000;
    r.vcpu.tsc_settable = settable;
    r.count();
    r
}

#[test]
fn rdtsc_reads_the_model_clock_while_counting() {
    let mut r = tsc_rig(true);
    r.step(CODE + 1);
    // Real time runs on; the guest's TSC does not see it.
    r.vcpu.tsc = 50_000;
    assert_eq!(r.before(true), Next::Retired, "RDTSC is emulated");
    // The stretch began at 1000; one NOP (1 cycle) retired before the RDTSC.
    assert_eq!((r.vcpu.regs.rax, r.vcpu.regs.rdx, r.vcpu.regs.rip), (1001, 0, CODE + 3));
    r.step(CODE + 4);
    assert_eq!(r.before(true), Next::Retired);
    // NOP, RDTSC and NOP: 3 cycles.
    assert_eq!(r.vcpu.regs.rax, 1003);
    assert_eq!(r.pmc(0), 4, "both RDTSCs retire as instructions");
    assert_eq!(r.precise.stats.tsc_reads, 2);
}

#[test]
fn when_counting_stops_the_guest_tsc_goes_on_from_the_model() {
    let mut r = tsc_rig(true);
    r.step(CODE + 1);
    r.vcpu.tsc = 90_000;
    r.wrmsr(msr::IA32_PERF_GLOBAL_CTRL, 0);
    assert_eq!(r.before(true), Next::Run);
    assert!(!r.vcpu.single_step);
    assert_eq!(r.vcpu.tsc, 1001, "set to the model's TSC: no jump forward");
    assert!(r.precise.notes().is_empty(), "{:?}", r.precise.notes());
}

#[test]
fn a_host_that_cannot_set_the_tsc_is_reported() {
    let mut r = tsc_rig(false);
    r.step(CODE + 1);
    r.vcpu.tsc = 90_000;
    r.wrmsr(msr::IA32_PERF_GLOBAL_CTRL, 0);
    r.before(true);
    assert_eq!(r.vcpu.tsc, 90_000);
    let notes = r.precise.notes().join("\n");
    assert!(notes.contains("cannot set the guest's TSC") && notes.contains("88999 ticks"), "{notes}");
}

#[test]
fn a_model_ahead_of_real_time_is_waited_for_never_undone() {
    // `loop .` x 1000 (2 cycles a LOOP) from a guest TSC of 1000, with real time standing still.
    let mut r = Rig::new(&[0xE2, 0xFE, NOP]);
    r.vcpu.tsc_settable = false;
    r.vcpu.tsc = 1000;
    r.vcpu.regs.rcx = 1000;
    r.count();
    for _ in 0..999 {
        r.step(CODE);
        r.vcpu.regs.rcx -= 1;
    }
    r.step(CODE + 2);
    r.wrmsr(msr::IA32_PERF_GLOBAL_CTRL, 0);
    r.before(true);
    assert_eq!(r.vcpu.tsc, 1000 + 2 * 999 + 1, "the script's wait moves the TSC to the model's");
    assert!(!r.precise.notes().join("").contains("backwards"));
}

#[test]
fn reference_cycles_tick_with_the_profiles_clock() {
    let mut r = Rig::new(&[NOP; 40]);
    r.precise = Precise::with_engine(Engine::Step).with_ref_clock(Clock {
        tsc_per_ref_numerator: 7,
        tsc_per_ref_denominator: 2,
        ..Clock::TSC
    });
    // GP0: UnHalted Reference Cycles; fixed counter 2: REF_TSC.
    r.wrmsr(msr::IA32_PERFEVTSEL0, 0x43_013C);
    r.wrmsr(msr::IA32_FIXED_CTR_CTRL, 0x300);
    r.wrmsr(msr::IA32_PERF_GLOBAL_CTRL, 1 | 1 << 34);
    for n in 1..=35 {
        r.step(CODE + n);
    }
    // 35 cycles at 3.5 TSC ticks per reference tick.
    assert_eq!(r.pmc(0), 10);
    assert_eq!(r.pmu.rdmsr(msr::IA32_FIXED_CTR0 + 2).unwrap(), 35);
}

#[test]
fn llc_events_count_the_cache_models_lookups_and_misses() {
    // mov rax, [rsi]; add rsi, 64; mov rax, [rsi]; mov rax, [rsi]
    let mut r = Rig::new(&[0x48, 0x8B, 0x06, 0x48, 0x83, 0xC6, 0x40, 0x48, 0x8B, 0x06, 0x48, 0x8B, 0x06]);
    r.vcpu.regs.rsi = 0x30000;
    r.wrmsr(msr::IA32_PERFEVTSEL0, 0x43_4F2E); // LLC Reference
    r.wrmsr(msr::IA32_PERFEVTSEL0 + 1, 0x43_412E); // LLC Misses
    r.wrmsr(msr::IA32_PERF_GLOBAL_CTRL, 0b11);
    r.step(CODE + 3);
    assert_eq!((r.pmc(0), r.pmc(1)), (1, 1), "a cold line: one LLC reference, one miss");
    r.vcpu.regs.rsi = 0x30040;
    r.step(CODE + 7);
    r.step(CODE + 10);
    r.step(CODE + 13);
    assert_eq!((r.pmc(0), r.pmc(1)), (2, 2), "the next line misses; reading it again hits L1d");
    assert_eq!(r.precise.feed.unseen, 0);
}

#[test]
fn an_event_handlers_first_access_is_reported_unseen() {
    let mut r = Rig::new(&[NOP, NOP]);
    // The timer handler starts with `push rax`.
    r.vcpu.mem.write_slice(&[0x50, NOP], GuestAddress(HANDLER)).unwrap();
    r.wrmsr(msr::IA32_PERFEVTSEL0, 0x43_4F2E);
    r.wrmsr(msr::IA32_PERF_GLOBAL_CTRL, 1);
    r.step(HANDLER + 1);
    assert_eq!(r.precise.feed.unseen, 1);
    assert!(r.precise.notes().join("").contains("NOT EXACT: LLC events"), "{:?}", r.precise.notes());
}

#[test]
fn lfence_retires_in_emon_so_the_rdtsc_after_it_reads_the_model() {
    // lfence; rdtsc
    let mut r = Rig::new(&[0x0F, 0xAE, 0xE8, 0x0F, 0x31, NOP]);
    r.vcpu.tsc = 500;
    r.count();
    assert_eq!(r.before(true), Next::Retired, "LFENCE is retired by emon");
    assert_eq!(r.vcpu.regs.rip, CODE + 3);
    assert_eq!(r.before(true), Next::Retired, "RDTSC is emulated");
    assert_eq!(r.vcpu.regs.rax, 501);
    assert_eq!(r.pmc(0), 2);
}

#[test]
fn a_tsc_read_without_its_own_trap_is_reported() {
    // out dx, al; rdtsc; nop: the host lost the traps of the OUT and the RDTSC, which ran in KVM.
    let mut r = Rig::new(&[0xEE, 0x0F, 0x31, NOP]);
    r.count();
    r.step(CODE + 3);
    assert_eq!(r.pmc(0), 2);
    assert_eq!(r.precise.stats.tsc_unseen, 1);
    assert!(r.precise.notes().join("").contains("NOT EXACT: guest time"), "{:?}", r.precise.notes());
}

/// `wrmsr; rdmsr; wrmsr; nop` of the PMU's MSRs at CPL0 while PMC0 counts instructions: emon
/// completes each through the facade's accounting, as KVM's MSR exit would reach it, without a
/// step in KVM. The WRMSR that writes PMC0 (through its full-width alias) is not counted by it; the RDMSR reads the count before
/// it retires; a write of a reserved bit raises #GP and does not retire.
#[test]
fn pmu_msr_accesses_at_cpl0_are_completed_through_the_facade() {
    let mut r = Rig::new(&[0x0F, 0x30, 0x0F, 0x32, 0x0F, 0x30, NOP]);
    r.count();
    // The full-width alias (IA32_PMC0 itself takes EAX sign-extended, SDM 18.2.5).
    (r.vcpu.regs.rcx, r.vcpu.regs.rax, r.vcpu.regs.rdx) = (u64::from(msr::IA32_A_PMC0), 0xFFFF_FFFF_0000_0064, 0x1);
    assert_eq!(r.before(true), Next::Retired, "WRMSR of IA32_A_PMC0 is completed by emon");
    assert!(r.vcpu.injected.is_empty());
    assert_eq!(r.vcpu.regs.rip, CODE + 2);
    assert_eq!(r.pmc(0), 0x1_0000_0064, "EDX:EAX written, not counted by the counter it wrote");
    assert_eq!(r.pmc(1), 0, "no branch");
    // RDMSR: the count so far in EDX:EAX, the upper halves of RAX and RDX cleared.
    (r.vcpu.regs.rcx, r.vcpu.regs.rax, r.vcpu.regs.rdx) = (u64::from(msr::IA32_PMC0), u64::MAX, u64::MAX);
    assert_eq!(r.before(true), Next::Retired, "RDMSR of IA32_PMC0 is completed by emon");
    assert_eq!((r.vcpu.regs.rax, r.vcpu.regs.rdx), (0x64, 0x1));
    assert_eq!(r.pmc(0), 0x1_0000_0065, "the RDMSR retired after its read");
    // A reserved bit of IA32_PERFEVTSEL0 (bit 32): #GP, nothing retires or changes.
    (r.vcpu.regs.rcx, r.vcpu.regs.rax, r.vcpu.regs.rdx) = (u64::from(msr::IA32_PERFEVTSEL0), 0, 1);
    assert_eq!(r.before(true), Next::Run, "KVM delivers the #GP");
    assert_eq!(r.vcpu.injected, [(GP_VECTOR, Some(0))]);
    assert_eq!((r.vcpu.regs.rip, r.pmc(0)), (CODE + 4, 0x1_0000_0065));
    assert_eq!(r.pmu.rdmsr(msr::IA32_PERFEVTSEL0).unwrap(), 0x43_00C0);
    let s = r.msrs.stats;
    assert_eq!((s.reads, s.writes, s.gp), (1, 2, 1), "each access is the facade's to account for");
    assert_eq!(r.precise.stats.pmu_msrs, 2);
    // Another MSR (IA32_TSC_AUX) is KVM's, stepped as before; so is a PMU MSR where something
    // KVM holds may come in before it: interrupts enabled, or a PMI queued.
    for (rcx, rflags, queued) in [(0xC000_0103, 2, false), (0x38F, 2 | RFLAGS_IF, false), (0x38F, 2, true)] {
        let mut r = Rig::new(&[0x0F, 0x30, NOP]);
        r.count();
        (r.vcpu.regs.rcx, r.vcpu.regs.rflags) = (rcx, rflags);
        if queued {
            r.precise.event_queued();
        }
        assert_eq!(r.before(true), Next::Run, "{rcx:#x} {rflags:#x} {queued}");
        assert_eq!(r.msrs.stats, MsrStats::default());
    }
}

/// `out dx, al; in al, dx; in eax, dx; out dx, ax` to the VMM's own device at CPL0 while PMC0
/// counts instructions: emon completes each through the VMM's ports, as KVM's I/O exit would reach
/// them, without a step in KVM, and each retires and counts once. IN of AL keeps the rest of RAX,
/// IN of EAX clears its upper half (SDM Vol. 1 3.4.1.1); OUT writes the operand's bytes only.
#[test]
fn port_accesses_of_the_vmms_devices_at_cpl0_are_completed_by_emon() {
    let mut r = Rig::new(&[0xEE, 0xEC, 0xED, 0x66, 0xEF, NOP]);
    r.count();
    (r.vcpu.regs.rdx, r.vcpu.regs.rax) = (u64::from(TestPorts::PORT), 0x1234_5678_9ABC_DE41);
    assert_eq!(r.before(true), Next::Retired, "OUT, completed by emon");
    assert_eq!(r.ports.written, [(TestPorts::PORT, vec![0x41])]);
    assert_eq!((r.vcpu.regs.rip, r.pmc(0)), (CODE + 1, 1));
    assert_eq!(r.before(true), Next::Retired, "IN of AL");
    assert_eq!(r.vcpu.regs.rax, 0x1234_5678_9ABC_DE60);
    assert_eq!(r.before(true), Next::Retired, "IN of EAX");
    assert_eq!(r.vcpu.regs.rax, 0x6060_6060);
    r.vcpu.regs.rax = 0xFFFF_0102;
    assert_eq!(r.before(true), Next::Retired, "OUT of AX");
    assert_eq!(r.ports.written[1], (TestPorts::PORT, vec![0x02, 0x01]));
    assert_eq!((r.vcpu.regs.rip, r.pmc(0), r.pmc(1)), (CODE + 5, 4, 0));
    assert_eq!((r.ports.reads, r.precise.stats.ports), (2, 4));
    assert!(r.vcpu.injected.is_empty());
    // KVM's, stepped as before: another port (one of KVM's in-kernel devices, perhaps); with
    // interrupts enabled, where KVM would deliver what it holds first and the engine does not run
    // this host's kernel code; with a PMI queued; with the guest's breakpoints armed (an I/O
    // breakpoint is KVM's to raise).
    for (dx, rflags, queued, dr7) in [
        (0x80, 2, false, 0),
        (u64::from(TestPorts::PORT), 2 | RFLAGS_IF, false, 0),
        (u64::from(TestPorts::PORT), 2, true, 0),
        (u64::from(TestPorts::PORT), 2, false, 0b10),
    ] {
        let mut r = Rig::new(&[0xEE, NOP]);
        r.count();
        (r.vcpu.regs.rdx, r.vcpu.regs.rflags, r.vcpu.dr7) = (dx, rflags, dr7);
        if queued {
            r.precise.event_queued();
        }
        assert_eq!(r.before(true), Next::Run, "{dx:#x} {rflags:#x} {queued} {dr7:#x}");
        assert!(r.ports.written.is_empty());
        r.exit_at(CODE + 1);
        assert_eq!((r.pmc(0), r.precise.stats.ports), (1, 0), "stepped in KVM and counted once");
    }
}

/// `mov [rdi], esi; nop` at CPL0 while PMC0 counts instructions, RDI at the xAPIC page's LVTPC
/// (Linux's unmasking of it at the end of a PMI): emon writes the register's writable bits (the
/// delivery status is read-only, SDM Vol. 3A 11.5.1) into the local APIC's page itself, without
/// a KVM step, and the MOV retires and counts once; a software-disabled APIC keeps it masked (SDM
/// Vol. 3A 11.4.7.2). Any other register, an x2APIC (no page), a translation whose accessed or
/// dirty flag the store would set, a queued PMI or, where the engine does not run this host's
/// kernel code, interrupts enabled leave the store to KVM.
#[test]
fn an_lvtpc_write_at_cpl0_is_completed_in_the_local_apics_page() {
    const APIC: u64 = 0xFEE0_0000;
    /// PDPT 0x2000 entry 3 -> PD 0x5000, whose entry for the APIC's 2 MiB maps it with `flags`;
    /// the entries above it accessed.
    fn apic_rig(flags: u64) -> Rig {
        let mut r = Rig::new(&[0x89, 0x37, NOP]);
        r.vcpu.mem.write_obj(0x2023u64, GuestAddress(0x1000)).unwrap();
        r.vcpu.mem.write_obj(0x5023u64, GuestAddress(0x2000 + 3 * 8)).unwrap();
        r.vcpu.mem.write_obj(APIC | flags, GuestAddress(0x5000 + ((APIC >> 21) & 0x1FF) * 8)).unwrap();
        r.vcpu.sregs.apic_base = APIC | 0x900; // BSP, EN
        crate::lapic::set_reg(&mut r.vcpu.lapic, crate::lapic::SVR, 0x1FF);
        crate::lapic::set_reg(&mut r.vcpu.lapic, crate::lapic::LVT_PMC, crate::lapic::LVT_MASKED | 0x400);
        (r.vcpu.regs.rdi, r.vcpu.regs.rsi) = (APIC + crate::lapic::LVT_PMC as u64, 0xFFFE_F400);
        r.count();
        r
    }
    // Present, writable, 2 MiB, accessed and dirty.
    const MAPPED: u64 = 0x83 | 0x20 | 0x40;
    let lvtpc = |r: &Rig| crate::lapic::reg(&r.vcpu.lapic, crate::lapic::LVT_PMC);
    let mut r = apic_rig(MAPPED);
    assert_eq!(r.before(true), Next::Retired, "completed by emon");
    assert_eq!(lvtpc(&r), 0x400, "NMI, unmasked: the delivery status and the reserved bits written are dropped");
    assert_eq!((r.vcpu.regs.rip, r.pmc(0), r.precise.stats.lvtpc_writes), (CODE + 2, 1, 1));
    assert!(r.vcpu.injected.is_empty());
    let mut r = apic_rig(MAPPED);
    r.vcpu.regs.rsi = 0xFFFF_FFFF;
    assert_eq!(r.before(true), Next::Retired);
    assert_eq!(lvtpc(&r), 0x1_07FF, "vector, delivery mode and mask; not the delivery status");
    let mut r = apic_rig(MAPPED);
    crate::lapic::set_reg(&mut r.vcpu.lapic, crate::lapic::SVR, 0xFF);
    assert_eq!(r.before(true), Next::Retired);
    assert_eq!(lvtpc(&r), crate::lapic::LVT_MASKED | 0x400, "a software-disabled APIC masks it");
    for (what, flags, rdi, apic_base, rflags, queued) in [
        ("LINT0", MAPPED, APIC + 0x350, APIC | 0x900, 2, false),
        ("x2APIC", MAPPED, APIC + 0x340, APIC | 0xD00, 2, false),
        ("dirty flag to set", 0x83 | 0x20, APIC + 0x340, APIC | 0x900, 2, false),
        ("interrupts enabled", MAPPED, APIC + 0x340, APIC | 0x900, 2 | RFLAGS_IF, false),
        ("a PMI queued", MAPPED, APIC + 0x340, APIC | 0x900, 2, true),
    ] {
        let mut r = apic_rig(flags);
        (r.vcpu.regs.rdi, r.vcpu.sregs.apic_base, r.vcpu.regs.rflags) = (rdi, apic_base, rflags);
        if queued {
            r.precise.event_queued();
        }
        assert_eq!(r.before(true), Next::Run, "{what}: KVM's");
        assert_eq!((lvtpc(&r), r.precise.stats.lvtpc_writes), (crate::lapic::LVT_MASKED | 0x400, 0), "{what}");
    }
}

/// Kernel code that polls a UART (`in al, dx; test al, 0x20; jz` back, then `out dx, al`) where
/// this host's CPL0 code runs in the engine, with interrupts enabled and nothing counting: emon
/// completes the port accesses (the engine runs between them), and KVM is never entered.
#[cfg(feature = "tcg")]
#[test]
fn a_polled_uart_in_kernel_code_the_engine_runs_is_completed_without_kvm() {
    // in al, dx; test al, 0x20; jz -5; out dx, al; hlt
    let mut r = Rig::new(&[0xEC, 0xA8, 0x20, 0x74, 0xFB, 0xEE, 0xF4]);
    r.precise = Precise::with_engine(Engine::Tcg).with_cpl0_in_engine(true);
    r.precise.engine.set_event_clock(EventClock::manual());
    (r.vcpu.regs.rdx, r.vcpu.regs.rflags) = (u64::from(TestPorts::PORT), 2 | RFLAGS_IF);
    while r.vcpu.regs.rip != CODE + 6 {
        assert_eq!(r.before(true), Next::Retired, "at {:#x}", r.vcpu.regs.rip);
    }
    assert_eq!((r.ports.reads, r.ports.written.len(), r.precise.stats.ports), (1, 1, 2));
    assert_eq!(r.ports.written[0], (TestPorts::PORT, vec![0x60]), "the status read, written back");
    assert_eq!(r.precise.stats.engine_runs, 1, "the TEST and JZ between them");
}

/// `nop; wrmsr; nop; hlt` with the WRMSR enabling IA32_PMC0 (instructions at every CPL), CPL0 code
/// in the engine while nothing counts: the engine runs the NOP and stops at the WRMSR, which emon
/// completes without KVM; it starts the counter after itself, so it is not counted, and the
/// next NOP is.
#[cfg(feature = "tcg")]
#[test]
fn the_global_ctrl_write_emon_completes_starts_counting_after_itself() {
    let mut r = Rig::new(&[NOP, 0x0F, 0x30, NOP, 0xF4]);
    r.precise = Precise::with_engine(Engine::Tcg).with_cpl0_in_engine(true);
    r.wrmsr(msr::IA32_PERF_GLOBAL_CTRL, 0);
    r.wrmsr(msr::IA32_PERFEVTSEL0, 0x43_00C0);
    (r.vcpu.regs.rcx, r.vcpu.regs.rax, r.vcpu.regs.rdx) = (u64::from(msr::IA32_PERF_GLOBAL_CTRL), 1, 0);
    assert_eq!(r.before(true), Next::Retired, "the NOP, in the engine");
    assert_eq!((r.vcpu.regs.rip, r.precise.stats.engine_runs), (CODE + 1, 1));
    assert_eq!(r.before(true), Next::Retired, "the WRMSR, completed by emon");
    assert_eq!((r.vcpu.regs.rip, r.pmc(0), r.precise.stats.pmu_msrs), (CODE + 3, 0, 1));
    assert_eq!(r.msrs.stats.writes, 1);
    assert_eq!(r.before(true), Next::Retired, "the NOP after it, counted in the engine");
    assert_eq!((r.vcpu.regs.rip, r.pmc(0)), (CODE + 4, 1));
}

/// `nop; wrmsr; rdmsr; rdmsr; nop` with ECX = IA32_TSC_DEADLINE, counted from a guest TSC of
/// 1000 while KVM's guest TSC has run on to 50,000 (a host that cannot set it): emon holds the
/// deadline on the model's time and fires it, through KVM's timer set long past, at the first
/// boundary where the model's TSC has reached it; KVM's own timer stays off meanwhile.
#[test]
fn the_tsc_deadline_fires_when_the_models_time_reaches_it() {
    let mut r = Rig::new(&[NOP, 0x0F, 0x30, 0x0F, 0x32, 0x0F, 0x32, NOP]);
    r.tsc_deadline_mode();
    r.vcpu.tsc = 1000;
    r.count();
    r.step(CODE + 1);
    r.vcpu.tsc = 50_000;
    // The guest asks for the timer 150 ticks after its TSC (1001: one NOP retired).
    r.vcpu.regs.rcx = 0x6E0;
    (r.vcpu.regs.rax, r.vcpu.regs.rdx) = (1151, 0);
    assert_eq!(r.before(true), Next::Retired, "WRMSR of the deadline is emulated");
    assert_eq!((r.vcpu.regs.rip, r.vcpu.tsc_deadline), (CODE + 3, 0), "KVM's timer stays off");
    // Read back at 1102 (the NOP, the WRMSR's 101 cycles): not due yet.
    (r.vcpu.regs.rax, r.vcpu.regs.rdx) = (0, 0);
    assert_eq!(r.before(true), Next::Retired, "RDMSR of the deadline is emulated");
    assert_eq!((r.vcpu.regs.rax, r.vcpu.regs.rdx, r.vcpu.tsc_deadline), (1151, 0, 0), "as the guest wrote it");
    // At 1203 it is due: the boundary fires it, and the next read gives 0 (SDM Vol. 3A 11.5.4.1).
    assert_eq!(r.before(true), Next::Retired);
    assert_eq!(r.vcpu.tsc_deadline, 1, "KVM's timer, long past: it raises the interrupt at the entry");
    assert_eq!((r.vcpu.regs.rax, r.vcpu.regs.rip), (0, CODE + 7));
    assert_eq!(r.pmc(0), 4, "NOP, WRMSR and both RDMSRs retire");
    assert_eq!(r.precise.stats.tsc_deadlines, 3);
    // 0 disarms the timer; a deadline already past fires at once.
    let mut r = Rig::new(&[0x0F, 0x30, 0x0F, 0x30, NOP]);
    r.tsc_deadline_mode();
    (r.vcpu.tsc, r.vcpu.tsc_deadline) = (1000, 77_000);
    r.count();
    (r.vcpu.regs.rcx, r.vcpu.regs.rax, r.vcpu.regs.rdx) = (0x6E0, 0, 0);
    assert_eq!(r.before(true), Next::Retired);
    assert_eq!(r.vcpu.tsc_deadline, 0, "the deadline KVM held went to emon, and 0 disarmed it");
    r.vcpu.regs.rax = 999;
    assert_eq!(r.before(true), Next::Retired);
    assert_eq!(r.vcpu.tsc_deadline, 1, "fired at once");
    // Outside TSC-deadline mode the MSR reads 0 and writes are ignored (SDM Vol. 3A 11.5.4.1).
    let mut r = Rig::new(&[0x0F, 0x30, 0x0F, 0x32, NOP]);
    r.vcpu.tsc = 1000;
    r.count();
    (r.vcpu.regs.rcx, r.vcpu.regs.rax, r.vcpu.regs.rdx) = (0x6E0, 5000, 0);
    assert_eq!(r.before(true), Next::Retired);
    assert_eq!(r.before(true), Next::Retired);
    assert_eq!((r.vcpu.regs.rax, r.vcpu.tsc_deadline), (0, 0), "one-shot mode: nothing armed");
}

/// `wrmsr; hlt` arming the deadline 1,000 ticks after the model's TSC, on a host whose guest
/// TSC is elsewhere: while the vCPU is halted KVM holds the deadline moved onto its own TSC, the
/// time slept passes on the guest's, and once KVM's timer woke it the deadline has fired. Woken
/// by another interrupt first, emon holds the deadline again.
#[test]
fn a_halted_vcpu_wakes_at_its_deadline_on_the_models_time() {
    for timer_woke_it in [true, false] {
        let mut r = Rig::new(&[0x0F, 0x30, 0xF4, NOP]);
        r.tsc_deadline_mode();
        r.vcpu.tsc = 1000;
        r.count();
        assert_eq!(r.before(true), Next::Run, "the counted stretch begins at a guest TSC of 1000");
        r.vcpu.tsc = 50_000;
        (r.vcpu.regs.rcx, r.vcpu.regs.rax, r.vcpu.regs.rdx) = (0x6E0, 2000, 0);
        r.precise.step.pending = None;
        assert_eq!(r.before(true), Next::Retired, "WRMSR");
        let v = r.precise.clock.virtual_tsc().unwrap();
        assert_eq!(r.before(true), Next::Retired, "HLT is emulated");
        let hlt = r.precise.clock.virtual_tsc().unwrap() - v;
        let on_kvm = 50_000 + (2000 - v - hlt);
        assert_eq!(r.vcpu.tsc_deadline, on_kvm, "KVM's timer wakes the vCPU as far ahead as the deadline");
        let woke = if timer_woke_it { on_kvm + 5 } else { on_kvm - 300 };
        r.vcpu.tsc = woke;
        if timer_woke_it {
            r.vcpu.tsc_deadline = 0;
        }
        r.step(HANDLER + 1);
        let slept = woke - 50_000;
        let clock = &r.precise.clock;
        assert_eq!(clock.virtual_tsc().unwrap(), v + hlt + slept + 1, "the time slept, and the handler's NOP");
        if timer_woke_it {
            assert_eq!((clock.armed_deadline(), r.vcpu.tsc_deadline), (None, 0), "it fired");
        } else {
            assert_eq!((clock.armed_deadline(), r.vcpu.tsc_deadline), (Some(2000), 0), "emon holds it again");
        }
    }
}

/// `--guest-time model` where emon runs all of the guest's code (user mode in the engine): with
/// nothing counting, kernel code's RDTSC in the engine reads the model's time (KVM's guest TSC
/// when the run began plus the NOPs' cycles before it), not the host's time.
#[cfg(feature = "tcg")]
#[test]
fn model_guest_time_runs_the_tsc_on_the_model_clock_with_nothing_counting() {
    for guest_time in [GuestTime::Model, GuestTime::Counted] {
        let mut r = Rig::new(&[NOP, NOP, NOP, 0x0F, 0x31, 0xF4]);
        r.precise = Precise::with_engine(Engine::Tcg)
            .with_cpl0_in_engine(true)
            .with_user_in_engine(true)
            .with_guest_time(guest_time);
        r.vcpu.tsc = 1000;
        r.vcpu.tsc_window = Some(crate::TscWindow { offset: 0, floor: 50_000, aux: 0 });
        while r.vcpu.regs.rip != CODE + 5 {
            assert_eq!(r.before(true), Next::Retired, "at {:#x}", r.vcpu.regs.rip);
        }
        let read = r.vcpu.regs.rax | r.vcpu.regs.rdx << 32;
        if guest_time == GuestTime::Model {
            assert_eq!(read, 1003, "the model's time: 1000 and three NOPs");
            assert!(r.precise.clock.throughout());
        } else {
            assert!(read >= 50_000, "real time, from the host's TSC: {read}");
        }
    }
}

/// Skylake's model-specific events (README, "Model-specific events"), by their list's encodings:
/// MEM_INST_RETIRED.ALL_LOADS (0xD0/0x81), ALL_STORES (0x82), BR_INST_RETIRED.CONDITIONAL
/// (0xC4/0x01) and MEM_LOAD_RETIRED.L1_MISS (0xD1/0x08), over
/// `mov rax, [rsi]; mov [rsi+8], rax; add [rsi], rax; jnz +0; mov rax, [rsi+60]`.
#[test]
fn model_specific_events_count_loads_stores_branches_and_sources() {
    let code = [
        0x48, 0x8B, 0x06, // mov rax, [rsi]
        0x48, 0x89, 0x46, 0x08, // mov [rsi+8], rax
        0x48, 0x01, 0x06, // add [rsi], rax
        0x75, 0x00, // jnz +0
        0x48, 0x8B, 0x46, 0x3C, // mov rax, [rsi+60]: crosses into the next line
    ];
    let mut r = Rig::new(&code);
    r.vcpu.regs.rsi = 0x30000;
    r.vcpu.regs.rax = 1;
    for (i, sel) in [0x43_81D0u64, 0x43_82D0, 0x43_01C4, 0x43_08D1].into_iter().enumerate() {
        r.wrmsr(msr::IA32_PERFEVTSEL0 + i as u32, sel);
    }
    r.wrmsr(msr::IA32_PERF_GLOBAL_CTRL, 0b1111);
    for next in [CODE + 3, CODE + 7, CODE + 10, CODE + 12, CODE + 16] {
        r.step(next);
    }
    // Loads: the MOV, the ADD (a read-modify-write) and the last MOV; stores: the MOV and the ADD.
    assert_eq!((r.pmc(0), r.pmc(1), r.pmc(2)), (3, 2, 1));
    // L1 misses: the first load (a cold line) and the split one, whose second line is cold.
    assert_eq!(r.pmc(3), 2);
    assert!(r.precise.notes().is_empty(), "{:?}", r.precise.notes());
}

#[test]
fn uncounted_and_misplaced_events_are_named_in_the_notes() {
    let mut r = Rig::new(&[NOP; 4]);
    // UOPS_ISSUED.ANY (0x0E/0x01) is not counted; INST_RETIRED.PREC_DIST (0xC0/0x01) counts on
    // IA32_PMC1 only.
    r.wrmsr(msr::IA32_PERFEVTSEL0, 0x43_010E);
    r.wrmsr(msr::IA32_PERFEVTSEL0 + 2, 0x43_01C0);
    r.wrmsr(msr::IA32_PERFEVTSEL0 + 1, 0x43_01C0);
    r.wrmsr(msr::IA32_PERF_GLOBAL_CTRL, 0b111);
    r.step(CODE + 1);
    r.step(CODE + 2);
    assert_eq!((r.pmc(0), r.pmc(1), r.pmc(2)), (0, 2, 0));
    let notes = r.precise.notes().join("\n");
    assert!(
        notes.contains("events emon does not derive, and counted 0: IA32_PMC0 UOPS_ISSUED.ANY (0x0e/0x01)"),
        "{notes}"
    );
    assert!(notes.contains("does not give them (silicon's count is undefined there), and counted 0: IA32_PMC2 INST_RETIRED.PREC_DIST (0xc0/0x01)"), "{notes}");
}

/// User mode for the delivery tests: CPL3 at [`CODE`], a GDT at [`GDT`] with a 64-bit kernel
/// code segment at 0x08, a TSS at [`TSS`] whose RSP0 is [`KERNEL_STACK`], and gate `v` a DPL3
/// interrupt gate to [`HANDLER`].
fn user_rig(code: &[u8], v: u8, precise: Precise) -> Rig {
    let mut r = Rig::new(code);
    r.precise = precise;
    r.vcpu.mode.cpl = 3;
    // The page tables of [`Rig::new`], user-accessible.
    r.vcpu.mem.write_obj(0x2007u64, GuestAddress(0x1000)).unwrap();
    r.vcpu.mem.write_obj(0x3007u64, GuestAddress(0x2000)).unwrap();
    r.vcpu.mem.write_obj(0x87u64, GuestAddress(0x3000)).unwrap();
    r.vcpu.mem.write_obj(0x00AF_9B00_0000_FFFFu64, GuestAddress(GDT + 8)).unwrap();
    // The user's data (0x2B) and 64-bit code (0x33) segments, which the engine's IRETQ loads.
    r.vcpu.mem.write_obj(0x00CF_F300_0000_FFFFu64, GuestAddress(GDT + 0x28)).unwrap();
    r.vcpu.mem.write_obj(0x00AF_FB00_0000_FFFFu64, GuestAddress(GDT + 0x30)).unwrap();
    r.vcpu.sregs.gdt.limit = 0x37;
    r.vcpu.mem.write_obj(KERNEL_STACK, GuestAddress(TSS + 4)).unwrap();
    r.vcpu.sregs.gdt.base = GDT;
    r.vcpu.sregs.tr.base = TSS;
    (r.vcpu.sregs.cr0, r.vcpu.sregs.cr3, r.vcpu.sregs.cr4) = (r.vcpu.mode.cr0, r.vcpu.mode.cr3, r.vcpu.mode.cr4);
    r.vcpu.sregs.efer = r.vcpu.mode.efer;
    r.vcpu.sregs.cs =
        kvm_bindings::kvm_segment { selector: 0x33, dpl: 3, l: 1, s: 1, type_: 11, present: 1, ..Default::default() };
    r.vcpu.sregs.ss =
        kvm_bindings::kvm_segment { selector: 0x2B, dpl: 3, db: 1, s: 1, type_: 3, present: 1, ..Default::default() };
    r.vcpu.regs.rflags = 0x202;
    let lo = (HANDLER & 0xFFFF) | 0x08 << 16 | 0xEE << 40 | ((HANDLER >> 16) & 0xFFFF) << 48;
    r.vcpu.mem.write_obj(lo, GuestAddress(IDT + u64::from(v) * 16)).unwrap();
    r
}

const GDT: u64 = 0x5000;
const TSS: u64 = 0x6000;
const KERNEL_STACK: u64 = 0x30000;

/// The interrupt frame at the top of [`KERNEL_STACK`]: RIP, CS, RFLAGS, RSP, SS.
fn kernel_frame(r: &Rig) -> [u64; 5] {
    std::array::from_fn(|i| r.vcpu.mem.read_obj(GuestAddress(KERNEL_STACK - 40 + 8 * i as u64)).unwrap())
}

#[test]
fn int_n_from_user_mode_retires_once_into_its_handler_where_the_host_swallows_it() {
    let mut r = user_rig(&[0xCD, 0x80, NOP], 0x80, Precise::with_engine(Engine::Step).with_user_in_engine(true));
    r.count();
    assert_eq!(r.before(true), Next::Retired, "emon delivers INT 0x80");
    assert_eq!(r.vcpu.regs.rip, HANDLER);
    assert_eq!((r.vcpu.sregs.cs.selector, r.vcpu.regs.rsp), (0x08, KERNEL_STACK - 40));
    assert_eq!(kernel_frame(&r), [CODE + 2, 0x33, 0x202, STACK, 0x2B], "the frame returns past the INT");
    assert_eq!(r.vcpu.regs.rflags & (1 << 9), 0, "an interrupt gate clears IF");
    assert_eq!((r.pmc(0), r.pmc(1)), (1, 1), "INT n retires as one instruction, a far branch");
    assert_eq!(r.precise.stats.soft_interrupts, 1);
}

#[test]
fn int_n_to_a_kernel_gate_from_user_mode_raises_gp_and_does_not_retire() {
    let mut r = user_rig(&[0xCD, 0x81, NOP], 0x80, Precise::with_engine(Engine::Step).with_user_in_engine(true));
    r.gate(0x81, HANDLER);
    r.count();
    assert_eq!(r.before(true), Next::Run, "KVM delivers the #GP");
    assert_eq!(r.vcpu.injected, [(GP_VECTOR, Some(0x81 * 8 + 2))]);
    r.exit_at(GP_HANDLER + 1);
    assert_eq!(r.pmc(0), 1, "the #GP handler's first instruction, not the INT");
}

#[cfg(feature = "tcg")]
#[test]
fn an_interrupt_due_at_a_user_mode_boundary_is_delivered_through_the_idt() {
    use crate::DueEvent;
    let mut r = user_rig(&[NOP, NOP], TIMER, Precise::with_engine(Engine::Tcg).with_user_in_engine(true));
    r.vcpu.due_events.push_back(Some(DueEvent::Interrupt(TIMER)));
    r.count();
    assert_eq!(r.before(true), Next::Retired, "delivered by emon, no entry");
    assert_eq!(r.vcpu.event_probes, 1, "KVM asked at the first user-mode boundary");
    assert_eq!(r.vcpu.regs.rip, HANDLER);
    assert_eq!(kernel_frame(&r), [CODE, 0x33, 0x202, STACK, 0x2B], "the frame returns to the interrupted boundary");
    assert_eq!(r.pmc(0), 0, "a delivery retires nothing");
    assert_eq!(r.vcpu.queued_event, None);
    assert_eq!(r.precise.stats.user_events, 1);
}

/// An interrupt that came due while the kernel had IF clear is taken at the first user-mode
/// boundary (SDM Vol. 3A 6.8.1), with no progress rule; only after one that left user mode no
/// progress does the next wait until user mode has retired `USER_PROGRESS` instructions.
#[cfg(feature = "tcg")]
#[test]
fn an_event_due_on_entering_user_mode_is_taken_at_once_and_one_that_starves_it_waits() {
    use crate::DueEvent;
    // mov ecx, 100000; 1: dec ecx; jnz 1b
    let code = [0xB9, 0xA0, 0x86, 0x01, 0x00, 0xFF, 0xC9, 0x75, 0xFC];
    let mut r = user_rig(&code, TIMER, Precise::with_engine(Engine::Tcg).with_user_in_engine(true));
    let user = (r.vcpu.regs, r.vcpu.sregs, r.vcpu.mode);
    r.count();
    r.vcpu.due_events.push_back(Some(DueEvent::Interrupt(TIMER)));
    assert_eq!(r.before(true), Next::Retired, "delivered by emon, no entry");
    assert_eq!(r.vcpu.regs.rip, HANDLER, "taken before the first user instruction");
    assert_eq!(r.pmc(0), 0);
    // The handler returns to user mode at once, where the next interrupt is already due.
    (r.vcpu.regs, r.vcpu.sregs, r.vcpu.mode) = user;
    r.vcpu.due_events.push_back(Some(DueEvent::Interrupt(TIMER)));
    assert_eq!(r.before(true), Next::Retired);
    assert_eq!(r.vcpu.event_probes, 1, "not asked: the last event left user mode no progress");
    assert!(r.pmc(0) > 0, "user code ran");
    // Asked once user mode has run 1,000 instructions (the run stops there, within a block) or a
    // millisecond, whichever comes first.
    while r.vcpu.event_probes == 1 {
        assert_eq!(r.before(true), Next::Retired);
    }
    assert_eq!(r.vcpu.regs.rip, HANDLER, "then the event is taken");
    let ran = r.pmc(0);
    assert!(ran < 1000 + 512 + 2, "no further than the progress rule's budget: {ran}");
    assert_eq!(r.precise.stats.user_events, 2);
}

#[cfg(feature = "tcg")]
#[test]
fn an_event_emon_cannot_deliver_goes_back_to_kvm_for_the_next_entry() {
    use crate::DueEvent;
    let mut r = user_rig(&[NOP, NOP], TIMER, Precise::with_engine(Engine::Tcg).with_user_in_engine(true));
    r.vcpu.sregs.gdt.base = 0x1F_F000; // the gate's code segment reads as null
    r.vcpu.due_events.push_back(Some(DueEvent::Interrupt(TIMER)));
    assert_eq!(r.before(true), Next::Run, "KVM's entry delivers it");
    assert_eq!(r.vcpu.queued_event, Some(DueEvent::Interrupt(TIMER)));
    assert_eq!(r.vcpu.regs.rip, CODE, "nothing delivered by emon");
}

/// A user-mode REP string instruction whose iterations outrun one engine run (its budget, or its
/// time on a loaded machine) goes on in the next run and retires once, never going to KVM.
#[cfg(feature = "tcg")]
#[test]
fn a_user_mode_rep_string_instruction_longer_than_a_run_stays_in_the_engine() {
    // rep stosb; nop; hlt
    let mut r = user_rig(&[0xF3, 0xAA, NOP, 0xF4], TIMER, Precise::with_engine(Engine::Tcg).with_user_in_engine(true));
    (r.vcpu.regs.rcx, r.vcpu.regs.rdi, r.vcpu.regs.rax) = (100_000, 0x10_0000, 0xAB);
    r.count();
    r.precise.limit_next_run(600);
    assert_eq!(r.before(true), Next::Retired);
    assert_eq!(r.vcpu.regs.rip, CODE, "stopped midway");
    assert!(r.vcpu.regs.rcx > 0 && r.vcpu.regs.rcx < 100_000, "{}", r.vcpu.regs.rcx);
    while r.vcpu.regs.rip == CODE {
        assert_eq!(r.before(true), Next::Retired);
    }
    assert_eq!(r.vcpu.regs.rcx, 0);
    assert_eq!(r.vcpu.mem.read_obj::<u8>(GuestAddress(0x10_0000 + 99_999)).unwrap(), 0xAB);
    assert!(r.precise.stats.user_to_kvm.is_empty(), "nothing went to KVM");
    assert_eq!(r.pmc(0), 2, "the REP STOSB retired once, then the NOP");
}

/// User code that single-steps itself (RFLAGS.TF), on a host where user mode runs in the engine:
/// after each instruction emon takes the trap the CPU takes (DR6.BS, #DB with the frame at the
/// next instruction and TF in its RFLAGS); a REP string instruction traps after each iteration
/// and retires once.
#[cfg(feature = "tcg")]
#[test]
fn user_code_with_tf_set_traps_after_each_instruction() {
    // nop; rep stosb (RCX = 2)
    let mut r = user_rig(&[NOP, 0xF3, 0xAA, NOP], TIMER, Precise::with_engine(Engine::Tcg).with_user_in_engine(true));
    r.vcpu.regs.rflags = 0x302;
    (r.vcpu.regs.rcx, r.vcpu.regs.rdi) = (2, 0x10_0000);
    let user = (r.vcpu.regs, r.vcpu.sregs, r.vcpu.mode);
    r.count();
    let mut frames = Vec::new();
    for _ in 0..3 {
        assert_eq!(r.before(true), Next::Retired, "completed and trapped by emon");
        assert_eq!(r.vcpu.regs.rip, DB_HANDLER);
        assert_ne!(r.vcpu.dr6 & emon_x86::arch::DR6_BS, 0, "DR6.BS");
        frames.push((kernel_frame(&r), r.vcpu.regs.rcx, r.pmc(0)));
        // The handler returns to user mode with IRETQ, TF still set.
        let (regs, sregs, mode) = user;
        (r.vcpu.regs, r.vcpu.sregs, r.vcpu.mode) = (
            kvm_regs { rip: frames.last().unwrap().0[0], rcx: r.vcpu.regs.rcx, rdi: r.vcpu.regs.rdi, ..regs },
            sregs,
            mode,
        );
    }
    let frame = |rip| [rip, 0x33, 0x302, STACK, 0x2B];
    assert_eq!(
        frames,
        [(frame(CODE + 1), 2, 1), (frame(CODE + 1), 1, 1), (frame(CODE + 3), 0, 2)],
        "after the NOP, after each REP iteration (the REP retiring after its last)"
    );
    assert_eq!(r.precise.stats.single_step_traps, 3);
    assert!(r.precise.stats.user_to_kvm.is_empty(), "nothing went to KVM");
}

/// Where user mode runs in the engine, a return to user mode (IRETQ to CPL3, SYSRETQ) that KVM
/// was to step, because the engine does not run the counted kernel code (here a counter with an
/// edge-detected CMASK), is completed by the engine: KVM would run the user code after it, which
/// such a host cannot step (a SYSCALL there lands at IA32_LSTAR still at CPL3). It retires once,
/// counted; the vCPU is at the user instruction with the user's segments (SDM Vol. 2A IRET, Vol.
/// 2B SYSRET).
#[cfg(feature = "tcg")]
#[test]
fn a_return_to_user_mode_that_kvm_was_to_step_is_completed_by_the_engine() {
    // iretq; nop (the user code) / sysretq; nop
    for code in [&[0x48, 0xCF, NOP][..], &[0x48, 0x0F, 0x07, NOP][..]] {
        let mut r = user_rig(code, TIMER, Precise::with_engine(Engine::Tcg).with_user_in_engine(true));
        let user = CODE + code.len() as u64 - 1;
        r.vcpu.mode.cpl = 0;
        r.vcpu.sregs.cs =
            kvm_bindings::kvm_segment { selector: 0x08, l: 1, s: 1, type_: 11, present: 1, ..Default::default() };
        r.vcpu.sregs.ss = kvm_bindings::kvm_segment { selector: 0, unusable: 1, ..Default::default() };
        // The IRETQ frame: RIP, CS, RFLAGS, RSP, SS.
        r.vcpu.regs.rsp = STACK - 40;
        for (k, v) in [user, 0x33, 0x202, STACK, 0x2B].into_iter().enumerate() {
            r.vcpu.mem.write_obj(v, GuestAddress(STACK - 40 + 8 * k as u64)).unwrap();
        }
        // SYSRETQ: RIP from RCX, RFLAGS from R11, CS and SS from IA32_STAR[63:48] (0x23) + 16 and + 8.
        (r.vcpu.regs.rcx, r.vcpu.regs.r11) = (user, 0x202);
        r.vcpu.msrs.insert(emon_x86::arch::IA32_STAR, 0x0023_0010 << 32);
        r.vcpu.sregs.efer |= 1; // SCE
        r.vcpu.mode.efer = r.vcpu.sregs.efer;
        // INST_RETIRED.ANY_P at any CPL, with edge detect and CMASK 1: the engine does not run it.
        r.wrmsr(msr::IA32_PERFEVTSEL0, 0x0147_00C0);
        r.wrmsr(msr::IA32_PERF_GLOBAL_CTRL, 1);
        assert_eq!(r.before(true), Next::Retired, "{code:x?}: completed by emon, not stepped in KVM");
        assert_eq!(
            (r.vcpu.regs.rip, r.vcpu.sregs.cs.selector, r.vcpu.sregs.ss.selector),
            (user, 0x33, 0x2B),
            "{code:x?}"
        );
        assert_eq!(r.vcpu.regs.rflags & 0x200, 0x200, "{code:x?}: RFLAGS from the frame or R11");
        assert_eq!(r.precise.stats.returns_completed, 1, "{code:x?}");
        assert_eq!(r.pmc(0), 1, "{code:x?}: the return retired once");
        assert!(r.precise.stats.user_to_kvm.is_empty(), "{code:x?}");
    }
}

/// On a host where user mode runs in the engine, a user-mode instruction neither the engine nor
/// emon runs goes to KVM, which cannot step it there: the run says so, NOT EXACT, by mnemonic,
/// whatever the code; an invalid opcode raises #UD without going to KVM.
#[cfg(feature = "tcg")]
#[test]
fn user_code_handed_to_kvm_is_reported_not_exact() {
    // rdseed eax (the engine lacks it), then ud2.
    let mut r =
        user_rig(&[0x0F, 0xC7, 0xF8, 0x0F, 0x0B], TIMER, Precise::with_engine(Engine::Tcg).with_user_in_engine(true));
    r.count();
    assert_eq!(r.before(true), Next::Run);
    r.exit_at(CODE + 3);
    assert_eq!(r.precise.stats.user_to_kvm.get("rdseed"), Some(&1));
    assert!(r
        .precise
        .notes()
        .iter()
        .any(|n| n.starts_with("NOT EXACT: 1 user-mode instructions went to KVM") && n.contains("rdseed x1")));
    assert_eq!(r.before(true), Next::Retired, "UD2 raises #UD, delivered at the next entry");
    assert_eq!(r.vcpu.injected, [(6, None)]);
    assert_eq!(r.precise.stats.user_to_kvm.len(), 1);
}

/// A user-mode page fault where the IDT's gate and the kernel's stack are there: emon delivers it
/// itself, as the CPU does (SDM Vol. 3A 6.12, 6.14): the vCPU at the handler at CPL0 with no
/// entry to KVM, the error code on top of the frame, RF set in the RFLAGS image, CR2 the address.
#[cfg(feature = "tcg")]
#[test]
fn a_user_mode_page_fault_is_delivered_through_the_idt_by_emon() {
    // mov al, [0x200000]: past the 2 MiB page the tables map.
    let code = [0x8A, 0x04, 0x25, 0x00, 0x00, 0x20, 0x00, NOP];
    let mut r = user_rig(&code, 14, Precise::with_engine(Engine::Tcg).with_user_in_engine(true));
    r.count();
    assert_eq!(r.before(true), Next::Retired);
    assert!(r.vcpu.injected.is_empty(), "{:?}", r.vcpu.injected);
    assert_eq!((r.vcpu.regs.rip, r.vcpu.sregs.cs.dpl, r.vcpu.sregs.cr2), (HANDLER, 0, 0x20_0000));
    let top: [u64; 6] =
        std::array::from_fn(|i| r.vcpu.mem.read_obj(GuestAddress(KERNEL_STACK - 48 + 8 * i as u64)).unwrap());
    assert_eq!(top[..4], [0b100, CODE, 0x33, 0x202 | 1 << 16], "not present, a read, from user mode");
    assert_eq!(r.vcpu.regs.rsp, KERNEL_STACK - 48);
}

/// User-mode RDTSC where the vCPU has a window on the guest's TSC, counted with the guest's time
/// left at real time (`with_real_time`): the engine answers it from the window (the floor here), and the vCPU hears
/// what it gave; with CR4.TSD set it raises #GP(0), as on the CPU (SDM Vol. 2B, RDTSC), without an
/// engine run, and gives nothing.
#[cfg(feature = "tcg")]
#[test]
fn user_mode_rdtsc_reads_the_window_or_faults_under_tsd() {
    let floor = (1 << 60) + 12345;
    for tsd in [false, true] {
        // rdtsc; nop; nop
        let precise = Precise::with_engine(Engine::Tcg).with_user_in_engine(true).with_real_time();
        let mut r = user_rig(&[0x0F, 0x31, NOP, NOP], 13, precise);
        r.vcpu.tsc_window = Some(crate::TscWindow { offset: 0, floor, aux: 0 });
        if tsd {
            (r.vcpu.mode.cr4, r.vcpu.sregs.cr4) = (r.vcpu.mode.cr4 | 1 << 2, r.vcpu.sregs.cr4 | 1 << 2);
        }
        r.count();
        if tsd {
            // emon's TSD check raises it (`emulate_tsc_read`), for KVM's entry to deliver.
            assert_eq!(r.before(true), Next::Run);
            assert_eq!(r.vcpu.injected, [(13, Some(0))]);
            assert_eq!((r.vcpu.regs.rip, r.pmc(0), r.vcpu.tsc_given), (CODE, 0, 0), "nothing retired or given");
            assert_eq!(r.precise.stats.engine_runs, 0, "no engine run that would only stop at the #GP");
        } else {
            while r.vcpu.regs.rip == CODE {
                assert_eq!(r.before(true), Next::Retired);
            }
            assert_eq!((r.vcpu.regs.rax, r.vcpu.regs.rdx), (floor & 0xFFFF_FFFF, floor >> 32));
            assert_eq!(r.vcpu.tsc_given, floor);
            assert!(r.pmc(0) >= 1, "counted");
        }
    }
}

/// Kernel RDTSC where the vCPU has a window on the guest's TSC, in real time: with RFLAGS.IF
/// clear the engine answers it (no interrupt KVM holds can come in before it); with IF set it
/// goes to KVM, a step, an entry at which KVM delivers the interrupt due at once, which a kernel
/// loop waiting on the TSC for one needs (the engine takes events only between runs).
#[cfg(feature = "tcg")]
#[test]
fn kernel_rdtsc_runs_in_the_engine_with_interrupts_masked_and_in_kvm_without() {
    let floor = (1 << 60) + 12345;
    for interrupts in [false, true] {
        // rdtsc; nop; hlt
        let mut r = Rig::new(&[0x0F, 0x31, NOP, 0xF4]);
        r.precise = Precise::with_engine(Engine::Tcg).with_user_in_engine(true).with_real_time();
        r.vcpu.tsc_window = Some(crate::TscWindow { offset: 0, floor, aux: 0 });
        if interrupts {
            r.vcpu.regs.rflags |= RFLAGS_IF;
        }
        r.count();
        if interrupts {
            assert_eq!(r.before(true), Next::Run, "KVM steps it");
            assert_eq!((r.vcpu.regs.rip, r.vcpu.tsc_given), (CODE, 0), "nothing ran or was given");
        } else {
            assert_eq!(r.before(true), Next::Retired, "in the engine");
            assert_eq!((r.vcpu.regs.rip, r.vcpu.regs.rax, r.vcpu.tsc_given), (CODE + 3, floor & 0xFFFF_FFFF, floor));
            assert_eq!((r.precise.stats.engine_tsc_reads, r.pmc(0)), (1, 2));
        }
    }
}

/// Where kernel code is stepped (no engine), in real time: RDTSC and a WRMSR of
/// IA32_TSC_DEADLINE with nothing KVM holds due first (RFLAGS.IF clear, no PMI queued) are
/// emon's to complete: the TSC read from KVM's, the deadline written to KVM as it is, and no
/// step; otherwise KVM steps them, an entry that delivers what is due first.
#[test]
fn kernel_tsc_reads_and_deadlines_with_nothing_due_are_completed_without_a_step() {
    // rdtsc; wrmsr; nop
    let code = [0x0F, 0x31, 0x0F, 0x30, NOP];
    for (rflags, queued) in [(2, false), (2 | RFLAGS_IF, false), (2, true)] {
        let mut r = Rig::new(&code);
        r.precise = Precise::with_engine(Engine::Step).with_real_time();
        r.vcpu.tsc = 1 << 40;
        r.count();
        r.vcpu.regs.rflags = rflags;
        if queued {
            r.precise.event_queued();
        }
        let due = rflags != 2 || queued;
        if due {
            assert_eq!(r.before(true), Next::Run, "{rflags:#x} {queued}: KVM steps the RDTSC");
            assert_eq!(r.precise.stats.tsc_reads, 0);
            continue;
        }
        assert_eq!(r.before(true), Next::Retired, "RDTSC completed by emon");
        assert_eq!((r.vcpu.regs.rip, r.vcpu.regs.rax, r.vcpu.regs.rdx), (CODE + 2, 0, 1 << 8));
        (r.vcpu.regs.rcx, r.vcpu.regs.rax, r.vcpu.regs.rdx) = (0x6E0, 0x1234, 0x100);
        assert_eq!(r.before(true), Next::Retired, "WRMSR of the deadline completed by emon");
        assert_eq!((r.vcpu.regs.rip, r.vcpu.tsc_deadline), (CODE + 4, 0x100_0000_1234), "as written");
        assert_eq!((r.precise.stats.tsc_reads, r.precise.stats.tsc_deadlines, r.pmc(0)), (1, 1, 2));
    }
}

/// A REP string instruction in user mode whose source runs into a page that is not present: the
/// iterations before the fault take effect and its registers say where it resumes, and the #PF
/// is the next iteration's, with its error code and CR2 (SDM Vol. 2B, REP; Vol. 3A 4.7).
#[cfg(feature = "tcg")]
#[test]
fn a_rep_movsb_that_faults_midway_keeps_its_progress_and_raises_the_next_iterations_page_fault() {
    let mut r = user_rig(&[0xF3, 0xA4, NOP], TIMER, Precise::with_engine(Engine::Tcg).with_user_in_engine(true));
    // 0x20_0000, past the 2 MiB page the tables map, is not present.
    r.vcpu.regs.rsi = 0x1F_FFF0;
    r.vcpu.regs.rdi = 0x10_0000;
    r.vcpu.regs.rcx = 0x20;
    r.vcpu.mem.write_slice(&[0xAB; 16], GuestAddress(0x1F_FFF0)).unwrap();
    r.count();
    assert_eq!(r.before(true), Next::Retired, "the #PF goes out at the next entry");
    assert_eq!(r.vcpu.injected, [(14, Some(0b100))], "not present, a read, from user mode");
    assert_eq!(r.vcpu.sregs.cr2, 0x20_0000);
    assert_eq!(
        (r.vcpu.regs.rip, r.vcpu.regs.rcx, r.vcpu.regs.rsi, r.vcpu.regs.rdi),
        (CODE, 0x10, 0x20_0000, 0x10_0010)
    );
    let mut copied = [0u8; 16];
    r.vcpu.mem.read_slice(&mut copied, GuestAddress(0x10_0000)).unwrap();
    assert_eq!(copied, [0xAB; 16], "the first 16 iterations took effect");
    assert_eq!(r.pmc(0), 0, "the REP MOVSB has not retired");
    assert!(r.precise.stats.user_to_kvm.is_empty());
}

/// User code whose translation would cross into a page that is not present (TCG fails to
/// translate it and raises nothing): the instructions before the one that crosses retire, each
/// run by emon, and that one raises the #PF of its fetch, with CR2 at the page it cannot reach
/// (SDM Vol. 3A 4.7); nothing goes to KVM.
#[cfg(feature = "tcg")]
#[test]
fn user_code_that_runs_into_a_page_not_present_retires_up_to_the_instruction_that_crosses() {
    let mut r = user_rig(&[], TIMER, Precise::with_engine(Engine::Tcg).with_user_in_engine(true));
    // nop x 4; nop dword [rax+rax+0] (9 bytes); mov rax, imm64 across 0x20_0000, which the
    // tables do not map (nor RAM holds: the rest of its bytes are nowhere).
    let at = 0x1F_FFEC;
    let code = [NOP, NOP, NOP, NOP, 0x66, 0x0F, 0x1F, 0x84, 0, 0, 0, 0, 0, 0x48, 0xB8, 1, 2, 3, 4, 5];
    r.vcpu.mem.write_slice(&code, GuestAddress(at)).unwrap();
    r.vcpu.regs.rip = at;
    r.count();
    for n in 0.. {
        assert!(n < 10, "no #PF after {n} boundaries");
        assert_eq!(r.before(true), Next::Retired);
        if !r.vcpu.injected.is_empty() {
            break;
        }
    }
    assert_eq!(r.vcpu.injected, [(14, Some(0b100))], "not present, from user mode");
    assert_eq!((r.vcpu.regs.rip, r.vcpu.sregs.cr2), (0x1F_FFF9, 0x20_0000));
    assert_eq!(r.pmc(0), 5, "the five instructions before it retired");
    assert!(r.precise.stats.user_to_kvm.is_empty(), "nothing went to KVM");
}

/// While a data breakpoint watches user memory, kernel code with RFLAGS.AC set is stepped (its
/// accesses checked): the engine is not entered for the STAC that opens the window (it would
/// only hand it back), and the kernel code after the CLAC runs in the engine at once.
#[cfg(feature = "tcg")]
#[test]
fn kernel_code_after_a_watched_user_access_window_runs_in_the_engine_at_once() {
    use emon_x86::debug::{CR4_SMAP, RFLAGS_AC};
    // nop; stac; mov al, [rsi]; clac; nop; nop; hlt
    let code = [NOP, 0x0F, 0x01, 0xCB, 0x8A, 0x06, 0x0F, 0x01, 0xCA, NOP, NOP, 0xF4];
    let mut r = Rig::new(&code);
    r.precise = Precise::with_engine(Engine::Tcg).with_user_in_engine(true);
    r.vcpu.mode.cr4 |= CR4_SMAP;
    r.vcpu.sregs.cr4 = r.vcpu.mode.cr4;
    r.vcpu.regs.rsi = 0x10_0000;
    // DR0: a 4-byte write breakpoint (L0, R/W0 01, LEN0 11) on user memory elsewhere.
    r.vcpu.dr = [0x10_0100, 0, 0, 0];
    r.vcpu.dr7 = 0x400 | 1 | 0b1101 << 16;
    r.count();
    assert_eq!(r.before(true), Next::Retired, "the NOP, in the engine");
    assert_eq!(r.vcpu.regs.rip, CODE + 1);
    let runs = r.precise.stats.engine_runs;
    r.step(CODE + 4);
    assert_eq!(r.precise.stats.engine_runs, runs, "no engine run for the STAC");
    r.vcpu.regs.rflags |= RFLAGS_AC;
    r.step(CODE + 6);
    r.step(CODE + 9);
    r.vcpu.regs.rflags &= !RFLAGS_AC;
    assert_eq!(r.before(true), Next::Retired, "the NOPs after the CLAC, in the engine");
    assert_eq!((r.vcpu.regs.rip, r.precise.stats.engine_runs), (CODE + 11, runs + 1));
}

/// A user-mode run that retired nothing (here: its first instruction faults) leaves the kernel
/// code that handles it to the engine: what user code did says nothing of the kernel's.
#[cfg(feature = "tcg")]
#[test]
fn kernel_code_after_a_user_mode_fault_runs_in_the_engine_at_once() {
    // movabs al, [0x40_0000_0000] (no page maps it)
    let code = [0xA0, 0, 0, 0, 0, 0x40, 0, 0, 0];
    let mut r = user_rig(&code, TIMER, Precise::with_engine(Engine::Tcg).with_user_in_engine(true));
    r.vcpu.mem.write_slice(&[NOP, NOP, 0xF4], GuestAddress(HANDLER)).unwrap();
    r.count();
    assert_eq!(r.before(true), Next::Retired, "the #PF, raised by emon");
    assert_eq!(r.vcpu.injected.first().map(|e| e.0), Some(14));
    assert_eq!(r.before(true), Next::Run, "KVM's entry delivers it");
    // The entry lands in the handler, at CPL0.
    r.vcpu.mode.cpl = 0;
    r.vcpu.sregs.cs =
        kvm_bindings::kvm_segment { selector: 0x08, l: 1, s: 1, type_: 11, present: 1, ..Default::default() };
    r.exit_at(HANDLER);
    let runs = r.precise.stats.engine_runs;
    assert_eq!(r.before(true), Next::Retired, "the handler's NOPs, in the engine");
    assert_eq!((r.vcpu.regs.rip, r.precise.stats.engine_runs), (HANDLER + 2, runs + 1));
}

/// Kernel code while nothing counts runs STI in the engine, which ends the run before the HLT it
/// covers: the vCPU keeps STI's shadow over the HLT, so that no interrupt comes in before it
/// (SDM Vol. 2B, STI). While kernel code counts, STI goes to KVM, which delivers what it lets in
/// right after the instruction it covers.
#[cfg(feature = "tcg")]
#[test]
fn sti_runs_in_the_engine_while_nothing_counts_and_leaves_its_shadow_to_the_vcpu() {
    // cli; nop; sti; hlt
    let code = [0xFA, NOP, 0xFB, 0xF4];
    // IA32_PMC0 counts instructions retired in user mode only, or at every CPL: (the engine
    // run's end, and what PMC0 counted).
    for (evtsel, end, counted) in [(0x41_00C0, CODE + 3, 0), (0x43_00C0, CODE + 2, 2)] {
        let mut r = Rig::new(&code);
        r.precise = Precise::with_engine(Engine::Tcg).with_cpl0_in_engine(true);
        r.vcpu.regs.rflags = 0x202;
        r.wrmsr(msr::IA32_PERFEVTSEL0, evtsel);
        r.wrmsr(msr::IA32_PERF_GLOBAL_CTRL, 1);
        assert_eq!(r.before(true), Next::Retired, "in the engine");
        assert_eq!((r.vcpu.regs.rip, r.pmc(0), r.precise.stats.engine_runs), (end, counted, 1));
        if end == CODE + 3 {
            assert_ne!(r.vcpu.regs.rflags & RFLAGS_IF, 0, "STI retired");
            assert!(r.vcpu.sti_shadow, "the shadow covers the HLT");
        } else {
            assert_eq!(r.before(true), Next::Run, "STI is KVM's: stepped");
            assert!(r.vcpu.single_step);
            assert_eq!((r.precise.stats.engine_runs, r.vcpu.sti_shadow), (1, false));
        }
    }
}

/// PEBS on user code run by the engine: the run stops right after the event that triggers the
/// armed assist, and the record has that instruction as EventingIP and the registers right after
/// it, RIP the next instruction (PEBS is trap-like); no user instruction goes to KVM (which
/// cannot step user mode on such a host).
#[cfg(feature = "tcg")]
#[test]
fn pebs_records_user_code_the_engine_runs() {
    const DS: u64 = 0x4_0000;
    const BUFFER: u64 = 0x4_1000;
    // 1: dec rcx; jnz 1b; hlt (#GP at CPL3)
    let mut r = user_rig(
        &[0x48, 0xFF, 0xC9, 0x75, 0xFB, 0xF4],
        TIMER,
        Precise::with_engine(Engine::Tcg).with_user_in_engine(true),
    );
    r.pmu.set_pebs(true);
    r.vcpu.regs.rcx = 10;
    // The DS area: the PEBS buffer's base, index, absolute maximum and interrupt threshold
    // (Figure 18-22), room for 4 records.
    for (offset, value) in [(0x20, BUFFER), (0x28, BUFFER), (0x30, BUFFER + 4 * 0x100), (0x38, BUFFER + 4 * 0x100)] {
        r.vcpu.mem.write_obj(value, GuestAddress(DS + offset)).unwrap();
    }
    r.wrmsr(msr::IA32_DS_AREA, DS);
    r.wrmsr(msr::IA32_PEBS_ENABLE, 1);
    // IA32_PMC0 counts instructions retired at CPL3 and overflows at the fifth (a 32-bit write
    // sign-extends).
    r.wrmsr(msr::IA32_PMC0, 5u64.wrapping_neg() & 0xFFFF_FFFF);
    r.wrmsr(msr::IA32_PERFEVTSEL0, 0x41_00C0);
    r.wrmsr(msr::IA32_PERF_GLOBAL_CTRL, 1);
    // Up to the HLT's #GP, which emon delivers through the IDT (or has KVM inject).
    while r.vcpu.sregs.cs.dpl == 3 && r.vcpu.injected.is_empty() {
        assert_eq!(r.before(true), Next::Retired);
    }
    let index: u64 = r.vcpu.mem.read_obj(GuestAddress(DS + 0x28)).unwrap();
    assert!(index > BUFFER, "a record was written");
    let word = |offset: u64| r.vcpu.mem.read_obj::<u64>(GuestAddress(BUFFER + offset)).unwrap();
    // Format 3: RIP at 0x08, RCX at 0x20, EventingIP at 0xB0. The fifth instruction (the third
    // DEC) overflows the counter and arms PEBS; the event after it, the JNZ, triggers the assist
    // (SDM 18.6.1.1): RCX 7, RIP where the taken JNZ leads.
    assert_eq!((word(0xB0), word(0x08), word(0x20)), (CODE + 3, CODE, 7));
    assert!(r.precise.stats.user_to_kvm.is_empty(), "nothing went to KVM");
}

/// The PIC's interrupt through LINT0 (virtual wire) is KVM's to deliver at the next entry, which
/// takes the vector from the PIC: emon does not deliver it, and the entry expects the event.
#[cfg(feature = "tcg")]
#[test]
fn a_pic_interrupt_due_in_user_mode_goes_to_the_next_entry() {
    use crate::DueEvent;
    let mut r = user_rig(&[NOP, NOP], TIMER, Precise::with_engine(Engine::Tcg).with_user_in_engine(true));
    r.vcpu.due_events.push_back(Some(DueEvent::ExtInt));
    r.count();
    assert_eq!(r.before(true), Next::Run);
    assert_eq!(r.vcpu.regs.rip, CODE, "not delivered by emon");
    assert!(r.precise.step.pending.as_ref().is_some_and(|p| p.expect_event), "the entry delivers an event");
    assert!(r.precise.stats.user_to_kvm.is_empty(), "no user instruction goes to KVM");
    // KVM's entry delivers it before any user instruction: the frame returns to CODE.
    pic_interrupt_delivered(&mut r, CODE);
    assert_eq!(r.precise.stats.cpl3_lost, 0);
    assert_eq!(r.pmc(0), 1, "the handler's first instruction");
}

/// Where KVM's entry ran user code before it delivered the event it was to deliver (the frame
/// returns past the boundary the entry began at), what it ran is not counted: NOT EXACT,
/// whatever the code and whatever the event.
#[cfg(feature = "tcg")]
#[test]
fn user_code_kvm_ran_before_the_event_it_delivered_is_reported_not_exact() {
    use crate::DueEvent;
    let mut r = user_rig(&[NOP, NOP], TIMER, Precise::with_engine(Engine::Tcg).with_user_in_engine(true));
    r.vcpu.due_events.push_back(Some(DueEvent::ExtInt));
    r.count();
    assert_eq!(r.before(true), Next::Run);
    pic_interrupt_delivered(&mut r, CODE + 1);
    assert_eq!(r.precise.stats.cpl3_lost, 1);
    assert!(r.precise.notes().iter().any(|n| n.starts_with("NOT EXACT: user-mode (CPL3) code")));
}

/// KVM's entry delivered TIMER from user mode at `rip` (its frame on RSP0's stack) and the
/// handler's first instruction was stepped.
#[cfg(feature = "tcg")]
fn pic_interrupt_delivered(r: &mut Rig, rip: u64) {
    for (i, word) in [rip, 0x33, 0x202, STACK, 0x2B].into_iter().enumerate() {
        r.vcpu.mem.write_obj(word, GuestAddress(KERNEL_STACK - 40 + 8 * i as u64)).unwrap();
    }
    r.vcpu.mode.cpl = 0;
    r.vcpu.sregs.cs.selector = 0x08;
    r.exit_at(HANDLER + 1);
}

/// A PMI the VMM queued in KVM at a user-mode boundary: the entry delivers it before any user
/// instruction (user mode takes interrupts), so nothing is noted as user code gone to KVM; the
/// handler's frame shows that no user code ran first.
#[cfg(feature = "tcg")]
#[test]
fn a_pmi_queued_in_user_mode_goes_out_before_any_user_instruction() {
    let mut r = user_rig(&[NOP, NOP], TIMER, Precise::with_engine(Engine::Tcg).with_user_in_engine(true));
    r.count();
    r.precise.event_queued();
    assert_eq!(r.before(true), Next::Run, "KVM's entry delivers the PMI");
    assert!(r.precise.stats.user_to_kvm.is_empty(), "no user instruction noted as gone to KVM");
    pic_interrupt_delivered(&mut r, CODE);
    assert_eq!(r.precise.stats.cpl3_lost, 0);
}

/// INVLPG at CPL0 retires in emon, and KVM drops its cached translations before its next
/// entry; at CPL3 it is KVM's #GP.
#[test]
fn invlpg_at_cpl0_retires_in_emon_and_kvm_drops_its_translations() {
    // invlpg [rax]; nop
    let mut r = Rig::new(&[0x0F, 0x01, 0x38, NOP]);
    r.count();
    assert_eq!(r.before(true), Next::Retired, "INVLPG is retired by emon");
    assert_eq!(r.vcpu.regs.rip, CODE + 3);
    assert_eq!(r.vcpu.tlb_flushes, 1);
    assert_eq!((r.pmc(0), r.pmc(1)), (1, 0));

    let mut r = user_rig(&[0x0F, 0x01, 0x38, NOP], TIMER, Precise::with_engine(Engine::Step));
    r.count();
    assert_eq!(r.before(true), Next::Run, "at CPL3 KVM raises its #GP");
    assert_eq!(r.vcpu.tlb_flushes, 0);
}

/// The engine runs INVLPG itself (dropping its own translation); a run through one has KVM drop
/// its cached translations, and a run without one does not.
#[cfg(feature = "tcg")]
#[test]
fn an_engine_run_through_invlpg_has_kvm_drop_its_translations() {
    for (code, flushes) in [(&[NOP, NOP, 0xF4][..], 0), (&[NOP, 0x0F, 0x01, 0x38, NOP, 0xF4], 1)] {
        let mut r = Rig::new(code);
        r.precise = Precise::with_engine(Engine::Tcg);
        r.count();
        assert_eq!(r.before(true), Next::Retired);
        assert_eq!(r.vcpu.regs.rip, CODE + code.len() as u64 - 1, "the engine ran up to the HLT");
        assert_eq!(r.precise.stats.engine_runs, 1);
        assert_eq!(r.vcpu.tlb_flushes, flushes, "{code:x?}");
        assert_eq!(r.pmc(0), code.len() as u64 - 1 - 2 * flushes as u64);
    }
}

/// An INVLPG that emon completes at a step boundary drops the engine's translations too, not
/// only KVM's: the engine's next run loads the whole state, which flushes its TLB, where it would
/// otherwise go on from the state it held. Here the INVLPG overflows the counter, so the engine
/// stops before it, the stepper retires it in emon, and the engine runs on after it: no KVM entry
/// comes in between.
#[cfg(feature = "tcg")]
#[test]
fn an_invlpg_emon_completes_has_the_engine_drop_its_translations() {
    // nop; jmp $+2 | invlpg [rax] | nop; nop; hlt
    let code = [NOP, 0xEB, 0x00, 0x0F, 0x01, 0x38, NOP, NOP, 0xF4];
    let mut r = Rig::new(&code);
    // The event checks' clock stands still: KVM is not asked for events however long the
    // boundaries take on this machine.
    r.precise = Precise::with_engine(Engine::Tcg).with_event_clock(EventClock::manual());
    r.count();
    // The INVLPG (a block of its own) overflows the counter: the run stops before it.
    r.wrmsr(msr::IA32_PMC0, (1 << 48) - 3);
    assert_eq!(r.before(true), Next::Retired);
    assert_eq!(r.vcpu.regs.rip, CODE + 3, "the engine stopped short of the overflow");
    let (loads, runs) = (r.precise.engine.loads(), r.precise.stats.engine_runs);
    assert_eq!(r.before(true), Next::Retired, "INVLPG is retired by emon");
    assert_eq!((r.vcpu.regs.rip, r.vcpu.tlb_flushes, r.precise.stats.engine_runs), (CODE + 6, 1, runs));
    assert_eq!(r.before(true), Next::Retired);
    assert_eq!(r.vcpu.regs.rip, CODE + code.len() as u64 - 1, "the engine ran up to the HLT");
    assert_eq!(r.precise.stats.engine_runs, runs + 1);
    assert_eq!(r.precise.engine.loads(), loads + 1, "the engine's run loads the whole state");
}

/// A CPL0 REP string instruction whose iterations outrun one engine run goes on in the engine:
/// KVM is asked for the events due between two runs (it is not entered, which would run all the
/// remaining iterations at once), and one that is due goes out at the next entry, between two
/// iterations. It retires once.
#[cfg(feature = "tcg")]
#[test]
fn a_cpl0_rep_string_instruction_longer_than_a_run_stays_in_the_engine_and_takes_events_between_runs() {
    use crate::DueEvent;
    // rep stosb; nop; hlt
    let code = [0xF3, 0xAA, NOP, 0xF4];
    let mut r = Rig::new(&code);
    // The event checks' clock stands still: KVM is asked only where the runs stop midway, however
    // long each takes on this machine.
    r.precise = Precise::with_engine(Engine::Tcg).with_event_clock(EventClock::manual());
    (r.vcpu.regs.rcx, r.vcpu.regs.rdi, r.vcpu.regs.rax) = (100_000, 0x10_0000, 0xAB);
    r.count();
    let mut runs = 0;
    while r.vcpu.regs.rip == CODE {
        r.precise.limit_next_run(30_000);
        assert_eq!(r.before(true), Next::Retired, "nothing goes to KVM");
        runs += 1;
    }
    assert_eq!(runs, 4, "30,000 iterations a run");
    assert_eq!(r.vcpu.event_probes, 3, "KVM asked after each run that stopped midway");
    assert_eq!((r.vcpu.regs.rcx, r.vcpu.regs.rip), (0, CODE + 3));
    assert_eq!(r.vcpu.mem.read_obj::<u8>(GuestAddress(0x10_0000 + 99_999)).unwrap(), 0xAB);
    assert_eq!(r.pmc(0), 2, "the REP STOSB retired once, then the NOP");

    let mut r = Rig::new(&code);
    r.precise = Precise::with_engine(Engine::Tcg).with_event_clock(EventClock::manual());
    (r.vcpu.regs.rcx, r.vcpu.regs.rdi) = (100_000, 0x10_0000);
    r.vcpu.due_events.push_back(Some(DueEvent::Interrupt(TIMER)));
    r.count();
    r.precise.limit_next_run(30_000);
    assert_eq!(r.before(true), Next::Retired);
    assert_eq!((r.vcpu.regs.rip, r.vcpu.regs.rcx), (CODE, 70_000), "stopped between two iterations");
    assert_eq!(r.vcpu.queued_event, Some(DueEvent::Interrupt(TIMER)), "the next entry delivers it");
    assert_eq!(r.before(true), Next::Run, "KVM's entry, to deliver it");
    assert_eq!(r.pmc(0), 0, "nothing retired yet");
}

/// Where user mode runs in the engine because KVM cannot run it right, the guest's own
/// breakpoints (DR0-DR3 armed in DR7) are emon's: an instruction breakpoint faults before its
/// instruction (DR6.B0, the frame at it), RF lets it run once, a write breakpoint traps after the
/// store that met it (DR6.B1, the frame after it), and nothing goes to KVM (SDM Vol. 3B 17.3.1).
#[cfg(feature = "tcg")]
#[test]
fn the_guests_breakpoints_fire_in_user_mode_run_by_emon() {
    // nop; mov [rdi], al; nop; 1: jmp 1b
    let code = [NOP, 0x88, 0x07, NOP, 0xEB, 0xFE];
    let mut r = user_rig(&code, TIMER, Precise::with_engine(Engine::Tcg).with_user_in_engine(true));
    r.vcpu.regs.rdi = 0x10_0004;
    // DR0: an instruction breakpoint on the store (L0); DR1: a 4-byte write breakpoint (L1,
    // R/W1 01, LEN1 11) on 0x10_0004.
    r.vcpu.dr = [CODE + 1, 0x10_0004, 0, 0];
    r.vcpu.dr7 = 0x400 | 1 | 1 << 2 | 0b1101 << 20;
    let user = (r.vcpu.regs, r.vcpu.sregs, r.vcpu.mode);
    r.count();
    let back_to_user = |r: &mut Rig, rflags: u64| {
        let rip = kernel_frame(r)[0];
        let (regs, sregs, mode) = user;
        (r.vcpu.regs, r.vcpu.sregs, r.vcpu.mode) = (kvm_regs { rip, rflags, ..regs }, sregs, mode);
        r.vcpu.dr6 = 0xFFFF_0FF0;
        // As after the handler's IRETQ (which KVM's entries see): the mode and RIP read anew.
        (r.precise.step.mode, r.precise.step.rip) = (None, None);
    };
    assert_eq!(r.before(true), Next::Retired, "the NOP, run by emon");
    assert_eq!(r.vcpu.regs.rip, CODE + 1);
    assert_eq!(r.before(true), Next::Retired, "the instruction breakpoint's #DB");
    assert_eq!(r.vcpu.regs.rip, DB_HANDLER);
    assert_eq!(r.vcpu.dr6 & 0x400F, 0b0001, "DR6.B0 alone");
    assert_eq!(kernel_frame(&r)[..3], [CODE + 1, 0x33, 0x202], "a fault: the frame at the instruction");
    assert_eq!(r.pmc(0), 1, "the store has not retired");
    // The handler resumes with RF set in the frame, as Linux's does.
    back_to_user(&mut r, 0x202 | emon_x86::debug::RFLAGS_RF);
    assert_eq!(r.before(true), Next::Retired, "the store, then the write breakpoint's trap");
    assert_eq!(r.vcpu.regs.rip, DB_HANDLER);
    assert_eq!(r.vcpu.dr6 & 0x400F, 0b0010, "DR6.B1 alone");
    assert_eq!(kernel_frame(&r)[..3], [CODE + 3, 0x33, 0x202], "a trap: the frame after the store, RF clear");
    assert_eq!(r.pmc(0), 2, "the store retired once");
    back_to_user(&mut r, 0x202);
    assert_eq!(r.before(true), Next::Retired, "the NOP");
    assert_eq!(r.vcpu.regs.rip, CODE + 4, "no #DB: the breakpoints met nothing");
    assert_eq!(r.precise.stats.breakpoints_fired, 2);
    assert!(r.precise.stats.user_to_kvm.is_empty() && r.precise.stats.debugged_in_kvm == 0, "nothing went to KVM");
}

/// In a counted stretch the engine's RDTSC and RDTSCP read the model's time as emon answers them
/// at step boundaries: the same values, and the same model clock after, as the stepper's (here
/// with RFLAGS.IF set, where the engine reads real time only with it clear).
#[cfg(feature = "tcg")]
#[test]
fn the_engine_reads_the_models_time_as_the_stepper_answers_it() {
    // nop; rdtsc; mov rbx, rax; mov rsi, rdx; rdtscp; hlt
    let code = [NOP, 0x0F, 0x31, 0x48, 0x89, 0xC3, 0x48, 0x89, 0xD6, 0x0F, 0x01, 0xF9, 0xF4];
    let rig = |engine| {
        let mut r = Rig::new(&code);
        r.precise = Precise::with_engine(engine).with_event_clock(EventClock::manual());
        r.vcpu.regs.rflags |= RFLAGS_IF;
        r.count();
        r
    };
    let value = |r: &Rig| r.vcpu.regs.rdx << 32 | r.vcpu.regs.rax;
    let mut stepped = rig(Engine::Step);
    stepped.step(CODE + 1);
    assert_eq!(stepped.before(true), Next::Retired, "RDTSC, answered by emon");
    let first = value(&stepped);
    stepped.step(CODE + 6);
    stepped.step(CODE + 9);
    assert_eq!(stepped.before(true), Next::Retired, "RDTSCP, answered by emon");
    assert_eq!(stepped.vcpu.regs.rip, CODE + 12);
    let second = value(&stepped);
    assert!(first < second);
    let mut engine = rig(Engine::Tcg);
    assert_eq!(engine.before(true), Next::Retired);
    assert_eq!(engine.vcpu.regs.rip, CODE + 12, "the engine ran up to the HLT");
    let got = (engine.vcpu.regs.rsi << 32 | engine.vcpu.regs.rbx, value(&engine));
    assert_eq!(got, (first, second));
    assert_eq!(engine.precise.clock.cycles, stepped.precise.clock.cycles);
    assert_eq!((engine.precise.stats.engine_model_tsc_reads, engine.precise.stats.tsc_reads), (2, 0));
    assert_eq!(engine.pmc(0), stepped.pmc(0));
}

/// A kernel run that stops for state it did not load (here the SYSCALL MSRs, at a SWAPGS after
/// runs that did not use them, so that runs stopped loading them) goes on in the next engine
/// run, which loads them, not in a KVM step: Linux's return to user mode took one at every
/// return.
#[cfg(feature = "tcg")]
#[test]
fn a_kernel_run_that_stops_for_state_it_did_not_load_goes_on_in_the_engine() {
    // (nop; rdpmc) x 10; nop; jmp $+2 | swapgs; nop; hlt
    let mut code = [NOP, 0x0F, 0x33].repeat(10);
    code.extend([NOP, 0xEB, 0x00, 0x0F, 0x01, 0xF8, NOP, 0xF4]);
    let mut r = Rig::new(&code);
    r.precise = Precise::with_engine(Engine::Tcg).with_event_clock(EventClock::manual());
    r.count();
    for k in 0..10 {
        assert_eq!(r.before(true), Next::Retired, "the engine runs the NOP");
        assert_eq!(r.before(true), Next::Retired, "emon completes the RDPMC");
        assert_eq!(r.vcpu.regs.rip, CODE + 3 * (k + 1));
    }
    let swapgs = CODE + 33;
    assert_eq!(r.before(true), Next::Retired);
    assert_eq!(r.vcpu.regs.rip, swapgs, "stopped before the SWAPGS, which needs the MSRs");
    let runs = r.precise.stats.engine_runs;
    assert_eq!(r.before(true), Next::Retired, "the next run loads them and runs it");
    assert_eq!((r.vcpu.regs.rip, r.precise.stats.engine_runs), (swapgs + 4, runs + 1));
    assert_eq!(r.pmc(0), 24);
}

/// Kernel code that emon runs without entering KVM (here a loop that polls RDPMC, which emon
/// answers, between engine runs) still takes its interrupts: after a millisecond KVM is asked
/// for the event due, which goes out at the next entry. Once one was, the next is asked for as
/// soon as RFLAGS.IF lets it in, not a millisecond later. The millisecond is on a clock the test
/// moves, so that it holds however fast the machine runs the test.
#[cfg(feature = "tcg")]
#[test]
fn kernel_code_emon_runs_without_entering_kvm_takes_its_interrupts() {
    use crate::DueEvent;
    // 1: pause; rdpmc; jmp 1b (ECX 0: IA32_PMC0)
    let mut r = Rig::new(&[0xF3, 0x90, 0x0F, 0x33, 0xEB, 0xFA]);
    let clock = EventClock::manual();
    r.precise = Precise::with_engine(Engine::Tcg).with_event_clock(clock.clone());
    r.vcpu.regs.rflags |= RFLAGS_IF;
    r.count();
    let boundaries = |r: &mut Rig, n: usize| {
        for _ in 0..n {
            assert_eq!(r.before(true), Next::Retired, "the loop runs in the engine and in emon, with no entry");
        }
    };
    // Short of a millisecond KVM is not asked; past it, it is (nothing due).
    boundaries(&mut r, 5);
    clock.advance(EVENT_CHECK - std::time::Duration::from_micros(1));
    boundaries(&mut r, 5);
    assert_eq!(r.vcpu.event_probes, 0);
    clock.advance(std::time::Duration::from_micros(1));
    boundaries(&mut r, 1);
    assert_eq!(r.vcpu.event_probes, 1);
    r.vcpu.due_events.extend([Some(DueEvent::Interrupt(TIMER)), Some(DueEvent::Interrupt(TIMER + 1))]);
    boundaries(&mut r, 5);
    assert_eq!(r.vcpu.event_probes, 1, "a millisecond from the last question");
    assert!(r.pmc(0) > 10, "the loop ran between two questions, with no entry");
    clock.advance(EVENT_CHECK);
    assert_eq!(r.before(true), Next::Run, "KVM's entry, to deliver it");
    assert_eq!(r.vcpu.event_probes, 2);
    assert_eq!(r.vcpu.queued_event, Some(DueEvent::Interrupt(TIMER)));
    // The handler's first instruction retired (here: the loop's, as if the vector's handler were
    // the loop), with IF set again: KVM is asked again at once.
    r.exit_at(CODE + 2);
    assert_eq!(r.before(true), Next::Run, "the second event, asked for at the next boundary");
    assert_eq!(r.vcpu.event_probes, 3);
    assert_eq!(r.vcpu.queued_event, Some(DueEvent::Interrupt(TIMER + 1)));
}

/// A PUSHF KVM single-steps pushes the TF of KVM's own step (it steps with RFLAGS.TF and hides
/// it only from KVM_GET_REGS): the image on the stack gets the guest's TF back, clear here, so
/// that a POPF or IRET of it does not turn single-stepping on for the guest.
#[test]
fn a_pushf_kvm_steps_pushes_the_guests_tf_not_kvms() {
    // pushfq; nop
    let mut r = Rig::new(&[0x9C, NOP]);
    r.count();
    assert_eq!(r.before(true), Next::Run, "KVM steps the PUSHF");
    // What KVM's step does: RFLAGS with its own TF pushed.
    r.vcpu.regs.rsp -= 8;
    r.vcpu.mem.write_obj(0x302u64, GuestAddress(r.vcpu.regs.rsp)).unwrap();
    r.exit_at(CODE + 1);
    let pushed: u64 = r.vcpu.mem.read_obj(GuestAddress(STACK - 8)).unwrap();
    assert_eq!(pushed, 0x202, "TF cleared in the image, the rest as pushed");
    assert_eq!(r.pmc(0), 1, "the PUSHF retired");
}

/// While user mode waits for progress after a run of timer interrupts (`take_user_event`), an
/// interrupt the guest raised itself (here a self-IPI's vector in the IRR: neither the local
/// APIC timer's nor a device's through the I/O APIC) is taken at once, as the CPU takes it; the
/// timer's and the devices' wait.
#[cfg(feature = "tcg")]
#[test]
fn an_interrupt_the_guest_raised_is_not_held_for_user_progress() {
    use crate::{lapic, DueEvent};
    // 1: jmp 1b
    let mut r = user_rig(&[0xEB, 0xFE], TIMER, Precise::with_engine(Engine::Tcg).with_user_in_engine(true));
    lapic::set_reg(&mut r.vcpu.lapic, lapic::SVR, lapic::SVR_APIC_ENABLED);
    // The local APIC timer's vector is 0x40; TIMER (0x20) stands for a self-IPI's.
    lapic::set_reg(&mut r.vcpu.lapic, lapic::LVT_TIMER, 0x40);
    let pending = |r: &mut Rig, v: u8| {
        for w in 0..8 {
            lapic::set_reg(&mut r.vcpu.lapic, lapic::IRR + w * 16, 0);
        }
        lapic::set_reg(&mut r.vcpu.lapic, lapic::IRR + usize::from(v / 32) * 16, 1 << (v % 32));
    };
    r.precise.starve_user_mode();
    pending(&mut r, 0x40);
    r.vcpu.due_events.push_back(Some(DueEvent::Interrupt(0x40)));
    r.before(true);
    assert_eq!(r.vcpu.event_probes, 0, "the timer's interrupt waits for user-mode progress");
    // A device's through the I/O APIC (the PIT's tick where Linux gave up the local APIC timer)
    // waits too.
    r.vcpu.device_vectors[0] |= 1 << 0x30;
    r.precise.starve_user_mode();
    pending(&mut r, 0x30);
    r.vcpu.due_events.clear();
    r.vcpu.due_events.push_back(Some(DueEvent::Interrupt(0x30)));
    r.before(true);
    assert_eq!(r.vcpu.event_probes, 0, "a device's interrupt waits for user-mode progress");
    r.precise.starve_user_mode();
    pending(&mut r, TIMER);
    r.vcpu.due_events.clear();
    r.vcpu.due_events.push_back(Some(DueEvent::Interrupt(TIMER)));
    r.before(true);
    assert_eq!(r.vcpu.event_probes, 1, "asked at once");
    assert_eq!(r.vcpu.regs.rip, HANDLER, "delivered through the IDT");
}
