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

use crate::domain::{BlockFormat, MediaSource, NodeId, Part};
use crate::render::{Message, MessageRole, Reduction};

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
pub fn opaque(part: &Part, format: BlockFormat) -> Option<Value> {
    match part {
        Part::Block(block) if block.format == format => serde_json::from_str(&block.json).ok(),
        _ => None,
    }
}

/// Whether `part` is a kept block of one of `formats`.
fn block_of(part: &Part, formats: &[BlockFormat]) -> bool {
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
struct Pairs<'a> {
    /// For each message: the call ids it keeps (assistant messages).
    calls: Vec<HashSet<&'a str>>,
    /// For each message: whether a tool message is kept.
    results: Vec<bool>,
}

impl<'a> Pairs<'a> {
    fn of(messages: &'a [Message]) -> Self {
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

// ---------------------------------------------------------------- OpenAI

fn openai_content(parts: &[Part]) -> Value {
    let foreign = |p: &Part| block_of(p, &[BlockFormat::AnthropicMessages, BlockFormat::Responses]);
    if parts
        .iter()
        .all(|p| matches!(p, Part::Text(_)) || foreign(p))
    {
        return Value::String(text_of(parts));
    }
    Value::Array(
        parts
            .iter()
            .filter(|p| !foreign(p))
            .map(|p| match p {
                Part::Text(t) => json!({ "type": "text", "text": t }),
                Part::Block(_) => opaque(p, BlockFormat::ChatCompletions).unwrap_or(Value::Null),
                Part::Media { mime_type, source } if openai_carries(mime_type) => {
                    let url = match source {
                        MediaSource::Url(url) => url.clone(),
                        MediaSource::Data(data) => data_url(mime_type, data),
                    };
                    json!({ "type": "image_url", "image_url": { "url": url } })
                }
                Part::Media { mime_type, .. } => {
                    json!({ "type": "text", "text": format!("[{mime_type} attachment]") })
                }
            })
            .collect(),
    )
}

/// A chat-completions `messages` array.
pub fn openai_chat(messages: &[Message]) -> Value {
    openai_chat_document(messages).0
}

/// [`openai_chat`], and for each message of it the index of the rendered message it came from.
pub fn openai_chat_document(messages: &[Message]) -> (Value, Vec<Vec<usize>>) {
    let pairs = Pairs::of(messages);
    let mut out = Vec::with_capacity(messages.len());
    let mut sources = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        sources.resize(out.len(), Vec::new());
        sources.push(vec![i]);
        let doc = match m.role {
            MessageRole::System => json!({ "role": "system", "content": text_of(&m.parts) }),
            MessageRole::Developer => {
                json!({ "role": "developer", "content": text_of(&m.parts) })
            }
            // A message with nothing to say (a summary the agent's window carries) is left out.
            MessageRole::User if m.parts.is_empty() => continue,
            MessageRole::User => json!({ "role": "user", "content": openai_content(&m.parts) }),
            MessageRole::Assistant => {
                let calls: Vec<Value> = m
                    .tool_calls
                    .iter()
                    .filter(|c| pairs.calls[i].contains(c.call_id.as_str()))
                    .map(|c| {
                        json!({
                            "id": c.call_id,
                            "type": "function",
                            "function": { "name": c.name, "arguments": c.arguments_json },
                        })
                    })
                    .collect();
                let text = text_of(&m.parts);
                if text.is_empty() && calls.is_empty() {
                    continue;
                }
                let mut doc = json!({
                    "role": "assistant",
                    "content": if text.is_empty() { Value::Null } else { Value::String(text) },
                });
                if !calls.is_empty() {
                    doc["tool_calls"] = Value::Array(calls);
                }
                doc
            }
            MessageRole::Tool if !pairs.results[i] => continue,
            MessageRole::Tool => json!({
                "role": "tool",
                "tool_call_id": m.tool_call_id.as_deref().unwrap_or_default(),
                "content": text_of(&m.parts),
            }),
        };
        out.push(doc);
    }
    sources.truncate(out.len());
    (Value::Array(out), sources)
}

// ---------------------------------------------------------------- OpenAI Responses

/// A kept Responses item's fields part (see [`ITEM_FIELDS`]), if `part` is one.
fn item_fields(part: &Part) -> Option<serde_json::Map<String, Value>> {
    match opaque(part, BlockFormat::Responses)? {
        Value::Object(map)
            if map.get("type").and_then(Value::as_str) == Some(ITEM_FIELDS)
                && map.get("item").is_some_and(Value::is_object) =>
        {
            Some(map)
        }
        _ => None,
    }
}

/// The item members a fields part restores (`id`, `status`, `type`...).
fn fields_item(fields: &serde_json::Map<String, Value>) -> serde_json::Map<String, Value> {
    match fields.get("item") {
        Some(Value::Object(item)) => item.clone(),
        _ => serde_json::Map::new(),
    }
}

/// Content parts of a Responses input message or function output: text as `text_type`, kept
/// parts as themselves, images as `input_image`, other media as a placeholder. Fields parts and
/// other providers' kept blocks are left out.
fn responses_content(parts: &[Part], text_type: &str) -> Vec<Value> {
    parts
        .iter()
        .filter_map(|p| match p {
            Part::Text(t) => Some(json!({ "type": text_type, "text": t })),
            Part::Block(_) => opaque(p, BlockFormat::Responses)
                .filter(|v| item_fields(p).is_none() && !v.is_null()),
            Part::Media { mime_type, source } if openai_carries(mime_type) => {
                let url = match source {
                    MediaSource::Url(url) => url.clone(),
                    MediaSource::Data(data) => data_url(mime_type, data),
                };
                Some(json!({ "type": "input_image", "image_url": url }))
            }
            Part::Media { mime_type, .. } => {
                Some(json!({ "type": text_type, "text": format!("[{mime_type} attachment]") }))
            }
        })
        .collect()
}

/// A call as the item it was: `function_call`, or `custom_tool_call` with its `input` (stored as
/// the arguments `{"input": ..}`), with the fields it was stored with.
fn responses_call(call: &crate::domain::ToolCall, fields: serde_json::Map<String, Value>) -> Value {
    let mut item = fields;
    let custom = item.get("type").and_then(Value::as_str) == Some("custom_tool_call");
    if !item.contains_key("type") {
        item.insert("type".into(), json!("function_call"));
    }
    item.insert("call_id".into(), json!(call.call_id));
    item.insert("name".into(), json!(call.name));
    if custom {
        let input = match serde_json::from_str::<Value>(&call.arguments_json) {
            Ok(Value::Object(args)) => match args.get("input") {
                Some(Value::String(s)) => s.clone(),
                _ => call.arguments_json.clone(),
            },
            _ => call.arguments_json.clone(),
        };
        item.insert("input".into(), Value::String(input));
    } else {
        item.insert("arguments".into(), json!(call.arguments_json));
    }
    Value::Object(item)
}

/// A Responses API `input` array. System, developer and user messages are `message` items
/// (with the fields and content form they were stored with); an assistant message gives back
/// its kept items in order, its text as `output_text` messages and its calls (where they stood
/// in the run when a fields part says so, else after it) as `function_call` or
/// `custom_tool_call` items; tool messages are `function_call_output` (or
/// `custom_tool_call_output`) items, a cleared or truncated one as its text.
pub fn responses_input(messages: &[Message]) -> Value {
    responses_document(messages).0
}

/// [`responses_input`], and for each item of it the index of the rendered message it came
/// from (an assistant message may give several items).
pub fn responses_document(messages: &[Message]) -> (Value, Vec<Vec<usize>>) {
    let pairs = Pairs::of(messages);
    let mut custom: HashSet<&str> = HashSet::new();
    let mut out = Vec::with_capacity(messages.len());
    let mut sources: Vec<Vec<usize>> = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        // The items pushed since the last message are that message's.
        let owner = i.checked_sub(1).map(|p| vec![p]).unwrap_or_default();
        sources.resize(out.len(), owner);
        match m.role {
            MessageRole::System | MessageRole::Developer | MessageRole::User => {
                let role = match m.role {
                    MessageRole::System => "system",
                    MessageRole::Developer => "developer",
                    _ => "user",
                };
                let content = responses_content(&m.parts, "input_text");
                if content.is_empty() {
                    continue;
                }
                let fields = m.parts.iter().find_map(item_fields);
                let mut item = fields.as_ref().map(fields_item).unwrap_or_else(|| {
                    let mut item = serde_json::Map::new();
                    item.insert("type".into(), json!("message"));
                    item
                });
                let string = fields
                    .as_ref()
                    .and_then(|f| f.get("form"))
                    .and_then(Value::as_str)
                    == Some("string");
                item.insert("role".into(), json!(role));
                let all_text = m
                    .parts
                    .iter()
                    .all(|p| matches!(p, Part::Text(_)) || item_fields(p).is_some());
                item.insert(
                    "content".into(),
                    if string && all_text {
                        Value::String(text_of(&m.parts))
                    } else {
                        Value::Array(content)
                    },
                );
                out.push(Value::Object(item));
            }
            MessageRole::Assistant => {
                let kept = |id: &str| pairs.calls[i].contains(id);
                let mut placed: HashSet<&str> = HashSet::new();
                let mut text: Vec<Value> = Vec::new();
                let flush = |text: &mut Vec<Value>, out: &mut Vec<Value>| {
                    if !text.is_empty() {
                        out.push(json!({
                            "type": "message",
                            "role": "assistant",
                            "content": std::mem::take(text),
                        }));
                    }
                };
                for p in &m.parts {
                    match p {
                        Part::Text(t) if t.is_empty() => {}
                        Part::Text(t) => text.push(json!({ "type": "output_text", "text": t })),
                        Part::Block(b) if b.format == BlockFormat::Responses => {
                            flush(&mut text, &mut out);
                            if let Some(fields) = item_fields(p) {
                                let id = fields.get("call_id").and_then(Value::as_str);
                                let call =
                                    m.tool_calls.iter().find(|c| Some(c.call_id.as_str()) == id);
                                if let Some(call) = call
                                    && kept(&call.call_id)
                                    && placed.insert(call.call_id.as_str())
                                {
                                    let item = fields_item(&fields);
                                    if item.get("type").and_then(Value::as_str)
                                        == Some("custom_tool_call")
                                    {
                                        custom.insert(call.call_id.as_str());
                                    }
                                    out.push(responses_call(call, item));
                                }
                            } else if let Some(item) = opaque(p, BlockFormat::Responses) {
                                out.push(item);
                            }
                        }
                        Part::Block(_) => {}
                        Part::Media { mime_type, .. } => text.push(json!({
                            "type": "output_text",
                            "text": format!("[{mime_type} attachment]"),
                        })),
                    }
                }
                flush(&mut text, &mut out);
                for call in &m.tool_calls {
                    if kept(&call.call_id) && placed.insert(call.call_id.as_str()) {
                        out.push(responses_call(call, serde_json::Map::new()));
                    }
                }
            }
            MessageRole::Tool if !pairs.results[i] => continue,
            MessageRole::Tool => {
                let call_id = m.tool_call_id.as_deref().unwrap_or_default();
                let fields = m.parts.iter().find_map(item_fields);
                let mut item = fields.as_ref().map(fields_item).unwrap_or_default();
                if !item.contains_key("type") {
                    let kind = if custom.contains(call_id) {
                        "custom_tool_call_output"
                    } else {
                        "function_call_output"
                    };
                    item.insert("type".into(), json!(kind));
                }
                let array = fields
                    .as_ref()
                    .and_then(|f| f.get("form"))
                    .and_then(Value::as_str)
                    == Some("array");
                let all_text = m
                    .parts
                    .iter()
                    .all(|p| matches!(p, Part::Text(_)) || item_fields(p).is_some());
                let output = if m.reduction != Reduction::None || (!array && all_text) {
                    Value::String(text_of(&m.parts))
                } else {
                    Value::Array(responses_content(&m.parts, "input_text"))
                };
                item.insert("call_id".into(), json!(call_id));
                item.insert("output".into(), output);
                out.push(Value::Object(item));
            }
        }
    }
    let last = messages
        .len()
        .checked_sub(1)
        .map(|p| vec![p])
        .unwrap_or_default();
    sources.resize(out.len(), last);
    (Value::Array(out), sources)
}

