//! The summary RPCs: prepare, commit, cancel, list; each parses, calls, converts.

use tonic::Status;

use super::service::{ContextStoreService, branch_or_main, parse, session_id, tokenizer};
use super::{convert, domain_status, pb, status};
use crate::compact::{self, Plan, Prepared, Verdict};
use crate::domain::{
    BranchName, Budget, CompactionId, Error, Hash, NodeId, PathView, Reason, SessionId, Summary,
    SummaryId, Tenant,
};
use crate::render::{self, Policy};
use crate::store::{self, Applied, CompactionPlan, PathTarget, PlanState, now_ms};
use crate::tokens::Tokenizer;

/// How often a commit re-judges when the branch head moves between verdict and write.
const COMMIT_ATTEMPTS: usize = 3;
/// Commits in a row without a summary, on the same base, before Prepare refuses.
pub(crate) const LOOP_GUARD: usize = 3;

/// A Prepare request, parsed.
pub(crate) struct PrepareArgs {
    pub session: SessionId,
    pub branch: BranchName,
    pub budget: Budget,
    pub tokenizer: Tokenizer,
    pub retain_turns: usize,
    pub instructions: String,
    pub max_tool_result_chars: usize,
    /// A segment summary's first and last node; `None` for a rolling summary.
    pub segment: Option<(NodeId, NodeId)>,
}

/// A segment's two ends: both or neither.
fn segment(from: &str, to: &str) -> Result<Option<(NodeId, NodeId)>, Status> {
    match (from.is_empty(), to.is_empty()) {
        (true, true) => Ok(None),
        (false, true) => Err(domain_status(Error::invalid(
            "to_node_id",
            "is required with from_node_id",
        ))),
        (true, false) => Err(domain_status(Error::invalid(
            "from_node_id",
            "is required with to_node_id",
        ))),
        (false, false) => Ok(Some((
            parse(NodeId::parse("from_node_id", from))?,
            parse(NodeId::parse("to_node_id", to))?,
        ))),
    }
}

/// `PrepareCompaction` and `Compact` carry the same fields: one parse serves both.
macro_rules! prepare_args_from {
    ($request:ty) => {
        impl TryFrom<$request> for PrepareArgs {
            type Error = Status;

            fn try_from(r: $request) -> Result<Self, Status> {
                // Compaction measures with ctxd's first reduction (a 4000-character cut), so
                // when a summary is needed does not move with the render policy's defaults.
                let defaults = Policy::over_budget();
                let or = |value: u32, default: usize| {
                    if value == 0 { default } else { value as usize }
                };
                let segment = segment(&r.from_node_id, &r.to_node_id)?;
                // A segment is the caller's choice, not the budget's: without a budget it is
                // measured whole, and its ledger bounded by its per-category caps alone.
                let budget = match (parse(convert::budget(r.budget))?, segment) {
                    (Some(budget), _) => budget,
                    (None, Some(_)) => Budget {
                        context_window: u32::MAX,
                        ..Budget::default()
                    },
                    (None, None) => {
                        return Err(domain_status(Error::invalid(
                            "budget",
                            "is required (unless from_node_id and to_node_id choose a segment)",
                        )));
                    }
                };
                Ok(Self {
                    session: session_id(&r.session_id)?,
                    branch: branch_or_main("branch", &r.branch)?,
                    budget,
                    tokenizer: tokenizer(&r.tokenizer)?,
                    retain_turns: or(r.retain_turns, defaults.retain_turns),
                    instructions: r.instructions,
                    max_tool_result_chars: or(
                        r.max_tool_result_chars,
                        defaults.max_tool_result_chars,
                    ),
                    segment,
                })
            }
        }
    };
}

prepare_args_from!(pb::PrepareCompactionRequest);
prepare_args_from!(pb::CompactRequest);

/// What Prepare answered: nothing to do, or a stored plan and the input to summarize.
pub(crate) enum PrepareOutcome {
    NotNeeded {
        tokens_before: u32,
        reason: String,
    },
    Needed {
        plan: Box<CompactionPlan>,
        prepared: Box<Plan>,
    },
}

