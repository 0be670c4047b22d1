//! The `emon` command line.
use crate::backend::{self, BackendKind};
use crate::guests;
use crate::profile::{Profile, ProfileError};
use crate::status;
use crate::vmm::{self, loader, SerialOut, VmConfig, VmmError};
use clap::{Args, Parser, Subcommand};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

/// The guest `emon` runs when given no kernel.
pub const DEFAULT_GUEST: &str = "guest:cpuid-report";

#[derive(Parser, Debug)]
#[command(name = "emon", version, about = "A KVM VMM that virtualizes the Intel architectural PMU in userspace")]
#[command(after_help = "With no command, runs guest:cpuid-report on the default profile.")]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Boot a kernel (a path, or guest:NAME) under a PMU profile.
    Run(RunArgs),
    /// List the built-in guests.
    Guests,
    /// List the built-in PMU profiles.
    Profiles,
    /// Show the CPUID leaves emon would present under a profile.
    Cpuid(ProfileArgs),
    /// Measure the precise backend against bare single-stepping, and a trapped PMU MSR exit
    /// against a port-I/O exit, in one run.
    Bench(BenchArgs),
    /// The architectural events of a profile: available in CPUID, and counted by the precise backend.
    Events(ProfileArgs),
    /// Report what this host offers emon: KVM, perf events, CPUID 0x0A, and which backend auto chooses.
    Host,
    /// Run a matrix of kernels x profiles (or a suite file) as parallel `emon run`s and report the
    /// results (table, JUnit XML, JSON); exits non-zero if anything failed.
    Test(crate::runner::TestArgs),
}

#[derive(Args, Debug)]
struct ProfileArgs {
    /// A built-in profile name or a path to a profile TOML file.
    #[arg(long, value_name = "NAME|PATH", default_value = Profile::DEFAULT)]
    profile: String,
    /// Override profile fields, e.g. version=4,gp=8,gp-width=48,fixed=3,ebx-unavailable=0x18.
    #[arg(long, value_name = "K=V,...")]
    pmu: Vec<String>,
}

#[derive(Args, Debug)]
struct BenchArgs {
    #[command(flatten)]
    profile: ProfileArgs,
    /// Loop iterations stepped in each of the two stepping runs (2 instructions each).
    #[arg(long, default_value_t = 50_000)]
    iterations: u64,
    /// Exits of each kind timed.
    #[arg(long, default_value_t = 20_000)]
    exits: u64,
}

