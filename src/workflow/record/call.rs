//! A model call as a door hands it to the workflow (`Call`): recorded, located, recorded once
//! located, the path it renders loaded, its conversation's ledger state kept, and an agent's
//! own summary laid over the history it replaced.

use super::{AgentSummary, Located, Recorded, Unrecorded, locate, record, record_located};
use crate::domain::{Budget, PathView, Tenant};
use crate::provider::conversation::Conversation;
use crate::store::{PathTarget, Scoped};
use crate::tokens::Tokenizer;
use crate::workflow::Workflows;
use crate::workflow::compaction::{PrepareArgs, PrepareOutcome};

/// Who makes a model call and what it names: the caller's tenant, the session a header names,
/// and the largest part the store keeps; and what is known of its first items from an earlier
/// request of its conversation.
#[derive(Debug, Clone)]
pub struct Call {
    pub tenant: Tenant,
    pub named: Option<String>,
    pub max_part_bytes: usize,
    pub known: Option<Known>,
}

/// The first `items` items of a request are an earlier request's, checked when it was: their
/// chain hashes (as [`super::chain_hashes`] gives them) are the first of `hashes`.
#[derive(Debug, Clone)]
pub struct Known {
    pub items: usize,
    pub hashes: std::sync::Arc<[crate::domain::Hash]>,
}

/// A conversation of a session: its top level, or a sub-agent's function.
pub type ConversationKey = (Scoped, Option<crate::domain::NodeId>);

impl Workflows {
    /// Records `conv`: finds or makes its session, appends what it does not hold.
    pub async fn record(&self, call: &Call, conv: &Conversation) -> Result<Recorded, Unrecorded> {
        record(self, call, conv).await
    }

    /// Where `conv` would be recorded, found without writing (see [`locate`]).
    pub async fn locate(
        &self,
        call: &Call,
        conv: &Conversation,
    ) -> Result<Option<Located>, Unrecorded> {
        locate(self, call, conv).await
    }

    /// Records a request located before it was forwarded (see [`record_located`]).
    pub async fn record_located(
        &self,
        call: &Call,
        conv: &mut Conversation,
        located: Located,
    ) -> Result<Recorded, Unrecorded> {
        record_located(self, call, conv, located).await
    }

    /// The stored path a call renders.
    pub async fn call_path(
        &self,
        session: Scoped,
        target: &PathTarget,
    ) -> Result<PathView, crate::store::Error> {
        self.store.load_path(session, target).await
    }

    /// What a conversation's next call is judged and rendered against, as the last call left
    /// it (the door's own encoding); `None` where none is kept or it cannot be read (logged).
    pub async fn conversation_state(&self, (session, scope): ConversationKey) -> Option<String> {
        match self.store.gateway_conversation(session, scope).await {
            Ok(text) => text,
            Err(e) => {
                tracing::warn!(error = %e, "a conversation's ledger state was not read");
                None
            }
        }
    }

    /// Keeps a conversation's state for its next call, on whichever replica serves it.
    pub async fn save_conversation_state(&self, (session, scope): ConversationKey, state: &str) {
        if let Err(e) = self
            .store
            .save_gateway_conversation(session, scope, state)
            .await
        {
            tracing::warn!(error = %e, "a conversation's ledger state was not saved");
        }
    }

    /// Lays an agent's summary over the history it replaced (a segment summary, through the
    /// compaction workflow, so it is judged, stored and audited as any summary is). A summary
    /// not laid leaves the branch whole; its next request is then recorded as before.
    pub async fn lay_agent_summary(
        &self,
        recorded: &Recorded,
        summary: &AgentSummary,
        max_tool_result_chars: usize,
    ) {
        let args = PrepareArgs {
            session: recorded.session.id(),
            branch: recorded.branch.clone(),
            // Any budget the range is over: the agent, not ctxd, decided to summarize.
            budget: Budget {
                context_window: 1,
                ..Budget::default()
            },
            tokenizer: Tokenizer::Heuristic,
            retain_turns: 0,
            instructions: String::new(),
            max_tool_result_chars,
            segment: Some((summary.from, summary.to)),
            request_policy: None,
        };
        let compactions = &self.compactions;
        let why = match compactions.prepare(recorded.session, args).await {
            Ok(PrepareOutcome::Needed { scoped, .. }) => match compactions
                .commit(
                    recorded.session,
                    scoped,
                    summary.text.clone(),
                    summary.model.to_owned(),
                    false,
                )
                .await
            {
                Ok(outcome) if outcome.applied() => {
                    metrics::counter!("ctxd_gateway_agent_summaries_total").increment(1);
                    return;
                }
                Ok(outcome) => outcome.message,
                Err(e) => e.to_string(),
            },
            Ok(PrepareOutcome::NotNeeded { reason, .. }) => reason,
            Err(e) => e.to_string(),
        };
        tracing::warn!(reason = %why, "the agent's summary was not laid over its history");
    }
}
