//! The SQL of the store's writes on SQLite's writer connection (`WriteTx`), and an import's
//! checked rows as multi-row statements (`AppendTx`).

use std::collections::BTreeMap;

use async_trait::async_trait;
use sqlx::{QueryBuilder, Sqlite};

use super::{
    Conn, Write, blob_ref_once, blob_stored_once, insert_blob_refs, insert_blobs, insert_functions,
    insert_nodes,
};
use crate::domain::{
    BranchName, CompactionId, Hash, NodeId, SessionId, Summary, Tenant, Tombstone,
};
use crate::store::Result;
use crate::store::append::idempotency::CreationKey;
use crate::store::append::planned::BatchRows;
use crate::store::backend::{AppendTx, Deleted, NewEvent, Reads, WriteTx};
use crate::store::form::rows::{budget_json, ledger_json, metadata_json, pack_ids, pack_summaries};
use crate::store::session::compaction::{CompactionPlan, PlanState};

/// Rows a multi-row statement carries at most: 9 columns a node, well under SQLite's limit of
/// bound parameters per statement.
const ROWS_PER_STATEMENT: usize = 500;

fn id(id: NodeId) -> Vec<u8> {
    id.as_bytes().to_vec()
}

#[async_trait]
impl AppendTx for Conn<Write> {
    /// All of it in one multi-statement round trip.
    async fn write_rows(&mut self, rows: &BatchRows) -> Result<()> {
        let mut sql = QueryBuilder::<Sqlite>::new("");
        push_writes(rows, &mut sql);
        sql.build()
            .persistent(false)
            .execute(&mut *self.0.tx)
            .await?;
        Ok(())
    }
}

/// `rows` as multi-row statements, each ending in `; `.
fn push_writes(rows: &BatchRows, sql: &mut QueryBuilder<Sqlite>) {
    for chunk in rows.blobs.chunks(ROWS_PER_STATEMENT) {
        sql.push(insert_blobs!());
        sql.push_values(chunk, |mut row, blob| {
            row.push_bind(blob.hash.0.to_vec())
                .push_bind(blob.size)
                .push_bind(blob.codec)
                .push_bind(blob.data.clone());
        });
        sql.push(concat!(blob_stored_once!(), "; "));
        sql.push(insert_blob_refs!());
        sql.push_values(chunk, |mut row, blob| {
            row.push_bind(blob.session.as_bytes().to_vec())
                .push_bind(blob.hash.0.to_vec());
        });
        sql.push(concat!(blob_ref_once!(), "; "));
    }
    for chunk in rows.nodes.chunks(ROWS_PER_STATEMENT) {
        sql.push(insert_nodes!());
        sql.push_values(chunk, |mut row, node| {
            let n = &node.insert;
            row.push_bind(id(n.id))
                .push_bind(n.session.as_bytes().to_vec())
                .push_bind(n.parent.map(id))
                .push_bind(n.function.map(id))
                .push_bind(node.kind)
                .push_bind(n.created_at_ms)
                .push_bind(n.hash.0.to_vec())
                .push_bind(node.body.clone())
                .push_bind(node.body_z.clone());
        });
        sql.push("; ");
    }
    for chunk in rows.opened.chunks(ROWS_PER_STATEMENT) {
        sql.push(insert_functions!());
        sql.push_values(chunk, |mut row, (function, session)| {
            row.push_bind(id(*function))
                .push_bind(session.as_bytes().to_vec());
        });
        sql.push("; ");
    }
    for (_, result, function) in &rows.closes {
        // Another branch may have closed it already; the first result is the record.
        sql.push("UPDATE functions SET closed_by = ")
            .push_bind(id(*result))
            .push(" WHERE id = ")
            .push_bind(id(*function))
            .push(" AND closed_by IS NULL; ");
    }
    let branch_heads: Vec<_> = rows.branch_heads.iter().collect();
    for chunk in branch_heads.chunks(ROWS_PER_STATEMENT) {
        sql.push("UPDATE branches SET head_id = v.column3, updated_at_ms = v.column4 FROM (");
        sql.push_values(chunk, |mut row, ((session, name), (head, at))| {
            row.push_bind(session.as_bytes().to_vec())
                .push_bind(name.as_str().to_owned())
                .push_bind(id(*head))
                .push_bind(*at);
        });
        sql.push(") AS v WHERE branches.session_id = v.column1 AND branches.name = v.column2; ");
    }
    let function_heads: Vec<_> = rows.function_heads.iter().collect();
    for chunk in function_heads.chunks(ROWS_PER_STATEMENT) {
        sql.push("UPDATE functions SET head_id = v.column2 FROM (");
        sql.push_values(chunk, |mut row, ((_, function), head)| {
            row.push_bind(id(*function)).push_bind(id(**head));
        });
        sql.push(") AS v WHERE functions.id = v.column1; ");
    }
    for chunk in rows.pins.chunks(ROWS_PER_STATEMENT) {
        sql.push("INSERT INTO pins (session_id, node_id, pinned, created_at_ms) ");
        sql.push_values(chunk, |mut row, (session, node, at)| {
            row.push_bind(session.as_bytes().to_vec())
                .push_bind(id(*node))
                .push_bind(1_i64)
                .push_bind(*at);
        });
        sql.push("; ");
    }
    for chunk in rows.idempotency.chunks(ROWS_PER_STATEMENT) {
        sql.push(
            "INSERT INTO idempotency (session_id, key, request_hash, response, created_at_ms) ",
        );
        sql.push_values(chunk, |mut row, record| {
            row.push_bind(record.session.as_bytes().to_vec())
                .push_bind(record.key.clone())
                .push_bind(record.request_hash.0.to_vec())
                .push_bind(record.response.clone())
                .push_bind(record.created_at_ms);
        });
        sql.push("; ");
    }
}

