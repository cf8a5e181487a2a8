//! The OpenAI Responses API (`POST /v1/responses`) as the gateway reads and writes it: a
//! request's `input` items as nodes, an answer (whole or streamed `response.*` events) as the
//! assistant node it appends, the rendered branch as the `input` it forwards, and the API's
//! error shape.
//!
//! How items become nodes (`Part::Block` of `WireFormat::Responses` are kept as their canonical
//! JSON and given back as themselves):
//!
//! - An item's bookkeeping ([`BOOKKEEPING`]: its `id`, its `status`, Codex's
//!   `internal_chat_message_metadata_passthrough`) is no part of it here: a client restates,
//!   adds or drops those members when it resends an item, and the model reads none of them
//!   (as Anthropic's `cache_control`). Left out of every node, kept items included, they make
//!   a resent item the node its first sending (or the answer that produced it) made. Where the
//!   forwarded request holds the client's own item (`forward`), its bookkeeping goes with it;
//!   an item written from its node has none.
//! - System, developer and user `message` items are messages: plain `input_text` parts are
//!   text, any other part (images, files, `output_text`) is kept whole. What the item had beside
//!   its role and content (a missing `type`, content given as a string, any member not known
//!   here) is a fields part (`crate::provider::format::ITEM_FIELDS`) first in the node, given back on
//!   the item.
//! - A run of consecutive output items (assistant messages, reasoning, function and custom tool
//!   calls, server tools' calls, any type not known here) is one assistant message: every
//!   item but a call is kept whole, in order; calls are its tool calls. A call that had fields
//!   beside its call id, name and arguments (the type `custom_tool_call`, a member not known
//!   here), or that is followed in its run by something else, leaves a fields part where it
//!   stood, so the run comes back in its order with every field.
//! - Some items stand alone ([`ALONE`]): Codex's `compaction_trigger` (the client's request for
//!   a compaction), the `compaction` item that is the whole answer to it, and the
//!   `additional_tools` of Responses Lite (the client's tools sent as an input item). Each is
//!   an assistant message of its own holding the item kept whole. Joined to a run they would
//!   change the node of the answer they follow or precede: a trigger comes right after an
//!   answer, and the next answer's items right after a compaction, so the resent history would
//!   no longer be the nodes its answers made, and would fork.
//! - A `custom_tool_call`'s free-form `input` is stored as the arguments `{"input": ..}`
//!   (arguments must be JSON, and an object reads well in other formats); the fields part says
//!   it was a custom call, so it is given back as one, with `input` a string again.
//! - `function_call_output` and `custom_tool_call_output` items are tool results (an output
//!   string as text, an array as parts), their other fields kept in a fields part.
//!
//! Function call arguments are stored canonical (`json::canonical_arguments`), as for chat
//! completions: they come back as the same JSON, not always the same bytes. Requests that
//! lean on state the server holds (`previous_response_id`, `conversation`) or that refer to
//! items by id (`item_reference`) are forwarded unchanged, unrecorded. `instructions` is not a
//! node: it stays in the body as the client sent it, and counts toward the budget as the
//! system prompt. Codex names its conversation in `prompt_cache_key`: that is the session.

mod answer;

use serde_json::{Map, Value, json};

use super::answer::{assistant_node, entries, openai_error};
use super::canonical::{canonical, canonical_arguments, canonical_block};
use super::codec::{Answer, Codec, Failure, Request, Spec, Upstream};
use super::conversation::{Conversation, Item, Refusal, estimate};
use super::format::ITEM_FIELDS;
use super::format::responses_document;
use crate::domain::{NodeContent, Part, ProviderBlock, Role, ToolCall, WireFormat};
use crate::render::Message;

