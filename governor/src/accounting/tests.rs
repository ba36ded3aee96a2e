use super::cgroupfs::CgroupIndex;
use super::reading::{
    InFlight, add_in_flight, add_pending, aggregate, pending_parents, resolve_running,
};
use super::tree::CgroupTree;
use super::*;
use governor_common::{PendingCharge, RunningTask};
use std::fs;
use std::os::unix::fs::MetadataExt;

fn stats(on_cpu_ns: u64) -> CgroupCpuStats {
    CgroupCpuStats {
        on_cpu_ns,
        run_queue_wait_ns: on_cpu_ns / 10,
        context_switches: 1,
    }
}

/// A fake cgroup v2 root: `cgroup.controllers` and groups with `cpu.stat` files.
fn fake_v2_root() -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    fs::write(root.path().join("cgroup.controllers"), "cpu memory pids\n").unwrap();
    for (group, usec) in [("job-a", 2_500_000u64), ("job-b", 750_000)] {
        fs::create_dir(root.path().join(group)).unwrap();
        fs::write(
            root.path().join(group).join("cpu.stat"),
            format!("usage_usec {usec}\nuser_usec {usec}\nsystem_usec 0\n"),
        )
        .unwrap();
    }
    root
}

#[test]
fn falls_back_to_cpu_stat_on_a_non_cgroup2_root_and_says_why() {
    let root = fake_v2_root();
    let mut acct = CpuAccounting::open(root.path(), &AccountingOptions::default());
    assert_eq!(acct.source(), CpuSource::CpuStat);
    assert_eq!(acct.source().as_str(), "cpu.stat");
    let reason = acct.fallback_reason().expect("a fallback reason");
    assert!(reason.contains("not a cgroup v2 mount"), "{reason}");
    assert!(
        acct.describe().starts_with("cpu.stat (eBPF unavailable: "),
        "{}",
        acct.describe()
    );

    // Absolute and relative paths; a missing group is left out.
    let groups = vec![
        root.path().join("job-a"),
        PathBuf::from("job-b"),
        PathBuf::from("job-gone"),
    ];
    let readings = acct.read(&groups);
    assert_eq!(readings.len(), 2, "{readings:?}");
    assert_eq!(readings[0].path, root.path().join("job-a"));
    assert!((readings[0].cpu_seconds_total - 2.5).abs() < 1e-9);
    assert_eq!(readings[1].path, PathBuf::from("job-b"));
    assert!((readings[1].cpu_seconds_total - 0.75).abs() < 1e-9);
    assert_eq!(readings[0].run_queue_wait_seconds, None);
    assert_eq!(readings[0].context_switches, None);
    assert_eq!(acct.tracked_cgroup_ids(), None);
}

#[test]
fn the_disable_option_is_the_reported_reason() {
    let root = fake_v2_root();
    let acct = CpuAccounting::open(
        root.path(),
        &AccountingOptions {
            disable_ebpf: true,
            ..AccountingOptions::default()
        },
    );
    assert_eq!(acct.source(), CpuSource::CpuStat);
    assert_eq!(
        acct.fallback_reason(),
        Some("eBPF disabled by configuration")
    );
}

#[test]
fn falls_back_to_cpuacct_on_a_v1_root() {
    let root = tempfile::tempdir().unwrap();
    fs::create_dir_all(root.path().join("cpuacct/job")).unwrap();
    fs::write(root.path().join("cpuacct/cpuacct.usage"), "1\n").unwrap();
    fs::write(
        root.path().join("cpuacct/job/cpuacct.usage"),
        "3000000000\n",
    )
    .unwrap();
    let mut acct = CpuAccounting::open(root.path(), &AccountingOptions::default());
    assert_eq!(acct.source(), CpuSource::Cpuacct);
    let r = acct.read(&[PathBuf::from("cpuacct/job")]);
    assert_eq!(r.len(), 1);
    assert!((r[0].cpu_seconds_total - 3.0).abs() < 1e-9);
}

