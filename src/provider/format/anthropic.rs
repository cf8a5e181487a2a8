//! Rendered messages as an Anthropic Messages API `{system, messages}`, kept blocks and a
//! message's own fields restored.

use super::*;

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
    opaque(part, WireFormat::AnthropicMessages).filter(|b| !is_message_fields(b))
}

fn is_message_fields(block: &Value) -> bool {
    block.get("type").and_then(Value::as_str) == Some(MESSAGE_FIELDS)
}

/// The message-level fields kept among `parts` (see [`MESSAGE_FIELDS`]).
fn message_fields(parts: &[Part]) -> Vec<(String, Value)> {
    parts
        .iter()
        .filter_map(|p| opaque(p, WireFormat::AnthropicMessages))
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
    let foreign = |p: &Part| block_of(p, &[WireFormat::ChatCompletions, WireFormat::Responses]);
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

/// A tool call as a `tool_use` block; its input the call's arguments as an object.
pub fn tool_use_block(call_id: &str, name: &str, arguments: &str) -> Value {
    json!({ "type": "tool_use", "id": call_id, "name": name, "input": arguments_object(arguments) })
}

/// A tool's result as the user message that carries it.
pub fn tool_result_message(call_id: &str, content: Value, is_error: bool) -> Value {
    json!({
        "role": "user",
        "content": [{
            "type": "tool_result", "tool_use_id": call_id, "content": content, "is_error": is_error,
        }],
    })
}

/// A client's message without its cache markers (ctxd places its own).
pub fn strip_markers(entry: &mut serde_json::Map<String, Value>) {
    if let Some(Value::Array(blocks)) = entry.get_mut("content") {
        for b in blocks {
            if let Value::Object(b) = b {
                b.remove("cache_control");
            }
        }
    }
}

/// Puts `marker` on the last block of a message, turning a string content into one text block.
pub fn mark_last_block(entry: &mut serde_json::Map<String, Value>, marker: Value) {
    if let Some(Value::String(s)) = entry.get("content") {
        let block = json!({"type": "text", "text": s});
        entry.insert("content".to_owned(), Value::Array(vec![block]));
    }
    if let Some(Value::Array(blocks)) = entry.get_mut("content")
        && let Some(Value::Object(last)) = blocks.last_mut()
    {
        last.insert("cache_control".to_owned(), marker);
    }
}
