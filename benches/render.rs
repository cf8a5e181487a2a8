//! What a render costs, without gRPC: `cargo bench --bench render`.
//!
//! Imports the largest trace in `testdata/traces` (`cc-main-4d5611e5.jsonl`, a real Claude Code
//! session) into a `Store` in a temp dir with the neutral importer, then times, each case many times:
//! - loading the path from SQLite (`Store::load_path`), the baseline every ratio refers to;
//! - the render engine alone (`ctxd::render::render`) per tokenizer, with a fresh token cache
//!   each iteration (cold) or one cache reused (warm), without and with a budget;
//! - load and warm render together, what a Render RPC costs minus gRPC.
//!
//! The BPE vocabularies are initialised once, before any case, and that one-time cost is printed
//! on its own. Prints the session's size and one table: p50, p95 and p50 over the baseline's p50
//! measured in the same run (the baseline runs again last, to show drift). The heuristic
//! tokenizer bypasses the token cache, so its cold and warm cases are the same work.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use ctxd::domain::{BranchName, NodeContent, Part, PathView};
use ctxd::import;
use ctxd::render::{Budget, Options, render};
use ctxd::store::{PathTarget, Store};
use ctxd::tokens::{TokenCache, Tokenizer};

const TRACE: &str = "cc-main-4d5611e5";
/// Each case runs at least this many timed iterations...
const MIN_ITERS: usize = 15;
/// ... and then until this much time has passed or `MAX_ITERS` were run.
const CASE_TIME: Duration = Duration::from_millis(1_800);
const MAX_ITERS: usize = 2_000;
/// Untimed iterations first (SQLite page caches, allocator, branch predictors): at least this
/// many, for at least `WARMUP_TIME`.
const WARMUP_ITERS: usize = 2;
const WARMUP_TIME: Duration = Duration::from_millis(300);

struct Row {
    case: String,
    iters: usize,
    p50: Duration,
    p95: Duration,
}

/// Runs `f` untimed for a while, then times it per iteration.
async fn measure<F, Fut>(case: impl Into<String>, mut f: F) -> Row
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Duration>,
{
    let warmup = Instant::now();
    let mut warmed = 0;
    while warmed < WARMUP_ITERS || warmup.elapsed() < WARMUP_TIME {
        f().await;
        warmed += 1;
    }
    let mut times = Vec::new();
    let start = Instant::now();
    while times.len() < MIN_ITERS || (start.elapsed() < CASE_TIME && times.len() < MAX_ITERS) {
        times.push(f().await);
    }
    times.sort_unstable();
    Row {
        case: case.into(),
        iters: times.len(),
        p50: percentile(&times, 50),
        p95: percentile(&times, 95),
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
        format!("{us:.1} µs")
    } else {
        format!("{:.2} ms", us / 1_000.0)
    }
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(bench());
}

