//! `governor daemon`.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::daemon::{DaemonOptions, run_blocking};

/// Arguments of `governor daemon`.
#[derive(Debug, clap::Args)]
pub struct DaemonArgs {
    /// Configuration file (see `governor --example-config`); defaults apply when it is missing.
    #[arg(long, default_value = "/etc/governor/governor.toml")]
    pub config: PathBuf,
    /// Node policy, overriding the configuration: fair, flowcon, specon, shortest-left
    /// (`governor` is its old name, still accepted) or learning-first (the default), with
    /// parameters as
    /// NAME:KEY=VALUE[:KEY=VALUE] (e.g. `specon:interval=10`).
    #[arg(long)]
    pub policy: Option<String>,
    /// Compute and log decisions without writing any cgroup file.
    #[arg(long)]
    pub dry_run: bool,
    /// Join the cluster: report to the coordinator at HOST:PORT and run the jobs it places
    /// here (a replicated coordinator: every replica's HOST:PORT, separated by commas).
    /// Overrides `[coordinator] address`; without it, `[coordinator]` in the configuration
    /// decides whether the node joins.
    #[arg(long, value_name = "HOST:PORT")]
    pub coordinator: Option<String>,
    /// Directory with the cluster's mTLS files: `ca.pem`, `NODE.pem` and `NODE-key.pem`
    /// (`govctl certs init --node NODE`), NODE being the node name. Overrides `[coordinator]`
    /// ca, cert, key and insecure; the address comes from `--coordinator` or `[coordinator]
    /// address`.
    #[arg(long, value_name = "DIR", conflicts_with = "insecure")]
    pub certs: Option<std::path::PathBuf>,
    /// Connect to the coordinator in plain text, without authentication (test clusters only).
    /// Overrides `[coordinator]` ca, cert, key and insecure.
    #[arg(long)]
    pub insecure: bool,
    /// The node's name (a DNS label; the name in its certificate and the NODE of `--certs`).
    /// Overrides `[node] name`; default: `[node] name`, else the host name.
    #[arg(long, value_name = "NAME")]
    pub node_name: Option<String>,
}

impl DaemonArgs {
    /// The flags that combine with the configuration's `[coordinator]` table and `[node] name`
    /// ([`DaemonConfig::apply_cluster_flags`](crate::config::DaemonConfig::apply_cluster_flags)).
    pub fn cluster_flags(&self) -> crate::config::ClusterFlags {
        crate::config::ClusterFlags {
            coordinator: self.coordinator.clone(),
            certs: self.certs.clone(),
            insecure: self.insecure,
            node_name: self.node_name.clone(),
        }
    }
}

/// Run the daemon until SIGTERM/SIGINT; every limit it set is restored before it exits.
pub fn run(args: DaemonArgs) -> ExitCode {
    match run_blocking(DaemonOptions {
        config_path: args.config,
        policy: args.policy,
        dry_run: args.dry_run,
        coordinator: args.coordinator,
        certs: args.certs,
        insecure: args.insecure,
        node_name: args.node_name,
    }) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("governor daemon: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use clap::{CommandFactory, Parser};

    use crate::cli::{Cli, Command};
    use crate::config::DaemonConfig;

    fn args(line: &[&str]) -> super::DaemonArgs {
        let cli = Cli::try_parse_from(line).unwrap_or_else(|e| panic!("{line:?}: {e}"));
        match cli.command {
            Some(Command::Daemon(a)) => a,
            other => panic!("{line:?} parsed as {other:?}"),
        }
    }

    #[test]
    fn the_command_line_fills_the_configurations_coordinator_table() {
        // The configuration gives the address, the command line the certificates and the name.
        let mut config = DaemonConfig::parse(
            "[coordinator]\naddress = \"10.10.0.1:7070\"\n",
            Path::new("governor.toml"),
        )
        .unwrap();
        let a = args(&[
            "governor",
            "daemon",
            "--certs",
            "/etc/governor/certs",
            "--node-name",
            "node2",
        ]);
        config
            .apply_cluster_flags(&a.cluster_flags(), || "host".into())
            .unwrap();
        let c = config.coordinator.unwrap();
        assert_eq!(c.address, "10.10.0.1:7070");
        assert_eq!(
            c.cert.as_deref(),
            Some(Path::new("/etc/governor/certs/node2.pem"))
        );
        assert_eq!(config.node.name.as_deref(), Some("node2"));
    }

    #[test]
    fn certs_and_insecure_exclude_each_other() {
        let e = Cli::try_parse_from(["governor", "daemon", "--certs", "/d", "--insecure"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("cannot be used with"), "{e}");
    }

    #[test]
    fn the_help_says_how_flags_and_configuration_combine() {
        let mut cli = Cli::command();
        let help = cli
            .find_subcommand_mut("daemon")
            .unwrap()
            .render_long_help()
            .to_string();
        for says in [
            "Overrides `[coordinator] address`",
            "Overrides `[coordinator]` ca, cert, key and insecure",
            "Overrides `[node] name`",
        ] {
            assert!(
                help.contains(says),
                "governor daemon --help should say {says:?}:\n{help}"
            );
        }
    }
}
