//! The SQL of the store's reads on PostgreSQL (`Lookups`, `Reads`), for a reader's connection,
//! a write's transaction and the committer's; in the latter two, the one-row lookups a
//! decision rests on lock their row.

use async_trait::async_trait;
use sqlx::Row;
use sqlx::postgres::PgRow;

use super::{Conn, Connection};
use crate::domain::{
    Branch, BranchName, CompactionEvent, CompactionId, GatewayCall, GatewayCallId, GatewayUsage,
    Hash, NodeId, Reason, SessionFilter, SessionId, Summary, Tenant, Tombstone,
};
use crate::store::append::request::AppendOutcome;
use crate::store::backend::{
    BranchStart, Lookups, Reads, SessionRow, StoredBlob, metadata_filter, tenant_filter,
};
use crate::store::form::rows::{NodeRow, uuid_from};
use crate::store::session::compaction::CompactionPlan;
use crate::store::session::lifecycle::Tenants;
use crate::store::sql::decode::{self, Columns, SUMMARY_COLUMNS, TOMBSTONE_COLUMNS};
use crate::store::{Error, Result};

const NODE_COLUMNS: &str =
    "n.id, n.parent_id, n.function_id, n.created_at_ms, n.hash, n.body, n.body_z";

/// `sql`, locking the row it reads when `lock`.
fn locking(sql: &'static str, lock: bool) -> sqlx::AssertSqlSafe<String> {
    sqlx::AssertSqlSafe(if lock {
        format!("{sql} FOR UPDATE")
    } else {
        sql.to_owned()
    })
}

