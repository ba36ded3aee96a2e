//! A running job moved between two real `governor daemon`s by the real coordinator over mTLS,
//! on the host: `govctl move` (the client's `move_job`) asks node-a to save the job, the job
//! (`demo-trainer --checkpoint-dir`, a framework checkpoint) saves at its next epoch boundary
//! and exits, and node-b starts the same command, which resumes from the checkpoint on the path
//! both nodes share. Its log goes on from the epoch it left, and its final loss equals, bit for
//! bit, that of the same run never moved.
//!
//! Host test: the daemons run with `--dry-run` on fake cgroup roots (never the host's cgroups).
//! It needs the `governor` and `demo-trainer` binaries (`cargo test --workspace` builds them).

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use coordinator::certs;
use coordinator::cli::Client;
use coordinator::server::{self, ServerConfig};
use coordinator::state::StateConfig;
use governor::cgroup::fake::FakeCgroupRoot;
use governor::coordinator_client::TlsFiles;
use governor_integration_tests::daemon::{Daemon, bin};
use governor_integration_tests::{demo_trainer_argv, keras_epochs, poll_until};
use governor_proto::control::{JobSpec, JobState, MovePhase, NodeState};
use governor_proto::node::{Checkpoint, DEFAULT_SAVE_SIGNAL};

fn wait_for<T>(
    what: &str,
    within: Duration,
    daemons: &[&Daemon],
    f: impl FnMut() -> Option<T>,
) -> T {
    poll_until(what, within, Duration::from_millis(100), f, || {
        let logs: Vec<String> = daemons.iter().map(|d| d.log_tail()).collect();
        format!("daemon logs:\n{}", logs.join("\n----\n"))
    })
}

/// A coordinator (first-fit) and the daemons of node-a and node-b, joined over mTLS.
struct Cluster {
    dir: tempfile::TempDir,
    rt: tokio::runtime::Runtime,
    _server: server::RunningServer,
    govctl: Client,
    /// The coordinator's address and the certificates (`govctl --coordinator --certs`).
    address: String,
    certs: std::path::PathBuf,
    a: Daemon,
    b: Daemon,
}

impl Cluster {
    /// `groups`: the job cgroup names to make on each fake root (the kernel would on mkdir).
    fn start(groups: &[String]) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let certs_dir = dir.path().join("certs");
        governor_integration_tests::loopback_certs(&certs_dir, &["node-a", "node-b"]);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let server = rt
            .block_on(server::start(ServerConfig {
                listen: "127.0.0.1:0".parse::<SocketAddr>().unwrap(),
                store: dir.path().join("coordinator.redb"),
                tls: Some(TlsFiles::in_dir(&certs_dir, certs::COORDINATOR)),
                policy: "first-fit".into(),
                state: StateConfig {
                    lost_after_s: 5.0,
                    auto_move: false,
                    ..StateConfig::default()
                }
                .into(),
                web: Default::default(),
            }))
            .expect("the coordinator starts");
        let address = server.addr.to_string();
        let mut govctl = rt
            .block_on(Client::connect(
                &address,
                Some(&TlsFiles::in_dir(&certs_dir, "admin")),
            ))
            .expect("govctl connects");
        let node = |name: &str| -> Daemon {
            let root = dir.path().join(format!("cgroup-{name}"));
            std::fs::create_dir(&root).unwrap();
            let fake = FakeCgroupRoot::unified(&root);
            for g in groups {
                fake.add_group(&format!("governor.slice/jobs/{g}"));
            }
            let out = dir.path().join(format!("output-{name}"));
            let mut d = Daemon::configure(
                "shortest-left",
                &format!(
                    "cgroup_root = \"{}\"\n[discovery]\nenvironment = false\n[coordinator]\naddress = \"192.0.2.1:7070\"\nallow_root_jobs = true\njob_output_dir = \"{}\"\nstop_grace = \"2s\"\n",
                    root.display(),
                    out.display()
                ),
            );
            d.extra_args = vec![
                "--dry-run".into(),
                "--node-name".into(),
                name.into(),
                "--coordinator".into(),
                address.clone(),
                "--certs".into(),
                certs_dir.display().to_string(),
            ];
            d.spawn();
            d
        };
        let a = node("node-a");
        let b = node("node-b");
        wait_for(
            "both nodes ready",
            Duration::from_secs(30),
            &[&a, &b],
            || {
                let nodes = rt.block_on(govctl.nodes()).ok()?;
                (nodes
                    .iter()
                    .filter(|n| n.status == NodeState::Ready)
                    .count()
                    == 2)
                    .then_some(())
            },
        );
        Cluster {
            dir,
            rt,
            _server: server,
            govctl,
            address,
            certs: certs_dir,
            a,
            b,
        }
    }

    fn shared(&self) -> std::path::PathBuf {
        let p = self.dir.path().join("shared");
        std::fs::create_dir_all(&p).unwrap();
        p
    }
}

