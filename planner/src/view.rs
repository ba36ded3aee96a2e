//! The placement view: a per-node snapshot the placement policies read, kept in name order and
//! re-synced only for the nodes a report changed.

use std::collections::{BTreeSet, HashMap};

use governor_proto::control::NodeState;
use governor_proto::node::JobOrigin;

use governor_placement::queue::member_id;
use governor_placement::{GpuView, JobRequest, JobView, NodeView};

use super::{ClusterState, JobRecord, local_id};

impl ClusterState {
    pub(super) fn rebuild_view(&mut self) {
        let names: Vec<String> = self.nodes.keys().cloned().collect();
        self.view.nodes = names
            .iter()
            .map(|n| NodeView::new(n.clone(), 1.0, 0))
            .collect();
        self.view_index = names
            .iter()
            .enumerate()
            .map(|(i, n)| (n.clone(), i))
            .collect();
        for n in names {
            self.sync_view(&n);
        }
    }

    /// Add a newly registered node to the view at its place in name order. Shifting the later
    /// entries is a memmove and an index update each; rebuilding the whole view here instead
    /// made registering N nodes cost O(N²) node syncs (10,000 nodes never finished registering
    /// in the load benchmark).
    pub(super) fn insert_into_view(&mut self, name: &str) {
        let at = self.view.nodes.partition_point(|n| n.name.as_str() < name);
        self.view
            .nodes
            .insert(at, NodeView::new(name.to_owned(), 1.0, 0));
        for (i, n) in self.view.nodes.iter().enumerate().skip(at) {
            if let Some(slot) = self.view_index.get_mut(&n.name) {
                *slot = i;
            }
        }
        self.view_index.insert(name.to_owned(), at);
        self.sync_view(name);
    }

    /// Rebuild one node's view from its latest report and the coordinator's placements there.
    pub(super) fn sync_view(&mut self, name: &str) {
        let on_node = self.jobs_on(name);
        let (Some(node), Some(&i)) = (self.nodes.get(name), self.view_index.get(name)) else {
            return;
        };
        let mut jobs: Vec<JobView> = Vec::new();
        let mut assigned: BTreeSet<u32> = BTreeSet::new();
        let mut reported: BTreeSet<(String, u32)> = BTreeSet::new();
        for r in &node.report.jobs {
            if r.state.is_finished() {
                continue;
            }
            let (id, replicas) = match r.origin {
                JobOrigin::Local => (local_id(name, &r.job_id), 1),
                // Still running there, whatever we think of it: it holds resources.
                JobOrigin::Coordinator => (
                    r.job_id.clone(),
                    self.jobs.get(&r.job_id).map_or(1, JobRecord::replicas),
                ),
            };
            reported.insert((id.clone(), r.replica));
            assigned.extend(r.gpu_indices.iter().copied());
            let requested = self.jobs.get(&id).and_then(|j| j.spec.as_ref());
            jobs.push(JobView {
                id: member_id(&id, r.replica, replicas),
                category: r.category,
                pending: false,
                growth: r.growth,
                growth_efficiency: r.growth_efficiency,
                cpu_cores: r.cpu_cores,
                memory_bytes: r.memory_bytes,
                requested_cores: self.jobs.get(&id).and_then(JobRecord::cores),
                requested_memory_bytes: requested.and_then(|s| s.memory_bytes),
                epoch: r.epoch,
                max_epochs: r.max_epochs,
                epoch_seconds: r.epoch_seconds,
            });
        }
        // Placements not reported yet (and members of jobs whose node is down: they still hold
        // their resources in case the job is running).
        for id in on_node {
            let Some(job) = self.jobs.get(&id).filter(|j| !j.is_local()) else {
                continue;
            };
            for m in job
                .members
                .iter()
                .filter(|m| m.node == name && !m.state.is_finished())
            {
                if reported.contains(&(job.id.clone(), m.replica)) {
                    continue;
                }
                assigned.extend(m.gpus.iter().copied());
                let spec = job.spec.as_ref().expect("not local");
                let request = JobRequest {
                    id: member_id(&job.id, m.replica, spec.replicas),
                    gpus: spec.gpus,
                    cores: job.cores(),
                    memory_bytes: spec.memory_bytes,
                    priority: spec.priority,
                    avoid: Vec::new(),
                };
                jobs.push(JobView::pending(request.id.clone(), &request));
            }
        }
        let usage: HashMap<u32, u64> = node
            .report
            .gpus
            .iter()
            .map(|g| (g.index, g.memory_used_bytes))
            .collect();
        let mut view = NodeView::new(
            name,
            node.record.capacity.cores,
            node.record.capacity.memory_bytes,
        );
        view.schedulable = node.status == NodeState::Ready && node.session.is_some();
        view.gpus = node
            .record
            .capacity
            .gpus
            .iter()
            .map(|g| GpuView {
                index: g.index,
                model: g.model.clone(),
                memory_bytes: g.memory_bytes,
                assigned: assigned.contains(&g.index),
                memory_used_bytes: usage.get(&g.index).copied().unwrap_or(0),
            })
            .collect();
        view.cpu_used_cores = node.report.cpu_used_cores;
        view.memory_used_bytes = node.report.memory_used_bytes;
        view.set_jobs(jobs);
        self.view.nodes[i] = view;
    }
}
