use super::*;
use crate::by_spec;

const NODE: NodeResources = NodeResources {
    cores: 2.0,
    memory_bytes: 1 << 34,
};

fn id(s: &str) -> JobId {
    JobId::from(s)
}

fn point(at: Seconds, value: f64) -> ProgressPoint {
    ProgressPoint {
        at,
        value,
        new_segment: false,
    }
}

/// A curve that has flattened by epoch 5 of 20 (of the predictor's power-law family in the
/// fraction of the run): its quality point is behind it at epoch 10.
fn flattening(epoch: f64) -> f64 {
    0.1 + 2.0 * (1.0 + epoch / 20.0).powi(-30)
}

/// A curve still falling at the same pace at every epoch.
fn straight(epoch: f64) -> f64 {
    2.0 - 0.05 * epoch
}

/// Feeds `job` epochs `from..=to` of a 20-epoch run at one epoch per second, one CPU-second
/// each, training-loss only.
fn run_epochs(p: &mut LearningFirst, job: &str, from: u32, to: u32, curve: fn(f64) -> f64) {
    for e in from..=to {
        let t = f64::from(e);
        used(p, job, t, t);
        p.progress(t, &id(job), point(t, curve(t)));
        p.work_done(t, &id(job), t / 20.0);
    }
}

/// `cpu_seconds` used by `job` so far, sampled at `t`.
fn used(p: &mut LearningFirst, job: &str, t: f64, cpu_seconds: f64) {
    p.usage(
        t,
        &id(job),
        Usage {
            at: t,
            cpu_seconds,
            ..Usage::default()
        },
    );
}

fn weight(plan: &Plan, job: &str) -> u32 {
    plan.allocations[&id(job)].cpu.weight
}

fn two_jobs() -> LearningFirst {
    let mut p = LearningFirst::default();
    p.job_added(0.0, &JobSpec::new("learnt"));
    p.job_added(0.0, &JobSpec::new("learning"));
    p
}

#[test]
fn a_job_past_its_predicted_quality_point_yields_to_one_still_learning() {
    let mut p = two_jobs();
    run_epochs(&mut p, "learnt", 1, 10, flattening);
    run_epochs(&mut p, "learning", 1, 10, straight);
    let plan = p.decide(10.0, &NODE);
    assert_eq!(weight(&plan, "learning"), 100);
    assert_eq!(weight(&plan, "learnt"), 50, "{:?}", plan.allocations);
    assert!(
        plan.allocations[&id("learnt")]
            .reason
            .contains("past its predicted quality point"),
        "{}",
        plan.allocations[&id("learnt")].reason
    );
    assert_eq!(
        plan.allocations[&id("learnt")].category,
        Category::Converged
    );
}

#[test]
fn a_job_still_falling_steeply_keeps_its_fair_share() {
    let mut p = two_jobs();
    // The same family, early: at epoch 3 its curve is still far from where it will end.
    run_epochs(&mut p, "learnt", 1, 3, |e| 0.1 + 2.0 * (-e / 8.0).exp());
    run_epochs(&mut p, "learning", 1, 10, straight);
    let plan = p.decide(10.0, &NODE);
    assert_eq!(weight(&plan, "learnt"), 100);
    assert_eq!(weight(&plan, "learning"), 100);
}

#[test]
fn too_few_values_are_not_judged() {
    let mut p = two_jobs();
    // Flat from its first values, but only three of them: not judged yet.
    run_epochs(&mut p, "learnt", 1, 3, |_| 1.0);
    run_epochs(&mut p, "learning", 1, 10, straight);
    let plan = p.decide(10.0, &NODE);
    assert_eq!(weight(&plan, "learnt"), 100);
}

#[test]
fn no_job_yields_when_none_beside_it_is_learning() {
    let mut p = LearningFirst::default();
    p.job_added(0.0, &JobSpec::new("learnt"));
    run_epochs(&mut p, "learnt", 1, 10, flattening);
    let plan = p.decide(10.0, &NODE);
    assert_eq!(weight(&plan, "learnt"), 100);
    assert!(
        plan.allocations[&id("learnt")]
            .reason
            .contains("no other job is learning")
    );
    // Two learnt jobs: yielding to each other would change nothing.
    let mut p = two_jobs();
    run_epochs(&mut p, "learnt", 1, 10, flattening);
    run_epochs(&mut p, "learning", 1, 10, flattening);
    let plan = p.decide(10.0, &NODE);
    assert_eq!(weight(&plan, "learnt"), 100);
    assert_eq!(weight(&plan, "learning"), 100);
}

