//! The SQLite group committer's connection: a synchronous connection (rusqlite, on the same
//! libsqlite3 as sqlx) on a thread of its own, where a whole batch is read, checked and
//! written in one `BEGIN IMMEDIATE … COMMIT` without a thread hop per statement. Its
//! statements stay prepared: a batch repeats the same dozen.
//!
//! Why a second driver: through sqlx every statement is a round trip to the connection's
//! worker thread, and the append floor measured through sqlx is about twice the one on this
//! connection (ARCHITECTURE.md, "Two SQLite drivers").

use std::sync::Arc;

use async_trait::async_trait;
use rusqlite::OptionalExtension;
use tokio::sync::{Mutex, OwnedMutexGuard};

use super::fault::Quota;
use super::{
    Config, blob_ref_once, blob_stored_once, insert_blob_refs, insert_blobs, insert_functions,
};
use crate::domain::{BranchName, Hash, NodeId, SessionId};
use crate::store::Result;
use crate::store::append::commit::{CommitQueue, CommitStats};
use crate::store::append::planned::BatchRows;
use crate::store::append::request::AppendOutcome;
use crate::store::backend::{AppendTx, CommitterConnection, Lookups};
use crate::store::form::rows::NodeRow;
use crate::store::read::changes::Changes;
use crate::store::sql::reads::{
    BRANCH_HEAD, FUNCTION_ROW, IDEMPOTENCY_RECORD, NODE_ROW, SESSION_EXISTS,
};
use crate::store::sql::{Arg, decode, insert_nodes, node_values};

