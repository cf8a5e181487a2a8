//! Branches: listing, creating at a top-level node, deleting (the nodes stay).

use super::{Result, Scoped, Store};
use crate::domain::{self, Branch, BranchName, Hash, NodeId, SessionId};
use crate::store::backend::WriteTx;
use crate::store::form::clock::now_ms;

impl Store {
    pub async fn list_branches(&self, session: Scoped) -> Result<Vec<Branch>> {
        let (mut conn, session) = self.read_session(session).await?;
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
            Some(id) => Some((id, top_level(&mut *tx, session, id, "from_node_id").await?)),
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
        self.changes.touched(session);
        Ok(Branch {
            name,
            head,
            updated_at_ms: now,
        })
    }

    /// Moves branch `name` to `to` (a top-level node of the session) or to no head; with
    /// `expected`, only if its head is still that one.
    pub async fn reset_branch(
        &self,
        session: Scoped,
        name: BranchName,
        to: Option<NodeId>,
        expected: Option<Option<NodeId>>,
    ) -> Result<Branch> {
        let session = session.id();
        let now = now_ms();
        let mut tx = self.begin_write().await?;
        tx.ensure_session(session).await?;
        let head = tx.branch_head(session, &name).await?;
        if let Some(expected) = expected
            && expected != head
        {
            return Err(domain::Error::head_moved(head, expected).into());
        }
        let to = match to {
            Some(id) => Some((id, top_level(&mut *tx, session, id, "to_node_id").await?)),
            None => None,
        };
        tx.set_branch_head(session, &name, to.map(|(id, _)| id), now)
            .await?;
        tx.commit().await?;
        self.changes.touched(session);
        Ok(Branch {
            name,
            head: to,
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
        tx.commit().await?;
        self.changes.touched(session);
        Ok(())
    }
}

/// The hash of `id`, which must be a top-level node of `session` (a branch points at one);
/// `field` names it in errors.
async fn top_level(
    tx: &mut dyn WriteTx,
    session: SessionId,
    id: NodeId,
    field: &str,
) -> Result<Hash> {
    let node = tx.node_row(session, id, field).await?;
    if let Some(function) = node.function_id {
        return Err(domain::Error::invalid(
            field,
            format!("node {id} is inside function {function}; branch at a top-level node"),
        )
        .into());
    }
    Ok(node.hash)
}
