//! `coordinator`: the cluster service. Configuration from `--config FILE` (TOML, see
//! `--example-config`), overridden by flags.
#![forbid(unsafe_code)]

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::Parser;
use coordinator::server::{self, ServerConfig};
use governor_proto::tls::TlsFiles;
use tracing_subscriber::EnvFilter;

/// The Governor cluster coordinator: node registry, placement, queue and the govctl service.
#[derive(Debug, Parser)]
#[command(name = "coordinator", version, about)]
struct Opts {
    #[command(subcommand)]
    command: Option<Cmd>,
    /// TOML configuration file (fields of `--example-config`); flags override it.
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    /// Print a commented example configuration and exit.
    #[arg(long)]
    example_config: bool,
    /// Address to listen on.
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// The redb store (created if missing).
    #[arg(long)]
    store: Option<PathBuf>,
    /// Directory with ca.pem, coordinator.pem and coordinator-key.pem (`govctl certs init`).
    #[arg(long)]
    certs: Option<PathBuf>,
    /// Serve plain text without authentication. Only for tests on a trusted network.
    #[arg(long)]
    insecure: bool,
    /// Placement policy of a fresh store (`govctl policy set` changes it at run time).
    #[arg(long)]
    policy: Option<String>,
    /// Seconds without a report after which a node is lost.
    #[arg(long)]
    lost_after: Option<f64>,
    /// Serve `/metrics`, the live cluster page (`/`) and its JSON (`/api/cluster`) here, e.g.
    /// `127.0.0.1:9465` (no login: keep it on localhost or a management network).
    #[arg(long)]
    web: Option<SocketAddr>,
    /// Serve --web over HTTPS with the coordinator's certificate from --certs, to clients with
    /// a certificate of the cluster CA only (as govctl and the nodes authenticate).
    #[arg(long, requires = "web", requires = "certs")]
    web_mtls: bool,
    /// Log filter (RUST_LOG syntax), e.g. `info` or `coordinator=debug`.
    #[arg(long, env = "RUST_LOG", default_value = "info")]
    log_level: String,
}

#[derive(Debug, clap::Subcommand)]
enum Cmd {
    /// Copy the state of a redb store (nodes, jobs, the next job id, the policy) to etcd,
    /// under the `[state.etcd]` of --config, then exit: a cluster switching to replicas keeps
    /// its jobs. Stop the coordinator on the file first and start the replicas after; the
    /// etcd prefix must be empty.
    Migrate {
        /// The redb store to copy (`store` of the old configuration).
        #[arg(long, value_name = "FILE")]
        from: PathBuf,
    },
}

const EXAMPLE: &str = r#"# coordinator configuration (all fields optional; flags override)
listen = "0.0.0.0:7070"
store = "/var/lib/governor/coordinator.redb"
# Placement policy of a fresh store: soonest, flowcon, procon, specon, round-robin, first-fit,
# elastic-fifo, kubeflow, dragon; the papers' baselines spread and usage.
policy = "soonest"

# mTLS: the CA that signed every node and govctl certificate, and the server's own.
# Without this table the coordinator refuses to start unless given --insecure.
[tls]
ca = "/etc/governor/certs/ca.pem"
cert = "/etc/governor/certs/coordinator.pem"
key = "/etc/governor/certs/coordinator-key.pem"

[state]
lost_after_s = 10.0        # a node silent this long is lost; its jobs show as unknown
resync_grace_s = 30.0      # after a restart, nodes not back yet get this long more to reconnect
lost_target_wait_s = 300.0 # a move's target lost after it got the start may run the job: wait for it
start_timeout_s = 60.0     # a placed job its node has not started by then has failed
report_interval_ms = 1000  # asked of the nodes
gang_timeout_s = 600.0     # gangs not admitted within this long fail
progress_samples = 120     # progress points kept per job, spread over its life
save_timeout_s = 600.0     # a job asked to save for a move that has not by then stays put
auto_move = true           # act on the nodes' move requests for jobs that can move
move_target = "specon"     # ... to SpeCon Algorithm 2's node ("most-free": the most free cores)
move_after_s = 10.0        # ... once a request has stood this long
move_cooldown_s = 300.0    # ... and not again within this long of the job's last move
# max_auto_moves = 1       # ... nor more than this many times in all (unset: no limit)
move_payoff = 2.0          # ... and only if it gives back this many times what it costs (0: off)
rebalance = true           # SpeCon Algorithm 3: asked-to-move jobs that stayed go to idle nodes
move_confirm_s = 10.0      # a moved job runs this long on its target before the move is over
# A move's pause, fixed_s + per_gib_s x the job's memory (cargo xtask bench-move on your nodes)
framework_move_cost = { fixed_s = 0.1, per_gib_s = 3.8 }
criu_move_cost = { fixed_s = 1.5, per_gib_s = 20.0 }
preemption = true          # a higher-priority job that fits nowhere displaces lower-priority
                           # jobs by checkpoint: saved, requeued at the head of their priority