// ---------------------------------------------------------------- Anthropic

fn anthropic_blocks(parts: &[Part]) -> Vec<Value> {
    parts
        .iter()
        .filter_map(|p| match p {
            Part::Text(t) if t.is_empty() => None,
            Part::Text(t) => Some(json!({ "type": "text", "text": t })),
            Part::Block(_) => anthropic_block(p),
            Part::Media { mime_type, source } => {
                if !anthropic_carries(mime_type) {
                    return Some(
                        json!({ "type": "text", "text": format!("[{mime_type} attachment]") }),
                    );
                }
                let kind = if mime_type.starts_with("image/") {
                    "image"
                } else {
                    "document"
                };
                let source = match source {
                    MediaSource::Url(url) => json!({ "type": "url", "url": url }),
                    MediaSource::Data(data) => json!({
                        "type": "base64",
                        "media_type": mime_type,
                        "data": BASE64.encode(data),
                    }),
                };
                Some(json!({ "type": kind, "source": source }))
            }
        })
        .collect()
}

/// A kept Messages API block as itself (`None`: another API's, or a message's own fields).
pub fn anthropic_block(part: &Part) -> Option<Value> {
    opaque(part, BlockFormat::AnthropicMessages).filter(|b| !is_message_fields(b))
}

fn is_message_fields(block: &Value) -> bool {
    block.get("type").and_then(Value::as_str) == Some(MESSAGE_FIELDS)
}

