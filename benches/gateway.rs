//! The model gateway (`ctxd serve --gateway`): `cargo bench --bench gateway`.
//!
//! Everything talks HTTP on 127.0.0.1:0 to the scripted fake provider of
//! `tests/common/fake_provider.rs` (each API priced by its provider's cache model, stated in that
//! file's docs), either directly (the baseline, measured in the same run) or through the gateway
//! of a ctxd server in this process (`ctxd::server::serve_with` over a SQLite file in a temp dir).
//! The fake's clock never moves here: no cache entry expires during a run. The prefix model is
//! also priced on the sessions' clock (`common/clock.rs`, as the economy bench's): each call at
//! its trace's measured or drawn time, a call more than five minutes after the one before finding
//! its cache expired; the gateway itself is not told that time, so it takes none of the steps an
//! expiry would make free.
//! Measured:
//!
//! - **economy**: every trace of `testdata/traces` replayed as a client that resends its whole
//!   history on every model call, as Claude Code does: before each assistant message of the trace
//!   an Anthropic Messages request (model `claude-sonnet-4-5`, `max_tokens` 8192, streamed, the
//!   trace's leading system message as `system`, else a fixed prompt, as one text block) carries
//!   every earlier message (assistant text and `tool_use` blocks; tool results as `tool_result`
//!   blocks, the consecutive ones in one user message), with Claude Code's cache breakpoints: a
//!   `cache_control` marker on the system block and one on the newest message's last block, moved
//!   there on every call (the traces carry no tool definitions, so no tool is sent or marked).
//!   The fake answers with exactly that assistant message (its text and its calls, with the
//!   trace's ids), so the next request's history is what the gateway recorded. Once directly to
//!   the fake, then (cache cleared) through the gateway, one session per trace
//!   (`x-ctxd-session: <trace name>`). The cost is the cache-weighted input (uncached 1×, cache
//!   writes 1.25×, 1-hour writes 2×, reads 0.1×), summed over calls; the ratio is gateway over
//!   direct, per trace family and in total, under two cache models:
//!   - the **breakpoint cache** (Anthropic's): what the fake billed each call, the traces being
//!     Anthropic requests;
//!   - the **prefix cache** (OpenAI's automatic one, no markers, from 1,024 tokens in steps of
//!     128): the same requests priced again. Each request body the fake received (direct, or as
//!     the gateway forwarded it) goes through the fake's own `PrefixCache` (one per replay run,
//!     as the fake keeps one cache per run), its blocks as the items of the prefix. Pricing the
//!     recorded bodies, rather than replaying against an OpenAI route, keeps both models on
//!     byte-for-byte the same calls: an OpenAI replay would price a different document (the
//!     gateway converting formats) and would double the run.
//! - **records**: nodes stored (read back over gRPC `ListBranches` and `Log`, every branch) over
//!   the messages the client sent (the trace's messages up to its last assistant answer, system
//!   messages aside); branches and sessions made; calls that went through unrecorded (answers
//!   without `x-ctxd-session-id`, and the `ctxd_gateway_passthrough_total` metric).
//! - **responses (codex trace)**: `testdata/gateway/codex-openprintkit-1031.jsonl` (a Codex CLI
//!   session, kept out of `testdata/traces` so the other benches and tests leave it alone)
//!   replayed as Codex replays a session over the Responses API: before each assistant message
//!   a `POST /v1/responses` (model `gpt-5-codex`, streamed, `store: false`, `prompt_cache_key`
//!   the trace's name, which the gateway takes as the session) carries the whole `input` so far:
//!   a developer message with the fixed prompt first, user messages as `input_text`, every
//!   earlier answer as the client read it from the stream's `response.output_item.done` items
//!   and serialised again as Codex 0.34 does (`message` items with `role` and `output_text`
//!   parts, `function_call` items with `name`, `arguments` and `call_id`: the provider's `id`,
//!   `status` and `annotations` dropped), and tool results as `function_call_output` items. The
//!   fake answers each call with the trace's assistant message, as for the other traces; no
//!   `x-ctxd-session` header. The same figures as above, under the prefix cache only (the
//!   Responses API's own; Codex places no markers), from the Responses usage (uncached
//!   `input_tokens` − `cached_tokens`, cache reads `cached_tokens`, no cache writes); messages
//!   sent counts the developer message and each trace message once (an answer of text and a
//!   call is one message in two items). When nodes ≠ messages or a session has more than one
//!   branch, the calls that moved to another branch and the stored forks (the sibling nodes
//!   where two branches part) are printed.
//! - **latency**: a zero-latency fake; a history of about 10k and about 100k tokens (the head of
//!   `cc-main-4d5611e5`, characters / 4) resent with one new user message per request (and the
//!   previous answer), so each request appends one or two nodes. Direct, through the gateway, and
//!   through the gateway with `x-ctxd-policy: passthrough` (a diagnostic: recorded, not
//!   rendered), and through a bare proxy in this process (a diagnostic: axum in, reqwest out,
//!   `TCP_NODELAY`, nothing recorded: the floor of one more HTTP hop), in turn, on keep-alive
//!   connections; p50 and p99 of the time until the answer is complete, until its first body
//!   byte and until its head, and what each adds to the direct call.
//! - **memory**: the `ctxd` binary (`ctxd serve --gateway`) as a child process; 16 streamed
//!   requests of about 100k tokens each (distinct sessions) held open by the fake (paused after
//!   its first events) while the server's VmRSS is read from `/proc/<pid>/status`; VmRSS idle,
//!   during, after, and VmHWM. Then a fresh server given one body of 50 MiB in 10 tool results
//!   of 5 MiB, forwarded and recorded: how far its VmHWM rose over its idle VmRSS, over the
//!   body's size.
//!
//! Arguments (after `--`): `--per-call TRACE` (repeatable) prints every call of that trace in
//! both replays (the Codex trace too, with the branch each gateway call went to);
//! `--skip-latency` and `--skip-memory` leave those parts out. The Codex replay resends each
//! answer's output items as they came (`id`, `status`, `annotations` kept), as Codex CLI 0.171
//! does (tests/api/gateway_codex.rs runs it); `--responses-stripped` (a diagnostic) resends them
//! without those fields, as older Codex versions serialised them, which the gateway records as a
//! fork per call (the stored answer and the resent one differ). Prints one table and a line per
//! goal, and writes both to `target/bench/gateway.json`.

#[path = "gateway/capacity.rs"]
mod capacity;
#[path = "common/clock.rs"]
mod clock;
#[path = "../tests/common/fake_provider.rs"]
mod fake_provider;
#[path = "common/report.rs"]
mod report;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::io::BufRead;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ctxd::api::pb;
use ctxd::gateway::Gateway;
use ctxd::store::Store;
use fake_provider::{
    Bill, Block, FIVE_MINUTES, FakeProvider, PrefixCache, Recorded, Reply,
    anthropic_message_of_sse, anthropic_units, responses_of_sse,
};
use metrics_exporter_prometheus::PrometheusHandle;
use pb::context_store_client::ContextStoreClient;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::Channel;

type Client = ContextStoreClient<Channel>;

const MODEL: &str = "claude-sonnet-4-5";
const MAX_TOKENS: u32 = 8192;
/// The system prompt of traces that have none of their own (Claude Code does not record its).
const SYSTEM: &str = "You are an interactive coding agent. You help the user with software \
    engineering tasks in their repository: read files, run commands, edit code, and report what \
    you did. Use the tools available to you; be concise.";
/// The Codex CLI trace replayed over the Responses API, its model, and its row group.
const CODEX_TRACE: &str = "testdata/gateway/codex-openprintkit-1031.jsonl";
const CODEX_MODEL: &str = "gpt-5-codex";
const RESPONSES_GROUP: &str = "responses (codex trace)";
/// The text every answer of the latency and memory cases says.
const ANSWER: &str = "Done; what next?";

/// Goals.
const ECONOMY_GOAL: f64 = 0.45;
/// Time added over the direct call: p50 and p99 at 100k tokens, p50 at 1M, and to the first byte.
const ADDED_P50_GOAL_MS: f64 = 1.0;
const ADDED_P99_GOAL_MS: f64 = 3.0;
const ADDED_1M_P50_GOAL_MS: f64 = 2.0;
const TTFB_ADDED_GOAL_MS: f64 = 1.0;
/// The gateway's CPU per call over a bare proxy's, many conversations at once.
const CPU_GOAL: f64 = 3.0;

/// Latency: the trace the histories come from, their sizes in tokens (chars / 4), the untimed
/// rounds first and the timed rounds (each round: one request per arm).
const LATENCY_TRACE: &str = "cc-main-4d5611e5";
const LATENCY_SIZES: [usize; 3] = [10_000, 100_000, 1_000_000];
/// Histories over this many tokens ask for the million-token window, as Claude Code's 1M
/// sessions do (`anthropic-beta: context-1m-…`).
const WIDE_WINDOW_OVER: usize = 200_000;
const LATENCY_WARMUP: usize = 10;
const LATENCY_ROUNDS: usize = 200;

/// Memory: streams held open at once, and tokens each: many of a common size, and a few of a
/// million-token conversation.
const MEMORY_RUNS: [(usize, usize); 2] = [(16, 100_000), (4, 1_000_000)];
/// The large body: this many tool results of [`LARGE_PART`] bytes each.
const LARGE_PARTS: usize = 10;
const LARGE_PART: usize = 5 * 1024 * 1024;
/// The most a large body may raise the server's peak memory, over its size.
const LARGE_GOAL: f64 = 2.0;
/// RSS samples while the streams are open, and their spacing.
const RSS_SAMPLES: usize = 10;
const RSS_EVERY: Duration = Duration::from_millis(50);

/// The most any one request, start or wait may take before the bench gives up on it.
const PATIENCE: Duration = Duration::from_secs(60);
/// The most chunks one answer may come in.
const MAX_CHUNKS: usize = 1_000_000;
/// How long the bench waits for the gateway's last answers to be appended.
const SETTLE: Duration = Duration::from_secs(5);
const MAX_MESSAGE: usize = 256 * 1024 * 1024;

fn main() {
    // The capacity run's bare proxy, in a process of its own (see `capacity`).
    let mut argv = std::env::args().skip(1);
    if argv.next().as_deref() == Some("--bare-proxy") {
        capacity::serve_bare_proxy(argv.next().unwrap_or_else(|| fail("--bare-proxy UPSTREAM")));
    }
    let args = Args::parse();
    // A diagnostic: `RUST_LOG=ctxd::gateway=debug` prints the gateway's phase timings.
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .try_init();
    }
    let _ = rustls::crypto::ring::default_provider().install_default();
    let metrics = ctxd::metrics::install().ok();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(run(args, metrics));
}

struct Args {
    per_call: Vec<String>,
    skip_latency: bool,
    skip_memory: bool,
    /// Leaves the replays (economy, records, Responses, models) out: a diagnostic for the
    /// latency, capacity and memory parts.
    skip_economy: bool,
    skip_capacity: bool,
    /// The Codex replay resends answers' items as they came (a diagnostic).
    verbatim: bool,
}

impl Args {
    fn parse() -> Self {
        let mut args = Args {
            per_call: Vec::new(),
            skip_latency: false,
            skip_memory: false,
            skip_economy: false,
            skip_capacity: false,
            verbatim: true,
        };
        let mut it = std::env::args().skip(1);
        while let Some(arg) = it.next() {
            match arg.as_str() {
                "--per-call" => args
                    .per_call
                    .push(it.next().unwrap_or_else(|| fail("--per-call TRACE"))),
                "--skip-latency" => args.skip_latency = true,
                "--skip-memory" => args.skip_memory = true,
                "--skip-economy" => args.skip_economy = true,
                "--skip-capacity" => args.skip_capacity = true,
                "--responses-stripped" => args.verbatim = false,
                // `cargo bench` passes this to every bench target.
                "--bench" => {}
                other => fail(&format!("unknown argument {other}")),
            }
        }
        args
    }
}

fn fail(message: &str) -> ! {
    eprintln!("gateway bench: {message}");
    std::process::exit(2);
}

