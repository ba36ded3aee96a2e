//! The real `governor daemon` process joined to a real coordinator over mTLS, on the host: jobs
//! submitted through the coordinator's API (what govctl uses) are placed on the node, started by
//! the daemon in their own cgroup, governed, reported running with their progress, and reported
//! finished with their exit status; a job that cannot start is answered `failed` without
//! hurting the daemon; a cancelled job is stopped; a job that asked to finish at convergence and
//! a trial its sweep cuts (judged by the coordinator) is stopped on the node and counted
//! completed; a lost coordinator
//! leaves the node governing.
//!
//! Host test: the daemon runs with `--dry-run` on a fake cgroup root (never the host's
//! cgroups), so it needs no VM. It needs the `governor` binary (`cargo build -p governor`;
//! `cargo xtask test` and `cargo test --workspace` build it).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use coordinator::certs;
use coordinator::cli::Client;
use coordinator::server::{self, RunningServer, ServerConfig};
use coordinator::state::StateConfig;
use governor::cgroup::fake::FakeCgroupRoot;
use governor::coordinator_client::TlsFiles;
use governor_integration_tests::daemon::{Daemon, govctl_command, try_govctl};
use governor_integration_tests::poll_until;
use governor_proto::control::{JobSpec, JobState, NodeState};

fn wait_for<T>(what: &str, within: Duration, daemon: &Daemon, f: impl FnMut() -> Option<T>) -> T {
    poll_until(what, within, Duration::from_millis(100), f, || {
        format!(
            "daemon status: {:?}\ndaemon log:\n{}",
            daemon.status_json(),
            daemon.log_tail()
        )
    })
}

/// The job's row in the coordinator's list.
fn job(
    rt: &tokio::runtime::Runtime,
    govctl: &mut Client,
    id: &str,
) -> governor_proto::control::JobSummary {
    rt.block_on(govctl.jobs(true))
        .expect("govctl jobs")
        .into_iter()
        .find(|j| j.id == id)
        .unwrap_or_else(|| panic!("the coordinator does not list {id}"))
}

/// A plain-text coordinator (first-fit, default timeouts) on loopback with its store in `dir`,
/// its runtime, address and a govctl client.
fn plain_coordinator(
    dir: &std::path::Path,
) -> (tokio::runtime::Runtime, RunningServer, String, Client) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let server: RunningServer = rt
        .block_on(server::start(ServerConfig {
            listen: "127.0.0.1:0".parse::<SocketAddr>().unwrap(),
            store: dir.join("coordinator.redb"),
            tls: None,
            policy: "first-fit".into(),
            state: Default::default(),
            web: Default::default(),
        }))
        .expect("the coordinator starts");
    let address = server.addr.to_string();
    let govctl = rt
        .block_on(Client::connect(&address, None))
        .expect("govctl connects");
    (rt, server, address, govctl)
}

fn coordinator_line(d: &Daemon) -> String {
    d.status_json()
        .and_then(|s| s["coordinator"].as_str().map(str::to_owned))
        .unwrap_or_default()
}