preempt_min_run_s = 60.0   # ... only jobs that have run this long since their latest start
elastic = true             # grow and shrink elastic jobs (--cores MIN:MAX) as the policy says
resize_min_run_s = 60.0    # ... only jobs that have run this long since their latest start
# Where the state is kept: "redb" (the file `store`, one coordinator) or "etcd" (the cluster's
# etcd: run any number of replicas with the same [state.etcd]; one is elected leader and serves,
# the others wait and take over within about lease_ttl_s when it is lost).
backend = "redb"

# [state.etcd]
# endpoints = ["https://10.0.0.1:2379", "https://10.0.0.2:2379", "https://10.0.0.3:2379"]
# prefix = "/governor"        # every key the coordinator writes starts with this
# lease_ttl_s = 5             # the leader's lease: how soon a replica takes over
# request_timeout_ms = 2000   # a member that does not answer within this is left for the next
# max_txn_ops = 128           # etcd's --max-txn-ops
# tls = { ca = "/etc/etcd/ca.pem", cert = "/etc/governor/etcd-client.pem", key = "/etc/governor/etcd-client-key.pem" }

# /metrics (Prometheus), the live cluster page (/) and its JSON (/api/cluster); off unless set.
# No login: bind it to localhost or a management network. HTTPS with `tls`.
[web]
# listen = "127.0.0.1:9465"
# tls = { cert = "/etc/governor/web.pem", key = "/etc/governor/web-key.pem" }
# ... and only for clients with a certificate of this CA (mutual TLS; `--web-mtls` uses --certs):
# tls = { cert = "/etc/governor/certs/coordinator.pem", key = "/etc/governor/certs/coordinator-key.pem", client_ca = "/etc/governor/certs/ca.pem" }
"#;

/// The configuration: the file, then the flags (TLS not checked: see [`serving_config`]).
fn config(opts: &Opts) -> Result<ServerConfig> {
    let mut config = match &opts.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            toml::from_str(&text)
                .with_context(|| format!("bad configuration in {}", path.display()))?
        }
        None => ServerConfig::default(),
    };
    if let Some(w) = opts.web {
        config.web.listen = Some(w);
    }
    if let Some(l) = opts.listen {
        config.listen = l;
    }
    if let Some(s) = &opts.store {
        config.store = s.clone();
    }
    if let Some(dir) = &opts.certs {
        let files = TlsFiles::in_dir(dir, coordinator::certs::COORDINATOR);
        if opts.web_mtls {
            config.web.tls = Some(governor_proto::http::HttpTls {
                cert: files.cert.clone(),
                key: files.key.clone(),
                client_ca: Some(files.ca.clone()),
            });
        }
        config.tls = Some(files);
    }
    if let Some(p) = &opts.policy {
        coordinator::placement::by_name(p)?;
        config.policy = p.clone();
    }
    if let Some(l) = opts.lost_after {
        config.state.lost_after_s = l;
    }
    Ok(config)
}

/// [`config`] for serving: TLS configured, or plain text asked for.
fn serving_config(opts: &Opts) -> Result<ServerConfig> {
    let mut config = config(opts)?;
    if opts.insecure {
        config.tls = None;
    } else if config.tls.is_none() {
        bail!(
            "no TLS configured: pass --certs DIR (made by `govctl certs init`) or a [tls] table in \
             the configuration; --insecure serves plain text without authentication"
        );
    }
    Ok(config)
}

