//! Jobs that log only through a tracking back-end are governed by their progress: four real
//! training jobs, each with no other logging than one back-end — a PyTorch loop with only
//! `SummaryWriter`, a Keras `fit()` with only the `TensorBoard` callback, a Lightning run with
//! its default logger, an MLflow-autologged Keras run (MLflow's default SQLite store) — started
//! with `governor run-job --log <their log directory>` under the real daemon (the
//! `shortest-left` policy, cgroup v1 on the host). Each must show in `governor status` with its
//! loss and a category other than `unknown`.
//!
//! The writers run in the Python environment `cargo xtask test` installs (6.6 GB, and sets
//! `GOVERNOR_WRITERS_PYTHON`); the jobs are `governor-progress/tests/data/real_writers/
//! live_writer.py`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use governor_integration_tests::daemon::{Daemon, bin};
use governor_integration_tests::require_v1_cpu_host;

fn writers_python() -> PathBuf {
    let python = std::env::var_os("GOVERNOR_WRITERS_PYTHON").map(PathBuf::from);
    match python {
        Some(p) if p.exists() => p,
        _ => panic!(
            "prerequisite missing: GOVERNOR_WRITERS_PYTHON must name the Python that has the \
             tracking back-ends (`cargo xtask test` installs it under target/writers/venv \
             and sets it)"
        ),
    }
}

fn live_writer() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../governor-progress/tests/data/real_writers/live_writer.py")
}

/// A job started with run-job, stopped (with its group) when dropped.
struct Job(Child);

impl Drop for Job {
    fn drop(&mut self) {
        // run-job forwards SIGTERM to the job and removes its group once it ends.
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.0.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.0.wait();
    }
}

#[test]
#[ignore = "root-host: writes the host's cgroup v1 cpu controller and runs the real tracking back-ends (GOVERNOR_WRITERS_PYTHON); `cargo xtask test` installs them and runs it"]
fn root_host_v1_jobs_logging_only_to_a_tracking_backend_are_governed_by_progress() {
    require_v1_cpu_host();
    let python = writers_python();
    let d = Daemon::start("shortest-left", "");
    // (job, writer, its log directory, units of work, seconds per unit)
    let jobs = [
        ("tb-pytorch", "pytorch", "pytorch-runs", "400", "0.25"),
        ("tb-keras", "keras", "keras-logs", "60", "1.0"),
        ("tb-lightning", "lightning", "lightning-root", "40", "0.1"),
        ("mlflow-keras", "mlflow", "mlflow-work", "60", "1.0"),
    ];
    let mut running = Vec::new();
    for (name, kind, dir, n, pause) in jobs {
        let logdir = d.dir.path().join(dir);
        std::fs::create_dir_all(&logdir).unwrap();
        let out = std::fs::File::create(d.dir.path().join(format!("{name}.out"))).unwrap();
        let child = Command::new(bin("governor"))
            .args(["run-job", "--name", name, "--log"])
            .arg(&logdir)
            .arg("--socket")
            .arg(&d.socket)
            .arg("--")
            .arg(&python)
            .arg(live_writer())
            .args([kind])
            .arg(&logdir)
            .args([n, pause])
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("governor run-job");
        running.push(Job(child));
    }
    for (name, ..) in jobs {
        let j = d.wait_job(
            name,
            Duration::from_secs(300),
            "its loss and a category from its back-end's log",
            |j| j["signal_value"].is_number() && j["category"] != "unknown",
        );
        eprintln!(
            "{name}: signal {} = {}, category {}, {} records from {}",
            j["signal"], j["signal_value"], j["category"], j["records"], j["log_file"]
        );
        assert!(j["log_problem"].is_null(), "{name}: {}", j["log_problem"]);
    }
    drop(running);
}
