//! The test harness: `spawn_app()` gives each test its own database (`TestDb`: a SQLite file in
//! a temp dir, or a fresh schema on the PostgreSQL server `CTXD_TEST_DATABASE_URL` names) and
//! server on 127.0.0.1:0, with a connected client; builders keep the tests readable. The same
//! suite runs on either backend.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use sqlx::Connection;
use std::time::Duration;

use ctxd::api::pb;
use ctxd::server::Options;
use ctxd::store::Store;
use pb::context_store_client::ContextStoreClient;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::Channel;
use tonic::{Code, Status};

pub type Client = ContextStoreClient<Channel>;

/// Large enough for a few 1 MiB nodes in one response.
const MAX_MESSAGE: usize = 64 * 1024 * 1024;

/// One test's world: its database, a running server and a client.
pub struct TestApp {
    /// Deleted when the test ends.
    pub db: TestDb,
    pub addr: SocketAddr,
    pub client: Client,
    server: Option<Server>,
}

/// The PostgreSQL server the suite runs on instead of SQLite files, if one is named.
pub const DATABASE_URL: &str = "CTXD_TEST_DATABASE_URL";

/// The PostgreSQL server URL in [`DATABASE_URL`], if set.
pub fn postgres_server() -> Option<String> {
    std::env::var(DATABASE_URL)
        .ok()
        .filter(|url| !url.is_empty())
}

/// A test's own database: a SQLite file in a fresh temp dir, or, with [`DATABASE_URL`] set, a
/// fresh schema on that PostgreSQL server (dropped when this is).
pub struct TestDb {
    kind: DbKind,
}

enum DbKind {
    Sqlite {
        _dir: tempfile::TempDir,
        path: PathBuf,
    },
    Postgres {
        server: String,
        schema: String,
    },
}

impl TestDb {
    /// On the suite's backend.
    pub async fn new() -> Self {
        match postgres_server() {
            Some(server) => Self::postgres(server).await,
            None => Self::sqlite(),
        }
    }

    /// A SQLite file, whatever the suite's backend (for tests of the file itself).
    pub fn sqlite() -> Self {
        let dir = tempfile::tempdir().expect("create temp dir");
        let path = dir.path().join("ctxd.db");
        Self {
            kind: DbKind::Sqlite { _dir: dir, path },
        }
    }

    /// A fresh schema on the PostgreSQL server at `server`; a server that cannot be reached
    /// fails the test.
    pub async fn postgres(server: String) -> Self {
        let schema = format!("t_{}", uuid::Uuid::now_v7().simple());
        let mut admin = sqlx::PgConnection::connect(&server)
            .await
            .unwrap_or_else(|e| panic!("{DATABASE_URL}={server} cannot be reached: {e}"));
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
            .execute(&mut admin)
            .await
            .expect("create the test's schema");
        let _ = admin.close().await;
        Self {
            kind: DbKind::Postgres { server, schema },
        }
    }

    /// What `--db` (or `Store::connect`) takes to open it.
    pub fn url(&self) -> String {
        match &self.kind {
            DbKind::Sqlite { path, .. } => path.display().to_string(),
            DbKind::Postgres { server, schema } => {
                let sep = if server.contains('?') { '&' } else { '?' };
                format!("{server}{sep}options=-c%20search_path%3D{schema}")
            }
        }
    }

    /// The SQLite file, for tests of the file itself; `None` on PostgreSQL.
    pub fn sqlite_path(&self) -> Option<&Path> {
        match &self.kind {
            DbKind::Sqlite { path, .. } => Some(path),
            DbKind::Postgres { .. } => None,
        }
    }

    pub fn is_postgres(&self) -> bool {
        matches!(self.kind, DbKind::Postgres { .. })
    }

    pub async fn open(&self) -> Store {
        self.open_with(ctxd::store::Config::default()).await
    }

    pub async fn open_with(&self, config: ctxd::store::Config) -> Store {
        Store::connect(&self.url(), config)
            .await
            .expect("open the store")
    }