async fn run(args: Args, metrics: Option<PrometheusHandle>) {
    let run_start = Instant::now();
    let traces = load_traces(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("testdata/traces"));
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "ctxd gateway benchmark: {} traces, {} model calls; fake provider and gateway in process \
         on 127.0.0.1, SQLite in a temp dir; {cores} cores",
        traces.len(),
        traces.iter().map(|t| t.calls.len()).sum::<usize>()
    );

    let fake = FakeProvider::start().await;
    let tmp = tempfile::tempdir().expect("a temp dir");
    let server = Server::start(&tmp.path().join("gateway.db"), &fake.url()).await;
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .build()
        .expect("an HTTP client");
    let mut grpc = connect(server.grpc).await;

    // ---- economy: direct, then through the gateway.
    let replayed: &[Trace] = if args.skip_economy { &[] } else { &traces };
    let direct_url = format!("{}/v1/messages", fake.url());
    let gateway_url = format!("http://{}/v1/messages", server.gateway);
    let started = Instant::now();
    let mut direct = Vec::new();
    let mut prefix = PrefixCache::default();
    let mut clocked = Clocked::new();
    for trace in replayed {
        direct.push(
            replay(
                &http,
                &direct_url,
                &fake,
                &mut prefix,
                &mut clocked,
                trace,
                false,
                MODEL,
            )
            .await,
        );
    }
    let direct_took = started.elapsed();
    fake.clear_cache();
    let before = metric_values(metrics.as_ref());
    let started = Instant::now();
    let mut via = Vec::new();
    let mut prefix = PrefixCache::default();
    let mut clocked = Clocked::new();
    for trace in replayed {
        via.push(
            replay(
                &http,
                &gateway_url,
                &fake,
                &mut prefix,
                &mut clocked,
                trace,
                true,
                MODEL,
            )
            .await,
        );
    }
    let via_took = started.elapsed();
    let passthrough_metric = metric_diff(&before, &metric_values(metrics.as_ref()));
    println!(
        "economy replays: direct {:.1} s, through the gateway {:.1} s",
        direct_took.as_secs_f64(),
        via_took.as_secs_f64()
    );

    // ---- what the gateway stored.
    let mut stored = Vec::new();
    for (trace, run) in traces.iter().zip(&via) {
        stored.push(stored_nodes(&mut grpc, run.session.as_deref(), trace.sent).await);
    }
    let sessions = count_sessions(&mut grpc).await;

    // ---- responses (codex trace): direct, then through the gateway.
    let mut codex = CodexTrace::load(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(CODEX_TRACE));
    if args.skip_economy {
        codex.lines.clear();
        codex.replies.clear();
    }
    fake.clear_cache();
    let started = Instant::now();
    let (codex_direct, _) = replay_responses(
        &http,
        &format!("{}/v1/responses", fake.url()),
        &fake,
        &codex,
        false,
        args.verbatim,
    )
    .await;
    let codex_direct_took = started.elapsed();
    fake.clear_cache();
    let before = metric_values(metrics.as_ref());
    let started = Instant::now();
    let (codex_via, codex_branches) = replay_responses(
        &http,
        &format!("http://{}/v1/responses", server.gateway),
        &fake,
        &codex,
        true,
        args.verbatim,
    )
    .await;
    let codex_via_took = started.elapsed();
    let codex_passthrough = metric_diff(&before, &metric_values(metrics.as_ref()));
    let codex_stored = stored_nodes(&mut grpc, codex_via.session.as_deref(), codex.sent).await;
    let codex_sessions = count_sessions(&mut grpc).await.saturating_sub(sessions);

    // ---- the same traces as models that bind their thinking and read their cache cheaper:
    // the gateway steps as the provider's edit, priced at each model's reads.
    let sweep = model_sweep(
        &http,
        &fake,
        &direct_url,
        &gateway_url,
        replayed,
        &direct,
        &via,
    )
    .await;
    let resend = if args.verbatim {
        "answers resent as they came, as Codex CLI 0.171 does"
    } else {
        "answers resent without id, status and annotations (--responses-stripped)"
    };
    println!(
        "{RESPONSES_GROUP} replays ({}, {} calls over POST /v1/responses, {resend}): direct \
         {:.1} s, through the gateway {:.1} s",
        codex.name,
        codex.replies.len(),
        codex_direct_took.as_secs_f64(),
        codex_via_took.as_secs_f64()
    );

    println!();
    println!(
        "costs: breakpoint cache (Anthropic, as the fake priced the calls); prefix: the same \
         requests priced by OpenAI's automatic prefix cache"
    );
    println!(
        "| {:<32} | {:>5} | {:>12} | {:>12} | {:>7} | {:>12} | {:>12} | {:>7} | {:>5} | {:>8} | {:>8} |",
        "trace",
        "calls",
        "cost direct",
        "cost gateway",
        "ratio",
        "prefix dir.",
        "prefix gw.",
        "ratio",
        "nodes",
        "messages",
        "branches"
    );
    for ((trace, (d, v)), s) in traces.iter().zip(direct.iter().zip(&via)).zip(&stored) {
        println!(
            "| {:<32} | {:>5} | {:>12.0} | {:>12.0} | {:>6.3}× | {:>12.0} | {:>12.0} | {:>6.3}× | {:>5} | {:>8} | {:>8} |",
            trace.name,
            trace.calls.len(),
            d.cost(),
            v.cost(),
            v.cost() / d.cost(),
            d.prefix_cost(),
            v.prefix_cost(),
            v.prefix_cost() / d.prefix_cost(),
            s.nodes,
            trace.sent,
            s.branches.len()
        );
    }
    for (trace, (d, v)) in traces.iter().zip(direct.iter().zip(&via)) {
        for problem in d.problems.iter().chain(&v.problems) {
            println!("  problem: {}: {problem}", trace.name);
        }
    }
    println!("\n{RESPONSES_GROUP}, POST /v1/responses, {resend}:");
    println!(
        "| {:<32} | {:>5} | {:>12} | {:>12} | {:>7} | {:>5} | {:>8} | {:>8} |",
        "trace", "calls", "cost direct", "cost gateway", "ratio", "nodes", "messages", "branches"
    );
    println!(
        "| {:<32} | {:>5} | {:>12.0} | {:>12.0} | {:>6.3}× | {:>5} | {:>8} | {:>8} |",
        codex.name,
        codex_via.calls.len(),
        codex_direct.cost(),
        codex_via.cost(),
        codex_via.cost() / codex_direct.cost(),
        codex_stored.nodes,
        codex.sent,
        codex_stored.branches.len()
    );
    for problem in codex_direct.problems.iter().chain(&codex_via.problems) {
        println!("  problem: {}: {problem}", codex.name);
    }
    if codex_stored.nodes != codex.sent || codex_stored.branches.len() > 1 {
        explain_records(
            &mut grpc,
            codex_via.session.as_deref(),
            &codex_branches,
            &codex_stored,
            codex.sent,
        )
        .await;
    }
    for name in &args.per_call {
        if *name == codex.name {
            print_calls(
                name,
                "input items",
                &codex_direct,
                &codex_via,
                Some(&codex_branches),
            );
        } else {
            per_call(&traces, &direct, &via, name);
        }
    }

    // ---- latency.
    let latency_fake = FakeProvider::start().await;
    latency_fake.set_default(Reply::text(ANSWER));
    let latency_server = Server::start(&tmp.path().join("latency.db"), &latency_fake.url()).await;
    let (proxy, proxy_task) = start_proxy(latency_fake.url(), http.clone()).await;
    let source = traces
        .iter()
        .find(|t| t.name == LATENCY_TRACE)
        .unwrap_or_else(|| fail(&format!("no trace {LATENCY_TRACE}")));
    let mut latencies = Vec::new();
    for size in LATENCY_SIZES.into_iter().filter(|_| !args.skip_latency) {
        let history = source.history(size);
        latencies.push(
            latency(
                &http,
                &latency_fake,
                &latency_server,
                proxy,
                &source.system,
                &history,
                size,
            )
            .await,
        );
    }
    latency_server.stop().await;
    proxy_task.abort();

    // ---- capacity: many conversations at once, ctxd's gateway and a bare proxy as processes.
    let capacities = if args.skip_capacity {
        Vec::new()
    } else {
        let history = source.history(capacity::TOKENS);
        capacity::capacity(&http, &source.system, &history).await
    };

    // ---- memory.
    let mut memories = Vec::new();
    for (streams, tokens) in MEMORY_RUNS {
        memories.push(if args.skip_memory {
            Err("skipped (--skip-memory)".to_owned())
        } else {
            let history = source.history(tokens);
            memory(&http, &source.system, &history, streams, tokens).await
        });
    }
    let large = if args.skip_memory {
        Err("skipped (--skip-memory)".to_owned())
    } else {
        large_body(&http).await
    };

    server.stop().await;

    // ---- the table.
    let mut rows: Vec<Row> = Vec::new();
    let families: Vec<&str> = report::FAMILIES
        .iter()
        .map(|(_, f)| *f)
        .filter(|f| traces.iter().any(|t| t.family == *f))
        .collect();
    // (calls, cost under the breakpoint model, under the prefix model, prompt tokens)
    let sum = |runs: &[Replay], pick: &dyn Fn(&Trace) -> bool| -> (usize, f64, f64, u64, f64) {
        runs.iter().zip(&traces).filter(|(_, t)| pick(t)).fold(
            (0, 0.0, 0.0, 0, 0.0),
            |(n, c, x, p, k), (r, _)| {
                (
                    n + r.calls.len(),
                    c + r.cost(),
                    x + r.prefix_cost(),
                    p + r.prompt(),
                    k + r.clocked_cost(),
                )
            },
        )
    };
    let mut economy_total = 0.0;
    let mut economy_prefix_total = 0.0;
    for family in families.iter().map(Some).chain([None]) {
        let pick = |t: &Trace| family.is_none_or(|f| t.family == *f);
        let traces_in = traces.iter().filter(|t| pick(t)).count();
        let (n, cost_d, prefix_d, prompt_d, clocked_d) = sum(&direct, &pick);
        let (_, cost_v, prefix_v, prompt_v, clocked_v) = sum(&via, &pick);
        let name = family.map_or("all traces".to_owned(), |f| (*f).to_owned());
        let ratio = cost_v / cost_d;
        let prefix_ratio = prefix_v / prefix_d;
        if family.is_none() {
            economy_total = ratio;
            economy_prefix_total = prefix_ratio;
        }
        rows.push(Row {
            section: "economy",
            case: format!(
                "{name} ({traces_in} traces): cache-weighted cost, breakpoint cache (Anthropic)"
            ),
            n: Some(n),
            value: format!("{:.0} → {:.0}", cost_d, cost_v),
            ratio: Some(ratio),
            to: "direct".into(),
            ..Row::default()
        });
        rows.push(Row {
            section: "economy",
            case: format!("{name}: cache-weighted cost, prefix cache (OpenAI)"),
            n: Some(n),
            value: format!("{:.0} → {:.0}", prefix_d, prefix_v),
            ratio: Some(prefix_ratio),
            to: "direct".into(),
            ..Row::default()
        });
        rows.push(Row {
            section: "economy",
            case: format!("{name}: the same on the sessions' clock (gateway not told the time)"),
            n: Some(n),
            value: format!("{:.0} → {:.0}", clocked_d, clocked_v),
            ratio: Some(clocked_v / clocked_d),
            to: "direct".into(),
            ..Row::default()
        });
        rows.push(Row {
            section: "economy",
            case: format!("{name}: prompt tokens sent upstream"),
            n: Some(n),
            value: format!("{prompt_d} → {prompt_v}"),
            ratio: Some(prompt_v as f64 / prompt_d as f64),
            to: "direct".into(),
            ..Row::default()
        });
    }
    let total_nodes: usize = stored.iter().map(|s| s.nodes).sum();
    let total_sent: usize = traces.iter().map(|t| t.sent).sum();
    for family in families.iter().map(Some).chain([None]) {
        let pick = |t: &Trace| family.is_none_or(|f| t.family == *f);
        let (nodes, sent) = traces
            .iter()
            .zip(&stored)
            .filter(|(t, _)| pick(t))
            .fold((0, 0), |(n, m), (t, s)| (n + s.nodes, m + t.sent));
        rows.push(Row {
            section: "records",
            case: format!(
                "{}: nodes stored / messages sent",
                family.map_or("all traces", |f| f)
            ),
            value: format!("{nodes} / {sent}"),
            ratio: Some(nodes as f64 / sent as f64),
            to: "messages".into(),
            ..Row::default()
        });
    }
    let branch_counts: Vec<usize> = stored.iter().map(|s| s.branches.len()).collect();
    let max_branches = branch_counts.iter().copied().max().unwrap_or(0);
    let mean_branches = branch_counts.iter().sum::<usize>() as f64 / branch_counts.len() as f64;
    rows.push(Row {
        section: "records",
        case: "branches per session (max, mean)".into(),
        n: Some(branch_counts.len()),
        value: format!("{max_branches}, {mean_branches:.2}"),
        ..Row::default()
    });
    rows.push(Row {
        section: "records",
        case: "sessions made / traces replayed".into(),
        value: format!("{sessions} / {}", traces.len()),
        ..Row::default()
    });
    let unrecorded: usize = via.iter().map(|r| r.unrecorded).sum();
    rows.push(Row {
        section: "records",
        case: "answers without x-ctxd-session-id (unrecorded)".into(),
        value: unrecorded.to_string(),
        ..Row::default()
    });
    rows.push(Row {
        section: "records",
        case: "ctxd_gateway_passthrough_total".into(),
        value: if metrics.is_none() {
            "no recorder".into()
        } else if passthrough_metric.is_empty() {
            "0".into()
        } else {
            passthrough_metric
                .iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        },
        ..Row::default()
    });
    let codex_calls = codex_via.calls.len();
    rows.push(Row {
        section: RESPONSES_GROUP,
        case: format!("{} ({codex_calls} calls): cache-weighted cost", codex.name),
        n: Some(codex_calls),
        value: format!("{:.0} → {:.0}", codex_direct.cost(), codex_via.cost()),
        ratio: Some(codex_via.cost() / codex_direct.cost()),
        to: "direct".into(),
        ..Row::default()
    });
    rows.push(Row {
        section: RESPONSES_GROUP,
        case: "prompt tokens sent upstream".into(),
        n: Some(codex_calls),
        value: format!("{} → {}", codex_direct.prompt(), codex_via.prompt()),
        ratio: Some(codex_via.prompt() as f64 / codex_direct.prompt() as f64),
        to: "direct".into(),
        ..Row::default()
    });
    rows.push(Row {
        section: RESPONSES_GROUP,
        case: "nodes stored / messages sent".into(),
        value: format!("{} / {}", codex_stored.nodes, codex.sent),
        ratio: Some(codex_stored.nodes as f64 / codex.sent as f64),
        to: "messages".into(),
        ..Row::default()
    });
    rows.push(Row {
        section: RESPONSES_GROUP,
        case: "branches of its session".into(),
        value: codex_stored.branches.len().to_string(),
        ..Row::default()
    });
    rows.push(Row {
        section: RESPONSES_GROUP,
        case: "sessions made / traces replayed".into(),
        value: format!("{codex_sessions} / 1"),
        ..Row::default()
    });
    rows.push(Row {
        section: RESPONSES_GROUP,
        case: "answers without x-ctxd-session-id (unrecorded)".into(),
        value: codex_via.unrecorded.to_string(),
        ..Row::default()
    });
    rows.push(Row {
        section: RESPONSES_GROUP,
        case: "ctxd_gateway_passthrough_total".into(),
        value: if metrics.is_none() {
            "no recorder".into()
        } else if codex_passthrough.is_empty() {
            "0".into()
        } else {
            codex_passthrough
                .iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        },
        ..Row::default()
    });
    for l in &latencies {
        for (a, (arm, stats)) in l.arms.iter().enumerate() {
            let base = &l.arms[0].1;
            let what = format!("{}k tokens ({} msgs), {arm}", l.size / 1000, l.messages);
            for metric in [Metric::Complete, Metric::FirstByte, Metric::Head] {
                rows.push(Row {
                    section: "latency",
                    case: format!("{what}: {}", metric.name()),
                    n: Some(stats.samples(metric).len()),
                    p50: Some(stats.p(metric, 0.50)),
                    p99: Some(stats.p(metric, 0.99)),
                    value: if a == 0 {
                        String::new()
                    } else {
                        format!(
                            "{:+.2} / {:+.2} ms",
                            stats.p(metric, 0.50) - base.p(metric, 0.50),
                            stats.p(metric, 0.99) - base.p(metric, 0.99)
                        )
                    },
                    to: if a == 0 {
                        "baseline".into()
                    } else {
                        "added p50 / p99".into()
                    },
                    ..Row::default()
                });
            }
        }
    }
    for memory in &memories {
        match memory {
            Ok(m) => {
                let what = format!("{} streams × {}k tokens", m.streams, m.tokens / 1000);
                for (case, kib) in [
                    ("VmRSS idle", m.idle_kib),
                    (
                        "VmRSS during (max of samples while all streams are open)",
                        m.during_kib,
                    ),
                    ("VmRSS after the streams ended", m.after_kib),
                    ("VmHWM (peak)", m.hwm_kib),
                ] {
                    rows.push(Row {
                        section: "memory",
                        case: format!("{what}: {case}"),
                        value: format!("{:.1} MiB", kib as f64 / 1024.0),
                        ..Row::default()
                    });
                }
                let per_stream = (m.during_kib as f64 - m.idle_kib as f64) / m.streams as f64;
                // A request's body is its tokens × 4 bytes, about.
                let body_kib = (m.tokens * 4) as f64 / 1024.0;
                rows.push(Row {
                    section: "memory",
                    case: format!("{what}: during − idle, per open stream"),
                    value: format!("{:.2} MiB", per_stream / 1024.0),
                    ratio: Some(per_stream / body_kib),
                    to: "its body's size".into(),
                    ..Row::default()
                });
            }
            Err(why) => rows.push(Row {
                section: "memory",
                case: "not measured".into(),
                value: why.clone(),
                ..Row::default()
            }),
        }
    }
    for c in &capacities {
        let bare = capacities.iter().find(|b| b.arm == "bare proxy");
        let what = format!(
            "{} conversations × {}k tokens, {}",
            capacity::CONVERSATIONS,
            capacity::TOKENS / 1000,
            c.arm
        );
        rows.push(Row {
            section: "capacity",
            case: format!("{what}: calls per second"),
            n: Some(c.calls),
            value: format!("{:.1}", c.calls_per_second()),
            ratio: bare
                .filter(|b| b.arm != c.arm)
                .map(|b| c.calls_per_second() / b.calls_per_second()),
            to: "bare proxy".into(),
            ..Row::default()
        });
        rows.push(Row {
            section: "capacity",
            case: format!("{what}: server CPU per call"),
            n: Some(c.calls),
            value: format!("{:.2} ms", c.cpu_per_call() * 1e3),
            ratio: bare
                .filter(|b| b.arm != c.arm)
                .map(|b| c.cpu_per_call() / b.cpu_per_call()),
            to: "bare proxy".into(),
            ..Row::default()
        });
        for f in c.failures.iter().take(5) {
            println!("  capacity problem: {}: {f}", c.arm);
        }
    }

    let large_ratio = match &large {
        Ok(l) => {
            let ratio = l.peak_over_idle_kib() as f64 * 1024.0 / l.body_bytes as f64;
            rows.push(Row {
                section: "memory",
                case: format!(
                    "one body of {:.0} MiB in {LARGE_PARTS} tool results: VmHWM − VmRSS idle ({:.1} → {:.1} MiB)",
                    l.body_bytes as f64 / 1024.0 / 1024.0,
                    l.idle_kib as f64 / 1024.0,
                    l.hwm_kib as f64 / 1024.0,
                ),
                value: format!("{:.1} MiB", l.peak_over_idle_kib() as f64 / 1024.0),
                ratio: Some(ratio),
                to: "the body's size".into(),
                ..Row::default()
            });
            ratio
        }
        Err(why) => {
            rows.push(Row {
                section: "memory",
                case: "one large body: not measured".into(),
                value: why.clone(),
                ..Row::default()
            });
            f64::NAN
        }
    };

    println!();
    print_table(&rows);

    // ---- the goals.
    let nodes_ratio = total_nodes as f64 / total_sent as f64;
    let at = |size: usize| latencies.iter().find(|l| l.size == size);
    let added_at = |size: usize, metric: Metric, q: f64| {
        at(size).map_or(f64::NAN, |l| {
            l.arms[1].1.p(metric, q) - l.arms[0].1.p(metric, q)
        })
    };
    let cpu_of = |arm: &str| {
        capacities
            .iter()
            .find(|c| c.arm == arm)
            .map_or(f64::NAN, capacity::Capacity::cpu_per_call)
    };
    let cpu_ratio = cpu_of("gateway") / cpu_of("bare proxy");
    // `None`: not measured in this run.
    let within = |v: f64, goal: f64| (!v.is_nan()).then_some(v <= goal);
    let replayed_goal = |met: bool| (!args.skip_economy).then_some(met);
    let goals: Vec<(String, String, String, Option<bool>)> = vec![
        (
            "economy: cache-weighted cost through the gateway over direct, all traces, \
             breakpoint cache (Anthropic)"
                .into(),
            format!("{economy_total:.3}×"),
            format!("≤ {ECONOMY_GOAL}×"),
            replayed_goal(economy_total <= ECONOMY_GOAL),
        ),
        (
            "economy: the same, prefix cache (OpenAI)".into(),
            format!("{economy_prefix_total:.3}×"),
            format!("≤ {ECONOMY_GOAL}×"),
            replayed_goal(economy_prefix_total <= ECONOMY_GOAL),
        ),
        (
            "records: nodes stored / messages sent, all traces".into(),
            format!("{nodes_ratio:.4} ({total_nodes} / {total_sent})"),
            "exactly 1.0".into(),
            replayed_goal(total_nodes == total_sent),
        ),
        (
            "records: branches per session".into(),
            format!("max {max_branches}"),
            "1".into(),
            replayed_goal(max_branches == 1),
        ),
        (
            "latency: added at 100k tokens, p50".into(),
            format!("{:.2} ms", added_at(100_000, Metric::Complete, 0.5)),
            format!("≤ {ADDED_P50_GOAL_MS} ms"),
            within(added_at(100_000, Metric::Complete, 0.5), ADDED_P50_GOAL_MS),
        ),
        (
            "latency: added at 100k tokens, p99".into(),
            format!("{:.2} ms", added_at(100_000, Metric::Complete, 0.99)),
            format!("≤ {ADDED_P99_GOAL_MS} ms"),
            within(added_at(100_000, Metric::Complete, 0.99), ADDED_P99_GOAL_MS),
        ),
        (
            "latency: added at 1000k tokens, p50".into(),
            format!("{:.2} ms", added_at(1_000_000, Metric::Complete, 0.5)),
            format!("≤ {ADDED_1M_P50_GOAL_MS} ms"),
            within(
                added_at(1_000_000, Metric::Complete, 0.5),
                ADDED_1M_P50_GOAL_MS,
            ),
        ),
        (
            "latency: time to first byte added at 100k tokens, p50".into(),
            format!("{:.2} ms", added_at(100_000, Metric::FirstByte, 0.5)),
            format!("≤ {TTFB_ADDED_GOAL_MS} ms"),
            within(
                added_at(100_000, Metric::FirstByte, 0.5),
                TTFB_ADDED_GOAL_MS,
            ),
        ),
        (
            format!(
                "capacity: server CPU per call at {} conversations, gateway over bare proxy",
                capacity::CONVERSATIONS
            ),
            format!("{cpu_ratio:.2}×"),
            format!("≤ {CPU_GOAL}×"),
            within(cpu_ratio, CPU_GOAL),
        ),
        (
            format!(
                "memory: peak over idle for one {} MiB body, over its size",
                LARGE_PARTS * LARGE_PART / 1024 / 1024
            ),
            format!("{large_ratio:.2}×"),
            format!("≤ {LARGE_GOAL}×"),
            within(large_ratio, LARGE_GOAL),
        ),
    ];
    println!("\ngoals:");
    for (what, value, goal, ok) in &goals {
        println!(
            "  [{}] {what}: {value} (goal {goal})",
            match ok {
                Some(true) => "met",
                Some(false) => "NOT MET",
                None => "not measured",
            }
        );
    }

    // ---- the JSON.
    let out_dir = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(
            || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"),
            PathBuf::from,
        )
        .join("bench");
    std::fs::create_dir_all(&out_dir).expect("create target/bench");
    let document = json!({
        "bench": "gateway",
        "cores": cores,
        "rows": rows.iter().map(Row::json).collect::<Vec<_>>(),
        "models": sweep.iter().map(|r| json!({
            "model": r.model, "read": r.read, "breakpoint": r.breakpoint,
            "prefix_clocked": r.clocked, "highest_trace": r.highest.0, "highest": r.highest.1,
        })).collect::<Vec<_>>(),
        "goals": goals.iter().map(|(what, value, goal, ok)| json!({
            "what": what, "value": value, "goal": goal, "met": ok,
        })).collect::<Vec<_>>(),
        "traces": traces.iter().zip(direct.iter().zip(&via)).zip(&stored).map(|((t, (d, v)), s)| json!({
            "name": t.name,
            "family": t.family,
            "calls": t.calls.len(),
            "cost_direct": d.cost(),
            "cost_gateway": v.cost(),
            "ratio": v.cost() / d.cost(),
            "prefix_cost_direct": d.prefix_cost(),
            "prefix_cost_gateway": v.prefix_cost(),
            "prefix_ratio": v.prefix_cost() / d.prefix_cost(),
            "prompt_direct": d.prompt(),
            "prompt_gateway": v.prompt(),
            "messages_sent": t.sent,
            "nodes_stored": s.nodes,
            "branches": s.branches.iter().collect::<Vec<_>>(),
            "unrecorded": v.unrecorded,
            "problems": d.problems.iter().chain(&v.problems).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "passthrough_metric": passthrough_metric,
        "responses": json!({
            "group": RESPONSES_GROUP,
            "name": codex.name,
            "file": CODEX_TRACE,
            "model": CODEX_MODEL,
            "resend": if args.verbatim { "verbatim" } else { "stripped" },
            "calls": codex_calls,
            "cost_direct": codex_direct.cost(),
            "cost_gateway": codex_via.cost(),
            "ratio": codex_via.cost() / codex_direct.cost(),
            "prompt_direct": codex_direct.prompt(),
            "prompt_gateway": codex_via.prompt(),
            "messages_sent": codex.sent,
            "nodes_stored": codex_stored.nodes,
            "branches": codex_stored.branches,
            "sessions_made": codex_sessions,
            "unrecorded": codex_via.unrecorded,
            "passthrough_metric": codex_passthrough,
            "branch_moves": branch_moves(&codex_branches)
                .iter()
                .map(|(k, from, to)| json!({"call": k, "from": from, "to": to}))
                .collect::<Vec<_>>(),
            "problems": codex_direct.problems.iter().chain(&codex_via.problems).collect::<Vec<_>>(),
        }),
        "memory": memories.iter().map(|m| m.as_ref().map_or_else(|e| json!({"error": e}), |m| json!({
            "idle_kib": m.idle_kib, "during_kib": m.during_kib, "after_kib": m.after_kib,
            "hwm_kib": m.hwm_kib, "streams": m.streams, "tokens_each": m.tokens,
        }))).collect::<Vec<_>>(),
        "capacity": capacities.iter().map(|c| json!({
            "arm": c.arm, "conversations": capacity::CONVERSATIONS, "tokens": capacity::TOKENS,
            "calls": c.calls, "seconds": c.seconds, "cpu_seconds": c.cpu_seconds,
            "failures": c.failures,
        })).collect::<Vec<_>>(),
        "large_body": large.as_ref().map_or_else(|e| json!({"error": e}), |l| json!({
            "body_bytes": l.body_bytes, "idle_kib": l.idle_kib, "hwm_kib": l.hwm_kib,
        })),
        "run_seconds": run_start.elapsed().as_secs_f64(),
    });
    let out = out_dir.join("gateway.json");
    std::fs::write(
        &out,
        serde_json::to_string_pretty(&document).expect("JSON") + "\n",
    )
    .expect("write target/bench/gateway.json");
    println!(
        "\nwrote target/bench/gateway.json; whole run {:.1} s",
        run_start.elapsed().as_secs_f64()
    );
}

// ---------------------------------------------------------------- traces

/// One line of a neutral JSONL trace.
#[derive(Deserialize)]
struct Line {
    role: String,
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<LineCall>>,
    #[serde(default)]
    tool_call_id: Option<String>,
    #[serde(default)]
    is_error: Option<bool>,
}

#[derive(Deserialize)]
struct LineCall {
    id: String,
    name: String,
    arguments: String,
}

/// A trace as the client sends it.
struct Trace {
    name: String,
    family: &'static str,
    system: String,
    /// Every message up to the last assistant one, in the Messages API's form, and serialised.
    messages: Vec<Value>,
    plain: Vec<String>,
    /// Whether a message is the trace's assistant answer (the rest: user text and results).
    calls: Vec<Call>,
    /// Trace messages the client sends (system messages aside), answers included.
    sent: usize,
}

impl Trace {
    /// Whether each call follows a human turn (the message before it is the user's own, not a
    /// tool's result), for the clock's draw.
    fn human_turns(&self) -> Vec<bool> {
        self.calls
            .iter()
            .map(|c| {
                c.prefix.checked_sub(1).is_some_and(|i| {
                    let m = &self.messages[i];
                    m["role"] == "user"
                        && !m["content"]
                            .as_array()
                            .is_some_and(|b| b.iter().any(|b| b["type"] == "tool_result"))
                })
            })
            .collect()
    }
}

/// One model call: the client sends `messages[..prefix]`, the fake answers `reply`.
struct Call {
    prefix: usize,
    reply: Vec<Block>,
}

fn load_traces(dir: &Path) -> Vec<Trace> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| fail(&format!("read {}: {e}", dir.display())))
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
        .collect();
    files.sort();
    if files.is_empty() {
        fail(&format!("no *.jsonl in {}", dir.display()));
    }
    files.iter().map(|f| Trace::load(f)).collect()
}

