//! An OpenAI chat-completions `messages` array.

use base64::Engine as _;
use serde_json::Value;

use super::{Builder, History, arguments, string_field};
use crate::domain::{Error, MediaSource, Part, Role, ToolCall};

pub(super) fn parse(text: &str) -> Result<History, Error> {
    let v: Value = serde_json::from_str(text)
        .map_err(|e| Error::invalid(format!("line {}", e.line()), format!("not JSON: {e}")))?;
    let messages = match &v {
        Value::Array(messages) => messages,
        // A whole request body is fine too.
        Value::Object(body) => body
            .get("messages")
            .and_then(Value::as_array)
            .ok_or_else(|| Error::invalid("messages", "must be an array"))?,
        _ => return Err(Error::invalid("messages", "must be an array")),
    };
    let mut b = Builder::default();
    for (i, m) in messages.iter().enumerate() {
        let at = format!("messages[{i}]");
        let line = i + 1;
        let role = string_field(m, &at, "role")?;
        let parts = content(m.get("content"), &format!("{at}.content"))?;
        match role {
            "tool" => {
                let call_id = string_field(m, &at, "tool_call_id")?.to_owned();
                b.tool_result(None, call_id, parts, false, line);
            }
            "system" | "developer" | "user" | "assistant" => {
                let role = Role::from_str_opt(role).expect("matched above");
                let calls = tool_calls(m, &at)?;
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
                    format!("unknown role {other:?}"),
                ));
            }
        }
    }
    Ok(b.finish(messages.len()))
}

fn content(v: Option<&Value>, at: &str) -> Result<Vec<Part>, Error> {
    match v {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(s)) if s.is_empty() => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![Part::Text(s.clone())]),
        Some(Value::Array(parts)) => parts
            .iter()
            .enumerate()
            .map(|(k, p)| {
                let at = format!("{at}[{k}]");
                match string_field(p, &at, "type")? {
                    "text" => Ok(Part::Text(string_field(p, &at, "text")?.to_owned())),
                    "image_url" => {
                        let url = p
                            .get("image_url")
                            .and_then(|u| u.get("url"))
                            .and_then(Value::as_str)
                            .ok_or_else(|| {
                                Error::invalid(format!("{at}.image_url.url"), "must be a string")
                            })?;
                        Ok(media_from_url(url, &at)?)
                    }
                    other => Err(Error::invalid(
                        format!("{at}.type"),
                        format!("unsupported content part {other:?}"),
                    )),
                }
            })
            .collect(),
        Some(_) => Err(Error::invalid(at, "must be a string or an array of parts")),
    }
}

/// A `data:` URL becomes bytes (stored once, content-addressed); any other URL stays a URL.
fn media_from_url(url: &str, at: &str) -> Result<Part, Error> {
    if let Some(rest) = url.strip_prefix("data:")
        && let Some((mime, data)) = rest.split_once(";base64,")
    {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(data)
            .map_err(|e| {
                Error::invalid(format!("{at}.image_url.url"), format!("bad base64: {e}"))
            })?;
        return Ok(Part::Media {
            mime_type: mime.to_owned(),
            source: MediaSource::Data(bytes),
        });
    }
    Ok(Part::Media {
        mime_type: "image/*".to_owned(),
        source: MediaSource::Url(url.to_owned()),
    })
}

fn tool_calls(m: &Value, at: &str) -> Result<Vec<ToolCall>, Error> {
    let Some(calls) = m.get("tool_calls").filter(|c| !c.is_null()) else {
        return Ok(Vec::new());
    };
    let calls = calls
        .as_array()
        .ok_or_else(|| Error::invalid(format!("{at}.tool_calls"), "must be an array"))?;
    calls
        .iter()
        .enumerate()
        .map(|(k, c)| {
            let at = format!("{at}.tool_calls[{k}]");
            let function = c
                .get("function")
                .ok_or_else(|| Error::invalid(format!("{at}.function"), "is required"))?;
            Ok(ToolCall {
                call_id: string_field(c, &at, "id")?.to_owned(),
                name: string_field(function, &format!("{at}.function"), "name")?.to_owned(),
                arguments_json: arguments(
                    function.get("arguments"),
                    &format!("{at}.function.arguments"),
                )?,
            })
        })
        .collect()
}
