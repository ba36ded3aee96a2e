//! Builds the eBPF programs (`governor-ebpf`) for `bpfel-unknown-none` with the nightly toolchain
//! and places the object in `OUT_DIR/governor-ebpf`, where `src/accounting/ebpf.rs` embeds it.
//!
//! Why not `aya-build`: it builds into a target directory inside `OUT_DIR`, which differs between
//! `cargo build`, `cargo clippy` and `cargo test`, so every one of them would rebuild `core` and
//! the programs from scratch (~40 s each on a 2-core machine). This script builds into one shared
//! `target/ebpf` directory instead (incremental: ~1 s), and finds the `bpf-linker` that
//! `cargo xtask setup` installs in `target/tools/bin` by itself (a plain `cargo build` does not
//! have it on PATH).
//!
//! `GOVERNOR_EBPF_BUILD` chooses what happens when a tool is missing:
//! - unset (a plain `cargo build`): the daemon is built without the programs, with one warning
//!   that names the missing tool and how to get it. Why not stop: an operator who only wants the
//!   daemon gets a working one; without the programs it accounts CPU from cgroupfs (`cpu.stat`,
//!   `cpuacct`), which every kernel has, and `governor status` says so and why.
//! - `require` (`cargo xtask test`, CI): a missing tool or a failed build stops the build.
//! - `skip`: build without the programs even where the tools are present.
//!
//! Once the programs are built, a failure to build them (a compile error) always stops the build:
//! that is a bug to see, not a tool to install.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

const EBPF_PACKAGE: &str = "governor-ebpf";
const EBPF_TARGET: &str = "bpfel-unknown-none";
const MODE_ENV: &str = "GOVERNOR_EBPF_BUILD";
/// Why the binary has no programs, compiled into it for `governor status` (empty: it has them).
const MISSING_ENV: &str = "GOVERNOR_EBPF_MISSING";

fn main() {
    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let workspace = manifest_dir
        .parent()
        .expect("governor/ lives in the workspace")
        .to_path_buf();
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets it"));
    let object = out_dir.join(EBPF_PACKAGE);

    println!("cargo:rerun-if-env-changed={MODE_ENV}");
    for path in [
        "governor-ebpf/src",
        "governor-ebpf/Cargo.toml",
        "governor-common/src",
        "governor-common/Cargo.toml",
        "Cargo.lock",
    ] {
        println!("cargo:rerun-if-changed={}", workspace.join(path).display());
    }
    // `cargo xtask setup` installing bpf-linker later must rebuild with the programs: watch the
    // directory it installs into (made here, empty, so that cargo has something to watch; a
    // missing path would rerun this script on every build).
    for dir in bpf_linker_dirs(&workspace) {
        if std::fs::create_dir_all(&dir).is_ok() {
            println!("cargo:rerun-if-changed={}", dir.display());
        }
    }

    let mode = env::var(MODE_ENV).unwrap_or_default();
    if mode == "skip" {
        build_without(&object, &format!("it was built with {MODE_ENV}=skip"), None);
        return;
    }
    let required = mode == "require";

    // bpf-linker: where `cargo xtask setup` installs it, then PATH.
    let search: Vec<PathBuf> = bpf_linker_dirs(&workspace)
        .into_iter()
        .chain(env::split_paths(&env::var_os("PATH").unwrap_or_default()))
        .collect();
    if let Err(missing) = tools_present(&search) {
        if required {
            fail(&format!("{missing}; run `cargo xtask setup` once"));
        }
        build_without(
            &object,
            &missing,
            Some("run `cargo xtask setup` once to build with it"),
        );
        return;
    }
    let path = env::join_paths(&search).expect("PATH entries contain no separator");
    let target_dir = target_dir(&workspace).join("ebpf");

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
    println!("cargo:rustc-env={MISSING_ENV}=");
}

/// What is missing to build the programs (`Err`: one sentence for the operator), checked before
/// anything is built: nightly with `rust-src` (`-Z build-std=core`) and bpf-linker.
fn tools_present(search: &[PathBuf]) -> Result<(), String> {
    if !search.iter().any(|d| d.join("bpf-linker").is_file()) {
        return Err("bpf-linker is not installed (looked in target/tools/bin and on PATH)".into());
    }
    let sysroot = Command::new("rustup")
        .args(["run", "nightly", "rustc", "--print", "sysroot"])
        .env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("RUSTC")
        .output();
    let sysroot = match sysroot {
        Ok(out) if out.status.success() => {
            PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
        }
        _ => return Err("the nightly Rust toolchain is not installed (rustup)".into()),
    };
    if !sysroot.join("lib/rustlib/src/rust/library/core").is_dir() {
        return Err("nightly's rust-src component is not installed".into());
    }
    Ok(())
}

/// Build the daemon without the programs: an empty object (the daemon then accounts CPU from
/// cgroupfs) and the reason compiled in, said once in cargo's output.
fn build_without(object: &Path, why: &str, remedy: Option<&str>) {
    let remedy = remedy.map(|r| format!("; {r}")).unwrap_or_default();
    println!(
        "cargo:warning=building the daemon without its eBPF CPU accounting: {why}{remedy} (it accounts CPU from cgroupfs instead)"
    );
    println!("cargo:rustc-env={MISSING_ENV}={why}");
    std::fs::write(object, b"").expect("cannot write the empty eBPF object");
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

/// Stop the build with one line (a warning, which cargo shows in its summary) and no backtrace.
fn fail(message: &str) -> ! {
    println!("cargo:warning=governor eBPF build: {message}");
    eprintln!("governor eBPF build: {message}");
    std::process::exit(1);
}
