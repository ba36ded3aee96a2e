//! The real tracking back-ends, for the progress crate's fixtures and live tests:
//! `cargo xtask writer-fixtures` regenerates `governor-progress/tests/data/real_writers/` with
//! the writers themselves (`make_fixtures.py` beside the fixtures says what each one is), and
//! [`python`] gives `cargo xtask test` the environment its live tests run the writers in.
//!
//! The environment is a venv, `target/writers/venv` (or `GOVERNOR_WRITERS_VENV`), filled once
//! from PyPI and reused while its stamp file names the same packages (as `bench_real`'s).
//! `cargo xtask test` installs it (the jobs that log only through a tracking back-end are tested
//! in CI). Measured on this machine kind: 193 s and 6.6 GB on an idle machine (2026-11-29: the
//! packages below into a new venv, no pip cache; `torch` alone 74 s), 1,572 s on a loaded one
//! (2026-11-28). PyTorch's CUDA libraries (`nvidia-*`, which PyPI's `torch` wheel needs even to
//! be imported on a machine without a GPU) are 3.1 GB of it, `torch` 1.2 GB and TensorFlow
//! 1.3 GB. `triton` (1.0 GB) is removed after the install: a CPU run never loads it (torch only
//! warns that flop counting of triton kernels is off).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use governor_testbed::cmd;

/// The writers and what they need, pinned (PyPI).
pub(crate) const PYTHON_PACKAGES: &[&str] = &[
    "tensorflow-cpu==2.21.0",
    "keras==3.15.1",
    "tensorboard==2.21.0",
    "lightning==2.6.6",
    "mlflow==3.17.2",
    "torch==2.15.0",
];

/// Where the environment lives: `GOVERNOR_WRITERS_VENV`, else `target/writers/venv` (a machine
/// that keeps one outside its checkouts lets every CI run use it).
pub(crate) fn venv() -> PathBuf {
    std::env::var_os("GOVERNOR_WRITERS_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| cmd::target_dir().join("writers/venv"))
}

/// Installed after the writers and removed: a CPU run never loads it (see the module's doc).
const UNINSTALLED: &[&str] = &["triton"];

/// The writers' Python, installing them first if the venv lacks them.
pub(crate) fn python() -> Result<PathBuf> {
    cmd::python_venv(
        &venv(),
        PYTHON_PACKAGES,
        UNINSTALLED,
        "the tracking back-ends",
    )
}

fn fixtures_dir() -> PathBuf {
    cmd::workspace_root().join("governor-progress/tests/data/real_writers")
}

/// `cargo xtask writer-fixtures`: regenerate the fixtures with the real writers.
pub(crate) fn regenerate() -> Result<()> {
    let python = python()?;
    let out = cmd::target_dir().join("writers/out");
    if out.exists() {
        fs::remove_dir_all(&out)?;
    }
    let script = fixtures_dir().join("make_fixtures.py");
    cmd::run(Command::new(&python).arg(&script).arg(&out))?;
    for entry in fs::read_dir(&out)? {
        let entry = entry?;
        let dest = fixtures_dir().join(entry.file_name());
        if dest.exists() {
            fs::remove_dir_all(&dest)?;
        }
        copy_dir(&entry.path(), &dest)?;
    }
    let size = dir_size(&fixtures_dir())?;
    eprintln!(
        "== fixtures written to {} ({} KB with the scripts)",
        fixtures_dir().display(),
        size / 1024
    );
    if size > 2 << 20 {
        bail!("the fixtures take {size} bytes: keep them under 2 MiB");
    }
    Ok(())
}

fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    fs::create_dir_all(to)?;
    for entry in fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            fs::copy(entry.path(), &target)
                .with_context(|| format!("copying {}", entry.path().display()))?;
        }
    }
    Ok(())
}

fn dir_size(dir: &Path) -> Result<u64> {
    let mut total = 0;
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        total += if entry.file_type()?.is_dir() {
            dir_size(&entry.path())?
        } else {
            entry.metadata()?.len()
        };
    }
    Ok(total)
}
