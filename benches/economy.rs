//! Context economy: `cargo bench --bench economy`.
//!
//! Replays every trace of `testdata/traces` (17 real agent sessions) as an agent host would:
//! before every assistant message (a model call) the session so far is rendered, and the rendered
//! messages are that call's input. Each policy below is replayed on every trace, and the table
//! compares them with the unpruned replay measured in the same run.
//!
//! The measure (also in `bench/ECONOMY.md`):
//! - **input tokens**: the sum, over calls, of the rendered tokens (the engine's own count, with
//!   the tokenizer of the run; heuristic by default).
//! - **cache-weighted cost**: a provider's prompt cache. The longest run of leading messages
//!   identical to the previous call's input (what the provider sees: role, text and media, tool
//!   calls, call id, name, error flag) is a cache read at 0.1×; the rest is a cache write at
//!   1.25×. Summed over calls, divided by the same sum for the unpruned replay.
//! - **peak**: the largest context of any call, in tokens.
//! - **working set verbatim**: at each call, of the newest 10 tool results of the session so
//!   far, the share rendered exactly as they arrived; averaged over calls.
//! - **pairing violations**: calls whose input breaks the pairing rule (every tool result right
//!   after the assistant message that made its call, every call answered except at the tail).
//! - **over budget**: calls whose render did not fit the budget (ctxd policies only).
//!
//! Arguments (after `--`): `--budget WINDOW:RESERVE` (default 200000:16000), `--tokenizer NAME`,
//! `--traces DIR`, `--per-trace`, `--breakdown` (input tokens by kind), `--what-if` (steps measured and not taken), and `--policy NAME=k=v,k=v` (repeatable) to add a ctxd policy
//! of your own, e.g. `--policy mine=microcompact_keep=12,clear_at_least_tokens=8000`.
//! Results also go to `target/bench/economy.json`.

#[path = "common/clock.rs"]
mod clock;
#[path = "common/report.rs"]
mod report;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::time::Instant;

use ctxd::compact::{self, Prepared, Verdict};
use ctxd::domain::{
    BranchName, CachePrices, CompactionId, NodeContent, NodeId, Part, PathView, Summary, SummaryId,
    Tenant,
};
use ctxd::economy::{CACHE_READ, CACHE_WRITE, same_for_cache as same};
use ctxd::import;
use ctxd::render::{
    Breakdown, Budget, Message, MessageRole, Microcompact, Options, Policy, Reduction, Rendered,
    Report, Seen, message_breakdown, message_tokens, render, truncation_marker,
};
use ctxd::store::{PathTarget, Store};
use ctxd::tokens::{Count, TokenCache, Tokenizer, Tokens};

/// The newest tool results that make the working set.
const WORKING_SET: usize = 10;

fn main() {
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let clock = clock::Clock::load(&args.raw);
    let traces = runtime.block_on(load_traces(&args.traces, &clock));
    let cache = TokenCache::default();
    let counter = cache.counter(args.tokenizer);

    let mut arms = vec![
        Arm::new(
            "unpruned",
            "no budget: every message as it was",
            Kind::Unpruned,
        ),
        Arm::new(
            "opencode-style prune",
            "reference: protect the newest 40k tokens of tool output and the newest turn; \
             clear older outputs once 20k can go",
            Kind::OpencodePrune {
                protect: 40_000,
                minimum: 20_000,
            },
        ),
        Arm::new(
            "sliding window",
            "reference: the last 4 messages as they are; older outputs over 300 chars cut to 120",
            Kind::SlidingWindow {
                last: 4,
                over: 300,
                cut_to: 120,
            },
        ),
        Arm::new(
            "tiers",
            "reference: 4000-char 60/40 cap; clear by count (first 50, every 25, keep 5)",
            Kind::Tiers {
                cap: 4000,
                first: 50,
                every: 25,
                keep: 5,
            },
        ),
        Arm::new(
            "tiers as ctxd policy",
            "the tiers row as a ctxd RenderPolicy: stepped, first 50, every 25, keep 5, recent \
             cap 4000, no input stubs",
            Kind::Ctxd(Policy {
                max_tool_result_chars: 4000,
                recent_tool_result_chars: 4000,
                microcompact_first: 50,
                microcompact_every: 25,
                microcompact_keep: 5,
                max_tool_input_chars: usize::MAX,
                max_assistant_text_chars: usize::MAX,
                recent_assistant_text_chars: usize::MAX,
                recent_tool_input_chars: usize::MAX,
                idle_ms: i64::MAX,
                ..Policy::default()
            }),
        ),
        Arm::new(
            "ctxd over budget",
            "ctxd's first default: microcompact: MICROCOMPACT_MODE_OVER_BUDGET",
            Kind::Ctxd(Policy::over_budget()),
        ),
        Arm::new(
            "ctxd default",
            "ctxd RenderPolicy with no field set",
            Kind::Ctxd(Policy::default()),
        ),
    ];
    if args.what_if {
        for (name, about, what) in [
            (
                "+ superseded, per call",
                "ctxd default, then results whose file a later call reads or writes cleared \
                 at every call",
                WhatIf::SupersededEveryCall,
            ),
            (
                "+ superseded, at steps",
                "ctxd default, then results kept at the last step cleared when superseded \
                 before it",
                WhatIf::SupersededAtSteps,
            ),
        ] {
            arms.push(Arm::new(
                name,
                about,
                Kind::CtxdThen(Policy::default(), what),
            ));
        }
    }
    for (name, policy) in &args.policies {
        arms.push(Arm::new(
            name,
            "ctxd RenderPolicy from --policy",
            Kind::Ctxd(*policy),
        ));
    }

    let budget = args.budget;
    let started = Instant::now();
    for arm in &mut arms {
        for trace in &traces {
            let stats = replay(trace, &arm.kind, budget, &counter, None);
            if !trace.extra {
                arm.total.add(&stats);
            }
            arm.family_stats(trace.family).add(&stats);
            arm.per_trace.push((trace.name.clone(), stats));
            let stats = replay(trace, &arm.kind, budget, &counter, Some(args.ttl_ms));
            if !trace.extra {
                arm.clocked.add(&stats);
            }
            arm.clocked_families
                .entry(trace.family)
                .or_default()
                .add(&stats);
            arm.clocked_per_trace.push(stats);
        }
    }
    // The compaction arms: a host that summarizes when the render does not fit, under a budget
    // small enough that it has to.
    let mut compacting = compaction_arms();
    for arm in &mut compacting {
        for trace in &traces {
            let stats = replay(trace, &arm.kind, args.compaction_budget, &counter, None);
            if !trace.extra {
                arm.total.add(&stats);
            }
            arm.family_stats(trace.family).add(&stats);
            arm.per_trace.push((trace.name.clone(), stats));
        }
    }
    // The default at each model's cache prices, its steps weighed at them, against sending
    // everything at the same prices; clock-free and on the sessions' clock.
    let sweep: Vec<PriceRow> = READ_PRICES
        .iter()
        .map(|&read| price_row(&traces, read, budget, &counter, args.ttl_ms))
        .collect();
    let took = started.elapsed();

    let calls: usize = arms[0].total.calls;
    println!(
        "ctxd context economy: {} traces, {} model calls, window {} − output reserve {}, \
         tokenizer {} ({:.1} s)",
        traces.iter().filter(|t| !t.extra).count(),
        calls,
        budget.context_window,
        budget.output_reserve,
        args.tokenizer.name(),
        took.as_secs_f64()
    );
    println!();
    let base = arms[0].total.clone();
    print_table(&arms, |a| &a.total, &base);
    println!();
    // The same replay on the sessions' clock, against the unpruned replay on the same clock.
    let clocked_base = arms[0].clocked.cost;
    println!(
        "on the sessions' clock (cost vs unpruned / working set): {}",
        arms.iter()
            .skip(1)
            .map(|a| format!(
                "{} {:.3}× {:.1}%",
                a.name,
                a.clocked.cost / clocked_base,
                a.clocked.working_set() * 100.0
            ))
            .collect::<Vec<_>>()
            .join("; ")
    );
    println!();
    for arm in &arms {
        println!("- {}: {}", arm.name, arm.about);
    }
    println!();
    println!("by harness family (cost vs unpruned / working set verbatim), clock-free:");
    print_families(&arms, &traces, |a| &a.families);
    println!();
    let expired: usize = arms[0].clocked_per_trace.iter().map(|s| s.expired).sum();
    println!(
        "by harness family, on the sessions' clock (cache lifetime {} min; {} traces timed by \
         their raw files, the rest by gaps drawn from TraceLab's published distribution; {} of \
         {} calls found the cache expired):",
        args.ttl_ms / 60_000,
        traces.iter().filter(|t| t.measured).count(),
        expired,
        arms[0].clocked.calls
    );
    print_families(&arms, &traces, |a| &a.clocked_families);
    println!();
    print_sessions(&arms, &traces);
    println!();
    print_sweep(&sweep);
    println!();
    print_compaction(&compacting, &base, args.compaction_budget);
    if args.breakdown {
        println!();
        println!("input tokens by kind (share of each policy's input):");
        println!(
            "| {:<22} | {:>7} | {:>7} | {:>9} | {:>10} | {:>12} | {:>7} |",
            "policy", "system", "user", "assistant", "tool calls", "tool results", "markers"
        );
        for arm in &arms {
            let s = &arm.total;
            let share = |k: usize| s.by_kind[k] / s.input_tokens * 100.0;
            println!(
                "| {:<22} | {:>6.1}% | {:>6.1}% | {:>8.1}% | {:>9.1}% | {:>11.1}% | {:>6.1}% |",
                arm.name,
                share(0),
                share(1),
                share(2),
                share(3),
                share(4),
                share(5)
            );
        }
    }
    if args.per_trace {
        for (t, trace) in traces.iter().enumerate() {
            println!();
            println!("{} ({} calls)", trace.name, arms[0].per_trace[t].1.calls);
            let base = arms[0].per_trace[t].1.clone();
            print_table(&arms, |a| &a.per_trace[t].1, &base);
        }
    }
    write_json(&arms, &base, budget, args.tokenizer);
}

