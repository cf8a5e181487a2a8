//! Rendering under a token budget through the real server: reduction, microcompact, snip, the
//! report, and `ContextStats`.

use ctxd::api::pb::{self, render_request::Target};
use tonic::Code;

use crate::helpers::*;

fn budget(history: u32) -> pb::Budget {
    pb::Budget {
        context_window: history + 1000,
        output_reserve: 1000,
        ..Default::default()
    }
}

fn budgeted(session: &str, history: u32, policy: Option<pb::RenderPolicy>) -> pb::RenderRequest {
    pb::RenderRequest {
        budget: Some(budget(history)),
        policy,
        ..render_req(session, Target::Branch("main".into()))
    }
}

fn report_of(r: &pb::RenderResponse) -> &pb::ContextReport {
    r.report.as_ref().expect("a render carries its report")
}

/// Appends `turns` turns, each a user request, `results` tool calls answered with `size`
/// characters, and a closing answer. Returns the node ids of each turn's user message.
async fn turns(
    app: &mut TestApp,
    s: &str,
    turns: usize,
    results: usize,
    size: usize,
) -> Vec<String> {
    let mut users = Vec::new();
    for t in 0..turns {
        let mut nodes = vec![user(&format!("request {t}"))];
        let calls = (0..results)
            .map(|r| call(&format!("t{t}r{r}"), "read_file", r#"{"path":"x"}"#))
            .collect();
        nodes.push(assistant_calls(&format!("reading for {t}"), calls));
        for r in 0..results {
            nodes.push(tool_result(
                &format!("t{t}r{r}"),
                &big_text(size, &format!("t{t}r{r}")),
            ));
        }
        nodes.push(assistant(&format!("done with {t}")));
        users.push(app.append(s, nodes).await.node_ids[0].clone());
    }
    users
}

#[tokio::test]
async fn a_budget_that_leaves_nothing_is_invalid() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    let request = pb::RenderRequest {
        budget: Some(pb::Budget {
            context_window: 8000,
            output_reserve: 4000,
            system_tokens: 3000,
            tools_tokens: 1000,
            schema_tokens: 0,
        }),
        ..render_req(&s, Target::Branch("main".into()))
    };
    let err = app.try_render(request).await.expect_err("no room left");
    assert_eq!(err.code(), Code::InvalidArgument);
    for part in [
        "budget",
        "context_window",
        "output_reserve",
        "system_tokens",
        "tools_tokens",
    ] {
        assert!(
            err.message().contains(part),
            "{part} in {:?}",
            err.message()
        );
    }
    let stats = app
        .client
        .context_stats(pb::ContextStatsRequest {
            session_id: s,
            budget: Some(pb::Budget::default()),
            ..Default::default()
        })
        .await;
    assert_status(stats, Code::InvalidArgument, "budget");
}

#[tokio::test]
async fn oversized_tool_results_keep_their_head_and_tail() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    let output: String = (0..10_000)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    let appended = app
        .append(
            &s,
            vec![
                user("show me"),
                assistant_calls("", vec![call("c1", "cat", "{}")]),
                tool_result("c1", &output),
                assistant("read it"),
            ],
        )
        .await;

    let plain = app.render_branch(&s, "main").await;
    assert_eq!(
        text_of(&plain.messages[2].parts),
        output,
        "no budget, no cut"
    );
    assert!(!plain.messages[2].truncated);

    // A result newer than the last step is whole by default: it is cut only at a step.
    let r = app.render(budgeted(&s, 100_000, None)).await;
    assert!(!r.messages[2].truncated);
    assert_eq!(text_of(&r.messages[2].parts), output);

    let policy = pb::RenderPolicy {
        recent_tool_result_chars: 4000,
        ..Default::default()
    };
    let r = app.render(budgeted(&s, 100_000, Some(policy))).await;
    let result = &r.messages[2];
    assert!(result.truncated);
    let text = text_of(&result.parts);
    assert!(text.starts_with(&output[..2400]), "the first 60% of 4000");
    assert!(
        text.ends_with(&output[10_000 - 1600..]),
        "the last 40% of 4000"
    );
    // The marker names the result by the head of its node's hash, for Recall.
    let node_hash = app.get_nodes(&s, &appended.node_ids[2..3]).await[0]
        .hash
        .clone();
    assert!(
        text.contains(&format!(
            "[… 6000 of 10000 characters cut: recall {} …]",
            &node_hash[..12]
        )),
        "{text}"
    );
    let report = report_of(&r);
    assert_eq!(report.results_truncated, 1);
    assert_eq!(
        report.truncated_node_ids,
        vec![appended.node_ids[2].clone()]
    );
    assert!(report.fits);
    assert!(report.tokens.expect("breakdown").markers > 0);
    let saved = report.saved_truncation.expect("savings");
    assert_eq!(
        (saved.items, saved.chars),
        (1, 10_000 - text.chars().count() as u64)
    );

    // ctxd's first policy cuts every result at 4000, and a smaller cap cuts more.
    let first = pb::RenderPolicy {
        microcompact: pb::MicrocompactMode::OverBudget as i32,
        ..Default::default()
    };
    let r = app.render(budgeted(&s, 100_000, Some(first))).await;
    assert!(text_of(&r.messages[2].parts).contains("[… 6000 of 10000 characters cut: recall "));
    let policy = pb::RenderPolicy {
        recent_tool_result_chars: 1000,
        ..Default::default()
    };
    let r = app.render(budgeted(&s, 100_000, Some(policy))).await;
    assert!(text_of(&r.messages[2].parts).contains("[… 9000 of 10000 characters cut: recall "));
}