fn u32_of(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

fn reason(r: Reason) -> pb::CompactionReason {
    match r {
        Reason::Applied => pb::CompactionReason::Applied,
        Reason::Empty => pb::CompactionReason::Empty,
        Reason::NoGain => pb::CompactionReason::NoGain,
        Reason::Stale => pb::CompactionReason::Stale,
        Reason::Cancelled => pb::CompactionReason::Cancelled,
        Reason::Failed => pb::CompactionReason::Failed,
    }
}

/// Loads a branch's path; a branch that is gone has an empty path.
async fn branch_path(
    store: &store::Store,
    session: SessionId,
    branch: &BranchName,
) -> Result<PathView, Status> {
    match store
        .load_path(session, &PathTarget::Branch(branch.clone()))
        .await
    {
        Err(store::Error::Domain(Error::NotFound { what: "branch", .. })) => {
            Ok(PathView::default())
        }
        other => other.map_err(status),
    }
}

impl ContextStoreService {
    pub(crate) async fn prepare(&self, args: PrepareArgs) -> Result<PrepareOutcome, Status> {
        let path = self
            .store
            .load_path(args.session, &PathTarget::Branch(args.branch.clone()))
            .await
            .map_err(status)?;
        let Some(head) = path.nodes.last().map(|n| n.id) else {
            return Ok(PrepareOutcome::NotNeeded {
                tokens_before: 0,
                reason: "the branch is empty".to_owned(),
            });
        };
        let failed = self
            .store
            .failed_commits_at(args.session, &args.branch, head)
            .await
            .map_err(status)?;
        if failed >= LOOP_GUARD {
            return Err(domain_status(Error::FailedPrecondition(format!(
                "branch: the last {failed} commits on head {head} wrote no summary; append to \
                 the branch before preparing again"
            ))));
        }
        let cache = std::sync::Arc::clone(&self.tokens);
        let (budget, retain, chars, tok, segment) = (
            args.budget,
            args.retain_turns,
            args.max_tool_result_chars,
            args.tokenizer,
            args.segment,
        );
        let prepared = tokio::task::spawn_blocking(move || {
            let counter = cache.counter(tok);
            match segment {
                Some((from, to)) => {
                    compact::prepare_segment(&path, from, to, budget, chars, &counter)
                }
                None => Ok(compact::prepare(&path, budget, retain, chars, &counter)),
            }
        })
        .await
        .map_err(|_| Status::internal("prepare failed"))?
        .map_err(domain_status)?;
        let prepared = match prepared {
            Prepared::NotNeeded {
                tokens_before,
                reason,
            } => {
                return Ok(PrepareOutcome::NotNeeded {
                    tokens_before,
                    reason,
                });
            }
            Prepared::Needed(plan) => plan,
        };
        let plan = CompactionPlan {
            id: CompactionId::new(),
            session: args.session,
            branch: args.branch,
            base_head: head,
            kind: prepared.kind,
            rolls_over: prepared.rolls_over.clone(),
            covers: prepared.covers.clone(),
            range: prepared.range,
            ledger: prepared.ledger.clone(),
            budget: args.budget,
            tokenizer: args.tokenizer.name().to_owned(),
            max_tool_result_chars: u32_of(args.max_tool_result_chars),
            retain_turns: u32_of(args.retain_turns),
            instructions: args.instructions,
            tokens_before: prepared.tokens_before,
            state: PlanState::Open,
            created_at_ms: now_ms(),
        };
        self.store.save_plan(&plan).await.map_err(status)?;
        Ok(PrepareOutcome::Needed {
            plan: Box::new(plan),
            prepared,
        })
    }

    pub(crate) fn prepare_response(
        &self,
        outcome: PrepareOutcome,
        budget: Budget,
        tokenizer: Tokenizer,
        format: Option<render::format::Format>,
    ) -> pb::PrepareCompactionResponse {
        let history_budget = budget.history().unwrap_or(0);
        match outcome {
            PrepareOutcome::NotNeeded {
                tokens_before,
                reason,
            } => pb::PrepareCompactionResponse {
                needed: false,
                tokens_before,
                reason,
                history_budget,
                ..Default::default()
            },
            PrepareOutcome::Needed { plan, prepared } => pb::PrepareCompactionResponse {
                needed: true,
                ledger: Some(convert::ledger(&prepared.ledger)),
                ledger_text: prepared.ledger.render(
                    render::ledger_cap(Some(history_budget)),
                    &self.tokens.counter(tokenizer),
                ),
                rolls_over_ids: plan.rolls_over.iter().map(ToString::to_string).collect(),
                kind: convert::summary_kind(plan.kind).into(),
                summary_input_json: format
                    .map(|f| render::format::document(f, &prepared.input))
                    .unwrap_or_default(),
                compaction_id: plan.id.to_string(),
                base_head_id: plan.base_head.to_string(),
                covers_ids: plan.covers.iter().map(ToString::to_string).collect(),
                prior_summary_id: plan
                    .rolls_over
                    .first()
                    .map(|p| p.to_string())
                    .unwrap_or_default(),
                summary_input: prepared
                    .input
                    .into_iter()
                    .map(|m| convert::rendered(m, 0))
                    .collect(),
                tokens_before: plan.tokens_before,
                input_tokens: prepared.input_tokens,
                reason: match plan.kind {
                    crate::domain::SummaryKind::Rolling => format!(
                        "{} tokens exceed the history budget of {history_budget}",
                        plan.tokens_before
                    ),
                    crate::domain::SummaryKind::Segment => format!(
                        "a segment of {} nodes, {} tokens as rendered now",
                        plan.covers.len(),
                        prepared.input_tokens
                    ),
                },
                history_budget,
                retained_turns: u32_of(prepared.retained_turns),
            },
        }
    }

    /// Judges `text` against the plan on the branch's current head and stores it if it helps.
    /// With `keep_open`, a rejected plan takes another commit (a host may try a better text).
    pub(crate) async fn commit(
        &self,
        id: CompactionId,
        text: String,
        model: String,
        keep_open: bool,
    ) -> Result<pb::CompactionOutcome, Status> {
        let plan = self.store.plan(id).await.map_err(status)?;
        if plan.state != PlanState::Open {
            return Err(domain_status(Error::FailedPrecondition(format!(
                "compaction_id: compaction {id} is {}",
                if plan.state == PlanState::Applied {
                    "already applied"
                } else {
                    "cancelled"
                }
            ))));
        }
        let tokenizer = Tokenizer::parse(&plan.tokenizer)
            .ok_or_else(|| Status::data_loss("a stored plan names an unknown tokenizer"))?;
        let outcome = |applied: bool,
                       r: Reason,
                       before: u32,
                       after: u32,
                       summary: Option<SummaryId>,
                       message: String| {
            pb::CompactionOutcome {
                applied,
                summary_id: summary.map(|s| s.to_string()).unwrap_or_default(),
                tokens_before: before,
                tokens_after: after,
                reason: reason(r).into(),
                message,
                compaction_id: id.to_string(),
            }
        };
        for _ in 0..COMMIT_ATTEMPTS {
            let path = branch_path(&self.store, plan.session, &plan.branch).await?;
            let head = path.nodes.last().map(|n| n.id);
            let mut summary = Summary {
                id: SummaryId::new(),
                compaction_id: id,
                kind: plan.kind,
                covers: plan.covers.clone(),
                range: plan.range,
                text: text.clone(),
                rolls_over: plan.rolls_over.clone(),
                ledger: Some(std::sync::Arc::new(plan.ledger.clone())),
                model: model.clone(),
                base_head: plan.base_head,
                tokens_before: 0,
                tokens_after: 0,
                created_at_ms: now_ms(),
            };
            let cache = std::sync::Arc::clone(&self.tokens);
            let (budget, chars) = (plan.budget, plan.max_tool_result_chars as usize);
            let judged = summary.clone();
            let verdict = tokio::task::spawn_blocking(move || {
                compact::judge(path, &judged, budget, chars, &cache.counter(tokenizer))
            })
            .await
            .map_err(|_| Status::internal("commit failed"))?;
            let (r, before, after, message) = match verdict {
                Verdict::Apply { before, after } => {
                    let Some(head) = head else { continue };
                    summary.tokens_before = before;
                    summary.tokens_after = after;
                    match self
                        .store
                        .apply_summary(id, &summary, head)
                        .await
                        .map_err(status)?
                    {
                        Applied::HeadMoved => continue,
                        Applied::Stored => {
                            metrics::counter!("ctxd_summaries_total", "outcome" => "applied")
                                .increment(1);
                            return Ok(outcome(
                                true,
                                Reason::Applied,
                                before,
                                after,
                                Some(summary.id),
                                format!("{before} → {after} tokens"),
                            ));
                        }
                    }
                }
                Verdict::Empty { before } => (
                    Reason::Empty,
                    before,
                    before,
                    "the summary text is empty".to_owned(),
                ),
                Verdict::NoGain { before, after } => (
                    Reason::NoGain,
                    before,
                    after,
                    format!("the summary would not shrink the context: {before} → {after} tokens"),
                ),
                Verdict::Stale { before } => (
                    Reason::Stale,
                    before,
                    before,
                    "a covered node left the branch, or a summary over its range changed, since \
                     prepare"
                        .to_owned(),
                ),
            };
            self.store
                .reject(id, r, (before, after), &message, keep_open)
                .await
                .map_err(status)?;
            metrics::counter!("ctxd_summaries_total", "outcome" => r.as_str()).increment(1);
            return Ok(outcome(false, r, before, after, None, message));
        }
        Err(Status::aborted(
            "the branch kept moving while the summary was judged; commit again",
        ))
    }

    pub(crate) async fn summaries_of(
        &self,
        session: SessionId,
        branch: BranchName,
    ) -> Result<pb::ListSummariesResponse, Status> {
        let summaries = self.store.summaries(session).await.map_err(status)?;
        let mut path = branch_path(&self.store, session, &branch).await?;
        path.summaries = summaries;
        let on_path = path.node_ids();
        let active: std::collections::HashSet<SummaryId> = render::active_summaries(&path)
            .iter()
            .map(|s| s.id)
            .collect();
        let events = self
            .store
            .events(session, Some(&branch))
            .await
            .map_err(status)?;
        Ok(pb::ListSummariesResponse {
            summaries: path
                .summaries
                .into_iter()
                .map(|s| {
                    let applies = render::applies(&s, &on_path);
                    pb::SummaryRecord {
                        summary_id: s.id.to_string(),
                        compaction_id: s.compaction_id.to_string(),
                        covers_ids: s.covers.iter().map(ToString::to_string).collect(),
                        prior_summary_id: s
                            .rolls_over
                            .first()
                            .map(|p| p.to_string())
                            .unwrap_or_default(),
                        kind: convert::summary_kind(s.kind).into(),
                        from_node_id: s.range.map(|r| r.0.to_string()).unwrap_or_default(),
                        to_node_id: s.range.map(|r| r.1.to_string()).unwrap_or_default(),
                        rolls_over_ids: s.rolls_over.iter().map(ToString::to_string).collect(),
                        ledger: s.ledger.as_deref().map(convert::ledger),
                        text: s.text,
                        model: s.model,
                        base_head_id: s.base_head.to_string(),
                        tokens_before: s.tokens_before,
                        tokens_after: s.tokens_after,
                        created_at_unix_ms: s.created_at_ms,
                        applies,
                        active: active.contains(&s.id),
                    }
                })
                .collect(),
            events: events
                .into_iter()
                .map(|e| pb::CompactionEvent {
                    compaction_id: e.compaction_id.to_string(),
                    branch: e.branch,
                    kind: e.kind.as_str().to_owned(),
                    reason: e
                        .reason
                        .map_or(pb::CompactionReason::Unspecified, reason)
                        .into(),
                    base_head_id: e.base_head.map(|h| h.to_string()).unwrap_or_default(),
                    tokens_before: e.tokens_before,
                    tokens_after: e.tokens_after,
                    summary_id: e.summary_id.map(|s| s.to_string()).unwrap_or_default(),
                    message: e.message,
                    created_at_unix_ms: e.created_at_ms,
                })
                .collect(),
        })
    }
}

/// Closes a plan as cancelled if the Compact call is dropped (client cancel or deadline)
/// before it finished: nothing is written but the event.
struct CloseOnDrop {
    store: store::Store,
    plan: Option<CompactionId>,
}

impl CloseOnDrop {
    fn disarm(&mut self) {
        self.plan = None;
    }
}

impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        let (Some(plan), Ok(runtime)) = (self.plan, tokio::runtime::Handle::try_current()) else {
            return;
        };
        let store = self.store.clone();
        runtime.spawn(async move {
            let message = "the Compact call was cancelled or its deadline passed";
            match store.close_plan(plan, Reason::Cancelled, message).await {
                Ok(()) => {
                    metrics::counter!("ctxd_summaries_total", "outcome" => "cancelled").increment(1)
                }
                Err(e) => tracing::debug!(error = %e, "closing a dropped compaction"),
            }
        });
    }
}

