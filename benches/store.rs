//! What the store costs through the real gRPC server: `cargo bench --bench store`.
//!
//! Every ctxd case talks to `ctxd::server::serve` started in this process on `127.0.0.1:0` over
//! a SQLite file in a temp dir, with a tonic client, as `tests/api` does. Measured in one run:
//!
//! - **floor**: raw SQLite through its synchronous C API (rusqlite) in this process, with
//!   ctxd's durability (WAL, `synchronous=FULL`, `BEGIN IMMEDIATE`): one ~500-byte row per
//!   transaction, one writer. It runs right before and right after the append cases, because
//!   the machine's fsync latency drifts; ratios refer to the mean of the two, and the targets
//!   also print the ratio to each.
//! - **append**: one client appending one ~500-byte message per request (user and assistant in
//!   turn), p50/p95 against the floor's per-transaction p50/p95; then 1, 4, 16 and 64 concurrent
//!   clients (tokio tasks, each its own connection and session), nodes/s against the floor's
//!   rows/s. **diag** rows split the cost: `Store::append` in process without gRPC (1 and 64
//!   tasks), an `Append` refused before the store, one unary RPC with no storage behind it (a
//!   health check) alone and from 64
//!   concurrent clients (what the RPC stack allows on this machine), the floor through sqlx
//!   (the async driver, a round trip to its worker thread per statement), and the floor without
//!   its fsync (`synchronous=OFF`).
//! - **render**: the `Render` RPC over paths of 100, 1,000 and 10,000 messages cycled from
//!   `testdata/traces/cc-main-4d5611e5.jsonl` (call ids renamed per cycle, appended one model
//!   turn per request), per tokenizer, unbudgeted and with a 100k window / 8k reserve. Cold:
//!   each sample restarts the server on the same file (empty token cache, fresh store and
//!   SQLite connections; the OS page cache stays warm; an untimed `GetSession` opens the HTTP/2
//!   connection first; the BPE vocabularies load once per process, timed apart). Warm: the
//!   renders after that. The ratio is to the same case at 1,000 messages. **db size**: the
//!   1,000-message render in a database holding that session alone against one also holding
//!   1,000 other sessions of 20 messages, written interleaved with it. A **diag** row per length
//!   times `ContextStats` (the same load and render, without the messages in the answer).
//! - **disk**: every trace of `testdata/traces` imported (`ImportSession`), the server stopped
//!   and the WAL checkpointed; the file's size per byte of the messages' JSON and per byte of
//!   distinct texts (message contents and tool-call arguments).
//! - **PostgreSQL**, when `CTXD_BENCH_DATABASE_URL` names a server (`postgres://…`; unset, one
//!   line says these rows are skipped): the same server code over `Store::connect` in a database
//!   the run creates there (`ctxd_bench_<uuid>`) and drops at the end. **pg floor**: raw
//!   durable INSERTs through psycopg (`bench/pg_floor.py`, one ~500-byte row per autocommit
//!   transaction, the server's `synchronous_commit`), 1 writer and 64 (threads, a connection
//!   each), before and after the appends; it needs a Python that imports psycopg
//!   (`target/py/bin/python`, else `python3`), and without one it is skipped in one line.
//!   **pg append**: the append cases above against it. **pg render**: the heuristic and
//!   o200k_base renders, cold and warm, against the same case on SQLite.
//!
//! Prints one table and the targets, and writes both as JSON to `target/bench/store.json`.

#[path = "common/report.rs"]
mod report;

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ctxd::api::pb;
use ctxd::domain::{BranchName, NodeContent, Part, Role};
use ctxd::store::{AppendRequest, AppendTarget, Config, Database, Scoped, Store};
use ctxd::tokens::Tokenizer;
use pb::context_store_client::ContextStoreClient;
use serde::Deserialize;
use serde_json::json;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::Channel;

type Client = ContextStoreClient<Channel>;
type HealthClient = tonic_health::pb::health_client::HealthClient<Channel>;

/// The render input, cycled to the path lengths.
const TRACE: &str = "cc-main-4d5611e5";
const RENDER_LENGTHS: [usize; 3] = [100, 1_000, 10_000];
/// The length every render ratio refers to.
const REFERENCE_LENGTH: usize = 1_000;
const CLIENTS: [usize; 4] = [1, 4, 16, 64];
/// Bytes of text per appended message and per floor row.
const ROW_BYTES: usize = 500;
/// The "other sessions" of the database-size comparison: this many, of this many messages,
/// appended in batches of `OTHER_BATCH`, by `BUILDERS` concurrent writers.
const OTHER_SESSIONS: usize = 1_000;
const OTHER_MESSAGES: usize = 20;
const OTHER_BATCH: usize = 10;
const BUILDERS: usize = 64;
/// Large enough for the unbudgeted 10,000-message render (about 20 MB).
const MAX_MESSAGE: usize = 64 * 1024 * 1024;
/// How long each concurrency level appends before and while it is counted.
const THROUGHPUT_WARMUP: Duration = Duration::from_millis(300);
const THROUGHPUT_TIME: Duration = Duration::from_millis(2_000);

/// How many samples a case takes: untimed warm-up first (page caches, allocator, HTTP/2
/// windows), then at least `min` timed samples, and more until `time` has passed or `max`.
#[derive(Clone, Copy)]
struct Plan {
    warmup_iters: usize,
    warmup_time: Duration,
    min: usize,
    time: Duration,
    max: usize,
}

/// One row of the floor or one append: fsync-bound, so a couple of hundred samples at least.
const FSYNC_PLAN: Plan = Plan {
    warmup_iters: 20,
    warmup_time: Duration::from_millis(200),
    min: 200,
    time: Duration::from_millis(1_500),
    max: 5_000,
};
const WARM_RENDER_PLAN: Plan = Plan {
    warmup_iters: 2,
    warmup_time: Duration::from_millis(150),
    min: 10,
    time: Duration::from_millis(900),
    max: 1_000,
};
/// Each cold sample restarts the server, so few of them.
const COLD_RENDER_PLAN: Plan = Plan {
    warmup_iters: 0,
    warmup_time: Duration::ZERO,
    min: 5,
    time: Duration::from_millis(1_200),
    max: 9,
};

// ---------------------------------------------------------------- samples

struct Sampler {
    plan: Plan,
    warmed: usize,
    started: Instant,
    timed_since: Option<Instant>,
    times: Vec<Duration>,
}

impl Sampler {
    fn new(plan: Plan) -> Self {
        Self {
            plan,
            warmed: 0,
            started: Instant::now(),
            timed_since: None,
            times: Vec::new(),
        }
    }

    fn more(&self) -> bool {
        match self.timed_since {
            None => true,
            Some(since) => {
                self.times.len() < self.plan.min
                    || (since.elapsed() < self.plan.time && self.times.len() < self.plan.max)
            }
        }
    }

    fn record(&mut self, took: Duration) {
        if self.timed_since.is_none() {
            if self.warmed < self.plan.warmup_iters
                || self.started.elapsed() < self.plan.warmup_time
            {
                self.warmed += 1;
                return;
            }
            self.timed_since = Some(Instant::now());
        }
        self.times.push(took);
    }

    fn stats(mut self) -> Stats {
        Stats::of(&mut self.times)
    }
}

#[derive(Clone, Copy)]
struct Stats {
    n: usize,
    p50: Duration,
    p95: Duration,
}

impl Stats {
    fn of(times: &mut [Duration]) -> Self {
        assert!(!times.is_empty(), "a case took no samples");
        times.sort_unstable();
        Self {
            n: times.len(),
            p50: percentile(times, 50),
            p95: percentile(times, 95),
        }
    }
}

/// Nearest-rank percentile of sorted samples.
fn percentile(sorted: &[Duration], p: usize) -> Duration {
    let rank = (p * sorted.len()).div_ceil(100).max(1);
    sorted[rank - 1]
}

fn show(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us < 1_000.0 {
        format!("{us:.0} µs")
    } else if us < 1_000_000.0 {
        format!("{:.2} ms", us / 1_000.0)
    } else {
        format!("{:.2} s", us / 1e6)
    }
}

fn mb(bytes: u64) -> String {
    format!("{:.2} MB", bytes as f64 / 1e6)
}

// ---------------------------------------------------------------- the table

/// One line of the table and of the JSON.
struct Row {
    section: &'static str,
    case: String,
    stats: Option<Stats>,
    /// A rate or a size: number, unit.
    value: Option<(f64, &'static str)>,
    /// The case's figure over the same figure of `ratio_to`, measured in this run.
    ratio: Option<f64>,
    ratio_to: String,
}

impl Row {
    fn timed(section: &'static str, case: impl Into<String>, stats: Stats) -> Self {
        Self {
            section,
            case: case.into(),
            stats: Some(stats),
            value: None,
            ratio: None,
            ratio_to: String::new(),
        }
    }

    fn vs(mut self, ratio: f64, to: impl Into<String>) -> Self {
        self.ratio = Some(ratio);
        self.ratio_to = to.into();
        self
    }

    fn value_cell(&self) -> String {
        match self.value {
            Some((v, "B")) => mb(v as u64),
            Some((v, unit)) => format!("{v:.0} {unit}"),
            None => String::new(),
        }
    }

