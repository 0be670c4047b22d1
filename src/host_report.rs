//! `emon host`: what this host offers emon, in one look (for a CI runner): KVM and the
//! capabilities emon uses, KVM's own vPMU, which host perf events open, the host's CPUID leaf
//! 0x0A, and which backend `--backend auto` chooses and why.
//!
//! The report is gathered by [`HostReport::gather`] and printed through its `Display`. A host
//! without a usable /dev/kvm is part of the report (its KVM section says why, with the message
//! `emon run` gives), not an error: `emon host` exits 0 whenever it printed the report.
use crate::backend::perf;
use crate::backend::probe::{self, HostEvent};
use crate::backend::BackendKind;
use crate::profile::{PmuProfile, ARCH_EVENTS};
use crate::vmm::{self, VmmError};
use kvm_ioctls::{Cap, Kvm};
use std::fmt;
use std::io;
use std::process::ExitCode;

/// The section headings, in order.
pub const HEADINGS: [&str; 5] =
    ["KVM", "KVM's own vPMU", "Host perf events", "Host CPUID", "Backend chosen by --backend auto"];

/// Capabilities emon can do without but benefits from: (capability, name, what for).
/// `None` is KVM_CAP_PMU_CAPABILITY, which kvm-ioctls has no `Cap` for; its value is shown.
pub const OPTIONAL_CAPS: &[(Option<Cap>, &str, &str)] = &[
    (
        Some(Cap::SetGuestDebug),
        "KVM_CAP_SET_GUEST_DEBUG",
        "the precise backend single-steps the guest; a breakpoint on the guest's #GP handler completes RDPMC",
    ),
    (Some(Cap::UserNmi), "KVM_CAP_USER_NMI", "PMIs the guest routes as NMIs (KVM_NMI)"),
    (Some(Cap::SignalMsi), "KVM_CAP_SIGNAL_MSI", "raising an interrupt without a LAPIC round trip (not used yet)"),
    (None, "KVM_CAP_PMU_CAPABILITY", "non-zero: KVM's own vPMU is on and can be disabled per VM"),
    (
        Some(Cap::SyncRegs),
        "KVM_CAP_SYNC_REGS",
        "the guest's IDTR and registers in kvm_run at every exit, for the #GP handler's breakpoint",
    ),
    (Some(Cap::ImmediateExit), "KVM_CAP_IMMEDIATE_EXIT", "stopping the vCPU on a timeout, Ctrl-C or perf overflow"),
];

/// KVM's module parameter for its in-kernel vPMU.
pub const ENABLE_PMU: &str = "/sys/module/kvm/parameters/enable_pmu";
/// The host's perf event sources.
pub const PMU_DIR: &str = "/sys/bus/event_source/devices";
pub const PARANOID: &str = "/proc/sys/kernel/perf_event_paranoid";

/// Everything `emon host` prints.
#[derive(Debug)]
pub struct HostReport {
    /// The running kernel's release (uname -r).
    pub kernel: Option<String>,
    pub kvm: KvmReport,
    /// The content of [`ENABLE_PMU`] ("Y", "N"), None if absent.
    pub enable_pmu: Option<String>,
    pub perf: PerfReport,
    pub cpuid: CpuidReport,
    /// What `--backend auto` chooses, and why ([`probe::auto_choice`], as `emon run` does).
    pub auto: (BackendKind, String),
}

