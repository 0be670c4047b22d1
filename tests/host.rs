//! `emon host`: the report prints every section, and its answers agree with each other and with
//! what `emon run` does, whatever host it runs on.
mod common;
use common::*;
use emon::backend::probe::{HARDWARE_EVENTS, SLOTS_SYSFS, SOFTWARE_EVENTS};
use emon::host_report::{ENABLE_PMU, HEADINGS};

fn emon_env(args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_emon"));
    cmd.args(args).envs(env.iter().copied());
    let out = cmd.output().expect("run emon");
    Run {
        status: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// One row of the perf event table: (exclude_host=1 opened, without exclude_host opened, the row).
struct Row {
    guest: bool,
    host: bool,
    text: String,
}

fn row(stdout: &str, name: &str) -> Option<Row> {
    let line = stdout.lines().find(|l| l.starts_with("  ") && l.split_whitespace().next() == Some(name))?;
    // name, type, config, then two outcomes: "yes" or "no: ERRNO (text)".
    let marks: Vec<bool> = line
        .split_whitespace()
        .skip(3)
        .filter_map(|t| match t {
            "yes" => Some(true),
            "no:" => Some(false),
            _ => None,
        })
        .collect();
    assert_eq!(marks.len(), 2, "two outcomes in: {line}");
    Some(Row { guest: marks[0], host: marks[1], text: line.to_owned() })
}

fn section<'a>(stdout: &'a str, heading: &str) -> &'a str {
    let start = stdout.find(&format!("\n{heading}\n")).unwrap_or_else(|| panic!("no section {heading}\n{stdout}"));
    let body = &stdout[start + heading.len() + 2..];
    &body[..body.find("\n\n").unwrap_or(body.len())]
}

fn auto_lines(stdout: &str) -> (String, String) {
    let s = section(stdout, HEADINGS[4]);
    let kind = s.lines().find_map(|l| l.strip_prefix("  chooses: ")).unwrap_or_else(|| panic!("{s}"));
    let why = s.lines().find_map(|l| l.strip_prefix("  why: ")).unwrap_or_else(|| panic!("{s}"));
    (kind.to_owned(), why.to_owned())
}

#[test]
fn host_prints_every_section_and_exits_0() {
    let r = emon(&["host"]);
    r.assert_status(0);
    for h in HEADINGS {
        assert!(r.stdout.lines().any(|l| l == h), "no heading {h}\n{}", r.stdout);
    }
    let kvm = section(&r.stdout, HEADINGS[0]);
    let kvm_usable = std::fs::OpenOptions::new().read(true).write(true).open("/dev/kvm").is_ok();
    if kvm_usable {
        assert!(kvm.contains("  API version 12"), "{kvm}");
        for (_, name, _) in emon::vmm::host::REQUIRED_CAPS {
            assert!(kvm.lines().any(|l| l.split_whitespace().next() == Some(name)), "{name}\n{kvm}");
        }
        assert!(kvm.contains("KVM_CAP_SET_GUEST_DEBUG"), "{kvm}");
        // Whether --guest-time model covers the whole run follows from who runs user mode here.
        let user_in_engine = kvm.contains("  SYSCALL from CPL3: stays at CPL3");
        let whole_run = kvm.contains("  guest time: emon runs all of the guest's code here");
        assert!(kvm.contains("  guest time: ") && whole_run == user_in_engine, "{kvm}");
    } else {
        assert!(kvm.starts_with("  unavailable: "), "{kvm}");
    }
    let cpuid = section(&r.stdout, HEADINGS[3]);
    assert!(cpuid.contains("  vendor: ") && cpuid.contains("leaf 0x0A"), "{cpuid}");
}

#[test]
fn host_without_kvm_still_reports_and_says_what_emon_run_says() {
    let r = emon_env(&["host"], &[("EMON_KVM_DEVICE", "/nonexistent/kvm")]);
    r.assert_status(0);
    let run = emon_env(&["run"], &[("EMON_KVM_DEVICE", "/nonexistent/kvm")]);
    run.assert_status(2);
    let msg = run.stderr.trim().strip_prefix("emon: ").unwrap_or_else(|| panic!("{}", run.stderr));
    assert!(section(&r.stdout, HEADINGS[0]).contains(&format!("  unavailable: {msg}")), "{}\n{msg}", r.stdout);
    for h in HEADINGS {
        assert!(r.stdout.lines().any(|l| l == h), "no heading {h}\n{}", r.stdout);
    }
}