#[test]
fn a_yielding_job_is_held_within_its_pace_bound() {
    let mut p = two_jobs();
    run_epochs(&mut p, "learnt", 1, 10, flattening);
    run_epochs(&mut p, "learning", 1, 10, straight);
    // Both used a core a second: fair sharing of 2 cores gives each its core.
    assert_eq!(weight(&p.decide(10.0, &NODE), "learnt"), 50);
    // While it yields it gets 0.2 cores a second instead of 1 (0.8 CPU-s behind each second);
    // at its fair share, 1. It may lag by 0.8 × 0.1 of the CPU it has had.
    let mut cpu = 10.0;
    let mut yielding = true;
    let (mut yields, mut lag) = (0, 0.0);
    for t in 11..=60 {
        let t = f64::from(t);
        let got = if yielding { 0.2 } else { 1.0 };
        cpu += got;
        lag += 1.0 - got;
        used(&mut p, "learnt", t, cpu);
        used(&mut p, "learning", t, t);
        let plan = p.decide(t, &NODE);
        yielding = weight(&plan, "learnt") == 50;
        if yielding {
            yields += 1;
            assert!(lag < 0.08 * cpu, "yields at lag {lag:.2} of {cpu:.1} CPU-s");
        } else {
            assert_eq!(weight(&plan, "learnt"), 100);
            let reason = &plan.allocations[&id("learnt")].reason;
            assert!(reason.contains("fair-share pace"), "{reason}");
        }
        // Never more than one interval's worth past its bound.
        assert!(lag <= 0.08 * cpu + 0.8, "lag {lag:.2} at {cpu:.1} CPU-s");
    }
    // It yields again as it earns room, a few seconds in fifty.
    assert!((2..=10).contains(&yields), "yielded {yields} times");
    // Over the run it kept the part of its fair share (60 CPU-s) the placement counts on, less
    // one interval's overshoot.
    let kept = LearningFirstParams::default().least_kept_share();
    assert!((kept - 0.92).abs() < 1e-12, "{kept}");
    assert!(cpu / 60.0 >= kept - 0.8 / 60.0, "kept {:.3}", cpu / 60.0);
}

#[test]
fn a_job_that_loses_nothing_by_yielding_spends_no_budget() {
    let mut p = two_jobs();
    run_epochs(&mut p, "learnt", 1, 10, flattening);
    run_epochs(&mut p, "learning", 1, 10, straight);
    assert_eq!(weight(&p.decide(10.0, &NODE), "learnt"), 50);
    // Each keeps its core (the learning job cannot use more): weights change nothing.
    for t in 11..=40 {
        let t = f64::from(t);
        for job in ["learnt", "learning"] {
            used(&mut p, job, t, t);
        }
        assert_eq!(weight(&p.decide(t, &NODE), "learnt"), 50, "at {t}");
    }
}

#[test]
fn a_held_job_is_served_after_the_others() {
    let mut p = two_jobs();
    run_epochs(&mut p, "learning", 1, 10, straight);
    p.hold(10.0, &id("learning"), true);
    let plan = p.decide(10.0, &NODE);
    assert_eq!(weight(&plan, "learning"), 10);
    assert_eq!(weight(&plan, "learnt"), 100);
    p.hold(11.0, &id("learning"), false);
    assert_eq!(weight(&p.decide(11.0, &NODE), "learning"), 100);
}

#[test]
fn a_job_of_unknown_size_yields_once_its_learning_has_converged() {
    let mut p = two_jobs();
    for e in 1..=30 {
        let t = f64::from(e);
        for (job, curve) in [
            ("learnt", flattening as fn(f64) -> f64),
            ("learning", straight),
        ] {
            used(&mut p, job, t, t);
            p.progress(t, &id(job), point(t, curve(t)));
        }
    }
    let plan = p.decide(30.0, &NODE);
    assert_eq!(weight(&plan, "learnt"), 50, "{:?}", plan.allocations);
    assert_eq!(weight(&plan, "learning"), 100);
    assert!(plan.allocations[&id("learnt")].reason.contains("converged"));
}

#[test]
fn a_new_run_segment_is_judged_afresh() {
    let mut p = two_jobs();
    run_epochs(&mut p, "learnt", 1, 10, flattening);
    run_epochs(&mut p, "learning", 1, 10, straight);
    assert_eq!(weight(&p.decide(10.0, &NODE), "learnt"), 50);
    p.progress(
        11.0,
        &id("learnt"),
        ProgressPoint {
            at: 11.0,
            value: 2.0,
            new_segment: true,
        },
    );
    p.work_done(11.0, &id("learnt"), 0.05);
    assert_eq!(weight(&p.decide(11.0, &NODE), "learnt"), 100);
}

