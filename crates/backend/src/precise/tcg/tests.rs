//! The engine alone (no KVM): where it stops, registers and counts agree; and the state it
//! loads and gives back through the private region.
use super::*;
use crate::precise::cache::CacheModel;
use emon_pmu::pmu::{BranchFilter, CounterId, Semantics};
use emon_pmu::profile::{Cache, Prefetchers};
use emon_x86::arch::RFLAGS_IF;
use emon_x86::fpu::Fpu;
use kvm_bindings::{kvm_dtable, kvm_regs, kvm_segment, kvm_sregs};
use vm_memory::{Bytes, GuestAddress};

const CODE: u64 = 0x10000;
const GDT: u64 = 0x5000;

/// User data (selector 0x1B) and 64-bit user code (0x23) in the GDT.
const USER_DS: u16 = 0x1B;
const USER_CS: u16 = 0x23;

/// Long mode at CPL0 with the first 2 MiB identity-mapped (user-accessible) and a flat GDT with
/// kernel and user segments, `code` at CODE.
fn machine(code: &[u8]) -> (GuestMemoryMmap, kvm_regs, kvm_sregs, CpuMode) {
    let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 2 << 20)]).unwrap();
    mem.write_obj(0x2007u64, GuestAddress(0x1000)).unwrap();
    mem.write_obj(0x3007u64, GuestAddress(0x2000)).unwrap();
    mem.write_obj(0x87u64, GuestAddress(0x3000)).unwrap();
    mem.write_obj(0x0020_9A00_0000_0000u64, GuestAddress(GDT + 8)).unwrap(); // 64-bit code
    mem.write_obj(0x0000_9200_0000_0000u64, GuestAddress(GDT + 16)).unwrap(); // data
    mem.write_obj(0x0000_F200_0000_0000u64, GuestAddress(GDT + 24)).unwrap(); // user data
    mem.write_obj(0x0020_FA00_0000_0000u64, GuestAddress(GDT + 32)).unwrap(); // user 64-bit code
    mem.write_slice(code, GuestAddress(CODE)).unwrap();
    let cs = kvm_segment { selector: 8, type_: 0xB, present: 1, s: 1, l: 1, ..Default::default() };
    let ds = kvm_segment { selector: 0x10, type_: 0x3, present: 1, s: 1, db: 1, ..Default::default() };
    let sregs = kvm_sregs {
        cs,
        ds,
        es: ds,
        ss: ds,
        fs: ds,
        gs: ds,
        gdt: kvm_dtable { base: GDT, limit: 39, ..Default::default() },
        cr0: 1 << 31 | 1 << 4 | 1,
        cr3: 0x1000,
        cr4: 1 << 5,
        efer: 1 << 10 | 1 << 8,
        ..Default::default()
    };
    let regs = kvm_regs { rip: CODE, rsp: 0x8000, rflags: 2, ..Default::default() };
    let mode =
        CpuMode { bitness: 64, cr0: sregs.cr0, cr3: 0x1000, cr4: sregs.cr4, efer: sregs.efer, ..Default::default() };
    (mem, regs, sregs, mode)
}

fn armed(semantics: Semantics) -> Armed {
    Armed { id: CounterId::Gp(0), semantics, usr: true, os: true, cmask: 0, inv: false, edge: false }
}

const CLOCK: ModelClock = ModelClock { cycles: 0, reference: Clock::TSC };

/// Counting `armed` from model clock 0, with the full budget and no cache model.
fn counting(armed: &[(Armed, u64)]) -> Counting<'_> {
    Counting {
        armed,
        clock: CLOCK,
        budget: BUDGET,
        cache: None,
        deadline: None,
        lbr: None,
        watch: Watch::default(),
        withhold_sti: true,
        tsc: None,
        tsc_if_clear: false,
    }
}

/// A run stops before an instruction breakpoint's address inside a block, the instructions
/// before it retired; with a data breakpoint on user memory armed, before STAC (which opens the
/// kernel's access to user memory) and IRETQ; the next run, without the breakpoints, runs
/// through them (translations made for them do not outlive them).
#[test]
fn a_run_stops_before_the_guests_breakpoints() {
    // nop; nop; nop; stac; nop; out dx, al
    let (mem, regs, sregs, mode) = machine(&[0x90, 0x90, 0x90, 0x0F, 0x01, 0xCB, 0x90, 0xEE]);
    let mut tcg = Tcg::new(&mem).unwrap();
    let counters = [(armed(Semantics::Instructions), u64::MAX)];
    let state = CpuState::new(regs, sregs);
    let run = |tcg: &mut Tcg, watch: Watch| tcg.run(&state, mode, Counting { watch, ..counting(&counters) }).unwrap();
    let r = run(&mut tcg, Watch { exec: vec![CODE + 2], user_data: false });
    assert_eq!((r.stop, r.state.regs.rip, r.retired, r.counts.clone()), (Stop::Breakpoint, CODE + 2, 2, vec![2]));
    let r = run(&mut tcg, Watch { exec: Vec::new(), user_data: true });
    assert_eq!((r.stop, r.state.regs.rip, r.retired), (Stop::Handover, CODE + 3, 3), "before STAC");
    let r = run(&mut tcg, Watch::default());
    assert_eq!((r.stop, r.state.regs.rip, r.retired), (Stop::Handover, CODE + 7, 5), "through both, to the OUT");
}

/// STI runs in the engine where the run may hold interrupts back (`Counting::sti`: nothing
/// counts), and a run that stops right after it says so, for the shadow that covers the next
/// instruction (here HLT, handed over: `sti; hlt` must not let an interrupt in before the HLT);
/// where something counts, the run hands it over, as the instruction that goes to KVM.
#[test]
fn sti_runs_in_the_engine_where_nothing_counts_and_a_run_that_ends_after_it_says_so() {
    // cli; nop; sti; hlt
    let (mem, regs, sregs, mode) = machine(&[0xFA, 0x90, 0xFB, 0xF4]);
    let mut tcg = Tcg::new(&mem).unwrap();
    let state = CpuState::new(regs, sregs);
    let r = tcg.run(&state, mode, Counting { withhold_sti: false, ..counting(&[]) }).unwrap();
    assert_eq!((r.stop, r.state.regs.rip, r.retired, r.after_sti), (Stop::Handover, CODE + 3, 3, true));
    assert_ne!(r.state.regs.rflags & RFLAGS_IF, 0, "STI set IF");
    let r = tcg.run(&state, mode, counting(&[])).unwrap();
    assert_eq!((r.stop, r.state.regs.rip, r.retired, r.after_sti), (Stop::Handover, CODE + 2, 2, false));
    assert_eq!(r.state.regs.rflags & RFLAGS_IF, 0, "CLI cleared IF");
    // cli; sti; nop; out dx, al: the NOP under the shadow retired in the run, which ends after it.
    let (mem, regs, sregs, mode) = machine(&[0xFA, 0xFB, 0x90, 0xEE]);
    let mut tcg = Tcg::new(&mem).unwrap();
    let r = tcg.run(&CpuState::new(regs, sregs), mode, Counting { withhold_sti: false, ..counting(&[]) }).unwrap();
    assert_eq!((r.stop, r.state.regs.rip, r.retired, r.after_sti), (Stop::Handover, CODE + 3, 3, false));
}

/// mov ecx, 1000; loop .; out dx, al
const LOOP: &[u8] = &[0xB9, 0xE8, 0x03, 0x00, 0x00, 0xE2, 0xFE, 0xEE];

#[test]
fn runs_a_loop_exactly_and_hands_port_io_to_kvm() {
    let (mem, regs, sregs, mode) = machine(LOOP);
    let mut tcg = Tcg::new(&mem).unwrap();
    let counters =
        [(armed(Semantics::Instructions), u64::MAX), (armed(Semantics::Branches(BranchFilter::ALL)), u64::MAX)];
    let r = tcg.run(&CpuState::new(regs, sregs), mode, counting(&counters)).unwrap();
    assert_eq!(r.stop, Stop::Handover);
    assert_eq!((r.state.regs.rip, r.state.regs.rcx), (CODE + 7, 0), "stopped before the OUT, after the loop");
    assert_eq!((r.retired, r.counts.clone()), (1001, vec![1001, 1000]), "{r:?}");
}

/// Kernel code reads CR2 in the engine (Linux's page-fault handler reads it first): the vCPU's,
/// counted, in every run, though unicorn's own page walks set its CR2 where they fault (here the
/// one that drops the translation at a breakpoint on a page it may not fetch from, and the one
/// after every run). CR0 is handed over.
#[test]
fn cr2_reads_run_in_the_engine_with_the_vcpus_value() {
    // mov r12, cr2; mov rax, cr0
    let (mem, regs, mut sregs, mut mode) = machine(&[0x41, 0x0F, 0x20, 0xD4, 0x0F, 0x20, 0xC0]);
    // 2 MiB up: the same memory again, execute-disable (EFER.NXE; SDM Vol. 3A 4.5).
    mem.write_obj(0x8000_0000_0000_0087u64, GuestAddress(0x3008)).unwrap();
    sregs.efer |= 1 << 11;
    mode.efer = sregs.efer;
    sregs.cr2 = 0x7fff_dead_b000;
    let mut tcg = Tcg::new(&mem).unwrap();
    let counters = [(armed(Semantics::Instructions), u64::MAX)];
    let state = CpuState::new(regs, sregs);
    let breakpoint = Watch { exec: vec![0x20_0000 + CODE], user_data: false };
    for watch in [Watch::default(), Watch::default(), breakpoint] {
        let r = tcg.run(&state, mode, Counting { watch, ..counting(&counters) }).unwrap();
        assert_eq!((r.stop, r.state.regs.rip, r.retired, r.counts.clone()), (Stop::Handover, CODE + 4, 1, vec![1]));
        assert_eq!(r.state.regs.r12, sregs.cr2, "{:#x}", r.state.regs.r12);
    }
}

