//! One branch as an OpenAI chat-completions `messages` array (what `import::openai` reads).
//!
//! A function shows as its call and result only: the result is the `tool` message answering
//! the call, its chain is left out. Summaries are not applied (the raw history is exported).
//! The format has no place for other branches, summaries, pins, a tool result's error flag,
//! media in tool results, or a function's chain and `expose`; each one met is a warning.

use std::collections::HashSet;

use super::{Branch, Export};
use crate::domain::{NodeContent, Part, Snapshot};
use crate::provider::format::{session_call, session_message, tool_message};

pub(super) fn export<'a>(snapshot: &'a Snapshot, branch: Branch<'a>) -> Export<'a> {
    let mut warnings = branch.left_out(snapshot);
    let mut messages = Vec::new();
    let (mut errors, mut tool_media, mut url_media, mut chains) = (0, 0, 0, 0);
    // Calls of the latest assistant message not yet answered.
    let mut open: HashSet<&str> = HashSet::new();
    for node in &branch.path {
        let message = match &node.content {
            NodeContent::Message {
                role,
                parts,
                tool_calls,
            } => {
                url_media += super::url_media(parts);
                open = tool_calls.iter().map(|c| c.call_id.as_str()).collect();
                session_message(*role, parts, tool_calls)
            }
            NodeContent::ToolResult {
                call_id,
                parts,
                is_error,
                ..
            } => {
                errors += usize::from(*is_error);
                tool_media += parts
                    .iter()
                    .filter(|p| matches!(p, Part::Media { .. }))
                    .count();
                open.remove(call_id.as_str());
                tool_message(call_id, &Part::text_of(parts))
            }
            NodeContent::FunctionCall {
                call_id,
                name,
                input,
                ..
            } => {
                chains += usize::from(branch.chains.contains_key(&node.id));
                if open.remove(call_id.as_str()) {
                    continue;
                }
                // A function started by no call of the model gets one, so its result pairs.
                open.clear();
                session_call(call_id, name, input)
            }
            NodeContent::FunctionResult(result) => tool_message(&result.call_id, &result.output),
        };
        messages.push(message);
    }
    for (n, what) in [
        (
            errors,
            "tool results were errors; a `tool` message has no error flag",
        ),
        (
            tool_media,
            "media parts of tool results are left out (a `tool` message is text)",
        ),
        (
            url_media,
            "media parts by URL are written as `image_url` parts (their MIME type is lost)",
        ),
        (
            chains,
            "function chains are left out: a function shows as its call and result",
        ),
    ] {
        if n > 0 {
            warnings.push(format!("{n} {what}"));
        }
    }
    let last = messages.len();
    let pieces = std::iter::once("[\n".to_owned())
        .chain(messages.into_iter().enumerate().map(move |(i, m)| {
            let mut text = m.to_string();
            text.push_str(if i + 1 < last { ",\n" } else { "\n" });
            text
        }))
        .chain(std::iter::once("]\n".to_owned()));
    Export {
        warnings,
        pieces: Box::new(pieces),
    }
}
