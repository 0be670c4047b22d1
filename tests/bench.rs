//! `emon bench` runs and reports its ratios from one run. It lives in its own test binary so that
//! no other test competes for the CPU while it measures.
mod common;
use common::*;

#[test]
fn bench_reports_ratios_from_one_run() {
    if !kvm_available() {
        return;
    }
    let r = emon(&["bench", "--iterations", "5000", "--exits", "2000"]);
    r.assert_status(0);
    let ratio = |key: &str| -> f64 {
        let l = r.stdout.lines().find(|l| l.contains(key)).unwrap_or_else(|| panic!("no {key}: {}", r.stdout));
        l.rsplit(' ').next().unwrap().trim_end_matches('x').parse().unwrap()
    };
    // The precise backend's own work per step is small next to a single-step exit (0.97x measured
    // idle). `emon bench` alternates the runs it compares and keeps each one's best of
    // `bench::ROUNDS`, so load from other processes slows both sides alike; the bound is generous
    // and guards against gross regressions only.
    assert!(ratio("precise / bare single-step rate") > 0.6, "{}", r.stdout);
    assert!(ratio("PMU MSR exit / port I/O exit") > 0.0, "{}", r.stdout);
    // An RDPMC completed at the #GP handler is one breakpoint exit and a KVM_SET_REGS.
    assert!(ratio("RDPMC at the #GP handler / port I/O exit") > 0.5, "{}", r.stdout);
    // The TCG engine against single-stepping, per code shape: at least 100x measured on every
    // shape here (about 550x on the branchy loop, the slowest); the bound leaves room for load.
    for shape in ["straight", "loop10", "loopdot", "branchy", "kernel"] {
        let line =
            r.stdout.lines().find(|l| l.trim_start().starts_with(shape)).unwrap_or_else(|| panic!("{}", r.stdout));
        let x: f64 = line.rsplit(' ').next().unwrap().trim_end_matches('x').parse().unwrap();
        assert!(x > 50.0, "{shape}: {line}");
    }
    // CPL0 code with nothing counting, in the TCG engine against KVM (`--cpl0`): about 60x
    // measured here on the `dec; jnz` loop, 2-3x on mapping and touching 64 MiB (page faults,
    // which KVM delivers either way). On a host that runs CPL0 natively the engine is the slower
    // one, and only the report is checked.
    let free = |name: &str| -> f64 {
        let line =
            r.stdout.lines().find(|l| l.trim_start().starts_with(name)).unwrap_or_else(|| panic!("{}", r.stdout));
        line.rsplit(' ').next().unwrap().trim_end_matches('x').parse().unwrap()
    };
    let (spin, touch) = (free("loop "), free("touch 64 MiB"));
    if host_emulates_cpl0() {
        assert!(spin > 20.0, "{}", r.stdout);
        assert!(touch > 1.0, "{}", r.stdout);
    }
    // Model-specific events (issue 24's target: at least 0.5x of the architectural loop): about
    // 1.05x measured without the cache model, and 1.0x of the architectural cache events with it
    // (both pay the engine's per-instruction hook that feeds the cache model).
    assert!(ratio("model-specific / architectural events rate") > 0.5, "{}", r.stdout);
    assert!(
        ratio("model-specific with the cache model / architectural with the cache model rate") > 0.5,
        "{}",
        r.stdout
    );
    assert!(ratio("model-specific with the cache model / architectural events rate") > 0.0, "{}", r.stdout);
}
