//! The Debug Store's two writers.
//! - The PEBS assist (SDM Vol. 3B 18.6.1.1 and the seed's "PEBS Interrupt Threshold" and "PEBS
//!   CounterX Reset"): when a PEBS-enabled counter that overflowed counts its next event, the
//!   record of the instruction that counted it goes into the guest's PEBS buffer through the DS
//!   area, the counter reloads its reset value, and at the interrupt threshold a PMI with
//!   GLOBAL_STATUS.OvfBuffer follows (README, "PEBS").
//! - BTS (SDM 17.4.9): every taken branch's record goes into the BTS buffer, circular or with an
//!   interrupt at its threshold (README, "BTS").
use crate::{BackendError, Cx};
use emon_pmu::pmu::ds::{self, DsArea, PebsInput, DS_AREA_SIZE, DS_PEBS_INDEX};
use emon_x86::mode::CpuMode;
use vm_memory::GuestMemoryMmap;

/// What the Debug Store's writers did, for the run summary.
#[derive(Debug, Default, Clone, Copy)]
pub struct DsStats {
    /// PEBS assists: records written; none written because the buffer was at its absolute
    /// maximum; none because the DS area or the buffer was not mapped; and records whose
    /// registers are those after later instructions that retired without their own trap.
    pub pebs_records: u64,
    pub pebs_full: u64,
    pub pebs_lost: u64,
    pub pebs_inexact: u64,
    /// BTS records written, and branches not stored because the DS area or the buffer was not
    /// mapped.
    pub bts_records: u64,
    pub bts_lost: u64,
}

impl DsStats {
    /// What the run summary says about the records.
    pub fn notes(&self) -> Vec<String> {
        let mut notes = Vec::new();
        if self.pebs_lost > 0 {
            notes.push(format!(
                "NOT EXACT: PEBS: {} assists wrote no record: the DS area (the counter then reloaded 0) or the PEBS buffer was not mapped (README, \"PEBS\")",
                self.pebs_lost
            ));
        }
        if self.bts_lost > 0 {
            notes.push(format!(
                "NOT EXACT: BTS: {} branches were not stored: the DS area or the BTS buffer was not mapped (README, \"BTS\")",
                self.bts_lost
            ));
        }
        if self.pebs_inexact > 0 {
            notes.push(format!(
                "NOT EXACT: PEBS: {} records hold the registers after instructions that retired without their own single-step trap, not the sampled instruction's (README, \"PEBS\")",
                self.pebs_inexact
            ));
        }
        notes
    }
}

/// Writes `record` at linear address `at` and the buffer's new index (`at` + the record's size)
/// into the DS area field at `index_field`; the new index, or `None` with nothing written if
/// either is not mapped.
fn store(mem: &GuestMemoryMmap, mode: &CpuMode, at: u64, record: &[u8], index_field: u64) -> Option<u64> {
    let index = at + record.len() as u64;
    mode.write_linear(mem, at, record)?;
    mode.write_linear(mem, index_field, &index.to_le_bytes())?;
    Some(index)
}

/// The DS buffer management area at IA32_DS_AREA, or `None` if it is not mapped.
fn ds_area(cx: &Cx, mode: &CpuMode) -> Option<DsArea> {
    let mut bytes = [0u8; DS_AREA_SIZE];
    mode.read_linear(cx.vcpu.memory(), cx.pmu.ds_area(), &mut bytes).map(|()| DsArea::parse(&bytes))
}

/// Stores a BTS record of the branch from `from` to `to` at the DS area's BTS index.
pub fn bts_store(cx: &mut Cx, stats: &mut DsStats, mode: &CpuMode, from: u64, to: u64, predicted: bool) {
    let Some(ds) = ds_area(cx, mode) else {
        stats.bts_lost += 1;
        return;
    };
    let interrupts = cx.pmu.bts_interrupts();
    // With BTINT, nothing is stored at the absolute maximum (SDM 17.4.9).
    let Some(at) = ds.next_bts(interrupts) else { return };
    let record = ds::bts_record(from, to, predicted);
    let index_field = cx.pmu.ds_area() + ds::DS_BTS_INDEX;
    let Some(index) = store(cx.vcpu.memory(), mode, at, &record, index_field) else {
        stats.bts_lost += 1;
        return;
    };
    stats.bts_records += 1;
    if interrupts && index >= ds.bts_interrupt_threshold {
        cx.pmu.bts_threshold_reached();
    }
}

