//! The model gateway in front of the real Claude Code CLI through long scripted sessions, once
//! straight to the provider and once through the gateway, against the fake provider
//! (`tests/common/fake_provider.rs`) as Claude Code 2.1.332 meets the real one: Opus 5.5 with
//! adaptive thinking, so nearly every answer holds a signed thinking block, bound to everything
//! before it, and a request whose prefix under a kept block changed is refused (400). Through
//! the gateway no request may be refused and no thinking dropped, every `cache_control`
//! breakpoint Claude Code sets must reach the provider, and the session must cost less than
//! straight at every listed model's cache prices (the breakpoint cache bills both runs' very
//! requests, so the figures are deterministic).
//!
//! Two sessions of different shapes, so no policy is tuned to one: `reports` (Read and Bash
//! results of 12–28 KB in turn, one sub-agent at the 12th call) and `logs` (mostly Bash output
//! of 18–40 KB, short reads, two sub-agents). Each model call reads a file or
//! `cat`s one that Claude Code really runs in a temp work dir; a sub-agent runs in the
//! foreground (`run_in_background: false`, so the parent's calls are the same in every run;
//! Claude Code's default is the background, which the corpus replay covers), sending its calls
//! to the same base URL, so one reply queue cannot serve all: one fake per conversation, behind
//! a loopback router that picks one by the conversation's first message. The cost of a run is
//! the sum over its fakes; the test prints it per call, straight beside through the gateway.
//!
//! The straight run's request bodies of `reports` are what Claude Code sends for each call; with
//! `CTXD_WRITE_CLAUDE_CORPUS=1` they are written, scrubbed, to
//! `testdata/gateway/corpus/claude-code-2.1.332-thinking/`, which another test replays through
//! the gateway with no CLI at all, as it does the corpus of a session whose sub-agent ran in
//! the background.
//!
//! Claude Code is found as in `gateway_clients.rs` (`target/agents/node_modules/.bin/claude`,
//! or `CTXD_TEST_CLAUDE`); without it the end-to-end tests skip with a message, unless
//! `CTXD_GATEWAY_CLIENTS=required`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::Response;
use ctxd::api::pb;
use ctxd::gateway::{Gateway, GatewayPolicy};
use ctxd::server::Options;
use serde_json::value::RawValue;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::agents::{Ran, run_bounded};
use crate::fake_provider::{Bill, Block, FakeProvider, Recorded, Reply, thinking_signature};
use crate::gateway::{http_client, start_full};
use crate::gateway_codex::{describe, only_branch};
use crate::helpers::{TestApp, spawn_app_with, text_of};

/// The pinned CLI's requests: a session whose sub-agent ran in the background (Claude Code's
/// default), captured before the fake signed thinking, and the `reports` session with thinking
/// on, which the end-to-end test writes.
const CORPUS: &str = "testdata/gateway/corpus/claude-code-2.1.332";
const THINKING_CORPUS: &str = "testdata/gateway/corpus/claude-code-2.1.332-thinking";

/// The `anthropic-beta` Claude Code 2.1.332 sends, for a corpus that kept no header.
const CLAUDE_CODE_BETAS: &str = "claude-code-20250219,interleaved-thinking-2025-05-14,\
    context-management-2025-06-27,per-turn-control-2026-07-01,\
    mid-conversation-tool-changes-2026-07-01,thinking-token-count-2026-05-13,\
    advanced-tool-use-2025-11-20,effort-2025-11-24";

/// Writes the straight run's request bodies to [`CORPUS`].
const WRITE_CORPUS: &str = "CTXD_WRITE_CLAUDE_CORPUS";

/// The model Claude Code 2.1.332 runs by default, which binds its thinking.
const MODEL: &str = "claude-opus-5-5";

/// The most a session may cost through the gateway, as a share of straight: at 0.1x reads (the
/// older models'), at Opus 5.5's own 0.05x, and at every listed model's (Fable 5.1's 0.025x
/// the cheapest).
const AT_TENTH: f64 = 0.85;
const AT_MODEL: f64 = 0.90;
const AT_ANY: f64 = 1.0;
const READ_PRICES: [f64; 3] = [0.1, 0.05, 0.025];

