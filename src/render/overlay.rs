//! The summary overlay, the second render step: each active summary replaces what it covers,
//! preceded by the pinned nodes among them.

use std::collections::{HashMap, HashSet};

use super::{Hidden, Message, MessageRole};
use crate::domain::{NodeId, Part, PathView, Summary, SummaryId};
use crate::tokens::{Count, Tokens};

/// The fixed first line of a rendered summary, so a model (and a reader) knows what it is.
pub const SUMMARY_HEADER: &str =
    "[Summary of the earlier conversation, which it replaces to save context]";

/// The summaries that lie over `path`, newest first: each applies (every node it covers is on
/// the path) and shares no node with a newer one kept. A rolling summary covers the summaries
/// it rolled over, so those drop out; disjoint segment summaries all stay. A branch forked
/// before the end of a covered range never sees that summary.
pub fn active_summaries(path: &PathView) -> Vec<&Summary> {
    if path.summaries.is_empty() {
        return Vec::new();
    }
    let on_path = path.node_ids();
    let mut taken: HashSet<NodeId> = HashSet::new();
    let mut active = Vec::new();
    for summary in path.summaries.iter().rev() {
        if applies(summary, &on_path) && summary.covers.iter().all(|id| !taken.contains(id)) {
            taken.extend(summary.covers.iter().copied());
            active.push(summary);
        }
    }
    active
}

/// Whether `summary` applies to a path holding `on_path`: every node it covers is there.
pub fn applies(summary: &Summary, on_path: &HashSet<NodeId>) -> bool {
    !summary.covers.is_empty() && summary.covers.iter().all(|id| on_path.contains(id))
}

/// The token cap of a summary's evidence ledger under a history budget: an eighth of it, so
/// evidence never crowds out the conversation (and at least enough to name its files).
pub fn ledger_cap(history_budget: Option<Tokens>) -> Option<Tokens> {
    history_budget.map(|h| (h / 8).max(256))
}

/// The text a summary renders as: the header, the summary, then its ledger.
pub fn summary_text(summary: &Summary, cap: Option<Tokens>, counter: &dyn Count) -> String {
    if summary.by_agent() {
        return summary.text.clone();
    }
    let mut text = format!("{SUMMARY_HEADER}\n{}", summary.text);
    if let Some(ledger) = summary.ledger.as_deref() {
        let evidence = ledger.render(cap, counter);
        if !evidence.is_empty() {
            text.push_str("\n\n");
            text.push_str(&evidence);
        }
    }
    text
}

/// The message a summary renders as.
pub fn summary_message(summary: &Summary, cap: Option<Tokens>, counter: &dyn Count) -> Message {
    // A summary whose words are in the agent's window after it hides what it covers and
    // says nothing itself: no part, so no format writes it.
    let parts = if summary.renders_nothing() {
        Vec::new()
    } else {
        vec![Part::Text(summary_text(summary, cap, counter))]
    };
    Message {
        summary_id: Some(summary.id),
        ..Message::new(MessageRole::User, parts)
    }
}

