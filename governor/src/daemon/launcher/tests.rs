//! The launcher on a fake cgroup root: starts, stops, bad commands, restarts.

use super::journal::{JOURNAL_VERSION, Journal};
use super::start::declared_epochs;
use super::*;
use crate::cgroup::CgroupFs;
use crate::cgroup::fake::FakeCgroupRoot;
use crate::coordinator_client::{SaveJob, StopJob};

#[test]
fn declared_epochs_must_be_a_positive_number() {
    let env = |v: &str| BTreeMap::from([("GOVERNOR_EPOCHS".to_owned(), v.to_owned())]);
    assert_eq!(declared_epochs(&env("12")), Some(12.0));
    assert_eq!(declared_epochs(&env(" 2.5 ")), Some(2.5));
    for bad in ["0", "-3", "NaN", "inf", "many", ""] {
        assert_eq!(declared_epochs(&env(bad)), None, "{bad:?}");
    }
    assert_eq!(declared_epochs(&BTreeMap::new()), None);
}

#[test]
fn group_names_are_safe_and_distinct_per_job() {
    assert_eq!(group_name("resnet", "j1", 0, 1), "resnet-j1");
    assert_eq!(
        group_name("bert finetune/v2", "j12", 0, 1),
        "bert-finetune-v2-j12"
    );
    assert_eq!(group_name("ddp", "j3", 2, 4), "ddp-j3-r2");
    assert_eq!(group_name("..", "", 0, 1), "job");
    assert_eq!(group_name("", "j4", 0, 1), "job-j4");
    assert_eq!(group_name("cpu.max", "j5", 0, 1), "job-cpu.max-j5");
    for name in [
        group_name(&"x".repeat(300), &"y".repeat(300), 7, 8),
        group_name("cgroup.procs", "j1", 0, 1),
        group_name("memory.high", "j1", 0, 1),
    ] {
        crate::cgroup::jobs::validate_job_name(&name).unwrap_or_else(|e| panic!("{name:?}: {e}"));
    }
}

// ---- the launcher, on a fake cgroup root ------------------------------------------------

struct Bed {
    dir: tempfile::TempDir,
    fake: FakeCgroupRoot,
    fs: CgroupFs,
    launcher: Launcher,
    exits: mpsc::UnboundedReceiver<JobExit>,
}

fn bed(stop_grace: Duration) -> Bed {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("cgroup");
    std::fs::create_dir(&root).unwrap();
    let fake = FakeCgroupRoot::unified(&root);
    let fs = CgroupFs::detect(&root).unwrap();
    let (launcher, exits) = Launcher::new(LauncherConfig {
        subtree: "governor.slice/jobs".into(),
        output_dir: dir.path().join("out"),
        gpus: [0, 1].into_iter().collect(),
        stop_grace,
        finished_retention: Duration::from_secs(60),
        journal: Some(dir.path().join("run/coordinator-jobs.json")),
        supervisor: None,
        criu: None,
        allow_root_jobs: true,
    });
    Bed {
        dir,
        fake,
        fs,
        launcher,
        exits,
    }
}

fn start_job(id: &str, name: &str, script: &str) -> StartJob {
    StartJob {
        job_id: id.into(),
        replica: 0,
        replicas: 1,
        name: name.into(),
        argv: vec!["/bin/sh".into(), "-c".into(), script.into()],
        log_path: "/tmp/train.log".into(),
        metric: "loss".into(),
        maximise: false,
        gpu_indices: Vec::new(),
        priority: 0,
        env: [("GOVERNOR_JOB_ID".to_owned(), id.to_owned())].into(),
        cores: None,
        memory_bytes: None,
        checkpoint: None,
        attempt: 0,
        carried_checkpoint: false,
        user: String::new(),
    }
}

impl Bed {
    /// The kernel creates a group's files on mkdir; on a fake root the test does.
    fn prepare_group(&self, group: &str) {
        self.fake.add_group(&format!("governor.slice/jobs/{group}"));
    }
    fn state(&self, id: &str) -> CoordinatorJob {
        self.launcher
            .jobs()
            .find(|j| j.job_id == id)
            .unwrap_or_else(|| panic!("{id} is not reported"))
            .clone()
    }
    /// The daemon stops (the jobs run on) and starts again with the same configuration.
    fn restart(&mut self) {
        let config = self.launcher.config.clone();
        let (launcher, exits) = Launcher::new(config);
        self.launcher = launcher;
        self.exits = exits;
    }
    fn journal(&self) -> Journal {
        let path = self.dir.path().join("run/coordinator-jobs.json");
        serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
    }
    async fn next_exit(&mut self) -> JobExit {
        tokio::time::timeout(Duration::from_secs(20), self.exits.recv())
            .await
            .expect("the job did not end within 20 s")
            .expect("the exit channel is open")
    }
}

#[tokio::test]
async fn a_started_job_runs_in_its_cgroup_and_reports_its_exit_status() {
    let mut bed = bed(Duration::from_secs(5));
    bed.prepare_group("resnet-j1");
    let mut s = start_job(
        "j1",
        "resnet",
        "echo \"id=$GOVERNOR_JOB_ID log=$GOVERNOR_LOG gpus=$CUDA_VISIBLE_DEVICES\"; echo oops >&2; exit 3",
    );
    s.gpu_indices = vec![1, 0];
    s.env.insert("GOVERNOR_EPOCHS".into(), "48".into());
    let started = match bed.launcher.start(&bed.fs, s.clone()) {
        StartOutcome::Started(started) => started,
        other => panic!("not started: {other:?}"),
    };
    assert_eq!(started.adopt.cgroup, "/governor.slice/jobs/resnet-j1");
    assert_eq!(started.adopt.logs, vec!["/tmp/train.log".to_owned()]);
    assert_eq!(started.adopt.metric.as_deref(), Some("loss"));
    assert_eq!(started.adopt.epochs, Some(48.0), "govctl submit --epochs");
    assert!(started.adopt.pid > 0);
    let job = bed.state("j1");
    assert_eq!(job.state, RunState::Running);
    assert_eq!(
        job.cgroup.as_deref(),
        Some("/governor.slice/jobs/resnet-j1")
    );
    assert_eq!(
        bed.fake
            .get("governor.slice/jobs/resnet-j1", "cgroup.procs"),
        "0",
        "the job joined its cgroup before exec"
    );
    assert!(
        matches!(bed.launcher.start(&bed.fs, s), StartOutcome::Duplicate),
        "a resent start is ignored"
    );

    let exit = bed.next_exit().await;
    let group = bed.launcher.on_exit(&bed.fs, exit, Instant::now());
    assert_eq!(
        group.map(|g| g.to_string()).as_deref(),
        Some("/governor.slice/jobs/resnet-j1")
    );
    let job = bed.state("j1");
    assert_eq!((job.state, job.exit_code), (RunState::Exited, Some(3)));
    let output = std::fs::read_to_string(bed.dir.path().join("out/resnet-j1.out")).unwrap();
    assert_eq!(
        output, "id=j1 log=/tmp/train.log gpus=1,0\noops\n",
        "stdout and stderr go to the output file; CUDA_VISIBLE_DEVICES lists the reserved GPUs"
    );
    assert!(
        !bed.fake
            .root()
            .join("governor.slice/jobs/resnet-j1")
            .exists(),
        "the ended job's cgroup is removed"
    );
    // It stays in the reports for the retention period, then goes.
    bed.launcher
        .poll(&bed.fs, Instant::now() + Duration::from_secs(59));
    assert_eq!(bed.launcher.jobs().count(), 1);
    bed.launcher
        .poll(&bed.fs, Instant::now() + Duration::from_secs(61));
    assert_eq!(bed.launcher.jobs().count(), 0);
}

