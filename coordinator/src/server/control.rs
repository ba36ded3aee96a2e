//! The control service: what govctl asks.

use std::pin::Pin;
use std::time::Duration;

use governor_proto::control::JobSpec;
use governor_proto::pb;
use governor_proto::pb::control_service_server::ControlService;
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::actor::{Coordinator, OutputRead};
use super::auth::{self, Method};
use crate::state::ControlError;

pub(super) struct ControlSvc {
    coordinator: Coordinator,
    secure: bool,
}

impl ControlSvc {
    pub(super) fn new(coordinator: Coordinator, secure: bool) -> Self {
        ControlSvc {
            coordinator,
            secure,
        }
    }

    /// Refuse a caller whose certificate's role may not call `method` (see `auth`).
    fn authorize<T>(&self, request: &Request<T>, method: Method) -> Result<(), Status> {
        auth::authorize(self.secure, request, method).map(drop)
    }
}

fn control_status(e: ControlError) -> Status {
    match e {
        ControlError::NoSuchJob { .. } => Status::not_found(e.to_string()),
        ControlError::AlreadyFinished { .. }
        | ControlError::LocalJob { .. }
        | ControlError::NoOutput { .. } => Status::failed_precondition(e.to_string()),
        ControlError::UnknownPolicy(_) => Status::invalid_argument(e.to_string()),
        ControlError::Move(crate::state::MoveError::NoSuchNode { .. }) => {
            Status::not_found(e.to_string())
        }
        ControlError::Move(_) => Status::failed_precondition(e.to_string()),
    }
}

/// How long a node may take to answer a read of a job's output.
const OUTPUT_ANSWER: Duration = Duration::from_secs(10);
/// How often a followed job's output is looked at again once all of it has been sent.
const OUTPUT_POLL: Duration = Duration::from_millis(500);

type OutputStream = Pin<Box<dyn Stream<Item = Result<pb::JobOutputChunk, Status>> + Send>>;

/// Stream a job's output to `out` (see `JobOutput` in the proto): piece after piece from its
/// node until its end, then, with `follow`, what it writes next until the job ends. A job that
/// moves is followed to its new node, whose output file starts at 0.
async fn stream_output(
    coordinator: Coordinator,
    request: pb::JobOutputRequest,
    out: mpsc::Sender<Result<pb::JobOutputChunk, Status>>,
) {
    let pb::JobOutputRequest {
        job_id,
        replica,
        follow,
        tail_bytes,
    } = request;
    // (offset, from_end) of the next read.
    let mut next = tail_bytes.map_or((0, false), |t| (t, true));
    let mut node_now: Option<String> = None;
    loop {
        let read = read_once(&coordinator, &job_id, replica, next, None).await;
        let wait = match read {
            Err(status) => {
                let _ = out.send(Err(status)).await;
                return;
            }
            Ok(OutputRead::NotPlaced) if follow => true,
            Ok(OutputRead::NotPlaced) => {
                let _ = out
                    .send(Err(Status::failed_precondition(format!(
                        "job {job_id} is queued and has no output yet (--follow waits for it)"
                    ))))
                    .await;
                return;
            }
            // A running job's node that reconnects (a daemon restart) is waited for.
            Ok(OutputRead::NodeAway {
                finished: false, ..
            }) if follow => true,
            Ok(OutputRead::NodeAway { node, .. }) => {
                let _ = out
                    .send(Err(Status::unavailable(format!(
                        "node {node} of job {job_id} is not connected; its output cannot be read now"
                    ))))
                    .await;
                return;
            }
            Ok(OutputRead::Piece {
                node,
                finished,
                piece,
            }) => {
                if let Some(left) = node_now.take().filter(|n| *n != node) {
                    // It moved: the rest of what it wrote where it was, then the new node's
                    // file from its start.
                    if !drain(&coordinator, &job_id, replica, &left, next.0, &out).await {
                        return;
                    }
                    node_now = Some(node);
                    next = (0, false);
                    continue;
                }
                node_now = Some(node.clone());
                if !piece.error.is_empty() {
                    // A job just placed may not have its file yet.
                    if follow && !finished {
                        tokio::time::sleep(OUTPUT_POLL).await;
                        continue;
                    }
                    let _ = out.send(Err(Status::not_found(piece.error))).await;
                    return;
                }
                let end = piece.offset + piece.data.len() as u64;
                if !piece.data.is_empty() {
                    let chunk = pb::JobOutputChunk {
                        data: piece.data,
                        node,
                        offset: piece.offset,
                        size: piece.size,
                    };
                    if out.send(Ok(chunk)).await.is_err() {
                        return; // the client went away
                    }
                }
                next = (end, false);
                if end < piece.size {
                    continue;
                }
                if !follow || finished {
                    return;
                }
                true
            }
        };
        if wait {
            tokio::select! {
                _ = tokio::time::sleep(OUTPUT_POLL) => {}
                _ = out.closed() => return,
            }
        }
    }
}

/// One read through the actor, its wait for the node bounded.
async fn read_once(
    coordinator: &Coordinator,
    job_id: &str,
    replica: u32,
    (offset, from_end): (u64, bool),
    on_node: Option<String>,
) -> Result<OutputRead, Status> {
    let read = tokio::time::timeout(
        OUTPUT_ANSWER,
        coordinator.read_output(job_id.to_owned(), replica, offset, from_end, on_node),
    )
    .await;
    match read {
        Err(_) => Err(Status::unavailable(format!(
            "the node of job {job_id} did not answer within {} s",
            OUTPUT_ANSWER.as_secs()
        ))),
        Ok(Err(status)) => Err(status),
        Ok(Ok(Err(e))) => Err(control_status(e)),
        Ok(Ok(Ok(read))) => Ok(read),
    }
}

