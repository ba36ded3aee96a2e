//! `cargo xtask setup`: install what the project needs on a fresh machine, idempotently.
//!
//! Steps (each prints what it does, skips when done, and on failure says what failed and how to
//! retry):
//! 1. nightly `rust-src` (the eBPF crate is built with `-Z build-std=core`);
//! 2. `bpf-linker` built against the nightly toolchain's own LLVM into `target/tools`, rebuilt
//!    when the nightly toolchain changes;
//! 3. Debian packages: qemu-system-x86 (the VM), busybox-static (virtme-ng's initramfs), criu
//!    (checkpoint/restore inside the VM), kmod (module loading in the guest), iproute2 (the VM
//!    nodes' network), prometheus (a real scraper for the metrics tests),
//!    chromium (a real browser for the dashboard tests), never removing a
//!    package the machine has (apt `--no-remove`; QEMU is taken from the release of the qemu-*
//!    packages already installed, e.g. bookworm-backports);
//! 4. virtme-ng from PyPI into a project-local venv (`target/bed/venv`);
//! 5. the Debian kernel image the VM boots (downloaded once, extracted under `target/bed/kernel`,
//!    verified to boot).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::cmd::{self, bed_dir, tools_dir};

/// bpf-linker release known to build against the nightly LLVM here (TESTBED.md).
const BPF_LINKER_VERSION: &str = "0.13.0";
/// virtme-ng release known to work here (TESTBED.md).
const VIRTME_NG_VERSION: &str = "1.42";
/// Debian packages the bed uses on the host (the guest shares the host's filesystem).
const DEBIAN_PACKAGES: &[&str] = &[
    "qemu-system-x86",
    "busybox-static",
    "criu",
    "kmod",
    "iproute2",
    // The observability tests: a real Prometheus scrapes the daemon and the coordinator, and a
    // headless Chromium renders the live cluster page.
    "prometheus",
    "chromium",
    // The replicated coordinator's tests: a three-member etcd cluster on loopback.
    "etcd-server",
];
/// The meta package whose dependency names the kernel image to boot.
const KERNEL_META_PACKAGE: &str = "linux-image-amd64";

/// What the other commands need from a completed set-up.
#[derive(Debug, Clone)]
pub struct Bed {
    /// `vng` in the project venv.
    pub vng: PathBuf,
    /// The kernel image to boot.
    pub vmlinuz: PathBuf,
    /// Its release string (`uname -r` in the guest).
    pub kernel_release: String,
    /// busybox for virtme-ng's initramfs.
    pub busybox: PathBuf,
    /// modprobe for the guest's module auto-loader.
    pub modprobe: PathBuf,
}

/// Run every step; return the paths the bed needs.
pub fn run() -> Result<Bed> {
    eprintln!(
        "== setup (idempotent; tools under {})",
        cmd::target_dir().display()
    );
    ebpf_tools()?;
    step("Debian packages", debian_packages)?;
    let vng = step("virtme-ng", virtme_ng)?;
    let (vmlinuz, kernel_release) = step("VM kernel", kernel_image)?;
    let bed = Bed {
        vng,
        vmlinuz,
        kernel_release,
        busybox: PathBuf::from("/bin/busybox"),
        modprobe: PathBuf::from("/usr/sbin/modprobe"),
    };
    step("VM boots", || verify_boot(&bed))?;
    eprintln!("== setup complete");
    Ok(bed)
}

/// The steps the daemon's eBPF programs need (nightly `rust-src`, `bpf-linker`): all that the
/// host demo needs of the set-up.
pub fn ebpf_tools() -> Result<()> {
    step("nightly rust-src", nightly_rust_src)?;
    step("bpf-linker", bpf_linker)
}

/// [`ebpf_tools`], or, where they cannot be installed, every later build of this run without the
/// daemon's eBPF programs (it accounts CPU from cgroupfs; the policies are the same), said once.
/// For the commands that run real jobs on this host (the demo, `bench-real`), which need the
/// daemon, not its eBPF accounting.
pub fn ebpf_tools_or_build_without() {
    if let Err(e) = ebpf_tools() {
        eprintln!(
            "== the eBPF build tools could not be installed ({e:#}): the daemon is built \
             without its eBPF CPU accounting and accounts CPU from cgroupfs (the policies are the same)"
        );
        cmd::build_without_ebpf();
    }
}

fn step<T>(name: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    eprintln!("-- {name}");
    let started = std::time::Instant::now();
    let result = f();
    eprintln!(
        "   [timing] {name}: {:.0} s",
        started.elapsed().as_secs_f64()
    );
    result.with_context(|| format!("setup step `{name}` failed; fix the cause above and rerun `cargo xtask setup` (each step resumes where it stopped)"))
}