/// With a window on the guest's TSC (`Counting::tsc`), RDTSC and RDTSCP run in the engine, each
/// counted: EDX:EAX the host's TSC plus the offset, never below the floor and going up, the
/// upper halves clear, RDTSCP's ECX IA32_TSC_AUX; the run says what it gave. Without one the run
/// hands RDTSC over.
#[test]
fn rdtsc_runs_in_the_engine_with_a_window_on_the_guests_tsc() {
    // rdtsc; mov rbx, rax; mov rsi, rdx; rdtscp; out dx, al
    let code = [0x0F, 0x31, 0x48, 0x89, 0xC3, 0x48, 0x89, 0xD6, 0x0F, 0x01, 0xF9, 0xEE];
    let (mem, mut regs, sregs, mode) = machine(&code);
    (regs.rax, regs.rdx, regs.rcx) = (u64::MAX, u64::MAX, u64::MAX);
    let mut tcg = Tcg::new(&mem).unwrap();
    let counters = [(armed(Semantics::Instructions), u64::MAX)];
    let state = CpuState::new(regs, sregs);
    let run = |tcg: &mut Tcg, tsc| tcg.run(&state, mode, Counting { tsc, ..counting(&counters) }).unwrap();
    let values = |r: &Run| (r.state.regs.rsi << 32 | r.state.regs.rbx, r.state.regs.rdx << 32 | r.state.regs.rax);
    // A floor far above the host's TSC decides.
    let floor = crate::host_tsc() + (1 << 50);
    let r = run(&mut tcg, Some(TscSource::Host(crate::TscWindow { offset: 0, floor, aux: 7 })));
    assert_eq!((r.stop, r.state.regs.rip, r.retired, r.counts.clone()), (Stop::Handover, CODE + 11, 4, vec![4]));
    assert_eq!(values(&r), (floor, floor + 1));
    let halves = [r.state.regs.rax, r.state.regs.rbx, r.state.regs.rdx, r.state.regs.rsi];
    assert!(halves.iter().all(|h| h >> 32 == 0), "{halves:x?}");
    assert_eq!(r.state.regs.rcx, 7);
    assert_eq!(r.tsc, TscGiven { reads: 2, last: Some(floor + 1), model_reads: 0 });
    // The host's TSC plus the offset.
    let offset = 1 << 60;
    let before = crate::host_tsc() + offset;
    let r = run(&mut tcg, Some(TscSource::Host(crate::TscWindow { offset, floor: 0, aux: 0 })));
    let after = crate::host_tsc() + offset;
    let (first, second) = values(&r);
    assert!(before <= first && first < second && second <= after, "{before} {first} {second} {after}");
    let r = run(&mut tcg, None);
    assert_eq!((r.stop, r.state.regs.rip, r.retired, r.tsc), (Stop::Handover, CODE, 0, TscGiven::default()));
}

/// The core cycles the cost model gives the instructions of `code`, none a taken branch.
fn model_cycles(code: &[u8]) -> u64 {
    let mut d = iced_x86::Decoder::with_ip(64, code, CODE, iced_x86::DecoderOptions::NONE);
    std::iter::from_fn(|| d.can_decode().then(|| d.decode()))
        .map(|i| crate::precise::events::cycles(&emon_x86::insn::of(&i), false))
        .sum()
}

/// In a counted stretch RDTSC and RDTSCP read the model's time in the engine (`TscSource::Model`):
/// the base plus the model clock at the instruction, the core cycles of everything before it, as
/// emon answers a read at a step boundary; RDTSCP's ECX IA32_TSC_AUX. So in a block run, with
/// RFLAGS.IF set (the model's time does not depend on when an interrupt comes), and where user
/// code goes an instruction at a time to an overflow.
#[test]
fn rdtsc_reads_the_models_time_in_a_counted_stretch() {
    // nop; nop; rdtsc; mov rbx, rax; rdtscp; out dx, al
    let code = [0x90, 0x90, 0x0F, 0x31, 0x48, 0x89, 0xC3, 0x0F, 0x01, 0xF9, 0xEE];
    let (mem, mut regs, sregs, mode) = machine(&code);
    regs.rflags |= RFLAGS_IF;
    let mut tcg = Tcg::new(&mem).unwrap();
    let (base, start) = (1 << 40, 1000);
    let model = Some(TscSource::Model { base, aux: 9 });
    let clock = ModelClock { cycles: start, ..CLOCK };
    let counters = [(armed(Semantics::Instructions), u64::MAX)];
    let r = tcg.run(&CpuState::new(regs, sregs), mode, Counting { tsc: model, clock, ..counting(&counters) }).unwrap();
    assert_eq!((r.stop, r.state.regs.rip, r.retired), (Stop::Handover, CODE + 10, 5));
    let first = base + start + model_cycles(&code[..2]);
    let second = base + start + model_cycles(&code[..7]);
    let halves = |v: u64| (v & 0xFFFF_FFFF, v >> 32);
    assert_eq!((r.state.regs.rbx, (r.state.regs.rax, r.state.regs.rdx)), (halves(first).0, halves(second)));
    assert_eq!((r.state.regs.rcx, r.tsc), (9, TscGiven { reads: 0, last: None, model_reads: 2 }));
    assert_eq!(r.cycles, model_cycles(&code[..10]), "the run's cycles go on the model clock");
    // User code three instructions from an overflow goes an instruction at a time, the RDTSC last.
    let umode = CpuMode { cpl: 3, ..mode };
    let usr = Armed { os: false, ..armed(Semantics::Instructions) };
    let near = [(usr, 3)];
    let r = tcg.run(&user_state(&sregs, &regs), umode, Counting { tsc: model, clock, ..counting(&near) }).unwrap();
    assert_eq!((r.stop, r.state.regs.rip, r.retired), (Stop::Overflowed, CODE + 4, 3));
    assert_eq!(((r.state.regs.rax, r.state.regs.rdx), r.tsc.model_reads), (halves(first), 1));
}

/// A window that serves only code with RFLAGS.IF clear (`Counting::tsc_if_clear`): the run
/// reads the TSC before an STI, and stops before the block that would read it after (IF set
/// there), the instructions before retired. A stop a run without a window put before an RDTSC
/// is no stop in a run with one, and stays for the next run without (no translation made
/// again); that run stops at it.
#[test]
fn a_window_for_code_with_interrupts_masked_stops_before_a_read_once_sti_ran() {
    // nop; rdtsc; mov rbx, rax; sti; nop; rdtsc; out dx, al
    let code = [0x90, 0x0F, 0x31, 0x48, 0x89, 0xC3, 0xFB, 0x90, 0x0F, 0x31, 0xEE];
    let (mem, regs, sregs, mode) = machine(&code);
    let mut tcg = Tcg::new(&mem).unwrap();
    let counters = [(armed(Semantics::Instructions), u64::MAX)];
    let floor = crate::host_tsc() + (1 << 50);
    let window = Some(TscSource::Host(crate::TscWindow { offset: 0, floor, aux: 0 }));
    let masked_only = |tsc| Counting { tsc, tsc_if_clear: true, withhold_sti: false, ..counting(&counters) };
    let state = CpuState::new(regs, sregs);
    let r = tcg.run(&state, mode, masked_only(None)).unwrap();
    assert_eq!((r.stop, r.state.regs.rip, r.retired), (Stop::Handover, CODE + 1, 1), "no window: before the RDTSC");
    assert!(tcg.uc.get_data().tsc_stops.contains(&(CODE + 1)));
    let translations = tcg.flushes();
    let r = tcg.run(&state, mode, masked_only(window)).unwrap();
    assert_eq!((r.stop, r.state.regs.rip, r.retired), (Stop::InterruptsOn, CODE + 8, 5));
    assert_eq!(
        (r.state.regs.rbx, r.tsc),
        (floor & 0xFFFF_FFFF, TscGiven { reads: 1, last: Some(floor), model_reads: 0 })
    );
    assert_ne!(r.state.regs.rflags & RFLAGS_IF, 0);
    assert_eq!(r.counts, vec![5]);
    assert!(tcg.stops.contains_key(&(CODE + 1)), "the stop stays");
    let r = tcg.run(&state, mode, masked_only(None)).unwrap();
    assert_eq!((r.stop, r.state.regs.rip, r.retired), (Stop::Handover, CODE + 1, 1), "stopped at it again");
    assert_eq!(tcg.flushes(), translations);
    // Where the window serves any code, both reads run.
    let r = tcg.run(&state, mode, Counting { tsc_if_clear: false, ..masked_only(window) }).unwrap();
    assert_eq!((r.stop, r.state.regs.rip, r.retired, r.tsc.reads), (Stop::Handover, CODE + 10, 6, 2));
}

/// A block decoded for a run with a window on the TSC serves a run without one, and the other
/// way round, unless it reads the TSC: runs at CPL0 with RFLAGS.IF clear have the window and
/// runs with IF set do not, and decoding every block again at each switch made a boot about a
/// quarter slower. Likewise for STI and what opens user memory to the kernel.
#[test]
fn a_decoded_block_serves_runs_that_withhold_otherwise_only_what_it_does_not_have() {
    // nop; out dx, al | nop; rdtsc; out dx, al | sti | stac
    let code = [0x90, 0xEE, 0x90, 0x0F, 0x31, 0xEE, 0xFB, 0x0F, 0x01, 0xCB];
    let (mem, _, _, mode) = machine(&code);
    let window = Withheld::default();
    let none = Withheld { tsc: true, ..window };
    let all = Withheld { user_access: true, sti: true, tsc: true };
    let serves = |(at, size): (u64, usize), made: Withheld, wanted: Withheld| {
        let b = blocks::decode_block(&mode, &mem, (at, size), false, Needs::NONE, made);
        b.serves([None; 2], (false, Needs::NONE, wanted), size as u32)
    };
    assert!(serves((CODE, 2), window, none) && serves((CODE, 2), none, all), "no RDTSC, STI or STAC");
    assert!(!serves((CODE + 2, 4), window, none) && !serves((CODE + 2, 4), none, window), "an RDTSC");
    assert!(serves((CODE + 2, 4), none, Withheld { sti: true, ..none }));
    assert!(!serves((CODE + 6, 1), window, Withheld { sti: true, ..window }), "an STI");
    assert!(!serves((CODE + 7, 3), window, Withheld { user_access: true, ..window }), "a STAC");
    let b = blocks::decode_block(&mode, &mem, (CODE, 2), false, Needs::NONE, window);
    assert!(!b.serves([None; 2], (true, Needs::NONE, window), 2), "decoded without the cache model");
    assert!(!b.serves([None; 2], (false, Needs::NONE, window), 3), "another size");
}

