//! Segment summaries through the real server: a caller-chosen run of the path summarized in
//! place, checked whole, composing with other summaries, stale when one lands over it first.

use ctxd::api::pb::{self, render_request::Target};
use tonic::Code;

use crate::helpers::*;

/// A window large enough that no budget step other than stepped microcompact acts.
fn roomy() -> pb::Budget {
    pb::Budget {
        context_window: 1_000_000,
        output_reserve: 1000,
        ..Default::default()
    }
}

/// Turn `t`: a request, a `read_file` call on `src/file{t}.rs`, its 3,000-character result, an
/// answer. The node ids, in order.
async fn turn(app: &mut TestApp, s: &str, branch: &str, t: usize) -> Vec<String> {
    let id = format!("call-{t}");
    app.append_branch(
        s,
        branch,
        vec![
            user(&format!("request {t}: look at file {t}")),
            assistant_calls(
                "looking",
                vec![call(
                    &id,
                    "read_file",
                    &format!(r#"{{"path":"src/file{t}.rs"}}"#),
                )],
            ),
            tool_result(&id, &big_text(3000, &format!("contents of file {t}"))),
            assistant(&format!("file {t} is fine")),
        ],
    )
    .await
    .node_ids
}

async fn turns(app: &mut TestApp, s: &str, n: usize) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for t in 0..n {
        out.push(turn(app, s, "main", t).await);
    }
    out
}

async fn try_segment(
    app: &mut TestApp,
    s: &str,
    branch: &str,
    from: &str,
    to: &str,
) -> Result<pb::PrepareCompactionResponse, tonic::Status> {
    app.client
        .prepare_compaction(pb::PrepareCompactionRequest {
            session_id: s.into(),
            branch: branch.into(),
            budget: Some(roomy()),
            from_node_id: from.into(),
            to_node_id: to.into(),
            ..Default::default()
        })
        .await
        .map(|r| r.into_inner())
}

async fn segment(
    app: &mut TestApp,
    s: &str,
    from: &str,
    to: &str,
) -> pb::PrepareCompactionResponse {
    let plan = try_segment(app, s, "main", from, to)
        .await
        .expect("PrepareCompaction of a segment");
    assert!(plan.needed, "{plan:?}");
    assert_eq!(plan.kind, pb::SummaryKind::Segment as i32);
    plan
}

async fn rendered(app: &mut TestApp, s: &str, branch: &str) -> pb::RenderResponse {
    app.render(pb::RenderRequest {
        budget: Some(roomy()),
        now_unix_ms: 1,
        ..render_req(s, Target::Branch(branch.into()))
    })
    .await
}

fn is_summary(m: &pb::RenderedMessage) -> bool {
    text_of(&m.parts).starts_with("[Summary of the earlier conversation")
}

fn reason(outcome: &pb::CompactionOutcome) -> pb::CompactionReason {
    pb::CompactionReason::try_from(outcome.reason).expect("a known reason")
}

/// Where the first message holding `node` renders.
fn position(messages: &[pb::RenderedMessage], node: &str) -> usize {
    messages
        .iter()
        .position(|m| m.node_ids.iter().any(|id| id == node))
        .unwrap_or_else(|| panic!("node {node} renders"))
}

#[tokio::test]
async fn a_segment_renders_in_place_and_leaves_the_cached_prefix_byte_identical() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    // 30 results: stepped microcompact has taken the steps that pay back, so the oldest are
    // cleared. Summarizing five results after them must not move that boundary.
    let t = turns(&mut app, &s, 30).await;
    let before = rendered(&mut app, &s, "main").await;
    let report = before.report.clone().expect("report");
    let cleared = report.results_cleared;
    assert!(cleared > 0 && cleared < 22, "{report:?}");

    let (from, to) = (&t[22][0], &t[26][3]);
    let plan = segment(&mut app, &s, from, to).await;
    let covered: Vec<String> = t[22..=26].concat();
    assert_eq!(plan.covers_ids, covered);
    assert!(plan.rolls_over_ids.is_empty());
    // The input is the segment as it renders now: its five requests and five results.
    assert_eq!(plan.summary_input.len(), 20);
    assert_eq!(
        text_of(&plan.summary_input[0].parts),
        "request 22: look at file 22"
    );
    let outcome = app
        .commit_summary(&plan.compaction_id, "Files 22 to 26 are fine.")
        .await;
    assert!(outcome.applied, "{outcome:?}");
    assert!(outcome.tokens_after < outcome.tokens_before);

    let after = rendered(&mut app, &s, "main").await;
    let start = position(&before.messages, from);
    // Before the segment: byte for byte what it was, so a provider's prompt cache still hits.
    assert_eq!(after.messages[..start], before.messages[..start]);
    assert_eq!(
        after.report.as_ref().expect("report").results_cleared,
        cleared,
        "the clearing boundary did not move"
    );
    // In its place, one summary message with the text and the ledger after it.
    let summary = &after.messages[start];
    assert!(is_summary(summary), "{summary:?}");
    let text = text_of(&summary.parts);
    assert!(text.contains("Files 22 to 26 are fine."));
    assert!(text.find("Files 22 to 26").unwrap() < text.find("[Evidence").unwrap_or(usize::MAX));
    // After it: the rest, as it was.
    let end = position(&before.messages, &t[27][0]);
    assert_eq!(after.messages[start + 1..], before.messages[end..]);
    assert_eq!(after.report.expect("report").summary_ids.len(), 1);

    let audit = app.list_summaries(&s, "main").await;
    let record = &audit.summaries[0];
    assert_eq!(record.kind, pb::SummaryKind::Segment as i32);
    assert_eq!((&record.from_node_id, &record.to_node_id), (from, to));
    assert!(record.active && record.applies);
    // Non-destructive: every node is still there.
    assert_eq!(app.log(&s, "main").await.len(), 120);
}