#[tokio::test]
async fn a_root_job_is_refused_unless_the_node_allows_it_and_an_unknown_user_is_named() {
    let mut bed = bed(Duration::from_secs(5));
    bed.launcher.config.allow_root_jobs = false;
    for (id, user) in [("j1", ""), ("j2", "root")] {
        let mut s = start_job(id, "as-root", "true");
        s.user = user.into();
        match bed.launcher.start(&bed.fs, s) {
            StartOutcome::Failed(reason) => assert!(
                reason.contains("runs as root (root), which this node refuses")
                    && reason.contains("allow_root_jobs = true"),
                "{reason}"
            ),
            other => panic!("{other:?}"),
        }
        assert_eq!(bed.state(id).state, RunState::Failed);
    }
    let mut s = start_job("j3", "stranger", "true");
    s.user = "no-such-user-here".into();
    match bed.launcher.start(&bed.fs, s) {
        StartOutcome::Failed(reason) => assert!(
            reason.contains("cannot run it as \"no-such-user-here\": no user"),
            "{reason}"
        ),
        other => panic!("{other:?}"),
    }
    assert!(
        !bed.fake
            .root()
            .join("governor.slice/jobs/as-root-j1")
            .exists(),
        "nothing is made for a refused job"
    );
    // Allowed, root runs.
    bed.launcher.config.allow_root_jobs = true;
    bed.prepare_group("as-root-j4");
    let s = start_job("j4", "as-root", "true");
    assert!(matches!(
        bed.launcher.start(&bed.fs, s),
        StartOutcome::Started(_)
    ));
}

