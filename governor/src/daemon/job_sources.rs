//! The daemon's view of where jobs come from: declared job files, processes carrying
//! `GOVERNOR_LOG` (found at start-up, on `exec` events and by safety rescans), and jobs handed
//! over by `governor run-job`. Produces [`Found`] jobs for the core and notices finished ones.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use tracing::{info, warn};

use super::access::RunJobGrant;
use super::node_core::{CoreShell, JobSource, NewJob};
use crate::cgroup::adoption::AdoptionJournal;
use crate::cgroup::{Controller, HierarchyKind, JobCgroup};
use crate::config::{DaemonConfig, JobConfig, load_jobs_dir};
use crate::control::AdoptJob;
use crate::discovery::adopt::{AdoptGrant, AdoptRule};
use crate::discovery::names::identify;
use crate::discovery::procfs::{CgroupLine, Credentials, ProcFs};
use crate::discovery::scan::{self, EnvProcess, Placement};
use crate::policy::{Direction, JobId, JobSpec};
use crate::progress::signal::infer_direction;
use crate::progress::{FormatChoice, SignalConfig};
use crate::sys::proc_events::ProcEvent;
use crate::watch::{FileOwner, WatchSpec};

/// The overflow user and group (`nobody`): the rights a job's files are read with when its
/// owner cannot be told.
pub(super) fn nobody() -> FileOwner {
    FileOwner {
        uid: 65534,
        gid: 65534,
        groups: Vec::new(),
    }
}

/// A job ready to be governed and the logs to follow for it.
pub(super) struct Found {
    pub job: NewJob,
    pub watch: WatchSpec,
}

impl Found {
    /// A sweep compares only the trials of one owner: a job of another user that names the
    /// same sweep (with a made-up loss) must not get this user's trials cut. The sweep of a job
    /// whose logs are read with its owner's rights is named with the owner's uid ("lr (uid
    /// 1000)"); one the operator declared (read with the daemon's rights) keeps its name.
    pub(super) fn scope_sweep_to_owner(&mut self) {
        if let (Some(trial), Some(owner)) = (self.job.sweep.as_mut(), self.watch.owner.as_ref()) {
            trial.sweep = format!("{} (uid {})", trial.sweep, owner.uid);
        }
    }
}

#[derive(Debug, Default)]
struct ProcessJob {
    pids: BTreeSet<u32>,
    /// The governor created this cgroup (adoption or run-job) and removes it when empty.
    owned_group: bool,
    /// The uid of the user whose job it is (checked before a `release` from the socket).
    owner: Option<u32>,
}

/// Discovery state.
pub(super) struct Discovery {
    config: DaemonConfig,
    line: CgroupLine<'static>,
    proc: ProcFs,
    declared: BTreeMap<PathBuf, JobConfig>,
    process_jobs: BTreeMap<JobCgroup, ProcessJob>,
    pid_index: HashMap<u32, JobCgroup>,
    /// Problems already logged (each is logged once).
    reported: HashSet<String>,
    /// Whose processes may be moved out of a shared cgroup (`[discovery] adopt`).
    grant: AdoptGrant,
    /// Where adopted processes came from, to put them back.
    journal: AdoptionJournal,
    /// Who besides root may start jobs with `run-job` (`[run_job] users`).
    run_job: RunJobGrant,
    /// Job groups the daemon made for `join_job`, with the uid of the user they are for:
    /// removed once their job has ended (the user cannot remove them).
    joined: BTreeMap<JobCgroup, u32>,
    /// Joined groups whose removal failed (each is logged once).
    stuck: BTreeSet<JobCgroup>,
}

fn job_cgroup(path: &str) -> Option<JobCgroup> {
    JobCgroup::new(path.trim_start_matches('/')).ok()
}

fn spec_for(
    id: &JobCgroup,
    priority: i32,
    metric: Option<&str>,
    direction: Option<Direction>,
) -> JobSpec {
    let mut spec = JobSpec::new(id.to_string());
    spec.id = JobId(id.to_string());
    spec.priority = priority;
    spec.direction = direction
        .or_else(|| metric.map(infer_direction))
        .unwrap_or_default();
    spec
}

