//! A Messages API answer, assembled from the whole body or the streamed events as they are
//! relayed, into the assistant node it appends.

use serde_json::{Value, json};

use super::{assistant, edits};
use crate::domain::{NodeContent, ProviderUsage};
use crate::provider::answer::{Relayed, index, part};

/// Reads `usage` as the API reports it.
fn usage(u: &Value, into: &mut ProviderUsage) {
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

/// The answer, assembled from what the upstream sends as it is relayed.
#[derive(Debug, Default)]
pub struct Answer {
    relayed: Relayed,
    blocks: Vec<Value>,
    partial: Vec<String>,
    usage: ProviderUsage,
    stopped: bool,
    failed: bool,
}

impl Answer {
    pub fn new(stream: bool) -> Self {
        Self {
            relayed: Relayed::new(stream),
            ..Self::default()
        }
    }

    /// A streamed answer's terminal event has arrived (never for a whole body).
    pub fn complete(&self) -> bool {
        self.relayed.stream() && self.stopped
    }

    pub fn feed(&mut self, bytes: &[u8]) {
        for (_, data) in self.relayed.feed(bytes) {
            if let Some(data) = data {
                self.event(&data);
            }
        }
    }

    fn event(&mut self, data: &Value) {
        let index = index(data, "index");
        match data.get("type").and_then(Value::as_str).unwrap_or_default() {
            "message_start" => {
                if let Some(message) = data.get("message") {
                    if let Some(u) = message.get("usage") {
                        usage(u, &mut self.usage);
                    }
                    edits(message, &mut self.usage);
                }
            }
            "content_block_start" => {
                if let (Some(i), Some(block)) = (index, data.get("content_block")) {
                    let Some(slot) = part(&mut self.blocks, i) else {
                        self.failed = true;
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
                    _ => self.failed = true,
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
                            _ => self.failed = true,
                        },
                        Err(_) => self.failed = true,
                    }
                }
            }
            "message_delta" => {
                if let Some(u) = data.get("usage") {
                    usage(u, &mut self.usage);
                }
                edits(data, &mut self.usage);
            }
            "message_stop" => self.stopped = true,
            "error" => self.failed = true,
            _ => {}
        }
    }

    /// The assistant node to append and the usage, once the answer is whole; `None` for an
    /// answer cut short, an error, or one that is not a message.
    pub fn finish(self) -> Option<(Option<NodeContent>, ProviderUsage)> {
        if self.relayed.stream() {
            if !self.stopped || self.failed {
                return None;
            }
            let content = assistant(&self.blocks).ok()?;
            return Some((content, self.usage));
        }
        let body = self.relayed.body()?;
        if body.get("type").and_then(Value::as_str) != Some("message") {
            return None;
        }
        let mut u = ProviderUsage::default();
        if let Some(v) = body.get("usage") {
            usage(v, &mut u);
        }
        edits(&body, &mut u);
        let blocks = body.get("content")?.as_array()?;
        Some((assistant(blocks).ok()?, u))
    }
}
