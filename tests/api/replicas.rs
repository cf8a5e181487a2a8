//! Several ctxd processes on one PostgreSQL database are one service: concurrent CAS appends
//! spread over two replicas build one linear chain, a plan prepared on one commits on the
//! other, an idempotency key holds across them, and kill -9 of one under load loses nothing
//! acknowledged while the other keeps serving. PostgreSQL only: without
//! `CTXD_TEST_DATABASE_URL` these tests say so and pass.

use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

use ctxd::api::pb;
use ctxd::server::Options;
use tonic::Code;

use crate::daemon::{Daemon, Serve};
use crate::helpers::*;

/// The PostgreSQL server to run on; `None` (after saying why) when none is named.
pub(crate) fn server_or_skip(test: &str) -> Option<String> {
    let server = postgres_server();
    if server.is_none() {
        eprintln!("{test}: skipped: set {DATABASE_URL} to a PostgreSQL server to run it");
    }
    server
}

/// Two in-process servers on one fresh PostgreSQL schema, and a client of each.
async fn two_replicas(server: String) -> (TestDb, [Server; 2], [Client; 2]) {
    let db = TestDb::postgres(server).await;
    let a = serve_store(db.open().await, Options::default()).await;
    let b = serve_store(db.open().await, Options::default()).await;
    let clients = [connect(a.addr).await, connect(b.addr).await];
    (db, [a, b], clients)
}

/// Nodes of `branch` from head to root, as `client` reads them.
async fn chain(client: &mut Client, session: &str) -> Vec<pb::Node> {
    let mut nodes = Vec::new();
    let mut req = log_req(session);
    loop {
        let page = client.log(req.clone()).await.expect("Log").into_inner();
        nodes.extend(page.nodes);
        if page.next_page_token.is_empty() {
            return nodes;
        }
        req.page_token = page.next_page_token;
    }
}

const APPENDERS: usize = 16;
const APPENDS_EACH: usize = 8;

#[tokio::test]
async fn cas_appenders_on_two_replicas_build_one_linear_chain() {
    let Some(server) = server_or_skip("cas_appenders_on_two_replicas_build_one_linear_chain")
    else {
        return;
    };
    let (_db, _servers, [mut a, b]) = two_replicas(server).await;
    let session = new_session(&mut a).await;

    let mut tasks = Vec::new();
    for worker in 0..APPENDERS {
        let mut client = if worker % 2 == 0 {
            a.clone()
        } else {
            b.clone()
        };
        let session = session.clone();
        tasks.push(tokio::spawn(async move {
            let mut acked = Vec::new();
            for i in 0..APPENDS_EACH {
                loop {
                    let head = head_of(&mut client, &session, "main").await;
                    let request = pb::AppendRequest {
                        expected_head_id: Some(head),
                        ..append_req(&session, vec![user(&format!("w{worker}-{i}"))])
                    };
                    match client.append(request).await {
                        Ok(response) => {
                            acked.push(response.into_inner().head_id);
                            break;
                        }
                        // A head another appender moved first, or a conflict the database
                        // broke: nothing was written either way.
                        Err(status) if status.code() == Code::Aborted => {}
                        Err(status) => panic!("worker {worker}: unexpected {status:?}"),
                    }
                }
            }
            acked
        }));
    }
    let mut acked = HashSet::new();
    for task in tasks {
        acked.extend(task.await.expect("appender"));
    }
    assert_eq!(acked.len(), APPENDERS * APPENDS_EACH);

    // Both replicas read the same chain: one node per acknowledged append, each the child of
    // the one before, and the same head hash.
    let mut b = b;
    let from_a = chain(&mut a, &session).await;
    let from_b = chain(&mut b, &session).await;
    assert_eq!(from_a.len(), APPENDERS * APPENDS_EACH);
    let ids_a: Vec<&str> = from_a.iter().map(|n| n.node_id.as_str()).collect();
    let ids_b: Vec<&str> = from_b.iter().map(|n| n.node_id.as_str()).collect();
    assert_eq!(ids_a, ids_b);
    for pair in from_a.windows(2) {
        assert_eq!(
            pair[0].parent_id, pair[1].node_id,
            "a linear chain, newest first"
        );
    }
    assert_eq!(from_a.last().expect("a root").parent_id, "");
    let stored: HashSet<String> = ids_a.iter().map(|id| id.to_string()).collect();
    assert_eq!(stored, acked, "every acknowledged append, and only those");
    let session_a = a
        .get_session(get_session_req(&session))
        .await
        .expect("GetSession");
    let session_b = b
        .get_session(get_session_req(&session))
        .await
        .expect("GetSession");
    assert_eq!(
        session_a.into_inner().branches,
        session_b.into_inner().branches
    );
}

