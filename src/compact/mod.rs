//! Compaction, pure: choosing the range a summary replaces, its input, and the commit rule.
//!
//! Both phases measure the context the same way: visibility, the summary overlay and budget
//! reduction, without microcompact or snip (the lossy steps a summary exists to avoid).

mod segment;

use std::collections::{HashMap, HashSet};

use crate::domain::{Hash, Ledger, Node, NodeId, PathView, Summary, SummaryId, SummaryKind};
use crate::render::{self, Budget, Message, Options, Policy, Rendered};
use crate::tokens::{Count, Tokens};

pub use segment::prepare_segment;

/// What Prepare found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prepared {
    /// No model should be called.
    NotNeeded {
        tokens_before: Tokens,
        reason: String,
    },
    Needed(Box<SummaryPlan>),
}

/// The range a summary will replace, fixed at Prepare so Commit cannot be handed another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SummaryPlan {
    pub kind: SummaryKind,
    /// The nodes the summary will cover: the rolled-over summaries', then the new range's.
    pub covers: Vec<NodeId>,
    /// The first and last covered node on the path.
    pub range: Option<(NodeId, NodeId)>,
    /// The summaries it rolls over, in render order.
    pub rolls_over: Vec<SummaryId>,
    /// What the covered nodes did, the rolled-over summaries' evidence merged in.
    pub ledger: Ledger,
    /// What the summarizer reads: the prior summary, then the range as rendered with budget
    /// reduction (never microcompact placeholders: it sees the evidence).
    pub input: Vec<Message>,
    pub input_tokens: Tokens,
    pub tokens_before: Tokens,
    /// How many newest turns stay as they are.
    pub retained_turns: usize,
    /// The head of the user message that opens the first retained turn (rolling summaries), by
    /// which a summary request over the whole context says where the summary ends.
    pub retained_opening: Option<String>,
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
    // The prior summary (which stands with the preamble, after the pins it shows again) opens
    // the range: the new one rolls it in, with every segment summary the range shows.
    let range_start = messages[..preamble_end]
        .iter()
        .position(|m| m.summary_id.is_some() || m.pinned_under.is_some())
        .unwrap_or(preamble_end);
    let range = &messages[range_start..range_end];
    let rolled = rolled_over(path, range);

    // The new range in path terms: every top-level node from its first to the node before the
    // first retained turn, hidden ones included, and the chains its messages show.
    let position = |id: &NodeId| path.nodes.iter().position(|n| n.id == *id);
    // The range starts at its first shown node, or earlier where a summary it rolls over does.
    let first_shown = range
        .iter()
        .filter(|m| m.summary_id.is_none())
        .flat_map(|m| &m.node_ids)
        .chain(rolled.iter().flat_map(|s| &s.covers))
        .filter_map(position)
        .min();
    let retained_start = messages[range_end].node_ids.first().and_then(position);
    let mut candidates: Vec<NodeId> = Vec::new();
    if let (Some(from), Some(to)) = (first_shown, retained_start)
        && from < to
    {
        candidates.extend(path.nodes[from..to].iter().map(|n| n.id));
    }
    candidates.extend(
        range
            .iter()
            .filter(|m| m.function_id.is_some())
            .flat_map(|m| &m.node_ids),
    );
    let covers = ordered_covers(candidates, &rolled);
    let input: Vec<Message> = range.to_vec();
    let opening: String = crate::domain::Part::text_of(&messages[range_end].parts)
        .chars()
        .take(OPENING_CHARS)
        .collect();
    let input_tokens = tokens[range_start..range_end]
        .iter()
        .fold(0, |s: Tokens, t| s.saturating_add(*t));
    let mut plan = plan(
        path,
        SummaryKind::Rolling,
        covers,
        &rolled,
        input,
        input_tokens,
        tokens_before,
        retained,
    );
    plan.retained_opening = Some(opening);
    Prepared::Needed(Box::new(plan))
}

/// Characters of the first retained user message a summary request quotes.
const OPENING_CHARS: usize = 120;

/// What the summary request asks, after the context it shares with the host.
const SUMMARY_REQUEST: &str = "[Summary request] The conversation above no longer fits the \
context. Write the working memory that will replace its older part, so the work can continue \
without it: keep every request of the user (verbatim when short), decisions and their reasons, \
files, commands, errors and how they were resolved, and exactly where the work stands. If an \
earlier summary is above, fold it in: the result replaces both. Write plain text, as short as \
the facts allow, and call no tool.";

/// Introduces the ledger to a summarizer, in either form of request.
pub const EVIDENCE_NOTE: &str = "The store keeps this evidence verbatim right after your \
summary (files, commands, errors, user requests, sub-agents): do not restate it; say what it \
does not: decisions, reasons, state of the work and what is left to do.";

/// The summary request that reads the host's cached prefix: `context`, exactly as the host's
/// render gave it, then one user message asking for the summary of everything before the
/// retained turns, with the host's `instructions` and the `evidence` the summary will carry.
/// A provider reads the whole context from its cache (0.1×) and writes only that message,
/// where a request of the range alone writes all of it anew (1.25×).
pub fn cache_sharing_request(
    mut context: Vec<Message>,
    plan: &SummaryPlan,
    instructions: &str,
    evidence: &str,
) -> Vec<Message> {
    let mut ask = SUMMARY_REQUEST.to_owned();
    if let Some(opening) = plan.retained_opening.as_deref() {
        ask.push_str(&format!(
            "\n\nSummarize everything above before the user message that begins {opening:?}; \
             from that message on, the conversation stays as it is."
        ));
    }
    if !instructions.trim().is_empty() {
        ask.push_str("\n\n");
        ask.push_str(instructions.trim());
    }
    if !evidence.is_empty() {
        ask.push_str(&format!("\n\n{EVIDENCE_NOTE}\n{evidence}"));
    }
    context.push(Message::new(
        render::MessageRole::User,
        vec![crate::domain::Part::Text(ask)],
    ));
    context
}

