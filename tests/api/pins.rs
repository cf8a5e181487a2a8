//! Pinned context through the real server: pins survive every budget step and every summary,
//! count toward the budget, and are recorded as events, never by rewriting a node.

use ctxd::api::pb::{self, render_request::Target};
use tonic::Code;

use crate::helpers::*;

fn pinned(mut node: pb::NodeInput) -> pb::NodeInput {
    node.pinned = true;
    node
}

fn window(history: u32) -> pb::Budget {
    pb::Budget {
        context_window: history + 500,
        output_reserve: 500,
        ..Default::default()
    }
}

async fn pin(app: &mut TestApp, s: &str, ids: &[&str]) -> Result<pb::PinResponse, tonic::Status> {
    app.client
        .pin(pb::PinRequest {
            session_id: s.into(),
            node_ids: ids.iter().map(|id| id.to_string()).collect(),
        })
        .await
        .map(|r| r.into_inner())
}

async fn unpin(app: &mut TestApp, s: &str, ids: &[&str]) -> pb::PinResponse {
    app.client
        .unpin(pb::PinRequest {
            session_id: s.into(),
            node_ids: ids.iter().map(|id| id.to_string()).collect(),
        })
        .await
        .expect("Unpin")
        .into_inner()
}

async fn render_under(
    app: &mut TestApp,
    s: &str,
    budget: pb::Budget,
    policy: Option<pb::RenderPolicy>,
) -> pb::RenderResponse {
    app.render(pb::RenderRequest {
        budget: Some(budget),
        policy,
        now_unix_ms: 1,
        ..render_req(s, Target::Branch("main".into()))
    })
    .await
}

fn is_summary(m: &pb::RenderedMessage) -> bool {
    text_of(&m.parts).starts_with("[Summary of the earlier conversation")
}

