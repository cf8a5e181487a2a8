//! Compaction plans, summaries and their audit trail.

use super::{Result, Scoped, ScopedPlan, Store};
use crate::domain::{
    self, BranchName, Budget, CompactionEvent, CompactionId, EventKind, Hash, Ledger, NodeId,
    Reason, SessionId, Summary, SummaryId, SummaryKind, Tenant,
};
use crate::store::backend::{NewEvent, WriteTx};
use crate::store::form::clock::now_ms;

/// Where a compaction plan stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlanState {
    /// Prepared; commits may be tried until one applies or it is cancelled.
    Open,
    Applied,
    Cancelled,
}

impl PlanState {
    pub fn as_str(self) -> &'static str {
        match self {
            PlanState::Open => "open",
            PlanState::Applied => "applied",
            PlanState::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "open" => PlanState::Open,
            "applied" => PlanState::Applied,
            "cancelled" => PlanState::Cancelled,
            _ => return None,
        })
    }
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

impl Store {
    /// Stores a prepared plan and its `prepared` event.
    pub async fn save_plan(&self, session: Scoped, plan: &CompactionPlan) -> Result<ScopedPlan> {
        if plan.session != session.id() {
            return Err(domain::Error::not_found("session", plan.session).into());
        }
        let mut tx = self.begin_write().await?;
        tx.insert_plan(plan).await?;
        let message = format!("{} nodes to summarize", plan.covers.len());
        let tokens = (plan.tokens_before, 0);
        tx.insert_event(&event(
            plan,
            EventKind::Prepared,
            None,
            tokens,
            None,
            &message,
        ))
        .await?;
        tx.commit().await?;
        self.changes.touched(plan.session);
        Ok(ScopedPlan::trusted(plan.session, plan.id))
    }

    /// The tenant whose session compaction `id` belongs to; `None` for an unknown plan. One
    /// lookup either way, so a caller cannot tell an unknown plan from another tenant's.
    pub(super) async fn compaction_owner(
        &self,
        id: CompactionId,
    ) -> Result<Option<(SessionId, Tenant)>> {
        self.read().await?.compaction_owner(id).await
    }

    pub async fn plan(&self, id: ScopedPlan) -> Result<CompactionPlan> {
        self.read().await?.plan(id.session(), id.id()).await
    }

    /// Stores `summary` if the plan is open and the branch head is still `expected_head`, in
    /// one transaction with its event and the session's compaction count: the compare-and-swap
    /// of a summary on the head it was judged at.
    pub async fn apply_summary(
        &self,
        plan_id: ScopedPlan,
        summary: &Summary,
        expected_head: NodeId,
    ) -> Result<Applied> {
        let mut tx = self.begin_write().await?;
        let plan = tx.plan(plan_id.session(), plan_id.id()).await?;
        ensure_open(&plan)?;
        if tx.branch_head(plan.session, &plan.branch).await? != Some(expected_head) {
            return Ok(Applied::HeadMoved);
        }
        tx.insert_summary(plan.session, summary).await?;
        tx.set_plan_state(plan.session, plan.id, PlanState::Applied)
            .await?;
        tx.count_compaction(plan.session).await?;
        let message = format!("model {:?}", summary.model);
        tx.insert_event(&applied(&plan, summary, &message)).await?;
        tx.commit().await?;
        self.changes.touched(plan.session);
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
        let closes = (!keep_open).then_some(EventKind::Rejected);
        self.record_outcome(plan_id, reason, Some(tokens), message, closes)
            .await
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
        let kind = if reason == Reason::Cancelled {
            EventKind::Cancelled
        } else {
            EventKind::Rejected
        };
        self.record_outcome(plan_id, reason, None, message, Some(kind))
            .await
    }

    /// Records an outcome of an open plan other than its summary, as a `Rejected` event, or
    /// closes the plan with an event of kind `closes`; `tokens` are the plan's own when not
    /// given.
    async fn record_outcome(
        &self,
        plan_id: ScopedPlan,
        reason: Reason,
        tokens: Option<(u32, u32)>,
        message: &str,
        closes: Option<EventKind>,
    ) -> Result<()> {
        let mut tx = self.begin_write().await?;
        let plan = tx.plan(plan_id.session(), plan_id.id()).await?;
        ensure_open(&plan)?;
        if closes.is_some() {
            tx.set_plan_state(plan.session, plan.id, PlanState::Cancelled)
                .await?;
        }
        let kind = closes.unwrap_or(EventKind::Rejected);
        let tokens = tokens.unwrap_or((plan.tokens_before, plan.tokens_before));
        tx.insert_event(&event(&plan, kind, Some(reason), tokens, None, message))
            .await?;
        tx.commit().await?;
        self.changes.touched(plan.session);
        Ok(())
    }

