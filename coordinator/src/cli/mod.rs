//! `govctl`: the cluster view and control CLI. The binary only calls [`main`].
//!
//! Every listing takes `--json` (one JSON document on stdout). Errors say which node or job they
//! are about and what to do; gRPC errors are translated into those words.

pub mod format;

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};
use governor_proto::control::{
    JobDetail, JobMove, JobSpec, JobSummary, NodeSummary, PolicyState, Stats,
};
use governor_proto::node::Checkpoint;
use governor_proto::pb;
use governor_proto::pb::control_service_client::ControlServiceClient;
use governor_proto::tls::{TlsFiles, endpoint};
use tonic::transport::Channel;

use crate::certs;

/// The cluster view and control CLI of Governor.
#[derive(Debug, Parser)]
#[command(name = "govctl", version, about)]
pub struct Cli {
    /// The coordinator's address (HOST:PORT), or every replica's separated by commas.
    #[arg(
        long,
        global = true,
        env = "GOVCTL_COORDINATOR",
        default_value = "127.0.0.1:7070"
    )]
    pub coordinator: String,
    /// Directory with ca.pem and this user's NAME.pem / NAME-key.pem (`govctl certs init`).
    #[arg(
        long,
        global = true,
        env = "GOVCTL_CERTS",
        default_value = "/etc/governor/certs"
    )]
    pub certs: PathBuf,
    /// The certificate name to use from --certs.
    #[arg(
        long = "as",
        global = true,
        env = "GOVCTL_AS",
        default_value = "admin",
        value_name = "NAME"
    )]
    pub identity: String,
    /// Talk plain text to a coordinator started with --insecure (no certificates).
    #[arg(long, global = true)]
    pub insecure: bool,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// List the nodes.
    Nodes,
    /// List the jobs (running, starting, queued, unknown).
    Jobs {
        /// Include finished jobs.
        #[arg(long)]
        all: bool,
    },
    /// Submit a job: `govctl submit --name N --log PATH -- CMD...`.
    Submit(SubmitArgs),
    /// Show one job: progress curve, category history, placement decisions and why.
    Job {
        /// The job id (`j12`, or `NODE/ID` for a node's local job).
        job: String,
    },
    /// Cancel a queued or running job.
    Cancel { job: String },
    /// Move a running job to another node without losing its work: a job submitted with
    /// --checkpoint-dir saves at its next epoch boundary and resumes on the target; any other
    /// single-member CPU job is dumped with CRIU and restored there (both nodes' governors run
    /// as root with criu installed). `govctl job JOB` shows the move's phases. (`govctl migrate`
    /// is its old name.)
    #[command(alias = "migrate")]
    Move {
        job: String,
        /// The node to move it to (default: the ready node with the most free cores).
        #[arg(long)]
        to: Option<String>,
    },
    /// Print a job's output (its stdout and stderr) from the node it runs on, or last ran on.
    Logs {
        job: String,
        /// Keep printing what it writes until it ends (a queued job is waited for).
        #[arg(long, short)]
        follow: bool,
        /// Only the last N lines (looked for in the last N KiB of the output).
        #[arg(long)]
        tail: Option<u64>,
        /// Which member of a multi-node job.
        #[arg(long, default_value_t = 0)]
        replica: u32,
    },
    /// Live cluster view: nodes, jobs, categories, CPU shares.
    Top {
        /// Refresh interval.
        #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
        interval: Duration,
        /// Print one frame and exit.
        #[arg(long)]
        once: bool,
        /// Stop after this many frames.
        #[arg(long)]
        frames: Option<u64>,
    },
    /// Show or set the placement policy.
    Policy {
        #[command(subcommand)]
        action: Option<PolicyAction>,
    },
    /// Coordinator counters and placement latency.
    Stats,
    /// Make certificates for a test cluster.
    Certs {
        #[command(subcommand)]
        action: CertsAction,
    },
}

