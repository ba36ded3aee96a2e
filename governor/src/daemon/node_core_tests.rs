use super::decision::{clamp_to_bounds, memory_proposal};
use super::records::work_fraction;
use super::*;
use crate::policy::{Bounds, Category, ProgressPoint, Usage};
use crate::progress::{Format, Record};

fn alloc(max: Option<f64>) -> Allocation {
    let mut a = Allocation::unmanaged(Category::Progressing, "t");
    a.cpu.max_cores = max;
    a
}

#[test]
fn work_fraction_counts_epochs_as_each_format_does() {
    let record = |format: Format, epoch: Option<f64>| Record {
        file: std::sync::Arc::from(std::path::Path::new("/l")),
        format,
        index: 0,
        observed_at: std::time::SystemTime::UNIX_EPOCH,
        epoch,
        step: None,
        split: Default::default(),
        metrics: Default::default(),
    };
    // Keras CSV: 0-based, written when the epoch ends.
    assert_eq!(
        work_fraction(&record(Format::KerasCsv, Some(0.0)), Some(4.0)),
        Some(0.25)
    );
    // Hugging Face: the fraction of epochs done.
    assert_eq!(
        work_fraction(&record(Format::HfConsole, Some(1.5)), Some(3.0)),
        Some(0.5)
    );
    // Never past the end, nothing without a total or an epoch, bad values ignored.
    assert_eq!(
        work_fraction(&record(Format::KerasCsv, Some(9.0)), Some(4.0)),
        Some(1.0)
    );
    assert_eq!(
        work_fraction(&record(Format::KerasCsv, Some(1.0)), None),
        None
    );
    assert_eq!(
        work_fraction(&record(Format::KerasCsv, None), Some(4.0)),
        None
    );
    assert_eq!(
        work_fraction(&record(Format::KerasCsv, Some(f64::NAN)), Some(4.0)),
        None
    );
    assert_eq!(
        work_fraction(&record(Format::KerasCsv, Some(1.0)), Some(0.0)),
        None
    );
}

#[test]
fn memory_policy_shrinks_only_jobs_that_stopped_learning() {
    let mut a = alloc(None);
    assert_eq!(
        memory_proposal(a.category, a.memory, Some(500 << 20)),
        MemoryAllocation::default(),
        "a progressing job keeps its limits"
    );
    a.category = Category::Converged;
    assert_eq!(
        memory_proposal(a.category, a.memory, Some(500 << 20)).high_bytes,
        Some(500 << 20)
    );
    assert_eq!(
        memory_proposal(a.category, a.memory, None),
        MemoryAllocation::default(),
        "no usage reading: no proposal"
    );
    a.category = Category::Unknown;
    assert_eq!(
        memory_proposal(a.category, a.memory, Some(500 << 20)),
        MemoryAllocation::default(),
        "no progress seen yet: hands off"
    );
    a.category = Category::Watching;
    a.memory.max_bytes = Some(1 << 30);
    assert_eq!(
        memory_proposal(a.category, a.memory, Some(500 << 20)).max_bytes,
        Some(1 << 30),
        "the policy's own proposal wins"
    );
}

#[test]
fn operator_bounds_override_the_policy() {
    let mut spec = JobSpec::new("j");
    spec.bounds = Bounds {
        min_cores: Some(1.0),
        max_cores: Some(3.0),
        min_memory_bytes: Some(100),
        max_memory_bytes: Some(1000),
    };
    let mut a = alloc(None);
    clamp_to_bounds(&mut a.cpu, &mut a.memory, &spec);
    assert_eq!(
        a.cpu.max_cores,
        Some(3.0),
        "no cap becomes the operator's max"
    );
    let mut a = alloc(Some(0.2));
    clamp_to_bounds(&mut a.cpu, &mut a.memory, &spec);
    assert_eq!(
        a.cpu.max_cores,
        Some(1.0),
        "a cap never goes below the operator's min"
    );
    let mut a = alloc(Some(2.0));
    a.memory.high_bytes = Some(50);
    clamp_to_bounds(&mut a.cpu, &mut a.memory, &spec);
    assert_eq!(a.cpu.max_cores, Some(2.0));
    assert_eq!(a.memory.high_bytes, Some(100));
    assert_eq!(a.memory.max_bytes, Some(1000));
}

