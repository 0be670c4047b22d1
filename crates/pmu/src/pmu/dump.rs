//! A human-readable dump of every PMU register, decoded (in the spirit of a `dump_perfmon`).

use std::fmt::Write as _;

use super::decode::Reg;
use super::msr::*;
use super::regs::{FixedCtrField, PerfEvtSel};
use super::{netburst, CounterId, Pmu};

/// Names of the set bits of `value` among `flags`.
fn flags(value: u64, flags: &[(u64, &str)]) -> String {
    let names: Vec<&str> = flags.iter().filter(|&&(bit, _)| value & bit != 0).map(|&(_, name)| name).collect();
    names.join(" ")
}

/// Names of the counters whose GLOBAL_* bit is set in `value`.
fn counter_bits(pmu: &Pmu, value: u64) -> String {
    let names: Vec<String> = pmu
        .counter_ids()
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

const DEBUGCTL_FLAGS: &[(u64, &str)] = &[
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

const MISC_ENABLE_FLAGS: &[(u64, &str)] = &[
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
fn with_flags(mut text: String, value: u64, named: &[(u64, &str)]) -> String {
    let f = flags(value, named);
    if !f.is_empty() {
        text.push(' ');
        text.push_str(&f);
    }
    text
}

/// A NetBurst CCCR, decoded (SDM Figure 18-48).
fn cccr_text(i: u8, v: u64) -> String {
    let c = netburst::Cccr(v);
    let escr = netburst::COUNTER_DEFS[usize::from(i)].escrs[c.escr_select()];
    let mut text = format!(
        "ESCR select {} ({}) active thread {}",
        c.escr_select(),
        escr.and_then(netburst::msr_name).unwrap_or("no ESCR"),
        (v >> netburst::CCCR_ACTIVE_THREAD_SHIFT) & 3
    );
    if c.compare() {
        let _ = write!(text, " COMPARE threshold={}", c.threshold());
    }
    let named = [
        (netburst::CCCR_ENABLE, "ENABLE"),
        (netburst::CCCR_COMPLEMENT, "COMPLEMENT"),
        (netburst::CCCR_EDGE, "EDGE"),
        (netburst::CCCR_FORCE_OVF, "FORCE_OVF"),
        (netburst::CCCR_OVF_PMI_T0, "OVF_PMI_T0"),
        (netburst::CCCR_OVF_PMI_T1, "OVF_PMI_T1"),
        (netburst::CCCR_CASCADE, "CASCADE"),
        (netburst::CCCR_OVF, "OVF"),
    ];
    with_flags(text, v, &named)
}

/// A NetBurst ESCR, decoded (SDM Figure 18-47).
fn escr_text(v: u64) -> String {
    let text = format!(
        "event select=0x{:02x} event mask=0x{:04x}",
        (v >> netburst::ESCR_EVENT_SELECT_SHIFT) & 0x3F,
        (v >> netburst::ESCR_EVENT_MASK_SHIFT) & 0xFFFF
    );
    let named = [
        (netburst::ESCR_T0_OS, "T0_OS"),
        (netburst::ESCR_T0_USR, "T0_USR"),
        (netburst::ESCR_T1_OS, "T1_OS"),
        (netburst::ESCR_T1_USR, "T1_USR"),
        (netburst::ESCR_TAG_ENABLE, "TAG_ENABLE"),
    ];
    with_flags(text, v, &named)
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

impl Pmu {
    /// A multi-line description of every readable register that exists under the profile,
    /// decoded, followed by the counters' derived state, the pending PMI and the counters marked
    /// for reprogramming.
    /// (The write-only command registers OVF_CTRL/STATUS_RESET and STATUS_SET read as 0 and are
    /// not listed.)
    pub fn dump(&self) -> String {
        let l = &self.layout;
        let mut out = String::new();
        if let Some(nb) = &self.nb {
            self.dump_netburst(nb, &mut out);
            return out;
        }
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
            let inuse = self.global_inuse();
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
                    format!("[{i}] {}", fixed_field_text(f))
                })
                .collect();
            line(IA32_FIXED_CTR_CTRL, self.fixed_ctr_ctrl, fields.join("; "));
        }
        line(IA32_DEBUGCTL, self.debugctl, flags(self.debugctl, DEBUGCTL_FLAGS));
        let misc = flags(self.misc_enable, MISC_ENABLE_FLAGS);
        line(IA32_MISC_ENABLE, self.misc_enable, misc);
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
        for id in self.counter_ids() {
            let s = self.counter(id);
            let state = if s.counting {
                "counting"
            } else if s.enabled {
                "enabled, not counting"
            } else {
                "disabled"
            };
            let distance = self.distance_to_overflow(id);
            match id {
                CounterId::Gp(i) => {
                    let sel = self.perfevtsel[usize::from(i)];
                    line(IA32_PERFEVTSEL0 + u32::from(i), sel, perfevtsel_text(sel));
                    let text = format!("{state}, {distance} events to overflow");
                    line(IA32_PMC0 + u32::from(i), s.value, text);
                }
                CounterId::Fixed(i) => {
                    let text = format!("{state}, {distance} events to overflow");
                    line(IA32_FIXED_CTR0 + u32::from(i), s.value, text);
                }
                CounterId::NetBurst(_) => {}
            }
        }
        let _ = writeln!(
            out,
            "PMI pending: {}; marked for reprogramming: {:#x}",
            if self.pmi_pending { "yes" } else { "no" },
            self.reprogram.counters
        );
        out
    }
}

impl Pmu {
    /// The NetBurst part of [`Pmu::dump`]: DEBUGCTLA, MISC_ENABLE, every ESCR that holds
    /// something, and each counter with its CCCR.
    fn dump_netburst(&self, nb: &netburst::Regs, out: &mut String) {
        let _ = writeln!(
            out,
            "NetBurst PMU: {} counters x {} bits, {} ESCRs",
            netburst::COUNTERS,
            netburst::WIDTH,
            netburst::ESCRS.len()
        );
        let mut line = |name: &str, msr: u32, value: u64, text: String| {
            let text = format!("{name:<27} ({msr:#05x}) = {value:#018x}  {text}");
            let _ = writeln!(out, "{}", text.trim_end());
        };
        line("IA32_DEBUGCTL", IA32_DEBUGCTL, self.debugctl, flags(self.debugctl, &DEBUGCTL_FLAGS[..2]));
        line("IA32_MISC_ENABLE", IA32_MISC_ENABLE, self.misc_enable, flags(self.misc_enable, MISC_ENABLE_FLAGS));
        for msr in [netburst::MSR_TC_PRECISE_EVENT, netburst::IA32_PEBS_ENABLE, netburst::MSR_PEBS_MATRIX_VERT] {
            let r = netburst::Reg::decode(msr).expect("a NetBurst register");
            line(netburst::msr_name(msr).unwrap_or_default(), msr, nb.rdmsr(r), String::new());
        }
        for e in netburst::ESCRS {
            let v = nb.escr(e.msr).unwrap_or(0);
            if v != 0 {
                line(e.name, e.msr, v, escr_text(v));
            }
        }
        for i in 0..netburst::COUNTERS {
            let d = &netburst::COUNTER_DEFS[usize::from(i)];
            let cccr = nb.cccr(i).0;
            let s = self.counter(CounterId::NetBurst(i));
            let state = if s.counting {
                "counting"
            } else if s.enabled {
                "enabled, not counting"
            } else {
                "disabled"
            };
            line(d.cccr, netburst::MSR_BPU_CCCR0 + u32::from(i), cccr, cccr_text(i, cccr));
            let text = format!("{state}, {} events to overflow", nb.distance(i));
            line(d.name, netburst::MSR_BPU_COUNTER0 + u32::from(i), s.value, text);
        }
        let _ = writeln!(
            out,
            "PMI pending: {}; marked for reprogramming: {:#x}",
            if self.pmi_pending { "yes" } else { "no" },
            self.reprogram.counters
        );
    }
}
