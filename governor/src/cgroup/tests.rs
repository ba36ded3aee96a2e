//! Unit tests of the actuator against fake cgroup roots.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::*;
use crate::cgroup::fake::FakeCgroupRoot;
use crate::policy::{Allocation, Category, CpuAllocation, MemoryAllocation};

const MIB: u64 = 1 << 20;

struct Bed {
    dir: tempfile::TempDir,
    fake: FakeCgroupRoot,
}

impl Bed {
    fn new(kind: HierarchyKind) -> Bed {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("cgroup");
        std::fs::create_dir(&root).unwrap();
        let fake = match kind {
            HierarchyKind::Unified => FakeCgroupRoot::unified(&root),
            HierarchyKind::Hybrid => FakeCgroupRoot::hybrid(&root),
            HierarchyKind::Legacy => FakeCgroupRoot::legacy(&root),
        };
        Bed { dir, fake }
    }

    fn v2() -> Bed {
        Bed::new(HierarchyKind::Unified)
    }

    fn state_file(&self) -> PathBuf {
        self.dir.path().join("run/governor/state.json")
    }

    fn config(&self) -> ActuatorConfig {
        ActuatorConfig {
            state_file: self.state_file(),
            ..ActuatorConfig::default()
        }
    }

    fn actuator_with(&self, config: ActuatorConfig) -> Actuator {
        let h = Hierarchy::detect(self.fake.root()).expect("detect fake root");
        Actuator::new(h, config).expect("actuator")
    }

    fn actuator(&self) -> Actuator {
        self.actuator_with(self.config())
    }

    fn state_entries(&self) -> Vec<StateEntry> {
        state::read_entries(&self.state_file()).expect("state file parses")
    }
}

fn job(rel: &str) -> JobCgroup {
    JobCgroup::new(rel).unwrap()
}

fn cpu(weight: u32, max_cores: Option<f64>) -> Allocation {
    Allocation {
        category: Category::Progressing,
        cpu: CpuAllocation { weight, max_cores },
        memory: MemoryAllocation::default(),
        reason: "test".into(),
    }
}

fn mem(high: Option<u64>, max: Option<u64>) -> Allocation {
    Allocation {
        category: Category::Converged,
        cpu: CpuAllocation::DEFAULT,
        memory: MemoryAllocation {
            high_bytes: high,
            max_bytes: max,
        },
        reason: "test".into(),
    }
}

fn usage(current: u64, events: MemoryEvents) -> CgroupUsage {
    CgroupUsage {
        memory_current: Some(current),
        memory_events: Some(events),
        ..Default::default()
    }
}

fn written(out: &ApplyOutcome) -> Vec<(Knob, &str)> {
    out.written
        .iter()
        .map(|w| (w.knob, w.value.as_str()))
        .collect()
}

// ---------------------------------------------------------------- hierarchy detection

#[test]
fn detects_each_layout() {
    for kind in [
        HierarchyKind::Unified,
        HierarchyKind::Hybrid,
        HierarchyKind::Legacy,
    ] {
        let bed = Bed::new(kind);
        let h = Hierarchy::detect(bed.fake.root()).unwrap();
        assert_eq!(h.kind(), kind);
        assert!(!h.on_cgroupfs(), "a temp dir is not cgroupfs");
    }
    let bed = Bed::new(HierarchyKind::Hybrid);
    let h = Hierarchy::detect(bed.fake.root()).unwrap();
    assert_eq!(
        h.unified_dir(),
        Some(bed.fake.root().join("unified").as_path())
    );
    assert_eq!(
        h.v1_mount(Controller::Memory),
        Some(bed.fake.root().join("memory").as_path())
    );
    let bed = Bed::new(HierarchyKind::Legacy);
    let h = Hierarchy::detect(bed.fake.root()).unwrap();
    assert_eq!(h.unified_dir(), None);
    assert!(
        h.v1_mount(Controller::CpuAcct).is_some(),
        "co-mounted cpuacct found"
    );
    let bed = Bed::v2();
    let h = Hierarchy::detect(bed.fake.root()).unwrap();
    assert!(h.v2_controllers().iter().any(|c| c == "memory"));
}

#[test]
fn detection_fails_clearly_without_a_hierarchy() {
    let dir = tempfile::tempdir().unwrap();
    let err = Hierarchy::detect(dir.path()).unwrap_err();
    assert!(matches!(err, CgroupError::NoHierarchy { .. }), "{err}");
    assert!(err.to_string().contains("cgroup.controllers"), "{err}");
    let err = Hierarchy::detect(dir.path().join("missing")).unwrap_err();
    assert!(err.to_string().contains("not a directory"), "{err}");
}

#[test]
fn a_v2_tree_only_under_unified_is_governed_as_unified() {
    let dir = tempfile::tempdir().unwrap();
    FakeCgroupRoot::unified(&dir.path().join("unified"));
    let h = Hierarchy::detect(dir.path()).unwrap();
    assert_eq!(h.kind(), HierarchyKind::Unified);
    assert_eq!(
        h.controller_dir(Controller::Cpu, &job("a")),
        Some(dir.path().join("unified/a"))
    );
}

#[test]
fn job_cgroup_paths_are_validated() {
    assert_eq!(job("/kubepods/pod1/ctr").to_string(), "/kubepods/pod1/ctr");
    assert_eq!(job("a//b/").relative(), Path::new("a/b"));
    for bad in ["/", "", "a/../b", "./a", ".."] {
        assert!(JobCgroup::new(bad).is_err(), "{bad:?} accepted");
    }
    let json = serde_json::to_string(&job("x/y")).unwrap();
    assert_eq!(json, "\"/x/y\"");
    let back: JobCgroup = serde_json::from_str(&json).unwrap();
    assert_eq!(back, job("x/y"));
    assert!(serde_json::from_str::<JobCgroup>("\"/../etc\"").is_err());
}

// ---------------------------------------------------------------- applying

