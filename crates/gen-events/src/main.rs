//! Generates emon's model-specific event lists from Intel's published event data as Linux 6.1
//! ships it (README, "Model-specific events"). `scripts/gen-events` unpacks what it reads from
//! Debian's `linux-source-6.1` and runs it:
//!
//! ```text
//! cargo run -p emon-pmu --example gen-events -- LINUX_SOURCE_DIR PACKAGE_VERSION
//! ```
//!
//! It reads:
//! - `tools/perf/pmu-events/arch/x86/mapfile.csv`, and `<dir>/*.json` (core events: the metric
//!   and uncore files are left out) for the microarchitectures of [`JSON_LISTS`];
//! - for Core 2, which Linux ships no JSON list for, the tables `intel_pmu_init` uses:
//!   `core2_hw_cache_event_ids` and `intel_core2_event_constraints` (arch/x86/events/intel/core.c),
//!   `intel_core2_pebs_event_constraints` (ds.c), the model numbers of the `case` labels that
//!   select them and their values (arch/x86/include/asm/intel-family.h).
//!
//! and writes `crates/pmu/src/events/lists/*.rs` (the event lists emon-pmu serves) and
//! `guest/src/events.rs` (the encodings the test guests program). Nothing in the output is typed
//! by hand: run it again and the files come out the same.
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The JSON lists emon ships: Linux's directory name, emon's module name, the CPU's name.
const JSON_LISTS: &[(&str, &str, &str)] = &[
    ("nehalemep", "nehalem", "Nehalem"),
    ("sandybridge", "sandybridge", "Sandy Bridge"),
    ("skylake", "skylake", "Skylake"),
    ("icelake", "icelake", "Ice Lake"),
];

/// Core 2's list: emon's module name and the CPU's name.
const CORE2: (&str, &str) = ("core2", "Core 2");

/// Names in Linux's Core 2 comments that are misspelt there, and the SDM's spelling (SDM Vol. 3B,
/// the performance events of processors based on the Intel Core microarchitecture).
const CORE2_SPELLING: &[(&str, &str)] =
    &[("SIMD_INST_RETURED.ANY", "SIMD_INST_RETIRED.ANY"), ("BP_INST_RETIRED.MISPRED", "BR_INST_RETIRED.MISPRED")];

/// One event row, as emon-pmu's `ModelEvent` holds it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Row {
    select: u8,
    /// `None`: every umask of the select (Core 2's counter restrictions).
    umask: Option<u8>,
    cmask: u8,
    inv: bool,
    edge: bool,
    any: bool,
    name: String,
    /// IA32_PERF_GLOBAL_CTRL layout.
    counters: u64,
    pebs: u8,
    msr: Option<(u32, u64)>,
    description: String,
}

/// One microarchitecture's list.
struct List {
    module: &'static str,
    cpu: &'static str,
    source: String,
    models: Vec<u8>,
    rows: Vec<Row>,
}

type Error = String;

fn main() {
    if let Err(e) = run() {
        eprintln!("gen-events: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [linux, version] = &args[..] else {
        return Err("usage: gen-events LINUX_SOURCE_DIR PACKAGE_VERSION".into());
    };
    let linux = PathBuf::from(linux);
    let arch = linux.join("tools/perf/pmu-events/arch/x86");
    let mapfile = read(&arch.join("mapfile.csv"))?;
    let mut lists = vec![core2(&linux, version)?];
    for &(dir, module, cpu) in JSON_LISTS {
        lists.push(json_list(&arch, &mapfile, dir, module, cpu, version)?);
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = root.join("crates/pmu/src/events/lists");
    std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    for l in &lists {
        write(&out.join(format!("{}.rs", l.module)), &pmu_table(l))?;
    }
    write(&out.join("mod.rs"), &pmu_index(&lists))?;
    write(&root.join("guest/src/events.rs"), &guest_table(&lists))?;
    for l in &lists {
        println!("{}: {} events, models {:02X?}", l.module, l.rows.len(), l.models);
    }
    Ok(())
}

fn read(p: &Path) -> Result<String, Error> {
    std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))
}

fn write(p: &Path, text: &str) -> Result<(), Error> {
    std::fs::write(p, text).map_err(|e| format!("{}: {e}", p.display()))
}

fn hex(text: &str) -> Result<u64, Error> {
    let t = text.trim();
    let digits = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")).unwrap_or(t);
    u64::from_str_radix(digits, 16).map_err(|e| format!("'{text}' is not a hexadecimal number: {e}"))
}

fn byte(text: &str) -> Result<u8, Error> {
    u8::try_from(hex(text)?).map_err(|_| format!("'{text}' does not fit 8 bits"))
}

