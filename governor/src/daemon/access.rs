//! Who may do what through the control socket. The socket itself is mode 0660, owned by root
//! and the configured `socket_group`, so only root and that group can connect at all; every
//! request then carries the caller's credentials from `SO_PEERCRED` (the kernel's word, not the
//! client's), checked here:
//!
//! | request   | allowed to                                                                |
//! |-----------|---------------------------------------------------------------------------|
//! | `status`  | anyone who can connect                                                    |
//! | `reload`  | root                                                                      |
//! | `adopt`   | root, or the user who owns the process handed over; the process must be in |
//! |           | the cgroup named, and that cgroup under the governor's job subtree        |
//! | `release` | root, or the user whose job it is                                         |
//!
//! Changing the policy is done by editing the configuration and reloading (root). Pure: the
//! facts it needs (owners of processes and jobs) are passed in, so it is unit-tested.

use crate::control::{Peer, Request};

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
                Some(c) if c == cgroup => Ok(()),
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::AdoptJob;
    use std::collections::HashMap;

    struct Node {
        procs: HashMap<u32, (u32, &'static str)>,
        jobs: HashMap<&'static str, u32>,
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
    }

    fn node() -> Node {
        Node {
            procs: HashMap::from([
                (10, (1000, "/governor.slice/jobs/alice")),
                (20, (1001, "/governor.slice/jobs/bob")),
                (30, (1000, "/user.slice/session-1.scope")),
            ]),
            jobs: HashMap::from([("/governor.slice/jobs/bob", 1001)]),
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
        let n = node();
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
}
