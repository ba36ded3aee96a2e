//! A real writer appends while the watcher follows: PyTorch's `SummaryWriter` (flushing after
//! each value, `live_writer.py pytorch`) and MLflow's autologging into its default SQLite store
//! (`live_writer.py mlflow`). Every value must arrive as a record within a second of the moment
//! the writer said it was on disk.
//!
//! Needs the tracking back-ends' Python environment (`GOVERNOR_WRITERS_PYTHON`); `cargo xtask
//! test` installs it and runs these.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use governor_progress::FormatChoice;
use governor_watch::{WatchEventKind, WatchSpec, Watcher};

fn python() -> PathBuf {
    match std::env::var_os("GOVERNOR_WRITERS_PYTHON").map(PathBuf::from) {
        Some(p) if p.exists() => p,
        _ => panic!(
            "prerequisite missing: GOVERNOR_WRITERS_PYTHON must name the Python that has the \
             tracking back-ends (`cargo xtask test` installs it and sets it)"
        ),
    }
}

/// Runs `live_writer.py KIND DIR N PAUSE` and the watcher on `follow`; returns each value's
/// delay from the writer's "logged" line to the record (seconds), by step.
async fn follow_live(kind: &str, dir: &Path, follow: &Path, n: usize, metric: &str) -> Vec<f64> {
    let (handle, mut rx) = Watcher::spawn(1024).unwrap();
    handle
        .add(
            "job",
            WatchSpec {
                paths: vec![follow.to_path_buf()],
                format: FormatChoice::Auto,
                custom: None,
                owner: None,
            },
        )
        .await
        .unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../governor-progress/tests/data/real_writers/live_writer.py");
    let mut child = Command::new(python())
        .arg(script)
        .args([kind])
        .arg(dir)
        .args([n.to_string().as_str(), "0.3"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the live writer starts");
    let stdout = child.stdout.take().unwrap();
    let (tx, logged) = std::sync::mpsc::channel::<(u64, f64)>();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let mut f = line.split_whitespace();
            if f.next() == Some("logged")
                && let (Some(step), Some(t)) = (f.next(), f.next())
                && let (Ok(step), Ok(t)) = (step.parse(), t.parse())
            {
                let _ = tx.send((step, t));
            }
        }
    });
    let mut seen = std::collections::BTreeMap::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(240);
    while seen.len() < n {
        let ev = tokio::time::timeout_at(deadline, rx.recv())
            .await
            .unwrap_or_else(|_| panic!("{kind}: {} of {n} values arrived in 240 s", seen.len()))
            .expect("watcher stopped");
        if let WatchEventKind::Record(r) = ev.kind
            && r.metrics.contains(metric)
            && let Some(step) = r.step
        {
            let at = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_secs_f64();
            seen.entry(step).or_insert(at);
        }
    }
    let _ = child.wait();
    reader.join().unwrap();
    let logged: std::collections::BTreeMap<u64, f64> = logged.try_iter().collect();
    seen.iter()
        .filter_map(|(step, at)| Some(at - logged.get(step)?))
        .collect()
}

fn check(kind: &str, delays: &[f64], n: usize) {
    assert!(
        delays.len() >= n - 1,
        "{kind}: only {} values matched",
        delays.len()
    );
    let worst = delays.iter().copied().fold(f64::MIN, f64::max);
    let mut sorted = delays.to_vec();
    sorted.sort_by(f64::total_cmp);
    eprintln!(
        "{kind}: {} values, delay median {:.0} ms, worst {:.0} ms",
        delays.len(),
        sorted[sorted.len() / 2] * 1e3,
        worst * 1e3
    );
    assert!(
        worst < 1.0,
        "{kind}: a value took {worst:.3} s to arrive: {delays:?}"
    );
}

#[tokio::test]
#[ignore = "writers: runs PyTorch's SummaryWriter (GOVERNOR_WRITERS_PYTHON); `cargo xtask test` runs it"]
async fn writers_pytorch_summarywriter_values_arrive_within_a_second() {
    let tmp = tempfile::tempdir().unwrap();
    let logdir = tmp.path().join("runs");
    let delays = follow_live("pytorch", &logdir, &logdir, 30, "Loss/train").await;
    check("pytorch", &delays, 30);
}

#[tokio::test]
#[ignore = "writers: runs MLflow's Keras autologging (GOVERNOR_WRITERS_PYTHON); `cargo xtask test` runs it"]
async fn writers_mlflow_autologged_values_arrive_within_a_second() {
    let tmp = tempfile::tempdir().unwrap();
    let work = tmp.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let delays = follow_live("mlflow", &work, &work, 10, "loss").await;
    check("mlflow", &delays, 10);
}