    fn json(&self) -> serde_json::Value {
        let us = |d: Duration| (d.as_secs_f64() * 1e7).round() / 10.0;
        json!({
            "section": self.section,
            "case": self.case,
            "samples": self.stats.map(|s| s.n),
            "p50_us": self.stats.map(|s| us(s.p50)),
            "p95_us": self.stats.map(|s| us(s.p95)),
            "value": self.value.map(|(v, _)| v),
            "unit": self.value.map(|(_, u)| u),
            "ratio": self.ratio.map(|r| (r * 1000.0).round() / 1000.0),
            "ratio_to": self.ratio_to,
        })
    }
}

fn print_table(rows: &[Row]) {
    let header = ["case", "n", "p50", "p95", "rate / size", "ratio", "to"];
    let cells: Vec<[String; 7]> = rows
        .iter()
        .map(|r| {
            [
                format!("{}: {}", r.section, r.case),
                r.stats.map_or(String::new(), |s| s.n.to_string()),
                r.stats.map_or(String::new(), |s| show(s.p50)),
                r.stats.map_or(String::new(), |s| show(s.p95)),
                r.value_cell(),
                r.ratio.map_or(String::new(), |x| format!("{x:.2}×")),
                r.ratio_to.clone(),
            ]
        })
        .collect();
    report::print_table(header, &cells);
}

// ---------------------------------------------------------------- the server

/// Where a server's store lives: a SQLite file (`Store::open`) or a PostgreSQL database
/// (`Store::connect` with a `postgres://` URL, as `ctxd serve --db` does).
#[derive(Clone)]
enum Db {
    Sqlite(PathBuf),
    Postgres(String),
}

impl From<&PathBuf> for Db {
    fn from(path: &PathBuf) -> Self {
        Db::Sqlite(path.clone())
    }
}

impl Db {
    async fn open(&self) -> Store {
        match self {
            Db::Sqlite(path) => Store::open(path).await,
            Db::Postgres(url) => Store::connect(url, Config::default()).await,
        }
        .expect("open the store")
    }
}

/// A running in-process server over one database.
struct Server {
    addr: SocketAddr,
    store: Store,
    shutdown: oneshot::Sender<()>,
    handle: JoinHandle<Result<(), tonic::transport::Error>>,
}

impl Server {
    async fn start(db: impl Into<Db>) -> Self {
        let store = db.into().open().await;
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let (shutdown, signal) = oneshot::channel::<()>();
        let handle = tokio::spawn(ctxd::server::serve(listener, store.clone(), async move {
            let _ = signal.await;
        }));
        Self {
            addr,
            store,
            shutdown,
            handle,
        }
    }

    async fn client(&self) -> Client {
        connect(self.addr).await
    }

    /// Stops serving, then closes the store (on SQLite this checkpoints the WAL into the file).
    async fn stop(self) {
        let _ = self.shutdown.send(());
        tokio::time::timeout(Duration::from_secs(10), self.handle)
            .await
            .expect("serve() returns within 10 s of the shutdown signal")
            .expect("the serve task")
            .expect("serve() returns Ok");
        self.store.close().await;
    }
}

/// A health client on its own HTTP/2 connection.
async fn health_client(addr: SocketAddr) -> HealthClient {
    let channel = Channel::from_shared(format!("http://{addr}"))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");
    HealthClient::new(channel)
}

/// A client on its own HTTP/2 connection.
async fn connect(addr: SocketAddr) -> Client {
    let channel = Channel::from_shared(format!("http://{addr}"))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");
    ContextStoreClient::new(channel)
        .max_decoding_message_size(MAX_MESSAGE)
        .max_encoding_message_size(MAX_MESSAGE)
}

async fn create_session(client: &mut Client) -> String {
    client
        .create_session(pb::CreateSessionRequest::default())
        .await
        .expect("CreateSession")
        .into_inner()
        .session_id
}

async fn append(client: &mut Client, session: &str, nodes: Vec<pb::NodeInput>) {
    client
        .append(pb::AppendRequest {
            session_id: session.to_owned(),
            nodes,
            ..Default::default()
        })
        .await
        .expect("Append");
}

fn text(s: String) -> pb::ContentPart {
    pb::ContentPart {
        part: Some(pb::content_part::Part::Text(s)),
    }
}

fn message(role: pb::Role, parts: Vec<pb::ContentPart>, calls: Vec<pb::ToolCall>) -> pb::NodeInput {
    pb::NodeInput {
        kind: Some(pb::node_input::Kind::Message(pb::Message {
            role: role as i32,
            parts,
            tool_calls: calls,
        })),
        pinned: false,
    }
}

// ---------------------------------------------------------------- traces

/// One line of a neutral JSONL trace (see `testdata/traces/README.md`).
#[derive(Deserialize)]
struct TraceMessage {
    role: String,
    #[serde(default)]
    content: String,
    #[serde(default)]
    tool_calls: Vec<TraceCall>,
    #[serde(default)]
    tool_call_id: Option<String>,
    #[serde(default)]
    is_error: bool,
}

#[derive(Deserialize)]
struct TraceCall {
    id: String,
    name: String,
    arguments: String,
}

fn traces_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("testdata/traces")
}

fn load_trace(name: &str) -> Vec<TraceMessage> {
    let path = traces_dir().join(format!("{name}.jsonl"));
    let text = std::fs::read_to_string(&path).expect("read the trace");
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, l)| serde_json::from_str(l).unwrap_or_else(|e| panic!("line {}: {e}", i + 1)))
        .collect()
}

/// `n` messages of `trace` from message `start` on, cycling; the call ids of each pass get the
/// suffix `#<tag>.<pass>`, so every turn's calls are unique in the session. Each item says
/// whether it is a message (which opens a model turn) or a tool result (which joins one).
fn cycled(trace: &[TraceMessage], start: usize, n: usize, tag: &str) -> Vec<(bool, pb::NodeInput)> {
    (start..start + n)
        .map(|k| {
            let m = &trace[k % trace.len()];
            let suffix = |id: &str| format!("{id}#{tag}.{}", k / trace.len());
            if m.role == "tool" {
                let call = m.tool_call_id.as_deref().expect("a tool result's call id");
                let node = pb::NodeInput {
                    kind: Some(pb::node_input::Kind::ToolResult(pb::ToolResult {
                        call_id: suffix(call),
                        name: String::new(),
                        parts: vec![text(m.content.clone())],
                        is_error: m.is_error,
                    })),
                    pinned: false,
                };
                return (false, node);
            }
            let role = match m.role.as_str() {
                "user" => pb::Role::User,
                "assistant" => pb::Role::Assistant,
                "system" => pb::Role::System,
                other => panic!("role {other:?}"),
            };
            let calls: Vec<pb::ToolCall> = m
                .tool_calls
                .iter()
                .map(|c| pb::ToolCall {
                    call_id: suffix(&c.id),
                    name: c.name.clone(),
                    arguments_json: c.arguments.clone(),
                })
                .collect();
            let parts = if m.content.is_empty() && !calls.is_empty() {
                vec![]
            } else {
                vec![text(m.content.clone())]
            };
            (true, message(role, parts, calls))
        })
        .collect()
}

/// One append per model turn: a message and the tool results answering it.
fn turns(items: Vec<(bool, pb::NodeInput)>) -> Vec<Vec<pb::NodeInput>> {
    let mut out: Vec<Vec<pb::NodeInput>> = Vec::new();
    for (opens, node) in items {
        match out.last_mut() {
            Some(turn) if !opens => turn.push(node),
            _ => out.push(vec![node]),
        }
    }
    out
}

/// Texts of about `ROW_BYTES` for appends and floor rows: windows of the trace's real text (so
/// they compress like real content), each with a unique prefix (so none dedupes).
struct Texts {
    corpus: String,
}

impl Texts {
    fn new(trace: &[TraceMessage]) -> Self {
        let corpus: String = trace.iter().map(|m| m.content.as_str()).collect();
        assert!(corpus.len() > 10 * ROW_BYTES);
        Self { corpus }
    }

    fn get(&self, tag: &str, i: usize) -> String {
        let prefix = format!("[{tag} {i}] ");
        let span = self.corpus.len() - 2 * ROW_BYTES;
        let mut start = (i.wrapping_mul(7_919)) % span;
        while !self.corpus.is_char_boundary(start) {
            start += 1;
        }
        let mut end = start + ROW_BYTES - prefix.len();
        while !self.corpus.is_char_boundary(end) {
            end += 1;
        }
        prefix + &self.corpus[start..end]
    }
}

// ---------------------------------------------------------------- the floor

struct Floor {
    stats: Stats,
    rows_per_s: f64,
}

/// The store's durability (`Store::open`): WAL, `synchronous=FULL`, a busy timeout.
fn durable(db: &Path) -> SqliteConnectOptions {
    SqliteConnectOptions::new()
        .filename(db)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Full)
        .busy_timeout(Duration::from_secs(10))
}

const FLOOR_TABLE: &str = "CREATE TABLE IF NOT EXISTS rows (
    id INTEGER PRIMARY KEY, session BLOB NOT NULL, body TEXT NOT NULL)";
const FLOOR_INSERT: &str = "INSERT INTO rows (session, body) VALUES (?1, ?2)";

