//! Nodes: the immutable records of a session's DAG and their content.

use super::{Hash, NodeId};
use std::sync::Arc;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    System,
    Developer,
    User,
    Assistant,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::Developer => "developer",
            Role::User => "user",
            Role::Assistant => "assistant",
        }
    }

    pub fn from_str_opt(s: &str) -> Option<Self> {
        Some(match s {
            "system" => Role::System,
            "developer" => Role::Developer,
            "user" => Role::User,
            "assistant" => Role::Assistant,
            _ => return None,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MediaSource {
    Data(Vec<u8>),
    Url(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    Text(String),
    Media {
        mime_type: String,
        source: MediaSource,
    },
    /// A provider's block ctxd keeps whole rather than reduce to text or media.
    Block(ProviderBlock),
}

/// A provider's wire format: the one name of a format everywhere (the gateway's routes and
/// codecs, rendered documents, the format a kept provider block belongs to).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WireFormat {
    /// A content block of the Anthropic Messages API (thinking with its signature, server tool
    /// use and its results, documents, citations, any type ctxd does not know), or the fields
    /// a message carries beside `role` and `content`.
    AnthropicMessages,
    /// A content part of OpenAI chat completions other than plain text (audio, files, …).
    ChatCompletions,
    /// A whole OpenAI Responses `input` item (reasoning with its encrypted content, an
    /// assistant message with its id, a server tool's call, any type ctxd does not know), a
    /// content part other than plain text, or what an item stored as a call had beside it.
    Responses,
    /// A part of a Gemini `generateContent` content (a thought with its signature, a function
    /// call's signature, any part ctxd does not know), or the fields a content or part carries
    /// beside those ctxd reads.
    Gemini,
}

impl WireFormat {
    pub const ALL: [WireFormat; 4] = [
        WireFormat::AnthropicMessages,
        WireFormat::ChatCompletions,
        WireFormat::Responses,
        WireFormat::Gemini,
    ];

    /// The MIME type a block of this format travels and is stored under where a part is media
    /// on the wire (the gRPC contract, the stored body): the same bytes hash the same, so
    /// sessions stored before blocks had a type of their own keep their identities.
    pub fn mime(self) -> &'static str {
        match self {
            WireFormat::AnthropicMessages => "application/vnd.ctxd.anthropic-block+json",
            WireFormat::ChatCompletions => "application/vnd.ctxd.openai-part+json",
            WireFormat::Responses => "application/vnd.ctxd.responses-item+json",
            WireFormat::Gemini => "application/vnd.ctxd.gemini-part+json",
        }
    }

    /// The MIME type of this format's reasoning blocks, where it has them.
    pub fn reasoning_mime(self) -> Option<&'static str> {
        match self {
            WireFormat::AnthropicMessages => Some(REASONING_MIME),
            WireFormat::Gemini => Some("application/vnd.ctxd.gemini-reasoning+json"),
            WireFormat::ChatCompletions | WireFormat::Responses => None,
        }
    }

    pub fn from_mime(mime: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|f| f.mime() == mime || f.reasoning_mime() == Some(mime))
    }

    pub fn is_reasoning_mime(mime: &str) -> bool {
        Self::ALL.iter().any(|f| f.reasoning_mime() == Some(mime))
    }

    /// The name ctxd JSONL writes.
    pub fn name(self) -> &'static str {
        match self {
            WireFormat::AnthropicMessages => "anthropic_messages",
            WireFormat::ChatCompletions => "chat_completions",
            WireFormat::Responses => "responses",
            WireFormat::Gemini => "gemini",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|f| f.name() == name)
    }
}

/// The MIME type of an Anthropic thinking block (redacted or not) on the wire and in the store.
pub const REASONING_MIME: &str = "application/vnd.ctxd.anthropic-reasoning+json";

/// A provider block as it came, in its canonical JSON (keys sorted, no spacing, no cache
/// marker): given back to its own API byte for byte, left out of the others.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderBlock {
    pub format: WireFormat,
    pub json: String,
    /// The model's reasoning (its codec says which blocks are): like a cache marker, not part
    /// of what a message says. A client that resends its history without it (after the
    /// provider refused it, or to a model that cannot read it) continues the same history, and
    /// the stored message keeps it.
    pub reasoning: bool,
}

impl ProviderBlock {
    pub fn new(format: WireFormat, json: String) -> Self {
        Self {
            format,
            json,
            reasoning: false,
        }
    }

