//! The report's picture: a bar per category against the budget, the total and the free
//! space, the pinned nodes' share, and what each tier of the engine did.

use std::fmt::Write;

use super::bars::{WIDTH, bar, budget_line, total_bar};
use crate::cli::show::num;
use crate::proto::pb;

/// The picture for one report; `target` names what was measured (e.g. `session … branch main`).
pub fn picture(target: &str, r: &pb::ContextReport) -> String {
    let t = r.tokens.unwrap_or_default();
    let budget = r.budget.as_ref().map(|_| r.history_budget);
    let scale = budget.unwrap_or(0).max(r.total_tokens).max(1);
    let base = budget.filter(|b| *b > 0).unwrap_or(r.total_tokens).max(1);
    let row = |label: &str, bar: String, n: u32| {
        let pct = 100.0 * f64::from(n) / f64::from(base);
        format!("  {label:<15}{bar:<WIDTH$} {:>9} {pct:>5.1}%\n", num(n))
    };

    let mut out = format!(
        "{target}\n{} messages, {} tokens ({})\n",
        num(r.messages),
        num(r.total_tokens),
        r.tokenizer
    );
    match &r.budget {
        Some(b) => {
            let _ = writeln!(
                out,
                "window {} − output {} − system {} − tools {} − schema {} = history {}",
                num(b.context_window),
                num(b.output_reserve),
                num(b.system_tokens),
                num(b.tools_tokens),
                num(b.schema_tokens),
                num(r.history_budget)
            );
        }
        None => out.push_str("no budget: bars are shares of the total\n"),
    }
    out.push('\n');
    for (label, n) in [
        ("system", t.system),
        ("user", t.user),
        ("assistant text", t.assistant_text),
        ("tool calls", t.tool_calls),
        ("tool results", t.tool_results),
        ("summaries", t.summaries),
        ("markers", t.markers),
    ] {
        out.push_str(&row(label, bar(n, scale), n));
    }
    let _ = writeln!(out, "  {:<15}{}", "", "─".repeat(WIDTH));
    out.push_str(&row(
        "total",
        total_bar(r.total_tokens, budget, scale),
        r.total_tokens,
    ));
    if let Some(b) = budget {
        out.push_str(&row("budget", budget_line(b, scale), b));
        out.push_str(&row(
            "free",
            String::new(),
            b.saturating_sub(r.total_tokens),
        ));
        out.push('\n');
        if r.fits {
            out.push_str("fits\n");
        } else {
            let _ = write!(out, "OVER by {} tokens", num(r.over_by));
            out.push_str(if r.summary_needed {
                ": summary needed\n"
            } else {
                "\n"
            });
        }
    }
    out.push_str(&pins(r, budget, base));
    out.push('\n');
    out.push_str(&tiers(r, &t));
    out
}

/// The pinned messages' tokens, on a line of their own (nothing without pins), and a plain
/// warning when they alone exceed the history budget: no step may reduce them, so only
/// unpinning or a larger budget makes the context fit.
fn pins(r: &pb::ContextReport, budget: Option<u32>, base: u32) -> String {
    if r.pinned_node_ids.is_empty() && r.pinned_tokens == 0 {
        return String::new();
    }
    let nodes = r.pinned_node_ids.len();
    let share = 100.0 * f64::from(r.pinned_tokens) / f64::from(base);
    let of = if budget.is_some_and(|b| b > 0) {
        "of the budget"
    } else {
        "of the total"
    };
    let mut out = format!(
        "pinned: {} tokens in {nodes} {} ({share:.1}% {of}), never reduced\n",
        num(r.pinned_tokens),
        if nodes == 1 { "node" } else { "nodes" },
    );
    if r.pins_exceed_budget {
        let _ = writeln!(
            out,
            "the pins alone exceed the history budget: {} > {} tokens",
            num(r.pinned_tokens),
            num(r.history_budget)
        );
        out.push_str("  no render step reduces a pinned node: unpin some, or raise the budget\n");
    }
    out
}

