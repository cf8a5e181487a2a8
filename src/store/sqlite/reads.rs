//! The SQL of the store's reads on SQLite (`Lookups`, `Reads`), for a reader's connection and
//! the writer's transaction alike, and decoding their rows.

use async_trait::async_trait;
use sqlx::sqlite::SqliteRow;
use sqlx::{QueryBuilder, Row, Sqlite};

use super::{BRANCH_HEAD, Conn, Connection, FUNCTION_ROW, NODE_ROW, SESSION_EXISTS};
use crate::domain::{
    Branch, BranchName, CompactionEvent, CompactionId, GatewayCall, GatewayCallId, GatewayUsage,
    Hash, NodeId, Reason, SessionFilter, SessionId, Summary, Tenant, Tombstone,
};
use crate::store::append::request::AppendOutcome;
use crate::store::backend::{
    BranchStart, Lookups, Reads, SessionRow, StoredBlob, metadata_filter, tenant_filter,
};
use crate::store::form::rows::NodeRow;
use crate::store::session::compaction::CompactionPlan;
use crate::store::session::lifecycle::Tenants;
use crate::store::sql::decode::{self, Columns, SUMMARY_COLUMNS, TOMBSTONE_COLUMNS};
use crate::store::{Error, Result};

/// Bound parameters per `IN (…)` list, well under SQLite's limit.
const IN_CHUNK: usize = 500;

const NODE_COLUMNS: &str =
    "n.id, n.parent_id, n.function_id, n.created_at_ms, n.hash, n.body, n.body_z";

#[async_trait]
impl<C: Connection> Lookups for Conn<C> {
    async fn session_exists(&mut self, session: SessionId) -> Result<bool> {
        Ok(sqlx::query(SESSION_EXISTS)
            .bind(session.as_bytes().as_slice())
            .fetch_optional(self.conn())
            .await?
            .is_some())
    }

    async fn find_branch_head(
        &mut self,
        session: SessionId,
        name: &BranchName,
    ) -> Result<Option<Option<NodeId>>> {
        let row = sqlx::query(BRANCH_HEAD)
            .bind(session.as_bytes().as_slice())
            .bind(name.as_str())
            .fetch_optional(self.conn())
            .await?;
        row.map(|row| decode::node_id(&row, "head_id")).transpose()
    }

    async fn find_function(
        &mut self,
        session: SessionId,
        function: NodeId,
    ) -> Result<Option<(Option<NodeId>, bool)>> {
        let row = sqlx::query(FUNCTION_ROW)
            .bind(function.as_bytes().as_slice())
            .bind(session.as_bytes().as_slice())
            .fetch_optional(self.conn())
            .await?;
        row.map(|row| {
            Ok((
                decode::node_id(&row, "head_id")?,
                decode::node_id(&row, "closed_by")?.is_some(),
            ))
        })
        .transpose()
    }

    async fn find_node(&mut self, session: SessionId, id: NodeId) -> Result<Option<NodeRow>> {
        let row = sqlx::query(NODE_ROW)
            .bind(id.as_bytes().as_slice())
            .bind(session.as_bytes().as_slice())
            .fetch_optional(self.conn())
            .await?;
        row.as_ref().map(decode::node).transpose()
    }

    async fn idempotency_record(
        &mut self,
        session: SessionId,
        key: &str,
    ) -> Result<Option<(Hash, AppendOutcome)>> {
        let row = sqlx::query(
            "SELECT request_hash, response FROM idempotency WHERE session_id = ?1 AND key = ?2",
        )
        .bind(session.as_bytes().as_slice())
        .bind(key)
        .fetch_optional(self.conn())
        .await?;
        let Some(row) = row else { return Ok(None) };
        let response: String = row.try_get("response")?;
        let outcome = serde_json::from_str(&response)
            .map_err(|e| Error::Corrupt(format!("idempotency response: {e}")))?;
        Ok(Some((decode::hash(&row, "request_hash")?, outcome)))
    }
}

#[async_trait]
impl<C: Connection> Reads for Conn<C> {
    async fn session_tenant(&mut self, id: SessionId) -> Result<Option<Tenant>> {
        let tenant: Option<String> = sqlx::query_scalar("SELECT tenant FROM sessions WHERE id = ?")
            .bind(id.as_bytes().as_slice())
            .fetch_optional(self.conn())
            .await?;
        Ok(tenant.map(Tenant::new))
    }