fn nightly_rust_src() -> Result<()> {
    let installed = cmd::output(Command::new("rustup").args(["component", "list", "--toolchain", "nightly", "--installed"]))
        .context("the nightly toolchain is missing (rustup toolchain list shows no `nightly`); the eBPF crate needs it")?;
    if installed.lines().any(|l| l.starts_with("rust-src")) {
        eprintln!("   already installed");
        return Ok(());
    }
    cmd::run(Command::new("rustup").args([
        "component",
        "add",
        "rust-src",
        "--toolchain",
        "nightly",
    ]))
}

/// `rustc +nightly -vV`: identifies the nightly toolchain (commit hash, LLVM version).
fn nightly_version() -> Result<String> {
    cmd::output(Command::new("rustc").args(["+nightly", "-vV"]))
}

fn bpf_linker() -> Result<()> {
    let tools = tools_dir();
    let bin = tools.join("bin/bpf-linker");
    let stamp = tools.join("bpf-linker.stamp");
    let nightly = nightly_version()?;
    let want_stamp = format!("bpf-linker {BPF_LINKER_VERSION}\n{nightly}");
    if bin.exists() && fs::read_to_string(&stamp).ok().as_deref() == Some(want_stamp.as_str()) {
        eprintln!("   {} is current for this nightly toolchain", bin.display());
        return Ok(());
    }
    let llvm_major = nightly
        .lines()
        .find_map(|l| l.strip_prefix("LLVM version: "))
        .and_then(|v| v.split('.').next())
        .context("`rustc +nightly -vV` does not report an LLVM version")?
        .to_owned();
    let sysroot = cmd::output(Command::new("rustc").args(["+nightly", "--print", "sysroot"]))?
        .trim()
        .to_owned();
    let lib = Path::new(&sysroot).join("lib");
    let so = fs::read_dir(&lib)
        .with_context(|| format!("cannot list {}", lib.display()))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| n.starts_with("libLLVM.so."))
        .with_context(|| {
            format!(
                "no libLLVM.so.* in the nightly toolchain ({})",
                lib.display()
            )
        })?;
    // bpf-linker links -lLLVM from $LLVM_PREFIX/lib and finds it at run time by its SONAME
    // through an rpath to the same directory, so both names point at the toolchain's library.
    let prefix = tools.join("llvm-prefix");
    let prefix_lib = prefix.join("lib");
    fs::create_dir_all(&prefix_lib)?;
    for name in ["libLLVM.so", so.as_str()] {
        let link = prefix_lib.join(name);
        let _ = fs::remove_file(&link);
        std::os::unix::fs::symlink(lib.join(&so), &link)
            .with_context(|| format!("cannot link {}", link.display()))?;
    }
    eprintln!(
        "   building bpf-linker {BPF_LINKER_VERSION} against the nightly LLVM {llvm_major} ({so}); about a minute"
    );
    cmd::run(
        Command::new("cargo")
            .args([
                "+stable",
                "install",
                &format!("bpf-linker@{BPF_LINKER_VERSION}"),
                "--locked",
                "--force",
            ])
            .args([
                "--no-default-features",
                "--features",
                &format!("llvm-{llvm_major}"),
            ])
            .arg("--root")
            .arg(&tools)
            .arg("--target-dir")
            .arg(tools.join("build"))
            .env("LLVM_PREFIX", &prefix),
    )?;
    cmd::run(Command::new(&bin).arg("--version"))?;
    // The build's intermediate files (~270 MB) are not needed once the binary is installed.
    let _ = fs::remove_dir_all(tools.join("build"));
    fs::write(&stamp, want_stamp)?;
    Ok(())
}

fn package_installed(name: &str) -> bool {
    cmd::output(Command::new("dpkg-query").args(["-W", "-f=${Status}", name]))
        .map(|s| s.trim() == "install ok installed")
        .unwrap_or(false)
}

fn installed_version(name: &str) -> Option<String> {
    cmd::output(Command::new("dpkg-query").args(["-W", "-f=${Status}\t${Version}", name]))
        .ok()
        .and_then(|s| {
            let (status, version) = s.trim().split_once('\t')?;
            (status == "install ok installed").then(|| version.to_owned())
        })
}

/// QEMU's packages must all come from one release: `qemu-system-x86` from bookworm beside a
/// newer `qemu-utils` (this machine kind ships the bookworm-backports one) makes apt remove the
/// user's package. When another QEMU package is installed at a version the configured sources
/// do not offer, ask for `qemu-system-x86` at that same version from bookworm-backports
/// (through a private sources list: /etc/apt is never changed).
const QEMU_SIBLINGS: &[&str] = &["qemu-utils", "qemu-system-common", "qemu-block-extra"];
const BACKPORTS_SOURCE: &str = "deb http://deb.debian.org/debian bookworm-backports main";

