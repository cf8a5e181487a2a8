//! `Compact`: prepare, the server's summarizer, commit, in one call; its plan closed as
//! cancelled if the call is dropped before it finished, and the summarizer's text kept by source.

use super::{CommitOutcome, Compactions, PrepareArgs, PrepareOutcome, Result};
use crate::domain::{self, Hash, Reason, SummaryId};
use crate::store::{Scoped, ScopedPlan, Store};

/// What `Compact` did: nothing (the branch fits), or a plan and how it ended (applied, rejected,
/// or the summarizer failed).
pub enum CompactOutcome {
    NotNeeded { tokens_before: u32, reason: String },
    Planned(CommitOutcome),
}

impl Compactions {
    /// Prepare, the server's summarizer, commit. A text the summarizer wrote for the same
    /// source is reused rather than asked for again.
    pub async fn compact(&self, session: Scoped, args: PrepareArgs) -> Result<CompactOutcome> {
        let Some(summarizer) = self.summarizer.clone() else {
            return Err(domain::Error::FailedPrecondition(
                "no summarizer is configured: start the server with --summarizer-url URL \
                 --summarizer-model NAME (an OpenAI-compatible chat-completions endpoint)"
                    .to_owned(),
            )
            .into());
        };
        let tokenizer = args.tokenizer;
        let instructions = args.instructions.clone();
        let (plan, prepared, evidence, request, scoped) = match self.prepare(session, args).await? {
            PrepareOutcome::NotNeeded {
                tokens_before,
                reason,
            } => {
                return Ok(CompactOutcome::NotNeeded {
                    tokens_before,
                    reason,
                });
            }
            PrepareOutcome::Needed {
                plan,
                prepared,
                evidence,
                request,
                scoped,
            } => (plan, prepared, evidence, request, scoped),
        };
        let mut guard = CloseOnDrop {
            store: self.store.clone(),
            plan: Some(scoped),
        };
        let model = summarizer.model().to_owned();
        let key = source_key(
            &plan.rolls_over,
            &prepared.source_hash,
            &model,
            &instructions,
        );
        let text = match self.store.summarizer_output(&key).await? {
            Some(text) => text,
            None => {
                let counter = self.tokens.counter(tokenizer);
                // The cache-sharing request when the summarizer's window takes it whole; the
                // range, chunked as needed, otherwise.
                let asked = match request {
                    Some(request) if summarizer.fits(&request.tokens) => {
                        summarizer.summarize_request(&request.messages).await
                    }
                    _ => {
                        summarizer
                            .summarize(&prepared.input, &evidence, &instructions, &counter)
                            .await
                    }
                };
                match asked {
                    Ok(text) => text,
                    Err(e) => {
                        guard.disarm();
                        let message = e.to_string();
                        tracing::warn!(error = %message, "summarizer failed");
                        self.store
                            .close_plan(scoped, Reason::Failed, &message)
                            .await?;
                        metrics::counter!("ctxd_summaries_total", "outcome" => "failed")
                            .increment(1);
                        return Ok(CompactOutcome::Planned(CommitOutcome {
                            compaction: plan.id,
                            reason: Reason::Failed,
                            tokens_before: plan.tokens_before,
                            tokens_after: plan.tokens_before,
                            summary: None,
                            message,
                        }));
                    }
                }
            }
        };
        let outcome = self
            .commit(session, scoped, text.clone(), model, false)
            .await;
        guard.disarm();
        let outcome = outcome?;
        // Keep the text for this source unless the text itself was the problem (empty, no
        // gain): a stale base says nothing against it.
        if matches!(outcome.reason, Reason::Applied | Reason::Stale) {
            self.store
                .save_summarizer_output(session.id(), &key, &text)
                .await?;
        }
        Ok(CompactOutcome::Planned(outcome))
    }
}

/// Closes a plan as cancelled if the Compact call is dropped (client cancel or deadline)
/// before it finished: nothing is written but the event.
struct CloseOnDrop {
    store: Store,
    plan: Option<ScopedPlan>,
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
