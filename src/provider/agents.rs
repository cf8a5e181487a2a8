//! An agent's own compaction as the gateway sees it: the request that asks the model for a
//! summary of the conversation (Claude Code's compaction prompt, `/compact` or automatic;
//! Codex's `compaction_trigger` item), and the conversation that follows it, which opens with
//! that summary in place of the history it replaced. The summary request is forwarded with
//! nothing reduced (the summary must see what the agent sent), and the continuation is recorded
//! on the same branch with the agent's summary laid over the history it covers, as `ctxd import`
//! does with a Claude Code file's `isCompactSummary` entry.

use crate::domain::{NodeContent, Part, Role, Summary, ToolCall};
use crate::provider::conversation::Conversation;

/// Claude Code's compaction prompt begins so (2.1.x).
const CLAUDE_CODE_PROMPT: &str =
    "Your task is to create a detailed summary of the conversation so far";

/// The first message of the conversation Claude Code continues after a compaction.
const CLAUDE_CODE_CONTINUED: &str =
    "This session is being continued from a previous conversation that ran out of context.";

/// The model name of Claude Code's own summaries (`domain::summary::AGENT_MODEL_PREFIX`).
pub const CLAUDE_CODE_MODEL: &str = "agent:claude-code";

/// The model name of the overlay laid under Codex's compacted window: the window's own
/// `compaction` item carries the summary (`domain::summary::AGENT_WINDOW_MODEL_PREFIX`).
pub const CODEX_MODEL: &str = "agent:window:codex";

/// The text of that overlay, for audit: what the provider read instead is the compaction item.
pub const CODEX_TEXT: &str =
    "Codex compacted the conversation before this point; its compaction item follows.";

/// Whether `conv` asks the model for a summary of the conversation: its newest user message
/// holds Claude Code's compaction prompt, or an item is Codex's `compaction_trigger`.
pub fn is_summary_request(conv: &Conversation) -> bool {
    let last_user = conv
        .items
        .iter()
        .rev()
        .find_map(|item| match &item.content {
            NodeContent::Message {
                role: Role::User,
                parts,
                ..
            } => Some(parts),
            _ => None,
        });
    let asks = last_user.is_some_and(|parts| {
        parts
            .iter()
            .any(|p| matches!(p, Part::Text(t) if t.contains(CLAUDE_CODE_PROMPT)))
    });
    asks || conv
        .items
        .iter()
        .any(|item| has_compaction_trigger(&item.content))
}

fn has_compaction_trigger(content: &NodeContent) -> bool {
    let parts = match content {
        NodeContent::Message { parts, .. } | NodeContent::ToolResult { parts, .. } => parts,
        _ => return false,
    };
    parts.iter().any(|p| match p {
        Part::Block(block) => block.json.contains("\"compaction_trigger\""),
        _ => false,
    })
}

/// The agent's summary when `conv` continues a compacted conversation: the leading messages of
/// its first turn up to and including the one holding Claude Code's continuation, and their
/// text, which is the summary. Claude Code may put the files it read again before the summary
/// (`Called the Read tool …`, `Result of calling the Read tool …`), in the same message or in
/// messages of their own: wherever the summary sits in the first turn, the turn up to it is
/// what the summary stands for. The count of those messages, and the text.
pub fn continued_summary(conv: &Conversation) -> Option<(usize, String)> {
    let mut texts = Vec::new();
    for (i, item) in conv.items.iter().enumerate() {
        let NodeContent::Message {
            role: Role::User | Role::System,
            parts,
            tool_calls,
        } = &item.content
        else {
            return None;
        };
        if !tool_calls.is_empty() {
            return None;
        }
        texts.push(Part::text_of(parts));
        let continues = parts.iter().any(
            |p| matches!(p, Part::Text(t) if t.trim_start().starts_with(CLAUDE_CODE_CONTINUED)),
        );
        if continues {
            return Some((i + 1, texts.join("\n")));
        }
    }
    None
}

/// Whether the stored `nodes` (a path, oldest first) end on the answer to a summary request:
/// an assistant message after a user message holding the compaction prompt.
pub fn ends_on_summary_answer(nodes: &[std::sync::Arc<crate::domain::Node>]) -> bool {
    let top: Vec<&NodeContent> = nodes
        .iter()
        .filter(|n| n.function_id.is_none())
        .map(|n| &n.content)
        .collect();
    match top.as_slice() {
        [
            ..,
            NodeContent::Message {
                role: Role::User,
                parts,
                ..
            },
            NodeContent::Message {
                role: Role::Assistant,
                ..
            },
        ] => parts
            .iter()
            .any(|p| matches!(p, Part::Text(t) if t.contains(CLAUDE_CODE_PROMPT))),
        _ => false,
    }
}

/// Whether `summary` is the agent's own summary of this `text`.
pub fn is_agent_summary_of(summary: &Summary, text: &str) -> bool {
    summary.by_agent() && summary.text == text
}

/// The type of a Responses item kept whole as an assistant node (Codex's `compaction` and
/// `compaction_trigger` stand alone so), if `content` is one.
fn item_type(content: &NodeContent) -> Option<String> {
    let NodeContent::Message {
        role: Role::Assistant,
        parts,
        tool_calls,
    } = content
    else {
        return None;
    };
    match (parts.as_slice(), tool_calls.is_empty()) {
        ([part], true) => {
            let value =
                crate::provider::format::opaque(part, crate::domain::WireFormat::Responses)?;
            value.get("type")?.as_str().map(str::to_owned)
        }
        _ => None,
    }
}

/// Whether `content` is Codex's `compaction` item (the summary it sends back in its window).
pub fn is_codex_compaction(content: &NodeContent) -> bool {
    item_type(content).as_deref() == Some("compaction")
}

/// Whether `content` is Codex's `compaction_trigger` item.
pub fn is_codex_trigger(content: &NodeContent) -> bool {
    item_type(content).as_deref() == Some("compaction_trigger")
}

/// The tools agents start a sub-agent with (Claude Code's, old and new): a conversation that
/// opens with the prompt of a pending call of one is that call's function.
pub const AGENT_TOOLS: [&str; 2] = ["Task", "Agent"];

/// A Claude Code sub-agent call: its prompt, and whether the sub-agent runs in the background
/// (`Agent` does unless its call says `run_in_background: false`: its call is answered
/// "launched" at once and the result comes later as a notification; the older `Task` never
/// does). `None` for any other call, or one without a prompt.
pub fn agent_call(call: &ToolCall) -> Option<(String, bool)> {
    if !AGENT_TOOLS.contains(&call.name.as_str()) {
        return None;
    }
    let arguments = serde_json::from_str::<serde_json::Value>(&call.arguments_json).ok()?;
    let prompt = arguments.get("prompt")?.as_str()?.to_owned();
    let background = call.name == "Agent"
        && arguments
            .get("run_in_background")
            .and_then(serde_json::Value::as_bool)
            != Some(false);
    Some((prompt, background))
}
