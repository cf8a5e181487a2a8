//! Exporters: a session read at one set of heads (`domain::Snapshot`) written out as ctxd JSONL
//! (everything, read back by `import`), or one branch as an OpenAI `messages` array or a
//! Claude Code-style JSONL. Pure: no I/O; each yields the output piece by piece, so a caller
//! streams it without building one large string.

mod claude_code;
mod ctxd;
mod openai;

use std::collections::HashMap;
use std::sync::Arc;

use base64::Engine as _;
use serde_json::{Value, json};

use crate::domain::{Error, MediaSource, Node, NodeId, Part, Snapshot};

pub use ctxd::{VERSION, is_record};

/// The formats a session can be exported in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// The whole session (every branch, chain, summary and pin).
    Ctxd,
    /// One branch as an OpenAI chat-completions `messages` array.
    OpenAi(String),
    /// One branch as a Claude Code session file.
    ClaudeCode(String),
}

/// An export: what the format could not carry, and its text in pieces.
pub struct Export<'a> {
    pub warnings: Vec<String>,
    pub pieces: Box<dyn Iterator<Item = String> + Send + 'a>,
}

/// Writes `snapshot` as `target`; a one-branch format needs the branch to exist.
pub fn export<'a>(snapshot: &'a Snapshot, target: &Target) -> Result<Export<'a>, Error> {
    match target {
        Target::Ctxd => Ok(ctxd::export(snapshot)),
        Target::OpenAi(branch) => {
            let path = Branch::of(snapshot, branch)?;
            Ok(openai::export(snapshot, path))
        }
        Target::ClaudeCode(branch) => {
            let path = Branch::of(snapshot, branch)?;
            Ok(claude_code::export(snapshot, path))
        }
    }
}

/// One branch of a snapshot: its top-level path and the chains of the functions on it.
struct Branch<'a> {
    name: String,
    path: Vec<&'a Arc<Node>>,
    /// Function id → its chain, oldest first.
    chains: HashMap<NodeId, Vec<&'a Arc<Node>>>,
}

impl<'a> Branch<'a> {
    fn of(snapshot: &'a Snapshot, name: &str) -> Result<Self, Error> {
        let branch = snapshot
            .session
            .branches
            .iter()
            .find(|b| b.name.as_str() == name)
            .ok_or_else(|| Error::not_found("branch", name))?;
        let by_id: HashMap<NodeId, &Arc<Node>> = snapshot.nodes.iter().map(|n| (n.id, n)).collect();
        let mut path = Vec::new();
        let mut at = branch.head.map(|(id, _)| id);
        while let Some(id) = at {
            let Some(node) = by_id.get(&id) else { break };
            path.push(*node);
            at = node.parent_id;
        }
        path.reverse();
        let mut chains: HashMap<NodeId, Vec<&Arc<Node>>> = HashMap::new();
        for node in &snapshot.nodes {
            if let Some(function) = node.function_id {
                chains.entry(function).or_default().push(node);
            }
        }
        Ok(Self {
            name: name.to_owned(),
            path,
            chains,
        })
    }

    /// The warnings every one-branch format shares: what lies outside the branch.
    fn left_out(&self, snapshot: &Snapshot) -> Vec<String> {
        let mut warnings = Vec::new();
        let others: Vec<&str> = snapshot
            .session
            .branches
            .iter()
            .map(|b| b.name.as_str())
            .filter(|b| *b != self.name)
            .collect();
        if !others.is_empty() {
            warnings.push(format!(
                "only branch {:?} is exported; left out: {}",
                self.name,
                others.join(", ")
            ));
        }
        if !snapshot.summaries.is_empty() {
            warnings.push(format!(
                "{} summaries are left out (the raw history is exported)",
                snapshot.summaries.len()
            ));
        }
        if !snapshot.pinned.is_empty() {
            warnings.push(format!("{} pins are left out", snapshot.pinned.len()));
        }
        warnings
    }
}

/// A part as ctxd JSONL writes it: `{text}`, `{mime_type, data (base64) | url}`, or a kept
/// provider block as `{block: {format, value}}` (its JSON as a value, so the file reads; the
/// model's reasoning with `reasoning: true`).
fn part_json(part: &Part) -> Value {
    match part {
        Part::Text(text) => json!({ "text": text }),
        Part::Block(block) if block.reasoning => json!({
            "block": {
                "format": block.format.name(),
                "value": serde_json::from_str::<Value>(&block.json).unwrap_or(Value::Null),
                "reasoning": true,
            }
        }),
        Part::Block(block) => json!({
            "block": {
                "format": block.format.name(),
                "value": serde_json::from_str::<Value>(&block.json).unwrap_or(Value::Null),
            }
        }),
        Part::Media { mime_type, source } => match source {
            MediaSource::Data(data) => json!({
                "mime_type": mime_type,
                "data": base64::engine::general_purpose::STANDARD.encode(data),
            }),
            MediaSource::Url(url) => json!({ "mime_type": mime_type, "url": url }),
        },
    }
}

/// How many of `parts` are media by URL, which the one-branch formats write otherwise or not at
/// all.
fn url_media(parts: &[Part]) -> usize {
    parts
        .iter()
        .filter(|p| {
            matches!(
                p,
                Part::Media {
                    source: MediaSource::Url(_),
                    ..
                }
            )
        })
        .count()
}

/// One JSON value as a line.
fn line(value: &Value) -> String {
    let mut text = value.to_string();
    text.push('\n');
    text
}
