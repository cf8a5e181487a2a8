//! The gateway's ledger of each forwarded call: how much of it is the previous forwarded
//! request of its session (and function) up to that request's last cache breakpoint, which is
//! what the provider's cache can serve, and where it is not, why (a step, the budget, a marker
//! that moved, the client's own change, or a cache that expired by time). What the next call
//! is judged against is kept in the store for each conversation, so replicas behind a load
//! balancer judge alike; the provider's usage then shows whether the cache served what was
//! kept.

use serde::{Deserialize, Serialize};

use super::forward::{EntryShape, Kept};
use crate::domain::{NodeId, PrefixChange};
use crate::render::Trigger;
use crate::workflow::Workflows;
use crate::workflow::record::ConversationKey;

/// How long a provider keeps a cache entry unused: Anthropic's default breakpoints and
/// OpenAI's automatic cache both hold about five minutes; `ttl: "1h"` an hour.
const TTL_MS: i64 = 5 * 60 * 1000;
const TTL_LONG_MS: i64 = 60 * 60 * 1000;

/// How many blocks before a breakpoint Anthropic looks for an earlier one (here counted in
/// entries, each at least one block).
const LOOKBACK: usize = 20;

/// A forwarded request as the next one is compared with it.
#[derive(Debug, Clone)]
pub struct Forwarded {
    pub at_ms: i64,
    pub ttl_ms: i64,
    /// Characters before the conversation (system prompt, tools), cached by their own markers.
    pub fixed_chars: usize,
    pub entries: Vec<EntryShape>,
    /// Entries with a breakpoint; `None`: a provider that caches any prefix (OpenAI).
    pub breakpoints: Option<Vec<usize>>,
}

impl Forwarded {
    pub fn new(at_ms: i64, long_ttl: bool, fixed_chars: usize, kept: &Kept, marked: bool) -> Self {
        Self {
            at_ms,
            ttl_ms: if long_ttl { TTL_LONG_MS } else { TTL_MS },
            fixed_chars,
            entries: kept.shape.clone(),
            breakpoints: marked.then(|| kept.breakpoints.clone()),
        }
    }

    fn chars(&self, entries: usize) -> usize {
        self.fixed_chars
            + self.entries[..entries.min(self.entries.len())]
                .iter()
                .map(|e| e.chars)
                .sum::<usize>()
    }

    fn total(&self) -> usize {
        self.chars(self.entries.len())
    }
}

/// What a call kept of the previous one: the share of its characters the cache can serve, and
/// why the rest could not be.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Verdict {
    pub kept_share: f64,
    pub change: Option<PrefixChange>,
}

/// The render's step, which names a step's change: what triggered it, its boundary, and the
/// later calls its saving needed to pay it back.
#[derive(Debug, Clone, Copy, Default)]
pub struct Step {
    pub trigger: Option<Trigger>,
    pub boundary: usize,
    pub payback_calls: Option<u32>,
}

/// Compares `now` with the conversation's previous forwarded request.
pub fn judge(previous: Option<&Previous>, now: &Forwarded, step: Step) -> Verdict {
    let none = |change| Verdict {
        kept_share: 0.0,
        change,
    };
    let Some(prev) = previous else {
        return none(Some(PrefixChange::First));
    };
    let idle = now.at_ms.saturating_sub(prev.at_ms);
    if idle > prev.ttl_ms {
        return none(Some(PrefixChange::Expired { idle_ms: idle }));
    }
    // What the previous request wrote: up to its last breakpoint, or all of it.
    if prev.breakpoints.as_ref().is_some_and(Vec::is_empty) {
        return none(None);
    }
    let written = prev.ids.len();
    let first_diff = (0..written).find(|&k| now.entries.get(k).is_none_or(|e| e.id != prev.ids[k]));
    let share = |entries: usize| {
        let total = now.total().max(1);
        now.chars(entries) as f64 / total as f64
    };
    match first_diff {
        None => {
            // The same prefix: read only where a breakpoint of this request reaches back to it.
            let reaches = match &now.breakpoints {
                None => true,
                Some(b) => b
                    .iter()
                    .any(|&at| at + 1 >= written && at + 1 - written < LOOKBACK),
            };
            if reaches {
                Verdict {
                    kept_share: share(written),
                    change: None,
                }
            } else {
                none(Some(PrefixChange::MarkerMoved))
            }
        }
        Some(k) => {
            // Kept: up to the last breakpoint before the change (any prefix for OpenAI).
            let kept = match &prev.breakpoints {
                None => k,
                Some(b) => b.iter().rev().find(|&&at| at < k).map_or(0, |&at| at + 1),
            };
            let change = match now.entries.get(k) {
                Some(e) if e.changed => match step.trigger {
                    Some(Trigger::Count | Trigger::Idle) => Some(PrefixChange::Step {
                        results: u32::try_from(step.boundary).unwrap_or(u32::MAX),
                        payback_calls: step.payback_calls,
                    }),
                    _ => Some(PrefixChange::Budget),
                },
                _ => Some(PrefixChange::ClientChanged),
            };
            Verdict {
                kept_share: share(kept),
                change,
            }
        }
    }
}

