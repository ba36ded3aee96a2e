//! The inotify watcher against real files in a temporary directory: appends, partial lines,
//! files and directories created later, globs, rotation, copytruncate, deletion, rewritten
//! documents, over-long lines, garbage and special files.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use governor_progress::{Format, FormatChoice, Record};
use governor_watch::{
    WatchError, WatchEvent, WatchEventKind, WatchSpec, WatchStats, Watcher, WatcherHandle,
};
use tokio::sync::mpsc;
use tokio::time::timeout;

const PATIENCE: Duration = Duration::from_secs(10);
/// How long "nothing happens" is observed.
const QUIET: Duration = Duration::from_millis(300);

struct Events {
    rx: mpsc::Receiver<WatchEvent>,
}

impl Events {
    async fn next(&mut self) -> WatchEvent {
        timeout(PATIENCE, self.rx.recv())
            .await
            .expect("no watcher event within 10 s")
            .expect("watcher stopped")
    }

    /// Events up to and including the first one matching `pred`.
    async fn until(&mut self, what: &str, pred: impl Fn(&WatchEvent) -> bool) -> Vec<WatchEvent> {
        let mut seen = Vec::new();
        loop {
            let ev = timeout(PATIENCE, self.rx.recv())
                .await
                .unwrap_or_else(|_| panic!("waited 10 s for {what}; got {seen:#?}"))
                .expect("watcher stopped");
            let done = pred(&ev);
            seen.push(ev);
            if done {
                return seen;
            }
        }
    }

    /// The next `n` records (other events are returned alongside).
    async fn records(&mut self, n: usize) -> (Vec<Record>, Vec<WatchEvent>) {
        let mut recs = Vec::new();
        let mut other = Vec::new();
        while recs.len() < n {
            let ev = timeout(PATIENCE, self.rx.recv())
                .await
                .unwrap_or_else(|_| {
                    panic!("waited 10 s for {n} records; got {recs:#?} and {other:#?}")
                })
                .expect("watcher stopped");
            match ev.kind {
                WatchEventKind::Record(r) => recs.push(r),
                _ => other.push(ev),
            }
        }
        (recs, other)
    }

    /// Everything that arrives within [`QUIET`].
    async fn quiet(&mut self) -> Vec<WatchEvent> {
        let mut seen = Vec::new();
        let deadline = tokio::time::Instant::now() + QUIET;
        while let Ok(Some(ev)) = tokio::time::timeout_at(deadline, self.rx.recv()).await {
            seen.push(ev);
        }
        seen
    }
}

fn start() -> (WatcherHandle, Events) {
    let (handle, rx) = Watcher::spawn(1024).expect("watcher starts");
    (handle, Events { rx })
}

fn spec(paths: &[&Path], format: FormatChoice) -> WatchSpec {
    WatchSpec {
        paths: paths.iter().map(|p| p.to_path_buf()).collect(),
        format,
        custom: None,
        owner: None,
    }
}

fn append(path: &Path, text: &str) {
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    f.write_all(text.as_bytes()).unwrap();
}

fn losses(records: &[Record]) -> Vec<f64> {
    records
        .iter()
        .map(|r| r.metrics.get("loss").expect("record has a loss"))
        .collect()
}

fn is_record(ev: &WatchEvent) -> bool {
    matches!(ev.kind, WatchEventKind::Record(_))
}

#[tokio::test]
async fn appended_lines_are_delivered_and_partial_lines_wait_for_their_newline() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("training.log");
    fs::write(&path, "epoch,loss\n").unwrap();
    let (h, mut ev) = start();
    h.add("job", spec(&[&path], FormatChoice::Auto))
        .await
        .unwrap();
    let first = ev
        .until("format", |e| matches!(e.kind, WatchEventKind::Format(_)))
        .await;
    assert!(matches!(first[0].kind, WatchEventKind::Opened), "{first:?}");
    assert_eq!(
        first.last().unwrap().kind,
        WatchEventKind::Format(Format::KerasCsv)
    );
    assert_eq!(&*first[0].key, "job");

    let mut writer = OpenOptions::new().append(true).open(&path).unwrap();
    writer.write_all(b"0,1.5").unwrap();
    assert!(
        ev.quiet().await.is_empty(),
        "a line was delivered before its newline"
    );
    writer.write_all(b"\n1,1.0\r\n2,0.").unwrap();
    let (recs, _) = ev.records(2).await;
    assert_eq!(losses(&recs), vec![1.5, 1.0]);
    assert_eq!(recs[0].index, 0);
    assert_eq!(recs[1].epoch, Some(1.0));
    assert_eq!(&*recs[0].file, path.as_path());
    assert!(ev.quiet().await.is_empty());
    writer.write_all(b"5").unwrap();
    drop(writer); // the writer closes: its unterminated last line is complete
    let (recs, _) = ev.records(1).await;
    assert_eq!(losses(&recs), vec![0.5]);
}

