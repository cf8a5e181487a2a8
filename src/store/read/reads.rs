//! Reads: nodes by id, the log, and a render's path (`load_path`) with the chains it shows in
//! full; the read cache of id paths and decoded nodes, and turning rows into nodes (`hydrate`).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::states::RenderStart;
use super::{Error, Result, Scoped, Store};
use crate::domain::{
    self, BranchName, Expose, Hash, Node, NodeContent, NodeId, PathView, SessionId,
};
use crate::store::backend::{BranchStart, Reads};
use crate::store::form::body::Body;
use crate::store::form::codec::unpack;
use crate::store::form::rows::NodeRow;
use crate::store::session::pins;

/// Where a render or log starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathTarget {
    Branch(BranchName),
    Node(NodeId),
    Function(NodeId),
}

impl Store {
    /// Nodes by id, in the order asked; every id must be a node of `session`.
    pub async fn get_nodes(&self, session: Scoped, ids: &[NodeId]) -> Result<Vec<Node>> {
        let session = session.id();
        let mut conn = self.read().await?;
        conn.ensure_session(session).await?;
        let mut rows = Vec::with_capacity(ids.len());
        for (i, id) in ids.iter().enumerate() {
            rows.push(
                conn.node_row(session, *id, &format!("node_ids[{i}]"))
                    .await?,
            );
        }
        hydrate(&mut *conn, session, rows).await
    }

    /// Up to `limit` nodes from `start` following parent links, newest first, and the node the
    /// next page starts at.
    pub async fn log(
        &self,
        session: Scoped,
        start: PathTarget,
        limit: u32,
    ) -> Result<(Vec<Node>, Option<NodeId>)> {
        let session = session.id();
        let mut conn = self.read().await?;
        conn.ensure_session(session).await?;
        let Some(start) = resolve_start(&mut *conn, session, &start).await? else {
            return Ok((Vec::new(), None));
        };
        let mut rows = conn.ancestors(session, start, Some(limit)).await?;
        rows.reverse();
        let next = rows.last().and_then(|r| r.parent_id);
        let next = if rows.len() == limit as usize {
            next
        } else {
            None
        };
        Ok((hydrate(&mut *conn, session, rows).await?, next))
    }

    /// Loads what a render of `target` needs: the path from the root, the internal chains of
    /// completed functions that expose them in full, and the session's summaries (the engine
    /// keeps those that apply to this path). A branch rendered before, unchanged since but by
    /// this process's appends, loads from memory alone; a path never read comes in one query.
    pub async fn load_path(&self, session: Scoped, target: &PathTarget) -> Result<PathView> {
        let session = session.id();
        let told = match target {
            PathTarget::Branch(name) => self.remembered_start(session, name),
            _ => None,
        };
        if let Some(Some(start)) = &told
            && let Some(view) = self.view_from_memory(session, start).await?
        {
            self.from_memory.fetch_add(1, Ordering::Relaxed);
            metrics::counter!("ctxd_paths_from_memory_total").increment(1);
            return Ok(view);
        }
        let mut conn = self.read().await?;
        let (start, scope, loaded) = match target {
            PathTarget::Branch(name) => {
                let start = match told {
                    Some(Some(start)) => start,
                    told => {
                        let keep = told.is_some();
                        self.read_start(&mut *conn, session, name, keep).await?
                    }
                };
                let Some(head) = start.head else {
                    return Ok(PathView::default());
                };
                (head, None, Some(start))
            }
            PathTarget::Node(_) | PathTarget::Function(_) => {
                conn.ensure_session(session).await?;
                let Some(start) = resolve_start(&mut *conn, session, target).await? else {
                    return Ok(PathView::default());
                };
                let scope = match target {
                    PathTarget::Function(function) => Some(*function),
                    _ => conn.node_row(session, start, "node_id").await?.function_id,
                };
                (start, scope, None)
            }
        };
        let nodes = self.path_nodes(&mut *conn, session, start).await?;
        let mut chains = HashMap::new();
        let mut todo = full_chains(&nodes);
        while let Some((function, head)) = todo.pop() {
            let rows = conn.chain(session, head, function).await?;
            let chain: Vec<Arc<Node>> = hydrate(&mut *conn, session, rows)
                .await?
                .into_iter()
                .map(Arc::new)
                .collect();
            todo.extend(full_chains(&chain));
            chains.insert(function, chain);
        }
        let (summaries, pinned) = match loaded {
            Some(start) => (start.summaries.clone(), start.pinned.clone()),
            None => (
                conn.summaries(session).await?,
                pins::fold(&conn.pin_events(session).await?),
            ),
        };
        Ok(PathView {
            nodes,
            scope,
            chains,
            summaries,
            pinned: pinned.into_iter().collect(),
        })
    }