/// apt options that add bookworm-backports for one call (its lists kept under target/bed/apt).
fn backports_options() -> Result<Vec<String>> {
    let dir = bed_dir().join("apt");
    fs::create_dir_all(dir.join("lists/partial"))?;
    let sources = dir.join("sources.list");
    let system: String = ["/etc/apt/sources.list"]
        .iter()
        .filter_map(|p| fs::read_to_string(p).ok())
        .collect();
    fs::write(&sources, format!("{system}\n{BACKPORTS_SOURCE}\n"))?;
    Ok(vec![
        format!("-oDir::Etc::sourcelist={}", sources.display()),
        // The system's other sources (sources.list.d) stay in use.
        "-oAPT::Get::List-Cleanup=0".to_owned(),
    ])
}

fn debian_packages() -> Result<()> {
    let missing: Vec<&str> = DEBIAN_PACKAGES
        .iter()
        .copied()
        .filter(|p| !package_installed(p))
        .collect();
    if missing.is_empty() {
        eprintln!("   installed: {}", DEBIAN_PACKAGES.join(", "));
        return Ok(());
    }
    if !cmd::is_root() {
        bail!(
            "packages missing: {}; installing them needs root: run `sudo apt-get install -y {}` or rerun as root",
            missing.join(", "),
            missing.join(" ")
        );
    }
    // Pin qemu-system-x86 to the version of the QEMU the user already has, if it is not the one
    // the configured sources would pick.
    let qemu_pin = QEMU_SIBLINGS
        .iter()
        .find_map(|p| installed_version(p).map(|v| (*p, v)))
        .filter(|(_, v)| v.contains("bpo"));
    // QEMU from backports goes in a call of its own (`-t bookworm-backports` would take
    // every other package from there too).
    let mut calls: Vec<(Vec<String>, Vec<String>)> = Vec::new();
    let mut plain: Vec<String> = missing.iter().map(|p| (*p).to_owned()).collect();
    if let Some((sibling, version)) = &qemu_pin
        && missing.contains(&"qemu-system-x86")
    {
        eprintln!(
            "   {sibling} {version} is installed: taking qemu-system-x86 {version} from bookworm-backports to match it"
        );
        plain.retain(|p| p != "qemu-system-x86");
        let mut extra = backports_options()?;
        extra.extend(["-t".to_owned(), "bookworm-backports".to_owned()]);
        calls.push((extra, vec![format!("qemu-system-x86={version}")]));
    }
    if !plain.is_empty() {
        calls.push((Vec::new(), plain));
    }
    for (extra, args) in calls {
        install_packages(&extra, &args)?;
    }
    Ok(())
}

/// `apt-get install` that never removes a package: on a conflict it stops and names what would
/// have gone.
fn install_packages(extra: &[String], args: &[String]) -> Result<()> {
    let apt = |verb: &[&str]| {
        let mut c = Command::new("apt-get");
        c.args(extra)
            .args(verb)
            .env("DEBIAN_FRONTEND", "noninteractive");
        c
    };
    cmd::run(&mut apt(&["update", "-q"]))
        .context("apt-get update failed (is a Debian mirror reachable?)")?;
    // `--no-remove`: apt stops rather than remove anything a user installed.
    let install = cmd::run(
        apt(&[
            "install",
            "-y",
            "-q",
            "--no-install-recommends",
            "--no-remove",
        ])
        .args(args),
    );
    if install.is_ok() {
        return Ok(());
    }
    // Say what the install would have removed, and the choice.
    let simulated =
        cmd::output(apt(&["install", "-s", "-q", "--no-install-recommends"]).args(args))
            .unwrap_or_default();
    let removals: Vec<&str> = simulated
        .lines()
        .filter_map(|l| l.strip_prefix("Remv "))
        .collect();
    if removals.is_empty() {
        return install.with_context(|| format!("apt-get install {} failed", args.join(" ")));
    }
    bail!(
        "installing {} would remove software already on this machine: {}. Setup never removes \
         packages. Either install versions of {} that fit beside them yourself (for QEMU: the \
         same release as the installed qemu-* packages) and rerun, or remove those packages \
         yourself if you no longer need them",
        args.join(" "),
        removals.join("; "),
        args.join(", ")
    )
}

fn virtme_ng() -> Result<PathBuf> {
    let venv = bed_dir().join("venv");
    let vng = venv.join("bin/vng");
    if vng.exists()
        && cmd::output(Command::new(&vng).arg("--version"))
            .map(|v| v.contains(VIRTME_NG_VERSION))
            .unwrap_or(false)
    {
        eprintln!("   {} ({VIRTME_NG_VERSION})", vng.display());
        return Ok(vng);
    }
    fs::create_dir_all(bed_dir())?;
    cmd::run(Command::new("python3").args(["-m", "venv"]).arg(&venv))
        .context("cannot create a Python venv (python3 with the venv module is required)")?;
    cmd::run(Command::new(venv.join("bin/pip")).args([
        "install",
        "-q",
        &format!("virtme-ng=={VIRTME_NG_VERSION}"),
    ]))
    .context("pip could not install virtme-ng from PyPI")?;
    Ok(vng)
}

