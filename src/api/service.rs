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

    /// The request's message and the session its `session_id` field names, once the caller's
    /// tenant may act on it: the opening of every RPC on one session that checks nothing
    /// before the scope.
    pub(super) async fn open<T>(
        &self,
        request: Request<T>,
        session_id: impl FnOnce(&T) -> &str,
    ) -> Result<(T, Scoped), Status> {
        let (tenant, message) = split(request);
        let session = super::parse::session_id(session_id(&message))?;
        let session = self.scope(&tenant, session).await?;
        Ok((message, session))
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

/// The request's tenant and its message.
pub(super) fn split<T>(request: Request<T>) -> (Tenant, T) {
    (tenant_of(&request), request.into_inner())
}

pub(super) type Reply<T> = Result<Response<T>, Status>;

/// Each RPC answers with the service's method of the same request: the trait speaks the
/// contract's names, the methods say what they do.
macro_rules! rpcs {
    ($($rpc:ident($request:ty) -> $response:ty = $method:ident $(, $arg:expr)?;)* {$($streams:tt)*}) => {
        #[tonic::async_trait]
        impl pb::context_store_server::ContextStore for ContextStoreService {
            $(
                #[instrument(skip_all)]
                async fn $rpc(&self, request: Request<$request>) -> Reply<$response> {
                    self.$method(request $(, $arg)?).await
                }
            )*
            $($streams)*
        }
    };
}

rpcs! {
    create_session(pb::CreateSessionRequest) -> pb::Session = new_session;
    get_session(pb::GetSessionRequest) -> pb::Session = session;
    list_sessions(pb::ListSessionsRequest) -> pb::ListSessionsResponse = sessions;
    list_gateway_calls(pb::ListGatewayCallsRequest)
        -> pb::ListGatewayCallsResponse = gateway_calls;
    append(pb::AppendRequest) -> pb::AppendResponse = append_nodes;
    // The inherent method of the same name, which takes precedence over the trait's.
    append_stream(tonic::Streaming<pb::AppendRequest>) -> Self::AppendStreamStream = append_stream;
    get_nodes(pb::GetNodesRequest) -> pb::GetNodesResponse = nodes;
    log(pb::LogRequest) -> pb::LogResponse = node_log;
    create_branch(pb::CreateBranchRequest) -> pb::Branch = new_branch;
    reset_branch(pb::ResetBranchRequest) -> pb::Branch = move_branch;
    list_branches(pb::ListBranchesRequest) -> pb::ListBranchesResponse = branches;
    delete_branch(pb::DeleteBranchRequest) -> pb::DeleteBranchResponse = remove_branch;
    render(pb::RenderRequest) -> pb::RenderResponse = render_branch;
    context_stats(pb::ContextStatsRequest) -> pb::ContextReport = stats;
    recall(pb::RecallRequest) -> pb::RecallResponse = recall_nodes;
    recall_tool(pb::RecallToolRequest) -> pb::RecallToolResponse = recall_tool_specs;
    prepare_compaction(pb::PrepareCompactionRequest) -> pb::PrepareCompactionResponse = prepare;
    commit_summary(pb::CommitSummaryRequest) -> pb::CompactionOutcome = commit;
    cancel_compaction(pb::CancelCompactionRequest) -> pb::CancelCompactionResponse = cancel;
    list_summaries(pb::ListSummariesRequest) -> pb::ListSummariesResponse = summaries;
    import_session(tonic::Streaming<pb::ImportChunk>) -> pb::ImportSessionResponse = import;
    delete_session(pb::DeleteSessionRequest) -> pb::DeleteSessionResponse = delete;
    export_session(pb::ExportSessionRequest) -> Self::ExportSessionStream = export;
    watch(pb::WatchRequest) -> Self::WatchStream = follow;
    backup_database(pb::BackupDatabaseRequest) -> pb::BackupDatabaseResponse = backup;
    collect_garbage(pb::CollectGarbageRequest) -> pb::CollectGarbageResponse = collect;
    compact(pb::CompactRequest) -> pb::CompactionOutcome = compact_branch;
    pin(pb::PinRequest) -> pb::PinResponse = pin_nodes, true;
    unpin(pb::PinRequest) -> pb::PinResponse = pin_nodes, false;
    {
        type AppendStreamStream = super::append_stream::AppendStream;
        type ExportSessionStream = super::export::ExportStream;
        type WatchStream = super::watch::WatchStream;
    }
}

impl ContextStoreService {
    /// The size limits this service applies.
    pub fn limits(&self) -> Limits {
        self.limits
    }
}
