//! `governor/build.rs` where the eBPF tools are missing, as on a fresh machine: a plain build
//! makes a daemon without the programs and says in one line what is missing and how to get it;
//! a build that requires them (`cargo xtask test`) stops with that line, without a panic.
//!
//! The build script cargo compiled for this test run is run directly, in a scratch workspace
//! that has no `target/tools` and a PATH without bpf-linker.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The newest `build-script-build` of this package in the target directory this test runs from.
fn build_script() -> PathBuf {
    let exe = std::env::current_exe().expect("the test knows its path");
    // target/<profile>/deps/<test>: the build scripts are in target/<profile>/build.
    let build = exe
        .parent()
        .and_then(Path::parent)
        .expect("the test runs from target/<profile>/deps")
        .join("build");
    std::fs::read_dir(&build)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", build.display()))
        .filter_map(|e| e.ok())
        // `governor-<hash>`, not `governor-proto-<hash>` and the like.
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .strip_prefix("governor-")
                .is_some_and(|hash| hash.chars().all(|c| c.is_ascii_hexdigit()))
        })
        .map(|e| e.path().join("build-script-build"))
        .filter(|p| p.is_file())
        .max_by_key(|p| p.metadata().and_then(|m| m.modified()).ok())
        .unwrap_or_else(|| panic!("no governor build script under {}", build.display()))
}

/// Runs the build script as cargo would, in a scratch workspace without any tools; returns its
/// output and the object it wrote.
fn run_build_script(mode: Option<&str>) -> (Output, Option<Vec<u8>>) {
    let scratch = tempfile::tempdir().unwrap();
    let manifest = scratch.path().join("governor");
    let out_dir = scratch.path().join("out");
    std::fs::create_dir_all(&manifest).unwrap();
    std::fs::create_dir_all(&out_dir).unwrap();
    let mut cmd = Command::new(build_script());
    cmd.env_clear()
        .env("CARGO_MANIFEST_DIR", &manifest)
        .env("OUT_DIR", &out_dir)
        // rustup and cargo stay findable (the script asks rustup for nightly); bpf-linker is not
        // in these directories on any machine: `cargo xtask setup` installs it under target/.
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", std::env::var_os("HOME").unwrap_or_default());
    if let Some(mode) = mode {
        cmd.env("GOVERNOR_EBPF_BUILD", mode);
    }
    let output = cmd.output().expect("the build script runs");
    let object = std::fs::read(out_dir.join("governor-ebpf")).ok();
    (output, object)
}

fn lines_starting<'a>(text: &'a str, prefix: &str) -> Vec<&'a str> {
    text.lines().filter(|l| l.starts_with(prefix)).collect()
}

#[test]
fn a_plain_build_without_bpf_linker_builds_the_daemon_without_ebpf_and_says_why_once() {
    let (output, object) = run_build_script(None);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the build stopped: {}\n{stdout}\n{stderr}",
        output.status
    );
    let warnings = lines_starting(&stdout, "cargo:warning=");
    assert_eq!(warnings.len(), 1, "not one line: {warnings:?}");
    assert!(
        warnings[0].contains("bpf-linker") && warnings[0].contains("cargo xtask setup"),
        "the line does not say what is missing and how to get it: {}",
        warnings[0]
    );
    assert_eq!(
        object.as_deref(),
        Some(&b""[..]),
        "the daemon's eBPF object should be built empty"
    );
    let reason = lines_starting(&stdout, "cargo:rustc-env=GOVERNOR_EBPF_MISSING=");
    assert_eq!(reason.len(), 1, "no reason compiled in: {stdout}");
    assert!(
        reason[0].contains("bpf-linker"),
        "the reason `governor status` shows does not name the tool: {}",
        reason[0]
    );
}

#[test]
fn a_build_that_requires_ebpf_stops_with_one_line_and_no_panic() {
    let (output, _) = run_build_script(Some("require"));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "the build went on without eBPF");
    assert!(!stderr.contains("panicked"), "it panicked: {stderr}");
    let said: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(said.len(), 1, "not one line: {said:?}");
    assert!(
        said[0].contains("bpf-linker") && said[0].contains("cargo xtask setup"),
        "the line does not say what is missing and how to get it: {}",
        said[0]
    );
    assert_eq!(lines_starting(&stdout, "cargo:warning=").len(), 1);
}

#[test]
fn a_build_told_to_skip_ebpf_says_so() {
    let (output, object) = run_build_script(Some("skip"));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success());
    assert_eq!(object.as_deref(), Some(&b""[..]));
    let reason = lines_starting(&stdout, "cargo:rustc-env=GOVERNOR_EBPF_MISSING=");
    assert!(
        reason.len() == 1 && reason[0].contains("GOVERNOR_EBPF_BUILD=skip"),
        "{stdout}"
    );
}