    /// The start of `branch` as remembered, when nothing but this process's committer has
    /// committed since it was: asked of the committer's connection first, so a start kept
    /// before another process's commit is dropped before it could be used. `None` when that
    /// cannot be told (PostgreSQL, or a batch in hand): what is read now is not kept either.
    fn remembered_start(
        &self,
        session: SessionId,
        branch: &BranchName,
    ) -> Option<Option<Arc<RenderStart>>> {
        let states = self.changes.states();
        match self.appends.others_committed()? {
            false => Some(states.get(session, branch)),
            true => {
                states.clear();
                Some(None)
            }
        }
    }

    /// Reads the start of `branch` (one query), and, with `keep`, remembers it unless a write
    /// to the session overtook the read.
    async fn read_start(
        &self,
        conn: &mut dyn Reads,
        session: SessionId,
        name: &BranchName,
        keep: bool,
    ) -> Result<Arc<RenderStart>> {
        let states = self.changes.states();
        let ticket = states.ticket(session);
        let start = Arc::new(match conn.branch_start(session, name).await? {
            BranchStart::NoSession => {
                return Err(domain::Error::not_found("session", session).into());
            }
            BranchStart::NoBranch => return Err(domain::Error::not_found("branch", name).into()),
            BranchStart::Empty => RenderStart {
                head: None,
                summaries: Vec::new(),
                pinned: Vec::new(),
            },
            BranchStart::At {
                head,
                summaries,
                pin_events,
            } => RenderStart {
                head: Some(head),
                summaries,
                pinned: pins::fold(&pin_events),
            },
        });
        if keep {
            states.keep(ticket, session, name, Arc::clone(&start));
        }
        Ok(start)
    }

    /// The view of a branch from `start` when memory holds all of it (every node of the path,
    /// no chain to splice).
    async fn view_from_memory(
        &self,
        session: SessionId,
        start: &RenderStart,
    ) -> Result<Option<PathView>> {
        let Some(head) = start.head else {
            return Ok(Some(PathView::default()));
        };
        let Some(ids) = self.walk_path(None, session, head).await? else {
            return Ok(None);
        };
        let found = self.cached_nodes(&ids);
        let Some(nodes) = found.into_iter().collect::<Option<Vec<_>>>() else {
            return Ok(None);
        };
        if !full_chains(&nodes).is_empty() {
            return Ok(None);
        }
        Ok(Some(PathView {
            nodes,
            scope: None,
            chains: HashMap::new(),
            summaries: start.summaries.clone(),
            pinned: start.pinned.iter().copied().collect(),
        }))
    }

    /// The nodes of the path ending at `head`, root first: from memory where the path is
    /// known, else the whole path's rows in one query.
    async fn path_nodes(
        &self,
        conn: &mut dyn Reads,
        session: SessionId,
        head: NodeId,
    ) -> Result<Vec<Arc<Node>>> {
        if let Some(ids) = self.walk_path(None, session, head).await? {
            return self.nodes_by_id(conn, session, &ids).await;
        }
        let rows = conn.ancestors(session, head, None).await?;
        let ids: Vec<NodeId> = rows.iter().map(|row| row.id).collect();
        let found = self.cached_nodes(&ids);
        let unknown = rows
            .into_iter()
            .zip(&found)
            .filter(|(_, node)| node.is_none())
            .map(|(row, _)| row)
            .collect();
        let mut decoded = hydrate(conn, session, unknown).await?.into_iter();
        let nodes: Vec<Arc<Node>> = found
            .into_iter()
            .map(|node| node.or_else(|| decoded.next().map(Arc::new)))
            .collect::<Option<_>>()
            .ok_or_else(|| Error::Corrupt("a node of a path is missing".into()))?;
        {
            let mut cache = self.read_cache();
            for node in &nodes {
                cache.insert_node(Arc::clone(node));
            }
        }
        self.remember_path(head, None, ids);
        Ok(nodes)
    }

