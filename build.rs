//! Builds emon's bare-metal test guests (`guest/`, a separate workspace) for the host target with
//! freestanding flags, and generates `$OUT_DIR/guests.rs`, which embeds every guest binary so the
//! `emon` executable can run `guest:NAME` from anywhere.
use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

const TARGET: &str = "x86_64-unknown-linux-gnu";

fn main() {
    let root = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let guest_dir = root.join("guest");
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let target_dir = out.join("guest-target");
    println!("cargo:rerun-if-changed=guest/src");
    println!("cargo:rerun-if-changed=guest/Cargo.toml");
    println!("cargo:rerun-if-changed=guest/link.ld");

    let names = guest_names(&guest_dir.join("src/bin"));
    build_guests(&guest_dir, &target_dir);

    let bin_dir = target_dir.join(TARGET).join("release");
    let mut gen = String::from("/// Built-in guests: (name, one-line description, ELF64 image).\npub static GUESTS: &[(&str, &str, &[u8])] = &[\n");
    for name in &names {
        let path = bin_dir.join(name);
        assert!(path.exists(), "guest build produced no {}", path.display());
        let about = description(&guest_dir.join("src/bin").join(format!("{name}.rs")));
        gen += &format!("    ({name:?}, {about:?}, include_bytes!({:?})),\n", path.display().to_string());
    }
    gen += "];\n";
    fs::write(out.join("guests.rs"), gen).expect("write guests.rs");
}

/// The first `//!` line of a guest's source.
fn description(src: &Path) -> String {
    let text = fs::read_to_string(src).unwrap_or_default();
    text.lines().find_map(|l| l.strip_prefix("//!")).map(|l| l.trim().to_owned()).unwrap_or_default()
}

fn guest_names(bin_dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(bin_dir)
        .expect("guest/src/bin")
        .filter_map(|e| {
            let p = e.ok()?.path();
            (p.extension()? == "rs").then(|| p.file_stem()?.to_str().map(str::to_owned))?
        })
        .collect();
    names.sort();
    names
}

fn build_guests(guest_dir: &Path, target_dir: &Path) {
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let link_script = guest_dir.join("link.ld");
    let rustflags = [
        "-C",
        "relocation-model=static",
        "-C",
        "code-model=small",
        "-C",
        "no-redzone=yes",
        "-C",
        "target-feature=-sse,-sse2,-sse3,-ssse3,-sse4.1,-sse4.2,-avx,-avx2",
        "-C",
        "link-arg=-nostartfiles",
        "-C",
        "link-arg=-static",
        "-C",
        "link-arg=-Wl,--build-id=none",
        "-C",
        &format!("link-arg=-T{}", link_script.display()),
    ]
    .join("\x1f");
    let mut cmd = Command::new(cargo);
    cmd.current_dir(guest_dir)
        .args(["build", "--release", "--bins", "--target", TARGET])
        .arg("--target-dir")
        .arg(target_dir);
    // The outer cargo's environment describes the outer build (flags, wrappers such as
    // clippy-driver, jobserver): the guest build must not inherit any of it.
    for (k, _) in env::vars_os() {
        let k = k.to_string_lossy().into_owned();
        if k.starts_with("CARGO_") || k.starts_with("RUSTC") || k == "RUSTFLAGS" || k == "RUSTDOCFLAGS" {
            cmd.env_remove(&k);
        }
    }
    cmd.env("CARGO_ENCODED_RUSTFLAGS", rustflags);
    let status = cmd.status().expect("run cargo to build guest/");
    assert!(status.success(), "building the guests in guest/ failed (see the output above)");
}
