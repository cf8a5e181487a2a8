//! The render engine: a pure function from a loaded path to the context of the next request.
//!
//! It never touches the store, the clock or the network: `now` and the budget are arguments,
//! and the same inputs render byte-identical output. Steps run cheapest first (DESIGN.md §2):
//! visibility, the summary overlay, budget reduction, microcompact, snip, and a report that
//! says what each did. Rendering is lossy, never failing: `Result` is for invalid input only.

mod observation;
mod overlay;
mod stub;
mod tiers;
mod visibility;

pub use crate::domain::Budget;
use crate::domain::{
    CachePrices, Hash, NodeContent, NodeId, Part, PathView, Role, SummaryId, ToolCall,
};
use crate::tokens::{Count, MEDIA_TOKENS, MESSAGE_OVERHEAD, TOOL_CALL_OVERHEAD, Tokenizer, Tokens};

pub use overlay::{
    SUMMARY_HEADER, active_summaries, applies, ledger_cap, overlay, summary_message, summary_text,
};
pub use stub::stub_arguments;
pub use tiers::{PAYBACK_ODDS, cleared_placeholder, truncation_marker, turn_starts};
pub use visibility::visible;

/// Who speaks a rendered message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageRole {
    System,
    Developer,
    User,
    Assistant,
    /// The answer to a tool call (a tool result or a function's result).
    Tool,
}

/// What budget steps did to a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Reduction {
    #[default]
    None,
    /// Budget reduction kept the head and tail; the marker says what was cut.
    Truncated { cut_chars: usize, of_chars: usize },
    /// Microcompact replaced the content by a one-line placeholder.
    Cleared,
}

/// One message of the rendered context.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub role: MessageRole,
    pub parts: Vec<Part>,
    pub tool_calls: Vec<ToolCall>,
    /// Set on tool messages: the call they answer, and the tool's name.
    pub tool_call_id: Option<String>,
    pub name: Option<String>,
    pub is_error: bool,
    /// The nodes this message came from.
    pub node_ids: Vec<NodeId>,
    /// The hash of the node a recall of this message returns (a result's own node), whose
    /// [`reference`] its placeholders name; `None` for a summary.
    pub recall: Option<Hash>,
    /// Set on messages from inside a function's internal chain.
    pub function_id: Option<NodeId>,
    pub reduction: Reduction,
    /// Tool calls of this message whose arguments microcompact replaced by a stub.
    pub stubbed_inputs: usize,
    /// When the newest of its nodes was appended (`None` for a summary): idle gaps are steps.
    pub at_ms: Option<i64>,
    /// Set on the message a summary renders as.
    pub summary_id: Option<SummaryId>,
    /// From a pinned node: no budget step reduces it.
    pub pinned: bool,
    /// Set on a message a summary covers and shows again after it (a pin and its tool group).
    pub pinned_under: Option<SummaryId>,
    /// The model has not read it yet (`Options::seen`): no step reduces it.
    pub unseen: bool,
    /// A user message that is a command's output (observation.rs): a result to the steps.
    pub observation: bool,
    /// On a summary's message: what it hides, in order, so microcompact counts the results
    /// and idle gaps it replaced and what is cleared before it does not move.
    pub hidden: Vec<Hidden>,
}

impl Message {
    /// A message of `role` saying `parts`, and nothing else: no calls, from no node, unreduced.
    pub fn new(role: MessageRole, parts: Vec<Part>) -> Self {
        Message {
            role,
            parts,
            tool_calls: Vec::new(),
            tool_call_id: None,
            name: None,
            is_error: false,
            node_ids: Vec::new(),
            recall: None,
            function_id: None,
            reduction: Reduction::None,
            stubbed_inputs: 0,
            at_ms: None,
            summary_id: None,
            pinned: false,
            pinned_under: None,
            unseen: false,
            observation: false,
            hidden: Vec::new(),
        }
    }
}

/// A message a summary covers, in order: when it was appended, for a tool result its
/// characters and error flag, and for an assistant message its text's characters and whether
/// it is pinned. `reshown`: it is a pin the summary shows again after itself, and counts here,
/// where it stood, not there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hidden {
    pub at_ms: Option<i64>,
    pub result: Option<(usize, bool)>,
    pub assistant: Option<(usize, bool)>,
    /// Characters a step writes again but never reduces: an assistant message's calls'
    /// arguments, a user's or system message's text.
    pub kept: usize,
    pub reshown: bool,
}