/// `n` turns of a `read_file` call and a 3,000-character result; the pinned turn's result is
/// appended pinned. Node ids by turn.
async fn reads(app: &mut TestApp, s: &str, n: usize, pin_turn: Option<usize>) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for t in 0..n {
        let id = format!("c{t}");
        let result = tool_result(&id, &big_text(3000, &format!("plan file {t}")));
        out.push(
            app.append(
                s,
                vec![
                    user(&format!("request {t}")),
                    assistant_calls("", vec![call(&id, "read_file", r#"{"path":"PLAN.md"}"#)]),
                    if pin_turn == Some(t) {
                        pinned(result)
                    } else {
                        result
                    },
                    assistant(&format!("answer {t}")),
                ],
            )
            .await
            .node_ids,
        );
    }
    out
}

#[tokio::test]
async fn a_pinned_result_survives_every_budget_step() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    let t = reads(&mut app, &s, 30, Some(0)).await;
    let pinned_result = &t[0][2];
    let policies = [
        None,
        Some(pb::RenderPolicy {
            microcompact: pb::MicrocompactMode::OverBudget as i32,
            ..Default::default()
        }),
        Some(pb::RenderPolicy {
            reactive: true,
            ..Default::default()
        }),
        Some(pb::RenderPolicy {
            max_tool_result_chars: 100,
            recent_tool_result_chars: 100,
            ..Default::default()
        }),
    ];
    for policy in policies {
        // Small enough that results are cut, cleared and turns snipped.
        let r = render_under(&mut app, &s, window(4000), policy).await;
        let report = r.report.clone().expect("report");
        assert!(
            report.results_cleared + report.results_truncated + report.turns_snipped > 0,
            "{policy:?}: {report:?}"
        );
        let m = r
            .messages
            .iter()
            .find(|m| m.node_ids.contains(pinned_result))
            .unwrap_or_else(|| panic!("{policy:?}: the pinned result renders"));
        assert!(m.pinned && !m.cleared && !m.truncated, "{policy:?}: {m:?}");
        assert!(text_of(&m.parts).starts_with("plan file 0") && text_of(&m.parts).len() == 3000);
        // Its call renders before it: the pair is whole.
        assert!(
            r.messages
                .iter()
                .any(|m| m.tool_calls.iter().any(|c| c.call_id == "c0"))
        );
        assert!(report.pinned_tokens >= m.tokens, "{report:?}");
        assert_eq!(&report.pinned_node_ids, std::slice::from_ref(pinned_result));
        assert!(!report.snipped_node_ids.contains(pinned_result));
        assert!(!report.pins_exceed_budget);
    }
}

#[tokio::test]
async fn pins_are_events_on_immutable_nodes() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    let ids = app
        .append(
            &s,
            vec![user("never touch vendor/"), assistant("understood")],
        )
        .await
        .node_ids;
    let hash_before = app.get_nodes(&s, &ids).await[0].hash.clone();
    let after = pin(&mut app, &s, &[&ids[0]]).await.expect("Pin");
    assert_eq!(after.pinned_ids, [ids[0].clone()]);
    // Idempotent.
    assert_eq!(
        pin(&mut app, &s, &[&ids[0]]).await.expect("Pin").pinned_ids,
        [ids[0].clone()]
    );
    let nodes = app.get_nodes(&s, &ids).await;
    assert!(nodes[0].pinned && !nodes[1].pinned);
    assert_eq!(nodes[0].hash, hash_before);
    let log = app.log(&s, "main").await;
    assert!(log.iter().any(|n| n.node_id == ids[0] && n.pinned));
    let after = unpin(&mut app, &s, &[&ids[0]]).await;
    assert!(after.pinned_ids.is_empty());
    assert!(!app.get_nodes(&s, &ids).await[0].pinned);

    // Bad input names its field and records nothing.
    assert_status(
        pin(&mut app, &s, &[]).await,
        Code::InvalidArgument,
        "node_ids",
    );
    assert_status(
        pin(&mut app, &s, &["nope"]).await,
        Code::InvalidArgument,
        "node_ids[0]",
    );
    let unknown = unknown_id();
    assert_status(
        pin(&mut app, &s, &[&ids[1], &unknown]).await,
        Code::NotFound,
        "node_ids[1]",
    );
    let other = app.create_session().await;
    assert_status(
        pin(&mut app, &other, &[&ids[1]]).await,
        Code::NotFound,
        "node_ids[0]",
    );
    assert_status(
        pin(&mut app, &unknown_id(), &[&ids[1]]).await,
        Code::NotFound,
        "session",
    );
    assert!(
        !app.get_nodes(&s, &ids).await[1].pinned,
        "a refused call pins nothing"
    );
}

