//! The evidence ledger through the real server: derived at prepare, stored at commit, rendered
//! after the summary text, merged through every roll, bounded without ever dropping a path; and
//! the path-survival measure on every real trace.

use std::collections::BTreeSet;

use ctxd::api::pb::{self, render_request::Target};
use ctxd::tokens::Tokenizer;

use crate::helpers::*;
use crate::traces;

const EVIDENCE: &str = "[Evidence";

fn budget(history: u32) -> pb::Budget {
    pb::Budget {
        context_window: history,
        ..Default::default()
    }
}

async fn try_prepare(
    app: &mut TestApp,
    s: &str,
    history: u32,
    segment: Option<(&str, &str)>,
) -> Result<pb::PrepareCompactionResponse, tonic::Status> {
    let (from, to) = segment.unwrap_or_default();
    app.client
        .prepare_compaction(pb::PrepareCompactionRequest {
            session_id: s.into(),
            budget: Some(budget(history)),
            tokenizer: "o200k_base".into(),
            from_node_id: from.into(),
            to_node_id: to.into(),
            ..Default::default()
        })
        .await
        .map(|r| r.into_inner())
}

async fn render_at(app: &mut TestApp, s: &str, history: u32) -> pb::RenderResponse {
    app.render(pb::RenderRequest {
        budget: Some(budget(history)),
        tokenizer: "o200k_base".into(),
        now_unix_ms: 1,
        ..render_req(s, Target::Branch("main".into()))
    })
    .await
}

fn ledger_paths(l: &pb::EvidenceLedger) -> BTreeSet<String> {
    l.files_read
        .iter()
        .chain(&l.files_modified)
        .map(|f| f.path.clone())
        .collect()
}