#[test]
fn its_validation_loss_decides_over_its_training_loss() {
    let mut p = two_jobs();
    run_epochs(&mut p, "learning", 1, 10, straight);
    // Training loss still falling straight; validation loss flat since epoch 6.
    for e in 1..=10 {
        let t = f64::from(e);
        p.quality(t, &id("learnt"), point(t, flattening(t)));
        p.progress(t, &id("learnt"), point(t, straight(t)));
        p.work_done(t, &id("learnt"), t / 20.0);
    }
    assert_eq!(weight(&p.decide(10.0, &NODE), "learnt"), 50);
    // And the other way round: validation still falling, training flat.
    let mut p = two_jobs();
    run_epochs(&mut p, "learning", 1, 10, straight);
    for e in 1..=10 {
        let t = f64::from(e);
        p.quality(t, &id("learnt"), point(t, straight(t)));
        p.progress(t, &id("learnt"), point(t, flattening(t)));
        p.work_done(t, &id("learnt"), t / 20.0);
    }
    assert_eq!(weight(&p.decide(10.0, &NODE), "learnt"), 100);
}

#[test]
fn an_accuracy_that_has_levelled_off_is_learnt() {
    let mut p = LearningFirst::default();
    let mut spec = JobSpec::new("learnt");
    spec.direction = Direction::Maximise;
    p.job_added(0.0, &spec);
    p.job_added(0.0, &JobSpec::new("learning"));
    run_epochs(&mut p, "learnt", 1, 10, |e| 1.0 - flattening(e) / 3.0);
    run_epochs(&mut p, "learning", 1, 10, straight);
    assert_eq!(weight(&p.decide(10.0, &NODE), "learnt"), 50);
}

#[test]
fn parameters_are_set_by_spec_and_checked() {
    let p = by_spec("learning-first:yield=0.5:slack=0.2:confidence=2").unwrap();
    assert_eq!(p.name(), "learning-first");
    for bad in [
        "learning-first:yield=0",
        "learning-first:budget=2",
        "learning-first:bogus=1",
        "learning-first:min_points=1",
    ] {
        assert!(by_spec(bad).is_err(), "{bad} accepted");
    }
    let mut params = LearningFirstParams::default();
    params.set("yield", "0.25").unwrap();
    let mut p = LearningFirst::new(params);
    p.job_added(0.0, &JobSpec::new("learnt"));
    p.job_added(0.0, &JobSpec::new("learning"));
    run_epochs(&mut p, "learnt", 1, 10, flattening);
    run_epochs(&mut p, "learning", 1, 10, straight);
    assert_eq!(weight(&p.decide(10.0, &NODE), "learnt"), 25);
}

#[test]
fn debug_prediction() {
    let pts: Vec<(f64, f64)> = (1..=10)
        .map(|e| (f64::from(e) / 20.0, flattening(f64::from(e))))
        .collect();
    eprintln!("{pts:?}");
    for m in crate::predict::Method::ALL {
        eprintln!("{:?}", crate::predict::predict_with(m, &pts, 1.0));
    }
}

#[test]
fn a_learnt_job_with_less_work_left_than_the_learners_does_not_yield() {
    // Learnt at 18 of 20 epochs (2 CPU-s left) beside a learner 3 epochs in (17 left): its
    // CPU would finish the long job sooner and itself later, the average completion worse.
    let mut p = two_jobs();
    run_epochs(&mut p, "learnt", 1, 18, flattening);
    run_epochs(&mut p, "learning", 1, 3, straight);
    let plan = p.decide(18.0, &NODE);
    assert_eq!(weight(&plan, "learnt"), 100);
    let reason = &plan.allocations[&id("learnt")].reason;
    assert!(reason.contains("less work left"), "{reason}");
    // Beside a learner with less left than it has, it yields.
    let mut p = two_jobs();
    run_epochs(&mut p, "learnt", 1, 10, flattening);
    run_epochs(&mut p, "learning", 1, 15, straight);
    assert_eq!(weight(&p.decide(15.0, &NODE), "learnt"), 50);
}

#[test]
fn a_curve_logged_at_every_step_is_thinned_and_still_judged() {
    let mut p = two_jobs();
    // 5,000 logged steps of a 10,000-step run.
    for k in 1..=5000u32 {
        let t = f64::from(k) / 250.0;
        p.progress(t, &id("learnt"), point(t, flattening(t)));
        p.work_done(t, &id("learnt"), f64::from(k) / 10_000.0);
    }
    used(&mut p, "learnt", 20.0, 20.0);
    run_epochs(&mut p, "learning", 1, 10, straight);
    assert!(p.jobs[&id("learnt")].curve.len() <= MAX_CURVE);
    assert_eq!(weight(&p.decide(20.0, &NODE), "learnt"), 50);
}
