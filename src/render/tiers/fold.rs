//! Microcompact: where the boundary before which results are cleared falls, folded over the
//! path's results in order (stepped), or set only when over budget (ctxd's first policy).

use super::{Fit, Keep, Layout, MARKER_SLACK, placeholder_chars};
use crate::domain::Part;
use crate::render::{MessageRole, Policy, Report, Trigger};
use crate::tokens::Tokens;

impl Fit<'_> {
    /// Stepped microcompact: steps by count and idle gaps, zones, then the over-budget fallback.
    /// Returns the first message the next step may change.
    pub(super) fn stepped(&mut self, report: &mut Report) -> usize {
        let policy = self.policy;
        let n = self.results.len();
        let (boundary, step, trigger) = self.steps();
        report.trigger = trigger;
        report.microcompact_boundary = boundary;
        // What a step does is never less than what arrival did: a call stubbed, or a text cut,
        // when it first came stays so.
        let old_inputs = policy
            .max_tool_input_chars
            .min(policy.recent_tool_input_chars);
        let old_texts = policy
            .max_assistant_text_chars
            .min(policy.recent_assistant_text_chars);
        for k in 0..n {
            if k < boundary {
                self.clear(k);
                self.stub(k, old_inputs);
            } else if k < step {
                self.cap(k, policy.max_tool_result_chars);
                self.stub(k, old_inputs);
            } else {
                self.cap(k, policy.recent_tool_result_chars);
                self.stub(k, policy.recent_tool_input_chars);
            }
        }
        // Everything before the boundary is decided; the boundary only moves forward. Before
        // the first step nothing is: a step will cut the assistant text there.
        let decided = if boundary == 0 {
            0
        } else {
            self.first_message_of(boundary)
        };
        for i in 0..self.messages.len() {
            if i < decided {
                self.cut_text(i, old_texts, Keep::Head);
            } else {
                self.cut_text(i, policy.recent_assistant_text_chars, Keep::HeadAndTail);
            }
        }
        let stable = if boundary == 0 {
            let first_assistant = self
                .messages
                .iter()
                .position(|m| m.role == MessageRole::Assistant)
                .unwrap_or(self.messages.len());
            self.first_message_of(0).min(first_assistant)
        } else {
            decided
        };
        if self.total() <= self.limit && !policy.reactive {
            return stable;
        }
        // Over budget: the standard cap for every result, then a step at the latest count.
        for k in step..n {
            self.cap(k, policy.max_tool_result_chars);
        }
        if self.total() <= self.limit && !policy.reactive {
            return stable;
        }
        let newest_turn = self.layout.newest_turns_start(1);
        let (forced, why) = if policy.reactive {
            (n, Some(Trigger::Reactive))
        } else {
            match count_step(&policy, n) {
                Some(c) if c.saturating_sub(policy.microcompact_keep) > boundary => (
                    c.saturating_sub(policy.microcompact_keep),
                    Some(Trigger::Count),
                ),
                _ => (boundary, trigger),
            }
        };
        report.trigger = why;
        report.microcompact_boundary = forced;
        for k in boundary..forced {
            let i = self.results[k];
            // Told the provider refused: all but the newest turn's own results go.
            if policy.reactive && i >= newest_turn && !self.layout.running[i] {
                continue;
            }
            self.clear(k);
            self.stub(k, old_inputs);
        }
        stable
    }

    /// Folds the path's steps in order: (boundary, count at the last step, what triggered it).
    /// Each step depends only on the results before it, so a later append never moves an
    /// earlier step.
    fn steps(&self) -> (usize, usize, Option<Trigger>) {
        let policy = &self.policy;
        let n = self.results.len();
        // (count, idle): a step may happen once `count` results have rendered.
        let mut candidates: Vec<(usize, bool)> = Vec::new();
        let every = policy.microcompact_every.max(1);
        let mut c = policy.microcompact_first;
        while c <= n {
            candidates.push((c, false));
            c = match c.checked_add(every) {
                Some(next) => next,
                None => break,
            };
        }
        if policy.idle_ms < i64::MAX {
            // An idle gap leaves the provider's cache cold: a step there costs nothing extra.
            let mut latest: Option<i64> = None;
            let mut seen = 0;
            // What a summary hides keeps its times, so summarizing adds no gap and hides none.
            let timeline = self.messages.iter().flat_map(|m| {
                m.hidden
                    .iter()
                    .map(|h| (h.at_ms, h.result.is_some()))
                    .chain([(
                        m.at_ms,
                        m.role == MessageRole::Tool && m.pinned_under.is_none(),
                    )])
            });
            for (at, is_result) in timeline {
                if let Some(t) = at {
                    if latest.is_some_and(|l| t.saturating_sub(l) >= policy.idle_ms) {
                        candidates.push((seen, true));
                    }
                    latest = Some(latest.map_or(t, |l| l.max(t)));
                }
                if is_result {
                    seen += 1;
                }
            }
            if self.idle {
                candidates.push((n, true));
            }
        }
        candidates.sort_unstable();
        let keep = policy.microcompact_keep;
        let texts = if policy.clear_at_least_tokens > 0 && !candidates.is_empty() {
            self.text_savings(policy)
        } else {
            Vec::new()
        };
        let (mut boundary, mut step, mut trigger) = (0, 0, None);
        for (c, idle) in candidates {
            let target = c.saturating_sub(keep).max(boundary);
            if c <= step && target == boundary {
                continue;
            }
            if !idle
                && policy.clear_at_least_tokens > 0
                && self.saving(boundary..target, policy, &texts) < policy.clear_at_least_tokens
            {
                continue;
            }
            boundary = target;
            step = step.max(c);
            trigger = Some(if idle { Trigger::Idle } else { Trigger::Count });
        }
        (boundary, step, trigger)
    }

    /// An estimate of what a step from `range.start` to `range.end` saves: the characters of
    /// each result cleared at the recent cap beyond its placeholder, and of each assistant text
    /// it decides beyond its cut, at four a token. It depends on nothing a render changes but
    /// by making it smaller (a cut result is shorter, a cleared one is its placeholder and
    /// saves nothing), so a render rendered again takes no step the first did not.
    fn saving(&self, range: std::ops::Range<usize>, policy: &Policy, texts: &[usize]) -> Tokens {
        let placeholder = [placeholder_chars(false), placeholder_chars(true)];
        let results: usize = range
            .clone()
            .map(|k| {
                let is_error = self.hidden[k].unwrap_or(self.messages[self.results[k]].is_error);
                self.chars[k]
                    .min(policy.recent_tool_result_chars)
                    .saturating_sub(placeholder[usize::from(is_error)])
            })
            .sum();
        let texts = match range.start {
            0 => texts[range.end],
            start => texts[range.end].saturating_sub(texts[start]),
        };
        Tokens::try_from((results + texts) / 4).unwrap_or(Tokens::MAX)
    }

    /// For each result `k`, the characters a step would cut from the assistant texts before
    /// the assistant message that opened `k`'s group, and last those of all texts: what
    /// `saving` counts between two steps, summed once per render. In the path's own order,
    /// what a summary hides counted where it stood, so a summary over some of them changes no
    /// step before it.
    fn text_savings(&self, policy: &Policy) -> Vec<usize> {
        // A text within a marker's length of the cap is not cut (and one cut before saves
        // nothing again).
        let cut = |chars: usize| {
            chars
                .min(policy.recent_assistant_text_chars)
                .saturating_sub(policy.max_assistant_text_chars.saturating_add(MARKER_SLACK))
        };
        let mut before = Vec::with_capacity(self.results.len() + 1);
        let (mut sum, mut opening) = (0, 0);
        for m in &self.messages {
            // A pin a summary shows again counts where the summary hid it.
            if m.pinned_under.is_some() {
                continue;
            }
            for h in &m.hidden {
                if let Some((chars, pinned)) = h.assistant {
                    opening = sum;
                    if !pinned {
                        sum += cut(chars);
                    }
                }
                if h.result.is_some() {
                    before.push(opening);
                }
            }
            match m.role {
                MessageRole::Assistant => {
                    opening = sum;
                    if !m.pinned {
                        sum += cut(Part::text_chars(&m.parts));
                    }
                }
                MessageRole::Tool => before.push(opening),
                _ => {}
            }
        }
        before.push(sum);
        debug_assert_eq!(before.len(), self.results.len() + 1, "one per result");
        before
    }

    /// ctxd's first policy: budget reduction always, microcompact only over budget.
    /// Returns the first message the next step may change.
    pub(super) fn over_budget(&mut self, report: &mut Report) -> usize {
        let policy = self.policy;
        let n = self.results.len();
        let len = self.messages.len();
        for k in 0..n {
            self.cap(k, policy.max_tool_result_chars);
        }
        let (retained, retained_fit) = self.retained();
        let protect_from = if retained_fit && !policy.reactive {
            retained
        } else {
            self.layout.newest_turns_start(1)
        };
        let over = self.total() > self.limit;
        report.trigger = if policy.reactive {
            Some(Trigger::Reactive)
        } else if !over {
            None
        } else if n >= policy.microcompact_first {
            Some(Trigger::Count)
        } else if self.idle {
            Some(Trigger::Idle)
        } else {
            None
        };
        // The boundary moves only in steps of `every`, so between steps the rendered prefix
        // stays byte-identical and a provider's prompt cache keeps hitting.
        let boundary = match report.trigger {
            None => 0,
            Some(Trigger::Reactive) => n,
            Some(Trigger::Idle) => n.saturating_sub(policy.microcompact_keep),
            Some(Trigger::Count) => count_step(&policy, n)
                .unwrap_or(0)
                .saturating_sub(policy.microcompact_keep),
        };
        report.microcompact_boundary = boundary;
        // The newest turns are kept verbatim, but a running function's own results age like
        // any others: a sub-agent's long chain must not be frozen.
        let decided = |layout: &Layout, i: usize| i < protect_from || layout.running[i];
        for k in 0..boundary {
            if decided(&self.layout, self.results[k]) {
                self.clear(k);
            }
        }
        let stable = (0..n)
            .find(|&k| k >= boundary || !decided(&self.layout, self.results[k]))
            .map_or(len, |k| self.results[k]);
        // With more than two retained turns, a later append can bring older turns back under
        // protection (the newest ones fit again) and restore their results: they are not stable.
        if policy.retain_turns > 2 && !policy.reactive {
            stable.min(self.layout.newest_turns_start(policy.retain_turns - 1))
        } else {
            stable
        }
    }
}

/// The latest count step at `n` results: `first`, then every `every` more.
fn count_step(policy: &Policy, n: usize) -> Option<usize> {
    if n < policy.microcompact_first {
        return None;
    }
    let every = policy.microcompact_every.max(1);
    Some(policy.microcompact_first + (n - policy.microcompact_first) / every * every)
}
