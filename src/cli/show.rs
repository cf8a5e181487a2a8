//! Plain-text output of the client commands: one function per response, plus small helpers.

use std::fmt::Write;

use crate::proto::pb;

/// Width of the shortened text at the end of `log` and `render` lines.
pub(super) const TEXT_WIDTH: usize = 72;

pub fn role(value: i32) -> &'static str {
    match pb::Role::try_from(value) {
        Ok(pb::Role::System) => "system",
        Ok(pb::Role::Developer) => "developer",
        Ok(pb::Role::User) => "user",
        Ok(pb::Role::Assistant) => "assistant",
        Ok(pb::Role::Tool) => "tool",
        _ => "?",
    }
}

/// Whitespace runs collapsed to one space, cut to `width` characters with `…`.
pub fn short(text: &str, width: usize) -> String {
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() <= width {
        return flat;
    }
    let mut cut: String = flat.chars().take(width.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

/// The text parts joined; media as `[mime/type]`.
pub fn parts(parts: &[pb::ContentPart]) -> String {
    use pb::content_part::Part;
    parts
        .iter()
        .map(|p| match &p.part {
            Some(Part::Text(t)) => t.clone(),
            Some(Part::Media(m)) => format!("[{}]", m.mime_type),
            None => String::new(),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The text and `→ name(args)` for each call, shortened to fit [`TEXT_WIDTH`] together.
fn body(text: &str, calls: &[pb::ToolCall]) -> String {
    let calls: Vec<String> = calls
        .iter()
        .map(|c| format!("→ {}({})", c.name, c.arguments_json))
        .collect();
    let text = text.trim();
    let calls = short(
        &calls.join(" "),
        if text.is_empty() {
            TEXT_WIDTH
        } else {
            TEXT_WIDTH / 2
        },
    );
    let room = TEXT_WIDTH.saturating_sub(calls.chars().count() + 1);
    let text = short(text, if calls.is_empty() { TEXT_WIDTH } else { room });
    [text, calls]
        .into_iter()
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// `12,345`.
pub fn num(n: impl Into<u64>) -> String {
    let digits = n.into().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Unix milliseconds as `2026-02-03 12:34:56` (UTC).
pub fn time(unix_ms: i64) -> String {
    let secs = unix_ms.div_euclid(1000);
    let (days, rest) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}",
        rest / 3600,
        rest / 60 % 60,
        rest % 60
    )
}

/// A reason without its `COMPACTION_REASON_` prefix.
pub fn reason(value: i32) -> String {
    let name = pb::CompactionReason::try_from(value).map(|r| r.as_str_name());
    enum_name(name.ok(), value, "COMPACTION_REASON_")
}

/// An enum value by its proto name without `prefix`, or the bare number if this build does not
/// know it.
pub fn enum_name(name: Option<&str>, value: i32, prefix: &str) -> String {
    name.map_or_else(
        || value.to_string(),
        |n| n.trim_start_matches(prefix).into(),
    )
}

pub fn import(r: &pb::ImportSessionResponse) -> String {
    let format = pb::ImportFormat::try_from(r.format).map_or("?", |f| match f {
        pb::ImportFormat::NeutralJsonl => "neutral",
        pb::ImportFormat::ClaudeCodeJsonl => "claude-code",
        pb::ImportFormat::OpenaiMessages => "openai",
        pb::ImportFormat::CtxdJsonl => "ctxd",
        pb::ImportFormat::Unspecified => "?",
    });
    let id = r.session.as_ref().map_or("?", |s| s.session_id.as_str());
    let mut out = format!("session {id}\n");
    let _ = writeln!(
        out,
        "imported {} nodes, {} functions, {} summaries, {} warnings ({format})",
        num(r.nodes),
        num(r.functions),
        num(r.summaries),
        num(r.warnings.len() as u64),
    );
    for w in &r.warnings {
        let _ = writeln!(out, "warning: {w}");
    }
    out
}

pub fn sessions(sessions: &[pb::Session], more: bool) -> String {
    let mut out = String::new();
    for s in sessions {
        let branches: Vec<&str> = s.branches.iter().map(|b| b.name.as_str()).collect();
        let mut meta: Vec<String> = s.metadata.iter().map(|(k, v)| format!("{k}={v}")).collect();
        meta.sort();
        let _ = write!(
            out,
            "{}  {}  nodes: {}  branches: {}",
            s.session_id,
            time(s.created_at_unix_ms),
            s.node_count,
            branches.join(", ")
        );
        if s.compaction_count > 0 {
            let _ = write!(out, "  compactions: {}", s.compaction_count);
        }
        if !meta.is_empty() {
            let _ = write!(out, "  {}", short(&meta.join(" "), 60));
        }
        out.push('\n');
    }
    end_listing(
        &mut out,
        sessions.is_empty(),
        "sessions",
        more.then_some("more"),
    );
    out
}

/// One line per node: id, what it is, who, short text.
pub fn log(nodes: &[pb::Node], more: bool) -> String {
    let mut out = String::new();
    for n in nodes {
        out.push_str(&node_line(n));
        out.push('\n');
    }
    end_listing(
        &mut out,
        nodes.is_empty(),
        "nodes",
        more.then_some("older nodes"),
    );
    out
}

/// The end of a paged listing: `no <what>` when it is empty, and, when `--limit` left some
/// out, a line saying what (`… <more> (raise --limit)`).
fn end_listing(out: &mut String, empty: bool, what: &str, more: Option<&str>) {
    if empty {
        let _ = writeln!(out, "no {what}");
    }
    if let Some(more) = more {
        let _ = writeln!(out, "… {more} (raise --limit)");
    }
}

/// A node on one line: id, who, scope and pin marks, the text shortened.
fn node_line(n: &pb::Node) -> String {
    use pb::node_input::Kind;
    {
        let (who, text) = match n.content.as_ref().and_then(|c| c.kind.as_ref()) {
            Some(Kind::Message(m)) => (
                role(m.role).to_string(),
                body(&parts(&m.parts), &m.tool_calls),
            ),
            Some(Kind::ToolResult(r)) => {
                let error = if r.is_error { "error: " } else { "" };
                (
                    format!("result {}", r.name),
                    format!("{error}{}", parts(&r.parts)),
                )
            }
            Some(Kind::FunctionCall(c)) => (format!("fn-call {}", c.name), c.input.clone()),
            Some(Kind::FunctionResult(r)) => {
                let error = if r.status == pb::FunctionStatus::Error as i32 {
                    "error: "
                } else {
                    ""
                };
                ("fn-result".to_string(), format!("{error}{}", r.output))
            }
            None => ("?".to_string(), String::new()),
        };
        let scope = if n.function_id.is_empty() {
            ""
        } else {
            "[fn] "
        };
        let pin = if n.pinned { "[pinned] " } else { "" };
        format!(
            "{}  {:<18} {scope}{pin}{}",
            n.node_id,
            short(&who, 18),
            short(&text, TEXT_WIDTH)
        )
    }
}

/// A watch event on one line, after its branch (`-` for a function's chain).
pub fn watch_event(e: &pb::WatchEvent) -> String {
    use pb::watch_event::Event;
    let at = |b: &pb::Branch| {
        if b.head_id.is_empty() {
            "no head".to_owned()
        } else {
            b.head_id.clone()
        }
    };
    let branch = if e.branch.is_empty() { "-" } else { &e.branch };
    let what = match &e.event {
        Some(Event::Started(s)) => {
            let branches: Vec<String> = s
                .branches
                .iter()
                .map(|b| format!("{} at {}", b.name, at(b)))
                .collect();
            return format!("watching {}", branches.join(", "));
        }
        Some(Event::Node(n)) => node_line(n),
        Some(Event::HeadMoved(b)) => format!("head moved to {}", at(b)),
        Some(Event::BranchCreated(b)) => format!("branch created at {}", at(b)),
        Some(Event::BranchDeleted(_)) => "branch deleted".to_owned(),
        Some(Event::Compaction(c)) => format!(
            "compaction {} {}  {} → {} tokens",
            c.kind,
            reason(c.reason),
            num(c.tokens_before),
            num(c.tokens_after)
        ),
        Some(Event::Deleted(_)) => "session deleted".to_owned(),
        None => "?".to_owned(),
    };
    format!("{branch:<12} {what}")
}

/// The neutral messages readably, then what the render did.
pub fn render(r: &pb::RenderResponse) -> String {
    let mut out = String::new();
    for (i, m) in r.messages.iter().enumerate() {
        let mut flags = Vec::new();
        for (on, flag) in [
            (m.truncated, "truncated"),
            (m.cleared, "cleared"),
            (m.is_error, "error"),
            (!m.function_id.is_empty(), "fn"),
            (m.pinned, "pinned"),
        ] {
            if on {
                flags.push(flag);
            }
        }
        let who = if m.role == pb::Role::Tool as i32 {
            format!("tool {}", m.name)
        } else {
            role(m.role).to_string()
        };
        let text = body(&parts(&m.parts), &m.tool_calls);
        let _ = writeln!(
            out,
            "{:>4} {:<16} {:>7} tok {:<10} {}",
            i + 1,
            short(&who, 16),
            num(m.tokens),
            flags.join(","),
            short(&text, TEXT_WIDTH)
        );
    }
    let _ = writeln!(
        out,
        "{} messages, {} tokens ({})",
        r.messages.len(),
        num(r.total_tokens),
        r.tokenizer
    );
    if let Some(report) = &r.report {
        out.push_str(&verdict(report));
    }
    out
}

/// `budget 8,000: fits` and what the tiers did, or nothing without a budget.
fn verdict(r: &pb::ContextReport) -> String {
    if r.budget.is_none() {
        return String::new();
    }
    let fit = if r.fits {
        "fits".to_string()
    } else {
        format!("over by {}", num(r.over_by))
    };
    let mut out = format!("history budget {}: {fit}", num(r.history_budget));
    if r.summary_needed {
        out.push_str(", summary needed");
    }
    let _ = writeln!(
        out,
        "; {} truncated, {} cleared, {} turns snipped",
        r.results_truncated, r.results_cleared, r.turns_snipped
    );
    out
}

/// `ctxd pin` and `ctxd unpin`: every pinned node of the session after the call.
pub fn pinned(r: &pb::PinResponse) -> String {
    if r.pinned_ids.is_empty() {
        return "no pinned nodes\n".into();
    }
    let mut out = format!("pinned ({})\n", r.pinned_ids.len());
    for id in &r.pinned_ids {
        let _ = writeln!(out, "  {id}");
    }
    out
}

/// `ctxd sessions rm`: one line a session.
pub fn deleted(done: &[pb::DeleteSessionResponse]) -> String {
    let mut out = String::new();
    for r in done {
        let Some(t) = &r.tombstone else { continue };
        let what = if r.already_deleted {
            "was already deleted"
        } else {
            "deleted"
        };
        let _ = writeln!(
            out,
            "session {} {what}: {} nodes, {} branches, {} summaries (by {:?} at {})",
            t.session_id,
            t.nodes,
            t.branches,
            t.summaries,
            t.deleted_by,
            time(t.deleted_at_unix_ms),
        );
    }
    out
}

/// `ctxd gc`.
pub fn garbage(r: &pb::CollectGarbageResponse) -> String {
    format!(
        "{} sessions, {} tombstones
database {} bytes, {} free for reuse; {} bytes given back
",
        r.sessions, r.tombstones, r.database_bytes, r.free_bytes, r.released_bytes
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_get_thousands_separators() {
        assert_eq!(num(0u32), "0");
        assert_eq!(num(999u32), "999");
        assert_eq!(num(1000u32), "1,000");
        assert_eq!(num(1_234_567u32), "1,234,567");
    }

    #[test]
    fn times_are_utc_dates() {
        assert_eq!(time(0), "1970-01-01 00:00:00");
        assert_eq!(time(1_700_000_000_123), "2023-11-14 22:13:20");
        assert_eq!(time(951_782_400_000), "2000-02-29 00:00:00");
    }

    #[test]
    fn short_collapses_and_cuts() {
        assert_eq!(short("a\n\n  b", 10), "a b");
        assert_eq!(short("abcdefgh", 5), "abcd…");
        assert_eq!(short("日本語テキスト", 4), "日本語…");
    }
}
