//! Claude Code's session files (`~/.claude/projects/<project>/<session id>.jsonl`, and a
//! sub-agent's transcript): a line read into the turn `import` builds nodes from, and the lines
//! `export` writes, as Claude Code writes them.
//!
//! Each line is an object naming its entry in `type`. A `user` or `assistant` line holds one
//! Messages API `message`, its content read by this codec as the gateway reads the same message
//! when Claude Code sends it, so a session imported and continued through the gateway matches
//! node for node (thinking and any block ctxd does not reduce are kept whole). Assistant lines
//! of one API message share its `id`; lines chain by `uuid` and `parentUuid`. A sub-agent's lines
//! are marked `isSidechain` with its `agentId`, and a `progress` line links the agent
//! (`data.agentId`) to the `tool_use` that started it (`parentToolUseID`); a compaction's summary
//! is a user line marked `isCompactSummary`. Any other entry (snapshots, system lines) is local
//! to the UI and never sent to a model.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::{Value, json};

use super::{assistant, user_blocks};
use crate::domain::{MediaSource, NodeContent, Part, Role, ToolCall};
use crate::provider::conversation::Refusal;
use crate::provider::format::{anthropic_block, tool_result_message, tool_use_block};

/// Whether a file's first line (as JSON) is a session file's: it names its entry in `type` and
/// has no `role` of its own, as a neutral line does.
pub fn is_line(first: &Value) -> bool {
    first.get("type").is_some() && first.get("role").is_none()
}

/// One line of a session file, read.
pub enum Line {
    /// A user's or the assistant's message.
    Turn(Turn),
    /// A sub-agent's progress: which call started which agent (`None`: a line naming no pair).
    Progress(Option<Link>),
    /// An entry never sent to a model.
    Other,
}

/// A sub-agent and the call that started it.
pub struct Link {
    pub agent: String,
    pub call: String,
}

/// A `user` or `assistant` line, read.
pub struct Turn {
    pub role: Role,
    /// The API message's id: an assistant message written over several lines has one.
    pub message_id: Option<String>,
    /// On a sub-agent's sidechain: the agent (empty if the line names none).
    pub sidechain: Option<String>,
    /// The summary Claude Code wrote when it compacted the session, not a message.
    pub compact_summary: bool,
    pub parts: Vec<Part>,
    /// The calls, each with the prompt it gave: a sub-agent's transcript is linked to the call
    /// that started it by that prompt, where no progress line links them.
    pub calls: Vec<(ToolCall, Option<String>)>,
    /// The tool results: call id, parts, whether the call failed.
    pub results: Vec<(String, Vec<Part>, bool)>,
}

/// Why a line could not be read, and where: the refusal is of what stands at `at` (the content
/// or block the codec refused), or names its whole path itself (`at` empty).
pub struct Misread {
    pub at: String,
    pub refusal: Refusal,
}

impl From<Refusal> for Misread {
    fn from(refusal: Refusal) -> Self {
        Misread {
            at: String::new(),
            refusal,
        }
    }
}

/// Reads one line; `at` names it in errors (`line 3`).
pub fn read(line: &Value, at: &str) -> Result<Line, Misread> {
    let kind = line
        .get("type")
        .and_then(Value::as_str)
        .ok_or_else(|| Refusal::invalid(format!("{at}.type"), "must be a string"))?;
    let role = match kind {
        "progress" => {
            let agent = line
                .get("data")
                .and_then(|d| d.get("agentId"))
                .and_then(Value::as_str);
            let call = line.get("parentToolUseID").and_then(Value::as_str);
            return Ok(Line::Progress(agent.zip(call).map(|(agent, call)| Link {
                agent: agent.to_owned(),
                call: call.to_owned(),
            })));
        }
        "user" => Role::User,
        "assistant" => Role::Assistant,
        _ => return Ok(Line::Other),
    };
    let mut turn = turn(line, role, at)?;
    if line.get("isSidechain").and_then(Value::as_bool) == Some(true) {
        let agent = line.get("agentId").and_then(Value::as_str);
        turn.sidechain = Some(agent.unwrap_or_default().to_owned());
    }
    Ok(Line::Turn(turn))
}