#[derive(Debug)]
pub enum KvmReport {
    /// /dev/kvm could not be opened: the message `emon run` gives.
    Unavailable(String),
    Open {
        api_version: i32,
        caps: Vec<CapState>,
        /// KVM can put a hardware instruction breakpoint in a guest (KVM_GUESTDBG_USE_HW_BP):
        /// RDPMC outside counted code is completed at the guest's #GP handler.
        hw_breakpoints: bool,
        /// `emon run`'s message if a required capability is missing.
        error: Option<String>,
        /// Whether a VMM can set the guest's TSC here (README, "Guest time"), or why not known.
        guest_tsc: Result<bool, String>,
        /// How fast KVM runs CPL0 guest code (README, "CPL0 code in the TCG engine").
        cpl0: Result<vmm::exec_probe::Cpl0Speed, String>,
        /// Whether KVM keeps single-stepping across a KVM_SET_REGS that moves RIP.
        step_survives_set_regs: Result<bool, String>,
        /// Whether SYSCALL from CPL3 enters the kernel here (README, "User mode (CPL3)").
        syscall: Result<bool, String>,
        /// Per shipped profile, where a guest's CPUID differs from the table emon sets (README,
        /// "CPUID fidelity"), or why the probe failed.
        cpuid: Vec<(&'static str, Result<Vec<vmm::cpuid_probe::Override>, String>)>,
    },
}

/// One capability and what KVM_CHECK_EXTENSION returned for it.
#[derive(Debug, Clone)]
pub struct CapState {
    pub name: &'static str,
    pub required: bool,
    pub value: i32,
    pub why: &'static str,
    /// Show the value itself rather than yes/no.
    pub show_value: bool,
}

#[derive(Debug)]
pub struct PerfReport {
    /// /proc/sys/kernel/perf_event_paranoid.
    pub paranoid: Option<String>,
    pub root: bool,
    /// (name, perf type) of each PMU in [`PMU_DIR`].
    pub pmus: Vec<(String, Option<u32>)>,
    pub events: Vec<EventProbe>,
    /// Why there is no slots row, when there is none.
    pub slots_note: Option<String>,
}

/// One event opened on the calling thread with and without exclude_host.
#[derive(Debug)]
pub struct EventProbe {
    pub event: HostEvent,
    pub exclude_host: io::Result<()>,
    pub plain: io::Result<()>,
}

#[derive(Debug)]
pub struct CpuidReport {
    pub vendor: String,
    pub max_leaf: u32,
    /// CPUID.01H:ECX[31].
    pub hypervisor: bool,
    /// `[eax, ebx, ecx, edx]` of leaf 0x0A, None when the max leaf is below 0x0A.
    pub leaf_0a: Option<[u32; 4]>,
    /// The host CPU's model-specific event list (README, "Model-specific events"), if emon
    /// ships one: the perf backend passes a profile's model-specific events to the host only
    /// when the lists are the same.
    pub events: Option<&'static str>,
}

impl HostReport {
    /// Probes this host. The perf probes run on the calling thread.
    pub fn gather() -> HostReport {
        let perf = PerfReport::gather();
        let auto = probe::auto_choice(&perf::host_caps(false));
        HostReport {
            kernel: read_trimmed("/proc/sys/kernel/osrelease"),
            kvm: KvmReport::gather(),
            enable_pmu: read_trimmed(ENABLE_PMU),
            perf,
            cpuid: CpuidReport::gather(),
            auto,
        }
    }
}

fn read_trimmed(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok().map(|s| s.trim().to_owned())
}

impl KvmReport {
    fn gather() -> KvmReport {
        let (kvm, error) = match vmm::host::open() {
            Ok(kvm) => (kvm, None),
            Err(e @ VmmError::MissingCap { .. }) => {
                // Open it anyway to show what it does have.
                let path = std::env::var(vmm::host::KVM_DEVICE_ENV).unwrap_or_else(|_| vmm::host::KVM_PATH.into());
                let kvm = std::ffi::CString::new(path).ok().and_then(|p| Kvm::new_with_path(&p).ok());
                match kvm {
                    Some(kvm) => (kvm, Some(e.to_string())),
                    None => return KvmReport::Unavailable(e.to_string()),
                }
            }
            Err(e) => return KvmReport::Unavailable(e.to_string()),
        };
        let required = vmm::host::REQUIRED_CAPS.iter().map(|&(cap, name, why)| CapState {
            name,
            required: true,
            value: kvm.check_extension_int(cap),
            why,
            show_value: false,
        });
        let optional = OPTIONAL_CAPS
            .iter()
            .filter(|(_, name, _)| !vmm::host::REQUIRED_CAPS.iter().any(|(_, n, _)| n == name))
            .map(|&(cap, name, why)| {
                let value = match cap {
                    Some(cap) => kvm.check_extension_int(cap),
                    None => kvm.check_extension_raw(kvm_bindings::KVM_CAP_PMU_CAPABILITY.into()),
                };
                CapState { name, required: false, value, why, show_value: cap.is_none() }
            });
        let guest_tsc = crate::backend::kvm::guest_tsc_settable(&kvm).map_err(|e| e.to_string());
        let cpl0 = vmm::exec_probe::cpl0().map_err(|e| e.to_string());
        let step_survives_set_regs = vmm::exec_probe::step_survives_set_regs().map_err(|e| e.to_string());
        let syscall = vmm::exec_probe::syscall_enters_kernel().map_err(|e| e.to_string());
        let tsc = vmm::tsc_rate::TscRate::of_host(&kvm).map_err(|e| e.to_string());
        let cpuid = crate::profile::Profile::builtin_names()
            .into_iter()
            .map(|name| {
                let probed = crate::profile::Profile::load(name)
                    .map_err(|e| e.to_string())
                    // The table as the precise backend presents it (with the Debug Store, for BTS
                    // and PEBS, wherever the profile has architectural perfmon).
                    .and_then(|p| {
                        let tsc = tsc.clone()?;
                        vmm::guest_cpuid(&kvm, &p, p.pmu.version >= 1, tsc).map_err(|e| e.to_string())
                    })
                    .and_then(|table| vmm::cpuid_probe::probe(&kvm, &table).map_err(|e| e.to_string()));
                (name, probed)
            })
            .collect();
        KvmReport::Open {
            cpuid,
            api_version: kvm.get_api_version(),
            caps: required.chain(optional).collect(),
            error,
            guest_tsc,
            cpl0,
            step_survives_set_regs,
            syscall,
            hw_breakpoints: vmm::rdpmc::hardware_breakpoints(&kvm),
        }
    }
}

impl PerfReport {
    fn gather() -> PerfReport {
        let mut pmus: Vec<(String, Option<u32>)> = std::fs::read_dir(PMU_DIR)
            .into_iter()
            .flatten()
            .flatten()
            .map(|d| {
                let name = d.file_name().to_string_lossy().into_owned();
                let ty = read_trimmed(&format!("{PMU_DIR}/{name}/type")).and_then(|t| t.parse().ok());
                (name, ty)
            })
            .collect();
        pmus.sort();
        let slots_note = match std::fs::read_to_string(probe::SLOTS_SYSFS) {
            Ok(text) => perf::parse_event_config(&text)
                .is_none()
                .then(|| format!("slots: {} reads {:?}, which emon cannot parse", probe::SLOTS_SYSFS, text.trim())),
            Err(e) => Some(format!("slots: not probed, {}: {}", probe::SLOTS_SYSFS, probe::errno_text(&e))),
        };
        let events = probe::host_events()
            .into_iter()
            .map(|event| EventProbe {
                event,
                exclude_host: probe::probe(&event, true),
                plain: probe::probe(&event, false),
            })
            .collect();
        PerfReport {
            paranoid: read_trimmed(PARANOID),
            // SAFETY: geteuid has no preconditions.
            root: unsafe { libc::geteuid() } == 0,
            pmus,
            events,
            slots_note,
        }
    }
}

impl CpuidReport {
    fn gather() -> CpuidReport {
        let max_leaf = cpuid(0, 0)[0];
        CpuidReport {
            // The vendor the perf backend compares with the profile's before passing raw events.
            vendor: perf::host_vendor(),
            max_leaf,
            hypervisor: max_leaf >= 1 && cpuid(1, 0)[2] & (1 << 31) != 0,
            leaf_0a: (max_leaf >= 0xA).then(|| cpuid(0xA, 0)),
            events: perf::host_events().map(|l| l.cpu),
        }
    }