/// Opens the committer's connection to the migrated database at `path`, with the store's
/// durability: WAL, `synchronous=FULL`, foreign keys, the busy timeout.
pub(super) fn connect(
    path: &std::path::Path,
    config: &Config,
) -> rusqlite::Result<rusqlite::Connection> {
    let conn = rusqlite::Connection::open_with_flags(
        path,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    // WAL is a property of the file, set when the writer pool opened it.
    conn.query_row("PRAGMA journal_mode = WAL", [], |_| Ok(()))?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.pragma_update(None, "foreign_keys", true)?;
    conn.busy_timeout(config.busy_timeout)?;
    // A batch uses about a dozen statements; keep them all prepared.
    conn.set_prepared_statement_cache_capacity(32);
    Ok(conn)
}

/// Starts the group committer on a thread of its own, writing with `conn`. An append that
/// finds it idle commits on its own task instead: a batch on this connection never suspends
/// once begun (every statement is a synchronous call), so a caller that goes away cannot
/// leave it half-done.
pub(super) fn spawn(
    conn: Committer,
    changes: Changes,
    stats: Arc<CommitStats>,
) -> std::io::Result<CommitQueue> {
    let (queue, committer) = CommitQueue::start(vec![Box::new(conn)], changes, stats, true);
    // The committer's only waits are its inbox and the locks: a runtime with no I/O or timer
    // driver parks the thread on them.
    let runtime = tokio::runtime::Builder::new_current_thread().build()?;
    std::thread::Builder::new()
        .name("ctxd-committer".into())
        .spawn(move || runtime.block_on(committer))?;
    Ok(queue)
}

/// The committer's connection, the store's write lock it takes for each batch, and the size
/// quota last set on it.
pub(super) struct Committer {
    conn: rusqlite::Connection,
    lock: Arc<Mutex<()>>,
    held: Option<OwnedMutexGuard<()>>,
    quota: Arc<Quota>,
    applied: Option<Option<u64>>,
    /// `PRAGMA data_version` when last asked: it moves only with commits of other connections.
    data_version: Option<i64>,
}

impl Committer {
    pub(super) fn new(conn: rusqlite::Connection, lock: Arc<Mutex<()>>, quota: Arc<Quota>) -> Self {
        Self {
            conn,
            lock,
            held: None,
            quota,
            applied: None,
            data_version: None,
        }
    }

    /// Sets the store's current quota on the connection if it changed since the last batch.
    fn take_quota(&mut self) -> Result<()> {
        let wanted = self.quota.get();
        if self.applied != Some(wanted) {
            self.quota.apply_direct(&self.conn)?;
            self.applied = Some(wanted);
        }
        Ok(())
    }
}

fn id(id: &NodeId) -> Vec<u8> {
    id.as_bytes().to_vec()
}

#[async_trait]
impl CommitterConnection for Committer {
    /// Asks the connection's data version: SQLite reads it from the WAL index in shared
    /// memory, a few microseconds with no I/O, and it moves only when another connection or
    /// process commits (this one writes every append).
    fn others_committed(&mut self) -> Option<bool> {
        if self.held.is_some() {
            return None;
        }
        let version = self
            .conn
            .prepare_cached("PRAGMA data_version")
            .and_then(|mut statement| statement.query_row([], |row| row.get::<_, i64>(0)))
            .ok()?;
        Some(self.data_version.replace(version) != Some(version))
    }

    async fn begin(&mut self) -> Result<()> {
        if self.held.is_some() {
            // A batch left unfinished (its task dropped mid-way, which a batch on this
            // connection cannot be once begun): what it wrote is not committed.
            self.rollback().await;
        }
        self.held = Some(Arc::clone(&self.lock).lock_owned().await);
        let begun = self
            .take_quota()
            .and_then(|()| Ok(self.conn.execute_batch("BEGIN IMMEDIATE")?));
        if begun.is_err() {
            self.held = None;
        }
        begun
    }

    async fn commit(&mut self) -> Result<()> {
        let done = self.conn.execute_batch("COMMIT");
        if done.is_ok() {
            self.held = None;
        }
        Ok(done?)
    }

    async fn rollback(&mut self) {
        // SQLite rolls back by itself on some failures (a full disk, some I/O errors).
        if !self.conn.is_autocommit()
            && let Err(e) = self.conn.execute_batch("ROLLBACK")
        {
            tracing::error!(error = %e, "rolling back a failed batch failed");
        }
        self.held = None;
    }

    async fn close(self: Box<Self>) {
        if let Err((_, e)) = self.conn.close() {
            tracing::error!(error = %e, "closing the committer's connection failed");
        }
    }
}

impl Committer {
    /// The row `sql` finds with `params`, if any, as `decode` reads it.
    fn row_as<T>(
        &self,
        sql: &str,
        params: impl rusqlite::Params,
        decode: impl FnOnce(&rusqlite::Row<'_>) -> Result<T>,
    ) -> Result<Option<T>> {
        self.conn
            .prepare_cached(sql)?
            .query_row(params, |row| Ok(decode(row)))
            .optional()?
            .transpose()
    }
}

/// A value as this driver binds it: as sqlx's SQLite does (a list of texts as a JSON array).
impl rusqlite::ToSql for Arg<'_> {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        match self {
            Arg::Bytes(bytes) => bytes.to_sql(),
            Arg::Text(text) => text.to_sql(),
            Arg::Int(int) => int.to_sql(),
            Arg::Texts(texts) => Ok(serde_json::to_string(texts)
                .expect("strings serialize")
                .into()),
        }
    }
}

// The statements the sqlx connections run too: rusqlite binds their `$1`, `$2` by position.
#[async_trait]
impl Lookups for Committer {
    async fn session_exists(&mut self, session: SessionId) -> Result<bool> {
        let (sql, _) = SESSION_EXISTS;
        Ok(self
            .row_as(sql, [session.as_bytes().as_slice()], |_| Ok(()))?
            .is_some())
    }

    async fn find_branch_head(
        &mut self,
        session: SessionId,
        name: &BranchName,
    ) -> Result<Option<Option<NodeId>>> {
        let (sql, _) = BRANCH_HEAD;
        self.row_as(sql, (session.as_bytes().as_slice(), name.as_str()), |row| {
            decode::node_id(row, "head_id")
        })
    }

