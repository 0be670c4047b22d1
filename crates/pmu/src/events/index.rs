//! A list's events by encoding, built once per list: what a PERFEVTSELx encoding counts and on
//! which counters.
use super::lists::COUNT;
use super::{meaning, EventList, ModelEvent, LISTS};
use crate::pmu::Semantics;
use std::sync::OnceLock;

/// What a general-purpose counter counts for an encoding of a CPU's list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lookup {
    /// The event's name in the list.
    pub name: &'static str,
    /// What emon counts: the event's meaning, or [`Semantics::WrongCounter`] on a counter the
    /// list does not give it, or [`Semantics::Unsupported`].
    pub semantics: Semantics,
}

/// One encoding (event select and umask) of a list.
#[derive(Debug)]
struct Encoding {
    key: u16,
    /// The name of its plain event (no CMASK/INV/EDGE/ANY), else of its first.
    name: &'static str,
    semantics: Semantics,
    /// Its rows (events defined with this encoding), on general-purpose counters.
    rows: Vec<&'static ModelEvent>,
}

/// A list's index.
#[derive(Debug)]
pub(super) struct Index {
    /// By `select << 8 | umask`, sorted.
    encodings: Vec<Encoding>,
    /// Rows that name every umask of an event select (Core 2), by select.
    selects: Vec<&'static ModelEvent>,
}

/// `f` of the index of `list`: a shipped list's is built at its first use and kept, another
/// (a test's) is built for the call.
pub(super) fn with<T>(list: &'static EventList, f: impl FnOnce(&Index) -> T) -> T {
    static INDEXES: [OnceLock<Index>; COUNT] = [const { OnceLock::new() }; COUNT];
    match LISTS.iter().position(|l| std::ptr::eq(*l, list)) {
        Some(slot) => f(INDEXES[slot].get_or_init(|| Index::new(list))),
        None => f(&Index::new(list)),
    }
}

fn key(select: u8, umask: u8) -> u16 {
    u16::from(select) << 8 | u16::from(umask)
}

impl Index {
    fn new(list: &'static EventList) -> Index {
        let mut encodings: Vec<Encoding> = Vec::new();
        let mut selects = Vec::new();
        for e in list.events.iter().filter(|e| !e.fixed_only()) {
            let Some(umask) = e.umask else {
                selects.push(e);
                continue;
            };
            let k = key(e.select, umask);
            match encodings.iter_mut().find(|x| x.key == k) {
                Some(x) => x.rows.push(e),
                None => {
                    encodings.push(Encoding { key: k, name: e.name, semantics: Semantics::Unsupported, rows: vec![e] })
                }
            }
        }
        for x in &mut encodings {
            // The encoding's event is its plain row's; rows defined with CMASK, INV or EDGE are
            // that event filtered, as any guest may filter it.
            if let Some(plain) = x.rows.iter().find(|r| r.plain()) {
                x.name = plain.name;
            }
            x.semantics = x
                .rows
                .iter()
                .filter(|r| r.plain())
                .find_map(|r| meaning(list.name, r.name))
                .unwrap_or(Semantics::Unsupported);
        }
        // A pseudo-encoding of one fixed-function counter's event (Ice Lake's 0x00/0x03,
        // CPU_CLK_UNHALTED.REF_TSC on IA32_FIXED_CTR2) is known too: on a general-purpose counter
        // it is an event the list does not give that counter, whose count silicon leaves
        // undefined, not an unknown one. (Nehalem's list gives all three fixed counters' events
        // 0x00/0x00: that names no one event, and stays unknown.)
        let fixed: Vec<&'static ModelEvent> = list.events.iter().filter(|e| e.fixed_only()).collect();
        for e in &fixed {
            let Some(umask) = e.umask else { continue };
            let k = key(e.select, umask);
            let same: Vec<_> = fixed.iter().filter(|r| r.select == e.select && r.umask == e.umask).collect();
            let one_counter = same.iter().all(|r| r.counters == e.counters);
            if one_counter && !encodings.iter().any(|x| x.key == k) {
                let name = same.iter().find(|r| r.plain()).map_or(e.name, |r| r.name);
                encodings.push(Encoding { key: k, name, semantics: Semantics::WrongCounter, rows: vec![e] });
            }
        }
        encodings.sort_by_key(|x| x.key);
        Index { encodings, selects }
    }

    fn encoding(&self, select: u8, umask: u8) -> Option<&Encoding> {
        let k = key(select, umask);
        self.encodings.binary_search_by_key(&k, |x| x.key).ok().map(|i| &self.encodings[i])
    }

    pub(super) fn name_of(&self, select: u8, umask: u8) -> Option<&'static str> {
        self.encoding(select, umask)
            .map(|x| x.name)
            .or_else(|| self.selects.iter().find(|r| r.select == select).map(|r| r.name))
    }

    /// See [`EventList::lookup`]. The counters an encoding may use are those of its rows defined
    /// with the CMASK, INV and EDGE programmed, else of its plain rows, else of all its rows (a
    /// list gives one event's variants their own counters: Skylake's INST_RETIRED.PREC_DIST
    /// counts on IA32_PMC1 only, its TOTAL_CYCLES_PS variant on 0, 2 and 3); a row naming every
    /// umask of the select restricts every encoding of it.
    pub(super) fn lookup(
        &self,
        counter: u8,
        select: u8,
        umask: u8,
        cmask: u8,
        inv: bool,
        edge: bool,
    ) -> Option<Lookup> {
        let whole_select: Vec<&&ModelEvent> = self.selects.iter().filter(|r| r.select == select).collect();
        let on_select = whole_select.is_empty() || whole_select.iter().any(|r| r.on_gp(counter));
        let Some(x) = self.encoding(select, umask) else {
            let name = whole_select.first()?.name;
            let semantics = if on_select { Semantics::Unsupported } else { Semantics::WrongCounter };
            return Some(Lookup { name, semantics });
        };
        let same: Vec<_> = x.rows.iter().filter(|r| r.cmask == cmask && r.inv == inv && r.edge == edge).collect();
        let plain: Vec<_> = x.rows.iter().filter(|r| r.plain()).collect();
        let rows = if !same.is_empty() {
            same
        } else if !plain.is_empty() {
            plain
        } else {
            x.rows.iter().collect()
        };
        let on_encoding = rows.iter().any(|r| r.on_gp(counter));
        let semantics = if on_encoding && on_select { x.semantics } else { Semantics::WrongCounter };
        Some(Lookup { name: x.name, semantics })
    }
}
