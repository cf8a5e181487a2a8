//! SQLite persistence: sessions, the node DAG, blobs, branches, functions. The only place with SQL.
//!
//! Writes are serialised by the store's write lock, each in `BEGIN IMMEDIATE`, so a
//! read-then-write transaction never fails half-way on a lock: appends on the group committer's
//! own connection (`commit`), the rest on one sqlx writer connection. Readers use their own pool
//! (WAL lets them run beside the writers). An append is acknowledged only after its COMMIT.

mod body;
mod check;
mod commit;
mod compaction;
mod fault;
mod pins;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow,
    SqliteSynchronous,
};
use sqlx::{QueryBuilder, Row, Sqlite, SqliteConnection};
use tokio::sync::{mpsc, oneshot};

use commit::{Job, MAX_BATCH, Message};

use crate::domain::{
    self, Branch, BranchName, Expose, Hash, Node, NodeContent, NodeId, PathView, Session,
    SessionId, Tenant,
};
use body::Body;
pub use compaction::{Applied, CompactionPlan, PlanState};
pub use fault::Fault;
use fault::Quota;

/// Errors of the store: domain errors pass through; database failures stay opaque to clients.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Domain(#[from] domain::Error),
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    /// A failure on the group committer's connection.
    #[error("database: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("migration: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("corrupt store: {0}")]
    Corrupt(String),
    /// The group commit this append was part of failed; nothing of the batch is written.
    #[error("the batch this write was committed with failed: {detail}")]
    Batch { fault: Fault, detail: String },
    /// The store is shutting down.
    #[error("the store is closed")]
    Closed,
    /// The database file cannot be used: found at open, before anything was written to it.
    #[error("{}: {problem}", path.display())]
    Unusable { path: PathBuf, problem: String },
}

type Result<T, E = Error> = std::result::Result<T, E>;

/// Where an append goes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum AppendTarget {
    Branch(BranchName),
    /// The internal chain of a running function.
    Function(NodeId),
}

#[derive(Debug, Clone)]
pub struct AppendRequest {
    pub session: SessionId,
    pub target: AppendTarget,
    /// `Some(None)`: the target must have no head yet.
    pub expected_head: Option<Option<NodeId>>,
    pub idempotency_key: Option<String>,
    pub nodes: Vec<NodeContent>,
    /// Indexes of the nodes to pin as they are written.
    pub pinned: Vec<usize>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppendOutcome {
    pub node_ids: Vec<String>,
    pub head_id: String,
    pub head_hash: String,
}

/// Where a render or log starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathTarget {
    Branch(BranchName),
    Node(NodeId),
    Function(NodeId),
}

#[derive(Clone)]
pub struct Store {
    writer: SqlitePool,
    reader: SqlitePool,
    cache: Arc<std::sync::Mutex<ReadCache>>,
    /// Appends go to the group committer, which writes many in one transaction and one fsync.
    appends: mpsc::Sender<Message>,
    /// Taken by every write, on the committer's connection or the writer pool's, so that one
    /// waits here in turn rather than in SQLite's busy handler (which sleeps and is unfair).
    write_lock: Arc<tokio::sync::Mutex<()>>,
    path: Arc<PathBuf>,
    quota: Arc<Quota>,
}

/// How the store opens its database: `ctxd serve`'s flags.
#[derive(Debug, Clone)]
pub struct Config {
    /// How long a write waits for a lock another connection or process holds before it fails
    /// (retrying meanwhile); the write is then refused, never lost.
    pub busy_timeout: Duration,
    /// The most bytes the database may take (`PRAGMA max_page_count` on every writer
    /// connection); `None`: as much as the disk holds.
    pub max_db_bytes: Option<u64>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            busy_timeout: BUSY_TIMEOUT,
            max_db_bytes: None,
        }
    }
}

const READERS: u32 = 8;
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound parameters per `IN (…)` list, well under SQLite's limit.
const IN_CHUNK: usize = 500;