#[async_trait]
impl<C: Connection> Lookups for Conn<C> {
    async fn session_exists(&mut self, session: SessionId) -> Result<bool> {
        // A write that checks its session locks it against nothing but a delete: a shared lock.
        let sql = if self.locks() {
            "SELECT 1 FROM sessions WHERE id = $1 FOR SHARE"
        } else {
            "SELECT 1 FROM sessions WHERE id = $1"
        };
        Ok(sqlx::query(sql)
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
        let sql = locking(
            "SELECT head_id FROM branches WHERE session_id = $1 AND name = $2",
            self.locks(),
        );
        let row = sqlx::query(sql)
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
        let sql = locking(
            "SELECT head_id, closed_by FROM functions WHERE session_id = $1 AND id = $2",
            self.locks(),
        );
        let row = sqlx::query(sql)
            .bind(session.as_bytes().as_slice())
            .bind(function.as_bytes().as_slice())
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
        let row = sqlx::query(
            "SELECT n.id, n.parent_id, n.function_id, n.created_at_ms, n.hash, n.body, n.body_z
             FROM nodes n WHERE n.session_id = $1 AND n.id = $2",
        )
        .bind(session.as_bytes().as_slice())
        .bind(id.as_bytes().as_slice())
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
            "SELECT request_hash, response FROM idempotency WHERE session_id = $1 AND key = $2",
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
        let tenant: Option<String> =
            sqlx::query_scalar("SELECT tenant FROM sessions WHERE id = $1")
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
            "SELECT request_hash, session_id FROM session_keys WHERE tenant = $1 AND key = $2",
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
            "SELECT id, created_at_ms, metadata, compaction_count FROM sessions WHERE id = $1",
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
        let rows = sqlx::query(
            "SELECT id, created_at_ms, metadata, compaction_count FROM sessions
             WHERE tenant = $1 AND ($2::bytea IS NULL OR id < $2)
               AND ($4::bytea IS NULL OR id BETWEEN $4 AND $5)
               AND ($6::text IS NULL OR metadata::jsonb @> $6::jsonb)
             ORDER BY id DESC LIMIT $3",
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
        let count: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM nodes WHERE session_id = $1")
            .bind(session.as_bytes().as_slice())
            .fetch_one(self.conn())
            .await?;
        Ok(u64::try_from(count).unwrap_or(0))
    }

    async fn branches(&mut self, session: SessionId) -> Result<Vec<Branch>> {
        let rows = sqlx::query(
            "SELECT b.name, b.head_id, b.updated_at_ms, n.hash FROM branches b
             LEFT JOIN nodes n ON n.session_id = b.session_id AND n.id = b.head_id
             WHERE b.session_id = $1 ORDER BY b.name COLLATE \"C\"",
        )
        .bind(session.as_bytes().as_slice())
        .fetch_all(self.conn())
        .await?;
        rows.iter().map(decode::branch).collect()
    }

    async fn pin_events(&mut self, session: SessionId) -> Result<Vec<(NodeId, bool)>> {
        let rows =
            sqlx::query("SELECT node_id, pinned FROM pins WHERE session_id = $1 ORDER BY seq")
                .bind(session.as_bytes().as_slice())
                .fetch_all(self.conn())
                .await?;
        rows.iter().map(decode::pin).collect()
    }

    async fn summaries(&mut self, session: SessionId) -> Result<Vec<Summary>> {
        let sql = format!(
            "SELECT {SUMMARY_COLUMNS} FROM summaries WHERE session_id = $1 \
             ORDER BY created_at_ms, id"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(session.as_bytes().as_slice())
            .fetch_all(self.conn())
            .await?;
        rows.iter().map(decode::summary).collect()
    }

    /// One round trip, two when the session has summaries: the branch, the session's pin
    /// events (as arrays) and whether it has summaries, then those.
    async fn branch_start(&mut self, session: SessionId, name: &BranchName) -> Result<BranchStart> {
        let row = sqlx::query(
            "SELECT b.name AS branch, b.head_id,
                 (SELECT array_agg(pn.node_id ORDER BY pn.seq) FROM pins pn
                     WHERE pn.session_id = $1) AS pin_nodes,
                 (SELECT array_agg(ps.pinned ORDER BY ps.seq) FROM pins ps
                     WHERE ps.session_id = $1) AS pin_states,
                 EXISTS (SELECT 1 FROM summaries m WHERE m.session_id = $1) AS summarized
             FROM sessions s
                 LEFT JOIN branches b ON b.session_id = s.id AND b.name = $2
             WHERE s.id = $1",
        )
        .bind(session.as_bytes().as_slice())
        .bind(name.as_str())
        .fetch_optional(self.conn())
        .await?;
        let Some(row) = row else {
            return Ok(BranchStart::NoSession);
        };
        if row.try_get::<Option<String>, _>("branch")?.is_none() {
            return Ok(BranchStart::NoBranch);
        }
        let Some(head) = decode::node_id(&row, "head_id")? else {
            return Ok(BranchStart::Empty);
        };
        let nodes: Vec<Vec<u8>> = row
            .try_get::<Option<_>, _>("pin_nodes")?
            .unwrap_or_default();
        let states: Vec<i64> = row
            .try_get::<Option<_>, _>("pin_states")?
            .unwrap_or_default();
        let pin_events = nodes
            .into_iter()
            .zip(states)
            .map(|(node, state)| {
                let node = uuid_from(Some(node), "pins.node_id")?.unwrap_or_default();
                Ok((NodeId::from_bytes(node), state != 0))
            })
            .collect::<Result<_>>()?;
        let summaries = if row.try_get::<bool, _>("summarized")? {
            self.summaries(session).await?
        } else {
            Vec::new()
        };
        Ok(BranchStart::At {
            head,
            summaries,
            pin_events,
        })
    }

    async fn parent_of(&mut self, session: SessionId, id: NodeId) -> Result<Option<NodeId>> {
        let row = sqlx::query("SELECT parent_id FROM nodes WHERE session_id = $1 AND id = $2")
            .bind(session.as_bytes().as_slice())
            .bind(id.as_bytes().as_slice())
            .fetch_one(self.conn())
            .await?;
        decode::node_id(&row, "parent_id")
    }

    async fn path_to(&mut self, session: SessionId, head: NodeId) -> Result<Vec<NodeId>> {
        let rows = sqlx::query(
            "WITH RECURSIVE walk(id, depth) AS (
                 SELECT $2::bytea, 0
                 UNION ALL
                 SELECT n.parent_id, walk.depth + 1 FROM walk
                 JOIN nodes n ON n.session_id = $1 AND n.id = walk.id
                 WHERE n.parent_id IS NOT NULL
             )
             SELECT id FROM walk ORDER BY depth DESC",
        )
        .bind(session.as_bytes().as_slice())
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
        session: SessionId,
        start: NodeId,
        limit: Option<u32>,
    ) -> Result<Vec<NodeRow>> {
        let sql = format!(
            "WITH RECURSIVE walk(id, depth) AS (
                 SELECT $2::bytea, 0::bigint
                 UNION ALL
                 SELECT n.parent_id, walk.depth + 1 FROM walk
                 JOIN nodes n ON n.session_id = $1 AND n.id = walk.id
                 WHERE n.parent_id IS NOT NULL AND walk.depth + 1 < $3
             )
             SELECT {NODE_COLUMNS} FROM walk JOIN nodes n ON n.session_id = $1 AND n.id = walk.id
             ORDER BY walk.depth DESC"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(session.as_bytes().as_slice())
            .bind(start.as_bytes().as_slice())
            .bind(limit.map_or(i64::MAX, i64::from))
            .fetch_all(self.conn())
            .await?;
        rows.iter().map(decode::node).collect()
    }

    async fn chain(
        &mut self,
        session: SessionId,
        head: NodeId,
        function: NodeId,
    ) -> Result<Vec<NodeRow>> {
        let sql = format!(
            "WITH RECURSIVE walk(id, depth) AS (
                 SELECT $2::bytea, 0
                 UNION ALL
                 SELECT p.id, walk.depth + 1 FROM walk
                 JOIN nodes c ON c.session_id = $1 AND c.id = walk.id
                 JOIN nodes p ON p.session_id = $1 AND p.id = c.parent_id
                 WHERE p.function_id = $3
             )
             SELECT {NODE_COLUMNS} FROM walk JOIN nodes n ON n.session_id = $1 AND n.id = walk.id
             ORDER BY walk.depth DESC"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(session.as_bytes().as_slice())
            .bind(head.as_bytes().as_slice())
            .bind(function.as_bytes().as_slice())
            .fetch_all(self.conn())
            .await?;
        rows.iter().map(decode::node).collect()
    }

    async fn nodes(&mut self, session: SessionId, ids: &[NodeId]) -> Result<Vec<NodeRow>> {
        let ids: Vec<Vec<u8>> = ids.iter().map(|id| id.as_bytes().to_vec()).collect();
        let sql = format!(
            "SELECT {NODE_COLUMNS} FROM nodes n WHERE n.session_id = $1 AND n.id = ANY($2)"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
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
        rows.iter()
            .map(|row| {
                Ok(StoredBlob {
                    hash: decode::hash(row, "hash")?,
                    size: row.try_get("size")?,
                    codec: row.try_get("codec")?,
                    data: row.try_get("data")?,
                })
            })
            .collect()
    }

    async fn compaction_owner(&mut self, id: CompactionId) -> Result<Option<(SessionId, Tenant)>> {
        let row = sqlx::query("SELECT session_id, tenant FROM compaction_owners WHERE id = $1")
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
        // A write that commits or closes a plan locks it: two replicas committing one plan
        // take turns, and the second sees it applied.
        let sql = locking(
            "SELECT session_id, branch, base_head_id, kind, rolls_over, covers, range_from_id,
                    range_to_id, ledger, budget, tokenizer, max_tool_result_chars, retain_turns,
                    instructions, tokens_before, state, created_at_ms
             FROM compactions WHERE session_id = $1 AND id = $2",
            self.locks(),
        );
        let row = sqlx::query(sql)
            .bind(session.as_bytes().as_slice())
            .bind(id.as_bytes().as_slice())
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
             FROM compaction_events WHERE session_id = $1 AND ($2::text IS NULL OR branch = $2)
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
             WHERE session_id = $1 AND branch = $2 AND kind IN ('committed', 'rejected')
             ORDER BY id DESC LIMIT $3",
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
        let row = sqlx::query("SELECT text FROM summarizer_outputs WHERE source_key = $1")
            .bind(source.0.as_slice())
            .fetch_optional(self.conn())
            .await?;
        Ok(row.map(|r| r.try_get("text")).transpose()?)
    }

    async fn tombstone(&mut self, session: SessionId) -> Result<Option<Tombstone>> {
        let sql = format!("SELECT {TOMBSTONE_COLUMNS} FROM tombstones t WHERE t.session_id = $1");
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(session.as_bytes().as_slice())
            .fetch_optional(self.conn())
            .await?;
        row.as_ref().map(decode::tombstone).transpose()
    }

    async fn plan_tombstone(&mut self, id: CompactionId) -> Result<Option<Tombstone>> {
        // Two lookups, each by its table's own key: the plans are distributed by plan id, the
        // tombstones by session, and Citus refuses a join between them.
        let session: Option<Vec<u8>> =
            sqlx::query_scalar("SELECT session_id FROM tombstone_plans WHERE compaction_id = $1")
                .bind(id.as_bytes().as_slice())
                .fetch_optional(self.conn())
                .await?;
        match uuid_from(session, "session_id")? {
            Some(session) => self.tombstone(SessionId::from_bytes(session)).await,
            None => Ok(None),
        }
    }

    async fn idle_sessions(
        &mut self,
        before_ms: i64,
        limit: u32,
        tenants: Tenants<'_>,
    ) -> Result<Vec<SessionId>> {
        let (only, except) = tenant_filter(tenants);
        let rows = sqlx::query(
            "SELECT s.id FROM sessions s WHERE s.created_at_ms < $1 AND NOT EXISTS
               (SELECT 1 FROM branches b WHERE b.session_id = s.id AND b.updated_at_ms >= $1)
               AND ($3::text IS NULL OR s.tenant = $3)
               AND NOT (s.tenant = ANY($4::text[]))
             ORDER BY s.id LIMIT $2",
        )
        .bind(before_ms)
        .bind(i64::from(limit))
        .bind(only)
        .bind(except)
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
            "SELECT id FROM nodes WHERE session_id = $1 AND hash = $2
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
            "SELECT id FROM nodes WHERE session_id = $1 AND hash >= $2 AND hash <= $3
             ORDER BY hash LIMIT $4",
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
            // PostgreSQL sums BIGINT as NUMERIC: cast back.
            "SELECT count(*) AS calls, sum(client_tokens)::BIGINT AS client,
                    sum(forwarded_tokens)::BIGINT AS forwarded, sum(input_tokens)::BIGINT AS input,
                    sum(cache_read_tokens)::BIGINT AS cache_read,
                    sum(cache_write_tokens)::BIGINT AS cache_write,
                    sum(output_tokens)::BIGINT AS output
             FROM gateway_calls WHERE session_id = $1",
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
            "SELECT {} FROM gateway_calls WHERE session_id = $1 AND id > $2 ORDER BY id LIMIT $3",
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

impl Columns for PgRow {
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
