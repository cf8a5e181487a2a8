//! Microcompact: where the boundary before which results are cleared falls, folded over the
//! path's results in order (stepped), or set only when over budget (ctxd's first policy).

use super::payback::{Timeline, payback, rewrite_cost};
use super::{Fit, Keep, Layout, MARKER_SLACK, cleared_placeholder, placeholder_chars};
use crate::domain::Part;
use crate::render::{MessageRole, Policy, Report, Trigger};
use crate::tokens::Tokens;

impl Fit<'_> {
    /// Stepped microcompact: steps by count and idle gaps, zones, then the over-budget fallback.
    /// Returns the first message the next step may change.
    pub(super) fn stepped(&mut self, report: &mut Report) -> usize {
        let policy = self.policy;
        let n = self.results.len();
        let Steps {
            boundary,
            step,
            trigger,
            payback_calls,
        } = self.steps();
        report.trigger = trigger;
        report.payback_calls = payback_calls;
        report.microcompact_boundary = boundary;
        // What a step does is never less than what arrival did: a call stubbed, or a text cut,
        // when it first came stays so.
        let old_inputs = policy
            .max_tool_input_chars
            .min(policy.recent_tool_input_chars);
        let old_texts = policy
            .max_assistant_text_chars
            .min(policy.recent_assistant_text_chars);
        if policy.provider_edits {
            return self.stepped_as_edits(report, boundary);
        }
        for k in 0..n {
            if k < boundary {
                self.clear(k);
                self.stub(k, old_inputs);
            } else if k < step {
                // Kept at a step as it was kept before it: a step clears, it does not cut what
                // the working set still holds.
                self.cap(k, policy.recent_tool_result_chars);
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
        let stable = self.stable_from(boundary);
        if self.total() <= self.limit && !policy.reactive {
            return stable;
        }
        // Over budget: the standard cap for every result, and none keeps more than half the
        // history's budget (at four characters a token), then a step at the latest count.
        let cap = policy.max_tool_result_chars.min(
            usize::try_from(self.limit)
                .unwrap_or(usize::MAX)
                .saturating_mul(2),
        );
        for k in boundary..n {
            self.cap(k, cap);
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
        if forced != boundary {
            // Forced by the budget, not paid for by its saving.
            report.payback_calls = None;
        }
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

    /// Stepped microcompact when the provider applies the steps (its `clear_tool_uses` edit):
    /// every result before the boundary is cleared whole and nothing else is reduced, for no
    /// other change can be said as an edit the provider makes. Over budget, the latest count
    /// step is forced; what is still over is left for the provider to refuse, as it would have.
    fn stepped_as_edits(&mut self, report: &mut Report, boundary: usize) -> usize {
        let policy = self.policy;
        let n = self.results.len();
        let mut boundary = boundary;
        if self.cleared_whole(boundary) > self.limit && !policy.reactive {
            if let Some(c) = count_step(&policy, n)
                && c.saturating_sub(policy.microcompact_keep) > boundary
            {
                boundary = c.saturating_sub(policy.microcompact_keep);
                report.trigger = Some(Trigger::Count);
                report.payback_calls = None;
            }
        } else if policy.reactive {
            boundary = n;
            report.trigger = Some(Trigger::Reactive);
            report.payback_calls = None;
        }
        report.microcompact_boundary = boundary;
        for k in 0..boundary {
            self.clear_whole(k);
        }
        self.stable_from(boundary)
    }

    /// The first message the next step may change, the last one's boundary at `boundary`:
    /// before any step, the first result's call or the first assistant message, whichever comes
    /// first (a step will cut the assistant text there).
    fn stable_from(&self, boundary: usize) -> usize {
        if boundary > 0 {
            return self.first_message_of(boundary);
        }
        let first_assistant = self
            .messages
            .iter()
            .position(|m| m.role == MessageRole::Assistant)
            .unwrap_or(self.messages.len());
        self.first_message_of(0).min(first_assistant)
    }

    /// The render's total with the results before `boundary` cleared, without clearing them.
    fn cleared_whole(&self, boundary: usize) -> Tokens {
        let placeholder = |k: usize| self.placeholder_tokens(&self.messages[self.results[k]]);
        (0..boundary)
            .filter(|&k| self.hidden[k].is_none())
            .fold(self.total(), |total, k| {
                let i = self.results[k];
                total
                    .saturating_sub(self.counts[i].total())
                    .saturating_add(placeholder(k))
            })
    }

    /// Folds the path's steps in order: (boundary, count at the last step, what triggered it,
    /// the calls its saving needed to pay back). Each step depends only on the path before it,
    /// so a later append never moves an earlier step.
    ///
    /// Every call of the path (each assistant message, and the call this render is for) may
    /// step. It does when the provider's cache had expired before it (`idle_ms` since the call
    /// before), for then everything is written anew anyway; otherwise only when the saving
    /// pays back the rewrite: what it removes is read at 0.1× on every later call (1.25× after
    /// an expiry, at the share of expired gaps seen so far), while the step writes everything
    /// after the change at 1.25× instead of reading it at 0.1×; and only with good odds that
    /// the session runs long enough to earn it back (`Policy::payback_odds`).
    fn steps(&self) -> Steps {
        let policy = &self.policy;
        let timeline = Timeline::of(self);
        let texts = self.text_savings(policy);
        let keep = policy.microcompact_keep;
        let mut taken = Steps::default();
        let (mut gaps, mut expired) = (0usize, 0usize);
        // What each result (with the assistant text before it) would save once cleared, and
        // the calls the path had run when it became clearable (past the newest `keep`).
        let unit = self.clearable_chars(policy, &texts);
        // Running sums, so each call weighs its step in constant time (a render runs on every
        // request): of `unit`, and of `unit` times the calls run when each became clearable.
        let mut units_before = vec![0u128; unit.len() + 1];
        for (k, u) in unit.iter().enumerate() {
            units_before[k + 1] = units_before[k] + *u as u128;
        }
        let mut weighted_before = vec![0u128];
        for point in &timeline.points {
            // The expiries seen so far, weighed against a prior of unexpired gaps: one long
            // gap early in a short session (the first human turn, say) is no rate yet.
            let expired_share = expired as f64 / (gaps + EXPIRY_PRIOR_GAPS) as f64;
            if point.calls > 0 {
                gaps += 1;
                expired += usize::from(point.cold);
            }
            let c = point.results;
            let (boundary, step) = (taken.boundary, taken.step);
            let target = c.saturating_sub(keep).max(boundary);
            for k in weighted_before.len() - 1..target {
                let w = weighted_before[k] + unit[k] as u128 * point.calls as u128;
                weighted_before.push(w);
            }
            let between = |sums: &[u128]| sums[target] - sums[boundary];
            let saving = usize::try_from(between(&units_before)).unwrap_or(usize::MAX);
            // A call after the cache expired steps whatever the count: it is free.
            if (c < policy.microcompact_first && !point.cold) || saving == 0 {
                continue;
            }
            if point.cold {
                taken = Steps {
                    boundary: target,
                    step: step.max(c),
                    trigger: Some(Trigger::Idle),
                    payback_calls: None,
                };
                continue;
            }
            if tokens(saving) < policy.clear_at_least_tokens {
                continue;
            }
            // What not stepping has cost: each clearable result read again at every call since
            // it became clearable. A step waits until this reaches its rewrite (the economic
            // order quantity of a cost that grows as the clearable does), so steps come as
            // often as they pay and no more; it depends only on what is still there to clear,
            // so a render rendered again steps no further than the first.
            let waste = policy.prices.read()
                * (between(&units_before) * point.calls as u128 - between(&weighted_before)) as f64;
            // What the step leaves after its change, all written anew: from the call of the
            // first result it keeps up to the newest result, not the call, for what follows it
            // before the call (a user's message) may differ between a render and the call that
            // follows it, and a step must not depend on it, or a later append could take back
            // what a render sent.
            let upto = timeline.result_end[c];
            let remaining = if policy.provider_edits {
                // Said as the provider's edit, the client's own breakpoints stand, at the end
                // of the conversation: the provider's cache holds nothing between them and the
                // system prompt, so the whole conversation is written again, every result
                // before the boundary as its placeholder.
                let cleared = usize::try_from(units_before[target]).unwrap_or(usize::MAX);
                timeline.written_before[upto].saturating_sub(cleared)
            } else {
                let from = timeline.opening[target].max(timeline.result_end[target]);
                timeline.written_before[upto].saturating_sub(timeline.written_before[from])
            };
            let Some(calls) = payback(policy.prices, remaining, saving, expired_share) else {
                continue;
            };
            if calls.saturating_mul(policy.payback_odds.max(1)) <= point.calls
                && waste >= rewrite_cost(policy.prices, remaining, saving)
            {
                taken = Steps {
                    boundary: target,
                    step: step.max(c),
                    trigger: Some(Trigger::Count),
                    payback_calls: Some(u32::try_from(calls).unwrap_or(u32::MAX)),
                };
            }
        }
        taken
    }

    /// What clearing each result saves on every later call, in characters: the result at the
    /// recent cap beyond its placeholder (nothing for one no step may touch), and the assistant
    /// text a step passing it decides beyond its cut. It depends on nothing a render changes
    /// but by making it smaller (a cut result is shorter, a cleared one is its placeholder and
    /// saves nothing), so a render rendered again takes no step the first did not.
    fn clearable_chars(&self, policy: &Policy, texts: &[usize]) -> Vec<usize> {
        let placeholder = [placeholder_chars(false), placeholder_chars(true)];
        (0..self.results.len())
            .map(|k| {
                let m = &self.messages[self.results[k]];
                let visible = self.hidden[k].is_none();
                // One no step may touch, or one its placeholder would not make smaller (as
                // `reduce` weighs it). One the model has not read yet counts: it is among the
                // newest, which a step keeps, and what is unseen is a matter of when the render
                // is made (the gateway holds it back to its last step), not of what it saves.
                let result = if visible
                    && (m.pinned
                        || self.placeholder_tokens(m) >= self.counts[self.results[k]].total())
                {
                    0
                } else {
                    let is_error = self.hidden[k].unwrap_or(m.is_error);
                    self.chars[k]
                        .min(policy.recent_tool_result_chars)
                        .saturating_sub(placeholder[usize::from(is_error)])
                };
                result + texts[k + 1].saturating_sub(texts[k])
            })
            .collect()
    }

    /// Tokens of `message` cleared to its placeholder.
    fn placeholder_tokens(&self, message: &crate::render::Message) -> Tokens {
        let name = message.name.as_deref().map_or(0, |n| self.counter.count(n));
        crate::tokens::MESSAGE_OVERHEAD
            .saturating_add(self.counter.count(&cleared_placeholder(message)))
            .saturating_add(name)
    }

    /// For each result `k`, the characters a step would cut from the assistant texts before
    /// the assistant message that opened `k`'s group, and last those of all texts: what
    /// `saving` counts between two steps, summed once per render. In the path's own order,
    /// what a summary hides counted where it stood, so a summary over some of them changes no
    /// step before it.
    fn text_savings(&self, policy: &Policy) -> Vec<usize> {
        let cut = |chars: usize| text_cut(policy, chars);
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
                _ if m.observation => before.push(opening),
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
        // Idle as the stepped policy is: the cache expired since the last call (Timeline).
        let idle = Timeline::of(self).points.last().is_some_and(|p| p.cold);
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
        } else if idle {
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

/// What a step cuts of an assistant text of `chars` characters: a text within a marker's
/// length of the cap is not cut, and one cut before saves nothing again.
pub(super) fn text_cut(policy: &Policy, chars: usize) -> usize {
    if policy.provider_edits {
        // The provider's edit cuts no text.
        return 0;
    }
    chars
        .min(policy.recent_assistant_text_chars)
        .saturating_sub(policy.max_assistant_text_chars.saturating_add(MARKER_SLACK))
}

/// The steps a path's calls took: results before `boundary` are cleared; `step` results had
/// arrived at the last one.
#[derive(Debug, Default)]
struct Steps {
    boundary: usize,
    step: usize,
    trigger: Option<Trigger>,
    payback_calls: Option<u32>,
}

/// Four characters a token: the steps estimate in characters so that they depend on nothing
/// but the path.
fn tokens(chars: usize) -> Tokens {
    Tokens::try_from(chars / 4).unwrap_or(Tokens::MAX)
}

/// Unexpired gaps a session's share of expired ones is weighed against before it has many of
/// its own: on a clock drawn from real sessions' gaps (TraceLab: a fifth of human turns come
/// after the cache expired), a short sub-agent whose first gap was long stepped on that one
/// expiry as if every gap would expire, and cost more than sending everything (with ten, a
/// 10-call one still did: bench/ECONOMY.md).
const EXPIRY_PRIOR_GAPS: usize = 30;

/// How much longer than its payback a session must have run for a step, by default: a session
/// that has run `a` calls runs at least `r` more with probability `a / (a + r)` (the Lindy
/// prior of remaining lifetimes), so a payback of at most an eighth of its age pays with odds
/// of 8:1. Short sessions, sub-agents most, end before a step is earned back; measured on the
/// shared traces, 4:1 still let a sub-agent cost more than sending everything.
pub const PAYBACK_ODDS: usize = 8;
