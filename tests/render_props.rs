//! Property tests of the render engine (DESIGN.md §2): pairing, retention, budget, never
//! growing, determinism and the stable prefix, the report, and renders inside a running function.
//!
//! Paths are generated from a plan (plain data, so proptest can shrink it) and built the way the
//! store would load them: every path obeys the store's pairing rules.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::sync::{Arc, OnceLock};

use ctxd::domain::{
    CachePrices, ChainTail, ClosedChain, Expose, FunctionResult, FunctionStatus, Hash, MediaSource,
    Node, NodeContent, NodeId, Part, PathView, Role, ToolCall,
};
use ctxd::render::{
    Budget, Callers, Message, MessageRole, Microcompact, Options, Policy, Reduction, Rendered,
    Report, Trigger, message_tokens, render, visible,
};
use ctxd::tokens::{Tokenizer, Tokens};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

#[path = "common/provider_rules.rs"]
mod provider_rules;

const COUNTER: Tokenizer = Tokenizer::Heuristic;
/// Milliseconds between two nodes.
const TICK: i64 = 1000;

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        // No regression files: a failure prints its shrunk plan and path in full.
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

// ------------------------------------------------------------------------------------ plans

/// A text of `len` characters.
#[derive(Debug, Clone)]
struct Text {
    len: usize,
    unicode: bool,
}

#[derive(Debug, Clone)]
struct ResultPlan {
    texts: Vec<Text>,
    media: bool,
    is_error: bool,
}

#[derive(Debug, Clone)]
struct FunctionPlan {
    expose: Expose,
    output: Text,
    error: bool,
    /// The function's internal chain (loaded by the store only for `full`).
    inner: Vec<TurnPlan>,
}

#[derive(Debug, Clone)]
enum Answer {
    Tool(ResultPlan),
    Function(FunctionPlan),
}

/// An assistant message and one answer per call, in an order drawn from `order`.
#[derive(Debug, Clone)]
struct StepPlan {
    text: Option<Text>,
    calls: Vec<Answer>,
    order: Vec<u8>,
}

#[derive(Debug, Clone)]
struct TurnPlan {
    user: Text,
    media: bool,
    steps: Vec<StepPlan>,
}

/// A call of the last assistant message of a chain.
#[derive(Debug, Clone)]
enum TailCall {
    Answered(Answer),
    Open,
    /// A function_call with no result yet.
    Running(Expose),
}

/// The last assistant message of a chain, whose calls may be pending.
#[derive(Debug, Clone)]
struct TailPlan {
    text: Option<Text>,
    calls: Vec<TailCall>,
    order: Vec<u8>,
}

#[derive(Debug, Clone)]
struct ScopePlan {
    turns: Vec<TurnPlan>,
    tail: Option<TailPlan>,
}

/// A top-level path.
#[derive(Debug, Clone)]
struct SessionPlan {
    system: Option<Text>,
    developer: Option<Text>,
    body: ScopePlan,
    reuse_ids: bool,
}

/// A chain that calls a function which is still running: its `step` makes that call (at
/// `call_at` among its other calls, which are answered before the function opens, or pending).
#[derive(Debug, Clone)]
struct Opening {
    turns: Vec<TurnPlan>,
    step: TailPlan,
    call_at: usize,
    expose: Expose,
}

/// A path that ends inside a running function (nested `openings.len()` deep).
#[derive(Debug, Clone)]
struct RunPlan {
    system: Option<Text>,
    openings: Vec<Opening>,
    last: ScopePlan,
    reuse_ids: bool,
}

/// Policy, budget and clock of a render.
#[derive(Debug, Clone)]
struct Knobs {
    policy: Policy,
    budgeted: bool,
    /// 0: 50 ..= total/10; 1: total/10 ..= total; 2: total ..= 3 × total.
    mode: u8,
    frac: u32,
    parts: [Tokens; 4],
    idle: bool,
    gap: i64,
}

// ------------------------------------------------------------------------------- strategies

fn text(max: usize) -> impl Strategy<Value = Text> + Clone {
    (0..=max, prop::bool::weighted(0.1)).prop_map(|(len, unicode)| Text { len, unicode })
}

fn result_text(big: bool) -> BoxedStrategy<Text> {
    let len = if big {
        prop_oneof![8 => 1usize..300, 2 => 300usize..3000, 1 => 3000usize..12_000].boxed()
    } else {
        prop_oneof![6 => 1usize..400, 3 => 400usize..5000, 1 => 5000usize..20_000].boxed()
    };
    (len, prop::bool::weighted(0.1))
        .prop_map(|(len, unicode)| Text { len, unicode })
        .boxed()
}

fn result_plan(big: bool) -> impl Strategy<Value = ResultPlan> {
    let texts = prop_oneof![
        10 => result_text(big).prop_map(|t| vec![t]),
        1 => Just(Vec::new()),
        2 => (result_text(big), result_text(big)).prop_map(|(a, b)| vec![a, b]),
    ];
    (
        texts,
        prop::bool::weighted(0.05),
        prop::bool::weighted(0.15),
    )
        .prop_map(|(texts, media, is_error)| ResultPlan {
            texts,
            media,
            is_error,
        })
}

fn expose() -> impl Strategy<Value = Expose> + Clone {
    prop_oneof![2 => Just(Expose::Io), 3 => Just(Expose::Full), 1 => Just(Expose::None)]
}

/// `depth` bounds how deep `full` functions nest.
fn answer(depth: u32, big: bool) -> BoxedStrategy<Answer> {
    let tool = result_plan(big).prop_map(Answer::Tool);
    let inner = if depth == 0 {
        Just(Vec::new()).boxed()
    } else {
        prop_oneof![1 => Just(Vec::new()), 6 => vec(turn(depth - 1, false, 1..=3), 1..=1), 1 => vec(turn(depth - 1, false, 0..=2), 2..=2)]
            .boxed()
    };
    let function = (expose(), text(600), prop::bool::weighted(0.1), inner).prop_map(
        |(expose, output, error, inner)| {
            Answer::Function(FunctionPlan {
                expose,
                output,
                error,
                inner,
            })
        },
    );
    let function_weight = if depth == 0 { 1 } else { 2 };
    prop_oneof![8 => tool, function_weight => function].boxed()
}

fn order() -> impl Strategy<Value = Vec<u8>> + Clone {
    vec(any::<u8>(), 8)
}

fn step(depth: u32, big: bool) -> impl Strategy<Value = StepPlan> {
    let calls = if big { 3..=4 } else { 0..=3 };
    (
        // Now and then a long one: a harness that reasons in plain text, a looping model.
        prop::option::weighted(0.6, prop_oneof![8 => text(300), 2 => text(4000)]),
        vec(answer(depth, big), calls),
        order(),
    )
        .prop_map(|(text, calls, order)| StepPlan { text, calls, order })
}

fn turn(
    depth: u32,
    big: bool,
    steps: std::ops::RangeInclusive<usize>,
) -> impl Strategy<Value = TurnPlan> {
    (
        text(400),
        prop::bool::weighted(0.05),
        vec(step(depth, big), steps),
    )
        .prop_map(|(user, media, steps)| TurnPlan { user, media, steps })
}

fn tail_call() -> impl Strategy<Value = TailCall> {
    prop_oneof![
        3 => answer(1, false).prop_map(TailCall::Answered),
        2 => Just(TailCall::Open),
        1 => expose().prop_map(TailCall::Running),
    ]
}

fn tail(calls: std::ops::RangeInclusive<usize>) -> impl Strategy<Value = TailPlan> {
    (
        prop::option::weighted(0.5, text(300)),
        vec(tail_call(), calls),
        order(),
    )
        .prop_map(|(text, calls, order)| TailPlan { text, calls, order })
}

fn scope(
    turns: std::ops::RangeInclusive<usize>,
    pending: bool,
) -> impl Strategy<Value = ScopePlan> {
    let tail = if pending {
        prop::option::weighted(0.4, tail(1..=3)).boxed()
    } else {
        Just(None).boxed()
    };
    (vec(turn(2, false, 0..=3), turns), tail).prop_map(|(turns, tail)| ScopePlan { turns, tail })
}

fn session(pending: bool) -> impl Strategy<Value = SessionPlan> {
    (
        prop::option::weighted(0.8, text(3000)),
        prop::option::weighted(0.15, text(500)),
        scope(1..=8, pending),
        prop::bool::weighted(0.2),
    )
        .prop_map(|(system, developer, body, reuse_ids)| SessionPlan {
            system,
            developer,
            body,
            reuse_ids,
        })
}

/// Sessions of 60 to 120 tool results, mostly small.
fn big_session() -> impl Strategy<Value = SessionPlan> {
    (
        prop::option::weighted(0.8, text(3000)),
        vec(turn(1, true, 3..=4), 6..=9),
        prop::option::weighted(0.3, tail(1..=3)),
        prop::bool::weighted(0.2),
    )
        .prop_map(|(system, turns, tail, reuse_ids)| SessionPlan {
            system,
            developer: None,
            body: ScopePlan { turns, tail },
            reuse_ids,
        })
        .prop_filter("60 to 120 tool results", |plan| {
            (60..=120).contains(&plan_results(plan))
        })
}

fn opening(turns: std::ops::RangeInclusive<usize>) -> impl Strategy<Value = Opening> {
    (
        vec(turn(2, false, 0..=3), turns),
        tail(0..=2),
        any::<usize>(),
        expose(),
    )
        .prop_map(|(turns, step, call_at, expose)| Opening {
            turns,
            step,
            call_at,
            expose,
        })
}

fn run_plan() -> impl Strategy<Value = RunPlan> {
    let openings = prop_oneof![
        3 => opening(1..=5).prop_map(|o| vec![o]),
        1 => (opening(1..=4), opening(1..=2)).prop_map(|(a, b)| vec![a, b]),
    ];
    (
        prop::option::weighted(0.8, text(3000)),
        openings,
        scope(0..=2, true),
        prop::bool::weighted(0.2),
    )
        .prop_map(|(system, openings, last, reuse_ids)| RunPlan {
            system,
            openings,
            last,
            reuse_ids,
        })
}

fn policy() -> impl Strategy<Value = Policy> {
    let custom = (
        200usize..5000,
        (1usize..12, 1usize..6, 0usize..4),
        5 * 60_000i64..3 * 3_600_000,
        1usize..=3,
        any::<bool>(),
        prop::bool::weighted(0.2),
        (
            prop::bool::weighted(0.6),
            200usize..20_000,
            prop_oneof![Just(0 as Tokens), 1 as Tokens..2000],
            prop_oneof![Just(0usize), 20usize..400, Just(usize::MAX)],
        ),
        (
            prop_oneof![Just(0usize), 20usize..600, Just(usize::MAX)],
            prop_oneof![200usize..6000, Just(usize::MAX)],
            prop_oneof![20usize..1000, Just(usize::MAX)],
        ),
        (
            1usize..=8,
            prop_oneof![Just(100u32), Just(50u32), Just(25u32)],
            prop_oneof![Just(1250u32), Just(1000u32), Just(2000u32)],
            prop::bool::weighted(0.25),
        ),
    )
        .prop_map(
            |(
                max_tool_result_chars,
                (first, every, keep),
                idle_ms,
                retain_turns,
                snip,
                reactive,
                (stepped, recent, clear_at_least_tokens, max_tool_input_chars),
                (max_assistant_text_chars, recent_assistant_text_chars, recent_tool_input_chars),
                (payback_odds, read_per_mille, write_per_mille, provider_edits),
            )| {
                Policy {
                    max_tool_result_chars,
                    recent_tool_result_chars: recent,
                    microcompact: if stepped {
                        Microcompact::Stepped
                    } else {
                        Microcompact::OverBudget
                    },
                    microcompact_first: first,
                    microcompact_every: every,
                    microcompact_keep: keep,
                    clear_at_least_tokens,
                    max_tool_input_chars,
                    max_assistant_text_chars,
                    recent_assistant_text_chars,
                    recent_tool_input_chars,
                    idle_ms,
                    payback_odds,
                    retain_turns,
                    snip,
                    reactive,
                    prices: CachePrices {
                        read_per_mille,
                        write_per_mille,
                    },
                    provider_edits,
                    drop_invalid_reasoning: false,
                }
            },
        );
    prop_oneof![
        1 => Just(Policy::default()),
        1 => Just(Policy::over_budget()),
        4 => custom
    ]
}

