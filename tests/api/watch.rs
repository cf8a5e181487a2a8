//! Watch: watchers see exactly the committed sequence (concurrent appenders, a disconnect and
//! a resume by cursor), function chains, branch changes, compaction events; resuming after a
//! node; bad input; another tenant's session; a watcher that never reads; shutdown.

use std::net::SocketAddr;
use std::time::Duration;

use ctxd::api::pb;
use ctxd::auth::ApiKeys;
use ctxd::limits::Limits;
use ctxd::server::Options;
use pb::context_store_client::ContextStoreClient;
use pb::watch_event::Event;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::{Code, Request, Status, Streaming};

use crate::helpers::*;

/// How long a test waits for an event that must come.
const PATIENCE: Duration = Duration::from_secs(20);

fn watch_req(session: &str, branch: &str) -> pb::WatchRequest {
    pb::WatchRequest {
        session_id: session.into(),
        branch: branch.into(),
        ..Default::default()
    }
}

async fn watch(client: &mut Client, req: pb::WatchRequest) -> Streaming<pb::WatchEvent> {
    client.watch(req).await.expect("Watch").into_inner()
}

/// The next event; it must come within [`PATIENCE`].
async fn next(stream: &mut Streaming<pb::WatchEvent>) -> pb::WatchEvent {
    tokio::time::timeout(PATIENCE, stream.message())
        .await
        .expect("an event within the patience")
        .expect("the stream goes on")
        .expect("the stream is not over")
}

/// The `started` event a watch begins with: its branches.
async fn started(stream: &mut Streaming<pb::WatchEvent>) -> (Vec<pb::Branch>, String) {
    let event = next(stream).await;
    match event.event {
        Some(Event::Started(s)) => (s.branches, event.cursor),
        other => panic!("the first event is `started`, got {other:?}"),
    }
}

fn node_of(event: &pb::WatchEvent) -> &pb::Node {
    match &event.event {
        Some(Event::Node(n)) => n,
        other => panic!("expected a node, got {other:?}"),
    }
}

/// The ids of `branch`'s path, oldest first.
async fn chain(app: &mut TestApp, session: &str, branch: &str) -> Vec<String> {
    let mut nodes = app.log(session, branch).await;
    nodes.reverse();
    nodes.into_iter().map(|n| n.node_id).collect()
}

/// Reads node events until it has `count` node ids; a watcher that drops its stream after
/// `drop_after` nodes resumes with the last cursor it received.
async fn follow(
    addr: SocketAddr,
    session: String,
    mut stream: Streaming<pb::WatchEvent>,
    count: usize,
    drop_after: Option<usize>,
) -> (Vec<String>, bool) {
    let mut ids = Vec::new();
    let mut cursor = String::new();
    let mut resumed = false;
    while ids.len() < count {
        if !resumed && drop_after.is_some_and(|n| ids.len() >= n) {
            drop(stream);
            let mut client = connect(addr).await;
            stream = watch(
                &mut client,
                pb::WatchRequest {
                    after_cursor: cursor.clone(),
                    ..watch_req(&session, "main")
                },
            )
            .await;
            let (_, at) = started(&mut stream).await;
            assert_eq!(at, cursor, "a resumed watch starts at its cursor");
            resumed = true;
        }
        let event = next(&mut stream).await;
        cursor = event.cursor.clone();
        let node = node_of(&event);
        assert_eq!(event.branch, "main");
        ids.push(node.node_id.clone());
    }
    (ids, resumed)
}

#[tokio::test]
async fn watch_four_appenders_three_watchers_one_resumed_see_exactly_the_committed_sequence() {
    const APPENDERS: usize = 4;
    const EACH: usize = 25;
    let mut app = spawn_app().await;
    let session = app.create_session().await;
    let mut watchers = Vec::new();
    for w in 0..3 {
        let mut client = connect(app.addr).await;
        let mut stream = watch(&mut client, watch_req(&session, "main")).await;
        let (branches, _) = started(&mut stream).await;
        assert_eq!(branches.len(), 1);
        assert_eq!(branches[0].head_id, "", "a new session's main has no head");
        let drop_after = (w == 2).then_some(30);
        watchers.push(tokio::spawn(follow(
            app.addr,
            session.clone(),
            stream,
            APPENDERS * EACH,
            drop_after,
        )));
    }
    let mut appenders = Vec::new();
    for a in 0..APPENDERS {
        let addr = app.addr;
        let session = session.clone();
        appenders.push(tokio::spawn(async move {
            let mut client = connect(addr).await;
            for i in 0..EACH {
                client
                    .append(append_req(
                        &session,
                        vec![user(&format!("appender {a}: {i}"))],
                    ))
                    .await
                    .expect("Append");
            }
        }));
    }
    for a in appenders {
        a.await.expect("appender");
    }
    let committed = chain(&mut app, &session, "main").await;
    assert_eq!(committed.len(), APPENDERS * EACH);
    for (w, watcher) in watchers.into_iter().enumerate() {
        let (seen, resumed) = watcher.await.expect("watcher");
        assert_eq!(resumed, w == 2);
        assert_eq!(
            seen, committed,
            "watcher {w} sees the committed sequence exactly"
        );
    }
}

