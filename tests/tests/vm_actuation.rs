//! Real-kernel tests of the cgroup actuator (governor::cgroup) on cgroup v2: limits applied by
//! the actuator take effect, are restored on release, after a simulated crash, on SIGTERM and
//! after SIGKILL + restart; drift is seen through the kernel's normalisation; the memory guard
//! never lets a job be OOM-killed; job groups for `run-job`.
//! Run with `cargo xtask vm-test vm_actuator` (the memory tests: `vm_memory_guard`).

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use governor::cgroup::{
    Actuator, ActuatorConfig, CgroupUsage, DriftAction, GuardVerdict, Hierarchy, HierarchyKind,
    JobCgroup, Knob, MemoryGuardConfig,
};
use governor::policy::{Allocation, Category, CpuAllocation, MemoryAllocation};
use governor_integration_tests::{
    Burner, CGROUP2_ROOT, TestCgroup, pin_to_cpu, read_keyed, require_vm,
};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

const MIB: u64 = 1 << 20;

fn actuator(state_dir: &Path, tweak: impl FnOnce(&mut ActuatorConfig)) -> Actuator {
    let hierarchy = Hierarchy::detect(CGROUP2_ROOT).expect("cannot detect the guest's cgroups");
    assert_eq!(
        hierarchy.kind(),
        HierarchyKind::Unified,
        "the VM guest should have a unified cgroup v2 hierarchy"
    );
    let mut config = ActuatorConfig {
        state_file: state_dir.join("state.json"),
        ..ActuatorConfig::default()
    };
    tweak(&mut config);
    Actuator::new(hierarchy, config).expect("cannot create the actuator")
}

fn alloc(weight: u32, max_cores: Option<f64>, high: Option<u64>, max: Option<u64>) -> Allocation {
    Allocation {
        category: Category::Progressing,
        cpu: CpuAllocation { weight, max_cores },
        memory: MemoryAllocation {
            high_bytes: high,
            max_bytes: max,
        },
        reason: "vm test".into(),
    }
}

fn job_of(group: &TestCgroup) -> JobCgroup {
    let rel = group
        .path()
        .strip_prefix(CGROUP2_ROOT)
        .expect("test group under the v2 root");
    JobCgroup::new(rel).expect("job cgroup")
}

/// CPU used by a group over `secs` seconds, as a fraction of one CPU, and the growth of
/// nr_throttled.
fn cpu_share(group: &TestCgroup, secs: u64) -> (f64, u64) {
    let before = read_keyed(&group.path().join("cpu.stat"));
    let t0 = Instant::now();
    sleep(Duration::from_secs(secs));
    let after = read_keyed(&group.path().join("cpu.stat"));
    let wall = t0.elapsed().as_secs_f64();
    let used = (after["usage_usec"] - before["usage_usec"]) as f64 / 1e6;
    (used / wall, after["nr_throttled"] - before["nr_throttled"])
}

fn trimmed(group: &TestCgroup, file: &str) -> String {
    group.read(file).trim().to_owned()
}

#[test]
#[ignore = "vm: changes cgroup v2 limits; run with `cargo xtask vm-test vm_actuator`"]
fn vm_actuator_cpu_max_throttles_and_release_restores_it() {
    require_vm();
    let group = TestCgroup::create(Path::new(CGROUP2_ROOT), "act-cpu-max");
    let job = job_of(&group);
    let state = tempfile::tempdir().unwrap();
    let mut act = actuator(state.path(), |_| {});

    let out = act
        .apply(&job, &alloc(100, Some(0.2), None, None), Instant::now())
        .expect("apply");
    assert!(out.errors.is_empty(), "{:?}", out.errors);
    assert_eq!(trimmed(&group, "cpu.max"), "20000 100000");
    // cgroups-rs, as an independent reader, parses what the actuator wrote.
    let ctl = cgroups_rs::fs::cpu::CpuController::new(
        group.path().to_path_buf(),
        PathBuf::from(CGROUP2_ROOT),
        true,
    );
    assert_eq!(ctl.cfs_quota().expect("cgroups-rs cfs_quota"), 20_000);
    assert_eq!(ctl.cfs_period().expect("cgroups-rs cfs_period"), 100_000);

    let burner = Burner::start();
    group.add_pid(burner.pid());
    let (share, throttled) = cpu_share(&group, 5);
    eprintln!(
        "actuator cpu.max 0.2 cores: {:.1}% of a CPU, nr_throttled +{throttled}",
        share * 100.0
    );
    assert!(
        throttled > 0,
        "nr_throttled did not grow: the cap is not enforced"
    );
    assert!(
        (0.15..=0.25).contains(&share),
        "usage {:.1}% is not 20% ± 5%",
        share * 100.0
    );

    let report = act.release(&job);
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(trimmed(&group, "cpu.max"), "max 100000");
    let (share, _) = cpu_share(&group, 3);
    eprintln!("after release: {:.1}% of a CPU", share * 100.0);
    assert!(
        share > 0.5,
        "still throttled after release: {:.1}%",
        share * 100.0
    );
    assert!(!state.path().join("state.json").exists());
}

