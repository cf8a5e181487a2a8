//! The budget steps after visibility: reduction, microcompact, snip, and the report.

use std::collections::HashSet;

use super::stub::stub_arguments;
use super::{
    Breakdown, Message, MessageRole, Microcompact, Options, Policy, Reduction, Rendered, Report,
    Trigger, message_breakdown,
};
use crate::domain::{NodeId, Part, PathView};
use crate::tokens::{Count, Tokens};

/// The line that replaces what a cut took out of a message, naming the reference `Recall`
/// gives the whole back by.
pub fn truncation_marker(cut_chars: usize, of_chars: usize, reference: Option<&str>) -> String {
    match reference {
        Some(r) => format!("\n[… {cut_chars} of {of_chars} characters cut: recall {r} …]\n"),
        None => format!("\n[… {cut_chars} of {of_chars} characters cut …]\n"),
    }
}

/// What is left of a cleared tool result. The tool message still carries the call id and the
/// tool's name, and the call stays in the assistant message before it, so the line says only
/// why the content is gone and how to get it back: every token of it is paid on every later
/// request.
pub fn cleared_placeholder(message: &Message) -> String {
    placeholder(
        message.is_error,
        message.recall.map(|h| h.reference()).as_deref(),
    )
}

fn placeholder(is_error: bool, reference: Option<&str>) -> String {
    let what = if is_error {
        "error cleared to save context"
    } else {
        "cleared to save context"
    };
    match reference {
        Some(r) => format!("[{what}: recall {r}]"),
        None => format!("[{what}]"),
    }
}

/// The characters of a placeholder with a reference, which `saving` counts as what a cleared
/// result still costs.
fn placeholder_chars(is_error: bool) -> usize {
    placeholder(is_error, Some(&"0".repeat(crate::domain::REFERENCE_CHARS)))
        .chars()
        .count()
}

/// Longer than any truncation marker.
const MARKER_SLACK: usize = 96;

/// How a cut keeps `cap` characters: a tool result (and recent assistant text) its first 60%
/// and last 40%; old assistant text its head, where the reasoning says what it set out to do.
#[derive(Clone, Copy)]
enum Keep {
    HeadAndTail,
    Head,
}

/// A long message cut to `cap` characters as `keep` says, with a marker of what was cut: its
/// new parts and reduction, or `None` when it is within a marker's length of the cap (the cut
/// would save nothing). A message cut before is cut again from what it kept: for a smaller cap
/// that is the same head and tail of what it was, and the marker still counts against the
/// original, so cutting in two steps is cutting once, and rendering a render changes nothing.
fn truncated(message: &Message, cap: usize, keep: Keep) -> Option<(Vec<Part>, Reduction)> {
    if Part::text_chars(&message.parts) <= cap.saturating_add(MARKER_SLACK) {
        return None;
    }
    // Multi-part text is joined first, so the cut is taken over the result as a whole.
    let text = Part::text_of(&message.parts);
    let chars = text.chars().count();
    let of_chars = match message.reduction {
        Reduction::Truncated { of_chars, .. } => of_chars,
        Reduction::None | Reduction::Cleared => chars,
    };
    let head_chars = match keep {
        Keep::HeadAndTail => cap * 6 / 10,
        Keep::Head => cap,
    };
    let tail_chars = cap - head_chars;
    let cut_chars = of_chars - head_chars - tail_chars;
    let head: String = text.chars().take(head_chars).collect();
    let tail: String = text.chars().skip(chars - tail_chars).collect();
    let reference = message.recall.map(|h| h.reference());
    let reduced = format!(
        "{head}{}{tail}",
        truncation_marker(cut_chars, of_chars, reference.as_deref())
    );
    let first_text = message
        .parts
        .iter()
        .position(|p| matches!(p, Part::Text(_)))
        .unwrap_or(0);
    let mut parts: Vec<Part> = message
        .parts
        .iter()
        .filter(|p| !matches!(p, Part::Text(_)))
        .cloned()
        .collect();
    parts.insert(first_text.min(parts.len()), Part::Text(reduced));
    Some((
        parts,
        Reduction::Truncated {
            cut_chars,
            of_chars,
        },
    ))
}

