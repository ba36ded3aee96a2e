//! Opt-in trial budget for a hyperparameter sweep: successive halving over a sweep's trials,
//! on one node (the daemon) or across the cluster (the coordinator's planner).
//!
//! Someone who launches a sweep wants its best trial, soon; most trials of a sweep are known to
//! be worse after a few epochs. Successive halving (Jamieson & Talwalkar 2016; the asynchronous
//! form, ASHA: Li et al., MLSys 2020) stops them there: rungs at `first_rung · η^k` epochs, and
//! at each rung only the best `1/η` of the trials go on. The CPU they leave goes to the trials
//! that go on, through the node policy's ordinary plan, or to queued trials on the cluster.
//!
//! This is not one of the seed papers. Choices, and where they differ from ASHA as Ray Tune
//! runs it:
//! - **Trials are ranked by predicted final loss, and one outside the best `1/η` is cut only
//!   when it is confidently worse** ([`Ranking::Predicted`], the default; issue 32, 2c). At a
//!   rung each trial's curve so far is extrapolated to its end ([`crate::predict::predict`]: the
//!   parametric family that fits it best, with a spread); a trial is cut when even its optimistic
//!   end (predicted − [`CONFIDENCE`] spreads) is worse than the pessimistic end of the last trial
//!   that goes on (predicted + [`CONFIDENCE`] spreads, and never worse than the best it has
//!   logged). A slow learning rate whose loss still falls steeply is therefore not cut for being
//!   behind at the rung: measured on real sweeps, ranking by the loss seen there cut the
//!   eventual winner (docs/evaluation/real-jobs.md). A curve too short to fit (fewer than three
//!   values) is never confidently worse. [`Ranking::Seen`] (`NAME:ETA:FIRST_RUNG:seen`) is the
//!   plain rule (the best loss logged by the rung), kept for comparison.
//! - **On one node a rung is judged when every running trial of the sweep has reached it**
//!   ([`Judging::Together`]; or ended, or been stopped): a node policy that serves some trials
//!   first would otherwise decide which trials survive, by the order in which they reach the
//!   rung. Trials ahead meanwhile keep running (nothing is paused: never starve); a trial that
//!   joins the sweep after its rung was judged is compared at once with every result recorded
//!   there (ASHA's rule).
//! - **Across the cluster a rung is judged at each arrival** ([`Judging::OnArrival`], ASHA's
//!   asynchronous rule): against the results recorded there so far, no waiting for stragglers
//!   on other nodes (whose speed the coordinator does not control), so no trial is held at a
//!   rung while the slowest catches up. Ranked by prediction, and unlike Ray Tune's ASHA, a
//!   trial that went on from a rung because it arrived early is stopped when later results
//!   there show it confidently outside the best `1/η` (trials started together reach every
//!   rung in the same order, so the first would otherwise never be cut: `govsim hpo` measured
//!   -24% to -33% on the sweep's result, -44% to -57% on its CPU-seconds, the winner kept in
//!   20 of 20). `:seen` is ASHA as published: the first arrivals at a rung go on.
//! - **A trial's loss at a rung is the best it logged up to that epoch**, not its latest value:
//!   one noisy validation epoch does not stop a trial that was ahead the epoch before.
//!
//! Of `n` results at a rung the best `ceil(n/η)` go on (at least one: a sweep always keeps a
//! trial). Trials whose log carries no epoch never reach a rung and are never stopped. Pure:
//! the caller (the daemon, the planner) feeds epochs and losses and stops the trials named in
//! the verdicts.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::Direction;
use crate::predict;

/// Spreads of a prediction a trial must be worse by to be cut ([`Ranking::Predicted`]): two,
/// as the default policy's verdict "past its quality point" (`govsim predict` measured it).
pub const CONFIDENCE: f64 = 2.0;

/// Values of a trial's curve kept for its prediction ([`predict::thin`] beyond).
const CURVE_POINTS: usize = 256;

/// How a rung ranks its results.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Ranking {
    /// By the final loss predicted from each curve; cut only when confidently worse.
    #[default]
    Predicted,
    /// By the best loss logged by the rung (successive halving as published).
    Seen,
}

/// When a rung is judged.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Judging {
    /// When every running trial has reached it (one node: the daemon).
    #[default]
    Together,
    /// Each trial as it reaches it, against the results there so far (ASHA; the cluster).
    OnArrival,
}