#[derive(Args, Debug)]
struct RunArgs {
    #[command(flatten)]
    profile: ProfileArgs,
    /// Guest RAM in MiB.
    #[arg(long, value_name = "MIB", default_value_t = 64)]
    memory: u64,
    /// Stop the guest after this many seconds (exit status 4).
    #[arg(long, value_name = "S")]
    timeout: Option<f64>,
    /// Write the guest's serial output to FILE instead of stdout.
    #[arg(long, value_name = "FILE")]
    serial: Option<PathBuf>,
    /// Write a Chrome/Perfetto trace (JSON) of the run's PMU events to FILE.
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// Write a machine-readable report of the run (JSON) to FILE: how it ended, exit counts, MSR
    /// statistics, PMIs, the backend, file descriptors and peak memory.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Load FILE as a multiboot module (repeatable).
    #[arg(long, value_name = "FILE")]
    module: Vec<PathBuf>,
    /// Load FILE as a Linux kernel's initial ramdisk (bzImage and PVH kernels).
    #[arg(long, value_name = "FILE")]
    initrd: Option<PathBuf>,
    /// Unknown non-PMU MSRs read as 0 and ignore writes instead of raising #GP.
    #[arg(long)]
    ignore_msrs: bool,
    /// Present the Debug Store, PEBS (formats 0-4) and BTS (precise backend): where the guest sees
    /// CPUID's DS bit (auto), even where the host hides it (on: for guests that look only at
    /// MISC_ENABLE), or never (off).
    #[arg(long, value_enum, default_value_t = vmm::DebugStoreMode::Auto)]
    debug_store: vmm::DebugStoreMode,
    /// What makes the guest's counters count.
    #[arg(long, value_enum, default_value_t = BackendKind::Auto)]
    backend: BackendKind,
    /// perf backend: pass non-architectural event codes to the host as raw events (only when the
    /// host's CPU vendor matches the profile's).
    #[arg(long)]
    allow_raw_events: bool,
    /// precise backend: run counted code in the TCG engine (fast, the default) or single-step
    /// every instruction in KVM (the reference).
    #[arg(long, value_enum, default_value_t = backend::precise::Engine::DEFAULT)]
    precise_engine: backend::precise::Engine,
    /// precise backend: where CPL0 guest code runs while nothing counts: in KVM, in the TCG
    /// engine, or auto (the engine where this host's KVM only emulates CPL0 code).
    #[arg(long, value_enum, default_value_t = Cpl0::Auto)]
    cpl0: Cpl0,
    /// precise backend: what the guest's TSC and TSC-deadline timer follow: the model clock
    /// where something counts and real time elsewhere (counted), or the model clock in all the
    /// code emon runs (model: on a host where emon runs all of it, the whole run).
    #[arg(long, value_enum, default_value_t = backend::precise::GuestTime::Counted)]
    guest_time: backend::precise::GuestTime,
    /// Log exits and print statistics and the PMU state at the end.
    #[arg(long, short)]
    verbose: bool,
    /// A kernel image path, or guest:NAME for a built-in guest.
    #[arg(value_name = "KERNEL")]
    kernel: Option<String>,
    /// Arguments passed to the kernel.
    #[arg(last = true, value_name = "CMDLINE")]
    cmdline: Vec<String>,
}

/// `--cpl0`: where CPL0 guest code runs while nothing counts (README, "CPL0 code in the TCG
/// engine").
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Cpl0 {
    /// The TCG engine where this host's KVM only emulates CPL0 code, KVM elsewhere.
    Auto,
    /// Always KVM (single-stepped where user mode must run in the engine, README "User mode
    /// (CPL3)").
    Kvm,
    /// Always the TCG engine (precise backend).
    Tcg,
}

