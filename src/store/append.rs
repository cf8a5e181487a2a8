//! Appends: the request and its answer, handed to the group committer (`commit`).

use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

use super::commit::{Job, Message};
use super::{Error, Result, Scoped, Store};
use crate::domain::{BranchName, NodeContent, NodeId};

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
        let (reply, answer) = oneshot::channel();
        self.appends
            .send(Message::Append(Job::new(request, reply)))
            .await
            .map_err(|_| Error::Closed)?;
        answer
            .await
            .map_err(|_| Error::Closed)?
            .map_err(|e| self.backend.diagnose(e))
    }
}
