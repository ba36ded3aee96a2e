use super::*;

const NODE: NodeResources = NodeResources {
    cores: 4.0,
    memory_bytes: 8 << 30,
};

fn id(s: &str) -> JobId {
    JobId::from(s)
}

/// Feed a job a progress value and, before it, its cumulative CPU time.
fn observe(p: &mut FlowCon, now: Seconds, job: &str, value: f64, cpu_seconds: f64) {
    p.usage(
        now,
        &id(job),
        Usage {
            at: now,
            cpu_seconds,
            ..Usage::default()
        },
    );
    p.progress(
        now,
        &id(job),
        ProgressPoint {
            at: now,
            value,
            new_segment: false,
        },
    );
}

fn list_of(p: &FlowCon, job: &str) -> List {
    p.jobs[&id(job)].list
}

/// A policy with jobs `a` and `b` both measured once (baseline set) at t=0.
fn two_jobs() -> FlowCon {
    let mut p = FlowCon::default();
    p.job_added(0.0, &JobSpec::new("a"));
    p.job_added(0.0, &JobSpec::new("b"));
    observe(&mut p, 0.0, "a", 10.0, 0.0);
    observe(&mut p, 0.0, "b", 10.0, 0.0);
    p.decide(0.0, &NODE);
    p
}

#[test]
fn a_new_job_joins_nl_uncapped_and_the_listener_evaluates_at_once() {
    let mut p = FlowCon::default();
    p.job_added(0.0, &JobSpec::new("a"));
    let plan = p.decide(0.0, &NODE);
    let a = &plan.allocations[&id("a")];
    assert_eq!(a.category, Category::Progressing);
    assert_eq!(a.cpu, CpuAllocation::DEFAULT);
    assert_eq!(plan.next_decision_at, Some(10.0));
}

#[test]
fn growth_efficiency_is_loss_change_per_cpu_second() {
    let mut p = two_jobs();
    observe(&mut p, 10.0, "a", 6.0, 20.0); // |Δ|=4 over 20 cpu-s
    observe(&mut p, 10.0, "b", 9.0, 20.0); // |Δ|=1 over 20 cpu-s
    p.decide(10.0, &NODE);
    assert_eq!(p.growth(&id("a")), Some(0.2));
    assert_eq!(p.growth(&id("b")), Some(0.05));
}

#[test]
fn decide_before_the_interval_keeps_the_previous_plan() {
    let mut p = two_jobs();
    observe(&mut p, 5.0, "a", 6.0, 20.0);
    observe(&mut p, 5.0, "b", 9.0, 20.0);
    p.decide(5.0, &NODE);
    assert_eq!(p.growth(&id("a")), None, "evaluated before itval elapsed");
    p.decide(10.0, &NODE);
    assert!(p.growth(&id("a")).is_some(), "evaluated once itval elapsed");
}

#[test]
fn slow_job_moves_nl_to_wl_to_cl_and_back_to_nl() {
    let mut p = two_jobs();
    // Round 1: a G=0.2, b G=0.05. α = (mean NL + mean CL)/2 = (0.125 + 0)/2 = 0.0625.
    observe(&mut p, 10.0, "a", 6.0, 20.0);
    observe(&mut p, 10.0, "b", 9.0, 20.0);
    p.decide(10.0, &NODE);
    assert!((p.alpha() - 0.0625).abs() < 1e-12, "alpha {}", p.alpha());
    assert_eq!(list_of(&p, "a"), List::New);
    assert_eq!(list_of(&p, "b"), List::Watching, "NL -> WL");
    // Round 2: same growths. No job arrived or left: α stays 0.0625. b: WL -> CL.
    observe(&mut p, 20.0, "a", 2.0, 40.0);
    observe(&mut p, 20.0, "b", 8.0, 40.0);
    p.decide(20.0, &NODE);
    assert!((p.alpha() - 0.0625).abs() < 1e-12);
    assert_eq!(list_of(&p, "b"), List::Completing, "WL -> CL");
    // Round 3: b still slow: stays in CL.
    observe(&mut p, 30.0, "a", -2.0, 60.0);
    observe(&mut p, 30.0, "b", 7.0, 60.0);
    p.decide(30.0, &NODE);
    assert!((p.alpha() - 0.0625).abs() < 1e-12);
    assert_eq!(list_of(&p, "b"), List::Completing, "CL stays CL");
    // Round 4: b speeds up (G=0.3 ≥ α): back to NL.
    observe(&mut p, 40.0, "a", -6.0, 80.0);
    observe(&mut p, 40.0, "b", 1.0, 80.0);
    p.decide(40.0, &NODE);
    assert_eq!(list_of(&p, "b"), List::New, "CL -> NL");
}