impl Store {
    /// Opens (creating and migrating if needed) the SQLite file at `path`.
    pub async fn open(path: &Path) -> Result<Self> {
        Self::open_with(path, Config::default()).await
    }

    /// [`Store::open`] with `config`. An existing file is checked first (header, size, WAL
    /// header, permissions, `PRAGMA quick_check`) and refused with [`Error::Unusable`], naming
    /// the file and the problem, before anything writes to it.
    pub async fn open_with(path: &Path, config: Config) -> Result<Self> {
        if let check::Found::Database { wal } = check::before_open(path)? {
            check::quick_check(path, wal).await?;
        }
        let unusable = |e: Error| match e {
            Error::Unusable { .. } => e,
            other => check::unusable(path, fault::describe(&other)),
        };
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .foreign_keys(true)
            .busy_timeout(config.busy_timeout);
        let quota = Arc::new(Quota::new(config.max_db_bytes));
        // A local file needs no liveness ping before each use, and each would cost a round
        // trip to the connection's thread.
        let writer = fault::writer_pool(Arc::clone(&quota))
            .test_before_acquire(false)
            .connect_with(options.clone())
            .await
            .map_err(|e| unusable(e.into()))?;
        sqlx::migrate!("./migrations")
            .run(&writer)
            .await
            .map_err(|e| unusable(e.into()))?;
        let reader = SqlitePoolOptions::new()
            .max_connections(READERS)
            .test_before_acquire(false)
            .connect_with(options.read_only(true))
            .await
            .map_err(|e| unusable(e.into()))?;
        let committer = commit::connect(path, &config).map_err(|e| unusable(e.into()))?;
        let write_lock = Arc::new(tokio::sync::Mutex::new(()));
        let (appends, inbox) = mpsc::channel(MAX_BATCH * 4);
        commit::spawn(
            committer,
            Arc::clone(&write_lock),
            Arc::clone(&quota),
            inbox,
        )
        .map_err(|e| check::unusable(path, format!("cannot start the committer: {e}")))?;
        Ok(Self {
            writer,
            write_lock,
            reader,
            cache: Arc::default(),
            appends,
            path: Arc::new(path.to_path_buf()),
            quota,
        })
    }

    /// Sets the size limit of the database (`None`: none) for every writer connection from now
    /// on, and returns the limit in effect in bytes: never below the size already in use.
    /// Raising it lets writes refused as full succeed again, without a restart.
    pub async fn set_max_db_bytes(&self, bytes: Option<u64>) -> Result<u64> {
        self.quota.set(bytes);
        // The pool has one writer connection: this waits for the write in progress, and a
        // connection opened later takes the new limit when it connects.
        let mut conn = self.writer.acquire().await?;
        Ok(self.quota.apply(&mut conn).await?)
    }

    /// Stops the group committer (after the batch in hand) and closes both pools; the last
    /// connection to close checkpoints the WAL.
    pub async fn close(&self) {
        let (reply, closed) = oneshot::channel();
        if self.appends.send(Message::Close(reply)).await.is_ok() {
            let _ = closed.await;
        }
        self.reader.close().await;
        self.writer.close().await;
    }

    /// Opens a write transaction on the writer pool's connection, in turn with the committer.
    async fn begin_write(&self) -> Result<WriteTx> {
        let lock = Arc::clone(&self.write_lock).lock_owned().await;
        let tx = self.writer.begin_with("BEGIN IMMEDIATE").await?;
        Ok(WriteTx { tx, _lock: lock })
    }

    // ------------------------------------------------------------ sessions

    /// A new session of `tenant`, with branch `main` and no head; with a `key` already used
    /// for the same request, the session that request created.
    pub async fn create_session(
        &self,
        tenant: &Tenant,
        metadata: BTreeMap<String, String>,
        key: Option<&CreationKey>,
    ) -> Result<Session> {
        let id = SessionId::new();
        let now = now_ms();
        let mut tx = self.begin_write().await?;
        if let Some(existing) = keyed_session(&mut tx, tenant, key).await? {
            tx.rollback().await?;
            return self.get_session(existing).await;
        }
        insert_session(&mut tx, id, tenant, now, &metadata).await?;
        remember_key(&mut tx, tenant, key, id, now).await?;
        tx.commit().await?;
        Ok(Session {
            id,
            created_at_ms: now,
            metadata,
            compaction_count: 0,
            branches: vec![Branch {
                name: BranchName::main(),
                head: None,
                updated_at_ms: now,
            }],
        })
    }

