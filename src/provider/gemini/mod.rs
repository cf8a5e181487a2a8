//! Google's Gemini `generateContent` API as the gateway reads and writes it: a request's
//! `contents` as nodes, an answer (a whole `GenerateContentResponse`, or the SSE stream of them)
//! as the assistant node it appends, the rendered branch as the `contents` it forwards, and
//! Google's error shape.
//!
//! How contents become nodes (`read`); kept blocks are `Part::Block` of `WireFormat::Gemini`,
//! their canonical JSON given back as it came:
//!
//! - A `model` content is one assistant message: `text` parts are texts, `inlineData` (standard
//!   base64, written back the same) is media, `functionCall` parts are its tool calls, any other
//!   part (`executableCode`, a type not known here) is kept whole, and a thought (`thought:
//!   true`) or a part that is only a `thoughtSignature` is kept whole as the model's reasoning
//!   (`ProviderBlock::reasoning`: no part of the node's identity). A `fileData` part is kept
//!   whole too, as the reference it is (a Files API, Cloud Storage or YouTube URI the model
//!   reads when the request is sent, as it did for the client): recorded faithfully, and never
//!   turned into media by URL, which other formats would pass on as a link they cannot open.
//! - A call's id is ctxd's own, made from the call alone: `gemini-call-{k}-{hash}` (`k` its
//!   place among the content's calls, `hash` of its name and arguments). Gemini CLI sets the
//!   wire `id` of a call after the answer that made it (and its routing requests send the same
//!   history under other ids), so an id read from the wire would make the answer's node and its
//!   resend two nodes. What the model never reads of a part (a call's or a response's `id`, a
//!   `thoughtSignature`, a response sent twice) is a `wire` block, kept outside identity like
//!   reasoning (clients strip signatures and put synthetic ones in) and given back on its part.
//! - What a part or content has beside what ctxd reads (`videoMetadata`, a call's extra members,
//!   a content without `role`...) is a `part` or `content` block, part of the identity, given
//!   back on the part or content it belongs to, never as a part of its own (as Responses'
//!   `ITEM_FIELDS`). A call stands where its first block stands, else after the parts.
//! - A `user` content's `functionResponse` parts are tool results, each paired to a call of the
//!   model content before it by wire id, else by name and order (the n-th response named `f`
//!   answers the n-th unanswered call of `f`); `{"output": s}` is the text `s`, `{"error": s}`
//!   an error result, any other response its canonical JSON as text (given back as the
//!   object), `functionResponse.parts` media. The content's other parts make a user message
//!   after the results (marked as sharing their content); parts before a response are not
//!   recorded.
//!
//! An answer's pieces of text (and of a thought) are joined as Gemini CLI joins them before it
//! keeps the answer, so the answer's node is the one its resend reads as (`answer`).
//! `systemInstruction` stays in the body as sent and counts as the system prompt. A request that
//! leans on a server-held cache (`cachedContent`: the history is Google's, not in the request)
//! or asks for several candidates is forwarded unrecorded.

mod answer;
mod document;
mod parts;
mod read;
mod session;
#[cfg(test)]
mod tests;

use serde_json::{Map, Value, json};

use crate::domain::{Part, ProviderBlock, WireFormat};
use crate::provider::codec::{Action, Answer, Codec, Failure, Request, Spec, Upstream};
use crate::provider::conversation::{Conversation, Refusal};
use crate::render::Message;

pub use answer::GeminiEvents;
pub use parts::{call_id, model_node};
pub use read::contents;
pub use session::{Session, is_session, session};

/// Google's Gemini API (`/v1beta/models/{model}:{action}`).
pub struct Gemini;

impl Codec for Gemini {
    fn spec(&self) -> &'static Spec {
        &Spec {
            name: "gemini",
            upstream: Upstream::Google,
            routes: &["/v1beta/models/{target}"],
            field: "contents",
        }
    }

    fn claims(&self, path: &str, has_header: &dyn Fn(&str) -> bool) -> bool {
        path.starts_with("/v1beta/") || has_header("x-goog-api-key")
    }

    fn serves(&self, path: &str) -> bool {
        ["/v1beta/", "/v1/", "/upload/"]
            .iter()
            .any(|p| path.starts_with(p))
    }

    fn action(&self, path: &str) -> Action {
        match target(path).map(|t| t.action) {
            Some("generateContent" | "streamGenerateContent") => Action::Generate,
            Some("countTokens") => Action::Count,
            _ => Action::Other,
        }
    }

    fn read(&self, request: Request<'_>) -> Result<Conversation, Refusal> {
        read::read(request.path, request.body)
    }

    fn document(&self, messages: &[Message]) -> (Vec<Value>, Vec<Vec<usize>>) {
        document::document(messages)
    }

    fn hollow_block(&self, block: &ProviderBlock) -> bool {
        block.format == WireFormat::Gemini && marker(block).is_none()
    }

    fn tool(&self, name: &str, description: &str, parameters: Value) -> Value {
        json!({"functionDeclarations":
            [{"name": name, "description": description, "parameters": parameters}]})
    }

    fn answer(&self, stream: bool) -> Answer {
        Answer::new(stream, Box::<GeminiEvents>::default())
    }

    fn error(&self, failure: Failure, message: &str, param: Option<&str>) -> Value {
        error(failure, message, param)
    }
}