#[test]
fn pseudocode_threshold_averages_nl_and_wl() {
    let mut p = FlowCon::new(FlowConParams {
        threshold_lists: ThresholdLists::NewAndWatching,
        ..FlowConParams::default()
    });
    p.job_added(0.0, &JobSpec::new("a"));
    p.job_added(0.0, &JobSpec::new("b"));
    observe(&mut p, 0.0, "a", 10.0, 0.0);
    observe(&mut p, 0.0, "b", 10.0, 0.0);
    p.decide(0.0, &NODE);
    observe(&mut p, 10.0, "a", 6.0, 20.0);
    observe(&mut p, 10.0, "b", 9.0, 20.0);
    p.decide(10.0, &NODE); // b -> WL
    // An arrival: Algorithm 3 runs again.
    p.job_added(15.0, &JobSpec::new("c"));
    observe(&mut p, 20.0, "a", 2.0, 40.0);
    observe(&mut p, 20.0, "b", 8.0, 40.0);
    p.decide(20.0, &NODE);
    // NL mean 0.2 (c not measured yet), WL mean 0.05 (b measured while in WL) -> 0.125.
    assert!((p.alpha() - 0.125).abs() < 1e-12, "alpha {}", p.alpha());
}

#[test]
fn completing_job_gets_its_growth_share_but_not_below_the_floor_as_a_soft_weight() {
    let mut p = FlowCon::default();
    for j in ["a", "b", "c", "d"] {
        p.job_added(0.0, &JobSpec::new(j));
        observe(&mut p, 0.0, j, 10.0, 0.0);
    }
    p.decide(0.0, &NODE);
    // a, b, c fast (G=0.3) and d slow (G=0.01): d goes NL -> WL -> CL.
    for round in 1..=2 {
        let t = 10.0 * round as f64;
        for j in ["a", "b", "c"] {
            observe(&mut p, t, j, 10.0 - 6.0 * round as f64, 20.0 * round as f64);
        }
        observe(
            &mut p,
            t,
            "d",
            10.0 - 0.2 * round as f64,
            20.0 * round as f64,
        );
        p.decide(t, &NODE);
    }
    assert_eq!(list_of(&p, "d"), List::Completing);
    // d: G/ΣG = 0.01/0.91 ≈ 1.1% < the 5% floor.
    assert!((p.limit(&id("d")).unwrap() - 0.05).abs() < 1e-12);
    // NL jobs get the whole node (the prose and §6.3).
    assert_eq!(p.limit(&id("a")), Some(1.0));
    // Soft limits: weights proportional to the limits (averaging 100), no cap.
    let plan = p.decide(20.0, &NODE);
    let (a, d) = (
        &plan.allocations[&id("a")].cpu,
        &plan.allocations[&id("d")].cpu,
    );
    assert_eq!((a.weight, a.max_cores), (131, None)); // 1 / 3.05 × 400
    assert_eq!((d.weight, d.max_cores), (7, None)); // 0.05 / 3.05 × 400
}

#[test]
fn pseudocode_reading_caps_nl_jobs_at_their_growth_share_with_hard_limits() {
    let mut p = FlowCon::new(FlowConParams {
        nl_uncapped: false,
        hard_limits: true,
        ..FlowConParams::default()
    });
    for j in ["a", "b"] {
        p.job_added(0.0, &JobSpec::new(j));
        observe(&mut p, 0.0, j, 10.0, 0.0);
    }
    p.decide(0.0, &NODE);
    observe(&mut p, 10.0, "a", 6.0, 20.0); // G = 0.2
    observe(&mut p, 10.0, "b", 7.0, 20.0); // G = 0.15
    let plan = p.decide(10.0, &NODE);
    let a = p.limit(&id("a")).unwrap();
    assert!((a - 0.2 / 0.35).abs() < 1e-12, "a limit {a}");
    assert_eq!(plan.allocations[&id("a")].cpu.max_cores, Some(a * 4.0));
    assert_eq!(plan.allocations[&id("a")].cpu.weight, 100);
}

