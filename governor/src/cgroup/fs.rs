//! The filesystem layer: every read and write of a cgroup file goes through [`CgroupFs`], rooted
//! at a [`Hierarchy`] (the real `/sys/fs/cgroup` or a test's fake root).

use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::error::CgroupError;
use super::hierarchy::{Controller, Hierarchy, HierarchyKind, JobCgroup};
use super::knob::{Knob, page_size};

/// Memory pressure counters of a cgroup (v2 `memory.events`; on v1 `max` is `memory.failcnt` and
/// `oom_kill` comes from `memory.oom_control`). Cumulative since the cgroup was created, and
/// hierarchical (they include the cgroup's descendants).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryEvents {
    /// Reclaimed while under `memory.low` protection.
    pub low: u64,
    /// Throttled and made to reclaim because usage went over `memory.high`.
    pub high: u64,
    /// Usage was about to go over `memory.max` (v1: the limit was hit, `failcnt`).
    pub max: u64,
    /// The limit was reached and an allocation was about to fail.
    pub oom: u64,
    /// Processes killed by the OOM killer.
    pub oom_kill: u64,
}

impl MemoryEvents {
    /// True when any pressure counter (`high`, `max`, `oom`, `oom_kill`) grew since `earlier`. A
    /// counter that went down means the cgroup was recreated: that is not pressure.
    pub fn pressure_since(&self, earlier: &MemoryEvents) -> bool {
        self.high > earlier.high
            || self.max > earlier.max
            || self.oom > earlier.oom
            || self.oom_kill > earlier.oom_kill
    }
}

/// What a cgroup has used, as the daemon feeds it to the policies and shows in `status`. A field
/// is `None` when its controller is not enabled for the cgroup.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CgroupUsage {
    /// CPU time used since the cgroup was created, in microseconds.
    pub cpu_usage_usec: Option<u64>,
    /// Enforcement periods elapsed with a CPU quota set.
    pub cpu_nr_periods: Option<u64>,
    /// Periods in which the cgroup was throttled by its quota.
    pub cpu_nr_throttled: Option<u64>,
    /// Time spent throttled, in microseconds.
    pub cpu_throttled_usec: Option<u64>,
    /// Memory charged to the cgroup now (v2 `memory.current`, v1 `memory.usage_in_bytes`).
    pub memory_current: Option<u64>,
    /// Memory pressure counters.
    pub memory_events: Option<MemoryEvents>,
    /// Time the group's tasks spent runnable but waiting for a CPU, in microseconds: its unmet
    /// CPU demand. v2 `cpu.pressure` ("some" total, where the kernel keeps pressure stall
    /// information), else the sum of the run delay in `/proc/<tid>/schedstat` over the group's
    /// threads (which can fall when a thread exits: consumers use its growth, floored at 0).
    pub cpu_wait_usec: Option<u64>,
}

/// Reads and writes cgroup files under one hierarchy. Cheap to clone.
#[derive(Clone, Debug)]
pub struct CgroupFs {
    hierarchy: Hierarchy,
    page_size: u64,
    /// Where `/proc` is (per-thread run delay); tests point it at a fake.
    proc_root: PathBuf,
    /// v1: the controller hierarchies a job group created by the governor joins.
    job_controllers: Vec<Controller>,
}

impl CgroupFs {
    /// A filesystem layer over a detected hierarchy.
    pub fn new(hierarchy: Hierarchy) -> CgroupFs {
        CgroupFs {
            hierarchy,
            page_size: page_size(),
            proc_root: PathBuf::from("/proc"),
            // Never the v1 memory hierarchy unless asked (the actuator adds it when it manages
            // v1 memory limits): `run-job` on a hybrid host used to create groups there.
            job_controllers: vec![Controller::Cpu, Controller::CpuAcct, Controller::Pids],
        }
    }

    /// Reads per-thread scheduler statistics under `root` instead of `/proc` (tests).
    pub fn with_proc_root(mut self, root: impl Into<PathBuf>) -> CgroupFs {
        self.proc_root = root.into();
        self
    }

