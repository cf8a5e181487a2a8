//! A content's parts as read: texts, media, calls and kept blocks, a model content as its
//! assistant node (the same reading for a resent content and an answer), ctxd's call ids.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::{Map, Value, json};

use super::read::CallRef;
use super::{FIELDS, WIRE, mark};
use crate::domain::{MediaSource, NodeContent, Part, ProviderBlock, ToolCall, WireFormat};
use crate::provider::answer::assistant_node;
use crate::provider::canonical::{canonical, canonical_block};
use crate::provider::conversation::Refusal;

/// One part as read, before it becomes node parts.
pub(super) enum Element {
    /// A text, media or kept part, with its fields and wire members.
    Plain(Part, Map<String, Value>, Map<String, Value>),
    /// The model's reasoning: a thought, or a part that is only a signature.
    Reasoning(Value),
    Call {
        name: String,
        args: Value,
        call: Map<String, Value>,
        fields: Map<String, Value>,
        wire: Map<String, Value>,
    },
    /// A function response, as sent (paired and read with its user content).
    Response(Value),
}

/// The part's member `key` as a string, if it has one; an error naming it if it is not one.
pub(super) fn string(
    obj: &Map<String, Value>,
    key: &str,
    at: &str,
) -> Result<Option<String>, Refusal> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(Refusal::invalid(format!("{at}.{key}"), "must be a string")),
    }
}

