//! Golden renders of real traces: three imported sessions, each rendered through `Render` under
//! two budgets, written as reviewer-readable text and compared with `testdata/golden/*.txt`.
//!
//! `UPDATE_GOLDEN=1 cargo test --test api golden` rewrites the files instead of comparing; review
//! the diff before committing it. The files hold no ids, times or hashes, only what the traces
//! and the engine decide, so they change exactly when the rendering does.
//!
//! Before the comparison each test checks the facts a reader would check first (the budget
//! holds when the report says it fits, tokens add up, the newest user message is there, calls
//! and results are paired, each render does what it is here to show), so a failure says what
//! broke before it says which line changed.

use std::path::PathBuf;

use ctxd::api::pb;

use crate::helpers::*;
use crate::traces::{TraceMessage, import, import_with_subagent, load_trace};

/// Far in the past: the idle trigger (`now − newest node ≥ idle`) can never fire.
const NOW_UNIX_MS: i64 = 1;
/// Characters of message text shown per line.
const SHOWN_CHARS: usize = 160;
/// Characters of each tool call's arguments shown.
const SHOWN_ARGS: usize = 60;
/// The Task call of cc-main-8463c716 (message 210) that started cc-sub-8463c716-a7be2f0.
const SUBAGENT_CALL: &str = "toolu_017SvvKc8KLbhGMG3tXkf21Z";

/// One golden render.
struct Case {
    /// `testdata/golden/<file>`.
    file: &'static str,
    tokenizer: &'static str,
    budget: pb::Budget,
    policy: Option<pb::RenderPolicy>,
    /// Why this budget: goes into the file's header.
    why: &'static str,
    /// What this render is here to show, checked before the golden comparison.
    expect: Expect,
}

/// What a render must do: fit or not, and whether each budget step changed something.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Expect {
    fits: bool,
    truncates: bool,
    clears: bool,
    snips: bool,
}

fn budget(context_window: u32, output_reserve: u32) -> pb::Budget {
    pb::Budget {
        context_window,
        output_reserve,
        ..Default::default()
    }
}

// ---------------------------------------------------------------- the goldens

#[tokio::test]
async fn golden_swe_marshmallow_1867_fc() {
    let trace = "swe-marshmallow-1867-fc";
    let mut app = spawn_app().await;
    let imported = import(&mut app, trace).await;
    assert_eq!(imported.anomalies, Vec::<String>::new());
    let cases = [
        Case {
            file: "swe-marshmallow-1867-fc.o200k_base.10k.txt",
            tokenizer: "o200k_base",
            budget: budget(10_000, 1_000),
            policy: None,
            why: "room for the whole task: 13 calls are too few for a step to pay back, and a \
                  result is cut only at a step, so nothing is cut or cleared",
            expect: Expect {
                fits: true,
                truncates: false,
                clears: false,
                snips: false,
            },
        },
        Case {
            file: "swe-marshmallow-1867-fc.heuristic.6k.txt",
            tokenizer: "heuristic",
            budget: budget(6_000, 1_000),
            policy: Some(pb::RenderPolicy {
                microcompact_first: 8,
                microcompact_every: 4,
                ..Default::default()
            }),
            why: "too small: no step pays back in 13 calls, so the over-budget fallback steps at \
                  the latest count (12 results) and clears the 5 older than the newest 7, which \
                  is enough to fit; no result is over the standard cap (32,000 characters)",
            expect: Expect {
                fits: true,
                truncates: false,
                clears: true,
                snips: false,
            },
        },
    ];
    for case in &cases {
        check_case(&mut app, trace, &imported.session, &[], case).await;
    }
}

