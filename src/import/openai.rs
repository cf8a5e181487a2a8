//! An OpenAI chat-completions `messages` array (or a whole request body), read by the chat
//! completions codec (`provider::chat`) as the gateway reads the same request, so a session
//! imported here and continued through the gateway matches node for node (tool-call arguments
//! in their canonical JSON, content parts other than text kept whole).

use serde_json::{Value, json};

use super::{Builder, History, refused};
use crate::domain::{Error, NodeContent};
use crate::provider::chat;

pub(super) fn parse(text: &str) -> Result<History, Error> {
    let v: Value = serde_json::from_str(text)
        .map_err(|e| Error::invalid(format!("line {}", e.line()), format!("not JSON: {e}")))?;
    let body = match v {
        Value::Array(messages) => json!({ "model": "", "messages": messages }),
        // A whole request body is fine too.
        Value::Object(mut body) => {
            if !body.get("model").is_some_and(Value::is_string) {
                body.insert("model".to_owned(), Value::String(String::new()));
            }
            Value::Object(body)
        }
        _ => return Err(Error::invalid("messages", "must be an array")),
    };
    let conversation = chat::read(&body).map_err(|r| refused("", r))?;
    let mut b = Builder::default();
    let messages = body["messages"].as_array().map_or(0, Vec::len);
    for item in conversation.items {
        let line = item.message + 1;
        // The codec passes arguments that are not JSON through (a gateway forwards them); a
        // file holding them is refused here, naming the call.
        if let NodeContent::Message { tool_calls, .. } = &item.content {
            for (k, call) in tool_calls.iter().enumerate() {
                if let Err(e) = serde_json::from_str::<serde::de::IgnoredAny>(&call.arguments_json)
                {
                    return Err(Error::invalid(
                        format!(
                            "messages[{}].tool_calls[{k}].function.arguments",
                            item.message
                        ),
                        format!("not JSON: {e}"),
                    ));
                }
            }
        }
        b.node(item.content, line);
    }
    Ok(b.finish(messages))
}
