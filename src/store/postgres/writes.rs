//! The SQL of the store's writes on PostgreSQL: a batch's rows as one multi-row statement per
//! table (`AppendTx`, for the committer and an import alike: a round trip costs more than
//! parsing here), and the other writes (`WriteTx`).

use std::collections::BTreeMap;

use async_trait::async_trait;
use sqlx::{Postgres, QueryBuilder};

use super::{Conn, Connection, Write};
use crate::domain::{
    BranchName, CompactionId, Hash, NodeId, SessionId, Summary, Tenant, Tombstone,
};
use crate::store::Result;
use crate::store::append::idempotency::CreationKey;
use crate::store::append::planned::BatchRows;
use crate::store::backend::{AppendTx, Deleted, NewEvent, WriteTx};
use crate::store::form::rows::{budget_json, ledger_json, metadata_json, pack_ids, pack_summaries};
use crate::store::session::compaction::{CompactionPlan, PlanState};

/// Rows a statement carries at most: 9 binds a node, well under PostgreSQL's 65535.
const ROWS_PER_STATEMENT: usize = 1000;

fn id(id: NodeId) -> Vec<u8> {
    id.as_bytes().to_vec()
}

fn sid(session: SessionId) -> Vec<u8> {
    session.as_bytes().to_vec()
}

async fn run<C: Connection>(conn: &mut Conn<C>, mut sql: QueryBuilder<Postgres>) -> Result<()> {
    sql.build().persistent(false).execute(conn.conn()).await?;
    Ok(())
}

#[async_trait]
impl<C: Connection> AppendTx for Conn<C> {
    async fn write_rows(&mut self, rows: &BatchRows) -> Result<()> {
        for chunk in rows.blobs.chunks(ROWS_PER_STATEMENT) {
            let mut sql =
                QueryBuilder::new("INSERT INTO blobs (session_id, hash, size, codec, data) ");
            sql.push_values(chunk, |mut row, blob| {
                row.push_bind(sid(blob.session))
                    .push_bind(blob.hash.0.to_vec())
                    .push_bind(blob.size)
                    .push_bind(blob.codec)
                    .push_bind(blob.data.clone());
            });
            sql.push(" ON CONFLICT (session_id, hash) DO NOTHING");
            run(self, sql).await?;
        }
        for chunk in rows.nodes.chunks(ROWS_PER_STATEMENT) {
            let mut sql = QueryBuilder::new(
                "INSERT INTO nodes (session_id, id, parent_id, function_id, kind, created_at_ms, \
                 hash, body, body_z) ",
            );
            sql.push_values(chunk, |mut row, node| {
                let n = &node.insert;
                row.push_bind(sid(n.session))
                    .push_bind(id(n.id))
                    .push_bind(n.parent.map(id))
                    .push_bind(n.function.map(id))
                    .push_bind(node.kind)
                    .push_bind(n.created_at_ms)
                    .push_bind(n.hash.0.to_vec())
                    .push_bind(node.body.clone())
                    .push_bind(node.body_z.clone());
            });
            run(self, sql).await?;
        }
        for chunk in rows.opened.chunks(ROWS_PER_STATEMENT) {
            let mut sql = QueryBuilder::new("INSERT INTO functions (session_id, id) ");
            sql.push_values(chunk, |mut row, (function, session)| {
                row.push_bind(sid(*session)).push_bind(id(*function));
            });
            run(self, sql).await?;
        }
        for (session, result, function) in &rows.closes {
            // Another branch may have closed it already; the first result is the record.
            sqlx::query(
                "UPDATE functions SET closed_by = $1
                 WHERE session_id = $2 AND id = $3 AND closed_by IS NULL",
            )
            .bind(id(*result))
            .bind(sid(*session))
            .bind(id(*function))
            .execute(self.conn())
            .await?;
        }
        self.update_heads(rows).await?;
        for chunk in rows.pins.chunks(ROWS_PER_STATEMENT) {
            let mut sql =
                QueryBuilder::new("INSERT INTO pins (session_id, node_id, pinned, created_at_ms) ");
            sql.push_values(chunk, |mut row, (session, node, at)| {
                row.push_bind(sid(*session))
                    .push_bind(id(*node))
                    .push_bind(1_i64)
                    .push_bind(*at);
            });
            run(self, sql).await?;
        }
        for chunk in rows.idempotency.chunks(ROWS_PER_STATEMENT) {
            let mut sql = QueryBuilder::new(
                "INSERT INTO idempotency (session_id, key, request_hash, response, created_at_ms) ",
            );
            sql.push_values(chunk, |mut row, record| {
                row.push_bind(sid(record.session))
                    .push_bind(record.key.clone())
                    .push_bind(record.request_hash.0.to_vec())
                    .push_bind(record.response.clone())
                    .push_bind(record.created_at_ms);
            });
            run(self, sql).await?;
        }
        Ok(())
    }
}