    /// The single number `sql` selects, read directly from the database.
    pub async fn count(&self, sql: &'static str) -> i64 {
        match &self.kind {
            DbKind::Sqlite { path, .. } => {
                let options = sqlx::sqlite::SqliteConnectOptions::new().filename(path);
                let mut conn = sqlx::SqliteConnection::connect_with(&options)
                    .await
                    .expect("open the SQLite file");
                let n: i64 = sqlx::query_scalar(sql)
                    .fetch_one(&mut conn)
                    .await
                    .expect("count rows");
                let _ = conn.close().await;
                n
            }
            DbKind::Postgres { .. } => {
                let mut conn = sqlx::PgConnection::connect(&self.url())
                    .await
                    .expect("connect to PostgreSQL");
                let n: i64 = sqlx::query_scalar(sql)
                    .fetch_one(&mut conn)
                    .await
                    .expect("count rows");
                let _ = conn.close().await;
                n
            }
        }
    }
}

impl TestDb {
    /// Runs `sql` (a write, say to age a session) directly on the database.
    pub async fn execute(&self, sql: &str) {
        let sql = sqlx::AssertSqlSafe(sql.to_owned());
        match &self.kind {
            DbKind::Sqlite { path, .. } => {
                let options = sqlx::sqlite::SqliteConnectOptions::new().filename(path);
                let mut conn = sqlx::SqliteConnection::connect_with(&options)
                    .await
                    .expect("open the SQLite file");
                sqlx::query(sql).execute(&mut conn).await.expect("execute");
                let _ = conn.close().await;
            }
            DbKind::Postgres { .. } => {
                let mut conn = sqlx::PgConnection::connect(&self.url())
                    .await
                    .expect("connect to PostgreSQL");
                sqlx::query(sql).execute(&mut conn).await.expect("execute");
                let _ = conn.close().await;
            }
        }
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let DbKind::Postgres { server, schema } = &self.kind else {
            return;
        };
        let (server, schema) = (server.clone(), schema.clone());
        // Drop runs inside the test's runtime, which cannot be blocked on: a thread of its own.
        // Joining it still stops that runtime, and with it the test's server, which may be in
        // the middle of a transaction (the gateway records a call's usage after the client has
        // the answer): DROP SCHEMA would wait for its locks for ever. So it waits a little,
        // then ends the sessions holding locks in the schema (the server is going away with the
        // test) and drops it.
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            runtime.block_on(async move {
                let Ok(mut admin) = sqlx::PgConnection::connect(&server).await else {
                    return;
                };
                let drop = format!("DROP SCHEMA IF EXISTS {schema} CASCADE");
                let _ = sqlx::query("SET lock_timeout = '2s'")
                    .execute(&mut admin)
                    .await;
                for _ in 0..3 {
                    let dropped = sqlx::query(sqlx::AssertSqlSafe(drop.clone()))
                        .execute(&mut admin)
                        .await;
                    if dropped.is_ok() {
                        break;
                    }
                    let _ = sqlx::query(
                        "SELECT pg_terminate_backend(l.pid) FROM pg_locks l
                         JOIN pg_class c ON c.oid = l.relation
                         JOIN pg_namespace n ON n.oid = c.relnamespace
                         WHERE n.nspname = $1 AND l.pid <> pg_backend_pid()",
                    )
                    .bind(&schema)
                    .execute(&mut admin)
                    .await;
                }
                let _ = admin.close().await;
            });
        });
        let _ = dropped.join();
    }
}

/// Starts a server on a fresh database of the suite's backend.
pub async fn spawn_app() -> TestApp {
    spawn_app_with(Options::default()).await
}

/// [`spawn_app`], serving with `options`; a restart serves with the defaults.
pub async fn spawn_app_with(options: Options) -> TestApp {
    let db = TestDb::new().await;
    let server = serve_store(db.open().await, options).await;
    let addr = server.addr;
    let client = connect(addr).await;
    TestApp {
        db,
        addr,
        client,
        server: Some(server),
    }
}

/// A server with `options` over a fresh database, returned with it.
pub async fn serve_fresh(options: Options) -> (TestDb, Server) {
    let db = TestDb::new().await;
    let server = serve_store(db.open().await, options).await;
    (db, server)
}

/// A server task on 127.0.0.1:0, from `serve_with`; dropping it stops the server.
pub struct Server {
    pub addr: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
    handle: JoinHandle<Result<(), tonic::transport::Error>>,
}

