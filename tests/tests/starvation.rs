//! No job is locked out, on the real kernel: three jobs started with `governor run-job` under the
//! real daemon and the `shortest-left` policy, two of them busy from the start, the third quiet at
//! first (loading data), pausing in the middle, or running more threads than the node has cores.
//! Once the third job wants CPU it must get some at once (its floor: within 1 s) and, 2-5 s
//! after, at least 3/4 of an equal split of what the three jobs get together: a demand
//! estimate fed on usage that the weight itself suppressed would keep such a job near 0 cores
//! for minutes. Both bounds are timed from the moment the job wanted CPU, which the
//! job itself records (a wall-clock timestamp written when its quiet phase ends), so a job
//! that gets CPU only seconds later fails.
//!
//! The policy serves jobs of unknown size least-attained-first in quanta
//! ([`ATTAINED_QUANTUM`]): a job that has had about as much CPU as the one being served waits
//! its turn, as a newcomer would, its pace guarded by its fair twin, not by the 2-5 s bound.
//! So the quiet job stays quiet until the busy jobs have each had clearly more than a quantum
//! more CPU than it (measured, not assumed from a duration: machines differ several-fold in
//! speed), and the bound asserts what the policy owes a job that has had the least: its fair
//! share within the probe.
//!
//! The same scenarios run on the host's cgroup v1 cpu controller (`root_host_v1_*`, run by
//! `cargo xtask test` on hybrid hosts as root) and on cgroup v2 in the VM (`vm_*`, run by
//! `cargo xtask vm-test starvation`). Each job is a shell script: busy loops (one per thread)
//! and a Keras-style CSV log whose loss falls by the same fraction for every 50 ms of CPU its
//! logging loop uses, so the policy sees every job learning at one pace per CPU-second,
//! whatever share it gets (a loss that fell with wall time would look fastest while the job
//! was held to its floor, and the job judged converged once served).
//!
//! Beside them, the two ways a job may ask the daemon to end it, which must reach a job however
//! it was started: finish at convergence (`run-job --finish`) and a sweep's trial budget
//! (`run-job --sweep`).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use governor_integration_tests::daemon::{Daemon, bin};
use governor_integration_tests::{Layout, require_v1_cpu_host, require_vm};
use governor_policy::shortest_left::ATTAINED_QUANTUM;

/// One phase of a job's script. The loss starts at 2.0 and loses 1/500 of itself a record, one
/// record for every 50 ms of CPU the logging loop (one of the job's threads) uses: a job
/// learning at the same pace per CPU-second throughout, as a real job's loss falls with the
/// work it does, not with the time it waits.
#[derive(Clone, Copy)]
enum Phase {
    /// `threads` busy loops for `secs` seconds, beside the loop that logs a falling loss.
    Busy { threads: u32, secs: u32 },
    /// Nothing at all for at least `secs` seconds (loading data, waiting for a file), and then
    /// until the test says the other jobs have had enough CPU more than this one ([`go_file`]).
    Quiet { secs: u32 },
}

/// Where a job's script records when it wants CPU again: one wall-clock timestamp (Unix
/// seconds) per quiet phase, written as the phase ends.
fn wants_file(log: &Path) -> PathBuf {
    log.with_extension("wants")
}

/// What a job's script creates as its quiet phase starts.
fn quiet_file(log: &Path) -> PathBuf {
    log.with_extension("quiet")
}

/// What the test creates to end a quiet phase (once past its `secs`).
fn go_file(log: &Path) -> PathBuf {
    log.with_extension("go")
}

/// What the test creates to end every busy phase of every job early (the busy jobs' phases
/// are bounded generously, since the quiet job's phase lasts as long as the machine needs).
fn stop_file(log: &Path) -> PathBuf {
    log.with_file_name("stop")
}

/// How much more CPU (CPU-seconds) each busy job must have had than the quiet one when it
/// wants CPU again: clearly more than the policy's quantum, so that least-attained-first
/// serves the quiet job first.
const AHEAD_BY: f64 = 1.5 * ATTAINED_QUANTUM;

/// The longest a quiet phase waits for the busy jobs to get [`AHEAD_BY`] ahead; a machine
/// that cannot do that in this long cannot measure the bound.
const GO_WAIT_MAX: u32 = 60;

