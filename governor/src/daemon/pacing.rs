//! The pace of the periodic sampling round: the configured interval, spaced out on a node
//! with many jobs so that the rounds stay within their CPU budget.

use std::time::{Duration, Instant};

use tracing::{debug, info};

/// Share of one core the periodic sampling round (usage of every job, vanished cgroups, the
/// decision that follows) may take on a node with many jobs: beyond it the round is spaced out.
const SAMPLE_BUDGET: f64 = 0.005;

/// Nodes with at most this many jobs always sample at the configured interval: the policies'
/// reaction to a change (the 2-second shift) depends on fresh usage, and a few jobs cost well
/// under the budget on real hardware (in the TCG test VM a 2-job round takes 6-20 ms of
/// emulated time, which would otherwise stretch the interval).
const PACE_ABOVE_JOBS: usize = super::node_core::LARGE_NODE_JOBS;

/// When the next sampling round is due: every `sample_interval`, or less often when a node with
/// many jobs spends more than [`SAMPLE_BUDGET`] of a core on the rounds. With 1,000 jobs a
/// round reads ~3,000 cgroup files (~20 ms) and is repeated every ~4 s instead of every second.
/// Progress records still trigger decisions at once (see `NodeCore::on_progress_moved`): only
/// usage readings become less frequent.
pub(super) struct SamplePacer {
    configured: Duration,
    current: Duration,
    pub(super) next: Instant,
}

impl SamplePacer {
    pub(super) fn new(configured: Duration) -> Self {
        SamplePacer {
            configured,
            current: configured,
            next: Instant::now(),
        }
    }

    pub(super) fn done(&mut self, started: Instant, finished: Instant, jobs: usize) {
        let took = finished.saturating_duration_since(started);
        let interval = pace(self.configured, took, jobs);
        let ratio = interval.as_secs_f64() / self.current.as_secs_f64();
        if !(0.8..=1.25).contains(&ratio) {
            let was_paced = self.current > self.configured;
            let paced = interval > self.configured;
            if paced && !was_paced {
                info!(jobs, round_ms = took.as_secs_f64() * 1e3, interval = ?interval, "sampling less often to stay within 0.5% of a core");
            } else if !paced && was_paced {
                info!(jobs, interval = ?interval, "sampling at the configured interval again");
            } else {
                debug!(jobs, round_ms = took.as_secs_f64() * 1e3, interval = ?interval, "sampling interval");
            }
            self.current = interval;
        }
        self.next = started + self.current;
    }
}

/// The interval after a round with `jobs` jobs that took `took`.
pub(super) fn pace(configured: Duration, took: Duration, jobs: usize) -> Duration {
    if jobs <= PACE_ABOVE_JOBS {
        return configured;
    }
    configured
        .max(took.mul_f64(1.0 / SAMPLE_BUDGET))
        .min(configured * 10)
}
