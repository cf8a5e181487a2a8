//! The summary overlay, the second render step: the active summary replaces what it covers.

use std::collections::HashSet;

use super::{Message, MessageRole, Reduction};
use crate::domain::{NodeId, Part, PathView, Summary};

/// The fixed first line of a rendered summary, so a model (and a reader) knows what it is.
pub const SUMMARY_HEADER: &str =
    "[Summary of the earlier conversation, which it replaces to save context]";

/// The summary that lies over `path`: the newest whose every covered node is on it. A branch
/// forked before the end of a covered range therefore never sees that summary.
pub fn active_summary(path: &PathView) -> Option<&Summary> {
    if path.summaries.is_empty() {
        return None;
    }
    let on_path = path.node_ids();
    path.summaries.iter().rev().find(|s| applies(s, &on_path))
}

/// Whether `summary` applies to a path holding `on_path`: every node it covers is there.
pub fn applies(summary: &Summary, on_path: &HashSet<NodeId>) -> bool {
    !summary.covers.is_empty() && summary.covers.iter().all(|id| on_path.contains(id))
}

/// The message a summary renders as.
pub fn summary_message(summary: &Summary) -> Message {
    Message {
        role: MessageRole::User,
        parts: vec![Part::Text(format!("{SUMMARY_HEADER}\n{}", summary.text))],
        tool_calls: Vec::new(),
        tool_call_id: None,
        name: None,
        is_error: false,
        node_ids: Vec::new(),
        function_id: None,
        reduction: Reduction::None,
        stubbed_inputs: 0,
        at_ms: None,
        summary_id: Some(summary.id),
    }
}

/// Replaces the messages `summary` covers by its one message, where the first of them stood.
/// A render that shows none of them (a function's own chain, say) shows no summary.
pub fn overlay(messages: Vec<Message>, summary: &Summary) -> Vec<Message> {
    let covers: HashSet<NodeId> = summary.covers.iter().copied().collect();
    let covered =
        |m: &Message| !m.node_ids.is_empty() && m.node_ids.iter().all(|id| covers.contains(id));
    let mut out = Vec::with_capacity(messages.len());
    let mut placed = false;
    for message in messages {
        if covered(&message) {
            if !placed {
                out.push(summary_message(summary));
                placed = true;
            }
        } else {
            out.push(message);
        }
    }
    out
}