    pub async fn summaries(&self, session: Scoped) -> Result<Vec<Summary>> {
        let (mut conn, session) = self.read_session(session).await?;
        conn.summaries(session).await
    }

    /// The audit trail of a session (one branch's, if given), oldest first.
    pub async fn events(
        &self,
        session: Scoped,
        branch: Option<&BranchName>,
    ) -> Result<Vec<CompactionEvent>> {
        let (mut conn, session) = self.read_session(session).await?;
        conn.events(session, branch).await
    }

    /// Commits in a row, newest first, that wrote no summary on plans based at `head`.
    pub async fn failed_commits_at(
        &self,
        session: Scoped,
        branch: &BranchName,
        head: NodeId,
    ) -> Result<usize> {
        let recent = self
            .read()
            .await?
            .recent_commits(session.id(), branch, 16)
            .await?;
        Ok(recent
            .iter()
            .take_while(|(reason, base)| *reason != Some(Reason::Applied) && *base == Some(head))
            .count())
    }

    /// The summarizer's earlier output for an identical source, if any.
    pub async fn summarizer_output(&self, source: &Hash) -> Result<Option<String>> {
        self.read().await?.summarizer_output(source).await
    }

    /// Keeps the summarizer's output for `source`, which `session` used. Where the engine
    /// records the use, it commits that first on its own: the record and the output are
    /// distributed by different keys, and a record without its output is harmless.
    pub async fn save_summarizer_output(
        &self,
        session: SessionId,
        source: &Hash,
        text: &str,
    ) -> Result<()> {
        let mut tx = self.begin_write().await?;
        if tx.record_summarizer_source(session, source).await? {
            tx.commit().await?;
            tx = self.begin_write().await?;
        }
        tx.save_summarizer_output(source, text, now_ms()).await?;
        tx.commit().await
    }
}

/// Records a summary that came with an imported session (a compaction made elsewhere): an
/// applied plan, the summary over `covers`, its event, and the session's count.
pub(super) async fn insert_imported_summary(
    tx: &mut dyn WriteTx,
    session: SessionId,
    covers: &[NodeId],
    text: &str,
    base_head: NodeId,
    now: i64,
) -> Result<SummaryId> {
    let summary = Summary {
        id: SummaryId::new(),
        compaction_id: CompactionId::new(),
        kind: SummaryKind::Rolling,
        covers: covers.to_vec(),
        range: None,
        text: text.to_owned(),
        rolls_over: Vec::new(),
        ledger: None,
        model: "imported".to_owned(),
        base_head,
        tokens_before: 0,
        tokens_after: 0,
        created_at_ms: now,
    };
    insert_applied_summary(tx, session, &summary, now).await?;
    Ok(summary.id)
}

/// Records `summary` (whose compaction id is new) as applied on `main`: its plan, the summary,
/// its event and the session's count; an import's summaries come with no plan of their own.
pub(super) async fn insert_applied_summary(
    tx: &mut dyn WriteTx,
    session: SessionId,
    summary: &Summary,
    now: i64,
) -> Result<()> {
    let plan = CompactionPlan {
        id: summary.compaction_id,
        session,
        branch: BranchName::main(),
        base_head: summary.base_head,
        kind: summary.kind,
        rolls_over: summary.rolls_over.clone(),
        covers: summary.covers.clone(),
        range: summary.range,
        ledger: summary.ledger.as_deref().cloned().unwrap_or_default(),
        budget: Budget::default(),
        tokenizer: "heuristic".to_owned(),
        max_tool_result_chars: 0,
        retain_turns: 0,
        instructions: "imported".to_owned(),
        tokens_before: summary.tokens_before,
        state: PlanState::Applied,
        created_at_ms: now,
    };
    tx.insert_plan(&plan).await?;
    tx.insert_summary(session, summary).await?;
    tx.count_compaction(session).await?;
    tx.insert_event(&NewEvent {
        at: now,
        ..applied(&plan, summary, "imported with the session")
    })
    .await
}

/// The event of `plan`, at this moment.
fn event<'a>(
    plan: &'a CompactionPlan,
    kind: EventKind,
    reason: Option<Reason>,
    (tokens_before, tokens_after): (u32, u32),
    summary: Option<SummaryId>,
    message: &'a str,
) -> NewEvent<'a> {
    NewEvent {
        plan,
        kind,
        reason,
        tokens_before,
        tokens_after,
        summary,
        message,
        at: now_ms(),
    }
}

/// The event of `summary` applied on `plan`.
fn applied<'a>(plan: &'a CompactionPlan, summary: &Summary, message: &'a str) -> NewEvent<'a> {
    let tokens = (summary.tokens_before, summary.tokens_after);
    let reason = Some(Reason::Applied);
    event(
        plan,
        EventKind::Committed,
        reason,
        tokens,
        Some(summary.id),
        message,
    )
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
