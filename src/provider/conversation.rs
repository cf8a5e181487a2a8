//! A provider request as the gateway records it: the messages as node contents in order, and
//! what the forwarding needs (model, stream, budget parts, cache markers).

use serde_json::{Map, Value};

use crate::domain::{NodeContent, Part, Role, ToolCall};

/// One node the request's messages make, and the client message it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Item {
    pub content: NodeContent,
    pub message: usize,
    /// The last client entry it came from: a run of Responses items (reasoning, a message,
    /// calls) is one assistant node; `message` elsewhere.
    pub through: usize,
}

/// A request read for recording.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Conversation {
    pub items: Vec<Item>,
    /// The system prompt and the first user message: a conversation's identity when nothing
    /// else names its session.
    pub opening: String,
    /// The agent's own session id (Claude Code sends one in `metadata.user_id`).
    pub client_session: Option<String>,
    pub stream: bool,
    pub model: String,
    /// Tokens the answer may take (`max_tokens`).
    pub output_reserve: u32,
    /// Estimated tokens of the system prompt and of the tool definitions.
    pub system_tokens: u32,
    pub tools_tokens: u32,
    /// Estimated tokens of the messages as the client sent them.
    pub client_tokens: u64,
    /// Prompt-cache markers on messages: (client message index, the marker as sent).
    pub markers: Vec<(usize, Value)>,
    /// Markers outside the messages (system, tools), which count toward the provider's limit.
    pub fixed_markers: usize,
    /// The history holds the model's reasoning (a thinking block, signed by its provider).
    pub reasoning: bool,
    /// The client asked for the model's million-token window (Anthropic's `context-1m` beta).
    pub wide_window: bool,
}

impl Conversation {
    /// A request body as every API's starts: a JSON object naming its model.
    pub fn request(body: &Value) -> Result<(&Map<String, Value>, String), Refusal> {
        let Some(obj) = body.as_object() else {
            return Err(Refusal::invalid("body", "must be a JSON object"));
        };
        match obj.get("model") {
            Some(Value::String(m)) => Ok((obj, m.clone())),
            _ => Err(Refusal::invalid("model", "must be a string")),
        }
    }

    /// The conversation of request `obj` before its messages are read: its model, whether it
    /// streams, the tokens its answer may take (`max_tokens`, as the API names it; 4096 when
    /// the request does not say) and the estimated tokens of its `tools`.
    pub fn begun(obj: &Map<String, Value>, model: String, max_tokens: Option<&Value>) -> Self {
        let tools = match obj.get("tools") {
            Some(Value::Array(tools)) => tools.iter().map(|t| t.to_string().len()).sum(),
            _ => 0,
        };
        Conversation {
            model,
            tools_tokens: u32::try_from(estimate(tools)).unwrap_or(u32::MAX),
            stream: obj.get("stream").and_then(Value::as_bool).unwrap_or(false),
            output_reserve: max_tokens
                .and_then(Value::as_u64)
                .map_or(4096, |n| u32::try_from(n).unwrap_or(u32::MAX)),
            ..Conversation::default()
        }
    }

    /// Whether the client asks its cache entries to live long (Anthropic's `ttl: "1h"`
    /// markers).
    pub fn long_ttl(&self) -> bool {
        self.markers
            .iter()
            .any(|(_, m)| m.get("ttl").and_then(Value::as_str) == Some("1h"))
    }

    /// The text of the first message of `role`.
    pub fn first_text(&self, role: Role) -> Option<String> {
        self.items.iter().find_map(|item| match &item.content {
            NodeContent::Message { role: r, parts, .. } if *r == role => Some(Part::text_of(parts)),
            _ => None,
        })
    }