/// Lays `summaries` (disjoint, as [`active_summaries`] gives them) over `messages`: each
/// replaces the messages it covers, where the first of them stood, and is followed by the
/// pinned ones among them in their order, each with what keeps the pairing whole: a pinned
/// result comes with its call (the call message keeping only the calls shown), a pinned call
/// message with its results. A render that shows none of a summary's messages (a function's own chain, say)
/// shows no summary.
pub fn overlay(
    messages: Vec<Message>,
    summaries: &[&Summary],
    cap: Option<Tokens>,
    counter: &dyn Count,
) -> Vec<Message> {
    if summaries.is_empty() {
        return messages;
    }
    let mut owner: HashMap<NodeId, usize> = HashMap::new();
    for (s, summary) in summaries.iter().enumerate() {
        owner.extend(summary.covers.iter().map(|id| (*id, s)));
    }
    // The summary that covers all of a message's nodes, if one does.
    let covered_by: Vec<Option<usize>> = messages
        .iter()
        .map(|m| {
            let first = owner.get(m.node_ids.first()?)?;
            m.node_ids
                .iter()
                .all(|id| owner.get(id) == Some(first))
                .then_some(*first)
        })
        .collect();
    let (reshown, only) = reshown(&messages, &covered_by);
    let mut out = Vec::with_capacity(messages.len());
    let mut placed: Vec<Option<usize>> = vec![None; summaries.len()];
    let mut tail: Vec<Vec<Message>> = vec![Vec::new(); summaries.len()];
    for (i, mut message) in messages.into_iter().enumerate() {
        let Some(s) = covered_by[i] else {
            out.push(message);
            continue;
        };
        let at = *placed[s].get_or_insert_with(|| {
            out.push(summary_message(summaries[s], cap, counter));
            out.len() - 1
        });
        out[at].hidden.push(Hidden {
            at_ms: message.at_ms,
            result: (message.role == MessageRole::Tool)
                .then(|| (Part::text_chars(&message.parts), message.is_error)),
            assistant: (message.role == MessageRole::Assistant)
                .then(|| (Part::text_chars(&message.parts), message.pinned)),
            kept: match message.role {
                MessageRole::Tool => 0,
                MessageRole::Assistant => message
                    .tool_calls
                    .iter()
                    .map(|c| c.arguments_json.len())
                    .sum(),
                MessageRole::User | MessageRole::System | MessageRole::Developer => {
                    Part::text_chars(&message.parts)
                }
            },
            reshown: reshown[i],
        });
        if reshown[i] {
            message.pinned_under = Some(summaries[s].id);
            if let Some(calls) = only.get(&i) {
                message.tool_calls.retain(|c| calls.contains(&c.call_id));
            }
            tail[s].push(message);
        }
    }
    // Pinned messages come just before their summary: they do not change when a summary is
    // made or rolled over, so the provider's cached prefix reaches through them. Insert from
    // the last summary back so earlier positions stay valid.
    let mut order: Vec<(usize, usize)> = placed
        .iter()
        .enumerate()
        .filter_map(|(s, at)| at.map(|at| (at, s)))
        .collect();
    order.sort_unstable();
    for (at, s) in order.into_iter().rev() {
        let pinned = std::mem::take(&mut tail[s]);
        out.splice(at..at, pinned);
    }
    out
}

/// Which covered messages a summary shows again, and for a call message shown again because
/// of a pinned result, which of its calls it keeps: the pinned messages, the calls of pinned
/// results (only those calls), and every result of a pinned call message. A result's call is
/// in the message that opens its group of results, as visibility lays them out.
fn reshown(
    messages: &[Message],
    covered_by: &[Option<usize>],
) -> (Vec<bool>, HashMap<usize, HashSet<String>>) {
    let mut keep: Vec<bool> = messages
        .iter()
        .zip(covered_by)
        .map(|(m, c)| c.is_some() && m.pinned)
        .collect();
    let mut only: HashMap<usize, HashSet<String>> = HashMap::new();
    if !keep.iter().any(|k| *k) {
        return (keep, only);
    }
    let same = |a: usize, b: usize| covered_by[a].is_some() && covered_by[a] == covered_by[b];
    for i in 0..messages.len() {
        if !keep[i] || !messages[i].pinned {
            continue;
        }
        if messages[i].role == MessageRole::Tool {
            let Some(opener) = (0..i)
                .rev()
                .find(|&j| messages[j].role != MessageRole::Tool)
            else {
                continue;
            };
            if same(opener, i) && !messages[opener].pinned {
                keep[opener] = true;
                if let Some(id) = &messages[i].tool_call_id {
                    only.entry(opener).or_default().insert(id.clone());
                }
            }
        } else if !messages[i].tool_calls.is_empty() {
            for j in (i + 1..messages.len()).take_while(|&j| messages[j].role == MessageRole::Tool)
            {
                if same(i, j) {
                    keep[j] = true;
                }
            }
        }
    }
    (keep, only)
}

/// The ids of the summaries shown in `messages`, in order.
pub fn shown(messages: &[Message]) -> Vec<SummaryId> {
    messages.iter().filter_map(|m| m.summary_id).collect()
}
