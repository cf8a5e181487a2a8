//! Persistence: sessions, the node DAG, blobs, branches, functions, summaries. The store's rules
//! are written once, against the seam in `backend`, and grouped by concern: `append` (appends,
//! their checks and the group committer), `session` (sessions and what is kept per session:
//! branches, pins, compactions, the gateway's records, deletion, import), `read` (renders' paths,
//! watching, export) and `form` (the stored form of rows and node content). Each database engine
//! (`sqlite`, `postgres`) implements the seam with its SQL, connections and migrations; `sql`
//! holds what the two share. An append is acknowledged only after its COMMIT.

mod append;
mod backend;
mod form;
mod mint;
mod open;
mod postgres;
mod read;
mod session;
mod sql;
mod sqlite;

use std::path::PathBuf;

use crate::domain;
pub use append::commit::{CommitCounts, CommitStats};
pub use append::idempotency::CreationKey;
pub use append::request::{AppendOutcome, AppendRequest, AppendTarget};
pub use backend::Footprint;
pub use form::clock::now_ms;
pub use open::{Config, Database, Store};
/// The tables ctxd distributes on a Citus cluster: each with its distribution column and what it
/// is co-located with.
pub use postgres::DISTRIBUTION;
pub use read::reads::PathTarget;
pub use read::watch::{Change, Position};
pub use session::compaction::{Applied, CompactionPlan, PlanState};
pub use session::lifecycle::{Deletion, Tenants};
pub use session::scope::{Scoped, ScopedPlan};

/// Copies the database `db` names to the new file `to`, consistent at one moment, while servers
/// keep writing to it; returns the copy's size. SQLite only: PostgreSQL has `pg_dump`.
pub async fn backup(db: &str, to: &std::path::Path) -> Result<u64> {
    match Database::parse(db) {
        Database::Sqlite(path) => sqlite::backup::copy(&path, to).await,
        Database::Postgres(url) => Err(Error::Unusable {
            path: postgres::redact(&url).into(),
            problem: "is PostgreSQL: back it up with pg_dump (or the server's own backups)".into(),
        }),
    }
}

impl Store {
    /// Copies this store's database to the new file `to` while it serves (as [`backup`]).
    pub async fn backup_to(&self, to: &std::path::Path) -> Result<u64> {
        self.backend.backup(to).await
    }
}

/// Errors of the store: domain errors pass through; database failures stay opaque to clients.
/// Free of driver types: a driver's error is classified by its backend's classifier (a
/// [`Fault`]) where it converts, and only its message is kept, for logs.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Domain(#[from] domain::Error),
    #[error("database: {detail}")]
    Database { fault: Fault, detail: String },
    #[error("migration: {detail}")]
    Migrate { fault: Fault, detail: String },
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

/// What kind of failure a write or read met, beyond the domain's own errors: what a caller can
/// do about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The database reached its size limit or its disk is full: writes fail until there is
    /// room again; reads keep working.
    Full,
    /// Another connection or process held the lock past the busy timeout.
    Busy,
    /// The engine aborted the transaction to resolve a conflict with a concurrent one (a
    /// deadlock or a serialization failure): nothing was written, and a retry may succeed.
    Conflict,
    /// The database cannot be used right now (read-only, an I/O error, cannot be opened).
    Unavailable,
    /// Stored data is damaged.
    Corrupt,
    /// The store is shutting down.
    Closed,
    /// A defect of ctxd, nothing the caller did.
    Internal,
}

impl Error {
    /// The fault behind this error; `None` for the domain's errors (the caller's mistakes).
    pub fn fault(&self) -> Option<Fault> {
        Some(match self {
            Error::Domain(_) => return None,
            Error::Database { fault, .. }
            | Error::Migrate { fault, .. }
            | Error::Batch { fault, .. } => *fault,
            Error::Corrupt(_) => Fault::Corrupt,
            Error::Closed => Fault::Closed,
            Error::Unusable { .. } => Fault::Unavailable,
        })
    }
}