use std::sync::{Arc, Mutex};

use crate::cgroup::fake::FakeCgroupRoot;
use crate::cgroup::{Actuator, ActuatorConfig, Hierarchy};
use crate::policy::JobId;

/// Caps each job at the number of cores the test sets for it (none set: hands off).
pub(super) struct SetCaps(pub(super) Arc<Mutex<BTreeMap<JobId, (f64, String)>>>);

impl NodePolicy for SetCaps {
    fn name(&self) -> &'static str {
        "set-caps"
    }
    fn job_added(&mut self, _now: f64, _spec: &JobSpec) {}
    fn job_removed(&mut self, _now: f64, _id: &JobId) {}
    fn progress(&mut self, _now: f64, _id: &JobId, _point: ProgressPoint) {}
    fn usage(&mut self, _now: f64, _id: &JobId, _usage: Usage) {}
    /// A held job's reason says so (what the tests read back through the status).
    fn hold(&mut self, _now: f64, id: &JobId, held: bool) {
        if let Some((_, reason)) = self.0.lock().unwrap().get_mut(id) {
            let base = reason.trim_end_matches(" (held)").to_owned();
            *reason = if held { format!("{base} (held)") } else { base };
        }
    }
    fn decide(&mut self, _now: f64, _node: &NodeResources) -> Plan {
        let caps = self.0.lock().unwrap();
        Plan {
            allocations: caps
                .iter()
                .map(|(id, (cores, reason))| {
                    let mut a = Allocation::unmanaged(Category::Progressing, reason.clone());
                    a.cpu.max_cores = Some(*cores);
                    (id.clone(), a)
                })
                .collect(),
            ..Plan::default()
        }
    }
}

struct Bed {
    _dir: tempfile::TempDir,
    fake: FakeCgroupRoot,
    core: CoreShell,
    caps: Arc<Mutex<BTreeMap<JobId, (f64, String)>>>,
    now: Instant,
    id: fn(&str) -> JobId,
}

const JOBS: [&str; 3] = ["a", "b", "c"];

fn id(job: &str) -> JobId {
    JobId(format!("/jobs/{job}"))
}

/// Three jobs `a`, `b`, `c` in a fake v2 root, each capped at 1 core and applied once.
fn bed() -> Bed {
    bed_with(id)
}

/// [`bed`] with the policy's job ids made by `id`.
fn bed_with(id: fn(&str) -> JobId) -> Bed {
    bed_full(id, None, None)
}

/// [`bed_with`], every job a trial of `sweep` (declared 20 epochs) if given.
fn bed_full(id: fn(&str) -> JobId, sweep: Option<SweepTrial>, finish: Option<FinishRule>) -> Bed {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("cgroup");
    std::fs::create_dir(&root).unwrap();
    let fake = FakeCgroupRoot::unified(&root);
    let actuator = Actuator::new(
        Hierarchy::detect(&root).unwrap(),
        ActuatorConfig {
            state_file: dir.path().join("state.json"),
            cpu_min_write_interval_ms: 0,
            ..ActuatorConfig::default()
        },
    )
    .unwrap();
    let caps = Arc::new(Mutex::new(BTreeMap::new()));
    let settings = CoreSettings {
        node_name: "test".into(),
        resources: NodeResources {
            cores: 8.0,
            memory_bytes: 1 << 34,
        },
        dry_run: false,
        govern_memory: false,
    };
    let now = Instant::now();
    let mut core = CoreShell::new(settings, Box::new(SetCaps(caps.clone())), actuator, now);
    for job in JOBS {
        fake.add_group(&format!("jobs/{job}"));
        let cgroup = JobCgroup::new(format!("jobs/{job}")).unwrap();
        caps.lock().unwrap().insert(id(job), (1.0, "start".into()));
        assert!(core.add_job(
            now,
            NewJob {
                spec: JobSpec::new(id(job).0),
                cgroup,
                name: job.into(),
                source: JobSource::Declared(format!("/{job}.toml").into()),
                runtime: "test".into(),
                signal: SignalConfig::default(),
                epochs: sweep.as_ref().map(|_| 20.0),
                finish,
                sweep: sweep.clone(),
            },
        ));
    }
    let mut bed = Bed {
        _dir: dir,
        fake,
        core,
        caps,
        now,
        id,
    };
    let stats = bed.round();
    assert_eq!((stats.applied, stats.files_written), (3, 3), "{stats:?}");
    bed
}