/// Why a command could not do its job: one line for the user, exit status 2 ([`status::ERROR`]).
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// Loading a profile, or applying `--pmu` to it.
    #[error(transparent)]
    Profile(#[from] ProfileError),
    /// Setting up or running the VM, the kernel's loading included (`VmmError::Kernel`).
    #[error(transparent)]
    Vmm(#[from] VmmError),
    #[error("no built-in guest '{name}'; built-in guests: {}", available.join(", "))]
    UnknownGuest { name: String, available: Vec<String> },
    #[error("{}: cannot read the kernel: {source}", path.display())]
    ReadKernel { path: PathBuf, source: std::io::Error },
    #[error("module {}: {source}", path.display())]
    ReadModule { path: PathBuf, source: std::io::Error },
    #[error("--initrd {}: {source}", path.display())]
    ReadInitrd { path: PathBuf, source: std::io::Error },
    #[error("--json {}: {source}", path.display())]
    JsonFile { path: PathBuf, source: std::io::Error },
    #[error("--timeout {0}: must be a positive number of seconds")]
    Timeout(f64),
    #[error("--backend perf: profile {0} {1}")]
    PerfRefused(String, &'static str),
    /// `emon test`'s errors in its input, as the runner words them.
    #[error(transparent)]
    Runner(#[from] crate::runner::RunnerError),
    /// `emon bench`: a measurement run failed.
    #[error("{0}")]
    Bench(String),
    /// A word for `/init` that Linux's command line cannot carry.
    #[error("the argument {word:?} after the kernel's `--`: {why}")]
    InitArg { word: String, why: &'static str },
}

pub fn main() -> ExitCode {
    // Output piped into `head` ends emon quietly, as for any command-line tool, instead of a
    // "failed printing to stdout" panic (Rust ignores SIGPIPE by default).
    // SAFETY: restoring the default disposition of SIGPIPE before any thread starts.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let cli = Cli::parse();
    // No command: `emon run` with every default (guest:cpuid-report on the default profile).
    let command = cli.command.unwrap_or_else(|| {
        let run = Cli::parse_from(["emon", "run"]).command;
        run.expect("`emon run` parses to the run command")
    });
    let verbose = matches!(&command, Command::Run(a) if a.verbose);
    init_logging(verbose);
    let result = match command {
        Command::Run(args) => run(args),
        Command::Guests => list_guests(),
        Command::Profiles => list_profiles(),
        Command::Cpuid(args) => show_cpuid(&args),
        Command::Bench(args) => bench(&args),
        Command::Events(args) => list_events(&args),
        Command::Host => Ok(crate::host_report::run()),
        Command::Test(args) => test(args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("emon: {}", e.to_string().replace('\n', " "));
            ExitCode::from(status::ERROR)
        }
    }
}

fn init_logging(verbose: bool) {
    let level = if verbose { "emon=debug" } else { "emon=warn" };
    let filter = tracing_subscriber::EnvFilter::try_from_env("EMON_LOG").unwrap_or_else(|_| level.into());
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
}

fn load_profile(args: &ProfileArgs) -> Result<Profile, CliError> {
    let mut p = Profile::load(&args.profile)?;
    for o in &args.pmu {
        p.apply_overrides(o)?;
    }
    Ok(p)
}

fn load_kernel(spec: &str) -> Result<loader::Kernel, CliError> {
    let image = match spec.strip_prefix(guests::PREFIX) {
        Some(name) => guests::find(name)
            .ok_or_else(|| CliError::UnknownGuest {
                name: name.to_owned(),
                available: guests::list().map(|(n, _)| n.to_owned()).collect(),
            })?
            .to_vec(),
        None => std::fs::read(spec).map_err(|source| CliError::ReadKernel { path: spec.into(), source })?,
    };
    Ok(loader::Kernel { name: spec.to_owned(), image })
}

/// The kernel command line from the words after `emon run ... --`. Linux splits its command line
/// at spaces and gives `/init` the words after a `--` of their own; a word in double quotes keeps
/// its spaces, and a double quote has no escape. So each of init's words that holds a space, or
/// nothing, is quoted, and init gets the words the user gave; the kernel's own parameters, before
/// that `--`, go as they are (README, "Boot protocols and the guest entry state").
fn kernel_cmdline(words: &[String]) -> Result<String, CliError> {
    let mut init = false;
    let mut line = Vec::with_capacity(words.len());
    for word in words {
        let err = |why| Err(CliError::InitArg { word: word.clone(), why });
        if !init {
            init = word == "--";
        } else if word.contains('"') {
            return err("Linux's command line cannot carry a double quote to init");
        } else if word == "--" {
            return err("Linux ends init's arguments at a second `--`, so the words after it would be lost");
        } else if word.is_empty() || word.contains(' ') {
            line.push(format!("\"{word}\""));
            continue;
        }
        line.push(word.clone());
    }
    Ok(line.join(" "))
}

fn run(args: RunArgs) -> Result<ExitCode, CliError> {
    let profile = load_profile(&args.profile)?;
    let kernel = load_kernel(args.kernel.as_deref().unwrap_or(DEFAULT_GUEST))?;
    let modules = args
        .module
        .iter()
        .map(|p| {
            let data = std::fs::read(p).map_err(|source| CliError::ReadModule { path: p.clone(), source })?;
            Ok(loader::Module { name: p.display().to_string(), data })
        })
        .collect::<Result<Vec<_>, CliError>>()?;
    let initrd = args
        .initrd
        .as_ref()
        .map(|p| {
            let data = std::fs::read(p).map_err(|source| CliError::ReadInitrd { path: p.clone(), source })?;
            Ok::<_, CliError>(loader::Module { name: p.display().to_string(), data })
        })
        .transpose()?;
    let timeout = match args.timeout {
        Some(s) if !(s.is_finite() && s > 0.0) => return Err(CliError::Timeout(s)),
        Some(s) => Some(Duration::from_secs_f64(s)),
        None => None,
    };
    if let (Some(only), backend::BackendKind::Perf) = (profile.pmu.precise_only(), args.backend) {
        return Err(CliError::PerfRefused(profile.name, only.refusal));
    }
    let cpl0_speed = vmm::exec_probe::cpl0()?;
    let precise = backend::precise::Options {
        engine: args.precise_engine,
        cpl0_in_engine: match args.cpl0 {
            Cpl0::Kvm => false,
            Cpl0::Tcg => true,
            Cpl0::Auto => cpl0_speed.emulated(),
        },
        user_in_engine: !vmm::exec_probe::syscall_enters_kernel()?,
        guest_time: args.guest_time,
    };
    let (backend, why) =
        backend::select(args.backend, &profile, args.allow_raw_events, vmm::kick::kick_signal(), precise);
    if args.verbose {
        eprintln!("emon: backend {}: {why}", backend.name());
    }
    tracing::debug!("profile {} ({}), kernel {}", profile.name, profile.description, kernel.name);
    let config = VmConfig {
        profile,
        kernel,
        cmdline: kernel_cmdline(&args.cmdline)?,
        modules,
        initrd,
        memory_mib: args.memory,
        timeout,
        serial: args.serial.map(SerialOut::File).unwrap_or(SerialOut::Stdout),
        ignore_msrs: args.ignore_msrs,
        debug_store: args.debug_store,
        cpl0: cpl0_speed,
        backend,
        trace: args.trace.clone(),
    };
    // Created before the guest runs, so that an unwritable FILE is an error, not a lost report.
    let json = args.json.as_deref().map(JsonOut::create).transpose()?;
    let report = match vmm::run(config) {
        Ok(report) => report,
        Err(e) => {
            if let Some(json) = json {
                json.discard();
            }
            return Err(e.into());
        }
    };
    if let vmm::VcpuStop::Shutdown { registers, .. } = &report.stop {
        eprintln!("{registers}");
    }
    if args.verbose {
        print_statistics(&report);
    }
    if let Some(e) = &report.trace_error {
        eprintln!("emon: warning: writing the trace failed: {e}");
    } else if let (true, Some(path)) = (args.verbose, &args.trace) {
        eprintln!("trace: {} events written to {}", report.trace_events, path.display());
    }
    if let Some(e) = &report.serial_error {
        eprintln!("emon: warning: writing the guest's serial output failed: {e}");
    }
    if let Some(json) = json {
        if let Err(e) = json.write(&report) {
            eprintln!("emon: warning: writing the JSON report failed: {e}");
        }
    }
    eprintln!("{}", report.summary());
    Ok(ExitCode::from(report.exit_status() as u8))
}

/// `--json FILE`, open from before the run until the report is written.
struct JsonOut {
    file: File,
    path: PathBuf,
    /// emon created the file (rather than truncating one that existed).
    created: bool,
}

impl JsonOut {
    fn create(path: &Path) -> Result<JsonOut, CliError> {
        let created = !path.exists();
        let file = File::create(path).map_err(|source| CliError::JsonFile { path: path.to_owned(), source })?;
        Ok(JsonOut { file, path: path.to_owned(), created })
    }

    fn write(self, report: &vmm::RunReport) -> std::io::Result<()> {
        let mut out = std::io::BufWriter::new(self.file);
        serde_json::to_writer_pretty(&mut out, &report.json())?;
        out.write_all(b"\n")?;
        out.flush()
    }

    /// The run never reached the guest: no report, and no empty file left behind by emon.
    fn discard(self) {
        if self.created {
            drop(self.file);
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

fn test(args: crate::runner::TestArgs) -> Result<ExitCode, CliError> {
    crate::runner::main(args).map_err(CliError::from)
}

fn print_statistics(r: &vmm::RunReport) {
    let e = &r.exits;
    eprintln!(
        "exits: {} total: {} port I/O, {} MMIO, {} MSR, {} interrupted, {} other",
        e.total, e.pio, e.mmio, e.msr, e.interrupted, e.other
    );
    eprintln!(
        "instructions completed by emon (KVM could not emulate them): {}, of which INT3 delivered as #BP: {}",
        e.completed, e.int3_delivered
    );
    let v = &r.vpmu;
    eprintln!("PMU MSRs: {} reads, {} writes; #GP injected: {}", v.msrs.reads, v.msrs.writes, r.gp_injected());
    eprintln!("{}", v.summary);
    eprintln!("{}", r.rdpmc.detail());
    eprintln!("PMU state at the end of the run:\n{}", r.pmu.dump());
    eprintln!("file descriptors: {} at the first KVM_RUN, {} at the end", e.fds_at_start, e.fds_at_end);
    eprintln!("register ioctls (vCPU ioctls kvm_run and the register cache could not spare): {}", e.register_ioctls);
    eprintln!("RDTSC and RDTSCP in the TCG engine (kernel code's with interrupts masked): {}", e.engine_tsc);
    eprintln!(
        "PMIs: {} fixed-vector, {} NMI, {} masked, {} dropped",
        v.pmis.fixed, v.pmis.nmi, v.pmis.masked, v.pmis.dropped
    );
    for (msr, n) in &r.msr.unknown {
        eprintln!("  non-PMU MSR {msr:#x}: {n} accesses");
    }
    if r.msr.unknown_untracked > 0 {
        eprintln!("  {} more accesses to other non-PMU MSRs", r.msr.unknown_untracked);
    }
    eprintln!("peak memory (VmHWM): {} KiB", r.peak_memory_kib.map_or("unknown".into(), |k| k.to_string()));
    for (port, n) in &r.unhandled_ports {
        eprintln!("  unhandled port {port:#x}: {n} accesses");
    }
}

fn list_guests() -> Result<ExitCode, CliError> {
    for (name, about) in guests::list() {
        println!("{}{name:<20} {about}", guests::PREFIX);
    }
    Ok(ExitCode::SUCCESS)
}

fn list_profiles() -> Result<ExitCode, CliError> {
    for name in Profile::builtin_names() {
        let p = Profile::load(name)?;
        let d = if name == Profile::DEFAULT { " (default)" } else { "" };
        println!(
            "{name:<20} v{} {}x{}-bit GP, {}x{}-bit fixed  {}{d}",
            p.pmu.version, p.pmu.gp, p.pmu.gp_width, p.pmu.fixed, p.pmu.fixed_width, p.description
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn show_cpuid(args: &ProfileArgs) -> Result<ExitCode, CliError> {
    let profile = load_profile(args)?;
    let kvm = vmm::host::open()?;
    // As the precise backend presents it: the perf backend presents no Debug Store (PEBS, BTS).
    let tsc = vmm::tsc_rate::TscRate::of_host(&kvm)?;
    let cpuid = vmm::guest_cpuid(&kvm, &profile, profile.pmu.version >= 1, tsc)?;
    println!("CPUID presented under profile {} ({}), precise backend:", profile.name, profile.description);
    println!("{:>10} {:>6}  {:>10} {:>10} {:>10} {:>10}", "leaf", "index", "eax", "ebx", "ecx", "edx");
    for e in cpuid.as_slice() {
        println!(
            "{:>#10x} {:>6}  {:>#010x} {:>#010x} {:>#010x} {:>#010x}",
            e.function, e.index, e.eax, e.ebx, e.ecx, e.edx
        );
    }
    if let Some(note) = tsc.note(&profile.clock) {
        println!("{note}");
    }
    println!();
    let overrides = vmm::cpuid_probe::probe(&kvm, &cpuid)?;
    if overrides.is_empty() {
        println!("A probe VM on this host reads exactly this table through CPUID.");
    } else {
        println!(
            "This host overrides the table: a probe VM reads, through CPUID at CPL0 (README, \"CPUID fidelity\"):"
        );
        for o in &overrides {
            println!("  {}", o.describe());
        }
    }
    println!();
    println!("leaf 0x0A decoded:");
    for line in crate::profile::describe_leaf_0a(&profile.pmu) {
        println!("  {line}");
    }
    Ok(ExitCode::SUCCESS)
}

fn bench(args: &BenchArgs) -> Result<ExitCode, CliError> {
    let profile = load_profile(&args.profile)?;
    let hz = crate::bench::tsc_hz();
    let f = crate::bench::measure(&profile, args.iterations, args.exits).map_err(CliError::Bench)?;
    let per = |tsc: u64, n: u64| tsc as f64 / n as f64;
    let ips = |tsc: u64| f.loop_instructions as f64 / (tsc as f64 / hz);
    println!("emon bench (profile {}, TSC {:.0} MHz); ratios are from this one run", profile.name, hz / 1e6);
    println!(
        "  precise backend (single-stepping): {} instructions counted in {:.1} TSC ticks each = {:.0} instructions/s",
        f.loop_instructions,
        per(f.precise_tsc, f.loop_instructions),
        ips(f.precise_tsc)
    );
    println!(
        "  bare single-step:  {} instructions stepped in {:.1} TSC ticks each = {:.0} instructions/s",
        f.loop_instructions,
        per(f.bare_tsc, f.loop_instructions),
        ips(f.bare_tsc)
    );
    println!("  precise / bare single-step rate: {:.3}x", f.precise_vs_bare());
    println!("  trapped PMU MSR exit (RDMSR IA32_PERF_GLOBAL_CTRL): {:.0} ticks", per(f.pmu_msr_tsc, f.exits));
    println!("  port I/O exit (OUT 0x80):                          {:.0} ticks", per(f.port_io_tsc, f.exits));
    println!("  in-kernel MSR exit (RDMSR IA32_TIME_STAMP_COUNTER): {:.0} ticks", per(f.kvm_msr_tsc, f.exits));
    println!("  PMU MSR exit / port I/O exit: {:.3}x", f.pmu_msr_vs_port_io());
    println!("  in-kernel MSR exit / port I/O exit: {:.3}x", f.kvm_msr_vs_port_io());
    let us = |tsc: u64| per(tsc, f.exits) / hz * 1e6;
    println!("  RDPMC outside counted code (a hardware breakpoint on the guest's #GP handler):");
    println!("    RDPMC completed at the #GP handler:        {:.1} µs", us(f.rdpmc_tsc));
    println!(
        "    #GP passed on to the guest's handler:     {:.1} µs ({:.1} µs with emon standing aside)",
        us(f.gp_tsc),
        us(f.gp_aside_tsc)
    );
    println!(
        "    port I/O exit with the breakpoint armed:   {:.1} µs ({:.1} µs without: no PMU)",
        us(f.port_io_armed_tsc),
        us(f.port_io_unarmed_tsc)
    );
    println!("    RDPMC at the #GP handler / port I/O exit: {:.3}x", f.rdpmc_vs_port_io());
    println!("  precise backend, TCG engine against single-stepping (counted instructions/s):");
    for s in crate::bench::measure_shapes(&profile).map_err(CliError::Bench)? {
        let ips = |(n, tsc): (u64, u64)| n as f64 / (tsc as f64 / hz);
        println!(
            "    {:<9} TCG {:>12.0}/s, step {:>8.0}/s: engine / single-step {:.0}x",
            s.name,
            ips(s.tcg),
            ips(s.step),
            s.ratio()
        );
    }
    println!("  CPL0 code with nothing counting, in KVM against in the TCG engine (--cpl0):");
    for f in crate::bench::measure_free(&profile, 20_000, 20_000_000).map_err(CliError::Bench)? {
        let ms = |tsc: u64| tsc as f64 / hz * 1e3;
        println!(
            "    {:<13} KVM {:>9.1} ms, engine {:>7.1} ms: engine / KVM {:.0}x",
            f.name,
            ms(f.kvm_tsc),
            ms(f.engine_tsc),
            f.ratio()
        );
    }
    let (shape, n) = crate::bench::EVENTS_SHAPE;
    println!("  events on {shape} ({n} iterations), TCG engine, 4 GP counters each (counted instructions/s):");
    match crate::bench::measure_events(&profile).map_err(CliError::Bench)? {
        Ok(rows) => {
            for r in &rows {
                println!("    {:<36} {:>12.0}/s ({})", r.label, r.rate() * hz, r.names.join(", "));
            }
            let rate = |label: &str| rows.iter().find(|r| r.label == label).map_or(f64::NAN, |r| r.rate());
            let ratio = |a: &str, b: &str| rate(a) / rate(b);
            println!(
                "    model-specific / architectural events rate: {:.3}x",
                ratio("model-specific", "architectural")
            );
            println!(
                "    model-specific with the cache model / architectural events rate: {:.3}x",
                ratio("model-specific with the cache model", "architectural")
            );
            println!(
                "    model-specific with the cache model / architectural with the cache model rate: {:.3}x",
                ratio("model-specific with the cache model", "architectural with the cache model")
            );
        }
        Err(why) => println!("    not measured: {why}"),
    }
    Ok(ExitCode::SUCCESS)
}

fn list_events(args: &ProfileArgs) -> Result<ExitCode, CliError> {
    let p = load_profile(args)?;
    let sections = crate::profile::event_listing(&p);
    let mut classes = std::collections::BTreeMap::new();
    for listing in &sections {
        println!("{}", listing.title);
        if !listing.rows.is_empty() {
            println!("{} {:<11} precise backend", listing.columns, "class");
        }
        for row in &listing.rows {
            let fidelity = row.fidelity();
            *classes.entry(fidelity).or_insert(0) += 1;
            let filter = if row.filtered { ", its CMASK/INV/EDGE per retired instruction" } else { "" };
            println!(
                "{} {:<11} {}{filter}",
                row.text,
                fidelity.as_str(),
                crate::backend::precise::events::support(row.semantics)
            );
        }
        for note in &listing.notes {
            println!("{note}");
        }
    }
    let counts: Vec<String> = classes.iter().map(|(c, n)| format!("{n} {}", c.as_str())).collect();
    println!("Events listed: {}.", counts.join(", "));
    let listing = crate::profile::EventListing {
        title: String::new(),
        columns: String::new(),
        rows: sections.into_iter().flat_map(|s| s.rows).collect(),
        notes: Vec::new(),
    };
    let uses = |f: fn(&crate::pmu::Semantics) -> bool| listing.rows.iter().any(|r| f(&r.semantics));
    if uses(|s| *s == crate::pmu::Semantics::RefXclk) {
        let c = &p.clock;
        println!(
            "Reference clock (0x3C/0x01 on GP counters): one tick per {}/{} TSC ticks of the model ({}); FIXED_CTR2 counts at the TSC's rate.",
            c.tsc_per_ref_numerator,
            c.tsc_per_ref_denominator,
            if c.leaf_15h { "CPUID leaf 0x15" } else { "no CPUID leaf 0x15" }
        );
    }
    if uses(|s| s.uses_cache()) {
        let level = |l: crate::profile::CacheLevel| format!("{} KiB {}-way", l.kib, l.ways);
        let k = &p.cache;
        let f = &k.prefetchers;
        let prefetchers = match f.present().names() {
            n if n.is_empty() => "no prefetchers".to_string(),
            n => format!("prefetchers {}", n.join(", ")),
        };
        let control = match (f.misc_feature_control, f.misc_enable) {
            (Some(bits), _) => format!(" (MSR_MISC_FEATURE_CONTROL, writable bits {bits:#x})"),
            (None, true) => " (IA32_MISC_ENABLE's disable bits)".to_string(),
            (None, false) => String::new(),
        };
        println!(
            "Cache model (LLC events and the cache-model events): L1d {}, L2 {}, LLC {}, {}-byte lines, LRU, inclusive, {prefetchers}{control}; it starts empty each time an event that reads it starts counting (README, \"The cache model\").",
            level(k.l1d),
            k.l2.map_or("none".into(), level),
            level(k.llc),
            k.line
        );
    }
    println!(
        "Privilege levels: CPL0 code counts exactly (TCG engine or single-stepping). User-mode (CPL3) code counts \
         exactly in the TCG engine; where KVM cannot single-step CPL3 code (kvm_pvm), user-mode code the engine \
         hands back is not counted and the run summary says NOT EXACT (README, \"User mode (CPL3) on this host\")."
    );
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    fn enoent() -> std::io::Error {
        std::io::Error::from_raw_os_error(libc::ENOENT)
    }

    #[test]
    fn errors_keep_their_one_line_messages() {
        let cases = [
            (CliError::ReadKernel { path: "k.elf".into(), source: enoent() }, "k.elf: cannot read the kernel: "),
            (CliError::ReadModule { path: "m.bin".into(), source: enoent() }, "module m.bin: "),
            (CliError::ReadInitrd { path: "i.cpio".into(), source: enoent() }, "--initrd i.cpio: "),
            (CliError::JsonFile { path: "/x/r.json".into(), source: enoent() }, "--json /x/r.json: "),
        ];
        for (e, start) in cases {
            assert_eq!(e.to_string(), format!("{start}No such file or directory (os error 2)"));
            assert!(e.source().is_some_and(|s| s.is::<std::io::Error>()), "{e}");
        }
        let e = CliError::UnknownGuest { name: "x".into(), available: vec!["a".into(), "b".into()] };
        assert_eq!(e.to_string(), "no built-in guest 'x'; built-in guests: a, b");
        assert_eq!(CliError::Timeout(-1.0).to_string(), "--timeout -1: must be a positive number of seconds");
    }

    fn words(w: &[&str]) -> Vec<String> {
        w.iter().map(|s| s.to_string()).collect()
    }

    /// init gets the words given after the kernel's `--`: those with spaces, or none, in quotes.
    #[test]
    fn init_gets_its_words_whole_on_the_kernel_command_line() {
        let line = |w: &[&str]| kernel_cmdline(&words(w)).unwrap();
        assert_eq!(line(&[]), "");
        assert_eq!(line(&["console=ttyS0 x=1", "quiet"]), "console=ttyS0 x=1 quiet", "the kernel's, as given");
        assert_eq!(
            line(&["console=ttyS0", "--", "sh", "-c", "echo a  b", "", "x=1"]),
            r#"console=ttyS0 -- sh -c "echo a  b" "" x=1"#
        );
        assert_eq!(line(&["--", "true"]), "-- true");
        for (w, why) in [
            (&["--", "sh", "-c", r#"echo "a""#][..], "cannot carry a double quote"),
            (&["a", "--", "b", "--", "c"][..], "ends init's arguments at a second `--`"),
        ] {
            let e = kernel_cmdline(&words(w)).unwrap_err().to_string();
            assert!(e.contains(why) && !e.contains('\n'), "{w:?}: {e}");
        }
    }

    #[test]
    fn wrapped_errors_are_shown_as_they_are() {
        let e = CliError::from(VmmError::NoKvm);
        assert_eq!(e.to_string(), VmmError::NoKvm.to_string());
        let e = CliError::from(VmmError::SerialFile { path: "s.txt".into(), source: enoent() });
        assert_eq!(e.to_string(), "serial output s.txt: No such file or directory (os error 2)");
        assert!(e.source().is_some_and(|s| s.is::<std::io::Error>()), "the io::Error, through VmmError");
        let p = Profile::load("no-such-profile").unwrap_err();
        assert_eq!(CliError::from(p.clone()).to_string(), p.to_string());
    }
}