#[test]
fn a_malformed_cpu_stat_is_left_out_not_fatal() {
    let root = fake_v2_root();
    fs::write(root.path().join("job-a/cpu.stat"), "garbage\n").unwrap();
    let mut acct = CpuAccounting::open(root.path(), &AccountingOptions::default());
    let r = acct.read(&[PathBuf::from("job-a"), PathBuf::from("job-b")]);
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].path, PathBuf::from("job-b"));
    // Warned once, still left out on the next read.
    assert_eq!(acct.read(&[PathBuf::from("job-a")]).len(), 0);
}

#[test]
fn in_flight_slices_are_added_to_the_running_cgroup() {
    let mut own = HashMap::from([(7, stats(1_000))]);
    let in_flight = [
        InFlight {
            cgroup_id: 7,
            on_cpu_ns: 5_000,
            wait_ns: 300,
        },
        // A task whose cgroup is unknown: nothing added.
        InFlight {
            cgroup_id: 0,
            on_cpu_ns: 9_000,
            wait_ns: 9,
        },
        InFlight {
            cgroup_id: 8,
            on_cpu_ns: 50,
            wait_ns: 0,
        },
    ];
    add_in_flight(&mut own, &in_flight);
    assert_eq!(own[&7].on_cpu_ns, 1_000 + 5_000);
    assert_eq!(own[&7].run_queue_wait_ns, 100 + 300);
    assert_eq!(own[&8].on_cpu_ns, 50);
    assert!(!own.contains_key(&0));
}

#[test]
fn pending_charges_are_added_to_their_cgroup() {
    let mut own = HashMap::from([(7, stats(1_000))]);
    let mut cpu0 = RunningTask::default();
    cpu0.pending[0] = PendingCharge {
        cgroup_id: 7,
        parent_id: 1,
        stats: stats(500),
    };
    cpu0.pending[5] = PendingCharge {
        cgroup_id: 9,
        parent_id: 7,
        stats: stats(40),
    };
    let mut cpu1 = RunningTask::default();
    cpu1.pending[2] = PendingCharge {
        cgroup_id: 7,
        parent_id: 1,
        stats: stats(60),
    };
    let running = [cpu0, cpu1];
    add_pending(&mut own, &running);
    assert_eq!(own[&7].on_cpu_ns, 1_560);
    assert_eq!(own[&7].context_switches, 3);
    assert_eq!(own[&9].on_cpu_ns, 40);
    assert!(!own.contains_key(&0), "free slots add nothing");
    assert_eq!(pending_parents(&running), HashMap::from([(7, 1), (9, 7)]));
}

#[test]
fn pending_charges_of_a_removed_cgroup_count_for_its_parent() {
    let root = tempfile::tempdir().unwrap();
    fs::create_dir(root.path().join("job")).unwrap();
    let job = fs::metadata(root.path().join("job")).unwrap().ino();
    let ghost = 987_654_321;
    let mut tree = CgroupTree::with_existence(root.path(), Box::new(|_| Some(false)));
    assert!(tree.refresh(true));
    // Only pending on a CPU: classified, not deleted (it is not in the map).
    let gone = tree.reconcile(&HashMap::new(), &HashMap::from([(ghost, job)]), |_| None);
    assert!(gone.is_empty());
    let mut own = HashMap::from([(job, stats(10)), (ghost, stats(500))]);
    tree.redirect_removed(&mut own);
    assert_eq!(own[&job].on_cpu_ns, 510);
    assert!(!own.contains_key(&ghost));
    // Later written to the map: folded into the parent's retired totals and deleted.
    let map = HashMap::from([(ghost, stats(500))]);
    assert!(tree.refresh(true));
    assert_eq!(tree.reconcile(&map, &HashMap::new(), |_| None), vec![ghost]);
    assert_eq!(tree.retired[&job].on_cpu_ns, 500);
}

