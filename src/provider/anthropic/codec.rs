//! The Messages API as a [`Codec`]: its routes, its request read, its `messages` written, its
//! answer assembled, its error shape.

use serde_json::Value;

use super::answer::Events;
use super::{edits, error, read};
use crate::domain::{ProviderBlock, WireFormat};
use crate::provider::codec::{Action, Answer, Codec, Failure, ReadResent, Request, Spec, Upstream};
use crate::provider::conversation::{Conversation, Refusal};
use crate::provider::format::{MESSAGE_FIELDS, anthropic_document};
use crate::render::Message;

/// Anthropic's Messages API (`/v1/messages`).
pub struct Messages;

impl Codec for Messages {
    fn spec(&self) -> &'static Spec {
        &Spec {
            name: "anthropic",
            upstream: Upstream::Anthropic,
            routes: &["/v1/messages", "/v1/messages/count_tokens"],
            field: "messages",
        }
    }

    fn claims(&self, _path: &str, has_header: &dyn Fn(&str) -> bool) -> bool {
        has_header("anthropic-version") || has_header("x-api-key")
    }

    fn action(&self, path: &str) -> Action {
        match path {
            "/v1/messages" => Action::Generate,
            "/v1/messages/count_tokens" => Action::Count,
            _ => Action::Other,
        }
    }

    fn read(&self, mut request: Request<'_>) -> Result<Conversation, Refusal> {
        let mut conv = read(&mut request.body)?;
        // Claude Code names its session in a header too; `metadata.user_id` wins.
        if conv.client_session.is_none() {
            conv.client_session = request
                .headers
                .iter()
                .find(|(n, _)| *n == "x-claude-code-session-id")
                .map(|(_, v)| v.trim())
                .filter(|s| !s.is_empty())
                .map(str::to_owned);
        }
        conv.wide_window = request
            .values("anthropic-beta")
            .any(|b| b.starts_with("context-1m"));
        Ok(conv)
    }

    fn read_resent(&self) -> Option<ReadResent> {
        Some(super::read_resent)
    }

    fn edit_header(
        &self,
        beta: &'static str,
        headers: &[(&str, &str)],
    ) -> Option<(&'static str, &'static str)> {
        let present = headers
            .iter()
            .filter(|(n, _)| *n == "anthropic-beta")
            .map(|(_, v)| *v);
        edits::beta_needed(present).map(|_| ("anthropic-beta", beta))
    }

    fn document(&self, messages: &[Message]) -> (Vec<Value>, Vec<Vec<usize>>) {
        let (document, sources) = anthropic_document(messages, true);
        match document {
            Value::Object(mut map) => match map.remove("messages") {
                Some(Value::Array(entries)) => (entries, sources),
                _ => (Vec::new(), Vec::new()),
            },
            _ => (Vec::new(), Vec::new()),
        }
    }

    fn hollow_block(&self, block: &ProviderBlock) -> bool {
        block.format == WireFormat::AnthropicMessages && !block.json.contains(MESSAGE_FIELDS)
    }

    fn cache_markers(&self) -> bool {
        true
    }

    fn provider_edits(&self) -> bool {
        true
    }

    fn tool(&self, name: &str, description: &str, parameters: Value) -> Value {
        serde_json::json!({"name": name, "description": description, "input_schema": parameters})
    }

    fn answer(&self, stream: bool) -> Answer {
        Answer::new(stream, Box::<Events>::default())
    }

    fn error(&self, failure: Failure, message: &str, _param: Option<&str>) -> Value {
        let kind = match failure {
            Failure::Invalid => "invalid_request_error",
            Failure::Unauthenticated => "authentication_error",
            Failure::NotFound => "not_found_error",
            Failure::TooLarge => "request_too_large",
            Failure::Upstream => "api_error",
            Failure::Busy => "rate_limit_error",
            Failure::Unavailable => "overloaded_error",
        };
        error(kind, message)
    }
}
