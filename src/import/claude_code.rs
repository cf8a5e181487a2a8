//! Claude Code session files: `user`/`assistant` lines with `text`, `tool_use` and
//! `tool_result` blocks; sub-agent (sidechain) transcripts become functions under the call that
//! started them; a compact summary becomes a summary record, not a message.
//!
//! Sidechain lines may follow the main session in the same stream (a sub-agent file appended to
//! its session's file); they are linked to their call through the session's `agent_progress`
//! entries, or else by their prompt. Lines are taken in file order; `parentUuid` forks from
//! parallel tool calls need nothing more. Each message's content is read by the Anthropic
//! Messages codec (`provider::anthropic`), as the gateway reads it, so thinking blocks and any
//! block ctxd does not reduce are kept whole; local UI entries (progress, snapshots, system
//! lines) are never sent to a model and are left out.

use std::collections::HashMap;

use serde_json::Value;

use super::{Builder, History, json_lines, refused};
use crate::domain::{Error, NodeContent, Part, Role, ToolCall};
use crate::provider::anthropic;

/// One conversational line, parsed.
struct Entry {
    line: usize,
    role: Role,
    /// Assistant lines of one API message share this id.
    message_id: Option<String>,
    parts: Vec<Part>,
    calls: Vec<(ToolCall, Option<String>)>,
    /// (call id, parts, is_error)
    results: Vec<(String, Vec<Part>, bool)>,
    compact_summary: bool,
}

pub(super) fn parse(text: &str) -> Result<History, Error> {
    let mut main: Vec<Entry> = Vec::new();
    let mut sidechains: Vec<(String, Vec<Entry>)> = Vec::new();
    // agentId → the tool_use that started it, from the session's progress entries.
    let mut links: HashMap<String, String> = HashMap::new();
    let mut last = 0;
    for record in json_lines(text) {
        let (line, at, v) = record?;
        last = line;
        let kind = v
            .get("type")
            .and_then(Value::as_str)
            .ok_or_else(|| Error::invalid(format!("{at}.type"), "must be a string"))?;
        if kind == "progress" {
            let data = v.get("data");
            if let (Some(agent), Some(call)) = (
                data.and_then(|d| d.get("agentId")).and_then(Value::as_str),
                v.get("parentToolUseID").and_then(Value::as_str),
            ) {
                links
                    .entry(agent.to_owned())
                    .or_insert_with(|| call.to_owned());
            }
            continue;
        }
        if kind != "user" && kind != "assistant" {
            continue;
        }
        let entry = entry(&v, kind, line, &at)?;
        if v.get("isSidechain").and_then(Value::as_bool) == Some(true) {
            let agent = v
                .get("agentId")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            match sidechains.iter_mut().find(|(a, _)| *a == agent) {
                Some((_, entries)) => entries.push(entry),
                None => sidechains.push((agent, vec![entry])),
            }
        } else {
            main.push(entry);
        }
    }

    // Which sidechain each call starts: by progress link, else by an equal prompt.
    let mut started: HashMap<String, Vec<Entry>> = HashMap::new();
    let calls: Vec<(String, Option<String>)> = main
        .iter()
        .chain(sidechains.iter().flat_map(|(_, e)| e))
        .flat_map(|e| {
            e.calls
                .iter()
                .map(|(c, prompt)| (c.call_id.clone(), prompt.clone()))
        })
        .collect();
    let mut b = Builder::default();
    for (agent, entries) in sidechains {
        let prompt = entries.first().map(first_text);
        let call = links.get(&agent).cloned().or_else(|| {
            calls
                .iter()
                .find(|(_, p)| p.is_some() && p.as_deref() == prompt.as_deref())
                .map(|(id, _)| id.clone())
        });
        match call {
            Some(call) => {
                started.insert(call, entries);
            }
            None => b.warn(
                entries.first().map_or(0, |e| e.line),
                format!("sub-agent transcript {agent:?} is linked to no call; skipped"),
            ),
        }
    }
    convert(&mut b, None, main, &mut started);
    Ok(b.finish(last))
}

fn first_text(e: &Entry) -> String {
    Part::text_of(&e.parts)
}

