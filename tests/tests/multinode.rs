//! Multi-node scenarios: `cargo xtask vm-test --nodes N` boots N guests on one L2 segment
//! (10.10.0.1 .. 10.10.0.N) and runs the ignored tests of this file in every guest, with
//! GOVERNOR_NODE (1-based index) and GOVERNOR_NODES set. Each test branches on its node index.

use std::cell::RefCell;
use std::io::{BufRead, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use coordinator::etcd::EtcdConfig;
use governor_integration_tests::daemon::bin;
use governor_integration_tests::replica::Replica;
use governor_integration_tests::{demo_trainer_argv, keras_epochs, poll_until, require_vm};

fn node_env() -> (u32, u32) {
    let get = |k: &str| -> u32 {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{k} is not set: run with `cargo xtask vm-test --nodes N`"))
    };
    (get("GOVERNOR_NODE"), get("GOVERNOR_NODES"))
}

/// Every node serves on 10.10.0.N:7000 and exchanges a message with every other node over the
/// shared segment; the application-level ack makes the exchange reliable.
#[test]
#[ignore = "vm: needs the multi-node bed; run with `cargo xtask vm-test --nodes 3`"]
fn multinode_every_node_reaches_every_other() {
    require_vm();
    let (me, n) = node_env();
    let peers: Vec<u32> = (1..=n).filter(|&m| m != me).collect();
    let listener = TcpListener::bind("0.0.0.0:7000").expect("bind :7000");
    let expected = peers.len();
    let server = thread::spawn(move || {
        let mut served = 0;
        while served < expected {
            let (mut s, addr) = listener.accept().expect("accept");
            let mut buf = [0u8; 64];
            let len = s.read(&mut buf).unwrap_or(0);
            let msg = String::from_utf8_lossy(&buf[..len]).to_string();
            let _ = s.write_all(format!("ack from node{me} to {msg}").as_bytes());
            eprintln!("node{me}: served {addr}: {msg}");
            served += 1;
        }
    });
    for m in peers {
        let deadline = Instant::now() + Duration::from_secs(120);
        let reply = loop {
            let attempt = (|| -> std::io::Result<String> {
                let mut s = TcpStream::connect_timeout(
                    &format!("10.10.0.{m}:7000").parse().unwrap(),
                    Duration::from_secs(3),
                )?;
                s.set_read_timeout(Some(Duration::from_secs(5)))?;
                s.write_all(format!("hello from node{me}").as_bytes())?;
                let mut r = String::new();
                s.read_to_string(&mut r)?;
                if r.is_empty() {
                    return Err(std::io::Error::other("empty reply"));
                }
                Ok(r)
            })();
            match attempt {
                Ok(r) => break r,
                Err(e) if Instant::now() < deadline => {
                    eprintln!("node{me} -> node{m}: {e}, retrying");
                    thread::sleep(Duration::from_millis(500));
                }
                Err(e) => {
                    panic!("node{me} could not reach node{m} at 10.10.0.{m}:7000 in 120 s: {e}")
                }
            }
        };
        eprintln!("node{me} -> node{m}: {reply}");
        assert!(reply.starts_with(&format!("ack from node{m}")));
    }
    server.join().expect("server thread panicked");
}

// ---------------------------------------------------------------------------------------------
// The coordinator scenario: node 1 runs the coordinator and drives govctl; the other nodes run
// the node side and obey node 1's instructions over a small TCP control channel (port 7001 on
// node 1 hands out certificates, port 7002 on the others takes "kill-agent", "start-agent" and
// "done").
// ---------------------------------------------------------------------------------------------

const COORDINATOR_PORT: u16 = 7070;
/// The jobs here are submitted by root (govctl runs as root) and run as root: the nodes allow it.
const ROOT_JOBS: &str = "[coordinator]\nallow_root_jobs = true\n";
const CERTS_PORT: u16 = 7001;
const CONTROL_PORT: u16 = 7002;

/// A child process killed when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn(what: &'static str, cmd: &mut Command, log: &Path) -> Proc {
    // Appended: a restarted daemon's lines follow its predecessor's.
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap_or_else(|e| panic!("cannot create {}: {e}", log.display()));
    let err = out.try_clone().unwrap();
    let child = cmd
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
    Proc(child)
}

fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

/// Run govctl with mTLS as admin; its stdout, or its stderr as the error.
fn try_govctl(certs: &Path, args: &[&str]) -> Result<String, String> {
    let replicas = REPLICA_ADDRESSES.lock().unwrap().clone();
    let address = if replicas.is_empty() {
        format!("127.0.0.1:{COORDINATOR_PORT}")
    } else {
        replicas
    };
    governor_integration_tests::daemon::try_govctl(&address, certs, args)
}

/// Where govctl finds the coordinator: empty for the one coordinator on this node (the redb
/// scenario), else every replica's address ([`multinode_replicas_on_etcd_finish_a_criu_move_whose_leader_died`]).
static REPLICA_ADDRESSES: std::sync::Mutex<String> = std::sync::Mutex::new(String::new());

/// [`try_govctl`], panicking with govctl's message on failure.
fn govctl(certs: &Path, args: &[&str]) -> String {
    try_govctl(certs, args).unwrap_or_else(|e| panic!("govctl {args:?} failed: {e}"))
}

/// Prints the tail of a log if the test panics while it is alive.
struct ShowOnPanic(PathBuf);

impl Drop for ShowOnPanic {
    fn drop(&mut self) {
        if thread::panicking() {
            eprintln!("--- tail of {} ---\n{}", self.0.display(), tail(&self.0));
        }
    }
}

fn govctl_json(certs: &Path, args: &[&str]) -> serde_json::Value {
    let mut a = args.to_vec();
    a.push("--json");
    let text = govctl(certs, &a);
    serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("govctl {args:?}: bad JSON ({e}): {text}"))
}

/// How often [`wait_for`] looks again, in milliseconds. Scenarios that run together look less
/// often: each look is often a `govctl` call, seconds of node1's one emulated vCPU, which the
/// coordinator shares.
static POLL_MS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(500);

fn wait_for<T>(what: &str, timeout_s: u64, mut f: impl FnMut() -> Option<T>) -> T {
    wait_showing(what, timeout_s, |_| f())
}

/// [`wait_for`], where `f` may leave a note of what it saw last (`seen`), shown on a timeout.
fn wait_showing<T>(what: &str, timeout_s: u64, mut f: impl FnMut(&mut String) -> Option<T>) -> T {
    let seen = RefCell::new(String::new());
    poll_until(
        what,
        Duration::from_secs(timeout_s),
        Duration::from_millis(POLL_MS.load(std::sync::atomic::Ordering::Relaxed)),
        || f(&mut seen.borrow_mut()),
        || {
            let seen = seen.take();
            if seen.is_empty() {
                seen
            } else {
                format!("last seen: {seen}")
            }
        },
    )
}

