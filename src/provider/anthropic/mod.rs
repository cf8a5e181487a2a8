//! The Anthropic Messages API as the gateway reads and writes it: a request's messages as
//! nodes, an answer (whole or streamed) as the assistant node it appends, the rendered branch
//! as the `messages` it forwards (with the client's cache markers), and the API's error shape.
//!
//! Blocks ctxd does not reduce (thinking and its signature, redacted thinking, server tool use
//! and its results, documents, citations, compaction blocks, any type it does not know) are
//! kept as their canonical JSON (`Part::Block`) and given back as such.

mod answer;
mod codec;
pub mod edits;
pub mod session;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::{Value, json};

use super::answer::assistant_node;
use super::canonical::{canonical, canonical_block};
use super::conversation::{Conversation, Item, Refusal, estimate};
use super::format::MESSAGE_FIELDS;
use crate::domain::{MediaSource, NodeContent, Part, ProviderBlock, Role, ToolCall, WireFormat};

pub use codec::Messages;

/// How Claude Code's first system block begins: `x-anthropic-billing-header: …; cch=…`.
const BILLING_HEADER: &str = "x-anthropic-billing-header:";

/// Cache breakpoints one request may carry.
pub const MAX_MARKERS: usize = 4;

/// Reads a Messages API request body. Texts are taken out of `body`, not copied: a request of
/// many megabytes is held once while it is read.
pub fn read(body: &mut Value) -> Result<Conversation, Refusal> {
    let (obj, model) = Conversation::request(body)?;
    if !matches!(obj.get("messages"), Some(Value::Array(_))) {
        return Err(Refusal::invalid("messages", "must be an array of messages"));
    }
    let mut conv = Conversation::begun(obj, model, obj.get("max_tokens"));
    let system = match obj.get("system") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(blocks)) => {
            conv.fixed_markers += blocks
                .iter()
                .filter(|b| b.get("cache_control").is_some())
                .count();
            blocks
                .iter()
                .filter_map(|b| b.get("text").and_then(Value::as_str))
                // Claude Code's billing block changes from request to request: it names no
                // conversation (the body still carries it, byte-exact).
                .filter(|t| !t.starts_with(BILLING_HEADER))
                .collect::<Vec<_>>()
                .join("\n")
        }
        Some(_) => {
            return Err(Refusal::invalid(
                "system",
                "must be a string or an array of blocks",
            ));
        }
    };
    conv.system_tokens = u32::try_from(estimate(system.len())).unwrap_or(u32::MAX);
    if let Some(Value::Array(tools)) = obj.get("tools") {
        conv.fixed_markers += tools
            .iter()
            .filter(|t| t.get("cache_control").is_some())
            .count();
    }
    conv.client_session = obj
        .get("metadata")
        .and_then(|m| m.get("user_id"))
        .and_then(Value::as_str)
        .and_then(claude_code_session);
    let messages = match body.get_mut("messages") {
        Some(Value::Array(messages)) => messages,
        _ => return Err(Refusal::invalid("messages", "must be an array of messages")),
    };
    for (i, message) in messages.iter_mut().enumerate() {
        read_message(&mut conv, i, message)?;
    }
    Ok(conv.finish(&system))
}

/// A request that resends `previous`'s first `from` messages unchanged, and every field beside
/// its messages (see [`crate::provider::codec::Codec::read_resent`]): its other messages
/// (`tail`) read after them. `None`: read it whole.
pub fn read_resent(
    previous: &Conversation,
    from: usize,
    tail: Vec<Value>,
) -> Option<Result<Conversation, Refusal>> {
    let mut conv = previous.resent(from)?;
    for (i, mut message) in tail.into_iter().enumerate() {
        if let Err(refusal) = read_message(&mut conv, from + i, &mut message) {
            return Some(Err(refusal));
        }
    }
    Some(Ok(conv.finish_resent(&previous.opening)))
}