#[tokio::test]
async fn golden_swe_pydicom_1458() {
    let trace = "swe-pydicom-1458";
    let mut app = spawn_app().await;
    let imported = import(&mut app, trace).await;
    // The final `submit` action has no observation: its call is pending at the tail.
    assert_eq!(imported.anomalies.len(), 1, "{:?}", imported.anomalies);
    let pending = ["swe_call_12"];
    let cases = [
        Case {
            file: "swe-pydicom-1458.heuristic.16k.txt",
            tokenizer: "heuristic",
            budget: budget(16_000, 1_000),
            policy: None,
            why: "room for both turns: long tool inputs are stubbed and long assistant texts cut \
                  as they are first sent back, which keeps the 12 calls under budget with no \
                  step and nothing snipped",
            expect: Expect {
                fits: true,
                truncates: false,
                clears: false,
                snips: false,
            },
        },
        Case {
            file: "swe-pydicom-1458.o200k_base.12k.txt",
            tokenizer: "o200k_base",
            budget: budget(12_000, 1_000),
            policy: None,
            why: "both turns do not fit: the over-budget fallback steps at the latest count \
                  (8 results) and clears the one older than the newest 7, and the older turn \
                  (the demonstration) is snipped whole",
            expect: Expect {
                fits: true,
                truncates: false,
                clears: true,
                snips: true,
            },
        },
    ];
    for case in &cases {
        check_case(&mut app, trace, &imported.session, &pending, case).await;
    }
}

#[tokio::test]
async fn golden_cc_main_8463c716_with_subagent() {
    let trace = "cc-main-8463c716";
    let mut app = spawn_app().await;
    let imported = import_with_subagent(
        &mut app,
        trace,
        "cc-sub-8463c716-a7be2f0",
        SUBAGENT_CALL,
        pb::Expose::Full,
    )
    .await;
    assert_eq!(imported.anomalies, Vec::<String>::new());
    let cases = [
        Case {
            file: "cc-main-8463c716+sub.o200k_base.100k.txt",
            tokenizer: "o200k_base",
            budget: budget(100_000, 8_000),
            policy: None,
            why: "a 100k window, far from full: the 196 results step all the same, whenever a \
                  step pays back; the results older than the newest 7 at the last step are \
                  cleared (those longer than their placeholder), the long arguments of calls \
                  before it stubbed and the text of assistant messages before it cut to its \
                  head; no result is cut and nothing is snipped",
            expect: Expect {
                fits: true,
                truncates: true,
                clears: true,
                snips: false,
            },
        },
        Case {
            file: "cc-main-8463c716+sub.heuristic.48k.txt",
            tokenizer: "heuristic",
            budget: budget(48_000, 8_000),
            policy: None,
            why: "a 48k window: the steps keep the context small enough that it fits as in \
                  the 100k window, with no turn snipped",
            expect: Expect {
                fits: true,
                truncates: true,
                clears: true,
                snips: false,
            },
        },
        Case {
            file: "cc-main-8463c716+sub.heuristic.48k.over-budget.txt",
            tokenizer: "heuristic",
            budget: budget(48_000, 8_000),
            policy: Some(pb::RenderPolicy {
                microcompact: pb::MicrocompactMode::OverBudget as i32,
                ..Default::default()
            }),
            why: "ctxd's first policy in the same 48k window: every result is cut to 4,000 \
                  characters; the two retained turns do not fit, so only the newest is \
                  protected; microcompact clears results of both older turns up to its \
                  boundary, then the oldest turn is snipped whole",
            expect: Expect {
                fits: true,
                truncates: true,
                clears: true,
                snips: true,
            },
        },
    ];
    for case in &cases {
        check_case(&mut app, trace, &imported.session, &[], case).await;
    }
    // With `expose=full`, the sub-agent's transcript renders in the 100k case; check it here so
    // a reader of that golden knows the `fn` lines are the sub-agent.
    let r = render_case(&mut app, &imported.session, &cases[0]).await;
    let function_id = imported.function_id.expect("the sub-agent's function");
    let inner = r
        .messages
        .iter()
        .filter(|m| m.function_id == function_id)
        .count();
    assert_eq!(inner, load_trace("cc-sub-8463c716-a7be2f0").len());
}

