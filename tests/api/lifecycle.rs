//! Deleting sessions (tombstones, shared blobs, idempotence, tenants, an open compaction, a
//! race with appends), the retention policy, CollectGarbage and BackupDatabase, through the
//! real server on both backends.

use std::collections::BTreeMap;
use std::time::Duration;

use ctxd::api::pb;
use ctxd::api::pb::context_store_client::ContextStoreClient;
use ctxd::auth::ApiKeys;
use ctxd::server::Options;
use ctxd::workflow::retention::Retention;
use tonic::Code;

use crate::helpers::*;

/// Every table's row count, by table: what a deletion must give back exactly.
async fn table_counts(db: &TestDb) -> BTreeMap<&'static str, i64> {
    let mut counts = BTreeMap::new();
    let common: [(&str, &'static str); 12] = [
        ("sessions", "SELECT COUNT(*) FROM sessions"),
        ("nodes", "SELECT COUNT(*) FROM nodes"),
        ("branches", "SELECT COUNT(*) FROM branches"),
        ("functions", "SELECT COUNT(*) FROM functions"),
        ("idempotency", "SELECT COUNT(*) FROM idempotency"),
        ("session_keys", "SELECT COUNT(*) FROM session_keys"),
        ("compactions", "SELECT COUNT(*) FROM compactions"),
        ("summaries", "SELECT COUNT(*) FROM summaries"),
        (
            "compaction_events",
            "SELECT COUNT(*) FROM compaction_events",
        ),
        ("pins", "SELECT COUNT(*) FROM pins"),
        ("blobs", "SELECT COUNT(*) FROM blobs"),
        (
            "summarizer_outputs",
            "SELECT COUNT(*) FROM summarizer_outputs",
        ),
    ];
    for (table, sql) in common {
        counts.insert(table, db.count(sql).await);
    }
    if db.is_postgres() {
        let owners = db.count("SELECT COUNT(*) FROM compaction_owners").await;
        counts.insert("compaction_owners", owners);
    } else {
        counts.insert(
            "blob_refs",
            db.count("SELECT COUNT(*) FROM blob_refs").await,
        );
    }
    counts
}

/// A session with something in every table: two branches, a function's chain, a pinned node,
/// an idempotent append, a committed summary, a creation key, and `shared` as a tool output.
async fn rich_session(client: &mut Client, shared: &str) -> String {
    let session = client
        .create_session(pb::CreateSessionRequest {
            idempotency_key: format!("create-{}", unknown_id()),
            ..Default::default()
        })
        .await
        .expect("CreateSession")
        .into_inner()
        .session_id;
    for t in 0..4 {
        let id = format!("c{t}");
        client
            .append(pb::AppendRequest {
                idempotency_key: format!("turn-{t}"),
                ..append_req(
                    &session,
                    vec![
                        user(&format!("rich request {t}")),
                        assistant_calls("", vec![call(&id, "read_file", "{}")]),
                        tool_result(&id, &big_text(3000, &format!("rich file {t}"))),
                        assistant(&format!("rich answer {t}")),
                    ],
                )
            })
            .await
            .expect("Append");
    }
    let appended = client
        .append(append_req(
            &session,
            vec![
                user("run the helper"),
                assistant_calls("", vec![call("f1", "helper", "{}")]),
                function_call("f1", "do it", pb::Expose::Io),
            ],
        ))
        .await
        .expect("Append")
        .into_inner();
    let function = appended.node_ids[2].clone();
    client
        .append(function_req(
            &session,
            &function,
            vec![
                user("inside"),
                assistant_calls("", vec![call("s1", "read_file", "{}")]),
                tool_result("s1", shared),
                assistant("done inside"),
            ],
        ))
        .await
        .expect("Append in the function");
    client
        .append(append_req(
            &session,
            vec![
                function_result("f1", "helped", pb::FunctionStatus::Completed),
                assistant("all done"),
            ],
        ))
        .await
        .expect("Append");
    client
        .create_branch(create_branch_req(&session, "alt", &appended.node_ids[0]))
        .await
        .expect("CreateBranch");
    client
        .pin(pb::PinRequest {
            session_id: session.clone(),
            node_ids: vec![appended.node_ids[0].clone()],
        })
        .await
        .expect("Pin");
    let plan = prepare_needed(client, &session).await;
    let outcome = client
        .commit_summary(pb::CommitSummaryRequest {
            compaction_id: plan,
            text: "the rich session so far".into(),
            model: "test".into(),
        })
        .await
        .expect("CommitSummary")
        .into_inner();
    assert!(outcome.applied, "{outcome:?}");
    session
}

