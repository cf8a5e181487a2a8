//! Sessions and branches as the store hands them out.

use std::collections::BTreeMap;

use super::{BranchName, Hash, NodeId, SessionId};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    pub id: SessionId,
    pub created_at_ms: i64,
    pub metadata: BTreeMap<String, String>,
    pub compaction_count: u32,
    /// Sorted by name.
    pub branches: Vec<Branch>,
}

/// A named ref to a head node; `head` is `None` until the first append.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Branch {
    pub name: BranchName,
    pub head: Option<(NodeId, Hash)>,
    pub updated_at_ms: i64,
}

/// What is left of a deleted session, for the audit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tombstone {
    pub session: SessionId,
    /// The tenant the session belonged to.
    pub tenant: super::Tenant,
    /// The tenant whose key deleted it, or [`Tombstone::RETENTION`].
    pub deleted_by: String,
    pub deleted_at_ms: i64,
    pub nodes: u64,
    pub branches: u32,
    pub summaries: u32,
}

impl Tombstone {
    /// `deleted_by` of a session the retention policy deleted.
    pub const RETENTION: &'static str = "retention";
}