// --- the JSON lists -------------------------------------------------------------------------

/// The family-6 models mapfile.csv gives `dir`, and the list's version there.
fn mapfile_models(mapfile: &str, dir: &str) -> Result<(Vec<u8>, String), Error> {
    for line in mapfile.lines().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        if f.len() < 4 || f[2] != dir || f[3] != "core" {
            continue;
        }
        let pattern = f[0].strip_prefix("GenuineIntel-6-").ok_or_else(|| format!("mapfile.csv: {line}"))?;
        return Ok((expand(pattern)?, f[1].to_string()));
    }
    Err(format!("mapfile.csv has no core list for {dir}"))
}

/// The two-hex-digit models a mapfile pattern matches: `2A`, `1[AEF]` or `(4E|5E|...)`.
fn expand(pattern: &str) -> Result<Vec<u8>, Error> {
    let alternatives: Vec<&str> = match pattern.strip_prefix('(').and_then(|p| p.strip_suffix(')')) {
        Some(inner) => inner.split('|').collect(),
        None => vec![pattern],
    };
    let mut models = Vec::new();
    for a in alternatives {
        match a.split_once('[') {
            Some((head, class)) => {
                let class = class.strip_suffix(']').ok_or_else(|| format!("mapfile pattern {pattern}"))?;
                for c in class.chars() {
                    models.push(byte(&format!("{head}{c}"))?);
                }
            }
            None => models.push(byte(a)?),
        }
    }
    models.sort_unstable();
    Ok(models)
}

fn json_list(
    arch: &Path,
    mapfile: &str,
    dir: &str,
    module: &'static str,
    cpu: &'static str,
    version: &str,
) -> Result<List, Error> {
    let (models, list_version) = mapfile_models(mapfile, dir)?;
    let mut files: Vec<PathBuf> = std::fs::read_dir(arch.join(dir))
        .map_err(|e| format!("{dir}: {e}"))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            name.ends_with(".json") && !name.contains("metrics") && !name.starts_with("uncore")
        })
        .collect();
    files.sort();
    let mut raw = Vec::new();
    for f in &files {
        let v: Value = serde_json::from_str(&read(f)?).map_err(|e| format!("{}: {e}", f.display()))?;
        for e in v.as_array().ok_or_else(|| format!("{}: not a list", f.display()))? {
            raw.push(e.clone());
        }
    }
    // The older lists number the fixed counters from 1 (Nehalem's INST_RETIRED.ANY is "Fixed
    // counter 1"); IA32_FIXED_CTR0 counts INST_RETIRED.ANY (SDM Table 18-2).
    let inst_fixed = raw
        .iter()
        .find(|e| field(e, "EventName") == Some("INST_RETIRED.ANY"))
        .and_then(|e| field(e, "Counter"))
        .and_then(|c| c.strip_prefix("Fixed counter "))
        .ok_or_else(|| format!("{dir}: no INST_RETIRED.ANY on a fixed counter"))?;
    let fixed_base: u32 =
        inst_fixed.trim().parse().map_err(|_| format!("{dir}: INST_RETIRED.ANY on '{inst_fixed}'"))?;
    let mut rows = Vec::new();
    for e in &raw {
        rows.extend(json_rows(e, fixed_base).map_err(|m| format!("{dir}: {m}"))?);
    }
    rows.sort();
    let names: Vec<&str> = files.iter().filter_map(|f| f.file_name()?.to_str()).collect();
    let source = format!(
        "Linux {version} (Debian's linux-source-6.1), tools/perf/pmu-events/arch/x86/{dir}/{{{}}}, list {list_version}",
        names.join(",")
    );
    Ok(List { module, cpu, source, models, rows })
}

fn field<'a>(e: &'a Value, key: &str) -> Option<&'a str> {
    e.get(key).and_then(Value::as_str)
}

fn flag(e: &Value, key: &str) -> bool {
    field(e, key).is_some_and(|v| v.trim() != "0")
}