async fn delete(
    client: &mut Client,
    session: &str,
) -> Result<pb::DeleteSessionResponse, tonic::Status> {
    client
        .delete_session(pb::DeleteSessionRequest {
            session_id: session.into(),
        })
        .await
        .map(tonic::Response::into_inner)
}

#[tokio::test]
async fn a_deleted_session_leaves_only_its_tombstone_and_shared_blobs_stay() {
    let mut app = spawn_app().await;
    let shared = big_text(5000, "a file both sessions read");
    // The session that stays shares one tool output with the one deleted.
    let keep = app.create_session().await;
    app.append(
        &keep,
        vec![
            user("keep"),
            assistant_calls("", vec![call("k1", "read_file", "{}")]),
            tool_result("k1", &shared),
            assistant("kept"),
        ],
    )
    .await;
    let kept_render = app.render_branch(&keep, "main").await;
    let before = table_counts(&app.db).await;

    let gone = rich_session(&mut app.client, &shared).await;
    let gone_nodes = app.log(&gone, "main").await;
    assert_ne!(table_counts(&app.db).await, before);

    let deleted = delete(&mut app.client, &gone).await.expect("DeleteSession");
    assert!(!deleted.already_deleted);
    let tombstone = deleted.tombstone.expect("a tombstone");
    assert_eq!(tombstone.session_id, gone);
    assert_eq!(
        tombstone.deleted_by, "",
        "the local tenant of a server without keys"
    );
    // Every node: the main chain, the function's chain of four, none on `alt` alone.
    assert_eq!(tombstone.nodes, gone_nodes.len() as u64 + 4);
    assert_eq!(tombstone.branches, 2);
    assert_eq!(tombstone.summaries, 1);
    assert!(tombstone.deleted_at_unix_ms > 0);

    // Every row of it is gone, and nothing of the other session's.
    assert_eq!(table_counts(&app.db).await, before);
    assert_eq!(app.db.count("SELECT COUNT(*) FROM tombstones").await, 1);
    assert_eq!(app.render_branch(&keep, "main").await, kept_render);

    // Every way to it answers as for an id never seen.
    let c = &mut app.client;
    assert_status(
        c.get_session(get_session_req(&gone)).await,
        Code::NotFound,
        "session",
    );
    assert_status(c.log(log_req(&gone)).await, Code::NotFound, "session");
    assert_status(
        c.get_nodes(get_nodes_req(&gone, vec![gone_nodes[0].node_id.clone()]))
            .await,
        Code::NotFound,
        "session",
    );
    assert_status(
        c.append(append_req(&gone, vec![user("late")])).await,
        Code::NotFound,
        "session",
    );
    assert_status(
        c.render(render_req(&gone, Target::Branch("main".into())))
            .await,
        Code::NotFound,
        "session",
    );
    let listed = app
        .client
        .list_sessions(pb::ListSessionsRequest::default())
        .await;
    let listed: Vec<String> = listed
        .expect("ListSessions")
        .into_inner()
        .sessions
        .into_iter()
        .map(|s| s.session_id)
        .collect();
    assert_eq!(listed, std::slice::from_ref(&keep));

    // Deleting it again answers the same tombstone and changes nothing.
    let again = delete(&mut app.client, &gone)
        .await
        .expect("DeleteSession again");
    assert!(again.already_deleted);
    assert_eq!(again.tombstone, Some(tombstone));
    assert_eq!(table_counts(&app.db).await, before);

    // The last session referring to the shared blob takes it along.
    delete(&mut app.client, &keep).await.expect("DeleteSession");
    assert_eq!(app.db.count("SELECT COUNT(*) FROM blobs").await, 0);
    assert_eq!(app.db.count("SELECT COUNT(*) FROM nodes").await, 0);
    assert_eq!(app.db.count("SELECT COUNT(*) FROM tombstones").await, 2);
}

