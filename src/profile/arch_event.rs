//! The pre-defined architectural performance events (SDM Vol. 3B Table 18-1).

/// One architectural performance event, in CPUID.0AH:EBX bit order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArchEvent {
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
    ArchEvent { bit: 0, name: "UnHalted Core Cycles", event_select: 0x3C, umask: 0x00, fixed: Some(1) },
    ArchEvent { bit: 1, name: "Instructions Retired", event_select: 0xC0, umask: 0x00, fixed: Some(0) },
    ArchEvent { bit: 2, name: "UnHalted Reference Cycles", event_select: 0x3C, umask: 0x01, fixed: Some(2) },
    ArchEvent { bit: 3, name: "LLC Reference", event_select: 0x2E, umask: 0x4F, fixed: None },
    ArchEvent { bit: 4, name: "LLC Misses", event_select: 0x2E, umask: 0x41, fixed: None },
    ArchEvent { bit: 5, name: "Branch Instructions Retired", event_select: 0xC4, umask: 0x00, fixed: None },
    ArchEvent { bit: 6, name: "Branch Misses Retired", event_select: 0xC5, umask: 0x00, fixed: None },
    ArchEvent { bit: 7, name: "Topdown Slots", event_select: 0xA4, umask: 0x01, fixed: Some(3) },
];
