//! The `ctxd.v1.ContextStore` RPCs: each parses (`parse`), calls the store, the engine or the
//! compaction workflow, and converts back.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use tonic::{Request, Response, Status};
use tracing::instrument;

use super::parse::{
    self, RenderArgs, append_request, branch_or_main, compaction_id, create_branch_request,
    log_request, parse, provider_format, render_request, reset_branch_request, session_id,
};
use super::reply::{self, Capped};
use super::{compaction, convert, domain_status, pb, status, workflow_status};
use crate::domain::{BranchName, CompactionId, Error, NodeId, PathView, SessionId, Tenant};
use crate::import;
use crate::limits::Limits;
use crate::recall;
use crate::render::Rendered;
use crate::store::{self, CreationKey, Scoped, ScopedPlan, Store};
use crate::workflow::compaction::{Compactions, PrepareArgs, PrepareOutcome};
use crate::workflow::{SavingsReport, Workflows};

/// The largest session file an import takes; it is parsed in memory.
const MAX_IMPORT_BYTES: usize = 512 * 1024 * 1024;

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

    /// Lets `tenant` at compaction `id`, or answers exactly what an unknown compaction answers.
    async fn scope_compaction(
        &self,
        tenant: &Tenant,
        id: CompactionId,
    ) -> Result<(Scoped, ScopedPlan), Status> {
        self.compactions
            .scope(tenant, id)
            .await
            .map_err(workflow_status)
    }

    /// The stale outcome of compaction `id` of `tenant`, when its session was deleted while the
    /// plan was open (a live plan, or another tenant's, answers `None`).
    async fn deleted_plan(
        &self,
        tenant: &Tenant,
        id: CompactionId,
    ) -> Result<Option<crate::workflow::compaction::CommitOutcome>, Status> {
        let found = self.store.plan_tombstone(id).await.map_err(status)?;
        Ok(found
            .filter(|t| &t.tenant == tenant)
            .map(|_| crate::workflow::compaction::CommitOutcome::session_deleted(id)))
    }

    /// The part and response size limits (`Limits::max_part_bytes`, `max_response_bytes`).
    pub fn with_limits(self, limits: Limits) -> Self {
        Self { limits, ..self }
    }

    /// `message` as the reply, unless it is over the response size limit.
    fn reply<T: Capped>(&self, message: T) -> Reply<T> {
        reply::capped(message, self.limits.max_response_bytes)
    }

    /// Refuses a write whose reply would be over the response size limit before it writes,
    /// so no write is ever followed by a reply the client cannot have.
    fn reply_fits(&self, len: usize, field: &str, advice: &str) -> Result<(), Status> {
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
        let tenant = tenant_of(&request);
        let pb::CreateSessionRequest {
            metadata,
            idempotency_key,
        } = request.into_inner();
        parse::metadata_keys(&metadata)?;
        self.reply_fits(
            reply::new_session_len(&metadata),
            "metadata",
            "send less metadata",
        )?;
        let metadata: BTreeMap<String, String> = metadata.into_iter().collect();
        let key = CreationKey::session(idempotency_key, &metadata);
        let session = self
            .store
            .create_session(&tenant, metadata, key.as_ref())
            .await
            .map_err(status)?;
        self.reply(convert::session(session))
    }

    #[instrument(skip_all)]
    async fn get_session(&self, request: Request<pb::GetSessionRequest>) -> Reply<pb::Session> {
        let tenant = tenant_of(&request);
        let id = session_id(&request.into_inner().session_id)?;
        let id = self.scope(&tenant, id).await?;
        let session = self.store.get_session(id).await.map_err(status)?;
        let usage = self.store.gateway_usage(id).await.map_err(status)?;
        let mut session = convert::session(session);
        session.gateway = convert::gateway_usage(usage);
        self.reply(session)
    }

    #[instrument(skip_all)]
    async fn list_sessions(
        &self,
        request: Request<pb::ListSessionsRequest>,
    ) -> Reply<pb::ListSessionsResponse> {
        let tenant = tenant_of(&request);
        let request = request.into_inner();
        let (page_size, after, filter) = parse::list_sessions_request(&request)?;
        let (sessions, next) = self
            .store
            .list_sessions(&tenant, page_size, after, &filter)
            .await
            .map_err(status)?;
        self.reply(pb::ListSessionsResponse {
            sessions: sessions.into_iter().map(convert::session).collect(),
            next_page_token: next.map(|id| id.to_string()).unwrap_or_default(),
        })
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
        let tenant = tenant_of(&request);
        let request = request.into_inner();
        self.reply_fits(
            reply::append_response_len(request.nodes.len()),
            "nodes",
            "append fewer nodes per call",
        )?;
        let request = append_request(request, self.limits.max_part_bytes)?;
        let session = self.scope(&tenant, request.session).await?;
        let outcome = self
            .store
            .append(request.scoped(session))
            .await
            .map_err(status)?;
        metrics::counter!("ctxd_appended_nodes_total").increment(outcome.node_ids.len() as u64);
        self.reply(pb::AppendResponse {
            node_ids: outcome.node_ids,
            head_id: outcome.head_id,
            head_hash: outcome.head_hash,
        })
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
        let tenant = tenant_of(&request);
        let request = request.into_inner();
        let session = session_id(&request.session_id)?;
        let session = self.scope(&tenant, session).await?;
        let ids = parse::node_ids(&request.node_ids)?;
        let nodes = self.store.get_nodes(session, &ids).await.map_err(status)?;
        let pinned = self.store.pinned(session).await.map_err(status)?;
        self.reply(pb::GetNodesResponse {
            nodes: with_pins(nodes, &pinned),
        })
    }

    #[instrument(skip_all)]
    async fn log(&self, request: Request<pb::LogRequest>) -> Reply<pb::LogResponse> {
        let tenant = tenant_of(&request);
        let request = request.into_inner();
        let (session, start, limit) = log_request(&request)?;
        let session = self.scope(&tenant, session).await?;
        let (nodes, next) = self
            .store
            .log(session, start, limit)
            .await
            .map_err(|e| match e {
                // The store names the start `node_id`; a page starts at its token.
                store::Error::Domain(Error::NotFound { what: "node", .. })
                    if !request.page_token.is_empty() =>
                {
                    domain_status(Error::not_found(
                        "node",
                        format!("{} (page_token)", request.page_token),
                    ))
                }
                e => status(e),
            })?;
        let pinned = self.store.pinned(session).await.map_err(status)?;
        self.reply(pb::LogResponse {
            nodes: with_pins(nodes, &pinned),
            next_page_token: next.map(|id| id.to_string()).unwrap_or_default(),
        })
    }

    #[instrument(skip_all)]
    async fn create_branch(&self, request: Request<pb::CreateBranchRequest>) -> Reply<pb::Branch> {
        let tenant = tenant_of(&request);
        let (session, name, from) = create_branch_request(&request.into_inner())?;
        let session = self.scope(&tenant, session).await?;
        let branch = self
            .store
            .create_branch(session, name, from)
            .await
            .map_err(status)?;
        self.reply(convert::branch(branch))
    }

    #[instrument(skip_all)]
    async fn reset_branch(&self, request: Request<pb::ResetBranchRequest>) -> Reply<pb::Branch> {
        let tenant = tenant_of(&request);
        let args = reset_branch_request(&request.into_inner())?;
        let session = self.scope(&tenant, args.session).await?;
        let branch = self
            .store
            .reset_branch(session, args.name, args.to, args.expected)
            .await
            .map_err(status)?;
        self.reply(convert::branch(branch))
    }

    #[instrument(skip_all)]
    async fn list_branches(
        &self,
        request: Request<pb::ListBranchesRequest>,
    ) -> Reply<pb::ListBranchesResponse> {
        let tenant = tenant_of(&request);
        let session = session_id(&request.into_inner().session_id)?;
        let session = self.scope(&tenant, session).await?;
        let branches = self.store.list_branches(session).await.map_err(status)?;
        self.reply(pb::ListBranchesResponse {
            branches: branches.into_iter().map(convert::branch).collect(),
        })
    }

    #[instrument(skip_all)]
    async fn delete_branch(
        &self,
        request: Request<pb::DeleteBranchRequest>,
    ) -> Reply<pb::DeleteBranchResponse> {
        let tenant = tenant_of(&request);
        let request = request.into_inner();
        let session = session_id(&request.session_id)?;
        let session = self.scope(&tenant, session).await?;
        let name = parse(BranchName::parse("name", &request.name))?;
        self.store
            .delete_branch(session, &name)
            .await
            .map_err(status)?;
        self.reply(pb::DeleteBranchResponse {})
    }

    #[instrument(skip_all)]
    async fn render(&self, request: Request<pb::RenderRequest>) -> Reply<pb::RenderResponse> {
        let tenant = tenant_of(&request);
        let r = request.into_inner();
        let format = provider_format(r.format)?;
        let strict = r.strict_format;
        let (path, rendered) = self.rendered(&tenant, r.into()).await?;
        let (head_id, head_hash) = path
            .nodes
            .last()
            .map(|n| (n.id.to_string(), n.hash.to_hex()))
            .unwrap_or_default();
        let report = convert::report(&rendered.report);
        let messages_json = format
            .map(|f| crate::provider::format::document(f, &rendered.messages))
            .unwrap_or_default();
        let uncarried = format
            .map(|f| crate::provider::format::uncarried(f, &rendered.messages))
            .unwrap_or_default();
        if let (true, Some(format), Some(first)) = (strict, format, uncarried.first()) {
            let node = first
                .node_id
                .map_or_else(|| "a summary".to_owned(), |id| format!("node {id}"));
            return Err(domain_status(crate::domain::Error::invalid(
                "strict_format",
                format!(
                    "{node} part {} ({}) cannot be carried by {}{}",
                    first.part_index,
                    first.mime_type,
                    format.name(),
                    match uncarried.len() {
                        1 => String::new(),
                        n => format!(", nor {} more part(s)", n - 1),
                    }
                ),
            )));
        }
        self.reply(pb::RenderResponse {
            messages: rendered
                .messages
                .into_iter()
                .zip(rendered.tokens)
                .map(|(m, t)| convert::rendered(m, t))
                .collect(),
            head_id,
            head_hash,
            total_tokens: report.total_tokens,
            tokenizer: report.tokenizer.clone(),
            report: Some(report),
            messages_json,
            uncarried: uncarried
                .into_iter()
                .map(|u| pb::UncarriedPart {
                    node_id: u.node_id.map(|id| id.to_string()).unwrap_or_default(),
                    part_index: u32::try_from(u.part_index).unwrap_or(u32::MAX),
                    mime_type: u.mime_type,
                })
                .collect(),
        })
    }

    #[instrument(skip_all)]
    async fn context_stats(
        &self,
        request: Request<pb::ContextStatsRequest>,
    ) -> Reply<pb::ContextReport> {
        let tenant = tenant_of(&request);
        let (_, rendered) = self.rendered(&tenant, request.into_inner().into()).await?;
        self.reply(convert::report(&rendered.report))
    }

    #[instrument(skip_all)]
    async fn recall(&self, request: Request<pb::RecallRequest>) -> Reply<pb::RecallResponse> {
        let tenant = tenant_of(&request);
        let request = request.into_inner();
        let session = session_id(&request.session_id)?;
        let prefix = parse::reference(&request.reference)?;
        let max_chars = parse::recall_max_chars(request.max_chars)?;
        let session = self.scope(&tenant, session).await?;
        let node = self
            .store
            .node_by_reference(session, &prefix)
            .await
            .map_err(status)?;
        let recalled = recall::recalled(&node, max_chars);
        self.reply(pb::RecallResponse {
            node_id: node.id.to_string(),
            kind: recalled.kind.to_owned(),
            content: recalled.content,
            total_chars: u64::try_from(recalled.total_chars).unwrap_or(u64::MAX),
            truncated: recalled.truncated,
            tool_call_id: recalled.tool_call_id,
            tool_name: recalled.tool_name,
        })
    }

    #[instrument(skip_all)]
    async fn recall_tool(
        &self,
        _request: Request<pb::RecallToolRequest>,
    ) -> Reply<pb::RecallToolResponse> {
        self.reply(pb::RecallToolResponse {
            name: recall::TOOL_NAME.to_owned(),
            anthropic_json: recall::anthropic_tool().to_string(),
            openai_json: recall::openai_tool().to_string(),
            responses_json: recall::responses_tool().to_string(),
        })
    }

    #[instrument(skip_all)]
    async fn prepare_compaction(
        &self,
        request: Request<pb::PrepareCompactionRequest>,
    ) -> Reply<pb::PrepareCompactionResponse> {
        let tenant = tenant_of(&request);
        let r = request.into_inner();
        let format = provider_format(r.format)?;
        let args = PrepareArgs::try_from(r)?;
        let session = self.scope(&tenant, args.session).await?;
        let budget = args.budget;
        let outcome = self
            .compactions
            .prepare(session, args)
            .await
            .map_err(workflow_status)?;
        let plan = match &outcome {
            PrepareOutcome::Needed { scoped, .. } => Some(*scoped),
            PrepareOutcome::NotNeeded { .. } => None,
        };
        let response = compaction::prepare_response(outcome, budget, format);
        let replied = self.reply(response);
        if let (Err(_), Some(plan)) = (&replied, plan) {
            // Nobody can commit a summary of an input they never received.
            self.compactions
                .cancel(plan, "the summary input was over --max-response-bytes")
                .await
                .map_err(workflow_status)?;
        }
        replied
    }

    #[instrument(skip_all)]
    async fn commit_summary(
        &self,
        request: Request<pb::CommitSummaryRequest>,
    ) -> Reply<pb::CompactionOutcome> {
        let tenant = tenant_of(&request);
        let r = request.into_inner();
        let id = compaction_id(&r.compaction_id)?;
        let (session, plan) = match self.scope_compaction(&tenant, id).await {
            Ok(scoped) => scoped,
            Err(unknown) => match self.deleted_plan(&tenant, id).await? {
                Some(outcome) => return self.reply(compaction::commit_outcome(outcome)),
                None => return Err(unknown),
            },
        };
        let outcome = self
            .compactions
            .commit(session, plan, r.text, r.model, true)
            .await
            .map_err(workflow_status)?;
        self.reply(compaction::commit_outcome(outcome))
    }

    #[instrument(skip_all)]
    async fn cancel_compaction(
        &self,
        request: Request<pb::CancelCompactionRequest>,
    ) -> Reply<pb::CancelCompactionResponse> {
        let tenant = tenant_of(&request);
        let r = request.into_inner();
        let id = compaction_id(&r.compaction_id)?;
        let (_, plan) = match self.scope_compaction(&tenant, id).await {
            Ok(scoped) => scoped,
            // Its session is gone, and the plan with it: there is nothing left to cancel.
            Err(unknown) => match self.deleted_plan(&tenant, id).await? {
                Some(_) => return self.reply(pb::CancelCompactionResponse {}),
                None => return Err(unknown),
            },
        };
        let reason = parse::cancel_reason(r.reason);
        self.compactions
            .cancel(plan, &reason)
            .await
            .map_err(workflow_status)?;
        self.reply(pb::CancelCompactionResponse {})
    }

    #[instrument(skip_all)]
    async fn list_summaries(
        &self,
        request: Request<pb::ListSummariesRequest>,
    ) -> Reply<pb::ListSummariesResponse> {
        let tenant = tenant_of(&request);
        let r = request.into_inner();
        let session = session_id(&r.session_id)?;
        let session = self.scope(&tenant, session).await?;
        let branch = branch_or_main("branch", &r.branch)?;
        let listing = self
            .compactions
            .summaries(session, branch)
            .await
            .map_err(workflow_status)?;
        self.reply(compaction::summaries_response(listing))
    }

    #[instrument(skip_all)]
    async fn import_session(
        &self,
        request: Request<tonic::Streaming<pb::ImportChunk>>,
    ) -> Reply<pb::ImportSessionResponse> {
        let tenant = tenant_of(&request);
        let mut stream = request.into_inner();
        let mut first: Option<(i32, HashMap<String, String>, String)> = None;
        let mut data = Vec::new();
        while let Some(chunk) = stream.message().await? {
            if data.len() + chunk.data.len() > MAX_IMPORT_BYTES {
                return Err(domain_status(Error::invalid(
                    "data",
                    format!("larger than {MAX_IMPORT_BYTES} bytes"),
                )));
            }
            first.get_or_insert((chunk.format, chunk.metadata, chunk.idempotency_key));
            data.extend_from_slice(&chunk.data);
        }
        let (format, metadata, idempotency_key) = first.unwrap_or_default();
        // Room for the counts and a note on left-out warnings (below).
        self.reply_fits(
            reply::new_session_len(&metadata) + reply::WARNINGS_NOTE_BYTES,
            "metadata",
            "send less metadata",
        )?;
        let source = parse::import_source(format, &data)?;
        let metadata: BTreeMap<String, String> = metadata.into_iter().collect();
        let key = CreationKey::import(idempotency_key, format, &metadata, &data);
        let parsed = self
            .workflows
            .parse_import(source, data, metadata, self.limits.max_part_bytes)
            .await
            .map_err(workflow_status)?;
        // The file's own metadata must fit the reply too; checked before anything is written.
        let merged: HashMap<String, String> = parsed.metadata.clone().into_iter().collect();
        self.reply_fits(
            reply::new_session_len(&merged) + reply::WARNINGS_NOTE_BYTES,
            "data",
            "the file's metadata is too large for the reply",
        )?;
        let session = self
            .workflows
            .import(&tenant, &parsed, key.as_ref())
            .await
            .map_err(workflow_status)?;
        let plan = parsed.plan;
        let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        let mut response = pb::ImportSessionResponse {
            session: Some(convert::session(session)),
            nodes: count(plan.nodes()),
            functions: count(plan.functions()),
            summaries: count(plan.summaries()),
            format: match source {
                import::Source::NeutralJsonl => pb::ImportFormat::NeutralJsonl,
                import::Source::ClaudeCodeJsonl => pb::ImportFormat::ClaudeCodeJsonl,
                import::Source::OpenAiMessages => pb::ImportFormat::OpenaiMessages,
                import::Source::CtxdJsonl => pb::ImportFormat::CtxdJsonl,
            }
            .into(),
            warnings: plan.warnings,
        };
        // The session is written: the reply must go out, so warnings make room if need be.
        reply::fit_warnings(&mut response, self.limits.max_response_bytes);
        self.reply(response)
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
        let tenant = tenant_of(&request);
        let args = PrepareArgs::try_from(request.into_inner())?;
        let session = self.scope(&tenant, args.session).await?;
        let outcome = self
            .compactions
            .compact(session, args)
            .await
            .map_err(workflow_status)?;
        self.reply(compaction::compact_outcome(outcome))
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
    /// Pin or Unpin: every id must be a node of the session; nothing is recorded otherwise.
    async fn pin_nodes(
        &self,
        request: Request<pb::PinRequest>,
        pin: bool,
    ) -> Reply<pb::PinResponse> {
        let tenant = tenant_of(&request);
        let request = request.into_inner();
        let session = session_id(&request.session_id)?;
        let session = self.scope(&tenant, session).await?;
        // Parsed after the scope check: a foreign session answers NOT_FOUND whatever the ids.
        let ids = parse::pinned_ids(&request.node_ids)?;
        let pinned = self.store.pin(session, &ids, pin).await.map_err(status)?;
        self.reply(pb::PinResponse {
            pinned_ids: pinned.iter().map(ToString::to_string).collect(),
        })
    }
}