// ---------------------------------------------------------------- the scripts

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
    /// `Agent` with the prompt of sub-agent `n` of the script.
    Agent(usize),
    Answer(&'static str),
}

impl Step {
    fn file(&self) -> Option<(&str, usize)> {
        match self {
            Step::Read { file, bytes } | Step::Cat { file, bytes } => Some((file, *bytes)),
            _ => None,
        }
    }

    fn read(file: String, bytes: usize) -> Self {
        Step::Read { file, bytes }
    }

    fn cat(file: String, bytes: usize) -> Self {
        Step::Cat { file, bytes }
    }
}

/// A sub-agent: what it is asked (the router tells its calls by this text in their first
/// message), its calls, the last of which answers.
struct Sub {
    prompt: &'static str,
    steps: Vec<Step>,
}

/// A scripted Claude Code session: its prompt, the parent's calls (the last answers) and its
/// sub-agents.
struct Script {
    name: &'static str,
    prompt: &'static str,
    parent: Vec<Step>,
    subs: Vec<Sub>,
}

const FINAL: &str = "Verdict: all reports and data files are consistent.";
const LOGS_FINAL: &str = "Verdict: the build is clean and no test failed.";

impl Script {
    /// `reports`: reads and `cat`s in turn, sizes 12–28 KB, a sub-agent at the 12th call, the
    /// verdict at the 26th.
    fn reports() -> Self {
        const CALLS: usize = 26;
        let parent = (1..=CALLS)
            .map(|n| {
                let bytes = 12_000 + (n * 3_700) % 16_000;
                match n {
                    12 => Step::Agent(0),
                    CALLS => Step::Answer(FINAL),
                    _ if n % 2 == 1 => Step::read(format!("report-{n:02}.txt"), bytes),
                    _ => Step::cat(format!("data-{n:02}.csv"), bytes),
                }
            })
            .collect();
        Script {
            name: "reports",
            prompt: "Audit the generated reports and data files in the working directory: read \
                     each one the tool calls name, hand the appendix to a sub-agent, then give \
                     a one-line verdict.",
            parent,
            subs: vec![Sub {
                prompt: "Audit the appendix files appendix.txt and appendix-data.csv in the \
                         working directory and report whether they agree.",
                steps: vec![
                    Step::read("appendix.txt".into(), 14_000),
                    Step::cat("appendix-data.csv".into(), 16_000),
                    Step::Answer("The appendix and its data agree on every row."),
                ],
            }],
        }
    }

    /// `logs`: mostly Bash output, long build logs of 18–40 KB, short notes read every fifth
    /// call, sub-agents at the 8th and the 19th call, the verdict at the 30th.
    fn logs() -> Self {
        const CALLS: usize = 30;
        let parent = (1..=CALLS)
            .map(|n| match n {
                8 => Step::Agent(0),
                19 => Step::Agent(1),
                CALLS => Step::Answer(LOGS_FINAL),
                _ if n % 5 == 0 => Step::read(format!("notes-{n:02}.md"), 4_000),
                _ => Step::cat(format!("build-{n:02}.log"), 18_000 + (n * 5_300) % 22_000),
            })
            .collect();
        Script {
            name: "logs",
            prompt: "Triage the build and test logs in the working directory: print each log \
                     the tool calls name, hand the archives to sub-agents, then give a \
                     one-line verdict.",
            parent,
            subs: vec![
                Sub {
                    prompt: "Summarise the archived build logs archive-a-1.log and \
                             archive-a-2.log in the working directory.",
                    steps: vec![
                        Step::cat("archive-a-1.log".into(), 10_000),
                        Step::cat("archive-a-2.log".into(), 25_000),
                        Step::Answer("Both archived builds succeeded."),
                    ],
                },
                Sub {
                    prompt: "Check the archived test logs archive-b-1.log, archive-b-2.log and \
                             archive-b-3.log in the working directory for failures.",
                    steps: vec![
                        Step::cat("archive-b-1.log".into(), 6_000),
                        Step::cat("archive-b-2.log".into(), 30_000),
                        Step::read("archive-b-3.log".into(), 8_000),
                        Step::Answer("No archived test failed."),
                    ],
                },
            ],
        }
    }