#[derive(Debug, Subcommand)]
pub enum PolicyAction {
    /// Show the current policy and the ones available.
    Get,
    /// Use policy NAME for the jobs placed from now on.
    Set { name: String },
}

#[derive(Debug, Subcommand)]
pub enum CertsAction {
    /// Make a new CA in DIR and the certificates named.
    Init {
        #[arg(long)]
        dir: PathBuf,
        /// A DNS name or IP address clients use to reach the coordinator (repeatable).
        #[arg(long = "coordinator-host", value_name = "HOST")]
        coordinator_hosts: Vec<String>,
        /// A node certificate to make (repeatable).
        #[arg(long = "node", value_name = "NAME")]
        nodes: Vec<String>,
        /// An admin (govctl user) certificate to make (repeatable; default: one named "admin").
        #[arg(long = "admin", value_name = "NAME")]
        admins: Vec<String>,
        /// Replace an existing CA.
        #[arg(long)]
        force: bool,
    },
    /// Issue one more certificate with the CA in DIR.
    Issue {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long, value_name = "NAME", conflicts_with_all = ["admin", "coordinator_hosts"])]
        node: Option<String>,
        #[arg(long, value_name = "NAME", conflicts_with = "coordinator_hosts")]
        admin: Option<String>,
        #[arg(long = "coordinator-host", value_name = "HOST")]
        coordinator_hosts: Vec<String>,
    },
}

