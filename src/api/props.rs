//! Property tests of request conversion: any request converts, or fails with INVALID_ARGUMENT
//! naming a field the request has; what converts carries exactly what was sent.

mod generators;

use proptest::prelude::*;
use tonic::{Code, Status};

use super::parse::{
    RenderArgs, append_request, create_branch_request, log_request, render_request,
};
use super::{convert, pb};
use crate::domain::{BranchName, Node, NodeId};
use crate::render::{Callers, Microcompact, Policy};
use crate::store::{AppendTarget, PathTarget};
use crate::tokens::Tokenizer;
use crate::workflow::compaction::PrepareArgs;
use generators::{
    append, branch_text, budget, enum_value, id_text, maybe_id, policy, render, text,
    tokenizer_name,
};

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 2000,
        ..ProptestConfig::default()
    }
}

// ---------------------------------------------------------------- checks

/// The field an INVALID_ARGUMENT names: the text before its first ": ".
fn named_field(status: &Status) -> &str {
    assert_eq!(
        status.code(),
        Code::InvalidArgument,
        "only INVALID_ARGUMENT, got {status:?}"
    );
    let field = status
        .message()
        .split_once(": ")
        .map(|(field, _)| field)
        .unwrap_or_else(|| panic!("no `field: reason` in {:?}", status.message()));
    assert!(!field.is_empty(), "{status:?}");
    field
}

/// `field` (`nodes[2].message.tool_calls[0].call_id`) is a path into `request`.
fn node_path_exists(field: &str, nodes: &[pb::NodeInput]) -> bool {
    use pb::node_input::Kind;
    let Some(rest) = field.strip_prefix("nodes[") else {
        return false;
    };
    let Some((index, path)) = rest.split_once(']') else {
        return false;
    };
    let Some(node) = index.parse::<usize>().ok().and_then(|i| nodes.get(i)) else {
        return false;
    };
    let path = path.strip_prefix('.').unwrap_or(path);
    let mut segments = path.split('.');
    let (kind, parts_len, calls_len) = match &node.kind {
        None => return path.is_empty(),
        Some(Kind::Message(m)) => ("message", m.parts.len(), m.tool_calls.len()),
        Some(Kind::ToolResult(r)) => ("tool_result", r.parts.len(), 0),
        Some(Kind::FunctionCall(_)) => ("function_call", 0, 0),
        Some(Kind::FunctionResult(_)) => ("function_result", 0, 0),
    };
    if path.is_empty() {
        return true;
    }
    if segments.next() != Some(kind) {
        return false;
    }
    let indexed = |segment: &str, name: &str, len: usize| {
        segment
            .strip_prefix(name)
            .and_then(|s| s.strip_prefix('['))
            .and_then(|s| s.strip_suffix(']'))
            .and_then(|i| i.parse::<usize>().ok())
            .is_some_and(|i| i < len)
    };
    match segments.next() {
        None => true,
        Some(s) if s.starts_with("parts[") => indexed(s, "parts", parts_len),
        Some(s) if s.starts_with("tool_calls[") => indexed(s, "tool_calls", calls_len),
        Some(s) => !s.contains('['),
    }
}

/// What a node input carries once the server's defaults are filled in.
fn normalized(input: &pb::NodeInput) -> pb::NodeInput {
    use pb::node_input::Kind;
    let mut input = input.clone();
    match &mut input.kind {
        Some(Kind::FunctionCall(c)) if c.expose == pb::Expose::Unspecified as i32 => {
            c.expose = pb::Expose::Io as i32;
        }
        Some(Kind::FunctionResult(r)) if r.status == pb::FunctionStatus::Unspecified as i32 => {
            r.status = pb::FunctionStatus::Completed as i32;
        }
        _ => {}
    }
    input
}

