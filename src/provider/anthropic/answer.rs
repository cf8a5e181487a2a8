//! A Messages API answer, assembled from the whole body or the streamed events as they are
//! relayed, into the assistant node it appends.

use serde_json::{Value, json};

use super::{assistant, edits};
use crate::domain::{NodeContent, ProviderUsage};
use crate::provider::answer::{index, part};
use crate::provider::codec::{self, Progress};

/// Reads `usage` as the API reports it.
fn read_usage(u: &Value, into: &mut ProviderUsage) {
    let n = |k: &str| u.get(k).and_then(Value::as_u64);
    if let Some(v) = n("input_tokens") {
        into.input = v;
    }
    if let Some(v) = n("cache_read_input_tokens") {
        into.cache_read = v;
    }
    if let Some(v) = n("cache_creation_input_tokens") {
        into.cache_write = v;
    }
    if let Some(v) = n("output_tokens") {
        into.output = v;
    }
}

/// Reads what the provider says it did to the request: its context edits and the thinking
/// it dropped.
fn edits(message: &Value, into: &mut ProviderUsage) {
    if let Some(cm) = message.get("context_management")
        && let Some(cleared) = edits::cleared(cm)
    {
        into.cleared = Some(cleared);
    }
    if let Some(t) = message.get("input_transformations") {
        into.thinking_dropped = edits::thinking_dropped(t);
    }
}

/// A Messages answer's events: its content blocks by index, with each block's partial input
/// JSON.
#[derive(Debug, Default)]
pub struct Events {
    blocks: Vec<Value>,
    partial: Vec<String>,
}

impl codec::Events for Events {
    fn event(&mut self, _name: &str, data: Option<&Value>, progress: &mut Progress) {
        if let Some(data) = data {
            self.read(data, progress);
        }
    }

    fn streamed(self: Box<Self>) -> Option<Option<NodeContent>> {
        assistant(&self.blocks).ok()
    }

    fn body(&self, body: &Value, usage: &mut ProviderUsage) -> Option<Option<NodeContent>> {
        if body.get("type").and_then(Value::as_str) != Some("message") {
            return None;
        }
        if let Some(v) = body.get("usage") {
            read_usage(v, usage);
        }
        edits(body, usage);
        let blocks = body.get("content")?.as_array()?;
        assistant(blocks).ok()
    }
}

impl Events {
    fn read(&mut self, data: &Value, progress: &mut Progress) {
        let index = index(data, "index");
        match data.get("type").and_then(Value::as_str).unwrap_or_default() {
            "message_start" => {
                if let Some(message) = data.get("message") {
                    if let Some(u) = message.get("usage") {
                        read_usage(u, &mut progress.usage);
                    }
                    edits(message, &mut progress.usage);
                }
            }
            "content_block_start" => {
                if let (Some(i), Some(block)) = (index, data.get("content_block")) {
                    let Some(slot) = part(&mut self.blocks, i) else {
                        progress.failed = true;
                        return;
                    };
                    *slot = block.clone();
                    // A block's partial input JSON, at the block's index.
                    self.partial.resize(self.blocks.len(), String::new());
                }
            }
            "content_block_delta" => {
                let (Some(i), Some(delta)) = (index, data.get("delta")) else {
                    return;
                };
                let Some(Value::Object(block)) = self.blocks.get_mut(i) else {
                    return;
                };
                let append = |block: &mut serde_json::Map<String, Value>, key: &str, s: &str| {
                    let old = block.get(key).and_then(Value::as_str).unwrap_or_default();
                    let joined = format!("{old}{s}");
                    block.insert(key.to_owned(), Value::String(joined));
                };
                let s = |k: &str| delta.get(k).and_then(Value::as_str).unwrap_or_default();
                match delta
                    .get("type")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                {
                    "text_delta" => append(block, "text", s("text")),
                    "thinking_delta" => append(block, "thinking", s("thinking")),
                    "signature_delta" => append(block, "signature", s("signature")),
                    "input_json_delta" => self.partial[i].push_str(s("partial_json")),
                    "citations_delta" => {
                        if let Some(c) = delta.get("citation") {
                            match block.get_mut("citations") {
                                Some(Value::Array(list)) => list.push(c.clone()),
                                _ => {
                                    block.insert("citations".into(), json!([c]));
                                }
                            }
                        }
                    }
                    // A delta of a kind not known here: the block cannot be given back whole.
                    _ => progress.failed = true,
                }
            }
            "content_block_stop" => {
                if let Some(i) = index
                    && let Some(partial) = self.partial.get(i)
                    && !partial.is_empty()
                {
                    match serde_json::from_str::<Value>(partial) {
                        Ok(input) => match self.blocks.get_mut(i) {
                            Some(Value::Object(block)) => {
                                block.insert("input".to_owned(), input);
                            }
                            _ => progress.failed = true,
                        },
                        Err(_) => progress.failed = true,
                    }
                }
            }
            "message_delta" => {
                if let Some(u) = data.get("usage") {
                    read_usage(u, &mut progress.usage);
                }
                edits(data, &mut progress.usage);
            }
            "message_stop" => progress.stopped = true,
            "error" => progress.failed = true,
            _ => {}
        }
    }
}
