//! Visibility, the first render step: which nodes of a path show, and as what messages.

use std::collections::HashMap;
use std::sync::Arc;

use super::{Callers, Message, MessageRole};
use crate::domain::{Expose, FunctionStatus, Node, NodeContent, NodeId, Part, PathView, Role};

/// The messages a path shows before any budget step.
///
/// A completed function shows as its call and result (`io`), followed by its internal chain
/// (`full`), or not at all (`none`, which also takes its call out of the assistant message).
/// In `full`, the chain follows the whole tool group of the call (the assistant message and
/// all its results), so every provider's pairing rule holds. At a function, its callers' context
/// shows above its chain unless `callers` is `None`.
pub fn visible(path: &PathView, callers: Callers) -> Vec<Message> {
    let mut segments: Vec<&[Arc<Node>]> = path
        .nodes
        .chunk_by(|a, b| a.function_id == b.function_id)
        .collect();
    if callers == Callers::None {
        segments = segments
            .pop()
            .filter(|last| last.first().is_some_and(|n| n.function_id == path.scope))
            .into_iter()
            .collect();
    }
    let mut out = Vec::with_capacity(path.nodes.len());
    for segment in segments {
        chain(segment, &path.chains, &mut out);
    }
    out
}

/// Renders one scope's chain onto `out`.
fn chain(nodes: &[Arc<Node>], chains: &HashMap<NodeId, Vec<Arc<Node>>>, out: &mut Vec<Message>) {
    // Function calls of this chain by call id: (function id, expose, name).
    let mut functions: HashMap<&str, (NodeId, Expose, &str)> = HashMap::new();
    let mut latest_assistant: Option<usize> = None;
    let mut emptied: Vec<usize> = Vec::new();
    // Chains of `full` functions wait until their tool group ends, so an assistant message is
    // followed by all its results before any transcript.
    let mut deferred: Vec<NodeId> = Vec::new();
    for node in nodes {
        match &node.content {
            NodeContent::Message {
                role,
                parts,
                tool_calls,
            } => {
                splice(&mut deferred, chains, out);
                if *role == Role::Assistant {
                    latest_assistant = Some(out.len());
                }
                let role = match role {
                    Role::System => MessageRole::System,
                    Role::Developer => MessageRole::Developer,
                    Role::User => MessageRole::User,
                    Role::Assistant => MessageRole::Assistant,
                };
                out.push(Message {
                    tool_calls: tool_calls.clone(),
                    ..of_node(node, role, parts.clone())
                });
            }
            NodeContent::ToolResult {
                call_id,
                name,
                parts,
                is_error,
            } => out.push(Message {
                tool_call_id: Some(call_id.clone()),
                name: Some(name.clone()),
                is_error: *is_error,
                ..of_node(node, MessageRole::Tool, parts.clone())
            }),
            NodeContent::FunctionCall {
                call_id,
                name,
                expose,
                ..
            } => {
                functions.insert(call_id, (node.id, *expose, name));
                if *expose == Expose::None
                    && let Some(at) = latest_assistant
                {
                    out[at].tool_calls.retain(|c| c.call_id != *call_id);
                    emptied.push(at);
                }
            }
            NodeContent::FunctionResult(result) => {
                let (call_node, expose, name) = functions
                    .get(result.call_id.as_str())
                    .copied()
                    .unwrap_or((node.id, Expose::Io, ""));
                if expose == Expose::None {
                    continue;
                }
                let node_ids = if call_node == node.id {
                    vec![node.id]
                } else {
                    vec![call_node, node.id]
                };
                let output = vec![Part::Text(result.output.clone())];
                out.push(Message {
                    tool_call_id: Some(result.call_id.clone()),
                    name: Some(name.to_owned()),
                    is_error: result.status == FunctionStatus::Error,
                    node_ids,
                    ..of_node(node, MessageRole::Tool, output)
                });
                if expose == Expose::Full {
                    deferred.push(call_node);
                }
            }
        }
    }
    splice(&mut deferred, chains, out);
    // An assistant message whose only calls went to hidden functions has nothing left to say.
    emptied.sort_unstable();
    emptied.dedup();
    for at in emptied.into_iter().rev() {
        if out[at].parts.is_empty() && out[at].tool_calls.is_empty() {
            out.remove(at);
        }
    }
}

/// A message of `role` saying `parts`, from `node` alone: its recall, scope and time.
fn of_node(node: &Node, role: MessageRole, parts: Vec<Part>) -> Message {
    Message {
        node_ids: vec![node.id],
        recall: Some(node.hash),
        function_id: node.function_id,
        at_ms: Some(node.created_at_ms),
        ..Message::new(role, parts)
    }
}

/// Renders the deferred chains of `full` functions, in the order their results came.
fn splice(
    deferred: &mut Vec<NodeId>,
    chains: &HashMap<NodeId, Vec<Arc<Node>>>,
    out: &mut Vec<Message>,
) {
    for function in deferred.drain(..) {
        if let Some(inner) = chains.get(&function) {
            chain(inner, chains, out);
        }
    }
}
