//! The temporary world of one `bench-daemon` run under `/dev/shm`: the fake cgroup v2 root, the
//! simulated jobs (their cgroup files, declared job files and logs), the configuration and the
//! daemon started on it.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use governor_progress::tensorboard::{file_version_event, scalar_event};
use governor_progress::tfrecord::frame;
use governor_testbed::cmd;
use serde_json::Value;

use super::{BenchDaemonArgs, LogFormat, SplitMix64};

/// The files of a fresh cgroup v2 group, as `FakeCgroupRoot` (governor/src/cgroup/fake.rs)
/// writes them.
const V2_GROUP_FILES: &[(&str, &str)] = &[
    ("cgroup.procs", ""),
    ("cgroup.controllers", "cpu memory pids\n"),
    ("cgroup.subtree_control", "\n"),
    ("cgroup.events", "populated 1\nfrozen 0\n"),
    ("cpu.weight", "100\n"),
    ("cpu.max", "max 100000\n"),
    (
        "cpu.stat",
        "usage_usec 0\nuser_usec 0\nsystem_usec 0\nnr_periods 0\nnr_throttled 0\nthrottled_usec 0\n",
    ),
    ("memory.current", "0\n"),
    ("memory.low", "0\n"),
    ("memory.high", "max\n"),
    ("memory.max", "max\n"),
    (
        "memory.events",
        "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n",
    ),
    ("memory.stat", "anon 0\nfile 0\nkernel 0\n"),
    ("pids.current", "0\n"),
    ("pids.max", "max\n"),
];

const ROOT_FILES: &[(&str, &str)] = &[
    ("cgroup.controllers", "cpuset cpu io memory hugetlb pids\n"),
    ("cgroup.subtree_control", "cpu memory pids\n"),
    ("cgroup.procs", ""),
];

const DIR_PREFIX: &str = "governor-bench-daemon-";

/// Directories of earlier runs whose benchmark process is gone (killed before its clean-up).
pub(super) fn remove_stale_dirs() {
    let Ok(entries) = fs::read_dir("/dev/shm") else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if let Some(pid) = name.strip_prefix(DIR_PREFIX)
            && pid.parse::<u32>().is_ok()
            && !Path::new("/proc").join(pid).exists()
        {
            eprintln!("removing {} left by an earlier run", e.path().display());
            let _ = fs::remove_dir_all(e.path());
        }
    }
}

/// The temporary world of one run; dropping it stops the daemon and removes everything.
pub(super) struct Bed {
    pub(super) dir: PathBuf,
    cgroup_root: PathBuf,
    config: PathBuf,
    socket: PathBuf,
    log: PathBuf,
    pub(super) jobs: Vec<SimJob>,
    daemon: Option<Child>,
    pub(super) rng: SplitMix64,
}

pub(super) struct SimJob {
    pub(super) name: String,
    cgroup_dir: PathBuf,
    log: File,
    /// `validation/` event file (TensorBoard logs only).
    val: Option<File>,
    pub(super) rows: u64,
    /// Events written (TensorBoard logs only): records the daemon must deliver.
    pub(super) records: u64,
    cpu_usec: u64,
    /// CPU cores this simulated job uses (drives `cpu.stat`).
    cores: f64,
    memory: u64,
}