#[test]
fn v2_apply_writes_weight_and_cpu_max_after_recording_the_originals() {
    let bed = Bed::v2();
    bed.fake.add_group("jobs/a");
    let mut act = bed.actuator();
    let out = act
        .apply(&job("jobs/a"), &cpu(250, Some(0.5)), Instant::now())
        .unwrap();
    assert!(out.errors.is_empty(), "{:?}", out.errors);
    let mut w = written(&out);
    w.sort();
    assert_eq!(
        w,
        vec![(Knob::CpuMax, "50000 100000"), (Knob::CpuWeight, "250")]
    );
    assert_eq!(bed.fake.knob("jobs/a", Knob::CpuWeight), "250");
    assert_eq!(bed.fake.knob("jobs/a", Knob::CpuMax), "50000 100000");
    let mut entries = bed.state_entries();
    entries.sort_by_key(|e| e.knob);
    assert_eq!(entries.len(), 2, "{entries:?}");
    assert_eq!(entries[0].knob, Knob::CpuMax);
    assert_eq!(entries[0].original, "max 100000");
    assert_eq!(entries[0].job, "/jobs/a");
    assert_eq!(entries[1].knob, Knob::CpuWeight);
    assert_eq!(entries[1].original, "100");
    assert!(entries.iter().all(|e| e.cgroup_ino.is_some()));
    // Memory was not asked for: untouched, not recorded.
    assert_eq!(bed.fake.knob("jobs/a", Knob::MemoryMax), "max");
}

#[test]
fn an_allocation_equal_to_the_current_values_writes_and_records_nothing() {
    let bed = Bed::v2();
    bed.fake.add_group("a");
    let mut act = bed.actuator();
    let out = act
        .apply(&job("a"), &cpu(100, None), Instant::now())
        .unwrap();
    assert!(out.written.is_empty(), "{:?}", out.written);
    assert!(
        !bed.state_file().exists(),
        "nothing changed, nothing recorded"
    );
}

#[test]
fn an_unchanged_allocation_does_not_touch_the_filesystem() {
    let bed = Bed::v2();
    bed.fake.add_group("a");
    let mut act = bed.actuator();
    let t0 = Instant::now();
    let alloc = Allocation {
        memory: MemoryAllocation {
            high_bytes: Some(900 * MIB),
            max_bytes: Some(1200 * MIB),
        },
        ..cpu(300, Some(1.5))
    };
    let u = usage(100 * MIB, MemoryEvents::default());
    let first = act.apply_with_usage(&job("a"), &alloc, &u, t0).unwrap();
    assert_eq!(first.written.len(), 4, "{:?}", first.written);
    // The cgroup's files disappear: any read or write would now fail (or report the group gone).
    let dir = bed.fake.root().join("a");
    let aside = bed.fake.root().join("a.aside");
    std::fs::rename(&dir, &aside).unwrap();
    for i in 1..=10 {
        let out = act
            .apply_with_usage(&job("a"), &alloc, &u, t0 + Duration::from_millis(100 * i))
            .unwrap_or_else(|e| panic!("apply #{i} touched the filesystem: {e}"));
        assert!(out.written.is_empty());
        assert_eq!(out.skipped, 4);
    }
    // The periodic drift check does read (and finds the group gone).
    let err = act
        .apply_with_usage(&job("a"), &alloc, &u, t0 + Duration::from_secs(6))
        .unwrap_err();
    assert!(err.is_gone(), "{err}");
}

#[test]
fn weights_are_clamped_and_a_nan_cap_is_refused() {
    let bed = Bed::v2();
    bed.fake.add_group("a");
    let mut act = bed.actuator();
    let t0 = Instant::now();
    act.apply(&job("a"), &cpu(0, None), t0).unwrap();
    assert_eq!(bed.fake.knob("a", Knob::CpuWeight), "1");
    act.apply(&job("a"), &cpu(50_000, None), t0 + Duration::from_secs(1))
        .unwrap();
    assert_eq!(bed.fake.knob("a", Knob::CpuWeight), "10000");
    let err = act
        .apply(
            &job("a"),
            &cpu(100, Some(f64::NAN)),
            t0 + Duration::from_secs(2),
        )
        .unwrap_err();
    assert!(
        matches!(err, CgroupError::InvalidAllocation { .. }),
        "{err}"
    );
    assert_eq!(
        bed.fake.knob("a", Knob::CpuWeight),
        "10000",
        "nothing written"
    );
}

#[test]
fn removing_a_cap_restores_the_original_and_drops_its_record() {
    let bed = Bed::v2();
    bed.fake.add_group("a");
    let mut act = bed.actuator();
    let t0 = Instant::now();
    act.apply(&job("a"), &cpu(100, Some(0.2)), t0).unwrap();
    assert_eq!(bed.fake.knob("a", Knob::CpuMax), "20000 100000");
    let out = act
        .apply(&job("a"), &cpu(100, None), t0 + Duration::from_secs(1))
        .unwrap();
    assert_eq!(out.written.len(), 1);
    assert_eq!(out.written[0].reason, WriteReason::Restore);
    assert_eq!(bed.fake.knob("a", Knob::CpuMax), "max 100000");
    assert!(bed.state_entries().is_empty());
}

// ---------------------------------------------------------------- restore

#[test]
fn release_restores_every_original_and_clears_the_state_file() {
    let bed = Bed::v2();
    bed.fake.add_group("a");
    bed.fake.set("a", "cpu.weight", "42\n");
    bed.fake.set("a", "memory.high", "2147483648\n");
    let mut act = bed.actuator();
    let alloc = Allocation {
        memory: MemoryAllocation {
            high_bytes: Some(1024 * MIB),
            max_bytes: None,
        },
        ..cpu(500, Some(2.0))
    };
    act.apply_with_usage(
        &job("a"),
        &alloc,
        &usage(100 * MIB, MemoryEvents::default()),
        Instant::now(),
    )
    .unwrap();
    assert_eq!(
        bed.fake.knob("a", Knob::MemoryHigh),
        (1024 * MIB).to_string()
    );
    assert_eq!(bed.state_entries().len(), 3);
    let report = act.release(&job("a"));
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(report.restored.len(), 3, "{:?}", report.restored);
    assert_eq!(bed.fake.knob("a", Knob::CpuWeight), "42");
    assert_eq!(bed.fake.knob("a", Knob::CpuMax), "max 100000");
    assert_eq!(bed.fake.knob("a", Knob::MemoryHigh), "2147483648");
    assert!(!bed.state_file().exists());
    assert_eq!(act.jobs().count(), 0);
}

#[test]
fn restore_all_restores_every_job() {
    let bed = Bed::v2();
    let names: Vec<String> = (0..5).map(|i| format!("kubepods/pod{i}")).collect();
    for n in &names {
        bed.fake.add_group(n);
    }
    let mut act = bed.actuator();
    for (i, n) in names.iter().enumerate() {
        act.apply(&job(n), &cpu(200 + i as u32, Some(0.5)), Instant::now())
            .unwrap();
    }
    assert_eq!(bed.state_entries().len(), 10);
    let report = act.restore_all();
    assert_eq!(report.restored.len(), 10);
    for n in &names {
        assert_eq!(bed.fake.knob(n, Knob::CpuWeight), "100");
        assert_eq!(bed.fake.knob(n, Knob::CpuMax), "max 100000");
    }
    assert!(!bed.state_file().exists());
}