/// How a sweep's trials are cut: rungs at `first_rung · eta^k` epochs, the best `1/eta` go on.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct HalvingRule {
    /// Reduction factor η (>= 2): one trial in η goes on at each rung.
    pub eta: u32,
    /// Epochs done at the first rung (> 0).
    pub first_rung: f64,
    /// How a rung ranks its results.
    #[serde(default)]
    pub ranking: Ranking,
}

impl Default for HalvingRule {
    /// η = 3 (the papers' usual factor) and a first rung after 5 epochs: early enough to save
    /// most of a losing trial's work, late enough for a slow learning rate to show its slope;
    /// ranked by prediction.
    fn default() -> Self {
        HalvingRule {
            eta: 3,
            first_rung: 5.0,
            ranking: Ranking::Predicted,
        }
    }
}

impl HalvingRule {
    /// Whether the rule can be followed (η >= 2, a positive finite first rung).
    pub fn is_valid(&self) -> bool {
        self.eta >= 2 && self.first_rung.is_finite() && self.first_rung > 0.0
    }

    /// Epochs at rung `k`.
    pub fn rung_epochs(&self, k: usize) -> f64 {
        self.first_rung * f64::from(self.eta).powi(k.min(64) as i32)
    }
}

/// What a job declares to be a trial of a sweep (`run-job --sweep NAME[:ETA:FIRST_RUNG[:seen]]`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SweepTrial {
    /// The sweep's name: trials with the same name are compared (on a node for `run-job`,
    /// across the cluster for `govctl submit`).
    pub sweep: String,
    pub rule: HalvingRule,
}

impl SweepTrial {
    /// Parse `NAME[:ETA:FIRST_RUNG[:seen]]`, the one syntax of a sweep declaration
    /// (`GOVERNOR_SWEEP`, `run-job --sweep`, a job file's `sweep`, `govctl submit --sweep`,
    /// bench-real's `+sweep=`): a name of letters, digits, '.', '_' or '-' (at most 64), a whole
    /// ETA >= 2 and a first rung in epochs > 0; [`HalvingRule::default`] when only the name is
    /// given; `:seen` ranks by the loss seen at the rung instead of the predicted one.
    pub fn parse(s: &str) -> Option<SweepTrial> {
        let mut parts = s.trim().split(':');
        let name = parts.next().unwrap_or_default().trim();
        if name.is_empty()
            || name.len() > 64
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        {
            return None;
        }
        let rest: Vec<&str> = parts.map(str::trim).collect();
        let rule = match rest[..] {
            [] => HalvingRule::default(),
            [eta, first] | [eta, first, _] => HalvingRule {
                eta: eta.parse().ok()?,
                first_rung: first.parse().ok()?,
                ranking: match rest.get(2) {
                    None | Some(&"predicted") => Ranking::Predicted,
                    Some(&"seen") => Ranking::Seen,
                    Some(_) => return None,
                },
            },
            _ => return None,
        };
        rule.is_valid().then(|| SweepTrial {
            sweep: name.to_owned(),
            rule,
        })
    }
}

impl std::fmt::Display for SweepTrial {
    /// The one spelling [`SweepTrial::parse`] reads back (`:seen` only when asked for).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}:{}:{}",
            self.sweep, self.rule.eta, self.rule.first_rung
        )?;
        if self.rule.ranking == Ranking::Seen {
            f.write_str(":seen")?;
        }
        Ok(())
    }
}

/// A trial to stop: it was not among the best at a rung.
#[derive(Clone, Debug, PartialEq)]
pub struct Outranked<K> {
    pub trial: K,
    /// The rung's epochs.
    pub rung_epochs: f64,
    /// Its loss there (the best it had logged by then).
    pub loss: f64,
    /// Its predicted final loss and that prediction's spread ([`Ranking::Predicted`]).
    pub predicted: Option<(f64, f64)>,
    /// Its place among the rung's results (1 = best) and how many there were.
    pub place: usize,
    pub of: usize,
    /// How many of them go on.
    pub kept: usize,
    /// The worst loss that goes on (predicted: the pessimistic end of the last trial kept).
    pub cutoff: f64,
}

