//! Control requests (`governor status`, `reload`, `adopt`, `release`, `join_job`): checked
//! against the caller ([`access`]) and answered from the loop.

use std::path::Path;
use std::time::Instant;

use tracing::warn;

use super::job_sources::Discovery;
use super::node_core::CoreShell;
use super::{Shell, access};
use crate::cgroup::JobCgroup;
use crate::control::{Peer, PendingRequest, Request, Response};

/// `governor status`: the core's view, with each GPU and each job's GPU use.
pub(super) fn status_with_gpus(
    core: &CoreShell,
    gpu: Option<&crate::gpu::governance::GpuGovernor>,
    now: Instant,
) -> governor_proto::control_socket::NodeStatus {
    let mut status = core.status(now);
    if let Some(g) = gpu {
        status.gpus = g.status().to_vec();
        for j in &mut status.jobs {
            if let Some(u) = g.job(&j.name) {
                j.gpus.clone_from(&u.gpus);
                j.gpu_memory_bytes = Some(u.memory_bytes);
                j.gpu_energy_joules = Some(u.energy_joules);
                j.gpu_utilization_percent = Some(u.utilization_percent);
                j.gpu_power_watts = Some(u.power_watts);
            }
        }
    }
    status
}

impl Shell {
    pub(super) async fn on_request(&mut self, now: Instant, req: PendingRequest) {
        let facts = RequestFacts {
            discovery: &self.discovery,
            fs: self.core.actuator().fs(),
            subtree: &self.core.actuator().config().jobs_subtree,
        };
        if let Err(message) = access::check(&req.request, req.peer.as_ref(), &facts) {
            warn!(peer = ?req.peer, request = ?req.request, reason = %message, "control request refused");
            let _ = req.reply.send(Response::Error { message });
            return;
        }
        let response = match req.request {
            Request::Status => Response::Status(Box::new(status_with_gpus(
                &self.core,
                self.gpu.as_ref(),
                now,
            ))),
            Request::Reload => {
                self.reload(now).await;
                Response::Ok {
                    message: "configuration reloaded".into(),
                }
            }
            Request::Adopt(job) => match self.discovery.adopt_launched(&self.core, &job) {
                Ok(found) => {
                    let name = found.job.name.clone();
                    self.start_jobs(now, vec![found]).await;
                    self.core.decide_and_apply(now);
                    Response::Ok {
                        message: format!("governing {name}"),
                    }
                }
                Err(e) => Response::Error { message: e },
            },
            Request::Release { cgroup } => match JobCgroup::new(cgroup.trim_start_matches('/')) {
                Ok(c) => {
                    self.note_users_group(req.peer.as_ref(), &c);
                    let governed = self.core.contains(&c);
                    if governed {
                        self.stop_job(now, &c, "run-job reported its end").await;
                    }
                    let removed = !self
                        .discovery
                        .remove_ended_groups(&self.core, Some(&c))
                        .is_empty();
                    let message = match (governed, removed) {
                        (true, false) => format!("released {cgroup}"),
                        (true, true) => format!("released {cgroup}; its cgroup removed"),
                        (false, false) => format!("{cgroup} was not governed"),
                        (false, true) => format!("{cgroup} was not governed; its cgroup removed"),
                    };
                    Response::Ok { message }
                }
                Err(e) => Response::Error {
                    message: e.to_string(),
                },
            },
            Request::JoinJob { name } => match req.peer.as_ref() {
                Some(peer) => self.join_job(peer, &name),
                None => Response::Error {
                    message: "the caller's credentials are unknown".into(),
                },
            },
        };
        let _ = req.reply.send(response);
    }
    /// A non-root user reports the end of a job of theirs in the governor's job subtree: the
    /// group is theirs to have removed (also one a previous run of the daemon made for them on a
    /// node without a cgroup v2 tree, where nothing on disk tells).
    fn note_users_group(&mut self, peer: Option<&Peer>, group: &JobCgroup) {
        let Some(peer) = peer.filter(|p| p.uid != 0) else {
            return;
        };
        let subtree = &self.core.actuator().config().jobs_subtree;
        if group.relative().parent() == Some(subtree.as_path())
            && self.discovery.job_owner(&group.to_string()) == Some(peer.uid)
        {
            self.discovery.note_joined(group.clone(), peer.uid);
        }
    }
}

/// What [`access::check`] needs, from discovery and the cgroup filesystem.
struct RequestFacts<'a> {
    discovery: &'a Discovery,
    fs: &'a crate::cgroup::CgroupFs,
    /// The job subtree, relative to the cgroup root (`governor.slice/jobs`).
    subtree: &'a Path,
}

impl access::Facts for RequestFacts<'_> {
    fn process_owner(&self, pid: u32) -> Option<u32> {
        self.discovery.process_owner(pid)
    }
    fn process_cgroup(&self, pid: u32) -> Option<String> {
        self.discovery.process_cgroup(pid)
    }
    fn job_owner(&self, cgroup: &str) -> Option<u32> {
        self.discovery.job_owner(cgroup)
    }
    fn job_subtree(&self) -> String {
        format!("/{}", self.subtree.display())
    }
    fn process_groups(&self, pid: u32) -> Vec<u32> {
        self.discovery.process_groups(pid)
    }
    fn process_limit(&self, pid: u32) -> Option<String> {
        let dirs = self.fs.process_dirs(pid)?;
        self.fs.cpu_or_memory_limit_on(&dirs)
    }
    fn job_group(&self, name: &str) -> Option<access::JobGroup> {
        let group = JobCgroup::new(self.subtree.join(name)).ok()?;
        if !self.fs.job_dirs(&group).first().is_some_and(|d| d.is_dir()) {
            return None;
        }
        let owner = self
            .discovery
            .job_owner(&group.to_string())
            .or_else(|| self.fs.delegated_to(&group))
            .unwrap_or(0);
        Some(access::JobGroup {
            owner,
            populated: self.fs.populated(&group),
        })
    }
    fn run_job_grant(&self) -> &access::RunJobGrant {
        self.discovery.run_job_grant()
    }
}
