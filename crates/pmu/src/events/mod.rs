//! The model-specific performance events of the CPUs emon's profiles name (README,
//! "Model-specific events"): each CPU's list as Intel publishes it and Linux 6.1 ships it,
//! generated into `lists/` by `scripts/gen-events` (never typed by hand), and what emon counts
//! for each event (`meaning.rs`).
//!
//! A profile gets the list of its CPU by vendor, family and model, as Linux's perf picks its
//! JSON list (mapfile.csv). A PERFEVTSELx programmed with an encoding of the list counts what
//! [`EventList::lookup`] says, on the counters the list gives the event.

mod index;
mod lists;
mod meaning;
#[cfg(test)]
mod tests;

pub use index::Lookup;
pub use lists::LISTS;
pub use meaning::meaning;

use std::fmt;

/// One event of a CPU's list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelEvent {
    /// Intel's name, e.g. `BR_INST_RETIRED.CONDITIONAL`.
    pub name: &'static str,
    /// IA32_PERFEVTSELx.EventSelect (a fixed counter's pseudo-encoding for fixed-only events).
    pub select: u8,
    /// IA32_PERFEVTSELx.UMask; `None` names every umask of `select` (Core 2's counter
    /// restrictions, which Linux lists by event select only).
    pub umask: Option<u8>,
    /// The CMASK, INV, EDGE and ANY the event is defined with.
    pub cmask: u8,
    pub inv: bool,
    pub edge: bool,
    pub any: bool,
    /// The counters it counts on, in the IA32_PERF_GLOBAL_CTRL layout (bit i: IA32_PMCi, bit
    /// 32 + i: IA32_FIXED_CTRi).
    pub counters: u64,
    /// PEBS: 0 none, 1 precise, 2 precise distribution (the list's PEBS field).
    pub pebs: u8,
    /// The MSR that qualifies it and the value it needs (OFFCORE_RSP, PEBS_LD_LAT,
    /// PEBS_FRONTEND).
    pub msr: Option<(u32, u64)>,
    pub description: &'static str,
}

impl ModelEvent {
    /// Does it count on general-purpose counter `i`?
    pub fn on_gp(&self, i: u8) -> bool {
        self.counters & 0xFF & 1u64.checked_shl(u32::from(i)).unwrap_or(0) != 0
    }

    /// Only fixed-function counters count it (its encoding is a pseudo-encoding).
    pub fn fixed_only(&self) -> bool {
        self.counters & 0xFF == 0
    }

    /// Defined without CMASK, INV, EDGE or ANY: the event its encoding names.
    pub fn plain(&self) -> bool {
        self.cmask == 0 && !self.inv && !self.edge && !self.any
    }

    /// Its encoding as text: `0xC4/0x01`, with the qualifiers it is defined with.
    pub fn encoding(&self) -> String {
        let mut s = match self.umask {
            Some(u) => format!("{:#04x}/{u:#04x}", self.select),
            None => format!("{:#04x}/any", self.select),
        };
        if self.cmask != 0 {
            s += &format!(" cmask={}", self.cmask);
        }
        for (on, name) in [(self.inv, " inv"), (self.edge, " edge"), (self.any, " any")] {
            if on {
                s += name;
            }
        }
        s
    }
}

/// One CPU's event list.
pub struct EventList {
    /// emon's name for it (`skylake`).
    pub name: &'static str,
    /// The microarchitecture (`Skylake`).
    pub cpu: &'static str,
    /// Where the generator took it from.
    pub source: &'static str,
    /// The family 6 models (GenuineIntel) that have it.
    pub models: &'static [u8],
    pub events: &'static [ModelEvent],
}

impl EventList {
    /// The list of the CPU `vendor`/`family`/`model`, if emon ships one.
    pub fn for_cpu(vendor: &str, family: u16, model: u8) -> Option<&'static EventList> {
        if vendor != "GenuineIntel" || family != 6 {
            return None;
        }
        LISTS.iter().copied().find(|l| l.models.contains(&model))
    }

    /// The list emon calls `name`.
    pub fn named(name: &str) -> Option<&'static EventList> {
        LISTS.iter().copied().find(|l| l.name == name)
    }

    /// What general-purpose counter `counter` counts when its PERFEVTSELx holds this encoding,
    /// if the list knows the event select (see [`Lookup`]).
    pub fn lookup(
        &'static self,
        counter: u8,
        select: u8,
        umask: u8,
        cmask: u8,
        inv: bool,
        edge: bool,
    ) -> Option<Lookup> {
        index::with(self, |i| i.lookup(counter, select, umask, cmask, inv, edge))
    }

    /// The event an encoding names (its plain event, else the first of the list), for reports.
    pub fn name_of(&'static self, select: u8, umask: u8) -> Option<&'static str> {
        index::with(self, |i| i.name_of(select, umask))
    }
}

impl PartialEq for EventList {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

impl Eq for EventList {}

impl fmt::Debug for EventList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "EventList({})", self.name)
    }
}
