//! A full database (its quota, or its disk): writes refused as RESOURCE_EXHAUSTED, reads still
//! served, nothing half-written, and writes back without a restart once there is room.

use std::fs::File;
use std::path::PathBuf;
use std::process::Command;

use ctxd::api::pb;
use ctxd::store::Config;

use super::*;

const NOISE: usize = 64 * 1024;

/// Sends every request at once, so the group committer takes several into one batch.
async fn concurrently(
    client: &Client,
    requests: Vec<pb::AppendRequest>,
) -> Vec<(pb::AppendRequest, Result<pb::AppendResponse, tonic::Status>)> {
    let tasks: Vec<_> = requests
        .into_iter()
        .map(|request| {
            let mut client = client.clone();
            tokio::spawn(async move {
                let answer = client.append(request.clone()).await.map(|r| r.into_inner());
                (request, answer)
            })
        })
        .collect();
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.expect("append task"));
    }
    answers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_full_database_refuses_writes_serves_reads_and_takes_writes_again_without_a_restart() {
    let served = serve_config(Config::default()).await;
    let mut client = served.client.clone();
    let (session, mut acknowledged) = session_with_a_first_append(&mut client).await;

    // A quota below the size in use: SQLite holds it at the pages already used, so a write
    // that needs one more page is refused.
    let limit = served
        .store
        .set_max_db_bytes(Some(1))
        .await
        .expect("set the quota");
    assert!(limit >= 4096 && limit % 4096 == 0, "limit {limit}");
    let big = |i: u64| keyed(&session, &format!("big-{i}"), vec![user(&noise(NOISE, i))]);
    // Twice: the first failure replaces the writer connection, and the new one must carry the
    // quota as well.
    assert_full(client.append(big(0)).await);
    assert_full(client.append(big(1)).await);

    // Small appends in flight with big ones: each either writes whole or not at all.
    let mut requests: Vec<_> = (0..8)
        .map(|i| {
            keyed(
                &session,
                &format!("small-{i}"),
                vec![user(&format!("small {i}"))],
            )
        })
        .collect();
    requests.insert(4, big(2));
    requests.push(big(3));
    let mut refused = Vec::new();
    for (request, answer) in concurrently(&client, requests).await {
        match answer {
            Ok(answer) => acknowledged.push(answer),
            Err(status) => {
                assert_full(Err::<(), _>(status));
                refused.push(request);
            }
        }
    }
    assert!(refused.len() >= 2, "the big appends are refused");
    assert_full(
        client
            .import_session(tokio_stream::iter(import_chunks(&noise(NOISE, 9))))
            .await,
    );

    // Reads keep working, and show exactly what was acknowledged.
    assert_reads_served(&mut client, &session, &acknowledged, "while full").await;

    // Room again: the refused appends go through when retried, with the same keys.
    served
        .store
        .set_max_db_bytes(None)
        .await
        .expect("lift the quota");
    for answer in concurrently(&client, refused.clone()).await {
        acknowledged.push(answer.1.expect("a refused append, retried with room"));
    }
    let again = client
        .append(refused[0].clone())
        .await
        .expect("a retry of an acknowledged append")
        .into_inner();
    assert!(
        acknowledged.contains(&again),
        "the key answers as the first time"
    );
    client
        .import_session(tokio_stream::iter(import_chunks(&noise(NOISE, 9))))
        .await
        .expect("ImportSession with room");
    assert_writes_again(&mut client, &session, &mut acknowledged).await;

    let (_dir, db) = served.stop().await;
    assert_eq!(integrity(&db).await, "ok");
}

