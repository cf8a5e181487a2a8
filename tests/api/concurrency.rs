//! Compare-and-swap on branch heads, alone and under contention.

use std::collections::HashSet;

use ctxd::api::pb;
use tonic::Code;

use crate::helpers::*;

const WRITERS: usize = 8;
const PER_WRITER: usize = 25;

fn cas(session: &str, expected: Option<&str>, nodes: Vec<pb::NodeInput>) -> pb::AppendRequest {
    pb::AppendRequest {
        expected_head_id: expected.map(str::to_string),
        ..append_req(session, nodes)
    }
}

#[tokio::test]
async fn expected_head_guards_the_append() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;

    let first = app
        .try_append(cas(&s, Some(""), vec![user("first")]))
        .await
        .expect("Some(\"\") matches a branch with no head");
    assert_code(
        app.try_append(cas(&s, Some(""), vec![user("also first?")]))
            .await,
        Code::Aborted,
    );
    let second = app
        .try_append(cas(&s, Some(&first.head_id), vec![assistant("second")]))
        .await
        .expect("the current head matches");

    let nodes_before = app.node_count().await;
    let stale = app
        .try_append(cas(
            &s,
            Some(&first.head_id),
            vec![user("x"), assistant("y")],
        ))
        .await;
    assert_code(stale, Code::Aborted);
    assert_eq!(
        app.node_count().await,
        nodes_before,
        "an aborted append writes nothing"
    );
    assert_eq!(app.branch(&s, "main").await.head_id, second.head_id);
    assert_eq!(app.log(&s, "main").await.len(), 2);

    // No expectation: always appends.
    app.try_append(cas(&s, None, vec![user("third")]))
        .await
        .expect("append without compare-and-swap");

    // Per branch: a fork's head is its own.
    app.create_branch(&s, "alt", &first.head_id).await;
    let on_alt = pb::AppendRequest {
        branch: "alt".into(),
        ..cas(&s, Some(&second.head_id), vec![assistant("alt")])
    };
    assert_code(app.try_append(on_alt.clone()).await, Code::Aborted);
    let on_alt = pb::AppendRequest {
        expected_head_id: Some(first.head_id.clone()),
        ..on_alt
    };
    app.try_append(on_alt).await.expect("alt's head matches");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_writers_lose_no_update() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    let seed = app.append(&s, vec![system("seed")]).await;

    let mut tasks = Vec::new();
    for writer in 0..WRITERS {
        let mut client = app.client.clone();
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            let mut landed = Vec::new();
            let mut conflicts = 0u32;
            for i in 0..PER_WRITER {
                loop {
                    let session = client
                        .get_session(pb::GetSessionRequest {
                            session_id: s.clone(),
                        })
                        .await
                        .expect("GetSession")
                        .into_inner();
                    let head = session
                        .branches
                        .into_iter()
                        .find(|b| b.name == "main")
                        .expect("main")
                        .head_id;
                    // The text names the head it was written against.
                    let text = format!("w{writer}-{i} after {head}");
                    let req = cas(&s, Some(&head), vec![user(&text)]);
                    match client.append(req).await {
                        Ok(resp) => {
                            let resp = resp.into_inner();
                            assert_eq!(resp.node_ids.len(), 1);
                            assert_eq!(resp.head_id, resp.node_ids[0]);
                            landed.push(resp.node_ids[0].clone());
                            break;
                        }
                        Err(status) if status.code() == Code::Aborted => {
                            conflicts += 1;
                            assert!(conflicts < 100_000, "writer {writer} starves");
                        }
                        Err(status) => panic!("writer {writer}: unexpected {status:?}"),
                    }
                }
            }
            landed
        }));
    }
    let mut acknowledged = Vec::new();
    for task in tasks {
        acknowledged.push(task.await.expect("writer task"));
    }

    let log = app.log(&s, "main").await;
    assert_eq!(
        log.len(),
        WRITERS * PER_WRITER + 1,
        "every acknowledged node, plus the seed"
    );
    for pair in log.windows(2) {
        assert_eq!(pair[0].parent_id, pair[1].node_id, "one linear chain");
    }
    // Each acknowledged append landed exactly on the head it expected.
    for n in &log[..log.len() - 1] {
        let text = match n.content.as_ref().and_then(|c| c.kind.as_ref()) {
            Some(pb::node_input::Kind::Message(m)) => text_of(&m.parts),
            other => panic!("expected a message, got {other:?}"),
        };
        assert!(
            text.ends_with(&format!(" after {}", n.parent_id)),
            "{text:?} was written against another head than its parent {}",
            n.parent_id
        );
    }
    let oldest = log.last().expect("log");
    assert_eq!(oldest.node_id, seed.head_id);
    assert_eq!(oldest.parent_id, "");

    let logged: Vec<&str> = log.iter().map(|n| n.node_id.as_str()).collect();
    let unique: HashSet<&str> = logged.iter().copied().collect();
    assert_eq!(unique.len(), logged.len(), "no node twice");
    for (writer, ids) in acknowledged.iter().enumerate() {
        assert_eq!(ids.len(), PER_WRITER);
        let mut positions = Vec::new();
        for id in ids {
            let pos = logged
                .iter()
                .position(|l| l == id)
                .unwrap_or_else(|| panic!("writer {writer}: acknowledged {id} is lost"));
            positions.push(pos);
        }
        // Newest first: a writer's later nodes come earlier in the log.
        assert!(
            positions.windows(2).all(|w| w[0] > w[1]),
            "writer {writer}'s nodes keep their order"
        );
    }
}