    /// cgroup v1: the controller hierarchies in which job groups are created, joined and removed
    /// (default: cpu, cpuacct, pids). The actuator leaves out `memory` when it does not
    /// manage memory, so nothing is ever created under the v1 memory hierarchy then.
    pub fn set_job_controllers(&mut self, controllers: &[Controller]) {
        self.job_controllers = controllers.to_vec();
    }

    /// Every directory of `job`'s group (see [`Hierarchy::group_dirs`]).
    pub fn job_dirs(&self, job: &JobCgroup) -> Vec<PathBuf> {
        self.hierarchy.group_dirs(job, &self.job_controllers)
    }

    /// Where `/proc` is read.
    pub fn proc_root(&self) -> &Path {
        &self.proc_root
    }

    /// The controllers (v1 hierarchies) a governor job group spans.
    pub fn job_controllers(&self) -> &[Controller] {
        &self.job_controllers
    }

    /// Detect the hierarchy at `root` and wrap it.
    pub fn detect(root: impl Into<PathBuf>) -> Result<CgroupFs, CgroupError> {
        Ok(CgroupFs::new(Hierarchy::detect(root)?))
    }

    /// The hierarchy this layer reads and writes.
    pub fn hierarchy(&self) -> &Hierarchy {
        &self.hierarchy
    }

    /// The page size memory limits are rounded to.
    pub fn page_size(&self) -> u64 {
        self.page_size
    }

    /// The path of `job`'s file for `knob`.
    pub fn knob_path(&self, job: &JobCgroup, knob: Knob) -> Result<PathBuf, CgroupError> {
        self.file_path(job, knob.controller(), knob.file_name())
    }

    /// The path of `job`'s `file` of `controller`; an error when that controller is not mounted.
    pub fn file_path(
        &self,
        job: &JobCgroup,
        controller: Controller,
        file: &str,
    ) -> Result<PathBuf, CgroupError> {
        match self.hierarchy.controller_dir(controller, job) {
            Some(dir) => Ok(dir.join(file)),
            None => Err(CgroupError::ControllerUnavailable {
                job: job.clone(),
                controller,
                path: self.hierarchy.root().join(controller.name()),
            }),
        }
    }

    /// True when `job`'s cgroup exists (its directory for `controller`).
    pub fn exists(&self, job: &JobCgroup, controller: Controller) -> bool {
        self.hierarchy
            .controller_dir(controller, job)
            .is_some_and(|d| d.is_dir())
    }

    /// The current content of `job`'s `knob` file.
    pub fn read_knob(&self, job: &JobCgroup, knob: Knob) -> Result<String, CgroupError> {
        let path = self.knob_path(job, knob)?;
        self.read_job_file(job, knob.controller(), &path)
    }

    /// Read a file of `job`, telling a vanished cgroup from a missing controller.
    pub(crate) fn read_job_file(
        &self,
        job: &JobCgroup,
        controller: Controller,
        path: &Path,
    ) -> Result<String, CgroupError> {
        read_file(path).map_err(|e| self.classify(job, controller, path, e, None))
    }

    /// Write `value` to a file of `job` in one `write(2)` (cgroup files take a value per write).
    pub(crate) fn write_job_file(
        &self,
        job: &JobCgroup,
        controller: Controller,
        path: &Path,
        value: &str,
    ) -> Result<(), CgroupError> {
        write_file(path, value).map_err(|e| self.classify(job, controller, path, e, Some(value)))
    }