    pub fn reasoning(json: String) -> Self {
        Self {
            format: WireFormat::AnthropicMessages,
            json,
            reasoning: true,
        }
    }

    /// The MIME type the block travels and is stored under.
    pub fn mime(&self) -> &'static str {
        match self.format.reasoning_mime() {
            Some(mime) if self.reasoning => mime,
            _ => self.format.mime(),
        }
    }

    /// The block a caller sent as media of `mime`: `None` when `mime` is no block's;
    /// `Some(None)` when the data is not JSON text.
    pub fn from_media(mime: &str, data: Vec<u8>) -> Option<Option<Self>> {
        let format = WireFormat::from_mime(mime)?;
        let checked = String::from_utf8(data)
            .ok()
            .filter(|json| serde_json::from_str::<serde::de::IgnoredAny>(json).is_ok());
        Some(checked.map(|json| Self {
            format,
            json,
            reasoning: WireFormat::is_reasoning_mime(mime),
        }))
    }

    /// A block read back from the store, which checked it when it was written: only UTF-8 is
    /// checked, not its JSON again on every read.
    pub fn stored(mime: &str, data: Vec<u8>) -> Option<Option<Self>> {
        let format = WireFormat::from_mime(mime)?;
        Some(String::from_utf8(data).ok().map(|json| Self {
            format,
            json,
            reasoning: WireFormat::is_reasoning_mime(mime),
        }))
    }
}

impl Part {
    /// The bytes this part holds: its text, its media data, or its URL.
    pub fn byte_len(&self) -> usize {
        match self {
            Part::Text(text) => text.len(),
            Part::Media {
                source: MediaSource::Data(data),
                ..
            } => data.len(),
            Part::Media {
                source: MediaSource::Url(url),
                ..
            } => url.len(),
            Part::Block(block) => block.json.len(),
        }
    }

    /// The text of a text part.
    pub fn as_text(&self) -> Option<&str> {
        match self {
            Part::Text(t) => Some(t),
            Part::Media { .. } | Part::Block(_) => None,
        }
    }