/// The lines of a neutral JSONL trace, and its name (the file's stem).
fn read_lines(file: &Path) -> (String, Vec<Line>) {
    let text = std::fs::read_to_string(file)
        .unwrap_or_else(|e| fail(&format!("read {}: {e}", file.display())));
    let lines: Vec<Line> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            serde_json::from_str(l).unwrap_or_else(|e| fail(&format!("{}: {e}", file.display())))
        })
        .collect();
    let name = file
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    (name, lines)
}

/// A trace's call arguments as a tool input: the object they are, else wrapped in one.
fn tool_input(arguments: &str) -> Value {
    match serde_json::from_str::<Value>(arguments) {
        Ok(v @ Value::Object(_)) => v,
        Ok(other) => json!({ "value": other }),
        Err(_) => json!({ "arguments": arguments }),
    }
}

/// A trace's leading system messages (how many, and their text: the system prompt, or a stand-in
/// when there is none) and the index of its last assistant message, the last call replayed.
fn opening(name: &str, lines: &[Line]) -> (usize, String, usize) {
    let leading = lines.iter().take_while(|l| l.role == "system").count();
    let system = if leading > 0 {
        lines[..leading]
            .iter()
            .map(|l| l.content.clone().unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n\n")
    } else {
        SYSTEM.to_owned()
    };
    let last_answer = lines
        .iter()
        .rposition(|l| l.role == "assistant")
        .unwrap_or_else(|| fail(&format!("{name}: no assistant message")));
    (leading, system, last_answer)
}

impl Trace {
    fn load(file: &Path) -> Self {
        let (name, lines) = read_lines(file);
        let family = report::family(&name);
        let (leading, system, last_answer) = opening(&name, &lines);
        let mut messages: Vec<Value> = Vec::new();
        let mut calls = Vec::new();
        let mut sent = 0;
        // Whether the last message is a user message of tool results (the next result joins it).
        let mut results_open = false;
        for line in &lines[leading..=last_answer] {
            let content = line.content.clone().unwrap_or_default();
            match line.role.as_str() {
                "user" | "system" => {
                    let text = if line.role == "system" {
                        format!("[system] {content}")
                    } else {
                        content
                    };
                    messages
                        .push(json!({"role": "user", "content": [{"type": "text", "text": text}]}));
                    results_open = false;
                }
                "assistant" => {
                    if messages.is_empty() {
                        // The API's first message is the user's.
                        messages.push(json!({"role": "user", "content": [{"type": "text", "text": "Begin."}]}));
                        sent += 1;
                    }
                    let mut reply = Vec::new();
                    let mut blocks = Vec::new();
                    if !content.is_empty() {
                        reply.push(Block::Text(content.clone()));
                        blocks.push(json!({"type": "text", "text": content}));
                    }
                    for call in line.tool_calls.iter().flatten() {
                        let input = tool_input(&call.arguments);
                        reply.push(Block::ToolUse {
                            id: call.id.clone(),
                            name: call.name.clone(),
                            input: input.clone(),
                        });
                        blocks.push(json!({"type": "tool_use", "id": call.id, "name": call.name, "input": input}));
                    }
                    calls.push(Call {
                        prefix: messages.len(),
                        reply,
                    });
                    messages.push(json!({"role": "assistant", "content": blocks}));
                    results_open = false;
                }
                "tool" => {
                    let mut block = json!({
                        "type": "tool_result",
                        "tool_use_id": line.tool_call_id.clone().unwrap_or_default(),
                        "content": content,
                    });
                    if line.is_error == Some(true) {
                        block["is_error"] = json!(true);
                    }
                    if results_open {
                        let last = messages.last_mut().expect("a results message");
                        if let Some(Value::Array(blocks)) = last.get_mut("content") {
                            blocks.push(block);
                        }
                    } else {
                        messages.push(json!({"role": "user", "content": [block]}));
                        results_open = true;
                    }
                }
                other => fail(&format!("{name}: unknown role {other}")),
            }
            sent += 1;
        }
        let plain = messages.iter().map(Value::to_string).collect();
        Trace {
            name,
            family,
            system,
            messages,
            plain,
            calls,
            sent,
        }
    }

    /// The request body of a call that sends `messages[..prefix]`.
    fn body(&self, prefix: usize, model: &str) -> String {
        request_body_as(
            model,
            &self.system,
            &self.plain[..prefix - 1],
            &self.messages[prefix - 1],
        )
    }

    /// The longest head of the messages of at most `tokens` tokens (serialised characters / 4)
    /// that ends right before an assistant message (so no call is left unanswered). A history
    /// longer than the trace goes on with the trace again, its call ids renamed per round (a
    /// result answers the call of its own round).
    fn history(&self, tokens: usize) -> Vec<Value> {
        let mut out: Vec<Value> = Vec::new();
        let mut chars = 0;
        let mut end = 0;
        'rounds: for round in 0usize.. {
            for (i, m) in self.messages.iter().enumerate() {
                if chars / 4 > tokens {
                    break 'rounds;
                }
                if m["role"] == "assistant" && !out.is_empty() {
                    end = out.len();
                }
                chars += self.plain[i].len();
                out.push(if round == 0 {
                    m.clone()
                } else {
                    renamed(m, round)
                });
            }
        }
        out.truncate(end);
        out
    }
}

