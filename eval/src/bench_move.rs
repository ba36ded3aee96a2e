//! `cargo xtask bench-move`: what moving a job with CRIU costs, measured in the VM bed. The host's kernel is too new for Debian's CRIU 3.17 ("vdso: Unexpected rt
//! vDSO area bounds"); the guests' Debian 6.1 kernel runs it (docs: shared/testbed/TESTBED.md).
//!
//! For each memory size, a process that holds that much memory (every page touched, a tenth of
//! it dirtied again every second, like a training step rewriting its weights and activations)
//! is dumped and restored on the same guest, twice:
//! - `plain`: `criu dump` then `criu restore`; the job is paused from the dump's start to the
//!   restore's end;
//! - `pre-dump`: `criu pre-dump` while it runs, 1 s later `criu dump --track-mem
//!   --prev-images-dir` (only the pages dirtied since), then `criu restore`; the pause is the
//!   final dump plus the restore.
//!
//! Reported per size and mode: the pause, each step's time, the images' bytes (the final dump's
//! alone for pre-dump: what a move transfers while the job is paused), and whether the process
//! went on counting after the restore. The transfer between nodes is not in these figures (the
//! images stay on the guest's tmpfs); a move adds bytes / bandwidth to the pause. The guests run
//! under TCG (no KVM on these machines): times are several times those of real hardware, sizes
//! are not.
//!
//! `--framework` measures a framework-checkpoint move instead, on the host, through the real
//! coordinator and two real daemons (`tests/tests/cluster_move.rs`, `bench_framework_move`):
//! `demo-trainer --ballast-mib N` (N MiB of extra state saved with its checkpoint) is moved from
//! one node to the other; reported: the save (asked to saved and exited), the pause (exited to
//! running on the target), the time lost to the job (the gap between its last epoch before the
//! move and its first after, less an epoch), and the checkpoint's bytes.

use std::fmt::Write as _;
use std::fs;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use governor_testbed::{cmd, setup, vm};
use serde::{Deserialize, Serialize};

use crate::bench_real::spread;

/// Arguments of `cargo xtask bench-move`.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchMoveArgs {
    /// Memory held by the moved process, MiB.
    #[arg(long, value_delimiter = ',', default_value = "64,256,1024")]
    pub sizes: Vec<u64>,
    /// Repetitions of every size and mode (in one guest boot); the summary gives medians with
    /// their range.
    #[arg(long, default_value_t = 3)]
    pub reps: u32,
    /// Output directory (default target/bench-move).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Measure framework-checkpoint moves through the real coordinator and daemons on the host
    /// instead of CRIU in the VM.
    #[arg(long)]
    pub framework: bool,
}

/// One framework-checkpoint move (a line of the test's JSON output).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct FrameworkMove {
    pub mib: u64,
    pub rep: u32,
    pub save_s: f64,
    pub pause_s: f64,
    pub total_s: f64,
    pub epoch_s: f64,
    pub lost_s: f64,
    pub asked_to_resumed_s: f64,
    pub checkpoint_bytes: u64,
}

