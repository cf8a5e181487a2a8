//! Kill -9 under load: `ctxd serve` killed at a random moment while 8 clients append to 16
//! sessions and one more creates, fills and deletes scratch sessions (sharing content with the
//! others) and backs the database up, restarted on the same file, cycle after cycle. Nothing
//! acknowledged is lost, no idempotency key is applied twice, no acknowledged deletion comes
//! back, no shared blob goes with a deleted session, every acknowledged backup is whole, and
//! the SQLite file stays consistent.
//!
//! `CTXD_CRASH_CYCLES` sets the number of kills (default 20); `CTXD_CRASH_SEED` replays the
//! random choices (kill delays, sessions, shapes) of a failed run, whose seed it prints.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use ctxd::api::pb;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sqlx::Connection;
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection};
use tonic::{Code, Status};

use crate::daemon::{Daemon, Serve};
use crate::helpers::*;

const CYCLES_VAR: &str = "CTXD_CRASH_CYCLES";
const SEED_VAR: &str = "CTXD_CRASH_SEED";
const DEFAULT_CYCLES: usize = 20;
const APPENDERS: usize = 8;
const SESSIONS: usize = 16;
/// The kill comes uniformly within this long after the appenders start.
const MAX_KILL_DELAY_MS: u64 = 250;
const WAIT: Duration = Duration::from_secs(30);
/// Ids a `GetNodes` call asks for at once.
const GET_CHUNK: usize = 500;

/// `ctxd serve` over `db`; every run's stderr stays in the log, for the cycle that failed.
async fn start_daemon(db: &Path) -> Daemon {
    Serve::new(db)
        .append_stderr()
        .ready_within(WAIT)
        .start()
        .await
}

/// `PRAGMA integrity_check` and `foreign_key_check` on the file as the crash left it. Read-only,
/// so nothing is recovered or checkpointed before the server opens it.
async fn assert_file_consistent(db: &Path, cycle: usize) {
    let options = SqliteConnectOptions::new().filename(db).read_only(true);
    let mut conn = SqliteConnection::connect_with(&options)
        .await
        .expect("open the SQLite file read-only");
    let integrity: Vec<String> = sqlx::query_scalar("PRAGMA integrity_check")
        .fetch_all(&mut conn)
        .await
        .expect("integrity_check");
    assert_eq!(integrity, ["ok"], "cycle {cycle}: integrity_check");
    let dangling = sqlx::query("PRAGMA foreign_key_check")
        .fetch_all(&mut conn)
        .await
        .expect("foreign_key_check");
    assert!(
        dangling.is_empty(),
        "cycle {cycle}: {} dangling references",
        dangling.len()
    );
    // Every blob counted by exactly the sessions referring to it, none left unreferenced.
    for (sql, what) in [
        (
            "SELECT COUNT(*) FROM blobs b
             WHERE b.refs <> (SELECT COUNT(*) FROM blob_refs r WHERE r.hash = b.hash)",
            "blobs counted wrong",
        ),
        (
            "SELECT COUNT(*) FROM blobs WHERE refs <= 0",
            "blobs no session refers to",
        ),
        (
            "SELECT COUNT(*) FROM blob_refs r
             WHERE NOT EXISTS (SELECT 1 FROM sessions s WHERE s.id = r.session_id)",
            "blob references of deleted sessions",
        ),
    ] {
        let n: i64 = sqlx::query_scalar(sql)
            .fetch_one(&mut conn)
            .await
            .expect("count");
        assert_eq!(n, 0, "cycle {cycle}: {what}");
    }
    conn.close().await.expect("close");
}

/// A `COUNT(*)` query, read beside the running (idle) server.
async fn count_rows(db: &Path, sql: &'static str) -> usize {
    let options = SqliteConnectOptions::new().filename(db).read_only(true);
    let mut conn = SqliteConnection::connect_with(&options)
        .await
        .expect("open the SQLite file read-only");
    let n: i64 = sqlx::query_scalar(sql)
        .fetch_one(&mut conn)
        .await
        .expect("count rows");
    conn.close().await.expect("close");
    usize::try_from(n).expect("a count")
}

/// One keyed append as sent: session index, key and request.
#[derive(Clone)]
struct Keyed {
    session: usize,
    key: String,
    request: pb::AppendRequest,
}