/// A block decoded for a run that loaded the x87/SSE state or the SYSCALL MSRs serves a run
/// that loaded otherwise wherever the block decodes alike: 85% of the blocks a `perf record` at
/// period 1 decoded were decoded again only because the run before had loaded otherwise.
#[test]
fn a_decoded_block_serves_runs_that_loaded_otherwise_where_it_decodes_alike() {
    // nop | nop; xorps xmm0, xmm0
    let code = [0x90, 0x90, 0x0F, 0x57, 0xC0];
    let (mem, _, _, mode) = machine(&code);
    let (none, fpu) = (Needs::NONE, Needs { fpu: true, msrs: false });
    let (msrs, both) = (Needs { fpu: false, msrs: true }, Needs { fpu: true, msrs: true });
    let serves = |(at, size): (u64, usize), made: Needs, wanted: Needs| {
        let b = blocks::decode_block(&mode, &mem, (at, size), false, made, Withheld::default());
        b.serves([None; 2], (false, wanted, Withheld::default()), size as u32)
    };
    assert!(serves((CODE, 1), none, both) && serves((CODE, 1), both, none), "a block that needs nothing");
    assert!(serves((CODE + 1, 4), none, msrs), "stopped at the XORPS for want of the x87/SSE state in both");
    assert!(!serves((CODE + 1, 4), none, fpu), "runs the XORPS with the x87/SSE state loaded");
    assert!(serves((CODE + 1, 4), fpu, both) && !serves((CODE + 1, 4), fpu, msrs), "ran the XORPS");
}

/// A block's sums for the armed counters are made once for runs that arm the same counters
/// alike, and made again when a run arms otherwise (allocating them at each run's first entry
/// was a tenth of a `perf record` at period 1).
#[test]
fn a_blocks_sums_are_made_again_only_for_counters_armed_otherwise() {
    // nop; nop; jmp $
    let (mem, _, _, mode) = machine(&[0x90, 0x90, 0xEB, 0xFE]);
    let mut b = blocks::decode_block(&mode, &mem, (CODE, 4), false, Needs::NONE, Withheld::default());
    let a = armed(Semantics::Instructions);
    b.sums(&[a], &[true]);
    assert_eq!((b.body.clone(), b.last_taken.clone(), b.cycles_body), (vec![2], vec![1], 2));
    b.body = vec![7];
    b.sums(&[a], &[true]);
    assert_eq!(b.body, vec![7], "the same counters armed alike: the sums stand");
    b.sums(&[a], &[false]);
    assert_eq!((b.body.clone(), b.last_taken.clone()), (vec![0], vec![0]), "not counting at this level");
    let branches = armed(Semantics::Branches(BranchFilter::ALL));
    b.sums(&[branches], &[true]);
    assert_eq!((b.body.clone(), b.last_taken.clone()), (vec![0], vec![1]), "another event");
}

/// CMASK compares each instruction's count (emon's per-cycle unit) with the threshold, INV
/// inverts it: the engine counts it per instruction as the stepper does (`Armed::advance`),
/// the `loop .` fast path included.
#[test]
fn cmask_and_inv_count_per_instruction() {
    let (mem, regs, sregs, mode) = machine(LOOP);
    let mut tcg = Tcg::new(&mem).unwrap();
    let with = |semantics, cmask, inv| (Armed { cmask, inv, ..armed(semantics) }, u64::MAX);
    let counters = [
        with(Semantics::Instructions, 1, false),
        with(Semantics::Instructions, 2, false),
        with(Semantics::Instructions, 2, true),
        // MOV 1 cycle, 999 taken LOOPs of 2, the last LOOP 1.
        with(Semantics::CoreCycles, 2, false),
        with(Semantics::Branches(BranchFilter::ALL), 1, false),
    ];
    assert!(counters.iter().all(|(a, _)| a.sums_per_instruction()));
    let r = tcg.run(&CpuState::new(regs, sregs), mode, counting(&counters)).unwrap();
    assert_eq!((r.retired, r.counts.clone()), (1001, vec![1001, 0, 1001, 999, 1000]), "{r:?}");
    let mut last = false;
    let stepped: u64 =
        (0..1001).map(|k| counters[3].0.advance(if k == 0 || k == 1000 { 1 } else { 2 }, 0, &mut last)).sum();
    assert_eq!(stepped, 999, "the stepper's count");
}

/// Translations outlive a run only while their code is unchanged: code written behind the
/// engine (as KVM or the VMM may write it between runs) is translated again.
#[test]
fn code_written_between_runs_is_translated_again() {
    use vm_memory::{Bytes, GuestAddress};
    let (mem, regs, sregs, mode) = machine(LOOP);
    let mut tcg = Tcg::new(&mem).unwrap();
    let counters = [(armed(Semantics::Instructions), u64::MAX)];
    let r = tcg.run(&CpuState::new(regs, sregs), mode, counting(&counters)).unwrap();
    assert_eq!(r.retired, 1001);
    let code = &tcg.uc.get_data().code;
    assert!(!code.stale && !code.pages.is_empty(), "the run's code pages are recorded");
    // Unchanged code: the translations stay, and count the same.
    let r = tcg.run(&CpuState::new(regs, sregs), mode, counting(&counters)).unwrap();
    assert_eq!(r.retired, 1001);
    // mov ecx, 10 instead of 1000, written behind the engine's back.
    let pa = mode.translate(&mem, CODE).unwrap();
    mem.write_slice(&[0xB9, 10, 0, 0, 0], GuestAddress(pa)).unwrap();
    assert!(tcg.uc.get_data().code.changed(&mem), "the snapshot sees the write");
    let r = tcg.run(&CpuState::new(regs, sregs), mode, counting(&counters)).unwrap();
    assert_eq!((r.retired, r.state.regs.rip), (11, CODE + 7), "the new code ran: {r:?}");
}

/// Code the engine itself writes (as Linux patches its own text) is decoded again in the next
/// run: the decoded blocks outlive a run only while their pages hold the same bytes.
#[test]
fn code_the_engine_writes_is_decoded_again() {
    // CODE: nop; nop; nop; out dx, al.  CODE + 0x20: mov byte [CODE + 1], 0xEE (OUT); out dx, al.
    let mut code = vec![0x90, 0x90, 0x90, 0xEE];
    code.resize(0x20, 0x90);
    code.extend([0xC6, 0x04, 0x25]);
    code.extend(u32::try_from(CODE + 1).unwrap().to_le_bytes());
    code.extend([0xEE, 0xEE]);
    let (mem, regs, sregs, mode) = machine(&code);
    let mut tcg = Tcg::new(&mem).unwrap();
    let counters = [(armed(Semantics::Instructions), u64::MAX)];
    let r = tcg.run(&CpuState::new(regs, sregs), mode, counting(&counters)).unwrap();
    assert_eq!((r.retired, r.state.regs.rip), (3, CODE + 3), "three NOPs, then the OUT: {r:?}");
    let patch = kvm_regs { rip: CODE + 0x20, ..regs };
    let r = tcg.run(&CpuState::new(patch, sregs), mode, counting(&counters)).unwrap();
    assert_eq!((r.retired, r.state.regs.rip), (1, CODE + 0x28), "the MOV patched the block: {r:?}");
    let r = tcg.run(&CpuState::new(regs, sregs), mode, counting(&counters)).unwrap();
    assert_eq!(
        (r.stop, r.retired, r.state.regs.rip),
        (Stop::Handover, 1, CODE + 1),
        "one NOP, then the new OUT: {r:?}"
    );
}

#[test]
fn reference_cycles_follow_the_model_clock_through_loop_dot() {
    // mov ecx, 1000 (1 cycle); 999 taken LOOPs (2 cycles each) and the last (1): 2000 cycles.
    let (mem, regs, sregs, mode) = machine(LOOP);
    let mut tcg = Tcg::new(&mem).unwrap();
    let reference = Clock { tsc_per_ref_numerator: 167, tsc_per_ref_denominator: 1, ..Clock::TSC };
    let xclk = Armed { id: CounterId::Gp(1), ..armed(Semantics::RefXclk) };
    let counters = [(armed(Semantics::CoreCycles), u64::MAX), (xclk, u64::MAX)];
    let c = Counting { clock: ModelClock { cycles: 100, reference }, ..counting(&counters) };
    let r = tcg.run(&CpuState::new(regs, sregs), mode, c).unwrap();
    assert_eq!((r.cycles, r.counts.clone()), (2000, vec![2000, 12]), "{r:?}");
    // Near its overflow the counter stops the fast path short, and the count stays exact.
    let near = [(xclk, 5)];
    let c = Counting { clock: ModelClock { cycles: 0, reference }, ..counting(&near) };
    let r = tcg.run(&CpuState::new(regs, sregs), mode, c).unwrap();
    assert_eq!(r.stop, Stop::Overflow, "{r:?}");
    assert_eq!(r.counts[0], reference.ref_ticks_at(r.cycles));
    assert!(r.counts[0] < 5);
}

#[test]
fn the_cache_model_sees_the_engines_data_accesses() {
    // mov ecx, 100; 2: mov rax, [rsi]; add rsi, 64; loop 2b; clflush [rsi-64];
    // mov rax, [rsi-64]; jmp +0 (ends the block); out dx, al
    let code = [
        0xB9, 100, 0, 0, 0, 0x48, 0x8B, 0x06, 0x48, 0x83, 0xC6, 0x40, 0xE2, 0xF7, 0x0F, 0xAE, 0x7E, 0xC0, 0x48, 0x8B,
        0x46, 0xC0, 0xEB, 0x00, 0xEE,
    ];
    let (mem, mut regs, sregs, mode) = machine(&code);
    regs.rsi = 0x40000;
    let mut tcg = Tcg::new(&mem).unwrap();
    let misses = Armed { id: CounterId::Gp(1), ..armed(Semantics::LlcMisses) };
    let counters = [(armed(Semantics::LlcReference), u64::MAX), (misses, u64::MAX)];
    let bare = Cache { prefetchers: Prefetchers::default(), ..Cache::SKYLAKE_CLIENT };
    let cache = Some(CacheModel::new(&bare));
    let r = tcg.run(&CpuState::new(regs, sregs), mode, Counting { cache, ..counting(&counters) }).unwrap();
    assert_eq!((r.stop, r.state.regs.rip), (Stop::Handover, CODE + 24), "{:?}", r.state.regs);
    // Without prefetchers: 100 cold lines, then the last one again after its CLFLUSH.
    assert_eq!(r.counts, vec![101, 101]);
    assert!(r.cache.is_some(), "the model comes back");
    // With Skylake's prefetchers, which see each access's RIP (the IP-based stride prefetcher):
    // one miss per 4 KiB page of the 100 lines (two pages), then the flushed line again.
    let cache = Some(CacheModel::new(&Cache::SKYLAKE_CLIENT));
    let r = tcg.run(&CpuState::new(regs, sregs), mode, Counting { cache, ..counting(&counters) }).unwrap();
    assert_eq!(r.counts, vec![3, 3]);
    // Without the model the engine counts no LLC event.
    let r = tcg.run(&CpuState::new(regs, sregs), mode, counting(&counters)).unwrap();
    assert_eq!(r.counts, vec![0, 0]);
}

