use super::results::pair;
use super::round::read_times;
use super::*;

fn run(policy: &str, rep: u32, jobs: &[(&str, f64, f64)]) -> RunResult {
    RunResult {
        workload: "w".into(),
        policy: policy.into(),
        rep,
        sizes: Sizes::Known,
        makespan: jobs.iter().map(|j| j.1).fold(0.0, f64::max),
        daemon_cpu_seconds: 0.1,
        jobs: jobs
            .iter()
            .map(|&(n, jct, ttq)| JobResult {
                name: n.into(),
                submitted: 0.0,
                jct,
                ttq: Some(ttq),
                cpu_seconds: None,
                epochs_done: 1,
                exit_ok: true,
                curve: Vec::new(),
                cpu_timeline: Vec::new(),
            })
            .collect(),
    }
}

#[test]
fn pairs_compare_averages_and_name_the_worst_job() {
    let fair = run("fair", 1, &[("a", 100.0, 50.0), ("b", 100.0, 80.0)]);
    let gov = run("shortest-left", 1, &[("a", 60.0, 20.0), ("b", 110.0, 80.0)]);
    let p = pair(&fair, &gov);
    assert!((p.avg_jct - (-0.15)).abs() < 1e-9);
    assert!((p.avg_ttq.unwrap() - (100.0 / 130.0 - 1.0)).abs() < 1e-9);
    assert!((p.worst_jct - 1.1).abs() < 1e-9);
    assert!((p.worst_ttq.unwrap() - 1.0).abs() < 1e-9);
    assert!((p.makespan - 0.1).abs() < 1e-9);
}

#[test]
fn a_policy_is_also_looked_up_under_its_old_name() {
    assert_eq!(old_spellings("shortest-left"), ["governor"]);
    assert_eq!(
        old_spellings("shortest-left:slack=0.2+finish=5:0.001"),
        ["governor:slack=0.2+finish=5:0.001"]
    );
    assert!(old_spellings("fair+sweep=lr").is_empty());
    assert!(
        old_spellings("governor").is_empty(),
        "an old name has no older one"
    );
}

#[test]
fn policy_options_and_the_sweeps_result() {
    let p = "shortest-left:probe_offer=1.5+finish=5:0.001+sweep=lr:3:5";
    assert_eq!(policy_option(p, "finish").as_deref(), Some("5:0.001"));
    assert_eq!(policy_option(p, "sweep").as_deref(), Some("lr:3:5"));
    assert_eq!(node_spec(p), "shortest-left:probe_offer=1.5");
    assert_eq!(policy_option("shortest-left", "sweep"), None);
    assert_eq!(
        policy_option("shortest-left:sweep=1", "sweep"),
        None,
        "a policy parameter"
    );
    let mut r = run("shortest-left", 1, &[("a", 100.0, 50.0), ("b", 40.0, 20.0)]);
    r.jobs[0].curve = vec![(10.0, 0.5, 0.4), (20.0, 0.3, 0.2)];
    r.jobs[1].curve = vec![(10.0, 0.5, 0.3), (20.0, 0.4, f64::NAN)];
    r.jobs[1].submitted = 5.0;
    assert_eq!(sweep_result(&r), Some(("a".into(), 0.2, Some(50.0))));
    r.jobs[1].curve.push((30.0, 0.1, f64::NAN));
    assert_eq!(sweep_result(&r), Some(("b".into(), 0.1, Some(25.0))));
}

#[test]
fn spread_is_the_median_and_range() {
    let s = spread(vec![3.0, 1.0, 2.0, f64::NAN]).unwrap();
    assert_eq!((s.median, s.min, s.max, s.n), (2.0, 1.0, 3.0, 3));
    assert_eq!(spread(vec![1.0, 4.0]).unwrap().median, 2.5);
    assert!(spread(Vec::new()).is_none());
}

#[test]
fn times_lines_become_curves_relative_to_submission() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("j.times");
    fs::write(&f, "1 1000.5 0.9 0.8\n2 1002.0 0.5 nan\ngarbage\n").unwrap();
    let c = read_times(&f, 1000.0);
    assert_eq!(c.len(), 2);
    assert_eq!((c[0].0, c[0].1, c[0].2), (0.5, 0.9, 0.8));
    assert!(c[1].2.is_nan());
}

#[test]
fn every_workload_has_distinct_job_names() {
    for w in workloads() {
        let mut names: Vec<&str> = w.jobs.iter().map(|j| j.name.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), w.jobs.len(), "{}", w.name);
    }
}

#[test]
fn a_run_directory_too_deep_for_a_unix_socket_gets_a_short_stable_one() {
    let short = Path::new("/work/target/bench/elastic/runs/fair-known-r1");
    assert_eq!(
        super::round::socket_path(short),
        short.join("governor.sock")
    );
    // The path that stopped a series (2026-11-30): 109 bytes with the socket's name.
    let deep = Path::new(
        "/work/main/target/bench-cluster-elastic-room/elastic/runs/learning-first_soonest-known-r1/node1",
    );
    let socket = super::round::socket_path(deep);
    assert!(socket.as_os_str().len() < 100, "{}", socket.display());
    assert_eq!(
        socket,
        super::round::socket_path(deep),
        "the same for every caller"
    );
    assert_ne!(
        socket,
        super::round::socket_path(&deep.with_file_name("node2")),
        "one per node"
    );
}
