//! What the operator sets and ctxd assumes about models: the forwarding policy, the model table
//! the gateway prices and budgets by (the operator's windows over the server's table) and the
//! render options a request is budgeted with.

use super::App;
use crate::domain::{Budget, CachePrices};
use crate::provider::conversation::Conversation;
use crate::provider::models::{ModelEntry, ModelTable, Window};
use crate::render::{self, Policy};
use crate::store::now_ms;

/// What the gateway forwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GatewayPolicy {
    /// ctxd's render of the branch under the gateway's policy (old tool output cleared in
    /// steps, old inputs stubbed, never a result of the newest turns cut).
    #[default]
    Stepped,
    /// The client's body as it came (still recorded).
    Passthrough,
}

impl GatewayPolicy {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "stepped" => Some(Self::Stepped),
            "passthrough" => Some(Self::Passthrough),
            _ => None,
        }
    }
}

/// The default render policy of the gateway: the stepped default, except that what arrived
/// since the last step is never capped or stubbed (an agent edits files by quoting what it just
/// read, and its next edit builds on the last one), that it keeps the newest 3 results, and that
/// an agent's main conversation, which runs long (a coding session of tens to hundreds of
/// calls), steps when its payback is within half the calls it has run (its sub-agents ask the
/// render's 8:1, body.rs). In `cargo bench --bench gateway`, 0.442x of direct over the 23
/// traces with Anthropic's breakpoint cache and 0.308x with OpenAI's prefix cache; a scripted
/// 26-call Claude Code session, 0.836x (0.901x keeping 5).
pub fn policy() -> Policy {
    Policy {
        recent_tool_result_chars: usize::MAX,
        recent_tool_input_chars: usize::MAX,
        recent_assistant_text_chars: usize::MAX,
        microcompact_first: 10,
        microcompact_every: 10,
        microcompact_keep: 3,
        payback_odds: 2,
        ..Policy::default()
    }
}

/// The largest request body the gateway reads by default (a long session resent whole, with
/// images).
pub const MAX_BODY_BYTES: usize = 256 * 1024 * 1024;

/// The window of a model ctxd does not know: no budget cuts it, only steps do.
const UNKNOWN_WINDOW: u32 = u32::MAX;

/// The most of the window kept for the answer. A client's `max_tokens` is a ceiling, not a
/// forecast (Claude Code asks for 128,000, which would leave a 200k window 72k of history):
/// an answer rarely takes more than this, and one that would, ends where the provider stops it.
const OUTPUT_RESERVE: u32 = 32_000;

/// The render options of a request: its window, its answer's reserve, its system prompt and
/// tools; `None` when they leave the history nothing.
pub(super) fn render_options(
    conv: &Conversation,
    window: &Window,
    entry: &ModelEntry,
) -> Option<render::Options> {
    let budget = Budget {
        context_window: window.tokens,
        output_reserve: conv.output_reserve.min(OUTPUT_RESERVE),
        system: conv.system_tokens,
        tools: conv.tools_tokens,
        schema: 0,
    };
    budget.history().ok()?;
    Some(render::Options {
        callers: render::Callers::All,
        budget: Some(budget),
        policy: if conv.long_ttl() {
            Policy {
                prices: CachePrices {
                    write_per_mille: entry.long_write_per_mille,
                    ..entry.prices
                },
                idle_ms: entry.long_ttl_ms,
                ..policy()
            }
        } else {
            Policy {
                prices: entry.prices,
                idle_ms: entry.ttl_ms,
                ..policy()
            }
        },
        now_ms: now_ms(),
        last_call_ms: None,
        seen: render::Seen::All,
    })
}

impl App {
    /// The model table's entry for a request's model, and the window it is budgeted in: the
    /// million-token beta when the client asks for it, else the entry's (the operator's
    /// `--context-window` and `--models` first).
    pub(super) fn model(&self, conv: &Conversation) -> (ModelEntry, Window) {
        let entry = self.models.entry(&conv.model);
        let beta = conv.wide_window;
        let tokens = match entry.window {
            _ if beta && !entry.overridden => 1_000_000,
            Some(w) => w,
            None if beta => 1_000_000,
            None => UNKNOWN_WINDOW,
        };
        let window = Window {
            model: conv.model.to_ascii_lowercase(),
            prefix: false,
            tokens,
        };
        (entry, window)
    }
}

/// The model table the gateway prices and budgets by: the server's, with the operator's
/// `--context-window` settings over it.
pub(super) fn table(models: &ModelTable, windows: &[Window]) -> ModelTable {
    windows.iter().fold(models.clone(), |table, w| {
        table.with_window(&w.model, w.prefix, w.tokens)
    })
}
