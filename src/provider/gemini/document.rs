//! Rendered messages as Gemini `contents`: user and model contents with kept parts, fields and
//! wire members given back on the part or content they belong to, every call followed by its
//! result in the next user content (a call whose result is not there is left out, as the other
//! documents do), consecutive results in one content as Gemini CLI sends them.

use std::collections::{HashMap, HashSet};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::{Map, Value, json};

use super::{CONTENT, FIELDS, WIRE, part_marker};
use crate::domain::{MediaSource, Part, ToolCall, WireFormat};
use crate::provider::format::Pairs;
use crate::render::{Message, MessageRole, Reduction};

type Members = Map<String, Value>;

/// One content being written.
struct Entry {
    model: bool,
    parts: Vec<Value>,
    /// The content's own members (`fields`, `no_role`) from its nodes' content blocks.
    own: Map<String, Value>,
    sources: Vec<usize>,
    /// It holds tool results (a joined user message may follow into it).
    results: bool,
}

/// `messages` as `contents`, and which messages each content holds.
pub fn document(messages: &[Message]) -> (Vec<Value>, Vec<Vec<usize>>) {
    let Pairs { calls, results } = Pairs::of(messages);
    // The assistant message whose calls the tool messages after it answer.
    let mut group: Option<&Message> = None;
    let mut out: Vec<Entry> = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        let (own, joined) = content_block(&m.parts);
        match m.role {
            MessageRole::Assistant => group = Some(m),
            MessageRole::Tool => {}
            _ => group = None,
        }
        let after_results = out
            .last()
            .is_some_and(|e| e.results && e.sources.last().copied() == i.checked_sub(1));
        let (model, parts, result) = match m.role {
            MessageRole::System | MessageRole::Developer => {
                let text = Part::text_of(&m.parts);
                if text.is_empty() {
                    continue;
                }
                // Gemini has no system role inside `contents`: the user says it, marked.
                (
                    false,
                    vec![json!({ "text": format!("[system] {text}") })],
                    false,
                )
            }
            MessageRole::User => (false, parts(m, &HashSet::new()), false),
            MessageRole::Assistant => (true, parts(m, &calls[i]), false),
            MessageRole::Tool if !results[i] => continue,
            MessageRole::Tool => {
                let name = m.name.clone().unwrap_or_else(|| call_name(messages, i));
                let id = group.zip(m.tool_call_id.as_deref()).and_then(wire_id);
                (false, response(m, &name, id.as_ref()), true)
            }
        };
        if parts.is_empty() {
            continue;
        }
        let into_last = after_results && (result || joined);
        match out.last_mut() {
            Some(last) if into_last => {
                last.parts.extend(parts);
                last.sources.push(i);
                last.own.extend(own);
            }
            _ => out.push(Entry {
                model,
                parts,
                own,
                sources: vec![i],
                results: result,
            }),
        }
    }
    let sources = out.iter().map(|e| e.sources.clone()).collect();
    let contents = out
        .into_iter()
        .map(|e| {
            let mut content = Map::new();
            if e.own.get("no_role") != Some(&json!(true)) {
                content.insert("role".into(), json!(if e.model { "model" } else { "user" }));
            }
            if let Some(Value::Object(fields)) = e.own.get("fields") {
                content.extend(fields.clone());
            }
            content.insert("parts".into(), Value::Array(e.parts));
            Value::Object(content)
        })
        .collect();
    (contents, sources)
}

/// The name of the call tool message `i` answers, from the assistant message before it.
fn call_name(messages: &[Message], i: usize) -> String {
    let id = messages[i].tool_call_id.as_deref().unwrap_or_default();
    messages[..i]
        .iter()
        .rev()
        .flat_map(|m| m.tool_calls.iter())
        .find(|c| c.call_id == id)
        .map(|c| c.name.clone())
        .unwrap_or_default()
}

/// The wire id call `call_id` of `m` had: its result's too, when the result's own blocks are
/// gone (a cleared result is its placeholder alone).
fn wire_id((m, call_id): (&Message, &str)) -> Option<Value> {
    m.parts
        .iter()
        .filter_map(part_marker)
        .filter(|(kind, members)| kind == WIRE && members.get("call_id") == Some(&json!(call_id)))
        .find_map(|(_, mut members)| members.remove("id"))
}

/// A message's content block: the content's own members, and whether the message shared its
/// content with the results before it.
fn content_block(parts: &[Part]) -> (Map<String, Value>, bool) {
    let mut own = Map::new();
    let mut joined = false;
    for (kind, mut members) in parts.iter().filter_map(part_marker) {
        if kind == CONTENT {
            joined |= members.remove("joined") == Some(json!(true));
            own.extend(members);
        }
    }
    (own, joined)
}

/// `members[key]` as an object.
fn object(members: &Map<String, Value>, key: &str) -> Map<String, Value> {
    match members.get(key) {
        Some(Value::Object(map)) => map.clone(),
        _ => Map::new(),
    }
}

/// A non-call part as Gemini's: text, inline data, or a kept part as itself (another format's
/// kept blocks and markers are left out; media by URL as a placeholder, since Gemini reads only
/// its own file URIs).
fn plain(part: &Part) -> Option<Value> {
    match part {
        Part::Text(t) => Some(json!({ "text": t })),
        Part::Media {
            mime_type,
            source: MediaSource::Data(data),
        } => Some(json!({"inlineData": {"mimeType": mime_type, "data": BASE64.encode(data)}})),
        Part::Media { mime_type, .. } => {
            Some(json!({ "text": format!("[{mime_type} attachment]") }))
        }
        Part::Block(b) if b.format == WireFormat::Gemini && part_marker(part).is_none() => {
            serde_json::from_str(&b.json).ok()
        }
        Part::Block(_) => None,
    }
}