#[test]
fn completing_job_above_the_bound_gets_its_growth_share() {
    let mut p = two_jobs();
    // Force b into CL with a growth share above 1/2: craft the lists directly.
    p.jobs.get_mut(&id("b")).unwrap().list = List::Completing;
    p.jobs.get_mut(&id("a")).unwrap().list = List::Watching;
    observe(&mut p, 10.0, "a", 9.9, 20.0); // G = 0.005 -> WL -> CL
    observe(&mut p, 10.0, "b", 9.0, 20.0); // G = 0.05
    p.decide(10.0, &NODE);
    // α = (0 + 0.05)/2 = 0.025: a (WL, G<α) -> CL, b (CL, G ≥ α) -> NL.
    assert_eq!(list_of(&p, "b"), List::New);
    assert_eq!(list_of(&p, "a"), List::Completing);
    // a's share 0.005/0.055 ≈ 9%, above the 5% floor; b (NL) gets the node.
    assert!((p.limit(&id("a")).unwrap() - 0.005 / 0.055).abs() < 1e-12);
    assert_eq!(p.limit(&id("b")), Some(1.0));
}

#[test]
fn prose_reading_leaves_nl_jobs_uncapped() {
    let mut p = FlowCon::default();
    p.job_added(0.0, &JobSpec::new("a"));
    p.job_added(0.0, &JobSpec::new("b"));
    observe(&mut p, 0.0, "a", 10.0, 0.0);
    observe(&mut p, 0.0, "b", 10.0, 0.0);
    p.decide(0.0, &NODE);
    observe(&mut p, 10.0, "a", 6.0, 20.0);
    observe(&mut p, 10.0, "b", 7.0, 20.0);
    let plan = p.decide(10.0, &NODE);
    assert_eq!(list_of(&p, "a"), List::New);
    assert_eq!(list_of(&p, "b"), List::New);
    assert_eq!(plan.allocations[&id("a")].cpu.max_cores, None);
    assert_eq!(plan.allocations[&id("b")].cpu.max_cores, None);
}

#[test]
fn watched_job_keeps_its_limit() {
    let mut p = two_jobs();
    p.jobs.get_mut(&id("b")).unwrap().limit = 0.4;
    observe(&mut p, 10.0, "a", 6.0, 20.0);
    observe(&mut p, 10.0, "b", 9.0, 20.0);
    p.decide(10.0, &NODE);
    assert_eq!(list_of(&p, "b"), List::Watching);
    assert_eq!(p.limit(&id("b")), Some(0.4), "WL limits remain unchanged");
}

#[test]
fn all_completing_means_free_competition_and_a_doubling_interval() {
    let mut p = two_jobs();
    for j in ["a", "b"] {
        let job = p.jobs.get_mut(&id(j)).unwrap();
        job.list = List::Completing;
        job.limit = 0.5;
    }
    let plan = p.decide(10.0, &NODE);
    assert_eq!(p.alpha(), -1.0, "Algorithm 3 deactivates Algorithm 1");
    assert_eq!(p.limit(&id("a")), Some(1.0));
    assert_eq!(plan.allocations[&id("a")].cpu, CpuAllocation::DEFAULT);
    assert_eq!(p.interval(), 20.0);
    assert_eq!(plan.next_decision_at, Some(30.0));
    // Deactivated: even a burst of growth does not move a job out of CL.
    observe(&mut p, 30.0, "a", 0.0, 40.0);
    let plan = p.decide(30.0, &NODE);
    assert_eq!(list_of(&p, "a"), List::Completing);
    assert_eq!(p.interval(), 40.0);
    assert_eq!(plan.next_decision_at, Some(70.0));
    // The back-off is capped.
    let mut t = 70.0;
    for _ in 0..10 {
        t = p.decide(t, &NODE).next_decision_at.unwrap();
    }
    assert_eq!(p.interval(), 320.0);
}