    fn final_answer(&self) -> &'static str {
        match self.parent.last() {
            Some(Step::Answer(text)) => text,
            _ => unreachable!("a script ends with its answer"),
        }
    }

    /// Every file the script reads, with its size.
    fn files(&self) -> Vec<(&str, usize)> {
        self.parent
            .iter()
            .chain(self.subs.iter().flat_map(|s| &s.steps))
            .filter_map(Step::file)
            .collect()
    }

    /// The parent's tool calls, in order: `toolu_ctxd_p01`, …
    fn parent_call_ids(&self) -> Vec<String> {
        (1..self.parent.len())
            .map(|n| format!("toolu_ctxd_p{n:02}"))
            .collect()
    }

    /// The replies of `steps`, tool ids `toolu_ctxd_<who><n>`.
    fn replies(&self, steps: &[Step], who: &str, work: &Path) -> Vec<Reply> {
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
                    Step::Agent(n) => Reply::tool_use_id(
                        id,
                        "Agent",
                        json!({
                            "description": format!("Sub-agent {}", n + 1),
                            "prompt": self.subs[*n].prompt,
                            "subagent_type": "general-purpose",
                            // In the foreground: the parent's tool result is the sub-agent's
                            // answer, so its function closes on it.
                            "run_in_background": false,
                        }),
                    ),
                    Step::Answer(text) => Reply::text(*text),
                }
            })
            .collect()
    }
}

/// The letter of sub-agent `n`'s tool ids: `s`, `t`, …
fn sub_letter(n: usize) -> String {
    char::from(b's' + u8::try_from(n).expect("a few sub-agents")).to_string()
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

// ---------------------------------------------------------------- the end-to-end tests

/// The `reports` session straight and through the gateway (see the module docs).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claude_code_session_costs_no_more_through_the_gateway() {
    let Some(claude) = claude() else { return };
    let script = Script::reports();
    let (straight, through) = run_both(&claude, &script).await;
    if std::env::var(WRITE_CORPUS).is_ok_and(|v| v == "1") {
        write_corpus(&straight);
    }
    check(&script, straight, through).await;
}

/// The `logs` session, of another shape: mostly long Bash output, two sub-agents.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claude_code_logs_session_costs_no_more_through_the_gateway() {
    let Some(claude) = claude() else { return };
    let script = Script::logs();
    let (straight, through) = run_both(&claude, &script).await;
    check(&script, straight, through).await;
}

/// The script run straight and through the gateway at once.
async fn run_both(claude: &Path, script: &Script) -> (Run, Run) {
    tokio::join!(
        run_session(claude, script, false),
        run_session(claude, script, true)
    )
}

