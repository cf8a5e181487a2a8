//! The model gateway in front of the real Claude Code CLI through a long scripted session, once
//! straight to the provider and once through the gateway, priced under the fake provider's
//! breakpoint cache (`tests/common/fake_provider.rs`): what Claude Code pays through ctxd must
//! never exceed what it pays without it, and every `cache_control` breakpoint it sets must
//! reach the provider.
//!
//! The session: `claude -p` with `Read`, `Bash` and `Agent` allowed; the parent's model calls
//! read files and `cat` generated ones (each result 12–28 KB) that Claude Code really runs in a
//! temp work dir, and at its 12th call start a sub-agent, whose own conversation reads and
//! `cat`s too before it answers. The sub-agent runs in the foreground (its call says
//! `run_in_background: false`, so the parent's calls are the same in every run; Claude Code's
//! default is the background, which the corpus replay covers), sending its calls to
//! the same base URL, so one reply queue cannot serve both:
//! two fakes, one scripted for the parent and one for the sub-agent, sit behind a loopback
//! router that picks one by the conversation's first message. The cost of each run is the sum
//! over both fakes; the test prints it per call, straight beside through the gateway.
//!
//! The straight run's request bodies are what Claude Code sends for each call; with
//! `CTXD_WRITE_CLAUDE_CORPUS=1` they are written, scrubbed, to
//! `testdata/gateway/corpus/claude-code-2.1.332/`, which a second test replays through the
//! gateway with no CLI at all.
//!
//! Claude Code is found as in `gateway_clients.rs` (`target/agents/node_modules/.bin/claude`,
//! or `CTXD_TEST_CLAUDE`); without it the end-to-end test skips with a message, unless
//! `CTXD_GATEWAY_CLIENTS=required`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::response::Response;
use ctxd::api::pb;
use ctxd::gateway::{Gateway, GatewayPolicy};
use ctxd::server::Options;
use serde_json::value::RawValue;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::agents::{REQUIRED, Ran, run_bounded};
use crate::fake_provider::{Bill, Block, FakeProvider, Gate, Recorded, Reply};
use crate::gateway::{http_client, start_full};
use crate::gateway_codex::{describe, only_branch};
use crate::helpers::{TestApp, spawn_app_with, text_of};

/// The pinned CLI whose requests the corpus holds.
const CORPUS: &str = "testdata/gateway/corpus/claude-code-2.1.332";

/// Writes the straight run's request bodies to [`CORPUS`].
const WRITE_CORPUS: &str = "CTXD_WRITE_CLAUDE_CORPUS";

const PROMPT: &str = "Audit the generated reports and data files in the working directory: read \
                      each one the tool calls name, hand the appendix to a sub-agent, then give \
                      a one-line verdict.";

/// What the sub-agent is asked: the router tells its calls by this text in their first message.
const SUB_PROMPT: &str = "Audit the appendix files appendix.txt and appendix-data.csv in the \
                          working directory and report whether they agree.";

const SUB_ANSWER: &str = "The appendix and its data agree on every row.";
const FINAL: &str = "Verdict: all reports and data files are consistent.";

/// The parent's model calls; the last answers, the others call a tool.
const PARENT_CALLS: usize = 26;
/// The parent's call that starts the sub-agent (1-based).
const AGENT_CALL: usize = 12;

/// The share of the straight cost the session may cost through the gateway, at most: the
/// breakpoint-aware fake prices both runs' very requests, so the figure is deterministic.
const TARGET_RATIO: f64 = 0.85;

// ---------------------------------------------------------------- the script