#[test]
fn the_daemon_runs_what_the_coordinator_places_and_reports_it_to_the_end() {
    let dir = tempfile::tempdir().unwrap();
    let certs_dir = dir.path().join("certs");
    governor_integration_tests::loopback_certs(&certs_dir, &["node-a"]);

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let server: RunningServer = rt
        .block_on(server::start(ServerConfig {
            listen: "127.0.0.1:0".parse::<SocketAddr>().unwrap(),
            store: dir.path().join("coordinator.redb"),
            tls: Some(TlsFiles::in_dir(&certs_dir, certs::COORDINATOR)),
            policy: "first-fit".into(),
            state: StateConfig {
                lost_after_s: 5.0,
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

    // The node: a fake cgroup v2 root. The kernel creates a new group's files on mkdir; here the
    // groups of the jobs this test submits are made beforehand (ids are j1, j2... on a fresh
    // coordinator; the daemon reuses an empty group of the right name).
    let root = dir.path().join("cgroup");
    std::fs::create_dir(&root).unwrap();
    let fake = FakeCgroupRoot::unified(&root);
    for group in [
        "train-j1",
        "broken-j2",
        "cancel-me-j3",
        "survivor-j4",
        "plateau-j5",
        "better-j6",
        "worse-j7",
    ] {
        fake.add_group(&format!("governor.slice/jobs/{group}"));
    }
    let out = dir.path().join("job-output");
    // The [coordinator] table's address and `insecure` are overridden by the flags below, as an
    // operator's `--coordinator`/`--certs` override /etc/governor/governor.toml.
    let mut daemon = Daemon::configure(
        "shortest-left",
        &format!(
            "cgroup_root = \"{}\"\n[discovery]\nenvironment = false\n[coordinator]\naddress = \"192.0.2.1:7070\"\ninsecure = true\nallow_root_jobs = true\njob_output_dir = \"{}\"\nstop_grace = \"2s\"\n",
            root.display(),
            out.display()
        ),
    );
    daemon.extra_args = vec![
        "--dry-run".into(),
        "--node-name".into(),
        "node-a".into(),
        "--coordinator".into(),
        address.clone(),
        "--certs".into(),
        certs_dir.display().to_string(),
    ];
    daemon.spawn();

    // It registers and says so in `governor status`.
    wait_for(
        "node-a to be ready",
        Duration::from_secs(30),
        &daemon,
        || {
            let nodes = rt.block_on(govctl.nodes()).ok()?;
            let n = nodes.iter().find(|n| n.name == "node-a")?;
            (n.status == NodeState::Ready).then_some(())
        },
    );
    let nodes = rt.block_on(govctl.nodes()).unwrap();
    assert!(nodes[0].capacity.cores > 0.0, "{nodes:?}");
    wait_for(
        "status to say connected",
        Duration::from_secs(10),
        &daemon,
        || {
            let line = coordinator_line(&daemon);
            line.contains(&format!("{address} connected (session"))
                .then_some(line)
        },
    );

    // A training job: writes a falling loss to its log, prints to stdout, ends with 0.
    let log = dir.path().join("train.log");
    let script = format!(
        "echo starting; i=0; l=4.0; while [ $i -lt 25 ]; do i=$((i+1)); \
         l=$(awk -v l=$l 'BEGIN {{ print l*0.9 }}'); echo \"step $i loss=$l\" >> {}; sleep 0.1; done; \
         echo done",
        log.display()
    );
    let mut spec = JobSpec::new(
        "train",
        vec!["/bin/sh".into(), "-c".into(), script],
        log.display().to_string(),
    );
    spec.metric = "loss".into();
    let submitted = rt.block_on(govctl.submit(spec)).expect("submit train");
    assert_eq!(submitted.id, "j1");
    assert_eq!(submitted.members[0].node, "node-a");

    // The daemon governs it as a coordinator job, and the coordinator sees it run with progress.
    let governed = wait_for(
        "the daemon to govern train",
        Duration::from_secs(20),
        &daemon,
        || daemon.job("train"),
    );
    assert_eq!(
        governed["cgroup"], "/governor.slice/jobs/train-j1",
        "{governed}"
    );
    assert_eq!(governed["runtime"], "coordinator job j1", "{governed}");
    wait_for(
        "the coordinator to see train's progress",
        Duration::from_secs(20),
        &daemon,
        || {
            let detail = rt.block_on(govctl.job("j1")).ok()?;
            (!detail.progress.is_empty()).then_some(detail)
        },
    );
    let done = wait_for(
        "train to complete",
        Duration::from_secs(30),
        &daemon,
        || {
            let j = job(&rt, &mut govctl, "j1");
            j.status.is_finished().then_some(j)
        },
    );
    assert_eq!(done.status, JobState::Completed, "{done:?}");
    let output = std::fs::read_to_string(out.join("train-j1.out")).expect("train's output file");
    assert_eq!(output, "starting\ndone\n");
    // The same through the coordinator, from the node (`govctl logs`), whole or its end.
    assert_eq!(
        try_govctl(&address, &certs_dir, &["logs", "j1"]).as_deref(),
        Ok("starting\ndone\n")
    );
    assert_eq!(
        try_govctl(&address, &certs_dir, &["logs", "--tail", "1", "j1"]).as_deref(),
        Ok("done\n")
    );
    let unknown = try_govctl(&address, &certs_dir, &["logs", "j99"]).unwrap_err();
    assert!(unknown.contains("no job j99"), "{unknown}");
    wait_for(
        "the daemon to let train go",
        Duration::from_secs(10),
        &daemon,
        || daemon.job("train").is_none().then_some(()),
    );
    assert!(
        !root.join("governor.slice/jobs/train-j1").exists(),
        "train's cgroup is removed"
    );

    // A job that cannot start is answered `failed` with the reason; the daemon carries on.
    let broken = JobSpec::new(
        "broken",
        vec!["/nonexistent/train".into()],
        dir.path().join("broken.log").display().to_string(),
    );
    assert_eq!(rt.block_on(govctl.submit(broken)).unwrap().id, "j2");
    let failed = wait_for("broken to fail", Duration::from_secs(20), &daemon, || {
        let j = job(&rt, &mut govctl, "j2");
        j.status.is_finished().then_some(j)
    });
    assert_eq!(failed.status, JobState::Failed, "{failed:?}");
    assert!(
        failed
            .message
            .contains("cannot start \"/nonexistent/train\""),
        "{failed:?}"
    );
    assert!(daemon.status_json().is_some(), "the daemon still answers");

    // A cancelled job is stopped on the node.
    let sleeper = JobSpec::new(
        "cancel-me",
        vec!["/bin/sleep".into(), "300".into()],
        dir.path().join("sleeper.log").display().to_string(),
    );
    assert_eq!(rt.block_on(govctl.submit(sleeper)).unwrap().id, "j3");
    wait_for("cancel-me to run", Duration::from_secs(20), &daemon, || {
        (job(&rt, &mut govctl, "j3").status == JobState::Running).then_some(())
    });
    assert_eq!(
        daemon.job("cancel-me").expect("cancel-me is governed")["source"],
        "launched"
    );
    rt.block_on(govctl.cancel("j3")).expect("cancel");
    wait_for(
        "the daemon to stop cancel-me",
        Duration::from_secs(20),
        &daemon,
        || daemon.job("cancel-me").is_none().then_some(()),
    );
    assert_eq!(job(&rt, &mut govctl, "j3").status, JobState::Cancelled);
    assert!(
        daemon
            .log_text()
            .contains("stopping a job on the coordinator's request"),
        "{}",
        daemon.log_tail()
    );

    // The daemon restarts (an upgrade) while a coordinator job runs: the job runs on, and the
    // restarted daemon takes it back under its coordinator id instead of reporting a local job.
    let survivor_log = dir.path().join("survivor.log");
    let flag = dir.path().join("survivor.stop");
    let script = format!(
        "i=0; while [ ! -e {} ]; do i=$((i+1)); echo \"tick $i\"; echo \"step $i loss=0.$((1000 - i))\" >> {}; sleep 0.2; done; echo last; exit 3",
        flag.display(),
        survivor_log.display()
    );
    let survivor = JobSpec::new(
        "survivor",
        vec!["/bin/sh".into(), "-c".into(), script],
        survivor_log.display().to_string(),
    );
    assert_eq!(rt.block_on(govctl.submit(survivor)).unwrap().id, "j4");
    wait_for("survivor to run", Duration::from_secs(20), &daemon, || {
        (job(&rt, &mut govctl, "j4").status == JobState::Running).then_some(())
    });
    // Its node's decision about it, and why, reaches the coordinator (the page shows it).
    let decided = wait_for(
        "the coordinator to show survivor's decision",
        Duration::from_secs(20),
        &daemon,
        || {
            let j = job(&rt, &mut govctl, "j4");
            (!j.decision.is_empty()).then_some(j.decision)
        },
    );
    let listed = try_govctl(&address, &certs_dir, &["job", "j4"]).expect("govctl job");
    assert!(listed.contains(&decided), "{decided:?} not in:\n{listed}");
    // `govctl logs --follow` prints its output as it comes, across a restart of the daemon,
    // and ends by itself when the job ends.
    let mut follower = govctl_command(&address, &certs_dir)
        .args(["logs", "--follow", "j4"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("govctl logs --follow");
    let followed = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let reader = {
        let followed = followed.clone();
        let mut stdout = follower.stdout.take().unwrap();
        std::thread::spawn(move || {
            use std::io::Read;
            let mut buf = [0u8; 4096];
            while let Ok(n) = stdout.read(&mut buf) {
                if n == 0 {
                    break;
                }
                followed
                    .lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        })
    };
    wait_for(
        "govctl logs -f to print",
        Duration::from_secs(20),
        &daemon,
        || followed.lock().unwrap().contains("tick 2\n").then_some(()),
    );
    let status = daemon.terminate();
    assert!(status.success(), "{}", daemon.log_tail());
    daemon.spawn();
    let taken_back = wait_for(
        "the restarted daemon to govern survivor",
        Duration::from_secs(20),
        &daemon,
        || daemon.job("survivor"),
    );
    assert_eq!(taken_back["runtime"], "coordinator job j4", "{taken_back}");
    assert!(
        daemon
            .log_text()
            .contains("took back a job the coordinator placed here before the restart"),
        "{}",
        daemon.log_tail()
    );
    wait_for(
        "the coordinator to hear from the restarted node",
        Duration::from_secs(20),
        &daemon,
        || {
            let line = coordinator_line(&daemon);
            line.contains("connected (session").then_some(())
        },
    );
    std::thread::sleep(Duration::from_secs(1));
    let jobs = rt.block_on(govctl.jobs(true)).expect("govctl jobs");
    assert_eq!(
        jobs.iter().find(|j| j.id == "j4").map(|j| j.status),
        Some(JobState::Running),
        "{jobs:?}"
    );
    assert!(
        !jobs.iter().any(|j| j.id.contains("survivor-j4")),
        "reported as a local job too: {jobs:?}"
    );
    std::fs::write(&flag, "").unwrap();
    let done = wait_for("survivor to end", Duration::from_secs(20), &daemon, || {
        let j = job(&rt, &mut govctl, "j4");
        j.status.is_finished().then_some(j)
    });
    // It is not the new daemon's child, yet its exit status is known: its supervisor
    // (`governor supervise`, its parent since the start) recorded it.
    assert_eq!(done.status, JobState::Failed, "{done:?}");
    assert!(done.message.contains("exited with status 3"), "{done:?}");
    let deadline = Instant::now() + Duration::from_secs(20);
    let ended = loop {
        if let Some(s) = follower.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "govctl logs -f did not end with the job; it printed:\n{}",
            followed.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    reader.join().unwrap();
    let followed = followed.lock().unwrap().clone();
    let whole = std::fs::read_to_string(out.join("survivor-j4.out")).unwrap();
    assert!(ended.success(), "{ended}: {followed}");
    assert_eq!(followed, whole, "followed output differs from the file");
    assert!(followed.ends_with("last\n"), "{followed}");
    wait_for(
        "the daemon to let survivor go",
        Duration::from_secs(10),
        &daemon,
        || daemon.job("survivor").is_none().then_some(()),
    );

    // A job that asked to end once converged (`govctl submit --finish`): its loss stops
    // improving, the node interrupts it, and the coordinator counts it completed although the
    // interrupted shell exits with 130. (The fake cgroup's `cgroup.procs` is a plain file:
    // the job writes its pid there itself, as the kernel would list it.)
    let plateau_log = dir.path().join("plateau.log");
    let script = format!(
        "echo $$ >> {}; i=0; while [ $i -lt 600 ]; do i=$((i+1)); echo \"step $i loss=0.5\" >> {}; sleep 0.1; done; exit 7",
        root.join("governor.slice/jobs/plateau-j5/cgroup.procs")
            .display(),
        plateau_log.display()
    );
    let mut plateau = JobSpec::new(
        "plateau",
        vec!["/bin/sh".into(), "-c".into(), script],
        plateau_log.display().to_string(),
    );
    plateau.metric = "loss".into();
    plateau
        .env
        .insert(governor_proto::job_env::FINISH.into(), "3:0.01".into());
    assert_eq!(rt.block_on(govctl.submit(plateau)).unwrap().id, "j5");
    let ended = wait_for(
        "plateau to be stopped at convergence",
        Duration::from_secs(40),
        &daemon,
        || {
            let j = job(&rt, &mut govctl, "j5");
            j.status.is_finished().then_some(j)
        },
    );
    assert_eq!(ended.status, JobState::Completed, "{ended:?}");
    assert!(ended.message.contains("stopped: converged"), "{ended:?}");

    // Two trials of one sweep (`govctl submit --sweep s:3:2`, Keras CSV logs with epochs),
    // judged by the coordinator as each reaches a rung (2, 6, 18 epochs), against the results
    // recorded there (ASHA), ranked by predicted final loss. The better trial logs faster, so
    // it is at each rung first; the worse one, flat at 0.9 against 0.1, is confidently worse
    // once it has enough epochs to extrapolate (6: two values at the first rung say nothing of
    // the end). The coordinator stops it, counts it completed and says why; the node does not
    // judge it itself. The better one runs its script to the end.
    let trial = |name: &str, id: &str, level: &str, rows: u32, pause: &str, status: u32| {
        let log = dir.path().join(format!("{name}.csv"));
        let script = format!(
            "echo $$ >> {}; echo epoch,loss > {log}; i=0; while [ $i -lt {rows} ]; do \
             echo \"$i,{level}\" >> {log}; i=$((i+1)); sleep {pause}; done; exit {status}",
            root.join(format!("governor.slice/jobs/{name}-{id}/cgroup.procs"))
                .display(),
            log = log.display()
        );
        let mut spec = JobSpec::new(
            name,
            vec!["/bin/sh".into(), "-c".into(), script],
            log.display().to_string(),
        );
        spec.metric = "loss".into();
        spec.env
            .insert(governor_proto::job_env::SWEEP.into(), "s:3:2".into());
        spec.env
            .insert(governor_proto::job_env::EPOCHS.into(), "600".into());
        spec
    };
    assert_eq!(
        rt.block_on(govctl.submit(trial("better", "j6", "0.1", 80, "0.05", 0)))
            .unwrap()
            .id,
        "j6"
    );
    assert_eq!(
        rt.block_on(govctl.submit(trial("worse", "j7", "0.9", 600, "0.2", 7)))
            .unwrap()
            .id,
        "j7"
    );
    let cut = wait_for(
        "the worse trial to be cut from its sweep",
        Duration::from_secs(40),
        &daemon,
        || {
            let j = job(&rt, &mut govctl, "j7");
            j.status.is_finished().then_some(j)
        },
    );
    assert_eq!(cut.status, JobState::Completed, "{cut:?}");
    assert!(
        cut.message
            .starts_with("stopped: outranked in its sweep at 6 epochs"),
        "cut by the coordinator at its second rung: {cut:?}"
    );
    let kept = wait_for(
        "the better trial to end by itself",
        Duration::from_secs(40),
        &daemon,
        || {
            let j = job(&rt, &mut govctl, "j6");
            j.status.is_finished().then_some(j)
        },
    );
    assert_eq!(kept.status, JobState::Completed, "{kept:?}");
    assert!(!kept.message.contains("outranked"), "{kept:?}");
    // The worse trial's process was interrupted long before its 600 rows.
    let rows = std::fs::read_to_string(dir.path().join("worse.csv"))
        .unwrap()
        .lines()
        .count();
    assert!(rows < 100, "the cut trial still ran: {rows} rows");

    // The coordinator goes away: the node keeps governing and says it is retrying.
    rt.block_on(server.kill());
    let line = wait_for(
        "status to say retrying",
        Duration::from_secs(20),
        &daemon,
        || {
            let line = coordinator_line(&daemon);
            line.contains("retrying").then_some(line)
        },
    );
    assert!(line.starts_with(&address), "{line}");
    let status = daemon.terminate();
    assert!(
        status.success(),
        "the daemon stops cleanly: {status}\n{}",
        daemon.log_tail()
    );
    drop(fake);
}

/// A node running SpeCon asks to move its converged job while two others still learn: the
/// request travels from the real policy through the daemon's report to the coordinator, which
/// shows it on the job (what `govctl jobs` and `govctl job` print), and the node's own status
/// names it too. Plain-text session (`--insecure`); the categorisation interval is shortened
/// from SpeCon's 30 s to 0.5 s (`--policy specon:interval=0.5`).
#[test]
fn a_specon_nodes_move_request_reaches_the_coordinator() {
    use governor_integration_tests::daemon::KerasLog;

    let dir = tempfile::tempdir().unwrap();
    let (rt, server, address, mut govctl) = plain_coordinator(dir.path());

    let root = dir.path().join("cgroup");
    std::fs::create_dir(&root).unwrap();
    let fake = FakeCgroupRoot::unified(&root);
    let mut daemon = Daemon::configure(
        "shortest-left",
        &format!(
            "cgroup_root = \"{}\"\n[discovery]\nenvironment = false\n",
            root.display()
        ),
    );
    let logs = dir.path().join("logs");
    let mut writers = Vec::new();
    for name in ["calm", "eager", "keen"] {
        fake.add_group(&format!("jobs/{name}"));
        let log = logs.join(format!("{name}.csv"));
        writers.push(KerasLog::create(&log));
        daemon.declare_job(
            name,
            &format!(
                "cgroup = \"/jobs/{name}\"\nlogs = [\"{}\"]\n",
                log.display()
            ),
        );
    }
    daemon.extra_args = vec![
        "--dry-run".into(),
        "--policy".into(),
        "specon:interval=0.5".into(),
        "--node-name".into(),
        "node-s".into(),
        "--coordinator".into(),
        address.clone(),
        "--insecure".into(),
    ];
    daemon.spawn();

    // `calm` converges: under 1% better per interval, and slower every interval. `eager` and
    // `keen` lose 39% of their loss per 0.5 s.
    let started = Instant::now();
    let asked = loop {
        let t = started.elapsed().as_secs_f64();
        writers[0].append(0.99 + 0.01 * (-t).exp());
        writers[1].append(10.0 * (-t).exp());
        writers[2].append(20.0 * (-t).exp());
        let jobs = rt.block_on(govctl.jobs(true)).expect("govctl jobs");
        if let Some(j) = jobs.iter().find(|j| j.move_request.is_some()) {
            break j.clone();
        }
        assert!(
            t < 30.0,
            "no move request reached the coordinator in 30 s; jobs: {jobs:#?}\nnode status: {:?}\nlog:\n{}",
            daemon.status_json(),
            daemon.log_tail()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(asked.name, "calm", "{asked:?}");
    assert!(asked.local, "a job the node found by itself: {asked:?}");
    // Each row is an epoch's end (Keras CSV): the node times the epochs as their rows arrive
    // (what it reports as the job's epoch time), here one row every 0.1 s and a govctl call.
    let loop_started = Instant::now();
    let mut rows = 0u32;
    let epoch_seconds = loop {
        let row_at = Instant::now();
        writers[1].append(0.01);
        rows += 1;
        if let Some(s) = daemon
            .job("eager")
            .and_then(|j| j["epoch_seconds"].as_f64())
        {
            break s;
        }
        assert!(
            row_at.duration_since(loop_started) < Duration::from_secs(10),
            "eager's epochs were never timed: {:?}",
            daemon.job("eager")
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let per_row = loop_started.elapsed().as_secs_f64() / f64::from(rows);
    assert!(
        epoch_seconds > 0.05 && epoch_seconds < 20.0 * per_row.max(0.2),
        "eager's epoch time {epoch_seconds} s against a row every {per_row:.2} s"
    );
    let request = asked.move_request.as_deref().unwrap();
    assert!(request.starts_with("node node-s asks: "), "{request}");
    let on_node = daemon.job("calm").expect("calm is governed");
    assert!(
        on_node["move_request"].is_string(),
        "the node's status names the request: {on_node}"
    );
    for other in ["eager", "keen"] {
        let j = daemon.job(other).unwrap();
        assert!(j.get("move_request").is_none(), "{j}");
    }
    assert!(
        daemon
            .log_text()
            .matches("the policy asks to move this job to another node")
            .count()
            == 1,
        "logged once: {}",
        daemon.log_tail()
    );
    let status = daemon.terminate();
    assert!(status.success(), "{}", daemon.log_tail());
    rt.block_on(server.kill());
    drop(fake);
}

/// The fence end to end: a job moved to the real daemon (from a stand-in node that saves it
/// when asked) runs there; the coordinator then goes away. Once the bound has passed since the
/// coordinator last acknowledged a report, the daemon asks the job to save (its declared
/// signal) and it exits saved: it would not run beside the copy the coordinator may start on
/// its source later.
#[test]
fn a_daemon_that_loses_the_coordinator_saves_and_stops_the_job_moved_to_it() {
    use governor::coordinator_client::{
        AgentConfig, NodeAgent, NodeCapacity, NodeCommand, NodeReport, RunState,
    };

    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let server: RunningServer = rt
        .block_on(server::start(ServerConfig {
            listen: "127.0.0.1:0".parse::<SocketAddr>().unwrap(),
            store: dir.path().join("coordinator.redb"),
            tls: None,
            policy: "first-fit".into(),
            // The fence: (2 + 4) / 2 = 3 s.
            state: StateConfig {
                lost_after_s: 2.0,
                lost_target_wait_s: 4.0,
                auto_move: false,
                ..StateConfig::default()
            }
            .into(),
            web: Default::default(),
        }))
        .expect("the coordinator starts");
    let address = server.addr.to_string();
    let mut govctl = rt
        .block_on(Client::connect(&address, None))
        .expect("govctl connects");

    // The source: a stand-in node that "runs" what it is told and saves it when asked.
    let (report_tx, report_rx) = tokio::sync::watch::channel(NodeReport::default());
    let (cmd_tx, cmd_rx) = tokio::sync::mpsc::channel::<NodeCommand>(16);
    let config = AgentConfig::new(&address, "node-a", NodeCapacity::cpu_only(4.0, 8 << 30));
    // Spawned on the runtime (it needs one), kept running for the whole test.
    let _guard = rt.enter();
    let _agent = NodeAgent::spawn(config, report_rx, cmd_tx);
    rt.spawn(governor_integration_tests::answer_starts_and_saves(
        cmd_rx,
        report_tx.clone(),
    ));
    poll_until(
        "node-a ready",
        Duration::from_secs(20),
        Duration::from_millis(100),
        || {
            let nodes = rt.block_on(govctl.nodes()).ok()?;
            (nodes.len() == 1).then_some(())
        },
        String::new,
    );
    // The job: saves to its checkpoint on SIGUSR1 and exits 0.
    let ckpt = dir.path().join("ckpt");
    let log = dir.path().join("train.log");
    let script = format!(
        "trap 'mkdir -p {c}; echo saved > {c}/step; exit 0' USR1; \
         while :; do echo 'loss=1.0' >> {l}; sleep 0.1; done",
        c = ckpt.display(),
        l = log.display()
    );
    let mut spec = JobSpec::new(
        "train",
        vec!["/bin/sh".into(), "-c".into(), script],
        log.display().to_string(),
    );
    spec.checkpoint = Some(governor_proto::node::Checkpoint {
        dir: ckpt.display().to_string(),
        save_signal: 10,
        carry: false,
        transparent: false,
    });
    let job = rt.block_on(govctl.submit(spec)).expect("submit");
    assert_eq!(job.members[0].node, "node-a");

    // The target: the real daemon.
    let root = dir.path().join("cgroup");
    std::fs::create_dir(&root).unwrap();
    let fake = FakeCgroupRoot::unified(&root);
    fake.add_group(&format!("governor.slice/jobs/train-{}", job.id));
    let out = dir.path().join("job-output");
    let mut daemon = Daemon::configure(
        "fair",
        &format!(
            "cgroup_root = \"{}\"\n[discovery]\nenvironment = false\n[coordinator]\nallow_root_jobs = true\njob_output_dir = \"{}\"\nstop_grace = \"2s\"\n",
            root.display(),
            out.display()
        ),
    );
    daemon.extra_args = vec![
        "--dry-run".into(),
        "--node-name".into(),
        "node-b".into(),
        "--coordinator".into(),
        address.clone(),
        "--insecure".into(),
    ];
    daemon.spawn();
    wait_for("node-b ready", Duration::from_secs(30), &daemon, || {
        let nodes = rt.block_on(govctl.nodes()).ok()?;
        let n = nodes.iter().find(|n| n.name == "node-b")?;
        (n.status == NodeState::Ready).then_some(())
    });
    // Only a running job moves: wait for the source's report of it.
    wait_for(
        "the job running on node-a",
        Duration::from_secs(30),
        &daemon,
        || {
            let j = rt.block_on(govctl.job(&job.id)).ok()?;
            let m = j.summary.members.first()?;
            (m.node == "node-a" && m.state == RunState::Running).then_some(())
        },
    );
    rt.block_on(govctl.move_job(&job.id, Some("node-b")))
        .expect("move to node-b");
    wait_for(
        "the job running on node-b",
        Duration::from_secs(30),
        &daemon,
        || {
            let j = rt.block_on(govctl.job(&job.id)).ok()?;
            let m = j.summary.members.first()?;
            (m.node == "node-b" && m.state == RunState::Running).then_some(())
        },
    );
    // Connected, the node never fences: longer than the bound, the job runs on.
    std::thread::sleep(Duration::from_secs(4));
    assert!(
        !ckpt.join("step").exists() && daemon.job("train").is_some(),
        "fenced while connected\n{}",
        daemon.log_tail()
    );

    // The coordinator dies. Its last heartbeats acknowledged reports sent a second or two
    // before: the fence (3 s after the last acknowledged one) is not due at once. (When exactly
    // it falls due is the loopback test's.)
    let killed = Instant::now();
    rt.block_on(server.kill());
    if killed.elapsed() < Duration::from_millis(500) {
        std::thread::sleep(Duration::from_millis(500).saturating_sub(killed.elapsed()));
        assert!(
            !ckpt.join("step").exists(),
            "saved within 0.5 s of the coordinator's death\n{}",
            daemon.log_tail()
        );
    }
    wait_for(
        "the daemon to fence the job: saved",
        Duration::from_secs(20),
        &daemon,
        || ckpt.join("step").exists().then_some(()),
    );
    // It exited: the daemon no longer governs it, and says why it stopped it.
    wait_for("the job gone", Duration::from_secs(10), &daemon, || {
        daemon.job("train").is_none().then_some(())
    });
    assert!(
        daemon.log_tail().contains("fencing a job"),
        "{}",
        daemon.log_tail()
    );
}

#[test]
#[ignore = "root-host: the node starts cluster jobs as uid 65534 (root); `cargo xtask test` runs it where it can"]
fn root_host_user_a_cluster_job_runs_as_its_user_and_root_only_where_the_node_allows_it() {
    use std::os::unix::fs::PermissionsExt;
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test starts jobs as another user: run it as root"
    );
    let dir = tempfile::tempdir().unwrap();
    // A directory `nobody` may write its log in (the test's own is root's, 0700).
    let shared = tempfile::Builder::new()
        .prefix("governor-user-job")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::set_permissions(shared.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let (rt, server, address, mut govctl) = plain_coordinator(dir.path());
    let root = dir.path().join("cgroup");
    std::fs::create_dir(&root).unwrap();
    let fake = FakeCgroupRoot::unified(&root);
    for group in ["mine-j1", "secret-j2", "as-root-j3", "stranger-j4"] {
        fake.add_group(&format!("governor.slice/jobs/{group}"));
    }
    let out = dir.path().join("job-output");
    // The default: no root jobs.
    let mut daemon = Daemon::configure(
        "shortest-left",
        &format!(
            "cgroup_root = \"{}\"\n[discovery]\nenvironment = false\n[coordinator]\njob_output_dir = \"{}\"\nstop_grace = \"2s\"\n",
            root.display(),
            out.display()
        ),
    );
    daemon.extra_args = vec![
        "--dry-run".into(),
        "--node-name".into(),
        "node-u".into(),
        "--coordinator".into(),
        address.clone(),
        "--insecure".into(),
    ];
    daemon.spawn();
    wait_for(
        "node-u to be ready",
        Duration::from_secs(30),
        &daemon,
        || {
            let nodes = rt.block_on(govctl.nodes()).ok()?;
            nodes
                .iter()
                .any(|n| n.name == "node-u" && n.status == NodeState::Ready)
                .then_some(())
        },
    );

    // A job for `nobody`: it runs with nobody's uid, gid and groups, and its log is read.
    let log = shared.path().join("mine.log");
    let script = format!(
        "id -u; id -g; id -G; i=0; l=4.0; while [ $i -lt 40 ]; do i=$((i+1)); \
         l=$(awk -v l=$l 'BEGIN {{ print l*0.9 }}'); echo \"step $i loss=$l\" >> {}; sleep 0.1; done",
        log.display()
    );
    let mut spec = JobSpec::new(
        "mine",
        vec!["/bin/sh".into(), "-c".into(), script],
        log.display().to_string(),
    );
    spec.metric = "loss".into();
    spec.user = "nobody".into();
    assert_eq!(rt.block_on(govctl.submit(spec)).unwrap().id, "j1");
    let seen = Instant::now();
    wait_for(
        "the coordinator to see mine's progress (its log read as nobody)",
        Duration::from_secs(20),
        &daemon,
        || {
            let detail = rt.block_on(govctl.job("j1")).ok()?;
            (!detail.progress.is_empty()).then_some(())
        },
    );
    let progress_after = seen.elapsed();

    // A job for `nobody` whose log it cannot read (root's, 0600 in a 0700 directory): the
    // daemon, root, reads it with nobody's rights, so never.
    let private = dir.path().join("private");
    std::fs::create_dir(&private).unwrap();
    let secret = private.join("secret.log");
    std::fs::write(
        &secret,
        "step 1 loss=3.0\nstep 2 loss=2.0\nstep 3 loss=1.0\n",
    )
    .unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let mut spec = JobSpec::new(
        "secret",
        vec!["/bin/sh".into(), "-c".into(), "sleep 4".into()],
        secret.display().to_string(),
    );
    spec.metric = "loss".into();
    spec.user = "nobody".into();
    assert_eq!(rt.block_on(govctl.submit(spec)).unwrap().id, "j2");
    wait_for("secret to run", Duration::from_secs(20), &daemon, || {
        (job(&rt, &mut govctl, "j2").status == JobState::Running).then_some(())
    });
    std::thread::sleep((progress_after * 3).max(Duration::from_secs(2)));
    let detail = rt.block_on(govctl.job("j2")).unwrap();
    assert!(
        detail.progress.is_empty() && detail.summary.progress.is_none(),
        "a log its user cannot read was read: {:?}",
        detail.progress
    );

    // Root (a submission naming no user) and a user the node does not have: refused.
    let mut as_root = JobSpec::new(
        "as-root",
        vec!["/bin/true".into()],
        shared.path().join("root.log").display().to_string(),
    );
    as_root.user = String::new();
    assert_eq!(rt.block_on(govctl.submit(as_root)).unwrap().id, "j3");
    let mut stranger = JobSpec::new(
        "stranger",
        vec!["/bin/true".into()],
        shared.path().join("stranger.log").display().to_string(),
    );
    stranger.user = "no-such-user-here".into();
    assert_eq!(rt.block_on(govctl.submit(stranger)).unwrap().id, "j4");
    for (id, reason) in [
        ("j3", "allow_root_jobs"),
        ("j4", "no user \"no-such-user-here\" on this node"),
    ] {
        let failed = wait_for("the refusal", Duration::from_secs(20), &daemon, || {
            let j = job(&rt, &mut govctl, id);
            j.status.is_finished().then_some(j)
        });
        assert_eq!(failed.status, JobState::Failed, "{failed:?}");
        assert!(failed.message.contains(reason), "{id}: {}", failed.message);
    }

    // mine ran as nobody (65534), with nobody's group and no other.
    let done = wait_for("mine to complete", Duration::from_secs(30), &daemon, || {
        let j = job(&rt, &mut govctl, "j1");
        j.status.is_finished().then_some(j)
    });
    assert_eq!(done.status, JobState::Completed, "{done:?}");
    let output = std::fs::read_to_string(out.join("mine-j1.out")).unwrap();
    let nobody = nix::unistd::User::from_name("nobody").unwrap().unwrap();
    let lines: Vec<&str> = output.lines().collect();
    assert_eq!(lines[0], nobody.uid.to_string(), "{output}");
    assert_eq!(lines[1], nobody.gid.to_string(), "{output}");
    assert!(
        !lines[2].split(' ').any(|g| g == "0"),
        "the job kept root's group: {output}"
    );
    rt.block_on(server.stop());
}