/// `message` with its call ids (`tool_use` ids and the results' `tool_use_id`) made its
/// `round`'s own.
fn renamed(message: &Value, round: usize) -> Value {
    let mut m = message.clone();
    if let Some(Value::Array(blocks)) = m.get_mut("content") {
        for block in blocks {
            for key in ["id", "tool_use_id"] {
                if let Some(Value::String(id)) = block.get_mut(key) {
                    *id = format!("{id}-r{round}");
                }
            }
        }
    }
    m
}

/// A Messages API request: the fixed fields, `earlier` messages as serialised, and `last`.
/// Cache breakpoints where Claude Code puts them: on the (last) system block, and on the newest
/// message's last block, the one marker that moves every call. Without them the provider
/// caches nothing.
fn request_body(system: &str, earlier: &[String], last: &Value) -> String {
    request_body_as(MODEL, system, earlier, last)
}

/// [`request_body`] as a request of `model`.
fn request_body_as(model: &str, system: &str, earlier: &[String], last: &Value) -> String {
    let marker = json!({"type": "ephemeral"});
    let mut last = last.clone();
    if let Some(Value::Array(blocks)) = last.get_mut("content")
        && let Some(Value::Object(block)) = blocks.last_mut()
    {
        block.insert("cache_control".into(), marker.clone());
    }
    let head = json!({
        "model": model,
        "max_tokens": MAX_TOKENS,
        "system": [{"type": "text", "text": system, "cache_control": marker}],
        "stream": true,
    })
    .to_string();
    let size = head.len() + earlier.iter().map(|m| m.len() + 1).sum::<usize>() + 4096;
    let mut body = String::with_capacity(size);
    body.push_str(&head[..head.len() - 1]);
    body.push_str(",\"messages\":[");
    for m in earlier {
        body.push_str(m);
        body.push(',');
    }
    body.push_str(&last.to_string());
    body.push_str("]}");
    body
}

// ---------------------------------------------------------------- HTTP

/// What came back from one request.
struct Answer {
    status: u16,
    session: Option<String>,
    branch: Option<String>,
    head: Duration,
    first: Duration,
    total: Duration,
    body: Vec<u8>,
}

fn request(
    http: &reqwest::Client,
    url: &str,
    session: Option<&str>,
    policy: Option<&str>,
    body: String,
) -> reqwest::RequestBuilder {
    let mut request = http
        .post(url)
        .header("content-type", "application/json")
        .header("anthropic-version", "2023-06-01")
        .header("x-api-key", "sk-ant-bench")
        .body(body);
    if let Some(s) = session {
        request = request.header("x-ctxd-session", s);
    }
    if let Some(p) = policy {
        request = request.header("x-ctxd-policy", p);
    }
    request
}

/// `request` asking for the million-token window when its history is over
/// [`WIDE_WINDOW_OVER`] tokens, as Claude Code's 1M sessions do.
fn wide(request: reqwest::RequestBuilder, tokens: usize) -> reqwest::RequestBuilder {
    if tokens > WIDE_WINDOW_OVER {
        request.header("anthropic-beta", "context-1m-2025-08-07")
    } else {
        request
    }
}

