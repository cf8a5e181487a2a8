//! Conversions between prost types and domain types; parsing names the offending field.

use super::pb;
use crate::domain::{
    Branch, CachePrices, Error, Expose, FunctionResult, FunctionStatus, MediaSource, Node,
    NodeContent, NodeKind, Part, ProviderBlock, Role, Session, ToolCall, WireFormat,
};
use crate::render::{Budget, Message, MessageRole, Policy, Reduction, Report, Saved, Trigger};
use crate::tokens::Tokens;
use crate::workflow::render::{Reasoned, Reasoning};

// ---------------------------------------------------------------- requests

/// A node of a request; no single part of it may exceed `max_part_bytes`.
pub fn node_input(
    field: &str,
    input: pb::NodeInput,
    max_part_bytes: usize,
) -> Result<NodeContent, Error> {
    use pb::node_input::Kind;
    let content = match input.kind {
        None => {
            return Err(Error::invalid(
                field,
                "needs one of message, tool_result, function_call, function_result",
            ));
        }
        Some(Kind::Message(m)) => NodeContent::Message {
            role: match pb::Role::try_from(m.role) {
                Ok(pb::Role::System) => Role::System,
                Ok(pb::Role::Developer) => Role::Developer,
                Ok(pb::Role::User) => Role::User,
                Ok(pb::Role::Assistant) => Role::Assistant,
                Ok(pb::Role::Tool) => {
                    return Err(Error::invalid(
                        format!("{field}.message.role"),
                        "tool output is appended as a tool_result, not a message",
                    ));
                }
                Ok(pb::Role::Unspecified) | Err(_) => {
                    return Err(Error::invalid(
                        format!("{field}.message.role"),
                        "must be system, developer, user or assistant",
                    ));
                }
            },
            parts: parts(&format!("{field}.message"), m.parts)?,
            tool_calls: m
                .tool_calls
                .into_iter()
                .map(|c| ToolCall {
                    call_id: c.call_id,
                    name: c.name,
                    arguments_json: c.arguments_json,
                })
                .collect(),
        },
        Some(Kind::ToolResult(r)) => NodeContent::ToolResult {
            call_id: r.call_id,
            name: r.name,
            parts: parts(&format!("{field}.tool_result"), r.parts)?,
            is_error: r.is_error,
        },
        Some(Kind::FunctionCall(c)) => NodeContent::FunctionCall {
            call_id: c.call_id,
            name: c.name,
            input: c.input,
            expose: match pb::Expose::try_from(c.expose) {
                Ok(pb::Expose::Unspecified | pb::Expose::Io) => Expose::Io,
                Ok(pb::Expose::Full) => Expose::Full,
                Ok(pb::Expose::None) => Expose::None,
                Err(_) => {
                    return Err(Error::invalid(
                        format!("{field}.function_call.expose"),
                        format!("unknown value {}", c.expose),
                    ));
                }
            },
        },
        Some(Kind::FunctionResult(r)) => {
            if !r.function_id.is_empty() || !r.chain_head_id.is_empty() {
                return Err(Error::invalid(
                    format!("{field}.function_result.function_id"),
                    "is filled by the server; leave function_id and chain_head_id empty",
                ));
            }
            NodeContent::FunctionResult(FunctionResult {
                call_id: r.call_id,
                output: r.output,
                status: match pb::FunctionStatus::try_from(r.status) {
                    Ok(pb::FunctionStatus::Unspecified | pb::FunctionStatus::Completed) => {
                        FunctionStatus::Completed
                    }
                    Ok(pb::FunctionStatus::Error) => FunctionStatus::Error,
                    Err(_) => {
                        return Err(Error::invalid(
                            format!("{field}.function_result.status"),
                            format!("unknown value {}", r.status),
                        ));
                    }
                },
                chain: None,
            })
        }
    };
    content.check_part_sizes(field, max_part_bytes)?;
    content.validate(field)?;
    Ok(content)
}

