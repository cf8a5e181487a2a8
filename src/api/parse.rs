//! Request parsing: prost requests to domain arguments, every failure naming its field.

use std::collections::HashMap;

use tonic::Status;

use super::{convert, domain_status, pb};
use crate::domain::{
    BranchName, Budget, CompactionId, Error, NodeId, REFERENCE_CHARS, SessionFilter, SessionId,
    parse_reference,
};
use crate::import;
use crate::recall;
use crate::render::{Callers, Options, Policy};
use crate::store::{AppendRequest, AppendTarget, PathTarget, Scoped, now_ms};
use crate::tokens::Tokenizer;
use crate::workflow::compaction::PrepareArgs;

const DEFAULT_PAGE_SIZE: u32 = 50;
const MAX_PAGE_SIZE: u32 = 1000;
const DEFAULT_LOG_LIMIT: u32 = 100;
const MAX_LOG_LIMIT: u32 = 1000;

pub(super) fn parse<T>(result: Result<T, Error>) -> Result<T, Status> {
    result.map_err(domain_status)
}

pub(super) fn session_id(text: &str) -> Result<SessionId, Status> {
    parse(SessionId::parse("session_id", text))
}

pub(super) fn compaction_id(text: &str) -> Result<CompactionId, Status> {
    parse(CompactionId::parse("compaction_id", text))
}

/// A branch field where empty means `main`.
pub(super) fn branch_or_main(field: &str, name: &str) -> Result<BranchName, Status> {
    if name.is_empty() {
        Ok(BranchName::main())
    } else {
        parse(BranchName::parse(field, name))
    }
}

/// A provider document format; `None` for the neutral messages alone.
pub(super) fn provider_format(
    value: i32,
) -> Result<Option<crate::provider::format::Format>, Status> {
    match pb::Format::try_from(value) {
        Ok(pb::Format::Unspecified | pb::Format::Neutral) => Ok(None),
        Ok(pb::Format::OpenaiChat) => Ok(Some(crate::provider::format::Format::OpenAiChat)),
        Ok(pb::Format::AnthropicMessages) => {
            Ok(Some(crate::provider::format::Format::AnthropicMessages))
        }
        Err(_) => Err(domain_status(Error::invalid(
            "format",
            format!("unknown value {value}"),
        ))),
    }
}

/// A tokenizer name; empty is the default.
pub(super) fn tokenizer(name: &str) -> Result<Tokenizer, Status> {
    Tokenizer::parse(name).ok_or_else(|| {
        domain_status(Error::invalid(
            "tokenizer",
            format!(
                "unknown tokenizer {name:?}; known: {}",
                Tokenizer::NAMES.join(", ")
            ),
        ))
    })
}

fn optional_node(field: &str, text: &str) -> Result<Option<NodeId>, Status> {
    (!text.is_empty())
        .then(|| parse(NodeId::parse(field, text)))
        .transpose()
}

/// The `node_ids` field of GetNodes, Pin and Unpin.
pub(super) fn node_ids(ids: &[String]) -> Result<Vec<NodeId>, Status> {
    ids.iter()
        .enumerate()
        .map(|(i, id)| parse(NodeId::parse(&format!("node_ids[{i}]"), id)))
        .collect()
}

/// A placeholder's reference: the hash prefix it names.
pub(super) fn reference(text: &str) -> Result<[u8; REFERENCE_CHARS / 2], Status> {
    if text.is_empty() {
        return Err(domain_status(Error::invalid(
            "reference",
            "is required: the 12 characters after `recall` in a placeholder",
        )));
    }
    parse_reference(text).ok_or_else(|| {
        domain_status(Error::invalid(
            "reference",
            format!(
                "{:?} is not a reference: {REFERENCE_CHARS} hexadecimal characters, as after \
                 `recall` in a placeholder",
                text.chars().take(40).collect::<String>()
            ),
        ))
    })
}

/// Recall's `max_chars`: 0 is the default, more than the most is refused.
pub(super) fn recall_max_chars(max_chars: u32) -> Result<usize, Status> {
    match max_chars as usize {
        0 => Ok(recall::DEFAULT_MAX_CHARS),
        n if n > recall::MAX_CHARS => Err(domain_status(Error::invalid(
            "max_chars",
            format!("{n} is over the most, {}", recall::MAX_CHARS),
        ))),
        n => Ok(n),
    }
}

