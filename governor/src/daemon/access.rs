//! Who may do what through the control socket. The socket itself is mode 0660, owned by root
//! and the configured `socket_group`, so only root and that group can connect at all; every
//! request then carries the caller's credentials from `SO_PEERCRED` (the kernel's word, not the
//! client's), checked here:
//!
//! | request    | allowed to                                                               |
//! |------------|--------------------------------------------------------------------------|
//! | `status`   | anyone who can connect                                                   |
//! | `reload`   | root                                                                     |
//! | `adopt`    | root, or the user who owns the process handed over; the process must be in |
//! |            | the cgroup named (or below it), and that cgroup under the job subtree    |
//! | `release`  | root, or the user whose job it is                                        |
//! | `join_job` | root, or a user `[run_job] users` grants, for the calling process itself  |
//! |            | (never a pid the request names), which must be the caller's and under no  |
//! |            | CPU or memory limit it would leave; the job name must be free: no process |
//! |            | in its group, and a leftover group only reused by the user it belongs to |
//!
//! Changing the policy is done by editing the configuration and reloading (root). Pure: the
//! facts it needs (owners of processes and jobs) are passed in, so it is unit-tested.

use crate::control::{Peer, Request};
use crate::discovery::adopt::AdoptGrant;
use crate::discovery::procfs::Credentials;

/// What the check needs to know about the node.
pub(super) trait Facts {
    /// Real uid of a live process.
    fn process_owner(&self, pid: u32) -> Option<u32>;
    /// The cgroup a live process is in (as discovery reads it, `/a/b`).
    fn process_cgroup(&self, pid: u32) -> Option<String>;
    /// The uid of the user whose job a governed cgroup is.
    fn job_owner(&self, cgroup: &str) -> Option<u32>;
    /// The governor's job subtree (`/governor.slice/jobs`).
    fn job_subtree(&self) -> String;
    /// Supplementary groups of a live process.
    fn process_groups(&self, pid: u32) -> Vec<u32>;
    /// The first CPU or memory limit a live process is under (`"<file> = <value>"`), which it
    /// would leave if moved into the job subtree.
    fn process_limit(&self, pid: u32) -> Option<String>;
    /// The job group `<subtree>/<name>`, if it exists.
    fn job_group(&self, name: &str) -> Option<JobGroup>;
    /// Who besides root may start jobs (`[run_job] users`).
    fn run_job_grant(&self) -> &RunJobGrant;
}

/// An existing job group, as `join_job` sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct JobGroup {
    /// The user it belongs to (the job's, the one it was delegated to, else root).
    pub owner: u32,
    /// A process lives in it (or in a group below it).
    pub populated: bool,
}

/// `[run_job] users` resolved, with where it is set (for the refusal).
#[derive(Clone, Debug, Default)]
pub(super) struct RunJobGrant {
    pub grant: AdoptGrant,
    /// The setting as written.
    pub setting: String,
    /// The configuration file it is set in.
    pub config_file: String,
}

/// `Ok` when `caller` may make `request`, else the reason (sent back to the caller).
pub(super) fn check(
    request: &Request,
    caller: Option<&Peer>,
    facts: &dyn Facts,
) -> Result<(), String> {
    let Some(caller) = caller else {
        return match request {
            Request::Status => Ok(()),
            _ => Err("the caller's credentials are unknown: only status is answered".into()),
        };
    };
    let root = caller.uid == 0;
    match request {
        Request::Status => Ok(()),
        Request::Reload if root => Ok(()),
        Request::Reload => Err(format!(
            "uid {} may not reload the governor (root only)",
            caller.uid
        )),
        Request::Adopt(job) => {
            let cgroup = format!("/{}", job.cgroup.trim_start_matches('/'));
            let subtree = facts.job_subtree();
            if !cgroup.starts_with(&format!("{subtree}/")) {
                return Err(format!(
                    "{cgroup} is not under the governor's job subtree {subtree}: only jobs started by run-job are adopted this way"
                ));
            }
            let Some(owner) = facts.process_owner(job.pid) else {
                return Err(format!("process {} does not exist", job.pid));
            };
            if !root && owner != caller.uid {
                return Err(format!(
                    "process {} belongs to uid {owner}, not to the caller (uid {})",
                    job.pid, caller.uid
                ));
            }
            match facts.process_cgroup(job.pid) {
                // Or below it: the user of a delegated job group may have moved it there.
                Some(c) if c == cgroup || c.starts_with(&format!("{cgroup}/")) => Ok(()),
                Some(c) => Err(format!("process {} is in {c}, not in {cgroup}", job.pid)),
                None => Err(format!("process {} does not exist", job.pid)),
            }
        }
        Request::Release { cgroup } => {
            if root {
                return Ok(());
            }
            let cgroup = format!("/{}", cgroup.trim_start_matches('/'));
            match facts.job_owner(&cgroup) {
                Some(owner) if owner == caller.uid => Ok(()),
                // Not governed: releasing it changes nothing.
                None => Ok(()),
                Some(owner) => Err(format!(
                    "{cgroup} is a job of uid {owner}; uid {} may not release it",
                    caller.uid
                )),
            }
        }
        Request::JoinJob { name } => check_join(name, caller, facts),
    }
}

