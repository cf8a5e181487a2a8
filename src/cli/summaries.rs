//! Plain-text output about summaries: what a compaction did, and a session's summaries (each
//! with its evidence ledger) and compaction events.

use std::fmt::Write;

use super::show::{TEXT_WIDTH, enum_name, num, reason, short, time};
use crate::proto::pb;

pub fn outcome(o: &pb::CompactionOutcome) -> String {
    let mut out = if o.applied {
        format!("applied: summary {}\n", o.summary_id)
    } else {
        format!("not applied: {}\n", reason(o.reason))
    };
    if !o.message.is_empty() {
        let _ = writeln!(out, "{}", o.message);
    }
    let saved = i64::from(o.tokens_after) - i64::from(o.tokens_before);
    let _ = writeln!(
        out,
        "tokens {} → {} ({saved:+})",
        num(o.tokens_before),
        num(o.tokens_after)
    );
    if !o.compaction_id.is_empty() {
        let _ = writeln!(out, "compaction {}", o.compaction_id);
    }
    out
}

/// `ctxd compact --text`: the outcome, then the evidence the summary carries (as the render
/// shows it after the summary text).
pub fn prepared_outcome(p: &pb::PrepareCompactionResponse, o: &pb::CompactionOutcome) -> String {
    let mut out = outcome(o);
    if p.needed {
        let _ = writeln!(out, "{} summary: {}", kind(p.kind), p.reason);
        if p.ledger_text.trim().is_empty() {
            out.push_str("ledger: empty\n");
        } else {
            out.push_str("ledger:\n");
            for line in p.ledger_text.trim_end().lines() {
                let _ = writeln!(out, "  {line}");
            }
        }
    }
    out
}

/// A summary kind without its `SUMMARY_KIND_` prefix, in lower case.
pub fn kind(value: i32) -> String {
    let name = pb::SummaryKind::try_from(value).map(|k| k.as_str_name());
    enum_name(name.ok(), value, "SUMMARY_KIND_").to_lowercase()
}

/// The most file paths `summaries` lists for one summary (`--json` has them all).
const LEDGER_PATHS: usize = 12;

/// `words` after `head`, joined by `sep` and wrapped to `width` columns; continuation lines are
/// indented to where the first word started.
fn wrap(head: &str, words: &[String], sep: &str, width: usize) -> String {
    let indent = " ".repeat(head.chars().count());
    let mut out = String::new();
    let mut line = head.to_string();
    let mut on_line = 0;
    for (i, word) in words.iter().enumerate() {
        let piece = if i + 1 == words.len() {
            word.clone()
        } else {
            format!("{word}{}", sep.trim_end())
        };
        if on_line > 0 && line.chars().count() + 1 + piece.chars().count() > width {
            let _ = writeln!(out, "{line}");
            line.clone_from(&indent);
            on_line = 0;
        }
        line.push(' ');
        line.push_str(&piece);
        on_line += 1;
    }
    let _ = writeln!(out, "{line}");
    out
}

/// A ledger compactly: its non-zero counts by category, then its file paths (read or modified,
/// sorted, each once, at most [`LEDGER_PATHS`]), wrapped to `width` columns after `indent`.
fn ledger(l: &pb::EvidenceLedger, indent: &str, width: usize) -> String {
    let count = |n: usize, one: &str, many: &str| {
        (n > 0).then(|| format!("{} {}", num(n as u64), if n == 1 { one } else { many }))
    };
    let counts: Vec<String> = [
        count(l.files_read.len(), "file read", "files read"),
        count(l.files_modified.len(), "file modified", "files modified"),
        count(l.commands.len(), "command", "commands"),
        count(l.errors.len(), "error", "errors"),
        count(l.user_requests.len(), "user request", "user requests"),
        count(l.functions.len(), "function", "functions"),
    ]
    .into_iter()
    .flatten()
    .collect();
    if counts.is_empty() {
        return format!("{indent}ledger: empty\n");
    }
    let mut out = wrap(&format!("{indent}ledger:"), &counts, ", ", width);
    let mut paths: Vec<&str> = l
        .files_read
        .iter()
        .chain(&l.files_modified)
        .map(|f| f.path.as_str())
        .collect();
    paths.sort_unstable();
    paths.dedup();
    if paths.is_empty() {
        return out;
    }
    let head = format!("{indent}files:");
    let room = width.saturating_sub(head.chars().count() + 1).max(8);
    let mut words: Vec<String> = paths
        .iter()
        .take(LEDGER_PATHS)
        .map(|p| short(p, room))
        .collect();
    let more = paths.len().saturating_sub(LEDGER_PATHS);
    if more > 0 {
        words.push(format!("… {} more", num(more as u64)));
    }
    out.push_str(&wrap(&head, &words, " ", width));
    out
}