/// Serves `store` with `options` on a fresh port; the listener is bound when this returns, so
/// clients connect at once.
pub async fn serve_store(store: Store, options: Options) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("local addr");
    let (shutdown, signal) = oneshot::channel::<()>();
    let handle = tokio::spawn(ctxd::server::serve_with(
        listener,
        store,
        options,
        async move {
            let _ = signal.await;
        },
    ));
    Server {
        addr,
        shutdown: Some(shutdown),
        handle,
    }
}

impl Server {
    /// Sends the shutdown signal.
    pub fn shut_down(&mut self) {
        let shutdown = self.shutdown.take().expect("not shut down yet");
        shutdown.send(()).expect("the server is running");
    }

    /// Expects `serve_with` to return Ok within `within` (of the shutdown signal).
    pub async fn stopped(self, within: Duration) {
        tokio::time::timeout(within, self.handle)
            .await
            .unwrap_or_else(|_| panic!("serve() returns within {within:?} of the shutdown signal"))
            .expect("serve task panicked")
            .expect("serve() returns Ok after a clean shutdown");
    }

    /// [`Server::shut_down`], then [`Server::stopped`].
    pub async fn stop(mut self, within: Duration) {
        self.shut_down();
        self.stopped(within).await;
    }
}

/// A channel to `addr`; the listener is bound already, so this works at once.
pub async fn channel(addr: SocketAddr) -> Channel {
    Channel::from_shared(format!("http://{addr}"))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect")
}

pub async fn connect(addr: SocketAddr) -> Client {
    ContextStoreClient::new(channel(addr).await)
        .max_decoding_message_size(MAX_MESSAGE)
        .max_encoding_message_size(MAX_MESSAGE)
}

impl TestApp {
    /// Shuts the server down and waits until `serve` has returned.
    pub async fn stop(&mut self) {
        let server = self.server.take().expect("server is running");
        server.stop(Duration::from_secs(10)).await;
    }

    /// Starts a new server on the same database and reconnects the client.
    pub async fn start(&mut self) {
        assert!(self.server.is_none(), "server already running");
        let store = self.db.open().await;
        let server = serve_store(store, Options::default()).await;
        self.addr = server.addr;
        self.client = connect(server.addr).await;
        self.server = Some(server);
    }

    pub async fn restart(&mut self) {
        self.stop().await;
        self.start().await;
    }

    /// Rows in the content-addressed `blobs` table.
    pub async fn blob_count(&self) -> i64 {
        self.count("SELECT COUNT(*) FROM blobs").await
    }

    /// Rows in the `nodes` table.
    pub async fn node_count(&self) -> i64 {
        self.count("SELECT COUNT(*) FROM nodes").await
    }

    async fn count(&self, sql: &'static str) -> i64 {
        self.db.count(sql).await
    }

    // ------------------------------------------------------------ RPC shortcuts

    pub async fn create_session(&mut self) -> String {
        new_session(&mut self.client).await
    }

    /// Sessions listed (up to 1,000).
    pub async fn session_count(&mut self) -> usize {
        self.client
            .list_sessions(pb::ListSessionsRequest {
                page_size: 1000,
                ..Default::default()
            })
            .await
            .expect("ListSessions")
            .into_inner()
            .sessions
            .len()
    }

    pub async fn get_session(&mut self, session: &str) -> pb::Session {
        self.client
            .get_session(pb::GetSessionRequest {
                session_id: session.into(),
            })
            .await
            .expect("GetSession")
            .into_inner()
    }

    pub async fn try_append(
        &mut self,
        req: pb::AppendRequest,
    ) -> Result<pb::AppendResponse, Status> {
        self.client.append(req).await.map(|r| r.into_inner())
    }

    /// Appends to `main`.
    pub async fn append(&mut self, session: &str, nodes: Vec<pb::NodeInput>) -> pb::AppendResponse {
        self.try_append(append_req(session, nodes))
            .await
            .expect("Append to main")
    }

