//! OpenAI chat completions as the gateway reads and writes them: a request's messages as nodes
//! (system and developer messages included, since they are messages there), an answer (whole
//! or streamed chunks) as the assistant node it appends, the rendered branch as the `messages`
//! it forwards, and the API's error shape. Content parts other than text are kept whole
//! (`Part::Block`).

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::{Value, json};

use super::answer::{assistant_node, entries, index, openai_error, openai_usage, part};
use super::canonical::{canonical_arguments, canonical_block};
use super::codec::{self, Answer, Codec, Failure, Progress, ReadResent, Request, Spec, Upstream};
use super::conversation::{Conversation, Item, Refusal};
use super::format::openai_chat_document;
use crate::domain::{
    MediaSource, NodeContent, Part, ProviderBlock, ProviderUsage, Role, ToolCall, WireFormat,
};
use crate::render::Message;

/// Reads a chat-completions request body.
pub fn read(body: &Value) -> Result<Conversation, Refusal> {
    let (obj, model) = Conversation::request(body)?;
    let Some(Value::Array(messages)) = obj.get("messages") else {
        return Err(Refusal::invalid("messages", "must be an array of messages"));
    };
    if obj.get("n").and_then(Value::as_u64).is_some_and(|n| n > 1) {
        // Several answers to one request: none of them is the conversation's next message.
        return Err(Refusal::Unrecordable("n over 1"));
    }
    let max_tokens = obj
        .get("max_completion_tokens")
        .or_else(|| obj.get("max_tokens"));
    let mut conv = Conversation::begun(obj, model, max_tokens);
    for (i, message) in messages.iter().enumerate() {
        read_message(&mut conv, i, message)?;
    }
    let system = conv
        .first_text(Role::System)
        .or_else(|| conv.first_text(Role::Developer))
        .unwrap_or_default();
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
    for (i, message) in tail.iter().enumerate() {
        if let Err(refusal) = read_message(&mut conv, from + i, message) {
            return Some(Err(refusal));
        }
    }
    let system = conv
        .first_text(Role::System)
        .or_else(|| conv.first_text(Role::Developer))
        .unwrap_or_default();
    Some(Ok(conv.finish(&system)))
}

/// A file of chat messages (ctxd imports it as OpenAI's): a `messages` array, or a whole
/// request body whose `model` may be missing, read as the gateway reads the request; with how
/// many messages it holds. Tool-call arguments that are not JSON, which the gateway forwards as
/// they came, are refused here, naming the call.
pub fn read_file(file: Value) -> Result<(Conversation, usize), Refusal> {
    let body = match file {
        Value::Array(messages) => json!({ "model": "", "messages": messages }),
        Value::Object(mut body) => {
            if !body.get("model").is_some_and(Value::is_string) {
                body.insert("model".to_owned(), Value::String(String::new()));
            }
            Value::Object(body)
        }
        _ => return Err(Refusal::invalid("messages", "must be an array")),
    };
    let conversation = read(&body)?;
    for item in &conversation.items {
        let NodeContent::Message { tool_calls, .. } = &item.content else {
            continue;
        };
        for (k, call) in tool_calls.iter().enumerate() {
            if let Err(e) = serde_json::from_str::<serde::de::IgnoredAny>(&call.arguments_json) {
                let field = format!(
                    "messages[{}].tool_calls[{k}].function.arguments",
                    item.message
                );
                return Err(Refusal::invalid(field, format!("not JSON: {e}")));
            }
        }
    }
    let messages = body["messages"].as_array().map_or(0, Vec::len);
    Ok((conversation, messages))
}