/// Whether a render at a function shows its callers' context above its chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Callers {
    #[default]
    All,
    None,
}

/// When microcompact clears old tool results.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Microcompact {
    /// At fixed counts of tool results (and idle gaps), whether or not over budget, so the
    /// context stays small and its prefix changes only at steps.
    #[default]
    Stepped,
    /// Only when the context is over budget (or idle, or reactive): ctxd's first policy.
    OverBudget,
}

/// How the engine fits a path into a budget. The defaults are measured by
/// `cargo bench --bench economy` (bench/ECONOMY.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// The standard cap: a longer tool result keeps its head and tail. Stepped, it applies to
    /// results kept at the last step; over budget, to every result.
    pub max_tool_result_chars: usize,
    /// Stepped: the cap of results newer than the last step, reduced to the standard cap (or
    /// cleared) at the next step, so the tail is rewritten once per step.
    pub recent_tool_result_chars: usize,
    pub microcompact: Microcompact,
    pub microcompact_first: usize,
    pub microcompact_every: usize,
    pub microcompact_keep: usize,
    /// Stepped: a count step is taken only when clearing saves at least this many tokens
    /// (estimated at four characters a token); a step rewrites the cached tail, so a small one
    /// costs more than it saves.
    pub clear_at_least_tokens: Tokens,
    /// Stepped: arguments of calls before the last step are stubbed when longer than this.
    pub max_tool_input_chars: usize,
    /// Stepped: arguments of calls newer than the last step are stubbed when longer than this.
    pub recent_tool_input_chars: usize,
    /// Stepped: the text of assistant messages before the last step keeps its head of this
    /// many characters; their calls stay.
    pub max_assistant_text_chars: usize,
    /// Stepped: assistant text newer than the last step keeps its head and tail of this many.
    pub recent_assistant_text_chars: usize,
    /// How long the provider keeps its cache unused (Anthropic and OpenAI: five minutes): a
    /// call after a longer gap reads nothing, so a step taken then rewrites nothing that was
    /// not about to be written anyway.
    pub idle_ms: i64,
    /// Stepped: a step the cache's expiry did not make free is taken only when its payback is
    /// at most `1 / payback_odds` of the calls the session has run (`PAYBACK_ODDS`).
    pub payback_odds: usize,
    pub retain_turns: usize,
    pub snip: bool,
    pub reactive: bool,
    /// What the provider's cache charges: a step pays back at these prices.
    pub prices: CachePrices,
    /// Stepped: the steps are said to the provider as its own edit (Anthropic's
    /// `clear_tool_uses`), for a model that binds its reasoning to what came before it: a step
    /// clears whole results and nothing else, no result is cut, no text cut, no input stubbed,
    /// no turn snipped, no summary but an agent's own laid, and no user message taken for a
    /// command's output. The render then decides which results the edit clears.
    pub provider_edits: bool,
    /// For a model that binds its reasoning to what came before it, when its steps are ctxd's
    /// own rewrite: every thinking block after the first message a step changed is left out
    /// (the provider would refuse it), and the report counts what is sent.
    pub drop_invalid_reasoning: bool,
}

impl Policy {
    /// Budget reduction only: what compaction measures, since microcompact and snip are what a
    /// summary exists to avoid.
    pub fn reduction_only(max_tool_result_chars: usize) -> Self {
        Self {
            max_tool_result_chars,
            microcompact_first: usize::MAX,
            idle_ms: i64::MAX,
            snip: false,
            reactive: false,
            ..Self::over_budget()
        }
    }

    /// ctxd's first default: clear only when over budget, keep 5.
    pub fn over_budget() -> Self {
        Self {
            max_tool_result_chars: 4000,
            max_assistant_text_chars: usize::MAX,
            recent_assistant_text_chars: usize::MAX,
            recent_tool_input_chars: usize::MAX,
            microcompact: Microcompact::OverBudget,
            microcompact_first: 50,
            microcompact_every: 25,
            microcompact_keep: 5,
            ..Self::default()
        }
    }
}