fn parts(field: &str, parts: Vec<pb::ContentPart>) -> Result<Vec<Part>, Error> {
    use pb::content_part::Part as P;
    use pb::media::Source;
    parts
        .into_iter()
        .enumerate()
        .map(|(i, part)| match part.part {
            Some(P::Text(text)) => Ok(Part::Text(text)),
            // A provider block travels as media of its format's MIME type.
            Some(P::Media(media)) if WireFormat::from_mime(&media.mime_type).is_some() => {
                let at = format!("{field}.parts[{i}].media.data");
                match media.source {
                    Some(Source::Data(data)) => ProviderBlock::from_media(&media.mime_type, data)
                        .flatten()
                        .map(Part::Block)
                        .ok_or_else(|| {
                            Error::invalid(at, "must be JSON text for a provider block")
                        }),
                    _ => Err(Error::invalid(at, "is required for a provider block")),
                }
            }
            Some(P::Media(media)) => Ok(Part::Media {
                mime_type: media.mime_type,
                source: match media.source {
                    Some(Source::Data(data)) => MediaSource::Data(data),
                    Some(Source::Url(url)) => MediaSource::Url(url),
                    None => {
                        return Err(Error::invalid(
                            format!("{field}.parts[{i}].media"),
                            "needs data or url",
                        ));
                    }
                },
            }),
            None => Err(Error::invalid(
                format!("{field}.parts[{i}]"),
                "needs text or media",
            )),
        })
        .collect()
}

// ---------------------------------------------------------------- responses

pub fn session(s: Session) -> pb::Session {
    pb::Session {
        session_id: s.id.to_string(),
        created_at_unix_ms: s.created_at_ms,
        metadata: s.metadata.into_iter().collect(),
        compaction_count: s.compaction_count,
        branches: s.branches.into_iter().map(branch).collect(),
        gateway: None,
        node_count: s.node_count,
    }
}

/// A session's gateway usage; `None` for a session the gateway never served.
pub fn gateway_usage(u: crate::domain::GatewayUsage) -> Option<pb::GatewayUsage> {
    (u.calls > 0).then_some(pb::GatewayUsage {
        calls: u.calls,
        client_tokens: u.client_tokens,
        forwarded_tokens: u.forwarded_tokens,
        input_tokens: u.usage.input,
        cache_read_tokens: u.usage.cache_read,
        cache_write_tokens: u.usage.cache_write,
        output_tokens: u.usage.output,
    })
}

pub fn branch(b: Branch) -> pb::Branch {
    let (head_id, head_hash) = match b.head {
        Some((id, hash)) => (id.to_string(), hash.to_hex()),
        None => (String::new(), String::new()),
    };
    pb::Branch {
        name: b.name.to_string(),
        head_id,
        head_hash,
        updated_at_unix_ms: b.updated_at_ms,
    }
}

pub fn node(n: Node) -> pb::Node {
    use pb::node_input::Kind;
    let kind = match n.content.kind() {
        NodeKind::Message => pb::NodeKind::Message,
        NodeKind::ToolResult => pb::NodeKind::ToolResult,
        NodeKind::FunctionCall => pb::NodeKind::FunctionCall,
        NodeKind::FunctionResult => pb::NodeKind::FunctionResult,
    };
    let content = match n.content {
        NodeContent::Message {
            role,
            parts,
            tool_calls,
        } => Kind::Message(pb::Message {
            role: match role {
                Role::System => pb::Role::System,
                Role::Developer => pb::Role::Developer,
                Role::User => pb::Role::User,
                Role::Assistant => pb::Role::Assistant,
            }
            .into(),
            parts: parts.into_iter().map(part).collect(),
            tool_calls: tool_calls.into_iter().map(tool_call).collect(),
        }),
        NodeContent::ToolResult {
            call_id,
            name,
            parts,
            is_error,
        } => Kind::ToolResult(pb::ToolResult {
            call_id,
            name,
            parts: parts.into_iter().map(part).collect(),
            is_error,
        }),
        NodeContent::FunctionCall {
            call_id,
            name,
            input,
            expose,
        } => Kind::FunctionCall(pb::FunctionCall {
            call_id,
            name,
            input,
            expose: match expose {
                Expose::Io => pb::Expose::Io,
                Expose::Full => pb::Expose::Full,
                Expose::None => pb::Expose::None,
            }
            .into(),
        }),
        NodeContent::FunctionResult(r) => Kind::FunctionResult(pb::FunctionResult {
            call_id: r.call_id,
            output: r.output,
            status: match r.status {
                FunctionStatus::Completed => pb::FunctionStatus::Completed,
                FunctionStatus::Error => pb::FunctionStatus::Error,
            }
            .into(),
            function_id: r
                .chain
                .as_ref()
                .map(|c| c.function_id.to_string())
                .unwrap_or_default(),
            chain_head_id: r
                .chain
                .and_then(|c| c.head_id)
                .map(|id| id.to_string())
                .unwrap_or_default(),
        }),
    };
    pb::Node {
        node_id: n.id.to_string(),
        parent_id: n.parent_id.map(|id| id.to_string()).unwrap_or_default(),
        kind: kind.into(),
        content: Some(pb::NodeInput {
            kind: Some(content),
            pinned: false,
        }),
        created_at_unix_ms: n.created_at_ms,
        hash: n.hash.to_hex(),
        function_id: n.function_id.map(|id| id.to_string()).unwrap_or_default(),
        pinned: false,
    }
}