/// Claude Code's session id in `metadata.user_id`: a JSON string with `session_id`, or the
/// older `user_<hash>_account_<uuid>_session_<uuid>` form.
fn claude_code_session(user_id: &str) -> Option<String> {
    if let Ok(Value::Object(map)) = serde_json::from_str::<Value>(user_id) {
        return map
            .get("session_id")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_owned);
    }
    user_id
        .rsplit_once("_session_")
        .map(|(_, id)| id.to_owned())
        .filter(|id| !id.is_empty())
}

fn read_message(conv: &mut Conversation, i: usize, message: &mut Value) -> Result<(), Refusal> {
    let at = format!("messages[{i}]");
    // A string content is one text block, taken as such.
    if let Some(Value::String(s)) = message.get_mut("content") {
        let text = std::mem::take(s);
        message["content"] = json!([{"type": "text", "text": text}]);
    }
    let Some(obj) = message.as_object_mut() else {
        return Err(Refusal::invalid(at, "must be an object"));
    };
    let role = match obj.get("role").and_then(Value::as_str) {
        Some("user") => Role::User,
        Some("assistant") => Role::Assistant,
        // Mid-conversation system messages: a beta Claude Code uses for per-turn instructions.
        Some("system") => Role::System,
        _ => {
            return Err(Refusal::invalid(
                format!("{at}.role"),
                "must be \"user\", \"assistant\" or \"system\"",
            ));
        }
    };
    // The message's own fields beside role and content (Claude Code's per-turn
    // `output_config`): kept with it, and given back on it.
    let extra: serde_json::Map<String, Value> = obj
        .iter()
        .filter(|(k, _)| *k != "role" && *k != "content")
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let envelope = (!extra.is_empty()).then(|| {
        let mut fields = extra;
        fields.insert("type".to_owned(), Value::String(MESSAGE_FIELDS.to_owned()));
        kept(&Value::Object(fields))
    });
    let mut content = obj.remove("content");
    let blocks: &mut [Value] = match &mut content {
        Some(Value::Array(blocks)) => blocks,
        _ => {
            return Err(Refusal::invalid(
                format!("{at}.content"),
                "must be a string or an array of content blocks",
            ));
        }
    };
    for (j, block) in blocks.iter().enumerate() {
        if block.get("type").and_then(Value::as_str).is_none() {
            return Err(Refusal::invalid(
                format!("{at}.content[{j}].type"),
                "must be a string",
            ));
        }
    }
    if let Some(marker) = blocks.iter().rev().find_map(|b| b.get("cache_control")) {
        conv.markers.push((i, marker.clone()));
    }
    match role {
        Role::Assistant => {
            let content = match (assistant(blocks)?, envelope) {
                (
                    Some(NodeContent::Message {
                        role,
                        mut parts,
                        tool_calls,
                    }),
                    Some(e),
                ) => {
                    parts.insert(0, e);
                    Some(NodeContent::Message {
                        role,
                        parts,
                        tool_calls,
                    })
                }
                (content, None) => content,
                (_, Some(_)) => {
                    return Err(Refusal::Unrecordable("message fields on an empty message"));
                }
            };
            if let Some(content) = content {
                conv.items.push(Item {
                    content,
                    message: i,
                    through: i,
                });
            }
        }
        _ => {
            let (results, mut parts) = user_blocks(blocks)?;
            if !results.is_empty() && role != Role::User {
                return Err(Refusal::Unrecordable("content before tool results"));
            }
            conv.items.extend(results.into_iter().map(|content| Item {
                content,
                message: i,
                through: i,
            }));
            if !parts.is_empty() {
                parts.splice(0..0, envelope);
                conv.items.push(Item {
                    content: NodeContent::Message {
                        role,
                        parts,
                        tool_calls: Vec::new(),
                    },
                    message: i,
                    through: i,
                });
            } else if envelope.is_some() {
                return Err(Refusal::Unrecordable(
                    "message fields on a message of results only",
                ));
            }
        }
    }
    Ok(())
}

