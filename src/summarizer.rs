//! The server's own summarizer: any OpenAI-compatible chat-completions endpoint, its HTTP and
//! its policy (the wire shape it sends and reads is `provider::summarize`'s).
//!
//! An input larger than the model's window is summarized in budgeted chunks with a rolling
//! summary; a "prompt too long" answer is retried once with chunks half the size. Calls and
//! total time are bounded. A failure is an error, never a stand-in summary.

use std::time::Duration;

use serde::Serialize;

use crate::compact::EVIDENCE_NOTE;
use crate::domain::Part;
use crate::provider::summarize;
use crate::render::{Message, MessageRole};
use crate::tokens::{Count, Tokens};

#[derive(Debug, Clone)]
pub struct Config {
    /// The chat-completions URL, or a base URL to which `/chat/completions` is added.
    pub url: String,
    pub model: String,
    pub api_key: Option<String>,
    /// The summarizer model's own context window, in tokens of the request's tokenizer.
    pub window_tokens: Tokens,
    /// Tokens the model may write.
    pub max_output_tokens: Tokens,
    /// Model calls one compaction may make, retries included.
    pub max_calls: usize,
    /// Time one compaction may take, all calls included.
    pub timeout: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the summarizer answered {status}: {body}")]
    Provider { status: u16, body: String },
    #[error("the summarizer could not be reached: {0}")]
    Transport(String),
    #[error("the summarizer's answer is not a chat completion: {0}")]
    Malformed(String),
    #[error("the summarizer needed more than {0} calls")]
    TooManyCalls(usize),
    #[error("the summarizer took longer than {0:?}")]
    Timeout(Duration),
    #[error("the prompt is too long for the summarizer even in chunks of {0} tokens")]
    TooLong(Tokens),
}

impl Error {
    /// Whether the provider refused the prompt as longer than its window.
    fn too_long(&self) -> bool {
        matches!(self, Error::Provider { status, body } if summarize::too_long(*status, body))
    }
}

const SYSTEM_PROMPT: &str = "You write the working memory of an AI agent whose earlier \
conversation no longer fits its context. Summarize the transcript you are given so the agent \
can continue without it: keep every request of the user (verbatim when short), decisions and \
their reasons, files, commands, errors and how they were resolved, and exactly where the work \
stands. If a summary so far is given, fold it in: the result replaces both. Write plain text, \
as short as the facts allow.";

/// Tokens kept free for the prompt's own framing.
const PROMPT_FRAMING: Tokens = 256;

pub struct Summarizer {
    config: Config,
    endpoint: String,
    client: reqwest::Client,
}

impl Summarizer {
    pub fn new(config: Config) -> Result<Self, Error> {
        // One process-wide crypto provider for TLS; a second install is harmless.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .build()
            .map_err(|e| Error::Transport(e.to_string()))?;
        let endpoint = summarize::endpoint(&config.url);
        Ok(Self {
            config,
            endpoint,
            client,
        })
    }

    pub fn model(&self) -> &str {
        &self.config.model
    }

    /// Summarizes `input` (the prior summary first, if any) under the configured bounds.
    /// `evidence` is the ledger text the store keeps after the summary: the model is shown it
    /// so it need not restate it.
    pub async fn summarize(
        &self,
        input: &[Message],
        evidence: &str,
        instructions: &str,
        counter: &(dyn Count + Sync),
    ) -> Result<String, Error> {
        let blocks: Vec<String> = input.iter().map(transcript_block).collect();
        let instructions = &if evidence.is_empty() {
            instructions.to_owned()
        } else {
            format!("{EVIDENCE_NOTE}\n{evidence}\n\n{instructions}")
                .trim_end()
                .to_owned()
        };
        let budget = self
            .config
            .window_tokens
            .saturating_sub(self.config.max_output_tokens)
            .saturating_sub(counter.count(SYSTEM_PROMPT))
            .saturating_sub(counter.count(instructions))
            .saturating_sub(PROMPT_FRAMING)
            .max(64);
        let run = async {
            let mut calls = 0;
            match self
                .rolling(&blocks, budget, instructions, counter, &mut calls)
                .await
            {
                Err(e) if e.too_long() => {
                    self.rolling(&blocks, budget / 2, instructions, counter, &mut calls)
                        .await
                }
                other => other,
            }
        };
        tokio::time::timeout(self.config.timeout, run)
            .await
            .map_err(|_| Error::Timeout(self.config.timeout))?
    }

    /// Whether a request of messages of `tokens` (a cache-sharing summary request) and the
    /// answer fit the model's window, so one call can take it whole.
    pub fn fits(&self, tokens: &[Tokens]) -> bool {
        let input = tokens
            .iter()
            .fold(0, |sum: Tokens, t| sum.saturating_add(*t));
        input
            .saturating_add(self.config.max_output_tokens)
            .saturating_add(PROMPT_FRAMING)
            <= self.config.window_tokens
    }