/// The same renders as provider request documents: readable JSON a reviewer can diff, each
/// checked against its API's pairing rules.
#[tokio::test]
async fn golden_provider_documents() {
    let mut app = spawn_app().await;
    let swe = import(&mut app, "swe-marshmallow-1867-fc").await;
    let cc = import_with_subagent(
        &mut app,
        "cc-main-8463c716",
        "cc-sub-8463c716-a7be2f0",
        SUBAGENT_CALL,
        pb::Expose::Full,
    )
    .await;
    let cases = [
        (
            &swe.session,
            "o200k_base",
            budget(10_000, 1_000),
            pb::Format::OpenaiChat,
            "swe-marshmallow-1867-fc.o200k_base.10k.openai.json",
        ),
        (
            &swe.session,
            "o200k_base",
            budget(10_000, 1_000),
            pb::Format::AnthropicMessages,
            "swe-marshmallow-1867-fc.o200k_base.10k.anthropic.json",
        ),
        (
            &cc.session,
            "heuristic",
            budget(48_000, 8_000),
            pb::Format::OpenaiChat,
            "cc-main-8463c716+sub.heuristic.48k.openai.json",
        ),
        (
            &cc.session,
            "heuristic",
            budget(48_000, 8_000),
            pb::Format::AnthropicMessages,
            "cc-main-8463c716+sub.heuristic.48k.anthropic.json",
        ),
    ];
    for (session, tokenizer, budget, format, file) in cases {
        let r = app
            .render(pb::RenderRequest {
                session_id: session.clone(),
                target: Some(Target::Branch("main".into())),
                tokenizer: tokenizer.into(),
                budget: Some(budget),
                now_unix_ms: NOW_UNIX_MS,
                format: format as i32,
                ..Default::default()
            })
            .await;
        let doc: serde_json::Value = serde_json::from_str(&r.messages_json).expect("JSON");
        let checked = match format {
            pb::Format::OpenaiChat => crate::provider_rules::check_openai(&doc),
            _ => crate::provider_rules::check_anthropic(&doc),
        };
        assert_eq!(checked, Ok(()), "{file}");
        let pretty = serde_json::to_string_pretty(&doc).expect("serializes") + "\n";
        compare_golden(file, &pretty);
    }
}

// ---------------------------------------------------------------- one case

async fn render_case(app: &mut TestApp, session: &str, case: &Case) -> pb::RenderResponse {
    app.render(pb::RenderRequest {
        session_id: session.into(),
        target: Some(Target::Branch("main".into())),
        tokenizer: case.tokenizer.into(),
        budget: Some(case.budget),
        policy: case.policy,
        now_unix_ms: NOW_UNIX_MS,
        ..Default::default()
    })
    .await
}