    pub async fn append_branch(
        &mut self,
        session: &str,
        branch: &str,
        nodes: Vec<pb::NodeInput>,
    ) -> pb::AppendResponse {
        let req = pb::AppendRequest {
            branch: branch.into(),
            ..append_req(session, nodes)
        };
        self.try_append(req).await.expect("Append to branch")
    }

    /// Appends to the internal chain of the running function `function_id`.
    pub async fn append_in_function(
        &mut self,
        session: &str,
        function_id: &str,
        nodes: Vec<pb::NodeInput>,
    ) -> pb::AppendResponse {
        self.try_append(function_req(session, function_id, nodes))
            .await
            .expect("Append into function")
    }

    pub async fn get_nodes(&mut self, session: &str, ids: &[String]) -> Vec<pb::Node> {
        self.client
            .get_nodes(pb::GetNodesRequest {
                session_id: session.into(),
                node_ids: ids.to_vec(),
            })
            .await
            .expect("GetNodes")
            .into_inner()
            .nodes
    }

    /// The whole log from a branch head (all pages), newest first.
    pub async fn log(&mut self, session: &str, branch: &str) -> Vec<pb::Node> {
        self.log_all(pb::LogRequest {
            session_id: session.into(),
            branch: branch.into(),
            ..Default::default()
        })
        .await
    }

    /// Follows `next_page_token` until the last page.
    pub async fn log_all(&mut self, mut req: pb::LogRequest) -> Vec<pb::Node> {
        let mut nodes = Vec::new();
        for _ in 0..10_000 {
            let page = self
                .client
                .log(req.clone())
                .await
                .expect("Log")
                .into_inner();
            nodes.extend(page.nodes);
            if page.next_page_token.is_empty() {
                return nodes;
            }
            req.page_token = page.next_page_token;
        }
        panic!("Log never returned an empty next_page_token");
    }

    pub async fn try_render(
        &mut self,
        req: pb::RenderRequest,
    ) -> Result<pb::RenderResponse, Status> {
        self.client.render(req).await.map(|r| r.into_inner())
    }

    pub async fn render(&mut self, req: pb::RenderRequest) -> pb::RenderResponse {
        self.try_render(req).await.expect("Render")
    }

    pub async fn render_branch(&mut self, session: &str, branch: &str) -> pb::RenderResponse {
        self.render(render_req(session, Target::Branch(branch.into())))
            .await
    }

    pub async fn create_branch(&mut self, session: &str, name: &str, from: &str) -> pb::Branch {
        self.client
            .create_branch(pb::CreateBranchRequest {
                session_id: session.into(),
                name: name.into(),
                from_node_id: from.into(),
            })
            .await
            .expect("CreateBranch")
            .into_inner()
    }

    pub async fn delete_branch(&mut self, session: &str, name: &str) {
        self.client
            .delete_branch(pb::DeleteBranchRequest {
                session_id: session.into(),
                name: name.into(),
            })
            .await
            .expect("DeleteBranch");
    }

    pub async fn branches(&mut self, session: &str) -> Vec<pb::Branch> {
        self.client
            .list_branches(pb::ListBranchesRequest {
                session_id: session.into(),
            })
            .await
            .expect("ListBranches")
            .into_inner()
            .branches
    }

    /// Commits `text` (model `test-model`) as the summary of compaction `id`.
    pub async fn commit_summary(&mut self, id: &str, text: &str) -> pb::CompactionOutcome {
        self.client
            .commit_summary(pb::CommitSummaryRequest {
                compaction_id: id.into(),
                text: text.into(),
                model: "test-model".into(),
            })
            .await
            .expect("CommitSummary")
            .into_inner()
    }

    /// The session's summaries and `branch`'s compaction events (`""`: main).
    pub async fn list_summaries(
        &mut self,
        session: &str,
        branch: &str,
    ) -> pb::ListSummariesResponse {
        self.client
            .list_summaries(pb::ListSummariesRequest {
                session_id: session.into(),
                branch: branch.into(),
            })
            .await
            .expect("ListSummaries")
            .into_inner()
    }

    pub async fn branch(&mut self, session: &str, name: &str) -> pb::Branch {
        self.branches(session)
            .await
            .into_iter()
            .find(|b| b.name == name)
            .unwrap_or_else(|| panic!("branch {name} is listed"))
    }
}

