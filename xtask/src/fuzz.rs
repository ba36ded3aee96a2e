//! `cargo xtask fuzz`: every cargo-fuzz target in `fuzz/` for a bounded time, starting from its
//! committed corpus (`fuzz/corpus/<target>/`, copied to `target/fuzz/corpus/<target>/` so that a
//! run never grows the committed files). A crash, a timeout or running out of memory fails the
//! command, naming the target and the input that did it.
//!
//! The targets are built once with nightly cargo and the instrumentation flags cargo-fuzz would
//! pass (libFuzzer's coverage passes, `--cfg fuzzing`, release with debug assertions and overflow
//! checks, no sanitizer: the fuzzed crates hold no unsafe code), and their binaries are run
//! directly, one after another. We build without cargo-fuzz itself because installing it meant
//! compiling it from crates.io in every clean CI run (79-239 s measured), for what is one
//! `cargo build` with flags; `cargo fuzz` still works on `fuzz/` for whoever has it.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use governor_testbed::cmd;

/// What all targets together get by default, in seconds.
const DEFAULT_TOTAL_SECONDS: u64 = 60;
/// libFuzzer's limit on the process's RSS and on one allocation, in MB: the targets parse inputs
/// of a few KB, so anything near this is a bug (libFuzzer reports it as an out-of-memory crash).
const RSS_LIMIT_MB: u32 = 2048;
/// One input taking longer than this (seconds) counts as a hang.
const INPUT_TIMEOUT_S: u32 = 10;

/// Arguments of `cargo xtask fuzz`.
#[derive(Debug, Default, clap::Args)]
pub(crate) struct FuzzArgs {
    /// Seconds per target (default: 60 s shared among all targets).
    #[arg(long)]
    pub seconds: Option<u64>,
    /// Fuzz only these targets (default: every binary fuzz/Cargo.toml declares).
    pub targets: Vec<String>,
}

/// A finished target's figures, from libFuzzer's final statistics.
struct Summary {
    execs: u64,
    seconds: f64,
    corpus_before: usize,
    corpus_after: usize,
    coverage: Option<u64>,
    peak_rss_mb: Option<u64>,
}

fn fuzz_dir() -> PathBuf {
    cmd::workspace_root().join("fuzz")
}

/// The coverage instrumentation of cargo-fuzz 0.13's `cargo fuzz build --release
/// --debug-assertions --sanitizer none` on Linux, without its `-C codegen-units=1` (which buys a
/// faster fuzzing binary with a slower build: our runs are a minute long, the build several).
const FUZZ_RUSTFLAGS: &[&str] = &[
    "-Cpasses=sancov-module",
    "-Cllvm-args=-sanitizer-coverage-level=4",
    "-Cllvm-args=-sanitizer-coverage-inline-8bit-counters",
    "-Cllvm-args=-sanitizer-coverage-pc-table",
    "-Cllvm-args=-sanitizer-coverage-trace-compares",
    "-Cllvm-args=-simplifycfg-branch-fold-threshold=0",
    "--cfg",
    "fuzzing",
    "-Clink-dead-code",
    "-Cllvm-args=-sanitizer-coverage-stack-depth",
    "-Cdebug-assertions",
];

/// `cargo build` of every fuzz target, as cargo-fuzz would build them (see [`FUZZ_RUSTFLAGS`]).
fn fuzz_build(triple: &str) -> Command {
    let mut c = cmd::nightly("cargo");
    let manifest = fuzz_dir().join("Cargo.toml");
    c.args(["build", "--release", "--bins"])
        .arg("--manifest-path")
        .arg(&manifest)
        // With an explicit target, RUSTFLAGS do not reach build scripts (as with cargo-fuzz).
        .args(["--target", triple])
        // Symbolised stack traces for a crash, at less build time than full debug info.
        .args(["--config", "profile.release.debug=\"line-tables-only\""])
        .env("RUSTFLAGS", FUZZ_RUSTFLAGS.join(" "))
        // What cargo-fuzz exposes to build scripts.
        .env("CARGO_FUZZ", "1")
        .env("CARGO_FUZZ_MANIFEST", &manifest);
    c
}

