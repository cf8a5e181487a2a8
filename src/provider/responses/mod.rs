//! The OpenAI Responses API (`POST /v1/responses`) as the gateway reads and writes it: a
//! request's `input` items as nodes, an answer (whole or streamed `response.*` events) as the
//! assistant node it appends, the rendered branch as the `input` it forwards, and the API's
//! error shape.
//!
//! How items become nodes (`Part::Block` of `BlockFormat::Responses` are kept as their canonical
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

use serde_json::{Map, Value, json};

use super::canonical::{canonical, canonical_arguments, canonical_block};
use super::conversation::{Conversation, Item, Refusal, estimate};
use super::format::ITEM_FIELDS;
use super::sse;
use crate::domain::{BlockFormat, NodeContent, Part, ProviderBlock, ProviderUsage, Role, ToolCall};

/// Reads a Responses API request body.
pub fn read(body: &Value) -> Result<Conversation, Refusal> {
    let Some(obj) = body.as_object() else {
        return Err(Refusal::invalid("body", "must be a JSON object"));
    };
    let model = match obj.get("model") {
        Some(Value::String(m)) => m.clone(),
        _ => return Err(Refusal::invalid("model", "must be a string")),
    };
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
        model,
        stream: obj.get("stream").and_then(Value::as_bool).unwrap_or(false),
        output_reserve: obj
            .get("max_output_tokens")
            .and_then(Value::as_u64)
            .map_or(4096, |n| u32::try_from(n).unwrap_or(u32::MAX)),
        system_tokens: u32::try_from(estimate(instructions.len())).unwrap_or(u32::MAX),
        client_session: obj
            .get("prompt_cache_key")
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned),
        ..Conversation::default()
    };
    if let Some(Value::Array(tools)) = obj.get("tools") {
        let chars = tools.iter().map(|t| t.to_string().len()).sum::<usize>();
        conv.tools_tokens = u32::try_from(estimate(chars)).unwrap_or(u32::MAX);
    }
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
            Kind::Input(role) => {
                let content = input_message(i, &items[i], role)?;
                conv.items.push(Item {
                    content,
                    message: i,
                    through: i,
                });
                i += 1;
            }
            Kind::Output => {
                let content = call_output(i, &items[i])?;
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
    Part::Block(ProviderBlock {
        format: BlockFormat::Responses,
        json: canonical_block(value),
    })
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
    if parts.is_empty() && tool_calls.is_empty() {
        return Ok(None);
    }
    Ok(Some(NodeContent::Message {
        role: Role::Assistant,
        parts,
        tool_calls,
    }))
}

/// The API's error body.
pub fn error(kind: &str, message: &str, param: Option<&str>) -> Value {
    json!({"error": {"message": message, "type": kind, "param": param, "code": null}})
}

fn usage(u: &Value) -> ProviderUsage {
    let n = |v: Option<&Value>| v.and_then(Value::as_u64).unwrap_or(0);
    let input = n(u.get("input_tokens"));
    let cached = n(u
        .get("input_tokens_details")
        .and_then(|d| d.get("cached_tokens")));
    ProviderUsage {
        // Cached tokens are counted inside the input, as in chat completions.
        input: input.saturating_sub(cached),
        cache_read: cached,
        cache_write: 0,
        output: n(u.get("output_tokens")),
    }
}

/// The answer, assembled from what the upstream sends as it is relayed.
#[derive(Debug, Default)]
pub struct Answer {
    stream: bool,
    body: Vec<u8>,
    sse: sse::Parser,
    /// Items by output index, from `response.output_item.done`: the output when the
    /// completed response does not repeat it.
    done: Vec<Value>,
    /// The completed response's `output`.
    output: Option<Vec<Value>>,
    usage: ProviderUsage,
    completed: bool,
    failed: bool,
}

impl Answer {
    pub fn new(stream: bool) -> Self {
        Self {
            stream,
            ..Self::default()
        }
    }

    /// A streamed answer's terminal event (`response.completed`, `response.failed`,
    /// `response.incomplete` or `error`) has arrived (never for a whole body).
    pub fn complete(&self) -> bool {
        self.stream && (self.completed || self.failed)
    }

