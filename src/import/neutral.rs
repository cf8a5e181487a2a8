//! The neutral JSONL of the trace corpus: one message a line,
//! `{role, content, tool_calls[{id, name, arguments}], tool_call_id, is_error}`.

use serde_json::Value;

use super::{Builder, History, arguments, json_lines, string_field};
use crate::domain::{Error, Part, Role, ToolCall};

pub(super) fn parse(text: &str) -> Result<History, Error> {
    let mut b = Builder::default();
    let mut last = 0;
    for record in json_lines(text) {
        let (line, at, v) = record?;
        last = line;
        let role = string_field(&v, &at, "role")?;
        let content = match v.get("content") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(_) => return Err(Error::invalid(format!("{at}.content"), "must be a string")),
        };
        let parts = if content.is_empty() {
            Vec::new()
        } else {
            vec![Part::Text(content)]
        };
        match role {
            "tool" => {
                let call_id = string_field(&v, &at, "tool_call_id")?.to_owned();
                let is_error = v.get("is_error").and_then(Value::as_bool).unwrap_or(false);
                b.tool_result(None, call_id, parts, is_error, line);
            }
            "user" | "system" | "developer" | "assistant" => {
                let role = Role::from_str_opt(role).expect("matched above");
                let calls = tool_calls(&v, &at)?;
                if !calls.is_empty() && role != Role::Assistant {
                    return Err(Error::invalid(
                        format!("{at}.tool_calls"),
                        "only assistant messages carry tool calls",
                    ));
                }
                b.message(None, role, parts, calls, line);
            }
            other => {
                return Err(Error::invalid(
                    format!("{at}.role"),
                    format!(
                        "unknown role {other:?}; expected user, assistant, tool, system or developer"
                    ),
                ));
            }
        }
    }
    Ok(b.finish(last))
}

fn tool_calls(v: &Value, at: &str) -> Result<Vec<ToolCall>, Error> {
    let Some(calls) = v.get("tool_calls") else {
        return Ok(Vec::new());
    };
    let Some(calls) = calls.as_array() else {
        if calls.is_null() {
            return Ok(Vec::new());
        }
        return Err(Error::invalid(
            format!("{at}.tool_calls"),
            "must be an array",
        ));
    };
    calls
        .iter()
        .enumerate()
        .map(|(k, c)| {
            let at = format!("{at}.tool_calls[{k}]");
            Ok(ToolCall {
                call_id: string_field(c, &at, "id")?.to_owned(),
                name: string_field(c, &at, "name")?.to_owned(),
                arguments_json: arguments(c.get("arguments"), &format!("{at}.arguments"))?,
            })
        })
        .collect()
}