/// The kernel image package `linux-image-amd64` depends on, e.g. `linux-image-6.1.0-56-amd64`.
fn kernel_package() -> Result<String> {
    let deps = cmd::output(Command::new("apt-cache").args(["depends", KERNEL_META_PACKAGE]))?;
    if let Some(p) = deps
        .lines()
        .find_map(|l| l.trim().strip_prefix("Depends: "))
        .filter(|p| p.starts_with("linux-image-"))
    {
        return Ok(p.trim().to_owned());
    }
    // The package lists may not have been fetched yet on a fresh machine.
    cmd::run(
        Command::new("apt-get")
            .args(["update", "-q"])
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )?;
    let deps = cmd::output(Command::new("apt-cache").args(["depends", KERNEL_META_PACKAGE]))?;
    deps.lines()
        .find_map(|l| l.trim().strip_prefix("Depends: "))
        .map(|p| p.trim().to_owned())
        .with_context(|| {
            format!("apt-cache does not know which kernel {KERNEL_META_PACKAGE} depends on")
        })
}

fn kernel_image() -> Result<(PathBuf, String)> {
    let kernel_dir = bed_dir().join("kernel");
    // Reuse an extracted kernel without asking apt (offline re-runs); otherwise resolve and fetch.
    if let Some(found) = find_extracted_kernel(&kernel_dir) {
        eprintln!("   {} (cached)", found.0.display());
        return Ok(found);
    }
    let package = kernel_package()?;
    fs::create_dir_all(&kernel_dir)?;
    let deb_dir = kernel_dir.join("deb");
    fs::create_dir_all(&deb_dir)?;
    let has_deb = |d: &Path| {
        fs::read_dir(d)
            .ok()
            .and_then(|mut it| {
                it.find(|e| {
                    e.as_ref()
                        .is_ok_and(|e| e.file_name().to_string_lossy().starts_with(&package))
                })
            })
            .is_some()
    };
    if !has_deb(&deb_dir) {
        eprintln!("   downloading {package}");
        cmd::run(
            Command::new("apt-get")
                .arg("download")
                .arg(&package)
                .current_dir(&deb_dir),
        )
        .with_context(|| format!("apt-get download {package} failed"))?;
    }
    let deb = fs::read_dir(&deb_dir)?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(&package))
        })
        .context("downloaded kernel package not found")?;
    let extract = kernel_dir.join(&package);
    let partial = kernel_dir.join(format!("{package}.partial"));
    let _ = fs::remove_dir_all(&partial);
    eprintln!("   extracting {}", deb.display());
    cmd::run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&partial))?;
    fs::rename(&partial, &extract)?;
    // The package is not needed once extracted (70 MB of a disk CI has found full before).
    let _ = fs::remove_dir_all(&deb_dir);
    find_extracted_kernel(&kernel_dir).context("the kernel package holds no boot/vmlinuz-*")
}

fn find_extracted_kernel(kernel_dir: &Path) -> Option<(PathBuf, String)> {
    let entries = fs::read_dir(kernel_dir).ok()?;
    for e in entries.filter_map(|e| e.ok()) {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.starts_with("linux-image-") || name.ends_with(".partial") {
            continue;
        }
        let boot = e.path().join("boot");
        for b in fs::read_dir(&boot).ok()?.filter_map(|e| e.ok()) {
            let n = b.file_name().to_string_lossy().into_owned();
            if let Some(release) = n.strip_prefix("vmlinuz-") {
                return Some((b.path(), release.to_owned()));
            }
        }
    }
    None
}

fn verify_boot(bed: &Bed) -> Result<()> {
    let stamp = bed_dir().join("boot-verified");
    // Keyed by the kernel release, not the path: worktrees share one bed through symlinks.
    let want = format!("{}\n", bed.kernel_release);
    if fs::read_to_string(&stamp).ok().as_deref() == Some(want.as_str()) {
        eprintln!("   {} booted before", bed.kernel_release);
        return Ok(());
    }
    eprintln!("   booting {} once under TCG (~10 s)", bed.kernel_release);
    let out = crate::vm::run_guest_command(bed, "boot-check", "uname -r")?;
    if out.trim() != bed.kernel_release {
        bail!(
            "the guest reported kernel {:?}, expected {:?}",
            out.trim(),
            bed.kernel_release
        );
    }
    fs::write(&stamp, want)?;
    eprintln!("   guest kernel {} boots", out.trim());
    Ok(())
}