/// `join_job`: see the table in the module doc.
fn check_join(name: &str, caller: &Peer, facts: &dyn Facts) -> Result<(), String> {
    crate::cgroup::jobs::validate_job_name(name).map_err(|e| e.to_string())?;
    let Some(pid) = caller.pid else {
        return Err("the kernel did not tell which process is calling: no process to place".into());
    };
    let root = caller.uid == 0;
    if !root {
        let rule = facts.run_job_grant();
        let who = Credentials {
            uid: caller.uid,
            gid: caller.gid,
            groups: facts.process_groups(pid),
        };
        if !rule.grant.allows(&who) {
            return Err(format!(
                "uid {} may not start jobs on this node: ask the operator to allow you in [run_job] users (now {:?}, in {})",
                caller.uid, rule.setting, rule.config_file
            ));
        }
        // The caller is the process itself: it can only have changed hands by exec of a
        // set-uid program since it connected.
        match facts.process_owner(pid) {
            Some(owner) if owner == caller.uid => {}
            Some(owner) => {
                return Err(format!(
                    "process {pid} now belongs to uid {owner}, not to the caller (uid {})",
                    caller.uid
                ));
            }
            None => return Err(format!("process {pid} does not exist")),
        }
    }
    if let Some(group) = facts.job_group(name) {
        let path = format!("{}/{name}", facts.job_subtree());
        if group.populated {
            return Err(if group.owner == caller.uid {
                format!(
                    "job name {name:?} is in use by another job of yours ({path}): choose another --name"
                )
            } else {
                format!(
                    "job name {name:?} is in use by a job of uid {} ({path}): choose another --name",
                    group.owner
                )
            });
        }
        // An empty group of someone else's: a job that is starting (root's run-job creates its
        // group before its process joins it) or one that has just ended.
        if !root && group.owner != caller.uid {
            return Err(format!(
                "job name {name:?} is taken ({path} belongs to uid {}): choose another --name",
                group.owner
            ));
        }
    }
    if !root && let Some(limit) = facts.process_limit(pid) {
        return Err(format!(
            "the job would leave a limit it is under ({limit}), and the governor never moves a process out of a limit: start it from a session without one, or ask the operator"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::AdoptJob;
    use std::collections::HashMap;

    struct Node {
        procs: HashMap<u32, (u32, &'static str)>,
        jobs: HashMap<&'static str, u32>,
        groups: HashMap<u32, Vec<u32>>,
        limited: HashMap<u32, &'static str>,
        job_groups: HashMap<&'static str, JobGroup>,
        grant: RunJobGrant,
    }

    impl Facts for Node {
        fn process_owner(&self, pid: u32) -> Option<u32> {
            self.procs.get(&pid).map(|p| p.0)
        }
        fn process_cgroup(&self, pid: u32) -> Option<String> {
            self.procs.get(&pid).map(|p| p.1.to_owned())
        }
        fn job_owner(&self, cgroup: &str) -> Option<u32> {
            self.jobs.get(cgroup).copied()
        }
        fn job_subtree(&self) -> String {
            "/governor.slice/jobs".into()
        }
        fn process_groups(&self, pid: u32) -> Vec<u32> {
            self.groups.get(&pid).cloned().unwrap_or_default()
        }
        fn process_limit(&self, pid: u32) -> Option<String> {
            self.limited.get(&pid).map(|l| (*l).to_owned())
        }
        fn job_group(&self, name: &str) -> Option<JobGroup> {
            self.job_groups.get(name).cloned()
        }
        fn run_job_grant(&self) -> &RunJobGrant {
            &self.grant
        }
    }

    fn node() -> Node {
        Node {
            procs: HashMap::from([
                (10, (1000, "/governor.slice/jobs/alice")),
                (20, (1001, "/governor.slice/jobs/bob")),
                (30, (1000, "/user.slice/session-1.scope")),
            ]),
            jobs: HashMap::from([("/governor.slice/jobs/bob", 1001)]),
            groups: HashMap::new(),
            limited: HashMap::new(),
            job_groups: HashMap::new(),
            grant: grant("any"),
        }
    }

    fn grant(setting: &str) -> RunJobGrant {
        let rule = crate::discovery::adopt::AdoptRule::parse(setting).unwrap();
        RunJobGrant {
            grant: rule
                .resolve(
                    |n| (n == "alice").then_some(1000),
                    |n| (n == "ml").then_some(500),
                )
                .0,
            setting: setting.into(),
            config_file: "/etc/governor/governor.toml".into(),
        }
    }

    fn join(name: &str) -> Request {
        Request::JoinJob { name: name.into() }
    }

    /// A caller whose own process is `pid` (as SO_PEERCRED reports it).
    fn calling(uid: u32, pid: u32) -> Peer {
        Peer {
            uid,
            gid: uid,
            pid: Some(pid),
        }
    }

    fn peer(uid: u32) -> Peer {
        Peer {
            uid,
            gid: uid,
            pid: Some(99),
        }
    }

    fn adopt(pid: u32, cgroup: &str) -> Request {
        Request::Adopt(AdoptJob {
            name: "j".into(),
            cgroup: cgroup.into(),
            logs: vec![],
            metric: None,
            format: None,
            pid,
            epochs: None,
            finish: None,
            sweep: None,
        })
    }

    #[test]
    fn status_for_anyone_reload_for_root() {
        let n = node();
        assert!(check(&Request::Status, None, &n).is_ok());
        assert!(check(&Request::Status, Some(&peer(1000)), &n).is_ok());
        assert!(check(&Request::Reload, Some(&peer(0)), &n).is_ok());
        assert!(check(&Request::Reload, Some(&peer(1000)), &n).is_err());
        assert!(check(&Request::Reload, None, &n).is_err());
    }

    #[test]
    fn a_user_adopts_only_their_own_process_in_the_cgroup_it_names() {
        let mut n = node();
        assert!(
            check(
                &adopt(10, "governor.slice/jobs/alice"),
                Some(&peer(1000)),
                &n
            )
            .is_ok()
        );
        let e = check(&adopt(20, "governor.slice/jobs/bob"), Some(&peer(1000)), &n).unwrap_err();
        assert!(e.contains("belongs to uid 1001"), "{e}");
        // Root may hand over anyone's, still only the process's own cgroup.
        assert!(check(&adopt(20, "governor.slice/jobs/bob"), Some(&peer(0)), &n).is_ok());
        let e = check(&adopt(20, "governor.slice/jobs/alice"), Some(&peer(0)), &n).unwrap_err();
        assert!(e.contains("is in /governor.slice/jobs/bob"), "{e}");
        // Below the cgroup named counts (a delegated group's user made a sub-group), a cgroup
        // whose name merely starts the same does not.
        n.procs
            .insert(11, (1000, "/governor.slice/jobs/alice/workers"));
        n.procs.insert(12, (1000, "/governor.slice/jobs/alice2"));
        assert!(
            check(
                &adopt(11, "governor.slice/jobs/alice"),
                Some(&peer(1000)),
                &n
            )
            .is_ok()
        );
        assert!(
            check(
                &adopt(12, "governor.slice/jobs/alice"),
                Some(&peer(1000)),
                &n
            )
            .is_err()
        );
        // Never a cgroup outside the governor's subtree (that would be adoption on request).
        let e = check(
            &adopt(30, "user.slice/session-1.scope"),
            Some(&peer(1000)),
            &n,
        )
        .unwrap_err();
        assert!(e.contains("not under the governor's job subtree"), "{e}");
        assert!(check(&adopt(77, "governor.slice/jobs/x"), Some(&peer(0)), &n).is_err());
    }

    #[test]
    fn a_user_releases_only_their_own_job() {
        let n = node();
        let bob = Request::Release {
            cgroup: "/governor.slice/jobs/bob".into(),
        };
        assert!(check(&bob, Some(&peer(1001)), &n).is_ok());
        assert!(check(&bob, Some(&peer(0)), &n).is_ok());
        assert!(check(&bob, Some(&peer(1000)), &n).is_err());
        assert!(check(&bob, None, &n).is_err());
    }

    #[test]
    fn a_user_the_operator_allows_places_their_own_process_in_a_free_job_name() {
        let mut n = node();
        // Process 30 is alice's (uid 1000) in her session.
        assert!(check(&join("train"), Some(&calling(1000, 30)), &n).is_ok());
        // Root always may, whatever [run_job] users says.
        n.grant = grant("none");
        n.procs.insert(40, (0, "/"));
        assert!(check(&join("train"), Some(&calling(0, 40)), &n).is_ok());
        let e = check(&join("train"), Some(&calling(1000, 30)), &n).unwrap_err();
        assert!(
            e.contains("uid 1000 may not start jobs on this node")
                && e.contains("ask the operator to allow you in [run_job] users")
                && e.contains("\"none\"")
                && e.contains("/etc/governor/governor.toml"),
            "{e}"
        );
        // A list: by user name, or by a group the process holds (primary or supplementary).
        n.grant = grant("user:alice");
        assert!(check(&join("train"), Some(&calling(1000, 30)), &n).is_ok());
        n.grant = grant("group:ml");
        assert!(check(&join("train"), Some(&calling(1000, 30)), &n).is_err());
        n.groups.insert(30, vec![27, 500]);
        assert!(check(&join("train"), Some(&calling(1000, 30)), &n).is_ok());
        let mut in_ml = calling(1000, 30);
        in_ml.gid = 500;
        n.groups.clear();
        assert!(check(&join("train"), Some(&in_ml), &n).is_ok());
    }

    #[test]
    fn join_moves_only_the_caller_itself_and_never_out_of_a_limit() {
        let mut n = node();
        // No pid from the kernel, no credentials: nothing to place.
        let mut unknown = calling(1000, 30);
        unknown.pid = None;
        assert!(check(&join("j"), Some(&unknown), &n).is_err());
        assert!(check(&join("j"), None, &n).is_err());
        // The calling process must be the caller's (it ran a set-uid program since?) and live.
        let e = check(&join("j"), Some(&calling(1000, 20)), &n).unwrap_err();
        assert!(e.contains("belongs to uid 1001"), "{e}");
        assert!(check(&join("j"), Some(&calling(1000, 77)), &n).is_err());
        // A process under a CPU or memory limit stays there.
        n.limited
            .insert(30, "/sys/fs/cgroup/user.slice/cpu.max = 100000 100000");
        let e = check(&join("j"), Some(&calling(1000, 30)), &n).unwrap_err();
        assert!(
            e.contains("never moves a process out of a limit") && e.contains("cpu.max"),
            "{e}"
        );
        // Names that are no cgroup directory are refused before anything is looked up.
        n.limited.clear();
        for bad in ["", "..", "a/b", "../../sys", "cgroup.procs", ".hidden"] {
            assert!(
                check(&join(bad), Some(&calling(1000, 30)), &n).is_err(),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_job_name_in_use_or_left_by_someone_else_is_refused() {
        let mut n = node();
        let busy = |owner| JobGroup {
            owner,
            populated: true,
        };
        let left = |owner| JobGroup {
            owner,
            populated: false,
        };
        n.job_groups.insert("bobs", busy(1001));
        let e = check(&join("bobs"), Some(&calling(1000, 30)), &n).unwrap_err();
        assert!(
            e.contains("in use by a job of uid 1001") && e.contains("choose another --name"),
            "{e}"
        );
        // Not even root takes a running job's group.
        n.procs.insert(40, (0, "/"));
        assert!(check(&join("bobs"), Some(&calling(0, 40)), &n).is_err());
        n.job_groups.insert("mine", busy(1000));
        let e = check(&join("mine"), Some(&calling(1000, 30)), &n).unwrap_err();
        assert!(e.contains("another job of yours"), "{e}");
        // An empty group: reused by the user it belongs to, refused to anyone else (root's
        // run-job creates its group before its process joins it).
        n.job_groups.insert("old", left(1000));
        assert!(check(&join("old"), Some(&calling(1000, 30)), &n).is_ok());
        n.job_groups.insert("roots", left(0));
        let e = check(&join("roots"), Some(&calling(1000, 30)), &n).unwrap_err();
        assert!(e.contains("belongs to uid 0"), "{e}");
        assert!(check(&join("roots"), Some(&calling(0, 40)), &n).is_ok());
    }
}