/// Where the turns of rendered messages start. Turns are top-level: a function's prompt belongs
/// to its caller's turn. A summary, and the pins it shows again, stand where the turns they
/// replace stood: at the front, a rolling summary stands with the preamble.
pub fn turn_starts(messages: &[Message]) -> Vec<usize> {
    messages
        .iter()
        .enumerate()
        .filter(|(_, m)| {
            m.role == MessageRole::User
                && m.summary_id.is_none()
                && m.pinned_under.is_none()
                && m.function_id.is_none()
        })
        .map(|(i, _)| i)
        .collect()
}

/// Where turns start, and which messages belong to a running function.
struct Layout {
    /// Indexes of the user messages that open turns, in order.
    turn_starts: Vec<usize>,
    /// Messages of a function still running on this path: never snipped.
    running: Vec<bool>,
}

impl Layout {
    fn of(messages: &[Message], path: &PathView) -> Self {
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
    fn preamble(&self, len: usize) -> usize {
        self.turn_starts.first().copied().unwrap_or(len)
    }

    /// The message range of turn `t`.
    fn turn(&self, t: usize, len: usize) -> std::ops::Range<usize> {
        self.turn_starts[t]..self.turn_starts.get(t + 1).copied().unwrap_or(len)
    }

    /// Where the newest `n` turns start (`0` when the path has no turn).
    fn newest_turns_start(&self, n: usize) -> usize {
        let n = n.max(1);
        match self.turn_starts.len() {
            0 => 0,
            len => self.turn_starts[len.saturating_sub(n)],
        }
    }
}

fn sum(counts: &[Breakdown], keep: impl Fn(usize) -> bool) -> Tokens {
    counts
        .iter()
        .enumerate()
        .filter(|(i, _)| keep(*i))
        .fold(0, |s: Tokens, (_, b)| s.saturating_add(b.total()))
}

/// Whether the newest node is older than `idle_ms` at the request's time.
fn idle_now(path: &PathView, options: &Options) -> bool {
    path.nodes.last().is_some_and(|head| {
        options.now_ms.saturating_sub(head.created_at_ms) >= options.policy.idle_ms
    })
}

/// One render's budget steps: the messages, what they cost as they came and as they are now.
struct Fit<'a> {
    messages: Vec<Message>,
    /// Tokens of each message as it came, and as it is now.
    original: Vec<Tokens>,
    counts: Vec<Breakdown>,
    /// Indexes of the tool messages, in order; "result k" is `messages[results[k]]`. A result
    /// a summary covers counts where its summary stands (`hidden[k]` holds the error flag of
    /// one it hides), so the steps fold over the same results whether or not a segment is
    /// summarized.
    results: Vec<usize>,
    hidden: Vec<Option<bool>>,
    /// The result a tool message is, by message index.
    result_of: Vec<Option<usize>>,
    /// Characters of result k as it came.
    chars: Vec<usize>,
    /// Where result k's call is: (message index, index in its `tool_calls`).
    calls: Vec<Option<(usize, usize)>>,
    /// Characters each message's stubs removed from its tool-call arguments.
    stub_chars: Vec<usize>,
    /// Tokens a cut of each assistant message's text saved.
    text_saved: Vec<Tokens>,
    layout: Layout,
    counter: &'a dyn Count,
}

