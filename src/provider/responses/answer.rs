//! A Responses API answer, assembled from the whole body or the streamed `response.*` events
//! as they are relayed, into the assistant node it appends.

use serde_json::Value;

use super::run;
use crate::domain::{NodeContent, ProviderUsage};
use crate::provider::answer::{index, openai_usage, part};
use crate::provider::codec::{self, Progress};

fn usage(u: &Value) -> ProviderUsage {
    openai_usage(u, "input_tokens", "input_tokens_details", "output_tokens")
}

/// A Responses answer's events: items by output index, from `response.output_item.done` (the
/// output when the completed response does not repeat it), and the completed response's
/// `output`.
#[derive(Debug, Default)]
pub struct Events {
    done: Vec<Value>,
    output: Option<Vec<Value>>,
}

impl codec::Events for Events {
    fn event(&mut self, name: &str, data: Option<&Value>, progress: &mut Progress) {
        let Some(data) = data else {
            return;
        };
        let kind = data.get("type").and_then(Value::as_str).unwrap_or(name);
        match kind {
            "response.output_item.done" => {
                let (Some(i), Some(item)) = (index(data, "output_index"), data.get("item")) else {
                    return;
                };
                match part(&mut self.done, i) {
                    Some(slot) => *slot = item.clone(),
                    None => progress.failed = true,
                }
            }
            "response.completed" => {
                let response = data.get("response").unwrap_or(&Value::Null);
                if response
                    .get("status")
                    .and_then(Value::as_str)
                    .is_some_and(|s| s != "completed")
                {
                    progress.failed = true;
                }
                progress.stopped = true;
                if let Some(Value::Array(output)) = response.get("output") {
                    self.output = Some(output.clone());
                }
                if let Some(u) = response.get("usage").filter(|u| u.is_object()) {
                    progress.usage = usage(u);
                }
            }
            "response.failed" | "response.incomplete" | "error" => progress.failed = true,
            _ => {}
        }
    }

    fn streamed(self: Box<Self>) -> Option<Option<NodeContent>> {
        let output = match self.output {
            Some(output) if !output.is_empty() => output,
            _ => {
                if self.done.iter().any(Value::is_null) {
                    return None;
                }
                self.done
            }
        };
        run(&output).ok()
    }

    fn body(&self, body: &Value, into: &mut ProviderUsage) -> Option<Option<NodeContent>> {
        if body.get("status").and_then(Value::as_str) != Some("completed") {
            return None;
        }
        let output = body.get("output")?.as_array()?;
        if let Some(u) = body.get("usage") {
            *into = usage(u);
        }
        run(output).ok()
    }
}