/// Send one line to `addr` and read the whole reply, retrying until `timeout_s`.
fn request(addr: &str, line: &str, timeout_s: u64) -> String {
    wait_for(&format!("{addr} to answer {line:?}"), timeout_s, || {
        let mut s =
            TcpStream::connect_timeout(&addr.parse().unwrap(), Duration::from_secs(3)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
        s.write_all(format!("{line}\n").as_bytes()).ok()?;
        let mut reply = String::new();
        s.read_to_string(&mut reply).ok()?;
        (!reply.is_empty()).then_some(reply)
    })
}

fn job_node(jobs: &serde_json::Value, name: &str) -> Option<(String, String, String)> {
    jobs.as_array()?
        .iter()
        .find(|j| j["name"] == name)
        .map(|j| {
            (
                j["members"][0]["node"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                j["status"].as_str().unwrap_or_default().to_owned(),
                j["category"].as_str().unwrap_or_default().to_owned(),
            )
        })
}

/// The coordinator's id of the submitted (not local) job called `name`.
fn job_id(jobs: &serde_json::Value, name: &str) -> String {
    jobs.as_array()
        .and_then(|a| a.iter().find(|j| j["name"] == name && j["local"] != true))
        .and_then(|j| j["id"].as_str())
        .unwrap_or_default()
        .to_owned()
}

/// The node's status, or `None` while the coordinator does not answer (starting up).
fn node_status(certs: &Path, node: &str) -> Option<String> {
    let text = try_govctl(certs, &["nodes", "--json"]).ok()?;
    let nodes: serde_json::Value = serde_json::from_str(&text).ok()?;
    nodes
        .as_array()?
        .iter()
        .find(|n| n["name"] == node)
        .map(|n| n["status"].as_str().unwrap_or_default().to_owned())
}

/// A training-like job: writes a falling loss (fast, then slowly) to its log every half second.
fn submit_training(certs: &Path, name: &str) -> String {
    let log = format!("/tmp/{name}.log");
    let script = format!(
        "i=0; l=4.0; while :; do i=$((i+1)); \
         l=$(awk -v l=$l -v i=$i 'BEGIN {{ if (i < 8) print l*0.7; else print l*0.999 }}'); \
         echo \"step $i loss=$l\" >> {log}; sleep 0.5; done"
    );
    let out = govctl(
        certs,
        &[
            "submit", "--name", name, "--log", &log, "--", "/bin/sh", "-c", &script,
        ],
    );
    eprintln!("node1: submitted {name}: {}", out.trim());
    out
}

fn coordinator_cmd(certs: &Path) -> Command {
    let mut c = Command::new(bin("coordinator"));
    c.args(["--listen", &format!("0.0.0.0:{COORDINATOR_PORT}")])
        .args(["--store", "/tmp/coordinator.redb"])
        .args(["--config", "/tmp/multinode/coordinator.toml"])
        .arg("--certs")
        .arg(certs)
        .args([
            "--policy",
            "round-robin",
            "--lost-after",
            "8",
            "--log-level",
            "info",
        ])
        // Fault injection: the kept copy of job `tainted`'s checkpoint is corrupted before it is
        // sent to the target (see `move_with_a_checkpoint_corrupted_at_rest`).
        .env("GOVERNOR_FAULT", "corrupt-carried:tainted");
    c
}

/// The node side: the real node daemon joined to the coordinator (mTLS files from node 1).
fn node_daemon_cmd(me: u32, certs: &Path) -> Command {
    let mut config = PathBuf::from("/nonexistent/governor.toml");
    if me == 2 {
        // A file node1 can change at run time ("policy specon"), read again on SIGHUP.
        config = PathBuf::from("/tmp/multinode/governor.toml");
        if !config.exists() {
            std::fs::write(&config, ROOT_JOBS).unwrap();
        }
    }
    if me == 3 {
        // node3's criu cannot restore the jobs named `stranded` (a target whose restore fails).
        let dir = PathBuf::from("/tmp/multinode");
        let criu = dir.join("criu-but-not-stranded");
        std::fs::write(
            &criu,
            "#!/bin/sh\ncase \"$1 $*\" in restore*/stranded-*) echo 'injected: no restore of stranded here' >&2; exit 1;; esac\nexec /usr/sbin/criu \"$@\"\n",
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&criu, std::fs::Permissions::from_mode(0o755)).unwrap();
        config = dir.join("governor.toml");
        std::fs::write(
            &config,
            format!(
                "[coordinator]\ncriu = \"{}\"\nallow_root_jobs = true\n",
                criu.display()
            ),
        )
        .unwrap();
    }
    let mut c = Command::new(bin("governor"));
    c.args(["daemon", "--config"])
        .arg(&config)
        .args(["--coordinator", &format!("10.10.0.1:{COORDINATOR_PORT}")])
        .args(["--node-name", &format!("node{me}")])
        .arg("--certs")
        .arg(certs)
        .args(["--log-level", "info"]);
    c
}

/// Serve the certificate bundle of each node on CERTS_PORT until every node fetched its own.
fn serve_certs(certs: PathBuf, nodes: Vec<u32>) -> thread::JoinHandle<()> {
    let listener = TcpListener::bind(("0.0.0.0", CERTS_PORT)).expect("bind the certificate port");
    thread::spawn(move || {
        let mut left: std::collections::BTreeSet<u32> = nodes.into_iter().collect();
        while !left.is_empty() {
            let Ok((s, _)) = listener.accept() else {
                continue;
            };
            let mut line = String::new();
            let mut reader = std::io::BufReader::new(s.try_clone().unwrap());
            if reader.read_line(&mut line).is_err() {
                continue;
            }
            let Some(n) = line
                .trim()
                .strip_prefix("certs node")
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            let read = |f: String| std::fs::read_to_string(certs.join(f)).unwrap();
            let bundle = serde_json::json!({
                "ca": read("ca.pem".into()),
                "cert": read(format!("node{n}.pem")),
                "key": read(format!("node{n}-key.pem")),
            });
            let mut s = s;
            if s.write_all(bundle.to_string().as_bytes()).is_ok() {
                left.remove(&n);
            }
        }
    })
}

/// Tells the other nodes that node 1 is done, whatever happened (so they do not wait for a
/// failed node 1 until their timeout).
struct Farewell(Vec<u32>);

impl Drop for Farewell {
    fn drop(&mut self) {
        for m in &self.0 {
            let addr = format!("10.10.0.{m}:{CONTROL_PORT}");
            if let Ok(mut s) =
                TcpStream::connect_timeout(&addr.parse().unwrap(), Duration::from_secs(3))
            {
                let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
                let _ = s.write_all(b"done\n");
                let _ = s.read_to_string(&mut String::new());
            }
        }
    }
}

/// `govctl certs init` into `dir`: a coordinator certificate naming every host in `hosts`, one
/// for each node, and `admin`'s.
fn certs_init(hosts: &[String], nodes: &[String], dir: &Path) {
    let mut args: Vec<String> = ["certs", "init", "--admin", "admin"]
        .map(str::to_owned)
        .to_vec();
    for h in hosts {
        args.extend(["--coordinator-host".to_owned(), h.clone()]);
    }
    for name in nodes {
        args.extend(["--node".to_owned(), name.clone()]);
    }
    let out = Command::new(bin("govctl"))
        .args(&args)
        .arg("--dir")
        .arg(dir)
        .output()
        .expect("govctl certs init");
    assert!(
        out.status.success(),
        "govctl certs init: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn coordinator_node(n: u32) {
    timed("start", || ());
    let work = PathBuf::from("/tmp/multinode");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).unwrap();
    let certs = work.join("certs");
    let others: Vec<u32> = (2..=n).collect();
    let node_names: Vec<String> = others.iter().map(|m| format!("node{m}")).collect();
    certs_init(&["10.10.0.1".to_owned()], &node_names, &certs);
    // A preempted (or resized) job must have run 5 s, not a minute, in
    // `preempt_a_job_by_checkpoint` and `resize_an_elastic_job`.
    std::fs::write(
        work.join("coordinator.toml"),
        "[state]\npreempt_min_run_s = 5.0\nresize_min_run_s = 5.0\n",
    )
    .unwrap();
    let certs_server = serve_certs(certs.clone(), others.clone());
    let farewell = Farewell(others.clone());

    let coord_log = work.join("coordinator.log");
    let mut coordinator = spawn("coordinator", &mut coordinator_cmd(&certs), &coord_log);
    let _show = ShowOnPanic(coord_log.clone());
    eprintln!(
        "node1: coordinator started; waiting for {} nodes",
        others.len()
    );
    wait_for("every node to register", 240, || {
        let ready = node_names
            .iter()
            .all(|name| node_status(&certs, name).as_deref() == Some("ready"));
        ready.then_some(())
    });
    certs_server.join().unwrap();
    eprintln!("node1: nodes ready:\n{}", govctl(&certs, &["nodes"]));

    // Round-robin (the start-up policy): the first job goes to node2, the second to node3.
    submit_training(&certs, "alpha");
    submit_training(&certs, "beta");
    let jobs = govctl_json(&certs, &["jobs"]);
    assert_eq!(
        job_node(&jobs, "alpha").unwrap().0,
        "node2",
        "round-robin starts at node2: {jobs}"
    );
    let beta_node = job_node(&jobs, "beta").unwrap().0;
    assert_eq!(
        beta_node,
        if n >= 3 { "node3" } else { "node2" },
        "round-robin: {jobs}"
    );
    // First-fit at run time: the next job goes to node2, the first node by name.
    govctl(&certs, &["policy", "set", "first-fit"]);
    submit_training(&certs, "gamma");
    let jobs = govctl_json(&certs, &["jobs"]);
    assert_eq!(
        job_node(&jobs, "gamma").unwrap().0,
        "node2",
        "first-fit: {jobs}"
    );
    let detail = govctl(&certs, &["job", "j3"]);
    assert!(
        detail.contains("first-fit: node2 is the first node"),
        "{detail}"
    );

    // The jobs run and their categories move as their loss flattens.
    wait_for("jobs running with live categories", 240, || {
        let jobs = govctl_json(&certs, &["jobs"]);
        let all = ["alpha", "beta", "gamma"].iter().all(|name| {
            job_node(&jobs, name).is_some_and(|(_, st, cat)| st == "running" && cat != "unknown")
        });
        all.then_some(())
    });
    let top = govctl(&certs, &["top", "--once"]);
    eprintln!("node1: govctl top --once:\n{top}");
    for name in ["alpha", "beta", "gamma"] {
        assert!(top.contains(name), "top does not show {name}:\n{top}");
    }
    assert!(
        top.contains("progressing") || top.contains("watching") || top.contains("converged"),
        "top shows no live category:\n{top}"
    );
    eprintln!("node1: {}", govctl(&certs, &["job", "j1"]));

    if n >= 3 {
        // Kill node3's governor: node3 is marked lost and its job shows as unknown.
        let reply = request(&format!("10.10.0.3:{CONTROL_PORT}"), "kill-agent", 60);
        assert!(reply.starts_with("killed"), "node3 answered {reply:?}");
        wait_for("node3 to be marked lost", 120, || {
            (node_status(&certs, "node3").as_deref() == Some("lost")).then_some(())
        });
        let jobs = govctl_json(&certs, &["jobs"]);
        assert_eq!(
            job_node(&jobs, "beta").unwrap().1,
            "unknown",
            "beta on lost node3: {jobs}"
        );
        eprintln!(
            "node1: after killing node3's governor:\n{}",
            govctl(&certs, &["top", "--once"])
        );

        // Start it again: it takes beta back from its journal, under beta's id, on the real
        // kernel (beta kept running in its cgroup while no governor watched it).
        let beta_id = job_id(&jobs, "beta");
        assert!(!beta_id.is_empty(), "beta has no id: {jobs}");
        let reply = request(&format!("10.10.0.3:{CONTROL_PORT}"), "start-agent", 60);
        assert!(reply.starts_with("started"), "node3 answered {reply:?}");
        wait_for("beta to run again on node3 under its id", 120, || {
            let jobs = govctl_json(&certs, &["jobs", "--all"]);
            let beta = jobs
                .as_array()?
                .iter()
                .find(|j| j["id"] == beta_id.as_str())?;
            (beta["members"][0]["node"] == "node3" && beta["status"] == "running").then_some(())
        });
        let jobs = govctl_json(&certs, &["jobs", "--all"]);
        let local_betas = jobs
            .as_array()
            .unwrap()
            .iter()
            .filter(|j| {
                j["local"] == true && j["id"].as_str().is_some_and(|id| id.contains("beta"))
            })
            .count();
        assert_eq!(local_betas, 0, "beta also reported as a local job: {jobs}");
        eprintln!(
            "node1: node3's governor restarted:\n{}",
            govctl(&certs, &["top", "--once"])
        );
    }

    // Restart the coordinator abruptly: no job is lost, node2 re-syncs.
    let before = govctl_json(&certs, &["jobs", "--all"]);
    let names = |v: &serde_json::Value| -> Vec<String> {
        let mut n: Vec<String> = v
            .as_array()
            .unwrap()
            .iter()
            .map(|j| format!("{} {}", j["id"], j["name"]))
            .collect();
        n.sort();
        n
    };
    let _ = coordinator.0.kill();
    let _ = coordinator.0.wait();
    eprintln!("node1: coordinator killed; restarting on the same store");
    coordinator = spawn(
        "coordinator",
        &mut coordinator_cmd(&certs),
        &work.join("coordinator-2.log"),
    );
    let _show2 = ShowOnPanic(work.join("coordinator-2.log"));
    let after = wait_for("the restarted coordinator to answer", 60, || {
        let out = Command::new(bin("govctl"))
            .args([
                "--coordinator",
                &format!("127.0.0.1:{COORDINATOR_PORT}"),
                "--certs",
            ])
            .arg(&certs)
            .args(["jobs", "--all", "--json"])
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap())
    });
    assert_eq!(names(&before), names(&after), "the restart lost jobs");
    wait_for("node2 to re-sync and its jobs to run again", 120, || {
        let jobs = govctl_json(&certs, &["jobs"]);
        let ok = ["alpha", "gamma"]
            .iter()
            .all(|name| job_node(&jobs, name).is_some_and(|(_, st, _)| st == "running"));
        ok.then_some(())
    });
    assert_eq!(govctl_json(&certs, &["policy"])["current"], "first-fit");
    eprintln!(
        "node1: after the restart:\n{}",
        govctl(&certs, &["top", "--once"])
    );

    if n >= 3 {
        timed("placement, a lost node, a coordinator restart", || ());
        type Scenario = fn(&Path);
        // Independent jobs, each moved node2 -> node3 (and back), that kill no governor and
        // not the coordinator: they run together (each job its own name, seed, log and
        // checkpoint; the coordinator's fault switch corrupts only `tainted`'s copy, only
        // `homesick`'s wrapper fails on node3). One after the other they took 330 s on this
        // kind of machine and ~530 s on a slow CI day, mostly waiting on the jobs' epochs and
        // the moves' 10 s confirmations. One CRIU job among them: with two CRIU jobs dumped on
        // node2 at once, one of them was once neither moved nor ended for 240 s (2026-11-27,
        // the cause not kept); a node now dumps one job at a time, and two CRIU moves asked
        // together are their own scenario below.
        let together: [(&str, Scenario); 5] = [
            ("criu both ways", move_a_job_by_criu_both_ways),
            ("checkpoint both ways", move_a_job_both_ways),
            ("target cannot run it", move_to_a_target_that_cannot_run_it),
            ("carried checkpoint", move_a_job_without_a_shared_path),
            (
                "checkpoint corrupted at rest",
                move_with_a_checkpoint_corrupted_at_rest,
            ),
        ];
        POLL_MS.store(1500, std::sync::atomic::Ordering::Relaxed);
        thread::scope(|s| {
            for (name, scenario) in together {
                let certs = &certs;
                s.spawn(move || {
                    let started = Instant::now();
                    scenario(certs);
                    eprintln!(
                        "node1: [timing]   {name}: {:.0} s (run together)",
                        started.elapsed().as_secs_f64()
                    );
                });
            }
        });
        POLL_MS.store(500, std::sync::atomic::Ordering::Relaxed);
        timed("five independent moves, together", || ());
        // Two CRIU moves off one node asked together, a CRIU move to a target that cannot
        // restore, then two that kill a node's governor mid-move: each alone.
        let alone: [(&str, Scenario); 4] = [
            (
                "two criu moves off one node at once",
                two_criu_moves_off_one_node_at_once,
            ),
            (
                "criu, target cannot restore",
                move_by_criu_to_a_target_that_cannot_restore_it,
            ),
            ("criu, upload cut", move_by_criu_with_its_upload_cut),
            ("target dies", move_to_a_target_that_dies),
        ];
        for (name, scenario) in alone {
            timed(name, || scenario(&certs));
        }

        // The coordinator killed while a job saves for a move: the restarted one (on the same
        // store) finishes the move.
        let job = submit_movable(&certs, "survivor", 17, None, Saves::Shared);
        wait_few_epochs(&job);
        govctl(&certs, &["move", &job.id, "--to", "node3"]);
        let _ = coordinator.0.kill();
        let _ = coordinator.0.wait();
        eprintln!("node1: coordinator killed mid-move; restarting on the same store");
        coordinator = spawn(
            "coordinator",
            &mut coordinator_cmd(&certs),
            &work.join("coordinator-3.log"),
        );
        let _show3 = ShowOnPanic(work.join("coordinator-3.log"));
        let m = wait_move(&certs, &job.id, "done", "node3");
        eprintln!("node1: moved across a coordinator restart: {m}");
        check_completed_unharmed(&certs, &job);
        timed("a move across a coordinator restart", || ());

        timed("a move a node asks for", || {
            move_automatically_when_a_node_asks(&certs)
        });
        timed("preemption", || preempt_a_job_by_checkpoint(&certs));
        timed("elastic resize", || resize_an_elastic_job(&certs));
        timed("a sweep judged across the nodes", || {
            sweep_across_nodes(&certs)
        });
    }

    std::mem::forget(farewell);
    for m in &others {
        let reply = request(&format!("10.10.0.{m}:{CONTROL_PORT}"), "done", 60);
        assert!(reply.starts_with("bye"), "node{m} answered {reply:?}");
    }
    eprintln!(
        "node1: coordinator log tail:\n{}",
        tail(&work.join("coordinator-2.log"))
    );
    drop(coordinator);
}

/// Run one scenario and say how long it took (and how long since the previous mark), so that
/// the CI log shows where the multi-node test spends its time.
fn timed(name: &str, f: impl FnOnce()) {
    static LAST: std::sync::Mutex<Option<std::time::Instant>> = std::sync::Mutex::new(None);
    f();
    let now = std::time::Instant::now();
    let mut last = LAST.lock().unwrap_or_else(|e| e.into_inner());
    let took = last.map_or(0.0, |t| now.duration_since(t).as_secs_f64());
    *last = Some(now);
    eprintln!("node1: [timing] {name}: {took:.0} s");
}

/// Epochs of a movable job (at least 1 s each): long enough for a move confirmed after the
/// coordinator's `move_confirm_s` (10 s) and what follows it.
const MOVABLE_EPOCHS: u64 = 40;

/// Epochs of a job that must outlive a move and a wait for its target: the target's governor
/// lost, waited for and started again (`move_to_a_target_that_dies`).
const OUTLIVING_EPOCHS: u64 = 64;

/// Epochs of a job moved there and back (two moves, each confirmed after 10 s of running, plus
/// the test's own polling through `govctl`, seconds a call under TCG), while four other moves
/// run beside it. The moves, not the epochs (a second of sleep each), slow down on a busy
/// machine: with 40 a local run saw the job finish on node3 before the return move was asked;
/// alone, a slow CI day asked the return move of a 64-epoch CRIU job 77 s in; run together
/// they were asked 28-31 s in here (2026-11-27). A job that ended before its return move
/// would fail the test.
const RETURN_TRIP_EPOCHS: u64 = 96;

/// How a movable job saves itself.
#[derive(Clone, Copy, PartialEq)]
enum Saves {
    /// A framework checkpoint in the directory every guest shares.
    Shared,
    /// A framework checkpoint in each guest's own /tmp, carried by the coordinator.
    Carried,
    /// Nothing declared: moved by CRIU (its log in the shared directory, its output file in
    /// each guest's own job output directory, carried with the dump).
    Criu,
    /// Like `Criu`, with this many MiB of extra state (a dump that takes a while to carry).
    CriuHeavy(u32),
}

/// A deterministic training job with a framework checkpoint on the guests' shared directory.
struct Movable {
    id: String,
    log: PathBuf,
    /// The epochs of the same run never moved (run here, on node1).
    expected: Vec<(u64, String)>,
}

/// Run `demo-trainer` once here for the reference, then submit the same run as `name` with its
/// checkpoint in the shared directory, or (`carry`) in each guest's own /tmp with the
/// coordinator carrying it (`wrapper`: a shell prologue the job runs first).
fn submit_movable(
    certs: &Path,
    name: &str,
    seed: u32,
    wrapper: Option<&str>,
    saves: Saves,
) -> Movable {
    submit_movable_with(certs, name, seed, wrapper, saves, &[], MOVABLE_EPOCHS)
}

/// [`submit_movable`] with more `govctl submit` options (`--cores 1`, `--priority 5`).
fn submit_movable_with(
    certs: &Path,
    name: &str,
    seed: u32,
    wrapper: Option<&str>,
    saves: Saves,
    options: &[&str],
    epochs: u64,
) -> Movable {
    let carry = saves == Saves::Carried;
    let criu = matches!(saves, Saves::Criu | Saves::CriuHeavy(_));
    let shared = PathBuf::from(
        std::env::var("GOVERNOR_SHARED_DIR")
            .expect("GOVERNOR_SHARED_DIR (the guests' shared run directory)"),
    )
    .join(name);
    let _ = std::fs::remove_dir_all(&shared);
    std::fs::create_dir_all(&shared).unwrap();
    let trainer = bin("demo-trainer");
    let args = |log: &Path| demo_trainer_argv(&trainer, log, epochs, 256, seed);
    let reference = shared.join("reference.csv");
    let a = args(&reference);
    let status = Command::new(&a[0])
        .args(&a[1..])
        .stdout(Stdio::null())
        .status()
        .expect("demo-trainer runs");
    assert!(status.success());
    let expected = keras_epochs(&reference);
    assert_eq!(expected.len() as u64, epochs);

    let log = shared.join("train.csv");
    let ckpt = if carry {
        format!("/tmp/{name}-ckpt")
    } else {
        shared.join("ckpt").display().to_string()
    };
    let mut submit: Vec<String> = [
        "submit",
        "--name",
        name,
        "--log",
        &log.display().to_string(),
    ]
    .map(str::to_owned)
    .to_vec();
    submit.extend(options.iter().map(|o| (*o).to_owned()));
    if !criu {
        submit.extend(["--checkpoint-dir".to_owned(), ckpt.clone()]);
    }
    if carry {
        submit.push("--carry".into());
    }
    submit.push("--".into());
    if let Some(w) = wrapper {
        submit.extend([
            "/bin/sh".into(),
            "-c".into(),
            format!("{w}; exec \"$@\""),
            "sh".into(),
        ]);
    }
    submit.extend(args(&log));
    if !criu {
        submit.extend(["--checkpoint-dir".into(), ckpt]);
    }
    if let Saves::CriuHeavy(mib) = saves {
        submit.extend(["--ballast-mib".into(), mib.to_string()]);
    }
    submit.extend(["--pause-ms".into(), "1000".into()]);
    let out = govctl(
        certs,
        &submit.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let id = out.split_whitespace().next().unwrap_or_default().to_owned();
    assert!(
        out.contains("on node2"),
        "first-fit places {name} on node2: {out}"
    );
    Movable { id, log, expected }
}

/// Wait until the job has logged a few epochs (3): it runs, and a move has something to carry.
fn wait_few_epochs(job: &Movable) {
    wait_for("a few epochs", 240, || {
        (keras_epochs(&job.log).len() >= 3).then_some(())
    });
}

/// The job's current move, once its phase is `phase` (and the job runs on `node`). On a
/// timeout the panic shows the job as last seen (its moves, their phases and messages): the
/// node daemons' logs are not kept.
fn wait_move(certs: &Path, id: &str, phase: &str, node: &str) -> serde_json::Value {
    wait_showing(
        &format!("{id}'s move to be {phase} on {node}"),
        240,
        |seen| {
            // The coordinator may be restarting: not answering yet is not a failure.
            let text = try_govctl(certs, &["job", id, "--json"]).ok()?;
            let d: serde_json::Value = serde_json::from_str(&text).ok()?;
            *seen = d.to_string();
            let m = d["moves"].as_array()?.last()?.clone();
            (m["phase"] == phase && d["summary"]["members"][0]["node"] == node).then_some(m)
        },
    )
}

/// The job completed, and its log holds every epoch once, in order, with the losses of the run
/// that never moved, bit for bit.
fn check_completed_unharmed(certs: &Path, job: &Movable) {
    wait_for(&format!("{} to complete", job.id), 300, || {
        let jobs = govctl_json(certs, &["jobs", "--all"]);
        let j = jobs
            .as_array()?
            .iter()
            .find(|j| j["id"] == job.id.as_str())?
            .clone();
        (j["status"] == "completed").then_some(())
    });
    eprintln!("node1: {}", govctl(certs, &["job", &job.id]));
    let got = keras_epochs(&job.log);
    let numbers: Vec<u64> = got.iter().map(|(e, _)| *e).collect();
    assert_eq!(
        numbers,
        (0..job.expected.len() as u64).collect::<Vec<u64>>(),
        "every epoch once, in order: {got:?}"
    );
    assert_eq!(got, job.expected, "the moved run learnt something else");
}

/// A deterministic training process (`demo-trainer --checkpoint-dir`) moved by its framework
/// checkpoint from node2 to node3 and back, on the directory every guest shares: its log goes
/// on from the epoch it left each time, and its losses equal, bit for bit, those of the same
/// run never moved (run here on node1).
fn move_a_job_both_ways(certs: &Path) {
    let job = submit_movable_with(
        certs,
        "mover",
        11,
        None,
        Saves::Shared,
        &[],
        RETURN_TRIP_EPOCHS,
    );
    let mut at = 0;
    for to in ["node3", "node2"] {
        wait_for("a few more epochs", 240, || {
            (keras_epochs(&job.log).len() >= at + 3).then_some(())
        });
        let said = govctl(certs, &["move", &job.id, "--to", to]);
        eprintln!("node1: {}", said.trim());
        let m = wait_move(certs, &job.id, "done", to);
        eprintln!("node1: moved to {to}: {m}");
        at = keras_epochs(&job.log).len();
    }
    check_completed_unharmed(certs, &job);
}

/// A deterministic training process that declared no checkpoint, moved by CRIU from node2 to
/// node3 and back: its whole process tree is dumped, carried by the coordinator (with the
/// output file it holds open, which is in each guest's own job output directory) and
/// restored; its log goes on from the epoch it left, and its losses equal, bit for bit,
/// those of the same run never moved.
fn move_a_job_by_criu_both_ways(certs: &Path) {
    let job = submit_movable_with(
        certs,
        "dumped",
        23,
        None,
        Saves::Criu,
        &[],
        RETURN_TRIP_EPOCHS,
    );
    let mut at = 0;
    for to in ["node3", "node2"] {
        wait_for("a few more epochs", 240, || {
            (keras_epochs(&job.log).len() >= at + 3).then_some(())
        });
        let said = govctl(certs, &["move", &job.id, "--to", to]);
        eprintln!("node1: {}", said.trim());
        assert!(said.contains("CRIU dump"), "{said}");
        let m = wait_move(certs, &job.id, "done", to);
        eprintln!("node1: moved by CRIU to {to}: {m}");
        assert!(m["bytes"].as_u64().is_some_and(|b| b > 0), "{m}");
        at = keras_epochs(&job.log).len();
    }
    check_completed_unharmed(certs, &job);
}

/// Two jobs that declared no checkpoint, both on node2, moved by CRIU to node3 by two moves
/// asked at the same moment: node2 dumps them one after the other (one CRIU dump at a time on
/// a node), both moves end on node3, and both jobs end unharmed.
fn two_criu_moves_off_one_node_at_once(certs: &Path) {
    let jobs = [
        submit_movable(certs, "pair-a", 37, None, Saves::Criu),
        submit_movable(certs, "pair-b", 41, None, Saves::Criu),
    ];
    for job in &jobs {
        wait_few_epochs(job);
    }
    thread::scope(|s| {
        for job in &jobs {
            s.spawn(move || govctl(certs, &["move", &job.id, "--to", "node3"]));
        }
    });
    for job in &jobs {
        let m = wait_move(certs, &job.id, "done", "node3");
        eprintln!("node1: moved by CRIU with another at once: {m}");
    }
    for job in &jobs {
        check_completed_unharmed(certs, job);
    }
}

/// A job moved by CRIU to a node whose restore fails (node3's criu refuses to restore jobs
/// named `stranded`): the job goes back to node2 from the dump node2 kept, and ends there
/// unharmed.
fn move_by_criu_to_a_target_that_cannot_restore_it(certs: &Path) {
    let job = submit_movable(certs, "stranded", 29, None, Saves::Criu);
    wait_few_epochs(&job);
    govctl(certs, &["move", &job.id, "--to", "node3"]);
    let m = wait_move(certs, &job.id, "rolled_back", "node2");
    eprintln!("node1: rolled back from a failed CRIU restore: {m}");
    assert!(
        m["message"]
            .as_str()
            .is_some_and(|s| s.contains("criu could not restore the job")),
        "{m}"
    );
    check_completed_unharmed(certs, &job);
}

/// A CRIU move whose upload is cut: node2's governor is killed while it carries the dump
/// (16 MiB of extra state, about half a minute of transfer under emulation) and started again; the
/// coordinator asks the restarted one again, which finds the dump on disk, and the move ends
/// on node3 with the job unharmed.
fn move_by_criu_with_its_upload_cut(certs: &Path) {
    let job = submit_movable(certs, "cut", 31, None, Saves::CriuHeavy(16));
    wait_few_epochs(&job);
    govctl(certs, &["move", &job.id, "--to", "node3"]);
    let seen = wait_for("the dump to be under way or carried", 240, || {
        let d: serde_json::Value =
            serde_json::from_str(&try_govctl(certs, &["job", &job.id, "--json"]).ok()?).ok()?;
        let phase = d["moves"].as_array()?.last()?["phase"].as_str()?.to_owned();
        (phase != "saving").then_some(phase)
    });
    if seen == "transferring" {
        let reply = request(&format!("10.10.0.2:{CONTROL_PORT}"), "kill-agent", 60);
        assert!(reply.starts_with("killed"), "node2 answered {reply:?}");
        eprintln!("node1: node2's governor killed while it carried the dump");
        thread::sleep(Duration::from_secs(2));
        let reply = request(&format!("10.10.0.2:{CONTROL_PORT}"), "start-agent", 60);
        assert!(reply.starts_with("started"), "node2 answered {reply:?}");
    } else {
        eprintln!(
            "node1: the dump was carried before it could be cut ({seen}); moved unharmed anyway"
        );
    }
    let m = wait_move(certs, &job.id, "done", "node3");
    eprintln!("node1: moved by CRIU across a cut upload: {m}");
    assert!(m["bytes"].as_u64().is_some_and(|b| b > 16 << 20), "{m}");
    check_completed_unharmed(certs, &job);
}

/// Steps of a converging job: at least 0.75 s each on average (the awk it runs per step takes
/// about that under emulation; a faster machine waits for the clock). Its node asks to move it
/// ~25 s after it starts (steps 30-40); the rest must outlast the move's confirmation (10 s on
/// the target) with room to spare.
const CONVERGING_STEPS: u64 = 90;

/// A shell job that converges (its loss approaches 1, halving its distance each step, step `i`
/// no sooner than `3i/4` whole seconds after its first, [`CONVERGING_STEPS`] steps) and, given
/// `ckpt`, saves its step there on SIGUSR1, exits 0, and resumes from it when started again
/// (checked at the top of the loop, so the step it saves is the last one it logged).
///
/// Paced by the clock because SpeCon judges a job by its loss once per interval (2 s here):
/// it asks to move a job after four falling gains below 1%, all before the loss stops moving
/// at its ninth decimal (step ~32). On a fast machine, unpaced, the steps came every 0.37 s,
/// the loss went flat within a few intervals, the node never asked, and the job completed on
/// node2 (a CI-like run, 2026-11-27).
fn converging_script(log: &Path, ckpt: Option<&Path>) -> String {
    let (resume, save) = match ckpt {
        Some(dir) => (
            format!(
                "mkdir -p {d}; i=$(cat {d}/step 2>/dev/null || echo 0); stop=; trap 'stop=1' USR1; ",
                d = dir.display()
            ),
            format!(
                "if [ -n \"$stop\" ]; then echo $i > {d}/step; exit 0; fi; ",
                d = dir.display()
            ),
        ),
        None => ("i=0; ".to_owned(), String::new()),
    };
    format!(
        "{resume}t0=$(( $(date +%s) - i * 3 / 4 )); \
         while [ $i -lt {CONVERGING_STEPS} ]; do {save}i=$((i+1)); \
         while [ $(date +%s) -lt $(( t0 + i * 3 / 4 )) ]; do sleep 0.1; done; \
         l=$(awk -v i=$i 'BEGIN {{ printf \"%.9f\", 1 + 3 * 0.5 ^ i }}'); \
         echo \"step $i loss=$l\" >> {log}; sleep 0.25; done",
        log = log.display()
    )
}

/// The steps a converging job logged, in the order they are in its log.
fn logged_steps(log: &Path) -> Vec<u64> {
    std::fs::read_to_string(log)
        .unwrap()
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1)?.parse().ok())
        .collect()
}