impl Bed {
    fn round(&mut self) -> RoundStats {
        self.now += Duration::from_millis(10);
        self.core.decide_and_apply(self.now)
    }
    fn set_cap(&self, job: &str, cores: f64, reason: &str) {
        self.caps
            .lock()
            .unwrap()
            .insert((self.id)(job), (cores, reason.into()));
    }
    fn cpu_max(&self, job: &str) -> String {
        self.fake
            .get(&format!("jobs/{job}"), "cpu.max")
            .trim()
            .to_owned()
    }
}

struct NoCpuSampler;

impl CpuSampler for NoCpuSampler {
    fn name(&self) -> String {
        "none".into()
    }
    fn cpu_seconds(&mut self, groups: &[JobCgroup]) -> Vec<Option<f64>> {
        vec![None; groups.len()]
    }
}

#[test]
fn progress_right_after_a_decision_is_batched_within_the_cpu_budget() {
    let mut bed = bed();
    let (at, took) = bed.core.core.last_decision.expect("the bed decided once");
    bed.set_cap("a", 2.0, "a learns");
    // At the same instant: deciding again would exceed the budget, so it is deferred...
    bed.core.on_progress_moved(at);
    assert_eq!(bed.cpu_max("a"), "100000 100000", "not applied yet");
    let due = at + took.mul_f64(1.0 / decision_budget(bed.core.job_count()));
    assert!(bed.core.next_wakeup().is_some_and(|w| w <= due));
    assert!(bed.core.decision_due(due));
    // ...and made once the budget allows, with everything that arrived meanwhile.
    bed.core.decide_and_apply(due);
    assert_eq!(bed.cpu_max("a"), "200000 100000");
    // Long after the last decision, progress is acted on at once.
    bed.set_cap("b", 3.0, "b learns");
    bed.core.on_progress_moved(due + Duration::from_secs(1));
    assert_eq!(bed.cpu_max("b"), "300000 100000");
}

/// A Keras CSVLogger row: `epoch`, its validation loss, a training loss twice that.
pub(super) fn keras_record(epoch: f64, val_loss: f64) -> Record {
    Record {
        file: std::sync::Arc::from(std::path::Path::new("/l")),
        format: Format::KerasCsv,
        index: 0,
        observed_at: std::time::SystemTime::UNIX_EPOCH,
        epoch: Some(epoch),
        step: None,
        split: Default::default(),
        metrics: [
            (std::sync::Arc::from("loss"), val_loss * 2.0),
            (std::sync::Arc::from("val_loss"), val_loss),
        ]
        .into_iter()
        .collect(),
    }
}

/// A job stopped at convergence keeps its share until it exits: ending takes CPU, and held at
/// its floor it could miss the grace before SIGTERM.
#[test]
fn a_job_stopped_at_convergence_keeps_its_share_until_it_exits() {
    let mut bed = bed_full(
        id,
        None,
        Some(FinishRule {
            patience: 2,
            min_delta: 0.01,
            predict: false,
        }),
    );
    let a = JobCgroup::new("jobs/a").unwrap();
    let now = bed.now;
    let held = |bed: &mut Bed, job: &str| {
        bed.round();
        let status = bed.core.status(bed.now);
        let j = status.jobs.into_iter().find(|j| j.name == job).unwrap();
        (j.finish.is_some(), j.decision.contains("(held)"))
    };
    bed.core.on_record(now, &a, &keras_record(0.0, 1.0));
    bed.core.on_record(now, &a, &keras_record(1.0, 0.5));
    assert_eq!(held(&mut bed, "a"), (false, false), "still learning");
    bed.core.on_record(now, &a, &keras_record(2.0, 0.5));
    bed.core.on_record(now, &a, &keras_record(3.0, 0.5));
    assert_eq!(
        held(&mut bed, "a"),
        (true, false),
        "converged: stopped, and served as before until it exits (ending takes CPU)"
    );
    assert_eq!(held(&mut bed, "b"), (false, false));
}

