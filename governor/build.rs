//! Builds the eBPF programs (`governor-ebpf`) for `bpfel-unknown-none` with the nightly toolchain
//! and places the object in `OUT_DIR/governor-ebpf`, where `src/accounting/ebpf.rs` embeds it.
//!
//! Why not `aya-build`: it builds into a target directory inside `OUT_DIR`, which differs between
//! `cargo build`, `cargo clippy` and `cargo test`, so every one of them would rebuild `core` and
//! the programs from scratch (~40 s each on a 2-core machine). This script builds into one shared
//! `target/ebpf` directory instead (incremental: ~1 s), finds the `bpf-linker` that
//! `cargo xtask setup` installs in `target/tools/bin` by itself (a plain `cargo build` does not
//! have it on PATH), and fails with a message that says what to run when a tool is missing.
//!
//! `GOVERNOR_EBPF_BUILD=skip` builds the daemon without the programs (an empty object): loading
//! then fails at run time and the daemon falls back to cgroupfs accounting, saying why.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

const EBPF_PACKAGE: &str = "governor-ebpf";
const EBPF_TARGET: &str = "bpfel-unknown-none";
const SKIP_ENV: &str = "GOVERNOR_EBPF_BUILD";

fn main() {
    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let workspace = manifest_dir
        .parent()
        .expect("governor/ lives in the workspace")
        .to_path_buf();
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets it"));
    let object = out_dir.join(EBPF_PACKAGE);

    println!("cargo:rerun-if-env-changed={SKIP_ENV}");
    for path in [
        "governor-ebpf/src",
        "governor-ebpf/Cargo.toml",
        "governor-common/src",
        "governor-common/Cargo.toml",
        "Cargo.lock",
    ] {
        println!("cargo:rerun-if-changed={}", workspace.join(path).display());
    }

    if env::var(SKIP_ENV).is_ok_and(|v| v == "skip") {
        println!(
            "cargo:warning={SKIP_ENV}=skip: building without the eBPF programs; the daemon will use cgroupfs CPU accounting"
        );
        std::fs::write(&object, b"").expect("cannot write the empty eBPF object");
        return;
    }

    let target_dir = target_dir(&workspace).join("ebpf");
    // bpf-linker: where `cargo xtask setup` installs it, then PATH.
    let search: Vec<PathBuf> = bpf_linker_dirs(&workspace)
        .into_iter()
        .chain(env::split_paths(&env::var_os("PATH").unwrap_or_default()))
        .collect();
    if !search.iter().any(|d| d.join("bpf-linker").is_file()) {
        fail(
            "bpf-linker not found in target/tools/bin or on PATH; run `cargo xtask setup` once \
             (it builds bpf-linker against nightly's LLVM into target/tools/bin)",
        );
    }
    let path = env::join_paths(&search).expect("PATH entries contain no separator");

    // `rustup run nightly cargo`: the workspace's rust-toolchain.toml pins stable, the eBPF
    // target needs nightly (`-Z build-std=core`).
    let mut cmd = Command::new("rustup");
    cmd.args([
        "run",
        "nightly",
        "cargo",
        "build",
        "--package",
        EBPF_PACKAGE,
    ])
    .args(["--bins", "--release", "--target", EBPF_TARGET])
    .args(["-Z", "build-std=core"])
    .arg("--target-dir")
    .arg(&target_dir)
    .current_dir(&workspace)
    .env("PATH", path)
    .env(
        "CARGO_ENCODED_RUSTFLAGS",
        [
            "--cfg=bpf_target_arch=\"x86_64\"",
            "-Cdebuginfo=2",
            "-Clink-arg=--btf",
        ]
        .join("\x1f"),
    );
    // The outer build's compiler settings must not leak into the nightly build.
    for key in [
        "RUSTC",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "RUSTFLAGS",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
        "RUSTUP_TOOLCHAIN",
        "CARGO",
    ] {
        cmd.env_remove(key);
    }
    let status = match cmd.status() {
        Ok(s) => s,
        Err(e) => fail(&format!(
            "cannot run `rustup run nightly cargo` ({e}); install rustup with a nightly toolchain and run `cargo xtask setup`"
        )),
    };
    if !status.success() {
        fail(&format!(
            "building {EBPF_PACKAGE} for {EBPF_TARGET} with nightly failed ({status}); see the errors above. \
             If nightly's rust-src or bpf-linker is missing or stale, run `cargo xtask setup`"
        ));
    }
    let built = target_dir
        .join(EBPF_TARGET)
        .join("release")
        .join(EBPF_PACKAGE);
    if let Err(e) = std::fs::copy(&built, &object) {
        fail(&format!(
            "cannot copy {} to {}: {e}",
            built.display(),
            object.display()
        ));
    }
}

/// Cargo's target directory for this workspace (honours CARGO_TARGET_DIR).
fn target_dir(workspace: &Path) -> PathBuf {
    match env::var_os("CARGO_TARGET_DIR").map(PathBuf::from) {
        Some(d) if d.is_absolute() => d,
        Some(d) => workspace.join(d),
        None => workspace.join("target"),
    }
}

/// Where `cargo xtask setup` puts bpf-linker: `<target>/tools/bin` (and the default target dir,
/// in case CARGO_TARGET_DIR points elsewhere).
fn bpf_linker_dirs(workspace: &Path) -> Vec<PathBuf> {
    let mut dirs = vec![target_dir(workspace).join("tools/bin")];
    let default = workspace.join("target/tools/bin");
    if !dirs.contains(&default) {
        dirs.push(default);
    }
    dirs
}

fn fail(message: &str) -> ! {
    // Printed both as a warning (visible in cargo's summary) and as the panic message.
    println!("cargo:warning=governor eBPF build: {message}");
    panic!("governor eBPF build: {message}");
}
