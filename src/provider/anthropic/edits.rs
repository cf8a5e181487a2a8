//! Anthropic's server-side context editing as ctxd asks for it: a step said as the provider's
//! own `clear_tool_uses_20250919` edit, merged into the client's `context_management`, and what
//! the provider reports it did (`context_management.applied_edits`, `input_transformations`).
//!
//! On a model that binds its thinking to the prefix it was produced on, a step that changes the
//! messages invalidates every later thinking block; an edit the provider makes itself does not,
//! for the history the client sent is unchanged. So the client's messages go as sent and the
//! edit says which tool uses the provider clears: the oldest `clear` of them, as the newest
//! `keep` are kept.

use serde_json::value::RawValue;
use serde_json::{Map, Value, json};

use crate::domain::AskedEdit;

/// The beta that enables context editing.
pub const CONTEXT_MANAGEMENT_BETA: &str = "context-management-2025-06-27";

/// The request member that carries the edits.
pub const CONTEXT_MANAGEMENT: &str = "context_management";

/// The edit that clears tool uses.
const CLEAR_TOOL_USES: &str = "clear_tool_uses_20250919";

/// A step as the provider's edit, as the API reads it: clear the oldest `edit.clear` tool uses
/// of the request, keeping the newest `edit.keep`. It fires whenever the request holds more
/// tool uses than it clears, so the same `clear` clears the same tool uses on every call until
/// the next step, and the provider's cached prefix keeps hitting; it asks for no least saving,
/// for ctxd's step already paid for itself.
fn clear_tool_uses(edit: &AskedEdit) -> Value {
    json!({
        "type": CLEAR_TOOL_USES,
        "trigger": {"type": "tool_uses", "value": edit.clear},
        "keep": {"type": "tool_uses", "value": edit.keep},
        "clear_tool_inputs": false,
    })
}

/// Why an edit is not merged into a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotMerged {
    /// The client asks for its own tool-use clearing: its edit stands, ctxd adds none.
    ClientClears,
    /// The client's `context_management` is not an object with an `edits` array.
    Unreadable,
}

/// The request's `context_management` with `edit` added after the client's own edits (Anthropic
/// wants `clear_thinking_20251015` first, and the client's order is kept), every other member
/// of it as the client sent it.
pub fn merged(client: Option<&RawValue>, edit: &AskedEdit) -> Result<String, NotMerged> {
    let mut cm: Map<String, Value> = match client {
        None => Map::new(),
        Some(raw) => match serde_json::from_str::<Value>(raw.get()) {
            Ok(Value::Object(map)) => map,
            Ok(Value::Null) => Map::new(),
            _ => return Err(NotMerged::Unreadable),
        },
    };
    let edits = cm
        .entry("edits".to_owned())
        .or_insert_with(|| Value::Array(Vec::new()));
    let Value::Array(edits) = edits else {
        return Err(NotMerged::Unreadable);
    };
    if edits
        .iter()
        .any(|e| e.get("type").and_then(Value::as_str) == Some(CLEAR_TOOL_USES))
    {
        return Err(NotMerged::ClientClears);
    }
    edits.push(clear_tool_uses(edit));
    Ok(Value::Object(cm).to_string())
}

/// The edit that clears `cleared` in a conversation whose tool uses are `tool_uses` (their ids,
/// in order): the oldest tool uses all in `cleared` are what it clears (the provider clears
/// from the oldest, so a result ctxd keeps stops it), and the rest it keeps. `None` when it
/// would clear none.
pub fn clearing<'a>(
    tool_uses: impl IntoIterator<Item = &'a str>,
    cleared: &std::collections::HashSet<&str>,
) -> Option<AskedEdit> {
    let (mut clear, mut total) = (0u32, 0u32);
    let mut open = true;
    for id in tool_uses {
        total = total.saturating_add(1);
        open &= cleared.contains(id);
        if open {
            clear += 1;
        }
    }
    (clear > 0).then_some(AskedEdit {
        clear,
        keep: total - clear,
    })
}

