//! AppendStream: many appends over one stream, written in runs, each request checked as an
//! Append is; the first refused one ends the stream and nothing after it is written.

use ctxd::api::pb;
use tonic::{Code, Status};

use crate::helpers::*;

/// Sends every request at once, then reads the stream to its end: the responses, and the
/// status it ended with (`None`: it ended cleanly).
async fn stream_all(
    app: &mut TestApp,
    requests: Vec<pb::AppendRequest>,
) -> (Vec<pb::AppendStreamResponse>, Option<Status>) {
    let mut responses = app
        .client
        .append_stream(tokio_stream::iter(requests))
        .await
        .expect("the stream opens")
        .into_inner();
    let mut got = Vec::new();
    loop {
        match responses.message().await {
            Ok(Some(response)) => got.push(response),
            Ok(None) => return (got, None),
            Err(status) => return (got, Some(status)),
        }
    }
}

fn acknowledged(responses: &[pb::AppendStreamResponse]) -> Vec<pb::AppendResponse> {
    let mut next = 0;
    let mut all = Vec::new();
    for response in responses {
        assert_eq!(response.first, next, "responses follow one another");
        next += response.appends.len() as u64;
        all.extend(response.appends.iter().cloned());
    }
    all
}

/// A turn of a tool-using agent: the question, a call, its result, the answer.
fn turn(session: &str, i: usize) -> Vec<pb::AppendRequest> {
    let id = format!("c{i}");
    vec![
        append_req(session, vec![user(&format!("question {i}"))]),
        append_req(
            session,
            vec![assistant_calls("", vec![call(&id, "grep", "{}")])],
        ),
        append_req(session, vec![tool_result(&id, &format!("result {i}"))]),
        append_req(session, vec![assistant(&format!("answer {i}"))]),
    ]
}

#[tokio::test]
async fn a_stream_writes_every_request_in_order_in_few_transactions() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    let requests: Vec<_> = (0..50).flat_map(|i| turn(&s, i)).collect();
    let sent = requests.len();
    let (responses, ended) = stream_all(&mut app, requests).await;
    assert!(ended.is_none(), "{ended:?}");
    let acks = acknowledged(&responses);
    assert_eq!(acks.len(), sent);
    // Requests that arrive together share a transaction and one response.
    assert!(
        responses.len() < sent / 2,
        "{} responses for {sent} requests",
        responses.len()
    );

    let log = app.log(&s, "main").await;
    assert_eq!(log.len(), sent);
    // Newest first: the log is the acknowledged ids backwards, one node each.
    let logged: Vec<String> = log.iter().rev().map(|n| n.node_id.clone()).collect();
    let answered: Vec<String> = acks.iter().map(|a| a.node_ids[0].clone()).collect();
    assert_eq!(logged, answered);
    assert_eq!(
        acks.last().unwrap().head_id,
        app.branch(&s, "main").await.head_id
    );
}

#[tokio::test]
async fn the_first_refused_request_ends_the_stream_and_nothing_after_it_is_written() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    let mut requests = turn(&s, 0);
    // A result for a call nobody made, then an append that would be fine on its own.
    requests.push(append_req(&s, vec![tool_result("nobody", "x")]));
    requests.push(append_req(&s, vec![user("after the refusal")]));
    let (responses, ended) = stream_all(&mut app, requests).await;
    let status = ended.expect("the stream ends with the refusal");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status
            .message()
            .starts_with("requests[4].nodes[0].tool_result.call_id: "),
        "{status:?}"
    );
    assert_eq!(acknowledged(&responses).len(), 4);
    assert_eq!(app.log(&s, "main").await.len(), 4, "nothing after it");
}

#[tokio::test]
async fn a_bad_field_is_invalid_argument_naming_the_request_and_the_field() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    let mut requests = turn(&s, 0);
    requests.insert(2, append_req(&s, vec![]));
    let (responses, ended) = stream_all(&mut app, requests).await;
    let status = ended.expect("the stream ends with the refusal");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().starts_with("requests[2].nodes: "),
        "{status:?}"
    );
    assert_eq!(acknowledged(&responses).len(), 2);
    assert_eq!(app.log(&s, "main").await.len(), 2);

    // An unknown session is NOT_FOUND, as for Append.
    let unknown = uuid::Uuid::now_v7().to_string();
    let (responses, ended) =
        stream_all(&mut app, vec![append_req(&unknown, vec![user("x")])]).await;
    assert!(responses.is_empty());
    let status = ended.expect("refused");
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    assert!(status.message().starts_with("requests[0]"), "{status:?}");
}

#[tokio::test]
async fn compare_and_swap_and_idempotency_keys_hold_per_request() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    let keyed = |key: &str, nodes| pb::AppendRequest {
        idempotency_key: key.into(),
        ..append_req(&s, nodes)
    };
    let requests = vec![
        pb::AppendRequest {
            expected_head_id: Some(String::new()),
            ..keyed("k1", vec![user("one")])
        },
        keyed("k2", vec![assistant("two")]),
    ];
    let (first, ended) = stream_all(&mut app, requests.clone()).await;
    assert!(ended.is_none(), "{ended:?}");
    let nodes = app.node_count().await;
    // The same stream again: every answer is the first one's and nothing is written, the
    // compare-and-swap included.
    let (retry, ended) = stream_all(&mut app, requests).await;
    assert!(ended.is_none(), "{ended:?}");
    assert_eq!(acknowledged(&retry), acknowledged(&first));
    assert_eq!(app.node_count().await, nodes);

    // A stale head is ABORTED at its request.
    let head = acknowledged(&first)[0].head_id.clone();
    let stale = pb::AppendRequest {
        expected_head_id: Some(head),
        ..append_req(&s, vec![user("three")])
    };
    let (responses, ended) =
        stream_all(&mut app, vec![append_req(&s, vec![user("x")]), stale]).await;
    assert_eq!(acknowledged(&responses).len(), 1);
    let status = ended.expect("refused");
    assert_eq!(status.code(), Code::Aborted, "{status:?}");
    assert!(status.message().starts_with("requests[1]"), "{status:?}");
}

#[tokio::test]
async fn a_stream_ends_cleanly_when_the_server_shuts_down_while_it_is_idle() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    let (sender, requests) = tokio::sync::mpsc::channel(4);
    let mut responses = app
        .client
        .append_stream(tokio_stream::wrappers::ReceiverStream::new(requests))
        .await
        .expect("the stream opens")
        .into_inner();
    sender
        .send(append_req(&s, vec![user("one")]))
        .await
        .unwrap();
    let first = responses.message().await.expect("acknowledged").unwrap();
    assert_eq!(first.appends.len(), 1);
    // The client keeps its side open; the shutdown ends the stream instead of waiting on it.
    app.stop().await;
    let status = responses
        .message()
        .await
        .expect_err("ended by the shutdown");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    drop(sender);
}
