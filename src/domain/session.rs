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
