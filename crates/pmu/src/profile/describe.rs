//! Human-readable decoding of CPUID leaf 0x0A (for `emon profiles` / `emon cpuid`).

use super::{PmuProfile, ARCH_EVENTS};

/// Decode a profile's CPUID leaf 0x0A (and its PMU MSR capabilities) into human lines:
/// the raw registers, the version, the general-purpose and fixed-function counters with
/// their widths (and the version 5 ECX bitmap), the EBX length and each architectural
/// event's availability, IA32_PERF_CAPABILITIES and IA32_MISC_ENABLE[7].
pub fn describe_leaf_0a(p: &PmuProfile) -> Vec<String> {
    let [eax, ebx, ecx, edx] = p.leaf_0a();
    let mut lines = vec![format!("CPUID.0AH: EAX=0x{eax:08X} EBX=0x{ebx:08X} ECX=0x{ecx:08X} EDX=0x{edx:08X}")];
    if p.netburst() {
        lines.push("version 0: no architectural performance monitoring".to_string());
        lines.extend(netburst_lines());
    } else if p.version == 0 {
        lines.push("version 0: no architectural performance monitoring".to_string());
    } else {
        lines.push(format!("architectural perfmon version {}", p.version));
        lines.push(format!(
            "{} general-purpose counters x {} bits (IA32_PMC0-{}, IA32_PERFEVTSEL0-{})",
            p.gp,
            p.gp_width,
            p.gp.saturating_sub(1),
            p.gp.saturating_sub(1)
        ));
        lines.push(fixed_line(p));
        lines.push(format!("EBX length {}: architectural events (SDM Table 18-1)", p.ebx_length));
        lines.extend(ARCH_EVENTS.iter().map(|ev| {
            let state = if ev.bit >= p.ebx_length {
                "not enumerated (beyond EBX length)"
            } else if p.arch_event_available(ev.bit) {
                "available"
            } else {
                "unavailable (EBX bit set)"
            };
            let fixed = match ev.fixed {
                Some(i) if p.fixed_supported(i) => format!(", also IA32_FIXED_CTR{i}"),
                _ => String::new(),
            };
            format!("  [{}] {:<28} 0x{:02X}/0x{:02X}  {state}{fixed}", ev.bit, ev.name, ev.event_select, ev.umask)
        }));
    }
    lines.push(perf_capabilities_line(p));
    lines.push(format!("IA32_MISC_ENABLE[7] performance monitoring available: {}", yes_no(p.misc_enable_perfmon)));
    lines.push(lbr_line(p));
    lines.push(pebs_line(p));
    lines.push(if p.version >= 1 {
        "BTS: presented under the precise backend, which stores the branch records (IA32_MISC_ENABLE[11] BTS_UNAVAILABLE clear), where the guest sees CPUID.01H:EDX.DS or with --debug-store on; not under the perf backend".to_string()
    } else {
        "BTS: none (no architectural perfmon)".to_string()
    });
    lines.push(model_msrs_line(p));
    lines
}

/// The NetBurst PMU's registers (SDM 18.15, Table 18-63): each counter with its CCCR and the
/// ESCRs its CCCR's ESCR select can name.
fn netburst_lines() -> Vec<String> {
    use crate::pmu::netburst::{self, COUNTERS, COUNTER_DEFS, ESCRS, EVENTS, MSR_BPU_CCCR0, MSR_BPU_COUNTER0, WIDTH};
    let events: Vec<&str> = EVENTS.iter().map(|e| e.name).collect();
    let mut lines = vec![
        format!(
            "NetBurst PMU: {COUNTERS} counters x {WIDTH} bits, each with a CCCR, and {} ESCRs (SDM 18.15); counted by the precise backend: {} (emon events)",
            ESCRS.len(),
            events.join(", ")
        ),
        "  ESCR select -> ESCR, per counter:".to_string(),
    ];
    for (i, d) in (0u32..).zip(&COUNTER_DEFS) {
        let escrs: Vec<String> = (0..)
            .zip(d.escrs)
            .filter_map(|(sel, m)| m.map(|m| format!("{sel}:{}", netburst::msr_name(m).unwrap_or("?"))))
            .collect();
        lines.push(format!(
            "  {} ({:#x}), {} ({:#x}), cascades from counter {}: {}",
            d.name,
            MSR_BPU_COUNTER0 + i,
            d.cccr,
            MSR_BPU_CCCR0 + i,
            d.cascade_from,
            escrs.join(" ")
        ));
    }
    let escrs: Vec<String> = ESCRS.iter().map(|e| format!("{} ({:#X})", e.name, e.msr)).collect();
    lines.push(format!("  ESCRs: {}", escrs.join(", ")));
    lines.push(
        "  T1_OS/T1_USR, OVF_PMI_T1 and the active-thread field: emon runs logical processor 0 only (README, \"The NetBurst PMU\")"
            .to_string(),
    );
    lines
}