#[test]
fn running_tasks_are_measured_and_placed_through_proc() {
    let root = tempfile::tempdir().unwrap();
    let text = fs::read_to_string("/proc/self/cgroup").unwrap();
    let rel = text
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .expect("no cgroup v2 line in /proc/self/cgroup")
        .trim()
        .trim_start_matches('/');
    let dir = root.path().join(rel);
    fs::create_dir_all(&dir).unwrap();
    let me = std::process::id();
    let sched = fs::read_to_string(format!("/proc/{me}/schedstat")).unwrap();
    let mut fields = sched.split_whitespace().map(|f| f.parse::<u64>().unwrap());
    let (runtime, delay) = (fields.next().unwrap(), fields.next().unwrap());
    let task = |pid, start_runtime_ns| RunningTask {
        start_runtime_ns,
        pid,
        seen: 1,
        ..RunningTask::default()
    };
    let running = [
        task(me, runtime),                           // switched in just now
        task(me, runtime.saturating_sub(2_000_000)), // the same task seen on another CPU, earlier
        task(0, 0),                                  // idle
        task(u32::MAX - 1, 0),                       // no such task (exited)
    ];
    let got = resolve_running(root.path(), &running, true);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].cgroup_id, fs::metadata(&dir).unwrap().ino());
    assert!(
        got[0].on_cpu_ns >= 2_000_000,
        "the older start covers both slices: {got:?}"
    );
    assert!(
        got[0].wait_ns >= delay,
        "all its run_delay ({delay}): {got:?}"
    );
    let no_wait = resolve_running(root.path(), &running, false);
    assert_eq!(no_wait[0].wait_ns, 0);
}

#[test]
fn a_group_includes_its_descendants() {
    let index = CgroupIndex::from_nodes(&[
        (1, "/cg", None),
        (10, "/cg/job", Some(1)),
        (11, "/cg/job/worker-0", Some(10)),
        (12, "/cg/job/worker-1", Some(10)),
        (20, "/cg/other", Some(1)),
    ]);
    let own = HashMap::from([
        (10, stats(1)),
        (11, stats(100)),
        (12, stats(1000)),
        (20, stats(5)),
        (99, stats(7)), // not under the root
    ]);
    let sums = aggregate(&own, &index, &HashSet::from([10, 11, 1]));
    assert_eq!(sums[&10].on_cpu_ns, 1101);
    assert_eq!(sums[&10].context_switches, 3);
    assert_eq!(sums[&11].on_cpu_ns, 100);
    assert_eq!(sums[&1].on_cpu_ns, 1106);
    assert!(!sums.contains_key(&20), "not asked for");
}

#[test]
fn removed_cgroups_are_deleted_and_their_totals_kept_by_the_parent() {
    let root = tempfile::tempdir().unwrap();
    fs::create_dir_all(root.path().join("job/step-1/inner")).unwrap();
    let ino = |p: &str| fs::metadata(root.path().join(p)).unwrap().ino();
    let (job, step, inner) = (ino("job"), ino("job/step-1"), ino("job/step-1/inner"));
    let mut tree = CgroupTree::with_existence(root.path(), Box::new(|_| None));
    assert!(tree.refresh(true));
    let mut map = HashMap::from([(job, stats(10)), (step, stats(200)), (inner, stats(3000))]);
    assert!(
        tree.reconcile(&map, &HashMap::new(), |_| None).is_empty(),
        "nothing removed yet"
    );
    let before = aggregate(&map, &tree.index, &HashSet::from([job]))[&job];
    assert_eq!(before.on_cpu_ns, 3210);
    tree.apply_floor(job, before);

    fs::remove_dir(root.path().join("job/step-1/inner")).unwrap();
    fs::remove_dir(root.path().join("job/step-1")).unwrap();
    assert!(tree.refresh(true));
    let mut gone = tree.reconcile(&map, &HashMap::new(), |_| None);
    gone.sort();
    let mut expected = vec![step, inner];
    expected.sort();
    assert_eq!(gone, expected, "both removed groups' entries are deleted");
    for id in &gone {
        map.remove(id);
    }
    assert_eq!(
        tree.retired[&job].on_cpu_ns, 3200,
        "job holds its removed children's totals"
    );

    let mut own = map.clone();
    for (&h, &t) in &tree.retired {
        let e = own.entry(h).or_default();
        *e = e.add(t);
    }
    let after = aggregate(&own, &tree.index, &HashSet::from([job]))[&job];
    assert_eq!(
        after.on_cpu_ns, 3210,
        "the parent's counter did not go backwards"
    );

    // A late charge to a removed id (a task exiting after rmdir) follows the same way.
    let late = HashMap::from([(inner, stats(5))]);
    assert!(tree.refresh(true));
    assert_eq!(
        tree.reconcile(&late, &HashMap::new(), |_| None),
        vec![inner]
    );
    assert_eq!(tree.retired[&job].on_cpu_ns, 3205);
}