#[test]
fn restore_after_a_simulated_crash() {
    let bed = Bed::v2();
    for n in ["a", "b", "c"] {
        bed.fake.add_group(n);
    }
    bed.fake.set("b", "cpu.max", "300000 100000\n");
    {
        let mut act = bed.actuator();
        act.apply(&job("a"), &cpu(900, Some(0.3)), Instant::now())
            .unwrap();
        act.apply(&job("b"), &cpu(20, Some(1.0)), Instant::now())
            .unwrap();
        act.apply_with_usage(
            &job("c"),
            &mem(Some(512 * MIB), Some(1024 * MIB)),
            &usage(10 * MIB, MemoryEvents::default()),
            Instant::now(),
        )
        .unwrap();
        // The governor dies here: no restore.
    }
    assert_eq!(bed.fake.knob("a", Knob::CpuMax), "30000 100000");
    assert_eq!(bed.fake.knob("b", Knob::CpuMax), "100000 100000");
    assert_eq!(
        bed.fake.knob("c", Knob::MemoryMax),
        (1024 * MIB).to_string()
    );

    let mut act = bed.actuator();
    assert_eq!(act.recorded().count(), 6, "leftovers loaded");
    let report = act.recover();
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(report.restored.len(), 6, "{:?}", report.restored);
    assert_eq!(bed.fake.knob("a", Knob::CpuWeight), "100");
    assert_eq!(bed.fake.knob("a", Knob::CpuMax), "max 100000");
    assert_eq!(bed.fake.knob("b", Knob::CpuWeight), "100");
    assert_eq!(bed.fake.knob("b", Knob::CpuMax), "300000 100000");
    assert_eq!(bed.fake.knob("c", Knob::MemoryHigh), "max");
    assert_eq!(bed.fake.knob("c", Knob::MemoryMax), "max");
    assert!(!bed.state_file().exists(), "state cleared after recovery");
    assert_eq!(act.recover().restored.len(), 0, "recover is idempotent");
}

#[test]
fn recovery_skips_vanished_and_recreated_cgroups() {
    let bed = Bed::v2();
    for n in ["gone", "recreated", "kept"] {
        bed.fake.add_group(n);
    }
    {
        let mut act = bed.actuator();
        for n in ["gone", "recreated", "kept"] {
            act.apply(&job(n), &cpu(700, None), Instant::now()).unwrap();
        }
    }
    bed.fake.remove_group("gone");
    // A new container under the same name: a new directory (a new inode) with its own value.
    bed.fake.add_group("recreated.new");
    bed.fake.set("recreated.new", "cpu.weight", "55\n");
    bed.fake.remove_group("recreated");
    std::fs::rename(
        bed.fake.root().join("recreated.new"),
        bed.fake.root().join("recreated"),
    )
    .unwrap();

    let mut act = bed.actuator();
    let report = act.recover();
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(report.restored.len(), 1, "{:?}", report.restored);
    assert_eq!(report.gone.len(), 2, "{:?}", report.gone);
    assert_eq!(bed.fake.knob("kept", Knob::CpuWeight), "100");
    assert_eq!(
        bed.fake.knob("recreated", Knob::CpuWeight),
        "55",
        "a new cgroup of the same name is not ours to restore"
    );
    assert!(!bed.state_file().exists());
}

#[test]
fn applying_before_recovery_keeps_the_true_original() {
    let bed = Bed::v2();
    bed.fake.add_group("a");
    bed.fake.set("a", "cpu.weight", "77\n");
    {
        let mut act = bed.actuator();
        act.apply(&job("a"), &cpu(300, None), Instant::now())
            .unwrap();
    }
    let mut act = bed.actuator();
    // The daemon governs again before recovering: our old value is not mistaken for theirs.
    let out = act
        .apply(&job("a"), &cpu(300, None), Instant::now())
        .unwrap();
    assert!(out.written.is_empty(), "{:?}", out.written);
    act.apply(
        &job("a"),
        &cpu(400, None),
        Instant::now() + Duration::from_secs(1),
    )
    .unwrap();
    assert_eq!(bed.fake.knob("a", Knob::CpuWeight), "400");
    let report = act.recover();
    assert!(
        report.restored.is_empty(),
        "a live job's record is not a leftover"
    );
    let report = act.restore_all();
    assert_eq!(report.restored.len(), 1);
    assert_eq!(bed.fake.knob("a", Knob::CpuWeight), "77");
}

#[test]
fn a_cgroup_gone_at_release_is_not_an_error() {
    let bed = Bed::v2();
    bed.fake.add_group("a");
    let mut act = bed.actuator();
    act.apply(&job("a"), &cpu(300, Some(1.0)), Instant::now())
        .unwrap();
    bed.fake.remove_group("a");
    let report = act.release(&job("a"));
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(report.gone.len(), 2);
    assert!(!bed.state_file().exists());
}

#[test]
fn a_cgroup_gone_at_apply_forgets_the_job() {
    let bed = Bed::v2();
    bed.fake.add_group("a");
    let mut act = bed.actuator();
    act.apply(&job("a"), &cpu(300, None), Instant::now())
        .unwrap();
    bed.fake.remove_group("a");
    let err = act
        .apply(
            &job("a"),
            &cpu(400, None),
            Instant::now() + Duration::from_secs(1),
        )
        .unwrap_err();
    assert!(err.is_gone(), "{err}");
    assert_eq!(act.jobs().count(), 0);
    assert!(
        !bed.state_file().exists(),
        "records of a vanished job are dropped"
    );
    let err = act
        .apply(&job("never"), &cpu(300, None), Instant::now())
        .unwrap_err();
    assert!(err.is_gone(), "{err}");
}

#[test]
fn a_second_actuator_on_the_same_state_file_is_refused() {
    let bed = Bed::v2();
    let _first = bed.actuator();
    let h = Hierarchy::detect(bed.fake.root()).unwrap();
    let err = Actuator::new(h, bed.config()).unwrap_err();
    assert!(matches!(err, CgroupError::StateLocked { .. }), "{err}");
}

#[test]
fn a_corrupt_state_file_is_reported_by_recover() {
    let bed = Bed::v2();
    std::fs::create_dir_all(bed.state_file().parent().unwrap()).unwrap();
    std::fs::write(bed.state_file(), "\0\0garbage").unwrap();
    let mut act = bed.actuator();
    let report = act.recover();
    assert!(
        matches!(report.corrupt_state, Some(CgroupError::StateCorrupt { .. })),
        "{:?}",
        report.corrupt_state
    );
}

