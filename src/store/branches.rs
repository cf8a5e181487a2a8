//! Branches: listing, creating at a top-level node, deleting (the nodes stay).

use sqlx::{Row, SqliteConnection};

use super::clock::now_ms;
use super::rows::{ensure_session, hash_column, id_column, node_row};
use super::{Result, Scoped, Store};
use crate::domain::{self, Branch, BranchName, NodeId, SessionId};

impl Store {
    pub async fn list_branches(&self, session: Scoped) -> Result<Vec<Branch>> {
        let session = session.id();
        let mut conn = self.reader.acquire().await?;
        ensure_session(&mut conn, session).await?;
        branches(&mut conn, session).await
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
        ensure_session(&mut tx, session).await?;
        let head = match from {
            Some(id) => {
                let node = node_row(&mut tx, session, id, "from_node_id").await?;
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
        let inserted = sqlx::query(
            "INSERT INTO branches (session_id, name, head_id, updated_at_ms) VALUES (?, ?, ?, ?)",
        )
        .bind(session.as_bytes().as_slice())
        .bind(name.as_str())
        .bind(head.map(|(id, _)| id.as_bytes().to_vec()))
        .bind(now)
        .execute(&mut *tx)
        .await;
        match inserted {
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
                return Err(domain::Error::AlreadyExists(format!(
                    "name: branch {name:?} already exists in session {session}"
                ))
                .into());
            }
            other => other?,
        };
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
        ensure_session(&mut tx, session).await?;
        let done = sqlx::query("DELETE FROM branches WHERE session_id = ? AND name = ?")
            .bind(session.as_bytes().as_slice())
            .bind(name.as_str())
            .execute(&mut *tx)
            .await?;
        if done.rows_affected() == 0 {
            return Err(domain::Error::not_found("branch", name).into());
        }
        tx.commit().await?;
        Ok(())
    }
}

pub(super) async fn branches(
    conn: &mut SqliteConnection,
    session: SessionId,
) -> Result<Vec<Branch>> {
    let rows = sqlx::query(
        "SELECT b.name, b.head_id, b.updated_at_ms, n.hash FROM branches b
         LEFT JOIN nodes n ON n.id = b.head_id
         WHERE b.session_id = ? ORDER BY b.name",
    )
    .bind(session.as_bytes().as_slice())
    .fetch_all(&mut *conn)
    .await?;
    rows.iter()
        .map(|row| {
            let head = match id_column(row, "head_id")? {
                Some(id) => Some((id, hash_column(row, "hash")?)),
                None => None,
            };
            Ok(Branch {
                name: BranchName::from_stored(row.try_get("name")?),
                head,
                updated_at_ms: row.try_get("updated_at_ms")?,
            })
        })
        .collect()
}
