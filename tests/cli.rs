//! The client commands of the `ctxd` binary against a real server on 127.0.0.1:0 over a SQLite
//! file in a temp dir: the text output, `--json`, and one-line failures with a non-zero exit.

#[path = "common/chat_http.rs"]
mod chat_http;

use std::net::SocketAddr;
use std::process::{Command, Output};

use ctxd::api::pb;
use serde_json::Value;

type GrpcClient = pb::context_store_client::ContextStoreClient<tonic::transport::Channel>;

const TRACE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/testdata/traces/swe-marshmallow-1867-fc.jsonl"
);
/// Messages (and so nodes) in the trace.
const TRACE_MESSAGES: usize = 28;

/// A server on its own runtime; stops when dropped.
struct Server {
    addr: SocketAddr,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    runtime: Option<tokio::runtime::Runtime>,
    _dir: tempfile::TempDir,
}

impl Server {
    fn start() -> Self {
        Self::start_with(false)
    }

    /// With `summarizer`, `Compact` calls a fake chat-completions endpoint that always answers
    /// [`SUMMARY`].
    fn start_with(summarizer: bool) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let db = dir.path().join("ctxd.db");
        let (shutdown, signal) = tokio::sync::oneshot::channel::<()>();
        let addr = runtime.block_on(async {
            let store = ctxd::store::Store::open(&db).await.expect("open the store");
            let summarizer = if summarizer {
                Some(fake_summarizer().await)
            } else {
                None
            };
            // Bound before the binary runs, so it connects at once: no waiting for readiness.
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            let addr = listener.local_addr().expect("local addr");
            tokio::spawn(ctxd::server::serve_with_summarizer(
                listener,
                store,
                summarizer,
                async move {
                    let _ = signal.await;
                },
            ));
            addr
        });
        Server {
            addr,
            shutdown: Some(shutdown),
            runtime: Some(runtime),
            _dir: dir,
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Runs `ctxd ARGS --server URL`.
    fn run(&self, args: &[&str]) -> Output {
        let url = self.url();
        let mut all = args.to_vec();
        all.extend(["--server", &url]);
        ctxd(&all)
    }

    /// Runs a command that must succeed; its stdout.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "ctxd {args:?} failed: {stderr}\nstdout: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
        String::from_utf8(out.stdout).expect("stdout is UTF-8")
    }

    /// Runs a command with `--json`; its parsed stdout.
    fn json(&self, args: &[&str]) -> Value {
        let mut all = args.to_vec();
        all.push("--json");
        let out = self.ok(&all);
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?} --json: {e}: {out}"))
    }

    /// Imports the trace; the new session's id.
    fn import_trace(&self) -> String {
        let v = self.json(&["import", TRACE, "--meta", "task=marshmallow"]);
        v["session"]["session_id"]
            .as_str()
            .expect("session id")
            .to_string()
    }
}

impl Server {
    /// A client of the server, on the server's runtime.
    fn with_client<T>(&self, f: impl AsyncFnOnce(&mut GrpcClient) -> T) -> T {
        let runtime = self.runtime.as_ref().expect("running");
        runtime.block_on(async {
            let mut client = GrpcClient::connect(self.url()).await.expect("connect");
            f(&mut client).await
        })
    }

    /// Appends a second turn, so the trace's one turn is older history a summary may replace.
    fn add_turn(&self, session: &str) {
        let message = |role: pb::Role, text: &str| pb::NodeInput {
            kind: Some(pb::node_input::Kind::Message(pb::Message {
                role: role as i32,
                parts: vec![pb::ContentPart {
                    part: Some(pb::content_part::Part::Text(text.into())),
                }],
                tool_calls: vec![],
            })),
            pinned: false,
        };
        let request = pb::AppendRequest {
            session_id: session.into(),
            nodes: vec![
                message(pb::Role::User, "Thanks. Is the fix released?"),
                message(pb::Role::Assistant, "Not yet."),
            ],
            ..Default::default()
        };
        self.with_client(async |c| c.append(request).await.expect("Append"));
    }

    /// Summarizes through the API (PrepareCompaction and CommitSummary), as a host would; the
    /// summary's id.
    fn commit_summary(&self, session: &str, budget: u32) -> String {
        let prepare = pb::PrepareCompactionRequest {
            session_id: session.into(),
            budget: Some(pb::Budget {
                context_window: budget,
                ..Default::default()
            }),
            retain_turns: 1,
            ..Default::default()
        };
        self.with_client(async |c| {
            let prepared = c
                .prepare_compaction(prepare)
                .await
                .expect("PrepareCompaction")
                .into_inner();
            assert!(prepared.needed, "{}", prepared.reason);
            let outcome = c
                .commit_summary(pb::CommitSummaryRequest {
                    compaction_id: prepared.compaction_id,
                    text: "The user asked for a fix; the agent found and fixed it.".into(),
                    model: "test-model".into(),
                })
                .await
                .expect("CommitSummary")
                .into_inner();
            assert!(outcome.applied, "{}", outcome.message);
            outcome.summary_id
        })
    }
}

/// The node ids of [`Server::coding_session`], in path order.
struct Coding {
    session: String,
    /// "Please fix the bug in src/app.py."
    ask: String,
    /// Calls `Read {"file_path": "src/app.py"}`.
    read_call: String,
    /// The file's (long) contents.
    read_result: String,
    /// "Found it …": the end of the first turn.
    fixed: String,
    /// The second turn: a user message, a `Bash` call, its result, an answer.
    next_ask: String,
    last: String,
}