/// The rows of one JSON event: one per event code (OFFCORE_RESPONSE has two, each with its MSR).
fn json_rows(e: &Value, fixed_base: u32) -> Result<Vec<Row>, Error> {
    let name = field(e, "EventName").ok_or("an event without a name")?.to_string();
    let codes: Vec<u8> = match field(e, "EventCode") {
        Some(c) => c.split(',').map(byte).collect::<Result<_, _>>()?,
        None => vec![0],
    };
    let msr_indices: Vec<u32> = match field(e, "MSRIndex") {
        Some(m) if hex(m.split(',').next().unwrap_or("0"))? != 0 => {
            m.split(',').map(|x| hex(x).map(|v| v as u32)).collect::<Result<_, _>>()?
        }
        _ => Vec::new(),
    };
    let msr_value = field(e, "MSRValue").map(hex).transpose()?.unwrap_or(0);
    let counter = field(e, "Counter").ok_or_else(|| format!("{name}: no Counter"))?;
    let counters = if let Some(i) = counter.strip_prefix("Fixed counter ") {
        let i: u32 = i.trim().parse().map_err(|_| format!("{name}: Counter '{counter}'"))?;
        let i = i.checked_sub(fixed_base).ok_or_else(|| format!("{name}: Counter '{counter}'"))?;
        1u64 << (32 + i)
    } else {
        let mut bits = 0u64;
        for c in counter.split(',').map(str::trim).filter(|c| !c.is_empty()) {
            let i: u32 = c.parse().map_err(|_| format!("{name}: Counter '{counter}'"))?;
            if i >= 8 {
                return Err(format!("{name}: Counter '{counter}' beyond the 8 general-purpose counters"));
            }
            bits |= 1 << i;
        }
        bits
    };
    let description = field(e, "BriefDescription").or_else(|| field(e, "PublicDescription")).unwrap_or("").trim();
    let base = Row {
        select: 0,
        umask: Some(field(e, "UMask").map(byte).transpose()?.unwrap_or(0)),
        cmask: field(e, "CounterMask")
            .map(|c| c.trim().parse().map_err(|_| format!("{name}: CounterMask {c}")))
            .transpose()?
            .unwrap_or(0),
        inv: flag(e, "Invert"),
        edge: flag(e, "EdgeDetect"),
        any: flag(e, "AnyThread"),
        name,
        counters,
        pebs: field(e, "PEBS").map(|p| p.trim().parse().unwrap_or(0)).unwrap_or(0),
        msr: None,
        description: description.to_string(),
    };
    Ok(codes
        .iter()
        .enumerate()
        .map(|(k, &select)| Row {
            select,
            msr: msr_indices.get(k).or(msr_indices.first()).map(|&m| (m, msr_value)),
            ..base.clone()
        })
        .collect())
}

// --- Core 2: Linux's tables ----------------------------------------------------------------

/// The text of the C array `name` (from its declaration to its closing `};`).
fn c_array<'a>(source: &'a str, name: &str, file: &str) -> Result<&'a str, Error> {
    // The declaration: the name, then (perhaps on the next line) its dimensions.
    let start = source
        .match_indices(name)
        .map(|(at, _)| at)
        .find(|&at| source[at + name.len()..].trim_start().starts_with('['))
        .ok_or_else(|| format!("{file}: no array {name}"))?;
    let end = source[start..].find("};").ok_or_else(|| format!("{file}: {name} does not end"))?;
    Ok(&source[start..start + end])
}

/// The comment on a line (`/* NAME */`), trimmed.
fn comment(line: &str) -> Option<&str> {
    let start = line.find("/*")?;
    let end = line[start..].find("*/")?;
    Some(line[start + 2..start + end].trim())
}

/// The arguments of the macro call on `line` (`MACRO(0x10, 0x1)`), if it calls `mac`.
fn call_args<'a>(line: &'a str, mac: &str) -> Option<Vec<&'a str>> {
    let rest = line.trim_start().strip_prefix(mac)?.strip_prefix('(')?;
    let inner = &rest[..rest.find(')')?];
    Some(inner.split(',').map(str::trim).collect())
}

/// An event name from a Linux comment: the name before any note, spelt as the SDM spells it.
fn core2_name(comment: &str) -> String {
    let name = comment.split([',', ' ']).next().unwrap_or(comment).trim();
    CORE2_SPELLING.iter().find(|(linux, _)| *linux == name).map_or(name, |(_, sdm)| sdm).to_string()
}

/// A raw config's PERFEVTSEL fields (event, umask, edge, inv, cmask).
fn config_row(config: u64, name: String, counters: u64, description: &str) -> Row {
    Row {
        select: config as u8,
        umask: Some((config >> 8) as u8),
        cmask: (config >> 24) as u8,
        inv: config >> 23 & 1 == 1,
        edge: config >> 18 & 1 == 1,
        any: config >> 21 & 1 == 1,
        name,
        counters,
        pebs: 0,
        msr: None,
        description: description.into(),
    }
}

/// Every general-purpose counter: Linux's Core 2 constraints name only the events restricted to
/// some of them.
const ALL_GP: u64 = 0xFF;

