//! The gRPC service: request → domain → store/engine → response. The only place with prost types.

mod append_stream;
pub mod auth;
mod codec;
mod compaction;
mod convert;
mod export;
mod framing;
mod gateway_calls;
pub mod json;
pub(crate) mod lifecycle;
mod parse;
#[cfg(test)]
mod props;
mod reply;
mod service;
mod watch;

pub use framing::FramingLayer;
pub use service::{ContextStoreService, SavingsReport};
pub use watch::Watchers;

/// Code generated from `proto/ctxd/v1/ctxd.proto`.
#[allow(clippy::all, clippy::pedantic)]
pub mod pb {
    tonic::include_proto!("ctxd.v1");

    /// The encoded descriptors, for server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("ctxd_descriptor");
}

use tonic::Status;

use crate::compaction::Error as CompactionError;
use crate::store::Fault;
use crate::{domain, store};

/// The one mapping from errors to gRPC status. Internal detail goes to the log, not the client.
pub(crate) fn status(error: store::Error) -> Status {
    if let store::Error::Domain(e) = error {
        return domain_status(e);
    }
    let fault = error.fault().unwrap_or(Fault::Internal);
    match fault {
        Fault::Full => {
            tracing::warn!(%error, "database full");
            metrics::counter!("ctxd_sqlite_full_total").increment(1);
            Status::resource_exhausted(
                "the database is full (its disk, or the size limit set by --max-db-bytes): \
                 writes are refused until there is room again; reads still work",
            )
        }
        Fault::Busy => {
            tracing::warn!(%error, "database busy");
            metrics::counter!("ctxd_sqlite_busy_total").increment(1);
            Status::unavailable(
                "the database is busy (another process holds its write lock); nothing was \
                 written: retry",
            )
        }
        Fault::Conflict => {
            tracing::warn!(%error, "write conflict");
            Status::aborted(
                "the write conflicted with a concurrent one and was rolled back; nothing was \
                 written: retry",
            )
        }
        Fault::Unavailable => {
            tracing::error!(%error, "database unavailable");
            Status::unavailable(
                "the database cannot be written now (read-only, or a disk I/O error); nothing \
                 was written: retry later",
            )
        }
        Fault::Closed => Status::unavailable("the server is shutting down"),
        Fault::Corrupt => {
            tracing::error!(%error, "corrupt store");
            Status::data_loss("stored data failed an integrity check")
        }
        Fault::Internal => {
            tracing::error!(%error, "storage error");
            Status::internal("internal storage error")
        }
    }
}

/// The compaction workflow's errors: the store's through [`status`], and its own two.
pub(crate) fn compaction_status(error: CompactionError) -> Status {
    match error {
        CompactionError::Store(e) => status(e),
        CompactionError::UnknownTokenizer => Status::data_loss(error.to_string()),
        CompactionError::Task(_) => Status::internal(error.to_string()),
    }
}

/// The longest message a status carries. Messages quote the caller's input (a branch name, an
/// id), and a `grpc-message` header past the client's HTTP/2 header limit fails the whole
/// connection, every other call on it included, not just this one.
const MAX_MESSAGE_BYTES: usize = 1024;

/// `message`, cut to [`MAX_MESSAGE_BYTES`] at a character boundary; the field it names comes
/// first, so it survives the cut.
fn bounded(mut message: String) -> String {
    if message.len() > MAX_MESSAGE_BYTES {
        let total = message.len();
        let mut end = MAX_MESSAGE_BYTES;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
        message.push_str(&format!("… ({total} bytes in all)"));
    }
    message
}

pub(crate) fn domain_status(error: domain::Error) -> Status {
    let message = bounded(error.to_string());
    match error {
        domain::Error::InvalidArgument { .. } => Status::invalid_argument(message),
        domain::Error::NotFound { .. } => Status::not_found(message),
        domain::Error::AlreadyExists(_) => Status::already_exists(message),
        domain::Error::FailedPrecondition(_) => Status::failed_precondition(message),
        domain::Error::Aborted(_) => Status::aborted(message),
    }
}