/// Writes one chain's entries: assistant lines of one message are merged, their results follow
/// it, and a call that started a sub-agent opens a function holding the sub-agent's chain.
fn convert(
    b: &mut Builder,
    scope: Option<usize>,
    entries: Vec<Entry>,
    started: &mut HashMap<String, Vec<Entry>>,
) {
    let mut assistant: Option<Entry> = None;
    let mut results: Vec<(usize, String, Vec<Part>, bool)> = Vec::new();
    let flush = |b: &mut Builder,
                 assistant: &mut Option<Entry>,
                 results: &mut Vec<(usize, String, Vec<Part>, bool)>,
                 started: &mut HashMap<String, Vec<Entry>>| {
        if let Some(a) = assistant.take() {
            let calls: Vec<ToolCall> = a.calls.iter().map(|(c, _)| c.clone()).collect();
            b.message(scope, Role::Assistant, a.parts, calls, a.line);
            for (call, prompt) in a.calls {
                if let Some(sub) = started.remove(&call.call_id)
                    && let Some(op) =
                        b.open_function(scope, &call.call_id, prompt.unwrap_or_default(), a.line)
                {
                    convert(b, Some(op), sub, started);
                }
            }
        }
        for (line, call_id, parts, is_error) in results.drain(..) {
            b.tool_result(scope, call_id, parts, is_error, line);
        }
    };
    for e in entries {
        if e.role == Role::Assistant {
            let same = assistant
                .as_ref()
                .is_some_and(|a| a.message_id.is_some() && a.message_id == e.message_id);
            if same {
                if let Some(a) = assistant.as_mut() {
                    a.parts.extend(e.parts);
                    a.calls.extend(e.calls);
                }
            } else {
                flush(b, &mut assistant, &mut results, started);
                assistant = Some(e);
            }
            continue;
        }
        // A user line: its results belong to the open assistant message's group.
        results.extend(
            e.results
                .into_iter()
                .map(|(id, parts, err)| (e.line, id, parts, err)),
        );
        if e.parts.is_empty() {
            continue;
        }
        flush(b, &mut assistant, &mut results, started);
        if e.compact_summary {
            b.settle(scope, e.line);
            b.summary(Part::text_of(&e.parts), e.line);
        } else {
            b.message(scope, Role::User, e.parts, Vec::new(), e.line);
        }
    }
    flush(b, &mut assistant, &mut results, started);
}

fn entry(v: &Value, kind: &str, line: usize, at: &str) -> Result<Entry, Error> {
    let message = v
        .get("message")
        .filter(|m| m.is_object())
        .ok_or_else(|| Error::invalid(format!("{at}.message"), "must be an object"))?;
    let role = if kind == "assistant" {
        Role::Assistant
    } else {
        Role::User
    };
    let mut e = Entry {
        line,
        role,
        message_id: message.get("id").and_then(Value::as_str).map(str::to_owned),
        parts: Vec::new(),
        calls: Vec::new(),
        results: Vec::new(),
        compact_summary: v.get("isCompactSummary").and_then(Value::as_bool) == Some(true),
    };
    let at = format!("{at}.message.content");
    // Read as the gateway reads the same message when Claude Code sends it: a session imported
    // here and continued through the gateway matches node for node.
    let mut blocks = match message.get("content") {
        Some(Value::String(s)) if !s.is_empty() => {
            e.parts.push(Part::Text(s.clone()));
            return Ok(e);
        }
        Some(Value::String(_)) | None | Some(Value::Null) => return Ok(e),
        Some(Value::Array(blocks)) => blocks.clone(),
        Some(_) => return Err(Error::invalid(at, "must be a string or an array")),
    };
    for (k, block) in blocks.iter().enumerate() {
        if block.get("type").and_then(Value::as_str).is_none() {
            return Err(Error::invalid(
                format!("{at}[{k}].type"),
                "must be a string",
            ));
        }
    }
    if role == Role::Assistant {
        for (k, block) in blocks.iter().enumerate() {
            let one = anthropic::assistant(std::slice::from_ref(block))
                .map_err(|r| refused(&format!("{at}[{k}]"), r))?;
            let Some(NodeContent::Message {
                parts, tool_calls, ..
            }) = one
            else {
                continue;
            };
            e.parts.extend(parts);
            // A sub-agent's transcript is linked to its call by the prompt it was started with.
            let prompt = block
                .get("input")
                .and_then(|i| i.get("prompt"))
                .and_then(Value::as_str)
                .map(str::to_owned);
            e.calls
                .extend(tool_calls.into_iter().map(|c| (c, prompt.clone())));
        }
    } else {
        let (results, parts) = anthropic::user_blocks(&mut blocks).map_err(|r| refused(&at, r))?;
        e.parts = parts;
        for result in results {
            if let NodeContent::ToolResult {
                call_id,
                parts,
                is_error,
                ..
            } = result
            {
                e.results.push((call_id, parts, is_error));
            }
        }
    }
    Ok(e)
}