/// A rendered document (`{system, messages}`) with `edit` as its `context_management`.
pub fn with_edit(document: &str, edit: &AskedEdit) -> Option<String> {
    let mut doc: Map<String, Value> = serde_json::from_str(document).ok()?;
    let cm = merged(None, edit).ok()?;
    doc.insert(
        CONTEXT_MANAGEMENT.to_owned(),
        serde_json::from_str(&cm).ok()?,
    );
    Some(Value::Object(doc).to_string())
}

/// Whether the client's own `context_management` clears tool uses.
pub fn client_clears(client: Option<&RawValue>) -> bool {
    client.is_some_and(|raw| {
        serde_json::from_str::<Value>(raw.get()).is_ok_and(|cm| {
            cm.get("edits").and_then(Value::as_array).is_some_and(|e| {
                e.iter()
                    .any(|e| e.get("type").and_then(Value::as_str) == Some(CLEAR_TOOL_USES))
            })
        })
    })
}

/// The `anthropic-beta` values a request needs beside `present` (its own, comma-separated in
/// any number of header lines) for context editing: none when it has the beta already.
pub fn beta_needed<'a>(present: impl IntoIterator<Item = &'a str>) -> Option<&'static str> {
    let has = present
        .into_iter()
        .flat_map(|v| v.split(','))
        .any(|b| b.trim() == CONTEXT_MANAGEMENT_BETA);
    (!has).then_some(CONTEXT_MANAGEMENT_BETA)
}

/// What the provider reports it cleared with `clear_tool_uses_20250919` in an answer's
/// `context_management` (the JSON body's, or a stream's `message_delta`'s): tool uses and
/// input tokens.
pub fn cleared(context_management: &Value) -> Option<(u32, u64)> {
    let applied = context_management.get("applied_edits")?.as_array()?;
    let mut out = (0u32, 0u64);
    for edit in applied {
        if edit.get("type").and_then(Value::as_str) != Some(CLEAR_TOOL_USES) {
            continue;
        }
        let n = |k: &str| edit.get(k).and_then(Value::as_u64).unwrap_or(0);
        out.0 = out
            .0
            .saturating_add(u32::try_from(n("cleared_tool_uses")).unwrap_or(u32::MAX));
        out.1 = out.1.saturating_add(n("cleared_input_tokens"));
    }
    Some(out)
}

/// The thinking blocks the provider says it dropped from the request (`input_transformations`
/// of `thinking_block_dropped`: a block no longer bound to its prefix).
pub fn thinking_dropped(transformations: &Value) -> u32 {
    transformations.as_array().map_or(0, |t| {
        let n = t
            .iter()
            .filter(|t| t.get("type").and_then(Value::as_str) == Some("thinking_block_dropped"))
            .count();
        u32::try_from(n).unwrap_or(u32::MAX)
    })
}

/// Whether a message (its JSON text) holds the model's reasoning.
pub fn holds_reasoning(message: &str) -> bool {
    (message.contains("\"thinking\"") || message.contains("\"redacted_thinking\""))
        && serde_json::from_str::<Value>(message).is_ok_and(|m| {
            m.get("content")
                .and_then(Value::as_array)
                .is_some_and(|blocks| blocks.iter().any(super::is_reasoning))
        })
}