/// An append whose answer the client received.
struct Acked {
    append: Keyed,
    response: pb::AppendResponse,
}

/// What one appender saw before the server died.
struct Run {
    acked: Vec<Acked>,
    /// The request in flight when the connection failed, and when the failure arrived.
    unknown: Option<(Keyed, Status, Instant)>,
}

/// A tool output every third append or so carries, stored once however often it is written.
fn shared_output() -> String {
    big_text(6000, "the shared file")
}

/// The nodes of one append: text derived from the key, so stored content is checkable exactly.
fn nodes_for(key: &str, rng: &mut StdRng) -> Vec<pb::NodeInput> {
    let question = user(&format!("{key}: question"));
    let answer = assistant(&format!("{key}: answer"));
    let output = match rng.random_range(0..4) {
        0 | 1 => return vec![question, answer],
        2 => big_text(rng.random_range(500..20_000), key),
        _ => shared_output(),
    };
    let call_id = format!("{key}-call");
    vec![
        question,
        assistant_calls(
            "",
            vec![call(
                &call_id,
                "read_file",
                &format!(r#"{{"path":"{key}.txt"}}"#),
            )],
        ),
        // Named as the call is, so the stored result equals what was sent.
        node(pb::node_input::Kind::ToolResult(pb::ToolResult {
            call_id,
            name: "read_file".into(),
            parts: vec![text(output)],
            is_error: false,
        })),
        answer,
    ]
}

/// Appends until the first failure: each append to a random session, with a fresh key.
async fn appender(
    addr: SocketAddr,
    sessions: Vec<String>,
    cycle: usize,
    worker: usize,
    seed: u64,
) -> Run {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut client = connect(addr).await;
    let mut acked = Vec::new();
    for i in 0.. {
        let session = rng.random_range(0..sessions.len());
        let key = format!("c{cycle}-w{worker}-{i}");
        let request = pb::AppendRequest {
            idempotency_key: key.clone(),
            ..append_req(&sessions[session], nodes_for(&key, &mut rng))
        };
        let append = Keyed {
            session,
            key,
            request,
        };
        match client.append(append.request.clone()).await {
            Ok(response) => acked.push(Acked {
                append,
                response: response.into_inner(),
            }),
            Err(status) => {
                return Run {
                    acked,
                    unknown: Some((append, status, Instant::now())),
                };
            }
        }
    }
    unreachable!("the loop ends at the first failure")
}

/// What the lifecycle worker saw before the server died.
#[derive(Default)]
struct Scratch {
    /// Sessions whose deletion was acknowledged.
    deleted: Vec<String>,
    /// Creation keys of scratch sessions whose deletion was not (yet) acknowledged.
    pending: Vec<String>,
    /// Backups acknowledged, not yet checked.
    backups: Vec<std::path::PathBuf>,
    backups_checked: usize,
}

/// Creates a scratch session (with a creation key, so one cut off can be found again), fills
/// it with content the appenders also write, deletes it, and every third time backs the
/// database up; until the first failure.
async fn lifecycle_worker(addr: SocketAddr, backups: std::path::PathBuf, cycle: usize) -> Scratch {
    let mut client = connect(addr).await;
    let mut scratch = Scratch::default();
    for i in 0.. {
        let key = format!("scratch-c{cycle}-{i}");
        scratch.pending.push(key.clone());
        let Ok(created) = client
            .create_session(pb::CreateSessionRequest {
                idempotency_key: key,
                ..Default::default()
            })
            .await
        else {
            return scratch;
        };
        let session = created.into_inner().session_id;
        let filled = client
            .append(append_req(
                &session,
                vec![
                    user(&format!("scratch {cycle} {i}")),
                    assistant(&shared_output()),
                ],
            ))
            .await;
        if filled.is_err() || delete_session(&mut client, &session).await.is_err() {
            return scratch;
        }
        scratch.pending.pop();
        scratch.deleted.push(session);
        if i % 3 == 0 {
            let to = backups.join(format!("c{cycle}-{i}.db"));
            let request = pb::BackupDatabaseRequest {
                to: to.to_str().expect("UTF-8").into(),
            };
            if client.backup_database(request).await.is_err() {
                return scratch;
            }
            scratch.backups.push(to);
        }
    }
    unreachable!("the loop ends at the first failure")
}

async fn delete_session(
    client: &mut Client,
    session: &str,
) -> Result<pb::DeleteSessionResponse, Status> {
    client
        .delete_session(pb::DeleteSessionRequest {
            session_id: session.into(),
        })
        .await
        .map(tonic::Response::into_inner)
}

/// Scratch sessions a kill cut off are found by their creation keys and deleted now; every
/// acknowledged deletion is still one; every acknowledged backup is a whole database.
async fn settle_scratch(client: &mut Client, scratch: &mut Scratch, cycle: usize) {
    for key in scratch.pending.drain(..) {
        let session = client
            .create_session(pb::CreateSessionRequest {
                idempotency_key: key,
                ..Default::default()
            })
            .await
            .expect("the scratch session, created or found by its key")
            .into_inner()
            .session_id;
        delete_session(client, &session)
            .await
            .unwrap_or_else(|e| panic!("cycle {cycle}: deleting a cut-off scratch session: {e:?}"));
        scratch.deleted.push(session);
    }
    for session in &scratch.deleted {
        let again = delete_session(client, session)
            .await
            .unwrap_or_else(|e| panic!("cycle {cycle}: the tombstone of {session}: {e:?}"));
        assert!(again.already_deleted, "cycle {cycle}: {session} came back");
        let gone = client.get_session(get_session_req(session)).await;
        assert_eq!(gone.map(|_| ()).map_err(|s| s.code()), Err(Code::NotFound));
    }
    for backup in scratch.backups.drain(..) {
        assert_file_consistent(&backup, cycle).await;
        scratch.backups_checked += 1;
    }
}

/// Everything acknowledged so far, and the state that must hold after every restart.
#[derive(Default)]
struct Model {
    sessions: Vec<String>,
    acked: Vec<Acked>,
}

impl Model {
    fn acked_nodes(&self, session: Option<usize>) -> usize {
        self.acked
            .iter()
            .filter(|a| session.is_none_or(|s| a.append.session == s))
            .map(|a| a.response.node_ids.len())
            .sum()
    }
}

/// Every acknowledged append present with its exact content, every head and parent link
/// resolving, and nothing else stored: no key applied twice, no orphan node.
async fn verify(client: &mut Client, model: &Model, db: &Path, cycle: usize) {
    for (index, session) in model.sessions.iter().enumerate() {
        let head = head_of(client, session, "main").await;
        let log = log_all(client, session).await;
        let context = format!("cycle {cycle}, session {index}");
        assert_eq!(
            log.first().map_or("", |n| n.node_id.as_str()),
            head,
            "{context}: the log starts at the head"
        );
        for pair in log.windows(2) {
            assert_eq!(
                pair[0].parent_id, pair[1].node_id,
                "{context}: every parent resolves"
            );
        }
        if let Some(root) = log.last() {
            assert_eq!(root.parent_id, "", "{context}: the log ends at the root");
        }
        assert_eq!(
            log.len(),
            model.acked_nodes(Some(index)),
            "{context}: the branch holds exactly the acknowledged nodes"
        );

        let logged: HashMap<&str, &pb::Node> =
            log.iter().map(|n| (n.node_id.as_str(), n)).collect();
        assert_eq!(logged.len(), log.len(), "{context}: no node twice");
        let mut uses: HashMap<String, usize> = HashMap::new();
        for n in &log {
            if let Some(pb::node_input::Kind::Message(m)) =
                n.content.as_ref().and_then(|c| c.kind.as_ref())
                && m.role == pb::Role::User as i32
            {
                *uses.entry(text_of(&m.parts)).or_default() += 1;
            }
        }

        let mine: Vec<&Acked> = model
            .acked
            .iter()
            .filter(|a| a.append.session == index)
            .collect();
        let ids: Vec<String> = mine
            .iter()
            .flat_map(|a| a.response.node_ids.iter().cloned())
            .collect();
        let mut fetched = HashMap::new();
        for chunk in ids.chunks(GET_CHUNK) {
            let nodes = client
                .get_nodes(pb::GetNodesRequest {
                    session_id: session.clone(),
                    node_ids: chunk.to_vec(),
                })
                .await
                .unwrap_or_else(|e| panic!("{context}: GetNodes of acknowledged nodes: {e:?}"))
                .into_inner()
                .nodes;
            fetched.extend(nodes.into_iter().map(|n| (n.node_id.clone(), n)));
        }
        for a in mine {
            let key = &a.append.key;
            assert_eq!(
                uses.get(&format!("{key}: question")),
                Some(&1),
                "{context}: key {key} applied exactly once"
            );
            let sent = &a.append.request.nodes;
            assert_eq!(a.response.node_ids.len(), sent.len(), "{context}: {key}");
            assert_eq!(a.response.node_ids.last(), Some(&a.response.head_id));
            for (i, (id, input)) in a.response.node_ids.iter().zip(sent).enumerate() {
                let stored = fetched
                    .get(id)
                    .unwrap_or_else(|| panic!("{context}: acknowledged {key} node {id} is lost"));
                assert_eq!(
                    stored.content.as_ref(),
                    Some(input),
                    "{context}: {key} node {i} content"
                );
                assert!(
                    logged.contains_key(id.as_str()),
                    "{context}: {key} node {id} off the branch"
                );
                if i > 0 {
                    assert_eq!(
                        stored.parent_id,
                        a.response.node_ids[i - 1],
                        "{context}: {key}: one append is one contiguous chain"
                    );
                }
            }
            assert_eq!(
                fetched[&a.response.head_id].hash, a.response.head_hash,
                "{context}: {key} head hash"
            );
        }
    }
    // Nothing stored beyond what the branches hold: no orphan of a half-applied append.
    assert_eq!(
        count_rows(db, "SELECT COUNT(*) FROM nodes").await,
        model.acked_nodes(None),
        "cycle {cycle}: node rows"
    );
    assert_eq!(
        count_rows(db, "SELECT COUNT(*) FROM idempotency").await,
        model.acked.len(),
        "cycle {cycle}: one idempotency record per applied key"
    );
}

async fn log_all(client: &mut Client, session: &str) -> Vec<pb::Node> {
    let mut req = pb::LogRequest {
        limit: 1000,
        ..log_req(session)
    };
    let mut nodes = Vec::new();
    loop {
        let page = client.log(req.clone()).await.expect("Log").into_inner();
        nodes.extend(page.nodes);
        if page.next_page_token.is_empty() {
            return nodes;
        }
        req.page_token = page.next_page_token;
    }
}

/// Codes that would mean the server judged the request, not that the connection died.
fn is_a_verdict(code: Code) -> bool {
    matches!(
        code,
        Code::InvalidArgument
            | Code::NotFound
            | Code::AlreadyExists
            | Code::FailedPrecondition
            | Code::Aborted
            | Code::OutOfRange
            | Code::PermissionDenied
            | Code::Unauthenticated
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_under_load_loses_and_duplicates_nothing() {
    // A failure's message is said again after its backtrace, where a log cut to its head and
    // tail still shows it (with the seed printed first, enough to replay the run).
    if let Err(e) = tokio::spawn(kill_9_cycles()).await {
        let payload = e
            .try_into_panic()
            .unwrap_or_else(|e| panic!("the test task: {e}"));
        let message = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("(no message)");
        eprintln!("kill -9 test failed: {message}");
        std::panic::resume_unwind(payload);
    }
}

async fn kill_9_cycles() {
    let cycles: usize = std::env::var(CYCLES_VAR)
        .map(|v| v.parse().expect("CTXD_CRASH_CYCLES is a number"))
        .unwrap_or(DEFAULT_CYCLES);
    let seed: u64 = std::env::var(SEED_VAR)
        .map(|v| v.parse().expect("CTXD_CRASH_SEED is a number"))
        .unwrap_or_else(|_| rand::random());
    // Shown with a failure, so the run can be replayed.
    println!("{SEED_VAR}={seed} {CYCLES_VAR}={cycles}");
    let mut rng = StdRng::seed_from_u64(seed);

    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("ctxd.db");
    let backups = dir.path().join("backups");
    std::fs::create_dir(&backups).expect("the backups directory");
    let mut scratch = Scratch::default();
    let started = Instant::now();
    let mut model = Model::default();
    let mut unknown: Vec<Keyed> = Vec::new();
    let mut retried = 0usize;
    // Retried appends whose first attempt had committed before the kill.
    let mut committed_unanswered = 0usize;

    for cycle in 0..=cycles {
        if cycle > 0 {
            assert_file_consistent(&db, cycle).await;
        }
        let restarted_ms = ctxd::store::now_ms();
        let daemon = start_daemon(&db).await;
        let mut client = connect(daemon.addr).await;
        if cycle == 0 {
            for _ in 0..SESSIONS {
                let session = new_session(&mut client).await;
                model.sessions.push(session);
            }
        }

        // Appends cut off by the kill: the same key now gets one answer, whether the first
        // attempt committed or not; `verify` checks it against what is stored.
        for append in unknown.drain(..) {
            let response = client
                .append(append.request.clone())
                .await
                .unwrap_or_else(|e| {
                    panic!(
                        "cycle {cycle}: retry of {} after the restart: {e:?}",
                        append.key
                    )
                })
                .into_inner();
            retried += 1;
            let head = client
                .get_nodes(get_nodes_req(
                    &model.sessions[append.session],
                    vec![response.head_id.clone()],
                ))
                .await
                .expect("GetNodes of a retried append")
                .into_inner()
                .nodes;
            if head
                .first()
                .is_some_and(|n| n.created_at_unix_ms < restarted_ms)
            {
                committed_unanswered += 1;
            }
            model.acked.push(Acked { append, response });
        }
        // An answer given before a crash is still the answer after it.
        if let Some(acked) = model
            .acked
            .get(rng.random_range(0..model.acked.len().max(1)))
        {
            let again = client
                .append(acked.append.request.clone())
                .await
                .expect("a retry of an acknowledged append")
                .into_inner();
            assert_eq!(again, acked.response, "cycle {cycle}: {}", acked.append.key);
        }
        settle_scratch(&mut client, &mut scratch, cycle).await;
        verify(&mut client, &model, &db, cycle).await;
        if cycle == cycles {
            daemon.kill().await;
            break;
        }

        let delay = Duration::from_millis(rng.random_range(0..=MAX_KILL_DELAY_MS));
        println!("cycle {cycle}: kill -9 after {delay:?}");
        let workers: Vec<_> = (0..APPENDERS)
            .map(|worker| {
                let sessions = model.sessions.clone();
                let seed = rng.random();
                tokio::spawn(appender(daemon.addr, sessions, cycle, worker, seed))
            })
            .collect();
        let lifecycle = tokio::spawn(lifecycle_worker(daemon.addr, backups.clone(), cycle));
        tokio::time::sleep(delay).await;
        let killed_at = Instant::now();
        daemon.kill().await;

        for worker in workers {
            let run = tokio::time::timeout(WAIT, worker)
                .await
                .expect("an appender notices the kill")
                .expect("appender task");
            model.acked.extend(run.acked);
            let (append, status, failed_at) = run.unknown.expect("appenders stop only on failure");
            assert!(
                failed_at >= killed_at && !is_a_verdict(status.code()),
                "cycle {cycle}: {} failed by the server's verdict, not the kill: {status:?}",
                append.key
            );
            unknown.push(append);
        }
        let cut = tokio::time::timeout(WAIT, lifecycle)
            .await
            .expect("the lifecycle worker notices the kill")
            .expect("lifecycle task");
        scratch.deleted.extend(cut.deleted);
        scratch.pending.extend(cut.pending);
        scratch.backups.extend(cut.backups);
    }

    println!(
        "{cycles} kills in {:?}: {} appends acknowledged ({} nodes), {retried} retried after a \
         kill, of which {committed_unanswered} had committed unanswered; {} scratch sessions \
         deleted, {} backups checked",
        started.elapsed(),
        model.acked.len(),
        model.acked_nodes(None),
        scratch.deleted.len(),
        scratch.backups_checked,
    );
    assert!(
        !scratch.deleted.is_empty() && scratch.backups_checked > 0,
        "deletions and backups ran between kills"
    );
    assert_file_consistent(&db, cycles + 1).await;
    assert!(
        model.acked.len() > retried,
        "the appenders wrote something between kills"
    );
}