impl<K: std::fmt::Display> Outranked<K> {
    /// "outranked in its sweep at 5 epochs: loss 0.31, 4th of 6, the best 2 go on (up to 0.22)".
    pub fn describe(&self) -> String {
        match self.predicted {
            Some((p, spread)) => format!(
                "outranked in its sweep at {} epochs: loss {:.6}, predicted final {:.6} ± {:.6}, {} of {}; the best {} go on (up to {:.6} at worst)",
                self.rung_epochs, self.loss, p, spread, self.place, self.of, self.kept, self.cutoff
            ),
            None => format!(
                "outranked in its sweep at {} epochs: loss {:.6}, {} of {}; the best {} go on (up to {:.6})",
                self.rung_epochs, self.loss, self.place, self.of, self.kept, self.cutoff
            ),
        }
    }
}

/// A trial's standing at a rung, in the sweep's direction turned into "lower is better".
#[derive(Clone, Copy, Debug, PartialEq)]
struct Standing {
    /// Best value logged by the rung.
    best: f64,
    /// Predicted final value (never worse than `best`) and its spread; `best` and infinity
    /// when the curve is too short to fit.
    predicted: f64,
    spread: f64,
}

impl Standing {
    /// The end it reaches at best and at worst, with [`CONFIDENCE`].
    fn optimistic(&self) -> f64 {
        self.predicted - CONFIDENCE * self.spread
    }

    fn pessimistic(&self) -> f64 {
        (self.predicted + CONFIDENCE * self.spread).min(self.best)
    }
}

#[derive(Debug, Default)]
struct Rung<K> {
    /// Each trial's standing at the rung.
    results: BTreeMap<K, Standing>,
    judged: bool,
}

#[derive(Debug)]
struct TrialState {
    /// Best value so far (lower is better).
    best: Option<f64>,
    /// `(epochs, value)` logged, lower is better, thinned to [`CURVE_POINTS`].
    curve: Vec<(f64, f64)>,
    /// Index of the next rung it has not reached yet.
    next_rung: usize,
    /// Declared epochs: no rung at or beyond them (the end is not a cut).
    max_epochs: Option<f64>,
    /// Stopped by the budget (still counted until it leaves; never judged again).
    stopped: bool,
}

/// One sweep's trials and rungs. `K` names a trial (the daemon uses its cgroup, the planner
/// its job id).
#[derive(Debug)]
pub struct Sweep<K: Ord + Clone> {
    rule: HalvingRule,
    direction: Direction,
    judging: Judging,
    trials: BTreeMap<K, TrialState>,
    rungs: Vec<Rung<K>>,
    stopped_total: usize,
}

impl<K: Ord + Clone> Sweep<K> {
    /// A sweep on one node ([`Judging::Together`]).
    pub fn new(rule: HalvingRule, direction: Direction) -> Self {
        Self::judged(rule, direction, Judging::Together)
    }

    pub fn judged(rule: HalvingRule, direction: Direction, judging: Judging) -> Self {
        Sweep {
            rule,
            direction,
            judging,
            trials: BTreeMap::new(),
            rungs: Vec::new(),
            stopped_total: 0,
        }
    }

    pub fn rule(&self) -> HalvingRule {
        self.rule
    }

    /// Running trials (joined, not left).
    pub fn trials(&self) -> usize {
        self.trials.len()
    }

    /// Trials the budget has stopped so far.
    pub fn stopped(&self) -> usize {
        self.stopped_total
    }

    /// The rung (its epochs) a running trial waits at for the others: it has a result at a
    /// rung not judged yet. The node policy serves such a trial after the others, so that the
    /// rung is judged sooner and less of a trial that may be cut is run. Never with
    /// [`Judging::OnArrival`] (nothing waits).
    pub fn waiting_at(&self, trial: &K) -> Option<f64> {
        let s = self.trials.get(trial)?;
        if s.stopped || self.judging == Judging::OnArrival {
            return None;
        }
        self.rungs
            .iter()
            .position(|r| !r.judged && r.results.contains_key(trial))
            .map(|k| self.rule.rung_epochs(k))
    }

    /// A trial starts (again: a trial that joins twice keeps its state).
    pub fn join(&mut self, trial: K, max_epochs: Option<f64>) {
        self.trials.entry(trial).or_insert(TrialState {
            best: None,
            curve: Vec::new(),
            next_rung: 0,
            max_epochs: max_epochs.filter(|e| e.is_finite() && *e > 0.0),
            stopped: false,
        });
    }