fn run_framework(args: &BenchMoveArgs, out: &std::path::Path) -> Result<()> {
    let jsonl = out.join("framework.jsonl");
    let _ = fs::remove_file(&jsonl);
    let sizes: Vec<String> = args.sizes.iter().map(u64::to_string).collect();
    eprintln!(
        "== framework-checkpoint moves through the real coordinator and daemons: sizes {:?} MiB, {} reps",
        args.sizes, args.reps
    );
    cmd::run(cmd::cargo().args(["build", "-p", "governor", "-p", "coordinator"]))?;
    cmd::run(
        cmd::cargo()
            .args([
                "test",
                "-p",
                "governor-integration-tests",
                "--test",
                "cluster_move",
                "--",
                "--ignored",
                "--exact",
                "bench_framework_move",
                "--nocapture",
            ])
            .env("GOVERNOR_BENCH_SIZES", sizes.join(","))
            .env("GOVERNOR_BENCH_REPS", args.reps.to_string())
            .env("GOVERNOR_BENCH_OUT", &jsonl),
    )?;
    let results: Vec<FrameworkMove> = fs::read_to_string(&jsonl)
        .with_context(|| format!("cannot read {}", jsonl.display()))?
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()
        .context("the benchmark's results")?;
    let mut md = String::from(
        "| state | runs | save | pause | lost to the job | epoch | checkpoint |\n\
         | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for size in &args.sizes {
        let g: Vec<&FrameworkMove> = results.iter().filter(|r| r.mib == *size).collect();
        if g.is_empty() {
            continue;
        }
        let bytes = g.iter().map(|r| r.checkpoint_bytes).max().unwrap_or(0);
        let _ = writeln!(
            md,
            "| {size} MiB | {} | {} | {} | {} | {} | {:.0} MiB |",
            g.len(),
            secs(g.iter().map(|r| r.save_s).collect()),
            secs(g.iter().map(|r| r.pause_s).collect()),
            secs(g.iter().map(|r| r.lost_s).collect()),
            secs(g.iter().map(|r| r.epoch_s).collect()),
            bytes as f64 / f64::from(1 << 20),
        );
    }
    fs::write(out.join("framework.md"), &md)?;
    println!("{md}");
    Ok(())
}

/// One dump-and-restore.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct MoveResult {
    #[serde(default)]
    pub rep: u32,
    pub size_mib: u64,
    pub mode: String,
    /// Seconds the process did not run (dump or final dump, plus restore).
    pub pause_s: f64,
    pub predump_s: Option<f64>,
    pub dump_s: f64,
    pub restore_s: f64,
    /// Bytes of the images the pause waits for (the final dump's, with pre-dump).
    pub paused_bytes: u64,
    /// Bytes of all images (pre-dump included).
    pub total_bytes: u64,
    /// The process counted on after the restore.
    pub continued: bool,
}

/// The process that holds the memory: touches every page, then every 0.1 s dirties a hundredth
/// of its pages and writes its step count to a file (closed again: CRIU carries no open file;
/// replaced by rename, so that a reader never sees it empty).
const HOLDER: &str = r#"
import os, sys, time
mib, out = int(sys.argv[1]), sys.argv[2]
buf = bytearray(mib << 20)
pages = len(buf) // 4096
for i in range(pages):
    buf[i * 4096] = 1