/// Submit a job that keeps learning on a whole core (demo-trainer, no pauses), reserving
/// `cores`; it is placed on `node`.
fn submit_eager(certs: &Path, name: &str, cores: &str, node: &str) {
    let shared = PathBuf::from(std::env::var("GOVERNOR_SHARED_DIR").unwrap());
    let trainer = bin("demo-trainer");
    let log = shared.join(format!("{name}.csv"));
    let mut submit: Vec<String> = ["submit", "--name", name, "--cores", cores, "--log"]
        .map(str::to_owned)
        .to_vec();
    submit.push(log.display().to_string());
    submit.push("--".into());
    submit.extend(demo_trainer_argv(&trainer, &log, 100_000, 4096, 41));
    let out = govctl(
        certs,
        &submit.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    assert!(
        out.contains(&format!("on {node}")),
        "{name} placed on {node}: {out}"
    );
}

/// SpeCon end to end, both ways and with both kinds of save. Node2's policy turns to `specon`
/// (30 s intervals shortened to 2 s); beside a job that keeps learning and takes node2's core,
/// a job converges; node2 asks to move the converged one and the coordinator (Algorithm 2, once
/// the request has stood 10 s and the move pays: node2 is saturated, node3 idle) moves it to
/// node3, by CRIU since it declared nothing. Then the same on node3 the other way: a converging
/// job with a framework checkpoint beside a learning one on node3, node2 freed, and node3's
/// request moves it to node2 by its checkpoint. Each log, in the shared directory, holds every
/// step once, in order.
fn move_automatically_when_a_node_asks(certs: &Path) {
    for name in ["alpha", "beta", "gamma"] {
        let jobs = govctl_json(certs, &["jobs"]);
        let id = job_id(&jobs, name);
        if !id.is_empty() {
            let _ = try_govctl(certs, &["cancel", &id]);
        }
    }
    let reply = request(&format!("10.10.0.2:{CONTROL_PORT}"), "policy specon", 60);
    assert!(reply.starts_with("specon"), "node2 answered {reply:?}");
    let shared = PathBuf::from(std::env::var("GOVERNOR_SHARED_DIR").unwrap());
    // Learning all along, on node2's whole core (reserved: later jobs that reserve cores go to
    // node3).
    submit_eager(certs, "eager", "1", "node2");
    let log = shared.join("settled.log");
    let _ = std::fs::remove_file(&log);
    let script = converging_script(&log, None);
    let out = govctl(
        certs,
        &[
            "submit",
            "--name",
            "settled",
            "--log",
            &log.display().to_string(),
            "--",
            "/bin/sh",
            "-c",
            &script,
        ],
    );
    assert!(
        out.contains("on node2"),
        "first-fit places settled on node2: {out}"
    );
    let id = out.split_whitespace().next().unwrap_or_default().to_owned();
    let m = wait_move(certs, &id, "done", "node3");
    eprintln!("node1: moved on node2's request: {m}");
    let reason = m["reason"].as_str().unwrap_or_default();
    assert!(reason.starts_with("node node2 asks"), "{m}");
    assert!(reason.contains("pays:"), "{m}");
    wait_for("settled to complete on node3", 240, || {
        let jobs = govctl_json(certs, &["jobs", "--all"]);
        job_node(&jobs, "settled").filter(|(node, st, _)| node == "node3" && st == "completed")
    });
    assert_eq!(
        logged_steps(&log),
        (1..=CONVERGING_STEPS).collect::<Vec<u64>>(),
        "every step once, in order"
    );

    // The other way, by a framework checkpoint: node2 is full (eager reserved its core), so
    // both jobs go to node3, whose policy turns to specon too; then node2 is freed.
    let reply = request(&format!("10.10.0.3:{CONTROL_PORT}"), "policy specon", 60);
    assert!(reply.starts_with("specon"), "node3 answered {reply:?}");
    submit_eager(certs, "eager2", "0.5", "node3");
    let log = shared.join("settled2.log");
    let ckpt = shared.join("settled2-ckpt");
    let _ = std::fs::remove_file(&log);
    let _ = std::fs::remove_dir_all(&ckpt);
    let script = converging_script(&log, Some(&ckpt));
    let out = govctl(
        certs,
        &[
            "submit",
            "--name",
            "settled2",
            "--cores",
            "0.5",
            "--checkpoint-dir",
            &ckpt.display().to_string(),
            "--log",
            &log.display().to_string(),
            "--",
            "/bin/sh",
            "-c",
            &script,
        ],
    );
    assert!(
        out.contains("on node3"),
        "first-fit places settled2 on node3 (node2 is full): {out}"
    );
    let id = out.split_whitespace().next().unwrap_or_default().to_owned();
    let jobs = govctl_json(certs, &["jobs"]);
    govctl(certs, &["cancel", &job_id(&jobs, "eager")]);
    let m = wait_move(certs, &id, "done", "node2");
    eprintln!("node1: moved on node3's request: {m}");
    let reason = m["reason"].as_str().unwrap_or_default();
    assert!(reason.starts_with("node node3 asks"), "{m}");
    assert!(reason.contains("pays:"), "{m}");
    wait_for("settled2 to complete on node2", 240, || {
        let jobs = govctl_json(certs, &["jobs", "--all"]);
        job_node(&jobs, "settled2").filter(|(node, st, _)| node == "node2" && st == "completed")
    });
    assert_eq!(
        logged_steps(&log),
        (1..=CONVERGING_STEPS).collect::<Vec<u64>>(),
        "every step once, in order, across the move"
    );
    let jobs = govctl_json(certs, &["jobs"]);
    let _ = try_govctl(certs, &["cancel", &job_id(&jobs, "eager2")]);
}

/// Preemption without loss: `low` (priority 0) fills node2's core and `filler` (priority 5,
/// no checkpoint) node3's; `urgent` (priority 10) fits nowhere. Once `low` has run the
/// coordinator's minimum (5 s here), the coordinator saves it by its checkpoint (the lowest
/// priority displaced), requeues it at the head of its priority and starts `urgent` on node2;
/// when `urgent` completes, `low` resumes there and finishes with every epoch once and the
/// losses of a run never preempted, bit for bit.
fn preempt_a_job_by_checkpoint(certs: &Path) {
    let job = submit_movable_with(
        certs,
        "low",
        43,
        None,
        Saves::Shared,
        &["--cores", "1"],
        MOVABLE_EPOCHS,
    );
    let shared = PathBuf::from(std::env::var("GOVERNOR_SHARED_DIR").unwrap());
    let filler_log = shared.join("filler.log");
    let out = govctl(
        certs,
        &[
            "submit",
            "--name",
            "filler",
            "--cores",
            "1",
            "--priority",
            "5",
            "--log",
            &filler_log.display().to_string(),
            "--",
            "/bin/sh",
            "-c",
            &format!(
                "while :; do echo 'step 1 loss=1.0' >> {}; sleep 1; done",
                filler_log.display()
            ),
        ],
    );
    assert!(out.contains("on node3"), "filler goes to node3: {out}");
    wait_for("a few epochs of low", 240, || {
        (keras_epochs(&job.log).len() >= 3).then_some(())
    });
    let urgent_log = shared.join("urgent.log");
    let _ = std::fs::remove_file(&urgent_log);
    let out = govctl(
        certs,
        &[
            "submit",
            "--name",
            "urgent",
            "--cores",
            "1",
            "--priority",
            "10",
            "--log",
            &urgent_log.display().to_string(),
            "--",
            "/bin/sh",
            "-c",
            &format!(
                "i=0; while [ $i -lt 20 ]; do i=$((i+1)); echo \"step $i loss=$((100 / i))\" >> {}; sleep 0.25; done",
                urgent_log.display()
            ),
        ],
    );
    let urgent = out.split_whitespace().next().unwrap_or_default().to_owned();
    let m = wait_for("low to be preempted for urgent", 240, || {
        let d: serde_json::Value =
            serde_json::from_str(&try_govctl(certs, &["job", &job.id, "--json"]).ok()?).ok()?;
        let m = d["moves"].as_array()?.last()?.clone();
        (m["preempted_for"] == urgent.as_str() && m["phase"] != "saving").then_some(m)
    });
    eprintln!("node1: low preempted: {m}");
    wait_for("urgent to complete on node2", 240, || {
        let jobs = govctl_json(certs, &["jobs", "--all"]);
        job_node(&jobs, "urgent").filter(|(node, st, _)| node == "node2" && st == "completed")
    });
    let m = wait_move(certs, &job.id, "done", "node2");
    eprintln!("node1: low resumed after the preemption: {m}");
    let detail = govctl(certs, &["job", &job.id]);
    assert!(
        detail.contains(&format!(
            "preempted:  on node2 for {urgent}, resumed on node2: done"
        )),
        "{detail}"
    );
    check_completed_unharmed(certs, &job);
    let jobs = govctl_json(certs, &["jobs"]);
    let _ = try_govctl(certs, &["cancel", &job_id(&jobs, "filler")]);
}

/// A shell job that logs `steps` steps (`None`: forever), one each `period` seconds.
fn submit_shell(
    certs: &Path,
    name: &str,
    options: &[&str],
    steps: Option<u32>,
    period: &str,
) -> String {
    let shared = PathBuf::from(std::env::var("GOVERNOR_SHARED_DIR").unwrap());
    let log = shared.join(format!("{name}.log"));
    let _ = std::fs::remove_file(&log);
    let limit = steps.map_or(String::from("true"), |n| format!("[ $i -lt {n} ]"));
    let script = format!(
        "i=0; while {limit}; do i=$((i+1)); echo \"step $i loss=$((100 / i))\" >> {}; sleep {period}; done",
        log.display()
    );
    let mut args = vec!["submit", "--name", name];
    args.extend_from_slice(options);
    let log_arg = log.display().to_string();
    args.extend(["--log", &log_arg, "--", "/bin/sh", "-c", &script]);
    govctl(certs, &args)
}

/// An elastic job under the Kubeflow policy (1-core guests, sizes in halves): `elastic`
/// (`--cores 0.5:1`) starts at 0.5 beside a 0.5-core job on node2 while a 1-core filler holds
/// node3; when that job ends (cancelled) it grows to 1 (scale-up into the freed half); a
/// priority-10 job that fits nowhere then makes it shrink back to 0.5 (scale-down) rather than
/// displacing anyone. Each resize is a save and a start again at the new size
/// (GOVERNOR_CORES, recorded by the job's prologue); its log goes on across the sizes and ends
/// with the losses of a run never resized, bit for bit.
fn resize_an_elastic_job(certs: &Path) {
    govctl(certs, &["policy", "set", "kubeflow"]);
    let out = submit_shell(certs, "neighbour", &["--cores", "0.5"], None, "1");
    assert!(out.contains("on node2"), "neighbour goes to node2: {out}");
    let neighbour = out.split_whitespace().next().unwrap_or_default().to_owned();
    let out = submit_shell(certs, "holder", &["--cores", "1"], None, "1");
    assert!(out.contains("on node3"), "holder goes to node3: {out}");
    let shared = PathBuf::from(std::env::var("GOVERNOR_SHARED_DIR").unwrap());
    let sizes = shared.join("elastic-sizes.txt");
    let _ = std::fs::remove_file(&sizes);
    let prologue = format!("echo \"$GOVERNOR_CORES\" >> {}", sizes.display());
    let job = submit_movable_with(
        certs,
        "elastic",
        53,
        Some(&prologue),
        Saves::Shared,
        &["--cores", "0.5:1"],
        // Two resizes, each a save and a start again, then the test's own polling: with 40
        // epochs a loaded CI run saw the job end before its shrink was saved (2026-11-28).
        RETURN_TRIP_EPOCHS,
    );
    let size_of = |d: &serde_json::Value| d["summary"]["cores"].as_f64();
    wait_for("a few epochs of elastic at its least size", 240, || {
        (keras_epochs(&job.log).len() >= 3).then_some(())
    });
    govctl(certs, &["cancel", &neighbour]);
    let grown = wait_for("elastic to grow into the freed half core", 240, || {
        let d: serde_json::Value =
            serde_json::from_str(&try_govctl(certs, &["job", &job.id, "--json"]).ok()?).ok()?;
        let m = d["moves"].as_array()?.last()?.clone();
        (m["to_cores"].as_f64() == Some(1.0) && m["phase"] == "done").then_some(d)
    });
    assert_eq!(size_of(&grown), Some(1.0), "{grown}");
    let out = submit_shell(
        certs,
        "urgent-e",
        &["--cores", "0.5", "--priority", "10"],
        Some(12),
        "0.25",
    );
    let urgent = out.split_whitespace().next().unwrap_or_default().to_owned();
    let shrunk = wait_for("elastic to shrink for the urgent job", 240, || {
        let d: serde_json::Value =
            serde_json::from_str(&try_govctl(certs, &["job", &job.id, "--json"]).ok()?).ok()?;
        let m = d["moves"].as_array()?.last()?.clone();
        (m["resized_for"] == urgent.as_str() && m["phase"] != "saving").then_some(m)
    });
    eprintln!("node1: elastic shrunk for {urgent}: {shrunk}");
    wait_for("urgent-e to complete on node2", 240, || {
        let jobs = govctl_json(certs, &["jobs", "--all"]);
        job_node(&jobs, "urgent-e").filter(|(node, st, _)| node == "node2" && st == "completed")
    });
    check_completed_unharmed(certs, &job);
    let detail = govctl(certs, &["job", &job.id]);
    assert!(
        detail.contains("resized:    0.5 -> 1 cores on node2: done"),
        "{detail}"
    );
    assert!(
        detail.contains(&format!(
            "resized:    1 -> 0.5 cores on node2 to make room for {urgent}: done"
        )),
        "{detail}"
    );
    let started_with: Vec<String> = std::fs::read_to_string(&sizes)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    assert!(
        started_with.starts_with(&["0.5".into(), "1".into(), "0.5".into()]),
        "each start is told its size: {started_with:?}"
    );
    // Nothing was displaced: the holder ran throughout on node3.
    let jobs = govctl_json(certs, &["jobs"]);
    assert_eq!(
        job_node(&jobs, "holder").map(|(n, st, _)| (n, st)),
        Some(("node3".to_owned(), "running".to_owned()))
    );
    let _ = try_govctl(certs, &["cancel", &job_id(&jobs, "holder")]);
    govctl(certs, &["policy", "set", "first-fit"]);
}

/// A job whose checkpoint is in each guest's own /tmp (no shared path): the coordinator carries
/// it from node2 to node3, checksummed, and the job resumes from it there.
fn move_a_job_without_a_shared_path(certs: &Path) {
    let job = submit_movable(certs, "carried", 19, None, Saves::Carried);
    wait_few_epochs(&job);
    let said = govctl(certs, &["move", &job.id, "--to", "node3"]);
    assert!(said.contains("carried by the coordinator"), "{said}");
    let m = wait_move(certs, &job.id, "done", "node3");
    eprintln!("node1: carried to node3: {m}");
    assert!(m["bytes"].as_u64().is_some_and(|b| b > 0), "{m}");
    check_completed_unharmed(certs, &job);
}

/// A carried checkpoint that changes on the coordinator after it arrived intact (one byte
/// flipped by the coordinator's fault switch, as a failing disk would): node3 checks it against
/// the sum node2 computed when it saved it, refuses to start the job, and the job goes back to
/// node2 from the checkpoint node2 kept, and ends there unharmed.
fn move_with_a_checkpoint_corrupted_at_rest(certs: &Path) {
    let job = submit_movable(certs, "tainted", 37, None, Saves::Carried);
    wait_few_epochs(&job);
    govctl(certs, &["move", &job.id, "--to", "node3"]);
    let m = wait_move(certs, &job.id, "rolled_back", "node2");
    eprintln!("node1: rolled back from a corrupted checkpoint: {m}");
    assert!(
        m["message"]
            .as_str()
            .is_some_and(|s| s.contains("checksum mismatch")),
        "{m}"
    );
    check_completed_unharmed(certs, &job);
}

/// The target dies mid-move, after it started the job: node3's governor is killed (SIGKILL)
/// the moment the job's process appears there, so the job runs on without it. node3 is marked
/// lost; the coordinator does not start the job again on node2 (it would run twice, both
/// copies writing one checkpoint directory) but waits for node3 (`lost_target_wait_s`), whose
/// governor, started again, takes the job back from its journal: the move is done and every
/// epoch was run once. (A target lost before it was sent the start, or not back within the
/// wait, hands the job back to its source: the coordinator's unit tests.)
fn move_to_a_target_that_dies(certs: &Path) {
    // Long enough to outlive node3's governor being lost, waited for and started again.
    let job = submit_movable_with(
        certs,
        "orphan",
        47,
        None,
        Saves::Shared,
        &[],
        OUTLIVING_EPOCHS,
    );
    wait_few_epochs(&job);
    let node3 = format!("10.10.0.3:{CONTROL_PORT}");
    let reply = request(
        &node3,
        &format!("kill-agent-when-running {}", job.log.display()),
        60,
    );
    assert!(reply.starts_with("armed"), "node3 answered {reply:?}");
    govctl(certs, &["move", &job.id, "--to", "node3"]);
    wait_for("node3 to be lost", 240, || {
        (node_status(certs, "node3").as_deref() == Some("lost")).then_some(())
    });
    let m = wait_for("the move to wait for node3", 60, || {
        let m = wait_move(certs, &job.id, "restoring", "node3");
        m["message"]
            .as_str()
            .is_some_and(|s| s.contains("waiting up to"))
            .then_some(m)
    });
    eprintln!("node1: waiting for a target that died after it started the job: {m}");
    // The job runs on node3 meanwhile (its epochs go on), and nowhere else.
    let epochs = keras_epochs(&job.log).len();
    wait_for("the job to go on without node3's governor", 60, || {
        (keras_epochs(&job.log).len() > epochs + 1).then_some(())
    });
    let m = wait_move(certs, &job.id, "restoring", "node3");
    assert!(m["saved_at_unix"].is_number(), "{m}");
    let reply = request(&node3, "start-agent", 60);
    assert!(reply.starts_with("started"), "node3 answered {reply:?}");
    let m = wait_move(certs, &job.id, "done", "node3");
    eprintln!("node1: the target came back with the job: {m}");
    check_completed_unharmed(certs, &job);
}

/// A target that cannot run the job (its restore fails: it exits 3 on node3): the job goes
/// back to node2 from its checkpoint and ends there, unharmed.
fn move_to_a_target_that_cannot_run_it(certs: &Path) {
    let job = submit_movable(
        certs,
        "homesick",
        13,
        Some("if [ \"$GOVERNOR_NODE\" = 3 ]; then echo cannot restore here >&2; exit 3; fi"),
        Saves::Shared,
    );
    wait_few_epochs(&job);
    govctl(certs, &["move", &job.id, "--to", "node3"]);
    let m = wait_move(certs, &job.id, "rolled_back", "node2");
    eprintln!("node1: rolled back: {m}");
    assert!(
        m["message"]
            .as_str()
            .is_some_and(|s| s.contains("target node3 could not run it")),
        "{m}"
    );
    check_completed_unharmed(certs, &job);
}

/// The pid of a process (not this one) whose command line contains `marker`.
fn process_naming(marker: &str) -> Option<u32> {
    let me = std::process::id();
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
        (pid != me && String::from_utf8_lossy(&cmdline).contains(marker)).then_some(pid)
    })
}