/// A conversation: its session, and its function for a sub-agent.
pub type Key = ConversationKey;

/// A forwarded request as the next call is judged against it: when it went, how long its cache
/// lives, the ids of the entries it wrote to the cache (up to its last breakpoint, or all), and
/// its breakpoints (`None`: a provider that caches any prefix).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Previous {
    at_ms: i64,
    ttl_ms: i64,
    ids: Vec<u64>,
    breakpoints: Option<Vec<usize>>,
}

impl From<&Forwarded> for Previous {
    fn from(f: &Forwarded) -> Self {
        let written = match &f.breakpoints {
            None => f.entries.len(),
            Some(b) => b.last().map_or(0, |&last| last + 1),
        };
        Self {
            at_ms: f.at_ms,
            ttl_ms: f.ttl_ms,
            ids: f.entries.iter().take(written).map(|e| e.id).collect(),
            breakpoints: f.breakpoints.clone(),
        }
    }
}

/// What a conversation's next call is judged and rendered against: its newest forwarded
/// request, and its last step (the step's boundary and the node the model had seen then).
/// Kept in the store (`gateway_conversations`), read at the start of each call and written
/// before the call is forwarded, so the next call finds it on whichever replica serves it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct State {
    #[serde(default)]
    previous: Option<Previous>,
    #[serde(default)]
    horizon: Option<(usize, String)>,
    /// The identities of every entry the newest request forwarded, when its thinking was
    /// checked against them (`--gateway-reasoning drop`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    sent: Option<Vec<u64>>,
}