/// What a scripted model call asks Claude Code to do.
#[derive(Clone, Debug)]
enum Step {
    /// `Read` of a file in the work dir.
    Read {
        file: String,
        bytes: usize,
    },
    /// `Bash`: `cat` of a file in the work dir.
    Cat {
        file: String,
        bytes: usize,
    },
    /// `Agent` with [`SUB_PROMPT`].
    Agent,
    Answer(&'static str),
}

impl Step {
    fn file(&self) -> Option<(&str, usize)> {
        match self {
            Step::Read { file, bytes } | Step::Cat { file, bytes } => Some((file, *bytes)),
            _ => None,
        }
    }
}

/// The parent's calls: reads and `cat`s in turn, sizes 12–28 KB, the sub-agent at
/// [`AGENT_CALL`], the verdict last.
fn parent_steps() -> Vec<Step> {
    (1..=PARENT_CALLS)
        .map(|n| {
            let bytes = 12_000 + (n * 3_700) % 16_000;
            if n == AGENT_CALL {
                Step::Agent
            } else if n == PARENT_CALLS {
                Step::Answer(FINAL)
            } else if n % 2 == 1 {
                Step::Read {
                    file: format!("report-{n:02}.txt"),
                    bytes,
                }
            } else {
                Step::Cat {
                    file: format!("data-{n:02}.csv"),
                    bytes,
                }
            }
        })
        .collect()
}

fn sub_steps() -> Vec<Step> {
    vec![
        Step::Read {
            file: "appendix.txt".into(),
            bytes: 14_000,
        },
        Step::Cat {
            file: "appendix-data.csv".into(),
            bytes: 16_000,
        },
        Step::Answer(SUB_ANSWER),
    ]
}

/// The replies of `steps`, tool ids `toolu_ctxd_<who><n>`.
fn replies(steps: &[Step], who: &str, work: &Path) -> Vec<Reply> {
    steps
        .iter()
        .enumerate()
        .map(|(i, step)| {
            let id = format!("toolu_ctxd_{who}{:02}", i + 1);
            match step {
                Step::Read { file, .. } => Reply::tool_use_id(
                    id,
                    "Read",
                    json!({"file_path": work.join(file).display().to_string()}),
                ),
                Step::Cat { file, .. } => Reply::tool_use_id(
                    id,
                    "Bash",
                    json!({"command": format!("cat {file}"), "description": format!("Print {file}")}),
                ),
                Step::Agent => Reply::tool_use_id(
                    id,
                    "Agent",
                    json!({
                        "description": "Audit the appendix",
                        "prompt": SUB_PROMPT,
                        "subagent_type": "general-purpose",
                        // In the foreground: the parent's tool result is the sub-agent's answer,
                        // so its function closes on it (see the module docs on background agents).
                        "run_in_background": false,
                    }),
                ),
                Step::Answer(text) => Reply::text(*text),
            }
        })
        .collect()
}

/// A file of about `bytes` bytes of short, numbered lines (a model reads such files; the
/// lines differ so nothing repeats).
fn file_text(name: &str, bytes: usize) -> String {
    const WORDS: [&str; 12] = [
        "alpha", "bravo", "delta", "gamma", "kappa", "sigma", "omega", "lambda", "theta", "zeta",
        "rho", "tau",
    ];
    let mut text = String::with_capacity(bytes + 100);
    let mut seed: u64 = name
        .bytes()
        .fold(7, |h: u64, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
    let mut line = 0;
    while text.len() < bytes {
        line += 1;
        text.push_str(&format!("{name},{line:04}"));
        for _ in 0..6 {
            seed = seed
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let word = WORDS[(seed >> 33) as usize % WORDS.len()];
            text.push_str(&format!(",{word}-{}", (seed >> 40) % 1000));
        }
        text.push('\n');
    }
    text
}

// ---------------------------------------------------------------- the end-to-end test

/// The same scripted Claude Code session straight and through the gateway: the gateway run
/// answers as scripted, forwards every breakpoint, records one session with the sub-agent as
/// one function, and costs no more than the straight run.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claude_code_session_costs_no_more_through_the_gateway() {
    let Some(claude) = claude() else { return };
    let (straight, through) = tokio::join!(run_session(&claude, false), run_session(&claude, true));

    if std::env::var(WRITE_CORPUS).is_ok_and(|v| v == "1") {
        write_corpus(&straight);
    }
    for run in [&straight, &through] {
        assert!(
            run.ran.status.success() && run.ran.stdout.trim() == FINAL,
            "claude -p ({}) printed the scripted answer {FINAL:?}\nstatus: {}\nstdout: {}\n\
             stderr: {}\nrouted: {}",
            run.name(),
            run.ran.status,
            run.ran.stdout,
            run.ran.stderr,
            run.routed_paths()
        );
    }

    let (s_parent, g_parent) = (model_calls(&straight.parent), model_calls(&through.parent));
    let (s_sub, g_sub) = (model_calls(&straight.sub), model_calls(&through.sub));
    assert_eq!(
        (s_parent.len(), s_sub.len()),
        (PARENT_CALLS, sub_steps().len()),
        "the straight run's model calls, parent and sub-agent: {}",
        straight.routed_paths()
    );
    assert_eq!(
        (g_parent.len(), g_sub.len()),
        (PARENT_CALLS, sub_steps().len()),
        "the gateway run's model calls, parent and sub-agent: {}",
        through.routed_paths()
    );

    // The cost, printed before any breakpoint check so that a failing run still shows it.
    let (straight_cost, gateway_cost) = (straight.cost(), through.cost());
    let ratio = gateway_cost / straight_cost;
    eprintln!(
        "claude code session cost: straight {straight_cost:.0}, through the gateway \
         {gateway_cost:.0}: {ratio:.3}x (target {TARGET_RATIO}x)"
    );
    eprintln!("{}", breakdown(&s_parent, &g_parent, "parent"));
    eprintln!("{}", breakdown(&s_sub, &g_sub, "sub-agent"));

    // Every breakpoint Claude Code set reaches the provider: the same number in `messages` per
    // call, and the system's and tools' markers as they were.
    for (who, straight, through) in [
        ("parent", &s_parent, &g_parent),
        ("sub-agent", &s_sub, &g_sub),
    ] {
        for (n, (s, g)) in straight.iter().zip(through.iter()).enumerate() {
            let call = n + 1;
            assert_eq!(
                markers(&g.body["messages"]),
                markers(&s.body["messages"]),
                "{who} call {call}: the breakpoints in messages forwarded (upstream through the \
                 gateway, then as Claude Code sent them)\n{}\n{}",
                marker_places(&g.body["messages"]),
                marker_places(&s.body["messages"]),
            );
            assert_eq!(
                own_markers(&g.body["system"]),
                own_markers(&s.body["system"]),
                "{who} call {call}: the system's breakpoints unchanged"
            );
            assert_eq!(
                own_markers(&g.body["tools"]),
                own_markers(&s.body["tools"]),
                "{who} call {call}: the tools' breakpoints unchanged"
            );
        }
    }

    assert!(
        ratio <= TARGET_RATIO,
        "through the gateway the session costs {ratio:.3}x what it costs straight (at most \
         {TARGET_RATIO}x)"
    );

    // ctxd: the session as Claude Code made it.
    let mut app = through.app.expect("the gateway run has a server");
    let session = crate::agents::only_session(&mut app, "one Claude Code session").await;
    assert_recorded(&mut app, &session).await;
}

/// One run of the session: its fakes, what the router saw, how Claude Code ended, and the
/// server when it went through the gateway.
struct Run {
    parent: FakeProvider,
    sub: FakeProvider,
    routed: Arc<Mutex<Vec<Routed>>>,
    ran: Ran,
    app: Option<TestApp>,
    dirs: Dirs,
    _router: JoinHandle<()>,
}

impl Run {
    fn name(&self) -> &'static str {
        if self.app.is_some() {
            "through the gateway"
        } else {
            "straight"
        }
    }