/// What both runs must show: Claude Code answered as scripted with every model call made once
/// (no refusal retried), the provider refused nothing and dropped no thinking, every breakpoint
/// reached it, the session costs less through the gateway at every price, and ctxd holds the
/// session as Claude Code made it, its ledger saying what was asked of the provider and what it
/// cleared.
async fn check(script: &Script, straight: Run, through: Run) {
    let answer = script.final_answer();
    for run in [&straight, &through] {
        assert!(
            run.ran.status.success() && run.ran.stdout.trim() == answer,
            "claude -p ({}, {}) printed the scripted answer {answer:?}\nstatus: {}\nstdout: {}\n\
             stderr: {}\nrouted: {}",
            script.name,
            run.name(),
            run.ran.status,
            run.ran.stdout,
            run.ran.stderr,
            run.routed_paths()
        );
        for fake in run.fakes() {
            assert_eq!(
                fake.refusals(),
                0,
                "{} ({}): the provider refused no request for its thinking",
                script.name,
                run.name()
            );
            for call in model_calls(fake) {
                assert!(
                    call.input_transformations.is_null(),
                    "{} ({}): the provider dropped no thinking: {}",
                    script.name,
                    run.name(),
                    call.input_transformations
                );
            }
        }
    }
    let expected = std::iter::once(script.parent.len())
        .chain(script.subs.iter().map(|s| s.steps.len()))
        .collect::<Vec<_>>();
    for run in [&straight, &through] {
        let made: Vec<usize> = run.fakes().map(|f| model_calls(f).len()).collect();
        assert_eq!(
            made,
            expected,
            "{} ({}): the model calls of the parent and each sub-agent: {}",
            script.name,
            run.name(),
            run.routed_paths()
        );
    }

    // The cost, printed before any other check so that a failing run still shows it.
    let ratios: Vec<f64> = READ_PRICES
        .iter()
        .map(|&p| through.cost_at(p) / straight.cost_at(p))
        .collect();
    eprintln!(
        "claude code session {}: through the gateway / straight: {:.3}x at 0.1x reads, {:.3}x at \
         0.05x (Opus 5.5), {:.3}x at 0.025x",
        script.name, ratios[0], ratios[1], ratios[2]
    );
    for (n, (s, g)) in straight.fakes().zip(through.fakes()).enumerate() {
        let who = if n == 0 {
            "parent".to_owned()
        } else {
            format!("sub-agent {n}")
        };
        eprintln!("{}", breakdown(&model_calls(s), &model_calls(g), &who));
    }

    // The model's reasoning goes back to it: Claude Code resends its thinking, and through the
    // gateway every block reaches the provider after the prefix it was produced on.
    let last = model_calls(&through.fakes[0])
        .pop()
        .expect("the parent's calls");
    let thinking = count_blocks(&last.body["messages"], "thinking");
    assert!(
        thinking + 2 >= script.parent.len(),
        "{}: the last call resends the parent's thinking ({thinking} blocks)",
        script.name
    );

    // Every breakpoint Claude Code set reaches the provider.
    for (s_fake, g_fake) in straight.fakes().zip(through.fakes()) {
        for (n, (s, g)) in model_calls(s_fake)
            .iter()
            .zip(model_calls(g_fake).iter())
            .enumerate()
        {
            assert_eq!(
                markers(&g.body["messages"]),
                markers(&s.body["messages"]),
                "{} call {}: the breakpoints in messages forwarded\n{}\n{}",
                script.name,
                n + 1,
                marker_places(&g.body["messages"]),
                marker_places(&s.body["messages"]),
            );
            assert_eq!(
                own_markers(&g.body["system"]),
                own_markers(&s.body["system"])
            );
            assert_eq!(own_markers(&g.body["tools"]), own_markers(&s.body["tools"]));
        }
    }

    for ((&price, ratio), bound) in READ_PRICES
        .iter()
        .zip(&ratios)
        .zip([AT_TENTH, AT_MODEL, AT_ANY])
    {
        assert!(
            *ratio <= bound,
            "{}: through the gateway the session costs {ratio:.3}x what it costs straight at \
             {price}x reads (at most {bound}x)",
            script.name
        );
    }

    // ctxd: the session as Claude Code made it, and its ledger.
    let mut app = through.app.expect("the gateway run has a server");
    let session = crate::agents::only_session(&mut app, "one Claude Code session").await;
    assert_recorded(&mut app, &session, script).await;
    let calls = app
        .client
        .list_gateway_calls(pb::ListGatewayCallsRequest {
            session_id: session.clone(),
            page_size: 1000,
            page_token: String::new(),
        })
        .await
        .expect("the ledger")
        .into_inner()
        .calls;
    assert!(
        calls
            .iter()
            .all(|c| c.priced_by == MODEL && c.thinking_dropped == 0),
        "{}: every call priced by the model's entry, no thinking dropped: {calls:#?}",
        script.name
    );
    let asked: Vec<&pb::GatewayCall> = calls.iter().filter(|c| c.edit_clear.is_some()).collect();
    assert!(
        !asked.is_empty(),
        "{}: the gateway asked the provider to clear old results: {calls:#?}",
        script.name
    );
    for c in &asked {
        assert_eq!(
            c.provider_cleared, c.edit_clear,
            "{}: the provider cleared what ctxd asked: {c:#?}",
            script.name
        );
    }
}

/// One run of a script: its fakes (the parent's, then each sub-agent's), what the router saw,
/// how Claude Code ended, and the server when it went through the gateway.
struct Run {
    fakes: Vec<FakeProvider>,
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

