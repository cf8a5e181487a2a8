//! Summaries as overlays through the real server: prepare, commit only when smaller, the audit
//! trail, rolling, branches, concurrency. Nothing lost, nothing wrong committed.

use ctxd::api::pb::{self, render_request::Target};
use tonic::Code;

use crate::helpers::*;

/// History share of the budget every test here uses.
const HISTORY: u32 = 2000;

fn budget() -> pb::Budget {
    pb::Budget {
        context_window: HISTORY + 500,
        output_reserve: 500,
        ..Default::default()
    }
}

/// Four turns of four messages: a request, a tool call, a large result, an answer. Returns the
/// node ids of each turn.
async fn sixteen(app: &mut TestApp, s: &str) -> Vec<Vec<String>> {
    let mut turns = Vec::new();
    for t in 0..4 {
        turns.push(append_turn(app, s, "main", t).await);
    }
    turns
}

async fn append_turn(app: &mut TestApp, s: &str, branch: &str, t: usize) -> Vec<String> {
    let id = format!("call-{t}");
    app.append_branch(
        s,
        branch,
        vec![
            user(&format!("request number {t}: please look at file {t}")),
            assistant_calls("looking", vec![call(&id, "read_file", r#"{"path":"f"}"#)]),
            tool_result(&id, &big_text(3000, &format!("contents of file {t}"))),
            assistant(&format!("file {t} is fine")),
        ],
    )
    .await
    .node_ids
}

async fn prepare(app: &mut TestApp, s: &str, branch: &str) -> pb::PrepareCompactionResponse {
    try_prepare(app, s, branch)
        .await
        .expect("PrepareCompaction")
}

async fn try_prepare(
    app: &mut TestApp,
    s: &str,
    branch: &str,
) -> Result<pb::PrepareCompactionResponse, tonic::Status> {
    app.client
        .prepare_compaction(pb::PrepareCompactionRequest {
            session_id: s.into(),
            branch: branch.into(),
            budget: Some(budget()),
            ..Default::default()
        })
        .await
        .map(|r| r.into_inner())
}

async fn rendered(app: &mut TestApp, s: &str, branch: &str) -> pb::RenderResponse {
    app.render(pb::RenderRequest {
        budget: Some(budget()),
        now_unix_ms: 1,
        ..render_req(s, Target::Branch(branch.into()))
    })
    .await
}

async fn stats_total(app: &mut TestApp, s: &str, branch: &str) -> u32 {
    app.client
        .context_stats(pb::ContextStatsRequest {
            session_id: s.into(),
            target: Some(pb::context_stats_request::Target::Branch(branch.into())),
            budget: Some(budget()),
            now_unix_ms: 1,
            ..Default::default()
        })
        .await
        .expect("ContextStats")
        .into_inner()
        .total_tokens
}

fn is_summary(m: &pb::RenderedMessage) -> bool {
    text_of(&m.parts).starts_with("[Summary of the earlier conversation")
}

/// A summary message's text before its evidence ledger.
fn summary_text(m: &pb::RenderedMessage) -> String {
    let text = text_of(&m.parts);
    text.split("\n\n[Evidence")
        .next()
        .unwrap_or_default()
        .to_owned()
}

fn reason(outcome: &pb::CompactionOutcome) -> pb::CompactionReason {
    pb::CompactionReason::try_from(outcome.reason).expect("a known reason")
}

#[tokio::test]
async fn a_summary_covers_whole_older_turns_and_shrinks_the_context() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    let turns = sixteen(&mut app, &s).await;
    let before = rendered(&mut app, &s, "main").await;

    let plan = prepare(&mut app, &s, "main").await;
    assert!(plan.needed, "{plan:?}");
    assert_eq!(plan.retained_turns, 2);
    assert_eq!(plan.base_head_id, turns[3][3]);
    // Exactly the two older turns, whole.
    let expected: Vec<String> = turns[..2].concat();
    assert_eq!(plan.covers_ids, expected);
    // The input starts at the range's first message and holds every request and every tool
    // result of the range, reduced but never cleared.
    let input = &plan.summary_input;
    assert_eq!(
        text_of(&input[0].parts),
        "request number 0: please look at file 0"
    );
    let users: Vec<String> = input
        .iter()
        .filter(|m| m.role == pb::Role::User as i32)
        .map(|m| text_of(&m.parts))
        .collect();
    assert_eq!(users.len(), 2);
    let results: Vec<&pb::RenderedMessage> = input
        .iter()
        .filter(|m| m.role == pb::Role::Tool as i32)
        .collect();
    assert_eq!(results.len(), 2);
    assert!(results.iter().all(|m| !m.cleared));
    assert!(text_of(&results[1].parts).starts_with("contents of file 1"));

    let outcome = app
        .commit_summary(&plan.compaction_id, "Files 0 and 1 were read; both fine.")
        .await;
    assert!(outcome.applied, "{outcome:?}");
    assert_eq!(reason(&outcome), pb::CompactionReason::Applied);
    assert!(outcome.tokens_after < outcome.tokens_before);

    let after = rendered(&mut app, &s, "main").await;
    // Under this budget the render had to snip two turns before; now it need not, and the
    // whole context is smaller than the history it replaces.
    assert_eq!(before.report.as_ref().expect("report").turns_snipped, 2);
    assert_eq!(after.report.as_ref().expect("report").turns_snipped, 0);
    assert_eq!(before.messages.len(), 8);
    let unbudgeted = app.render_branch(&s, "main").await;
    assert!(unbudgeted.total_tokens < outcome.tokens_before);
    assert!(is_summary(&after.messages[0]));
    assert!(summary_text(&after.messages[0]).ends_with("Files 0 and 1 were read; both fine."));
    // The newest turns render exactly as before.
    assert_eq!(
        after.messages[1..],
        before.messages[before.messages.len() - 8..]
    );
    let breakdown = after.report.expect("report").tokens.expect("breakdown");
    assert!(breakdown.summaries > 0);
    // Non-destructive: the covered nodes are all still there.
    assert_eq!(app.log(&s, "main").await.len(), 16);
    assert_eq!(app.get_session(&s).await.compaction_count, 1);

    let audit = app.list_summaries(&s, "main").await;
    assert_eq!(audit.summaries.len(), 1);
    let summary = &audit.summaries[0];
    assert!(summary.applies && summary.active);
    assert_eq!(summary.covers_ids, expected);
    assert_eq!(summary.model, "test-model");
    assert_eq!(summary.tokens_after, outcome.tokens_after);
    let kinds: Vec<&str> = audit.events.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds, ["prepared", "committed"]);
    // Applied once: a second commit on the same plan is refused.
    let again = app
        .client
        .commit_summary(pb::CommitSummaryRequest {
            compaction_id: plan.compaction_id.clone(),
            text: "again".into(),
            model: "m".into(),
        })
        .await;
    assert_status(again, Code::FailedPrecondition, "compaction_id");
}

#[tokio::test]
async fn summaries_that_do_not_help_write_nothing_and_are_recorded() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    sixteen(&mut app, &s).await;
    let before = rendered(&mut app, &s, "main").await;
    let plan = prepare(&mut app, &s, "main").await;

    let empty = app.commit_summary(&plan.compaction_id, "  \n\t ").await;
    assert_eq!(reason(&empty), pb::CompactionReason::Empty);
    assert!(!empty.applied);
    assert_eq!(empty.tokens_before, empty.tokens_after);
    assert!(empty.tokens_before > 0);

    // Longer than what it replaces: no gain.
    let long = big_text(20_000, "a very long summary");
    let no_gain = app.commit_summary(&plan.compaction_id, &long).await;
    assert_eq!(reason(&no_gain), pb::CompactionReason::NoGain);
    assert!(no_gain.tokens_after >= no_gain.tokens_before);

    app.client
        .cancel_compaction(pb::CancelCompactionRequest {
            compaction_id: plan.compaction_id.clone(),
            reason: "the host gave up".into(),
        })
        .await
        .expect("CancelCompaction");
    let closed = app
        .client
        .commit_summary(pb::CommitSummaryRequest {
            compaction_id: plan.compaction_id.clone(),
            text: "short".into(),
            model: "m".into(),
        })
        .await;
    assert_status(closed, Code::FailedPrecondition, "cancelled");

    assert_eq!(rendered(&mut app, &s, "main").await, before);
    assert_eq!(app.get_session(&s).await.compaction_count, 0);
    let audit = app.list_summaries(&s, "main").await;
    assert!(audit.summaries.is_empty());
    let trail: Vec<(String, i32)> = audit
        .events
        .iter()
        .map(|e| (e.kind.clone(), e.reason))
        .collect();
    assert_eq!(
        trail,
        [
            (
                "prepared".to_owned(),
                pb::CompactionReason::Unspecified as i32
            ),
            ("rejected".to_owned(), pb::CompactionReason::Empty as i32),
            ("rejected".to_owned(), pb::CompactionReason::NoGain as i32),
            (
                "cancelled".to_owned(),
                pb::CompactionReason::Cancelled as i32
            ),
        ]
    );
    assert_eq!(audit.events[3].message, "the host gave up");
}