#[tokio::test]
async fn over_budget_snips_whole_oldest_turns_and_says_so() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    let users = turns(&mut app, &s, 6, 1, 3000).await;
    let full = app.render_branch(&s, "main").await;
    let per_turn = full.total_tokens / 6;

    let r = app.render(budgeted(&s, per_turn * 3, None)).await;
    let report = report_of(&r);
    assert!(report.fits, "{report:?}");
    assert!(report.total_tokens <= report.history_budget);
    assert!(report.turns_snipped >= 3, "{report:?}");
    assert_eq!(
        report.results_cleared, 0,
        "fewer than 50 results: no microcompact"
    );
    // Whole turns go, oldest first: what remains starts at a user message, and the newest
    // turns are all there.
    let first = &r.messages[0];
    assert_eq!(first.role, pb::Role::User as i32);
    let remaining = 6 - report.turns_snipped as usize;
    assert_eq!(first.node_ids[0], users[6 - remaining]);
    assert_eq!(r.messages.len(), remaining * 4);
    // Every dropped node is named.
    let shown: Vec<&String> = r.messages.iter().flat_map(|m| &m.node_ids).collect();
    for m in &full.messages {
        for id in &m.node_ids {
            assert_ne!(
                shown.contains(&id),
                report.snipped_node_ids.contains(id),
                "node {id} is either shown or reported snipped"
            );
        }
    }
    // Snip off: nothing dropped, and the report says it does not fit.
    let policy = pb::RenderPolicy {
        snip: Some(false),
        ..Default::default()
    };
    let r = app.render(budgeted(&s, per_turn * 3, Some(policy))).await;
    assert_eq!(report_of(&r).turns_snipped, 0);
    assert!(!report_of(&r).fits);
}

#[tokio::test]
async fn a_newest_turn_larger_than_the_budget_asks_for_a_summary() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    turns(&mut app, &s, 3, 2, 3000).await;
    let r = app.render(budgeted(&s, 500, None)).await;
    let report = report_of(&r);
    assert!(!report.fits);
    assert!(report.summary_needed);
    assert_eq!(report.over_by, report.total_tokens - report.history_budget);
    // Everything droppable went; the newest turn stayed whole.
    assert_eq!(report.turns_snipped, 2);
    assert_eq!(r.messages.len(), 5);
    assert_eq!(text_of(&r.messages[0].parts), "request 2");
}

