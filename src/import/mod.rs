//! Importers: session files (neutral JSONL, Claude Code JSONL, OpenAI messages, Gemini CLI
//! sessions, ctxd JSONL) parsed into a plan of nodes and summaries the store writes in one
//! transaction. Pure: no I/O.
//!
//! Malformed input is an error naming the line (or array index) and field. What is well formed
//! but breaks the pairing rules (a result for no pending call, a message while calls are
//! pending) is repaired and reported as a warning, so real transcripts import whole.

mod claude_code;
mod ctxd;
mod gemini;
mod neutral;
mod openai;

use std::collections::HashMap;

use crate::domain::{
    Error, Expose, FunctionResult, FunctionStatus, NodeContent, Part, Role, ToolCall,
};

/// The plan an import produces: a history the store writes in one go (kept in the domain, so
/// the store needs nothing of the importers).
pub use crate::domain::{History, Op};

/// The formats a session file may be in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    NeutralJsonl,
    ClaudeCodeJsonl,
    OpenAiMessages,
    /// ctxd's own export (`crate::export`): a whole session.
    CtxdJsonl,
    /// A Gemini CLI session (`~/.gemini/tmp/<project hash>/chats/session-*.jsonl` or `.json`).
    GeminiCliSession,
}

/// Guesses the format from the first non-blank character and line, each format's own module
/// telling its lines.
pub fn detect(data: &[u8]) -> Source {
    let text = String::from_utf8_lossy(&data[..data.len().min(64 * 1024)]);
    let trimmed = text.trim_start();
    if trimmed.starts_with('[') {
        return Source::OpenAiMessages;
    }
    let first = trimmed.lines().next().unwrap_or_default();
    match serde_json::from_str::<serde_json::Value>(first) {
        Ok(v) if crate::export::is_record(&v) => Source::CtxdJsonl,
        Ok(v) if crate::provider::gemini::is_session(Some(&v), &text) => Source::GeminiCliSession,
        Err(_) if crate::provider::gemini::is_session(None, trimmed) => Source::GeminiCliSession,
        Ok(v) if crate::provider::anthropic::session::is_line(&v) => Source::ClaudeCodeJsonl,
        _ => Source::NeutralJsonl,
    }
}

/// Parses a whole file into a plan.
pub fn parse(source: Source, data: &[u8]) -> Result<History, Error> {
    let text = std::str::from_utf8(data)
        .map_err(|e| Error::invalid("data", format!("not UTF-8 at byte {}", e.valid_up_to())))?;
    let plan = match source {
        Source::NeutralJsonl => neutral::parse(text)?,
        Source::ClaudeCodeJsonl => claude_code::parse(text)?,
        Source::OpenAiMessages => openai::parse(text)?,
        Source::CtxdJsonl => ctxd::parse(text)?,
        Source::GeminiCliSession => gemini::parse(text)?,
    };
    if plan.ops.is_empty() {
        return Err(Error::invalid("data", "holds no message"));
    }
    Ok(plan)
}

/// Where the importer stands in one chain: the calls of its latest assistant message.
#[derive(Default)]
struct Chain {
    /// Unanswered calls of the latest assistant message: id → name.
    open: Vec<(String, String)>,
    /// Calls answered by a running function: id → the op that opened it.
    running: HashMap<String, usize>,
}

/// Builds a plan chain by chain, repairing what the pairing rules would refuse.
#[derive(Default)]
struct Builder {
    plan: History,
    chains: HashMap<Option<usize>, Chain>,
}

const NO_RESULT: &str = "[no result was recorded for this call]";

impl Builder {
    fn push(&mut self, scope: Option<usize>, content: NodeContent, line: usize) -> usize {
        self.plan.ops.push(Op::Node {
            scope,
            content,
            line,
        });
        self.plan.ops.len() - 1
    }

    fn warn(&mut self, line: usize, what: String) {
        self.plan.warnings.push(format!("line {line}: {what}"));
    }

