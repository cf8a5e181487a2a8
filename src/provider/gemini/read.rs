//! A `generateContent` request read into the nodes its `contents` make (see the module docs):
//! its budget parts, each content's nodes, function responses paired to their calls.

use serde_json::{Map, Value, json};

use super::parts::{Element, element, kept, media, model_node, push_plain, without};
use super::{CONTENT, FIELDS, WIRE, mark, target};
use crate::domain::{NodeContent, Part, Role};
use crate::provider::canonical::canonical;
use crate::provider::conversation::{Conversation, Item, Refusal, estimate};

/// Tokens an answer may take when the request does not say: the default `maxOutputTokens` of
/// Gemini 2.5 and 3 models.
const DEFAULT_OUTPUT: u64 = 65_536;

/// Reads a request to `path` (which names the model and whether the answer streams). A
/// `countTokens` body's `generateContentRequest` is the request it counts.
pub fn read(path: &str, mut body: Value) -> Result<Conversation, Refusal> {
    let Some(t) = target(path) else {
        return Err(Refusal::invalid(
            "path",
            "must be /v1beta/models/{model}:{method}",
        ));
    };
    if t.action == "countTokens"
        && let Some(inner) = body.get_mut("generateContentRequest")
    {
        body = inner.take();
    }
    let Some(obj) = body.as_object_mut() else {
        return Err(Refusal::invalid("body", "must be a JSON object"));
    };
    if obj.get("cachedContent").is_some_and(|v| !v.is_null()) {
        // The history's start is in Google's cache, not in the request.
        return Err(Refusal::Unrecordable("cachedContent"));
    }
    let config = obj.get("generationConfig");
    if config
        .and_then(|c| c.get("candidateCount"))
        .and_then(Value::as_u64)
        .is_some_and(|n| n > 1)
    {
        // Several answers to one request: none of them is the conversation's next content.
        return Err(Refusal::Unrecordable("candidateCount over 1"));
    }
    let max = config
        .and_then(|c| c.get("maxOutputTokens"))
        .cloned()
        .unwrap_or(json!(DEFAULT_OUTPUT));
    let system = system_text(obj.get("systemInstruction"))?;
    let mut conv = Conversation::begun(obj, t.model.to_owned(), Some(&max));
    // A stream without `alt=sse` is one JSON array, read whole at its end.
    conv.stream = t.action == "streamGenerateContent" && t.sse != Some(false);
    conv.system_tokens = u32::try_from(estimate(system.len())).unwrap_or(u32::MAX);
    let mut list = match obj.get_mut("contents") {
        Some(Value::Array(list)) => std::mem::take(list),
        _ => return Err(Refusal::invalid("contents", "must be an array of contents")),
    };
    conv.items = contents(&mut list)?;
    Ok(conv.finish(&system))
}

