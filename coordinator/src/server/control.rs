//! The control service: what govctl asks.

use governor_proto::control::JobSpec;
use governor_proto::pb;
use governor_proto::pb::control_service_server::ControlService;
use tonic::{Request, Response, Status};

use super::actor::Coordinator;
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
        ControlError::AlreadyFinished { .. } | ControlError::LocalJob { .. } => {
            Status::failed_precondition(e.to_string())
        }
        ControlError::UnknownPolicy(_) => Status::invalid_argument(e.to_string()),
        ControlError::Move(crate::state::MoveError::NoSuchNode { .. }) => {
            Status::not_found(e.to_string())
        }
        ControlError::Move(_) => Status::failed_precondition(e.to_string()),
    }
}

#[tonic::async_trait]
impl ControlService for ControlSvc {
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

    async fn migrate_job(
        &self,
        request: Request<pb::MigrateJobRequest>,
    ) -> Result<Response<pb::MigrateJobResponse>, Status> {
        self.authorize(&request, Method::MigrateJob)?;
        let r = request.into_inner();
        let moved = self
            .coordinator
            .migrate(r.job_id, r.target_node.filter(|t| !t.is_empty()))
            .await?
            .map_err(control_status)?;
        Ok(Response::new(pb::MigrateJobResponse {
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