/// `[run_job] users` resolved on this node, with where it is set.
fn resolve_run_job(config: &DaemonConfig, config_file: &Path) -> RunJobGrant {
    RunJobGrant {
        grant: resolve_grant(&config.run_job.users, "run_job.users"),
        setting: config.run_job.users.clone(),
        config_file: config_file.display().to_string(),
    }
}

/// An `adopt`-like setting (`setting` names it in the log) with names resolved on this node
/// (checked when the configuration loads; a name unknown here grants nothing and is reported
/// once).
fn resolve_grant(text: &str, setting: &str) -> AdoptGrant {
    let rule = AdoptRule::parse(text).unwrap_or(AdoptRule::None);
    let (grant, unknown) = rule.resolve(
        |n| {
            nix::unistd::User::from_name(n)
                .ok()
                .flatten()
                .map(|u| u.uid.as_raw())
        },
        |n| {
            nix::unistd::Group::from_name(n)
                .ok()
                .flatten()
                .map(|g| g.gid.as_raw())
        },
    );
    for u in unknown {
        info!(grantee = %u, setting, "the setting names a user or group this node does not have; it grants nothing");
    }
    grant
}

/// A job name usable as a cgroup directory name.
fn sanitize(name: &str) -> String {
    let s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '-'
            }
        })
        .collect();
    let s = s.trim_matches(|c| c == '.' || c == '-').to_owned();
    if s.is_empty() {
        "job".into()
    } else {
        s.chars().take(64).collect()
    }
}

impl Discovery {
    pub(super) fn new(config: DaemonConfig, kind: HierarchyKind, config_file: &Path) -> Discovery {
        Discovery {
            line: if kind.is_v2() {
                CgroupLine::Unified
            } else {
                CgroupLine::Controller("cpu")
            },
            proc: ProcFs::default(),
            declared: BTreeMap::new(),
            process_jobs: BTreeMap::new(),
            pid_index: HashMap::new(),
            reported: HashSet::new(),
            grant: resolve_grant(&config.discovery.adopt, "discovery.adopt"),
            journal: AdoptionJournal::open(&config.state_file),
            run_job: resolve_run_job(&config, config_file),
            joined: BTreeMap::new(),
            stuck: BTreeSet::new(),
            config,
        }
    }

    /// Put back what a previous run adopted and could not return (it crashed or was killed):
    /// its processes go back to the cgroups they came from, its groups are removed.
    fn recover_adoptions(&mut self, core: &CoreShell) {
        for a in self.journal.entries() {
            let mut released = true;
            if let Some(group) = job_cgroup(&a.group)
                && !core.contains(&group)
            {
                released = core
                    .actuator()
                    .fs()
                    .release_adopted(&group, Some(&a.origins));
                info!(group = %a.group, released, "adoption left by a previous run undone");
            }
            // Kept while its processes could not all be moved back: the next stop or start
            // tries again.
            if released {
                self.journal.forget(&a.group);
            }
        }
    }

    /// The configuration in use.
    pub(super) fn config(&self) -> &DaemonConfig {
        &self.config
    }

    fn report_once(&mut self, key: String, message: impl FnOnce() -> String) {
        if self.reported.insert(key) {
            warn!("{}", message());
        }
    }

    fn load_declared(&mut self) {
        let (jobs, errors) = load_jobs_dir(&self.config.jobs_dir);
        for e in errors {
            let msg = e.to_string();
            self.report_once(format!("jobfile:{msg}"), || {
                format!("job file ignored: {msg}")
            });
        }
        self.declared = jobs;
    }

    /// Everything present at start-up.
    pub(super) fn initial(&mut self, core: &CoreShell) -> Vec<Found> {
        self.recover_adoptions(core);
        self.load_declared();
        let mut found = self.pending_declared(core);
        found.extend(self.rescan(core));
        found
    }

