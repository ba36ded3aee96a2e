//! Opt-in trial budget for a hyperparameter sweep: successive halving over the trials that run
//! on a node.
//!
//! Someone who launches a sweep wants its best trial, soon; most trials of a sweep are known to
//! be worse after a few epochs. Successive halving (Jamieson & Talwalkar 2016; the asynchronous
//! form, ASHA: Li et al., MLSys 2020) stops them there: rungs at `first_rung · η^k` epochs, and
//! at each rung only the best `1/η` of the trials go on. The CPU they leave goes to the trials
//! that go on, through the node policy's ordinary plan.
//!
//! This is not one of the seed papers. Two choices differ from ASHA as Ray Tune runs it (where a
//! trial reaching a rung is compared at once with those recorded there before it, so the first
//! ones to arrive always go on):
//! - **A rung is judged when every running trial of the sweep has reached it** (or ended, or
//!   been stopped): a node policy that serves some trials first would otherwise decide which
//!   trials survive, by the order in which they reach the rung. Trials ahead meanwhile keep
//!   running (nothing is paused: never starve); a trial that joins the sweep after its rung was
//!   judged is compared at once with every result recorded there (ASHA's rule).
//! - **A trial's loss at a rung is the best it logged up to that epoch**, not its latest value:
//!   one noisy validation epoch does not stop a trial that was ahead the epoch before.
//!
//! Of `n` results at a rung the best `ceil(n/η)` go on (at least one: a sweep always keeps a
//! trial). Trials whose log carries no epoch never reach a rung and are never stopped. Pure:
//! the caller (the daemon) feeds epochs and losses and stops the trials named in the verdicts.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::Direction;

/// How a sweep's trials are cut: rungs at `first_rung · eta^k` epochs, the best `1/eta` go on.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct HalvingRule {
    /// Reduction factor η (>= 2): one trial in η goes on at each rung.
    pub eta: u32,
    /// Epochs done at the first rung (> 0).
    pub first_rung: f64,
}

