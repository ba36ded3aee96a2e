//! Log directories under the watcher: every TensorBoard event file under a directory is
//! followed, new runs and new files included; a torn record waits for its end; a record whose
//! checksum fails is skipped with one problem report and the file goes on; an MLflow SQLite
//! database is followed as its writer commits, without locking the writer out.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::time::Duration;

use governor_progress::tensorboard::{file_version_event, scalar_event};
use governor_progress::tfrecord::frame;
use governor_progress::{Format, FormatChoice, Record};
use governor_watch::{WatchEvent, WatchEventKind, WatchSpec, Watcher};
use tokio::sync::mpsc;
use tokio::time::timeout;

const PATIENCE: Duration = Duration::from_secs(10);

fn spec(path: &Path) -> WatchSpec {
    WatchSpec {
        paths: vec![path.to_path_buf()],
        format: FormatChoice::Auto,
        custom: None,
        owner: None,
    }
}

fn append(path: &Path, bytes: &[u8]) {
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    f.write_all(bytes).unwrap();
}

fn event(step: i64, tag: &str, value: f32) -> Vec<u8> {
    frame(&scalar_event(1.7e9 + step as f64, step, &[(tag, value)]))
}

/// Records (and the other events seen meanwhile) until `n` records arrived.
async fn records(rx: &mut mpsc::Receiver<WatchEvent>, n: usize) -> (Vec<Record>, Vec<WatchEvent>) {
    let mut recs = Vec::new();
    let mut other = Vec::new();
    while recs.len() < n {
        let ev = timeout(PATIENCE, rx.recv())
            .await
            .unwrap_or_else(|_| panic!("waited 10 s for {n} records; got {recs:#?} and {other:#?}"))
            .expect("watcher stopped");
        match ev.kind {
            WatchEventKind::Record(r) => recs.push(r),
            _ => other.push(ev),
        }
    }
    (recs, other)
}

async fn quiet(rx: &mut mpsc::Receiver<WatchEvent>) -> Vec<WatchEvent> {
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_millis(300);
    while let Ok(Some(ev)) = tokio::time::timeout_at(deadline, rx.recv()).await {
        seen.push(ev);
    }
    seen
}

fn value(r: &Record, name: &str) -> f64 {
    r.metrics
        .get(name)
        .unwrap_or_else(|| panic!("no {name} in {r:?}"))
}

#[tokio::test]
async fn a_log_directory_follows_every_event_file_new_runs_included() {
    let tmp = tempfile::tempdir().unwrap();
    let logdir = tmp.path().join("logs");
    let (handle, mut rx) = Watcher::spawn(1024).unwrap();
    // The directory does not exist yet when the job is added.
    handle.add("job", spec(&logdir)).await.unwrap();
    fs::create_dir_all(logdir.join("train")).unwrap();
    let train = logdir.join("train/events.out.tfevents.100.host.1.v2");
    append(&train, &frame(&file_version_event(1.0)));
    append(&train, &event(0, "epoch_loss", 1.5));
    let (recs, other) = records(&mut rx, 1).await;
    assert_eq!(value(&recs[0], "epoch_loss"), 1.5);
    assert_eq!(recs[0].format, Format::TensorBoard);
    assert!(
        other
            .iter()
            .any(|e| matches!(e.kind, WatchEventKind::Format(Format::TensorBoard))),
        "{other:?}"
    );
    // Keras' validation run beside it, created later.
    fs::create_dir_all(logdir.join("validation")).unwrap();
    let val = logdir.join("validation/events.out.tfevents.100.host.1.v2");
    append(&val, &frame(&file_version_event(1.0)));
    append(&val, &event(0, "epoch_loss", 1.75));
    let (recs, _) = records(&mut rx, 1).await;
    assert_eq!(value(&recs[0], "validation/epoch_loss"), 1.75);
    assert_eq!(recs[0].split.as_str(), "eval");
    // A record torn between two writes waits for its end.
    let rec = event(1, "epoch_loss", 1.25);
    append(&train, &rec[..rec.len() - 3]);
    assert!(
        quiet(&mut rx)
            .await
            .iter()
            .all(|e| !matches!(e.kind, WatchEventKind::Record(_))),
        "a torn record was delivered"
    );
    append(&train, &rec[rec.len() - 3..]);
    let (recs, _) = records(&mut rx, 1).await;
    assert_eq!(
        (recs[0].step, value(&recs[0], "epoch_loss")),
        (Some(1), 1.25)
    );
    // A restarted writer opens a new file in a new run directory (Lightning's version_1).
    fs::create_dir_all(logdir.join("version_1")).unwrap();
    let next = logdir.join("version_1/events.out.tfevents.200.host.2.0");
    append(&next, &frame(&file_version_event(2.0)));
    append(&next, &event(0, "loss", 0.875));
    let (recs, _) = records(&mut rx, 1).await;
    assert_eq!(recs[0].file.as_ref(), next.as_path());
    let stats = handle.stats().await.unwrap();
    assert_eq!(stats.files, 3, "{stats:?}");
    // Files other than event files (checkpoints, hparams.yaml) are not followed.
    fs::write(logdir.join("version_1/hparams.yaml"), "lr: 0.1\n").unwrap();
    let _ = quiet(&mut rx).await;
    assert_eq!(handle.stats().await.unwrap().files, 3);
}