/// A user message's blocks as the nodes they make: its tool results, each a node of its own and
/// all before any other content, then the parts of the message the rest makes (none: no
/// message). Plain texts are taken out of `blocks`.
pub fn user_blocks(blocks: &mut [Value]) -> Result<(Vec<NodeContent>, Vec<Part>), Refusal> {
    let mut results = Vec::new();
    let mut parts = Vec::new();
    for block in blocks.iter_mut() {
        if block.get("type").and_then(Value::as_str) == Some("tool_result") {
            if !parts.is_empty() {
                return Err(Refusal::Unrecordable("content before tool results"));
            }
            results.push(tool_result(block)?);
        } else if let Some(part) = taken_part(block) {
            parts.push(part);
        }
    }
    Ok((results, parts))
}

/// A block as a content part: plain text as text, a base64 or URL image as media, anything
/// else kept whole. Empty text is left out (clients and the API drop it alike).
fn part(block: &Value) -> Option<Part> {
    let obj = block.as_object()?;
    let plain = |allowed: &[&str]| obj.keys().all(|k| allowed.contains(&k.as_str()));
    match obj.get("type").and_then(Value::as_str) {
        Some("text") if plain(&["type", "text", "cache_control"]) => {
            let text = obj.get("text").and_then(Value::as_str)?;
            (!text.is_empty()).then(|| Part::Text(text.to_owned()))
        }
        Some("image") if plain(&["type", "source", "cache_control"]) => {
            image(obj.get("source")?).or_else(|| Some(kept(block)))
        }
        _ => Some(kept(block)),
    }
}

/// [`part`], a plain text taken out of `block`.
fn taken_part(block: &mut Value) -> Option<Part> {
    if let Some(obj) = block.as_object_mut()
        && obj.get("type").and_then(Value::as_str) == Some("text")
        && obj
            .keys()
            .all(|k| ["type", "text", "cache_control"].contains(&k.as_str()))
        && let Some(Value::String(text)) = obj.get_mut("text")
    {
        return (!text.is_empty()).then(|| Part::Text(std::mem::take(text)));
    }
    part(block)
}

fn image(source: &Value) -> Option<Part> {
    match source.get("type").and_then(Value::as_str)? {
        "base64" if source.as_object()?.len() == 3 => {
            let mime = source.get("media_type")?.as_str()?;
            let data = BASE64.decode(source.get("data")?.as_str()?).ok()?;
            // Only where encoding it again gives back the very string the client sent.
            (BASE64.encode(&data) == source.get("data")?.as_str()?).then(|| Part::Media {
                mime_type: mime.to_owned(),
                source: MediaSource::Data(data),
            })
        }
        "url" if source.as_object()?.len() == 2 => Some(Part::Media {
            mime_type: "image/*".to_owned(),
            source: MediaSource::Url(source.get("url")?.as_str()?.to_owned()),
        }),
        _ => None,
    }
}

fn kept(block: &Value) -> Part {
    let json = canonical_block(block);
    if is_reasoning(block) {
        Part::Block(ProviderBlock::reasoning(json))
    } else {
        Part::Block(ProviderBlock::new(WireFormat::AnthropicMessages, json))
    }
}

/// Whether `block` is the model's reasoning: a thinking block, redacted or not.
pub fn is_reasoning(block: &Value) -> bool {
    matches!(
        block.get("type").and_then(Value::as_str),
        Some("thinking" | "redacted_thinking")
    )
}