    /// Parent and sub-agent together.
    fn cost(&self) -> f64 {
        self.parent.cost() + self.sub.cost()
    }

    fn routed_paths(&self) -> String {
        let routed = self.routed.lock().unwrap_or_else(|e| e.into_inner());
        let all: Vec<String> = routed
            .iter()
            .map(|r| {
                format!(
                    "{} {} -> {}",
                    r.method,
                    r.path,
                    if r.to_sub { "sub-agent" } else { "parent" }
                )
            })
            .collect();
        format!("{all:?}")
    }
}

/// The temp dirs of a run: Claude Code's working directory, its `HOME` and its `TMPDIR`.
struct Dirs {
    root: tempfile::TempDir,
    work: PathBuf,
    home: PathBuf,
    tmp: PathBuf,
}

impl Dirs {
    /// Fresh dirs, the work dir holding every file the script reads.
    fn new() -> Self {
        let root = tempfile::tempdir().expect("temp dir");
        let work = root.path().join("work");
        let home = root.path().join("home");
        let tmp = root.path().join("tmp");
        for dir in [&work, &home, &tmp] {
            std::fs::create_dir_all(dir).expect("a temp dir");
        }
        for step in parent_steps().iter().chain(&sub_steps()) {
            if let Some((file, bytes)) = step.file() {
                std::fs::write(work.join(file), file_text(file, bytes)).expect("write a file");
            }
        }
        Self {
            root,
            work,
            home,
            tmp,
        }
    }
}