/// The covers of a new summary: `candidates` in order, each rolled-over summary's covers where
/// its first node stands (all of them, even those off the candidates), without repeats.
fn ordered_covers(candidates: Vec<NodeId>, rolled: &[&Summary]) -> Vec<NodeId> {
    let owner: HashMap<NodeId, usize> = rolled
        .iter()
        .enumerate()
        .flat_map(|(i, s)| s.covers.iter().map(move |id| (*id, i)))
        .collect();
    let mut covers = Vec::with_capacity(candidates.len());
    let mut seen: HashSet<NodeId> = HashSet::new();
    let mut emitted = vec![false; rolled.len()];
    for id in candidates {
        match owner.get(&id) {
            Some(&i) if !emitted[i] => {
                emitted[i] = true;
                covers.extend(rolled[i].covers.iter().filter(|c| seen.insert(**c)));
            }
            Some(_) => {}
            None if seen.insert(id) => covers.push(id),
            None => {}
        }
    }
    for (i, summary) in rolled.iter().enumerate() {
        if !emitted[i] {
            covers.extend(summary.covers.iter().filter(|c| seen.insert(**c)));
        }
    }
    covers
}

/// The summaries whose messages `range` shows, in order: those a summary of it rolls over.
fn rolled_over<'p>(path: &'p PathView, range: &[Message]) -> Vec<&'p Summary> {
    let ids: Vec<SummaryId> = range.iter().filter_map(|m| m.summary_id).collect();
    ids.iter()
        .filter_map(|id| path.summaries.iter().find(|s| s.id == *id))
        .collect()
}

/// A plan over `covers`: its range on the path, its ledger and its source hash.
#[allow(clippy::too_many_arguments)]
fn plan(
    path: &PathView,
    kind: SummaryKind,
    covers: Vec<NodeId>,
    rolled: &[&Summary],
    input: Vec<Message>,
    input_tokens: Tokens,
    tokens_before: Tokens,
    retained_turns: usize,
) -> SummaryPlan {
    let hashes: HashMap<NodeId, Hash> = path.all_nodes().map(|n| (n.id, n.hash)).collect();
    let mut source = blake3::Hasher::new();
    for id in &covers {
        if let Some(hash) = hashes.get(id) {
            source.update(&hash.0);
        }
    }
    let covered: HashSet<NodeId> = covers.iter().copied().collect();
    let on_path: Vec<NodeId> = path
        .nodes
        .iter()
        .map(|n| n.id)
        .filter(|id| covered.contains(id))
        .collect();
    SummaryPlan {
        kind,
        range: on_path.first().zip(on_path.last()).map(|(a, b)| (*a, *b)),
        rolls_over: rolled.iter().map(|s| s.id).collect(),
        ledger: ledger(path, &covers, rolled),
        covers,
        input,
        input_tokens,
        tokens_before,
        retained_turns,
        retained_opening: None,
        source_hash: Hash(*source.finalize().as_bytes()),
    }
}

/// The ledger of `covers`: in their order, each rolled-over summary's stored ledger where its
/// nodes begin (derived from its nodes when it has none), the other nodes' derived between.
/// Deterministic: the same nodes and summaries give the same ledger.
pub fn ledger(path: &PathView, covers: &[NodeId], rolled: &[&Summary]) -> Ledger {
    let nodes: HashMap<NodeId, &Node> = path.all_nodes().map(|n| (n.id, n)).collect();
    let owner: HashMap<NodeId, usize> = rolled
        .iter()
        .enumerate()
        .filter(|(_, s)| s.ledger.is_some())
        .flat_map(|(i, s)| s.covers.iter().map(move |id| (*id, i)))
        .collect();
    let mut ledger = Ledger::default();
    let mut run: Vec<&Node> = Vec::new();
    let mut merged: HashSet<usize> = HashSet::new();
    for id in covers {
        if let Some(&i) = owner.get(id) {
            if merged.insert(i) {
                ledger.merge(Ledger::derive(run.drain(..)));
                if let Some(stored) = rolled[i].ledger.as_deref() {
                    ledger.merge(stored.clone());
                }
            }
        } else if let Some(node) = nodes.get(id) {
            run.push(node);
        }
    }
    ledger.merge(Ledger::derive(run));
    ledger
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
    // The summaries it touches now must be exactly those it was prepared to roll over: a
    // summary committed since over any of its nodes makes it stale; a disjoint one composes.
    let covered: HashSet<NodeId> = summary.covers.iter().copied().collect();
    let touching: HashSet<SummaryId> = render::active_summaries(&path)
        .iter()
        .filter(|s| s.covers.iter().any(|id| covered.contains(id)))
        .map(|s| s.id)
        .collect();
    let planned: HashSet<SummaryId> = summary.rolls_over.iter().copied().collect();
    if touching != planned || !render::applies(summary, &path.node_ids()) {
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
