//! The server summarizer's exchange with an OpenAI-compatible chat-completions endpoint: where
//! it posts, the request it sends (a system prompt and a transcript, or a host's rendered
//! context as it is), the text it reads from the answer, and whether a refusal says the prompt
//! was longer than the model's window. `crate::summarizer` does the HTTP and the policy.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::format;
use crate::render::Message;
use crate::tokens::Tokens;

/// The endpoint's path under a base URL.
const PATH: &str = "/chat/completions";

/// The URL to post to: `url` itself when it names the endpoint, else `url` with its path added.
pub fn endpoint(url: &str) -> String {
    let trimmed = url.trim_end_matches('/');
    if trimmed.ends_with(PATH) {
        trimmed.to_owned()
    } else {
        format!("{trimmed}{PATH}")
    }
}

/// A request of two messages, the system prompt and the user's text, for an answer of at most
/// `max_tokens`, at temperature 0.
#[derive(Serialize)]
pub struct Prompt<'a> {
    model: &'a str,
    messages: [Entry<'a>; 2],
    max_tokens: Tokens,
    temperature: f32,
}

#[derive(Serialize)]
struct Entry<'a> {
    role: &'a str,
    content: &'a str,
}

pub fn prompt<'a>(
    model: &'a str,
    system: &'a str,
    user: &'a str,
    max_tokens: Tokens,
) -> Prompt<'a> {
    Prompt {
        model,
        messages: [
            Entry {
                role: "system",
                content: system,
            },
            Entry {
                role: "user",
                content: user,
            },
        ],
        max_tokens,
        temperature: 0.0,
    }
}

/// A request of rendered messages as they are (a host's context and the summary instruction
/// after it), for an answer of at most `max_tokens`, at temperature 0.
pub fn conversation(model: &str, messages: &[Message], max_tokens: Tokens) -> Value {
    format::request(model, format::openai_chat(messages), max_tokens, 0.0)
}

#[derive(Deserialize)]
struct Answer {
    choices: Vec<Choice>,
}

#[derive(Deserialize)]
struct Choice {
    message: ChoiceMessage,
}

#[derive(Deserialize)]
struct ChoiceMessage {
    #[serde(default)]
    content: Option<String>,
}

/// The text of an answer's first choice, or why there is none.
pub fn answer_text(body: &str) -> Result<String, String> {
    let answer: Answer = serde_json::from_str(body).map_err(|e| e.to_string())?;
    answer
        .choices
        .into_iter()
        .next()
        .and_then(|c| c.message.content)
        .ok_or_else(|| "no choices[0].message.content".to_owned())
}

/// Whether a refusal (`status`, `body`) says the prompt is longer than the model's window, in
/// the words OpenAI-compatible servers use for it.
pub fn too_long(status: u16, body: &str) -> bool {
    let body = body.to_lowercase();
    (status == 400 || status == 413)
        && [
            "context length",
            "context_length",
            "too long",
            "too many tokens",
            "maximum context",
        ]
        .iter()
        .any(|needle| body.contains(needle))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_endpoint_is_added_once() {
        assert_eq!(endpoint("http://h/v1/"), "http://h/v1/chat/completions");
        assert_eq!(
            endpoint("http://h/v1/chat/completions"),
            "http://h/v1/chat/completions"
        );
    }

    #[test]
    fn a_prompt_is_two_messages() {
        let body = serde_json::to_value(prompt("m", "sys", "text", 64)).unwrap();
        assert_eq!(
            body,
            serde_json::json!({
                "model": "m",
                "messages": [
                    {"role": "system", "content": "sys"},
                    {"role": "user", "content": "text"},
                ],
                "max_tokens": 64,
                "temperature": 0.0,
            })
        );
    }

    #[test]
    fn the_answer_is_the_first_choice() {
        let body = r#"{"choices": [{"message": {"content": "sum"}}, {"message": {}}]}"#;
        assert_eq!(answer_text(body).unwrap(), "sum");
        assert!(answer_text(r#"{"choices": []}"#).is_err());
        assert!(answer_text("not json").is_err());
    }

    #[test]
    fn too_long_is_read_from_the_refusal() {
        assert!(too_long(400, "This model's maximum context length is 8192"));
        assert!(!too_long(500, "maximum context length"));
        assert!(!too_long(400, "bad request"));
    }
}