fn tool_result(block: &mut Value) -> Result<NodeContent, Refusal> {
    let call_id = block
        .get("tool_use_id")
        .and_then(Value::as_str)
        .ok_or(Refusal::Unrecordable("tool_result without tool_use_id"))?;
    let known = [
        "type",
        "tool_use_id",
        "content",
        "is_error",
        "cache_control",
    ];
    if block
        .as_object()
        .is_some_and(|o| o.keys().any(|k| !known.contains(&k.as_str())))
    {
        return Err(Refusal::Unrecordable("tool_result with unknown fields"));
    }
    let is_error = block
        .get("is_error")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let call_id = call_id.to_owned();
    let parts = match block.get_mut("content") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) if s.is_empty() => Vec::new(),
        Some(Value::String(s)) => vec![Part::Text(std::mem::take(s))],
        Some(Value::Array(blocks)) => blocks.iter_mut().filter_map(taken_part).collect(),
        Some(_) => return Err(Refusal::Unrecordable("tool_result content of another type")),
    };
    Ok(NodeContent::ToolResult {
        call_id,
        name: String::new(),
        parts,
        is_error,
    })
}

/// An assistant message's blocks as its node: text and kept blocks as parts in order, then
/// the tool calls. The same function reads a resent message and an answer, so both hash
/// alike. `None`: nothing to record (an empty message).
pub fn assistant(blocks: &[Value]) -> Result<Option<NodeContent>, Refusal> {
    let mut parts = Vec::new();
    let mut tool_calls = Vec::new();
    for block in blocks {
        if block.get("type").and_then(Value::as_str) == Some("tool_use") {
            let (Some(id), Some(name)) = (
                block.get("id").and_then(Value::as_str),
                block.get("name").and_then(Value::as_str),
            ) else {
                return Err(Refusal::Unrecordable("tool_use without id or name"));
            };
            // The input is parsed already: written canonically as it is, not written, read
            // and written again.
            let arguments_json = match block.get("input") {
                Some(input) => canonical(input),
                None => "{}".to_owned(),
            };
            tool_calls.push(ToolCall {
                call_id: id.to_owned(),
                name: name.to_owned(),
                arguments_json,
            });
        } else if let Some(p) = part(block) {
            if !tool_calls.is_empty() {
                // The node keeps parts before calls; this order could not be given back.
                return Err(Refusal::Unrecordable("content after tool use"));
            }
            parts.push(p);
        }
    }
    Ok(assistant_node(parts, tool_calls))
}

