//! Sessions and what the store keeps per session beside its nodes: creating, scoping to a tenant
//! and listing sessions (`sessions`, `scope`), branches, pins, compaction plans and summaries,
//! the gateway's records, a session's deletion and the store's size (`lifecycle`), and writing an
//! imported history as a new session (`import`).

pub(super) mod branches;
pub(super) mod compaction;
pub(super) mod gateway;
pub(super) mod import;
pub(super) mod lifecycle;
pub(super) mod pins;
pub(super) mod scope;
pub(super) mod sessions;

// The store's own names, as this folder's modules use them (`super::Result`).
use super::{Error, Fault, Result, Scoped, ScopedPlan, Store};