fn worker_node(me: u32) {
    let work = PathBuf::from("/tmp/multinode");
    let _ = std::fs::remove_dir_all(&work);
    let certs = work.join("certs");
    std::fs::create_dir_all(&certs).unwrap();
    let bundle = request(
        &format!("10.10.0.1:{CERTS_PORT}"),
        &format!("certs node{me}"),
        300,
    );
    let bundle: serde_json::Value = serde_json::from_str(&bundle).expect("certificate bundle");
    std::fs::write(certs.join("ca.pem"), bundle["ca"].as_str().unwrap()).unwrap();
    std::fs::write(
        certs.join(format!("node{me}.pem")),
        bundle["cert"].as_str().unwrap(),
    )
    .unwrap();
    std::fs::write(
        certs.join(format!("node{me}-key.pem")),
        bundle["key"].as_str().unwrap(),
    )
    .unwrap();
    let log = work.join("node.log");
    let mut daemon = Some(spawn("node daemon", &mut node_daemon_cmd(me, &certs), &log));
    let _show = ShowOnPanic(log.clone());
    eprintln!("node{me}: node daemon started");
    let listener = TcpListener::bind(("0.0.0.0", CONTROL_PORT)).expect("bind the control port");
    // Set once node1 asked for the daemon to be killed when a job starts (its exit is expected).
    let mut killed_on_request = false;
    // node1's scenarios take 17-25 minutes under emulation (`cargo xtask test` gives the
    // guests 45).
    let deadline = Instant::now() + Duration::from_secs(2400);
    listener.set_nonblocking(true).unwrap();
    loop {
        assert!(
            Instant::now() < deadline,
            "node{me}: node1 never said done; daemon log:\n{}",
            tail(&log)
        );
        let (s, _) = match listener.accept() {
            Ok(c) => c,
            Err(_) => {
                if let Some(d) = daemon.as_mut()
                    && let Ok(Some(status)) = d.0.try_wait()
                {
                    if killed_on_request {
                        daemon = None;
                        continue;
                    }
                    panic!(
                        "node{me}: the node daemon exited ({status}):\n{}",
                        tail(&log)
                    );
                }
                thread::sleep(Duration::from_millis(200));
                continue;
            }
        };
        s.set_nonblocking(false).unwrap();
        let mut line = String::new();
        let _ = std::io::BufReader::new(s.try_clone().unwrap()).read_line(&mut line);
        let mut s = s;
        match line.trim() {
            "kill-agent" => {
                if let Some(mut d) = daemon.take() {
                    let _ = d.0.kill(); // SIGKILL: no goodbye to the coordinator
                    let _ = d.0.wait();
                }
                let _ = s.write_all(b"killed");
                eprintln!("node{me}: node daemon killed on node1's request");
            }
            request if request.starts_with("kill-agent-when-running ") => {
                // SIGKILL the daemon the moment a job whose command line names `marker` runs
                // here and is in its journal (written as the job starts; a restarted daemon
                // takes back what it lists): the job runs on without its governor.
                let marker = request["kill-agent-when-running ".len()..].to_owned();
                let pid = daemon.as_ref().map(|d| d.0.id());
                killed_on_request = true;
                thread::spawn(move || {
                    let Some(pid) = pid else { return };
                    let deadline = Instant::now() + Duration::from_secs(600);
                    while Instant::now() < deadline {
                        let journaled =
                            std::fs::read_to_string("/run/governor/coordinator-jobs.json")
                                .is_ok_and(|j| j.contains(&marker));
                        if let Some(job) = process_naming(&marker).filter(|_| journaled) {
                            let _ = Command::new("kill")
                                .args(["-KILL", &pid.to_string()])
                                .status();
                            eprintln!("node{me}: node daemon killed as job process {job} started");
                            return;
                        }
                        thread::sleep(Duration::from_millis(50));
                    }
                });
                let _ = s.write_all(b"armed");
            }
            "policy specon" => {
                // SpeCon's node policy asks to move converged jobs while others progress.
                std::fs::write(
                    "/tmp/multinode/governor.toml",
                    format!("policy = \"specon:interval=2:min_learning_others=1\"\n{ROOT_JOBS}"),
                )
                .unwrap();
                if let Some(d) = &daemon {
                    let _ = Command::new("kill")
                        .args(["-HUP", &d.0.id().to_string()])
                        .status();
                }
                let _ = s.write_all(b"specon");
                eprintln!("node{me}: node policy set to specon");
            }
            "start-agent" => {
                // A daemon killed on request may not have been reaped by the loop yet.
                if daemon
                    .as_mut()
                    .is_none_or(|d| d.0.try_wait().is_ok_and(|s| s.is_some()))
                {
                    daemon = Some(spawn("node daemon", &mut node_daemon_cmd(me, &certs), &log));
                }
                let _ = s.write_all(b"started");
                eprintln!("node{me}: node daemon started again on node1's request");
            }
            "done" => {
                let _ = s.write_all(b"bye");
                eprintln!("node{me}: done; daemon log tail:\n{}", tail(&log));
                return;
            }
            other => {
                let _ = s.write_all(format!("unknown request {other:?}").as_bytes());
            }
        }
    }
}

