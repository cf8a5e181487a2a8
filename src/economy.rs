//! The context economy of a session: what its renders sent against the same calls unpruned,
//! priced as a provider's prompt cache charges them.
//!
//! A replay renders the session as it stood before each model call (each assistant message on
//! the path). The longest run of leading messages identical to the previous call's input is a
//! cache read at [`CACHE_READ`]; everything after it is written at [`CACHE_WRITE`], and all of it
//! when the call comes [`CACHE_TTL_MS`] or more after the previous one (the cache expired). The
//! unpruned arm renders the same prefix with no budget and no summary: every message as it came.

use crate::domain::{NodeContent, PathView, Role};
use crate::render::{Message, Options, render};
use crate::tokens::{Count, Tokens};

pub use crate::render::{CACHE_READ, CACHE_TTL_MS, CACHE_WRITE};

/// What a provider's cache compares of a message: equal messages are a hit.
pub fn same_for_cache(a: &Message, b: &Message) -> bool {
    a.role == b.role
        && a.parts == b.parts
        && a.tool_calls == b.tool_calls
        && a.tool_call_id == b.tool_call_id
        && a.name == b.name
        && a.is_error == b.is_error
}

/// The cache-weighted price of `input` (with its tokens per message) sent after `previous`.
pub fn cost(input: &[Message], tokens: &[Tokens], previous: &[Message]) -> f64 {
    let cached = input
        .iter()
        .zip(previous)
        .take_while(|(a, b)| same_for_cache(a, b))
        .count();
    let read: u64 = tokens[..cached].iter().map(|&t| u64::from(t)).sum();
    let total: u64 = tokens.iter().map(|&t| u64::from(t)).sum();
    CACHE_READ * read as f64 + CACHE_WRITE * (total - read) as f64
}

/// Tokens and cache-weighted cost (in token units) of one or more calls, sent and unpruned.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Figures {
    pub sent_tokens: u64,
    pub unpruned_tokens: u64,
    pub sent_cost: f64,
    pub unpruned_cost: f64,
}

impl Figures {
    fn add(&mut self, other: Figures) {
        self.sent_tokens += other.sent_tokens;
        self.unpruned_tokens += other.unpruned_tokens;
        self.sent_cost += other.sent_cost;
        self.unpruned_cost += other.unpruned_cost;
    }
}

/// A session's savings: over its newest calls, and for the render now (the next call).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Savings {
    /// Model calls on the path: its assistant messages.
    pub calls_total: usize,
    /// The newest of them replayed.
    pub calls_replayed: usize,
    pub replayed: Figures,
    /// The render of the whole path, priced after the last call.
    pub next: Figures,
}

/// The inputs of the two arms at one point of the path, kept to price the next call.
struct Inputs {
    sent: (Vec<Message>, Vec<Tokens>),
    unpruned: (Vec<Message>, Vec<Tokens>),
}

/// Replays the newest `max_calls` model calls of `path` (top level) under `options`, then
/// prices the render of the whole path as the next call.
pub fn replay(
    path: &PathView,
    options: &Options,
    counter: &dyn Count,
    max_calls: usize,
) -> Savings {
    let calls: Vec<usize> = path
        .nodes
        .iter()
        .enumerate()
        .filter(|(k, n)| {
            *k > 0
                && matches!(&n.content, NodeContent::Message { role, .. } if *role == Role::Assistant)
        })
        .map(|(k, _)| k)
        .collect();
    let replayed = &calls[calls.len().saturating_sub(max_calls)..];
    // A call is made once its input is in: at the time of the node before its answer.
    let made_at = |k: usize| path.nodes[k - 1].created_at_ms;
    // The call before the first replayed one is rendered only as the cache it leaves.
    let warm = calls.len() - replayed.len();
    let mut previous = warm.checked_sub(1).map(|i| {
        (
            inputs_at(path, calls[i], options, counter),
            made_at(calls[i]),
        )
    });
    let mut savings = Savings {
        calls_total: calls.len(),
        calls_replayed: replayed.len(),
        ..Savings::default()
    };
    for &k in replayed {
        let now = inputs_at(path, k, options, counter);
        savings
            .replayed
            .add(price(&now, cached(&previous, made_at(k))));
        previous = Some((now, made_at(k)));
    }
    let now = inputs(path, options, counter);
    savings.next = price(&now, cached(&previous, options.now_ms));
    savings
}