fn header(response: &reqwest::Response, name: &str) -> Option<String> {
    response
        .headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// Sends a request and reads its answer to the end.
async fn post(
    http: &reqwest::Client,
    url: &str,
    session: Option<&str>,
    policy: Option<&str>,
    body: String,
) -> Result<Answer, String> {
    let start = Instant::now();
    send(start, request(http, url, session, policy, body)).await
}

/// Sends `request` (built since `start`) and reads its answer to the end.
async fn send(start: Instant, request: reqwest::RequestBuilder) -> Result<Answer, String> {
    let mut response = tokio::time::timeout(PATIENCE, request.send())
        .await
        .map_err(|_| "no answer in time".to_owned())?
        .map_err(|e| format!("send: {e}"))?;
    let head = start.elapsed();
    let status = response.status().as_u16();
    let ctxd_session = header(&response, "x-ctxd-session-id");
    let branch = header(&response, "x-ctxd-branch");
    let mut first = None;
    let mut bytes = Vec::new();
    for _ in 0..MAX_CHUNKS {
        match tokio::time::timeout(PATIENCE, response.chunk()).await {
            Ok(Ok(Some(chunk))) => {
                first.get_or_insert_with(|| start.elapsed());
                bytes.extend_from_slice(&chunk);
            }
            Ok(Ok(None)) => {
                let total = start.elapsed();
                return Ok(Answer {
                    status,
                    session: ctxd_session,
                    branch,
                    head,
                    first: first.unwrap_or(total),
                    total,
                    body: bytes,
                });
            }
            Ok(Err(e)) => return Err(format!("body: {e}")),
            Err(_) => return Err("the answer stalled".into()),
        }
    }
    Err("an answer in too many chunks".into())
}

// ---------------------------------------------------------------- economy

/// What one call cost: as the fake priced it (its API's cache model), and the same request
/// priced by OpenAI's automatic prefix cache.
#[derive(Clone, Copy, Default)]
struct Usage {
    bill: Bill,
    prefix: Bill,
    /// The same request priced by the prefix model on the session's clock (`clock.rs`), where a
    /// call more than five minutes after the one before finds its cache expired.
    clocked: Bill,
    /// Messages and bytes of the request the fake received.
    messages: usize,
    bytes: usize,
}

impl Usage {
    fn cost(&self) -> f64 {
        self.bill.cost()
    }

    fn prompt(&self) -> u64 {
        self.bill.prompt()
    }
}

struct Replay {
    calls: Vec<Usage>,
    /// Answers without `x-ctxd-session-id` (through the gateway only).
    unrecorded: usize,
    session: Option<String>,
    branches: BTreeSet<String>,
    problems: Vec<String>,
}

impl Replay {
    fn new() -> Self {
        Replay {
            calls: Vec::new(),
            unrecorded: 0,
            session: None,
            branches: BTreeSet::new(),
            problems: Vec::new(),
        }
    }

    /// Notes the session and branch the gateway's answer to call `k` names.
    fn track(&mut self, k: usize, answer: &Answer) {
        match &answer.session {
            Some(s) => {
                if self.session.as_ref().is_some_and(|old| old != s) {
                    self.problems.push(format!(
                        "call {k}: session {s}, earlier calls {}",
                        self.session.as_deref().unwrap_or_default()
                    ));
                }
                self.session = Some(s.clone());
            }
            None => self.unrecorded += 1,
        }
        if let Some(b) = &answer.branch {
            self.branches.insert(b.clone());
        }
    }

    fn cost(&self) -> f64 {
        self.calls.iter().map(Usage::cost).sum()
    }

    /// The cost under the prefix model (the Anthropic replays' requests priced again).
    fn prefix_cost(&self) -> f64 {
        self.calls.iter().map(|u| u.prefix.cost()).sum()
    }

    fn clocked_cost(&self) -> f64 {
        self.calls.iter().map(|u| u.clocked.cost()).sum()
    }

    fn prompt(&self) -> u64 {
        self.calls.iter().map(Usage::prompt).sum()
    }
}

/// Replays `trace` against `url`, the fake answering each call with the trace's answer; each
/// request the fake received is also priced by `prefix` (a prefix cache kept over the run, as
/// the fake keeps its own).
#[allow(clippy::too_many_arguments)]
async fn replay(
    http: &reqwest::Client,
    url: &str,
    fake: &FakeProvider,
    prefix: &mut PrefixCache,
    clocked: &mut Clocked,
    trace: &Trace,
    gateway: bool,
    model: &str,
) -> Replay {
    let mut run = Replay::new();
    let (times, _) = clocked.clock.times(&trace.name, &trace.human_turns());
    // Each trace an hour after the last: no cache of one serves the next.
    let start = clocked.now + Duration::from_secs(3600);
    for (k, call) in trace.calls.iter().enumerate() {
        clocked.now = start + Duration::from_millis(u64::try_from(times[k]).unwrap_or(0));
        fake.clear_requests();
        fake.set_default(Reply::blocks(call.reply.clone()));
        // One session per trace and model: a sweep's replays never extend another's.
        let name = if model == MODEL {
            trace.name.clone()
        } else {
            format!("{}@{model}", trace.name)
        };
        let session = gateway.then_some(name.as_str());
        let answer = match post(http, url, session, None, trace.body(call.prefix, model)).await {
            Ok(a) => a,
            Err(e) => {
                run.problems.push(format!("call {k}: {e}"));
                run.calls.push(Usage::default());
                continue;
            }
        };
        if answer.status != 200 {
            run.problems.push(format!(
                "call {k}: status {}: {}",
                answer.status,
                String::from_utf8_lossy(&answer.body[..answer.body.len().min(300)])
            ));
        } else if anthropic_message_of_sse(&answer.body).is_none() {
            run.problems
                .push(format!("call {k}: the streamed answer is not whole"));
        }
        if gateway {
            run.track(k, &answer);
        }
        let requests = fake.requests();
        let usage = match requests.as_slice() {
            [one] => Usage {
                bill: one.bill.unwrap_or_default(),
                prefix: prefix.price(
                    fake.now(),
                    &anthropic_units(&prompt_of(one)),
                    FIVE_MINUTES,
                    one.bill.is_some(),
                ),
                clocked: clocked.cache.price(
                    clocked.now,
                    &anthropic_units(&prompt_of(one)),
                    FIVE_MINUTES,
                    one.bill.is_some(),
                ),
                messages: one.body["messages"].as_array().map_or(0, Vec::len),
                bytes: one.raw.len(),
            },
            other => {
                run.problems.push(format!(
                    "call {k}: the fake received {} requests",
                    other.len()
                ));
                Usage::default()
            }
        };
        drop(requests);
        run.calls.push(usage);
    }
    fake.clear_requests();
    run
}

/// The models of the sweep, with the read price each pays, and the main replay's own.
const SWEEP: [(&str, f64); 3] = [
    (MODEL, 0.1),
    ("claude-opus-5-5", 0.05),
    ("claude-fable-5-1", 0.025),
];

/// One model of the sweep: the breakpoint cache's cost through the gateway over direct, at the
/// model's read price, clock-free and on the sessions' clock (the prefix model priced there),
/// and the trace whose ratio is highest.
struct SweepRow {
    model: &'static str,
    read: f64,
    breakpoint: f64,
    clocked: f64,
    highest: (String, f64),
}

/// Replays every trace as each model of [`SWEEP`] but the main replay's (whose runs are
/// `direct` and `via`), direct and through the gateway, and prices them at that model's reads.
async fn model_sweep(
    http: &reqwest::Client,
    fake: &FakeProvider,
    direct_url: &str,
    gateway_url: &str,
    traces: &[Trace],
    direct: &[Replay],
    via: &[Replay],
) -> Vec<SweepRow> {
    let mut rows = Vec::new();
    for (model, read) in SWEEP {
        let (d, v) = if model == MODEL {
            (Vec::new(), Vec::new())
        } else {
            let mut runs = [Vec::new(), Vec::new()];
            for (n, url) in [direct_url, gateway_url].into_iter().enumerate() {
                fake.clear_cache();
                let mut prefix = PrefixCache::default();
                let mut clocked = Clocked::new();
                for trace in traces {
                    let run = replay(
                        http,
                        url,
                        fake,
                        &mut prefix,
                        &mut clocked,
                        trace,
                        n == 1,
                        model,
                    )
                    .await;
                    runs[n].push(run);
                }
            }
            let [d, v] = runs;
            (d, v)
        };
        let (d, v) = if model == MODEL {
            (direct, via)
        } else {
            (&d[..], &v[..])
        };
        let cost = |runs: &[Replay], clocked: bool| -> f64 {
            runs.iter()
                .flat_map(|r| &r.calls)
                .map(|u| {
                    if clocked {
                        u.clocked.cost_at(read)
                    } else {
                        u.bill.cost_at(read)
                    }
                })
                .sum()
        };
        let mut highest = (String::new(), 0.0);
        for (t, trace) in traces.iter().enumerate() {
            let ratio = cost(&v[t..=t], false) / cost(&d[t..=t], false).max(1e-9);
            if ratio > highest.1 {
                highest = (trace.name.clone(), ratio);
            }
        }
        rows.push(SweepRow {
            model,
            read,
            breakpoint: cost(v, false) / cost(d, false),
            clocked: cost(v, true) / cost(d, true),
            highest,
        });
    }
    println!(
        "the 23 traces as each model, through the gateway / direct, at the model's cache reads \
         (writes 1.25x): breakpoint cache clock-free, prefix cache on the sessions' clock:"
    );
    for r in &rows {
        println!(
            "  {:<18} reads {:.3}x: {:.3}x, on the clock {:.3}x; highest trace {} {:.3}x",
            r.model, r.read, r.breakpoint, r.clocked, r.highest.0, r.highest.1
        );
    }
    rows
}

/// A request as the model read it: its messages after the provider's own edits (a step said
/// as `clear_tool_uses`), which is what a cache serves.
fn prompt_of(request: &Recorded) -> Value {
    if request.prompt.is_null() {
        return request.body.clone();
    }
    let mut body = request.body.clone();
    body["messages"] = request.prompt.clone();
    body
}

/// The prefix cache of a replay on the sessions' clock, and the time of its newest call.
struct Clocked {
    clock: clock::Clock,
    cache: PrefixCache,
    now: Duration,
}

impl Clocked {
    fn new() -> Self {
        Self {
            clock: clock::Clock::load(
                &PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("testdata/claude-code"),
            ),
            cache: PrefixCache::default(),
            now: Duration::ZERO,
        }
    }
}

/// Every call of one trace, in both replays.
fn per_call(traces: &[Trace], direct: &[Replay], via: &[Replay], name: &str) {
    let Some(t) = traces.iter().position(|t| t.name == name) else {
        println!("--per-call: no trace {name}");
        return;
    };
    print_calls(name, "messages", &direct[t], &via[t], None);
}

/// The calls of one trace in both replays; with `branches` (the Responses replay), the branch
/// each gateway call went to (`*`: another than the call before's), and the uncached input in
/// place of cache writes (the API has none). An Anthropic replay also shows each call's cost
/// ratio under the prefix model.
fn print_calls(
    name: &str,
    what: &str,
    direct: &Replay,
    via: &Replay,
    branches: Option<&[Option<String>]>,
) {
    println!("\n{name}: every call (tokens the fake reported; msgs = {what} it received)");
    println!("direct (left) and through the gateway (right); kB: the body the fake received");
    let first = if branches.is_some() {
        "uncached"
    } else {
        "write"
    };
    let shown = |u: &Usage| {
        if branches.is_some() {
            u.bill.input
        } else {
            u.bill.write_5m + u.bill.write_1h
        }
    };
    let mut head = format!(
        "| {:>4} | {:>5} | {:>6} | {:>8} | {:>8} | {:>9} | {:>5} | {:>6} | {:>8} | {:>8} | {:>9} | {:>7} |",
        "call", "msgs", "kB", first, "read", "cost", "msgs", "kB", first, "read", "cost", "ratio"
    );
    if branches.is_some() {
        head.push_str(" branch");
    } else {
        head.push_str(&format!(" {:>7} |", "prefix"));
    }
    println!("{head}");
    for (k, (d, v)) in direct.calls.iter().zip(&via.calls).enumerate() {
        let mut line = format!(
            "| {k:>4} | {:>5} | {:>6} | {:>8} | {:>8} | {:>9.0} | {:>5} | {:>6} | {:>8} | {:>8} | {:>9.0} | {:>6.3}× |",
            d.messages,
            d.bytes / 1000,
            shown(d),
            d.bill.read,
            d.cost(),
            v.messages,
            v.bytes / 1000,
            shown(v),
            v.bill.read,
            v.cost(),
            v.cost() / d.cost()
        );
        if let Some(branches) = branches {
            let this = branches.get(k).cloned().flatten();
            let moved = k > 0 && branches.get(k - 1).cloned().flatten() != this;
            line.push_str(&format!(
                " {}{}",
                if moved { "*" } else { "" },
                this.as_deref().unwrap_or("-")
            ));
        } else {
            line.push_str(&format!(" {:>6.3}× |", v.prefix.cost() / d.prefix.cost()));
        }
        println!("{line}");
    }
}

// ---------------------------------------------------------------- responses (codex trace)

/// The Codex trace as a Responses client replays it.
struct CodexTrace {
    name: String,
    /// The developer message's text: the trace's leading system messages, else the fixed prompt.
    system: String,
    /// The trace's messages after its leading system ones, up to its last assistant message.
    lines: Vec<Line>,
    /// The fake's answer to each call: each assistant message's text and calls, in order.
    replies: Vec<Vec<Block>>,
    /// Input messages the client sends: the developer message and every line (an answer is one
    /// message, whatever items it comes in).
    sent: usize,
}

impl CodexTrace {
    fn load(file: &Path) -> Self {
        let (name, mut lines) = read_lines(file);
        let (leading, system, last_answer) = opening(&name, &lines);
        lines.truncate(last_answer + 1);
        let lines: Vec<Line> = lines.drain(leading..).collect();
        let replies = lines
            .iter()
            .filter(|l| l.role == "assistant")
            .map(|line| {
                let mut reply = Vec::new();
                let content = line.content.clone().unwrap_or_default();
                if !content.is_empty() {
                    reply.push(Block::Text(content));
                }
                for call in line.tool_calls.iter().flatten() {
                    reply.push(Block::ToolUse {
                        id: call.id.clone(),
                        name: call.name.clone(),
                        input: tool_input(&call.arguments),
                    });
                }
                reply
            })
            .collect();
        let sent = 1 + lines.len();
        CodexTrace {
            name,
            system,
            lines,
            replies,
            sent,
        }
    }
}

/// A developer or user message item of one `input_text` part, as Codex sends them.
fn text_item(role: &str, text: &str) -> Value {
    json!({"type": "message", "role": role, "content": [{"type": "input_text", "text": text}]})
}

/// An output item as Codex 0.34 puts it in its next request's `input` (its `ResponseItem`
/// serialised: `codex-rs/protocol/src/models.rs`): a message without its `id` and `status`, its
/// text parts without `annotations` and `logprobs`; a function call as its `name`, `arguments`
/// and `call_id` only; a reasoning item without its `id`; any other item as it came.
fn codex_item(item: &Value) -> Value {
    match item["type"].as_str().unwrap_or_default() {
        "message" => {
            let parts: Vec<Value> = item["content"]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or_default()
                .iter()
                .map(|p| match p["type"].as_str() {
                    Some(t @ ("output_text" | "input_text")) => {
                        json!({"type": t, "text": p["text"]})
                    }
                    _ => p.clone(),
                })
                .collect();
            json!({"type": "message", "role": item["role"], "content": parts})
        }
        "function_call" => json!({
            "type": "function_call",
            "name": item["name"],
            "arguments": item["arguments"],
            "call_id": item["call_id"],
        }),
        "reasoning" => json!({
            "type": "reasoning",
            "summary": item["summary"],
            "encrypted_content": item["encrypted_content"],
        }),
        _ => item.clone(),
    }
}

/// The items Codex resends for an answer of `reply`, as the fake sends it.
fn codex_items_of(reply: &[Block]) -> Vec<Value> {
    reply
        .iter()
        .filter_map(|block| match block {
            Block::Text(text) => Some(json!({
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": text}],
            })),
            Block::ToolUse { id, name, input } => Some(json!({
                "type": "function_call",
                "name": name,
                "arguments": input.to_string(),
                "call_id": id,
            })),
            _ => None,
        })
        .collect()
}

/// A Responses request as Codex sends one: streamed, nothing stored, the session named in
/// `prompt_cache_key`, the `input` so far (items as serialised).
fn responses_body(session: &str, input: &[String]) -> String {
    let head = json!({
        "model": CODEX_MODEL,
        "stream": true,
        "store": false,
        "include": [],
        "prompt_cache_key": session,
    })
    .to_string();
    let size = head.len() + input.iter().map(|i| i.len() + 1).sum::<usize>() + 16;
    let mut body = String::with_capacity(size);
    body.push_str(&head[..head.len() - 1]);
    body.push_str(",\"input\":[");
    for (i, item) in input.iter().enumerate() {
        if i > 0 {
            body.push(',');
        }
        body.push_str(item);
    }
    body.push_str("]}");
    body
}

fn responses_request(http: &reqwest::Client, url: &str, body: String) -> reqwest::RequestBuilder {
    http.post(url)
        .header("content-type", "application/json")
        .header("accept", "text/event-stream")
        .header("authorization", "Bearer sk-bench")
        .header("openai-beta", "responses=experimental")
        .header("originator", "codex_cli_rs")
        .body(body)
}

/// Replays the Codex trace against `url` (a `/v1/responses`), the fake answering each call with
/// the trace's answer and the client resending it as it read it. Also gives the branch each
/// call was recorded on (through the gateway).
async fn replay_responses(
    http: &reqwest::Client,
    url: &str,
    fake: &FakeProvider,
    trace: &CodexTrace,
    gateway: bool,
    verbatim: bool,
) -> (Replay, Vec<Option<String>>) {
    let mut run = Replay::new();
    let mut branches = Vec::new();
    let mut input: Vec<String> = vec![text_item("developer", &trace.system).to_string()];
    let mut replies = trace.replies.iter();
    for line in &trace.lines {
        let content = line.content.as_deref().unwrap_or_default();
        match line.role.as_str() {
            "user" => input.push(text_item("user", content).to_string()),
            "system" => input.push(text_item("developer", content).to_string()),
            "tool" => input.push(
                json!({
                    "type": "function_call_output",
                    "call_id": line.tool_call_id.as_deref().unwrap_or_default(),
                    "output": content,
                })
                .to_string(),
            ),
            "assistant" => {
                let k = run.calls.len();
                let reply = replies.next().expect("a reply per assistant message");
                let expected = codex_items_of(reply);
                fake.clear_requests();
                fake.set_default(Reply::blocks(reply.clone()));
                let body = responses_body(&trace.name, &input);
                let mut read = None;
                let mut branch = None;
                match send(Instant::now(), responses_request(http, url, body)).await {
                    Err(e) => run.problems.push(format!("call {k}: {e}")),
                    Ok(answer) => {
                        if answer.status != 200 {
                            run.problems.push(format!(
                                "call {k}: status {}: {}",
                                answer.status,
                                String::from_utf8_lossy(&answer.body[..answer.body.len().min(300)])
                            ));
                        } else {
                            match responses_of_sse(&answer.body) {
                                Some((response, items)) if response["status"] == "completed" => {
                                    let codex: Vec<Value> = items.iter().map(codex_item).collect();
                                    if codex != expected {
                                        run.problems.push(format!(
                                            "call {k}: the answer read back is not the trace's"
                                        ));
                                    }
                                    read = Some(if verbatim { items } else { codex });
                                }
                                _ => run
                                    .problems
                                    .push(format!("call {k}: the streamed answer is not whole")),
                            }
                        }
                        if gateway {
                            run.track(k, &answer);
                            branch = answer.branch.clone();
                        }
                    }
                }
                // The answer as the client read it (else, a problem told, the trace's).
                input.extend(read.unwrap_or(expected).iter().map(Value::to_string));
                let requests = fake.requests();
                let usage = match requests.as_slice() {
                    // The Responses API is priced by the prefix model already.
                    [one] => Usage {
                        bill: one.bill.unwrap_or_default(),
                        prefix: one.bill.unwrap_or_default(),
                        // The fake's clock does not move in this replay.
                        clocked: one.bill.unwrap_or_default(),
                        messages: one.input().len(),
                        bytes: one.raw.len(),
                    },
                    other => {
                        run.problems.push(format!(
                            "call {k}: the fake received {} requests",
                            other.len()
                        ));
                        Usage::default()
                    }
                };
                drop(requests);
                run.calls.push(usage);
                branches.push(branch);
            }
            other => fail(&format!("{}: unknown role {other}", trace.name)),
        }
    }
    fake.clear_requests();
    (run, branches)
}

/// The calls recorded on another branch than the call before them: (call, from, to).
fn branch_moves(branches: &[Option<String>]) -> Vec<(usize, String, String)> {
    branches
        .windows(2)
        .enumerate()
        .filter(|(_, w)| w[0] != w[1])
        .map(|(k, w)| {
            let name = |b: &Option<String>| b.clone().unwrap_or_else(|| "-".into());
            (k + 1, name(&w[0]), name(&w[1]))
        })
        .collect()
}

/// A stored node with more than one child: where two branches part.
struct Fork {
    /// Nodes before it on its path.
    depth: usize,
    parent: pb::Node,
    /// Its children, oldest first, with the branches through each.
    children: Vec<(pb::Node, Vec<String>)>,
}

/// The forks of `session`, the shallowest first.
async fn forks(client: &mut Client, session: &str) -> Vec<Fork> {
    let branches = client
        .list_branches(pb::ListBranchesRequest {
            session_id: session.to_owned(),
        })
        .await
        .expect("ListBranches")
        .into_inner()
        .branches;
    let mut nodes: BTreeMap<String, pb::Node> = BTreeMap::new();
    let mut through: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for branch in branches.iter().filter(|b| !b.head_id.is_empty()) {
        let mut page_token = String::new();
        for _ in 0..10_000 {
            let page = client
                .log(pb::LogRequest {
                    session_id: session.to_owned(),
                    branch: branch.name.clone(),
                    limit: 1000,
                    page_token: page_token.clone(),
                    ..Default::default()
                })
                .await
                .expect("Log")
                .into_inner();
            for node in page.nodes {
                through
                    .entry(node.node_id.clone())
                    .or_default()
                    .push(branch.name.clone());
                nodes.entry(node.node_id.clone()).or_insert(node);
            }
            if page.next_page_token.is_empty() {
                break;
            }
            page_token = page.next_page_token;
        }
    }
    let mut children: BTreeMap<&str, Vec<&pb::Node>> = BTreeMap::new();
    for node in nodes.values() {
        children
            .entry(node.parent_id.as_str())
            .or_default()
            .push(node);
    }
    let depth = |id: &str| {
        let mut d = 0;
        let mut at = nodes.get(id);
        while let Some(n) = at.filter(|n| !n.parent_id.is_empty()) {
            d += 1;
            at = nodes.get(&n.parent_id);
        }
        d
    };
    let mut out: Vec<Fork> = children
        .iter()
        .filter(|(parent, kids)| !parent.is_empty() && kids.len() > 1)
        .filter_map(|(parent, kids)| {
            let mut kids: Vec<&pb::Node> = kids.clone();
            kids.sort_by_key(|n| n.created_at_unix_ms);
            Some(Fork {
                depth: depth(parent),
                parent: nodes.get(*parent)?.clone(),
                children: kids
                    .into_iter()
                    .map(|n| {
                        let on = through.get(&n.node_id).cloned().unwrap_or_default();
                        (n.clone(), on)
                    })
                    .collect(),
            })
        })
        .collect();
    out.sort_by_key(|f| f.depth);
    out
}

/// A stored node in a line: its kind, role, parts (text and kept JSON clipped to `width`
/// characters) and tool calls.
fn describe(node: &pb::Node, width: usize) -> String {
    use pb::content_part::Part;
    use pb::media::Source;
    use pb::node_input::Kind;
    let clip = |s: &str| {
        if s.chars().count() > width {
            format!("{}…", s.chars().take(width).collect::<String>())
        } else {
            s.to_owned()
        }
    };
    let parts = |parts: &[pb::ContentPart]| {
        parts
            .iter()
            .map(|p| match &p.part {
                Some(Part::Text(t)) => format!("text {:?}", clip(t)),
                Some(Part::Media(m)) => match &m.source {
                    Some(Source::Data(d)) => {
                        format!("{} {}", m.mime_type, clip(&String::from_utf8_lossy(d)))
                    }
                    Some(Source::Url(u)) => format!("{} {}", m.mime_type, clip(u)),
                    None => m.mime_type.clone(),
                },
                None => "(empty part)".into(),
            })
            .collect::<Vec<_>>()
            .join(" | ")
    };
    match node.content.as_ref().and_then(|c| c.kind.as_ref()) {
        Some(Kind::Message(m)) => {
            let calls = m
                .tool_calls
                .iter()
                .map(|c| format!("{} {} {}", c.call_id, c.name, clip(&c.arguments_json)))
                .collect::<Vec<_>>()
                .join(" | ");
            format!(
                "{} message: parts [{}] calls [{calls}]",
                m.role().as_str_name(),
                parts(&m.parts)
            )
        }
        Some(Kind::ToolResult(r)) => format!("tool result {}: [{}]", r.call_id, parts(&r.parts)),
        Some(other) => clip(&format!("{other:?}")),
        None => "(no content)".into(),
    }
}

/// Why the gateway's record of the Codex replay is not one node per message on one branch:
/// the calls that went to another branch, and the first stored forks.
async fn explain_records(
    client: &mut Client,
    session: Option<&str>,
    branches: &[Option<String>],
    stored: &Stored,
    sent: usize,
) {
    println!(
        "\n{RESPONSES_GROUP}: {} nodes stored for {sent} messages sent, {} branches",
        stored.nodes,
        stored.branches.len()
    );
    let moves = branch_moves(branches);
    println!(
        "  {} of {} gateway calls were recorded on another branch than the call before{}",
        moves.len(),
        branches.len(),
        if moves.is_empty() { "" } else { ":" }
    );
    for (k, from, to) in moves.iter().take(6) {
        println!("    call {k}: {from} → {to}");
    }
    if moves.len() > 6 {
        println!("    … and {} more", moves.len() - 6);
    }
    let Some(session) = session else { return };
    let forks = forks(client, session).await;
    println!(
        "  {} stored nodes have more than one child (the stored forks); the first:",
        forks.len()
    );
    for fork in forks.iter().take(2) {
        println!(
            "    after node {} (depth {}): {}",
            fork.parent.node_id,
            fork.depth,
            describe(&fork.parent, 80)
        );
        for (child, on) in &fork.children {
            let on = match on.as_slice() {
                [] => "no branch".to_owned(),
                [one] => one.clone(),
                many => format!("{} branches: {}, …", many.len(), many[..2].join(", ")),
            };
            println!(
                "      child {} (on {on}): {}",
                child.node_id,
                describe(child, 200)
            );
        }
    }
}

// ---------------------------------------------------------------- records

struct Stored {
    nodes: usize,
    branches: Vec<String>,
}

/// The distinct nodes of every branch of `session`, waiting (bounded) for the last answer to be
/// appended: the gateway appends it after the answer is relayed.
async fn stored_nodes(client: &mut Client, session: Option<&str>, expected: usize) -> Stored {
    let Some(session) = session else {
        return Stored {
            nodes: 0,
            branches: Vec::new(),
        };
    };
    let deadline = Instant::now() + SETTLE;
    loop {
        let stored = read_nodes(client, session).await;
        if stored.nodes >= expected || Instant::now() >= deadline {
            return stored;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn read_nodes(client: &mut Client, session: &str) -> Stored {
    let branches = client
        .list_branches(pb::ListBranchesRequest {
            session_id: session.to_owned(),
        })
        .await
        .expect("ListBranches")
        .into_inner()
        .branches;
    let mut ids = HashSet::new();
    for branch in &branches {
        if branch.head_id.is_empty() {
            continue;
        }
        let mut page_token = String::new();
        for _ in 0..10_000 {
            let page = client
                .log(pb::LogRequest {
                    session_id: session.to_owned(),
                    branch: branch.name.clone(),
                    limit: 1000,
                    page_token: page_token.clone(),
                    ..Default::default()
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
    }
    Stored {
        nodes: ids.len(),
        branches: branches.into_iter().map(|b| b.name).collect(),
    }
}

async fn count_sessions(client: &mut Client) -> usize {
    let mut n = 0;
    let mut page_token = String::new();
    for _ in 0..10_000 {
        let page = client
            .list_sessions(pb::ListSessionsRequest {
                page_size: 1000,
                page_token: page_token.clone(),
                ..Default::default()
            })
            .await
            .expect("ListSessions")
            .into_inner();
        n += page.sessions.len();
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    n
}

/// The `ctxd_gateway_*` counters of the recorder, by name and labels.
fn metric_values(handle: Option<&PrometheusHandle>) -> BTreeMap<String, f64> {
    let Some(handle) = handle else {
        return BTreeMap::new();
    };
    handle
        .render()
        .lines()
        .filter(|l| l.starts_with("ctxd_gateway_passthrough_total"))
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_owned(), v.parse().ok()?))
        })
        .collect()
}

fn metric_diff(
    before: &BTreeMap<String, f64>,
    after: &BTreeMap<String, f64>,
) -> BTreeMap<String, f64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, v)| *v != 0.0)
        .collect()
}

// ---------------------------------------------------------------- latency

/// One client conversation: the history, then a new user message and the answer per request.
struct Conversation {
    earlier: Vec<String>,
    last: Value,
    turns: usize,
}

impl Conversation {
    fn new(history: &[Value]) -> Self {
        let mut c = Conversation {
            earlier: history.iter().map(Value::to_string).collect(),
            last: Value::Null,
            turns: 0,
        };
        c.earlier.pop();
        c.last = history.last().cloned().unwrap_or(Value::Null);
        c
    }

    fn push(&mut self, message: Value) {
        if !self.last.is_null() {
            self.earlier.push(self.last.to_string());
        }
        self.last = message;
    }

    /// The next request: a new user message after everything so far.
    fn next(&mut self, system: &str) -> String {
        self.turns += 1;
        let text = format!("Turn {}: carry on with the next step.", self.turns);
        self.push(json!({"role": "user", "content": [{"type": "text", "text": text}]}));
        request_body(system, &self.earlier, &self.last)
    }

    fn answered(&mut self) {
        self.push(json!({"role": "assistant", "content": [{"type": "text", "text": ANSWER}]}));
    }
}

/// What a latency sample times, from the request's start.
#[derive(Clone, Copy)]
enum Metric {
    /// Until the answer is complete.
    Complete,
    /// Until the first byte of its body.
    FirstByte,
    /// Until its status and headers.
    Head,
}

impl Metric {
    fn name(self) -> &'static str {
        match self {
            Metric::Complete => "complete",
            Metric::FirstByte => "first body byte",
            Metric::Head => "response head (diag)",
        }
    }
}