#[tokio::test]
async fn tqdm_carriage_return_refreshes_are_records() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bar.log");
    fs::write(&path, "").unwrap();
    let (h, mut ev) = start();
    h.add("job", spec(&[&path], FormatChoice::Fixed(Format::Tqdm)))
        .await
        .unwrap();
    let mut w = OpenOptions::new().append(true).open(&path).unwrap();
    for (i, loss) in [0.9, 0.8, 0.7].iter().enumerate() {
        write!(
            w,
            "\rEpoch 0:  {i}0%|█   | {i}/10 [00:0{i}<00:09, 1.00it/s, loss={loss}]"
        )
        .unwrap();
    }
    // The third refresh is complete only when the next one starts.
    let (recs, _) = ev.records(2).await;
    assert_eq!(losses(&recs), vec![0.9, 0.8]);
    w.write_all(b"\n").unwrap();
    let (recs, _) = ev.records(1).await;
    assert_eq!(losses(&recs), vec![0.7]);
    assert_eq!(recs[0].step, Some(2));
}

#[tokio::test]
async fn files_and_directories_created_later_are_picked_up_and_the_newest_glob_match_wins() {
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("lightning_logs");
    let pattern = logs.join("version_*/metrics.csv");
    let (h, mut ev) = start();
    h.add("job", spec(&[&pattern], FormatChoice::Auto))
        .await
        .unwrap();
    assert!(ev.quiet().await.is_empty());

    fs::create_dir_all(logs.join("version_0")).unwrap();
    let v0 = logs.join("version_0/metrics.csv");
    append(&v0, "epoch,step,train_loss\n0,9,2.0\n");
    let (recs, other) = ev.records(1).await;
    assert_eq!(recs[0].metrics.get("train_loss"), Some(2.0));
    assert_eq!(&*recs[0].file, v0.as_path());
    assert!(other.iter().any(|e| e.kind == WatchEventKind::Opened));

    append(&v0, "0,19,1.5\n");
    let (recs, _) = ev.records(1).await;
    assert_eq!(recs[0].step, Some(19));

    // A newer run: Lightning creates version_1.
    fs::create_dir_all(logs.join("version_1")).unwrap();
    let v1 = logs.join("version_1/metrics.csv");
    append(&v1, "epoch,step,train_loss\n0,9,3.0\n");
    let seen = ev.until("a record of version_1", is_record).await;
    let closed = seen
        .iter()
        .position(|e| e.kind == WatchEventKind::Closed && &*e.file == v0.as_path());
    let opened = seen
        .iter()
        .position(|e| e.kind == WatchEventKind::Opened && &*e.file == v1.as_path());
    assert!(
        closed.is_some() && opened.is_some() && closed < opened,
        "{seen:#?}"
    );
    let WatchEventKind::Record(r) = &seen.last().unwrap().kind else {
        unreachable!()
    };
    assert_eq!(
        (&*r.file, r.metrics.get("train_loss")),
        (v1.as_path(), Some(3.0))
    );
    // The old run is no longer followed.
    append(&v0, "0,29,1.0\n");
    assert!(ev.quiet().await.is_empty());
}