/// What each step of the engine did.
fn tiers(r: &pb::ContextReport, t: &pb::TokenBreakdown) -> String {
    let mut out = String::from("tiers\n");
    let mut line = |name: &str, what: String| {
        let _ = writeln!(out, "  {name:<18}{what}");
    };
    line(
        "budget reduction",
        format!("{} tool results truncated", r.results_truncated),
    );
    let micro = if r.microcompact_trigger.is_empty() {
        "not triggered".to_string()
    } else {
        format!(
            "triggered by {}: {} tool results cleared",
            r.microcompact_trigger, r.results_cleared
        )
    };
    line(
        "microcompact",
        format!("{micro}; boundary {}", r.microcompact_boundary),
    );
    // Why the last step was taken: its saving paid back the rewrite of the cached tail within
    // so many calls, the provider's cache had expired, or the budget forced it.
    let why = match r.microcompact_trigger.as_str() {
        "count" if r.payback_calls > 0 => Some(format!(
            "its saving pays back the rewrite in {} calls",
            r.payback_calls
        )),
        "count" => Some("forced by the budget".to_owned()),
        "idle" => Some("the cache had expired: the step was free".to_owned()),
        _ => None,
    };
    if let Some(why) = why {
        line("", why);
    }
    line(
        "input stubs",
        format!("{} tool-call arguments stubbed", r.inputs_stubbed),
    );
    // What each step saved, one line each so the panel stays within 80 columns.
    for (label, step, s) in [
        ("saved", "truncation", &r.saved_truncation),
        ("", "clearing", &r.saved_clearing),
        ("", "input stubs", &r.saved_stubbing),
        ("", "assistant text", &r.saved_text_cut),
    ] {
        let s = s.unwrap_or_default();
        line(
            label,
            format!(
                "{step} {} tokens ({} characters)",
                num(s.tokens),
                num(s.chars)
            ),
        );
    }
    line(
        "snip",
        format!(
            "{} turns snipped ({} nodes)",
            r.turns_snipped,
            r.snipped_node_ids.len()
        ),
    );
    line(
        "summary",
        if t.summaries > 0 && r.summary_ids.len() > 1 {
            format!(
                "{} applied ({} tokens)",
                r.summary_ids.len(),
                num(t.summaries)
            )
        } else if t.summaries > 0 {
            format!("applied ({} tokens)", num(t.summaries))
        } else if r.summary_needed {
            "none; needed".into()
        } else {
            "none".into()
        },
    );
    line(
        "stable prefix",
        format!(
            "{} messages (prompt-cache breakpoint)",
            r.stable_prefix_messages
        ),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(total: u32, budget: Option<u32>) -> pb::ContextReport {
        pb::ContextReport {
            total_tokens: total,
            tokens: Some(pb::TokenBreakdown {
                system: total / 4,
                tool_results: total - total / 4,
                ..Default::default()
            }),
            messages: 3,
            tokenizer: "heuristic".into(),
            budget: budget.map(|b| pb::Budget {
                context_window: b,
                ..Default::default()
            }),
            history_budget: budget.unwrap_or(0),
            fits: budget.is_none_or(|b| total <= b),
            over_by: budget.map_or(0, |b| total.saturating_sub(b)),
            ..Default::default()
        }
    }

    #[test]
    fn every_line_fits_80_columns() {
        for (total, budget) in [
            (0, None),
            (800, None),
            (6_000, Some(8_000)),
            (12_000, Some(8_000)),
        ] {
            let p = picture("session x", &report(total, budget));
            for line in p.lines() {
                assert!(line.chars().count() <= 80, "{line:?} is wider than 80");
            }
        }
    }

    #[test]
    fn pins_get_a_line_and_a_warning_when_they_alone_are_over() {
        let none = picture("s", &report(6_000, Some(8_000)));
        assert!(!none.contains("pinned"), "{none}");

        let mut r = report(6_000, Some(8_000));
        r.pinned_tokens = 2_000;
        r.pinned_node_ids = vec!["0192d3b4-1c2a-7d3e-8f00-000000000001".into()];
        let p = picture("s", &r);
        assert!(
            p.contains("pinned: 2,000 tokens in 1 node (25.0% of the budget), never reduced"),
            "{p}"
        );
        assert!(!p.contains("exceed"), "{p}");

        let mut r = report(12_000, Some(8_000));
        r.pinned_tokens = 9_000;
        r.pinned_node_ids = vec!["a".into(), "b".into()];
        r.pins_exceed_budget = true;
        let p = picture("s", &r);
        assert!(p.contains("9,000 tokens in 2 nodes"), "{p}");
        assert!(
            p.contains("the pins alone exceed the history budget: 9,000 > 8,000 tokens"),
            "{p}"
        );
        for line in p.lines() {
            assert!(line.chars().count() <= 80, "{line:?} is wider than 80");
        }

        let mut r = report(800, None);
        r.pinned_tokens = 200;
        r.pinned_node_ids = vec!["a".into()];
        assert!(picture("s", &r).contains("(25.0% of the total)"));
    }

    #[test]
    fn over_budget_shows_the_overflow_and_the_budget_mark() {
        let p = picture("s", &report(12_000, Some(8_000)));
        assert!(p.contains("OVER by 4,000"), "{p}");
        assert!(p.contains('▓'), "{p}");
        assert!(p.contains('┤'), "{p}");
    }
}