    /// Declared jobs not governed yet whose cgroup exists now.
    pub(super) fn pending_declared(&mut self, core: &CoreShell) -> Vec<Found> {
        let mut out = Vec::new();
        let declared: Vec<(PathBuf, JobConfig)> = self
            .declared
            .iter()
            .map(|(p, j)| (p.clone(), j.clone()))
            .collect();
        for (file, cfg) in declared {
            let Some(cgroup) = job_cgroup(&cfg.cgroup) else {
                self.report_once(format!("badcg:{}", file.display()), || {
                    format!(
                        "{}: cgroup {:?} is not a usable cgroup path",
                        file.display(),
                        cfg.cgroup
                    )
                });
                continue;
            };
            if core.contains(&cgroup) || !core.actuator().fs().exists(&cgroup, Controller::Cpu) {
                continue;
            }
            let name = cfg.name.clone().unwrap_or_else(|| cgroup.to_string());
            let format = match cfg
                .format
                .as_deref()
                .map(FormatChoice::from_str)
                .transpose()
            {
                Ok(f) => f.unwrap_or_default(),
                Err(e) => {
                    self.report_once(format!("fmt:{}", file.display()), || {
                        format!("{}: {e}; detecting the format instead", file.display())
                    });
                    FormatChoice::Auto
                }
            };
            let mut spec = spec_for(&cgroup, cfg.priority, cfg.metric.as_deref(), cfg.direction);
            spec.bounds = cfg.bounds();
            out.push(Found {
                job: NewJob {
                    runtime: identify(&format!("/{cgroup}")).to_string(),
                    name,
                    source: JobSource::Declared(file.clone()),
                    spec,
                    signal: SignalConfig {
                        metric: cfg.metric.clone(),
                        direction: cfg.direction,
                    },
                    epochs: cfg.epochs,
                    finish: cfg.finish,
                    sweep: cfg.sweep.clone(),
                    cgroup,
                },
                watch: WatchSpec {
                    paths: cfg.logs.iter().map(PathBuf::from).collect(),
                    format,
                    custom: cfg.custom.clone(),
                    // The operator's own configuration: read with the daemon's rights.
                    owner: None,
                },
            });
        }
        out
    }

    /// Full scan of /proc for `GOVERNOR_LOG` processes not yet governed.
    pub(super) fn rescan(&mut self, core: &CoreShell) -> Vec<Found> {
        if !self.config.discovery.environment {
            return Vec::new();
        }
        let groups = scan::scan(&self.proc, self.line);
        let mut out = Vec::new();
        for (cgroup, members) in groups {
            if let Some(f) = self.consider(core, &cgroup, &members) {
                out.push(f);
            }
        }
        out
    }

    /// New and finished jobs from process events.
    pub(super) fn on_proc_events(
        &mut self,
        core: &CoreShell,
        events: &[ProcEvent],
    ) -> (Vec<Found>, Vec<JobCgroup>) {
        let mut found = Vec::new();
        let mut finished = BTreeSet::new();
        for ev in events {
            match *ev {
                ProcEvent::Exec { pid } if self.config.discovery.environment => {
                    if let Some(p) = scan::env_process(&self.proc, pid, self.line)
                        && let Some(f) = self.consider(core, &p.cgroup.clone(), &[p])
                    {
                        found.push(f);
                    }
                }
                ProcEvent::Exit { pid } => {
                    if let Some(cgroup) = self.pid_index.remove(&pid)
                        && let Some(job) = self.process_jobs.get_mut(&cgroup)
                    {
                        job.pids.remove(&pid);
                        if self.no_process_left(core, &cgroup) {
                            finished.insert(cgroup);
                        }
                    }
                }
                ProcEvent::Overflow => {
                    info!("process events were lost (exec storm): rescanning");
                    found.extend(self.rescan(core));
                }
                ProcEvent::Exec { .. } => {}
            }
        }
        (found, finished.into_iter().collect())
    }

    /// Process-found and launched jobs whose cgroup has no process left (or is gone).
    pub(super) fn finished_jobs(&self, core: &CoreShell) -> Vec<JobCgroup> {
        let mut out: Vec<JobCgroup> = self
            .process_jobs
            .keys()
            .filter(|c| core.contains(c) && self.no_process_left(core, c))
            .cloned()
            .collect();
        // Declared jobs whose cgroup vanished (container removed): stop governing until it
        // reappears.
        for (c, _) in core.jobs() {
            if !self.process_jobs.contains_key(c)
                && !core.actuator().fs().exists(c, Controller::Cpu)
            {
                out.push(c.clone());
            }
        }
        out
    }

