//! Gemini CLI's session files (`~/.gemini/tmp/<project hash>/chats/session-*.jsonl`, or the
//! older `.json`) as the `contents` Gemini CLI sends when it resumes them, for `import` to read
//! with [`super::contents`] as the gateway reads that request.
//!
//! The JSONL file is a log: a metadata line (`sessionId`, `projectHash`...), message records
//! (`{id, type, content, toolCalls?, thoughts?...}`; a record with an id already seen replaces
//! it where it stood), `{"$set": {...}}` updates (one with `messages` replaces them all, as the
//! CLI writes the history it resumed with), and `{"$rewindTo": id}` (that message and all
//! after it are gone). The older file is one object with `messages`. Messages become
//! `contents` as the CLI's `convertSessionToClientHistory` makes them: `info`, `error` and
//! `warning` messages and slash commands are left out; a `gemini` message whose content holds
//! its parts (calls, thoughts) is those parts, an older one its thought summaries as thoughts,
//! its text and its `toolCalls` as calls, their `result`s the user content after it;
//! consecutive contents of one role are one content, as the CLI sends them.

use serde_json::{Map, Value, json};

use crate::provider::conversation::Refusal;

/// Whether a file is a Gemini CLI session: its first line (`first`, if it is JSON) is the
/// log's metadata, or it opens an older file's pretty-printed object (`head`: its start).
pub fn is_session(first: Option<&Value>, head: &str) -> bool {
    match first {
        Some(v) => v.get("sessionId").is_some() && v.get("projectHash").is_some(),
        None => {
            head.trim_start().lines().next().map(str::trim) == Some("{")
                && head.contains("\"projectHash\"")
        }
    }
}

/// A session file as the contents it resends.
#[derive(Debug, Default)]
pub struct Session {
    pub contents: Vec<Value>,
    /// For each content, the line of the first message in it (for the older file, the
    /// message's place in `messages`, from 1).
    pub lines: Vec<usize>,
    /// Messages left out that a model would have read, with their lines.
    pub skipped: Vec<(usize, String)>,
    /// The file's last line.
    pub last: usize,
}

/// One message of the session and the line it was read from.
struct Record {
    id: String,
    line: usize,
    message: Value,
}

/// Reads a session file; a malformed one is refused naming the line and field.
pub fn session(text: &str) -> Result<Session, Refusal> {
    let (records, last) = match serde_json::from_str::<Value>(text.trim_start()) {
        Ok(Value::Object(whole)) if whole.contains_key("messages") => legacy(&whole)?,
        _ => log(text)?,
    };
    let mut s = Session {
        last,
        ..Session::default()
    };
    for r in &records {
        for (role, parts) in turns(r, &mut s.skipped)? {
            match s.contents.last_mut() {
                Some(last) if last["role"] == role => {
                    if let Some(Value::Array(all)) = last.get_mut("parts") {
                        all.extend(parts);
                    }
                }
                _ => {
                    s.contents.push(json!({"role": role, "parts": parts}));
                    s.lines.push(r.line);
                }
            }
        }
    }
    Ok(s)
}

/// The messages of a session file in one object.
fn legacy(whole: &Map<String, Value>) -> Result<(Vec<Record>, usize), Refusal> {
    let Some(Value::Array(messages)) = whole.get("messages") else {
        return Err(Refusal::invalid("messages", "must be an array"));
    };
    let records = messages
        .iter()
        .enumerate()
        .map(|(i, m)| Record {
            id: String::new(),
            line: i + 1,
            message: m.clone(),
        })
        .collect();
    Ok((records, messages.len()))
}

/// The messages a JSONL session log ends with.
fn log(text: &str) -> Result<(Vec<Record>, usize), Refusal> {
    let mut records: Vec<Record> = Vec::new();
    let mut last = 0;
    for (i, raw) in text.lines().enumerate() {
        if raw.trim().is_empty() {
            continue;
        }
        let (line, at) = (i + 1, format!("line {}", i + 1));
        last = line;
        let v: Value = serde_json::from_str(raw)
            .map_err(|e| Refusal::invalid(at.clone(), format!("not JSON: {e}")))?;
        if let Some(id) = v.get("$rewindTo") {
            let id = id
                .as_str()
                .ok_or_else(|| Refusal::invalid(format!("{at}.$rewindTo"), "must be a string"))?;
            let from = records.iter().position(|r| r.id == id).unwrap_or(0);
            records.truncate(from);
        } else if let Some(set) = v.get("$set") {
            match set.get("messages") {
                Some(Value::Array(messages)) => {
                    records = messages
                        .iter()
                        .map(|m| Record {
                            id: m
                                .get("id")
                                .and_then(Value::as_str)
                                .unwrap_or_default()
                                .into(),
                            line,
                            message: m.clone(),
                        })
                        .collect();
                }
                Some(_) => {
                    return Err(Refusal::invalid(
                        format!("{at}.$set.messages"),
                        "must be an array",
                    ));
                }
                None => {}
            }
        } else if let Some(id) = v.get("id").and_then(Value::as_str) {
            let record = Record {
                id: id.to_owned(),
                line,
                message: v.clone(),
            };
            match records.iter_mut().find(|r| r.id == id) {
                Some(old) => *old = record,
                None => records.push(record),
            }
        } else if v.get("sessionId").is_none() {
            return Err(Refusal::invalid(
                at,
                "is no session metadata, message, $set or $rewindTo record",
            ));
        }
    }
    Ok((records, last))
}