/// Two replicas appending to the same sessions in opposite orders: every batch locks its
/// branches in one order (by session, then branch), so neither waits on the other in a cycle
/// and PostgreSQL never has a deadlock to break.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_appending_to_shared_sessions_in_opposite_orders_never_deadlock() {
    let Some(server) =
        server_or_skip("replicas_appending_to_shared_sessions_in_opposite_orders_never_deadlock")
    else {
        return;
    };
    let (counts, distributed) = opposite_orders(server, ctxd::store::Config::default()).await;
    // On one database a batch's sessions spread over the committer's 8 lanes (on Citus, its
    // shards): batches of several sessions split, into 8 transactions at most.
    if !distributed {
        assert!(
            counts.iter().any(|c| c.transactions > c.batches)
                && counts.iter().all(|c| c.transactions <= 8 * c.batches),
            "batches spread over the lanes: {counts:?}"
        );
    }
}

/// The same in the committer's distributed form (a transaction per session's appends, as on
/// Citus per shard's, run at once on the committer's lanes): batches split, and still no
/// lock cycle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_committing_per_session_split_batches_and_never_deadlock() {
    let Some(server) =
        server_or_skip("replicas_committing_per_session_split_batches_and_never_deadlock")
    else {
        return;
    };
    let config = ctxd::store::Config {
        pg_batch_per_session: true,
        ..ctxd::store::Config::default()
    };
    let (counts, _) = opposite_orders(server, config).await;
    assert!(
        counts.iter().any(|c| c.transactions > c.batches),
        "batches holding several sessions were split: {counts:?}"
    );
}

/// Two replicas with `config`, 16 appenders each, appending round the same 8 sessions (replica
/// b the other way round); checks every append is stored and none was retried after a lock
/// cycle, and returns what each replica's committer counted and whether the database is a Citus
/// cluster's (the suite runs there too).
async fn opposite_orders(
    server: String,
    config: ctxd::store::Config,
) -> ([ctxd::store::CommitCounts; 2], bool) {
    const SESSIONS: usize = 8;
    const TASKS_EACH: usize = 16;
    const ROUNDS: usize = 6;
    let db = TestDb::postgres(server).await;
    let stores = [
        db.open_with(config.clone()).await,
        db.open_with(config).await,
    ];
    let a = serve_store(stores[0].clone(), Options::default()).await;
    let b = serve_store(stores[1].clone(), Options::default()).await;
    let mut clients = [connect(a.addr).await, connect(b.addr).await];
    let mut sessions = Vec::new();
    for _ in 0..SESSIONS {
        sessions.push(new_session(&mut clients[0]).await);
    }
    let mut tasks = Vec::new();
    for (replica, client) in clients.iter().enumerate() {
        for task in 0..TASKS_EACH {
            let mut client = client.clone();
            // Each task starts at another session; replica b goes round the other way.
            let mut order = sessions.clone();
            order.rotate_left(task % SESSIONS);
            if replica == 1 {
                order.reverse();
            }
            tasks.push(tokio::spawn(async move {
                for round in 0..ROUNDS {
                    for session in &order {
                        let text = format!("replica {replica} task {task} round {round}");
                        client
                            .append(append_req(session, vec![user(&text)]))
                            .await
                            .unwrap_or_else(|s| panic!("append: {s:?}"));
                    }
                }
            }));
        }
    }
    for task in tasks {
        task.await.expect("appender");
    }
    let mut stored = 0;
    for session in &sessions {
        stored += chain(&mut clients[1], session).await.len();
    }
    assert_eq!(stored, 2 * TASKS_EACH * ROUNDS * SESSIONS);
    let counts = stores.each_ref().map(|s| s.commit_counts());
    assert!(
        counts.iter().all(|c| c.batches > 0),
        "both replicas committed: {counts:?}"
    );
    assert!(
        counts
            .iter()
            .any(|c| c.batches < (TASKS_EACH * ROUNDS * SESSIONS) as u64),
        "appends shared batches, so batches held several sessions: {counts:?}"
    );
    assert_eq!(
        counts.map(|c| c.conflict_retries),
        [0, 0],
        "no batch was rolled back for a lock cycle: {counts:?}"
    );
    let citus = db
        .count("SELECT count(*) FROM pg_extension WHERE extname = 'citus'")
        .await;
    (counts, citus > 0)
}