/// What a request's path names: the model and the method (`generateContent`...), and whether
/// its query asks for server-sent events (`None`: the path came without its query).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target<'a> {
    pub model: &'a str,
    pub action: &'a str,
    pub sse: Option<bool>,
}

/// `/v1beta/models/gemini-3.1-pro-preview:streamGenerateContent?alt=sse` as its parts; `None`
/// for a path that names no model and method.
pub fn target(path: &str) -> Option<Target<'_>> {
    let (path, query) = match path.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (path, None),
    };
    let rest = path
        .strip_prefix("/v1beta/models/")
        .or_else(|| path.strip_prefix("/v1/models/"))?;
    let (model, action) = rest.rsplit_once(':')?;
    if model.is_empty() || action.is_empty() || model.contains('/') {
        return None;
    }
    let sse = query.map(|q| q.split('&').any(|kv| kv == "alt=sse"));
    Some(Target { model, action, sse })
}

/// The member that marks a kept block as one ctxd made (no Gemini part has it), and the kinds
/// it names.
pub const MARK: &str = "ctxd_gemini";
/// A content's members beside `role` and `parts` (`fields`), a content sent without `role`
/// (`no_role`), a user message that shared its content with the results before it (`joined`).
pub const CONTENT: &str = "content";
/// What a part had beside what ctxd reads of it: `part` (its own members), `call` or `response`
/// (members of its `functionCall` or `functionResponse`), `form: "object"` (a response other
/// than `{"output"}` or `{"error"}`). With `call_id` it belongs to that call, else to the part
/// before it (in a result, to its response).
pub const FIELDS: &str = "part";
/// What the model never reads of a part, kept outside the node's identity: `id` (a call's or a
/// response's wire id; `no_id`, a response sent without the id its call had), `thoughtSignature`,
/// `no_args` (a call sent without `args`), `repeat` (copies of a response sent again). With `call_id` it belongs to that call, else to
/// the part before it (in a result, to its response).
pub const WIRE: &str = "wire";

/// A marker block's kind and members, if `block` is one of ctxd's.
pub fn marker(block: &ProviderBlock) -> Option<(String, Map<String, Value>)> {
    if block.format != WireFormat::Gemini || !block.json.contains(MARK) {
        return None;
    }
    match serde_json::from_str::<Value>(&block.json).ok()? {
        Value::Object(mut map) => match map.remove(MARK) {
            Some(Value::String(kind)) => Some((kind, map)),
            _ => None,
        },
        _ => None,
    }
}

/// The marker of `part`, if it is one.
pub fn part_marker(part: &Part) -> Option<(String, Map<String, Value>)> {
    match part {
        Part::Block(block) => marker(block),
        _ => None,
    }
}

/// A kept block of `kind` holding `members`; a `wire` block is outside the node's identity.
pub fn mark(kind: &str, mut members: Map<String, Value>) -> Part {
    members.insert(MARK.to_owned(), json!(kind));
    let json = crate::provider::canonical::canonical(&Value::Object(members));
    Part::Block(ProviderBlock {
        format: WireFormat::Gemini,
        json,
        reasoning: kind == WIRE,
    })
}

/// Google's error body: `code` the HTTP status the gateway answers with, `status` the
/// `google.rpc.Code` Google gives it, the field at fault as a `BadRequest` violation. A body
/// over the limit is `INVALID_ARGUMENT`, as Google answers its own payload limit ("Request
/// payload size exceeds the limit"), not `RESOURCE_EXHAUSTED`, which clients read as a quota
/// and retry; an upstream ctxd could not reach, or a server shutting down, is `UNAVAILABLE`,
/// and a server at its limit of calls `RESOURCE_EXHAUSTED`, both of which clients retry.
pub fn error(failure: Failure, message: &str, param: Option<&str>) -> Value {
    let (code, status) = match failure {
        Failure::Invalid => (400, "INVALID_ARGUMENT"),
        Failure::Unauthenticated => (401, "UNAUTHENTICATED"),
        Failure::NotFound => (404, "NOT_FOUND"),
        Failure::TooLarge => (413, "INVALID_ARGUMENT"),
        Failure::Upstream => (502, "UNAVAILABLE"),
        Failure::Busy => (429, "RESOURCE_EXHAUSTED"),
        Failure::Unavailable => (503, "UNAVAILABLE"),
    };
    let mut error = json!({"code": code, "message": message, "status": status});
    if let Some(field) = param {
        error["details"] = json!([{
            "@type": "type.googleapis.com/google.rpc.BadRequest",
            "fieldViolations": [{"field": field, "description": message}],
        }]);
    }
    json!({ "error": error })
}
