//! Real-kernel tests that prove the VM test bed: cgroup v2 `cpu.max` throttles and `memory.max`
//! is enforced. Run with `cargo xtask vm-test vm_cgroup_v2`.

use std::path::Path;
use std::process::Command;
use std::thread::sleep;
use std::time::{Duration, Instant};

use governor_integration_tests::{Burner, CGROUP2_ROOT, TestCgroup, read_keyed, require_vm};

#[test]
#[ignore = "vm: changes cgroup v2 limits; run with `cargo xtask vm-test`"]
fn cpu_max_throttles_a_busy_process_to_its_quota() {
    require_vm();
    let group = TestCgroup::create(Path::new(CGROUP2_ROOT), "bed-cpu-max");
    group.write("cpu.max", "20000 100000");
    let burner = Burner::start();
    group.add_pid(burner.pid());

    let before = read_keyed(&group.path().join("cpu.stat"));
    let t0 = Instant::now();
    sleep(Duration::from_secs(5));
    let after = read_keyed(&group.path().join("cpu.stat"));
    let wall = t0.elapsed().as_secs_f64();

    let used = (after["usage_usec"] - before["usage_usec"]) as f64 / 1e6;
    let share = used / wall;
    let throttled = after["nr_throttled"] - before["nr_throttled"];
    eprintln!(
        "cpu.max 20000/100000: used {used:.3} s CPU in {wall:.2} s = {:.1}%, nr_throttled +{throttled}",
        share * 100.0
    );
    assert!(
        throttled > 0,
        "nr_throttled did not grow: the quota was not enforced"
    );
    assert!(
        (0.15..=0.25).contains(&share),
        "usage {:.1}% is not 20% ± 5%",
        share * 100.0
    );
}

#[test]
#[ignore = "vm: changes cgroup v2 limits; run with `cargo xtask vm-test`"]
fn memory_max_is_enforced_by_the_oom_killer() {
    require_vm();
    let group = TestCgroup::create(Path::new(CGROUP2_ROOT), "bed-memory-max");
    group.write("memory.max", &(64u64 << 20).to_string());
    // No swap in the guest, but make the test independent of that.
    let _ = std::fs::write(group.path().join("memory.swap.max"), "0");

    // Join the group before exec so every page of the allocation is charged to it.
    let script = format!(
        "echo $$ > {}/cgroup.procs && exec {} 200",
        group.path().display(),
        env!("CARGO_BIN_EXE_memhog")
    );
    let status = Command::new("/bin/sh")
        .args(["-c", &script])
        .status()
        .expect("cannot run memhog");
    let events = read_keyed(&group.path().join("memory.events"));
    eprintln!("memhog 200 MiB in a 64 MiB group: {status}, memory.events {events:?}");
    assert!(
        !status.success(),
        "a 200 MiB allocation succeeded under memory.max = 64 MiB"
    );
    assert!(
        events["oom_kill"] >= 1,
        "memory.events shows no oom_kill: {events:?}"
    );

    // And the same allocation fits once the limit is raised.
    group.write("memory.max", &(512u64 << 20).to_string());
    let status = Command::new("/bin/sh")
        .args(["-c", &script])
        .status()
        .expect("cannot run memhog");
    assert!(
        status.success(),
        "200 MiB under memory.max = 512 MiB failed: {status}"
    );
}