#[test]
fn ids_never_seen_under_the_root_are_left_alone_when_existence_is_unknown() {
    let root = tempfile::tempdir().unwrap();
    let mut tree = CgroupTree::with_existence(root.path(), Box::new(|_| None));
    assert!(tree.refresh(true));
    let map = HashMap::from([(123_456_789, stats(1))]);
    assert!(tree.reconcile(&map, &HashMap::new(), |_| None).is_empty());
    assert!(
        !tree.is_unknown(123_456_789),
        "remembered as foreign: no walk on every read"
    );
}

#[test]
fn a_cgroup_removed_before_any_walk_goes_to_the_parent_the_programs_recorded() {
    let root = tempfile::tempdir().unwrap();
    fs::create_dir(root.path().join("job")).unwrap();
    let job = fs::metadata(root.path().join("job")).unwrap().ino();
    let ghost = 987_654_321;
    let mut tree = CgroupTree::with_existence(root.path(), Box::new(|_| Some(false)));
    assert!(tree.refresh(true));
    let map = HashMap::from([(job, stats(10)), (ghost, stats(500))]);
    let gone = tree.reconcile(&map, &HashMap::new(), |id| (id == ghost).then_some(job));
    assert_eq!(gone, vec![ghost]);
    assert_eq!(tree.retired[&job].on_cpu_ns, 500);
    // Without a recorded parent the totals cannot be placed: dropped, but the entry goes.
    let mut tree = CgroupTree::with_existence(root.path(), Box::new(|_| Some(false)));
    assert!(tree.refresh(true));
    assert_eq!(tree.reconcile(&map, &HashMap::new(), |_| None), vec![ghost]);
    assert!(tree.retired.is_empty());
}

#[test]
fn accounting_can_move_to_another_thread() {
    // The daemon keeps it in a task of its own.
    fn assert_send<T: Send>() {}
    assert_send::<CpuAccounting>();
}

#[test]
fn the_floor_keeps_counters_monotonic() {
    let root = tempfile::tempdir().unwrap();
    let mut tree = CgroupTree::with_existence(root.path(), Box::new(|_| None));
    assert_eq!(tree.apply_floor(5, stats(100)).on_cpu_ns, 100);
    assert_eq!(tree.apply_floor(5, stats(90)).on_cpu_ns, 100);
    assert_eq!(tree.apply_floor(5, stats(150)).on_cpu_ns, 150);
}

#[test]
fn walks_are_rate_limited_unless_forced() {
    let root = tempfile::tempdir().unwrap();
    let mut tree = CgroupTree::with_existence(root.path(), Box::new(|_| None));
    assert!(tree.refresh(false));
    assert!(!tree.refresh(false));
    assert!(tree.refresh(true));
}
