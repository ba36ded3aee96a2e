//! The core's decisions, read from the effects it returns: no actuator, no cgroup files, no
//! processes. (The shell carrying them out against a fake cgroup root is tested in
//! `node_core_tests.rs`.)

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use super::super::tests::{FixedPlan, SetCaps, keras_record};
use super::super::{CoreSettings, FINISH_GRACE, JobSource, NewJob, NodeCore};
use super::Effect;
use crate::cgroup::{ApplyOutcome, CgroupError, HierarchyKind, JobCgroup};
use crate::policy::quality::FinishRule;
use crate::policy::sweep::{HalvingRule, SweepTrial};
use crate::policy::{Allocation, Category, JobId, JobSpec, NodePolicy, NodeResources};
use crate::progress::SignalConfig;

type Caps = Arc<Mutex<BTreeMap<JobId, (f64, String)>>>;

fn cgroup(job: &str) -> JobCgroup {
    JobCgroup::new(format!("jobs/{job}")).unwrap()
}

fn id(job: &str) -> JobId {
    JobId(format!("/jobs/{job}"))
}

/// A core governing `a`, `b`, `c`, each capped at 1 core by the policy, each with `finish`
/// and, with `sweep`, a trial of it (20 epochs declared).
fn core_with(
    dry_run: bool,
    finish: Option<FinishRule>,
    sweep: Option<SweepTrial>,
) -> (NodeCore, Caps, Instant) {
    let caps: Caps = Arc::new(Mutex::new(BTreeMap::new()));
    let settings = CoreSettings {
        node_name: "test".into(),
        resources: NodeResources {
            cores: 8.0,
            memory_bytes: 1 << 34,
        },
        dry_run,
        govern_memory: false,
    };
    let now = Instant::now();
    let policy = Box::new(SetCaps(caps.clone()));
    let mut core = NodeCore::new(settings, policy, HierarchyKind::Unified, now);
    for job in ["a", "b", "c"] {
        caps.lock().unwrap().insert(id(job), (1.0, "start".into()));
        assert!(core.add_job(
            now,
            NewJob {
                cgroup: cgroup(job),
                name: job.into(),
                source: JobSource::Declared(format!("/{job}.toml").into()),
                runtime: "test".into(),
                spec: JobSpec::new(id(job).0),
                signal: SignalConfig::default(),
                epochs: sweep.as_ref().map(|_| 20.0),
                finish,
                sweep: sweep.clone(),
            },
        ));
    }
    (core, caps, now)
}

fn core() -> (NodeCore, Caps, Instant) {
    core_with(false, None, None)
}

fn decide(core: &mut NodeCore, now: Instant) -> Vec<Effect> {
    let mut effects = Vec::new();
    core.decide(now, &mut effects);
    effects
}

/// The shell's report that every write of `effects` succeeded.
fn all_written(core: &mut NodeCore, effects: &[Effect]) {
    for effect in effects {
        if let Effect::ApplyLimits { cgroup, alloc, .. } = effect {
            core.limits_applied(cgroup, alloc, &Ok(ApplyOutcome::default()));
        }
    }
}

fn capped_at(cores: f64) -> Allocation {
    let mut alloc = Allocation::unmanaged(Category::Progressing, "");
    alloc.cpu.max_cores = Some(cores);
    alloc
}

fn apply(job: &str, cores: f64) -> Effect {
    Effect::ApplyLimits {
        cgroup: cgroup(job),
        alloc: capped_at(cores),
        usage: None,
    }
}

fn signal(job: &str, signal: Signal) -> Effect {
    Effect::Signal {
        cgroup: cgroup(job),
        signal,
        job: job.into(),
    }
}

#[test]
fn a_round_asks_to_apply_each_governed_job_then_only_what_changed() {
    let (mut core, caps, now) = core();
    let effects = decide(&mut core, now);
    assert_eq!(effects, [apply("a", 1.0), apply("b", 1.0), apply("c", 1.0)]);
    all_written(&mut core, &effects);
    assert_eq!(decide(&mut core, now), [], "applied: nothing to write");
    caps.lock()
        .unwrap()
        .insert(id("b"), (2.5, "b sped up".into()));
    assert_eq!(decide(&mut core, now), [apply("b", 2.5)]);
}

#[test]
fn a_write_that_failed_is_asked_for_again_next_round() {
    let (mut core, _, now) = core();
    let effects = decide(&mut core, now);
    for effect in &effects {
        let Effect::ApplyLimits { cgroup, alloc, .. } = effect else {
            panic!("{effect:?}");
        };
        let result = if *cgroup == self::cgroup("c") {
            Err(CgroupError::CgroupGone {
                job: cgroup.clone(),
                path: "/sys/fs/cgroup/jobs/c".into(),
            })
        } else {
            Ok(ApplyOutcome::default())
        };
        core.limits_applied(cgroup, alloc, &result);
    }
    assert_eq!(decide(&mut core, now), [apply("c", 1.0)]);
}