#[derive(Debug, Args)]
pub struct SubmitArgs {
    /// A name for the job.
    #[arg(long)]
    pub name: String,
    /// Whole GPUs per member (all on the member's node).
    #[arg(long, default_value_t = 0)]
    pub gpus: u32,
    /// Larger runs first.
    #[arg(long, default_value_t = 0, allow_hyphen_values = true)]
    pub priority: i32,
    /// Members, each on its own node (a gang: all start or none).
    #[arg(long, default_value_t = 1)]
    pub replicas: u32,
    /// Cores each member needs (reserved on its node). `MIN:MAX` makes the job elastic: it
    /// starts with at least MIN, is grown up to MAX into cores that would otherwise idle and
    /// shrunk back to make room, each time saved and started again from its checkpoint
    /// (needs --checkpoint-dir) with its size in GOVERNOR_CORES.
    #[arg(long, value_parser = parse_cores)]
    pub cores: Option<(f64, Option<f64>)>,
    /// Memory each member needs, e.g. 4G or 512M (reserved on its node).
    #[arg(long, value_parser = parse_bytes)]
    pub memory: Option<u64>,
    /// The user the job runs as on its nodes, with that user's uid, gid and groups there (its
    /// log is read with that user's rights). Default: who runs govctl ($USER). Nodes refuse
    /// root unless their `[coordinator] allow_root_jobs` is set.
    #[arg(long, env = "USER", default_value = "")]
    pub user: String,
    /// The progress signal in the log ("loss", "val_acc"); default: the node's choice.
    #[arg(long, default_value = "")]
    pub metric: String,
    /// Larger signal is better (accuracy-like).
    #[arg(long)]
    pub maximise: bool,
    /// A gang not admitted within this long fails (default: the coordinator's).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub gang_timeout: Option<Duration>,
    /// Extra environment for the job (repeatable).
    #[arg(long = "env", value_name = "KEY=VALUE", value_parser = parse_env)]
    pub env: Vec<(String, String)>,
    /// Total epochs of the run: the node's policy then knows how much work is left
    /// (passed as `GOVERNOR_EPOCHS`, the variable the node reads for any job).
    #[arg(long, value_parser = governor_proto::job_env::parse_epochs)]
    pub epochs: Option<f64>,
    /// End the job once it has converged, like Keras `EarlyStopping`: PATIENCE[:MIN_DELTA]
    /// (e.g. `5:0.001`: its loss has not improved by 0.001 in 5 values; `5:0.01:predict`: its
    /// predicted rest of run would improve it by less than 0.01). Its node stops it
    /// gracefully (SIGINT, then SIGTERM) and reports "stopped: converged". Passed as
    /// `GOVERNOR_FINISH`. Off unless given.
    #[arg(long, value_name = "PATIENCE[:MIN_DELTA]", value_parser = parse_finish_rule)]
    pub finish: Option<String>,
    /// A trial of a hyperparameter sweep, `NAME[:ETA:FIRST_RUNG[:seen]]` (default 3 and 5
    /// epochs): the coordinator judges the trials of one sweep together, on whatever nodes
    /// they run, as each reaches FIRST_RUNG · ETA^k epochs (asynchronous successive halving):
    /// outside the best 1/ETA there, a trial whose predicted final loss is confidently worse is
    /// stopped gracefully, counted completed and reported "stopped: outranked in its sweep";
    /// its place goes to the queued trials (`:seen` ranks by the loss seen at the rung). Needs
    /// epochs in the log. Passed as `GOVERNOR_SWEEP`. Off unless given.
    #[arg(long, value_name = "NAME[:ETA:FIRST_RUNG]", value_parser = parse_sweep)]
    pub sweep: Option<String>,
    /// The directory the job saves its checkpoint to and resumes from: on storage every node
    /// mounts at this path, or on each node's local disk with --carry. The job can then be
    /// moved by its own checkpoint (`govctl move`, or the coordinator on a node's SpeCon
    /// request). It must save there and exit with status 0 on the save signal, and resume from
    /// it when started again (Keras `BackupAndRestore`...). Without it, a move uses CRIU.
    #[arg(long, value_name = "DIR")]
    pub checkpoint_dir: Option<String>,
    /// The signal that asks the job to save and exit (a number or a name like SIGUSR1).
    #[arg(long, default_value = "SIGUSR1", value_parser = parse_signal, requires = "checkpoint_dir")]
    pub save_signal: i32,
    /// The nodes do not share the checkpoint directory: the coordinator carries it from the
    /// node that saved it to the one that resumes it (checksummed end to end).
    #[arg(long, requires = "checkpoint_dir")]
    pub carry: bool,
    /// The log file the job writes (absolute path on its node).
    #[arg(long)]
    pub log: String,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

fn parse_signal(s: &str) -> Result<i32, String> {
    if let Ok(n) = s.parse::<i32>() {
        return Ok(n);
    }
    let name = s.to_ascii_uppercase();
    let name = if name.starts_with("SIG") {
        name
    } else {
        format!("SIG{name}")
    };
    // The signals a job may sensibly take as "save and exit" (Linux numbers).
    match name.as_str() {
        "SIGHUP" => Ok(1),
        "SIGINT" => Ok(2),
        "SIGQUIT" => Ok(3),
        "SIGUSR1" => Ok(10),
        "SIGUSR2" => Ok(12),
        "SIGTERM" => Ok(15),
        _ => Err(format!(
            "{s:?} is not a signal number or one of SIGUSR1, SIGUSR2, SIGINT, SIGTERM, SIGHUP, SIGQUIT"
        )),
    }
}

fn parse_bytes(s: &str) -> Result<u64, governor_proto::units::ByteSizeError> {
    governor_proto::units::ByteSize::parse(s).map(|b| b.0)
}

/// `N` or `MIN:MAX` (positive numbers, MIN <= MAX).
fn parse_cores(s: &str) -> Result<(f64, Option<f64>), String> {
    let number = |v: &str| {
        v.trim()
            .parse::<f64>()
            .ok()
            .filter(|c| c.is_finite() && *c > 0.0)
            .ok_or_else(|| format!("{v:?} is not a positive number of cores"))
    };
    match s.split_once(':') {
        None => Ok((number(s)?, None)),
        Some((min, max)) => {
            let (min, max) = (number(min)?, number(max)?);
            if max < min {
                return Err(format!("{s:?}: MAX is below MIN"));
            }
            Ok((min, Some(max)))
        }
    }
}

fn parse_env(s: &str) -> Result<(String, String), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not KEY=VALUE"))?;
    if k.is_empty() {
        return Err(format!("{s:?} has an empty name"));
    }
    Ok((k.to_owned(), v.to_owned()))
}

