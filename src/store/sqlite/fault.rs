//! The SQLite backend's fault classifier (what a failed SQLite call means for the caller), the
//! size quota of the writer connections, and keeping the writer connection usable after a
//! transaction SQLite rolled back itself.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use sqlx::sqlite::SqlitePoolOptions;
use sqlx::{Connection, SqliteConnection};

use super::{Error, Fault};

// The SQLite backend's fault classifier: SQLite result codes (through sqlx, in
// `store::driver`, or through the committer's rusqlite connection, here) as faults.

/// A failure on the group committer's connection.
impl From<rusqlite::Error> for Error {
    fn from(error: rusqlite::Error) -> Self {
        Error::Database {
            fault: rusqlite_fault(&error),
            detail: error.to_string(),
        }
    }
}

/// The fault a SQLite result code stands for: the extended code's low byte is the primary one.
pub(in crate::store) fn code_fault(code: Option<i32>) -> Fault {
    match code.map(|c| c & 0xff) {
        Some(SQLITE_FULL) => Fault::Full,
        Some(SQLITE_BUSY | SQLITE_LOCKED) => Fault::Busy,
        Some(SQLITE_NOMEM | SQLITE_READONLY | SQLITE_IOERR | SQLITE_CANTOPEN) => Fault::Unavailable,
        Some(SQLITE_CORRUPT | SQLITE_NOTADB) => Fault::Corrupt,
        _ => Fault::Internal,
    }
}

fn rusqlite_fault(error: &rusqlite::Error) -> Fault {
    match error {
        rusqlite::Error::SqliteFailure(e, _) => code_fault(Some(e.extended_code)),
        _ => Fault::Internal,
    }
}

/// What an error at open means, for the one line `ctxd serve` prints before it exits.
pub(super) fn describe(error: &Error) -> String {
    let detail = match error {
        Error::Database { detail, .. } | Error::Migrate { detail, .. } => detail.clone(),
        other => other.to_string(),
    };
    match error.fault() {
        Some(Fault::Full) => format!("is full ({detail}): free disk space or raise --max-db-bytes"),
        Some(Fault::Busy) => format!("is locked by another process ({detail})"),
        Some(Fault::Corrupt) => format!("is damaged ({detail})"),
        _ if matches!(error, Error::Migrate { .. }) => format!("cannot be migrated: {detail}"),
        _ => format!("cannot be opened: {detail}"),
    }
}

const SQLITE_BUSY: i32 = 5;
const SQLITE_LOCKED: i32 = 6;
const SQLITE_NOMEM: i32 = 7;
const SQLITE_READONLY: i32 = 8;
const SQLITE_IOERR: i32 = 10;
const SQLITE_CORRUPT: i32 = 11;
const SQLITE_FULL: i32 = 13;
const SQLITE_CANTOPEN: i32 = 14;
const SQLITE_NOTADB: i32 = 26;

/// Free bytes below which an I/O error on a write is taken for a full disk: SQLite reports
/// ENOSPC as SQLITE_FULL from a write, but as a generic I/O error from an fsync or from
/// growing its shared-memory file.
const NO_ROOM_BYTES: u64 = 1 << 20;

/// Whether the file system holding `path` has (next to) no room left.
pub(super) fn no_room(path: &Path) -> bool {
    #[cfg(unix)]
    {
        let dir = match path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir,
            _ => Path::new("."),
        };
        rustix::fs::statvfs(dir)
            .is_ok_and(|fs| fs.f_bavail.saturating_mul(fs.f_frsize) < NO_ROOM_BYTES)
    }
    #[cfg(not(unix))]
    {
        let _ = path;
        false
    }
}

/// The most pages `PRAGMA max_page_count` accepts: no limit but SQLite's own.
const MAX_PAGES: u64 = 0xffff_fffe;

/// The size limit of the database (`--max-db-bytes`), applied to every writer connection.
#[derive(Debug, Default)]
pub(super) struct Quota {
    /// Bytes; 0 means no limit.
    bytes: AtomicU64,
}

impl Quota {
    pub(super) fn new(bytes: Option<u64>) -> Self {
        Self {
            bytes: AtomicU64::new(bytes.unwrap_or(0)),
        }
    }

    pub(super) fn set(&self, bytes: Option<u64>) {
        self.bytes.store(bytes.unwrap_or(0), Ordering::Relaxed);
    }

    pub(super) fn get(&self) -> Option<u64> {
        match self.bytes.load(Ordering::Relaxed) {
            0 => None,
            n => Some(n),
        }
    }

    /// Sets `max_page_count` on `conn` and returns the limit in effect, in bytes. SQLite never
    /// sets it below the pages in use: a database already over its quota takes no new page.
    pub(super) async fn apply(&self, conn: &mut SqliteConnection) -> Result<u64, sqlx::Error> {
        let page: i64 = sqlx::query_scalar("PRAGMA page_size")
            .fetch_one(&mut *conn)
            .await?;
        let (page, pages) = self.pages(page);
        let set: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "PRAGMA max_page_count = {pages}"
        )))
        .fetch_one(&mut *conn)
        .await?;
        Ok(u64::try_from(set).unwrap_or(0).saturating_mul(page))
    }

    /// [`Quota::apply`] on the group committer's connection.
    pub(super) fn apply_direct(&self, conn: &rusqlite::Connection) -> rusqlite::Result<()> {
        let page: i64 = conn.query_row("PRAGMA page_size", [], |r| r.get(0))?;
        let (_, pages) = self.pages(page);
        conn.query_row(&format!("PRAGMA max_page_count = {pages}"), [], |_| Ok(()))
    }

    /// The page size (`page` as SQLite reported it) and the pages the quota allows.
    fn pages(&self, page: i64) -> (u64, u64) {
        let page = u64::try_from(page).unwrap_or(4096).max(1);
        let pages = self
            .get()
            .map_or(MAX_PAGES, |b| (b / page).clamp(1, MAX_PAGES));
        (page, pages)
    }
}

/// The writer pool: one connection, which takes the quota whenever the pool (re)opens it, and
/// is replaced when a failed transaction left it out of step.
pub(super) fn writer_pool(quota: Arc<Quota>) -> SqlitePoolOptions {
    SqlitePoolOptions::new()
        .max_connections(1)
        .after_connect(move |conn, _| {
            let quota = Arc::clone(&quota);
            Box::pin(async move { quota.apply(conn).await.map(|_| ()) })
        })
        .after_release(|conn, _| {
            Box::pin(async move {
                // SQLite rolls a transaction back by itself on SQLITE_FULL and some I/O errors;
                // the ROLLBACK sqlx then sends fails, and sqlx keeps counting the transaction
                // as open, so every later BEGIN would be refused. A transaction dropped without
                // COMMIT queued its ROLLBACK: the ping waits for it. A connection still "in a
                // transaction" after that is closed, and the pool opens a fresh one.
                if conn.is_in_transaction() {
                    conn.ping().await?;
                }
                let consistent = !conn.is_in_transaction();
                if !consistent {
                    tracing::warn!("reopening the writer connection after a failed transaction");
                }
                Ok(consistent)
            })
        })
}