#[test]
#[ignore = "vm: changes cgroup v2 weights; run with `cargo xtask vm-test vm_actuator`"]
fn vm_actuator_cpu_weight_splits_two_busy_groups() {
    require_vm();
    let a = TestCgroup::create(Path::new(CGROUP2_ROOT), "act-weight-a");
    let b = TestCgroup::create(Path::new(CGROUP2_ROOT), "act-weight-b");
    let state = tempfile::tempdir().unwrap();
    let mut act = actuator(state.path(), |_| {});
    let now = Instant::now();
    act.apply(&job_of(&a), &alloc(100, None, None, None), now)
        .expect("apply a");
    act.apply(&job_of(&b), &alloc(300, None, None, None), now)
        .expect("apply b");
    assert_eq!(trimmed(&b, "cpu.weight"), "300");
    let ctl = cgroups_rs::fs::cpu::CpuController::new(
        b.path().to_path_buf(),
        PathBuf::from(CGROUP2_ROOT),
        true,
    );
    assert_eq!(
        ctl.shares().expect("cgroups-rs reads cpu.weight on v2"),
        300
    );

    // Two busy processes per group, one of each group pinned to each vCPU: both vCPUs are
    // contended by both groups, and load balancing cannot pair a group's two processes on one CPU.
    let burners: Vec<Burner> = (0..4).map(|_| Burner::start()).collect();
    for (i, burner) in burners.iter().enumerate() {
        pin_to_cpu(burner.pid(), i / 2);
        if i % 2 == 0 { &a } else { &b }.add_pid(burner.pid());
    }
    let usage = |g: &TestCgroup| read_keyed(&g.path().join("cpu.stat"))["usage_usec"];
    let (a0, b0) = (usage(&a), usage(&b));
    sleep(Duration::from_secs(6));
    let (a1, b1) = (usage(&a) - a0, usage(&b) - b0);
    let ratio = b1 as f64 / a1.max(1) as f64;
    eprintln!(
        "weights 100 vs 300: a {:.2} s, b {:.2} s, b/a = {ratio:.2}",
        a1 as f64 / 1e6,
        b1 as f64 / 1e6
    );
    assert!(
        (2.4..=3.6).contains(&ratio),
        "CPU split b/a = {ratio:.2}, expected about 3 for weights 300:100"
    );

    act.restore_all();
    assert_eq!(trimmed(&b, "cpu.weight"), "100");
    let (a0, b0) = (usage(&a), usage(&b));
    sleep(Duration::from_secs(4));
    let ratio = (usage(&b) - b0) as f64 / (usage(&a) - a0).max(1) as f64;
    eprintln!("after restore: b/a = {ratio:.2}");
    assert!(
        (0.6..=1.6).contains(&ratio),
        "after restore the split b/a = {ratio:.2} is not even"
    );
    drop(burners);
}