impl Default for Policy {
    /// Measured by `cargo bench --bench economy` on the shared traces (README's table).
    fn default() -> Self {
        Self {
            // The cap of every result once over budget: a step clears, it does not cut.
            max_tool_result_chars: 32_000,
            // A result is reduced at a step, once the model has read it, never on arrival.
            recent_tool_result_chars: usize::MAX,
            microcompact: Microcompact::Stepped,
            // Any call past the kept results may step: whether it does is the payback's call.
            microcompact_first: 8,
            microcompact_every: 1,
            microcompact_keep: 7,
            clear_at_least_tokens: 2000,
            max_tool_input_chars: 100,
            max_assistant_text_chars: 100,
            recent_tool_input_chars: 500,
            recent_assistant_text_chars: 2000,
            idle_ms: CACHE_TTL_MS,
            payback_odds: PAYBACK_ODDS,
            retain_turns: 2,
            snip: true,
            reactive: false,
            prices: CachePrices::STANDARD,
            provider_edits: false,
            drop_invalid_reasoning: false,
        }
    }
}

/// The price of a token read from the prompt cache, relative to a plain input token.
pub const CACHE_READ: f64 = 0.1;
/// The price of a token written to the prompt cache (every token after the cached prefix).
pub const CACHE_WRITE: f64 = 1.25;

/// How long a provider's prompt cache keeps an entry unused: Anthropic's default breakpoints
/// and OpenAI's automatic cache both about five minutes.
pub const CACHE_TTL_MS: i64 = 5 * 60 * 1000;

#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    pub callers: Callers,
    /// `None`: render everything, untouched.
    pub budget: Option<Budget>,
    pub policy: Policy,
    /// The request's time, for the idle trigger.
    pub now_ms: i64,
    /// When the caller last sent this context to the model, if it knows (the gateway does);
    /// otherwise the time of the input of the path's newest assistant message.
    pub last_call_ms: Option<i64>,
    /// What the model has read already; no step reduces what it has not.
    pub seen: Seen,
}

/// How much of a path the model has read, as of this request. A message the model has not
/// read yet (a result it has never seen) is rendered as it was sent: reducing it would hide
/// from the model what it is about to act on, and a step may only take back what it has seen.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Seen {
    /// Everything (a host rendering its own history, as Render always has).
    #[default]
    All,
    /// The path up to and including this node; what follows is unseen. A node not on the path
    /// leaves nothing seen.
    Through(NodeId),
    /// Nothing: the request's whole history is new (a session's first call).
    Nothing,
    /// The path up to its newest assistant message: what came after it (the results of its
    /// calls, the user's next message) is new to the model. What Render assumes.
    ThroughLastCall,
}

/// Tokens by what they are; the parts add up to the total.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Breakdown {
    pub system: Tokens,
    pub user: Tokens,
    pub assistant_text: Tokens,
    pub tool_calls: Tokens,
    pub tool_results: Tokens,
    pub summaries: Tokens,
    pub markers: Tokens,
}

impl Breakdown {
    pub fn total(&self) -> Tokens {
        [
            self.system,
            self.user,
            self.assistant_text,
            self.tool_calls,
            self.tool_results,
            self.summaries,
            self.markers,
        ]
        .iter()
        .fold(0, |sum: Tokens, n| sum.saturating_add(*n))
    }

    fn add(&mut self, other: &Breakdown) {
        self.system = self.system.saturating_add(other.system);
        self.user = self.user.saturating_add(other.user);
        self.assistant_text = self.assistant_text.saturating_add(other.assistant_text);
        self.tool_calls = self.tool_calls.saturating_add(other.tool_calls);
        self.tool_results = self.tool_results.saturating_add(other.tool_results);
        self.summaries = self.summaries.saturating_add(other.summaries);
        self.markers = self.markers.saturating_add(other.markers);
    }
}

/// Why microcompact ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// Stepped: the saving over the session's expected remaining calls pays back the rewrite of
    /// the cached tail (`Report::payback_calls`); over budget: `microcompact_first` results.
    Count,
    /// The provider's cache had expired (`idle_ms` since the previous call): the step was free.
    Idle,
    /// The caller said the provider refused the request as too long.
    Reactive,
}

impl Trigger {
    pub fn as_str(self) -> &'static str {
        match self {
            Trigger::Count => "count",
            Trigger::Idle => "idle",
            Trigger::Reactive => "reactive",
        }
    }
}

