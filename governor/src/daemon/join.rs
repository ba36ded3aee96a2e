//! `join_job`: jobs started with `governor run-job` by users who are not root.
//!
//! Only root may create a cgroup under the governor's job subtree or move a process into one,
//! so a user's `run-job` asks the daemon, and the request comes from the job's own process:
//!
//! 1. `run-job` prepares the request bytes and the socket's address, then forks; the child,
//!    between fork and exec (async-signal-safe calls only: `socket`, `connect`, `write`,
//!    `read`; `crate::sys::ask_before_exec`), connects to the control socket and sends
//!    `{"request":"join_job","name":"<name>"}`;
//! 2. the daemon checks the caller ([`super::access`]: `[run_job] users`, the name free, no CPU
//!    or memory limit left behind), creates `governor.slice/jobs/<name>`, carries the caller's
//!    task bound (`pids.max`) onto it, delegates it to the caller's uid (cgroup v2 only; see
//!    [`crate::cgroup::delegation`] for what that gives) and moves **the process the kernel
//!    names as the caller** (`SO_PEERCRED`) into it;
//! 3. the child execs the command only after the daemon's yes; a refusal ends it with the
//!    daemon's reason, which `run-job` prints as one line.
//!
//! `run-job` then hands the job over (`adopt`) and reports its end (`release`) as root's does.
//! The daemon removes the group once no process is left in it (its user cannot: the subtree
//! is root's): on that report, at the next tick when the report never comes, and after a
//! restart (a delegated group's directory is its user's, see `Discovery::find_joined`).
//!
//! Why this way:
//! - the daemon must make the move: cgroup v2 lets a process move only with write access to
//!   the `cgroup.procs` of the common ancestor of both groups (here the root cgroup's), so
//!   even a user who owned the job's group could not move its process in from its session;
//! - the process moved is the caller itself, never a pid the request names: a client naming a
//!   pid could have another process moved (another user's, or one out of a limit). The caller
//!   waits for the answer, so its pid cannot be reused meanwhile; the daemon still checks that
//!   the process is the caller's user's;
//! - joining before exec keeps the guarantee root's `run-job` gives: the job runs no
//!   instruction outside its group and forks nothing that could stay behind;
//! - the daemon does not start the job itself: the job stays the user's process, the child of
//!   their `run-job`, in their session, with their environment, terminal and signals.

use tracing::{info, warn};

use super::Shell;
use crate::cgroup::CgroupError;
use crate::control::{Peer, Response};

impl Shell {
    /// Create (or reuse) the job group `name` for the caller, and move the caller into it.
    /// `access::check` has allowed the request.
    pub(super) fn join_job(&mut self, peer: &Peer, name: &str) -> Response {
        let Some(pid) = peer.pid else {
            return Response::Error {
                message: "the kernel did not tell which process is calling".into(),
            };
        };
        let actuator = self.core.actuator();
        let fs = actuator.fs();
        // Where the process is now: the task bound it is under goes with it.
        let origins = fs.process_dirs(pid);
        let group = match actuator.create_job_group(name) {
            Ok(g) => g,
            Err(e) => {
                warn!(job = name, pid, uid = peer.uid, error = %e, "cannot create a user's job cgroup");
                return Response::Error {
                    message: format!("cannot create the job's cgroup: {e}"),
                };
            }
        };
        let placed = (|| -> Result<Option<u64>, CgroupError> {
            let ceiling = origins.as_deref().and_then(|o| fs.pids_ceiling(o));
            if let Some(max) = ceiling {
                fs.set_pids_max(&group, max)?;
            }
            fs.delegate_job_group(&group, peer.uid)?;
            fs.add_process(&group, pid)?;
            Ok(ceiling)
        })();
        match placed {
            Ok(pids_max) => {
                info!(job = %group, pid, uid = peer.uid, pids_max, "a user's job process joined its cgroup");
                self.discovery.note_joined(group.clone(), peer.uid);
                Response::Ok {
                    message: format!("joined {group}"),
                }
            }
            Err(e) => {
                warn!(job = %group, pid, uid = peer.uid, error = %e, "cannot place a user's job in its cgroup");
                if !fs.populated(&group) {
                    let _ = fs.remove_job_group(&group);
                }
                Response::Error {
                    message: format!("cannot place the job in {group}: {e}"),
                }
            }
        }
    }
}
