//! Compaction, pure: choosing the range a summary replaces, its input, and the commit rule.
//!
//! Both phases measure the context the same way: visibility, the summary overlay and budget
//! reduction, without microcompact or snip (the lossy steps a summary exists to avoid).

use std::collections::{HashMap, HashSet};

use crate::domain::{Hash, NodeId, PathView, Summary, SummaryId};
use crate::render::{self, Budget, Message, Options, Policy, Rendered};
use crate::tokens::{Count, Tokens};

/// What Prepare found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prepared {
    /// No model should be called.
    NotNeeded {
        tokens_before: Tokens,
        reason: String,
    },
    Needed(Plan),
}

/// The range a summary will replace, fixed at Prepare so Commit cannot be handed another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The nodes the summary will cover: the prior summary's, then the new range's, in order.
    pub covers: Vec<NodeId>,
    pub prior: Option<SummaryId>,
    /// What the summarizer reads: the prior summary, then the range as rendered with budget
    /// reduction (never microcompact placeholders: it sees the evidence).
    pub input: Vec<Message>,
    pub input_tokens: Tokens,
    pub tokens_before: Tokens,
    /// How many newest turns stay as they are.
    pub retained_turns: usize,
    /// BLAKE3 over the hashes of the covered nodes, in order: the same source has the same key
    /// wherever its nodes live.
    pub source_hash: Hash,
}

/// Renders as compaction measures: overlay and budget reduction only.
pub fn measure(
    path: &PathView,
    max_tool_result_chars: usize,
    budget: Budget,
    counter: &dyn Count,
) -> Rendered {
    let options = Options {
        budget: Some(budget),
        policy: Policy::reduction_only(max_tool_result_chars),
        ..Options::default()
    };
    render::render(path, &options, counter)
}

/// Chooses what to summarize on a branch's path (`path.scope` is `None`).
///
/// The range is the top-level history after the preamble and the applicable summary, up to the
/// newest `retain_turns` turns (only the newest one when keeping more would not fit). It always
/// ends on a turn boundary; a running function lives in the newest turn, so never inside it.
pub fn prepare(
    path: &PathView,
    budget: Budget,
    retain_turns: usize,
    max_tool_result_chars: usize,
    counter: &dyn Count,
) -> Prepared {
    let limit = budget.history().unwrap_or(0);
    let rendered = measure(path, max_tool_result_chars, budget, counter);
    let tokens_before = rendered.report.total_tokens;
    if tokens_before <= limit {
        return Prepared::NotNeeded {
            tokens_before,
            reason: format!("the history fits: {tokens_before} of {limit} tokens"),
        };
    }
    let messages = &rendered.messages;
    let tokens = &rendered.tokens;
    let turn_starts = render::turn_starts(messages);
    let preamble_end = turn_starts.first().copied().unwrap_or(messages.len());
    let kept_tokens = |from: usize| -> Tokens {
        tokens[..preamble_end]
            .iter()
            .chain(&tokens[from..])
            .fold(0, |s: Tokens, t| s.saturating_add(*t))
    };
    let mut retained = retain_turns.max(1).min(turn_starts.len());
    while retained > 1 && kept_tokens(turn_starts[turn_starts.len() - retained]) > limit {
        retained -= 1;
    }
    let Some(&range_end) = turn_starts
        .len()
        .checked_sub(retained)
        .and_then(|i| turn_starts.get(i))
    else {
        return Prepared::NotNeeded {
            tokens_before,
            reason: "the path has no turn to summarize".to_owned(),
        };
    };
    if range_end <= preamble_end {
        return Prepared::NotNeeded {
            tokens_before,
            reason: format!(
                "nothing is older than the newest {retained} turn(s), which alone take {} of \
                 {limit} tokens",
                kept_tokens(range_end)
            ),
        };
    }
    let prior = render::active_summary(path);
    // The prior summary (which stands with the preamble) opens the range: the new one rolls it in.
    let range_start = messages[..preamble_end]
        .iter()
        .position(|m| m.summary_id.is_some())
        .unwrap_or(preamble_end);
    let range = &messages[range_start..range_end];

    // The new range in path terms: every top-level node from its first to the node before the
    // first retained turn, hidden ones included, and the chains its messages show.
    let position = |id: &NodeId| path.nodes.iter().position(|n| n.id == *id);
    let first_shown = range
        .iter()
        .filter(|m| m.summary_id.is_none())
        .flat_map(|m| &m.node_ids)
        .filter_map(position)
        .min();
    let retained_start = messages[range_end].node_ids.first().and_then(position);
    let mut covers: Vec<NodeId> = prior.map(|s| s.covers.clone()).unwrap_or_default();
    let mut seen: HashSet<NodeId> = covers.iter().copied().collect();
    if let (Some(from), Some(to)) = (first_shown, retained_start) {
        for node in &path.nodes[from..to] {
            if seen.insert(node.id) {
                covers.push(node.id);
            }
        }
    }
    for id in range
        .iter()
        .filter(|m| m.function_id.is_some())
        .flat_map(|m| &m.node_ids)
    {
        if seen.insert(*id) {
            covers.push(*id);
        }
    }
    let hashes: HashMap<NodeId, Hash> = path.all_nodes().map(|n| (n.id, n.hash)).collect();
    let mut source = blake3::Hasher::new();
    for id in &covers {
        if let Some(hash) = hashes.get(id) {
            source.update(&hash.0);
        }
    }
    let input: Vec<Message> = range.to_vec();
    let input_tokens = tokens[range_start..range_end]
        .iter()
        .fold(0, |s: Tokens, t| s.saturating_add(*t));
    Prepared::Needed(Plan {
        covers,
        prior: prior.map(|s| s.id),
        input,
        input_tokens,
        tokens_before,
        retained_turns: retained,
        source_hash: Hash(*source.finalize().as_bytes()),
    })
}

/// What Commit decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Apply { before: Tokens, after: Tokens },
    Empty { before: Tokens },
    NoGain { before: Tokens, after: Tokens },
    Stale { before: Tokens },
}

/// The commit rule: `summary` (covering `plan`'s range) applies to the branch's current path
/// only if it is not stale and the estimated tokens strictly decrease.
///
/// New turns appended at the tail since Prepare are fine: the comparison is made on `path`,
/// the current head.
pub fn judge(
    mut path: PathView,
    plan_prior: Option<SummaryId>,
    summary: &Summary,
    budget: Budget,
    max_tool_result_chars: usize,
    counter: &dyn Count,
) -> Verdict {
    let before = measure(&path, max_tool_result_chars, budget, counter)
        .report
        .total_tokens;
    if summary.text.trim().is_empty() {
        return Verdict::Empty { before };
    }
    let prior_now = render::active_summary(&path).map(|s| s.id);
    if prior_now != plan_prior || !render::applies(summary, &path.node_ids()) {
        return Verdict::Stale { before };
    }
    path.summaries.push(summary.clone());
    let after = measure(&path, max_tool_result_chars, budget, counter)
        .report
        .total_tokens;
    if after < before {
        Verdict::Apply { before, after }
    } else {
        Verdict::NoGain { before, after }
    }
}