#[async_trait]
impl WriteTx for Conn<Write> {
    async fn insert_session(
        &mut self,
        id: SessionId,
        tenant: &Tenant,
        now: i64,
        metadata: &BTreeMap<String, String>,
        // `session_keys` is indexed by session here: a deletion finds the key by it.
        _creation_key: Option<&str>,
    ) -> Result<()> {
        sqlx::query(
            "INSERT INTO sessions (id, tenant, created_at_ms, metadata) VALUES (?, ?, ?, ?)",
        )
        .bind(id.as_bytes().as_slice())
        .bind(tenant.as_str())
        .bind(now)
        .bind(metadata_json(metadata))
        .execute(&mut *self.0.tx)
        .await?;
        sqlx::query("INSERT INTO branches (session_id, name, updated_at_ms) VALUES (?, ?, ?)")
            .bind(id.as_bytes().as_slice())
            .bind(BranchName::main().as_str())
            .bind(now)
            .execute(&mut *self.0.tx)
            .await?;
        Ok(())
    }

    async fn insert_session_key(
        &mut self,
        tenant: &Tenant,
        key: &CreationKey,
        session: SessionId,
        now: i64,
    ) -> Result<bool> {
        let inserted = sqlx::query(
            "INSERT INTO session_keys (tenant, key, request_hash, session_id, created_at_ms)
             VALUES (?, ?, ?, ?, ?) ON CONFLICT (tenant, key) DO NOTHING",
        )
        .bind(tenant.as_str())
        .bind(&key.key)
        .bind(key.request.0.as_slice())
        .bind(session.as_bytes().as_slice())
        .bind(now)
        .execute(&mut *self.0.tx)
        .await?;
        Ok(inserted.rows_affected() == 1)
    }