    /// A trial ended (by itself, or stopped): rungs that waited only for it are judged.
    pub fn leave(&mut self, trial: &K) -> Vec<Outranked<K>> {
        if self.trials.remove(trial).is_none() {
            return Vec::new();
        }
        self.judge_complete_rungs()
    }

    /// A trial (back after a restart of its judge) takes up its curve `(epochs, value)` and
    /// whether it was stopped: the rungs it passed record its results there, judging nothing.
    pub fn rejoin(
        &mut self,
        trial: K,
        max_epochs: Option<f64>,
        curve: &[(f64, f64)],
        stopped: bool,
    ) {
        self.join(trial.clone(), max_epochs);
        for &(epochs, value) in curve {
            self.record(&trial, epochs, value);
        }
        if let Some(s) = self.trials.get_mut(&trial)
            && stopped
            && !s.stopped
        {
            s.stopped = true;
            self.stopped_total += 1;
        }
        for k in 0..self.rungs.len() {
            if !self.rungs[k].judged && !self.rungs[k].results.is_empty() {
                // Judged before the restart if any trial went past it.
                self.rungs[k].judged = self.judging == Judging::OnArrival
                    || self.trials.values().any(|t| t.next_rung > k + 1);
            }
        }
    }

    /// Record a value; returns the rungs the trial reached with it.
    fn record(&mut self, trial: &K, epochs_done: f64, value: f64) -> Vec<usize> {
        if !value.is_finite() || !epochs_done.is_finite() {
            return Vec::new();
        }
        let rule = self.rule;
        let lower = match self.direction {
            Direction::Minimise => value,
            Direction::Maximise => -value,
        };
        let Some(state) = self.trials.get_mut(trial) else {
            return Vec::new();
        };
        if state.stopped {
            return Vec::new();
        }
        state.best = Some(state.best.map_or(lower, |b| b.min(lower)));
        let best = state.best.unwrap_or(lower);
        match state.curve.last_mut() {
            // A log that repeats an epoch's position updates its value.
            Some(last) if last.0 >= epochs_done => last.1 = last.1.min(lower),
            _ => state.curve.push((epochs_done, lower)),
        }
        predict::thin(&mut state.curve, CURVE_POINTS);
        let mut reached = Vec::new();
        // Every rung it has now passed records its standing so far.
        loop {
            let k = state.next_rung;
            let at = rule.rung_epochs(k);
            if epochs_done + 1e-9 < at || state.max_epochs.is_some_and(|m| at >= m - 1e-9) {
                break;
            }
            state.next_rung += 1;
            let horizon = state.max_epochs.unwrap_or(at * f64::from(rule.eta));
            let standing = standing(rule.ranking, &state.curve, best, horizon);
            if self.rungs.len() <= k {
                self.rungs.resize_with(k + 1, || Rung {
                    results: BTreeMap::new(),
                    judged: false,
                });
            }
            self.rungs[k].results.insert(trial.clone(), standing);
            reached.push(k);
        }
        reached
    }

    /// A trial logged `value` with `epochs_done` epochs done. Returns the trials to stop.
    pub fn observe(&mut self, trial: &K, epochs_done: f64, value: f64) -> Vec<Outranked<K>> {
        let reached = self.record(trial, epochs_done, value);
        let mut out = Vec::new();
        for k in reached {
            if self.judging == Judging::OnArrival && self.rule.ranking == Ranking::Predicted {
                // Judged on arrival (the cluster), ranked by prediction: the rung is ranked
                // again with the new result, and every running trial that went on from it but
                // is now confidently outside its best 1/η stops, the newcomer included. A trial
                // that arrived first goes on while it is ahead, not for good: with trials
                // started together the same trial would otherwise arrive first at every rung
                // and never be cut.
                self.rungs[k].judged = true;
                out.extend(self.stop_outranked(k));
            } else if self.judging == Judging::OnArrival || self.rungs[k].judged {
                // Judged on arrival by the loss seen (ASHA as Ray Tune runs it: the first
                // arrivals go on), or the rung was judged before it arrived: compared at once
                // with every result there.
                self.rungs[k].judged = true;
                if let Some(o) = self.rank(k).into_iter().find(|o| &o.trial == trial) {
                    if let Some(s) = self.trials.get_mut(trial) {
                        s.stopped = true;
                    }
                    self.stopped_total += 1;
                    out.push(o);
                    break;
                }
            }
            if self.trials.get(trial).is_some_and(|s| s.stopped) {
                break;
            }
        }
        if self.judging == Judging::Together {
            out.extend(self.judge_complete_rungs());
        }
        out
    }