    /// The ids of the path ending at `head`, root first. Paths never change (nodes are
    /// immutable), so the path of a head whose recent ancestor was read before is that one's
    /// plus a few ids; only a path never seen walks the whole chain in SQL.
    pub(super) async fn path_ids(
        &self,
        conn: &mut dyn Reads,
        session: SessionId,
        head: NodeId,
    ) -> Result<Arc<Vec<NodeId>>> {
        match self.walk_path(Some(&mut *conn), session, head).await? {
            Some(path) => Ok(path),
            None => {
                let path = conn.path_to(session, head).await?;
                Ok(self.remember_path(head, None, path))
            }
        }
    }

    /// The path ending at `head` as remembered, or a remembered one extended by the parent
    /// links of up to [`PATH_EXTEND_STEPS`] nodes after it: those in memory, and, given
    /// `conn`, those read one by one. `None`: not found that way.
    async fn walk_path(
        &self,
        mut conn: Option<&mut dyn Reads>,
        session: SessionId,
        head: NodeId,
    ) -> Result<Option<Arc<Vec<NodeId>>>> {
        if let Some(path) = self.read_cache().paths.get(&head) {
            return Ok(Some(Arc::clone(path)));
        }
        let mut suffix = vec![head];
        let mut at = head;
        for _ in 0..PATH_EXTEND_STEPS {
            let cached_parent = self.read_cache().nodes.get(&at).map(|n| n.parent_id);
            let parent = match (cached_parent, conn.as_deref_mut()) {
                (Some(parent), _) => parent,
                (None, Some(conn)) => conn.parent_of(session, at).await?,
                (None, None) => return Ok(None),
            };
            let Some(parent) = parent else {
                suffix.reverse();
                return Ok(Some(self.remember_path(head, None, suffix)));
            };
            let base = self.read_cache().paths.get(&parent).cloned();
            if let Some(base) = base {
                let mut path = Vec::with_capacity(base.len() + suffix.len());
                path.extend_from_slice(&base);
                path.extend(suffix.iter().rev());
                return Ok(Some(self.remember_path(head, Some(parent), path)));
            }
            suffix.push(parent);
            at = parent;
        }
        Ok(None)
    }

    /// Keeps `path` as the path of `head`; the path it extended (`from`) is usually a branch's
    /// old head, not rendered again, so it is let go.
    fn remember_path(
        &self,
        head: NodeId,
        from: Option<NodeId>,
        path: Vec<NodeId>,
    ) -> Arc<Vec<NodeId>> {
        let path = Arc::new(path);
        let mut cache = self.read_cache();
        if let Some(from) = from {
            cache.paths.remove(&from);
        }
        if cache.paths.len() >= CACHED_PATHS {
            cache.paths.clear();
        }
        cache.paths.insert(head, Arc::clone(&path));
        path
    }

    /// The nodes `ids`, in order: from the cache where read before, the rest in a few queries.
    pub(super) async fn nodes_by_id(
        &self,
        conn: &mut dyn Reads,
        session: SessionId,
        ids: &[NodeId],
    ) -> Result<Vec<Arc<Node>>> {
        let found = self.cached_nodes(ids);
        let missing: Vec<NodeId> = ids
            .iter()
            .zip(&found)
            .filter(|(_, node)| node.is_none())
            .map(|(id, _)| *id)
            .collect();
        let mut fetched_by_id: HashMap<NodeId, Arc<Node>> = HashMap::new();
        if !missing.is_empty() {
            let rows = conn.nodes(session, &missing).await?;
            let fetched: Vec<Arc<Node>> = hydrate(conn, session, rows)
                .await?
                .into_iter()
                .map(Arc::new)
                .collect();
            let mut cache = self.read_cache();
            for node in fetched {
                cache.insert_node(Arc::clone(&node));
                fetched_by_id.insert(node.id, node);
            }
        }
        ids.iter()
            .zip(found)
            .map(|(id, node)| {
                node.or_else(|| fetched_by_id.get(id).cloned())
                    .ok_or_else(|| Error::Corrupt(format!("node {id} of a path is missing")))
            })
            .collect()
    }

    /// The nodes `ids` that memory holds, in order.
    fn cached_nodes(&self, ids: &[NodeId]) -> Vec<Option<Arc<Node>>> {
        // Take the shared nodes under the lock (an eviction meanwhile loses nothing).
        let cache = self.read_cache();
        ids.iter().map(|id| cache.nodes.get(id).cloned()).collect()
    }