#[tokio::test]
async fn a_pinned_node_shows_verbatim_before_the_summary_that_covers_it() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    let rule = app
        .append(&s, vec![pinned(user("Project rule: never touch vendor/."))])
        .await
        .node_ids[0]
        .clone();
    let t = reads(&mut app, &s, 4, None).await;
    // A pinned result in the covered range comes back with its call.
    pin(&mut app, &s, &[&t[1][2]]).await.expect("Pin");
    let plan = app
        .client
        .prepare_compaction(pb::PrepareCompactionRequest {
            session_id: s.clone(),
            budget: Some(window(2000)),
            ..Default::default()
        })
        .await
        .expect("PrepareCompaction")
        .into_inner();
    assert!(plan.needed && plan.covers_ids.contains(&rule), "{plan:?}");
    let covers = plan.covers_ids.clone();
    let outcome = app
        .commit_summary(&plan.compaction_id, "Read the plan twice.")
        .await;
    assert!(outcome.applied, "{outcome:?}");
    let r = render_under(&mut app, &s, window(2000), None).await;
    let lines = transcript(&r.messages);
    // Right before the summary, in their order: the rule, then the pinned result's exchange.
    // They do not change when a summary is made or rolled over, so the cached prefix of the
    // request after a compaction reaches through them.
    assert_eq!(
        text_of(&r.messages[0].parts),
        "Project rule: never touch vendor/."
    );
    assert!(r.messages[0].pinned);
    assert_eq!(r.messages[1].node_ids, [t[1][1].clone()]);
    assert_eq!(r.messages[2].node_ids, [t[1][2].clone()]);
    assert!(r.messages[2].pinned && !r.messages[2].cleared);
    assert!(is_summary(&r.messages[3]), "{lines:#?}");
    // Then the retained turns.
    assert!(
        text_of(&r.messages[4].parts).starts_with("request "),
        "{lines:#?}"
    );
    assert!(
        r.messages[4..]
            .iter()
            .flat_map(|m| &m.node_ids)
            .all(|id| !covers.contains(id))
    );
    // The documents a provider gets are valid.
    for format in [pb::Format::OpenaiChat, pb::Format::AnthropicMessages] {
        let doc = app
            .render(pb::RenderRequest {
                budget: Some(window(2000)),
                format: format as i32,
                now_unix_ms: 1,
                ..render_req(&s, Target::Branch("main".into()))
            })
            .await
            .messages_json;
        let doc: serde_json::Value = serde_json::from_str(&doc).expect("JSON");
        let checked = match format {
            pb::Format::OpenaiChat => crate::provider_rules::check_openai(&doc),
            _ => crate::provider_rules::check_anthropic(&doc),
        };
        assert_eq!(checked, Ok(()), "{doc}");
    }
    assert!(r.report.expect("report").pinned_tokens > 0);
    // tokens_after counted the pins: rendered as compaction measures (budget reduction only),
    // the branch now is what commit measured.
    let measured = render_under(
        &mut app,
        &s,
        window(2000),
        Some(pb::RenderPolicy {
            microcompact: pb::MicrocompactMode::OverBudget as i32,
            max_tool_result_chars: 4000,
            microcompact_first: u32::MAX,
            snip: Some(false),
            ..Default::default()
        }),
    )
    .await
    .report
    .expect("report");
    assert!(measured.pinned_tokens > 0);
    assert_eq!(measured.total_tokens, outcome.tokens_after);

    // Unpinned, the rule is only in the summary's range.
    unpin(&mut app, &s, &[&rule, &t[1][2]]).await;
    let r = render_under(&mut app, &s, window(2000), None).await;
    assert!(is_summary(&r.messages[0]));
    assert!(text_of(&r.messages[1].parts).starts_with("request "));
    assert!(r.messages.iter().all(|m| !m.pinned));
}

#[tokio::test]
async fn pins_larger_than_the_budget_are_reported_not_dropped() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    let mut ids = Vec::new();
    for t in 0..3 {
        ids.extend(
            app.append(
                &s,
                vec![
                    pinned(user(&big_text(2000, &format!("standing instruction {t}")))),
                    assistant("ok"),
                ],
            )
            .await
            .node_ids,
        );
    }
    let r = render_under(&mut app, &s, window(600), None).await;
    let report = r.report.expect("report");
    assert!(report.pins_exceed_budget && !report.fits, "{report:?}");
    assert_eq!(report.pinned_node_ids.len(), 3);
    for t in 0..3 {
        assert!(
            r.messages
                .iter()
                .any(|m| m.node_ids == [ids[2 * t].clone()])
        );
    }
}

#[tokio::test]
async fn a_retry_must_repeat_its_pins() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    let req = |pin: bool| pb::AppendRequest {
        idempotency_key: "k1".into(),
        ..append_req(&s, vec![if pin { pinned(user("x")) } else { user("x") }])
    };
    let first = app.try_append(req(true)).await.expect("Append");
    assert_eq!(app.try_append(req(true)).await.expect("retry"), first);
    assert_status(
        app.try_append(req(false)).await,
        Code::FailedPrecondition,
        "idempotency_key",
    );
    assert!(app.get_nodes(&s, &first.node_ids).await[0].pinned);
}
