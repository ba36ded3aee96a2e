//! The planner's one entry point for its drivers: an [`Input`] (what happened, at `now`) in,
//! an [`Answer`] back, node commands in the outbox. The coordinator's server and govsim both
//! feed every event through [`ClusterState::handle`], so the same event trace gives the same
//! decisions under either driver (`sim`'s same-trace test replays a simulated run's trace).

use governor_placement::queue::Seconds;
use governor_proto::control::{JobMove, JobSpec, JobSummary};
use governor_proto::node::{Hello, NodeReport, Welcome};
use serde::{Deserialize, Serialize};

use super::{ClusterState, ControlError, SessionError};

/// Something that happened to the cluster, as the planner's drivers see it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Input {
    /// A node opened a session.
    Hello { hello: Hello, address: String },
    /// A node's report on its session.
    Report {
        node: String,
        session: u64,
        report: NodeReport,
    },
    /// A node's session ended.
    Disconnected { node: String, session: u64 },
    /// A job was submitted.
    Submit(JobSpec),
    /// An operator cancels a job.
    Cancel { id: String },
    /// An operator moves a job (to `target`, or where the planner picks).
    Move {
        id: String,
        target: Option<String>,
        reason: String,
    },
    /// A checkpoint a node uploaded arrived whole (`Ok(bytes)`) or not.
    CheckpointArrived {
        id: String,
        node: String,
        result: Result<u64, String>,
    },
    /// Time passed (the coordinator's once-a-second tick).
    Tick,
}

/// What the planner answers to an [`Input`]; commands for nodes go to the outbox.
#[derive(Debug)]
pub enum Answer {
    Welcome(Welcome),
    Report(Result<(), SessionError>),
    Job(JobSummary),
    Cancelled(Result<JobSummary, ControlError>),
    Moved(Result<JobMove, ControlError>),
    /// Nothing to answer (a tick, a disconnection, a checkpoint).
    Done,
}

impl ClusterState {
    /// Handle one input at `now`, with the admission rounds each kind of input calls for: a
    /// node that joins or a report that freed capacity is followed by a round, as is every
    /// submission and tick.
    pub fn handle(&mut self, now: Seconds, input: Input) -> Answer {
        match input {
            Input::Hello { hello, address } => {
                let welcome = self.register(now, hello, address);
                self.dispatch(now);
                Answer::Welcome(welcome)
            }
            Input::Report {
                node,
                session,
                report,
            } => {
                let result = self.report(now, &node, session, report);
                if result.is_ok() {
                    self.dispatch_if_needed(now);
                }
                Answer::Report(result)
            }
            Input::Disconnected { node, session } => {
                self.disconnected(&node, session);
                Answer::Done
            }
            Input::Submit(spec) => Answer::Job(self.submit(now, spec)),
            Input::Cancel { id } => Answer::Cancelled(self.cancel(now, &id)),
            Input::Move { id, target, reason } => {
                Answer::Moved(self.move_job(now, &id, target.as_deref(), &reason))
            }
            Input::CheckpointArrived { id, node, result } => {
                self.checkpoint_arrived(now, &id, &node, result);
                Answer::Done
            }
            Input::Tick => {
                self.tick(now);
                Answer::Done
            }
        }
    }
}
