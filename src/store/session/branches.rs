//! Branches: listing, creating at a top-level node, deleting (the nodes stay).

use super::{Result, Scoped, Store};
use crate::domain::{self, Branch, BranchName, Hash, NodeId, SessionId};
use crate::store::backend::{BranchAt, WriteTx};
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
        self.write_branch(session, name, from, BranchWrite::Create)
            .await
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
        self.write_branch(session, name, to, BranchWrite::Reset { expected })
            .await
    }

    /// Points branch `name` at `to` (a top-level node of the session) or at no head, creating
    /// or moving it as `how` says.
    async fn write_branch(
        &self,
        session: Scoped,
        name: BranchName,
        to: Option<NodeId>,
        how: BranchWrite,
    ) -> Result<Branch> {
        let session = session.id();
        let now = now_ms();
        let mut tx = self.begin_write().await?;
        tx.ensure_session(session).await?;
        if let BranchWrite::Reset { expected } = how {
            let head = tx.branch_head(session, &name).await?;
            if let Some(expected) = expected
                && expected != head
            {
                return Err(domain::Error::head_moved(head, expected).into());
            }
        }
        let head = match to {
            Some(id) => Some((id, top_level(&mut *tx, session, id, how.field()).await?)),
            None => None,
        };
        let branch = BranchAt {
            session,
            name: &name,
            head: to,
            now,
        };
        match how {
            BranchWrite::Create => {
                if !tx.insert_branch(&branch).await? {
                    return Err(domain::Error::AlreadyExists(format!(
                        "name: branch {name:?} already exists in session {session}"
                    ))
                    .into());
                }
            }
            BranchWrite::Reset { .. } => tx.set_branch_head(&branch).await?,
        }
        tx.commit().await?;
        self.changes.touched(session);
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
        tx.commit().await?;
        self.changes.touched(session);
        Ok(())
    }
}

/// Whether a branch write creates the branch, or moves an existing one (only if its head is
/// still `expected`, when given).
#[derive(Clone, Copy)]
enum BranchWrite {
    Create,
    Reset { expected: Option<Option<NodeId>> },
}

impl BranchWrite {
    /// The request field that names the node the branch is to point at.
    fn field(self) -> &'static str {
        match self {
            Self::Create => "from_node_id",
            Self::Reset { .. } => "to_node_id",
        }
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