#[tokio::test]
async fn a_plan_prepared_on_one_replica_commits_on_the_other() {
    let Some(server) = server_or_skip("a_plan_prepared_on_one_replica_commits_on_the_other") else {
        return;
    };
    let (_db, _servers, [mut a, mut b]) = two_replicas(server).await;
    let session = four_file_reads(&mut a).await;
    let plan = prepare_needed(&mut a, &session).await;
    let commit = pb::CommitSummaryRequest {
        compaction_id: plan.clone(),
        text: "the four files were read and answered".into(),
        model: "test-model".into(),
    };
    let outcome = b
        .commit_summary(commit.clone())
        .await
        .expect("CommitSummary on the other replica")
        .into_inner();
    assert_eq!(
        outcome.reason(),
        pb::CompactionReason::Applied,
        "{outcome:?}"
    );
    // Committed once: the first replica sees the plan applied.
    let again = a.commit_summary(commit).await;
    assert_code(again, Code::FailedPrecondition);
    let rendered = a
        .render(render_req(&session, Target::Branch("main".into())))
        .await
        .expect("Render")
        .into_inner();
    assert_eq!(rendered.report.expect("a report").summary_ids.len(), 1);
}

#[tokio::test]
async fn an_idempotency_key_holds_across_replicas() {
    let Some(server) = server_or_skip("an_idempotency_key_holds_across_replicas") else {
        return;
    };
    let (db, _servers, [mut a, mut b]) = two_replicas(server).await;
    let session = new_session(&mut a).await;
    let request = pb::AppendRequest {
        idempotency_key: "k-1".into(),
        ..append_req(&session, vec![user("once")])
    };
    let first = a
        .append(request.clone())
        .await
        .expect("Append")
        .into_inner();
    let retry = b.append(request).await.expect("the retry").into_inner();
    assert_eq!(first, retry);
    assert_eq!(db.count("SELECT COUNT(*) FROM nodes").await, 1);

    // Session creation keys too, raced on both replicas at once.
    let create = pb::CreateSessionRequest {
        idempotency_key: "create-1".into(),
        ..Default::default()
    };
    let (x, y) = tokio::join!(
        a.create_session(create.clone()),
        b.create_session(create.clone())
    );
    assert_eq!(
        x.expect("CreateSession").into_inner().session_id,
        y.expect("CreateSession").into_inner().session_id
    );
}

/// `ctxd serve` on `db` (a PostgreSQL URL), its stderr in `log`.
async fn replica(db: &str, log: &Path) -> Daemon {
    Serve::new(Path::new(db))
        .stderr(log)
        .ready_within(Duration::from_secs(30))
        .start()
        .await
}

#[tokio::test]
async fn killing_one_replica_under_load_loses_nothing_acknowledged() {
    let Some(server) = server_or_skip("killing_one_replica_under_load_loses_nothing_acknowledged")
    else {
        return;
    };
    let db = TestDb::postgres(server).await;
    let logs = tempfile::tempdir().expect("a dir for the replicas' logs");
    let doomed = replica(&db.url(), &logs.path().join("doomed.log")).await;
    let survivor = replica(&db.url(), &logs.path().join("survivor.log")).await;
    let mut client = connect(survivor.local()).await;
    let session = new_session(&mut client).await;

    // Four appenders on each replica, each on a branch of its own, appending until told to
    // stop or their replica is gone; each keeps what was acknowledged.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let (progress, mut acks) = tokio::sync::watch::channel(0usize);
    let progress = std::sync::Arc::new(progress);
    let mut tasks = Vec::new();
    for worker in 0..8 {
        let addr = if worker < 4 {
            doomed.local()
        } else {
            survivor.local()
        };
        let mut client = connect(addr).await;
        let branch = format!("w{worker}");
        client
            .create_branch(pb::CreateBranchRequest {
                session_id: session.clone(),
                name: branch.clone(),
                from_node_id: String::new(),
            })
            .await
            .expect("CreateBranch");
        let session = session.clone();
        let stopped = stopped.clone();
        let progress = std::sync::Arc::clone(&progress);
        tasks.push(tokio::spawn(async move {
            let mut acked = Vec::new();
            let mut i = 0;
            while !*stopped.borrow() {
                let request = pb::AppendRequest {
                    branch: branch.clone(),
                    ..append_req(&session, vec![user(&format!("{branch}-{i}"))])
                };
                match client.append(request).await {
                    Ok(response) => {
                        acked.push(response.into_inner().head_id);
                        progress.send_modify(|n| *n += 1);
                    }
                    // Its replica is gone: what it acknowledged is all it can claim.
                    Err(_) if worker < 4 => break,
                    Err(status) => panic!("the surviving replica failed: {status:?}"),
                }
                i += 1;
            }
            (worker, acked)
        }));
    }
    // Kill while the appenders are in full flow, so the kill lands mid-stream.
    acks.wait_for(|n| *n >= 80).await.expect("appenders run");
    doomed.kill().await;
    let after_kill = *acks.borrow();
    // The survivor keeps serving: its appenders go on past the kill.
    acks.wait_for(|n| *n >= after_kill + 40)
        .await
        .expect("the survivor's appenders run");
    stop.send(true).expect("the appenders listen");
    let mut acked = Vec::new();
    let mut on_doomed = 0;
    for task in tasks {
        let (worker, theirs) = task.await.expect("appender");
        if worker < 4 {
            on_doomed += theirs.len();
        }
        acked.extend(theirs);
    }
    assert!(
        on_doomed > 0,
        "the killed replica acknowledged appends before it died"
    );
    let mut stored = Vec::new();
    for ids in acked.chunks(500) {
        let nodes = client
            .get_nodes(get_nodes_req(&session, ids.to_vec()))
            .await
            .expect("every acknowledged node is readable from the survivor")
            .into_inner()
            .nodes;
        stored.extend(nodes.into_iter().map(|n| n.node_id));
    }
    assert_eq!(stored, acked);
    // And it still takes appends.
    client
        .append(append_req(&session, vec![user("after the kill")]))
        .await
        .expect("Append after the kill");
    survivor.stop().await;
}