    /// Leaf 0x0A decoded, one line each.
    pub fn leaf_0a_lines(&self) -> Vec<String> {
        let Some([eax, ebx, ecx, edx]) = self.leaf_0a else {
            return vec![format!("leaf 0x0A: not reported (max basic leaf {:#x})", self.max_leaf)];
        };
        let p = PmuProfile {
            version: eax as u8,
            gp: (eax >> 8) as u8,
            gp_width: (eax >> 16) as u8,
            ebx_length: (eax >> 24) as u8,
            ebx_unavailable: ebx,
            fixed: (edx & 0x1F) as u8,
            fixed_width: (edx >> 5) as u8,
            fixed_bitmap: ecx,
            ..PmuProfile::default()
        };
        let mut lines = vec![format!("leaf 0x0A: EAX={eax:#010x} EBX={ebx:#010x} ECX={ecx:#010x} EDX={edx:#010x}")];
        if p.version == 0 {
            lines.push("version 0: no architectural performance monitoring".into());
            return lines;
        }
        lines.push(format!("version {}", p.version));
        lines.push(format!("general-purpose counters: {} x {} bits", p.gp, p.gp_width));
        let fixed: Vec<String> =
            (0..p.fixed_msr_count()).filter(|&i| p.fixed_supported(i)).map(|i| i.to_string()).collect();
        lines.push(if fixed.is_empty() {
            "fixed-function counters: none".into()
        } else {
            format!(
                "fixed-function counters: {} x {} bits (IA32_FIXED_CTR{{{}}})",
                fixed.len(),
                p.fixed_width,
                fixed.join(",")
            )
        });
        let unavailable: Vec<&str> = ARCH_EVENTS
            .iter()
            .filter(|e| e.bit < p.ebx_length && !p.arch_event_available(e.bit))
            .map(|e| e.name)
            .collect();
        lines.push(format!(
            "EBX length {}; unavailable events: {}",
            p.ebx_length,
            if unavailable.is_empty() { "none".into() } else { unavailable.join(", ") }
        ));
        lines
    }
}

fn cpuid(leaf: u32, sub: u32) -> [u32; 4] {
    // SAFETY: CPUID exists on every x86_64 CPU. (The intrinsic is safe in newer Rust.)
    #[allow(unused_unsafe)]
    let r = unsafe { std::arch::x86_64::__cpuid_count(leaf, sub) };
    [r.eax, r.ebx, r.ecx, r.edx]
}

fn outcome(r: &io::Result<()>) -> String {
    match r {
        Ok(()) => "yes".into(),
        Err(e) => format!("no: {}", probe::errno_text(e)),
    }
}

impl fmt::Display for HostReport {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let [h_kvm, h_vpmu, h_perf, h_cpuid, h_auto] = HEADINGS;
        writeln!(f, "emon host report (Linux {})", self.kernel.as_deref().unwrap_or("?"))?;
        writeln!(f)?;
        writeln!(f, "{h_kvm}")?;
        match &self.kvm {
            KvmReport::Unavailable(msg) => writeln!(f, "  unavailable: {msg}")?,
            KvmReport::Open {
                api_version,
                caps,
                error,
                guest_tsc,
                cpl0,
                step_survives_set_regs,
                syscall,
                cpuid,
                ..
            } => {
                writeln!(f, "  API version {api_version}")?;
                if let Some(e) = error {
                    writeln!(f, "  emon run cannot use it: {e}")?;
                }
                for c in caps {
                    let value = match (c.show_value, c.value > 0) {
                        (true, _) => c.value.to_string(),
                        (false, true) => "yes".into(),
                        (false, false) => "no".into(),
                    };
                    let kind = if c.required { "required" } else { "optional" };
                    writeln!(f, "  {:<27} {value:<4} {kind}: {}", c.name, c.why)?;
                }
                let tsc = match guest_tsc {
                    Ok(true) => "can be set (KVM_VCPU_TSC_OFFSET): after counted code it goes on from the model's TSC".into(),
                    Ok(false) => "cannot be set (KVM_VCPU_TSC_OFFSET has no effect): after counted code it rejoins real time, a jump forward that the run summary reports".into(),
                    Err(e) => format!("unknown ({e})"),
                };
                writeln!(f, "  guest TSC: {tsc} (README, \"Guest time\")")?;
                match cpl0 {
                    Ok(s) if s.emulated() => writeln!(
                        f,
                        "  {}: with --cpl0 auto (the default) the precise backend runs it in the TCG engine (README, \"CPL0 code in the TCG engine\")",
                        s.describe()
                    )?,
                    Ok(s) => writeln!(f, "  {}: --cpl0 auto leaves it to KVM", s.describe())?,
                    Err(e) => writeln!(f, "  CPL0 guest code: speed unknown ({e})")?,
                }
                let step = match step_survives_set_regs {
                    Ok(true) => "goes on after KVM_SET_REGS moves RIP".into(),
                    Ok(false) => "stops after KVM_SET_REGS moves RIP (KVM keeps its trap flag at one RIP): emon sets guest debugging again after each such write".into(),
                    Err(e) => format!("unknown ({e})"),
                };
                writeln!(f, "  single-stepping: {step} (README, \"Registers between exits\")")?;
                let model_time = match syscall {
                    Ok(false) => "emon runs all of the guest's code here, so with --guest-time model the guest's TSC and deadline timer follow the model clock for the whole run",
                    Ok(true) => "KVM runs the guest's code here where nothing counts, so --guest-time model follows the model clock only where something counts, as the default does",
                    Err(_) => "unknown (see SYSCALL from CPL3)",
                };
                let syscall = match syscall {
                    Ok(true) => "enters the kernel (measured): user mode runs in KVM while nothing counts".into(),
                    Ok(false) => "stays at CPL3 at IA32_LSTAR (measured): the precise backend runs user mode in the TCG engine, completes SYSCALL and INT n itself, delivers user-mode faults and the interrupts due at user-mode boundaries, and the guest is not told of AVX and the other instruction sets the engine lacks; a user-mode instruction it cannot run goes to KVM, which cannot step it here, and the run summary says NOT EXACT; emon takes user code's own single-step traps (RFLAGS.TF) and makes the guest's breakpoints (DR0-DR3) fire".into(),
                    Err(e) => format!("unknown ({e})"),
                };
                writeln!(f, "  SYSCALL from CPL3: {syscall} (README, \"User mode (CPL3)\")")?;
                writeln!(f, "  guest time: {model_time} (README, \"Guest time\")")?;
                write_cpuid_fidelity(f, cpuid)?;
            }
        }
        writeln!(f)?;
        writeln!(f, "{h_vpmu}")?;
        let vpmu = match self.enable_pmu.as_deref() {
            Some("Y") | Some("1") => "Y (on; emon traps the PMU MSRs and hides it from its guests)".to_string(),
            Some("N") | Some("0") => "N (off)".to_string(),
            Some(other) => other.to_string(),
            None => "absent (no such parameter: kvm not loaded, or an older kernel)".to_string(),
        };
        writeln!(f, "  {ENABLE_PMU}: {vpmu}")?;
        writeln!(f)?;
        writeln!(f, "{h_perf}")?;
        let p = &self.perf;
        let paranoid = p.paranoid.as_deref().unwrap_or("absent");
        let who = if p.root {
            "running as root"
        } else {
            "not root: at 2 or more, counting kernel mode (the guest's OS mode too) is denied with EACCES"
        };
        writeln!(f, "  perf_event_paranoid: {paranoid} ({who})")?;
        let pmus: Vec<String> = p
            .pmus
            .iter()
            .map(|(name, ty)| match ty {
                Some(t) => format!("{name} (type {t})"),
                None => name.clone(),
            })
            .collect();
        writeln!(f, "  PMUs in {PMU_DIR}: {}", if pmus.is_empty() { "none".into() } else { pmus.join(", ") })?;
        writeln!(f, "  perf_event_open on this thread (pid 0, cpu -1), opened then closed:")?;
        writeln!(
            f,
            "  {:<20} {:<9} {:<7} {:<44} without exclude_host",
            "event", "type", "config", "exclude_host=1 (counting the guest)"
        )?;
        for e in &p.events {
            writeln!(
                f,
                "  {:<20} {:<9} {:<7} {:<44} {}",
                e.event.name,
                e.event.type_name(),
                format!("{:#x}", e.event.config),
                outcome(&e.exclude_host),
                outcome(&e.plain)
            )?;
        }
        if let Some(note) = &p.slots_note {
            writeln!(f, "  {note}")?;
        }
        writeln!(f, "  (software clocks accept exclude_host but count the thread's time, guest and host alike)")?;
        writeln!(f)?;
        writeln!(f, "{h_cpuid}")?;
        let c = &self.cpuid;
        writeln!(
            f,
            "  vendor: {} (max basic leaf {:#x}; hypervisor bit: {})",
            c.vendor,
            c.max_leaf,
            if c.hypervisor { "set" } else { "clear" }
        )?;
        for line in c.leaf_0a_lines() {
            writeln!(f, "  {line}")?;
        }
        match c.events {
            Some(cpu) => writeln!(
                f,
                "  model-specific events: {cpu}'s list; --backend perf counts a profile's model-specific events here only for a {cpu} profile"
            )?,
            None => writeln!(
                f,
                "  model-specific events: none of the lists emon ships (Core 2, Nehalem, Sandy Bridge, Skylake, Ice Lake); --backend perf counts no profile's model-specific events here (README, \"The perf backend\")"
            )?,
        }
        writeln!(f)?;
        writeln!(f, "{h_auto}")?;
        let (kind, why) = &self.auto;
        let kind = match kind {
            BackendKind::Auto => "auto",
            BackendKind::Precise => "precise",
            BackendKind::Perf => "perf",
        };
        writeln!(f, "  chooses: {kind}")?;
        writeln!(f, "  why: {why}")?;
        let engine = match crate::backend::precise::Engine::DEFAULT {
            crate::backend::precise::Engine::Tcg => {
                "the TCG engine (built in), single-stepping what must go through KVM"
            }
            crate::backend::precise::Engine::Step => "single-stepping (this build has no TCG engine)",
        };
        writeln!(f, "  precise backend runs counted code with: {engine}")?;
        writeln!(
            f,
            "  user-mode (CPL3) code counts exactly in the TCG engine; where KVM cannot single-step CPL3 code (kvm_pvm), what the engine hands back at CPL3 is not counted, and the run summary says NOT EXACT"
        )?;
        for name in crate::profile::Profile::builtin_names() {
            if let Some(only) = crate::profile::Profile::load(name).ok().and_then(|p| p.pmu.precise_only()) {
                writeln!(f, "  {}", only.host)?;
            }
        }
        let rdpmc = match &self.kvm {
            KvmReport::Open { hw_breakpoints: true, .. } => {
                "completed at the guest's #GP handler (a hardware instruction breakpoint there, KVM_GUESTDBG_USE_HW_BP), under either backend; emulated while the precise backend single-steps"
            }
            KvmReport::Open { hw_breakpoints: false, .. } => {
                "not available: this KVM cannot put hardware breakpoints in a guest, so RDPMC outside counted code gets KVM's #GP (the run summary says so); emulated while the precise backend single-steps"
            }
            KvmReport::Unavailable(_) => "unknown (no KVM)",
        };
        writeln!(f, "  RDPMC outside counted code: {rdpmc}")
    }
}

