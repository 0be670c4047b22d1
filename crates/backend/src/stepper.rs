//! A bare single-stepper for `emon bench`: steps every guest instruction and does nothing else,
//! the floor the precise backend is measured against.
use super::{Backend, BackendError, Cx, Next};

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
            cx.vcpu.set_single_step(true)?;
            self.stepping = true;
        }
        Ok(Next::Run)
    }

    fn on_debug_exit(&mut self, _cx: &mut Cx, _pc: u64) -> Result<(), BackendError> {
        self.steps += 1;
        Ok(())
    }

    fn reprogrammed(&self) -> u64 {
        0
    }

    fn summary(&self) -> String {
        format!("bare single-step: {} steps", self.steps)
    }
}