#[derive(Default)]
struct Stats {
    head: Vec<f64>,
    first: Vec<f64>,
    total: Vec<f64>,
}

impl Stats {
    fn samples(&self, metric: Metric) -> &[f64] {
        match metric {
            Metric::Complete => &self.total,
            Metric::FirstByte => &self.first,
            Metric::Head => &self.head,
        }
    }

    /// The `q` quantile in ms (nearest rank).
    fn p(&self, metric: Metric, q: f64) -> f64 {
        let mut v = self.samples(metric).to_vec();
        if v.is_empty() {
            return f64::NAN;
        }
        v.sort_by(f64::total_cmp);
        let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
        v[rank - 1]
    }
}

struct Latency {
    size: usize,
    messages: usize,
    /// Direct first: the baseline.
    arms: Vec<(String, Stats)>,
}

async fn latency(
    http: &reqwest::Client,
    fake: &FakeProvider,
    server: &Server,
    proxy: SocketAddr,
    system: &str,
    history: &[Value],
    size: usize,
) -> Latency {
    let direct_url = format!("{}/v1/messages", fake.url());
    let gateway_url = format!("http://{}/v1/messages", server.gateway);
    let proxy_url = format!("http://{proxy}/v1/messages");
    let tag = format!("latency-{}k", size / 1000);
    let arms: Vec<(&str, &str, Option<String>, Option<&str>)> = vec![
        ("direct", direct_url.as_str(), None, None),
        ("gateway", gateway_url.as_str(), Some(tag.clone()), None),
        (
            "gateway, passthrough policy (diag)",
            gateway_url.as_str(),
            Some(format!("{tag}-passthrough")),
            Some("passthrough"),
        ),
        ("bare proxy (diag)", proxy_url.as_str(), None, None),
    ];
    let mut conversations: Vec<Conversation> =
        arms.iter().map(|_| Conversation::new(history)).collect();
    let mut stats: Vec<Stats> = arms.iter().map(|_| Stats::default()).collect();
    let mut problems = Vec::new();
    for round in 0..LATENCY_WARMUP + LATENCY_ROUNDS {
        for j in 0..arms.len() {
            // Each round starts with another arm, so none always follows the same one.
            let a = (round + j) % arms.len();
            let (_, url, session, policy) = &arms[a];
            let body = conversations[a].next(system);
            fake.clear_requests();
            let start = Instant::now();
            let sent = wide(request(http, url, session.as_deref(), *policy, body), size);
            match send(start, sent).await {
                Ok(answer) if answer.status == 200 => {
                    if round >= LATENCY_WARMUP {
                        stats[a].head.push(answer.head.as_secs_f64() * 1e3);
                        stats[a].first.push(answer.first.as_secs_f64() * 1e3);
                        stats[a].total.push(answer.total.as_secs_f64() * 1e3);
                    }
                    if session.is_some() && answer.session.is_none() {
                        problems.push(format!(
                            "{}: an answer without x-ctxd-session-id",
                            arms[a].0
                        ));
                    }
                }
                Ok(answer) => problems.push(format!(
                    "{}: status {}: {}",
                    arms[a].0,
                    answer.status,
                    String::from_utf8_lossy(&answer.body[..answer.body.len().min(300)])
                )),
                Err(e) => problems.push(format!("{}: {e}", arms[a].0)),
            }
            conversations[a].answered();
        }
    }
    fake.clear_requests();
    for p in problems.iter().take(5) {
        println!("  latency {}k problem: {p}", size / 1000);
    }
    println!(
        "latency {}k: {} rounds of {} requests",
        size / 1000,
        LATENCY_WARMUP + LATENCY_ROUNDS,
        arms.len()
    );
    Latency {
        size,
        messages: history.len(),
        arms: arms.iter().map(|a| a.0.to_owned()).zip(stats).collect(),
    }
}

