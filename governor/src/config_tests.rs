//! Tests of the daemon configuration: parsing, defaults, the example file.

use super::*;

#[test]
fn empty_file_gives_defaults() {
    let c = DaemonConfig::parse("", Path::new("x.toml")).unwrap();
    assert_eq!(c, DaemonConfig::default());
}

#[test]
fn example_config_parses_to_the_defaults() {
    // Keeps EXAMPLE_CONFIG honest: it shows exactly the defaults.
    let c = DaemonConfig::parse(EXAMPLE_CONFIG, Path::new("example")).unwrap();
    assert_eq!(c, DaemonConfig::default());
}

#[test]
fn example_job_in_the_example_config_is_valid() {
    let job: String = EXAMPLE_CONFIG
        .lines()
        .skip_while(|l| !l.contains("Example declared job"))
        .skip(2)
        .filter_map(|l| l.strip_prefix("# "))
        .collect::<Vec<_>>()
        .join("\n");
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bert.toml");
    std::fs::write(&p, job).unwrap();
    let j = load_job(&p).unwrap();
    assert_eq!(j.name.as_deref(), Some("bert-finetune"));
    assert_eq!(j.max_memory, Some(ByteSize(32 << 30)));
    assert_eq!(j.direction, Some(Direction::Minimise));
    assert_eq!(j.bounds().min_cores, Some(1.0));
}

#[test]
fn the_default_policy_is_learning_first_and_the_old_name_of_shortest_left_still_loads() {
    assert_eq!(DaemonConfig::default().policy, "learning-first");
    // Configurations written before the rename keep working: `governor` is an alias.
    for policy in ["governor", "governor:slack=0.2"] {
        let c = DaemonConfig::parse(&format!("policy = \"{policy}\""), Path::new("g.toml"))
            .unwrap_or_else(|e| panic!("{policy}: {e}"));
        assert_eq!(c.policy, policy);
        let built = crate::policy::by_spec(&c.policy).unwrap();
        assert_eq!(built.name(), "shortest-left", "{policy}");
    }
}