    /// Decide whether the processes of `cgroup` make a new job.
    fn consider(
        &mut self,
        core: &CoreShell,
        cgroup: &str,
        members: &[EnvProcess],
    ) -> Option<Found> {
        let first = members.first()?;
        // Already governed (in place, or adopted/launched into a group of ours)?
        if let Some(c) = job_cgroup(cgroup)
            && (core.contains(&c) || self.process_jobs.contains_key(&c))
        {
            for m in members {
                self.pid_index.insert(m.pid, c.clone());
                self.process_jobs
                    .entry(c.clone())
                    .or_default()
                    .pids
                    .insert(m.pid);
            }
            return None;
        }
        if members.iter().any(|m| self.pid_index.contains_key(&m.pid)) {
            return None;
        }
        // A process that exited before it was looked at: its cgroup line no longer names the
        // group it ran in (the kernel shows the root), so nothing read about it counts.
        if !members.iter().any(|m| self.proc.is_live(m.pid)) {
            return None;
        }
        // A descendant of a governed job's process (a child forked by the job, seen at its exec)
        // belongs to that job, wherever it now is: it is never a job of its own.
        for m in members {
            if let Some(job) = scan::ancestors(&self.proc, m.pid)
                .iter()
                .find_map(|a| self.pid_index.get(a).cloned())
            {
                self.pid_index.insert(m.pid, job.clone());
                self.process_jobs.entry(job).or_default().pids.insert(m.pid);
                return None;
            }
        }
        let roots = scan::job_roots(&self.proc, members);
        let root_pid = roots.first().copied().unwrap_or(first.pid);
        // Whose job it is: who may adopt it, whose rights its logs are read with.
        let creds = self.proc.credentials(root_pid);
        let env = &first.env;
        let identity = identify(cgroup);
        let ours = matches!(
            identity.runtime,
            crate::discovery::names::Runtime::Governor { .. }
        );
        let member_pids = job_cgroup(cgroup)
            .map(|c| core.actuator().fs().procs(&c))
            .unwrap_or_default();
        // A group under the governor's own subtree is never left (run-job put the job there).
        let placement = if ours {
            Placement::InPlace
        } else {
            scan::placement(&self.proc, cgroup, &roots, &member_pids)
        };
        let name = match (&env.job, &placement) {
            (Some(n), _) => n.clone(),
            // Adopted from a shared group, whose name says nothing about the job.
            (None, Placement::Adopt { .. }) => format!(
                "{}-{root_pid}",
                self.proc.comm(root_pid).unwrap_or_else(|| "job".into())
            ),
            (None, Placement::InPlace) => identity.to_string(),
        };
        let logs: Vec<PathBuf> = env
            .logs
            .iter()
            .map(|l| self.proc.host_path(root_pid, l))
            .collect();
        let mut runtime = identity.to_string();
        let (target, owned, pids) = match placement {
            Placement::InPlace => (
                job_cgroup(cgroup)?,
                false,
                members.iter().map(|m| m.pid).collect::<Vec<_>>(),
            ),
            Placement::Adopt { pids } => {
                let group = self.adopt(
                    core,
                    cgroup,
                    &name,
                    (root_pid, creds.as_ref()?),
                    &roots,
                    pids,
                )?;
                runtime = format!("adopted from {cgroup}");
                (group, true, Vec::new())
            }
        };
        let entry = self.process_jobs.entry(target.clone()).or_default();
        entry.owned_group |= owned;
        entry.owner = entry.owner.or(creds.as_ref().map(|c| c.uid));
        for pid in pids.iter().copied().chain(members.iter().map(|m| m.pid)) {
            entry.pids.insert(pid);
            self.pid_index.insert(pid, target.clone());
        }
        let spec = spec_for(&target, 0, env.metric.as_deref(), None);
        // A process in the governor's own job subtree was started by `governor run-job` (its
        // exec is often seen before run-job's adopt request arrives).
        let source = if ours {
            JobSource::Launched { pid: root_pid }
        } else {
            JobSource::Environment { pid: root_pid }
        };
        Some(Found {
            job: NewJob {
                runtime,
                name,
                source,
                spec,
                signal: SignalConfig {
                    metric: env.metric.clone(),
                    direction: None,
                },
                epochs: env.epochs,
                finish: env.finish,
                sweep: env.sweep.clone(),
                cgroup: target,
            },
            watch: WatchSpec {
                paths: logs,
                format: FormatChoice::Auto,
                custom: None,
                // The paths come from the job: read them with its owner's rights (an owner we
                // cannot tell gets nobody's).
                owner: Some(creds.map_or_else(nobody, |c| c.file_owner())),
            },
        })
    }