impl Server {
    /// A session of two turns: the first reads src/app.py (a long result) and fixes it, the
    /// second runs the tests.
    fn coding_session(&self) -> Coding {
        let text = |t: &str| {
            vec![pb::ContentPart {
                part: Some(pb::content_part::Part::Text(t.into())),
            }]
        };
        let message = |role: pb::Role, t: &str, calls: Vec<pb::ToolCall>| pb::NodeInput {
            kind: Some(pb::node_input::Kind::Message(pb::Message {
                role: role as i32,
                parts: text(t),
                tool_calls: calls,
            })),
            pinned: false,
        };
        let call = |id: &str, name: &str, args: &str| pb::ToolCall {
            call_id: id.into(),
            name: name.into(),
            arguments_json: args.into(),
        };
        let result = |id: &str, t: &str| pb::NodeInput {
            kind: Some(pb::node_input::Kind::ToolResult(pb::ToolResult {
                call_id: id.into(),
                parts: text(t),
                ..Default::default()
            })),
            pinned: false,
        };
        let contents =
            "def total(items):\n    return sum(items[1:])  # skips the first\n".repeat(80);
        let nodes = vec![
            message(pb::Role::User, "Please fix the bug in src/app.py.", vec![]),
            message(
                pb::Role::Assistant,
                "Reading it.",
                vec![call("call-read", "Read", r#"{"file_path": "src/app.py"}"#)],
            ),
            result("call-read", &contents),
            message(
                pb::Role::Assistant,
                "Found it: total() skipped the first item; fixed.",
                vec![],
            ),
            message(pb::Role::User, "Now run the tests.", vec![]),
            message(
                pb::Role::Assistant,
                "Running them.",
                vec![call("call-bash", "Bash", r#"{"command": "pytest -q"}"#)],
            ),
            result("call-bash", "3 passed in 0.02s"),
            message(pb::Role::Assistant, "All three tests pass.", vec![]),
        ];
        self.with_client(async |c| {
            let session = c
                .create_session(pb::CreateSessionRequest::default())
                .await
                .expect("CreateSession")
                .into_inner()
                .session_id;
            let ids = c
                .append(pb::AppendRequest {
                    session_id: session.clone(),
                    nodes,
                    ..Default::default()
                })
                .await
                .expect("Append")
                .into_inner()
                .node_ids;
            Coding {
                session,
                ask: ids[0].clone(),
                read_call: ids[1].clone(),
                read_result: ids[2].clone(),
                fixed: ids[3].clone(),
                next_ask: ids[4].clone(),
                last: ids[7].clone(),
            }
        })
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_timeout(std::time::Duration::from_secs(5));
        }
    }
}

const SUMMARY: &str =
    "The user reported a TimeDelta rounding bug; the agent fixed it with round().";

/// A summarizer over a one-purpose HTTP/1.1 endpoint on 127.0.0.1:0 that answers every request
/// with a chat completion of [`SUMMARY`].
async fn fake_summarizer() -> ctxd::summarizer::Summarizer {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}/v1", listener.local_addr().expect("local addr"));
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                if chat_http::read_request(&mut stream, &mut Vec::new())
                    .await
                    .is_some()
                {
                    let body = chat_http::completion(SUMMARY);
                    let _ = chat_http::respond(&mut stream, 200, &body, true).await;
                }
            });
        }
    });
    ctxd::summarizer::Summarizer::new(ctxd::summarizer::Config {
        url,
        model: "fake-model".into(),
        api_key: None,
        window_tokens: 128_000,
        max_output_tokens: 1_000,
        max_calls: 4,
        timeout: std::time::Duration::from_secs(30),
    })
    .expect("summarizer")
}

fn ctxd(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ctxd"))
        .args(args)
        .env_remove("CTXD_SERVER")
        .env("CTXD_LOG", "warn")
        .output()
        .expect("run the ctxd binary")
}

/// Asserts a failure: non-zero exit, nothing on stdout, exactly one line on stderr starting
/// `ctxd: ` and containing each of `needles`; returns that line.
#[track_caller]
fn assert_fails(out: &Output, needles: &[&str]) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "expected a failure, got: {stderr}");
    assert!(out.stdout.is_empty(), "stdout on failure: {:?}", out.stdout);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line on stderr: {stderr:?}");
    assert!(lines[0].starts_with("ctxd: "), "{stderr:?}");
    for needle in needles {
        assert!(
            stderr.contains(needle),
            "stderr should name {needle:?}: {stderr:?}"
        );
    }
    assert!(!stderr.contains("panicked") && !stderr.contains("backtrace"));
    lines[0].to_string()
}

