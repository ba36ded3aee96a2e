//! The real-GPU read check (`tests/device/gpu-read-check.sh`) judges what it recorded, without a
//! GPU: its verdict (`--verdict OUT`, `tests/device/gpu_read_verdict.py`) runs here against
//! recordings made the way the script makes them on a lent machine, with the real `governor gpus
//! --json` reading the stand-in NVML library (two "training" processes on one GPU), the real
//! `governor parse --summary` on a Lightning `metrics.csv` and a plain PyTorch log, and nvidia-smi's
//! figures as it prints them. A good recording passes every check and exits 0; each way a real
//! run can go wrong fails its own check, and the script exits non-zero. A plain host test: no
//! root, no GPU (python3 runs the verdict, as it runs the training on a lent machine).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use governor_integration_tests::daemon::{bin, nvml_standin_library};
use nvml_standin::state::{self, Process, STATE_ENV, State};

/// GPU memory of the two processes, as measured on an H200 (README): nvidia-smi's 914 and
/// 864 MiB.
const LIGHTNING_BYTES: u64 = 958_398_464;
const PLAIN_BYTES: u64 = 905_969_664;

const CHECKS: [&str; 7] = [
    "found", "memory", "cgroup", "energy", "logs", "trained", "settings",
];

/// What a recording gets wrong (`Nothing`: a good run).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Spoil {
    Nothing,
    /// NVML does not list the plain PyTorch process.
    PlainNotOnGpu,
    /// nvidia-smi's figure for the plain process is 10% above governor's.
    MemoryOff,
    /// governor's cgroup for the plain process is not the one /proc gave.
    CgroupWrong,
    /// The energy counter cannot be read.
    NoEnergy,
    /// The plain process's log holds no loss.
    LogWithoutLoss,
    /// The Lightning process exited 1.
    TrainingFailed,
    /// The power limit differs after the run.
    SettingsChanged,
}

impl Spoil {
    /// The checks this spoiling must fail (every other one passes).
    fn fails(self) -> &'static [&'static str] {
        match self {
            Spoil::Nothing => &[],
            Spoil::PlainNotOnGpu => &["found", "memory", "cgroup"],
            Spoil::MemoryOff => &["memory"],
            Spoil::CgroupWrong => &["cgroup"],
            Spoil::NoEnergy => &["energy"],
            Spoil::LogWithoutLoss => &["logs"],
            Spoil::TrainingFailed => &["trained"],
            Spoil::SettingsChanged => &["settings"],
        }
    }
}

/// Two processes standing in for the training processes (killed when dropped).
struct Trainers([Child; 2]);

impl Trainers {
    fn start() -> Trainers {
        let sleeper = || {
            Command::new("sleep")
                .arg("120")
                .stdin(Stdio::null())
                .spawn()
                .expect("sleep")
        };
        Trainers([sleeper(), sleeper()])
    }

    fn pids(&self) -> [u32; 2] {
        [self.0[0].id(), self.0[1].id()]
    }
}

impl Drop for Trainers {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Runs `governor ARGS` with the stand-in NVML state `nvml`; writes its stdout to `out/NAME`,
/// its stderr to `NAME.err` and its exit status to `NAME.rc`, as the script does (NAME.json
/// -> NAME.rc).
fn governor_into(out: &Path, name: &str, args: &[&str], nvml: &Path) {
    let o = Command::new(bin("governor"))
        .args(args)
        .env(STATE_ENV, nvml)
        .output()
        .expect("governor");
    let stem = name.rsplit_once('.').map_or(name, |(s, _)| s);
    fs::write(out.join(name), &o.stdout).unwrap();
    fs::write(out.join(format!("{stem}.err")), &o.stderr).unwrap();
    fs::write(
        out.join(format!("{stem}.rc")),
        format!("{}\n", o.status.code().unwrap_or(-1)),
    )
    .unwrap();
}

/// Records in a new directory what gpu-read-check.sh records on a lent GPU machine, spoiled by
/// `spoil`.
fn record(trainers: &Trainers, spoil: Spoil) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path();
    let [lit, plain] = trainers.pids();
    let w = |name: &str, text: &str| fs::write(out.join(name), text).unwrap();
    w("pids.txt", &format!("lightning {lit}\nplain {plain}\n"));

    // The GPU, through the stand-in: both processes with their memory.
    let nvml = out.join("nvml-standin.json");
    let mut s = State::h100s(1);
    s.devices[0].processes = vec![Process {
        pid: lit,
        used_memory: LIGHTNING_BYTES,
    }];
    if spoil != Spoil::PlainNotOnGpu {
        s.devices[0].processes.push(Process {
            pid: plain,
            used_memory: PLAIN_BYTES,
        });
    }
    if spoil == Spoil::NoEnergy {
        s.devices[0].fail.insert(
            "nvmlDeviceGetTotalEnergyConsumption".into(),
            "NOT_SUPPORTED".into(),
        );
    }
    state::create(&nvml, &s).unwrap();
    let cgroup = |pid: u32| fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    w("cgroup-lightning.txt", &cgroup(lit));
    w(
        "cgroup-plain.txt",
        &if spoil == Spoil::CgroupWrong {
            "0::/somewhere/else.scope\n".to_owned()
        } else {
            cgroup(plain)
        },
    );
    let library = nvml_standin_library();
    let library = library.to_str().unwrap();
    let gpus = ["gpus", "--json", "--interval", "300ms", "--nvml-library"];
    governor_into(out, "gpus-1.json", &[&gpus[..], &[library]].concat(), &nvml);
    let plain_mib = if spoil == Spoil::MemoryOff { 950 } else { 864 };
    w("apps-1.csv", &format!("{lit}, 914\n{plain}, {plain_mib}\n"));
    governor_into(out, "gpus-2.json", &[&gpus[..], &[library]].concat(), &nvml);
    let lightning_rc = if spoil == Spoil::TrainingFailed { 1 } else { 0 };
    w(
        "trained.txt",
        &format!("lightning {lightning_rc}\nplain 0\n"),
    );

