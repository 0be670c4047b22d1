//! The guest's clock while emon counts (README, "Guest time"): the model clock (core cycles of
//! every instruction counted since the VM started), the reference clock UnHalted Reference
//! Cycles ticks with, and the guest's time-stamp counter, which runs with the model clock (one
//! tick per modelled core cycle) plus real time while the vCPU is halted.
use crate::{BackendError, Cx};
use emon_pmu::profile::Clock;

/// How long emon waits, at the end of a counted stretch, for real time to catch up with a guest
/// TSC the model ran ahead (README, "Guest time").
pub const TSC_CATCH_UP_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Where RDTSC and RDTSCP read the guest's TSC in the TCG engine (README, "Guest time").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TscSource {
    /// Real time: the host's TSC, through the window on the guest's.
    Host(crate::TscWindow),
    /// A counted stretch's time: `base` plus the model clock at the instruction (the core cycles
    /// of every instruction before it), as emon answers a read at a step boundary
    /// ([`GuestClock::virtual_tsc`]); `aux` is IA32_TSC_AUX, RDTSCP's ECX.
    Model { base: u64, aux: u32 },
}

/// See the module documentation.
#[derive(Debug, Clone)]
pub struct GuestClock {
    /// The reference clock of UnHalted Reference Cycles (the profile's `[clock]`).
    pub reference: Clock,
    /// The model clock: core cycles of every instruction counted since the VM started.
    pub cycles: u64,
    /// The guest's TSC follows the model while emon counts; off only for `emon bench`, which
    /// times the backend itself with the guest's RDTSC.
    pub virtual_time: bool,
    /// The counted stretch under way: the guest's TSC and the model clock when it began, and
    /// the real ticks the vCPU has spent halted since.
    stretch: Option<(u64, u64, u64)>,
    /// The guest's (real) TSC when the vCPU halted, until it wakes.
    halted_at: Option<u64>,
    /// This host has shown that it cannot set the guest's TSC.
    unsettable: bool,
    /// The last IA32_TSC_DEADLINE emon translated: as the guest wrote it, and as KVM holds it.
    pub deadline: Option<(u64, u64)>,
    /// On a host that cannot: the stretches after which the guest's TSC jumped forward to real
    /// time, the ticks it jumped in all, and the ticks real time never caught up (backwards).
    pub jumps: u64,
    pub forward: u64,
    pub backward: u64,
}

impl Default for GuestClock {
    fn default() -> Self {
        GuestClock {
            reference: Clock::TSC,
            cycles: 0,
            virtual_time: true,
            stretch: None,
            halted_at: None,
            unsettable: false,
            deadline: None,
            jumps: 0,
            forward: 0,
            backward: 0,
        }
    }
}

impl GuestClock {
    /// Advances the model clock by `cycles` core cycles; the reference clock's ticks meanwhile.
    pub fn advance(&mut self, cycles: u64) -> u64 {
        let ticks = self.reference.ref_ticks_between(self.cycles, cycles);
        self.cycles += cycles;
        ticks
    }

    /// The guest's TSC as the model has it: where the counted stretch began, plus the model
    /// clock since, plus real time halted. `None` outside a counted stretch.
    pub fn virtual_tsc(&self) -> Option<u64> {
        self.stretch.map(|(tsc, cycles, halted)| tsc.wrapping_add(self.cycles - cycles).wrapping_add(halted))
    }

    /// What the model's TSC adds the model clock to: `virtual_tsc` is this plus `cycles`.
    pub fn model_base(&self) -> Option<u64> {
        self.virtual_tsc().map(|t| t.wrapping_sub(self.cycles))
    }

    /// The guest's TSC now: the model's in a counted stretch, KVM's otherwise.
    pub fn guest_tsc(&self, cx: &mut Cx) -> Result<u64, BackendError> {
        match self.virtual_tsc() {
            Some(t) => Ok(t),
            None => Ok(cx.vcpu.guest_tsc()?),
        }
    }

    /// A counted stretch begins: the guest's TSC follows the model from here.
    pub fn begin_stretch(&mut self, cx: &mut Cx) -> Result<(), BackendError> {
        if self.virtual_time {
            self.stretch = Some((cx.vcpu.guest_tsc()?, self.cycles, 0));
        }
        Ok(())
    }

    /// The vCPU halted (an emulated HLT): real time passes on the guest's TSC until it wakes.
    pub fn halt(&mut self, cx: &mut Cx) -> Result<(), BackendError> {
        self.halted_at = Some(cx.vcpu.guest_tsc()?);
        Ok(())
    }

    /// The vCPU wakes from an emulated HLT: the time it slept passes on the guest's TSC.
    pub fn wake(&mut self, cx: &mut Cx) -> Result<(), BackendError> {
        if let Some(at) = self.halted_at.take() {
            let slept = cx.vcpu.guest_tsc()?.saturating_sub(at);
            if let Some((_, _, halted)) = &mut self.stretch {
                *halted += slept;
            }
        }
        Ok(())
    }

    /// The counted stretch ends: the guest's TSC goes on from the model's value with real time.
    /// A host that cannot set it (kvm_pvm) leaves it at real time: emon waits for real time to
    /// reach the model's value if the model ran ahead (so it never goes backwards), and records
    /// the forward jump otherwise.
    pub fn end_stretch(&mut self, cx: &mut Cx) -> Result<(), BackendError> {
        if !self.virtual_time {
            return Ok(());
        }
        self.wake(cx)?;
        let Some(target) = self.virtual_tsc() else { return Ok(()) };
        self.stretch = None;
        if !self.unsettable {
            if cx.vcpu.set_guest_tsc(target)? {
                return Ok(());
            }
            self.unsettable = true;
        }
        let mut now = cx.vcpu.guest_tsc()?;
        if now < target {
            now = cx.vcpu.wait_for_guest_tsc(target, TSC_CATCH_UP_LIMIT)?;
        }
        if now < target {
            self.backward += target - now;
        } else {
            self.forward += now - target;
        }
        self.jumps += 1;
        Ok(())
    }

    /// What the run summary says about guest time.
    pub fn notes(&self) -> Vec<String> {
        let mut notes = Vec::new();
        if self.jumps > 0 {
            notes.push(format!(
                "guest time: this host cannot set the guest's TSC, so after each of {} counted stretches it went on from real time, {} ticks ahead of the model's TSC in all (README, \"Guest time\")",
                self.jumps, self.forward
            ));
        }
        if self.backward > 0 {
            notes.push(format!(
                "NOT EXACT: guest time went backwards by {} ticks when counting stopped: real time did not catch up with the model's TSC within {} s (README, \"Guest time\")",
                self.backward,
                TSC_CATCH_UP_LIMIT.as_secs()
            ));
        }
        notes
    }
}
