//! The budget steps after visibility: reduction, microcompact, snip, and the report.

use std::collections::HashSet;

use super::{
    Breakdown, Message, MessageRole, Options, Reduction, Rendered, Report, Trigger,
    message_breakdown,
};
use crate::domain::{NodeId, Part, PathView};
use crate::tokens::{Count, Tokens};

/// The line that replaces what budget reduction cut from a tool result.
pub fn truncation_marker(cut_chars: usize, of_chars: usize) -> String {
    format!("\n[… {cut_chars} of {of_chars} characters cut …]\n")
}

/// The one line left of a cleared tool result: enough for the model to know what it called.
pub fn cleared_placeholder(message: &Message) -> String {
    format!(
        "[tool result cleared to save context: {} call {}{}]",
        message.name.as_deref().unwrap_or("tool"),
        message.tool_call_id.as_deref().unwrap_or("?"),
        if message.is_error {
            ", was an error"
        } else {
            ""
        }
    )
}

/// Keeps the first 60% and last 40% of `cap` characters of a long tool result.
fn truncate(message: &mut Message, cap: usize) -> bool {
    let of_chars: usize = message
        .parts
        .iter()
        .map(|p| match p {
            Part::Text(t) => t.chars().count(),
            Part::Media { .. } => 0,
        })
        .sum();
    if of_chars <= cap {
        return false;
    }
    // Multi-part text is joined first, so the cut is taken over the result as a whole.
    let text: String = message
        .parts
        .iter()
        .filter_map(|p| match p {
            Part::Text(t) => Some(t.as_str()),
            Part::Media { .. } => None,
        })
        .collect::<Vec<_>>()
        .join("\n");
    let of_chars = text.chars().count();
    let head_chars = cap * 6 / 10;
    let tail_chars = cap - head_chars;
    let cut_chars = of_chars - head_chars - tail_chars;
    let head: String = text.chars().take(head_chars).collect();
    let tail: String = text.chars().skip(of_chars - tail_chars).collect();
    let reduced = format!("{head}{}{tail}", truncation_marker(cut_chars, of_chars));
    let first_text = message
        .parts
        .iter()
        .position(|p| matches!(p, Part::Text(_)))
        .unwrap_or(0);
    message.parts.retain(|p| matches!(p, Part::Media { .. }));
    message
        .parts
        .insert(first_text.min(message.parts.len()), Part::Text(reduced));
    message.reduction = Reduction::Truncated {
        cut_chars,
        of_chars,
    };
    true
}

fn clear(message: &mut Message) {
    message.parts = vec![Part::Text(cleared_placeholder(message))];
    message.reduction = Reduction::Cleared;
}