    /// Move a job's processes out of the shared cgroup `from` into a group of their own, if
    /// the operator grants it to the job's owner and the move escapes no limit. Where they came
    /// from is journalled first, so that they go back on release, stop or the next start.
    fn adopt(
        &mut self,
        core: &CoreShell,
        from: &str,
        name: &str,
        (root_pid, owner): (u32, &Credentials),
        roots: &[u32],
        pids: Vec<u32>,
    ) -> Option<JobCgroup> {
        if !self.grant.allows(owner) {
            let grant = self.grant.clone();
            self.report_once(format!("adopt:{root_pid}"), || {
                format!(
                    "job {name} (pid {root_pid}, uid {}) shares the cgroup {from} with other processes and [discovery] adopt does not let the governor move processes of its owner (it grants {grant}); it is not governed",
                    owner.uid
                )
            });
            return None;
        }
        let fs = core.actuator().fs();
        let origins = fs.process_dirs(root_pid)?;
        if let Some(limit) = fs.limit_on(&origins) {
            self.report_once(format!("adopt:{root_pid}"), || {
                format!("job {name} (pid {root_pid}) shares the cgroup {from} with other processes, but moving it would take it out of a limit it is subject to ({limit}); it is not governed")
            });
            return None;
        }
        let group_name = format!("{}-{}", sanitize(name), root_pid);
        let group = match core.actuator().create_job_group(&group_name) {
            Ok(g) => g,
            Err(e) => {
                self.report_once(format!("adopt:{root_pid}"), || {
                    format!("cannot create a cgroup for job {name} (pid {root_pid}): {e}; it is not governed")
                });
                return None;
            }
        };
        if let Err(e) = self.journal.record(&group, origins) {
            let _ = fs.remove_job_group(&group);
            self.report_once(format!("adopt:{root_pid}"), || {
                format!("cannot journal the adoption of job {name} (pid {root_pid}): {e}; it is not moved nor governed")
            });
            return None;
        }
        let pids = if pids.is_empty() {
            roots.to_vec()
        } else {
            pids
        };
        for &pid in &pids {
            if let Err(e) = fs.add_process(&group, pid) {
                warn!(job = %name, pid, error = %e, "cannot move a process of the job into its cgroup");
            }
        }
        // Children forked while moving stay behind: move what is left of the tree.
        let again = scan::placement(
            &self.proc,
            from,
            roots,
            &job_cgroup(from).map(|c| fs.procs(&c)).unwrap_or_default(),
        );
        if let Placement::Adopt { pids: late } = again {
            for pid in late {
                let _ = fs.add_process(&group, pid);
            }
        }
        info!(job = %name, from, to = %group, processes = pids.len(), uid = owner.uid, "job shared its cgroup with other processes: moved into a cgroup of its own");
        let entry = self.process_jobs.entry(group.clone()).or_default();
        for pid in pids {
            entry.pids.insert(pid);
            self.pid_index.insert(pid, group.clone());
        }
        Some(group)
    }

    /// Real uid of a live process.
    pub(super) fn process_owner(&self, pid: u32) -> Option<u32> {
        self.proc
            .is_live(pid)
            .then(|| self.proc.credentials(pid).map(|c| c.uid))
            .flatten()
    }

    /// The cgroup a live process is in (the line discovery reads).
    pub(super) fn process_cgroup(&self, pid: u32) -> Option<String> {
        self.proc
            .is_live(pid)
            .then(|| self.proc.cgroup(pid, self.line))
            .flatten()
    }

    /// The uid of the user whose job `cgroup` is, if discovery or run-job told.
    pub(super) fn job_owner(&self, cgroup: &str) -> Option<u32> {
        let group = job_cgroup(cgroup)?;
        self.process_jobs
            .get(&group)
            .and_then(|j| j.owner)
            .or_else(|| self.joined.get(&group).copied())
    }

    /// Supplementary groups of a live process.
    pub(super) fn process_groups(&self, pid: u32) -> Vec<u32> {
        self.proc
            .credentials(pid)
            .map(|c| c.groups)
            .unwrap_or_default()
    }