    // The logs: Lightning's CSVLogger and the plain loop's prints.
    w(
        "lightning-metrics.csv",
        "epoch,step,train_loss_epoch,train_loss_step\n0,19,,0.6931\n0,39,,0.6512\n0,255,0.6620,\n\
         1,275,,0.5803\n1,511,0.5711,\n",
    );
    let plain_log = if spoil == Spoil::LogWithoutLoss {
        "CUDA available, 1 device\nstarting\n".to_owned()
    } else {
        (1..=3)
            .flat_map(|e| {
                (1..=4).map(move |s| {
                    format!(
                        "Epoch [{e}/300], Step [{}/128], Loss: {:.4}\n",
                        32 * s,
                        0.7 - 0.01 * f64::from(4 * e + s)
                    )
                })
            })
            .collect()
    };
    w("plain.log", &plain_log);
    for name in ["lightning-metrics.csv", "plain.log"] {
        let target = if name == "plain.log" {
            "parse-plain.json"
        } else {
            "parse-lightning.json"
        };
        let file = out.join(name);
        governor_into(
            out,
            target,
            &["parse", "--summary", file.to_str().unwrap()],
            &nvml,
        );
    }

    // nvidia-smi's settings query, before and after.
    let settings = |limit: &str| {
        format!(
            "0, NVIDIA H200, GPU-3f1c0e6a-0000-0000-0000-000000000000, {limit} W, 700.00 W, \
             1980 MHz, 1980 MHz, Enabled, Disabled\n"
        )
    };
    w("settings-before.csv", &settings("700.00"));
    w(
        "settings-after.csv",
        &settings(if spoil == Spoil::SettingsChanged {
            "500.00"
        } else {
            "700.00"
        }),
    );
    dir
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("device/gpu-read-check.sh")
}

fn verdict(out: &Path) -> Output {
    Command::new("bash")
        .arg(script())
        .arg("--verdict")
        .arg(out)
        .output()
        .expect("bash tests/device/gpu-read-check.sh --verdict")
}

#[test]
fn the_gpu_read_check_passes_a_good_run_and_fails_each_bad_one() {
    let trainers = Trainers::start();
    for spoil in [
        Spoil::Nothing,
        Spoil::PlainNotOnGpu,
        Spoil::MemoryOff,
        Spoil::CgroupWrong,
        Spoil::NoEnergy,
        Spoil::LogWithoutLoss,
        Spoil::TrainingFailed,
        Spoil::SettingsChanged,
    ] {
        let dir = record(&trainers, spoil);
        let o = verdict(dir.path());
        let stdout = String::from_utf8_lossy(&o.stdout);
        let all = format!(
            "{spoil:?}: the verdict said\n{stdout}{}",
            String::from_utf8_lossy(&o.stderr)
        );
        for check in CHECKS {
            let want = if spoil.fails().contains(&check) {
                "FAIL"
            } else {
                "PASS"
            };
            assert_eq!(
                stdout
                    .lines()
                    .filter(|l| l.starts_with(&format!("{want} {check}: ")))
                    .count(),
                1,
                "{check} should say {want}\n{all}"
            );
        }
        assert_eq!(
            o.status.success(),
            spoil == Spoil::Nothing,
            "exit status {}\n{all}",
            o.status
        );
        let summary = format!(
            "gpu-read-check: {} of {} checks passed",
            CHECKS.len() - spoil.fails().len(),
            CHECKS.len()
        );
        assert!(stdout.contains(&summary), "{summary}\n{all}");
        assert_eq!(
            fs::read_to_string(dir.path().join("verdict.txt")).unwrap(),
            stdout,
            "the verdict is kept in OUT/verdict.txt"
        );
    }
}

/// The script may only read the device: every nvidia-smi call it makes is a query.
#[test]
fn the_gpu_read_check_only_queries_nvidia_smi() {
    let text = fs::read_to_string(script()).unwrap();
    let mut calls = 0;
    for line in text.lines().filter(|l| !l.trim_start().starts_with('#')) {
        for (at, _) in line.match_indices("nvidia-smi") {
            calls += 1;
            let next = line[at + "nvidia-smi".len()..].split_whitespace().next();
            assert!(
                next.is_some_and(|a| a.starts_with("--query-")),
                "an nvidia-smi call that is not a query: {line}"
            );
        }
    }
    assert!(calls >= 3, "the script's nvidia-smi calls were not found");
}
