//! GDT, TSS and IDT: every vector has a stub that saves the interrupted state (including the SSE
//! registers, since Rust code uses them) and calls a Rust handler with `&mut Regs`. Exceptions and
//! NMI run on IST stacks (a fault on a bad stack still gets reported).
use core::arch::global_asm;
use core::sync::atomic::{AtomicUsize, Ordering};

pub const KERNEL_CS: u16 = 0x08;
pub const KERNEL_DS: u16 = 0x10;
pub const USER_DS: u16 = 0x18 | 3;
pub const USER_CS: u16 = 0x20 | 3;
const TSS_SEL: u16 = 0x28;

/// The state saved by the interrupt stubs, lowest address first.
#[repr(C)]
#[derive(Debug)]
pub struct Regs {
    pub r15: u64,
    pub r14: u64,
    pub r13: u64,
    pub r12: u64,
    pub r11: u64,
    pub r10: u64,
    pub r9: u64,
    pub r8: u64,
    pub rbp: u64,
    pub rdi: u64,
    pub rsi: u64,
    pub rdx: u64,
    pub rcx: u64,
    pub rbx: u64,
    pub rax: u64,
    pub vector: u64,
    pub error_code: u64,
    pub rip: u64,
    pub cs: u64,
    pub rflags: u64,
    pub rsp: u64,
    pub ss: u64,
}

pub type Handler = fn(&mut Regs);

const STACK_SIZE: usize = 16 * 1024;
#[repr(C, align(16))]
struct Stack([u8; STACK_SIZE]);
static mut IST_EXCEPTION: Stack = Stack([0; STACK_SIZE]);
static mut IST_NMI: Stack = Stack([0; STACK_SIZE]);
static mut KERNEL_STACK: Stack = Stack([0; STACK_SIZE]);

#[repr(C, packed)]
struct Tss {
    _reserved0: u32,
    rsp: [u64; 3],
    _reserved1: u64,
    ist: [u64; 7],
    _reserved2: u64,
    _reserved3: u16,
    iomap_base: u16,
}
static mut TSS: Tss =
    Tss { _reserved0: 0, rsp: [0; 3], _reserved1: 0, ist: [0; 7], _reserved2: 0, _reserved3: 0, iomap_base: 104 };

static mut GDT: [u64; 7] = [
    0,
    0x00AF_9A00_0000_FFFF, // 0x08 kernel code, 64-bit
    0x00CF_9200_0000_FFFF, // 0x10 kernel data
    0x00CF_F200_0000_FFFF, // 0x18 user data (DPL 3)
    0x00AF_FA00_0000_FFFF, // 0x20 user code, 64-bit (DPL 3)
    0,                     // 0x28 TSS, low half
    0,                     // TSS, high half
];

#[repr(C)]
#[derive(Clone, Copy)]
struct Gate([u64; 2]);
static mut IDT: [Gate; 256] = [Gate([0; 2]); 256];

static HANDLERS: [AtomicUsize; 256] = [const { AtomicUsize::new(0) }; 256];

#[repr(C, packed)]
struct Pointer {
    limit: u16,
    base: u64,
}

// One 16-byte stub per vector: push a zero error code where the CPU pushes none, push the
// vector, then the common path.
global_asm!(
    r#"
    .section .text
    .align 16
    .global emon_isr_table
emon_isr_table:
    .set vec, 0
    .rept 256
    .align 16
    .if (vec == 8) || (vec == 10) || (vec == 11) || (vec == 12) || (vec == 13) || (vec == 14) || (vec == 17) || (vec == 21) || (vec == 29) || (vec == 30)
    .else
    pushq $0
    .endif
    pushq $vec
    jmp emon_isr_common
    .set vec, vec + 1
    .endr

emon_isr_common:
    pushq %rax
    pushq %rbx
    pushq %rcx
    pushq %rdx
    pushq %rsi
    pushq %rdi
    pushq %rbp
    pushq %r8
    pushq %r9
    pushq %r10
    pushq %r11
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, %rdi
    subq $512, %rsp
    fxsave64 (%rsp)
    call emon_isr_dispatch
    fxrstor64 (%rsp)
    addq $512, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %r11
    popq %r10
    popq %r9
    popq %r8
    popq %rbp
    popq %rdi
    popq %rsi
    popq %rdx
    popq %rcx
    popq %rbx
    popq %rax
    addq $16, %rsp
    iretq
"#,
    options(att_syntax)
);

extern "C" {
    static emon_isr_table: [u8; 256 * 16];
}

fn stack_top(s: *const Stack) -> u64 {
    s as u64 + STACK_SIZE as u64
}