impl Default for HalvingRule {
    /// η = 3 (the papers' usual factor) and a first rung after 5 epochs: early enough to save
    /// most of a losing trial's work, late enough for a slow learning rate to show its slope.
    fn default() -> Self {
        HalvingRule {
            eta: 3,
            first_rung: 5.0,
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

/// What a job declares to be a trial of a sweep (`run-job --sweep NAME[:ETA:FIRST_RUNG]`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SweepTrial {
    /// The sweep's name: trials with the same name on one node are compared.
    pub sweep: String,
    pub rule: HalvingRule,
}

impl SweepTrial {
    /// Parse `NAME[:ETA:FIRST_RUNG]`, the one syntax of a sweep declaration (`GOVERNOR_SWEEP`,
    /// `run-job --sweep`, a job file's `sweep`, `govctl submit --sweep`, bench-real's
    /// `+sweep=`): a name of letters, digits, '.', '_' or '-' (at most 64), a whole ETA >= 2 and
    /// a first rung in epochs > 0; [`HalvingRule::default`] when only the name is given.
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
        let rule = match (parts.next(), parts.next(), parts.next()) {
            (None, _, _) => HalvingRule::default(),
            (Some(eta), Some(first), None) => HalvingRule {
                eta: eta.trim().parse().ok()?,
                first_rung: first.trim().parse().ok()?,
            },
            _ => return None,
        };
        rule.is_valid().then(|| SweepTrial {
            sweep: name.to_owned(),
            rule,
        })
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
    /// Its place among the rung's results (1 = best) and how many there were.
    pub place: usize,
    pub of: usize,
    /// How many of them go on.
    pub kept: usize,
    /// The worst loss that goes on.
    pub cutoff: f64,
}

impl<K: std::fmt::Display> Outranked<K> {
    /// "outranked in its sweep at 5 epochs: loss 0.31, 4th of 6, the best 2 go on (up to 0.22)".
    pub fn describe(&self) -> String {
        format!(
            "outranked in its sweep at {} epochs: loss {:.6}, {} of {}; the best {} go on (up to {:.6})",
            self.rung_epochs, self.loss, self.place, self.of, self.kept, self.cutoff
        )
    }
}

#[derive(Debug, Default)]
struct Rung<K> {
    /// Each trial's loss at the rung.
    results: BTreeMap<K, f64>,
    judged: bool,
}

#[derive(Debug)]
struct TrialState {
    /// Best loss so far.
    best: Option<f64>,
    /// Index of the next rung it has not reached yet.
    next_rung: usize,
    /// Declared epochs: no rung at or beyond them (the end is not a cut).
    max_epochs: Option<f64>,
    /// Stopped by the budget (still counted until it leaves; never judged again).
    stopped: bool,
}

/// One sweep's trials and rungs. `K` names a trial (the daemon uses its cgroup).
#[derive(Debug)]
pub struct Sweep<K: Ord + Clone> {
    rule: HalvingRule,
    direction: Direction,
    trials: BTreeMap<K, TrialState>,
    rungs: Vec<Rung<K>>,
    stopped_total: usize,
}

impl<K: Ord + Clone> Sweep<K> {
    pub fn new(rule: HalvingRule, direction: Direction) -> Self {
        Sweep {
            rule,
            direction,
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
    /// rung is judged sooner and less of a trial that may be cut is run.
    pub fn waiting_at(&self, trial: &K) -> Option<f64> {
        let s = self.trials.get(trial)?;
        if s.stopped {
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

    /// A trial logged `loss` with `epochs_done` epochs done. Returns the trials to stop.
    pub fn observe(&mut self, trial: &K, epochs_done: f64, loss: f64) -> Vec<Outranked<K>> {
        if !loss.is_finite() || !epochs_done.is_finite() {
            return Vec::new();
        }
        let rule = self.rule;
        let direction = self.direction;
        let Some(state) = self.trials.get_mut(trial) else {
            return Vec::new();
        };
        if state.stopped {
            return Vec::new();
        }
        state.best = Some(match state.best {
            Some(b) if !better(direction, loss, b) => b,
            _ => loss,
        });
        let best = state.best.unwrap_or(loss);
        let mut late = Vec::new();
        // Every rung it has now passed records its best so far.
        loop {
            let k = state.next_rung;
            let at = rule.rung_epochs(k);
            if epochs_done + 1e-9 < at || state.max_epochs.is_some_and(|m| at >= m - 1e-9) {
                break;
            }
            state.next_rung += 1;
            if self.rungs.len() <= k {
                self.rungs.resize_with(k + 1, || Rung {
                    results: BTreeMap::new(),
                    judged: false,
                });
            }
            self.rungs[k].results.insert(trial.clone(), best);
            if self.rungs[k].judged {
                late.push(k);
            }
        }
        let mut out = Vec::new();
        for k in late {
            // The rung was judged before it arrived: compared at once with every result there.
            if let Some(o) = self.rank(k).into_iter().find(|o| &o.trial == trial) {
                if let Some(s) = self.trials.get_mut(trial) {
                    s.stopped = true;
                }
                self.stopped_total += 1;
                out.push(o);
                break;
            }
        }
        out.extend(self.judge_complete_rungs());
        out
    }

    /// Judge every rung not judged yet whose running trials have all reached it.
    fn judge_complete_rungs(&mut self) -> Vec<Outranked<K>> {
        let mut out = Vec::new();
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
            for o in self.rank(k) {
                if let Some(s) = self.trials.get_mut(&o.trial)
                    && !s.stopped
                {
                    s.stopped = true;
                    self.stopped_total += 1;
                    out.push(o);
                }
            }
        }
        out
    }

    /// The results of rung `k` outside its best `ceil(n/η)`, best first.
    fn rank(&self, k: usize) -> Vec<Outranked<K>> {
        let rung = &self.rungs[k];
        let mut v: Vec<(&K, f64)> = rung.results.iter().map(|(id, l)| (id, *l)).collect();
        v.sort_by(|a, b| {
            let o = a.1.total_cmp(&b.1);
            match self.direction {
                Direction::Minimise => o,
                Direction::Maximise => o.reverse(),
            }
        });
        let n = v.len();
        let kept = n.div_ceil(self.rule.eta as usize).max(1);
        let cutoff = v.get(kept - 1).map(|x| x.1).unwrap_or(f64::NAN);
        v.iter()
            .enumerate()
            .skip(kept)
            .map(|(i, (id, loss))| Outranked {
                trial: (*id).clone(),
                rung_epochs: self.rule.rung_epochs(k),
                loss: *loss,
                place: i + 1,
                of: n,
                kept,
                cutoff,
            })
            .collect()
    }
}

fn better(direction: Direction, a: f64, b: f64) -> bool {
    match direction {
        Direction::Minimise => a < b,
        Direction::Maximise => a > b,
    }
}

/// Every sweep on a node, by name.
#[derive(Debug)]
pub struct Sweeps<K: Ord + Clone> {
    sweeps: BTreeMap<String, Sweep<K>>,
    /// Which sweep each trial is in.
    member_of: BTreeMap<K, String>,
    /// Sweeps whose trials asked for another rule than the first one's (reported once).
    mismatched: BTreeSet<String>,
}

impl<K: Ord + Clone> Default for Sweeps<K> {
    fn default() -> Self {
        Sweeps {
            sweeps: BTreeMap::new(),
            member_of: BTreeMap::new(),
            mismatched: BTreeSet::new(),
        }
    }
}

impl<K: Ord + Clone> Sweeps<K> {
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
            .or_insert_with(|| Sweep::new(rule, direction));
        let same = sweep.rule() == rule;
        sweep.join(trial.clone(), max_epochs);
        self.member_of.insert(trial, name.to_owned());
        // The first mismatch is reported (false), later ones are not.
        same || !self.mismatched.insert(name.to_owned())
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
mod tests {
    use super::*;

    fn rule() -> HalvingRule {
        HalvingRule {
            eta: 3,
            first_rung: 5.0,
        }
    }

    /// Six trials whose loss at each epoch is `base[i] / epoch`.
    fn six() -> Sweep<&'static str> {
        let mut s = Sweep::new(rule(), Direction::Minimise);
        for t in ["a", "b", "c", "d", "e", "f"] {
            s.join(t, Some(45.0));
        }
        s
    }

    #[test]
    fn a_rung_is_judged_only_when_every_running_trial_reached_it() {
        let mut s = six();
        let base = [
            ("a", 1.0),
            ("b", 2.0),
            ("c", 3.0),
            ("d", 4.0),
            ("e", 5.0),
            ("f", 6.0),
        ];
        // The worst trials get there first: nothing is decided by arrival order.
        for (t, b) in base.iter().rev().take(5) {
            assert!(s.observe(t, 5.0, b / 5.0).is_empty(), "{t} judged early");
        }
        assert_eq!(
            s.waiting_at(&"f"),
            Some(5.0),
            "f waits for the others at 5 epochs"
        );
        assert_eq!(s.waiting_at(&"a"), None, "a is on its way");
        let stops = s.observe(&"a", 5.0, 0.2);
        assert_eq!(s.waiting_at(&"f"), None, "judged: nothing to wait for");
        let mut names: Vec<_> = stops.iter().map(|o| o.trial).collect();
        names.sort();
        assert_eq!(names, ["c", "d", "e", "f"], "the best ceil(6/3) = 2 go on");
        let d = stops.iter().find(|o| o.trial == "d").unwrap();
        assert_eq!((d.place, d.of, d.kept), (4, 6, 2));
        assert!((d.cutoff - 0.4).abs() < 1e-12);
        assert!(d.describe().contains("at 5 epochs"), "{}", d.describe());
        assert_eq!(s.stopped(), 4);
    }

    #[test]
    fn the_survivors_are_cut_again_and_one_trial_always_goes_on() {
        let mut s = six();
        for (t, l) in [
            ("a", 0.2),
            ("b", 0.3),
            ("c", 0.5),
            ("d", 0.6),
            ("e", 0.7),
            ("f", 0.8),
        ] {
            s.observe(&t, 5.0, l);
        }
        // The stopped ones end; a and b reach 15 epochs: b is cut, a runs to its end (45:
        // no rung at the end).
        for t in ["c", "d", "e", "f"] {
            assert!(s.leave(&t).is_empty());
        }
        assert!(s.observe(&"b", 15.0, 0.1).is_empty());
        let stops = s.observe(&"a", 15.0, 0.05);
        assert_eq!(stops.len(), 1);
        assert_eq!(stops[0].trial, "b");
        assert!(
            s.observe(&"a", 45.0, 0.01).is_empty(),
            "no cut at the declared end"
        );
    }

    #[test]
    fn a_rung_uses_the_best_loss_so_far_and_a_skipped_rung_counts() {
        let mut s = Sweep::new(rule(), Direction::Minimise);
        s.join("noisy", None);
        s.join("steady", None);
        s.observe(&"noisy", 4.0, 0.1);
        // A bad epoch at the rung: its best (0.1) stands.
        s.observe(&"noisy", 5.0, 0.9);
        let stops = s.observe(&"steady", 5.0, 0.2);
        assert_eq!(stops.len(), 1);
        assert_eq!(stops[0].trial, "steady");
        // A trial whose log jumps past two rungs records both.
        let mut s = Sweep::new(rule(), Direction::Minimise);
        s.join("a", None);
        s.join("b", None);
        s.observe(&"a", 16.0, 0.3);
        let stops = s.observe(&"b", 16.0, 0.1);
        assert_eq!(stops.iter().map(|o| o.trial).collect::<Vec<_>>(), ["a"]);
        assert_eq!(stops[0].rung_epochs, 5.0, "cut at the first rung it failed");
    }

    #[test]
    fn a_trial_that_ends_releases_the_rung_and_a_late_one_is_compared_at_once() {
        let mut s = Sweep::new(rule(), Direction::Minimise);
        for t in ["a", "b", "c"] {
            s.join(t, None);
        }
        s.observe(&"a", 5.0, 0.1);
        s.observe(&"b", 5.0, 0.2);
        // c crashes before the rung: the rung is judged without it.
        let stops = s.leave(&"c");
        assert_eq!(stops.iter().map(|o| o.trial).collect::<Vec<_>>(), ["b"]);
        // A trial that joins after the judgement is compared with the results there.
        s.join("late", None);
        let stops = s.observe(&"late", 5.0, 0.15);
        assert_eq!(stops.len(), 1, "0.15 is 2nd of 3: only the best goes on");
        assert_eq!((stops[0].place, stops[0].of), (2, 3));
        s.join("later", None);
        assert!(
            s.observe(&"later", 5.0, 0.05).is_empty(),
            "the new best goes on"
        );
    }

    #[test]
    fn maximised_signals_keep_the_highest_and_bad_values_are_ignored() {
        let mut s = Sweep::new(rule(), Direction::Maximise);
        s.join("a", None);
        s.join("b", None);
        assert!(s.observe(&"a", 5.0, f64::NAN).is_empty());
        s.observe(&"a", 5.0, 0.9);
        let stops = s.observe(&"b", 5.0, 0.8);
        assert_eq!(stops[0].trial, "b");
    }

    #[test]
    fn sweeps_keep_their_first_rule_and_forget_an_empty_sweep() {
        let mut all: Sweeps<u32> = Sweeps::default();
        assert!(all.join("lr", rule(), Direction::Minimise, 1, None));
        let other = HalvingRule {
            eta: 2,
            first_rung: 1.0,
        };
        assert!(!all.join("lr", other, Direction::Minimise, 2, None));
        assert!(
            all.join("lr", other, Direction::Minimise, 3, None),
            "reported once"
        );
        assert_eq!(all.get("lr").unwrap().rule(), rule());
        assert_eq!(all.sweep_of(&2), Some("lr"));
        all.observe(&1, 5.0, 0.1);
        all.observe(&2, 5.0, 0.2);
        let stops = all.observe(&3, 5.0, 0.3);
        assert_eq!(stops.len(), 2);
        for t in [1, 2, 3] {
            all.leave(&t);
        }
        assert!(all.get("lr").is_none());
        assert!(all.observe(&1, 10.0, 0.1).is_empty());
    }
}