/// `mov ecx, 1000; rep movsb; mov ecx, 500; xor eax, eax; rep stosb; out dx, al`: TCG runs
/// each REP one iteration per block execution, and each retires once (`Insn::repeats`).
#[test]
fn rep_string_instructions_retire_once() {
    let code = [0xB9, 0xE8, 0x03, 0, 0, 0xF3, 0xA4, 0xB9, 0xF4, 0x01, 0, 0, 0x31, 0xC0, 0xF3, 0xAA, 0xEE];
    let (mem, mut regs, sregs, mode) = machine(&code);
    (regs.rsi, regs.rdi) = (0x40000, 0x50000);
    let mut tcg = Tcg::new(&mem).unwrap();
    let counters = [(armed(Semantics::Instructions), u64::MAX), (armed(Semantics::CoreCycles), u64::MAX)];
    let r = tcg.run(&CpuState::new(regs, sregs), mode, counting(&counters)).unwrap();
    assert_eq!((r.stop, r.state.regs.rip, r.state.regs.rcx), (Stop::Handover, CODE + 16, 0), "{r:?}");
    assert_eq!((r.state.regs.rsi, r.state.regs.rdi), (0x40000 + 1000, 0x50000 + 1000 + 500));
    // 5 instructions of 1 cycle each (a string instruction's operands are implicit), whatever
    // the iterations: the cost model counts an instruction when it retires.
    assert_eq!((r.retired, r.counts.clone()), (5, vec![5, 5]), "{r:?}");
    // A budget that ends the run between two iterations: the REP has not retired.
    let c = Counting { budget: 3, ..counting(&counters) };
    let r = tcg.run(&CpuState::new(regs, sregs), mode, c).unwrap();
    assert_eq!((r.stop, r.state.regs.rip, r.retired), (Stop::Budget, CODE + 5, 1), "{r:?}");
    assert!(r.state.regs.rcx > 0 && r.state.regs.rcx < 1000, "stopped midway: {r:?}");
}

/// Where nothing counts, the iterations of REP STOS and REP MOVS go to guest memory at once, all
/// but the last (`rep_ahead`): the same bytes and registers as one at a time, in a few blocks.
/// Where the page's entry is not dirty yet, TCG runs the first iteration, which sets the flag as
/// the CPU does, and the rest go ahead; a MOVS whose destination overlaps its source ahead goes
/// an iteration at a time.
#[test]
fn rep_stos_and_movs_run_ahead_on_guest_memory_where_nothing_counts() {
    // mov ecx, 3000; rep stosq; mov ecx, 10000; rep movsb; out dx, al
    let code = [0xB9, 0xB8, 0x0B, 0, 0, 0xF3, 0x48, 0xAB, 0xB9, 0x10, 0x27, 0, 0, 0xF3, 0xA4, 0xEE];
    let (mem, mut regs, sregs, mode) = machine(&code);
    // The 2 MiB page accessed and dirty, as Linux maps its direct map.
    mem.write_obj(0xE7u64, GuestAddress(0x3000)).unwrap();
    (regs.rax, regs.rdi, regs.rsi) = (0x1122_3344_5566_7788, 0x40008, 0x40003);
    let mut tcg = Tcg::new(&mem).unwrap();
    let r = tcg.run(&CpuState::new(regs, sregs), mode, counting(&[])).unwrap();
    assert_eq!((r.stop, r.state.regs.rip, r.state.regs.rcx, r.retired), (Stop::Handover, CODE + 15, 0, 4), "{r:?}");
    // STOSQ filled 24,000 bytes from 0x40008; MOVSB then copied 10,000 bytes from 0x40003 to
    // where STOSQ ended, each byte as it was before the copy (no overlap).
    let stos_end = 0x40008 + 3000 * 8;
    assert_eq!((r.state.regs.rdi, r.state.regs.rsi), (stos_end + 10_000, 0x40003 + 10_000));
    let mut filled = vec![0u8; 24_000];
    mem.read_slice(&mut filled, GuestAddress(0x40008)).unwrap();
    let pattern = regs.rax.to_le_bytes();
    let expect_fill: Vec<u8> = (0..24_000).map(|j| pattern[j % 8]).collect();
    let mut copied = vec![0u8; 10_000];
    mem.read_slice(&mut copied, GuestAddress(stos_end)).unwrap();
    let mut source = vec![0u8; 5];
    source.extend(&expect_fill);
    assert_eq!(copied[..], source[..10_000]);
    assert_eq!(filled, expect_fill);
    assert!(r.blocks < 40, "{} blocks: the iterations went one a block", r.blocks);

    // The same where the page is not dirty yet.
    let (mem, regs2, sregs, mode) = machine(&code);
    mem.write_obj(0xA7u64, GuestAddress(0x3000)).unwrap(); // accessed, not dirty
    let regs2 = kvm_regs { rax: regs.rax, rdi: 0x40008, rsi: 0x40003, ..regs2 };
    let mut tcg = Tcg::new(&mem).unwrap();
    let slow = tcg.run(&CpuState::new(regs2, sregs), mode, counting(&[])).unwrap();
    assert_eq!((slow.state.regs, slow.retired), (r.state.regs, r.retired));
    assert_eq!(mem.read_obj::<u64>(GuestAddress(0x3000)).unwrap() & 0x40, 0x40, "TCG set D");
    assert!(slow.blocks < 40, "{} blocks", slow.blocks);
    let mut copied_slow = vec![0u8; 10_000];
    mem.read_slice(&mut copied_slow, GuestAddress(stos_end)).unwrap();
    assert_eq!(copied_slow, copied);

    // A MOVS whose destination is one byte ahead of its source repeats the first byte.
    // mov ecx, 100; rep movsb; out dx, al
    let (mem, regs3, sregs, mode) = machine(&[0xB9, 100, 0, 0, 0, 0xF3, 0xA4, 0xEE]);
    mem.write_obj(0xE7u64, GuestAddress(0x3000)).unwrap();
    mem.write_slice(&[7, 8, 9], GuestAddress(0x40000)).unwrap();
    let regs3 = kvm_regs { rsi: 0x40000, rdi: 0x40001, ..regs3 };
    let mut tcg = Tcg::new(&mem).unwrap();
    let r = tcg.run(&CpuState::new(regs3, sregs), mode, counting(&[])).unwrap();
    assert!(r.blocks > 100, "{} blocks", r.blocks);
    let mut out = [0u8; 101];
    mem.read_slice(&mut out, GuestAddress(0x40000)).unwrap();
    assert!(out.iter().all(|b| *b == 7), "{out:?}");
}

#[test]
fn a_stop_leaves_registers_and_counts_in_agreement() {
    // The first block is `mov ecx, 1000; loop .` (2 instructions); later ones the LOOP alone.
    for budget in [2, 3, 50, 777] {
        let (mem, regs, sregs, mode) = machine(LOOP);
        let mut tcg = Tcg::new(&mem).unwrap();
        let counters = [(armed(Semantics::Instructions), u64::MAX)];
        let c = Counting { budget, ..counting(&counters) };
        let r = tcg.run(&CpuState::new(regs, sregs), mode, c).unwrap();
        assert_eq!(r.stop, Stop::Budget, "{budget}");
        assert!(r.retired <= budget && r.retired + 1 >= budget, "{budget}: {r:?}");
        // Every retired LOOP decremented RCX once.
        assert_eq!(1000 - r.state.regs.rcx, r.retired - 1, "{budget}: {r:?}");
        assert_eq!(r.state.regs.rip, CODE + 5);
    }
}

#[test]
fn stops_short_of_a_counters_overflow() {
    let (mem, regs, sregs, mode) = machine(LOOP);
    let mut tcg = Tcg::new(&mem).unwrap();
    let r = tcg.run(&CpuState::new(regs, sregs), mode, counting(&[(armed(Semantics::Instructions), 300)])).unwrap();
    assert_eq!(r.stop, Stop::Overflow);
    assert!(r.counts[0] < 300 && r.counts[0] >= 290, "{r:?}");
    assert_eq!(1000 - r.state.regs.rcx, r.retired - 1);
}

#[test]
fn a_fault_stops_before_the_faulting_instruction() {
    // mov ecx, 5; mov eax, [0xFEE00030] (the local APIC, not RAM); nop
    let code = [0xB9, 0x05, 0x00, 0x00, 0x00, 0x8B, 0x04, 0x25, 0x30, 0x00, 0xE0, 0xFE, 0x90];
    let (mem, regs, sregs, mode) = machine(&code);
    let mut tcg = Tcg::new(&mem).unwrap();
    let r =
        tcg.run(&CpuState::new(regs, sregs), mode, counting(&[(armed(Semantics::Instructions), u64::MAX)])).unwrap();
    assert_eq!((r.stop, r.state.regs.rip, r.state.regs.rcx, r.retired), (Stop::Fault, CODE + 5, 5, 1), "{r:?}");
}

#[test]
fn iretq_within_the_kernel_runs_and_counts_once() {
    // iretq (frame at the stack: RIP = CODE+0x20, CS = 8, RFLAGS = 2, RSP, SS = 0x10); at
    // CODE+0x20: nop; out dx, al.
    let mut code = vec![0x48, 0xCF];
    code.resize(0x20, 0x90);
    code.extend([0x90, 0xEE]);
    let (mem, mut regs, sregs, mode) = machine(&code);
    regs.rsp = 0x7000;
    for (i, v) in [CODE + 0x20, 8, 0x2, 0x8000, 0x10].iter().enumerate() {
        mem.write_obj(*v, GuestAddress(0x7000 + 8 * i as u64)).unwrap();
    }
    let mut tcg = Tcg::new(&mem).unwrap();
    let r =
        tcg.run(&CpuState::new(regs, sregs), mode, counting(&[(armed(Semantics::Instructions), u64::MAX)])).unwrap();
    // The block after the IRETQ (nop; out) holds an OUT: the engine runs the NOP and stops
    // before the OUT.
    assert_eq!(
        (r.stop, r.state.regs.rip, r.retired, r.iret, r.cpl),
        (Stop::Handover, CODE + 0x21, 2, true, 0),
        "{r:?}"
    );
    assert_eq!(r.state.regs.rsp, 0x8000);
}