fn node_ids(log: &Value) -> Vec<String> {
    log["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .map(|n| n["node_id"].as_str().expect("node_id").to_string())
        .collect()
}

#[test]
fn import_prints_the_session_and_counts() {
    let server = Server::start();
    let out = server.ok(&["import", TRACE, "--format", "neutral"]);
    let first = out.lines().next().expect("a line");
    let id = first.strip_prefix("session ").expect("`session ID` first");
    assert!(uuid::Uuid::parse_str(id).is_ok(), "{first}");
    assert!(
        out.contains(&format!(
            "imported {TRACE_MESSAGES} nodes, 0 functions, 0 summaries"
        )),
        "{out}"
    );
    assert!(server.ok(&["sessions"]).contains(id));
}

#[test]
fn import_takes_a_claude_code_session_with_its_sub_agent() {
    let server = Server::start();
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/claude-code");
    let main = format!("{dir}/258c7280-ae70-4798-800f-63464d01a85d.jsonl");
    let agent = format!("{dir}/258c7280-agent-a881341.jsonl");
    let v = server.json(&["import", &main, &agent, "--format", "claude-code"]);
    assert_eq!(v["functions"], 1, "{v}");
    assert_eq!(v["summaries"], 1, "{v}");
}

#[test]
fn export_then_import_through_the_binary() {
    let server = Server::start();
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/claude-code");
    let main = format!("{dir}/258c7280-ae70-4798-800f-63464d01a85d.jsonl");
    let agent = format!("{dir}/258c7280-agent-a881341.jsonl");
    let v = server.json(&["import", &main, &agent]);
    let id = v["session"]["session_id"]
        .as_str()
        .expect("session id")
        .to_owned();
    let tmp = tempfile::tempdir().expect("temp dir");
    let file = tmp.path().join("session.ctxd.jsonl");
    let file = file.to_str().expect("UTF-8 path");
    let out = server.ok(&["export", &id, "--out", file]);
    assert!(out.starts_with("exported "), "{out}");
    // An existing file is not overwritten.
    assert_fails(&server.run(&["export", &id, "--out", file]), &["creating"]);
    let copy = server.json(&["import", file]);
    assert_eq!(copy["format"], "IMPORT_FORMAT_CTXD_JSONL", "{copy}");
    assert_eq!(copy["functions"], 1, "{copy}");
    assert_eq!(copy["summaries"], 1, "{copy}");
    // One branch to stdout, what it leaves out on stderr.
    let out = server.run(&["export", &id, "--format", "openai"]);
    assert!(out.status.success());
    let doc: Value = serde_json::from_slice(&out.stdout).expect("a JSON array");
    assert!(doc.as_array().is_some_and(|a| !a.is_empty()));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("ctxd: warning:") && stderr.contains("summar"),
        "{stderr}"
    );
    assert_fails(
        &server.run(&["export", &id, "--branch", "nope", "--format", "claude-code"]),
        &["NOT_FOUND", "branch"],
    );
}

#[test]
fn sessions_log_and_branch() {
    let server = Server::start();
    let a = server.import_trace();
    let b = server.import_trace();

    let listed = server.ok(&["sessions"]);
    let lines: Vec<&str> = listed.lines().collect();
    assert_eq!(lines.len(), 2, "{listed}");
    assert!(lines[0].starts_with(&b), "newest first: {listed}");
    assert!(lines[1].starts_with(&a) && lines[1].contains("task=marshmallow"));
    assert!(lines[1].contains("branches: main"), "{listed}");
    let one = server.ok(&["sessions", "--limit", "1"]);
    assert!(one.starts_with(&b) && one.contains("more"), "{one}");
    let json = server.json(&["sessions", "--limit", "1"]);
    assert_eq!(json["sessions"].as_array().map(Vec::len), Some(1));

    let log = server.ok(&["log", &a]);
    let lines: Vec<&str> = log.lines().collect();
    assert_eq!(lines.len(), TRACE_MESSAGES, "{log}");
    assert!(
        lines[0].contains("result submit"),
        "newest first: {}",
        lines[0]
    );
    assert!(lines[TRACE_MESSAGES - 1].contains("system"), "{log}");
    assert!(
        log.contains("assistant") && log.contains("→ submit({})"),
        "{log}"
    );

    let short = server.ok(&["log", &a, "--limit", "5"]);
    assert_eq!(short.lines().count(), 6, "{short}");
    assert!(short.lines().last().unwrap().contains("older"), "{short}");

    let all = server.json(&["log", &a]);
    let ids = node_ids(&all);
    assert_eq!(ids.len(), TRACE_MESSAGES);
    assert_eq!(all["nodes"][0]["kind"], "NODE_KIND_TOOL_RESULT");
    let fork = &ids[10];
    let out = server.ok(&["branch", &a, "alt", "--from", fork]);
    assert!(out.starts_with(&format!("branch alt at {fork}")), "{out}");
    let alt = server.json(&["log", &a, "--branch", "alt"]);
    assert_eq!(node_ids(&alt), ids[10..].to_vec());
    let from_node = server.json(&["log", &a, "--node", &ids[20]]);
    assert_eq!(node_ids(&from_node), ids[20..].to_vec());

    let branch = server.json(&["branch", &a, "alt2", "--from", fork]);
    assert_eq!(branch["name"], "alt2");
    assert_eq!(branch["head_id"], fork.as_str());
    assert!(
        server
            .ok(&["sessions"])
            .contains("branches: alt, alt2, main")
    );

    let dup = server.run(&["branch", &a, "alt", "--from", fork]);
    assert_fails(&dup, &["CreateBranch failed: ALREADY_EXISTS"]);
}

#[test]
fn render_in_each_format() {
    let server = Server::start();
    let s = server.import_trace();

    let neutral = server.ok(&["render", &s]);
    let lines: Vec<&str> = neutral.lines().collect();
    assert_eq!(lines.len(), TRACE_MESSAGES + 1, "{neutral}");
    assert!(
        lines[0].contains("system") && lines[0].contains("tok"),
        "{}",
        lines[0]
    );
    assert!(lines[1].contains("user"), "{}", lines[1]);
    assert!(
        lines[TRACE_MESSAGES].starts_with(&format!("{TRACE_MESSAGES} messages, ")),
        "{neutral}"
    );

    let budgeted = server.ok(&["render", &s, "--budget", "8000"]);
    assert!(
        budgeted.contains("truncated"),
        "tool results cut: {budgeted}"
    );
    assert!(
        budgeted.contains("history budget 8,000: fits"),
        "{budgeted}"
    );
    let reserved = server.json(&["render", &s, "--budget", "8000", "--output-reserve", "3000"]);
    assert_eq!(reserved["report"]["history_budget"], 5000);
    assert_eq!(reserved["report"]["budget"]["output_reserve"], 3000);
    let reactive = server.json(&["render", &s, "--budget", "100000", "--reactive"]);
    assert_eq!(reactive["report"]["microcompact_trigger"], "reactive");

    let openai: Value = serde_json::from_str(&server.ok(&["render", &s, "--format", "openai"]))
        .expect("openai output is JSON");
    let messages = openai.as_array().expect("an array of messages");
    assert_eq!(messages.len(), TRACE_MESSAGES);
    assert_eq!(messages[0]["role"], "system");
    assert!(messages.iter().any(|m| m["role"] == "tool"));

    let anthropic: Value =
        serde_json::from_str(&server.ok(&["render", &s, "--format", "anthropic"]))
            .expect("anthropic output is JSON");
    assert!(anthropic["messages"].is_array(), "{anthropic}");
    assert!(anthropic["system"].is_string() || anthropic["system"].is_array());

    let json = server.json(&[
        "render",
        &s,
        "--format",
        "openai",
        "--tokenizer",
        "o200k_base",
    ]);
    assert_eq!(json["tokenizer"], "o200k_base");
    assert_eq!(
        json["messages"].as_array().map(Vec::len),
        Some(TRACE_MESSAGES)
    );
    assert_eq!(json["messages"][0]["role"], "ROLE_SYSTEM");
    let embedded: Value =
        serde_json::from_str(json["messages_json"].as_str().expect("messages_json")).unwrap();
    assert!(embedded.is_array());
}

