//! Functions (sub-agents): how they render in their caller and on their own.

use ctxd::api::pb;
use pb::{Callers, Expose, FunctionStatus};
use tonic::Code;

use crate::helpers::*;

/// A session that delegated `c1` to a "researcher" function.
struct Delegation {
    session: String,
    /// The function_call node: the function's id.
    fc: String,
    /// The function's internal chain.
    inner: Vec<String>,
    /// The function_result node, once closed.
    fr: String,
}

const CALLER_BEFORE: [&str; 2] = ["user: What is X?", "assistant: Let me delegate. -> c1"];
const INNER: [&str; 4] = [
    "[fn] user: find out what X is",
    "[fn] assistant: Searching. -> s1",
    "[fn] tool[s1]: X is 42 (source: wiki)",
    "[fn] assistant: X is 42.",
];

/// Opens the function and fills its internal chain, leaving it running.
async fn open(app: &mut TestApp, expose: Expose) -> Delegation {
    let session = app.create_session().await;
    let caller = app
        .append(
            &session,
            vec![
                user("What is X?"),
                assistant_calls(
                    "Let me delegate.",
                    vec![call("c1", "researcher", r#"{"topic":"x"}"#)],
                ),
                function_call("c1", "find out what X is", expose),
            ],
        )
        .await;
    let fc = caller.node_ids[2].clone();
    let inner = app
        .append_in_function(
            &session,
            &fc,
            vec![
                user("find out what X is"),
                assistant_calls("Searching.", vec![call("s1", "search", r#"{"q":"x"}"#)]),
                tool_result("s1", "X is 42 (source: wiki)"),
                assistant("X is 42."),
            ],
        )
        .await
        .node_ids;
    Delegation {
        session,
        fc,
        inner,
        fr: String::new(),
    }
}

/// Closes the function with `status` and lets the caller answer.
async fn close(app: &mut TestApp, d: &mut Delegation, status: FunctionStatus) {
    let closed = app
        .append(
            &d.session,
            vec![
                function_result("c1", "X is 42", status),
                assistant("The answer is 42."),
            ],
        )
        .await;
    d.fr = closed.node_ids[0].clone();
}

async fn delegation(app: &mut TestApp, expose: Expose, status: FunctionStatus) -> Delegation {
    let mut d = open(app, expose).await;
    close(app, &mut d, status).await;
    d
}

#[tokio::test]
async fn a_completed_function_renders_as_call_and_result() {
    let mut app = spawn_app().await;
    for expose in [Expose::Io, Expose::Unspecified] {
        let d = delegation(&mut app, expose, FunctionStatus::Completed).await;
        let r = app.render_branch(&d.session, "main").await;
        assert_eq!(
            transcript(&r.messages),
            vec![
                CALLER_BEFORE[0],
                CALLER_BEFORE[1],
                "tool[c1]: X is 42",
                "assistant: The answer is 42.",
            ],
            "expose {expose:?}"
        );
        let result = &r.messages[2];
        assert_eq!(result.role, pb::Role::Tool as i32);
        assert_eq!(result.name, "researcher");
        assert!(!result.is_error);
        assert_eq!(result.node_ids, vec![d.fc.clone(), d.fr.clone()]);
        assert!(r.messages.iter().all(|m| m.function_id.is_empty()));
    }
}

#[tokio::test]
async fn a_failed_function_renders_as_an_error_result() {
    let mut app = spawn_app().await;
    let d = delegation(&mut app, Expose::Io, FunctionStatus::Error).await;
    let r = app.render_branch(&d.session, "main").await;
    assert_eq!(r.messages.len(), 4);
    assert_eq!(r.messages[2].tool_call_id, "c1");
    assert!(r.messages[2].is_error, "status ERROR renders is_error");
}

#[tokio::test]
async fn expose_full_splices_the_internal_chain_after_the_result() {
    let mut app = spawn_app().await;
    let d = delegation(&mut app, Expose::Full, FunctionStatus::Completed).await;
    let r = app.render_branch(&d.session, "main").await;

    let mut want: Vec<&str> = CALLER_BEFORE.to_vec();
    want.push("tool[c1]: X is 42");
    want.extend(INNER);
    want.push("assistant: The answer is 42.");
    assert_eq!(transcript(&r.messages), want);

    assert_eq!(r.messages[2].node_ids, vec![d.fc.clone(), d.fr.clone()]);
    for (m, id) in r.messages[3..7].iter().zip(&d.inner) {
        assert_eq!(m.function_id, d.fc);
        assert_eq!(m.node_ids, vec![id.clone()]);
    }
    assert_eq!(r.messages[5].name, "search");
    assert_eq!(r.messages[7].function_id, "");
}

#[tokio::test]
async fn expose_none_hides_the_function_and_its_call() {
    let mut app = spawn_app().await;
    let d = delegation(&mut app, Expose::None, FunctionStatus::Completed).await;
    let r = app.render_branch(&d.session, "main").await;
    assert_eq!(
        transcript(&r.messages),
        vec![
            "user: What is X?",
            "assistant: Let me delegate.",
            "assistant: The answer is 42.",
        ]
    );

    // Next to a plain tool call: only the function's call is removed.
    let s = app.create_session().await;
    let ids = app
        .append(
            &s,
            vec![
                user("Time, and X?"),
                assistant_calls(
                    "",
                    vec![call("c1", "researcher", "{}"), call("t1", "clock", "{}")],
                ),
                function_call("c1", "x", Expose::None),
            ],
        )
        .await
        .node_ids;
    app.append_in_function(&s, &ids[2], vec![user("x"), assistant("42")])
        .await;
    app.append(
        &s,
        vec![
            function_result("c1", "42", FunctionStatus::Completed),
            tool_result("t1", "noon"),
        ],
    )
    .await;
    let r = app.render_branch(&s, "main").await;
    assert_eq!(
        transcript(&r.messages),
        vec!["user: Time, and X?", "assistant:  -> t1", "tool[t1]: noon"]
    );

    // An assistant message left with no text and no calls disappears.
    let s = app.create_session().await;
    let ids = app
        .append(
            &s,
            vec![
                user("X?"),
                assistant_calls("", vec![call("c1", "researcher", "{}")]),
                function_call("c1", "x", Expose::None),
            ],
        )
        .await
        .node_ids;
    app.append_in_function(&s, &ids[2], vec![user("x")]).await;
    app.append(
        &s,
        vec![
            function_result("c1", "42", FunctionStatus::Completed),
            assistant("42"),
        ],
    )
    .await;
    let r = app.render_branch(&s, "main").await;
    assert_eq!(transcript(&r.messages), vec!["user: X?", "assistant: 42"]);
}

#[tokio::test]
async fn rendering_at_a_function_shows_callers_then_its_chain() {
    let mut app = spawn_app().await;
    let d = open(&mut app, Expose::Io).await;

    let all = app
        .render(render_req(&d.session, Target::FunctionId(d.fc.clone())))
        .await;
    assert_eq!(all.messages.len(), 6, "{:#?}", transcript(&all.messages));
    // The caller's context: everything before the function_call on its path.
    assert_eq!(all.messages[0].role, pb::Role::User as i32);
    assert_eq!(text_of(&all.messages[0].parts), "What is X?");
    assert_eq!(all.messages[1].role, pb::Role::Assistant as i32);
    assert_eq!(text_of(&all.messages[1].parts), "Let me delegate.");
    assert!(all.messages[..2].iter().all(|m| m.function_id.is_empty()));
    assert_eq!(transcript(&all.messages[2..]), INNER);
    assert!(all.messages[2..].iter().all(|m| m.function_id == d.fc));
    assert_eq!(all.head_id, d.inner[3], "the head of the internal chain");

    let explicit_all = app
        .render(pb::RenderRequest {
            callers: Callers::All as i32,
            ..render_req(&d.session, Target::FunctionId(d.fc.clone()))
        })
        .await;
    assert_eq!(explicit_all, all, "CALLERS_ALL is the default");

    let none = app
        .render(pb::RenderRequest {
            callers: Callers::None as i32,
            ..render_req(&d.session, Target::FunctionId(d.fc.clone()))
        })
        .await;
    assert_eq!(transcript(&none.messages), INNER);
    assert_eq!(none.head_id, d.inner[3]);
}

#[tokio::test]
async fn the_caller_waits_while_its_function_runs() {
    let mut app = spawn_app().await;
    let d = open(&mut app, Expose::Io).await;

    // c1 is unanswered until the function closes.
    assert_code(
        app.try_append(append_req(&d.session, vec![user("Hurry up.")]))
            .await,
        Code::FailedPrecondition,
    );
    assert_eq!(app.branch(&d.session, "main").await.head_id, d.fc);
}

#[tokio::test]
async fn a_function_whose_call_a_tool_result_answers_runs_on_in_the_background() {
    let mut app = spawn_app().await;
    let d = open(&mut app, Expose::Io).await;

    // The caller answers the call itself (a background launch)...
    let launched = app
        .append(&d.session, vec![tool_result("c1", "launched")])
        .await;
    // ... so the call has its answer: a second one, or a function_result, is refused.
    let nodes_before = app.node_count().await;
    for (late, field) in [
        (tool_result("c1", "again"), "nodes[0].tool_result.call_id"),
        (
            function_result("c1", "X is 42", FunctionStatus::Completed),
            "nodes[0].function_result.call_id",
        ),
    ] {
        let refused = app
            .try_append(append_req(&d.session, vec![late]))
            .await
            .expect_err("a second answer");
        assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
        assert!(refused.message().contains(field), "{refused:?}");
    }
    assert_eq!(app.node_count().await, nodes_before);
    assert_eq!(
        app.branch(&d.session, "main").await.head_id,
        launched.node_ids[0]
    );
    // ... and goes on.
    app.append(
        &d.session,
        vec![assistant("I will wait for the researcher.")],
    )
    .await;
    let branch = app.render_branch(&d.session, "main").await;
    assert_eq!(
        transcript(&branch.messages),
        [
            CALLER_BEFORE[0],
            CALLER_BEFORE[1],
            "tool[c1]: launched",
            "assistant: I will wait for the researcher.",
        ],
        "the caller shows the call and the result it got"
    );

    // The function runs on: its chain takes more nodes and renders on its own.
    let more = app
        .append_in_function(
            &d.session,
            &d.fc,
            vec![user("and Y?"), assistant("Y is 7.")],
        )
        .await;
    let inner = app
        .render(pb::RenderRequest {
            callers: Callers::None as i32,
            ..render_req(&d.session, Target::FunctionId(d.fc.clone()))
        })
        .await;
    let mut expected: Vec<&str> = INNER.to_vec();
    expected.extend(["[fn] user: and Y?", "[fn] assistant: Y is 7."]);
    assert_eq!(transcript(&inner.messages), expected);
    assert_eq!(inner.head_id, more.node_ids[1]);
}

#[tokio::test]
async fn a_closed_function_takes_no_more_nodes() {
    let mut app = spawn_app().await;
    let d = delegation(&mut app, Expose::Io, FunctionStatus::Completed).await;

    let nodes_before = app.node_count().await;
    assert_code(
        app.try_append(function_req(&d.session, &d.fc, vec![assistant("late")]))
            .await,
        Code::FailedPrecondition,
    );
    assert_eq!(app.node_count().await, nodes_before);

    // The function's record: the result names it and the head of its chain.
    let fr = app
        .get_nodes(&d.session, std::slice::from_ref(&d.fr))
        .await
        .remove(0);
    match fr.content.and_then(|c| c.kind) {
        Some(pb::node_input::Kind::FunctionResult(r)) => {
            assert_eq!(r.function_id, d.fc);
            assert_eq!(r.chain_head_id, d.inner[3]);
        }
        other => panic!("expected a function result, got {other:?}"),
    }
    assert_eq!(
        fr.parent_id, d.fc,
        "the result follows the call on the caller's chain"
    );
}

#[tokio::test]
async fn compare_and_swap_applies_to_a_function_chain() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    let ids = app
        .append(
            &s,
            vec![
                user("go"),
                assistant_calls("", vec![call("c1", "worker", "{}")]),
                function_call("c1", "work", Expose::Io),
            ],
        )
        .await
        .node_ids;
    let fc = &ids[2];

    let first = app
        .try_append(pb::AppendRequest {
            expected_head_id: Some(String::new()),
            ..function_req(&s, fc, vec![user("work")])
        })
        .await
        .expect("an empty chain matches Some(\"\")");
    assert_eq!(
        app.get_nodes(&s, &first.node_ids).await[0].parent_id,
        *fc,
        "the first internal node hangs under the function_call"
    );
    assert_code(
        app.try_append(pb::AppendRequest {
            expected_head_id: Some(String::new()),
            ..function_req(&s, fc, vec![assistant("done")])
        })
        .await,
        Code::Aborted,
    );
    app.try_append(pb::AppendRequest {
        expected_head_id: Some(first.head_id.clone()),
        ..function_req(&s, fc, vec![assistant("done")])
    })
    .await
    .expect("the chain head matches");
}

/// A function opened and closed in one request is empty: its result records no chain, and it
/// takes no more nodes.
#[tokio::test]
async fn a_function_can_open_and_close_in_one_request() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    let ids = app
        .append(
            &s,
            vec![
                user("X?"),
                assistant_calls("", vec![call("c1", "researcher", "{}")]),
                function_call("c1", "x", Expose::Io),
                function_result("c1", "nothing to do", FunctionStatus::Completed),
            ],
        )
        .await
        .node_ids;
    let nodes = app.get_nodes(&s, &ids[3..]).await;
    let Some(pb::node_input::Kind::FunctionResult(result)) =
        nodes[0].content.as_ref().and_then(|c| c.kind.clone())
    else {
        panic!("a function result: {:?}", nodes[0]);
    };
    assert_eq!(result.function_id, ids[2]);
    assert_eq!(result.chain_head_id, "");
    let r = app.render_branch(&s, "main").await;
    assert_eq!(
        transcript(&r.messages),
        vec!["user: X?", "assistant:  -> c1", "tool[c1]: nothing to do"]
    );
    assert_code(
        app.client
            .append(function_req(&s, &ids[2], vec![user("late")]))
            .await,
        Code::FailedPrecondition,
    );
}
