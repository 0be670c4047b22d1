//! The guest's clock while emon counts (README, "Guest time"): the model clock (core cycles of
//! every instruction counted since the VM started), the reference clock UnHalted Reference
//! Cycles ticks with, and the guest's time-stamp counter, which runs with the model clock (one
//! tick per modelled core cycle) plus real time while the vCPU is halted; and the TSC-deadline
//! timer on that time.
use crate::{BackendError, Cx};
use emon_pmu::profile::Clock;
use emon_x86::arch::IA32_TSC_DEADLINE;

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
    /// The model clock: core cycles of every instruction counted since the VM started (and of
    /// every instruction emon ran, where the guest's time follows the model throughout).
    pub cycles: u64,
    /// The guest's TSC follows the model while emon counts; off only for `emon bench`, which
    /// times the backend itself with the guest's RDTSC.
    pub virtual_time: bool,
    /// The stretch under way (counted, or the whole run's): the guest's TSC and the model clock
    /// when it began, and the real ticks the vCPU has spent halted since.
    stretch: Option<(u64, u64, u64)>,
    /// The stretch is the whole run (`--guest-time model` where emon runs all of the guest's
    /// code): it never ends.
    throughout: bool,
    /// The guest's (real) TSC when the vCPU halted, until it wakes.
    halted_at: Option<u64>,
    /// This host has shown that it cannot set the guest's TSC.
    unsettable: bool,
    /// In a stretch: the IA32_TSC_DEADLINE the guest armed, on the model's time, until it fires.
    deadline: Option<u64>,
    /// What KVM's IA32_TSC_DEADLINE holds in a stretch: 0 while the vCPU runs (emon fires the
    /// timer itself, `fire_deadline`), or, while it is halted, the guest's deadline moved onto
    /// KVM's guest TSC, so that KVM wakes it as the timer would.
    kvm_deadline: u64,
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
            throughout: false,
            halted_at: None,
            unsettable: false,
            deadline: None,
            kvm_deadline: 0,
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

    /// The guest's TSC as the model has it: where the stretch began, plus the model clock since,
    /// plus real time halted. `None` outside a stretch (counted, or the whole run's).
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

    /// Whether the guest's TSC follows the model now.
    pub fn in_stretch(&self) -> bool {
        self.stretch.is_some()
    }

    /// Whether the stretch is the whole run (see [`Self::begin_throughout`]).
    pub fn throughout(&self) -> bool {
        self.throughout
    }

    /// The guest's time follows the model from here to the end of the run: where emon runs all
    /// of the guest's code (README, "Guest time", `--guest-time model`).
    pub fn begin_throughout(&mut self, cx: &mut Cx) -> Result<(), BackendError> {
        if self.virtual_time && !self.throughout {
            self.begin_stretch(cx)?;
            self.throughout = self.stretch.is_some();
        }
        Ok(())
    }

    /// The whole-run stretch stops being one (emon no longer runs all of the guest's code): it
    /// ends where a counted stretch would.
    pub fn end_throughout(&mut self, cx: &mut Cx, counting: bool) -> Result<(), BackendError> {
        if std::mem::take(&mut self.throughout) && !counting {
            self.end_stretch(cx)?;
        }
        Ok(())
    }

    /// A counted stretch begins: the guest's TSC follows the model from here, and emon takes the
    /// deadline timer KVM held over (on the same time at this point).
    pub fn begin_stretch(&mut self, cx: &mut Cx) -> Result<(), BackendError> {
        if self.virtual_time && self.stretch.is_none() {
            self.stretch = Some((cx.vcpu.guest_tsc()?, self.cycles, 0));
            let armed = cx.vcpu.get_msr(IA32_TSC_DEADLINE)?;
            self.deadline = (armed != 0).then_some(armed);
            self.kvm_deadline = armed;
            self.set_kvm_deadline(cx, 0)?;
        }
        Ok(())
    }

    /// The vCPU halted (an emulated HLT): real time passes on the guest's TSC until it wakes, and
    /// KVM holds the deadline the guest armed, moved onto its own guest TSC, to wake it.
    pub fn halt(&mut self, cx: &mut Cx) -> Result<(), BackendError> {
        let now = cx.vcpu.guest_tsc()?;
        self.halted_at = Some(now);
        if let (Some(d), Some(v)) = (self.deadline, self.virtual_tsc()) {
            // One already due fires at once; 0 would disarm KVM's timer instead.
            let on_kvm = now.wrapping_add(d.saturating_sub(v)).max(1);
            self.set_kvm_deadline(cx, on_kvm)?;
        }
        Ok(())
    }

    /// The vCPU wakes from an emulated HLT: the time it slept passes on the guest's TSC. If KVM's
    /// timer woke it, the guest's deadline has fired; otherwise emon holds it again.
    pub fn wake(&mut self, cx: &mut Cx) -> Result<(), BackendError> {
        let Some(at) = self.halted_at.take() else { return Ok(()) };
        let slept = cx.vcpu.guest_tsc()?.saturating_sub(at);
        if let Some((_, _, halted)) = &mut self.stretch {
            *halted += slept;
        }
        if self.kvm_deadline != 0 {
            // KVM clears its IA32_TSC_DEADLINE when the timer fires (SDM Vol. 3A 11.5.4.1).
            if cx.vcpu.get_msr(IA32_TSC_DEADLINE)? == 0 {
                self.deadline = None;
                self.kvm_deadline = 0;
            } else {
                self.set_kvm_deadline(cx, 0)?;
            }
        }
        Ok(())
    }

    /// The counted stretch ends: the guest's TSC goes on from the model's value with real time,
    /// and KVM holds the deadline timer again. A host that cannot set it (kvm_pvm) leaves it at
    /// real time: emon waits for real time to reach the model's value if the model ran ahead (so
    /// it never goes backwards), and records the forward jump otherwise; a deadline the jump
    /// passed then fires at once.
    pub fn end_stretch(&mut self, cx: &mut Cx) -> Result<(), BackendError> {
        if !self.virtual_time || self.throughout {
            return Ok(());
        }
        self.wake(cx)?;
        let Some(target) = self.virtual_tsc() else { return Ok(()) };
        self.stretch = None;
        self.move_to(cx, target)?;
        if let Some(d) = self.deadline.take() {
            cx.vcpu.set_msr(IA32_TSC_DEADLINE, d)?;
        }
        self.kvm_deadline = 0;
        Ok(())
    }

    /// Moves the guest's TSC (KVM's) to `target` where the host can, or records how far real
    /// time is from it.
    fn move_to(&mut self, cx: &mut Cx, target: u64) -> Result<(), BackendError> {
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

    /// The guest's WRMSR of IA32_TSC_DEADLINE in a stretch: the timer fires when the model's
    /// time reaches `deadline` (at once if it has), and 0 disarms it. Outside TSC-deadline mode
    /// the write is ignored, and no deadline is armed (SDM Vol. 3A 11.5.4.1: a change of timer
    /// mode disarms it).
    pub fn write_deadline(&mut self, cx: &mut Cx, deadline: u64) -> Result<(), BackendError> {
        let armed = deadline != 0 && tsc_deadline_mode(cx)?;
        self.deadline = armed.then_some(deadline);
        self.set_kvm_deadline(cx, 0)?;
        self.fire_deadline(cx)
    }

    /// The guest's RDMSR of IA32_TSC_DEADLINE in a stretch: the value written, until the timer
    /// fires, then 0; 0 outside TSC-deadline mode.
    pub fn read_deadline(&mut self, cx: &mut Cx) -> Result<u64, BackendError> {
        if self.deadline.is_some() && !tsc_deadline_mode(cx)? {
            self.deadline = None;
        }
        Ok(self.deadline.unwrap_or(0))
    }

    /// The deadline the guest armed in a stretch, if one is.
    #[cfg(test)]
    pub fn armed_deadline(&self) -> Option<u64> {
        self.deadline
    }

    /// Fires the guest's deadline timer if the model's time has reached it: KVM's timer, set to a
    /// deadline long past, raises the interrupt its LVT timer register names at the next entry,
    /// as the local APIC would. Called at every instruction boundary emon sees.
    pub fn fire_deadline(&mut self, cx: &mut Cx) -> Result<(), BackendError> {
        if let (Some(d), Some(v)) = (self.deadline, self.virtual_tsc()) {
            if v >= d && self.halted_at.is_none() {
                self.deadline = None;
                if tsc_deadline_mode(cx)? {
                    // Long past: KVM fires it at once, and its MSR reads 0 again.
                    cx.vcpu.set_msr(IA32_TSC_DEADLINE, 1)?;
                    self.kvm_deadline = 0;
                }
            }
        }
        Ok(())
    }

    /// Model cycles until the guest's deadline timer is due, while one is armed in a stretch: how
    /// far an engine run may go before it (each instruction takes at least a cycle).
    pub fn cycles_to_deadline(&self) -> Option<u64> {
        Some(self.deadline?.saturating_sub(self.virtual_tsc()?))
    }

    /// Sets KVM's IA32_TSC_DEADLINE as the VMM, where it is not already `value`.
    fn set_kvm_deadline(&mut self, cx: &mut Cx, value: u64) -> Result<(), BackendError> {
        if value != self.kvm_deadline {
            cx.vcpu.set_msr(IA32_TSC_DEADLINE, value)?;
            self.kvm_deadline = value;
        }
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

/// Whether the local APIC's timer is in TSC-deadline mode (LVT Timer bits 18:17 = 10b, SDM Vol. 3A
/// 11.5.1), where IA32_TSC_DEADLINE arms it.
fn tsc_deadline_mode(cx: &mut Cx) -> Result<bool, BackendError> {
    use crate::lapic::{reg, LVT_TIMER, LVT_TIMER_MODE, LVT_TIMER_TSC_DEADLINE};
    Ok(reg(&cx.vcpu.lapic()?, LVT_TIMER) & LVT_TIMER_MODE == LVT_TIMER_TSC_DEADLINE)
}
