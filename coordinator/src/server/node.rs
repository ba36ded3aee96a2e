//! The node service: one `Session` stream per node.

use std::pin::Pin;

use governor_proto::node::NodeMessage;
use governor_proto::pb;
use governor_proto::pb::node_service_server::NodeService;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};
use tracing::{info, warn};

use super::actor::{Coordinator, SESSION_QUEUE};
use super::auth::{self, Method};
use crate::state::SessionError;

pub(super) struct NodeSvc {
    coordinator: Coordinator,
    secure: bool,
}

impl NodeSvc {
    pub(super) fn new(coordinator: Coordinator, secure: bool) -> Self {
        NodeSvc {
            coordinator,
            secure,
        }
    }
}

type CommandStream = Pin<Box<dyn Stream<Item = Result<pb::CoordinatorMessage, Status>> + Send>>;

#[tonic::async_trait]
impl NodeService for NodeSvc {
    type SessionStream = CommandStream;

    async fn session(
        &self,
        request: Request<Streaming<pb::NodeMessage>>,
    ) -> Result<Response<Self::SessionStream>, Status> {
        let address = request
            .remote_addr()
            .map(|a| a.to_string())
            .unwrap_or_default();
        // Only a node certificate may open a session; refused before the hello is read.
        let secure = self.secure;
        let peer = auth::authorize(secure, &request, Method::NodeSession)?;
        let mut inbound = request.into_inner();
        let first = inbound
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("the stream ended before the node's hello"))?;
        let hello = match NodeMessage::try_from(first)? {
            NodeMessage::Hello(h) => h,
            NodeMessage::Report(_) | NodeMessage::Chunk(_) | NodeMessage::Output(_) => {
                return Err(Status::failed_precondition(
                    "the first message of a session must be a hello (registration)",
                ));
            }
        };
        auth::require_own_node(secure, peer.as_ref(), &hello.node_name)?;
        let node = hello.node_name.clone();
        let (tx, rx) = mpsc::channel(SESSION_QUEUE);
        let welcome = self
            .coordinator
            .hello(hello, address.clone(), tx.clone())
            .await?;
        let session = welcome.session_id;
        info!(%node, %address, session, "session opened");
        let coordinator = self.coordinator.clone();
        tokio::spawn(async move {
            loop {
                let msg = match inbound.message().await {
                    Ok(Some(m)) => m,
                    Ok(None) => break,
                    Err(status) => {
                        info!(%node, session, error = %status.message(), "session stream failed");
                        break;
                    }
                };
                let report = match NodeMessage::try_from(msg) {
                    Ok(NodeMessage::Report(r)) => r,
                    Ok(NodeMessage::Chunk(c)) => {
                        coordinator.chunk(node.clone(), session, c).await;
                        continue;
                    }
                    Ok(NodeMessage::Output(piece)) => {
                        coordinator.output(node.clone(), session, piece).await;
                        continue;
                    }
                    Ok(NodeMessage::Hello(_)) => {
                        let _ = tx
                            .send(Box::new(Err(Status::failed_precondition(
                                "hello sent twice in one session",
                            ))))
                            .await;
                        break;
                    }
                    Err(invalid) => {
                        warn!(%node, session, error = %invalid, "invalid report; closing the session");
                        let _ = tx.send(Box::new(Err(invalid.into()))).await;
                        break;
                    }
                };
                match coordinator.report(node.clone(), session, report).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e @ SessionError::Stale { .. }))
                    | Ok(Err(e @ SessionError::NotRegistered { .. })) => {
                        let _ = tx.send(Box::new(Err(Status::aborted(e.to_string())))).await;
                        break;
                    }
                    Err(_) => break,
                }
            }
            coordinator.disconnected(node.clone(), session).await;
            info!(%node, session, "session closed");
        });
        Ok(Response::new(Box::pin(
            ReceiverStream::new(rx).map(|item| *item),
        )))
    }
}
