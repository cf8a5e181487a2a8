//! The session, node and branch RPCs: create, read and list sessions, append and read nodes,
//! move branches, pin nodes.

use std::collections::BTreeMap;

use tonic::Request;

use super::parse::{
    self, append_request, create_branch_request, log_request, parse, reset_branch_request,
};
use super::reply::{self};
use super::{convert, domain_status, pb, status};
use crate::domain::{BranchName, Error, NodeId};
use crate::store::{self, CreationKey};

use super::service::{ContextStoreService, Reply, split, tenant_of};

impl ContextStoreService {
    pub(super) async fn new_session(
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

    pub(super) async fn session(
        &self,
        request: Request<pb::GetSessionRequest>,
    ) -> Reply<pb::Session> {
        let (_, id) = self.open(request, |r| &r.session_id).await?;
        let session = self.store.get_session(id).await.map_err(status)?;
        let usage = self.store.gateway_usage(id).await.map_err(status)?;
        let mut session = convert::session(session);
        session.gateway = convert::gateway_usage(usage);
        self.reply(session)
    }

    pub(super) async fn sessions(
        &self,
        request: Request<pb::ListSessionsRequest>,
    ) -> Reply<pb::ListSessionsResponse> {
        let (tenant, request) = split(request);
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

    pub(super) async fn append_nodes(
        &self,
        request: Request<pb::AppendRequest>,
    ) -> Reply<pb::AppendResponse> {
        let (tenant, request) = split(request);
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

    pub(super) async fn nodes(
        &self,
        request: Request<pb::GetNodesRequest>,
    ) -> Reply<pb::GetNodesResponse> {
        let (request, session) = self.open(request, |r| &r.session_id).await?;
        let ids = parse::node_ids(&request.node_ids)?;
        let nodes = self.store.get_nodes(session, &ids).await.map_err(status)?;
        let pinned = self.store.pinned(session).await.map_err(status)?;
        self.reply(pb::GetNodesResponse {
            nodes: with_pins(nodes, &pinned),
        })
    }

    pub(super) async fn node_log(
        &self,
        request: Request<pb::LogRequest>,
    ) -> Reply<pb::LogResponse> {
        let (tenant, request) = split(request);
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

    pub(super) async fn new_branch(
        &self,
        request: Request<pb::CreateBranchRequest>,
    ) -> Reply<pb::Branch> {
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

    pub(super) async fn move_branch(
        &self,
        request: Request<pb::ResetBranchRequest>,
    ) -> Reply<pb::Branch> {
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

    pub(super) async fn branches(
        &self,
        request: Request<pb::ListBranchesRequest>,
    ) -> Reply<pb::ListBranchesResponse> {
        let (_, session) = self.open(request, |r| &r.session_id).await?;
        let branches = self.store.list_branches(session).await.map_err(status)?;
        self.reply(pb::ListBranchesResponse {
            branches: branches.into_iter().map(convert::branch).collect(),
        })
    }

    pub(super) async fn remove_branch(
        &self,
        request: Request<pb::DeleteBranchRequest>,
    ) -> Reply<pb::DeleteBranchResponse> {
        let (request, session) = self.open(request, |r| &r.session_id).await?;
        let name = parse(BranchName::parse("name", &request.name))?;
        self.store
            .delete_branch(session, &name)
            .await
            .map_err(status)?;
        self.reply(pb::DeleteBranchResponse {})
    }

    /// Pin or Unpin: every id must be a node of the session; nothing is recorded otherwise.
    pub(super) async fn pin_nodes(
        &self,
        request: Request<pb::PinRequest>,
        pin: bool,
    ) -> Reply<pb::PinResponse> {
        let (request, session) = self.open(request, |r| &r.session_id).await?;
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
