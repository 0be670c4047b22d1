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
use vm_memory::GuestMemoryMmap;

/// Writes `record` at linear address `at` and the buffer's new index (`at` + the record's size)
/// into the DS area field at `index_field`; the new index, or `None` with nothing written if
/// either is not mapped.
fn store(mem: &GuestMemoryMmap, mode: &CpuMode, at: u64, record: &[u8], index_field: u64) -> Option<u64> {
    let index = at + record.len() as u64;
    mode.write_linear(mem, at, record)?;
    mode.write_linear(mem, index_field, &index.to_le_bytes())?;
    Some(index)
}

impl Precise {
    /// The DS buffer management area at IA32_DS_AREA, or `None` if it is not mapped.
    fn ds_area(&mut self, cx: &mut Cx) -> Result<Option<(CpuMode, DsArea)>, BackendError> {
        let mode = self.mode(cx)?;
        let mut bytes = [0u8; DS_AREA_SIZE];
        let read = mode.read_linear(cx.vcpu.memory(), cx.pmu.ds_area(), &mut bytes);
        Ok(read.map(|()| (mode, DsArea::parse(&bytes))))
    }

    /// Stores a BTS record of the branch from `from` to `to` at the DS area's BTS index.
    pub(super) fn bts_store(&mut self, cx: &mut Cx, from: u64, to: u64, predicted: bool) -> Result<(), BackendError> {
        let Some((mode, ds)) = self.ds_area(cx)? else {
            self.stats.bts_lost += 1;
            return Ok(());
        };
        let interrupts = cx.pmu.bts_interrupts();
        // With BTINT, nothing is stored at the absolute maximum (SDM 17.4.9).
        let Some(at) = ds.next_bts(interrupts) else { return Ok(()) };
        let record = ds::bts_record(from, to, predicted);
        let index_field = cx.pmu.ds_area() + ds::DS_BTS_INDEX;
        let Some(index) = store(cx.vcpu.memory(), &mode, at, &record, index_field) else {
            self.stats.bts_lost += 1;
            return Ok(());
        };
        self.stats.bts_records += 1;
        if interrupts && index >= ds.bts_interrupt_threshold {
            cx.pmu.bts_threshold_reached();
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
        let Some((mode, ds)) = self.ds_area(cx)? else {
            // No DS area to read: no record and no reset (README, "PEBS").
            self.stats.pebs_lost += 1;
            cx.pmu.pebs_assisted(due, |_| 0, false);
            return Ok(());
        };
        let format = cx.pmu.profile().pebs_format();
        let cfg = cx.pmu.pebs_data_cfg();
        let size = match format {
            4 => ds::adaptive_record_size(cfg),
            _ => ds::record_size(format).expect("PEBS is presented only in a format emon writes"),
        };
        let threshold = match ds.next_record(size) {
            None => {
                self.stats.pebs_full += 1;
                false
            }
            Some(at) => {
                if !exact {
                    self.stats.pebs_inexact += 1;
                }
                let record = self.pebs_record(cx, format, cfg, due, eventing_ip)?;
                let index_field = cx.pmu.ds_area() + DS_PEBS_INDEX;
                match store(cx.vcpu.memory(), &mode, at, &record, index_field) {
                    Some(index) => {
                        self.stats.pebs_records += 1;
                        index >= ds.pebs_interrupt_threshold
                    }
                    None => {
                        self.stats.pebs_lost += 1;
                        false
                    }
                }
            }
        };
        let reset = |id| match id {
            CounterId::Gp(i) => ds.pebs_counter_reset[usize::from(i)],
            CounterId::Fixed(i) => ds.pebs_fixed_reset[usize::from(i)],
            CounterId::NetBurst(_) => 0,
        };
        cx.pmu.pebs_assisted(due, reset, threshold);
        Ok(())
    }

    /// The PEBS record, in `format` (and groups `cfg` for format 4), of the instruction at
    /// `eventing_ip` for the counters `due`, from the vCPU's state now.
    fn pebs_record(
        &mut self,
        cx: &mut Cx,
        format: u8,
        cfg: u64,
        due: u64,
        eventing_ip: u64,
    ) -> Result<Vec<u8>, BackendError> {
        let regs = cx.vcpu.regs()?;
        let tsc = match self.virtual_tsc() {
            Some(t) => t,
            None => cx.vcpu.guest_tsc()?,
        };
        // Formats 3 and 4 store the applicable counters; formats 1 and 2 IA32_PERF_GLOBAL_STATUS,
        // in which the counters the record is for read as overflowed.
        let status = if format >= 3 { due } else { cx.pmu.global_status() | due };
        let adaptive = if format == 4 { cfg } else { 0 };
        let xmm = if adaptive & ds::PEBS_DATA_CFG_XMMS != 0 { cx.vcpu.xmm()? } else { [[0; 16]; 16] };
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
            lbr: cx.pmu.lbr_newest(ds::adaptive_lbr_entries(adaptive)),
        };
        Ok(if format == 4 { ds::adaptive_record(cfg, &input) } else { ds::record(format, &input) })
    }
}