// ---------------------------------------------------------------- the bare proxy

/// A bare forwarding proxy: the request read whole (any size) and sent on with reqwest, the answer relayed
/// chunk by chunk through a channel (as the gateway relays it), `TCP_NODELAY` on its accepted
/// connections. What one more HTTP hop in this process costs, without recording or rendering.
async fn start_proxy(upstream: String, http: reqwest::Client) -> (SocketAddr, JoinHandle<()>) {
    use axum::serve::ListenerExt;
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the proxy")
        .tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        });
    let addr = axum::serve::Listener::local_addr(&listener).expect("local addr");
    let upstream: std::sync::Arc<str> = upstream.into();
    let app = axum::Router::new()
        .fallback(
            move |uri: axum::http::Uri, headers: axum::http::HeaderMap, body: bytes::Bytes| {
                let http = http.clone();
                let upstream = upstream.clone();
                async move { proxy(&http, &upstream, &uri, &headers, body).await }
            },
        )
        // As the gateway: a body of any size is read (axum's default stops at 2 MB).
        .layer(axum::extract::DefaultBodyLimit::disable());
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (addr, task)
}

async fn proxy(
    http: &reqwest::Client,
    upstream: &str,
    uri: &axum::http::Uri,
    headers: &axum::http::HeaderMap,
    body: bytes::Bytes,
) -> axum::response::Response {
    let mut request = http.post(format!("{upstream}{}", uri.path())).body(body);
    for (name, value) in headers {
        if !["host", "content-length", "connection"].contains(&name.as_str()) {
            request = request.header(name, value);
        }
    }
    let mut response = match request.send().await {
        Ok(r) => r,
        Err(e) => {
            let mut answer = axum::response::Response::new(axum::body::Body::from(e.to_string()));
            *answer.status_mut() = axum::http::StatusCode::BAD_GATEWAY;
            return answer;
        }
    };
    let mut answer = axum::response::Response::builder().status(response.status());
    if let Some(h) = answer.headers_mut() {
        for (name, value) in response.headers() {
            if name != "transfer-encoding" && name != "connection" {
                h.append(name, value.clone());
            }
        }
    }
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<bytes::Bytes, std::io::Error>>(16);
    tokio::spawn(async move {
        for _ in 0..MAX_CHUNKS {
            match response.chunk().await {
                Ok(Some(chunk)) => {
                    if tx.send(Ok(chunk)).await.is_err() {
                        return;
                    }
                }
                Ok(None) => return,
                Err(e) => {
                    let _ = tx.send(Err(std::io::Error::other(e))).await;
                    return;
                }
            }
        }
    });
    answer
        .body(axum::body::Body::from_stream(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        ))
        .expect("a response")
}

// ---------------------------------------------------------------- memory

struct Memory {
    streams: usize,
    tokens: usize,
    idle_kib: u64,
    during_kib: u64,
    after_kib: u64,
    hwm_kib: u64,
}

/// One large request's mark on the server's memory.
struct Large {
    body_bytes: usize,
    idle_kib: u64,
    hwm_kib: u64,
}