#[test]
fn no_write_happens_when_the_original_cannot_be_recorded() {
    let bed = Bed::v2();
    bed.fake.add_group("a");
    let mut act = bed.actuator();
    // The state file's path becomes a non-empty directory: the atomic rename fails.
    std::fs::create_dir_all(bed.state_file().join("blocker")).unwrap();
    let err = act
        .apply(&job("a"), &cpu(300, None), Instant::now())
        .unwrap_err();
    assert!(matches!(err, CgroupError::StateIo { .. }), "{err}");
    assert_eq!(
        bed.fake.knob("a", Knob::CpuWeight),
        "100",
        "written without a record"
    );
}

#[test]
fn invalid_configuration_is_refused() {
    let bed = Bed::v2();
    let h = Hierarchy::detect(bed.fake.root()).unwrap();
    let err = Actuator::new(
        h.clone(),
        ActuatorConfig {
            cpu_period_us: 10,
            ..bed.config()
        },
    )
    .unwrap_err();
    assert!(matches!(err, CgroupError::InvalidConfig { .. }), "{err}");
    let err = Actuator::new(
        h,
        ActuatorConfig {
            jobs_subtree: PathBuf::from("../escape"),
            ..bed.config()
        },
    )
    .unwrap_err();
    assert!(matches!(err, CgroupError::InvalidConfig { .. }), "{err}");
}

// ---------------------------------------------------------------- rate limiting

#[test]
fn cpu_writes_are_rate_limited_and_poll_applies_the_pending_value() {
    let bed = Bed::v2();
    bed.fake.add_group("a");
    let mut act = bed.actuator();
    let t0 = Instant::now();
    act.apply(&job("a"), &cpu(200, None), t0).unwrap();
    let out = act
        .apply(&job("a"), &cpu(300, None), t0 + Duration::from_millis(10))
        .unwrap();
    assert!(out.written.is_empty());
    assert_eq!(out.deferred_until, Some(t0 + Duration::from_millis(100)));
    assert_eq!(bed.fake.knob("a", Knob::CpuWeight), "200");
    assert_eq!(act.next_wakeup(), Some(t0 + Duration::from_millis(100)));
    assert!(
        act.poll(t0 + Duration::from_millis(50)).is_empty(),
        "nothing due yet"
    );
    let results = act.poll(t0 + Duration::from_millis(100));
    assert_eq!(results.len(), 1);
    let out = results[0].1.as_ref().unwrap();
    assert_eq!(written(out), vec![(Knob::CpuWeight, "300")]);
    assert_eq!(bed.fake.knob("a", Knob::CpuWeight), "300");
    // Nothing pending: the next wake-up is the periodic drift check.
    assert_eq!(act.next_wakeup(), Some(t0 + Duration::from_secs(5)));
}

#[test]
fn a_pending_value_that_is_no_longer_wanted_is_dropped() {
    let bed = Bed::v2();
    bed.fake.add_group("a");
    let mut act = bed.actuator();
    let t0 = Instant::now();
    act.apply(&job("a"), &cpu(200, None), t0).unwrap();
    act.apply(&job("a"), &cpu(300, None), t0 + Duration::from_millis(10))
        .unwrap();
    let out = act
        .apply(&job("a"), &cpu(200, None), t0 + Duration::from_millis(20))
        .unwrap();
    assert_eq!(out.deferred_until, None);
    let results = act.poll(t0 + Duration::from_millis(200));
    assert!(
        results
            .iter()
            .all(|(_, r)| r.as_ref().unwrap().written.is_empty())
    );
    assert_eq!(bed.fake.knob("a", Knob::CpuWeight), "200");
}

#[test]
fn raising_a_memory_limit_is_never_held_back_but_lowering_it_is() {
    let bed = Bed::v2();
    bed.fake.add_group("a");
    let mut act = bed.actuator();
    let t0 = Instant::now();
    let u = usage(100 * MIB, MemoryEvents::default());
    act.apply_with_usage(&job("a"), &mem(Some(1024 * MIB), None), &u, t0)
        .unwrap();
    let out = act
        .apply_with_usage(
            &job("a"),
            &mem(Some(2048 * MIB), None),
            &u,
            t0 + Duration::from_millis(10),
        )
        .unwrap();
    assert_eq!(
        written(&out),
        vec![(Knob::MemoryHigh, (2048 * MIB).to_string().as_str())]
    );
    let out = act
        .apply_with_usage(
            &job("a"),
            &mem(Some(1536 * MIB), None),
            &u,
            t0 + Duration::from_millis(20),
        )
        .unwrap();
    assert!(out.written.is_empty());
    assert_eq!(out.deferred_until, Some(t0 + Duration::from_millis(1010)));
}

// ---------------------------------------------------------------- drift

#[test]
fn drift_is_adopted_as_the_original_and_ours_is_reapplied_after_a_back_off() {
    let bed = Bed::v2();
    bed.fake.add_group("pod");
    let mut act = bed.actuator();
    let t0 = Instant::now();
    act.apply(&job("pod"), &cpu(200, None), t0).unwrap();
    // kubelet (or `docker update`) sets the weight.
    bed.fake.kernel_write("pod", "cpu.weight", "39");
    let t1 = t0 + Duration::from_secs(6);
    let out = act.apply(&job("pod"), &cpu(200, None), t1).unwrap();
    assert_eq!(out.drift.len(), 1, "{:?}", out.drift);
    let d = &out.drift[0];
    assert_eq!(
        (d.knob, d.ours.as_str(), d.theirs.as_str()),
        (Knob::CpuWeight, "200", "39")
    );
    assert_eq!(
        d.action,
        DriftAction::ReapplyAt(t1 + Duration::from_secs(1))
    );
    assert!(out.written.is_empty(), "not fought at once");
    assert_eq!(bed.fake.knob("pod", Knob::CpuWeight), "39");
    assert!(bed.state_entries().is_empty(), "their value is in the file");

    let results = act.poll(t1 + Duration::from_secs(1));
    let out = results[0].1.as_ref().unwrap();
    assert_eq!(written(out), vec![(Knob::CpuWeight, "200")]);
    let entries = bed.state_entries();
    assert_eq!(entries.len(), 1);
    assert_eq!(
        entries[0].original, "39",
        "their latest value is the new original"
    );
    act.release(&job("pod"));
    assert_eq!(bed.fake.knob("pod", Knob::CpuWeight), "39");
}

