//! RDTSC and RDTSCP in the engine, answered from the host's TSC through the run's [`TscWindow`]
//! (`Counting::tsc`): unicorn's instruction hooks for them replace TCG's answer (QEMU's own
//! clock). A run without a window hands them over ([`super::Withheld::tsc`]).
use super::{uc_err, Data, TcgError};
use crate::TscWindow;
use std::cell::Cell;
use std::ffi::{c_int, c_void};
use unicorn_engine::unicorn_const::{uc_error, HookType, X86Insn};
use unicorn_engine::{uc_engine, uc_hook, RegisterX86, Unicorn};

/// What the hooks answer from, shared with them by address (they run inside `emu_start`).
#[derive(Debug, Default)]
struct Shared {
    window: Cell<Option<TscWindow>>,
    /// The last value given in this run.
    last: Cell<u64>,
    reads: Cell<u64>,
    /// A hook ran in a run without a window (the run fails).
    unanswered: Cell<bool>,
}

/// The hooks, added once to an engine.
#[derive(Debug)]
pub struct TscHooks {
    shared: Box<Shared>,
}

/// What a run's RDTSC and RDTSCP gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Given {
    pub reads: u64,
    /// The highest value given (`None`: none).
    pub last: Option<u64>,
}

impl TscHooks {
    pub fn add(uc: &mut Unicorn<'static, Data>) -> Result<TscHooks, TcgError> {
        let shared = Box::new(Shared::default());
        let user_data = std::ptr::from_ref::<Shared>(&shared).cast_mut().cast::<c_void>();
        for (insn, callback) in [
            (X86Insn::RDTSC, on_rdtsc as extern "C" fn(*mut uc_engine, *mut c_void) -> c_int),
            (X86Insn::RDTSCP, on_rdtscp),
        ] {
            let mut hook: uc_hook = 0;
            // SAFETY: the callback matches unicorn's RDTSC/RDTSCP hook type (uc_cb_insn_cpuid_t);
            // `user_data` points into the box, which lives as long as the engine (the hooks go
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

    /// A run begins, with `window` (or none).
    pub fn begin(&self, window: Option<TscWindow>) {
        let s = &self.shared;
        s.window.set(window);
        s.last.set(0);
        s.reads.set(0);
        s.unanswered.set(false);
    }

    /// The run ended: what it gave, or an error where a hook ran without a window.
    pub fn end(&self) -> Result<Given, TcgError> {
        let s = &self.shared;
        s.window.set(None);
        if s.unanswered.get() {
            return Err(TcgError::Unsupported("RDTSC ran without the guest's TSC"));
        }
        Ok(Given { reads: s.reads.get(), last: (s.reads.get() > 0).then(|| s.last.get()) })
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
    let Some(w) = s.window.get() else {
        s.unanswered.set(true);
        // SAFETY: `uc` is the engine running this hook.
        unsafe { unicorn_engine::uc_emu_stop(uc) };
        return 0;
    };
    let value = w.now().max(s.last.get().wrapping_add(1));
    s.last.set(value);
    s.reads.set(s.reads.get() + 1);
    let aux = rdtscp.then_some((RegisterX86::RCX, u64::from(w.aux)));
    for (reg, v) in [(RegisterX86::RAX, value & 0xFFFF_FFFF), (RegisterX86::RDX, value >> 32)].into_iter().chain(aux) {
        // SAFETY: `uc` is the engine running this hook; the value outlives the call.
        unsafe { unicorn_engine::uc_reg_write(uc, reg as c_int, (&raw const v).cast()) };
    }
    1
}