fn knobs(policy: impl Strategy<Value = Policy>) -> impl Strategy<Value = Knobs> {
    (
        policy,
        prop::bool::weighted(0.95),
        prop_oneof![1 => Just(0u8), 2 => Just(1u8), 1 => Just(2u8)],
        any::<u32>(),
        [0u32..2000, 0u32..3000, 0u32..2000, 0u32..500],
        prop::bool::weighted(0.3),
        0i64..60_000,
    )
        .prop_map(|(policy, budgeted, mode, frac, parts, idle, gap)| Knobs {
            policy,
            budgeted,
            mode,
            frac,
            parts,
            idle,
            gap,
        })
}

fn plan_results(plan: &SessionPlan) -> usize {
    fn answers(a: &Answer) -> usize {
        match a {
            Answer::Tool(_) => 1,
            Answer::Function(f) => match f.expose {
                Expose::None => 0,
                Expose::Io => 1,
                Expose::Full => 1 + turns(&f.inner),
            },
        }
    }
    fn turns(ts: &[TurnPlan]) -> usize {
        ts.iter()
            .flat_map(|t| &t.steps)
            .flat_map(|s| &s.calls)
            .map(answers)
            .sum()
    }
    turns(&plan.body.turns)
}

// --------------------------------------------------------------------------------- building

fn pattern(unicode: bool) -> &'static str {
    static ASCII: OnceLock<String> = OnceLock::new();
    static UNICODE: OnceLock<String> = OnceLock::new();
    let lines = |word: &str| {
        let mut s = String::new();
        let mut n = 0;
        while s.chars().count() < 21_000 {
            let _ = writeln!(
                s,
                "{n:05} {word} fn main() {{ println!(\"lorem ipsum\"); }}"
            );
            n += 1;
        }
        s
    };
    if unicode {
        UNICODE.get_or_init(|| lines("日本語 ünïcødé ✓"))
    } else {
        ASCII.get_or_init(|| lines("ascii"))
    }
}

/// A text of `t.len` characters, different for each `salt`.
fn content(t: &Text, salt: usize) -> String {
    let prefix = format!("#{salt} ");
    let want = t.len.saturating_sub(prefix.len());
    let mut s = prefix;
    s.truncate(t.len);
    if t.unicode {
        s.extend(pattern(true).chars().take(want));
    } else {
        s.push_str(&pattern(false)[..want]);
    }
    s
}

const TOOLS: [&str; 4] = ["bash", "read_file", "grep", "web_fetch"];
const FUNCTIONS: [&str; 2] = ["researcher", "coder"];

/// A path as the store would load it, and what the generator knows about it.
#[derive(Debug, Clone, Default)]
struct Built {
    path: PathView,
    /// Assistant messages with calls still unanswered on this path, and those calls.
    pending: HashMap<NodeId, HashSet<String>>,
    /// The running functions the path passes through, outermost first.
    running: Vec<NodeId>,
}

struct Builder {
    clock: i64,
    seq: usize,
    salt: usize,
    reuse_ids: bool,
    built: Built,
}

/// Where a chain grows: its scope and its newest node.
#[derive(Clone, Copy)]
struct Cursor {
    scope: Option<NodeId>,
    parent: Option<NodeId>,
}