fn script(log: &Path, phases: &[Phase]) -> String {
    let mut s = format!(
        "log='{}'\nwants='{}'\nquiet='{}'\ngo='{}'\nstop='{}'\necho epoch,loss > \"$log\"\nk=0\nv=2000000\n\
         ticks() {{ read -r l < /proc/$$/stat; set -- ${{l##*) }}; t=$((${{12}} + ${{13}})); }}\n\
         now() {{ read -r up _ < /proc/uptime; up=${{up%.*}}; }}\n",
        log.display(),
        wants_file(log).display(),
        quiet_file(log).display(),
        go_file(log).display(),
        stop_file(log).display(),
    );
    for p in phases {
        match *p {
            Phase::Quiet { secs } => {
                s.push_str(&format!(
                    "touch \"$quiet\"\nsleep {secs}\n\
                     n=0; while [ ! -e \"$go\" ] && [ $n -lt {} ]; do sleep 0.05; n=$((n + 1)); done\n\
                     date +%s.%N >> \"$wants\"\n",
                    GO_WAIT_MAX * 20
                ));
            }
            Phase::Busy { threads, secs } => {
                // Wall-clock bounds (or the test's stop file): a job held at its floor logs
                // slowly, but its phases end on time, so the scenario's timeline does not
                // depend on the policy (`now`: /proc/uptime, read without a fork). The
                // logging loop spins until this shell's own CPU time (`ticks`: utime + stime in
                // /proc/$$/stat, in 10 ms ticks) has grown by 5 ticks, then logs: records come
                // with the work done, whatever the job's share (a spin cut short by the phase's
                // end logs nothing: its record would claim the loss fell for less work).
                s.push_str(&format!(
                    "for t in $(seq {threads}); do timeout {secs} sh -c \"while [ ! -e '$stop' ]; do :; done\" & done\n\
                     now; end=$((up + {secs})); ticks; mark=$t\n\
                     running() {{ now; [ $up -lt $end ] && [ ! -e \"$stop\" ]; }}\n\
                     while running; do \
                     while ticks; [ $t -lt $((mark + 5)) ] && running; do :; done; \
                     [ $t -lt $((mark + 5)) ] && continue; mark=$t; \
                     echo \"$k,$((v / 1000000)).$(printf %06d $((v % 1000000)))\" >> \"$log\"; \
                     v=$((v - v / 500)); k=$((k + 1)); done\n\
                     wait\n"
                ));
            }
        }
    }
    s
}

struct Job {
    name: String,
    layout: Layout,
    child: Child,
}

impl Job {
    /// Waits up to `limit` for the job to end on its own (its busy loops are bounded).
    fn wait_for_end(&mut self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return true;
            }
            sleep(Duration::from_millis(100));
        }
        false
    }
}

