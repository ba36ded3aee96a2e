//! GPU power by training progress: the power limit a GPU should run at, given the learning
//! stage of the jobs on it.
//!
//! A job that is still learning runs its GPU at the limit the GPU had before the governor
//! touched it (its *original*, normally the device default): slowing it would delay its time to
//! quality. A job whose learning slowed down (watching) or stopped (converged) gains little from
//! each further step, so its GPU runs at a fraction of the original: the energy of the steps
//! after convergence is where Zeus (15-76%) and EnvPipe (25% at under 1% slowdown) find their
//! savings. A GPU shared by several jobs follows its most demanding one. The limit never goes
//! below the device's minimum nor above the original (so never above the default either).
//!
//! Where the job's log gives its pace (records per second: its steps or epochs), the limit of a
//! GPU whose one job stopped learning is *searched* as Zeus does it ([`LimitSearch`]): measured
//! at the original, then one step lower at a time while the pace stays within the slowdown
//! budget (2%), settling on the lowest limit that kept it. The fixed fractions are the fallback
//! for a shared GPU, a log too sparse to measure, and the time before the search settles.

use crate::Category;

/// Fractions of the original limit by stage (`[gpu] watching_power`, `converged_power`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GpuPowerParams {
    pub watching: f64,
    pub converged: f64,
}

impl Default for GpuPowerParams {
    fn default() -> Self {
        GpuPowerParams {
            watching: 0.8,
            converged: 0.6,
        }
    }
}

/// A GPU's power range, milliwatts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PowerRange {
    /// The device's lowest settable limit.
    pub min_mw: u32,
    /// Its default limit.
    pub default_mw: u32,
    /// The limit before the governor's first change (what it restores).
    pub original_mw: u32,
}

/// The limit for a GPU whose governed jobs are at `stages`; `None` when it has none (it goes
/// back to its original).
pub fn target_limit(range: PowerRange, stages: &[Category], params: GpuPowerParams) -> Option<u32> {
    let top = range.original_mw.min(range.default_mw).max(range.min_mw);
    let per_job = |c: &Category| -> f64 {
        let f = match c {
            Category::Unknown | Category::Progressing => 1.0,
            Category::Watching => params.watching,
            Category::Converged => params.converged,
        };
        f.clamp(0.0, 1.0) * f64::from(top)
    };
    let wanted = stages
        .iter()
        .map(per_job)
        .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))))?;
    Some((wanted.round() as u32).clamp(range.min_mw.min(top), top))
}

/// Where a [`LimitSearch`] stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SearchState {
    /// Measuring the pace at this limit.
    Trying(u32),
    /// The lowest limit found within the budget.
    Settled(u32),
    /// The log is too sparse to measure a pace: use the fixed fractions.
    NoSignal,
}

/// Zeus's power-limit search for one GPU running one job that stopped learning: the pace at
/// the original limit, then at one `step` lower at a time, each over a window of at least
/// `window_s` seconds and `window_records` records, until the pace falls below
/// `(1 - slowdown)` of the first; it settles on the lowest limit that kept the pace. The pace is
/// records over the time between the records that bound the window (their arrival times, not
/// the sampling instants: a 10-record window sampled once a second would be ±10% off, five
/// times the budget). A window that sees fewer records than needed within `max_window_s`
/// means the log is too sparse.
#[derive(Clone, Debug, PartialEq)]
pub struct LimitSearch {
    top: u32,
    min: u32,
    step: u32,
    slowdown: f64,
    pub window_s: f64,
    pub window_records: u64,
    pub max_window_s: f64,
    baseline: Option<f64>,
    best: u32,
    state: SearchState,
    /// Records seen when the limit was first seen in force: the window opens at the next one.
    armed: Option<u64>,
    /// The window: (arrival of its first record, records then).
    since: Option<(f64, u64)>,
}

impl LimitSearch {
    /// A search from the original limit down to the device's minimum, in steps of 10% of the
    /// original.
    pub fn new(range: PowerRange, slowdown: f64) -> LimitSearch {
        let top = range.original_mw.min(range.default_mw).max(range.min_mw);
        LimitSearch {
            top,
            min: range.min_mw.min(top),
            step: (top / 10).max(1),
            slowdown: slowdown.clamp(0.0, 1.0),
            window_s: 10.0,
            window_records: 3,
            max_window_s: 120.0,
            baseline: None,
            best: top,
            state: SearchState::Trying(top),
            armed: None,
            since: None,
        }
    }

    pub fn state(&self) -> SearchState {
        self.state
    }