    async fn session_key(
        &mut self,
        tenant: &Tenant,
        key: &str,
    ) -> Result<Option<(Hash, SessionId)>> {
        let row = sqlx::query(
            "SELECT request_hash, session_id FROM session_keys WHERE tenant = ? AND key = ?",
        )
        .bind(tenant.as_str())
        .bind(key)
        .fetch_optional(self.conn())
        .await?;
        row.map(|row| {
            Ok((
                decode::hash(&row, "request_hash")?,
                SessionId::from_bytes(decode::req_uuid(&row, "session_id")?),
            ))
        })
        .transpose()
    }

    async fn session(&mut self, id: SessionId) -> Result<Option<SessionRow>> {
        let row = sqlx::query(
            "SELECT id, created_at_ms, metadata, compaction_count FROM sessions WHERE id = ?",
        )
        .bind(id.as_bytes().as_slice())
        .fetch_optional(self.conn())
        .await?;
        row.as_ref().map(decode::session).transpose()
    }

    async fn sessions(
        &mut self,
        tenant: &Tenant,
        after: Option<SessionId>,
        limit: u32,
        filter: &SessionFilter,
    ) -> Result<Vec<SessionRow>> {
        let (low, high) = filter.ids.map_or((None, None), |(l, h)| (Some(l), Some(h)));
        // Every pair of the filter has a pair of the session's metadata equal to it.
        let rows = sqlx::query(
            "SELECT id, created_at_ms, metadata, compaction_count FROM sessions
             WHERE tenant = ?1 AND (?2 IS NULL OR id < ?2)
               AND (?4 IS NULL OR id BETWEEN ?4 AND ?5)
               AND (?6 IS NULL OR NOT EXISTS (
                   SELECT 1 FROM json_each(?6) f WHERE NOT EXISTS (
                       SELECT 1 FROM json_each(sessions.metadata) m
                       WHERE m.key = f.key AND m.value = f.value)))
             ORDER BY id DESC LIMIT ?3",
        )
        .bind(tenant.as_str())
        .bind(after.map(|id| id.as_bytes().to_vec()))
        .bind(i64::from(limit))
        .bind(low.map(|b| b.to_vec()))
        .bind(high.map(|b| b.to_vec()))
        .bind(metadata_filter(filter))
        .fetch_all(self.conn())
        .await?;
        rows.iter().map(decode::session).collect()
    }

    async fn node_count(&mut self, session: SessionId) -> Result<u64> {
        let count: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM nodes WHERE session_id = ?")
            .bind(session.as_bytes().as_slice())
            .fetch_one(self.conn())
            .await?;
        Ok(u64::try_from(count).unwrap_or(0))
    }

    async fn branches(&mut self, session: SessionId) -> Result<Vec<Branch>> {
        let rows = sqlx::query(
            "SELECT b.name, b.head_id, b.updated_at_ms, n.hash FROM branches b
             LEFT JOIN nodes n ON n.id = b.head_id
             WHERE b.session_id = ? ORDER BY b.name",
        )
        .bind(session.as_bytes().as_slice())
        .fetch_all(self.conn())
        .await?;
        rows.iter().map(decode::branch).collect()
    }

    async fn pin_events(&mut self, session: SessionId) -> Result<Vec<(NodeId, bool)>> {
        let rows =
            sqlx::query("SELECT node_id, pinned FROM pins WHERE session_id = ? ORDER BY seq")
                .bind(session.as_bytes().as_slice())
                .fetch_all(self.conn())
                .await?;
        rows.iter().map(decode::pin).collect()
    }

