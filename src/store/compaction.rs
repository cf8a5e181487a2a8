//! Compaction plans, summaries and their audit trail.

use sqlx::sqlite::SqliteRow;
use sqlx::{Row, SqliteConnection};

use super::clock::now_ms;
use super::rows::{branch_head, ensure_session, id_column, required_uuid, uuid_column};
use super::{Error, Result, Scoped, ScopedPlan, Store};
use std::sync::Arc;

use crate::domain::{
    self, BranchName, Budget, CompactionEvent, CompactionId, EventKind, Hash, Ledger, NodeId,
    Reason, SessionId, Summary, SummaryId, SummaryKind, Tenant,
};

/// Where a compaction plan stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlanState {
    /// Prepared; commits may be tried until one applies or it is cancelled.
    Open,
    Applied,
    Cancelled,
}

/// What Prepare fixed, so Commit cannot be handed a different range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompactionPlan {
    pub id: CompactionId,
    pub session: SessionId,
    pub branch: BranchName,
    pub base_head: NodeId,
    pub kind: SummaryKind,
    /// The summaries it rolls over, in render order.
    pub rolls_over: Vec<SummaryId>,
    pub covers: Vec<NodeId>,
    pub range: Option<(NodeId, NodeId)>,
    /// The evidence the summary will carry, fixed at Prepare like its range.
    pub ledger: Ledger,
    pub budget: Budget,
    pub tokenizer: String,
    pub max_tool_result_chars: u32,
    pub retain_turns: u32,
    pub instructions: String,
    pub tokens_before: u32,
    pub state: PlanState,
    pub created_at_ms: i64,
}

/// Whether a summary was stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    Stored,
    /// The branch head moved since the verdict: judge again on the new head.
    HeadMoved,
}

fn pack(ids: &[NodeId]) -> Vec<u8> {
    ids.iter().flat_map(|id| *id.as_bytes()).collect()
}

fn unpack(bytes: &[u8]) -> Result<Vec<NodeId>> {
    if !bytes.len().is_multiple_of(16) {
        return Err(Error::Corrupt("packed ids are not 16-byte aligned".into()));
    }
    Ok(bytes
        .chunks_exact(16)
        .map(|c| {
            let mut id = [0u8; 16];
            id.copy_from_slice(c);
            NodeId::from_bytes(id)
        })
        .collect())
}

fn pack_summaries(ids: &[SummaryId]) -> Option<Vec<u8>> {
    (!ids.is_empty()).then(|| ids.iter().flat_map(|id| *id.as_bytes()).collect())
}

fn unpack_summaries(bytes: Option<Vec<u8>>) -> Result<Vec<SummaryId>> {
    Ok(unpack(&bytes.unwrap_or_default())?
        .into_iter()
        .map(|id| SummaryId::from_bytes(*id.as_bytes()))
        .collect())
}

fn kind_column(row: &SqliteRow) -> Result<SummaryKind> {
    let kind: String = row.try_get("kind")?;
    SummaryKind::parse(&kind).ok_or_else(|| Error::Corrupt(format!("summary kind {kind:?}")))
}

fn range_columns(row: &SqliteRow) -> Result<Option<(NodeId, NodeId)>> {
    Ok(id_column(row, "range_from_id")?.zip(id_column(row, "range_to_id")?))
}

fn ledger_json(ledger: &Ledger) -> String {
    serde_json::to_string(ledger).expect("a ledger serializes")
}

fn ledger_column(row: &SqliteRow) -> Result<Option<Ledger>> {
    let json: Option<String> = row.try_get("ledger")?;
    json.map(|j| serde_json::from_str(&j).map_err(|e| Error::Corrupt(format!("ledger: {e}"))))
        .transpose()
}

fn u32_column(row: &SqliteRow, column: &str) -> Result<u32> {
    let n: i64 = row.try_get(column)?;
    u32::try_from(n).map_err(|_| Error::Corrupt(format!("{column} out of range")))
}

