//! Pins: events that mark nodes to keep verbatim; a node's latest event is its state.

use sqlx::{Row, SqliteConnection};

use super::clock::now_ms;
use super::rows::{ensure_session, id_column, node_row};
use super::{Result, Scoped, Store};
use crate::domain::{NodeId, SessionId};

/// The session's pinned nodes, oldest pin first.
pub(super) async fn pinned(conn: &mut SqliteConnection, session: SessionId) -> Result<Vec<NodeId>> {
    let rows = sqlx::query("SELECT node_id, pinned FROM pins WHERE session_id = ? ORDER BY seq")
        .bind(session.as_bytes().as_slice())
        .fetch_all(&mut *conn)
        .await?;
    fold(rows.iter().map(|row| {
        Ok((
            id_column(row, "node_id")?,
            row.try_get::<i64, _>("pinned")? != 0,
        ))
    }))
}

/// Folds pin events, oldest first, into the pinned nodes in the order of their latest pin.
pub(super) fn fold(
    events: impl Iterator<Item = Result<(Option<NodeId>, bool)>>,
) -> Result<Vec<NodeId>> {
    let mut order: Vec<NodeId> = Vec::new();
    for event in events {
        let (node, pin) = event?;
        let Some(node) = node else { continue };
        order.retain(|id| *id != node);
        if pin {
            order.push(node);
        }
    }
    Ok(order)
}

impl Store {
    /// Pins (or unpins) `nodes` of `session`, recording an event for each whose state changes;
    /// returns the session's pinned nodes after. Every id must be a node of the session.
    pub async fn pin(&self, session: Scoped, nodes: &[NodeId], pin: bool) -> Result<Vec<NodeId>> {
        let session = session.id();
        let mut tx = self.begin_write().await?;
        ensure_session(&mut tx, session).await?;
        for (i, id) in nodes.iter().enumerate() {
            node_row(&mut tx, session, *id, &format!("node_ids[{i}]")).await?;
        }
        // The pins after, in the order `pinned` reads them back: a new pin goes last.
        let mut after = pinned(&mut tx, session).await?;
        let at = now_ms();
        for id in nodes {
            let was = after.contains(id);
            if was == pin {
                continue;
            }
            if pin {
                after.push(*id);
            } else {
                after.retain(|p| p != id);
            }
            sqlx::query(
                "INSERT INTO pins (session_id, node_id, pinned, created_at_ms) VALUES (?, ?, ?, ?)",
            )
            .bind(session.as_bytes().as_slice())
            .bind(id.as_bytes().as_slice())
            .bind(i64::from(pin))
            .bind(at)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(after)
    }

    /// The session's pinned nodes, oldest pin first.
    pub async fn pinned(&self, session: Scoped) -> Result<Vec<NodeId>> {
        let session = session.id();
        let mut conn = self.reader.acquire().await?;
        ensure_session(&mut conn, session).await?;
        pinned(&mut conn, session).await
    }
}
