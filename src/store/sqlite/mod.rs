//! The SQLite backend: opening the file (checked first), its reader and writer pools, the
//! group committer's connection, the write lock every write takes, and its SQL of the store's
//! seam (`reads`, `writes`, `committer`; the statements both engines run alike are in
//! `store::sql`).
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
    SqliteAutoVacuum, SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteRow, SqliteSynchronous,
};
use sqlx::{Sqlite, SqliteConnection};

use super::append::commit::CommitQueue;
use super::append::commit::CommitStats;
use super::backend::{Backend, Footprint, Reads, WriteTx};
use super::read::changes::Changes;
use super::sql::{Tx, run_on_sqlx};
use super::{Config, Error, Fault, Result};
use fault::Quota;

const READERS: u32 = 8;

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
// Which sessions refer to a blob: the committer writes one row per session and blob it stores,
// and the row's trigger counts it in `blobs.refs`.
macro_rules! insert_blob_refs {
    () => {
        "INSERT INTO blob_refs (session_id, hash) "
    };
}
macro_rules! blob_ref_once {
    () => {
        " ON CONFLICT (session_id, hash) DO NOTHING"
    };
}
macro_rules! insert_functions {
    () => {
        "INSERT INTO functions (id, session_id) "
    };
}
use {blob_ref_once, blob_stored_once, insert_blob_refs, insert_blobs, insert_functions};

/// A SQLite database file, open.
pub(super) struct SqliteBackend {
    writer: SqlitePool,
    /// One connection that writes without foreign-key checks, for deletions only.
    deleter: SqlitePool,
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
    stats: Arc<CommitStats>,
) -> Result<(Arc<dyn Backend>, CommitQueue)> {
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
    // A new file gives the pages of deleted sessions back to the system on request
    // (`CollectGarbage`); an older file keeps reusing them for new rows. Set by the writer,
    // which creates the file; a reader's connection is read-only.
    let writer = fault::writer_pool(Arc::clone(&quota))
        .test_before_acquire(false)
        .connect_with(options.clone().auto_vacuum(SqliteAutoVacuum::Incremental))
        .await
        .map_err(|e| unusable(e.into()))?;
    sqlx::migrate!("./migrations/sqlite")
        .run(&writer)
        .await
        .map_err(|e| unusable(e.into()))?;
    backfill_blob_refs(&writer).await.map_err(&unusable)?;
    // Deletions write without foreign-key checks: SQLite would look for each removed node's
    // children by a full scan (nodes have no index by parent), and a deletion removes every
    // row of its session, children with parents.
    let deleter = fault::writer_pool(Arc::clone(&quota))
        .test_before_acquire(false)
        .connect_with(options.clone().foreign_keys(false))
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
    let conn = committer::Committer::new(conn, Arc::clone(&write_lock), Arc::clone(&quota));
    let appends = committer::spawn(conn, changes, stats)
        .map_err(|e| check::unusable(path, format!("cannot start the committer: {e}")))?;
    let backend = SqliteBackend {
        writer,
        deleter,
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
        Ok(Box::new(Conn(Write { tx, kept: lock })))
    }

    async fn begin_delete(&self) -> Result<Box<dyn WriteTx>> {
        let lock = Arc::clone(&self.write_lock).lock_owned().await;
        let tx = self.deleter.begin_with("BEGIN IMMEDIATE").await?;
        Ok(Box::new(Conn(Write { tx, kept: lock })))
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

    async fn backup(&self, to: &Path) -> Result<u64> {
        backup::copy(&self.path, to).await
    }

    async fn footprint(&self) -> Result<Footprint> {
        let mut conn = self.reader.acquire().await?;
        let (pages, free, page_size): (i64, i64, i64) = sqlx::query_as(
            "SELECT (SELECT page_count FROM pragma_page_count()),
                    (SELECT freelist_count FROM pragma_freelist_count()),
                    (SELECT page_size FROM pragma_page_size())",
        )
        .fetch_one(&mut *conn)
        .await?;
        let bytes = |pages: i64| u64::try_from(pages.saturating_mul(page_size)).unwrap_or(0);
        let wal = std::fs::metadata(wal_path(&self.path)).map_or(0, |m| m.len());
        Ok(Footprint {
            bytes: bytes(pages) + wal,
            free_bytes: bytes(free),
        })
    }

    /// Frees the free list's pages in steps, each a short write, so appends wait for one step
    /// at most; then truncates the WAL if no reader holds it.
    async fn release_free_space(&self) -> Result<()> {
        const PAGES_PER_STEP: i64 = 4096;
        loop {
            let _lock = self.write_lock.lock().await;
            let mut conn = self.writer.acquire().await?;
            let (mode, free): (i64, i64) = sqlx::query_as(
                "SELECT (SELECT auto_vacuum FROM pragma_auto_vacuum()),
                        (SELECT freelist_count FROM pragma_freelist_count())",
            )
            .fetch_one(&mut *conn)
            .await?;
            // 2: incremental; a file made before it was the default keeps its free pages.
            if mode != 2 || free == 0 {
                sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
                    .execute(&mut *conn)
                    .await?;
                return Ok(());
            }
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "PRAGMA incremental_vacuum({PAGES_PER_STEP})"
            )))
            .execute(&mut *conn)
            .await?;
        }
    }

    /// The last connection to close checkpoints the WAL.
    async fn close(&self) {
        self.reader.close().await;
        self.deleter.close().await;
        self.writer.close().await;
    }
}