/// Runs the scripted session with fresh fakes and fresh dirs, straight or through a gateway.
async fn run_session(claude: &Path, through_gateway: bool) -> Run {
    let dirs = Dirs::new();
    let parent = FakeProvider::start().await;
    let sub = FakeProvider::start().await;
    parent.script_all(replies(&parent_steps(), "p", &dirs.work));
    // The sub-agent runs in the foreground (`run_in_background: false`): the parent waits for
    // it, so its first answer is not held (the gate is open from the start). Held until the
    // parent's call after next, it is how a background agent's launch reaches the gateway
    // first.
    let mut sub_replies = replies(&sub_steps(), "s", &dirs.work);
    let (first, gate) = sub_replies.remove(0).paused_after(2);
    gate.open();
    sub.script(first);
    sub.script_all(sub_replies);
    let routed = Arc::new(Mutex::new(Vec::new()));
    let (router, router_task) = start_router(&parent, &sub, routed.clone(), gate).await;
    let (app, base) = if through_gateway {
        let (app, url) = gateway_to(&router).await;
        (Some(app), url)
    } else {
        (None, router)
    };
    let ran = run_bounded("claude", claude_command(claude, &dirs, &base)).await;
    Run {
        parent,
        sub,
        routed,
        ran,
        app,
        dirs,
        _router: router_task,
    }
}

/// `claude -p PROMPT` in the work dir against `base`, with a temp `HOME` and nothing but model
/// calls (no telemetry, no update check, no retries with backoff).
fn claude_command(claude: &Path, dirs: &Dirs, base: &str) -> Command {
    let mut command = Command::new(claude);
    command
        .args(["-p", PROMPT, "--allowedTools", "Read,Bash,Agent"])
        .current_dir(&dirs.work)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", &dirs.home)
        // Claude Code keeps its tasks' output under the temp dir, and names it to the model.
        .env("TMPDIR", &dirs.tmp)
        .env("TERM", "dumb")
        .env("ANTHROPIC_BASE_URL", base)
        .env("ANTHROPIC_API_KEY", "sk-test")
        .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        .env("DISABLE_TELEMETRY", "1")
        .env("DISABLE_AUTOUPDATER", "1")
        .env("CLAUDE_CODE_MAX_RETRIES", "0");
    command
}

/// A server whose gateway forwards both APIs to `upstream`; its base URL.
async fn gateway_to(upstream: &str) -> (TestApp, String) {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the gateway");
    let url = format!("http://{}", listener.local_addr().expect("gateway addr"));
    let options = Options {
        gateway: Some(Gateway::new(listener, upstream, upstream)),
        ..Default::default()
    };
    (spawn_app_with(options).await, url)
}

// ---------------------------------------------------------------- the router

/// A request as the router passed it on.
struct Routed {
    method: Method,
    path: String,
    to_sub: bool,
    body: Bytes,
}

#[derive(Clone)]
struct Route {
    parent: String,
    sub: String,
    http: reqwest::Client,
    routed: Arc<Mutex<Vec<Routed>>>,
    /// Opened when the parent's model call [`AGENT_CALL`] + 2 arrives.
    release: Arc<Mutex<Option<Gate>>>,
}

/// A loopback HTTP server that passes `POST /v1/messages` whose first message holds
/// [`SUB_PROMPT`] to `sub` and every other request to `parent`, each as it came, and keeps
/// what it passed on in `routed`, in arrival order; it opens `release` when the parent's
/// model call [`AGENT_CALL`] + 2 arrives. Its base URL, and its task.
async fn start_router(
    parent: &FakeProvider,
    sub: &FakeProvider,
    routed: Arc<Mutex<Vec<Routed>>>,
    release: Gate,
) -> (String, JoinHandle<()>) {
    let route = Route {
        parent: parent.url(),
        sub: sub.url(),
        http: http_client(),
        routed,
        release: Arc::new(Mutex::new(Some(release))),
    };
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the router");
    let url = format!("http://{}", listener.local_addr().expect("router addr"));
    let app = Router::new().fallback(pass_on).with_state(route);
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (url, task)
}