/// Learning rates of the sweep across the nodes: two that learn (0.05 is `demo-trainer`'s
/// default; 0.2 ends lowest with seed 7, 0.331 against 0.354 after 20 epochs) and two too small
/// to learn much in the run (0.670 and 0.636).
const SWEEP_GOOD_LRS: [&str; 2] = ["0.05", "0.2"];
const SWEEP_POOR_LRS: [&str; 2] = ["0.0003", "0.001"];
const SWEEP_BEST: &str = "sweep-lr0.2";

/// A sweep across the cluster (issue 32): four trials of one real model (`demo-trainer`),
/// submitted with `govctl submit --sweep lr:3:2 --epochs 20` and placed round-robin on node2
/// and node3. The coordinator judges them together, whatever node each runs on, as each reaches
/// a rung (2, 6, 18 epochs; asynchronous successive halving ranked by predicted final loss). The
/// two that learn are submitted first, a few epochs ahead, so they reach the rungs first (ASHA
/// lets the first arrivals at a rung go on); the two whose learning rates are too small to learn
/// are then confidently worse: each is stopped on its node, counted completed and reported
/// "stopped: outranked in its sweep", ranked among trials of both nodes. The best trial runs
/// to its end and no trial fails. Each trial logs to its node's own /tmp (what a node follows
/// there is what the coordinator sees).
fn sweep_across_nodes(certs: &Path) {
    govctl(certs, &["policy", "set", "round-robin"]);
    let trainer = bin("demo-trainer");
    let submit = |lr: &str| {
        let name = format!("sweep-lr{lr}");
        let log = PathBuf::from(format!("/tmp/{name}.csv"));
        let mut args: Vec<String> = [
            "submit", "--name", &name, "--sweep", "lr:3:2", "--epochs", "20", "--log",
        ]
        .map(str::to_owned)
        .to_vec();
        args.push(log.display().to_string());
        args.push("--".into());
        args.extend(demo_trainer_argv(&trainer, &log, 20, 2048, 7));
        // 1.5 s an epoch: the coordinator sees a trial's epochs in its node's reports (about
        // one a second), and needs three values before a rung to extrapolate a curve.
        args.extend([
            "--lr".into(),
            lr.to_owned(),
            "--pause-ms".into(),
            "1500".into(),
        ]);
        let out = govctl(certs, &args.iter().map(String::as_str).collect::<Vec<_>>());
        eprintln!("node1: submitted {name}: {}", out.trim());
        name
    };
    let trial = |jobs: &serde_json::Value, name: &str| -> Option<serde_json::Value> {
        jobs.as_array()?
            .iter()
            .find(|j| j["name"] == name && j["local"] != true)
            .cloned()
    };
    let good: Vec<String> = SWEEP_GOOD_LRS.iter().map(|lr| submit(lr)).collect();
    wait_for("the learning trials' first epochs", 240, || {
        let jobs = govctl_json(certs, &["jobs"]);
        good.iter()
            .all(|n| trial(&jobs, n).is_some_and(|j| !j["progress"].is_null()))
            .then_some(())
    });
    thread::sleep(Duration::from_secs(3));
    let poor: Vec<String> = SWEEP_POOR_LRS.iter().map(|lr| submit(lr)).collect();
    let names: Vec<&String> = good.iter().chain(&poor).collect();
    let ended = wait_showing("every trial of the sweep to end", 900, |shown| {
        let jobs = govctl_json(certs, &["jobs", "--all"]);
        *shown = jobs.to_string();
        let trials: Vec<serde_json::Value> = names.iter().filter_map(|n| trial(&jobs, n)).collect();
        let done = trials.len() == names.len()
            && trials.iter().all(|j| {
                matches!(
                    j["status"].as_str(),
                    Some("completed" | "failed" | "cancelled")
                )
            });
        done.then_some(trials)
    });
    eprintln!("node1: the sweep's trials: {ended:#?}");
    let node_of = |j: &serde_json::Value| j["members"][0]["node"].as_str().unwrap_or("").to_owned();
    let nodes: std::collections::BTreeSet<String> = ended.iter().map(node_of).collect();
    assert_eq!(
        nodes.len(),
        2,
        "the trials ran on node2 and node3: {ended:#?}"
    );
    for j in &ended {
        assert_eq!(j["status"], "completed", "no trial fails: {j:#}");
    }
    let message = |name: &str| -> String {
        ended
            .iter()
            .find(|j| j["name"] == name)
            .and_then(|j| j["message"].as_str())
            .unwrap_or_default()
            .to_owned()
    };
    for name in &poor {
        let why = message(name);
        assert!(
            why.starts_with("stopped: outranked in its sweep"),
            "{name} is cut by the coordinator: {why:?}"
        );
    }
    // Ranked across the nodes: some cut trial was ranked among more results than its own node
    // ran trials ("..., 3 of 4; the best ...").
    let across = poor.iter().any(|name| {
        let why = message(name);
        let its_node = ended
            .iter()
            .find(|k| k["name"] == name.as_str())
            .map(node_of)
            .unwrap_or_default();
        let own = ended.iter().filter(|j| node_of(j) == its_node).count();
        why.split(", ")
            .find_map(|part| {
                let (_, of) = part.split_once(" of ")?;
                of.split(';').next()?.trim().parse::<usize>().ok()
            })
            .is_some_and(|of| of > own)
    });
    assert!(
        across,
        "no cut was ranked against the other node's trials: {ended:#?}"
    );
    assert!(
        message(SWEEP_BEST).is_empty(),
        "the best trial ran to its end: {:?}",
        message(SWEEP_BEST)
    );
}