// ---------------------------------------------------------------- arguments

struct Args {
    budget: Budget,
    tokenizer: Tokenizer,
    traces: PathBuf,
    per_trace: bool,
    /// Raw Claude Code files, the clock's source.
    raw: PathBuf,
    /// The provider's cache lifetime in the clocked replay.
    ttl_ms: i64,
    breakdown: bool,
    what_if: bool,
    policies: Vec<(String, Policy)>,
    compaction_budget: Budget,
}

impl Args {
    fn parse() -> Self {
        let mut args = Args {
            budget: Budget {
                context_window: 200_000,
                output_reserve: 16_000,
                ..Budget::default()
            },
            tokenizer: Tokenizer::Heuristic,
            traces: PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("testdata/traces"),
            per_trace: false,
            raw: PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("testdata/claude-code"),
            ttl_ms: ctxd::economy::CACHE_TTL_MS,
            breakdown: false,
            what_if: false,
            policies: Vec::new(),
            compaction_budget: Budget {
                context_window: 24_000,
                output_reserve: 4_000,
                ..Budget::default()
            },
        };
        let mut it = std::env::args().skip(1);
        while let Some(arg) = it.next() {
            let mut value = |what: &str| {
                it.next()
                    .unwrap_or_else(|| fail(&format!("{arg} needs {what}")))
            };
            match arg.as_str() {
                "--budget" | "--compaction-budget" => {
                    let v = value("WINDOW:RESERVE");
                    let (w, r) = v.split_once(':').unwrap_or((&v, "0"));
                    let budget = if arg == "--budget" {
                        &mut args.budget
                    } else {
                        &mut args.compaction_budget
                    };
                    budget.context_window = number(w, &arg);
                    budget.output_reserve = number(r, &arg);
                }
                "--tokenizer" => {
                    let v = value("a tokenizer name");
                    args.tokenizer = Tokenizer::parse(&v)
                        .unwrap_or_else(|| fail(&format!("unknown tokenizer {v}")));
                }
                "--traces" => args.traces = PathBuf::from(value("a directory")),
                "--per-trace" => args.per_trace = true,
                "--raw" => args.raw = PathBuf::from(value("a directory")),
                "--ttl-minutes" => args.ttl_ms = number::<i64>(&value("minutes"), &arg) * 60_000,
                "--breakdown" => args.breakdown = true,
                "--what-if" => args.what_if = true,
                "--policy" => {
                    let v = value("NAME=k=v,...");
                    let (name, knobs) = v.split_once('=').unwrap_or((&v, ""));
                    args.policies.push((name.to_owned(), policy(knobs)));
                }
                // `cargo bench` passes this to every bench target.
                "--bench" => {}
                other => fail(&format!("unknown argument {other}")),
            }
        }
        args
    }
}

fn fail(message: &str) -> ! {
    eprintln!("economy: {message}");
    std::process::exit(2);
}

fn number<T: std::str::FromStr>(v: &str, what: &str) -> T {
    v.parse()
        .unwrap_or_else(|_| fail(&format!("{what}: not a number: {v}")))
}

