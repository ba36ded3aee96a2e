//! `governor supervise`, the real binary, as the daemon starts it in front of each coordinator
//! job: it ends the way its job ended, records how, and passes stop signals on to the job.

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

fn supervise(status_file: &Path, script: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_governor"));
    command
        .arg("supervise")
        .arg("--status-file")
        .arg(status_file)
        .args(["--", "/bin/sh", "-c", script]);
    command
}

fn record(status_file: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(status_file)
        .unwrap_or_else(|e| panic!("no record in {}: {e}", status_file.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON: {text}: {e}"))
}

fn wait_with_timeout(child: &mut Child, limit: Duration) -> ExitStatus {
    let until = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > until {
            let _ = child.kill();
            panic!("the supervisor did not end within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn it_exits_with_the_jobs_code_and_records_it() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("job.exit");
    let out = supervise(&file, "echo \"job $GOVERNOR_JOB says hi\"; exit 3")
        .env("GOVERNOR_JOB", "resnet")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "job resnet says hi\n",
        "the job keeps the environment and output"
    );
    assert_eq!(record(&file), serde_json::json!({"code": 3}));
}

#[test]
fn a_job_killed_by_a_signal_ends_its_supervisor_by_the_same_signal() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("job.exit");
    let status = supervise(&file, "kill -KILL $$").status().unwrap();
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
    assert_eq!(record(&file), serde_json::json!({"signal": libc::SIGKILL}));
}

#[test]
fn a_stop_sent_to_the_supervisor_reaches_the_job() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("job.exit");
    let ready = dir.path().join("ready");
    let script = format!(
        "trap 'echo stopping; exit 42' TERM; touch {}; while :; do sleep 0.05; done",
        ready.display()
    );
    let mut child = supervise(&file, &script)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let until = Instant::now() + Duration::from_secs(20);
    while !ready.exists() {
        assert!(Instant::now() < until, "the job did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    // To the supervisor only (not its process group): it must pass the signal on.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = wait_with_timeout(&mut child, Duration::from_secs(20));
    assert_eq!(status.code(), Some(42), "{status:?}");
    assert_eq!(record(&file), serde_json::json!({"code": 42}));
}

#[test]
fn a_program_that_cannot_start_is_recorded_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("job.exit");
    let out = Command::new(env!("CARGO_BIN_EXE_governor"))
        .arg("supervise")
        .arg("--status-file")
        .arg(&file)
        .args(["--", "/opt/no-such-trainer", "--epochs", "3"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(127));
    let r = record(&file);
    assert_eq!(r["code"], 127);
    let error = r["error"].as_str().unwrap();
    assert!(
        error.contains("/opt/no-such-trainer") && error.contains("No such file"),
        "{error}"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains(error));
}

#[test]
fn a_supervisor_killed_outright_takes_its_job_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("job.exit");
    let pid_file = dir.path().join("job.pid");
    // exec: the job is the sleep itself, a direct child of the supervisor.
    let script = format!("echo $$ > {}; exec sleep 60", pid_file.display());
    let mut child = supervise(&file, &script).spawn().unwrap();
    let until = Instant::now() + Duration::from_secs(20);
    let job_pid: i32 = loop {
        if let Some(pid) = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|t| t.trim().parse().ok())
        {
            break pid;
        }
        assert!(Instant::now() < until, "the job did not start");
        std::thread::sleep(Duration::from_millis(20));
    };
    child.kill().unwrap();
    let _ = child.wait();
    let job = nix::unistd::Pid::from_raw(job_pid);
    let until = Instant::now() + Duration::from_secs(10);
    // Gone, or a zombie waiting for init to reap it.
    while nix::sys::signal::kill(job, None).is_ok()
        && !std::fs::read_to_string(format!("/proc/{job_pid}/stat"))
            .is_ok_and(|s| s.contains(") Z "))
    {
        assert!(Instant::now() < until, "the job outlived its supervisor");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!file.exists(), "a killed supervisor records nothing");
}