#[test]
fn a_page_fault_stops_before_the_faulting_instruction() {
    // nop; mov rax, [0x40_0000_0000] (no page maps it); nop
    let code = [0x90, 0x48, 0xA1, 0, 0, 0, 0, 0x40, 0, 0, 0, 0x90];
    let (mem, regs, sregs, mode) = machine(&code);
    let mut tcg = Tcg::new(&mem).unwrap();
    let r =
        tcg.run(&CpuState::new(regs, sregs), mode, counting(&[(armed(Semantics::Instructions), u64::MAX)])).unwrap();
    assert_eq!((r.stop, r.state.regs.rip, r.retired, r.counts[0]), (Stop::Fault, CODE + 1, 1, 1), "{r:?}");
}

#[test]
fn decides_what_runs_in_the_engine() {
    let class = |bytes: &[u8]| {
        let i = Decoder::with_ip(64, bytes, 0, DecoderOptions::NONE).decode();
        classify(&i, &mut InstructionInfoFactory::new())
    };
    let plain = Class::Runs(Needs::NONE);
    let fpu = Class::Runs(Needs { fpu: true, msrs: false });
    let cases: &[(&[u8], Class, &str)] = &[
        (&[0xE2, 0xFE], plain, "loop"),
        (&[0x48, 0x8B, 0x06], plain, "mov rax, [rsi]"),
        (&[0x0F, 0x1F, 0x00], plain, "nop dword [rax]"),
        (&[0xF3, 0x0F, 0x1E, 0xFA], plain, "endbr64"),
        (&[0xF3, 0x90], plain, "pause"),
        (&[0x0F, 0xAE, 0xE8], plain, "lfence"),
        (&[0x0F, 0x18, 0x0E], plain, "prefetcht0 [rsi]"),
        (&[0x0F, 0x0D, 0x48, 0x58], plain, "prefetchw [rax+0x58]: Linux's in place of PREFETCHT0"),
        (&[0x0F, 0xAE, 0x3F], plain, "clflush [rdi]: the cache model's flush"),
        (&[0x9C], plain, "pushfq"),
        (&[0xFA], plain, "cli: clears RFLAGS.IF, which goes back to the vCPU"),
        (&[0x0F, 0x01, 0xCB], plain, "stac"),
        (&[0x48, 0xCF], plain, "iretq: the way into user mode"),
        (&[0x66, 0x0F, 0xEF, 0xC0], fpu, "pxor xmm0, xmm0"),
        (&[0xDD, 0x05, 0, 0, 0, 0], fpu, "fld qword [rip]"),
        (&[0xF2, 0x0F, 0x38, 0xF1, 0xC1], plain, "crc32 eax, ecx (SSE4.2 on general registers)"),
        (&[0x0F, 0xAE, 0x2F], Class::HandedOver, "xrstor [rdi]: emon completes it (AVX and the compacted form)"),
        (&[0x48, 0x0F, 0x07], Class::Runs(Needs { fpu: false, msrs: true }), "sysretq: from IA32_STAR"),
        (&[0x0F, 0x01, 0xD0], fpu, "xgetbv: XCR0"),
        (&[0x0F, 0x01, 0xF8], Class::Runs(Needs { fpu: false, msrs: true }), "swapgs"),
        (&[0xEE], Class::HandedOver, "out"),
        (&[0x0F, 0x30], Class::HandedOver, "wrmsr"),
        (&[0x0F, 0xA2], Class::HandedOver, "cpuid"),
        (&[0x0F, 0x31], Class::HandedOver, "rdtsc"),
        (&[0xF4], Class::HandedOver, "hlt"),
        (&[0xFB], plain, "sti: where the run withholds nothing (class_in)"),
        (&[0x9D], Class::HandedOver, "popfq: may open an interrupt window"),
        (&[0xCF], Class::HandedOver, "iretd"),
        (&[0x8E, 0xD8], Class::HandedOver, "mov ds, ax"),
        (&[0x0F, 0x22, 0xD8], Class::HandedOver, "mov cr3, rax"),
        (&[0x41, 0x0F, 0x20, 0xD4], plain, "mov r12, cr2: the vCPU's, which the engine holds"),
        (&[0x0F, 0x20, 0xC0], Class::HandedOver, "mov rax, cr0"),
        (&[0xF0, 0x0F, 0x20, 0xC0], Class::HandedOver, "lock mov rax, cr0: CR8"),
        (&[0x0F, 0x01, 0x38], Class::Runs(Needs::NONE), "invlpg [rax]: the run says so, for KVM's TLB"),
        (&[0xCD, 0x80], Class::HandedOver, "int 0x80"),
        (&[0xC5, 0xF9, 0xEF, 0xC0], Class::HandedOver, "vpxor xmm0, xmm0, xmm0: AVX, which TCG lacks"),
        (&[0x0F, 0xC7, 0xF8], Class::HandedOver, "rdseed eax: TCG lacks it"),
    ];
    for (bytes, want, what) in cases {
        assert_eq!(class(bytes), *want, "{what}");
    }
    let within = |bytes: &[u8], withheld| {
        let i = Decoder::with_ip(64, bytes, 0, DecoderOptions::NONE).decode();
        class_in(&i, &mut InstructionInfoFactory::new(), withheld)
    };
    let sti = Withheld { sti: true, ..Withheld::default() };
    let user_access = Withheld { user_access: true, ..Withheld::default() };
    assert_eq!(within(&[0xFB], sti), Class::HandedOver, "sti while something counts");
    assert_eq!(within(&[0xFB], user_access), plain);
    assert_eq!(within(&[0x0F, 0x01, 0xCB], user_access), Class::HandedOver, "stac under a watch on user memory");
    assert_eq!(within(&[0x0F, 0x01, 0xCB], sti), plain);
    let no_tsc = Withheld { tsc: true, ..Withheld::default() };
    for rdtsc in [&[0x0F, 0x31][..], &[0x0F, 0x01, 0xF9]] {
        assert_eq!(class(rdtsc), Class::HandedOver, "rdtsc, rdtscp: the run says whether it has the TSC");
        assert_eq!(within(rdtsc, no_tsc), Class::HandedOver, "rdtsc without a window on the TSC");
        assert_eq!(within(rdtsc, sti), plain, "rdtsc with a window");
    }
}

/// The same machine at CPL3: user CS and SS, user RSP.
fn user_state(sregs: &kvm_sregs, regs: &kvm_regs) -> CpuState {
    let mut s = CpuState::new(*regs, *sregs);
    s.sregs.cs = kvm_segment { selector: USER_CS, type_: 0xB, present: 1, s: 1, l: 1, dpl: 3, ..Default::default() };
    s.sregs.ss = kvm_segment { selector: USER_DS, type_: 0x3, present: 1, s: 1, db: 1, dpl: 3, ..Default::default() };
    s.sregs.ds = s.sregs.ss;
    s.sregs.es = s.sregs.ss;
    s.regs.rsp = 0x9000;
    s
}

/// User mode runs from any CPL3 state (entered through the private region's IRETQ, with the
/// guest's own descriptors), counts at USR only, and the engine comes back to CPL0 for a kernel
/// run after it (through the region's SYSCALL).
#[test]
fn user_mode_runs_from_any_state_and_back() {
    // nop x 3; hlt (privileged: handed over, the #GP is the VMM's to deliver)
    let (mem, regs, sregs, mode) = machine(&[0x90, 0x90, 0x90, 0xF4]);
    let mut tcg = Tcg::new(&mem).unwrap();
    let user = user_state(&sregs, &regs);
    let usr = Armed { os: false, ..armed(Semantics::Instructions) };
    let umode = CpuMode { cpl: 3, ..mode };
    let r = tcg.run(&user, umode, counting(&[(usr, u64::MAX)])).unwrap();
    assert_eq!((r.stop, r.cpl, r.state.regs.rip, r.counts.clone()), (Stop::Handover, 3, CODE + 3, vec![3]), "{r:?}");
    assert_eq!(r.state.sregs, user.sregs, "the segments it started with");
    // The kernel again, with the same engine: OS counts, USR does not.
    let r = tcg.run(&CpuState::new(regs, sregs), mode, counting(&[(usr, u64::MAX)])).unwrap();
    assert_eq!((r.stop, r.cpl, r.state.regs.rip, r.counts.clone()), (Stop::Handover, 0, CODE + 3, vec![0]), "{r:?}");
}

/// A run from the control state the engine holds after the last run (nothing ran elsewhere)
/// loads only the general registers: user mode goes on from where it stopped without the
/// trampolines out of and into user mode; another state, or the guest running in KVM between,
/// loads it all.
#[test]
fn a_run_from_the_state_the_engine_holds_loads_only_the_general_registers() {
    // (inc rax; jmp next) x 4; hlt: a block a step.
    let step = [0x48, 0xFF, 0xC0, 0xEB, 0x00];
    let code: Vec<u8> = step.iter().cycle().take(20).copied().chain([0xF4]).collect();
    let (mem, regs, sregs, mode) = machine(&code);
    let mut tcg = Tcg::new(&mem).unwrap();
    let umode = CpuMode { cpl: 3, ..mode };
    let one = |budget| Counting { budget, ..counting(&[]) };
    let r = tcg.run(&user_state(&sregs, &regs), umode, one(2)).unwrap();
    assert_eq!((r.stop, r.state.regs.rip, r.state.regs.rax, tcg.loads), (Stop::Budget, CODE + 5, 1, 1), "{r:?}");
    // The VMM changed a general register (as an emulated RDTSC would): it goes in all the same.
    let mut s = r.state.clone();
    s.regs.rax = 10;
    let r = tcg.run(&s, umode, one(2)).unwrap();
    assert_eq!((r.stop, r.state.regs.rip, r.state.regs.rax, r.cpl, tcg.loads), (Stop::Budget, CODE + 10, 11, 3, 1));
    // The guest ran in KVM: everything is loaded again.
    tcg.ran_elsewhere();
    let r = tcg.run(&r.state, umode, one(2)).unwrap();
    assert_eq!((r.state.regs.rip, r.state.regs.rax, tcg.loads), (CODE + 15, 12, 2));
    // Other control state (CR2 here): loaded.
    let mut s = r.state.clone();
    s.sregs.cr2 = 0x1234;
    let r = tcg.run(&s, umode, counting(&[])).unwrap();
    assert_eq!((r.stop, r.state.regs.rip, r.state.regs.rax, tcg.loads), (Stop::Handover, CODE + 20, 13, 3));
}

