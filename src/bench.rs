//! `emon bench`: the precise backend's instruction rate against the bare single-step rate, and
//! the cost of a trapped PMU MSR exit against a plain port-I/O exit, measured in one invocation.
use crate::backend::precise::{Engine, Precise};
use crate::backend::{stepper::BareStep, Backend};
use crate::profile::{Event, Profile};
use crate::vmm::{self, loader::Kernel, SerialOut, VcpuStop, VmConfig};
use std::time::Duration;

/// One guest run's `bench` line, as key=value pairs.
/// The precise backend as `emon bench` measures it: the guest times the backend with RDTSC, so
/// its TSC stays real time while counting (not the model's, README "Guest time").
fn precise_backend(engine: Engine) -> Box<dyn Backend> {
    Box::new(Precise::with_engine(engine).with_real_time())
}

/// The precise backend with CPL0 code in KVM or, while nothing counts, in the TCG engine.
fn executing_backend(cpl0_in_engine: bool) -> Box<dyn Backend> {
    Box::new(Precise::with_engine(Engine::Tcg).with_real_time().with_cpl0_in_engine(cpl0_in_engine))
}

fn run(profile: &Profile, backend: Box<dyn Backend>, args: &str) -> Result<Vec<(String, u64)>, String> {
    run_with_memory(profile, backend, args, 64)
}

fn run_with_memory(
    profile: &Profile,
    backend: Box<dyn Backend>,
    args: &str,
    memory_mib: u64,
) -> Result<Vec<(String, u64)>, String> {
    let image = crate::guests::find("bench").ok_or("the bench guest is not built in")?.to_vec();
    let out = std::env::temp_dir().join(format!("emon-bench-{}.txt", std::process::id()));
    let config = VmConfig {
        profile: profile.clone(),
        kernel: Kernel { name: "guest:bench".into(), image },
        cmdline: args.into(),
        modules: vec![],
        initrd: None,
        memory_mib,
        timeout: Some(Duration::from_secs(600)),
        serial: SerialOut::File(out.clone()),
        ignore_msrs: false,
        debug_store: vmm::DebugStoreMode::Auto,
        cpl0: vmm::exec_probe::cpl0().map_err(|e| e.to_string())?,
        backend,
        trace: None,
    };
    let report = vmm::run(config).map_err(|e| e.to_string())?;
    let text = std::fs::read_to_string(&out).map_err(|e| e.to_string())?;
    let _ = std::fs::remove_file(&out);
    if report.stop != VcpuStop::DebugExit(0) {
        return Err(format!("the bench guest failed: {}\n{text}", report.summary()));
    }
    let line =
        text.lines().find(|l| l.starts_with("bench ")).ok_or_else(|| format!("no result from the guest:\n{text}"))?;
    Ok(line
        .split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .filter_map(|(k, v)| Some((k.to_owned(), v.parse().ok()?)))
        .collect())
}

fn get(kv: &[(String, u64)], key: &str) -> Result<u64, String> {
    kv.iter().find(|(k, _)| k == key).map(|(_, v)| *v).ok_or_else(|| format!("the guest did not report {key}"))
}

/// The measurements of one `emon bench`.
pub struct Figures {
    pub loop_instructions: u64,
    pub precise_tsc: u64,
    pub bare_tsc: u64,
    pub exits: u64,
    pub pmu_msr_tsc: u64,
    pub port_io_tsc: u64,
    pub kvm_msr_tsc: u64,
    /// RDPMC completed at the #GP handler's breakpoint, a #GP passed on to the guest (with the
    /// breakpoint, and with emon standing aside), and port I/O exits with the breakpoint armed
    /// and under a profile without a PMU (no breakpoint): TSC ticks for `exits` of each.
    pub rdpmc_tsc: u64,
    pub gp_tsc: u64,
    pub gp_aside_tsc: u64,
    pub port_io_armed_tsc: u64,
    pub port_io_unarmed_tsc: u64,
}

impl Figures {
    /// Precise-backend instructions per second over bare single-steps per second.
    pub fn precise_vs_bare(&self) -> f64 {
        self.bare_tsc as f64 / self.precise_tsc as f64
    }
    pub fn pmu_msr_vs_port_io(&self) -> f64 {
        self.pmu_msr_tsc as f64 / self.port_io_tsc as f64
    }
    pub fn kvm_msr_vs_port_io(&self) -> f64 {
        self.kvm_msr_tsc as f64 / self.port_io_tsc as f64
    }
    /// An RDPMC completed at the #GP handler against a port I/O exit (breakpoint armed in both).
    pub fn rdpmc_vs_port_io(&self) -> f64 {
        self.rdpmc_tsc as f64 / self.port_io_armed_tsc as f64
    }
}

/// Rounds of each measurement. The runs being compared alternate, and each figure is its best
/// round, so load from other processes slows both sides alike instead of skewing a ratio.
pub const ROUNDS: usize = 3;