    /// `[run_job] users`, resolved.
    pub(super) fn run_job_grant(&self) -> &RunJobGrant {
        &self.run_job
    }

    /// Whether `cgroup` has no process left. A group made for `join_job` is delegated: its
    /// user may have moved the job's processes into groups below it, which count.
    fn no_process_left(&self, core: &CoreShell, cgroup: &JobCgroup) -> bool {
        let fs = core.actuator().fs();
        if self.joined.contains_key(cgroup) {
            !fs.populated(cgroup)
        } else {
            fs.procs(cgroup).is_empty()
        }
    }

    /// The daemon made `group` for user `uid` (`join_job`): it is removed once its job ended.
    pub(super) fn note_joined(&mut self, group: JobCgroup, uid: u32) {
        self.stuck.remove(&group);
        self.joined.insert(group, uid);
    }

    /// Groups a previous run made for users (their directory is theirs), so that those whose
    /// job has ended are removed.
    pub(super) fn find_joined(&mut self, core: &CoreShell) {
        let subtree = core.actuator().config().jobs_subtree.clone();
        for (group, uid) in core.actuator().fs().delegated_job_groups(&subtree) {
            self.joined.entry(group).or_insert(uid);
        }
    }

    /// Remove the groups made for `join_job` whose job has ended (no process left, and no
    /// longer governed: a governed job is stopped first, its original values put back); `only`
    /// limits it to one group. Returns the groups removed.
    pub(super) fn remove_ended_groups(
        &mut self,
        core: &CoreShell,
        only: Option<&JobCgroup>,
    ) -> Vec<JobCgroup> {
        let fs = core.actuator().fs();
        let ended: Vec<JobCgroup> = self
            .joined
            .keys()
            .filter(|g| only.is_none_or(|o| o == *g))
            .filter(|g| !core.contains(g))
            .filter(|g| !fs.populated(g))
            .cloned()
            .collect();
        let mut removed = Vec::new();
        for group in ended {
            match fs.remove_job_group(&group) {
                Ok(()) => {
                    let uid = self.joined.remove(&group);
                    self.stuck.remove(&group);
                    info!(group = %group, uid, "the job ended: its cgroup removed");
                    removed.push(group);
                }
                Err(e) => {
                    if self.stuck.insert(group.clone()) {
                        warn!(group = %group, error = %e, "cannot remove the cgroup of an ended job; retried on every tick");
                    }
                }
            }
        }
        removed
    }

    /// A job started by `governor run-job` in a cgroup it created. Discovery follows its
    /// processes and notices when none is left.
    pub(super) fn adopt_launched(
        &mut self,
        core: &CoreShell,
        job: &AdoptJob,
    ) -> Result<Found, String> {
        // Its log paths come from the request: read them with the rights of the process's
        // owner (whom the control socket checked the caller against).
        let creds = self.proc.credentials(job.pid);
        let owner = creds.as_ref().map_or_else(nobody, Credentials::file_owner);
        let found = launched_job(job, Some(owner))?;
        let cgroup = found.job.cgroup.clone();
        let entry = self.process_jobs.entry(cgroup.clone()).or_default();
        entry.owner = entry.owner.or(creds.map(|c| c.uid));
        entry.pids.insert(job.pid);
        self.pid_index.insert(job.pid, cgroup.clone());
        if core.contains(&cgroup) {
            return Err(format!("{} is already governed", job.cgroup));
        }
        Ok(found)
    }
}

/// The job to govern for a process started in a cgroup of its own (by `governor run-job`, or
/// by the daemon for the coordinator, which then follows the job's end itself).
pub(super) fn launched_job(job: &AdoptJob, owner: Option<FileOwner>) -> Result<Found, String> {
    let cgroup =
        job_cgroup(&job.cgroup).ok_or_else(|| format!("invalid cgroup path {:?}", job.cgroup))?;
    if job.logs.iter().any(|l| !super::is_absolute(l)) {
        return Err("log paths must be absolute".into());
    }
    let format = job
        .format
        .as_deref()
        .map(FormatChoice::from_str)
        .transpose()
        .map_err(|e| e.to_string())?
        .unwrap_or_default();
    Ok(Found {
        job: NewJob {
            runtime: identify(&format!("/{cgroup}")).to_string(),
            name: job.name.clone(),
            source: JobSource::Launched { pid: job.pid },
            spec: spec_for(&cgroup, 0, job.metric.as_deref(), None),
            signal: SignalConfig {
                metric: job.metric.clone(),
                direction: None,
            },
            epochs: job.epochs,
            finish: job.finish,
            sweep: job.sweep.clone(),
            cgroup,
        },
        watch: WatchSpec {
            paths: job.logs.iter().map(PathBuf::from).collect(),
            format,
            custom: None,
            owner,
        },
    })
}

