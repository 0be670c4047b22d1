//! A human-readable dump of every PMU register, decoded (in the spirit of a `dump_perfmon`).

use std::fmt::Write as _;

use super::arch::ArchPmu;
use super::decode::Reg;
use super::msr::*;
use super::ops::{PmuOps, Shared};
use super::regs::{fixed_adaptive_bit, FixedCtrField, PerfEvtSel};
use super::CounterId;

/// Names of the set bits of `value` among `flags`.
pub(super) fn flags(value: u64, flags: &[(u64, &str)]) -> String {
    let names: Vec<&str> = flags.iter().filter(|&&(bit, _)| value & bit != 0).map(|&(_, name)| name).collect();
    names.join(" ")
}

/// Names of the counters whose GLOBAL_* bit is set in `value`.
fn counter_bits(pmu: &ArchPmu, value: u64) -> String {
    let names: Vec<String> = pmu
        .ids()
        .into_iter()
        .filter(|id| value & id.status_mask() != 0)
        .map(|id| id.to_string().trim_start_matches("IA32_").to_string())
        .collect();
    names.join(" ")
}

const STATUS_FLAGS: &[(u64, &str)] = &[
    (GLOBAL_STATUS_TRACE_TOPA_PMI, "Trace_ToPA_PMI"),
    (GLOBAL_STATUS_LBR_FRZ, "LBR_Frz"),
    (GLOBAL_STATUS_CTR_FRZ, "CTR_Frz"),
    (GLOBAL_STATUS_ASCI, "ASCI"),
    (GLOBAL_STATUS_OVF_UNCORE, "OvfUncore"),
    (GLOBAL_STATUS_OVF_BUFFER, "OvfBuffer"),
    (GLOBAL_STATUS_COND_CHGD, "CondChgd"),
];

pub(super) const DEBUGCTL_FLAGS: &[(u64, &str)] = &[
    (DEBUGCTL_LBR, "LBR"),
    (DEBUGCTL_BTF, "BTF"),
    (DEBUGCTL_TR, "TR"),
    (DEBUGCTL_BTS, "BTS"),
    (DEBUGCTL_BTINT, "BTINT"),
    (DEBUGCTL_BTS_OFF_OS, "BTS_OFF_OS"),
    (DEBUGCTL_BTS_OFF_USR, "BTS_OFF_USR"),
    (DEBUGCTL_FREEZE_LBRS_ON_PMI, "FREEZE_LBRS_ON_PMI"),
    (DEBUGCTL_FREEZE_PERFMON_ON_PMI, "FREEZE_PERFMON_ON_PMI"),
    (DEBUGCTL_FREEZE_WHILE_SMM, "FREEZE_WHILE_SMM"),
];

pub(super) const MISC_ENABLE_FLAGS: &[(u64, &str)] = &[
    (MISC_ENABLE_FAST_STRINGS, "FAST_STRINGS"),
    (MISC_ENABLE_TCC, "TCC"),
    (MISC_ENABLE_PERFMON_AVAILABLE, "PERFMON_AVAILABLE"),
    (MISC_ENABLE_BTS_UNAVAILABLE, "BTS_UNAVAILABLE"),
    (MISC_ENABLE_PEBS_UNAVAILABLE, "PEBS_UNAVAILABLE"),
    (MISC_ENABLE_EIST, "EIST"),
    (MISC_ENABLE_MONITOR, "MONITOR_FSM"),
    (MISC_ENABLE_LIMIT_CPUID, "LIMIT_CPUID_MAXVAL"),
    (MISC_ENABLE_XTPR_DISABLE, "xTPR_DISABLE"),
    (MISC_ENABLE_XD_DISABLE, "XD_DISABLE"),
];

fn perfevtsel_text(v: u64) -> String {
    let s = PerfEvtSel(v);
    let mut text = format!("event=0x{:02x} umask=0x{:02x}", s.event_select(), s.umask());
    for (on, name) in [
        (s.usr(), "USR"),
        (s.os(), "OS"),
        (s.edge(), "E"),
        (s.pc(), "PC"),
        (s.int(), "INT"),
        (s.any(), "ANY"),
        (s.en(), "EN"),
        (s.inv(), "INV"),
        (s.adaptive(), "ADAPTIVE"),
    ] {
        if on {
            text.push(' ');
            text.push_str(name);
        }
    }
    let _ = write!(text, " cmask=0x{:02x}", s.cmask());
    text
}

/// `text`, then the names of `value`'s set `named` bits.
pub(super) fn with_flags(mut text: String, value: u64, named: &[(u64, &str)]) -> String {
    let f = flags(value, named);
    if !f.is_empty() {
        text.push(' ');
        text.push_str(&f);
    }
    text
}

fn fixed_field_text(f: FixedCtrField) -> String {
    let ring = match f.en() {
        0 => "off",
        1 => "OS",
        2 => "USR",
        _ => "all rings",
    };
    let mut text = format!("EN={} ({ring})", f.en());
    if f.any() {
        text.push_str(" ANY");
    }
    if f.pmi() {
        text.push_str(" PMI");
    }
    text
}

/// A counter's state and distance, as the dump shows it.
pub(super) fn counter_text(counting: bool, enabled: bool, distance: u64) -> String {
    let state = if counting {
        "counting"
    } else if enabled {
        "enabled, not counting"
    } else {
        "disabled"
    };
    format!("{state}, {distance} events to overflow")
}