/// A turn that reads `path`, runs `command` (failing when `fails`), and answers.
async fn work(app: &mut TestApp, s: &str, t: usize, path: &str, command: &str, fails: bool) {
    let (read, run) = (format!("r{t}"), format!("b{t}"));
    let result = if fails {
        tool_error(
            &run,
            "Exit code 1\nerror[E0425]: cannot find value `x` in this scope",
        )
    } else {
        tool_result(&run, "Exit code 0\nok")
    };
    app.append(
        s,
        vec![
            user(&format!("step {t}: check {path}")),
            assistant_calls(
                "",
                vec![
                    call(&read, "Read", &format!(r#"{{"file_path":"{path}"}}"#)),
                    call(&run, "Bash", &format!(r#"{{"command":"{command}"}}"#)),
                ],
            ),
            tool_result(&read, &big_text(3000, &format!("contents of {path}"))),
            result,
            assistant(&format!("done with {path}")),
        ],
    )
    .await;
}

#[tokio::test]
async fn the_ledger_is_derived_at_prepare_stored_at_commit_and_rendered_after_the_text() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    work(&mut app, &s, 0, "src/lib.rs", "cargo build", false).await;
    work(&mut app, &s, 1, "./src/main.rs", "cargo test", true).await;
    for t in 2..5 {
        work(&mut app, &s, t, &format!("docs/page{t}.md"), "true", false).await;
    }
    let plan = try_prepare(&mut app, &s, 3000, None)
        .await
        .expect("prepare");
    assert!(plan.needed, "{plan:?}");
    let ledger = plan.ledger.clone().expect("a ledger");
    assert!(ledger_paths(&ledger).contains("src/lib.rs"));
    assert!(
        ledger_paths(&ledger).contains("src/main.rs"),
        "normalised: {ledger:?}"
    );
    let tools: Vec<&str> = ledger
        .files_read
        .iter()
        .flat_map(|f| &f.tools)
        .map(String::as_str)
        .collect();
    assert!(tools.contains(&"Read"));
    let failing = ledger
        .commands
        .iter()
        .find(|c| c.command == "cargo test")
        .expect("the command is kept");
    assert_eq!(failing.exit_code, Some(1));
    assert!(failing.is_error);
    assert!(
        ledger
            .errors
            .iter()
            .any(|e| e.tool == "Bash" && e.line.contains("E0425"))
    );
    assert!(
        ledger
            .user_requests
            .iter()
            .any(|u| u == "step 1: check ./src/main.rs")
    );
    assert!(
        plan.ledger_text.starts_with(EVIDENCE),
        "{}",
        plan.ledger_text
    );
    // Deterministic: preparing again derives the same ledger and text.
    let again = try_prepare(&mut app, &s, 3000, None)
        .await
        .expect("prepare");
    assert_eq!(again.ledger, plan.ledger);
    assert_eq!(again.ledger_text, plan.ledger_text);

    let outcome = app
        .commit_summary(&plan.compaction_id, "Built, one test failed.")
        .await;
    assert!(outcome.applied, "{outcome:?}");
    let stored = app.list_summaries(&s, "").await;
    assert_eq!(stored.summaries[0].ledger, plan.ledger);
    let r = render_at(&mut app, &s, 3000).await;
    let text = text_of(&r.messages[0].parts);
    let (summary, evidence) = text.split_once(EVIDENCE).expect("the ledger renders");
    assert!(summary.trim_end().ends_with("Built, one test failed."));
    assert!(format!("{EVIDENCE}{evidence}").starts_with(plan.ledger_text.trim_end()));
    for path in ledger_paths(&ledger) {
        assert!(
            ctxd::domain::paths_in(&text).contains(&path),
            "{path} in {text}"
        );
    }
}

#[tokio::test]
async fn evidence_survives_any_number_of_rolls() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    let mut seen: BTreeSet<String> = BTreeSet::new();
    for round in 0..3 {
        for t in 0..4 {
            let path = format!("src/round{round}/file{t}.rs");
            seen.insert(path.clone());
            work(
                &mut app,
                &s,
                round * 4 + t,
                &path,
                &format!("make r{round}"),
                false,
            )
            .await;
        }
        let plan = try_prepare(&mut app, &s, 3000, None)
            .await
            .expect("prepare");
        assert!(plan.needed, "{plan:?}");
        assert_eq!(plan.rolls_over_ids.len(), usize::from(round > 0));
        let outcome = app
            .commit_summary(&plan.compaction_id, &format!("Round {round}."))
            .await;
        assert!(outcome.applied, "{outcome:?}");
        let stored = app.list_summaries(&s, "").await;
        let newest = stored.summaries.last().expect("a summary");
        let kept = ledger_paths(newest.ledger.as_ref().expect("a ledger"));
        // Every file of every round so far, but those of the turns still retained verbatim.
        let retained: BTreeSet<String> = (2..4)
            .map(|t| format!("src/round{round}/file{t}.rs"))
            .collect();
        let expected: BTreeSet<String> = seen.difference(&retained).cloned().collect();
        assert!(
            expected.is_subset(&kept),
            "round {round}: {expected:?} ⊄ {kept:?}"
        );
        let r = render_at(&mut app, &s, 3000).await;
        let shown = ctxd::domain::paths_in(&text_of(&r.messages[0].parts));
        assert!(
            expected.iter().all(|p| shown.contains(p)),
            "round {round}: {shown:?}"
        );
    }
}

#[tokio::test]
async fn a_ledger_over_its_cap_degrades_by_category_and_keeps_every_path() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    let mut paths = BTreeSet::new();
    for t in 0..60 {
        let path = format!("crates/part{}/src/module_{t}.rs", t % 7);
        paths.insert(path.clone());
        work(
            &mut app,
            &s,
            t,
            &path,
            &format!("cargo test -p part{t}"),
            t % 3 == 0,
        )
        .await;
    }
    let plan = try_prepare(&mut app, &s, 4000, None)
        .await
        .expect("prepare");
    assert!(plan.needed);
    let ledger = plan.ledger.expect("a ledger");
    assert!(
        ledger.commands.len() >= 50,
        "stored whole: {}",
        ledger.commands.len()
    );
    let text = &plan.ledger_text;
    // Capped: at most an eighth of the history budget (512 of 4,000), unless paths alone
    // need more; the categories past their caps say how many more there were.
    let tokens = Tokenizer::O200kBase.count(text);
    assert!(text.contains("more"), "{text}");
    let shown: BTreeSet<String> = ctxd::domain::paths_in(text).into_iter().collect();
    let covered: BTreeSet<String> = paths
        .iter()
        .filter(|p| ledger_paths(&ledger).contains(*p))
        .cloned()
        .collect();
    assert_eq!(shown, ledger_paths(&ledger), "{text}");
    assert!(covered.len() >= 55);
    assert!(tokens <= 2000, "{tokens} tokens: {text}");
}

/// The path-survival measure: on every trace (and every raw Claude Code session file), a
/// segment summary of the oldest ~80% with a short fixed text, then a render at a 16k history budget. Every file path a tool call of the covered
/// range names must appear in the rendered context. Prints the figures docs/api.md quotes:
/// `cargo test --test api path_survival -- --nocapture`.
#[tokio::test]
async fn path_survival_on_every_trace() {
    let mut names: Vec<String> = std::fs::read_dir(traces::trace_path("x").parent().expect("dir"))
        .expect("testdata/traces")
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            name.strip_suffix(".jsonl").map(str::to_owned)
        })
        .collect();
    names.sort();
    assert!(names.len() >= 10, "{names:?}");
    let mut app = spawn_app().await;
    let counter = Tokenizer::O200kBase;
    let (mut all, mut without, mut with) = (0, 0, 0);
    println!(
        "{:<34} {:>6} {:>14} {:>14} {:>7} {:>13}",
        "trace", "paths", "without ledger", "with ledger", "ledger", "after/before"
    );
    let mut sessions: Vec<(String, String)> = Vec::new();
    for name in &names {
        sessions.push((name.clone(), traces::import(&mut app, name).await.session));
    }
    // The raw Claude Code session files too, through ImportSession as a host would send them.
    let raw = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/claude-code");
    let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(&raw)
        .expect("testdata/claude-code")
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            name.ends_with(".jsonl") && !name.contains("-agent-")
        })
        .collect();
    files.sort();
    for file in files {
        let data = std::fs::read(&file).expect("a Claude Code session file");
        let chunk = import_chunk(pb::ImportFormat::ClaudeCodeJsonl as i32, data);
        let session = app
            .client
            .import_session(tokio_stream::iter([chunk]))
            .await
            .expect("ImportSession")
            .into_inner()
            .session
            .expect("a session")
            .session_id;
        let stem = file
            .file_stem()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        sessions.push((
            format!("claude-code/{}", &stem[..stem.len().min(22)]),
            session,
        ));
    }
    for (name, s) in &sessions {
        let s = s.clone();
        let mut log = app.log(&s, "main").await;
        log.reverse();
        let start = log
            .iter()
            .position(|n| {
                !matches!(&n.content, Some(pb::NodeInput { kind: Some(pb::node_input::Kind::Message(m)), .. })
                    if m.role == pb::Role::System as i32)
            })
            .unwrap_or(0);
        // The oldest ~80%, ending where the segment is whole.
        let mut plan = None;
        for end in (start..log.len() * 8 / 10).rev() {
            if let Ok(p) = try_prepare(
                &mut app,
                &s,
                16_000,
                Some((&log[start].node_id, &log[end].node_id)),
            )
            .await
            {
                plan = Some(p);
                break;
            }
        }
        let Some(plan) = plan else {
            println!("{name:<34} no whole segment");
            continue;
        };
        let expected = named_paths(&log, &plan.covers_ids);
        let outcome = app
            .commit_summary(&plan.compaction_id, "The agent worked on the task.")
            .await;
        let r = render_at(&mut app, &s, 16_000).await;
        let texts: Vec<String> = r
            .messages
            .iter()
            .map(|m| {
                let mut t = text_of(&m.parts);
                for c in &m.tool_calls {
                    t.push_str(&c.arguments_json);
                }
                t
            })
            .collect();
        let rendered = texts.join("\n");
        let ledger_shown: BTreeSet<String> =
            ctxd::domain::paths_in(&rendered).into_iter().collect();
        let plain: String = texts
            .iter()
            .map(|t| t.split(EVIDENCE).next().unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n");
        // The ledger may name a relative path by the absolute form its result showed.
        let in_ledger = |p: &String| {
            ledger_shown
                .iter()
                .any(|l| l == p || (!p.starts_with('/') && l.ends_with(&format!("/{p}"))))
        };
        let found = |p: &String, with_ledger: bool| {
            plain.contains(p.as_str()) || (with_ledger && in_ledger(p))
        };
        let n_without = expected.iter().filter(|p| found(p, false)).count();
        let n_with = expected.iter().filter(|p| found(p, true)).count();
        let missing: Vec<&String> = expected.iter().filter(|p| !found(p, true)).collect();
        assert!(missing.is_empty(), "{name}: paths lost: {missing:?}");
        let ledger_tokens = counter.count(&plan.ledger_text);
        println!(
            "{name:<34} {:>6} {:>14} {:>14} {:>7} {:>13}",
            expected.len(),
            format!("{n_without} ({}%)", percent(n_without, expected.len())),
            format!("{n_with} ({}%)", percent(n_with, expected.len())),
            ledger_tokens,
            if outcome.applied {
                format!(
                    "{:.2}",
                    f64::from(outcome.tokens_after) / f64::from(outcome.tokens_before)
                )
            } else {
                "no gain".to_owned()
            },
        );
        all += expected.len();
        without += n_without;
        with += n_with;
    }
    println!(
        "{:<34} {all:>6} {:>14} {:>14}",
        "all",
        format!("{without} ({}%)", percent(without, all)),
        format!("{with} ({}%)", percent(with, all)),
    );
    assert_eq!(with, all);
}

fn percent(n: usize, of: usize) -> usize {
    (n * 100).checked_div(of).unwrap_or(100)
}

/// The file paths tool calls of the covered nodes name in their arguments (`file_path`, `path`,
/// `notebook_path`), read independently of the ledger's own extraction.
fn named_paths(log: &[pb::Node], covers: &[String]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for node in log.iter().filter(|n| covers.contains(&n.node_id)) {
        let Some(pb::NodeInput {
            kind: Some(pb::node_input::Kind::Message(m)),
            ..
        }) = &node.content
        else {
            continue;
        };
        for call in &m.tool_calls {
            let Ok(serde_json::Value::Object(args)) = serde_json::from_str(&call.arguments_json)
            else {
                continue;
            };
            for key in ["file_path", "path", "notebook_path"] {
                if let Some(serde_json::Value::String(p)) = args.get(key) {
                    let p = p.trim().trim_end_matches('/');
                    if !p.is_empty() {
                        out.insert(p.strip_prefix("./").unwrap_or(p).to_owned());
                    }
                }
            }
        }
    }
    out
}