fn same_id(parsed: impl ToString, text: &str) -> bool {
    uuid::Uuid::try_parse(text).is_ok_and(|u| u.to_string() == parsed.to_string())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn append_converts_or_names_a_field(request in append()) {
        match append_request(request.clone(), usize::MAX) {
            Ok(parsed) => {
                prop_assert!(same_id(parsed.session, &request.session_id));
                match &parsed.target {
                    AppendTarget::Function(f) => prop_assert!(same_id(f, &request.function_id)),
                    AppendTarget::Branch(b) => {
                        prop_assert!(request.function_id.is_empty());
                        let want = if request.branch.is_empty() { "main" } else { &request.branch };
                        prop_assert_eq!(b.as_str(), want);
                    }
                }
                match (&parsed.expected_head, &request.expected_head_id) {
                    (None, None) => {}
                    (Some(None), Some(text)) => prop_assert!(text.is_empty()),
                    (Some(Some(id)), Some(text)) => prop_assert!(same_id(id, text)),
                    other => prop_assert!(false, "expected_head: {:?}", other),
                }
                prop_assert_eq!(
                    parsed.idempotency_key.as_deref().unwrap_or(""),
                    request.idempotency_key.as_str()
                );
                // Each node round-trips: what is stored is what was sent.
                prop_assert_eq!(parsed.nodes.len(), request.nodes.len());
                for (content, sent) in parsed.nodes.into_iter().zip(&request.nodes) {
                    let node = convert::node(Node {
                        id: NodeId::new(),
                        parent_id: None,
                        function_id: None,
                        content,
                        created_at_ms: 0,
                        hash: crate::domain::Hash([0; 32]),
                    });
                    prop_assert_eq!(node.content, Some(normalized(sent)));
                }
            }
            Err(status) => {
                let field = named_field(&status);
                let top = ["session_id", "branch", "function_id", "expected_head_id", "nodes"];
                prop_assert!(
                    top.contains(&field) || node_path_exists(field, &request.nodes),
                    "{} names no field of the request: {:?}", field, status.message()
                );
            }
        }
    }

    #[test]
    fn render_converts_or_names_a_field(request in render()) {
        use pb::render_request::Target;
        // ContextStats carries the same fields through the same conversion.
        let stats = pb::ContextStatsRequest {
            session_id: request.session_id.clone(),
            target: request.target.clone().map(|t| match t {
                Target::Branch(b) => pb::context_stats_request::Target::Branch(b),
                Target::NodeId(n) => pb::context_stats_request::Target::NodeId(n),
                Target::FunctionId(f) => pb::context_stats_request::Target::FunctionId(f),
            }),
            tokenizer: request.tokenizer.clone(),
            callers: request.callers,
            budget: request.budget,
            policy: request.policy,
            now_unix_ms: request.now_unix_ms,
            last_call_unix_ms: request.last_call_unix_ms,
            model: request.model.clone(),
        };
        let parsed = render_request(RenderArgs::from(request.clone()));
        let via_stats = render_request(RenderArgs::from(stats));
        prop_assert_eq!(
            parsed.as_ref().map(|(s, t, k, o)| (*s, t.clone(), *k, o.budget, o.policy, o.callers))
                .map_err(|e| e.message().to_owned()),
            via_stats.as_ref().map(|(s, t, k, o)| (*s, t.clone(), *k, o.budget, o.policy, o.callers))
                .map_err(|e| e.message().to_owned())
        );
        let history = request.budget.map(|b| {
            i64::from(b.context_window)
                - i64::from(b.output_reserve)
                - i64::from(b.system_tokens)
                - i64::from(b.tools_tokens)
                - i64::from(b.schema_tokens)
        });
        match parsed {
            Ok((session, target, tokenizer, options)) => {
                prop_assert!(same_id(session, &request.session_id));
                match (&target, &request.target) {
                    (PathTarget::Branch(b), None) => prop_assert_eq!(b.as_str(), "main"),
                    (PathTarget::Branch(b), Some(Target::Branch(name))) => {
                        prop_assert_eq!(b.as_str(), if name.is_empty() { "main" } else { name });
                    }
                    (PathTarget::Node(n), Some(Target::NodeId(text))) => prop_assert!(same_id(n, text)),
                    (PathTarget::Function(f), Some(Target::FunctionId(text))) => {
                        prop_assert!(same_id(f, text));
                    }
                    other => prop_assert!(false, "target {:?}", other),
                }
                let name = if request.tokenizer.is_empty() { "heuristic" } else { &request.tokenizer };
                prop_assert_eq!(tokenizer.name(), name);
                prop_assert_eq!(
                    options.callers,
                    if request.callers == pb::Callers::None as i32 { Callers::None } else { Callers::All }
                );
                // A budget converts exactly when it leaves the history something.
                prop_assert!(history.is_none_or(|h| h > 0));
                if let Some(b) = request.budget {
                    let got = options.budget.expect("a budget");
                    prop_assert_eq!(
                        (got.context_window, got.output_reserve, got.system, got.tools, got.schema),
                        (b.context_window, b.output_reserve, b.system_tokens, b.tools_tokens, b.schema_tokens)
                    );
                } else {
                    prop_assert!(options.budget.is_none());
                }
                // Zero means the default (ctxd's first policy's, when asked for); anything else is
                // carried as sent.
                let p = request.policy.unwrap_or_default();
                let defaults = if p.microcompact == 2 { Policy::over_budget() } else { Policy::default() };
                let or = |v: u32, d: usize| if v == 0 { d } else { v as usize };
                prop_assert_eq!(
                    options.policy.microcompact,
                    if p.microcompact == 2 { Microcompact::OverBudget } else { Microcompact::Stepped }
                );
                prop_assert_eq!(options.policy.recent_tool_result_chars, or(p.recent_tool_result_chars, defaults.recent_tool_result_chars));
                prop_assert_eq!(options.policy.clear_at_least_tokens, p.clear_at_least_tokens.unwrap_or(defaults.clear_at_least_tokens));
                prop_assert_eq!(options.policy.max_tool_input_chars, p.max_tool_input_chars.map_or(defaults.max_tool_input_chars, |v| v as usize));
                prop_assert_eq!(options.policy.max_assistant_text_chars, p.max_assistant_text_chars.map_or(defaults.max_assistant_text_chars, |v| v as usize));
                prop_assert_eq!(options.policy.max_tool_result_chars, or(p.max_tool_result_chars, defaults.max_tool_result_chars));
                prop_assert_eq!(options.policy.microcompact_first, or(p.microcompact_first, defaults.microcompact_first));
                prop_assert_eq!(options.policy.microcompact_every, or(p.microcompact_every, defaults.microcompact_every));
                prop_assert_eq!(options.policy.microcompact_keep, or(p.microcompact_keep, defaults.microcompact_keep));
                prop_assert_eq!(options.policy.retain_turns, or(p.retain_turns, defaults.retain_turns));
                prop_assert_eq!(options.policy.payback_odds, or(p.payback_odds, defaults.payback_odds));
                prop_assert_eq!(
                    options.policy.idle_ms,
                    if p.idle_minutes == 0 { defaults.idle_ms } else { i64::from(p.idle_minutes) * 60_000 }
                );
                prop_assert_eq!(options.policy.snip, request.policy.and_then(|p| p.snip).unwrap_or(defaults.snip));
                prop_assert_eq!(options.policy.reactive, p.reactive);
                if request.now_unix_ms != 0 {
                    prop_assert_eq!(options.now_ms, request.now_unix_ms);
                }
                prop_assert_eq!(
                    options.last_call_ms,
                    (request.last_call_unix_ms != 0).then_some(request.last_call_unix_ms)
                );
            }
            Err(status) => {
                let field = named_field(&status);
                let fields = ["session_id", "branch", "node_id", "function_id", "tokenizer", "callers", "budget", "policy.microcompact"];
                prop_assert!(fields.contains(&field), "{:?}", status.message());
                if field == "policy.microcompact" {
                    prop_assert!(request.policy.is_some_and(|p| !(0..=2).contains(&p.microcompact)));
                }
                if field == "budget" {
                    prop_assert!(history.is_some_and(|h| h <= 0), "{:?}", status.message());
                }
            }
        }
    }

    #[test]
    fn branch_names_convert_or_name_the_field(
        session_id in id_text(),
        name in branch_text(),
        from_node_id in maybe_id(),
    ) {
        let request = pb::CreateBranchRequest { session_id, name, from_node_id };
        match create_branch_request(&request) {
            Ok((session, branch, from)) => {
                prop_assert!(same_id(session, &request.session_id));
                prop_assert_eq!(branch.as_str(), request.name.as_str());
                // What a name may be, whatever the parser's rules look like.
                let n = branch.as_str();
                prop_assert!(!n.is_empty() && n.len() <= BranchName::MAX_LEN);
                prop_assert!(n.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_./".contains(&b)));
                prop_assert!(n.split('/').all(|s| !s.is_empty() && !s.starts_with('.')));
                prop_assert!(!n.contains("..") && !n.starts_with('-') && !n.ends_with('.'));
                match from {
                    Some(id) => prop_assert!(same_id(id, &request.from_node_id)),
                    None => prop_assert!(request.from_node_id.is_empty()),
                }
            }
            Err(status) => {
                let field = named_field(&status);
                prop_assert!(["session_id", "name", "from_node_id"].contains(&field), "{:?}", status.message());
            }
        }
    }

    #[test]
    fn log_paging_converts_or_names_a_field(
        session_id in id_text(),
        branch in prop_oneof![2 => Just(String::new()), 1 => branch_text()],
        node_id in maybe_id(),
        limit in prop_oneof![Just(0u32), 1u32..2_000, any::<u32>()],
        page_token in maybe_id(),
    ) {
        let request = pb::LogRequest { session_id, branch, node_id, limit, page_token };
        match log_request(&request) {
            Ok((session, start, limit)) => {
                prop_assert!(same_id(session, &request.session_id));
                prop_assert_eq!(limit, if request.limit == 0 { 100 } else { request.limit.min(1000) });
                prop_assert!(request.branch.is_empty() || request.node_id.is_empty());
                // The page token wins, then the node, then the branch (default main).
                match start {
                    PathTarget::Node(id) if !request.page_token.is_empty() => {
                        prop_assert!(same_id(id, &request.page_token));
                    }
                    PathTarget::Node(id) => prop_assert!(same_id(id, &request.node_id)),
                    PathTarget::Branch(b) => {
                        prop_assert!(request.page_token.is_empty() && request.node_id.is_empty());
                        let want = if request.branch.is_empty() { "main" } else { &request.branch };
                        prop_assert_eq!(b.as_str(), want);
                    }
                    PathTarget::Function(_) => prop_assert!(false, "a log never starts at a function"),
                }
            }
            Err(status) => {
                let field = named_field(&status);
                prop_assert!(["session_id", "branch", "node_id", "page_token"].contains(&field), "{:?}", status.message());
            }
        }
    }

    #[test]
    fn prepare_compaction_converts_or_names_a_field(
        session_id in id_text(),
        branch in branch_text(),
        budget in budget(),
        tokenizer in tokenizer_name(),
        retain_turns in prop_oneof![Just(0u32), any::<u32>()],
        instructions in text(),
        max_tool_result_chars in prop_oneof![Just(0u32), any::<u32>()],
        format in enum_value(3),
        from_node_id in prop_oneof![Just(String::new()), id_text()],
        to_node_id in prop_oneof![Just(String::new()), id_text()],
        cache_sharing_request in any::<bool>(),
        policy in policy(),
    ) {
        let request = pb::PrepareCompactionRequest {
            session_id, branch, budget, tokenizer, retain_turns, instructions,
            max_tool_result_chars, format, from_node_id, to_node_id, cache_sharing_request, policy,
        };
        match PrepareArgs::try_from(request.clone()) {
            Ok(args) => {
                prop_assert!(same_id(args.session, &request.session_id));
                let want = if request.branch.is_empty() { "main" } else { &request.branch };
                prop_assert_eq!(args.branch.as_str(), want);
                match &request.budget {
                    Some(b) => prop_assert_eq!(
                        (args.budget.context_window, args.budget.output_reserve, args.budget.system,
                         args.budget.tools, args.budget.schema),
                        (b.context_window, b.output_reserve, b.system_tokens, b.tools_tokens, b.schema_tokens)
                    ),
                    // Only a segment may leave the budget out: it is measured whole.
                    None => {
                        prop_assert!(args.segment.is_some());
                        prop_assert_eq!(args.budget.context_window, u32::MAX);
                    }
                }
                prop_assert!(args.budget.history().is_ok());
                let name = if request.tokenizer.is_empty() { "heuristic" } else { &request.tokenizer };
                prop_assert_eq!(args.tokenizer, Tokenizer::parse(name).expect("known"));
                prop_assert_eq!(args.retain_turns, if request.retain_turns == 0 { 2 } else { request.retain_turns as usize });
                prop_assert_eq!(
                    args.max_tool_result_chars,
                    if request.max_tool_result_chars == 0 { 4000 } else { request.max_tool_result_chars as usize }
                );
                prop_assert_eq!(args.instructions, request.instructions);
                match args.segment {
                    Some((from, to)) => {
                        prop_assert!(same_id(from, &request.from_node_id));
                        prop_assert!(same_id(to, &request.to_node_id));
                    }
                    None => prop_assert!(request.from_node_id.is_empty() && request.to_node_id.is_empty()),
                }
                // The cache-sharing request is for rolling summaries alone.
                prop_assert_eq!(args.request_policy.is_some(), request.cache_sharing_request);
                prop_assert!(args.request_policy.is_none() || args.segment.is_none());
            }
            Err(status) => {
                let field = named_field(&status);
                prop_assert!(
                    ["session_id", "branch", "budget", "tokenizer", "from_node_id", "to_node_id",
                     "cache_sharing_request", "policy.microcompact"]
                        .contains(&field),
                    "{:?}", status.message()
                );
                if request.budget.is_none() {
                    prop_assert!(
                        field != "budget" || status.message().starts_with("budget: is required"),
                        "{:?}", status.message()
                    );
                }
            }
        }
    }
}