fn turn(line: &Value, role: Role, at: &str) -> Result<Turn, Misread> {
    let message = line
        .get("message")
        .filter(|m| m.is_object())
        .ok_or_else(|| Refusal::invalid(format!("{at}.message"), "must be an object"))?;
    let mut turn = Turn {
        role,
        message_id: message.get("id").and_then(Value::as_str).map(str::to_owned),
        sidechain: None,
        compact_summary: line.get("isCompactSummary").and_then(Value::as_bool) == Some(true),
        parts: Vec::new(),
        calls: Vec::new(),
        results: Vec::new(),
    };
    let at = format!("{at}.message.content");
    let mut blocks = match message.get("content") {
        Some(Value::String(s)) if !s.is_empty() => {
            turn.parts.push(Part::Text(s.clone()));
            return Ok(turn);
        }
        Some(Value::String(_)) | None | Some(Value::Null) => return Ok(turn),
        Some(Value::Array(blocks)) => blocks.clone(),
        Some(_) => return Err(Refusal::invalid(at, "must be a string or an array").into()),
    };
    for (k, block) in blocks.iter().enumerate() {
        if block.get("type").and_then(Value::as_str).is_none() {
            let field = format!("{at}[{k}].type");
            return Err(Refusal::invalid(field, "must be a string").into());
        }
    }
    if role == Role::User {
        let (results, parts) = user_blocks(&mut blocks).map_err(|refusal| Misread {
            at: at.clone(),
            refusal,
        })?;
        turn.parts = parts;
        for result in results {
            if let NodeContent::ToolResult {
                call_id,
                parts,
                is_error,
                ..
            } = result
            {
                turn.results.push((call_id, parts, is_error));
            }
        }
        return Ok(turn);
    }
    // Block by block, so a refusal names the block.
    for (k, block) in blocks.iter().enumerate() {
        let one = assistant(std::slice::from_ref(block)).map_err(|refusal| Misread {
            at: format!("{at}[{k}]"),
            refusal,
        })?;
        let Some(NodeContent::Message {
            parts, tool_calls, ..
        }) = one
        else {
            continue;
        };
        turn.parts.extend(parts);
        let prompt = block
            .get("input")
            .and_then(|i| i.get("prompt"))
            .and_then(Value::as_str)
            .map(str::to_owned);
        turn.calls
            .extend(tool_calls.into_iter().map(|c| (c, prompt.clone())));
    }
    Ok(turn)
}

/// A part as a line's content block: a text, an image by its bytes, a kept Messages API block
/// as itself. `None` for what a line cannot hold: media by URL (an image block holds bytes), a
/// block kept from another API.
pub fn block(part: &Part) -> Option<Value> {
    match part {
        Part::Text(text) => Some(json!({ "type": "text", "text": text })),
        Part::Media {
            mime_type,
            source: MediaSource::Data(data),
        } => Some(json!({
            "type": "image",
            "source": {
                "type": "base64",
                "media_type": mime_type,
                "data": BASE64.encode(data),
            },
        })),
        Part::Media { .. } => None,
        Part::Block(_) => anthropic_block(part),
    }
}

/// A `user` or `assistant` line's message, to be written at its place.
pub struct Message {
    kind: &'static str,
    body: Value,
}

impl Message {
    /// A user's message of `content` blocks.
    pub fn user(content: Vec<Value>) -> Self {
        Message {
            kind: "user",
            body: json!({ "role": "user", "content": content }),
        }
    }

    /// An assistant's message: `content`, then its calls as `tool_use` blocks, under an API
    /// message id made from the line's `uuid`.
    pub fn assistant(uuid: &str, mut content: Vec<Value>, calls: &[ToolCall]) -> Self {
        content.extend(
            calls
                .iter()
                .map(|c| tool_use_block(&c.call_id, &c.name, &c.arguments_json)),
        );
        Message {
            kind: "assistant",
            body: json!({ "id": format!("msg_{uuid}"), "role": "assistant", "content": content }),
        }
    }

    /// The call that starts a sub-agent with `input` as its prompt: what a function no call of
    /// the model started is given, so its result pairs.
    pub fn agent_call(uuid: &str, call_id: &str, name: &str, input: &str) -> Self {
        let call = ToolCall {
            call_id: call_id.to_owned(),
            name: name.to_owned(),
            arguments_json: json!({ "prompt": input }).to_string(),
        };
        Self::assistant(uuid, Vec::new(), &[call])
    }

    /// A tool's result of `content` blocks, as the user message that carries it.
    pub fn tool_result(call_id: &str, content: Vec<Value>, is_error: bool) -> Self {
        Message {
            kind: "user",
            body: tool_result_message(call_id, Value::Array(content), is_error),
        }
    }

    /// A sub-agent's output, as the result of the call that started it.
    pub fn output(call_id: &str, output: &str, is_error: bool) -> Self {
        let content = json!([{ "type": "text", "text": output }]);
        Message {
            kind: "user",
            body: tool_result_message(call_id, content, is_error),
        }
    }

    /// The line: `uuid` after `parent` in its chain, on `agent`'s sidechain if it has one.
    pub fn line(
        self,
        session: &str,
        uuid: &str,
        parent: Option<String>,
        agent: Option<String>,
    ) -> Value {
        let mut line = json!({
            "type": self.kind,
            "uuid": uuid,
            "parentUuid": parent,
            "sessionId": session,
            "isSidechain": agent.is_some(),
            "message": self.body,
        });
        if let Some(agent) = agent {
            line["agentId"] = Value::String(agent);
        }
        line
    }
}

/// The progress line that links sub-agent `agent` to the call that started it.
pub fn progress(session: &str, call_id: &str, agent: &str) -> Value {
    json!({
        "type": "progress",
        "parentToolUseID": call_id,
        "data": { "type": "agent_progress", "agentId": agent },
        "sessionId": session,
    })
}