/// A policy from `k=v,k=v`, starting from the default; the keys are RenderPolicy's fields.
fn policy(knobs: &str) -> Policy {
    let mut p = Policy::default();
    for kv in knobs.split(',').filter(|s| !s.is_empty()) {
        let (k, v) = kv
            .split_once('=')
            .unwrap_or_else(|| fail(&format!("--policy: {kv} is not k=v")));
        match k {
            "max_tool_result_chars" => p.max_tool_result_chars = number(v, k),
            "microcompact_first" => p.microcompact_first = number(v, k),
            "microcompact_every" => p.microcompact_every = number(v, k),
            "microcompact_keep" => p.microcompact_keep = number(v, k),
            "recent_tool_result_chars" => p.recent_tool_result_chars = number(v, k),
            "clear_at_least_tokens" => p.clear_at_least_tokens = number(v, k),
            "max_tool_input_chars" => p.max_tool_input_chars = number(v, k),
            "max_assistant_text_chars" => p.max_assistant_text_chars = number(v, k),
            "recent_assistant_text_chars" => p.recent_assistant_text_chars = number(v, k),
            "recent_tool_input_chars" => p.recent_tool_input_chars = number(v, k),
            "idle_minutes" => p.idle_ms = number::<i64>(v, k) * 60_000,
            "payback_odds" => p.payback_odds = number(v, k),
            "max" => {}
            "microcompact" => {
                p.microcompact = match v {
                    "stepped" => Microcompact::Stepped,
                    "over_budget" => Microcompact::OverBudget,
                    _ => fail(&format!(
                        "--policy: microcompact is stepped or over_budget, not {v}"
                    )),
                }
            }
            "retain_turns" => p.retain_turns = number(v, k),
            "snip" => p.snip = number(v, k),
            other => fail(&format!("--policy: unknown field {other}")),
        }
    }
    p
}

// ---------------------------------------------------------------- traces

struct Trace {
    name: String,
    /// The harness that wrote it, from the file name's prefix (testdata/traces/README.md).
    family: &'static str,
    path: PathView,
    /// The same path on the session's clock: every node stamped with the time of the call it
    /// is input to (an assistant message, of the call that made it), and whether those times
    /// were measured (the raw Claude Code file) or drawn from the measured gaps.
    clocked: PathView,
    measured: bool,
    /// A session reshaped from a shared trace (mini-swe-agent as sent): in the family and
    /// per-session tables, not in the totals.
    extra: bool,
}

/// The name prefix of a mini-swe-agent trace reshaped as the harness sends it.
const AS_SENT: &str = "sent-";

/// A neutral trace as mini-swe-agent sends it: each bash call back into its assistant's text
/// (where the converter found it, in a fenced block), each of its results a user message.
fn as_sent(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len());
    for line in data.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
        let mut v: serde_json::Value =
            serde_json::from_slice(line).unwrap_or_else(|e| fail(&format!("as sent: {e}")));
        if let Some(o) = v.as_object_mut() {
            o.remove("tool_calls");
            if o.get("role").and_then(|r| r.as_str()) == Some("tool") {
                o.insert("role".into(), "user".into());
                o.remove("tool_call_id");
                o.remove("is_error");
            }
        }
        out.extend(serde_json::to_vec(&v).expect("JSON"));
        out.push(b'\n');
    }
    out
}

/// `path` with its nodes stamped by `times`, the time of each model call in order: a call's
/// input (everything after the previous assistant message) at the call's time, and the
/// assistant message it made too, so a render sees each call's gap as the engine measures it.
fn stamped(path: &PathView, times: &[i64]) -> PathView {
    let mut call = 0usize;
    let last = times.len().saturating_sub(1);
    let nodes = path
        .nodes
        .iter()
        .enumerate()
        .map(|(k, node)| {
            let at = times.get(call.min(last)).copied().unwrap_or(0);
            if k > 0 && is_assistant(node) {
                call += 1;
            }
            let mut node = (**node).clone();
            node.created_at_ms = at;
            std::sync::Arc::new(node)
        })
        .collect();
    PathView {
        nodes,
        ..path.clone()
    }
}

fn is_assistant(node: &ctxd::domain::Node) -> bool {
    matches!(
        &node.content,
        NodeContent::Message { role, .. } if *role == ctxd::domain::Role::Assistant
    )
}

/// Imports every `*.jsonl` of `dir` into one store (the real importer), and loads each path.
async fn load_traces(dir: &std::path::Path, clock: &clock::Clock) -> Vec<Trace> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| fail(&format!("read {}: {e}", dir.display())))
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
        .collect();
    files.sort();
    if files.is_empty() {
        fail(&format!("no *.jsonl in {}", dir.display()));
    }
    let tmp = tempfile::tempdir().expect("a temp dir");
    let store = Store::open(&tmp.path().join("economy.db"))
        .await
        .expect("open the store");
    // Each file, and each mini-swe-agent session once more as that harness sends it: the
    // action in the assistant's text, its output back as a user message.
    let mut sources = Vec::new();
    for file in files {
        let data = std::fs::read(&file).expect("read a trace");
        let name = file
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        if name.starts_with("mini-") {
            sources.push((format!("{AS_SENT}{name}"), as_sent(&data), true));
        }
        sources.push((name, data, false));
    }
    sources.sort_by(|a, b| a.0.cmp(&b.0));
    let mut traces = Vec::new();
    for (name, data, extra) in sources {
        let plan = import::parse(import::Source::NeutralJsonl, &data)
            .unwrap_or_else(|e| fail(&format!("{name}: {e}")));
        let imported = store
            .import(&Tenant::local(), BTreeMap::new(), &plan, None)
            .await
            .expect("import a trace")
            .id;
        let session = store
            .scope(&Tenant::local(), imported)
            .await
            .expect("its own session");
        let path = store
            .load_path(session, &PathTarget::Branch(BranchName::main()))
            .await
            .expect("load a path");
        let (times, measured) = clock.times(&name, &clock::human_turns(&path.nodes));
        traces.push(Trace {
            family: report::family(&name),
            clocked: stamped(&path, &times),
            measured,
            extra,
            name,
            path,
        });
    }
    store.close().await;
    traces
}

// ---------------------------------------------------------------- policies

#[derive(Clone, Copy)]
enum Kind {
    Unpruned,
    Compacting(Compacting),
    Ctxd(Policy),
    /// A ctxd policy, then a step it does not have, to measure whether the step would pay.
    CtxdThen(Policy, WhatIf),
    /// opencode's `prune`: walking back from the newest message, skip the newest turn, count
    /// tool outputs (chars / 4) until `protect` tokens are protected; older outputs are pruned
    /// (for good) once together they exceed `minimum`.
    OpencodePrune {
        protect: usize,
        minimum: usize,
    },
    /// The last `last` messages as they are; older tool outputs over `over` characters cut to
    /// their first `cut_to`.
    SlidingWindow {
        last: usize,
        over: usize,
        cut_to: usize,
    },
    /// Every output over `cap` keeps its first 60% and last 40%; once `first` results exist and
    /// at every further `every`, the results older than the newest `keep` are cleared.
    Tiers {
        cap: usize,
        first: usize,
        every: usize,
        keep: usize,
    },
}