    /// Answers every open call of `scope` with an error result, and closes its running
    /// functions as errors, so a message may follow.
    fn settle(&mut self, scope: Option<usize>, line: usize) {
        let chain = self.chains.entry(scope).or_default();
        let open = std::mem::take(&mut chain.open);
        let running = std::mem::take(&mut chain.running);
        for (call_id, name) in open {
            self.warn(
                line,
                format!("call {call_id} had no result; closed as an error"),
            );
            self.push(
                scope,
                NodeContent::ToolResult {
                    call_id,
                    name,
                    parts: vec![Part::Text(NO_RESULT.to_owned())],
                    is_error: true,
                },
                line,
            );
        }
        let mut running: Vec<(String, usize)> = running.into_iter().collect();
        running.sort_by_key(|(_, op)| *op);
        for (call_id, op) in running {
            self.settle(Some(op), line);
            self.warn(
                line,
                format!("function for call {call_id} never returned; closed as an error"),
            );
            self.push(
                scope,
                NodeContent::FunctionResult(FunctionResult {
                    call_id,
                    output: NO_RESULT.to_owned(),
                    status: FunctionStatus::Error,
                    chain: None,
                }),
                line,
            );
        }
    }

    /// A codec's node at the top level: a message or a tool result (the codecs read no
    /// function calls or results).
    fn node(&mut self, content: NodeContent, line: usize) {
        match content {
            NodeContent::Message {
                role,
                parts,
                tool_calls,
            } => self.message(None, role, parts, tool_calls, line),
            NodeContent::ToolResult {
                call_id,
                parts,
                is_error,
                ..
            } => self.tool_result(None, call_id, parts, is_error, line),
            NodeContent::FunctionCall { .. } | NodeContent::FunctionResult(_) => {}
        }
    }

    fn message(
        &mut self,
        scope: Option<usize>,
        role: Role,
        parts: Vec<Part>,
        tool_calls: Vec<ToolCall>,
        line: usize,
    ) {
        if parts.is_empty() && tool_calls.is_empty() {
            self.warn(
                line,
                format!("an empty {} message was skipped", role.as_str()),
            );
            return;
        }
        self.settle(scope, line);
        let chain = self.chains.entry(scope).or_default();
        chain.open = tool_calls
            .iter()
            .map(|c| (c.call_id.clone(), c.name.clone()))
            .collect();
        self.push(
            scope,
            NodeContent::Message {
                role,
                parts,
                tool_calls,
            },
            line,
        );
    }

    /// Takes `call_id` off the open calls of `scope`; false (with a warning) if it is not open.
    fn answer(&mut self, scope: Option<usize>, call_id: &str, line: usize) -> Option<String> {
        let chain = self.chains.entry(scope).or_default();
        match chain.open.iter().position(|(id, _)| id == call_id) {
            Some(at) => Some(chain.open.remove(at).1),
            None => {
                self.warn(
                    line,
                    format!("a result for call {call_id}, which no pending call made, was dropped"),
                );
                None
            }
        }
    }

    fn tool_result(
        &mut self,
        scope: Option<usize>,
        call_id: String,
        parts: Vec<Part>,
        is_error: bool,
        line: usize,
    ) {
        if let Some(op) = self
            .chains
            .get(&scope)
            .and_then(|c| c.running.get(&call_id))
            .copied()
        {
            let output = Part::text_of(&parts);
            self.close_function(scope, &call_id, op, output, is_error, line);
            return;
        }
        let Some(name) = self.answer(scope, &call_id, line) else {
            return;
        };
        self.push(
            scope,
            NodeContent::ToolResult {
                call_id,
                name,
                parts,
                is_error,
            },
            line,
        );
    }

    /// Opens a function answering `call_id`; returns its op, the scope of its chain.
    fn open_function(
        &mut self,
        scope: Option<usize>,
        call_id: &str,
        input: String,
        line: usize,
    ) -> Option<usize> {
        let name = self.answer(scope, call_id, line)?;
        let op = self.push(
            scope,
            NodeContent::FunctionCall {
                call_id: call_id.to_owned(),
                name,
                input,
                expose: Expose::Io,
            },
            line,
        );
        self.chains
            .entry(scope)
            .or_default()
            .running
            .insert(call_id.to_owned(), op);
        Some(op)
    }