fn read_message(conv: &mut Conversation, i: usize, message: &Value) -> Result<(), Refusal> {
    let at = format!("messages[{i}]");
    let Some(obj) = message.as_object() else {
        return Err(Refusal::invalid(at, "must be an object"));
    };
    let role = obj.get("role").and_then(Value::as_str).unwrap_or_default();
    let content = obj.get("content");
    if !matches!(
        content,
        None | Some(Value::Null | Value::String(_) | Value::Array(_))
    ) {
        return Err(Refusal::invalid(
            format!("{at}.content"),
            "must be a string, an array of content parts or null",
        ));
    }
    // Fields a client may send back as the API gave them, empty; anything else set is a shape
    // the gateway does not record.
    let benign = [
        "role",
        "content",
        "name",
        "tool_calls",
        "tool_call_id",
        "refusal",
        "annotations",
        "audio",
        "function_call",
    ];
    for (k, v) in obj {
        if !benign.contains(&k.as_str()) && !v.is_null() {
            return Err(Refusal::Unrecordable("a message field it does not know"));
        }
    }
    for k in ["audio", "function_call", "refusal"] {
        if obj.get(k).is_some_and(|v| !v.is_null()) {
            return Err(Refusal::Unrecordable("a message field it does not know"));
        }
    }
    let item = match role {
        "system" | "developer" | "user" => {
            let role = match role {
                "system" => Role::System,
                "developer" => Role::Developer,
                _ => Role::User,
            };
            let parts = parts(content);
            if parts.is_empty() {
                return Ok(());
            }
            NodeContent::Message {
                role,
                parts,
                tool_calls: Vec::new(),
            }
        }
        "assistant" => match assistant(content, obj.get("tool_calls"))? {
            Some(content) => content,
            None => return Ok(()),
        },
        "tool" => {
            let call_id = obj
                .get("tool_call_id")
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    Refusal::invalid(format!("{at}.tool_call_id"), "must be a string")
                })?;
            NodeContent::ToolResult {
                call_id: call_id.to_owned(),
                name: String::new(),
                parts: parts(content),
                is_error: false,
            }
        }
        "function" => return Err(Refusal::Unrecordable("a legacy function message")),
        _ => {
            return Err(Refusal::invalid(
                format!("{at}.role"),
                "must be \"system\", \"developer\", \"user\", \"assistant\" or \"tool\"",
            ));
        }
    };
    conv.items.push(Item {
        content: item,
        message: i,
        through: i,
    });
    Ok(())
}