n, page, step = 0, 0, max(1, pages // 100)
while True:
    for k in range(step):
        buf[((page + k) % pages) * 4096] = n & 255
    page += step
    n += 1
    with open(out + ".new", "w") as f:
        f.write(str(n))
    os.replace(out + ".new", out)
    time.sleep(0.1)
"#;

/// The guest script: become a child subreaper (else the dumped tree's old PIDs are reaped late
/// and restore fails with "File exists"), then measure each size and mode.
fn guest_script(scripts: &std::path::Path) -> String {
    format!(
        r#"python3 -c 'import ctypes,os,sys; assert ctypes.CDLL(None).prctl(36,1,0,0,0)==0; os.execvp("bash",["bash",sys.argv[1]])' {}/move.sh"#,
        scripts.display()
    )
}

/// The measuring script, run by bash under the subreaper.
fn measure_script(holder: &std::path::Path, sizes: &[u64], reps: u32) -> String {
    let largest = sizes.iter().copied().max().unwrap_or(64);
    let sizes: Vec<String> = sizes.iter().map(u64::to_string).collect();
    format!(
        r#"set -u
HOLDER={holder}
# The images go to a tmpfs of their own, large enough for a pre-dump and a final dump of the
# largest size (the guest's /tmp would be half its memory).
IMAGES=/run/bench-move
mkdir -p $IMAGES && mount -t tmpfs -o size={images_mib}m bench-move $IMAGES || exit 1
now() {{ date +%s.%N; }}
since() {{ awk -v a="$(now)" -v b="$1" 'BEGIN {{ printf "%.3f", a - b }}'; }}
count() {{ cat "$1/count" 2>/dev/null || echo 0; }}
measure() {{
  size=$1; mode=$2; rep=$3; W=$IMAGES/mv-$size-$mode
  rm -rf $W; mkdir -p $W/img/1 $W/img/2
  setsid python3 $HOLDER $size $W/count </dev/null >$W/app.log 2>&1 3>&- 4>&- 5>&- 6>&- 7>&- 8>&- 9>&- &
  BG=$!
  for i in $(seq 1200); do [ "$(count $W)" -ge 5 ] && break; sleep 0.1; done
  PID=$(pgrep -f "^python3 $HOLDER $size $W/count" | head -1)
  predump=null; pre_bytes=0
  if [ $mode = pre-dump ]; then
    t=$(now); criu pre-dump -t $PID -D $W/img/1 -o pre.log || {{ echo "pre-dump failed" >&2; tail -5 $W/img/1/pre.log >&2; kill -9 $PID; return 1; }}
    predump=$(since $t); pre_bytes=$(du -sb $W/img/1 | cut -f1)
    sleep 1
    t=$(now); criu dump -t $PID -D $W/img/2 --track-mem --prev-images-dir ../1 -o dump.log || {{ echo "dump failed" >&2; tail -5 $W/img/2/dump.log >&2; kill -9 $PID; return 1; }}
  else
    t=$(now); criu dump -t $PID -D $W/img/2 -o dump.log || {{ echo "dump failed" >&2; tail -5 $W/img/2/dump.log >&2; kill -9 $PID; return 1; }}
  fi
  dump=$(since $t)
  before=$(count $W)
  wait $BG 2>/dev/null
  for i in $(seq 200); do [ -e /proc/$PID ] || break; sleep 0.05; done
  t=$(now); criu restore -D $W/img/2 -d -o restore.log || {{ echo "restore failed" >&2; tail -5 $W/img/2/restore.log >&2; return 1; }}
  restore=$(since $t)
  sleep 1.5
  after=$(count $W)
  continued=false; [ "$after" -gt "$before" ] && continued=true
  bytes=$(du -sb $W/img/2 | cut -f1)
  pause=$(awk -v a="$dump" -v b="$restore" 'BEGIN {{ printf "%.3f", a + b }}')
  echo "{{\"rep\":$rep,\"size_mib\":$size,\"mode\":\"$mode\",\"pause_s\":$pause,\"predump_s\":$predump,\"dump_s\":$dump,\"restore_s\":$restore,\"paused_bytes\":$bytes,\"total_bytes\":$((bytes + pre_bytes)),\"continued\":$continued}}"
  kill -9 $(pgrep -f "^python3 $HOLDER $size $W/count") 2>/dev/null
  sleep 0.3
  rm -rf $W
}}
# A first dump loads CRIU's kernel modules (the diag families): not part of any move.
measure 8 plain 0 >/dev/null
rc=0
for rep in $(seq {reps}); do
  for size in {sizes}; do
    for mode in plain pre-dump; do
      measure $size $mode $rep || rc=1
    done
  done
done
exit $rc
"#,
        holder = holder.display(),
        sizes = sizes.join(" "),
        images_mib = largest * 5 / 2 + 256,
        reps = reps.max(1),
    )
}

pub fn run(args: &BenchMoveArgs) -> Result<()> {
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| cmd::target_dir().join("bench-move"));
    fs::create_dir_all(&out)?;
    if args.framework {
        return run_framework(args, &out);
    }
    let bed = setup::run()?;
    // The scripts live in a directory the guest reads (the host's filesystem is shared
    // read-only; the run directory read-write).
    let scripts = vm::new_run_dir("bench-move-scripts")?;
    let holder = scripts.join("holder.py");
    fs::write(&holder, HOLDER)?;
    let largest = args.sizes.iter().copied().max().unwrap_or(64);
    // The process, its images (pre-dump and final dump on a tmpfs) and the rest: 4 × the
    // largest size, at least 1 GiB.
    let memory = format!("{}M", (largest * 4 + 768).max(1024));
    fs::write(
        scripts.join("move.sh"),
        measure_script(&holder, &args.sizes, args.reps),
    )?;
    eprintln!(
        "== CRIU in the VM bed: sizes {:?} MiB, guest memory {memory}",
        args.sizes
    );
    let text = vm::run_guest_command_with(
        &bed,
        "bench-move",
        &guest_script(&scripts),
        Duration::from_secs(1800),
        &memory,
    )
    .context("the CRIU measurements in the guest")?;
    let results: Vec<MoveResult> = text
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()
        .context("the guest's results")?;
    let md = summary(&results);
    fs::write(
        out.join("results.json"),
        serde_json::to_string_pretty(&results)?,
    )?;
    fs::write(out.join("summary.md"), &md)?;
    println!("{md}");
    Ok(())
}