/// `calls` model calls after one request, each reading one result of `size` characters.
async fn calls(app: &mut TestApp, s: &str, calls: usize, size: usize) {
    app.append(s, vec![user("read the files")]).await;
    for i in 0..calls {
        let id = format!("r{i}");
        app.append(
            s,
            vec![
                assistant_calls("", vec![call(&id, "read_file", r#"{"path":"x"}"#)]),
                tool_result(&id, &big_text(size, &id)),
            ],
        )
        .await;
    }
}

#[tokio::test]
async fn microcompact_clears_old_results_in_steps() {
    let mut app = spawn_app().await;
    let policy = pb::RenderPolicy {
        microcompact_keep: 2,
        clear_at_least_tokens: Some(0),
        ..Default::default()
    };
    // A short session never steps: it ends before any rewrite of its cached tail pays back.
    let short = app.create_session().await;
    calls(&mut app, &short, 6, 2000).await;
    let r = app.render(budgeted(&short, 1_000_000, Some(policy))).await;
    assert_eq!(report_of(&r).microcompact_trigger, "");
    assert_eq!(report_of(&r).results_cleared, 0);

    // 40 calls of 2000 characters each: the steps come, far under budget, once each pays back
    // with the odds the policy asks for.
    let s = app.create_session().await;
    calls(&mut app, &s, 40, 2000).await;
    let r = app.render(budgeted(&s, 1_000_000, Some(policy))).await;
    let report = report_of(&r);
    assert!(report.fits);
    assert_eq!(report.microcompact_trigger, "count");
    assert!(report.payback_calls >= 1);
    assert!(
        report.payback_calls as usize * ctxd::render::PAYBACK_ODDS <= 40,
        "{report:?}"
    );
    let boundary = report.microcompact_boundary as usize;
    assert!((1..=38).contains(&boundary), "{report:?}");
    assert_eq!(report.results_cleared as usize, boundary);
    let results: Vec<&pb::RenderedMessage> = r
        .messages
        .iter()
        .filter(|m| m.role == pb::Role::Tool as i32)
        .collect();
    // The oldest `boundary` are cleared, the rest are whole, the newest two among them.
    assert!(results[..boundary].iter().all(|m| m.cleared));
    assert!(
        results[boundary..]
            .iter()
            .all(|m| !m.cleared && !m.truncated)
    );
    let placeholder = text_of(&results[0].parts);
    assert!(
        placeholder.starts_with("[cleared to save context: recall ") && placeholder.len() == 46,
        "{placeholder}"
    );
    // The placeholders keep their pairing fields.
    assert!(
        results[..boundary]
            .iter()
            .all(|m| !m.tool_call_id.is_empty() && m.name == "read_file")
    );
    let saved = report.saved_clearing.expect("savings");
    assert_eq!(saved.items as usize, boundary);
    assert!(saved.tokens as usize >= boundary * 400, "{saved:?}");
    // Stable prefix: up to the assistant message holding the first call the next step may
    // change.
    let first_open = r
        .messages
        .iter()
        .position(|m| m.role == pb::Role::Tool as i32 && !m.cleared)
        .expect("an uncleared result");
    let call_at = r.messages[..first_open]
        .iter()
        .rposition(|m| m.role == pb::Role::Assistant as i32)
        .expect("its call");
    assert_eq!(report.stable_prefix_messages as usize, call_at);

    // One more call: whether or not it steps, what came before the stable prefix holds.
    app.append(
        &s,
        vec![
            assistant_calls("", vec![call("x", "read_file", "{}")]),
            tool_result("x", &big_text(2000, "x")),
        ],
    )
    .await;
    let next = app.render(budgeted(&s, 1_000_000, Some(policy))).await;
    assert!(report_of(&next).microcompact_boundary as usize >= boundary);
    let stable = report.stable_prefix_messages as usize;
    assert_eq!(next.messages[..stable], r.messages[..stable]);

    // ctxd's first policy clears nothing while the context fits.
    let first = pb::RenderPolicy {
        microcompact: pb::MicrocompactMode::OverBudget as i32,
        ..policy
    };
    let r = app.render(budgeted(&s, 1_000_000, Some(first))).await;
    assert_eq!(report_of(&r).results_cleared, 0);
    assert_eq!(report_of(&r).microcompact_trigger, "");
}

#[tokio::test]
async fn old_tool_inputs_are_stubbed_at_a_step() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    let body = "line of a file body\n".repeat(50);
    let write = |i: usize| {
        serde_json::json!({"file_path": format!("/src/lib/module_{i}.ex"), "content": body})
            .to_string()
    };
    app.append(&s, vec![user("write the modules")]).await;
    for i in 0..25 {
        let id = format!("w{i}");
        app.append(
            &s,
            vec![
                assistant_calls("", vec![call(&id, "Write", &write(i))]),
                tool_result(&id, &big_text(2000, "ok")),
            ],
        )
        .await;
    }
    let policy = pb::RenderPolicy {
        microcompact_keep: 2,
        clear_at_least_tokens: Some(0),
        recent_tool_input_chars: Some(u32::MAX),
        ..Default::default()
    };
    // 25 results: a step that pays back clears the oldest and stubs the calls it passed, the
    // two it keeps included.
    let r = app.render(budgeted(&s, 1_000_000, Some(policy))).await;
    let report = report_of(&r);
    assert_eq!(report.microcompact_trigger, "count");
    let step = report.microcompact_boundary as usize + 2;
    assert!((3..=25).contains(&step), "{report:?}");
    assert_eq!(report.inputs_stubbed as usize, step);
    assert_eq!(report.stubbed_node_ids.len(), step);
    assert_eq!(report.saved_stubbing.expect("savings").items as usize, step);
    let calls: Vec<&pb::RenderedMessage> = r
        .messages
        .iter()
        .filter(|m| !m.tool_calls.is_empty())
        .collect();
    for (i, m) in calls.iter().enumerate() {
        let args: serde_json::Value =
            serde_json::from_str(&m.tool_calls[0].arguments_json).expect("valid JSON");
        assert_eq!(
            args["file_path"],
            format!("/src/lib/module_{i}.ex"),
            "the path stays"
        );
        let content = args["content"].as_str().expect("a string");
        if i < step {
            assert_eq!(m.inputs_stubbed, 1);
            assert!(content.contains("chars elided: recall "), "{content}");
        } else {
            assert_eq!(m.inputs_stubbed, 0);
            assert_eq!(content, body, "calls after the step are whole");
        }
        assert_eq!(m.tool_calls[0].call_id, format!("w{i}"));
    }
    // By default a call's arguments over 500 characters are stubbed from its first send-back:
    // those after the step too, each naming its message for Recall.
    let policy = pb::RenderPolicy {
        microcompact_keep: 2,
        clear_at_least_tokens: Some(0),
        ..Default::default()
    };
    let r = app.render(budgeted(&s, 1_000_000, Some(policy))).await;
    assert_eq!(report_of(&r).inputs_stubbed, 25);
    let newest = r
        .messages
        .iter()
        .rev()
        .find(|m| !m.tool_calls.is_empty())
        .expect("the newest call");
    let hash = app.get_nodes(&s, &newest.node_ids).await[0].hash.clone();
    assert!(
        newest.tool_calls[0]
            .arguments_json
            .contains(&format!("chars elided: recall {}]", &hash[..12])),
        "{}",
        newest.tool_calls[0].arguments_json
    );
}

#[tokio::test]
async fn an_idle_gap_triggers_microcompact_and_the_server_fills_now() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    turns(&mut app, &s, 3, 2, 2000).await;
    let head_time = app.log(&s, "main").await[0].created_at_unix_ms;
    let policy = pb::RenderPolicy {
        microcompact_keep: 1,
        retain_turns: 1,
        snip: Some(false),
        ..Default::default()
    };
    let at = |now: i64| pb::RenderRequest {
        now_unix_ms: now,
        ..budgeted(&s, 1500, Some(policy))
    };

    let fresh = app.render(at(head_time + 60_000)).await;
    assert_eq!(report_of(&fresh).microcompact_trigger, "");
    assert_eq!(report_of(&fresh).results_cleared, 0);

    let idle = app.render(at(head_time + 91 * 60_000)).await;
    assert_eq!(report_of(&idle).microcompact_trigger, "idle");
    // 6 results, keep 1: results age by count, so five go.
    assert_eq!(report_of(&idle).results_cleared, 5);

    // ctxd's first policy protects the newest turn's two.
    let first = pb::RenderPolicy {
        microcompact: pb::MicrocompactMode::OverBudget as i32,
        ..policy
    };
    let idle = app
        .render(pb::RenderRequest {
            now_unix_ms: head_time + 91 * 60_000,
            ..budgeted(&s, 1500, Some(first))
        })
        .await;
    assert_eq!(report_of(&idle).results_cleared, 4);

    // Without now, the server's clock: the session was just written, so it is not idle.
    let now = app.render(at(0)).await;
    assert_eq!(report_of(&now).microcompact_trigger, "");
}

#[tokio::test]
async fn reactive_clears_everything_but_the_newest_turn() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    turns(&mut app, &s, 3, 2, 500).await;
    let policy = pb::RenderPolicy {
        reactive: true,
        ..Default::default()
    };
    // Even though everything fits, the provider said otherwise.
    let r = app.render(budgeted(&s, 1_000_000, Some(policy))).await;
    assert_eq!(report_of(&r).microcompact_trigger, "reactive");
    assert_eq!(report_of(&r).results_cleared, 4);
    assert!(r.messages.iter().rev().take(4).all(|m| !m.cleared));
}

