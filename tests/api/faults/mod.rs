//! Faults of the disk and the database file: a full disk or quota, bad files at start, a lock
//! held by another process. Servers here are the real binary where a process is needed, or a
//! real server in-process over a store the test can reach (to raise its quota).

mod bad_files;
mod busy;
mod disk_full;

use std::path::{Path, PathBuf};

use ctxd::api::pb;
use ctxd::server::Options;
use ctxd::store::{Config, Store};

use crate::daemon::{Daemon, Serve, WAIT, run_to_exit};
use crate::helpers::*;

/// A real server in-process over a store opened with `config`, which the test keeps.
pub struct Served {
    pub dir: tempfile::TempDir,
    pub db: PathBuf,
    pub store: Store,
    pub client: Client,
    server: Server,
}

pub async fn serve_config(config: Config) -> Served {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("ctxd.db");
    let store = Store::open_with(&db, config).await.expect("open the store");
    let server = serve_store(store.clone(), Options::default()).await;
    Served {
        client: connect(server.addr).await,
        dir,
        db,
        store,
        server,
    }
}

impl Served {
    /// Stops the server and closes the store (checkpointing its WAL into the file).
    pub async fn stop(self) -> (tempfile::TempDir, PathBuf) {
        self.server.stop(WAIT).await;
        self.store.close().await;
        (self.dir, self.db)
    }
}

/// `PRAGMA integrity_check` of the database at `path`, through its own read-only connection.
pub async fn integrity(path: &Path) -> String {
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(path)
        .read_only(true);
    let pool = sqlx::SqlitePool::connect_with(options)
        .await
        .expect("open the database");
    let rows: Vec<String> = sqlx::query_scalar("PRAGMA integrity_check")
        .fetch_all(&pool)
        .await
        .expect("integrity_check");
    pool.close().await;
    rows.join("; ")
}

/// `len` bytes of text zstd cannot shrink much, different for each `seed`, so that it takes
/// about that much room in the database.
pub fn noise(len: usize, seed: u64) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789 .";
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            // xorshift64: cheap, and enough to defeat the compressor.
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ALPHABET[(state >> 58) as usize] as char
        })
        .collect()
}

/// A write refused for a fault of the database: `code`, and a message that says each of `says`.
#[track_caller]
pub fn assert_fault<T: std::fmt::Debug>(
    result: Result<T, tonic::Status>,
    code: tonic::Code,
    says: &[&str],
    what: &str,
) {
    match result {
        Ok(value) => panic!("{what}: expected {code:?}, got Ok({value:?})"),
        Err(status) => {
            assert_eq!(status.code(), code, "{what}: {}", status.message());
            assert!(
                says.iter().all(|s| status.message().contains(s)),
                "{what}: the message says why ({says:?}): {}",
                status.message()
            );
        }
    }
}

/// A new session with one keyed append of two messages: the session, and that append's answer
/// as the first acknowledged one.
pub async fn session_with_a_first_append(client: &mut Client) -> (String, Vec<pb::AppendResponse>) {
    let session = new_session(client).await;
    let first = client
        .append(keyed(
            &session,
            "first",
            vec![user("hello"), assistant("hi")],
        ))
        .await
        .expect("Append")
        .into_inner();
    (session, vec![first])
}

/// Reads served `when` (`under the lock`, `while full`): GetSession, ListSessions and Render,
/// and `main` holds exactly what was acknowledged.
pub async fn assert_reads_served(
    client: &mut Client,
    session: &str,
    acknowledged: &[pb::AppendResponse],
    when: &str,
) {
    client
        .get_session(get_session_req(session))
        .await
        .unwrap_or_else(|e| panic!("GetSession {when}: {e:?}"));
    client
        .list_sessions(pb::ListSessionsRequest::default())
        .await
        .unwrap_or_else(|e| panic!("ListSessions {when}: {e:?}"));
    client
        .render(render_req(session, Target::Branch("main".into())))
        .await
        .unwrap_or_else(|e| panic!("Render {when}: {e:?}"));
    assert_each_once(&main_ids(client, session).await, acknowledged);
}