/// Reads a Responses API request body.
pub fn read(body: &Value) -> Result<Conversation, Refusal> {
    let (obj, model) = Conversation::request(body)?;
    if obj
        .get("previous_response_id")
        .is_some_and(|v| !v.is_null())
    {
        // The history is the server's: the request holds only what is new.
        return Err(Refusal::Unrecordable("previous_response_id"));
    }
    if obj.get("conversation").is_some_and(|v| !v.is_null()) {
        return Err(Refusal::Unrecordable("a server-held conversation"));
    }
    let items: Vec<Value> = match obj.get("input") {
        Some(Value::String(s)) => vec![json!({"role": "user", "content": s})],
        Some(Value::Array(items)) => items.clone(),
        _ => {
            return Err(Refusal::invalid(
                "input",
                "must be a string or an array of input items",
            ));
        }
    };
    let instructions = match obj.get("instructions") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err(Refusal::invalid("instructions", "must be a string")),
    };
    let mut conv = Conversation {
        system_tokens: u32::try_from(estimate(instructions.len())).unwrap_or(u32::MAX),
        client_session: obj
            .get("prompt_cache_key")
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned),
        ..Conversation::begun(obj, model, obj.get("max_output_tokens"))
    };
    read_items(&mut conv, &items)?;
    Ok(conv.finish(&instructions))
}

/// Members of an item that are the client's bookkeeping, not what the item says (see the
/// module docs): Codex 0.171 resends its answers' items with
/// `internal_chat_message_metadata_passthrough` (their turn id) added, and clients restate or
/// drop the `id` and `status` the provider gave an item.
pub const BOOKKEEPING: [&str; 3] = ["id", "status", "internal_chat_message_metadata_passthrough"];

/// Item types that are a node of their own, never part of a run (see the module docs).
pub const ALONE: [&str; 3] = ["compaction_trigger", "compaction", "additional_tools"];

/// What an input item is to the gateway.
enum Kind {
    /// A system, developer or user message.
    Input(Role),
    /// A function or custom tool call's output.
    Output,
    /// Anything a model produces (or that is not known here): part of an assistant run.
    Run,
    /// An item that is a node of its own ([`ALONE`]).
    Alone,
}

fn kind(i: usize, item: &Value) -> Result<Kind, Refusal> {
    let at = format!("input[{i}]");
    let Some(obj) = item.as_object() else {
        return Err(Refusal::invalid(at, "must be an object"));
    };
    let kind = match obj.get("type") {
        None => "message",
        Some(Value::String(t)) => t.as_str(),
        Some(_) => return Err(Refusal::invalid(format!("{at}.type"), "must be a string")),
    };
    Ok(match kind {
        "message" => match obj.get("role").and_then(Value::as_str) {
            Some("user") => Kind::Input(Role::User),
            Some("system") => Kind::Input(Role::System),
            Some("developer") => Kind::Input(Role::Developer),
            Some("assistant") => Kind::Run,
            _ => {
                return Err(Refusal::invalid(
                    format!("{at}.role"),
                    "must be \"user\", \"system\", \"developer\" or \"assistant\"",
                ));
            }
        },
        "function_call_output" | "custom_tool_call_output" => Kind::Output,
        "item_reference" => return Err(Refusal::Unrecordable("an item reference")),
        t if ALONE.contains(&t) => Kind::Alone,
        _ => Kind::Run,
    })
}

fn read_items(conv: &mut Conversation, items: &[Value]) -> Result<(), Refusal> {
    let mut i = 0;
    while i < items.len() {
        match kind(i, &items[i])? {
            one @ (Kind::Input(_) | Kind::Output) => {
                let content = match one {
                    Kind::Input(role) => input_message(i, &items[i], role)?,
                    _ => call_output(i, &items[i])?,
                };
                conv.items.push(Item {
                    content,
                    message: i,
                    through: i,
                });
                i += 1;
            }
            Kind::Alone => {
                conv.items.push(Item {
                    content: NodeContent::Message {
                        role: Role::Assistant,
                        parts: vec![kept(&without_bookkeeping(&items[i]))],
                        tool_calls: Vec::new(),
                    },
                    message: i,
                    through: i,
                });
                i += 1;
            }
            Kind::Run => {
                let start = i;
                while i < items.len() && matches!(kind(i, &items[i])?, Kind::Run) {
                    i += 1;
                }
                if let Some(content) = run(&items[start..i])? {
                    conv.items.push(Item {
                        content,
                        message: start,
                        through: i - 1,
                    });
                }
            }
        }
    }
    Ok(())
}