async fn pass_on(State(route): State<Route>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let Ok(body) = axum::body::to_bytes(body, usize::MAX).await else {
        return status(StatusCode::BAD_REQUEST, "the request body was not read");
    };
    let to_sub = parts.method == Method::POST
        && parts.uri.path() == "/v1/messages"
        && opens_with(&body, SUB_PROMPT);
    let base = if to_sub { &route.sub } else { &route.parent };
    let target = parts
        .uri
        .path_and_query()
        .map_or(parts.uri.path(), |p| p.as_str());
    let mut upstream = route
        .http
        .request(parts.method.clone(), format!("{base}{target}"))
        .body(body.clone());
    for (name, value) in &parts.headers {
        if !matches!(name.as_str(), "host" | "content-length") {
            upstream = upstream.header(name, value);
        }
    }
    let parent_calls = {
        let mut routed = route.routed.lock().unwrap_or_else(|e| e.into_inner());
        routed.push(Routed {
            method: parts.method.clone(),
            path: parts.uri.path().to_owned(),
            to_sub,
            body,
        });
        routed
            .iter()
            .filter(|r| r.method == Method::POST && r.path == "/v1/messages" && !r.to_sub)
            .count()
    };
    if parent_calls == AGENT_CALL + 2
        && let Some(gate) = route
            .release
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    {
        gate.open();
    }
    let answer = match upstream.send().await {
        Ok(answer) => answer,
        Err(e) => return status(StatusCode::BAD_GATEWAY, &format!("the fake: {e}")),
    };
    let mut response = Response::builder().status(answer.status());
    for (name, value) in answer.headers() {
        if !matches!(
            name.as_str(),
            "content-length" | "transfer-encoding" | "connection"
        ) {
            response = response.header(name, value);
        }
    }
    let body = answer.bytes().await.unwrap_or_default();
    response
        .body(Body::from(body))
        .unwrap_or_else(|_| status(StatusCode::BAD_GATEWAY, "an unusable answer"))
}

fn status(code: StatusCode, text: &str) -> Response {
    let mut response = Response::new(Body::from(text.to_owned()));
    *response.status_mut() = code;
    response
}

/// Whether the first message of the JSON `body` holds `text` in a text block (or is it).
fn opens_with(body: &[u8], text: &str) -> bool {
    let Ok(body) = serde_json::from_slice::<Value>(body) else {
        return false;
    };
    let first = &body["messages"][0];
    match &first["content"] {
        Value::String(s) => s.contains(text),
        Value::Array(blocks) => blocks
            .iter()
            .any(|b| b["text"].as_str().is_some_and(|t| t.contains(text))),
        _ => false,
    }
}

// ---------------------------------------------------------------- measures

/// The answered `POST /v1/messages` a fake received, in order.
fn model_calls(fake: &FakeProvider) -> Vec<Recorded> {
    fake.requests()
        .into_iter()
        .filter(|r| r.method == "POST" && r.path == "/v1/messages")
        .collect()
}

/// `cache_control` keys anywhere in `value`.
fn markers(value: &Value) -> usize {
    match value {
        Value::Object(map) => {
            usize::from(map.contains_key("cache_control"))
                + map.values().map(markers).sum::<usize>()
        }
        Value::Array(items) => items.iter().map(markers).sum(),
        _ => 0,
    }
}

/// The markers of a list of blocks (system) or tools, in order: each entry's own
/// `cache_control` (`null` for none); a string system has none.
fn own_markers(value: &Value) -> Vec<Value> {
    value
        .as_array()
        .map(|items| {
            items
                .iter()
                .map(|i| i.get("cache_control").cloned().unwrap_or(Value::Null))
                .collect()
        })
        .unwrap_or_default()
}

/// Where the markers in `messages` are: `message index/block index` each, for failures.
fn marker_places(messages: &Value) -> String {
    let mut places = Vec::new();
    for (m, message) in messages.as_array().into_iter().flatten().enumerate() {
        if let Some(blocks) = message["content"].as_array() {
            for (b, block) in blocks.iter().enumerate() {
                if let Some(marker) = block.get("cache_control") {
                    places.push(format!("{m}/{b} {marker}"));
                }
            }
        }
    }
    format!(
        "{} messages, markers at {places:?}",
        messages.as_array().map_or(0, Vec::len)
    )
}