    /// Judge every rung not judged yet whose running trials have all reached it.
    fn judge_complete_rungs(&mut self) -> Vec<Outranked<K>> {
        let mut out = Vec::new();
        if self.judging == Judging::OnArrival {
            return out;
        }
        for k in 0..self.rungs.len() {
            if self.rungs[k].judged || self.rungs[k].results.is_empty() {
                continue;
            }
            let waiting = self.trials.iter().any(|(id, s)| {
                !s.stopped
                    && !self.rungs[k].results.contains_key(id)
                    && s.max_epochs
                        .is_none_or(|m| self.rule.rung_epochs(k) < m - 1e-9)
            });
            if waiting {
                // Later rungs cannot be complete either (a trial reaches them in order).
                break;
            }
            self.rungs[k].judged = true;
            out.extend(self.stop_outranked(k));
        }
        out
    }

    /// Stop every running trial rung `k` cuts ([`Sweep::rank`]); returns them.
    fn stop_outranked(&mut self, k: usize) -> Vec<Outranked<K>> {
        let mut out = Vec::new();
        for o in self.rank(k) {
            if let Some(s) = self.trials.get_mut(&o.trial)
                && !s.stopped
            {
                s.stopped = true;
                self.stopped_total += 1;
                out.push(o);
            }
        }
        out
    }

    /// The results of rung `k` to cut, best first: outside its best `ceil(n/η)` (by the
    /// rule's ranking) and, ranked by prediction, confidently worse than the last kept.
    fn rank(&self, k: usize) -> Vec<Outranked<K>> {
        let rung = &self.rungs[k];
        let predicted = self.rule.ranking == Ranking::Predicted;
        let key = |s: &Standing| if predicted { s.predicted } else { s.best };
        let mut v: Vec<(&K, Standing)> = rung.results.iter().map(|(id, s)| (id, *s)).collect();
        v.sort_by(|a, b| {
            key(&a.1)
                .total_cmp(&key(&b.1))
                .then(a.1.best.total_cmp(&b.1.best))
        });
        let n = v.len();
        let kept = n.div_ceil(self.rule.eta as usize).max(1);
        let last_kept = v[kept - 1].1;
        let cutoff = if predicted {
            last_kept.pessimistic()
        } else {
            last_kept.best
        };
        let outward = |x: f64| match self.direction {
            Direction::Minimise => x,
            Direction::Maximise => -x,
        };
        v.iter()
            .enumerate()
            .skip(kept)
            .filter(|(_, (_, s))| !predicted || s.optimistic() > cutoff)
            .map(|(i, (id, s))| Outranked {
                trial: (*id).clone(),
                rung_epochs: self.rule.rung_epochs(k),
                loss: outward(s.best),
                predicted: predicted.then(|| (outward(s.predicted), s.spread)),
                place: i + 1,
                of: n,
                kept,
                cutoff: outward(cutoff),
            })
            .collect()
    }
}

/// A trial's standing at a rung from its curve so far (lower is better); unknown (never
/// confidently worse) from fewer than three values.
fn standing(ranking: Ranking, curve: &[(f64, f64)], best: f64, horizon: f64) -> Standing {
    let unknown = Standing {
        best,
        predicted: best,
        spread: f64::INFINITY,
    };
    if ranking == Ranking::Seen {
        return Standing {
            spread: 0.0,
            ..unknown
        };
    }
    // The predictor fits a falling curve of positive values: shift a maximised signal (its
    // negation) to start at 1 above its best.
    let shift = if best <= 0.0 { 1.0 - best } else { 0.0 };
    if curve.len() < 3 {
        return unknown;
    }
    let points: Vec<(f64, f64)> = curve.iter().map(|&(x, y)| (x, y + shift)).collect();
    match predict::predict(&points, horizon) {
        Some(p) if p.final_value.is_finite() && p.spread.is_finite() => Standing {
            best,
            predicted: (p.final_value - shift).min(best),
            // The last-k slope (no falling family fits: a flat or rising curve) claims no
            // spread; its latest values' range is its uncertainty.
            spread: if p.method == predict::Method::LastSlope {
                let tail = &points[points.len().saturating_sub(predict::LAST_K)..];
                let (lo, hi) = tail
                    .iter()
                    .fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), p| {
                        (l.min(p.1), h.max(p.1))
                    });
                hi - lo
            } else {
                p.spread
            },
        },
        _ => unknown,
    }
}

