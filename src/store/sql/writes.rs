//! The store's writes (`WriteTx`) on either SQL engine: each statement written once where the
//! engines word it alike, else in the engine's words ([`SqlWrite`]'s texts), bound the same way;
//! the writes whose statements are an engine's own are its ([`SqlWrite`]).

use async_trait::async_trait;

use super::Result;
use super::engine::{Arg, Run, SqlWrite, ToArg};
use crate::domain::{
    BranchName, CompactionId, GatewayCall, Hash, Ledger, NodeId, SessionId, Summary, SummaryId,
    SummaryKind, Tenant, Tombstone,
};
use crate::store::append::idempotency::CreationKey;
use crate::store::append::planned::NodeWrite;
use crate::store::backend::{BranchAt, Deleted, NewEvent, NewSession, SavedConversation, WriteTx};
use crate::store::form::rows::{budget_json, ledger_json, metadata_json, pack_ids, pack_summaries};
use crate::store::session::compaction::{CompactionPlan, PlanState};

const INSERT_MAIN_BRANCH: &str =
    "INSERT INTO branches (session_id, name, updated_at_ms) VALUES ($1, $2, $3)";
const INSERT_SESSION_KEY: &str =
    "INSERT INTO session_keys (tenant, key, request_hash, session_id, created_at_ms)
     VALUES ($1, $2, $3, $4, $5) ON CONFLICT (tenant, key) DO NOTHING";
const INSERT_GATEWAY_CALL: &str = "INSERT INTO gateway_calls (session_id, id, at_ms, api, model,
         client_tokens, forwarded_tokens, input_tokens, cache_read_tokens, cache_write_tokens,
         output_tokens, kept_tokens, change, priced_by, edit_clear, edit_keep, provider_cleared,
         provider_cleared_tokens, provider_thinking_dropped, thinking_dropped)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18,
         $19, $20)";
const SAVE_GATEWAY_CONVERSATION: &str =
    "INSERT INTO gateway_conversations (session_id, scope, state, updated_at_ms)
     VALUES ($1, $2, $3, $4)
     ON CONFLICT (session_id, scope) DO UPDATE
     SET state = excluded.state, updated_at_ms = excluded.updated_at_ms";
const INSERT_BRANCH: &str = "INSERT INTO branches (session_id, name, head_id, updated_at_ms)
     VALUES ($1, $2, $3, $4) ON CONFLICT (session_id, name) DO NOTHING";
const SET_BRANCH_HEAD: &str =
    "UPDATE branches SET head_id = $1, updated_at_ms = $2 WHERE session_id = $3 AND name = $4";
const DELETE_BRANCH: &str = "DELETE FROM branches WHERE session_id = $1 AND name = $2";
const INSERT_PIN: &str =
    "INSERT INTO pins (session_id, node_id, pinned, created_at_ms) VALUES ($1, $2, $3, $4)";
const COUNT_COMPACTION: &str =
    "UPDATE sessions SET compaction_count = compaction_count + 1 WHERE id = $1";
const INSERT_EVENT: &str = "INSERT INTO compaction_events (session_id, compaction_id, branch,
         kind, reason, base_head_id, tokens_before, tokens_after, summary_id, message,
         created_at_ms)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)";
const INSERT_TOMBSTONE: &str = "INSERT INTO tombstones (session_id, tenant, deleted_by,
         deleted_at_ms, nodes, branches, summaries)
     VALUES ($1, $2, $3, $4, $5, $6, $7)";
const SAVE_SUMMARIZER_OUTPUT: &str =
    "INSERT INTO summarizer_outputs (source_key, text, created_at_ms) VALUES ($1, $2, $3)
     ON CONFLICT (source_key) DO UPDATE SET text = excluded.text";

