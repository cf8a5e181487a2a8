//! The budget steps after visibility: reduction, microcompact, snip, and the report. This
//! module holds what the steps share: one render's state (`Fit`) and what a cut or cleared
//! message looks like; each step is a module of its own.

mod fold;
mod payback;
mod reduce;
mod report;
mod snip;

use super::{Breakdown, Message, Microcompact, Options, Policy, Reduction, Rendered, Report};
use super::{MessageRole, message_breakdown};
use crate::domain::{Part, PathView};
use crate::tokens::{Count, Tokens};
use snip::Layout;

pub use fold::PAYBACK_ODDS;
pub use snip::turn_starts;

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

fn sum(counts: &[Breakdown], keep: impl Fn(usize) -> bool) -> Tokens {
    counts
        .iter()
        .enumerate()
        .filter(|(i, _)| keep(*i))
        .fold(0, |s: Tokens, (_, b)| s.saturating_add(b.total()))
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
    /// The render's policy and history budget.
    policy: Policy,
    limit: Tokens,
    /// The request's time, and when the caller says it last called the model.
    now_ms: i64,
    last_call_ms: Option<i64>,
    /// What the model has not read alone exceeds the history's budget.
    unseen_over: bool,
    counter: &'a dyn Count,
}

impl<'a> Fit<'a> {
    fn new(
        messages: Vec<Message>,
        path: &PathView,
        options: &Options,
        limit: Tokens,
        counter: &'a dyn Count,
    ) -> Self {
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
            if (m.role == MessageRole::Tool || m.observation) && m.pinned_under.is_none() {
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
        let unseen_over = sum(&counts, |i| messages[i].unseen) > limit;
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
            policy: options.policy,
            limit,
            unseen_over,
            now_ms: options.now_ms,
            last_call_ms: options.last_call_ms,
            counter,
        }
    }

    fn total(&self) -> Tokens {
        sum(&self.counts, |_| true)
    }

    /// Where the retained turns start, and whether they fit the budget with the preamble.
    fn retained(&self) -> (usize, bool) {
        let len = self.messages.len();
        let retained = self.layout.newest_turns_start(self.policy.retain_turns);
        let preamble = self.layout.preamble(len);
        let fits = sum(&self.counts, |i| i < preamble || i >= retained) <= self.limit;
        (retained, fits)
    }
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
        return report::unbudgeted(messages, counter, report);
    };
    report.history_budget = Some(limit);
    let mut fit = Fit::new(messages, path, options, limit, counter);
    let stable_from = match options.policy.microcompact {
        Microcompact::Stepped => fit.stepped(&mut report),
        Microcompact::OverBudget => fit.over_budget(&mut report),
    };
    let dropped = fit.snip(&mut report);
    // Whatever is left renders; the report says whether it fits. The next snip may change
    // everything after the preamble.
    let stable_from = if report.turns_snipped > 0 {
        fit.layout.preamble(fit.messages.len())
    } else {
        stable_from
    };
    fit.report(&dropped, stable_from, report)
}