/// Seconds since the Unix epoch.
fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Turn a gRPC error into a sentence for the operator.
fn explain(status: tonic::Status, coordinator: &str) -> anyhow::Error {
    use tonic::Code;
    let msg = status.message().to_owned();
    match status.code() {
        Code::Unavailable => anyhow::anyhow!(
            "cannot reach the coordinator at {coordinator}: {msg} (is it running? right address? \
             use --insecure only if it was started with --insecure)"
        ),
        Code::Unauthenticated | Code::PermissionDenied => {
            anyhow::anyhow!("the coordinator at {coordinator} refused: {msg}")
        }
        Code::NotFound | Code::InvalidArgument | Code::FailedPrecondition => {
            anyhow::anyhow!("{msg}")
        }
        code => anyhow::anyhow!("the coordinator at {coordinator} answered {code:?}: {msg}"),
    }
}

/// A connected client.
pub struct Client {
    inner: ControlServiceClient<Channel>,
    address: String,
}

impl Client {
    /// Connect as the CLI would. `address` may list every replica's, separated by commas: the
    /// first that accepts the connection is the leader (followers do not listen).
    pub async fn connect(address: &str, tls: Option<&TlsFiles>) -> Result<Client> {
        let mut failures = Vec::new();
        for one in governor_proto::tls::addresses(address) {
            let ep = endpoint(one, tls)?;
            match ep.connect().await {
                Ok(channel) => {
                    return Ok(Client {
                        inner: ControlServiceClient::new(channel),
                        address: one.to_owned(),
                    });
                }
                Err(e) => {
                    let mut msg = e.to_string();
                    let mut src = std::error::Error::source(&e);
                    while let Some(s) = src {
                        msg = format!("{msg}: {s}");
                        src = s.source();
                    }
                    failures.push((one, msg));
                }
            }
        }
        let detail = match failures.as_slice() {
            [(_, msg)] => msg.clone(),
            many => many
                .iter()
                .map(|(a, m)| format!("{a}: {m}"))
                .collect::<Vec<_>>()
                .join("; "),
        };
        anyhow::bail!(
            "cannot connect to the coordinator at {}: {} (is it running? right address{}?)",
            address,
            detail,
            if tls.is_some() {
                ", CA and certificate"
            } else {
                "; does it need TLS"
            }
        )
    }

    pub async fn nodes(&mut self) -> Result<Vec<NodeSummary>> {
        let r = self
            .inner
            .list_nodes(pb::ListNodesRequest {})
            .await
            .map_err(|s| explain(s, &self.address))?;
        r.into_inner()
            .nodes
            .into_iter()
            .map(|n| NodeSummary::try_from(n).context("the coordinator sent a bad node summary"))
            .collect()
    }

    pub async fn jobs(&mut self, all: bool) -> Result<Vec<JobSummary>> {
        let r = self
            .inner
            .list_jobs(pb::ListJobsRequest { all })
            .await
            .map_err(|s| explain(s, &self.address))?;
        r.into_inner()
            .jobs
            .into_iter()
            .map(|j| JobSummary::try_from(j).context("the coordinator sent a bad job summary"))
            .collect()
    }

    pub async fn job(&mut self, id: &str) -> Result<JobDetail> {
        let r = self
            .inner
            .get_job(pb::GetJobRequest { job_id: id.into() })
            .await
            .map_err(|s| explain(s, &self.address))?;
        let detail = r
            .into_inner()
            .job
            .context("the coordinator sent no job detail")?;
        JobDetail::try_from(detail).context("the coordinator sent a bad job detail")
    }

    pub async fn submit(&mut self, spec: JobSpec) -> Result<JobSummary> {
        let r = self
            .inner
            .submit_job(pb::SubmitJobRequest {
                spec: Some(spec.into()),
            })
            .await
            .map_err(|s| explain(s, &self.address))?;
        JobSummary::try_from(r.into_inner().job.context("no job in the answer")?)
            .context("the coordinator sent a bad job summary")
    }