/// Steps measured and not taken (`--what-if`; bench/ECONOMY.md).
#[derive(Clone, Copy)]
enum WhatIf {
    /// Clear every uncleared result whose file a later call reads or writes, at every call.
    SupersededEveryCall,
    /// The same, only at steps: results kept at the last step, superseded before it.
    SupersededAtSteps,
}

struct Arm {
    name: String,
    about: String,
    kind: Kind,
    total: Stats,
    /// By harness family, and the unpruned replay's of the same family.
    families: BTreeMap<&'static str, Stats>,
    per_trace: Vec<(String, Stats)>,
    /// The same on the sessions' clock (`replay` with a cache lifetime).
    clocked: Stats,
    clocked_families: BTreeMap<&'static str, Stats>,
    clocked_per_trace: Vec<Stats>,
}

impl Arm {
    fn new(name: &str, about: &str, kind: Kind) -> Self {
        Arm {
            name: name.to_owned(),
            about: about.to_owned(),
            kind,
            total: Stats::default(),
            families: BTreeMap::new(),
            per_trace: Vec::new(),
            clocked: Stats::default(),
            clocked_families: BTreeMap::new(),
            clocked_per_trace: Vec::new(),
        }
    }

    fn family_stats(&mut self, family: &'static str) -> &mut Stats {
        self.families.entry(family).or_default()
    }
}

/// A host that compacts: when the render does not fit, it prepares a rolling summary (retain 2
/// turns, as ctxd's default), asks a model for it, and commits it; the task (the first user
/// message) is pinned, as a host keeps its task in view.
#[derive(Clone, Copy)]
struct Compacting {
    /// The render policy; `None`: no reduction at all (a host that only compacts).
    policy: Option<Policy>,
    /// The summary request shares the host's cached prefix (the render, then the instruction)
    /// rather than sending the range alone.
    cache_sharing: bool,
    /// Pins shown after the summary (ctxd's order before pins came first), to measure what
    /// putting what does not change first keeps of the cache.
    pins_after: bool,
}

fn compaction_arms() -> Vec<Arm> {
    let arm = |name: &str, about: &str, policy, cache_sharing, pins_after| {
        Arm::new(
            name,
            about,
            Kind::Compacting(Compacting {
                policy,
                cache_sharing,
                pins_after,
            }),
        )
    };
    // A host that summarizes rather than drop whole turns turns snip off.
    let default = Some(Policy {
        snip: false,
        ..Policy::default()
    });
    vec![
        arm(
            "compaction only, range",
            "no reduction; a summary of the range when over budget",
            None,
            false,
            false,
        ),
        arm(
            "compaction only, shared",
            "no reduction; the cache-sharing summary request",
            None,
            true,
            false,
        ),
        arm(
            "compaction only, pins after",
            "no reduction; cache-sharing; pins after the summary (the old order)",
            None,
            true,
            true,
        ),
        arm(
            "default + range",
            "ctxd default without snip; a summary of the range when over budget",
            default,
            false,
            false,
        ),
        arm(
            "default + shared",
            "ctxd default without snip; the cache-sharing summary request",
            default,
            true,
            false,
        ),
        arm(
            "default + shared, pins after",
            "the same with pins after the summary (the old order)",
            default,
            true,
            true,
        ),
    ]
}

/// What the reference policies remember between calls (opencode's pruned outputs).
#[derive(Default)]
struct Memory {
    pruned: HashSet<NodeId>,
}

fn set_text(m: &mut Message, t: String) {
    m.parts = vec![Part::Text(t)];
}

/// The input of one call under `kind`, and whether it fit (reference policies always do).
fn input(
    path: &PathView,
    kind: &Kind,
    budget: Budget,
    counter: &dyn Count,
    memory: &mut Memory,
) -> (Vec<Message>, Vec<Tokens>, bool) {
    let now_ms = path.nodes.last().map_or(0, |n| n.created_at_ms);
    let mut options = Options {
        now_ms,
        // As Render does: what came after the newest assistant message is new to the model.
        seen: Seen::ThroughLastCall,
        ..Options::default()
    };
    match kind {
        Kind::Ctxd(policy) | Kind::CtxdThen(policy, _) => {
            options.budget = Some(budget);
            options.policy = *policy;
            let Rendered {
                mut messages,
                tokens,
                report,
            } = render(path, &options, counter);

            let Kind::CtxdThen(_, what) = kind else {
                return (messages, tokens, report.fits);
            };
            what_if(&mut messages, &report, policy, *what);
            let tokens = messages
                .iter()
                .map(|m| message_tokens(m, counter))
                .collect();
            return (messages, tokens, report.fits);
        }
        _ => {}
    }
    let mut messages = render(path, &options, counter).messages;
    match *kind {
        Kind::Unpruned | Kind::Ctxd(_) | Kind::CtxdThen(..) | Kind::Compacting(_) => {}
        Kind::OpencodePrune { protect, minimum } => {
            let mut turns = 0;
            let mut total = 0;
            let mut pruned = 0;
            let mut candidates = Vec::new();
            'walk: for m in messages.iter().rev() {
                if m.role == MessageRole::User {
                    turns += 1;
                }
                if turns < 2 || m.role != MessageRole::Tool {
                    continue;
                }
                let id = m.node_ids[0];
                if memory.pruned.contains(&id) {
                    break 'walk;
                }
                let estimate = Part::text_chars(&m.parts) / 4;
                total += estimate;
                if total > protect {
                    pruned += estimate;
                    candidates.push(id);
                }
            }
            if pruned > minimum {
                memory.pruned.extend(candidates);
            }
            for m in &mut messages {
                if m.role == MessageRole::Tool && memory.pruned.contains(&m.node_ids[0]) {
                    set_text(m, "[Old tool result content cleared]".to_owned());
                }
            }
        }
        Kind::SlidingWindow { last, over, cut_to } => {
            let old = messages.len().saturating_sub(last);
            for m in &mut messages[..old] {
                if m.role == MessageRole::Tool && Part::text_chars(&m.parts) > over {
                    let head: String = Part::text_of(&m.parts).chars().take(cut_to).collect();
                    set_text(m, format!("{head}…"));
                }
            }
        }
        Kind::Tiers {
            cap,
            first,
            every,
            keep,
        } => {
            let results: Vec<usize> = (0..messages.len())
                .filter(|&i| messages[i].role == MessageRole::Tool)
                .collect();
            let n = results.len();
            let boundary = if n >= first {
                (first + (n - first) / every * every).saturating_sub(keep)
            } else {
                0
            };
            for (k, &i) in results.iter().enumerate() {
                let m = &mut messages[i];
                if k < boundary {
                    let name = m.name.clone().unwrap_or_default();
                    let call = m.tool_call_id.clone().unwrap_or_default();
                    set_text(
                        m,
                        format!("[tool result cleared to save context: {name} call {call}]"),
                    );
                } else if Part::text_chars(&m.parts) > cap {
                    let t = Part::text_of(&m.parts);
                    let len = t.chars().count();
                    let (head, tail) = (cap * 6 / 10, cap - cap * 6 / 10);
                    let h: String = t.chars().take(head).collect();
                    let s: String = t.chars().skip(len - tail).collect();
                    set_text(
                        m,
                        format!("{h}{}{s}", truncation_marker(len - head - tail, len, None)),
                    );
                }
            }
        }
    }
    let tokens = messages
        .iter()
        .map(|m| message_tokens(m, counter))
        .collect();
    (messages, tokens, true)
}

