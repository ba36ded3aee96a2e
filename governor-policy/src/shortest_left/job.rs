//! The shortest-left policy's per-job state: what it knows of a job's demand for CPU
//! ([`Demand`]), of its size ([`Work`](crate::work::Work)), and the job itself ([`Job`]: stage, fair twin,
//! promotions).

use crate::stage::LossTracker;
use crate::{Category, JobSpec, Seconds};

use crate::work::Work;

/// What the policy knows of a job's demand for CPU.
#[derive(Clone, Debug, Default)]
pub(super) struct Demand {
    /// Most cores it has been seen using.
    pub(super) seen: f64,
    /// Cores it cannot exceed for now (None: no known bound).
    pub(super) limit: Option<f64>,
    /// When the limit was learnt.
    pub(super) limit_at: Option<Seconds>,
    /// Fewest cores any plan since the last usage sample expected it to get.
    pub(super) min_offered: Option<f64>,
    /// Cumulative CPU wait at the latest sample.
    pub(super) last_wait: Option<f64>,
}

impl Demand {
    /// Its demand is unknown again: offer it `offer` cores (with the long probe to lift that
    /// too), or every core (`None`).
    pub(super) fn reopen(&mut self, now: Seconds, offer: Option<f64>) {
        self.limit = offer;
        self.limit_at = offer.map(|_| now);
    }
}

#[derive(Clone, Debug)]
pub(super) struct Job {
    pub(super) spec: JobSpec,
    pub(super) submitted: Seconds,
    /// Arrival order (ties).
    pub(super) seq: u64,
    pub(super) cpu_seconds: f64,
    pub(super) last_usage: Option<(Seconds, f64)>,
    pub(super) recent_cores: f64,
    pub(super) demand: Demand,
    pub(super) work: Work,
    /// Its learning stage, from its quality signal (validation loss) once one arrived, from its
    /// progress signal before.
    pub(super) tracker: LossTracker,
    /// The stage is fed by the quality signal.
    pub(super) quality_fed: bool,
    /// CPU-seconds it would have had under fair sharing (its fair twin): what it used while
    /// the plan offered it at least its fair share (fair sharing would have given it no more
    /// than it could use), its fair share while the plan held it below; never more than
    /// `fair_ceiling`.
    pub(super) fair_cpu: f64,
    /// Its fair share of every interval, whether or not it could have used it: the twin's bound.
    pub(super) fair_ceiling: f64,
    /// `cpu_seconds` when the twin last advanced.
    pub(super) twin_mark: f64,
    /// Cores the latest plan expected the kernel to give it (infinite before the first plan).
    pub(super) offered: f64,
    /// When the fair twin finished its (estimated) work, if it has.
    pub(super) fair_done_at: Option<Seconds>,
    /// Promoted by the guard.
    pub(super) urgent: bool,
    /// Promoted by the pace guard (behind its fair twin's CPU): a job of unknown size, or with
    /// `pace_learning` one still learning. The completion guard does not release it.
    pub(super) lagging: bool,
    /// Ranked behind the learning jobs: it converged, and has not progressed again since
    /// (a converged job that merely wavers into "watching" stays behind: hysteresis).
    pub(super) behind: bool,
    /// Served after the others ([`NodePolicy::hold`](crate::NodePolicy::hold)): a trial waiting
    /// at its sweep's rung for the other trials.
    pub(super) held: bool,
}

impl Job {
    /// Cores it can use now, within the operator's bound.
    pub(super) fn usable(&self, cores: f64) -> f64 {
        let max = self
            .spec
            .bounds
            .max_cores
            .filter(|m| *m > 0.0)
            .unwrap_or(f64::MAX);
        self.demand.limit.unwrap_or(cores).min(max).min(cores)
    }

    /// 0: promoted by the guard; 1: learning (or not judged yet, or slowing down); 2: converged
    /// (with `learning_first`); 3: held, a trial waiting at its sweep's rung or a job being
    /// stopped (before the guard: it asked to wait or to end, its fair twin's pace does not
    /// apply). A job merely slowing down stays with the learners (on noisy per-epoch losses
    /// "watching" comes and goes, and the order would flap with it); it only gives up its turn
    /// to a learner of about the same work (the ranking key's `slowing`).
    pub(super) fn class(&self, learning_first: bool) -> u8 {
        if self.held {
            return 3;
        }
        if self.urgent {
            return 0;
        }
        if learning_first && self.behind { 2 } else { 1 }
    }

    /// Updates `behind` from the learning stage (with its hysteresis).
    pub(super) fn update_behind(&mut self) {
        self.behind = match self.tracker.category() {
            Category::Converged => true,
            Category::Progressing | Category::Unknown => false,
            Category::Watching => self.behind,
        };
    }

    /// Whether its log gave progress values but its size is unknown (no work fractions):
    /// the case the lag guard covers.
    pub(super) fn size_unknown(&self) -> bool {
        self.work.remaining().is_none() && self.tracker.last_observed_at().is_some()
    }
}
