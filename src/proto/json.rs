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

impl ToJson for pb::Session {
    fn to_json(&self) -> Value {
        json!({
            "session_id": self.session_id,
            "created_at_unix_ms": self.created_at_unix_ms,
            "metadata": self.metadata,
            "compaction_count": self.compaction_count,
            "branches": self.branches.to_json(),
            "node_count": self.node_count,
            "gateway": self.gateway.as_ref().map(ToJson::to_json),
        })
    }
}

impl ToJson for pb::GatewayUsage {
    fn to_json(&self) -> Value {
        json!({
            "calls": self.calls,
            "client_tokens": self.client_tokens,
            "forwarded_tokens": self.forwarded_tokens,
            "input_tokens": self.input_tokens,
            "cache_read_tokens": self.cache_read_tokens,
            "cache_write_tokens": self.cache_write_tokens,
            "output_tokens": self.output_tokens,
        })
    }
}

impl ToJson for pb::GatewayCall {
    fn to_json(&self) -> Value {
        json!({
            "at_unix_ms": self.at_unix_ms,
            "api": self.api,
            "model": self.model,
            "client_tokens": self.client_tokens,
            "forwarded_tokens": self.forwarded_tokens,
            "input_tokens": self.input_tokens,
            "cache_read_tokens": self.cache_read_tokens,
            "cache_write_tokens": self.cache_write_tokens,
            "output_tokens": self.output_tokens,
            "kept_tokens": self.kept_tokens,
            "change": self.change,
            "unexplained_miss": self.unexplained_miss,
        })
    }
}

impl ToJson for pb::ListGatewayCallsResponse {
    fn to_json(&self) -> Value {
        json!({
            "calls": self.calls.to_json(),
            "next_page_token": self.next_page_token,
        })
    }
}

impl ToJson for pb::Branch {
    fn to_json(&self) -> Value {
        json!({
            "name": self.name,
            "head_id": self.head_id,
            "head_hash": self.head_hash,
            "updated_at_unix_ms": self.updated_at_unix_ms,
        })
    }
}