/// The suite runs on the backend `CTXD_TEST_DATABASE_URL` names.
#[tokio::test]
async fn the_suite_runs_on_the_named_backend() {
    let mut app = spawn_app().await;
    assert_eq!(app.db.is_postgres(), postgres_server().is_some());
    assert_eq!(app.db.sqlite_path().is_some(), postgres_server().is_none());
    let session = app.create_session().await;
    app.append(&session, vec![user("q")]).await;
    assert_eq!(app.node_count().await, 1);
}

/// A PostgreSQL server that cannot be reached at start: `ctxd serve` says so in one line and
/// exits non-zero, without a panic.
#[tokio::test]
async fn an_unreachable_database_at_start_is_one_clear_line() {
    let exited = crate::daemon::run_to_exit({
        let mut command = crate::daemon::ctxd();
        command.args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--db",
            "postgres://ctxd:secret@127.0.0.1:1/nowhere",
        ]);
        command
    })
    .await;
    assert_eq!(exited.status.code(), Some(1), "{}", exited.stderr);
    let line = exited.stderr.trim();
    assert!(
        line.starts_with("ctxd: postgres://ctxd:****@127.0.0.1:1/nowhere: cannot be reached"),
        "{line}"
    );
    assert!(!line.contains("secret"), "the password stays out: {line}");
    assert!(!exited.stderr.contains("panicked"), "{}", exited.stderr);
}

/// Every connection of a running server dropped by the database: calls meanwhile fail as
/// UNAVAILABLE (never INTERNAL), and the server recovers without a restart.
#[tokio::test]
async fn a_dropped_database_connection_is_unavailable_then_recovers() {
    let Some(server) = server_or_skip("a_dropped_database_connection_is_unavailable_then_recovers")
    else {
        return;
    };
    let db = TestDb::postgres(server.clone()).await;
    let name = format!("ctxd-{}", uuid::Uuid::now_v7().simple());
    let store = ctxd::store::Store::connect(
        &format!("{}&application_name={name}", db.url()),
        ctxd::store::Config::default(),
    )
    .await
    .expect("open the store");
    let serving = serve_store(store, Options::default()).await;
    let mut client = connect(serving.addr).await;
    let session = new_session(&mut client).await;
    client
        .append(append_req(&session, vec![user("before")]))
        .await
        .expect("Append");

    let mut admin = <sqlx::PgConnection as sqlx::Connection>::connect(&server)
        .await
        .expect("connect as admin");
    let dropped: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
    )
    .bind(&name)
    .fetch_all(&mut admin)
    .await
    .expect("terminate the server's connections");
    assert!(!dropped.is_empty(), "the server had connections to drop");

    let mut recovered = false;
    for i in 0..20 {
        let append = client
            .append(append_req(&session, vec![user(&format!("after {i}"))]))
            .await;
        let render = client
            .render(render_req(&session, Target::Branch("main".into())))
            .await;
        match (append, render) {
            (Ok(_), Ok(_)) => {
                recovered = true;
                break;
            }
            (a, r) => {
                for status in [a.err(), r.err()].into_iter().flatten() {
                    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
                }
            }
        }
    }
    assert!(recovered, "the server serves again without a restart");
}