    /// The tenant `id` belongs to; `None` for an unknown session.
    pub async fn session_tenant(&self, id: SessionId) -> Result<Option<Tenant>> {
        let mut conn = self.reader.acquire().await?;
        let tenant: Option<String> = sqlx::query_scalar("SELECT tenant FROM sessions WHERE id = ?")
            .bind(id.as_bytes().as_slice())
            .fetch_optional(&mut *conn)
            .await?;
        Ok(tenant.map(Tenant::new))
    }

    pub async fn get_session(&self, id: SessionId) -> Result<Session> {
        let mut conn = self.reader.acquire().await?;
        let row = sqlx::query(
            "SELECT id, created_at_ms, metadata, compaction_count FROM sessions WHERE id = ?",
        )
        .bind(id.as_bytes().as_slice())
        .fetch_optional(&mut *conn)
        .await?
        .ok_or_else(|| domain::Error::not_found("session", id))?;
        session_from_row(&mut conn, &row).await
    }

    /// Sessions newest first, starting after `after`; also returns the cursor of the next page.
    pub async fn list_sessions(
        &self,
        tenant: &Tenant,
        page_size: u32,
        after: Option<SessionId>,
    ) -> Result<(Vec<Session>, Option<SessionId>)> {
        let mut conn = self.reader.acquire().await?;
        // A UUID v7 sorts by creation time, so the id is the cursor. One extra row tells
        // whether a next page exists.
        let after = after.map(|id| id.as_bytes().to_vec());
        let rows = sqlx::query(
            "SELECT id, created_at_ms, metadata, compaction_count FROM sessions
             WHERE tenant = ?1 AND (?2 IS NULL OR id < ?2) ORDER BY id DESC LIMIT ?3",
        )
        .bind(tenant.as_str())
        .bind(after)
        .bind(i64::from(page_size) + 1)
        .fetch_all(&mut *conn)
        .await?;
        let mut sessions = Vec::with_capacity(rows.len());
        for row in rows.iter().take(page_size as usize) {
            sessions.push(session_from_row(&mut conn, row).await?);
        }
        let next = (rows.len() > page_size as usize)
            .then(|| sessions.last().map(|s| s.id))
            .flatten();
        Ok((sessions, next))
    }

    // ------------------------------------------------------------ branches

    pub async fn list_branches(&self, session: SessionId) -> Result<Vec<Branch>> {
        let mut conn = self.reader.acquire().await?;
        ensure_session(&mut conn, session).await?;
        branches(&mut conn, session).await
    }