/// The `node_ids` of Pin and Unpin: at least one.
pub(super) fn pinned_ids(ids: &[String]) -> Result<Vec<NodeId>, Status> {
    if ids.is_empty() {
        return Err(domain_status(Error::invalid(
            "node_ids",
            "must hold at least one node id",
        )));
    }
    node_ids(ids)
}

/// A session's metadata: any value, but no empty key.
pub(super) fn metadata_keys(metadata: &HashMap<String, String>) -> Result<(), Status> {
    if metadata.keys().any(String::is_empty) {
        return Err(domain_status(Error::invalid(
            "metadata",
            "keys must not be empty",
        )));
    }
    Ok(())
}

/// A listing's `(page_size, page_token)`: the size (`default` when unset, at most `max`), and
/// the id the page starts after (the token is the last id of the page before).
pub(super) fn page<T>(
    (size, token): (u32, &str),
    (default, max): (u32, u32),
    id: fn(&str, &str) -> Result<T, Error>,
) -> Result<(u32, Option<T>), Status> {
    let size = if size == 0 { default } else { size.min(max) };
    let after = (!token.is_empty())
        .then(|| parse(id("page_token", token)))
        .transpose()?;
    Ok((size, after))
}

/// A ListSessions request, parsed: the page size, the session the page starts after, and the
/// filter.
pub(super) fn list_sessions_request(
    request: &pb::ListSessionsRequest,
) -> Result<(u32, Option<SessionId>, SessionFilter), Status> {
    let (page_size, after) = page(
        (request.page_size, &request.page_token),
        (DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE),
        SessionId::parse,
    )?;
    let metadata = request
        .metadata
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let filter = parse(SessionFilter::new(&request.id_prefix, metadata))?;
    Ok((page_size, after, filter))
}

/// An Append request, parsed but not yet scoped to the caller's tenant: the store takes it
/// only with the session `Store::scope` checked.
pub(super) struct AppendArgs {
    pub session: SessionId,
    pub target: AppendTarget,
    pub expected_head: Option<Option<NodeId>>,
    pub idempotency_key: Option<String>,
    pub nodes: Vec<crate::domain::NodeContent>,
    pub pinned: Vec<usize>,
}

impl AppendArgs {
    pub(super) fn scoped(self, session: Scoped) -> AppendRequest {
        AppendRequest {
            session,
            target: self.target,
            expected_head: self.expected_head,
            idempotency_key: self.idempotency_key,
            nodes: self.nodes,
            pinned: self.pinned,
        }
    }
}