/// The file a call reads or writes, from its arguments.
fn file_of(arguments_json: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(arguments_json).ok()?;
    ["file_path", "path", "notebook_path"]
        .iter()
        .find_map(|k| v.get(k)?.as_str().map(str::to_owned))
}

fn what_if(messages: &mut [Message], report: &Report, policy: &Policy, what: WhatIf) {
    // Each tool result's index among the results, and the file of its call.
    let files: HashMap<String, String> = messages
        .iter()
        .flat_map(|m| &m.tool_calls)
        .filter_map(|c| Some((c.call_id.clone(), file_of(&c.arguments_json)?)))
        .collect();
    let results: Vec<usize> = (0..messages.len())
        .filter(|&i| messages[i].role == MessageRole::Tool)
        .collect();
    let file = |i: usize| -> Option<&String> { files.get(messages[i].tool_call_id.as_deref()?) };
    // The results a step may touch: every one, or those before the last step only.
    let step = if report.microcompact_boundary == 0 {
        0
    } else {
        report.microcompact_boundary + policy.microcompact_keep
    };
    let upto = match what {
        WhatIf::SupersededEveryCall => results.len(),
        WhatIf::SupersededAtSteps => step.min(results.len()),
    };
    let superseded: Vec<usize> = (0..upto)
        .filter(|&k| {
            let Some(f) = file(results[k]) else {
                return false;
            };
            messages[results[k]].reduction != Reduction::Cleared
                && results[k + 1..upto].iter().any(|&j| file(j) == Some(f))
        })
        .map(|k| results[k])
        .collect();
    for i in superseded {
        set_text(&mut messages[i], "[cleared to save context]".to_owned());
    }
}

// ---------------------------------------------------------------- the replay

#[derive(Debug, Clone, Default)]
struct Stats {
    calls: usize,
    input_tokens: f64,
    cost: f64,
    /// The part of `cost` read from the cache.
    read_cost: f64,
    /// Calls that found the cache expired (the clocked replay).
    expired: usize,
    peak: Tokens,
    /// Sum over calls of the working set's verbatim share, and the calls that had one.
    verbatim: f64,
    with_working_set: usize,
    pairing_violations: usize,
    over_budget: usize,
    /// Input tokens by what they are, summed over calls.
    by_kind: [f64; 6],
    /// Compaction arms: the summaries made, what their requests cost (input at cache prices,
    /// output at the output price), and the cache-read share of the first call after each.
    compactions: usize,
    applied: usize,
    compaction_cost: f64,
    after_read: f64,
}

impl Stats {
    fn add(&mut self, other: &Stats) {
        self.calls += other.calls;
        self.input_tokens += other.input_tokens;
        self.cost += other.cost;
        self.read_cost += other.read_cost;
        self.expired += other.expired;
        self.peak = self.peak.max(other.peak);
        self.verbatim += other.verbatim;
        self.with_working_set += other.with_working_set;
        self.pairing_violations += other.pairing_violations;
        self.over_budget += other.over_budget;
        self.compactions += other.compactions;
        self.applied += other.applied;
        self.compaction_cost += other.compaction_cost;
        self.after_read += other.after_read;
        for (a, b) in self.by_kind.iter_mut().zip(other.by_kind) {
            *a += b;
        }
    }

    fn working_set(&self) -> f64 {
        if self.with_working_set == 0 {
            1.0
        } else {
            self.verbatim / self.with_working_set as f64
        }
    }
}

/// Replays `trace` under `kind`, at the 0.1x reads and 1.25x writes of [`CachePrices::STANDARD`]
/// (`replay_at` prices otherwise). With `ttl`, on the session's clock: a call more than `ttl`
/// after the one before it finds the cache expired and reads nothing.
fn replay(
    trace: &Trace,
    kind: &Kind,
    budget: Budget,
    counter: &dyn Count,
    ttl: Option<i64>,
) -> Stats {
    replay_at(trace, kind, budget, counter, ttl, CachePrices::STANDARD)
}

/// [`replay`] with every call priced at `prices`.
fn replay_at(
    trace: &Trace,
    kind: &Kind,
    budget: Budget,
    counter: &dyn Count,
    ttl: Option<i64>,
    prices: CachePrices,
) -> Stats {
    if let Kind::Compacting(host) = kind {
        return replay_compacting(trace, *host, budget, counter);
    }
    let whole = if ttl.is_some() {
        &trace.clocked
    } else {
        &trace.path
    };
    let nodes = &whole.nodes;
    let mut stats = Stats::default();
    let mut memory = Memory::default();
    let mut previous: Vec<Message> = Vec::new();
    let mut last_call: Option<i64> = None;
    for k in 1..nodes.len() {
        if !is_assistant(&nodes[k]) {
            continue;
        }
        let path = PathView {
            nodes: nodes[..k].to_vec(),
            ..whole.clone()
        };
        let (messages, tokens, fits) = input(&path, kind, budget, counter, &mut memory);
        let total: Tokens = tokens.iter().sum();
        let at = nodes[k].created_at_ms;
        if let (Some(ttl), Some(before)) = (ttl, last_call)
            && at.saturating_sub(before) >= ttl
        {
            previous.clear();
            stats.expired += 1;
        }
        last_call = Some(at);
        let cached = messages
            .iter()
            .zip(&previous)
            .take_while(|(a, b)| same(a, b))
            .count();
        let read: Tokens = tokens[..cached].iter().sum();
        stats.calls += 1;
        stats.input_tokens += f64::from(total);
        stats.cost += prices.read() * f64::from(read) + prices.write() * f64::from(total - read);
        stats.read_cost += prices.read() * f64::from(read);
        stats.peak = stats.peak.max(total);
        if let Some(share) = working_set(&path, &messages) {
            stats.verbatim += share;
            stats.with_working_set += 1;
        }
        if !paired(&messages) {
            stats.pairing_violations += 1;
        }
        if !fits {
            stats.over_budget += 1;
        }
        for m in &messages {
            let b: Breakdown = message_breakdown(m, counter);
            let kinds = [
                b.system,
                b.user + b.summaries,
                b.assistant_text,
                b.tool_calls,
                b.tool_results,
                b.markers,
            ];
            for (sum, t) in stats.by_kind.iter_mut().zip(kinds) {
                *sum += f64::from(t);
            }
        }
        previous = messages;
    }
    stats
}