/// Content as parts: a string as text, text parts as text, any other part kept whole.
fn parts(content: Option<&Value>) -> Vec<Part> {
    match content {
        Some(Value::String(s)) if !s.is_empty() => vec![Part::Text(s.clone())],
        Some(Value::Array(items)) => items
            .iter()
            .filter_map(|p| {
                let plain = p
                    .as_object()
                    .is_some_and(|o| o.keys().all(|k| k == "type" || k == "text"));
                match (
                    p.get("type").and_then(Value::as_str),
                    p.get("text").and_then(Value::as_str),
                ) {
                    (Some("text"), Some("")) if plain => None,
                    (Some("text"), Some(t)) if plain => Some(Part::Text(t.to_owned())),
                    (Some("image_url"), _) if image(p).is_some() => image(p),
                    _ => Some(Part::Block(ProviderBlock::new(
                        WireFormat::ChatCompletions,
                        canonical_block(p),
                    ))),
                }
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// An `image_url` part that is only its URL, as media: a `data:` URL's bytes (only where
/// encoding them again gives back the very URL, so the part is written back as it came), any
/// other URL as a link.
fn image(part: &Value) -> Option<Part> {
    let obj = part.as_object()?;
    let image = obj.get("image_url")?.as_object()?;
    if obj.len() != 2 || image.len() != 1 {
        return None;
    }
    let url = image.get("url")?.as_str()?;
    if let Some((mime, data)) = url
        .strip_prefix("data:")
        .and_then(|rest| rest.split_once(";base64,"))
    {
        let bytes = BASE64.decode(data).ok()?;
        return (BASE64.encode(&bytes) == data && mime.starts_with("image/")).then(|| {
            Part::Media {
                mime_type: mime.to_owned(),
                source: MediaSource::Data(bytes),
            }
        });
    }
    (url.starts_with("https://") || url.starts_with("http://")).then(|| Part::Media {
        mime_type: "image/*".to_owned(),
        source: MediaSource::Url(url.to_owned()),
    })
}

/// An assistant message as its node; the same function reads a resent message and an answer.
fn assistant(
    content: Option<&Value>,
    calls: Option<&Value>,
) -> Result<Option<NodeContent>, Refusal> {
    let parts = parts(content);
    let mut tool_calls = Vec::new();
    if let Some(Value::Array(calls)) = calls {
        for call in calls {
            let f = call.get("function");
            let (Some(id), Some(name), Some(arguments)) = (
                call.get("id").and_then(Value::as_str),
                f.and_then(|f| f.get("name")).and_then(Value::as_str),
                f.and_then(|f| f.get("arguments")).and_then(Value::as_str),
            ) else {
                return Err(Refusal::Unrecordable("a tool call of another kind"));
            };
            tool_calls.push(ToolCall {
                call_id: id.to_owned(),
                name: name.to_owned(),
                arguments_json: canonical_arguments(arguments),
            });
        }
    }
    Ok(assistant_node(parts, tool_calls))
}

fn usage(u: &Value) -> ProviderUsage {
    openai_usage(
        u,
        "prompt_tokens",
        "prompt_tokens_details",
        "completion_tokens",
    )
}

/// A chat completion's streamed chunks: the text and the calls (by index: id, name,
/// arguments) of its first choice.
#[derive(Debug, Default)]
struct Events {
    content: String,
    calls: Vec<(String, String, String)>,
    finished: bool,
}

impl codec::Events for Events {
    fn event(&mut self, _name: &str, data: Option<&Value>, progress: &mut Progress) {
        match data {
            // `[DONE]` is not JSON.
            None => progress.stopped = true,
            Some(chunk) => self.chunk(chunk, progress),
        }
    }

    fn streamed(self: Box<Self>) -> Option<Option<NodeContent>> {
        if !self.finished {
            return None;
        }
        let content = (!self.content.is_empty()).then(|| Value::String(self.content.clone()));
        let calls: Vec<Value> = self
            .calls
            .iter()
            .map(|(id, name, args)| json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}}))
            .collect();
        let calls = (!calls.is_empty()).then_some(Value::Array(calls));
        assistant(content.as_ref(), calls.as_ref()).ok()
    }

    fn body(&self, body: &Value, into: &mut ProviderUsage) -> Option<Option<NodeContent>> {
        let message = body.get("choices")?.get(0)?.get("message")?;
        if message.get("refusal").is_some_and(|r| !r.is_null()) {
            return None;
        }
        if let Some(u) = body.get("usage") {
            *into = usage(u);
        }
        assistant(message.get("content"), message.get("tool_calls")).ok()
    }
}

impl Events {
    fn chunk(&mut self, chunk: &Value, progress: &mut Progress) {
        if chunk.get("error").is_some() {
            progress.failed = true;
        }
        if let Some(u) = chunk.get("usage").filter(|u| u.is_object()) {
            progress.usage = usage(u);
        }
        let Some(Value::Array(choices)) = chunk.get("choices") else {
            return;
        };
        for choice in choices {
            if choice.get("index").and_then(Value::as_u64).unwrap_or(0) != 0 {
                continue;
            }
            if choice.get("finish_reason").is_some_and(|f| !f.is_null()) {
                self.finished = true;
            }
            let Some(delta) = choice.get("delta") else {
                continue;
            };
            if let Some(text) = delta.get("content").and_then(Value::as_str) {
                self.content.push_str(text);
            }
            if delta.get("refusal").is_some_and(|r| !r.is_null()) {
                progress.failed = true;
            }
            if let Some(Value::Array(calls)) = delta.get("tool_calls") {
                for call in calls {
                    let i = index(call, "index").unwrap_or(0);
                    let Some(slot) = part(&mut self.calls, i) else {
                        progress.failed = true;
                        continue;
                    };
                    if let Some(id) = call.get("id").and_then(Value::as_str) {
                        slot.0 = id.to_owned();
                    }
                    let f = call.get("function");
                    if let Some(name) = f.and_then(|f| f.get("name")).and_then(Value::as_str) {
                        slot.1.push_str(name);
                    }
                    if let Some(a) = f.and_then(|f| f.get("arguments")).and_then(Value::as_str) {
                        slot.2.push_str(a);
                    }
                }
            }
        }
    }
}

/// OpenAI's chat completions (`/v1/chat/completions`).
pub struct Completions;

impl Codec for Completions {
    fn spec(&self) -> &'static Spec {
        &Spec {
            name: "openai",
            upstream: Upstream::OpenAi,
            routes: &["/v1/chat/completions"],
            field: "messages",
        }
    }

    fn read(&self, request: Request<'_>) -> Result<Conversation, Refusal> {
        read(&request.body)
    }

    fn read_resent(&self) -> Option<ReadResent> {
        Some(read_resent)
    }

    fn document(&self, messages: &[Message]) -> (Vec<Value>, Vec<Vec<usize>>) {
        entries(openai_chat_document(messages))
    }

    fn tool(&self, name: &str, description: &str, parameters: Value) -> Value {
        json!({"type": "function", "function":
            {"name": name, "description": description, "parameters": parameters}})
    }

    fn answer(&self, stream: bool) -> Answer {
        Answer::new(stream, Box::<Events>::default())
    }

    fn error(&self, failure: Failure, message: &str, param: Option<&str>) -> Value {
        openai_error(failure, message, param)
    }
}