fn core2(linux: &Path, version: &str) -> Result<List, Error> {
    let core_c = read(&linux.join("arch/x86/events/intel/core.c"))?;
    let ds_c = read(&linux.join("arch/x86/events/intel/ds.c"))?;
    let family_h = read(&linux.join("arch/x86/include/asm/intel-family.h"))?;
    // By encoding and whether it is a fixed counter's (whose pseudo-encoding may equal a GP one's).
    let mut rows: BTreeMap<(u8, Option<u8>, u8, bool, bool), Row> = BTreeMap::new();
    // Counter restrictions by event select (any umask), and the fixed counters.
    let mut restricted: BTreeMap<u8, u64> = BTreeMap::new();
    for line in c_array(&core_c, "intel_core2_event_constraints", "core.c")?.lines() {
        let Some(name) = comment(line) else { continue };
        if let Some(a) = call_args(line, "INTEL_EVENT_CONSTRAINT") {
            let (select, counters) = (byte(a[0])?, hex(a[1])?);
            restricted.insert(select, counters);
            let description = "counts only on the counters Linux 6.1's intel_core2_event_constraints gives it";
            let row =
                Row { umask: None, counters, ..config_row(u64::from(select), core2_name(name), counters, description) };
            rows.insert((select, None, 0, false, false), row);
        } else if let Some(a) = call_args(line, "FIXED_EVENT_CONSTRAINT") {
            let (config, fixed) = (hex(a[0])?, hex(a[1])?);
            let row = config_row(config, core2_name(name), 1 << (32 + fixed), "fixed-function counter");
            rows.insert((row.select, row.umask, 0, false, true), row);
        }
    }
    let restriction = |select: u8| restricted.get(&select).copied().unwrap_or(ALL_GP);
    for line in c_array(&core_c, "core2_hw_cache_event_ids", "core.c")?.lines() {
        let (Some(name), Some((_, value))) = (comment(line), line.split_once('=')) else { continue };
        if name.contains("(alias)") {
            continue;
        }
        let config = hex(value.split(',').next().unwrap_or(""))?;
        let row = config_row(
            config,
            core2_name(name),
            restriction(config as u8),
            "generic cache event (Linux 6.1's core2_hw_cache_event_ids)",
        );
        rows.entry((row.select, row.umask, 0, false, false)).or_insert(row);
    }
    let mut previous_comment = None;
    for line in c_array(&ds_c, "intel_core2_pebs_event_constraints", "ds.c")?.lines() {
        let own = comment(line);
        let args = call_args(line, "INTEL_FLAGS_UEVENT_CONSTRAINT")
            .or_else(|| call_args(line, "INTEL_FLAGS_EVENT_CONSTRAINT"));
        let Some(a) = args else {
            previous_comment = own;
            continue;
        };
        let name = own.or(previous_comment).ok_or_else(|| format!("ds.c: no name for {line}"))?;
        let config = hex(a[0])?;
        let whole_select = line.trim_start().starts_with("INTEL_FLAGS_EVENT_CONSTRAINT");
        let mut row = config_row(
            config,
            core2_name(name),
            restriction(config as u8),
            "PEBS event (Linux 6.1's intel_core2_pebs_event_constraints)",
        );
        if whole_select {
            row.umask = None;
        }
        row.pebs = 1;
        let key = (row.select, row.umask, row.cmask, row.inv, false);
        rows.entry(key).and_modify(|r| r.pebs = 1).or_insert(row);
        previous_comment = None;
    }
    // The models intel_pmu_init gives these tables: the case labels before their memcpy.
    let memcpy = core_c
        .lines()
        .position(|l| l.contains("memcpy(hw_cache_event_ids, core2_hw_cache_event_ids"))
        .ok_or("core.c: core2_hw_cache_event_ids is not installed")?;
    let lines: Vec<&str> = core_c.lines().collect();
    let mut labels = Vec::new();
    for l in lines[..memcpy].iter().rev() {
        if l.contains("break;") {
            break;
        }
        if let Some(label) = l.trim().strip_prefix("case ").and_then(|c| c.strip_suffix(':')) {
            labels.push(label.trim());
        }
    }
    let mut models = Vec::new();
    for label in &labels {
        let value = family_h
            .lines()
            .find_map(|l| l.strip_prefix("#define ").and_then(|d| d.strip_prefix(label)).map(str::trim))
            .ok_or_else(|| format!("intel-family.h: no {label}"))?;
        models.push(byte(value.split_whitespace().next().unwrap_or(value))?);
    }
    models.sort_unstable();
    let source = format!(
        "Linux {version} (Debian's linux-source-6.1), which ships no JSON list for Core 2: arch/x86/events/intel/core.c \
         (core2_hw_cache_event_ids, intel_core2_event_constraints; models {}) and ds.c (intel_core2_pebs_event_constraints)",
        labels.iter().rev().copied().collect::<Vec<_>>().join(", ")
    );
    Ok(List { module: CORE2.0, cpu: CORE2.1, source, models, rows: rows.into_values().collect() })
}