    async fn insert_gateway_call(
        &mut self,
        session: SessionId,
        call: &crate::domain::GatewayCall,
    ) -> Result<()> {
        let n = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        sqlx::query(
            "INSERT INTO gateway_calls (session_id, id, at_ms, api, model, client_tokens,
                 forwarded_tokens, input_tokens, cache_read_tokens, cache_write_tokens,
                 output_tokens, kept_tokens, change)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(session.as_bytes().as_slice())
        .bind(uuid::Uuid::now_v7().as_bytes().as_slice().to_vec())
        .bind(call.at_ms)
        .bind(call.api.as_str())
        .bind(call.model.as_str())
        .bind(n(call.client_tokens))
        .bind(n(call.forwarded_tokens))
        .bind(n(call.usage.input))
        .bind(n(call.usage.cache_read))
        .bind(n(call.usage.cache_write))
        .bind(n(call.usage.output))
        .bind(n(call.kept_tokens))
        .bind(call.change.map(|c| c.as_text()))
        .execute(&mut *self.0.tx)
        .await?;
        Ok(())
    }

    async fn insert_branch(
        &mut self,
        session: SessionId,
        name: &BranchName,
        head: Option<NodeId>,
        now: i64,
    ) -> Result<bool> {
        let inserted = sqlx::query(
            "INSERT INTO branches (session_id, name, head_id, updated_at_ms) VALUES (?, ?, ?, ?)
             ON CONFLICT (session_id, name) DO NOTHING",
        )
        .bind(session.as_bytes().as_slice())
        .bind(name.as_str())
        .bind(head.map(id))
        .bind(now)
        .execute(&mut *self.0.tx)
        .await?;
        Ok(inserted.rows_affected() == 1)
    }

    async fn set_branch_head(
        &mut self,
        session: SessionId,
        name: &BranchName,
        head: Option<NodeId>,
        now: i64,
    ) -> Result<()> {
        sqlx::query(
            "UPDATE branches SET head_id = ?, updated_at_ms = ? WHERE session_id = ? AND name = ?",
        )
        .bind(head.map(id))
        .bind(now)
        .bind(session.as_bytes().as_slice())
        .bind(name.as_str())
        .execute(&mut *self.0.tx)
        .await?;
        Ok(())
    }