enum Event<'a> {
    Result(usize, &'a ResultPlan),
    Open(usize, &'a FunctionPlan),
    Close(usize),
    Running(usize, Expose),
}

impl Builder {
    fn new(reuse_ids: bool) -> Self {
        Self {
            clock: 1_700_000_000_000,
            seq: 0,
            salt: 0,
            reuse_ids,
            built: Built::default(),
        }
    }

    fn text(&mut self, t: &Text) -> String {
        self.salt += 1;
        content(t, self.salt)
    }

    fn push(&mut self, out: &mut Vec<Node>, at: &mut Cursor, content: NodeContent) -> NodeId {
        self.push_id(out, at, content, NodeId::new())
    }

    fn push_id(
        &mut self,
        out: &mut Vec<Node>,
        at: &mut Cursor,
        content: NodeContent,
        id: NodeId,
    ) -> NodeId {
        self.clock += TICK;
        out.push(Node {
            id,
            parent_id: at.parent,
            function_id: at.scope,
            content,
            created_at_ms: self.clock,
            hash: Hash([0; 32]),
        });
        at.parent = Some(id);
        id
    }

    fn message(&mut self, out: &mut Vec<Node>, at: &mut Cursor, role: Role, t: &Text) -> NodeId {
        let parts = vec![Part::Text(self.text(t))];
        self.push(
            out,
            at,
            NodeContent::Message {
                role,
                parts,
                tool_calls: Vec::new(),
            },
        )
    }

    fn call(&mut self, k: usize, function: bool) -> ToolCall {
        self.seq += 1;
        let call_id = if self.reuse_ids {
            format!("call_{k}")
        } else {
            format!("toolu_{:04}", self.seq)
        };
        let name = if function {
            FUNCTIONS[self.seq % FUNCTIONS.len()]
        } else {
            TOOLS[self.seq % TOOLS.len()]
        };
        ToolCall {
            call_id,
            name: name.to_owned(),
            // Every third call carries a body long enough for microcompact to stub.
            arguments_json: if self.seq.is_multiple_of(3) {
                serde_json::json!({
                    "path": format!("src/{}.rs", self.seq),
                    "content": "let x = 1;\n".repeat(12 + self.seq % 50),
                })
                .to_string()
            } else {
                format!(r#"{{"path":"src/{}.rs","n":{k}}}"#, self.seq)
            },
        }
    }

    fn turns(&mut self, out: &mut Vec<Node>, at: &mut Cursor, turns: &[TurnPlan]) {
        for turn in turns {
            let mut parts = vec![Part::Text(self.text(&turn.user))];
            if turn.media {
                parts.push(Part::Media {
                    mime_type: "image/png".to_owned(),
                    source: MediaSource::Url("https://example.com/shot.png".to_owned()),
                });
            }
            self.push(
                out,
                at,
                NodeContent::Message {
                    role: Role::User,
                    parts,
                    tool_calls: Vec::new(),
                },
            );
            for step in &turn.steps {
                let calls: Vec<TailCall> =
                    step.calls.iter().cloned().map(TailCall::Answered).collect();
                self.step(out, at, step.text.as_ref(), &calls, &step.order, None);
            }
        }
    }

    /// An assistant message with `calls` and their answers; with `running`, a further call at
    /// that position whose function_call comes last and opens a function (returned).
    fn step(
        &mut self,
        out: &mut Vec<Node>,
        at: &mut Cursor,
        text: Option<&Text>,
        calls: &[TailCall],
        order: &[u8],
        running: Option<(usize, Expose)>,
    ) -> Option<NodeId> {
        let mut plans: Vec<Option<&TailCall>> = calls.iter().map(Some).collect();
        if let Some((call_at, _)) = running {
            plans.insert(call_at % (calls.len() + 1), None);
        }
        let tool_calls: Vec<ToolCall> = plans
            .iter()
            .enumerate()
            .map(|(k, plan)| {
                let function = !matches!(
                    plan,
                    Some(TailCall::Answered(Answer::Tool(_)) | TailCall::Open)
                );
                self.call(k, function)
            })
            .collect();
        let mut parts = match text {
            Some(t) => vec![Part::Text(self.text(t))],
            None => Vec::new(),
        };
        if parts.is_empty() && tool_calls.is_empty() {
            parts.push(Part::Text("Done.".to_owned()));
        }
        let assistant = self.push(
            out,
            at,
            NodeContent::Message {
                role: Role::Assistant,
                parts,
                tool_calls: tool_calls.clone(),
            },
        );
        let key = |k: usize| u16::from(order[k % order.len()]);
        let mut events: Vec<(u16, Event)> = Vec::new();
        let mut pending = HashSet::new();
        for (k, plan) in plans.iter().enumerate() {
            match plan {
                Some(TailCall::Answered(Answer::Tool(r))) => {
                    events.push((key(k), Event::Result(k, r)))
                }
                Some(TailCall::Answered(Answer::Function(f))) => {
                    events.push((key(k), Event::Open(k, f)));
                    events.push((key(k) + key(k + 4), Event::Close(k)));
                }
                Some(TailCall::Open) => {
                    pending.insert(tool_calls[k].call_id.clone());
                }
                Some(TailCall::Running(expose)) => {
                    pending.insert(tool_calls[k].call_id.clone());
                    events.push((key(k), Event::Running(k, *expose)));
                }
                None => {
                    pending.insert(tool_calls[k].call_id.clone());
                }
            }
        }
        events.sort_by_key(|(key, _)| *key);
        let mut opened: HashMap<usize, (NodeId, Option<NodeId>, &FunctionPlan)> = HashMap::new();
        for (_, event) in events {
            let call = &tool_calls[match event {
                Event::Result(k, _)
                | Event::Open(k, _)
                | Event::Close(k)
                | Event::Running(k, _) => k,
            }];
            match event {
                Event::Result(_, r) => {
                    let mut parts: Vec<Part> =
                        r.texts.iter().map(|t| Part::Text(self.text(t))).collect();
                    if r.media {
                        parts.insert(
                            0,
                            Part::Media {
                                mime_type: "image/png".to_owned(),
                                source: MediaSource::Data(vec![7; 16]),
                            },
                        );
                    }
                    self.push(
                        out,
                        at,
                        NodeContent::ToolResult {
                            call_id: call.call_id.clone(),
                            name: call.name.clone(),
                            parts,
                            is_error: r.is_error,
                        },
                    );
                }
                Event::Open(k, f) => {
                    let fc = self.push(
                        out,
                        at,
                        NodeContent::FunctionCall {
                            call_id: call.call_id.clone(),
                            name: call.name.clone(),
                            input: "look into it".to_owned(),
                            expose: f.expose,
                        },
                    );
                    let mut inner = Vec::new();
                    let mut inner_at = Cursor {
                        scope: Some(fc),
                        parent: Some(fc),
                    };
                    self.turns(&mut inner, &mut inner_at, &f.inner);
                    let head = inner.last().map(|n| n.id);
                    // The store loads internal chains only for `full` functions.
                    if f.expose == Expose::Full && !inner.is_empty() {
                        self.built.path.chains.insert(fc, shared(inner));
                    }
                    opened.insert(k, (fc, head, f));
                }
                Event::Close(k) => {
                    let (fc, head, f) = opened[&k];
                    let output = self.text(&f.output);
                    self.push(
                        out,
                        at,
                        NodeContent::FunctionResult(FunctionResult {
                            call_id: call.call_id.clone(),
                            output,
                            status: if f.error {
                                FunctionStatus::Error
                            } else {
                                FunctionStatus::Completed
                            },
                            chain: Some(ClosedChain {
                                function_id: fc,
                                head_id: head,
                                head_hash: Hash([0; 32]),
                            }),
                        }),
                    );
                }
                Event::Running(_, expose) => {
                    self.push(
                        out,
                        at,
                        NodeContent::FunctionCall {
                            call_id: call.call_id.clone(),
                            name: call.name.clone(),
                            input: "work on it".to_owned(),
                            expose,
                        },
                    );
                }
            }
        }
        if !pending.is_empty() {
            self.built.pending.insert(assistant, pending);
        }
        running.map(|(call_at, expose)| {
            let call = &tool_calls[call_at % (calls.len() + 1)];
            self.push(
                out,
                at,
                NodeContent::FunctionCall {
                    call_id: call.call_id.clone(),
                    name: call.name.clone(),
                    input: "run".to_owned(),
                    expose,
                },
            )
        })
    }

    fn scope(&mut self, out: &mut Vec<Node>, at: &mut Cursor, plan: &ScopePlan) {
        self.turns(out, at, &plan.turns);
        if let Some(t) = &plan.tail {
            self.step(out, at, t.text.as_ref(), &t.calls, &t.order, None);
        }
    }

    fn preamble(
        &mut self,
        out: &mut Vec<Node>,
        at: &mut Cursor,
        system: Option<&Text>,
        developer: Option<&Text>,
    ) {
        if let Some(t) = system {
            self.message(out, at, Role::System, t);
        }
        if let Some(t) = developer {
            self.message(out, at, Role::Developer, t);
        }
    }
}

fn build(plan: &SessionPlan) -> Built {
    let mut b = Builder::new(plan.reuse_ids);
    let mut nodes = Vec::new();
    let mut at = Cursor {
        scope: None,
        parent: None,
    };
    b.preamble(
        &mut nodes,
        &mut at,
        plan.system.as_ref(),
        plan.developer.as_ref(),
    );
    b.scope(&mut nodes, &mut at, &plan.body);
    b.built.path.nodes = shared(nodes);
    b.built
}

/// P, and P with one more complete turn.
fn build_pair(plan: &SessionPlan, extra: &TurnPlan) -> (Built, Built) {
    let mut b = Builder::new(plan.reuse_ids);
    let mut nodes = Vec::new();
    let mut at = Cursor {
        scope: None,
        parent: None,
    };
    b.preamble(
        &mut nodes,
        &mut at,
        plan.system.as_ref(),
        plan.developer.as_ref(),
    );
    b.scope(&mut nodes, &mut at, &plan.body);
    let mut first = b.built.clone();
    first.path.nodes = shared(nodes.clone());
    b.turns(&mut nodes, &mut at, std::slice::from_ref(extra));
    b.built.path.nodes = shared(nodes);
    (first, b.built)
}

fn build_run(plan: &RunPlan) -> Built {
    let mut b = Builder::new(plan.reuse_ids);
    let mut nodes = Vec::new();
    let mut at = Cursor {
        scope: None,
        parent: None,
    };
    b.preamble(&mut nodes, &mut at, plan.system.as_ref(), None);
    for opening in &plan.openings {
        b.turns(&mut nodes, &mut at, &opening.turns);
        let s = &opening.step;
        let fc = b
            .step(
                &mut nodes,
                &mut at,
                s.text.as_ref(),
                &s.calls,
                &s.order,
                Some((opening.call_at, opening.expose)),
            )
            .expect("opens a function");
        b.built.running.push(fc);
        at = Cursor {
            scope: Some(fc),
            parent: Some(fc),
        };
    }
    b.scope(&mut nodes, &mut at, &plan.last);
    b.built.path.scope = at.scope;
    b.built.path.nodes = shared(nodes);
    b.built
}

/// The generator's own check: every chain of the path passes the store's pairing rules, one
/// node at a time, with parents linked and times increasing.
fn check_valid(built: &Built) -> Check {
    let path = &built.path;
    let mut chains: Vec<(Option<NodeId>, Vec<&Node>)> = Vec::new();
    for node in &path.nodes {
        match chains.last_mut() {
            Some((scope, nodes)) if *scope == node.function_id => nodes.push(&**node),
            _ => chains.push((node.function_id, vec![&**node])),
        }
    }
    for (f, nodes) in &path.chains {
        chains.push((Some(*f), nodes.iter().map(|n| &**n).collect()));
    }
    for (scope, nodes) in &chains {
        let mut tail = ChainTail::default();
        let mut parent = nodes[0].parent_id;
        if scope.is_some() {
            prop_assert_eq!(parent, *scope, "a function's chain hangs under its call");
        } else {
            prop_assert_eq!(parent, None);
        }
        let mut time = 0;
        for (i, node) in nodes.iter().enumerate() {
            prop_assert_eq!(node.function_id, *scope);
            prop_assert_eq!(node.parent_id, parent);
            prop_assert!(node.created_at_ms > time);
            parent = Some(node.id);
            time = node.created_at_ms;
            let field = format!("nodes[{i}]");
            node.content
                .validate(&field)
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            let mut content = node.content.clone();
            tail.admit(&field, node.id, &mut content)
                .map_err(|e| TestCaseError::fail(format!("{e}\n{}", describe(built))))?;
            prop_assert_eq!(&content, &node.content);
            if let NodeContent::FunctionResult(FunctionResult { chain: Some(c), .. }) =
                &node.content
            {
                let inner = path.chains.get(&c.function_id);
                prop_assert_eq!(
                    inner.and_then(|n| n.last()).map(|n| n.id),
                    c.head_id.filter(|_| inner.is_some())
                );
            }
        }
        // Only the chains the path ends in may have pending calls.
        let pending = tail.pending();
        if !pending.is_empty() {
            let ends_here = scope.is_none_or(|s| built.running.contains(&s));
            prop_assert!(
                ends_here,
                "a closed function has pending calls {:?}",
                pending
            );
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------- options

fn unbudgeted_total(path: &PathView, callers: Callers) -> Tokens {
    visible(path, callers)
        .iter()
        .map(|m| message_tokens(m, &COUNTER))
        .sum()
}

fn options(path: &PathView, callers: Callers, k: &Knobs) -> Options {
    let head = path.nodes.last().map_or(0, |n| n.created_at_ms);
    let now_ms = if k.idle {
        head + k.policy.idle_ms + k.gap
    } else {
        head + k.gap
    };
    let budget = k.budgeted.then(|| {
        let total = unbudgeted_total(path, callers).max(50);
        let span = |lo: Tokens, hi: Tokens| lo + k.frac % (hi.saturating_sub(lo) + 1);
        let history = match k.mode {
            0 => span(50, (total / 10).max(50)),
            1 => span((total / 10).max(50), total),
            _ => span(total, total.saturating_mul(3)),
        };
        let [output_reserve, system, tools, schema] = k.parts;
        Budget {
            context_window: history + output_reserve + system + tools + schema,
            output_reserve,
            system,
            tools,
            schema,
        }
    });
    Options {
        callers,
        budget,
        policy: k.policy,
        now_ms,
        last_call_ms: None,
        seen: Default::default(),
    }
}

/// The same budget with only budget reduction: no microcompact, no snip.
fn reduction_only(options: &Options) -> Options {
    Options {
        policy: Policy {
            microcompact_first: usize::MAX,
            microcompact_every: usize::MAX,
            idle_ms: i64::MAX,
            snip: false,
            reactive: false,
            ..options.policy
        },
        ..*options
    }
}

fn unbudgeted(options: &Options) -> Options {
    Options {
        budget: None,
        ..*options
    }
}

fn history(options: &Options) -> Option<Tokens> {
    options.budget.and_then(|b| b.history().ok())
}

// ---------------------------------------------------------------------------------- display

/// A node id, shortened for display.
fn short(id: NodeId) -> String {
    let s = id.to_string();
    format!("#{}", &s[s.len() - 5..])
}

/// The path, one node a line.
fn describe(built: &Built) -> String {
    fn size(parts: &[Part]) -> String {
        parts
            .iter()
            .map(|p| match p {
                Part::Text(t) => format!("{}c", t.chars().count()),
                Part::Media { .. } => "media".to_owned(),
                Part::Block(_) => "block".to_owned(),
            })
            .collect::<Vec<_>>()
            .join("+")
    }
    fn chain(
        out: &mut String,
        nodes: &[Arc<Node>],
        chains: &HashMap<NodeId, Vec<Arc<Node>>>,
        indent: &str,
    ) {
        for node in nodes {
            let what = match &node.content {
                NodeContent::Message {
                    role,
                    parts,
                    tool_calls,
                } => {
                    let calls: Vec<&str> = tool_calls.iter().map(|c| c.call_id.as_str()).collect();
                    format!("{} [{}] -> {calls:?}", role.as_str(), size(parts))
                }
                NodeContent::ToolResult {
                    call_id,
                    parts,
                    is_error,
                    ..
                } => format!("tool[{call_id}] [{}] error={is_error}", size(parts)),
                NodeContent::FunctionCall {
                    call_id, expose, ..
                } => format!("function_call[{call_id}] {expose:?}"),
                NodeContent::FunctionResult(r) => {
                    format!(
                        "function_result[{}] [{}c]",
                        r.call_id,
                        r.output.chars().count()
                    )
                }
            };
            let scope = node
                .function_id
                .map(|f| format!(" in {}", short(f)))
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "{indent}{}{scope} t+{}s: {what}",
                short(node.id),
                (node.created_at_ms - 1_700_000_000_000) / 1000
            );
            if let Some(inner) = chains.get(&node.id) {
                chain(out, inner, chains, &format!("{indent}    "));
            }
        }
    }
    let mut out = format!(
        "scope: {}\n",
        built.path.scope.map_or("top level".to_owned(), short)
    );
    chain(&mut out, &built.path.nodes, &built.path.chains, "  ");
    for summary in &built.path.summaries {
        let covers: Vec<String> = summary.covers.iter().map(|id| short(*id)).collect();
        let _ = writeln!(out, "summary {:?} over {}", summary.kind, covers.join(" "));
    }
    if !built.path.pinned.is_empty() {
        let mut pinned: Vec<String> = built.path.pinned.iter().map(|id| short(*id)).collect();
        pinned.sort();
        let _ = writeln!(out, "pinned {}", pinned.join(" "));
    }
    out
}

fn show(messages: &[Message]) -> String {
    messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            format!(
                "{i}: {:?}{}{}{} {:?} {:?}",
                m.role,
                m.tool_call_id
                    .as_ref()
                    .map(|c| format!("[{c}]"))
                    .unwrap_or_default(),
                if m.tool_calls.is_empty() {
                    String::new()
                } else {
                    format!(
                        " -> {}",
                        m.tool_calls
                            .iter()
                            .map(|c| c.call_id.as_str())
                            .collect::<Vec<_>>()
                            .join(",")
                    )
                },
                if m.function_id.is_some() { " (fn)" } else { "" },
                m.reduction,
                m.node_ids.iter().map(|id| short(*id)).collect::<Vec<_>>(),
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

// ----------------------------------------------------------------------------------- checks

type Check = Result<(), TestCaseError>;

/// The OpenAI and Anthropic documents of a render satisfy their pairing rules.
fn check_documents(r: &Rendered) -> Check {
    use ctxd::provider::format::{anthropic_messages, openai_chat};
    provider_rules::check_openai(&openai_chat(&r.messages))
        .map_err(|e| TestCaseError::fail(format!("OpenAI document: {e}")))?;
    provider_rules::check_anthropic(&anthropic_messages(&r.messages))
        .map_err(|e| TestCaseError::fail(format!("Anthropic document: {e}")))
}

/// Property 1: every assistant message with calls is followed at once by exactly one answer to
/// each call (pending ones at the tail excepted), and no tool message stands anywhere else.
fn check_pairing(built: &Built, r: &Rendered) -> Check {
    let msgs = &r.messages;
    let mut i = 0;
    while i < msgs.len() {
        let m = &msgs[i];
        prop_assert!(
            m.role != MessageRole::Tool,
            "tool message {i} answers no call of the message before it\n{}",
            show(msgs)
        );
        i += 1;
        if m.role != MessageRole::Assistant || m.tool_calls.is_empty() {
            continue;
        }
        let calls: Vec<&str> = m.tool_calls.iter().map(|c| c.call_id.as_str()).collect();
        let unique: HashSet<&str> = calls.iter().copied().collect();
        prop_assert_eq!(
            unique.len(),
            calls.len(),
            "duplicate call ids in message {}",
            i - 1
        );
        let mut answered: Vec<&str> = Vec::new();
        while i < msgs.len() && msgs[i].role == MessageRole::Tool {
            prop_assert_eq!(
                msgs[i].function_id,
                m.function_id,
                "tool message {} is not in its caller's scope\n{}",
                i,
                show(msgs)
            );
            answered.push(msgs[i].tool_call_id.as_deref().unwrap_or(""));
            i += 1;
        }
        let pending = m
            .node_ids
            .first()
            .and_then(|id| built.pending.get(id))
            .cloned()
            .unwrap_or_default();
        let mut want: Vec<&str> = calls
            .iter()
            .copied()
            .filter(|c| !pending.contains(*c))
            .collect();
        want.sort_unstable();
        let mut got = answered.clone();
        got.sort_unstable();
        prop_assert_eq!(
            got,
            want,
            "the group of message {} answers {:?}\n{}",
            i - answered.len() - 1,
            answered,
            show(msgs)
        );
    }
    // A `full` function's transcript follows the whole group its result is in. A pinned message
    // a summary covers stands after that summary instead, with its own tool group.
    for (at, m) in msgs.iter().enumerate() {
        let Some(f) = m.function_id.filter(|f| built.path.chains.contains_key(f)) else {
            continue;
        };
        if m.pinned_under.is_some() {
            continue;
        }
        let result = msgs
            .iter()
            .position(|r| r.role == MessageRole::Tool && r.node_ids.contains(&f));
        prop_assert!(
            result.is_some(),
            "message {} of a function's transcript renders without the function's result\n{}",
            at,
            show(msgs)
        );
        let mut end = result.unwrap_or_default();
        while end < msgs.len() && msgs[end].role == MessageRole::Tool {
            end += 1;
        }
        prop_assert!(
            at >= end,
            "message {} of a function's transcript comes before the end of its group ({})\n{}",
            at,
            end,
            show(msgs)
        );
    }
    Ok(())
}

/// `function` and the `full` functions completed inside it, at any depth.
fn functions_within(path: &PathView, function: NodeId) -> HashSet<NodeId> {
    let scope_of: HashMap<NodeId, Option<NodeId>> = path
        .nodes
        .iter()
        .chain(path.chains.values().flatten())
        .map(|n| (n.id, n.function_id))
        .collect();
    let mut inside = HashSet::from([function]);
    loop {
        let more: Vec<NodeId> = path
            .chains
            .keys()
            .filter(|f| !inside.contains(*f))
            .filter(|f| {
                scope_of
                    .get(*f)
                    .copied()
                    .flatten()
                    .is_some_and(|s| inside.contains(&s))
            })
            .copied()
            .collect();
        if more.is_empty() {
            return inside;
        }
        inside.extend(more);
    }
}

/// Index of the message made from `id` alone.
fn index_of(msgs: &[Message], id: NodeId) -> Option<usize> {
    msgs.iter().position(|m| m.node_ids == [id])
}

fn top_users(path: &PathView) -> Vec<NodeId> {
    path.nodes
        .iter()
        .filter(|n| {
            n.function_id.is_none()
                && matches!(
                    n.content,
                    NodeContent::Message {
                        role: Role::User,
                        ..
                    }
                )
        })
        .map(|n| n.id)
        .collect()
}

/// Property 2: the newest turn renders with the same messages as unbudgeted, only truncated;
/// the newest `retain_turns` likewise when they fit and the request is not reactive.
fn check_retention(
    built: &Built,
    options: &Options,
    u: &Rendered,
    b: &Rendered,
    ro: &Rendered,
) -> Check {
    let users = top_users(&built.path);
    let Some(&last) = users.last() else {
        return Ok(());
    };
    let (iu, ib, iro) = (
        index_of(&u.messages, last).expect("the newest user message renders unbudgeted"),
        index_of(&b.messages, last),
        index_of(&ro.messages, last).expect("reduction drops nothing"),
    );
    prop_assert!(
        ib.is_some(),
        "the newest user message was dropped\n{}",
        show(&b.messages)
    );
    let ib = ib.unwrap_or_default();
    let (nu, nb, nro) = (&u.messages[iu..], &b.messages[ib..], &ro.messages[iro..]);
    prop_assert_eq!(
        nb.len(),
        nu.len(),
        "the newest turn lost messages\n{}",
        show(&b.messages)
    );
    if options.policy.microcompact == Microcompact::Stepped {
        return check_stepped_retention(options, u, b, nu, nb);
    }
    for ((mu, mb), mro) in nu.iter().zip(nb).zip(nro) {
        prop_assert_eq!(&mb.node_ids, &mu.node_ids);
        prop_assert_eq!(mb.role, mu.role);
        prop_assert_eq!(&mb.tool_calls, &mu.tool_calls);
        prop_assert!(
            mb.reduction != Reduction::Cleared,
            "cleared in the newest turn: {:?}",
            mb.node_ids
        );
        if !matches!(mb.reduction, Reduction::Truncated { .. }) {
            prop_assert_eq!(mb, mu);
        }
        // Truncation is the same cut with or without the later steps.
        prop_assert_eq!(mb, mro);
    }

    // The newest `retain_turns` turns, when they fit after reduction.
    let Some(limit) = history(options) else {
        return Ok(());
    };
    if options.policy.reactive {
        return Ok(());
    }
    let keep = options.policy.retain_turns.max(1);
    let from_user = users[users.len().saturating_sub(keep)];
    let first_user = users[0];
    let from = index_of(&ro.messages, from_user).expect("reduction drops nothing");
    let preamble = index_of(&ro.messages, first_user).expect("reduction drops nothing");
    let need: Tokens =
        ro.tokens[..preamble].iter().sum::<Tokens>() + ro.tokens[from..].iter().sum::<Tokens>();
    if need > limit {
        return Ok(());
    }
    let Some(at) = index_of(&b.messages, from_user) else {
        return Err(TestCaseError::fail(format!(
            "retained turns fit ({need} ≤ {limit}) but their first user message was dropped\n{}",
            show(&b.messages)
        )));
    };
    prop_assert_eq!(
        &b.messages[at..],
        &ro.messages[from..],
        "retained turns fit ({} ≤ {}) but were reduced beyond truncation",
        need,
        limit
    );
    prop_assert_eq!(
        &b.messages[..preamble],
        &ro.messages[..preamble],
        "the preamble changed"
    );
    Ok(())
}

/// Property 2, stepped: results age by count, not by turn. The newest turn keeps every message
/// (its calls' ids and names; arguments may be stubbed), and the newest `microcompact_keep`
/// results are never cleared unless the provider refused the request.
fn check_stepped_retention(
    options: &Options,
    u: &Rendered,
    b: &Rendered,
    nu: &[Message],
    nb: &[Message],
) -> Check {
    for (mu, mb) in nu.iter().zip(nb) {
        prop_assert_eq!(&mb.node_ids, &mu.node_ids);
        prop_assert_eq!(mb.role, mu.role);
        let ids = |m: &Message| -> Vec<(String, String)> {
            m.tool_calls
                .iter()
                .map(|c| (c.call_id.clone(), c.name.clone()))
                .collect()
        };
        prop_assert_eq!(ids(mb), ids(mu));
        if mb.reduction == Reduction::None && mb.stubbed_inputs == 0 {
            prop_assert_eq!(mb, mu);
        }
    }
    if options.policy.reactive {
        return Ok(());
    }
    let newest: Vec<&[NodeId]> = u
        .messages
        .iter()
        .filter(|m| m.role == MessageRole::Tool)
        .rev()
        .take(options.policy.microcompact_keep)
        .map(|m| m.node_ids.as_slice())
        .collect();
    for m in &b.messages {
        prop_assert!(
            !(m.reduction == Reduction::Cleared && newest.contains(&m.node_ids.as_slice())),
            "one of the newest results was cleared: {:?}",
            m.node_ids
        );
    }
    Ok(())
}

/// Property 3: `fits` says whether the total is within the history's share; when it is not and
/// snip is on, nothing droppable is left.
fn check_budget(built: &Built, options: &Options, u: &Rendered, b: &Rendered) -> Check {
    let Some(limit) = history(options) else {
        prop_assert!(b.report.fits);
        prop_assert_eq!(b.report.over_by, 0);
        return Ok(());
    };
    let total = b.report.total_tokens;
    prop_assert_eq!(b.report.history_budget, Some(limit));
    prop_assert_eq!(
        b.report.fits,
        total <= limit,
        "total {} history {}",
        total,
        limit
    );
    prop_assert_eq!(b.report.summary_needed, !b.report.fits);
    prop_assert_eq!(b.report.over_by, total.saturating_sub(limit));
    // The provider's edit drops no turn: what it cannot clear stays, and the report says so.
    if b.report.fits || !options.policy.snip || options.policy.provider_edits {
        return Ok(());
    }
    // Only the preamble and the turn holding the tail (or a running function) may remain.
    let users: Vec<usize> = top_users(&built.path)
        .into_iter()
        .filter_map(|id| index_of(&u.messages, id))
        .collect();
    let (Some(&first), Some(&newest)) = (users.first(), users.last()) else {
        return Ok(());
    };
    let droppable: HashSet<NodeId> = u.messages[first..newest]
        .iter()
        .flat_map(|m| m.node_ids.iter().copied())
        .collect();
    let left: Vec<&Message> = b
        .messages
        .iter()
        .filter(|m| m.node_ids.iter().any(|id| droppable.contains(id)))
        .collect();
    prop_assert!(
        left.is_empty(),
        "over budget ({} > {}) with snip on, yet {} messages of older turns remain\n{}",
        total,
        limit,
        left.len(),
        show(&b.messages)
    );
    Ok(())
}

fn tokens_by_ids(r: &Rendered) -> HashMap<Vec<NodeId>, Tokens> {
    r.messages
        .iter()
        .zip(&r.tokens)
        .map(|(m, t)| (m.node_ids.clone(), *t))
        .collect()
}

/// Property 4: no step grows the context; a render that fits after reduction alone is that
/// render; each cleared or truncated message is smaller than it was.
fn check_never_grows(options: &Options, u: &Rendered, b: &Rendered, ro: &Rendered) -> Check {
    prop_assert!(b.report.total_tokens <= u.report.total_tokens);
    prop_assert!(ro.report.total_tokens <= u.report.total_tokens);
    let stepped = options.policy.microcompact == Microcompact::Stepped;
    if options.budget.is_some() && ro.report.fits && !options.policy.reactive && !stepped {
        prop_assert_eq!(
            b,
            ro,
            "fits after reduction alone, yet later steps changed it"
        );
    }
    let unreduced = tokens_by_ids(u);
    let reduced = tokens_by_ids(ro);
    for (m, t) in b.messages.iter().zip(&b.tokens) {
        match m.reduction {
            Reduction::None => {}
            Reduction::Truncated { .. } => {
                prop_assert!(
                    *t < unreduced[&m.node_ids],
                    "truncated {:?} grew",
                    m.node_ids
                );
            }
            // The provider's edit clears a result as short as its placeholder too: it stays
            // as it was, no longer.
            Reduction::Cleared if options.policy.provider_edits => {
                prop_assert!(
                    *t <= unreduced[&m.node_ids],
                    "cleared {:?} grew",
                    m.node_ids
                );
            }
            Reduction::Cleared => {
                prop_assert!(*t < unreduced[&m.node_ids], "cleared {:?} grew", m.node_ids);
                // Stepped, a result's cut depends on its zone, not only on the budget.
                prop_assert!(
                    stepped || *t < reduced[&m.node_ids],
                    "cleared {:?} grew over its cut",
                    m.node_ids
                );
            }
        }
        if m.stubbed_inputs > 0 {
            prop_assert!(*t < unreduced[&m.node_ids], "stubbed {:?} grew", m.node_ids);
        }
    }
    Ok(())
}

/// Property 6: the report agrees with the messages (tokens, breakdown, what was snipped).
fn check_report(u: &Rendered, b: &Rendered) -> Check {
    let r = &b.report;
    prop_assert_eq!(b.tokens.len(), b.messages.len());
    prop_assert_eq!(r.messages, b.messages.len());
    let counted: Vec<Tokens> = b
        .messages
        .iter()
        .map(|m| message_tokens(m, &COUNTER))
        .collect();
    prop_assert_eq!(&b.tokens, &counted);
    prop_assert_eq!(r.total_tokens, b.tokens.iter().sum::<Tokens>());
    prop_assert_eq!(r.breakdown.total(), r.total_tokens);
    let by_role = |roles: &[MessageRole]| -> Tokens {
        b.messages
            .iter()
            .zip(&b.tokens)
            .filter(|(m, _)| roles.contains(&m.role))
            .map(|(_, t)| *t)
            .sum()
    };
    let bd = &r.breakdown;
    prop_assert_eq!(
        bd.system,
        by_role(&[MessageRole::System, MessageRole::Developer])
    );
    prop_assert_eq!(bd.user, by_role(&[MessageRole::User]));
    prop_assert_eq!(
        bd.assistant_text + bd.tool_calls,
        by_role(&[MessageRole::Assistant])
    );
    prop_assert_eq!(bd.tool_results + bd.markers, by_role(&[MessageRole::Tool]));
    prop_assert_eq!(bd.summaries, 0);

    let kept: HashSet<NodeId> = b
        .messages
        .iter()
        .flat_map(|m| m.node_ids.iter().copied())
        .collect();
    let missing: Vec<NodeId> = u
        .messages
        .iter()
        .flat_map(|m| m.node_ids.iter().copied())
        .filter(|id| !kept.contains(id))
        .collect();
    prop_assert_eq!(sorted(r.snipped.clone()), sorted(missing), "snipped ids");
    prop_assert!(r.stable_prefix_messages <= b.messages.len());
    Ok(())
}

/// Property 6, the tiers' counts: what the report says was truncated or cleared is what the
/// messages show.
fn check_reduction_counts(b: &Rendered) -> Check {
    let r = &b.report;
    // A cut assistant text is reported as such, a cut or cleared tool result as a result.
    let results: Vec<&Message> = b
        .messages
        .iter()
        .filter(|m| m.role != MessageRole::Assistant)
        .collect();
    let texts: Vec<&Message> = b
        .messages
        .iter()
        .filter(|m| m.role == MessageRole::Assistant && m.reduction != Reduction::None)
        .collect();
    prop_assert!(
        texts
            .iter()
            .all(|m| matches!(m.reduction, Reduction::Truncated { .. })),
        "an assistant message is only ever cut"
    );
    prop_assert_eq!(
        sorted(r.texts_cut.clone()),
        sorted(
            texts
                .iter()
                .flat_map(|m| m.node_ids.iter().copied())
                .collect()
        ),
        "texts_cut ids"
    );
    prop_assert_eq!(r.saved_text_cut.items, texts.len());
    let with = |pick: fn(&Reduction) -> bool| -> Vec<NodeId> {
        results
            .iter()
            .filter(|m| pick(&m.reduction))
            .flat_map(|m| m.node_ids.iter().copied())
            .collect()
    };
    let truncated = with(|r| matches!(r, Reduction::Truncated { .. }));
    let cleared = with(|r| matches!(r, Reduction::Cleared));
    let count =
        |pick: fn(&Reduction) -> bool| results.iter().filter(|m| pick(&m.reduction)).count();
    prop_assert_eq!(
        r.results_cleared,
        count(|r| matches!(r, Reduction::Cleared)),
        "results_cleared disagrees with the messages"
    );
    prop_assert_eq!(sorted(r.cleared.clone()), sorted(cleared), "cleared ids");
    prop_assert_eq!(
        r.results_truncated,
        count(|r| matches!(r, Reduction::Truncated { .. })),
        "results_truncated disagrees with the messages\n{}",
        show(&b.messages)
    );
    prop_assert_eq!(
        sorted(r.truncated.clone()),
        sorted(truncated),
        "truncated ids"
    );
    let stubbed: Vec<&Message> = b.messages.iter().filter(|m| m.stubbed_inputs > 0).collect();
    prop_assert_eq!(
        r.inputs_stubbed,
        stubbed.iter().map(|m| m.stubbed_inputs).sum::<usize>(),
        "inputs_stubbed disagrees with the messages"
    );
    prop_assert_eq!(
        sorted(r.stubbed.clone()),
        sorted(
            stubbed
                .iter()
                .flat_map(|m| m.node_ids.iter().copied())
                .collect()
        ),
        "stubbed ids"
    );
    prop_assert_eq!(r.saved_truncation.items, r.results_truncated);
    prop_assert_eq!(r.saved_clearing.items, r.results_cleared);
    prop_assert_eq!(r.saved_stubbing.items, r.inputs_stubbed);
    // A stub is valid JSON wherever the arguments were.
    for m in &stubbed {
        for call in &m.tool_calls {
            prop_assert!(
                serde_json::from_str::<serde_json::Value>(&call.arguments_json).is_ok(),
                "a stub is not JSON: {}",
                call.arguments_json
            );
        }
    }
    Ok(())
}

fn sorted(mut ids: Vec<NodeId>) -> Vec<NodeId> {
    ids.sort_unstable();
    ids
}

/// No budget: the visible messages, untouched, and a report that says they fit.
fn check_unbudgeted(built: &Built, options: &Options, u: &Rendered) -> Check {
    prop_assert_eq!(&u.messages, &visible(&built.path, options.callers));
    prop_assert!(u.messages.iter().all(|m| m.reduction == Reduction::None));
    let r = &u.report;
    prop_assert!(r.fits && !r.summary_needed);
    prop_assert_eq!(r.over_by, 0);
    prop_assert_eq!(r.history_budget, None);
    prop_assert!(r.snipped.is_empty() && r.cleared.is_empty() && r.truncated.is_empty());
    prop_assert_eq!(r.turns_snipped + r.results_cleared + r.results_truncated, 0);
    prop_assert_eq!(r.trigger, None);
    prop_assert_eq!(r.stable_prefix_messages, u.messages.len());
    check_report(u, u)
}

/// Property 5, the stable prefix: P and P + one more complete turn under the same options.
fn check_stable_prefix(p1: &Built, p2: &Built, options: &Options) -> Check {
    let r1 = render(&p1.path, options, &COUNTER);
    let r2 = render(&p2.path, options, &COUNTER);
    if r1.report.turns_snipped == r2.report.turns_snipped {
        let stable = r1.report.stable_prefix_messages;
        prop_assert!(
            r2.messages.len() >= stable && r1.messages[..stable] == r2.messages[..stable],
            "the first {} messages changed after an append\nP:\n{}\nP+1:\n{}\npath:\n{}options: {:?} history {:?}\nreport 1: {}\nreport 2: {}",
            stable,
            show(&r1.messages),
            show(&r2.messages),
            describe(p2),
            options.policy,
            history(options),
            brief(&r1.report),
            brief(&r2.report)
        );
    }
    Ok(())
}

/// Everything about one budgeted render of a top-level path.
struct Renders {
    options: Options,
    u: Rendered,
    b: Rendered,
    ro: Rendered,
}

fn renders(built: &Built, callers: Callers, k: &Knobs) -> Renders {
    let options = options(&built.path, callers, k);
    Renders {
        u: render(&built.path, &unbudgeted(&options), &COUNTER),
        b: render(&built.path, &options, &COUNTER),
        ro: render(&built.path, &reduction_only(&options), &COUNTER),
        options,
    }
}

/// Properties 1 to 4 and 6 of one budgeted render of a top-level path.
fn check_budgeted(built: &Built, r: &Renders) -> Check {
    check_pairing(built, &r.b)?;
    check_retention(built, &r.options, &r.u, &r.b, &r.ro)?;
    check_budget(built, &r.options, &r.u, &r.b)?;
    check_never_grows(&r.options, &r.u, &r.b, &r.ro)?;
    check_report(&r.u, &r.b)
}

fn context(built: &Built, r: &Renders) -> String {
    format!(
        "\npath:\n{}options: {:?}\nhistory: {:?} now: +{}ms\nreport: {}\nunbudgeted:\n{}\nbudgeted:\n{}",
        describe(built),
        r.options.policy,
        history(&r.options),
        r.options.now_ms - built.path.nodes.last().map_or(0, |n| n.created_at_ms),
        brief(&r.b.report),
        show(&r.u.messages),
        show(&r.b.messages),
    )
}

/// The report without its id lists.
fn brief(r: &Report) -> String {
    format!(
        "total {} ({:?}), {} messages, fits {}, over_by {}, truncated {} (ids {}), cleared {} (ids {}), \
         snipped {} turns ({} ids), trigger {:?}, boundary {}, stable {}",
        r.total_tokens,
        r.breakdown,
        r.messages,
        r.fits,
        r.over_by,
        r.results_truncated,
        r.truncated.len(),
        r.results_cleared,
        r.cleared.len(),
        r.turns_snipped,
        r.snipped.len(),
        r.trigger,
        r.microcompact_boundary,
        r.stable_prefix_messages
    )
}

fn with_context(check: Check, built: &Built, r: &Renders) -> Check {
    check.map_err(|e| match e {
        TestCaseError::Fail(msg) => TestCaseError::fail(format!("{msg}{}", context(built, r))),
        other => other,
    })
}

// ------------------------------------------------------------------------------- properties

proptest! {
    #![proptest_config(config(2000))]

    /// 1. Pairing, under every budget and policy.
    #[test]
    fn pairing(plan in session(true), k in knobs(policy())) {
        let built = build(&plan);
        let r = renders(&built, Callers::All, &k);
        with_context(check_pairing(&built, &r.u), &built, &r)?;
        with_context(check_pairing(&built, &r.b), &built, &r)?;
        with_context(check_pairing(&built, &r.ro), &built, &r)?;
        // The provider documents of every render keep their API's pairing rules.
        for rendered in [&r.u, &r.b, &r.ro] {
            with_context(check_documents(rendered), &built, &r)?;
        }
    }

    /// 2. Retention of the newest turn, and of the newest `retain_turns` when they fit.
    #[test]
    fn retention(plan in session(true), k in knobs(policy())) {
        let built = build(&plan);
        let r = renders(&built, Callers::All, &k);
        with_context(check_retention(&built, &r.options, &r.u, &r.b, &r.ro), &built, &r)?;
    }

    /// 3. Budget: `fits` is the truth, and nothing droppable stays when it does not fit.
    #[test]
    fn budget(plan in session(true), k in knobs(policy())) {
        let built = build(&plan);
        let r = renders(&built, Callers::All, &k);
        with_context(check_budget(&built, &r.options, &r.u, &r.b), &built, &r)?;
    }

    /// 4. No step grows the context, and a render that fits is left alone.
    #[test]
    fn never_grows(plan in session(true), k in knobs(policy())) {
        let built = build(&plan);
        let r = renders(&built, Callers::All, &k);
        with_context(check_never_grows(&r.options, &r.u, &r.b, &r.ro), &built, &r)?;
    }

    /// 5. Determinism: the same inputs render identical output.
    #[test]
    fn determinism(plan in session(true), k in knobs(policy())) {
        let built = build(&plan);
        for callers in [Callers::All, Callers::None] {
            let options = options(&built.path, callers, &k);
            let once = render(&built.path, &options, &COUNTER);
            prop_assert_eq!(&once, &render(&built.path, &options, &COUNTER));
            // Chains are looked up, never iterated: a rebuilt map changes nothing.
            let mut copy = built.path.clone();
            copy.chains = copy.chains.into_iter().collect::<Vec<_>>().into_iter().rev().collect();
            prop_assert_eq!(&once, &render(&copy, &options, &COUNTER));
        }
    }

    /// 5. An append leaves the stable prefix alone, unless a turn is snipped.
    #[test]
    fn stable_prefix(plan in session(false), extra in turn(2, false, 0..=3), k in knobs(policy())) {
        let (p1, p2) = build_pair(&plan, &extra);
        // The clock is the longer path's: both are idle, or neither.
        check_stable_prefix(&p1, &p2, &options(&p2.path, Callers::All, &k))?;
    }

    /// 6. The report agrees with the messages; without a budget nothing is reduced.
    #[test]
    fn report(plan in session(true), k in knobs(policy())) {
        let built = build(&plan);
        let r = renders(&built, Callers::All, &k);
        with_context(check_unbudgeted(&built, &r.options, &r.u), &built, &r)?;
        with_context(check_report(&r.u, &r.b), &built, &r)?;
        with_context(check_report(&r.u, &r.ro), &built, &r)?;
        with_context(check_reduction_counts(&r.ro), &built, &r)?;
    }

    /// 6. The tiers' counts agree with the messages: `results_truncated` and `results_cleared`
    /// (and their id lists) name the messages of the output that carry that reduction.
    #[test]
    fn report_reduction_counts(plan in session(true), k in knobs(policy())) {
        let built = build(&plan);
        let r = renders(&built, Callers::All, &k);
        with_context(check_reduction_counts(&r.b), &built, &r)?;
    }

    /// 7. Renders inside a running function.
    #[test]
    fn function_renders(plan in run_plan(), k in knobs(policy())) {
        let built = build_run(&plan);
        let id = *built.running.last().expect("a running function");
        prop_assert_eq!(built.path.scope, Some(id));

        // Only the function's own chain without its callers (and the transcripts of `full`
        // functions it called, which keep their own function ids).
        let alone = renders(&built, Callers::None, &k);
        let inside = functions_within(&built.path, id);
        for r in [&alone.u, &alone.b, &alone.ro] {
            prop_assert!(
                r.messages.iter().all(|m| m.function_id.is_some_and(|f| inside.contains(&f))),
                "a message from outside the function\n{}{}",
                show(&r.messages),
                context(&built, &alone)
            );
            with_context(check_pairing(&built, r), &built, &alone)?;
            with_context(check_report(&alone.u, r), &built, &alone)?;
            with_context(check_documents(r), &built, &alone)?;
        }
        prop_assert!(alone.b.report.snipped.is_empty(), "a running function's content was snipped");
        with_context(check_budget(&built, &alone.options, &alone.u, &alone.b), &built, &alone)?;
        with_context(check_never_grows(&alone.options, &alone.u, &alone.b, &alone.ro), &built, &alone)?;

        // With the callers above it.
        let all = renders(&built, Callers::All, &k);
        for r in [&all.u, &all.b, &all.ro] {
            with_context(check_pairing(&built, r), &built, &all)?;
            with_context(check_report(&all.u, r), &built, &all)?;
            // The caller's call into the running function has no result yet: the documents
            // leave it out and stay valid.
            with_context(check_documents(r), &built, &all)?;
        }
        with_context(check_never_grows(&all.options, &all.u, &all.b, &all.ro), &built, &all)?;
        let kept: HashMap<&[NodeId], &Message> =
            all.b.messages.iter().map(|m| (m.node_ids.as_slice(), m)).collect();
        for m in all.u.messages.iter().filter(|m| m.function_id.is_some_and(|f| built.running.contains(&f))) {
            let Some(b) = kept.get(m.node_ids.as_slice()) else {
                return Err(TestCaseError::fail(format!(
                    "a running function's message {:?} was dropped\n{}{}",
                    m.node_ids,
                    show(&all.b.messages),
                    context(&built, &all)
                )));
            };
            if b.reduction == Reduction::None && b.stubbed_inputs == 0 {
                prop_assert_eq!(*b, m);
            } else if b.role == MessageRole::Assistant {
                // Its text cut or its arguments stubbed: the same calls.
                prop_assert_eq!(b.tool_calls.len(), m.tool_calls.len());
            } else {
                prop_assert_eq!(b.role, MessageRole::Tool);
            }
        }
        with_context(check_budget(&built, &all.options, &all.u, &all.b), &built, &all)?;
    }
}

proptest! {
    #![proptest_config(config(2000))]

    /// The generators make only paths the store would hold.
    #[test]
    fn generated_paths_are_valid(
        plan in session(true),
        base in session(false),
        extra in turn(2, false, 0..=3),
        run in run_plan(),
        big in big_session(),
    ) {
        check_valid(&build(&big))?;
        check_valid(&build(&plan))?;
        let (p1, p2) = build_pair(&base, &extra);
        check_valid(&p1)?;
        check_valid(&p2)?;
        check_valid(&build_run(&run))?;
    }

    /// The top-level turn that holds the running function is its newest turn (DESIGN.md §1: a
    /// turn runs from a top-level user message to the next), kept whole: snipped never.
    #[test]
    fn function_turn_kept_whole(plan in run_plan(), k in knobs(policy())) {
        let built = build_run(&plan);
        let all = renders(&built, Callers::All, &k);
        let users = top_users(&built.path);
        let last = *users.last().expect("a top-level turn");
        let from = index_of(&all.u.messages, last).expect("unbudgeted");
        let kept: HashSet<&[NodeId]> = all.b.messages.iter().map(|m| m.node_ids.as_slice()).collect();
        for m in &all.u.messages[from..] {
            prop_assert!(
                kept.contains(m.node_ids.as_slice()),
                "message {:?} of the turn holding the running function was snipped\n{}{}",
                m.node_ids,
                show(&all.b.messages),
                context(&built, &all)
            );
        }
    }

    /// Sessions of 60 to 120 tool results under ctxd's first policy: the count trigger fires at
    /// 50 and every 25 more when over budget, and all the properties above hold.
    #[test]
    fn microcompact_count(plan in big_session(), k in knobs(Just(Policy::over_budget()))) {
        let built = build(&plan);
        let r = renders(&built, Callers::All, &k);
        with_context(check_budgeted(&built, &r), &built, &r)?;

        let Some(limit) = history(&r.options) else { return Ok(()) };
        let results: Vec<&Message> =
            r.u.messages.iter().filter(|m| m.role == MessageRole::Tool).collect();
        let n = results.len();
        prop_assert!(n >= 60, "{} results", n);
        let over = r.ro.report.total_tokens > limit;
        let p = Policy::over_budget();
        let step = p.microcompact_first + (n - p.microcompact_first) / p.microcompact_every * p.microcompact_every;
        if over {
            prop_assert_eq!(r.b.report.trigger, Some(Trigger::Count));
            prop_assert_eq!(r.b.report.microcompact_boundary, step - p.microcompact_keep);
        } else {
            prop_assert_eq!(r.b.report.trigger, None);
            prop_assert_eq!(r.b.report.microcompact_boundary, 0);
        }
        // Only results before the boundary are cleared.
        let boundary = r.b.report.microcompact_boundary;
        let clearable: HashSet<&[NodeId]> =
            results[..boundary].iter().map(|m| m.node_ids.as_slice()).collect();
        for m in r.b.messages.iter().filter(|m| m.reduction == Reduction::Cleared) {
            prop_assert!(clearable.contains(m.node_ids.as_slice()), "{:?} cleared past the boundary", m.node_ids);
        }
    }
}

proptest! {
    #![proptest_config(config(1000))]

    /// Sessions of 60 to 120 tool results, stepped with no saving floor and no idle gap: a
    /// step is taken only when its own estimate says it pays back with the policy's odds (its
    /// payback within `1 / PAYBACK_ODDS` of the calls the path has run), it keeps the newest `keep` results, only
    /// results before its boundary are cleared, and the long arguments of the calls it passed
    /// are stubbed.
    #[test]
    fn stepped_payback(plan in big_session(), k in knobs(Just(Policy {
        clear_at_least_tokens: 0,
        idle_ms: 10 * 365 * 24 * 3_600_000,
        ..Policy::default()
    }))) {
        let built = build(&plan);
        let r = renders(&built, Callers::All, &k);
        with_context(check_budgeted(&built, &r), &built, &r)?;
        with_context(check_reduction_counts(&r.b), &built, &r)?;
        if r.options.budget.is_none() {
            return Ok(());
        }
        let p = r.options.policy;
        let results: Vec<&Message> =
            r.u.messages.iter().filter(|m| m.role == MessageRole::Tool).collect();
        let n = results.len();
        // Every model call the render shows (a sub-agent's chain shown in full included).
        let calls = r.u.messages.iter().filter(|m| m.role == MessageRole::Assistant).count();
        let report = &r.b.report;
        let boundary = report.microcompact_boundary;
        // A step paid for by its saving; `None` with a count trigger is the over-budget
        // fallback, a step at the newest count whatever it costs.
        let paid = report.payback_calls.is_some();
        match report.trigger {
            Some(Trigger::Count) => {
                if let Some(payback) = report.payback_calls {
                    prop_assert!(
                        payback as usize * p.payback_odds <= calls,
                        "a step that pays back in {} calls, taken after at most {} calls",
                        payback,
                        calls
                    );
                    prop_assert!(boundary + p.microcompact_keep <= n, "{}", context(&built, &r));
                }
            }
            None => prop_assert_eq!(boundary, 0),
            // Rendered after an idle gap: the cache had expired, and the step was free.
            Some(Trigger::Idle) if k.idle => {}
            other => prop_assert!(false, "trigger {:?} with no idle gap and no refusal", other),
        }
        let step = if paid || report.trigger == Some(Trigger::Idle) {
            (boundary + p.microcompact_keep).min(n)
        } else {
            0
        };
        let before: HashSet<&[NodeId]> =
            results[..boundary].iter().map(|m| m.node_ids.as_slice()).collect();
        let stepped: HashSet<&str> = results[..step]
            .iter()
            .filter_map(|m| m.tool_call_id.as_deref())
            .collect();
        for m in &r.b.messages {
            if m.reduction == Reduction::Cleared && paid {
                prop_assert!(before.contains(m.node_ids.as_slice()), "{:?} cleared past the boundary", m.node_ids);
            }
            for call in &m.tool_calls {
                let long = call.arguments_json.chars().count() > p.max_tool_input_chars;
                let original = r.u.messages.iter()
                    .flat_map(|u| u.tool_calls.iter())
                    .find(|c| c.call_id == call.call_id)
                    .map(|c| c.arguments_json.as_str());
                if original == Some(call.arguments_json.as_str())
                    && stepped.contains(call.call_id.as_str())
                    && report.turns_snipped == 0
                {
                    prop_assert!(!long, "{} is long, before the step, and not stubbed", call.call_id);
                }
            }
        }
    }

    /// A call made after the provider's cache expired writes its whole input whatever it holds,
    /// so the step taken then never costs more than not stepping: the render is no larger than
    /// the same render with no idle steps, and so no dearer at the write price.
    #[test]
    fn an_expired_cache_step_never_costs_more(plan in big_session(), k in knobs(Just(Policy::default()))) {
        let built = build(&plan);
        let Some(last_call) = built.path.nodes.iter().rev().find(|n| {
            matches!(&n.content, NodeContent::Message { role: Role::Assistant, .. })
        }) else {
            return Ok(());
        };
        // A budget the whole path fits three times over: no over-budget fallback steps in
        // either render, only the policy's own.
        let total = unbudgeted_total(&built.path, Callers::All);
        let stepping = Options {
            now_ms: last_call.created_at_ms + Policy::default().idle_ms + k.gap,
            budget: Some(Budget {
                context_window: total.saturating_mul(3).max(1000),
                ..Budget::default()
            }),
            ..options(&built.path, Callers::All, &k)
        };
        let waiting = Options {
            policy: Policy { idle_ms: i64::MAX, ..stepping.policy },
            ..stepping
        };
        let stepped = render(&built.path, &stepping, &COUNTER);
        let not = render(&built.path, &waiting, &COUNTER);
        let total = |r: &Rendered| r.tokens.iter().map(|&t| u64::from(t)).sum::<u64>();
        prop_assert!(
            total(&stepped) <= total(&not),
            "the cold step rendered {} tokens, not stepping {}",
            total(&stepped),
            total(&not)
        );
        if stepped.report.microcompact_boundary > not.report.microcompact_boundary {
            prop_assert_eq!(stepped.report.trigger, Some(Trigger::Idle));
        }
    }

    /// Rendering a rendered context changes nothing: its results are already cut or cleared,
    /// its stubs are their own fixed point, and a render only makes results smaller, so the
    /// saving threshold takes no step on it the first render did not. For policies whose recent
    /// cap is at least the standard cap, as it is meant to be: a smaller one would cut a result
    /// further when an earlier step falls out.
    #[test]
    fn idempotent(plan in session(true), k in knobs(policy().prop_map(|p| Policy {
        recent_tool_result_chars: p.recent_tool_result_chars.max(p.max_tool_result_chars),
        ..p
    }))) {
        let built = build(&plan);
        let options = options(&built.path, Callers::All, &k);
        let once = render(&built.path, &options, &COUNTER);
        if once.report.turns_snipped > 0 {
            return Ok(());
        }
        // A step the budget forced (over budget, the stepped policy steps at the newest count
        // whatever it costs; told the provider refused, it clears all but the newest turn's)
        // clears results a step's own weighing would have kept; rendered
        // again, those placeholders weigh less than the results did, and the fold may step
        // where the first did not. Only the policy's own steps are replayed exactly.
        // A refusal's clearing (reactive) is forced the same way.
        let forced = options.policy.microcompact == Microcompact::Stepped
            && (once.report.trigger == Some(Trigger::Reactive)
                || (once.report.trigger == Some(Trigger::Count)
                    && once.report.payback_calls.is_none()));
        if forced {
            return Ok(());
        }
        let again = render(&rendered_path(&built.path, &once), &options, &COUNTER);
        // What a provider is sent, without the engine's own flags.
        let sent = |r: &Rendered| -> Vec<Message> {
            r.messages
                .iter()
                .map(|m| Message {
                    reduction: Reduction::None,
                    stubbed_inputs: 0,
                    ..m.clone()
                })
                .collect()
        };
        prop_assert_eq!(
            sent(&again),
            sent(&once),
            "a rendered context rendered again changed\nonce:\n{}\nagain:\n{}\npolicy {:?}\nonce: {}\nagain: {}",
            show(&once.messages),
            show(&again.messages),
            options.policy,
            brief(&once.report),
            brief(&again.report)
        );
    }
}

/// `path` with every node's content replaced by what `rendered` shows of it.
fn rendered_path(path: &PathView, rendered: &Rendered) -> PathView {
    let mut shown: HashMap<NodeId, &Message> = HashMap::new();
    for m in &rendered.messages {
        if let Some(last) = m.node_ids.last() {
            shown.insert(*last, m);
        }
    }
    let rewrite = |node: &Arc<Node>| -> Arc<Node> {
        let Some(m) = shown.get(&node.id) else {
            return node.clone();
        };
        let mut node = (**node).clone();
        match &mut node.content {
            NodeContent::Message {
                parts, tool_calls, ..
            } => {
                parts.clone_from(&m.parts);
                for call in tool_calls.iter_mut() {
                    if let Some(c) = m.tool_calls.iter().find(|c| c.call_id == call.call_id) {
                        call.arguments_json.clone_from(&c.arguments_json);
                    }
                }
            }
            NodeContent::ToolResult { parts, .. } => parts.clone_from(&m.parts),
            NodeContent::FunctionResult(result) => result.output = Part::text_of(&m.parts),
            NodeContent::FunctionCall { .. } => {}
        }
        Arc::new(node)
    };
    PathView {
        nodes: path.nodes.iter().map(rewrite).collect(),
        chains: path
            .chains
            .iter()
            .map(|(id, chain)| (*id, chain.iter().map(rewrite).collect()))
            .collect(),
        ..path.clone()
    }
}

// ---------------------------------------------------------------------------- minimal cases

/// Hand-written paths: the smallest cases of what the properties found.
#[derive(Default)]
struct Script {
    nodes: Vec<Node>,
}

impl Script {
    fn add(&mut self, scope: Option<NodeId>, content: NodeContent) -> NodeId {
        let parent = self
            .nodes
            .iter()
            .rev()
            .find(|n| n.function_id == scope)
            .map(|n| n.id)
            .or(scope);
        let id = NodeId::new();
        self.nodes.push(Node {
            id,
            parent_id: parent,
            function_id: scope,
            content,
            created_at_ms: 1_700_000_000_000 + TICK * self.nodes.len() as i64,
            hash: Hash([0; 32]),
        });
        id
    }

    fn path(&self, scope: Option<NodeId>) -> PathView {
        PathView {
            nodes: shared(self.nodes.clone()),
            scope,
            ..PathView::default()
        }
    }
}

fn say(role: Role, chars: usize) -> NodeContent {
    NodeContent::Message {
        role,
        parts: vec![Part::Text(pattern(false)[..chars].to_owned())],
        tool_calls: Vec::new(),
    }
}

fn calls(ids: &[&str]) -> NodeContent {
    NodeContent::Message {
        role: Role::Assistant,
        parts: Vec::new(),
        tool_calls: ids
            .iter()
            .map(|id| ToolCall {
                call_id: (*id).to_owned(),
                name: "bash".to_owned(),
                arguments_json: "{}".to_owned(),
            })
            .collect(),
    }
}

fn tool(call_id: &str, chars: usize) -> NodeContent {
    NodeContent::ToolResult {
        call_id: call_id.to_owned(),
        name: "bash".to_owned(),
        parts: vec![Part::Text(pattern(false)[..chars].to_owned())],
        is_error: false,
    }
}

fn history_only(history: Tokens) -> Option<Budget> {
    Some(Budget {
        context_window: history,
        ..Budget::default()
    })
}

/// A result cut by budget reduction and then dropped with its turn is still reported as
/// truncated: `results_truncated` and `truncated` name a message that is not in the output.
#[test]
fn minimal_truncated_then_snipped() {
    let mut s = Script::default();
    s.add(None, say(Role::User, 10));
    s.add(None, calls(&["c1"]));
    let result = s.add(None, tool("c1", 5000));
    s.add(None, say(Role::User, 10));
    let options = Options {
        budget: history_only(50),
        ..Options::default()
    };
    let r = render(&s.path(None), &options, &COUNTER);
    assert_eq!(r.messages.len(), 1, "{}", show(&r.messages));
    assert!(r.report.snipped.contains(&result));
    assert_eq!(
        (r.report.results_truncated, r.report.truncated.clone()),
        (0, Vec::new()),
        "the only truncated result is not in the output"
    );
}

/// A result cut by budget reduction and then cleared by microcompact is reported as both.
#[test]
fn minimal_truncated_then_cleared() {
    let mut s = Script::default();
    s.add(None, say(Role::User, 10));
    s.add(None, calls(&["c1"]));
    s.add(None, tool("c1", 5000));
    s.add(None, say(Role::User, 10));
    let options = Options {
        budget: history_only(50),
        policy: Policy {
            microcompact_first: 1,
            microcompact_keep: 0,
            snip: false,
            ..Policy::default()
        },
        ..Options::default()
    };
    let r = render(&s.path(None), &options, &COUNTER);
    assert_eq!(r.messages[2].reduction, Reduction::Cleared);
    assert_eq!(r.report.results_cleared, 1);
    assert_eq!(
        r.report.results_truncated,
        0,
        "no message of the output is truncated: {}",
        brief(&r.report)
    );
}

/// With `retain_turns` 3, appending a small turn makes the retained turns fit again, so a result
/// microcompact cleared inside the stable prefix comes back.
#[test]
fn minimal_stable_prefix_retention_flip() {
    let mut s = Script::default();
    s.add(None, say(Role::User, 2000));
    s.add(None, say(Role::User, 10));
    s.add(None, calls(&["c1"]));
    s.add(None, tool("c1", 400));
    s.add(None, say(Role::User, 10));
    let p1 = s.path(None);
    s.add(None, say(Role::User, 10));
    let p2 = s.path(None);
    let options = Options {
        budget: history_only(300),
        policy: Policy {
            microcompact_first: 1,
            microcompact_every: 1,
            microcompact_keep: 0,
            retain_turns: 3,
            snip: false,
            ..Policy::default()
        },
        ..Options::default()
    };
    let r1 = render(&p1, &options, &COUNTER);
    let r2 = render(&p2, &options, &COUNTER);
    assert_eq!(r1.report.turns_snipped, r2.report.turns_snipped);
    let stable = r1.report.stable_prefix_messages;
    assert_eq!(
        r1.messages[..stable],
        r2.messages[..stable],
        "P: {}\n{}\nP+1: {}\n{}",
        brief(&r1.report),
        show(&r1.messages),
        brief(&r2.report),
        show(&r2.messages)
    );
}

/// Rendering inside a running function, the caller's turn that called it is split at the
/// function's prompt and its first half snipped, though it holds the running function.
#[test]
fn minimal_function_turn_split() {
    let mut s = Script::default();
    let request = s.add(None, say(Role::User, 400));
    s.add(None, calls(&["c1"]));
    let function = s.add(
        None,
        NodeContent::FunctionCall {
            call_id: "c1".to_owned(),
            name: "bash".to_owned(),
            input: "go".to_owned(),
            expose: Expose::Io,
        },
    );
    s.add(Some(function), say(Role::User, 100));
    let options = Options {
        budget: history_only(100),
        ..Options::default()
    };
    let r = render(&s.path(Some(function)), &options, &COUNTER);
    assert!(
        r.messages.iter().any(|m| m.node_ids == [request]),
        "the user request of the turn holding the running function was snipped: {}\n{}",
        brief(&r.report),
        show(&r.messages)
    );
}

/// A segment summary over an assistant text that a step would cut: the step's saving still
/// counts that text where it stood, so the step is taken with the summary as without it, and a
/// result before the segment stays cleared (the cached prefix does not move).
#[test]
fn minimal_segment_over_a_cut_text_moves_no_step() {
    let mut s = Script::default();
    s.add(None, say(Role::User, 10));
    s.add(None, calls(&["c1", "c2"]));
    s.add(None, tool("c1", 1));
    let before = s.add(None, tool("c2", 213));
    let text = s.add(
        None,
        NodeContent::Message {
            role: Role::Assistant,
            parts: vec![Part::Text(pattern(false)[..2241].to_owned())],
            tool_calls: vec![ToolCall {
                call_id: "c3".to_owned(),
                name: "bash".to_owned(),
                arguments_json: "{}".to_owned(),
            }],
        },
    );
    let covered = s.add(None, tool("c3", 1));
    s.add(None, say(Role::User, 10));
    for i in 4..9 {
        let id = format!("c{i}");
        s.add(None, calls(&[id.as_str()]));
        s.add(None, tool(&id, 300));
    }
    let old = segment_keeps_its_prefix(
        &s,
        (text, covered),
        Policy {
            microcompact: Microcompact::Stepped,
            microcompact_first: 3,
            microcompact_every: 1,
            microcompact_keep: 0,
            clear_at_least_tokens: 603,
            max_tool_result_chars: 200,
            recent_tool_result_chars: 460,
            max_assistant_text_chars: 0,
            ..Policy::default()
        },
    );
    let cleared = |r: &Rendered| {
        r.messages
            .iter()
            .find(|m| m.node_ids == [before])
            .map(|m| m.reduction)
    };
    assert_eq!(
        cleared(&old),
        Some(Reduction::Cleared),
        "{}",
        show(&old.messages)
    );
}

/// A segment summary over a user's message after the results a step would clear: the step
/// weighs what it writes again of that message as it did without the summary, so it is taken
/// or not the same, and the prefix before the segment does not move.
#[test]
fn minimal_segment_over_a_user_message_moves_no_step() {
    // Three calls after the segment.
    let weigh = |user: usize| {
        let mut s = Script::default();
        s.add(None, say(Role::User, 1));
        s.add(None, calls(&["c1", "c2"]));
        s.add(None, tool("c1", 6794));
        s.add(None, tool("c2", 1));
        let first = s.add(None, calls(&["c3"]));
        s.add(None, tool("c3", 372));
        s.add(None, say(Role::User, user));
        s.add(None, calls(&["c4"]));
        let last = s.add(None, tool("c4", 160));
        for _ in 0..3 {
            s.add(None, say(Role::User, 1));
            s.add(None, say(Role::Assistant, 5));
        }
        let policy = Policy {
            microcompact: Microcompact::Stepped,
            microcompact_first: 3,
            microcompact_every: 1,
            microcompact_keep: 2,
            clear_at_least_tokens: 0,
            max_tool_result_chars: 200,
            recent_tool_result_chars: 5882,
            max_assistant_text_chars: 0,
            payback_odds: 1,
            prices: ctxd::domain::CachePrices {
                read_per_mille: 25,
                write_per_mille: 2000,
            },
            ..Policy::default()
        };
        segment_keeps_its_prefix(&s, (first, last), policy)
            .report
            .trigger
    };
    // The step at the last call pays when the user's message is short, and not when it is
    // long; with the summary as without it.
    assert_eq!(weigh(0), Some(Trigger::Count));
    assert_eq!(weigh(1000), None);
    for user in [25, 3000] {
        weigh(user);
    }
}

/// Renders `s` under `policy` in a window no budget reaches, without and with a segment
/// summary over `first..=last`, and asserts that the messages before the segment are the same
/// in both (the cached prefix does not move); returns the render without.
fn segment_keeps_its_prefix(
    s: &Script,
    (first, last): (NodeId, NodeId),
    policy: Policy,
) -> Rendered {
    let options = Options {
        budget: Some(Budget {
            context_window: Tokens::MAX / 2,
            ..Budget::default()
        }),
        policy,
        ..Options::default()
    };
    let plain = s.path(None);
    let mut summarized = s.path(None);
    let covers: Vec<NodeId> = s
        .nodes
        .iter()
        .map(|n| n.id)
        .skip_while(|id| *id != first)
        .take_while(|id| *id != last)
        .chain([last])
        .collect();
    summarized.summaries.push(ctxd::domain::Summary {
        id: ctxd::domain::SummaryId::new(),
        compaction_id: ctxd::domain::CompactionId::new(),
        kind: ctxd::domain::SummaryKind::Segment,
        covers,
        range: Some((first, last)),
        text: "what happened".to_owned(),
        rolls_over: Vec::new(),
        ledger: None,
        model: "m".to_owned(),
        base_head: last,
        tokens_before: 0,
        tokens_after: 0,
        created_at_ms: 0,
    });
    let old = render(&plain, &options, &COUNTER);
    let new = render(&summarized, &options, &COUNTER);
    let start = index_of(&old.messages, first).expect("the segment renders");
    assert_eq!(
        new.messages[..start],
        old.messages[..start],
        "the prefix before the segment moved\n{}\n--\n{}",
        show(&old.messages),
        show(&new.messages)
    );
    old
}

/// Nodes as a loaded path holds them: shared with the store's cache.
fn shared(nodes: Vec<Node>) -> Vec<Arc<Node>> {
    nodes.into_iter().map(Arc::new).collect()
}

// ------------------------------------------------------------ summaries and pins over paths

/// A summary as commit would store it from `plan`.
fn summary_of(plan: &ctxd::compact::SummaryPlan, head: NodeId, at: i64) -> ctxd::domain::Summary {
    ctxd::domain::Summary {
        id: ctxd::domain::SummaryId::new(),
        compaction_id: ctxd::domain::CompactionId::new(),
        kind: plan.kind,
        covers: plan.covers.clone(),
        range: plan.range,
        text: "what happened".to_owned(),
        rolls_over: plan.rolls_over.clone(),
        ledger: Some(Arc::new(plan.ledger.clone())),
        model: "m".to_owned(),
        base_head: head,
        tokens_before: 0,
        tokens_after: 0,
        created_at_ms: at,
    }
}

/// Lays segment summaries over the ranges `picks` chooses (those prepare accepts) and, with
/// `rolling`, a rolling summary; pins the nodes `pins` chooses. The earliest first node of a
/// segment laid, if one was (and no rolling summary was).
fn summarize(
    built: &mut Built,
    budget: Budget,
    picks: &[(u16, u16)],
    pins: &[u16],
    rolling: bool,
) -> Option<NodeId> {
    use ctxd::compact::{Prepared, prepare, prepare_segment};
    let path = &mut built.path;
    let head = path.nodes.last().map(|n| n.id)?;
    let all: Vec<NodeId> = path.all_nodes().map(|n| n.id).collect();
    for p in pins {
        path.pinned.insert(all[*p as usize % all.len()]);
    }
    let n = path.nodes.len();
    let mut first: Option<usize> = None;
    for (i, (a, b)) in picks.iter().enumerate() {
        let (a, b) = (*a as usize % n, *b as usize % n);
        let (from, to) = (path.nodes[a.min(b)].id, path.nodes[a.max(b)].id);
        if let Ok(Prepared::Needed(plan)) = prepare_segment(path, from, to, budget, 4000, &COUNTER)
        {
            first = Some(first.map_or(a.min(b), |f| f.min(a.min(b))));
            path.summaries.push(summary_of(&plan, head, i as i64));
        }
    }
    let mut first = first.map(|i| path.nodes[i].id);
    if rolling && let Prepared::Needed(plan) = prepare(path, budget, 2, 4000, &COUNTER) {
        path.summaries.push(summary_of(&plan, head, 10));
        first = None;
    }
    first
}

proptest! {
    #![proptest_config(config(1000))]

    /// Pairing, retention of pins and the cached prefix with segment and rolling summaries laid
    /// over generated paths and random nodes pinned: every provider document stays valid, a
    /// pinned message renders unreduced wherever it renders, every pinned message of the plain
    /// render renders (after its summary, if one covers it), and when the render fits before
    /// and after, the messages before a segment are what they were.
    #[test]
    fn summaries_and_pins(
        plan in session(true),
        k in knobs(policy()),
        picks in vec(any::<(u16, u16)>(), 0..3),
        pins in vec(any::<u16>(), 0..4),
        rolling in any::<bool>(),
    ) {
        let built = build(&plan);
        let plain = renders(&built, Callers::All, &k);
        let budget = plain.options.budget.unwrap_or(Budget {
            context_window: 1_000_000,
            ..Budget::default()
        });
        let mut summarized = Built {
            path: built.path.clone(),
            pending: built.pending.clone(),
            running: built.running.clone(),
        };
        let segment = summarize(&mut summarized, budget, &picks, &pins, rolling);
        let r = renders(&summarized, Callers::All, &k);
        for rendered in [&r.u, &r.b, &r.ro] {
            with_context(check_pairing(&summarized, rendered), &summarized, &r)?;
            with_context(check_documents(rendered), &summarized, &r)?;
            for m in rendered.messages.iter().filter(|m| m.pinned) {
                prop_assert_eq!(m.reduction, Reduction::None);
                prop_assert_eq!(m.stubbed_inputs, 0);
            }
        }
        // Every pinned message shows in every render, summaries or not.
        let pinned: Vec<NodeId> = render(&summarized.path, &unbudgeted(&r.options), &COUNTER)
            .messages
            .iter()
            .filter(|m| m.pinned)
            .flat_map(|m| m.node_ids.clone())
            .collect();
        for rendered in [&r.u, &r.b, &r.ro] {
            let shown: HashSet<NodeId> =
                rendered.messages.iter().flat_map(|m| m.node_ids.clone()).collect();
            for id in &pinned {
                prop_assert!(shown.contains(id), "pinned {} not rendered\n{}", short(*id), show(&rendered.messages));
            }
        }
        // Determinism.
        prop_assert_eq!(&r.b, &render(&summarized.path, &r.options, &COUNTER));
        // The prefix before a segment, as the steps alone decide it (a budget so large that
        // no over-budget fallback or snip acts): what was cleared before the segment stays so,
        // so a provider's prompt cache keeps hitting. Pins alone change nothing before it.
        if let Some(from) = segment
            && r.options.policy.microcompact == Microcompact::Stepped
            && !r.options.policy.reactive
        {
            let roomy = Options {
                budget: Some(Budget {
                    context_window: Tokens::MAX / 2,
                    ..Budget::default()
                }),
                ..r.options
            };
            let mut pinned_only = built.path.clone();
            pinned_only.pinned = summarized.path.pinned.clone();
            let old = render(&pinned_only, &roomy, &COUNTER);
            let new = render(&summarized.path, &roomy, &COUNTER);
            if let Some(start) = index_of(&old.messages, from) {
                prop_assert_eq!(
                    &new.messages[..start], &old.messages[..start],
                    "the prefix before the segment moved\n{}\n--\n{}\n{:?}\n{}\nstep without the summary: {:?} at {}; with it: {:?} at {}",
                    show(&old.messages), show(&new.messages), roomy.policy,
                    describe(&summarized), old.report.trigger, old.report.microcompact_boundary,
                    new.report.trigger, new.report.microcompact_boundary
                );
            }
        }
    }
}

proptest! {
    #![proptest_config(config(500))]

    /// What the model has not seen (every node after `Seen::Through`) is rendered as it was
    /// stored, under every budget and policy: no step caps, clears, stubs or cuts it, and no
    /// snip drops it; the rest keeps every other property. The one exception: when what is
    /// unseen alone exceeds the history's budget, which could never be sent whole, its results
    /// may be cut.
    #[test]
    fn unseen_is_never_reduced(plan in big_session(), k in knobs(policy()), at in 0usize..1000) {
        let built = build(&plan);
        let top: Vec<NodeId> = built.path.nodes.iter().filter(|n| n.function_id.is_none()).map(|n| n.id).collect();
        prop_assume!(!top.is_empty());
        let seen = top[at % top.len()];
        let position = built.path.nodes.iter().position(|n| n.id == seen).expect("on the path");
        let unseen: HashSet<NodeId> = built.path.nodes[position + 1..].iter().map(|n| n.id).collect();
        let mut options = options(&built.path, Callers::All, &k);
        options.seen = ctxd::render::Seen::Through(seen);
        let u = render(&built.path, &unbudgeted(&options), &COUNTER);
        let b = render(&built.path, &options, &COUNTER);
        check_pairing(&built, &b)?;
        for m in u.messages.iter().filter(|m| m.node_ids.iter().any(|id| unseen.contains(id))) {
            let kept = b.messages.iter().find(|r| r.node_ids == m.node_ids);
            prop_assert!(kept.is_some(), "{:?} unseen and dropped", m.node_ids);
            let kept = kept.expect("checked");
            // What the model has not read, together, is more than the history's budget.
            let unseen_tokens: Tokens = u
                .messages
                .iter()
                .filter(|m| m.node_ids.iter().any(|id| unseen.contains(id)))
                .map(|m| message_tokens(m, &COUNTER))
                .sum();
            let too_big = m.role == MessageRole::Tool
                && history(&options).is_some_and(|h| unseen_tokens > h);
            if too_big && matches!(kept.reduction, Reduction::Truncated { .. }) {
                continue;
            }
            prop_assert_eq!(kept.reduction, Reduction::None, "{:?} unseen and reduced", &m.node_ids);
            prop_assert_eq!(kept.stubbed_inputs, 0, "{:?} unseen and stubbed", &m.node_ids);
            prop_assert_eq!(&kept.parts, &m.parts, "{:?} unseen and changed", &m.node_ids);
        }
    }
}
