//! `governor run-job --name N --log PATH [--metric M] -- CMD...`: start a command as a governed
//! job in a cgroup of its own under the governor's subtree (`governor.slice/jobs/<name>`), hand
//! it to the daemon, forward signals to it, and exit with its status. The cgroup (needed later
//! for a checkpoint or a move) is removed when the job ends.
//!
//! The command joins its cgroup between fork and exec, so it never runs outside it:
//! - run by root, `run-job` creates the group itself and the child writes itself into the
//!   group's `cgroup.procs`;
//! - run by another user (who may not create cgroups there), the child asks the daemon on the
//!   control socket (`join_job`) to create the group and move it in, and execs only after the
//!   daemon's yes (see `governor::daemon::join`); the daemon removes the group when the job
//!   has ended. Where the user may not (no access to the socket, or `[run_job] users`), one
//!   line says what to ask the operator for.
//!
//! The command also gets `GOVERNOR_LOG`/`GOVERNOR_JOB`/`GOVERNOR_METRIC` in its environment, so
//! a daemon that is not running yet, or restarts, still finds it.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use governor_proto::job_env;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::signal::unix::{SignalKind, signal};

use crate::cgroup::jobs::validate_job_name;
use crate::cgroup::{ActuatorConfig, CgroupFs, JobCgroup};
use crate::control::{self, AdoptJob, Request, Response};
use crate::sys::{ExecGate, GateRefusal};

/// Arguments of `governor run-job`.
#[derive(Debug, clap::Args)]
pub struct RunJobArgs {
    /// Job name; also the name of its cgroup under governor.slice/jobs.
    #[arg(long)]
    pub name: String,
    /// Log file, glob or log directory the job writes its progress to (repeatable): a directory
    /// is followed whole (TensorBoard's log directory, MLflow's `mlruns/`, a directory holding
    /// MLflow's `mlflow.db`), new runs and files included. Relative paths are taken from the
    /// current directory.
    #[arg(long = "log", required = true)]
    pub logs: Vec<String>,
    /// Progress metric (default: the training loss).
    #[arg(long)]
    pub metric: Option<String>,
    /// Log format (default: detect; `governor formats` lists them).
    #[arg(long)]
    pub format: Option<String>,
    /// Total epochs of the run: with the epoch its log reports, the governor learns how much
    /// work the job has left (also passed to the job as `GOVERNOR_EPOCHS`).
    #[arg(long, value_parser = job_env::parse_epochs)]
    pub epochs: Option<f64>,
    /// Opt-in: end the job once it has converged, `PATIENCE[:MIN_DELTA[:predict]]` (like Keras
    /// `EarlyStopping`, on its validation loss, else its progress signal; `:predict` judges a
    /// job of known size by its predicted rest of run instead): the daemon sends it
    /// SIGINT, then SIGTERM after a grace period, and reports it "stopped: converged". Also
    /// passed to the job as `GOVERNOR_FINISH`. The job starts with SIGINT at its default
    /// action, even if run-job inherited it ignored.
    #[arg(long, value_parser = job_env::parse_finish)]
    pub finish: Option<crate::policy::quality::FinishRule>,
    /// Opt-in: the job is a trial of a hyperparameter sweep, `NAME[:ETA:FIRST_RUNG[:seen]]`
    /// (default 3 and 5 epochs). The trials of one sweep on this node (and of one owner) are
    /// cut by successive halving:
    /// once every running trial has reached FIRST_RUNG · ETA^k epochs, the best 1/ETA (by
    /// their predicted final validation loss, else progress signal) go on, and of the others
    /// those confidently worse are stopped like `--finish` (SIGINT, then SIGTERM) and reported
    /// "stopped: outranked in its sweep" (`:seen` ranks by the best loss seen by the rung).
    /// Needs epochs in the log; give `--epochs` so that the last rung is not the end.
    /// Also passed to the job as `GOVERNOR_SWEEP`.
    #[arg(long, value_name = "NAME[:ETA:FIRST_RUNG]", value_parser = job_env::parse_sweep)]
    pub sweep: Option<crate::policy::sweep::SweepTrial>,
    /// Control socket of the daemon.
    #[arg(long, default_value = "/run/governor/governor.sock")]
    pub socket: PathBuf,
    /// Mount point of the cgroup filesystem.
    #[arg(long, default_value = "/sys/fs/cgroup")]
    pub cgroup_root: PathBuf,
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    pub command: Vec<OsString>,
}