/// [`bed_full`] with every job a trial of sweep `lr`: rungs at 2, 6 and 18 epochs (eta 3), ranked
/// by the best loss seen.
fn sweep_bed() -> Bed {
    let rule = crate::policy::sweep::HalvingRule {
        eta: 3,
        first_rung: 2.0,
        ranking: crate::policy::sweep::Ranking::Seen,
    };
    bed_full(
        id,
        Some(SweepTrial {
            sweep: "lr".into(),
            rule,
        }),
        None,
    )
}

#[test]
fn a_sweep_stops_the_trials_it_cuts_and_says_why() {
    let mut bed = sweep_bed();
    let record = keras_record;
    let cgroup = |job: &str| JobCgroup::new(format!("jobs/{job}")).unwrap();
    let now = bed.now;
    // Keras epoch 1 = two done: the first rung. c and a get there; b, the best, last.
    bed.core.on_record(now, &cgroup("c"), &record(0.0, 0.9));
    bed.core.on_record(now, &cgroup("c"), &record(1.0, 0.5));
    bed.core.on_record(now, &cgroup("a"), &record(1.0, 0.3));
    let status_of =
        |core: &CoreShell, job: &str| core.status(now).jobs.into_iter().find(|j| j.name == job);
    let finish = |core: &CoreShell, job: &str| status_of(core, job).and_then(|j| j.finish);
    let sweep_of = |core: &CoreShell, job: &str| status_of(core, job).and_then(|j| j.sweep);
    let held = |bed: &mut Bed, job: &str| {
        bed.round();
        status_of(&bed.core, job).is_some_and(|j| j.decision.contains("(held)"))
    };
    assert_eq!(
        finish(&bed.core, "c"),
        None,
        "judged only once all are there"
    );
    assert_eq!(
        sweep_of(&bed.core, "c").as_deref(),
        Some("lr (at its 2-epoch rung: waits for the other trials)")
    );
    assert!(held(&mut bed, "c"), "served after the trials on their way");
    assert!(!held(&mut bed, "b"));
    bed.core.on_record(now, &cgroup("b"), &record(1.0, 0.1));
    let c = finish(&bed.core, "c").expect("c is cut");
    assert!(
        c.starts_with("stopped: outranked in its sweep at 2 epochs: loss 0.500000, 3 of 3"),
        "{c}"
    );
    assert!(finish(&bed.core, "a").is_some(), "a is cut too");
    assert_eq!(finish(&bed.core, "b"), None, "the best goes on");
    assert_eq!(sweep_of(&bed.core, "b").as_deref(), Some("lr"));
    // The cut trials (c held at the rung until now) are served as before until they exit:
    // held at their floor they could not end before SIGTERM on a busy slow machine.
    assert!(
        !held(&mut bed, "c") && !held(&mut bed, "a"),
        "being stopped: not held"
    );
    assert!(!held(&mut bed, "b"));
    // The cut trials end; b runs on alone to its end (no rung at 20 epochs).
    bed.core.remove_job(now, &cgroup("a"), "exited");
    bed.core.remove_job(now, &cgroup("c"), "exited");
    bed.core.on_record(now, &cgroup("b"), &record(19.0, 0.01));
    assert_eq!(finish(&bed.core, "b"), None);
}

#[test]
fn a_round_hands_only_changed_allocations_to_the_actuator() {
    let mut bed = bed();
    let stats = bed.round();
    assert_eq!(
        (stats.applied, stats.files_written),
        (0, 0),
        "nothing changed: {stats:?}"
    );
    bed.set_cap("b", 2.5, "b sped up");
    let stats = bed.round();
    assert_eq!(
        (stats.applied, stats.files_written, stats.errors),
        (1, 1, 0),
        "only b changed: {stats:?}"
    );
    assert_eq!(bed.cpu_max("b"), "250000 100000");
    assert_eq!(bed.cpu_max("a"), "100000 100000");
    // A new reason alone writes nothing but is what status shows.
    bed.set_cap("a", 1.0, "a: same cap, new reason");
    let stats = bed.round();
    assert_eq!(stats.applied, 0, "{stats:?}");
    let status = bed.core.status(bed.now);
    let a = status.jobs.iter().find(|j| j.name == "a").unwrap();
    assert_eq!(a.decision, "a: same cap, new reason");
}

