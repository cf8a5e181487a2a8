//! The responses as JSON (the CLI's `--json`, the inspector's `/api`): field names as in the
//! proto, every field present.
//!
//! Enums print as their proto names (`ROLE_USER`), bytes as standard base64, and maps with
//! sorted keys, so the output is stable for scripts.

use serde_json::{Value, json};

use crate::proto::pb;

pub trait ToJson {
    fn to_json(&self) -> Value;
}

impl<T: ToJson> ToJson for Vec<T> {
    fn to_json(&self) -> Value {
        Value::Array(self.iter().map(ToJson::to_json).collect())
    }
}

impl<T: ToJson> ToJson for Option<T> {
    fn to_json(&self) -> Value {
        self.as_ref().map_or(Value::Null, ToJson::to_json)
    }
}

/// An enum value by its proto name, or the bare number if this build does not know it.
macro_rules! enum_json {
    ($enum:ty, $value:expr) => {
        <$enum>::try_from($value).map_or(json!($value), |e| json!(e.as_str_name()))
    };
}

/// `ToJson` for messages whose JSON is their fields in order, each under its own name: `field`
/// as serde writes it, `field: json` by its own `ToJson`, `field: enum Type` by `enum_json!`.
macro_rules! fields_json {
    ($($message:ty { $($field:ident $(: $how:tt $($enum:ty)?)?),* $(,)? })*) => {
        $(impl ToJson for $message {
            fn to_json(&self) -> Value {
                // As `json!({...})` builds an object, without its recursion over every token.
                let mut object = serde_json::Map::new();
                $(object.insert(
                    stringify!($field).into(),
                    field_json!(self.$field $(, $how $($enum)?)?),
                );)*
                Value::Object(object)
            }
        })*
    };
}

/// One field's value, as `fields_json!` says.
macro_rules! field_json {
    ($value:expr) => {
        json!($value)
    };
    ($value:expr, json) => {
        $value.to_json()
    };
    ($value:expr, enum $enum:ty) => {
        enum_json!($enum, $value)
    };
}

fields_json! {
    pb::Session {
        session_id, created_at_unix_ms, metadata, compaction_count, branches: json, node_count,
        gateway: json,
    }
    pb::GatewayUsage {
        calls, client_tokens, forwarded_tokens, input_tokens, cache_read_tokens, cache_write_tokens,
        output_tokens,
    }
    pb::GatewayCall {
        at_unix_ms, api, model, client_tokens, forwarded_tokens, input_tokens, cache_read_tokens,
        cache_write_tokens, output_tokens, kept_tokens, change, unexplained_miss, priced_by,
        edit_clear, edit_keep, provider_cleared, provider_cleared_tokens,
        provider_thinking_dropped, thinking_dropped, cost,
    }
    pb::ListGatewayCallsResponse { calls: json, next_page_token }
    pb::Branch { name, head_id, head_hash, updated_at_unix_ms }
    pb::ListSessionsResponse { sessions: json, next_page_token }
    pb::ToolCall { call_id, name, arguments_json }
    pb::Message { role: enum pb::Role, parts: json, tool_calls: json }
    pb::ToolResult { call_id, name, parts: json, is_error }
    pb::FunctionCall { call_id, name, input, expose: enum pb::Expose }
    pb::FunctionResult {
        call_id, output, status: enum pb::FunctionStatus, function_id, chain_head_id,
    }
    pb::Node {
        node_id, parent_id, kind: enum pb::NodeKind, content: json, created_at_unix_ms, hash,
        function_id, pinned,
    }
    pb::LogResponse { nodes: json, next_page_token }
    pb::GetNodesResponse { nodes: json }
    pb::RenderedMessage {
        role: enum pb::Role, parts: json, tool_calls: json, tool_call_id, name, is_error, node_ids,
        function_id, tokens, truncated, cleared, inputs_stubbed, pinned,
    }
    pb::RenderResponse {
        messages: json, head_id, head_hash, total_tokens, tokenizer, report: json, messages_json,
        betas,
    }
    pb::Budget { context_window, output_reserve, system_tokens, tools_tokens, schema_tokens }
    pb::TokenBreakdown {
        system, user, assistant_text, tool_calls, tool_results, summaries, markers,
    }
    pb::ContextReport {
        total_tokens, tokens: json, messages, tokenizer, budget: json, history_budget, fits,
        over_by, summary_needed, results_truncated, truncated_node_ids, results_cleared,
        cleared_node_ids, turns_snipped, snipped_node_ids, microcompact_trigger,
        microcompact_boundary, stable_prefix_messages, inputs_stubbed, stubbed_node_ids,
        saved_truncation: json, saved_clearing: json, saved_stubbing: json, texts_cut,
        text_cut_node_ids, saved_text_cut: json, pinned_tokens, pinned_node_ids, pins_exceed_budget,
        summary_ids, payback_calls, priced_by, edit_clear, edit_keep, thinking_dropped,
    }
    pb::StepSavings { items, chars, tokens }
    pb::CompactionOutcome {
        applied, summary_id, tokens_before, tokens_after, reason: enum pb::CompactionReason,
        message, compaction_id,
    }
    pb::SummaryRecord {
        summary_id, compaction_id, covers_ids, prior_summary_id, text, model, base_head_id,
        tokens_before, tokens_after, created_at_unix_ms, applies, active,
        kind: enum pb::SummaryKind, from_node_id, to_node_id, rolls_over_ids, ledger: json,
    }
    pb::PrepareCompactionResponse {
        needed, compaction_id, base_head_id, covers_ids, prior_summary_id, summary_input: json,
        tokens_before, input_tokens, reason, history_budget, retained_turns, summary_input_json,
        ledger: json, ledger_text, rolls_over_ids, kind: enum pb::SummaryKind,
    }
    pb::EvidenceLedger {
        files_read: json, files_modified: json, commands: json, errors: json, user_requests,
        functions: json,
    }
    pb::FileUse { path, tools, count }
    // `exit_code` is null when the result stated none.
    pb::CommandRun { command, exit_code, is_error }
    pb::ErrorSeen { tool, line }
    pb::FunctionUse { name, input, output, is_error }
    pb::PinResponse { pinned_ids }
    pb::RecallResponse { node_id, kind, content, total_chars, truncated, tool_call_id, tool_name }
    pb::Tombstone { session_id, deleted_by, deleted_at_unix_ms, nodes, branches, summaries }
    pb::DeleteSessionResponse { tombstone: json, already_deleted }
    pb::BackupDatabaseResponse { path, bytes, took_ms }
    pb::CollectGarbageResponse { sessions, tombstones, database_bytes, free_bytes, released_bytes }
    pb::CompactionEvent {
        compaction_id, branch, kind, reason: enum pb::CompactionReason, base_head_id, tokens_before,
        tokens_after, summary_id, message, created_at_unix_ms,
    }
    pb::ListSummariesResponse { summaries: json, events: json }
    pb::ImportSessionResponse {
        session: json, nodes, functions, summaries, format: enum pb::ImportFormat, warnings,
    }
}

