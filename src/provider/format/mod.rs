//! Provider request documents: rendered messages as OpenAI chat completions, OpenAI Responses
//! `input` items or Anthropic Messages API JSON, valid under each API's pairing rules.
//!
//! Both APIs reject a tool call without its result, so a call still pending (at the tail, or a
//! caller's call into the function being rendered) is left out of these documents, and so is a
//! result that does not follow its call; the neutral messages keep both.

use std::collections::HashSet;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::{Value, json};

use crate::domain::{MediaSource, NodeId, Part, WireFormat};
use crate::render::{Message, MessageRole, Reduction};

mod anthropic;
mod chat;
mod responses;

pub use anthropic::{
    anthropic_block, anthropic_document, anthropic_messages, mark_last_block, strip_markers,
    tool_result_message, tool_use_block,
};
pub use chat::{
    openai_chat, openai_chat_document, request, session_call, session_message, tool_message,
};
pub use responses::{responses_document, responses_input};

/// A request document format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    OpenAiChat,
    AnthropicMessages,
}

impl Format {
    pub fn name(self) -> &'static str {
        match self {
            Format::OpenAiChat => "FORMAT_OPENAI_CHAT",
            Format::AnthropicMessages => "FORMAT_ANTHROPIC_MESSAGES",
        }
    }
}

/// The `type` of a kept Anthropic block that holds a message's own fields beside `role` and
/// `content` (such as a per-turn `output_config`): given back on the message, not as a block.
pub const MESSAGE_FIELDS: &str = "ctxd_message_fields";

/// The `type` of a kept Responses item that holds what an item stored as a call, a result or
/// a message's content had beside it (`id`, `status`, its `type`, whether its content was a
/// string or its output an array), and, for a call, where in its run the call stood:
/// `{"type": ITEM_FIELDS, "call_id"?: .., "item": {..}, "form"?: "string" | "array"}`. Given
/// back on the item it belongs to, never as an item of its own.
pub const ITEM_FIELDS: &str = "ctxd_item_fields";

/// The JSON of a kept block of `format`, if `part` is one.
pub fn opaque(part: &Part, format: WireFormat) -> Option<Value> {
    match part {
        Part::Block(block) if block.format == format => serde_json::from_str(&block.json).ok(),
        _ => None,
    }
}

/// Whether `part` is a kept block of one of `formats`.
fn block_of(part: &Part, formats: &[WireFormat]) -> bool {
    matches!(part, Part::Block(b) if formats.contains(&b.format))
}

/// A media part a document cannot carry where it stands, so it is sent as the text
/// `[<mime> attachment]` instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Uncarried {
    /// The node the part belongs to (`None` for a message no node makes, e.g. a summary).
    pub node_id: Option<NodeId>,
    pub part_index: usize,
    pub mime_type: String,
}

/// The parts of `messages` that the document of `format` replaces by a placeholder: media
/// where the API takes only text (system prompts, OpenAI assistant and tool messages,
/// Anthropic tool results), and media types the API does not take at all.
pub fn uncarried(format: Format, messages: &[Message]) -> Vec<Uncarried> {
    let pairs = Pairs::of(messages);
    let mut lost = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        if m.role == MessageRole::Tool && !pairs.results[i] {
            continue;
        }
        let carries = |mime: &str| match (format, m.role) {
            (Format::OpenAiChat, MessageRole::User) => openai_carries(mime),
            (Format::AnthropicMessages, MessageRole::User | MessageRole::Assistant) => {
                anthropic_carries(mime)
            }
            _ => false,
        };
        for (k, part) in m.parts.iter().enumerate() {
            if let Part::Media { mime_type, .. } = part
                && !carries(mime_type)
            {
                lost.push(Uncarried {
                    node_id: m.node_ids.first().copied(),
                    part_index: k,
                    mime_type: mime_type.clone(),
                });
            }
        }
    }
    lost
}

/// Media an OpenAI user message carries as itself.
fn openai_carries(mime: &str) -> bool {
    mime.starts_with("image/")
}

/// Media an Anthropic user or assistant message carries as itself.
fn anthropic_carries(mime: &str) -> bool {
    mime.starts_with("image/") || mime == "application/pdf"
}

/// The document for `format`, as compact JSON.
pub fn document(format: Format, messages: &[Message]) -> String {
    let value = match format {
        Format::OpenAiChat => openai_chat(messages),
        Format::AnthropicMessages => anthropic_messages(messages),
    };
    value.to_string()
}

/// Which calls and results a document keeps: a call only with its result, a result only right
/// after the assistant message that made its call (where rendering puts it).
pub struct Pairs<'a> {
    /// For each message: the call ids it keeps (assistant messages).
    pub calls: Vec<HashSet<&'a str>>,
    /// For each message: whether a tool message is kept.
    pub results: Vec<bool>,
}

impl<'a> Pairs<'a> {
    pub fn of(messages: &'a [Message]) -> Self {
        let mut calls = vec![HashSet::new(); messages.len()];
        let mut results = vec![false; messages.len()];
        let mut group: Option<usize> = None;
        for (i, m) in messages.iter().enumerate() {
            match m.role {
                MessageRole::Assistant => group = Some(i),
                MessageRole::Tool => {
                    let id = m.tool_call_id.as_deref().unwrap_or_default();
                    if let Some(a) = group
                        && messages[a].tool_calls.iter().any(|c| c.call_id == id)
                        && calls[a].insert(id)
                    {
                        results[i] = true;
                    }
                }
                _ => group = None,
            }
        }
        Self { calls, results }
    }
}

fn text_of(parts: &[Part]) -> String {
    parts
        .iter()
        .filter_map(|p| match p {
            Part::Text(t) => Some(t.clone()),
            Part::Block(_) => None,
            Part::Media { mime_type, .. } => Some(format!("[{mime_type} attachment]")),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn data_url(mime: &str, data: &[u8]) -> String {
    format!("data:{mime};base64,{}", BASE64.encode(data))
}

/// The tool's arguments as the object Anthropic wants; anything else is wrapped.
fn arguments_object(arguments: &str) -> Value {
    match serde_json::from_str::<Value>(arguments) {
        Ok(Value::Object(map)) => Value::Object(map),
        Ok(other) => json!({ "value": other }),
        Err(_) => json!({ "raw": arguments }),
    }
}