/// Every sweep on a node (or on the cluster), by name.
#[derive(Debug)]
pub struct Sweeps<K: Ord + Clone> {
    judging: Judging,
    sweeps: BTreeMap<String, Sweep<K>>,
    /// Which sweep each trial is in.
    member_of: BTreeMap<K, String>,
    /// Sweeps whose trials asked for another rule than the first one's (reported once).
    mismatched: BTreeSet<String>,
}

impl<K: Ord + Clone> Default for Sweeps<K> {
    fn default() -> Self {
        Sweeps {
            judging: Judging::Together,
            sweeps: BTreeMap::new(),
            member_of: BTreeMap::new(),
            mismatched: BTreeSet::new(),
        }
    }
}

impl<K: Ord + Clone> Sweeps<K> {
    /// Sweeps whose rungs are judged as `judging` says (the default: [`Judging::Together`]).
    pub fn judged(judging: Judging) -> Self {
        Sweeps {
            judging,
            ..Self::default()
        }
    }

    /// A trial joins sweep `name`. The sweep follows the rule of its first trial; returns
    /// false (once per sweep) when this one asked for another rule.
    pub fn join(
        &mut self,
        name: &str,
        rule: HalvingRule,
        direction: Direction,
        trial: K,
        max_epochs: Option<f64>,
    ) -> bool {
        let sweep = self
            .sweeps
            .entry(name.to_owned())
            .or_insert_with(|| Sweep::judged(rule, direction, self.judging));
        let same = sweep.rule() == rule;
        sweep.join(trial.clone(), max_epochs);
        self.member_of.insert(trial, name.to_owned());
        // The first mismatch is reported (false), later ones are not.
        same || !self.mismatched.insert(name.to_owned())
    }

    /// A trial of `declared` takes up its place after a restart of its judge
    /// ([`Sweep::rejoin`]).
    pub fn rejoin(
        &mut self,
        declared: &SweepTrial,
        direction: Direction,
        trial: K,
        max_epochs: Option<f64>,
        curve: &[(f64, f64)],
        stopped: bool,
    ) {
        let name = declared.sweep.as_str();
        self.join(name, declared.rule, direction, trial.clone(), max_epochs);
        if let Some(s) = self.sweeps.get_mut(name) {
            s.rejoin(trial, max_epochs, curve, stopped);
        }
    }

    /// No sweep has a running trial.
    pub fn is_empty(&self) -> bool {
        self.sweeps.is_empty()
    }

    /// The sweep a trial is in.
    pub fn sweep_of(&self, trial: &K) -> Option<&str> {
        self.member_of.get(trial).map(String::as_str)
    }

    /// One sweep.
    pub fn get(&self, name: &str) -> Option<&Sweep<K>> {
        self.sweeps.get(name)
    }

    /// The rung a running trial waits at for the others of its sweep ([`Sweep::waiting_at`]).
    pub fn waiting_at(&self, trial: &K) -> Option<f64> {
        self.sweeps
            .get(self.member_of.get(trial)?)?
            .waiting_at(trial)
    }

    /// A trial logged a loss; returns the trials of its sweep to stop.
    pub fn observe(&mut self, trial: &K, epochs_done: f64, loss: f64) -> Vec<Outranked<K>> {
        let Some(name) = self.member_of.get(trial) else {
            return Vec::new();
        };
        match self.sweeps.get_mut(name) {
            Some(s) => s.observe(trial, epochs_done, loss),
            None => Vec::new(),
        }
    }

    /// A trial ended; returns the trials of its sweep to stop (rungs that waited for it).
    pub fn leave(&mut self, trial: &K) -> Vec<Outranked<K>> {
        let Some(name) = self.member_of.remove(trial) else {
            return Vec::new();
        };
        let Some(sweep) = self.sweeps.get_mut(&name) else {
            return Vec::new();
        };
        let out = sweep.leave(trial);
        if sweep.trials() == 0 {
            self.sweeps.remove(&name);
            self.mismatched.remove(&name);
        }
        out
    }
}

#[cfg(test)]
#[path = "sweep_tests.rs"]
mod tests;