/// Performs the PEBS assist if one is due: the instruction at `eventing_ip` just retired and
/// the vCPU's registers are its results (`exact`: they are that instruction's, not those of
/// instructions that retired after it without their own trap); `tsc`: the guest's TSC now.
pub fn pebs_assist(
    cx: &mut Cx,
    stats: &mut DsStats,
    mode: &CpuMode,
    (eventing_ip, exact): (u64, bool),
    tsc: u64,
) -> Result<(), BackendError> {
    let due = cx.pmu.pebs_due();
    if due == 0 {
        return Ok(());
    }
    let Some(ds) = ds_area(cx, mode) else {
        // No DS area to read: no record and no reset (README, "PEBS").
        stats.pebs_lost += 1;
        cx.pmu.pebs_assisted(due, |_| 0, false);
        return Ok(());
    };
    let format = cx.pmu.profile().pebs_format();
    let mut threshold = false;
    let mut index = ds.pebs_index;
    for (counters, cfg) in record_groups(format, due, cx.pmu.pebs_adaptive(), cx.pmu.pebs_data_cfg()) {
        let size = match format {
            4 => ds::adaptive_record_size(cfg),
            _ => ds::record_size(format).expect("PEBS is presented only in a format emon writes"),
        };
        let Some(at) = DsArea { pebs_index: index, ..ds }.next_record(size) else {
            stats.pebs_full += 1;
            continue;
        };
        stats.pebs_inexact += u64::from(!exact);
        let record = pebs_record(cx, format, cfg, counters, eventing_ip, tsc)?;
        match store(cx.vcpu.memory(), mode, at, &record, cx.pmu.ds_area() + DS_PEBS_INDEX) {
            Some(next) => {
                stats.pebs_records += 1;
                index = next;
                threshold |= next >= ds.pebs_interrupt_threshold;
            }
            None => stats.pebs_lost += 1,
        }
    }
    cx.pmu.pebs_assisted(due, |id| ds.counter_reset(id), threshold);
    Ok(())
}

/// The records one assist writes for the counters `due`: one record, or in adaptive PEBS
/// (format 4) one per record layout, each with its counters and its MSR_PEBS_DATA_CFG groups.
/// A counter whose Adaptive_Record bit is clear (not in `adaptive`) gets the basic group only
/// (SDM 18.9.2.2); its record comes first.
fn record_groups(format: u8, due: u64, adaptive: u64, cfg: u64) -> Vec<(u64, u64)> {
    if format != 4 {
        return vec![(due, 0)];
    }
    [(due & !adaptive, 0), (due & adaptive, cfg)].into_iter().filter(|&(counters, _)| counters != 0).collect()
}

/// The PEBS record, in `format` (and groups `cfg` for format 4), of the instruction at
/// `eventing_ip` for the counters `due`, from the vCPU's state now.
fn pebs_record(
    cx: &mut Cx,
    format: u8,
    cfg: u64,
    due: u64,
    eventing_ip: u64,
    tsc: u64,
) -> Result<Vec<u8>, BackendError> {
    let regs = cx.vcpu.regs()?;
    // Formats 3 and 4 store the applicable counters; formats 1 and 2 IA32_PERF_GLOBAL_STATUS,
    // in which the counters the record is for read as overflowed.
    let status = if format >= 3 { due } else { cx.pmu.global_status() | due };
    let adaptive = if format == 4 { cfg } else { 0 };
    let xmm = if adaptive & ds::PEBS_DATA_CFG_XMMS != 0 { cx.vcpu.xmm()? } else { [[0; 16]; 16] };
    let input = PebsInput {
        rflags: regs.rflags,
        rip: regs.rip,
        gprs: [
            regs.rax, regs.rbx, regs.rcx, regs.rdx, regs.rsi, regs.rdi, regs.rbp, regs.rsp, regs.r8, regs.r9, regs.r10,
            regs.r11, regs.r12, regs.r13, regs.r14, regs.r15,
        ],
        eventing_ip,
        status,
        tsc,
        xmm,
        lbr: cx.pmu.lbr_newest(ds::adaptive_lbr_entries(adaptive)),
    };
    Ok(if format == 4 { ds::adaptive_record(cfg, &input) } else { ds::record(format, &input) })
}

#[cfg(test)]
mod tests {
    use super::record_groups;

    #[test]
    fn adaptive_records_follow_each_counters_adaptive_record_bit() {
        let cfg = 0xF;
        // Formats before 4: one record, no groups.
        assert_eq!(record_groups(3, 0b11, 0b01, cfg), vec![(0b11, 0)]);
        // Format 4: a counter without Adaptive_Record gets the basic group only.
        assert_eq!(record_groups(4, 0b01, 0, cfg), vec![(0b01, 0)]);
        assert_eq!(record_groups(4, 0b01, 0b01, cfg), vec![(0b01, cfg)]);
        // Counters of both kinds due at once: one record each, the basic one first.
        assert_eq!(record_groups(4, 1 << 32 | 0b10, 1 << 32, cfg), vec![(0b10, 0), (1 << 32, cfg)]);
        // Adaptive_Record on a counter that is not due changes nothing.
        assert_eq!(record_groups(4, 0b10, 0b01, cfg), vec![(0b10, 0)]);
    }
}