    async fn find_function(
        &mut self,
        session: SessionId,
        function: NodeId,
    ) -> Result<Option<(Option<NodeId>, bool)>> {
        let (sql, _) = FUNCTION_ROW;
        let params = (
            session.as_bytes().as_slice(),
            function.as_bytes().as_slice(),
        );
        self.row_as(sql, params, |row| decode::function(row))
    }

    async fn find_node(&mut self, session: SessionId, node: NodeId) -> Result<Option<NodeRow>> {
        let params = (session.as_bytes().as_slice(), node.as_bytes().as_slice());
        self.row_as(NODE_ROW, params, |row| decode::node(row))
    }

    async fn idempotency_record(
        &mut self,
        session: SessionId,
        key: &str,
    ) -> Result<Option<(Hash, AppendOutcome)>> {
        let params = (session.as_bytes().as_slice(), key);
        self.row_as(IDEMPOTENCY_RECORD, params, |row| decode::idempotency(row))
    }
}

#[async_trait]
impl AppendTx for Committer {
    /// Row by row: a prepared statement's step costs less than parsing a multi-row one.
    async fn write_rows(&mut self, rows: &BatchRows) -> Result<()> {
        let c = &self.conn;
        if !rows.blobs.is_empty() {
            let mut insert = c.prepare_cached(concat!(
                insert_blobs!(),
                "VALUES (?, ?, ?, ?)",
                blob_stored_once!()
            ))?;
            let mut refer = c.prepare_cached(concat!(
                insert_blob_refs!(),
                "VALUES (?, ?)",
                blob_ref_once!()
            ))?;
            for blob in &rows.blobs {
                insert.execute((
                    blob.hash.0.as_slice(),
                    blob.size,
                    blob.codec,
                    blob.data.as_slice(),
                ))?;
                refer.execute((blob.session.as_bytes().as_slice(), blob.hash.0.as_slice()))?;
            }
        }
        let mut insert = c.prepare_cached(concat!(
            insert_nodes!(),
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
        ))?;
        for node in &rows.nodes {
            insert.execute(rusqlite::params_from_iter(node_values(node)))?;
        }
        for (function, session) in &rows.opened {
            c.prepare_cached(concat!(insert_functions!(), "VALUES (?, ?)"))?
                .execute((id(function), session.as_bytes().as_slice()))?;
        }
        for (_, result, function) in &rows.closes {
            // Another branch may have closed it already; the first result is the record.
            c.prepare_cached(
                "UPDATE functions SET closed_by = ?1 WHERE id = ?2 AND closed_by IS NULL",
            )?
            .execute((id(result), id(function)))?;
        }
        for ((session, name), (head, at)) in &rows.branch_heads {
            c.prepare_cached(
                "UPDATE branches SET head_id = ?1, updated_at_ms = ?2
                 WHERE session_id = ?3 AND name = ?4",
            )?
            .execute((id(head), at, session.as_bytes().as_slice(), name.as_str()))?;
        }
        for ((_, function), head) in &rows.function_heads {
            c.prepare_cached("UPDATE functions SET head_id = ?1 WHERE id = ?2")?
                .execute((id(head), id(function)))?;
        }
        for (session, node, at) in &rows.pins {
            c.prepare_cached(
                "INSERT INTO pins (session_id, node_id, pinned, created_at_ms) VALUES (?1, ?2, 1, ?3)",
            )?
            .execute((session.as_bytes().as_slice(), id(node), at))?;
        }
        for record in &rows.idempotency {
            c.prepare_cached(
                "INSERT INTO idempotency (session_id, key, request_hash, response, created_at_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
            )?
            .execute((
                record.session.as_bytes().as_slice(),
                record.key.as_str(),
                record.request_hash.0.as_slice(),
                record.response.as_str(),
                record.created_at_ms,
            ))?;
        }
        Ok(())
    }
}
