//! Running commands with their command line echoed, and project paths.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

/// The workspace root (parent of `testbed/`).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("testbed lives in the workspace")
        .to_path_buf()
}

/// Cargo's target directory (honours CARGO_TARGET_DIR).
pub fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(d) => {
            let d = PathBuf::from(d);
            if d.is_absolute() {
                d
            } else {
                workspace_root().join(d)
            }
        }
        None => workspace_root().join("target"),
    }
}

/// Where the tools the project installs live (bpf-linker, LLVM prefix): `target/tools`.
pub(crate) fn tools_dir() -> PathBuf {
    target_dir().join("tools")
}

/// Where the VM bed keeps its venv, kernel and run directories: `target/bed`.
pub(crate) fn bed_dir() -> PathBuf {
    target_dir().join("bed")
}

/// Describe a command for messages: program and arguments, shell-like.
pub fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        let a = a.to_string_lossy();
        if a.contains(' ') || a.is_empty() {
            s.push_str(&format!(" '{a}'"));
        } else {
            s.push(' ');
            s.push_str(&a);
        }
    }
    s
}

/// Run a command with inherited stdio, echoing it first; fail with the command line on error.
pub fn run(cmd: &mut Command) -> Result<()> {
    let line = describe(cmd);
    eprintln!("  $ {line}");
    let status = cmd
        .status()
        .with_context(|| format!("cannot start `{line}`"))?;
    if !status.success() {
        bail!("`{line}` failed ({status})");
    }
    Ok(())
}

/// Run a command and capture its stdout (stderr inherited); fail with the command line on error.
pub fn output(cmd: &mut Command) -> Result<String> {
    let line = describe(cmd);
    let out = cmd
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("cannot start `{line}`"))?;
    if !out.status.success() {
        bail!("`{line}` failed ({})", out.status);
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// How `governor/build.rs` treats missing eBPF tools in the builds xtask runs (its
/// `GOVERNOR_EBPF_BUILD`), set once by a command that could not install them.
static EBPF_BUILD: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();

/// Build the daemon without its eBPF programs in every later cargo command of this run (the
/// demo, when the eBPF tools could not be installed: it still shows the policies).
pub fn build_without_ebpf() {
    let _ = EBPF_BUILD.set("skip");
}

/// A `cargo` command using the same cargo that runs xtask.
///
/// Every xtask command installs the eBPF tools before it builds, so its builds require the
/// programs (`GOVERNOR_EBPF_BUILD=require`): a daemon built without them fails the build here
/// instead of passing the tests on the cgroupfs fallback. The caller's own `GOVERNOR_EBPF_BUILD`
/// wins. The value must be the same in every stage of a run: changing it reruns the build script
/// and rebuilds the daemon and everything above it.
pub fn cargo() -> Command {
    let mut c = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    c.current_dir(workspace_root());
    // governor/build.rs links the eBPF object with the bpf-linker `setup` installs here.
    let path = std::env::var("PATH").unwrap_or_default();
    c.env(
        "PATH",
        format!("{}:{path}", tools_dir().join("bin").display()),
    );
    if std::env::var_os("GOVERNOR_EBPF_BUILD").is_none() {
        c.env(
            "GOVERNOR_EBPF_BUILD",
            EBPF_BUILD.get().copied().unwrap_or("require"),
        );
    }
    c
}

/// `rustup run nightly <program>` in the workspace root, without the outer (stable) cargo's
/// settings, which must not leak into the nightly run (its own target directory included).
pub fn nightly(program: &str) -> Command {
    let mut c = Command::new("rustup");
    c.args(["run", "nightly", program])
        .current_dir(workspace_root());
    for key in [
        "RUSTC",
        "RUSTC_WRAPPER",
        "RUSTFLAGS",
        "CARGO_TARGET_DIR",
        "RUSTUP_TOOLCHAIN",
        "CARGO",
    ] {
        c.env_remove(key);
    }
    c
}

/// Whether this process runs as root.
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false)
}

/// Free space, in GiB, on the file system that holds the target directory (`None` if unknown).
fn target_free_gib() -> Option<f64> {
    let dir = target_dir();
    let _ = std::fs::create_dir_all(&dir);
    // `df` rather than statvfs: xtask holds no unsafe code.
    let out = output(Command::new("df").args(["-P", "-k"]).arg(&dir)).ok()?;
    let available_kib: f64 = out
        .lines()
        .nth(1)?
        .split_whitespace()
        .nth(3)?
        .parse()
        .ok()?;
    Some(available_kib / f64::from(1u32 << 20))
}

/// Prints the free space under the target directory: CI's disk has run full before, and a
/// figure per stage tells which stage used it.
pub fn report_free_disk(stage: &str) {
    if let Some(gib) = target_free_gib() {
        eprintln!("   disk: {gib:.1} GiB free under the target directory ({stage})");
    }
}

/// What a project-local Python environment's stamp says: the packages installed, then each
/// package removed after (`-NAME`).
fn venv_stamp(packages: &[&str], uninstall: &[&str]) -> String {
    let mut lines: Vec<String> = packages.iter().map(|p| (*p).to_owned()).collect();
    lines.extend(uninstall.iter().map(|p| format!("-{p}")));
    lines.join("\n")
}

/// The Python of the environment at `venv`, if it holds exactly `packages` (less `uninstall`),
/// as its stamp file says.
pub fn venv_python(venv: &Path, packages: &[&str], uninstall: &[&str]) -> Option<PathBuf> {
    let python = venv.join("bin/python");
    let stamp = std::fs::read_to_string(venv.join("governor-packages")).ok()?;
    (python.exists() && stamp == venv_stamp(packages, uninstall)).then_some(python)
}

/// A project-local Python environment at `venv` with `packages` from PyPI (then `uninstall`
/// removed): created and filled once, reused while its stamp names the same packages.
/// `what` names it in the output and in the error.
pub fn python_venv(
    venv: &Path,
    packages: &[&str],
    uninstall: &[&str],
    what: &str,
) -> Result<PathBuf> {
    if let Some(python) = venv_python(venv, packages, uninstall) {
        return Ok(python);
    }
    let python = venv.join("bin/python");
    eprintln!(
        "== Python environment for {what} (PyPI, {})",
        venv.display()
    );
    let started = std::time::Instant::now();
    if !python.exists() {
        run(Command::new("python3").args(["-m", "venv"]).arg(venv))?;
    }
    run(Command::new(&python)
        .args(["-m", "pip", "install", "-q", "--disable-pip-version-check"])
        .args(packages))
    .with_context(|| format!("installing {what} from PyPI failed"))?;
    if !uninstall.is_empty() {
        run(Command::new(&python)
            .args(["-m", "pip", "uninstall", "-q", "-y"])
            .args(uninstall))?;
    }
    std::fs::write(
        venv.join("governor-packages"),
        venv_stamp(packages, uninstall),
    )?;
    eprintln!("   installed in {:.0} s", started.elapsed().as_secs_f64());
    Ok(python)
}

/// A free TCP port on localhost (bound and released: a race with another program is possible
/// but harmless here, the start then fails loudly).
pub fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}