fn part(p: Part) -> pb::ContentPart {
    use pb::content_part::Part as P;
    use pb::media::Source;
    pb::ContentPart {
        part: Some(match p {
            Part::Text(text) => P::Text(text),
            Part::Media { mime_type, source } => P::Media(pb::Media {
                mime_type,
                source: Some(match source {
                    MediaSource::Data(data) => Source::Data(data),
                    MediaSource::Url(url) => Source::Url(url),
                }),
            }),
            Part::Block(block) => P::Media(pb::Media {
                mime_type: block.mime().to_owned(),
                source: Some(Source::Data(block.json.into_bytes())),
            }),
        }),
    }
}

fn tool_call(c: ToolCall) -> pb::ToolCall {
    pb::ToolCall {
        call_id: c.call_id,
        name: c.name,
        arguments_json: c.arguments_json,
    }
}

pub fn rendered(m: Message, tokens: Tokens) -> pb::RenderedMessage {
    pb::RenderedMessage {
        role: match m.role {
            MessageRole::System => pb::Role::System,
            MessageRole::Developer => pb::Role::Developer,
            MessageRole::User => pb::Role::User,
            MessageRole::Assistant => pb::Role::Assistant,
            MessageRole::Tool => pb::Role::Tool,
        }
        .into(),
        parts: m.parts.into_iter().map(part).collect(),
        tool_calls: m.tool_calls.into_iter().map(tool_call).collect(),
        tool_call_id: m.tool_call_id.unwrap_or_default(),
        name: m.name.unwrap_or_default(),
        is_error: m.is_error,
        node_ids: m.node_ids.iter().map(ToString::to_string).collect(),
        function_id: m.function_id.map(|id| id.to_string()).unwrap_or_default(),
        tokens,
        truncated: matches!(m.reduction, Reduction::Truncated { .. }),
        cleared: m.reduction == Reduction::Cleared,
        inputs_stubbed: count(m.stubbed_inputs),
        pinned: m.pinned,
    }
}

// ---------------------------------------------------------------- render options and report

pub fn budget(b: Option<pb::Budget>) -> Result<Option<Budget>, Error> {
    let Some(b) = b else { return Ok(None) };
    let budget = Budget {
        context_window: b.context_window,
        output_reserve: b.output_reserve,
        system: b.system_tokens,
        tools: b.tools_tokens,
        schema: b.schema_tokens,
    };
    budget.history()?;
    Ok(Some(budget))
}