#[async_trait]
impl<T: SqlWrite> WriteTx for T {
    async fn insert_session(&mut self, session: &NewSession<'_>) -> Result<()> {
        let (id, now) = (session.id, session.now);
        let metadata = metadata_json(session.metadata);
        let creation_key = session.key.map(|k| k.key.as_str());
        let row = [
            id.arg(),
            session.tenant.arg(),
            now.arg(),
            metadata.arg(),
            creation_key.arg(),
        ];
        self.execute(T::INSERT_SESSION, &row).await?;
        let main = BranchName::main();
        let branch = [id.arg(), main.arg(), now.arg()];
        self.execute(INSERT_MAIN_BRANCH, &branch).await?;
        Ok(())
    }

    async fn insert_session_key(
        &mut self,
        session: &NewSession<'_>,
        key: &CreationKey,
    ) -> Result<bool> {
        let (tenant, id, now) = (session.tenant, session.id, session.now);
        let args = [
            tenant.arg(),
            key.key.arg(),
            key.request.arg(),
            id.arg(),
            now.arg(),
        ];
        Ok(self.execute(INSERT_SESSION_KEY, &args).await? == 1)
    }

    async fn insert_gateway_call(&mut self, session: SessionId, call: &GatewayCall) -> Result<()> {
        let n = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        let id = uuid::Uuid::now_v7();
        let change = call.change.map(|c| c.as_text());
        let priced_by = Some(call.priced_by.as_str()).filter(|p| !p.is_empty());
        let edit_clear = call.asked.map(|a| i64::from(a.clear));
        let edit_keep = call.asked.map(|a| i64::from(a.keep));
        let cleared = call.usage.cleared.map(|(uses, _)| i64::from(uses));
        let cleared_tokens = call.usage.cleared.map(|(_, tokens)| n(tokens));
        let provider_dropped = i64::from(call.usage.thinking_dropped);
        let dropped = i64::from(call.thinking_dropped);
        let counts = [
            call.client_tokens,
            call.forwarded_tokens,
            call.usage.input,
            call.usage.cache_read,
            call.usage.cache_write,
            call.usage.output,
            call.kept_tokens,
        ]
        .map(n);
        let [
            client,
            forwarded,
            input,
            cache_read,
            cache_write,
            output,
            kept,
        ] = &counts;
        let args = [
            session.arg(),
            id.as_bytes().arg(),
            call.at_ms.arg(),
            call.api.arg(),
            call.model.arg(),
            client.arg(),
            forwarded.arg(),
            input.arg(),
            cache_read.arg(),
            cache_write.arg(),
            output.arg(),
            kept.arg(),
            change.arg(),
            priced_by.arg(),
            edit_clear.arg(),
            edit_keep.arg(),
            cleared.arg(),
            cleared_tokens.arg(),
            provider_dropped.arg(),
            dropped.arg(),
        ];
        self.execute(INSERT_GATEWAY_CALL, &args).await?;
        Ok(())
    }

    async fn save_gateway_conversation(&mut self, saved: &SavedConversation<'_>) -> Result<()> {
        let SavedConversation {
            session,
            scope,
            state,
            now,
        } = *saved;
        let args = [session.arg(), scope.arg(), state.arg(), now.arg()];
        self.execute(SAVE_GATEWAY_CONVERSATION, &args).await?;
        Ok(())
    }

    async fn insert_branch(&mut self, branch: &BranchAt<'_>) -> Result<bool> {
        Ok(self.execute(INSERT_BRANCH, &branch_values(branch)).await? == 1)
    }

    async fn set_branch_head(&mut self, branch: &BranchAt<'_>) -> Result<()> {
        let [session, name, head, now] = branch_values(branch);
        self.execute(SET_BRANCH_HEAD, &[head, now, session, name])
            .await?;
        Ok(())
    }

    async fn delete_branch(&mut self, session: SessionId, name: &BranchName) -> Result<bool> {
        let args = [session.arg(), name.arg()];
        Ok(self.execute(DELETE_BRANCH, &args).await? == 1)
    }

    async fn insert_pin(
        &mut self,
        session: SessionId,
        (node, pinned): (NodeId, bool),
        now: i64,
    ) -> Result<()> {
        let pinned = i64::from(pinned);
        let args = [session.arg(), node.arg(), pinned.arg(), now.arg()];
        self.execute(INSERT_PIN, &args).await?;
        Ok(())
    }

