//! The summary RPCs (`PrepareCompaction`, `CommitSummary`, `CancelCompaction`, `ListSummaries`,
//! `Compact`) and their answers: the compaction workflow's outcomes as protobuf.

use tonic::{Request, Status};

use super::parse::{self, branch_or_main, compaction_id, provider_format};
use super::{compaction, convert, pb, status, workflow_status};
use crate::domain::{CompactionId, Tenant};
use crate::store::{Scoped, ScopedPlan};
use crate::workflow::compaction::{
    CommitOutcome, CompactOutcome, PrepareArgs, PrepareOutcome, SummaryListing,
};

use super::service::{ContextStoreService, Reply, split, tenant_of};
use crate::domain::{Budget, CompactionEvent, Reason, SummaryKind};

impl ContextStoreService {
    pub(super) async fn prepare(
        &self,
        request: Request<pb::PrepareCompactionRequest>,
    ) -> Reply<pb::PrepareCompactionResponse> {
        let (tenant, r) = split(request);
        let format = provider_format(r.format)?;
        let args = PrepareArgs::try_from(r)?;
        let session = self.scope(&tenant, args.session).await?;
        let budget = args.budget;
        let outcome = self
            .compactions
            .prepare(session, args)
            .await
            .map_err(workflow_status)?;
        let plan = match &outcome {
            PrepareOutcome::Needed { scoped, .. } => Some(*scoped),
            PrepareOutcome::NotNeeded { .. } => None,
        };
        let response = compaction::prepare_response(outcome, budget, format);
        let replied = self.reply(response);
        if let (Err(_), Some(plan)) = (&replied, plan) {
            // Nobody can commit a summary of an input they never received.
            self.compactions
                .cancel(plan, "the summary input was over --max-response-bytes")
                .await
                .map_err(workflow_status)?;
        }
        replied
    }

    pub(super) async fn commit(
        &self,
        request: Request<pb::CommitSummaryRequest>,
    ) -> Reply<pb::CompactionOutcome> {
        let (tenant, r) = split(request);
        let id = compaction_id(&r.compaction_id)?;
        let (session, plan) = match self.scope_compaction(&tenant, id).await {
            Ok(scoped) => scoped,
            Err(unknown) => match self.deleted_plan(&tenant, id).await? {
                Some(outcome) => return self.reply(compaction::commit_outcome(outcome)),
                None => return Err(unknown),
            },
        };
        let outcome = self
            .compactions
            .commit(session, plan, r.text, r.model, true)
            .await
            .map_err(workflow_status)?;
        self.reply(compaction::commit_outcome(outcome))
    }

    pub(super) async fn cancel(
        &self,
        request: Request<pb::CancelCompactionRequest>,
    ) -> Reply<pb::CancelCompactionResponse> {
        let (tenant, r) = split(request);
        let id = compaction_id(&r.compaction_id)?;
        let (_, plan) = match self.scope_compaction(&tenant, id).await {
            Ok(scoped) => scoped,
            // Its session is gone, and the plan with it: there is nothing left to cancel.
            Err(unknown) => match self.deleted_plan(&tenant, id).await? {
                Some(_) => return self.reply(pb::CancelCompactionResponse {}),
                None => return Err(unknown),
            },
        };
        let reason = parse::cancel_reason(r.reason);
        self.compactions
            .cancel(plan, &reason)
            .await
            .map_err(workflow_status)?;
        self.reply(pb::CancelCompactionResponse {})
    }

    pub(super) async fn summaries(
        &self,
        request: Request<pb::ListSummariesRequest>,
    ) -> Reply<pb::ListSummariesResponse> {
        let (r, session) = self.open(request, |r| &r.session_id).await?;
        let branch = branch_or_main("branch", &r.branch)?;
        let listing = self
            .compactions
            .summaries(session, branch)
            .await
            .map_err(workflow_status)?;
        self.reply(compaction::summaries_response(listing))
    }

    pub(super) async fn compact_branch(
        &self,
        request: Request<pb::CompactRequest>,
    ) -> Reply<pb::CompactionOutcome> {
        let tenant = tenant_of(&request);
        let args = PrepareArgs::try_from(request.into_inner())?;
        let session = self.scope(&tenant, args.session).await?;
        let outcome = self
            .compactions
            .compact(session, args)
            .await
            .map_err(workflow_status)?;
        self.reply(compaction::compact_outcome(outcome))
    }