impl Bed {
    pub(super) fn create(args: &BenchDaemonArgs) -> Result<Bed> {
        let dir = Path::new("/dev/shm").join(format!("{DIR_PREFIX}{}", std::process::id()));
        fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let cgroup_root = dir.join("cgroup");
        let mut bed = Bed {
            config: dir.join("governor.toml"),
            socket: dir.join("governor.sock"),
            log: dir.join("daemon.log"),
            cgroup_root,
            dir,
            jobs: Vec::with_capacity(args.jobs),
            daemon: None,
            rng: SplitMix64(0x5eed_0f60_7e42),
        };
        // Never anything but a fake root on tmpfs.
        ensure!(bed.cgroup_root.starts_with("/dev/shm/"));
        write_files(&bed.cgroup_root, ROOT_FILES)?;
        write_files(&bed.cgroup_root.join("bench.slice"), V2_GROUP_FILES)?;
        let jobs_dir = bed.dir.join("jobs.d");
        fs::create_dir_all(&jobs_dir)?;
        for k in 0..args.jobs {
            let name = format!("job-{k:04}");
            let cgroup_dir = bed.cgroup_root.join("bench.slice").join(&name);
            write_files(&cgroup_dir, V2_GROUP_FILES)?;
            let (log_path, declared, val) = match args.log_format {
                LogFormat::Csv => {
                    let log_path = bed.dir.join("logs").join(&name).join("training.log");
                    fs::create_dir_all(log_path.parent().unwrap())?;
                    fs::write(&log_path, "epoch,loss\n")?;
                    (log_path.clone(), log_path, None)
                }
                LogFormat::Tensorboard => {
                    let logdir = bed.dir.join("logs").join(&name);
                    let file = |run: &str| -> Result<File> {
                        let path = logdir
                            .join(run)
                            .join(format!("events.out.tfevents.1700000000.bench.{k}.0.v2"));
                        fs::create_dir_all(path.parent().unwrap())?;
                        fs::write(&path, frame(&file_version_event(1.7e9)))?;
                        Ok(fs::OpenOptions::new().append(true).open(&path)?)
                    };
                    let val = file("validation")?;
                    drop(file("train")?);
                    (
                        logdir
                            .join("train")
                            .join(format!("events.out.tfevents.1700000000.bench.{k}.0.v2")),
                        logdir,
                        Some(val),
                    )
                }
            };
            fs::write(
                jobs_dir.join(format!("{name}.toml")),
                format!(
                    "name = \"{name}\"\ncgroup = \"/bench.slice/{name}\"\nlogs = [\"{}\"]\n",
                    declared.display()
                ),
            )?;
            let log = fs::OpenOptions::new()
                .append(true)
                .open(&log_path)
                .with_context(|| {
                    format!(
                        "cannot open {} (1 file per job stays open: raise `ulimit -n`)",
                        log_path.display()
                    )
                })?;
            let cores = 0.1 + 3.9 * bed.rng.unit();
            let memory = (256 << 20) + (bed.rng.next() % (4 << 30));
            bed.jobs.push(SimJob {
                name,
                cgroup_dir,
                log,
                val,
                rows: 0,
                records: 0,
                cpu_usec: 0,
                cores,
                memory,
            });
        }
        fs::write(
            &bed.config,
            format!(
                "policy = \"{}\"\njobs_dir = \"{}\"\ncgroup_root = \"{}\"\nstate_file = \"{}\"\n\
                 socket = \"{}\"\n\n[node]\ncores = 64\nmemory = \"256GiB\"\nname = \"bench\"\n",
                args.policy,
                jobs_dir.display(),
                bed.cgroup_root.display(),
                bed.dir.join("state.json").display(),
                bed.socket.display(),
            ),
        )?;
        bed.advance_counters(Duration::from_secs(1))?;
        Ok(bed)
    }

    pub(super) fn start_daemon(&mut self, bin: &Path, args: &BenchDaemonArgs) -> Result<u32> {
        let log = File::create(&self.log)?;
        let mut command = Vec::<String>::new();
        if let Some(w) = &args.wrap {
            command.extend(w.split_whitespace().map(str::to_owned));
        }
        command.push(bin.display().to_string());
        command.extend(["daemon", "--config"].map(String::from));
        command.push(self.config.display().to_string());
        let mut c = match args.nofile {
            Some(n) => {
                let mut c = Command::new("sh");
                c.args(["-c", &format!("ulimit -Sn {n} && exec \"$@\""), "sh"])
                    .args(&command);
                c
            }
            None => {
                let mut c = Command::new(&command[0]);
                c.args(&command[1..]);
                c
            }
        };
        c.stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .current_dir(&self.dir);
        eprintln!("  $ {}", cmd::describe(&c));
        let child = c.spawn().context("cannot start the daemon")?;
        let pid = child.id();
        self.daemon = Some(child);
        Ok(pid)
    }

