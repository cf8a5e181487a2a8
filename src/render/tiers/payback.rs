//! What a step weighs: its payback at the policy's cache prices, and the path's calls in order
//! (`Timeline`), with what each call had to clear and how much a step there would write anew.

use super::Fit;
use super::fold::text_cut;
use crate::domain::{CachePrices, Part};
use crate::render::MessageRole;

/// What a step costs over not stepping at the call it is taken: the `remaining` characters it
/// leaves after its change written, instead of those and the `saving` read, at `prices`.
pub(super) fn rewrite_cost(prices: CachePrices, remaining: usize, saving: usize) -> f64 {
    prices.write() * remaining as f64 - prices.read() * (remaining + saving) as f64
}

/// The later calls a step must serve to pay for itself: it writes the `remaining` characters
/// after its change at the write price instead of reading them and the `saving` at the read
/// price; every later call then reads `saving` fewer characters, at the read price, or at the
/// write price when the cache has expired (`expired_share` of the calls so far). `None`: it
/// never pays. The cheaper a model's reads, the longer a step takes to pay back: at 0.05x a
/// step earns back half as fast as at 0.1x, and costs a little more to take.
pub(super) fn payback(
    prices: CachePrices,
    remaining: usize,
    saving: usize,
    expired_share: f64,
) -> Option<usize> {
    if saving == 0 {
        return None;
    }
    let rewrite = rewrite_cost(prices, remaining, saving);
    if rewrite <= 0.0 {
        return Some(0);
    }
    let (read, write) = (prices.read(), prices.write());
    let per_call = saving as f64 * (read + (write - read) * expired_share);
    if per_call <= 0.0 {
        return None;
    }
    Some((rewrite / per_call).ceil() as usize)
}

/// The path's calls in order, with what the steps weigh at each: a flat walk over the visible
/// messages and what summaries hide, in the order the results are counted.
pub(super) struct Timeline {
    /// Each call (an assistant message), and last the call this render is for.
    pub(super) points: Vec<Point>,
    /// Characters of the entries before entry `t` as a step rewrites them: each result at what
    /// it keeps until a step, an assistant text at what arrival keeps of it, and every user's or
    /// system message whole (no step reduces those, and a step writes them again all the same).
    pub(super) written_before: Vec<usize>,
    /// The entry of the assistant message that opened result `k`'s group.
    pub(super) opening: Vec<usize>,
    /// The entries up to and including result `c - 1` (the `c`-th).
    pub(super) result_end: Vec<usize>,
}

/// One call: the results before it, the calls before it, and whether the cache had expired
/// when it was made.
pub(super) struct Point {
    pub(super) results: usize,
    pub(super) calls: usize,
    pub(super) cold: bool,
}

impl Timeline {
    pub(super) fn of(fit: &Fit<'_>) -> Self {
        let policy = &fit.policy;
        let mut written_before = vec![0usize];
        let mut opening = Vec::with_capacity(fit.results.len());
        let mut result_end = vec![0];
        let mut points = Vec::new();
        let (mut results, mut calls, mut open) = (0usize, 0usize, 0usize);
        // The time of the newest entry so far (a call is made once its input is in), and of
        // the last call.
        let (mut latest, mut last_call): (Option<i64>, Option<i64>) = (None, None);
        let mut entry = |size: usize, written: usize, at_ms: Option<i64>, kind: Kind| {
            let t = written_before.len() - 1;
            written_before.push(written_before[t] + written.max(size));
            if kind == Kind::Call {
                let cold = matches!((latest, last_call), (Some(now), Some(before))
                    if now.saturating_sub(before) >= policy.idle_ms);
                points.push(Point {
                    results,
                    calls,
                    cold,
                });
                calls += 1;
                open = t;
                last_call = latest.or(last_call);
            }
            if kind == Kind::Result {
                results += 1;
                opening.push(open);
                result_end.push(t + 1);
            }
            if let Some(at) = at_ms {
                latest = Some(latest.map_or(at, |l| l.max(at)));
            }
        };
        // A result counts at most the standard cap, to which a render over budget cuts every
        // result: so that cut, seen again, weighs a step as the result it was.
        let result_size = |chars: usize| {
            chars
                .min(policy.recent_tool_result_chars)
                .min(policy.max_tool_result_chars)
        };
        // A text counts what a step would cut of it, as the saving counts it: what a render
        // leaves of a cut text then counts for nothing on either side, and a render rendered
        // again weighs its steps as the first did.
        let text_size = |chars: usize| text_cut(policy, chars);
        // What an entry weighs: its size as a step counts it, what a step writes again of it
        // beyond that (a user's or system message whole, which no step reduces; said as the
        // provider's edit, an assistant message whole with its calls, for that edit reduces
        // none), and its kind. A message a summary hides weighs as it would shown, so a summary
        // over a segment changes no step before it or after it.
        let weigh = |shape: Shape, chars: usize, arguments: usize| match shape {
            Shape::Result => (result_size(chars), 0, Kind::Result),
            Shape::Assistant if policy.provider_edits => {
                (text_size(chars), chars + arguments, Kind::Call)
            }
            Shape::Assistant => (text_size(chars), 0, Kind::Call),
            Shape::Whole => (0, chars, Kind::Other),
            Shape::Summary => (0, 0, Kind::Other),
        };
        for m in &fit.messages {
            // A pin a summary shows again counts where the summary hid it.
            if m.pinned_under.is_some() {
                continue;
            }
            for h in &m.hidden {
                let (shape, chars, arguments) = match (h.result, h.assistant) {
                    (Some((chars, _)), _) => (Shape::Result, chars, 0),
                    (None, Some((chars, _))) => (Shape::Assistant, chars, h.kept),
                    (None, None) => (Shape::Whole, h.kept, 0),
                };
                let (size, written, kind) = weigh(shape, chars, arguments);
                entry(size, written, h.at_ms, kind);
            }
            // A render rendered again (its stubs shorter) takes no step the first did not:
            // only a result's and an assistant text's characters count, and a call's arguments
            // only as the provider's edit, which stubs none.
            let shape = match m.role {
                _ if m.summary_id.is_some() => Shape::Summary,
                MessageRole::Tool => Shape::Result,
                _ if m.observation => Shape::Result,
                MessageRole::Assistant => Shape::Assistant,
                MessageRole::User | MessageRole::System | MessageRole::Developer => Shape::Whole,
            };
            let arguments = match policy.provider_edits {
                true => m.tool_calls.iter().map(|c| c.arguments_json.len()).sum(),
                false => 0,
            };
            let (size, written, kind) = weigh(shape, Part::text_chars(&m.parts), arguments);
            entry(size, written, m.at_ms, kind);
        }
        // The call this render is for: made now, after the one the caller says it made last.
        let before = fit.last_call_ms.or(last_call);
        let t = written_before.len() - 1;
        points.push(Point {
            results,
            calls,
            cold: calls > 0
                && before.is_some_and(|b| fit.now_ms.saturating_sub(b) >= policy.idle_ms),
        });
        debug_assert_eq!(opening.len(), fit.results.len(), "one opening per result");
        opening.push(t);
        Self {
            points,
            written_before,
            opening,
            result_end,
        }
    }
}

/// How a step treats an entry of the timeline.
#[derive(Clone, Copy)]
enum Shape {
    Result,
    Assistant,
    /// A user's or system message: never reduced.
    Whole,
    Summary,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Call,
    Result,
    Other,
}