    fn close_function(
        &mut self,
        scope: Option<usize>,
        call_id: &str,
        op: usize,
        output: String,
        is_error: bool,
        line: usize,
    ) {
        self.settle(Some(op), line);
        if let Some(chain) = self.chains.get_mut(&scope) {
            chain.running.remove(call_id);
        }
        self.push(
            scope,
            NodeContent::FunctionResult(FunctionResult {
                call_id: call_id.to_owned(),
                output,
                status: if is_error {
                    FunctionStatus::Error
                } else {
                    FunctionStatus::Completed
                },
                chain: None,
            }),
            line,
        );
    }

    fn summary(&mut self, text: String, line: usize) {
        self.plan.ops.push(Op::Summary { text, line });
    }

    /// Closes functions left running at the end (a function must close with its chain answered);
    /// calls left open at the top-level tail stay pending, as the rules allow.
    fn finish(mut self, line: usize) -> History {
        let running: Vec<(Option<usize>, String, usize)> = self
            .chains
            .iter()
            .flat_map(|(scope, c)| c.running.iter().map(|(id, op)| (*scope, id.clone(), *op)))
            .collect();
        let mut running = running;
        running.sort_by_key(|(_, _, op)| std::cmp::Reverse(*op));
        for (scope, call_id, op) in running {
            self.warn(
                line,
                format!("function for call {call_id} never returned; closed as an error"),
            );
            self.close_function(scope, &call_id, op, NO_RESULT.to_owned(), true, line);
        }
        self.plan
    }
}

/// The JSON lines of `text`, blank ones skipped: each its line number, its name in errors
/// (`line N`) and its value, or an error naming the line that is not JSON.
fn json_lines(
    text: &str,
) -> impl Iterator<Item = Result<(usize, String, serde_json::Value), Error>> + '_ {
    text.lines()
        .enumerate()
        .filter(|(_, raw)| !raw.trim().is_empty())
        .map(|(i, raw)| {
            let at = format!("line {}", i + 1);
            serde_json::from_str(raw)
                .map(|v| (i + 1, at.clone(), v))
                .map_err(|e| Error::invalid(at, format!("not JSON: {e}")))
        })
}

/// A JSON value's field as a string, or an error naming where.
fn string_field<'a>(value: &'a serde_json::Value, at: &str, field: &str) -> Result<&'a str, Error> {
    value
        .get(field)
        .and_then(serde_json::Value::as_str)
        .ok_or_else(|| Error::invalid(format!("{at}.{field}"), "must be a string"))
}

/// What a provider codec refused in a file: `at` is where the codec read (empty: the document
/// itself), the field it names is below that.
fn refused(at: &str, refusal: crate::provider::conversation::Refusal) -> Error {
    use crate::provider::conversation::Refusal;
    let below = |field: &str| match (at, field) {
        ("", f) => f.to_owned(),
        (a, "") => a.to_owned(),
        (a, f) => format!("{a}.{f}"),
    };
    match refusal {
        Refusal::Invalid { field, message } => Error::invalid(below(&field), message),
        Refusal::Unrecordable(what) => Error::invalid(
            below("messages"),
            format!("holds a shape ctxd does not record: {what}"),
        ),
    }
}

/// Tool-call arguments as a JSON string: a string must already be JSON; anything else is
/// serialized.
fn arguments(value: Option<&serde_json::Value>, at: &str) -> Result<String, Error> {
    match value {
        None | Some(serde_json::Value::Null) => Ok("{}".to_owned()),
        Some(serde_json::Value::String(s)) => {
            if s.trim().is_empty() {
                return Ok("{}".to_owned());
            }
            serde_json::from_str::<serde::de::IgnoredAny>(s)
                .map_err(|e| Error::invalid(at, format!("not JSON: {e}")))?;
            Ok(s.clone())
        }
        Some(other) => Ok(other.to_string()),
    }
}

#[cfg(test)]
mod tests;