/// Price of an output token, relative to a plain input token (Anthropic's and OpenAI's current
/// models charge 4–5× input for output).
const OUTPUT: f64 = 5.0;
/// The fixed-length stand-in for every summary a model would write, so the figures are
/// reproducible: about 1500 tokens.
fn standin_summary() -> String {
    "The agent was asked to fix a failing behaviour; it read the relevant modules, ran the tests, \
     changed the code and reran them. "
        .repeat(48)
}
/// Nodes the path must grow by before a host tries again after a summary that did not help.
const RETRY_AFTER: usize = 20;

/// Tokens of the longest run of leading messages of `input` equal to one of `cached`.
fn cached_prefix(input: &[Message], tokens: &[Tokens], cached: &[&[Message]]) -> Tokens {
    let run = cached
        .iter()
        .map(|c| {
            input
                .iter()
                .zip(c.iter())
                .take_while(|(a, b)| same(a, b))
                .count()
        })
        .max()
        .unwrap_or(0);
    tokens[..run].iter().sum()
}

/// Moves the pins a summary shows again from just before it to just after it.
fn pins_after(messages: &mut [Message]) {
    let mut i = 0;
    while i < messages.len() {
        let Some(summary) = messages[i].summary_id else {
            i += 1;
            continue;
        };
        let start = (0..i)
            .rev()
            .take_while(|&j| messages[j].pinned_under == Some(summary))
            .last()
            .unwrap_or(i);
        messages[start..=i].rotate_right(1);
        i += 1;
    }
}

/// A policy that reduces nothing, for a host that only compacts: the render says whether it
/// fits.
fn no_reduction() -> Policy {
    Policy {
        max_tool_result_chars: usize::MAX,
        recent_tool_result_chars: usize::MAX,
        microcompact_first: usize::MAX,
        max_tool_input_chars: usize::MAX,
        max_assistant_text_chars: usize::MAX,
        recent_assistant_text_chars: usize::MAX,
        recent_tool_input_chars: usize::MAX,
        idle_ms: i64::MAX,
        snip: false,
        ..Policy::default()
    }
}

/// The replay of a compacting host: before each call it renders; when the render does not fit
/// it prepares a rolling summary as `PrepareCompaction` does, pays for the summary request
/// (the range after the summarizer's instruction, all written anew; or the render it just made
/// followed by the instruction, whose prefix is read from the cache) and the stand-in's output,
/// commits it if it makes the context smaller, and renders again.
fn replay_compacting(
    trace: &Trace,
    host: Compacting,
    budget: Budget,
    counter: &dyn Count,
) -> Stats {
    let nodes = &trace.path.nodes;
    let policy = host.policy.unwrap_or_else(no_reduction);
    let task = nodes.iter().find(|n| {
        matches!(&n.content, NodeContent::Message { role, .. } if *role == ctxd::domain::Role::User)
    });
    let mut summaries: Vec<Summary> = Vec::new();
    let mut stats = Stats::default();
    let mut previous: Vec<Message> = Vec::new();
    let mut request: Vec<Message> = Vec::new();
    let mut retry_at = 0;
    let standin = standin_summary();
    let render_at = |path: &PathView| {
        let options = Options {
            budget: Some(budget),
            policy,
            now_ms: path.nodes.last().map_or(0, |n| n.created_at_ms),
            ..Options::default()
        };
        let mut rendered = render(path, &options, counter);
        if host.pins_after {
            pins_after(&mut rendered.messages);
            rendered.tokens = rendered
                .messages
                .iter()
                .map(|m| message_tokens(m, counter))
                .collect();
        }
        rendered
    };
    for k in 1..nodes.len() {
        if !is_assistant(&nodes[k]) {
            continue;
        }
        let mut path = PathView {
            nodes: nodes[..k].to_vec(),
            summaries: summaries.clone(),
            pinned: task.map(|t| t.id).into_iter().collect(),
            ..trace.path.clone()
        };
        let mut rendered = render_at(&path);
        let mut compacted = false;
        if !rendered.report.fits && k >= retry_at {
            let prepared = compact::prepare(&path, budget, 2, 4000, counter);
            if let Prepared::Needed(plan) = prepared {
                let evidence = plan
                    .ledger
                    .render(ctxd::render::ledger_cap(budget.history().ok()), counter);
                if host.cache_sharing {
                    request = compact::cache_sharing_request(
                        rendered.messages.clone(),
                        &plan,
                        "",
                        &evidence,
                    );
                    let tokens: Vec<Tokens> =
                        request.iter().map(|m| message_tokens(m, counter)).collect();
                    let total: Tokens = tokens.iter().sum();
                    let read = cached_prefix(&request, &tokens, &[&previous]);
                    stats.compaction_cost +=
                        CACHE_READ * f64::from(read) + CACHE_WRITE * f64::from(total - read);
                } else {
                    request.clear();
                    let total = plan.input_tokens
                        + counter.count(&evidence)
                        + counter.count(compact::EVIDENCE_NOTE);
                    stats.compaction_cost += CACHE_WRITE * f64::from(total);
                }
                stats.compaction_cost += OUTPUT * f64::from(counter.count(&standin));
                stats.compactions += 1;
                let summary = Summary {
                    id: SummaryId::new(),
                    compaction_id: CompactionId::new(),
                    kind: plan.kind,
                    covers: plan.covers.clone(),
                    range: plan.range,
                    text: standin.clone(),
                    rolls_over: plan.rolls_over.clone(),
                    ledger: Some(std::sync::Arc::new(plan.ledger.clone())),
                    model: "stand-in".to_owned(),
                    base_head: nodes[k - 1].id,
                    tokens_before: 0,
                    tokens_after: 0,
                    created_at_ms: nodes[k - 1].created_at_ms,
                };
                match compact::judge(path.clone(), &summary, budget, 4000, counter) {
                    Verdict::Apply { .. } => {
                        summaries.push(summary);
                        path.summaries = summaries.clone();
                        rendered = render_at(&path);
                        compacted = true;
                    }
                    _ => retry_at = k + RETRY_AFTER,
                }
            } else {
                retry_at = k + RETRY_AFTER;
            }
        }
        let messages = rendered.messages;
        let tokens = rendered.tokens;
        let total: Tokens = tokens.iter().sum();
        let read = cached_prefix(&messages, &tokens, &[&previous, &request]);
        stats.calls += 1;
        stats.input_tokens += f64::from(total);
        stats.cost += CACHE_READ * f64::from(read) + CACHE_WRITE * f64::from(total - read);
        stats.peak = stats.peak.max(total);
        if compacted && total > 0 {
            stats.applied += 1;
            stats.after_read += f64::from(read) / f64::from(total);
        }
        if let Some(share) = working_set(&path, &messages) {
            stats.verbatim += share;
            stats.with_working_set += 1;
        }
        if !paired(&messages) {
            stats.pairing_violations += 1;
        }
        if !rendered.report.fits {
            stats.over_budget += 1;
        }
        previous = messages;
    }
    stats
}