/// Node 1 runs the coordinator, the others the node side: jobs submitted with govctl land where
/// the policy says, `govctl top` shows their live categories, a killed node daemon's node is
/// marked lost and, started again, the daemon takes its running job back under the job's id,
/// a coordinator killed and restarted loses no job, and (3 nodes) `govctl move` moves a
/// running job by its framework checkpoint to node3 and back without losing an epoch, and a
/// sweep's trials on node2 and node3 are judged together by the coordinator.
#[test]
#[ignore = "vm: needs the multi-node bed; run with `cargo xtask vm-test --nodes 3`"]
fn multinode_coordinator_places_tracks_and_survives() {
    require_vm();
    let (me, n) = node_env();
    assert!(n >= 2, "the coordinator scenario needs at least 2 nodes");
    if me == 1 {
        coordinator_node(n);
    } else {
        worker_node(me);
    }
}

// ---------------------------------------------------------------------------------------------
// The replicated control plane on the nodes (issue 34): every node runs an etcd member and a
// coordinator replica on its state, node2 and node3 run the node daemon given every replica's
// address, and node1 drives govctl (also given every address). The nodes coordinate through
// files in the directory every guest shares, under `replicas/`: `certs/` and `certs.ready`
// (node1's), `kill-replica-N` (node1 asks node N to kill its replica), `killed-replica-N`,
// `done`, and `seen-nodeN` (where node N saw the job's process).
// ---------------------------------------------------------------------------------------------