impl ToJson for pb::ContentPart {
    fn to_json(&self) -> Value {
        use pb::content_part::Part;
        match &self.part {
            Some(Part::Text(text)) => json!({ "text": text }),
            Some(Part::Media(media)) => json!({ "media": media.to_json() }),
            None => json!({}),
        }
    }
}

impl ToJson for pb::Media {
    fn to_json(&self) -> Value {
        use pb::media::Source;
        match &self.source {
            Some(Source::Data(data)) => {
                json!({ "mime_type": self.mime_type, "data": base64(data) })
            }
            Some(Source::Url(url)) => json!({ "mime_type": self.mime_type, "url": url }),
            None => json!({ "mime_type": self.mime_type }),
        }
    }
}

impl ToJson for pb::NodeInput {
    fn to_json(&self) -> Value {
        use pb::node_input::Kind;
        match &self.kind {
            Some(Kind::Message(m)) => json!({ "message": m.to_json(), "pinned": self.pinned }),
            Some(Kind::ToolResult(r)) => {
                json!({ "tool_result": r.to_json(), "pinned": self.pinned })
            }
            Some(Kind::FunctionCall(c)) => {
                json!({ "function_call": c.to_json(), "pinned": self.pinned })
            }
            Some(Kind::FunctionResult(r)) => {
                json!({ "function_result": r.to_json(), "pinned": self.pinned })
            }
            None => json!({ "pinned": self.pinned }),
        }
    }
}

/// One line of `ctxd watch --json`: the cursor, the branch and the event under its name.
impl ToJson for pb::WatchEvent {
    fn to_json(&self) -> Value {
        use pb::watch_event::Event;
        let (name, value) = match &self.event {
            Some(Event::Started(s)) => ("started", json!({ "branches": s.branches.to_json() })),
            Some(Event::Node(n)) => ("node", n.to_json()),
            Some(Event::HeadMoved(b)) => ("head_moved", b.to_json()),
            Some(Event::BranchCreated(b)) => ("branch_created", b.to_json()),
            Some(Event::BranchDeleted(b)) => ("branch_deleted", b.to_json()),
            Some(Event::Compaction(c)) => ("compaction", c.to_json()),
            Some(Event::Deleted(t)) => ("deleted", t.to_json()),
            None => ("unknown", Value::Null),
        };
        json!({ "cursor": self.cursor, "branch": self.branch, name: value })
    }
}

/// Standard base64 with padding, as the proto3 JSON mapping writes `bytes`.
fn base64(data: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_the_standard_alphabet() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
        assert_eq!(base64(&[0xff, 0xfe]), "//4=");
    }

    #[test]
    fn enums_print_by_name_and_unknown_values_as_numbers() {
        let message = pb::Message {
            role: pb::Role::User as i32,
            ..Default::default()
        };
        assert_eq!(message.to_json()["role"], "ROLE_USER");
        let odd = pb::Message {
            role: 99,
            ..Default::default()
        };
        assert_eq!(odd.to_json()["role"], 99);
    }

    #[test]
    fn a_summary_without_a_ledger_has_a_null_one_and_an_exit_code_may_be_null() {
        let record = pb::SummaryRecord {
            kind: pb::SummaryKind::Segment as i32,
            ..Default::default()
        };
        let json = record.to_json();
        assert_eq!(json["kind"], "SUMMARY_KIND_SEGMENT");
        assert_eq!(json["ledger"], Value::Null);
        assert_eq!(json["rolls_over_ids"], json!([]));
        let run = pb::CommandRun {
            command: "make".into(),
            exit_code: None,
            is_error: false,
        };
        assert_eq!(run.to_json()["exit_code"], Value::Null);
        let failed = pb::CommandRun {
            exit_code: Some(2),
            ..run
        };
        assert_eq!(failed.to_json()["exit_code"], 2);
    }
}