/// At CPL3 a run goes on an instruction at a time up to the one that brings a counter to its
/// overflow, and stops right after it, whether that is a DEC or the JNZ after it; the stepping
/// drops no translation (unicorn's own instruction count dropped them all twice a step).
#[test]
fn user_code_steps_to_its_overflow_exactly_and_keeps_the_translations() {
    // 1: dec rcx; jnz 1b; hlt
    let (mem, mut regs, sregs, mode) = machine(&[0x48, 0xFF, 0xC9, 0x75, 0xFB, 0xF4]);
    regs.rcx = 100;
    let mut tcg = Tcg::new(&mem).unwrap();
    let umode = CpuMode { cpl: 3, ..mode };
    let usr = Armed { os: false, ..armed(Semantics::Instructions) };
    let r = tcg.run(&user_state(&sregs, &regs), umode, counting(&[(usr, 51)])).unwrap();
    // The 51st instruction is the 26th DEC.
    let got = (r.stop, r.counts[0], r.retired, r.state.regs.rip, r.state.regs.rcx);
    assert_eq!(got, (Stop::Overflowed, 51, 51, CODE + 3, 74), "{r:?}");
    let flushes = tcg.flushes();
    assert_eq!(flushes, 1, "the new engine's");
    // From there, the 51st is the 26th JNZ (taken, to the DEC); and again.
    let mut state = r.state;
    for (rip, rcx) in [(CODE, 49), (CODE + 3, 23)] {
        let r = tcg.run(&state, umode, counting(&[(usr, 51)])).unwrap();
        let got = (r.stop, r.counts[0], r.retired, r.state.regs.rip, r.state.regs.rcx);
        assert_eq!(got, (Stop::Overflowed, 51, 51, rip, rcx), "{r:?}");
        state = r.state;
    }
    assert_eq!(tcg.flushes(), flushes, "no translation dropped");
}

/// A direct CALL whose push faults (its stack page not present), where the engine steps user
/// code to an overflow, did not retire: the run stops with the fault, not counting it. It once
/// counted as a branch to itself, so the counter overflowed on it, the PMI came back to it, and
/// so on for ever (a `perf record` at period 1 of a program calling down a stack page not yet
/// faulted in). A JMP to itself does retire, each time.
#[test]
fn user_code_stepped_to_an_overflow_stops_at_a_faulting_call_without_counting_it() {
    let usr = Armed { os: false, ..armed(Semantics::Instructions) };
    // call $+5
    let (mem, regs, sregs, mode) = machine(&[0xE8, 0, 0, 0, 0]);
    let mut tcg = Tcg::new(&mem).unwrap();
    let umode = CpuMode { cpl: 3, ..mode };
    let mut user = user_state(&sregs, &regs);
    user.regs.rsp = 4 << 20;
    for room in [1, 2] {
        let r = tcg.run(&user, umode, counting(&[(usr, room)])).unwrap();
        let got = (r.stop, r.state.regs.rip, r.retired, r.counts[0]);
        assert_eq!(got, (Stop::Fault, CODE, 0, 0), "{room} to the overflow: {r:?}");
    }
    // With its stack mapped it retires.
    user.regs.rsp = 0x9000;
    let r = tcg.run(&user, umode, counting(&[(usr, 1)])).unwrap();
    assert_eq!((r.stop, r.state.regs.rip, r.retired, r.state.regs.rsp), (Stop::Overflowed, CODE + 5, 1, 0x8FF8));
    // jmp $
    let (mem, regs, sregs, mode) = machine(&[0xEB, 0xFE]);
    let mut tcg = Tcg::new(&mem).unwrap();
    let r = tcg.run(&user_state(&sregs, &regs), CpuMode { cpl: 3, ..mode }, counting(&[(usr, 3)])).unwrap();
    assert_eq!((r.stop, r.state.regs.rip, r.retired, r.counts[0]), (Stop::Overflowed, CODE, 3, 3), "{r:?}");
}

/// A block that goes on to either of two blocks of the same size in the same page, which differ
/// in their instruction count: the block hook finds each by its address (the memo of where
/// control went from a block holds two, and either may be the wrong one).
#[test]
fn a_block_with_two_successors_finds_each_by_its_address() {
    // 1: test cl, 1; jz 3f | 2: xchg ax, ax; jmp 4f | 3: nop; nop; jmp 4f | 4: dec rcx; jnz 1b; hlt
    let code = [
        0xF6, 0xC1, 0x01, 0x74, 0x04, 0x66, 0x90, 0xEB, 0x04, 0x90, 0x90, 0xEB, 0x00, 0x48, 0xFF, 0xC9, 0x75, 0xEE,
        0xF4,
    ];
    let (mem, mut regs, sregs, mode) = machine(&code);
    regs.rcx = 10;
    let mut tcg = Tcg::new(&mem).unwrap();
    let counters = [(armed(Semantics::Instructions), u64::MAX)];
    let r = tcg.run(&CpuState::new(regs, sregs), mode, counting(&counters)).unwrap();
    assert_eq!((r.stop, r.state.regs.rip, r.state.regs.rcx), (Stop::Handover, CODE + 18, 0));
    // Per pass: TEST, JZ, DEC, JNZ, and 2 (RCX odd) or 3 (even) in between.
    assert_eq!(r.counts, vec![10 * 4 + 5 * 2 + 5 * 3]);
}

/// A run through more blocks than the engine keeps decoded drops them all midway (blocks and
/// index together), and counts on exactly: the block hook finds a block from the one before it
/// where control went from there before (by address), and that memo never outlives the index it
/// agrees with. Blocks of the same size and page differ in their instruction count, so finding
/// the wrong one shows in the counts, and the first block goes on to either of two of them.
#[test]
fn a_run_through_more_blocks_than_are_kept_counts_exactly_across_the_drop() {
    // 1: test cl, 1; jz 3f | 2: xchg ax, ax; jmp 4f | 3: nop; nop; jmp 4f |
    // 4: (xchg ax, ax; jmp $+2 | nop; nop; jmp $+2) x N/2; dec rcx; jnz 1b; hlt
    let n = MAX_BLOCKS + 100;
    let mut code = vec![0xF6, 0xC1, 0x01, 0x74, 0x04, 0x66, 0x90, 0xEB, 0x04, 0x90, 0x90, 0xEB, 0x00];
    code.extend([0x66, 0x90, 0xEB, 0x00, 0x90, 0x90, 0xEB, 0x00].repeat(n / 2));
    code.extend([0x48, 0xFF, 0xC9]);
    // jnz rel32, back to the start
    let rel = -((code.len() + 6) as i32);
    code.extend([0x0F, 0x85]);
    code.extend(rel.to_le_bytes());
    code.push(0xF4);
    let (mem, mut regs, sregs, mode) = machine(&code);
    let passes = 3;
    regs.rcx = passes;
    let mut tcg = Tcg::new(&mem).unwrap();
    let counters =
        [(armed(Semantics::Instructions), u64::MAX), (armed(Semantics::Branches(BranchFilter::ALL)), u64::MAX)];
    let r = tcg.run(&CpuState::new(regs, sregs), mode, counting(&counters)).unwrap();
    assert!(r.blocks > passes * n as u64, "{r:?}");
    assert_eq!((r.stop, r.state.regs.rip, r.state.regs.rcx), (Stop::Handover, CODE + code.len() as u64 - 1, 0));
    // Each pass: the TEST and JZ, the DEC and JNZ, the blocks; RCX odd, even, odd: 2, 3, 2 more.
    let instructions = passes * (4 + n as u64 / 2 * 5) + 2 + 3 + 2;
    assert_eq!(r.counts, vec![instructions, passes * (n as u64 + 3)]);
}

/// An x87/SSE state with XMM0 = `xmm0` and the rest as after FNINIT.
fn fpu(xmm0: u128) -> Fpu {
    let mut legacy = Box::new([0u8; emon_x86::fpu::LEGACY]);
    legacy[0..2].copy_from_slice(&0x037Fu16.to_le_bytes());
    legacy[24..28].copy_from_slice(&0x1F80u32.to_le_bytes());
    legacy[160..176].copy_from_slice(&xmm0.to_le_bytes());
    Fpu::legacy_only(legacy, 1)
}

/// SSE code needs the x87/SSE state: without it the run stops before it and says so; with it the
/// engine runs it and gives back the registers it changed.
#[test]
fn sse_code_runs_with_the_fpu_state_loaded() {
    // movq rax, xmm0; paddq xmm0, xmm0; out dx, al
    let (mem, mut regs, mut sregs, mode) = machine(&[0x66, 0x48, 0x0F, 0x7E, 0xC0, 0x66, 0x0F, 0xD4, 0xC0, 0xEE]);
    sregs.cr4 |= 1 << 9 | 1 << 10; // OSFXSR, OSXMMEXCPT
    regs.rax = 0;
    let mut tcg = Tcg::new(&mem).unwrap();
    let counters = [(armed(Semantics::Instructions), u64::MAX)];
    let r = tcg.run(&CpuState::new(regs, sregs), mode, counting(&counters)).unwrap();
    assert_eq!((r.stop, r.retired), (Stop::Needs(Needs { fpu: true, msrs: false }), 0), "{r:?}");
    let mut state = CpuState::new(regs, sregs);
    state.fpu = Some(fpu(0x1111_2222_3333_4444_0000_0000_0000_0021));
    let r = tcg.run(&state, mode, counting(&counters)).unwrap();
    assert_eq!((r.stop, r.retired, r.state.regs.rip, r.state.regs.rax), (Stop::Handover, 2, CODE + 9, 0x21), "{r:?}");
    assert!(r.used.fpu);
    let after = r.state.fpu.unwrap();
    assert_eq!(
        u128::from_le_bytes(after.xmm(0)),
        0x2222_4444_6666_8888_0000_0000_0000_0042,
        "paddq doubled both halves"
    );
    assert_eq!(&after.legacy[..2], &[0x7F, 0x03], "FCW as loaded");
}