const REPLICA_PORT: u16 = 7080;
/// The job moved across the leader's death; its log's path names its process.
const REPLICATED_JOB: &str = "replicated";

fn replicas_shared() -> PathBuf {
    PathBuf::from(std::env::var("GOVERNOR_SHARED_DIR").expect("GOVERNOR_SHARED_DIR"))
        .join("replicas")
}

/// Wait for `path` to exist (written by another node), up to `timeout_s`.
fn wait_file(path: &Path, timeout_s: u64) {
    wait_for(&format!("{} to appear", path.display()), timeout_s, || {
        path.exists().then_some(())
    });
}

/// This node's etcd member of the three-member cluster on 10.10.0.1..3 (plain http on the test
/// segment; mutual TLS to etcd is tested on loopback, `cluster_replicas.rs`). Elections are
/// slowed for the emulated guests (one vCPU each, shared with a replica, a node daemon and jobs).
fn etcd_member_cmd(me: u32, n: u32, work: &Path) -> Command {
    let etcd = governor_integration_tests::tool(&["etcd"])
        .expect("etcd is installed (`cargo xtask setup` installs Debian's etcd-server)");
    let initial: Vec<String> = (1..=n)
        .map(|k| format!("m{k}=http://10.10.0.{k}:2380"))
        .collect();
    let mut c = Command::new(etcd);
    c.args(["--name", &format!("m{me}")])
        .arg("--data-dir")
        .arg(work.join("etcd"))
        .arg("--listen-client-urls=http://0.0.0.0:2379")
        .arg(format!("--advertise-client-urls=http://10.10.0.{me}:2379"))
        .arg(format!("--listen-peer-urls=http://10.10.0.{me}:2380"))
        .arg(format!(
            "--initial-advertise-peer-urls=http://10.10.0.{me}:2380"
        ))
        .arg(format!("--initial-cluster={}", initial.join(",")))
        .args([
            "--initial-cluster-state=new",
            "--initial-cluster-token=governor-vm",
            "--heartbeat-interval=250",
            "--election-timeout=2500",
            "--logger=zap",
            "--log-level=warn",
        ]);
    c
}