    fn fakes(&self) -> impl Iterator<Item = &FakeProvider> {
        self.fakes.iter()
    }

    /// Every conversation's cost together, at `read` per token read.
    fn cost_at(&self, read: f64) -> f64 {
        self.fakes.iter().map(|f| f.cost_at(read)).sum()
    }

    fn routed_paths(&self) -> String {
        let routed = self.routed.lock().unwrap_or_else(|e| e.into_inner());
        let all: Vec<String> = routed
            .iter()
            .map(|r| format!("{} {} -> {}", r.method, r.path, r.to))
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
    fn new(script: &Script) -> Self {
        let root = tempfile::tempdir().expect("temp dir");
        let work = root.path().join("work");
        let home = root.path().join("home");
        let tmp = root.path().join("tmp");
        for dir in [&work, &home, &tmp] {
            std::fs::create_dir_all(dir).expect("a temp dir");
        }
        for (file, bytes) in script.files() {
            std::fs::write(work.join(file), file_text(file, bytes)).expect("write a file");
        }
        Self {
            root,
            work,
            home,
            tmp,
        }
    }
}

/// Runs the script with fresh fakes and fresh dirs, straight or through a gateway.
async fn run_session(claude: &Path, script: &Script, through_gateway: bool) -> Run {
    let dirs = Dirs::new(script);
    let parent = FakeProvider::start().await;
    parent.script_all(script.replies(&script.parent, "p", &dirs.work));
    let mut fakes = vec![parent];
    for (n, sub) in script.subs.iter().enumerate() {
        let fake = FakeProvider::start().await;
        fake.script_all(script.replies(&sub.steps, &sub_letter(n), &dirs.work));
        fakes.push(fake);
    }
    let routed = Arc::new(Mutex::new(Vec::new()));
    let routes: Vec<(Option<&'static str>, String)> = std::iter::once((None, fakes[0].url()))
        .chain(
            script
                .subs
                .iter()
                .zip(&fakes[1..])
                .map(|(s, f)| (Some(s.prompt), f.url())),
        )
        .collect();
    let (router, router_task) = start_router(routes, routed.clone()).await;
    let (app, base) = if through_gateway {
        let (app, url) = gateway_to(&router).await;
        (Some(app), url)
    } else {
        (None, router)
    };
    let ran = run_bounded("claude", claude_command(claude, script, &dirs, &base)).await;
    Run {
        fakes,
        routed,
        ran,
        app,
        dirs,
        _router: router_task,
    }
}

/// `claude -p PROMPT` in the work dir against `base`, with a temp `HOME` and nothing but model
/// calls (no telemetry, no update check, no retries with backoff).
fn claude_command(claude: &Path, script: &Script, dirs: &Dirs, base: &str) -> Command {
    let mut command = Command::new(claude);
    command
        .args(["-p", script.prompt, "--allowedTools", "Read,Bash,Agent"])
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
    /// Which conversation's fake took it: `parent` or `sub-agent N`.
    to: String,
    headers: HeaderMap,
    body: Bytes,
}

#[derive(Clone)]
struct Route {
    /// The fakes' base URLs, the parent's first, each with the sub-agent prompt that routes a
    /// conversation to it.
    fakes: Arc<Vec<(Option<&'static str>, String)>>,
    http: reqwest::Client,
    routed: Arc<Mutex<Vec<Routed>>>,
}

/// A loopback HTTP server that passes `POST /v1/messages` whose first message holds a
/// sub-agent's prompt to that sub-agent's fake and every other request to the parent's, each as
/// it came, and keeps what it passed on in `routed`, in arrival order. Its base URL, and its
/// task.
async fn start_router(
    fakes: Vec<(Option<&'static str>, String)>,
    routed: Arc<Mutex<Vec<Routed>>>,
) -> (String, JoinHandle<()>) {
    let route = Route {
        fakes: Arc::new(fakes),
        http: http_client(),
        routed,
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
    let messages = parts.method == Method::POST && parts.uri.path() == "/v1/messages";
    let (n, (_, base)) = route
        .fakes
        .iter()
        .enumerate()
        .find(|(_, (prompt, _))| prompt.is_some_and(|p| messages && opens_with(&body, p)))
        .unwrap_or((0, &route.fakes[0]));
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
    route
        .routed
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(Routed {
            method: parts.method.clone(),
            path: parts.uri.path().to_owned(),
            to: if n == 0 {
                "parent".to_owned()
            } else {
                format!("sub-agent {n}")
            },
            headers: parts.headers.clone(),
            body,
        });
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
        .filter(|r| r.method == "POST" && r.path == "/v1/messages" && r.status == 200)
        .collect()
}

/// Blocks of `kind` in a request's messages.
pub(crate) fn count_blocks(messages: &Value, kind: &str) -> usize {
    messages
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["content"].as_array())
        .flatten()
        .filter(|b| b["type"] == kind)
        .count()
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
/// and the verdict at its head; each sub-agent's conversation, in its `Agent` call's function,
/// opening with its prompt, holding its tool calls and ending with its answer.
async fn assert_recorded(app: &mut TestApp, session: &str, script: &Script) {
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
            if m.role == pb::Role::User as i32 && text_of(&m.parts).contains(script.prompt))),
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
    assert_eq!(
        called,
        script.parent_call_ids(),
        "the parent's tool calls, each once and in order: {lines:#?}"
    );
    assert!(
        lines
            .last()
            .is_some_and(|l| l.starts_with("assistant: ") && l.ends_with(script.final_answer())),
        "the verdict is the head: {lines:#?}"
    );
    let functions: Vec<(String, String)> = nodes
        .iter()
        .filter_map(|n| match kind(n) {
            Some(Kind::FunctionCall(f)) => Some((f.call_id, n.node_id.clone())),
            _ => None,
        })
        .collect();
    let agent_calls: Vec<String> = script
        .parent
        .iter()
        .enumerate()
        .filter(|(_, s)| matches!(s, Step::Agent(_)))
        .map(|(i, _)| format!("toolu_ctxd_p{:02}", i + 1))
        .collect();
    assert_eq!(
        functions.iter().map(|(c, _)| c.clone()).collect::<Vec<_>>(),
        agent_calls,
        "one function per sub-agent: {lines:#?}"
    );
    for (n, ((_, function), sub)) in functions.iter().zip(&script.subs).enumerate() {
        let chain = app
            .client
            .render(pb::RenderRequest {
                session_id: session.to_owned(),
                target: Some(pb::render_request::Target::FunctionId(function.clone())),
                callers: pb::Callers::None as i32,
                ..Default::default()
            })
            .await
            .expect("render a sub-agent's conversation")
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
                .is_some_and(|m| text_of(&m.parts).contains(sub.prompt)),
            "the function's chain opens with the sub-agent's prompt: {shown:#?}"
        );
        let sub_calls: Vec<String> = chain
            .iter()
            .flat_map(|m| m.tool_calls.iter().map(|c| c.call_id.clone()))
            .collect();
        let expected: Vec<String> = (1..sub.steps.len())
            .map(|k| format!("toolu_ctxd_{}{k:02}", sub_letter(n)))
            .collect();
        assert_eq!(
            sub_calls, expected,
            "the function's chain holds the sub-agent's tool calls: {shown:#?}"
        );
        let answer = match sub.steps.last() {
            Some(Step::Answer(text)) => *text,
            _ => unreachable!("a sub-agent ends with its answer"),
        };
        assert!(
            // After its thinking, when it thought.
            chain.last().is_some_and(
                |m| m.role == pb::Role::Assistant as i32 && text_of(&m.parts).ends_with(answer)
            ),
            "the function's chain ends with the sub-agent's answer: {shown:#?}"
        );
    }
}

// ---------------------------------------------------------------- the corpus

/// Writes the straight run's model-call bodies, in the order Claude Code sent them, as
/// `NN.json` under [`CORPUS`], and the `anthropic-beta` header each went with as `NN.beta`:
/// byte for byte but for the run's temp dirs, which become `{{WORK}}`, `{{HOME}}`,
/// `{{TMPDIR}}` and their parent `{{TMP}}`, and the name Claude Code makes of the work dir for
/// its own files (each character but a letter or digit a `-`), `{{WORK_SLUG}}`. A thinking
/// block's signature covers its prefix, paths and all: each is signed again over the scrubbed
/// prefix, as the provider would have signed it there.
fn write_corpus(run: &Run) {
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join(THINKING_CORPUS);
    std::fs::create_dir_all(&out).expect("the corpus dir");
    for old in std::fs::read_dir(&out).expect("the corpus dir").flatten() {
        if old
            .path()
            .extension()
            .is_some_and(|e| e == "json" || e == "beta")
        {
            std::fs::remove_file(old.path()).expect("an old corpus file");
        }
    }
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
        let body = resigned(&body);
        std::fs::write(out.join(format!("{n:02}.json")), body).expect("write a corpus body");
        let beta = r
            .headers
            .get_all("anthropic-beta")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect::<Vec<_>>()
            .join(",");
        std::fs::write(out.join(format!("{n:02}.beta")), beta).expect("write a corpus beta");
    }
}

/// `body` with every thinking block's signature what the provider gives it where it stands,
/// each other byte as it was: in order, each signed over the blocks before it as re-signed.
fn resigned(body: &str) -> String {
    let mut value: Value = serde_json::from_str(body).expect("the scrubbed body is JSON");
    let mut out = body.to_owned();
    let messages = value["messages"].as_array().map_or(0, Vec::len);
    for m in 0..messages {
        let blocks = value["messages"][m]["content"]
            .as_array()
            .map_or(0, Vec::len);
        for b in 0..blocks {
            let block = &value["messages"][m]["content"][b];
            let (Some("thinking"), Some(old)) =
                (block["type"].as_str(), block["signature"].as_str())
            else {
                continue;
            };
            let old = old.to_owned();
            let new = thinking_signature(&value, m, b, block["thinking"].as_str());
            out = out.replacen(&old, &new, 1);
            value["messages"][m]["content"][b]["signature"] = Value::String(new);
        }
    }
    serde_json::from_str::<Value>(&out).expect("the re-signed body is JSON");
    out
}

/// The bodies of the corpus in `dir`, in order, with the `anthropic-beta` each was sent with.
fn corpus(dir: &str) -> Vec<(String, String)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("the corpus {} ({e})", dir.display()))
        .map(|e| e.expect("a corpus entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no bodies in {}", dir.display());
    files
        .iter()
        .map(|f| {
            let body = std::fs::read_to_string(f).expect("read a corpus body");
            let beta = std::fs::read_to_string(f.with_extension("beta"))
                .unwrap_or_else(|_| CLAUDE_CODE_BETAS.replace(char::is_whitespace, ""));
            (body, beta)
        })
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
/// conversation (the parent's) answers [`FINAL`], of any other the sub-agent's answer.
fn implied_answers(bodies: &[Value]) -> Vec<Reply> {
    let script = Script::reports();
    let sub_answer = match script.subs[0].steps.last() {
        Some(Step::Answer(text)) => *text,
        _ => unreachable!("a sub-agent ends with its answer"),
    };
    let first = |b: &Value| unmarked(&b["messages"][0]);
    bodies
        .iter()
        .enumerate()
        .map(|(n, body)| {
            let sent = body["messages"].as_array().map_or(0, Vec::len);
            let next = bodies[n + 1..].iter().find(|b| first(b) == first(body));
            let Some(next) = next else {
                let parent = first(body) == first(&bodies[0]);
                return Reply::text(if parent { FINAL } else { sub_answer });
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
                    // The fake signs it again where it answers.
                    Some("thinking") => Block::Thinking {
                        thinking: b["thinking"].as_str().unwrap_or_default().into(),
                        signature: String::new(),
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
    replay(CORPUS).await;
}

/// The same with thinking on: every block the fake signed reaches it again after its prefix.
#[tokio::test]
async fn claude_code_thinking_corpus_replays_through_the_gateway() {
    replay(THINKING_CORPUS).await;
}

async fn replay(dir: &str) {
    let corpus = corpus(dir);
    let raw: Vec<&String> = corpus.iter().map(|(body, _)| body).collect();
    let bodies: Vec<Value> = raw
        .iter()
        .map(|b| serde_json::from_str(b).expect("a corpus body is JSON"))
        .collect();
    if dir == THINKING_CORPUS {
        assert!(
            count_blocks(&bodies[bodies.len() - 1]["messages"], "thinking") > 0,
            "Claude Code sends its thinking back"
        );
    }
    let fake = FakeProvider::start().await;
    fake.script_all(implied_answers(&bodies));
    let mut gw = start_full(fake, None, GatewayPolicy::default(), Options::default()).await;

    let mut sessions = Vec::new();
    for (n, (body, beta)) in corpus.iter().enumerate() {
        let answer = gw
            .post(
                "/v1/messages?beta=true",
                &[
                    ("anthropic-version", "2023-06-01"),
                    ("x-api-key", "sk-test"),
                    ("anthropic-beta", beta),
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
    assert_eq!(gw.fake.refusals(), 0, "no thinking block was refused");
    // The sub-agent's conversation is the `Agent` call's function, in the run's one session.
    let parent = sessions[0].clone();
    sessions.sort();
    sessions.dedup();
    assert_eq!(
        sessions,
        std::slice::from_ref(&parent),
        "one session for the run"
    );
    assert_recorded(&mut gw.app, &parent, &Script::reports()).await;
}

// ---------------------------------------------------------------- the client

/// The Claude Code CLI, or `None` (the test skips) when it is missing and not required.
fn claude() -> Option<PathBuf> {
    crate::agents::installed(
        "Claude Code",
        "claude",
        "CTXD_TEST_CLAUDE",
        "@anthropic-ai/claude-code",
    )
}

// ---------------------------------------------------------------- a compaction

/// Claude Code 2.1.332 across an automatic compaction (its README says how captured).
const COMPACTED_CORPUS: &str = "testdata/gateway/corpus/claude-code-2.1.332-compacted";

/// Claude Code's summary request, then the conversation after it, opening with the summary or
/// with the files it read again before the summary: either continues the session and branch,
/// its summary laid over what it replaced.
#[tokio::test]
async fn claude_code_compactions_link_wherever_the_summary_sits() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(COMPACTED_CORPUS);
    let read = |name: &str| std::fs::read(dir.join(name)).expect("a corpus body");
    for continued in ["01-continued.json", "02-continued-files-first.json"] {
        let fake = FakeProvider::start().await;
        fake.script(Reply::text(
            "<analysis>a</analysis>\n<summary>\n1. Primary Request: read the reports.\n\
             2. Files read: report-01.txt to report-08.txt.\n</summary>",
        ));
        fake.script(Reply::text("Done reading."));
        let mut gw = start_full(fake, None, GatewayPolicy::default(), Options::default()).await;
        let headers = [
            ("anthropic-version", "2023-06-01"),
            ("x-api-key", "sk-test"),
            ("anthropic-beta", CLAUDE_CODE_BETAS),
        ];
        let headers: Vec<(&str, String)> = headers
            .iter()
            .map(|(k, v)| (*k, v.replace(char::is_whitespace, "")))
            .collect();
        let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let asked = gw
            .post(
                "/v1/messages?beta=true",
                &headers,
                read("00-summary-request.json"),
            )
            .await
            .ok();
        let after = gw
            .post("/v1/messages?beta=true", &headers, read(continued))
            .await
            .ok();
        assert_eq!(
            (after.session(), after.branch()),
            (asked.session(), asked.branch()),
            "{continued}: the conversation after the compaction continues the session and branch"
        );
        let session = crate::agents::only_session(&mut gw.app, continued).await;
        let listed = gw.app.list_summaries(&session, &after.branch()).await;
        assert_eq!(listed.summaries.len(), 1, "{continued}: {listed:?}");
        assert_eq!(listed.summaries[0].model, "agent:claude-code");
        assert!(
            listed.summaries[0]
                .text
                .contains("This session is being continued from a previous conversation"),
            "{continued}: the summary laid is Claude Code's"
        );
        assert_eq!(gw.app.get_session(&session).await.compaction_count, 1);
    }
}