/// Renders `case`, checks the facts, then compares with (or rewrites) its golden file.
async fn check_case(
    app: &mut TestApp,
    trace: &str,
    session: &str,
    pending_at_tail: &[&str],
    case: &Case,
) {
    let r = render_case(app, session, case).await;
    let report = r.report.clone().expect("a report");
    let what = format!("{trace} {}", case.file);

    // The budget and the counts.
    assert_eq!(report.tokenizer, case.tokenizer, "{what}");
    let history = case.budget.context_window
        - case.budget.output_reserve
        - case.budget.system_tokens
        - case.budget.tools_tokens
        - case.budget.schema_tokens;
    assert_eq!(report.history_budget, history, "{what}: history budget");
    assert_eq!(
        report.fits,
        report.total_tokens <= history,
        "{what}: fits iff total ≤ history budget"
    );
    if report.fits {
        assert_eq!(report.over_by, 0, "{what}");
        assert!(!report.summary_needed, "{what}");
    } else {
        assert_eq!(report.over_by, report.total_tokens - history, "{what}");
        assert!(
            report.summary_needed,
            "{what}: over budget asks for a summary"
        );
    }
    assert_eq!(r.total_tokens, report.total_tokens, "{what}");
    assert_eq!(
        r.messages.iter().map(|m| m.tokens).sum::<u32>(),
        report.total_tokens,
        "{what}: message tokens add up to the total"
    );
    let t = report.tokens.expect("a breakdown");
    assert_eq!(
        t.system
            + t.user
            + t.assistant_text
            + t.tool_calls
            + t.tool_results
            + t.summaries
            + t.markers,
        report.total_tokens,
        "{what}: the breakdown adds up to the total"
    );
    assert_eq!(report.messages as usize, r.messages.len(), "{what}");
    assert!(report.stable_prefix_messages as usize <= r.messages.len());

    // What this render is here to show, as a reader of the golden sees it: truncated and
    // cleared results among the rendered messages, snipped turns in the report.
    let flagged_truncated = r.messages.iter().filter(|m| m.truncated).count();
    let flagged_cleared = r.messages.iter().filter(|m| m.cleared).count();
    let expect = Expect {
        fits: report.fits,
        truncates: flagged_truncated > 0,
        clears: flagged_cleared > 0,
        snips: report.turns_snipped > 0,
    };
    assert_eq!(expect, case.expect, "{what}: what the budget steps did");
    // The report counts what the output keeps: exactly the flagged messages' nodes.
    // A truncated message is a cut result, or an assistant message whose text was cut.
    assert_eq!(
        flagged_truncated,
        (report.results_truncated + report.texts_cut) as usize,
        "{what}"
    );
    assert_eq!(flagged_cleared, report.results_cleared as usize, "{what}");
    let nodes_of = |flag: fn(&pb::RenderedMessage) -> bool| {
        let mut ids: Vec<&String> = r
            .messages
            .iter()
            .filter(|m| flag(m))
            .flat_map(|m| &m.node_ids)
            .collect();
        ids.sort();
        ids
    };
    assert_eq!(
        nodes_of(|m| m.truncated && m.role == pb::Role::Tool as i32),
        sorted(&report.truncated_node_ids),
        "{what}: truncated_node_ids"
    );
    assert_eq!(
        nodes_of(|m| m.truncated && m.role != pb::Role::Tool as i32),
        sorted(&report.text_cut_node_ids),
        "{what}: text_cut_node_ids"
    );

    assert_eq!(
        nodes_of(|m| m.cleared),
        sorted(&report.cleared_node_ids),
        "{what}: cleared_node_ids"
    );
    let rendered_nodes = nodes_of(|_| true);
    assert!(
        report
            .snipped_node_ids
            .iter()
            .all(|id| rendered_nodes.binary_search(&id).is_err()),
        "{what}: snipped nodes do not render"
    );
    assert!(
        r.messages.iter().all(|m| !(m.truncated && m.cleared)),
        "{what}: a message is truncated or cleared, not both"
    );
    for m in r.messages.iter().filter(|m| m.truncated) {
        assert!(
            marker_at(&text_of(&m.parts)).is_some(),
            "{what}: a truncated result shows its marker"
        );
    }
    for m in r.messages.iter().filter(|m| m.cleared) {
        let body = text_of(&m.parts);
        assert!(
            body.contains("cleared to save context: recall ")
                && body.ends_with(']')
                && !m.tool_call_id.is_empty(),
            "{what}: a cleared result keeps its call id and names its node: {body}"
        );
    }

    // The newest user message, and the newest turn, are there in full.
    let messages = load_trace(trace);
    let newest_user = newest_user(&messages);
    let last_user = r
        .messages
        .iter()
        .rev()
        .find(|m| m.role == pb::Role::User as i32 && m.function_id.is_empty())
        .expect("a user message renders");
    assert_eq!(text_of(&last_user.parts), newest_user.content, "{what}");
    let last = messages.last().expect("a trace");
    if last.role != "tool" {
        assert_eq!(
            text_of(&r.messages.last().expect("messages").parts),
            last.content,
            "{what}: the newest message renders as it is"
        );
    }

    // Calls and results stay paired; only the tail may have pending calls.
    assert_paired(&what, &r.messages, pending_at_tail);

    compare_golden(case.file, &golden_text(trace, case, &r));
}

