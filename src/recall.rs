//! The way back from a placeholder: the recall tool's name, description and limits (each
//! format's codec declares it: `provider::codec::recall_tool`), and a node's original content
//! as `Recall` returns it.
//!
//! Every cleared result, cut text and stubbed argument a render writes names its node by a short
//! reference (`recall 3f9a2c1b7d04`, [`crate::domain::Hash::reference`]). A host that registers
//! this tool lets the model ask for it again; the answer is a new tool result, appended at the
//! tail, so the cached prefix is untouched.

use crate::domain::{Node, NodeContent, Part};

/// The tool's name.
pub const TOOL_NAME: &str = "recall";

/// What the model is told the tool does.
pub const TOOL_DESCRIPTION: &str = "Returns the original content of a tool result, tool call or \
message that was cleared or shortened to save context. Pass the reference its placeholder names \
(the 12 characters after `recall`).";

/// Characters returned when the request does not say, and the most it may ask for.
pub const DEFAULT_MAX_CHARS: usize = 20_000;
pub const MAX_CHARS: usize = 200_000;

/// A node's original content, as a recall returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recalled {
    pub kind: &'static str,
    /// At most the asked characters of the content.
    pub content: String,
    pub total_chars: usize,
    pub truncated: bool,
    pub tool_call_id: String,
    pub tool_name: String,
}

/// What `node` holds, its head of `max_chars` characters when longer: a result's output exactly,
/// a message's text followed by each of its calls (the arguments a stub elided).
pub fn recalled(node: &Node, max_chars: usize) -> Recalled {
    let (kind, content, tool_call_id, tool_name) = match &node.content {
        NodeContent::ToolResult {
            call_id,
            name,
            parts,
            ..
        } => (
            "tool_result",
            Part::text_of(parts),
            call_id.clone(),
            name.clone(),
        ),
        NodeContent::FunctionResult(result) => (
            "function_result",
            result.output.clone(),
            result.call_id.clone(),
            String::new(),
        ),
        NodeContent::FunctionCall {
            call_id,
            name,
            input,
            ..
        } => (
            "function_call",
            input.clone(),
            call_id.clone(),
            name.clone(),
        ),
        NodeContent::Message {
            parts, tool_calls, ..
        } => {
            let mut text = Part::text_of(parts);
            for call in tool_calls {
                if !text.is_empty() {
                    text.push('\n');
                }
                text.push_str(&format!(
                    "[tool call {} {}] {}",
                    call.name, call.call_id, call.arguments_json
                ));
            }
            ("message", text, String::new(), String::new())
        }
    };
    let total_chars = content.chars().count();
    let (content, truncated) = if total_chars > max_chars {
        (content.chars().take(max_chars).collect(), true)
    } else {
        (content, false)
    };
    Recalled {
        kind,
        content,
        total_chars,
        truncated,
        tool_call_id,
        tool_name,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::ToolCall;

    use crate::domain::loose_node as node;

    #[test]
    fn a_result_comes_back_exactly_and_a_long_one_as_its_head() {
        let text = "é".repeat(30);
        let result = node(NodeContent::ToolResult {
            call_id: "c1".into(),
            name: "Read".into(),
            parts: vec![Part::Text(text.clone())],
            is_error: false,
        });
        let whole = recalled(&result, 100);
        assert_eq!(
            (whole.content.as_str(), whole.truncated),
            (text.as_str(), false)
        );
        assert_eq!(
            (whole.tool_call_id.as_str(), whole.tool_name.as_str()),
            ("c1", "Read")
        );
        let head = recalled(&result, 10);
        assert_eq!(head.content, "é".repeat(10));
        assert_eq!((head.total_chars, head.truncated), (30, true));
    }

    #[test]
    fn a_message_shows_its_calls_after_its_text() {
        let message = node(NodeContent::Message {
            role: crate::domain::Role::Assistant,
            parts: vec![Part::Text("Writing it.".into())],
            tool_calls: vec![ToolCall {
                call_id: "c2".into(),
                name: "Write".into(),
                arguments_json: r#"{"file_path":"a.rs","content":"fn main() {}"}"#.into(),
            }],
        });
        assert_eq!(
            recalled(&message, 1000).content,
            "Writing it.\n[tool call Write c2] {\"file_path\":\"a.rs\",\"content\":\"fn main() {}\"}"
        );
    }
}
