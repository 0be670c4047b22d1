//! The pre-defined architectural performance events (SDM Vol. 3B Table 18-1).

/// Which architectural event (SDM Table 18-1), for code that gives each one a meaning: the
/// precise backend's models, the perf backend's host events. The codes live only in
/// [`ARCH_EVENTS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Event {
    CoreCycles,
    Instructions,
    RefCycles,
    LlcReference,
    LlcMisses,
    Branches,
    BranchMisses,
    TopdownSlots,
}

/// One architectural performance event, in CPUID.0AH:EBX bit order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArchEvent {
    pub event: Event,
    /// CPUID.0AH:EBX bit index (set = event not available).
    pub bit: u8,
    /// SDM name of the event.
    pub name: &'static str,
    /// IA32_PERFEVTSELx.EventSelect[7:0].
    pub event_select: u8,
    /// IA32_PERFEVTSELx.UMask[15:8].
    pub umask: u8,
    /// The fixed-function counter (IA32_FIXED_CTRi) that counts this event, if any.
    pub fixed: Option<u8>,
}

/// The 8 architectural events emon knows (SDM Table 18-1), indexed by EBX bit.
pub const ARCH_EVENTS: [ArchEvent; 8] = [
    arch(Event::CoreCycles, 0, "UnHalted Core Cycles", 0x3C, 0x00, Some(1)),
    arch(Event::Instructions, 1, "Instructions Retired", 0xC0, 0x00, Some(0)),
    arch(Event::RefCycles, 2, "UnHalted Reference Cycles", 0x3C, 0x01, Some(2)),
    arch(Event::LlcReference, 3, "LLC Reference", 0x2E, 0x4F, None),
    arch(Event::LlcMisses, 4, "LLC Misses", 0x2E, 0x41, None),
    arch(Event::Branches, 5, "Branch Instructions Retired", 0xC4, 0x00, None),
    arch(Event::BranchMisses, 6, "Branch Misses Retired", 0xC5, 0x00, None),
    arch(Event::TopdownSlots, 7, "Topdown Slots", 0xA4, 0x01, Some(3)),
];

const fn arch(event: Event, bit: u8, name: &'static str, event_select: u8, umask: u8, fixed: Option<u8>) -> ArchEvent {
    ArchEvent { event, bit, name, event_select, umask, fixed }
}

impl ArchEvent {
    /// The architectural event a PERFEVTSELx event select and umask name, if any.
    pub fn of(event_select: u8, umask: u8) -> Option<&'static ArchEvent> {
        ARCH_EVENTS.iter().find(|e| e.event_select == event_select && e.umask == umask)
    }

    /// The architectural event fixed-function counter `i` counts (SDM Table 18-2).
    pub fn fixed(i: u8) -> Option<&'static ArchEvent> {
        ARCH_EVENTS.iter().find(|e| e.fixed == Some(i))
    }

    /// The entry for `event`.
    pub fn get(event: Event) -> &'static ArchEvent {
        ARCH_EVENTS.iter().find(|e| e.event == event).expect("every Event is in ARCH_EVENTS")
    }
}
