//! GPU governance through NVML's real code path, without a GPU: the daemon loads the workspace's
//! stand-in NVML library (`nvml-standin`) by its ordinary loading path (`[gpu] nvml_library`),
//! finds a governed job's process on the stand-in GPU, lowers the GPU's power limit when the job
//! converges (recording the original first), is killed mid-way and restores the limit on its
//! next start, adopts a limit someone else set as the new original, and restores it when it
//! stops. Run as root on a cgroup v1 host (`root_host_v1_*`, in `cargo xtask test`) and on
//! cgroup v2 in the VM (`vm_*`, `cargo xtask vm-test gpu_standin`).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use governor_integration_tests::daemon::{Daemon, bin, nvml_standin_library};
use governor_integration_tests::{Layout, free_port, require_v1_cpu_host, require_vm};
use nvml_standin::state::{self, Process, STATE_ENV, State};

/// A job that learns for 4 s (a falling loss every 200 ms), then logs a flat loss (converged)
/// until it is stopped.
fn start_converging_job(d: &Daemon, name: &str) -> Child {
    let log = d.dir.path().join(format!("{name}.csv"));
    let script = format!(
        "log='{}'\necho epoch,loss > \"$log\"\nk=0\n\
         while :; do if [ $k -lt 20 ]; then v=$((20000 - 500 * k)); else v=10000; fi; \
         echo \"$k,$((v / 10000)).$(printf %04d $((v % 10000)))\" >> \"$log\"; \
         k=$((k + 1)); sleep 0.2; done\n",
        log.display()
    );
    Command::new(bin("governor"))
        .args(["run-job", "--name", name, "--log"])
        .arg(&log)
        .arg("--socket")
        .arg(&d.socket)
        .args(["--", "sh", "-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("governor run-job")
}

/// The job's `run-job` and every process in its group are killed when the test ends, passed
/// or failed (a failed run must not leave a job behind for the next).
struct JobGuard {
    name: String,
    layout: Layout,
    child: Child,
}

impl Drop for JobGuard {
    /// The job's processes first, so that `run-job` sees its child end and removes the job's
    /// group itself (every controller's); `run-job` only if it has not ended within 5 s.
    fn drop(&mut self) {
        for pid in self.layout.job_pids(&self.name) {
            if pid != self.child.id() {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while !matches!(self.child.try_wait(), Ok(Some(_))) && Instant::now() < deadline {
            sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        governor_integration_tests::remove_empty_governor_subtree();
    }
}

fn limit_w(path: &Path) -> f64 {
    state::with_state(path, |s| f64::from(s.devices[0].power_limit_mw) / 1000.0).unwrap()
}

fn wait_limit(d: &Daemon, path: &Path, watts: f64, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while (limit_w(path) - watts).abs() > 1e-6 {
        assert!(
            Instant::now() < deadline,
            "{what}: the GPU's limit is {} W, not {watts} W; status {:?}\nlog:\n{}",
            limit_w(path),
            d.status_json(),
            d.log_tail()
        );
        sleep(Duration::from_millis(200));
    }
}

#[test]
#[ignore = "root host: writes the host's cgroup v1 cpu controller; run by `cargo xtask test`"]
fn root_host_v1_gpu_power_follows_progress_and_every_change_is_undone() {
    require_v1_cpu_host();
    power_follows_progress(Layout::HostV1);
}

#[test]
#[ignore = "vm: runs the daemon against real cgroups; run with `cargo xtask vm-test gpu_standin`"]
fn vm_gpu_power_follows_progress_and_every_change_is_undone() {
    require_vm();
    power_follows_progress(Layout::V2);
}

/// `GET /metrics` from the daemon.
fn scrape(port: u16) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("metrics listener");
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    text
}

/// A daemon with the stand-in library and `[gpu]`/`[metrics]` settings `extra`, one stand-in
/// H100, and a converging `run-job` job named `PREFIX-PID` whose main process (the job's shell,
/// the oldest in its group) runs on GPU 0 with `gpu_memory` bytes, as NVML would list a CUDA
/// context.
struct GpuBed {
    d: Daemon,
    gpu_state: PathBuf,
    name: String,
    _job: JobGuard,
}

fn gpu_bed(layout: Layout, prefix: &str, extra: &str, gpu_memory: u64) -> GpuBed {
    let library = nvml_standin_library();
    let mut d = Daemon::configure(
        "shortest-left",
        &format!(
            "[gpu]\ngovern = true\nnvml_library = \"{}\"\n{extra}",
            library.display()
        ),
    );
    let gpu_state = d.dir.path().join("nvml-standin.json");
    state::create(&gpu_state, &State::h100s(1)).unwrap();
    d.env
        .push((STATE_ENV.into(), gpu_state.display().to_string()));
    d.spawn();
    let name = format!("{prefix}-{}", std::process::id());
    let job = JobGuard {
        name: name.clone(),
        layout,
        child: start_converging_job(&d, &name),
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let pid = loop {
        if let Some(p) = layout.job_pids(&name).into_iter().min() {
            break p;
        }
        assert!(Instant::now() < deadline, "run-job never placed the job");
        sleep(Duration::from_millis(100));
    };
    state::with_state(&gpu_state, |s| {
        s.devices[0].processes = vec![Process {
            pid,
            used_memory: gpu_memory,
        }];
    })
    .unwrap();
    GpuBed {
        d,
        gpu_state,
        name,
        _job: job,
    }
}

fn power_follows_progress(layout: Layout) {
    let port = free_port();
    // The fixed fractions (the search is unit-tested: its pace windows take minutes).
    let GpuBed {
        mut d,
        gpu_state,
        name,
        _job,
    } = gpu_bed(
        layout,
        "gpu-conv",
        &format!("slowdown = 0\n[metrics]\nlisten = \"127.0.0.1:{port}\"\n"),
        2 << 30,
    );
    let journal = d.state_file.with_file_name("gpu-state.json");
    // Learning: the GPU keeps its default. Attribution and energy show in the status.
    let j = d.wait_job(&name, Duration::from_secs(30), "found on GPU 0", |j| {
        j["gpus"] == serde_json::json!([0])
    });
    assert_eq!(j["gpu_memory_bytes"].as_u64(), Some(2 << 30), "{j}");
    assert_eq!(limit_w(&gpu_state), 700.0);
    // Converged: 60% of the original, recorded first.
    d.wait_job(&name, Duration::from_secs(60), "converged", |j| {
        j["category"] == "converged"
    });
    wait_limit(&d, &gpu_state, 420.0, "converged");
    let recorded = fs::read_to_string(&journal).expect("the original is journalled");
    assert!(recorded.contains("\"original_mw\": 700000"), "{recorded}");
    let status = d.status_json().unwrap();
    assert_eq!(status["gpus"][0]["original_limit_watts"], 700.0, "{status}");
    let energy = d.job(&name).unwrap()["gpu_energy_joules"].as_f64().unwrap();
    assert!(energy > 0.0, "energy attributed to the job: {energy}");
    // The same on /metrics.
    let metrics = scrape(port);
    assert!(metrics.starts_with("HTTP/1.1 200 OK"), "{metrics}");
    for series in [
        "governor_gpu_power_limit_watts{node=",
        "governor_job_gpu_energy_joules_total{node=",
        &format!("job_name=\"{name}\""),
        "category=\"converged\"} 1",
    ] {
        assert!(metrics.contains(series), "{series} missing:\n{metrics}");
    }
    assert!(
        metrics.contains("gpu=\"0\",uuid=\"GPU-standin-0000\"} 420.0"),
        "{metrics}"
    );

    // A crash: the limit stays lowered until the next start, which restores it first.
    d.kill();
    assert_eq!(limit_w(&gpu_state), 420.0);
    d.spawn();
    assert!(
        d.log_text()
            .contains("left by a previous run that did not stop cleanly"),
        "{}",
        d.log_tail()
    );
    // The job is still converged: lowered again, from the same original.
    wait_limit(&d, &gpu_state, 420.0, "governed again after the restart");

    // Someone else sets 500 W (`nvidia-smi -pl 500`): adopted, 60% of it applied.
    state::with_state(&gpu_state, |s| s.devices[0].power_limit_mw = 500_000).unwrap();
    wait_limit(&d, &gpu_state, 300.0, "someone else's limit adopted");
    assert!(d.log_text().contains("changed by someone else"));

    // A clean stop puts back the operator's 500 W and leaves no journal.
    assert!(d.terminate().success(), "{}", d.log_tail());
    assert_eq!(limit_w(&gpu_state), 500.0);
    assert!(!journal.exists());
}

#[test]
#[ignore = "root host: writes the host's cgroup v1 cpu controller; run by `cargo xtask test`"]
fn root_host_v1_gpu_clocks_follow_progress_and_are_unlocked_after_a_crash() {
    require_v1_cpu_host();
    clocks_follow_progress(Layout::HostV1);
}

#[test]
#[ignore = "vm: runs the daemon against real cgroups; run with `cargo xtask vm-test gpu_standin`"]
fn vm_gpu_clocks_follow_progress_and_are_unlocked_after_a_crash() {
    require_vm();
    clocks_follow_progress(Layout::V2);
}

fn locked(path: &Path) -> Option<(u32, u32)> {
    state::with_state(path, |s| s.devices[0].locked_clocks_mhz).unwrap()
}

fn wait_locked(d: &Daemon, path: &Path, want: Option<(u32, u32)>, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while locked(path) != want {
        assert!(
            Instant::now() < deadline,
            "{what}: clocks {:?}, not {want:?}; log:\n{}",
            locked(path),
            d.log_tail()
        );
        sleep(Duration::from_millis(200));
    }
}

/// `[gpu] mechanism = "clocks"`: the converged job's GPU has its graphics clock locked at 60% of
/// its maximum (1188 of 1980 MHz), still locked after the daemon is killed, unlocked by its next
/// start (and locked again, the job being still converged), unlocked when it stops.
fn clocks_follow_progress(layout: Layout) {
    let GpuBed {
        mut d,
        gpu_state,
        name,
        _job,
    } = gpu_bed(layout, "gpu-clk", "mechanism = \"clocks\"\n", 1 << 30);
    d.wait_job(&name, Duration::from_secs(60), "converged", |j| {
        j["category"] == "converged"
    });
    wait_locked(&d, &gpu_state, Some((1188, 1188)), "converged");
    assert_eq!(limit_w(&gpu_state), 700.0, "the power limit is left alone");
    d.kill();
    assert_eq!(locked(&gpu_state), Some((1188, 1188)));
    d.spawn();
    assert!(
        d.log_text().contains("GPU clocks unlocked"),
        "{}",
        d.log_tail()
    );
    wait_locked(
        &d,
        &gpu_state,
        Some((1188, 1188)),
        "locked again after the restart",
    );
    assert!(d.terminate().success(), "{}", d.log_tail());
    assert_eq!(locked(&gpu_state), None);
}

/// The stand-in loads through nvml-wrapper's ordinary path (`dlopen`, symbols, C structures),
/// and NVML's error codes map to the governor's (a plain host test: no root needed).
#[test]
fn the_standin_library_loads_through_nvml_wrapper_and_maps_errors() {
    let library = nvml_standin_library();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.json");
    let mut s = State::h100s(2);
    s.devices[1].fail.insert(
        "nvmlDeviceSetPowerManagementLimit".into(),
        "NO_PERMISSION".into(),
    );
    s.devices[0].processes = vec![Process {
        pid: 4242,
        used_memory: 1 << 30,
    }];
    state::create(&path, &s).unwrap();
    // SAFETY: set before any thread of this test reads the environment; the stand-in reads it
    // on each call.
    unsafe { std::env::set_var(STATE_ENV, &path) };
    let nvml = governor::gpu::open_nvml(Some(&library)).expect("the stand-in loads");
    use governor::gpu::device::{GpuDevices, GpuError, NvmlDevices};
    let devices = NvmlDevices(nvml);
    assert_eq!(devices.count().unwrap(), 2);
    let snap = devices.snapshot(0).unwrap();
    assert_eq!(snap.uuid, "GPU-standin-0000");
    assert_eq!(snap.processes, vec![(4242, 1 << 30)]);
    assert_eq!(snap.memory_used_bytes, 1 << 30);
    assert_eq!(
        (snap.limit_mw, snap.min_limit_mw, snap.default_limit_mw),
        (Some(700_000), Some(200_000), Some(700_000))
    );
    assert!(!snap.mig);
    devices.set_power_limit(0, 400_000).unwrap();
    assert_eq!(devices.snapshot(0).unwrap().limit_mw, Some(400_000));
    assert_eq!(
        devices.set_power_limit(1, 400_000),
        Err(GpuError::NoPermission)
    );
    assert!(matches!(
        devices.set_power_limit(0, 100_000),
        Err(GpuError::Other(_))
    ));
    // The energy counter advances at the device's draw.
    let e0 = devices.snapshot(0).unwrap().energy_mj.unwrap();
    sleep(Duration::from_millis(300));
    let e1 = devices.snapshot(0).unwrap().energy_mj.unwrap();
    assert!(e1 > e0, "{e0} -> {e1}");

    // `governor gpus`, the read-only check: inventory, processes, energy; nothing set.
    let before = fs::read_to_string(&path).unwrap();
    let out = Command::new(bin("governor"))
        .args(["gpus", "--json", "--interval", "200ms", "--nvml-library"])
        .arg(&library)
        .env(STATE_ENV, &path)
        .output()
        .expect("governor gpus");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let gpus: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(gpus[0]["uuid"], "GPU-standin-0000", "{gpus}");
    assert_eq!(gpus[0]["processes"][0]["pid"], 4242, "{gpus}");
    assert!(
        gpus[0]["energy_joules_over_interval"].as_f64().unwrap() > 0.0,
        "{gpus}"
    );
    let limits = |text: &str| -> Vec<u64> {
        let s: serde_json::Value = serde_json::from_str(text).unwrap();
        s["devices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["power_limit_mw"].as_u64().unwrap())
            .collect()
    };
    assert_eq!(
        limits(&fs::read_to_string(&path).unwrap()),
        limits(&before),
        "no setting changed"
    );
}
