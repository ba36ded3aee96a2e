//! The real daemon on the real kernel (run with `cargo xtask vm-test vm_daemon`): discovery,
//! progress-driven CPU shifting, restore after SIGTERM and after SIGKILL + restart, run-job.

use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use governor_integration_tests::daemon::{Daemon, KerasLog, bin, cgroup_cpu_seconds};
use governor_integration_tests::{Burner, CGROUP2_ROOT, TestCgroup, require_vm};

fn read(group: &Path, file: &str) -> String {
    fs::read_to_string(group.join(file))
        .unwrap_or_else(|e| panic!("read {}/{file}: {e}", group.display()))
        .trim()
        .to_owned()
}

/// Two busy jobs, each wanting both vCPUs, declared in jobs.d with a Keras CSV log each.
struct TwoJobs {
    a: TestCgroup,
    b: TestCgroup,
    _burners: Vec<Burner>,
    log_a: KerasLog,
    log_b: KerasLog,
}

fn two_jobs(d: &Daemon, prefix: &str) -> TwoJobs {
    let root = Path::new(CGROUP2_ROOT);
    let a = TestCgroup::create(root, &format!("{prefix}-a"));
    let b = TestCgroup::create(root, &format!("{prefix}-b"));
    let mut burners = Vec::new();
    for g in [&a, &b] {
        for _ in 0..2 {
            let burner = Burner::start();
            g.add_pid(burner.pid());
            burners.push(burner);
        }
    }
    let logs = d.dir.path().join("logs");
    let log_a = KerasLog::create(&logs.join("a.csv"));
    let log_b = KerasLog::create(&logs.join("b.csv"));
    for (name, group) in [("a", &a), ("b", &b)] {
        d.declare_job(
            name,
            &format!(
                "cgroup = \"/{}\"\nlogs = [\"{}\"]\n",
                group.path().file_name().unwrap().to_string_lossy(),
                logs.join(format!("{name}.csv")).display()
            ),
        );
    }
    TwoJobs {
        a,
        b,
        _burners: burners,
        log_a,
        log_b,
    }
}

/// A job that is still learning: its loss falls at a steady pace (one value per record). An
/// exponential decay would look converged to the policy after a few dozen records.
fn learning_loss(k: u32) -> f64 {
    2.0 - 0.005 * f64::from(k)
}

/// Both jobs learn for `secs`, one record every 200 ms each.
fn both_progress(jobs: &mut TwoJobs, from: u32, secs: u32) -> u32 {
    let mut k = from;
    for _ in 0..secs * 5 {
        let loss = learning_loss(k);
        jobs.log_a.append(loss);
        jobs.log_b.append(loss);
        k += 1;
        sleep(Duration::from_millis(200));
    }
    k
}