/// Per call, straight and through the gateway: read, written and plain input tokens and the
/// cost, one line each, and the totals.
fn breakdown(straight: &[Recorded], through: &[Recorded], who: &str) -> String {
    let bill = |r: &Recorded| r.bill.unwrap_or_default();
    let show = |b: &Bill| {
        format!(
            "read {:>7} write {:>6} input {:>6} = {:>8.0}",
            b.read,
            b.write_5m + b.write_1h,
            b.input,
            b.cost()
        )
    };
    let mut out = format!("{who}: call | straight | through the gateway\n");
    for (n, (s, g)) in straight.iter().zip(through).enumerate() {
        out.push_str(&format!(
            "{who} {:>2} | {} | {}\n",
            n + 1,
            show(&bill(s)),
            show(&bill(g))
        ));
    }
    let total = |calls: &[Recorded]| calls.iter().map(Recorded::cost).sum::<f64>();
    out.push_str(&format!(
        "{who} total | {:.0} | {:.0}",
        total(straight),
        total(through)
    ));
    out
}

// ---------------------------------------------------------------- the session in ctxd

/// What ctxd must hold of the session, through the gateway or replayed: one branch with nodes
/// (no `gw-` fork holds any) with the prompt, the parent's tool calls each once and in order,
/// and the verdict at its head; the sub-agent's conversation, in the `Agent` call's function, opening with
/// its prompt, holding its tool calls and ending with its answer.
async fn assert_recorded(app: &mut TestApp, session: &str) {
    use pb::node_input::Kind;
    let branch = only_branch(app, session).await;
    let mut nodes = app.log(session, &branch).await;
    nodes.reverse();
    let lines: Vec<String> = nodes.iter().map(describe).collect();
    let kind = |n: &pb::Node| n.content.as_ref().and_then(|c| c.kind.clone());
    assert!(
        nodes
            .iter()
            .any(|n| matches!(kind(n), Some(Kind::Message(m))
            if m.role == pb::Role::User as i32 && text_of(&m.parts).contains(PROMPT))),
        "the prompt is recorded: {lines:#?}"
    );
    let called: Vec<String> = nodes
        .iter()
        .filter_map(|n| match kind(n) {
            Some(Kind::Message(m)) => Some(m.tool_calls),
            _ => None,
        })
        .flatten()
        .map(|c| c.call_id)
        .collect();
    let expected: Vec<String> = (1..PARENT_CALLS)
        .map(|n| format!("toolu_ctxd_p{n:02}"))
        .collect();
    assert_eq!(
        called, expected,
        "the parent's tool calls, each once and in order: {lines:#?}"
    );
    assert_eq!(
        lines.last().map(String::as_str),
        Some(format!("assistant: {FINAL}").as_str()),
        "the verdict is the head: {lines:#?}"
    );
    let functions: Vec<(String, String)> = nodes
        .iter()
        .filter_map(|n| match kind(n) {
            Some(Kind::FunctionCall(f)) => Some((f.call_id, n.node_id.clone())),
            _ => None,
        })
        .collect();
    let agent_id = format!("toolu_ctxd_p{AGENT_CALL:02}");
    assert!(
        functions.len() == 1 && functions[0].0 == agent_id,
        "one function, the sub-agent's {agent_id}: {lines:#?}"
    );
    let (sub_session, target) = (
        session.to_owned(),
        pb::render_request::Target::FunctionId(functions[0].1.clone()),
    );
    let chain = app
        .client
        .render(pb::RenderRequest {
            session_id: sub_session,
            target: Some(target),
            callers: pb::Callers::None as i32,
            ..Default::default()
        })
        .await
        .expect("render the sub-agent's conversation")
        .into_inner()
        .messages;
    let shown: Vec<String> = chain
        .iter()
        .map(|m| {
            let text: String = text_of(&m.parts).chars().take(200).collect();
            let calls: Vec<&str> = m.tool_calls.iter().map(|c| c.call_id.as_str()).collect();
            format!("{:?} {text} {calls:?}", pb::Role::try_from(m.role))
        })
        .collect();
    assert!(
        chain
            .first()
            .is_some_and(|m| text_of(&m.parts).contains(SUB_PROMPT)),
        "the function's chain opens with the sub-agent's prompt: {shown:#?}"
    );
    let sub_calls: Vec<&str> = chain
        .iter()
        .flat_map(|m| m.tool_calls.iter().map(|c| c.call_id.as_str()))
        .collect();
    assert_eq!(
        sub_calls,
        ["toolu_ctxd_s01", "toolu_ctxd_s02"],
        "the function's chain holds the sub-agent's tool calls: {shown:#?}"
    );
    assert!(
        chain.last().is_some_and(
            |m| m.role == pb::Role::Assistant as i32 && text_of(&m.parts) == SUB_ANSWER
        ),
        "the function's chain ends with the sub-agent's answer: {shown:#?}"
    );
}

