//! Host test: the actuator governs CPU through cgroup v1 on this project's hybrid hosts, in a
//! child group this test creates under /sys/fs/cgroup/cpu and always removes. Memory management
//! is switched off: nothing is ever created or written under /sys/fs/cgroup/memory on the host
//! (the v1 memory path is unit-tested against a fake root). Needs root and the v1 cpu controller.

use std::path::Path;
use std::time::{Duration, Instant};

use governor::cgroup::{
    Actuator, ActuatorConfig, Controller, Hierarchy, HierarchyKind, JobCgroup, Knob,
    weight_to_shares,
};
use governor::policy::{Allocation, Category, CpuAllocation, MemoryAllocation};
use governor_integration_tests::{Burner, TestCgroup, process_cpu_seconds, read_keyed};

fn cpu_alloc(weight: u32, max_cores: Option<f64>) -> Allocation {
    Allocation {
        category: Category::Watching,
        cpu: CpuAllocation { weight, max_cores },
        memory: MemoryAllocation::default(),
        reason: "host v1 test".into(),
    }
}

#[test]
#[ignore = "root-host: writes the host's cgroup v1 cpu controller (root, a hybrid or v1 host); `cargo xtask test` runs it where it can"]
fn root_host_v1_actuator_caps_cpu_and_recovers_after_a_crash() {
    let hierarchy = Hierarchy::detect("/sys/fs/cgroup").expect("cannot detect /sys/fs/cgroup");
    assert_eq!(
        hierarchy.kind(),
        HierarchyKind::Hybrid,
        "prerequisite missing: this host test needs a hybrid v1/v2 host such as the development \
         machines (cgroup v2 is tested in the VM by `cargo xtask vm-test`)"
    );
    let mount = hierarchy
        .v1_mount(Controller::Cpu)
        .expect("the v1 cpu controller is not mounted")
        .to_path_buf();
    let name = format!("governor-actuator-test-{}", std::process::id());
    let group = TestCgroup::create(&mount, &name);
    let job = JobCgroup::new(&name).unwrap();
    let state = tempfile::tempdir().unwrap();
    let config = ActuatorConfig {
        state_file: state.path().join("state.json"),
        manage_memory: false,
        ..ActuatorConfig::default()
    };
    let read = |file: &str| group.read(file).trim().to_owned();
    let original_shares = read("cpu.shares");
    let original_quota = read("cpu.cfs_quota_us");

    {
        let mut act = Actuator::new(hierarchy.clone(), config.clone()).expect("actuator");
        let out = act
            .apply(&job, &cpu_alloc(50, Some(0.2)), Instant::now())
            .expect("apply");
        assert!(out.errors.is_empty(), "{:?}", out.errors);
        assert_eq!(read("cpu.cfs_quota_us"), "20000");
        assert_eq!(read("cpu.cfs_period_us"), "100000");
        assert_eq!(read("cpu.shares"), weight_to_shares(50).to_string());
        // cgroups-rs, as an independent reader of v1 files.
        let ctl = cgroups_rs::fs::cpu::CpuController::new(
            group.path().to_path_buf(),
            mount.clone(),
            false,
        );
        assert_eq!(ctl.cfs_quota().expect("cgroups-rs cfs_quota"), 20_000);
        assert_eq!(
            ctl.shares().expect("cgroups-rs shares"),
            weight_to_shares(50)
        );

        let burner = Burner::start();
        group.add_pid(burner.pid());
        let before_cpu = process_cpu_seconds(burner.pid());
        let before = read_keyed(&group.path().join("cpu.stat"));
        let t0 = Instant::now();
        std::thread::sleep(Duration::from_secs(5));
        let share = (process_cpu_seconds(burner.pid()) - before_cpu) / t0.elapsed().as_secs_f64();
        let after = read_keyed(&group.path().join("cpu.stat"));
        let throttled = after["nr_throttled"] - before["nr_throttled"];
        drop(burner);
        eprintln!(
            "actuator on v1: 0.2 cores -> {:.1}% of a CPU, nr_throttled +{throttled}",
            share * 100.0
        );
        assert!(throttled > 0, "nr_throttled did not grow");
        assert!(
            (0.15..=0.25).contains(&share),
            "usage {:.1}% is not 20% ± 5%",
            share * 100.0
        );
        // The governor dies here without restoring.
    }
    assert_eq!(
        read("cpu.cfs_quota_us"),
        "20000",
        "limits survive the crash"
    );

    let mut act = Actuator::new(hierarchy, config).expect("actuator after the crash");
    let report = act.recover();
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    let restored: Vec<Knob> = report.restored.iter().map(|r| r.1).collect();
    assert_eq!(restored, vec![Knob::CfsQuota, Knob::CpuShares]);
    assert_eq!(read("cpu.cfs_quota_us"), original_quota);
    assert_eq!(read("cpu.shares"), original_shares);
    assert!(!state.path().join("state.json").exists());
    assert!(
        !Path::new("/sys/fs/cgroup/memory").join(&name).exists(),
        "the test must never create anything under the v1 memory hierarchy"
    );
    drop(group);
    assert!(!mount.join(&name).exists(), "test group was not removed");
}