#[tokio::test]
async fn a_bad_checksum_skips_one_record_with_one_report_and_the_file_goes_on() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("events.out.tfevents.1.h");
    append(&file, &frame(&file_version_event(1.0)));
    let (handle, mut rx) = Watcher::spawn(1024).unwrap();
    handle.add("job", spec(tmp.path())).await.unwrap();
    let mut bad = event(0, "loss", 1.0);
    let last = bad.len() - 1;
    bad[last] ^= 0xff; // the data checksum
    append(&file, &bad);
    append(&file, &event(1, "loss", 0.5));
    let (recs, mut other) = records(&mut rx, 1).await;
    assert_eq!((recs[0].step, value(&recs[0], "loss")), (Some(1), 0.5));
    other.extend(quiet(&mut rx).await);
    let problems: Vec<_> = other
        .iter()
        .filter(|e| matches!(e.kind, WatchEventKind::Problem(_)))
        .collect();
    assert_eq!(problems.len(), 1, "{other:?}");
    // A second bad record is skipped without a second report.
    let mut bad = event(2, "loss", 9.0);
    let last = bad.len() - 1;
    bad[last] ^= 0xff;
    append(&file, &bad);
    append(&file, &event(3, "loss", 0.25));
    let (recs, mut other) = records(&mut rx, 1).await;
    assert_eq!(recs[0].step, Some(3));
    other.extend(quiet(&mut rx).await);
    assert!(
        other
            .iter()
            .all(|e| !matches!(e.kind, WatchEventKind::Problem(_))),
        "{other:?}"
    );
}

#[tokio::test]
async fn an_mlflow_file_store_directory_is_followed_by_metric_files() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("mlruns/0/0123456789abcdef0123456789abcdef");
    fs::create_dir_all(run.join("metrics")).unwrap();
    fs::write(
        run.join("meta.yaml"),
        "run_id: 0123456789abcdef0123456789abcdef\n",
    )
    .unwrap();
    let (handle, mut rx) = Watcher::spawn(1024).unwrap();
    handle
        .add("job", spec(&tmp.path().join("mlruns")))
        .await
        .unwrap();
    append(&run.join("metrics/loss"), b"1732790112345 0.5 0\n");
    let (recs, _) = records(&mut rx, 1).await;
    assert_eq!(recs[0].format, Format::MlflowFile);
    assert_eq!(value(&recs[0], "loss"), 0.5);
    fs::create_dir_all(run.join("metrics/eval")).unwrap();
    append(&run.join("metrics/eval/loss"), b"1732790112999 0.75 0\n");
    let (recs, _) = records(&mut rx, 1).await;
    assert_eq!(value(&recs[0], "eval/loss"), 0.75);
    assert_eq!(recs[0].split.as_str(), "eval");
    // Parameters and tags are not metrics.
    fs::create_dir_all(run.join("params")).unwrap();
    fs::write(run.join("params/lr"), "0.1").unwrap();
    assert!(
        quiet(&mut rx)
            .await
            .iter()
            .all(|e| !matches!(e.kind, WatchEventKind::Record(_)))
    );
}

