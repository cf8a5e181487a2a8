//! Loading a path and rendering it, one way whoever asks (gRPC, the gateway, the inspector): real
//! BPE counts off the I/O threads, short heuristic renders inline; for a named model, at its
//! cache prices, and for one that binds its thinking to its prefix, with every thinking block
//! kept valid (the steps said as the provider's edit) or the invalidated ones left out.

use std::sync::Arc;

use super::{Error, Workflows};
use crate::domain::{AskedEdit, CachePrices, NodeContent, Part, PathView};
use crate::provider::anthropic::edits;
use crate::provider::models::ModelEntry;
use crate::render::{self, Message, Reduction, Rendered};
use crate::store::{PathTarget, Scoped};
use crate::tokens::Tokenizer;

impl Workflows {
    /// Loads `target` of `session` and renders it.
    pub async fn render(
        &self,
        session: Scoped,
        target: &PathTarget,
        tokenizer: Tokenizer,
        options: render::Options,
    ) -> Result<(PathView, Rendered), Error> {
        let path = self.store.load_path(session, target).await?;
        self.render_path(path, tokenizer, options).await
    }

    /// Renders a path already loaded (or extended in memory, to see what a render would be).
    pub async fn render_path(
        &self,
        path: PathView,
        tokenizer: Tokenizer,
        options: render::Options,
    ) -> Result<(PathView, Rendered), Error> {
        let cache = Arc::clone(&self.tokens);
        let inline = tokenizer == Tokenizer::Heuristic && text_bytes(&path) <= INLINE_RENDER;
        let work = move || {
            let rendered = render::render(&path, &options, &cache.counter(tokenizer));
            (path, rendered)
        };
        // Counting real BPE tokens over a long path is CPU work: keep it off the I/O threads.
        // A short path counted by the heuristic renders in less time than the hand-off costs.
        let rendered = if inline {
            work()
        } else {
            tokio::task::spawn_blocking(work).await.map_err(|e| {
                tracing::error!(error = %e, "render task failed");
                Error::Task("render")
            })?
        };
        metrics::counter!("ctxd_renders_total", "tokenizer" => tokenizer.name()).increment(1);
        metrics::counter!("ctxd_rendered_tokens_total", "tokenizer" => tokenizer.name())
            .increment(u64::from(rendered.1.report.total_tokens));
        Ok(rendered)
    }
}

/// How a render for a model that binds its thinking keeps the reasoning valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Reasoning {
    /// Every thinking block stays valid: steps only clear whole results, as the provider's edit.
    #[default]
    Keep,
    /// Steps as for any model; the thinking after what they changed is left out.
    Drop,
}

/// The model a render is for, as the request names it: its table entry, and what the request
/// sets itself (its own prices or cache lifetime win over the entry's).
#[derive(Debug, Clone)]
pub struct ForModel {
    pub entry: ModelEntry,
    pub reasoning: Reasoning,
    pub prices: Option<CachePrices>,
    pub idle_ms: Option<i64>,
}

/// What a render for a model did beyond the render itself.
#[derive(Debug, Clone, Default)]
pub struct Reasoned {
    /// The table's entry that priced the steps.
    pub priced_by: String,
    /// `Keep` on a binding model: the steps as the provider's edit, and the messages as they
    /// go with it (unreduced, for the provider reduces them).
    pub edit: Option<(AskedEdit, Vec<Message>)>,
}

impl Workflows {
    /// Loads `target` of `session` and renders it for `model`: at its prices, and for one that
    /// binds its thinking, keeping every thinking block valid as `model.reasoning` says.
    pub async fn render_for(
        &self,
        session: Scoped,
        target: &PathTarget,
        tokenizer: Tokenizer,
        mut options: render::Options,
        model: Option<ForModel>,
    ) -> Result<(PathView, Rendered, Reasoned), Error> {
        let path = self.store.load_path(session, target).await?;
        let Some(model) = model else {
            let (path, rendered) = self.render_path(path, tokenizer, options).await?;
            return Ok((path, rendered, Reasoned::default()));
        };
        options.policy.prices = model.prices.unwrap_or(model.entry.prices);
        options.policy.idle_ms = model.idle_ms.unwrap_or(model.entry.ttl_ms);
        let mut reasoned = Reasoned {
            priced_by: model.entry.label(),
            ..Reasoned::default()
        };
        let binds = model.entry.binds(holds_reasoning(&path));
        match (binds, model.reasoning) {
            (true, Reasoning::Keep) => {
                options.policy.provider_edits = true;
                // The messages as the provider gets them: visible, under an agent's own
                // summaries, unreduced.
                let whole = render::Options {
                    budget: None,
                    ..options
                };
                let (path, rendered) = self.render_path(path, tokenizer, options).await?;
                let (path, unreduced) = self.render_path(path, tokenizer, whole).await?;
                if let Some(edit) = edit_of(&unreduced.messages, &rendered.messages) {
                    reasoned.edit = Some((edit, unreduced.messages));
                }
                Ok((path, rendered, reasoned))
            }
            (true, Reasoning::Drop) | (false, _) => {
                options.policy.drop_invalid_reasoning = binds;
                let (path, rendered) = self.render_path(path, tokenizer, options).await?;
                Ok((path, rendered, reasoned))
            }
        }
    }
}

/// Whether any node of `path` holds the model's reasoning.
fn holds_reasoning(path: &PathView) -> bool {
    path.all_nodes().any(|n| match &n.content {
        NodeContent::Message { parts, .. } => parts
            .iter()
            .any(|p| matches!(p, Part::Block(b) if b.reasoning)),
        _ => false,
    })
}

/// The provider's edit that clears what `rendered` cleared, in `messages` (the same render,
/// unreduced): the oldest tool uses it cleared, as the provider counts them.
fn edit_of(messages: &[Message], rendered: &[Message]) -> Option<AskedEdit> {
    let cleared = cleared_calls(rendered);
    let uses = messages
        .iter()
        .flat_map(|m| m.tool_calls.iter().map(|c| c.call_id.as_str()));
    edits::clearing(uses, &cleared)
}

/// The calls whose results a render cleared: what a step said as the provider's edit clears.
pub fn cleared_calls(rendered: &[Message]) -> std::collections::HashSet<&str> {
    rendered
        .iter()
        .filter(|m| m.reduction == Reduction::Cleared)
        .filter_map(|m| m.tool_call_id.as_deref())
        .collect()
}

/// Bytes of text a render may copy and count on an I/O thread (tens of microseconds).
const INLINE_RENDER: usize = 256 * 1024;
/// The text a render of `path` copies and counts: every node it may show.
fn text_bytes(path: &PathView) -> usize {
    path.all_nodes().map(|n| n.content.byte_len()).sum()
}