/// The message-level fields kept among `parts` (see [`MESSAGE_FIELDS`]).
fn message_fields(parts: &[Part]) -> Vec<(String, Value)> {
    parts
        .iter()
        .filter_map(|p| opaque(p, BlockFormat::AnthropicMessages))
        .filter(is_message_fields)
        .filter_map(|b| match b {
            Value::Object(map) => Some(map.into_iter().filter(|(k, _)| k != "type")),
            _ => None,
        })
        .flatten()
        .collect()
}

/// A tool result's content: one string when it is text alone (as clients send it), else its
/// blocks, so images and kept blocks reach the model as themselves.
fn anthropic_result_content(parts: &[Part]) -> Value {
    let foreign = |p: &Part| block_of(p, &[BlockFormat::ChatCompletions, BlockFormat::Responses]);
    if parts
        .iter()
        .all(|p| matches!(p, Part::Text(_)) || foreign(p))
    {
        return Value::String(text_of(parts));
    }
    Value::Array(anthropic_blocks(parts))
}

/// A Messages API request body's `{system, messages}` (`system` only when there is one): roles alternate, every `tool_use` is
/// answered by a `tool_result` in the next user message, consecutive results share one message.
pub fn anthropic_messages(messages: &[Message]) -> Value {
    anthropic_document(messages, false).0
}

