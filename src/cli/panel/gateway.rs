//! What the model gateway forwarded for a session it recorded: its totals, and its ledger of
//! calls with the cache misses no expiry explains.

use std::fmt::Write;

use crate::cli::show::num;
use crate::proto::pb;

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
}
