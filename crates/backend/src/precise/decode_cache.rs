//! The stepper's decoded instructions, by linear address under one CR3. Each entry keeps the
//! bytes it was decoded from and is used only while guest memory still holds them: a guest
//! rewrites its own code under one CR3 (Linux patches jump labels, alternatives and static
//! calls), and a stale entry would count the old instruction.
use emon_x86::insn::{self, Insn};
use emon_x86::mode::CpuMode;
use std::collections::HashMap;
use vm_memory::GuestMemoryMmap;

/// Decoded instructions kept at most (about 3 MiB), so that a guest executing at many addresses
/// cannot grow emon's memory.
const MAX_CACHED_INSNS: usize = 65_536;

/// The longest x86 instruction (SDM Vol. 2A 2.3.11).
const MAX_INSN_LEN: usize = 15;

#[derive(Debug, Clone)]
struct Entry {
    /// The bytes the decoding used: the instruction's.
    bytes: [u8; MAX_INSN_LEN],
    len: u8,
    insn: Insn,
}

/// See the module documentation.
#[derive(Debug, Default)]
pub struct DecodeCache {
    cr3: u64,
    entries: HashMap<u64, Entry>,
}

impl DecodeCache {
    /// The instruction at linear address `rip` in `mode`, `None` if it cannot be fetched or
    /// decoded.
    pub fn get(&mut self, mem: &GuestMemoryMmap, mode: &CpuMode, rip: u64) -> Option<Insn> {
        if mode.cr3 != self.cr3 {
            self.entries.clear();
            self.cr3 = mode.cr3;
        }
        let bytes = mode.fetch(mem, rip);
        if let Some(e) = self.entries.get(&rip) {
            if bytes.get(..usize::from(e.len)) == Some(&e.bytes[..usize::from(e.len)]) {
                return Some(e.insn);
            }
        }
        if self.entries.len() >= MAX_CACHED_INSNS {
            self.entries.clear();
        }
        // What does not decode is not kept: an address not mapped yet fetches no bytes at all,
        // which every later fetch there would match (a forked process's code, before its first
        // page fault there, stayed undecodable, and its SYSCALL went to KVM).
        let insn = insn::decode(&bytes, rip, mode.bitness)?;
        let len = usize::from(insn.len);
        let mut kept = [0u8; MAX_INSN_LEN];
        kept[..len].copy_from_slice(&bytes[..len]);
        self.entries.insert(rip, Entry { bytes: kept, len: len as u8, insn });
        Some(insn)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use emon_x86::insn::Flow;
    use vm_memory::{Bytes, GuestAddress};

    /// Code rewritten under the same CR3 and RIP (as Linux patches a jump label from a NOP to a
    /// JMP) is decoded again, not taken from the cache.
    #[test]
    fn rewritten_code_is_decoded_again() {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        let mode = CpuMode { bitness: 64, cr3: 0x1000, ..CpuMode::default() };
        // nop dword [rax + rax] (5 bytes)
        mem.write_slice(&[0x0F, 0x1F, 0x44, 0x00, 0x00], GuestAddress(0x5000)).unwrap();
        let mut cache = DecodeCache::default();
        let nop = cache.get(&mem, &mode, 0x5000).unwrap();
        assert_eq!((nop.flow, nop.len), (Flow::Next, 5));
        assert_eq!(cache.get(&mem, &mode, 0x5000), Some(nop), "unchanged code comes from the cache");
        // jmp +0x10 (5 bytes), written over it.
        mem.write_slice(&[0xE9, 0x10, 0x00, 0x00, 0x00], GuestAddress(0x5000)).unwrap();
        let jmp = cache.get(&mem, &mode, 0x5000).unwrap();
        assert_eq!(jmp.flow, Flow::Direct { target: 0x5015, conditional: false });
        // A change past the instruction's bytes does not matter.
        mem.write_slice(&[0xCC], GuestAddress(0x5005)).unwrap();
        assert_eq!(cache.get(&mem, &mode, 0x5000), Some(jmp));
    }

    /// An address that cannot be fetched (its page not mapped yet) or does not decode is tried
    /// again next time: once the page is mapped, its instruction decodes.
    #[test]
    fn code_that_could_not_be_fetched_is_decoded_once_it_can_be() {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        // Long mode, paging: PML4 0x1000 -> PDPT 0x2000 -> PD 0x3000 -> PT 0x4000, whose entry
        // for linear 0x5000 is not present.
        for (table, next) in [(0x1000u64, 0x2003u64), (0x2000, 0x3003), (0x3000, 0x4003)] {
            mem.write_obj(next, GuestAddress(table)).unwrap();
        }
        let mode = CpuMode {
            bitness: 64,
            cr0: 1 << 31 | 1,
            cr3: 0x1000,
            cr4: 1 << 5,
            efer: 1 << 10 | 1 << 8,
            ..CpuMode::default()
        };
        mem.write_slice(&[0x0F, 0x05], GuestAddress(0x8000)).unwrap(); // syscall
        let mut cache = DecodeCache::default();
        assert_eq!(cache.get(&mem, &mode, 0x5000), None, "not mapped");
        mem.write_obj(0x8003u64, GuestAddress(0x4000 + 5 * 8)).unwrap();
        let syscall = cache.get(&mem, &mode, 0x5000).expect("mapped now");
        assert_eq!(syscall.special, emon_x86::insn::Special::Syscall);
    }

    #[test]
    fn another_address_space_starts_afresh_and_the_cache_stays_bounded() {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        let mode = CpuMode { bitness: 64, cr3: 0x1000, ..CpuMode::default() };
        let mut cache = DecodeCache::default();
        for rip in 0..(MAX_CACHED_INSNS as u64 + 10) {
            cache.get(&mem, &mode, rip);
        }
        assert!(cache.entries.len() <= MAX_CACHED_INSNS);
        cache.get(&mem, &CpuMode { cr3: 0x2000, ..mode }, 0);
        assert_eq!(cache.entries.len(), 1);
    }
}
