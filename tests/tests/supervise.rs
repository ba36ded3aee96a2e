//! `governor supervise` as the daemon runs it for the coordinator's jobs, on real processes:
//! with `--pid-namespace` the job runs as pid 2 of a namespace of its own under the init
//! (with root; without, it runs as before and says why), its exit code and the signal that ends
//! it are recorded and passed on as without a namespace. Needs the `governor` binary
//! (`cargo build -p governor`).

use std::process::{Command, Stdio};
use std::time::Duration;

use governor_integration_tests::daemon::bin;

fn record(path: &std::path::Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).expect("a record")).expect("JSON")
}

#[test]
fn a_job_in_its_own_pid_namespace_ends_and_is_recorded_as_without_one() {
    let dir = tempfile::tempdir().unwrap();
    let status = dir.path().join("job.exit");
    let out = Command::new(bin("governor"))
        .args(["supervise", "--pid-namespace", "--status-file"])
        .arg(&status)
        .args(["--", "/bin/sh", "-c", "echo $$; exit 3"])
        .output()
        .expect("governor supervise runs");
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(record(&status), serde_json::json!({"code": 3}));
    let pid = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if nix::unistd::geteuid().is_root() {
        // PID 1 is the supervisor's init; the job is its first child.
        assert_eq!(pid, "2", "{}", String::from_utf8_lossy(&out.stderr));
    } else {
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("cannot give the job a PID namespace"),
            "{stderr}"
        );
    }

    let missing = dir.path().join("missing.exit");
    let out = Command::new(bin("governor"))
        .args(["supervise", "--pid-namespace", "--status-file"])
        .arg(&missing)
        .args(["--", "/nonexistent/program"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(127));
    let r = record(&missing);
    assert_eq!(r["code"], 127);
    assert!(r["error"].as_str().unwrap().contains("cannot start"), "{r}");
}

#[test]
fn a_signal_to_the_supervisor_reaches_a_job_in_its_own_pid_namespace() {
    use std::os::unix::process::ExitStatusExt;
    let dir = tempfile::tempdir().unwrap();
    let status = dir.path().join("job.exit");
    let mut child = Command::new(bin("governor"))
        .args(["supervise", "--pid-namespace", "--status-file"])
        .arg(&status)
        .args(["--", "sleep", "30"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let ended = child.wait().unwrap();
    assert_eq!(ended.signal(), Some(15), "ends the way the job did");
    assert_eq!(record(&status), serde_json::json!({"signal": 15}));
}