#[test]
#[ignore = "vm: changes cgroup v2 limits; run with `cargo xtask vm-test vm_actuator`"]
fn vm_actuator_restores_after_a_simulated_crash() {
    require_vm();
    let group = TestCgroup::create(Path::new(CGROUP2_ROOT), "act-crash");
    group.write("cpu.max", "50000 100000");
    group.write("cpu.weight", "50");
    group.write("memory.high", &(512 * MIB).to_string());
    let job = job_of(&group);
    let state = tempfile::tempdir().unwrap();
    {
        let mut act = actuator(state.path(), |_| {});
        let out = act
            .apply(
                &job,
                &alloc(300, Some(0.2), Some(128 * MIB), None),
                Instant::now(),
            )
            .expect("apply");
        assert!(out.errors.is_empty(), "{:?}", out.errors);
        assert_eq!(out.written.len(), 3, "{:?}", out.written);
        // The governor crashes: the actuator is dropped without restoring anything.
    }
    assert_eq!(trimmed(&group, "cpu.max"), "20000 100000");
    assert_eq!(trimmed(&group, "cpu.weight"), "300");
    assert_eq!(trimmed(&group, "memory.high"), (128 * MIB).to_string());
    assert!(state.path().join("state.json").exists());

    let mut act = actuator(state.path(), |_| {});
    let report = act.recover();
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(report.restored.len(), 3, "{:?}", report.restored);
    assert_eq!(trimmed(&group, "cpu.max"), "50000 100000");
    assert_eq!(trimmed(&group, "cpu.weight"), "50");
    assert_eq!(trimmed(&group, "memory.high"), (512 * MIB).to_string());
    assert!(!state.path().join("state.json").exists());
}

/// Start the holder (see tests/src/bin/actuator_holder.rs) and wait for its first line.
fn start_holder(state: &Path, job: &JobCgroup) -> (Child, BufReader<std::process::ChildStdout>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_actuator_holder"))
        .arg(state)
        .arg(job.relative())
        .stdout(Stdio::piped())
        .spawn()
        .expect("cannot start actuator_holder");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).expect("holder output");
    assert!(line.starts_with("applied"), "holder said {line:?}");
    (child, out)
}

fn assert_holder_limits(group: &TestCgroup) {
    assert_eq!(trimmed(group, "cpu.max"), "25000 100000");
    assert_eq!(trimmed(group, "cpu.weight"), "321");
    assert_eq!(trimmed(group, "memory.high"), (256 * MIB).to_string());
}

fn assert_originals(group: &TestCgroup) {
    assert_eq!(trimmed(group, "cpu.max"), "max 100000");
    assert_eq!(trimmed(group, "cpu.weight"), "100");
    assert_eq!(trimmed(group, "memory.high"), "max");
}

#[test]
#[ignore = "vm: changes cgroup v2 limits; run with `cargo xtask vm-test vm_actuator`"]
fn vm_actuator_restores_on_sigterm_and_after_sigkill_and_restart() {
    require_vm();
    let group = TestCgroup::create(Path::new(CGROUP2_ROOT), "act-signals");
    let job = job_of(&group);
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.json");

    // SIGTERM: the process restores before exiting.
    let (mut child, mut out) = start_holder(&state, &job);
    assert_holder_limits(&group);
    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
    let status = child.wait().unwrap();
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    eprintln!("holder after SIGTERM: {status}, {rest:?}");
    assert!(status.success(), "holder failed on SIGTERM: {status}");
    assert!(rest.contains("SIGTERM: restored 3"), "{rest:?}");
    assert_originals(&group);
    assert!(!state.exists(), "state file left after a clean restore");

    // SIGKILL: nothing runs; the limits stay until the next start recovers them.
    let (mut child, _out) = start_holder(&state, &job);
    assert_holder_limits(&group);
    child.kill().unwrap();
    child.wait().unwrap();
    assert_holder_limits(&group);
    assert!(state.exists(), "the state file must survive a SIGKILL");
    let output = Command::new(env!("CARGO_BIN_EXE_actuator_holder"))
        .arg(&state)
        .arg(job.relative())
        .arg("--recover-only")
        .output()
        .expect("cannot run actuator_holder --recover-only");
    let said = String::from_utf8_lossy(&output.stdout);
    eprintln!("restart after SIGKILL: {said:?}");
    assert!(output.status.success(), "{output:?}");
    assert!(said.contains("recovered 3"), "{said:?}");
    assert_originals(&group);
    assert!(!state.exists());
}

