//! `cargo xtask demo`: the README's main command.
//!
//! Where this host lets it govern real processes (root and a cgroup CPU controller, v1 or v2),
//! the demo runs real TensorFlow/Keras training jobs on this machine's real cores
//! ([`host`]): jobs sized to the machine by a probe, started together so that they contend, under
//! `fair` and then under Governor; then a small learning-rate sweep under `fair` and then with
//! Governor's opt-in trial budget. Elsewhere it runs small gradient-descent trainers in the VM
//! bed ([`vm`]), which shows the mechanics on a real cgroup v2 kernel but, on emulated cores,
//! not a gain.
//!
//! `--short` is the version `cargo xtask test` runs in CI: fewer and shorter jobs, the debug
//! build of the test stage, no cluster page.

mod host;
mod vm;

use std::path::Path;

use anyhow::Result;
use governor_testbed::cmd;

/// Arguments of `cargo xtask demo`.
#[derive(Debug, Default, clap::Args)]
pub(crate) struct DemoArgs {
    /// The small version (CI runs it): three jobs and a four-trial sweep, a few seconds each,
    /// built with the test stage's debug build; about two minutes once installed.
    #[arg(long)]
    pub short: bool,
    /// Node policy compared with `fair` (NAME or NAME:KEY=VALUE).
    #[arg(long, default_value = governor_policy::DEFAULT_POLICY)]
    pub policy: String,
    /// Run the demo in the VM bed (emulated cores, a real cgroup v2 kernel) instead of on this
    /// machine's real cores.
    #[arg(long)]
    pub vm: bool,
    /// No coordinator and no live cluster page beside the daemon.
    #[arg(long)]
    pub no_page: bool,
    /// VM demo: epochs each trainer runs (~4 s per epoch per core under emulation).
    #[arg(long, default_value_t = 48)]
    pub epochs: u32,
    /// VM demo: seconds between the trainers' starts.
    #[arg(long, default_value_t = 5)]
    pub stagger: u32,
}

/// Whether the host lets the demo govern real processes on its own cores.
pub(crate) fn host_can_govern() -> bool {
    cmd::is_root()
        && (Path::new("/sys/fs/cgroup/cpuacct/cpuacct.usage").exists()
            || Path::new("/sys/fs/cgroup/cgroup.controllers").exists())
}

pub(crate) fn run(args: &DemoArgs) -> Result<()> {
    if !args.vm && host_can_govern() {
        return host::run(args);
    }
    if !args.vm {
        eprintln!(
            "== this host does not let the demo govern real processes (it needs root and a cgroup CPU controller): running it in the VM"
        );
    }
    vm::run(args)
}

/// Below this share of the baseline's makespan with two or more jobs running, the jobs did not
/// contend and a comparison would show the machine, not the policy.
pub(crate) const MIN_TOGETHER: f64 = 0.5;

/// The share of the span of `intervals` (start, end) during which at least two were running.
pub(crate) fn together_fraction(intervals: &[(f64, f64)]) -> f64 {
    let mut events: Vec<(f64, i32)> = intervals
        .iter()
        .flat_map(|&(s, e)| [(s, 1), (e, -1)])
        .collect();
    // At one instant, ends before starts: a job that starts as another ends did not overlap it.
    events.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let (Some(first), Some(last)) = (events.first(), events.last()) else {
        return 0.0;
    };
    let span = last.0 - first.0;
    if span <= 0.0 {
        return 0.0;
    }
    let (mut running, mut since, mut together) = (0, first.0, 0.0);
    for (t, change) in events {
        if running >= 2 {
            together += t - since;
        }
        running += change;
        since = t;
    }
    together / span
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_one_after_another_never_run_together() {
        assert_eq!(together_fraction(&[(0.0, 10.0), (10.0, 20.0)]), 0.0);
        assert_eq!(together_fraction(&[]), 0.0);
    }

    #[test]
    fn the_share_together_is_measured_over_the_whole_span() {
        // Together from 5 to 10 of 0..20.
        let f = together_fraction(&[(0.0, 10.0), (5.0, 20.0)]);
        assert!((f - 0.25).abs() < 1e-9, "{f}");
        // Started together, the shorter ends at 15 of 20.
        let f = together_fraction(&[(0.0, 20.0), (0.0, 15.0), (0.0, 8.0)]);
        assert!((f - 0.75).abs() < 1e-9, "{f}");
    }
}
