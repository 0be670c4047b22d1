//! The counters the precise backend counts for: the armed set (reprogrammed exactly where the
//! model marked a change, as KVM does before the next entry), and the attribution of one retired
//! instruction to them (README, "The precise backend": events, filters, CMASK/INV/EDGE).
use super::cache::CacheEvents;
use super::clock::GuestClock;
use super::events::{cycles, Armed, Derive};
use crate::{marked, Cx};
use emon_pmu::pmu::{CounterId, Reprogram, Semantics};
use emon_x86::insn::Insn;
use std::collections::BTreeSet;
use std::sync::Arc;

/// Events emon does not derive named in the run summary, at most.
const MAX_UNDERIVED_NOTED: usize = 8;

/// See the module documentation.
#[derive(Debug)]
pub struct Counters {
    /// The counting counters, in IA32_PERF_GLOBAL_CTRL bit order.
    pub armed: Arc<[Armed]>,
    /// CMASK condition of the previous counted instruction, per counter (edge detect).
    edges: [bool; CounterId::SLOTS],
    /// Counters reprogrammed after guest writes marked them (one per counter per change).
    pub reprogrammed: u64,
    /// Events counters counted that emon does not derive (they count 0), as the model names
    /// them, at most [`MAX_UNDERIVED_NOTED`].
    underived: BTreeSet<String>,
    /// Events counted on a counter the CPU's event list does not give them (they count 0).
    misplaced: BTreeSet<String>,
}

impl Default for Counters {
    fn default() -> Self {
        Counters {
            armed: Arc::from(Vec::new()),
            edges: [false; CounterId::SLOTS],
            reprogrammed: 0,
            underived: BTreeSet::new(),
            misplaced: BTreeSet::new(),
        }
    }
}

impl Counters {
    /// Reprograms the counters `r` marks: each one leaves the armed set, and comes back with its
    /// new configuration if it counts. Returns the counters the guest wrote (a WRMSR to a
    /// counter is not counted by it).
    pub fn reprogram(&mut self, cx: &Cx, r: Reprogram) {
        if r.counters == 0 {
            return;
        }
        let mut armed: Vec<Armed> =
            self.armed.iter().filter(|a| r.counters & a.id.status_mask() == 0).copied().collect();
        for id in marked(cx.pmu, r) {
            self.reprogrammed += 1;
            // A reprogrammed counter's edge detect starts afresh: no condition held before it.
            self.edges[id.slot()] = false;
            let c = cx.pmu.counter(id);
            if c.counting {
                let noted = match c.semantics {
                    Semantics::Unsupported => Some(&mut self.underived),
                    Semantics::WrongCounter => Some(&mut self.misplaced),
                    _ => None,
                };
                if let Some(set) = noted.filter(|s| s.len() < MAX_UNDERIVED_NOTED) {
                    set.insert(cx.pmu.event_name(id));
                }
                armed.push(Armed::new(&c));
            }
        }
        armed.sort_by_key(|a| a.id.status_bit());
        self.armed = armed.into();
    }

    /// Does a counting counter's event come from the cache model?
    pub fn use_cache(&self) -> bool {
        self.armed.iter().any(|a| a.semantics.uses_cache())
    }

    /// Attributes one retired instruction to the counters in `armed` (those counting when it
    /// began) and runs the model clock; `cache`: what its data accesses did at the LLC.
    pub fn retire(
        &mut self,
        cx: &mut Cx,
        clock: &mut GuestClock,
        armed: &[Armed],
        (i, rip, cpl): (&Insn, u64, u8),
        taken: bool,
        cache: CacheEvents,
    ) {
        let c = cycles(i, taken);
        let ticks = clock.advance(c);
        for a in armed {
            let n = a.semantics.increment(i, rip, taken) + a.semantics.dynamic(ticks, cache);
            let inc = a.advance(n, cpl, &mut self.edges[a.id.slot()]);
            if inc > 0 {
                cx.pmu.add_events(a.id, inc);
            }
        }
    }

    /// What the run summary says about events counted as zero.
    pub fn notes(&self) -> Vec<String> {
        let mut notes = Vec::new();
        let list = |set: &BTreeSet<String>| set.iter().map(String::as_str).collect::<Vec<_>>().join(", ");
        if !self.underived.is_empty() {
            notes.push(format!(
                "NOT EXACT: counters counted events emon does not derive, and counted 0: {} (emon events; README, \"Model-specific events\")",
                list(&self.underived)
            ));
        }
        if !self.misplaced.is_empty() {
            notes.push(format!(
                "NOT EXACT: counters counted events on counters the CPU's event list does not give them (silicon's count is undefined there), and counted 0: {} (emon events; README, \"Model-specific events\")",
                list(&self.misplaced)
            ));
        }
        notes
    }
}