#[tokio::test]
async fn context_stats_is_the_render_report() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    turns(&mut app, &s, 5, 2, 3000).await;
    for tokenizer in ["heuristic", "o200k_base", "cl100k_base"] {
        for history in [800, 5000, 1_000_000] {
            let r = app
                .render(pb::RenderRequest {
                    tokenizer: tokenizer.into(),
                    now_unix_ms: 1,
                    ..budgeted(&s, history, None)
                })
                .await;
            let stats = app
                .client
                .context_stats(pb::ContextStatsRequest {
                    session_id: s.clone(),
                    target: Some(pb::context_stats_request::Target::Branch("main".into())),
                    tokenizer: tokenizer.into(),
                    budget: Some(budget(history)),
                    now_unix_ms: 1,
                    ..Default::default()
                })
                .await
                .expect("ContextStats")
                .into_inner();
            assert_eq!(report_of(&r), &stats, "{tokenizer} {history}");
            let sum: u32 = r.messages.iter().map(|m| m.tokens).sum();
            assert_eq!(stats.total_tokens, sum);
            assert_eq!(r.total_tokens, sum);
        }
    }
}

#[tokio::test]
async fn observations_sent_as_user_messages_are_tool_output() {
    // mini-swe-agent's shape: the action is a fenced command in the assistant's text, its
    // output comes back as a user message. The steps treat it as the tool result it is.
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    app.append(&s, vec![user("Fix the failing test in tests/test_x.py.")])
        .await;
    let n = 40;
    for i in 0..n {
        let output = format!(
            "<returncode>0</returncode>\n<output>\n{}</output>",
            big_text(2000, &format!("out{i}"))
        );
        app.append(
            &s,
            vec![
                assistant(&format!("THOUGHT: step {i}.\n\n```bash\ncat f{i}.py\n```")),
                user(&output),
            ],
        )
        .await;
    }
    let policy = pb::RenderPolicy {
        microcompact_keep: 2,
        clear_at_least_tokens: Some(0),
        ..Default::default()
    };
    let r = app.render(budgeted(&s, 1_000_000, Some(policy))).await;
    let report = report_of(&r);
    assert_eq!(report.microcompact_trigger, "count", "{report:?}");
    let boundary = report.microcompact_boundary as usize;
    assert!(boundary >= 1 && boundary + 2 <= n, "{report:?}");
    let outputs: Vec<&pb::RenderedMessage> = r
        .messages
        .iter()
        .skip(1)
        .filter(|m| m.role == pb::Role::User as i32)
        .collect();
    assert_eq!(outputs.len(), n);
    // The oldest outputs are cleared, naming their node for Recall; the newest are whole.
    for (i, m) in outputs.iter().enumerate() {
        let text = text_of(&m.parts);
        if i < boundary {
            assert!(m.cleared, "output {i}");
            assert!(
                text.starts_with("[cleared to save context: recall "),
                "{text}"
            );
        } else {
            assert!(!m.cleared && text.starts_with("<returncode>0</returncode>"));
        }
    }
    let reference =
        text_of(&outputs[0].parts)["[cleared to save context: recall ".len()..][..12].to_owned();
    let recalled = app
        .client
        .recall(pb::RecallRequest {
            session_id: s.clone(),
            reference,
            max_chars: 0,
        })
        .await
        .expect("recall")
        .into_inner();
    assert!(recalled.content.starts_with("<returncode>0</returncode>"));
    // The task stays: an observation opens no turn, so the session is still one turn long.
    assert_eq!(
        text_of(&r.messages[0].parts),
        "Fix the failing test in tests/test_x.py."
    );
    assert_eq!(report.turns_snipped, 0);
}