    pub fn feed(&mut self, bytes: &[u8]) {
        if !self.stream {
            self.body.extend_from_slice(bytes);
            return;
        }
        for event in self.sse.feed(bytes) {
            let Ok(data) = serde_json::from_str::<Value>(&event.data) else {
                continue;
            };
            let kind = data
                .get("type")
                .and_then(Value::as_str)
                .unwrap_or(&event.name)
                .to_owned();
            self.event(&kind, &data);
        }
    }

    fn event(&mut self, kind: &str, data: &Value) {
        match kind {
            "response.output_item.done" => {
                let (Some(i), Some(item)) = (
                    data.get("output_index")
                        .and_then(Value::as_u64)
                        .and_then(|i| usize::try_from(i).ok()),
                    data.get("item"),
                ) else {
                    return;
                };
                if i >= super::conversation::MAX_ANSWER_PARTS {
                    self.failed = true;
                    return;
                }
                if self.done.len() <= i {
                    self.done.resize(i + 1, Value::Null);
                }
                self.done[i] = item.clone();
            }
            "response.completed" => {
                let response = data.get("response").unwrap_or(&Value::Null);
                if response
                    .get("status")
                    .and_then(Value::as_str)
                    .is_some_and(|s| s != "completed")
                {
                    self.failed = true;
                }
                self.completed = true;
                if let Some(Value::Array(output)) = response.get("output") {
                    self.output = Some(output.clone());
                }
                if let Some(u) = response.get("usage").filter(|u| u.is_object()) {
                    self.usage = usage(u);
                }
            }
            "response.failed" | "response.incomplete" | "error" => self.failed = true,
            _ => {}
        }
    }