#[tokio::test]
async fn a_segment_must_be_whole_and_on_the_path_or_nothing_is_stored() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    let t = turns(&mut app, &s, 4).await;
    // The call at t[1][1] answered by t[1][2]: a segment may not end between them.
    let split = try_segment(&mut app, &s, "main", &t[1][0], &t[1][1]).await;
    assert_status(split, Code::InvalidArgument, "to_node_id");
    let split = try_segment(&mut app, &s, "main", &t[1][1], &t[1][1]).await;
    assert_status(split, Code::InvalidArgument, &t[1][1]);
    // …nor start between them.
    let split = try_segment(&mut app, &s, "main", &t[1][2], &t[2][3]).await;
    assert_status(split, Code::InvalidArgument, "from_node_id");
    let split = try_segment(&mut app, &s, "main", &t[1][2], &t[2][3]).await;
    assert_status(split, Code::InvalidArgument, &t[1][2]);
    // From after to.
    let backwards = try_segment(&mut app, &s, "main", &t[2][0], &t[1][3]).await;
    assert_status(backwards, Code::InvalidArgument, "to_node_id");
    // Unknown, malformed, one end only.
    let unknown = try_segment(&mut app, &s, "main", &unknown_id(), &t[1][3]).await;
    assert_status(unknown, Code::InvalidArgument, "from_node_id");
    let malformed = try_segment(&mut app, &s, "main", &t[0][0], "not-an-id").await;
    assert_status(malformed, Code::InvalidArgument, "to_node_id");
    let half = try_segment(&mut app, &s, "main", &t[0][0], "").await;
    assert_status(half, Code::InvalidArgument, "to_node_id");
    let half = try_segment(&mut app, &s, "main", "", &t[0][0]).await;
    assert_status(half, Code::InvalidArgument, "from_node_id");
    // A node of another session is not on this one's path.
    let other = app.create_session().await;
    let theirs = turn(&mut app, &other, "main", 0).await;
    let foreign = try_segment(&mut app, &s, "main", &theirs[0], &theirs[3]).await;
    assert_status(foreign, Code::InvalidArgument, "from_node_id");
    // A node only on another branch is off this branch's path.
    app.create_branch(&s, "side", &t[1][3]).await;
    let side = turn(&mut app, &s, "side", 9).await;
    let off_path = try_segment(&mut app, &s, "main", &side[0], &side[3]).await;
    assert_status(off_path, Code::InvalidArgument, "from_node_id");
    // A deleted branch.
    app.client
        .delete_branch(delete_branch_req(&s, "side"))
        .await
        .expect("DeleteBranch");
    let gone = try_segment(&mut app, &s, "side", &side[0], &side[3]).await;
    assert_status(gone, Code::NotFound, "side");
    // None of that stored a plan or an event.
    let audit = app.list_summaries(&s, "main").await;
    assert!(
        audit.summaries.is_empty() && audit.events.is_empty(),
        "{audit:?}"
    );
}