#[tokio::test]
async fn rename_rotation_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("train.log");
    let rotated = dir.path().join("train.log.1");
    let (h, mut ev) = start();
    h.add("job", spec(&[&path], FormatChoice::Fixed(Format::Nanogpt)))
        .await
        .unwrap();
    let mut w = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .unwrap();
    writeln!(w, "iter 0: loss 4.0, time 1.0ms, mfu 0.01%").unwrap();
    let (recs, _) = ev.records(1).await;
    assert_eq!(losses(&recs), vec![4.0]);

    fs::rename(&path, &rotated).unwrap();
    // The writer has not reopened yet: its lines still count.
    writeln!(w, "iter 1: loss 3.0, time 1.0ms, mfu 0.01%").unwrap();
    let (recs, _) = ev.records(1).await;
    assert_eq!(losses(&recs), vec![3.0]);
    writeln!(w, "iter 2: loss 2.5, time 1.0ms, mfu 0.01%").unwrap();
    drop(w);
    append(&path, "iter 3: loss 2.0, time 1.0ms, mfu 0.01%\n");
    let seen = ev
        .until(
            "the new file's record",
            |e| matches!(&e.kind, WatchEventKind::Record(r) if r.metrics.get("loss") == Some(2.0)),
        )
        .await;
    let recs: Vec<Record> = seen
        .iter()
        .filter_map(|e| match &e.kind {
            WatchEventKind::Record(r) => Some(r.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(losses(&recs), vec![2.5, 2.0], "{seen:#?}");
    assert_eq!(recs[1].index, 0, "the new file numbers its records from 0");
    assert!(seen.iter().any(|e| e.kind == WatchEventKind::Closed));
}

#[tokio::test]
async fn copytruncate_restarts_at_the_beginning() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("train.log");
    append(
        &path,
        "iter 0: loss 1.0, time 1.0ms, mfu 0.01%\niter 1: loss 0.9, time 1.0ms, mfu 0.01%\n",
    );
    let (h, mut ev) = start();
    h.add("job", spec(&[&path], FormatChoice::Auto))
        .await
        .unwrap();
    let (recs, _) = ev.records(2).await;
    assert_eq!(losses(&recs), vec![1.0, 0.9]);

    // logrotate copytruncate: copy away, truncate in place; the writer (O_APPEND) goes on at 0,
    // here before the watcher even looked at the truncation.
    fs::copy(&path, dir.path().join("train.log.1")).unwrap();
    let mut w = OpenOptions::new().append(true).open(&path).unwrap();
    w.set_len(0).unwrap();
    w.write_all(
        b"iter 0: loss 5.0, time 1.0ms, mfu 0.01%\niter 1: loss 4.9, time 1.0ms, mfu 0.01%\niter 2: loss 4.8, time 1.0ms, mfu 0.01%\n",
    )
    .unwrap();
    let seen = ev
        .until(
            "the last new record",
            |e| matches!(&e.kind, WatchEventKind::Record(r) if r.metrics.get("loss") == Some(4.8)),
        )
        .await;
    let truncated = seen
        .iter()
        .position(|e| e.kind == WatchEventKind::Truncated)
        .unwrap_or_else(|| panic!("no Truncated event: {seen:#?}"));
    let after: Vec<Record> = seen[truncated..]
        .iter()
        .filter_map(|e| match &e.kind {
            WatchEventKind::Record(r) => Some(r.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(losses(&after), vec![5.0, 4.9, 4.8], "{seen:#?}");
}

#[tokio::test]
async fn a_deleted_file_is_dropped_and_followed_again_when_it_reappears() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("train.log");
    append(&path, "iter 0: loss 1.0, time 1.0ms, mfu 0.01%\n");
    let (h, mut ev) = start();
    h.add("job", spec(&[&path], FormatChoice::Auto))
        .await
        .unwrap();
    ev.records(1).await;
    fs::remove_file(&path).unwrap();
    ev.until("Closed", |e| e.kind == WatchEventKind::Closed)
        .await;
    assert_eq!(h.stats().await.unwrap().files, 0);
    append(&path, "iter 0: loss 7.0, time 1.0ms, mfu 0.01%\n");
    let (recs, other) = ev.records(1).await;
    assert_eq!(losses(&recs), vec![7.0]);
    assert!(other.iter().any(|e| e.kind == WatchEventKind::Opened));
}

#[tokio::test]
async fn a_deleted_directory_is_watched_for_again() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let path = run.join("train.log");
    fs::create_dir(&run).unwrap();
    append(&path, "iter 0: loss 1.0, time 1.0ms, mfu 0.01%\n");
    let (h, mut ev) = start();
    h.add("job", spec(&[&path], FormatChoice::Auto))
        .await
        .unwrap();
    ev.records(1).await;
    fs::remove_dir_all(&run).unwrap();
    ev.until("Closed", |e| e.kind == WatchEventKind::Closed)
        .await;
    fs::create_dir(&run).unwrap();
    append(&path, "iter 0: loss 6.0, time 1.0ms, mfu 0.01%\n");
    let (recs, _) = ev.records(1).await;
    assert_eq!(losses(&recs), vec![6.0]);
}

fn trainer_state(losses: &[f64]) -> String {
    let entries: Vec<String> = losses
        .iter()
        .enumerate()
        .map(|(i, l)| {
            format!(
                "    {{\n      \"epoch\": {}.0,\n      \"loss\": {l},\n      \"step\": {}\n    }}",
                i + 1,
                (i + 1) * 10
            )
        })
        .collect();
    format!(
        "{{\n  \"global_step\": {},\n  \"log_history\": [\n{}\n  ],\n  \"max_steps\": 100\n}}\n",
        losses.len() * 10,
        entries.join(",\n")
    )
}

#[tokio::test]
async fn rewritten_trainer_state_delivers_only_new_entries() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("trainer_state.json");
    fs::write(&path, trainer_state(&[0.9, 0.8])).unwrap();
    let (h, mut ev) = start();
    h.add("job", spec(&[&path], FormatChoice::Auto))
        .await
        .unwrap();
    let (recs, other) = ev.records(2).await;
    assert_eq!(losses(&recs), vec![0.9, 0.8]);
    assert!(other.contains(&WatchEvent {
        key: "job".into(),
        file: path.as_path().into(),
        kind: WatchEventKind::Format(Format::HfTrainerState)
    }));

    // Hugging Face rewrites the file in place (open "w", write, close).
    fs::write(&path, trainer_state(&[0.9, 0.8, 0.7])).unwrap();
    let (recs, _) = ev.records(1).await;
    assert_eq!(losses(&recs), vec![0.7]);
    assert_eq!(recs[0].step, Some(30));
    assert!(ev.quiet().await.iter().all(|e| !is_record(e)));

    // Or writes a new file and renames it over the old one.
    let tmp = dir.path().join("trainer_state.json.tmp");
    fs::write(&tmp, trainer_state(&[0.9, 0.8, 0.7, 0.6])).unwrap();
    fs::rename(&tmp, &path).unwrap();
    let (recs, _) = ev.records(1).await;
    assert_eq!(losses(&recs), vec![0.6]);
    assert!(ev.quiet().await.iter().all(|e| !is_record(e)));
}

#[tokio::test]
async fn over_long_lines_are_skipped_with_one_problem() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("train.log");
    fs::write(&path, "iter 0: loss 1.0, time 1.0ms, mfu 0.01%\n").unwrap();
    let (h, mut ev) = start();
    h.add("job", spec(&[&path], FormatChoice::Auto))
        .await
        .unwrap();
    ev.records(1).await;
    let long = "x".repeat(3 << 20);
    append(
        &path,
        &format!("{long}\niter 1: loss 0.5, time 1.0ms, mfu 0.01%\n"),
    );
    append(
        &path,
        &format!("{long}\niter 2: loss 0.4, time 1.0ms, mfu 0.01%\n"),
    );
    let (recs, other) = ev.records(2).await;
    assert_eq!(losses(&recs), vec![0.5, 0.4]);
    let mut problems: Vec<WatchEvent> = other
        .into_iter()
        .filter(|e| matches!(e.kind, WatchEventKind::Problem(_)))
        .collect();
    problems.extend(ev.quiet().await);
    assert_eq!(problems.len(), 1, "{problems:#?}");
    let WatchEventKind::Problem(message) = &problems[0].kind else {
        unreachable!()
    };
    assert!(message.contains("longer than 1048576 bytes"), "{message}");
    assert!(!message.contains("xxx"));
}