#[test]
#[ignore = "vm: changes cgroup v2 limits; run with `cargo xtask vm-test vm_actuator`"]
fn vm_actuator_sees_drift_through_the_kernels_normalisation() {
    require_vm();
    let group = TestCgroup::create(Path::new(CGROUP2_ROOT), "act-drift");
    let job = job_of(&group);
    let state = tempfile::tempdir().unwrap();
    // A drift check on every call.
    let mut act = actuator(state.path(), |c| c.drift_check_interval_ms = 0);
    let t0 = Instant::now();
    act.apply(&job, &alloc(100, Some(0.3), None, None), t0)
        .unwrap();
    assert_eq!(trimmed(&group, "cpu.max"), "30000 100000");

    // Our own unaligned memory proposal reads back identical: no false drift.
    let high = 100 * MIB + 123;
    let a = alloc(100, Some(0.3), Some(high), None);
    act.apply(&job, &a, t0 + Duration::from_millis(10)).unwrap();
    let written_high = trimmed(&group, "memory.high");
    let out = act.apply(&job, &a, t0 + Duration::from_millis(20)).unwrap();
    assert!(out.drift.is_empty(), "false drift: {:?}", out.drift);
    assert_eq!(trimmed(&group, "memory.high"), written_high);

    // Someone writes "max" to cpu.max: the kernel stores "max 100000"; that is drift.
    group.write("cpu.max", "max");
    let t1 = t0 + Duration::from_millis(30);
    let out = act.apply(&job, &a, t1).unwrap();
    assert_eq!(out.drift.len(), 1, "{:?}", out.drift);
    assert_eq!(out.drift[0].theirs, "max 100000");
    let DriftAction::ReapplyAt(at) = out.drift[0].action else {
        panic!("gave up at the first overwrite")
    };
    assert_eq!(
        trimmed(&group, "cpu.max"),
        "max 100000",
        "not fought at once"
    );
    let out = act.apply(&job, &a, at).unwrap();
    assert!(
        out.written
            .iter()
            .any(|w| w.knob == Knob::CpuMax && w.value == "30000 100000"),
        "{:?}",
        out.written
    );
    // Someone's unaligned memory.high is stored rounded down to a page: still drift, read as stored.
    group.write("memory.high", &(200 * MIB + 5).to_string());
    let out = act.apply(&job, &a, at + Duration::from_millis(10)).unwrap();
    assert_eq!(out.drift.len(), 1, "{:?}", out.drift);
    assert_eq!(out.drift[0].theirs, (200 * MIB).to_string());

    let report = act.release(&job);
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(trimmed(&group, "cpu.max"), "max 100000");
    assert_eq!(
        trimmed(&group, "memory.high"),
        (200 * MIB).to_string(),
        "theirs kept"
    );
}

/// When the governor loop of [`run_guarded`] starts looking.
#[derive(Clone, Copy, PartialEq)]
enum GovernorStart {
    /// As soon as the job is started.
    Immediately,
    /// Only once the job has been throttled at memory.high (a governor whose tick comes late):
    /// the kernel alone stands between the job and memory.max meanwhile.
    AfterTheJobHitsMemoryHigh,
}

/// Run memhog in `group` (joined before exec, through the actuator's `prepare_command`) while a
/// governor loop applies `proposal` every 50 ms with fresh usage. Returns the child's status, the
/// peak usage, how many samples had a numeric memory.max, and the guard's verdicts.
fn run_guarded(
    group: &TestCgroup,
    act: &mut Actuator,
    memhog_args: &[&str],
    proposal: &Allocation,
    start: GovernorStart,
) -> (std::process::ExitStatus, u64, usize, Vec<GuardVerdict>) {
    let job = job_of(group);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_memhog"));
    cmd.args(memhog_args).stdout(Stdio::null());
    act.fs()
        .prepare_command(&job, &mut cmd)
        .expect("prepare_command");
    let mut child = cmd.spawn().expect("cannot start memhog");
    let in_group =
        std::fs::read_to_string(format!("/proc/{}/cgroup", child.id())).unwrap_or_default();
    assert_eq!(
        in_group.trim(),
        format!("0::{job}"),
        "memhog did not start inside its group"
    );
    if start == GovernorStart::AfterTheJobHitsMemoryHigh {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let events = read_keyed(&group.path().join("memory.events"));
            if events["high"] > 0 {
                let current = trimmed(group, "memory.current");
                eprintln!("throttled at memory.high: memory.current {current}, events {events:?}");
                // Give the kernel's throttling a moment to prove it holds the job below max.
                sleep(Duration::from_millis(500));
                let held: u64 = trimmed(group, "memory.current").parse().unwrap();
                let max: u64 = trimmed(group, "memory.max").parse().unwrap();
                eprintln!("0.5 s later: memory.current {held} (memory.max {max})");
                assert!(held < max, "not held below memory.max by throttling");
                break;
            }
            assert!(
                child.try_wait().unwrap().is_none(),
                "memhog ended before reaching memory.high"
            );
            assert!(
                Instant::now() < deadline,
                "memhog never reached memory.high"
            );
            sleep(Duration::from_millis(20));
        }
    }
    let deadline = Instant::now() + Duration::from_secs(240);
    let mut peak = 0;
    let mut limited_samples = 0;
    let mut verdicts = Vec::new();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "memhog did not finish in 240 s");
        let usage: CgroupUsage = act.usage(&job).expect("usage");
        peak = peak.max(usage.memory_current.unwrap_or(0));
        let out = act
            .apply_with_usage(&job, proposal, &usage, Instant::now())
            .expect("apply");
        assert!(out.errors.is_empty(), "{:?}", out.errors);
        verdicts.extend(out.guard);
        if trimmed(group, "memory.max") != "max" {
            limited_samples += 1;
        }
        sleep(Duration::from_millis(50));
    };
    (status, peak, limited_samples, verdicts)
}