#[test]
fn kvm_vpmu_line_matches_the_module_parameter() {
    let r = emon(&["host"]);
    let s = section(&r.stdout, HEADINGS[1]);
    let want = match std::fs::read_to_string(ENABLE_PMU) {
        Ok(v) => format!("{ENABLE_PMU}: {}", v.trim()),
        Err(_) => format!("{ENABLE_PMU}: absent"),
    };
    assert!(s.contains(&want), "{want}\n{s}");
}

#[test]
fn perf_rows_and_the_auto_choice_agree() {
    let r = emon(&["host"]);
    r.assert_status(0);
    let perf = section(&r.stdout, HEADINGS[2]);
    for e in HARDWARE_EVENTS.iter().chain(&SOFTWARE_EVENTS) {
        assert!(row(perf, e.name).is_some(), "no row for {}\n{perf}", e.name);
    }
    // slots is probed exactly when sysfs describes it (or the report says it could not parse it).
    let slots_file = std::path::Path::new(SLOTS_SYSFS).exists();
    assert_eq!(row(perf, "slots").is_some() || perf.contains("cannot parse"), slots_file, "{perf}");
    assert_eq!(perf.contains("slots: not probed"), !slots_file, "{perf}");

    // auto chooses perf exactly when every generic hardware event opens for the guest, and
    // otherwise names those that did not.
    let (kind, why) = auto_lines(&r.stdout);
    let failing: Vec<&str> = HARDWARE_EVENTS.iter().map(|e| e.name).filter(|n| !row(perf, n).unwrap().guest).collect();
    if failing.is_empty() {
        assert_eq!(kind, "perf", "{why}");
        assert!(why.starts_with("auto: the host counts every architectural event"), "{why}");
    } else {
        assert_eq!(kind, "precise", "{why}");
        assert!(why.starts_with(&format!("auto: the host cannot count {} for the guest", failing.join(", "))), "{why}");
        assert!(why.contains("(perf_event_open with exclude_host: "), "{why}");
        assert_eq!(named_in(&why), failing, "{why}");
    }
}

/// The events the reason says the host cannot count: "auto: the host cannot count a, b for the guest ...".
fn named_in(why: &str) -> Vec<&str> {
    let list = why.split_once("cannot count ").and_then(|(_, l)| l.split_once(" for the guest")).map_or("", |(l, _)| l);
    list.split(", ").collect()
}

#[test]
fn without_a_hardware_pmu_only_software_events_open_and_auto_is_precise() {
    let r = emon(&["host"]);
    let perf = section(&r.stdout, HEADINGS[2]);
    let pmus = perf.lines().find(|l| l.starts_with("  PMUs in ")).unwrap_or_else(|| panic!("{perf}"));
    // The core PMU is "cpu" (or "cpu_core"/"cpu_atom" on hybrid parts).
    if pmus.contains(" cpu (") || pmus.contains(" cpu_") {
        eprintln!("this host has a core PMU ({pmus}): the no-PMU expectations do not apply here");
        return;
    }
    for e in &HARDWARE_EVENTS {
        let row = row(perf, e.name).unwrap();
        assert!(!row.guest && !row.host, "no core PMU, yet {} opened: {}", e.name, row.text);
    }
    let task_clock = row(perf, "task-clock").unwrap();
    let perf_forbidden = ["EACCES", "EPERM", "ENOSYS"].iter().any(|e| task_clock.text.contains(e));
    if !perf_forbidden {
        assert!(task_clock.guest && task_clock.host, "{}", task_clock.text);
    }
    let (kind, why) = auto_lines(&r.stdout);
    assert_eq!(kind, "precise");
    assert!(why.starts_with("auto: the host cannot count cycles, instructions"), "{why}");
    assert!(why.contains("(perf_event_open with exclude_host: "), "{why}");
}

#[test]
fn emon_run_chooses_what_emon_host_reports() {
    if !kvm_available() {
        return;
    }
    let (_, why) = auto_lines(&emon(&["host"]).stdout);
    let r = emon(&["run", "--verbose"]);
    r.assert_status(0);
    let line = r.stderr.lines().find(|l| l.starts_with("emon: backend ")).unwrap_or_else(|| panic!("{}", r.stderr));
    assert!(line.ends_with(&format!(": {why}")), "run: {line}\nhost: {why}");
}

