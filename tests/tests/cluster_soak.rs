//! The random-fault soak of the replicated control plane (issue 34): three coordinator replicas
//! (the real binary) on a real three-member etcd cluster on loopback, three real `governor`
//! daemons (dry-run, each on a fake cgroup root, each reaching the replicas through relays the
//! soak can cut), and real jobs: shell trainers that log a deterministic loss per step, save
//! their step on SIGUSR1 and resume from it. While jobs are submitted and moved, the soak injects
//! random faults of the kinds the issue lists: the leader killed (also in the middle of a
//! move), the leader paused past its lease and resumed, an etcd member killed, a node cut off
//! for a moment, and a move's target cut off past the fence's bound and back. Then it heals
//! everything and checks:
//! - every job completed, exactly once (one `done` in its log, `completed` at the coordinator);
//! - every job's loss curve equals the curve of the same trainer run once without moving;
//! - no job ever ran on two nodes at once: by the job's own log (no two processes' lines
//!   interleave) and by the machine's process list, sampled every 50 ms during the whole soak.
//!
//! `a_short_soak_of_random_faults_loses_no_job_and_runs_none_twice` (each kind of fault once)
//! runs in `cargo xtask test`; `cargo xtask soak [--faults N] [--seed S]` runs the long one
//! (`soak_random_faults`, 36 faults by default).

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use coordinator::cli::Client;
use coordinator::etcd::EtcdConfig;
use coordinator::store::etcd::leader_key;
use governor::cgroup::fake::FakeCgroupRoot;
use governor::coordinator_client::TlsFiles;
use governor_integration_tests::daemon::Daemon;
use governor_integration_tests::etcd::EtcdCluster;
use governor_integration_tests::poll_until;
use governor_integration_tests::proxy::CutProxy;
use governor_integration_tests::replica::Replica;
use governor_proto::control::{JobSpec, JobState, MovePhase, NodeState};

/// The coordinator's timeouts in the soak: a node is lost after 3 s of silence; a lost move
/// target is given up 5 s later (the fence's bound is then (3 + 5) / 2 = 4 s).
const LOST_AFTER_S: f64 = 3.0;
const LOST_TARGET_WAIT_S: f64 = 5.0;
/// Each replica's leader lease.
const LEASE_TTL_S: u64 = 2;
/// Jobs running at once while faults are injected, and each job's length.
const CONCURRENT_JOBS: usize = 4;
const STEPS: u32 = 80;
const STEP_PAUSE: &str = "0.25";
/// What marks a trainer's process (its `$0`).
const MARK: &str = "soak-job-";

/// A small deterministic generator (xorshift64*): the soak's faults from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn secs(&mut self, lo: f64, hi: f64) -> Duration {
        Duration::from_secs_f64(lo + (hi - lo) * (self.next() % 1000) as f64 / 1000.0)
    }
}

/// The trainer: resumes from its checkpoint's step, logs `step=N loss=L pid=P` for each step
/// (the loss a function of the step alone, as a seeded run's), saves its step on SIGUSR1 and
/// exits 0, and logs `done` after the last step. No command substitution and no subshell: each
/// copy is one `sh` process (its `sleep` children are told apart by their parent).
fn trainer_script(ckpt: &Path, log: &Path, pause: &str) -> String {
    format!(
        "c={c}; l={l}; step=0; \
         if [ -f $c/step ]; then read step < $c/step; fi; \
         echo \"start pid=$$ from=$step\" >> $l; \
         trap 'mkdir -p $c; echo $step > $c/step.tmp; mv $c/step.tmp $c/step; echo \"saved pid=$$ step=$step\" >> $l; exit 0' USR1; \
         while [ $step -lt {STEPS} ]; do \
           next=$((step + 1)); \
           echo \"step=$next loss=$((1000000 / (next * next + 7 * next + 10))) pid=$$\" >> $l; \
           step=$next; \
           sleep {pause}; \
         done; \
         echo \"done pid=$$ step=$step\" >> $l",
        c = ckpt.display(),
        l = log.display(),
    )
}

/// One node: the real daemon, and its relay to each replica.
struct Node {
    name: String,
    daemon: Daemon,
    relays: Vec<CutProxy>,
    cut: bool,
}