#[tokio::test]
async fn watch_reports_function_chains_and_branch_changes_in_order() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    let mut stream = watch(&mut app.client.clone(), watch_req(&s, "")).await;
    started(&mut stream).await;

    let caller = app
        .append(
            &s,
            vec![
                user("What is X?"),
                assistant_calls("Delegating.", vec![call("c1", "researcher", "{}")]),
                function_call("c1", "find X", pb::Expose::Io),
            ],
        )
        .await;
    let fc = caller.node_ids[2].clone();
    for id in &caller.node_ids {
        let e = next(&mut stream).await;
        assert_eq!((&node_of(&e).node_id, e.branch.as_str()), (id, "main"));
    }
    let inner = app
        .append_in_function(&s, &fc, vec![user("find X"), assistant("X is 42.")])
        .await;
    for id in &inner.node_ids {
        let e = next(&mut stream).await;
        let n = node_of(&e);
        assert_eq!(&n.node_id, id);
        assert_eq!(n.function_id, fc, "a chain node names its function");
        assert_eq!(e.branch, "", "a chain node is on no branch");
    }
    let closed = app
        .append(
            &s,
            vec![
                function_result("c1", "42", pb::FunctionStatus::Completed),
                assistant("It is 42."),
            ],
        )
        .await;
    for id in &closed.node_ids {
        let e = next(&mut stream).await;
        assert_eq!((&node_of(&e).node_id, e.branch.as_str()), (id, "main"));
    }

    let first = caller.node_ids[0].clone();
    app.create_branch(&s, "alt", &first).await;
    let e = next(&mut stream).await;
    match e.event {
        Some(Event::BranchCreated(b)) => {
            assert_eq!((b.name.as_str(), b.head_id), ("alt", first.clone()))
        }
        other => panic!("expected branch_created, got {other:?}"),
    }
    let on_alt = app
        .append_branch(&s, "alt", vec![assistant("Another answer.")])
        .await;
    let e = next(&mut stream).await;
    assert_eq!(
        (&node_of(&e).node_id, e.branch.as_str()),
        (&on_alt.node_ids[0], "alt")
    );

    app.client
        .reset_branch(pb::ResetBranchRequest {
            session_id: s.clone(),
            name: "main".into(),
            to_node_id: first.clone(),
            expected_head_id: None,
        })
        .await
        .expect("ResetBranch");
    let e = next(&mut stream).await;
    match e.event {
        Some(Event::HeadMoved(b)) => {
            assert_eq!((b.name.as_str(), b.head_id), ("main", first.clone()))
        }
        other => panic!("expected head_moved, got {other:?}"),
    }
    app.delete_branch(&s, "alt").await;
    let e = next(&mut stream).await;
    match e.event {
        Some(Event::BranchDeleted(b)) => assert_eq!(b.name, "alt"),
        other => panic!("expected branch_deleted, got {other:?}"),
    }
    // After the reset, appends continue from the new head.
    let after = app.append(&s, vec![assistant("Again.")]).await;
    let e = next(&mut stream).await;
    let n = node_of(&e);
    assert_eq!((&n.node_id, &n.parent_id), (&after.node_ids[0], &first));
}

#[tokio::test]
async fn watch_reports_summaries_committed_and_refused() {
    let mut app = spawn_app().await;
    let s = four_file_reads(&mut app.client).await;
    let mut stream = watch(&mut app.client.clone(), watch_req(&s, "main")).await;
    started(&mut stream).await;
    let plan = prepare_needed(&mut app.client, &s).await;
    let refused = app.commit_summary(&plan, "  ").await;
    assert!(!refused.applied);
    let applied = app.commit_summary(&plan, "The user read four files.").await;
    assert!(applied.applied, "{applied:?}");
    let recorded = app.list_summaries(&s, "main").await.events;
    let mut seen = Vec::new();
    while seen.len() < recorded.len() {
        let e = next(&mut stream).await;
        match e.event {
            Some(Event::Compaction(c)) => seen.push(c),
            other => panic!("expected a compaction event, got {other:?}"),
        }
    }
    let kinds: Vec<&str> = seen.iter().map(|c| c.kind.as_str()).collect();
    assert_eq!(kinds, ["prepared", "rejected", "committed"]);
    assert_eq!(seen, recorded);
}

