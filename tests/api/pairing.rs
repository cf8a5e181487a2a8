//! Strict pairing of tool calls with their results.

use ctxd::api::pb;
use pb::Expose;
use tonic::Code;

use crate::helpers::*;

/// A session whose latest assistant message made calls `c1` and `c2`.
async fn with_pending_calls(app: &mut TestApp) -> (String, String) {
    let s = app.create_session().await;
    let head = app
        .append(
            &s,
            vec![
                user("Read two files."),
                assistant_calls(
                    "Reading.",
                    vec![
                        call("c1", "read", r#"{"path":"a"}"#),
                        call("c2", "read", r#"{"path":"b"}"#),
                    ],
                ),
            ],
        )
        .await
        .head_id;
    (s, head)
}

#[tokio::test]
async fn a_result_must_answer_an_open_call() {
    let mut app = spawn_app().await;
    let (s, head) = with_pending_calls(&mut app).await;

    assert_status(
        app.try_append(append_req(&s, vec![tool_result("nope", "?")]))
            .await,
        Code::InvalidArgument,
        "call_id",
    );
    app.append(&s, vec![tool_result("c1", "A")]).await;
    assert_status(
        app.try_append(append_req(&s, vec![tool_result("c1", "A again")]))
            .await,
        Code::InvalidArgument,
        "call_id",
    );
    // Within one batch too.
    assert_status(
        app.try_append(append_req(
            &s,
            vec![tool_result("c2", "B"), tool_result("c2", "B again")],
        ))
        .await,
        Code::InvalidArgument,
        "call_id",
    );
    assert_eq!(
        app.log(&s, "main").await.len(),
        3,
        "only c1's result landed"
    );
    assert_ne!(app.branch(&s, "main").await.head_id, head);
}

#[tokio::test]
async fn a_result_answers_only_the_latest_assistant_message() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    assert_status(
        app.try_append(append_req(&s, vec![tool_result("c0", "orphan")]))
            .await,
        Code::InvalidArgument,
        "call_id",
    );
    app.append(
        &s,
        vec![
            assistant_calls("", vec![call("c1", "read", "{}")]),
            tool_result("c1", "A"),
            assistant_calls("", vec![call("c2", "read", "{}")]),
        ],
    )
    .await;
    // c1 belongs to an older assistant message.
    assert_status(
        app.try_append(append_req(&s, vec![tool_result("c1", "late")]))
            .await,
        Code::InvalidArgument,
        "call_id",
    );
}

#[tokio::test]
async fn no_message_while_calls_are_unanswered() {
    let mut app = spawn_app().await;
    let (s, head) = with_pending_calls(&mut app).await;

    for node in [user("Well?"), assistant("Never mind."), system("hush")] {
        assert_code(
            app.try_append(append_req(&s, vec![node])).await,
            Code::FailedPrecondition,
        );
    }
    app.append(&s, vec![tool_result("c1", "A")]).await;
    assert_code(
        app.try_append(append_req(&s, vec![user("Still one open.")]))
            .await,
        Code::FailedPrecondition,
    );
    let answered = app
        .append(&s, vec![tool_result("c2", "B"), assistant("Both read.")])
        .await;
    assert_eq!(answered.node_ids.len(), 2);
    assert_eq!(app.log(&s, "main").await.len(), 5);
    assert_ne!(answered.head_id, head);
}

#[tokio::test]
async fn a_function_call_must_name_an_open_call() {
    let mut app = spawn_app().await;
    let (s, _) = with_pending_calls(&mut app).await;

    assert_status(
        app.try_append(append_req(&s, vec![function_call("c9", "x", Expose::Io)]))
            .await,
        Code::InvalidArgument,
        "call_id",
    );
    app.append(&s, vec![tool_result("c1", "A")]).await;
    assert_code(
        app.try_append(append_req(&s, vec![function_call("c1", "x", Expose::Io)]))
            .await,
        Code::InvalidArgument,
    );
    let opened = app
        .append(&s, vec![function_call("c2", "x", Expose::Io)])
        .await;
    let fc = app.get_nodes(&s, &opened.node_ids).await.remove(0);
    match fc.content.and_then(|c| c.kind) {
        Some(pb::node_input::Kind::FunctionCall(f)) => assert_eq!(f.name, "read"),
        other => panic!("expected a function call, got {other:?}"),
    }
    // c2 is taken by the running function now: a plain result for it answers the call while
    // the function runs on in the background; a second answer is refused.
    app.append(&s, vec![tool_result("c2", "launched")]).await;
    assert_status(
        app.try_append(append_req(&s, vec![tool_result("c2", "B")]))
            .await,
        Code::InvalidArgument,
        "tool_result.call_id",
    );
}
