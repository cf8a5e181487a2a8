//! Turns, and snipping: whole oldest turns dropped, the last resort when the context is still
//! over budget after every other step.

use std::collections::HashSet;

use super::Fit;
use crate::domain::{NodeId, PathView};
use crate::render::{Message, MessageRole, Report};

/// Where the turns of rendered messages start. Turns are top-level: a function's prompt belongs
/// to its caller's turn. A summary, and the pins it shows again, stand where the turns they
/// replace stood: at the front, a rolling summary stands with the preamble.
pub fn turn_starts(messages: &[Message]) -> Vec<usize> {
    messages
        .iter()
        .enumerate()
        .filter(|(_, m)| {
            m.role == MessageRole::User
                && !m.observation
                && m.summary_id.is_none()
                && m.pinned_under.is_none()
                && m.function_id.is_none()
        })
        .map(|(i, _)| i)
        .collect()
}

/// Where turns start, and which messages belong to a running function.
pub(super) struct Layout {
    /// Indexes of the user messages that open turns, in order.
    pub(super) turn_starts: Vec<usize>,
    /// Messages of a function still running on this path: never snipped.
    pub(super) running: Vec<bool>,
}

impl Layout {
    pub(super) fn of(messages: &[Message], path: &PathView) -> Self {
        // Every scope the path passes through, except the top level, is a running function.
        let running_scopes: HashSet<NodeId> =
            path.nodes.iter().filter_map(|n| n.function_id).collect();
        Self {
            turn_starts: turn_starts(messages),
            running: messages
                .iter()
                .map(|m| m.function_id.is_some_and(|f| running_scopes.contains(&f)))
                .collect(),
        }
    }

    /// Messages before the first turn (system prompts, the summary): never snipped.
    pub(super) fn preamble(&self, len: usize) -> usize {
        self.turn_starts.first().copied().unwrap_or(len)
    }

    /// The message range of turn `t`.
    pub(super) fn turn(&self, t: usize, len: usize) -> std::ops::Range<usize> {
        self.turn_starts[t]..self.turn_starts.get(t + 1).copied().unwrap_or(len)
    }

    /// Where the newest `n` turns start (`0` when the path has no turn).
    pub(super) fn newest_turns_start(&self, n: usize) -> usize {
        let n = n.max(1);
        match self.turn_starts.len() {
            0 => 0,
            len => self.turn_starts[len.saturating_sub(n)],
        }
    }
}

impl Fit<'_> {
    /// Snips whole oldest turns, never the newest, never a running function's content, and the
    /// retained ones only when they cannot fit anyway; which messages it dropped.
    pub(super) fn snip(&self, report: &mut Report) -> Vec<bool> {
        let len = self.messages.len();
        let mut dropped = vec![false; len];
        if !self.policy.snip || self.policy.provider_edits {
            return dropped;
        }
        let (retained, retained_fit) = self.retained();
        let layout = &self.layout;
        let mut total = self.total();
        for t in 0..layout.turn_starts.len().saturating_sub(1) {
            if total <= self.limit {
                break;
            }
            let range = layout.turn(t, len);
            if range.start >= retained && retained_fit {
                break;
            }
            if range
                .clone()
                .any(|i| layout.running[i] || self.messages[i].pinned || self.messages[i].unseen)
            {
                continue;
            }
            for i in range {
                dropped[i] = true;
                total = total.saturating_sub(self.counts[i].total());
                report.snipped.extend(&self.messages[i].node_ids);
            }
            report.turns_snipped += 1;
        }
        dropped
    }
}