    async fn summaries(&mut self, session: SessionId) -> Result<Vec<Summary>> {
        let sql = format!(
            "SELECT {SUMMARY_COLUMNS} FROM summaries WHERE session_id = ? \
             ORDER BY created_at_ms, id"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(session.as_bytes().as_slice())
            .fetch_all(self.conn())
            .await?;
        rows.iter().map(decode::summary).collect()
    }

    /// One round trip: the branch, the session's summaries and its pin events.
    async fn branch_start(&mut self, session: SessionId, name: &BranchName) -> Result<BranchStart> {
        let sql = format!(
            "SELECT 0 AS part, b.name AS branch, b.head_id FROM sessions s
                 LEFT JOIN branches b ON b.session_id = s.id AND b.name = ?2
             WHERE s.id = ?1;
             SELECT 1 AS part, {SUMMARY_COLUMNS} FROM summaries WHERE session_id = ?1
                 ORDER BY created_at_ms, id;
             SELECT 2 AS part, node_id, pinned FROM pins WHERE session_id = ?1 ORDER BY seq"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(session.as_bytes().as_slice())
            .bind(name.as_str())
            .fetch_all(self.conn())
            .await?;
        let part = |r: &SqliteRow| r.try_get::<i64, _>("part").unwrap_or(-1);
        let mut rows = rows.iter();
        let Some(first) = rows.next().filter(|r| part(r) == 0) else {
            return Ok(BranchStart::NoSession);
        };
        if first.try_get::<Option<String>, _>("branch")?.is_none() {
            return Ok(BranchStart::NoBranch);
        }
        let Some(head) = decode::node_id(first, "head_id")? else {
            return Ok(BranchStart::Empty);
        };
        let rest: Vec<&SqliteRow> = rows.collect();
        Ok(BranchStart::At {
            head,
            summaries: rest
                .iter()
                .filter(|r| part(r) == 1)
                .map(|r| decode::summary(*r))
                .collect::<Result<_>>()?,
            pin_events: rest
                .iter()
                .filter(|r| part(r) == 2)
                .map(|r| decode::pin(*r))
                .collect::<Result<_>>()?,
        })
    }

    // One file holds every session: node ids and blob hashes find their rows alone.

    async fn parent_of(&mut self, _session: SessionId, id: NodeId) -> Result<Option<NodeId>> {
        let row = sqlx::query("SELECT parent_id FROM nodes WHERE id = ?")
            .bind(id.as_bytes().as_slice())
            .fetch_one(self.conn())
            .await?;
        decode::node_id(&row, "parent_id")
    }

    async fn path_to(&mut self, _session: SessionId, head: NodeId) -> Result<Vec<NodeId>> {
        let rows = sqlx::query(
            "WITH RECURSIVE walk(id, depth) AS (
                 SELECT ?1, 0
                 UNION ALL
                 SELECT n.parent_id, walk.depth + 1 FROM walk JOIN nodes n ON n.id = walk.id
                 WHERE n.parent_id IS NOT NULL
             )
             SELECT id FROM walk ORDER BY depth DESC",
        )
        .bind(head.as_bytes().as_slice())
        .fetch_all(self.conn())
        .await?;
        rows.iter()
            .map(|row| {
                decode::node_id(row, "id")?.ok_or_else(|| Error::Corrupt("a null id".into()))
            })
            .collect()
    }

    async fn ancestors(
        &mut self,
        _session: SessionId,
        start: NodeId,
        limit: Option<u32>,
    ) -> Result<Vec<NodeRow>> {
        let sql = format!(
            "WITH RECURSIVE walk(id, depth) AS (
                 SELECT ?1, 0
                 UNION ALL
                 SELECT n.parent_id, walk.depth + 1 FROM walk JOIN nodes n ON n.id = walk.id
                 WHERE n.parent_id IS NOT NULL AND walk.depth + 1 < ?2
             )
             SELECT {NODE_COLUMNS} FROM walk JOIN nodes n ON n.id = walk.id
             ORDER BY walk.depth DESC"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(start.as_bytes().as_slice())
            .bind(limit.map_or(i64::MAX, i64::from))
            .fetch_all(self.conn())
            .await?;
        rows.iter().map(decode::node).collect()
    }

    async fn chain(
        &mut self,
        _session: SessionId,
        head: NodeId,
        function: NodeId,
    ) -> Result<Vec<NodeRow>> {
        let sql = format!(
            "WITH RECURSIVE walk(id, depth) AS (
                 SELECT ?1, 0
                 UNION ALL
                 SELECT p.id, walk.depth + 1 FROM walk
                 JOIN nodes c ON c.id = walk.id JOIN nodes p ON p.id = c.parent_id
                 WHERE p.function_id = ?2
             )
             SELECT {NODE_COLUMNS} FROM walk JOIN nodes n ON n.id = walk.id
             ORDER BY walk.depth DESC"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(head.as_bytes().as_slice())
            .bind(function.as_bytes().as_slice())
            .fetch_all(self.conn())
            .await?;
        rows.iter().map(decode::node).collect()
    }

    async fn nodes(&mut self, _session: SessionId, ids: &[NodeId]) -> Result<Vec<NodeRow>> {
        let mut found = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(IN_CHUNK) {
            let mut query = QueryBuilder::<Sqlite>::new(format!(
                "SELECT {NODE_COLUMNS} FROM nodes n WHERE n.id IN ("
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
                found.push(StoredBlob {
                    hash: decode::hash(&row, "hash")?,
                    size: row.try_get("size")?,
                    codec: row.try_get("codec")?,
                    data: row.try_get("data")?,
                });
            }
        }
        Ok(found)
    }

    async fn compaction_owner(&mut self, id: CompactionId) -> Result<Option<(SessionId, Tenant)>> {
        let row = sqlx::query(
            "SELECT c.session_id, s.tenant FROM compactions c
             JOIN sessions s ON s.id = c.session_id WHERE c.id = ?",
        )
        .bind(id.as_bytes().as_slice())
        .fetch_optional(self.conn())
        .await?;
        row.map(|row| {
            Ok((
                SessionId::from_bytes(decode::req_uuid(&row, "session_id")?),
                Tenant::new(row.try_get::<String, _>("tenant")?),
            ))
        })
        .transpose()
    }

    async fn find_plan(
        &mut self,
        session: SessionId,
        id: CompactionId,
    ) -> Result<Option<CompactionPlan>> {
        let row = sqlx::query(
            "SELECT session_id, branch, base_head_id, kind, rolls_over, covers, range_from_id,
                    range_to_id, ledger, budget, tokenizer, max_tool_result_chars, retain_turns,
                    instructions, tokens_before, state, created_at_ms
             FROM compactions WHERE id = ? AND session_id = ?",
        )
        .bind(id.as_bytes().as_slice())
        .bind(session.as_bytes().as_slice())
        .fetch_optional(self.conn())
        .await?;
        row.map(|row| decode::plan(id, &row)).transpose()
    }

    async fn events(
        &mut self,
        session: SessionId,
        branch: Option<&BranchName>,
    ) -> Result<Vec<CompactionEvent>> {
        let rows = sqlx::query(
            "SELECT compaction_id, branch, kind, reason, base_head_id, tokens_before,
                    tokens_after, summary_id, message, created_at_ms
             FROM compaction_events WHERE session_id = ?1 AND (?2 IS NULL OR branch = ?2)
             ORDER BY id",
        )
        .bind(session.as_bytes().as_slice())
        .bind(branch.map(BranchName::as_str))
        .fetch_all(self.conn())
        .await?;
        rows.iter().map(decode::event).collect()
    }

    async fn recent_commits(
        &mut self,
        session: SessionId,
        branch: &BranchName,
        limit: u32,
    ) -> Result<Vec<(Option<Reason>, Option<NodeId>)>> {
        let rows = sqlx::query(
            "SELECT reason, base_head_id FROM compaction_events
             WHERE session_id = ? AND branch = ? AND kind IN ('committed', 'rejected')
             ORDER BY id DESC LIMIT ?",
        )
        .bind(session.as_bytes().as_slice())
        .bind(branch.as_str())
        .bind(i64::from(limit))
        .fetch_all(self.conn())
        .await?;
        rows.iter()
            .map(|row| Ok((decode::reason(row)?, decode::node_id(row, "base_head_id")?)))
            .collect()
    }

    async fn summarizer_output(&mut self, source: &Hash) -> Result<Option<String>> {
        let row = sqlx::query("SELECT text FROM summarizer_outputs WHERE source_key = ?")
            .bind(source.0.as_slice())
            .fetch_optional(self.conn())
            .await?;
        Ok(row.map(|r| r.try_get("text")).transpose()?)
    }

    async fn tombstone(&mut self, session: SessionId) -> Result<Option<Tombstone>> {
        let sql = format!("SELECT {TOMBSTONE_COLUMNS} FROM tombstones t WHERE t.session_id = ?");
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(session.as_bytes().as_slice())
            .fetch_optional(self.conn())
            .await?;
        row.as_ref().map(decode::tombstone).transpose()
    }

    async fn plan_tombstone(&mut self, id: CompactionId) -> Result<Option<Tombstone>> {
        let sql = format!(
            "SELECT {TOMBSTONE_COLUMNS} FROM tombstone_plans p
             JOIN tombstones t ON t.session_id = p.session_id WHERE p.compaction_id = ?"
        );
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(id.as_bytes().as_slice())
            .fetch_optional(self.conn())
            .await?;
        row.as_ref().map(decode::tombstone).transpose()
    }

    async fn idle_sessions(
        &mut self,
        before_ms: i64,
        limit: u32,
        tenants: Tenants<'_>,
    ) -> Result<Vec<SessionId>> {
        let (only, except) = tenant_filter(tenants);
        let rows = sqlx::query(
            "SELECT s.id FROM sessions s WHERE s.created_at_ms < ?1 AND NOT EXISTS
               (SELECT 1 FROM branches b WHERE b.session_id = s.id AND b.updated_at_ms >= ?1)
               AND (?3 IS NULL OR s.tenant = ?3)
               AND s.tenant NOT IN (SELECT value FROM json_each(?4))
             ORDER BY s.id LIMIT ?2",
        )
        .bind(before_ms)
        .bind(i64::from(limit))
        .bind(only)
        .bind(serde_json::to_string(&except).expect("strings serialize"))
        .fetch_all(self.conn())
        .await?;
        rows.iter()
            .map(|row| Ok(SessionId::from_bytes(decode::req_uuid(row, "id")?)))
            .collect()
    }

    async fn session_counts(&mut self) -> Result<(u64, u64)> {
        let (sessions, tombstones): (i64, i64) = sqlx::query_as(
            "SELECT (SELECT count(*) FROM sessions), (SELECT count(*) FROM tombstones)",
        )
        .fetch_one(self.conn())
        .await?;
        Ok((
            u64::try_from(sessions).unwrap_or(0),
            u64::try_from(tombstones).unwrap_or(0),
        ))
    }

    async fn node_by_hash(&mut self, session: SessionId, hash: &Hash) -> Result<Option<NodeId>> {
        let row = sqlx::query(
            "SELECT id FROM nodes WHERE session_id = ? AND hash = ?
             LIMIT 1",
        )
        .bind(session.as_bytes().as_slice())
        .bind(hash.0.as_slice())
        .fetch_optional(self.conn())
        .await?;
        Ok(row
            .as_ref()
            .map(|r| decode::node_id(r, "id"))
            .transpose()?
            .flatten())
    }

    async fn nodes_by_hash_range(
        &mut self,
        session: SessionId,
        low: &Hash,
        high: &Hash,
        limit: u32,
    ) -> Result<Vec<NodeId>> {
        let rows = sqlx::query(
            "SELECT id FROM nodes WHERE session_id = ? AND hash >= ? AND hash <= ?
             ORDER BY hash LIMIT ?",
        )
        .bind(session.as_bytes().as_slice())
        .bind(low.0.as_slice())
        .bind(high.0.as_slice())
        .bind(i64::from(limit))
        .fetch_all(self.conn())
        .await?;
        let mut ids = Vec::with_capacity(rows.len());
        for row in &rows {
            ids.extend(decode::node_id(row, "id")?);
        }
        Ok(ids)
    }

    async fn gateway_usage(&mut self, session: SessionId) -> Result<GatewayUsage> {
        let row = sqlx::query(
            "SELECT count(*) AS calls, sum(client_tokens) AS client, sum(forwarded_tokens) AS forwarded,
                    sum(input_tokens) AS input, sum(cache_read_tokens) AS cache_read,
                    sum(cache_write_tokens) AS cache_write, sum(output_tokens) AS output
             FROM gateway_calls WHERE session_id = ?",
        )
        .bind(session.as_bytes().as_slice())
        .fetch_one(self.conn())
        .await?;
        decode::gateway_usage(&row)
    }

    async fn gateway_calls(
        &mut self,
        session: SessionId,
        after: Option<GatewayCallId>,
        limit: u32,
    ) -> Result<Vec<(GatewayCallId, GatewayCall)>> {
        // No cursor is the empty byte string, below every id, so one statement serves every page
        // and walks the primary key (session, id) from where the page starts.
        let sql = format!(
            "SELECT {} FROM gateway_calls WHERE session_id = ?1 AND id > ?2 ORDER BY id LIMIT ?3",
            decode::GATEWAY_CALL_COLUMNS
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(session.as_bytes().as_slice())
            .bind(after.map_or_else(Vec::new, |id| id.as_bytes().to_vec()))
            .bind(i64::from(limit))
            .fetch_all(self.conn())
            .await?;
        rows.iter().map(decode::gateway_call).collect()
    }
}

// ---------------------------------------------------------------- columns

impl Columns for SqliteRow {
    fn bytes(&self, column: &str) -> Result<Option<Vec<u8>>> {
        Ok(self.try_get(column)?)
    }

    fn text(&self, column: &str) -> Result<Option<String>> {
        Ok(self.try_get(column)?)
    }

    fn int(&self, column: &str) -> Result<Option<i64>> {
        Ok(self.try_get(column)?)
    }
}
