//! Branches: listing, creating at a top-level node, deleting (the nodes stay).

use super::clock::now_ms;
use super::{Result, Scoped, Store};
use crate::domain::{self, Branch, BranchName, NodeId};

impl Store {
    pub async fn list_branches(&self, session: Scoped) -> Result<Vec<Branch>> {
        let session = session.id();
        let mut conn = self.read().await?;
        conn.ensure_session(session).await?;
        conn.branches(session).await
    }

    /// Creates a branch at `from` (a top-level node of the session), or with no head.
    pub async fn create_branch(
        &self,
        session: Scoped,
        name: BranchName,
        from: Option<NodeId>,
    ) -> Result<Branch> {
        let session = session.id();
        let now = now_ms();
        let mut tx = self.begin_write().await?;
        tx.ensure_session(session).await?;
        let head = match from {
            Some(id) => {
                let node = tx.node_row(session, id, "from_node_id").await?;
                if let Some(function) = node.function_id {
                    return Err(domain::Error::invalid(
                        "from_node_id",
                        format!(
                            "node {id} is inside function {function}; branch at a top-level node"
                        ),
                    )
                    .into());
                }
                Some((id, node.hash))
            }
            None => None,
        };
        if !tx
            .insert_branch(session, &name, head.map(|(id, _)| id), now)
            .await?
        {
            return Err(domain::Error::AlreadyExists(format!(
                "name: branch {name:?} already exists in session {session}"
            ))
            .into());
        }
        tx.commit().await?;
        Ok(Branch {
            name,
            head,
            updated_at_ms: now,
        })
    }

    /// Removes the ref; the nodes stay.
    pub async fn delete_branch(&self, session: Scoped, name: &BranchName) -> Result<()> {
        let session = session.id();
        let mut tx = self.begin_write().await?;
        tx.ensure_session(session).await?;
        if !tx.delete_branch(session, name).await? {
            return Err(domain::Error::not_found("branch", name).into());
        }
        tx.commit().await
    }
}