/// `fld qword [rsi]` completes as KVM's emulator could not: one instruction, with ST0 and TOP
/// given back; and x87 code runs in the engine.
#[test]
fn x87_completes_and_runs() {
    // fld qword [rsi]; fadd st0, st0; fstp qword [rsi+8]; out dx, al
    let (mem, mut regs, mut sregs, mode) = machine(&[0xDD, 0x06, 0xDC, 0xC0, 0xDD, 0x5E, 0x08, 0xEE]);
    sregs.cr4 |= 1 << 9;
    regs.rsi = 0x40000;
    mem.write_obj(1.5f64.to_bits(), GuestAddress(0x40000)).unwrap();
    let mut state = CpuState::new(regs, sregs);
    state.fpu = Some(fpu(0));
    let mut tcg = Tcg::new(&mem).unwrap();
    let Completed::Retired(after) = tcg.complete(&state).unwrap() else { panic!("fld did not complete") };
    assert_eq!(after.regs.rip, CODE + 2);
    let f = after.fpu.clone().unwrap();
    assert_eq!((u16::from_le_bytes([f.legacy[2], f.legacy[3]]) >> 11) & 7, 7, "TOP decremented to 7");
    assert_eq!(f.legacy[4], 0x80, "the abridged tag word marks physical register 7 valid");
    let counters = [(armed(Semantics::Instructions), u64::MAX)];
    let r = tcg.run(&after, mode, counting(&counters)).unwrap();
    assert_eq!((r.stop, r.retired, r.state.regs.rip), (Stop::Handover, 2, CODE + 7), "{r:?}");
    assert_eq!(f64::from_bits(mem.read_obj::<u64>(GuestAddress(0x40008)).unwrap()), 3.0);
}

/// This process's resident memory, in KiB.
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Whether the test `name` (of this module) runs in a process of its own: if not, runs it in
/// one (this test binary again, that test alone) and says whether it passed. A test that
/// measures the process's memory needs it: the other tests' threads allocate beside it.
fn in_a_process_of_its_own(name: &str) -> Option<bool> {
    const ALONE: &str = "EMON_TEST_ALONE";
    if std::env::var_os(ALONE).is_some() {
        return None;
    }
    let path = module_path!().split_once("::").map_or(module_path!(), |(_, p)| p);
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", &format!("{path}::{name}"), "--test-threads=1", "--nocapture"])
        .env(ALONE, "1")
        .status()
        .unwrap();
    Some(status.success())
}

/// An engine run stops before a handed-over instruction inside a block (a stop hook), and runs
/// do not grow memory: with unicorn's exits instead, every run dropped and remade the
/// translation of each block holding one, about 350 bytes a run that came back only at a flush.
#[test]
fn runs_stop_inside_a_block_and_do_not_grow_memory() {
    if let Some(passed) = in_a_process_of_its_own("runs_stop_inside_a_block_and_do_not_grow_memory") {
        assert!(passed, "the test failed in its own process (its output is above)");
        return;
    }
    // nop; nop; out dx, al
    let (mem, regs, sregs, mode) = machine(&[0x90, 0x90, 0xEE]);
    let mut tcg = Tcg::new(&mem).unwrap();
    let counters = [(armed(Semantics::Instructions), u64::MAX)];
    let state = CpuState::new(regs, sregs);
    let r = tcg.run(&state, mode, counting(&counters)).unwrap();
    assert_eq!((r.stop, r.retired, r.state.regs.rip), (Stop::Handover, 2, CODE + 2), "{r:?}");
    for _ in 0..2_000 {
        tcg.run(&state, mode, counting(&counters)).unwrap();
    }
    let before = rss_kib();
    for _ in 0..20_000 {
        let r = tcg.run(&state, mode, counting(&counters)).unwrap();
        assert_eq!(r.retired, 2);
    }
    let grew = rss_kib().saturating_sub(before);
    assert!(grew < 1024, "20,000 runs grew the process by {grew} KiB");
}

/// A block that runs up to a handed-over instruction is still held back when it could bring a
/// counter to its overflow.
#[test]
fn a_block_that_stops_inside_still_stops_short_of_an_overflow() {
    // nop x 4; out dx, al
    let (mem, regs, sregs, mode) = machine(&[0x90, 0x90, 0x90, 0x90, 0xEE]);
    let mut tcg = Tcg::new(&mem).unwrap();
    let state = CpuState::new(regs, sregs);
    let far = [(armed(Semantics::Instructions), u64::MAX)];
    assert_eq!(tcg.run(&state, mode, counting(&far)).unwrap().retired, 4, "the stop hook is in place");
    let near = [(armed(Semantics::Instructions), 3)];
    let r = tcg.run(&state, mode, counting(&near)).unwrap();
    assert_eq!((r.stop, r.retired), (Stop::Overflow, 0), "{r:?}");
}

/// XSAVE that cannot write its whole area raises #PF as on the CPU: the error code of the first
/// byte it cannot reach (here a supervisor write to a page not present) and that byte as CR2,
/// so that a kernel saving to a user stack can fault the page in and retry.
#[test]
fn xsave_to_a_page_not_present_raises_a_page_fault_with_cr2() {
    // xsave64 [rdi]
    let (mem, mut regs, mut sregs, _) = machine(&[0x48, 0x0F, 0xAE, 0x27]);
    sregs.cr4 |= 1 << 9 | 1 << 18; // OSFXSR, OSXSAVE
    regs.rax = u64::MAX;
    regs.rdx = u64::MAX;
    // The first 2 MiB are mapped; 0x20_0000 is not. One area at the end of the mapping crosses it.
    for (rdi, cr2) in [(0x20_0000, 0x20_0000), (0x1F_FFC0, 0x20_0000)] {
        regs.rdi = rdi;
        let mut state = CpuState::new(regs, sregs);
        state.fpu = Some(fpu(0));
        let done = super::complete_xsave(&mem, &state).unwrap();
        assert_eq!(done, Some(Completed::PageFault { error_code: 0b010, cr2 }), "at {rdi:#x}");
    }
}

/// A block whose last instruction crosses into a page that is not present: TCG cannot translate
/// it and the run says so (nothing ran, no exception); an instruction before that one completes
/// alone, with the guest's RFLAGS as they were (the engine's own TF does not leak).
#[test]
fn a_block_that_runs_into_a_page_not_present_is_untranslatable_and_its_instructions_complete_alone() {
    let (mem, regs, sregs, mode) = machine(&[]);
    // nop x 4; nop dword [rax+rax+0] (9 bytes); mov rax, imm64 across 0x20_0000 (past the 2 MiB
    // the tables map, and past RAM: the rest of its bytes are nowhere).
    let at = 0x1F_FFEC;
    mem.write_slice(
        &[0x90, 0x90, 0x90, 0x90, 0x66, 0x0F, 0x1F, 0x84, 0, 0, 0, 0, 0, 0x48, 0xB8, 1, 2, 3, 4, 5],
        GuestAddress(at),
    )
    .unwrap();
    let mut tcg = Tcg::new(&mem).unwrap();
    let mut user = user_state(&sregs, &regs);
    user.regs.rip = at;
    let usr = Armed { os: false, ..armed(Semantics::Instructions) };
    let r = tcg.run(&user, CpuMode { cpl: 3, ..mode }, counting(&[(usr, u64::MAX)])).unwrap();
    assert_eq!((r.stop, r.state.regs.rip, r.retired, r.fault), (Stop::Untranslatable, at, 0, None), "{r:?}");
    user.regs.rip = at + 4;
    match tcg.complete(&user).unwrap() {
        Completed::Retired(after) => assert_eq!((after.regs.rip, after.regs.rflags), (at + 13, user.regs.rflags)),
        other => panic!("{other:?}"),
    }
}

/// A branch completes alone under the engine's own TF (a conditional branch not taken and taken,
/// CALL, RET), leaving the guest's RFLAGS as they were, and drops no other translation: it used
/// to run counted by unicorn, whose hook goes into every translation, so every translation was
/// dropped before and after it (a program traced an instruction at a time had its kernel code
/// translated again at each of its branches). A run through the same code afterwards retires it
/// all: no single-instruction translation made for a completion serves it.
#[test]
fn a_branch_completes_alone_and_keeps_the_other_translations() {
    // jnz +5; call +1; hlt; ret
    let (mem, regs, sregs, mode) = machine(&[0x75, 0x05, 0xE8, 0x01, 0x00, 0x00, 0x00, 0xF4, 0xC3]);
    let mut tcg = Tcg::new(&mem).unwrap();
    let umode = CpuMode { cpl: 3, ..mode };
    const ZF: u64 = 1 << 6;
    let mut user = user_state(&sregs, &regs);
    user.regs.rflags |= ZF;
    let first = user.clone();
    let r = tcg.run(&first, umode, counting(&[])).unwrap();
    assert_eq!((r.stop, r.state.regs.rip, r.retired), (Stop::Handover, CODE + 7, 3), "{r:?}");
    let flushes = tcg.flushes();
    let done = |tcg: &mut Tcg, s: &CpuState| match tcg.complete(s).unwrap() {
        Completed::Retired(after) => {
            assert_eq!(after.regs.rflags, s.regs.rflags, "the guest's RFLAGS, TF as it was");
            after
        }
        other => panic!("{other:?}"),
    };
    assert_eq!(done(&mut tcg, &user).regs.rip, CODE + 2, "JNZ not taken");
    user.regs.rflags &= !ZF;
    assert_eq!(done(&mut tcg, &user).regs.rip, CODE + 7, "JNZ taken");
    user.regs.rip = CODE + 2;
    let called = done(&mut tcg, &user);
    assert_eq!((called.regs.rip, called.regs.rsp), (CODE + 8, user.regs.rsp - 8), "CALL");
    assert_eq!(done(&mut tcg, &called).regs.rip, CODE + 7, "RET");
    assert_eq!(tcg.flushes(), flushes, "no translation dropped");
    let r = tcg.run(&first, umode, counting(&[])).unwrap();
    assert_eq!((r.stop, r.state.regs.rip, r.retired, r.fault), (Stop::Handover, CODE + 7, 3, None), "{r:?}");
}