impl State {
    /// The conversation's state as the workflow keeps it; a fresh one where none is kept or
    /// it cannot be read (the ledger then judges the call `first`, and the render takes no
    /// held horizon: nothing is lost but the comparison).
    pub async fn load(workflows: &Workflows, key: Key) -> Self {
        let Some(text) = workflows.conversation_state(key).await else {
            return Self::default();
        };
        serde_json::from_str(&text).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "gateway: a conversation's ledger state was unreadable");
            Self::default()
        })
    }

    /// Writes the state for the conversation's next call.
    pub async fn save(&self, workflows: &Workflows, key: Key) {
        if let Ok(text) = serde_json::to_string(self) {
            workflows.save_conversation_state(key, &text).await;
        }
    }

    /// Judges `now` against the conversation's previous forwarded request, and keeps `now` as
    /// the one the next call is judged against.
    pub fn record(&mut self, now: &Forwarded, step: Step) -> Verdict {
        let verdict = judge(self.previous.as_ref(), now, step);
        self.previous = Some(Previous::from(now));
        verdict
    }

    /// When the conversation's newest request was forwarded: its last call, whose cache the
    /// next one finds expired after the provider's lifetime.
    pub fn last_call(&self) -> Option<i64> {
        self.previous.as_ref().map(|p| p.at_ms)
    }

    /// The conversation's last step: its boundary and the node the model had seen then.
    pub fn horizon(&self) -> Option<(usize, NodeId)> {
        let (boundary, seen) = self.horizon.as_ref()?;
        NodeId::parse("horizon", seen)
            .ok()
            .map(|id| (*boundary, id))
    }

    /// The identities of the entries the newest request forwarded, if its thinking was checked.
    pub fn sent(&self) -> &[u64] {
        self.sent.as_deref().unwrap_or_default()
    }

    pub fn set_sent(&mut self, sent: Vec<u64>) {
        self.sent = Some(sent);
    }

    pub fn set_horizon(&mut self, (boundary, seen): (usize, NodeId)) {
        self.horizon = Some((boundary, seen.to_string()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: u64, changed: bool) -> EntryShape {
        EntryShape {
            id,
            chars: 100,
            changed,
            client: !changed,
        }
    }

    fn forwarded(at_ms: i64, ids: &[(u64, bool)], breakpoints: &[usize]) -> Forwarded {
        Forwarded {
            at_ms,
            ttl_ms: TTL_MS,
            fixed_chars: 0,
            entries: ids.iter().map(|&(id, c)| entry(id, c)).collect(),
            breakpoints: Some(breakpoints.to_vec()),
        }
    }

    #[test]
    fn a_resent_history_keeps_what_was_written_up_to_the_last_breakpoint() {
        let a = forwarded(0, &[(1, false), (2, false)], &[1]);
        let b = forwarded(1000, &[(1, false), (2, false), (3, false)], &[2]);
        let v = judge(Some(&Previous::from(&a)), &b, Step::default());
        assert_eq!(v.change, None);
        assert!((v.kept_share - 2.0 / 3.0).abs() < 1e-9);
        assert_eq!(
            judge(None, &b, Step::default()).change,
            Some(PrefixChange::First)
        );
    }

    #[test]
    fn a_state_read_back_judges_as_the_one_written() {
        let a = forwarded(0, &[(1, false), (2, false), (3, false)], &[1]);
        let mut state = State::default();
        assert_eq!(
            state.record(&a, Step::default()).change,
            Some(PrefixChange::First)
        );
        let seen = NodeId::new();
        state.set_horizon((7, seen));
        let text = serde_json::to_string(&state).expect("a state is JSON");
        let mut back: State = serde_json::from_str(&text).expect("read back");
        assert_eq!(back, state);
        assert_eq!(back.horizon(), Some((7, seen)));
        assert_eq!(back.last_call(), Some(0));
        // What was not written (after the last breakpoint) is not kept.
        let b = forwarded(1000, &[(1, false), (2, false), (9, false)], &[2]);
        let v = back.record(&b, Step::default());
        assert_eq!(v.change, None);
        assert!((v.kept_share - 2.0 / 3.0).abs() < 1e-9);
    }

    #[test]
    fn each_reason_is_told_apart() {
        let a = forwarded(0, &[(1, false), (2, false), (3, false)], &[2]);
        let stepped = forwarded(1000, &[(1, false), (9, true), (3, false)], &[2]);
        assert_eq!(
            judge(
                Some(&Previous::from(&a)),
                &stepped,
                Step {
                    trigger: Some(Trigger::Count),
                    boundary: 20,
                    payback_calls: Some(3),
                }
            )
            .change,
            Some(PrefixChange::Step {
                results: 20,
                payback_calls: Some(3)
            })
        );
        assert_eq!(
            judge(Some(&Previous::from(&a)), &stepped, Step::default()).change,
            Some(PrefixChange::Budget)
        );
        let edited = forwarded(1000, &[(1, false), (8, false), (3, false)], &[2]);
        assert_eq!(
            judge(Some(&Previous::from(&a)), &edited, Step::default()).change,
            Some(PrefixChange::ClientChanged)
        );
        let late = forwarded(TTL_MS + 1, &[(1, false), (2, false), (3, false)], &[2]);
        assert_eq!(
            judge(Some(&Previous::from(&a)), &late, Step::default()).change,
            Some(PrefixChange::Expired {
                idle_ms: TTL_MS + 1
            })
        );
        let ids: Vec<(u64, bool)> = (1..=40).map(|i| (i, false)).collect();
        let far = forwarded(1000, &ids, &[39]);
        assert_eq!(
            judge(Some(&Previous::from(&a)), &far, Step::default()).change,
            Some(PrefixChange::MarkerMoved),
            "a breakpoint more than 20 entries after the written one reads nothing"
        );
    }
}