    async fn insert_plan(&mut self, plan: &CompactionPlan) -> Result<()> {
        SqlWrite::insert_plan(self, plan).await
    }

    async fn set_plan_state(
        &mut self,
        session: SessionId,
        id: CompactionId,
        state: PlanState,
    ) -> Result<()> {
        let args = [state.as_str().arg(), session.arg(), id.arg()];
        self.execute(T::SET_PLAN_STATE, &args).await?;
        Ok(())
    }

    async fn insert_summary(&mut self, session: SessionId, summary: &Summary) -> Result<()> {
        let covers = pack_ids(&summary.covers);
        let tokens = [summary.tokens_before, summary.tokens_after].map(i64::from);
        let overlay = Overlay::new(
            summary.kind,
            &summary.rolls_over,
            summary.range,
            summary.ledger.as_deref(),
        );
        let args: Vec<Arg> = [
            session.arg(),
            summary.id.arg(),
            summary.compaction_id.arg(),
            covers.arg(),
            summary.text.arg(),
            summary.model.arg(),
            summary.base_head.arg(),
            tokens[0].arg(),
            tokens[1].arg(),
            summary.created_at_ms.arg(),
        ]
        .into_iter()
        .chain(overlay.args())
        .collect();
        self.execute(T::INSERT_SUMMARY, &args).await?;
        Ok(())
    }

    async fn count_compaction(&mut self, session: SessionId) -> Result<()> {
        self.execute(COUNT_COMPACTION, &[session.arg()]).await?;
        Ok(())
    }

    async fn insert_event(&mut self, event: &NewEvent<'_>) -> Result<()> {
        let plan = event.plan;
        let tokens = [event.tokens_before, event.tokens_after].map(i64::from);
        let args = [
            plan.session.arg(),
            plan.id.arg(),
            plan.branch.arg(),
            event.kind.as_str().arg(),
            Arg::Text(event.reason.map(|r| r.as_str())),
            plan.base_head.arg(),
            tokens[0].arg(),
            tokens[1].arg(),
            event.summary.arg(),
            event.message.arg(),
            event.at.arg(),
        ];
        self.execute(INSERT_EVENT, &args).await?;
        Ok(())
    }

    async fn lock_session(&mut self, session: SessionId) -> Result<Option<Tenant>> {
        SqlWrite::lock_session(self, session).await
    }

    async fn delete_session(&mut self, tombstone: Tombstone) -> Result<Deleted> {
        let removed = self
            .remove_session(tombstone.session, &tombstone.tenant)
            .await?;
        let args = [
            tombstone.session.arg(),
            tombstone.tenant.arg(),
            tombstone.deleted_by.arg(),
            tombstone.deleted_at_ms.arg(),
            removed.nodes.arg(),
            removed.branches.arg(),
            removed.summaries.arg(),
        ];
        self.execute(INSERT_TOMBSTONE, &args).await?;
        Ok(removed.deleted(tombstone))
    }

    async fn save_summarizer_output(&mut self, source: &Hash, text: &str, now: i64) -> Result<()> {
        let args = [source.arg(), text.arg(), now.arg()];
        self.execute(SAVE_SUMMARIZER_OUTPUT, &args).await?;
        Ok(())
    }

    async fn record_summarizer_source(
        &mut self,
        session: SessionId,
        source: &Hash,
    ) -> Result<bool> {
        SqlWrite::record_summarizer_source(self, session, source).await
    }

    async fn commit(self: Box<Self>) -> Result<()> {
        self.into_tx().commit().await
    }

    async fn rollback(self: Box<Self>) -> Result<()> {
        self.into_tx().rollback().await
    }
}