#[test]
fn each_job_gets_its_own_allocation_whatever_the_order_of_the_ids() {
    // Ids in the reverse order of the cgroups: the plan cannot be walked in table order.
    let mut bed = bed_with(|job| JobId(format!("id-{}", (b'z' - job.as_bytes()[0]) as char)));
    bed.set_cap("a", 1.5, "a");
    bed.set_cap("b", 2.5, "b");
    bed.set_cap("c", 3.5, "c");
    let stats = bed.round();
    assert_eq!((stats.applied, stats.files_written), (3, 3), "{stats:?}");
    assert_eq!(bed.cpu_max("a"), "150000 100000");
    assert_eq!(bed.cpu_max("b"), "250000 100000");
    assert_eq!(bed.cpu_max("c"), "350000 100000");
}

#[test]
fn sampled_usage_makes_the_next_round_apply_every_job() {
    let mut bed = bed();
    bed.core.sample(bed.now, &mut NoCpuSampler);
    let stats = bed.round();
    assert_eq!(
        (stats.applied, stats.files_written),
        (3, 0),
        "the actuator (memory guard) sees each job's new usage: {stats:?}"
    );
    assert_eq!(bed.round().applied, 0, "and only once");
}

#[test]
fn a_failed_apply_is_retried_on_every_round_until_it_succeeds() {
    let mut bed = bed();
    // c's cgroup disappears (its container is being recreated under the same name).
    bed.fake.remove_group("jobs/c");
    bed.set_cap("c", 3.0, "c sped up");
    let stats = bed.round();
    assert_eq!(
        (stats.applied, stats.files_written, stats.errors),
        (1, 0, 1),
        "{stats:?}"
    );
    let stats = bed.round();
    assert_eq!(
        (stats.applied, stats.errors),
        (1, 1),
        "the failed job is tried again: {stats:?}"
    );
    bed.fake.add_group("jobs/c");
    let stats = bed.round();
    assert_eq!(
        (stats.applied, stats.files_written, stats.errors),
        (1, 1, 0),
        "{stats:?}"
    );
    assert_eq!(bed.cpu_max("c"), "300000 100000");
    assert_eq!(bed.round().applied, 0, "applied: nothing left to do");
}

#[test]
fn a_job_the_policy_lets_go_is_restored_and_applied_again_when_capped_again() {
    let mut bed = bed();
    // Hands off for `a` (weight 100, no cap): its original is put back.
    let mut hands_off = SetCaps(bed.caps.clone()).decide(0.0, &bed.core.core.settings.resources);
    hands_off.allocations.insert(
        id("a"),
        Allocation::unmanaged(Category::Converged, "let go"),
    );
    bed.core.core.policy = Box::new(FixedPlan(hands_off));
    let stats = bed.round();
    assert_eq!(stats.applied, 0, "{stats:?}");
    assert_eq!(bed.cpu_max("a"), "max 100000", "a's original is restored");
    bed.core.core.policy = Box::new(SetCaps(bed.caps.clone()));
    bed.set_cap("a", 1.0, "capped again");
    let stats = bed.round();
    assert_eq!((stats.applied, stats.files_written), (1, 1), "{stats:?}");
    assert_eq!(bed.cpu_max("a"), "100000 100000");
}

