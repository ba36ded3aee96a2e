//! Sweeps across the cluster (issue 32, item 3): the trials of one sweep submitted with
//! `govctl submit --sweep NAME` are judged together here, whatever node each runs on, by
//! asynchronous successive halving ([`Judging::OnArrival`], ASHA): a trial that reaches a rung
//! is promoted or stopped at once against the results recorded there, ranked by predicted final
//! loss ([`governor_policy::sweep`]). A trial cut is stopped on its node and completes ("stopped:
//! outranked in its sweep ..."); the capacity it frees goes to the queued trials at once.
//!
//! Nodes do not judge these trials themselves (a node's sweep is for `run-job --sweep`): the
//! start command carries the declaration to the job, and the node leaves it to the coordinator.
//!
//! Nothing is lost with the coordinator: each trial's curve `(epochs, value)` is kept in its
//! record ([`JobRecord::sweep_curve`]), from which [`ClusterState::restore`] rebuilds the rungs.

use std::collections::BTreeSet;

use governor_policy::Direction;
use governor_policy::sweep::{Judging, Outranked, SweepTrial, Sweeps};
use governor_proto::control::JobState;
use governor_proto::job_env;
use governor_proto::node::{JobReport, NodeCommand, StopJob};
use tracing::info;

use governor_placement::queue::Seconds;

use super::{ClusterState, JobRecord};

/// Values of a trial's curve kept in its record (thinned beyond, as the judge's own copy).
const CURVE_POINTS: usize = 256;

/// The sweeps of the cluster's jobs, judged on arrival.
pub(super) fn cluster_sweeps() -> Sweeps<String> {
    Sweeps::judged(Judging::OnArrival)
}

/// The sweep a submitted job is a trial of, with its direction and declared epochs.
fn trial_of(job: &JobRecord) -> Option<(SweepTrial, Direction, Option<f64>)> {
    let spec = job.spec.as_ref()?;
    let mut trial = job_env::parse_sweep(spec.env.get(job_env::SWEEP)?).ok()?;
    // A sweep is its user's: two users' sweeps of one name are judged apart.
    if !spec.user.is_empty() {
        trial.sweep = format!("{}/{}", spec.user, trial.sweep);
    }
    let direction = if spec.maximise {
        Direction::Maximise
    } else {
        Direction::Minimise
    };
    let epochs = spec
        .env
        .get(job_env::EPOCHS)
        .and_then(|e| job_env::parse_epochs(e).ok());
    Some((trial, direction, epochs))
}

/// Whether the coordinator stopped the job for its sweep (its record says so).
fn cut_by_sweep(job: &JobRecord) -> bool {
    job.status == JobState::Completed && job.message.starts_with(STOPPED)
}

const STOPPED: &str = "stopped: outranked in its sweep";

impl ClusterState {
    /// A submitted trial joins its sweep (queued trials too: a sweep is forgotten only when
    /// none of its trials is left, queued or running).
    pub(super) fn join_sweep(&mut self, id: &str) {
        let Some((trial, direction, epochs)) = self.jobs.get(id).and_then(trial_of) else {
            return;
        };
        self.sweeps
            .join(&trial.sweep, trial.rule, direction, id.to_owned(), epochs);
    }

    /// A restored record takes up its place in its sweep (before the nodes report again).
    pub(super) fn rejoin_sweep(&mut self, id: &str) {
        let Some(job) = self.jobs.get(id) else { return };
        let Some((trial, direction, epochs)) = trial_of(job) else {
            return;
        };
        let (curve, cut, finished) = (
            job.sweep_curve.clone(),
            cut_by_sweep(job),
            job.status.is_finished(),
        );
        self.sweeps
            .rejoin(&trial, direction, id.to_owned(), epochs, &curve, cut);
        if finished {
            self.sweeps.leave(&id.to_owned());
        }
    }

    /// A running trial's report: its epochs and latest value are recorded, and it is judged at
    /// each rung it reaches. Replica 0 speaks for a gang; a trial in a move waits for its end.
    pub(super) fn observe_sweep(&mut self, now: Seconds, report: &JobReport) {
        if report.replica != 0 || report.state.is_finished() {
            return;
        }
        let (Some(epoch), Some(value)) = (report.epoch, report.progress) else {
            return;
        };
        if self.sweeps.sweep_of(&report.job_id).is_none() {
            return;
        }
        let id = report.job_id.clone();
        let Some(job) = self.jobs.get_mut(&id) else {
            return;
        };
        if job.status != JobState::Running || job.active_move().is_some() {
            return;
        }
        let epochs = epoch as f64;
        match job.sweep_curve.last_mut() {
            Some(last) if last.0 >= epochs => {
                if last.1 == value {
                    return; // nothing new
                }
                last.1 = value;
            }
            _ => job.sweep_curve.push((epochs, value)),
        }
        governor_policy::predict::thin(&mut job.sweep_curve, CURVE_POINTS);
        self.dirty.jobs.insert(id.clone());
        let cuts = self.sweeps.observe(&id, epochs, value);
        for cut in cuts {
            self.cut_trial(now, cut);
        }
    }

    /// Stop a trial its sweep cut: it completes, and its capacity goes to the queue.
    fn cut_trial(&mut self, now: Seconds, cut: Outranked<String>) {
        let Some(job) = self.jobs.get_mut(&cut.trial) else {
            return;
        };
        if job.status.is_finished() {
            return;
        }
        let why = cut.describe();
        info!(job = %job.id, sweep_cut = %why, "trial stopped by its sweep");
        for m in job.members.iter().filter(|m| !m.state.is_finished()) {
            self.outbox.push((
                m.node.clone(),
                NodeCommand::Stop(StopJob {
                    job_id: job.id.clone(),
                    reason: why.clone(),
                }),
            ));
        }
        job.status = JobState::Completed;
        job.message = format!("stopped: {why}");
        job.finished_at = Some(now);
        self.completions += 1;
        self.needs_dispatch = true;
        self.dirty.jobs.insert(cut.trial.clone());
        let nodes: BTreeSet<String> = job.members.iter().map(|m| m.node.clone()).collect();
        // Judged on arrival: a trial leaving its sweep decides nothing.
        let _ = self.sweeps.leave(&cut.trial);
        for n in nodes {
            self.sync_view(&n);
        }
    }
}

#[cfg(test)]
#[path = "sweeps_tests.rs"]
mod tests;