#[tokio::main]
async fn main() -> ExitCode {
    let opts = Opts::parse();
    if opts.example_config {
        print!("{EXAMPLE}");
        return ExitCode::SUCCESS;
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_new(&opts.log_level).unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    if let Some(Cmd::Migrate { from }) = &opts.command {
        return match migrate(&opts, from).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("coordinator migrate: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    let result = async {
        let config = serving_config(&opts)?;
        if config.tls.is_none() {
            tracing::warn!("serving plain text without authentication (--insecure)");
        }
        server::run(config, async {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                    .expect("SIGTERM handler");
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        })
        .await
        .context("coordinator failed")
    }
    .await;
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("coordinator: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `coordinator migrate --from FILE`: the redb store's state to the configured etcd.
async fn migrate(opts: &Opts, from: &std::path::Path) -> Result<()> {
    let config = config(opts)?;
    if opts.config.is_none() {
        bail!("migrate: pass --config, the replicas' configuration (its [state.etcd] says where)");
    }
    if config.state.backend != server::Backend::Etcd {
        bail!(
            "migrate: the configuration's [state] backend is not \"etcd\": give the replicas' configuration"
        );
    }
    let etcd = &config.state.etcd;
    let done = coordinator::store::migrate::redb_to_etcd(from, etcd)
        .await
        .with_context(|| format!("cannot migrate {} to etcd", from.display()))?;
    println!(
        "migrated {}: {} node(s), {} job(s){} to etcd {} under {}; start the replicas now",
        from.display(),
        done.nodes,
        done.jobs,
        done.policy
            .map(|p| format!(", policy {p}"))
            .unwrap_or_default(),
        etcd.endpoints.join(","),
        etcd.prefix
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_example_configuration_parses() {
        let c: ServerConfig = toml::from_str(EXAMPLE).unwrap();
        assert_eq!(c.policy, "soonest");
        assert_eq!(c.state.lost_after_s, 10.0);
        assert!(c.tls.is_some());
        assert_eq!(c.state.backend, server::Backend::Redb);
    }

    #[test]
    fn an_etcd_backend_is_configured_in_the_state_table() {
        let c: ServerConfig = toml::from_str(
            r#"
            [state]
            lost_after_s = 7.0
            backend = "etcd"
            [state.etcd]
            endpoints = ["10.0.0.1:2379", "10.0.0.2:2379"]
            lease_ttl_s = 3
            "#,
        )
        .unwrap();
        assert_eq!(c.state.backend, server::Backend::Etcd);
        assert_eq!(c.state.lost_after_s, 7.0);
        assert_eq!(c.state.etcd.endpoints.len(), 2);
        assert_eq!(c.state.etcd.lease_ttl_s, 3);
        assert_eq!(c.state.etcd.prefix, "/governor");
        let bad = toml::from_str::<ServerConfig>("[state.etcd]\nendpoint = [\"x\"]\n");
        assert!(bad.unwrap_err().to_string().contains("unknown field"));
    }

    #[test]
    fn tls_is_required_unless_insecure() {
        let opts = Opts::parse_from(["coordinator"]);
        assert!(
            serving_config(&opts)
                .unwrap_err()
                .to_string()
                .contains("--insecure")
        );
        let opts = Opts::parse_from(["coordinator", "--insecure", "--policy", "procon"]);
        assert_eq!(serving_config(&opts).unwrap().policy, "procon");
        let opts = Opts::parse_from(["coordinator", "--insecure", "--policy", "nope"]);
        assert!(serving_config(&opts).is_err());
    }

    #[test]
    fn web_mtls_serves_the_page_with_the_coordinators_certificate_to_cluster_clients() {
        let opts = Opts::parse_from([
            "coordinator",
            "--certs",
            "/etc/governor/certs",
            "--web",
            "127.0.0.1:9465",
            "--web-mtls",
        ]);
        let tls = config(&opts).unwrap().web.tls.expect("HTTPS");
        assert_eq!(
            tls.cert,
            std::path::Path::new("/etc/governor/certs/coordinator.pem")
        );
        assert_eq!(
            tls.client_ca.as_deref(),
            Some(std::path::Path::new("/etc/governor/certs/ca.pem"))
        );
        // It needs the certificates it names.
        assert!(
            Opts::try_parse_from(["coordinator", "--web", "127.0.0.1:1", "--web-mtls"]).is_err()
        );
    }
}