/// Raw SQLite through its synchronous C API (rusqlite, the binding ctxd's committer writes
/// with), with ctxd's durability: one ~500-byte row per `BEGIN IMMEDIATE … COMMIT`, one writer,
/// on a blocking thread. Without `fsync` (`synchronous=OFF`, a diagnostic), the same minus the
/// WAL's fsync.
async fn floor(db: &Path, texts: &Arc<Texts>, tag: &str, fsync: bool) -> Floor {
    let (db, texts, tag) = (db.to_path_buf(), Arc::clone(texts), tag.to_owned());
    tokio::task::spawn_blocking(move || {
        let conn = rusqlite::Connection::open(&db).expect("open the floor database");
        conn.query_row("PRAGMA journal_mode = WAL", [], |_| Ok(()))
            .expect("WAL");
        let synchronous = if fsync { "FULL" } else { "OFF" };
        conn.pragma_update(None, "synchronous", synchronous)
            .expect("synchronous");
        conn.busy_timeout(Duration::from_secs(10))
            .expect("busy timeout");
        conn.execute(FLOOR_TABLE, [])
            .expect("create the floor table");
        let session = [7u8; 16];
        let mut clock = RowClock::new();
        while clock.more() {
            let body = texts.get(&tag, clock.rows);
            let start = Instant::now();
            conn.execute_batch("BEGIN IMMEDIATE")
                .expect("begin a floor transaction");
            conn.prepare_cached(FLOOR_INSERT)
                .expect("prepare")
                .execute((session.as_slice(), body))
                .expect("insert a floor row");
            conn.execute_batch("COMMIT").expect("commit a floor row");
            clock.record(start);
        }
        clock.finish()
    })
    .await
    .expect("the floor thread")
}

/// The same rows through sqlx, the async driver of ctxd's other writes: each statement is a
/// round trip to the connection's worker thread.
async fn floor_sqlx(db: &Path, texts: &Texts, tag: &str) -> Floor {
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(durable(db))
        .await
        .expect("open the floor database");
    sqlx::query(FLOOR_TABLE)
        .execute(&pool)
        .await
        .expect("create the floor table");
    let session = [7u8; 16];
    let mut clock = RowClock::new();
    while clock.more() {
        let body = texts.get(tag, clock.rows);
        let start = Instant::now();
        let mut tx = pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .expect("begin a floor transaction");
        sqlx::query(FLOOR_INSERT)
            .bind(session.as_slice())
            .bind(body)
            .execute(&mut *tx)
            .await
            .expect("insert a floor row");
        tx.commit().await.expect("commit a floor row");
        clock.record(start);
    }
    pool.close().await;
    clock.finish()
}

/// A floor's samples, and its rate: the timed rows, written back to back, from the first
/// one's start.
struct RowClock {
    sampler: Sampler,
    rows: usize,
    timed: usize,
    first_timed: Option<Instant>,
}

impl RowClock {
    fn new() -> Self {
        Self {
            sampler: Sampler::new(FSYNC_PLAN),
            rows: 0,
            timed: 0,
            first_timed: None,
        }
    }

    fn more(&self) -> bool {
        self.sampler.more()
    }

    fn record(&mut self, start: Instant) {
        self.sampler.record(start.elapsed());
        self.rows += 1;
        if self.sampler.timed_since.is_some() {
            self.first_timed.get_or_insert(start);
            self.timed += 1;
        }
    }

    fn finish(self) -> Floor {
        let took = self.first_timed.expect("timed rows").elapsed();
        Floor {
            rows_per_s: self.timed as f64 / took.as_secs_f64(),
            stats: self.sampler.stats(),
        }
    }
}

// ---------------------------------------------------------------- appends

/// One appending client: through gRPC, or (for the diagnostic rows) `Store::append` in
/// process, the same call the RPC makes after converting the request, or a health check in
/// place of the append: what the RPC stack alone allows.
enum Writer {
    Grpc {
        client: Client,
        session: String,
    },
    /// One `AppendStream` kept open, one request at a time: what a host or the gateway that
    /// writes a session's messages as they come pays per append on a stream.
    Stream {
        requests: tokio::sync::mpsc::Sender<pb::AppendRequest>,
        answers: tonic::Streaming<pb::AppendStreamResponse>,
        session: String,
    },
    /// `repeat` copies of each text: 8 make a text of about 4 KiB, stored as a blob.
    Direct {
        store: Store,
        session: Scoped,
        repeat: usize,
    },
    Noop(HealthClient),
}

impl Writer {
    async fn grpc(server: &Server) -> Self {
        let mut client = server.client().await;
        let session = create_session(&mut client).await;
        Writer::Grpc { client, session }
    }

    async fn stream(server: &Server) -> Self {
        let mut client = server.client().await;
        let session = create_session(&mut client).await;
        let (requests, outgoing) = tokio::sync::mpsc::channel(1);
        let answers = client
            .append_stream(tokio_stream::wrappers::ReceiverStream::new(outgoing))
            .await
            .expect("an AppendStream")
            .into_inner();
        Writer::Stream {
            requests,
            answers,
            session,
        }
    }

    async fn direct(store: &Store) -> Self {
        let tenant = ctxd::domain::Tenant::local();
        let created = store
            .create_session(&tenant, BTreeMap::new(), None)
            .await
            .expect("create a session")
            .id;
        let session = store
            .scope(&tenant, created)
            .await
            .expect("its own session");
        Writer::Direct {
            store: store.clone(),
            session,
            repeat: 1,
        }
    }

    /// Appends the `i`th message of a chat, user and assistant in turn, alone.
    async fn append(&mut self, texts: &Texts, tag: &str, i: usize) {
        let body = texts.get(tag, i);
        let user = i.is_multiple_of(2);
        match self {
            Writer::Grpc { client, session } => {
                let role = if user {
                    pb::Role::User
                } else {
                    pb::Role::Assistant
                };
                append(
                    client,
                    session,
                    vec![message(role, vec![text(body)], vec![])],
                )
                .await;
            }
            Writer::Stream {
                requests,
                answers,
                session,
            } => {
                let role = if user {
                    pb::Role::User
                } else {
                    pb::Role::Assistant
                };
                requests
                    .send(pb::AppendRequest {
                        session_id: session.clone(),
                        nodes: vec![message(role, vec![text(body)], vec![])],
                        ..Default::default()
                    })
                    .await
                    .expect("the stream takes a request");
                let answer = answers
                    .message()
                    .await
                    .expect("AppendStream")
                    .expect("an answer");
                assert_eq!(answer.appends.len(), 1);
            }
            Writer::Noop(health) => {
                health
                    .check(tonic_health::pb::HealthCheckRequest::default())
                    .await
                    .expect("a health check");
            }
            Writer::Direct {
                store,
                session,
                repeat,
            } => {
                let role = if user { Role::User } else { Role::Assistant };
                let body = body.repeat(*repeat);
                store
                    .append(AppendRequest {
                        session: *session,
                        target: AppendTarget::Branch(BranchName::main()),
                        expected_head: None,
                        idempotency_key: None,
                        pinned: Vec::new(),
                        nodes: vec![NodeContent::Message {
                            role,
                            parts: vec![Part::Text(body)],
                            tool_calls: vec![],
                        }],
                    })
                    .await
                    .expect("Store::append");
            }
        }
    }
}

/// What the lifecycle's bookkeeping costs an append: `Store::append` of texts of about 4 KiB
/// (each a new blob: its `blob_refs` row, whose trigger counts it in `blobs.refs`) on a database
/// as migrated, and on one without the `nodes_session` index and the `blob_refs` triggers, the
/// two timed in turn. The `blob_refs` row itself is written in both (the committer writes it).
async fn bookkeeping_cost(dir: &Path, texts: &Texts) -> (Stats, Stats) {
    let kept = dir.join("bookkeeping.db");
    let bare = dir.join("bare.db");
    for path in [&kept, &bare] {
        Store::open(path)
            .await
            .expect("create the store")
            .close()
            .await;
    }
    rusqlite::Connection::open(&bare)
        .expect("open the bare database")
        .execute_batch(
            "DROP INDEX nodes_session;
             DROP TRIGGER blob_refs_count;
             DROP TRIGGER blob_refs_release;",
        )
        .expect("drop the index and the triggers");
    let (kept, bare) = (
        Store::open(&kept).await.expect("open the store"),
        Store::open(&bare).await.expect("open the store"),
    );
    let mut writers = [Writer::direct(&kept).await, Writer::direct(&bare).await];
    for writer in &mut writers {
        if let Writer::Direct { repeat, .. } = writer {
            *repeat = 8;
        }
    }
    let mut samplers = [Sampler::new(FSYNC_PLAN), Sampler::new(FSYNC_PLAN)];
    let mut i = 0;
    while samplers.iter().any(Sampler::more) {
        for (n, (writer, sampler)) in writers.iter_mut().zip(&mut samplers).enumerate() {
            let start = Instant::now();
            writer.append(texts, &format!("b{n}"), i).await;
            sampler.record(start.elapsed());
        }
        i += 1;
    }
    kept.close().await;
    bare.close().await;
    let [with, without] = samplers.map(|s| s.stats());
    (with, without)
}

/// One client, one node per request, each timed.
async fn append_latency(mut writer: Writer, texts: &Texts, tag: &str) -> Stats {
    let mut sampler = Sampler::new(FSYNC_PLAN);
    let mut i = 0;
    while sampler.more() {
        let start = Instant::now();
        writer.append(texts, tag, i).await;
        sampler.record(start.elapsed());
        i += 1;
    }
    sampler.stats()
}

