//! Segment summaries: a caller-chosen run of the path, checked whole, and what it covers.

use std::collections::{HashMap, HashSet};

use super::{Prepared, SummaryPlan, measure, ordered_covers, plan};
use crate::domain::{Budget, Error, Node, NodeContent, NodeId, PathView, Summary, SummaryKind};
use crate::render::{self, Message};
use crate::tokens::{Count, Tokens};

/// Plans a summary of the nodes from `from` to `to` (inclusive) on a branch's path.
///
/// The segment must be whole: every call it makes answered inside it, every result it holds
/// called inside it, every function it opens closed inside it. It may contain summaries whole
/// (the new one rolls them over) but not overlap one partly: the covered ranges of the
/// summaries laid over a path never cross, so each renders in one place.
pub fn prepare_segment(
    path: &PathView,
    from: NodeId,
    to: NodeId,
    budget: Budget,
    max_tool_result_chars: usize,
    counter: &dyn Count,
) -> Result<Prepared, Error> {
    let position = |id: NodeId, field: &str| {
        path.nodes
            .iter()
            .position(|n| n.id == id)
            .ok_or_else(|| Error::invalid(field, format!("node {id} is not on the branch's path")))
    };
    let (start, end) = (position(from, "from_node_id")?, position(to, "to_node_id")?);
    if start > end {
        return Err(Error::invalid(
            "to_node_id",
            format!("node {to} comes before from_node_id {from} on the path"),
        ));
    }
    let segment = &path.nodes[start..=end];
    check_whole(path, start, end)?;

    // The segment's nodes, with the internal chains of the functions it holds that render in
    // full (nested ones too), in path order.
    let mut covered: Vec<NodeId> = Vec::new();
    let mut todo: Vec<&Node> = segment.iter().map(|n| &**n).rev().collect();
    while let Some(node) = todo.pop() {
        covered.push(node.id);
        if let NodeContent::FunctionResult(result) = &node.content
            && let Some(chain) = result
                .chain
                .as_ref()
                .and_then(|c| path.chains.get(&c.function_id))
        {
            todo.extend(chain.iter().map(|n| &**n).rev());
        }
    }
    let inside: HashSet<NodeId> = covered.iter().copied().collect();

    let mut rolled: Vec<&Summary> = Vec::new();
    for summary in render::active_summaries(path) {
        let within = summary
            .covers
            .iter()
            .filter(|id| inside.contains(id))
            .count();
        if within == 0 {
            continue;
        }
        if within < summary.covers.len() {
            return Err(Error::invalid(
                "from_node_id",
                format!(
                    "the segment overlaps summary {} partly: a segment contains a summary's \
                     whole range or none of it",
                    summary.id
                ),
            ));
        }
        rolled.push(summary);
    }

    let rendered = measure(path, max_tool_result_chars, budget, counter);
    // What the summarizer reads: the segment's messages as the path renders now, the
    // summaries it rolls over (and the pins they show again) included, in order.
    let rolled_ids: HashSet<_> = rolled.iter().map(|s| s.id).collect();
    let shown = |m: &Message| {
        m.summary_id.is_some_and(|id| rolled_ids.contains(&id))
            || m.pinned_under.is_some_and(|id| rolled_ids.contains(&id))
            || (!m.node_ids.is_empty() && m.node_ids.iter().all(|id| inside.contains(id)))
    };
    let mut input = Vec::new();
    let mut input_tokens: Tokens = 0;
    for (message, tokens) in rendered.messages.iter().zip(&rendered.tokens) {
        if shown(message) {
            input.push(message.clone());
            input_tokens = input_tokens.saturating_add(*tokens);
        }
    }
    rolled.sort_by_key(|s| {
        input
            .iter()
            .position(|m| m.summary_id == Some(s.id))
            .unwrap_or(usize::MAX)
    });
    let covers = ordered_covers(covered, &rolled);
    let mut plan: SummaryPlan = plan(
        path,
        SummaryKind::Segment,
        covers,
        &rolled,
        input,
        input_tokens,
        rendered.report.total_tokens,
        0,
    );
    plan.range = Some((from, to));
    Ok(Prepared::Needed(Box::new(plan)))
}

/// Checks that the segment `path.nodes[start..=end]` splits no call from its answer, naming the
/// first node inside that does. A result answers the latest call with its id before it (ids may
/// repeat along a path), as the store's pairing rules have it.
fn check_whole(path: &PathView, start: usize, end: usize) -> Result<(), Error> {
    let inside = |i: usize| (start..=end).contains(&i);
    // Where each open call id was made: the assistant message, and the function call if any.
    let mut made: HashMap<&str, usize> = HashMap::new();
    let mut opened: HashMap<&str, usize> = HashMap::new();
    // (a, b, call id): node b answers node a.
    let mut edges: Vec<(usize, usize, &str)> = Vec::new();
    let mut answered: HashSet<(usize, &str)> = HashSet::new();
    for (i, node) in path.nodes.iter().enumerate() {
        match &node.content {
            NodeContent::Message { tool_calls, .. } => {
                for call in tool_calls {
                    made.insert(call.call_id.as_str(), i);
                }
            }
            NodeContent::FunctionCall { call_id, .. } => {
                if let Some(&a) = made.get(call_id.as_str()) {
                    edges.push((a, i, call_id));
                }
                opened.insert(call_id.as_str(), i);
            }
            NodeContent::ToolResult { call_id, .. } => {
                if let Some(&a) = made.get(call_id.as_str()) {
                    edges.push((a, i, call_id));
                    answered.insert((a, call_id));
                }
            }
            NodeContent::FunctionResult(result) => {
                let id = result.call_id.as_str();
                if let Some(&a) = made.get(id) {
                    edges.push((a, i, id));
                    answered.insert((a, id));
                }
                if let Some(&f) = opened.get(id) {
                    edges.push((f, i, id));
                }
            }
        }
    }
    for (a, b, id) in edges {
        if inside(a) == inside(b) {
            continue;
        }
        let (node, other, before) = if inside(a) {
            (a, b, false)
        } else {
            (b, a, true)
        };
        let field = if before { "from_node_id" } else { "to_node_id" };
        return Err(Error::invalid(
            field,
            format!(
                "the segment splits node {} from node {} (call {id:?}): a call and its result \
                 are both in a segment or both out",
                path.nodes[node].id, path.nodes[other].id
            ),
        ));
    }
    for i in start..=end {
        if let NodeContent::Message { tool_calls, .. } = &path.nodes[i].content
            && let Some(call) = tool_calls
                .iter()
                .find(|c| !answered.contains(&(i, c.call_id.as_str())))
        {
            return Err(Error::invalid(
                "to_node_id",
                format!(
                    "node {} makes call {:?}, which has no result yet: a segment ends after the \
                     results of its calls",
                    path.nodes[i].id, call.call_id
                ),
            ));
        }
    }
    Ok(())
}