#[test]
#[ignore = "vm: runs a memory-hungry job under memory limits; run with `cargo xtask vm-test vm_memory_guard`"]
fn vm_memory_guard_never_lets_a_growing_job_be_oom_killed() {
    require_vm();
    let group = TestCgroup::create(Path::new(CGROUP2_ROOT), "act-mem-grow");
    let _ = std::fs::write(group.path().join("memory.swap.max"), "0");
    let state = tempfile::tempdir().unwrap();
    let mut act = actuator(state.path(), |c| {
        c.memory_min_write_interval_ms = 200;
        c.memory_guard = MemoryGuardConfig {
            headroom_min_bytes: 16 * MIB,
            cooldown_ms: 2_000,
            ..MemoryGuardConfig::default()
        };
    });
    // A policy that wants the job squeezed to 32 MiB (high) / 48 MiB (max) while it grows to
    // 300 MiB, 4 MiB every 20 ms.
    let proposal = alloc(100, None, Some(32 * MIB), Some(48 * MIB));
    let (status, peak, limited, verdicts) = run_guarded(
        &group,
        &mut act,
        &["300", "1", "4", "20"],
        &proposal,
        GovernorStart::Immediately,
    );
    let events = read_keyed(&group.path().join("memory.events"));
    let raised = verdicts
        .iter()
        .filter(|v| **v == GuardVerdict::Raised)
        .count();
    let backoffs = verdicts
        .iter()
        .filter(|v| matches!(v, GuardVerdict::BackedOff { .. }))
        .count();
    eprintln!(
        "memhog 300 MiB under a 32/48 MiB proposal: {status}, peak {} MiB, {limited} samples with \
         a numeric memory.max, guard raised {raised}x, backed off {backoffs}x, memory.events {events:?}",
        peak / MIB
    );
    assert!(status.success(), "memhog failed: {status}");
    assert_eq!(
        events["oom_kill"], 0,
        "OOM kill under the governor: {events:?}"
    );
    assert_eq!(events["oom"], 0, "OOM under the governor: {events:?}");
    assert!(
        peak >= 250 * MIB,
        "memhog peaked at {} MiB only",
        peak / MIB
    );
    assert!(
        limited > 0,
        "memory.max was never set: the guard only ever lifted limits"
    );
    assert!(raised > 0, "the guard never raised the policy's proposal");

    let report = act.release(&job_of(&group));
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(trimmed(&group, "memory.max"), "max");
    assert_eq!(trimmed(&group, "memory.high"), "max");
}