/// The writers as concurrent tokio tasks, each appending one node per request as fast as its
/// answers come; nodes/s over `THROUGHPUT_TIME` after `THROUGHPUT_WARMUP`, and the latency of
/// the appends completed in that window.
async fn throughput(writers: Vec<Writer>, texts: &Arc<Texts>, tag: &str) -> (f64, Stats) {
    let done = Arc::new(AtomicU64::new(0));
    let counting = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let clients = writers.len();
    let mut tasks = Vec::with_capacity(clients);
    for (c, mut writer) in writers.into_iter().enumerate() {
        let (texts, done, counting, stop) = (
            Arc::clone(texts),
            Arc::clone(&done),
            Arc::clone(&counting),
            Arc::clone(&stop),
        );
        let tag = format!("{tag}{clients}.{c}");
        tasks.push(tokio::spawn(async move {
            let mut times = Vec::new();
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                let start = Instant::now();
                writer.append(&texts, &tag, i).await;
                let took = start.elapsed();
                i += 1;
                if counting.load(Ordering::Relaxed) {
                    times.push(took);
                }
                done.fetch_add(1, Ordering::Relaxed);
            }
            times
        }));
    }
    tokio::time::sleep(THROUGHPUT_WARMUP).await;
    let (before, start) = (done.load(Ordering::Relaxed), Instant::now());
    counting.store(true, Ordering::Relaxed);
    tokio::time::sleep(THROUGHPUT_TIME).await;
    let (after, took) = (done.load(Ordering::Relaxed), start.elapsed());
    counting.store(false, Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    let mut times = Vec::new();
    for task in tasks {
        times.extend(task.await.expect("an appending task"));
    }
    let rate = (after - before) as f64 / took.as_secs_f64();
    (rate, Stats::of(&mut times))
}

/// What a unary RPC costs through this server with nothing behind it: a `grpc.health.v1`
/// check on its own connection, the same tonic client and server stack an append crosses.
async fn rpc_round_trip(addr: SocketAddr) -> Stats {
    let mut health = health_client(addr).await;
    let mut sampler = Sampler::new(FSYNC_PLAN);
    while sampler.more() {
        let start = Instant::now();
        health
            .check(tonic_health::pb::HealthCheckRequest::default())
            .await
            .expect("a health check");
        sampler.record(start.elapsed());
    }
    sampler.stats()
}

/// An `Append` the service refuses before the store (no nodes): the same layers, decoding and
/// handler an append crosses, without the committer.
async fn refused_append(server: &Server) -> Stats {
    let mut client = server.client().await;
    let session = create_session(&mut client).await;
    let mut sampler = Sampler::new(FSYNC_PLAN);
    while sampler.more() {
        let start = Instant::now();
        let refused = client
            .append(pb::AppendRequest {
                session_id: session.clone(),
                ..Default::default()
            })
            .await;
        sampler.record(start.elapsed());
        assert_eq!(
            refused.expect_err("an append without nodes").code(),
            tonic::Code::InvalidArgument
        );
    }
    sampler.stats()
}

// ---------------------------------------------------------------- building sessions

/// Appends `turns` to a new session, one request each, in order.
async fn build_session(addr: SocketAddr, turns: Vec<Vec<pb::NodeInput>>) -> String {
    let mut client = connect(addr).await;
    let session = create_session(&mut client).await;
    for turn in turns {
        append(&mut client, &session, turn).await;
    }
    session
}

/// `OTHER_SESSIONS` small sessions, written by `BUILDERS` concurrent clients: each of
/// `OTHER_MESSAGES` messages of the trace from a different place, in `OTHER_BATCH`es.
async fn build_others(addr: SocketAddr, trace: Arc<Vec<TraceMessage>>) {
    let starts: Vec<usize> = (0..trace.len())
        .filter(|&k| trace[k].role != "tool")
        .collect();
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..BUILDERS {
        let mut client = connect(addr).await;
        let (trace, next, starts) = (Arc::clone(&trace), Arc::clone(&next), starts.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let j = next.fetch_add(1, Ordering::Relaxed) as usize;
                if j >= OTHER_SESSIONS {
                    return;
                }
                let session = create_session(&mut client).await;
                let start = starts[(j * 37) % starts.len()];
                let items = cycled(&trace, start, OTHER_MESSAGES, &format!("o{j}"));
                let mut nodes: Vec<pb::NodeInput> = items.into_iter().map(|(_, n)| n).collect();
                while !nodes.is_empty() {
                    let rest = nodes.split_off(OTHER_BATCH.min(nodes.len()));
                    append(&mut client, &session, nodes).await;
                    nodes = rest;
                }
            }
        }));
    }
    for task in tasks {
        task.await.expect("a builder");
    }
}

// ---------------------------------------------------------------- renders

fn budget_100k() -> pb::Budget {
    pb::Budget {
        context_window: 100_000,
        output_reserve: 8_000,
        ..Default::default()
    }
}

async fn render(
    client: &mut Client,
    session: &str,
    tokenizer: Tokenizer,
    budget: Option<pb::Budget>,
) -> (Duration, pb::RenderResponse) {
    let request = pb::RenderRequest {
        session_id: session.to_owned(),
        tokenizer: tokenizer.name().to_owned(),
        budget,
        ..Default::default()
    };
    let start = Instant::now();
    let response = client.render(request).await.expect("Render").into_inner();
    (start.elapsed(), response)
}

/// Cold renders (each on a server just started on `db`), then warm ones on the last server.
/// Returns the server left running, both stats and the last response.
async fn cold_and_warm(
    mut server: Server,
    db: &Db,
    session: &str,
    tokenizer: Tokenizer,
    budget: Option<pb::Budget>,
) -> (Server, Stats, Stats, pb::RenderResponse) {
    let mut cold = Sampler::new(COLD_RENDER_PLAN);
    let mut client = server.client().await;
    let mut last = None;
    while cold.more() {
        drop(client);
        server.stop().await;
        server = Server::start(db.clone()).await;
        client = server.client().await;
        client
            .get_session(pb::GetSessionRequest {
                session_id: session.to_owned(),
            })
            .await
            .expect("GetSession");
        let (took, response) = render(&mut client, session, tokenizer, budget).await;
        cold.record(took);
        last = Some(response);
    }
    let mut warm = Sampler::new(WARM_RENDER_PLAN);
    while warm.more() {
        let (took, response) = render(&mut client, session, tokenizer, budget).await;
        warm.record(took);
        last = Some(response);
    }
    (server, cold.stats(), warm.stats(), last.expect("a render"))
}

fn describe(response: &pb::RenderResponse) -> String {
    let r = response.report.clone().unwrap_or_default();
    format!(
        "{} messages, {} tokens, fits {}, {} truncated, {} cleared, {} turns snipped",
        r.messages, r.total_tokens, r.fits, r.results_truncated, r.results_cleared, r.turns_snipped
    )
}

// ---------------------------------------------------------------- disk

struct Disk {
    files: usize,
    /// The database file alone, and what is left beside it (WAL, shared memory) after close.
    file: u64,
    left_beside: u64,
    empty: u64,
    json: u64,
    unique: u64,
    messages: usize,
    nodes: u64,
    took: Duration,
}

/// The size of a SQLite database with its WAL and shared-memory files, if any are left.
fn db_size(db: &Path) -> u64 {
    file_size(db, "") + file_size(db, "-wal") + file_size(db, "-shm")
}

fn file_size(db: &Path, suffix: &str) -> u64 {
    let mut path = db.as_os_str().to_owned();
    path.push(suffix);
    std::fs::metadata(PathBuf::from(path)).map_or(0, |m| m.len())
}

async fn disk(dir: &Path) -> Disk {
    // The schema alone, for scale.
    let empty_db = dir.join("empty.db");
    Server::start(&empty_db).await.stop().await;
    let empty = db_size(&empty_db);

    let db = dir.join("import.db");
    let server = Server::start(&db).await;
    let mut client = server.client().await;
    let mut paths: Vec<PathBuf> = std::fs::read_dir(traces_dir())
        .expect("list the traces")
        .map(|e| e.expect("a trace").path())
        .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
        .collect();
    paths.sort();
    let (mut json, mut messages, mut nodes) = (0u64, 0usize, 0u64);
    let mut texts: HashSet<String> = HashSet::new();
    let start = Instant::now();
    for path in &paths {
        let data = std::fs::read(path).expect("read a trace");
        for line in String::from_utf8_lossy(&data).lines() {
            if line.trim().is_empty() {
                continue;
            }
            json += line.len() as u64;
            messages += 1;
            let m: TraceMessage = serde_json::from_str(line).expect("a trace line");
            texts.insert(m.content);
            texts.extend(m.tool_calls.into_iter().map(|c| c.arguments));
        }
        let chunks: Vec<pb::ImportChunk> = data
            .chunks(64 * 1024)
            .map(|chunk| pb::ImportChunk {
                format: pb::ImportFormat::NeutralJsonl as i32,
                data: chunk.to_vec(),
                ..Default::default()
            })
            .collect();
        let imported = client
            .import_session(tokio_stream::iter(chunks))
            .await
            .expect("ImportSession")
            .into_inner();
        nodes += u64::from(imported.nodes);
    }
    let took = start.elapsed();
    drop(client);
    server.stop().await;
    let unique = texts.iter().map(|t| t.len() as u64).sum();
    Disk {
        files: paths.len(),
        file: file_size(&db, ""),
        left_beside: file_size(&db, "-wal") + file_size(&db, "-shm"),
        empty,
        json,
        unique,
        messages,
        nodes,
        took,
    }
}

