//! RDTSC and RDTSCP in the engine: unicorn's instruction hooks for them replace TCG's answer
//! (QEMU's own clock) with the run's [`Source`] (`Counting::tsc`): real time from the host's TSC
//! through a window on the guest's, or in a counted stretch the model's time, the model clock at
//! the instruction (README, "Guest time"). A run without a source hands them over
//! ([`super::Withheld::tsc`]).
use super::{uc_err, Data, TcgError};
use std::cell::{Cell, RefCell};
use std::ffi::{c_int, c_void};
use std::rc::Rc;
use unicorn_engine::unicorn_const::{uc_error, HookType, X86Insn};
use unicorn_engine::{uc_engine, uc_hook, RegisterX86, Unicorn};

pub use crate::precise::clock::TscSource as Source;

/// What the hooks answer from, shared with them by address (they run inside `emu_start`) and
/// with the block hook ([`ModelReads`]).
#[derive(Debug, Default)]
struct Shared {
    source: Cell<Option<Source>>,
    /// Model time: the model clock at each read of the block entered last, by address (the block
    /// hook sets it before the block runs).
    model_at: RefCell<Vec<(u64, u64)>>,
    /// The last value given in this run, from the host's TSC.
    last: Cell<u64>,
    reads: Cell<u64>,
    model_reads: Cell<u64>,
    /// A hook ran in a run without a source, or at a read the block hook did not time (the run
    /// fails).
    unanswered: Cell<bool>,
}

/// The hooks, added once to an engine.
#[derive(Debug)]
pub struct TscHooks {
    shared: Rc<Shared>,
}

/// The block hook's side of the hooks: where a run reads model time, the model clock at each
/// read of the block about to run.
#[derive(Debug, Clone, Default)]
pub struct ModelReads(Rc<Shared>);

impl ModelReads {
    /// The block about to run reads the TSC at each address of `at`, that many model cycles
    /// after its start, where the model clock is `start`.
    pub fn block(&self, start: u64, at: &[(u64, u64)]) {
        let mut m = self.0.model_at.borrow_mut();
        m.clear();
        m.extend(at.iter().map(|&(rip, before)| (rip, start + before)));
    }
}

/// What a run's RDTSC and RDTSCP gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Given {
    /// Reads of real time.
    pub reads: u64,
    /// The highest value of real time given (`None`: none).
    pub last: Option<u64>,
    /// Reads of the model's time.
    pub model_reads: u64,
}

impl TscHooks {
    pub fn add(uc: &mut Unicorn<'static, Data>) -> Result<TscHooks, TcgError> {
        let shared = Rc::new(Shared::default());
        let user_data = Rc::as_ptr(&shared).cast_mut().cast::<c_void>();
        for (insn, callback) in [
            (X86Insn::RDTSC, on_rdtsc as extern "C" fn(*mut uc_engine, *mut c_void) -> c_int),
            (X86Insn::RDTSCP, on_rdtscp),
        ] {
            let mut hook: uc_hook = 0;
            // SAFETY: the callback matches unicorn's RDTSC/RDTSCP hook type (uc_cb_insn_cpuid_t);
            // `user_data` points into the Rc, which lives as long as the engine (the hooks go
            // with `uc`, dropped first: `Tcg` declares it before its hooks).
            let e = unsafe {
                unicorn_engine::uc_hook_add(
                    uc.get_handle(),
                    &mut hook,
                    HookType::INSN.0 as c_int,
                    callback as *mut c_void,
                    user_data,
                    1,
                    0,
                    insn as c_int,
                )
            };
            if e != uc_error::OK {
                return Err(uc_err("adding the RDTSC hooks")(e));
            }
        }
        Ok(TscHooks { shared })
    }

    /// The block hook's side of the hooks.
    pub fn model_reads(&self) -> ModelReads {
        ModelReads(self.shared.clone())
    }

    /// A run begins, reading `source` (or handing the reads over).
    pub fn begin(&self, source: Option<Source>) {
        let s = &self.shared;
        s.source.set(source);
        s.model_at.borrow_mut().clear();
        s.last.set(0);
        s.reads.set(0);
        s.model_reads.set(0);
        s.unanswered.set(false);
    }

    /// The run ended: what it gave, or an error where a hook ran without a window.
    pub fn end(&self) -> Result<Given, TcgError> {
        let s = &self.shared;
        s.source.set(None);
        if s.unanswered.get() {
            return Err(TcgError::Unsupported("RDTSC ran without the guest's TSC"));
        }
        let reads = s.reads.get();
        Ok(Given { reads, last: (reads > 0).then(|| s.last.get()), model_reads: s.model_reads.get() })
    }
}

extern "C" fn on_rdtsc(uc: *mut uc_engine, data: *mut c_void) -> c_int {
    answer(uc, data, false)
}

extern "C" fn on_rdtscp(uc: *mut uc_engine, data: *mut c_void) -> c_int {
    answer(uc, data, true)
}

/// EDX:EAX the guest's TSC, the upper halves of RAX and RDX cleared, and for RDTSCP ECX
/// IA32_TSC_AUX (SDM Vol. 2B, RDTSC and RDTSCP); 1: TCG does not answer it too.
fn answer(uc: *mut uc_engine, data: *mut c_void, rdtscp: bool) -> c_int {
    // SAFETY: `data` is the `Shared` the hooks were added with (`TscHooks::add`), alive and only
    // read through `Cell`s while the engine runs.
    let s = unsafe { &*data.cast::<Shared>() };
    let timed = |rip: u64| s.model_at.borrow().iter().find(|(at, _)| *at == rip).map(|&(_, cycles)| cycles);
    let answered = match s.source.get() {
        Some(Source::Host(w)) => {
            let value = w.now().max(s.last.get().wrapping_add(1));
            s.last.set(value);
            s.reads.set(s.reads.get() + 1);
            Some((value, w.aux))
        }
        Some(Source::Model { base, aux }) => {
            let mut rip = 0u64;
            // SAFETY: `uc` is the engine running this hook; `rip` outlives the call. TCG syncs
            // RIP before the helper that calls the hook (it may raise #GP).
            unsafe { unicorn_engine::uc_reg_read(uc, RegisterX86::RIP as c_int, (&raw mut rip).cast()) };
            timed(rip).map(|cycles| {
                s.model_reads.set(s.model_reads.get() + 1);
                (base.wrapping_add(cycles), aux)
            })
        }
        None => None,
    };
    let Some((value, aux)) = answered else {
        s.unanswered.set(true);
        // SAFETY: `uc` is the engine running this hook.
        unsafe { unicorn_engine::uc_emu_stop(uc) };
        return 0;
    };
    let aux = rdtscp.then_some((RegisterX86::RCX, u64::from(aux)));
    for (reg, v) in [(RegisterX86::RAX, value & 0xFFFF_FFFF), (RegisterX86::RDX, value >> 32)].into_iter().chain(aux) {
        // SAFETY: `uc` is the engine running this hook; the value outlives the call.
        unsafe { unicorn_engine::uc_reg_write(uc, reg as c_int, (&raw const v).cast()) };
    }
    1
}