#[test]
fn drift_is_caught_before_a_write_not_overwritten() {
    let bed = Bed::v2();
    bed.fake.add_group("pod");
    let mut act = bed.actuator();
    let t0 = Instant::now();
    act.apply(&job("pod"), &cpu(100, Some(1.0)), t0).unwrap();
    bed.fake.kernel_write("pod", "cpu.max", "250000");
    // A new allocation well before the periodic check: the read before the write sees it.
    let out = act
        .apply(
            &job("pod"),
            &cpu(100, Some(0.5)),
            t0 + Duration::from_millis(500),
        )
        .unwrap();
    assert_eq!(out.drift.len(), 1);
    assert_eq!(
        out.drift[0].theirs, "250000 100000",
        "read as the kernel stores it"
    );
    assert_eq!(bed.fake.knob("pod", Knob::CpuMax), "250000 100000");
}

#[test]
fn the_kernels_normalisation_of_our_own_write_is_not_drift() {
    let bed = Bed::v2();
    bed.fake.add_group("a");
    let mut act = bed.actuator();
    let t0 = Instant::now();
    let u = usage(10 * MIB, MemoryEvents::default());
    // An unaligned proposal: written rounded up to a page, reads back identical.
    act.apply_with_usage(&job("a"), &mem(Some(1000 * MIB + 123), None), &u, t0)
        .unwrap();
    let high = bed.fake.knob("a", Knob::MemoryHigh);
    assert_eq!(high.parse::<u64>().unwrap() % 4096, 0);
    bed.fake.kernel_write("a", "memory.high", &high);
    bed.fake.set("a", "cpu.max", "max 100000\n");
    let out = act
        .apply_with_usage(
            &job("a"),
            &mem(Some(1000 * MIB + 123), None),
            &u,
            t0 + Duration::from_secs(6),
        )
        .unwrap();
    assert!(out.drift.is_empty(), "{:?}", out.drift);
}

#[test]
fn a_file_overwritten_again_and_again_is_given_up_once() {
    let bed = Bed::v2();
    bed.fake.add_group("pod");
    let mut act = bed.actuator();
    let mut now = Instant::now();
    act.apply(&job("pod"), &cpu(200, None), now).unwrap();
    let mut gave_up_at = Vec::new();
    let mut episodes = 0;
    for i in 0..10 {
        bed.fake
            .kernel_write("pod", "cpu.weight", &(40 + i).to_string());
        now += Duration::from_secs(6);
        let out = act.apply(&job("pod"), &cpu(200, None), now).unwrap();
        for d in &out.drift {
            episodes += 1;
            match d.action {
                DriftAction::GaveUp => gave_up_at.push(i),
                // The back-off passes; ours is re-applied.
                DriftAction::ReapplyAt(at) => {
                    now = at;
                    let out = act.apply(&job("pod"), &cpu(200, None), now).unwrap();
                    assert_eq!(written(&out), vec![(Knob::CpuWeight, "200")]);
                }
            }
        }
    }
    assert_eq!(
        episodes, 6,
        "no drift is reported once the file is given up"
    );
    assert_eq!(
        gave_up_at,
        vec![5],
        "given up after 5 overwrites, reported once"
    );
    assert_eq!(bed.fake.knob("pod", Knob::CpuWeight), "49", "theirs stays");
    let report = act.release(&job("pod"));
    assert!(report.restored.is_empty());
    assert_eq!(bed.fake.knob("pod", Knob::CpuWeight), "49");
}

#[test]
fn drift_back_off_doubles_per_episode() {
    let bed = Bed::v2();
    bed.fake.add_group("pod");
    let mut act = bed.actuator();
    let mut now = Instant::now();
    act.apply(&job("pod"), &cpu(200, None), now).unwrap();
    let mut backoffs = Vec::new();
    for i in 0..4 {
        bed.fake
            .kernel_write("pod", "cpu.weight", &(10 + i).to_string());
        now += Duration::from_secs(6);
        let out = act.apply(&job("pod"), &cpu(200, None), now).unwrap();
        let DriftAction::ReapplyAt(at) = out.drift[0].action else {
            panic!("gave up too early")
        };
        backoffs.push((at - now).as_secs());
        now = at;
        let out = act.apply(&job("pod"), &cpu(200, None), now).unwrap();
        assert_eq!(written(&out), vec![(Knob::CpuWeight, "200")]);
    }
    assert_eq!(backoffs, vec![1, 2, 4, 8]);
}

#[test]
fn release_leaves_a_value_someone_else_set_after_our_write() {
    let bed = Bed::v2();
    bed.fake.add_group("pod");
    let mut act = bed.actuator();
    act.apply(&job("pod"), &cpu(200, Some(1.0)), Instant::now())
        .unwrap();
    bed.fake.kernel_write("pod", "cpu.weight", "39");
    let report = act.release(&job("pod"));
    assert_eq!(
        report.left_to_others,
        vec![("/pod".to_owned(), Knob::CpuWeight)]
    );
    assert_eq!(report.restored.len(), 1);
    assert_eq!(bed.fake.knob("pod", Knob::CpuWeight), "39");
    assert_eq!(bed.fake.knob("pod", Knob::CpuMax), "max 100000");
}

// ---------------------------------------------------------------- ceilings

#[test]
fn the_orchestrators_limits_are_ceilings() {
    let bed = Bed::v2();
    bed.fake.add_group("pod");
    bed.fake.set("pod", "cpu.max", "50000 100000\n");
    bed.fake.set("pod", "memory.max", "1073741824\n");
    let mut act = bed.actuator();
    let t0 = Instant::now();
    let u = usage(100 * MIB, MemoryEvents::default());
    // Looser than the pod's limits: nothing to do.
    let mut alloc = cpu(100, Some(2.0));
    alloc.memory.max_bytes = Some(4096 * MIB);
    alloc.memory.high_bytes = Some(4000 * MIB);
    let out = act.apply_with_usage(&job("pod"), &alloc, &u, t0).unwrap();
    let w = written(&out);
    assert!(
        !w.iter()
            .any(|(k, _)| matches!(k, Knob::CpuMax | Knob::MemoryMax)),
        "{w:?}"
    );
    assert_eq!(bed.fake.knob("pod", Knob::CpuMax), "50000 100000");
    assert_eq!(bed.fake.knob("pod", Knob::MemoryMax), "1073741824");
    // Tighter: applied.
    let out = act
        .apply_with_usage(
            &job("pod"),
            &cpu(100, Some(0.25)),
            &u,
            t0 + Duration::from_secs(1),
        )
        .unwrap();
    assert!(
        written(&out).contains(&(Knob::CpuMax, "25000 100000")),
        "{:?}",
        out.written
    );
    // Back to no cap: the pod's limit returns.
    act.apply_with_usage(
        &job("pod"),
        &cpu(100, None),
        &u,
        t0 + Duration::from_secs(2),
    )
    .unwrap();
    assert_eq!(bed.fake.knob("pod", Knob::CpuMax), "50000 100000");
}