impl Drop for Job {
    /// A job that has not ended (a failed assertion) is stopped with everything in its group,
    /// so that run-job removes the group and no busy loop outlives the test.
    fn drop(&mut self) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        for pid in self.layout.job_pids(&self.name) {
            if pid != self.child.id() {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
        if !self.wait_for_end(Duration::from_secs(5)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Creates the stop file when dropped: every busy phase ends within a second.
struct StopOnDrop(PathBuf);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        let _ = fs::write(&self.0, b"");
    }
}

fn start_job(d: &Daemon, layout: Layout, name: &str, phases: &[Phase]) -> Job {
    let log = d.dir.path().join(format!("{name}.csv"));
    let child = d
        .run_job(name, &log)
        .args(["--", "sh", "-c", &script(&log, phases)])
        .spawn()
        .expect("governor run-job");
    Job {
        name: name.to_owned(),
        layout,
        child,
    }
}

/// CPU time of each job, sampled every 100 ms.
struct Samples {
    at: Vec<f64>,
    cpu: Vec<[f64; 3]>,
}

/// Samples further apart than this mean the sampler itself was held up (an overloaded machine
/// stalls the test as much as the jobs): the shares in between were not measured.
const SAMPLER_GAP: f64 = 0.5;

impl Samples {
    /// The cores each job used between `from` and `to` seconds, or why they were not measured:
    /// no sample within [`SAMPLER_GAP`] of either end, or a gap wider than it in between.
    fn rates(&self, from: f64, to: f64) -> Result<[f64; 3], String> {
        let inside: Vec<usize> = (0..self.at.len())
            .filter(|&k| self.at[k] >= from && self.at[k] <= to)
            .collect();
        let (Some(&i), Some(&j)) = (inside.first(), inside.last()) else {
            return Err(format!("no sample between {from:.1} s and {to:.1} s"));
        };
        let mut edges = vec![from];
        edges.extend(inside.iter().map(|&k| self.at[k]));
        edges.push(to);
        if let Some(w) = edges.windows(2).find(|w| w[1] - w[0] > SAMPLER_GAP) {
            return Err(format!(
                "the sampler was held up from {:.2} s to {:.2} s (between {from:.1} s and {to:.1} s)",
                w[0], w[1]
            ));
        }
        let dt = self.at[j] - self.at[i];
        Ok(std::array::from_fn(|k| {
            (self.cpu[j][k] - self.cpu[i][k]) / dt
        }))
    }
}

/// Runs busy jobs `a` and `b` beside `q` (whose phases hold one quiet phase) and checks that q,
/// from the moment it wants CPU again (the timestamp its script records as its quiet phase
/// ends), gets its floor within 1 s and at least 3/4 of an equal split of what the three jobs
/// get from 2 s to 5 s after (the 1/4 margin is this shared machine's noise: other processes
/// take CPU from all three alike, so the split is measured, not assumed).
/// One scenario at a time, whatever libtest's thread count: each measures shares of the whole
/// machine, and every daemon adopts every job under governor.slice. Dropped last, it also
/// removes the governor subtree the scenario's jobs left empty.
struct Alone(#[allow(dead_code)] std::sync::MutexGuard<'static, ()>);

fn alone() -> Alone {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    Alone(
        ONE_AT_A_TIME
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    )
}

impl Drop for Alone {
    fn drop(&mut self) {
        governor_integration_tests::remove_empty_governor_subtree();
    }
}

fn no_lockout(layout: Layout, prefix: &str, q_phases: &[Phase]) {
    // A scenario whose shares were not measured (the machine stalled the sampler) runs once
    // more; a second such run fails, since this machine cannot measure the bound.
    for attempt in 1..=2 {
        match one_scenario(layout, prefix, q_phases) {
            Ok(()) => return,
            Err(why) if attempt == 1 => {
                eprintln!("{prefix}: not measured ({why}); running the scenario again")
            }
            Err(why) => panic!("{prefix}: not measured twice, the last time: {why}"),
        }
    }
}

/// One run of a [`no_lockout`] scenario: `Err` when the shares could not be measured, a panic
/// when they were and q was held back.
fn one_scenario(layout: Layout, prefix: &str, q_phases: &[Phase]) -> Result<(), String> {
    let _alone = alone();
    let mut d = Daemon::configure("shortest-left", "");
    d.spawn();
    let total: u32 = q_phases
        .iter()
        .map(|p| match *p {
            Phase::Busy { secs, .. } | Phase::Quiet { secs } => secs,
        })
        .sum();
    // a and b run until the test stops them (bounded, should it not): q's quiet phase lasts
    // as long as they need to get ahead of it.
    let busy = [Phase::Busy {
        threads: 2,
        secs: total + 4 + GO_WAIT_MAX,
    }];
    let mut jobs = [
        start_job(&d, layout, &format!("{prefix}-a"), &busy),
        start_job(&d, layout, &format!("{prefix}-b"), &busy),
        start_job(&d, layout, &format!("{prefix}-q"), q_phases),
    ];
    let start = Instant::now();
    let start_wall = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let mut samples = Samples {
        at: Vec::new(),
        cpu: Vec::new(),
    };
    let q_log = d.dir.path().join(format!("{prefix}-q.csv"));
    // When q wanted CPU: its own timestamp (written as its quiet phase ends), on the samples'
    // clock. Sampled until 5 s after it.
    let wants = wants_file(&q_log);
    let stamps = || -> Vec<f64> {
        fs::read_to_string(&wants)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    };
    // Stops the busy jobs however this scenario ends.
    let stop = StopOnDrop(stop_file(&q_log));
    let mut wanted: Option<f64> = None;
    // The CPU each job had when the test let q want CPU again.
    let mut at_go: Option<[f64; 3]> = None;
    while start.elapsed() < Duration::from_secs(u64::from(total + 4 + GO_WAIT_MAX)) {
        let now = start.elapsed().as_secs_f64();
        if wanted.is_some_and(|w| now > w + 5.2) {
            break;
        }
        let cpu: [Option<f64>; 3] = std::array::from_fn(|k| layout.job_cpu_seconds(&jobs[k].name));
        if let [Some(a), Some(b), Some(q)] = cpu {
            samples.at.push(now);
            samples.cpu.push([a, b, q]);
            if at_go.is_none() && quiet_file(&q_log).exists() && a.min(b) - q >= AHEAD_BY {
                fs::write(go_file(&q_log), b"").expect("go file");
                at_go = Some([a, b, q]);
            }
        }
        if wanted.is_none() {
            wanted = stamps().first().map(|stamp| stamp - start_wall);
        }
        sleep(Duration::from_millis(100));
    }
    let Some(at_go) = at_go else {
        return Err(format!(
            "a and b did not get {AHEAD_BY} CPU-s ahead of q within {GO_WAIT_MAX} s of its quiet phase"
        ));
    };
    let status = d.status_json();
    let stamps = stamps();
    let &[stamp] = stamps.as_slice() else {
        panic!(
            "{prefix}: q should have recorded once when it wanted CPU, in {}: {stamps:?}",
            wants.display()
        )
    };
    let wanted = stamp - start_wall;
    let floor = samples.rates(wanted, wanted + 1.0)?;
    let settled = samples.rates(wanted + 2.0, wanted + 5.0)?;
    let equal = settled.iter().sum::<f64>() / 3.0;
    eprintln!(
        "{prefix}: q wanted CPU at {wanted:.2} s (CPU-s then: {at_go:.1?}); first second {floor:.2?} cores; from 2 s to 5 s after {settled:.2?} (equal split {equal:.2})"
    );
    assert!(
        floor[2] >= 0.05,
        "{prefix}: q got {:.3} cores in its first second of wanting CPU (its floor at once)\nstatus {status:?}\n{}",
        floor[2],
        d.log_tail()
    );
    assert!(
        settled[2] >= 0.75 * equal,
        "{prefix}: q got {:.2} cores 2-5 s after wanting CPU, under 3/4 of an equal split ({equal:.2}); \
         all: {settled:.2?}\nstatus {status:?}\n{}",
        settled[2],
        d.log_tail()
    );
    drop(stop);
    for job in &mut jobs {
        assert!(
            job.wait_for_end(Duration::from_secs(30)),
            "{}: did not end on its own",
            job.name
        );
    }
    drop(jobs);
    d.terminate();
    Ok(())
}

fn quiet_first(layout: Layout, prefix: &str) {
    no_lockout(
        layout,
        prefix,
        &[
            Phase::Quiet { secs: 8 },
            Phase::Busy {
                threads: 2,
                secs: 10,
            },
        ],
    );
}

fn pause_in_the_middle(layout: Layout, prefix: &str) {
    no_lockout(
        layout,
        prefix,
        &[
            Phase::Busy {
                threads: 2,
                secs: 6,
            },
            Phase::Quiet { secs: 8 },
            Phase::Busy {
                threads: 2,
                secs: 10,
            },
        ],
    );
}

fn more_threads_than_cores(layout: Layout, prefix: &str) {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get() as u32);
    no_lockout(
        layout,
        prefix,
        &[
            Phase::Quiet { secs: 6 },
            Phase::Busy {
                threads: 2 * cores,
                secs: 10,
            },
        ],
    );
}

fn host() -> Layout {
    require_v1_cpu_host();
    Layout::HostV1
}

#[test]
#[ignore = "root-host: runs the daemon on the host's cgroup v1 cpu controller (root, a hybrid host); `cargo xtask test` runs it where it can"]
fn root_host_v1_a_job_quiet_at_first_is_not_locked_out() {
    quiet_first(host(), "starve-v1-quiet");
}

#[test]
#[ignore = "root-host: runs the daemon on the host's cgroup v1 cpu controller (root, a hybrid host); `cargo xtask test` runs it where it can"]
fn root_host_v1_a_job_that_pauses_is_not_locked_out() {
    pause_in_the_middle(host(), "starve-v1-pause");
}

#[test]
#[ignore = "root-host: runs the daemon on the host's cgroup v1 cpu controller (root, a hybrid host); `cargo xtask test` runs it where it can"]
fn root_host_v1_a_job_with_more_threads_than_cores_is_not_locked_out() {
    more_threads_than_cores(host(), "starve-v1-threads");
}

#[test]
#[ignore = "vm: runs the daemon against real cgroups; run with `cargo xtask vm-test starvation`"]
fn vm_a_job_quiet_at_first_is_not_locked_out() {
    require_vm();
    quiet_first(Layout::V2, "starve-v2-quiet");
}

#[test]
#[ignore = "vm: runs the daemon against real cgroups; run with `cargo xtask vm-test starvation`"]
fn vm_a_job_that_pauses_is_not_locked_out() {
    require_vm();
    pause_in_the_middle(Layout::V2, "starve-v2-pause");
}

#[test]
#[ignore = "vm: runs the daemon against real cgroups; run with `cargo xtask vm-test starvation`"]
fn vm_a_job_with_more_threads_than_cores_is_not_locked_out() {
    require_vm();
    more_threads_than_cores(Layout::V2, "starve-v2-threads");
}

/// Finish at convergence, end to end: a job started with `run-job --finish 3:0.001` whose loss
/// stops improving is stopped by the daemon (SIGINT to its group) long before its script would
/// end, while a job that did not ask for it and logs the same flat loss keeps running. Both are
/// started with SIGINT ignored, as from `governor run-job ... &` in a script: the job that asked
/// must still get the SIGINT (not sit it out until the SIGTERM 30 s later).
fn finish_at_convergence(layout: Layout, prefix: &str) {
    let _alone = alone();
    let mut d = Daemon::configure("shortest-left", "");
    d.spawn();
    // 30 s of a loss that falls for 2 s, then stays flat.
    let script = |log: &Path| {
        format!(
            "log='{}'\necho epoch,loss > \"$log\"\nk=0\nend=$(($(date +%s) + 30))\n\
             while [ $(date +%s) -lt $end ]; do v=$((k < 10 ? 20 - k : 10)); \
             echo \"$k,$((v / 10)).$((v % 10))\" >> \"$log\"; k=$((k + 1)); sleep 0.2; done\n",
            log.display()
        )
    };
    let start = |name: &str, finish: Option<&str>| {
        let log = d.dir.path().join(format!("{name}.csv"));
        let opts: Vec<&str> = finish.map(|r| vec!["--finish", r]).unwrap_or_default();
        start_ignoring_sigint(&d, layout, name, &log, &opts, &script(&log))
    };
    let started = Instant::now();
    let mut asked = start(&format!("{prefix}-asked"), Some("3:0.001"));
    let mut other = start(&format!("{prefix}-other"), None);
    let stopped = asked.wait_for_end(Duration::from_secs(20));
    let took = started.elapsed();
    let other_running = matches!(other.child.try_wait(), Ok(None));
    let log = d.log_text();
    assert!(
        stopped,
        "{prefix}: the job that asked to finish at convergence still runs after 20 s\n{}",
        d.log_tail()
    );
    assert!(
        log.contains("converged: stopping the job as it asked"),
        "{prefix}: the daemon did not say why it stopped the job\n{}",
        d.log_tail()
    );
    assert!(
        other_running,
        "{prefix}: the job that did not ask was stopped too\n{}",
        d.log_tail()
    );
    eprintln!("{prefix}: stopped after {took:?}; the other job still runs");
    assert!(other.wait_for_end(Duration::from_secs(30)));
    drop((asked, other));
    d.terminate();
}

/// `governor run-job NAME --log LOG OPTS -- sh -c SCRIPT` under `d`, started with SIGINT
/// ignored, as from `governor run-job ... &` in a script: a job that asked the daemon to stop
/// it (`--finish`, `--sweep`) must still get the daemon's SIGINT.
fn start_ignoring_sigint(
    d: &Daemon,
    layout: Layout,
    name: &str,
    log: &Path,
    opts: &[&str],
    script: &str,
) -> Job {
    let mut c = Command::new(bin("governor"));
    c.args(["run-job", "--name", name, "--log"])
        .arg(log)
        .arg("--socket")
        .arg(&d.socket)
        .args(opts);
    // SAFETY: between fork and exec, only signal(2), which is async-signal-safe.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut c, || {
            libc::signal(libc::SIGINT, libc::SIG_IGN);
            Ok(())
        });
    }
    Job {
        name: name.to_owned(),
        layout,
        child: c
            .args(["--", "sh", "-c", script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("governor run-job"),
    }
}

/// A sweep's trial budget, end to end: three trials started with `run-job --sweep t:3:2
/// --epochs 60`, each logging a Keras CSV row every 0.3 s (its validation loss at its own
/// level: the trial named `best` lowest). Once all three have done 2 epochs (the first rung),
/// only the best third goes on: the daemon stops the other two (SIGINT to their groups) long
/// before their scripts would end (18 s), and says why; the best trial runs all its 60 epochs.
fn sweep_cuts_its_worst_trials(layout: Layout, prefix: &str) {
    let _alone = alone();
    let mut d = Daemon::configure("shortest-left", "");
    d.spawn();
    let script = |log: &Path, level: u32| {
        format!(
            "log='{}'\necho epoch,loss,val_loss > \"$log\"\nk=0\n\
             while [ $k -lt 60 ]; do echo \"$k,{level}.5,{level}.$((90 - k))\" >> \"$log\"; \
             k=$((k + 1)); sleep 0.3; done\n",
            log.display()
        )
    };
    let start = |trial: &str, level: u32| {
        let name = format!("{prefix}-{trial}");
        let log = d.dir.path().join(format!("{name}.csv"));
        let opts = ["--sweep", "t:3:2", "--epochs", "60"];
        (
            start_ignoring_sigint(&d, layout, &name, &log, &opts, &script(&log, level)),
            log,
        )
    };
    let started = Instant::now();
    let (mut worst, _) = start("worst", 3);
    let (mut middle, _) = start("middle", 2);
    let (mut best, best_log) = start("best", 1);
    let cut =
        worst.wait_for_end(Duration::from_secs(12)) && middle.wait_for_end(Duration::from_secs(2));
    let took = started.elapsed();
    let best_running = matches!(best.child.try_wait(), Ok(None));
    assert!(
        cut,
        "{prefix}: the outranked trials still run after {took:?}\n{}",
        d.log_tail()
    );
    assert!(
        d.log_text().contains("outranked in its sweep"),
        "{prefix}: the daemon did not say why it stopped the trials\n{}",
        d.log_tail()
    );
    assert!(
        best_running,
        "{prefix}: the best trial was stopped too\n{}",
        d.log_tail()
    );
    eprintln!("{prefix}: two trials cut after {took:?}; the best runs on");
    assert!(best.wait_for_end(Duration::from_secs(60)));
    let rows = fs::read_to_string(&best_log).unwrap().lines().count();
    assert_eq!(rows, 61, "{prefix}: the best trial logged all its epochs");
    drop((worst, middle, best));
    d.terminate();
}

#[test]
#[ignore = "root-host: runs the daemon on the host's cgroup v1 cpu controller (root, a hybrid host); `cargo xtask test` runs it where it can"]
fn root_host_v1_a_sweep_stops_its_outranked_trials() {
    sweep_cuts_its_worst_trials(host(), "sweep-v1");
}

#[test]
#[ignore = "vm: runs the daemon against real cgroups; run with `cargo xtask vm-test starvation`"]
fn vm_a_sweep_stops_its_outranked_trials() {
    require_vm();
    sweep_cuts_its_worst_trials(Layout::V2, "sweep-v2");
}

#[test]
#[ignore = "root-host: runs the daemon on the host's cgroup v1 cpu controller (root, a hybrid host); `cargo xtask test` runs it where it can"]
fn root_host_v1_a_job_that_asked_is_stopped_once_converged() {
    finish_at_convergence(host(), "finish-v1");
}

#[test]
#[ignore = "vm: runs the daemon against real cgroups; run with `cargo xtask vm-test starvation`"]
fn vm_a_job_that_asked_is_stopped_once_converged() {
    require_vm();
    finish_at_convergence(Layout::V2, "finish-v2");
}
