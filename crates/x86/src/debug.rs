//! The guest's own breakpoints: DR0-DR3 and DR7 (SDM Vol. 3B 17.2), and which of them an
//! instruction meets, for a VMM that runs guest code outside the CPU (where the CPU's own
//! breakpoint logic never sees it) and must make them fire as the CPU does.
use crate::access::{Access, AccessKind};

/// RFLAGS.RF, the resume flag: instruction breakpoints are ignored for the instruction at which
/// it is set, and the CPU clears it once an instruction completes (SDM Vol. 3B 17.3.1.1).
pub const RFLAGS_RF: u64 = 1 << 16;
/// DR6.B0-B3: breakpoint n's condition was met (SDM Vol. 3B 17.2.3).
pub const DR6_B: u64 = 0xF;
/// DR7's local and global enables of breakpoints 0-3, L0/G0 to L3/G3 (SDM Vol. 3B 17.2.4).
pub const DR7_ENABLES: u64 = 0xFF;
/// CR4.SMAP: supervisor-mode accesses to user-mode pages fault unless RFLAGS.AC is set (SDM
/// Vol. 3A 4.6.1).
pub const CR4_SMAP: u64 = 1 << 21;
pub const RFLAGS_AC: u64 = 1 << 18;

/// What breakpoint n watches: DR7.R/Wn (SDM Vol. 3B 17.2.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Condition {
    /// 00: instruction execution (a fault, before the instruction).
    Execute,
    /// 01: data writes (a trap, after the instruction).
    Write,
    /// 10: I/O reads and writes (with CR4.DE; undefined without it).
    Io,
    /// 11: data reads and writes, but not instruction fetches.
    ReadWrite,
}

/// The guest's DR0-DR3 and DR7, as one vCPU has them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Breakpoints {
    pub addr: [u64; 4],
    pub dr7: u64,
}

impl Breakpoints {
    /// Whether DR7 enables any breakpoint.
    pub fn armed(&self) -> bool {
        self.dr7 & DR7_ENABLES != 0
    }

    /// Whether breakpoint `n` is enabled (Ln or Gn).
    fn enabled(&self, n: usize) -> bool {
        self.dr7 >> (2 * n) & 3 != 0
    }

    /// Breakpoint `n`'s condition (R/Wn, DR7 bits 16 + 4n and 17 + 4n).
    pub fn condition(&self, n: usize) -> Condition {
        match self.dr7 >> (16 + 4 * n) & 3 {
            0 => Condition::Execute,
            1 => Condition::Write,
            2 => Condition::Io,
            _ => Condition::ReadWrite,
        }
    }

    /// The bytes breakpoint `n` covers: LENn (DR7 bits 18 + 4n and 19 + 4n) says 1, 2, 8 or 4
    /// bytes, and the address's low bits below that size are ignored (SDM Vol. 3B 17.2.5).
    fn span(&self, n: usize) -> (u64, u64) {
        let len = match self.dr7 >> (18 + 4 * n) & 3 {
            0 => 1,
            1 => 2,
            2 => 8,
            _ => 4,
        };
        (self.addr[n] & !(len - 1), len)
    }

    /// Whether any enabled breakpoint watches data (R/W 01 or 11).
    pub fn watches_data(&self) -> bool {
        (0..4).any(|n| self.enabled(n) && matches!(self.condition(n), Condition::Write | Condition::ReadWrite))
    }

    /// The addresses of the enabled instruction breakpoints.
    pub fn instruction_addresses(&self) -> Vec<u64> {
        (0..4).filter(|&n| self.enabled(n) && self.condition(n) == Condition::Execute).map(|n| self.addr[n]).collect()
    }

    /// Whether every enabled data breakpoint lies in the lower half of the address space, where
    /// a 64-bit kernel maps user-mode memory.
    pub fn data_in_lower_half(&self) -> bool {
        (0..4)
            .filter(|&n| self.enabled(n) && matches!(self.condition(n), Condition::Write | Condition::ReadWrite))
            .all(|n| self.addr[n] < 1 << 47)
    }

    /// The DR6.Bn bits of the enabled instruction breakpoints at linear address `rip` (SDM
    /// Vol. 3B 17.3.1.1: the fault comes before the instruction, unless RFLAGS.RF is set;
    /// `rflags` says). An instruction breakpoint's LEN must be 00; its address is compared whole.
    pub fn instruction_hits(&self, rip: u64, rflags: u64) -> u64 {
        if rflags & RFLAGS_RF != 0 {
            return 0;
        }
        (0..4)
            .filter(|&n| self.enabled(n) && self.condition(n) == Condition::Execute && self.addr[n] == rip)
            .fold(0, |b, n| b | 1 << n)
    }