/// The LBR stack's MSRs, or their absence.
fn lbr_line(p: &PmuProfile) -> String {
    let Some(l) = p.lbr else {
        return "LBR stack: none (MSR_LASTBRANCH_* #GP)".to_string();
    };
    let last = l.depth - 1;
    let mut text = format!(
        "LBR stack: {} entries, MSR_LASTBRANCH_0-{last}_FROM_IP at 0x{:X}, _TO_IP at 0x{:X}",
        l.depth, l.from, l.to
    );
    if let Some(info) = l.info {
        text += &format!(", MSR_LBR_INFO_0-{last} at 0x{info:X}");
    }
    if l.select != 0 {
        text += &format!(", MSR_LBR_SELECT bits 0x{:X}", l.select);
    }
    text += ", MSR_LER_FROM_LIP/TO_LIP";
    text + "; the precise backend records branches into it, the perf backend does not"
}

/// Whether PEBS is presented, and by which backend.
fn pebs_line(p: &PmuProfile) -> String {
    if p.presents_pebs(true) {
        format!(
            "PEBS format {}: presented under the precise backend, which writes the records (CPUID.01H:EDX.DS and ECX.DTES64 set, IA32_MISC_ENABLE[12] PEBS_UNAVAILABLE clear), where the guest sees CPUID.01H:EDX.DS or with --debug-store on; not under the perf backend",
            p.pebs_format()
        )
    } else if p.version >= 1 && p.pdcm() {
        format!("PEBS format {}: not presented, emon does not write this format (IA32_MISC_ENABLE[12] PEBS_UNAVAILABLE set)", p.pebs_format())
    } else {
        "PEBS: none (no IA32_PERF_CAPABILITIES to name a format)".to_string()
    }
}

/// The model-specific qualifier MSRs the profile has.
fn model_msrs_line(p: &PmuProfile) -> String {
    let m = &p.msrs;
    let named = [
        (m.offcore_rsp[0], "MSR_OFFCORE_RSP_0 (0x1A6)"),
        (m.offcore_rsp[1], "MSR_OFFCORE_RSP_1 (0x1A7)"),
        (m.pebs_ld_lat, "MSR_PEBS_LD_LAT (0x3F6)"),
        (m.pebs_frontend, "MSR_PEBS_FRONTEND (0x3F7)"),
    ];
    let present: Vec<&str> = named.iter().filter(|(b, _)| b.is_some()).map(|&(_, name)| name).collect();
    if present.is_empty() {
        "model-specific event MSRs: none".to_string()
    } else {
        format!("model-specific event MSRs: {}", present.join(", "))
    }
}

/// The fixed-function counters line, including the version 5 ECX bitmap.
fn fixed_line(p: &PmuProfile) -> String {
    if p.version < 2 {
        return "no fixed-function counters (version 1)".to_string();
    }
    let supported: Vec<String> =
        (0..p.fixed_msr_count()).filter(|&i| p.fixed_supported(i)).map(|i| i.to_string()).collect();
    if supported.is_empty() {
        return "no fixed-function counters".to_string();
    }
    let bitmap = if p.version >= 5 {
        format!(" (EDX[4:0]={}, ECX bitmap={:#06b})", p.fixed, p.fixed_bitmap)
    } else {
        String::new()
    };
    format!(
        "{} fixed-function counters x {} bits: IA32_FIXED_CTR{{{}}}{bitmap}",
        supported.len(),
        p.fixed_width,
        supported.join(",")
    )
}

/// IA32_PERF_CAPABILITIES with its architecturally interesting fields.
fn perf_capabilities_line(p: &PmuProfile) -> String {
    if !p.pdcm() {
        return "IA32_PERF_CAPABILITIES: absent (CPUID.01H:ECX.PDCM = 0)".to_string();
    }
    let caps = p.perf_capabilities;
    format!(
        "IA32_PERF_CAPABILITIES = 0x{caps:X}: LBR_FMT {}, PEBS_FMT {}, FW_WRITE {}",
        caps & 0x3F,
        (caps >> 8) & 0xF,
        yes_no(p.fw_write())
    )
}

fn yes_no(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}