/// What the previous call (its inputs, made at its time) left in the cache, unless it has expired
/// by `at`.
fn cached(previous: &Option<(Inputs, i64)>, at: i64) -> Option<&Inputs> {
    previous
        .as_ref()
        .filter(|(_, before)| at.saturating_sub(*before) < CACHE_TTL_MS)
        .map(|(inputs, _)| inputs)
}

/// The inputs of the call that made node `k`: the path before it, as it stood then.
fn inputs_at(path: &PathView, k: usize, options: &Options, counter: &dyn Count) -> Inputs {
    let at = path.nodes[k].created_at_ms;
    let before = PathView {
        nodes: path.nodes[..k].to_vec(),
        scope: path.scope,
        chains: path.chains.clone(),
        // Only the summaries that existed when the call was made.
        summaries: path
            .summaries
            .iter()
            .filter(|s| s.created_at_ms <= at)
            .cloned()
            .collect(),
        pinned: path.pinned.clone(),
    };
    let options = Options {
        now_ms: at,
        ..*options
    };
    inputs(&before, &options, counter)
}

fn inputs(path: &PathView, options: &Options, counter: &dyn Count) -> Inputs {
    let sent = render(path, options, counter);
    let unpruned_path = PathView {
        summaries: Vec::new(),
        ..path.clone()
    };
    let unpruned = render(
        &unpruned_path,
        &Options {
            budget: None,
            ..*options
        },
        counter,
    );
    Inputs {
        sent: (sent.messages, sent.tokens),
        unpruned: (unpruned.messages, unpruned.tokens),
    }
}

fn price(now: &Inputs, previous: Option<&Inputs>) -> Figures {
    let none: &[Message] = &[];
    let sum = |t: &[Tokens]| t.iter().map(|&t| u64::from(t)).sum::<u64>();
    Figures {
        sent_tokens: sum(&now.sent.1),
        unpruned_tokens: sum(&now.unpruned.1),
        sent_cost: cost(
            &now.sent.0,
            &now.sent.1,
            previous.map_or(none, |p| &p.sent.0),
        ),
        unpruned_cost: cost(
            &now.unpruned.0,
            &now.unpruned.1,
            previous.map_or(none, |p| &p.unpruned.0),
        ),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::domain::{Hash, Node, NodeId, Part};
    use crate::tokens::{TokenCache, Tokenizer};

    /// A user message and an answer, then another pair `gap_ms` later.
    fn two_calls(gap_ms: i64) -> PathView {
        let message = |role, text: &str, at| {
            Arc::new(Node {
                id: NodeId::new(),
                parent_id: None,
                function_id: None,
                content: NodeContent::Message {
                    role,
                    parts: vec![Part::Text(text.repeat(200))],
                    tool_calls: Vec::new(),
                },
                created_at_ms: at,
                hash: Hash([0; 32]),
            })
        };
        PathView {
            nodes: vec![
                message(Role::User, "question ", 0),
                message(Role::Assistant, "answer ", 1_000),
                message(Role::User, "again ", 1_000 + gap_ms),
                message(Role::Assistant, "answer ", 2_000 + gap_ms),
            ],
            scope: None,
            chains: Default::default(),
            summaries: Vec::new(),
            pinned: Default::default(),
        }
    }

    #[test]
    fn a_call_after_the_cache_expired_reads_nothing() {
        let cache = TokenCache::default();
        let counter = cache.counter(Tokenizer::Heuristic);
        let options = Options::default();
        let warm = replay(&two_calls(60_000), &options, &counter, 2);
        let cold = replay(&two_calls(CACHE_TTL_MS), &options, &counter, 2);
        // The same tokens either way; after the gap the first call's prefix is written again.
        assert_eq!(warm.replayed.sent_tokens, cold.replayed.sent_tokens);
        assert!(cold.replayed.sent_cost > warm.replayed.sent_cost);
        assert!(cold.replayed.unpruned_cost > warm.replayed.unpruned_cost);
        let all_written = CACHE_WRITE * cold.replayed.sent_tokens as f64;
        assert!(
            (cold.replayed.sent_cost - all_written).abs() < 1e-9,
            "{cold:?}"
        );
    }
}