#[tokio::test]
async fn bad_starts_are_reported_failed_and_leave_nothing_behind() {
    let mut bed = bed(Duration::from_secs(5));
    let mut s = start_job("j2", "needs-gpu", "true");
    s.gpu_indices = vec![7];
    match bed.launcher.start(&bed.fs, s) {
        StartOutcome::Failed(reason) => {
            assert!(reason.contains("GPU 7 does not exist"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    let job = bed.state("j2");
    assert_eq!(job.state, RunState::Failed);
    assert!(job.message.contains("GPU 7"), "{}", job.message);
    assert!(
        !bed.fake
            .root()
            .join("governor.slice/jobs/needs-gpu-j2")
            .exists()
    );

    bed.prepare_group("missing-j3");
    let mut s = start_job("j3", "missing", "");
    s.argv = vec!["/nonexistent/train".into()];
    match bed.launcher.start(&bed.fs, s) {
        StartOutcome::Failed(reason) => {
            assert!(
                reason.contains("cannot start \"/nonexistent/train\""),
                "{reason}"
            )
        }
        other => panic!("{other:?}"),
    }
    assert!(
        !bed.fake
            .root()
            .join("governor.slice/jobs/missing-j3")
            .exists(),
        "the cgroup made for a job that could not start is removed"
    );
    assert!(
        bed.journal().jobs.is_empty(),
        "its entry, written before the spawn, is gone with it"
    );

    let mut s = start_job("j4", "relative", "true");
    s.log_path = "train.log".into();
    assert!(
        matches!(bed.launcher.start(&bed.fs, s), StartOutcome::Failed(r) if r.contains("not absolute"))
    );
    let mut s = start_job("j5", "empty", "true");
    s.argv.clear();
    assert!(
        matches!(bed.launcher.start(&bed.fs, s), StartOutcome::Failed(r) if r.contains("argv is empty"))
    );

    // Stopping a job that is not here is not an error.
    let stop = StopJob {
        job_id: "j404".into(),
        reason: "cancelled".into(),
    };
    assert_eq!(bed.launcher.stop(&bed.fs, &stop, Instant::now()), 0);
    assert!(bed.exits.try_recv().is_err(), "nothing ran");
}

#[tokio::test]
async fn stop_terminates_the_job_and_kills_it_after_the_grace_period() {
    let mut bed = bed(Duration::from_millis(300));
    bed.prepare_group("polite-j1");
    bed.prepare_group("stubborn-j2");
    let polite = start_job("j1", "polite", "exec sleep 30");
    // Ignores SIGTERM: only SIGKILL after the grace period ends it.
    let stubborn = start_job(
        "j2",
        "stubborn",
        "trap '' TERM; while :; do sleep 0.05; done",
    );
    for s in [polite, stubborn] {
        assert!(matches!(
            bed.launcher.start(&bed.fs, s),
            StartOutcome::Started(_)
        ));
    }
    // Let the shell install its trap.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let t0 = Instant::now();
    for id in ["j1", "j2"] {
        let stop = StopJob {
            job_id: id.into(),
            reason: "cancelled by admin".into(),
        };
        assert_eq!(bed.launcher.stop(&bed.fs, &stop, t0), 1);
    }
    assert_eq!(
        bed.launcher.next_deadline(),
        Some(t0 + Duration::from_millis(300))
    );
    let exit = bed.next_exit().await;
    assert_eq!(exit.job_id, "j1", "SIGTERM ends the polite job at once");
    bed.launcher.on_exit(&bed.fs, exit, Instant::now());
    let j1 = bed.state("j1");
    assert_eq!(j1.state, RunState::Failed);
    assert!(j1.message.contains("cancelled by admin"), "{}", j1.message);

    tokio::time::sleep(Duration::from_millis(350)).await;
    assert!(
        bed.exits.try_recv().is_err(),
        "the stubborn job survived SIGTERM"
    );
    bed.launcher.poll(&bed.fs, Instant::now());
    let exit = bed.next_exit().await;
    assert_eq!(exit.job_id, "j2");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        exit.status.as_ref().unwrap().unwrap().signal(),
        Some(libc::SIGKILL)
    );
    bed.launcher.on_exit(&bed.fs, exit, Instant::now());
    assert_eq!(bed.state("j2").state, RunState::Failed);
    assert_eq!(bed.launcher.next_deadline(), None);
}

#[tokio::test]
async fn a_restarted_daemon_takes_back_the_running_jobs_and_reports_the_ended_ones() {
    let mut bed = bed(Duration::from_secs(5));
    bed.prepare_group("long-j1");
    bed.prepare_group("short-j2");
    let mut long = start_job("j1", "long", "exec sleep 60");
    long.gpu_indices = vec![1];
    long.priority = 3;
    let StartOutcome::Started(started) = bed.launcher.start(&bed.fs, long.clone()) else {
        panic!("long did not start")
    };
    let long_pid = started.adopt.pid;
    let short = start_job("j2", "short", "sleep 0.3");
    assert!(matches!(
        bed.launcher.start(&bed.fs, short),
        StartOutcome::Started(_)
    ));
    let recorded: Vec<String> = bed
        .journal()
        .jobs
        .iter()
        .map(|e| e.job_id.clone())
        .collect();
    assert_eq!(recorded, ["j1", "j2"]);

    // The daemon goes away; `short` ends while it is away (its old waiting task reaps it).
    bed.restart();
    tokio::time::sleep(Duration::from_millis(600)).await;

    let resumed = bed.launcher.recover(&bed.fs, Instant::now());
    assert_eq!(resumed.len(), 1, "{resumed:?}");
    assert_eq!(resumed[0].job_id, "j1");
    assert_eq!(resumed[0].adopt, started.adopt, "governed as before");
    assert_eq!(resumed[0].priority, 3);
    let j1 = bed.state("j1");
    assert_eq!(j1.state, RunState::Running);
    assert_eq!(j1.cgroup.as_deref(), Some("/governor.slice/jobs/long-j1"));
    assert_eq!(j1.gpu_indices, vec![1]);
    let j2 = bed.state("j2");
    assert_eq!((j2.state, j2.exit_code), (RunState::Exited, None));
    assert!(j2.message.contains("exit status is unknown"), "{j2:?}");
    let recorded: Vec<String> = bed
        .journal()
        .jobs
        .iter()
        .map(|e| e.job_id.clone())
        .collect();
    assert_eq!(recorded, ["j1"], "only the running job stays recorded");
    assert!(
        matches!(bed.launcher.start(&bed.fs, long), StartOutcome::Duplicate),
        "the coordinator's resent start does not start it twice"
    );

    // The coordinator cancels it: the signal goes through the pidfd, the end is noticed.
    let stop = StopJob {
        job_id: "j1".into(),
        reason: "cancelled".into(),
    };
    assert_eq!(bed.launcher.stop(&bed.fs, &stop, Instant::now()), 1);
    let exit = bed.next_exit().await;
    assert_eq!((exit.job_id.as_str(), exit.replica), ("j1", 0));
    assert!(matches!(exit.status, Ok(None)), "{:?}", exit.status);
    bed.launcher.on_exit(&bed.fs, exit, Instant::now());
    let j1 = bed.state("j1");
    assert_eq!(j1.state, RunState::Failed);
    assert!(j1.message.contains("cancelled"), "{j1:?}");
    assert!(bed.journal().jobs.is_empty());
    assert!(
        crate::sys::process_start_ticks(long_pid).is_none()
            || std::fs::read_to_string(format!("/proc/{long_pid}/stat"))
                .is_ok_and(|s| s.contains(") Z ")),
        "the job's process is gone"
    );
}

#[tokio::test]
async fn a_journal_that_names_a_reused_pid_or_is_garbage_starts_nothing_and_keeps_the_daemon_up() {
    let mut bed = bed(Duration::from_secs(5));
    let path = bed.dir.path().join("run/coordinator-jobs.json");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    // This very test process under the job's pid, but with another start: a reused pid.
    let me = std::process::id();
    let entry = JournalEntry {
        job_id: "j7".into(),
        replica: 0,
        name: "old".into(),
        gpu_indices: Vec::new(),
        message: String::new(),
        adopt: AdoptJob {
            finish: None,
            sweep: None,
            name: "old".into(),
            cgroup: "/governor.slice/jobs/old-j7".into(),
            logs: vec!["/tmp/old.log".into()],
            metric: None,
            format: None,
            pid: me,
            epochs: None,
        },
        maximise: false,
        priority: 0,
        start_ticks: crate::sys::process_start_ticks(me).map(|t| t + 1),
        exit_file: None,
        attempt: 0,
        save_signal: None,
        bundle: None,
        log_dir: None,
        checkpoint_dir: None,
        owner: None,
        completion_witness: None,
    };
    let journal = Journal {
        version: JOURNAL_VERSION,
        jobs: vec![entry],
    };
    std::fs::write(&path, serde_json::to_vec(&journal).unwrap()).unwrap();
    assert!(bed.launcher.recover(&bed.fs, Instant::now()).is_empty());
    assert_eq!(bed.state("j7").state, RunState::Exited);

    bed.restart();
    std::fs::write(&path, b"{ not json").unwrap();
    assert!(bed.launcher.recover(&bed.fs, Instant::now()).is_empty());
    assert!(path.with_extension("json.bad").exists(), "set aside");
    assert_eq!(bed.launcher.jobs().count(), 0);
    // Nothing recorded: a later start writes a fresh journal.
    bed.prepare_group("next-j8");
    assert!(matches!(
        bed.launcher
            .start(&bed.fs, start_job("j8", "next", "sleep 0.1")),
        StartOutcome::Started(_)
    ));
    assert_eq!(bed.journal().jobs.len(), 1);
    let exit = bed.next_exit().await;
    bed.launcher.on_exit(&bed.fs, exit, Instant::now());
}

fn journal_entry(id: &str, pid: u32, start_ticks: Option<u64>, exit_file: &Path) -> JournalEntry {
    JournalEntry {
        job_id: id.into(),
        replica: 0,
        name: format!("job-{id}"),
        gpu_indices: Vec::new(),
        message: String::new(),
        adopt: AdoptJob {
            finish: None,
            sweep: None,
            name: format!("job-{id}"),
            cgroup: format!("/governor.slice/jobs/job-{id}"),
            logs: vec!["/tmp/train.log".into()],
            metric: None,
            format: None,
            pid,
            epochs: None,
        },
        maximise: false,
        priority: 0,
        start_ticks,
        exit_file: Some(exit_file.to_owned()),
        attempt: 0,
        save_signal: None,
        bundle: None,
        log_dir: None,
        checkpoint_dir: None,
        owner: None,
        completion_witness: None,
    }
}

/// A framework checkpoint in `dir`, saved on SIGUSR1.
fn saves_to(dir: &Path) -> governor_proto::node::Checkpoint {
    governor_proto::node::Checkpoint {
        dir: dir.display().to_string(),
        save_signal: 10,
        carry: false,
        transparent: false,
    }
}

#[tokio::test]
async fn a_job_asked_to_save_gets_its_signal_exits_saved_and_a_newer_start_runs_it_again() {
    let mut bed = bed(Duration::from_secs(5));
    bed.prepare_group("vae-j4");
    // A framework that saves on SIGUSR1 at the end of its step and exits 0.
    let ckpt = bed.dir.path().join("ckpt");
    let mut s = start_job(
        "j4",
        "vae",
        &format!(
            "trap 'mkdir -p {d}; echo 7 > {d}/step; echo saved; exit 0' USR1; echo running; while :; do sleep 0.05; done",
            d = ckpt.display()
        ),
    );
    s.checkpoint = Some(saves_to(&ckpt));
    assert!(matches!(
        bed.launcher.start(&bed.fs, s.clone()),
        StartOutcome::Started(_)
    ));
    // Let the shell set its trap first.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let save = SaveJob {
        job_id: "j4".into(),
        reason: "govctl move".into(),
    };
    assert_eq!(bed.launcher.save(&bed.fs, &save), SaveAction::Signalled);
    assert_eq!(
        bed.launcher.save(&bed.fs, &save),
        SaveAction::Nothing,
        "a resent save is not sent twice"
    );
    assert!(bed.state("j4").message.contains("saving for a move"));
    let exit = bed.next_exit().await;
    bed.launcher.on_exit(&bed.fs, exit, Instant::now());
    let job = bed.state("j4");
    assert_eq!(
        (job.state, job.exit_code, job.saved),
        (RunState::Exited, Some(0), true)
    );
    let output = std::fs::read_to_string(bed.dir.path().join("out/vae-j4.out")).unwrap();
    assert_eq!(output, "running\nsaved\n");

    // The same start again is a resend; a newer attempt (moved back here) runs it again.
    assert!(matches!(
        bed.launcher.start(&bed.fs, s.clone()),
        StartOutcome::Duplicate
    ));
    bed.launcher.poll(&bed.fs, Instant::now());
    bed.prepare_group("vae-j4");
    s.attempt = 2;
    s.argv = vec!["/bin/sh".into(), "-c".into(), "echo resumed".into()];
    assert!(matches!(
        bed.launcher.start(&bed.fs, s),
        StartOutcome::Started(_)
    ));
    let job = bed.state("j4");
    assert_eq!(
        (job.state, job.attempt, job.saved),
        (RunState::Running, 2, false)
    );
    let exit = bed.next_exit().await;
    bed.launcher.on_exit(&bed.fs, exit, Instant::now());
    assert_eq!(bed.state("j4").exit_code, Some(0));
}

/// A job that ends its last epoch as the save signal comes exits 0 without saving: that is its
/// own end (the coordinator completes it), not a save to start again from an older checkpoint.
#[tokio::test]
async fn a_job_that_ends_on_its_own_while_asked_to_save_is_not_saved() {
    let mut bed = bed(Duration::from_secs(5));
    let ckpt = bed.dir.path().join("ckpt");
    std::fs::create_dir_all(&ckpt).unwrap();
    std::fs::write(ckpt.join("step"), "3\n").unwrap();
    for (id, removes) in [("j6", false), ("j7", true)] {
        bed.prepare_group(&format!("last-{id}"));
        // It finishes its last step whatever the signal says; j7 removes its backup at the end
        // (Keras' BackupAndRestore does).
        let end = if removes {
            format!("rm -rf {}", ckpt.display())
        } else {
            "true".to_owned()
        };
        let mut s = start_job(
            id,
            "last",
            &format!("trap 'echo asked' USR1; echo running; sleep 0.5; {end}; exit 0"),
        );
        s.checkpoint = Some(saves_to(&ckpt));
        assert!(matches!(
            bed.launcher.start(&bed.fs, s),
            StartOutcome::Started(_)
        ));
        tokio::time::sleep(Duration::from_millis(200)).await;
        let save = SaveJob {
            job_id: id.into(),
            reason: "resize".into(),
        };
        assert_eq!(bed.launcher.save(&bed.fs, &save), SaveAction::Signalled);
        let exit = bed.next_exit().await;
        bed.launcher.on_exit(&bed.fs, exit, Instant::now());
        let job = bed.state(id);
        assert_eq!(
            (job.state, job.exit_code, job.saved),
            (RunState::Exited, Some(0), false),
            "{id}: {}",
            job.message
        );
        assert!(
            job.message.contains("ended on its own while asked to save"),
            "{}",
            job.message
        );
    }
}

/// A job that has no handler for the save signal when it comes (before its program set one,
/// or in its exit after its last epoch) dies of it: its last checkpoint resumes it, as a save
/// would; it is not reported failed (which would lose the job).
#[tokio::test]
async fn a_job_killed_by_its_save_signal_is_resumed_from_its_checkpoint_not_failed() {
    let mut bed = bed(Duration::from_secs(5));
    let ckpt = bed.dir.path().join("ckpt");
    std::fs::create_dir_all(&ckpt).unwrap();
    std::fs::write(ckpt.join("step"), "9\n").unwrap();
    bed.prepare_group("nohandler-j8");
    // `exec` makes the loop's shell the main process, with SIGUSR1's default action.
    let mut s = start_job(
        "j8",
        "nohandler",
        "echo running; exec /bin/sh -c 'while :; do sleep 0.05; done'",
    );
    s.checkpoint = Some(saves_to(&ckpt));
    assert!(matches!(
        bed.launcher.start(&bed.fs, s),
        StartOutcome::Started(_)
    ));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let save = SaveJob {
        job_id: "j8".into(),
        reason: "specon".into(),
    };
    assert_eq!(bed.launcher.save(&bed.fs, &save), SaveAction::Signalled);
    let exit = bed.next_exit().await;
    bed.launcher.on_exit(&bed.fs, exit, Instant::now());
    let job = bed.state("j8");
    assert_eq!(
        (job.state, job.exit_code, job.saved),
        (RunState::Exited, None, true),
        "{}",
        job.message
    );
    assert!(
        job.message.contains("killed by its save signal"),
        "{}",
        job.message
    );
}

#[tokio::test]
async fn a_save_for_a_job_without_a_checkpoint_is_refused_and_the_job_runs_on() {
    let mut bed = bed(Duration::from_secs(5));
    bed.prepare_group("plain-j5");
    assert!(matches!(
        bed.launcher
            .start(&bed.fs, start_job("j5", "plain", "sleep 0.5")),
        StartOutcome::Started(_)
    ));
    let save = SaveJob {
        job_id: "j5".into(),
        reason: "x".into(),
    };
    assert_eq!(bed.launcher.save(&bed.fs, &save), SaveAction::Nothing);
    assert_eq!(bed.state("j5").state, RunState::Running);
    let exit = bed.next_exit().await;
    bed.launcher.on_exit(&bed.fs, exit, Instant::now());
    let job = bed.state("j5");
    assert_eq!(
        (job.state, job.exit_code, job.saved),
        (RunState::Exited, Some(0), false)
    );
}

/// The supervisor's records (written here by hand; `governor supervise` itself is tested
/// through the binary in governor/tests/supervise.rs and the daemon in tests/cluster_daemon.rs)
/// give a recovered job's real end: after it ended while no daemon ran, and when it ends
/// under the restarted daemon, which is not its parent.
#[tokio::test]
async fn a_restarted_daemon_reports_the_exit_status_its_supervisor_recorded() {
    use crate::supervise::ExitRecord;
    let mut bed = bed(Duration::from_secs(5));
    let out = bed.dir.path().join("out");
    std::fs::create_dir_all(&out).unwrap();
    let me = std::process::id();
    let reused = crate::sys::process_start_ticks(me).map(|t| t + 1);
    let (ended, failed, running) = (
        out.join("job-j1.exit"),
        out.join("job-j2.exit"),
        out.join("job-j3.exit"),
    );
    ExitRecord {
        code: Some(3),
        ..ExitRecord::default()
    }
    .write(&ended)
    .unwrap();
    ExitRecord {
        code: Some(127),
        signal: None,
        error: Some("cannot start /opt/missing: No such file or directory".into()),
    }
    .write(&failed)
    .unwrap();
    let precious = out.join("precious.txt");
    std::fs::write(&precious, "not a record").unwrap();
    let mut sleeper = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    let journal = Journal {
        version: JOURNAL_VERSION,
        jobs: vec![
            journal_entry("j1", me, reused, &ended),
            journal_entry("j2", me, reused, &failed),
            // A damaged journal naming a file that is not a record: kept, status unknown.
            journal_entry("j4", me, reused, &precious),
            journal_entry(
                "j3",
                sleeper.id(),
                crate::sys::process_start_ticks(sleeper.id()),
                &running,
            ),
        ],
    };
    let path = bed.dir.path().join("run/coordinator-jobs.json");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, serde_json::to_vec(&journal).unwrap()).unwrap();

    let resumed = bed.launcher.recover(&bed.fs, Instant::now());
    assert_eq!(resumed.len(), 1);
    let j1 = bed.state("j1");
    assert_eq!(
        (j1.state, j1.exit_code),
        (RunState::Exited, Some(3)),
        "{j1:?}"
    );
    assert!(!j1.message.contains("unknown"), "{j1:?}");
    let j2 = bed.state("j2");
    assert_eq!(
        (j2.state, j2.exit_code),
        (RunState::Failed, Some(127)),
        "{j2:?}"
    );
    assert!(j2.message.contains("/opt/missing"), "{j2:?}");
    assert!(
        !ended.exists() && !failed.exists(),
        "records are removed once read"
    );

    // j3 runs on; it is killed by a signal, which its supervisor records.
    assert_eq!(bed.state("j3").state, RunState::Running);
    ExitRecord {
        signal: Some(libc::SIGTERM),
        ..ExitRecord::default()
    }
    .write(&running)
    .unwrap();
    sleeper.kill().unwrap();
    let _ = sleeper.wait();
    let exit = bed.next_exit().await;
    assert!(
        matches!(exit.status, Ok(None)),
        "not our child: {:?}",
        exit.status
    );
    bed.launcher.on_exit(&bed.fs, exit, Instant::now());
    let j3 = bed.state("j3");
    assert_eq!(j3.exit_code, Some(128 + libc::SIGTERM), "{j3:?}");
    assert!(j3.message.contains("signal 15"), "{j3:?}");
    assert!(!running.exists());
}

#[tokio::test]
async fn a_start_under_way_when_the_daemon_died_is_found_in_its_cgroup_or_runs_again() {
    use crate::supervise::ExitRecord;
    use std::io::BufRead;
    let mut bed = bed(Duration::from_secs(5));
    // A started job with a child (its main process, as a supervisor would be, and the program).
    let mut main = std::process::Command::new("sh")
        .args(["-c", "sleep 60 & echo $!; wait"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(main.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let child: u32 = line.trim().parse().unwrap();
    let out = bed.dir.path().join("out");
    std::fs::create_dir_all(&out).unwrap();
    // Written before their spawns (pid 0): the daemon died before the entries with the pids.
    let spawned = journal_entry("j1", 0, None, &out.join("job-j1.exit"));
    let ended = journal_entry("j2", 0, None, &out.join("job-j2.exit"));
    let never = journal_entry("j3", 0, None, &out.join("job-j3.exit"));
    for id in ["j1", "j2", "j3"] {
        bed.prepare_group(&format!("job-{id}"));
    }
    // The kernel lists a group's processes; on the fake root the test does (child first).
    let procs = bed
        .fake
        .root()
        .join("governor.slice/jobs/job-j1/cgroup.procs");
    std::fs::write(&procs, format!("{child}\n{}\n", main.id())).unwrap();
    ExitRecord {
        code: Some(0),
        ..ExitRecord::default()
    }
    .write(&out.join("job-j2.exit"))
    .unwrap();
    let path = bed.dir.path().join("run/coordinator-jobs.json");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let journal = Journal {
        version: JOURNAL_VERSION,
        jobs: vec![spawned, ended, never],
    };
    std::fs::write(&path, serde_json::to_vec(&journal).unwrap()).unwrap();

    let resumed = bed.launcher.recover(&bed.fs, Instant::now());
    assert_eq!(resumed.len(), 1, "{resumed:?}");
    assert_eq!(resumed[0].job_id, "j1");
    assert_eq!(resumed[0].adopt.pid, main.id(), "the group's main process");
    assert_eq!(bed.state("j1").state, RunState::Running);
    let j2 = bed.state("j2");
    assert_eq!(
        (j2.state, j2.exit_code),
        (RunState::Exited, Some(0)),
        "{j2:?}"
    );
    assert!(
        bed.launcher.jobs().all(|j| j.job_id != "j3"),
        "a start that never ran is forgotten"
    );
    assert!(
        !bed.fake.root().join("governor.slice/jobs/job-j3").exists(),
        "with its empty cgroup"
    );
    let entries: Vec<(String, u32)> = bed
        .journal()
        .jobs
        .iter()
        .map(|e| (e.job_id.clone(), e.adopt.pid))
        .collect();
    assert_eq!(
        entries,
        [("j1".to_owned(), main.id())],
        "recorded with its pid now"
    );
    // The coordinator's resends: j1 runs already, j3 starts.
    assert!(matches!(
        bed.launcher
            .start(&bed.fs, start_job("j1", "job-j1", "true")),
        StartOutcome::Duplicate
    ));
    bed.prepare_group("job-j3-j3");
    assert!(matches!(
        bed.launcher
            .start(&bed.fs, start_job("j3", "job-j3", "sleep 0.1")),
        StartOutcome::Started(_)
    ));
    let exit = bed.next_exit().await;
    assert_eq!(exit.job_id, "j3");
    bed.launcher.on_exit(&bed.fs, exit, Instant::now());

    // The job's main process ends: noticed through its pidfd.
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
    main.kill().unwrap();
    let _ = main.wait();
    let exit = bed.next_exit().await;
    assert_eq!(exit.job_id, "j1");
}

#[tokio::test]
async fn the_end_of_a_job_under_a_criu_dump_is_held_and_is_a_save_only_if_the_dump_succeeded() {
    for dump_ok in [true, false] {
        let mut bed = bed(Duration::from_secs(5));
        bed.prepare_group("plain-j6");
        assert!(matches!(
            bed.launcher
                .start(&bed.fs, start_job("j6", "plain", "sleep 0.3; kill -9 $$")),
            StartOutcome::Started(_)
        ));
        // As `save` leaves a transparent job (the dump itself needs root and criu: VM bed).
        let l = bed.launcher.jobs.get_mut(&("j6".to_owned(), 0)).unwrap();
        l.saving = true;
        l.dump = Dump::InFlight;
        // CRIU kills the tree when its dump is complete: the end arrives first and is held.
        let exit = bed.next_exit().await;
        assert!(
            bed.launcher
                .on_exit(&bed.fs, exit, Instant::now())
                .is_none()
        );
        assert_eq!(bed.state("j6").state, RunState::Running, "held");
        let result = if dump_ok {
            Ok(10)
        } else {
            Err(failed_dump("image write error"))
        };
        let group = bed
            .launcher
            .on_dumped(&bed.fs, "j6", 0, result, Instant::now());
        assert!(group.is_some(), "the held end is handled now");
        let job = bed.state("j6");
        if dump_ok {
            assert_eq!((job.state, job.saved), (RunState::Exited, true));
            assert!(job.message.contains("dumped by CRIU"), "{}", job.message);
        } else {
            // It died while a failed dump ran: its own end, not a save.
            assert_eq!(
                (job.state, job.saved, job.exit_code),
                (RunState::Exited, false, Some(137))
            );
            assert_eq!(
                job.save_error,
                "criu dump failed (exit status: 1): image write error"
            );
        }
    }
}

/// `criu dump` exited 1 having logged `errors`.
fn failed_dump(errors: &str) -> crate::criu::CriuError {
    use std::os::unix::process::ExitStatusExt;
    crate::criu::CriuError::DumpFailed {
        status: std::process::ExitStatus::from_raw(1 << 8),
        errors: errors.into(),
    }
}

#[tokio::test]
async fn a_failed_dump_leaves_the_job_running_with_the_reason_reported() {
    let mut bed = bed(Duration::from_secs(5));
    bed.prepare_group("plain-j7");
    assert!(matches!(
        bed.launcher
            .start(&bed.fs, start_job("j7", "plain", "sleep 0.3")),
        StartOutcome::Started(_)
    ));
    let l = bed.launcher.jobs.get_mut(&("j7".to_owned(), 0)).unwrap();
    l.saving = true;
    l.dump = Dump::InFlight;
    let none = bed
        .launcher
        .on_dumped(&bed.fs, "j7", 0, Err(failed_dump("no")), Instant::now());
    assert!(none.is_none());
    let job = bed.state("j7");
    assert_eq!(
        (job.state, job.save_error.as_str()),
        (RunState::Running, "criu dump failed (exit status: 1): no")
    );
    // A later save may try again.
    assert!(!bed.launcher.jobs[&("j7".to_owned(), 0)].saving);
    let exit = bed.next_exit().await;
    bed.launcher.on_exit(&bed.fs, exit, Instant::now());
    assert_eq!(bed.state("j7").exit_code, Some(0));
}

#[test]
fn the_dump_of_a_job_ended_before_a_restart_is_still_found_for_its_upload() {
    let bed = bed(Duration::from_secs(5));
    assert_eq!(
        bed.launcher.upload_dir("j9", "/shared/ckpt"),
        Some("/shared/ckpt".into())
    );
    assert_eq!(bed.launcher.upload_dir("j9", ""), None);
    let bundle = bed.dir.path().join("out/criu/plain-j9");
    std::fs::create_dir_all(bundle.join("images")).unwrap();
    assert_eq!(
        bed.launcher.upload_dir("j9", ""),
        None,
        "no complete dump yet"
    );
    std::fs::write(bundle.join("images/inventory.img"), b"x").unwrap();
    assert_eq!(bed.launcher.upload_dir("j9", ""), Some(bundle));
    assert_eq!(
        bed.launcher.upload_dir("j1", ""),
        None,
        "another job's dump"
    );
}

/// The fence: a job the coordinator may start elsewhere is asked to save as for a move; one
/// that ignores the save is stopped when the save's wait is over; one that cannot save at all
/// is stopped at once. Each is fenced once.
#[tokio::test]
async fn a_fenced_job_saves_and_one_that_does_not_save_in_time_is_stopped() {
    // The default bound (155 s): the full save wait.
    const BOUND: Duration = Duration::from_secs(155);
    let mut bed = bed(Duration::from_millis(300));
    let ckpt = bed.dir.path().join("ckpt");
    // j8 saves on SIGUSR1; j9 traps it and runs on; j10 declared no checkpoint.
    let scripts = [
        (
            "j8",
            format!(
                "trap 'mkdir -p {d}; echo 1 > {d}/step; exit 0' USR1; while :; do sleep 0.05; done",
                d = ckpt.display()
            ),
            true,
        ),
        (
            "j9",
            "trap 'echo ignored' USR1; while :; do sleep 0.05; done".to_owned(),
            true,
        ),
        ("j10", "while :; do sleep 0.05; done".to_owned(), false),
    ];
    for (id, script, checkpoint) in &scripts {
        bed.prepare_group(&format!("moved-{id}"));
        let mut s = start_job(id, "moved", script);
        s.attempt = 1;
        if *checkpoint {
            s.checkpoint = Some(saves_to(&ckpt));
        }
        assert!(matches!(
            bed.launcher.start(&bed.fs, s),
            StartOutcome::Started(_)
        ));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let now = Instant::now();
    let why = "fenced: test";
    assert_eq!(
        bed.launcher.fence(&bed.fs, "j8", now, BOUND, why),
        Some(SaveAction::Signalled)
    );
    assert_eq!(
        bed.launcher.fence(&bed.fs, "j8", now, BOUND, why),
        None,
        "fenced once"
    );
    assert_eq!(
        bed.launcher.fence(&bed.fs, "j9", now, BOUND, why),
        Some(SaveAction::Signalled)
    );
    assert_eq!(
        bed.launcher.fence(&bed.fs, "j10", now, BOUND, why),
        Some(SaveAction::Nothing)
    );
    assert_eq!(bed.launcher.fence(&bed.fs, "j404", now, BOUND, why), None);
    // j8 saves and exits; j10 was stopped at once (SIGTERM).
    for _ in 0..2 {
        let exit = bed.next_exit().await;
        bed.launcher.on_exit(&bed.fs, exit, Instant::now());
    }
    let j8 = bed.state("j8");
    assert_eq!(
        (j8.state, j8.saved),
        (RunState::Exited, true),
        "{}",
        j8.message
    );
    assert!(bed.state("j10").state.is_finished());
    // j9 still runs until its save's wait is over; then it is stopped.
    assert!(!bed.state("j9").state.is_finished());
    bed.launcher.poll(&bed.fs, now + fence::FENCE_SAVE_WAIT / 2);
    assert!(!bed.state("j9").state.is_finished());
    assert_eq!(
        bed.launcher.next_deadline(),
        Some(now + fence::FENCE_SAVE_WAIT)
    );
    bed.launcher.poll(&bed.fs, now + fence::FENCE_SAVE_WAIT);
    let exit = bed.next_exit().await;
    bed.launcher.on_exit(&bed.fs, exit, Instant::now());
    let j9 = bed.state("j9");
    assert!(j9.state.is_finished() && !j9.saved, "{j9:?}");
}

/// A short bound (a coordinator with short timeouts) shortens the fence's save wait and its
/// stop's grace, so that a job that ignores its save is killed before the coordinator may start
/// it elsewhere (twice the bound), whatever the node's `stop_grace`.
#[tokio::test]
async fn a_job_fenced_after_a_short_bound_is_gone_before_twice_the_bound() {
    let bound = Duration::from_secs(4);
    // A node whose stop grace alone is longer than the bound.
    let mut bed = bed(Duration::from_secs(30));
    let ckpt = bed.dir.path().join("ckpt");
    bed.prepare_group("moved-j9");
    let mut s = start_job(
        "j9",
        "moved",
        "trap 'echo ignored' USR1 TERM; while :; do sleep 0.05; done",
    );
    s.attempt = 1;
    s.checkpoint = Some(saves_to(&ckpt));
    assert!(matches!(
        bed.launcher.start(&bed.fs, s),
        StartOutcome::Started(_)
    ));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let fenced = Instant::now();
    assert_eq!(
        bed.launcher
            .fence(&bed.fs, "j9", fenced, bound, "fenced: test"),
        Some(SaveAction::Signalled)
    );
    // Stopped (SIGTERM) half the bound after the fence, not a minute later.
    let stop_at = bed.launcher.next_deadline().expect("its stop is due");
    assert_eq!(stop_at, fenced + bound / 2);
    bed.launcher.poll(&bed.fs, stop_at);
    // It ignores SIGTERM: SIGKILL a quarter of the bound later, not after the 30 s grace.
    let kill_at = bed.launcher.next_deadline().expect("its kill is due");
    assert_eq!(kill_at, stop_at + bound / 4);
    assert!(kill_at < fenced + bound);
    bed.launcher.poll(&bed.fs, kill_at);
    let exit = bed.next_exit().await;
    bed.launcher.on_exit(&bed.fs, exit, Instant::now());
    let j9 = bed.state("j9");
    assert!(j9.state.is_finished() && !j9.saved, "{j9:?}");
}

/// The completion witness: a job moved here (attempt 1) that ends on its own records it beside
/// its shared checkpoint; a later start of it (the coordinator lost this node and started it on
/// its source) is not run and is reported exited 0. One that saved, and one at its first
/// attempt, leave no record: their later starts run.
#[tokio::test]
async fn a_moved_job_that_ended_on_its_own_is_not_run_again_by_a_later_attempt() {
    let mut target = bed(Duration::from_millis(300));
    let ckpt = target.dir.path().join("ckpt");
    let saved_ckpt = target.dir.path().join("saved-ckpt");
    let first_ckpt = target.dir.path().join("first-ckpt");
    let runs = target.dir.path().join("runs");
    let script = format!("echo run >> {}; exit 0", runs.display());
    // A moved job's directory holds the checkpoint its move saved.
    std::fs::create_dir_all(&ckpt).unwrap();
    std::fs::create_dir_all(&first_ckpt).unwrap();
    // j5: moved here, ends on its own.
    target.prepare_group("moved-j5");
    let mut s = start_job("j5", "moved", &script);
    s.attempt = 1;
    s.checkpoint = Some(saves_to(&ckpt));
    assert!(matches!(
        target.launcher.start(&target.fs, s.clone()),
        StartOutcome::Started(_)
    ));
    let exit = target.next_exit().await;
    target.launcher.on_exit(&target.fs, exit, Instant::now());
    assert_eq!(
        completion::recorded(&ckpt, "j5"),
        Some(1),
        "no record of the end"
    );
    // j6: moved here, saves when asked (no record); j7: its first attempt ends (no record).
    target.prepare_group("moved-j6");
    let mut saver = start_job(
        "j6",
        "moved",
        &format!(
            "trap 'mkdir -p {d}; echo 1 > {d}/step; exit 0' USR1; while :; do sleep 0.05; done",
            d = saved_ckpt.display()
        ),
    );
    saver.attempt = 1;
    saver.checkpoint = Some(saves_to(&saved_ckpt));
    assert!(matches!(
        target.launcher.start(&target.fs, saver.clone()),
        StartOutcome::Started(_)
    ));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let save = SaveJob {
        job_id: "j6".into(),
        reason: "fenced: test".into(),
    };
    assert_eq!(
        target.launcher.save(&target.fs, &save),
        SaveAction::Signalled
    );
    let exit = target.next_exit().await;
    target.launcher.on_exit(&target.fs, exit, Instant::now());
    assert!(target.state("j6").saved);
    assert_eq!(completion::recorded(&saved_ckpt, "j6"), None);
    target.prepare_group("first-j7");
    let mut first = start_job("j7", "first", &script);
    first.checkpoint = Some(saves_to(&first_ckpt));
    assert!(matches!(
        target.launcher.start(&target.fs, first.clone()),
        StartOutcome::Started(_)
    ));
    let exit = target.next_exit().await;
    target.launcher.on_exit(&target.fs, exit, Instant::now());
    assert_eq!(completion::recorded(&first_ckpt, "j7"), None);

    // The source, starting each again at a later attempt.
    let mut source = bed(Duration::from_millis(300));
    s.attempt = 2;
    assert!(matches!(
        source.launcher.start(&source.fs, s),
        StartOutcome::AlreadyCompleted
    ));
    let j5 = source.state("j5");
    assert_eq!(
        (j5.state, j5.exit_code, j5.saved),
        (RunState::Exited, Some(0), false)
    );
    assert_eq!(
        std::fs::read_to_string(&runs).unwrap().lines().count(),
        2,
        "j5 ran again (one run of j5 and one of j7 expected)"
    );
    // A job run as a user does not have its record read (the daemon would read it as root at
    // a path the user names): it is tried (here, not root, it cannot switch users), never
    // skipped.
    let mut as_user = start_job("j55", "moved", &script);
    as_user.attempt = 2;
    as_user.user = "nobody".into();
    as_user.checkpoint = Some(saves_to(&ckpt));
    completion::record(&ckpt, "j55", 1);
    source.prepare_group("moved-j55");
    assert!(!matches!(
        source.launcher.start(&source.fs, as_user),
        StartOutcome::AlreadyCompleted
    ));
    source.prepare_group("moved-j6");
    saver.attempt = 2;
    assert!(matches!(
        source.launcher.start(&source.fs, saver),
        StartOutcome::Started(_)
    ));
    source.prepare_group("first-j7");
    first.attempt = 1;
    assert!(matches!(
        source.launcher.start(&source.fs, first),
        StartOutcome::Started(_)
    ));
    // j6 loops until asked: stop it, so that no test leaves a process behind (a daemon run
    // later on the machine would find it by its GOVERNOR_JOB and govern it).
    let stop = StopJob {
        job_id: "j6".into(),
        reason: "test over".into(),
    };
    assert_eq!(source.launcher.stop(&source.fs, &stop, Instant::now()), 1);
    loop {
        let exit = source.next_exit().await;
        let ended = exit.job_id == "j6";
        source.launcher.on_exit(&source.fs, exit, Instant::now());
        if ended {
            break;
        }
    }
}

/// The completion witness survives a restart of the daemon: a moved job taken back from the
/// journal that then ends on its own (exit 0, as its supervisor records) still leaves the
/// record beside its checkpoint.
#[tokio::test]
async fn a_moved_job_taken_back_after_a_restart_still_records_its_end() {
    use crate::supervise::ExitRecord;
    let mut bed = bed(Duration::from_secs(5));
    let out = bed.dir.path().join("out");
    let ckpt = bed.dir.path().join("ckpt");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::create_dir_all(&ckpt).unwrap();
    let exit_file = out.join("job-j5.exit");
    let mut sleeper = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    let mut entry = journal_entry(
        "j5",
        sleeper.id(),
        crate::sys::process_start_ticks(sleeper.id()),
        &exit_file,
    );
    entry.attempt = 1;
    entry.completion_witness = Some(ckpt.clone());
    let journal = Journal {
        version: JOURNAL_VERSION,
        jobs: vec![entry],
    };
    let path = bed.dir.path().join("run/coordinator-jobs.json");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, serde_json::to_vec(&journal).unwrap()).unwrap();
    assert_eq!(bed.launcher.recover(&bed.fs, Instant::now()).len(), 1);
    // It ends on its own; its supervisor records exit 0.
    ExitRecord {
        code: Some(0),
        ..ExitRecord::default()
    }
    .write(&exit_file)
    .unwrap();
    sleeper.kill().unwrap();
    let _ = sleeper.wait();
    let exit = bed.next_exit().await;
    bed.launcher.on_exit(&bed.fs, exit, Instant::now());
    let j5 = bed.state("j5");
    assert_eq!(
        (j5.state, j5.exit_code),
        (RunState::Exited, Some(0)),
        "{j5:?}"
    );
    assert_eq!(completion::recorded(&ckpt, "j5"), Some(1));
}