    /// Summarizes with one call of `request` as it is: the host's context, whose prefix the
    /// provider has cached, and the appended instruction. No system prompt is put before it,
    /// which would change the prefix.
    pub async fn summarize_request(&self, request: &[Message]) -> Result<String, Error> {
        // The messages as a value: written once, in the body, not as text read back.
        let body =
            summarize::conversation(&self.config.model, request, self.config.max_output_tokens);
        tokio::time::timeout(self.config.timeout, self.post(&body))
            .await
            .map_err(|_| Error::Timeout(self.config.timeout))?
    }

    /// One pass: chunks of at most `budget` tokens (the summary so far included), each call
    /// folding the next chunk into the summary so far.
    async fn rolling(
        &self,
        blocks: &[String],
        budget: Tokens,
        instructions: &str,
        counter: &(dyn Count + Sync),
        calls: &mut usize,
    ) -> Result<String, Error> {
        let mut summary = String::new();
        let mut chunk = String::new();
        let mut pending: Vec<String> = blocks.iter().rev().cloned().collect();
        while let Some(block) = pending.pop() {
            let room = budget.saturating_sub(counter.count(&summary));
            if room < 32 {
                return Err(Error::TooLong(budget));
            }
            let candidate = if chunk.is_empty() {
                block.clone()
            } else {
                format!("{chunk}\n\n{block}")
            };
            if counter.count(&candidate) <= room {
                chunk = candidate;
                continue;
            }
            if chunk.is_empty() {
                // One block larger than a chunk: split it by characters.
                let (head, tail) = split_to_fit(&block, room, counter);
                pending.push(tail);
                chunk = head;
            } else {
                pending.push(block);
            }
            summary = self.call(&summary, &chunk, instructions, calls).await?;
            chunk.clear();
        }
        if !chunk.is_empty() || summary.is_empty() {
            summary = self.call(&summary, &chunk, instructions, calls).await?;
        }
        Ok(summary)
    }

    async fn call(
        &self,
        so_far: &str,
        chunk: &str,
        instructions: &str,
        calls: &mut usize,
    ) -> Result<String, Error> {
        if *calls >= self.config.max_calls {
            return Err(Error::TooManyCalls(self.config.max_calls));
        }
        *calls += 1;
        let mut system = SYSTEM_PROMPT.to_owned();
        if !instructions.trim().is_empty() {
            system.push_str("\n\n");
            system.push_str(instructions);
        }
        let mut user = String::new();
        if !so_far.is_empty() {
            user.push_str("Summary so far:\n");
            user.push_str(so_far);
            user.push_str("\n\nThe transcript continues:\n");
        } else {
            user.push_str("Transcript:\n");
        }
        user.push_str(chunk);
        let request = summarize::prompt(
            &self.config.model,
            &system,
            &user,
            self.config.max_output_tokens,
        );
        self.post(&request).await
    }

    /// Posts one chat-completions request and returns the answer's text.
    async fn post(&self, request: &impl Serialize) -> Result<String, Error> {
        let mut http = self.client.post(&self.endpoint).json(request);
        if let Some(key) = &self.config.api_key {
            http = http.bearer_auth(key);
        }
        let response = http
            .send()
            .await
            .map_err(|e| Error::Transport(e.to_string()))?;
        let status = response.status();
        let body = response
            .text()
            .await
            .map_err(|e| Error::Transport(e.to_string()))?;
        if !status.is_success() {
            return Err(Error::Provider {
                status: status.as_u16(),
                body: body.chars().take(500).collect(),
            });
        }
        summarize::answer_text(&body).map_err(Error::Malformed)
    }
}

/// A message as transcript text for the summarizer.
fn transcript_block(m: &Message) -> String {
    let who = match m.role {
        _ if m.summary_id.is_some() => "EARLIER SUMMARY".to_owned(),
        MessageRole::System => "SYSTEM".to_owned(),
        MessageRole::Developer => "DEVELOPER".to_owned(),
        MessageRole::User => "USER".to_owned(),
        MessageRole::Assistant => "ASSISTANT".to_owned(),
        MessageRole::Tool => format!(
            "TOOL RESULT {} ({}){}",
            m.name.as_deref().unwrap_or(""),
            m.tool_call_id.as_deref().unwrap_or(""),
            if m.is_error { " ERROR" } else { "" }
        ),
    };
    let mut out = format!("[{who}]");
    for part in &m.parts {
        out.push('\n');
        match part {
            Part::Text(t) => out.push_str(t),
            Part::Media { mime_type, .. } => out.push_str(&format!("[{mime_type} attachment]")),
            Part::Block(_) => {}
        }
    }
    for call in &m.tool_calls {
        out.push_str(&format!(
            "\n[calls {} ({}) with {}]",
            call.name, call.call_id, call.arguments_json
        ));
    }
    out
}

/// Splits `text` into a head of at most `room` tokens and the rest.
fn split_to_fit(text: &str, room: Tokens, counter: &dyn Count) -> (String, String) {
    let chars: Vec<char> = text.chars().collect();
    let (mut lo, mut hi) = (1usize, chars.len());
    // Binary search on characters: counts are monotone enough for a chunk boundary.
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        let head: String = chars[..mid].iter().collect();
        if counter.count(&head) <= room {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    let head: String = chars[..lo].iter().collect();
    let tail: String = chars[lo..].iter().collect();
    (head, tail)
}
