//! Loading a path and rendering it, one way whoever asks (gRPC, the gateway, the inspector): real
//! BPE counts off the I/O threads, short heuristic renders inline.

use std::sync::Arc;

use super::{Error, Workflows};
use crate::domain::PathView;
use crate::render::{self, Rendered};
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

/// Bytes of text a render may copy and count on an I/O thread (tens of microseconds).
const INLINE_RENDER: usize = 256 * 1024;
/// The text a render of `path` copies and counts: every node it may show.
fn text_bytes(path: &PathView) -> usize {
    path.all_nodes().map(|n| n.content.byte_len()).sum()
}
