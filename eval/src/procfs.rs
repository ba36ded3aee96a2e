//! A process's CPU time and memory from `/proc/<pid>`: the one reader of the benchmarks (the
//! daemon's cost in `bench-daemon`, the daemon's CPU in each `bench-real` run).

use std::fs;
use std::process::Command;
use std::sync::OnceLock;

use anyhow::{Context, Result};

/// Cumulative CPU time (user + system, all threads) of process `pid`, in seconds, from
/// `/proc/<pid>/stat`.
pub(crate) fn cpu_seconds(pid: u32) -> Result<f64> {
    let path = format!("/proc/{pid}/stat");
    let stat = fs::read_to_string(&path).with_context(|| format!("cannot read {path}"))?;
    stat_cpu_ticks(&stat)
        .map(|ticks| ticks / clock_ticks())
        .with_context(|| format!("malformed {path}: {stat:?}"))
}

/// utime + stime, in clock ticks, of a `/proc/<pid>/stat` line.
fn stat_cpu_ticks(stat: &str) -> Option<f64> {
    // Fields after the command name (in parentheses, and it may hold spaces and parentheses)
    // start at field 3: utime and stime, fields 14 and 15, are the 12th and 13th after it.
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    let mut fields = rest.split_whitespace().skip(11);
    let utime: f64 = fields.next()?.parse().ok()?;
    let stime: f64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// `VmRSS` and `VmHWM` of process `pid`, in KiB, from `/proc/<pid>/status`.
pub(crate) fn memory_kib(pid: u32) -> Result<(u64, u64)> {
    let path = format!("/proc/{pid}/status");
    let status = fs::read_to_string(&path).with_context(|| format!("cannot read {path}"))?;
    let get = |key: &str| -> Result<u64> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .with_context(|| format!("no {key} in {path}"))
    };
    Ok((get("VmRSS:")?, get("VmHWM:")?))
}

/// The kernel's clock ticks per second (`getconf CLK_TCK`; the crates forbid unsafe code, so
/// no `sysconf`), asked once.
fn clock_ticks() -> f64 {
    static TICKS: OnceLock<f64> = OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok()?.trim().parse().ok())
            .unwrap_or(100.0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_is_read_after_the_command_name() {
        // A command name with spaces and a parenthesis must not shift the fields.
        let stat = "4242 (a (b) c) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0 1";
        assert_eq!(stat_cpu_ticks(stat), Some(300.0));
        assert_eq!(stat_cpu_ticks("4242 (x"), None);
        assert_eq!(stat_cpu_ticks("4242 (x) S 1"), None);
    }
}