// ---------------------------------------------------------------- the corpus

/// Writes the straight run's model-call bodies, in the order Claude Code sent them, as
/// `NN.json` under [`CORPUS`]: byte for byte but for the run's temp dirs, which become
/// `{{WORK}}`, `{{HOME}}`, `{{TMPDIR}}` and their parent `{{TMP}}`, and the name Claude Code
/// makes of the work dir for its own files (each character but a letter or digit a `-`),
/// `{{WORK_SLUG}}`.
fn write_corpus(run: &Run) {
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join(CORPUS);
    std::fs::create_dir_all(&out).expect("the corpus dir");
    let text = |path: &Path| path.display().to_string();
    let slug: String = text(&run.dirs.work)
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let scrub = [
        (text(&run.dirs.work), "{{WORK}}"),
        (slug, "{{WORK_SLUG}}"),
        (text(&run.dirs.home), "{{HOME}}"),
        (text(&run.dirs.tmp), "{{TMPDIR}}"),
        (text(run.dirs.root.path()), "{{TMP}}"),
    ];
    // The temp dir's own name, random: none may be left.
    let random = run
        .dirs
        .root
        .path()
        .file_name()
        .expect("a temp dir name")
        .to_string_lossy()
        .trim_start_matches('.')
        .to_owned();
    let routed = run.routed.lock().unwrap_or_else(|e| e.into_inner());
    let bodies = routed
        .iter()
        .filter(|r| r.method == Method::POST && r.path == "/v1/messages");
    for (n, r) in bodies.enumerate() {
        let mut body = String::from_utf8(r.body.to_vec()).expect("a UTF-8 body");
        for (path, placeholder) in &scrub {
            body = body.replace(path.as_str(), placeholder);
        }
        assert!(
            !body.contains(&random),
            "body {n:02} names the run's temp dir ({random}) where the scrub missed it"
        );
        serde_json::from_str::<Value>(&body).expect("the scrubbed body is JSON");
        std::fs::write(out.join(format!("{n:02}.json")), body).expect("write a corpus body");
    }
}

/// The corpus bodies, in order.
fn corpus() -> Vec<String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(CORPUS);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("the corpus {} ({e})", dir.display()))
        .map(|e| e.expect("a corpus entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no bodies in {}", dir.display());
    files
        .iter()
        .map(|f| std::fs::read_to_string(f).expect("read a corpus body"))
        .collect()
}

/// `value` without its `cache_control` keys (at any depth), as text: what a message is to
/// the client from call to call.
fn unmarked(value: &Value) -> String {
    fn strip(value: &Value) -> Value {
        match value {
            Value::Object(map) => Value::Object(
                map.iter()
                    .filter(|(k, _)| *k != "cache_control")
                    .map(|(k, v)| (k.clone(), strip(v)))
                    .collect(),
            ),
            Value::Array(items) => Value::Array(items.iter().map(strip).collect()),
            other => other.clone(),
        }
    }
    strip(value).to_string()
}

/// The answer each body implies: the assistant message the next body of the same conversation
/// (the same first message) resends after this body's messages; the last body of the first
/// conversation (the parent's) answers [`FINAL`], of any other [`SUB_ANSWER`].
fn implied_answers(bodies: &[Value]) -> Vec<Reply> {
    let first = |b: &Value| unmarked(&b["messages"][0]);
    bodies
        .iter()
        .enumerate()
        .map(|(n, body)| {
            let sent = body["messages"].as_array().map_or(0, Vec::len);
            let next = bodies[n + 1..].iter().find(|b| first(b) == first(body));
            let Some(next) = next else {
                let parent = first(body) == first(&bodies[0]);
                return Reply::text(if parent { FINAL } else { SUB_ANSWER });
            };
            let answer = &next["messages"][sent];
            assert_eq!(
                answer["role"], "assistant",
                "body {n:02}: the next body of its conversation resends the answer"
            );
            let blocks = answer["content"]
                .as_array()
                .expect("an assistant message's blocks")
                .iter()
                .map(|b| match b["type"].as_str() {
                    Some("text") => Block::Text(b["text"].as_str().unwrap_or_default().into()),
                    Some("tool_use") => Block::ToolUse {
                        id: b["id"].as_str().unwrap_or_default().into(),
                        name: b["name"].as_str().unwrap_or_default().into(),
                        input: b["input"].clone(),
                    },
                    other => panic!("body {n:02}: an answer block of type {other:?}"),
                })
                .collect();
            Reply::blocks(blocks)
        })
        .collect()
}