// --- output -----------------------------------------------------------------------------------

const HEADER: &str = "Generated by scripts/gen-events (crates/gen-events): do not edit.";

fn pmu_table(l: &List) -> String {
    let mut s = format!("//! The {} event list. {HEADER}\n//!\n//! Source: {}.\n", l.cpu, l.source);
    s += "use super::super::{EventList, ModelEvent as E};\n\n";
    let _ = writeln!(s, "#[rustfmt::skip]\npub static LIST: EventList = EventList {{");
    let _ = writeln!(s, "    name: {:?},\n    cpu: {:?},\n    source: {:?},", l.module, l.cpu, l.source);
    let _ =
        writeln!(s, "    models: &[{}],", l.models.iter().map(|m| format!("0x{m:02X}")).collect::<Vec<_>>().join(", "));
    s += "    events: &[\n";
    for r in &l.rows {
        let umask = r.umask.map_or("None".to_string(), |u| format!("Some(0x{u:02X})"));
        let msr = r.msr.map_or("None".to_string(), |(m, v)| format!("Some((0x{m:X}, 0x{v:X}))"));
        let _ = writeln!(
            s,
            "        E {{ name: {:?}, select: 0x{:02X}, umask: {umask}, cmask: {}, inv: {}, edge: {}, any: {}, counters: 0x{:X}, pebs: {}, msr: {msr}, description: {:?} }},",
            r.name, r.select, r.cmask, r.inv, r.edge, r.any, r.counters, r.pebs, r.description
        );
    }
    s += "    ],\n};\n";
    s
}

fn pmu_index(lists: &[List]) -> String {
    let mut s = format!("//! The event lists emon ships, one module each. {HEADER}\n");
    let mut modules: Vec<&str> = lists.iter().map(|l| l.module).collect();
    modules.sort_unstable();
    for m in modules {
        let _ = writeln!(s, "mod {m};");
    }
    let _ = writeln!(s, "\n/// How many lists there are.\npub const COUNT: usize = {};", lists.len());
    s += "\n/// Every list, in the order of the CPUs' generations.\n#[rustfmt::skip]\npub static LISTS: [&super::EventList; COUNT] = [\n";
    for l in lists {
        let _ = writeln!(s, "    &{}::LIST,", l.module);
    }
    s += "];\n";
    s
}

/// The guests' table: for each list, its models and the encodings a guest can program on a
/// general-purpose counter (no qualifier MSR, one umask), without descriptions.
fn guest_table(lists: &[List]) -> String {
    let mut s = format!(
        "//! Model-specific event encodings for the test guests, by CPU (family 6 models), from the lists\n//! emon-pmu ships (README, \"Model-specific events\"). {HEADER}\n\n"
    );
    s += "/// One event: its name, PERFEVTSEL's event select, umask, CMASK, INV and EDGE, and the\n/// general-purpose counters it may use (bit i: IA32_PMCi).\n";
    s += "#[derive(Debug, Clone, Copy, PartialEq, Eq)]\npub struct Event {\n    pub name: &'static str,\n    pub select: u8,\n    pub umask: u8,\n    pub cmask: u8,\n    pub inv: bool,\n    pub edge: bool,\n    pub counters: u8,\n}\n\n";
    s += "/// One CPU's list: its name, the family 6 models that have it, its events.\npub struct List {\n    pub name: &'static str,\n    pub models: &'static [u8],\n    pub events: &'static [Event],\n}\n\n";
    s += "#[rustfmt::skip]\npub static LISTS: &[List] = &[\n";
    for l in lists {
        let models = l.models.iter().map(|m| format!("0x{m:02X}")).collect::<Vec<_>>().join(", ");
        let _ = writeln!(s, "    List {{ name: {:?}, models: &[{models}], events: &[", l.module);
        for r in l.rows.iter().filter(|r| r.msr.is_none() && r.counters & 0xFF != 0) {
            let Some(umask) = r.umask else { continue };
            let _ = writeln!(
                s,
                "        Event {{ name: {:?}, select: 0x{:02X}, umask: 0x{umask:02X}, cmask: {}, inv: {}, edge: {}, counters: 0x{:02X} }},",
                r.name, r.select, r.cmask, r.inv, r.edge, r.counters & 0xFF
            );
        }
        s += "    ] },\n";
    }
    s += "];\n";
    s
}