/// The text of `systemInstruction` (a content, or a string as SDKs accept it).
fn system_text(value: Option<&Value>) -> Result<String, Refusal> {
    let parts = match value {
        None | Some(Value::Null) => return Ok(String::new()),
        Some(Value::String(s)) => return Ok(s.clone()),
        Some(Value::Object(content)) => content.get("parts"),
        Some(_) => {
            return Err(Refusal::invalid(
                "systemInstruction",
                "must be a content or a string",
            ));
        }
    };
    match parts {
        None => Ok(String::new()),
        Some(Value::Array(parts)) => Ok(parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n")),
        Some(_) => Err(Refusal::invalid(
            "systemInstruction.parts",
            "must be an array of parts",
        )),
    }
}

/// A call of a model content as its results are paired to it.
#[derive(Debug, Clone)]
pub struct CallRef {
    pub call_id: String,
    pub name: String,
    /// The `id` the call had on the wire.
    pub wire_id: Option<String>,
}

/// Reads `contents` (texts are taken out of them) into the nodes they make, each with the index
/// of its content.
pub fn contents(contents: &mut [Value]) -> Result<Vec<Item>, Refusal> {
    let mut items = Vec::new();
    let mut previous: Option<Vec<CallRef>> = None;
    for (i, content) in contents.iter_mut().enumerate() {
        let at = format!("contents[{i}]");
        let Some(obj) = content.as_object_mut() else {
            return Err(Refusal::invalid(at, "must be an object"));
        };
        let model = match obj.get("role") {
            Some(Value::String(r)) if r == "model" => true,
            Some(Value::String(r)) if r == "user" => false,
            None | Some(Value::Null) => false,
            Some(_) => {
                return Err(Refusal::invalid(
                    format!("{at}.role"),
                    "must be \"user\" or \"model\"",
                ));
            }
        };
        let parts = match obj.remove("parts") {
            Some(Value::Array(parts)) if !parts.is_empty() => parts,
            _ => {
                return Err(Refusal::invalid(
                    format!("{at}.parts"),
                    "must be a non-empty array of parts",
                ));
            }
        };
        let mut own = Map::new();
        if obj.get("role").is_none_or(Value::is_null) {
            own.insert("no_role".into(), json!(true));
        }
        let fields: Map<String, Value> = obj
            .iter()
            .filter(|(k, v)| *k != "role" && !v.is_null())
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if !fields.is_empty() {
            own.insert("fields".into(), Value::Object(fields));
        }
        let own = (!own.is_empty()).then(|| mark(CONTENT, own));
        let push = |items: &mut Vec<Item>, content| {
            items.push(Item {
                content,
                message: i,
                through: i,
            })
        };
        if model {
            let (node, calls) = model_node(&at, parts)?;
            if let Some(NodeContent::Message {
                role,
                mut parts,
                tool_calls,
            }) = node
            {
                parts.splice(0..0, own);
                push(
                    &mut items,
                    NodeContent::Message {
                        role,
                        parts,
                        tool_calls,
                    },
                );
            }
            previous = Some(calls);
        } else {
            for node in user_nodes(&at, parts, own, previous.take())? {
                push(&mut items, node);
            }
        }
    }
    Ok(items)
}

/// A user content's nodes: its function responses as tool results paired to `calls` (the
/// model content before it), then a user message of its other parts. `own` is the content's
/// block, given to its first node.
fn user_nodes(
    at: &str,
    parts: Vec<Value>,
    own: Option<Part>,
    calls: Option<Vec<CallRef>>,
) -> Result<Vec<NodeContent>, Refusal> {
    let calls = calls.unwrap_or_default();
    let mut answered: Vec<Option<usize>> = vec![None; calls.len()];
    // Each response: the call it answers, the part as sent, its copies sent again.
    let mut responses: Vec<(usize, Value, usize)> = Vec::new();
    let mut message = Vec::new();
    for (j, part) in parts.into_iter().enumerate() {
        let at = format!("{at}.parts[{j}]");
        match element(&at, part)? {
            Element::Call { .. } => {
                return Err(Refusal::invalid(
                    format!("{at}.functionCall"),
                    "only a model content makes calls",
                ));
            }
            Element::Response(part) => {
                if !message.is_empty() {
                    return Err(Refusal::Unrecordable("content before function responses"));
                }
                let response = &part["functionResponse"];
                let name = response["name"].as_str().unwrap_or_default();
                let id = response.get("id").and_then(Value::as_str);
                let by_id =
                    id.and_then(|id| calls.iter().position(|c| c.wire_id.as_deref() == Some(id)));
                let call = by_id.or_else(|| {
                    (0..calls.len()).find(|&c| answered[c].is_none() && calls[c].name == name)
                });
                let Some(c) = call.filter(|&c| answered[c].is_none()) else {
                    // The same response sent again (Gemini CLI 0.61 resends a resumed
                    // session's results twice): a copy of the first, given back after it.
                    if let Some(r) = responses.iter_mut().find(|r| r.1 == part) {
                        r.2 += 1;
                        continue;
                    }
                    return Err(Refusal::Unrecordable(
                        "a function response that answers no call of the content before it",
                    ));
                };
                if calls[c].name != name {
                    return Err(Refusal::Unrecordable(
                        "a function response named apart from its call",
                    ));
                }
                answered[c] = Some(responses.len());
                responses.push((c, part, 0));
            }
            Element::Plain(part, fields, wire) => push_plain(&mut message, part, fields, wire),
            Element::Reasoning(part) => message.push(kept(&part, true)),
        }
    }
    let mut nodes: Vec<NodeContent> = responses
        .into_iter()
        .map(|(c, part, repeat)| result_node(part, &calls[c], repeat))
        .collect();
    if !message.is_empty() {
        if !nodes.is_empty() {
            message.insert(
                0,
                mark(CONTENT, Map::from_iter([("joined".into(), json!(true))])),
            );
        }
        nodes.push(NodeContent::Message {
            role: Role::User,
            parts: message,
            tool_calls: Vec::new(),
        });
    }
    if let Some(own) = own
        && let Some(NodeContent::Message { parts, .. } | NodeContent::ToolResult { parts, .. }) =
            nodes.first_mut()
    {
        parts.insert(0, own);
    }
    Ok(nodes)
}

/// A function response (checked by [`element`]) as the tool result of `call`.
fn result_node(mut part: Value, call: &CallRef, repeat: usize) -> NodeContent {
    let obj = part.as_object_mut().expect("element() checked the part");
    let mut response = match obj.remove("functionResponse") {
        Some(Value::Object(r)) => r,
        _ => Map::new(),
    };
    let mut wire = Map::new();
    if let Some(Value::String(s)) = obj.remove("thoughtSignature") {
        wire.insert("thoughtSignature".into(), json!(s));
    }
    match response.remove("id") {
        Some(Value::String(id)) => {
            wire.insert("id".into(), json!(id));
        }
        // Written back, a result takes its call's id unless it came without one.
        _ if call.wire_id.is_some() => {
            wire.insert("no_id".into(), json!(true));
        }
        _ => {}
    }
    if repeat > 0 {
        wire.insert("repeat".into(), json!(repeat));
    }
    response.remove("name");
    let body = match response.remove("response") {
        Some(Value::Object(body)) => body,
        _ => Map::new(),
    };
    let extra = match response.remove("parts") {
        Some(Value::Array(parts)) => parts,
        _ => Vec::new(),
    };
    let mut fields = Map::new();
    let own = without(obj, &[]);
    if !own.is_empty() {
        fields.insert("part".into(), Value::Object(own));
    }
    let rest = without(&response, &[]);
    if !rest.is_empty() {
        fields.insert("response".into(), Value::Object(rest));
    }
    let only = |key: &str| match body.get(key) {
        Some(Value::String(s)) if body.len() == 1 => Some(s.clone()),
        _ => None,
    };
    let (text, is_error) = match (only("output"), only("error")) {
        (Some(s), _) => (s, false),
        (_, Some(s)) => (s, true),
        _ => {
            fields.insert("form".into(), json!("object"));
            (canonical(&Value::Object(body)), false)
        }
    };
    let mut parts = Vec::new();
    if !fields.is_empty() {
        parts.push(mark(FIELDS, fields));
    }
    if !wire.is_empty() {
        parts.push(mark(WIRE, wire));
    }
    parts.push(Part::Text(text));
    parts.extend(extra.iter().map(|p| {
        p.get("inlineData")
            .filter(|_| p.as_object().is_some_and(|o| o.len() == 1))
            .and_then(media)
            .unwrap_or_else(|| kept(p, false))
    }));
    NodeContent::ToolResult {
        call_id: call.call_id.clone(),
        name: call.name.clone(),
        parts,
        is_error,
    }
}