    /// What a request resending this one's first `from` client entries unchanged (and every
    /// field beside them) reads before its other entries: the items and markers of those
    /// entries, the rest as read. `None` when the opening is not among them (it is read anew).
    pub fn resent(&self, from: usize) -> Option<Self> {
        let first_user = self.items.iter().find(|i| {
            matches!(
                &i.content,
                NodeContent::Message {
                    role: Role::User,
                    ..
                }
            )
        })?;
        if first_user.through >= from {
            return None;
        }
        Some(Conversation {
            items: self
                .items
                .iter()
                .take_while(|i| i.through < from)
                .cloned()
                .collect(),
            markers: self
                .markers
                .iter()
                .filter(|(i, _)| *i < from)
                .cloned()
                .collect(),
            ..self.clone_fields()
        })
    }

    /// Every field but the items and the markers.
    fn clone_fields(&self) -> Self {
        Conversation {
            items: Vec::new(),
            opening: self.opening.clone(),
            client_session: self.client_session.clone(),
            stream: self.stream,
            model: self.model.clone(),
            output_reserve: self.output_reserve,
            system_tokens: self.system_tokens,
            tools_tokens: self.tools_tokens,
            client_tokens: self.client_tokens,
            markers: Vec::new(),
            fixed_markers: self.fixed_markers,
            reasoning: self.reasoning,
            wide_window: self.wide_window,
        }
    }

    /// Ends a read of a resent request ([`Conversation::resent`]): as [`Conversation::finish`],
    /// the opening the one read before.
    pub fn finish_resent(self, opening: &str) -> Self {
        let mut conv = self.finish("");
        conv.opening = opening.to_owned();
        conv
    }

    /// Ends a read of its items, whatever the API: each tool result takes its call's name,
    /// the opening is `system` and the first user message, and the client's tokens are counted.
    pub fn finish(mut self, system: &str) -> Self {
        fill_result_names(&mut self.items);
        self.reasoning = self.items.iter().any(|i| match &i.content {
            NodeContent::Message { parts, .. } => parts
                .iter()
                .any(|p| matches!(p, Part::Block(b) if b.reasoning)),
            _ => false,
        });
        let first_user = self.first_text(Role::User).unwrap_or_default();
        self.opening = format!("{system}\n\n{first_user}");
        self.client_tokens = self
            .items
            .iter()
            .map(|i| estimate(i.content.byte_len()) + 4)
            .sum();
        self
    }
}

/// Why a request is not recorded: a 400 for what is not a request of the endpoint, or a
/// reason to forward it untouched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    Invalid { field: String, message: String },
    Unrecordable(&'static str),
}

impl Refusal {
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Refusal::Invalid {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// The most blocks, items or calls one answer may hold: an index past it in a stream marks
/// the answer as not one ctxd records (and never makes it allocate for a huge index).
pub const MAX_ANSWER_PARTS: usize = 4096;

/// Tokens of `text` as the gateway estimates them (four characters a token, rounded up): the
/// same count for what the client sent and what went upstream.
pub fn estimate(chars: usize) -> u64 {
    chars.div_ceil(4) as u64
}

/// Fills each tool result's name from the call it answers, as the store does, so the hashes
/// computed here are those the store computes.
fn fill_result_names(items: &mut [Item]) {
    let mut names: std::collections::HashMap<String, String> = std::collections::HashMap::new();
    for item in items.iter_mut() {
        match &mut item.content {
            NodeContent::Message { tool_calls, .. } => {
                for ToolCall { call_id, name, .. } in tool_calls.iter() {
                    names.insert(call_id.clone(), name.clone());
                }
            }
            NodeContent::ToolResult { call_id, name, .. } if name.is_empty() => {
                if let Some(n) = names.get(call_id) {
                    name.clone_from(n);
                }
            }
            _ => {}
        }
    }
}

/// The request's nodes as a stored path renders them, untouched by any budget step: what a
/// codec's round-trip tests write back.
#[cfg(test)]
pub fn rendered(conv: &Conversation) -> Vec<crate::render::Message> {
    let contents = conv.items.iter().map(|i| i.content.clone()).collect();
    let path = crate::workflow::record::extended(crate::domain::PathView::default(), contents);
    crate::render::visible(&path, crate::render::Callers::All)
}