#[tokio::test]
async fn deleting_unknown_malformed_or_another_tenants_session_is_refused() {
    let mut app = spawn_app().await;
    assert_status(
        delete(&mut app.client, &unknown_id()).await,
        Code::NotFound,
        "session",
    );
    assert_status(
        delete(&mut app.client, "nope").await,
        Code::InvalidArgument,
        "session_id",
    );
    assert_status(
        delete(&mut app.client, "").await,
        Code::InvalidArgument,
        "session_id",
    );

    let (_keys, _db, server) = serve_with_keys("acme key-acme\nglobex key-globex\n").await;
    let mut acme = keyed_client(server.addr, "key-acme").await;
    let mut globex = keyed_client(server.addr, "key-globex").await;
    let session = acme
        .create_session(pb::CreateSessionRequest::default())
        .await
        .expect("CreateSession")
        .into_inner()
        .session_id;
    let request = || pb::DeleteSessionRequest {
        session_id: session.clone(),
    };
    let refused = globex.delete_session(request()).await;
    assert_status(refused, Code::NotFound, "session");
    acme.get_session(get_session_req(&session))
        .await
        .expect("still there");
    let deleted = acme.delete_session(request()).await.expect("DeleteSession");
    assert_eq!(
        deleted
            .into_inner()
            .tombstone
            .expect("tombstone")
            .deleted_by,
        "acme"
    );
    // The tombstone is acme's too: another tenant learns nothing from it.
    assert_status(
        globex.delete_session(request()).await,
        Code::NotFound,
        "session",
    );
    let again = acme
        .delete_session(request())
        .await
        .expect("again")
        .into_inner();
    assert!(again.already_deleted);
}