/// The share of the newest `WORKING_SET` tool results rendered exactly as they arrived.
fn working_set(path: &PathView, messages: &[Message]) -> Option<f64> {
    let newest: Vec<(NodeId, String)> = path
        .nodes
        .iter()
        .rev()
        .filter_map(|n| match &n.content {
            NodeContent::ToolResult { parts, .. } => Some((n.id, Part::text_of(parts))),
            NodeContent::FunctionResult(r) => Some((n.id, r.output.clone())),
            // mini-swe-agent's output, sent back as a user message.
            NodeContent::Message {
                role: ctxd::domain::Role::User,
                parts,
                ..
            } if Part::text_of(parts).starts_with("<returncode>") => {
                Some((n.id, Part::text_of(parts)))
            }
            _ => None,
        })
        .take(WORKING_SET)
        .collect();
    if newest.is_empty() {
        return None;
    }
    let verbatim = newest
        .iter()
        .filter(|(id, original)| {
            messages.iter().any(|m| {
                (m.role == MessageRole::Tool || m.observation)
                    && m.node_ids.contains(id)
                    && Part::text_of(&m.parts) == *original
            })
        })
        .count();
    Some(verbatim as f64 / newest.len() as f64)
}

/// Every tool message right after the assistant message that made its call (in its group of
/// results, once), and every call answered, except calls still pending at the very end.
fn paired(messages: &[Message]) -> bool {
    let mut open: HashSet<&str> = HashSet::new();
    let mut in_group = false;
    for m in messages {
        match m.role {
            MessageRole::Tool => {
                let id = m.tool_call_id.as_deref().unwrap_or_default();
                if !in_group || !open.remove(id) {
                    return false;
                }
            }
            _ => {
                if !open.is_empty() {
                    return false;
                }
                in_group = m.role == MessageRole::Assistant;
                open = m.tool_calls.iter().map(|c| c.call_id.as_str()).collect();
            }
        }
    }
    true
}

// ---------------------------------------------------------------- output

fn print_table(arms: &[Arm], stats: impl Fn(&Arm) -> &Stats, base: &Stats) {
    println!(
        "| {:<22} | {:>12} | {:>9} | {:>10} | {:>9} | {:>11} | {:>8} | {:>11} |",
        "policy", "input tokens", "vs unpr.", "cost", "vs unpr.", "peak", "working", "pairing/over"
    );
    println!(
        "|{:-<24}|{:->14}|{:->11}|{:->12}|{:->11}|{:->13}|{:->10}|{:->13}|",
        "", "", "", "", "", "", "", ""
    );
    for arm in arms {
        let s = stats(arm);
        println!(
            "| {:<22} | {:>12.0} | {:>8.3}× | {:>10.0} | {:>8.3}× | {:>11} | {:>7.1}% | {:>5} / {:<5} |",
            arm.name,
            s.input_tokens,
            s.input_tokens / base.input_tokens,
            s.cost,
            s.cost / base.cost,
            s.peak,
            s.working_set() * 100.0,
            s.pairing_violations,
            s.over_budget
        );
    }
}

/// Cost and working set of each arm by harness family, against the unpruned replay of the same
/// family (arm 0).
fn print_families(
    arms: &[Arm],
    traces: &[Trace],
    families: impl Fn(&Arm) -> &BTreeMap<&'static str, Stats>,
) {
    let present: Vec<&str> = report::FAMILIES
        .iter()
        .map(|(_, f)| *f)
        .filter(|f| traces.iter().any(|t| t.family == *f))
        .collect();
    print!("| {:<22} |", "policy");
    for f in &present {
        let n = traces.iter().filter(|t| t.family == *f).count();
        print!(" {:>17} |", format!("{f} ({n})"));
    }
    println!();
    print!("|{:-<24}|", "");
    for _ in &present {
        print!("{:->19}|", "");
    }
    println!();
    for arm in arms {
        print!("| {:<22} |", arm.name);
        for f in &present {
            let base = &families(&arms[0])[f];
            let s = &families(arm)[f];
            print!(
                " {:>17} |",
                format!(
                    "{:.3}× {:5.1}%",
                    s.cost / base.cost,
                    s.working_set() * 100.0
                )
            );
        }
        println!();
    }
}

/// The default's figures per session, clock-free and clocked, and the goals they are held to:
/// no session above sending everything, every working set at least `SESSION_WORKING_SET`.
fn print_sessions(arms: &[Arm], traces: &[Trace]) {
    let Some(d) = arms.iter().position(|a| a.name == "ctxd default") else {
        return;
    };
    println!("ctxd default per session (cost vs unpruned, working set verbatim):");
    let mut rows = Vec::new();
    let (mut above, mut thin) = (Vec::new(), Vec::new());
    for (t, trace) in traces.iter().enumerate() {
        let (free, free_base) = (&arms[d].per_trace[t].1, &arms[0].per_trace[t].1);
        let (clocked, clocked_base) =
            (&arms[d].clocked_per_trace[t], &arms[0].clocked_per_trace[t]);
        let (a, b) = (free.cost / free_base.cost, clocked.cost / clocked_base.cost);
        let ws = free.working_set().min(clocked.working_set());
        if a > 1.0 + 1e-9 || b > 1.0 + 1e-9 {
            above.push(trace.name.as_str());
        }
        if ws < SESSION_WORKING_SET {
            thin.push(trace.name.as_str());
        }
        rows.push([
            trace.name.clone(),
            free.calls.to_string(),
            format!("{a:.3}×"),
            format!("{b:.3}×"),
            clocked.expired.to_string(),
            format!("{:.1}%", free.working_set() * 100.0),
            format!("{:.1}%", clocked.working_set() * 100.0),
            if trace.measured { "measured" } else { "drawn" }.to_owned(),
        ]);
    }
    report::print_table(
        [
            "session",
            "calls",
            "cost",
            "clocked",
            "expired",
            "working",
            "clocked working",
            "clock",
        ],
        &rows,
    );
    let list = |v: &[&str]| {
        if v.is_empty() {
            "none".to_owned()
        } else {
            v.join(", ")
        }
    };
    println!(
        "sessions above 1.0×: {}; working set under {:.0}%: {}",
        list(&above),
        SESSION_WORKING_SET * 100.0,
        list(&thin)
    );
}