/// An Append request, parsed; every failure names its field.
pub(super) fn append_request(
    request: pb::AppendRequest,
    max_part_bytes: usize,
) -> Result<AppendArgs, Status> {
    let session = session_id(&request.session_id)?;
    let target = match optional_node("function_id", &request.function_id)? {
        Some(function) => AppendTarget::Function(function),
        None => AppendTarget::Branch(branch_or_main("branch", &request.branch)?),
    };
    let expected_head = request
        .expected_head_id
        .as_deref()
        .map(|id| optional_node("expected_head_id", id))
        .transpose()?;
    if request.nodes.is_empty() {
        return Err(domain_status(Error::invalid(
            "nodes",
            "must hold at least one node",
        )));
    }
    let pinned: Vec<usize> = request
        .nodes
        .iter()
        .enumerate()
        .filter(|(_, n)| n.pinned)
        .map(|(i, _)| i)
        .collect();
    let nodes = request
        .nodes
        .into_iter()
        .enumerate()
        .map(|(i, node)| {
            parse(convert::node_input(
                &format!("nodes[{i}]"),
                node,
                max_part_bytes,
            ))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(AppendArgs {
        session,
        target,
        expected_head,
        idempotency_key: (!request.idempotency_key.is_empty()).then_some(request.idempotency_key),
        nodes,
        pinned,
    })
}

/// A Log request, parsed: the session, where the page starts, and how many nodes it holds.
pub(super) fn log_request(
    request: &pb::LogRequest,
) -> Result<(SessionId, PathTarget, u32), Status> {
    let session = session_id(&request.session_id)?;
    if !request.branch.is_empty() && !request.node_id.is_empty() {
        return Err(domain_status(Error::invalid(
            "node_id",
            "give a branch or a node_id, not both",
        )));
    }
    // A page token is the node the next page starts at.
    let start = if let Some(next) = optional_node("page_token", &request.page_token)? {
        PathTarget::Node(next)
    } else if let Some(node) = optional_node("node_id", &request.node_id)? {
        PathTarget::Node(node)
    } else {
        PathTarget::Branch(branch_or_main("branch", &request.branch)?)
    };
    let limit = match request.limit {
        0 => DEFAULT_LOG_LIMIT,
        n => n.min(MAX_LOG_LIMIT),
    };
    Ok((session, start, limit))
}

/// A CreateBranch request, parsed: the session, the name, and the node it starts at.
pub(super) fn create_branch_request(
    request: &pb::CreateBranchRequest,
) -> Result<(SessionId, BranchName, Option<NodeId>), Status> {
    Ok((
        session_id(&request.session_id)?,
        parse(BranchName::parse("name", &request.name))?,
        optional_node("from_node_id", &request.from_node_id)?,
    ))
}

/// A ResetBranch request, parsed: the session, the branch, the node it moves to, and the head
/// the caller expects it at.
pub(super) struct ResetArgs {
    pub(super) session: SessionId,
    pub(super) name: BranchName,
    pub(super) to: Option<NodeId>,
    pub(super) expected: Option<Option<NodeId>>,
}

pub(super) fn reset_branch_request(request: &pb::ResetBranchRequest) -> Result<ResetArgs, Status> {
    Ok(ResetArgs {
        session: session_id(&request.session_id)?,
        name: parse(BranchName::parse("name", &request.name))?,
        to: optional_node("to_node_id", &request.to_node_id)?,
        expected: request
            .expected_head_id
            .as_deref()
            .map(|id| optional_node("expected_head_id", id))
            .transpose()?,
    })
}
/// An ImportSession's format: the one named, or the one `data` looks like.
pub(super) fn import_source(format: i32, data: &[u8]) -> Result<import::Source, Status> {
    match pb::ImportFormat::try_from(format) {
        Ok(pb::ImportFormat::Unspecified) => Ok(import::detect(data)),
        Ok(pb::ImportFormat::NeutralJsonl) => Ok(import::Source::NeutralJsonl),
        Ok(pb::ImportFormat::ClaudeCodeJsonl) => Ok(import::Source::ClaudeCodeJsonl),
        Ok(pb::ImportFormat::OpenaiMessages) => Ok(import::Source::OpenAiMessages),
        Ok(pb::ImportFormat::CtxdJsonl) => Ok(import::Source::CtxdJsonl),
        Err(_) => Err(domain_status(Error::invalid(
            "format",
            format!("unknown value {format}"),
        ))),
    }
}

/// A render target as both `Render` and `ContextStats` carry it.
pub(super) enum RenderTarget {
    Branch(String),
    Node(String),
    Function(String),
}

/// The fields `Render` and `ContextStats` share.
pub(super) struct RenderArgs {
    session_id: String,
    target: Option<RenderTarget>,
    tokenizer: String,
    callers: i32,
    budget: Option<pb::Budget>,
    policy: Option<pb::RenderPolicy>,
    now_unix_ms: i64,
    last_call_unix_ms: i64,
    model: String,
}

/// `Render` and `ContextStats` carry the same fields: one conversion serves both.
macro_rules! render_args_from {
    ($request:ty, $oneof:ident) => {
        impl From<$request> for RenderArgs {
            fn from(r: $request) -> Self {
                use pb::$oneof::Target;
                Self {
                    session_id: r.session_id,
                    target: r.target.map(|t| match t {
                        Target::Branch(b) => RenderTarget::Branch(b),
                        Target::NodeId(n) => RenderTarget::Node(n),
                        Target::FunctionId(f) => RenderTarget::Function(f),
                    }),
                    tokenizer: r.tokenizer,
                    callers: r.callers,
                    budget: r.budget,
                    policy: r.policy,
                    now_unix_ms: r.now_unix_ms,
                    last_call_unix_ms: r.last_call_unix_ms,
                    model: r.model,
                }
            }
        }
    };
}

render_args_from!(pb::RenderRequest, render_request);
render_args_from!(pb::ContextStatsRequest, context_stats_request);

/// The model a Render or ContextStats request is for, before its table entry is looked up:
/// its name, how its thinking is treated, and the prices and cache lifetime the request sets
/// itself.
pub(super) struct ModelChoice {
    pub(super) name: String,
    pub(super) reasoning: crate::workflow::render::Reasoning,
    pub(super) prices: Option<crate::domain::CachePrices>,
    pub(super) idle_ms: Option<i64>,
}

/// A Render or ContextStats request, parsed: session, target, tokenizer, engine options, and
/// the model it is for (`None`: none named).
pub(super) fn render_request_for(
    args: RenderArgs,
) -> Result<
    (
        SessionId,
        PathTarget,
        Tokenizer,
        Options,
        Option<ModelChoice>,
    ),
    Status,
> {
    let model = args.model.trim().to_owned();
    let choice = match &args.policy {
        _ if model.is_empty() => None,
        p => Some(ModelChoice {
            name: model,
            reasoning: parse(convert::reasoning(p.as_ref()))?,
            prices: p
                .as_ref()
                .map(convert::prices)
                .transpose()
                .map_err(domain_status)?
                .flatten(),
            idle_ms: p
                .as_ref()
                .filter(|p| p.idle_minutes != 0)
                .map(|p| i64::from(p.idle_minutes) * 60_000),
        }),
    };
    if choice.is_none() {
        // Without a model, a reasoning policy still has to be a known one.
        parse(convert::reasoning(args.policy.as_ref()))?;
    }
    let (session, target, tokenizer, options) = render_request(args)?;
    Ok((session, target, tokenizer, options, choice))
}

/// A Render or ContextStats request, parsed: session, target, tokenizer and engine options.
pub(super) fn render_request(
    args: RenderArgs,
) -> Result<(SessionId, PathTarget, Tokenizer, Options), Status> {
    let session = session_id(&args.session_id)?;
    let target = match args.target {
        None => PathTarget::Branch(BranchName::main()),
        Some(RenderTarget::Branch(name)) => PathTarget::Branch(branch_or_main("branch", &name)?),
        Some(RenderTarget::Node(id)) => PathTarget::Node(parse(NodeId::parse("node_id", &id))?),
        Some(RenderTarget::Function(id)) => {
            PathTarget::Function(parse(NodeId::parse("function_id", &id))?)
        }
    };
    let tokenizer = tokenizer(&args.tokenizer)?;
    let callers = match pb::Callers::try_from(args.callers) {
        Ok(pb::Callers::Unspecified | pb::Callers::All) => Callers::All,
        Ok(pb::Callers::None) => Callers::None,
        Err(_) => {
            return Err(domain_status(Error::invalid(
                "callers",
                format!("unknown value {}", args.callers),
            )));
        }
    };
    let options = Options {
        callers,
        budget: parse(convert::budget(args.budget))?,
        policy: parse(convert::policy(args.policy))?,
        now_ms: if args.now_unix_ms == 0 {
            now_ms()
        } else {
            args.now_unix_ms
        },
        last_call_ms: (args.last_call_unix_ms != 0).then_some(args.last_call_unix_ms),
        // What came after the newest assistant message is new to the model: no step cuts it.
        seen: crate::render::Seen::ThroughLastCall,
    };
    Ok((session, target, tokenizer, options))
}

/// A segment's two ends: both or neither.
fn segment(from: &str, to: &str) -> Result<Option<(NodeId, NodeId)>, Status> {
    match (from.is_empty(), to.is_empty()) {
        (true, true) => Ok(None),
        (false, true) => Err(domain_status(Error::invalid(
            "to_node_id",
            "is required with from_node_id",
        ))),
        (true, false) => Err(domain_status(Error::invalid(
            "from_node_id",
            "is required with to_node_id",
        ))),
        (false, false) => Ok(Some((
            parse(NodeId::parse("from_node_id", from))?,
            parse(NodeId::parse("to_node_id", to))?,
        ))),
    }
}

/// How a summary is asked for: what the request says, and the field that said it.
enum RequestForm {
    /// Unset on `Compact`: the cache-sharing request for a rolling summary, the range for a
    /// segment.
    Default,
    CacheSharing(&'static str),
    Range,
}

trait AsksForm {
    fn form(&self) -> Result<RequestForm, Status>;
}

impl AsksForm for pb::PrepareCompactionRequest {
    fn form(&self) -> Result<RequestForm, Status> {
        Ok(if self.cache_sharing_request {
            RequestForm::CacheSharing("cache_sharing_request")
        } else {
            RequestForm::Range
        })
    }
}

impl AsksForm for pb::CompactRequest {
    fn form(&self) -> Result<RequestForm, Status> {
        match pb::SummaryRequestForm::try_from(self.request_form) {
            Ok(pb::SummaryRequestForm::Unspecified) => Ok(RequestForm::Default),
            Ok(pb::SummaryRequestForm::CacheSharing) => {
                Ok(RequestForm::CacheSharing("request_form"))
            }
            Ok(pb::SummaryRequestForm::Range) => Ok(RequestForm::Range),
            Err(_) => Err(domain_status(Error::invalid(
                "request_form",
                format!("unknown value {}", self.request_form),
            ))),
        }
    }
}

/// The host's render policy, when the summary request is to share its cached prefix.
fn request_policy<R: AsksForm>(
    r: &R,
    policy: Option<pb::RenderPolicy>,
    segment: Option<(NodeId, NodeId)>,
) -> Result<Option<Policy>, Status> {
    match (r.form()?, segment) {
        (RequestForm::Range, _) | (RequestForm::Default, Some(_)) => Ok(None),
        (RequestForm::CacheSharing(field), Some(_)) => Err(domain_status(Error::invalid(
            field,
            "is for rolling summaries: a segment is summarized from its range (leave \
             from_node_id and to_node_id empty, or ask for the range)",
        ))),
        (RequestForm::CacheSharing(_) | RequestForm::Default, None) => {
            Ok(Some(parse(convert::policy(policy))?))
        }
    }
}

/// `PrepareCompaction` and `Compact` carry the same fields: one parse serves both.
macro_rules! prepare_args_from {
    ($request:ty) => {
        impl TryFrom<$request> for PrepareArgs {
            type Error = Status;

            fn try_from(r: $request) -> Result<Self, Status> {
                // Compaction measures with ctxd's first reduction (a 4000-character cut), so
                // when a summary is needed does not move with the render policy's defaults.
                let defaults = Policy::over_budget();
                let or = |value: u32, default: usize| {
                    if value == 0 { default } else { value as usize }
                };
                let segment = segment(&r.from_node_id, &r.to_node_id)?;
                // A segment is the caller's choice, not the budget's: without a budget it is
                // measured whole, and its ledger bounded by its per-category caps alone.
                let budget = match (parse(convert::budget(r.budget))?, segment) {
                    (Some(budget), _) => budget,
                    (None, Some(_)) => Budget {
                        context_window: u32::MAX,
                        ..Budget::default()
                    },
                    (None, None) => {
                        return Err(domain_status(Error::invalid(
                            "budget",
                            "is required (unless from_node_id and to_node_id choose a segment)",
                        )));
                    }
                };
                let request_policy = request_policy(&r, r.policy.clone(), segment)?;
                Ok(Self {
                    request_policy,
                    session: session_id(&r.session_id)?,
                    branch: branch_or_main("branch", &r.branch)?,
                    budget,
                    tokenizer: tokenizer(&r.tokenizer)?,
                    retain_turns: or(r.retain_turns, defaults.retain_turns),
                    instructions: r.instructions,
                    max_tool_result_chars: or(
                        r.max_tool_result_chars,
                        defaults.max_tool_result_chars,
                    ),
                    segment,
                })
            }
        }
    };
}

prepare_args_from!(pb::PrepareCompactionRequest);
prepare_args_from!(pb::CompactRequest);

/// Why a CancelCompaction closes its plan; the caller may leave it out.
pub(super) fn cancel_reason(reason: String) -> String {
    if reason.is_empty() {
        "cancelled by the caller".to_owned()
    } else {
        reason
    }
}