/// What one kind of reduction saved, in messages kept by the render.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Saved {
    /// Tool results truncated or cleared, or tool calls stubbed.
    pub items: usize,
    pub chars: usize,
    pub tokens: Tokens,
}

impl Saved {
    fn add(&mut self, items: usize, chars: usize, tokens: Tokens) {
        self.items += items;
        self.chars += chars;
        self.tokens = self.tokens.saturating_add(tokens);
    }
}

/// What a render did. Nothing is dropped without the report saying so.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Report {
    pub total_tokens: Tokens,
    pub breakdown: Breakdown,
    pub messages: usize,
    pub tokenizer: Tokenizer,
    pub budget: Option<Budget>,
    /// The history's share of the budget; `None` without a budget.
    pub history_budget: Option<Tokens>,
    pub fits: bool,
    pub over_by: Tokens,
    pub summary_needed: bool,
    pub truncated: Vec<NodeId>,
    pub results_truncated: usize,
    pub cleared: Vec<NodeId>,
    pub results_cleared: usize,
    /// Assistant messages with stubbed tool-call arguments, and how many calls were stubbed.
    pub stubbed: Vec<NodeId>,
    pub inputs_stubbed: usize,
    pub snipped: Vec<NodeId>,
    pub turns_snipped: usize,
    /// Assistant messages whose text was cut.
    pub texts_cut: Vec<NodeId>,
    /// What each step saved against the message as it was.
    pub saved_truncation: Saved,
    pub saved_clearing: Saved,
    pub saved_stubbing: Saved,
    pub saved_text_cut: Saved,
    pub trigger: Option<Trigger>,
    /// For a step the saving paid for: the later calls its saving needs to earn back the
    /// rewrite, as estimated when it was taken.
    pub payback_calls: Option<u32>,
    /// Tool results, in path order, before which microcompact may clear.
    pub microcompact_boundary: usize,
    /// The first summary laid over the path, if any (the rolling one, when there is one).
    pub summary: Option<SummaryId>,
    /// Every summary laid over the path, in render order.
    pub summaries: Vec<SummaryId>,
    /// Tokens of the pinned messages rendered (and of call messages a summary shows again with
    /// a pinned result), and the pinned nodes.
    pub pinned_tokens: Tokens,
    pub pinned: Vec<NodeId>,
    /// The pins alone take more than the history budget; none is dropped for it.
    pub pins_exceed_budget: bool,
    /// Leading messages the next microcompact step cannot change.
    pub stable_prefix_messages: usize,
    /// Thinking blocks left out, their prefix changed (`Policy::drop_invalid_reasoning`).
    pub thinking_dropped: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendered {
    pub messages: Vec<Message>,
    /// Tokens of each message, as counted by [`message_tokens`].
    pub tokens: Vec<Tokens>,
    pub report: Report,
}

/// Renders `path` under `options`, counting with `counter`.
pub fn render(path: &PathView, options: &Options, counter: &dyn Count) -> Rendered {
    let mut messages = visible(path, options.callers);
    if !path.pinned.is_empty() {
        for m in &mut messages {
            m.pinned = m.node_ids.iter().any(|id| path.pinned.contains(id));
        }
    }
    mark_unseen(&mut messages, path, options.seen);
    let mut summaries = active_summaries(path);
    if options.policy.provider_edits {
        // Only an agent's own summary stands for what its client sends; ctxd's would change
        // what the model's reasoning was bound to.
        summaries.retain(|s| s.by_agent());
    }
    if !summaries.is_empty() {
        let history = options.budget.and_then(|b| b.history().ok());
        messages = overlay(messages, &summaries, ledger_cap(history), counter);
    }
    if !options.policy.provider_edits {
        observation::mark(&mut messages);
    }
    let mut rendered = tiers::fit(messages, path, options, counter);
    if options.policy.drop_invalid_reasoning {
        drop_invalid_reasoning(&mut rendered, counter);
    }
    let shown = overlay::shown(&rendered.messages);
    rendered.report.summary = shown.first().copied();
    rendered.report.summaries = shown;
    rendered
}