impl<'a> Fit<'a> {
    fn new(messages: Vec<Message>, path: &PathView, counter: &'a dyn Count) -> Self {
        let counts: Vec<Breakdown> = messages
            .iter()
            .map(|m| message_breakdown(m, counter))
            .collect();
        let (mut results, mut hidden, mut chars) = (Vec::new(), Vec::new(), Vec::new());
        for (i, m) in messages.iter().enumerate() {
            // What a summary covers counts where the summary stands, in its order: hidden
            // results as placeholders, pins it shows again (just before it) as themselves.
            let before = (0..i)
                .rev()
                .take_while(|&j| m.summary_id.is_some() && messages[j].pinned_under == m.summary_id)
                .count();
            let mut reshown = (i - before..i).filter(|&j| messages[j].role == MessageRole::Tool);
            for h in &m.hidden {
                let Some((c, is_error)) = h.result else {
                    continue;
                };
                let shown_again = if h.reshown { reshown.next() } else { None };
                match shown_again {
                    Some(j) => {
                        results.push(j);
                        hidden.push(None);
                        chars.push(Part::text_chars(&messages[j].parts));
                    }
                    None => {
                        results.push(i);
                        hidden.push(Some(is_error));
                        chars.push(c);
                    }
                }
            }
            if m.role == MessageRole::Tool && m.pinned_under.is_none() {
                results.push(i);
                hidden.push(None);
                chars.push(Part::text_chars(&m.parts));
            }
        }
        let mut result_of = vec![None; messages.len()];
        for (k, &i) in results.iter().enumerate() {
            if hidden[k].is_none() {
                result_of[i] = Some(k);
            }
        }
        // A result's call is in the assistant message that opens its group of results.
        let calls = results
            .iter()
            .zip(&hidden)
            .map(|(&i, hidden)| {
                if hidden.is_some() {
                    return None;
                }
                let at = (0..i)
                    .rev()
                    .find(|&j| messages[j].role != MessageRole::Tool)?;
                let id = messages[i].tool_call_id.as_deref()?;
                let c = messages[at]
                    .tool_calls
                    .iter()
                    .position(|c| c.call_id == id)?;
                Some((at, c))
            })
            .collect();
        Self {
            layout: Layout::of(&messages, path),
            stub_chars: vec![0; messages.len()],
            text_saved: vec![0; messages.len()],
            original: counts.iter().map(Breakdown::total).collect(),
            counts,
            results,
            hidden,
            result_of,
            chars,
            calls,
            messages,
            counter,
        }
    }

    fn total(&self) -> Tokens {
        sum(&self.counts, |_| true)
    }

    /// Puts `parts`, reduced as `reduction`, in message `i` when that costs fewer tokens: no
    /// step ever grows the context (a marker costs some).
    fn reduce(&mut self, i: usize, parts: Vec<Part>, reduction: Reduction) {
        let message = &mut self.messages[i];
        let was = std::mem::replace(&mut message.parts, parts);
        let was_reduced = std::mem::replace(&mut message.reduction, reduction);
        let reduced = message_breakdown(message, self.counter);
        if reduced.total() < self.counts[i].total() {
            self.counts[i] = reduced;
        } else {
            message.parts = was;
            message.reduction = was_reduced;
        }
    }

    /// Result `k` is hidden by a summary, pinned, or not yet read by the model: no step
    /// changes it.
    fn untouchable(&self, k: usize) -> bool {
        let m = &self.messages[self.results[k]];
        self.hidden[k].is_some() || m.pinned || m.unseen
    }

    /// Cuts result `k` to `cap` characters of what it was.
    fn cap(&mut self, k: usize, cap: usize) {
        let i = self.results[k];
        if self.untouchable(k) || self.messages[i].reduction == Reduction::Cleared {
            return;
        }
        if let Some((parts, reduction)) = truncated(&self.messages[i], cap, Keep::HeadAndTail) {
            self.reduce(i, parts, reduction);
        }
    }

    /// Cuts the text of assistant message `i` to `cap` characters as `keep` says; a pinned one
    /// never.
    fn cut_text(&mut self, i: usize, cap: usize, keep: Keep) {
        let message = &self.messages[i];
        if message.role != MessageRole::Assistant
            || message.pinned
            || message.unseen
            || message.pinned_under.is_some()
            || cap == usize::MAX
        {
            return;
        }
        if let Some((parts, reduction)) = truncated(message, cap, keep) {
            let before = self.counts[i].assistant_text;
            self.reduce(i, parts, reduction);
            self.text_saved[i] = before.saturating_sub(self.counts[i].assistant_text);
        }
    }

    /// Clears result `k`, unless it is shorter than its placeholder.
    fn clear(&mut self, k: usize) {
        let i = self.results[k];
        if self.untouchable(k) || self.messages[i].reduction == Reduction::Cleared {
            return;
        }
        let placeholder = vec![Part::Text(cleared_placeholder(&self.messages[i]))];
        self.reduce(i, placeholder, Reduction::Cleared);
    }