#[tokio::test]
async fn watch_resumes_after_a_node_of_the_branch() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    let ids = app
        .append(&s, vec![user("one"), assistant("two"), user("three")])
        .await
        .node_ids;
    let mut stream = watch(
        &mut app.client.clone(),
        pb::WatchRequest {
            after_node_id: ids[0].clone(),
            ..watch_req(&s, "main")
        },
    )
    .await;
    started(&mut stream).await;
    for id in &ids[1..] {
        assert_eq!(&node_of(&next(&mut stream).await).node_id, id);
    }

    let whole_session = app
        .client
        .watch(pb::WatchRequest {
            after_node_id: ids[0].clone(),
            ..watch_req(&s, "")
        })
        .await;
    assert_status(whole_session, Code::InvalidArgument, "after_node_id");
    let unknown = app
        .client
        .watch(pb::WatchRequest {
            after_node_id: unknown_id(),
            ..watch_req(&s, "main")
        })
        .await;
    assert_status(unknown, Code::NotFound, "after_node_id");
    app.create_branch(&s, "alt", &ids[0]).await;
    let off_branch = app
        .client
        .watch(pb::WatchRequest {
            after_node_id: ids[2].clone(),
            ..watch_req(&s, "alt")
        })
        .await;
    assert_status(off_branch, Code::InvalidArgument, "after_node_id");
}

#[tokio::test]
async fn watch_bad_input_is_named() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    let other = app.create_session().await;
    let mut stream = watch(&mut app.client.clone(), watch_req(&other, "main")).await;
    let (_, other_cursor) = started(&mut stream).await;

    for (cursor, why) in [
        ("nope", "not a cursor"),
        ("w1.e30", "an empty cursor"),
        (other_cursor.as_str(), "another session's cursor"),
    ] {
        let answer = app
            .client
            .watch(pb::WatchRequest {
                after_cursor: cursor.into(),
                ..watch_req(&s, "main")
            })
            .await;
        assert_status(answer, Code::InvalidArgument, "after_cursor");
        let _ = why;
    }
    let mut whole = watch(&mut app.client.clone(), watch_req(&s, "")).await;
    let (_, whole_cursor) = started(&mut whole).await;
    let other_watch = app
        .client
        .watch(pb::WatchRequest {
            after_cursor: whole_cursor,
            ..watch_req(&s, "main")
        })
        .await;
    assert_status(other_watch, Code::InvalidArgument, "after_cursor");

    assert_status(
        app.client.watch(watch_req(&unknown_id(), "")).await,
        Code::NotFound,
        "session",
    );
    assert_status(
        app.client.watch(watch_req("not-a-uuid", "")).await,
        Code::InvalidArgument,
        "session_id",
    );
    assert_status(
        app.client.watch(watch_req(&s, "nope")).await,
        Code::NotFound,
        "branch",
    );
    assert_status(
        app.client.watch(watch_req(&s, "bad name!")).await,
        Code::InvalidArgument,
        "branch",
    );
}

#[derive(Clone)]
struct Bearer(MetadataValue<Ascii>);

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        request
            .metadata_mut()
            .insert("authorization", self.0.clone());
        Ok(request)
    }
}

#[tokio::test]
async fn watch_of_another_tenants_session_answers_like_an_unknown_one() {
    let keys = tempfile::NamedTempFile::new().expect("keys file");
    std::fs::write(
        &keys,
        "acme acme-6f1d0c2b9e8a4c31\nglobex globex-0a7e55d3c1b24f96\n",
    )
    .expect("keys");
    let (_db, server) = serve_fresh(Options {
        api_keys: Some(ApiKeys::load(keys.path()).expect("the keys file")),
        ..Options::default()
    })
    .await;
    let keyed = |key: &str| {
        let bearer = Bearer(format!("Bearer {key}").parse().expect("ASCII"));
        let addr = server.addr;
        async move { ContextStoreClient::with_interceptor(channel(addr).await, bearer) }
    };
    let mut acme = keyed("acme-6f1d0c2b9e8a4c31").await;
    let mut globex = keyed("globex-0a7e55d3c1b24f96").await;
    let session = acme
        .create_session(pb::CreateSessionRequest::default())
        .await
        .expect("CreateSession")
        .into_inner()
        .session_id;
    acme.watch(watch_req(&session, ""))
        .await
        .expect("the owner watches");
    let unknown = unknown_id();
    let foreign = globex
        .watch(watch_req(&session, ""))
        .await
        .expect_err("NOT_FOUND");
    let missing = globex
        .watch(watch_req(&unknown, ""))
        .await
        .expect_err("NOT_FOUND");
    assert_eq!(foreign.code(), Code::NotFound);
    assert_eq!(
        foreign.message().replace(&session, "ID"),
        missing.message().replace(&unknown, "ID"),
        "another tenant's session answers exactly like an unknown one"
    );
}