#[tokio::test]
async fn a_history_that_fits_needs_no_summary() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    append_turn(&mut app, &s, "main", 0).await;
    let plan = prepare(&mut app, &s, "main").await;
    assert!(!plan.needed);
    assert!(plan.compaction_id.is_empty());
    assert!(plan.reason.contains("fits"), "{}", plan.reason);
    assert!(
        app.list_summaries(&s, "main").await.events.is_empty(),
        "no plan stored"
    );
}

#[tokio::test]
async fn repeated_compaction_rolls_the_prior_summary_in() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    let mut turns = sixteen(&mut app, &s).await;
    let first = prepare(&mut app, &s, "main").await;
    let applied = app
        .commit_summary(&first.compaction_id, "First summary: files 0 and 1.")
        .await;
    assert!(applied.applied);

    for t in 4..7 {
        turns.push(append_turn(&mut app, &s, "main", t).await);
    }
    let second = prepare(&mut app, &s, "main").await;
    assert!(second.needed, "{second:?}");
    assert_eq!(second.prior_summary_id, applied.summary_id);
    // The input opens with the prior summary and then the new range.
    assert!(is_summary(&second.summary_input[0]));
    assert_eq!(
        text_of(&second.summary_input[1].parts),
        "request number 2: please look at file 2"
    );
    // It covers everything the first covered, and more.
    assert!(
        first
            .covers_ids
            .iter()
            .all(|id| second.covers_ids.contains(id))
    );
    assert_eq!(second.covers_ids, turns[..5].concat());
    let rolled = app
        .commit_summary(&second.compaction_id, "Files 0 to 4 were read.")
        .await;
    assert!(rolled.applied, "{rolled:?}");

    let audit = app.list_summaries(&s, "main").await;
    assert_eq!(audit.summaries.len(), 2, "both stay listed");
    assert!(audit.summaries[0].applies && !audit.summaries[0].active);
    assert!(audit.summaries[1].applies && audit.summaries[1].active);
    assert_eq!(audit.summaries[1].prior_summary_id, applied.summary_id);
    let r = rendered(&mut app, &s, "main").await;
    assert_eq!(r.messages.iter().filter(|m| is_summary(m)).count(), 1);
    assert!(summary_text(&r.messages[0]).ends_with("Files 0 to 4 were read."));
    assert_eq!(app.get_session(&s).await.compaction_count, 2);
}