    /// A job's output as the coordinator streams it (`JobOutput`).
    pub async fn output(
        &mut self,
        request: pb::JobOutputRequest,
    ) -> Result<tonic::Streaming<pb::JobOutputChunk>> {
        let r = self
            .inner
            .job_output(request)
            .await
            .map_err(|s| explain(s, &self.address))?;
        Ok(r.into_inner())
    }

    pub async fn cancel(&mut self, id: &str) -> Result<JobSummary> {
        let r = self
            .inner
            .cancel_job(pb::CancelJobRequest { job_id: id.into() })
            .await
            .map_err(|s| explain(s, &self.address))?;
        JobSummary::try_from(r.into_inner().job.context("no job in the answer")?)
            .context("the coordinator sent a bad job summary")
    }

    pub async fn move_job(&mut self, id: &str, to: Option<&str>) -> Result<JobMove> {
        let r = self
            .inner
            .move_job(pb::MoveJobRequest {
                job_id: id.into(),
                target_node: to.map(str::to_owned),
            })
            .await
            .map_err(|s| explain(s, &self.address))?;
        JobMove::try_from(r.into_inner().r#move.context("no move in the answer")?)
            .context("the coordinator sent a bad move")
    }

    pub async fn policy(&mut self) -> Result<PolicyState> {
        Ok(self
            .inner
            .get_policy(pb::GetPolicyRequest {})
            .await
            .map_err(|s| explain(s, &self.address))?
            .into_inner()
            .into())
    }

    pub async fn set_policy(&mut self, name: &str) -> Result<PolicyState> {
        Ok(self
            .inner
            .set_policy(pb::SetPolicyRequest { name: name.into() })
            .await
            .map_err(|s| explain(s, &self.address))?
            .into_inner()
            .into())
    }

    pub async fn stats(&mut self) -> Result<Stats> {
        Ok(self
            .inner
            .get_stats(pb::GetStatsRequest {})
            .await
            .map_err(|s| explain(s, &self.address))?
            .into_inner()
            .into())
    }
}

fn print_json<T: serde::Serialize>(v: &T) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

/// Run govctl.
pub async fn main(cli: Cli) -> Result<()> {
    if let Command::Certs { action } = &cli.command {
        return run_certs(action);
    }
    let tls = if cli.insecure {
        None
    } else {
        let files = TlsFiles::in_dir(&cli.certs, &cli.identity);
        if !files.cert.exists() {
            bail!(
                "no client certificate at {} (make one with `govctl certs init --dir {}`, choose \
                 another with --certs/--as, or pass --insecure for a plain-text coordinator)",
                files.cert.display(),
                cli.certs.display()
            );
        }
        Some(files)
    };
    let mut client = Client::connect(&cli.coordinator, tls.as_ref()).await?;
    match cli.command {
        Command::Nodes => {
            let nodes = client.nodes().await?;
            if cli.json {
                print_json(&nodes)?;
            } else {
                print!("{}", format::nodes_table(&nodes));
            }
        }
        Command::Jobs { all } => {
            let jobs = client.jobs(all).await?;
            if cli.json {
                print_json(&jobs)?;
            } else {
                print!("{}", format::jobs_table(&jobs, now()));
            }
        }
        Command::Submit(a) => {
            let mut env: std::collections::BTreeMap<String, String> = a.env.into_iter().collect();
            if let Some(sweep) = a.sweep {
                env.insert(governor_proto::job_env::SWEEP.into(), sweep);
            }
            if let Some(rule) = a.finish {
                env.insert(governor_proto::job_env::FINISH.into(), rule);
            }
            if let Some(epochs) = a.epochs {
                env.insert(governor_proto::job_env::EPOCHS.into(), epochs.to_string());
            }
            let spec = JobSpec {
                name: a.name,
                argv: a.command,
                log_path: a.log,
                metric: a.metric,
                maximise: a.maximise,
                gpus: a.gpus,
                priority: a.priority,
                replicas: a.replicas,
                cores: a.cores.map(|c| c.0),
                max_cores: a.cores.and_then(|c| c.1),
                memory_bytes: a.memory,
                gang_timeout_s: a.gang_timeout.map(|d| d.as_secs_f64()),
                env,
                checkpoint: a.checkpoint_dir.map(|dir| Checkpoint {
                    dir,
                    save_signal: a.save_signal,
                    carry: a.carry,
                    transparent: false,
                }),
                user: a.user,
            };
            let job = client.submit(spec).await?;
            if cli.json {
                print_json(&job)?;
            } else {
                match job.members.first() {
                    Some(m) => println!("{} {} on {}", job.id, job.status, m.node),
                    None => println!("{} {}: {}", job.id, job.status, job.message),
                }
            }
        }
        Command::Job { job } => {
            let d = client.job(&job).await?;
            if cli.json {
                print_json(&d)?;
            } else {
                print!("{}", format::job_detail(&d, now()));
            }
        }
        Command::Logs {
            job,
            follow,
            tail,
            replica,
        } => logs(&mut client, job, follow, tail, replica).await?,
        Command::Cancel { job } => {
            let j = client.cancel(&job).await?;
            if cli.json {
                print_json(&j)?;
            } else {
                println!("{} {}", j.id, j.status);
            }
        }
        Command::Move { job, to } => {
            let m = client.move_job(&job, to.as_deref()).await?;
            if cli.json {
                print_json(&m)?;
            } else {
                println!(
                    "{job}: moving from {} to {} ({}); `govctl job {job}` shows its phases",
                    m.from_node, m.to_node, m.message
                );
            }
        }
        Command::Policy { action } => {
            let p = match action {
                None | Some(PolicyAction::Get) => client.policy().await?,
                Some(PolicyAction::Set { name }) => client.set_policy(&name).await?,
            };
            if cli.json {
                print_json(&p)?;
            } else {
                print!("{}", format::policy(&p));
            }
        }
        Command::Stats => {
            let s = client.stats().await?;
            if cli.json {
                print_json(&s)?;
            } else {
                print!("{}", format::stats(&s));
            }
        }
        Command::Top {
            interval,
            once,
            frames,
        } => {
            top(
                &mut client,
                interval,
                if once { Some(1) } else { frames },
                cli.json,
            )
            .await?
        }
        Command::Certs { .. } => unreachable!("handled above"),
    }
    Ok(())
}

/// A finish rule as given, once it parses (`govctl submit --finish`).
fn parse_finish_rule(s: &str) -> Result<String, String> {
    governor_proto::job_env::parse_finish(s)
        .map(|_| s.trim().to_owned())
        .map_err(|e| e.to_string())
}

/// A sweep declaration, in its one spelling, once it parses (`govctl submit --sweep`).
fn parse_sweep(s: &str) -> Result<String, String> {
    governor_proto::job_env::parse_sweep(s)
        .map(|t| governor_proto::job_env::format_sweep(&t))
        .map_err(|e| e.to_string())
}

/// `govctl logs`: the output as it comes, on stdout; a move to another node noted on stderr.
async fn logs(
    client: &mut Client,
    job: String,
    follow: bool,
    tail_lines: Option<u64>,
    replica: u32,
) -> Result<()> {
    use std::io::Write;
    let address = client.address.clone();
    let mut stream = client
        .output(pb::JobOutputRequest {
            job_id: job.clone(),
            replica,
            follow,
            tail_bytes: tail_lines.map(|n| n.saturating_mul(1024).max(64 * 1024)),
        })
        .await?;
    let mut stdout = std::io::stdout().lock();
    let mut node: Option<String> = None;
    // With --tail: the output up to its end when asked, to cut to its last lines.
    let mut backlog: Option<Vec<u8>> = tail_lines.map(|_| Vec::new());
    loop {
        let piece = match stream.message().await {
            Ok(Some(p)) => p,
            Ok(None) => break,
            Err(s) => return Err(explain(s, &address)),
        };
        if node.as_deref() != Some(piece.node.as_str()) {
            if let Some(before) = &node {
                let _ = stdout.flush();
                eprintln!(
                    "govctl: job {job} moved from {before} to {}; its output there follows",
                    piece.node
                );
            }
            node = Some(piece.node.clone());
        }
        let end = piece.offset + piece.data.len() as u64;
        let mut data = piece.data;
        if let Some(held) = backlog.as_mut() {
            held.extend_from_slice(&data);
            if end < piece.size {
                continue;
            }
            data = last_lines(held, tail_lines.unwrap_or(0)).to_vec();
            backlog = None;
        }
        if stdout
            .write_all(&data)
            .and_then(|()| stdout.flush())
            .is_err()
        {
            return Ok(()); // stdout closed (piped into `head`)
        }
    }
    if let Some(held) = backlog {
        let _ = stdout.write_all(last_lines(&held, tail_lines.unwrap_or(0)));
    }
    let _ = stdout.flush();
    Ok(())
}

/// The last `n` lines of `text` (a last line without its newline counts).
fn last_lines(text: &[u8], n: u64) -> &[u8] {
    if n == 0 {
        return &[];
    }
    let body = text.strip_suffix(b"\n").unwrap_or(text);
    let mut seen = 0;
    for (i, &b) in body.iter().enumerate().rev() {
        if b == b'\n' {
            seen += 1;
            if seen == n {
                return &text[i + 1..];
            }
        }
    }
    text
}

async fn top(
    client: &mut Client,
    interval: Duration,
    frames: Option<u64>,
    json: bool,
) -> Result<()> {
    let tty = std::io::stdout().is_terminal() && !json;
    let mut shown = 0u64;
    loop {
        let nodes = client.nodes().await?;
        let jobs = client.jobs(false).await?;
        let policy = client.policy().await?.current;
        let mut out = std::io::stdout().lock();
        if json {
            writeln!(
                out,
                "{}",
                serde_json::json!({ "nodes": nodes, "jobs": jobs, "policy": policy })
            )?;
        } else {
            let frame = format::top(&nodes, &jobs, &policy, now());
            if tty {
                // Home, then clear to the end of the screen: refresh in place without flicker.
                write!(out, "\x1b[H{}\x1b[J", frame.replace('\n', "\x1b[K\n"))?;
            } else {
                writeln!(out, "{frame}")?;
            }
        }
        out.flush()?;
        shown += 1;
        if frames.is_some_and(|f| shown >= f) {
            return Ok(());
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
    }
}

fn run_certs(action: &CertsAction) -> Result<()> {
    let files = match action {
        CertsAction::Init {
            dir,
            coordinator_hosts,
            nodes,
            admins,
            force,
        } => {
            let mut kinds = vec![certs::Kind::Coordinator {
                hosts: coordinator_hosts.clone(),
            }];
            kinds.extend(nodes.iter().map(|n| certs::Kind::Node { name: n.clone() }));
            let admins = if admins.is_empty() {
                vec!["admin".to_owned()]
            } else {
                admins.clone()
            };
            kinds.extend(admins.into_iter().map(|name| certs::Kind::Admin { name }));
            certs::init(dir, &kinds, *force)?
        }
        CertsAction::Issue {
            dir,
            node,
            admin,
            coordinator_hosts,
        } => {
            let kind = match (node, admin) {
                (Some(n), _) => certs::Kind::Node { name: n.clone() },
                (_, Some(a)) => certs::Kind::Admin { name: a.clone() },
                (None, None) if !coordinator_hosts.is_empty() => certs::Kind::Coordinator {
                    hosts: coordinator_hosts.clone(),
                },
                (None, None) => {
                    bail!("say what to issue: --node NAME, --admin NAME or --coordinator-host HOST")
                }
            };
            certs::issue(dir, &kind)?
        }
    };
    for f in files {
        println!("wrote {}", f.display());
    }
    Ok(())
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
