//! Host test: the same throttling through cgroup v1's cpu controller, in a child group this test
//! creates under /sys/fs/cgroup/cpu and always removes. It never touches /sys/fs/cgroup/memory.
//! Needs root and a mounted v1 cpu controller (the development machines have both).

use std::path::Path;
use std::thread::sleep;
use std::time::{Duration, Instant};

use governor_integration_tests::{Burner, TestCgroup, process_cpu_seconds, read_keyed};

const V1_CPU: &str = "/sys/fs/cgroup/cpu";

#[test]
#[ignore = "root-host: writes the host's cgroup v1 cpu controller (root, a hybrid or v1 host); `cargo xtask test` runs it where it can"]
fn root_host_v1_cfs_quota_throttles_a_busy_process() {
    let root = Path::new(V1_CPU);
    assert!(
        root.join("cpu.cfs_quota_us").exists(),
        "prerequisite missing: the cgroup v1 cpu controller is not mounted at {V1_CPU} \
         (this host test needs a hybrid v1/v2 host such as the development machines; \
         cgroup v2 behaviour is tested in the VM by `cargo xtask vm-test`)"
    );
    let name = format!("governor-test-{}", std::process::id());
    let group = TestCgroup::create(root, &name);
    group.write("cpu.cfs_period_us", "100000");
    group.write("cpu.cfs_quota_us", "20000");
    let burner = Burner::start();
    group.add_pid(burner.pid());

    let before_cpu = process_cpu_seconds(burner.pid());
    let before = read_keyed(&group.path().join("cpu.stat"));
    let t0 = Instant::now();
    sleep(Duration::from_secs(5));
    let used = process_cpu_seconds(burner.pid()) - before_cpu;
    let wall = t0.elapsed().as_secs_f64();
    let after = read_keyed(&group.path().join("cpu.stat"));
    drop(burner);

    let share = used / wall;
    let throttled = after["nr_throttled"] - before["nr_throttled"];
    eprintln!(
        "v1 cfs_quota 20000/100000: {used:.2} s CPU in {wall:.2} s = {:.1}%, nr_throttled +{throttled}",
        share * 100.0
    );
    assert!(throttled > 0, "nr_throttled did not grow");
    assert!(
        (0.15..=0.25).contains(&share),
        "usage {:.1}% is not 20% ± 5%",
        share * 100.0
    );
    drop(group);
    assert!(!root.join(&name).exists(), "test group was not removed");
}