#[tokio::test]
async fn watch_a_watcher_that_never_reads_is_ended_while_the_others_go_on() {
    const NODES: usize = 120;
    let fall_behind = Duration::from_secs(1);
    let mut app = spawn_app_with(Options {
        limits: Limits {
            watch_fall_behind: fall_behind,
            ..Limits::default()
        },
        ..Options::default()
    })
    .await;
    let s = app.create_session().await;
    // Each on a connection of its own: HTTP/2 flow control is per connection too.
    let mut idle = watch(&mut connect(app.addr).await, watch_req(&s, "main")).await;
    let mut reader = watch(&mut connect(app.addr).await, watch_req(&s, "main")).await;
    started(&mut reader).await;
    // The reader reads as the nodes come; the idle watcher never does.
    let reading = tokio::spawn(async move {
        let mut ids = Vec::new();
        while ids.len() < NODES {
            ids.push(node_of(&next(&mut reader).await).node_id.clone());
        }
        (ids, reader)
    });
    // 120 nodes of 64 KB: far more than the HTTP/2 windows and the stream's buffer hold.
    for batch in 0..NODES / 8 {
        let nodes = (0..8)
            .map(|i| user(&big_text(64 * 1024, &format!("node {batch}.{i}"))))
            .collect();
        app.append(&s, nodes).await;
    }
    let committed = chain(&mut app, &s, "main").await;
    let (read, mut reader) = reading.await.expect("reader");
    assert_eq!(read, committed);
    // Not a readiness wait: this is the idle watcher not reading, for longer than the server
    // lets a full stream wait.
    tokio::time::sleep(fall_behind * 3).await;
    let mut received = 0;
    let mut last_cursor = String::new();
    let status = loop {
        match tokio::time::timeout(PATIENCE, idle.message())
            .await
            .expect("an answer")
        {
            Ok(Some(event)) => {
                if matches!(event.event, Some(Event::Node(_))) {
                    received += 1;
                }
                last_cursor = event.cursor;
            }
            Ok(None) => panic!("the stream ends with a status"),
            Err(status) => break status,
        }
    };
    assert_eq!(
        status.code(),
        Code::ResourceExhausted,
        "{}",
        status.message()
    );
    assert!(
        status.message().contains("fell behind"),
        "{}",
        status.message()
    );
    assert!(
        status.message().contains(&last_cursor),
        "the status names the last cursor sent: {}",
        status.message()
    );
    assert!(
        received < NODES,
        "the server held back {} nodes, not all",
        NODES - received
    );
    // The other watcher goes on, and the idle one resumes without a gap.
    let more = app.append(&s, vec![assistant("still here")]).await;
    assert_eq!(node_of(&next(&mut reader).await).node_id, more.node_ids[0]);
    let mut resumed = watch(
        &mut app.client.clone(),
        pb::WatchRequest {
            after_cursor: last_cursor,
            ..watch_req(&s, "main")
        },
    )
    .await;
    started(&mut resumed).await;
    let mut rest = Vec::new();
    for _ in received..=NODES {
        rest.push(node_of(&next(&mut resumed).await).node_id.clone());
    }
    let mut all = committed.clone();
    all.push(more.node_ids[0].clone());
    assert_eq!(rest, all[received..]);
}

#[tokio::test]
async fn watch_streams_end_at_shutdown_with_their_cursor() {
    let (_db, server) = serve_fresh(Options::default()).await;
    let mut client = connect(server.addr).await;
    let s = new_session(&mut client).await;
    let mut stream = watch(&mut client, watch_req(&s, "")).await;
    let (_, cursor) = started(&mut stream).await;
    // The default grace period is 30 s: a watch holding the server open would take that long.
    server.stop(Duration::from_secs(5)).await;
    let status = tokio::time::timeout(PATIENCE, stream.message())
        .await
        .expect("an answer")
        .expect_err("the watch ends with a status");
    assert_eq!(status.code(), Code::Unavailable, "{}", status.message());
    assert!(status.message().contains(&cursor), "{}", status.message());
}

#[tokio::test]
async fn watch_resumed_far_behind_catches_up_page_by_page() {
    const NODES: usize = 600;
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    let mut stream = watch(&mut app.client.clone(), watch_req(&s, "main")).await;
    let (_, cursor) = started(&mut stream).await;
    drop(stream);
    for batch in 0..NODES / 100 {
        let nodes = (0..100)
            .map(|i| user(&format!("node {batch}.{i}")))
            .collect();
        app.append(&s, nodes).await;
    }
    let mut resumed = watch(
        &mut app.client.clone(),
        pb::WatchRequest {
            after_cursor: cursor,
            ..watch_req(&s, "main")
        },
    )
    .await;
    started(&mut resumed).await;
    let mut seen = Vec::new();
    while seen.len() < NODES {
        seen.push(node_of(&next(&mut resumed).await).node_id.clone());
    }
    assert_eq!(seen, chain(&mut app, &s, "main").await);
}
