//! A Responses API answer, assembled from the whole body or the streamed `response.*` events
//! as they are relayed, into the assistant node it appends.

use serde_json::Value;

use super::run;
use crate::domain::{NodeContent, ProviderUsage};
use crate::provider::conversation::MAX_ANSWER_PARTS;
use crate::provider::sse;

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
                if i >= MAX_ANSWER_PARTS {
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
