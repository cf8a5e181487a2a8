//! An OpenAI chat-completions `messages` array (or a whole request body), read by the chat
//! completions codec (`provider::chat::read_file`) as the gateway reads the same request, so a
//! session imported here and continued through the gateway matches node for node (tool-call
//! arguments in their canonical JSON, content parts other than text kept whole).

use serde_json::Value;

use super::{Builder, History, refused};
use crate::domain::Error;
use crate::provider::chat;

pub(super) fn parse(text: &str) -> Result<History, Error> {
    let v: Value = serde_json::from_str(text)
        .map_err(|e| Error::invalid(format!("line {}", e.line()), format!("not JSON: {e}")))?;
    let (conversation, messages) = chat::read_file(v).map_err(|r| refused("", r))?;
    let mut b = Builder::default();
    for item in conversation.items {
        b.node(item.content, item.message + 1);
    }
    Ok(b.finish(messages))
}
