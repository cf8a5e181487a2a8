//! Opening and closing the store: `Store` (a backend, the group committer's inbox and the
//! caches the rules keep) and its `Config`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::append::commit::{CommitCounts, CommitQueue, CommitStats};
use super::backend::{Backend, Reads, WriteTx};
use super::read::changes::Changes;
use super::read::reads::ReadCache;
use super::{Error, Result, Scoped, postgres, sqlite};
use crate::domain::SessionId;

#[derive(Clone)]
pub struct Store {
    pub(super) backend: Arc<dyn Backend>,
    pub(super) cache: Arc<std::sync::Mutex<ReadCache>>,
    /// Appends go to the group committer, which writes many in one transaction.
    pub(super) appends: CommitQueue,
    /// Sessions whose tenant a scope check (or their creation) established.
    pub(super) owners: super::session::scope::SharedOwners,
    /// Signalled after every committed write, with its session: watchers wake on it.
    pub(super) changes: Changes,
    /// What the group committer counted.
    pub(super) commits: Arc<CommitStats>,
    /// Branch paths loaded from memory alone.
    pub(super) from_memory: Arc<std::sync::atomic::AtomicU64>,
}

/// How the store opens its database: `ctxd serve`'s flags.
#[derive(Debug, Clone)]
pub struct Config {
    /// How long a write waits for a lock another connection or process holds before it fails
    /// (retrying meanwhile); the write is then refused, never lost.
    pub busy_timeout: Duration,
    /// The most bytes the database may take (SQLite); `None`: as much as the disk holds.
    pub max_db_bytes: Option<u64>,
    /// Connections to PostgreSQL for reads and writes (the group committer has one more per
    /// commit lane, 8).
    pub pg_pool_size: u32,
    /// On a PostgreSQL database with the `citus` extension, distribute (and co-locate) the
    /// tables by session at start, those of later migrations included; `false`
    /// (`--no-distribute`) leaves it to the operator.
    pub distribute: bool,
    /// Commit each session's appends in a transaction of its own, as on Citus each shard's,
    /// on an undistributed PostgreSQL database too (to test the distributed form of the
    /// committer's statements without a cluster).
    pub pg_batch_per_session: bool,
    /// On Citus, send an append written in one call straight to the worker that holds its
    /// session's shard (at the address the coordinator knows it by), not through the
    /// coordinator; `false` (`--pg-coordinator-only`): everything through the coordinator.
    pub pg_direct_to_workers: bool,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            busy_timeout: BUSY_TIMEOUT,
            max_db_bytes: None,
            pg_pool_size: 16,
            distribute: true,
            pg_batch_per_session: false,
            pg_direct_to_workers: true,
        }
    }
}

const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// Which database a `--db` value names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Database {
    Sqlite(PathBuf),
    Postgres(String),
}

impl Database {
    pub fn parse(db: &str) -> Self {
        if db.starts_with("postgres://") || db.starts_with("postgresql://") {
            Database::Postgres(db.to_owned())
        } else {
            Database::Sqlite(PathBuf::from(db.strip_prefix("sqlite://").unwrap_or(db)))
        }
    }

    /// For logs and messages: a URL without its password.
    pub fn shown(&self) -> String {
        match self {
            Database::Sqlite(path) => path.display().to_string(),
            Database::Postgres(url) => postgres::redact(url),
        }
    }
}

impl Store {
    /// Opens (creating and migrating if needed) the SQLite file at `path`.
    pub async fn open(path: &Path) -> Result<Self> {
        Self::open_with(path, Config::default()).await
    }

    /// [`Store::open`] with `config`. An existing file is checked first (header, size, WAL
    /// header, permissions, `PRAGMA quick_check`) and refused with
    /// [`Error::Unusable`](super::Error::Unusable), naming the file and the problem, before
    /// anything writes to it.
    pub async fn open_with(path: &Path, config: Config) -> Result<Self> {
        let (changes, commits) = (Changes::new(), Arc::new(CommitStats::default()));
        let (backend, appends) =
            sqlite::open(path, &config, changes.clone(), Arc::clone(&commits)).await?;
        Ok(Self::over(backend, appends, changes, commits))
    }

    /// The store over an opened backend whose group committer takes `appends`.
    fn over(
        backend: Arc<dyn Backend>,
        appends: CommitQueue,
        changes: Changes,
        commits: Arc<CommitStats>,
    ) -> Self {
        Self {
            backend,
            cache: Arc::default(),
            appends,
            owners: Arc::default(),
            changes,
            commits,
            from_memory: Arc::default(),
        }
    }

    /// Branch paths a render loaded from memory alone since the store opened: the branch was
    /// rendered before and nothing but this process's appends changed it since.
    pub fn paths_from_memory(&self) -> u64 {
        self.from_memory.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// What the group committer has counted since the store opened.
    pub fn commit_counts(&self) -> CommitCounts {
        self.commits.counts()
    }

    /// Opens the database `db` names: a `postgres://` (or `postgresql://`) URL, or a SQLite
    /// file (a path, or `sqlite://path`). Several processes may serve one PostgreSQL database.
    pub async fn connect(db: &str, config: Config) -> Result<Self> {
        match Database::parse(db) {
            Database::Sqlite(path) => Self::open_with(&path, config).await,
            Database::Postgres(url) => {
                if config.max_db_bytes.is_some() {
                    return Err(Error::Unusable {
                        path: postgres::redact(&url).into(),
                        problem: "--max-db-bytes limits a SQLite file; on PostgreSQL, limit \
                                  the database's disk instead"
                            .into(),
                    });
                }
                let (changes, commits) = (Changes::new(), Arc::new(CommitStats::default()));
                let (backend, appends) =
                    postgres::open(&url, &config, changes.clone(), Arc::clone(&commits)).await?;
                Ok(Self::over(backend, appends, changes, commits))
            }
        }
    }

    /// Sets the size limit of the database (`None`: none) for every writer connection from now
    /// on, and returns the limit in effect in bytes: never below the size already in use.
    /// Raising it lets writes refused as full succeed again, without a restart.
    pub async fn set_max_db_bytes(&self, bytes: Option<u64>) -> Result<u64> {
        self.backend.set_max_db_bytes(bytes).await
    }

    /// Stops the group committer (after the batch in hand) and closes the backend.
    pub async fn close(&self) {
        self.appends.close().await;
        self.backend.close().await;
    }

    pub(super) async fn read(&self) -> Result<Box<dyn Reads>> {
        self.backend.read().await
    }

    /// A connection for reads of `session`, which it checks is still there (a session scoped
    /// before may have been deleted since).
    pub(super) async fn read_session(
        &self,
        session: Scoped,
    ) -> Result<(Box<dyn Reads>, SessionId)> {
        let session = session.id();
        let mut conn = self.read().await?;
        conn.ensure_session(session).await?;
        Ok((conn, session))
    }

    /// A write transaction, serialised with every other write and the committer's batches.
    pub(super) async fn begin_write(&self) -> Result<Box<dyn WriteTx>> {
        self.backend.begin_write().await
    }
}