    /// Feed what is seen now: the limit in force, the job's records so far and when the last
    /// of them arrived. Returns where the search stands (the limit to set while `Trying` or
    /// `Settled`).
    pub fn observe(
        &mut self,
        now: f64,
        limit_in_force: u32,
        records: u64,
        last_record_at: f64,
    ) -> SearchState {
        let SearchState::Trying(trying) = self.state else {
            return self.state;
        };
        if limit_in_force != trying {
            // Not set yet: the window starts once it is.
            self.armed = None;
            self.since = None;
            return self.state;
        }
        let Some((t0, r0)) = self.since else {
            // The window opens at the first record that arrives wholly under this limit (a
            // record under way when it changed was partly made at the old one).
            match self.armed {
                None => self.armed = Some(records),
                Some(a) if records > a => self.since = Some((last_record_at, records)),
                Some(_) => {}
            }
            return self.state;
        };
        let n = records.saturating_sub(r0);
        let elapsed = last_record_at - t0;
        if n < self.window_records || elapsed < self.window_s {
            if now - t0 > self.max_window_s && n < self.window_records {
                self.armed = None;
                self.state = match self.baseline {
                    // Too sparse to judge a lower limit: keep the last one that passed.
                    Some(_) => SearchState::Settled(self.best),
                    None => SearchState::NoSignal,
                };
            }
            return self.state;
        }
        let pace = n as f64 / elapsed;
        let kept = match self.baseline {
            None => {
                self.baseline = Some(pace);
                true
            }
            Some(b) => pace >= (1.0 - self.slowdown) * b,
        };
        if kept {
            self.best = trying;
            let next = trying.saturating_sub(self.step);
            self.state = if trying <= self.min || next < self.min {
                if trying > self.min {
                    SearchState::Trying(self.min)
                } else {
                    SearchState::Settled(self.best)
                }
            } else {
                SearchState::Trying(next)
            };
        } else {
            self.state = SearchState::Settled(self.best);
        }
        self.armed = None;
        self.since = None;
        self.state
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A job whose pace is flat down to 70% of the original limit and falls below it.
    fn pace_at(limit: u32) -> f64 {
        let l = f64::from(limit) / 700_000.0;
        if l >= 0.7 { 1.0 } else { (l / 0.7).powf(0.6) }
    }

    /// Drive a search: the job logs a record every `1 / pace` seconds at the limit in force;
    /// the search looks at every record (and the limit changes at once).
    fn run(search: &mut LimitSearch, records: u64, pace: impl Fn(u32) -> f64) -> Vec<u32> {
        let mut limit = H100.original_mw;
        let mut at = 0.0;
        let mut seen = Vec::new();
        for r in 1..=records {
            at += 1.0 / pace(limit);
            match search.observe(at, limit, r, at) {
                SearchState::Trying(l) | SearchState::Settled(l) => {
                    if seen.last() != Some(&l) {
                        seen.push(l);
                    }
                    limit = l;
                }
                SearchState::NoSignal => break,
            }
        }
        seen
    }

    #[test]
    fn the_search_settles_on_the_lowest_limit_within_the_slowdown() {
        let mut s = LimitSearch::new(H100, 0.02);
        let seen = run(&mut s, 400, pace_at);
        // 420 kW is 8.8% slower: back to the last limit within 2%.
        assert_eq!(s.state(), SearchState::Settled(490_000), "{seen:?}");
        assert_eq!(seen, [700_000, 630_000, 560_000, 490_000, 420_000, 490_000]);
    }

    #[test]
    fn a_flat_pace_goes_down_to_the_minimum_and_a_sparse_log_gives_no_signal() {
        let mut s = LimitSearch::new(H100, 0.02);
        run(&mut s, 1000, |_| 1.0);
        assert_eq!(s.state(), SearchState::Settled(200_000));
        // One record in three minutes: nothing to measure.
        let mut sparse = LimitSearch::new(H100, 0.02);
        assert_eq!(
            sparse.observe(0.0, 700_000, 1, 0.0),
            SearchState::Trying(700_000)
        );
        assert_eq!(
            sparse.observe(1.0, 700_000, 2, 1.0),
            SearchState::Trying(700_000)
        );
        assert_eq!(
            sparse.observe(200.0, 700_000, 3, 180.0),
            SearchState::NoSignal
        );
    }

    const H100: PowerRange = PowerRange {
        min_mw: 200_000,
        default_mw: 700_000,
        original_mw: 700_000,
    };

    #[test]
    fn learning_jobs_keep_the_original_and_converged_ones_lower_it() {
        let p = GpuPowerParams::default();
        assert_eq!(
            target_limit(H100, &[Category::Progressing], p),
            Some(700_000)
        );
        assert_eq!(target_limit(H100, &[Category::Unknown], p), Some(700_000));
        assert_eq!(target_limit(H100, &[Category::Watching], p), Some(560_000));
        assert_eq!(target_limit(H100, &[Category::Converged], p), Some(420_000));
        assert_eq!(target_limit(H100, &[], p), None);
    }

    #[test]
    fn a_shared_gpu_follows_its_most_demanding_job() {
        let p = GpuPowerParams::default();
        let stages = [Category::Converged, Category::Progressing];
        assert_eq!(target_limit(H100, &stages, p), Some(700_000));
        let stages = [Category::Converged, Category::Watching];
        assert_eq!(target_limit(H100, &stages, p), Some(560_000));
    }

    #[test]
    fn never_below_the_minimum_nor_above_the_original_or_default() {
        let p = GpuPowerParams {
            watching: 0.1,
            converged: 0.0,
        };
        assert_eq!(target_limit(H100, &[Category::Converged], p), Some(200_000));
        let lowered_by_admin = PowerRange {
            original_mw: 500_000,
            ..H100
        };
        let up = GpuPowerParams {
            watching: 2.0,
            converged: 2.0,
        };
        assert_eq!(
            target_limit(lowered_by_admin, &[Category::Converged], up),
            Some(500_000)
        );
        let above_default = PowerRange {
            original_mw: 800_000,
            ..H100
        };
        assert_eq!(
            target_limit(above_default, &[Category::Progressing], p),
            Some(700_000)
        );
    }
}