#[tokio::test]
async fn a_compaction_open_when_its_session_is_deleted_ends_stale() {
    let mut app = spawn_app().await;
    let session = four_file_reads(&mut app.client).await;
    let plan = prepare_needed(&mut app.client, &session).await;
    let cancelled = prepare_needed(&mut app.client, &session).await;
    delete(&mut app.client, &session)
        .await
        .expect("DeleteSession");

    let outcome = app.commit_summary(&plan, "a summary nobody will see").await;
    assert!(!outcome.applied);
    assert_eq!(
        outcome.reason,
        pb::CompactionReason::Stale as i32,
        "{outcome:?}"
    );
    assert_eq!(outcome.compaction_id, plan);
    assert!(outcome.message.contains("deleted"), "{}", outcome.message);
    app.client
        .cancel_compaction(pb::CancelCompactionRequest {
            compaction_id: cancelled,
            ..Default::default()
        })
        .await
        .expect("cancelling a plan of a deleted session is a no-op");
    // Nothing was written by the commit.
    assert_eq!(app.db.count("SELECT COUNT(*) FROM summaries").await, 0);
    assert_eq!(app.db.count("SELECT COUNT(*) FROM compactions").await, 0);
    // An unknown plan is still unknown.
    assert_status(
        app.client
            .commit_summary(pb::CommitSummaryRequest {
                compaction_id: unknown_id(),
                text: "x".into(),
                model: "m".into(),
            })
            .await,
        Code::NotFound,
        "compaction",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_delete_racing_appends_leaves_nothing_half_deleted() {
    let mut app = spawn_app().await;
    let other = app.create_session().await;
    app.append(&other, vec![user("bystander")]).await;
    let before = table_counts(&app.db).await;
    let session = app.create_session().await;
    let (progress, mut acks) = tokio::sync::watch::channel(0usize);
    let progress = std::sync::Arc::new(progress);
    let mut appenders = Vec::new();
    for worker in 0..4 {
        let mut client = connect(app.addr).await;
        let (session, progress) = (session.clone(), std::sync::Arc::clone(&progress));
        appenders.push(tokio::spawn(async move {
            for i in 0.. {
                let text = big_text(2000, &format!("w{worker}-{i}"));
                let request = append_req(&session, vec![user(&text), assistant("ok")]);
                match client.append(request).await {
                    Ok(_) => progress.send_modify(|n| *n += 1),
                    // After the deletion, and only that: the session is gone.
                    Err(status) => {
                        assert_eq!(status.code(), Code::NotFound, "{status:?}");
                        assert!(status.message().contains("session"), "{status:?}");
                        return i;
                    }
                }
            }
            unreachable!("appends fail once the session is deleted")
        }));
    }
    acks.wait_for(|n| *n >= 20).await.expect("appenders run");
    let deleted = delete(&mut app.client, &session)
        .await
        .expect("DeleteSession");
    for appender in appenders {
        appender.await.expect("appender");
    }
    let acked = *acks.borrow();
    let tombstone = deleted.tombstone.expect("tombstone");
    // Every append acknowledged before the deletion committed was deleted with it, whole.
    assert!(
        tombstone.nodes >= 2 * 20 && tombstone.nodes % 2 == 0,
        "{tombstone:?}"
    );
    assert!(
        tombstone.nodes <= 2 * acked as u64,
        "{tombstone:?} after {acked} appends"
    );
    assert_eq!(table_counts(&app.db).await, before);
}

#[tokio::test]
async fn retention_deletes_idle_sessions_in_batches_and_keeps_active_ones() {
    let mut app = spawn_app_with(Options {
        retention: Some(Retention {
            idle: Some(Duration::from_secs(30 * 24 * 3600)),
            every: Duration::from_millis(50),
            batch: 2,
            ..Retention::default()
        }),
        ..Options::default()
    })
    .await;
    let mut idle = Vec::new();
    let mut active = Vec::new();
    for i in 0..7 {
        let session = app.create_session().await;
        app.append(&session, vec![user(&format!("session {i}"))])
            .await;
        if i < 5 {
            idle.push(session)
        } else {
            active.push(session)
        }
    }
    for session in &idle {
        age(&app.db, session, 40).await;
    }
    for session in &idle {
        gone(&mut app.client, session).await;
        let tombstone = delete(&mut app.client, session).await.expect("tombstone");
        assert!(tombstone.already_deleted);
        assert_eq!(
            tombstone.tombstone.expect("tombstone").deleted_by,
            "retention"
        );
    }
    for session in &active {
        app.client
            .get_session(get_session_req(session))
            .await
            .expect("an active session stays");
    }
    assert_eq!(app.db.count("SELECT COUNT(*) FROM sessions").await, 2);
}

/// Makes `session` look idle for `days`: created then, no branch moved since.
async fn age(db: &TestDb, session: &str, days: i64) {
    let at = ctxd::store::now_ms() - days * 24 * 3600 * 1000;
    let id = uuid::Uuid::parse_str(session)
        .expect("uuid")
        .simple()
        .to_string();
    let blob = if db.is_postgres() {
        format!("'\\x{id}'::bytea")
    } else {
        format!("x'{id}'")
    };
    db.execute(&format!(
        "UPDATE sessions SET created_at_ms = {at} WHERE id = {blob}"
    ))
    .await;
    db.execute(&format!(
        "UPDATE branches SET updated_at_ms = {at} WHERE session_id = {blob}"
    ))
    .await;
}

/// Waits (30 s at most) until the retention policy running in the background deleted `session`.
async fn gone<T>(client: &mut ContextStoreClient<T>, session: &str)
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::Error: Into<tonic::codegen::StdError>,
    T::ResponseBody: tonic::codegen::Body<Data = tonic::codegen::Bytes> + Send + 'static,
    <T::ResponseBody as tonic::codegen::Body>::Error: Into<tonic::codegen::StdError> + Send,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match client.get_session(get_session_req(session)).await {
            Err(status) if status.code() == Code::NotFound => return,
            Ok(_) => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "retention deletes {session}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(status) => panic!("{status:?}"),
        }
    }
}