/// Concurrent appends share transactions (group commit); a refused one in the same batch rolls
/// back alone and the others are all written.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refused_append_in_a_group_commit_rolls_back_alone() {
    let mut app = spawn_app().await;
    let mut sessions = Vec::new();
    for _ in 0..32 {
        sessions.push(app.create_session().await);
    }
    let tasks: Vec<_> = sessions
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let mut client = app.client.clone();
            let nodes = if i % 4 == 3 {
                // Answers no call: refused.
                vec![user(&format!("valid {i}")), tool_result("nope", "x")]
            } else {
                vec![user(&format!("valid {i}")), assistant("ok")]
            };
            let request = append_req(s, nodes);
            tokio::spawn(async move { client.append(request).await })
        })
        .collect();
    for (i, task) in tasks.into_iter().enumerate() {
        let result = task.await.expect("task");
        if i % 4 == 3 {
            assert_eq!(result.expect_err("refused").code(), Code::InvalidArgument);
        } else {
            result.expect("written");
        }
    }
    assert_eq!(
        app.node_count().await,
        24 * 2,
        "every valid append whole, no refused node"
    );
    for (i, s) in sessions.iter().enumerate() {
        let log = app.log(s, "main").await;
        assert_eq!(log.len(), if i % 4 == 3 { 0 } else { 2 }, "session {i}");
    }
}

/// The server remembers each branch's head between appends; a head moved by anything else (a
/// branch deleted and recreated at an older node) is what the next append builds on, and what
/// its `expected_head_id` is compared with.
#[tokio::test]
async fn an_append_builds_on_a_head_moved_since_the_last_append() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    let first = app.append(&s, vec![user("a"), assistant("b")]).await;
    let b = first.node_ids[1].clone();
    let c = app.append(&s, vec![user("c")]).await;

    app.delete_branch(&s, "main").await;
    app.create_branch(&s, "main", &b).await;

    let stale = cas(&s, Some(&c.head_id), vec![user("d")]);
    assert_code(app.try_append(stale).await, Code::Aborted);
    let d = app
        .try_append(cas(&s, Some(&b), vec![user("d")]))
        .await
        .expect("an append expecting the moved head");
    let log: Vec<String> = app
        .log(&s, "main")
        .await
        .into_iter()
        .map(|n| n.node_id)
        .collect();
    assert_eq!(log, vec![d.head_id.clone(), b, first.node_ids[0].clone()]);
    let rendered = transcript(&app.render_branch(&s, "main").await.messages);
    assert_eq!(rendered.len(), 3, "c is off the branch: {rendered:?}");
}