#[tokio::test]
async fn disjoint_segments_compose_and_a_rolling_summary_rolls_them_over() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    let t = turns(&mut app, &s, 6).await;
    let a = segment(&mut app, &s, &t[1][0], &t[1][3]).await;
    let b = segment(&mut app, &s, &t[3][0], &t[3][3]).await;
    // Prepared side by side, committed one after the other: disjoint, so both apply.
    assert!(
        app.commit_summary(&a.compaction_id, "Turn one: fine.")
            .await
            .applied
    );
    assert!(
        app.commit_summary(&b.compaction_id, "Turn three: fine.")
            .await
            .applied
    );
    let r = rendered(&mut app, &s, "main").await;
    let lines = transcript(&r.messages);
    let summaries: Vec<usize> = r
        .messages
        .iter()
        .enumerate()
        .filter(|(_, m)| is_summary(m))
        .map(|(i, _)| i)
        .collect();
    // Turn 0, summary A, turn 2, summary B, turns 4 and 5.
    assert_eq!(summaries, [4, 9], "{lines:#?}");
    assert_eq!(r.report.expect("report").summary_ids.len(), 2);
    let audit = app.list_summaries(&s, "main").await;
    assert!(audit.summaries.iter().all(|s| s.active), "{audit:?}");

    // A rolling summary over everything older than the newest two turns takes both in.
    let rolling = app
        .client
        .prepare_compaction(pb::PrepareCompactionRequest {
            session_id: s.clone(),
            budget: Some(pb::Budget {
                context_window: 3000,
                output_reserve: 500,
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .expect("PrepareCompaction")
        .into_inner();
    assert!(rolling.needed, "{rolling:?}");
    assert_eq!(rolling.kind, pb::SummaryKind::Rolling as i32);
    let a_id = &audit.summaries[0].summary_id;
    let b_id = &audit.summaries[1].summary_id;
    assert_eq!(rolling.rolls_over_ids, [a_id.clone(), b_id.clone()]);
    assert_eq!(rolling.covers_ids, t[..4].concat());
    let outcome = app
        .commit_summary(&rolling.compaction_id, "Turns 0-3: all fine.")
        .await;
    assert!(outcome.applied, "{outcome:?}");
    let r = rendered(&mut app, &s, "main").await;
    assert!(is_summary(&r.messages[0]));
    assert_eq!(r.messages.iter().filter(|m| is_summary(m)).count(), 1);
    let audit = app.list_summaries(&s, "main").await;
    let active: Vec<bool> = audit.summaries.iter().map(|s| s.active).collect();
    assert_eq!(active, [false, false, true]);
    assert_eq!(
        audit.summaries[2].rolls_over_ids,
        [a_id.clone(), b_id.clone()]
    );
    assert_eq!(audit.summaries[2].prior_summary_id, *a_id);
}

#[tokio::test]
async fn overlapping_segments_are_refused_and_a_containing_one_rolls_over() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    let t = turns(&mut app, &s, 5).await;
    let a = segment(&mut app, &s, &t[1][0], &t[2][3]).await;
    assert!(
        app.commit_summary(&a.compaction_id, "Turns 1-2.")
            .await
            .applied
    );
    let a_id = app.list_summaries(&s, "main").await.summaries[0]
        .summary_id
        .clone();
    // Partly over A: refused, naming the summary.
    let partial = try_segment(&mut app, &s, "main", &t[2][0], &t[3][3]).await;
    assert_status(partial, Code::InvalidArgument, &a_id);
    let inside = try_segment(&mut app, &s, "main", &t[2][0], &t[2][3]).await;
    assert_status(inside, Code::InvalidArgument, "overlaps");
    // Containing A whole: rolls it over, text and range.
    let wider = segment(&mut app, &s, &t[0][0], &t[3][3]).await;
    assert_eq!(wider.rolls_over_ids, std::slice::from_ref(&a_id));
    assert_eq!(wider.covers_ids, t[..4].concat());
    assert!(
        wider
            .summary_input
            .iter()
            .any(|m| text_of(&m.parts).contains("Turns 1-2.")),
        "the rolled-over summary is in the input"
    );
    let outcome = app.commit_summary(&wider.compaction_id, "Turns 0-3.").await;
    assert!(outcome.applied, "{outcome:?}");
    let r = rendered(&mut app, &s, "main").await;
    assert_eq!(r.messages.iter().filter(|m| is_summary(m)).count(), 1);
    assert!(text_of(&r.messages[0].parts).contains("Turns 0-3."));
}

#[tokio::test]
async fn a_segment_goes_stale_when_a_summary_over_its_nodes_lands_first() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    let t = turns(&mut app, &s, 5).await;
    let first = segment(&mut app, &s, &t[1][0], &t[2][3]).await;
    let overlapping = segment(&mut app, &s, &t[2][0], &t[3][3]).await;
    let disjoint = segment(&mut app, &s, &t[4][0], &t[4][3]).await;
    assert!(
        app.commit_summary(&first.compaction_id, "Turns 1-2.")
            .await
            .applied
    );
    let stale = app
        .commit_summary(&overlapping.compaction_id, "Turns 2-3.")
        .await;
    assert!(!stale.applied);
    assert_eq!(reason(&stale), pb::CompactionReason::Stale);
    let composed = app.commit_summary(&disjoint.compaction_id, "Turn 4.").await;
    assert!(composed.applied, "{composed:?}");
    // The audit trail tells all three.
    let audit = app.list_summaries(&s, "main").await;
    assert_eq!(audit.summaries.len(), 2);
    let reasons: Vec<String> = audit
        .events
        .iter()
        .filter(|e| e.kind != "prepared")
        .map(|e| format!("{}:{}", e.kind, e.reason))
        .collect();
    assert_eq!(
        reasons,
        [
            format!("committed:{}", pb::CompactionReason::Applied as i32),
            format!("rejected:{}", pb::CompactionReason::Stale as i32),
            format!("committed:{}", pb::CompactionReason::Applied as i32),
        ]
    );
}

#[tokio::test]
async fn a_segment_that_does_not_shrink_the_context_or_is_cancelled_writes_nothing() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    app.append(&s, vec![user("hi"), assistant("hello")]).await;
    let t = turns(&mut app, &s, 2).await;
    let log = app.log(&s, "main").await;
    let (hi, hello) = (&log[log.len() - 1].node_id, &log[log.len() - 2].node_id);
    let plan = segment(&mut app, &s, hi, hello).await;
    let outcome = app
        .commit_summary(&plan.compaction_id, &"far longer ".repeat(50))
        .await;
    assert_eq!(reason(&outcome), pb::CompactionReason::NoGain);
    let plan = segment(&mut app, &s, &t[0][0], &t[0][3]).await;
    app.client
        .cancel_compaction(pb::CancelCompactionRequest {
            compaction_id: plan.compaction_id.clone(),
            reason: "changed my mind".into(),
        })
        .await
        .expect("CancelCompaction");
    let refused = app
        .client
        .commit_summary(pb::CommitSummaryRequest {
            compaction_id: plan.compaction_id,
            text: "late".into(),
            model: "m".into(),
        })
        .await;
    assert_status(refused, Code::FailedPrecondition, "cancelled");
    assert!(app.list_summaries(&s, "main").await.summaries.is_empty());
    assert!(
        rendered(&mut app, &s, "main")
            .await
            .messages
            .iter()
            .all(|m| !is_summary(m))
    );
}