/// `obj` without `keys` (and without null members, which say nothing).
pub(super) fn without(obj: &Map<String, Value>, keys: &[&str]) -> Map<String, Value> {
    obj.iter()
        .filter(|(k, v)| !keys.contains(&k.as_str()) && !v.is_null())
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Media for an `inlineData` of exactly `mimeType` and standard base64 `data` that encodes
/// back to the very string sent.
pub(super) fn media(inline: &Value) -> Option<Part> {
    let obj = inline.as_object()?;
    let (mime, data) = (obj.get("mimeType")?.as_str()?, obj.get("data")?.as_str()?);
    if obj.len() != 2 || mime.is_empty() {
        return None;
    }
    let bytes = BASE64.decode(data).ok()?;
    (BASE64.encode(&bytes) == data).then(|| Part::Media {
        mime_type: mime.to_owned(),
        source: MediaSource::Data(bytes),
    })
}

/// A kept part.
pub fn kept(part: &Value, reasoning: bool) -> Part {
    Part::Block(ProviderBlock {
        format: WireFormat::Gemini,
        json: canonical_block(part),
        reasoning,
    })
}

pub(super) fn element(at: &str, mut part: Value) -> Result<Element, Refusal> {
    let Some(obj) = part.as_object_mut() else {
        return Err(Refusal::invalid(at, "must be an object"));
    };
    if !matches!(
        obj.get("thought"),
        None | Some(Value::Null | Value::Bool(_))
    ) {
        return Err(Refusal::invalid(
            format!("{at}.thought"),
            "must be a boolean",
        ));
    }
    let signature = string(obj, "thoughtSignature", at)?;
    let mut wire = Map::new();
    if let Some(s) = &signature {
        wire.insert("thoughtSignature".into(), json!(s));
    }
    if let Some(call) = obj.get("functionCall") {
        let at = format!("{at}.functionCall");
        let Some(call) = call.as_object() else {
            return Err(Refusal::invalid(at, "must be an object"));
        };
        let name = match string(call, "name", &at)? {
            Some(n) if !n.is_empty() => n,
            _ => return Err(Refusal::invalid(format!("{at}.name"), "is required")),
        };
        if let Some(id) = string(call, "id", &at)? {
            wire.insert("id".into(), json!(id));
        }
        // A call sent without `args` says what one with `{}` says.
        let args = match call.get("args") {
            None | Some(Value::Null) => {
                wire.insert("no_args".into(), json!(true));
                json!({})
            }
            Some(args @ Value::Object(_)) => args.clone(),
            Some(_) => return Err(Refusal::invalid(format!("{at}.args"), "must be an object")),
        };
        return Ok(Element::Call {
            name,
            args,
            call: without(call, &["id", "name", "args"]),
            fields: without(obj, &["functionCall", "thoughtSignature"]),
            wire,
        });
    }
    if let Some(response) = obj.get("functionResponse") {
        let at = format!("{at}.functionResponse");
        let Some(response) = response.as_object() else {
            return Err(Refusal::invalid(at, "must be an object"));
        };
        if string(response, "name", &at)?.is_none_or(|n| n.is_empty()) {
            return Err(Refusal::invalid(format!("{at}.name"), "is required"));
        }
        string(response, "id", &at)?;
        if !matches!(response.get("response"), Some(Value::Object(_))) {
            return Err(Refusal::invalid(
                format!("{at}.response"),
                "must be an object",
            ));
        }
        if !matches!(response.get("parts"), None | Some(Value::Array(_))) {
            return Err(Refusal::invalid(format!("{at}.parts"), "must be an array"));
        }
        return Ok(Element::Response(part));
    }
    let text = string(obj, "text", at)?;
    let thought = obj.get("thought").and_then(Value::as_bool) == Some(true);
    let bare = without(obj, &["text", "thoughtSignature"]);
    if thought
        || (signature.is_some() && bare.is_empty() && text.as_deref().unwrap_or("").is_empty())
    {
        return Ok(Element::Reasoning(part));
    }
    if let Some(text) = text {
        let text = match obj.get_mut("text") {
            Some(Value::String(s)) => std::mem::take(s),
            _ => text,
        };
        return Ok(Element::Plain(Part::Text(text), bare, wire));
    }
    if let Some(inline) = obj.get("inlineData") {
        let at = format!("{at}.inlineData");
        let Some(inline_obj) = inline.as_object() else {
            return Err(Refusal::invalid(at, "must be an object"));
        };
        string(inline_obj, "mimeType", &at)?;
        string(inline_obj, "data", &at)?;
        if let Some(m) = media(inline) {
            return Ok(Element::Plain(
                m,
                without(obj, &["inlineData", "thoughtSignature"]),
                wire,
            ));
        }
    }
    let rest = Value::Object(without(obj, &["thoughtSignature"]));
    if rest.as_object().is_some_and(Map::is_empty) {
        return Err(Refusal::invalid(at, "holds no data"));
    }
    Ok(Element::Plain(kept(&rest, false), Map::new(), wire))
}

/// The node parts of a plain element: the part, then its fields and wire blocks.
pub(super) fn push_plain(
    parts: &mut Vec<Part>,
    part: Part,
    fields: Map<String, Value>,
    wire: Map<String, Value>,
) {
    parts.push(part);
    if !fields.is_empty() {
        parts.push(mark(
            FIELDS,
            Map::from_iter([("part".into(), Value::Object(fields))]),
        ));
    }
    if !wire.is_empty() {
        parts.push(mark(WIRE, wire));
    }
}

/// ctxd's id of a model content's `k`-th call: the same whenever the same call is resent,
/// whatever wire id a client gives it.
pub fn call_id(k: usize, name: &str, arguments: &str) -> String {
    let mut hasher = blake3::Hasher::new();
    hasher.update(name.as_bytes());
    hasher.update(b"\0");
    hasher.update(arguments.as_bytes());
    format!("gemini-call-{k}-{}", &hasher.finalize().to_hex()[..8])
}

/// A model content's parts as its assistant node, and its calls for the results that follow.
/// The same function reads a resent content and an answer's parts, so both hash alike. `at`
/// names the parts' place in errors.
pub fn model_node(
    at: &str,
    parts: Vec<Value>,
) -> Result<(Option<NodeContent>, Vec<CallRef>), Refusal> {
    let mut elements = Vec::with_capacity(parts.len());
    for (j, part) in parts.into_iter().enumerate() {
        let at = format!("{at}.parts[{j}]");
        match element(&at, part)? {
            Element::Response(_) => {
                return Err(Refusal::invalid(
                    format!("{at}.functionResponse"),
                    "only a user content answers calls",
                ));
            }
            e => elements.push(e),
        }
    }
    // Which calls need a block to stand where they stood: one followed by something that
    // stands in place. An identity block where what follows is part of the identity, else a
    // wire block, so a resend without reasoning and wire members reads as the same node.
    let mut places = vec![(false, false); elements.len()];
    let (mut identity_after, mut wire_after) = (false, false);
    for (k, e) in elements.iter().enumerate().rev() {
        match e {
            Element::Call {
                call, fields, wire, ..
            } => {
                let identity = !call.is_empty() || !fields.is_empty() || identity_after;
                let wired = !wire.is_empty() || (!identity && wire_after);
                places[k] = (identity, wired);
                identity_after |= identity;
                wire_after |= wired;
            }
            Element::Plain(..) => identity_after = true,
            Element::Reasoning(_) => wire_after = true,
            Element::Response(_) => {}
        }
    }
    let mut out = Vec::new();
    let mut tool_calls = Vec::new();
    let mut calls = Vec::new();
    for (e, (identity, wired)) in elements.into_iter().zip(places) {
        match e {
            Element::Plain(part, fields, wire) => push_plain(&mut out, part, fields, wire),
            Element::Reasoning(part) => out.push(kept(&part, true)),
            Element::Call {
                name,
                args,
                call,
                fields,
                mut wire,
            } => {
                let arguments_json = canonical(&args);
                let id = call_id(tool_calls.len(), &name, &arguments_json);
                if identity {
                    let mut block = Map::from_iter([("call_id".into(), json!(id))]);
                    if !fields.is_empty() {
                        block.insert("part".into(), Value::Object(fields));
                    }
                    if !call.is_empty() {
                        block.insert("call".into(), Value::Object(call));
                    }
                    out.push(mark(FIELDS, block));
                }
                let wire_id = wire.get("id").and_then(Value::as_str).map(str::to_owned);
                if wired {
                    wire.insert("call_id".into(), json!(id));
                    out.push(mark(WIRE, wire));
                }
                calls.push(CallRef {
                    call_id: id.clone(),
                    name: name.clone(),
                    wire_id,
                });
                tool_calls.push(ToolCall {
                    call_id: id,
                    name,
                    arguments_json,
                });
            }
            Element::Response(_) => {}
        }
    }
    Ok((assistant_node(out, tool_calls), calls))
}