impl<C: Connection> Conn<C> {
    /// Moves the batch's branch and function heads (their rows are locked already).
    async fn update_heads(&mut self, rows: &BatchRows) -> Result<()> {
        if self.routed() {
            // One statement per head, its session a constant: routed to one shard.
            for ((session, name), (head, at)) in &rows.branch_heads {
                sqlx::query(
                    "UPDATE branches SET head_id = $1, updated_at_ms = $2
                     WHERE session_id = $3 AND name = $4",
                )
                .bind(id(*head))
                .bind(*at)
                .bind(sid(*session))
                .bind(name.as_str())
                .execute(self.conn())
                .await?;
            }
            for ((session, function), head) in &rows.function_heads {
                sqlx::query("UPDATE functions SET head_id = $1 WHERE session_id = $2 AND id = $3")
                    .bind(id(*head))
                    .bind(sid(*session))
                    .bind(id(*function))
                    .execute(self.conn())
                    .await?;
            }
            return Ok(());
        }
        let heads: Vec<_> = rows.branch_heads.iter().collect();
        for chunk in heads.chunks(ROWS_PER_STATEMENT) {
            let mut sql = QueryBuilder::new(
                "UPDATE branches SET head_id = v.head_id, updated_at_ms = v.at FROM (",
            );
            sql.push_values(chunk, |mut row, ((session, name), (head, at))| {
                row.push_bind(sid(*session))
                    .push_bind(name.as_str().to_owned())
                    .push_bind(id(*head))
                    .push_bind(*at);
            });
            sql.push(
                ") AS v (session_id, name, head_id, at) \
                 WHERE branches.session_id = v.session_id AND branches.name = v.name",
            );
            run(self, sql).await?;
        }
        let function_heads: Vec<_> = rows.function_heads.iter().collect();
        for chunk in function_heads.chunks(ROWS_PER_STATEMENT) {
            let mut sql = QueryBuilder::new("UPDATE functions SET head_id = v.head_id FROM (");
            sql.push_values(chunk, |mut row, ((session, function), head)| {
                row.push_bind(sid(*session))
                    .push_bind(id(*function))
                    .push_bind(id(**head));
            });
            sql.push(
                ") AS v (session_id, id, head_id) \
                 WHERE functions.session_id = v.session_id AND functions.id = v.id",
            );
            run(self, sql).await?;
        }
        Ok(())
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
        creation_key: Option<&str>,
    ) -> Result<()> {
        sqlx::query(
            "INSERT INTO sessions (id, tenant, created_at_ms, metadata, create_key)
             VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(sid(id))
        .bind(tenant.as_str())
        .bind(now)
        .bind(metadata_json(metadata))
        .bind(creation_key)
        .execute(&mut *self.0.tx)
        .await?;
        sqlx::query("INSERT INTO branches (session_id, name, updated_at_ms) VALUES ($1, $2, $3)")
            .bind(sid(id))
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
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (tenant, key) DO NOTHING",
        )
        .bind(tenant.as_str())
        .bind(&key.key)
        .bind(key.request.0.to_vec())
        .bind(sid(session))
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
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)",
        )
        .bind(sid(session))
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
            "INSERT INTO branches (session_id, name, head_id, updated_at_ms)
             VALUES ($1, $2, $3, $4) ON CONFLICT (session_id, name) DO NOTHING",
        )
        .bind(sid(session))
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
        sqlx::query("UPDATE branches SET head_id = $1, updated_at_ms = $2 WHERE session_id = $3 AND name = $4")
            .bind(head.map(id))
            .bind(now)
            .bind(sid(session))
            .bind(name.as_str())
            .execute(&mut *self.0.tx)
            .await?;
        Ok(())
    }

    async fn delete_branch(&mut self, session: SessionId, name: &BranchName) -> Result<bool> {
        let done = sqlx::query("DELETE FROM branches WHERE session_id = $1 AND name = $2")
            .bind(sid(session))
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
            "INSERT INTO pins (session_id, node_id, pinned, created_at_ms) VALUES ($1, $2, $3, $4)",
        )
        .bind(sid(session))
        .bind(id(node))
        .bind(i64::from(pinned))
        .bind(now)
        .execute(&mut *self.0.tx)
        .await?;
        Ok(())
    }

    async fn insert_plan(&mut self, plan: &CompactionPlan) -> Result<()> {
        let tenant: String = sqlx::query_scalar("SELECT tenant FROM sessions WHERE id = $1")
            .bind(sid(plan.session))
            .fetch_one(&mut *self.0.tx)
            .await?;
        sqlx::query(
            "INSERT INTO compactions (session_id, id, branch, base_head_id, covers, budget,
                 tokenizer, max_tool_result_chars, retain_turns, instructions, tokens_before,
                 state, created_at_ms, kind, rolls_over, range_from_id, range_to_id, ledger)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17,
                 $18)",
        )
        .bind(sid(plan.session))
        .bind(plan.id.as_bytes().to_vec())
        .bind(plan.branch.as_str())
        .bind(id(plan.base_head))
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
        sqlx::query("INSERT INTO compaction_owners (id, session_id, tenant) VALUES ($1, $2, $3)")
            .bind(plan.id.as_bytes().to_vec())
            .bind(sid(plan.session))
            .bind(tenant)
            .execute(&mut *self.0.tx)
            .await?;
        Ok(())
    }

    async fn set_plan_state(
        &mut self,
        session: SessionId,
        plan: CompactionId,
        state: PlanState,
    ) -> Result<()> {
        sqlx::query("UPDATE compactions SET state = $1 WHERE session_id = $2 AND id = $3")
            .bind(state.as_str())
            .bind(sid(session))
            .bind(plan.as_bytes().to_vec())
            .execute(&mut *self.0.tx)
            .await?;
        Ok(())
    }

    async fn insert_summary(&mut self, session: SessionId, summary: &Summary) -> Result<()> {
        sqlx::query(
            "INSERT INTO summaries (session_id, id, compaction_id, covers, text, model,
                 base_head_id, tokens_before, tokens_after, created_at_ms, kind, rolls_over,
                 range_from_id, range_to_id, ledger)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)",
        )
        .bind(sid(session))
        .bind(summary.id.as_bytes().to_vec())
        .bind(summary.compaction_id.as_bytes().to_vec())
        .bind(pack_ids(&summary.covers))
        .bind(&summary.text)
        .bind(&summary.model)
        .bind(id(summary.base_head))
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
        sqlx::query("UPDATE sessions SET compaction_count = compaction_count + 1 WHERE id = $1")
            .bind(sid(session))
            .execute(&mut *self.0.tx)
            .await?;
        Ok(())
    }

    async fn insert_event(&mut self, event: &NewEvent<'_>) -> Result<()> {
        let plan = event.plan;
        sqlx::query(
            "INSERT INTO compaction_events (session_id, compaction_id, branch, kind, reason,
                 base_head_id, tokens_before, tokens_after, summary_id, message, created_at_ms)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
        )
        .bind(sid(plan.session))
        .bind(plan.id.as_bytes().to_vec())
        .bind(plan.branch.as_str())
        .bind(event.kind.as_str())
        .bind(event.reason.map(|r| r.as_str()))
        .bind(id(plan.base_head))
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
        // An append locks the session FOR SHARE: this waits for those in flight, and those
        // after it find no session.
        let tenant: Option<String> =
            sqlx::query_scalar("SELECT tenant FROM sessions WHERE id = $1 FOR UPDATE")
                .bind(sid(session))
                .fetch_optional(self.conn())
                .await?;
        Ok(tenant.map(Tenant::new))
    }

    async fn delete_session(&mut self, mut tombstone: Tombstone) -> Result<Deleted> {
        let session = sid(tombstone.session);
        let (nodes, branches, summaries, blobs, blob_bytes): (i64, i64, i64, i64, i64) =
            sqlx::query_as(
                "SELECT (SELECT count(*) FROM nodes n WHERE n.session_id = $1),
                        (SELECT count(*) FROM branches b WHERE b.session_id = $1),
                        (SELECT count(*) FROM summaries s WHERE s.session_id = $1),
                        (SELECT count(*) FROM blobs c WHERE c.session_id = $1),
                        (SELECT coalesce(sum(d.size), 0)::BIGINT FROM blobs d
                         WHERE d.session_id = $1)",
            )
            .bind(&session)
            .fetch_one(self.conn())
            .await?;
        tombstone.nodes = u64::try_from(nodes).unwrap_or(0);
        tombstone.branches = u32::try_from(branches).unwrap_or(u32::MAX);
        tombstone.summaries = u32::try_from(summaries).unwrap_or(u32::MAX);
        // The rows of the tables distributed by another key are each named by that key, found
        // first through the session's own rows: under Citus a statement on them by session
        // would go to every shard.
        let plans: Vec<(Vec<u8>, String)> =
            sqlx::query_as("SELECT id, state FROM compactions WHERE session_id = $1")
                .bind(&session)
                .fetch_all(self.conn())
                .await?;
        let plan_ids: Vec<Vec<u8>> = plans.iter().map(|(id, _)| id.clone()).collect();
        if !plan_ids.is_empty() {
            sqlx::query("DELETE FROM compaction_owners WHERE id = ANY($1)")
                .bind(&plan_ids)
                .execute(self.conn())
                .await?;
        }
        // The plans it found open, so their commit is answered as stale, not as unknown.
        for (plan, _) in plans
            .iter()
            .filter(|(_, state)| state == PlanState::Open.as_str())
        {
            sqlx::query("INSERT INTO tombstone_plans (compaction_id, session_id) VALUES ($1, $2)")
                .bind(plan)
                .bind(&session)
                .execute(self.conn())
                .await?;
        }
        let (create_key, sources): (Option<String>, Vec<Vec<u8>>) = sqlx::query_as(
            "SELECT s.create_key, ARRAY(SELECT u.source_key FROM summarizer_sources u
                                        WHERE u.session_id = $1)
             FROM sessions s WHERE s.id = $1",
        )
        .bind(&session)
        .fetch_one(self.conn())
        .await?;
        if let Some(key) = create_key {
            sqlx::query("DELETE FROM session_keys WHERE tenant = $1 AND key = $2")
                .bind(tombstone.tenant.as_str())
                .bind(key)
                .execute(self.conn())
                .await?;
        }
        // The server summarizer's outputs this session used are its content too.
        if !sources.is_empty() {
            sqlx::query("DELETE FROM summarizer_outputs WHERE source_key = ANY($1)")
                .bind(&sources)
                .execute(self.conn())
                .await?;
        }
        // Referring rows before the rows they refer to.
        for statement in [
            "DELETE FROM summarizer_sources WHERE session_id = $1",
            "DELETE FROM summaries WHERE session_id = $1",
            "DELETE FROM compaction_events WHERE session_id = $1",
            "DELETE FROM compactions WHERE session_id = $1",
            "DELETE FROM pins WHERE session_id = $1",
            "DELETE FROM gateway_calls WHERE session_id = $1",
            "DELETE FROM idempotency WHERE session_id = $1",
            "DELETE FROM branches WHERE session_id = $1",
            "DELETE FROM functions WHERE session_id = $1",
            "DELETE FROM nodes WHERE session_id = $1",
            "DELETE FROM blobs WHERE session_id = $1",
            "DELETE FROM sessions WHERE id = $1",
        ] {
            sqlx::query(statement)
                .bind(&session)
                .execute(self.conn())
                .await?;
        }
        sqlx::query(
            "INSERT INTO tombstones (session_id, tenant, deleted_by, deleted_at_ms, nodes,
             branches, summaries) VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(&session)
        .bind(tombstone.tenant.as_str())
        .bind(&tombstone.deleted_by)
        .bind(tombstone.deleted_at_ms)
        .bind(nodes)
        .bind(branches)
        .bind(summaries)
        .execute(self.conn())
        .await?;
        Ok(Deleted {
            tombstone,
            blobs: u64::try_from(blobs).unwrap_or(0),
            blob_bytes: u64::try_from(blob_bytes).unwrap_or(0),
        })
    }

    async fn record_summarizer_source(
        &mut self,
        session: SessionId,
        source: &Hash,
    ) -> Result<bool> {
        sqlx::query(
            "INSERT INTO summarizer_sources (session_id, source_key) VALUES ($1, $2)
             ON CONFLICT (session_id, source_key) DO NOTHING",
        )
        .bind(sid(session))
        .bind(source.0.to_vec())
        .execute(&mut *self.0.tx)
        .await?;
        Ok(true)
    }

    async fn save_summarizer_output(&mut self, source: &Hash, text: &str, now: i64) -> Result<()> {
        sqlx::query(
            "INSERT INTO summarizer_outputs (source_key, text, created_at_ms) VALUES ($1, $2, $3)
             ON CONFLICT (source_key) DO UPDATE SET text = excluded.text",
        )
        .bind(source.0.to_vec())
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