/// A transaction on the writer pool's connection, holding the store's write lock until it
/// ends.
type Write = Tx<Sqlite, tokio::sync::OwnedMutexGuard<()>>;

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

// A list of texts binds as a JSON array, which SQLite's statements read with `json_each`.
run_on_sqlx!(Conn, Connection, Sqlite, SqliteRow, |texts| {
    serde_json::to_string(texts).expect("strings serialize")
});

/// The WAL file beside database `path`.
fn wal_path(path: &Path) -> PathBuf {
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    PathBuf::from(wal)
}

/// Counts the blobs stored before blobs were counted (migration 0008): the sessions referring
/// to each are in node bodies, some compressed, so this reads them here, once, in one
/// transaction. A file whose blobs are counted, or that has none, costs one query.
async fn backfill_blob_refs(writer: &SqlitePool) -> Result<()> {
    let uncounted: Option<i64> = sqlx::query_scalar("SELECT 1 FROM blobs WHERE refs = 0 LIMIT 1")
        .fetch_optional(writer)
        .await?;
    if uncounted.is_none() {
        return Ok(());
    }
    let mut tx = writer.begin_with("BEGIN IMMEDIATE").await?;
    let mut after = 0_i64;
    loop {
        let rows = sqlx::query(
            "SELECT rowid, id, session_id, parent_id, function_id, created_at_ms, hash, body,
             body_z FROM nodes WHERE rowid > ? ORDER BY rowid LIMIT 1000",
        )
        .bind(after)
        .fetch_all(&mut *tx)
        .await?;
        let Some(last) = rows.last() else { break };
        after = sqlx::Row::try_get(last, "rowid")?;
        for row in &rows {
            let session: Vec<u8> = sqlx::Row::try_get(row, "session_id")?;
            let node = super::sql::decode::node(row)?;
            for hash in super::form::body::Body::parse(&node.body)?.blob_refs() {
                sqlx::query(concat!(
                    insert_blob_refs!(),
                    "VALUES (?, ?)",
                    blob_ref_once!()
                ))
                .bind(&session)
                .bind(hash.0.as_slice())
                .execute(&mut *tx)
                .await?;
            }
        }
    }
    // A blob no node refers to (its import rolled back after it was written, say) has none.
    sqlx::query("DELETE FROM blobs WHERE refs = 0")
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(())
}
