//! An upstream's answer recorded once whole: appended after the request's history (or found
//! stored already, or on a branch of its own when the branch moved on), and the call's usage.

use super::Recorded;
use crate::domain::{self, GatewayCall, NodeContent, node_hash};
use crate::store::{self, AppendRequest, AppendTarget, Scoped};
use crate::workflow::Workflows;

impl Workflows {
    /// Appends the answer after the request's history. When the branch moved meanwhile (the
    /// client's next request, carrying this answer, came first), the answer is already stored,
    /// or it goes on a branch of its own at the request's head (a function's chain cannot fork:
    /// there it is left out).
    pub async fn append_answer(&self, recorded: &Recorded, content: NodeContent) {
        let store = &self.store;
        let session = recorded.session;
        let append = |target: AppendTarget, content: NodeContent| AppendRequest {
            session,
            target,
            expected_head: Some(recorded.head.map(|(id, _)| id)),
            idempotency_key: None,
            nodes: vec![content],
            pinned: Vec::new(),
        };
        // The answer chains from the request's head (or, first in a function's chain, from the
        // function's call node), whose hash recording already knew.
        let scope = recorded.function.map(|(_, hash)| hash);
        let parent = recorded.head.map(|(_, hash)| hash).or(scope);
        // The same answer after the same history is stored already (a retry answered alike).
        let hash = node_hash(parent.as_ref(), scope.as_ref(), &content);
        if matches!(store.node_by_hash(session, &hash).await, Ok(Some(_))) {
            return;
        }
        match store
            .append(append(recorded.target(), content.clone()))
            .await
        {
            Ok(_) => {}
            Err(store::Error::Domain(domain::Error::Aborted(_))) => {
                if matches!(store.node_by_hash(session, &hash).await, Ok(Some(_))) {
                    return;
                }
                if recorded.function.is_some() {
                    tracing::info!(
                        "gateway: a sub-agent's chain moved on; its answer is not recorded"
                    );
                    return;
                }
                let name = format!("gw-{}", &hash.to_hex()[..12]);
                let Ok(name) = domain::BranchName::parse("branch", &name) else {
                    return;
                };
                let forked = store
                    .create_branch(session, name.clone(), recorded.head.map(|(id, _)| id))
                    .await;
                if forked.is_ok()
                    && let Err(e) = store
                        .append(append(AppendTarget::Branch(name), content))
                        .await
                {
                    tracing::warn!(error = %e, "gateway: the answer was not recorded");
                }
            }
            Err(e) => tracing::warn!(error = %e, "gateway: the answer was not recorded"),
        }
    }

    /// Records a model call's usage for `session`, and counts its tokens.
    pub async fn record_call(&self, session: Scoped, call: &GatewayCall) {
        let usage = call.usage;
        for (kind, n) in [
            ("upstream_input", usage.input),
            ("cache_read", usage.cache_read),
            ("cache_write", usage.cache_write),
            ("output", usage.output),
        ] {
            metrics::counter!("ctxd_gateway_tokens_total", "kind" => kind).increment(n);
        }
        if let Err(e) = self.store.record_gateway_call(session, call).await {
            tracing::warn!(error = %e, "gateway: the call's usage was not recorded");
        }
    }
}