impl ToJson for pb::ListSessionsResponse {
    fn to_json(&self) -> Value {
        json!({
            "sessions": self.sessions.to_json(),
            "next_page_token": self.next_page_token,
        })
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

impl ToJson for pb::ToolCall {
    fn to_json(&self) -> Value {
        json!({
            "call_id": self.call_id,
            "name": self.name,
            "arguments_json": self.arguments_json,
        })
    }
}

impl ToJson for pb::Message {
    fn to_json(&self) -> Value {
        json!({
            "role": enum_json!(pb::Role, self.role),
            "parts": self.parts.to_json(),
            "tool_calls": self.tool_calls.to_json(),
        })
    }
}

impl ToJson for pb::ToolResult {
    fn to_json(&self) -> Value {
        json!({
            "call_id": self.call_id,
            "name": self.name,
            "parts": self.parts.to_json(),
            "is_error": self.is_error,
        })
    }
}

impl ToJson for pb::FunctionCall {
    fn to_json(&self) -> Value {
        json!({
            "call_id": self.call_id,
            "name": self.name,
            "input": self.input,
            "expose": enum_json!(pb::Expose, self.expose),
        })
    }
}

impl ToJson for pb::FunctionResult {
    fn to_json(&self) -> Value {
        json!({
            "call_id": self.call_id,
            "output": self.output,
            "status": enum_json!(pb::FunctionStatus, self.status),
            "function_id": self.function_id,
            "chain_head_id": self.chain_head_id,
        })
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

impl ToJson for pb::Node {
    fn to_json(&self) -> Value {
        json!({
            "node_id": self.node_id,
            "parent_id": self.parent_id,
            "kind": enum_json!(pb::NodeKind, self.kind),
            "content": self.content.to_json(),
            "created_at_unix_ms": self.created_at_unix_ms,
            "hash": self.hash,
            "function_id": self.function_id,
            "pinned": self.pinned,
        })
    }
}

impl ToJson for pb::LogResponse {
    fn to_json(&self) -> Value {
        json!({
            "nodes": self.nodes.to_json(),
            "next_page_token": self.next_page_token,
        })
    }
}

impl ToJson for pb::GetNodesResponse {
    fn to_json(&self) -> Value {
        json!({ "nodes": self.nodes.to_json() })
    }
}

impl ToJson for pb::RenderedMessage {
    fn to_json(&self) -> Value {
        json!({
            "role": enum_json!(pb::Role, self.role),
            "parts": self.parts.to_json(),
            "tool_calls": self.tool_calls.to_json(),
            "tool_call_id": self.tool_call_id,
            "name": self.name,
            "is_error": self.is_error,
            "node_ids": self.node_ids,
            "function_id": self.function_id,
            "tokens": self.tokens,
            "truncated": self.truncated,
            "cleared": self.cleared,
            "inputs_stubbed": self.inputs_stubbed,
            "pinned": self.pinned,
        })
    }
}

impl ToJson for pb::RenderResponse {
    fn to_json(&self) -> Value {
        json!({
            "messages": self.messages.to_json(),
            "head_id": self.head_id,
            "head_hash": self.head_hash,
            "total_tokens": self.total_tokens,
            "tokenizer": self.tokenizer,
            "report": self.report.to_json(),
            "messages_json": self.messages_json,
        })
    }
}

impl ToJson for pb::Budget {
    fn to_json(&self) -> Value {
        json!({
            "context_window": self.context_window,
            "output_reserve": self.output_reserve,
            "system_tokens": self.system_tokens,
            "tools_tokens": self.tools_tokens,
            "schema_tokens": self.schema_tokens,
        })
    }
}

impl ToJson for pb::TokenBreakdown {
    fn to_json(&self) -> Value {
        json!({
            "system": self.system,
            "user": self.user,
            "assistant_text": self.assistant_text,
            "tool_calls": self.tool_calls,
            "tool_results": self.tool_results,
            "summaries": self.summaries,
            "markers": self.markers,
        })
    }
}

impl ToJson for pb::ContextReport {
    fn to_json(&self) -> Value {
        json!({
            "total_tokens": self.total_tokens,
            "tokens": self.tokens.to_json(),
            "messages": self.messages,
            "tokenizer": self.tokenizer,
            "budget": self.budget.to_json(),
            "history_budget": self.history_budget,
            "fits": self.fits,
            "over_by": self.over_by,
            "summary_needed": self.summary_needed,
            "results_truncated": self.results_truncated,
            "truncated_node_ids": self.truncated_node_ids,
            "results_cleared": self.results_cleared,
            "cleared_node_ids": self.cleared_node_ids,
            "turns_snipped": self.turns_snipped,
            "snipped_node_ids": self.snipped_node_ids,
            "microcompact_trigger": self.microcompact_trigger,
            "microcompact_boundary": self.microcompact_boundary,
            "stable_prefix_messages": self.stable_prefix_messages,
            "inputs_stubbed": self.inputs_stubbed,
            "stubbed_node_ids": self.stubbed_node_ids,
            "saved_truncation": self.saved_truncation.to_json(),
            "saved_clearing": self.saved_clearing.to_json(),
            "saved_stubbing": self.saved_stubbing.to_json(),
            "texts_cut": self.texts_cut,
            "text_cut_node_ids": self.text_cut_node_ids,
            "saved_text_cut": self.saved_text_cut.to_json(),
            "pinned_tokens": self.pinned_tokens,
            "pinned_node_ids": self.pinned_node_ids,
            "pins_exceed_budget": self.pins_exceed_budget,
            "summary_ids": self.summary_ids,
        })
    }
}

impl ToJson for pb::StepSavings {
    fn to_json(&self) -> Value {
        json!({
            "items": self.items,
            "chars": self.chars,
            "tokens": self.tokens,
        })
    }
}

impl ToJson for pb::CompactionOutcome {
    fn to_json(&self) -> Value {
        json!({
            "applied": self.applied,
            "summary_id": self.summary_id,
            "tokens_before": self.tokens_before,
            "tokens_after": self.tokens_after,
            "reason": enum_json!(pb::CompactionReason, self.reason),
            "message": self.message,
            "compaction_id": self.compaction_id,
        })
    }
}

impl ToJson for pb::SummaryRecord {
    fn to_json(&self) -> Value {
        json!({
            "summary_id": self.summary_id,
            "compaction_id": self.compaction_id,
            "covers_ids": self.covers_ids,
            "prior_summary_id": self.prior_summary_id,
            "text": self.text,
            "model": self.model,
            "base_head_id": self.base_head_id,
            "tokens_before": self.tokens_before,
            "tokens_after": self.tokens_after,
            "created_at_unix_ms": self.created_at_unix_ms,
            "applies": self.applies,
            "active": self.active,
            "kind": enum_json!(pb::SummaryKind, self.kind),
            "from_node_id": self.from_node_id,
            "to_node_id": self.to_node_id,
            "rolls_over_ids": self.rolls_over_ids,
            "ledger": self.ledger.to_json(),
        })
    }
}

impl ToJson for pb::PrepareCompactionResponse {
    fn to_json(&self) -> Value {
        json!({
            "needed": self.needed,
            "compaction_id": self.compaction_id,
            "base_head_id": self.base_head_id,
            "covers_ids": self.covers_ids,
            "prior_summary_id": self.prior_summary_id,
            "summary_input": self.summary_input.to_json(),
            "tokens_before": self.tokens_before,
            "input_tokens": self.input_tokens,
            "reason": self.reason,
            "history_budget": self.history_budget,
            "retained_turns": self.retained_turns,
            "summary_input_json": self.summary_input_json,
            "ledger": self.ledger.to_json(),
            "ledger_text": self.ledger_text,
            "rolls_over_ids": self.rolls_over_ids,
            "kind": enum_json!(pb::SummaryKind, self.kind),
        })
    }
}

impl ToJson for pb::EvidenceLedger {
    fn to_json(&self) -> Value {
        json!({
            "files_read": self.files_read.to_json(),
            "files_modified": self.files_modified.to_json(),
            "commands": self.commands.to_json(),
            "errors": self.errors.to_json(),
            "user_requests": self.user_requests,
            "functions": self.functions.to_json(),
        })
    }
}

impl ToJson for pb::FileUse {
    fn to_json(&self) -> Value {
        json!({
            "path": self.path,
            "tools": self.tools,
            "count": self.count,
        })
    }
}

impl ToJson for pb::CommandRun {
    fn to_json(&self) -> Value {
        // `exit_code` is null when the result stated none.
        json!({
            "command": self.command,
            "exit_code": self.exit_code,
            "is_error": self.is_error,
        })
    }
}

impl ToJson for pb::ErrorSeen {
    fn to_json(&self) -> Value {
        json!({
            "tool": self.tool,
            "line": self.line,
        })
    }
}

impl ToJson for pb::FunctionUse {
    fn to_json(&self) -> Value {
        json!({
            "name": self.name,
            "input": self.input,
            "output": self.output,
            "is_error": self.is_error,
        })
    }
}

impl ToJson for pb::PinResponse {
    fn to_json(&self) -> Value {
        json!({ "pinned_ids": self.pinned_ids })
    }
}

impl ToJson for pb::RecallResponse {
    fn to_json(&self) -> Value {
        json!({
            "node_id": self.node_id,
            "kind": self.kind,
            "content": self.content,
            "total_chars": self.total_chars,
            "truncated": self.truncated,
            "tool_call_id": self.tool_call_id,
            "tool_name": self.tool_name,
        })
    }
}

impl ToJson for pb::Tombstone {
    fn to_json(&self) -> Value {
        json!({
            "session_id": self.session_id,
            "deleted_by": self.deleted_by,
            "deleted_at_unix_ms": self.deleted_at_unix_ms,
            "nodes": self.nodes,
            "branches": self.branches,
            "summaries": self.summaries,
        })
    }
}

impl ToJson for pb::DeleteSessionResponse {
    fn to_json(&self) -> Value {
        json!({
            "tombstone": self.tombstone.to_json(),
            "already_deleted": self.already_deleted,
        })
    }
}

impl ToJson for pb::BackupDatabaseResponse {
    fn to_json(&self) -> Value {
        json!({ "path": self.path, "bytes": self.bytes, "took_ms": self.took_ms })
    }
}

impl ToJson for pb::CollectGarbageResponse {
    fn to_json(&self) -> Value {
        json!({
            "sessions": self.sessions,
            "tombstones": self.tombstones,
            "database_bytes": self.database_bytes,
            "free_bytes": self.free_bytes,
            "released_bytes": self.released_bytes,
        })
    }
}

impl ToJson for pb::CompactionEvent {
    fn to_json(&self) -> Value {
        json!({
            "compaction_id": self.compaction_id,
            "branch": self.branch,
            "kind": self.kind,
            "reason": enum_json!(pb::CompactionReason, self.reason),
            "base_head_id": self.base_head_id,
            "tokens_before": self.tokens_before,
            "tokens_after": self.tokens_after,
            "summary_id": self.summary_id,
            "message": self.message,
            "created_at_unix_ms": self.created_at_unix_ms,
        })
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

impl ToJson for pb::ListSummariesResponse {
    fn to_json(&self) -> Value {
        json!({
            "summaries": self.summaries.to_json(),
            "events": self.events.to_json(),
        })
    }
}

impl ToJson for pb::ImportSessionResponse {
    fn to_json(&self) -> Value {
        json!({
            "session": self.session.to_json(),
            "nodes": self.nodes,
            "functions": self.functions,
            "summaries": self.summaries,
            "format": enum_json!(pb::ImportFormat, self.format),
            "warnings": self.warnings,
        })
    }
}

/// Standard base64 with padding, as the proto3 JSON mapping writes `bytes`.
fn base64(data: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = u32::from(b[0]) << 16 | u32::from(b[1]) << 8 | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i)) as usize & 63]));
            } else {
                out.push('=');
            }
        }
    }
    out
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