#[tokio::test]
async fn a_segment_of_one_branch_stays_off_the_others() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    let t = turns(&mut app, &s, 2).await;
    app.create_branch(&s, "side", &t[1][3]).await;
    let side: Vec<Vec<String>> = vec![
        turn(&mut app, &s, "side", 2).await,
        turn(&mut app, &s, "side", 3).await,
    ];
    let main_before = rendered(&mut app, &s, "main").await;
    let plan = try_segment(&mut app, &s, "side", &side[0][0], &side[0][3])
        .await
        .expect("a segment of side");
    assert!(
        app.commit_summary(&plan.compaction_id, "Turn 2 on side.")
            .await
            .applied
    );
    assert!(
        rendered(&mut app, &s, "side")
            .await
            .messages
            .iter()
            .any(is_summary)
    );
    assert_eq!(rendered(&mut app, &s, "main").await, main_before);
    let on_main = app.list_summaries(&s, "main").await;
    assert!(!on_main.summaries[0].applies && !on_main.summaries[0].active);
}

#[tokio::test]
async fn a_function_call_and_its_result_stay_together_in_a_segment() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    let ids = app
        .append(
            &s,
            vec![
                user("research it"),
                assistant_calls("delegating", vec![call("f1", "research", "{}")]),
                function_call("f1", "find the config loader", pb::Expose::Full),
            ],
        )
        .await
        .node_ids;
    let function = ids[2].clone();
    app.append_in_function(
        &s,
        &function,
        vec![
            user("find the config loader"),
            assistant(&big_text(3000, "it is in src/config.rs")),
        ],
    )
    .await;
    let tail = app
        .append(
            &s,
            vec![
                function_result(
                    "f1",
                    "src/config.rs loads it",
                    pb::FunctionStatus::Completed,
                ),
                assistant("done"),
            ],
        )
        .await
        .node_ids;
    // The call without its result is split.
    let split = try_segment(&mut app, &s, "main", &ids[0], &ids[2]).await;
    assert_status(split, Code::InvalidArgument, "to_node_id");
    // Whole, the segment covers the function's chain too.
    let plan = segment(&mut app, &s, &ids[0], &tail[0]).await;
    assert_eq!(plan.covers_ids.len(), 6, "{:?}", plan.covers_ids);
    assert!(
        app.commit_summary(&plan.compaction_id, "Found the loader.")
            .await
            .applied
    );
    let r = rendered(&mut app, &s, "main").await;
    assert_eq!(
        transcript(&r.messages).len(),
        2,
        "{:#?}",
        transcript(&r.messages)
    );
    assert!(is_summary(&r.messages[0]));
}