    /// Stubs the arguments of result `k`'s call when they are longer than `over` characters
    /// and the stub costs fewer tokens.
    fn stub(&mut self, k: usize, over: usize) {
        let Some((at, c)) = self.calls[k] else {
            return;
        };
        if self.messages[at].pinned || self.messages[at].unseen {
            return;
        }
        let args = &self.messages[at].tool_calls[c].arguments_json;
        let chars = args.chars().count();
        if chars <= over {
            return;
        }
        let reference = self.messages[at].recall.map(|h| h.reference());
        let Some(stub) = stub_arguments(args, reference.as_deref()) else {
            return;
        };
        let (before, after) = (self.counter.count(args), self.counter.count(&stub));
        if after >= before {
            return;
        }
        self.stub_chars[at] += chars - stub.chars().count();
        let message = &mut self.messages[at];
        message.tool_calls[c].arguments_json = stub;
        message.stubbed_inputs += 1;
        // A call's arguments count on their own (message_breakdown): the rest of the message
        // stands, and recounting it for every stub of a message would count it again and again.
        self.counts[at].tool_calls -= before - after;
    }

    /// The message from which result `k` (or its call) sits: what a step at `k` may change.
    fn first_message_of(&self, k: usize) -> usize {
        match self.calls.get(k) {
            Some(Some((at, _))) => *at,
            Some(None) => self.results[k],
            None => self.messages.len(),
        }
    }