#[tokio::test]
async fn garbage_and_special_files_are_reported_once_without_their_content() {
    let dir = tempfile::tempdir().unwrap();
    let garbage = dir.path().join("garbage.bin");
    let fifo = dir.path().join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let mut bytes = Vec::new();
    let mut x: u32 = 12345;
    while bytes.len() < (3 << 19) {
        x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
        bytes.extend_from_slice(&x.to_le_bytes());
        if x.is_multiple_of(7) {
            bytes.extend_from_slice(b"SECRET-TOKEN");
        }
    }
    fs::write(&garbage, &bytes).unwrap();
    let (h, mut ev) = start();
    h.add(
        "job",
        spec(
            &[&garbage, &fifo, Path::new("/dev/zero")],
            FormatChoice::Auto,
        ),
    )
    .await
    .unwrap();
    let mut problems = Vec::new();
    while problems.len() < 3 {
        let e = ev.next().await;
        assert!(!is_record(&e), "garbage gave a record: {e:?}");
        if let WatchEventKind::Problem(m) = &e.kind {
            problems.push((e.file.to_path_buf(), m.clone()));
        }
    }
    problems.sort();
    for (_, m) in &problems {
        assert!(!m.contains("SECRET"), "a problem quotes the file: {m}");
    }
    let messages: Vec<&str> = problems.iter().map(|(_, m)| m.as_str()).collect();
    assert_eq!(messages[0], "cannot read /dev/zero: not a regular file");
    assert_eq!(
        messages[1],
        format!("cannot read {}: not a regular file", fifo.display())
    );
    assert!(
        messages[2].starts_with(&format!(
            "no known training-log format recognised in {}",
            garbage.display()
        )),
        "{}",
        messages[2]
    );
    // Reported once: more garbage and directory events bring no repeat.
    append(&garbage, "more SECRET-TOKEN garbage\n");
    fs::write(dir.path().join("other"), "x").unwrap();
    let again = ev.quiet().await;
    assert!(
        again
            .iter()
            .all(|e| !matches!(e.kind, WatchEventKind::Problem(_)) && !is_record(e)),
        "{again:#?}"
    );
    // The watcher still works.
    let good = dir.path().join("good.log");
    append(&good, "iter 0: loss 1.0, time 1.0ms, mfu 0.01%\n");
    h.add("good", spec(&[&good], FormatChoice::Auto))
        .await
        .unwrap();
    let (recs, _) = ev.records(1).await;
    assert_eq!(losses(&recs), vec![1.0]);
}