/// `content` (a string, a part or a list of them) as parts.
fn part_list(content: Option<&Value>) -> Vec<Value> {
    let one = |p: &Value| match p {
        Value::String(s) => json!({ "text": s }),
        other => other.clone(),
    };
    match content {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) if s.is_empty() => Vec::new(),
        Some(Value::Array(parts)) => parts.iter().map(one).collect(),
        Some(other) => vec![one(other)],
    }
}

/// The contents (role and parts) one message makes.
fn turns(
    r: &Record,
    skipped: &mut Vec<(usize, String)>,
) -> Result<Vec<(&'static str, Vec<Value>)>, Refusal> {
    let at = format!("line {}", r.line);
    let message = &r.message;
    let kind = message
        .get("type")
        .and_then(Value::as_str)
        .ok_or_else(|| Refusal::invalid(format!("{at}.type"), "must be a string"))?;
    let content = message.get("content");
    match kind {
        "info" | "error" | "warning" => Ok(Vec::new()),
        "user" => {
            let parts = part_list(content);
            let text: String = parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect();
            let command = text.trim().starts_with('/') || text.trim().starts_with('?');
            if parts.is_empty() || command {
                return Ok(Vec::new());
            }
            Ok(vec![("user", parts)])
        }
        "gemini" => model_turns(message, &at),
        other => {
            skipped.push((
                r.line,
                format!("a {other:?} message is not sent to the model"),
            ));
            Ok(Vec::new())
        }
    }
}

/// A `gemini` message's model content and the user content its recorded results make.
fn model_turns(message: &Value, at: &str) -> Result<Vec<(&'static str, Vec<Value>)>, Refusal> {
    let parts = part_list(message.get("content"));
    let modern = parts
        .iter()
        .any(|p| p.get("functionCall").is_some() || p.get("thought") == Some(&json!(true)));
    let calls = match message.get("toolCalls") {
        None | Some(Value::Null) => &[][..],
        Some(Value::Array(calls)) => calls.as_slice(),
        Some(_) => {
            return Err(Refusal::invalid(
                format!("{at}.toolCalls"),
                "must be an array",
            ));
        }
    };
    let mut model = Vec::new();
    if !modern && let Some(Value::Array(thoughts)) = message.get("thoughts") {
        model.extend(thoughts.iter().map(thought));
    }
    model.extend(parts);
    if !modern {
        for (k, call) in calls.iter().enumerate() {
            let name = call.get("name").and_then(Value::as_str).ok_or_else(|| {
                Refusal::invalid(format!("{at}.toolCalls[{k}].name"), "must be a string")
            })?;
            let args = call.get("args").cloned().unwrap_or(json!({}));
            let mut function = json!({"name": name, "args": args});
            if let Some(id) = call.get("id").filter(|id| id.is_string()) {
                function["id"] = id.clone();
            }
            model.push(json!({ "functionCall": function }));
        }
    }
    if model.is_empty() {
        return Ok(Vec::new());
    }
    let mut out = vec![("model", model)];
    let results: Vec<Value> = calls.iter().flat_map(result_parts).collect();
    if !results.is_empty() {
        out.push(("user", results));
    }
    Ok(out)
}

/// A thought summary as the thought part the CLI resends for it.
fn thought(t: &Value) -> Value {
    let subject = t.get("subject").and_then(Value::as_str).unwrap_or_default();
    let description = t
        .get("description")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let text = if subject.is_empty() {
        description.to_owned()
    } else {
        format!("**{subject}** {description}")
    };
    json!({ "text": text, "thought": true })
}

/// The parts a recorded call's `result` makes: a string as its `output`, a list of parts as
/// they are, one part as itself.
fn result_parts(call: &Value) -> Vec<Value> {
    match call.get("result") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => {
            let mut response = json!({"name": call.get("name"), "response": {"output": s}});
            if let Some(id) = call.get("id").filter(|id| id.is_string()) {
                response["id"] = id.clone();
            }
            vec![json!({ "functionResponse": response })]
        }
        Some(parts @ Value::Array(_)) => part_list(Some(parts)),
        Some(part) => vec![part.clone()],
    }
}