#[test]
fn a_move_request_stays_in_status_until_the_policy_is_changed() {
    let mut bed = bed();
    let mut asking = Plan::default();
    asking.move_requests.push(crate::policy::MoveRequest {
        job: id("b"),
        reason: "converged while others progress".into(),
    });
    bed.core.core.policy = Box::new(FixedPlan(asking));
    bed.round();
    let requests = |bed: &Bed| -> Vec<(String, Option<String>)> {
        bed.core
            .status(bed.now)
            .jobs
            .into_iter()
            .map(|j| (j.name, j.move_request))
            .collect()
    };
    let asked = [
        ("a".to_owned(), None),
        (
            "b".to_owned(),
            Some("converged while others progress".to_owned()),
        ),
        ("c".to_owned(), None),
    ];
    assert_eq!(requests(&bed), asked);
    // SpeCon asks once: later plans without the request keep it.
    bed.core.core.policy = Box::new(FixedPlan(Plan::default()));
    bed.round();
    assert_eq!(requests(&bed), asked, "kept until acted on");
    bed.core
        .set_policy(Box::new(FixedPlan(Plan::default())), bed.now);
    bed.round();
    assert!(requests(&bed).iter().all(|(_, r)| r.is_none()));
}

/// Returns the same plan every time.
pub(super) struct FixedPlan(pub(super) Plan);

impl NodePolicy for FixedPlan {
    fn name(&self) -> &'static str {
        "fixed"
    }
    fn job_added(&mut self, _now: f64, _spec: &JobSpec) {}
    fn job_removed(&mut self, _now: f64, _id: &JobId) {}
    fn progress(&mut self, _now: f64, _id: &JobId, _point: ProgressPoint) {}
    fn usage(&mut self, _now: f64, _id: &JobId, _usage: Usage) {}
    fn decide(&mut self, _now: f64, _node: &NodeResources) -> Plan {
        self.0.clone()
    }
}

/// What a node reports as a job's epoch time (ProCon's f, a move's payoff) comes from when its
/// epoch rows arrive: the time up to the first row (the job's start) and from it to the second
/// are not timed.
#[test]
fn a_jobs_epoch_time_in_its_status_is_the_time_between_its_epoch_rows() {
    let mut bed = bed();
    let a = JobCgroup::new("jobs/a").unwrap();
    let epoch_seconds = |bed: &Bed| {
        let status = bed.core.status(bed.now);
        status
            .jobs
            .into_iter()
            .find(|j| j.name == "a")
            .unwrap()
            .epoch_seconds
    };
    let start = bed.now;
    bed.core
        .on_record(start + Duration::from_secs(5), &a, &keras_record(0.0, 1.0));
    assert_eq!(
        epoch_seconds(&bed),
        None,
        "one row: its time holds the start"
    );
    bed.core
        .on_record(start + Duration::from_secs(8), &a, &keras_record(1.0, 0.8));
    assert_eq!(
        epoch_seconds(&bed),
        None,
        "from the first row seen, not yet an epoch"
    );
    bed.core
        .on_record(start + Duration::from_secs(10), &a, &keras_record(2.0, 0.7));
    let s = epoch_seconds(&bed).expect("three rows: an epoch timed");
    assert!((s - 2.0).abs() < 1e-6, "{s}");
}

/// A trial that has logged every epoch it declared is not signalled when a slower trial's
/// arrival at a rung outranks it: it is ending on its own, and a SIGINT in its exit would turn
/// its success into a failure (the short demo, 2026-11-30).
#[test]
fn a_sweep_leaves_a_trial_that_has_done_its_epochs_to_end_on_its_own() {
    let mut bed = sweep_bed();
    let cgroup = |job: &str| JobCgroup::new(format!("jobs/{job}")).unwrap();
    let now = bed.now;
    // c, the worst, runs through all its 20 declared epochs (Keras epoch 19) before the others
    // reach the first rung; a and b then get there, better.
    for epoch in 0..20 {
        bed.core
            .on_record(now, &cgroup("c"), &keras_record(f64::from(epoch), 0.9));
    }
    bed.core
        .on_record(now, &cgroup("a"), &keras_record(1.0, 0.3));
    bed.core
        .on_record(now, &cgroup("b"), &keras_record(1.0, 0.1));
    let finish = |job: &str| {
        bed.core
            .status(now)
            .jobs
            .into_iter()
            .find(|j| j.name == job)
            .and_then(|j| j.finish)
    };
    assert_eq!(finish("c"), None, "c has done its epochs: not signalled");
    assert!(finish("a").is_some(), "a, outranked mid-run, is cut");
}