#[test]
fn context_pictures_the_budget() {
    let server = Server::start();
    let s = server.import_trace();

    let fits = server.ok(&["context", &s, "--budget", "8000"]);
    for label in [
        "system",
        "user",
        "assistant text",
        "tool calls",
        "tool results",
        "summaries",
        "markers",
        "total",
        "budget",
        "free",
        "budget reduction",
        "microcompact",
        "input stubs",
        "saved",
        "snip",
        "stable prefix",
    ] {
        assert!(fits.contains(label), "no {label:?} in\n{fits}");
    }
    assert!(
        fits.contains('█') && fits.contains('┤'),
        "bars and the budget line:\n{fits}"
    );
    assert!(
        fits.contains("8,000") && fits.lines().any(|l| l == "fits"),
        "{fits}"
    );
    for line in fits.lines() {
        assert!(
            line.chars().count() <= 80,
            "wider than 80 columns: {line:?}"
        );
    }

    let over = server.ok(&["context", &s, "--budget", "2500"]);
    assert!(
        over.contains("OVER by ") && over.contains("summary needed"),
        "{over}"
    );
    assert!(over.contains('▓'), "the overflow is shaded:\n{over}");

    let unbudgeted = server.ok(&["context", &s]);
    assert!(unbudgeted.contains("no budget") && unbudgeted.contains("total"));
    assert!(!unbudgeted.contains('┤'), "{unbudgeted}");

    let json = server.json(&["context", &s, "--budget", "8000"]);
    assert_eq!(json["fits"], true);
    assert_eq!(json["history_budget"], 8000);
    assert_eq!(json["messages"], TRACE_MESSAGES);
    let t = &json["tokens"];
    let sum: u64 = [
        "system",
        "user",
        "assistant_text",
        "tool_calls",
        "tool_results",
        "summaries",
        "markers",
    ]
    .iter()
    .map(|k| t[k].as_u64().expect("a count"))
    .sum();
    assert_eq!(Some(sum), json["total_tokens"].as_u64());
}

/// A long session: the panel says what each step saved, in the same 80 columns, and `--json`
/// carries the same figures.
#[test]
fn context_says_what_each_step_saved() {
    let server = Server::start();
    let trace = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/testdata/traces/cc-main-8463c716.jsonl"
    );
    let v = server.json(&["import", trace]);
    let s = v["session"]["session_id"].as_str().expect("session id");

    let json = server.json(&["context", s, "--budget", "48000"]);
    let saved = |step: &str, what: &str| json[step][what].as_u64().expect("a count");
    assert!(saved("saved_clearing", "tokens") > 0, "{json}");
    assert!(saved("saved_stubbing", "tokens") > 0, "{json}");
    assert_eq!(
        json["saved_clearing"]["items"], json["results_cleared"],
        "{json}"
    );
    assert_eq!(
        json["saved_stubbing"]["items"], json["inputs_stubbed"],
        "{json}"
    );

    let panel = server.ok(&["context", s, "--budget", "48000"]);
    assert!(
        panel
            .lines()
            .any(|l| l.trim_start().starts_with("clearing ") && !l.contains("clearing 0 tokens")),
        "no clearing savings in\n{panel}"
    );
    // Why the last step was taken: the session's 143 calls earned back its rewrite.
    assert_eq!(json["microcompact_trigger"], "count", "{json}");
    let payback = json["payback_calls"].as_u64().expect("a payback");
    assert!(payback >= 1, "{json}");
    assert!(
        panel.contains(&format!(
            "its saving pays back the rewrite in {payback} calls"
        )),
        "{panel}"
    );
    assert!(
        panel.contains(&format!(
            "{} tool-call arguments stubbed",
            json["inputs_stubbed"]
        )),
        "{panel}"
    );
    for line in panel.lines() {
        assert!(
            line.chars().count() <= 80,
            "wider than 80 columns: {line:?}"
        );
    }
}

#[test]
fn summaries_and_compact_without_a_summarizer() {
    let server = Server::start();
    let s = server.import_trace();

    let text = server.ok(&["summaries", &s]);
    assert!(
        text.contains("summaries (0)") && text.contains("events (0)"),
        "{text}"
    );
    let json = server.json(&["summaries", &s, "--branch", "main"]);
    assert_eq!(json["summaries"], Value::Array(vec![]));
    assert_eq!(json["events"], Value::Array(vec![]));

    let out = server.run(&["compact", &s, "--budget", "3000"]);
    assert_fails(&out, &["Compact failed: FAILED_PRECONDITION", "summarizer"]);
}

