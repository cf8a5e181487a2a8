//! Pins: events that mark nodes to keep verbatim; a node's latest event is its state.

use super::{Result, Scoped, Store};
use crate::domain::NodeId;
use crate::store::form::clock::now_ms;

/// Folds pin events, oldest first, into the pinned nodes in the order of their latest pin.
pub(in crate::store) fn fold(events: &[(NodeId, bool)]) -> Vec<NodeId> {
    let mut order: Vec<NodeId> = Vec::new();
    for &(node, pin) in events {
        order.retain(|id| *id != node);
        if pin {
            order.push(node);
        }
    }
    order
}

impl Store {
    /// Pins (or unpins) `nodes` of `session`, recording an event for each whose state changes;
    /// returns the session's pinned nodes after. Every id must be a node of the session.
    pub async fn pin(&self, session: Scoped, nodes: &[NodeId], pin: bool) -> Result<Vec<NodeId>> {
        let session = session.id();
        let mut tx = self.begin_write().await?;
        tx.ensure_session(session).await?;
        for (i, id) in nodes.iter().enumerate() {
            tx.node_row(session, *id, &format!("node_ids[{i}]")).await?;
        }
        // The pins after, in the order `pinned` reads them back: a new pin goes last.
        let mut after = fold(&tx.pin_events(session).await?);
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
            tx.insert_pin(session, (*id, pin), at).await?;
        }
        tx.commit().await?;
        self.changes.touched(session);
        Ok(after)
    }

    /// The session's pinned nodes, oldest pin first.
    pub async fn pinned(&self, session: Scoped) -> Result<Vec<NodeId>> {
        let (mut conn, session) = self.read_session(session).await?;
        Ok(fold(&conn.pin_events(session).await?))
    }
}