impl Node {
    fn cut(&mut self) {
        for r in &self.relays {
            r.cut();
        }
        self.cut = true;
    }
    fn heal(&mut self) {
        for r in &self.relays {
            r.heal();
        }
        self.cut = false;
    }
}

struct SoakJob {
    name: String,
    id: String,
    log: PathBuf,
}

/// Two copies of one job seen alive at once by the process-list sampler.
#[derive(Debug)]
struct Overlap {
    job: String,
    pids: Vec<u32>,
}

/// Sample the process list every 50 ms until `stop`: every trainer copy alive, by job.
fn watch_processes(stop: Arc<AtomicBool>, overlaps: Arc<Mutex<Vec<Overlap>>>) {
    while !stop.load(Ordering::SeqCst) {
        let mut copies: BTreeMap<String, Vec<(u32, u32)>> = BTreeMap::new();
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|p| p.parse::<u32>().ok())
            else {
                continue;
            };
            let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
                continue;
            };
            let args: Vec<&[u8]> = cmdline
                .split(|b| *b == 0)
                .filter(|a| !a.is_empty())
                .collect();
            let Some(job) = args
                .last()
                .and_then(|a| std::str::from_utf8(a).ok())
                .and_then(|a| a.strip_prefix(MARK))
            else {
                continue;
            };
            // The shell itself, not its supervisor (whose command line ends the same).
            let comm = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
            if comm.trim() != "sh" {
                continue;
            }
            let ppid = std::fs::read_to_string(entry.path().join("stat"))
                .ok()
                .and_then(|s| {
                    let after = s.rsplit_once(')')?.1.to_owned();
                    after.split_whitespace().nth(1)?.parse().ok()
                })
                .unwrap_or(0);
            copies.entry(job.to_owned()).or_default().push((pid, ppid));
        }
        for (job, procs) in copies {
            let pids: BTreeSet<u32> = procs.iter().map(|(p, _)| *p).collect();
            // A fork about to exec `sleep` is the shell's child: not a copy.
            let roots: Vec<u32> = procs
                .iter()
                .filter(|(_, ppid)| !pids.contains(ppid))
                .map(|(p, _)| *p)
                .collect();
            if roots.len() > 1 {
                overlaps.lock().unwrap().push(Overlap { job, pids: roots });
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

struct Soak {
    rt: tokio::runtime::Runtime,
    dir: tempfile::TempDir,
    etcd: EtcdCluster,
    etcd_config: EtcdConfig,
    replicas: Vec<Replica>,
    nodes: Vec<Node>,
    addresses: String,
    jobs: Vec<SoakJob>,
    rng: Rng,
    /// What was done, in order (printed with any failure).
    record: Vec<String>,
    started: Instant,
    /// Moves whose target was cut off after it had been handed the start (it fences the job,
    /// or the job ends there on its own first).
    fenced_moves: usize,
}

impl Soak {
    fn start(seed: u64) -> Option<Soak> {
        let etcd = EtcdCluster::start(3)?;
        let dir = tempfile::tempdir().unwrap();
        let names: Vec<String> = (1..=3).map(|i| format!("node-{i}")).collect();
        let name_refs: Vec<&str> = names.iter().map(String::as_str).collect();
        governor_integration_tests::loopback_certs(dir.path(), &name_refs);
        for sub in ["logs", "ckpt"] {
            std::fs::create_dir_all(dir.path().join(sub)).unwrap();
        }
        let etcd_config = EtcdConfig {
            lease_ttl_s: LEASE_TTL_S,
            ..etcd.config()
        };
        let state = format!(
            "lost_after_s = {LOST_AFTER_S:?}\nlost_target_wait_s = {LOST_TARGET_WAIT_S:?}\n\
             resync_grace_s = 3.0\nsave_timeout_s = 15.0\nmove_confirm_s = 2.0\nauto_move = false\n"
        );
        let listens: Vec<SocketAddr> = (0..3)
            .map(|_| SocketAddr::from(([127, 0, 0, 1], governor_integration_tests::free_port())))
            .collect();
        let replicas: Vec<Replica> = listens
            .iter()
            .enumerate()
            .map(|(i, l)| {
                Replica::start(
                    dir.path(),
                    &format!("replica-{i}"),
                    *l,
                    &etcd_config,
                    &state,
                )
            })
            .collect();
        let addresses = listens
            .iter()
            .map(SocketAddr::to_string)
            .collect::<Vec<_>>()
            .join(",");
        let mut nodes = Vec::new();
        for name in &names {
            let relays: Vec<CutProxy> = listens.iter().map(|l| CutProxy::start(*l)).collect();
            let through = relays
                .iter()
                .map(|r| r.addr.to_string())
                .collect::<Vec<_>>()
                .join(",");
            let root = dir.path().join(format!("{name}-cgroup"));
            std::fs::create_dir(&root).unwrap();
            FakeCgroupRoot::unified(&root);
            let out = dir.path().join(format!("{name}-output"));
            let mut daemon = Daemon::configure(
                "fair",
                &format!(
                    "cgroup_root = \"{}\"\n[node]\ncores = 4.0\n[discovery]\nenvironment = false\n\
                     [coordinator]\nallow_root_jobs = true\njob_output_dir = \"{}\"\nstop_grace = \"2s\"\n",
                    root.display(),
                    out.display()
                ),
            );
            daemon.extra_args = vec![
                "--dry-run".into(),
                "--node-name".into(),
                name.clone(),
                "--coordinator".into(),
                through,
                "--certs".into(),
                dir.path().display().to_string(),
            ];
            daemon.spawn();
            nodes.push(Node {
                name: name.clone(),
                daemon,
                relays,
                cut: false,
            });
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let soak = Soak {
            rt,
            dir,
            etcd,
            etcd_config,
            replicas,
            nodes,
            addresses,
            jobs: Vec::new(),
            rng: Rng(seed.max(1)),
            record: Vec::new(),
            started: Instant::now(),
            fenced_moves: 0,
        };
        soak.wait("every node ready", Duration::from_secs(60), |s| {
            let nodes = s.call(|mut c| async move { c.nodes().await })?;
            (nodes
                .iter()
                .filter(|n| n.status == NodeState::Ready)
                .count()
                == 3)
                .then_some(())
        });
        Some(soak)
    }

    fn note(&mut self, what: String) {
        let line = format!("{:7.1} s  {what}", self.started.elapsed().as_secs_f64());
        eprintln!("soak: {line}");
        self.record.push(line);
    }

    /// One `govctl` call to whichever replica leads; `None` if none answers it now.
    fn call<T, F>(&self, f: impl FnOnce(Client) -> F) -> Option<T>
    where
        F: std::future::Future<Output = anyhow::Result<T>>,
    {
        self.try_call(f).ok()
    }

    /// [`Soak::call`], with why it failed.
    fn try_call<T, F>(&self, f: impl FnOnce(Client) -> F) -> Result<T, String>
    where
        F: std::future::Future<Output = anyhow::Result<T>>,
    {
        let admin = TlsFiles::in_dir(self.dir.path(), "admin");
        let limit = Duration::from_secs(5);
        self.rt.block_on(async {
            let client =
                tokio::time::timeout(limit, Client::connect(&self.addresses, Some(&admin)))
                    .await
                    .map_err(|_| "no replica answered within 5 s".to_owned())?
                    .map_err(|e| format!("{e:#}"))?;
            tokio::time::timeout(limit, f(client))
                .await
                .map_err(|_| "no answer within 5 s".to_owned())?
                .map_err(|e| format!("{e:#}"))
        })
    }

    /// Poll `f` every 200 ms until it answers ([`poll_until`]); past `within`, fail showing
    /// the soak's record and logs.
    fn wait<T>(&self, what: &str, within: Duration, mut f: impl FnMut(&Soak) -> Option<T>) -> T {
        poll_until(
            what,
            within,
            Duration::from_millis(200),
            || f(self),
            || self.context(),
        )
    }

    fn fail(&self, why: &str) -> ! {
        panic!("{why}\n{}", self.context());
    }

    /// What a failure shows: the soak's record, each replica's decisions and warnings, each
    /// daemon's log tail.
    fn context(&self) -> String {
        let mut logs = String::new();
        for r in &self.replicas {
            // Its decisions about jobs and moves, and its warnings, all of them.
            let log = r.log();
            logs.push_str(&format!("--- replica {}\n", r.listen));
            for l in log.lines().filter(|l| {
                ["job status", "move", "WARN", "ERROR", "leader"]
                    .iter()
                    .any(|k| l.contains(k))
            }) {
                logs.push_str(l);
                logs.push('\n');
            }
        }
        for n in &self.nodes {
            logs.push_str(&format!("--- {}\n{}\n", n.name, n.daemon.log_tail()));
        }
        format!(
            "the soak so far:\n{}\n{logs}(etcd's logs in {})",
            self.record.join("\n"),
            self.etcd.log_dir().display()
        )
    }

    /// The replica that holds the leader key now.
    fn leader(&self) -> Option<usize> {
        let key = leader_key(&self.etcd_config.prefix);
        let value = self
            .rt
            .block_on(self.etcd.client().get(&key))
            .ok()
            .flatten()?;
        let value = String::from_utf8_lossy(&value.value).into_owned();
        self.replicas
            .iter()
            .position(|r| value.ends_with(&r.listen.to_string()))
    }

    /// [`Soak::leader`], noting when none holds the key.
    fn leader_or_note(&mut self) -> Option<usize> {
        let l = self.leader();
        if l.is_none() {
            self.note("no leader to fault: none holds the key now".into());
        }
        l
    }

    /// Submit the next job; by name, so that a submission whose answer was lost is not made
    /// twice.
    fn submit(&mut self) {
        let n = self.jobs.len();
        let name = format!("train{n:02}");
        let log = self.dir.path().join("logs").join(format!("{name}.log"));
        let ckpt = self.dir.path().join("ckpt").join(&name);
        let mut spec = JobSpec::new(
            &name,
            vec![
                "/bin/sh".into(),
                "-c".into(),
                trainer_script(&ckpt, &log, STEP_PAUSE),
                format!("{MARK}{name}"),
            ],
            log.display().to_string(),
        );
        spec.cores = Some(1.0);
        spec.checkpoint = Some(governor_proto::node::Checkpoint {
            dir: ckpt.display().to_string(),
            save_signal: 10,
            carry: false,
            transparent: false,
        });
        let id = self.wait(&format!("{name} submitted"), Duration::from_secs(60), |s| {
            if let Some(id) = s.find_job(&name) {
                return Some(id);
            }
            let spec = spec.clone();
            s.call(|mut c| async move { c.submit(spec).await.map(|j| j.id) })
        });
        self.note(format!("submitted {name} as {id}"));
        self.jobs.push(SoakJob { name, id, log });
    }

    fn find_job(&self, name: &str) -> Option<String> {
        let jobs = self.call(|mut c| async move { c.jobs(true).await })?;
        jobs.into_iter().find(|j| j.name == name).map(|j| j.id)
    }

    /// The jobs running now, with their node.
    fn running(&self) -> Vec<(String, String)> {
        let jobs = self
            .call(|mut c| async move { c.jobs(false).await })
            .unwrap_or_default();
        jobs.into_iter()
            .filter(|j| j.status == JobState::Running && j.members.len() == 1)
            .map(|j| (j.id, j.members[0].node.clone()))
            .collect()
    }

    fn unfinished(&self) -> Option<usize> {
        let jobs = self.call(|mut c| async move { c.jobs(true).await })?;
        Some(
            jobs.iter()
                .filter(|j| self.jobs.iter().any(|s| s.id == j.id) && !j.status.is_finished())
                .count(),
        )
    }

    /// Keep [`CONCURRENT_JOBS`] jobs unfinished.
    fn top_up(&mut self) {
        if let Some(unfinished) = self.unfinished() {
            for _ in unfinished..CONCURRENT_JOBS {
                self.submit();
            }
        }
    }

    /// Ask a running job to move to another node: (job, from, to), or `None` if nothing can.
    fn start_move(&mut self) -> Option<(String, String, String)> {
        // Just after a fault the jobs may be starting again or unknown: wait a little for one.
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut running = self.running();
        while running.is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(200));
            running = self.running();
        }
        if running.is_empty() {
            self.note("no running job to move".into());
            return None;
        }
        let (job, from) = running[self.rng.below(running.len())].clone();
        // A node still resyncing after a fault takes no move: pick among the ready ones.
        let ready: Vec<String> = self
            .call(|mut c| async move { c.nodes().await })
            .unwrap_or_default()
            .into_iter()
            .filter(|n| n.status == NodeState::Ready)
            .map(|n| n.name)
            .collect();
        let others: Vec<String> = self
            .nodes
            .iter()
            .filter(|n| n.name != from && !n.cut && ready.contains(&n.name))
            .map(|n| n.name.clone())
            .collect();
        if others.is_empty() {
            return None;
        }
        let to = others[self.rng.below(others.len())].clone();
        let (j, t) = (job.clone(), to.clone());
        let asked = self.try_call(|mut c| async move { c.move_job(&j, Some(&t)).await });
        self.note(format!(
            "move {job} {from} -> {to}: {}",
            match &asked {
                Ok(_) => "asked".to_owned(),
                Err(e) => format!("not made: {e}"),
            }
        ));
        asked.ok().map(|_| (job, from, to))
    }

    fn move_phase(&self, job: &str) -> Option<MovePhase> {
        let j = job.to_owned();
        let detail = self.call(|mut c| async move { c.job(&j).await })?;
        detail.moves.last().map(|m| m.phase)
    }

    /// Fault `kind` (of [`FAULT_KINDS`]; the last is a plain move), then the cluster healed.
    fn inject(&mut self, kind: usize) {
        match kind {
            0 => {
                let Some(l) = self.leader_or_note() else {
                    return;
                };
                let down = self.rng.secs(0.5, 3.0);
                self.note(format!("kill the leader (replica-{l}) for {down:?}"));
                self.replicas[l].kill();
                std::thread::sleep(down);
                self.replicas[l].restart();
            }
            1 => {
                let Some(l) = self.leader_or_note() else {
                    return;
                };
                let paused = Duration::from_secs(LEASE_TTL_S) + self.rng.secs(0.5, 2.5);
                self.note(format!("pause the leader (replica-{l}) for {paused:?}"));
                self.replicas[l].signal(nix::sys::signal::Signal::SIGSTOP);
                std::thread::sleep(paused);
                self.replicas[l].signal(nix::sys::signal::Signal::SIGCONT);
            }
            2 => {
                let m = self.rng.below(3);
                let down = self.rng.secs(1.0, 4.0);
                self.note(format!("kill etcd member m{m} for {down:?}"));
                self.etcd.kill(m);
                std::thread::sleep(down);
                self.etcd.restart(m);
            }
            3 => {
                let n = self.rng.below(self.nodes.len());
                let cut = self.rng.secs(0.5, LOST_AFTER_S - 0.5);
                self.note(format!("cut {} off for {cut:?}", self.nodes[n].name));
                self.nodes[n].cut();
                std::thread::sleep(cut);
                self.nodes[n].heal();
            }
            4 => {
                // A move's target cut off after it was handed the start, past the bound: it
                // must fence the job before the coordinator starts it on its source again.
                let Some((job, _, to)) = self.start_move() else {
                    return;
                };
                let handed = self.wait_phase(&job, |p| p != MovePhase::Saving);
                let t = self.nodes.iter().position(|n| n.name == to).unwrap();
                if handed == Some(MovePhase::Restoring) {
                    self.fenced_moves += 1;
                }
                let cut = Duration::from_secs_f64(LOST_AFTER_S + LOST_TARGET_WAIT_S + 3.0);
                self.note(format!(
                    "cut the target {to} off for {cut:?} (move in {handed:?})"
                ));
                self.nodes[t].cut();
                std::thread::sleep(cut);
                self.nodes[t].heal();
            }
            5 => {
                // The leader killed in the middle of a move.
                if self.start_move().is_none() {
                    return;
                }
                std::thread::sleep(self.rng.secs(0.0, 1.5));
                let Some(l) = self.leader_or_note() else {
                    return;
                };
                self.note(format!("kill the leader (replica-{l}) during the move"));
                self.replicas[l].kill();
                std::thread::sleep(self.rng.secs(0.5, 2.0));
                self.replicas[l].restart();
            }
            _ => {
                self.start_move();
            }
        }
    }

    /// Wait (up to 10 s) until the job's last move is in a phase `until` accepts: that phase.
    fn wait_phase(&self, job: &str, until: impl Fn(MovePhase) -> bool) -> Option<MovePhase> {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Some(p) = self.move_phase(job).filter(|p| until(*p)) {
                return Some(p);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }

    /// Every job finished; the checks.
    fn finish(&mut self, overlaps: &Mutex<Vec<Overlap>>) {
        for n in &mut self.nodes {
            n.heal();
        }
        self.note("healed; waiting for every job to end".into());
        let within = Duration::from_secs(60 + 4 * STEPS as u64);
        self.wait("every job ended", within, |s| {
            (s.unfinished()? == 0).then_some(())
        });
        let summaries = self
            .call(|mut c| async move { c.jobs(true).await })
            .expect("the job list");
        let reference = reference_curve(self.dir.path());
        let mut problems = Vec::new();
        for job in &self.jobs {
            let status = summaries.iter().find(|j| j.id == job.id).map(|j| j.status);
            if status != Some(JobState::Completed) {
                problems.push(format!("{} ({}) ended {status:?}", job.name, job.id));
            }
            let log = std::fs::read_to_string(&job.log).unwrap_or_default();
            if let Err(e) = check_log(&log, &reference) {
                problems.push(format!("{} ({}): {e}", job.name, job.id));
            }
        }
        let overlaps = overlaps.lock().unwrap();
        if let Some(o) = overlaps.first() {
            problems.push(format!(
                "two copies of {} alive at once (pids {:?}); {} such samples",
                o.job,
                o.pids,
                overlaps.len()
            ));
        }
        let fenced: usize = self
            .nodes
            .iter()
            .map(|n| n.daemon.log_text().matches("fencing a job").count())
            .sum();
        let moved = self
            .jobs
            .iter()
            .filter(|j| {
                let log = std::fs::read_to_string(&j.log).unwrap_or_default();
                log.matches("start pid=").count() > 1
            })
            .count();
        let witnessed: usize = self
            .nodes
            .iter()
            .map(|n| {
                n.daemon
                    .log_text()
                    .matches("not running a job again")
                    .count()
            })
            .sum();
        self.note(format!(
            "{} jobs, {moved} started more than once (moves, fences); {} move targets cut off \
             holding the job; {fenced} jobs fenced; {witnessed} not run again (ended on a lost target)",
            self.jobs.len(),
            self.fenced_moves
        ));
        if !problems.is_empty() {
            self.fail(&problems.join("\n"));
        }
    }
}

/// The loss per step of the trainer run once, never moved (without its pauses).
fn reference_curve(dir: &Path) -> BTreeMap<u32, String> {
    let log = dir.join("reference.log");
    let ckpt = dir.join("reference-ckpt");
    let status = std::process::Command::new("/bin/sh")
        .arg("-c")
        .arg(trainer_script(&ckpt, &log, "0"))
        .arg(format!("{MARK}reference"))
        .status()
        .expect("the reference run");
    assert!(status.success());
    let text = std::fs::read_to_string(&log).unwrap();
    let curve: BTreeMap<u32, String> = steps(&text).map(|(s, l, _)| (s, l)).collect();
    assert_eq!(curve.len(), STEPS as usize);
    curve
}

/// `(step, loss, pid)` of each step line.
fn steps(log: &str) -> impl Iterator<Item = (u32, String, u32)> + '_ {
    log.lines().filter_map(|l| {
        let mut f = l.split_whitespace();
        let step = f.next()?.strip_prefix("step=")?.parse().ok()?;
        let loss = f.next()?.strip_prefix("loss=")?.to_owned();
        let pid = f.next()?.strip_prefix("pid=")?.parse().ok()?;
        Some((step, loss, pid))
    })
}

/// A job's log against the reference: one `done`, every step's loss the reference's (a step
/// run again after a restore logs the same loss), every step there, and no two processes' lines
/// interleaved (each copy's lines are contiguous: one ran after the other).
fn check_log(log: &str, reference: &BTreeMap<u32, String>) -> Result<(), String> {
    let done = log.lines().filter(|l| l.starts_with("done ")).count();
    if done != 1 {
        return Err(format!("`done` {done} times in its log"));
    }
    let mut seen = BTreeSet::new();
    for (step, loss, _) in steps(log) {
        match reference.get(&step) {
            Some(r) if *r == loss => {
                seen.insert(step);
            }
            r => return Err(format!("step {step} lost {loss}, the unmoved run {r:?}")),
        }
    }
    if seen.len() != reference.len() {
        let missing: Vec<_> = reference.keys().filter(|s| !seen.contains(s)).collect();
        return Err(format!("steps missing: {missing:?}"));
    }
    let mut ended = BTreeSet::new();
    let mut current = None;
    for l in log.lines() {
        let Some(pid) = l
            .split_whitespace()
            .find_map(|f| f.strip_prefix("pid="))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if current != Some(pid) {
            if ended.contains(&pid) {
                return Err(format!(
                    "process {pid} logged again after another one had: two copies ran at once"
                ));
            }
            if let Some(c) = current {
                ended.insert(c);
            }
            current = Some(pid);
        }
    }
    Ok(())
}

/// The kinds of fault [`Soak::inject`] knows: the leader killed, the leader paused, an etcd
/// member killed, a node cut off briefly, a move's target cut off past the bound, the leader
/// killed during a move, and a plain move.
const FAULT_KINDS: usize = 7;

/// `faults` faults: each kind once first (in an order drawn from `seed`), then random kinds.
fn soak(faults: usize, seed: u64) {
    let Some(mut soak) = Soak::start(seed) else {
        return;
    };
    let stop = Arc::new(AtomicBool::new(false));
    let overlaps = Arc::new(Mutex::new(Vec::new()));
    let watcher = {
        let (stop, overlaps) = (stop.clone(), overlaps.clone());
        std::thread::spawn(move || watch_processes(stop, overlaps))
    };
    soak.note(format!("seed {seed}, {faults} faults"));
    soak.top_up();
    let mut kinds: Vec<usize> = (0..FAULT_KINDS).collect();
    for i in (1..kinds.len()).rev() {
        let j = soak.rng.below(i + 1);
        kinds.swap(i, j);
    }
    for i in 0..faults {
        let kind = match kinds.get(i) {
            Some(k) => *k,
            None => soak.rng.below(FAULT_KINDS),
        };
        let pause = soak.rng.secs(0.5, 2.5);
        std::thread::sleep(pause);
        soak.top_up();
        soak.inject(kind);
        // Every replica and etcd member back before the next fault: one machine lost at a time.
        soak.wait("a leader serves again", Duration::from_secs(60), |s| {
            s.call(|mut c| async move { c.nodes().await }).map(|_| ())
        });
    }
    soak.finish(&overlaps);
    stop.store(true, Ordering::SeqCst);
    watcher.join().unwrap();
}

#[test]
fn a_short_soak_of_random_faults_loses_no_job_and_runs_none_twice() {
    let seed = std::env::var("GOVERNOR_SOAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(34);
    soak(FAULT_KINDS, seed);
}

#[test]
#[ignore = "soak: a few minutes of random faults; run with `cargo xtask soak`"]
fn soak_random_faults() {
    let get = |k: &str, default: u64| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let seed = get("GOVERNOR_SOAK_SEED", 1);
    soak(get("GOVERNOR_SOAK_FAULTS", 36) as usize, seed);
}

#[test]
fn the_log_check_finds_interleaved_copies_a_missing_step_and_a_wrong_loss() {
    let reference: BTreeMap<u32, String> = [(1, "10".to_owned()), (2, "9".to_owned())]
        .into_iter()
        .collect();
    let good = "start pid=5 from=0\nstep=1 loss=10 pid=5\nsaved pid=5 step=1\n\
                start pid=6 from=1\nstep=2 loss=9 pid=6\ndone pid=6 step=2\n";
    assert_eq!(check_log(good, &reference), Ok(()));
    let interleaved = "step=1 loss=10 pid=5\nstep=1 loss=10 pid=6\nstep=2 loss=9 pid=5\n\
                       step=2 loss=9 pid=6\ndone pid=6 step=2\n";
    assert!(
        check_log(interleaved, &reference)
            .unwrap_err()
            .contains("two copies")
    );
    let missing = "step=2 loss=9 pid=6\ndone pid=6 step=2\n";
    assert!(
        check_log(missing, &reference)
            .unwrap_err()
            .contains("missing")
    );
    let wrong = "step=1 loss=11 pid=5\nstep=2 loss=9 pid=5\ndone pid=5 step=2\n";
    assert!(
        check_log(wrong, &reference)
            .unwrap_err()
            .contains("unmoved")
    );
    let twice = format!("{good}done pid=7 step=2\n");
    assert!(
        check_log(&twice, &reference)
            .unwrap_err()
            .contains("2 times")
    );
}