/// This node's coordinator replica (the binary, [`Replica`]): the etcd backend on the three
/// members, a 5 s lease; its configuration and log beside the certificates in `certs`.
fn start_replica(n: u32, certs: &Path) -> Replica {
    let etcd = EtcdConfig {
        endpoints: (1..=n)
            .map(|k| format!("http://10.10.0.{k}:2379"))
            .collect(),
        prefix: "/governor-vm".into(),
        lease_ttl_s: 5,
        request_timeout_ms: 3000,
        ..EtcdConfig::default()
    };
    let listen = std::net::SocketAddr::from(([0, 0, 0, 0], REPLICA_PORT));
    Replica::start(certs, "replica", listen, &etcd, "")
}

/// The node daemon joined to every replica, its state (journal included) in `work`, not in
/// /run/governor where the redb scenario's daemon left its own.
fn replicated_node_cmd(me: u32, n: u32, work: &Path, certs: &Path) -> Command {
    let config = work.join("governor.toml");
    std::fs::write(
        &config,
        format!(
            "state_file = \"{}/run/state.json\"\n{ROOT_JOBS}",
            work.display()
        ),
    )
    .unwrap();
    let addresses: Vec<String> = (1..=n)
        .map(|k| format!("10.10.0.{k}:{REPLICA_PORT}"))
        .collect();
    let mut c = Command::new(bin("governor"));
    c.args(["daemon", "--config"])
        .arg(&config)
        .args(["--coordinator", &addresses.join(",")])
        .args(["--node-name", &format!("node{me}")])
        .arg("--certs")
        .arg(certs)
        .args(["--log-level", "info"]);
    c
}

/// The replica that leads: followers do not listen, so the one that accepts a connection.
fn leading_replica(n: u32) -> Option<u32> {
    (1..=n).find(|k| {
        let addr = format!("10.10.0.{k}:{REPLICA_PORT}").parse().unwrap();
        TcpStream::connect_timeout(&addr, Duration::from_secs(2)).is_ok()
    })
}

/// Copy node1's certificates from the shared directory (keys kept private, as the binaries
/// expect of a key file).
fn take_certs(shared: &Path, certs: &Path) {
    std::fs::create_dir_all(certs).unwrap();
    for e in std::fs::read_dir(shared.join("certs")).unwrap().flatten() {
        let to = certs.join(e.file_name());
        std::fs::copy(e.path(), &to).unwrap();
        if e.file_name().to_string_lossy().ends_with("-key.pem") {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
    }
}

/// Where a node saw the job's process: the first and last sighting (ms since the epoch) and how
/// many samples saw it.
#[derive(Debug, Default, Clone, Copy)]
struct Sightings {
    first_ms: u128,
    last_ms: u128,
    samples: u64,
}

/// Every replica on etcd, its leader killed while a job that declared no checkpoint is being
/// moved by CRIU from node2 to node3: another replica is elected, resumes the move from the
/// phase its predecessor recorded, and the job ends on node3 with its log holding every epoch
/// once and the losses of the run never moved; by the nodes' process lists (sampled every
/// 200 ms on node2 and node3) it never ran on both nodes at once.
#[test]
#[ignore = "vm: needs the multi-node bed; run with `cargo xtask vm-test --nodes 3`"]
fn multinode_replicas_on_etcd_finish_a_criu_move_whose_leader_died() {
    require_vm();
    let (me, n) = node_env();
    assert!(
        n >= 3,
        "the replicated scenario needs 3 nodes (`--nodes 3`)"
    );
    let shared = replicas_shared();
    let work = PathBuf::from("/tmp/replicas");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(work.join("run")).unwrap();
    let certs = work.join("certs");
    if me == 1 {
        std::fs::create_dir_all(&shared).unwrap();
        let hosts: Vec<String> = (1..=n).map(|k| format!("10.10.0.{k}")).collect();
        let nodes: Vec<String> = (2..=n).map(|k| format!("node{k}")).collect();
        certs_init(&hosts, &nodes, &shared.join("certs"));
        std::fs::write(shared.join("certs.ready"), "").unwrap();
    } else {
        wait_file(&shared.join("certs.ready"), 600);
    }
    take_certs(&shared, &certs);

    let etcd_log = work.join("etcd.log");
    let _etcd = spawn("etcd member", &mut etcd_member_cmd(me, n, &work), &etcd_log);
    let _show_etcd = ShowOnPanic(etcd_log);
    let mut replica = start_replica(n, &certs);
    let _show_replica = ShowOnPanic(certs.join("replica.log"));
    let node_log = work.join("node.log");
    let _daemon = (me >= 2).then(|| {
        spawn(
            "node daemon",
            &mut replicated_node_cmd(me, n, &work, &certs),
            &node_log,
        )
    });
    let _show_node = (me >= 2).then(|| ShowOnPanic(node_log.clone()));
    eprintln!(
        "node{me}: etcd member, coordinator replica{} started",
        if me >= 2 { " and node daemon" } else { "" }
    );

    if me == 1 {
        *REPLICA_ADDRESSES.lock().unwrap() = (1..=n)
            .map(|k| format!("10.10.0.{k}:{REPLICA_PORT}"))
            .collect::<Vec<_>>()
            .join(",");
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            replicas_driver(n, &shared, &certs, &mut replica)
        }));
        REPLICA_ADDRESSES.lock().unwrap().clear();
        // The others stop sampling and report what they saw, whatever happened here.
        std::fs::write(shared.join("done"), "").unwrap();
        if let Err(e) = result {
            std::panic::resume_unwind(e);
        }
        let mut seen = std::collections::BTreeMap::new();
        for k in 2..=n {
            let path = shared.join(format!("seen-node{k}"));
            wait_file(&path, 120);
            let text = std::fs::read_to_string(&path).unwrap();
            let v: Vec<u128> = text
                .split_whitespace()
                .map(|x| x.parse().unwrap())
                .collect();
            seen.insert(
                k,
                Sightings {
                    first_ms: v[0],
                    last_ms: v[1],
                    samples: v[2] as u64,
                },
            );
        }
        eprintln!("node1: the job's process was seen: {seen:?}");
        let (on2, on3) = (seen[&2], seen[&3]);
        assert!(
            on2.samples > 0 && on3.samples > 0,
            "the job ran on node2, then on node3: {seen:?}"
        );
        assert!(
            on2.last_ms < on3.first_ms,
            "the job's process was seen on node3 ({} ms) before it was last seen on node2 ({} ms)",
            on3.first_ms,
            on2.last_ms
        );
        eprintln!(
            "node1: between the last sighting on node2 and the first on node3: {} ms",
            on3.first_ms - on2.last_ms
        );
    } else {
        replicas_worker(me, &shared, &mut replica);
    }
}

/// node1's part: the cluster elects a leader and the nodes join it; a CRIU job is placed on
/// node2, asked to move to node3, and the leader is killed as the move starts.
fn replicas_driver(n: u32, shared: &Path, certs: &Path, own_replica: &mut Replica) {
    let started = Instant::now();
    wait_for("a leader, and node2 and node3 ready with it", 600, || {
        ["node2", "node3"]
            .iter()
            .all(|name| node_status(certs, name).as_deref() == Some("ready"))
            .then_some(())
    });
    let first = leading_replica(n).expect("a replica leads");
    eprintln!(
        "node1: replica on node{first} leads; nodes ready after {:.0} s:\n{}",
        started.elapsed().as_secs_f64(),
        govctl(certs, &["nodes"])
    );
    let job = submit_movable_with(
        certs,
        REPLICATED_JOB,
        43,
        None,
        Saves::Criu,
        &[],
        RETURN_TRIP_EPOCHS,
    );
    wait_few_epochs(&job);
    let said = govctl(certs, &["move", &job.id, "--to", "node3"]);
    eprintln!("node1: {}", said.trim());
    assert!(said.contains("CRIU dump"), "{said}");
    let leader = leading_replica(n).expect("a replica leads");
    let phase = try_govctl(certs, &["job", &job.id, "--json"])
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|d| {
            d["moves"]
                .as_array()?
                .last()
                .and_then(|m| m["phase"].as_str().map(str::to_owned))
        })
        .unwrap_or_default();
    let killed_at = Instant::now();
    if leader == 1 {
        own_replica.kill();
    } else {
        std::fs::write(shared.join(format!("kill-replica-{leader}")), "").unwrap();
        wait_file(&shared.join(format!("killed-replica-{leader}")), 120);
    }
    eprintln!("node1: the leader (node{leader}'s replica) killed, the move at phase {phase:?}");
    let next = wait_for("another replica to lead", 120, || {
        leading_replica(n).filter(|k| *k != leader)
    });
    eprintln!(
        "node1: node{next}'s replica leads {:.1} s after the kill",
        killed_at.elapsed().as_secs_f64()
    );
    let m = wait_move(certs, &job.id, "done", "node3");
    eprintln!("node1: moved by CRIU across the leader's death: {m}");
    check_completed_unharmed(certs, &job);
}

/// node2's and node3's part: kill this node's replica when node1 asks, and sample the process
/// list for the job until node1 is done; then report the sightings.
fn replicas_worker(me: u32, shared: &Path, replica: &mut Replica) {
    let marker = format!("/{REPLICATED_JOB}/train.csv");
    let kill = shared.join(format!("kill-replica-{me}"));
    let mut seen = Sightings::default();
    let deadline = Instant::now() + Duration::from_secs(1500);
    while !shared.join("done").exists() {
        assert!(Instant::now() < deadline, "node{me}: node1 never said done");
        if replica.is_running() && kill.exists() {
            replica.kill(); // SIGKILL: the machine's loss, as far as the replica knows
            std::fs::write(shared.join(format!("killed-replica-{me}")), "").unwrap();
            eprintln!("node{me}: coordinator replica killed on node1's request");
        }
        if process_naming(&marker).is_some() {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis();
            if seen.samples == 0 {
                seen.first_ms = now;
            }
            seen.last_ms = now;
            seen.samples += 1;
        }
        thread::sleep(Duration::from_millis(200));
    }
    std::fs::write(
        shared.join(format!("seen-node{me}")),
        format!("{} {} {}", seen.first_ms, seen.last_ms, seen.samples),
    )
    .unwrap();
    eprintln!("node{me}: done; the job was seen {seen:?}");
}
