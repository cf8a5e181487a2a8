//! SQLite's part of the store's reads (`store::sql::reads` runs them), for a reader's connection
//! and the writer's transaction alike: its wording of the statements the engines word
//! differently, and the reads whose statements are its own. One file holds every session, so
//! node ids and blob hashes find their rows alone: most of these leave the session unused.

use async_trait::async_trait;
use sqlx::sqlite::SqliteRow;
use sqlx::{QueryBuilder, Sqlite};

use super::{Conn, Connection};
use crate::domain::{BranchName, CompactionId, Hash, NodeId, SessionId, Tombstone};
use crate::store::Result;
use crate::store::backend::{BranchStart, StoredBlob};
use crate::store::form::rows::NodeRow;
use crate::store::sql::decode::{self, Columns, node_columns, summary_columns, tombstone_columns};
use crate::store::sql::{Run, Sql, ToArg};

/// Bound parameters per `IN (…)` list, well under SQLite's limit.
const IN_CHUNK: usize = 500;

#[async_trait]
impl<C: Connection> Sql for Conn<C> {
    /// Every pair of the filter has a pair of the session's metadata equal to it.
    const SESSIONS: &'static str = "SELECT id, created_at_ms, metadata, compaction_count
         FROM sessions
         WHERE tenant = ?1 AND (?2 IS NULL OR id < ?2)
           AND (?4 IS NULL OR id BETWEEN ?4 AND ?5)
           AND (?6 IS NULL OR NOT EXISTS (
               SELECT 1 FROM json_each(?6) f WHERE NOT EXISTS (
                   SELECT 1 FROM json_each(sessions.metadata) m
                   WHERE m.key = f.key AND m.value = f.value)))
         ORDER BY id DESC LIMIT ?3";
    const BRANCHES: &'static str = "SELECT b.name, b.head_id, b.updated_at_ms, n.hash
         FROM branches b LEFT JOIN nodes n ON n.id = b.head_id
         WHERE b.session_id = ?1 ORDER BY b.name";
    const PARENT_OF: &'static str = "SELECT parent_id FROM nodes WHERE id = ?2";
    const PATH_TO: &'static str = "WITH RECURSIVE walk(id, depth) AS (
             SELECT ?2, 0
             UNION ALL
             SELECT n.parent_id, walk.depth + 1 FROM walk JOIN nodes n ON n.id = walk.id
             WHERE n.parent_id IS NOT NULL
         )
         SELECT id FROM walk ORDER BY depth DESC";
    const ANCESTORS: &'static str = concat!(
        "WITH RECURSIVE walk(id, depth) AS (
             SELECT ?2, 0
             UNION ALL
             SELECT n.parent_id, walk.depth + 1 FROM walk JOIN nodes n ON n.id = walk.id
             WHERE n.parent_id IS NOT NULL AND walk.depth + 1 < ?3
         )
         SELECT ",
        node_columns!(),
        " FROM walk JOIN nodes n ON n.id = walk.id ORDER BY walk.depth DESC"
    );
    const CHAIN: &'static str = concat!(
        "WITH RECURSIVE walk(id, depth) AS (
             SELECT ?2, 0
             UNION ALL
             SELECT p.id, walk.depth + 1 FROM walk
             JOIN nodes c ON c.id = walk.id JOIN nodes p ON p.id = c.parent_id
             WHERE p.function_id = ?3
         )
         SELECT ",
        node_columns!(),
        " FROM walk JOIN nodes n ON n.id = walk.id ORDER BY walk.depth DESC"
    );
    const COMPACTION_OWNER: &'static str = "SELECT c.session_id, s.tenant FROM compactions c
         JOIN sessions s ON s.id = c.session_id WHERE c.id = ?1";
    const EVENTS: &'static str = "SELECT compaction_id, branch, kind, reason, base_head_id,
                tokens_before, tokens_after, summary_id, message, created_at_ms
         FROM compaction_events WHERE session_id = ?1 AND (?2 IS NULL OR branch = ?2)
         ORDER BY id";
    const IDLE_SESSIONS: &'static str = "SELECT s.id FROM sessions s
         WHERE s.created_at_ms < ?1 AND NOT EXISTS
           (SELECT 1 FROM branches b WHERE b.session_id = s.id AND b.updated_at_ms >= ?1)
           AND (?3 IS NULL OR s.tenant = ?3)
           AND s.tenant NOT IN (SELECT value FROM json_each(?4))
         ORDER BY s.id LIMIT ?2";
    const GATEWAY_USAGE: &'static str = "SELECT count(*) AS calls, sum(client_tokens) AS client,
                sum(forwarded_tokens) AS forwarded, sum(input_tokens) AS input,
                sum(cache_read_tokens) AS cache_read, sum(cache_write_tokens) AS cache_write,
                sum(output_tokens) AS output
         FROM gateway_calls WHERE session_id = ?1";

    /// The store's write lock, taken by every write, stands for row locks.
    fn locks(&self) -> bool {
        false
    }

    /// One round trip: the branch, the session's summaries and its pin events.
    async fn branch_start(&mut self, session: SessionId, name: &BranchName) -> Result<BranchStart> {
        const START: &str = concat!(
            "SELECT 0 AS part, b.name AS branch, b.head_id FROM sessions s
                 LEFT JOIN branches b ON b.session_id = s.id AND b.name = ?2
             WHERE s.id = ?1;
             SELECT 1 AS part, ",
            summary_columns!(),
            " FROM summaries WHERE session_id = ?1
                 ORDER BY created_at_ms, id;
             SELECT 2 AS part, node_id, pinned FROM pins WHERE session_id = ?1 ORDER BY seq"
        );
        let rows = self.fetch_all(START, &[session.arg(), name.arg()]).await?;
        let part = |r: &SqliteRow| r.int("part").ok().flatten().unwrap_or(-1);
        let mut rows = rows.iter();
        let Some(first) = rows.next().filter(|r| part(r) == 0) else {
            return Ok(BranchStart::NoSession);
        };
        let mut start = decode::branch_start(first)?;
        if let BranchStart::At {
            summaries,
            pin_events,
            ..
        } = &mut start
        {
            for row in rows {
                match part(row) {
                    1 => summaries.push(decode::summary(row)?),
                    2 => pin_events.push(decode::pin(row)?),
                    _ => {}
                }
            }
        }
        Ok(start)
    }

    async fn nodes(&mut self, _session: SessionId, ids: &[NodeId]) -> Result<Vec<NodeRow>> {
        let mut found = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(IN_CHUNK) {
            let mut query = QueryBuilder::<Sqlite>::new(concat!(
                "SELECT ",
                node_columns!(),
                " FROM nodes n WHERE n.id IN ("
            ));
            let mut list = query.separated(", ");
            for id in chunk {
                list.push_bind(id.as_bytes().to_vec());
            }
            query.push(")");
            for row in query.build().fetch_all(self.conn()).await? {
                found.push(decode::node(&row)?);
            }
        }
        Ok(found)
    }

    async fn blobs(&mut self, _session: SessionId, hashes: &[Hash]) -> Result<Vec<StoredBlob>> {
        let mut found = Vec::with_capacity(hashes.len());
        for chunk in hashes.chunks(IN_CHUNK) {
            let mut query = QueryBuilder::<Sqlite>::new(
                "SELECT hash, size, codec, data FROM blobs WHERE hash IN (",
            );
            let mut list = query.separated(", ");
            for hash in chunk {
                list.push_bind(hash.0.to_vec());
            }
            query.push(")");
            for row in query.build().fetch_all(self.conn()).await? {
                found.push(decode::blob(&row)?);
            }
        }
        Ok(found)
    }

    async fn plan_tombstone(&mut self, id: CompactionId) -> Result<Option<Tombstone>> {
        const PLAN_TOMBSTONE: &str = concat!(
            "SELECT ",
            tombstone_columns!(),
            " FROM tombstone_plans p
             JOIN tombstones t ON t.session_id = p.session_id WHERE p.compaction_id = ?1"
        );
        let row = self.fetch_optional(PLAN_TOMBSTONE, &[id.arg()]).await?;
        row.as_ref().map(decode::tombstone).transpose()
    }
}
