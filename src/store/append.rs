//! Appends: the request and its answer, handed to the group committer (`commit`).

use super::{Error, Result, Scoped, Store};
use crate::domain::{BranchName, NodeContent, NodeId};
use serde::{Deserialize, Serialize};

/// Where an append goes. Ordered (a session's branches, then its functions) so a batch locks
/// its targets in one order.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AppendTarget {
    Branch(BranchName),
    /// The internal chain of a running function.
    Function(NodeId),
}

#[derive(Debug, Clone)]
pub struct AppendRequest {
    pub session: Scoped,
    pub target: AppendTarget,
    /// `Some(None)`: the target must have no head yet.
    pub expected_head: Option<Option<NodeId>>,
    pub idempotency_key: Option<String>,
    pub nodes: Vec<NodeContent>,
    /// Indexes of the nodes to pin as they are written.
    pub pinned: Vec<usize>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppendOutcome {
    pub node_ids: Vec<String>,
    pub head_id: String,
    pub head_hash: String,
}

impl Store {
    /// Appends nodes atomically: all are checked and written, or none is. Concurrent appends
    /// (to any session or branch) share a transaction and its one fsync; each is acknowledged
    /// only after that COMMIT.
    pub async fn append(&self, request: AppendRequest) -> Result<AppendOutcome> {
        let mut outcomes = self.appends.submit(vec![request]).await?;
        outcomes
            .pop()
            .ok_or(Error::Closed)?
            .map_err(|e| self.backend.diagnose(e))
    }

    /// Appends `requests` in order, each as [`Store::append`] would, in as few transactions
    /// as the committer forms (usually one), stopping at the first refused: the answer holds
    /// the outcome of each up to and including that one, and those after it are not written.
    pub async fn append_all(
        &self,
        requests: Vec<AppendRequest>,
    ) -> Result<Vec<Result<AppendOutcome>>> {
        if requests.is_empty() {
            return Ok(Vec::new());
        }
        let outcomes = self.appends.submit(requests).await?;
        Ok(outcomes
            .into_iter()
            .map(|outcome| outcome.map_err(|e| self.backend.diagnose(e)))
            .collect())
    }
}