/// Inserts `plan`'s row with `sql`, an engine's text whose values are, in order: session, id,
/// branch, base head, covers, budget, tokenizer, max tool result chars, retain turns,
/// instructions, tokens before, state, created at, kind, rolls over, range from, range to,
/// ledger.
pub(in crate::store) async fn insert_plan_row(
    conn: &mut impl Run,
    sql: &'static str,
    plan: &CompactionPlan,
) -> Result<()> {
    let covers = pack_ids(&plan.covers);
    let budget = budget_json(&plan.budget);
    let overlay = Overlay::new(plan.kind, &plan.rolls_over, plan.range, Some(&plan.ledger));
    let numbers = [
        plan.max_tool_result_chars,
        plan.retain_turns,
        plan.tokens_before,
    ]
    .map(i64::from);
    let [max_tool_result_chars, retain_turns, tokens_before] = &numbers;
    let args: Vec<Arg> = [
        plan.session.arg(),
        plan.id.arg(),
        plan.branch.arg(),
        plan.base_head.arg(),
        covers.arg(),
        budget.arg(),
        plan.tokenizer.arg(),
        max_tool_result_chars.arg(),
        retain_turns.arg(),
        plan.instructions.arg(),
        tokens_before.arg(),
        plan.state.as_str().arg(),
        plan.created_at_ms.arg(),
    ]
    .into_iter()
    .chain(overlay.args())
    .collect();
    conn.execute(sql, &args).await?;
    Ok(())
}

/// A branch row's values in the order its table names the columns: session, name, head,
/// updated at.
fn branch_values<'a>(branch: &'a BranchAt<'_>) -> [Arg<'a>; 4] {
    [
        branch.session.arg(),
        branch.name.arg(),
        branch.head.arg(),
        branch.now.arg(),
    ]
}

/// The head of the statement that inserts node rows, whose values are [`node_values`].
macro_rules! insert_nodes {
    () => {
        "INSERT INTO nodes (session_id, id, parent_id, function_id, kind, created_at_ms, hash, \
         body, body_z) "
    };
}
pub(in crate::store) use insert_nodes;

/// A node's values, in the order [`insert_nodes`] names the columns.
pub(in crate::store) fn node_values(node: &NodeWrite) -> [Arg<'_>; 9] {
    let n = &node.insert;
    [
        n.session.arg(),
        n.id.arg(),
        n.parent.arg(),
        n.function.arg(),
        node.kind.arg(),
        n.created_at_ms.arg(),
        n.hash.arg(),
        node.body.arg(),
        node.body_z.arg(),
    ]
}

/// What a summary and its plan both store of what the summary is, in the columns both tables
/// end with: `kind, rolls_over, range_from_id, range_to_id, ledger`.
struct Overlay {
    kind: &'static str,
    rolls_over: Option<Vec<u8>>,
    range: (Option<NodeId>, Option<NodeId>),
    ledger: Option<String>,
}

impl Overlay {
    fn new(
        kind: SummaryKind,
        rolls_over: &[SummaryId],
        range: Option<(NodeId, NodeId)>,
        ledger: Option<&Ledger>,
    ) -> Self {
        Self {
            kind: kind.as_str(),
            rolls_over: pack_summaries(rolls_over),
            range: range.unzip(),
            ledger: ledger.map(ledger_json),
        }
    }

    fn args(&self) -> [Arg<'_>; 5] {
        [
            self.kind.arg(),
            self.rolls_over.arg(),
            self.range.0.arg(),
            self.range.1.arg(),
            self.ledger.arg(),
        ]
    }
}

/// A write transaction on an engine's pool, and what the engine keeps with it until it ends
/// (SQLite: the store's write lock; PostgreSQL: whether its writes are routed). Dropped without
/// [`Tx::commit`], it rolls back.
pub(in crate::store) struct Tx<DB: sqlx::Database, K> {
    // Declared first: dropped (its ROLLBACK queued) before what is kept with it.
    pub(in crate::store) tx: sqlx::Transaction<'static, DB>,
    pub(in crate::store) kept: K,
}

impl<DB: sqlx::Database, K> Tx<DB, K> {
    pub(in crate::store) async fn commit(self) -> Result<()> {
        let Tx { tx, kept } = self;
        tx.commit().await?;
        drop(kept);
        Ok(())
    }

    pub(in crate::store) async fn rollback(self) -> Result<()> {
        let Tx { tx, kept } = self;
        tx.rollback().await?;
        drop(kept);
        Ok(())
    }
}