#[test]
fn a_job_the_policy_lets_go_is_released_once() {
    let (mut core, caps, now) = core();
    let effects = decide(&mut core, now);
    all_written(&mut core, &effects);
    // Hands off for `a` (weight 100, no cap): what the governor wrote is to be put back.
    let mut plan = SetCaps(caps.clone()).decide(0.0, &core.settings.resources);
    plan.allocations.insert(
        id("a"),
        Allocation::unmanaged(Category::Converged, "let go"),
    );
    core.policy = Box::new(FixedPlan(plan));
    assert_eq!(
        decide(&mut core, now),
        [Effect::Release {
            cgroup: cgroup("a")
        }]
    );
    assert_eq!(
        decide(&mut core, now),
        [],
        "released: nothing left to put back"
    );
}

#[test]
fn dry_run_decides_but_asks_for_no_writes() {
    let (mut core, _, now) = core_with(true, None, None);
    assert_eq!(decide(&mut core, now), []);
    let status = core.status(now);
    assert!(status.jobs.iter().all(|j| j.cpu_max_cores == Some(1.0)));
    let mut effects = Vec::new();
    core.remove_job(now, &cgroup("a"), "exited", &mut effects);
    assert_eq!(effects, [], "nothing was written: nothing to release");
}

#[test]
fn a_job_no_longer_governed_is_released() {
    let (mut core, _, now) = core();
    let mut effects = Vec::new();
    assert!(
        core.remove_job(now, &cgroup("b"), "exited", &mut effects)
            .is_some()
    );
    assert_eq!(
        effects,
        [Effect::Release {
            cgroup: cgroup("b")
        }]
    );
}

#[test]
fn shutdown_restores_everything() {
    let (mut core, _, _) = core();
    let mut effects = Vec::new();
    core.shutdown(&mut effects);
    assert_eq!(effects, [Effect::RestoreAll]);
    assert_eq!(core.job_count(), 0);
}

#[test]
fn a_converged_job_is_sent_sigint_then_sigterm_after_the_grace_period() {
    let finish = FinishRule {
        patience: 2,
        min_delta: 0.01,
        predict: false,
    };
    let (mut core, _, now) = core_with(false, Some(finish), None);
    let a = cgroup("a");
    let mut effects = Vec::new();
    for (epoch, loss) in [(0.0, 1.0), (1.0, 0.5), (2.0, 0.5)] {
        core.on_record(now, &a, &keras_record(epoch, loss), &mut effects);
    }
    assert_eq!(effects, [], "still learning");
    core.on_record(now, &a, &keras_record(3.0, 0.5), &mut effects);
    assert_eq!(effects, [signal("a", Signal::SIGINT)], "converged");
    effects.clear();
    core.on_record(now, &a, &keras_record(4.0, 0.5), &mut effects);
    assert_eq!(effects, [], "already being stopped: one SIGINT");

    core.terminate_overdue_stops(now + FINISH_GRACE - Duration::from_secs(1), &mut effects);
    assert_eq!(effects, [], "within the grace period");
    core.terminate_overdue_stops(now + FINISH_GRACE, &mut effects);
    assert_eq!(effects, [signal("a", Signal::SIGTERM)]);
    effects.clear();
    core.terminate_overdue_stops(now + FINISH_GRACE * 2, &mut effects);
    assert_eq!(effects, [], "one SIGTERM");
}

fn sweep() -> SweepTrial {
    SweepTrial {
        sweep: "lr".into(),
        rule: HalvingRule {
            eta: 3,
            first_rung: 2.0,
            ranking: crate::policy::sweep::Ranking::Seen,
        },
    }
}

#[test]
fn a_sweep_cut_sends_sigint_to_each_trial_it_cuts() {
    let (mut core, _, now) = core_with(false, None, Some(sweep()));
    let mut effects = Vec::new();
    // Keras epoch 1 = two done: the first rung. c and a get there; b, the best, last.
    core.on_record(now, &cgroup("c"), &keras_record(0.0, 0.9), &mut effects);
    core.on_record(now, &cgroup("c"), &keras_record(1.0, 0.5), &mut effects);
    core.on_record(now, &cgroup("a"), &keras_record(1.0, 0.3), &mut effects);
    assert_eq!(effects, [], "judged only once all are there");
    core.on_record(now, &cgroup("b"), &keras_record(1.0, 0.1), &mut effects);
    effects.sort_by_key(|e| format!("{e:?}"));
    assert_eq!(
        effects,
        [signal("a", Signal::SIGINT), signal("c", Signal::SIGINT)],
        "b, the best, goes on"
    );
}

#[test]
fn a_trial_that_leaves_is_released_before_the_rung_it_held_up_is_judged() {
    let (mut core, _, now) = core_with(false, None, Some(sweep()));
    let mut effects = Vec::new();
    core.on_record(now, &cgroup("c"), &keras_record(1.0, 0.5), &mut effects);
    core.on_record(now, &cgroup("a"), &keras_record(1.0, 0.3), &mut effects);
    core.remove_job(now, &cgroup("b"), "exited", &mut effects);
    assert_eq!(
        effects,
        [
            Effect::Release {
                cgroup: cgroup("b")
            },
            signal("c", Signal::SIGINT)
        ]
    );
}