/// The arguments of a call as the object Gemini wants; anything else wrapped.
fn args(arguments: &str) -> Value {
    match serde_json::from_str::<Value>(arguments) {
        Ok(Value::Object(map)) => Value::Object(map),
        Ok(other) => json!({ "value": other }),
        Err(_) => json!({ "raw": arguments }),
    }
}

/// A call as its `functionCall` part, with the fields and wire members it was stored with.
fn call_part(call: &ToolCall, fields: &Map<String, Value>, wire: &Map<String, Value>) -> Value {
    let mut function = Map::new();
    if let Some(id) = wire.get("id") {
        function.insert("id".into(), id.clone());
    }
    function.insert("name".into(), json!(call.name));
    if wire.get("no_args") != Some(&json!(true)) {
        function.insert("args".into(), args(&call.arguments_json));
    }
    function.extend(object(fields, "call"));
    let mut part = object(fields, "part");
    part.insert("functionCall".into(), Value::Object(function));
    if let Some(sig) = wire.get("thoughtSignature") {
        part.insert("thoughtSignature".into(), sig.clone());
    }
    Value::Object(part)
}

/// A user or model message's parts: each call of `keep` where its first block stands (the
/// rest after the parts), fields and wire members put back on the part they belong to.
fn parts(m: &Message, keep: &HashSet<&str>) -> Vec<Value> {
    // Each call's fields and wire members.
    let mut blocks: HashMap<String, (Members, Members)> = HashMap::new();
    for (kind, members) in m.parts.iter().filter_map(part_marker) {
        if let Some(Value::String(id)) = members.get("call_id") {
            let entry = blocks.entry(id.clone()).or_default();
            match kind.as_str() {
                FIELDS => entry.0.extend(members),
                WIRE => entry.1.extend(members),
                _ => {}
            }
        }
    }
    let mut out: Vec<Value> = Vec::new();
    let mut placed: HashSet<String> = HashSet::new();
    let place = |call: &ToolCall, out: &mut Vec<Value>, placed: &mut HashSet<String>| {
        if keep.contains(call.call_id.as_str()) && placed.insert(call.call_id.clone()) {
            let (fields, wire) = blocks.get(&call.call_id).cloned().unwrap_or_default();
            out.push(call_part(call, &fields, &wire));
        }
    };
    // The part a block without a call id belongs to.
    let mut last: Option<usize> = None;
    for p in &m.parts {
        let Some((kind, members)) = part_marker(p) else {
            if let Some(v) = plain(p) {
                out.push(v);
                last = Some(out.len() - 1);
            }
            continue;
        };
        match members.get("call_id").and_then(Value::as_str) {
            Some(id) => {
                if let Some(call) = m.tool_calls.iter().find(|c| c.call_id == id) {
                    place(call, &mut out, &mut placed);
                }
                last = None;
            }
            None => {
                let Some(Value::Object(part)) = last.and_then(|k| out.get_mut(k)) else {
                    continue;
                };
                match kind.as_str() {
                    FIELDS => part.extend(object(&members, "part")),
                    WIRE => {
                        part.extend(members.into_iter().filter(|(k, _)| k == "thoughtSignature"))
                    }
                    _ => {}
                }
            }
        }
    }
    for call in &m.tool_calls {
        place(call, &mut out, &mut placed);
    }
    out
}

/// A tool message as its `functionResponse` part (and the copies of it the client sent), with
/// its own wire id, else its call's (`call_id`) unless it came without one.
fn response(m: &Message, name: &str, call_id: Option<&Value>) -> Vec<Value> {
    let (mut fields, mut wire) = (Map::new(), Map::new());
    for (kind, members) in m.parts.iter().filter_map(part_marker) {
        match kind.as_str() {
            FIELDS => fields.extend(members),
            WIRE => wire.extend(members),
            _ => {}
        }
    }
    let text = Part::text_of(&m.parts);
    let body = match (m.reduction, fields.get("form")) {
        (Reduction::None, Some(f)) if f == "object" => serde_json::from_str::<Value>(&text)
            .ok()
            .filter(Value::is_object),
        _ => None,
    };
    let body = body.unwrap_or_else(|| {
        if m.is_error {
            json!({ "error": text })
        } else {
            json!({ "output": text })
        }
    });
    let mut function = Map::new();
    let id = match wire.get("no_id") {
        Some(Value::Bool(true)) => None,
        _ => wire.get("id").or(call_id),
    };
    if let Some(id) = id {
        function.insert("id".into(), id.clone());
    }
    function.insert("name".into(), json!(name));
    function.insert("response".into(), body);
    let media: Vec<Value> = m
        .parts
        .iter()
        .filter(|p| !matches!(p, Part::Text(_)))
        .filter_map(plain)
        // A placeholder for media Gemini cannot read is no part a response holds.
        .filter(|v| v.get("text").is_none())
        .collect();
    if !media.is_empty() {
        function.insert("parts".into(), Value::Array(media));
    }
    function.extend(object(&fields, "response"));
    let mut part = object(&fields, "part");
    part.insert("functionResponse".into(), Value::Object(function));
    if let Some(sig) = wire.get("thoughtSignature") {
        part.insert("thoughtSignature".into(), sig.clone());
    }
    let copies = wire.get("repeat").and_then(Value::as_u64).unwrap_or(0);
    let part = Value::Object(part);
    std::iter::repeat_n(part, 1 + copies as usize).collect()
}