/// The fuzz targets: the binaries `fuzz/Cargo.toml` declares.
fn list_targets() -> Result<Vec<String>> {
    let mut c = cmd::nightly("cargo");
    c.args(["metadata", "--no-deps", "--format-version", "1"])
        .arg("--manifest-path")
        .arg(fuzz_dir().join("Cargo.toml"));
    let meta: serde_json::Value =
        serde_json::from_str(&cmd::output(&mut c)?).context("cargo metadata of fuzz/")?;
    Ok(meta["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|p| p["targets"].as_array().into_iter().flatten())
        .filter(|t| {
            t["kind"]
                .as_array()
                .is_some_and(|k| k.iter().any(|k| k == "bin"))
        })
        .filter_map(|t| t["name"].as_str().map(str::to_owned))
        .collect())
}

/// The host's target triple (what the targets are built for, and their output directory's name).
fn host_triple() -> Result<String> {
    let v = cmd::output(Command::new("rustc").args(["+nightly", "-vV"]))
        .context("the nightly toolchain is missing; the fuzz targets need it (rustup toolchain install nightly)")?;
    v.lines()
        .find_map(|l| l.strip_prefix("host: "))
        .map(str::to_owned)
        .context("`rustc +nightly -vV` does not name its host")
}

pub(crate) fn run(args: &FuzzArgs) -> Result<()> {
    let started = Instant::now();
    let triple = host_triple()?;
    let all = list_targets()?;
    let targets = if args.targets.is_empty() {
        all
    } else {
        if let Some(t) = args.targets.iter().find(|t| !all.contains(t)) {
            bail!(
                "no fuzz target `{t}` in fuzz/Cargo.toml (targets: {})",
                all.join(", ")
            );
        }
        args.targets.clone()
    };
    if targets.is_empty() {
        bail!("fuzz/Cargo.toml declares no fuzz targets");
    }
    let seconds = args
        .seconds
        .unwrap_or(DEFAULT_TOTAL_SECONDS / targets.len() as u64)
        .max(1);
    eprintln!(
        "== fuzzing {} targets for {seconds} s each: {}",
        targets.len(),
        targets.join(", ")
    );
    eprintln!("-- building the fuzz targets (nightly, libFuzzer; the first build takes minutes)");
    cmd::run(&mut fuzz_build(&triple))?;
    let bin_dir = fuzz_dir().join("target").join(&triple).join("release");
    let scratch = cmd::target_dir().join("fuzz");
    let mut failures = Vec::new();
    for target in &targets {
        match fuzz_one(target, &bin_dir.join(target), &scratch, seconds) {
            Ok(s) => eprintln!(
                "   {target}: {} runs in {:.1} s ({}/s), corpus {} -> {} inputs, coverage {}, peak RSS {}",
                s.execs,
                s.seconds,
                (s.execs as f64 / s.seconds.max(0.001)).round(),
                s.corpus_before,
                s.corpus_after,
                s.coverage.map_or("?".into(), |c| format!("{c} edges")),
                s.peak_rss_mb.map_or("?".into(), |m| format!("{m} MB")),
            ),
            Err(e) => {
                eprintln!("   {target}: FAILED");
                failures.push(format!("{e:#}"));
            }
        }
    }
    if !failures.is_empty() {
        bail!(
            "{} of {} fuzz targets failed:\n  {}",
            failures.len(),
            targets.len(),
            failures.join("\n  ")
        );
    }
    eprintln!(
        "== fuzzing passed: {} targets, no crash, in {:.0} s (building included)",
        targets.len(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// An empty directory at `dir`.
fn recreate(dir: &Path) -> Result<()> {
    if dir.exists() {
        fs::remove_dir_all(dir).with_context(|| format!("cannot remove {}", dir.display()))?;
    }
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))
}

/// Copy `from`'s files (none if it does not exist) into a fresh `to`; returns how many.
fn fresh_copy(from: &Path, to: &Path) -> Result<usize> {
    recreate(to)?;
    let mut n = 0;
    if let Ok(entries) = fs::read_dir(from) {
        for e in entries {
            let e = e?;
            if e.file_type()?.is_file() {
                fs::copy(e.path(), to.join(e.file_name()))
                    .with_context(|| format!("cannot copy {}", e.path().display()))?;
                n += 1;
            }
        }
    }
    Ok(n)
}

fn count_files(dir: &Path) -> usize {
    fs::read_dir(dir).map_or(0, |d| d.filter_map(|e| e.ok()).count())
}

/// Run one target's binary for `seconds` on a scratch copy of its corpus.
fn fuzz_one(target: &str, bin: &Path, scratch: &Path, seconds: u64) -> Result<Summary> {
    let committed = fuzz_dir().join("corpus").join(target);
    let corpus = scratch.join("corpus").join(target);
    let artifacts = scratch.join("artifacts").join(target);
    let log = scratch.join(format!("{target}.log"));
    let corpus_before = fresh_copy(&committed, &corpus)?;
    if corpus_before == 0 {
        eprintln!(
            "   {target}: no committed corpus in {}; starting from nothing",
            committed.display()
        );
    }
    recreate(&artifacts)?;
    let mut c = Command::new(bin);
    c.arg(&corpus)
        .arg(format!("-max_total_time={seconds}"))
        .arg(format!("-rss_limit_mb={RSS_LIMIT_MB}"))
        .arg(format!("-malloc_limit_mb={RSS_LIMIT_MB}"))
        .arg(format!("-timeout={INPUT_TIMEOUT_S}"))
        .arg("-print_final_stats=1")
        .arg(format!("-artifact_prefix={}/", artifacts.display()))
        .stdin(Stdio::null());
    // Both streams go to one log (one file handle: two would overwrite each other).
    let out = File::create(&log).with_context(|| format!("cannot create {}", log.display()))?;
    c.stdout(out.try_clone()?).stderr(out);
    eprintln!("-- {target}: {}", cmd::describe(&c));
    let started = Instant::now();
    let status = c
        .status()
        .with_context(|| format!("cannot start {} (did the build succeed?)", bin.display()))?;
    let elapsed = started.elapsed().as_secs_f64();
    let text = fs::read_to_string(&log).unwrap_or_default();
    if !status.success() {
        // libFuzzer's report from the panic message on (without the stack's frames: the log has
        // them), and where it saved the input.
        let lines: Vec<&str> = text.lines().collect();
        let from = lines
            .iter()
            .position(|l| l.contains("panicked at") || l.contains("ERROR: libFuzzer"))
            .unwrap_or(lines.len().saturating_sub(40));
        let frame = |l: &str| {
            let l = l.trim_start();
            l.starts_with("at ")
                || l.split_once(": ")
                    .is_some_and(|(n, _)| n.parse::<u32>().is_ok())
        };
        for l in lines[from..].iter().filter(|l| !frame(l)).take(60) {
            eprintln!("   | {l}");
        }
        let artifact = text
            .lines()
            .find_map(|l| l.split_once("Test unit written to ").map(|(_, p)| p.trim()))
            .map(PathBuf::from)
            .or_else(|| {
                fs::read_dir(&artifacts)
                    .ok()?
                    .filter_map(|e| e.ok())
                    .map(|e| e.path())
                    .next()
            });
        let reproduce = match &artifact {
            Some(a) => format!(
                "input saved as {}; reproduce with `{} {}`",
                a.display(),
                bin.display(),
                a.display()
            ),
            None => format!("no input saved under {}", artifacts.display()),
        };
        bail!(
            "fuzz target `{target}` failed ({status}) after {elapsed:.1} s: {reproduce}; full log {}",
            log.display()
        );
    }
    let stat = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("stat::{name}:")))
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    // The last status line: `#123456 REDUCE cov: 1234 ft: 5678 corp: ...`.
    let coverage = text
        .lines()
        .rev()
        .find_map(|l| l.split_once(" cov: "))
        .and_then(|(_, rest)| rest.split_whitespace().next()?.parse().ok());
    Ok(Summary {
        execs: stat("number_of_executed_units").unwrap_or(0),
        seconds: elapsed,
        corpus_before,
        corpus_after: count_files(&corpus),
        coverage,
        peak_rss_mb: stat("peak_rss_mb"),
    })
}