/// `--max-db-bytes` bounds the file; a restart with a larger quota takes the refused write.
#[tokio::test]
async fn max_db_bytes_caps_the_database_file() {
    const QUOTA: u64 = 512 * 1024;
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("ctxd.db");
    let quota = QUOTA.to_string();
    let args = [
        "--max-db-bytes",
        quota.as_str(),
        "--metrics-listen",
        "127.0.0.1:0",
    ];
    let daemon = Daemon::start(&db, &args).await;
    let mut client = connect(daemon.addr).await;
    let session = new_session(&mut client).await;
    let mut acknowledged = Vec::new();
    // 16 KiB of noise an append: the quota holds a few dozen at most.
    let refused = append_until_full(
        &mut client,
        &session,
        &mut acknowledged,
        "the quota is reached within 1 MiB of appends",
    )
    .await;
    assert!(!acknowledged.is_empty());
    client
        .render(render_req(&session, Target::Branch("main".into())))
        .await
        .expect("Render while full");
    let scrape = daemon.scrape().await;
    for line in [
        "ctxd_sqlite_full_total 1",
        r#"ctxd_rpc_requests_total{method="ctxd.v1.ContextStore/Append",code="RESOURCE_EXHAUSTED"} 1"#,
    ] {
        assert!(scrape.contains(line), "{line} in\n{scrape}");
    }
    drop(client);
    daemon.stop().await;
    let size = std::fs::metadata(&db).expect("the file").len();
    assert!(size <= QUOTA, "{size} bytes on disk, quota {QUOTA}");

    let more = (4 * QUOTA).to_string();
    let daemon = Daemon::start(&db, &["--max-db-bytes", &more]).await;
    let mut client = connect(daemon.addr).await;
    acknowledged.push(
        client
            .append(refused)
            .await
            .expect("the refused append, with a larger quota")
            .into_inner(),
    );
    assert_each_once(&main_ids(&mut client, &session).await, &acknowledged);
    drop(client);
    daemon.stop().await;
    assert_eq!(integrity(&db).await, "ok");
}

/// The database on a small tmpfs, mounted in a private mount namespace (`unshare -rm`): fill the
/// disk, see writes refused and reads served, remove a file, see writes taken again.
#[tokio::test]
async fn a_full_disk_refuses_writes_serves_reads_and_takes_writes_when_room_returns() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mount = dir.path().join("disk");
    std::fs::create_dir(&mount).expect("mount point");
    let probe = Command::new("unshare")
        .args(["-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs \"$0\""])
        .arg(&mount)
        .output();
    match probe {
        Err(e) => {
            eprintln!("skipped: cannot run unshare: {e}");
            return;
        }
        Ok(out) if !out.status.success() => {
            eprintln!(
                "skipped: cannot mount a tmpfs in a private mount namespace: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
            return;
        }
        Ok(_) => {}
    }
    let db = mount.join("ctxd.db");
    let log = dir.path().join("stderr.log");
    // The server execs in a mount namespace of its own, over a 4 MiB tmpfs.
    let mount_then_exec = "mount -t tmpfs -o size=4m tmpfs \"$0\" && exec \"$@\"";
    let daemon = Serve::new(&db)
        .stderr(&log)
        .through([
            "unshare".as_ref(),
            "-rm".as_ref(),
            "sh".as_ref(),
            "-c".as_ref(),
            mount_then_exec.as_ref(),
            mount.as_os_str(),
        ])
        .start()
        .await;
    // The tmpfs as the server sees it, from outside its mount namespace.
    let inside = PathBuf::from(format!("/proc/{}/root", daemon.pid()))
        .join(mount.strip_prefix("/").expect("an absolute temp dir"));

    let mut client = connect(daemon.addr).await;
    let (session, mut acknowledged) = session_with_a_first_append(&mut client).await;

    let filler = inside.join("filler");
    fill(&filler);
    let refused = append_until_full(
        &mut client,
        &session,
        &mut acknowledged,
        "a full disk refuses an append within 1 MiB",
    )
    .await;
    client
        .render(render_req(&session, Target::Branch("main".into())))
        .await
        .expect("Render with the disk full");
    assert_each_once(&main_ids(&mut client, &session).await, &acknowledged);

    std::fs::remove_file(&filler).expect("remove the filler");
    acknowledged.push(
        client
            .append(refused)
            .await
            .expect("the refused append, retried with room")
            .into_inner(),
    );
    assert_writes_again(&mut client, &session, &mut acknowledged).await;
    // SQLite resolves the /proc link to the path outside the namespace, so check a copy: with
    // no write in flight, the file and its WAL are a consistent pair.
    let copy = dir.path().join("copy.db");
    std::fs::copy(inside.join("ctxd.db"), &copy).expect("copy the database");
    std::fs::copy(inside.join("ctxd.db-wal"), dir.path().join("copy.db-wal"))
        .expect("copy the WAL");
    assert_eq!(integrity(&copy).await, "ok");
    drop(client);
    daemon.stop().await;
}

/// Writes `path` until the disk is full.
fn fill(path: &std::path::Path) {
    use std::io::Write;
    let mut file = File::create(path).expect("create the filler");
    let chunk = vec![0x5a; 64 * 1024];
    for _ in 0..1024 {
        match file.write(&chunk) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(28) => return, // ENOSPC
            Err(e) => panic!("writing the filler: {e}"),
        }
    }
    panic!("the tmpfs never filled");
}
