//! Reading a whole session for export: every node reachable from the branch heads (and the
//! chains of the functions among them), its summaries and pins, consistent at those heads.
//!
//! Nodes never change, so the heads read once fix what the walk finds however appends go on
//! meanwhile; summaries and pins are read after, so those that belong to a later moment (a
//! covered or pinned node the heads do not reach) are left out.

use std::collections::HashSet;
use std::sync::Arc;

use super::reads::hydrate;
use super::{Result, Scoped, Store};
use crate::domain::{Node, NodeContent, NodeId, SessionId, Snapshot, Summary};
use crate::store::backend::Reads;
use crate::store::session::pins;

impl Store {
    pub async fn snapshot(&self, session: Scoped) -> Result<Snapshot> {
        let info = self.get_session(session).await?;
        let id = session.id();
        let mut conn = self.read().await?;
        let mut walk = Walk {
            done: HashSet::new(),
            order: Vec::new(),
            warnings: Vec::new(),
        };
        for branch in &info.branches {
            let Some((head, _)) = branch.head else {
                continue;
            };
            let path = self.path_ids(&mut *conn, id, head).await?;
            let todo: Vec<NodeId> = path
                .iter()
                .copied()
                .filter(|n| !walk.done.contains(n))
                .collect();
            let nodes = self.nodes_by_id(&mut *conn, id, &todo).await?;
            for node in nodes {
                walk.node(&mut *conn, id, node).await?;
            }
        }
        // Functions still running at these heads: their chains as they stand now (a chain
        // has no ref in the heads; its nodes only hang under its call).
        let running: Vec<NodeId> = {
            let closed: HashSet<NodeId> = walk
                .order
                .iter()
                .filter_map(|n| match &n.content {
                    NodeContent::FunctionResult(r) => r.chain.as_ref().map(|c| c.function_id),
                    _ => None,
                })
                .collect();
            walk.order
                .iter()
                .filter(|n| matches!(n.content, NodeContent::FunctionCall { .. }))
                .map(|n| n.id)
                .filter(|f| !closed.contains(f))
                .collect()
        };
        let mut running = running;
        while let Some(function) = running.pop() {
            let (head, _) = conn.function_row(id, function).await?;
            if let Some(head) = head {
                let before = walk.order.len();
                walk.chain(&mut *conn, id, function, head).await?;
                running.extend(
                    walk.order[before..]
                        .iter()
                        .filter(|n| matches!(n.content, NodeContent::FunctionCall { .. }))
                        .map(|n| n.id),
                );
            }
        }
        let summaries = conn.summaries(id).await?;
        let pinned = pins::fold(&conn.pin_events(id).await?);
        let mut kept_summaries: Vec<Summary> = Vec::new();
        for mut summary in summaries {
            let nodes_known = summary.covers.iter().all(|n| walk.done.contains(n))
                && summary
                    .range
                    .is_none_or(|(a, b)| walk.done.contains(&a) && walk.done.contains(&b));
            let rolled_known = summary
                .rolls_over
                .iter()
                .all(|r| kept_summaries.iter().any(|s| s.id == *r));
            if nodes_known && rolled_known && !summary.covers.is_empty() {
                // The head it was prepared on may be on a branch deleted since; it is only a
                // record (renders never read it), so the last node it covers stands in.
                if !walk.done.contains(&summary.base_head)
                    && let Some(&last) = summary.covers.last()
                {
                    summary.base_head = last;
                }
                kept_summaries.push(summary);
            } else {
                walk.warnings.push(format!(
                    "summary {} covers nodes no exported head reaches; left out",
                    summary.id
                ));
            }
        }
        let pinned = pinned
            .into_iter()
            .filter(|n| walk.done.contains(n))
            .collect();
        Ok(Snapshot {
            session: info,
            nodes: walk.order,
            summaries: kept_summaries,
            pinned,
            warnings: walk.warnings,
        })
    }
}

/// The nodes taken so far, in writing order.
struct Walk {
    done: HashSet<NodeId>,
    order: Vec<Arc<Node>>,
    warnings: Vec<String>,
}

impl Walk {
    /// Takes `node`, after the chain its result closes (boxed: chains nest).
    fn node<'a>(
        &'a mut self,
        conn: &'a mut dyn Reads,
        session: SessionId,
        node: Arc<Node>,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<()>> + Send + 'a>> {
        Box::pin(async move {
            if self.done.contains(&node.id) {
                return Ok(());
            }
            if let NodeContent::FunctionResult(result) = &node.content
                && let Some(chain) = &result.chain
                && let Some(head) = chain.head_id
            {
                self.chain(conn, session, chain.function_id, head).await?;
            }
            self.done.insert(node.id);
            self.order.push(node);
            Ok(())
        })
    }

    /// Takes the chain of `function` up to `head`.
    async fn chain(
        &mut self,
        conn: &mut dyn Reads,
        session: SessionId,
        function: NodeId,
        head: NodeId,
    ) -> Result<()> {
        let rows = conn.chain(session, head, function).await?;
        let rows = rows
            .into_iter()
            .filter(|r| !self.done.contains(&r.id))
            .collect();
        for node in hydrate(conn, session, rows).await? {
            self.node(conn, session, Arc::new(node)).await?;
        }
        Ok(())
    }
}