fn absolute(p: &str) -> String {
    let path = Path::new(p);
    if path.is_absolute() {
        return p.to_owned();
    }
    std::env::current_dir()
        .map(|d| d.join(path).display().to_string())
        .unwrap_or_else(|_| p.to_owned())
}

pub fn run(args: RunJobArgs) -> ExitCode {
    match run_inner(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("governor run-job: {e:#}");
            ExitCode::from(125)
        }
    }
}

fn run_inner(args: RunJobArgs) -> anyhow::Result<ExitCode> {
    use anyhow::Context;
    let logs: Vec<String> = args.logs.iter().map(|l| absolute(l)).collect();
    let fs = CgroupFs::detect(&args.cgroup_root).with_context(|| {
        format!(
            "cannot use the cgroup filesystem at {}",
            args.cgroup_root.display()
        )
    })?;
    let subtree = ActuatorConfig::default().jobs_subtree;
    let as_root = nix::unistd::geteuid().is_root();
    let mut command = job_command(&args, &logs);
    let (job, gate) = if as_root {
        let job = fs.create_job_group(&subtree, &args.name).with_context(|| {
            format!(
                "cannot create the job's cgroup {}/{}",
                subtree.display(),
                args.name
            )
        })?;
        fs.prepare_command(&job, &mut command)
            .context("cannot prepare the job to start in its cgroup")?;
        (job, None)
    } else {
        validate_job_name(&args.name)?;
        let job = JobCgroup::new(subtree.join(&args.name))?;
        let mut request = serde_json::to_vec(&Request::JoinJob {
            name: args.name.clone(),
        })?;
        request.push(b'\n');
        let gate = crate::sys::ask_before_exec(
            &mut command,
            &args.socket,
            request,
            Response::OK_PREFIX.as_bytes(),
            JOIN_TIMEOUT,
        )?;
        (job, Some(gate))
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let code = rt.block_on(async {
        let mut child = match tokio::process::Command::from(command).spawn() {
            Ok(c) => c,
            Err(e) => {
                if let Some(why) = gate.as_ref().and_then(ExecGate::refusal) {
                    return Err(not_joined(&args.socket, why, e));
                }
                return Err(anyhow::Error::new(e))
                    .with_context(|| format!("cannot start {:?}", args.command[0]));
            }
        };
        let pid = child.id().unwrap_or(0);
        let adopt = Request::Adopt(AdoptJob {
            name: args.name.clone(),
            cgroup: format!("/{job}"),
            logs: logs.clone(),
            metric: args.metric.clone(),
            format: args.format.clone(),
            pid,
            epochs: args.epochs,
            finish: args.finish,
            sweep: args.sweep.clone(),
        });
        let socket = args.socket.clone();
        match tokio::task::spawn_blocking(move || {
            control::request(&socket, &adopt, Duration::from_secs(5))
        })
        .await?
        {
            Ok(Response::Ok { .. }) => {}
            Ok(Response::Error { message }) if message.contains("already governed") => {}
            Ok(other) => eprintln!(
                "governor run-job: the daemon did not take the job: {other:?}; it runs ungoverned"
            ),
            Err(e) => {
                eprintln!("governor run-job: {e}; the job runs ungoverned until a daemon finds it")
            }
        }
        let mut sigint = signal(SignalKind::interrupt())?;
        let mut sigterm = signal(SignalKind::terminate())?;
        let mut sighup = signal(SignalKind::hangup())?;
        let status = loop {
            let forward = tokio::select! {
                status = child.wait() => break status?,
                _ = sigint.recv() => Signal::SIGINT,
                _ = sigterm.recv() => Signal::SIGTERM,
                _ = sighup.recv() => Signal::SIGHUP,
            };
            if let Ok(raw) = i32::try_from(pid) {
                let _ = kill(Pid::from_raw(raw), forward);
            }
        };
        anyhow::Ok(status)
    })?;
    let release = Request::Release {
        cgroup: format!("/{job}"),
    };
    if as_root {
        let _ = control::request(&args.socket, &release, Duration::from_secs(5));
        stop_leftovers(&fs, &job);
        if let Err(e) = fs.remove_job_group(&job) {
            eprintln!("governor run-job: cannot remove the job's cgroup: {e}");
        }
    } else {
        // The group is root's to remove: the daemon does, once nothing is left in it.
        stop_leftovers(&fs, &job);
        if let Err(e) = control::request(&args.socket, &release, Duration::from_secs(5)) {
            eprintln!(
                "governor run-job: {e}; the job's cgroup {job} is removed when the daemon next starts"
            );
        }
    }
    use std::os::unix::process::ExitStatusExt;
    Ok(match (code.code(), code.signal()) {
        (Some(c), _) => ExitCode::from(u8::try_from(c).unwrap_or(1)),
        (None, Some(sig)) => ExitCode::from(u8::try_from(128 + sig).unwrap_or(1)),
        _ => ExitCode::FAILURE,
    })
}

/// How long the job's process waits for the daemon to place it (each of send and answer).
const JOIN_TIMEOUT: Duration = Duration::from_secs(10);

/// The command to run, with the job's environment.
fn job_command(args: &RunJobArgs, logs: &[String]) -> std::process::Command {
    let mut command = std::process::Command::new(&args.command[0]);
    command
        .args(&args.command[1..])
        .env(job_env::LOG, logs.join(":"))
        .env(job_env::JOB, &args.name);
    if let Some(m) = &args.metric {
        command.env(job_env::METRIC, m);
    }
    if let Some(e) = args.epochs {
        command.env(job_env::EPOCHS, e.to_string());
    }
    if let Some(f) = args.finish {
        command.env(job_env::FINISH, f.to_string());
    }
    if let Some(t) = &args.sweep {
        command.env(job_env::SWEEP, job_env::format_sweep(t));
    }
    if args.finish.is_some() || args.sweep.is_some() {
        // The daemon stops it with SIGINT once converged or outranked: it must not have
        // inherited SIGINT ignored (a job started from `governor run-job ... &` in a script
        // would).
        crate::sys::default_action_for(&mut command, Signal::SIGINT);
    }
    command
}

/// Why a user's job did not start: the daemon could not be asked, or said no (one line, with
/// what to ask the operator for where that is the way on).
fn not_joined(socket: &Path, why: GateRefusal, error: std::io::Error) -> anyhow::Error {
    match why {
        GateRefusal::Connect => match control::connect_error(socket, error) {
            e @ control::ControlError::NotAllowed { .. } => e.into(),
            e => anyhow::Error::new(e).context(
                "the job of a user who is not root needs the governor daemon to create its cgroup",
            ),
        },
        GateRefusal::Exchange => control::ControlError::Io {
            path: socket.to_owned(),
            error,
        }
        .into(),
        GateRefusal::Answer(line) => match serde_json::from_slice::<Response>(&line) {
            Ok(Response::Error { message }) => {
                anyhow::anyhow!("the governor daemon did not start the job: {message}")
            }
            _ => control::ControlError::Protocol {
                path: socket.to_owned(),
                message: String::from_utf8_lossy(&line).chars().take(200).collect(),
            }
            .into(),
        },
    }
}

/// The job's main process ended: stop what it left behind in its cgroup (and the groups below
/// it), SIGTERM then SIGKILL, until none is left or ~6 s have passed.
fn stop_leftovers(fs: &CgroupFs, job: &JobCgroup) {
    if !fs.populated(job) {
        return;
    }
    let _ = fs.signal_job_group(job, Signal::SIGTERM);
    for _ in 0..50 {
        if !fs.populated(job) {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = fs.signal_job_group(job, Signal::SIGKILL);
    for _ in 0..50 {
        if !fs.populated(job) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