    /// The text parts of `parts` joined by newlines; media left out.
    pub fn text_of(parts: &[Part]) -> String {
        parts
            .iter()
            .filter_map(Part::as_text)
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Characters of the text parts of `parts`.
    pub fn text_chars(parts: &[Part]) -> usize {
        parts
            .iter()
            .filter_map(Part::as_text)
            .map(|t| t.chars().count())
            .sum()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    pub call_id: String,
    pub name: String,
    /// Checked to be JSON at the boundary; kept byte-exact as the model wrote it.
    pub arguments_json: String,
}

impl FunctionResult {
    /// Whether a client's tool result is this result of a sub-agent's function: the same call,
    /// text alone, the same text and the same error status.
    pub fn answered_by(&self, client: &NodeContent) -> bool {
        match client {
            NodeContent::ToolResult {
                call_id,
                parts,
                is_error,
                ..
            } => {
                *call_id == self.call_id
                    && parts.iter().all(|p| matches!(p, Part::Text(_)))
                    && Part::text_of(parts) == self.output
                    && *is_error == (self.status == FunctionStatus::Error)
            }
            _ => false,
        }
    }
}

/// How a completed function shows in its caller's render.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Expose {
    #[default]
    Io,
    Full,
    None,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FunctionStatus {
    #[default]
    Completed,
    Error,
}

/// A function result; `chain` is filled by the store when the result is appended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FunctionResult {
    pub call_id: String,
    pub output: String,
    pub status: FunctionStatus,
    pub chain: Option<ClosedChain>,
}

/// What a function result closed: the function and the head of its internal chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClosedChain {
    pub function_id: NodeId,
    /// `None` when the function appended nothing inside.
    pub head_id: Option<NodeId>,
    /// The hash of that head (or of the function_call node when empty), so the
    /// caller's history hash covers what the function did.
    pub head_hash: Hash,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeContent {
    Message {
        role: Role,
        parts: Vec<Part>,
        tool_calls: Vec<ToolCall>,
    },
    ToolResult {
        call_id: String,
        name: String,
        parts: Vec<Part>,
        is_error: bool,
    },
    FunctionCall {
        call_id: String,
        name: String,
        input: String,
        expose: Expose,
    },
    FunctionResult(FunctionResult),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeKind {
    Message,
    ToolResult,
    FunctionCall,
    FunctionResult,
}

impl NodeContent {
    /// Whether `self` says what `other` says: equal but for the model's reasoning, which no
    /// node's identity holds (`ProviderBlock::reasoning`).
    pub fn says_same(&self, other: &NodeContent) -> bool {
        fn said(parts: &[Part]) -> impl Iterator<Item = &Part> {
            parts
                .iter()
                .filter(|p| !matches!(p, Part::Block(b) if b.reasoning))
        }
        match (self, other) {
            (
                NodeContent::Message {
                    role: a,
                    parts: pa,
                    tool_calls: ta,
                },
                NodeContent::Message {
                    role: b,
                    parts: pb,
                    tool_calls: tb,
                },
            ) => a == b && ta == tb && said(pa).eq(said(pb)),
            (
                NodeContent::ToolResult {
                    call_id: a,
                    name: na,
                    parts: pa,
                    is_error: ea,
                },
                NodeContent::ToolResult {
                    call_id: b,
                    name: nb,
                    parts: pb,
                    is_error: eb,
                },
            ) => a == b && na == nb && ea == eb && said(pa).eq(said(pb)),
            _ => self == other,
        }
    }

    /// The bytes of what a model reads of this content: its parts, its calls' names and
    /// arguments, a function's input or output.
    pub fn byte_len(&self) -> usize {
        let parts = |parts: &[Part]| -> usize { parts.iter().map(Part::byte_len).sum() };
        match self {
            NodeContent::Message {
                parts: p,
                tool_calls,
                ..
            } => {
                parts(p)
                    + tool_calls
                        .iter()
                        .map(|c| c.name.len() + c.arguments_json.len())
                        .sum::<usize>()
            }
            NodeContent::ToolResult { parts: p, .. } => parts(p),
            NodeContent::FunctionCall { input, .. } => input.len(),
            NodeContent::FunctionResult(r) => r.output.len(),
        }
    }

    pub fn kind(&self) -> NodeKind {
        match self {
            NodeContent::Message { .. } => NodeKind::Message,
            NodeContent::ToolResult { .. } => NodeKind::ToolResult,
            NodeContent::FunctionCall { .. } => NodeKind::FunctionCall,
            NodeContent::FunctionResult(_) => NodeKind::FunctionResult,
        }
    }

    /// The content parts, for the kinds that carry them.
    pub fn parts(&self) -> &[Part] {
        match self {
            NodeContent::Message { parts, .. } | NodeContent::ToolResult { parts, .. } => parts,
            NodeContent::FunctionCall { .. } | NodeContent::FunctionResult(_) => &[],
        }
    }
}

/// A stored node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub id: NodeId,
    pub parent_id: Option<NodeId>,
    /// The function_call node whose internal chain holds this node; `None` at top level.
    pub function_id: Option<NodeId>,
    pub content: NodeContent,
    pub created_at_ms: i64,
    pub hash: Hash,
}

impl NodeContent {
    /// Checks the rules a node must meet on its own, before any pairing: `field` names it in
    /// the request (`nodes[3]`).
    /// Refuses a node any single part of which (a text or media part, tool call arguments, a
    /// function's input or output) is over `max` bytes, naming the part's path under `field`.
    pub fn check_part_sizes(&self, field: &str, max: usize) -> Result<(), super::Error> {
        let check = |path: String, len: usize| {
            if len > max {
                Err(super::Error::invalid(
                    path,
                    format!(
                        "{len} bytes, over the server's limit of {max} for one part (--max-part-bytes)"
                    ),
                ))
            } else {
                Ok(())
            }
        };
        let parts = |path: String, parts: &[Part]| {
            parts
                .iter()
                .enumerate()
                .try_for_each(|(i, part)| check(format!("{path}.parts[{i}]"), part.byte_len()))
        };
        match self {
            NodeContent::Message {
                parts: p,
                tool_calls,
                ..
            } => {
                parts(format!("{field}.message"), p)?;
                tool_calls.iter().enumerate().try_for_each(|(i, call)| {
                    check(
                        format!("{field}.message.tool_calls[{i}].arguments_json"),
                        call.arguments_json.len(),
                    )
                })
            }
            NodeContent::ToolResult { parts: p, .. } => parts(format!("{field}.tool_result"), p),
            NodeContent::FunctionCall { input, .. } => {
                check(format!("{field}.function_call.input"), input.len())
            }
            NodeContent::FunctionResult(r) => {
                check(format!("{field}.function_result.output"), r.output.len())
            }
        }
    }