#[test]
fn an_arrival_resets_the_interval_and_reactivates_the_algorithm() {
    let mut p = two_jobs();
    for j in ["a", "b"] {
        p.jobs.get_mut(&id(j)).unwrap().list = List::Completing;
    }
    p.decide(10.0, &NODE);
    p.decide(30.0, &NODE);
    assert_eq!(p.interval(), 40.0);
    p.job_added(35.0, &JobSpec::new("c"));
    let plan = p.decide(35.0, &NODE);
    assert_ne!(p.alpha(), -1.0);
    assert_eq!(p.interval(), 10.0, "listener resets itval");
    assert_eq!(plan.next_decision_at, Some(45.0));
    assert_eq!(plan.allocations[&id("c")].category, Category::Progressing);
}

#[test]
fn a_departure_resets_the_interval_and_releases_the_job() {
    let mut p = two_jobs();
    for j in ["a", "b"] {
        p.jobs.get_mut(&id(j)).unwrap().list = List::Completing;
    }
    p.decide(10.0, &NODE);
    assert_eq!(p.interval(), 20.0);
    p.job_removed(12.0, &id("a"));
    let plan = p.decide(12.0, &NODE);
    assert!(!plan.allocations.contains_key(&id("a")));
    // Still all in CL: free competition again, from the reset interval.
    assert_eq!(p.interval(), 20.0);
    assert_eq!(plan.next_decision_at, Some(32.0));
    // Removing an unknown job is not a listener event.
    p.job_removed(13.0, &id("zzz"));
    assert!(!p.listener_fired);
}

#[test]
fn single_job_threshold_is_half_its_growth_and_it_stays_uncapped() {
    let mut p = FlowCon::default();
    p.job_added(0.0, &JobSpec::new("a"));
    observe(&mut p, 0.0, "a", 10.0, 0.0);
    p.decide(0.0, &NODE);
    observe(&mut p, 10.0, "a", 9.0, 40.0); // G = 0.025
    let plan = p.decide(10.0, &NODE);
    assert!((p.alpha() - 0.0125).abs() < 1e-12);
    assert_eq!(list_of(&p, "a"), List::New);
    assert_eq!(plan.allocations[&id("a")].cpu.max_cores, None);
}

#[test]
fn job_without_a_new_value_keeps_its_list_and_limit() {
    let mut p = two_jobs();
    observe(&mut p, 10.0, "a", 6.0, 20.0);
    observe(&mut p, 10.0, "b", 9.0, 20.0);
    p.decide(10.0, &NODE);
    assert_eq!(list_of(&p, "b"), List::Watching);
    // Only a logs this interval; b stays in WL although α is above its old growth.
    observe(&mut p, 20.0, "a", 2.0, 40.0);
    p.usage(
        20.0,
        &id("b"),
        Usage {
            at: 20.0,
            cpu_seconds: 40.0,
            ..Usage::default()
        },
    );
    p.decide(20.0, &NODE);
    assert_eq!(list_of(&p, "b"), List::Watching);
}

#[test]
fn zero_total_growth_leaves_nl_jobs_uncapped() {
    let mut p = two_jobs();
    observe(&mut p, 10.0, "a", 10.0, 20.0);
    observe(&mut p, 10.0, "b", 10.0, 20.0);
    let plan = p.decide(10.0, &NODE);
    // α = 0, every G = 0 ≥ α: both NL, ΣG = 0 -> limit 1.
    assert_eq!(list_of(&p, "a"), List::New);
    assert_eq!(plan.allocations[&id("a")].cpu.max_cores, None);
}

#[test]
fn a_new_segment_restarts_the_measurement() {
    let mut p = two_jobs();
    p.progress(
        5.0,
        &id("a"),
        ProgressPoint {
            at: 5.0,
            value: 100.0,
            new_segment: true,
        },
    );
    observe(&mut p, 10.0, "b", 9.0, 20.0);
    p.decide(10.0, &NODE);
    assert_eq!(p.growth(&id("a")), None, "no growth across a restart");
}