/// A branch completed alone is translated from the bytes there now, even where the state it left
/// cannot reach its page: IRETQ from a supervisor-only page to user mode, whose translation the
/// drop after the run cannot find (unicorn looks it up through the engine's state, now at CPL3),
/// then other code written there by the guest in KVM (behind TCG), completed again.
#[test]
fn a_branch_completes_from_the_bytes_there_now() {
    let (mem, regs, sregs, _) = machine(&[]);
    // The same 2 MiB again at 0x20_0000, supervisor-only (PD[1]: PS, RW, P).
    mem.write_obj(0x83u64, GuestAddress(0x3008)).unwrap();
    let kernel = CODE + 0x20_0000;
    mem.write_slice(&[0x48, 0xCF], GuestAddress(CODE)).unwrap(); // iretq
                                                                 // The frame: RIP (user code, NOPs at CODE + 0x100), CS, RFLAGS, RSP, SS.
    mem.write_slice(&[0x90; 4], GuestAddress(CODE + 0x100)).unwrap();
    for (k, v) in [CODE + 0x100, u64::from(USER_CS), 2, 0x9000, u64::from(USER_DS)].into_iter().enumerate() {
        mem.write_obj(v, GuestAddress(regs.rsp + 8 * k as u64)).unwrap();
    }
    let mut tcg = Tcg::new(&mem).unwrap();
    let state = CpuState::new(kvm_regs { rip: kernel, ..regs }, sregs);
    match tcg.complete(&state).unwrap() {
        Completed::Retired(after) => assert_eq!((after.regs.rip, after.sregs.cs.selector), (CODE + 0x100, USER_CS)),
        other => panic!("{other:?}"),
    }
    mem.write_slice(&[0xEB, 0x0E], GuestAddress(CODE)).unwrap(); // jmp +0x10
    match tcg.complete(&state).unwrap() {
        Completed::Retired(after) => assert_eq!((after.regs.rip, after.sregs.cs.selector), (kernel + 0x10, 8), "JMP"),
        other => panic!("{other:?}"),
    }
}

/// A completion retires its one instruction where TCG ends the instruction's translation right
/// after it (POPF) and a translation of the code after it, made by an earlier run, is there: it
/// used to run on through that translation (made without the completion's stop), unseen.
#[test]
fn a_completion_stops_after_its_instruction_where_a_translation_follows_it() {
    // popf; inc rax; inc rax; hlt
    let (mem, regs, sregs, mode) = machine(&[0x9D, 0x48, 0xFF, 0xC0, 0x48, 0xFF, 0xC0, 0xF4]);
    mem.write_obj(0x2u64, GuestAddress(regs.rsp)).unwrap();
    let mut tcg = Tcg::new(&mem).unwrap();
    let after_popf = CpuState::new(kvm_regs { rip: CODE + 1, ..regs }, sregs);
    let r = tcg.run(&after_popf, mode, counting(&[])).unwrap();
    assert_eq!((r.stop, r.state.regs.rip, r.state.regs.rax), (Stop::Handover, CODE + 7, 2), "{r:?}");
    match tcg.complete(&CpuState::new(regs, sregs)).unwrap() {
        Completed::Retired(after) => {
            assert_eq!((after.regs.rip, after.regs.rax, after.regs.rsp), (CODE + 1, 0, regs.rsp + 8), "POPF alone")
        }
        other => panic!("{other:?}"),
    }
}

/// A stop the engine drops (the instruction runs in the engine after all: here STI once nothing
/// counts) goes with the translation made with it: unicorn calls a lone code hook straight from
/// the translation, and the hook's data is freed with it. Runs through the same code after the
/// drop, many times, retire every instruction.
#[test]
fn a_dropped_stop_takes_its_translation_with_it() {
    // 1: nop; sti; nop; cli; dec rcx; jnz 1b; out dx, al
    let (mem, mut regs, sregs, mode) = machine(&[0x90, 0xFB, 0x90, 0xFA, 0x48, 0xFF, 0xC9, 0x75, 0xF7, 0xEE]);
    regs.rcx = 1;
    let mut tcg = Tcg::new(&mem).unwrap();
    let state = CpuState::new(regs, sregs);
    let r = tcg.run(&state, mode, counting(&[])).unwrap();
    assert_eq!((r.stop, r.state.regs.rip), (Stop::Handover, CODE + 1), "STI handed over while something counts");
    for _ in 0..100 {
        let mut s = state.clone();
        s.regs.rcx = 1000;
        let r = tcg.run(&s, mode, Counting { withhold_sti: false, ..counting(&[]) }).unwrap();
        assert_eq!((r.stop, r.state.regs.rip, r.retired), (Stop::Handover, CODE + 9, 6000));
        let r = tcg.run(&state, mode, counting(&[])).unwrap();
        assert_eq!((r.stop, r.state.regs.rip), (Stop::Handover, CODE + 1));
    }
}

/// The x87/SSE state goes into the engine only where it holds another: a run from the state
/// the engine loaded or read back last skips the trampolines that load it, and still sees it; a
/// state changed elsewhere (as KVM may change it) goes in.
#[test]
fn the_fpu_state_goes_in_only_where_the_engine_holds_another() {
    // movq rax, xmm0; paddq xmm0, xmm0; out dx, al
    let (mem, regs, mut sregs, mode) = machine(&[0x66, 0x48, 0x0F, 0x7E, 0xC0, 0x66, 0x0F, 0xD4, 0xC0, 0xEE]);
    sregs.cr4 |= 1 << 9 | 1 << 10 | 1 << 18; // OSFXSR, OSXMMEXCPT, OSXSAVE
    let mut tcg = Tcg::new(&mem).unwrap();
    let run = |tcg: &mut Tcg, xmm0: u128| {
        let mut state = CpuState::new(regs, sregs);
        state.fpu = Some(fpu(xmm0));
        // As after the guest ran in KVM: the whole state is loaded.
        tcg.ran_elsewhere();
        let r = tcg.run(&state, mode, counting(&[])).unwrap();
        assert_eq!((r.stop, r.retired, r.state.regs.rip), (Stop::Handover, 2, CODE + 9), "{r:?}");
        (r.state.regs.rax, u128::from_le_bytes(r.state.fpu.unwrap().xmm(0)))
    };
    let fpu_loads = |tcg: &Tcg| tcg.uc.get_data().fpu_loads;
    assert_eq!(run(&mut tcg, 0x21), (0x21, 0x42));
    assert_eq!(fpu_loads(&tcg), 1);
    // What the engine read back (XMM0 = 0x42), given again: not loaded, and seen.
    assert_eq!(run(&mut tcg, 0x42), (0x42, 0x84));
    assert_eq!(fpu_loads(&tcg), 1, "the engine held it");
    // Another XMM0 than the engine holds (0x84): loaded.
    assert_eq!(run(&mut tcg, 0x7), (0x7, 0xE));
    assert_eq!(fpu_loads(&tcg), 2);
    // XCR0 alone differs: loaded (XSETBV).
    let mut state = CpuState::new(regs, sregs);
    let mut f = fpu(0xE);
    f.xcr0 = 3;
    state.fpu = Some(f);
    tcg.ran_elsewhere();
    let r = tcg.run(&state, mode, counting(&[])).unwrap();
    assert_eq!((r.state.regs.rax, r.state.fpu.as_ref().unwrap().xcr0, fpu_loads(&tcg)), (0xE, 3, 3));
    assert_eq!(tcg.loads, 4, "every run here loaded the whole state");
}

/// A run walks the guest's page tables once per code page, until an INVLPG: a block entered
/// after the guest mapped its page elsewhere and ran INVLPG is checked and decoded from the new
/// page, not from the one an earlier walk of the same run found.
#[test]
fn a_run_walks_each_code_page_again_after_invlpg() {
    const Y: u64 = 0x4000_0000; // 1 GiB: PDPT[1] -> PD 0xA000 -> PT 0x9000 -> 4 KiB pages
    const PT: u64 = 0x9000;
    let (p1, p2) = (0x20000u64, 0x21000u64);
    let mov_rax = |v: u64| [&[0x48u8, 0xB8][..], &v.to_le_bytes()].concat();
    let call_rax = [0xFF, 0xD0];
    // CODE: call Y; call Y + 0x10; out dx, al
    let mut code = [mov_rax(Y), call_rax.to_vec(), mov_rax(Y + 0x10), call_rax.to_vec(), vec![0xEE]].concat();
    code.resize(0x40, 0x90);
    // CODE + 0x40: call Y; mov qword [PT], p2 | 7; invlpg [Y]; call Y + 0x10; out dx, al
    let remap =
        [&[0x48u8, 0xC7, 0x04, 0x25][..], &(PT as u32).to_le_bytes(), &((p2 | 7) as u32).to_le_bytes()].concat();
    let invlpg = [&[0x0Fu8, 0x01, 0x3C, 0x25][..], &(Y as u32).to_le_bytes()].concat();
    code.extend(
        [mov_rax(Y), call_rax.to_vec(), remap, invlpg, mov_rax(Y + 0x10), call_rax.to_vec(), vec![0xEE]].concat(),
    );
    let (mem, regs, sregs, mode) = machine(&code);
    mem.write_obj(0xA007u64, GuestAddress(0x2008)).unwrap();
    mem.write_obj(PT | 7, GuestAddress(0xA000)).unwrap();
    mem.write_obj(p1 | 7, GuestAddress(PT)).unwrap();
    // Y: ret. Y + 0x10: nop; nop; ret on the first page, xchg ax, ax; ret (as long) on the second.
    mem.write_slice(&[0xC3], GuestAddress(p1)).unwrap();
    mem.write_slice(&[0x90, 0x90, 0xC3], GuestAddress(p1 + 0x10)).unwrap();
    mem.write_slice(&[0xC3], GuestAddress(p2)).unwrap();
    mem.write_slice(&[0x66, 0x90, 0xC3], GuestAddress(p2 + 0x10)).unwrap();
    let mut tcg = Tcg::new(&mem).unwrap();
    let counters = [(armed(Semantics::Instructions), u64::MAX)];
    let r = tcg.run(&CpuState::new(regs, sregs), mode, counting(&counters)).unwrap();
    // 2 x (mov, call), ret, nop, nop, ret
    assert_eq!((r.stop, r.retired, r.counts[0], r.state.regs.rip), (Stop::Handover, 8, 8, CODE + 0x18), "{r:?}");
    let r = tcg.run(&CpuState::new(kvm_regs { rip: CODE + 0x40, ..regs }, sregs), mode, counting(&counters)).unwrap();
    // mov, call, ret, mov [PT], invlpg, mov, call, xchg, ret: the second page's code.
    assert_eq!((r.stop, r.retired, r.counts[0]), (Stop::Handover, 9, 9), "{r:?}");
}