#[test]
fn sessions_rm_deletes_and_gc_reports() {
    let server = Server::start();
    let a = server.import_trace();
    let b = server.import_trace();

    let out = server.ok(&["sessions", "rm", &a]);
    assert!(out.starts_with(&format!("session {a} deleted: ")), "{out}");
    assert!(out.contains(&format!("{TRACE_MESSAGES} nodes")), "{out}");
    let listed = server.ok(&["sessions"]);
    assert!(listed.starts_with(&b) && !listed.contains(&a), "{listed}");
    let again = server.json(&["sessions", "rm", &a]);
    assert_eq!(again[0]["already_deleted"], true, "{again}");
    assert_eq!(again[0]["tombstone"]["session_id"], a.as_str(), "{again}");
    assert_fails(
        &server.run(&["sessions", "rm", &uuid::Uuid::now_v7().to_string()]),
        &["DeleteSession failed: NOT_FOUND", "session"],
    );

    let gc = server.json(&["gc"]);
    assert_eq!(
        (gc["sessions"].as_u64(), gc["tombstones"].as_u64()),
        (Some(1), Some(1))
    );
    assert!(gc["database_bytes"].as_u64().is_some_and(|n| n > 0), "{gc}");
}

#[test]
fn a_bad_session_id_fails_naming_session_id() {
    let server = Server::start();
    for args in [
        vec!["log", "not-a-session"],
        vec!["render", "not-a-session"],
        vec!["context", "not-a-session", "--json"],
        vec!["summaries", "not-a-session"],
    ] {
        assert_fails(&server.run(&args), &["INVALID_ARGUMENT", "session_id"]);
    }
    let unknown = uuid::Uuid::now_v7().to_string();
    assert_fails(&server.run(&["log", &unknown]), &["Log failed: NOT_FOUND"]);
}

#[test]
fn import_failures_are_one_line() {
    let server = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.jsonl");
    let missing = missing.to_str().unwrap();
    assert_fails(
        &server.run(&["import", missing]),
        &["reading", "missing.jsonl"],
    );

    let bad = dir.path().join("bad.jsonl");
    std::fs::write(
        &bad,
        "{\"role\": \"user\", \"content\": \"hi\"}\nnot json\n",
    )
    .unwrap();
    let line = assert_fails(
        &server.run(&["import", bad.to_str().unwrap(), "--format", "neutral"]),
        &["ImportSession failed: INVALID_ARGUMENT"],
    );
    assert!(line.contains("line 2"), "names the line: {line}");
    assert!(
        server.ok(&["sessions"]).contains("no sessions"),
        "nothing imported"
    );

    let meta = server.run(&["import", TRACE, "--meta", "novalue"]);
    assert!(!meta.status.success());
}

#[test]
fn an_unreachable_server_fails_in_one_line() {
    // A port that was free a moment ago and has no listener now.
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap();
    let url = format!("http://{addr}");
    for args in [
        vec!["sessions"],
        vec!["import", TRACE],
        vec!["context", "x", "--json"],
    ] {
        let mut all = args.clone();
        all.extend(["--server", &url]);
        assert_fails(&ctxd(&all), &["cannot connect", &url]);
    }
}

#[test]
fn the_server_comes_from_ctxd_server() {
    let server = Server::start();
    let out = Command::new(env!("CARGO_BIN_EXE_ctxd"))
        .args(["sessions", "--json"])
        .env("CTXD_SERVER", server.url())
        .output()
        .expect("run ctxd");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["sessions"].is_array());
}

#[test]
fn summaries_and_context_show_a_committed_summary() {
    let server = Server::start();
    let s = server.import_trace();
    let ids = node_ids(&server.json(&["log", &s]));
    server.add_turn(&s);
    let summary = server.commit_summary(&s, 3000);

    let text = server.ok(&["summaries", &s]);
    assert!(text.starts_with("summaries (1)"), "{text}");
    let active = text.lines().nth(1).expect("the summary line");
    assert!(
        active.starts_with("* active") && active.contains(&summary),
        "{text}"
    );
    assert!(active.contains("test-model"), "{text}");
    assert!(text.contains("covers 27 nodes"), "{text}");
    assert!(text.contains("The user asked for a fix"), "{text}");
    assert!(
        text.contains("prepared") && text.contains("committed"),
        "{text}"
    );
    assert!(text.contains("APPLIED"), "{text}");

    let json = server.json(&["summaries", &s]);
    assert_eq!(json["summaries"][0]["summary_id"], summary.as_str());
    assert_eq!(json["summaries"][0]["active"], true);
    assert_eq!(json["events"][1]["reason"], "COMPACTION_REASON_APPLIED");

    let picture = server.ok(&["context", &s]);
    assert!(picture.contains("applied ("), "{picture}");
    // A branch forked before the covered range never sees the summary.
    server.ok(&["branch", &s, "early", "--from", &ids[ids.len() - 2]]);
    let early = server.ok(&["summaries", &s, "--branch", "early"]);
    assert!(
        early
            .lines()
            .nth(1)
            .unwrap()
            .trim_start()
            .starts_with("elsewhere"),
        "{early}"
    );
}

#[test]
fn compact_with_the_servers_summarizer() {
    let server = Server::start_with(true);
    let s = server.import_trace();
    server.add_turn(&s);

    let out = server.ok(&[
        "compact",
        &s,
        "--budget",
        "3000",
        "--instructions",
        "be brief",
    ]);
    let mut lines = out.lines();
    let first = lines.next().expect("a line");
    assert!(first.starts_with("applied: summary "), "{out}");
    assert!(out.contains("tokens ") && out.contains(" → "), "{out}");
    let summaries = server.json(&["summaries", &s]);
    assert_eq!(summaries["summaries"][0]["text"], SUMMARY);
    assert_eq!(summaries["summaries"][0]["model"], "fake-model");
    assert!(server.ok(&["summaries", &s]).contains("fake-model"));

    // It fits now: nothing to do, said as an outcome, not a failure.
    let again = server.json(&["compact", &s, "--budget", "3000"]);
    assert_eq!(again["applied"], false);
    assert_eq!(again["reason"], "COMPACTION_REASON_NOT_NEEDED");
    let text = server.ok(&["compact", &s, "--budget", "3000"]);
    assert!(text.starts_with("not applied: NOT_NEEDED"), "{text}");
}

