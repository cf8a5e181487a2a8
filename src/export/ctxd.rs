//! ctxd JSONL, the full-fidelity format. Every line is an object whose `ctxd` field names the
//! record: first `session` (version, metadata, creation time), then `node` records (original
//! id, `parent`, `function`, kind and full content; parents, calls and chains before what
//! follows them), then `branch`, `summary` and `pin` records. `import::ctxd` reads it back.

use serde_json::{Value, json};

use super::{Export, line, part_json};
use crate::domain::{Expose, FunctionStatus, Node, NodeContent, Snapshot, Summary};

/// The format's version, in the header; an importer refuses one it does not know.
pub const VERSION: u64 = 1;

/// Whether `line` is one of the format's records: an object naming its record in `ctxd` (how
/// `import` tells the format by a file's first line).
pub fn is_record(line: &Value) -> bool {
    line.get("ctxd").is_some()
}

pub(super) fn export(snapshot: &Snapshot) -> Export<'_> {
    let session = &snapshot.session;
    let header = json!({
        "ctxd": "session",
        "version": VERSION,
        "metadata": session.metadata,
        "created_at_ms": session.created_at_ms,
    });
    let nodes = snapshot.nodes.iter().map(|n| line(&node(n)));
    let branches = session.branches.iter().map(|b| {
        line(&json!({
            "ctxd": "branch",
            "name": b.name.as_str(),
            "head": b.head.map(|(id, _)| id.to_string()),
        }))
    });
    let summaries = snapshot.summaries.iter().map(|s| line(&summary(s)));
    let pins = snapshot
        .pinned
        .iter()
        .map(|id| line(&json!({ "ctxd": "pin", "node": id.to_string() })));
    Export {
        warnings: snapshot.warnings.clone(),
        pieces: Box::new(
            std::iter::once(line(&header))
                .chain(nodes)
                .chain(branches)
                .chain(summaries)
                .chain(pins),
        ),
    }
}

fn node(node: &Node) -> Value {
    let mut v = json!({
        "ctxd": "node",
        "id": node.id.to_string(),
        "parent": node.parent_id.map(|id| id.to_string()),
        "function": node.function_id.map(|id| id.to_string()),
        "created_at_ms": node.created_at_ms,
    });
    let fields = match &node.content {
        NodeContent::Message {
            role,
            parts,
            tool_calls,
        } => json!({
            "kind": "message",
            "role": role.as_str(),
            "parts": parts.iter().map(part_json).collect::<Vec<_>>(),
            "tool_calls": tool_calls.iter().map(|c| json!({
                "call_id": c.call_id,
                "name": c.name,
                "arguments_json": c.arguments_json,
            })).collect::<Vec<_>>(),
        }),
        NodeContent::ToolResult {
            call_id,
            name,
            parts,
            is_error,
        } => json!({
            "kind": "tool_result",
            "call_id": call_id,
            "name": name,
            "parts": parts.iter().map(part_json).collect::<Vec<_>>(),
            "is_error": is_error,
        }),
        NodeContent::FunctionCall {
            call_id,
            name,
            input,
            expose,
        } => json!({
            "kind": "function_call",
            "call_id": call_id,
            "name": name,
            "input": input,
            "expose": match expose {
                Expose::Io => "io",
                Expose::Full => "full",
                Expose::None => "none",
            },
        }),
        NodeContent::FunctionResult(result) => json!({
            "kind": "function_result",
            "call_id": result.call_id,
            "output": result.output,
            "status": match result.status {
                FunctionStatus::Completed => "completed",
                FunctionStatus::Error => "error",
            },
        }),
    };
    if let (Value::Object(v), Value::Object(fields)) = (&mut v, fields) {
        v.extend(fields);
    }
    v
}

fn summary(s: &Summary) -> Value {
    json!({
        "ctxd": "summary",
        "id": s.id.to_string(),
        "kind": s.kind.as_str(),
        "covers": s.covers.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "range": s.range.map(|(a, b)| [a.to_string(), b.to_string()]),
        "text": s.text,
        "rolls_over": s.rolls_over.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "ledger": s.ledger.as_deref(),
        "model": s.model,
        "base_head": s.base_head.to_string(),
        "tokens_before": s.tokens_before,
        "tokens_after": s.tokens_after,
        "created_at_ms": s.created_at_ms,
    })
}
