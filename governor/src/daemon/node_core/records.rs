//! What a job's logs say: each record moves its progress signal and its quality (validation
//! loss), which the policy, the finish rule and the job's sweep are told; log problems are kept
//! for status. A stop the finish rule or the sweep decides on is returned as an [`Effect`].

use std::time::Instant;

use tracing::{info, warn};

use crate::cgroup::JobCgroup;
use crate::policy::quality::{EarlyStop, QualityTracker};
use crate::policy::sweep::Outranked;
use crate::policy::{Direction, ProgressPoint};
use crate::progress::{Format, Record, SignalUpdate};

use super::stop::{finish_on_quality, sweep_on_quality};
use super::{Effect, GROWTH_WINDOW, NodeCore};

impl NodeCore {
    /// A record from one of a job's logs. Returns true when it moved the progress signal; the
    /// stops it causes (the job converged, its sweep cut trials) are pushed to `effects`.
    pub fn on_record(
        &mut self,
        now: Instant,
        cgroup: &JobCgroup,
        record: &Record,
        effects: &mut Vec<Effect>,
    ) -> bool {
        let mut cuts = Vec::new();
        let moved = self.on_record_inner(now, cgroup, record, &mut cuts, effects);
        // Only a trial's record can move its sweep, and only a job with a finish rule or a
        // sweep can come to be stopped.
        if self
            .jobs
            .get(cgroup)
            .is_some_and(|e| e.sweep.is_some() || e.finish.is_some())
        {
            self.cut_trials(now, cuts, effects);
            self.sync_holds(now);
        }
        moved
    }

    fn on_record_inner(
        &mut self,
        now: Instant,
        cgroup: &JobCgroup,
        record: &Record,
        cuts: &mut Vec<Outranked<JobCgroup>>,
        effects: &mut Vec<Effect>,
    ) -> bool {
        let t = self.secs(now);
        let Some(entry) = self.jobs.get_mut(cgroup) else {
            return false;
        };
        let epochs = epochs_done(record);
        if let Some(done) = epochs {
            entry.epochs_done = epochs;
            entry.epoch_timer.observe(t, done);
        }
        entry.records += 1;
        self.metrics.log_record(record.format.name());
        entry.last_record_at = Some(now);
        entry.log_file = Some(record.file.display().to_string());
        entry.log_problem = None;
        // The quality signal (validation loss): time to quality, and the policy's view of what
        // the job still learns.
        if let Some(v) = crate::progress::quality_value(record) {
            if !entry.quality_from_validation {
                entry.quality = QualityTracker::new(Direction::Minimise);
                entry.quality_from_validation = true;
                // The finish rule followed the training signal until now: start over on
                // validation (unless the stop is already under way).
                if let Some(stop) = entry.finish.as_mut()
                    && entry.finishing.is_none()
                {
                    *stop = EarlyStop::new(stop.rule(), Direction::Minimise);
                }
            }
            entry.quality.observe(t, v);
            let fraction = work_fraction(record, entry.epochs);
            finish_on_quality(entry, cgroup, now, v, fraction, effects);
            sweep_on_quality(&mut self.sweeps, entry, cgroup, epochs, v, cuts);
            self.policy.quality(
                t,
                &entry.spec.id,
                ProgressPoint {
                    at: t,
                    value: v,
                    new_segment: false,
                },
            );
        }
        match entry.tracker.observe(record) {
            SignalUpdate::Value { value, new_segment } => {
                if new_segment {
                    info!(job = %entry.name, file = %record.file.display(), "the log restarted its counters: new run segment");
                    entry.history.clear();
                    entry.first_value = None;
                }
                entry.first_value.get_or_insert(value);
                entry.last_value = Some(value);
                entry.history.push_back((now, value));
                while entry
                    .history
                    .front()
                    .is_some_and(|(t0, _)| now.saturating_duration_since(*t0) > GROWTH_WINDOW)
                {
                    entry.history.pop_front();
                }
                self.policy.progress(
                    t,
                    &entry.spec.id,
                    ProgressPoint {
                        at: t,
                        value,
                        new_segment,
                    },
                );
                if new_segment {
                    entry.quality = QualityTracker::new(entry.spec.direction);
                    entry.quality_from_validation = false;
                }
                if !entry.quality_from_validation {
                    if entry.quality.first().is_none() {
                        entry.quality = QualityTracker::new(entry.spec.direction);
                        if let Some(stop) = entry.finish.as_mut() {
                            *stop = EarlyStop::new(stop.rule(), entry.spec.direction);
                        }
                    }
                    entry.quality.observe(t, value);
                    // A job that logs no validation loss: its training signal is its quality.
                    let fraction = work_fraction(record, entry.epochs);
                    finish_on_quality(entry, cgroup, now, value, fraction, effects);
                    // Its sweep compares losses: a signal that rises (accuracy) is not one.
                    if entry.spec.direction == Direction::Minimise {
                        sweep_on_quality(&mut self.sweeps, entry, cgroup, epochs, value, cuts);
                    }
                }
                if let Some(fraction) = work_fraction(record, entry.epochs) {
                    self.policy.work_done(t, &entry.spec.id, fraction);
                }
                self.policy.decides_on_progress()
            }
            SignalUpdate::NonFinite { value } => {
                if entry.tracker.non_finite() == 1 {
                    warn!(job = %entry.name, file = %record.file.display(), value, "the progress signal is not finite (NaN/inf): ignored, never used as progress (reported once)");
                }
                false
            }
            SignalUpdate::Absent => false,
        }
    }