/// Another process writing the same database moves a head behind the server's back: the server's
/// next append sees that head and its pairing state, not what it remembered.
#[tokio::test]
async fn an_append_sees_what_another_process_appended() {
    use ctxd::domain::{BranchName, NodeContent, Part, Role, SessionId, ToolCall};
    use ctxd::store::{AppendRequest, AppendTarget};

    let mut app = spawn_app().await;
    let s = app.create_session().await;
    app.append(&s, vec![user("q"), assistant("a")]).await;

    let other = app.db.open().await;
    let scoped = other
        .scope(
            &ctxd::domain::Tenant::local(),
            SessionId::parse("session_id", &s).expect("a session id"),
        )
        .await
        .expect("the session, scoped");
    let theirs = other
        .append(AppendRequest {
            session: scoped,
            target: AppendTarget::Branch(BranchName::main()),
            expected_head: None,
            idempotency_key: None,
            pinned: Vec::new(),
            nodes: vec![
                NodeContent::Message {
                    role: Role::User,
                    parts: vec![Part::Text("again".into())],
                    tool_calls: vec![],
                },
                NodeContent::Message {
                    role: Role::Assistant,
                    parts: vec![],
                    tool_calls: vec![ToolCall {
                        call_id: "c1".into(),
                        name: "read".into(),
                        arguments_json: "{}".into(),
                    }],
                },
            ],
        })
        .await
        .expect("the other process's append");
    other.close().await;

    // Its call is pending: a message cannot follow, its result can.
    assert_status(
        app.try_append(append_req(&s, vec![user("next")])).await,
        Code::FailedPrecondition,
        "nodes[0]",
    );
    let answered = app.append(&s, vec![tool_result("c1", "done")]).await;
    let node = app.get_nodes(&s, &answered.node_ids).await.remove(0);
    assert_eq!(node.parent_id, theirs.head_id);
    assert_eq!(app.log(&s, "main").await.len(), 5);
}

/// An append of 1,200 nodes, each with a text long enough to be a blob, is written whole: every
/// node, every distinct blob, in order.
#[tokio::test]
async fn an_append_of_1200_nodes_is_whole() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    let nodes: Vec<pb::NodeInput> = (0..1_200)
        .map(|i| {
            let text = big_text(1_100, &format!("n{i}"));
            if i % 2 == 0 {
                user(&text)
            } else {
                assistant(&text)
            }
        })
        .collect();
    let written = app.append(&s, nodes).await;
    assert_eq!(written.node_ids.len(), 1_200);
    let log = app.log(&s, "main").await;
    let ids: Vec<String> = log.iter().rev().map(|n| n.node_id.clone()).collect();
    assert_eq!(ids, written.node_ids, "stored in order, parent to child");
    assert_eq!(app.blob_count().await, 1_200);
    let rendered = app.render_branch(&s, "main").await.messages;
    assert_eq!(rendered.len(), 1_200);
    assert_eq!(
        text_of(&rendered[1_199].parts),
        big_text(1_100, "n1199"),
        "the last node's text"
    );
}

/// Appends to many sessions at once, twice: batches of many targets, the second round on chain
/// states the committer remembers, each used only once its stored head is read back unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn appends_to_many_sessions_at_once_chain_on_their_own_heads() {
    const SESSIONS: usize = 150;
    let mut app = spawn_app().await;
    let mut sessions = Vec::new();
    for _ in 0..SESSIONS {
        sessions.push(app.create_session().await);
    }
    let mut heads = Vec::new();
    for round in 0..2 {
        let tasks: Vec<_> = sessions
            .iter()
            .map(|s| {
                let mut client = app.client.clone();
                let node = if round == 0 {
                    user(&format!("{s} asks"))
                } else {
                    assistant(&format!("{s} answers"))
                };
                let request = append_req(s, vec![node]);
                tokio::spawn(async move { client.append(request).await })
            })
            .collect();
        heads.clear();
        for task in tasks {
            heads.push(
                task.await
                    .expect("task")
                    .expect("append")
                    .into_inner()
                    .head_id,
            );
        }
    }
    for (s, head) in sessions.iter().zip(&heads) {
        let log = app.log(s, "main").await;
        assert_eq!(log.len(), 2, "session {s}");
        assert_eq!(&log[0].node_id, head);
        assert_eq!(log[0].parent_id, log[1].node_id);
        let rendered = app.render_branch(s, "main").await.messages;
        assert_eq!(
            transcript(&rendered),
            vec![format!("user: {s} asks"), format!("assistant: {s} answers")]
        );
    }
}

