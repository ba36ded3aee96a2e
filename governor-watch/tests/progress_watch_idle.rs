//! An idle watcher costs no CPU: no polling loop, the thread sleeps until inotify wakes it.
//! (Its own test binary, so that the watcher thread is the only one of its name.)

use std::io::Write;
use std::time::Duration;

use governor_progress::FormatChoice;
use governor_watch::{WatchEventKind, WatchSpec, Watcher};

/// utime + stime, in clock ticks, of this process's thread named `name`.
fn thread_cpu_ticks(name: &str) -> u64 {
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim_end() != name {
            continue;
        }
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap();
        // Fields after the parenthesised command: state is field 3, utime 14, stime 15.
        let after = &stat[stat.rfind(')').unwrap() + 2..];
        let fields: Vec<&str> = after.split_whitespace().collect();
        let utime: u64 = fields[11].parse().unwrap();
        let stime: u64 = fields[12].parse().unwrap();
        return utime + stime;
    }
    panic!("no thread named {name}");
}

#[tokio::test]
async fn an_idle_watcher_uses_no_cpu() {
    let dir = tempfile::tempdir().unwrap();
    let (h, mut rx) = Watcher::spawn(1024).unwrap();
    for i in 0..200 {
        let p = dir.path().join(format!("{i}.log"));
        let mut f = std::fs::File::create(&p).unwrap();
        writeln!(f, "iter 0: loss 1.0, time 1.0ms, mfu 0.01%").unwrap();
        let spec = WatchSpec {
            paths: vec![p],
            format: FormatChoice::Auto,
            custom: None,
            owner: None,
        };
        h.add(&format!("job{i}"), spec).await.unwrap();
    }
    // A glob on a directory that does not exist yet, too.
    let spec = WatchSpec {
        paths: vec![dir.path().join("later/version_*/metrics.csv")],
        format: FormatChoice::Auto,
        custom: None,
        owner: None,
    };
    h.add("later", spec).await.unwrap();
    let mut records = 0;
    while records < 200 {
        let ev = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("records arrive")
            .unwrap();
        if matches!(ev.kind, WatchEventKind::Record(_)) {
            records += 1;
        }
    }
    // Let the watcher finish what the set-up caused (directory events of 200 creations).
    h.stats().await.unwrap();
    let mut last = thread_cpu_ticks("governor-watch");
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = thread_cpu_ticks("governor-watch");
        if now == last {
            break;
        }
        last = now;
    }
    let before = thread_cpu_ticks("governor-watch");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = thread_cpu_ticks("governor-watch");
    assert_eq!(
        after - before,
        0,
        "the idle watcher thread used {} clock ticks in 3 s",
        after - before
    );
    assert!(rx.try_recv().is_err(), "events while idle");
}
