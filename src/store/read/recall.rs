//! What `Recall` asks of the store: the node of a session a placeholder's reference names.

use super::{Result, Scoped, Store};
use crate::domain::{self, Hash, Node, REFERENCE_CHARS};

impl Store {
    /// The node of `session` whose hash starts with `prefix` (a parsed reference). Another
    /// session's node is not found, as an unknown one; two nodes of one session under one
    /// reference (a 48-bit collision) are refused rather than guessed between.
    pub async fn node_by_reference(
        &self,
        session: Scoped,
        prefix: &[u8; REFERENCE_CHARS / 2],
    ) -> Result<Node> {
        let (mut low, mut high) = ([0u8; 32], [0xffu8; 32]);
        low[..prefix.len()].copy_from_slice(prefix);
        high[..prefix.len()].copy_from_slice(prefix);
        let reference: String = prefix.iter().map(|b| format!("{b:02x}")).collect();
        let ids = {
            let (mut conn, id) = self.read_session(session).await?;
            conn.nodes_by_hash_range(id, Hash(low)..=Hash(high), 2)
                .await?
        };
        match ids.as_slice() {
            [] => Err(domain::Error::not_found("reference", reference).into()),
            [id] => Ok(self
                .get_nodes(session, &[*id])
                .await?
                .pop()
                .ok_or_else(|| domain::Error::not_found("reference", reference))?),
            _ => Err(domain::Error::invalid(
                "reference",
                format!("{reference} names more than one node of this session"),
            )
            .into()),
        }
    }
}
