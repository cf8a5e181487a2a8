//! Reads: nodes by id, the log, and a render's path (`load_path`) with the chains it shows in
//! full; the read cache of id paths and decoded nodes, and turning rows into nodes (`hydrate`).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use sqlx::sqlite::SqliteRow;
use sqlx::{QueryBuilder, Row, Sqlite, SqliteConnection};

use super::body::Body;
use super::codec::unpack;
use super::rows::{
    NODE_COLUMNS, NodeRow, branch_head, ensure_session, function_row, hash_column, id_column,
    node_row, node_row_from,
};
use super::{Error, Result, Scoped, Store, compaction, pins};
use crate::domain::{
    self, BranchName, Expose, Hash, Node, NodeContent, NodeId, PathView, SessionId,
};

/// Where a render or log starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathTarget {
    Branch(BranchName),
    Node(NodeId),
    Function(NodeId),
}

/// Bound parameters per `IN (…)` list, well under SQLite's limit.
const IN_CHUNK: usize = 500;

impl Store {
    /// Nodes by id, in the order asked; every id must be a node of `session`.
    pub async fn get_nodes(&self, session: Scoped, ids: &[NodeId]) -> Result<Vec<Node>> {
        let session = session.id();
        let mut conn = self.reader.acquire().await?;
        ensure_session(&mut conn, session).await?;
        let mut rows = Vec::with_capacity(ids.len());
        for (i, id) in ids.iter().enumerate() {
            rows.push(node_row(&mut conn, session, *id, &format!("node_ids[{i}]")).await?);
        }
        hydrate(&mut conn, rows).await
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
        let mut conn = self.reader.acquire().await?;
        ensure_session(&mut conn, session).await?;
        let Some(start) = resolve_start(&mut conn, session, &start).await? else {
            return Ok((Vec::new(), None));
        };
        let mut rows = ancestors(&mut conn, start, Some(limit)).await?;
        rows.reverse();
        let next = rows.last().and_then(|r| r.parent_id);
        let next = if rows.len() == limit as usize {
            next
        } else {
            None
        };
        Ok((hydrate(&mut conn, rows).await?, next))
    }