// ---------------------------------------------------------------- PostgreSQL

/// A PostgreSQL server URL; when set, the run also measures ctxd on PostgreSQL, in a database
/// of its own that it creates there and drops at the end.
const PG_URL_VAR: &str = "CTXD_BENCH_DATABASE_URL";
/// Render cases on PostgreSQL: what differs from SQLite is loading the path, not counting
/// tokens, so the heuristic and one BPE tokenizer are enough; a third adds time, not insight.
const PG_TOKENIZERS: [Tokenizer; 2] = [Tokenizer::Heuristic, Tokenizer::O200kBase];
/// PostgreSQL's floor: raw INSERTs through psycopg, a script of this repository.
const PG_FLOOR_SCRIPT: &str = "bench/pg_floor.py";
/// The writers of PostgreSQL's floor: one, and as many as the most concurrent clients.
const PG_FLOOR_WRITERS: [usize; 2] = [1, 64];

/// `url` with its database (the path) replaced by `database`, its query kept.
fn with_database(url: &str, database: &str) -> String {
    let (base, query) = url
        .split_once('?')
        .map_or((url, None), |(b, q)| (b, Some(q)));
    let authority = base.find("://").map_or(0, |i| i + 3);
    let end = base[authority..]
        .find('/')
        .map_or(base.len(), |i| authority + i);
    let query = query.map_or(String::new(), |q| format!("?{q}"));
    format!("{}/{database}{query}", &base[..end])
}

/// A Python that imports psycopg: the repository's `target/py` venv (where `.ci/run` puts its
/// Python), else `python3` on the PATH. Err: why the floor is skipped.
fn floor_python() -> Result<PathBuf, String> {
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/py/bin/python");
    let python = if venv.exists() {
        venv
    } else {
        PathBuf::from("python3")
    };
    let imports = std::process::Command::new(&python)
        .args(["-c", "import psycopg"])
        .output();
    match imports {
        Ok(out) if out.status.success() => Ok(python),
        Ok(_) => Err(format!(
            "{} cannot import psycopg (python3 -m venv target/py && \
             target/py/bin/pip install 'psycopg[binary]')",
            python.display()
        )),
        Err(e) => Err(format!("cannot run {}: {e}", python.display())),
    }
}

/// PostgreSQL's floor at one moment: one writer, and `PG_FLOOR_WRITERS`' last.
struct PgFloor {
    one: Floor,
    many: Floor,
    /// The script's whole answer (versions, the server's durability settings), for the JSON.
    raw: serde_json::Value,
}

/// Runs `PG_FLOOR_SCRIPT` on the database `url` with the sampling plans of the SQLite floor and
/// the throughput cases, so both backends' floors are sampled alike.
async fn pg_floor(python: &Path, url: &str, tag: &str) -> PgFloor {
    let ms = |d: Duration| d.as_millis().to_string();
    let mut command = std::process::Command::new(python);
    command
        .arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(PG_FLOOR_SCRIPT))
        .arg(url)
        .args(["--tag", tag, "--writers"])
        .args(PG_FLOOR_WRITERS.map(|w| w.to_string()))
        .args(["--warmup-iters", &FSYNC_PLAN.warmup_iters.to_string()])
        .args(["--warmup-ms", &ms(FSYNC_PLAN.warmup_time)])
        .args(["--min", &FSYNC_PLAN.min.to_string()])
        .args(["--time-ms", &ms(FSYNC_PLAN.time)])
        .args(["--max", &FSYNC_PLAN.max.to_string()])
        .args(["--rate-warmup-ms", &ms(THROUGHPUT_WARMUP)])
        .args(["--rate-ms", &ms(THROUGHPUT_TIME)]);
    let out = tokio::task::spawn_blocking(move || command.output())
        .await
        .expect("the floor thread")
        .expect("run the PostgreSQL floor script");
    assert!(
        out.status.success(),
        "{PG_FLOOR_SCRIPT} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let raw: serde_json::Value = serde_json::from_slice(&out.stdout).expect("the floor's JSON");
    let floor = |writers: usize| {
        let r = raw["results"]
            .as_array()
            .expect("results")
            .iter()
            .find(|r| r["writers"] == writers)
            .expect("a result per writer count");
        let us = |key: &str| Duration::from_secs_f64(r[key].as_f64().expect(key) / 1e6);
        Floor {
            stats: Stats {
                n: r["samples"].as_u64().expect("samples") as usize,
                p50: us("p50_us"),
                p95: us("p95_us"),
            },
            rows_per_s: r["rows_per_s"].as_f64().expect("rows_per_s"),
        }
    };
    PgFloor {
        one: floor(1),
        many: floor(PG_FLOOR_WRITERS[1]),
        raw,
    }
}

fn floor_json(f: &Floor) -> serde_json::Value {
    json!({"p50_us": f.stats.p50.as_secs_f64() * 1e6, "p95_us": f.stats.p95.as_secs_f64() * 1e6,
           "samples": f.stats.n, "rows_per_s": f.rows_per_s})
}