/// A message (its JSON text) without its reasoning blocks, and how many it held; `None` when
/// it is not a message with blocks. A message of reasoning alone keeps a line saying so: the
/// API takes no empty message.
pub fn without_reasoning(message: &str) -> Option<(String, u32)> {
    let mut m: Value = serde_json::from_str(message).ok()?;
    let blocks = m.get_mut("content")?.as_array_mut()?;
    let before = blocks.len();
    blocks.retain(|b| !super::is_reasoning(b));
    let dropped = u32::try_from(before - blocks.len()).unwrap_or(u32::MAX);
    if blocks.is_empty() {
        blocks.push(json!({"type": "text", "text": "(reasoning left out)"}));
    }
    Some((m.to_string(), dropped))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(text: &str) -> Box<RawValue> {
        RawValue::from_string(text.to_owned()).expect("JSON")
    }

    fn edit() -> AskedEdit {
        AskedEdit { clear: 12, keep: 3 }
    }

    #[test]
    fn the_edit_goes_after_the_client_s_own() {
        let client =
            raw(r#"{"edits": [{"type": "clear_thinking_20251015", "keep": "all"}], "other": 1}"#);
        let out: Value = serde_json::from_str(&merged(Some(&client), &edit()).unwrap()).unwrap();
        assert_eq!(out["other"], 1);
        assert_eq!(out["edits"][0]["type"], "clear_thinking_20251015");
        assert_eq!(out["edits"][1]["type"], CLEAR_TOOL_USES);
        assert_eq!(out["edits"][1]["keep"]["value"], 3);
        assert_eq!(out["edits"][1]["trigger"]["value"], 12);
        let none: Value = serde_json::from_str(&merged(None, &edit()).unwrap()).unwrap();
        assert_eq!(none["edits"].as_array().map(Vec::len), Some(1));
        let own = raw(r#"{"edits": [{"type": "clear_tool_uses_20250919"}]}"#);
        assert_eq!(merged(Some(&own), &edit()), Err(NotMerged::ClientClears));
        assert!(client_clears(Some(&own)));
        assert_eq!(
            merged(Some(&raw("[1]")), &edit()),
            Err(NotMerged::Unreadable)
        );
    }

    #[test]
    fn the_edit_clears_the_oldest_run_ctxd_cleared() {
        let cleared: std::collections::HashSet<&str> = ["a", "b", "d"].into();
        let edit = clearing(["a", "b", "c", "d", "e"], &cleared).expect("an edit");
        assert_eq!((edit.clear, edit.keep), (2, 3), "c is kept, so d is too");
        assert_eq!(clearing(["c", "a"], &cleared), None);
        let doc = with_edit(r#"{"messages":[],"system":"s"}"#, &edit).expect("a document");
        let doc: Value = serde_json::from_str(&doc).expect("JSON");
        assert_eq!(doc["context_management"]["edits"][0]["keep"]["value"], 3);
        assert_eq!(doc["system"], "s");
    }

    #[test]
    fn reasoning_is_found_and_left_out() {
        let m = r#"{"role":"assistant","content":[{"type":"thinking","thinking":"","signature":"s"},{"type":"text","text":"hi"}]}"#;
        assert!(holds_reasoning(m));
        let (out, n) = without_reasoning(m).expect("a message");
        assert_eq!(n, 1);
        assert!(!holds_reasoning(&out));
        assert!(out.contains("\"hi\""));
        assert!(!holds_reasoning(
            r#"{"role":"user","content":"thinking about it"}"#
        ));
    }

    #[test]
    fn the_beta_is_added_once() {
        assert_eq!(beta_needed(["a, b"]), Some(CONTEXT_MANAGEMENT_BETA));
        assert_eq!(
            beta_needed(["a", " context-management-2025-06-27 ,b"]),
            None
        );
    }

    #[test]
    fn what_the_provider_cleared_is_read() {
        let cm = json!({"applied_edits": [
            {"type": "clear_thinking_20251015", "cleared_thinking_turns": 1, "cleared_input_tokens": 9},
            {"type": "clear_tool_uses_20250919", "cleared_tool_uses": 8, "cleared_input_tokens": 4000},
        ]});
        assert_eq!(cleared(&cm), Some((8, 4000)));
        assert_eq!(cleared(&json!({})), None);
        let t = json!([{"type": "thinking_block_dropped", "message_index": 3, "content_index": 0}]);
        assert_eq!(thinking_dropped(&t), 1);
    }
}
