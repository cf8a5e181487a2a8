//! The summary RPCs' answers: the compaction workflow's outcomes as protobuf.

use super::{convert, pb};
use crate::domain::{Budget, CompactionEvent, Reason, SummaryKind};
use crate::workflow::compaction::{CommitOutcome, CompactOutcome, PrepareOutcome, SummaryListing};

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
