//! The report, after the last step: what each step did to the messages the render keeps, and
//! whether they fit.

use super::Fit;
use crate::domain::Part;
use crate::render::message_breakdown;
use crate::render::{Breakdown, Message, MessageRole, Reduction, Rendered, Report};
use crate::tokens::Count;

impl Fit<'_> {
    /// The messages snip left (`dropped` are not), and the report of them; `stable_from` is the
    /// first message the next step may change.
    pub(super) fn report(
        self,
        dropped: &[bool],
        stable_from: usize,
        mut report: Report,
    ) -> Rendered {
        let Fit {
            messages,
            original,
            counts,
            stub_chars,
            text_saved,
            chars,
            result_of,
            limit,
            ..
        } = self;
        let len = messages.len();
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
                Reduction::Truncated { cut_chars, .. }
                    if message.role == MessageRole::Assistant =>
                {
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
            count_kept(&mut report, &message, &count);
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
}

/// No budget: everything, untouched.
pub(super) fn unbudgeted(
    messages: Vec<Message>,
    counter: &dyn Count,
    mut report: Report,
) -> Rendered {
    let counts: Vec<Breakdown> = messages
        .iter()
        .map(|m| message_breakdown(m, counter))
        .collect();
    for (message, count) in messages.iter().zip(&counts) {
        count_kept(&mut report, message, count);
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

/// Counts a message the render keeps: its tokens by category, and among the pins' when pinned.
fn count_kept(report: &mut Report, message: &Message, count: &Breakdown) {
    // A call message shown again for a pinned result costs what the pin does.
    if message.pinned || message.pinned_under.is_some() {
        report.pinned_tokens = report.pinned_tokens.saturating_add(count.total());
    }
    if message.pinned {
        report.pinned.extend(&message.node_ids);
    }
    report.breakdown.add(count);
}