/// Send what a job wrote on the node it left, from `offset` to the end of that file (best
/// effort: a node that is gone or cannot read it ends the drain). False: the client went away.
async fn drain(
    coordinator: &Coordinator,
    job_id: &str,
    replica: u32,
    node: &str,
    mut offset: u64,
    out: &mpsc::Sender<Result<pb::JobOutputChunk, Status>>,
) -> bool {
    loop {
        let read = read_once(
            coordinator,
            job_id,
            replica,
            (offset, false),
            Some(node.to_owned()),
        )
        .await;
        let Ok(OutputRead::Piece { piece, .. }) = read else {
            return true;
        };
        if !piece.error.is_empty() || piece.data.is_empty() {
            return true;
        }
        let end = piece.offset + piece.data.len() as u64;
        let chunk = pb::JobOutputChunk {
            data: piece.data,
            node: node.to_owned(),
            offset: piece.offset,
            size: piece.size,
        };
        if out.send(Ok(chunk)).await.is_err() {
            return false;
        }
        if end >= piece.size {
            return true;
        }
        offset = end;
    }
}

#[tonic::async_trait]
impl ControlService for ControlSvc {
    type JobOutputStream = OutputStream;

    async fn job_output(
        &self,
        request: Request<pb::JobOutputRequest>,
    ) -> Result<Response<Self::JobOutputStream>, Status> {
        self.authorize(&request, Method::JobOutput)?;
        let request = request.into_inner();
        if request.job_id.trim().is_empty() {
            return Err(Status::invalid_argument(
                "invalid job_id: must not be empty",
            ));
        }
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(stream_output(self.coordinator.clone(), request, tx));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn submit_job(
        &self,
        request: Request<pb::SubmitJobRequest>,
    ) -> Result<Response<pb::SubmitJobResponse>, Status> {
        self.authorize(&request, Method::SubmitJob)?;
        let spec = request
            .into_inner()
            .spec
            .ok_or_else(|| Status::invalid_argument("invalid spec: is missing"))?;
        let spec = JobSpec::try_from(spec).map_err(|e| Status::from(e.within("spec")))?;
        let job = self.coordinator.submit(spec).await?;
        Ok(Response::new(pb::SubmitJobResponse {
            job: Some(job.into()),
        }))
    }

    async fn cancel_job(
        &self,
        request: Request<pb::CancelJobRequest>,
    ) -> Result<Response<pb::CancelJobResponse>, Status> {
        self.authorize(&request, Method::CancelJob)?;
        let id = request.into_inner().job_id;
        let job = self.coordinator.cancel(id).await?.map_err(control_status)?;
        Ok(Response::new(pb::CancelJobResponse {
            job: Some(job.into()),
        }))
    }

    async fn move_job(
        &self,
        request: Request<pb::MoveJobRequest>,
    ) -> Result<Response<pb::MoveJobResponse>, Status> {
        self.authorize(&request, Method::MoveJob)?;
        let r = request.into_inner();
        let moved = self
            .coordinator
            .move_job(r.job_id, r.target_node.filter(|t| !t.is_empty()))
            .await?
            .map_err(control_status)?;
        Ok(Response::new(pb::MoveJobResponse {
            r#move: Some(moved.into()),
        }))
    }

    async fn list_nodes(
        &self,
        request: Request<pb::ListNodesRequest>,
    ) -> Result<Response<pb::ListNodesResponse>, Status> {
        self.authorize(&request, Method::ListNodes)?;
        let nodes = self.coordinator.nodes().await?;
        Ok(Response::new(pb::ListNodesResponse {
            nodes: nodes.into_iter().map(Into::into).collect(),
        }))
    }

    async fn list_jobs(
        &self,
        request: Request<pb::ListJobsRequest>,
    ) -> Result<Response<pb::ListJobsResponse>, Status> {
        self.authorize(&request, Method::ListJobs)?;
        let jobs = self.coordinator.jobs(request.into_inner().all).await?;
        Ok(Response::new(pb::ListJobsResponse {
            jobs: jobs.into_iter().map(Into::into).collect(),
        }))
    }

    async fn get_job(
        &self,
        request: Request<pb::GetJobRequest>,
    ) -> Result<Response<pb::GetJobResponse>, Status> {
        self.authorize(&request, Method::GetJob)?;
        let job = self
            .coordinator
            .job(request.into_inner().job_id)
            .await?
            .map_err(control_status)?;
        Ok(Response::new(pb::GetJobResponse {
            job: Some(job.into()),
        }))
    }

    async fn get_policy(
        &self,
        request: Request<pb::GetPolicyRequest>,
    ) -> Result<Response<pb::PolicyResponse>, Status> {
        self.authorize(&request, Method::GetPolicy)?;
        Ok(Response::new(self.coordinator.policy().await?.into()))
    }

    async fn set_policy(
        &self,
        request: Request<pb::SetPolicyRequest>,
    ) -> Result<Response<pb::PolicyResponse>, Status> {
        self.authorize(&request, Method::SetPolicy)?;
        let state = self
            .coordinator
            .set_policy(request.into_inner().name)
            .await?
            .map_err(control_status)?;
        Ok(Response::new(state.into()))
    }

    async fn get_stats(
        &self,
        request: Request<pb::GetStatsRequest>,
    ) -> Result<Response<pb::StatsResponse>, Status> {
        self.authorize(&request, Method::GetStats)?;
        Ok(Response::new(self.coordinator.stats().await?.into()))
    }
}
