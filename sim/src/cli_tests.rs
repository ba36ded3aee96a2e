use super::*;

#[test]
fn seeds_parse_as_ranges_or_lists() {
    assert_eq!(parse_seeds("1-3").unwrap(), vec![1, 2, 3]);
    assert_eq!(parse_seeds("4, 7").unwrap(), vec![4, 7]);
    assert!(parse_seeds("3-1").is_err());
    assert!(parse_seeds("x").is_err());
}

fn cluster_args() -> ClusterArgs {
    ClusterArgs {
        workers: 2,
        cores: 2.0,
        memory_gib: 16.0,
        gpus: 0,
        start_delay: 0.0,
        progress_delay: 0.2,
        usage_interval: 0.5,
        contention: 0.0,
        seed: 1,
    }
}

#[test]
fn cluster_flags_become_a_cluster_and_bad_ones_are_refused() {
    let c = cluster_config(&cluster_args()).unwrap();
    assert_eq!(c.workers.len(), 2);
    assert_eq!(c.workers[1].name, "w02");
    assert_eq!(c.usage_interval, 0.5);
    assert_eq!(c.start_delay, 0.0);
    assert_eq!(c.contention, 0.0);
    let c = cluster_config(&ClusterArgs {
        contention: 0.1,
        ..cluster_args()
    })
    .unwrap();
    assert_eq!(c.contention, 0.1);
    for bad in [
        ClusterArgs {
            workers: 0,
            ..cluster_args()
        },
        ClusterArgs {
            cores: 0.0,
            ..cluster_args()
        },
        ClusterArgs {
            usage_interval: 0.0,
            ..cluster_args()
        },
        ClusterArgs {
            contention: -0.1,
            ..cluster_args()
        },
    ] {
        assert!(cluster_config(&bad).is_err(), "{bad:?} accepted");
    }
}

#[test]
fn the_demo_trace_runs_and_compare_plots_are_written() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/demo-trace.json");
    let trace = read_trace(&path).unwrap();
    let mut config = cluster_config(&ClusterArgs {
        workers: 1,
        ..cluster_args()
    })
    .unwrap();
    config.record_timeline = true;
    let specs: Vec<PolicySpec> = ["fair", "shortest-left/soonest"]
        .iter()
        .map(|s| parse_spec(s).unwrap())
        .collect();
    let reports = evaluate::evaluate(&trace, &config, &specs, 1).unwrap();
    assert!(reports.iter().all(|r| r.unfinished == 0), "{reports:?}");
    let dir = tempfile::tempdir().unwrap();
    let written = sim::plot::write_report_plots(dir.path(), "demo-", &reports).unwrap();
    let names: Vec<String> = written
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        [
            "demo-jct.svg",
            "demo-cpu-fair.svg",
            "demo-cpu-shortest_left_soonest.svg"
        ]
    );
    let jct = std::fs::read_to_string(&written[0]).unwrap();
    assert!(
        jct.contains(">fair<") && jct.contains(">shortest-left/soonest<"),
        "legend"
    );
    let cpu = std::fs::read_to_string(&written[2]).unwrap();
    for id in ["resnet-keras", "bert-hf", "gpt-lightning"] {
        assert!(cpu.contains(id), "{id} missing from the CPU plot");
    }
}

#[test]
fn all_expands_to_every_policy() {
    let p = expand_policies(&["all".to_owned()]);
    assert_eq!(p.len(), policy::POLICY_NAMES.len());
}

#[test]
fn paper_contentions_are_numbers_or_measured_presets() {
    assert_eq!(contentions("0").unwrap(), [0.0]);
    assert_eq!(
        contentions("0, keras,0.3,blas").unwrap(),
        [0.0, 0.1, 0.3, 1.0]
    );
    for bad in ["", "much", "-0.1", "0,,1", "NaN"] {
        assert!(contentions(bad).is_err(), "{bad:?} accepted");
    }
}

#[test]
fn paper_usage_lags_are_seconds_not_below_zero() {
    assert_eq!(usage_lags("0").unwrap(), [0.0]);
    assert_eq!(usage_lags("0, 20,40").unwrap(), [0.0, 20.0, 40.0]);
    for bad in ["", "soon", "-1", "0,,1", "inf", "NaN"] {
        assert!(usage_lags(bad).is_err(), "{bad:?} accepted");
    }
}