impl Large {
    fn peak_over_idle_kib(&self) -> u64 {
        self.hwm_kib.saturating_sub(self.idle_kib)
    }
}

/// A fresh `ctxd serve --gateway` given one request of [`LARGE_PARTS`] tool results of
/// [`LARGE_PART`] bytes each (source-like text, with the newlines and quotes JSON escapes), its
/// answer read whole and the request recorded; VmRSS before it and VmHWM after.
async fn large_body(http: &reqwest::Client) -> Result<Large, String> {
    let fake = FakeProvider::start().await;
    fake.set_default(Reply::text(ANSWER));
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let daemon = start_daemon(dir.path(), &fake.url())?;
    let pid = daemon.child.id();
    let url = format!("http://{}/v1/messages", daemon.gateway);
    let warm = Conversation::new(&[json!({"role": "user", "content": "hello"})]).next_body(SYSTEM);
    let answer = post(http, &url, Some("large-warmup"), None, warm).await?;
    if answer.status != 200 {
        return Err(format!("warm-up request: status {}", answer.status));
    }
    let (idle_kib, _) = status_kib(pid)?;
    let line = "    let value = \"some \\\"quoted\\\" text\"; // a line of a source file\n";
    let part: String = line.repeat(LARGE_PART / line.len() + 1)[..LARGE_PART].to_owned();
    let calls: Vec<Value> = (0..LARGE_PARTS)
        .map(|i| {
            json!({"type": "tool_use", "id": format!("toolu_{i}"), "name": "Read",
            "input": {"file_path": format!("/src/file_{i}.rs")}})
        })
        .collect();
    let results: Vec<Value> = (0..LARGE_PARTS)
        .map(|i| {
            json!({"type": "tool_result", "tool_use_id": format!("toolu_{i}"),
            "content": format!("{i}{}", &part[1..])})
        })
        .collect();
    let body = json!({
        "model": MODEL,
        "max_tokens": MAX_TOKENS,
        "system": SYSTEM,
        "stream": true,
        "messages": [
            {"role": "user", "content": "Read these ten files."},
            {"role": "assistant", "content": calls},
            {"role": "user", "content": results},
        ],
    })
    .to_string();
    let body_bytes = body.len();
    let answer = post(http, &url, Some("large"), None, body).await?;
    if answer.status != 200 {
        return Err(format!(
            "status {}: {}",
            answer.status,
            String::from_utf8_lossy(&answer.body[..answer.body.len().min(300)])
        ));
    }
    // The request and its answer are recorded beside the relay: the peak counts them once
    // they are stored.
    let mut grpc = connect(daemon.grpc).await;
    let stored = stored_nodes(&mut grpc, answer.session.as_deref(), 4).await;
    if stored.nodes < 4 {
        return Err(format!("{} of 4 nodes recorded", stored.nodes));
    }
    let (_, hwm_kib) = status_kib(pid)?;
    drop(daemon);
    println!("memory: one body of {body_bytes} bytes forwarded and recorded");
    Ok(Large {
        body_bytes,
        idle_kib,
        hwm_kib,
    })
}

/// `VmRSS` and `VmHWM` of `pid`, in KiB.
fn status_kib(pid: u32) -> Result<(u64, u64), String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map_err(|e| format!("read /proc/{pid}/status: {e}"))?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
    };
    match (field("VmRSS:"), field("VmHWM:")) {
        (Some(rss), Some(hwm)) => Ok((rss, hwm)),
        _ => Err(format!("no VmRSS/VmHWM in /proc/{pid}/status")),
    }
}

/// The `ctxd serve` child; killed when dropped.
struct Daemon {
    child: Child,
    grpc: SocketAddr,
    gateway: SocketAddr,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The lines a child process prints on its piped stdout, as they come.
fn stdout_lines(child: &mut Child) -> std::sync::mpsc::Receiver<String> {
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

fn start_daemon(dir: &Path, upstream: &str) -> Result<Daemon, String> {
    let stderr = std::fs::File::create(dir.join("stderr.log")).map_err(|e| e.to_string())?;
    let mut command = Command::new(env!("CARGO_BIN_EXE_ctxd"));
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("CTXD_") {
            command.env_remove(name);
        }
    }
    let mut child = command
        .arg("serve")
        .arg("--listen")
        .arg("127.0.0.1:0")
        .arg("--db")
        .arg(dir.join("ctxd.db"))
        .arg("--gateway")
        .arg("127.0.0.1:0")
        .arg("--anthropic-upstream")
        .arg(upstream)
        .arg("--openai-upstream")
        .arg(upstream)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .map_err(|e| format!("start {}: {e}", env!("CARGO_BIN_EXE_ctxd")))?;
    let rx = stdout_lines(&mut child);
    let mut daemon = Daemon {
        child,
        grpc: SocketAddr::from(([127, 0, 0, 1], 0)),
        gateway: SocketAddr::from(([127, 0, 0, 1], 0)),
    };
    let deadline = Instant::now() + PATIENCE;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                if let Some(addr) = line.strip_prefix("ctxd listening on ") {
                    daemon.grpc = addr
                        .trim()
                        .parse()
                        .map_err(|e| format!("gRPC address {addr:?}: {e}"))?;
                }
                if let Some(addr) = line.strip_prefix("ctxd gateway on ") {
                    daemon.gateway = addr
                        .trim()
                        .parse()
                        .map_err(|e| format!("gateway address {addr:?}: {e}"))?;
                    return Ok(daemon);
                }
            }
            Err(_) => {
                let log = std::fs::read_to_string(dir.join("stderr.log")).unwrap_or_default();
                return Err(format!(
                    "no `ctxd gateway on` line from ctxd serve; its stderr: {}",
                    log.chars().take(2000).collect::<String>()
                ));
            }
        }
    }
}

async fn memory(
    http: &reqwest::Client,
    system: &str,
    history: &[Value],
    streams: usize,
    tokens: usize,
) -> Result<Memory, String> {
    let fake = FakeProvider::start().await;
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let daemon = start_daemon(dir.path(), &fake.url())?;
    let pid = daemon.child.id();
    let url = format!("http://{}/v1/messages", daemon.gateway);
    // One small request first, so idle means a server that has served the gateway once.
    fake.set_default(Reply::text(ANSWER));
    let warm = Conversation::new(&history[..1]).next_body(system);
    let answer = post(http, &url, Some("memory-warmup"), None, warm).await?;
    if answer.status != 200 {
        return Err(format!("warm-up request: status {}", answer.status));
    }
    let (idle_kib, _) = status_kib(pid)?;

    let mut gates = Vec::new();
    for _ in 0..streams {
        let (reply, gate) = Reply::text(ANSWER).paused_after(3);
        fake.script(reply);
        gates.push(gate);
    }
    let (opened_tx, mut opened_rx) = tokio::sync::mpsc::channel::<()>(streams);
    let mut tasks: Vec<JoinHandle<Result<bool, String>>> = Vec::new();
    for i in 0..streams {
        let mut messages = history.to_vec();
        // Each agent's own conversation: its opening message differs.
        if let Some(Value::Array(blocks)) = messages[0].get_mut("content")
            && let Some(first) = blocks.first_mut()
            && let Some(text) = first.get("text").and_then(Value::as_str)
        {
            first["text"] = json!(format!("[agent {i}] {text}"));
        }
        let mut conv = Conversation::new(&messages);
        let body = conv.next(system);
        let http = http.clone();
        let url = url.clone();
        let opened = opened_tx.clone();
        tasks.push(tokio::spawn(async move {
            let session = format!("memory-{i}");
            let mut response = tokio::time::timeout(
                PATIENCE,
                wide(request(&http, &url, Some(&session), None, body), tokens).send(),
            )
            .await
            .map_err(|_| "no answer in time".to_owned())?
            .map_err(|e| format!("send: {e}"))?;
            if response.status() != 200 {
                return Err(format!("status {}", response.status()));
            }
            let mut bytes = Vec::new();
            let mut told = false;
            for _ in 0..MAX_CHUNKS {
                match tokio::time::timeout(PATIENCE, response.chunk()).await {
                    Ok(Ok(Some(chunk))) => {
                        bytes.extend_from_slice(&chunk);
                        if !told {
                            told = true;
                            let _ = opened.send(()).await;
                        }
                    }
                    Ok(Ok(None)) => return Ok(anthropic_message_of_sse(&bytes).is_some()),
                    Ok(Err(e)) => return Err(format!("body: {e}")),
                    Err(_) => return Err("the stream stalled".into()),
                }
            }
            Err("too many chunks".into())
        }));
    }
    drop(opened_tx);
    let mut open = 0;
    while open < streams {
        match tokio::time::timeout(PATIENCE, opened_rx.recv()).await {
            Ok(Some(())) => open += 1,
            _ => break,
        }
    }
    let mut during_kib = 0;
    if open == streams {
        for _ in 0..RSS_SAMPLES {
            during_kib = during_kib.max(status_kib(pid)?.0);
            tokio::time::sleep(RSS_EVERY).await;
        }
    }
    for gate in &gates {
        gate.open();
    }
    let mut whole = 0;
    let mut errors = Vec::new();
    for task in tasks {
        match task.await {
            Ok(Ok(true)) => whole += 1,
            Ok(Ok(false)) => errors.push("an answer that is not whole".to_owned()),
            Ok(Err(e)) => errors.push(e),
            Err(e) => errors.push(e.to_string()),
        }
    }
    if open < streams {
        return Err(format!(
            "only {open} of {streams} streams opened: {}",
            errors.join("; ")
        ));
    }
    if whole < streams {
        return Err(format!(
            "{whole} of {streams} streams whole: {}",
            errors.join("; ")
        ));
    }
    let (after_kib, hwm_kib) = status_kib(pid)?;
    drop(daemon);
    println!("memory: {streams} streams held open and completed");
    Ok(Memory {
        streams,
        tokens,
        idle_kib,
        during_kib,
        after_kib,
        hwm_kib,
    })
}

impl Conversation {
    /// The next request body, without keeping the conversation.
    fn next_body(mut self, system: &str) -> String {
        self.next(system)
    }
}

// ---------------------------------------------------------------- the server

/// The in-process server: gRPC on one listener, the gateway on another.
struct Server {
    grpc: SocketAddr,
    gateway: SocketAddr,
    store: Store,
    shutdown: oneshot::Sender<()>,
    handle: JoinHandle<Result<(), tonic::transport::Error>>,
}

impl Server {
    async fn start(db: &Path, upstream: &str) -> Self {
        let store = Store::open(db).await.expect("open the store");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let grpc = listener.local_addr().expect("local addr");
        let gateway_listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let gateway = gateway_listener.local_addr().expect("local addr");
        let options = ctxd::server::Options {
            gateway: Some(Gateway::new(gateway_listener, upstream, upstream)),
            ..Default::default()
        };
        let (shutdown, signal) = oneshot::channel::<()>();
        let handle = tokio::spawn(ctxd::server::serve_with(
            listener,
            store.clone(),
            options,
            async move {
                let _ = signal.await;
            },
        ));
        Server {
            grpc,
            gateway,
            store,
            shutdown,
            handle,
        }
    }

    async fn stop(self) {
        let _ = self.shutdown.send(());
        let _ = tokio::time::timeout(Duration::from_secs(10), self.handle).await;
        self.store.close().await;
    }
}

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

// ---------------------------------------------------------------- the table

#[derive(Default)]
struct Row {
    section: &'static str,
    case: String,
    n: Option<usize>,
    p50: Option<f64>,
    p99: Option<f64>,
    value: String,
    ratio: Option<f64>,
    to: String,
}

impl Row {
    fn json(&self) -> Value {
        let ms = |v: Option<f64>| v.map(|x| (x * 1000.0).round() / 1000.0);
        json!({
            "section": self.section,
            "case": self.case,
            "n": self.n,
            "p50_ms": ms(self.p50),
            "p99_ms": ms(self.p99),
            "value": self.value,
            "ratio": self.ratio.map(|r| (r * 10000.0).round() / 10000.0),
            "to": self.to,
        })
    }
}

fn print_table(rows: &[Row]) {
    let header = ["case", "n", "p50", "p99", "value", "ratio", "to"];
    let ms = |v: Option<f64>| v.map_or(String::new(), |x| format!("{x:.2} ms"));
    let cells: Vec<[String; 7]> = rows
        .iter()
        .map(|r| {
            [
                format!("{}: {}", r.section, r.case),
                r.n.map_or(String::new(), |n| n.to_string()),
                ms(r.p50),
                ms(r.p99),
                r.value.clone(),
                r.ratio.map_or(String::new(), |x| format!("{x:.3}×")),
                r.to.clone(),
            ]
        })
        .collect();
    report::print_table(header, &cells);
}
