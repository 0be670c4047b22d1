//! The guest's time-stamp counter read from the host's, for the TCG engine's RDTSC and RDTSCP:
//! where KVM runs the guest's TSC at the host's rate (no TSC scaling), it is the host's plus an
//! offset (SDM Vol. 3C 25.3, "TSC offsetting"), which emon bounds by reading IA32_TSC through
//! KVM_GET_MSRS between two reads of the host's TSC. The engine then answers from the lower bound
//! without leaving the run, and the guest's TSC stays monotonic across KVM and the engine by
//! construction ([`HostTsc::window`], [`HostTsc::before_entry`]).
use crate::{host_tsc, TscWindow};
use emon_x86::arch::IA32_TSC;
use kvm_bindings::{kvm_msr_entry, Msrs};
use kvm_ioctls::VcpuFd;

/// Reads of IA32_TSC a calibration brackets with the host's TSC; their bounds intersect.
const BRACKETS: usize = 16;
/// Host TSC ticks between the two calibrations whose bounds must agree (the guest's TSC runs at
/// the host's rate): about a millisecond at any TSC frequency here.
const RATE_CHECK: u64 = 2_000_000;
/// Host TSC ticks after which the bounds are checked again with one bracketed read.
const RECHECK: u64 = 20_000_000;
/// Widest offset bounds kept, in host TSC ticks (a bracket is one KVM_GET_MSRS, a few
/// microseconds here): wider, and the engine's values would run that far ahead of KVM's.
const MAX_WIDTH: u64 = 200_000;

/// The offset (guest TSC − host TSC) as bounds, and what the guest may have seen.
#[derive(Debug, Default)]
pub struct HostTsc {
    /// Every offset the reads allow: `lo ≤ offset ≤ hi` (host ticks, wrapping).
    bounds: Option<(u64, u64)>,
    /// The host's TSC at the last check of the bounds.
    checked: u64,
    /// KVM ran the guest without stepping it since the check (it may have written its TSC).
    ran_free: bool,
    /// The host's TSC when KVM last stopped running the guest: KVM's reads came before it.
    exited: u64,
    /// The highest value the guest was given outside KVM.
    given: u64,
    /// Why the engine cannot read the guest's TSC here, once found.
    pub unusable: Option<&'static str>,
    /// Calibrations made.
    pub calibrations: u64,
}

impl HostTsc {
    /// What the engine answers RDTSC from now: `None` where the guest's TSC does not run at the
    /// host's rate (or the host's TSC cannot bound it). A value from the window is at or above
    /// every value KVM may have given before this exit, and `before_entry` keeps KVM's later
    /// values at or above it.
    pub fn window(&mut self, fd: &VcpuFd) -> Option<TscWindow> {
        if self.unusable.is_some() {
            return None;
        }
        let now = host_tsc();
        let (lo, hi) = match self.bounds {
            Some(b) if !self.ran_free && now.wrapping_sub(self.checked) < RECHECK => b,
            Some(b) if self.agrees(fd, b) => {
                (self.checked, self.ran_free) = (now, false);
                b
            }
            _ => self.calibrate(fd)?,
        };
        let floor = self.exited.wrapping_add(hi).wrapping_add(1).max(self.given.wrapping_add(1));
        Some(TscWindow { offset: lo, floor, aux: 0 })
    }

    /// How the engine reads the guest's TSC here (`--verbose`).
    pub fn describe(&self) -> String {
        match (self.unusable, self.bounds) {
            (Some(why), _) => format!("handed over: {why}"),
            (None, Some((lo, hi))) => format!(
                "from the host's TSC, the offset bounded to {} ticks ({} calibrations)",
                hi.wrapping_sub(lo),
                self.calibrations
            ),
            (None, None) => format!("from the host's TSC ({} calibrations, none held now)", self.calibrations),
        }
    }

    /// KVM's read `kvm` of the guest's TSC, as the guest may see it next: past every value the
    /// engine gave, which may run ahead of KVM's by up to the bounds' width.
    pub fn after_given(&self, kvm: u64) -> u64 {
        match self.given {
            0 => kvm,
            given => kvm.max(given.wrapping_add(1)),
        }
    }