#[test]
fn unknown_keys_and_bad_values_are_rejected_with_the_file_named() {
    let e = DaemonConfig::parse("polcy = \"fair\"", Path::new("/etc/g.toml"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("/etc/g.toml") && e.contains("polcy"), "{e}");
    let e = DaemonConfig::parse("policy = \"nope\"", Path::new("g.toml"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("unknown policy"), "{e}");
    // Parameters as the command line takes them.
    let c = DaemonConfig::parse("policy = \"specon:interval=10\"", Path::new("g.toml")).unwrap();
    assert_eq!(c.policy, "specon:interval=10");
    let e = DaemonConfig::parse("policy = \"specon:intervl=10\"", Path::new("g.toml"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("g.toml") && e.contains("intervl"), "{e}");
    let e = DaemonConfig::parse("sample_interval = \"1ms\"", Path::new("g.toml"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("50ms"), "{e}");
    let e = DaemonConfig::parse("sample_interval = \"soon\"", Path::new("g.toml"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("soon"), "{e}");
    // A `[coordinator]` table is checked only with the command line applied (below).
    assert!(DaemonConfig::parse("[coordinator]\naddress = \"a:1\"", Path::new("g.toml")).is_ok());
}

#[test]
fn who_may_start_jobs_is_checked_when_the_configuration_loads() {
    let c = DaemonConfig::parse(
        "[run_job]\nusers = \"group:ml, user:alice\"\n",
        Path::new("g.toml"),
    )
    .unwrap();
    assert_eq!(c.run_job.users, "group:ml, user:alice");
    assert_eq!(DaemonConfig::default().run_job.users, "any");
    let e = DaemonConfig::parse("[run_job]\nusers = \"everyone\"\n", Path::new("g.toml"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("g.toml") && e.contains("run_job.users") && e.contains("everyone"),
        "{e}"
    );
}

fn host() -> String {
    "host1".into()
}

fn merged(text: &str, flags: ClusterFlags) -> Result<DaemonConfig, ConfigError> {
    let mut config = DaemonConfig::parse(text, Path::new("g.toml")).unwrap();
    config.apply_cluster_flags(&flags, host).map(|()| config)
}

fn tls_of(config: &DaemonConfig) -> (PathBuf, PathBuf, PathBuf) {
    let c = config.coordinator.as_ref().unwrap();
    (
        c.ca.clone().unwrap(),
        c.cert.clone().unwrap(),
        c.key.clone().unwrap(),
    )
}

fn paths(ca: &str, cert: &str, key: &str) -> (PathBuf, PathBuf, PathBuf) {
    (ca.into(), cert.into(), key.into())
}

const FULL: &str = "[node]\nname = \"node2\"\n[coordinator]\naddress = \"10.0.0.1:7070\"\nca = \"/c/ca.pem\"\ncert = \"/c/node2.pem\"\nkey = \"/c/node2-key.pem\"\n";

#[test]
fn cluster_settings_from_the_configuration_only() {
    let c = merged(FULL, ClusterFlags::default()).unwrap();
    assert_eq!(c.coordinator.as_ref().unwrap().address, "10.0.0.1:7070");
    assert_eq!(
        tls_of(&c),
        paths("/c/ca.pem", "/c/node2.pem", "/c/node2-key.pem")
    );
    assert_eq!(c.node.name.as_deref(), Some("node2"));
    // No coordinator anywhere: the node governs alone.
    let c = merged("", ClusterFlags::default()).unwrap();
    assert_eq!(c.coordinator, None);
    let c = merged(
        "[coordinator]\naddress = \"a:1\"\ninsecure = true",
        ClusterFlags::default(),
    )
    .unwrap();
    assert!(c.coordinator.unwrap().insecure);
}

#[test]
fn cluster_settings_from_the_flags_only() {
    let c = merged(
        "",
        ClusterFlags {
            coordinator: Some("10.0.0.1:7070".into()),
            certs: Some("/etc/governor/certs".into()),
            insecure: false,
            node_name: Some("node3".into()),
        },
    )
    .unwrap();
    let coordinator = c.coordinator.as_ref().unwrap();
    assert_eq!(coordinator.address, "10.0.0.1:7070");
    assert!(!coordinator.insecure);
    assert_eq!(
        tls_of(&c),
        paths(
            "/etc/governor/certs/ca.pem",
            "/etc/governor/certs/node3.pem",
            "/etc/governor/certs/node3-key.pem"
        )
    );
    assert_eq!(c.node.name.as_deref(), Some("node3"));
    // Without --node-name and [node] name, the host name names the files.
    let c = merged(
        "",
        ClusterFlags {
            coordinator: Some("a:1".into()),
            certs: Some("/d".into()),
            ..ClusterFlags::default()
        },
    )
    .unwrap();
    assert_eq!(tls_of(&c).1, PathBuf::from("/d/host1.pem"));
    assert_eq!(c.node.name, None);
    let c = merged(
        "",
        ClusterFlags {
            coordinator: Some("a:1".into()),
            insecure: true,
            ..ClusterFlags::default()
        },
    )
    .unwrap();
    assert!(c.coordinator.unwrap().insecure);
}

#[test]
fn the_configurations_address_with_the_flags_certificates() {
    // The case the help promises: [coordinator] address in the file, --certs on the line.
    let c = merged(
        "[node]\nname = \"node2\"\n[coordinator]\naddress = \"10.0.0.1:7070\"\n",
        ClusterFlags {
            certs: Some("/etc/governor/certs".into()),
            ..ClusterFlags::default()
        },
    )
    .unwrap();
    assert_eq!(c.coordinator.as_ref().unwrap().address, "10.0.0.1:7070");
    assert_eq!(
        tls_of(&c),
        paths(
            "/etc/governor/certs/ca.pem",
            "/etc/governor/certs/node2.pem",
            "/etc/governor/certs/node2-key.pem"
        )
    );
    // And the other way round: the certificates in the file, the address on the line.
    let c = merged(
        "[coordinator]\nca = \"/c/ca.pem\"\ncert = \"/c/n.pem\"\nkey = \"/c/n-key.pem\"\n",
        ClusterFlags {
            coordinator: Some("10.0.0.9:7070".into()),
            ..ClusterFlags::default()
        },
    )
    .unwrap();
    assert_eq!(c.coordinator.as_ref().unwrap().address, "10.0.0.9:7070");
    assert_eq!(tls_of(&c), paths("/c/ca.pem", "/c/n.pem", "/c/n-key.pem"));
}

#[test]
fn flags_override_the_configuration() {
    let c = merged(
        FULL,
        ClusterFlags {
            coordinator: Some("10.0.0.2:7071".into()),
            certs: Some("/d".into()),
            insecure: false,
            node_name: Some("node7".into()),
        },
    )
    .unwrap();
    assert_eq!(c.coordinator.as_ref().unwrap().address, "10.0.0.2:7071");
    assert_eq!(c.node.name.as_deref(), Some("node7"));
    // --certs uses the name from --node-name, not [node] name.
    assert_eq!(
        tls_of(&c),
        paths("/d/ca.pem", "/d/node7.pem", "/d/node7-key.pem")
    );
    // --node-name alone renames the node and keeps the configured files.
    let c = merged(
        FULL,
        ClusterFlags {
            node_name: Some("node8".into()),
            ..ClusterFlags::default()
        },
    )
    .unwrap();
    assert_eq!(c.node.name.as_deref(), Some("node8"));
    assert_eq!(tls_of(&c).1, PathBuf::from("/c/node2.pem"));
    // --certs turns a configured insecure = true off; --insecure turns it on.
    let c = merged(
        "[coordinator]\naddress = \"a:1\"\ninsecure = true",
        ClusterFlags {
            certs: Some("/d".into()),
            node_name: Some("n".into()),
            ..ClusterFlags::default()
        },
    )
    .unwrap();
    assert!(!c.coordinator.unwrap().insecure);
    let c = merged(
        FULL,
        ClusterFlags {
            insecure: true,
            ..ClusterFlags::default()
        },
    )
    .unwrap();
    assert!(c.coordinator.unwrap().insecure);
}

#[test]
fn an_incomplete_cluster_setting_is_refused_after_merging() {
    // An address but no certificates from anywhere, and not insecure.
    let e = merged("[coordinator]\naddress = \"a:1\"", ClusterFlags::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("mTLS files (ca, cert, key missing)"), "{e}");
    assert!(e.contains("--certs DIR"), "{e}");
    let e = merged(
        "",
        ClusterFlags {
            coordinator: Some("a:1".into()),
            ..ClusterFlags::default()
        },
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("needs mTLS files"), "{e}");
    let e = merged(
        "[coordinator]\naddress = \"a:1\"\nca = \"/c/ca.pem\"",
        ClusterFlags::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("(cert, key missing)"), "{e}");
    // Certificates but no address from anywhere.
    let e = merged(
        "[coordinator]\n",
        ClusterFlags {
            certs: Some("/d".into()),
            ..ClusterFlags::default()
        },
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("address is missing"), "{e}");
    // --certs or --insecure without any coordinator.
    for flags in [
        ClusterFlags {
            certs: Some("/d".into()),
            ..ClusterFlags::default()
        },
        ClusterFlags {
            insecure: true,
            ..ClusterFlags::default()
        },
    ] {
        let e = merged("", flags).unwrap_err().to_string();
        assert!(e.contains("need a coordinator"), "{e}");
    }
    let e = merged(
        FULL,
        ClusterFlags {
            certs: Some("/d".into()),
            insecure: true,
            ..ClusterFlags::default()
        },
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("contradict"), "{e}");
}

#[test]
fn byte_sizes() {
    assert_eq!(ByteSize::parse("65536").unwrap(), ByteSize(65536));
    assert_eq!(ByteSize::parse("512MiB").unwrap(), ByteSize(512 << 20));
    assert_eq!(ByteSize::parse("2G").unwrap(), ByteSize(2 << 30));
    assert_eq!(ByteSize::parse("1.5 GiB").unwrap(), ByteSize(3 << 29));
    assert!(ByteSize::parse("12 parsecs").is_err());
    assert!(ByteSize::parse("lots").is_err());
    assert_eq!(ByteSize(512 << 20).to_string(), "512MiB");
    assert_eq!(ByteSize(1000).to_string(), "1000");
}

#[test]
fn jobs_dir_loads_good_files_and_reports_bad_ones() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("a.toml"),
        "cgroup = \"/a\"\nlogs = [\"/l/a.csv\"]\nmax_cpu = 2",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("b.toml"),
        "cgroup = \"relative\"\nlogs = [\"/l\"]",
    )
    .unwrap();
    std::fs::write(dir.path().join("c.toml"), "this is not toml").unwrap();
    std::fs::write(
        dir.path().join("d.toml"),
        "cgroup = \"/d\"\nlogs = [\"/l\"]\nmin_cpu = 4\nmax_cpu = 2",
    )
    .unwrap();
    std::fs::write(dir.path().join("e.toml"), "cgroup = \"/e\"\nlogs = []").unwrap();
    std::fs::write(
        dir.path().join("f.toml"),
        "cgroup = \"/f/../../etc\"\nlogs = [\"/l\"]",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("g.toml"),
        "cgroup = \"/g\"\nlogs = [\"/l\"]\n[custom]\nregex = \"(?P<loss>\"",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("h.toml"),
        "cgroup = \"/h\"\nlogs = [\"rel/log.csv\"]",
    )
    .unwrap();
    std::fs::write(dir.path().join("notes.txt"), "ignored").unwrap();
    let (jobs, errors) = load_jobs_dir(dir.path());
    assert_eq!(jobs.len(), 1);
    let a = jobs.values().next().unwrap();
    assert_eq!(a.name.as_deref(), Some("a"));
    assert_eq!(a.max_cpu, Some(2.0));
    let messages: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
    assert_eq!(messages.len(), 7, "{messages:#?}");
    assert!(
        messages
            .iter()
            .any(|m| m.contains("b.toml") && m.contains("starting with '/'"))
    );
    assert!(
        messages
            .iter()
            .any(|m| m.contains("d.toml") && m.contains("above max_cpu"))
    );
    assert!(
        messages
            .iter()
            .any(|m| m.contains("e.toml") && m.contains("logs is empty"))
    );
    assert!(
        messages
            .iter()
            .any(|m| m.contains("f.toml") && m.contains("'..'"))
    );
    assert!(
        messages
            .iter()
            .any(|m| m.contains("g.toml") && m.contains("custom.regex"))
    );
    assert!(
        messages
            .iter()
            .any(|m| m.contains("h.toml") && m.contains("must be absolute"))
    );
}

#[test]
fn missing_jobs_dir_is_not_an_error() {
    let (jobs, errors) = load_jobs_dir(Path::new("/nonexistent/governor/jobs.d"));
    assert!(jobs.is_empty() && errors.is_empty());
}