// ---------------------------------------------------------------- any client

/// Creates a session; its id.
pub async fn new_session(client: &mut Client) -> String {
    client
        .create_session(pb::CreateSessionRequest::default())
        .await
        .expect("CreateSession")
        .into_inner()
        .session_id
}

/// The head of `branch`, as GetSession lists it.
pub async fn head_of(client: &mut Client, session: &str, branch: &str) -> String {
    client
        .get_session(pb::GetSessionRequest {
            session_id: session.into(),
        })
        .await
        .expect("GetSession")
        .into_inner()
        .branches
        .into_iter()
        .find(|b| b.name == branch)
        .unwrap_or_else(|| panic!("branch {branch} is listed"))
        .head_id
}

/// The summaries and compaction events of `main`.
pub async fn summaries(client: &mut Client, session: &str) -> pb::ListSummariesResponse {
    client
        .list_summaries(pb::ListSummariesRequest {
            session_id: session.into(),
            branch: String::new(),
        })
        .await
        .expect("ListSummaries")
        .into_inner()
}

/// A budget of 2,000 tokens of history, which [`four_file_reads`] does not fit.
pub fn small_budget() -> pb::Budget {
    pb::Budget {
        context_window: 2500,
        output_reserve: 500,
        ..Default::default()
    }
}

/// A new session of four turns (a request, a `read_file` call, a 3,000-byte result, an
/// answer), which needs a summary under [`small_budget`]; its id.
pub async fn four_file_reads(client: &mut Client) -> String {
    let session = new_session(client).await;
    for t in 0..4 {
        let id = format!("c{t}");
        client
            .append(append_req(
                &session,
                vec![
                    user(&format!("request {t}")),
                    assistant_calls("", vec![call(&id, "read_file", "{}")]),
                    tool_result(&id, &big_text(3000, &format!("file {t}"))),
                    assistant(&format!("answer {t}")),
                ],
            ))
            .await
            .expect("Append");
    }
    session
}

/// Prepares a compaction of `session` under [`small_budget`]; it must be needed. Its id.
pub async fn prepare_needed(client: &mut Client, session: &str) -> String {
    let plan = client
        .prepare_compaction(pb::PrepareCompactionRequest {
            session_id: session.into(),
            budget: Some(small_budget()),
            ..Default::default()
        })
        .await
        .expect("PrepareCompaction")
        .into_inner();
    assert!(plan.needed);
    plan.compaction_id
}

// ---------------------------------------------------------------- requests

pub use pb::render_request::Target;

pub fn append_req(session: &str, nodes: Vec<pb::NodeInput>) -> pb::AppendRequest {
    pb::AppendRequest {
        session_id: session.into(),
        nodes,
        ..Default::default()
    }
}

pub fn function_req(
    session: &str,
    function_id: &str,
    nodes: Vec<pb::NodeInput>,
) -> pb::AppendRequest {
    pb::AppendRequest {
        function_id: function_id.into(),
        ..append_req(session, nodes)
    }
}

pub fn get_session_req(session: &str) -> pb::GetSessionRequest {
    pb::GetSessionRequest {
        session_id: session.into(),
    }
}

/// The log from the head of `main`, in pages of the default size.
pub fn log_req(session: &str) -> pb::LogRequest {
    pb::LogRequest {
        session_id: session.into(),
        ..Default::default()
    }
}

pub fn get_nodes_req(session: &str, node_ids: Vec<String>) -> pb::GetNodesRequest {
    pb::GetNodesRequest {
        session_id: session.into(),
        node_ids,
    }
}

/// A branch `name` pointing at the node `from` (empty: a branch with no head).
pub fn create_branch_req(session: &str, name: &str, from: &str) -> pb::CreateBranchRequest {
    pb::CreateBranchRequest {
        session_id: session.into(),
        name: name.into(),
        from_node_id: from.into(),
    }
}

pub fn list_branches_req(session: &str) -> pb::ListBranchesRequest {
    pb::ListBranchesRequest {
        session_id: session.into(),
    }
}

pub fn delete_branch_req(session: &str, name: &str) -> pb::DeleteBranchRequest {
    pb::DeleteBranchRequest {
        session_id: session.into(),
        name: name.into(),
    }
}