/// `compact --from --to --text`: a segment summary with the caller's text and no summarizer;
/// `summaries` shows its kind, range and ledger, and `--json` every new field.
#[test]
fn a_segment_summary_with_text_and_how_summaries_list_it() {
    let server = Server::start();
    let c = server.coding_session();
    let s = c.session.as_str();
    // `log --json` names the same nodes, in reverse.
    let logged = node_ids(&server.json(&["log", s]));
    assert_eq!(logged.first(), Some(&c.last));
    assert_eq!(logged.last(), Some(&c.ask));

    let text = "Fixed total() in src/app.py, which skipped the first item.";
    let out = server.ok(&[
        "compact", s, "--from", &c.ask, "--to", &c.fixed, "--text", text, "--budget", "100000",
    ]);
    let first = out.lines().next().expect("a line");
    let summary = first
        .strip_prefix("applied: summary ")
        .unwrap_or_else(|| panic!("{out}"))
        .to_string();
    assert!(out.contains("tokens ") && out.contains(" → "), "{out}");
    assert!(
        out.contains("segment summary: a segment of 4 nodes"),
        "{out}"
    );
    assert!(out.lines().any(|l| l.starts_with("ledger:")), "{out}");

    let listed = server.ok(&["summaries", s]);
    assert!(listed.starts_with("summaries (1)"), "{listed}");
    let lines: Vec<&str> = listed.lines().collect();
    assert!(
        lines[1].starts_with("* active") && lines[1].contains(&summary),
        "{listed}"
    );
    assert!(lines[1].contains("ctxd-cli"), "{listed}");
    assert!(
        lines[2].trim_start().starts_with("segment, covers 4 nodes"),
        "{listed}"
    );
    assert_eq!(lines[3].trim_start(), format!("from {}", c.ask), "{listed}");
    assert_eq!(
        lines[4].trim_start(),
        format!("to   {}", c.fixed),
        "{listed}"
    );
    assert!(lines[5].trim_start().starts_with("ledger: "), "{listed}");
    assert!(listed.contains("Fixed total()"), "{listed}");
    // The summary's lines (the events' are as wide as their messages).
    for line in lines.iter().take_while(|l| !l.starts_with("events (")) {
        assert!(
            line.chars().count() <= 80,
            "wider than 80 columns: {line:?}"
        );
    }

    let json = server.json(&["summaries", s]);
    let record = &json["summaries"][0];
    assert_eq!(record["summary_id"], summary.as_str());
    assert_eq!(record["kind"], "SUMMARY_KIND_SEGMENT");
    assert_eq!(record["from_node_id"], c.ask.as_str());
    assert_eq!(record["to_node_id"], c.fixed.as_str());
    assert_eq!(record["rolls_over_ids"], Value::Array(vec![]));
    assert_eq!(record["model"], "ctxd-cli");
    assert_eq!(
        record["covers_ids"],
        serde_json::json!([c.ask, c.read_call, c.read_result, c.fixed])
    );
    for key in [
        "files_read",
        "files_modified",
        "commands",
        "errors",
        "user_requests",
        "functions",
    ] {
        assert!(record["ledger"][key].is_array(), "ledger.{key}: {record}");
    }

    // The render lays the summary over the segment and says so.
    let context = server.json(&["context", s]);
    assert_eq!(context["summary_ids"], serde_json::json!([summary]));
    assert_eq!(context["pinned_tokens"], 0);
    assert_eq!(context["pinned_node_ids"], Value::Array(vec![]));
    assert_eq!(context["pins_exceed_budget"], false);
    let render = server.json(&["render", s]);
    let messages = render["messages"].as_array().expect("messages");
    let first = &messages[0];
    assert!(
        first["parts"][0]["text"].as_str().is_some_and(|t| t
            .starts_with("[Summary of the earlier conversation")
            && t.contains(text)),
        "{render}"
    );
    assert_eq!(first["pinned"], false);
    // The covered nodes render only through the summary; the second turn as it was.
    let shown: Vec<&str> = messages
        .iter()
        .flat_map(|m| m["node_ids"].as_array().expect("node_ids"))
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(shown.len(), 4, "{render}");
    assert_eq!(shown[0], c.next_ask, "{render}");
    assert_eq!(shown[3], c.last, "{render}");

    // `--json` prints the outcome's fields and the prepare response, ledger included.
    let again = server.json(&[
        "compact",
        s,
        "--from",
        &c.next_ask,
        "--to",
        &c.last,
        "--text",
        "Tests pass.",
        "--budget",
        "100000",
    ]);
    assert!(again["applied"].is_boolean(), "{again}");
    assert!(again["reason"].is_string(), "{again}");
    let prepare = &again["prepare"];
    assert_eq!(prepare["needed"], true, "{again}");
    assert_eq!(prepare["kind"], "SUMMARY_KIND_SEGMENT");
    assert_eq!(prepare["compaction_id"], again["compaction_id"]);
    assert!(prepare["ledger"]["commands"].is_array(), "{again}");
    assert!(prepare["ledger_text"].is_string(), "{again}");
    assert_eq!(prepare["rolls_over_ids"], Value::Array(vec![]));
}