/// The API's error body.
pub fn error(kind: &str, message: &str) -> Value {
    json!({"type": "error", "error": {"type": kind, "message": message}})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::ProviderUsage;
    use crate::provider::codec::Codec as _;

    fn request(messages: Value) -> Conversation {
        read(&mut json!({"model": "claude-x", "max_tokens": 100, "messages": messages}))
            .expect("a request")
    }

    fn contents(conv: &Conversation) -> Vec<NodeContent> {
        conv.items.iter().map(|i| i.content.clone()).collect()
    }

    #[test]
    fn identity_ignores_the_forms_clients_change_between_calls() {
        let a = request(json!([
            {"role": "user", "content": "read it"},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "t1", "name": "Read", "input": {"path": "a", "limit": 2}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "x"}]},
        ]));
        let b = request(json!([
            {"role": "user", "content": [{"type": "text", "text": "read it",
                                           "cache_control": {"type": "ephemeral"}}]},
            {"role": "assistant", "content": [
                {"type": "tool_use", "name": "Read", "id": "t1", "input": {"limit": 2, "path": "a"}}]},
            {"role": "user", "content": [{"tool_use_id": "t1", "type": "tool_result",
                                           "content": [{"type": "text", "text": "x"}],
                                           "cache_control": {"type": "ephemeral"}}]},
        ]));
        assert_eq!(contents(&a), contents(&b));
        assert_eq!(b.markers.len(), 2, "markers are kept aside, per message");
        // The tool result takes its call's name, as the store would.
        assert!(
            matches!(&a.items[2].content, NodeContent::ToolResult { name, .. } if name == "Read")
        );
    }

    #[test]
    fn a_streamed_answer_is_the_node_its_resend_reads_as() {
        let events = [
            json!({"type": "message_start", "message": {"usage": {"input_tokens": 3,
                "cache_read_input_tokens": 10, "cache_creation_input_tokens": 5}}}),
            json!({"type": "content_block_start", "index": 0,
                   "content_block": {"type": "thinking", "thinking": "", "signature": ""}}),
            json!({"type": "content_block_delta", "index": 0,
                   "delta": {"type": "thinking_delta", "thinking": "plan"}}),
            json!({"type": "content_block_delta", "index": 0,
                   "delta": {"type": "signature_delta", "signature": "sig"}}),
            json!({"type": "content_block_stop", "index": 0}),
            json!({"type": "content_block_start", "index": 1,
                   "content_block": {"type": "tool_use", "id": "t9", "name": "Bash", "input": {}}}),
            json!({"type": "content_block_delta", "index": 1,
                   "delta": {"type": "input_json_delta", "partial_json": "{\"command\": "}}),
            json!({"type": "content_block_delta", "index": 1,
                   "delta": {"type": "input_json_delta", "partial_json": "\"ls\"}"}}),
            json!({"type": "content_block_stop", "index": 1}),
            json!({"type": "message_delta", "usage": {"output_tokens": 7}}),
            json!({"type": "message_stop"}),
        ];
        let mut answer = Messages.answer(true);
        for e in &events {
            // Split each event across two chunks, as a network may.
            let text = format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap_or(""));
            let (a, b) = text.split_at(text.len() / 2);
            answer.feed(a.as_bytes());
            answer.feed(b.as_bytes());
        }
        assert!(answer.complete());
        let (node, usage) = answer.finish().expect("a whole answer");
        let resent = request(json!([
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "plan", "signature": "sig"},
                {"type": "tool_use", "id": "t9", "name": "Bash", "input": {"command": "ls"}}]},
        ]));
        assert_eq!(node.as_ref(), Some(&resent.items[1].content));
        assert_eq!(
            usage,
            ProviderUsage {
                input: 3,
                cache_read: 10,
                cache_write: 5,
                output: 7,
                ..ProviderUsage::default()
            }
        );
    }

    #[test]
    fn an_answer_cut_short_or_failed_is_not_whole() {
        let mut cut = Messages.answer(true);
        cut.feed(b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{}}\n\n");
        assert!(cut.finish().is_none());
        let mut failed = Messages.answer(true);
        failed.feed(
            b"data: {\"type\":\"error\",\"error\":{}}\n\ndata: {\"type\":\"message_stop\"}\n\n",
        );
        assert!(failed.finish().is_none());
    }

    #[test]
    fn the_billing_block_is_no_part_of_a_conversations_opening() {
        let with = |billing: &str| {
            read(
                &mut json!({"model": "claude-x", "max_tokens": 100, "system": [
                {"type": "text", "text": billing},
                {"type": "text", "text": "You are a coding agent."},
            ], "messages": [{"role": "user", "content": "hi"}]}),
            )
            .expect("a request")
            .opening
        };
        assert_eq!(
            with("x-anthropic-billing-header: cc_version=2.1.332; cch=1a2b"),
            with("x-anthropic-billing-header: cc_version=2.1.332; cch=9f8e"),
        );
        assert!(!with("x-anthropic-billing-header: cch=0").contains("cch"));
    }

    #[test]
    fn bad_requests_name_their_field() {
        let err = |mut body: Value| match read(&mut body) {
            Err(Refusal::Invalid { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        assert_eq!(err(json!([])), "body");
        assert_eq!(err(json!({"messages": []})), "model");
        assert_eq!(err(json!({"model": "m"})), "messages");
        assert_eq!(
            err(json!({"model": "m", "messages": [{"role": "bot", "content": "x"}]})),
            "messages[0].role"
        );
        assert_eq!(
            err(json!({"model": "m", "messages": [{"role": "user", "content": 3}]})),
            "messages[0].content"
        );
        assert!(matches!(
            read(
                &mut json!({"model": "m", "messages": [{"role": "user", "content": [
                {"type": "text", "text": "x"}, {"type": "tool_result", "tool_use_id": "t"}]}]})
            ),
            Err(Refusal::Unrecordable("content before tool results"))
        ));
    }
}
