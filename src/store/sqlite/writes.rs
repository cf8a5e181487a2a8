//! SQLite's part of the store's writes (`store::sql::writes` runs them) on the writer's
//! connection: its wording of the statements the engines word differently, the writes whose
//! statements are its own (a session's deletion), and an import's checked rows as multi-row
//! statements (`AppendTx`).

use async_trait::async_trait;
use sqlx::{QueryBuilder, Sqlite};

use super::{
    Conn, Write, blob_ref_once, blob_stored_once, insert_blob_refs, insert_blobs, insert_functions,
    push_row,
};
use crate::domain::{Hash, NodeId, SessionId, Tenant};
use crate::store::Result;
use crate::store::append::planned::BatchRows;
use crate::store::backend::{AppendTx, Reads};
use crate::store::session::compaction::CompactionPlan;
use crate::store::sql::{
    Removed, Run, SqlWrite, ToArg, insert_nodes, insert_plan_row, node_values,
};

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
        sql.push_values(chunk, |row, node| push_row(row, &node_values(node)));
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
impl SqlWrite for Conn<Write> {
    type Db = Sqlite;
    type Kept = tokio::sync::OwnedMutexGuard<()>;

    // `session_keys` is indexed by session here: a deletion finds the key by it, so the session
    // row does not keep it.
    const INSERT_SESSION: &'static str =
        "INSERT INTO sessions (id, tenant, created_at_ms, metadata) VALUES (?1, ?2, ?3, ?4)";
    const SET_PLAN_STATE: &'static str = "UPDATE compactions SET state = ?1 WHERE id = ?3";
    // `prior_id`: the first summary it rolls over, as summaries made before they rolled over
    // several recorded it.
    const INSERT_SUMMARY: &'static str = "INSERT INTO summaries (id, session_id, compaction_id,
             prior_id, covers, text, model, base_head_id, tokens_before, tokens_after,
             created_at_ms, kind, rolls_over, range_from_id, range_to_id, ledger)
         VALUES (?2, ?1, ?3, substr(?12, 1, 16), ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13,
             ?14, ?15)";

    async fn insert_plan(&mut self, plan: &CompactionPlan) -> Result<()> {
        // `prior_summary_id`: the first summary it rolls over, as plans made before they rolled
        // over several recorded it.
        const INSERT_PLAN: &str = "INSERT INTO compactions (id, session_id, branch, base_head_id,
                 prior_summary_id, covers, budget, tokenizer, max_tool_result_chars,
                 retain_turns, instructions, tokens_before, state, created_at_ms, kind,
                 rolls_over, range_from_id, range_to_id, ledger)
             VALUES (?2, ?1, ?3, ?4, substr(?15, 1, 16), ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13,
                 ?14, ?15, ?16, ?17, ?18)";
        insert_plan_row(self, INSERT_PLAN, plan).await
    }

    async fn lock_session(&mut self, session: SessionId) -> Result<Option<Tenant>> {
        // The store's write lock, held by this transaction, is the lock.
        self.session_tenant(session).await
    }

    async fn remove_session(&mut self, session: SessionId, _tenant: &Tenant) -> Result<Removed> {
        let sid = [session.arg()];
        let counts = self
            .fetch_one(
                "SELECT (SELECT count(*) FROM nodes WHERE session_id = ?1) AS nodes,
                        (SELECT count(*) FROM branches WHERE session_id = ?1) AS branches,
                        (SELECT count(*) FROM summaries WHERE session_id = ?1) AS summaries",
                &sid,
            )
            .await?;
        // Blobs only this session refers to go with it (the `blob_refs_release` trigger).
        let blobs = self
            .fetch_one(
                "SELECT count(*) AS blobs, coalesce(sum(b.size), 0) AS blob_bytes
                 FROM blob_refs r JOIN blobs b ON b.hash = r.hash
                 WHERE r.session_id = ?1 AND b.refs <= 1",
                &sid,
            )
            .await?;
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
            "DELETE FROM gateway_conversations WHERE session_id = ?1",
            "DELETE FROM idempotency WHERE session_id = ?1",
            "DELETE FROM branches WHERE session_id = ?1",
            "DELETE FROM functions WHERE id IN (SELECT id FROM nodes WHERE session_id = ?1)",
            "DELETE FROM session_keys WHERE session_id = ?1",
            "DELETE FROM nodes WHERE session_id = ?1",
            "DELETE FROM blob_refs WHERE session_id = ?1",
            "DELETE FROM sessions WHERE id = ?1",
        ] {
            self.execute(statement, &sid).await?;
        }
        Ok(Removed::counted(&counts, &blobs)?)
    }

    /// A session's outputs are found by their text (see [`Self::remove_session`]).
    async fn record_summarizer_source(
        &mut self,
        _session: SessionId,
        _source: &Hash,
    ) -> Result<bool> {
        Ok(false)
    }

    fn into_tx(self: Box<Self>) -> Write {
        self.0
    }
}