#[test]
fn without_ceilings_the_policy_may_loosen_limits() {
    let bed = Bed::v2();
    bed.fake.add_group("pod");
    bed.fake.set("pod", "cpu.max", "50000 100000\n");
    let mut act = bed.actuator_with(ActuatorConfig {
        original_limits_are_ceilings: false,
        ..bed.config()
    });
    act.apply(&job("pod"), &cpu(100, Some(2.0)), Instant::now())
        .unwrap();
    assert_eq!(bed.fake.knob("pod", Knob::CpuMax), "200000 100000");
}

#[test]
fn garbage_in_an_original_limit_leaves_the_file_alone() {
    let bed = Bed::v2();
    bed.fake.add_group("a");
    bed.fake.set("a", "cpu.max", "\u{FFFD}\u{FFFD} nonsense\n");
    let mut act = bed.actuator();
    let out = act
        .apply(&job("a"), &cpu(300, Some(0.5)), Instant::now())
        .unwrap();
    assert!(
        out.errors
            .iter()
            .any(|e| matches!(e, CgroupError::Parse { path, .. } if path.ends_with("cpu.max"))),
        "{:?}",
        out.errors
    );
    assert_eq!(
        written(&out),
        vec![(Knob::CpuWeight, "300")],
        "the weight still applies"
    );
    assert_eq!(
        bed.fake.knob("a", Knob::CpuMax),
        "\u{FFFD}\u{FFFD} nonsense"
    );
    let out = act
        .apply(
            &job("a"),
            &cpu(300, Some(0.4)),
            Instant::now() + Duration::from_secs(1),
        )
        .unwrap();
    assert!(out.errors.is_empty(), "reported once: {:?}", out.errors);
}

// ---------------------------------------------------------------- memory guard in the actuator

#[test]
fn the_memory_guard_raises_limits_to_usage_plus_headroom() {
    let bed = Bed::v2();
    bed.fake.add_group("a");
    let mut act = bed.actuator();
    let u = usage(1000 * MIB, MemoryEvents::default());
    let out = act
        .apply_with_usage(
            &job("a"),
            &mem(Some(100 * MIB), Some(200 * MIB)),
            &u,
            Instant::now(),
        )
        .unwrap();
    assert_eq!(out.guard, Some(GuardVerdict::Raised));
    let high: u64 = bed.fake.knob("a", Knob::MemoryHigh).parse().unwrap();
    let max: u64 = bed.fake.knob("a", Knob::MemoryMax).parse().unwrap();
    assert!(
        high >= 1100 * MIB,
        "memory.high {high} below usage + headroom"
    );
    assert!(
        max >= high + 100 * MIB,
        "memory.max {max} not above memory.high {high}"
    );
}

#[test]
fn the_memory_guard_reads_usage_itself_when_not_given() {
    let bed = Bed::v2();
    bed.fake.add_group("a");
    bed.fake
        .set("a", "memory.current", &(2000 * MIB).to_string());
    let mut act = bed.actuator();
    act.apply(&job("a"), &mem(Some(100 * MIB), None), Instant::now())
        .unwrap();
    let high: u64 = bed.fake.knob("a", Knob::MemoryHigh).parse().unwrap();
    assert!(
        high >= 2200 * MIB,
        "memory.high {high} ignores the usage it read"
    );
}

#[test]
fn pressure_lifts_our_memory_limits_at_once_and_holds_off_tightening() {
    let bed = Bed::v2();
    bed.fake.add_group("a");
    bed.fake.set("a", "memory.max", "8589934592\n");
    let mut act = bed.actuator();
    let t0 = Instant::now();
    let alloc = mem(Some(500 * MIB), Some(800 * MIB));
    let quiet = MemoryEvents::default();
    act.apply_with_usage(&job("a"), &alloc, &usage(200 * MIB, quiet), t0)
        .unwrap();
    assert_eq!(
        bed.fake.knob("a", Knob::MemoryHigh),
        (500 * MIB).to_string()
    );
    assert_eq!(bed.fake.knob("a", Knob::MemoryMax), (800 * MIB).to_string());

    // 10 ms later (well within the memory rate limit) the job hits memory.high.
    let pressure = MemoryEvents { high: 3, ..quiet };
    let t1 = t0 + Duration::from_millis(10);
    let out = act
        .apply_with_usage(&job("a"), &alloc, &usage(480 * MIB, pressure), t1)
        .unwrap();
    assert!(
        matches!(out.guard, Some(GuardVerdict::BackedOff { .. })),
        "{:?}",
        out.guard
    );
    assert!(out.written.iter().all(|w| w.reason == WriteReason::Restore));
    assert_eq!(bed.fake.knob("a", Knob::MemoryHigh), "max");
    assert_eq!(bed.fake.knob("a", Knob::MemoryMax), "8589934592");
    assert!(bed.state_entries().is_empty());

    // During the cool-down the policy's limits are not re-applied.
    let out = act
        .apply_with_usage(
            &job("a"),
            &alloc,
            &usage(300 * MIB, pressure),
            t1 + Duration::from_secs(30),
        )
        .unwrap();
    assert!(out.written.is_empty(), "{:?}", out.written);
    // After it, they are (raised above the usage as needed).
    let out = act
        .apply_with_usage(
            &job("a"),
            &alloc,
            &usage(300 * MIB, pressure),
            t1 + Duration::from_secs(61),
        )
        .unwrap();
    assert_eq!(out.written.len(), 2, "{:?}", out.written);
}

#[test]
fn without_a_memory_controller_no_memory_limit_is_set() {
    let bed = Bed::v2();
    let dir = bed.fake.add_group("a");
    for f in [
        "memory.current",
        "memory.events",
        "memory.high",
        "memory.max",
    ] {
        std::fs::remove_file(dir.join(f)).unwrap();
    }
    let mut act = bed.actuator();
    let t0 = Instant::now();
    let out = act
        .apply(&job("a"), &mem(Some(100 * MIB), None), t0)
        .unwrap();
    assert!(
        out.written
            .iter()
            .all(|w| w.knob.class() == knob::KnobClass::Cpu),
        "{:?}",
        out.written
    );
    assert!(
        out.errors
            .iter()
            .any(|e| matches!(e, CgroupError::ControllerUnavailable { .. })),
        "{:?}",
        out.errors
    );
    let out = act
        .apply(
            &job("a"),
            &mem(Some(100 * MIB), None),
            t0 + Duration::from_secs(1),
        )
        .unwrap();
    assert!(out.errors.is_empty(), "reported once: {:?}", out.errors);
}