/// Where the turns of rendered messages start. Turns are top-level: a function's prompt belongs
/// to its caller's turn. A summary stands with the preamble: it is what old turns became.
pub fn turn_starts(messages: &[Message]) -> Vec<usize> {
    messages
        .iter()
        .enumerate()
        .filter(|(_, m)| {
            m.role == MessageRole::User && m.summary_id.is_none() && m.function_id.is_none()
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

/// Applies the budget steps to visible messages and writes the report.
pub(super) fn fit(
    mut messages: Vec<Message>,
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
    let limit = options.budget.and_then(|b| b.history().ok());
    report.history_budget = limit;
    let policy = &options.policy;
    let results: Vec<usize> = (0..messages.len())
        .filter(|i| messages[*i].role == MessageRole::Tool)
        .collect();

    if let Some(limit) = limit {
        // 3. Budget reduction, always; a cut that would not save tokens (the marker costs some)
        // is not made, so no step ever grows the context.
        let mut counts: Vec<Breakdown> = messages
            .iter()
            .map(|m| message_breakdown(m, counter))
            .collect();
        for &i in &results {
            let original = messages[i].clone();
            if truncate(&mut messages[i], policy.max_tool_result_chars) {
                let reduced = message_breakdown(&messages[i], counter);
                if reduced.total() < counts[i].total() {
                    counts[i] = reduced;
                } else {
                    messages[i] = original;
                }
            }
        }
        let layout = Layout::of(&messages, path);
        let len = messages.len();
        let newest_turn = layout.newest_turns_start(1);
        let retained = layout.newest_turns_start(policy.retain_turns);
        let preamble = layout.preamble(len);
        // The newest turns are kept whole when they fit with what is never dropped.
        let retained_fit = sum(&counts, |i| i < preamble || i >= retained) <= limit;
        let protect_from = if retained_fit && !policy.reactive {
            retained
        } else {
            newest_turn
        };

        // 4. Microcompact, when over budget (or told the provider refused).
        let over = sum(&counts, |_| true) > limit;
        let n = results.len();
        let idle = path.nodes.last().is_some_and(|head| {
            options.now_ms.saturating_sub(head.created_at_ms) >= policy.idle_ms
        });
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
            Some(Trigger::Count) => {
                let every = policy.microcompact_every.max(1);
                let step =
                    policy.microcompact_first + (n - policy.microcompact_first) / every * every;
                step.saturating_sub(policy.microcompact_keep)
            }
        };
        report.microcompact_boundary = boundary;
        // The newest turns are kept verbatim, but a running function's own results age like
        // any others: a sub-agent's long chain must not be frozen.
        let decided = |i: usize| i < protect_from || layout.running[i];
        for &i in results[..boundary].iter().filter(|&&i| decided(i)) {
            let original = std::mem::take(&mut messages[i].parts);
            let reduction = messages[i].reduction;
            clear(&mut messages[i]);
            let cleared = message_breakdown(&messages[i], counter);
            // A result shorter than its placeholder stays as it is.
            if cleared.total() < counts[i].total() {
                counts[i] = cleared;
            } else {
                messages[i].parts = original;
                messages[i].reduction = reduction;
            }
        }

        // 5. Snip: whole oldest turns, never the newest, never a running function's content,
        // and the retained ones only when they cannot fit anyway.
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
                if range.clone().any(|i| layout.running[i]) {
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

        // 6. Whatever is left renders; the report says whether it fits.
        // The next microcompact step can change only results it has not decided yet; the next
        // snip, everything after the preamble.
        let stable_from = if report.turns_snipped > 0 {
            Some(preamble)
        } else {
            results
                .iter()
                .enumerate()
                .find(|&(k, &i)| k >= boundary || !decided(i))
                .map(|(_, &i)| i)
        };
        // With more than two retained turns, a later append can bring older turns back under
        // protection (the newest ones fit again) and restore their results: they are not stable.
        let stable_from = if policy.retain_turns > 2 && !policy.reactive {
            let regained = layout.newest_turns_start(policy.retain_turns - 1);
            Some(stable_from.map_or(regained, |s| s.min(regained)))
        } else {
            stable_from
        };
        report.stable_prefix_messages = stable_from.map_or(len, |end| {
            (0..end.min(len)).filter(|&i| !dropped[i]).count()
        });
        let mut kept = Vec::with_capacity(len);
        let mut tokens = Vec::with_capacity(len);
        for ((message, count), dropped) in messages.into_iter().zip(counts).zip(dropped) {
            if !dropped {
                // Counted from what is kept: a result cut, then cleared or snipped, is reported
                // once, as what finally happened to it.
                match message.reduction {
                    Reduction::Truncated { .. } => {
                        report.truncated.extend(&message.node_ids);
                        report.results_truncated += 1;
                    }
                    Reduction::Cleared => {
                        report.cleared.extend(&message.node_ids);
                        report.results_cleared += 1;
                    }
                    Reduction::None => {}
                }
                report.breakdown.add(&count);
                tokens.push(count.total());
                kept.push(message);
            }
        }
        report.total_tokens = report.breakdown.total();
        report.fits = report.total_tokens <= limit;
        report.over_by = report.total_tokens.saturating_sub(limit);
        report.summary_needed = !report.fits;
        report.messages = kept.len();
        return Rendered {
            messages: kept,
            tokens,
            report,
        };
    }

    // No budget: everything, untouched.
    let counts: Vec<Breakdown> = messages
        .iter()
        .map(|m| message_breakdown(m, counter))
        .collect();
    for count in &counts {
        report.breakdown.add(count);
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
