//! The `ctxd.v1.ContextStore` RPCs: each parses (`parse`), calls the store, the engine or the
//! compaction workflow, and converts back.

use std::sync::Arc;

use tonic::{Request, Response, Status};
use tracing::instrument;

use super::reply::{self, Capped};
use super::{pb, status};
use crate::domain::{SessionId, Tenant};
use crate::limits::Limits;
use crate::store::{Scoped, Store};
use crate::workflow::Workflows;
use crate::workflow::compaction::Compactions;

#[derive(Clone)]
pub struct ContextStoreService {
    /// The use cases, and the state every door shares.
    pub(super) workflows: Workflows,
    pub(super) store: Store,
    pub(super) compactions: Arc<Compactions>,
    pub(super) limits: Limits,
    /// Ended at shutdown.
    pub(super) watchers: super::watch::Watchers,
}

impl ContextStoreService {
    pub fn new(workflows: Workflows) -> Self {
        Self {
            store: workflows.store.clone(),
            compactions: Arc::clone(&workflows.compactions),
            workflows,
            limits: Limits::default(),
            watchers: super::watch::Watchers::default(),
        }
    }

    /// Lets `tenant` at `session`, or answers exactly what an unknown session answers (the
    /// store's check, `Store::scope`): the only way to the store's session methods.
    pub(super) async fn scope(
        &self,
        tenant: &Tenant,
        session: SessionId,
    ) -> Result<Scoped, Status> {
        self.store.scope(tenant, session).await.map_err(status)
    }

    /// The part and response size limits (`Limits::max_part_bytes`, `max_response_bytes`).
    pub fn with_limits(self, limits: Limits) -> Self {
        Self { limits, ..self }
    }

    /// `message` as the reply, unless it is over the response size limit.
    pub(super) fn reply<T: Capped>(&self, message: T) -> Reply<T> {
        reply::capped(message, self.limits.max_response_bytes)
    }

    /// Refuses a write whose reply would be over the response size limit before it writes,
    /// so no write is ever followed by a reply the client cannot have.
    pub(super) fn reply_fits(&self, len: usize, field: &str, advice: &str) -> Result<(), Status> {
        let max = self.limits.max_response_bytes;
        if len > max {
            return Err(Status::resource_exhausted(format!(
                "{field}: {}",
                reply::too_big_message(len, max, advice)
            )));
        }
        Ok(())
    }
}

/// The tenant the request acts for, as the authentication layer set it; without API keys,
/// every caller is the one local tenant.
pub(super) fn tenant_of<T>(request: &Request<T>) -> Tenant {
    request
        .extensions()
        .get::<Tenant>()
        .cloned()
        .unwrap_or_else(Tenant::local)
}

pub(super) type Reply<T> = Result<Response<T>, Status>;

#[tonic::async_trait]
impl pb::context_store_server::ContextStore for ContextStoreService {
    #[instrument(skip_all)]
    async fn create_session(
        &self,
        request: Request<pb::CreateSessionRequest>,
    ) -> Reply<pb::Session> {
        self.new_session(request).await
    }

    #[instrument(skip_all)]
    async fn get_session(&self, request: Request<pb::GetSessionRequest>) -> Reply<pb::Session> {
        self.session(request).await
    }

    #[instrument(skip_all)]
    async fn list_sessions(
        &self,
        request: Request<pb::ListSessionsRequest>,
    ) -> Reply<pb::ListSessionsResponse> {
        self.sessions(request).await
    }

    #[instrument(skip_all)]
    async fn list_gateway_calls(
        &self,
        request: Request<pb::ListGatewayCallsRequest>,
    ) -> Reply<pb::ListGatewayCallsResponse> {
        self.gateway_calls(request).await
    }

    #[instrument(skip_all)]
    async fn append(&self, request: Request<pb::AppendRequest>) -> Reply<pb::AppendResponse> {
        self.append_nodes(request).await
    }

    type AppendStreamStream = super::append_stream::AppendStream;

    #[instrument(skip_all)]
    async fn append_stream(
        &self,
        request: Request<tonic::Streaming<pb::AppendRequest>>,
    ) -> Reply<Self::AppendStreamStream> {
        ContextStoreService::append_stream(self, request).await
    }

    #[instrument(skip_all)]
    async fn get_nodes(
        &self,
        request: Request<pb::GetNodesRequest>,
    ) -> Reply<pb::GetNodesResponse> {
        self.nodes(request).await
    }

    #[instrument(skip_all)]
    async fn log(&self, request: Request<pb::LogRequest>) -> Reply<pb::LogResponse> {
        self.node_log(request).await
    }