/// The cache read prices of the models the table lists, per mille: older Claude models and
/// OpenAI's gpt-5 (0.1x), Opus and Sonnet 5.5 (0.05x), Fable and Mythos 5.1 (0.025x).
const READ_PRICES: [u32; 3] = [100, 50, 25];

/// The default replayed at one read price: all traces' sums, and the highest session's ratio,
/// clock-free and clocked.
struct PriceRow {
    read_per_mille: u32,
    free: (Stats, Stats),
    clocked: (Stats, Stats),
    highest: (f64, f64, String),
}

fn price_row(
    traces: &[Trace],
    read_per_mille: u32,
    budget: Budget,
    counter: &dyn Count,
    ttl: i64,
) -> PriceRow {
    let prices = CachePrices {
        read_per_mille,
        ..CachePrices::STANDARD
    };
    let default = Kind::Ctxd(Policy {
        prices,
        ..Policy::default()
    });
    let mut row = PriceRow {
        read_per_mille,
        free: (Stats::default(), Stats::default()),
        clocked: (Stats::default(), Stats::default()),
        highest: (0.0, 0.0, String::new()),
    };
    for trace in traces.iter().filter(|t| !t.extra) {
        let mut ratios = [0.0; 2];
        for (n, ttl) in [None, Some(ttl)].into_iter().enumerate() {
            let base = replay_at(trace, &Kind::Unpruned, budget, counter, ttl, prices);
            let stats = replay_at(trace, &default, budget, counter, ttl, prices);
            ratios[n] = stats.cost / base.cost;
            let sums = if ttl.is_none() {
                &mut row.free
            } else {
                &mut row.clocked
            };
            sums.0.add(&base);
            sums.1.add(&stats);
        }
        if ratios[0].max(ratios[1]) > row.highest.0.max(row.highest.1) {
            row.highest = (ratios[0], ratios[1], trace.name.clone());
        }
    }
    row
}

/// The sweep's table: the default at each read price, clock-free and on the clock.
fn print_sweep(rows: &[PriceRow]) {
    println!(
        "ctxd default at each model's cache prices (reads as below, writes 1.25x; its steps \
         weighed at those prices), cost vs sending everything at the same prices:"
    );
    let table: Vec<[String; 5]> = rows
        .iter()
        .map(|r| {
            let ratio = |(base, s): &(Stats, Stats)| s.cost / base.cost;
            [
                format!("{:.3}x", f64::from(r.read_per_mille) / 1000.0),
                format!("{:.3}x", ratio(&r.free)),
                format!("{:.3}x", ratio(&r.clocked)),
                format!("{:.1}%", r.free.1.working_set() * 100.0),
                format!("{} {:.3}x / {:.3}x", r.highest.2, r.highest.0, r.highest.1),
            ]
        })
        .collect();
    report::print_table(
        [
            "reads",
            "all, clock-free",
            "all, on the clock",
            "working set",
            "highest session (free / clocked)",
        ],
        &table,
    );
}

/// The least working set any one session may keep verbatim under the default.
const SESSION_WORKING_SET: f64 = 0.92;

/// The compaction arms: cost without and with the summary requests, against the unpruned
/// replay of the main table.
fn print_compaction(arms: &[Arm], base: &Stats, budget: Budget) {
    println!(
        "compaction (window {} − reserve {}; summaries by a {}-token stand-in; output at {OUTPUT}× \
         input):",
        budget.context_window,
        budget.output_reserve,
        TokenCache::default()
            .counter(Tokenizer::Heuristic)
            .count(&standin_summary())
    );
    println!(
        "| {:<28} | {:>11} | {:>14} | {:>11} | {:>16} | {:>8} | {:>11} |",
        "host",
        "summaries",
        "cost (calls)",
        "+ requests",
        "requests' share",
        "working",
        "read after"
    );
    println!(
        "|{:-<30}|{:->13}|{:->16}|{:->13}|{:->18}|{:->10}|{:->13}|",
        "", "", "", "", "", "", ""
    );
    for arm in arms {
        let s = &arm.total;
        let with = s.cost + s.compaction_cost;
        println!(
            "| {:<28} | {:>11} | {:>13.3}× | {:>10.3}× | {:>15.1}% | {:>7.1}% | {:>10.1}% |",
            arm.name,
            s.compactions,
            s.cost / base.cost,
            with / base.cost,
            if with > 0.0 {
                s.compaction_cost / with * 100.0
            } else {
                0.0
            },
            s.working_set() * 100.0,
            if s.applied > 0 {
                s.after_read / s.applied as f64 * 100.0
            } else {
                0.0
            }
        );
    }
    for arm in arms {
        println!("- {}: {}", arm.name, arm.about);
    }
    println!(
        "(read after: the cache-read share of the first call after each summary; over budget: {})",
        arms.iter()
            .map(|a| format!("{} {}", a.name, a.total.over_budget))
            .collect::<Vec<_>>()
            .join(", ")
    );
}

fn write_json(arms: &[Arm], base: &Stats, budget: Budget, tokenizer: Tokenizer) {
    let rows: Vec<serde_json::Value> = arms
        .iter()
        .map(|a| {
            let s = &a.total;
            serde_json::json!({
                "policy": a.name,
                "about": a.about,
                "calls": s.calls,
                "input_tokens": s.input_tokens,
                "input_vs_unpruned": s.input_tokens / base.input_tokens,
                "cost": s.cost,
                "cost_vs_unpruned": s.cost / base.cost,
                "clocked_cost_vs_unpruned": a.clocked.cost / arms[0].clocked.cost,
                "peak_tokens": s.peak,
                "working_set_verbatim": s.working_set(),
                "pairing_violations": s.pairing_violations,
                "over_budget": s.over_budget,
            })
        })
        .collect();
    let doc = serde_json::json!({
        "context_window": budget.context_window,
        "output_reserve": budget.output_reserve,
        "tokenizer": tokenizer.name(),
        "policies": rows,
    });
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/bench");
    if std::fs::create_dir_all(&dir).is_ok() {
        let _ = std::fs::write(
            dir.join("economy.json"),
            serde_json::to_string_pretty(&doc).unwrap_or_default(),
        );
    }
}