/// Setting the guest's TSC a little ahead of what it reads (a counted stretch whose model clock
/// ended just ahead of real time) either takes, or is reported as impossible, as the far probe
/// `emon host` uses reports it: never reported done while the guest goes on reading the old
/// value, which would make its TSC go backwards (README, "Guest time").
#[test]
fn setting_the_guest_tsc_near_its_value_tells_the_truth() {
    use emon::backend::guest_debug::GuestDebug;
    use emon::backend::kvm::{guest_tsc_settable, KvmCpu};
    use emon::backend::Vcpu;
    if !kvm_available() {
        return;
    }
    let kvm = kvm_ioctls::Kvm::new().unwrap();
    let vm = kvm.create_vm().unwrap();
    let fd = vm.create_vcpu(0).unwrap();
    let mem = vm_memory::GuestMemoryMmap::default();
    let mut cpu = KvmCpu::new(&kvm, fd, GuestDebug::default(), None);
    let mut vcpu = cpu.with(&mem);
    let value = vcpu.guest_tsc().unwrap() + (1 << 19);
    let set = vcpu.set_guest_tsc(value).unwrap();
    let after = vcpu.guest_tsc().unwrap();
    assert_eq!(set, guest_tsc_settable(&kvm).unwrap(), "a near set and the far probe disagree");
    if set {
        assert!(after >= value, "reported set, but the guest's TSC reads {after} < {value}");
    }
}

/// The registers of `leaf`.`subleaf` in `emon cpuid`'s table.
fn table_row(cpuid: &str, leaf: u32, subleaf: u32) -> [u32; 4] {
    let hex = |s: &str| u32::from_str_radix(s.trim_start_matches("0x"), 16).unwrap();
    cpuid
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|w| w.len() == 6 && w[0].starts_with("0x") && hex(w[0]) == leaf && w[1] == subleaf.to_string())
        .map(|w| [hex(w[2]), hex(w[3]), hex(w[4]), hex(w[5])])
        .unwrap_or_else(|| panic!("no row for leaf {leaf:#x}.{subleaf}:\n{cpuid}"))
}

/// A guest's `CPUID.01H: eax=... ebx=... ecx=... edx=...` line.
fn guest_row(stdout: &str, prefix: &str) -> [u32; 4] {
    let line = stdout.lines().find(|l| l.starts_with(prefix)).unwrap_or_else(|| panic!("no {prefix}\n{stdout}"));
    let v: Vec<u32> = line
        .split_whitespace()
        .skip(1)
        .map(|kv| u32::from_str_radix(kv.split_once("=0x").unwrap().1, 16).unwrap())
        .collect();
    [v[0], v[1], v[2], v[3]]
}

/// What `emon cpuid` and the run report say a guest reads through CPUID (the table, except where
/// the probe VM found the host overriding it) is what a guest prints, register for register,
/// under every shipped profile; the run summary mentions the overrides exactly when there are
/// some (README, "CPUID fidelity").
#[test]
fn the_cpuid_probe_says_what_a_guest_reads() {
    if !kvm_available() {
        return;
    }
    // Bits the vCPU's own state decides (the APIC ID, OSXSAVE, the APIC's presence, OSPKE).
    use emon::vmm::cpuid_probe::per_vcpu_state;
    for name in emon::profile::Profile::builtin_names() {
        let table = emon(&["cpuid", "--profile", name]);
        assert_eq!(table.status, 0, "{}", table.stderr);
        let (r, json) = emon_json(&format!("cpuid-{name}"), &["--profile", name, "guest:cpuid-report"]);
        r.assert_status(0);
        let overrides = json["cpuid_overrides"].as_array().expect("cpuid_overrides");
        for (leaf, prefix) in [(1u32, "CPUID.01H: "), (7, "CPUID.07H.0: ")] {
            let mut want = table_row(&table.stdout, leaf, 0);
            for o in overrides.iter().filter(|o| o["leaf"] == leaf && o["subleaf"] == 0) {
                let reg = ["EAX", "EBX", "ECX", "EDX"].iter().position(|r| o["register"] == *r).unwrap();
                want[reg] = o["guest"].as_u64().unwrap() as u32;
            }
            let got = guest_row(&r.stdout, prefix);
            for reg in 0..4 {
                let mask = !per_vcpu_state(leaf, 0, reg);
                assert_eq!(got[reg] & mask, want[reg] & mask, "{name}: leaf {leaf:#x} register {reg}");
            }
        }
        assert_eq!(r.stderr.contains("CPUID: this host overrides"), !overrides.is_empty(), "{name}: {}", r.stderr);
        assert!(!r.stderr.contains("NOT AS PROFILED"), "{name}: the PMU's leaves follow the table here: {}", r.stderr);
    }
}