#[test]
fn an_expired_cool_down_does_not_keep_the_daemon_awake() {
    let bed = Bed::v2();
    bed.fake.add_group("a");
    let mut act = bed.actuator();
    let t0 = Instant::now();
    let alloc = mem(Some(500 * MIB), None);
    act.apply_with_usage(
        &job("a"),
        &alloc,
        &usage(100 * MIB, MemoryEvents::default()),
        t0,
    )
    .unwrap();
    let pressure = MemoryEvents {
        high: 1,
        ..Default::default()
    };
    act.apply_with_usage(&job("a"), &alloc, &usage(100 * MIB, pressure), t0)
        .unwrap();
    // The policy stops asking for memory limits; the cool-down ends.
    let later = t0 + Duration::from_secs(120);
    act.apply_with_usage(
        &job("a"),
        &cpu(100, None),
        &usage(100 * MIB, pressure),
        later,
    )
    .unwrap();
    let wake = act
        .next_wakeup()
        .expect("the drift check is always due some time");
    assert!(wake > later, "next_wakeup {wake:?} is in the past");
    assert!(act.poll(later + Duration::from_millis(1)).is_empty());
}

#[test]
fn manage_memory_off_never_touches_memory_files() {
    let bed = Bed::v2();
    bed.fake.add_group("a");
    let mut act = bed.actuator_with(ActuatorConfig {
        manage_memory: false,
        ..bed.config()
    });
    let out = act
        .apply(
            &job("a"),
            &mem(Some(100 * MIB), Some(100 * MIB)),
            Instant::now(),
        )
        .unwrap();
    assert!(out.written.is_empty());
    assert_eq!(bed.fake.knob("a", Knob::MemoryHigh), "max");
}

// ---------------------------------------------------------------- errors

#[test]
fn a_failing_write_is_reported_and_the_other_files_still_apply() {
    let bed = Bed::v2();
    let dir = bed.fake.add_group("a");
    // A file that reads fine but refuses writes, even for root (mode 0444 sysctl).
    std::fs::remove_file(dir.join("cpu.weight")).unwrap();
    std::os::unix::fs::symlink("/proc/sys/kernel/ostype", dir.join("cpu.weight")).unwrap();
    let mut act = bed.actuator();
    let t0 = Instant::now();
    let out = act.apply(&job("a"), &cpu(300, Some(0.5)), t0).unwrap();
    assert_eq!(written(&out), vec![(Knob::CpuMax, "50000 100000")]);
    assert!(
        out.errors.iter().any(
            |e| matches!(e, CgroupError::WriteFailed { path, value, .. } if path.ends_with("cpu.weight") && value == "300")
        ),
        "{:?}",
        out.errors
    );
    // Retried no sooner than the rate limit allows.
    let out = act
        .apply(
            &job("a"),
            &cpu(300, Some(0.5)),
            t0 + Duration::from_millis(10),
        )
        .unwrap();
    assert!(out.errors.is_empty() && out.deferred_until.is_some());
}

// ---------------------------------------------------------------- cgroup v1

#[test]
fn v1_cpu_maps_weight_to_shares_and_caps_to_cfs_quota() {
    let bed = Bed::new(HierarchyKind::Hybrid);
    bed.fake.add_group("docker/abc");
    let mut act = bed.actuator();
    let t0 = Instant::now();
    let out = act
        .apply(&job("docker/abc"), &cpu(50, Some(0.2)), t0)
        .unwrap();
    assert!(out.errors.is_empty(), "{:?}", out.errors);
    let mut w = written(&out);
    w.sort();
    // Weight 50 is half of v1's default 1024 shares, as it is half of v2's default weight.
    assert_eq!(
        w,
        vec![(Knob::CfsQuota, "20000"), (Knob::CpuShares, "512")],
        "the period already is 100000"
    );
    let g = |f: &str| {
        std::fs::read_to_string(bed.fake.dir(Controller::Cpu, "docker/abc").join(f))
            .unwrap()
            .trim()
            .to_owned()
    };
    assert_eq!(g("cpu.cfs_quota_us"), "20000");
    assert_eq!(g("cpu.shares"), "512");
    act.release(&job("docker/abc"));
    assert_eq!(g("cpu.cfs_quota_us"), "-1");
    assert_eq!(g("cpu.shares"), "1024");
}

#[test]
fn v1_period_is_written_with_the_quota_and_restored_after_it() {
    let bed = Bed::new(HierarchyKind::Hybrid);
    bed.fake.add_group("j");
    bed.fake
        .set_v1(Controller::Cpu, "j", "cpu.cfs_period_us", "50000\n");
    let mut act = bed.actuator();
    let out = act
        .apply(&job("j"), &cpu(50, Some(0.5)), Instant::now())
        .unwrap();
    let knobs: Vec<Knob> = out.written.iter().map(|w| w.knob).collect();
    assert!(
        knobs.contains(&Knob::CfsPeriod) && knobs.contains(&Knob::CfsQuota),
        "{knobs:?}"
    );
    assert_eq!(bed.fake.knob("j", Knob::CfsPeriod), "100000");
    assert_eq!(bed.fake.knob("j", Knob::CfsQuota), "50000");
    let report = act.release(&job("j"));
    let order: Vec<Knob> = report.restored.iter().map(|r| r.1).collect();
    assert_eq!(
        order,
        vec![Knob::CfsQuota, Knob::CfsPeriod, Knob::CpuShares]
    );
    assert_eq!(bed.fake.knob("j", Knob::CfsPeriod), "50000");
    assert_eq!(bed.fake.knob("j", Knob::CfsQuota), "-1");
}

#[test]
fn v1_memory_high_goes_to_the_soft_limit_and_the_hard_limit_only_when_enabled() {
    let bed = Bed::new(HierarchyKind::Legacy);
    bed.fake.add_group("j");
    let u = usage(100 * MIB, MemoryEvents::default());
    {
        let mut act = bed.actuator();
        let out = act
            .apply_with_usage(
                &job("j"),
                &mem(Some(512 * MIB), Some(768 * MIB)),
                &u,
                Instant::now(),
            )
            .unwrap();
        let memory_writes: Vec<_> = written(&out)
            .into_iter()
            .filter(|(k, _)| k.class() == knob::KnobClass::Memory)
            .collect();
        assert_eq!(
            memory_writes,
            vec![(Knob::MemorySoftLimit, (512 * MIB).to_string().as_str())]
        );
        assert_eq!(bed.fake.knob("j", Knob::MemoryLimit), "9223372036854771712");
        act.restore_all();
        assert_eq!(
            bed.fake.knob("j", Knob::MemorySoftLimit),
            "9223372036854771712"
        );
    }
    let mut act = bed.actuator_with(ActuatorConfig {
        v1_memory_limit: true,
        ..bed.config()
    });
    act.apply_with_usage(
        &job("j"),
        &mem(Some(512 * MIB), Some(768 * MIB)),
        &u,
        Instant::now(),
    )
    .unwrap();
    assert_eq!(
        bed.fake.knob("j", Knob::MemoryLimit),
        (768 * MIB).to_string()
    );
    act.restore_all();
    assert_eq!(bed.fake.knob("j", Knob::MemoryLimit), "9223372036854771712");
}

