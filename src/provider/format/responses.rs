//! Rendered messages as OpenAI Responses `input` items, kept items and call fields restored.

use super::*;

/// A kept Responses item's fields part (see [`ITEM_FIELDS`]), if `part` is one.
fn item_fields(part: &Part) -> Option<serde_json::Map<String, Value>> {
    match opaque(part, WireFormat::Responses)? {
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
            Part::Block(_) => opaque(p, WireFormat::Responses)
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
                        Part::Block(b) if b.format == WireFormat::Responses => {
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
                            } else if let Some(item) = opaque(p, WireFormat::Responses) {
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