#[test]
fn operator_bounds_override_the_limit() {
    let mut p = FlowCon::default();
    let mut spec = JobSpec::new("a");
    spec.bounds.max_cores = Some(2.0);
    p.job_added(0.0, &spec);
    let plan = p.decide(0.0, &NODE);
    assert_eq!(plan.allocations[&id("a")].cpu.max_cores, Some(2.0));
}

/// FlowCon §6 (Figs. 6-7): "Even when Job-3 joins the system, resources for Job-2 will not
/// reduce too much since it is still in the WL, not CL." Job-1 has converged (CL), Job-2 is
/// watched (WL); Job-3 joins with no progress yet. Its unknown progress does not count as 0:
/// Job-2 keeps its list and limit, Job-1 stays in CL, and Job-3 runs uncapped in NL; once
/// Job-3 is measured (fast), the threshold is formed with it and Job-3 stays in NL.
#[test]
fn a_newcomer_without_progress_leaves_the_watched_and_completing_jobs_where_they_are() {
    let mut p = two_jobs();
    // a: Job-1, converging; b: Job-2, slowing. Rounds of 10 s: a falls 0.01, b 0.5.
    p.jobs.get_mut(&id("a")).unwrap().list = List::Completing;
    p.jobs.get_mut(&id("b")).unwrap().list = List::Watching;
    p.jobs.get_mut(&id("b")).unwrap().limit = 0.4;
    p.alpha = 0.1;
    p.alpha_set = true;
    observe(&mut p, 10.0, "a", 9.99, 20.0); // G = 0.0005
    observe(&mut p, 10.0, "b", 9.5, 20.0); // G = 0.025 < α: b would move to CL; keep it WL
    p.jobs.get_mut(&id("b")).unwrap().list = List::Watching;
    // Job-3 joins: a listener event, Algorithm 3 at the next evaluation.
    p.job_added(10.0, &JobSpec::new("c"));
    observe(&mut p, 10.0, "c", 10.0, 0.0);
    p.decide(10.0, &NODE);
    assert_eq!(list_of(&p, "a"), List::Completing, "Job-1 stays in CL");
    assert_ne!(
        list_of(&p, "b"),
        List::New,
        "Job-2 is not promoted back to NL by Job-3's unknown progress"
    );
    assert_eq!(list_of(&p, "c"), List::New);
    assert_eq!(p.limit(&id("c")), Some(1.0), "the newcomer runs uncapped");
    // Job-3 measured, fast: α is formed with it, and it stays in NL.
    observe(&mut p, 20.0, "a", 9.985, 40.0);
    observe(&mut p, 20.0, "b", 9.3, 40.0);
    observe(&mut p, 20.0, "c", 6.0, 20.0); // G = 0.2
    p.decide(20.0, &NODE);
    assert_eq!(list_of(&p, "c"), List::New);
    assert!(
        p.alpha() > 0.05,
        "formed with Job-3's growth: {}",
        p.alpha()
    );
    assert_eq!(list_of(&p, "a"), List::Completing);
}

/// After free competition (every job in CL, α = -1) a newcomer joins: the converged jobs are
/// not promoted back to NL uncapped on the newcomer's unknown progress; they keep CL with their
/// small limits while the newcomer, in NL, runs uncapped.
#[test]
fn a_newcomer_after_free_competition_does_not_promote_the_converged_jobs() {
    let mut p = two_jobs();
    for j in ["a", "b"] {
        p.jobs.get_mut(&id(j)).unwrap().list = List::Completing;
    }
    observe(&mut p, 10.0, "a", 9.99, 20.0);
    observe(&mut p, 10.0, "b", 9.98, 20.0);
    p.decide(10.0, &NODE);
    assert_eq!(p.alpha(), -1.0, "free competition");
    p.job_added(15.0, &JobSpec::new("c"));
    observe(&mut p, 15.0, "c", 10.0, 0.0);
    observe(&mut p, 15.0, "a", 9.985, 30.0);
    observe(&mut p, 15.0, "b", 9.975, 30.0);
    p.decide(15.0, &NODE);
    for j in ["a", "b"] {
        assert_eq!(list_of(&p, j), List::Completing, "{j} stays in CL");
        assert!(p.limit(&id(j)).unwrap() < 1.0, "{j} is limited again");
    }
    assert_eq!(p.limit(&id("c")), Some(1.0));
}
