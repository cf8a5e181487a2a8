//! The provider wire formats, one codec each: Anthropic Messages (`anthropic`), OpenAI chat
//! completions (`chat`) and the OpenAI Responses API (`responses`), each reading a conversation
//! into domain nodes and writing the domain back (rendered documents in `format`, answers,
//! errors), with one identity canonicalisation (`canonical`). The gateway, import, export, the
//! API's rendered documents and the summarizer all go through these; nothing else knows a
//! provider's JSON field names.

pub mod agents;
pub mod answer;
pub mod anthropic;
pub mod canonical;
pub mod chat;
pub mod codec;
pub mod conversation;
pub mod format;
pub mod gemini;
pub mod models;
pub mod responses;
pub mod sse;
pub mod summarize;

/// A message's role, parts and calls, as a test reads what a codec made of a request; panics
/// on any other content.
#[cfg(test)]
pub(crate) fn message_of(
    content: &crate::domain::NodeContent,
) -> (
    crate::domain::Role,
    &[crate::domain::Part],
    &[crate::domain::ToolCall],
) {
    match content {
        crate::domain::NodeContent::Message {
            role,
            parts,
            tool_calls,
        } => (*role, parts, tool_calls),
        other => panic!("not a message: {other:?}"),
    }
}