#[test]
#[ignore = "vm: runs the daemon against real cgroups; run with `cargo xtask vm-test`"]
fn daemon_shifts_cpu_from_a_converged_job_to_a_progressing_one_within_2s() {
    require_vm();
    let mut d = Daemon::configure("shortest-left", "");
    let mut jobs = two_jobs(&d, "vmd-shift");
    d.spawn();
    d.wait_job("a", Duration::from_secs(10), "adoption", |_| true);
    d.wait_job("b", Duration::from_secs(10), "adoption", |_| true);
    // Phase 1: both learn at the same pace. The governor serves alike jobs in turns (least
    // attained service first), so a 2 s window may favour either one; over the whole phase the
    // guard keeps each within a few CPU-seconds of its fair twin.
    let (a0, b0) = (
        cgroup_cpu_seconds(jobs.a.path()),
        cgroup_cpu_seconds(jobs.b.path()),
    );
    let k = both_progress(&mut jobs, 0, 10);
    let (a1, b1) = (
        cgroup_cpu_seconds(jobs.a.path()),
        cgroup_cpu_seconds(jobs.b.path()),
    );
    let before = (b1 - b0) / (a1 - a0).max(1e-3);
    // Phase 2: a has converged (its loss no longer moves), b keeps learning. The shift is due
    // within 2 s of the change, or of the last moment a was promoted for being behind its
    // fair-share pace (the guard may hold a for a moment if phase 1 ended on b's turn). If
    // phase 1 ended on a's turn, a hands it over once its learning is judged slowing, before
    // it is judged converged (a CI run, 2026-11-29, waited for "converged": 2.2 s).
    // The detector takes a job's rate of progress once per CPU sample (250 ms here) from the
    // latest record: both jobs now log ten records a second (as a job logging every few
    // batches does), so that every sample has a fresh record and the 2 s measure the daemon's
    // reaction (its detector, its tick, the kernel following the new weights) rather than the
    // job's logging rate. At about three records a second (the test's status polls slowed it)
    // the flat loss took 2.3 s to be judged converged once (a CI-like run, 2026-11-27). The
    // CPU ratio is measured over windows of two records (~0.25 s): the shift is timed at the
    // end of the first window that shows it, so a window's length is the test's own error.
    let change = Instant::now();
    let flat = learning_loss(k);
    let mut shifted_at = None;
    let mut a_promoted_until = Duration::ZERO;
    let mut last = (
        cgroup_cpu_seconds(jobs.a.path()),
        cgroup_cpu_seconds(jobs.b.path()),
        Instant::now(),
    );
    let mut k = k;
    let mut ratios = Vec::new();
    while change.elapsed() < Duration::from_secs(6) && shifted_at.is_none() {
        for _ in 0..2 {
            jobs.log_a.append(flat);
            jobs.log_b.append(learning_loss(k));
            k += 1;
            sleep(Duration::from_millis(100));
        }
        let now = (
            cgroup_cpu_seconds(jobs.a.path()),
            cgroup_cpu_seconds(jobs.b.path()),
            Instant::now(),
        );
        let (da, db) = (now.0 - last.0, now.1 - last.1);
        let ratio = db / da.max(1e-3);
        ratios.push((change.elapsed().as_secs_f64(), ratio));
        if ratio >= 1.5 {
            shifted_at = Some(change.elapsed());
        } else if d
            .job("a")
            .and_then(|a| a["decision"].as_str().map(|s| s.contains("promoted")))
            .unwrap_or(false)
        {
            a_promoted_until = change.elapsed();
        }
        last = (
            cgroup_cpu_seconds(jobs.a.path()),
            cgroup_cpu_seconds(jobs.b.path()),
            Instant::now(),
        );
    }
    eprintln!(
        "cpu ratio b/a over phase 1 {before:.2}; after the change: {ratios:.2?}; a promoted until {a_promoted_until:?}"
    );
    eprintln!("status: {:?}", d.status_json());
    assert!(
        (0.5..=2.0).contains(&before),
        "over phase 1 both jobs learn alike and should get alike CPU, b/a = {before:.2}"
    );
    let shifted = shifted_at.unwrap_or_else(|| panic!("CPU never shifted to the progressing job (b/a >= 1.5) within 6 s; ratios {ratios:.2?}\nlog:\n{}", d.log_tail()));
    assert!(
        shifted <= a_promoted_until + Duration::from_secs(2),
        "CPU shifted only {shifted:?} after the progress change (goal: within 2 s)\nlog:\n{}",
        d.log_tail()
    );
    // The CPU may follow b's turn before a's flat loss has lasted long enough to call a
    // converged: keep both logs going until it is.
    let until = Instant::now() + Duration::from_secs(6);
    let mut a = d.job("a").unwrap();
    while a["category"] != "converged" && Instant::now() < until {
        jobs.log_a.append(flat);
        jobs.log_b.append(learning_loss(k));
        k += 1;
        sleep(Duration::from_millis(250));
        a = d.job("a").unwrap();
    }
    assert_eq!(a["category"], "converged", "{a}");
}

/// Start a governed pair, wait until the daemon has changed a file of job a, and return the
/// originals of a's cpu.weight and cpu.max.
fn governed_pair(d: &mut Daemon, prefix: &str) -> (TwoJobs, String, String) {
    let mut jobs = two_jobs(d, prefix);
    // An orchestrator's own settings, which the governor must put back.
    jobs.a.write("cpu.weight", "77");
    jobs.b.write("cpu.weight", "77");
    let (w0, m0) = (
        read(jobs.a.path(), "cpu.weight"),
        read(jobs.a.path(), "cpu.max"),
    );
    d.spawn();
    let k = both_progress(&mut jobs, 0, 4);
    let flat = learning_loss(k);
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut k = k;
    while read(jobs.a.path(), "cpu.weight") == w0 && read(jobs.a.path(), "cpu.max") == m0 {
        assert!(
            Instant::now() < deadline,
            "the daemon never changed job a's cpu files; log:\n{}",
            d.log_tail()
        );
        jobs.log_a.append(flat);
        jobs.log_b.append(learning_loss(k));
        k += 1;
        sleep(Duration::from_millis(200));
    }
    (jobs, w0, m0)
}