/// `emon host`: prints the report and exits 0 (KVM's absence is part of the report); 2
/// ([`crate::status::ERROR`]) only if stdout cannot be written (a closed pipe is fine).
/// The CPUID probe's findings: whether each profile's PMU reaches the guest as set, and every
/// register the host overrides under the default profile.
fn write_cpuid_fidelity(
    f: &mut fmt::Formatter,
    cpuid: &[(&str, Result<Vec<vmm::cpuid_probe::Override>, String>)],
) -> fmt::Result {
    for (name, probed) in cpuid {
        match probed {
            Err(e) => writeln!(f, "  guest CPUID under {name}: not probed ({e})")?,
            Ok(o) if o.is_empty() => writeln!(f, "  guest CPUID under {name}: exactly the table")?,
            Ok(o) => {
                let profiled = o.iter().filter(|o| o.touches_the_profile()).count();
                let bits: u32 = o.iter().map(|o| o.bits()).sum();
                let pmu = if profiled == 0 {
                    "the vendor, signature, caches, PDCM, leaf 0x0A and leaves 0x15 and 0x16 follow it".to_string()
                } else {
                    format!("{profiled} of them in what the profile sets: emon cannot present this profile here")
                };
                writeln!(
                    f,
                    "  guest CPUID under {name}: {bits} bits in {} registers differ from the table; {pmu}",
                    o.len()
                )?;
            }
        }
    }
    if let Some((name, Ok(o))) = cpuid.iter().find(|(n, _)| *n == crate::profile::Profile::DEFAULT) {
        for o in o {
            writeln!(f, "    {name}: {}", o.describe())?;
        }
    }
    Ok(())
}