pub fn measure(profile: &Profile, iterations: u64, exits: u64) -> Result<Figures, String> {
    let mut f = Figures {
        loop_instructions: 0,
        precise_tsc: u64::MAX,
        bare_tsc: u64::MAX,
        exits,
        pmu_msr_tsc: u64::MAX,
        port_io_tsc: u64::MAX,
        kvm_msr_tsc: u64::MAX,
        rdpmc_tsc: u64::MAX,
        gp_tsc: u64::MAX,
        gp_aside_tsc: u64::MAX,
        port_io_armed_tsc: u64::MAX,
        port_io_unarmed_tsc: u64::MAX,
    };
    let no_pmu = Profile::load("no-pmu").map_err(|e| e.to_string())?;
    for _ in 0..ROUNDS {
        let precise = run(profile, precise_backend(Engine::Step), &format!("mode=loop-counted n={iterations}"))?;
        let bare = run(profile, Box::new(BareStep::default()), &format!("mode=loop n={iterations}"))?;
        let exit = run(profile, precise_backend(Engine::Step), &format!("mode=exits n={exits}"))?;
        f.loop_instructions = get(&precise, "instructions")?;
        // The counted region is the loop plus the RDTSC sequences around it.
        let counted = get(&precise, "counted")?;
        if !(f.loop_instructions..f.loop_instructions + 64).contains(&counted) {
            return Err(format!(
                "the precise backend counted {counted} for a loop of {} instructions",
                f.loop_instructions
            ));
        }
        f.precise_tsc = f.precise_tsc.min(get(&precise, "tsc")?);
        f.bare_tsc = f.bare_tsc.min(get(&bare, "tsc")?);
        f.pmu_msr_tsc = f.pmu_msr_tsc.min(get(&exit, "pmu_msr_tsc")?);
        f.port_io_tsc = f.port_io_tsc.min(get(&exit, "port_io_tsc")?);
        f.kvm_msr_tsc = f.kvm_msr_tsc.min(get(&exit, "kvm_msr_tsc")?);
        let rdpmc = run(profile, precise_backend(Engine::Step), &format!("mode=rdpmc n={exits}"))?;
        let unarmed = run(&no_pmu, precise_backend(Engine::Step), &format!("mode=pio n={exits}"))?;
        f.rdpmc_tsc = f.rdpmc_tsc.min(get(&rdpmc, "rdpmc_tsc")?);
        f.gp_tsc = f.gp_tsc.min(get(&rdpmc, "gp_tsc")?);
        f.gp_aside_tsc = f.gp_aside_tsc.min(get(&rdpmc, "gp_aside_tsc")?);
        f.port_io_armed_tsc = f.port_io_armed_tsc.min(get(&rdpmc, "port_io_tsc")?);
        f.port_io_unarmed_tsc = f.port_io_unarmed_tsc.min(get(&unarmed, "port_io_tsc")?);
    }
    Ok(f)
}

/// A code shape counted by the precise backend under each engine: instructions counted and
/// TSC ticks taken, the best of [`ROUNDS`] alternating rounds each.
#[derive(Debug, Clone)]
pub struct Shape {
    pub name: &'static str,
    pub tcg: (u64, u64),
    pub step: (u64, u64),
}

impl Shape {
    /// The TCG engine's counted instructions per second over single-stepping's.
    pub fn ratio(&self) -> f64 {
        let rate = |(n, tsc): (u64, u64)| n as f64 / tsc as f64;
        rate(self.tcg) / rate(self.step)
    }
}

/// The shapes of `guest:bench mode=shape`, with iterations for the TCG engine and for stepping.
pub const SHAPES: &[(&str, u64, u64)] = &[
    ("straight", 200_000, 300),
    ("loop10", 500_000, 1_000),
    ("loopdot", 20_000_000, 3_000),
    ("branchy", 2_000_000, 2_000),
    ("kernel", 1_000_000, 1_000),
];

/// Uncounted CPL0 code with CPL0 in KVM and in the TCG engine (`--cpl0`): TSC ticks of each,
/// the best of [`ROUNDS`] alternating rounds.
#[derive(Debug, Clone)]
pub struct Free {
    pub name: &'static str,
    /// What the guest did: instructions of the loop, or pages mapped and touched.
    pub n: u64,
    pub kvm_tsc: u64,
    pub engine_tsc: u64,
}

impl Free {
    /// How many times faster the engine runs it.
    pub fn ratio(&self) -> f64 {
        self.kvm_tsc as f64 / self.engine_tsc as f64
    }
}