    /// The DR6.Bn bits of the enabled data breakpoints that `accesses` (one instruction's, or one
    /// iteration's of a REP string instruction) meet: a write breakpoint any byte written, a
    /// read/write breakpoint any byte read or written (SDM Vol. 3B 17.3.1.2; a cache-line flush
    /// neither reads nor writes data).
    pub fn data_hits(&self, accesses: &[Access]) -> u64 {
        let mut hits = 0;
        for n in (0..4).filter(|&n| self.enabled(n)) {
            let writes_only = match self.condition(n) {
                Condition::Write => true,
                Condition::ReadWrite => false,
                Condition::Execute | Condition::Io => continue,
            };
            let (start, len) = self.span(n);
            let met = accesses.iter().any(|a| {
                let kind_met = match a.kind {
                    AccessKind::Flush => false,
                    AccessKind::Read => !writes_only,
                    AccessKind::Write | AccessKind::Update | AccessKind::Locked => true,
                };
                let end = a.linear.saturating_add(u64::from(a.size.max(1)));
                kind_met && a.linear < start + len && start < end
            });
            if met {
                hits |= 1 << n;
            }
        }
        hits
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn access(linear: u64, size: u32, kind: AccessKind) -> Access {
        Access { linear, size, kind }
    }

    #[test]
    fn an_instruction_breakpoint_fires_at_its_address_unless_rf_is_set() {
        // DR0 at 0x1000, L0, R/W0 = 00.
        let b = Breakpoints { addr: [0x1000, 0, 0, 0], dr7: 0x401 };
        assert!(b.armed());
        assert!(!b.watches_data());
        assert_eq!(b.instruction_hits(0x1000, 0x202), 0b1);
        assert_eq!(b.instruction_hits(0x1000, 0x202 | RFLAGS_RF), 0);
        assert_eq!(b.instruction_hits(0x1001, 0x202), 0);
        // Disabled (L0 and G0 clear): no hit, whatever DR0 says.
        let off = Breakpoints { dr7: 0x400, ..b };
        assert!(!off.armed());
        assert_eq!(off.instruction_hits(0x1000, 0x202), 0);
        // G3 alone enables breakpoint 3.
        let g3 = Breakpoints { addr: [0, 0, 0, 0x2000], dr7: 0x400 | 1 << 7 };
        assert_eq!(g3.instruction_hits(0x2000, 0x2), 0b1000);
        assert_eq!(g3.instruction_addresses(), [0x2000]);
        assert!(g3.data_in_lower_half());
    }

    #[test]
    fn a_data_breakpoint_covers_its_aligned_length_and_its_kind_of_access() {
        // DR1 = 0x2003 (low bits ignored), L1, R/W1 = 01 (writes), LEN1 = 11 (4 bytes): 0x2000-3.
        let w = Breakpoints { addr: [0, 0x2003, 0, 0], dr7: 0x400 | 1 << 2 | 0b1101 << 20 };
        assert!(w.watches_data());
        assert_eq!(w.condition(1), Condition::Write);
        assert_eq!(w.data_hits(&[access(0x2000, 1, AccessKind::Write)]), 0b10);
        assert_eq!(w.data_hits(&[access(0x1FFF, 2, AccessKind::Write)]), 0b10, "a write straddling in");
        assert_eq!(w.data_hits(&[access(0x2003, 8, AccessKind::Update)]), 0b10);
        assert_eq!(w.data_hits(&[access(0x2004, 4, AccessKind::Write)]), 0, "just past");
        assert_eq!(w.data_hits(&[access(0x1FF8, 8, AccessKind::Write)]), 0, "just before");
        assert_eq!(w.data_hits(&[access(0x2000, 4, AccessKind::Read)]), 0, "a read of a write breakpoint");
        // R/W2 = 11 (reads and writes), LEN2 = 10 (8 bytes), G2.
        let rw = Breakpoints { addr: [0, 0, 0x3000, 0], dr7: 0x400 | 1 << 5 | 0b1011 << 24 };
        assert_eq!(rw.condition(2), Condition::ReadWrite);
        assert_eq!(rw.data_hits(&[access(0x3007, 1, AccessKind::Read)]), 0b100);
        assert_eq!(rw.data_hits(&[access(0x3008, 1, AccessKind::Read)]), 0);
        assert_eq!(rw.data_hits(&[access(0x3000, 1, AccessKind::Flush)]), 0, "CLFLUSH reads no data");
        assert_eq!(rw.instruction_hits(0x3000, 0x2), 0, "a data breakpoint is not an instruction breakpoint");
        // Both at once.
        let both = Breakpoints { addr: [0, 0x2000, 0x3000, 0], dr7: w.dr7 | rw.dr7 };
        let two = [access(0x3000, 8, AccessKind::Read), access(0x2000, 4, AccessKind::Locked)];
        assert_eq!(both.data_hits(&two), 0b110);
        assert!(both.instruction_addresses().is_empty());
        assert!(both.data_in_lower_half());
        let kernel = Breakpoints { addr: [0, 0xFFFF_FFFF_8100_0000, 0, 0], ..w };
        assert!(!kernel.data_in_lower_half());
    }
}