    /// Map an I/O error on `path`: a missing file in a missing directory is a vanished cgroup, a
    /// missing file in an existing one is a controller that is not enabled.
    fn classify(
        &self,
        job: &JobCgroup,
        controller: Controller,
        path: &Path,
        error: io::Error,
        value: Option<&str>,
    ) -> CgroupError {
        if error.kind() == io::ErrorKind::NotFound {
            let dir = path.parent().unwrap_or(path);
            // On v1 a job may exist in some controller hierarchies only (a tool that created it
            // under `cpu` alone): it is gone only when it is gone from all of them.
            let elsewhere = || {
                !self.hierarchy.kind().is_v2()
                    && [Controller::Cpu, Controller::CpuAcct, Controller::Memory]
                        .into_iter()
                        .filter_map(|c| self.hierarchy.controller_dir(c, job))
                        .any(|d| d.is_dir())
            };
            return if dir.is_dir() || elsewhere() {
                CgroupError::ControllerUnavailable {
                    job: job.clone(),
                    controller,
                    path: path.to_owned(),
                }
            } else {
                CgroupError::CgroupGone {
                    job: job.clone(),
                    path: dir.to_owned(),
                }
            };
        }
        match value {
            Some(v) => CgroupError::WriteFailed {
                path: path.to_owned(),
                value: v.to_owned(),
                error,
            },
            None => CgroupError::ReadFailed {
                path: path.to_owned(),
                error,
            },
        }
    }