/// Nodes as the API shows them, each marked pinned or not.
fn with_pins(nodes: Vec<crate::domain::Node>, pinned: &[NodeId]) -> Vec<pb::Node> {
    let pinned: std::collections::HashSet<&NodeId> = pinned.iter().collect();
    nodes
        .into_iter()
        .map(|n| {
            let is_pinned = pinned.contains(&n.id);
            let mut node = convert::node(n);
            node.pinned = is_pinned;
            if let Some(content) = node.content.as_mut() {
                content.pinned = is_pinned;
            }
            node
        })
        .collect()
}

impl ContextStoreService {
    /// Parses, loads and renders; the one path behind `Render` and `ContextStats`, so the two
    /// always agree.
    async fn rendered(
        &self,
        tenant: &Tenant,
        args: RenderArgs,
    ) -> Result<(PathView, Rendered), Status> {
        let (session, target, tokenizer, options) = render_request(args)?;
        let session = self.scope(tenant, session).await?;
        self.workflows
            .render(session, &target, tokenizer, options)
            .await
            .map_err(workflow_status)
    }

    /// What a render request's policy saved over the session's newest `calls` model calls,
    /// replayed (the inspector's savings view).
    pub async fn savings(
        &self,
        request: Request<pb::RenderRequest>,
        calls: usize,
    ) -> Result<SavingsReport, Status> {
        let tenant = tenant_of(&request);
        let (session, target, tokenizer, options) = render_request(request.into_inner().into())?;
        let session = self.scope(&tenant, session).await?;
        self.workflows
            .savings(session, &target, tokenizer, options, calls)
            .await
            .map_err(workflow_status)
    }

    /// The size limits this service applies.
    pub fn limits(&self) -> Limits {
        self.limits
    }
}
