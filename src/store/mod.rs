//! SQLite persistence: sessions, the node DAG, blobs, branches, functions. The only place with SQL.
//!
//! Writes are serialised by the store's write lock, each in `BEGIN IMMEDIATE`, so a
//! read-then-write transaction never fails half-way on a lock: appends on the group committer's
//! own connection (`commit`), the rest on one sqlx writer connection. Readers use their own pool
//! (WAL lets them run beside the writers). An append is acknowledged only after its COMMIT.

mod append;
mod batch;
mod body;
mod branches;
mod check;
mod clock;
mod codec;
mod commit;
mod compaction;
mod fault;
mod idempotency;
mod import;
mod open;
mod pins;
mod reads;
mod rows;
mod scope;
mod sessions;
mod writes;

use std::path::PathBuf;

use crate::domain;
pub use append::{AppendOutcome, AppendRequest, AppendTarget};
pub use clock::now_ms;
pub use compaction::{Applied, CompactionPlan, PlanState};
pub use fault::Fault;
pub use idempotency::CreationKey;
pub use open::{Config, Store};
pub use reads::PathTarget;
pub use scope::{Scoped, ScopedPlan};

/// Errors of the store: domain errors pass through; database failures stay opaque to clients.
/// Free of driver types: a driver's error is classified (`fault`, the backend's own classifier)
/// where it converts, and only its message is kept, for logs.
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