/// What identifies a summary's source: the same summaries rolled over, the same covered nodes by
/// hash, the same model and instructions.
fn source_key(rolls_over: &[SummaryId], source: &Hash, model: &str, instructions: &str) -> Hash {
    let mut h = blake3::Hasher::new();
    h.update(b"ctxd/summary-source/v1");
    match rolls_over {
        [] => {
            h.update(&[0u8; 16]);
        }
        // One prior keeps the key it always had.
        [prior] => {
            h.update(prior.as_bytes());
        }
        many => {
            for id in many {
                h.update(id.as_bytes());
            }
        }
    }
    h.update(&source.0);
    for s in [model, instructions] {
        h.update(&(s.len() as u64).to_le_bytes());
        h.update(s.as_bytes());
    }
    Hash(*h.finalize().as_bytes())
}

impl ContextStoreService {
    /// Lets `tenant` at compaction `id`: a plan of another tenant's session answers exactly
    /// what an unknown plan does, after the same single lookup.
    pub(crate) async fn scope_compaction(
        &self,
        tenant: &Tenant,
        id: CompactionId,
    ) -> Result<(), Status> {
        match self.store.compaction_tenant(id).await.map_err(status)? {
            Some(owner) if &owner == tenant => Ok(()),
            _ => Err(domain_status(Error::not_found("compaction", id))),
        }
    }