    async fn delete_branch(&mut self, session: SessionId, name: &BranchName) -> Result<bool> {
        let done = sqlx::query("DELETE FROM branches WHERE session_id = ? AND name = ?")
            .bind(session.as_bytes().as_slice())
            .bind(name.as_str())
            .execute(&mut *self.0.tx)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn insert_pin(
        &mut self,
        session: SessionId,
        node: NodeId,
        pinned: bool,
        now: i64,
    ) -> Result<()> {
        sqlx::query(
            "INSERT INTO pins (session_id, node_id, pinned, created_at_ms) VALUES (?, ?, ?, ?)",
        )
        .bind(session.as_bytes().as_slice())
        .bind(node.as_bytes().as_slice())
        .bind(i64::from(pinned))
        .bind(now)
        .execute(&mut *self.0.tx)
        .await?;
        Ok(())
    }

    async fn insert_plan(&mut self, plan: &CompactionPlan) -> Result<()> {
        sqlx::query(
            "INSERT INTO compactions (id, session_id, branch, base_head_id, prior_summary_id,
                 covers, budget, tokenizer, max_tool_result_chars, retain_turns, instructions,
                 tokens_before, state, created_at_ms, kind, rolls_over, range_from_id,
                 range_to_id, ledger)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(plan.id.as_bytes().as_slice())
        .bind(plan.session.as_bytes().as_slice())
        .bind(plan.branch.as_str())
        .bind(plan.base_head.as_bytes().as_slice())
        .bind(plan.rolls_over.first().map(|p| p.as_bytes().to_vec()))
        .bind(pack_ids(&plan.covers))
        .bind(budget_json(&plan.budget))
        .bind(&plan.tokenizer)
        .bind(i64::from(plan.max_tool_result_chars))
        .bind(i64::from(plan.retain_turns))
        .bind(&plan.instructions)
        .bind(i64::from(plan.tokens_before))
        .bind(plan.state.as_str())
        .bind(plan.created_at_ms)
        .bind(plan.kind.as_str())
        .bind(pack_summaries(&plan.rolls_over))
        .bind(plan.range.map(|r| id(r.0)))
        .bind(plan.range.map(|r| id(r.1)))
        .bind(ledger_json(&plan.ledger))
        .execute(&mut *self.0.tx)
        .await?;
        Ok(())
    }

    async fn set_plan_state(
        &mut self,
        _session: SessionId,
        plan: CompactionId,
        state: PlanState,
    ) -> Result<()> {
        sqlx::query("UPDATE compactions SET state = ? WHERE id = ?")
            .bind(state.as_str())
            .bind(plan.as_bytes().as_slice())
            .execute(&mut *self.0.tx)
            .await?;
        Ok(())
    }

    async fn insert_summary(&mut self, session: SessionId, summary: &Summary) -> Result<()> {
        sqlx::query(
            "INSERT INTO summaries (id, session_id, compaction_id, prior_id, covers, text, model,
                 base_head_id, tokens_before, tokens_after, created_at_ms, kind, rolls_over,
                 range_from_id, range_to_id, ledger)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(summary.id.as_bytes().as_slice())
        .bind(session.as_bytes().as_slice())
        .bind(summary.compaction_id.as_bytes().as_slice())
        .bind(summary.rolls_over.first().map(|p| p.as_bytes().to_vec()))
        .bind(pack_ids(&summary.covers))
        .bind(&summary.text)
        .bind(&summary.model)
        .bind(summary.base_head.as_bytes().as_slice())
        .bind(i64::from(summary.tokens_before))
        .bind(i64::from(summary.tokens_after))
        .bind(summary.created_at_ms)
        .bind(summary.kind.as_str())
        .bind(pack_summaries(&summary.rolls_over))
        .bind(summary.range.map(|r| id(r.0)))
        .bind(summary.range.map(|r| id(r.1)))
        .bind(summary.ledger.as_deref().map(ledger_json))
        .execute(&mut *self.0.tx)
        .await?;
        Ok(())
    }

    async fn count_compaction(&mut self, session: SessionId) -> Result<()> {
        sqlx::query("UPDATE sessions SET compaction_count = compaction_count + 1 WHERE id = ?")
            .bind(session.as_bytes().as_slice())
            .execute(&mut *self.0.tx)
            .await?;
        Ok(())
    }

    async fn insert_event(&mut self, event: &NewEvent<'_>) -> Result<()> {
        let plan = event.plan;
        sqlx::query(
            "INSERT INTO compaction_events (session_id, compaction_id, branch, kind, reason,
                 base_head_id, tokens_before, tokens_after, summary_id, message, created_at_ms)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(plan.session.as_bytes().as_slice())
        .bind(plan.id.as_bytes().as_slice())
        .bind(plan.branch.as_str())
        .bind(event.kind.as_str())
        .bind(event.reason.map(|r| r.as_str()))
        .bind(plan.base_head.as_bytes().as_slice())
        .bind(i64::from(event.tokens_before))
        .bind(i64::from(event.tokens_after))
        .bind(event.summary.map(|s| s.as_bytes().to_vec()))
        .bind(event.message)
        .bind(event.at)
        .execute(&mut *self.0.tx)
        .await?;
        Ok(())
    }

    async fn lock_session(&mut self, session: SessionId) -> Result<Option<Tenant>> {
        // The store's write lock, held by this transaction, is the lock.
        self.session_tenant(session).await
    }

    async fn delete_session(&mut self, mut tombstone: Tombstone) -> Result<Deleted> {
        let sid = tombstone.session.as_bytes().to_vec();
        let (nodes, branches, summaries): (i64, i64, i64) = sqlx::query_as(
            "SELECT (SELECT count(*) FROM nodes WHERE session_id = ?1),
                    (SELECT count(*) FROM branches WHERE session_id = ?1),
                    (SELECT count(*) FROM summaries WHERE session_id = ?1)",
        )
        .bind(&sid)
        .fetch_one(&mut *self.0.tx)
        .await?;
        // Blobs only this session refers to go with it (the `blob_refs_release` trigger).
        let (blobs, blob_bytes): (i64, i64) = sqlx::query_as(
            "SELECT count(*), coalesce(sum(b.size), 0) FROM blob_refs r
             JOIN blobs b ON b.hash = r.hash WHERE r.session_id = ? AND b.refs <= 1",
        )
        .bind(&sid)
        .fetch_one(&mut *self.0.tx)
        .await?;
        tombstone.nodes = u64::try_from(nodes).unwrap_or(0);
        tombstone.branches = u32::try_from(branches).unwrap_or(u32::MAX);
        tombstone.summaries = u32::try_from(summaries).unwrap_or(u32::MAX);
        // Children before parents, though this connection does not check foreign keys: on a
        // deletion SQLite would look for each removed node's children by a full scan of the
        // nodes, which have no index by parent.
        for statement in [
            "INSERT INTO tombstone_plans (compaction_id, session_id)
             SELECT id, session_id FROM compactions WHERE session_id = ?1 AND state = 'open'",
            // The server summarizer's outputs of this session's summaries are its content too.
            "DELETE FROM summarizer_outputs
             WHERE text IN (SELECT text FROM summaries WHERE session_id = ?1)",
            "DELETE FROM summaries WHERE session_id = ?1",
            "DELETE FROM compaction_events WHERE session_id = ?1",
            "DELETE FROM compactions WHERE session_id = ?1",
            "DELETE FROM pins WHERE session_id = ?1",
            "DELETE FROM gateway_calls WHERE session_id = ?1",
            "DELETE FROM idempotency WHERE session_id = ?1",
            "DELETE FROM branches WHERE session_id = ?1",
            "DELETE FROM functions WHERE id IN (SELECT id FROM nodes WHERE session_id = ?1)",
            "DELETE FROM session_keys WHERE session_id = ?1",
            "DELETE FROM nodes WHERE session_id = ?1",
            "DELETE FROM blob_refs WHERE session_id = ?1",
            "DELETE FROM sessions WHERE id = ?1",
        ] {
            sqlx::query(statement)
                .bind(&sid)
                .execute(&mut *self.0.tx)
                .await?;
        }
        sqlx::query(
            "INSERT INTO tombstones (session_id, tenant, deleted_by, deleted_at_ms, nodes,
             branches, summaries) VALUES (?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(&sid)
        .bind(tombstone.tenant.as_str())
        .bind(&tombstone.deleted_by)
        .bind(tombstone.deleted_at_ms)
        .bind(nodes)
        .bind(branches)
        .bind(summaries)
        .execute(&mut *self.0.tx)
        .await?;
        Ok(Deleted {
            tombstone,
            blobs: u64::try_from(blobs).unwrap_or(0),
            blob_bytes: u64::try_from(blob_bytes).unwrap_or(0),
        })
    }

    async fn record_summarizer_source(
        &mut self,
        _session: SessionId,
        _source: &Hash,
    ) -> Result<bool> {
        Ok(false)
    }

    async fn save_summarizer_output(&mut self, source: &Hash, text: &str, now: i64) -> Result<()> {
        sqlx::query(
            "INSERT INTO summarizer_outputs (source_key, text, created_at_ms) VALUES (?, ?, ?)
             ON CONFLICT (source_key) DO UPDATE SET text = excluded.text",
        )
        .bind(source.0.as_slice())
        .bind(text)
        .bind(now)
        .execute(&mut *self.0.tx)
        .await?;
        Ok(())
    }

    async fn commit(self: Box<Self>) -> Result<()> {
        Ok(self.0.tx.commit().await?)
    }

    async fn rollback(self: Box<Self>) -> Result<()> {
        Ok(self.0.tx.rollback().await?)
    }
}