/// One chunk of a file to import, in `format` (a `pb::ImportFormat` or any other number).
pub fn import_chunk(format: i32, data: impl Into<Vec<u8>>) -> pb::ImportChunk {
    pb::ImportChunk {
        format,
        data: data.into(),
        ..Default::default()
    }
}

pub fn render_req(session: &str, target: Target) -> pb::RenderRequest {
    pb::RenderRequest {
        session_id: session.into(),
        target: Some(target),
        ..Default::default()
    }
}

// ---------------------------------------------------------------- content

pub fn text(s: impl Into<String>) -> pb::ContentPart {
    pb::ContentPart {
        part: Some(pb::content_part::Part::Text(s.into())),
    }
}

pub fn media_data(mime: &str, data: Vec<u8>) -> pb::ContentPart {
    pb::ContentPart {
        part: Some(pb::content_part::Part::Media(pb::Media {
            mime_type: mime.into(),
            source: Some(pb::media::Source::Data(data)),
        })),
    }
}

pub fn media_url(mime: &str, url: &str) -> pb::ContentPart {
    pb::ContentPart {
        part: Some(pb::content_part::Part::Media(pb::Media {
            mime_type: mime.into(),
            source: Some(pb::media::Source::Url(url.into())),
        })),
    }
}

pub fn call(call_id: &str, name: &str, arguments_json: &str) -> pb::ToolCall {
    pb::ToolCall {
        call_id: call_id.into(),
        name: name.into(),
        arguments_json: arguments_json.into(),
    }
}

pub fn node(kind: pb::node_input::Kind) -> pb::NodeInput {
    pb::NodeInput {
        kind: Some(kind),
        pinned: false,
    }
}

pub fn message(
    role: pb::Role,
    parts: Vec<pb::ContentPart>,
    tool_calls: Vec<pb::ToolCall>,
) -> pb::NodeInput {
    node(pb::node_input::Kind::Message(pb::Message {
        role: role as i32,
        parts,
        tool_calls,
    }))
}

pub fn system(s: &str) -> pb::NodeInput {
    message(pb::Role::System, vec![text(s)], vec![])
}

pub fn user(s: &str) -> pb::NodeInput {
    message(pb::Role::User, vec![text(s)], vec![])
}

pub fn assistant(s: &str) -> pb::NodeInput {
    message(pb::Role::Assistant, vec![text(s)], vec![])
}

/// An assistant message making `calls`; an empty `s` means no text part.
pub fn assistant_calls(s: &str, calls: Vec<pb::ToolCall>) -> pb::NodeInput {
    let parts = if s.is_empty() { vec![] } else { vec![text(s)] };
    message(pb::Role::Assistant, parts, calls)
}

/// A successful tool result; the server fills the tool name from the call.
pub fn tool_result(call_id: &str, s: &str) -> pb::NodeInput {
    node(pb::node_input::Kind::ToolResult(pb::ToolResult {
        call_id: call_id.into(),
        name: String::new(),
        parts: vec![text(s)],
        is_error: false,
    }))
}

pub fn tool_error(call_id: &str, s: &str) -> pb::NodeInput {
    node(pb::node_input::Kind::ToolResult(pb::ToolResult {
        call_id: call_id.into(),
        name: String::new(),
        parts: vec![text(s)],
        is_error: true,
    }))
}

/// Opens a function answering `call_id`; the server fills the name from the call.
pub fn function_call(call_id: &str, input: &str, expose: pb::Expose) -> pb::NodeInput {
    node(pb::node_input::Kind::FunctionCall(pb::FunctionCall {
        call_id: call_id.into(),
        name: String::new(),
        input: input.into(),
        expose: expose as i32,
    }))
}

pub fn function_result(call_id: &str, output: &str, status: pb::FunctionStatus) -> pb::NodeInput {
    node(pb::node_input::Kind::FunctionResult(pb::FunctionResult {
        call_id: call_id.into(),
        output: output.into(),
        status: status as i32,
        ..Default::default()
    }))
}

