//! Appends: the request and its answer (`request`), the checks a batch of them passes
//! (`batch`), the rows it plans (`planned`), the idempotency fingerprints a retry repeats
//! (`idempotency`), and the group committer that writes every waiting append in one transaction
//! (`commit`): each batch's transaction (`write`) and what it remembers between them
//! (`memory`).

pub(super) mod batch;
pub(super) mod commit;
pub(super) mod idempotency;
mod memory;
pub(super) mod planned;
pub(super) mod request;
mod write;

// The store's own names, as this folder's modules use them (`super::Result`).
use super::{Error, Fault, Result, Scoped, Store};