    /// The assistant node to append and the usage, once the answer is whole; `None` for an
    /// answer cut short, failed or incomplete.
    pub fn finish(self) -> Option<(Option<NodeContent>, ProviderUsage)> {
        if self.stream {
            if !self.completed || self.failed {
                return None;
            }
            let output = match self.output {
                Some(output) if !output.is_empty() => output,
                _ => {
                    if self.done.iter().any(Value::is_null) {
                        return None;
                    }
                    self.done
                }
            };
            return Some((run(&output).ok()?, self.usage));
        }
        let body: Value = serde_json::from_slice(&self.body).ok()?;
        if body.get("status").and_then(Value::as_str) != Some("completed") {
            return None;
        }
        let output = body.get("output")?.as_array()?;
        let u = body.get("usage").map(usage).unwrap_or_default();
        Some((run(output).ok()?, u))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::domain::{Node, NodeId, PathView, node_hash};
    use crate::provider::format::responses_input as input;
    use crate::render::Message;
    use crate::render::{Callers, Reduction, visible};

    /// The request's nodes as a stored path renders them, untouched by any budget step.
    fn rendered(conv: &Conversation) -> Vec<Message> {
        let mut path = PathView::default();
        let mut parent: Option<(NodeId, crate::domain::Hash)> = None;
        for item in &conv.items {
            let hash = node_hash(parent.as_ref().map(|p| &p.1), None, &item.content);
            let node = Node {
                id: NodeId::new(),
                parent_id: parent.map(|p| p.0),
                function_id: None,
                content: item.content.clone(),
                created_at_ms: 0,
                hash,
            };
            parent = Some((node.id, hash));
            path.nodes.push(Arc::new(node));
        }
        visible(&path, Callers::All)
    }

    /// Items as canonical JSON, with function call arguments in canonical form (the form they
    /// are stored in).
    fn canonical_items(items: &Value) -> Vec<String> {
        items
            .as_array()
            .unwrap()
            .iter()
            .map(|item| {
                let mut item = item.clone();
                if item["type"] == "function_call" {
                    let a = item["arguments"].as_str().unwrap().to_owned();
                    item["arguments"] = json!(canonical_arguments(&a));
                }
                // A null member and an absent one are the same item.
                super::super::canonical::canonical_block(&item)
            })
            .collect()
    }

    /// `items` without their bookkeeping: what is written back of them.
    fn bare(items: &Value) -> Value {
        items
            .as_array()
            .unwrap()
            .iter()
            .map(without_bookkeeping)
            .collect()
    }

    fn round_trip(body: &Value) -> (Conversation, Value) {
        let conv = read(body).unwrap();
        let written = input(&rendered(&conv));
        (conv, written)
    }

    fn codex_request() -> Value {
        json!({
            "model": "gpt-5-codex",
            "instructions": "You are Codex, a coding agent.",
            "input": [
                {"type": "message", "role": "developer", "content": [
                    {"type": "input_text", "text": "<permissions instructions>sandbox: workspace-write</permissions instructions>"}
                ]},
                {"type": "message", "role": "user", "content": [
                    {"type": "input_text", "text": "<environment_context>\n  <cwd>/repo</cwd>\n</environment_context>"}
                ]},
                {"type": "message", "role": "user", "content": [
                    {"type": "input_text", "text": "list the files, then fix the typo"},
                    {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo=", "detail": "auto"}
                ]},
                {"type": "reasoning", "id": "rs_01", "summary": [
                    {"type": "summary_text", "text": "**Listing files**"}
                ], "content": null, "encrypted_content": "gAAAAABo-encrypted-1"},
                {"type": "function_call", "id": "fc_01", "status": "completed", "call_id": "call_ls",
                 "name": "shell", "arguments": "{\"command\": [\"bash\", \"-lc\", \"ls\"], \"workdir\": \"/repo\"}"},
                {"type": "function_call_output", "call_id": "call_ls", "output": "README.md\nsrc\n"},
                {"type": "reasoning", "summary": [], "encrypted_content": "gAAAAABo-encrypted-2"},
                {"type": "custom_tool_call", "status": "completed", "call_id": "call_patch", "name": "apply_patch",
                 "input": "*** Begin Patch\n*** Update File: README.md\n-teh\n+the\n*** End Patch\n"},
                {"type": "custom_tool_call_output", "call_id": "call_patch", "output": "Success. Updated README.md"},
                {"type": "function_call", "call_id": "call_git", "name": "shell",
                 "arguments": "{\"command\":[\"git\",\"diff\"]}"},
                {"type": "function_call_output", "id": "fco_1", "status": "completed", "call_id": "call_git",
                 "output": [{"type": "input_text", "text": "diff --git a/README.md"}]},
                {"type": "message", "role": "assistant", "id": "msg_01", "status": "completed", "content": [
                    {"type": "output_text", "text": "Fixed the typo.", "annotations": [], "logprobs": []}
                ]},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "thanks"}]}
            ],
            "tools": [{"type": "function", "name": "shell", "parameters": {"type": "object"}}],
            "tool_choice": "auto",
            "parallel_tool_calls": false,
            "reasoning": {"effort": "medium", "summary": "auto"},
            "store": false,
            "stream": true,
            "include": ["reasoning.encrypted_content"],
            "prompt_cache_key": "0199a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b",
            "max_output_tokens": 32000
        })
    }

    #[test]
    fn a_codex_request_is_written_back_as_it_came() {
        let body = codex_request();
        let (conv, written) = round_trip(&body);
        assert_eq!(conv.model, "gpt-5-codex");
        assert!(conv.stream);
        assert_eq!(conv.output_reserve, 32000);
        assert_eq!(
            conv.system_tokens as u64,
            estimate("You are Codex, a coding agent.".len())
        );
        assert!(conv.tools_tokens > 0);
        assert_eq!(
            conv.client_session.as_deref(),
            Some("0199a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b")
        );
        assert!(
            conv.opening
                .starts_with("You are Codex, a coding agent.\n\n<environment_context>")
        );
        assert!(conv.client_tokens > 0);
        // dev, user, user, [reasoning fc], result, [reasoning custom], result, [fc], result,
        // [assistant message], user
        let at: Vec<usize> = conv.items.iter().map(|i| i.message).collect();
        assert_eq!(at, vec![0, 1, 2, 3, 5, 6, 8, 9, 10, 11, 12]);
        let NodeContent::Message {
            role: Role::Assistant,
            parts,
            tool_calls,
        } = &conv.items[3].content
        else {
            panic!("not an assistant message: {:?}", conv.items[3].content);
        };
        assert_eq!(
            parts.len(),
            1,
            "the reasoning; the call, its id and status left out, ends its run plainly"
        );
        assert_eq!(
            tool_calls,
            &vec![ToolCall {
                call_id: "call_ls".into(),
                name: "shell".into(),
                arguments_json: r#"{"command":["bash","-lc","ls"],"workdir":"/repo"}"#.into(),
            }]
        );
        let NodeContent::Message { tool_calls, .. } = &conv.items[5].content else {
            panic!()
        };
        assert_eq!(
            tool_calls[0].arguments_json,
            canonical(&json!({"input": body["input"][7]["input"]}))
        );
        for (k, name) in [(4, "shell"), (6, "apply_patch"), (8, "shell")] {
            let NodeContent::ToolResult {
                name: n, is_error, ..
            } = &conv.items[k].content
            else {
                panic!("not a result: {:?}", conv.items[k].content);
            };
            assert_eq!(n, name);
            assert!(!is_error);
        }
        // A plain call at the end of its run needs no fields part.
        let NodeContent::Message { parts, .. } = &conv.items[7].content else {
            panic!()
        };
        assert!(parts.is_empty());
        for item in &conv.items {
            item.content.validate("n").unwrap();
        }
        assert_eq!(
            canonical_items(&written),
            canonical_items(&bare(&body["input"]))
        );
    }

    #[test]
    fn a_run_keeps_its_order_and_bare_messages_their_form() {
        let body = json!({
            "model": "gpt-5",
            "input": [
                {"role": "user", "content": "hi"},
                {"type": "reasoning", "id": "rs_1", "summary": []},
                {"type": "function_call", "call_id": "a", "name": "f", "arguments": "{}"},
                {"type": "web_search_call", "id": "ws_1", "status": "completed",
                 "action": {"type": "search", "query": "q"}},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "x"}]},
                {"type": "function_call", "call_id": "b", "name": "g", "arguments": "{\"k\":1}"},
                {"type": "function_call", "call_id": "c", "name": "g", "arguments": "{\"k\":2}"},
                {"type": "function_call_output", "call_id": "a", "output": "A"},
                {"type": "function_call_output", "call_id": "b", "output": ""},
                {"type": "function_call_output", "call_id": "c", "output": []},
                {"role": "developer", "content": [{"type": "input_text", "text": "be brief"}], "id": "m_1"}
            ]
        });
        let (conv, written) = round_trip(&body);
        assert_eq!(conv.items.len(), 6);
        let NodeContent::Message {
            parts, tool_calls, ..
        } = &conv.items[1].content
        else {
            panic!()
        };
        // reasoning, fields of `a`, web search, message; `b` and `c` end the run plainly.
        assert_eq!(parts.len(), 4);
        assert_eq!(tool_calls.len(), 3);
        assert_eq!(
            canonical_items(&written),
            canonical_items(&bare(&body["input"]))
        );
    }

    #[test]
    fn a_string_input_is_one_user_message() {
        let (conv, written) = round_trip(&json!({"model": "gpt-5", "input": "hello"}));
        assert_eq!(conv.items.len(), 1);
        assert_eq!(conv.opening, "\n\nhello");
        assert_eq!(written, json!([{"role": "user", "content": "hello"}]));
    }

    #[test]
    fn a_pending_call_is_left_out() {
        let body = json!({
            "model": "gpt-5",
            "input": [
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]},
                {"type": "reasoning", "summary": [], "encrypted_content": "e"},
                {"type": "function_call", "id": "fc_1", "status": "completed", "call_id": "p",
                 "name": "f", "arguments": "{}"},
                {"type": "function_call", "call_id": "q", "name": "f", "arguments": "{}"}
            ]
        });
        let (_, written) = round_trip(&body);
        assert_eq!(
            canonical_items(&written),
            canonical_items(&bare(&json!([body["input"][0], body["input"][1]])))
        );
    }

    #[test]
    fn a_cleared_or_truncated_result_is_its_text() {
        let body = json!({
            "model": "gpt-5",
            "input": [
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]},
                {"type": "custom_tool_call", "call_id": "c1", "name": "apply_patch", "input": "patch"},
                {"type": "custom_tool_call_output", "call_id": "c1", "output": "done"},
                {"type": "function_call", "call_id": "c2", "name": "f", "arguments": "{}"},
                {"type": "function_call_output", "id": "o2", "call_id": "c2",
                 "output": [{"type": "input_text", "text": "long"}, {"type": "input_image", "image_url": "u"}]}
            ]
        });
        let conv = read(&body).unwrap();
        let mut messages = rendered(&conv);
        messages[2].parts = vec![Part::Text("[cleared]".into())];
        messages[2].reduction = Reduction::Cleared;
        messages[4].parts = vec![
            messages[4].parts[0].clone(),
            Part::Text("lo…ng".into()),
            messages[4].parts[2].clone(),
        ];
        messages[4].reduction = Reduction::Truncated {
            cut_chars: 1,
            of_chars: 4,
        };
        let written = input(&messages);
        // The output of a custom call stays one when its fields went with the clearing.
        assert_eq!(
            written[2],
            json!({"type": "custom_tool_call_output", "call_id": "c1", "output": "[cleared]"})
        );
        assert_eq!(
            written[1],
            json!({"type": "custom_tool_call", "call_id": "c1", "name": "apply_patch", "input": "patch"})
        );
        assert_eq!(
            written[4],
            json!({"type": "function_call_output", "call_id": "c2", "output": "lo…ng"})
        );
    }

    #[test]
    fn bad_requests_name_their_field() {
        let invalid = |body: Value| match read(&body) {
            Err(Refusal::Invalid { field, .. }) => field,
            other => panic!("not invalid: {other:?}"),
        };
        assert_eq!(invalid(json!([])), "body");
        assert_eq!(invalid(json!({"input": "x"})), "model");
        assert_eq!(invalid(json!({"model": "m"})), "input");
        assert_eq!(invalid(json!({"model": "m", "input": 3})), "input");
        assert_eq!(
            invalid(json!({"model": "m", "input": "x", "instructions": 1})),
            "instructions"
        );
        assert_eq!(
            invalid(
                json!({"model": "m", "input": [{"role": "user", "content": "a"}, {"role": "tool", "content": "b"}]})
            ),
            "input[1].role"
        );
        assert_eq!(
            invalid(json!({"model": "m", "input": [{"type": "message", "content": "b"}]})),
            "input[0].role"
        );
        assert_eq!(
            invalid(
                json!({"model": "m", "input": [{"type": "function_call_output", "output": "b"}]})
            ),
            "input[0].call_id"
        );
        assert_eq!(
            invalid(json!({"model": "m", "input": [{"role": "user", "content": 3}]})),
            "input[0].content"
        );
        assert_eq!(invalid(json!({"model": "m", "input": [7]})), "input[0]");
    }

    #[test]
    fn server_held_state_is_not_recorded() {
        let unrecordable = |body: Value| match read(&body) {
            Err(Refusal::Unrecordable(reason)) => reason,
            other => panic!("recorded: {other:?}"),
        };
        assert_eq!(
            unrecordable(json!({"model": "m", "input": "x", "previous_response_id": "resp_1"})),
            "previous_response_id"
        );
        assert!(read(&json!({"model": "m", "input": "x", "previous_response_id": null})).is_ok());
        unrecordable(json!({"model": "m", "input": "x", "conversation": "conv_1"}));
        unrecordable(json!({"model": "m", "input": [{"type": "item_reference", "id": "msg_1"}]}));
        unrecordable(json!({"model": "m", "input": [
            {"type": "function_call", "name": "f", "arguments": "{}"}
        ]}));
    }

    fn output_items() -> Vec<Value> {
        vec![
            json!({"id": "rs_9", "type": "reasoning", "summary": [
                {"type": "summary_text", "text": "**Checking**"}
            ], "encrypted_content": "gAAAAABo-enc"}),
            json!({"id": "msg_9", "type": "message", "status": "completed", "role": "assistant",
                   "content": [{"type": "output_text", "annotations": [], "logprobs": [], "text": "Let me look."}]}),
            json!({"id": "fc_9", "type": "function_call", "status": "completed", "call_id": "call_9",
                   "name": "shell", "arguments": "{\"command\":[\"ls\"]}"}),
        ]
    }

    fn usage_json() -> Value {
        json!({"input_tokens": 1200, "input_tokens_details": {"cached_tokens": 1000},
               "output_tokens": 50, "output_tokens_details": {"reasoning_tokens": 20}, "total_tokens": 1250})
    }

    /// A streamed answer with `items` as its output, and the completed response's `output`.
    fn stream(items: &[Value], completed_output: &Value, last: &str) -> String {
        let mut events: Vec<Value> = vec![
            json!({"type": "response.created", "sequence_number": 0, "response": {
                "id": "resp_9", "object": "response", "status": "in_progress", "output": [], "usage": null}}),
            json!({"type": "response.in_progress", "sequence_number": 1, "response": {
                "id": "resp_9", "object": "response", "status": "in_progress", "output": []}}),
        ];
        for (i, item) in items.iter().enumerate() {
            let mut added = item.clone();
            match item["type"].as_str().unwrap() {
                "message" => {
                    added["status"] = json!("in_progress");
                    added["content"] = json!([]);
                    events.push(json!({"type": "response.output_item.added", "output_index": i, "item": added}));
                    events.push(json!({"type": "response.content_part.added", "item_id": item["id"],
                        "output_index": i, "content_index": 0,
                        "part": {"type": "output_text", "annotations": [], "logprobs": [], "text": ""}}));
                    for delta in ["Let me", " look."] {
                        events.push(
                            json!({"type": "response.output_text.delta", "item_id": item["id"],
                            "output_index": i, "content_index": 0, "delta": delta, "logprobs": []}),
                        );
                    }
                    events.push(json!({"type": "response.output_text.done", "item_id": item["id"],
                        "output_index": i, "content_index": 0, "text": "Let me look.", "logprobs": []}));
                }
                "function_call" => {
                    added["status"] = json!("in_progress");
                    added["arguments"] = json!("");
                    events.push(json!({"type": "response.output_item.added", "output_index": i, "item": added}));
                    events.push(json!({"type": "response.function_call_arguments.delta",
                        "item_id": item["id"], "output_index": i, "delta": item["arguments"]}));
                    events.push(json!({"type": "response.function_call_arguments.done",
                        "item_id": item["id"], "output_index": i, "arguments": item["arguments"]}));
                }
                _ => {
                    added.as_object_mut().unwrap().remove("encrypted_content");
                    events.push(json!({"type": "response.output_item.added", "output_index": i, "item": added}));
                }
            }
            events.push(
                json!({"type": "response.output_item.done", "output_index": i, "item": item}),
            );
        }
        let end = match last {
            "response.completed" => json!({"type": last, "response": {
                "id": "resp_9", "object": "response", "status": "completed",
                "output": completed_output, "usage": usage_json()}}),
            "response.incomplete" => json!({"type": last, "response": {
                "id": "resp_9", "object": "response", "status": "incomplete",
                "incomplete_details": {"reason": "max_output_tokens"}, "output": completed_output}}),
            "response.failed" => json!({"type": last, "response": {
                "id": "resp_9", "object": "response", "status": "failed",
                "error": {"code": "server_error", "message": "boom"}, "output": []}}),
            "error" => json!({"type": "error", "code": "x", "message": "boom", "param": null}),
            _ => Value::Null,
        };
        if !end.is_null() {
            events.push(end);
        }
        events
            .iter()
            .enumerate()
            .map(|(n, e)| {
                let mut e = e.clone();
                e["sequence_number"] = json!(n);
                format!("event: {}\ndata: {}\n\n", e["type"].as_str().unwrap(), e)
            })
            .collect()
    }

    fn answer(stream_text: &str) -> Option<(Option<NodeContent>, ProviderUsage)> {
        let mut a = Answer::new(true);
        // Chunks that cut events anywhere, as the network does.
        for chunk in stream_text.as_bytes().chunks(37) {
            a.feed(chunk);
        }
        a.finish()
    }

    #[test]
    fn a_streamed_answer_is_the_node_its_resend_makes() {
        let items = output_items();
        let (node, usage) = answer(&stream(&items, &json!(items), "response.completed")).unwrap();
        let node = node.unwrap();
        let mut resend = vec![json!({"role": "user", "content": "look"})];
        resend.extend(items.iter().cloned());
        resend.push(json!({"type": "function_call_output", "call_id": "call_9", "output": "a"}));
        let conv = read(&json!({"model": "gpt-5", "input": resend})).unwrap();
        assert_eq!(conv.items[1].content, node);
        assert_eq!(
            usage,
            ProviderUsage {
                input: 200,
                cache_read: 1000,
                cache_write: 0,
                output: 50
            }
        );
        let mut a = Answer::new(true);
        let text = stream(&items, &json!(items), "response.completed");
        let (head, last) = text.split_at(text.rfind("event: response.completed").unwrap());
        a.feed(head.as_bytes());
        assert!(!a.complete());
        a.feed(last.as_bytes());
        assert!(a.complete(), "the terminal event holds the last chunk");
        // A backend whose completed response leaves the output out: the items as they were done.
        let (again, _) = answer(&stream(&items, &json!([]), "response.completed")).unwrap();
        assert_eq!(again.unwrap(), node);
    }

    /// Codex 0.171 resends its answers' items with `internal_chat_message_metadata_passthrough`
    /// added; other clients drop the ids and statuses. Either way the resent items are the node
    /// the answer made, and a message resent with other bookkeeping is the node it made before.
    #[test]
    fn bookkeeping_is_no_part_of_a_node() {
        let items = output_items();
        let (answer_node, _) =
            answer(&stream(&items, &json!(items), "response.completed")).unwrap();
        let prompt = |bookkeeping: Value| {
            let mut item = json!({"type": "message", "role": "user",
                                  "content": [{"type": "input_text", "text": "look"}]});
            for (k, v) in bookkeeping.as_object().unwrap() {
                item[k] = v.clone();
            }
            item
        };
        let with = |f: &dyn Fn(&mut Map<String, Value>)| -> Vec<Value> {
            items
                .iter()
                .map(|item| {
                    let mut item = item.clone();
                    f(item.as_object_mut().unwrap());
                    item
                })
                .collect()
        };
        let restated = with(&|item| {
            item.insert(
                "internal_chat_message_metadata_passthrough".into(),
                json!({"turn_id": "01a2410d-ed1c"}),
            );
        });
        let dropped = with(&|item| {
            item.remove("id");
            item.remove("status");
        });
        let prompts = [
            json!({}),
            json!({"id": "msg_01a2", "internal_chat_message_metadata_passthrough":
                   {"content_item_kinds": ["user.text"], "create_time": 1796387761.46}}),
            json!({"id": "msg_01b3", "status": "completed"}),
        ];
        let mut first = None;
        for (resent, bookkeeping) in [items.clone(), restated, dropped].into_iter().zip(prompts) {
            let mut input = vec![prompt(bookkeeping)];
            input.extend(resent);
            input.push(json!({"type": "function_call_output", "id": "fco_1",
                "internal_chat_message_metadata_passthrough": {"turn_id": "t"},
                "call_id": "call_9", "output": "a"}));
            let conv = read(&json!({"model": "gpt-5", "input": input})).unwrap();
            let nodes: Vec<NodeContent> = conv.items.iter().map(|i| i.content.clone()).collect();
            assert_eq!(nodes.len(), 3);
            assert_eq!(Some(&nodes[1]), answer_node.as_ref(), "{input:#?}");
            let first = first.get_or_insert(nodes.clone());
            assert_eq!(&nodes, first, "{input:#?}");
            // Kept items and fields parts alike hold none of it.
            let written = input_of(&conv);
            assert!(
                !written.to_string().contains("\"id\"")
                    && !written.to_string().contains("internal_chat_message")
                    && !written.to_string().contains("\"status\""),
                "{written:#}"
            );
        }
    }

    /// The request's nodes written back as the `input` a path of them renders.
    fn input_of(conv: &Conversation) -> Value {
        input(&rendered(conv))
    }

    /// Codex asks for a compaction right after an answer (a `compaction_trigger` item), is
    /// answered one `compaction` item (here only in `response.output_item.done`), and resends it
    /// right before the next answer's items: each is a node of its own, so the resent history
    /// is the nodes the answers made.
    #[test]
    fn a_compaction_and_its_trigger_stand_alone() {
        let go = json!({"type": "message", "role": "user",
                        "content": [{"type": "input_text", "text": "go"}]});
        let done = json!({"type": "message", "role": "assistant", "id": "msg_1",
            "status": "completed",
            "content": [{"type": "output_text", "text": "done", "annotations": []}]});
        let trigger = json!({"type": "compaction_trigger"});
        let compaction = json!({"type": "compaction", "id": "cmp_1", "encrypted_content": "enc"});
        let call = json!({"type": "function_call", "id": "fc_2", "status": "completed",
            "call_id": "c2", "name": "shell", "arguments": "{}"});
        let whole = |output: &[Value]| {
            answer(&stream(output, &json!(output), "response.completed"))
                .unwrap()
                .0
                .unwrap()
        };

        let asking = json!({"model": "gpt-5", "input": [go, done, trigger]});
        let conv = read(&asking).unwrap();
        assert_eq!(
            conv.items.len(),
            3,
            "the trigger is not joined to the answer"
        );
        assert_eq!(conv.items[1].content, whole(std::slice::from_ref(&done)));
        assert_eq!(
            conv.items[2].content,
            NodeContent::Message {
                role: Role::Assistant,
                parts: vec![kept(&trigger)],
                tool_calls: Vec::new(),
            }
        );
        assert_eq!(input_of(&conv)[2], trigger, "written back as it came");

        let (compacted, _) = answer(&stream(
            std::slice::from_ref(&compaction),
            &json!([]),
            "response.completed",
        ))
        .expect("the compaction item of output_item.done is the answer");
        let next = json!({"model": "gpt-5", "input": [go, compaction, call,
            {"type": "function_call_output", "call_id": "c2", "output": "ok"}]});
        let conv = read(&next).unwrap();
        assert_eq!(
            conv.items.len(),
            4,
            "the compaction is not joined to the next answer"
        );
        assert_eq!(Some(&conv.items[1].content), compacted.as_ref());
        assert_eq!(conv.items[2].content, whole(&[call]));
        assert_eq!(input_of(&conv)[1], bare(&json!([compaction]))[0]);
    }

    /// Responses Lite's tools come as an `additional_tools` input item, with no top-level
    /// `tools`: a node of its own, the item given back whole.
    #[test]
    fn additional_tools_are_kept_whole() {
        let tools = json!({"type": "additional_tools", "tools": [
            {"type": "function", "name": "shell", "description": "Runs a command.",
             "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}]});
        let body = json!({"model": "gpt-5", "input": [
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "be brief"}]},
            tools,
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]},
            {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": "{\"cmd\":\"ls\"}"},
            {"type": "function_call_output", "call_id": "c1", "output": "a"}
        ]});
        let (conv, written) = round_trip(&body);
        assert_eq!(conv.items.len(), 5);
        assert_eq!(conv.tools_tokens, 0, "no top-level tools");
        let NodeContent::Message {
            role: Role::Assistant,
            parts,
            tool_calls,
        } = &conv.items[1].content
        else {
            panic!("not a node of its own: {:?}", conv.items[1].content);
        };
        assert_eq!((parts, tool_calls.len()), (&vec![kept(&tools)], 0));
        assert_eq!(canonical_items(&written), canonical_items(&body["input"]));
    }

    #[test]
    fn an_answer_that_is_not_whole_is_not_recorded() {
        let items = output_items();
        for last in ["response.failed", "response.incomplete", "error", "none"] {
            assert!(
                answer(&stream(&items, &json!(items), last)).is_none(),
                "{last}"
            );
        }
    }

    #[test]
    fn a_whole_answer_is_read_from_its_body() {
        let items = output_items();
        let body = json!({"id": "resp_9", "object": "response", "status": "completed",
                          "output": items, "usage": usage_json()});
        let mut a = Answer::new(false);
        a.feed(body.to_string().as_bytes());
        let (node, usage) = a.finish().unwrap();
        assert_eq!(node, run(&items).unwrap());
        assert_eq!(usage.cache_read, 1000);
        let mut a = Answer::new(false);
        let mut incomplete = body.clone();
        incomplete["status"] = json!("incomplete");
        a.feed(incomplete.to_string().as_bytes());
        assert!(a.finish().is_none());
    }

    #[test]
    fn errors_have_the_api_shape() {
        assert_eq!(
            error("invalid_request_error", "input: bad", Some("input")),
            json!({"error": {"message": "input: bad", "type": "invalid_request_error", "param": "input", "code": null}})
        );
    }
}