pub fn policy(p: Option<pb::RenderPolicy>) -> Result<Policy, Error> {
    let Some(p) = p else {
        return Ok(Policy::default());
    };
    let defaults = match pb::MicrocompactMode::try_from(p.microcompact) {
        Ok(pb::MicrocompactMode::OverBudget) => Policy::over_budget(),
        Ok(pb::MicrocompactMode::Unspecified | pb::MicrocompactMode::Stepped) => Policy::default(),
        Err(_) => {
            return Err(Error::invalid(
                "policy.microcompact",
                format!("unknown value {}", p.microcompact),
            ));
        }
    };
    let or = |value: u32, default: usize| if value == 0 { default } else { value as usize };
    // A limit the request may set to zero: unset only when absent.
    let set = |value: Option<u32>, default: usize| value.map_or(default, |v| v as usize);
    Ok(Policy {
        max_tool_result_chars: or(p.max_tool_result_chars, defaults.max_tool_result_chars),
        recent_tool_result_chars: or(
            p.recent_tool_result_chars,
            defaults.recent_tool_result_chars,
        ),
        microcompact: defaults.microcompact,
        clear_at_least_tokens: p
            .clear_at_least_tokens
            .unwrap_or(defaults.clear_at_least_tokens),
        max_tool_input_chars: set(p.max_tool_input_chars, defaults.max_tool_input_chars),
        max_assistant_text_chars: set(
            p.max_assistant_text_chars,
            defaults.max_assistant_text_chars,
        ),
        recent_assistant_text_chars: set(
            p.recent_assistant_text_chars,
            defaults.recent_assistant_text_chars,
        ),
        recent_tool_input_chars: set(p.recent_tool_input_chars, defaults.recent_tool_input_chars),
        microcompact_first: or(p.microcompact_first, defaults.microcompact_first),
        microcompact_every: or(p.microcompact_every, defaults.microcompact_every),
        microcompact_keep: or(p.microcompact_keep, defaults.microcompact_keep),
        idle_ms: if p.idle_minutes == 0 {
            defaults.idle_ms
        } else {
            i64::from(p.idle_minutes) * 60_000
        },
        payback_odds: or(p.payback_odds, defaults.payback_odds),
        retain_turns: or(p.retain_turns, defaults.retain_turns),
        snip: p.snip.unwrap_or(defaults.snip),
        reactive: p.reactive,
        prices: prices(&p)?.unwrap_or(defaults.prices),
        provider_edits: defaults.provider_edits,
        drop_invalid_reasoning: defaults.drop_invalid_reasoning,
    })
}

/// The cache prices a policy sets itself (either one; the other stays the default's).
pub fn prices(p: &pb::RenderPolicy) -> Result<Option<CachePrices>, Error> {
    let per_mille = |field: &str, v: f64| {
        CachePrices::per_mille(v).ok_or_else(|| {
            Error::invalid(
                format!("policy.{field}"),
                format!("must be between 0 and 100, not {v}"),
            )
        })
    };
    if p.cache_read_price.is_none() && p.cache_write_price.is_none() {
        return Ok(None);
    }
    let mut prices = CachePrices::STANDARD;
    if let Some(r) = p.cache_read_price {
        prices.read_per_mille = per_mille("cache_read_price", r)?;
    }
    if let Some(w) = p.cache_write_price {
        prices.write_per_mille = per_mille("cache_write_price", w)?;
    }
    Ok(Some(prices))
}

/// How a policy asks a render for a binding model to treat its thinking.
pub fn reasoning(p: Option<&pb::RenderPolicy>) -> Result<Reasoning, Error> {
    match p.map_or(Ok(pb::Reasoning::Unspecified), |p| {
        pb::Reasoning::try_from(p.reasoning)
    }) {
        Ok(pb::Reasoning::Unspecified | pb::Reasoning::Keep) => Ok(Reasoning::Keep),
        Ok(pb::Reasoning::Drop) => Ok(Reasoning::Drop),
        Err(_) => Err(Error::invalid(
            "policy.reasoning",
            format!("unknown value {}", p.map_or(0, |p| p.reasoning)),
        )),
    }
}

fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

fn ids(ids: &[crate::domain::NodeId]) -> Vec<String> {
    ids.iter().map(ToString::to_string).collect()
}