pub fn run() -> ExitCode {
    use std::io::Write;
    let report = HostReport::gather().to_string();
    match io::stdout().lock().write_all(report.as_bytes()) {
        Err(e) if e.kind() != io::ErrorKind::BrokenPipe => {
            eprintln!("emon: writing the host report: {e}");
            ExitCode::from(crate::status::ERROR)
        }
        _ => ExitCode::SUCCESS,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::backend::probe::{HARDWARE_EVENTS, SOFTWARE_EVENTS};

    fn report() -> HostReport {
        let err = || Err(io::Error::from_raw_os_error(libc::ENOENT));
        let events = HARDWARE_EVENTS
            .iter()
            .map(|&event| EventProbe { event, exclude_host: err(), plain: err() })
            .chain(SOFTWARE_EVENTS.iter().map(|&event| EventProbe { event, exclude_host: Ok(()), plain: Ok(()) }))
            .collect();
        let perf = PerfReport {
            paranoid: Some("2".into()),
            root: true,
            pmus: vec![("software".into(), Some(1)), ("msr".into(), None)],
            events,
            slots_note: Some("slots: not probed".into()),
        };
        let auto = probe::auto_choice_with(&Default::default(), |e| {
            perf.events
                .iter()
                .find(|p| p.event == *e)
                .and_then(|p| p.exclude_host.as_ref().err())
                .map(|e| io::Error::from_raw_os_error(e.raw_os_error().unwrap()))
        });
        HostReport {
            kernel: Some("6.18.0".into()),
            kvm: KvmReport::Unavailable(VmmError::NoKvm.to_string()),
            enable_pmu: None,
            perf,
            cpuid: CpuidReport {
                vendor: "GenuineIntel".into(),
                max_leaf: 0x16,
                hypervisor: false,
                // Skylake: v4, 4 x 48-bit GP, EBX length 7, 3 x 48-bit fixed.
                leaf_0a: Some([0x0730_0404, 0, 0, 0x603]),
                events: Some("Skylake"),
            },
            auto,
        }
    }

    #[test]
    fn every_heading_is_printed_in_order() {
        let text = report().to_string();
        let mut at = 0;
        for h in HEADINGS {
            let pos = text.lines().position(|l| l == h).unwrap_or_else(|| panic!("no heading {h}\n{text}"));
            assert!(pos >= at, "{h} out of order\n{text}");
            at = pos;
        }
    }

    #[test]
    fn no_kvm_is_reported_with_emon_runs_message() {
        let text = report().to_string();
        assert!(text.contains(&format!("  unavailable: {}", VmmError::NoKvm)), "{text}");
        assert!(text.contains("enable_pmu: absent"), "{text}");
    }

    #[test]
    fn event_rows_show_each_probe_and_auto_agrees() {
        let text = report().to_string();
        let row = |name: &str| {
            text.lines().find(|l| l.split_whitespace().next() == Some(name)).unwrap_or_else(|| panic!("{name}\n{text}"))
        };
        assert!(row("cycles").contains("no: ENOENT (No such file or directory)"), "{text}");
        assert!(row("task-clock").contains("yes"), "{text}");
        assert!(!row("task-clock").contains("no:"), "{text}");
        assert!(text.contains("\n  chooses: precise\n  why: auto: the host cannot"), "{text}");
        assert!(text.contains("PMUs in /sys/bus/event_source/devices: software (type 1), msr"), "{text}");
        assert!(text.contains("model-specific events: Skylake's list; --backend perf counts"), "{text}");
    }

    #[test]
    fn leaf_0a_is_decoded() {
        let lines = report().cpuid.leaf_0a_lines();
        assert_eq!(lines[1], "version 4");
        assert_eq!(lines[2], "general-purpose counters: 4 x 48 bits");
        assert_eq!(lines[3], "fixed-function counters: 3 x 48 bits (IA32_FIXED_CTR{0,1,2})");
        assert_eq!(lines[4], "EBX length 7; unavailable events: none");
        let c = CpuidReport {
            vendor: String::new(),
            max_leaf: 0xD,
            hypervisor: true,
            leaf_0a: Some([0x0730_0404, 0x18, 0, 0x603]),
            events: None,
        };
        assert_eq!(c.leaf_0a_lines()[4], "EBX length 7; unavailable events: LLC Reference, LLC Misses");
        let c = CpuidReport { leaf_0a: Some([0; 4]), ..c };
        assert_eq!(c.leaf_0a_lines()[1], "version 0: no architectural performance monitoring");
        let c = CpuidReport { leaf_0a: None, max_leaf: 5, ..c };
        assert_eq!(c.leaf_0a_lines(), vec!["leaf 0x0A: not reported (max basic leaf 0x5)".to_string()]);
    }
}
