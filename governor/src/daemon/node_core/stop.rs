//! Stopping jobs that asked for it: finish at convergence and trials cut from their sweep
//! (SIGINT, then SIGTERM after [`FINISH_GRACE`]), and the policy told which jobs to serve after
//! the others meanwhile. The signals are [`Effect::Signal`]s the shell sends.

use std::time::Instant;

use nix::sys::signal::Signal;
use tracing::{debug, info};

use crate::cgroup::JobCgroup;
use crate::policy::sweep::{Outranked, Sweeps};

use super::{Effect, FINISH_GRACE, Finishing, JobEntry, NodeCore};

/// The effect that signals every process of a job's cgroup.
fn signal(cgroup: &JobCgroup, signal: Signal, entry: &JobEntry) -> Effect {
    Effect::Signal {
        cgroup: cgroup.clone(),
        signal,
        job: entry.name.clone(),
    }
}

/// Feed a job's quality value (at `fraction` of its run, where its size is known) to its finish
/// rule; once it has converged, stop the job (SIGINT to its cgroup, SIGTERM after
/// [`FINISH_GRACE`]).
pub(super) fn finish_on_quality(
    entry: &mut JobEntry,
    cgroup: &JobCgroup,
    now: Instant,
    value: f64,
    fraction: Option<f64>,
    effects: &mut Vec<Effect>,
) {
    if let Some(stop) = entry.finish.as_mut()
        && stop.observe_at(value, fraction)
    {
        let best = stop.best().unwrap_or(value);
        if let Some(sigint) = entry.begin_stop(
            cgroup,
            now,
            format!("stopped: converged (best loss {best:.6})"),
        ) {
            info!(job = %entry.name, best_loss = best, "converged: stopping the job as it asked (SIGINT; SIGTERM after {}s)", FINISH_GRACE.as_secs());
            effects.push(sigint);
        }
    }
}

/// A trial logged a loss with `epochs` done: hand it to its sweep, whose verdicts (this trial
/// or others cut at a rung) are returned for [`NodeCore::cut_trials`].
pub(super) fn sweep_on_quality(
    sweeps: &mut Sweeps<JobCgroup>,
    entry: &JobEntry,
    cgroup: &JobCgroup,
    epochs: Option<f64>,
    loss: f64,
    cuts: &mut Vec<Outranked<JobCgroup>>,
) {
    if let (Some(_), Some(done)) = (&entry.sweep, epochs) {
        cuts.extend(sweeps.observe(cgroup, done, loss));
    }
}

impl JobEntry {
    /// It has logged every epoch it declared: it is ending on its own. A stop signal now would
    /// reach it in its exit (a Python interpreter's shutdown) and turn its success into an exit
    /// by signal: the short demo's sweep cut a trial 0.57 s after its last epoch, in a slower
    /// trial's judgement at the last rung, and the demo failed (2026-11-30, as in CI on
    /// 2026-11-29).
    fn has_done_its_epochs(&self) -> bool {
        matches!((self.epochs_done, self.epochs), (Some(done), Some(all)) if all > 0.0 && done >= all)
    }

    /// Start stopping the job as it asked (`why` is what its status says): the SIGINT to send,
    /// or `None` where no signal is owed: it is being stopped already, or it has done its
    /// epochs ([`Self::has_done_its_epochs`]). SIGTERM follows after [`FINISH_GRACE`]
    /// ([`NodeCore::terminate_overdue_stops`]).
    fn begin_stop(&mut self, cgroup: &JobCgroup, now: Instant, why: String) -> Option<Effect> {
        if self.finishing.is_some() || self.has_done_its_epochs() {
            return None;
        }
        self.finishing = Some(Finishing {
            at: now,
            why,
            terminated: false,
        });
        Some(signal(cgroup, Signal::SIGINT, self))
    }
}

impl NodeCore {
    /// Tell the policy which jobs to serve after the others, and which no longer: trials that
    /// wait at their sweep's rung for the others. A job being stopped (converged, or cut from
    /// its sweep) is not held: ending takes CPU (its last batch, its validation, writing its
    /// log, the interpreter's exit), and held at its floor beside busy jobs it could not end
    /// within [`FINISH_GRACE`] on a slow machine and was sent SIGTERM, its run failed (a CI
    /// run of the demo, 2026-11-29). Its share for the second or two it takes is what it had;
    /// the simulator, whose stopped jobs leave at once, holds only rung waiters too.
    pub(super) fn sync_holds(&mut self, now: Instant) {
        let t = self.secs(now);
        for (cgroup, entry) in &mut self.jobs {
            if entry.sweep.is_none() && entry.finish.is_none() {
                continue;
            }
            let at = self.sweeps.waiting_at(cgroup);
            let held = at.is_some() && entry.finishing.is_none();
            if held != entry.held {
                debug!(job = %entry.name, rung_epochs = ?at, held, "served after the others");
                self.policy.hold(t, &entry.spec.id, held);
                self.next_decision_at = Some(now);
            }
            entry.waiting_at_rung = at;
            entry.held = held;
        }
    }

    /// Stop the trials their sweep cut (SIGINT now, SIGTERM after [`FINISH_GRACE`]), as they
    /// asked by joining it. A trial already being stopped, or past its last epoch, is left as
    /// it is.
    pub(super) fn cut_trials(
        &mut self,
        now: Instant,
        cuts: Vec<Outranked<JobCgroup>>,
        effects: &mut Vec<Effect>,
    ) {
        for cut in cuts {
            let Some(entry) = self.jobs.get_mut(&cut.trial) else {
                continue;
            };
            let Some(sigint) =
                entry.begin_stop(&cut.trial, now, format!("stopped: {}", cut.describe()))
            else {
                debug!(job = %entry.name, "outranked in its sweep while being stopped or after its last epoch: left to end on its own");
                continue;
            };
            let sweep = entry.sweep.clone().unwrap_or_default();
            info!(job = %entry.name, sweep = %sweep, rung_epochs = cut.rung_epochs, loss = cut.loss, place = cut.place, of = cut.of, kept = cut.kept, "outranked in its sweep: stopping the trial as it asked (SIGINT; SIGTERM after {}s)", FINISH_GRACE.as_secs());
            effects.push(sigint);
        }
    }

    /// Jobs being stopped that did not end within [`FINISH_GRACE`] of their SIGINT: SIGTERM,
    /// once. (The sampling tick asks, before it reads usage.)
    pub fn terminate_overdue_stops(&mut self, now: Instant, effects: &mut Vec<Effect>) {
        for (cgroup, entry) in &mut self.jobs {
            if let Some(f) = entry.finishing.as_mut()
                && !f.terminated
                && now.saturating_duration_since(f.at) >= FINISH_GRACE
            {
                f.terminated = true;
                info!(job = %entry.name, "still running {}s after SIGINT: SIGTERM", FINISH_GRACE.as_secs());
                effects.push(signal(cgroup, Signal::SIGTERM, entry));
            }
        }
    }
}