    /// The guest was given values up to `value` outside KVM.
    pub fn given(&mut self, value: u64) {
        self.given = self.given.max(value);
    }

    /// The guest's TSC was written (IA32_TSC or IA32_TSC_ADJUST, by the guest or the VMM): it may
    /// go back, and the offset is found again.
    pub fn written(&mut self) {
        (self.bounds, self.given) = (None, 0);
    }

    /// Before KVM_RUN: KVM's next read of the guest's TSC is at least the host's now plus the
    /// least offset; wait (at most the bounds' width, a few microseconds) until that is past
    /// every value the engine gave.
    pub fn before_entry(&self) {
        if let Some((lo, hi)) = self.bounds {
            // Every value given is at most the bounds' width ahead of the guest's TSC when it was
            // given: the wait ends within that (four times it, to be sure it ends).
            let start = host_tsc();
            let most = hi.wrapping_sub(lo).saturating_mul(4);
            while host_tsc().wrapping_add(lo) < self.given && host_tsc().wrapping_sub(start) < most {
                std::hint::spin_loop();
            }
        }
    }

    /// After KVM_RUN returned; `stepped`: KVM ran one instruction under emon's single-step.
    pub fn after_exit(&mut self, stepped: bool) {
        self.exited = host_tsc();
        self.ran_free |= !stepped;
    }

    /// Bounds the offset from BRACKETS reads, twice RATE_CHECK apart: `None` (and the reason
    /// kept) where they disagree, so the guest's TSC does not run at the host's rate.
    fn calibrate(&mut self, fd: &VcpuFd) -> Option<(u64, u64)> {
        self.calibrations += 1;
        let first = bounds(fd)?;
        let start = host_tsc();
        while host_tsc().wrapping_sub(start) < RATE_CHECK {
            std::hint::spin_loop();
        }
        let second = bounds(fd)?;
        let (lo, hi) = (signed(first.0).max(signed(second.0)), signed(first.1).min(signed(second.1)));
        if lo > hi {
            self.unusable = Some("the guest's TSC does not run at the host's rate (TSC scaling)");
            return None;
        }
        if (hi - lo) as u64 > MAX_WIDTH {
            self.unusable = Some("KVM_GET_MSRS takes too long to bound the guest's TSC from the host's");
            return None;
        }
        let b = (lo as u64, hi as u64);
        (self.bounds, self.checked, self.ran_free) = (Some(b), host_tsc(), false);
        Some(b)
    }

    /// One bracketed read falls inside the bounds.
    fn agrees(&self, fd: &VcpuFd, (lo, hi): (u64, u64)) -> bool {
        bracket(fd).is_some_and(|(h1, g, h2)| {
            let (lo, hi) = (signed(lo), signed(hi));
            signed(g.wrapping_sub(h2)) <= hi && signed(g.wrapping_sub(h1)) >= lo
        })
    }
}

/// Offsets as signed numbers: an offset is small either way of zero, or a guest TSC set far
/// from the host's (wrapping arithmetic keeps it exact).
fn signed(x: u64) -> i64 {
    x as i64
}

/// The offset's bounds from BRACKETS reads: (max of g − after, min of g − before).
fn bounds(fd: &VcpuFd) -> Option<(u64, u64)> {
    let (mut lo, mut hi) = (i64::MIN, i64::MAX);
    for _ in 0..BRACKETS {
        let (h1, g, h2) = bracket(fd)?;
        lo = lo.max(signed(g.wrapping_sub(h2)));
        hi = hi.min(signed(g.wrapping_sub(h1)));
    }
    (lo <= hi).then_some((lo as u64, hi as u64))
}

/// The host's TSC, the guest's (KVM_GET_MSRS of IA32_TSC), the host's again.
fn bracket(fd: &VcpuFd) -> Option<(u64, u64, u64)> {
    let mut msrs = Msrs::from_entries(&[kvm_msr_entry { index: IA32_TSC, ..Default::default() }]).ok()?;
    let before = host_tsc();
    let n = fd.get_msrs(&mut msrs).ok()?;
    let after = host_tsc();
    (n == 1).then(|| (before, msrs.as_slice()[0].data, after))
}