/// Depends on the server's ledger derivation: a segment's ledger names the file its Read call
/// read and the user's request, in `compact --text` (the ledger text) and in `summaries`.
#[test]
fn a_segment_summary_carries_a_ledger_of_what_it_covers() {
    let server = Server::start();
    let c = server.coding_session();
    let s = c.session.as_str();
    let out = server.ok(&[
        "compact",
        s,
        "--from",
        &c.ask,
        "--to",
        &c.fixed,
        "--text",
        "Fixed it.",
        "--budget",
        "100000",
    ]);
    assert!(out.starts_with("applied: summary "), "{out}");
    assert!(
        out.contains("src/app.py"),
        "the ledger text names the file:\n{out}"
    );

    let json = server.json(&["summaries", s]);
    let ledger = &json["summaries"][0]["ledger"];
    assert_eq!(ledger["files_read"][0]["path"], "src/app.py", "{ledger}");
    assert_eq!(
        ledger["files_read"][0]["tools"],
        serde_json::json!(["Read"])
    );
    assert_eq!(ledger["files_read"][0]["count"], 1);
    assert_eq!(
        ledger["user_requests"],
        serde_json::json!(["Please fix the bug in src/app.py."])
    );
    let listed = server.ok(&["summaries", s]);
    assert!(listed.contains("1 file read"), "{listed}");
    assert!(listed.contains("1 user request"), "{listed}");
    assert!(listed.contains("files: src/app.py"), "{listed}");
}

/// `pin` and `unpin` print the session's pins; `log` marks them, `render` flags them, and
/// `context` gives their tokens a line, saying plainly when they alone are over the budget.
#[test]
fn pins_round_trip_and_show_in_log_render_and_context() {
    let server = Server::start();
    let c = server.coding_session();
    let s = c.session.as_str();

    let out = server.ok(&["pin", s, &c.fixed]);
    assert_eq!(out, format!("pinned (1)\n  {}\n", c.fixed));
    let json = server.json(&["pin", s, &c.read_result, &c.fixed]);
    assert_eq!(
        json["pinned_ids"],
        serde_json::json!([c.fixed, c.read_result]),
        "oldest pin first, each once"
    );

    let log = server.ok(&["log", s]);
    let marked: Vec<&str> = log.lines().filter(|l| l.contains("[pinned]")).collect();
    assert_eq!(marked.len(), 2, "{log}");
    assert!(marked.iter().any(|l| l.starts_with(&c.fixed)), "{log}");
    let logged = server.json(&["log", s]);
    for node in logged["nodes"].as_array().expect("nodes") {
        let pinned = [&c.fixed, &c.read_result]
            .iter()
            .any(|id| node["node_id"] == id.as_str());
        assert_eq!(node["pinned"], pinned, "{node}");
        assert_eq!(node["content"]["pinned"], pinned, "{node}");
    }
    let render = server.ok(&["render", s]);
    assert_eq!(
        render.lines().filter(|l| l.contains("pinned")).count(),
        2,
        "{render}"
    );

    let stats = server.json(&["context", s, "--budget", "100000"]);
    let pinned_tokens = stats["pinned_tokens"].as_u64().expect("pinned_tokens");
    assert!(pinned_tokens > 0, "{stats}");
    assert_eq!(stats["pins_exceed_budget"], false);
    let mut ids: Vec<&str> = stats["pinned_node_ids"]
        .as_array()
        .expect("pinned_node_ids")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    ids.sort_unstable();
    let mut want = vec![c.fixed.as_str(), c.read_result.as_str()];
    want.sort_unstable();
    assert_eq!(ids, want);
    let panel = server.ok(&["context", s, "--budget", "100000"]);
    let line = panel
        .lines()
        .find(|l| l.starts_with("pinned: "))
        .unwrap_or_else(|| panic!("no pinned line in\n{panel}"));
    let shown: u64 = line["pinned: ".len()..]
        .split_whitespace()
        .next()
        .unwrap()
        .replace(',', "")
        .parse()
        .unwrap();
    assert_eq!(shown, pinned_tokens, "{line}");
    assert!(
        line.contains("in 2 nodes") && line.contains("never reduced"),
        "{line}"
    );
    assert!(!panel.contains("exceed"), "{panel}");

    // The file's contents alone are over a small budget: the panel says so.
    let small = (pinned_tokens / 2).to_string();
    let over = server.json(&["context", s, "--budget", &small]);
    assert_eq!(over["pins_exceed_budget"], true, "{over}");
    let panel = server.ok(&["context", s, "--budget", &small]);
    assert!(
        panel.contains("the pins alone exceed the history budget"),
        "{panel}"
    );
    for line in panel.lines() {
        assert!(
            line.chars().count() <= 80,
            "wider than 80 columns: {line:?}"
        );
    }

    let out = server.ok(&["unpin", s, &c.read_result]);
    assert_eq!(out, format!("pinned (1)\n  {}\n", c.fixed));
    let out = server.ok(&["unpin", s, &c.fixed]);
    assert_eq!(out, "no pinned nodes\n");
    assert!(!server.ok(&["log", s]).contains("[pinned]"));
    let panel = server.ok(&["context", s, "--budget", "100000"]);
    assert!(!panel.contains("pinned"), "{panel}");
    assert_eq!(
        server.json(&["unpin", s, &c.fixed])["pinned_ids"],
        Value::Array(vec![])
    );

    assert_fails(
        &server.run(&["pin", s, "not-a-node"]),
        &["Pin failed: INVALID_ARGUMENT", "node_ids[0]"],
    );
}

