//! A Responses API answer, assembled from the whole body or the streamed `response.*` events
//! as they are relayed, into the assistant node it appends.

use serde_json::Value;

use super::run;
use crate::domain::{NodeContent, ProviderUsage};
use crate::provider::answer::{Relayed, index, openai_usage, part};

fn usage(u: &Value) -> ProviderUsage {
    openai_usage(u, "input_tokens", "input_tokens_details", "output_tokens")
}

/// The answer, assembled from what the upstream sends as it is relayed.
#[derive(Debug, Default)]
pub struct Answer {
    relayed: Relayed,
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
            relayed: Relayed::new(stream),
            ..Self::default()
        }
    }

    /// A streamed answer's terminal event (`response.completed`, `response.failed`,
    /// `response.incomplete` or `error`) has arrived (never for a whole body).
    pub fn complete(&self) -> bool {
        self.relayed.stream() && (self.completed || self.failed)
    }

    pub fn feed(&mut self, bytes: &[u8]) {
        for (event, data) in self.relayed.feed(bytes) {
            let Some(data) = data else {
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
                let (Some(i), Some(item)) = (index(data, "output_index"), data.get("item")) else {
                    return;
                };
                match part(&mut self.done, i) {
                    Some(slot) => *slot = item.clone(),
                    None => self.failed = true,
                }
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
        if self.relayed.stream() {
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
        let body = self.relayed.body()?;
        if body.get("status").and_then(Value::as_str) != Some("completed") {
            return None;
        }
        let output = body.get("output")?.as_array()?;
        let u = body.get("usage").map(usage).unwrap_or_default();
        Some((run(output).ok()?, u))
    }
}