#[tokio::test]
async fn bad_requests_are_refused() {
    let (h, _ev) = start();
    assert!(matches!(
        h.add("a", spec(&[Path::new("relative.log")], FormatChoice::Auto))
            .await,
        Err(WatchError::RelativePath(_))
    ));
    assert!(matches!(
        h.add("a", spec(&[], FormatChoice::Auto)).await,
        Err(WatchError::NoPaths)
    ));
    assert!(matches!(
        h.add("a", spec(&[Path::new("/tmp/[x")], FormatChoice::Auto))
            .await,
        Err(WatchError::BadPattern { .. })
    ));
    let mut bad = spec(&[Path::new("/tmp/x.log")], FormatChoice::Auto);
    bad.custom = Some(governor_progress::CustomFormat {
        regex: "(?P<step>\\d+)".into(),
        split: None,
    });
    assert!(matches!(h.add("a", bad).await, Err(WatchError::Format(_))));
    assert_eq!(h.stats().await.unwrap().keys, 0);
}

#[tokio::test]
async fn removing_a_key_stops_its_events_and_releases_its_watches() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.log");
    let b = dir.path().join("b.log");
    append(&a, "iter 0: loss 1.0, time 1.0ms, mfu 0.01%\n");
    append(&b, "iter 0: loss 2.0, time 1.0ms, mfu 0.01%\n");
    let (h, mut ev) = start();
    h.add("a", spec(&[&a], FormatChoice::Auto)).await.unwrap();
    h.add("b", spec(&[&b], FormatChoice::Auto)).await.unwrap();
    ev.records(2).await;
    assert_eq!(
        h.stats().await.unwrap(),
        WatchStats {
            keys: 2,
            files: 2,
            file_watches: 2,
            dir_watches: 1
        }
    );
    h.remove("a").await.unwrap();
    h.remove("unknown").await.unwrap();
    append(&a, "iter 1: loss 0.5, time 1.0ms, mfu 0.01%\n");
    append(&b, "iter 1: loss 1.5, time 1.0ms, mfu 0.01%\n");
    let (recs, _) = ev.records(1).await;
    assert_eq!(&*recs[0].file, b.as_path());
    assert!(ev.quiet().await.is_empty());
    h.remove("b").await.unwrap();
    assert_eq!(h.stats().await.unwrap(), WatchStats::default());
}