    /// Whether the daemon process is still running.
    pub(super) fn daemon_alive(&mut self) -> bool {
        match self.daemon.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// SIGTERM, wait (30 s, then SIGKILL); returns how it exited.
    pub(super) fn stop_daemon(&mut self) -> Result<String> {
        let Some(mut child) = self.daemon.take() else {
            bail!("the daemon was not running");
        };
        if let Some(status) = child.try_wait()? {
            return Ok(status.to_string());
        }
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = child.try_wait()? {
                return Ok(status.to_string());
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                bail!("the daemon did not exit within 30 s of SIGTERM: killed");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub(super) fn log_tail(&self) -> String {
        let text = fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// `governor status --json`, parsed (None while the daemon does not answer).
    pub(super) fn status(&self, bin: &Path) -> Option<Value> {
        let out = Command::new(bin)
            .args(["status", "--json", "--socket"])
            .arg(&self.socket)
            .stderr(Stdio::null())
            .output()
            .ok()?;
        if !out.status.success() {
            return None;
        }
        serde_json::from_slice(&out.stdout).ok()
    }

    /// Advance every job's `cpu.stat` usage and `memory.current` by `elapsed`, each file
    /// replaced atomically (rename) so that the daemon never reads a half-written one.
    pub(super) fn advance_counters(&mut self, elapsed: Duration) -> Result<()> {
        let tmp = self.dir.join("counter.tmp");
        for job in &mut self.jobs {
            job.cpu_usec += (job.cores * elapsed.as_secs_f64() * 1e6) as u64;
            let user = job.cpu_usec * 9 / 10;
            fs::write(
                &tmp,
                format!(
                    "usage_usec {}\nuser_usec {user}\nsystem_usec {}\nnr_periods 0\nnr_throttled 0\nthrottled_usec 0\n",
                    job.cpu_usec,
                    job.cpu_usec - user
                ),
            )?;
            fs::rename(&tmp, job.cgroup_dir.join("cpu.stat"))?;
            job.memory = job.memory.wrapping_add(4096) % (8 << 30);
            fs::write(&tmp, format!("{}\n", job.memory))?;
            fs::rename(&tmp, job.cgroup_dir.join("memory.current"))?;
        }
        Ok(())
    }

    /// Append job `k`'s next row (one `write`, as a logger flushing a line).
    pub(super) fn write_row(&mut self, k: usize) -> Result<()> {
        let job = &mut self.jobs[k];
        job.rows += 1;
        let epoch = job.rows;
        let loss = 0.05 + 2.5 * (-(epoch as f64) / 40.0).exp() + 0.01 * ((epoch * 7 % 11) as f64);
        let Some(val) = job.val.as_mut() else {
            job.records += 1;
            return job
                .log
                .write_all(format!("{epoch},{loss:.5}\n").as_bytes())
                .with_context(|| format!("cannot append to {}'s log", job.name));
        };
        // One `write` per event, as TensorFlow's and PyTorch's writers flush one.
        let wall = 1.7e9 + epoch as f64;
        let step = epoch as i64;
        if epoch.is_multiple_of(10) {
            val.write_all(&frame(&scalar_event(
                wall,
                step,
                &[("epoch_loss", (loss * 1.1) as f32)],
            )))
            .with_context(|| format!("cannot append to {}'s validation log", job.name))?;
            job.records += 1;
        }
        job.records += 1;
        job.log
            .write_all(&frame(&scalar_event(
                wall,
                step,
                &[("epoch_loss", loss as f32)],
            )))
            .with_context(|| format!("cannot append to {}'s log", job.name))
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        if self.daemon.is_some()
            && let Err(e) = self.stop_daemon()
        {
            eprintln!("warning: {e:#}");
        }
        if let Err(e) = fs::remove_dir_all(&self.dir) {
            eprintln!("warning: cannot remove {}: {e}", self.dir.display());
        }
    }
}

fn write_files(dir: &Path, files: &[(&str, &str)]) -> Result<()> {
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    for (name, content) in files {
        fs::write(dir.join(name), content)?;
    }
    Ok(())
}