/// The free-running measurements: a `dec; jnz` loop (`n` iterations under KVM, `m` in the
/// engine, compared per instruction) and 64 MiB mapped and touched (the same under both).
pub fn measure_free(profile: &Profile, loop_kvm: u64, loop_engine: u64) -> Result<Vec<Free>, String> {
    let mut spin = Free { name: "loop", n: 2 * loop_engine + 1, kvm_tsc: u64::MAX, engine_tsc: u64::MAX };
    let pages = 16384;
    let mut touch = Free { name: "touch 64 MiB", n: pages, kvm_tsc: u64::MAX, engine_tsc: u64::MAX };
    for _ in 0..ROUNDS {
        for engine in [false, true] {
            let n = if engine { loop_engine } else { loop_kvm };
            let kv = run(profile, executing_backend(engine), &format!("mode=free n={n}"))?;
            // Per instruction, scaled to the engine's loop.
            let tsc = (get(&kv, "tsc")? as f64 * (2 * loop_engine + 1) as f64 / (2 * n + 1) as f64) as u64;
            let kv = run_with_memory(profile, executing_backend(engine), &format!("mode=touch n={pages}"), 128)?;
            let t = get(&kv, "tsc")?;
            let (a, b) = if engine {
                (&mut spin.engine_tsc, &mut touch.engine_tsc)
            } else {
                (&mut spin.kvm_tsc, &mut touch.kvm_tsc)
            };
            *a = (*a).min(tsc);
            *b = (*b).min(t);
        }
    }
    Ok(vec![spin, touch])
}

/// Counts each of [`SHAPES`] under the TCG engine and under single-stepping.
pub fn measure_shapes(profile: &Profile) -> Result<Vec<Shape>, String> {
    let mut out: Vec<Shape> =
        SHAPES.iter().map(|(name, _, _)| Shape { name, tcg: (0, u64::MAX), step: (0, u64::MAX) }).collect();
    for _ in 0..ROUNDS {
        for (shape, (name, n_tcg, n_step)) in out.iter_mut().zip(SHAPES) {
            for (engine, n, slot) in [(Engine::Tcg, n_tcg, &mut shape.tcg), (Engine::Step, n_step, &mut shape.step)] {
                let kv =
                    run_with_memory(profile, precise_backend(engine), &format!("mode=shape shape={name} n={n}"), 128)?;
                let (counted, tsc) = (get(&kv, "counted")?, get(&kv, "tsc")?);
                if tsc < slot.1 {
                    *slot = (counted, tsc);
                }
            }
        }
    }
    Ok(out)
}

/// An event one GP counter counts in the events rows: an architectural event (SDM Table 18-1),
/// or the first of several model-specific ones the profile's list names.
#[derive(Debug, Clone, Copy)]
pub enum Counted {
    Arch(Event),
    Model(&'static [&'static str]),
}

/// The event sets `emon bench` counts a loop with, four GP counters each (README,
/// "Model-specific events"): architectural events without and with the cache model, and
/// model-specific events, exact and modelled, without and with it. A model-specific slot takes
/// the first of its candidates the profile's list names.
pub const EVENT_SETS: [(&str, [Counted; 4]); 4] = [
    (
        "architectural",
        [
            Counted::Arch(Event::Instructions),
            Counted::Arch(Event::Branches),
            Counted::Arch(Event::BranchMisses),
            Counted::Arch(Event::CoreCycles),
        ],
    ),
    (
        "model-specific",
        [
            Counted::Model(&["BR_INST_RETIRED.CONDITIONAL", "BR_INST_RETIRED.COND"]),
            Counted::Model(&["MEM_INST_RETIRED.ALL_LOADS", "MEM_INST_RETIRED.LOADS", "MEM_UOPS_RETIRED.ALL_LOADS"]),
            Counted::Model(&["BR_MISP_RETIRED.CONDITIONAL", "BR_MISP_RETIRED.COND", "BR_MISP_RETIRED.ALL_BRANCHES"]),
            Counted::Model(&[
                "CPU_CLK_UNHALTED.ONE_THREAD_ACTIVE",
                "CPU_CLK_UNHALTED.REF_P",
                "CPU_CLK_UNHALTED.REF_XCLK",
            ]),
        ],
    ),
    (
        "architectural with the cache model",
        [
            Counted::Arch(Event::Instructions),
            Counted::Arch(Event::Branches),
            Counted::Arch(Event::LlcReference),
            Counted::Arch(Event::LlcMisses),
        ],
    ),
    (
        "model-specific with the cache model",
        [
            Counted::Model(&["BR_INST_RETIRED.CONDITIONAL", "BR_INST_RETIRED.COND"]),
            Counted::Model(&["MEM_INST_RETIRED.ALL_LOADS", "MEM_INST_RETIRED.LOADS", "MEM_UOPS_RETIRED.ALL_LOADS"]),
            Counted::Model(&[
                "MEM_LOAD_RETIRED.L1_MISS",
                "L2_RQSTS.ALL_DEMAND_DATA_RD",
                "L2_RQSTS.LOADS",
                "L1D_CACHE_LD.I_STATE",
            ]),
            Counted::Model(&["L1D.REPLACEMENT", "L1D.REPL", "L1D_CACHE_LD.MESI"]),
        ],
    ),
];

