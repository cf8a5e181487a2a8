//! PostgreSQL's part of the store's reads (`store::sql::reads` runs them), for a reader's
//! connection, a write's transaction and the committer's: its wording of the statements the
//! engines word differently, and the reads whose statements are its own. Every statement names
//! the session its rows belong to, so a distributed database routes it to one shard.

use async_trait::async_trait;

use super::{Conn, Connection};
use crate::domain::{BranchName, CompactionId, Hash, NodeId, SessionId, Tombstone};
use crate::store::Result;
use crate::store::backend::{BranchStart, Reads, StoredBlob};
use crate::store::form::rows::{NodeRow, uuid_from};
use crate::store::sql::decode::{self, node_columns};
use crate::store::sql::{Run, Sql, ToArg};

#[async_trait]
impl<C: Connection> Sql for Conn<C> {
    const SESSIONS: &'static str = "SELECT id, created_at_ms, metadata, compaction_count
         FROM sessions
         WHERE tenant = $1 AND ($2::bytea IS NULL OR id < $2)
           AND ($4::bytea IS NULL OR id BETWEEN $4 AND $5)
           AND ($6::text IS NULL OR metadata::jsonb @> $6::jsonb)
         ORDER BY id DESC LIMIT $3";
    /// Names in byte order, as SQLite sorts them.
    const BRANCHES: &'static str = "SELECT b.name, b.head_id, b.updated_at_ms, n.hash
         FROM branches b LEFT JOIN nodes n ON n.session_id = b.session_id AND n.id = b.head_id
         WHERE b.session_id = $1 ORDER BY b.name COLLATE \"C\"";
    const PARENT_OF: &'static str = "SELECT parent_id FROM nodes WHERE session_id = $1 AND id = $2";
    const PATH_TO: &'static str = "WITH RECURSIVE walk(id, depth) AS (
             SELECT $2::bytea, 0
             UNION ALL
             SELECT n.parent_id, walk.depth + 1 FROM walk
             JOIN nodes n ON n.session_id = $1 AND n.id = walk.id
             WHERE n.parent_id IS NOT NULL
         )
         SELECT id FROM walk ORDER BY depth DESC";
    const ANCESTORS: &'static str = concat!(
        "WITH RECURSIVE walk(id, depth) AS (
             SELECT $2::bytea, 0::bigint
             UNION ALL
             SELECT n.parent_id, walk.depth + 1 FROM walk
             JOIN nodes n ON n.session_id = $1 AND n.id = walk.id
             WHERE n.parent_id IS NOT NULL AND walk.depth + 1 < $3
         )
         SELECT ",
        node_columns!(),
        " FROM walk JOIN nodes n ON n.session_id = $1 AND n.id = walk.id
         ORDER BY walk.depth DESC"
    );
    const CHAIN: &'static str = concat!(
        "WITH RECURSIVE walk(id, depth) AS (
             SELECT $2::bytea, 0
             UNION ALL
             SELECT p.id, walk.depth + 1 FROM walk
             JOIN nodes c ON c.session_id = $1 AND c.id = walk.id
             JOIN nodes p ON p.session_id = $1 AND p.id = c.parent_id
             WHERE p.function_id = $3
         )
         SELECT ",
        node_columns!(),
        " FROM walk JOIN nodes n ON n.session_id = $1 AND n.id = walk.id
         ORDER BY walk.depth DESC"
    );
    /// Plans are distributed by their own id: the owner table answers by it alone.
    const COMPACTION_OWNER: &'static str =
        "SELECT session_id, tenant FROM compaction_owners WHERE id = $1";
    const EVENTS: &'static str = "SELECT compaction_id, branch, kind, reason, base_head_id,
                tokens_before, tokens_after, summary_id, message, created_at_ms
         FROM compaction_events WHERE session_id = $1 AND ($2::text IS NULL OR branch = $2)
         ORDER BY id";
    const IDLE_SESSIONS: &'static str = "SELECT s.id FROM sessions s
         WHERE s.created_at_ms < $1 AND NOT EXISTS
           (SELECT 1 FROM branches b WHERE b.session_id = s.id AND b.updated_at_ms >= $1)
           AND ($3::text IS NULL OR s.tenant = $3)
           AND NOT (s.tenant = ANY($4::text[]))
         ORDER BY s.id LIMIT $2";
    /// PostgreSQL sums BIGINT as NUMERIC: cast back.
    const GATEWAY_USAGE: &'static str = "SELECT count(*) AS calls,
                sum(client_tokens)::BIGINT AS client,
                sum(forwarded_tokens)::BIGINT AS forwarded, sum(input_tokens)::BIGINT AS input,
                sum(cache_read_tokens)::BIGINT AS cache_read,
                sum(cache_write_tokens)::BIGINT AS cache_write,
                sum(output_tokens)::BIGINT AS output
         FROM gateway_calls WHERE session_id = $1";

    fn locks(&self) -> bool {
        self.0.locks()
    }

    /// One round trip, two when the session has summaries: the branch, the session's pin
    /// events (as arrays) and whether it has summaries, then those.
    async fn branch_start(&mut self, session: SessionId, name: &BranchName) -> Result<BranchStart> {
        const START: &str = "SELECT b.name AS branch, b.head_id,
                 (SELECT array_agg(pn.node_id ORDER BY pn.seq) FROM pins pn
                     WHERE pn.session_id = $1) AS pin_nodes,
                 (SELECT array_agg(ps.pinned ORDER BY ps.seq) FROM pins ps
                     WHERE ps.session_id = $1) AS pin_states,
                 EXISTS (SELECT 1 FROM summaries m WHERE m.session_id = $1) AS summarized
             FROM sessions s
                 LEFT JOIN branches b ON b.session_id = s.id AND b.name = $2
             WHERE s.id = $1";
        let Some(row) = self
            .fetch_optional(START, &[session.arg(), name.arg()])
            .await?
        else {
            return Ok(BranchStart::NoSession);
        };
        let mut start = decode::branch_start(&row)?;
        if let BranchStart::At {
            summaries,
            pin_events,
            ..
        } = &mut start
        {
            use sqlx::Row as _;
            let nodes: Vec<Vec<u8>> = row
                .try_get::<Option<_>, _>("pin_nodes")?
                .unwrap_or_default();
            let states: Vec<i64> = row
                .try_get::<Option<_>, _>("pin_states")?
                .unwrap_or_default();
            for (node, state) in nodes.into_iter().zip(states) {
                let node = uuid_from(Some(node), "pins.node_id")?.unwrap_or_default();
                pin_events.push((NodeId::from_bytes(node), state != 0));
            }
            if row.try_get::<bool, _>("summarized")? {
                *summaries = self.summaries(session).await?;
            }
        }
        Ok(start)
    }

    async fn nodes(&mut self, session: SessionId, ids: &[NodeId]) -> Result<Vec<NodeRow>> {
        const NODES: &str = concat!(
            "SELECT ",
            node_columns!(),
            " FROM nodes n WHERE n.session_id = $1 AND n.id = ANY($2)"
        );
        let ids: Vec<Vec<u8>> = ids.iter().map(|id| id.as_bytes().to_vec()).collect();
        let rows = sqlx::query(NODES)
            .bind(session.as_bytes().as_slice())
            .bind(ids)
            .fetch_all(self.conn())
            .await?;
        rows.iter().map(decode::node).collect()
    }

    async fn blobs(&mut self, session: SessionId, hashes: &[Hash]) -> Result<Vec<StoredBlob>> {
        let hashes: Vec<Vec<u8>> = hashes.iter().map(|h| h.0.to_vec()).collect();
        let rows = sqlx::query(
            "SELECT hash, size, codec, data FROM blobs WHERE session_id = $1 AND hash = ANY($2)",
        )
        .bind(session.as_bytes().as_slice())
        .bind(hashes)
        .fetch_all(self.conn())
        .await?;
        rows.iter().map(decode::blob).collect()
    }

    async fn plan_tombstone(&mut self, id: CompactionId) -> Result<Option<Tombstone>> {
        // Two lookups, each by its table's own key: the plans are distributed by plan id, the
        // tombstones by session, and Citus refuses a join between them.
        let session = self
            .fetch_optional(
                "SELECT session_id FROM tombstone_plans WHERE compaction_id = $1",
                &[id.arg()],
            )
            .await?;
        match session {
            Some(row) => {
                let session = decode::req_uuid(&row, "session_id")?;
                self.tombstone(SessionId::from_bytes(session)).await
            }
            None => Ok(None),
        }
    }
}
