//! A bare single-stepper for `emon bench`: steps every guest instruction and does nothing else,
//! the floor the precise backend is measured against.
use super::{kvm_err, Backend, BackendError, Cx, Next};
use kvm_bindings::{kvm_guest_debug, KVM_GUESTDBG_ENABLE, KVM_GUESTDBG_SINGLESTEP};

#[derive(Default)]
pub struct BareStep {
    stepping: bool,
    pub steps: u64,
}

impl Backend for BareStep {
    fn name(&self) -> &'static str {
        "bare-step"
    }

    fn before_run(&mut self, cx: &mut Cx, _at_boundary: bool) -> Result<Next, BackendError> {
        if !self.stepping {
            let dbg = kvm_guest_debug { control: KVM_GUESTDBG_ENABLE | KVM_GUESTDBG_SINGLESTEP, ..Default::default() };
            cx.fd.set_guest_debug(&dbg).map_err(kvm_err("KVM_SET_GUEST_DEBUG"))?;
            self.stepping = true;
        }
        Ok(Next::Run)
    }

    fn on_debug_exit(&mut self, _cx: &mut Cx, _pc: u64) -> Result<(), BackendError> {
        self.steps += 1;
        Ok(())
    }

    fn summary(&self) -> String {
        format!("bare single-step: {} steps", self.steps)
    }
}
