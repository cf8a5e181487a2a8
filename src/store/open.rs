//! Opening and closing the store: `Store` and its `Config`, the reader and writer pools, the
//! group committer's start, and the write lock every write takes (`begin_write`, `WriteTx`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{Sqlite, SqliteConnection};
use tokio::sync::{mpsc, oneshot};

use super::commit::{self, MAX_BATCH, Message};
use super::fault::{self, Quota};
use super::reads::ReadCache;
use super::{Error, Result, check};

#[derive(Clone)]
pub struct Store {
    pub(super) writer: SqlitePool,
    pub(super) reader: SqlitePool,
    pub(super) cache: Arc<std::sync::Mutex<ReadCache>>,
    /// Appends go to the group committer, which writes many in one transaction and one fsync.
    pub(super) appends: mpsc::Sender<Message>,
    /// Taken by every write, on the committer's connection or the writer pool's, so that one
    /// waits here in turn rather than in SQLite's busy handler (which sleeps and is unfair).
    pub(super) write_lock: Arc<tokio::sync::Mutex<()>>,
    pub(super) path: Arc<PathBuf>,
    pub(super) quota: Arc<Quota>,
    /// Sessions whose tenant a scope check (or their creation) established.
    pub(super) owners: super::scope::SharedOwners,
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
            owners: Arc::default(),
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
    pub(super) async fn begin_write(&self) -> Result<WriteTx> {
        let lock = Arc::clone(&self.write_lock).lock_owned().await;
        let tx = self.writer.begin_with("BEGIN IMMEDIATE").await?;
        Ok(WriteTx { tx, _lock: lock })
    }
}

/// A transaction on the writer pool's connection, holding the store's write lock until it
/// ends. Dropped without [`WriteTx::commit`], it rolls back.
pub(super) struct WriteTx {
    // Declared first: dropped (its ROLLBACK queued) before the lock is released.
    tx: sqlx::Transaction<'static, Sqlite>,
    _lock: tokio::sync::OwnedMutexGuard<()>,
}

impl WriteTx {
    pub(super) async fn commit(self) -> Result<()> {
        Ok(self.tx.commit().await?)
    }

    pub(super) async fn rollback(self) -> Result<()> {
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