fn sorted(ids: &[String]) -> Vec<&String> {
    let mut ids: Vec<&String> = ids.iter().collect();
    ids.sort();
    ids
}

fn newest_user(messages: &[TraceMessage]) -> &TraceMessage {
    messages
        .iter()
        .rev()
        .find(|m| m.role == "user")
        .expect("the trace has a user message")
}

/// Every tool message answers a call of the latest assistant message before it, once; no
/// other message comes while calls are open, except that `pending_at_tail` stay open at the end.
#[track_caller]
fn assert_paired(what: &str, messages: &[pb::RenderedMessage], pending_at_tail: &[&str]) {
    let mut open: Vec<&str> = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        if m.role == pb::Role::Tool as i32 {
            let at = open.iter().position(|c| *c == m.tool_call_id);
            assert!(
                at.is_some(),
                "{what}: message {i} answers {:?}, not an open call of the latest assistant message",
                m.tool_call_id
            );
            open.remove(at.unwrap_or_default());
        } else {
            assert!(
                open.is_empty(),
                "{what}: message {i} comes while calls {open:?} are open"
            );
            open = m.tool_calls.iter().map(|c| c.call_id.as_str()).collect();
        }
    }
    assert_eq!(open, pending_at_tail, "{what}: calls pending at the tail");
}

// ---------------------------------------------------------------- the text form

fn role_name(role: i32) -> &'static str {
    match pb::Role::try_from(role) {
        Ok(pb::Role::System) => "system",
        Ok(pb::Role::Developer) => "developer",
        Ok(pb::Role::User) => "user",
        Ok(pb::Role::Assistant) => "assistant",
        Ok(pb::Role::Tool) => "tool",
        _ => "unknown",
    }
}