    /// Creates a branch at `from` (a top-level node of the session), or with no head.
    pub async fn create_branch(
        &self,
        session: SessionId,
        name: BranchName,
        from: Option<NodeId>,
    ) -> Result<Branch> {
        let now = now_ms();
        let mut tx = self.begin_write().await?;
        ensure_session(&mut tx, session).await?;
        let head = match from {
            Some(id) => {
                let node = node_row(&mut tx, session, id, "from_node_id").await?;
                if let Some(function) = node.function_id {
                    return Err(domain::Error::invalid(
                        "from_node_id",
                        format!(
                            "node {id} is inside function {function}; branch at a top-level node"
                        ),
                    )
                    .into());
                }
                Some((id, node.hash))
            }
            None => None,
        };
        let inserted = sqlx::query(
            "INSERT INTO branches (session_id, name, head_id, updated_at_ms) VALUES (?, ?, ?, ?)",
        )
        .bind(session.as_bytes().as_slice())
        .bind(name.as_str())
        .bind(head.map(|(id, _)| id.as_bytes().to_vec()))
        .bind(now)
        .execute(&mut *tx)
        .await;
        match inserted {
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
                return Err(domain::Error::AlreadyExists(format!(
                    "name: branch {name:?} already exists in session {session}"
                ))
                .into());
            }
            other => other?,
        };
        tx.commit().await?;
        Ok(Branch {
            name,
            head,
            updated_at_ms: now,
        })
    }

    /// Removes the ref; the nodes stay.
    pub async fn delete_branch(&self, session: SessionId, name: &BranchName) -> Result<()> {
        let mut tx = self.begin_write().await?;
        ensure_session(&mut tx, session).await?;
        let done = sqlx::query("DELETE FROM branches WHERE session_id = ? AND name = ?")
            .bind(session.as_bytes().as_slice())
            .bind(name.as_str())
            .execute(&mut *tx)
            .await?;
        if done.rows_affected() == 0 {
            return Err(domain::Error::not_found("branch", name).into());
        }
        tx.commit().await?;
        Ok(())
    }

    // ------------------------------------------------------------ append

    /// Appends nodes atomically: all are checked and written, or none is. Concurrent appends
    /// (to any session or branch) share a transaction and its one fsync; each is acknowledged
    /// only after that COMMIT.
    pub async fn append(&self, request: AppendRequest) -> Result<AppendOutcome> {
        let (reply, answer) = oneshot::channel();
        self.appends
            .send(Message::Append(Job::new(request, reply)))
            .await
            .map_err(|_| Error::Closed)?;
        answer
            .await
            .map_err(|_| Error::Closed)?
            .map_err(|e| self.refine(e))
    }

    /// A write that failed on an I/O error while the disk has no room failed for want of space.
    fn refine(&self, error: Error) -> Error {
        match error {
            Error::Batch {
                fault: Fault::Unavailable,
                detail,
            } if fault::no_room(&self.path) => Error::Batch {
                fault: Fault::Full,
                detail,
            },
            other => other,
        }
    }

    // ------------------------------------------------------------ import

    /// Creates a session holding an imported plan, in one transaction: a plan the rules refuse
    /// anywhere leaves nothing behind.
    pub async fn import(
        &self,
        tenant: &Tenant,
        metadata: BTreeMap<String, String>,
        plan: &domain::Plan,
        key: Option<&CreationKey>,
    ) -> Result<Session> {
        let session = SessionId::new();
        let now = now_ms();
        let mut tx = self.begin_write().await?;
        if let Some(existing) = keyed_session(&mut tx, tenant, key).await? {
            tx.rollback().await?;
            return self.get_session(existing).await;
        }
        insert_session(&mut tx, session, tenant, now, &metadata).await?;
        remember_key(&mut tx, tenant, key, session, now).await?;
        let ops = &plan.ops;
        let mut writes = commit::Batch::standalone(now);
        let mut ids: Vec<Option<NodeId>> = vec![None; ops.len()];
        let mut top_level: Vec<NodeId> = Vec::new();
        let mut i = 0;
        while i < ops.len() {
            match &ops[i] {
                domain::Op::Node { scope, .. } => {
                    // One write per run of nodes in the same chain.
                    let run_end = (i..ops.len())
                        .find(|&j| !matches!(&ops[j], domain::Op::Node { scope: s, .. } if s == scope))
                        .unwrap_or(ops.len());
                    let (mut contents, lines): (Vec<NodeContent>, Vec<usize>) = ops[i..run_end]
                        .iter()
                        .filter_map(|op| match op {
                            domain::Op::Node { content, line, .. } => {
                                Some((content.clone(), *line))
                            }
                            domain::Op::Summary { .. } => None,
                        })
                        .unzip();
                    let target = match scope {
                        None => AppendTarget::Branch(BranchName::main()),
                        Some(op) => AppendTarget::Function(ids[*op].ok_or_else(|| {
                            Error::Corrupt("an import plan opens a function after its chain".into())
                        })?),
                    };
                    let written = writes
                        .write(&mut *tx, session, &target, &mut contents, &|k| {
                            format!("line {}", lines[k])
                        })
                        .await?;
                    for (k, (id, _)) in written.iter().enumerate() {
                        ids[i + k] = Some(*id);
                        if scope.is_none() {
                            top_level.push(*id);
                        }
                    }
                    i = run_end;
                }
                domain::Op::Summary { text, line } => {
                    let Some(&base) = top_level.last() else {
                        return Err(domain::Error::invalid(
                            format!("line {line}"),
                            "a compact summary before any message",
                        )
                        .into());
                    };
                    compaction::insert_imported_summary(
                        &mut tx, session, &top_level, text, base, now,
                    )
                    .await?;
                    i += 1;
                }
            }
        }
        tx.commit().await?;
        self.get_session(session).await
    }

    // ------------------------------------------------------------ reading

    /// Nodes by id, in the order asked; every id must be a node of `session`.
    pub async fn get_nodes(&self, session: SessionId, ids: &[NodeId]) -> Result<Vec<Node>> {
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
        session: SessionId,
        start: PathTarget,
        limit: u32,
    ) -> Result<(Vec<Node>, Option<NodeId>)> {
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
    pub async fn load_path(&self, session: SessionId, target: &PathTarget) -> Result<PathView> {
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
struct ReadCache {
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

/// A transaction on the writer pool's connection, holding the store's write lock until it
/// ends. Dropped without [`WriteTx::commit`], it rolls back.
struct WriteTx {
    // Declared first: dropped (its ROLLBACK queued) before the lock is released.
    tx: sqlx::Transaction<'static, Sqlite>,
    _lock: tokio::sync::OwnedMutexGuard<()>,
}

impl WriteTx {
    async fn commit(self) -> Result<()> {
        Ok(self.tx.commit().await?)
    }

    async fn rollback(self) -> Result<()> {
        Ok(self.tx.rollback().await?)
    }
}

impl std::ops::Deref for WriteTx {
    type Target = SqliteConnection;

    fn deref(&self) -> &SqliteConnection {
        &self.tx
    }
}

impl std::ops::DerefMut for WriteTx {
    fn deref_mut(&mut self) -> &mut SqliteConnection {
        &mut self.tx
    }
}

// ---------------------------------------------------------------- helpers

/// The wall clock in Unix milliseconds: what the store stamps on what it writes, and what a
/// render's `now` defaults to. The engine never calls it.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

struct NodeRow {
    id: NodeId,
    parent_id: Option<NodeId>,
    function_id: Option<NodeId>,
    created_at_ms: i64,
    hash: Hash,
    body: String,
}

const NODE_COLUMNS: &str =
    "n.id, n.parent_id, n.function_id, n.created_at_ms, n.hash, n.body, n.body_z";

/// A nullable 16-byte id column (any UUID-keyed id).
fn uuid_column(row: &SqliteRow, column: &str) -> Result<Option<[u8; 16]>> {
    uuid_from(row.try_get(column)?, column)
}

/// The value of a nullable 16-byte id column, however it was read.
fn uuid_from(bytes: Option<Vec<u8>>, column: &str) -> Result<Option<[u8; 16]>> {
    bytes
        .map(|b| {
            <[u8; 16]>::try_from(b.as_slice())
                .map_err(|_| Error::Corrupt(format!("{column} is not 16 bytes")))
        })
        .transpose()
}

/// A non-null 16-byte id column.
fn required_uuid(row: &SqliteRow, column: &str) -> Result<[u8; 16]> {
    uuid_column(row, column)?.ok_or_else(|| Error::Corrupt(format!("{column} is null")))
}

fn id_column(row: &SqliteRow, column: &str) -> Result<Option<NodeId>> {
    Ok(uuid_column(row, column)?.map(NodeId::from_bytes))
}

fn hash_column(row: &SqliteRow, column: &str) -> Result<Hash> {
    hash_from(&row.try_get::<Vec<u8>, _>(column)?, column)
}

/// The value of a 32-byte hash column, however it was read.
fn hash_from(bytes: &[u8], column: &str) -> Result<Hash> {
    <[u8; 32]>::try_from(bytes)
        .map(Hash)
        .map_err(|_| Error::Corrupt(format!("{column} is not 32 bytes")))
}

fn node_row_from(row: &SqliteRow) -> Result<NodeRow> {
    NodeRow::from_columns(NodeColumns {
        id: row.try_get("id")?,
        parent_id: row.try_get("parent_id")?,
        function_id: row.try_get("function_id")?,
        created_at_ms: row.try_get("created_at_ms")?,
        hash: row.try_get("hash")?,
        body: row.try_get("body")?,
        body_z: row.try_get("body_z")?,
    })
}

/// A node row's columns ([`NODE_COLUMNS`]) as read, by sqlx or by the committer's connection.
struct NodeColumns {
    id: Vec<u8>,
    parent_id: Option<Vec<u8>>,
    function_id: Option<Vec<u8>>,
    created_at_ms: i64,
    hash: Vec<u8>,
    body: String,
    body_z: Option<Vec<u8>>,
}

impl NodeRow {
    fn from_columns(c: NodeColumns) -> Result<Self> {
        let id = |bytes, column| Ok::<_, Error>(uuid_from(bytes, column)?.map(NodeId::from_bytes));
        Ok(NodeRow {
            id: id(Some(c.id), "id")?.ok_or_else(|| Error::Corrupt("node without id".into()))?,
            parent_id: id(c.parent_id, "parent_id")?,
            function_id: id(c.function_id, "function_id")?,
            created_at_ms: c.created_at_ms,
            hash: hash_from(&c.hash, "hash")?,
            body: match c.body_z {
                Some(packed) => unpack_body(&packed)?,
                None => c.body,
            },
        })
    }
}

/// The idempotency key of a write that creates a session, and the hash of what it asked for.
#[derive(Debug, Clone)]
pub struct CreationKey {
    pub key: String,
    pub request: Hash,
}

/// The session an earlier call with `key` created; a key used for a different request is
/// refused.
async fn keyed_session(
    conn: &mut SqliteConnection,
    tenant: &Tenant,
    key: Option<&CreationKey>,
) -> Result<Option<SessionId>> {
    let Some(key) = key else { return Ok(None) };
    let Some(row) = sqlx::query(
        "SELECT request_hash, session_id FROM session_keys WHERE tenant = ? AND key = ?",
    )
    .bind(tenant.as_str())
    .bind(&key.key)
    .fetch_optional(&mut *conn)
    .await?
    else {
        return Ok(None);
    };
    if hash_column(&row, "request_hash")? != key.request {
        return Err(domain::Error::FailedPrecondition(format!(
            "idempotency_key: {:?} was used for a different request",
            key.key
        ))
        .into());
    }
    Ok(Some(SessionId::from_bytes(required_uuid(
        &row,
        "session_id",
    )?)))
}

async fn remember_key(
    conn: &mut SqliteConnection,
    tenant: &Tenant,
    key: Option<&CreationKey>,
    session: SessionId,
    now: i64,
) -> Result<()> {
    let Some(key) = key else { return Ok(()) };
    sqlx::query(
        "INSERT INTO session_keys (tenant, key, request_hash, session_id, created_at_ms)
         VALUES (?, ?, ?, ?, ?)",
    )
    .bind(tenant.as_str())
    .bind(&key.key)
    .bind(key.request.0.as_slice())
    .bind(session.as_bytes().as_slice())
    .bind(now)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Inserts a session row and its empty `main` branch.
async fn insert_session(
    conn: &mut SqliteConnection,
    id: SessionId,
    tenant: &Tenant,
    now: i64,
    metadata: &BTreeMap<String, String>,
) -> Result<()> {
    let metadata = serde_json::to_string(metadata).expect("a string map serializes");
    sqlx::query("INSERT INTO sessions (id, tenant, created_at_ms, metadata) VALUES (?, ?, ?, ?)")
        .bind(id.as_bytes().as_slice())
        .bind(tenant.as_str())
        .bind(now)
        .bind(&metadata)
        .execute(&mut *conn)
        .await?;
    sqlx::query("INSERT INTO branches (session_id, name, updated_at_ms) VALUES (?, ?, ?)")
        .bind(id.as_bytes().as_slice())
        .bind(BranchName::main().as_str())
        .bind(now)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// The statements both the sqlx connections and the committer's run (`?` binds in order in both).
const SESSION_EXISTS: &str = "SELECT 1 FROM sessions WHERE id = ?";
const BRANCH_HEAD: &str = "SELECT head_id FROM branches WHERE session_id = ? AND name = ?";
const FUNCTION_ROW: &str =
    "SELECT head_id, closed_by FROM functions WHERE id = ? AND session_id = ?";
const NODE_ROW: &str = "SELECT n.id, n.parent_id, n.function_id, n.created_at_ms, n.hash, n.body,
    n.body_z FROM nodes n WHERE n.id = ? AND n.session_id = ?";

async fn ensure_session(conn: &mut SqliteConnection, session: SessionId) -> Result<()> {
    sqlx::query(SESSION_EXISTS)
        .bind(session.as_bytes().as_slice())
        .fetch_optional(&mut *conn)
        .await?
        .ok_or_else(|| domain::Error::not_found("session", session))?;
    Ok(())
}

async fn session_from_row(conn: &mut SqliteConnection, row: &SqliteRow) -> Result<Session> {
    let id = SessionId::from_bytes(required_uuid(row, "id")?);
    let metadata: String = row.try_get("metadata")?;
    let compaction_count: i64 = row.try_get("compaction_count")?;
    Ok(Session {
        id,
        created_at_ms: row.try_get("created_at_ms")?,
        metadata: serde_json::from_str(&metadata)
            .map_err(|e| Error::Corrupt(format!("session metadata: {e}")))?,
        compaction_count: u32::try_from(compaction_count).unwrap_or(u32::MAX),
        branches: branches(conn, id).await?,
    })
}

async fn branches(conn: &mut SqliteConnection, session: SessionId) -> Result<Vec<Branch>> {
    let rows = sqlx::query(
        "SELECT b.name, b.head_id, b.updated_at_ms, n.hash FROM branches b
         LEFT JOIN nodes n ON n.id = b.head_id
         WHERE b.session_id = ? ORDER BY b.name",
    )
    .bind(session.as_bytes().as_slice())
    .fetch_all(&mut *conn)
    .await?;
    rows.iter()
        .map(|row| {
            let head = match id_column(row, "head_id")? {
                Some(id) => Some((id, hash_column(row, "hash")?)),
                None => None,
            };
            Ok(Branch {
                name: BranchName::from_stored(row.try_get("name")?),
                head,
                updated_at_ms: row.try_get("updated_at_ms")?,
            })
        })
        .collect()
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

async fn branch_head(
    conn: &mut SqliteConnection,
    session: SessionId,
    name: &BranchName,
) -> Result<Option<NodeId>> {
    let row = sqlx::query(BRANCH_HEAD)
        .bind(session.as_bytes().as_slice())
        .bind(name.as_str())
        .fetch_optional(&mut *conn)
        .await?
        .ok_or_else(|| domain::Error::not_found("branch", name))?;
    id_column(&row, "head_id")
}

/// A function's chain head and whether it is closed.
async fn function_row(
    conn: &mut SqliteConnection,
    session: SessionId,
    function: NodeId,
) -> Result<(Option<NodeId>, bool)> {
    let row = sqlx::query(FUNCTION_ROW)
        .bind(function.as_bytes().as_slice())
        .bind(session.as_bytes().as_slice())
        .fetch_optional(&mut *conn)
        .await?
        .ok_or_else(|| domain::Error::not_found("function", function))?;
    Ok((
        id_column(&row, "head_id")?,
        id_column(&row, "closed_by")?.is_some(),
    ))
}

/// One node of `session`; `field` names the request field in the not-found error.
async fn node_row(
    conn: &mut SqliteConnection,
    session: SessionId,
    id: NodeId,
    field: &str,
) -> Result<NodeRow> {
    let row = sqlx::query(NODE_ROW)
        .bind(id.as_bytes().as_slice())
        .bind(session.as_bytes().as_slice())
        .fetch_optional(&mut *conn)
        .await?
        .ok_or_else(|| domain::Error::NotFound {
            what: "node",
            id: format!("{id} ({field})"),
        })?;
    node_row_from(&row)
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

/// Blobs shorter than this stay raw: compression would not pay for its frame.
const COMPRESS_MIN_BYTES: usize = 128;
const CODEC_RAW: i64 = 0;
const CODEC_ZSTD: i64 = 1;
/// zstd's default level: measured on agent transcripts it keeps most of the gain of higher
/// levels at a fraction of their time.
const ZSTD_LEVEL: i32 = 3;

/// The stored form of a blob: zstd when that saves at least an eighth, raw otherwise.
fn compress(data: &[u8]) -> (i64, std::borrow::Cow<'_, [u8]>) {
    thread_local! {
        // A zstd context costs more to set up than a small blob costs to compress.
        static COMPRESSOR: std::cell::RefCell<Option<zstd::bulk::Compressor<'static>>> =
            std::cell::RefCell::new(zstd::bulk::Compressor::new(ZSTD_LEVEL).ok());
    }
    if data.len() >= COMPRESS_MIN_BYTES {
        let packed =
            COMPRESSOR.with(|c| c.borrow_mut().as_mut().and_then(|c| c.compress(data).ok()));
        if let Some(packed) = packed
            && packed.len() < data.len() - data.len() / 8
        {
            return (CODEC_ZSTD, std::borrow::Cow::Owned(packed));
        }
    }
    (CODEC_RAW, std::borrow::Cow::Borrowed(data))
}

/// A stored blob's bytes, decoded when compressed (`size` is the raw size).
fn unpack(codec: i64, data: Vec<u8>, size: usize) -> Result<Vec<u8>> {
    match codec {
        CODEC_RAW => Ok(data),
        CODEC_ZSTD => decompress(&data, size)
            .map_err(|e| Error::Corrupt(format!("a zstd blob does not decode: {e}"))),
        other => Err(Error::Corrupt(format!("unknown blob codec {other}"))),
    }
}

/// Decodes one zstd frame of `size` raw bytes with this thread's decoder.
fn decompress(packed: &[u8], size: usize) -> std::io::Result<Vec<u8>> {
    thread_local! {
        // A zstd context costs more to set up than a small body or blob costs to decode.
        static DECOMPRESSOR: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> =
            std::cell::RefCell::new(zstd::bulk::Decompressor::new().ok());
    }
    DECOMPRESSOR
        .with(|d| d.borrow_mut().as_mut().map(|d| d.decompress(packed, size)))
        .unwrap_or_else(|| zstd::bulk::decompress(packed, size))
}

/// The largest node body a stored frame may claim: far over any request the server takes, so
/// only a damaged frame is refused.
const MAX_BODY_BYTES: u64 = 1 << 30;

/// A node body stored compressed (`body_z`).
fn unpack_body(packed: &[u8]) -> Result<String> {
    let corrupt = |e: &dyn std::fmt::Display| {
        Error::Corrupt(format!("a compressed node body does not decode: {e}"))
    };
    // Bodies are written whole by `compress`, so their frames record their size.
    let size = match zstd::zstd_safe::get_frame_content_size(packed) {
        Ok(Some(size)) if size <= MAX_BODY_BYTES => {
            usize::try_from(size).map_err(|e| corrupt(&e))?
        }
        Ok(_) | Err(_) => return Err(corrupt(&"its frame has no valid size")),
    };
    let bytes = decompress(packed, size).map_err(|e| corrupt(&e))?;
    String::from_utf8(bytes)
        .map_err(|_| Error::Corrupt("a compressed node body is not UTF-8".into()))
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