/// Other writes take their turn between group commits. 32 tasks append without pause while
/// sessions and branches are created; with a 50 ms busy timeout, a write that waited in
/// SQLite's busy handler instead (it sleeps, then retries, and can miss every gap between two
/// commits) would fail as busy. Every one succeeds, and every append is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn other_writes_get_their_turn_under_a_stream_of_appends() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::time::Duration;

    use ctxd::domain::{BranchName, NodeContent, Part, Role, Tenant};
    use ctxd::store::{AppendRequest, AppendTarget, Config, PathTarget, Store};

    let dir = tempfile::tempdir().expect("a temp dir");
    let config = Config {
        busy_timeout: Duration::from_millis(50),
        ..Config::default()
    };
    let store = Store::open_with(&dir.path().join("turns.db"), config)
        .await
        .expect("open the store");
    let stop = Arc::new(AtomicBool::new(false));
    let appended = Arc::new(AtomicUsize::new(0));
    let mut appenders = Vec::new();
    for _ in 0..32 {
        let (store, stop, appended) = (store.clone(), Arc::clone(&stop), Arc::clone(&appended));
        let created = store
            .create_session(&Tenant::local(), Default::default(), None)
            .await
            .expect("a session")
            .id;
        let session = store
            .scope(&Tenant::local(), created)
            .await
            .expect("its own session");
        appenders.push(tokio::spawn(async move {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                let role = if n % 2 == 0 {
                    Role::User
                } else {
                    Role::Assistant
                };
                store
                    .append(AppendRequest {
                        session,
                        target: AppendTarget::Branch(BranchName::main()),
                        expected_head: None,
                        idempotency_key: None,
                        pinned: Vec::new(),
                        nodes: vec![NodeContent::Message {
                            role,
                            parts: vec![Part::Text(format!("message {n}"))],
                            tool_calls: vec![],
                        }],
                    })
                    .await
                    .expect("an append");
                n += 1;
                appended.fetch_add(1, Ordering::Relaxed);
            }
            (session, n)
        }));
    }
    // The appenders are under way before the other writes start.
    while appended.load(Ordering::Relaxed) < 500 {
        tokio::task::yield_now().await;
    }
    for i in 0..200 {
        let session = store
            .create_session(&Tenant::local(), Default::default(), None)
            .await
            .unwrap_or_else(|e| panic!("CreateSession {i} under appends: {e}"));
        let scoped = store
            .scope(&Tenant::local(), session.id)
            .await
            .expect("its own session");
        store
            .create_branch(
                scoped,
                BranchName::parse("name", "side").expect("a name"),
                None,
            )
            .await
            .unwrap_or_else(|e| panic!("CreateBranch {i} under appends: {e}"));
    }
    stop.store(true, Ordering::Relaxed);
    for appender in appenders {
        let (session, n) = appender.await.expect("an appender");
        let path = store
            .load_path(session, &PathTarget::Branch(BranchName::main()))
            .await
            .expect("the session's path");
        assert_eq!(
            path.nodes.len(),
            n,
            "session {session} holds each of its appends"
        );
    }
    store.close().await;
}