    /// Keeps nodes just written, as a read would have found them.
    pub(in crate::store) fn remember_nodes(&self, nodes: Vec<Node>) {
        if nodes.is_empty() {
            return;
        }
        let mut cache = self.read_cache();
        for node in nodes {
            cache.insert_node(Arc::new(node));
        }
    }

    fn read_cache(&self) -> std::sync::MutexGuard<'_, ReadCache> {
        // A panic while holding the lock leaves plain data behind: keep using it.
        self.cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Parents a path lookup follows one by one before it walks the chain in SQL instead.
const PATH_EXTEND_STEPS: usize = 64;
/// Paths remembered at most (about one per branch being worked on).
const CACHED_PATHS: usize = 4096;
/// Bytes of node content kept in memory at most.
const CACHED_NODE_BYTES: usize = 256 * 1024 * 1024;

/// Decoded nodes and the paths through them. Both are immutable in the store, so nothing here
/// is ever stale; it is only bounded, and emptied when a session is deleted.
#[derive(Default)]
pub(in crate::store) struct ReadCache {
    nodes: HashMap<NodeId, Arc<Node>>,
    node_bytes: usize,
    paths: HashMap<NodeId, Arc<Vec<NodeId>>>,
}

impl ReadCache {
    pub(in crate::store) fn clear(&mut self) {
        *self = Self::default();
    }

    fn insert_node(&mut self, node: Arc<Node>) {
        let bytes = 256
            + node
                .content
                .parts()
                .iter()
                .map(domain::Part::byte_len)
                .sum::<usize>();
        if self.node_bytes + bytes > CACHED_NODE_BYTES {
            self.nodes.clear();
            self.node_bytes = 0;
        }
        self.node_bytes += bytes;
        self.nodes.insert(node.id, node);
    }
}

/// The node a path or log starts at; `None` for a branch with no head.
async fn resolve_start(
    conn: &mut dyn Reads,
    session: SessionId,
    target: &PathTarget,
) -> Result<Option<NodeId>> {
    Ok(match target {
        PathTarget::Branch(name) => conn.branch_head(session, name).await?,
        PathTarget::Node(id) => Some(conn.node_row(session, *id, "node_id").await?.id),
        PathTarget::Function(function) => {
            let (head, _) = conn.function_row(session, *function).await?;
            Some(head.unwrap_or(*function))
        }
    })
}

/// Turns rows into nodes, fetching every referenced blob once.
pub(super) async fn hydrate(
    conn: &mut dyn Reads,
    session: SessionId,
    rows: Vec<NodeRow>,
) -> Result<Vec<Node>> {
    let bodies = rows
        .iter()
        .map(|row| Body::parse(&row.body))
        .collect::<Result<Vec<_>>>()?;
    let wanted: HashSet<Hash> = bodies.iter().flat_map(Body::blob_refs).collect();
    let wanted: Vec<Hash> = wanted.into_iter().collect();
    let mut blobs: HashMap<Hash, Vec<u8>> = HashMap::with_capacity(wanted.len());
    if !wanted.is_empty() {
        for blob in conn.blobs(session, &wanted).await? {
            let size = usize::try_from(blob.size).unwrap_or(0);
            blobs.insert(blob.hash, unpack(blob.codec, blob.data, size)?);
        }
    }
    rows.into_iter()
        .zip(bodies)
        .map(|(row, body)| {
            Ok(Node {
                id: row.id,
                parent_id: row.parent_id,
                function_id: row.function_id,
                content: body.decode(&|hash| blobs.get(hash).cloned())?,
                created_at_ms: row.created_at_ms,
                hash: row.hash,
            })
        })
        .collect()
}

/// Completed functions in `nodes` that render in full: (function id, chain head).
fn full_chains(nodes: &[Arc<Node>]) -> Vec<(NodeId, NodeId)> {
    let full: HashSet<NodeId> = nodes
        .iter()
        .filter(|n| {
            matches!(
                n.content,
                NodeContent::FunctionCall {
                    expose: Expose::Full,
                    ..
                }
            )
        })
        .map(|n| n.id)
        .collect();
    nodes
        .iter()
        .filter_map(|n| match &n.content {
            NodeContent::FunctionResult(result) => result.chain.as_ref(),
            _ => None,
        })
        .filter(|chain| full.contains(&chain.function_id))
        .filter_map(|chain| chain.head_id.map(|head| (chain.function_id, head)))
        .collect()
}