    /// Stepped microcompact: steps by count and idle gaps, zones, then the over-budget fallback.
    /// Returns the first message the next step may change.
    fn stepped(
        &mut self,
        path: &PathView,
        options: &Options,
        limit: Tokens,
        report: &mut Report,
    ) -> usize {
        let policy = &options.policy;
        let n = self.results.len();
        let (boundary, step, trigger) = self.steps(path, options);
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
        if self.total() <= limit && !policy.reactive {
            return stable;
        }
        // Over budget: the standard cap for every result, then a step at the latest count.
        for k in step..n {
            self.cap(k, policy.max_tool_result_chars);
        }
        if self.total() <= limit && !policy.reactive {
            return stable;
        }
        let newest_turn = self.layout.newest_turns_start(1);
        let (forced, why) = if policy.reactive {
            (n, Some(Trigger::Reactive))
        } else {
            match count_step(policy, n) {
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
    fn steps(&self, path: &PathView, options: &Options) -> (usize, usize, Option<Trigger>) {
        let policy = &options.policy;
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
            if idle_now(path, options) {
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
    fn over_budget(
        &mut self,
        path: &PathView,
        options: &Options,
        limit: Tokens,
        report: &mut Report,
    ) -> usize {
        let policy = &options.policy;
        let n = self.results.len();
        let len = self.messages.len();
        for k in 0..n {
            self.cap(k, policy.max_tool_result_chars);
        }
        let retained = self.layout.newest_turns_start(policy.retain_turns);
        let preamble = self.layout.preamble(len);
        let retained_fit = sum(&self.counts, |i| i < preamble || i >= retained) <= limit;
        let protect_from = if retained_fit && !policy.reactive {
            retained
        } else {
            self.layout.newest_turns_start(1)
        };
        let over = self.total() > limit;
        let idle = idle_now(path, options);
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
            Some(Trigger::Count) => count_step(policy, n)
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

/// Applies the budget steps to visible messages and writes the report.
pub(super) fn fit(
    messages: Vec<Message>,
    path: &PathView,
    options: &Options,
    counter: &dyn Count,
) -> Rendered {
    let mut report = Report {
        tokenizer: counter.tokenizer(),
        budget: options.budget,
        fits: true,
        ..Report::default()
    };
    // A budget that leaves nothing is refused at the boundary; here it only means "no budget".
    let Some(limit) = options.budget.and_then(|b| b.history().ok()) else {
        return unbudgeted(messages, counter, report);
    };
    report.history_budget = Some(limit);
    let policy = &options.policy;
    let mut fit = Fit::new(messages, path, counter);
    let stable_from = match policy.microcompact {
        Microcompact::Stepped => fit.stepped(path, options, limit, &mut report),
        Microcompact::OverBudget => fit.over_budget(path, options, limit, &mut report),
    };

    // Snip: whole oldest turns, never the newest, never a running function's content, and the
    // retained ones only when they cannot fit anyway.
    let Fit {
        messages,
        original,
        counts,
        stub_chars,
        text_saved,
        layout,
        chars,
        result_of,
        ..
    } = fit;
    let len = messages.len();
    let retained = layout.newest_turns_start(policy.retain_turns);
    let preamble = layout.preamble(len);
    let retained_fit = sum(&counts, |i| i < preamble || i >= retained) <= limit;
    let mut dropped = vec![false; len];
    if policy.snip {
        let mut total = sum(&counts, |_| true);
        let turns = layout.turn_starts.len();
        for t in 0..turns.saturating_sub(1) {
            if total <= limit {
                break;
            }
            let range = layout.turn(t, len);
            if range.start >= retained && retained_fit {
                break;
            }
            if range
                .clone()
                .any(|i| layout.running[i] || messages[i].pinned || messages[i].unseen)
            {
                continue;
            }
            for i in range {
                dropped[i] = true;
                total = total.saturating_sub(counts[i].total());
                report.snipped.extend(&messages[i].node_ids);
            }
            report.turns_snipped += 1;
        }
    }

    // Whatever is left renders; the report says whether it fits. The next snip may change
    // everything after the preamble.
    let stable_from = if report.turns_snipped > 0 {
        preamble
    } else {
        stable_from
    };
    report.stable_prefix_messages = (0..stable_from.min(len)).filter(|&i| !dropped[i]).count();
    let mut kept = Vec::with_capacity(len);
    let mut tokens = Vec::with_capacity(len);
    for (i, (message, count)) in messages.into_iter().zip(counts).enumerate() {
        if dropped[i] {
            continue;
        }
        // Counted from what is kept: a result cut, then cleared or snipped, is reported once,
        // as what finally happened to it.
        let saved_tokens = original[i].saturating_sub(count.total());
        let saved_chars = || {
            result_of[i].map_or(0, |k| {
                chars[k].saturating_sub(Part::text_chars(&message.parts))
            })
        };
        match message.reduction {
            Reduction::Truncated { cut_chars, .. } if message.role == MessageRole::Assistant => {
                report.texts_cut.extend(&message.node_ids);
                report.saved_text_cut.add(1, cut_chars, text_saved[i]);
            }
            Reduction::Truncated { .. } => {
                report.truncated.extend(&message.node_ids);
                report.results_truncated += 1;
                report.saved_truncation.add(1, saved_chars(), saved_tokens);
            }
            Reduction::Cleared => {
                report.cleared.extend(&message.node_ids);
                report.results_cleared += 1;
                report.saved_clearing.add(1, saved_chars(), saved_tokens);
            }
            Reduction::None => {}
        }
        if message.stubbed_inputs > 0 {
            report.stubbed.extend(&message.node_ids);
            report.inputs_stubbed += message.stubbed_inputs;
            report.saved_stubbing.add(
                message.stubbed_inputs,
                stub_chars[i],
                saved_tokens.saturating_sub(text_saved[i]),
            );
        }
        // A call message shown again for a pinned result costs what the pin does.
        if message.pinned || message.pinned_under.is_some() {
            report.pinned_tokens = report.pinned_tokens.saturating_add(count.total());
        }
        if message.pinned {
            report.pinned.extend(&message.node_ids);
        }
        report.breakdown.add(&count);
        tokens.push(count.total());
        kept.push(message);
    }
    report.total_tokens = report.breakdown.total();
    report.pins_exceed_budget = report.pinned_tokens > limit;
    report.fits = report.total_tokens <= limit;
    report.over_by = report.total_tokens.saturating_sub(limit);
    report.summary_needed = !report.fits;
    report.messages = kept.len();
    Rendered {
        messages: kept,
        tokens,
        report,
    }
}

/// No budget: everything, untouched.
fn unbudgeted(messages: Vec<Message>, counter: &dyn Count, mut report: Report) -> Rendered {
    let counts: Vec<Breakdown> = messages
        .iter()
        .map(|m| message_breakdown(m, counter))
        .collect();
    for (message, count) in messages.iter().zip(&counts) {
        report.breakdown.add(count);
        if message.pinned || message.pinned_under.is_some() {
            report.pinned_tokens = report.pinned_tokens.saturating_add(count.total());
        }
        if message.pinned {
            report.pinned.extend(&message.node_ids);
        }
    }
    report.total_tokens = report.breakdown.total();
    report.messages = messages.len();
    report.stable_prefix_messages = messages.len();
    Rendered {
        tokens: counts.iter().map(Breakdown::total).collect(),
        messages,
        report,
    }
}