    /// Lets `tenant` at compaction `id`, or answers exactly what an unknown compaction answers.
    async fn scope_compaction(
        &self,
        tenant: &Tenant,
        id: CompactionId,
    ) -> Result<(Scoped, ScopedPlan), Status> {
        self.compactions
            .scope(tenant, id)
            .await
            .map_err(workflow_status)
    }

    /// The stale outcome of compaction `id` of `tenant`, when its session was deleted while the
    /// plan was open (a live plan, or another tenant's, answers `None`).
    async fn deleted_plan(
        &self,
        tenant: &Tenant,
        id: CompactionId,
    ) -> Result<Option<crate::workflow::compaction::CommitOutcome>, Status> {
        let found = self.store.plan_tombstone(id).await.map_err(status)?;
        Ok(found
            .filter(|t| &t.tenant == tenant)
            .map(|_| crate::workflow::compaction::CommitOutcome::session_deleted(id)))
    }
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

/// Prepare's answer, under `budget`: the ledger text is the one the summary will carry.
pub(super) fn prepare_response(
    outcome: PrepareOutcome,
    budget: Budget,
    format: Option<crate::provider::format::Format>,
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
        PrepareOutcome::Needed {
            plan,
            prepared,
            evidence,
            request,
            ..
        } => pb::PrepareCompactionResponse {
            needed: true,
            summary_request_json: match (&request, format) {
                (Some(request), Some(f)) => crate::provider::format::document(f, &request.messages),
                _ => String::new(),
            },
            summary_request: request
                .map(|r| {
                    r.messages
                        .into_iter()
                        .zip(r.tokens)
                        .map(|(m, t)| convert::rendered(m, t))
                        .collect()
                })
                .unwrap_or_default(),
            ledger: Some(convert::ledger(&prepared.ledger)),
            ledger_text: evidence,
            rolls_over_ids: plan.rolls_over.iter().map(ToString::to_string).collect(),
            kind: convert::summary_kind(plan.kind).into(),
            summary_input_json: format
                .map(|f| crate::provider::format::document(f, &prepared.input))
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
                SummaryKind::Rolling => format!(
                    "{} tokens exceed the history budget of {history_budget}",
                    plan.tokens_before
                ),
                SummaryKind::Segment => format!(
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

/// CommitSummary's answer.
pub(super) fn commit_outcome(outcome: CommitOutcome) -> pb::CompactionOutcome {
    pb::CompactionOutcome {
        applied: outcome.applied(),
        summary_id: outcome.summary.map(|s| s.to_string()).unwrap_or_default(),
        tokens_before: outcome.tokens_before,
        tokens_after: outcome.tokens_after,
        reason: reason(outcome.reason).into(),
        message: outcome.message,
        compaction_id: outcome.compaction.to_string(),
    }
}

/// Compact's answer; with nothing to summarize there is no plan, so no compaction id.
pub(super) fn compact_outcome(outcome: CompactOutcome) -> pb::CompactionOutcome {
    match outcome {
        CompactOutcome::NotNeeded {
            tokens_before,
            reason,
        } => pb::CompactionOutcome {
            applied: false,
            tokens_before,
            tokens_after: tokens_before,
            reason: pb::CompactionReason::NotNeeded.into(),
            message: reason,
            ..Default::default()
        },
        CompactOutcome::Planned(outcome) => commit_outcome(outcome),
    }
}

/// ListSummaries' answer.
pub(super) fn summaries_response(listing: SummaryListing) -> pb::ListSummariesResponse {
    pb::ListSummariesResponse {
        summaries: listing
            .summaries
            .into_iter()
            .map(|listed| {
                let s = listed.summary;
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
                    applies: listed.applies,
                    active: listed.active,
                }
            })
            .collect(),
        events: listing.events.into_iter().map(event).collect(),
    }
}

pub(super) fn event(e: CompactionEvent) -> pb::CompactionEvent {
    pb::CompactionEvent {
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
    }
}