#[tokio::test]
async fn branches_see_a_summary_only_if_they_hold_all_it_covers() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    let turns = sixteen(&mut app, &s).await;
    // Forks before the covered range ends, and after it.
    app.create_branch(&s, "early", &turns[1][2]).await;
    app.create_branch(&s, "late", &turns[2][3]).await;
    let plan = prepare(&mut app, &s, "main").await;
    assert!(
        app.commit_summary(&plan.compaction_id, "Files 0 and 1 were read.")
            .await
            .applied
    );

    append_turn(&mut app, &s, "early", 9).await;
    append_turn(&mut app, &s, "late", 9).await;
    for _ in 0..2 {
        for (branch, sees) in [
            ("main", true),
            ("early", false),
            ("late", true),
            ("main", true),
        ] {
            let r = rendered(&mut app, &s, branch).await;
            assert_eq!(
                r.messages.iter().any(is_summary),
                sees,
                "{branch} sees the summary: {sees}"
            );
            assert_eq!(
                stats_total(&mut app, &s, branch).await,
                r.total_tokens,
                "{branch}"
            );
            let audit = app.list_summaries(&s, branch).await;
            assert_eq!(audit.summaries[0].applies, sees, "{branch}");
            assert_eq!(audit.summaries[0].active, sees, "{branch}");
        }
    }
    // On the early fork the original messages of the covered range render.
    let early = app.render_branch(&s, "early").await;
    assert_eq!(
        text_of(&early.messages[0].parts),
        "request number 0: please look at file 0"
    );
}