/// Newlines as ⏎, tabs as ⇥, other control characters as `\u{..}`, so a message is one line.
fn one_line(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\n' => out.push('⏎'),
            '\r' => out.push('␍'),
            '\t' => out.push('⇥'),
            c if c.is_control() => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

/// The first `n` characters, then `… (+N chars)` for the rest.
fn abbreviate(s: &str, n: usize) -> String {
    let total = s.chars().count();
    if total <= n {
        return one_line(s);
    }
    let head: String = s.chars().take(n).collect();
    format!("{}… (+{} chars)", one_line(&head), total - n)
}

/// The truncation marker in a reduced tool result: `(start, end)` byte offsets of
/// `\n[… X of Y characters cut: recall R …]\n` (R, 12 hexadecimal characters).
fn marker_at(s: &str) -> Option<(usize, usize)> {
    let mut from = 0;
    while let Some(found) = s[from..].find("\n[… ") {
        let start = from + found;
        let rest = &s[start + "\n[… ".len()..];
        if let Some(close) = rest.find(" characters cut: recall ") {
            let inner = &rest[..close];
            let well_formed = inner.split_once(" of ").is_some_and(|(a, b)| {
                [a, b]
                    .iter()
                    .all(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            });
            let after = &rest[close + " characters cut: recall ".len()..];
            let named = after.len() >= 12
                && after.as_bytes()[..12].iter().all(u8::is_ascii_hexdigit)
                && after[12..].starts_with(" …]\n");
            if well_formed && named {
                let end = start
                    + "\n[… ".len()
                    + close
                    + " characters cut: recall ".len()
                    + 12
                    + " …]\n".len();
                return Some((start, end));
            }
        }
        from = start + 1;
    }
    None
}

/// A message's text for the golden: abbreviated; a truncated result as its abbreviated head,
/// the marker in full and the length of the kept tail; a cleared placeholder in full.
fn shown_text(m: &pb::RenderedMessage) -> String {
    let body = text_of(&m.parts);
    if m.cleared {
        return one_line(&body);
    }
    if m.truncated
        && let Some((start, end)) = marker_at(&body)
    {
        let marker = body[start..end].trim();
        let tail = body[end..].chars().count();
        return format!(
            "{} ‖ {marker} ‖ (+{tail} chars kept after the marker)",
            abbreviate(&body[..start], SHOWN_CHARS)
        );
    }
    abbreviate(&body, SHOWN_CHARS)
}

fn golden_text(trace: &str, case: &Case, r: &pb::RenderResponse) -> String {
    let report = r.report.clone().unwrap_or_default();
    let b = report.budget.unwrap_or_default();
    let t = report.tokens.unwrap_or_default();
    let mut out = String::new();
    let mut line = |s: String| {
        out.push_str(&s);
        out.push('\n');
    };
    line(format!("# ctxd golden render: {trace}"));
    line("# Written by tests/api/golden.rs; regenerate with".into());
    line("#   UPDATE_GOLDEN=1 cargo test --test api golden".into());
    line("# and review the diff.".into());
    line(String::new());
    line(format!("why:        {}", case.why));
    line(format!("tokenizer:  {}", report.tokenizer));
    line(format!(
        "budget:     context_window {} − output_reserve {} − system {} − tools {} − schema {} \
         = history {}",
        b.context_window,
        b.output_reserve,
        b.system_tokens,
        b.tools_tokens,
        b.schema_tokens,
        report.history_budget
    ));
    line(format!(
        "policy:     {}",
        match &case.policy {
            None => "defaults".to_string(),
            Some(p) => policy_text(p),
        }
    ));
    line(format!(
        "now:        {NOW_UNIX_MS} ms after the epoch (the idle trigger never fires)"
    ));
    line(String::new());
    line("report:".into());
    line(format!(
        "  fits {}, total_tokens {}, over_by {}, summary_needed {}",
        report.fits, report.total_tokens, report.over_by, report.summary_needed
    ));
    line(format!(
        "  tokens: system {}, user {}, assistant_text {}, tool_calls {}, tool_results {}, \
         summaries {}, markers {}",
        t.system, t.user, t.assistant_text, t.tool_calls, t.tool_results, t.summaries, t.markers
    ));
    line(format!("  messages {}", report.messages));
    line(format!(
        "  results_truncated {} ({} node ids), results_cleared {} ({} node ids), \
         turns_snipped {} ({} node ids)",
        report.results_truncated,
        report.truncated_node_ids.len(),
        report.results_cleared,
        report.cleared_node_ids.len(),
        report.turns_snipped,
        report.snipped_node_ids.len()
    ));
    line(format!(
        "  microcompact_trigger {:?}, microcompact_boundary {}, stable_prefix_messages {}",
        report.microcompact_trigger, report.microcompact_boundary, report.stable_prefix_messages
    ));
    let saved = |s: &Option<pb::StepSavings>| s.unwrap_or_default().tokens;
    line(format!(
        "  inputs_stubbed {} ({} node ids); tokens saved: truncation {}, clearing {}, stubbing {}",
        report.inputs_stubbed,
        report.stubbed_node_ids.len(),
        saved(&report.saved_truncation),
        saved(&report.saved_clearing),
        saved(&report.saved_stubbing)
    ));
    line(format!(
        "  rendered: {} truncated, {} cleared, {} from a function's chain",
        r.messages.iter().filter(|m| m.truncated).count(),
        r.messages.iter().filter(|m| m.cleared).count(),
        r.messages
            .iter()
            .filter(|m| !m.function_id.is_empty())
            .count()
    ));
    line(String::new());
    line("messages: index role tokens flags | calls (→) or the call answered (←) | text".into());
    line(
        "  flags: T truncated, C cleared, S tool-call arguments stubbed, F in a function's chain, \
         E error"
            .into(),
    );
    for (i, m) in r.messages.iter().enumerate() {
        let flags: String = [
            (m.truncated, 'T'),
            (m.cleared, 'C'),
            (m.inputs_stubbed > 0, 'S'),
            (!m.function_id.is_empty(), 'F'),
            (m.is_error, 'E'),
        ]
        .iter()
        .map(|&(on, c)| if on { c } else { '.' })
        .collect();
        let mut calls = String::new();
        if m.role == pb::Role::Tool as i32 {
            calls = format!(" ← {} {}", m.name, m.tool_call_id);
        }
        for c in &m.tool_calls {
            calls.push_str(&format!(
                " → {} {} {}",
                c.name,
                c.call_id,
                abbreviate(&c.arguments_json, SHOWN_ARGS)
            ));
        }
        let text = shown_text(m);
        let sep = if calls.is_empty() { "" } else { " |" };
        line(format!(
            "{i:>4} {:<9} {:>6} {flags}{calls}{sep} {text}",
            role_name(m.role),
            m.tokens
        ));
    }
    // No trailing spaces: the text of an empty message would leave one.
    out.lines()
        .map(str::trim_end)
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

fn policy_text(p: &pb::RenderPolicy) -> String {
    let mut parts = Vec::new();
    let mut field = |name: &str, value: u32| {
        if value != 0 {
            parts.push(format!("{name} {value}"));
        }
    };
    field("max_tool_result_chars", p.max_tool_result_chars);
    field("recent_tool_result_chars", p.recent_tool_result_chars);
    field("microcompact_first", p.microcompact_first);
    field("microcompact_every", p.microcompact_every);
    field("microcompact_keep", p.microcompact_keep);
    field("idle_minutes", p.idle_minutes);
    field("retain_turns", p.retain_turns);
    if let Some(snip) = p.snip {
        parts.push(format!("snip {snip}"));
    }
    if p.reactive {
        parts.push("reactive".into());
    }
    if p.microcompact == pb::MicrocompactMode::OverBudget as i32 {
        parts.push("microcompact MICROCOMPACT_MODE_OVER_BUDGET".into());
    }
    if let Some(v) = p.clear_at_least_tokens {
        parts.push(format!("clear_at_least_tokens {v}"));
    }
    if let Some(v) = p.max_tool_input_chars {
        parts.push(format!("max_tool_input_chars {v}"));
    }
    parts.push("(the rest default)".into());
    parts.join(", ")
}

// ---------------------------------------------------------------- the files

fn golden_path(file: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("testdata/golden")
        .join(file)
}

/// Compares `actual` with `testdata/golden/<file>`, or rewrites the file with `UPDATE_GOLDEN=1`.
#[track_caller]
fn compare_golden(file: &str, actual: &str) {
    let path = golden_path(file);
    if std::env::var("UPDATE_GOLDEN").is_ok_and(|v| v == "1") {
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("create testdata/golden");
        std::fs::write(&path, actual).unwrap_or_else(|e| panic!("write {file}: {e}"));
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| {
            panic!(
                "testdata/golden/{file}: {e}; create it with \
                 `UPDATE_GOLDEN=1 cargo test --test api golden`"
            )
        })
        .replace("\r\n", "\n");
    if expected == actual {
        return;
    }
    let mut diff = String::new();
    let (old, new): (Vec<&str>, Vec<&str>) = (expected.lines().collect(), actual.lines().collect());
    let mut shown = 0;
    for i in 0..old.len().max(new.len()) {
        let (o, n) = (old.get(i), new.get(i));
        if o != n && shown < 12 {
            diff.push_str(&format!(
                "line {}:\n  - {}\n  + {}\n",
                i + 1,
                o.unwrap_or(&"<none>"),
                n.unwrap_or(&"<none>")
            ));
            shown += 1;
        }
    }
    panic!(
        "testdata/golden/{file} differs ({} lines expected, {} rendered); first differences:\n\
         {diff}If the change is intended, run `UPDATE_GOLDEN=1 cargo test --test api golden` \
         and review the diff.",
        old.len(),
        new.len()
    );
}