    pub fn validate(&self, field: &str) -> Result<(), super::Error> {
        use super::Error;
        let parts_ok = |parts: &[Part], at: &str| -> Result<(), Error> {
            for (i, part) in parts.iter().enumerate() {
                if let Part::Media { mime_type, source } = part {
                    if mime_type.is_empty() {
                        return Err(Error::invalid(
                            format!("{field}.{at}.parts[{i}].media.mime_type"),
                            "is required",
                        ));
                    }
                    if matches!(source, MediaSource::Url(url) if url.is_empty()) {
                        return Err(Error::invalid(
                            format!("{field}.{at}.parts[{i}].media.url"),
                            "is empty",
                        ));
                    }
                }
            }
            Ok(())
        };
        match self {
            NodeContent::Message {
                role,
                parts,
                tool_calls,
            } => {
                parts_ok(parts, "message")?;
                if !tool_calls.is_empty() && *role != Role::Assistant {
                    return Err(Error::invalid(
                        format!("{field}.message.tool_calls"),
                        format!(
                            "only assistant messages carry tool calls, not {}",
                            role.as_str()
                        ),
                    ));
                }
                if parts.is_empty() && tool_calls.is_empty() {
                    return Err(Error::invalid(
                        format!("{field}.message"),
                        "needs parts or tool_calls",
                    ));
                }
                for (i, call) in tool_calls.iter().enumerate() {
                    let at = format!("{field}.message.tool_calls[{i}]");
                    if call.call_id.is_empty() {
                        return Err(Error::invalid(format!("{at}.call_id"), "is required"));
                    }
                    if call.name.is_empty() {
                        return Err(Error::invalid(format!("{at}.name"), "is required"));
                    }
                    if tool_calls[..i].iter().any(|c| c.call_id == call.call_id) {
                        return Err(Error::invalid(
                            format!("{at}.call_id"),
                            format!("{:?} appears twice in this message", call.call_id),
                        ));
                    }
                    if let Err(e) =
                        serde_json::from_str::<serde::de::IgnoredAny>(&call.arguments_json)
                    {
                        return Err(Error::invalid(
                            format!("{at}.arguments_json"),
                            format!("not JSON: {e}"),
                        ));
                    }
                }
            }
            NodeContent::ToolResult { call_id, parts, .. } => {
                if call_id.is_empty() {
                    return Err(Error::invalid(
                        format!("{field}.tool_result.call_id"),
                        "is required",
                    ));
                }
                parts_ok(parts, "tool_result")?;
            }
            NodeContent::FunctionCall { call_id, .. } => {
                if call_id.is_empty() {
                    return Err(Error::invalid(
                        format!("{field}.function_call.call_id"),
                        "is required",
                    ));
                }
            }
            NodeContent::FunctionResult(result) => {
                if result.call_id.is_empty() {
                    return Err(Error::invalid(
                        format!("{field}.function_result.call_id"),
                        "is required",
                    ));
                }
            }
        }
        Ok(())
    }
}

/// A path as the store loads it for rendering.
#[derive(Debug, Clone, Default)]
pub struct PathView {
    /// From the root down to the target, oldest first; may cross function scopes when the
    /// target is inside a function.
    /// Shared with the store's cache of decoded nodes: a render reads them, never copies them.
    pub nodes: Vec<Arc<Node>>,
    /// The function whose chain is the target's (`None`: top level).
    pub scope: Option<NodeId>,
    /// Internal chains of completed functions that render in full, by function id, oldest first.
    pub chains: std::collections::HashMap<NodeId, Vec<Arc<Node>>>,
    /// Summaries that may lie over this path, oldest first; the engine keeps those whose every
    /// covered node is on it, newest first, skipping any that shares a node with one kept.
    pub summaries: Vec<super::Summary>,
    /// The session's pinned nodes (those not on the path are ignored).
    pub pinned: std::collections::HashSet<NodeId>,
}

impl PathView {
    /// Every node the path can show: its own and those of the chains it splices.
    pub fn all_nodes(&self) -> impl Iterator<Item = &Node> {
        self.nodes
            .iter()
            .chain(self.chains.values().flatten())
            .map(|n| &**n)
    }

    /// The ids of [`PathView::all_nodes`], for "is it on this path" questions.
    pub fn node_ids(&self) -> std::collections::HashSet<NodeId> {
        self.all_nodes().map(|n| n.id).collect()
    }
}