/// Each tenant's `retain=` in the keys file replaces `--retain-idle-days` for its sessions:
/// acme keeps 10 days, globex forever, initech the default 30.
#[tokio::test]
async fn retention_follows_each_tenants_own_limit_from_the_keys_file() {
    let keys = tempfile::NamedTempFile::new().expect("keys file");
    std::fs::write(
        &keys,
        "acme key-acme retain=10\nglobex key-globex retain=never\ninitech key-initech\n",
    )
    .expect("keys");
    let (db, server) = serve_fresh(Options {
        api_keys: Some(ApiKeys::load(keys.path()).expect("keys")),
        retention: Some(Retention {
            idle: Some(Duration::from_secs(30 * 24 * 3600)),
            every: Duration::from_millis(50),
            batch: 2,
            ..Retention::default()
        }),
        ..Options::default()
    })
    .await;
    let mut clients = Vec::new();
    for key in ["key-acme", "key-globex", "key-initech"] {
        clients.push(keyed_client(server.addr, key).await);
    }
    // (tenant, days idle, deleted?)
    let cases = [
        (0, 20, true),
        (0, 5, false),
        (1, 400, false),
        (2, 40, true),
        (2, 20, false),
    ];
    let mut sessions = Vec::new();
    for (tenant, days, _) in cases {
        let session = clients[tenant]
            .create_session(pb::CreateSessionRequest::default())
            .await
            .expect("CreateSession")
            .into_inner()
            .session_id;
        age(&db, &session, days).await;
        sessions.push(session);
    }
    for ((tenant, _, deleted), session) in cases.iter().zip(&sessions) {
        if *deleted {
            gone(&mut clients[*tenant], session).await;
        }
    }
    // A later run, started after the one that deleted those, has looked at every session too.
    let later = clients[2]
        .create_session(pb::CreateSessionRequest::default())
        .await
        .expect("CreateSession")
        .into_inner()
        .session_id;
    age(&db, &later, 31).await;
    gone(&mut clients[2], &later).await;
    for ((tenant, days, deleted), session) in cases.iter().zip(&sessions) {
        if !*deleted {
            clients[*tenant]
                .get_session(get_session_req(session))
                .await
                .unwrap_or_else(|e| panic!("tenant {tenant}'s session idle {days} days: {e:?}"));
        }
    }
}

#[tokio::test]
async fn collect_garbage_reports_the_store_and_gives_freed_pages_back() {
    let mut app = spawn_app().await;
    let session = app.create_session().await;
    for i in 0..40 {
        app.append(
            &session,
            vec![user(&big_text(20_000, &format!("page filler {i}")))],
        )
        .await;
    }
    delete(&mut app.client, &session)
        .await
        .expect("DeleteSession");
    let first = app
        .client
        .collect_garbage(pb::CollectGarbageRequest {})
        .await
        .expect("CollectGarbage")
        .into_inner();
    assert_eq!((first.sessions, first.tombstones), (0, 1));
    assert!(first.database_bytes > 0);
    if !app.db.is_postgres() {
        // A new file vacuums incrementally: the deleted session's pages went back.
        assert!(first.released_bytes > 100_000, "{first:?}");
        assert_eq!(first.free_bytes, 0, "{first:?}");
    }
}

#[tokio::test]
async fn backup_database_is_for_admin_keys_and_names_its_bad_targets() {
    let (keys, db, server) = serve_with_keys("acme key-acme\nops key-ops admin\n").await;
    let mut acme = keyed_client(server.addr, "key-acme").await;
    let mut ops = keyed_client(server.addr, "key-ops").await;
    let session = acme
        .create_session(pb::CreateSessionRequest::default())
        .await
        .expect("CreateSession")
        .into_inner()
        .session_id;
    acme.append(append_req(&session, vec![user("backed up")]))
        .await
        .expect("Append");
    let dir = tempfile::tempdir().expect("temp dir");
    let to = dir.path().join("copy.db");
    let request = |to: &str| pb::BackupDatabaseRequest { to: to.into() };
    let target = to.to_str().expect("UTF-8");

    let refused = acme.backup_database(request(target)).await;
    assert_code(refused, Code::PermissionDenied);
    let refused = acme.collect_garbage(pb::CollectGarbageRequest {}).await;
    assert_code(refused, Code::PermissionDenied);
    assert_status(
        ops.backup_database(request("")).await,
        Code::InvalidArgument,
        "to",
    );
    let relative = ops.backup_database(request("copy.db")).await;
    assert_status(relative, Code::InvalidArgument, "to");
    let missing = dir.path().join("no-such-dir/copy.db");
    let missing = ops
        .backup_database(request(missing.to_str().expect("UTF-8")))
        .await;
    assert_status(missing, Code::FailedPrecondition, "to");

    let done = ops.backup_database(request(target)).await;
    if db.is_postgres() {
        assert_status(done, Code::FailedPrecondition, "to");
        let message = ops
            .backup_database(request(target))
            .await
            .expect_err("refused");
        assert!(message.message().contains("pg_dump"), "{message:?}");
        return;
    }
    let done = done.expect("BackupDatabase").into_inner();
    assert_eq!(done.path, target);
    assert_eq!(done.bytes, std::fs::metadata(&to).expect("the copy").len());
    let exists = ops.backup_database(request(target)).await;
    assert_status(exists, Code::AlreadyExists, "to");

    // Restoring is starting a server on the copy.
    let restored = serve_store(
        ctxd::store::Store::open(&to).await.expect("open the copy"),
        Options {
            api_keys: Some(ApiKeys::load(keys.path()).expect("keys")),
            ..Options::default()
        },
    )
    .await;
    let mut client = keyed_client(restored.addr, "key-acme").await;
    let log = client
        .log(log_req(&session))
        .await
        .expect("Log")
        .into_inner();
    assert_eq!(
        text_of(
            &log.nodes[0]
                .content
                .clone()
                .and_then(message_parts)
                .unwrap_or_default()
        ),
        "backed up"
    );
}