/// ctxd on PostgreSQL through the same in-process gRPC server as the SQLite cases, in a fresh
/// database on the server `server_url` names, dropped at the end; the floor (psycopg) before
/// and after the appends, as on SQLite. Renders are compared with the same case on SQLite
/// (`sqlite_renders`). Returns the rows and the JSON's `postgres` object.
async fn postgres(
    server_url: &str,
    trace: &[TraceMessage],
    texts: &Arc<Texts>,
    sqlite_renders: &[(usize, Tokenizer, &str, bool, Stats)],
) -> (Vec<Row>, serde_json::Value) {
    use sqlx::Connection;

    let start = Instant::now();
    // Letters, digits and '_' only: safe to write into the SQL below unquoted.
    let name = format!("ctxd_bench_{}", uuid::Uuid::now_v7().simple());
    let mut admin = sqlx::PgConnection::connect(server_url)
        .await
        .expect("connect to the PostgreSQL server");
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&mut admin)
        .await
        .expect("create the bench database");
    let url = with_database(server_url, &name);
    let db = Db::Postgres(url.clone());
    println!(
        "\nPostgreSQL: database {name} created on {}",
        Database::parse(server_url).shown()
    );

    // The render sessions first, so their writes do not disturb the timed appends.
    let build_start = Instant::now();
    let server = Server::start(db.clone()).await;
    let mut builds = Vec::new();
    for &n in &RENDER_LENGTHS {
        builds.push(tokio::spawn(build_session(
            server.addr,
            turns(cycled(trace, 0, n, "r")),
        )));
    }
    let mut sessions = Vec::new();
    for build in builds {
        sessions.push(build.await.expect("a render session"));
    }
    server.stop().await;
    println!(
        "PostgreSQL render sessions of {RENDER_LENGTHS:?} messages built in {}",
        show(build_start.elapsed())
    );

    let python = floor_python();
    if let Err(why) = &python {
        println!("PostgreSQL floor skipped: {why}");
    }
    let floor_before = match &python {
        Ok(python) => Some(pg_floor(python, &url, "pf1").await),
        Err(_) => None,
    };
    let server = Server::start(db.clone()).await;
    let single = append_latency(Writer::grpc(&server).await, texts, "pa").await;
    let mut levels = Vec::new();
    for &clients in &CLIENTS {
        let mut writers = Vec::with_capacity(clients);
        for _ in 0..clients {
            writers.push(Writer::grpc(&server).await);
        }
        levels.push((clients, throughput(writers, texts, "pt").await));
    }
    let mut writers = Vec::with_capacity(64);
    for _ in 0..64 {
        writers.push(Writer::stream(&server).await);
    }
    let (stream_rate, stream_stats) = throughput(writers, texts, "pst").await;
    // What the RPC stack alone costs on this machine beside PostgreSQL: one health check at a
    // time, and 64 at once (the bound on what appends through gRPC can reach here).
    let bare = rpc_round_trip(server.addr).await;
    let mut noops = Vec::with_capacity(64);
    for _ in 0..64 {
        noops.push(Writer::Noop(health_client(server.addr).await));
    }
    let (noop_rate, noop_stats) = throughput(noops, texts, "ph").await;
    server.stop().await;
    let direct = db.open().await;
    let direct_single = append_latency(Writer::direct(&direct).await, texts, "pd").await;
    let mut writers = Vec::with_capacity(64);
    for _ in 0..64 {
        writers.push(Writer::direct(&direct).await);
    }
    let (direct_rate, direct_stats) = throughput(writers, texts, "pdt").await;
    direct.close().await;
    let floor_after = match &python {
        Ok(python) => Some(pg_floor(python, &url, "pf2").await),
        Err(_) => None,
    };

    let mut rows = Vec::new();
    // The means of before and after, as on SQLite: (p50, p95, rows/s, rows/s of many writers).
    let floor = floor_before
        .as_ref()
        .zip(floor_after.as_ref())
        .map(|(b, a)| {
            (
                (b.one.stats.p50 + a.one.stats.p50) / 2,
                (b.one.stats.p95 + a.one.stats.p95) / 2,
                (b.one.rows_per_s + a.one.rows_per_s) / 2.0,
                (b.many.rows_per_s + a.many.rows_per_s) / 2.0,
            )
        });
    let many = PG_FLOOR_WRITERS[1];
    if let (Some((p50, _, _, many_rate)), Some(before), Some(after)) =
        (floor, &floor_before, &floor_after)
    {
        for (when, f) in [("before", before), ("after", after)] {
            let mut row = Row::timed(
                "pg floor",
                format!("raw INSERT via psycopg, autocommit, 1 writer ({when})"),
                f.one.stats,
            )
            .vs(
                f.one.stats.p50.as_secs_f64() / p50.as_secs_f64(),
                "mean floor p50",
            );
            row.value = Some((f.one.rows_per_s, "rows/s"));
            rows.push(row);
        }
        for (when, f) in [("before", before), ("after", after)] {
            let mut row = Row::timed(
                "pg floor",
                format!(
                    "raw INSERT via psycopg, autocommit, {many} writers, 1 connection each \
                     ({when})"
                ),
                f.many.stats,
            )
            .vs(f.many.rows_per_s / many_rate, "mean floor rows/s");
            row.value = Some((f.many.rows_per_s, "rows/s"));
            rows.push(row);
        }
    }
    // Each row against the floor when there is one; without it, the figures alone.
    let against = |row: Row, ratio: Option<f64>, to: &str| match ratio {
        Some(r) => row.vs(r, to),
        None => row,
    };
    let over_p50 = |s: Stats| floor.map(|f| s.p50.as_secs_f64() / f.0.as_secs_f64());
    let over_rate = |rate: f64| floor.map(|f| rate / f.2);
    rows.push(against(
        Row::timed("pg append", "latency, 1 client, 1 node/request", single),
        over_p50(single),
        "pg floor p50",
    ));
    // Rows that differ from another only by their ratio need the floor.
    if let Some(f) = floor {
        rows.push(
            Row::timed(
                "pg append",
                "latency, 1 client, 1 node/request (p95)",
                single,
            )
            .vs(single.p95.as_secs_f64() / f.1.as_secs_f64(), "pg floor p95"),
        );
    }
    for &(clients, (rate, stats)) in &levels {
        let case = format!("throughput, {clients} concurrent client(s), 1 node/request");
        let mut row = against(
            Row::timed("pg append", case.clone(), stats),
            over_rate(rate),
            "pg floor rows/s, 1 writer",
        );
        row.value = Some((rate, "nodes/s"));
        rows.push(row);
        // PostgreSQL takes concurrent writers, unlike SQLite: the same load on its own.
        if let (true, Some(f)) = (clients == many, floor) {
            let mut row = Row::timed("pg append", format!("{case} (vs {many} writers)"), stats)
                .vs(rate / f.3, format!("pg floor rows/s, {many} writers"));
            row.value = Some((rate, "nodes/s"));
            rows.push(row);
        }
    }
    let case = "throughput, 64 clients on an AppendStream each, 1 node/request";
    let mut row = against(
        Row::timed("pg append", case, stream_stats),
        over_rate(stream_rate),
        "pg floor rows/s, 1 writer",
    );
    row.value = Some((stream_rate, "nodes/s"));
    rows.push(row);
    if let Some(f) = floor {
        let mut row = Row::timed(
            "pg append",
            format!("{case} (vs {many} writers)"),
            stream_stats,
        )
        .vs(
            stream_rate / f.3,
            format!("pg floor rows/s, {many} writers"),
        );
        row.value = Some((stream_rate, "nodes/s"));
        rows.push(row);
    }
    rows.push(against(
        Row::timed("pg diag", "Store::append in process, 1 task", direct_single),
        over_p50(direct_single),
        "pg floor p50",
    ));
    let mut row = against(
        Row::timed(
            "pg diag",
            "Store::append in process, 64 tasks",
            direct_stats,
        ),
        over_rate(direct_rate),
        "pg floor rows/s, 1 writer",
    );
    row.value = Some((direct_rate, "nodes/s"));
    rows.push(row);

    rows.push(against(
        Row::timed(
            "pg diag",
            "bare gRPC round trip (health check), 1 client",
            bare,
        ),
        over_p50(bare),
        "pg floor p50",
    ));
    if let Some(f) = floor {
        // An append through gRPC costs at least the store's append plus the RPC's round trip.
        let bound = (direct_single.p50 + bare.p50).as_secs_f64() / f.0.as_secs_f64();
        rows.push(
            Row::timed(
                "pg diag",
                "Store::append in process + bare gRPC round trip, p50",
                direct_single,
            )
            .vs(bound, "pg floor p50"),
        );
        let mut row = Row::timed(
            "pg diag",
            "bare gRPC round trips (health checks), 64 clients",
            noop_stats,
        )
        .vs(noop_rate / f.3, format!("pg floor rows/s, {many} writers"));
        row.value = Some((noop_rate, "calls/s"));
        rows.push(row);
    }

    let budgets: [(&str, Option<pb::Budget>); 2] =
        [("unbudgeted", None), ("100k/8k", Some(budget_100k()))];
    let mut server = Server::start(db.clone()).await;
    for (&n, session) in RENDER_LENGTHS.iter().zip(&sessions) {
        for tokenizer in PG_TOKENIZERS {
            for (budget_name, budget) in &budgets {
                let (next, cold, warm, last) =
                    cold_and_warm(server, &db, session, tokenizer, *budget).await;
                server = next;
                println!(
                    "PostgreSQL render {n:>6} messages, {:<11} {budget_name:<10}: {}",
                    tokenizer.name(),
                    describe(&last)
                );
                for (is_cold, stats) in [(true, cold), (false, warm)] {
                    let sqlite = sqlite_renders
                        .iter()
                        .find(|r| {
                            r.0 == n && r.1 == tokenizer && r.2 == *budget_name && r.3 == is_cold
                        })
                        .expect("the same render on SQLite")
                        .4;
                    let warmth = if is_cold { "cold" } else { "warm" };
                    rows.push(
                        Row::timed(
                            "pg render",
                            format!("{n} msgs, {} {warmth}, {budget_name}", tokenizer.name()),
                            stats,
                        )
                        .vs(
                            stats.p50.as_secs_f64() / sqlite.p50.as_secs_f64(),
                            "same on SQLite",
                        ),
                    );
                }
            }
        }
    }
    server.stop().await;

    sqlx::query(sqlx::AssertSqlSafe(format!("DROP DATABASE {name}")))
        .execute(&mut admin)
        .await
        .expect("drop the bench database");
    admin.close().await.expect("close the admin connection");
    let took = start.elapsed();
    println!(
        "PostgreSQL: database {name} dropped; the PostgreSQL cases took {}",
        show(took)
    );

    let floor_doc = match (&python, &floor_before, &floor_after) {
        (Ok(python), Some(before), Some(after)) => json!({
            "what": "raw INSERT of one ~500-byte row per transaction through psycopg (autocommit)",
            "python": python.display().to_string(),
            "psycopg": before.raw["psycopg"],
            "settings": before.raw["settings"],
            "before": {"1": floor_json(&before.one), many.to_string(): floor_json(&before.many)},
            "after": {"1": floor_json(&after.one), many.to_string(): floor_json(&after.many)},
        }),
        (Err(why), _, _) => json!({"skipped": why}),
        _ => unreachable!("a floor before and after whenever a python imports psycopg"),
    };
    let doc = json!({
        "server": Database::parse(server_url).shown(),
        "database": name,
        "floor": floor_doc,
        "seconds": took.as_secs_f64(),
    });
    (rows, doc)
}

// ---------------------------------------------------------------- main

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(bench());
}