#[test]
fn v1_drift_sees_through_the_kernels_spelling_of_unlimited() {
    let bed = Bed::new(HierarchyKind::Hybrid);
    bed.fake.add_group("j");
    let mut act = bed.actuator();
    let t0 = Instant::now();
    act.apply(&job("j"), &cpu(100, Some(0.5)), t0).unwrap();
    act.apply(&job("j"), &cpu(100, None), t0 + Duration::from_secs(1))
        .unwrap();
    assert_eq!(bed.fake.knob("j", Knob::CfsQuota), "-1");
    // Someone writes -5 (any negative is "unlimited"; the kernel stores -1): same value, no drift.
    bed.fake.kernel_write("j", "cpu.cfs_quota_us", "-5");
    let out = act
        .apply(&job("j"), &cpu(100, None), t0 + Duration::from_secs(10))
        .unwrap();
    assert!(out.drift.is_empty() && out.written.is_empty(), "{out:?}");
}

#[test]
fn v1_without_a_memory_mount_governs_cpu_only() {
    let bed = Bed::new(HierarchyKind::Hybrid);
    bed.fake.add_group("j");
    std::fs::remove_dir_all(bed.fake.root().join("memory")).unwrap();
    let mut act = bed.actuator();
    let out = act
        .apply(&job("j"), &cpu(100, Some(0.5)), Instant::now())
        .unwrap();
    assert!(out.errors.is_empty(), "{:?}", out.errors);
    assert!(!out.written.is_empty());
}

#[test]
fn the_actuator_creates_job_groups_under_its_subtree() {
    let bed = Bed::v2();
    let act = bed.actuator();
    let job = act.create_job_group("train-1").unwrap();
    assert_eq!(job.to_string(), "/governor.slice/jobs/train-1");
    assert!(bed.fake.root().join("governor.slice/jobs/train-1").is_dir());
    // On a fake root the group has the file a start writes its process to, as the kernel
    // would make it; removing the group removes it.
    let procs = bed
        .fake
        .root()
        .join("governor.slice/jobs/train-1/cgroup.procs");
    assert!(procs.is_file());
    act.fs().remove_job_group(&job).unwrap();
    assert!(!procs.exists());
    act.create_job_group("train-1").unwrap();
    assert!(procs.is_file(), "made again for the next start");
    let err = act.create_job_group("../x").unwrap_err();
    assert!(matches!(err, CgroupError::InvalidJobName { .. }), "{err}");
}

#[test]
fn without_memory_management_v1_job_groups_stay_out_of_the_memory_hierarchy() {
    let bed = Bed::new(HierarchyKind::Hybrid);
    let act = bed.actuator_with(ActuatorConfig {
        manage_memory: false,
        ..bed.config()
    });
    act.create_job_group("j").unwrap();
    assert!(bed.fake.root().join("cpu/governor.slice/jobs/j").is_dir());
    assert!(!bed.fake.root().join("memory/governor.slice").exists());
}

#[test]
fn a_failed_restore_stays_in_the_state_file_for_a_later_attempt() {
    let bed = Bed::v2();
    let dir = bed.fake.add_group("a");
    let mut act = bed.actuator();
    act.apply(&job("a"), &cpu(300, None), Instant::now())
        .unwrap();
    // The file cannot be written back (here: it became a directory).
    std::fs::remove_file(dir.join("cpu.weight")).unwrap();
    std::fs::create_dir(dir.join("cpu.weight")).unwrap();
    let report = act.release(&job("a"));
    assert_eq!(report.errors.len(), 1, "{report:?}");
    assert!(report.restored.is_empty());
    assert_eq!(bed.state_entries().len(), 1, "kept for a later attempt");
    let report = act.restore_all();
    assert_eq!(
        report.errors.len(),
        1,
        "restore_all tries again: {report:?}"
    );
    assert_eq!(
        bed.state_entries().len(),
        1,
        "still kept for the next start"
    );
    drop(act);

    std::fs::remove_dir(dir.join("cpu.weight")).unwrap();
    std::fs::write(dir.join("cpu.weight"), "300\n").unwrap();
    let mut act = bed.actuator();
    let report = act.recover();
    assert_eq!(report.restored.len(), 1, "{report:?}");
    assert_eq!(bed.fake.knob("a", Knob::CpuWeight), "100");
    assert!(!bed.state_file().exists());
}

/// Log lines written while `f` runs (WARN and above, plain text).
fn warnings_during(f: impl FnOnce()) -> String {
    use std::sync::{Arc, Mutex};
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Sink {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let sink = Sink::default();
    let writer = sink.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    tracing::subscriber::with_default(subscriber, f);
    let bytes = sink.0.lock().unwrap().clone();
    String::from_utf8(bytes).unwrap()
}

#[test]
fn a_file_that_cannot_be_read_is_reported_once_not_at_every_decision() {
    let bed = Bed::v2();
    bed.fake.add_group("a");
    // A directory where cpu.max should be: every read fails (EISDIR), even as root.
    let path = bed.fake.root().join("a/cpu.max");
    std::fs::remove_file(&path).unwrap();
    std::fs::create_dir(&path).unwrap();
    let mut act = bed.actuator();
    let t0 = Instant::now();
    let logs = warnings_during(|| {
        for round in 0u32..5 {
            let out = act
                .apply(
                    &job("a"),
                    &cpu(300, Some(0.5 + 0.01 * f64::from(round))),
                    t0 + Duration::from_secs(u64::from(round)),
                )
                .unwrap();
            assert!(
                !out.errors.is_empty(),
                "round {round}: the failure is returned"
            );
        }
    });
    assert_eq!(
        logs.matches("cannot read before writing").count(),
        1,
        "one warning for five decisions:\n{logs}"
    );
    assert_eq!(
        bed.fake.knob("a", Knob::CpuWeight),
        "300",
        "the weight still applies"
    );
}