#[tokio::test]
async fn a_custom_regex_from_the_job_configuration() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("custom.log");
    append(&path, "it=10 L=0.25\nnoise\nit=20 L=0.20\n");
    let (h, mut ev) = start();
    let spec: WatchSpec = toml::from_str(&format!(
        "paths = [{:?}]\n[custom]\nregex = '^it=(?P<step>\\d+) L=(?P<loss>\\S+)$'\n",
        path.display().to_string()
    ))
    .unwrap();
    h.add("job", spec).await.unwrap();
    let (recs, other) = ev.records(2).await;
    assert_eq!(losses(&recs), vec![0.25, 0.2]);
    assert_eq!(recs[1].step, Some(20));
    assert!(
        other
            .iter()
            .any(|e| e.kind == WatchEventKind::Format(Format::Custom))
    );
}

#[tokio::test]
async fn many_files_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let (h, mut ev) = start();
    let paths: Vec<PathBuf> = (0..300)
        .map(|i| dir.path().join(format!("job{i}/run/train.log")))
        .collect();
    for (i, p) in paths.iter().enumerate() {
        h.add(&format!("job{i}"), spec(&[p], FormatChoice::Auto))
            .await
            .unwrap();
    }
    for p in &paths {
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        let mut f = File::create(p).unwrap();
        writeln!(f, "iter 0: loss 1.0, time 1.0ms, mfu 0.01%").unwrap();
    }
    let (recs, _) = ev.records(300).await;
    let mut files: Vec<_> = recs.iter().map(|r| r.file.to_path_buf()).collect();
    files.sort();
    files.dedup();
    assert_eq!(files.len(), 300);
    assert_eq!(h.stats().await.unwrap().files, 300);
}

#[tokio::test]
async fn watched_records_drive_a_jobs_progress_signal() {
    use governor_progress::{SignalConfig, SignalTracker, SignalUpdate};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("train.log");
    append(
        &path,
        "step 0: train loss 4.2, val loss 4.3\niter 0: loss 4.0, time 1.0ms, mfu 0.01%\niter 5: loss 3.0, time 1.0ms, mfu 0.01%\n",
    );
    let (h, mut ev) = start();
    h.add("job", spec(&[&path], FormatChoice::Auto))
        .await
        .unwrap();
    let mut tracker = SignalTracker::new(SignalConfig::default());
    let (recs, _) = ev.records(3).await;
    let updates: Vec<SignalUpdate> = recs.iter().map(|r| tracker.observe(r)).collect();
    assert_eq!(
        updates,
        vec![
            SignalUpdate::Absent,
            SignalUpdate::Value {
                value: 4.0,
                new_segment: false
            },
            SignalUpdate::Value {
                value: 3.0,
                new_segment: false
            },
        ]
    );
    // The run diverges, then a new run is appended to the same file.
    append(
        &path,
        "iter 10: loss nan, time 1.0ms, mfu 0.01%\niter 0: loss 4.1, time 1.0ms, mfu 0.01%\n",
    );
    let (recs, _) = ev.records(2).await;
    let updates: Vec<SignalUpdate> = recs.iter().map(|r| tracker.observe(r)).collect();
    assert!(matches!(updates[0], SignalUpdate::NonFinite { value } if value.is_nan()));
    assert_eq!(
        updates[1],
        SignalUpdate::Value {
            value: 4.1,
            new_segment: true
        }
    );
    assert_eq!(tracker.metric(), Some("loss"));
    assert_eq!(tracker.runs(), 2);
}