pub fn report(r: &Report) -> pb::ContextReport {
    let b = &r.breakdown;
    pb::ContextReport {
        total_tokens: r.total_tokens,
        tokens: Some(pb::TokenBreakdown {
            system: b.system,
            user: b.user,
            assistant_text: b.assistant_text,
            tool_calls: b.tool_calls,
            tool_results: b.tool_results,
            summaries: b.summaries,
            markers: b.markers,
        }),
        messages: count(r.messages),
        tokenizer: r.tokenizer.name().to_owned(),
        budget: r.budget.map(|b| pb::Budget {
            context_window: b.context_window,
            output_reserve: b.output_reserve,
            system_tokens: b.system,
            tools_tokens: b.tools,
            schema_tokens: b.schema,
        }),
        history_budget: r.history_budget.unwrap_or(0),
        fits: r.fits,
        over_by: r.over_by,
        summary_needed: r.summary_needed,
        results_truncated: count(r.results_truncated),
        truncated_node_ids: ids(&r.truncated),
        results_cleared: count(r.results_cleared),
        cleared_node_ids: ids(&r.cleared),
        turns_snipped: count(r.turns_snipped),
        snipped_node_ids: ids(&r.snipped),
        microcompact_trigger: r
            .trigger
            .map(Trigger::as_str)
            .unwrap_or_default()
            .to_owned(),
        microcompact_boundary: count(r.microcompact_boundary),
        // 0 says "not a step its saving paid for"; one that pays at once pays within a call.
        payback_calls: r.payback_calls.map_or(0, |n| n.max(1)),
        priced_by: String::new(),
        edit_clear: 0,
        edit_keep: 0,
        thinking_dropped: 0,
        stable_prefix_messages: count(r.stable_prefix_messages),
        inputs_stubbed: count(r.inputs_stubbed),
        stubbed_node_ids: ids(&r.stubbed),
        saved_truncation: Some(saved(&r.saved_truncation)),
        saved_clearing: Some(saved(&r.saved_clearing)),
        saved_stubbing: Some(saved(&r.saved_stubbing)),
        pinned_tokens: r.pinned_tokens,
        pinned_node_ids: ids(&r.pinned),
        pins_exceed_budget: r.pins_exceed_budget,
        summary_ids: r.summaries.iter().map(ToString::to_string).collect(),
        texts_cut: count(r.texts_cut.len()),
        text_cut_node_ids: ids(&r.texts_cut),
        saved_text_cut: Some(saved(&r.saved_text_cut)),
    }
}

pub fn ledger(l: &crate::domain::Ledger) -> pb::EvidenceLedger {
    let files = |files: &[crate::domain::FileUse]| {
        files
            .iter()
            .map(|f| pb::FileUse {
                path: f.path.clone(),
                tools: f.tools.clone(),
                count: f.count,
            })
            .collect()
    };
    pb::EvidenceLedger {
        files_read: files(&l.files_read),
        files_modified: files(&l.files_modified),
        commands: l
            .commands
            .iter()
            .map(|c| pb::CommandRun {
                command: c.command.clone(),
                exit_code: c.exit_code,
                is_error: c.is_error,
            })
            .collect(),
        errors: l
            .errors
            .iter()
            .map(|e| pb::ErrorSeen {
                tool: e.tool.clone(),
                line: e.line.clone(),
            })
            .collect(),
        user_requests: l.user_requests.clone(),
        functions: l
            .functions
            .iter()
            .map(|f| pb::FunctionUse {
                name: f.name.clone(),
                input: f.input.clone(),
                output: f.output.clone(),
                is_error: f.is_error,
            })
            .collect(),
    }
}

pub fn summary_kind(k: crate::domain::SummaryKind) -> pb::SummaryKind {
    match k {
        crate::domain::SummaryKind::Rolling => pb::SummaryKind::Rolling,
        crate::domain::SummaryKind::Segment => pb::SummaryKind::Segment,
    }
}

fn saved(s: &Saved) -> pb::StepSavings {
    pb::StepSavings {
        items: count(s.items),
        chars: s.chars as u64,
        tokens: s.tokens,
    }
}

/// A report of a render for a model: the render's, and what the model's rules did.
pub fn reasoned_report(r: &Report, reasoned: &Reasoned) -> pb::ContextReport {
    let (edit_clear, edit_keep) = reasoned
        .edit
        .as_ref()
        .map_or((0, 0), |(e, _)| (e.clear, e.keep));
    pb::ContextReport {
        priced_by: reasoned.priced_by.clone(),
        edit_clear,
        edit_keep,
        thinking_dropped: count(r.thinking_dropped),
        ..report(r)
    }
}