/// Appends 16 KiB of noise at a time (at most 64 times) until one is refused as full; the
/// others join `acknowledged`. The refused request, which `expect` says must come.
pub async fn append_until_full(
    client: &mut Client,
    session: &str,
    acknowledged: &mut Vec<pb::AppendResponse>,
    expect: &str,
) -> pb::AppendRequest {
    for i in 0..64u64 {
        let request = keyed(session, &format!("k{i}"), vec![user(&noise(16 * 1024, i))]);
        match client.append(request.clone()).await {
            Ok(answer) => acknowledged.push(answer.into_inner()),
            Err(status) => {
                assert_full(Err::<(), _>(status));
                return request;
            }
        }
    }
    panic!("{expect}");
}

/// A new append goes through, and `main` holds every acknowledged append once.
pub async fn assert_writes_again(
    client: &mut Client,
    session: &str,
    acknowledged: &mut Vec<pb::AppendResponse>,
) {
    let last = client
        .append(keyed(session, "last", vec![assistant("done")]))
        .await
        .expect("Append")
        .into_inner();
    acknowledged.push(last);
    assert_each_once(&main_ids(client, session).await, acknowledged);
}

/// RESOURCE_EXHAUSTED, saying what is full and which flag bounds it.
#[track_caller]
pub fn assert_full<T: std::fmt::Debug>(result: Result<T, tonic::Status>) {
    assert_fault(
        result,
        tonic::Code::ResourceExhausted,
        &["database is full", "--max-db-bytes"],
        "a write",
    );
}

/// An append of `nodes` to `main` with an idempotency key.
pub fn keyed(session: &str, key: &str, nodes: Vec<pb::NodeInput>) -> pb::AppendRequest {
    pb::AppendRequest {
        idempotency_key: key.into(),
        ..append_req(session, nodes)
    }
}

/// A neutral JSONL file of one user message, as import chunks.
pub fn import_chunks(content: &str) -> Vec<pb::ImportChunk> {
    let line = serde_json::json!({ "role": "user", "content": content }).to_string();
    vec![import_chunk(pb::ImportFormat::NeutralJsonl as i32, line)]
}

/// Node ids of `main`, oldest first.
pub async fn main_ids(client: &mut Client, session: &str) -> Vec<String> {
    let mut ids = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = client
            .log(pb::LogRequest {
                session_id: session.into(),
                branch: "main".into(),
                node_id: String::new(),
                limit: 1000,
                page_token,
            })
            .await
            .expect("Log")
            .into_inner();
        ids.extend(page.nodes.into_iter().map(|n| n.node_id));
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    ids.reverse();
    ids
}

/// Every acknowledged append is on `main` exactly once, its nodes in order, and nothing else is:
/// a refused append left no node behind.
#[track_caller]
pub fn assert_each_once(ids: &[String], acknowledged: &[pb::AppendResponse]) {
    let position: std::collections::HashMap<&String, usize> =
        ids.iter().enumerate().map(|(i, id)| (id, i)).collect();
    assert_eq!(
        position.len(),
        ids.len(),
        "a node is on main twice: {ids:?}"
    );
    let mut expected = 0;
    for answer in acknowledged {
        let at: Vec<usize> = answer
            .node_ids
            .iter()
            .map(|id| {
                *position
                    .get(id)
                    .unwrap_or_else(|| panic!("acknowledged node {id} is not on main"))
            })
            .collect();
        assert!(
            at.windows(2).all(|w| w[1] == w[0] + 1),
            "the nodes of one append follow each other: {at:?}"
        );
        expected += at.len();
    }
    assert_eq!(ids.len(), expected, "only acknowledged nodes are on main");
}
