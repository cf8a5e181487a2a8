//! Rendered messages as an OpenAI chat-completions `messages` array, and a branch's nodes as a
//! session file of them.

use super::*;
use crate::domain::{Role, ToolCall};

fn openai_content(parts: &[Part]) -> Value {
    let foreign = |p: &Part| block_of(p, &[WireFormat::AnthropicMessages, WireFormat::Responses]);
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
                Part::Block(_) => opaque(p, WireFormat::ChatCompletions).unwrap_or(Value::Null),
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

/// A chat-completions request: `messages` (a [`openai_chat`] document) for `model`, the answer
/// at most `max_tokens`, at `temperature`.
pub fn request(model: &str, messages: Value, max_tokens: u32, temperature: f64) -> Value {
    json!({
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": temperature,
    })
}

/// A tool's result as a `tool` message.
pub fn tool_message(call_id: &str, content: &str) -> Value {
    json!({ "role": "tool", "tool_call_id": call_id, "content": content })
}

/// A node's message as a session file writes it: its role, its content ([`session_content`])
/// and its calls.
pub fn session_message(role: Role, parts: &[Part], calls: &[ToolCall]) -> Value {
    let mut message = json!({ "role": role.as_str(), "content": session_content(parts) });
    if !calls.is_empty() {
        message["tool_calls"] = calls
            .iter()
            .map(|c| tool_call(&c.call_id, &c.name, &c.arguments_json))
            .collect();
    }
    message
}

/// The assistant message a session file gives a function no call of the model started, so its
/// result pairs: one call, its arguments the function's input.
pub fn session_call(call_id: &str, name: &str, input: &str) -> Value {
    let arguments = json!({ "input": input }).to_string();
    json!({
        "role": "assistant",
        "content": Value::Null,
        "tool_calls": [tool_call(call_id, name, &arguments)],
    })
}

/// A tool call of an assistant message.
fn tool_call(id: &str, name: &str, arguments: &str) -> Value {
    json!({
        "id": id,
        "type": "function",
        "function": { "name": name, "arguments": arguments },
    })
}

/// A message's parts as a session file writes them: a single text as a string, anything else
/// as an array of parts, media by their data or URL; blocks kept from another API are not chat
/// completions' to carry and are left out.
fn session_content(parts: &[Part]) -> Value {
    let parts: Vec<&Part> = parts
        .iter()
        .filter(|p| !block_of(p, &[WireFormat::AnthropicMessages, WireFormat::Responses]))
        .collect();
    match parts.as_slice() {
        [] => Value::Null,
        [Part::Text(text)] => Value::String(text.clone()),
        parts => parts
            .iter()
            .filter_map(|p| match p {
                Part::Text(text) => Some(json!({ "type": "text", "text": text })),
                Part::Media { mime_type, source } => {
                    let url = match source {
                        MediaSource::Data(data) => data_url(mime_type, data),
                        MediaSource::Url(url) => url.clone(),
                    };
                    Some(json!({ "type": "image_url", "image_url": { "url": url } }))
                }
                Part::Block(_) => opaque(p, WireFormat::ChatCompletions),
            })
            .collect(),
    }
}
