//! What the three APIs' answers share as the gateway assembles them: the relayed bytes (kept
//! whole, or read as server-sent events), the room for an indexed part, the assistant node
//! their pieces make, and OpenAI's usage.

use serde_json::Value;

use super::codec::Failure;
use super::conversation::MAX_ANSWER_PARTS;
use super::sse;
use crate::domain::{NodeContent, Part, ProviderUsage, Role, ToolCall};

/// An answer's bytes as they are relayed: a whole body is kept to be read at the end, a
/// stream is read event by event as it comes.
#[derive(Debug, Default)]
pub struct Relayed {
    stream: bool,
    body: Vec<u8>,
    sse: sse::Parser,
}

impl Relayed {
    pub fn new(stream: bool) -> Self {
        Self {
            stream,
            ..Self::default()
        }
    }

    pub fn stream(&self) -> bool {
        self.stream
    }

    /// The events these bytes complete, each with its data read as JSON (`None` where it is
    /// not, as chat completions' `[DONE]`); none for a whole body, whose bytes are kept.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<(sse::Event, Option<Value>)> {
        if !self.stream {
            self.body.extend_from_slice(bytes);
            return Vec::new();
        }
        self.sse
            .feed(bytes)
            .into_iter()
            .map(|event| {
                let data = serde_json::from_str::<Value>(&event.data).ok();
                (event, data)
            })
            .collect()
    }

    /// The whole body as JSON, when it is.
    pub fn body(&self) -> Option<Value> {
        serde_json::from_slice(&self.body).ok()
    }
}

/// `key` of `v` as an index, when it is one.
pub fn index(v: &Value, key: &str) -> Option<usize> {
    v.get(key)
        .and_then(Value::as_u64)
        .and_then(|i| usize::try_from(i).ok())
}

/// The `i`th of a streamed answer's parts, made room for; `None` past [`MAX_ANSWER_PARTS`],
/// where the answer is not one ctxd records.
pub fn part<T: Clone + Default>(parts: &mut Vec<T>, i: usize) -> Option<&mut T> {
    if i >= MAX_ANSWER_PARTS {
        return None;
    }
    if parts.len() <= i {
        parts.resize(i + 1, T::default());
    }
    Some(&mut parts[i])
}

/// The assistant node an answer's parts and calls make; `None` for an answer with neither.
pub fn assistant_node(parts: Vec<Part>, tool_calls: Vec<ToolCall>) -> Option<NodeContent> {
    if parts.is_empty() && tool_calls.is_empty() {
        return None;
    }
    Some(NodeContent::Message {
        role: Role::Assistant,
        parts,
        tool_calls,
    })
}

/// OpenAI's `usage` (chat completions and Responses name its fields apart): the cached tokens
/// are counted inside the input; they are a cache read, the rest is written to the cache as it
/// is read (no separate price), so counted as input.
pub fn openai_usage(u: &Value, input: &str, details: &str, output: &str) -> ProviderUsage {
    let n = |v: Option<&Value>| v.and_then(Value::as_u64).unwrap_or(0);
    let all = n(u.get(input));
    let cached = n(u.get(details).and_then(|d| d.get("cached_tokens")));
    ProviderUsage {
        input: all.saturating_sub(cached),
        cache_read: cached,
        cache_write: 0,
        output: n(u.get(output)),
        ..ProviderUsage::default()
    }
}

/// The error body of OpenAI's APIs (chat completions and Responses share it).
pub fn openai_error(failure: Failure, message: &str, param: Option<&str>) -> Value {
    let kind = match failure {
        Failure::Invalid | Failure::TooLarge => "invalid_request_error",
        Failure::Unauthenticated => "authentication_error",
        Failure::NotFound => "not_found_error",
        Failure::Upstream => "upstream_error",
        Failure::Busy => "rate_limit_exceeded",
        Failure::Unavailable => "server_error",
    };
    serde_json::json!({"error": {"message": message, "type": kind, "param": param, "code": null}})
}

/// A document that is an array, as its entries with their sources; none for anything else.
pub fn entries((document, sources): (Value, Vec<Vec<usize>>)) -> (Vec<Value>, Vec<Vec<usize>>) {
    match document {
        Value::Array(entries) => (entries, sources),
        _ => (Vec::new(), Vec::new()),
    }
}