fn message_parts(input: pb::NodeInput) -> Option<Vec<pb::ContentPart>> {
    match input.kind? {
        pb::node_input::Kind::Message(m) => Some(m.parts),
        _ => None,
    }
}

/// A real full disk: the server runs in a mount namespace of its own (`unshare`, no privilege
/// needed) where the backup's directory is a 64 KiB tmpfs, smaller than the database.
#[tokio::test]
async fn a_backup_onto_a_full_disk_is_refused_whole_and_the_server_serves_on() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("ctxd.db");
    let small = dir.path().join("small");
    std::fs::create_dir(&small).expect("the tmpfs mount point");
    let daemon = crate::daemon::Serve::new(&db)
        .through([
            "unshare".as_ref(),
            "-rm".as_ref(),
            "sh".as_ref(),
            "-c".as_ref(),
            r#"mount -t tmpfs -o size=64k tmpfs "$0" && exec "$@""#.as_ref(),
            small.as_os_str(),
        ])
        .start()
        .await;
    let mut client = connect(daemon.addr).await;
    let session = new_session(&mut client).await;
    for i in 0..12 {
        let request = append_req(
            &session,
            vec![user(&big_text(20_000, &format!("fill {i}")))],
        );
        client.append(request).await.expect("Append");
    }
    let to = small.join("backup.db");
    let request = || pb::BackupDatabaseRequest {
        to: to.to_str().expect("UTF-8").into(),
    };
    let full = client.backup_database(request()).await;
    assert_status(full, Code::ResourceExhausted, "to");
    let again = client
        .backup_database(request())
        .await
        .expect_err("still full");
    // Not "exists": the failed copy left nothing under the name.
    assert_eq!(again.code(), Code::ResourceExhausted, "{again:?}");
    assert!(again.message().contains("disk is full"), "{again:?}");

    // The server is unaffected: it appends, and backs up where there is room.
    client
        .append(append_req(&session, vec![user("after the full disk")]))
        .await
        .expect("Append after a failed backup");
    let roomy = dir.path().join("backup.db");
    let done = client
        .backup_database(pb::BackupDatabaseRequest {
            to: roomy.to_str().expect("UTF-8").into(),
        })
        .await
        .expect("BackupDatabase with room")
        .into_inner();
    assert!(done.bytes > 64 * 1024, "{done:?}");
    daemon.stop().await;
}