pub fn list(r: &pb::ListSummariesResponse) -> String {
    let mut out = format!("summaries ({})\n", r.summaries.len());
    for s in &r.summaries {
        let state = if s.active {
            "* active"
        } else if s.applies {
            "  applies"
        } else {
            "  elsewhere"
        };
        let model = if s.model.is_empty() { "-" } else { &s.model };
        let _ = writeln!(
            out,
            "{state:<12}{}  {model}  {}",
            s.summary_id,
            time(s.created_at_unix_ms)
        );
        let _ = writeln!(
            out,
            "{:12}{}, covers {} nodes, {} → {} tokens",
            "",
            kind(s.kind),
            num(s.covers_ids.len() as u64),
            num(s.tokens_before),
            num(s.tokens_after),
        );
        // Node ids are 36 characters: one a line keeps the listing within 80 columns.
        if !s.from_node_id.is_empty() || !s.to_node_id.is_empty() {
            let _ = writeln!(out, "{:12}from {}", "", s.from_node_id);
            let _ = writeln!(out, "{:12}to   {}", "", s.to_node_id);
        }
        for (i, id) in s.rolls_over_ids.iter().enumerate() {
            let label = if i == 0 { "rolls over" } else { "" };
            let _ = writeln!(out, "{:12}{label:<11}{id}", "");
        }
        match &s.ledger {
            Some(l) => out.push_str(&ledger(l, &" ".repeat(12), 80)),
            None => {
                let _ = writeln!(out, "{:12}ledger: none (an older or imported summary)", "");
            }
        }
        let _ = writeln!(out, "{:12}{}", "", short(&s.text, TEXT_WIDTH - 6));
    }
    let _ = writeln!(out, "events ({})", r.events.len());
    for e in &r.events {
        let reason = match reason(e.reason).as_str() {
            "UNSPECIFIED" => "-".to_string(),
            other => other.to_string(),
        };
        let tokens = if e.tokens_after == 0 {
            format!("{} tokens", num(e.tokens_before))
        } else {
            format!("{} → {}", num(e.tokens_before), num(e.tokens_after))
        };
        let mut line = format!(
            "  {}  {:<9}  {reason:<11} {tokens}",
            time(e.created_at_unix_ms),
            e.kind,
        );
        if !e.summary_id.is_empty() {
            let _ = write!(line, "  summary {}", e.summary_id);
        }
        if !e.message.is_empty() {
            let _ = write!(line, "  {}", short(&e.message, 60));
        }
        let _ = writeln!(out, "{line}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ledger_lists_counts_and_paths_within_80_columns() {
        let file = |path: &str| pb::FileUse {
            path: path.into(),
            tools: vec!["Read".into()],
            count: 1,
        };
        let mut l = pb::EvidenceLedger::default();
        assert_eq!(ledger(&l, "  ", 80), "  ledger: empty\n");
        l = pb::EvidenceLedger {
            files_read: vec![file("src/app.py"), file("src/lib.rs")],
            files_modified: vec![file("src/app.py")],
            commands: vec![pb::CommandRun {
                command: "pytest".into(),
                exit_code: Some(1),
                is_error: true,
            }],
            user_requests: vec!["fix it".into()],
            ..Default::default()
        };
        let text = ledger(&l, "  ", 80);
        assert_eq!(
            text,
            "  ledger: 2 files read, 1 file modified, 1 command, 1 user request\n  \
             files: src/app.py src/lib.rs\n"
        );
        l.files_read = (0..40)
            .map(|i| file(&format!("some/rather/long/directory/name/file{i:02}.rs")))
            .collect();
        l.errors = vec![pb::ErrorSeen::default(); 1234];
        l.functions = vec![pb::FunctionUse::default(); 2];
        let text = ledger(&l, &" ".repeat(12), 80);
        assert!(text.contains("… 29 more"), "{text}");
        assert!(text.contains("1,234 errors,"), "{text}");
        for line in text.lines() {
            assert!(line.chars().count() <= 80, "{line:?}");
        }
    }
}