async fn bench() {
    let run_start = Instant::now();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!("ctxd store benchmark: in-process gRPC server on 127.0.0.1, SQLite in a temp dir");
    let pg_url = std::env::var(PG_URL_VAR).ok().filter(|url| !url.is_empty());
    match &pg_url {
        Some(url) => {
            assert!(
                matches!(Database::parse(url), Database::Postgres(_)),
                "{PG_URL_VAR} must be a postgres:// URL"
            );
            println!(
                "and PostgreSQL, in a database of its own on {} (created, then dropped)",
                Database::parse(url).shown()
            );
        }
        None => println!(
            "PostgreSQL rows skipped: {PG_URL_VAR} is not set (a postgres:// server URL, \
             e.g. postgres://postgres@127.0.0.1:5432/postgres)"
        ),
    }
    println!("{cores} cores\n");

    // The BPE vocabularies load once per process; a fresh server process would pay this on
    // its first render, which the cold cases below do not include.
    let mut init = Vec::new();
    for tokenizer in [Tokenizer::O200kBase, Tokenizer::Cl100kBase] {
        let start = Instant::now();
        std::hint::black_box(tokenizer.count("hello world"));
        init.push((tokenizer, start.elapsed()));
    }
    for (tokenizer, took) in &init {
        println!(
            "vocabulary initialisation (once per process, not in the cold cases): {:<11} {}",
            tokenizer.name(),
            show(*took)
        );
    }

    let dir = tempfile::tempdir().expect("a temp dir");
    let trace = Arc::new(load_trace(TRACE));
    let texts = Arc::new(Texts::new(&trace));
    let mut rows: Vec<Row> = Vec::new();
    // Rows measured before the rows they follow in the table.
    let mut rows_later: Vec<Row> = Vec::new();

    // ---- the render databases, built first so their writes do not disturb the timed cases.
    let render_db = dir.path().join("render.db");
    let one_db = dir.path().join("one.db");
    let many_db = dir.path().join("many.db");
    let build_start = Instant::now();
    let render_server = Server::start(&render_db).await;
    let one_server = Server::start(&one_db).await;
    let many_server = Server::start(&many_db).await;
    let mut appends = Vec::new();
    let mut builds = Vec::new();
    for &n in &RENDER_LENGTHS {
        let turns = turns(cycled(&trace, 0, n, "r"));
        appends.push(turns.len());
        builds.push(tokio::spawn(build_session(render_server.addr, turns)));
    }
    let lone = turns(cycled(&trace, 0, REFERENCE_LENGTH, "r"));
    let one_build = tokio::spawn(build_session(one_server.addr, lone.clone()));
    let many_build = tokio::spawn(build_session(many_server.addr, lone));
    let others = tokio::spawn(build_others(many_server.addr, Arc::clone(&trace)));
    let mut sessions = Vec::new();
    for build in builds {
        sessions.push(build.await.expect("a render session"));
    }
    let one_session = one_build.await.expect("the lone session");
    let many_session = many_build.await.expect("the session among others");
    others.await.expect("the other sessions");
    let build_time = build_start.elapsed();
    render_server.stop().await;
    one_server.stop().await;
    many_server.stop().await;
    println!(
        "render sessions of {:?} messages from testdata/traces/{TRACE}.jsonl ({} messages, \
         cycled), appended in {:?} requests (one model turn each); the 1,000-message session \
         alone in one database ({}) and among {OTHER_SESSIONS} sessions of {OTHER_MESSAGES} \
         messages in another ({}); all built concurrently in {}",
        RENDER_LENGTHS,
        trace.len(),
        appends,
        mb(db_size(&one_db)),
        mb(db_size(&many_db)),
        show(build_time)
    );

    // ---- floor, appends (and what explains them), floor again.
    let floor_db = dir.path().join("floor.db");
    let floor_before = floor(&floor_db, &texts, "f1", true).await;
    let append_server = Server::start(&dir.path().join("append.db")).await;
    let single = append_latency(Writer::grpc(&append_server).await, &texts, "a").await;
    let rpc = rpc_round_trip(append_server.addr).await;
    let refused = refused_append(&append_server).await;
    let mut levels = Vec::new();
    for &clients in &CLIENTS {
        let mut writers = Vec::with_capacity(clients);
        for _ in 0..clients {
            writers.push(Writer::grpc(&append_server).await);
        }
        levels.push((clients, throughput(writers, &texts, "t").await));
    }
    let stream_single = append_latency(Writer::stream(&append_server).await, &texts, "as").await;
    let mut writers = Vec::with_capacity(64);
    for _ in 0..64 {
        writers.push(Writer::stream(&append_server).await);
    }
    let (stream_rate, stream_stats) = throughput(writers, &texts, "ast").await;
    let mut noops = Vec::with_capacity(64);
    for _ in 0..64 {
        noops.push(Writer::Noop(health_client(append_server.addr).await));
    }
    let (noop_rate, noop_stats) = throughput(noops, &texts, "h").await;
    append_server.stop().await;
    // Diagnostics: the store without gRPC, and one sqlx round trip.
    let direct = Store::open(&dir.path().join("direct.db"))
        .await
        .expect("open the store");
    let direct_single = append_latency(Writer::direct(&direct).await, &texts, "d").await;
    let mut writers = Vec::with_capacity(64);
    for _ in 0..64 {
        writers.push(Writer::direct(&direct).await);
    }
    let (direct_rate, direct_stats) = throughput(writers, &texts, "dt").await;
    direct.close().await;
    let (with_bookkeeping, without_bookkeeping) = bookkeeping_cost(dir.path(), &texts).await;
    let sqlx_floor = floor_sqlx(&dir.path().join("sqlx.db"), &texts, "s").await;
    let no_fsync = floor(&dir.path().join("nofsync.db"), &texts, "n", false).await;
    let floor_after = floor(&floor_db, &texts, "f2", true).await;

    let floor_p50 = (floor_before.stats.p50 + floor_after.stats.p50) / 2;
    let floor_p95 = (floor_before.stats.p95 + floor_after.stats.p95) / 2;
    let floor_rate = (floor_before.rows_per_s + floor_after.rows_per_s) / 2.0;
    let over_p50 = |s: Stats| s.p50.as_secs_f64() / floor_p50.as_secs_f64();
    for (name, f) in [("before", &floor_before), ("after", &floor_after)] {
        let mut row = Row::timed(
            "floor",
            format!("raw SQLite, 1 row/transaction, 1 writer ({name})"),
            f.stats,
        )
        .vs(over_p50(f.stats), "mean floor p50");
        row.value = Some((f.rows_per_s, "rows/s"));
        rows.push(row);
    }
    let single_ratio = over_p50(single);
    rows.push(
        Row::timed("append", "latency, 1 client, 1 node/request", single)
            .vs(single_ratio, "floor p50"),
    );
    rows.push(
        Row::timed("append", "latency, 1 client, 1 node/request (p95)", single).vs(
            single.p95.as_secs_f64() / floor_p95.as_secs_f64(),
            "floor p95",
        ),
    );
    for &(clients, (rate, stats)) in &levels {
        let mut row = Row::timed(
            "append",
            format!("throughput, {clients} concurrent client(s), 1 node/request"),
            stats,
        )
        .vs(rate / floor_rate, "floor rows/s");
        row.value = Some((rate, "nodes/s"));
        rows.push(row);
    }
    rows.push(
        Row::timed(
            "append",
            "latency, 1 client on an AppendStream, 1 node/request",
            stream_single,
        )
        .vs(over_p50(stream_single), "floor p50"),
    );
    let mut row = Row::timed(
        "append",
        "throughput, 64 clients on an AppendStream each, 1 node/request",
        stream_stats,
    )
    .vs(stream_rate / floor_rate, "floor rows/s");
    row.value = Some((stream_rate, "nodes/s"));
    rows.push(row);
    rows.push(
        Row::timed("diag", "Store::append in process, 1 task", direct_single)
            .vs(over_p50(direct_single), "floor p50"),
    );
    let mut row = Row::timed("diag", "Store::append in process, 64 tasks", direct_stats)
        .vs(direct_rate / floor_rate, "floor rows/s");
    row.value = Some((direct_rate, "nodes/s"));
    rows.push(row);
    rows.push(
        Row::timed(
            "diag",
            "Store::append of a 4 KiB text (a new blob), 1 task",
            with_bookkeeping,
        )
        .vs(
            with_bookkeeping.p50.as_secs_f64() / without_bookkeeping.p50.as_secs_f64(),
            "the same without nodes_session and the blob_refs triggers",
        ),
    );
    rows.push(
        Row::timed("diag", "one unary RPC, no storage (health check)", rpc)
            .vs(over_p50(rpc), "floor p50"),
    );
    rows.push(
        Row::timed(
            "diag",
            "one Append refused before the store (no nodes)",
            refused,
        )
        .vs(over_p50(refused), "floor p50"),
    );
    let mut row = Row::timed(
        "diag",
        "64 concurrent clients, a health check instead of an append",
        noop_stats,
    )
    .vs(noop_rate / floor_rate, "floor rows/s");
    row.value = Some((noop_rate, "calls/s"));
    rows.push(row);
    let mut row = Row::timed(
        "diag",
        "the floor through sqlx (async driver)",
        sqlx_floor.stats,
    )
    .vs(over_p50(sqlx_floor.stats), "floor p50");
    row.value = Some((sqlx_floor.rows_per_s, "rows/s"));
    rows.push(row);
    let mut row = Row::timed(
        "diag",
        "the floor without fsync (synchronous=OFF)",
        no_fsync.stats,
    )
    .vs(over_p50(no_fsync.stats), "floor p50");
    row.value = Some((no_fsync.rows_per_s, "rows/s"));
    rows.push(row);

    // ---- renders.
    let tokenizers = [
        Tokenizer::Heuristic,
        Tokenizer::O200kBase,
        Tokenizer::Cl100kBase,
    ];
    let budgets: [(&str, Option<pb::Budget>); 2] =
        [("unbudgeted", None), ("100k/8k", Some(budget_100k()))];
    let mut server = Server::start(&render_db).await;
    // (length, tokenizer, budget, cold) → stats, in the order measured.
    let mut renders: Vec<(usize, Tokenizer, &str, bool, Stats)> = Vec::new();
    println!();
    for (&n, session) in RENDER_LENGTHS.iter().zip(&sessions) {
        for tokenizer in tokenizers {
            for (budget_name, budget) in &budgets {
                let (next, cold, warm, last) =
                    cold_and_warm(server, &Db::from(&render_db), session, tokenizer, *budget).await;
                server = next;
                println!(
                    "render {n:>6} messages, {:<11} {budget_name:<10}: {}",
                    tokenizer.name(),
                    describe(&last)
                );
                renders.push((n, tokenizer, budget_name, true, cold));
                renders.push((n, tokenizer, budget_name, false, warm));
            }
        }
    }
    // The same warm render through ContextStats (the report without the messages): what the
    // load and the engine cost without converting, sending and decoding the messages.
    let mut stats_rows = Vec::new();
    let mut stats_reference = None;
    for (&n, session) in RENDER_LENGTHS.iter().zip(&sessions) {
        let mut client = server.client().await;
        let mut sampler = Sampler::new(WARM_RENDER_PLAN);
        while sampler.more() {
            let start = Instant::now();
            client
                .context_stats(pb::ContextStatsRequest {
                    session_id: session.clone(),
                    tokenizer: Tokenizer::Heuristic.name().to_owned(),
                    ..Default::default()
                })
                .await
                .expect("ContextStats");
            sampler.record(start.elapsed());
        }
        let stats = sampler.stats();
        if n == REFERENCE_LENGTH {
            stats_reference = Some(stats.p50);
        }
        stats_rows.push((n, stats));
    }
    let stats_reference = stats_reference.expect("the reference length");
    for (n, stats) in stats_rows {
        rows_later.push(
            Row::timed(
                "diag",
                format!("ContextStats {n} msgs, heuristic warm, unbudgeted"),
                stats,
            )
            .vs(
                stats.p50.as_secs_f64() / stats_reference.as_secs_f64(),
                format!("same at {REFERENCE_LENGTH} msgs"),
            ),
        );
    }
    server.stop().await;
    let reference = |tokenizer: Tokenizer, budget: &str, cold: bool| {
        renders
            .iter()
            .find(|r| r.0 == REFERENCE_LENGTH && r.1 == tokenizer && r.2 == budget && r.3 == cold)
            .map(|r| r.4.p50)
            .expect("the reference case")
    };
    for &(n, tokenizer, budget, cold, stats) in &renders {
        let warmth = if cold { "cold" } else { "warm" };
        rows.push(
            Row::timed(
                "render",
                format!("{n} msgs, {} {warmth}, {budget}", tokenizer.name()),
                stats,
            )
            .vs(
                stats.p50.as_secs_f64() / reference(tokenizer, budget, cold).as_secs_f64(),
                format!("same at {REFERENCE_LENGTH} msgs"),
            ),
        );
    }

    rows.append(&mut rows_later);

    // ---- the same render, alone in its database or among many sessions.
    let mut size_rows = Vec::new();
    for tokenizer in [Tokenizer::Heuristic, Tokenizer::O200kBase] {
        for (budget_name, budget) in &budgets {
            let mut results = Vec::new();
            for (db, session) in [(&one_db, &one_session), (&many_db, &many_session)] {
                let server = Server::start(db).await;
                let (server, cold, warm, _) =
                    cold_and_warm(server, &Db::from(db), session, tokenizer, *budget).await;
                server.stop().await;
                results.push((cold, warm));
            }
            for (k, warmth) in [(0, "cold"), (1, "warm")] {
                let pick = |r: &(Stats, Stats)| if k == 0 { r.0 } else { r.1 };
                let (one, many) = (pick(&results[0]), pick(&results[1]));
                let case = |what: &str| {
                    format!(
                        "{REFERENCE_LENGTH} msgs, {} {warmth}, {budget_name}, {what}",
                        tokenizer.name()
                    )
                };
                size_rows.push(Row::timed("db size", case("1 session"), one));
                size_rows.push(
                    Row::timed(
                        "db size",
                        case(&format!("+{OTHER_SESSIONS} sessions")),
                        many,
                    )
                    .vs(
                        many.p50.as_secs_f64() / one.p50.as_secs_f64(),
                        "same, 1 session",
                    ),
                );
            }
        }
    }
    rows.extend(size_rows);

    // ---- bytes on disk.
    let d = disk(dir.path()).await;
    println!(
        "\ndisk: {} trace files, {} messages, {} nodes imported (ImportSession) in {}; \
         empty database {}; left beside the file after close (WAL, shm): {} bytes",
        d.files,
        d.messages,
        d.nodes,
        show(d.took),
        mb(d.empty),
        d.left_beside
    );
    let on_disk = d.file + d.left_beside;
    for (case, value, denominator, to) in [
        ("message JSON (trace lines)", d.json, 0, ""),
        (
            "distinct texts (contents, tool-call arguments)",
            d.unique,
            0,
            "",
        ),
        ("database file after close", on_disk, d.json, "message JSON"),
        (
            "database file after close",
            on_disk,
            d.unique,
            "distinct texts",
        ),
        (
            "database file minus the empty database",
            on_disk - d.empty,
            d.unique,
            "distinct texts",
        ),
    ] {
        let mut row = Row {
            section: "disk",
            case: case.into(),
            stats: None,
            value: Some((value as f64, "B")),
            ratio: None,
            ratio_to: String::new(),
        };
        if denominator > 0 {
            row = row.vs(value as f64 / denominator as f64, to);
        }
        rows.push(row);
    }

    // ---- PostgreSQL last, so neither backend's load disturbs the other's cases.
    let postgres_doc = match &pg_url {
        Some(url) => {
            let (mut pg_rows, doc) = postgres(url, &trace, &texts, &renders).await;
            rows.append(&mut pg_rows);
            doc
        }
        None => json!({"skipped": format!("{PG_URL_VAR} is not set")}),
    };

    println!();
    print_table(&rows);

    // ---- the targets.
    let ratio_of = |section: &str, case: &str| {
        rows.iter()
            .find(|r| r.section == section && r.case == case)
            .and_then(|r| r.ratio)
            .expect("a row of the table")
    };
    let append_vs = |f: &Floor| single.p50.as_secs_f64() / f.stats.p50.as_secs_f64();
    let rate64 = levels.last().expect("64 clients").1.0;
    let mut checks = vec![
        (
            "1 client, 1 node/append: p50 over the floor's p50 (before / after)".to_owned(),
            single_ratio,
            format!(
                "{:.2}× / {:.2}×",
                append_vs(&floor_before),
                append_vs(&floor_after)
            ),
            "≤ 1.5×",
            single_ratio <= 1.5,
        ),
        (
            "64 concurrent clients: nodes/s over the floor's rows/s (before / after)".to_owned(),
            rate64 / floor_rate,
            format!(
                "{:.2}× / {:.2}×",
                rate64 / floor_before.rows_per_s,
                rate64 / floor_after.rows_per_s
            ),
            "≥ 5×",
            rate64 / floor_rate >= 5.0,
        ),
        (
            "64 clients on an AppendStream each: nodes/s over the floor's rows/s".to_owned(),
            stream_rate / floor_rate,
            String::new(),
            "≥ 5×",
            stream_rate / floor_rate >= 5.0,
        ),
        (
            "the same, in process without gRPC: Store::append, 1 task".to_owned(),
            over_p50(direct_single),
            String::new(),
            "≤ 1.2×",
            over_p50(direct_single) <= 1.2,
        ),
        (
            "the same, in process without gRPC: Store::append, 64 tasks".to_owned(),
            direct_rate / floor_rate,
            String::new(),
            "≥ 5×",
            direct_rate / floor_rate >= 5.0,
        ),
    ];
    for tokenizer in tokenizers {
        for (budget_name, _) in &budgets {
            for warmth in ["warm", "cold"] {
                let r = ratio_of(
                    "render",
                    &format!("10000 msgs, {} {warmth}, {budget_name}", tokenizer.name()),
                );
                checks.push((
                    format!(
                        "render {} {warmth} {budget_name}: 10,000 over 1,000 messages",
                        tokenizer.name()
                    ),
                    r,
                    String::new(),
                    "≤ 12×",
                    r <= 12.0,
                ));
            }
        }
    }
    for row in rows
        .iter()
        .filter(|r| r.section == "db size" && r.ratio.is_some())
    {
        let r = row.ratio.expect("a ratio");
        checks.push((
            format!("{}: over 1 session", row.case),
            r,
            String::new(),
            "≈ 1×",
            (0.8..=1.25).contains(&r),
        ));
    }
    println!("\ntargets:");
    for (what, value, detail, target, ok) in &checks {
        println!(
            "  [{}] {what}: {value:.2}× {detail} (target {target})",
            if *ok { "ok" } else { "MISS" }
        );
    }

    let out_dir = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(
            || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"),
            PathBuf::from,
        )
        .join("bench");
    std::fs::create_dir_all(&out_dir).expect("create target/bench");
    let document = json!({
        "bench": "store",
        "cores": cores,
        "floor": {
            "before": {"p50_us": floor_before.stats.p50.as_secs_f64() * 1e6,
                       "p95_us": floor_before.stats.p95.as_secs_f64() * 1e6,
                       "rows_per_s": floor_before.rows_per_s},
            "after": {"p50_us": floor_after.stats.p50.as_secs_f64() * 1e6,
                      "p95_us": floor_after.stats.p95.as_secs_f64() * 1e6,
                      "rows_per_s": floor_after.rows_per_s},
        },
        "postgres": postgres_doc,
        "vocabulary_init_us": init.iter().map(|(t, d)| (t.name().to_owned(), json!(d.as_secs_f64() * 1e6))).collect::<serde_json::Map<_, _>>(),
        "rows": rows.iter().map(Row::json).collect::<Vec<_>>(),
        "targets": checks.iter().map(|(what, value, detail, target, ok)| json!({
            "what": what, "value": value, "detail": detail, "target": target, "ok": ok,
        })).collect::<Vec<_>>(),
        "disk": {
            "file_bytes": d.file, "left_beside_bytes": d.left_beside, "empty_db_bytes": d.empty, "message_json_bytes": d.json,
            "distinct_text_bytes": d.unique, "messages": d.messages, "nodes": d.nodes,
        },
        "run_seconds": run_start.elapsed().as_secs_f64(),
    });
    let out = out_dir.join("store.json");
    std::fs::write(
        &out,
        serde_json::to_string_pretty(&document).expect("JSON") + "\n",
    )
    .expect("write target/bench/store.json");
    println!(
        "\nwrote target/bench/store.json; whole run {}",
        show(run_start.elapsed())
    );
}
