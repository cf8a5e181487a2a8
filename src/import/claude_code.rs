//! Claude Code session files as nodes: each line read by `provider::anthropic::session` (its
//! message content by the Anthropic Messages codec, as the gateway reads it, so thinking and any
//! block ctxd does not reduce are kept whole); sub-agent (sidechain) transcripts become
//! functions under the call that started them; a compact summary becomes a summary record, not
//! a message.
//!
//! Sidechain lines may follow the main session in the same stream (a sub-agent file appended to
//! its session's file); they are linked to their call through the session's progress entries,
//! or else by their prompt. Lines are taken in file order; forks from parallel tool calls need
//! nothing more. Local UI entries (progress, snapshots, system lines) are never sent to a model
//! and are left out.

use std::collections::HashMap;

use super::{Builder, History, json_lines, refused};
use crate::domain::{Error, Part, Role, ToolCall};
use crate::provider::anthropic::session::{self, Line, Turn};

/// One conversational line, read, and where it stood.
struct Entry {
    line: usize,
    turn: Turn,
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
        let mut turn = match session::read(&v, &at).map_err(|m| refused(&m.at, m.refusal))? {
            Line::Turn(turn) => turn,
            Line::Progress(Some(link)) => {
                links.entry(link.agent).or_insert(link.call);
                continue;
            }
            Line::Progress(None) | Line::Other => continue,
        };
        let agent = turn.sidechain.take();
        let entry = Entry { line, turn };
        match agent {
            None => main.push(entry),
            Some(agent) => match sidechains.iter_mut().find(|(a, _)| *a == agent) {
                Some((_, entries)) => entries.push(entry),
                None => sidechains.push((agent, vec![entry])),
            },
        }
    }

    // Which sidechain each call starts: by progress link, else by an equal prompt.
    let mut started: HashMap<String, Vec<Entry>> = HashMap::new();
    let calls: Vec<(String, Option<String>)> = main
        .iter()
        .chain(sidechains.iter().flat_map(|(_, e)| e))
        .flat_map(|e| {
            e.turn
                .calls
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
    Part::text_of(&e.turn.parts)
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
            let calls: Vec<ToolCall> = a.turn.calls.iter().map(|(c, _)| c.clone()).collect();
            b.message(scope, Role::Assistant, a.turn.parts, calls, a.line);
            for (call, prompt) in a.turn.calls {
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
        if e.turn.role == Role::Assistant {
            let same = assistant.as_ref().is_some_and(|a| {
                a.turn.message_id.is_some() && a.turn.message_id == e.turn.message_id
            });
            if same {
                if let Some(a) = assistant.as_mut() {
                    a.turn.parts.extend(e.turn.parts);
                    a.turn.calls.extend(e.turn.calls);
                }
            } else {
                flush(b, &mut assistant, &mut results, started);
                assistant = Some(e);
            }
            continue;
        }
        // A user line: its results belong to the open assistant message's group.
        let (line, turn) = (e.line, e.turn);
        results.extend(
            turn.results
                .into_iter()
                .map(|(id, parts, err)| (line, id, parts, err)),
        );
        if turn.parts.is_empty() {
            continue;
        }
        flush(b, &mut assistant, &mut results, started);
        if turn.compact_summary {
            b.settle(scope, line);
            b.summary(Part::text_of(&turn.parts), line);
        } else {
            b.message(scope, Role::User, turn.parts, Vec::new(), line);
        }
    }
    flush(b, &mut assistant, &mut results, started);
}