/// A text of exactly `len` bytes, mostly ASCII with some multi-byte characters,
/// different for each `seed`.
pub fn big_text(len: usize, seed: &str) -> String {
    let mut s = String::with_capacity(len + 64);
    let mut i = 0u64;
    while s.len() < len {
        s.push_str(&format!(
            "{seed} line {i:07} · λ ✓ the quick brown fox 日本\n"
        ));
        i += 1;
    }
    while s.len() > len {
        s.pop();
    }
    while s.len() < len {
        s.push('.');
    }
    s
}

// ---------------------------------------------------------------- assertions

/// Asserts the status code and that the message names `field` (case-insensitive).
#[track_caller]
pub fn assert_status<T: std::fmt::Debug>(result: Result<T, Status>, code: Code, field: &str) {
    match result {
        Ok(value) => panic!("expected {code:?} naming `{field}`, got Ok({value:?})"),
        Err(status) => {
            assert_eq!(
                status.code(),
                code,
                "expected {code:?} naming `{field}`, got {:?}: {}",
                status.code(),
                status.message()
            );
            assert!(
                status
                    .message()
                    .to_lowercase()
                    .contains(&field.to_lowercase()),
                "{code:?} message should name `{field}`: {:?}",
                status.message()
            );
        }
    }
}

/// Asserts only the status code.
#[track_caller]
pub fn assert_code<T: std::fmt::Debug>(result: Result<T, Status>, code: Code) {
    match result {
        Ok(value) => panic!("expected {code:?}, got Ok({value:?})"),
        Err(status) => assert_eq!(
            status.code(),
            code,
            "expected {code:?}, got {:?}: {}",
            status.code(),
            status.message()
        ),
    }
}

pub fn is_hex_hash(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A fresh, well-formed id that names nothing.
pub fn unknown_id() -> String {
    uuid::Uuid::now_v7().to_string()
}

/// The text parts of a rendered message, joined; media as `<mime>`.
pub fn text_of(parts: &[pb::ContentPart]) -> String {
    parts
        .iter()
        .map(|p| match &p.part {
            Some(pb::content_part::Part::Text(t)) => t.clone(),
            Some(pb::content_part::Part::Media(m)) => format!("<{}>", m.mime_type),
            None => "<empty part>".into(),
        })
        .collect::<Vec<_>>()
        .join("|")
}

/// One line per rendered message, e.g. `assistant: Let me look. -> c1`,
/// `tool[c1]: result`, with `[fn] ` in front of messages from a function's chain.
pub fn transcript(messages: &[pb::RenderedMessage]) -> Vec<String> {
    messages
        .iter()
        .map(|m| {
            let role = match pb::Role::try_from(m.role) {
                Ok(pb::Role::System) => "system".to_string(),
                Ok(pb::Role::Developer) => "developer".to_string(),
                Ok(pb::Role::User) => "user".to_string(),
                Ok(pb::Role::Assistant) => "assistant".to_string(),
                Ok(pb::Role::Tool) => format!("tool[{}]", m.tool_call_id),
                _ => format!("role#{}", m.role),
            };
            let mut line = format!("{role}: {}", text_of(&m.parts));
            if !m.tool_calls.is_empty() {
                let ids: Vec<&str> = m.tool_calls.iter().map(|c| c.call_id.as_str()).collect();
                line.push_str(&format!(" -> {}", ids.join(",")));
            }
            if !m.function_id.is_empty() {
                line.insert_str(0, "[fn] ");
            }
            line
        })
        .collect()
}

// ---------------------------------------------------------------- API keys

pub type KeyedClient =
    ContextStoreClient<tonic::service::interceptor::InterceptedService<Channel, Bearer>>;

/// Sends `authorization: Bearer <key>` with every call.
#[derive(Clone)]
pub struct Bearer(tonic::metadata::MetadataValue<tonic::metadata::Ascii>);

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, Status> {
        request
            .metadata_mut()
            .insert("authorization", self.0.clone());
        Ok(request)
    }
}

/// A client that presents `key`.
pub async fn keyed_client(addr: SocketAddr, key: &str) -> KeyedClient {
    let bearer = Bearer(format!("Bearer {key}").parse().expect("ASCII"));
    ContextStoreClient::with_interceptor(channel(addr).await, bearer)
}