/// Loads the runtime's GDT, TSS and IDT. Called once by the entry code.
pub fn init() {
    // SAFETY: single CPU, called once before anything else uses these tables.
    unsafe {
        let tss = &raw mut TSS;
        (*tss).rsp[0] = stack_top(&raw const KERNEL_STACK);
        (*tss).ist[0] = stack_top(&raw const IST_EXCEPTION);
        (*tss).ist[1] = stack_top(&raw const IST_NMI);
        let base = tss as u64;
        let limit = (core::mem::size_of::<Tss>() - 1) as u64;
        let gdt = &raw mut GDT;
        (*gdt)[5] = limit | ((base & 0xFF_FFFF) << 16) | (0x89 << 40) | (((base >> 24) & 0xFF) << 56);
        (*gdt)[6] = base >> 32;
        let gdtr = Pointer { limit: (core::mem::size_of::<[u64; 7]>() - 1) as u16, base: gdt as u64 };
        core::arch::asm!(
            "lgdt [{gdtr}]",
            "mov ds, {ds:x}", "mov es, {ds:x}", "mov ss, {ds:x}", "mov fs, {ds:x}", "mov gs, {ds:x}",
            "push {cs}",
            "lea {tmp}, [rip + 2f]",
            "push {tmp}",
            "retfq",
            "2:",
            "ltr {tss:x}",
            gdtr = in(reg) &gdtr,
            ds = in(reg) KERNEL_DS as u64,
            cs = in(reg) KERNEL_CS as u64,
            tss = in(reg) TSS_SEL as u64,
            tmp = out(reg) _,
        );
        for v in 0..=255u8 {
            set_default_gate(v);
        }
        let idt = &raw mut IDT;
        let idtr = Pointer { limit: (core::mem::size_of::<[Gate; 256]>() - 1) as u16, base: idt as u64 };
        core::arch::asm!("lidt [{}]", in(reg) &idtr);
    }
}

fn gate(addr: u64, ist: u64, dpl: u64) -> Gate {
    let lo = (addr & 0xFFFF)
        | ((KERNEL_CS as u64) << 16)
        | (ist << 32)
        | ((0x8E | (dpl << 5)) << 40)
        | (((addr >> 16) & 0xFFFF) << 48);
    Gate([lo, addr >> 32])
}

/// Points vector `v` straight at `handler` (no stub, no saved state: the handler must preserve
/// every register and end with IRETQ). For tests that need to know every instruction a handler
/// retires.
pub fn set_raw_gate(v: u8, handler: u64) {
    // SAFETY: single CPU; the gate is rewritten whole.
    unsafe { (*(&raw mut IDT))[v as usize] = gate(handler, 0, 0) }
}

/// Points vector `v` back at the runtime's own stub, as [`init`] set it.
pub fn set_default_gate(v: u8) {
    let table = (&raw const emon_isr_table) as u64;
    let ist = match v {
        2 => 2,      // NMI
        0..=31 => 1, // exceptions
        _ => 0,      // external interrupts: current stack
    };
    // SAFETY: single CPU; the gate is rewritten whole.
    unsafe { (*(&raw mut IDT))[v as usize] = gate(table + 16 * v as u64, ist, 0) }
}

/// The address vector `v`'s gate points at.
pub fn gate_address(v: u8) -> u64 {
    // SAFETY: single CPU; a plain read of the gate.
    let Gate([lo, hi]) = unsafe { (*(&raw const IDT))[v as usize] };
    (lo & 0xFFFF) | ((lo >> 48) << 16) | (hi << 32)
}

/// Makes vector `v` callable with `int v` from CPL 3.
pub fn allow_user(v: u8) {
    let table = (&raw const emon_isr_table) as u64;
    // SAFETY: single CPU; the gate is rewritten whole.
    unsafe { (*(&raw mut IDT))[v as usize] = gate(table + 16 * v as u64, 0, 3) }
}

/// Installs `h` for vector `v` (replacing the default, which reports an unexpected interrupt).
pub fn set_handler(v: u8, h: Handler) {
    HANDLERS[v as usize].store(h as usize, Ordering::SeqCst);
}

pub fn clear_handler(v: u8) {
    HANDLERS[v as usize].store(0, Ordering::SeqCst);
}

pub const SPURIOUS_VECTOR: u8 = 0xFF;

pub fn exception_name(v: u64) -> &'static str {
    const NAMES: [&str; 22] = [
        "#DE", "#DB", "NMI", "#BP", "#OF", "#BR", "#UD", "#NM", "#DF", "#CSO", "#TS", "#NP", "#SS", "#GP", "#PF",
        "#15", "#MF", "#AC", "#MC", "#XM", "#VE", "#CP",
    ];
    NAMES.get(v as usize).copied().unwrap_or("interrupt")
}

#[no_mangle]
extern "C" fn emon_isr_dispatch(regs: &mut Regs) {
    let v = regs.vector as usize;
    let h = HANDLERS[v & 0xFF].load(Ordering::SeqCst);
    // An active catch takes the exceptions, but NMIs and the #DBs a handler was set for (a
    // single-step trap is not a fault to unwind: the code goes on after it).
    if v < 32 && v != 2 && !(v == 1 && h != 0) && crate::catch::recover(regs) {
        return;
    }
    if h != 0 {
        // SAFETY: only `set_handler` stores non-zero values, and it stores `Handler`s.
        let h: Handler = unsafe { core::mem::transmute::<usize, Handler>(h) };
        h(regs);
        return;
    }
    if v == SPURIOUS_VECTOR as usize {
        return;
    }
    crate::println!(
        "FAIL: unexpected {} (vector {}) error {:#x} at rip {:#x}",
        exception_name(regs.vector),
        regs.vector,
        regs.error_code,
        regs.rip
    );
    crate::report::note_failure();
    crate::summary_and_exit();
}
