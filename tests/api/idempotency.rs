//! Idempotency keys: a retry returns the first answer and writes nothing.

use ctxd::api::pb;
use tonic::Code;

use crate::helpers::*;

fn keyed(session: &str, key: &str, nodes: Vec<pb::NodeInput>) -> pb::AppendRequest {
    pb::AppendRequest {
        idempotency_key: key.into(),
        ..append_req(session, nodes)
    }
}

#[tokio::test]
async fn a_retry_returns_the_first_answer() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    let req = keyed(&s, "req-1", vec![user("hello"), assistant("hi")]);

    let first = app.try_append(req.clone()).await.expect("first attempt");
    let nodes_after_first = app.node_count().await;
    let retry = app.try_append(req.clone()).await.expect("retry");
    assert_eq!(retry, first);
    assert_eq!(
        app.node_count().await,
        nodes_after_first,
        "a retry writes nothing"
    );
    assert_eq!(app.log(&s, "main").await.len(), 2);

    // Still the first answer after the head has moved on.
    let later = app.append(&s, vec![user("more")]).await;
    let retry = app.try_append(req).await.expect("late retry");
    assert_eq!(retry, first);
    assert_eq!(app.branch(&s, "main").await.head_id, later.head_id);
    assert_eq!(app.log(&s, "main").await.len(), 3);
}

#[tokio::test]
async fn a_retry_of_a_compare_and_swap_append_is_not_a_conflict() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    let req = pb::AppendRequest {
        expected_head_id: Some(String::new()),
        ..keyed(&s, "cas-1", vec![user("once")])
    };
    let first = app.try_append(req.clone()).await.expect("first attempt");
    // The head moved because of the first attempt; the retry still gets its answer.
    let retry = app.try_append(req).await.expect("retry");
    assert_eq!(retry, first);
    assert_eq!(app.log(&s, "main").await.len(), 1);
}

#[tokio::test]
async fn the_same_key_with_another_request_is_refused() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    app.try_append(keyed(&s, "k", vec![user("hello")]))
        .await
        .expect("first");
    let nodes = app.node_count().await;

    assert_code(
        app.try_append(keyed(&s, "k", vec![user("goodbye")])).await,
        Code::FailedPrecondition,
    );
    assert_code(
        app.try_append(keyed(&s, "k", vec![user("hello"), user("hello")]))
            .await,
        Code::FailedPrecondition,
    );
    assert_eq!(app.node_count().await, nodes);

    // Keys are per session.
    let other = app.create_session().await;
    let there = app
        .try_append(keyed(&other, "k", vec![user("goodbye")]))
        .await
        .expect("the same key in another session is a new request");
    assert_eq!(app.log(&other, "main").await.len(), 1);
    assert_eq!(there.node_ids.len(), 1);
}

#[tokio::test]
async fn a_retry_after_a_restart_returns_the_first_answer() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    let req = keyed(
        &s,
        "survives-restart",
        vec![
            user("q"),
            assistant_calls("", vec![call("c1", "t", "{}")]),
            tool_result("c1", "r"),
        ],
    );
    let first = app.try_append(req.clone()).await.expect("first attempt");

    app.restart().await;
    let nodes = app.node_count().await;
    let retry = app
        .try_append(req.clone())
        .await
        .expect("retry after restart");
    assert_eq!(retry, first);
    assert_eq!(app.node_count().await, nodes);
    assert_eq!(app.log(&s, "main").await.len(), 3);

    let changed = pb::AppendRequest {
        nodes: vec![user("q")],
        ..req
    };
    assert_code(app.try_append(changed).await, Code::FailedPrecondition);
}