impl ArchPmu {
    /// Every readable register that exists under the profile, decoded, then the counters'
    /// derived state (see [`super::Pmu::dump`]). The write-only command registers
    /// OVF_CTRL/STATUS_RESET and STATUS_SET read as 0 and are not listed.
    pub(super) fn dump_registers(&self, sh: &Shared, out: &mut String) {
        let l = &self.layout;
        let fixed: Vec<String> = (0..MAX_FIXED).filter(|&i| l.fixed_exists(i)).map(|i| i.to_string()).collect();
        let _ = writeln!(
            out,
            "architectural perfmon v{}: {} GP x {} bits, fixed [{}] x {} bits",
            l.version,
            l.gp,
            l.gp_width,
            fixed.join(","),
            l.fixed_width
        );
        let mut line = |msr: u32, value: u64, text: String| {
            let name = msr_name(msr).unwrap_or_default();
            let text = format!("{name:<27} ({msr:#05x}) = {value:#018x}  {text}");
            let _ = writeln!(out, "{}", text.trim_end());
        };
        let exists = |msr: u32| Reg::decode(msr).is_some_and(|r| r.exists(l));

        if exists(IA32_PERF_CAPABILITIES) {
            let caps = flags(
                l.perf_capabilities,
                &[(PERF_CAPABILITIES_FREEZE_WHILE_SMM, "FREEZE_WHILE_SMM"), (PERF_CAPABILITIES_FW_WRITE, "FW_WRITE")],
            );
            line(IA32_PERF_CAPABILITIES, l.perf_capabilities, caps);
        }
        if exists(IA32_PERF_GLOBAL_CTRL) {
            let text = format!("enable: {}", counter_bits(self, self.global_ctrl));
            line(IA32_PERF_GLOBAL_CTRL, self.global_ctrl, text);
            let status = self.global_status;
            let text = format!("overflow: {} {}", counter_bits(self, status), flags(status, STATUS_FLAGS));
            line(IA32_PERF_GLOBAL_STATUS, status, text);
        }
        if exists(IA32_PERF_GLOBAL_INUSE) {
            let inuse = self.inuse();
            let mut text = format!("in use: {}", counter_bits(self, inuse));
            if inuse & GLOBAL_INUSE_PMI != 0 {
                text.push_str(" PMI_InUse");
            }
            line(IA32_PERF_GLOBAL_INUSE, inuse, text);
        }
        if exists(IA32_FIXED_CTR_CTRL) {
            let fields: Vec<String> = (0..MAX_FIXED)
                .filter(|&i| l.fixed_exists(i))
                .map(|i| {
                    let f = FixedCtrField::of(self.fixed_ctr_ctrl, i);
                    let adaptive = if self.fixed_ctr_ctrl & fixed_adaptive_bit(i) != 0 { " ADAPTIVE" } else { "" };
                    format!("[{i}] {}{adaptive}", fixed_field_text(f))
                })
                .collect();
            line(IA32_FIXED_CTR_CTRL, self.fixed_ctr_ctrl, fields.join("; "));
        }
        line(IA32_DEBUGCTL, self.debugctl, flags(self.debugctl, DEBUGCTL_FLAGS));
        let misc = flags(sh.misc_enable, MISC_ENABLE_FLAGS);
        line(IA32_MISC_ENABLE, sh.misc_enable, misc);
        if exists(IA32_PEBS_ENABLE) {
            let text = format!("PEBS: {}", counter_bits(self, self.pebs_enable));
            line(IA32_PEBS_ENABLE, self.pebs_enable, text);
            line(IA32_DS_AREA, self.ds_area, String::new());
        }
        for (i, &v) in (0u32..).zip(&self.offcore_rsp) {
            if exists(MSR_OFFCORE_RSP_0 + i) {
                line(MSR_OFFCORE_RSP_0 + i, v, String::new());
            }
        }
        for (msr, v) in [(MSR_PEBS_LD_LAT, self.pebs_ld_lat), (MSR_PEBS_FRONTEND, self.pebs_frontend)] {
            if exists(msr) {
                line(msr, v, String::new());
            }
        }
        if let Some(lbr) = l.lbr {
            if exists(MSR_LBR_SELECT) {
                line(MSR_LBR_SELECT, self.lbr.select, String::new());
            }
            let text = format!("{}-deep stack, LBR format {}", lbr.depth, l.lbr_format);
            line(MSR_LASTBRANCH_TOS, self.lbr.tos, text);
            line(MSR_LER_FROM_LIP, self.lbr.ler.0, String::new());
            line(MSR_LER_TO_LIP, self.lbr.ler.1, String::new());
            // Only the entries that hold something: a 32-deep stack is 96 MSRs.
            for i in 0..lbr.depth {
                let n = usize::from(i);
                let regs = [(lbr.from, self.lbr.from[n]), (lbr.to, self.lbr.to[n])];
                let info = lbr.info.map(|base| (base, self.lbr.info[n]));
                for (base, v) in regs.into_iter().chain(info).filter(|&(_, v)| v != 0) {
                    line(base + u32::from(i), v, String::new());
                }
            }
        }
        for id in self.ids() {
            let s = self.state(id);
            let text = counter_text(s.counting, s.enabled, self.distance_to_overflow(id));
            match id {
                CounterId::Gp(i) => {
                    let sel = self.perfevtsel[usize::from(i)];
                    line(IA32_PERFEVTSEL0 + u32::from(i), sel, perfevtsel_text(sel));
                    line(IA32_PMC0 + u32::from(i), s.value, text);
                }
                CounterId::Fixed(i) => line(IA32_FIXED_CTR0 + u32::from(i), s.value, text),
                CounterId::NetBurst(_) => {}
            }
        }
    }
}