    /// A problem with a job's logs (shown in status; the watcher logs it once).
    pub fn on_log_problem(&mut self, cgroup: &JobCgroup, message: String) {
        self.metrics.problem("log");
        if let Some(entry) = self.jobs.get_mut(cgroup) {
            entry.log_problem = Some(message);
        }
    }
}

/// How far along a job is, from the epoch its log reports and the total epochs the operator
/// declared. Logs count epochs differently: Keras' `CSVLogger` writes a 0-based epoch when the
/// epoch has ended (epoch 0 = one done); Hugging Face writes the fraction done (1.5 = one and a
/// half); the others write the epoch they are in or have just finished, 1-based, or 0-based on
/// rows written during the epoch (Lightning: epoch 1 rows start once epoch 0 is done). So the
/// number done is the epoch, plus one for Keras CSV.
pub(super) fn work_fraction(record: &Record, total_epochs: Option<f64>) -> Option<f64> {
    let total = total_epochs.filter(|t| t.is_finite() && *t > 0.0)?;
    Some((epochs_done(record)? / total).min(1.0))
}

/// Records closer together than this were read together (a log's backlog, read at adoption or
/// reread after a move), not written as their epochs ended.
const BURST_S: f64 = 0.05;

/// How long a job's epochs take, as its records show them: the seconds between the last two
/// records that each finished an epoch (ProCon's f; reported to the coordinator as
/// `epoch_seconds`, where ProCon's and `soonest`'s placement and a move's payoff use it, as they
/// do in govsim). Not counted: the time up to the first record seen and from it to the next
/// epoch end (the first holds the job's start; the first record may have been written earlier
/// than read, or within an epoch), and the time after a burst (its records were written earlier
/// than read).
#[derive(Clone, Debug, Default)]
pub(super) struct EpochTimer {
    /// When the count of whole epochs last changed, to what, and whether that moment was an
    /// epoch's end as it happened (so that the next interval is an epoch's time).
    boundary: Option<(f64, u64, bool)>,
    /// The latest epoch time measured.
    seconds: Option<f64>,
}

impl EpochTimer {
    /// A record at `at_s` (the daemon's clock) says `epochs_done` epochs are done.
    pub(super) fn observe(&mut self, at_s: f64, epochs_done: f64) {
        if !epochs_done.is_finite() || epochs_done < 0.0 || !at_s.is_finite() {
            return;
        }
        let whole = epochs_done.floor() as u64;
        let Some((then, last, timed)) = self.boundary else {
            self.boundary = Some((at_s, whole, false));
            return;
        };
        if whole == last {
            return;
        }
        let dt = at_s - then;
        if whole > last && timed && dt >= BURST_S {
            self.seconds = Some(dt / (whole - last) as f64);
        }
        // A count that went down is a run logging anew (a restart from scratch): its next epoch
        // is timed from this record, as after any live one.
        self.boundary = Some((at_s, whole, dt >= BURST_S));
    }

    /// Seconds per epoch, once two epoch ends after the first record seen have arrived live.
    pub(super) fn seconds(&self) -> Option<f64> {
        self.seconds
    }
}

/// Epochs a record says are done (see [`work_fraction`] for how logs count them).
pub(super) fn epochs_done(record: &Record) -> Option<f64> {
    let epoch = record.epoch.filter(|e| e.is_finite() && *e >= 0.0)?;
    Some(if record.format == Format::KerasCsv {
        epoch + 1.0
    } else {
        epoch
    })
}

#[cfg(test)]
mod epoch_timer_tests {
    use super::EpochTimer;

    #[test]
    fn epochs_are_timed_between_live_epoch_ends_and_never_from_the_start() {
        let mut t = EpochTimer::default();
        // Keras writes a row as each epoch ends: the first after the job's 6 s start.
        t.observe(6.0, 1.0);
        assert_eq!(
            t.seconds(),
            None,
            "the time up to the first row holds the start"
        );
        // Whether the first row was read as it was written is not known (a backlog of one
        // row, or a row within an epoch): epochs are timed from the next epoch end.
        t.observe(8.0, 2.0);
        assert_eq!(t.seconds(), None);
        t.observe(8.5, 2.5); // a row within epoch 3 (fractional epochs)
        t.observe(11.0, 3.0);
        assert_eq!(t.seconds(), Some(3.0));
        t.observe(15.0, 5.0); // two epochs in one step
        assert_eq!(t.seconds(), Some(2.0));
    }

    #[test]
    fn a_backlog_read_at_once_is_not_an_epoch_time() {
        let mut t = EpochTimer::default();
        // Ten epochs read at adoption in 3 ms, then the job goes on at 4 s an epoch.
        for e in 1..=10 {
            t.observe(100.0 + e as f64 * 0.0003, e as f64);
        }
        assert_eq!(t.seconds(), None);
        // The 11th ends 2.5 s after the backlog was read: its epoch began before.
        t.observe(102.5, 11.0);
        assert_eq!(
            t.seconds(),
            None,
            "the epoch after a backlog began before it was read"
        );
        t.observe(106.5, 12.0);
        assert_eq!(t.seconds(), Some(4.0));
    }

    #[test]
    fn a_run_that_logs_anew_is_timed_from_its_own_epochs() {
        let mut t = EpochTimer::default();
        for (at, e) in [(1.0, 1.0), (3.0, 2.0), (5.0, 3.0)] {
            t.observe(at, e);
        }
        assert_eq!(t.seconds(), Some(2.0));
        t.observe(20.0, 1.0); // restarted from scratch
        t.observe(27.0, 2.0);
        assert_eq!(t.seconds(), Some(7.0));
        t.observe(30.0, f64::NAN);
        t.observe(f64::INFINITY, 3.0);
        assert_eq!(t.seconds(), Some(7.0), "bad input changes nothing");
    }
}