pub(super) fn summary_from(row: &SqliteRow) -> Result<Summary> {
    Ok(Summary {
        id: SummaryId::from_bytes(required_uuid(row, "id")?),
        compaction_id: CompactionId::from_bytes(required_uuid(row, "compaction_id")?),
        kind: kind_column(row)?,
        covers: unpack(&row.try_get::<Vec<u8>, _>("covers")?)?,
        range: range_columns(row)?,
        text: row.try_get("text")?,
        rolls_over: unpack_summaries(row.try_get("rolls_over")?)?,
        ledger: ledger_column(row)?.map(Arc::new),
        model: row.try_get("model")?,
        base_head: NodeId::from_bytes(required_uuid(row, "base_head_id")?),
        tokens_before: u32_column(row, "tokens_before")?,
        tokens_after: u32_column(row, "tokens_after")?,
        created_at_ms: row.try_get("created_at_ms")?,
    })
}

/// Every summary of a session, oldest first.
/// The columns [`summary_from`] reads.
pub(super) const SUMMARY_COLUMNS: &str = "id, compaction_id, kind, covers, range_from_id, \
     range_to_id, text, rolls_over, ledger, model, base_head_id, tokens_before, tokens_after, \
     created_at_ms";

pub(super) async fn summaries(
    conn: &mut SqliteConnection,
    session: SessionId,
) -> Result<Vec<Summary>> {
    let sql = format!(
        "SELECT {SUMMARY_COLUMNS} FROM summaries WHERE session_id = ? ORDER BY created_at_ms, id"
    );
    let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(session.as_bytes().as_slice())
        .fetch_all(&mut *conn)
        .await?;
    rows.iter().map(summary_from).collect()
}