#[test]
#[ignore = "vm: runs a memory-hungry job under memory limits; run with `cargo xtask vm-test vm_memory_guard`"]
fn vm_memory_guard_backs_off_when_a_burst_hits_memory_high() {
    require_vm();
    let group = TestCgroup::create(Path::new(CGROUP2_ROOT), "act-mem-burst");
    let _ = std::fs::write(group.path().join("memory.swap.max"), "0");
    let state = tempfile::tempdir().unwrap();
    let mut act = actuator(state.path(), |c| {
        c.memory_guard = MemoryGuardConfig {
            headroom_min_bytes: 16 * MIB,
            cooldown_ms: 2_000,
            ..MemoryGuardConfig::default()
        };
    });
    let proposal = alloc(100, None, Some(32 * MIB), Some(48 * MIB));
    // The limits are in place before the job starts.
    let job = job_of(&group);
    let usage = act.usage(&job).unwrap();
    act.apply_with_usage(&job, &proposal, &usage, Instant::now())
        .unwrap();
    assert_eq!(trimmed(&group, "memory.high"), (32 * MIB).to_string());
    assert_eq!(trimmed(&group, "memory.max"), (48 * MIB).to_string());
    // 200 MiB at once, far beyond both limits, and the governor's next look comes only after
    // the job has hit memory.high: the kernel must throttle the job there (not kill it at
    // memory.max) until the guard sees the `high` events and lifts the limits.
    let (status, peak, _, verdicts) = run_guarded(
        &group,
        &mut act,
        &["200", "1"],
        &proposal,
        GovernorStart::AfterTheJobHitsMemoryHigh,
    );
    let events = read_keyed(&group.path().join("memory.events"));
    let backoffs = verdicts
        .iter()
        .filter(|v| matches!(v, GuardVerdict::BackedOff { .. }))
        .count();
    eprintln!(
        "memhog 200 MiB burst under 32/48 MiB: {status}, peak {} MiB, backed off {backoffs}x, \
         memory.events {events:?}",
        peak / MIB
    );
    assert!(status.success(), "memhog failed: {status}");
    assert_eq!(
        events["oom_kill"], 0,
        "OOM kill under the governor: {events:?}"
    );
    assert!(
        events["high"] > 0,
        "the burst never reached memory.high: {events:?}"
    );
    assert!(backoffs > 0, "the guard never backed off: {verdicts:?}");
    assert!(
        peak >= 190 * MIB,
        "memhog peaked at {} MiB: did it run?",
        peak / MIB
    );
    act.release(&job);
}

#[test]
#[ignore = "vm: creates cgroups under /sys/fs/cgroup/governor.slice; run with `cargo xtask vm-test vm_actuator`"]
fn vm_actuator_job_group_runs_a_command_inside_and_is_removed() {
    require_vm();
    struct Cleanup;
    impl Drop for Cleanup {
        fn drop(&mut self) {
            for d in [
                "governor.slice/jobs/vm-run-job",
                "governor.slice/jobs",
                "governor.slice",
            ] {
                let _ = std::fs::remove_dir(Path::new(CGROUP2_ROOT).join(d));
            }
        }
    }
    let _cleanup = Cleanup;
    let state = tempfile::tempdir().unwrap();
    let mut act = actuator(state.path(), |_| {});
    let job = act
        .create_job_group("vm-run-job")
        .expect("create_job_group");
    let dir = Path::new(CGROUP2_ROOT).join("governor.slice/jobs/vm-run-job");
    assert!(dir.is_dir());
    for level in ["governor.slice", "governor.slice/jobs"] {
        let enabled = std::fs::read_to_string(
            Path::new(CGROUP2_ROOT)
                .join(level)
                .join("cgroup.subtree_control"),
        )
        .unwrap();
        for c in ["cpu", "memory", "pids"] {
            assert!(
                enabled.contains(c),
                "{c} not enabled in {level}: {enabled:?}"
            );
        }
    }
    let mut cmd = Command::new("/bin/sleep");
    cmd.arg("60");
    act.fs().prepare_command(&job, &mut cmd).unwrap();
    let mut child = cmd.spawn().expect("spawn sleep");
    let cg = std::fs::read_to_string(format!("/proc/{}/cgroup", child.id())).unwrap();
    assert_eq!(cg.trim(), "0::/governor.slice/jobs/vm-run-job");
    assert_eq!(act.fs().procs(&job), vec![child.id()]);

    let out = act
        .apply(&job, &alloc(200, Some(0.5), None, None), Instant::now())
        .unwrap();
    assert!(out.errors.is_empty(), "{:?}", out.errors);
    assert_eq!(
        std::fs::read_to_string(dir.join("cpu.max")).unwrap().trim(),
        "50000 100000"
    );
    let report = act.release(&job);

    assert_eq!(act.fs().signal_job_group(&job, Signal::SIGKILL).unwrap(), 1);
    let status = child.wait().unwrap();
    assert!(!status.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match act.fs().remove_job_group(&job) {
            Ok(()) => break,
            Err(e) if Instant::now() < deadline => {
                eprintln!("group not removable yet: {e}");
                sleep(Duration::from_millis(100));
            }
            Err(e) => panic!("job group not removed: {e}"),
        }
    }
    assert!(!dir.exists());
    // The restore of a released job's limits happened before removal.
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert!(
        report
            .restored
            .iter()
            .all(|(_, k, _)| matches!(k, Knob::CpuMax | Knob::CpuWeight))
    );
}