    #[instrument(skip_all)]
    async fn create_branch(&self, request: Request<pb::CreateBranchRequest>) -> Reply<pb::Branch> {
        self.new_branch(request).await
    }

    #[instrument(skip_all)]
    async fn reset_branch(&self, request: Request<pb::ResetBranchRequest>) -> Reply<pb::Branch> {
        self.move_branch(request).await
    }

    #[instrument(skip_all)]
    async fn list_branches(
        &self,
        request: Request<pb::ListBranchesRequest>,
    ) -> Reply<pb::ListBranchesResponse> {
        self.branches(request).await
    }

    #[instrument(skip_all)]
    async fn delete_branch(
        &self,
        request: Request<pb::DeleteBranchRequest>,
    ) -> Reply<pb::DeleteBranchResponse> {
        self.remove_branch(request).await
    }

    #[instrument(skip_all)]
    async fn render(&self, request: Request<pb::RenderRequest>) -> Reply<pb::RenderResponse> {
        self.render_branch(request).await
    }

    #[instrument(skip_all)]
    async fn context_stats(
        &self,
        request: Request<pb::ContextStatsRequest>,
    ) -> Reply<pb::ContextReport> {
        self.stats(request).await
    }

    #[instrument(skip_all)]
    async fn recall(&self, request: Request<pb::RecallRequest>) -> Reply<pb::RecallResponse> {
        self.recall_nodes(request).await
    }

    #[instrument(skip_all)]
    async fn recall_tool(
        &self,
        request: Request<pb::RecallToolRequest>,
    ) -> Reply<pb::RecallToolResponse> {
        self.recall_tool_specs(request).await
    }

    #[instrument(skip_all)]
    async fn prepare_compaction(
        &self,
        request: Request<pb::PrepareCompactionRequest>,
    ) -> Reply<pb::PrepareCompactionResponse> {
        self.prepare(request).await
    }

    #[instrument(skip_all)]
    async fn commit_summary(
        &self,
        request: Request<pb::CommitSummaryRequest>,
    ) -> Reply<pb::CompactionOutcome> {
        self.commit(request).await
    }

    #[instrument(skip_all)]
    async fn cancel_compaction(
        &self,
        request: Request<pb::CancelCompactionRequest>,
    ) -> Reply<pb::CancelCompactionResponse> {
        self.cancel(request).await
    }

    #[instrument(skip_all)]
    async fn list_summaries(
        &self,
        request: Request<pb::ListSummariesRequest>,
    ) -> Reply<pb::ListSummariesResponse> {
        self.summaries(request).await
    }

    #[instrument(skip_all)]
    async fn import_session(
        &self,
        request: Request<tonic::Streaming<pb::ImportChunk>>,
    ) -> Reply<pb::ImportSessionResponse> {
        self.import(request).await
    }

    #[instrument(skip_all)]
    async fn delete_session(
        &self,
        request: Request<pb::DeleteSessionRequest>,
    ) -> Reply<pb::DeleteSessionResponse> {
        self.delete(request).await
    }

    type ExportSessionStream = super::export::ExportStream;

    #[instrument(skip_all)]
    async fn export_session(
        &self,
        request: Request<pb::ExportSessionRequest>,
    ) -> Reply<Self::ExportSessionStream> {
        self.export(request).await
    }

    type WatchStream = super::watch::WatchStream;

    #[instrument(skip_all)]
    async fn watch(&self, request: Request<pb::WatchRequest>) -> Reply<Self::WatchStream> {
        self.follow(request).await
    }

    #[instrument(skip_all)]
    async fn backup_database(
        &self,
        request: Request<pb::BackupDatabaseRequest>,
    ) -> Reply<pb::BackupDatabaseResponse> {
        self.backup(request).await
    }

    #[instrument(skip_all)]
    async fn collect_garbage(
        &self,
        request: Request<pb::CollectGarbageRequest>,
    ) -> Reply<pb::CollectGarbageResponse> {
        self.collect(request).await
    }

    #[instrument(skip_all)]
    async fn compact(&self, request: Request<pb::CompactRequest>) -> Reply<pb::CompactionOutcome> {
        self.compact_branch(request).await
    }

    #[instrument(skip_all)]
    async fn pin(&self, request: Request<pb::PinRequest>) -> Reply<pb::PinResponse> {
        self.pin_nodes(request, true).await
    }

    #[instrument(skip_all)]
    async fn unpin(&self, request: Request<pb::PinRequest>) -> Reply<pb::PinResponse> {
        self.pin_nodes(request, false).await
    }
}

impl ContextStoreService {
    /// The size limits this service applies.
    pub fn limits(&self) -> Limits {
        self.limits
    }
}