#[allow(clippy::too_many_arguments)]
async fn insert_event(
    conn: &mut SqliteConnection,
    plan: &CompactionPlan,
    kind: EventKind,
    reason: Option<Reason>,
    tokens_before: u32,
    tokens_after: u32,
    summary: Option<SummaryId>,
    message: &str,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO compaction_events (session_id, compaction_id, branch, kind, reason,
             base_head_id, tokens_before, tokens_after, summary_id, message, created_at_ms)
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(plan.session.as_bytes().as_slice())
    .bind(plan.id.as_bytes().as_slice())
    .bind(plan.branch.as_str())
    .bind(kind.as_str())
    .bind(reason.map(Reason::as_str))
    .bind(plan.base_head.as_bytes().as_slice())
    .bind(i64::from(tokens_before))
    .bind(i64::from(tokens_after))
    .bind(summary.map(|s| s.as_bytes().to_vec()))
    .bind(message)
    .bind(now_ms())
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// The plan must still take commits.
fn ensure_open(plan: &CompactionPlan) -> Result<()> {
    match plan.state {
        PlanState::Open => Ok(()),
        PlanState::Applied => Err(domain::Error::FailedPrecondition(format!(
            "compaction_id: compaction {} is already applied",
            plan.id
        ))
        .into()),
        PlanState::Cancelled => Err(domain::Error::FailedPrecondition(format!(
            "compaction_id: compaction {} was cancelled",
            plan.id
        ))
        .into()),
    }
}

async fn load_plan(conn: &mut SqliteConnection, id: CompactionId) -> Result<CompactionPlan> {
    let row = sqlx::query(
        "SELECT session_id, branch, base_head_id, kind, rolls_over, covers, range_from_id,
                range_to_id, ledger, budget, tokenizer, max_tool_result_chars, retain_turns,
                instructions, tokens_before, state, created_at_ms
         FROM compactions WHERE id = ?",
    )
    .bind(id.as_bytes().as_slice())
    .fetch_optional(&mut *conn)
    .await?
    .ok_or_else(|| domain::Error::not_found("compaction", id))?;
    let budget: String = row.try_get("budget")?;
    let [context_window, output_reserve, system, tools, schema]: [u32; 5] =
        serde_json::from_str(&budget).map_err(|e| Error::Corrupt(format!("budget: {e}")))?;
    let state: String = row.try_get("state")?;
    Ok(CompactionPlan {
        id,
        session: SessionId::from_bytes(required_uuid(&row, "session_id")?),
        branch: BranchName::from_stored(row.try_get("branch")?),
        base_head: NodeId::from_bytes(required_uuid(&row, "base_head_id")?),
        kind: kind_column(&row)?,
        rolls_over: unpack_summaries(row.try_get("rolls_over")?)?,
        covers: unpack(&row.try_get::<Vec<u8>, _>("covers")?)?,
        range: range_columns(&row)?,
        ledger: ledger_column(&row)?.unwrap_or_default(),
        budget: Budget {
            context_window,
            output_reserve,
            system,
            tools,
            schema,
        },
        tokenizer: row.try_get("tokenizer")?,
        max_tool_result_chars: u32_column(&row, "max_tool_result_chars")?,
        retain_turns: u32_column(&row, "retain_turns")?,
        instructions: row.try_get("instructions")?,
        tokens_before: u32_column(&row, "tokens_before")?,
        state: match state.as_str() {
            "open" => PlanState::Open,
            "applied" => PlanState::Applied,
            "cancelled" => PlanState::Cancelled,
            other => return Err(Error::Corrupt(format!("compaction state {other:?}"))),
        },
        created_at_ms: row.try_get("created_at_ms")?,
    })
}

impl Store {
    /// Stores a prepared plan and its `prepared` event.
    pub async fn save_plan(&self, session: Scoped, plan: &CompactionPlan) -> Result<ScopedPlan> {
        if plan.session != session.id() {
            return Err(domain::Error::not_found("session", plan.session).into());
        }
        let b = plan.budget;
        let budget = serde_json::to_string(&[
            b.context_window,
            b.output_reserve,
            b.system,
            b.tools,
            b.schema,
        ])
        .expect("numbers serialize");
        let mut tx = self.begin_write().await?;
        sqlx::query(
            "INSERT INTO compactions (id, session_id, branch, base_head_id, prior_summary_id,
                 covers, budget, tokenizer, max_tool_result_chars, retain_turns, instructions,
                 tokens_before, state, created_at_ms, kind, rolls_over, range_from_id,
                 range_to_id, ledger)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'open', ?, ?, ?, ?, ?, ?)",
        )
        .bind(plan.id.as_bytes().as_slice())
        .bind(plan.session.as_bytes().as_slice())
        .bind(plan.branch.as_str())
        .bind(plan.base_head.as_bytes().as_slice())
        .bind(plan.rolls_over.first().map(|p| p.as_bytes().to_vec()))
        .bind(pack(&plan.covers))
        .bind(budget)
        .bind(&plan.tokenizer)
        .bind(i64::from(plan.max_tool_result_chars))
        .bind(i64::from(plan.retain_turns))
        .bind(&plan.instructions)
        .bind(i64::from(plan.tokens_before))
        .bind(plan.created_at_ms)
        .bind(plan.kind.as_str())
        .bind(pack_summaries(&plan.rolls_over))
        .bind(plan.range.map(|r| r.0.as_bytes().to_vec()))
        .bind(plan.range.map(|r| r.1.as_bytes().to_vec()))
        .bind(ledger_json(&plan.ledger))
        .execute(&mut *tx)
        .await?;
        insert_event(
            &mut tx,
            plan,
            EventKind::Prepared,
            None,
            plan.tokens_before,
            0,
            None,
            &format!("{} nodes to summarize", plan.covers.len()),
        )
        .await?;
        tx.commit().await?;
        Ok(ScopedPlan::trusted(plan.id))
    }

    /// The tenant whose session compaction `id` belongs to; `None` for an unknown plan. One
    /// lookup either way, so a caller cannot tell an unknown plan from another tenant's.
    pub(super) async fn compaction_owner(
        &self,
        id: CompactionId,
    ) -> Result<Option<(SessionId, Tenant)>> {
        let mut conn = self.reader.acquire().await?;
        let row = sqlx::query(
            "SELECT c.session_id, s.tenant FROM compactions c
             JOIN sessions s ON s.id = c.session_id WHERE c.id = ?",
        )
        .bind(id.as_bytes().as_slice())
        .fetch_optional(&mut *conn)
        .await?;
        row.map(|row| {
            Ok((
                SessionId::from_bytes(required_uuid(&row, "session_id")?),
                Tenant::new(row.try_get::<String, _>("tenant")?),
            ))
        })
        .transpose()
    }

    pub async fn plan(&self, id: ScopedPlan) -> Result<CompactionPlan> {
        let id = id.id();
        let mut conn = self.reader.acquire().await?;
        load_plan(&mut conn, id).await
    }

    /// Stores `summary` if the plan is open and the branch head is still `expected_head`, in
    /// one transaction with its event and the session's compaction count.
    pub async fn apply_summary(
        &self,
        plan_id: ScopedPlan,
        summary: &Summary,
        expected_head: NodeId,
    ) -> Result<Applied> {
        let plan_id = plan_id.id();
        let mut tx = self.begin_write().await?;
        let plan = load_plan(&mut tx, plan_id).await?;
        ensure_open(&plan)?;
        if branch_head(&mut tx, plan.session, &plan.branch).await? != Some(expected_head) {
            return Ok(Applied::HeadMoved);
        }
        sqlx::query(
            "INSERT INTO summaries (id, session_id, compaction_id, prior_id, covers, text, model,
                 base_head_id, tokens_before, tokens_after, created_at_ms, kind, rolls_over,
                 range_from_id, range_to_id, ledger)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(summary.id.as_bytes().as_slice())
        .bind(plan.session.as_bytes().as_slice())
        .bind(plan.id.as_bytes().as_slice())
        .bind(summary.rolls_over.first().map(|p| p.as_bytes().to_vec()))
        .bind(pack(&summary.covers))
        .bind(&summary.text)
        .bind(&summary.model)
        .bind(summary.base_head.as_bytes().as_slice())
        .bind(i64::from(summary.tokens_before))
        .bind(i64::from(summary.tokens_after))
        .bind(summary.created_at_ms)
        .bind(summary.kind.as_str())
        .bind(pack_summaries(&summary.rolls_over))
        .bind(summary.range.map(|r| r.0.as_bytes().to_vec()))
        .bind(summary.range.map(|r| r.1.as_bytes().to_vec()))
        .bind(summary.ledger.as_deref().map(ledger_json))
        .execute(&mut *tx)
        .await?;
        sqlx::query("UPDATE compactions SET state = 'applied' WHERE id = ?")
            .bind(plan.id.as_bytes().as_slice())
            .execute(&mut *tx)
            .await?;
        sqlx::query("UPDATE sessions SET compaction_count = compaction_count + 1 WHERE id = ?")
            .bind(plan.session.as_bytes().as_slice())
            .execute(&mut *tx)
            .await?;
        insert_event(
            &mut tx,
            &plan,
            EventKind::Committed,
            Some(Reason::Applied),
            summary.tokens_before,
            summary.tokens_after,
            Some(summary.id),
            &format!("model {:?}", summary.model),
        )
        .await?;
        tx.commit().await?;
        Ok(Applied::Stored)
    }

    /// Records a commit that wrote no summary. With `keep_open` the plan takes another try
    /// (a host may commit a better text); without, it is closed with this event.
    pub async fn reject(
        &self,
        plan_id: ScopedPlan,
        reason: Reason,
        tokens: (u32, u32),
        message: &str,
        keep_open: bool,
    ) -> Result<()> {
        let plan_id = plan_id.id();
        let (tokens_before, tokens_after) = tokens;
        let mut tx = self.begin_write().await?;
        let plan = load_plan(&mut tx, plan_id).await?;
        ensure_open(&plan)?;
        if !keep_open {
            sqlx::query("UPDATE compactions SET state = 'cancelled' WHERE id = ?")
                .bind(plan.id.as_bytes().as_slice())
                .execute(&mut *tx)
                .await?;
        }
        insert_event(
            &mut tx,
            &plan,
            EventKind::Rejected,
            Some(reason),
            tokens_before,
            tokens_after,
            None,
            message,
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Closes an open plan at the caller's word.
    pub async fn cancel(&self, plan_id: ScopedPlan, message: &str) -> Result<()> {
        self.close_plan(plan_id, Reason::Cancelled, message).await
    }

    /// Closes an open plan without a summary, recording why.
    pub async fn close_plan(
        &self,
        plan_id: ScopedPlan,
        reason: Reason,
        message: &str,
    ) -> Result<()> {
        let plan_id = plan_id.id();
        let mut tx = self.begin_write().await?;
        let plan = load_plan(&mut tx, plan_id).await?;
        ensure_open(&plan)?;
        sqlx::query("UPDATE compactions SET state = 'cancelled' WHERE id = ?")
            .bind(plan.id.as_bytes().as_slice())
            .execute(&mut *tx)
            .await?;
        let kind = if reason == Reason::Cancelled {
            EventKind::Cancelled
        } else {
            EventKind::Rejected
        };
        insert_event(
            &mut tx,
            &plan,
            kind,
            Some(reason),
            plan.tokens_before,
            plan.tokens_before,
            None,
            message,
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }

    pub async fn summaries(&self, session: Scoped) -> Result<Vec<Summary>> {
        let session = session.id();
        let mut conn = self.reader.acquire().await?;
        ensure_session(&mut conn, session).await?;
        summaries(&mut conn, session).await
    }

    /// The audit trail of a session (one branch's, if given), oldest first.
    pub async fn events(
        &self,
        session: Scoped,
        branch: Option<&BranchName>,
    ) -> Result<Vec<CompactionEvent>> {
        let session = session.id();
        let mut conn = self.reader.acquire().await?;
        ensure_session(&mut conn, session).await?;
        let rows = sqlx::query(
            "SELECT compaction_id, branch, kind, reason, base_head_id, tokens_before,
                    tokens_after, summary_id, message, created_at_ms
             FROM compaction_events WHERE session_id = ?1 AND (?2 IS NULL OR branch = ?2)
             ORDER BY id",
        )
        .bind(session.as_bytes().as_slice())
        .bind(branch.map(BranchName::as_str))
        .fetch_all(&mut *conn)
        .await?;
        rows.iter()
            .map(|row| {
                let kind: String = row.try_get("kind")?;
                let reason: Option<String> = row.try_get("reason")?;
                Ok(CompactionEvent {
                    compaction_id: CompactionId::from_bytes(required_uuid(row, "compaction_id")?),
                    branch: row.try_get("branch")?,
                    kind: EventKind::parse(&kind)
                        .ok_or_else(|| Error::Corrupt(format!("event kind {kind:?}")))?,
                    reason: reason
                        .map(|r| {
                            Reason::parse(&r)
                                .ok_or_else(|| Error::Corrupt(format!("event reason {r:?}")))
                        })
                        .transpose()?,
                    base_head: id_column(row, "base_head_id")?,
                    tokens_before: u32_column(row, "tokens_before")?,
                    tokens_after: u32_column(row, "tokens_after")?,
                    summary_id: uuid_column(row, "summary_id")?.map(SummaryId::from_bytes),
                    message: row.try_get("message")?,
                    created_at_ms: row.try_get("created_at_ms")?,
                })
            })
            .collect()
    }

    /// Commits in a row, newest first, that wrote no summary on plans based at `head`.
    pub async fn failed_commits_at(
        &self,
        session: Scoped,
        branch: &BranchName,
        head: NodeId,
    ) -> Result<usize> {
        let session = session.id();
        let mut conn = self.reader.acquire().await?;
        let rows = sqlx::query(
            "SELECT reason, base_head_id FROM compaction_events
             WHERE session_id = ? AND branch = ? AND kind IN ('committed', 'rejected')
             ORDER BY id DESC LIMIT 16",
        )
        .bind(session.as_bytes().as_slice())
        .bind(branch.as_str())
        .fetch_all(&mut *conn)
        .await?;
        let mut failed = 0;
        for row in &rows {
            let reason: Option<String> = row.try_get("reason")?;
            if reason.as_deref() == Some(Reason::Applied.as_str())
                || id_column(row, "base_head_id")? != Some(head)
            {
                break;
            }
            failed += 1;
        }
        Ok(failed)
    }

    /// The summarizer's earlier output for an identical source, if any.
    pub async fn summarizer_output(&self, source: &Hash) -> Result<Option<String>> {
        let mut conn = self.reader.acquire().await?;
        let row = sqlx::query("SELECT text FROM summarizer_outputs WHERE source_key = ?")
            .bind(source.0.as_slice())
            .fetch_optional(&mut *conn)
            .await?;
        Ok(row.map(|r| r.try_get("text")).transpose()?)
    }

    pub async fn save_summarizer_output(&self, source: &Hash, text: &str) -> Result<()> {
        let mut tx = self.begin_write().await?;
        sqlx::query(
            "INSERT INTO summarizer_outputs (source_key, text, created_at_ms) VALUES (?, ?, ?)
             ON CONFLICT (source_key) DO UPDATE SET text = excluded.text",
        )
        .bind(source.0.as_slice())
        .bind(text)
        .bind(now_ms())
        .execute(&mut *tx)
        .await?;
        tx.commit().await
    }
}

/// Records a summary that came with an imported session (a compaction made elsewhere): an
/// applied plan, the summary over `covers`, its event, and the session's count.
pub(super) async fn insert_imported_summary(
    conn: &mut SqliteConnection,
    session: SessionId,
    covers: &[NodeId],
    text: &str,
    base_head: NodeId,
    now: i64,
) -> Result<SummaryId> {
    let plan = CompactionPlan {
        id: CompactionId::new(),
        session,
        branch: BranchName::main(),
        base_head,
        kind: SummaryKind::Rolling,
        rolls_over: Vec::new(),
        covers: covers.to_vec(),
        range: None,
        ledger: Ledger::default(),
        budget: Budget::default(),
        tokenizer: "heuristic".to_owned(),
        max_tool_result_chars: 0,
        retain_turns: 0,
        instructions: "imported".to_owned(),
        tokens_before: 0,
        state: PlanState::Applied,
        created_at_ms: now,
    };
    sqlx::query(
        "INSERT INTO compactions (id, session_id, branch, base_head_id, prior_summary_id, covers,
             budget, tokenizer, max_tool_result_chars, retain_turns, instructions, tokens_before,
             state, created_at_ms)
         VALUES (?, ?, ?, ?, NULL, ?, '[0,0,0,0,0]', ?, 0, 0, ?, 0, 'applied', ?)",
    )
    .bind(plan.id.as_bytes().as_slice())
    .bind(session.as_bytes().as_slice())
    .bind(plan.branch.as_str())
    .bind(base_head.as_bytes().as_slice())
    .bind(pack(covers))
    .bind(&plan.tokenizer)
    .bind(&plan.instructions)
    .bind(now)
    .execute(&mut *conn)
    .await?;
    let summary = SummaryId::new();
    sqlx::query(
        "INSERT INTO summaries (id, session_id, compaction_id, prior_id, covers, text, model,
             base_head_id, tokens_before, tokens_after, created_at_ms)
         VALUES (?, ?, ?, NULL, ?, ?, 'imported', ?, 0, 0, ?)",
    )
    .bind(summary.as_bytes().as_slice())
    .bind(session.as_bytes().as_slice())
    .bind(plan.id.as_bytes().as_slice())
    .bind(pack(covers))
    .bind(text)
    .bind(base_head.as_bytes().as_slice())
    .bind(now)
    .execute(&mut *conn)
    .await?;
    sqlx::query("UPDATE sessions SET compaction_count = compaction_count + 1 WHERE id = ?")
        .bind(session.as_bytes().as_slice())
        .execute(&mut *conn)
        .await?;
    insert_event(
        conn,
        &plan,
        EventKind::Committed,
        Some(Reason::Applied),
        0,
        0,
        Some(summary),
        "imported with the session",
    )
    .await?;
    Ok(summary)
}
