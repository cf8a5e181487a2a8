//! Another process holding the database's write lock: every write is retried for
//! `--busy-timeout-ms`, then answers UNAVAILABLE having written nothing; reads go on; the same
//! requests succeed once the lock is released.

use std::time::{Duration, Instant};

use ctxd::api::pb;
use sqlx::{Connection, SqliteConnection};
use tonic::Code;

use super::*;

const BUSY_MS: u64 = 300;

#[track_caller]
fn assert_busy<T: std::fmt::Debug>(result: Result<T, tonic::Status>, what: &str) {
    assert_fault(result, Code::Unavailable, &["busy"], what);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lock_held_by_another_process_answers_unavailable_in_bounded_time_and_loses_nothing() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("ctxd.db");
    let busy = BUSY_MS.to_string();
    let args = [
        "--busy-timeout-ms",
        busy.as_str(),
        "--metrics-listen",
        "127.0.0.1:0",
    ];
    let daemon = Daemon::start(&db, &args).await;
    let mut client = connect(daemon.addr).await;
    let (session, mut acknowledged) = session_with_a_first_append(&mut client).await;
    let head = acknowledged[0].head_id.clone();
    client
        .create_branch(create_branch_req(&session, "old", &head))
        .await
        .expect("CreateBranch");
    let needs_summary = four_file_reads(&mut client).await;
    let commit = pb::CommitSummaryRequest {
        compaction_id: prepare_needed(&mut client, &needs_summary).await,
        text: "Files 0 and 1 were read.".into(),
        model: "m".into(),
    };

    // This test process is the other process: it takes the write lock and keeps it.
    let mut holder =
        SqliteConnection::connect_with(&sqlx::sqlite::SqliteConnectOptions::new().filename(&db))
            .await
            .expect("open the database from another process");
    sqlx::query("BEGIN EXCLUSIVE")
        .execute(&mut holder)
        .await
        .expect("take the write lock");

    let request = |i: usize| {
        keyed(
            &session,
            &format!("k{i}"),
            vec![
                user(&format!("question {i}")),
                assistant(&format!("answer {i}")),
            ],
        )
    };
    let started = Instant::now();
    assert_busy(client.append(request(0)).await, "Append");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(BUSY_MS * 8 / 10),
        "the write was retried for the busy timeout first, not refused at once: {waited:?}"
    );
    assert!(
        waited < Duration::from_secs(5),
        "refused within about the busy timeout, not hanging: {waited:?}"
    );

    let started = Instant::now();
    let tasks: Vec<_> = (1..7)
        .map(|i| {
            let mut client = client.clone();
            let request = request(i);
            tokio::spawn(async move { client.append(request).await })
        })
        .collect();
    for task in tasks {
        assert_busy(task.await.expect("append task"), "concurrent Append");
    }
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );

    assert_busy(
        client
            .create_session(pb::CreateSessionRequest::default())
            .await,
        "CreateSession",
    );
    assert_busy(
        client
            .create_branch(create_branch_req(&session, "new", &head))
            .await,
        "CreateBranch",
    );
    assert_busy(
        client
            .delete_branch(delete_branch_req(&session, "old"))
            .await,
        "DeleteBranch",
    );
    assert_busy(client.commit_summary(commit.clone()).await, "CommitSummary");
    assert_busy(
        client
            .import_session(tokio_stream::iter(import_chunks("imported")))
            .await,
        "ImportSession",
    );

    // WAL lets reads run beside the other process's lock.
    assert_reads_served(&mut client, &session, &acknowledged, "under the lock").await;

    sqlx::query("COMMIT")
        .execute(&mut holder)
        .await
        .expect("release the lock");
    holder.close().await.expect("close");

    // The same requests, retried, succeed, each written once.
    for i in 0..7 {
        acknowledged.push(
            client
                .append(request(i))
                .await
                .expect("a retried append")
                .into_inner(),
        );
    }
    for i in 0..7 {
        let again = client
            .append(request(i))
            .await
            .expect("a second retry")
            .into_inner();
        assert_eq!(
            again,
            acknowledged[i + 1],
            "the key answers as the first time"
        );
    }
    assert_each_once(&main_ids(&mut client, &session).await, &acknowledged);
    let outcome = client
        .commit_summary(commit)
        .await
        .expect("CommitSummary")
        .into_inner();
    assert!(outcome.applied, "{outcome:?}");
    client
        .create_branch(create_branch_req(&session, "new", &head))
        .await
        .expect("CreateBranch");
    client
        .import_session(tokio_stream::iter(import_chunks("imported")))
        .await
        .expect("ImportSession");

    let scrape = daemon.scrape().await;
    let busy_count: u64 = scrape
        .lines()
        .find_map(|l| l.strip_prefix("ctxd_sqlite_busy_total "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("ctxd_sqlite_busy_total in\n{scrape}"));
    assert_eq!(
        busy_count, 12,
        "every refused request is counted:\n{scrape}"
    );
    assert!(!scrape.contains("code=\"INTERNAL\""), "{scrape}");
    drop(client);
    daemon.stop().await;
}
