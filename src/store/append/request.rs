//! Appends: the request and its answer, handed to the group committer (`commit`).

use super::commit::Answer;
use super::{Error, Result, Scoped, Store};
use crate::domain::{BranchName, Node, NodeContent, NodeId};
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
        let answer = self.appends.submit(vec![request]).await?;
        let mut outcomes = self.remember_written(answer);
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
        let answer = self.appends.submit(requests).await?;
        Ok(self
            .remember_written(answer)
            .into_iter()
            .map(|outcome| outcome.map_err(|e| self.backend.diagnose(e)))
            .collect())
    }

    /// Puts the nodes the answer's batch wrote for these requests in the read cache, from the
    /// requests themselves (checked, so as stored): the render that usually follows an append
    /// then reads none of them back. Returns the outcomes.
    fn remember_written(&self, answer: Answer) -> Vec<Result<AppendOutcome>> {
        let Answer {
            outcomes,
            requests,
            written,
        } = answer;
        let mut nodes = Vec::new();
        for (request, outcome) in requests.into_iter().zip(&outcomes) {
            let Ok(outcome) = outcome else { continue };
            for (content, id) in request.nodes.into_iter().zip(&outcome.node_ids) {
                // An idempotent retry answers with nodes an earlier batch wrote: not here.
                let Some(insert) = NodeId::parse("node_id", id)
                    .ok()
                    .and_then(|id| written.get(&id))
                else {
                    continue;
                };
                nodes.push(Node {
                    id: insert.id,
                    parent_id: insert.parent,
                    function_id: insert.function,
                    content,
                    created_at_ms: insert.created_at_ms,
                    hash: insert.hash,
                });
            }
        }
        self.remember_nodes(nodes);
        outcomes
    }
}