    /// Loads what a render of `target` needs: the path from the root, the internal chains of
    /// completed functions that expose them in full, and the session's summaries (the engine
    /// keeps those that apply to this path).
    pub async fn load_path(&self, session: Scoped, target: &PathTarget) -> Result<PathView> {
        let session = session.id();
        let mut conn = self.reader.acquire().await?;
        let (start, scope, loaded) = match target {
            PathTarget::Branch(name) => match branch_start(&mut conn, session, name).await? {
                Some((head, summaries, pinned)) => (head, None, Some((summaries, pinned))),
                None => return Ok(PathView::default()),
            },
            PathTarget::Node(_) | PathTarget::Function(_) => {
                ensure_session(&mut conn, session).await?;
                let Some(start) = resolve_start(&mut conn, session, target).await? else {
                    return Ok(PathView::default());
                };
                let scope = match target {
                    PathTarget::Function(function) => Some(*function),
                    _ => {
                        node_row(&mut conn, session, start, "node_id")
                            .await?
                            .function_id
                    }
                };
                (start, scope, None)
            }
        };
        let ids = self.path_ids(&mut conn, start).await?;
        let nodes = self.nodes_by_id(&mut conn, &ids).await?;
        let mut chains = HashMap::new();
        let mut todo = full_chains(&nodes);
        while let Some((function, head)) = todo.pop() {
            let rows = chain(&mut conn, head, function).await?;
            let chain: Vec<Arc<Node>> = hydrate(&mut conn, rows)
                .await?
                .into_iter()
                .map(Arc::new)
                .collect();
            todo.extend(full_chains(&chain));
            chains.insert(function, chain);
        }
        let (summaries, pinned) = match loaded {
            Some(loaded) => loaded,
            None => (
                compaction::summaries(&mut conn, session).await?,
                pins::pinned(&mut conn, session).await?,
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

    /// The ids of the path ending at `head`, root first. Paths never change (nodes are
    /// immutable), so the path of a head whose recent ancestor was read before is that one's
    /// plus a few ids; only a path never seen walks the whole chain in SQL.
    async fn path_ids(
        &self,
        conn: &mut SqliteConnection,
        head: NodeId,
    ) -> Result<Arc<Vec<NodeId>>> {
        if let Some(path) = self.read_cache().paths.get(&head) {
            return Ok(Arc::clone(path));
        }
        let mut suffix = vec![head];
        let mut at = head;
        for _ in 0..PATH_EXTEND_STEPS {
            let cached_parent = self.read_cache().nodes.get(&at).map(|n| n.parent_id);
            let parent = match cached_parent {
                Some(parent) => parent,
                None => {
                    let row = sqlx::query("SELECT parent_id FROM nodes WHERE id = ?")
                        .bind(at.as_bytes().as_slice())
                        .fetch_one(&mut *conn)
                        .await?;
                    id_column(&row, "parent_id")?
                }
            };
            let Some(parent) = parent else {
                suffix.reverse();
                return Ok(self.remember_path(head, None, suffix));
            };
            let base = self.read_cache().paths.get(&parent).cloned();
            if let Some(base) = base {
                let mut path = Vec::with_capacity(base.len() + suffix.len());
                path.extend_from_slice(&base);
                path.extend(suffix.iter().rev());
                return Ok(self.remember_path(head, Some(parent), path));
            }
            suffix.push(parent);
            at = parent;
        }
        let sql = "WITH RECURSIVE walk(id, depth) AS (
                 SELECT ?1, 0
                 UNION ALL
                 SELECT n.parent_id, walk.depth + 1 FROM walk JOIN nodes n ON n.id = walk.id
                 WHERE n.parent_id IS NOT NULL
             )
             SELECT id FROM walk ORDER BY depth DESC";
        let rows = sqlx::query(sql)
            .bind(head.as_bytes().as_slice())
            .fetch_all(&mut *conn)
            .await?;
        let path = rows
            .iter()
            .map(|row| id_column(row, "id")?.ok_or_else(|| Error::Corrupt("a null id".into())))
            .collect::<Result<Vec<_>>>()?;
        Ok(self.remember_path(head, None, path))
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
    async fn nodes_by_id(
        &self,
        conn: &mut SqliteConnection,
        ids: &[NodeId],
    ) -> Result<Vec<Arc<Node>>> {
        // Take the shared nodes under the lock (an eviction meanwhile loses nothing).
        let found: Vec<Option<Arc<Node>>> = {
            let cache = self.read_cache();
            ids.iter().map(|id| cache.nodes.get(id).cloned()).collect()
        };
        let missing: Vec<NodeId> = ids
            .iter()
            .zip(&found)
            .filter(|(_, node)| node.is_none())
            .map(|(id, _)| *id)
            .collect();
        let mut fetched_by_id: HashMap<NodeId, Arc<Node>> = HashMap::new();
        for chunk in missing.chunks(IN_CHUNK) {
            let mut query = QueryBuilder::<Sqlite>::new(format!(
                "SELECT {NODE_COLUMNS} FROM nodes n WHERE n.id IN ("
            ));
            let mut list = query.separated(", ");
            for id in chunk {
                list.push_bind(id.as_bytes().to_vec());
            }
            query.push(")");
            let rows = query
                .build()
                .fetch_all(&mut *conn)
                .await?
                .iter()
                .map(node_row_from)
                .collect::<Result<Vec<_>>>()?;
            let fetched: Vec<Arc<Node>> = hydrate(conn, rows)
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
/// is ever stale; it is only bounded.
#[derive(Default)]
pub(super) struct ReadCache {
    nodes: HashMap<NodeId, Arc<Node>>,
    node_bytes: usize,
    paths: HashMap<NodeId, Arc<Vec<NodeId>>>,
}

impl ReadCache {
    fn insert_node(&mut self, node: Arc<Node>) {
        let bytes = 256
            + node
                .content
                .parts()
                .iter()
                .map(|p| match p {
                    domain::Part::Text(t) => t.len(),
                    domain::Part::Media { source, .. } => match source {
                        domain::MediaSource::Data(d) => d.len(),
                        domain::MediaSource::Url(u) => u.len(),
                    },
                })
                .sum::<usize>();
        if self.node_bytes + bytes > CACHED_NODE_BYTES {
            self.nodes.clear();
            self.node_bytes = 0;
        }
        self.node_bytes += bytes;
        self.nodes.insert(node.id, node);
    }
}

/// What a render of a branch starts from: its head, the session's summaries and pins.
type BranchStart = (NodeId, Vec<domain::Summary>, Vec<NodeId>);

/// A render's common start in one round trip: the head of branch `name` (`None` while it has
/// none), the session's summaries and its pinned nodes; not-found errors name the session,
/// then the branch.
async fn branch_start(
    conn: &mut SqliteConnection,
    session: SessionId,
    name: &BranchName,
) -> Result<Option<BranchStart>> {
    let sql = format!(
        "SELECT 0 AS part, b.name AS branch, b.head_id FROM sessions s
             LEFT JOIN branches b ON b.session_id = s.id AND b.name = ?2
         WHERE s.id = ?1;
         SELECT 1 AS part, {} FROM summaries WHERE session_id = ?1 ORDER BY created_at_ms, id;
         SELECT 2 AS part, node_id, pinned FROM pins WHERE session_id = ?1 ORDER BY seq",
        compaction::SUMMARY_COLUMNS
    );
    let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(session.as_bytes().as_slice())
        .bind(name.as_str())
        .fetch_all(&mut *conn)
        .await?;
    let mut rows = rows.iter();
    let Some(first) = rows
        .next()
        .filter(|r| r.try_get::<i64, _>("part").ok() == Some(0))
    else {
        return Err(domain::Error::not_found("session", session).into());
    };
    if first.try_get::<Option<String>, _>("branch")?.is_none() {
        return Err(domain::Error::not_found("branch", name).into());
    }
    let Some(head) = id_column(first, "head_id")? else {
        return Ok(None);
    };
    let part = |r: &SqliteRow| r.try_get::<i64, _>("part").unwrap_or(-1);
    let rest: Vec<&SqliteRow> = rows.collect();
    let summaries = rest
        .iter()
        .filter(|r| part(r) == 1)
        .map(|r| compaction::summary_from(r))
        .collect::<Result<Vec<_>>>()?;
    let pinned = pins::fold(rest.iter().filter(|r| part(r) == 2).map(|r| {
        Ok((
            id_column(r, "node_id")?,
            r.try_get::<i64, _>("pinned")? != 0,
        ))
    }))?;
    Ok(Some((head, summaries, pinned)))
}

/// The node a path or log starts at; `None` for a branch with no head.
async fn resolve_start(
    conn: &mut SqliteConnection,
    session: SessionId,
    target: &PathTarget,
) -> Result<Option<NodeId>> {
    Ok(match target {
        PathTarget::Branch(name) => branch_head(conn, session, name).await?,
        PathTarget::Node(id) => Some(node_row(conn, session, *id, "node_id").await?.id),
        PathTarget::Function(function) => {
            let (head, _) = function_row(conn, session, *function).await?;
            Some(head.unwrap_or(*function))
        }
    })
}

/// `start` and its ancestors, oldest first, at most `limit` of them counted from `start`.
async fn ancestors(
    conn: &mut SqliteConnection,
    start: NodeId,
    limit: Option<u32>,
) -> Result<Vec<NodeRow>> {
    let sql = format!(
        "WITH RECURSIVE walk(id, depth) AS (
             SELECT ?1, 0
             UNION ALL
             SELECT n.parent_id, walk.depth + 1 FROM walk JOIN nodes n ON n.id = walk.id
             WHERE n.parent_id IS NOT NULL AND walk.depth + 1 < ?2
         )
         SELECT {NODE_COLUMNS} FROM walk JOIN nodes n ON n.id = walk.id ORDER BY walk.depth DESC"
    );
    let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(start.as_bytes().as_slice())
        .bind(limit.map_or(i64::MAX, i64::from))
        .fetch_all(&mut *conn)
        .await?;
    rows.iter().map(node_row_from).collect()
}

/// The internal chain of `function` ending at `head`, oldest first.
async fn chain(
    conn: &mut SqliteConnection,
    head: NodeId,
    function: NodeId,
) -> Result<Vec<NodeRow>> {
    let sql = format!(
        "WITH RECURSIVE walk(id, depth) AS (
             SELECT ?1, 0
             UNION ALL
             SELECT p.id, walk.depth + 1 FROM walk
             JOIN nodes c ON c.id = walk.id JOIN nodes p ON p.id = c.parent_id
             WHERE p.function_id = ?2
         )
         SELECT {NODE_COLUMNS} FROM walk JOIN nodes n ON n.id = walk.id ORDER BY walk.depth DESC"
    );
    let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(head.as_bytes().as_slice())
        .bind(function.as_bytes().as_slice())
        .fetch_all(&mut *conn)
        .await?;
    rows.iter().map(node_row_from).collect()
}

/// Turns rows into nodes, fetching every referenced blob once.
async fn hydrate(conn: &mut SqliteConnection, rows: Vec<NodeRow>) -> Result<Vec<Node>> {
    let bodies = rows
        .iter()
        .map(|row| Body::parse(&row.body))
        .collect::<Result<Vec<_>>>()?;
    let wanted: HashSet<Hash> = bodies.iter().flat_map(Body::blob_refs).collect();
    let wanted: Vec<Hash> = wanted.into_iter().collect();
    let mut blobs: HashMap<Hash, Vec<u8>> = HashMap::with_capacity(wanted.len());
    for chunk in wanted.chunks(IN_CHUNK) {
        let mut query = QueryBuilder::<Sqlite>::new(
            "SELECT hash, size, codec, data FROM blobs WHERE hash IN (",
        );
        let mut list = query.separated(", ");
        for hash in chunk {
            list.push_bind(hash.0.to_vec());
        }
        query.push(")");
        for row in query.build().fetch_all(&mut *conn).await? {
            let size: i64 = row.try_get("size")?;
            let data = unpack(
                row.try_get("codec")?,
                row.try_get("data")?,
                usize::try_from(size).unwrap_or(0),
            )?;
            blobs.insert(hash_column(&row, "hash")?, data);
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