/// The code shape the events rows count: KVM's PMU test loop (a load, 7 NOPs and a LOOP per
/// iteration, a new cache line each time), and its iterations.
pub const EVENTS_SHAPE: (&str, u64) = ("loop10", 500_000);

/// One event set of [`EVENT_SETS`] as measured: its events' names, and the instructions counted
/// and TSC ticks taken, the best of [`ROUNDS`].
#[derive(Debug, Clone)]
pub struct EventsRow {
    pub label: &'static str,
    pub names: Vec<&'static str>,
    pub run: (u64, u64),
}

impl EventsRow {
    /// Counted instructions per TSC tick.
    pub fn rate(&self) -> f64 {
        self.run.0 as f64 / self.run.1 as f64
    }
}

/// PERFEVTSELx of `select`/`umask`, enabled at every privilege level.
fn evtsel(select: u8, umask: u8) -> u64 {
    0x43_0000 | u64::from(umask) << 8 | u64::from(select)
}

/// The PERFEVTSEL values and names of `set` under `profile`, or why it cannot be counted.
fn resolve(profile: &Profile, set: &[Counted; 4]) -> Result<(Vec<u64>, Vec<&'static str>), String> {
    let mut out = (Vec::new(), Vec::new());
    for (i, c) in set.iter().enumerate() {
        let (sel, name) = match c {
            Counted::Arch(e) => {
                let a = emon_pmu::profile::ArchEvent::get(*e);
                (evtsel(a.event_select, a.umask), a.name)
            }
            Counted::Model(candidates) => {
                let list = profile
                    .pmu
                    .events
                    .ok_or_else(|| format!("profile {} has no model-specific event list", profile.name))?;
                candidates
                    .iter()
                    .find_map(|name| {
                        let e = list.events.iter().find(|e| e.name == *name && e.on_gp(i as u8) && e.plain())?;
                        Some((evtsel(e.select, e.umask?), *name))
                    })
                    .ok_or_else(|| format!("{}'s list names none of {candidates:?} on IA32_PMC{i}", list.cpu))?
            }
        };
        out.0.push(sel);
        out.1.push(name);
    }
    Ok(out)
}

/// Measures every set of [`EVENT_SETS`] on [`EVENTS_SHAPE`] with the TCG engine, or says why it
/// cannot under `profile`.
pub fn measure_events(profile: &Profile) -> Result<Result<Vec<EventsRow>, String>, String> {
    if profile.pmu.gp < 4 || !profile.pmu.fixed_supported(0) {
        return Ok(Err(format!("profile {} has fewer than 4 GP counters or no IA32_FIXED_CTR0", profile.name)));
    }
    let mut sets = Vec::new();
    for (label, set) in &EVENT_SETS {
        match resolve(profile, set) {
            Ok(resolved) => sets.push((*label, resolved)),
            Err(why) => return Ok(Err(why)),
        }
    }
    let (shape, n) = EVENTS_SHAPE;
    let mut rows: Vec<EventsRow> =
        sets.iter().map(|(label, (_, names))| EventsRow { label, names: names.clone(), run: (0, u64::MAX) }).collect();
    for _ in 0..ROUNDS {
        for ((_, (sels, _)), row) in sets.iter().zip(&mut rows) {
            let hex = sels.iter().map(|s| format!("{s:x}")).collect::<Vec<_>>().join(",");
            let args = format!("mode=events shape={shape} n={n} sels={hex}");
            let kv = run_with_memory(profile, precise_backend(Engine::Tcg), &args, 128)?;
            let (counted, tsc) = (get(&kv, "counted")?, get(&kv, "tsc")?);
            // The loop retires 10 instructions an iteration; the counted stretch also has the
            // guest's dispatch to the shape around it.
            if !(10 * n..10 * n + 64).contains(&counted) {
                return Err(format!("{}: {counted} instructions counted over {n} iterations of {shape}", row.label));
            }
            if tsc < row.run.1 {
                row.run = (counted, tsc);
            }
        }
    }
    Ok(Ok(rows))
}

/// The host's TSC rate (the guest's TSC runs at the same rate under KVM), measured over 100 ms.
pub fn tsc_hz() -> f64 {
    // SAFETY: RDTSC has no side effects.
    let t0 = unsafe { core::arch::x86_64::_rdtsc() };
    let w0 = std::time::Instant::now();
    std::thread::sleep(Duration::from_millis(100));
    // SAFETY: as above.
    let t1 = unsafe { core::arch::x86_64::_rdtsc() };
    (t1 - t0) as f64 / w0.elapsed().as_secs_f64()
}