/// Leaves out every thinking block after the first message a step changed (a thinking block is
/// bound to everything before it), and counts again the messages that lost one.
fn drop_invalid_reasoning(rendered: &mut Rendered, counter: &dyn Count) {
    let changed = |m: &Message| {
        m.reduction != Reduction::None || m.stubbed_inputs > 0 || m.summary_id.is_some()
    };
    let first = if rendered.report.turns_snipped > 0 {
        Some(0)
    } else {
        rendered.messages.iter().position(changed)
    };
    let Some(first) = first else { return };
    let report = &mut rendered.report;
    let kept = rendered.messages.iter_mut().zip(&mut rendered.tokens);
    for (m, tokens) in kept.skip(first + 1) {
        let before = m.parts.len();
        m.parts
            .retain(|p| !matches!(p, Part::Block(b) if b.reasoning));
        if m.parts.len() == before {
            continue;
        }
        report.thinking_dropped += before - m.parts.len();
        let now = message_tokens(m, counter);
        let less = tokens.saturating_sub(now);
        *tokens = now;
        // Reasoning is an assistant message's, counted as its text.
        report.breakdown.assistant_text = report.breakdown.assistant_text.saturating_sub(less);
        if m.pinned || m.pinned_under.is_some() {
            report.pinned_tokens = report.pinned_tokens.saturating_sub(less);
        }
    }
    report.total_tokens = report.breakdown.total();
    if let Some(limit) = report.history_budget {
        report.pins_exceed_budget = report.pinned_tokens > limit;
        report.fits = report.total_tokens <= limit;
        report.over_by = report.total_tokens.saturating_sub(limit);
        report.summary_needed = !report.fits;
    }
}

/// Marks the messages made of nodes the model has not read (any of its nodes after `seen`).
fn mark_unseen(messages: &mut [Message], path: &PathView, seen: Seen) {
    let from = match seen {
        Seen::All => return,
        Seen::Nothing => 0,
        Seen::ThroughLastCall => path
            .nodes
            .iter()
            .rposition(|n| {
                matches!(&n.content, NodeContent::Message { role, .. } if *role == Role::Assistant)
            })
            .map_or(0, |at| at + 1),
        Seen::Through(id) => path
            .nodes
            .iter()
            .position(|n| n.id == id)
            .map_or(0, |at| at + 1),
    };
    if from >= path.nodes.len() {
        return;
    }
    let unseen: std::collections::HashSet<NodeId> =
        path.nodes[from..].iter().map(|n| n.id).collect();
    for m in messages {
        m.unseen = m.node_ids.iter().any(|id| unseen.contains(id));
    }
}

/// Tokens of one message as sent, by category: its text, tool calls and media, plus framing.
pub fn message_breakdown(message: &Message, counter: &dyn Count) -> Breakdown {
    let mut text = MESSAGE_OVERHEAD;
    for part in &message.parts {
        text = text.saturating_add(match part {
            Part::Text(t) => counter.count(t),
            // A kept provider block (thinking, a server tool's result) is text the model reads.
            Part::Block(block) => counter.count(&block.json),
            Part::Media { .. } => MEDIA_TOKENS,
        });
    }
    if let Some(name) = &message.name {
        text = text.saturating_add(counter.count(name));
    }
    let calls = message.tool_calls.iter().fold(0, |sum: Tokens, call| {
        sum.saturating_add(TOOL_CALL_OVERHEAD)
            .saturating_add(counter.count(&call.name))
            .saturating_add(counter.count(&call.arguments_json))
    });
    let mut b = Breakdown {
        tool_calls: calls,
        ..Breakdown::default()
    };
    match message.role {
        _ if message.summary_id.is_some() => b.summaries = text,
        MessageRole::System | MessageRole::Developer => b.system = text,
        MessageRole::User => b.user = text,
        MessageRole::Assistant => b.assistant_text = text,
        MessageRole::Tool => match message.reduction {
            Reduction::Cleared => b.markers = text,
            Reduction::Truncated {
                cut_chars,
                of_chars,
            } => {
                let reference = message.recall.map(|h| h.reference());
                let marker = counter.count(&tiers::truncation_marker(
                    cut_chars,
                    of_chars,
                    reference.as_deref(),
                ));
                b.markers = marker.min(text);
                b.tool_results = text - b.markers;
            }
            Reduction::None => b.tool_results = text,
        },
    }
    b
}

/// Tokens of one message as sent.
pub fn message_tokens(message: &Message, counter: &dyn Count) -> Tokens {
    message_breakdown(message, counter).total()
}