/// An append that finds the committer idle commits on its own task (SQLite); appends that
/// arrive together still share batches, and every one is acknowledged and stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_append_alone_commits_inline_and_a_crowd_shares_batches() {
    let db = TestDb::new().await;
    let store = db.open().await;
    let server = serve_store(store.clone(), ctxd::server::Options::default()).await;
    let mut client = connect(server.addr).await;
    let session = new_session(&mut client).await;
    let before = store.commit_counts();
    for i in 0..20 {
        client
            .append(append_req(&session, vec![user(&format!("alone {i}"))]))
            .await
            .expect("append");
    }
    let alone = store.commit_counts();
    assert_eq!(alone.batches - before.batches, 20, "one batch an append");
    if db.is_postgres() {
        // The PostgreSQL committer's statements suspend: it never runs on a caller's task.
        assert_eq!(alone.inline, 0);
        // Every append after the first builds on the head the committer remembers: one
        // statement each, no read.
        assert_eq!(alone.at_once - before.at_once, 19, "{alone:?}");
    } else {
        assert_eq!(alone.inline - before.inline, 20, "{alone:?}");
        assert_eq!(alone.at_once, 0);
    }

    const CROWD: usize = 64;
    const EACH: usize = 20;
    let tasks: Vec<_> = (0..CROWD)
        .map(|t| {
            let mut client = client.clone();
            let session = session.clone();
            tokio::spawn(async move {
                for i in 0..EACH {
                    client
                        .append(append_req(&session, vec![user(&format!("{t}/{i}"))]))
                        .await
                        .expect("append");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("appender");
    }
    let crowd = store.commit_counts();
    assert!(
        crowd.batches - alone.batches < (CROWD * EACH) as u64,
        "appends shared batches: {crowd:?}"
    );
    let mut log = pb::LogRequest {
        session_id: session.clone(),
        limit: 1000,
        ..Default::default()
    };
    let mut stored = 0;
    loop {
        let page = client.log(log.clone()).await.expect("log").into_inner();
        stored += page.nodes.len();
        if page.next_page_token.is_empty() {
            break;
        }
        log.page_token = page.next_page_token;
    }
    assert_eq!(stored, 20 + CROWD * EACH);
    server.stop(std::time::Duration::from_secs(10)).await;
}

/// A branch rendered before and changed since only by this process's appends loads from
/// memory (SQLite, whose committer's connection tells when another commits); a pin, a reset or
/// an append by another process is seen by the next render all the same.
#[tokio::test]
async fn a_render_loads_from_memory_until_another_process_writes() {
    use ctxd::domain::{BranchName, NodeContent, NodeId, Part, Role, SessionId, Tenant};
    use ctxd::store::{AppendRequest, AppendTarget, PathTarget, Store};

    let db = TestDb::new().await;
    let store = db.open().await;
    let server = serve_store(store.clone(), ctxd::server::Options::default()).await;
    let mut client = connect(server.addr).await;
    let session = new_session(&mut client).await;
    let id = SessionId::parse("session_id", &session).expect("a session id");
    let main = PathTarget::Branch(BranchName::main());
    let texts = |store: Store| {
        let main = main.clone();
        async move {
            let scoped = store.scope(&Tenant::local(), id).await.expect("scoped");
            let view = store.load_path(scoped, &main).await.expect("the path");
            let texts: Vec<String> = view
                .nodes
                .iter()
                .map(|n| match &n.content {
                    NodeContent::Message { parts, .. } => match &parts[0] {
                        Part::Text(t) => t.clone(),
                        other => format!("{other:?}"),
                    },
                    other => format!("{other:?}"),
                })
                .collect();
            let mut pinned: Vec<NodeId> = view.pinned.into_iter().collect();
            pinned.sort();
            (texts, pinned)
        }
    };
    // What memory is expected to have answered since `before`.
    let sqlite = !db.is_postgres();
    let from_memory = |before: u64, hits: u64| {
        let expected = if sqlite { hits } else { 0 };
        assert_eq!(store.paths_from_memory() - before, expected);
    };

    client
        .append(append_req(&session, vec![user("q"), assistant("a")]))
        .await
        .expect("append");
    let before = store.paths_from_memory();
    assert_eq!(texts(store.clone()).await.0, ["q", "a"]);
    from_memory(before, 0);
    let appended = client
        .append(append_req(&session, vec![user("more")]))
        .await
        .expect("append")
        .into_inner();
    let before = store.paths_from_memory();
    assert_eq!(texts(store.clone()).await.0, ["q", "a", "more"]);
    // The render reads the appended path, and the in-process rendering agrees.
    let rendered = client
        .render(render_req(&session, Target::Branch("main".into())))
        .await
        .expect("render")
        .into_inner();
    assert_eq!(rendered.head_id, appended.head_id);
    let last = rendered.messages.last().expect("messages");
    assert_eq!(text_of(&last.parts), "more");
    from_memory(before, 2);

    // Another process appends, pins, then moves the branch back.
    let other = db.open().await;
    let scoped = other.scope(&Tenant::local(), id).await.expect("scoped");
    let theirs = other
        .append(AppendRequest {
            session: scoped,
            target: AppendTarget::Branch(BranchName::main()),
            expected_head: None,
            idempotency_key: None,
            pinned: Vec::new(),
            nodes: vec![NodeContent::Message {
                role: Role::Assistant,
                parts: vec![Part::Text("theirs".into())],
                tool_calls: vec![],
            }],
        })
        .await
        .expect("the other process's append");
    let before = store.paths_from_memory();
    assert_eq!(texts(store.clone()).await.0, ["q", "a", "more", "theirs"]);
    from_memory(before, 0);
    assert_eq!(texts(store.clone()).await.0, ["q", "a", "more", "theirs"]);
    from_memory(before, 1);

    let head = NodeId::parse("head_id", &theirs.head_id).expect("a node id");
    other.pin(scoped, &[head], true).await.expect("pin");
    assert_eq!(texts(store.clone()).await.1, [head]);
    let more = NodeId::parse("head_id", &appended.head_id).expect("a node id");
    other
        .reset_branch(scoped, BranchName::main(), Some(more), None)
        .await
        .expect("reset");
    assert_eq!(texts(store.clone()).await.0, ["q", "a", "more"]);
    other.close().await;

    // This process's own writes other than appends are seen too.
    store.pin(scoped, &[head], false).await.expect("unpin");
    assert_eq!(
        texts(store.clone()).await,
        (vec!["q".into(), "a".into(), "more".into()], vec![])
    );
    server.stop(std::time::Duration::from_secs(10)).await;
}
