//! `ctxd backup` while a server serves appends: the copy passes `integrity_check`, holds every
//! append acknowledged before the backup began, and is a database `ctxd serve` opens as it is.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use ctxd::server::Options;
use sqlx::Connection;
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection};

use crate::daemon::{ctxd, run_to_exit};
use crate::helpers::*;

const APPENDERS: usize = 8;

#[tokio::test]
async fn a_backup_under_concurrent_appends_holds_everything_acknowledged_before_it() {
    let db = TestDb::sqlite();
    let path = db.sqlite_path().expect("a SQLite file").to_owned();
    let server = serve_store(db.open().await, Options::default()).await;
    let mut client = connect(server.addr).await;
    let session = new_session(&mut client).await;

    // Eight appenders, each on a branch of its own, until told to stop; every acknowledged id
    // goes into `acked`.
    let acked = Arc::new(Mutex::new(Vec::<String>::new()));
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let (progress, mut acks) = tokio::sync::watch::channel(0usize);
    let progress = Arc::new(progress);
    let mut tasks = Vec::new();
    for worker in 0..APPENDERS {
        let mut client = connect(server.addr).await;
        let branch = format!("w{worker}");
        client
            .create_branch(create_branch_req(&session, &branch, ""))
            .await
            .expect("CreateBranch");
        let (session, stopped) = (session.clone(), stopped.clone());
        let (acked, progress) = (Arc::clone(&acked), Arc::clone(&progress));
        tasks.push(tokio::spawn(async move {
            let mut i = 0;
            while !*stopped.borrow() {
                let request = ctxd::api::pb::AppendRequest {
                    branch: branch.clone(),
                    ..append_req(&session, vec![user(&format!("{branch}-{i}"))])
                };
                let head = client
                    .append(request)
                    .await
                    .expect("Append")
                    .into_inner()
                    .head_id;
                acked.lock().expect("acked").push(head);
                progress.send_modify(|n| *n += 1);
                i += 1;
            }
        }));
    }
    acks.wait_for(|n| *n >= 100).await.expect("appenders run");

    // What was acknowledged before the backup began; appends go on during it.
    let before: HashSet<String> = acked.lock().expect("acked").iter().cloned().collect();
    let dir = tempfile::tempdir().expect("temp dir");
    let copy = dir.path().join("backup.db");
    let mut command = ctxd();
    command
        .arg("backup")
        .arg("--db")
        .arg(&path)
        .arg("--to")
        .arg(&copy);
    let exited = run_to_exit(command).await;
    assert!(exited.status.success(), "{}", exited.stderr);
    assert!(
        exited.stdout.starts_with("ctxd backup of "),
        "{}",
        exited.stdout
    );
    let during = *acks.borrow();
    stop.send(true).expect("the appenders listen");
    for task in tasks {
        task.await.expect("appender");
    }
    assert!(
        acked.lock().expect("acked").len() > before.len() || during > before.len(),
        "appends went on while the backup ran"
    );

    let mut conn = SqliteConnection::connect_with(&SqliteConnectOptions::new().filename(&copy))
        .await
        .expect("open the copy");
    let integrity: Vec<String> = sqlx::query_scalar("PRAGMA integrity_check")
        .fetch_all(&mut conn)
        .await
        .expect("integrity_check");
    assert_eq!(integrity, ["ok"]);
    conn.close().await.expect("close");

    // Restore is starting ctxd on the copy: every append acknowledged before is there.
    let restored = ctxd::store::Store::open(&copy)
        .await
        .expect("open the copy");
    let restored = serve_store(restored, Options::default()).await;
    let mut client = connect(restored.addr).await;
    let ids: Vec<String> = before.into_iter().collect();
    for chunk in ids.chunks(500) {
        let found = client
            .get_nodes(get_nodes_req(&session, chunk.to_vec()))
            .await
            .expect("every acknowledged node is in the copy")
            .into_inner()
            .nodes;
        assert_eq!(found.len(), chunk.len());
    }
}

#[tokio::test]
async fn a_backup_refuses_an_existing_target_and_a_postgres_url_in_one_line() {
    let db = TestDb::sqlite();
    let path = db.sqlite_path().expect("a SQLite file").to_owned();
    drop(db.open().await);
    let taken = tempfile::NamedTempFile::new().expect("a file");
    let mut command = ctxd();
    command
        .arg("backup")
        .arg("--db")
        .arg(&path)
        .arg("--to")
        .arg(taken.path());
    let exited = run_to_exit(command).await;
    assert_eq!(exited.status.code(), Some(1));
    assert!(
        exited.stderr.contains("exists: a backup writes a new file"),
        "{}",
        exited.stderr
    );

    let mut command = ctxd();
    command
        .args([
            "backup",
            "--db",
            "postgres://ctxd:secret@127.0.0.1:1/x",
            "--to",
        ])
        .arg(taken.path().with_extension("pg"));
    let exited = run_to_exit(command).await;
    assert_eq!(exited.status.code(), Some(1));
    assert!(exited.stderr.contains("pg_dump"), "{}", exited.stderr);
    assert!(!exited.stderr.contains("secret"), "{}", exited.stderr);
}