    /// Prepare, the server's summarizer, commit.
    pub(crate) async fn compact_with_summarizer(
        &self,
        args: PrepareArgs,
    ) -> Result<pb::CompactionOutcome, Status> {
        let Some(summarizer) = self.summarizer.clone() else {
            return Err(domain_status(Error::FailedPrecondition(
                "no summarizer is configured: start the server with --summarizer-url URL \
                 --summarizer-model NAME (an OpenAI-compatible chat-completions endpoint)"
                    .to_owned(),
            )));
        };
        let tokenizer = args.tokenizer;
        let instructions = args.instructions.clone();
        let (plan, prepared) = match self.prepare(args).await? {
            PrepareOutcome::NotNeeded {
                tokens_before,
                reason,
            } => {
                return Ok(pb::CompactionOutcome {
                    applied: false,
                    tokens_before,
                    tokens_after: tokens_before,
                    reason: pb::CompactionReason::NotNeeded.into(),
                    message: reason,
                    ..Default::default()
                });
            }
            PrepareOutcome::Needed { plan, prepared } => (plan, prepared),
        };
        let mut guard = CloseOnDrop {
            store: self.store.clone(),
            plan: Some(plan.id),
        };
        let model = summarizer.model().to_owned();
        let key = source_key(
            &plan.rolls_over,
            &prepared.source_hash,
            &model,
            &instructions,
        );
        let evidence = prepared.ledger.render(
            render::ledger_cap(plan.budget.history().ok()),
            &self.tokens.counter(tokenizer),
        );
        let text = match self.store.summarizer_output(&key).await.map_err(status)? {
            Some(text) => text,
            None => {
                let counter = self.tokens.counter(tokenizer);
                match summarizer
                    .summarize(&prepared.input, &evidence, &instructions, &counter)
                    .await
                {
                    Ok(text) => text,
                    Err(e) => {
                        guard.disarm();
                        let message = e.to_string();
                        tracing::warn!(error = %message, "summarizer failed");
                        self.store
                            .close_plan(plan.id, Reason::Failed, &message)
                            .await
                            .map_err(status)?;
                        metrics::counter!("ctxd_summaries_total", "outcome" => "failed")
                            .increment(1);
                        return Ok(pb::CompactionOutcome {
                            applied: false,
                            tokens_before: plan.tokens_before,
                            tokens_after: plan.tokens_before,
                            reason: pb::CompactionReason::Failed.into(),
                            message,
                            compaction_id: plan.id.to_string(),
                            ..Default::default()
                        });
                    }
                }
            }
        };
        let outcome = self.commit(plan.id, text.clone(), model, false).await;
        guard.disarm();
        let outcome = outcome?;
        // Keep the text for this source unless the text itself was the problem (empty, no
        // gain): a stale base says nothing against it.
        let reason = pb::CompactionReason::try_from(outcome.reason);
        if matches!(
            reason,
            Ok(pb::CompactionReason::Applied | pb::CompactionReason::Stale)
        ) {
            self.store
                .save_summarizer_output(&key, &text)
                .await
                .map_err(status)?;
        }
        Ok(outcome)
    }
}