#[tokio::test]
async fn a_consumer_that_waits_on_a_request_while_the_channel_is_full_is_answered() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.log");
    let b = dir.path().join("b.log");
    let lines: String = (0..50)
        .map(|i| {
            format!(
                "iter {i}: loss {}, time 1.0ms, mfu 0.01%\n",
                1.0 / (i + 1) as f64
            )
        })
        .collect();
    append(&a, &lines);
    append(&b, "iter 0: loss 2.0, time 1.0ms, mfu 0.01%\n");
    // Room for one event: `a`'s 50 records cannot all be delivered while nobody reads.
    let (h, rx) = Watcher::spawn(1).expect("watcher starts");
    let mut ev = Events { rx };
    h.add("a", spec(&[&a], FormatChoice::Auto)).await.unwrap();
    // The daemon adds jobs one after the other before it reads events: these must not hang.
    timeout(PATIENCE, h.add("b", spec(&[&b], FormatChoice::Auto)))
        .await
        .expect("add answered while the channel is full")
        .unwrap();
    let stats = timeout(PATIENCE, h.stats()).await.expect("stats answered");
    assert_eq!(stats.unwrap().keys, 2);
    // Removing `a` drops what it had waiting: at most the one event already in the channel
    // is of `a`, then `b`'s record comes.
    timeout(PATIENCE, h.remove("a")).await.unwrap().unwrap();
    let seen = ev
        .until("b's record", |e| is_record(e) && &*e.key == "b")
        .await;
    let of_a = seen.iter().filter(|e| &*e.key == "a").count();
    assert!(of_a <= 1, "{of_a} events of the removed key delivered");
    assert!(ev.quiet().await.is_empty());
}

#[tokio::test(flavor = "current_thread")]
async fn the_watcher_as_a_task_on_the_callers_runtime_delivers_like_the_thread() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("train.log");
    append(&path, "iter 0: loss 1.0, time 1.0ms, mfu 0.01%\n");
    let (h, rx) = Watcher::spawn_task(4).expect("watcher task starts");
    let mut ev = Events { rx };
    h.add("job", spec(&[&path], FormatChoice::Auto))
        .await
        .unwrap();
    let (recs, _) = ev.records(1).await;
    assert_eq!(losses(&recs), vec![1.0]);
    // More rows than the channel holds, appended later: all arrive, in order.
    let more: String = (1..=20)
        .map(|i| {
            format!(
                "iter {i}: loss {}, time 1.0ms, mfu 0.01%\n",
                1.0 / (i + 1) as f64
            )
        })
        .collect();
    append(&path, &more);
    let (recs, _) = ev.records(20).await;
    let expected: Vec<f64> = (1..=20).map(|i| 1.0 / (i + 1) as f64).collect();
    assert_eq!(losses(&recs), expected);
    assert_eq!(h.stats().await.unwrap().files, 1);
    drop(h);
}

#[tokio::test(flavor = "current_thread")]
async fn a_long_backlog_read_as_a_task_leaves_the_thread_to_others_between_chunks() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("train.log");
    // A known format, then 6 MiB of lines that are no records (read a MiB a turn), then a row.
    let mut text = String::from("iter 0: loss 1.0, time 1.0ms, mfu 0.01%\n");
    let noise = "warning: something happened in the data loader, carrying on\n";
    while text.len() < 6 << 20 {
        text.push_str(noise);
    }
    text.push_str("iter 1: loss 0.5, time 1.0ms, mfu 0.01%\n");
    append(&path, &text);

    let turns = Arc::new(AtomicUsize::new(0));
    let neighbour = {
        let turns = turns.clone();
        tokio::spawn(async move {
            loop {
                turns.fetch_add(1, Ordering::Relaxed);
                tokio::task::yield_now().await;
            }
        })
    };
    let (h, rx) = Watcher::spawn_task(64).expect("watcher task starts");
    let mut ev = Events { rx };
    h.add("job", spec(&[&path], FormatChoice::Auto))
        .await
        .unwrap();
    let (recs, _) = ev.records(2).await;
    assert_eq!(losses(&recs), vec![1.0, 0.5]);
    let seen = turns.load(Ordering::Relaxed);
    neighbour.abort();
    assert!(
        seen >= 5,
        "the neighbour task ran {seen} times while 6 MiB were read: the watcher kept the thread"
    );
}