/// A kept item or content part.
fn kept(value: &Value) -> Part {
    Part::Block(ProviderBlock::new(
        WireFormat::Responses,
        canonical_block(value),
    ))
}

/// The fields part of an item: `rest` (its members ctxd stores elsewhere taken out), the call
/// it belongs to, and the form of its content when that is not the usual one.
fn fields(call_id: Option<&str>, rest: Map<String, Value>, form: Option<&str>) -> Part {
    let mut f = Map::new();
    f.insert("type".into(), json!(ITEM_FIELDS));
    if let Some(id) = call_id {
        f.insert("call_id".into(), json!(id));
    }
    f.insert("item".into(), Value::Object(rest));
    if let Some(form) = form {
        f.insert("form".into(), json!(form));
    }
    kept(&Value::Object(f))
}

/// `obj` without `keys` and without its [`BOOKKEEPING`].
fn rest(obj: &Map<String, Value>, keys: &[&str]) -> Map<String, Value> {
    obj.iter()
        .filter(|(k, _)| !keys.contains(&k.as_str()) && !BOOKKEEPING.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// An item as its node keeps it: without its [`BOOKKEEPING`].
fn without_bookkeeping(item: &Value) -> Value {
    match item.as_object() {
        Some(obj) => Value::Object(rest(obj, &[])),
        None => item.clone(),
    }
}

/// Whether `rest` is just `{"type": kind}`.
fn only_type(rest: &Map<String, Value>, kind: &str) -> bool {
    rest.len() == 1 && rest.get("type").and_then(Value::as_str) == Some(kind)
}

/// Content parts: plain `input_text` as text, any other part kept whole.
fn parts(items: &[Value]) -> Vec<Part> {
    items
        .iter()
        .map(|p| {
            let plain = p
                .as_object()
                .is_some_and(|o| o.len() == 2 && o.contains_key("type"));
            match (
                p.get("type").and_then(Value::as_str),
                p.get("text").and_then(Value::as_str),
            ) {
                (Some("input_text"), Some(t)) if plain => Part::Text(t.to_owned()),
                _ => kept(p),
            }
        })
        .collect()
}

fn input_message(i: usize, item: &Value, role: Role) -> Result<NodeContent, Refusal> {
    let obj = item.as_object().expect("kind() checked it is an object");
    let (mut content, form) = match obj.get("content") {
        Some(Value::String(s)) => (vec![Part::Text(s.clone())], Some("string")),
        Some(Value::Array(items)) if !items.is_empty() => (parts(items), None),
        Some(Value::Array(_)) => return Err(Refusal::Unrecordable("an empty message")),
        _ => {
            return Err(Refusal::invalid(
                format!("input[{i}].content"),
                "must be a string or an array of content parts",
            ));
        }
    };
    let other = rest(obj, &["role", "content"]);
    if !only_type(&other, "message") || form.is_some() {
        content.insert(0, fields(None, other, form));
    }
    Ok(NodeContent::Message {
        role,
        parts: content,
        tool_calls: Vec::new(),
    })
}

fn call_output(i: usize, item: &Value) -> Result<NodeContent, Refusal> {
    let obj = item.as_object().expect("kind() checked it is an object");
    let call_id = obj
        .get("call_id")
        .and_then(Value::as_str)
        .ok_or_else(|| Refusal::invalid(format!("input[{i}].call_id"), "must be a string"))?;
    let (mut content, form) = match obj.get("output") {
        Some(Value::String(s)) => (vec![Part::Text(s.clone())], None),
        Some(Value::Array(items)) => (parts(items), Some("array")),
        _ => return Err(Refusal::Unrecordable("a call output of another shape")),
    };
    let other = rest(obj, &["call_id", "output"]);
    if !only_type(&other, "function_call_output") || form.is_some() {
        content.insert(0, fields(None, other, form));
    }
    Ok(NodeContent::ToolResult {
        call_id: call_id.to_owned(),
        name: String::new(),
        parts: content,
        // The API has no error flag on an output: a failure is told in its text.
        is_error: false,
    })
}

/// One item of a run: a call, with what else the item had, or an item kept whole.
enum RunItem {
    Call(ToolCall, Map<String, Value>),
    Kept(Part),
}

/// A run of output items as one assistant message: kept items in order, then the calls, with
/// a fields part where a call stood when it had other fields or something follows it. The same
/// function reads a run resent in a request and an answer's output, so both hash alike.
/// `None`: an empty run.
pub fn run(items: &[Value]) -> Result<Option<NodeContent>, Refusal> {
    let mut read = Vec::with_capacity(items.len());
    for item in items {
        let kind = item.get("type").and_then(Value::as_str).unwrap_or_default();
        let call = |arguments: &str| -> Result<RunItem, Refusal> {
            let obj = item
                .as_object()
                .ok_or(Refusal::Unrecordable("an item that is not an object"))?;
            let (Some(id), Some(name)) = (
                obj.get("call_id").and_then(Value::as_str),
                obj.get("name").and_then(Value::as_str),
            ) else {
                return Err(Refusal::Unrecordable("a call without call_id or name"));
            };
            let arguments_json = match (kind, obj.get(arguments)) {
                ("function_call", Some(Value::String(a))) => canonical_arguments(a),
                ("custom_tool_call", Some(Value::String(input))) => {
                    canonical(&json!({ "input": input }))
                }
                _ => return Err(Refusal::Unrecordable("a call without its arguments")),
            };
            Ok(RunItem::Call(
                ToolCall {
                    call_id: id.to_owned(),
                    name: name.to_owned(),
                    arguments_json,
                },
                rest(obj, &["call_id", "name", arguments]),
            ))
        };
        read.push(match kind {
            "function_call" => call("arguments")?,
            "custom_tool_call" => call("input")?,
            _ => RunItem::Kept(kept(&without_bookkeeping(item))),
        });
    }
    // The calls that need no fields part: the plain function calls the run ends with.
    let plain_tail = read
        .iter()
        .rev()
        .take_while(|r| matches!(r, RunItem::Call(_, rest) if only_type(rest, "function_call")))
        .count();
    let marked = read.len() - plain_tail;
    let mut parts = Vec::new();
    let mut tool_calls = Vec::new();
    for (k, r) in read.into_iter().enumerate() {
        match r {
            RunItem::Kept(part) => parts.push(part),
            RunItem::Call(call, rest) => {
                if k < marked {
                    parts.push(fields(Some(&call.call_id), rest, None));
                }
                tool_calls.push(call);
            }
        }
    }
    Ok(assistant_node(parts, tool_calls))
}

/// OpenAI's Responses API (`/v1/responses`).
pub struct Responses;

impl Codec for Responses {
    fn spec(&self) -> &'static Spec {
        &Spec {
            name: "responses",
            upstream: Upstream::OpenAi,
            routes: &["/v1/responses"],
            field: "input",
        }
    }

    fn read(&self, request: Request<'_>) -> Result<Conversation, Refusal> {
        read(&request.body)
    }

    fn document(&self, messages: &[Message]) -> (Vec<Value>, Vec<Vec<usize>>) {
        entries(responses_document(messages))
    }

    fn tool(&self, name: &str, description: &str, parameters: Value) -> Value {
        json!({"type": "function", "name": name, "description": description,
            "parameters": parameters})
    }

    fn answer(&self, stream: bool) -> Answer {
        Answer::new(stream, Box::<answer::Events>::default())
    }

    fn error(&self, failure: Failure, message: &str, param: Option<&str>) -> Value {
        openai_error(failure, message, param)
    }
}

#[cfg(test)]
mod tests;