/// demo-trainer's arguments for a small, deterministic run logging to `log`.
fn trainer_args(log: &Path, epochs: u64) -> Vec<String> {
    demo_trainer_argv(&bin("demo-trainer"), log, epochs, 512, 7)
}

/// A movable job running `argv` with its checkpoint in `ckpt`.
fn movable(name: &str, argv: Vec<String>, log: &Path, ckpt: &Path) -> JobSpec {
    let mut spec = JobSpec::new(name, argv, log.display().to_string());
    spec.metric = "loss".into();
    spec.checkpoint = Some(Checkpoint {
        dir: ckpt.display().to_string(),
        save_signal: DEFAULT_SAVE_SIGNAL,
        carry: false,
        transparent: false,
    });
    spec
}

#[test]
fn a_job_moved_by_its_framework_checkpoint_resumes_where_it_left_and_ends_bit_for_bit() {
    let mut c = Cluster::start(&["train-j1".into()]);
    let shared = c.shared();

    // The same run, never moved: the reference.
    let reference = shared.join("reference.csv");
    let args = trainer_args(&reference, 20);
    let status = std::process::Command::new(&args[0])
        .args(&args[1..])
        .stdout(std::process::Stdio::null())
        .status()
        .expect("demo-trainer runs");
    assert!(status.success());
    let expected = keras_epochs(&reference);
    assert_eq!(expected.len(), 20);

    let log = shared.join("train.csv");
    let ckpt = shared.join("ckpt");
    let mut argv = trainer_args(&log, 20);
    argv.extend(
        [
            "--checkpoint-dir",
            &ckpt.display().to_string(),
            "--pause-ms",
            "300",
        ]
        .map(str::to_owned),
    );
    let submitted =
        c.rt.block_on(c.govctl.submit(movable("train", argv, &log, &ckpt)))
            .expect("submit");
    assert_eq!(submitted.id, "j1");
    assert_eq!(submitted.members[0].node, "node-a");
    wait_for(
        "a few epochs on node-a",
        Duration::from_secs(60),
        &[&c.a, &c.b],
        || (keras_epochs(&log).len() >= 4).then_some(()),
    );

    // `govctl logs --follow` from here on: it follows the job to node-b and ends with it.
    let follower = governor_integration_tests::daemon::govctl_command(&c.address, &c.certs)
        .args(["logs", "--follow", "j1"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("govctl logs --follow");
    let moving =
        c.rt.block_on(c.govctl.move_job("j1", Some("node-b")))
            .expect("govctl move");
    assert_eq!(
        (moving.from_node.as_str(), moving.to_node.as_str()),
        ("node-a", "node-b")
    );
    let (detail, mv) = wait_for(
        "the job to run on node-b",
        Duration::from_secs(60),
        &[&c.a, &c.b],
        || {
            let d = c.rt.block_on(c.govctl.job("j1")).ok()?;
            let m = d.moves.last()?.clone();
            (m.phase == MovePhase::Done).then_some((d, m))
        },
    );
    assert_eq!(detail.summary.members[0].node, "node-b", "{detail:?}");
    let pause = mv.pause_s(0.0).expect("saved and running times");
    assert!(pause < 30.0, "paused {pause:.1} s: {mv:?}");

    let done = wait_for(
        "the job to complete",
        Duration::from_secs(90),
        &[&c.a, &c.b],
        || {
            let d = c.rt.block_on(c.govctl.job("j1")).ok()?;
            d.summary.status.is_finished().then_some(d)
        },
    );
    assert_eq!(done.summary.status, JobState::Completed, "{done:?}");
    assert_eq!(done.summary.members[0].node, "node-b");

    // Every epoch once, in order: it went on from the epoch it left.
    let got = keras_epochs(&log);
    let numbers: Vec<u64> = got.iter().map(|(e, _)| *e).collect();
    assert_eq!(numbers, (0..20).collect::<Vec<u64>>(), "{got:?}");
    // And learnt exactly what the run that never moved learnt.
    assert_eq!(got, expected, "the moved run's losses differ");
    let out = |node: &str| {
        std::fs::read_to_string(c.dir.path().join(format!("output-{node}/train-j1.out"))).unwrap()
    };
    assert!(
        out("node-a").contains("saved after epoch"),
        "{}",
        out("node-a")
    );
    assert!(
        out("node-b").contains("resuming at epoch"),
        "{}",
        out("node-b")
    );
    let followed = follower
        .wait_with_output()
        .expect("govctl logs ends with the job");
    let stderr = String::from_utf8_lossy(&followed.stderr);
    assert!(followed.status.success(), "{stderr}");
    assert_eq!(
        String::from_utf8_lossy(&followed.stdout),
        out("node-a") + &out("node-b"),
        "the followed output is node-a's whole output, then node-b's; stderr: {stderr}"
    );
    assert!(stderr.contains("moved from node-a to node-b"), "{stderr}");
}

/// `cargo xtask bench-move --framework`: the cost of a framework-checkpoint move against the
/// size of the job's state (`demo-trainer --ballast-mib`), through the real coordinator and
/// daemons. Sizes and repetitions from `GOVERNOR_BENCH_SIZES` (MiB, comma-separated) and
/// `GOVERNOR_BENCH_REPS`; results as JSON lines to `GOVERNOR_BENCH_OUT`.
#[test]
#[ignore = "benchmark: run with `cargo xtask bench-move --framework`"]
fn bench_framework_move() {
    let sizes: Vec<usize> = std::env::var("GOVERNOR_BENCH_SIZES")
        .unwrap_or_else(|_| "64,256,1024".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let reps: usize = std::env::var("GOVERNOR_BENCH_REPS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(3);
    let out = std::path::PathBuf::from(
        std::env::var("GOVERNOR_BENCH_OUT").unwrap_or_else(|_| "framework-move.jsonl".into()),
    );
    let runs = sizes.len() * reps;
    let groups: Vec<String> = (1..=runs).map(|k| format!("bench-j{k}")).collect();
    let mut c = Cluster::start(&groups);
    let shared = c.shared();
    let mut lines = String::new();
    let mut k = 0;
    for &mib in &sizes {
        for rep in 0..reps {
            k += 1;
            let id = format!("j{k}");
            let log = shared.join(format!("bench-{k}.csv"));
            let ckpt = shared.join(format!("ckpt-{k}"));
            let mut argv = trainer_args(&log, 1000);
            argv.extend([
                "--checkpoint-dir".to_owned(),
                ckpt.display().to_string(),
                "--pause-ms".to_owned(),
                "500".to_owned(),
                "--ballast-mib".to_owned(),
                mib.to_string(),
            ]);
            let submitted =
                c.rt.block_on(c.govctl.submit(movable("bench", argv, &log, &ckpt)))
                    .expect("submit");
            assert_eq!(submitted.id, id);
            let source = submitted.members[0].node.clone();
            let target = if source == "node-a" {
                "node-b"
            } else {
                "node-a"
            };
            // Epoch lines as they appear, with when.
            let mut seen: Vec<Instant> = Vec::new();
            let watch = |seen: &mut Vec<Instant>| {
                let n = keras_epochs(&log).len();
                while seen.len() < n {
                    seen.push(Instant::now());
                }
            };
            wait_for("5 epochs", Duration::from_secs(300), &[&c.a, &c.b], || {
                watch(&mut seen);
                (seen.len() >= 5).then_some(())
            });
            let asked = Instant::now();
            let before = seen.len();
            c.rt.block_on(c.govctl.move_job(&id, Some(target)))
                .expect("govctl move");
            let mv = wait_for("the move", Duration::from_secs(600), &[&c.a, &c.b], || {
                watch(&mut seen);
                let d = c.rt.block_on(c.govctl.job(&id)).ok()?;
                let m = d.moves.last()?.clone();
                m.phase.is_over().then_some(m)
            });
            assert_eq!(mv.phase, MovePhase::Done, "{mv:?}");
            // The first epoch the target ran: its run says where it resumed.
            let resumed_at = wait_for(
                "the target to log an epoch",
                Duration::from_secs(600),
                &[&c.a, &c.b],
                || {
                    watch(&mut seen);
                    let out = std::fs::read_to_string(
                        c.dir.path().join(format!("output-{target}/bench-j{k}.out")),
                    )
                    .ok()?;
                    let first: usize = out
                        .split("resuming at epoch ")
                        .nth(1)?
                        .split_whitespace()
                        .next()?
                        .parse()
                        .ok()?;
                    (seen.len() > first).then_some(first)
                },
            );
            // Epoch length before the move, from the log's own pace.
            let epoch_s = seen[before - 1]
                .duration_since(seen[before - 4])
                .as_secs_f64()
                / 3.0;
            // From the last epoch on the source to the first on the target, less an epoch: what
            // the move cost the job.
            let gap = seen[resumed_at].duration_since(seen[resumed_at - 1]);
            let bytes: u64 = std::fs::read_dir(&ckpt)
                .map(|d| {
                    d.filter_map(|e| e.ok()?.metadata().ok())
                        .map(|m| m.len())
                        .sum()
                })
                .unwrap_or(0);
            let line = serde_json::json!({
                "mib": mib,
                "rep": rep,
                "from": source,
                "to": target,
                "save_s": mv.saved_at_unix.unwrap() - mv.requested_at_unix,
                "pause_s": mv.pause_s(0.0).unwrap(),
                "total_s": mv.running_at_unix.unwrap() - mv.requested_at_unix,
                "epoch_s": epoch_s,
                "lost_s": (gap.as_secs_f64() - epoch_s).max(0.0),
                "asked_to_resumed_s": seen[resumed_at].duration_since(asked).as_secs_f64(),
                "checkpoint_bytes": bytes,
            });
            eprintln!("{line}");
            lines.push_str(&format!("{line}\n"));
            std::fs::write(&out, &lines).unwrap();
            c.rt.block_on(c.govctl.cancel(&id)).expect("cancel");
            let _ = std::fs::remove_dir_all(&ckpt);
        }
    }
}
