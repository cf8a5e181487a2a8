//! The gRPC door: request → domain → workflow → response, over the contract in `proto`.

mod append_stream;
pub mod auth;
mod compaction;
mod convert;
mod export;
mod framing;
mod gateway_calls;
mod import;
pub(crate) mod lifecycle;
mod parse;
#[cfg(test)]
mod props;
mod render;
mod reply;
mod service;
mod sessions;
mod watch;

pub use framing::Framing;
pub use service::ContextStoreService;
pub use watch::Watchers;

// The contract's types under the door's name, for the code and tests that speak gRPC.
pub use crate::proto::{json, pb};

use tonic::Status;

use crate::store::Fault;
use crate::{domain, store, workflow};

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

/// The one mapping of the workflows' errors: the store's through [`status`], and their own.
pub(crate) fn workflow_status(error: workflow::Error) -> Status {
    match error {
        workflow::Error::Store(e) => status(e),
        workflow::Error::UnknownTokenizer => Status::data_loss(error.to_string()),
        workflow::Error::Task(_) => Status::internal(error.to_string()),
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