#[tokio::test]
async fn agents_keep_appending_while_a_summary_is_written() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    sixteen(&mut app, &s).await;
    let plan = prepare(&mut app, &s, "main").await;
    let newest = append_turn(&mut app, &s, "main", 4).await;
    let outcome = app
        .commit_summary(&plan.compaction_id, "Files 0 and 1 were read.")
        .await;
    assert!(outcome.applied, "{outcome:?}");
    let r = rendered(&mut app, &s, "main").await;
    assert_eq!(r.head_id, newest[3], "applied on the current head");
    assert!(is_summary(&r.messages[0]));
    assert_eq!(
        text_of(&r.messages.last().expect("a message").parts),
        "file 4 is fine"
    );
}

#[tokio::test]
async fn a_branch_reset_during_generation_makes_the_commit_stale() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    let turns = sixteen(&mut app, &s).await;
    let plan = prepare(&mut app, &s, "main").await;
    // Reset main to the end of the first turn: covered nodes of turn 2 leave its path.
    app.delete_branch(&s, "main").await;
    app.create_branch(&s, "main", &turns[0][3]).await;
    append_turn(&mut app, &s, "main", 7).await;
    let before = rendered(&mut app, &s, "main").await;

    let outcome = app
        .commit_summary(&plan.compaction_id, "Files 0 and 1 were read.")
        .await;
    assert!(!outcome.applied);
    assert_eq!(reason(&outcome), pb::CompactionReason::Stale);
    assert_eq!(
        rendered(&mut app, &s, "main").await,
        before,
        "byte-identical"
    );
    assert_eq!(app.get_session(&s).await.compaction_count, 0);
    let audit = app.list_summaries(&s, "main").await;
    assert!(audit.summaries.is_empty());
    assert_eq!(
        audit.events.last().expect("an event").reason,
        pb::CompactionReason::Stale as i32
    );
}

#[tokio::test]
async fn three_fruitless_commits_on_one_base_stop_prepare_until_the_branch_moves() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    sixteen(&mut app, &s).await;
    let long = big_text(20_000, "too long");
    for _ in 0..3 {
        let plan = prepare(&mut app, &s, "main").await;
        let outcome = app.commit_summary(&plan.compaction_id, &long).await;
        assert_eq!(reason(&outcome), pb::CompactionReason::NoGain);
    }
    assert_status(
        try_prepare(&mut app, &s, "main").await,
        Code::FailedPrecondition,
        "3 commits",
    );
    append_turn(&mut app, &s, "main", 4).await;
    assert!(prepare(&mut app, &s, "main").await.needed);
}

#[tokio::test]
async fn bad_compaction_requests_name_their_field() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    let no_budget = app
        .client
        .prepare_compaction(pb::PrepareCompactionRequest {
            session_id: s.clone(),
            ..Default::default()
        })
        .await;
    assert_status(no_budget, Code::InvalidArgument, "budget");
    let unknown_branch = app
        .client
        .prepare_compaction(pb::PrepareCompactionRequest {
            session_id: s.clone(),
            branch: "nope".into(),
            budget: Some(budget()),
            ..Default::default()
        })
        .await;
    assert_status(unknown_branch, Code::NotFound, "branch");
    let bad_id = app
        .client
        .commit_summary(pb::CommitSummaryRequest {
            compaction_id: "not-a-uuid".into(),
            ..Default::default()
        })
        .await;
    assert_status(bad_id, Code::InvalidArgument, "compaction_id");
    let unknown = app
        .client
        .commit_summary(pb::CommitSummaryRequest {
            compaction_id: unknown_id(),
            text: "x".into(),
            ..Default::default()
        })
        .await;
    assert_status(unknown, Code::NotFound, "compaction");
    let cancel_unknown = app
        .client
        .cancel_compaction(pb::CancelCompactionRequest {
            compaction_id: unknown_id(),
            reason: String::new(),
        })
        .await;
    assert_status(cancel_unknown, Code::NotFound, "compaction");
    let list = app
        .client
        .list_summaries(pb::ListSummariesRequest {
            session_id: unknown_id(),
            branch: String::new(),
        })
        .await;
    assert_status(list, Code::NotFound, "session");
}
