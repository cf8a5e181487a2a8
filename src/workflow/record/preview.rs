//! What a request would be rendered as, without recording it: the stored branch its history
//! reaches, its new messages after it in memory, rendered (the gateway's `count_tokens`).

use std::sync::Arc;

use super::peek;
use crate::domain::{Hash, Node, NodeContent, NodeId, PathView, node_hash};
use crate::provider::conversation::Conversation;
use crate::render::{self, Rendered};
use crate::store::{PathTarget, now_ms};
use crate::tokens::Tokenizer;
use crate::workflow::Workflows;

/// `path` with `rest` after its last node, in memory (new ids, the hashes the store would give).
pub fn extended(mut path: PathView, rest: Vec<NodeContent>) -> PathView {
    let now = now_ms();
    let mut parent: Option<(NodeId, Hash)> = path.nodes.last().map(|n| (n.id, n.hash));
    for content in rest {
        let hash = node_hash(parent.as_ref().map(|p| &p.1), None, &content);
        let node = Node {
            id: NodeId::new(),
            parent_id: parent.map(|p| p.0),
            function_id: None,
            content,
            created_at_ms: now,
            hash,
        };
        parent = Some((node.id, hash));
        path.nodes.push(Arc::new(node));
    }
    path
}

impl Workflows {
    /// The render `conv` would be forwarded as, under `options` (what the model has seen is
    /// the stored part): `None` when the stored branch cannot be read or the render fails.
    pub async fn preview(
        &self,
        call: &super::Call,
        conv: &Conversation,
        mut options: render::Options,
    ) -> Option<(PathView, Rendered)> {
        let store = &self.store;
        let (path, stored) = match peek(store, &call.tenant, call.named.as_deref(), conv).await {
            Some((session, Some((k, node)))) => (
                store
                    .load_path(session, &PathTarget::Node(node))
                    .await
                    .ok()?,
                k + 1,
            ),
            _ => (PathView::default(), 0),
        };
        options.seen = path
            .nodes
            .last()
            .map_or(render::Seen::Nothing, |n| render::Seen::Through(n.id));
        let rest: Vec<NodeContent> = conv.items[stored..]
            .iter()
            .map(|i| i.content.clone())
            .collect();
        self.render_path(extended(path, rest), Tokenizer::Heuristic, options)
            .await
            .ok()
    }
}