async fn bench() {
    // The vocabularies load once per process; time that before anything else touches them.
    let mut init = Vec::new();
    for tokenizer in [Tokenizer::O200kBase, Tokenizer::Cl100kBase] {
        let start = Instant::now();
        black_box(tokenizer.count("hello world"));
        init.push((tokenizer, start.elapsed()));
    }

    let dir = tempfile::tempdir().expect("a temp dir");
    let store = Store::open(&dir.path().join("bench.db"))
        .await
        .expect("open the store");
    let data = std::fs::read(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("testdata/traces/{TRACE}.jsonl")),
    )
    .expect("read the trace");
    let plan = import::parse(import::Source::NeutralJsonl, &data).expect("a valid trace");
    let import_start = Instant::now();
    let tenant = ctxd::domain::Tenant::local();
    let imported = store
        .import(&tenant, BTreeMap::new(), &plan, None)
        .await
        .expect("import the trace")
        .id;
    let import_time = import_start.elapsed();
    let session = store
        .scope(&tenant, imported)
        .await
        .expect("its own session");
    let target = PathTarget::Branch(BranchName::main());
    let path: PathView = store.load_path(session, &target).await.expect("load");
    let chars: usize = path
        .nodes
        .iter()
        .map(|n| match &n.content {
            NodeContent::Message {
                parts, tool_calls, ..
            } => {
                Part::text_chars(parts)
                    + tool_calls
                        .iter()
                        .map(|c| c.arguments_json.chars().count())
                        .sum::<usize>()
            }
            NodeContent::ToolResult { parts, .. } => Part::text_chars(parts),
            NodeContent::FunctionCall { .. } | NodeContent::FunctionResult(_) => 0,
        })
        .sum();
    let results = path
        .nodes
        .iter()
        .filter(|n| matches!(n.content, NodeContent::ToolResult { .. }))
        .count();

    let unbudgeted = Options {
        now_ms: 1,
        ..Options::default()
    };
    let budgeted = Options {
        budget: Some(Budget {
            context_window: 100_000,
            output_reserve: 8_000,
            ..Budget::default()
        }),
        ..unbudgeted
    };
    let tokenizers = [
        Tokenizer::Heuristic,
        Tokenizer::O200kBase,
        Tokenizer::Cl100kBase,
    ];

    println!("ctxd render benchmark: testdata/traces/{TRACE}.jsonl");
    println!(
        "session: {} messages ({} tool results), {} nodes on the path, {} characters \
         (contents + tool-call arguments); imported in one transaction, {}",
        plan.nodes(),
        results,
        path.nodes.len(),
        chars,
        show(import_time)
    );
    assert_eq!(plan.nodes(), path.nodes.len());
    for tokenizer in tokenizers {
        let cache = TokenCache::default();
        let counter = cache.counter(tokenizer);
        let full = render(&path, &unbudgeted, &counter);
        let fit = render(&path, &budgeted, &counter);
        let r = &fit.report;
        println!(
            "  {:<11} {:>7} tokens unbudgeted; 100k window − 8k reserve: {} tokens, fits {}, \
             {} truncated, {} cleared, {} turns snipped, {} messages",
            tokenizer.name(),
            full.report.total_tokens,
            r.total_tokens,
            r.fits,
            r.results_truncated,
            r.results_cleared,
            r.turns_snipped,
            r.messages
        );
    }
    for (tokenizer, took) in &init {
        println!(
            "vocabulary initialisation (once per process): {:<11} {}",
            tokenizer.name(),
            show(*took)
        );
    }
    println!();

    let mut rows = Vec::new();
    rows.push(
        measure("load_path (SQLite read, baseline)", || async {
            let start = Instant::now();
            black_box(store.load_path(session, &target).await.expect("load"));
            start.elapsed()
        })
        .await,
    );
    for tokenizer in tokenizers {
        for (budget_name, options) in [("unbudgeted", &unbudgeted), ("100k/8k", &budgeted)] {
            rows.push(
                measure(
                    format!("render {} cold, {budget_name}", tokenizer.name()),
                    || async {
                        let start = Instant::now();
                        let cache = TokenCache::default();
                        black_box(render(&path, options, &cache.counter(tokenizer)));
                        start.elapsed()
                    },
                )
                .await,
            );
            let cache = TokenCache::default();
            rows.push(
                measure(
                    format!("render {} warm, {budget_name}", tokenizer.name()),
                    || async {
                        let start = Instant::now();
                        black_box(render(&path, options, &cache.counter(tokenizer)));
                        start.elapsed()
                    },
                )
                .await,
            );
        }
    }
    for tokenizer in tokenizers {
        let cache = TokenCache::default();
        rows.push(
            measure(
                format!("load + render {} warm, 100k/8k", tokenizer.name()),
                || async {
                    let start = Instant::now();
                    let path = store.load_path(session, &target).await.expect("load");
                    black_box(render(&path, &budgeted, &cache.counter(tokenizer)));
                    start.elapsed()
                },
            )
            .await,
        );
    }

    // The baseline again: how far the machine drifted during the run.
    rows.push(
        measure("load_path again (end of run)", || async {
            let start = Instant::now();
            black_box(store.load_path(session, &target).await.expect("load"));
            start.elapsed()
        })
        .await,
    );

    let baseline = rows[0].p50.as_secs_f64();
    let width = rows
        .iter()
        .map(|r| r.case.chars().count())
        .max()
        .unwrap_or(4);
    println!(
        "| {:<width$} | {:>6} | {:>10} | {:>10} | {:>12} |",
        "case", "iters", "p50", "p95", "p50/baseline"
    );
    println!(
        "|{}|{}:|{}:|{}:|{}:|",
        "-".repeat(width + 2),
        "-".repeat(7),
        "-".repeat(11),
        "-".repeat(11),
        "-".repeat(13)
    );
    for row in &rows {
        println!(
            "| {:<width$} | {:>6} | {:>10} | {:>10} | {:>11.2}× |",
            row.case,
            row.iters,
            show(row.p50),
            show(row.p95),
            row.p50.as_secs_f64() / baseline
        );
    }
    store.close().await;
}