/// A pinned node inside a segment shows verbatim right after the summary that covers it.
#[test]
fn a_pinned_node_survives_a_segment_summary() {
    let server = Server::start();
    let c = server.coding_session();
    let s = c.session.as_str();
    server.ok(&["pin", s, &c.fixed]);
    let out = server.ok(&[
        "compact",
        s,
        "--from",
        &c.ask,
        "--to",
        &c.fixed,
        "--text",
        "Fixed it.",
        "--budget",
        "100000",
    ]);
    assert!(out.starts_with("applied: summary "), "{out}");
    let render = server.json(&["render", s]);
    let messages = render["messages"].as_array().expect("messages");
    let summary_at = messages
        .iter()
        .position(|m| {
            m["parts"][0]["text"]
                .as_str()
                .is_some_and(|t| t.starts_with("[Summary of the earlier conversation"))
        })
        .unwrap_or_else(|| panic!("no summary message in {render}"));
    // The pin comes just before the summary covering it.
    let pinned = &messages[summary_at - 1];
    assert_eq!(pinned["pinned"], true, "{render}");
    assert_eq!(pinned["node_ids"], serde_json::json!([c.fixed]));
    assert_eq!(
        pinned["parts"][0]["text"],
        "Found it: total() skipped the first item; fixed."
    );
    assert_eq!(
        render["report"]["pinned_node_ids"],
        serde_json::json!([c.fixed])
    );
}

#[test]
fn compact_from_and_to_need_each_other() {
    let server = Server::start();
    let c = server.coding_session();
    for (given, missing) in [("--from", "--to"), ("--to", "--from")] {
        let out = server.run(&["compact", &c.session, given, &c.ask, "--text", "x"]);
        assert!(!out.status.success());
        assert!(out.stdout.is_empty());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("required arguments were not provided") && stderr.contains(missing),
            "{given} alone should ask for {missing}: {stderr}"
        );
    }
}

/// A segment that parts a tool call from its result is refused, naming the field, and nothing
/// is stored.
#[test]
fn a_segment_that_splits_a_tool_call_fails_naming_the_field() {
    let server = Server::start();
    let c = server.coding_session();
    let s = c.session.as_str();
    let line = assert_fails(
        &server.run(&[
            "compact",
            s,
            "--from",
            &c.ask,
            "--to",
            &c.read_call,
            "--text",
            "x",
            "--budget",
            "100000",
        ]),
        &["PrepareCompaction failed: INVALID_ARGUMENT", "to_node_id"],
    );
    assert!(line.contains(&c.read_call), "names the node: {line}");
    assert_fails(
        &server.run(&[
            "compact",
            s,
            "--from",
            &c.read_result,
            "--to",
            &c.fixed,
            "--text",
            "x",
            "--budget",
            "100000",
        ]),
        &["PrepareCompaction failed: INVALID_ARGUMENT", "from_node_id"],
    );
    assert_fails(
        &server.run(&[
            "compact", s, "--from", &c.fixed, "--to", &c.ask, "--text", "x", "--budget", "100000",
        ]),
        &["PrepareCompaction failed: INVALID_ARGUMENT", "to_node_id"],
    );
    let json = server.json(&["summaries", s]);
    assert_eq!(json["summaries"], Value::Array(vec![]));
    assert_eq!(json["events"], Value::Array(vec![]));
}

/// `compact --from --to` with the server's summarizer: the Compact RPC makes the segment.
#[test]
fn compact_a_segment_with_the_servers_summarizer() {
    let server = Server::start_with(true);
    let c = server.coding_session();
    let s = c.session.as_str();
    assert_fails(
        &server.run(&[
            "compact",
            s,
            "--from",
            &c.ask,
            "--to",
            &c.read_call,
            "--budget",
            "100000",
        ]),
        &["Compact failed: INVALID_ARGUMENT", "to_node_id"],
    );
    let out = server.ok(&[
        "compact", s, "--from", &c.ask, "--to", &c.fixed, "--budget", "100000",
    ]);
    assert!(out.starts_with("applied: summary "), "{out}");
    let json = server.json(&["summaries", s]);
    let record = &json["summaries"][0];
    assert_eq!(record["kind"], "SUMMARY_KIND_SEGMENT");
    assert_eq!(record["text"], SUMMARY);
    assert_eq!(record["from_node_id"], c.ask.as_str());
    assert_eq!(record["to_node_id"], c.fixed.as_str());
}

/// A `--text` that does not shrink the context is an outcome, and its plan is cancelled.
#[test]
fn compact_text_that_does_not_help_is_an_outcome() {
    let server = Server::start();
    let c = server.coding_session();
    let s = c.session.as_str();
    let long = "a very long summary ".repeat(2_000);
    let out = server.ok(&[
        "compact",
        s,
        "--from",
        &c.next_ask,
        "--to",
        &c.last,
        "--text",
        &long,
        "--budget",
        "100000",
    ]);
    assert!(out.starts_with("not applied: NO_GAIN"), "{out}");
    let json = server.json(&["summaries", s]);
    assert_eq!(json["summaries"], Value::Array(vec![]));
    let kinds: Vec<&str> = json["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter_map(|e| e["kind"].as_str())
        .collect();
    assert_eq!(kinds, ["prepared", "rejected", "cancelled"]);
}

#[test]
fn recall_prints_a_node_by_its_reference() {
    let server = Server::start();
    let s = server.import_trace();
    let log = server.json(&["log", &s]);
    // The newest node is the trace's last tool result: recall it by the head of its hash.
    let newest = &log["nodes"][0];
    assert_eq!(newest["kind"], "NODE_KIND_TOOL_RESULT");
    let reference = &newest["hash"].as_str().expect("a hash")[..12];
    let out = server.ok(&["recall", &s, reference]);
    let text = newest["content"]["tool_result"]["parts"][0]["text"]
        .as_str()
        .expect("the result's text");
    assert_eq!(out.trim_end(), text.trim_end());
    let head = server.json(&["recall", &s, reference, "--max-chars", "10"]);
    assert_eq!(head["truncated"], text.chars().count() > 10);
    let bad = server.run(&["recall", &s, "not-a-reference"]);
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("reference"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
}
