//! PostgreSQL's part of the store's writes (`store::sql::writes` runs them): a batch's rows as
//! one multi-row statement per table (`AppendTx`, for the committer and an import alike: a round
//! trip costs more than parsing here), its wording of the statements the engines word
//! differently, and the writes whose statements are its own (a plan's owner row, a session's
//! deletion).

use async_trait::async_trait;
use sqlx::{Postgres, QueryBuilder};

use super::{Conn, Connection, Write, push_row};
use crate::domain::{Hash, NodeId, SessionId, Tenant};
use crate::store::Result;
use crate::store::append::planned::BatchRows;
use crate::store::backend::AppendTx;
use crate::store::session::compaction::{CompactionPlan, PlanState};
use crate::store::sql::decode;
use crate::store::sql::{
    Removed, Run, SqlWrite, ToArg, insert_nodes, insert_plan_row, node_values,
};

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
            let mut sql = QueryBuilder::new(insert_nodes!());
            sql.push_values(chunk, |row, node| push_row(row, &node_values(node)));
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
impl SqlWrite for Conn<Write> {
    type Db = Postgres;
    type Kept = bool;

    // The creation key is kept on the session row: a deletion names the key by it (the keys
    // are distributed by key, not by session).
    const INSERT_SESSION: &'static str =
        "INSERT INTO sessions (id, tenant, created_at_ms, metadata, create_key)
         VALUES ($1, $2, $3, $4, $5)";
    const SET_PLAN_STATE: &'static str =
        "UPDATE compactions SET state = $1 WHERE session_id = $2 AND id = $3";
    const INSERT_SUMMARY: &'static str = "INSERT INTO summaries (session_id, id, compaction_id,
             covers, text, model, base_head_id, tokens_before, tokens_after, created_at_ms, kind,
             rolls_over, range_from_id, range_to_id, ledger)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)";

    /// The plan, and its owner row: CommitSummary and CancelCompaction name only the plan, and
    /// plans are distributed by session.
    async fn insert_plan(&mut self, plan: &CompactionPlan) -> Result<()> {
        const INSERT_PLAN: &str = "INSERT INTO compactions (session_id, id, branch, base_head_id,
                 covers, budget, tokenizer, max_tool_result_chars, retain_turns, instructions,
                 tokens_before, state, created_at_ms, kind, rolls_over, range_from_id,
                 range_to_id, ledger)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17,
                 $18)";
        let tenant = self
            .fetch_one(
                "SELECT tenant FROM sessions WHERE id = $1",
                &[plan.session.arg()],
            )
            .await?;
        let tenant = decode::tenant(&tenant)?;
        insert_plan_row(self, INSERT_PLAN, plan).await?;
        let owner = [plan.id.arg(), plan.session.arg(), tenant.arg()];
        self.execute(
            "INSERT INTO compaction_owners (id, session_id, tenant) VALUES ($1, $2, $3)",
            &owner,
        )
        .await?;
        Ok(())
    }

    async fn lock_session(&mut self, session: SessionId) -> Result<Option<Tenant>> {
        // An append locks the session FOR SHARE: this waits for those in flight, and those
        // after it find no session.
        let sql = "SELECT tenant FROM sessions WHERE id = $1 FOR UPDATE";
        let row = self.fetch_optional(sql, &[session.arg()]).await?;
        row.as_ref().map(decode::tenant).transpose()
    }

    async fn remove_session(&mut self, session: SessionId, tenant: &Tenant) -> Result<Removed> {
        let sid = [session.arg()];
        let counts = self
            .fetch_one(
                "SELECT (SELECT count(*) FROM nodes n WHERE n.session_id = $1) AS nodes,
                        (SELECT count(*) FROM branches b WHERE b.session_id = $1) AS branches,
                        (SELECT count(*) FROM summaries s WHERE s.session_id = $1) AS summaries,
                        (SELECT count(*) FROM blobs c WHERE c.session_id = $1) AS blobs,
                        (SELECT coalesce(sum(d.size), 0)::BIGINT FROM blobs d
                         WHERE d.session_id = $1) AS blob_bytes",
                &sid,
            )
            .await?;
        // The rows of the tables distributed by another key are each named by that key, found
        // first through the session's own rows: under Citus a statement on them by session
        // would go to every shard.
        let plans: Vec<(Vec<u8>, String)> =
            sqlx::query_as("SELECT id, state FROM compactions WHERE session_id = $1")
                .bind(session.as_bytes().as_slice())
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
            let args = [plan.arg(), session.arg()];
            self.execute(
                "INSERT INTO tombstone_plans (compaction_id, session_id) VALUES ($1, $2)",
                &args,
            )
            .await?;
        }
        let (create_key, sources): (Option<String>, Vec<Vec<u8>>) = sqlx::query_as(
            "SELECT s.create_key, ARRAY(SELECT u.source_key FROM summarizer_sources u
                                        WHERE u.session_id = $1)
             FROM sessions s WHERE s.id = $1",
        )
        .bind(session.as_bytes().as_slice())
        .fetch_one(self.conn())
        .await?;
        if let Some(key) = create_key {
            let args = [tenant.arg(), key.arg()];
            self.execute(
                "DELETE FROM session_keys WHERE tenant = $1 AND key = $2",
                &args,
            )
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
            "DELETE FROM gateway_conversations WHERE session_id = $1",
            "DELETE FROM idempotency WHERE session_id = $1",
            "DELETE FROM branches WHERE session_id = $1",
            "DELETE FROM functions WHERE session_id = $1",
            "DELETE FROM nodes WHERE session_id = $1",
            "DELETE FROM blobs WHERE session_id = $1",
            "DELETE FROM sessions WHERE id = $1",
        ] {
            self.execute(statement, &sid).await?;
        }
        Removed::counted(&counts, &counts)
    }

    /// Outputs are distributed by source: a deletion names each by the key recorded here.
    async fn record_summarizer_source(
        &mut self,
        session: SessionId,
        source: &Hash,
    ) -> Result<bool> {
        let args = [session.arg(), source.arg()];
        self.execute(
            "INSERT INTO summarizer_sources (session_id, source_key) VALUES ($1, $2)
             ON CONFLICT (session_id, source_key) DO NOTHING",
            &args,
        )
        .await?;
        Ok(true)
    }

    fn into_tx(self: Box<Self>) -> Write {
        self.0
    }
}
