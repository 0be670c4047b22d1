//! The Debug Store's two writers.
//! - The PEBS assist (SDM Vol. 3B 18.6.1.1 and the seed's "PEBS Interrupt Threshold" and "PEBS
//!   CounterX Reset"): when a PEBS-enabled counter that overflowed counts its next event, the
//!   record of the instruction that counted it goes into the guest's PEBS buffer through the DS
//!   area, the counter reloads its reset value, and at the interrupt threshold a PMI with
//!   GLOBAL_STATUS.OvfBuffer follows (README, "PEBS").
//! - BTS (SDM 17.4.9): every taken branch's record goes into the BTS buffer, circular or with an
//!   interrupt at its threshold (README, "BTS").
use super::Precise;
use crate::{BackendError, Cx};
use emon_pmu::pmu::ds::{self, DsArea, PebsInput, DS_AREA_SIZE, DS_PEBS_INDEX};
use emon_pmu::pmu::CounterId;
use emon_x86::mode::CpuMode;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

const PAGE: u64 = 4096;

/// Copies between guest linear memory at `la` and `buf`, page by page through the guest's page
/// tables; `None` if a page is not mapped (nothing is written then).
fn linear(mem: &GuestMemoryMmap, mode: &CpuMode, la: u64, len: usize) -> Option<Vec<(u64, usize, usize)>> {
    let mut chunks = Vec::new();
    let mut done = 0usize;
    while done < len {
        let at = la.checked_add(done as u64)?;
        let n = ((PAGE - at % PAGE) as usize).min(len - done);
        chunks.push((mode.translate(mem, at)?, done, n));
        done += n;
    }
    Some(chunks)
}

fn read_linear(mem: &GuestMemoryMmap, mode: &CpuMode, la: u64, buf: &mut [u8]) -> Option<()> {
    for (pa, at, n) in linear(mem, mode, la, buf.len())? {
        mem.read_slice(&mut buf[at..at + n], GuestAddress(pa)).ok()?;
    }
    Some(())
}

fn write_linear(mem: &GuestMemoryMmap, mode: &CpuMode, la: u64, buf: &[u8]) -> Option<()> {
    let chunks = linear(mem, mode, la, buf.len())?;
    for (pa, at, n) in chunks {
        mem.write_slice(&buf[at..at + n], GuestAddress(pa)).ok()?;
    }
    Some(())
}

impl Precise {
    /// Stores a BTS record of the branch from `from` to `to` at the DS area's BTS index.
    pub(super) fn bts_store(&mut self, cx: &mut Cx, from: u64, to: u64, predicted: bool) -> Result<(), BackendError> {
        let mode = self.mode(cx)?;
        let mem = cx.vcpu.memory();
        let area = cx.pmu.ds_area();
        let mut bytes = [0u8; DS_AREA_SIZE];
        let Some(()) = read_linear(mem, &mode, area, &mut bytes) else {
            self.stats.bts_lost += 1;
            return Ok(());
        };
        let ds = DsArea::parse(&bytes);
        let interrupts = cx.pmu.bts_interrupts();
        let written = ds.next_bts(interrupts).and_then(|at| {
            write_linear(mem, &mode, at, &ds::bts_record(from, to, predicted))?;
            let index = at + ds::BTS_RECORD_SIZE;
            write_linear(mem, &mode, area + ds::DS_BTS_INDEX, &index.to_le_bytes())?;
            Some(index)
        });
        match written {
            Some(index) => {
                self.stats.bts_records += 1;
                if interrupts && index >= ds.bts_interrupt_threshold {
                    cx.pmu.bts_threshold_reached();
                }
            }
            None if ds.next_bts(interrupts).is_some() => self.stats.bts_lost += 1,
            None => {}
        }
        Ok(())
    }

    /// Performs the PEBS assist if one is due: the instruction at `eventing_ip` just retired and
    /// the vCPU's registers are its results (`exact`: they are that instruction's, not those of
    /// instructions that retired after it without their own trap).
    pub(super) fn pebs_assist(&mut self, cx: &mut Cx, eventing_ip: u64, exact: bool) -> Result<(), BackendError> {
        let due = cx.pmu.pebs_due();
        if due == 0 {
            return Ok(());
        }
        if !exact {
            self.stats.pebs_inexact += 1;
        }
        let format = cx.pmu.profile().pebs_format();
        let cfg = cx.pmu.pebs_data_cfg();
        let size = match format {
            4 => ds::adaptive_record_size(cfg),
            _ => ds::record_size(format).expect("PEBS is presented only in a format emon writes"),
        };
        let mode = self.mode(cx)?;
        let regs = cx.vcpu.regs()?;
        let tsc = match self.virtual_tsc() {
            Some(t) => t,
            None => cx.vcpu.guest_tsc()?,
        };
        // Formats 3 and 4 store the applicable counters; formats 1 and 2 IA32_PERF_GLOBAL_STATUS,
        // in which the counters the record is for read as overflowed.
        let status = if format >= 3 { due } else { cx.pmu.global_status() | due };
        let xmm = if format == 4 && cfg & ds::PEBS_DATA_CFG_XMMS != 0 { cx.vcpu.xmm()? } else { [[0; 16]; 16] };
        let lbr = cx.pmu.lbr_newest(ds::adaptive_lbr_entries(if format == 4 { cfg } else { 0 }));
        let input = PebsInput {
            rflags: regs.rflags,
            rip: regs.rip,
            gprs: [
                regs.rax, regs.rbx, regs.rcx, regs.rdx, regs.rsi, regs.rdi, regs.rbp, regs.rsp, regs.r8, regs.r9,
                regs.r10, regs.r11, regs.r12, regs.r13, regs.r14, regs.r15,
            ],
            eventing_ip,
            status,
            tsc,
            xmm,
            lbr,
        };
        let mem = cx.vcpu.memory();
        let area = cx.pmu.ds_area();
        let mut bytes = [0u8; DS_AREA_SIZE];
        let Some(()) = read_linear(mem, &mode, area, &mut bytes) else {
            // No DS area to read: no record and no reset (README, "PEBS").
            self.stats.pebs_lost += 1;
            cx.pmu.pebs_assisted(due, |_| 0, false);
            return Ok(());
        };
        let ds = DsArea::parse(&bytes);
        let written = ds.next_record(size).and_then(|at| {
            let record = if format == 4 { ds::adaptive_record(cfg, &input) } else { ds::record(format, &input) };
            write_linear(mem, &mode, at, &record)?;
            let index = at + size;
            write_linear(mem, &mode, area + DS_PEBS_INDEX, &index.to_le_bytes())?;
            Some(index)
        });
        match written {
            Some(_) => self.stats.pebs_records += 1,
            None => self.stats.pebs_full += 1,
        }
        let threshold = written.is_some_and(|index| index >= ds.pebs_interrupt_threshold);
        let reset = |id| match id {
            CounterId::Gp(i) => ds.pebs_counter_reset[usize::from(i)],
            CounterId::Fixed(i) => ds.pebs_fixed_reset[usize::from(i)],
        };
        cx.pmu.pebs_assisted(due, reset, threshold);
        Ok(())
    }
}
