use super::*;

/// Successive halving as published: ranked by the loss seen at the rung.
fn rule() -> HalvingRule {
    HalvingRule {
        eta: 3,
        first_rung: 5.0,
        ranking: Ranking::Seen,
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
        ranking: Ranking::Seen,
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

/// Three trials whose loss at epoch `e` (1..=5) is: `plateau` 0.5 + 0.5/e (ahead at the rung,
/// nearly done), `steep` 0.2 + e^(-0.1e) (behind at the rung, still falling fast: it ends
/// lowest at 45 epochs) and `flat` 2 + 0.1/e (worst, and done).
fn three_curves(ranking: Ranking) -> Vec<Outranked<&'static str>> {
    let mut s = Sweep::new(HalvingRule { ranking, ..rule() }, Direction::Minimise);
    for t in ["plateau", "steep", "flat"] {
        s.join(t, Some(45.0));
    }
    let mut stops = Vec::new();
    for e in 1..=5 {
        let e = f64::from(e);
        stops.extend(s.observe(&"plateau", e, 0.5 + 0.5 / e));
        stops.extend(s.observe(&"steep", e, 0.2 + (-0.1 * e).exp()));
        stops.extend(s.observe(&"flat", e, 2.0 + 0.1 / e));
    }
    stops
}

#[test]
fn ranked_by_prediction_a_trial_behind_but_still_falling_steeply_goes_on() {
    let seen: Vec<_> = three_curves(Ranking::Seen)
        .into_iter()
        .map(|o| o.trial)
        .collect();
    assert!(
        seen.contains(&"steep"),
        "the loss seen at the rung cuts the eventual winner: {seen:?}"
    );
    let stops = three_curves(Ranking::Predicted);
    let mut cut: Vec<_> = stops.iter().map(|o| o.trial).collect();
    cut.sort();
    assert_eq!(cut, ["flat", "plateau"], "{stops:?}");
    let flat = stops.iter().find(|o| o.trial == "flat").unwrap();
    let (predicted, spread) = flat.predicted.unwrap();
    assert!((predicted - 2.0).abs() < 0.05, "{predicted}");
    assert!(spread < 0.05, "{spread}");
    assert!(
        flat.cutoff < 0.81,
        "cut against the steep trial's pessimistic end"
    );
    assert!(
        flat.describe().contains("predicted final"),
        "{}",
        flat.describe()
    );
}

#[test]
fn ranked_by_prediction_a_curve_too_short_to_fit_is_never_cut() {
    let mut s = Sweep::new(
        HalvingRule {
            first_rung: 2.0,
            ranking: Ranking::Predicted,
            ..rule()
        },
        Direction::Minimise,
    );
    s.join("a", None);
    s.join("b", None);
    s.observe(&"a", 1.0, 0.5);
    s.observe(&"b", 1.0, 5.0);
    s.observe(&"a", 2.0, 0.4);
    assert!(
        s.observe(&"b", 2.0, 4.9).is_empty(),
        "two values say nothing of the end"
    );
}

#[test]
fn ranked_by_prediction_a_maximised_signal_cuts_the_confidently_lower() {
    let mut s = Sweep::new(
        HalvingRule {
            eta: 2,
            ..HalvingRule::default()
        },
        Direction::Maximise,
    );
    s.join("good", Some(30.0));
    s.join("poor", Some(30.0));
    let mut stops = Vec::new();
    for e in 1..=5 {
        let e = f64::from(e);
        stops.extend(s.observe(&"good", e, 0.9 - 0.4 / e));
        stops.extend(s.observe(&"poor", e, 0.3 - 0.1 / e));
    }
    assert_eq!(stops.iter().map(|o| o.trial).collect::<Vec<_>>(), ["poor"]);
    let (predicted, _) = stops[0].predicted.unwrap();
    assert!(
        (0.25..0.31).contains(&predicted),
        "in the signal's own units: {predicted}"
    );
}

#[test]
fn judged_on_arrival_a_trial_is_cut_at_once_and_nothing_waits() {
    let mut s = Sweep::judged(rule(), Direction::Minimise, Judging::OnArrival);
    for t in ["a", "b", "c", "slow"] {
        s.join(t, None);
    }
    assert!(s.observe(&"a", 5.0, 0.2).is_empty(), "the first goes on");
    assert_eq!(s.waiting_at(&"a"), None, "nothing waits for stragglers");
    assert!(s.observe(&"b", 5.0, 0.1).is_empty(), "the new best goes on");
    let stops = s.observe(&"c", 5.0, 0.3);
    assert_eq!(stops.iter().map(|o| o.trial).collect::<Vec<_>>(), ["c"]);
    assert_eq!((stops[0].place, stops[0].of, stops[0].kept), (3, 3, 1));
    // Ranked by the loss seen (ASHA as published), a trial leaving judges nothing and `a`
    // (2nd of 3, which went on when it arrived first) is not cut after the fact.
    assert!(s.leave(&"slow").is_empty());
    assert!(s.observe(&"a", 6.0, 0.15).is_empty());
    assert_eq!(s.stopped(), 1);
}

#[test]
fn judged_on_arrival_by_prediction_an_early_arrival_stops_once_confidently_outranked() {
    let mut s = Sweep::judged(
        HalvingRule::default(),
        Direction::Minimise,
        Judging::OnArrival,
    );
    for t in ["flat", "learns", "also"] {
        s.join(t, Some(30.0));
    }
    // `flat` learns nothing and reaches the rung first: alone there, it goes on.
    let mut stops = Vec::new();
    for e in 1..=5 {
        stops.extend(s.observe(&"flat", f64::from(e), 2.3));
    }
    assert!(stops.is_empty(), "the first arrival goes on");
    stops.extend(s.observe(&"flat", 6.0, 2.3));
    // `learns` arrives: of 2 results the best 1 goes on, and `flat`, on its way to the next
    // rung, is confidently worse: it stops now.
    for e in 1..=5 {
        let e = f64::from(e);
        stops.extend(s.observe(&"learns", e, 0.3 + 0.7 / e));
    }
    assert_eq!(stops.iter().map(|o| o.trial).collect::<Vec<_>>(), ["flat"]);
    assert_eq!((stops[0].place, stops[0].of), (2, 2));
    // `also`, nearly as good, arrives: only the best 1 of 3 is sure to go on, but `also` is
    // not confidently worse than `learns`: it goes on too.
    let mut later = Vec::new();
    for e in 1..=5 {
        let e = f64::from(e);
        later.extend(s.observe(&"also", e, 0.31 + 0.7 / e));
    }
    assert!(later.is_empty(), "{later:?}");
}

#[test]
fn a_rejoined_sweep_keeps_its_rung_results_and_judges_nothing_again() {
    let mut all: Sweeps<u32> = Sweeps::judged(Judging::OnArrival);
    let lr = SweepTrial {
        sweep: "lr".into(),
        rule: rule(),
    };
    all.rejoin(&lr, Direction::Minimise, 1, None, &[(5.0, 0.1)], false);
    all.rejoin(
        &lr,
        Direction::Minimise,
        2,
        None,
        &[(4.0, 0.5), (5.0, 0.4)],
        true,
    );
    assert_eq!(all.get("lr").unwrap().stopped(), 1);
    // The stopped trial is not judged again, and a newcomer meets the results recorded there.
    assert!(all.observe(&2, 6.0, 0.01).is_empty());
    all.join("lr", rule(), Direction::Minimise, 3, None);
    let stops = all.observe(&3, 5.0, 0.2);
    assert_eq!(stops.len(), 1);
    assert_eq!((stops[0].place, stops[0].of), (2, 3));
}

#[test]
fn ranked_by_prediction_a_flat_trial_that_learns_nothing_is_cut() {
    let mut s = Sweep::new(HalvingRule::default(), Direction::Minimise);
    s.join("learns", Some(30.0));
    s.join("diverged", Some(30.0));
    s.join("also", Some(30.0));
    let mut stops = Vec::new();
    for e in 1..=5 {
        let e = f64::from(e);
        stops.extend(s.observe(&"learns", e, 0.3 + 0.7 / e));
        stops.extend(s.observe(&"also", e, 0.35 + 0.7 / e));
        stops.extend(s.observe(&"diverged", e, 2.3));
    }
    assert!(
        stops.iter().any(|o| o.trial == "diverged"),
        "a constant loss is confidently its own end: {stops:?}"
    );
}
