use super::pacing::pace;
use super::startup::{agent_config, apply_cluster_options, load_config};
use super::*;
use crate::config::DaemonConfig;

#[test]
fn the_actuation_settings_reach_the_actuator() {
    let config = DaemonConfig::parse(
            "[actuation]\noriginal_limits_are_ceilings = false\nv1_memory_limit = true\ngovern_memory = true\n",
            Path::new("g.toml"),
        )
        .unwrap();
    let a = actuator_config(&config);
    assert!(!a.original_limits_are_ceilings);
    assert!(a.v1_memory_limit);
    assert!(a.manage_memory);
    let defaults = actuator_config(&DaemonConfig::default());
    assert!(defaults.original_limits_are_ceilings && !defaults.v1_memory_limit);
}

fn opts() -> DaemonOptions {
    DaemonOptions {
        config_path: "/nonexistent/governor.toml".into(),
        policy: None,
        dry_run: false,
        coordinator: None,
        certs: None,
        insecure: false,
        node_name: None,
    }
}

#[test]
fn the_policy_flag_takes_the_old_name_of_shortest_left() {
    assert_eq!(load_config(&opts()).unwrap().policy, "learning-first");
    for flag in ["governor", "governor:slack=0.2", "shortest-left:slack=0.2"] {
        let config = load_config(&DaemonOptions {
            policy: Some(flag.into()),
            ..opts()
        })
        .unwrap_or_else(|e| panic!("--policy {flag}: {e:#}"));
        assert_eq!(config.policy, flag);
        assert_eq!(
            policy::by_spec(&config.policy).unwrap().name(),
            "shortest-left"
        );
    }
    let e = load_config(&DaemonOptions {
        policy: Some("governor:slack=x".into()),
        ..opts()
    })
    .unwrap_err();
    assert!(format!("{e:#}").contains("slack"), "{e:#}");
}

#[test]
fn sampling_is_spaced_out_only_when_a_round_costs_more_than_its_budget() {
    let second = Duration::from_secs(1);
    // A small node: a round of 0.2 ms keeps the configured interval.
    assert_eq!(pace(second, Duration::from_micros(200), 1000), second);
    // 1,000 jobs: a 25 ms round is sampled every 5 s (0.5% of a core).
    assert_eq!(
        pace(second, Duration::from_millis(25), 1000),
        Duration::from_millis(5000)
    );
    // A few jobs on a slow machine (the TCG test VM) keep the configured interval.
    assert_eq!(pace(second, Duration::from_millis(25), 2), second);
    // Never slower than ten times the configured interval.
    assert_eq!(
        pace(second, Duration::from_secs(1), 1000),
        Duration::from_secs(10)
    );
    let mut pacer = SamplePacer::new(second);
    let t = Instant::now();
    pacer.done(t, t + Duration::from_millis(25), 1000);
    assert_eq!(pacer.next, t + Duration::from_millis(5000));
    // Small changes do not move the interval (no flapping, no log line per round).
    pacer.done(t, t + Duration::from_millis(27), 1000);
    assert_eq!(pacer.next, t + Duration::from_millis(5000));
    pacer.done(t, t + Duration::from_micros(300), 1000);
    assert_eq!(pacer.next, t + second);
    pacer.done(t, t + Duration::from_millis(25), 3);
    assert_eq!(pacer.next, t + second);
}

#[test]
fn coordinator_flags_fill_the_coordinator_table() {
    let mut config = DaemonConfig::default();
    let o = DaemonOptions {
        coordinator: Some("10.10.0.1:7070".into()),
        certs: Some("/etc/governor/certs".into()),
        node_name: Some("node2".into()),
        ..opts()
    };
    apply_cluster_options(&mut config, &o).unwrap();
    let c = config.coordinator.as_ref().unwrap();
    assert_eq!(c.address, "10.10.0.1:7070");
    assert_eq!(
        c.ca.as_deref(),
        Some(Path::new("/etc/governor/certs/ca.pem"))
    );
    assert_eq!(
        c.cert.as_deref(),
        Some(Path::new("/etc/governor/certs/node2.pem"))
    );
    assert_eq!(
        c.key.as_deref(),
        Some(Path::new("/etc/governor/certs/node2-key.pem"))
    );
    assert_eq!(config.node.name.as_deref(), Some("node2"));
    let agent = agent_config(
        c,
        "node2",
        crate::coordinator_client::NodeCapacity::cpu_only(2.0, 1 << 30),
    );
    assert_eq!(
        agent.tls.unwrap().cert,
        PathBuf::from("/etc/governor/certs/node2.pem")
    );
}

#[test]
fn coordinator_flags_are_checked() {
    let mut config = DaemonConfig::default();
    let e = apply_cluster_options(
        &mut config,
        &DaemonOptions {
            coordinator: Some("10.10.0.1:7070".into()),
            ..opts()
        },
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("--certs DIR"), "{e}");
    let e = apply_cluster_options(
        &mut DaemonConfig::default(),
        &DaemonOptions {
            insecure: true,
            ..opts()
        },
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("need a coordinator"), "{e}");
    let mut config = DaemonConfig::default();
    apply_cluster_options(
        &mut config,
        &DaemonOptions {
            coordinator: Some("127.0.0.1:7070".into()),
            insecure: true,
            ..opts()
        },
    )
    .unwrap();
    let c = config.coordinator.unwrap();
    assert!(c.insecure);
    assert!(
        agent_config(
            &c,
            "n",
            crate::coordinator_client::NodeCapacity::cpu_only(1.0, 1)
        )
        .tls
        .is_none()
    );
}