#[test]
#[ignore = "vm: runs the daemon against real cgroups; run with `cargo xtask vm-test`"]
fn daemon_restores_every_limit_on_sigterm() {
    require_vm();
    let mut d = Daemon::configure("shortest-left", "");
    let (jobs, w0, m0) = governed_pair(&mut d, "vmd-term");
    eprintln!(
        "governed: a cpu.weight {} cpu.max {}",
        read(jobs.a.path(), "cpu.weight"),
        read(jobs.a.path(), "cpu.max")
    );
    assert!(d.state_file.exists(), "no state file while governing");
    let status = d.terminate();
    assert!(
        status.success(),
        "daemon exit status {status} after SIGTERM; log:\n{}",
        d.log_tail()
    );
    for g in [&jobs.a, &jobs.b] {
        assert_eq!(
            read(g.path(), "cpu.weight"),
            w0,
            "cpu.weight of {} not restored",
            g.path().display()
        );
        assert_eq!(
            read(g.path(), "cpu.max"),
            m0,
            "cpu.max of {} not restored",
            g.path().display()
        );
    }
    assert!(
        !d.state_file.exists(),
        "the state file should be removed after a complete restore"
    );
}

#[test]
#[ignore = "vm: runs the daemon against real cgroups; run with `cargo xtask vm-test`"]
fn daemon_restores_limits_after_sigkill_and_restart() {
    require_vm();
    let mut d = Daemon::configure("shortest-left", "");
    let (jobs, w0, m0) = governed_pair(&mut d, "vmd-kill");
    let governed = (
        read(jobs.a.path(), "cpu.weight"),
        read(jobs.a.path(), "cpu.max"),
    );
    d.kill();
    assert_eq!(
        (
            read(jobs.a.path(), "cpu.weight"),
            read(jobs.a.path(), "cpu.max")
        ),
        governed,
        "a SIGKILLed daemon cannot restore anything"
    );
    assert!(
        d.state_file.exists(),
        "the state file must survive the crash"
    );
    // Restart with the hands-off policy: recovery must put the originals back.
    let config = fs::read_to_string(&d.config)
        .unwrap()
        .replace("policy = \"shortest-left\"", "policy = \"fair\"");
    fs::write(&d.config, config).unwrap();
    d.spawn();
    for g in [&jobs.a, &jobs.b] {
        assert_eq!(
            read(g.path(), "cpu.weight"),
            w0,
            "cpu.weight of {} not restored after restart",
            g.path().display()
        );
        assert_eq!(
            read(g.path(), "cpu.max"),
            m0,
            "cpu.max of {} not restored after restart",
            g.path().display()
        );
    }
    assert!(
        d.log_text().contains("left by a previous run"),
        "recovery not reported; log:\n{}",
        d.log_tail()
    );
}

#[test]
#[ignore = "vm: runs the daemon against real cgroups; run with `cargo xtask vm-test`"]
fn environment_jobs_are_found_adopted_followed_and_forgotten_within_a_second() {
    require_vm();
    let d = Daemon::start("fair", "");
    let logs = d.dir.path().join("envjob");
    let mut log = KerasLog::create(&logs.join("training.log"));
    // A plain process in the root cgroup (which cannot be limited): it must be moved into a
    // cgroup of its own.
    let mut child = Command::new("/bin/sh")
        .args(["-c", "while :; do :; done"])
        .env("GOVERNOR_LOG", logs.join("training.log"))
        .env("GOVERNOR_JOB", "envjob")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    // `governor status` itself takes a while to start under TCG, so the detection latency is
    // measured with the daemon's own clock: time since start minus the job's age in the daemon.
    let j = d.wait_job("envjob", Duration::from_secs(10), "discovery", |_| true);
    let answered = t0.elapsed().as_secs_f64();
    let detected_after = answered - j["age_seconds"].as_f64().unwrap();
    eprintln!(
        "status answered after {answered:.2} s; the daemon had found the job {detected_after:.2} s after it started: {j}"
    );
    assert!(
        detected_after <= 1.0,
        "the job was noticed {detected_after:.2} s after it started (goal: within a second)"
    );
    let cgroup = j["cgroup"].as_str().unwrap().to_owned();
    assert!(
        cgroup.starts_with("/governor.slice/jobs/envjob-"),
        "{cgroup}"
    );
    let own = fs::read_to_string(format!("/proc/{}/cgroup", child.id())).unwrap();
    assert!(own.contains(&cgroup), "the process was not moved: {own}");
    for loss in [0.9, 0.7, 0.6] {
        log.append(loss);
    }
    d.wait_job("envjob", Duration::from_secs(20), "progress", |j| {
        j["signal_value"].as_f64() == Some(0.6) && j["records"] == 3
    });
    child.kill().unwrap();
    child.wait().unwrap();
    let t1 = Instant::now();
    while d.job("envjob").is_some() {
        assert!(
            t1.elapsed() < Duration::from_secs(2),
            "finished job still governed after 2 s"
        );
        sleep(Duration::from_millis(50));
    }
    eprintln!("forgotten {:?} after its exit", t1.elapsed());
    assert!(
        !Path::new(CGROUP2_ROOT)
            .join(cgroup.trim_start_matches('/'))
            .exists(),
        "the adopted job's cgroup was not removed"
    );
}