/// [`anthropic_messages`], and for each document message the indexes of the rendered messages
/// it holds (several when consecutive results and user text share one), for callers that
/// place markers on what they sent. With `system_messages`, system and developer messages
/// stay in place as `system` messages (the Messages API takes them mid-conversation in a beta
/// that agents use), with the message-level fields they were stored with.
pub fn anthropic_document(messages: &[Message], system_messages: bool) -> (Value, Vec<Vec<usize>>) {
    let pairs = Pairs::of(messages);
    // Leading system and developer messages are the system prompt; later ones (rare) are kept
    // in place as marked user text, since the API has no mid-conversation system role.
    let leading = if system_messages {
        0
    } else {
        messages
            .iter()
            .take_while(|m| matches!(m.role, MessageRole::System | MessageRole::Developer))
            .count()
    };
    let system = messages[..leading]
        .iter()
        .map(|m| text_of(&m.parts))
        .collect::<Vec<_>>()
        .join("\n\n");
    let mut out: Vec<(&'static str, Vec<Value>)> = Vec::new();
    let mut sources: Vec<Vec<usize>> = Vec::new();
    let mut fields: Vec<Vec<(String, Value)>> = Vec::new();
    for (i, m) in messages.iter().enumerate().skip(leading) {
        let (role, blocks) = match m.role {
            MessageRole::System | MessageRole::Developer if system_messages => {
                ("system", anthropic_blocks(&m.parts))
            }
            MessageRole::System | MessageRole::Developer => (
                "user",
                vec![json!({ "type": "text", "text": format!("[system] {}", text_of(&m.parts)) })],
            ),
            MessageRole::User => ("user", anthropic_blocks(&m.parts)),
            MessageRole::Assistant => {
                let mut blocks = anthropic_blocks(&m.parts);
                blocks.extend(
                    m.tool_calls
                        .iter()
                        .filter(|c| pairs.calls[i].contains(c.call_id.as_str()))
                        .map(|c| {
                            json!({
                                "type": "tool_use",
                                "id": c.call_id,
                                "name": c.name,
                                "input": arguments_object(&c.arguments_json),
                            })
                        }),
                );
                ("assistant", blocks)
            }
            MessageRole::Tool if !pairs.results[i] => continue,
            MessageRole::Tool => {
                let mut block = json!({
                    "type": "tool_result",
                    "tool_use_id": m.tool_call_id.as_deref().unwrap_or_default(),
                    "content": anthropic_result_content(&m.parts),
                });
                if m.is_error {
                    block["is_error"] = Value::Bool(true);
                }
                ("user", vec![block])
            }
        };
        if blocks.is_empty() {
            continue;
        }
        let own = if system_messages {
            message_fields(&m.parts)
        } else {
            Vec::new()
        };
        match out.last_mut() {
            Some((last, existing)) if *last == role && role != "system" => {
                existing.extend(blocks);
                if let Some(s) = sources.last_mut() {
                    s.push(i);
                }
                if let Some(f) = fields.last_mut() {
                    f.extend(own);
                }
            }
            _ => {
                out.push((role, blocks));
                sources.push(vec![i]);
                fields.push(own);
            }
        }
    }
    // The API wants the conversation to open with the user.
    if out.first().is_some_and(|(role, _)| *role == "assistant") {
        out.insert(
            0,
            (
                "user",
                vec![json!({ "type": "text", "text": "[earlier conversation omitted]" })],
            ),
        );
        sources.insert(0, Vec::new());
        fields.insert(0, Vec::new());
    }
    let messages: Vec<Value> = out
        .into_iter()
        .zip(fields)
        .map(|((role, content), fields)| {
            let mut message = json!({ "role": role, "content": content });
            for (k, v) in fields {
                message[k] = v;
            }
            message
        })
        .collect();
    // An empty system prompt is left out rather than sent as "".
    let document = if system.is_empty() {
        json!({ "messages": messages })
    } else {
        json!({ "system": system, "messages": messages })
    };
    (document, sources)
}
