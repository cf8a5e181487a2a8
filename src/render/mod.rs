//! The render engine: a pure function from a loaded path to provider-neutral messages.
//!
//! It never touches the store, the clock or the network. Steps run in order, each on the
//! output of the last: visibility first; budget tiers and summaries slot in after it.

mod visibility;

use crate::domain::{NodeId, Part, PathView, ToolCall};
use crate::tokens::{MEDIA_TOKENS, MESSAGE_OVERHEAD, TOOL_CALL_OVERHEAD, Tokenizer, Tokens};

pub use visibility::visible;

/// Who speaks a rendered message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageRole {
    System,
    Developer,
    User,
    Assistant,
    /// The answer to a tool call (a tool result or a function's result).
    Tool,
}

/// One message of the rendered context.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub role: MessageRole,
    pub parts: Vec<Part>,
    pub tool_calls: Vec<ToolCall>,
    /// Set on tool messages: the call they answer, and the tool's name.
    pub tool_call_id: Option<String>,
    pub name: Option<String>,
    pub is_error: bool,
    /// The nodes this message came from.
    pub node_ids: Vec<NodeId>,
    /// Set on messages from inside a function's internal chain.
    pub function_id: Option<NodeId>,
}

/// Whether a render at a function shows its callers' context above its chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Callers {
    #[default]
    All,
    None,
}

#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    pub tokenizer: Tokenizer,
    pub callers: Callers,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendered {
    pub messages: Vec<Message>,
    /// Tokens of each message, as counted by [`message_tokens`].
    pub tokens: Vec<Tokens>,
    pub total_tokens: Tokens,
}

/// Renders `path` into messages.
pub fn render(path: &PathView, options: &Options) -> Rendered {
    let messages = visible(path, options.callers);
    let tokens: Vec<Tokens> = messages
        .iter()
        .map(|m| message_tokens(m, options.tokenizer))
        .collect();
    let total_tokens = tokens
        .iter()
        .fold(0, |sum: Tokens, t| sum.saturating_add(*t));
    Rendered {
        messages,
        tokens,
        total_tokens,
    }
}

/// Tokens of one message as sent: its text, tool calls and media, plus framing.
pub fn message_tokens(message: &Message, tokenizer: Tokenizer) -> Tokens {
    let mut total = MESSAGE_OVERHEAD;
    for part in &message.parts {
        total = total.saturating_add(match part {
            Part::Text(text) => tokenizer.count(text),
            Part::Media { .. } => MEDIA_TOKENS,
        });
    }
    for call in &message.tool_calls {
        total = total
            .saturating_add(TOOL_CALL_OVERHEAD)
            .saturating_add(tokenizer.count(&call.name))
            .saturating_add(tokenizer.count(&call.arguments_json));
    }
    if let Some(name) = &message.name {
        total = total.saturating_add(tokenizer.count(name));
    }
    total
}