    /// Read an optional file: `Ok(None)` when the controller is not enabled, an error when the
    /// cgroup is gone or the file cannot be read.
    fn read_optional(
        &self,
        job: &JobCgroup,
        controller: Controller,
        file: &str,
    ) -> Result<Option<(PathBuf, String)>, CgroupError> {
        let path = match self.file_path(job, controller, file) {
            Ok(p) => p,
            Err(CgroupError::ControllerUnavailable { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        match self.read_job_file(job, controller, &path) {
            Ok(text) => Ok(Some((path, text))),
            Err(CgroupError::ControllerUnavailable { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// CPU and memory usage of `job`: v2 `cpu.stat`, `memory.current`, `memory.events`; v1
    /// `cpuacct.usage`, `cpu.stat`, `memory.usage_in_bytes`, `memory.failcnt`,
    /// `memory.oom_control`. Fields of controllers that are not enabled are `None`.
    pub fn usage(&self, job: &JobCgroup) -> Result<CgroupUsage, CgroupError> {
        let mut usage = CgroupUsage::default();
        if self.hierarchy.kind().is_v2() {
            if let Some((path, text)) = self.read_optional(job, Controller::Cpu, "cpu.stat")? {
                let stat = parse_keyed(&path, &text)?;
                usage.cpu_usage_usec = stat.get("usage_usec").copied();
                usage.cpu_nr_periods = stat.get("nr_periods").copied();
                usage.cpu_nr_throttled = stat.get("nr_throttled").copied();
                usage.cpu_throttled_usec = stat.get("throttled_usec").copied();
            }
        } else {
            if let Some((path, text)) =
                self.read_optional(job, Controller::CpuAcct, "cpuacct.usage")?
            {
                usage.cpu_usage_usec = Some(parse_u64(&path, &text)? / 1000);
            }
            if let Some((path, text)) = self.read_optional(job, Controller::Cpu, "cpu.stat")? {
                let stat = parse_keyed(&path, &text)?;
                usage.cpu_nr_periods = stat.get("nr_periods").copied();
                usage.cpu_nr_throttled = stat.get("nr_throttled").copied();
                usage.cpu_throttled_usec = stat.get("throttled_time").map(|ns| ns / 1000);
            }
        }
        if let Some((current, events)) = self.memory_usage(job)? {
            usage.memory_current = Some(current);
            usage.memory_events = Some(events);
        }
        usage.cpu_wait_usec = self.cpu_wait_usec(job);
        Ok(usage)
    }

    /// See [`CgroupUsage::cpu_wait_usec`]. `None` when neither source can be read.
    pub fn cpu_wait_usec(&self, job: &JobCgroup) -> Option<u64> {
        if self.hierarchy.kind().is_v2()
            && let Ok(Some((_, text))) = self.read_optional(job, Controller::Cpu, "cpu.pressure")
            && let Some(total) = parse_pressure_some_total(&text)
        {
            return Some(total);
        }
        // v1 lists every thread in `tasks`, v2 in `cgroup.threads`.
        let file = if self.hierarchy.kind().is_v2() {
            "cgroup.threads"
        } else {
            "tasks"
        };
        let (_, threads) = self.read_optional(job, Controller::Cpu, file).ok()??;
        let mut total_ns: u64 = 0;
        for tid in threads.lines().filter_map(|l| l.trim().parse::<u32>().ok()) {
            let Ok(stat) = std::fs::read_to_string(self.proc_root.join(format!("{tid}/schedstat")))
            else {
                continue; // exited meanwhile
            };
            if let Some(delay) = stat
                .split_whitespace()
                .nth(1)
                .and_then(|v| v.parse::<u64>().ok())
            {
                total_ns = total_ns.saturating_add(delay);
            }
        }
        Some(total_ns / 1000)
    }

    /// Memory charged to `job` and its pressure counters (what the memory guard needs), `None`
    /// when the memory controller is not enabled for it.
    pub fn memory_usage(
        &self,
        job: &JobCgroup,
    ) -> Result<Option<(u64, MemoryEvents)>, CgroupError> {
        if self.hierarchy.kind().is_v2() {
            let Some((path, text)) =
                self.read_optional(job, Controller::Memory, "memory.current")?
            else {
                return Ok(None);
            };
            let current = parse_u64(&path, &text)?;
            let Some((path, text)) =
                self.read_optional(job, Controller::Memory, "memory.events")?
            else {
                return Ok(None);
            };
            let e = parse_keyed(&path, &text)?;
            let get = |k: &str| e.get(k).copied().unwrap_or(0);
            Ok(Some((
                current,
                MemoryEvents {
                    low: get("low"),
                    high: get("high"),
                    max: get("max"),
                    oom: get("oom"),
                    oom_kill: get("oom_kill"),
                },
            )))
        } else {
            let Some((path, text)) =
                self.read_optional(job, Controller::Memory, "memory.usage_in_bytes")?
            else {
                return Ok(None);
            };
            let current = parse_u64(&path, &text)?;
            let mut events = MemoryEvents::default();
            if let Some((path, text)) =
                self.read_optional(job, Controller::Memory, "memory.failcnt")?
            {
                events.max = parse_u64(&path, &text)?;
            }
            if let Some((path, text)) =
                self.read_optional(job, Controller::Memory, "memory.oom_control")?
            {
                let oom = parse_keyed(&path, &text)?;
                events.oom_kill = oom.get("oom_kill").copied().unwrap_or(0);
            }
            Ok(Some((current, events)))
        }
    }

    /// `memory.stat` of `job` as key → value (bytes or counts, as the kernel reports them);
    /// empty when the memory controller is not enabled.
    pub fn memory_stat(&self, job: &JobCgroup) -> Result<BTreeMap<String, u64>, CgroupError> {
        match self.read_optional(job, Controller::Memory, "memory.stat")? {
            Some((path, text)) => parse_keyed(&path, &text),
            None => Ok(BTreeMap::new()),
        }
    }

    /// The kind of hierarchy (shortcut).
    pub fn kind(&self) -> HierarchyKind {
        self.hierarchy.kind()
    }
}

/// The `total=` of the `some` line of a PSI file (`cpu.pressure`), in microseconds.
fn parse_pressure_some_total(text: &str) -> Option<u64> {
    text.lines()
        .find(|l| l.starts_with("some "))?
        .split_whitespace()
        .find_map(|f| f.strip_prefix("total="))?
        .parse()
        .ok()
}

/// Read a whole cgroup file: `open`, `read` until end of file, `close`. Unlike
/// `std::fs::read_to_string` it asks for no size hint (`statx`), which cgroupfs cannot give (it
/// reports 4096 or 0 for every file): one syscall in five fewer on the daemon's sampling of every
/// job's `cpu.stat`, `memory.current` and `memory.events` each second.
pub(crate) fn read_file(path: &Path) -> io::Result<String> {
    let mut file = std::fs::File::open(path)?;
    let mut content = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match file.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => content.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    String::from_utf8(content).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Write `value` to an existing file (never creates one), truncating what a plain file held so a
/// fake root behaves like cgroupfs, in a single `write(2)`.
pub(crate) fn write_file(path: &Path, value: &str) -> io::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(path)?;
    let n = file.write(value.as_bytes())?;
    if n != value.len() {
        return Err(io::Error::new(
            io::ErrorKind::WriteZero,
            format!("short write: {n} of {} bytes", value.len()),
        ));
    }
    Ok(())
}

/// Parse a single unsigned integer (`memory.current`, `cpuacct.usage`).
pub(crate) fn parse_u64(path: &Path, text: &str) -> Result<u64, CgroupError> {
    text.trim().parse().map_err(|_| CgroupError::Parse {
        path: path.to_owned(),
        content: snippet(text),
        reason: "expected an unsigned integer",
    })
}

/// Parse a flat-keyed file (`cpu.stat`, `memory.events`, `memory.stat`): `key value` per line.
/// Blank lines are ignored; anything else that is not `key unsigned-integer` is an error.
pub fn parse_keyed(path: &Path, text: &str) -> Result<BTreeMap<String, u64>, CgroupError> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let mut fields = line.split_whitespace();
        let Some(key) = fields.next() else { continue };
        let value = fields
            .next()
            .and_then(|v| v.parse().ok())
            .filter(|_| fields.next().is_none());
        match value {
            Some(v) => {
                out.insert(key.to_owned(), v);
            }
            None => {
                return Err(CgroupError::Parse {
                    path: path.to_owned(),
                    content: snippet(line),
                    reason: "expected `key value` lines",
                });
            }
        }
    }
    Ok(out)
}

/// The start of a file's content for an error message.
pub(crate) fn snippet(text: &str) -> String {
    const MAX: usize = 80;
    if text.len() <= MAX {
        return text.to_owned();
    }
    let mut end = MAX;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::fake::FakeCgroupRoot;

    #[test]
    fn read_file_reads_past_its_buffer_and_rejects_invalid_utf8() {
        let dir = tempfile::tempdir().unwrap();
        let big = dir.path().join("memory.stat");
        let content: String = (0..1000).map(|i| format!("key_{i} {i}\n")).collect();
        assert!(content.len() > 2 * 4096, "spans several reads");
        std::fs::write(&big, &content).unwrap();
        assert_eq!(read_file(&big).unwrap(), content);
        let bad = dir.path().join("cpu.stat");
        std::fs::write(&bad, b"usage_usec \xff\n").unwrap();
        assert_eq!(
            read_file(&bad).unwrap_err().kind(),
            io::ErrorKind::InvalidData
        );
        assert_eq!(
            read_file(&dir.path().join("missing")).unwrap_err().kind(),
            io::ErrorKind::NotFound,
            "a missing file stays NotFound (a vanished cgroup is told from it)"
        );
    }

    fn job(p: &str) -> JobCgroup {
        JobCgroup::new(p).unwrap()
    }

    #[test]
    fn v2_usage_reads_cpu_stat_memory_current_and_events() {
        let dir = tempfile::tempdir().unwrap();
        let fake = FakeCgroupRoot::unified(dir.path());
        fake.add_group("a/b");
        fake.set(
            "a/b",
            "cpu.stat",
            "usage_usec 1500\nuser_usec 1000\nsystem_usec 500\nnr_periods 10\nnr_throttled 3\nthrottled_usec 777\n",
        );
        fake.set("a/b", "memory.current", "123456\n");
        fake.set(
            "a/b",
            "memory.events",
            "low 1\nhigh 2\nmax 3\noom 4\noom_kill 5\noom_group_kill 0\n",
        );
        let fs = CgroupFs::detect(dir.path()).unwrap();
        let u = fs.usage(&job("/a/b")).unwrap();
        assert_eq!(
            u,
            CgroupUsage {
                cpu_usage_usec: Some(1500),
                cpu_nr_periods: Some(10),
                cpu_nr_throttled: Some(3),
                cpu_throttled_usec: Some(777),
                memory_current: Some(123456),
                memory_events: Some(MemoryEvents {
                    low: 1,
                    high: 2,
                    max: 3,
                    oom: 4,
                    oom_kill: 5
                }),
                cpu_wait_usec: None,
            }
        );
    }

    #[test]
    fn v2_usage_without_memory_controller_reports_none() {
        let dir = tempfile::tempdir().unwrap();
        let fake = FakeCgroupRoot::unified(dir.path());
        let path = fake.add_group("cpuonly");
        std::fs::remove_file(path.join("memory.current")).unwrap();
        let fs = CgroupFs::detect(dir.path()).unwrap();
        let u = fs.usage(&job("cpuonly")).unwrap();
        assert_eq!(u.memory_current, None);
        assert_eq!(u.memory_events, None);
        assert_eq!(u.cpu_usage_usec, Some(0));
    }

    #[test]
    fn v1_usage_reads_cpuacct_failcnt_and_oom_control() {
        let dir = tempfile::tempdir().unwrap();
        let fake = FakeCgroupRoot::hybrid(dir.path());
        fake.add_group("job");
        fake.set_v1(Controller::CpuAcct, "job", "cpuacct.usage", "2500000\n");
        fake.set_v1(
            Controller::Cpu,
            "job",
            "cpu.stat",
            "nr_periods 7\nnr_throttled 2\nthrottled_time 3000000\n",
        );
        fake.set_v1(Controller::Memory, "job", "memory.usage_in_bytes", "4096\n");
        fake.set_v1(Controller::Memory, "job", "memory.failcnt", "9\n");
        fake.set_v1(
            Controller::Memory,
            "job",
            "memory.oom_control",
            "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
        );
        let fs = CgroupFs::detect(dir.path()).unwrap();
        let u = fs.usage(&job("job")).unwrap();
        assert_eq!(u.cpu_usage_usec, Some(2500));
        assert_eq!(u.cpu_nr_periods, Some(7));
        assert_eq!(u.cpu_nr_throttled, Some(2));
        assert_eq!(u.cpu_throttled_usec, Some(3000));
        assert_eq!(u.memory_current, Some(4096));
        let e = u.memory_events.unwrap();
        assert_eq!((e.max, e.oom_kill), (9, 2));
    }

    #[test]
    fn garbage_in_a_cgroup_file_is_a_parse_error_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let fake = FakeCgroupRoot::unified(dir.path());
        fake.add_group("g");
        fake.set("g", "memory.current", "\u{1F4A5} lots\n");
        let fs = CgroupFs::detect(dir.path()).unwrap();
        let err = fs.usage(&job("g")).unwrap_err();
        assert!(
            matches!(err, CgroupError::Parse { ref path, .. } if path.ends_with("memory.current")),
            "{err}"
        );
        fake.set("g", "memory.current", "5\n");
        fake.set("g", "memory.events", "high\n");
        let err = fs.usage(&job("g")).unwrap_err();
        assert!(matches!(err, CgroupError::Parse { .. }), "{err}");
        fake.set("g", "memory.events", "");
        fake.set("g", "memory.stat", &"x".repeat(500));
        let err = fs.memory_stat(&job("g")).unwrap_err();
        assert!(
            err.to_string().len() < 300,
            "error message not bounded: {err}"
        );
    }

    #[test]
    fn a_vanished_cgroup_is_reported_as_gone() {
        let dir = tempfile::tempdir().unwrap();
        FakeCgroupRoot::unified(dir.path());
        let fs = CgroupFs::detect(dir.path()).unwrap();
        let err = fs.usage(&job("never/existed")).unwrap_err();
        assert!(err.is_gone(), "{err}");
        let err = fs
            .read_knob(&job("never/existed"), Knob::CpuMax)
            .unwrap_err();
        assert!(err.is_gone(), "{err}");
    }

    #[test]
    fn a_v1_job_present_under_cpu_only_is_not_gone() {
        let dir = tempfile::tempdir().unwrap();
        let fake = FakeCgroupRoot::hybrid(dir.path());
        fake.add_group("cpuonly");
        fake.set_v1(Controller::CpuAcct, "cpuonly", "cpuacct.usage", "1000\n");
        std::fs::remove_dir_all(dir.path().join("memory/cpuonly")).unwrap();
        let fs = CgroupFs::detect(dir.path()).unwrap();
        let u = fs.usage(&job("cpuonly")).unwrap();
        assert_eq!(u.cpu_usage_usec, Some(1));
        assert_eq!(u.memory_current, None);
        let err = fs
            .read_knob(&job("cpuonly"), Knob::MemorySoftLimit)
            .unwrap_err();
        assert!(
            matches!(err, CgroupError::ControllerUnavailable { .. }),
            "{err}"
        );
    }

    #[test]
    fn memory_stat_is_parsed() {
        let dir = tempfile::tempdir().unwrap();
        let fake = FakeCgroupRoot::unified(dir.path());
        fake.add_group("g");
        fake.set("g", "memory.stat", "anon 4096\nfile 8192\n\n");
        let fs = CgroupFs::detect(dir.path()).unwrap();
        let stat = fs.memory_stat(&job("g")).unwrap();
        assert_eq!(stat["anon"], 4096);
        assert_eq!(stat["file"], 8192);
    }

    #[test]
    fn pressure_is_any_pressure_counter_growing() {
        let base = MemoryEvents {
            low: 5,
            high: 5,
            max: 5,
            oom: 5,
            oom_kill: 5,
        };
        assert!(!base.pressure_since(&base));
        assert!(
            !MemoryEvents { low: 9, ..base }.pressure_since(&base),
            "low is protection, not pressure"
        );
        assert!(MemoryEvents { high: 6, ..base }.pressure_since(&base));
        assert!(MemoryEvents { max: 6, ..base }.pressure_since(&base));
        assert!(MemoryEvents { oom: 6, ..base }.pressure_since(&base));
        assert!(
            MemoryEvents {
                oom_kill: 6,
                ..base
            }
            .pressure_since(&base)
        );
        assert!(
            !MemoryEvents::default().pressure_since(&base),
            "counters reset by a recreated cgroup are not pressure"
        );
    }

    #[test]
    fn writes_never_create_files() {
        let dir = tempfile::tempdir().unwrap();
        let err = write_file(&dir.path().join("cpu.max"), "max 100000").unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        assert!(!dir.path().join("cpu.max").exists());
    }

    #[test]
    fn cpu_wait_comes_from_pressure_on_v2_and_from_the_threads_run_delay_otherwise() {
        // v2 with pressure stall information: the "some" total.
        let dir = tempfile::tempdir().unwrap();
        let fake = FakeCgroupRoot::unified(dir.path());
        fake.add_group("a");
        fake.set(
            "a",
            "cpu.pressure",
            "some avg10=1.00 avg60=0.50 avg300=0.10 total=4200\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
        );
        let fs = CgroupFs::detect(dir.path()).unwrap();
        assert_eq!(fs.cpu_wait_usec(&job("/a")), Some(4200));

        // Without it (v1, or PSI off): the run delay of every thread, from /proc/<tid>/schedstat.
        let dir = tempfile::tempdir().unwrap();
        let fake = FakeCgroupRoot::hybrid(dir.path());
        fake.add_group("b");
        let proc = dir.path().join("proc");
        for (tid, delay_ns) in [(11, 3_000_000u64), (12, 500_000)] {
            std::fs::create_dir_all(proc.join(tid.to_string())).unwrap();
            std::fs::write(
                proc.join(format!("{tid}/schedstat")),
                format!("123456789 {delay_ns} 42\n"),
            )
            .unwrap();
        }
        // 13 has exited: skipped.
        let cpu_dir = dir.path().join("cpu/b");
        std::fs::write(cpu_dir.join("tasks"), "11\n12\n13\n").unwrap();
        let fs = CgroupFs::detect(dir.path()).unwrap().with_proc_root(&proc);
        assert_eq!(fs.cpu_wait_usec(&job("/b")), Some(3_500));
    }
}