impl Discovery {
    /// New configuration: returns declared jobs to start and declared jobs whose file is gone.
    pub(super) fn reload(
        &mut self,
        config: DaemonConfig,
        core: &CoreShell,
    ) -> (Vec<Found>, Vec<JobCgroup>) {
        self.grant = resolve_grant(&config.discovery.adopt, "discovery.adopt");
        self.run_job = resolve_run_job(&config, Path::new(&self.run_job.config_file));
        self.config = config;
        let before: BTreeSet<JobCgroup> = self
            .declared
            .values()
            .filter_map(|j| job_cgroup(&j.cgroup))
            .collect();
        self.reported.retain(|k| !k.starts_with("jobfile:"));
        self.load_declared();
        let after: BTreeSet<JobCgroup> = self
            .declared
            .values()
            .filter_map(|j| job_cgroup(&j.cgroup))
            .collect();
        let gone = before
            .difference(&after)
            .filter(|c| core.contains(c) && !self.process_jobs.contains_key(*c))
            .cloned()
            .collect();
        (self.pending_declared(core), gone)
    }

    /// Forget a job that is no longer governed: processes it adopted go back to the cgroup
    /// they came from, and a cgroup the governor created is removed once empty.
    pub(super) fn forget(&mut self, cgroup: &JobCgroup, core: &CoreShell) {
        if let Some(job) = self.process_jobs.remove(cgroup) {
            for pid in &job.pids {
                self.pid_index.remove(pid);
            }
            if job.owned_group {
                self.release_group(cgroup, core);
            }
        }
    }

    fn release_group(&mut self, cgroup: &JobCgroup, core: &CoreShell) {
        let fs = core.actuator().fs();
        if fs.release_adopted(cgroup, self.journal.origins(cgroup)) {
            self.journal.forget(&cgroup.to_string());
        }
    }

    /// On shutdown: adopted processes go back where they came from; the governor's empty
    /// cgroups are removed.
    pub(super) fn cleanup_adopted_groups(&mut self, core: &CoreShell) {
        let owned: Vec<JobCgroup> = self
            .process_jobs
            .iter()
            .filter(|(_, j)| j.owned_group)
            .map(|(c, _)| c.clone())
            .collect();
        for cgroup in owned {
            self.release_group(&cgroup, core);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sweep_compares_only_one_owners_trials() {
        let adopt = |sweep: &str| AdoptJob {
            name: "t".into(),
            cgroup: "/governor.slice/jobs/t".into(),
            logs: vec!["/home/a/t.csv".into()],
            metric: None,
            format: None,
            pid: 7,
            epochs: Some(10.0),
            finish: None,
            sweep: Some(governor_proto::job_env::parse_sweep(sweep).unwrap()),
        };
        let owner = |uid: u32| FileOwner {
            uid,
            gid: uid,
            groups: Vec::new(),
        };
        let sweep_of = |uid: u32| {
            let mut found = launched_job(&adopt("lr"), Some(owner(uid))).unwrap();
            found.scope_sweep_to_owner();
            found.job.sweep.unwrap().sweep
        };
        assert_eq!(sweep_of(1000), "lr (uid 1000)");
        assert_ne!(sweep_of(1000), sweep_of(1001));
        let mut declared = launched_job(&adopt("lr:2:1"), None).unwrap();
        declared.scope_sweep_to_owner();
        let t = declared.job.sweep.unwrap();
        assert_eq!((t.sweep.as_str(), t.rule.eta), ("lr", 2));
    }

    #[test]
    fn job_names_become_safe_cgroup_names() {
        assert_eq!(sanitize("bert finetune/v2"), "bert-finetune-v2");
        assert_eq!(sanitize("../../etc"), "etc");
        assert_eq!(sanitize("..."), "job");
        assert_eq!(sanitize(&"x".repeat(100)).len(), 64);
    }
}