/// The first system block of a body as it is written in it.
fn first_system_block(raw: &str) -> String {
    #[derive(serde::Deserialize)]
    struct Body<'a> {
        #[serde(borrow)]
        system: Vec<&'a RawValue>,
    }
    let body: Body = serde_json::from_str(raw).expect("a body with system blocks");
    body.system
        .first()
        .expect("a first system block")
        .get()
        .to_owned()
}

/// Claude Code's recorded requests (the corpus) replayed in order through an in-process
/// gateway in front of one fake, answered as the corpus implies: every call is recorded in one
/// session, the billing-header system block goes upstream byte for byte, and every forwarded
/// request keeps the client's breakpoints.
#[tokio::test]
async fn claude_code_corpus_replays_through_the_gateway() {
    let raw = corpus();
    let bodies: Vec<Value> = raw
        .iter()
        .map(|b| serde_json::from_str(b).expect("a corpus body is JSON"))
        .collect();
    let fake = FakeProvider::start().await;
    fake.script_all(implied_answers(&bodies));
    let mut gw = start_full(fake, None, GatewayPolicy::default(), Options::default()).await;

    let mut sessions = Vec::new();
    for (n, body) in raw.iter().enumerate() {
        let answer = gw
            .post(
                "/v1/messages?beta=true",
                &[
                    ("anthropic-version", "2023-06-01"),
                    ("x-api-key", "sk-test"),
                ],
                body.clone().into_bytes(),
            )
            .await
            .ok();
        sessions.push(answer.session());
        let upstream = gw.last_upstream();
        assert_eq!(
            upstream.path, "/v1/messages",
            "body {n:02} went upstream as a model call"
        );
        let billing = first_system_block(body);
        assert!(
            billing.contains("x-anthropic-billing-header"),
            "body {n:02}: the first system block is Claude Code's billing header: {billing}"
        );
        assert_eq!(
            first_system_block(&String::from_utf8_lossy(&upstream.raw)),
            billing,
            "body {n:02}: the billing header forwarded byte for byte"
        );
        assert_eq!(
            markers(&upstream.body["messages"]),
            markers(&bodies[n]["messages"]),
            "body {n:02}: the client's breakpoints in messages forwarded\nupstream: {}\n\
             client: {}",
            marker_places(&upstream.body["messages"]),
            marker_places(&bodies[n]["messages"]),
        );
        assert_eq!(
            own_markers(&upstream.body["system"]),
            own_markers(&bodies[n]["system"]),
            "body {n:02}: the system's breakpoints unchanged"
        );
        assert_eq!(
            own_markers(&upstream.body["tools"]),
            own_markers(&bodies[n]["tools"]),
            "body {n:02}: the tools' breakpoints unchanged"
        );
    }
    assert_eq!(
        gw.fake.pending(),
        0,
        "every implied answer was taken, one per body"
    );
    // Claude Code ran the sub-agent in the background (its default): its launch is the
    // call's tool result, and its conversation the call's function, in the run's one session.
    let parent = sessions[0].clone();
    sessions.sort();
    sessions.dedup();
    assert_eq!(
        sessions,
        std::slice::from_ref(&parent),
        "one session for the run"
    );
    assert_recorded(&mut gw.app, &parent).await;
}

// ---------------------------------------------------------------- the client

/// The Claude Code CLI, or `None` (the test skips) when it is missing and not required.
fn claude() -> Option<PathBuf> {
    let path = match std::env::var_os("CTXD_TEST_CLAUDE").filter(|v| !v.is_empty()) {
        Some(path) => PathBuf::from(path),
        None => {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("target/agents/node_modules/.bin/claude")
        }
    };
    if path.exists() {
        return Some(path);
    }
    let why = format!(
        "no Claude Code at {} (CTXD_TEST_CLAUDE; .ci/run installs @anthropic-ai/claude-code into \
         target/agents)",
        path.display()
    );
    if std::env::var(REQUIRED).is_ok_and(|v| v == "required") {
        panic!("{REQUIRED}=required, but {why}");
    }
    eprintln!("skipped: {why}; set {REQUIRED}=required to fail instead");
    None
}