/// Median and range of seconds, as "1.23 s (1.10..1.40)" (the range only with several values).
fn secs(v: Vec<f64>) -> String {
    match spread(v) {
        None => "-".into(),
        Some(s) if s.n == 1 => format!("{:.2} s", s.median),
        Some(s) => format!("{:.2} s ({:.2}..{:.2})", s.median, s.min, s.max),
    }
}

fn summary(results: &[MoveResult]) -> String {
    let mut md = String::from(
        "| memory | mode | runs | pause | pre-dump | dump | restore | bytes while paused | bytes in all | went on |\n\
         | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n",
    );
    let mib = |v: Vec<u64>| {
        let mut v = v;
        v.sort_unstable();
        v.get(v.len() / 2).map_or("-".into(), |b| {
            format!("{:.0} MiB", *b as f64 / f64::from(1 << 20))
        })
    };
    let mut keys: Vec<(u64, String)> = Vec::new();
    for r in results {
        if !keys.contains(&(r.size_mib, r.mode.clone())) {
            keys.push((r.size_mib, r.mode.clone()));
        }
    }
    for (size, mode) in keys {
        let g: Vec<&MoveResult> = results
            .iter()
            .filter(|r| r.size_mib == size && r.mode == mode)
            .collect();
        let went_on = g.iter().filter(|r| r.continued).count();
        let _ = writeln!(
            md,
            "| {size} MiB | {mode} | {} | {} | {} | {} | {} | {} | {} | {} |",
            g.len(),
            secs(g.iter().map(|r| r.pause_s).collect()),
            secs(g.iter().filter_map(|r| r.predump_s).collect()),
            secs(g.iter().map(|r| r.dump_s).collect()),
            secs(g.iter().map(|r| r.restore_s).collect()),
            mib(g.iter().map(|r| r.paused_bytes).collect()),
            mib(g.iter().map(|r| r.total_bytes).collect()),
            if went_on == g.len() {
                "yes".to_owned()
            } else {
                format!("NO ({} of {})", g.len() - went_on, g.len())
            },
        );
    }
    if let Some(fit) = fit_cost(results) {
        let _ = writeln!(
            md,
            "\nFitted to the plain dumps (least squares, seconds = fixed + bytes / rate): dump \
             {:.2} s + {:.0} MB/s, restore {:.2} s + {:.0} MB/s. As govsim's move cost \
             (`MoveDowntime`, transfer excluded): fixed_seconds {:.2}, \
             checkpoint_bytes_per_second {:.3e}, restore_bytes_per_second {:.3e}.",
            fit.dump.0,
            fit.dump.1 / 1e6,
            fit.restore.0,
            fit.restore.1 / 1e6,
            fit.dump.0 + fit.restore.0,
            fit.dump.1,
            fit.restore.1,
        );
    }
    md.push_str(
        "\nMeasured in the VM bed (Debian 6.1 guest under TCG, 2 vCPUs, images on the guest's \
         tmpfs, no transfer): a move between nodes adds the paused bytes over the link's \
         bandwidth to the pause.\n",
    );
    md
}

