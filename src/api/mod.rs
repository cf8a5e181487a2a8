//! The gRPC service: request → domain → store/engine → response. The only place with prost types.

pub mod auth;
mod compaction;
mod convert;
mod service;

pub use service::ContextStoreService;

/// Code generated from `proto/ctxd/v1/ctxd.proto`.
#[allow(clippy::all, clippy::pedantic)]
pub mod pb {
    tonic::include_proto!("ctxd.v1");

    /// The encoded descriptors, for server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("ctxd_descriptor");
}

use tonic::Status;

use crate::{domain, store};

/// The one mapping from errors to gRPC status. Internal detail goes to the log, not the client.
pub(crate) fn status(error: store::Error) -> Status {
    match error {
        store::Error::Domain(e) => domain_status(e),
        store::Error::Database(e) => {
            if let sqlx::Error::Database(db) = &e
                && matches!(db.code().as_deref(), Some("5" | "6"))
            {
                tracing::warn!(error = %e, "database busy");
                metrics::counter!("ctxd_sqlite_busy_total").increment(1);
                return Status::unavailable("the database is busy; retry");
            }
            tracing::error!(error = %e, "database error");
            Status::internal("internal storage error")
        }
        store::Error::Migrate(e) => {
            tracing::error!(error = %e, "migration error");
            Status::internal("internal storage error")
        }
        store::Error::Batch(detail) => {
            tracing::error!(%detail, "group commit failed");
            Status::unavailable("the write failed with its batch and was not stored; retry")
        }
        store::Error::Closed => Status::unavailable("the server is shutting down"),
        store::Error::Corrupt(detail) => {
            tracing::error!(%detail, "corrupt store");
            Status::data_loss("stored data failed an integrity check")
        }
    }
}

pub(crate) fn domain_status(error: domain::Error) -> Status {
    let message = error.to_string();
    match error {
        domain::Error::InvalidArgument { .. } => Status::invalid_argument(message),
        domain::Error::NotFound { .. } => Status::not_found(message),
        domain::Error::AlreadyExists(_) => Status::already_exists(message),
        domain::Error::FailedPrecondition(_) => Status::failed_precondition(message),
        domain::Error::Aborted(_) => Status::aborted(message),
    }
}
