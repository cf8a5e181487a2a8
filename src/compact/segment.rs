//! Segment summaries: a caller-chosen run of the path, checked whole, and what it covers.

use std::collections::{HashMap, HashSet};

use super::{Plan, Prepared, measure, plan};
use crate::domain::{Budget, Error, Node, NodeContent, NodeId, PathView, Summary, SummaryKind};
use crate::render::{self, Message};
use crate::tokens::{Count, Tokens};

/// The call ids a node takes part in: the calls an assistant message makes, or the call a
/// result, function call or function result answers.
fn call_ids(node: &Node) -> Vec<&str> {
    match &node.content {
        NodeContent::Message { tool_calls, .. } => {
            tool_calls.iter().map(|c| c.call_id.as_str()).collect()
        }
        NodeContent::ToolResult { call_id, .. } | NodeContent::FunctionCall { call_id, .. } => {
            vec![call_id.as_str()]
        }
        NodeContent::FunctionResult(result) => vec![result.call_id.as_str()],
    }
}

/// Whether `node` closes a call (a tool or function result).
fn answers(node: &Node) -> bool {
    matches!(
        node.content,
        NodeContent::ToolResult { .. } | NodeContent::FunctionResult(_)
    )
}

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
    // Covers in path order, each rolled-over summary's where its first node stands.
    let owner: HashMap<NodeId, usize> = rolled
        .iter()
        .enumerate()
        .flat_map(|(i, s)| s.covers.iter().map(move |id| (*id, i)))
        .collect();
    let mut covers = Vec::with_capacity(covered.len());
    let mut seen: HashSet<NodeId> = HashSet::new();
    for id in &covered {
        match owner.get(id) {
            Some(&i) => covers.extend(rolled[i].covers.iter().filter(|c| seen.insert(**c))),
            None if seen.insert(*id) => covers.push(*id),
            None => {}
        }
    }
    let mut plan: Plan = plan(
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
    Ok(Prepared::Needed(plan))
}

/// Checks that the segment `path.nodes[start..=end]` splits no call from its answer, naming the
/// first node inside that does.
fn check_whole(path: &PathView, start: usize, end: usize) -> Result<(), Error> {
    let inside = &path.nodes[start..=end];
    let ids: HashSet<&str> = inside.iter().flat_map(|n| call_ids(n)).collect();
    // Where each call id of the segment appears outside it, and on which side.
    let mut outside: HashMap<&str, (NodeId, bool)> = HashMap::new();
    for (i, node) in path.nodes.iter().enumerate() {
        if (start..=end).contains(&i) {
            continue;
        }
        for id in call_ids(node) {
            if ids.contains(id) {
                outside.entry(id).or_insert((node.id, i < start));
            }
        }
    }
    let answered: HashSet<&str> = inside
        .iter()
        .filter(|n| answers(n))
        .flat_map(|n| call_ids(n))
        .collect();
    for node in inside {
        for id in call_ids(node) {
            if let Some((other, before)) = outside.get(id) {
                let field = if *before {
                    "from_node_id"
                } else {
                    "to_node_id"
                };
                return Err(Error::invalid(
                    field,
                    format!(
                        "the segment splits node {} from node {other} (call {id:?}): a call \
                         and its result are both in a segment or both out",
                        node.id
                    ),
                ));
            }
            if !answered.contains(id) {
                return Err(Error::invalid(
                    "to_node_id",
                    format!(
                        "node {} makes call {id:?}, which has no result yet: a segment ends \
                         after the results of its calls",
                        node.id
                    ),
                ));
            }
        }
    }
    Ok(())
}