/// MLflow 3's `runs` and `metrics` tables (the columns read).
const MLFLOW_SCHEMA: &str = "
    CREATE TABLE runs (run_uuid VARCHAR(32) NOT NULL PRIMARY KEY, name VARCHAR(250),
        status VARCHAR(9), start_time BIGINT, end_time BIGINT, experiment_id INTEGER);
    CREATE TABLE metrics (key VARCHAR(250) NOT NULL, value FLOAT NOT NULL,
        timestamp BIGINT NOT NULL, run_uuid VARCHAR(32) NOT NULL, step BIGINT DEFAULT '0' NOT NULL,
        is_nan BOOLEAN DEFAULT '0' NOT NULL,
        CONSTRAINT metric_pk PRIMARY KEY (key, timestamp, step, run_uuid, value, is_nan));";

/// MLflow's writer: its tables in `db`, a run `a` and its first value (`loss` 0.9 at step 0).
fn mlflow_writer(db: &Path) -> rusqlite::Connection {
    let w = rusqlite::Connection::open(db).unwrap();
    w.busy_timeout(Duration::from_secs(5)).unwrap();
    w.execute_batch(MLFLOW_SCHEMA).unwrap();
    w.execute_batch(
        "INSERT INTO runs VALUES ('a', 'r', 'RUNNING', 1, NULL, 0);
         INSERT INTO metrics VALUES ('loss', 0.9, 1, 'a', 0, 0);",
    )
    .unwrap();
    w
}

#[tokio::test]
async fn an_mlflow_database_is_followed_as_its_writer_commits() {
    let tmp = tempfile::tempdir().unwrap();
    let w = mlflow_writer(&tmp.path().join("mlflow.db"));
    let (handle, mut rx) = Watcher::spawn(1024).unwrap();
    // The working directory, as `run-job --log .` would give it.
    handle.add("job", spec(tmp.path())).await.unwrap();
    let (recs, _) = records(&mut rx, 1).await;
    assert_eq!(recs[0].format, Format::MlflowSqlite);
    assert_eq!(value(&recs[0], "loss"), 0.9);
    for step in 1..=20i64 {
        let started = std::time::Instant::now();
        w.execute_batch(&format!(
            "BEGIN; INSERT INTO metrics VALUES ('loss', {}, {step}0, 'a', {step}, 0);
             INSERT INTO metrics VALUES ('val_loss', {}, {step}0, 'a', {step}, 0); COMMIT;",
            1.0 / step as f64,
            2.0 / step as f64
        ))
        .unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "the writer waited"
        );
        let (recs, _) = records(&mut rx, 1).await;
        assert_eq!(recs[0].step, Some(step as u64));
        assert_eq!(recs[0].metrics.len(), 2, "one commit, one record");
    }
}

#[tokio::test]
async fn an_mlflow_database_still_empty_when_first_seen_is_followed_once_its_writer_creates_it() {
    // SQLite creates the file empty and writes its header with the first commit: MLflow's
    // writer creating its tables. The watcher sees the empty file first (a run started in a
    // directory already watched) and must follow it as a database once it is one.
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("mlflow.db");
    let (handle, mut rx) = Watcher::spawn(1024).unwrap();
    handle.add("job", spec(tmp.path())).await.unwrap();
    fs::File::create(&db).unwrap();
    let seen = quiet(&mut rx).await;
    assert!(
        seen.iter()
            .any(|e| matches!(e.kind, WatchEventKind::Opened)),
        "the empty file is followed: {seen:#?}"
    );
    let w = mlflow_writer(&db);
    for step in 1..=3i64 {
        w.execute(
            &format!(
                "INSERT INTO metrics VALUES ('loss', {}, {step}0, 'a', {step}, 0)",
                1.0 / step as f64
            ),
            [],
        )
        .unwrap();
    }
    let (recs, _) = records(&mut rx, 3).await;
    assert!(
        recs.iter().all(|r| r.format == Format::MlflowSqlite),
        "{recs:#?}"
    );
    assert_eq!(value(&recs[0], "loss"), 0.9);
}