/// A file written before blobs were counted: opening it counts every blob from the node bodies
/// (compressed ones too), so a deletion then keeps what another session shares.
#[tokio::test]
async fn blobs_stored_before_counting_are_counted_when_the_file_opens() {
    let db = TestDb::sqlite();
    let shared = big_text(50_000, "long enough to be stored compressed");
    // Long arguments: the node body itself is stored compressed.
    let args = serde_json::json!({ "path": big_text(5000, "a long path") }).to_string();
    let (keep, gone) = {
        let server = serve_store(db.open().await, Options::default()).await;
        let mut client = connect(server.addr).await;
        let mut sessions = Vec::new();
        for name in ["keep", "gone"] {
            let session = new_session(&mut client).await;
            let request = append_req(
                &session,
                vec![
                    user(name),
                    assistant_calls("", vec![call("r", "read_file", &args)]),
                    tool_result("r", &shared),
                ],
            );
            client.append(request).await.expect("Append");
            sessions.push(session);
        }
        server.stop(Duration::from_secs(10)).await;
        (sessions[0].clone(), sessions[1].clone())
    };
    let counted = db.count("SELECT COUNT(*) FROM blob_refs").await;
    // As an older file has it: no references, nothing counted (the trigger that would take
    // the blobs along set aside meanwhile).
    {
        use sqlx::Connection;
        let path = db.sqlite_path().expect("a SQLite file");
        let options = sqlx::sqlite::SqliteConnectOptions::new().filename(path);
        let mut conn = sqlx::SqliteConnection::connect_with(&options)
            .await
            .expect("open the file");
        let trigger: String = sqlx::query_scalar(
            "SELECT sql FROM sqlite_master WHERE type = 'trigger' AND name = 'blob_refs_release'",
        )
        .fetch_one(&mut conn)
        .await
        .expect("the trigger");
        for sql in [
            "DROP TRIGGER blob_refs_release",
            "DELETE FROM blob_refs",
            "UPDATE blobs SET refs = 0",
            trigger.as_str(),
        ] {
            sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()))
                .execute(&mut conn)
                .await
                .expect("make the file look older");
        }
        conn.close().await.expect("close");
    }
    let blobs = db.count("SELECT COUNT(*) FROM blobs").await;
    assert!(blobs > 0);
    assert_eq!(
        db.count("SELECT COUNT(*) FROM blobs WHERE refs = 0").await,
        blobs
    );

    let server = serve_store(db.open().await, Options::default()).await;
    assert_eq!(db.count("SELECT COUNT(*) FROM blob_refs").await, counted);
    assert_eq!(
        db.count(
            "SELECT COUNT(*) FROM blobs b
             WHERE b.refs <> (SELECT COUNT(*) FROM blob_refs r WHERE r.hash = b.hash)"
        )
        .await,
        0
    );
    let mut client = connect(server.addr).await;
    delete(&mut client, &gone).await.expect("DeleteSession");
    let log = client.log(log_req(&keep)).await.expect("Log").into_inner();
    let result = log.nodes[0].content.clone().and_then(|c| match c.kind? {
        pb::node_input::Kind::ToolResult(r) => Some(text_of(&r.parts)),
        _ => None,
    });
    assert_eq!(result.as_deref(), Some(shared.as_str()));
}

/// A watcher of a session that is deleted gets its tombstone as the last event.
#[tokio::test]
async fn a_watcher_of_a_deleted_session_gets_its_tombstone_and_the_stream_ends() {
    let mut app = spawn_app().await;
    let session = app.create_session().await;
    app.append(&session, vec![user("watched")]).await;
    let mut stream = app
        .client
        .watch(pb::WatchRequest {
            session_id: session.clone(),
            ..Default::default()
        })
        .await
        .expect("Watch")
        .into_inner();
    let next = async |stream: &mut tonic::Streaming<pb::WatchEvent>| {
        tokio::time::timeout(Duration::from_secs(10), stream.message())
            .await
            .expect("an event in time")
            .expect("no error")
    };
    let started = next(&mut stream).await.expect("started");
    assert!(matches!(
        started.event,
        Some(pb::watch_event::Event::Started(_))
    ));
    let deleted = delete(&mut app.client, &session)
        .await
        .expect("DeleteSession");
    let last = next(&mut stream).await.expect("the tombstone");
    match last.event {
        Some(pb::watch_event::Event::Deleted(tombstone)) => {
            assert_eq!(Some(tombstone), deleted.tombstone);
        }
        other => panic!("expected the tombstone, got {other:?}"),
    }
    assert!(next(&mut stream).await.is_none(), "the stream ends");
}

/// A server over a fresh database with the keys file `lines`, returned with it.
async fn serve_with_keys(lines: &str) -> (tempfile::NamedTempFile, TestDb, Server) {
    let keys = tempfile::NamedTempFile::new().expect("keys file");
    std::fs::write(&keys, lines).expect("keys");
    let (db, server) = serve_fresh(Options {
        api_keys: Some(ApiKeys::load(keys.path()).expect("keys")),
        ..Options::default()
    })
    .await;
    (keys, db, server)
}
