//! `ctxd context`: where the tokens go, as a picture that reads at 80 columns.
//!
//! One bar per category of the report's breakdown, scaled to the history budget (or to the total
//! when it is larger, or when there is no budget), the total against the budget line, the free
//! space, the pinned nodes' share (pins are never reduced), and what each tier of the engine
//! did. For a session the model gateway recorded, what it forwarded in all and its ledger: a
//! line per call, marking the calls whose cache read fell short of what was kept.

use std::fmt::Write;

use super::show::num;
use crate::proto::pb;

/// Cells of a bar; with the label and the numbers a line stays under 80 columns.
const WIDTH: usize = 40;
const EIGHTHS: [char; 8] = [' ', '▏', '▎', '▍', '▌', '▋', '▊', '▉'];

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

    let mut out = format!("{target}\n");
    let _ = writeln!(
        out,
        "{} messages, {} tokens ({})",
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

/// `n` of `scale` in eighth-block precision; a non-zero value shows at least a sliver.
fn bar(n: u32, scale: u32) -> String {
    let eighths = (u64::from(n) * (WIDTH as u64) * 8).div_ceil(u64::from(scale));
    let eighths = usize::try_from(eighths).unwrap_or(WIDTH * 8).min(WIDTH * 8);
    let mut s = "█".repeat(eighths / 8);
    if eighths % 8 > 0 {
        s.push(EIGHTHS[eighths % 8]);
    }
    s
}

fn cells(n: u32, scale: u32) -> usize {
    let c = (u64::from(n) * WIDTH as u64 + u64::from(scale) / 2) / u64::from(scale);
    usize::try_from(c).unwrap_or(WIDTH).min(WIDTH)
}

/// The total: `█` within the budget, `▓` past it, `░` for the free space left.
fn total_bar(total: u32, budget: Option<u32>, scale: u32) -> String {
    let used = cells(total, scale);
    let Some(budget) = budget else {
        return "█".repeat(used);
    };
    let limit = cells(budget, scale);
    (0..used.max(limit))
        .map(|i| match (i < used, i < limit) {
            (true, true) => '█',
            (true, false) => '▓',
            _ => '░',
        })
        .collect()
}

/// A rule up to the budget, ending in `┤`.
fn budget_line(budget: u32, scale: u32) -> String {
    let at = cells(budget, scale).max(1);
    format!("{}┤", "─".repeat(at - 1))
}

/// What the model gateway forwarded for the session, and what the provider reported: the
/// lines `ctxd context` adds for a session the gateway recorded.
pub fn gateway(g: &pb::GatewayUsage) -> String {
    let mut out = String::new();
    let share = |part: u64, whole: u64| {
        if whole == 0 {
            0.0
        } else {
            part as f64 / whole as f64
        }
    };
    let _ = writeln!(out, "\ngateway: {} call(s)", num(g.calls));
    let _ = writeln!(
        out,
        "  messages sent by the client {:>12} tokens (estimated)",
        num(g.client_tokens)
    );
    let _ = writeln!(
        out,
        "  messages forwarded          {:>12} tokens ({:.2}× what the client sent)",
        num(g.forwarded_tokens),
        share(g.forwarded_tokens, g.client_tokens)
    );
    let input = g.input_tokens + g.cache_read_tokens + g.cache_write_tokens;
    let weighted = g.input_tokens as f64
        + crate::economy::CACHE_READ * g.cache_read_tokens as f64
        + crate::economy::CACHE_WRITE * g.cache_write_tokens as f64;
    let _ = writeln!(
        out,
        "  provider input              {:>12} tokens: {} uncached, {} cache reads ({:.0}%), {} cache writes",
        num(input),
        num(g.input_tokens),
        num(g.cache_read_tokens),
        100.0 * share(g.cache_read_tokens, input),
        num(g.cache_write_tokens)
    );
    let _ = writeln!(
        out,
        "  cache-weighted input        {:>12.0} (reads 0.1×, writes 1.25×); output {} tokens",
        weighted,
        num(g.output_tokens)
    );
    out
}

/// Calls the ledger shows without `--all-calls`: the newest, enough for the last few turns.
pub const LEDGER_NEWEST: usize = 20;

/// The gateway's ledger: one line per call (the newest `newest` of them, or all with `None`),
/// in the order made, then the totals over every call. A call marked `✗` is an unexplained
/// miss: the provider read less from its cache than the forwarded request kept of the previous
/// one, and no expiry explains it. Lines stay within 80 columns for the usual change reasons
/// and fewer than 1,000 calls.
pub fn ledger(calls: &[pb::GatewayCall], newest: Option<usize>) -> String {
    let skip = newest.map_or(0, |n| calls.len().saturating_sub(n));
    let shown = &calls[skip..];
    let mut out = String::new();
    let _ = write!(out, "\ngateway ledger: ");
    if skip > 0 {
        let _ = writeln!(
            out,
            "the newest {} of {} calls (--all-calls for every one)",
            shown.len(),
            num(calls.len() as u64)
        );
    } else {
        let _ = writeln!(out, "{} call(s)", num(calls.len() as u64));
    }
    out.push_str(
        "  tokens sent by the client and forwarded; read and written by the provider's\n  \
         cache, and its uncached input; kept: identical to the previous request up to\n  \
         its last cache breakpoint\n",
    );
    let figures = |c: &pb::GatewayCall| {
        [
            c.client_tokens,
            c.forwarded_tokens,
            c.cache_read_tokens,
            c.cache_write_tokens,
            c.input_tokens,
            c.kept_tokens,
        ]
    };
    let columns = |cells: [String; 6]| cells.iter().map(|c| format!(" {c:>9}")).collect::<String>();
    let _ = writeln!(
        out,
        " {:>3}{}  change",
        "#",
        columns(["sent", "forwarded", "read", "written", "uncached", "kept"].map(str::to_owned))
    );
    for (i, c) in shown.iter().enumerate() {
        let mark = if c.unexplained_miss { '✗' } else { ' ' };
        let change = if c.change.is_empty() {
            "—"
        } else {
            &c.change
        };
        let _ = writeln!(
            out,
            "{mark}{:>3}{}  {change}",
            skip + i + 1,
            columns(figures(c).map(num))
        );
        // What the reasoning rules did, on a line of its own under the call.
        let note = reasoning(c);
        if !note.is_empty() {
            let _ = writeln!(out, "      {}", note.trim_start());
        }
    }
    let mut totals = [0u64; 6];
    for c in calls {
        for (t, n) in totals.iter_mut().zip(figures(c)) {
            *t = t.saturating_add(n);
        }
    }
    let misses = calls.iter().filter(|c| c.unexplained_miss).count();
    let _ = writeln!(out, "{:>4}{}", "all", columns(totals.map(num)));
    if misses > 0 {
        let _ = writeln!(
            out,
            "✗ {} unexplained cache miss(es): the provider read less than was kept",
            num(misses as u64)
        );
    } else {
        out.push_str("no unexplained cache misses\n");
    }
    // Which entries of the model table priced the calls, and what they cost at those prices.
    let mut entries: Vec<&str> = calls
        .iter()
        .map(|c| c.priced_by.as_str())
        .filter(|p| !p.is_empty())
        .collect();
    entries.sort_unstable();
    entries.dedup();
    if !entries.is_empty() {
        let cost: f64 = calls.iter().map(|c| c.cost).sum();
        let _ = writeln!(
            out,
            "priced by the model table's {}: cache-weighted input {cost:.0}",
            entries.join(", ")
        );
    }
    // Why each step was taken, said once under the table rather than on every line.
    if shown.iter().any(|c| c.change.starts_with("step:")) {
        out.push_str(
            "step:N:payback:M: a step clearing results before N, its saving paying back the\n  \
             rewrite of the cached tail within M calls; expired:MS: the cache had expired\n",
        );
    }
    if shown.iter().any(|c| c.edit_clear.is_some()) {
        out.push_str(
            "edit:A/B: the step as the provider's edit: ctxd asked it to clear the oldest A tool\n  \
             uses, and it reported clearing B (the model binds its thinking to its prefix)\n",
        );
    }
    if shown
        .iter()
        .any(|c| c.thinking_dropped > 0 || c.provider_thinking_dropped > 0)
    {
        out.push_str(
            "thinking-N: thinking blocks ctxd left out as a step invalidated them; dropped-N:\n  \
             those the provider dropped\n",
        );
    }
    out
}

/// What a call's reasoning rules did: the edit asked and what the provider cleared, the
/// thinking left out.
fn reasoning(c: &pb::GatewayCall) -> String {
    let mut out = String::new();
    if let Some(asked) = c.edit_clear {
        let cleared = c
            .provider_cleared
            .map_or_else(|| "?".to_owned(), |n| n.to_string());
        let _ = write!(out, " edit:{asked}/{cleared}");
    }
    if c.thinking_dropped > 0 {
        let _ = write!(out, " thinking-{}", c.thinking_dropped);
    }
    if c.provider_thinking_dropped > 0 {
        let _ = write!(out, " dropped-{}", c.provider_thinking_dropped);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(n: u64, change: &str, miss: bool) -> pb::GatewayCall {
        pb::GatewayCall {
            at_unix_ms: 1_750_000_000_000,
            api: "anthropic".into(),
            model: "claude".into(),
            client_tokens: 120_000 + n,
            forwarded_tokens: 90_000 + n,
            input_tokens: 2_000,
            cache_read_tokens: if miss { 0 } else { 85_000 },
            cache_write_tokens: 3_000,
            output_tokens: 500,
            kept_tokens: 85_000,
            change: change.into(),
            unexplained_miss: miss,
            ..Default::default()
        }
    }

    #[test]
    fn the_ledger_says_what_was_asked_of_the_provider_and_which_entry_priced_it() {
        let mut edited = call(1, "step:12:payback:3", false);
        edited.priced_by = "claude-opus-5-5".into();
        edited.edit_clear = Some(9);
        edited.edit_keep = Some(1);
        edited.provider_cleared = Some(9);
        edited.cost = 1_000.0;
        let mut dropped = call(2, "step:12", false);
        dropped.priced_by = "claude-opus-5-5".into();
        dropped.thinking_dropped = 4;
        dropped.cost = 500.0;
        let l = ledger(&[edited, dropped], None);
        let lines: Vec<&str> = l.lines().collect();
        let at = |needle: &str| lines.iter().position(|x| x.ends_with(needle));
        let stepped = at("step:12:payback:3").expect("the first call");
        assert_eq!(lines[stepped + 1].trim(), "edit:9/9", "{l}");
        let dropped = at("step:12").expect("the second call");
        assert_eq!(lines[dropped + 1].trim(), "thinking-4", "{l}");
        assert!(
            l.contains("priced by the model table's claude-opus-5-5: cache-weighted input 1500"),
            "{l}"
        );
        assert!(l.contains("edit:A/B:") && l.contains("thinking-N:"), "{l}");
    }

    #[test]
    fn the_ledger_shows_the_newest_calls_marks_misses_and_adds_up_all() {
        let calls: Vec<_> = (0..25)
            .map(|n| match n {
                0 => call(n, "first", false),
                7 => call(n, "client_changed", true),
                23 => call(n, "expired:360000", false),
                24 => call(n, "", true),
                _ => call(n, "step:20", false),
            })
            .collect();
        let l = ledger(&calls, Some(LEDGER_NEWEST));
        assert!(l.contains("the newest 20 of 25 calls (--all-calls"), "{l}");
        let lines: Vec<&str> = l.lines().collect();
        // Calls 6..=25 are shown, each once, in order; the miss among them is marked.
        assert!(!l.contains("first"), "{l}");
        assert!(lines.iter().any(|x| x.starts_with("   6 ")), "{l}");
        assert!(
            lines
                .iter()
                .any(|x| x.starts_with("✗ 25 ") && x.ends_with("  —")),
            "{l}"
        );
        assert!(
            lines
                .iter()
                .any(|x| x.starts_with("  24 ") && x.ends_with("expired:360000")),
            "{l}"
        );
        // Totals are over every call, the hidden ones too.
        let client: u64 = calls.iter().map(|c| c.client_tokens).sum();
        let all = lines
            .iter()
            .find(|x| x.starts_with(" all"))
            .expect("a totals line");
        assert!(all.contains(&num(client)), "{all}");
        assert!(l.contains("✗ 2 unexplained cache miss(es)"), "{l}");
        for line in l.lines() {
            assert!(line.chars().count() <= 80, "{line:?} is wider than 80");
        }

        let every = ledger(&calls, None);
        assert!(every.contains("gateway ledger: 25 call(s)"), "{every}");
        assert!(
            every
                .lines()
                .any(|x| x.starts_with("✗  8 ") && x.ends_with("client_changed")),
            "{every}"
        );
        assert!(every.contains("first"), "{every}");
    }

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

    #[test]
    fn bars_scale_to_the_budget() {
        assert_eq!(bar(0, 100), "");
        assert_eq!(bar(100, 100).chars().count(), WIDTH);
        assert_eq!(bar(50, 100), "█".repeat(WIDTH / 2));
        assert_eq!(bar(1, 1_000_000), "▏");
    }
}
