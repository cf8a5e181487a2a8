//! What a render policy saved over a session's newest model calls, replayed on its path (the
//! inspector's savings view), with what the model gateway reported for the session.

use std::sync::Arc;

use super::{Error, Workflows};
use crate::domain::{GatewayUsage, NodeId};
use crate::economy::{self, Savings};
use crate::render;
use crate::store::{PathTarget, Scoped};
use crate::tokens::Tokenizer;

/// A replay's figures and what they were replayed on.
#[derive(Debug, Clone)]
pub struct SavingsReport {
    pub savings: Savings,
    /// The head replayed to (`None`: an empty branch).
    pub head_id: Option<NodeId>,
    pub tokenizer: &'static str,
    /// What the gateway reported for the session (`None`: no call went through it).
    pub gateway: Option<GatewayUsage>,
}

impl Workflows {
    /// Replays the newest `calls` model calls of `target` under `options`.
    pub async fn savings(
        &self,
        session: Scoped,
        target: &PathTarget,
        tokenizer: Tokenizer,
        options: render::Options,
        calls: usize,
    ) -> Result<SavingsReport, Error> {
        // Independent reads: one wait for both.
        let (path, usage) = tokio::try_join!(
            self.store.load_path(session, target),
            self.store.gateway_usage(session)
        )?;
        let head_id = path.nodes.last().map(|n| n.id);
        let cache = Arc::clone(&self.tokens);
        // A replay renders the path once per call: CPU work, off the I/O threads.
        let savings = tokio::task::spawn_blocking(move || {
            economy::replay(&path, &options, &cache.counter(tokenizer), calls)
        })
        .await
        .map_err(|e| {
            tracing::error!(error = %e, "savings replay failed");
            Error::Task("the savings replay")
        })?;
        Ok(SavingsReport {
            savings,
            head_id,
            tokenizer: tokenizer.name(),
            gateway: (usage.calls > 0).then_some(usage),
        })
    }
}
