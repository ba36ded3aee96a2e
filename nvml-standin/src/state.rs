//! The stand-in's devices: a JSON document that every NVML call reads and (for changes and
//! the energy counter) writes back under an exclusive lock, so that the daemon, a test that
//! scripts it and "someone else" changing a setting (`nvidia-smi`, another agent) share one
//! device state, as they share a real GPU.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

/// The environment variable that names the state file.
pub const STATE_ENV: &str = "NVML_STANDIN_STATE";

/// One compute process on a device.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Process {
    pub pid: u32,
    #[serde(default)]
    pub used_memory: u64,
}

/// One GPU.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Device {
    pub uuid: String,
    pub name: String,
    pub memory_total: u64,
    /// Power limit now, and its default and bounds, in milliwatts (NVML's unit).
    pub power_limit_mw: u32,
    pub default_limit_mw: u32,
    pub min_limit_mw: u32,
    pub max_limit_mw: u32,
    /// Draw with no compute process, and with some at an unconstrained limit.
    pub idle_power_mw: u32,
    pub busy_power_mw: u32,
    /// Utilisation (percent) while some process runs.
    #[serde(default = "busy_percent")]
    pub busy_utilization: u32,
    /// Graphics clock range and locked range (None: not locked), MHz.
    pub min_clock_mhz: u32,
    pub max_clock_mhz: u32,
    #[serde(default)]
    pub locked_clocks_mhz: Option<(u32, u32)>,
    #[serde(default)]
    pub mig: bool,
    #[serde(default)]
    pub processes: Vec<Process>,
    /// Total energy since the "driver" loaded, millijoules, and when it was last advanced
    /// (Unix seconds).
    #[serde(default)]
    pub energy_mj: u64,
    #[serde(default)]
    pub energy_at: f64,
    /// Functions that fail on this device, by NVML function name, with the error's name
    /// (`NO_PERMISSION`, `NOT_SUPPORTED`, `GPU_IS_LOST`, ...).
    #[serde(default)]
    pub fail: BTreeMap<String, String>,
}

fn busy_percent() -> u32 {
    95
}

impl Device {
    /// An H100-like device (power 200-700 W, 70 W idle, 650 W busy at an open limit).
    pub fn h100(index: u32) -> Device {
        Device {
            uuid: format!("GPU-standin-{index:04}"),
            name: "NVIDIA H100 80GB HBM3 (stand-in)".into(),
            memory_total: 80 << 30,
            power_limit_mw: 700_000,
            default_limit_mw: 700_000,
            min_limit_mw: 200_000,
            max_limit_mw: 700_000,
            idle_power_mw: 70_000,
            busy_power_mw: 650_000,
            busy_utilization: 95,
            min_clock_mhz: 210,
            max_clock_mhz: 1980,
            locked_clocks_mhz: None,
            mig: false,
            processes: Vec::new(),
            energy_mj: 0,
            energy_at: 0.0,
            fail: BTreeMap::new(),
        }
    }

    /// Draw now, milliwatts: idle without processes; with some, the busy draw scaled by a
    /// locked clock's share of the maximum, never above the power limit. A stand-in's rule, not
    /// a device's physics (govsim's GPU model has the measured curves).
    pub fn power_mw(&self) -> u32 {
        if self.processes.is_empty() {
            return self.idle_power_mw.min(self.power_limit_mw);
        }
        let clock_share = self.locked_clocks_mhz.map_or(1.0, |(_, max)| {
            f64::from(max) / f64::from(self.max_clock_mhz.max(1))
        });
        let busy = f64::from(self.idle_power_mw)
            + f64::from(self.busy_power_mw.saturating_sub(self.idle_power_mw))
                * clock_share.min(1.0);
        (busy as u32).min(self.power_limit_mw)
    }

    pub fn utilization(&self) -> u32 {
        if self.processes.is_empty() {
            0
        } else {
            self.busy_utilization
        }
    }

    /// Advance the energy counter to `now` at the current draw.
    fn advance(&mut self, now: f64) {
        if self.energy_at > 0.0 && now > self.energy_at {
            self.energy_mj += (f64::from(self.power_mw()) * (now - self.energy_at)) as u64;
        }
        self.energy_at = now;
    }
}

/// All the devices.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct State {
    #[serde(default = "driver")]
    pub driver_version: String,
    pub devices: Vec<Device>,
    /// `nvmlInit` fails with this error (a driver that is not loaded).
    #[serde(default)]
    pub init_fails: Option<String>,
}

fn driver() -> String {
    "standin-1.0".into()
}

impl State {
    /// `count` H100-like devices.
    pub fn h100s(count: u32) -> State {
        State {
            driver_version: driver(),
            devices: (0..count).map(Device::h100).collect(),
            init_fails: None,
        }
    }
}

/// Seconds since the Unix epoch.
pub fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Write a fresh state file (tests; not locked against readers that are not started yet).
pub fn create(path: &Path, state: &State) -> std::io::Result<()> {
    write_atomically(path, state)
}

/// Read the state at `path`, let `f` look at it or change it (after the energy counters are
/// advanced to now), and write it back if anything changed; all under an exclusive lock on
/// `<path>.lock`.
pub fn with_state<T>(path: &Path, f: impl FnOnce(&mut State) -> T) -> std::io::Result<T> {
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(lock_path(path))?;
    let _lock =
        Flock::lock(lock, FlockArg::LockExclusive).map_err(|(_, e)| std::io::Error::from(e))?;
    let text = fs::read_to_string(path)?;
    let mut state: State = serde_json::from_str(&text)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
    let now = now();
    for d in &mut state.devices {
        d.advance(now);
    }
    let out = f(&mut state);
    write_atomically(path, &state)?;
    Ok(out)
}

fn lock_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".lock");
    PathBuf::from(p)
}

fn write_atomically(path: &Path, state: &State) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let mut file = File::create(&tmp)?;
    file.write_all(serde_json::to_string_pretty(state)?.as_bytes())?;
    file.sync_all()?;
    fs::rename(&tmp, path)
}