/// `seconds = fixed + bytes / rate` fitted to the plain dumps and to their restores.
struct CostFit {
    /// (fixed seconds, bytes per second)
    dump: (f64, f64),
    restore: (f64, f64),
}

fn fit_line(points: &[(f64, f64)]) -> Option<(f64, f64)> {
    let (fixed, slope) = crate::least_squares(points)?;
    (slope > 0.0).then(|| (fixed.max(0.0), 1.0 / slope))
}

fn fit_cost(results: &[MoveResult]) -> Option<CostFit> {
    let plain: Vec<&MoveResult> = results.iter().filter(|r| r.mode == "plain").collect();
    let bytes = |r: &MoveResult| r.paused_bytes as f64;
    Some(CostFit {
        dump: fit_line(
            &plain
                .iter()
                .map(|r| (bytes(r), r.dump_s))
                .collect::<Vec<_>>(),
        )?,
        restore: fit_line(
            &plain
                .iter()
                .map(|r| (bytes(r), r.restore_s))
                .collect::<Vec<_>>(),
        )?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_has_a_row_per_measurement_and_flags_a_process_that_stopped() {
        let r = MoveResult {
            rep: 1,
            size_mib: 64,
            mode: "pre-dump".into(),
            pause_s: 1.5,
            predump_s: Some(2.0),
            dump_s: 1.0,
            restore_s: 0.5,
            paused_bytes: 8 << 20,
            total_bytes: 72 << 20,
            continued: false,
        };
        let md = summary(&[r]);
        assert!(
            md.contains(
                "| 64 MiB | pre-dump | 1 | 1.50 s | 2.00 s | 1.00 s | 0.50 s | 8 MiB | 72 MiB | NO (1 of 1) |"
            ),
            "{md}"
        );
    }

    #[test]
    fn the_cost_fit_recovers_a_fixed_part_and_a_rate() {
        let r = |mib: u64, dump: f64, restore: f64| MoveResult {
            rep: 1,
            size_mib: mib,
            mode: "plain".into(),
            pause_s: dump + restore,
            predump_s: None,
            dump_s: dump,
            restore_s: restore,
            paused_bytes: mib * 1_000_000,
            total_bytes: mib * 1_000_000,
            continued: true,
        };
        // dump: 0.5 s + 100 MB/s; restore: 0.2 s + 200 MB/s.
        let fit = fit_cost(&[r(100, 1.5, 0.7), r(300, 3.5, 1.7)]).unwrap();
        assert!((fit.dump.0 - 0.5).abs() < 1e-9 && (fit.dump.1 - 100e6).abs() < 1.0);
        assert!((fit.restore.0 - 0.2).abs() < 1e-9 && (fit.restore.1 - 200e6).abs() < 1.0);
    }

    #[test]
    fn the_guest_reports_one_json_line_per_measurement() {
        let script = measure_script(std::path::Path::new("/x/holder.py"), &[64, 256], 3);
        assert!(script.contains("for size in 64 256; do"));
        assert!(script.contains("for rep in $(seq 3); do"));
        assert!(script.contains("--track-mem --prev-images-dir ../1"));
        let line = r#"{"size_mib":64,"mode":"plain","pause_s":1.2,"predump_s":null,"dump_s":0.8,"restore_s":0.4,"paused_bytes":1000,"total_bytes":1000,"continued":true}"#;
        let r: MoveResult = serde_json::from_str(line).unwrap();
        assert_eq!((r.size_mib, r.continued, r.predump_s), (64, true, None));
    }
}
