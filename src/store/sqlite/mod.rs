//! The SQLite backend: opening the file (checked first), its reader and writer pools, the
//! group committer's connection, the write lock every write takes, and the SQL of every
//! primitive of the store's seam (`reads`, `writes`, `committer`).
//!
//! Writes are serialised by the store's write lock, each in `BEGIN IMMEDIATE`, so a
//! read-then-write transaction never fails half-way on a lock: appends on the group committer's
//! own connection, the rest on one sqlx writer connection. Readers use their own pool (WAL lets
//! them run beside the writers).

pub(super) mod backup;
mod check;
mod committer;
pub(super) mod fault;
mod reads;
mod writes;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use sqlx::pool::PoolConnection;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{Sqlite, SqliteConnection};
use tokio::sync::mpsc;

use super::backend::{Backend, Reads, WriteTx};
use super::changes::Changes;
use super::commit::{MAX_BATCH, Message};
use super::{Config, Error, Fault, Result};
use fault::Quota;

const READERS: u32 = 8;

/// The one-row lookups, in the form both the sqlx connections and the committer's run (`?`
/// binds in order in both).
const SESSION_EXISTS: &str = "SELECT 1 FROM sessions WHERE id = ?";
const BRANCH_HEAD: &str = "SELECT head_id FROM branches WHERE session_id = ? AND name = ?";
const FUNCTION_ROW: &str =
    "SELECT head_id, closed_by FROM functions WHERE id = ? AND session_id = ?";
const NODE_ROW: &str = "SELECT n.id, n.parent_id, n.function_id, n.created_at_ms, n.hash, n.body,
    n.body_z FROM nodes n WHERE n.id = ? AND n.session_id = ?";

// Statement heads shared by the committer's one-row inserts and an import's multi-row ones;
// values bind in the order of the columns. Macros, so `concat!` can build whole statements.
macro_rules! insert_blobs {
    () => {
        "INSERT INTO blobs (hash, size, codec, data) "
    };
}
macro_rules! blob_stored_once {
    () => {
        " ON CONFLICT (hash) DO NOTHING"
    };
}
macro_rules! insert_nodes {
    () => {
        "INSERT INTO nodes (id, session_id, parent_id, function_id, kind, created_at_ms, hash, \
         body, body_z) "
    };
}
macro_rules! insert_functions {
    () => {
        "INSERT INTO functions (id, session_id) "
    };
}
use {blob_stored_once, insert_blobs, insert_functions, insert_nodes};

/// A SQLite database file, open.
pub(super) struct SqliteBackend {
    writer: SqlitePool,
    reader: SqlitePool,
    /// Taken by every write, on the committer's connection or the writer pool's, so that one
    /// waits here in turn rather than in SQLite's busy handler (which sleeps and is unfair).
    write_lock: Arc<tokio::sync::Mutex<()>>,
    path: PathBuf,
    quota: Arc<Quota>,
}

/// Opens (creating and migrating if needed) the SQLite file at `path` and starts its group
/// committer. An existing file is checked first (header, size, WAL header, permissions,
/// `PRAGMA quick_check`) and refused with [`Error::Unusable`], naming the file and the
/// problem, before anything writes to it.
pub(super) async fn open(
    path: &Path,
    config: &Config,
    changes: Changes,
) -> Result<(Arc<dyn Backend>, mpsc::Sender<Message>)> {
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
    sqlx::migrate!("./migrations/sqlite")
        .run(&writer)
        .await
        .map_err(|e| unusable(e.into()))?;
    let reader = SqlitePoolOptions::new()
        .max_connections(READERS)
        .test_before_acquire(false)
        .connect_with(options.read_only(true))
        .await
        .map_err(|e| unusable(e.into()))?;
    let conn = committer::connect(path, config).map_err(|e| unusable(e.into()))?;
    let write_lock = Arc::new(tokio::sync::Mutex::new(()));
    let (appends, inbox) = mpsc::channel(MAX_BATCH * 4);
    let conn = committer::Committer::new(conn, Arc::clone(&write_lock), Arc::clone(&quota));
    committer::spawn(conn, inbox, changes)
        .map_err(|e| check::unusable(path, format!("cannot start the committer: {e}")))?;
    let backend = SqliteBackend {
        writer,
        reader,
        write_lock,
        path: path.to_path_buf(),
        quota,
    };
    Ok((Arc::new(backend), appends))
}

#[async_trait]
impl Backend for SqliteBackend {
    async fn read(&self) -> Result<Box<dyn Reads>> {
        Ok(Box::new(Conn(self.reader.acquire().await?)))
    }

    async fn begin_write(&self) -> Result<Box<dyn WriteTx>> {
        let lock = Arc::clone(&self.write_lock).lock_owned().await;
        let tx = self.writer.begin_with("BEGIN IMMEDIATE").await?;
        Ok(Box::new(Conn(Write { tx, _lock: lock })))
    }

    /// A write that failed on an I/O error while the disk has no room failed for want of space.
    fn diagnose(&self, error: Error) -> Error {
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

    async fn set_max_db_bytes(&self, bytes: Option<u64>) -> Result<u64> {
        self.quota.set(bytes);
        // The pool has one writer connection: this waits for the write in progress, and a
        // connection opened later takes the new limit when it connects.
        let mut conn = self.writer.acquire().await?;
        Ok(self.quota.apply(&mut conn).await?)
    }

    /// The last connection to close checkpoints the WAL.
    async fn close(&self) {
        self.reader.close().await;
        self.writer.close().await;
    }
}

/// A transaction on the writer pool's connection, holding the store's write lock until it
/// ends. Dropped without commit, it rolls back.
struct Write {
    // Declared first: dropped (its ROLLBACK queued) before the lock is released.
    tx: sqlx::Transaction<'static, Sqlite>,
    _lock: tokio::sync::OwnedMutexGuard<()>,
}

/// A sqlx connection the reads run on: a reader's, or the writer's in its transaction.
trait Connection: Send {
    fn conn(&mut self) -> &mut SqliteConnection;
}

/// A connection as the store's seam sees it (this backend's, so its impls of the seam's
/// traits stay apart from another backend's).
struct Conn<C>(C);

impl<C: Connection> Conn<C> {
    fn conn(&mut self) -> &mut SqliteConnection {
        self.0.conn()
    }
}

impl Connection for PoolConnection<Sqlite> {
    fn conn(&mut self) -> &mut SqliteConnection {
        self
    }
}

impl Connection for Write {
    fn conn(&mut self) -> &mut SqliteConnection {
        &mut self.tx
    }
}
