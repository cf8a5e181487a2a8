//! What the operator sets and ctxd assumes about models: the forwarding policy, context windows
//! (the operator's, then ctxd's table) and the render options a request is budgeted with.

use axum::http::HeaderMap;

use super::App;
use crate::domain::Budget;
use crate::provider::conversation::Conversation;
use crate::render::{self, Policy};
use crate::store::now_ms;

/// A model's context window set by the operator: `MODEL=TOKENS`, `MODEL` ending in `*` for
/// every model it starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    pub model: String,
    pub prefix: bool,
    pub tokens: u32,
}

impl Window {
    pub fn parse(s: &str) -> Result<Self, String> {
        let (model, tokens) = s
            .split_once('=')
            .ok_or_else(|| format!("--context-window {s:?}: must be MODEL=TOKENS"))?;
        let model = model.trim();
        let tokens: u32 = tokens.trim().parse().map_err(|_| {
            format!("--context-window {s:?}: TOKENS must be a whole number of tokens")
        })?;
        if tokens < 1024 {
            return Err(format!(
                "--context-window {s:?}: TOKENS must be at least 1024"
            ));
        }
        let (model, prefix) = match model.strip_suffix('*') {
            Some(m) => (m, true),
            None => (model, false),
        };
        if model.is_empty() && !prefix {
            return Err(format!("--context-window {s:?}: MODEL must not be empty"));
        }
        Ok(Self {
            model: model.to_ascii_lowercase(),
            prefix,
            tokens,
        })
    }

    fn names(&self, model: &str) -> bool {
        if self.prefix {
            model.starts_with(&self.model)
        } else {
            model == self.model
        }
    }
}

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
pub(super) fn render_options(conv: &Conversation, window: &Window) -> Option<render::Options> {
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
        policy: policy(),
        now_ms: now_ms(),
        last_call_ms: None,
        seen: render::Seen::All,
    })
}

/// The input window of a model by its name (the standard window of its family as the providers
/// state it; a larger one a client must ask for, as Anthropic's 1M beta, is taken from the
/// request). `None` for a model not in the table.
fn context_window(model: &str) -> Option<u32> {
    let m = model.to_ascii_lowercase();
    let m = m.rsplit('/').next().unwrap_or(&m);
    const TABLE: &[(&str, u32)] = &[
        // Claude: every current model (Opus 4.x, Sonnet 4.x, Haiku 4.5, and the 3.x still
        // served) has 200k; Sonnet's 1M is the beta header's.
        ("claude", 200_000),
        // GPT-5 family (gpt-5, -mini, -nano, -codex, 5.1, 5.2): 400k of which 128k output.
        ("gpt-5", 272_000),
        ("gpt-4.1", 1_047_576),
        ("gpt-4o", 128_000),
        ("gpt-4-turbo", 128_000),
        ("o1", 200_000),
        ("o3", 200_000),
        ("o4", 200_000),
        ("codex-mini", 200_000),
        ("gpt-oss", 131_072),
        // Gemini 2.5 and 3 (Pro, Flash, Flash-Lite): 1M input.
        ("gemini-2.5", 1_048_576),
        ("gemini-3", 1_048_576),
        ("gemini-2.0", 1_048_576),
    ];
    TABLE
        .iter()
        .find(|(prefix, _)| m.starts_with(prefix))
        .map(|(_, tokens)| *tokens)
}

impl App {
    /// The window a request is budgeted in: the operator's setting for its model, the
    /// million-token beta when the client asks for it, else ctxd's table.
    pub(super) fn window(&self, conv: &Conversation, headers: &HeaderMap) -> Window {
        let model = conv.model.to_ascii_lowercase();
        let set = self
            .windows
            .iter()
            .find(|w| w.names(&model))
            .map(|w| w.tokens);
        let beta = headers
            .get_all("anthropic-beta")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|b| b.trim().starts_with("context-1m"));
        Window {
            model,
            prefix: false,
            tokens: set
                .or(beta.then_some(1_000_000))
                .or_else(|| context_window(&conv.model))
                .unwrap_or(UNKNOWN_WINDOW),
        }
    }
}