#[test]
#[ignore = "vm: runs the daemon against real cgroups; run with `cargo xtask vm-test`"]
fn run_job_starts_a_governed_job_in_its_own_cgroup_and_cleans_up() {
    require_vm();
    let d = Daemon::start("fair", "");
    let log = d.dir.path().join("rj/metrics.csv");
    fs::create_dir_all(log.parent().unwrap()).unwrap();
    let script = format!(
        "printf 'epoch,loss\\n0,0.9\\n1,0.8\\n' > {}; sleep 8; exit 7",
        log.display()
    );
    let mut run = Command::new(bin("governor"))
        .args(["run-job", "--name", "rj", "--socket"])
        .arg(&d.socket)
        .arg("--log")
        .arg(&log)
        .args(["--", "/bin/sh", "-c", &script])
        .spawn()
        .unwrap();
    let j = d.wait_job("rj", Duration::from_secs(20), "launch", |j| {
        j["signal_value"].as_f64() == Some(0.8)
    });
    assert_eq!(j["source"], "launched");
    assert_eq!(j["cgroup"], "/governor.slice/jobs/rj");
    let status = run.wait().unwrap();
    assert_eq!(
        status.code(),
        Some(7),
        "run-job must exit with the job's status"
    );
    assert!(
        d.job("rj").is_none(),
        "job still governed after run-job returned"
    );
    assert!(
        !Path::new(CGROUP2_ROOT)
            .join("governor.slice/jobs/rj")
            .exists(),
        "job cgroup left behind"
    );
}

#[test]
#[ignore = "vm: runs the daemon against real cgroups; run with `cargo xtask vm-test`"]
fn a_memory_hungry_job_under_the_memory_policy_is_never_oom_killed() {
    require_vm();
    let mut d = Daemon::configure("shortest-left", "[actuation]\ngovern_memory = true\n");
    let mut jobs = two_jobs(&d, "vmd-mem");
    d.spawn();
    // Job b keeps learning; job a has converged (flat loss) and grows its memory to 300 MiB in
    // 2 MiB steps: the memory policy shrinks a to its usage, the guard must keep it alive.
    let k = both_progress(&mut jobs, 0, 4);
    let script = format!(
        "echo $$ > {}/cgroup.procs && exec {} 300 3 2 40",
        jobs.a.path().display(),
        governor_integration_tests::daemon::bin("memhog").display()
    );
    let mut hog = Command::new("/bin/sh")
        .args(["-c", &script])
        .spawn()
        .unwrap();
    let flat = learning_loss(k);
    let mut k = k;
    let mut high_seen = None;
    let status = loop {
        jobs.log_a.append(flat);
        jobs.log_b.append(learning_loss(k));
        k += 1;
        let high = read(jobs.a.path(), "memory.high");
        if high != "max" {
            high_seen.get_or_insert(high);
        }
        if let Some(s) = hog.try_wait().unwrap() {
            break s;
        }
        sleep(Duration::from_millis(200));
    };
    let events = governor_integration_tests::read_keyed(&jobs.a.path().join("memory.events"));
    eprintln!("memhog: {status}; memory.high first set to {high_seen:?}; memory.events {events:?}");
    assert!(
        status.success(),
        "the memory-hungry job died: {status}; events {events:?}\nlog:\n{}",
        d.log_tail()
    );
    assert_eq!(
        events.get("oom_kill").copied().unwrap_or(0),
        0,
        "OOM kill in a governed job"
    );
    assert!(
        high_seen.is_some(),
        "the memory policy never limited the converged job (nothing was tested)\nlog:\n{}",
        d.log_tail()
    );
}
