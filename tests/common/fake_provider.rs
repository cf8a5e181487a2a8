//! A scripted fake model provider on 127.0.0.1:0: the Anthropic Messages API
//! (`POST /v1/messages`, streamed or not, and `POST /v1/messages/count_tokens`), OpenAI chat
//! completions (`POST /v1/chat/completions`, streamed or not), the OpenAI Responses API
//! (`POST /v1/responses`, streamed or not) and Google's Gemini API
//! (`POST /v1beta/models/{model}:generateContent`, `:streamGenerateContent`, `:countTokens`;
//! its rules, answers and cache are stated in `fake_gemini.rs`, a module of this file). Any
//! other path answers 404 (JSON).
//!
//! A test scripts the answers: [`FakeProvider::script`] queues [`Reply`] values, taken in order
//! by `/v1/messages`, `/v1/chat/completions` and `/v1/responses` calls (count_tokens takes
//! none); when the queue is empty the default reply ([`FakeProvider::set_default`],
//! `Reply::text("fake answer")` at first) answers. Every request is recorded
//! ([`FakeProvider::requests`]) with what was sent back; an Anthropic one also with the prompt
//! the model saw ([`Recorded::prompt`]) and what the rules below did to it
//! ([`Recorded::input_transformations`], [`Recorded::applied_edits`]).
//!
//! Answers imitate the providers' wire formats: the SSE events of Anthropic (`event:` and `data:`
//! lines, each event closed by a blank line) in this order: `message_start`, `ping`, then per
//! content block `content_block_start`, its deltas (`text_delta`, `input_json_delta`,
//! `thinking_delta` then `signature_delta`; none for `redacted_thinking`),
//! `content_block_stop`; then `message_delta` (stop_reason, usage.output_tokens) and
//! `message_stop`. OpenAI: `data: {chunk}` lines (the first carries the role, then content and
//! tool_calls deltas, then one with `finish_reason`, then the usage chunk when
//! `stream_options.include_usage`), closed by `data: [DONE]`. Responses: `event:` and `data:`
//! lines, each data a JSON object with its `type` and a `sequence_number` counting from 0:
//! `response.created`, `response.in_progress`, then per output item `response.output_item.added`,
//! its parts and deltas (a message: `response.content_part.added`, `response.output_text.delta`,
//! `response.output_text.done`, `response.content_part.done`; a function call:
//! `response.function_call_arguments.delta` and `.done`; reasoning with a summary:
//! `response.reasoning_summary_part.added`, `response.reasoning_summary_text.delta` and `.done`,
//! `response.reasoning_summary_part.done`), `response.output_item.done`; then
//! `response.completed` (`response.incomplete` when a stop reason is scripted) with the whole
//! response, `output` and `usage` included. Text and tool arguments are sent in up to three
//! deltas each.
//!
//! Blocks as Responses output items: text is an assistant `message` item (one `output_text`
//! part), a tool call a `function_call` item (`call_id` the block's id, `arguments` its compact
//! JSON), thinking a `reasoning` item (the thinking its one `summary_text`, none when empty; the
//! signature its `encrypted_content`), redacted thinking a `reasoning` item with no summary and
//! the data as `encrypted_content`. Item ids are `msg_fake_<n>_<i>`, `fc_fake_<n>_<i>` and
//! `rs_fake_<n>_<i>` (`n` the answer's number, `i` the item's index).
//!
//! Usage: each API family's own cache imitated, on a clock of the fake's
//! ([`FakeProvider::advance`] moves it; nothing expires in real time). Everything below is
//! computed from the request alone (its body; for Anthropic's drops and edits also its
//! `anthropic-beta` header), so [`BreakpointCache`] and [`PrefixCache`] can also price bodies
//! offline (a bench prices one replay under both models; [`anthropic_units`] of a body is its
//! prompt before any drop or edit: [`Recorded::prompt`] is the one priced).
//! - tokens of a JSON value = ceil(chars of its compact serialisation / 4), with every
//!   `cache_control` key removed first (at any depth); an absent field counts 0. Values are
//!   compared (hashed) the same way, key order aside.
//!
//! Anthropic (`/v1/messages`), the breakpoint model:
//! - the prompt is a sequence of blocks: each `tools` entry in order, then the system blocks,
//!   then every content block of every message in order, as the model sees them (after the
//!   thinking blocks dropped and the context edits below). A string `system` or `content` is one
//!   block, `{"type":"text","text":<the string>}` (the API reads it as that block, and a client
//!   or the gateway may send either form). A message's role is hashed with its first block, so
//!   the same blocks under another role are another prompt; it counts no tokens;
//! - breakpoints: the blocks with a `cache_control` key of their own (not one nested deeper),
//!   the first 4 in prompt order honoured (the API refuses a fifth; the fake ignores the rest).
//!   A breakpoint's lifetime is 1 hour when its marker is `{"type":"ephemeral","ttl":"1h"}`
//!   (a `ttl` of `"1h"`), else 5 minutes;
//! - an entry is keyed by (model, hash of the blocks up to and including one block);
//! - read: for each breakpoint `b`, the live entry at the latest of `b`, `b`-1, ... `b`-19
//!   (20 blocks, `b` included); `cache_read_input_tokens` = tokens of the blocks up to the
//!   longest such prefix over all breakpoints (0 when none is found);
//! - written: `cache_creation_input_tokens` = tokens after the read up to and including the
//!   last breakpoint (0 when the read reaches it); each stretch is charged at the lifetime of
//!   the breakpoint that ends it, reported in `cache_creation.ephemeral_5m_input_tokens` and
//!   `cache_creation.ephemeral_1h_input_tokens`;
//! - `input_tokens` = tokens after the last breakpoint. No breakpoint: every token is input,
//!   nothing is read or written;
//! - a request answered with a message (not a scripted error or failure) writes an entry at
//!   each honoured breakpoint and refreshes the entry it read: an entry lives until its last
//!   write or read plus its lifetime (a write never shortens it; a 1-hour write makes it a
//!   1-hour entry). A scripted error or failure refreshes and writes nothing;
//! - no minimum length (the API caches nothing under 1,024 tokens; left out so that small
//!   tests see the rule).
//!
//! OpenAI (`/v1/chat/completions`, `/v1/responses`), the automatic prefix model (no markers):
//! - the prompt is a sequence of items: `tools` (one item, when present), `instructions`
//!   (Responses, when present), then each message or `input` item (a string `input` is one user
//!   message `{"role":"user","content":<the string>}`);
//! - entries are keyed by (API, model, `prompt_cache_key` or none, hash of the items up to and
//!   including one item);
//! - cached = tokens of the longest run of leading items whose prefix has a live entry; 0 when
//!   that is under 1,024 tokens, else rounded down to a multiple of 128;
//! - a request answered with a message writes or refreshes an entry for every prefix of its
//!   items, live for 5 minutes after that (24 hours with `prompt_cache_retention: "24h"`);
//! - chat completions: `prompt_tokens` = prompt, `prompt_tokens_details.cached_tokens` =
//!   cached; Responses: `input_tokens` = prompt, `input_tokens_details.cached_tokens` = cached,
//!   `output_tokens_details.reasoning_tokens` = the thinking's share of the output tokens.
//!
//! Both: output tokens = the sum over the answer's blocks of ceil(chars / 4) of its text,
//! thinking (plus signature) or compact input JSON, at least 1; `count_tokens` goes through the
//! same checks, drops and edits as `/v1/messages` (below), answers `{"input_tokens": <tokens of
//! the blocks after them>}` and neither reads nor writes.
//!
//! Prices: what an answered call costs ([`Bill::cost`], [`Recorded::bill`],
//! [`FakeProvider::cost`]) is its input tokens weighted by price: uncached 1×, 5-minute writes
//! 1.25×, 1-hour writes 2×, reads at the model's read price (Anthropic's prices; OpenAI writes
//! nothing and reads at 0.1× whatever the model). The read price ([`read_price`]) is found by
//! prefix on the model lower-cased, a `provider/` prefix stripped, the longest prefix winning:
//! `claude-fable-5-1`, `claude-fable-5-2`, `claude-mythos-5-1`, `claude-mythos-5-2` read at
//! 0.025×; `claude-opus-5-5`, `claude-sonnet-5-5`, `claude-haiku-5-5` at 0.05×; any other model
//! at 0.1×. A [`Bill`] keeps the read price it was priced at ([`Bill::read_price`]);
//! [`Bill::cost_at`] and [`FakeProvider::cost_at`] price the same tokens at another.
//!
//! Anthropic, thinking bound to its prefix. The binding models ([`binds_thinking`]: the prefixes
//! `claude-fable-5-1`, `claude-fable-5-2`, `claude-mythos-5-1`, `claude-mythos-5-2`,
//! `claude-opus-5-5`, `claude-sonnet-5-5`, `claude-haiku-5-5`, matched as for the read price, so
//! dated ids such as `claude-opus-5-5-20261015` bind too) bind each thinking block to the prompt
//! before it; other models neither sign, nor add thinking, nor check:
//! - the prefix of the block at `messages[N].content[M]`: each `tools` entry, the `system`
//!   blocks (a string is one text block; a block whose `text` starts with
//!   `x-anthropic-billing-header:` is left out, since Claude Code changes it on every request),
//!   every message before N (its role and its content, a string content read as
//!   `[{"type":"text","text":<the string>}]`) and the blocks of message N before M; compared as
//!   canonical JSON (every `cache_control` key removed at any depth, object keys sorted), so
//!   moving markers or reordering keys changes no prefix. Nothing else of the body (model,
//!   thinking, context_management, metadata, max_tokens...) is part of it;
//! - signing: every `thinking` block the fake answers with gets `signature` = `fakesig1.` then
//!   32 hex digits of a 128-bit FNV-1a hash of its prefix in the answered request (the answer's
//!   message being the one after the request's last, the answer's blocks before it included as
//!   sent, signatures too) and its `thinking` text; a `redacted_thinking` block's `data` is the
//!   same over its prefix alone ([`thinking_signature`] computes both). Scripted signatures and
//!   data are replaced;
//! - thinking on (`thinking.type` `"enabled"` or `"adaptive"`) and a reply (scripted or default)
//!   without a thinking or redacted_thinking block: one `thinking` block is put first, its text
//!   [`THINKING_TEXT`], or empty with `thinking.display: "omitted"`, signed as above;
//! - checking, before anything else is done with the request (before a reply is taken): every
//!   `thinking` (`redacted_thinking`) block of `messages` must carry the signature (data) the
//!   fake computes at its place in this request from its text; any other, one the fake did not
//!   make included, is unbound. At the first unbound block, at `messages.N.content.M`:
//!   - when an `anthropic-beta` header value (comma-separated, on one header line or several)
//!     is `thinking-binding-controls-2026-08-01` and the body has
//!     `thinking.block_binding.prefix_mismatch_behavior: "drop_block"`: that block and every
//!     later thinking or redacted_thinking block of the request are dropped from the prompt
//!     (before anything is priced; a message left without blocks stays, empty), and the answer
//!     carries `"input_transformations": [{"type": "thinking_block_dropped", "message_index":
//!     N, "content_index": M, "reason": "prefix_mismatch"}, ...]`, one per dropped block,
//!     indices as sent (JSON: at the top level; streamed: in `message_start`'s `message`;
//!     absent when nothing was dropped);
//!   - otherwise the request is refused: 400 `invalid_request_error`, message
//!     `messages.N.content.M: ` followed by: Invalid `signature` in `thinking` block. The block
//!     is bound to a different conversation. Thinking blocks must be sent back after exactly
//!     the prefix they were produced on. (the same for a redacted block);
//!     [`FakeProvider::refusals`] counts these.
//!
//!   So leaving out an earlier thinking block while keeping a later one is refused (the later
//!   one's prefix changed); leaving them all out, appending messages, moving markers and
//!   changing the billing header are not.
//!
//! Anthropic, server-side context editing (every model), `context_management.edits` in the body:
//! - a non-null `context_management` needs the `anthropic-beta` value
//!   `context-management-2025-06-27`, else 400 `invalid_request_error` with the message
//!   `context_management: requires the anthropic-beta header context-management-2025-06-27`. An
//!   edit of another `type` than the two below, or a `clear_thinking_20251015` that is not the
//!   first edit, is refused with 400 `context_management.edits.N: <why>`. These are checked
//!   after the binding check and are not counted as binding refusals;
//! - the edits apply in order, after the binding check and its drops, to the prompt the model
//!   sees (what is priced); signatures are checked on the request as received, so an edit the
//!   provider makes itself never unbinds a block. A marker stays on the block it was on (a
//!   removed block takes its own with it);
//! - `clear_thinking_20251015`: `keep` is `"all"` (nothing cleared) or `{"type":
//!   "thinking_turns", "value": n}` (n = 1 by default or when unreadable). An assistant turn is
//!   the run of assistant messages since the last user message that holds anything but
//!   `tool_result` blocks (tool results continue a turn). The thinking and redacted_thinking
//!   blocks of the assistant messages of all but the newest n turns are removed. Thinking on
//!   and no `clear_thinking_20251015` edit: the same happens with n = 1 (the API's default, with
//!   or without `context_management`), reported nowhere;
//! - `clear_tool_uses_20250919`: the tool uses are the `tool_use` blocks of assistant messages
//!   in order, each with the first later `tool_result` of its id. `trigger` `{"type":
//!   "input_tokens", "value": V}` fires when the prompt's tokens (as priced, after the drops
//!   and edits before it) exceed V, `{"type": "tool_uses", "value": V}` when the tool uses
//!   exceed V; without a `value`: input_tokens 100,000. When it fires, every tool use but the
//!   newest K (`keep` `{"type": "tool_uses", "value": K}`, default 3; excluded tools count
//!   among them) whose name is not in `exclude_tools` (default none) is cleared: its result
//!   becomes `{"type": "tool_result", "tool_use_id": <its id>, "content": [{"type": "text",
//!   "text": "[tool result cleared]"}]}` (its `is_error` and `cache_control` kept, nothing
//!   else), and when `clear_tool_inputs` is `true` or an array naming its tool the call's
//!   `input` becomes `{}`. With `clear_at_least` `{"type": "input_tokens", "value": A}` an edit
//!   that would free fewer than A tokens clears nothing. An edit is stateless: a result already
//!   the placeholder is cleared again, and counted;
//! - a request with `context_management` is answered with `"context_management":
//!   {"applied_edits": [...]}` (JSON: at the top level; streamed: at the top level of the
//!   `message_delta` event's data), one entry per edit that cleared something, in the order
//!   applied: `{"type": "clear_tool_uses_20250919", "cleared_tool_uses": <uses cleared>,
//!   "cleared_input_tokens": t}` or `{"type": "clear_thinking_20251015",
//!   "cleared_thinking_turns": <turns that lost thinking>, "cleared_input_tokens": t}`, t the
//!   prompt's tokens before the edit less after it (0 when placeholders outweigh what they
//!   replaced); `[]` when none cleared anything.
//!
//! A request refused by these rules (any 400 above) is recorded (status 400, no bill,
//! [`Recorded::prompt`] null), takes no scripted reply and reads or writes nothing in the cache.
//!
//! Self-contained (axum, tokio, tokio-stream, serde_json, bytes only) so a bench can include it
//! with `#[path = "../tests/common/fake_provider.rs"] mod fake_provider;` (which brings
//! `fake_gemini.rs` beside it along). Nothing sleeps unless a reply is scripted with a delay.

#![allow(dead_code)]

use std::collections::{HashMap, VecDeque};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use axum::response::Response;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::{Notify, mpsc};
use tokio::task::JoinHandle;

#[path = "fake_gemini.rs"]
mod gemini;

#[allow(unused_imports)]
pub use gemini::{
    CORRUPTED_SIGNATURE, DUMMY_SIGNATURES, GEMINI_CACHE_LIFE, ImplicitCache, NO_KEY, PAIRING_CALL,
    PAIRING_COUNT, PAIRING_RESPONSE, gemini_key, gemini_of_sse, gemini_read_price, gemini_units,
    gemini_version, google_error, min_cached, missing_signature, thinks, validates_signatures,
};

/// The largest request body the fake reads.
const MAX_BODY: usize = 256 * 1024 * 1024;

/// What the default reply says.
pub const DEFAULT_TEXT: &str = "fake answer";

// ---------------------------------------------------------------- replies

/// One content block of an answer.
#[derive(Clone, Debug, PartialEq)]
pub enum Block {
    Text(String),
    /// A tool call; `id` is the Anthropic `tool_use` id (OpenAI: the `tool_calls[].id`).
    ToolUse {
        id: String,
        name: String,
        input: Value,
    },
    Thinking {
        thinking: String,
        signature: String,
    },
    RedactedThinking(String),
}

#[derive(Clone, Debug)]
enum Kind {
    Answer(Vec<Block>),
    Error {
        status: u16,
        body: String,
    },
    /// A Responses stream that ends in `response.failed`.
    Failed {
        code: String,
        message: String,
    },
}

/// A scripted answer. Build one with [`Reply::text`], [`Reply::tool_use`],
/// [`Reply::thinking`], [`Reply::error`]..., then adjust it with [`Reply::delayed`],
/// [`Reply::cut_after`], [`Reply::paused_after`], [`Reply::header`], [`Reply::stop_reason`].
#[derive(Clone, Debug)]
pub struct Reply {
    kind: Kind,
    stop_reason: Option<String>,
    delay: Duration,
    cut_after: Option<usize>,
    pause: Option<(usize, Gate)>,
    headers: Vec<(String, String)>,
}

impl Reply {
    fn of(kind: Kind) -> Self {
        Self {
            kind,
            stop_reason: None,
            delay: Duration::ZERO,
            cut_after: None,
            pause: None,
            headers: Vec::new(),
        }
    }

    /// An answer of `blocks`.
    pub fn blocks(blocks: Vec<Block>) -> Self {
        Self::of(Kind::Answer(blocks))
    }

    /// A text answer.
    pub fn text(text: impl Into<String>) -> Self {
        Self::blocks(vec![Block::Text(text.into())])
    }

    /// A call of tool `name` with `input`; its id is `toolu_fake_<n>` (OpenAI: `call_fake_<n>`),
    /// `n` a number unique in this provider.
    pub fn tool_use(name: impl Into<String>, input: Value) -> Self {
        Self::tool_use_id("", name, input)
    }

    /// A call with the id `id` (used as is on both APIs; empty: generated).
    pub fn tool_use_id(id: impl Into<String>, name: impl Into<String>, input: Value) -> Self {
        Self::blocks(vec![Block::ToolUse {
            id: id.into(),
            name: name.into(),
            input,
        }])
    }

    /// Text, then a tool call.
    pub fn text_and_tool_use(
        text: impl Into<String>,
        name: impl Into<String>,
        input: Value,
    ) -> Self {
        Self::blocks(vec![
            Block::Text(text.into()),
            Block::ToolUse {
                id: String::new(),
                name: name.into(),
                input,
            },
        ])
    }

    /// A thinking block with its signature, followed by `then`'s blocks (text or tool use).
    pub fn thinking(
        thinking: impl Into<String>,
        signature: impl Into<String>,
        then: Reply,
    ) -> Self {
        let mut blocks = vec![Block::Thinking {
            thinking: thinking.into(),
            signature: signature.into(),
        }];
        if let Kind::Answer(rest) = then.kind {
            blocks.extend(rest);
        }
        Self {
            kind: Kind::Answer(blocks),
            ..then
        }
    }

    /// An error answer: `status` with `body` sent as is (content-type application/json).
    pub fn error(status: u16, body: impl Into<String>) -> Self {
        Self::of(Kind::Error {
            status,
            body: body.into(),
        })
    }

    /// An Anthropic-shaped error: `{"type":"error","error":{"type":<kind>,"message":<message>}}`.
    pub fn anthropic_error(status: u16, kind: &str, message: &str) -> Self {
        let body = json!({"type": "error", "error": {"type": kind, "message": message}});
        Self::error(status, body.to_string())
    }

    /// A Google-shaped error: `{"error":{"code":<status>,"message":<message>,"status":<code>}}`
    /// (`code` e.g. `INVALID_ARGUMENT`, `RESOURCE_EXHAUSTED`).
    pub fn gemini_error(status: u16, code: &str, message: &str) -> Self {
        Self::error(status, google_error(status, code, message).to_string())
    }

    /// An OpenAI-shaped error: `{"error":{"message","type","param":null,"code":null}}`.
    pub fn openai_error(status: u16, kind: &str, message: &str) -> Self {
        let body =
            json!({"error": {"message": message, "type": kind, "param": null, "code": null}});
        Self::error(status, body.to_string())
    }

    /// Responses, streamed: a 200 stream of `response.created`, `response.in_progress` and
    /// `response.failed` (its response's `error` is `{"code": code, "message": message}`), as
    /// the API reports a failure after the stream began. Not streamed, or on another API: a 500
    /// error of that API's shape with `message`.
    pub fn responses_failed(code: &str, message: &str) -> Self {
        Self::of(Kind::Failed {
            code: code.into(),
            message: message.into(),
        })
    }

    /// Waits `delay` before answering anything (status and headers included).
    pub fn delayed(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// Streamed: sends the first `events` SSE events (Anthropic: `message_start` is 1, `ping` 2,
    /// the first `content_block_start` 3, its first delta 4...; OpenAI: the role chunk is 1;
    /// Responses: `response.created` is 1, `response.in_progress` 2, the first
    /// `response.output_item.added` 3...)
    /// and then breaks the connection without ending the chunked body. Not streamed: sends the
    /// first half of the JSON body and breaks the connection.
    pub fn cut_after(mut self, events: usize) -> Self {
        self.cut_after = Some(events);
        self
    }

    /// Streamed: after the first `events` events the stream waits until the returned gate is
    /// opened (headers and those events are sent at once), then sends the rest.
    pub fn paused_after(mut self, events: usize) -> (Self, Gate) {
        let gate = Gate::default();
        self.pause = Some((events, gate.clone()));
        (self, gate)
    }

    /// An extra response header.
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// The stop reason (Anthropic `stop_reason`, OpenAI `finish_reason`) instead of the derived
    /// one (`tool_use`/`tool_calls` when the answer calls a tool, else `end_turn`/`stop`).
    /// Responses: the answer is `incomplete`, `incomplete_details.reason` the reason (e.g.
    /// `max_output_tokens`), the stream ending in `response.incomplete`.
    pub fn stop_reason(mut self, reason: &str) -> Self {
        self.stop_reason = Some(reason.into());
        self
    }
}

/// Holds a paused stream ([`Reply::paused_after`]) until [`Gate::open`].
#[derive(Clone, Debug, Default)]
pub struct Gate(Arc<Notify>);

impl Gate {
    pub fn open(&self) {
        self.0.notify_one();
    }
}

// ---------------------------------------------------------------- records

/// One request as the fake received it, and what it sent back.
#[derive(Clone, Debug)]
pub struct Recorded {
    pub method: Method,
    /// The path, without the query.
    pub path: String,
    pub query: Option<String>,
    pub headers: HeaderMap,
    /// The body parsed as JSON; `Value::Null` when it is not JSON.
    pub body: Value,
    pub raw: Bytes,
    /// The status answered.
    pub status: u16,
    /// Everything the fake meant to send in the response body (a cut stream: only what it sent
    /// before the cut; a paused one: all of it, whether the gate was opened or not).
    pub response: Bytes,
    /// The usage reported (`Value::Null` for errors and 404s).
    pub usage: Value,
    /// The input of an answered model call by price (`None` for errors, failures, 404s,
    /// refusals and `count_tokens`).
    pub bill: Option<Bill>,
    /// Anthropic: the `messages` as the model saw them, after every dropped thinking block and
    /// every context edit (what was priced, or counted by `count_tokens`); `Value::Null` for a
    /// refused request and on the other APIs.
    pub prompt: Value,
    /// Anthropic: the thinking blocks dropped (the `input_transformations` array an answer
    /// carries); `Value::Null` when none was dropped.
    pub input_transformations: Value,
    /// Anthropic: the context edits applied (the `context_management.applied_edits` array an
    /// answer carries, `[]` when none cleared anything); `Value::Null` when the request had no
    /// `context_management` or was refused.
    pub applied_edits: Value,
}

impl Recorded {
    /// A header's value as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The `messages` of the body (empty when absent).
    pub fn messages(&self) -> Vec<Value> {
        self.body["messages"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// The `input` items of a Responses body (a string `input` is one user message; empty when
    /// absent).
    pub fn input(&self) -> Vec<Value> {
        match &self.body["input"] {
            Value::Array(items) => items.clone(),
            Value::String(text) => vec![json!({"role": "user", "content": text})],
            _ => Vec::new(),
        }
    }

    /// The `contents` of a Gemini body (empty when absent).
    pub fn contents(&self) -> Vec<Value> {
        self.body["contents"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// The response body as text.
    pub fn response_text(&self) -> String {
        String::from_utf8_lossy(&self.response).into_owned()
    }

    /// The cache-weighted input of this call ([`Bill::cost`]); 0 when it was not answered.
    pub fn cost(&self) -> f64 {
        self.bill.as_ref().map_or(0.0, Bill::cost)
    }

    /// The same with reads priced at `read` ([`Bill::cost_at`]).
    pub fn cost_at(&self, read: f64) -> f64 {
        self.bill.as_ref().map_or(0.0, |b| b.cost_at(read))
    }
}

// ---------------------------------------------------------------- the server

struct Inner {
    queue: VecDeque<Reply>,
    default: Reply,
    requests: Vec<Recorded>,
    /// The fake's clock: how far [`FakeProvider::advance`] has moved it from the start.
    now: Duration,
    /// Anthropic's cache and OpenAI's (both APIs of it), as the module's docs state them.
    breakpoints: BreakpointCache,
    prefixes: PrefixCache,
    /// Counters for ids.
    next_id: u64,
    /// Requests refused for a thinking block not bound to its prefix, or (Gemini) a call of
    /// the current turn without the signature the fake gave it.
    refusals: usize,
    /// Gemini's implicit cache and the signatures given to calls.
    gemini: gemini::State,
}

type Shared = Arc<Mutex<Inner>>;

fn lock(shared: &Shared) -> MutexGuard<'_, Inner> {
    shared.lock().unwrap_or_else(|e| e.into_inner())
}

/// The fake provider; stops when dropped.
pub struct FakeProvider {
    addr: SocketAddr,
    shared: Shared,
    task: JoinHandle<()>,
}

impl Drop for FakeProvider {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeProvider {
    /// Serves on 127.0.0.1:0; the listener is bound when this returns.
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the fake provider");
        let addr = listener.local_addr().expect("local addr");
        let shared: Shared = Arc::new(Mutex::new(Inner {
            queue: VecDeque::new(),
            default: Reply::text(DEFAULT_TEXT),
            requests: Vec::new(),
            now: Duration::ZERO,
            breakpoints: BreakpointCache::default(),
            prefixes: PrefixCache::default(),
            next_id: 0,
            refusals: 0,
            gemini: gemini::State::default(),
        }));
        let app = Router::new().fallback(handle).with_state(shared.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self { addr, shared, task }
    }

    /// The base URL, without `/v1`: `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Queues `reply` for the next answer.
    pub fn script(&self, reply: Reply) {
        lock(&self.shared).queue.push_back(reply);
    }

    /// Queues each of `replies`, in order.
    pub fn script_all(&self, replies: impl IntoIterator<Item = Reply>) {
        lock(&self.shared).queue.extend(replies);
    }

    /// The replies still queued.
    pub fn pending(&self) -> usize {
        lock(&self.shared).queue.len()
    }

    /// The reply given when the queue is empty.
    pub fn set_default(&self, reply: Reply) {
        lock(&self.shared).default = reply;
    }

    /// Every request so far, in arrival order.
    pub fn requests(&self) -> Vec<Recorded> {
        lock(&self.shared).requests.clone()
    }

    pub fn request_count(&self) -> usize {
        lock(&self.shared).requests.len()
    }

    /// The latest request; panics when there is none.
    pub fn last_request(&self) -> Recorded {
        lock(&self.shared)
            .requests
            .last()
            .cloned()
            .expect("the fake provider received a request")
    }

    /// Forgets the requests recorded (the cache stays).
    pub fn clear_requests(&self) {
        lock(&self.shared).requests.clear();
    }

    /// Forgets what the imitated caches hold (both models; the clock stays).
    pub fn clear_cache(&self) {
        let mut inner = lock(&self.shared);
        inner.breakpoints = BreakpointCache::default();
        inner.prefixes = PrefixCache::default();
        inner.gemini.cache = ImplicitCache::default();
    }

    /// Moves the fake's clock forward by `by`: cache entries expire by it, not by real time, so
    /// a test can step past a lifetime without waiting.
    pub fn advance(&self, by: Duration) {
        let mut inner = lock(&self.shared);
        inner.now += by;
        let now = inner.now;
        inner.breakpoints.forget_expired(now);
        inner.prefixes.forget_expired(now);
        inner.gemini.cache.forget_expired(now);
    }

    /// The fake's clock: the sum of the [`FakeProvider::advance`] steps so far.
    pub fn now(&self) -> Duration {
        lock(&self.shared).now
    }

    /// The cache-weighted input ([`Bill::cost`]) summed over the answered model calls recorded
    /// (since the last [`FakeProvider::clear_requests`]), so a run direct and a run through the
    /// gateway compare as one number each.
    pub fn cost(&self) -> f64 {
        lock(&self.shared).requests.iter().map(Recorded::cost).sum()
    }

    /// The same with every read priced at `read` ([`Bill::cost_at`]): what the calls recorded
    /// would have cost on a model with that read price.
    pub fn cost_at(&self, read: f64) -> f64 {
        lock(&self.shared)
            .requests
            .iter()
            .map(|r| r.cost_at(read))
            .sum()
    }

    /// The requests refused so far (whatever [`FakeProvider::clear_requests`] forgot) because a
    /// thinking block was not sent back after the prefix it was produced on, or (Gemini 3) a
    /// call of the current turn came without the signature the fake gave it.
    pub fn refusals(&self) -> usize {
        lock(&self.shared).refusals
    }

    /// The `thoughtSignature`s the fake gave Gemini function calls, as (call name, signature),
    /// in the order given.
    pub fn gemini_signatures(&self) -> Vec<(String, String)> {
        lock(&self.shared).gemini.calls.clone()
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Api {
    Anthropic,
    OpenAi,
    Responses,
}

async fn handle(State(shared): State<Shared>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let raw = axum::body::to_bytes(body, MAX_BODY)
        .await
        .unwrap_or_default();
    let body: Value = serde_json::from_slice(&raw).unwrap_or(Value::Null);
    let path = parts.uri.path().to_owned();
    let mut record = Recorded {
        method: parts.method.clone(),
        path: path.clone(),
        query: parts.uri.query().map(str::to_owned),
        headers: parts.headers,
        body,
        raw,
        status: 0,
        response: Bytes::new(),
        usage: Value::Null,
        bill: None,
        prompt: Value::Null,
        input_transformations: Value::Null,
        applied_edits: Value::Null,
    };
    if let Some((model, method)) = gemini::route(&path) {
        return gemini::handle(&shared, record, model, method).await;
    }
    let post = parts.method == Method::POST;
    let api = match path.as_str() {
        "/v1/messages" if post => Some(Api::Anthropic),
        "/v1/chat/completions" if post => Some(Api::OpenAi),
        "/v1/responses" if post => Some(Api::Responses),
        _ => None,
    };
    if post && path == "/v1/messages/count_tokens" {
        return count_tokens(&shared, record);
    }
    let Some(api) = api else {
        let body = json!({
            "type": "error",
            "error": {"type": "not_found_error", "message": format!("no route for {} {path}", parts.method)},
        });
        return finish(&shared, record, 404, body.to_string());
    };
    let well_formed = match api {
        Api::Responses => record.body["input"].is_array() || record.body["input"].is_string(),
        _ => record.body["messages"].is_array(),
    };
    if !well_formed {
        let body = match api {
            Api::Anthropic => json!({
                "type": "error",
                "error": {"type": "invalid_request_error", "message": "messages: Field required"},
            }),
            Api::OpenAi => json!({
                "error": {"message": "messages: Field required", "type": "invalid_request_error", "param": "messages", "code": null},
            }),
            Api::Responses => json!({
                "error": {"message": "input: must be a string or an array of input items", "type": "invalid_request_error", "param": "input", "code": null},
            }),
        };
        return finish(&shared, record, 400, body.to_string());
    }
    // Anthropic: checked, dropped from and edited before anything else (a refusal takes no
    // reply and touches no cache).
    let prepared = match api {
        Api::Anthropic => match prepare(&record.headers, &record.body) {
            Ok(prepared) => Some(prepared),
            Err(refusal) => return refuse(&shared, record, refusal),
        },
        Api::OpenAi | Api::Responses => None,
    };
    if let Some(prepared) = &prepared {
        prepared.note(&mut record);
    }
    let (reply, bill, id, tool_base) = {
        let mut inner = lock(&shared);
        let reply = match inner.queue.pop_front() {
            Some(reply) => reply,
            None => inner.default.clone(),
        };
        let answered = matches!(reply.kind, Kind::Answer(_));
        let priced = prepared.as_ref().map_or(&record.body, |p| &p.prompt);
        let bill = price(&mut inner, api, priced, answered);
        inner.next_id += 1;
        let id = inner.next_id;
        let tools = match &reply.kind {
            Kind::Answer(blocks) => blocks
                .iter()
                .filter(|b| matches!(b, Block::ToolUse { id, .. } if id.is_empty()))
                .count() as u64,
            Kind::Error { .. } | Kind::Failed { .. } => 0,
        };
        let tool_base = inner.next_id;
        inner.next_id += tools;
        (reply, bill, id, tool_base)
    };
    if !reply.delay.is_zero() {
        tokio::time::sleep(reply.delay).await;
    }
    let stream = record.body["stream"].as_bool().unwrap_or(false);
    let blocks = match &reply.kind {
        Kind::Answer(blocks) => blocks,
        Kind::Error { status, body } => {
            let response = finish(&shared, record, *status, body.clone());
            return with_headers(response, &reply.headers);
        }
        Kind::Failed { code, message } => {
            let response = if api == Api::Responses && stream {
                let events = responses_failed_events(id, &record.body["model"], code, message);
                let mut response = send(&shared, record, events, true, &reply);
                let headers = response.headers_mut();
                headers.insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("text/event-stream"),
                );
                headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
                response
            } else {
                let body = match api {
                    Api::Anthropic => {
                        json!({"type": "error", "error": {"type": "api_error", "message": message}})
                    }
                    Api::OpenAi | Api::Responses => {
                        json!({"error": {"message": message, "type": "server_error", "param": null, "code": code}})
                    }
                };
                finish(&shared, record, 500, body.to_string())
            };
            return with_headers(response, &reply.headers);
        }
    };
    // Generated tool ids.
    let mut n = tool_base;
    let blocks: Vec<Block> = blocks
        .iter()
        .map(|b| match b {
            Block::ToolUse { id, name, input } if id.is_empty() => {
                n += 1;
                let prefix = if api == Api::Anthropic {
                    "toolu_fake_"
                } else {
                    "call_fake_"
                };
                Block::ToolUse {
                    id: format!("{prefix}{n}"),
                    name: name.clone(),
                    input: input.clone(),
                }
            }
            other => other.clone(),
        })
        .collect();
    let model = record.body["model"]
        .as_str()
        .unwrap_or("fake-model")
        .to_owned();
    let blocks = if api == Api::Anthropic && binds_thinking(&model) {
        bind_answer(&record.body, blocks)
    } else {
        blocks
    };
    let include_usage = record.body["stream_options"]["include_usage"]
        .as_bool()
        .unwrap_or(false);
    let answer = Answer {
        id,
        model,
        blocks,
        stop_reason: reply.stop_reason.clone(),
        bill,
        input_transformations: record.input_transformations.clone(),
        context_management: prepared
            .as_ref()
            .and_then(|p| p.edits.clone())
            .map_or(Value::Null, |edits| json!({"applied_edits": edits})),
    };
    let (usage_value, events) = match api {
        Api::Anthropic => (
            answer.anthropic_usage(),
            if stream {
                answer.anthropic_events()
            } else {
                vec![answer.anthropic_json().to_string().into_bytes()]
            },
        ),
        Api::OpenAi => (
            answer.openai_usage(),
            if stream {
                answer.openai_events(include_usage)
            } else {
                vec![answer.openai_json().to_string().into_bytes()]
            },
        ),
        Api::Responses => (
            answer.responses_usage(),
            if stream {
                answer.responses_events()
            } else {
                vec![answer.responses_json().to_string().into_bytes()]
            },
        ),
    };
    record.usage = usage_value;
    record.bill = Some(bill);
    let content_type = if stream {
        "text/event-stream"
    } else {
        "application/json"
    };
    let response = send(&shared, record, events, stream, &reply);
    let mut response = with_headers(response, &reply.headers);
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    if stream {
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    }
    if let Ok(value) = HeaderValue::from_str(&format!("req_fake_{id}")) {
        headers.insert("request-id", value);
    }
    response
}

/// Records the request and answers `events` (a stream's events, or one JSON body), honouring
/// the reply's cut and pause.
fn send(
    shared: &Shared,
    mut record: Recorded,
    events: Vec<Vec<u8>>,
    stream: bool,
    reply: &Reply,
) -> Response {
    record.status = 200;
    let mut chunks: Vec<Bytes> = events.into_iter().map(Bytes::from).collect();
    let cut = match (reply.cut_after, stream) {
        (None, _) => false,
        (Some(n), true) => {
            chunks.truncate(n);
            true
        }
        (Some(_), false) => {
            let whole = chunks.concat();
            chunks = vec![Bytes::copy_from_slice(&whole[..whole.len() / 2])];
            true
        }
    };
    record.response = Bytes::from(chunks.concat());
    lock(shared).requests.push(record);
    let pause = reply.pause.clone().filter(|_| stream);
    let body = if !cut && pause.is_none() && !stream {
        Body::from(chunks.into_iter().next().unwrap_or_default())
    } else if let Some((at, gate)) = pause {
        let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(chunks.len() + 1);
        tokio::spawn(async move {
            for (i, chunk) in chunks.into_iter().enumerate() {
                if i == at {
                    gate.0.notified().await;
                }
                if tx.send(Ok(chunk)).await.is_err() {
                    return;
                }
            }
        });
        Body::from_stream(Ending::new(
            tokio_stream::wrappers::ReceiverStream::new(rx),
            cut,
        ))
    } else {
        let items: Vec<Result<Bytes, std::io::Error>> = chunks.into_iter().map(Ok).collect();
        Body::from_stream(Ending::new(tokio_stream::iter(items), cut))
    };
    let mut response = Response::new(body);
    *response.status_mut() = StatusCode::OK;
    response
}

/// A body stream that, when `cut`, ends in an error instead of its end: the connection breaks
/// without the chunked body's last chunk. Before the error it answers `Pending` once (waking
/// itself at once), so the server writes out everything sent so far first: the client gets
/// every byte before the cut.
struct Ending<S> {
    inner: S,
    cut: bool,
    flushed: bool,
    done: bool,
}

impl<S> Ending<S> {
    fn new(inner: S, cut: bool) -> Self {
        Self {
            inner,
            cut,
            flushed: false,
            done: false,
        }
    }
}

impl<S> tokio_stream::Stream for Ending<S>
where
    S: tokio_stream::Stream<Item = Result<Bytes, std::io::Error>> + Unpin,
{
    type Item = Result<Bytes, std::io::Error>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.inner).poll_next(cx) {
            Poll::Ready(None) if this.cut => {
                if !this.flushed {
                    this.flushed = true;
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                this.done = true;
                Poll::Ready(Some(Err(std::io::Error::other(
                    "the fake provider cut the stream",
                ))))
            }
            other => other,
        }
    }
}

/// Records the request and answers `status` with a JSON `body`.
fn finish(shared: &Shared, mut record: Recorded, status: u16, body: String) -> Response {
    record.status = status;
    record.response = Bytes::from(body.clone());
    lock(shared).requests.push(record);
    let mut response = Response::new(Body::from(body));
    *response.status_mut() =
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

fn with_headers(mut response: Response, headers: &[(String, String)]) -> Response {
    for (name, value) in headers {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) {
            response.headers_mut().insert(name, value);
        }
    }
    response
}

fn count_tokens(shared: &Shared, mut record: Recorded) -> Response {
    if !record.body["messages"].is_array() {
        let body = json!({
            "type": "error",
            "error": {"type": "invalid_request_error", "message": "messages: Field required"},
        });
        return finish(shared, record, 400, body.to_string());
    }
    let prepared = match prepare(&record.headers, &record.body) {
        Ok(prepared) => prepared,
        Err(refusal) => return refuse(shared, record, refusal),
    };
    prepared.note(&mut record);
    let prompt = prompt_tokens(&prepared.prompt);
    finish(
        shared,
        record,
        200,
        json!({"input_tokens": prompt}).to_string(),
    )
}

// ---------------------------------------------------------------- binding and context editing

/// The beta that lets a request drop thinking blocks bound to another prefix instead of being
/// refused (with `thinking.block_binding.prefix_mismatch_behavior: "drop_block"`).
pub const BINDING_BETA: &str = "thinking-binding-controls-2026-08-01";
/// The beta `context_management` requires.
pub const CONTEXT_MANAGEMENT_BETA: &str = "context-management-2025-06-27";
/// What every signature (and redacted data) the fake makes for a binding model starts with.
pub const SIGNATURE_PREFIX: &str = "fakesig1.";
/// A system block whose text starts with this is no part of a block's prefix: Claude Code
/// changes it on every request.
pub const BILLING_HEADER: &str = "x-anthropic-billing-header:";
/// The thinking a binding model answers with when thinking is on and the reply has none.
pub const THINKING_TEXT: &str = "Thinking it over.";
/// The text a cleared tool result's content holds.
pub const CLEARED_TOOL_RESULT: &str = "[tool result cleared]";
/// The context edits the fake knows.
pub const CLEAR_TOOL_USES: &str = "clear_tool_uses_20250919";
pub const CLEAR_THINKING: &str = "clear_thinking_20251015";
/// `clear_tool_uses_20250919` defaults: fires over this many input tokens, keeps this many
/// tool uses.
pub const CLEAR_TRIGGER_TOKENS: u64 = 100_000;
pub const CLEAR_KEEP_TOOL_USES: u64 = 3;

/// What a refusal for a thinking block bound to another prefix says after its location.
const UNBOUND: &str = concat!(
    "Invalid `signature` in `thinking` block. The block is bound to a different conversation. ",
    "Thinking blocks must be sent back after exactly the prefix they were produced on."
);

/// FNV-1a, 128 bits: stable across Rust releases (unlike `DefaultHasher`) and needs no crate.
const FNV_OFFSET: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
const FNV_PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013b;

/// A running hash of a prompt up to some block.
#[derive(Clone, Copy, Debug)]
struct PrefixHash(u128);

impl PrefixHash {
    fn bytes(mut self, bytes: &[u8]) -> Self {
        for &b in bytes {
            self.0 ^= u128::from(b);
            self.0 = self.0.wrapping_mul(FNV_PRIME);
        }
        self
    }

    /// One record: its tag, a unit separator, the canonical JSON, a newline. Canonical JSON
    /// escapes both separators, so two different record sequences never hash the same bytes.
    fn record(self, tag: &str, value: &Value) -> Self {
        let mut s = String::new();
        canonical(value, &mut s);
        self.bytes(tag.as_bytes())
            .bytes(b"\x1f")
            .bytes(s.as_bytes())
            .bytes(b"\n")
    }

    /// A thinking block's signature (`Some(text)`) or a redacted block's data (`None`) here.
    fn sign(self, thinking: Option<&str>) -> String {
        let end = match thinking {
            Some(text) => self.record("thinking", &Value::String(text.to_owned())),
            None => self.record("redacted_thinking", &Value::Null),
        };
        format!("{SIGNATURE_PREFIX}{:032x}", end.0)
    }
}

/// A message's content as blocks: a string is one text block, anything else none.
fn content_blocks(message: &Value) -> Vec<Value> {
    match &message["content"] {
        Value::String(text) => vec![text_block(text)],
        Value::Array(blocks) => blocks.clone(),
        _ => Vec::new(),
    }
}

fn is_thinking(block: &Value) -> bool {
    matches!(
        block["type"].as_str(),
        Some("thinking" | "redacted_thinking")
    )
}

/// Walks `body`'s prompt as a block's prefix reads it: tools, system (the billing header left
/// out), then per message its blocks and, after them, its role (a prefix holds the roles of
/// the messages before its block's, not that one's own: putting the role last makes every
/// prefix a start of one walk). `visit` gets each block of `messages` with the hash of its
/// prefix. Gives the hash at the start of each message and, last, after every message (where
/// an answer's message starts).
fn walk_prefixes(
    body: &Value,
    mut visit: impl FnMut(usize, usize, &Value, PrefixHash),
) -> Vec<PrefixHash> {
    let mut h = PrefixHash(FNV_OFFSET);
    for tool in body["tools"].as_array().into_iter().flatten() {
        h = h.record("tool", tool);
    }
    let system = match &body["system"] {
        Value::String(text) => vec![text_block(text)],
        Value::Array(blocks) => blocks.clone(),
        _ => Vec::new(),
    };
    for block in &system {
        let billing = block["text"]
            .as_str()
            .is_some_and(|t| t.starts_with(BILLING_HEADER));
        if !billing {
            h = h.record("system", block);
        }
    }
    let mut starts = Vec::new();
    for (n, message) in body["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        starts.push(h);
        for (m, block) in content_blocks(message).iter().enumerate() {
            visit(n, m, block, h);
            h = h.record("block", block);
        }
        h = h.record("role", &message["role"]);
    }
    starts.push(h);
    starts
}

/// The signature a binding model gives (and expects of) a thinking block whose text is
/// `thinking` at `messages[message].content[index]` of `body`, or with `None` the `data` of a
/// redacted_thinking block there. `message` may be `messages.len()`: the answer's message (no
/// blocks before `index` then); blocks past the end of a message's content are not there.
pub fn thinking_signature(
    body: &Value,
    message: usize,
    index: usize,
    thinking: Option<&str>,
) -> String {
    let starts = walk_prefixes(body, |_, _, _, _| {});
    let mut h = starts[message.min(starts.len() - 1)];
    let before = body["messages"]
        .get(message)
        .map(content_blocks)
        .unwrap_or_default();
    for block in before.iter().take(index) {
        h = h.record("block", block);
    }
    h.sign(thinking)
}

/// Whether a block carries what [`thinking_signature`] gives it at `h` (any block but
/// thinking and redacted_thinking does).
fn bound_at(block: &Value, h: PrefixHash) -> bool {
    match block["type"].as_str() {
        Some("thinking") => block["thinking"]
            .as_str()
            .is_some_and(|text| block["signature"].as_str() == Some(&h.sign(Some(text)))),
        Some("redacted_thinking") => block["data"].as_str() == Some(&h.sign(None)),
        _ => true,
    }
}

fn thinking_on(body: &Value) -> bool {
    matches!(
        body["thinking"]["type"].as_str(),
        Some("enabled" | "adaptive")
    )
}

/// The answer of a binding model to `body`: a thinking block first when thinking is on and
/// `blocks` has none, and every thinking block signed (redacted data made) on its prefix, the
/// answer's message being the one after the request's last.
fn bind_answer(body: &Value, mut blocks: Vec<Block>) -> Vec<Block> {
    let thinks = blocks
        .iter()
        .any(|b| matches!(b, Block::Thinking { .. } | Block::RedactedThinking(_)));
    if thinking_on(body) && !thinks {
        let text = if body["thinking"]["display"] == "omitted" {
            ""
        } else {
            THINKING_TEXT
        };
        blocks.insert(
            0,
            Block::Thinking {
                thinking: text.into(),
                signature: String::new(),
            },
        );
    }
    let starts = walk_prefixes(body, |_, _, _, _| {});
    let mut h = starts[starts.len() - 1];
    for block in &mut blocks {
        match block {
            Block::Thinking {
                thinking,
                signature,
            } => *signature = h.sign(Some(thinking)),
            Block::RedactedThinking(data) => *data = h.sign(None),
            Block::Text(_) | Block::ToolUse { .. } => {}
        }
        h = h.record("block", &Answer::anthropic_block(block));
    }
    blocks
}

/// The values of every `anthropic-beta` header line, split on commas.
fn betas(headers: &HeaderMap) -> Vec<String> {
    headers
        .get_all("anthropic-beta")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|b| b.trim().to_owned())
        .filter(|b| !b.is_empty())
        .collect()
}

/// Tokens of a prompt as priced: every block of [`anthropic_units`].
fn prompt_tokens(body: &Value) -> u64 {
    anthropic_units(body).iter().map(|u| u.tokens).sum()
}

/// An Anthropic request made ready for the model.
struct Prepared {
    /// The body with `messages` as the model sees them: what is priced and counted.
    prompt: Value,
    /// The thinking blocks dropped (`input_transformations` entries).
    dropped: Vec<Value>,
    /// The edits applied (`applied_edits` entries); `None` without `context_management`.
    edits: Option<Vec<Value>>,
}

impl Prepared {
    fn note(&self, record: &mut Recorded) {
        record.prompt = self.prompt["messages"].clone();
        if !self.dropped.is_empty() {
            record.input_transformations = Value::Array(self.dropped.clone());
        }
        if let Some(edits) = &self.edits {
            record.applied_edits = Value::Array(edits.clone());
        }
    }
}

/// A request refused with 400 and this Anthropic error `message`; `binding`: for a thinking
/// block bound to another prefix (counted by [`FakeProvider::refusals`]).
struct Refusal {
    binding: bool,
    message: String,
}

fn refuse(shared: &Shared, record: Recorded, refusal: Refusal) -> Response {
    if refusal.binding {
        lock(shared).refusals += 1;
    }
    let body = json!({
        "type": "error",
        "error": {"type": "invalid_request_error", "message": refusal.message},
    });
    finish(shared, record, 400, body.to_string())
}

/// Checks an Anthropic request and gives the prompt the model sees, as the module's docs state:
/// the binding check (refusal or drops), then `context_management` checked and its edits (and
/// the default thinking clearing) applied in order.
fn prepare(headers: &HeaderMap, body: &Value) -> Result<Prepared, Refusal> {
    let betas = betas(headers);
    let beta = |name: &str| betas.iter().any(|b| b == name);
    let mut prompt = body.clone();
    let mut dropped = Vec::new();
    if binds_thinking(body["model"].as_str().unwrap_or_default()) {
        let mut first = None;
        walk_prefixes(body, |n, m, block, h| {
            if first.is_none() && !bound_at(block, h) {
                first = Some((n, m));
            }
        });
        if let Some(first) = first {
            let drop = beta(BINDING_BETA)
                && body["thinking"]["block_binding"]["prefix_mismatch_behavior"] == "drop_block";
            if !drop {
                let (n, m) = first;
                return Err(Refusal {
                    binding: true,
                    message: format!("messages.{n}.content.{m}: {UNBOUND}"),
                });
            }
            // The first unbound block and every later thinking block: a later block's prefix
            // holds the dropped one, so it could not be bound either.
            let messages = prompt["messages"].as_array_mut().into_iter().flatten();
            for (n, message) in messages.enumerate() {
                let Some(blocks) = message["content"].as_array_mut() else {
                    continue;
                };
                let mut m = 0;
                blocks.retain(|block| {
                    let at = (n, m);
                    m += 1;
                    let gone = at >= first && is_thinking(block);
                    if gone {
                        dropped.push(json!({
                            "type": "thinking_block_dropped",
                            "message_index": at.0,
                            "content_index": at.1,
                            "reason": "prefix_mismatch",
                        }));
                    }
                    !gone
                });
            }
        }
    }
    let management = &body["context_management"];
    let managed = !management.is_null();
    if managed && !beta(CONTEXT_MANAGEMENT_BETA) {
        return Err(Refusal {
            binding: false,
            message: format!(
                "context_management: requires the anthropic-beta header {CONTEXT_MANAGEMENT_BETA}"
            ),
        });
    }
    let edits = management["edits"]
        .as_array()
        .map_or(&[][..], Vec::as_slice);
    for (i, edit) in edits.iter().enumerate() {
        let message = match edit["type"].as_str() {
            Some(CLEAR_TOOL_USES) => continue,
            Some(CLEAR_THINKING) if i == 0 => continue,
            Some(CLEAR_THINKING) => format!("{CLEAR_THINKING} must be the first edit"),
            _ => format!(
                "unknown edit type {} (expected {CLEAR_TOOL_USES} or {CLEAR_THINKING})",
                edit["type"]
            ),
        };
        return Err(Refusal {
            binding: false,
            message: format!("context_management.edits.{i}: {message}"),
        });
    }
    // With thinking on, the API keeps the thinking of the last turn only unless told otherwise.
    if thinking_on(body) && !edits.iter().any(|e| e["type"] == CLEAR_THINKING) {
        clear_thinking(&mut prompt, 1);
    }
    let mut applied = Vec::new();
    for edit in edits {
        let entry = if edit["type"] == CLEAR_THINKING {
            clear_thinking_edit(&mut prompt, edit)
        } else {
            clear_tool_uses(&mut prompt, edit)
        };
        applied.extend(entry);
    }
    Ok(Prepared {
        prompt,
        dropped,
        edits: managed.then_some(applied),
    })
}

/// Each message's assistant turn, numbered from 0 (`None` for other messages): a turn is the
/// run of assistant messages since the last user message that holds anything but tool_result
/// blocks (tool results continue the turn that called the tools).
fn assistant_turns(messages: &[Value]) -> Vec<Option<usize>> {
    let mut turns = 0;
    let mut open = false;
    messages
        .iter()
        .map(|message| {
            if message["role"] == "assistant" {
                if !open {
                    open = true;
                    turns += 1;
                }
                Some(turns - 1)
            } else {
                let asks = content_blocks(message)
                    .iter()
                    .any(|b| b["type"] != "tool_result");
                if message["role"] == "user" && asks {
                    open = false;
                }
                None
            }
        })
        .collect()
}

/// Removes the thinking blocks of every assistant turn but the newest `keep`; gives the number
/// of turns that lost some.
fn clear_thinking(prompt: &mut Value, keep: usize) -> usize {
    let Some(messages) = prompt["messages"].as_array_mut() else {
        return 0;
    };
    let turns = assistant_turns(messages);
    let total = turns.iter().flatten().max().map_or(0, |t| t + 1);
    let mut cleared = Vec::new();
    for (message, turn) in messages.iter_mut().zip(turns) {
        let Some(turn) = turn.filter(|t| t.saturating_add(keep) < total) else {
            continue;
        };
        if let Some(blocks) = message["content"].as_array_mut() {
            let before = blocks.len();
            blocks.retain(|b| !is_thinking(b));
            if blocks.len() < before && !cleared.contains(&turn) {
                cleared.push(turn);
            }
        }
    }
    cleared.len()
}

/// A `clear_thinking_20251015` edit; its `applied_edits` entry when it cleared something.
fn clear_thinking_edit(prompt: &mut Value, edit: &Value) -> Option<Value> {
    let keep = &edit["keep"];
    if keep == "all" {
        return None;
    }
    let keep = if keep["type"] == "thinking_turns" {
        keep["value"].as_u64().unwrap_or(1) as usize
    } else {
        1
    };
    let before = prompt_tokens(prompt);
    let turns = clear_thinking(prompt, keep);
    (turns > 0).then(|| {
        json!({
            "type": CLEAR_THINKING,
            "cleared_thinking_turns": turns,
            "cleared_input_tokens": before.saturating_sub(prompt_tokens(prompt)),
        })
    })
}

/// A tool use: where its tool_use block is, its name, and where the tool_result answering it is.
struct ToolUse {
    at: (usize, usize),
    name: String,
    result: Option<(usize, usize)>,
}

/// The tool_use blocks of assistant messages in order, each with the first later tool_result
/// of the same id.
fn tool_uses(messages: &[Value]) -> Vec<ToolUse> {
    let mut uses = Vec::new();
    for (n, message) in messages.iter().enumerate() {
        if message["role"] != "assistant" {
            continue;
        }
        for (m, block) in content_blocks(message).iter().enumerate() {
            if block["type"] != "tool_use" {
                continue;
            }
            let result = messages
                .iter()
                .enumerate()
                .skip(n + 1)
                .find_map(|(k, later)| {
                    let blocks = later["content"].as_array()?;
                    let j = blocks.iter().position(|b| {
                        b["type"] == "tool_result" && b["tool_use_id"] == block["id"]
                    })?;
                    Some((k, j))
                });
            uses.push(ToolUse {
                at: (n, m),
                name: block["name"].as_str().unwrap_or_default().to_owned(),
                result,
            });
        }
    }
    uses
}

/// A `clear_tool_uses_20250919` edit; its `applied_edits` entry when it cleared something.
fn clear_tool_uses(prompt: &mut Value, edit: &Value) -> Option<Value> {
    let uses = tool_uses(prompt["messages"].as_array()?);
    let trigger = &edit["trigger"];
    let fires = match trigger["value"].as_u64() {
        Some(limit) if trigger["type"] == "tool_uses" => uses.len() as u64 > limit,
        Some(limit) => prompt_tokens(prompt) > limit,
        None => prompt_tokens(prompt) > CLEAR_TRIGGER_TOKENS,
    };
    if !fires {
        return None;
    }
    let keep = edit["keep"]["value"]
        .as_u64()
        .unwrap_or(CLEAR_KEEP_TOOL_USES) as usize;
    let named = |list: &Value, name: &str| {
        list.as_array()
            .is_some_and(|names| names.iter().any(|n| n == name))
    };
    let inputs = &edit["clear_tool_inputs"];
    let cleared: Vec<&ToolUse> = uses[..uses.len().saturating_sub(keep)]
        .iter()
        .filter(|u| !named(&edit["exclude_tools"], &u.name))
        .collect();
    if cleared.is_empty() {
        return None;
    }
    let mut edited = prompt.clone();
    for u in &cleared {
        if let Some((n, m)) = u.result {
            let old = &edited["messages"][n]["content"][m];
            let mut new = json!({
                "type": "tool_result",
                "tool_use_id": old["tool_use_id"],
                "content": [text_block(CLEARED_TOOL_RESULT)],
            });
            for key in ["is_error", "cache_control"] {
                if let Some(v) = old.get(key) {
                    new[key] = v.clone();
                }
            }
            edited["messages"][n]["content"][m] = new;
        }
        if *inputs == true || named(inputs, &u.name) {
            let (n, m) = u.at;
            edited["messages"][n]["content"][m]["input"] = json!({});
        }
    }
    // A placeholder can outweigh a tiny result: then nothing was cleared, in tokens.
    let freed = prompt_tokens(prompt) as i64 - prompt_tokens(&edited) as i64;
    if let Some(least) = edit["clear_at_least"]["value"].as_u64()
        && freed < least as i64
    {
        return None;
    }
    *prompt = edited;
    Some(json!({
        "type": CLEAR_TOOL_USES,
        "cleared_tool_uses": cleared.len(),
        "cleared_input_tokens": freed.max(0),
    }))
}

// ---------------------------------------------------------------- tokens and the cache

/// `value` without `cache_control` keys, at any depth.
fn strip_cache_control(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(k, _)| k.as_str() != "cache_control")
                .map(|(k, v)| (k.clone(), strip_cache_control(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(strip_cache_control).collect()),
        other => other.clone(),
    }
}

/// ceil(chars of the compact serialisation / 4), `cache_control` keys removed; null: 0.
pub fn tokens_of(value: &Value) -> u64 {
    if value.is_null() {
        return 0;
    }
    let chars = strip_cache_control(value).to_string().chars().count() as u64;
    chars.div_ceil(4)
}

fn text_tokens(s: &str) -> u64 {
    (s.chars().count() as u64).div_ceil(4)
}

/// A canonical serialisation (keys sorted, `cache_control` removed), for hashing.
fn canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().filter(|k| *k != "cache_control").collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                canonical(&map[k], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical(v, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// Anthropic's default lifetime of an entry, and OpenAI's in-memory retention.
pub const FIVE_MINUTES: Duration = Duration::from_secs(5 * 60);
/// Anthropic's lifetime for a `"ttl": "1h"` marker.
pub const ONE_HOUR: Duration = Duration::from_secs(60 * 60);
/// OpenAI's extended retention (`prompt_cache_retention: "24h"`).
pub const ONE_DAY: Duration = Duration::from_secs(24 * 60 * 60);
/// Anthropic: breakpoints honoured in one request.
pub const MAX_BREAKPOINTS: usize = 4;
/// Anthropic: blocks a breakpoint looks back over for an entry, itself included.
pub const LOOKBACK: usize = 20;
/// OpenAI: the shortest prefix cached, and the step a cached prefix grows by.
pub const MIN_CACHED: u64 = 1024;
pub const CACHE_STEP: u64 = 128;

/// Price of an uncached input token, of one written for 5 minutes and of one written for 1 hour
/// (Anthropic's multipliers of the base input price, the same for every model).
pub const INPUT_PRICE: f64 = 1.0;
pub const WRITE_5M_PRICE: f64 = 1.25;
pub const WRITE_1H_PRICE: f64 = 2.0;
/// The read price of a model [`read_price`] names no other price for (and of OpenAI's).
pub const DEFAULT_READ_PRICE: f64 = 0.1;

/// Read prices by model prefix ([`read_price`]).
const READ_PRICES: &[(&str, f64)] = &[
    ("claude-fable-5-1", 0.025),
    ("claude-fable-5-2", 0.025),
    ("claude-mythos-5-1", 0.025),
    ("claude-mythos-5-2", 0.025),
    ("claude-opus-5-5", 0.05),
    ("claude-sonnet-5-5", 0.05),
    ("claude-haiku-5-5", 0.05),
];

/// The models whose thinking blocks are bound to their prefix ([`binds_thinking`]).
const BINDING_MODELS: &[&str] = &[
    "claude-fable-5-1",
    "claude-fable-5-2",
    "claude-mythos-5-1",
    "claude-mythos-5-2",
    "claude-opus-5-5",
    "claude-sonnet-5-5",
    "claude-haiku-5-5",
];

/// `model` lower-cased, without a `provider/` prefix (what the prefix tables match).
fn model_name(model: &str) -> String {
    let model = model.to_lowercase();
    match model.rsplit_once('/') {
        Some((_, name)) => name.to_owned(),
        None => model,
    }
}

/// The price of a token read from the cache for `model`, relative to an uncached one: the
/// longest prefix of [`READ_PRICES`] matching the lower-cased model (a `provider/` prefix
/// stripped), else [`DEFAULT_READ_PRICE`].
pub fn read_price(model: &str) -> f64 {
    let name = model_name(model);
    READ_PRICES
        .iter()
        .filter(|(prefix, _)| name.starts_with(prefix))
        .max_by_key(|(prefix, _)| prefix.len())
        .map_or(DEFAULT_READ_PRICE, |(_, price)| *price)
}

/// Whether `model`'s thinking blocks are bound to the prefix they were produced on (matched as
/// [`read_price`] matches: lower-cased, a `provider/` prefix stripped, dated ids included).
pub fn binds_thinking(model: &str) -> bool {
    let name = model_name(model);
    BINDING_MODELS.iter().any(|prefix| name.starts_with(prefix))
}

/// An answered call's input tokens by price. Anthropic fills every field; OpenAI only `input`
/// and `read` (it charges no writes).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bill {
    /// Neither read nor written (Anthropic's `input_tokens`; OpenAI's prompt less the cached).
    pub input: u64,
    /// Written to the cache for 5 minutes, and for 1 hour.
    pub write_5m: u64,
    pub write_1h: u64,
    /// Read from the cache.
    pub read: u64,
    /// What a read token cost relative to an uncached one: [`read_price`] of the request's model
    /// (Anthropic), [`DEFAULT_READ_PRICE`] for OpenAI and by default.
    pub read_price: f64,
}

impl Default for Bill {
    fn default() -> Self {
        Self {
            input: 0,
            write_5m: 0,
            write_1h: 0,
            read: 0,
            read_price: DEFAULT_READ_PRICE,
        }
    }
}

impl Bill {
    /// Every input token, whatever its price.
    pub fn prompt(&self) -> u64 {
        self.input + self.write_5m + self.write_1h + self.read
    }

    /// Input tokens weighted by price: uncached 1×, 5-minute writes 1.25×, 1-hour writes 2×,
    /// reads at [`Bill::read_price`].
    pub fn cost(&self) -> f64 {
        self.cost_at(self.read_price)
    }

    /// The same tokens with reads priced at `read` (a model with another read price).
    pub fn cost_at(&self, read: f64) -> f64 {
        INPUT_PRICE * self.input as f64
            + WRITE_5M_PRICE * self.write_5m as f64
            + WRITE_1H_PRICE * self.write_1h as f64
            + read * self.read as f64
    }
}

/// One unit of a prompt as a cache sees it: a block (Anthropic) or an item (OpenAI).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unit {
    /// A hash of the prompt's scope (API, model, cache key) and of every unit up to and
    /// including this one: the key of an entry for this prefix.
    pub prefix: u64,
    pub tokens: u64,
    /// The lifetime its `cache_control` marker asks for; `None` without one.
    pub marker: Option<Duration>,
}

/// Builds a prompt's units, each hash chained on the ones before it.
struct Chain {
    hash: u64,
    units: Vec<Unit>,
}

impl Chain {
    fn new(scope: &Value) -> Self {
        let mut s = String::new();
        canonical(scope, &mut s);
        let mut h = DefaultHasher::new();
        s.hash(&mut h);
        Chain {
            hash: h.finish(),
            units: Vec::new(),
        }
    }

    /// Adds `value`; `tag` (a role, "tool", "system"...) is hashed with it but counts no tokens.
    fn push(&mut self, tag: Option<&str>, value: &Value, marker: Option<Duration>) {
        // The canonical form has the compact serialisation's length (keys only reordered), so
        // one pass gives both the hash and the tokens.
        let mut s = String::new();
        canonical(value, &mut s);
        let mut h = DefaultHasher::new();
        self.hash.hash(&mut h);
        tag.hash(&mut h);
        s.hash(&mut h);
        self.hash = h.finish();
        self.units.push(Unit {
            prefix: self.hash,
            tokens: (s.chars().count() as u64).div_ceil(4),
            marker,
        });
    }
}

/// A block's own marker's lifetime.
fn marker_of(block: &Value) -> Option<Duration> {
    let marker = block.get("cache_control").filter(|m| !m.is_null())?;
    Some(if marker["ttl"] == "1h" {
        ONE_HOUR
    } else {
        FIVE_MINUTES
    })
}

/// The blocks of an Anthropic Messages body, in prompt order: tools, system, then each
/// message's content (a string being one text block).
pub fn anthropic_units(body: &Value) -> Vec<Unit> {
    let mut chain = Chain::new(&json!(["anthropic", body["model"]]));
    for tool in body["tools"].as_array().into_iter().flatten() {
        chain.push(Some("tool"), tool, marker_of(tool));
    }
    match &body["system"] {
        Value::String(text) => chain.push(Some("system"), &text_block(text), None),
        Value::Array(blocks) => {
            for block in blocks {
                chain.push(Some("system"), block, marker_of(block));
            }
        }
        _ => {}
    }
    for message in body["messages"].as_array().into_iter().flatten() {
        let role = message["role"].as_str().unwrap_or_default();
        match &message["content"] {
            Value::String(text) => chain.push(Some(role), &text_block(text), None),
            Value::Array(blocks) => {
                for (i, block) in blocks.iter().enumerate() {
                    chain.push((i == 0).then_some(role), block, marker_of(block));
                }
            }
            _ => {}
        }
    }
    chain.units
}

fn text_block(text: &str) -> Value {
    json!({"type": "text", "text": text})
}

/// The items of an OpenAI body (`responses`: a Responses body, else chat completions), in
/// prompt order: tools, instructions, then each message or input item; scoped by the API, the
/// model and the `prompt_cache_key`.
pub fn openai_units(body: &Value, responses: bool) -> Vec<Unit> {
    let api = if responses { "responses" } else { "chat" };
    let mut chain = Chain::new(&json!([api, body["model"], body["prompt_cache_key"]]));
    if !body["tools"].is_null() {
        chain.push(Some("tools"), &body["tools"], None);
    }
    if responses && !body["instructions"].is_null() {
        chain.push(Some("instructions"), &body["instructions"], None);
    }
    let items = if responses {
        &body["input"]
    } else {
        &body["messages"]
    };
    match items {
        Value::String(text) => {
            chain.push(None, &json!({"role": "user", "content": text}), None);
        }
        Value::Array(items) => {
            for item in items {
                chain.push(None, item, None);
            }
        }
        _ => {}
    }
    chain.units
}

/// How long an OpenAI request's prefixes stay cached.
pub fn prefix_retention(body: &Value) -> Duration {
    if body["prompt_cache_retention"] == "24h" {
        ONE_DAY
    } else {
        FIVE_MINUTES
    }
}

/// One cached prefix: live while the clock is before `expires`; reads and writes push that to
/// at least now + `life`.
#[derive(Clone, Copy, Debug)]
struct Entry {
    expires: Duration,
    life: Duration,
}

#[derive(Clone, Debug, Default)]
struct Entries(HashMap<u64, Entry>);

impl Entries {
    fn live(&self, key: u64, now: Duration) -> bool {
        self.0.get(&key).is_some_and(|e| now < e.expires)
    }

    /// Writes the entry, or refreshes a live one (never shortening it).
    fn write(&mut self, key: u64, now: Duration, life: Duration) {
        let fresh = Entry {
            expires: now + life,
            life,
        };
        let e = self.0.entry(key).or_insert(fresh);
        if now >= e.expires {
            *e = fresh;
        }
        e.life = e.life.max(life);
        e.expires = e.expires.max(now + e.life);
    }

    fn touch(&mut self, key: u64, now: Duration) {
        if let Some(e) = self.0.get_mut(&key) {
            e.expires = e.expires.max(now + e.life);
        }
    }

    fn forget_expired(&mut self, now: Duration) {
        self.0.retain(|_, e| now < e.expires);
    }
}

/// Anthropic's cache, the breakpoint model of the module's docs.
#[derive(Clone, Debug, Default)]
pub struct BreakpointCache {
    entries: Entries,
}

impl BreakpointCache {
    /// What a request of `blocks` ([`anthropic_units`]) costs at `now`; `answered`: it was
    /// answered with a message, so it writes its breakpoints and refreshes what it read. Reads
    /// are billed at [`DEFAULT_READ_PRICE`] (the blocks name no model): set
    /// [`Bill::read_price`] to the model's [`read_price`], as the fake does.
    pub fn price(&mut self, now: Duration, blocks: &[Unit], answered: bool) -> Bill {
        let total: u64 = blocks.iter().map(|u| u.tokens).sum();
        let breakpoints: Vec<usize> = (0..blocks.len())
            .filter(|&i| blocks[i].marker.is_some())
            .take(MAX_BREAKPOINTS)
            .collect();
        let Some(&last) = breakpoints.last() else {
            return Bill {
                input: total,
                ..Bill::default()
            };
        };
        // Tokens of the blocks up to and including each.
        let upto: Vec<u64> = blocks
            .iter()
            .scan(0, |sum, u| {
                *sum += u.tokens;
                Some(*sum)
            })
            .collect();
        let read_at = breakpoints
            .iter()
            .filter_map(|&b| {
                (b.saturating_sub(LOOKBACK - 1)..=b)
                    .rev()
                    .find(|&i| self.entries.live(blocks[i].prefix, now))
            })
            .max();
        let read = read_at.map_or(0, |i| upto[i]);
        let mut bill = Bill {
            input: total - upto[last],
            read,
            ..Bill::default()
        };
        // Each stretch written is charged at the lifetime of the breakpoint that ends it.
        let mut from = read;
        for &b in &breakpoints {
            if upto[b] > from {
                if blocks[b].marker >= Some(ONE_HOUR) {
                    bill.write_1h += upto[b] - from;
                } else {
                    bill.write_5m += upto[b] - from;
                }
                from = upto[b];
            }
        }
        if answered {
            if let Some(i) = read_at {
                self.entries.touch(blocks[i].prefix, now);
            }
            for &b in &breakpoints {
                let life = blocks[b].marker.unwrap_or(FIVE_MINUTES);
                self.entries.write(blocks[b].prefix, now, life);
            }
        }
        bill
    }

    /// Drops the entries no longer live at `now` (they could never be read again).
    pub fn forget_expired(&mut self, now: Duration) {
        self.entries.forget_expired(now);
    }
}

/// OpenAI's cache, the automatic prefix model of the module's docs.
#[derive(Clone, Debug, Default)]
pub struct PrefixCache {
    entries: Entries,
}

impl PrefixCache {
    /// What a request of `items` ([`openai_units`], or any units: markers are ignored) costs at
    /// `now`; `answered`: it was answered with a message, so every prefix of it is written or
    /// refreshed to live `life` ([`prefix_retention`]).
    pub fn price(&mut self, now: Duration, items: &[Unit], life: Duration, answered: bool) -> Bill {
        let total: u64 = items.iter().map(|u| u.tokens).sum();
        let matched: u64 = items
            .iter()
            .take_while(|u| self.entries.live(u.prefix, now))
            .map(|u| u.tokens)
            .sum();
        let read = if matched < MIN_CACHED {
            0
        } else {
            matched / CACHE_STEP * CACHE_STEP
        };
        if answered {
            for u in items {
                self.entries.write(u.prefix, now, life);
            }
        }
        Bill {
            input: total - read,
            read,
            ..Bill::default()
        }
    }

    /// Drops the entries no longer live at `now`.
    pub fn forget_expired(&mut self, now: Duration) {
        self.entries.forget_expired(now);
    }
}

/// Prices a model request on `api` at the fake's clock, updating its cache when `answered`.
/// Anthropic: `body` is the prompt as the model sees it (after drops and edits), its reads at
/// its model's price.
fn price(inner: &mut Inner, api: Api, body: &Value, answered: bool) -> Bill {
    let now = inner.now;
    match api {
        Api::Anthropic => Bill {
            read_price: read_price(body["model"].as_str().unwrap_or_default()),
            ..inner
                .breakpoints
                .price(now, &anthropic_units(body), answered)
        },
        Api::OpenAi | Api::Responses => {
            let items = openai_units(body, api == Api::Responses);
            inner
                .prefixes
                .price(now, &items, prefix_retention(body), answered)
        }
    }
}

// ---------------------------------------------------------------- answers

struct Answer {
    id: u64,
    model: String,
    blocks: Vec<Block>,
    stop_reason: Option<String>,
    bill: Bill,
    /// Anthropic: the `input_transformations` array and the `context_management` object to
    /// report; `Value::Null` when there is none.
    input_transformations: Value,
    context_management: Value,
}

fn sse(event: &str, data: &Value) -> Vec<u8> {
    format!("event: {event}\ndata: {data}\n\n").into_bytes()
}

fn data_line(data: &Value) -> Vec<u8> {
    format!("data: {data}\n\n").into_bytes()
}

/// `s` in up to three pieces, split on character boundaries (one empty piece for "").
fn pieces(s: &str) -> Vec<String> {
    let chars: Vec<char> = s.chars().collect();
    if chars.is_empty() {
        return vec![String::new()];
    }
    let size = chars.len().div_ceil(3);
    chars.chunks(size).map(|c| c.iter().collect()).collect()
}

impl Answer {
    fn calls_tool(&self) -> bool {
        self.blocks
            .iter()
            .any(|b| matches!(b, Block::ToolUse { .. }))
    }

    fn output_tokens(&self) -> u64 {
        let n: u64 = self
            .blocks
            .iter()
            .map(|b| match b {
                Block::Text(t) => text_tokens(t),
                Block::ToolUse { input, .. } => tokens_of(input),
                Block::Thinking {
                    thinking,
                    signature,
                } => text_tokens(thinking) + text_tokens(signature),
                Block::RedactedThinking(data) => text_tokens(data),
            })
            .sum();
        n.max(1)
    }

    // ------------------------------------------------ Anthropic

    fn message_id(&self) -> String {
        format!("msg_fake_{}", self.id)
    }

    fn anthropic_stop(&self) -> String {
        self.stop_reason.clone().unwrap_or_else(|| {
            if self.calls_tool() {
                "tool_use"
            } else {
                "end_turn"
            }
            .into()
        })
    }

    fn anthropic_usage(&self) -> Value {
        let bill = &self.bill;
        json!({
            "input_tokens": bill.input,
            "cache_creation_input_tokens": bill.write_5m + bill.write_1h,
            "cache_read_input_tokens": bill.read,
            "cache_creation": {
                "ephemeral_5m_input_tokens": bill.write_5m,
                "ephemeral_1h_input_tokens": bill.write_1h,
            },
            "output_tokens": self.output_tokens(),
        })
    }

    fn anthropic_block(block: &Block) -> Value {
        match block {
            Block::Text(text) => json!({"type": "text", "text": text}),
            Block::ToolUse { id, name, input } => {
                json!({"type": "tool_use", "id": id, "name": name, "input": input})
            }
            Block::Thinking {
                thinking,
                signature,
            } => json!({"type": "thinking", "thinking": thinking, "signature": signature}),
            Block::RedactedThinking(data) => json!({"type": "redacted_thinking", "data": data}),
        }
    }

    fn anthropic_json(&self) -> Value {
        let mut message = json!({
            "id": self.message_id(),
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": self.blocks.iter().map(Self::anthropic_block).collect::<Vec<_>>(),
            "stop_reason": self.anthropic_stop(),
            "stop_sequence": null,
            "usage": self.anthropic_usage(),
        });
        if !self.input_transformations.is_null() {
            message["input_transformations"] = self.input_transformations.clone();
        }
        if !self.context_management.is_null() {
            message["context_management"] = self.context_management.clone();
        }
        message
    }

    fn anthropic_events(&self) -> Vec<Vec<u8>> {
        let mut start_usage = self.anthropic_usage();
        start_usage["output_tokens"] = json!(1);
        let mut start = json!({
            "id": self.message_id(),
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": null,
            "stop_sequence": null,
            "usage": start_usage,
        });
        if !self.input_transformations.is_null() {
            start["input_transformations"] = self.input_transformations.clone();
        }
        let mut events = vec![
            sse(
                "message_start",
                &json!({"type": "message_start", "message": start}),
            ),
            sse("ping", &json!({"type": "ping"})),
        ];
        for (index, block) in self.blocks.iter().enumerate() {
            let start = match block {
                Block::Text(_) => json!({"type": "text", "text": ""}),
                Block::ToolUse { id, name, .. } => {
                    json!({"type": "tool_use", "id": id, "name": name, "input": {}})
                }
                Block::Thinking { .. } => json!({"type": "thinking", "thinking": ""}),
                Block::RedactedThinking(data) => {
                    json!({"type": "redacted_thinking", "data": data})
                }
            };
            events.push(sse(
                "content_block_start",
                &json!({"type": "content_block_start", "index": index, "content_block": start}),
            ));
            let deltas: Vec<Value> = match block {
                Block::Text(text) => pieces(text)
                    .into_iter()
                    .map(|p| json!({"type": "text_delta", "text": p}))
                    .collect(),
                Block::ToolUse { input, .. } => pieces(&input.to_string())
                    .into_iter()
                    .map(|p| json!({"type": "input_json_delta", "partial_json": p}))
                    .collect(),
                Block::Thinking {
                    thinking,
                    signature,
                } => pieces(thinking)
                    .into_iter()
                    .map(|p| json!({"type": "thinking_delta", "thinking": p}))
                    .chain(std::iter::once(
                        json!({"type": "signature_delta", "signature": signature}),
                    ))
                    .collect(),
                Block::RedactedThinking(_) => Vec::new(),
            };
            for delta in deltas {
                events.push(sse(
                    "content_block_delta",
                    &json!({"type": "content_block_delta", "index": index, "delta": delta}),
                ));
            }
            events.push(sse(
                "content_block_stop",
                &json!({"type": "content_block_stop", "index": index}),
            ));
        }
        let mut delta = json!({
            "type": "message_delta",
            "delta": {"stop_reason": self.anthropic_stop(), "stop_sequence": null},
            "usage": {"output_tokens": self.output_tokens()},
        });
        if !self.context_management.is_null() {
            delta["context_management"] = self.context_management.clone();
        }
        events.push(sse("message_delta", &delta));
        events.push(sse("message_stop", &json!({"type": "message_stop"})));
        events
    }

    // ------------------------------------------------ OpenAI

    fn completion_id(&self) -> String {
        format!("chatcmpl-fake-{}", self.id)
    }

    fn openai_stop(&self) -> String {
        self.stop_reason.clone().unwrap_or_else(|| {
            if self.calls_tool() {
                "tool_calls"
            } else {
                "stop"
            }
            .into()
        })
    }

    fn openai_usage(&self) -> Value {
        let completion = self.output_tokens();
        json!({
            "prompt_tokens": self.bill.prompt(),
            "completion_tokens": completion,
            "total_tokens": self.bill.prompt() + completion,
            "prompt_tokens_details": {"cached_tokens": self.bill.read},
        })
    }

    fn openai_text(&self) -> Option<String> {
        let texts: Vec<&str> = self
            .blocks
            .iter()
            .filter_map(|b| match b {
                Block::Text(t) => Some(t.as_str()),
                _ => None,
            })
            .collect();
        (!texts.is_empty()).then(|| texts.concat())
    }

    fn openai_calls(&self) -> Vec<(&str, &str, String)> {
        self.blocks
            .iter()
            .filter_map(|b| match b {
                Block::ToolUse { id, name, input } => {
                    Some((id.as_str(), name.as_str(), input.to_string()))
                }
                _ => None,
            })
            .collect()
    }

    fn openai_json(&self) -> Value {
        let mut message = json!({"role": "assistant", "content": self.openai_text()});
        let calls = self.openai_calls();
        if !calls.is_empty() {
            message["tool_calls"] = calls
                .iter()
                .map(|(id, name, arguments)| {
                    json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}})
                })
                .collect();
        }
        json!({
            "id": self.completion_id(),
            "object": "chat.completion",
            "created": 1_700_000_000,
            "model": self.model,
            "choices": [{"index": 0, "message": message, "logprobs": null, "finish_reason": self.openai_stop()}],
            "usage": self.openai_usage(),
        })
    }

    fn openai_events(&self, include_usage: bool) -> Vec<Vec<u8>> {
        let chunk = |delta: Value, finish: Value| {
            let mut c = json!({
                "id": self.completion_id(),
                "object": "chat.completion.chunk",
                "created": 1_700_000_000,
                "model": self.model,
                "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
            });
            if include_usage {
                c["usage"] = Value::Null;
            }
            data_line(&c)
        };
        let mut events = vec![chunk(
            json!({"role": "assistant", "content": ""}),
            Value::Null,
        )];
        if let Some(text) = self.openai_text() {
            for p in pieces(&text) {
                events.push(chunk(json!({"content": p}), Value::Null));
            }
        }
        for (index, (id, name, arguments)) in self.openai_calls().into_iter().enumerate() {
            events.push(chunk(
                json!({"tool_calls": [{"index": index, "id": id, "type": "function", "function": {"name": name, "arguments": ""}}]}),
                Value::Null,
            ));
            for p in pieces(&arguments) {
                events.push(chunk(
                    json!({"tool_calls": [{"index": index, "function": {"arguments": p}}]}),
                    Value::Null,
                ));
            }
        }
        events.push(chunk(json!({}), json!(self.openai_stop())));
        if include_usage {
            events.push(data_line(&json!({
                "id": self.completion_id(),
                "object": "chat.completion.chunk",
                "created": 1_700_000_000,
                "model": self.model,
                "choices": [],
                "usage": self.openai_usage(),
            })));
        }
        events.push(b"data: [DONE]\n\n".to_vec());
        events
    }
}

// ---------------------------------------------------------------- Responses

/// A Responses stream event: `event: <type>` and its data with `sequence_number` set.
fn responses_event(sequence: &mut u64, mut data: Value) -> Vec<u8> {
    data["sequence_number"] = json!(*sequence);
    *sequence += 1;
    let kind = data["type"].as_str().unwrap_or_default().to_owned();
    sse(&kind, &data)
}

/// The response object of answer `id` before any output (`status` in progress).
fn responses_base(id: u64, model: &Value) -> Value {
    json!({
        "id": format!("resp_fake_{id}"),
        "object": "response",
        "created_at": 1_700_000_000,
        "status": "in_progress",
        "error": null,
        "incomplete_details": null,
        "model": model,
        "output": [],
        "usage": null,
    })
}

/// The events of a [`Reply::responses_failed`] stream.
fn responses_failed_events(id: u64, model: &Value, code: &str, message: &str) -> Vec<Vec<u8>> {
    let base = responses_base(id, model);
    let mut failed = base.clone();
    failed["status"] = json!("failed");
    failed["error"] = json!({"code": code, "message": message});
    let mut n = 0;
    vec![
        responses_event(
            &mut n,
            json!({"type": "response.created", "response": base}),
        ),
        responses_event(
            &mut n,
            json!({"type": "response.in_progress", "response": base}),
        ),
        responses_event(
            &mut n,
            json!({"type": "response.failed", "response": failed}),
        ),
    ]
}

impl Answer {
    fn responses_usage(&self) -> Value {
        let output = self.output_tokens();
        let reasoning: u64 = self
            .blocks
            .iter()
            .map(|b| match b {
                Block::Thinking {
                    thinking,
                    signature,
                } => text_tokens(thinking) + text_tokens(signature),
                Block::RedactedThinking(data) => text_tokens(data),
                _ => 0,
            })
            .sum();
        json!({
            "input_tokens": self.bill.prompt(),
            "input_tokens_details": {"cached_tokens": self.bill.read},
            "output_tokens": output,
            "output_tokens_details": {"reasoning_tokens": reasoning.min(output)},
            "total_tokens": self.bill.prompt() + output,
        })
    }

    /// The output item of `block`, the `index`th of the answer, whole.
    fn responses_item(&self, index: usize, block: &Block) -> Value {
        match block {
            Block::Text(text) => json!({
                "type": "message",
                "id": format!("msg_fake_{}_{index}", self.id),
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }),
            Block::ToolUse { id, name, input } => json!({
                "type": "function_call",
                "id": format!("fc_fake_{}_{index}", self.id),
                "call_id": id,
                "name": name,
                "arguments": input.to_string(),
                "status": "completed",
            }),
            Block::Thinking {
                thinking,
                signature,
            } => {
                let summary = if thinking.is_empty() {
                    json!([])
                } else {
                    json!([{"type": "summary_text", "text": thinking}])
                };
                json!({
                    "type": "reasoning",
                    "id": format!("rs_fake_{}_{index}", self.id),
                    "summary": summary,
                    "encrypted_content": signature,
                })
            }
            Block::RedactedThinking(data) => json!({
                "type": "reasoning",
                "id": format!("rs_fake_{}_{index}", self.id),
                "summary": [],
                "encrypted_content": data,
            }),
        }
    }

    /// The whole response object: completed, or incomplete with a scripted stop reason.
    fn responses_json(&self) -> Value {
        let mut response = responses_base(self.id, &json!(self.model));
        match &self.stop_reason {
            None => response["status"] = json!("completed"),
            Some(reason) => {
                response["status"] = json!("incomplete");
                response["incomplete_details"] = json!({"reason": reason});
            }
        }
        response["output"] = self
            .blocks
            .iter()
            .enumerate()
            .map(|(i, b)| self.responses_item(i, b))
            .collect();
        response["usage"] = self.responses_usage();
        response
    }

    fn responses_events(&self) -> Vec<Vec<u8>> {
        let base = responses_base(self.id, &json!(self.model));
        let mut n = 0;
        let mut events = vec![
            responses_event(
                &mut n,
                json!({"type": "response.created", "response": base}),
            ),
            responses_event(
                &mut n,
                json!({"type": "response.in_progress", "response": base}),
            ),
        ];
        for (index, block) in self.blocks.iter().enumerate() {
            let item = self.responses_item(index, block);
            let item_id = item["id"].clone();
            let mut added = item.clone();
            match block {
                Block::Text(_) => {
                    added["status"] = json!("in_progress");
                    added["content"] = json!([]);
                }
                Block::ToolUse { .. } => {
                    added["status"] = json!("in_progress");
                    added["arguments"] = json!("");
                }
                Block::Thinking { .. } | Block::RedactedThinking(_) => {
                    added["summary"] = json!([]);
                    if let Some(fields) = added.as_object_mut() {
                        fields.remove("encrypted_content");
                    }
                }
            }
            events.push(responses_event(
                &mut n,
                json!({"type": "response.output_item.added", "output_index": index, "item": added}),
            ));
            let at = json!({"item_id": item_id, "output_index": index});
            let with = |kind: &str, extra: Value| {
                let mut data = at.clone();
                data["type"] = json!(kind);
                for (k, v) in extra.as_object().into_iter().flatten() {
                    data[k] = v.clone();
                }
                data
            };
            match block {
                Block::Text(text) => {
                    let empty = json!({"type": "output_text", "text": "", "annotations": []});
                    let part = json!({"type": "output_text", "text": text, "annotations": []});
                    events.push(responses_event(
                        &mut n,
                        with(
                            "response.content_part.added",
                            json!({"content_index": 0, "part": empty}),
                        ),
                    ));
                    for p in pieces(text) {
                        events.push(responses_event(
                            &mut n,
                            with(
                                "response.output_text.delta",
                                json!({"content_index": 0, "delta": p}),
                            ),
                        ));
                    }
                    events.push(responses_event(
                        &mut n,
                        with(
                            "response.output_text.done",
                            json!({"content_index": 0, "text": text}),
                        ),
                    ));
                    events.push(responses_event(
                        &mut n,
                        with(
                            "response.content_part.done",
                            json!({"content_index": 0, "part": part}),
                        ),
                    ));
                }
                Block::ToolUse { input, .. } => {
                    let arguments = input.to_string();
                    for p in pieces(&arguments) {
                        events.push(responses_event(
                            &mut n,
                            with(
                                "response.function_call_arguments.delta",
                                json!({"delta": p}),
                            ),
                        ));
                    }
                    events.push(responses_event(
                        &mut n,
                        with(
                            "response.function_call_arguments.done",
                            json!({"arguments": arguments}),
                        ),
                    ));
                }
                Block::Thinking { thinking, .. } if !thinking.is_empty() => {
                    let empty = json!({"type": "summary_text", "text": ""});
                    let part = json!({"type": "summary_text", "text": thinking});
                    events.push(responses_event(
                        &mut n,
                        with(
                            "response.reasoning_summary_part.added",
                            json!({"summary_index": 0, "part": empty}),
                        ),
                    ));
                    for p in pieces(thinking) {
                        events.push(responses_event(
                            &mut n,
                            with(
                                "response.reasoning_summary_text.delta",
                                json!({"summary_index": 0, "delta": p}),
                            ),
                        ));
                    }
                    events.push(responses_event(
                        &mut n,
                        with(
                            "response.reasoning_summary_text.done",
                            json!({"summary_index": 0, "text": thinking}),
                        ),
                    ));
                    events.push(responses_event(
                        &mut n,
                        with(
                            "response.reasoning_summary_part.done",
                            json!({"summary_index": 0, "part": part}),
                        ),
                    ));
                }
                Block::Thinking { .. } | Block::RedactedThinking(_) => {}
            }
            events.push(responses_event(
                &mut n,
                json!({"type": "response.output_item.done", "output_index": index, "item": item}),
            ));
        }
        let whole = self.responses_json();
        let last = if self.stop_reason.is_some() {
            "response.incomplete"
        } else {
            "response.completed"
        };
        events.push(responses_event(
            &mut n,
            json!({"type": last, "response": whole}),
        ));
        events
    }
}

// ---------------------------------------------------------------- reading SSE

/// One server-sent event: its `event:` name (empty when absent) and `data:` (lines joined by
/// `\n`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SseEvent {
    pub event: String,
    pub data: String,
}

/// The complete events of an SSE body (a trailing incomplete event is left out).
pub fn parse_sse(body: &[u8]) -> Vec<SseEvent> {
    let text = String::from_utf8_lossy(body).replace("\r\n", "\n");
    let mut events = Vec::new();
    let mut rest = text.as_str();
    while let Some(end) = rest.find("\n\n") {
        let (block, tail) = rest.split_at(end);
        rest = &tail[2..];
        let mut event = String::new();
        let mut data: Vec<&str> = Vec::new();
        for line in block.lines() {
            if let Some(v) = line.strip_prefix("event:") {
                event = v.trim_start().to_owned();
            } else if let Some(v) = line.strip_prefix("data:") {
                data.push(v.strip_prefix(' ').unwrap_or(v));
            }
        }
        if !event.is_empty() || !data.is_empty() {
            events.push(SseEvent {
                event,
                data: data.join("\n"),
            });
        }
    }
    events
}

/// The Anthropic message an SSE body builds (content blocks accumulated from their deltas,
/// stop_reason, usage and `message_delta`'s `context_management`), as the non-streamed JSON
/// would be; `None` without `message_stop`.
pub fn anthropic_message_of_sse(body: &[u8]) -> Option<Value> {
    let mut message = Value::Null;
    let mut partial: Vec<String> = Vec::new();
    let mut stopped = false;
    for event in parse_sse(body) {
        let Ok(data) = serde_json::from_str::<Value>(&event.data) else {
            continue;
        };
        match data["type"].as_str().unwrap_or_default() {
            "message_start" => message = data["message"].clone(),
            "content_block_start" => {
                let index = data["index"].as_u64()? as usize;
                let content = message["content"].as_array_mut()?;
                content.resize(index + 1, Value::Null);
                content[index] = data["content_block"].clone();
                partial.resize(index + 1, String::new());
            }
            "content_block_delta" => {
                let index = data["index"].as_u64()? as usize;
                let block = message["content"].get_mut(index)?;
                let delta = &data["delta"];
                match delta["type"].as_str().unwrap_or_default() {
                    "text_delta" => append_str(block, "text", delta["text"].as_str()?),
                    "thinking_delta" => append_str(block, "thinking", delta["thinking"].as_str()?),
                    "signature_delta" => {
                        append_str(block, "signature", delta["signature"].as_str()?)
                    }
                    "input_json_delta" => partial[index].push_str(delta["partial_json"].as_str()?),
                    _ => {}
                }
            }
            "content_block_stop" => {
                let index = data["index"].as_u64()? as usize;
                if !partial[index].is_empty() {
                    message["content"][index]["input"] =
                        serde_json::from_str(&partial[index]).ok()?;
                }
            }
            "message_delta" => {
                for (k, v) in data["delta"].as_object()? {
                    message[k] = v.clone();
                }
                for (k, v) in data["usage"].as_object()? {
                    message["usage"][k] = v.clone();
                }
                if !data["context_management"].is_null() {
                    message["context_management"] = data["context_management"].clone();
                }
            }
            "message_stop" => stopped = true,
            _ => {}
        }
    }
    stopped.then_some(message)
}

fn append_str(block: &mut Value, key: &str, piece: &str) {
    let mut s = block[key].as_str().unwrap_or_default().to_owned();
    s.push_str(piece);
    block[key] = Value::String(s);
}

/// The OpenAI assistant message a streamed body builds (`content`, `tool_calls` with their
/// arguments joined) and the finish_reason; `None` without `data: [DONE]`.
pub fn openai_message_of_sse(body: &[u8]) -> Option<(Value, String)> {
    let mut content: Option<String> = None;
    let mut calls: Vec<Value> = Vec::new();
    let mut finish = String::new();
    let mut done = false;
    for event in parse_sse(body) {
        if event.data == "[DONE]" {
            done = true;
            continue;
        }
        let Ok(chunk) = serde_json::from_str::<Value>(&event.data) else {
            continue;
        };
        let Some(choice) = chunk["choices"].get(0) else {
            continue;
        };
        if let Some(f) = choice["finish_reason"].as_str() {
            finish = f.to_owned();
        }
        let delta = &choice["delta"];
        if let Some(piece) = delta["content"].as_str() {
            content.get_or_insert_with(String::new).push_str(piece);
        }
        for call in delta["tool_calls"].as_array().into_iter().flatten() {
            let index = call["index"].as_u64()? as usize;
            if calls.len() <= index {
                calls.resize(
                    index + 1,
                    json!({"id": "", "type": "function", "function": {"name": "", "arguments": ""}}),
                );
            }
            if let Some(id) = call["id"].as_str() {
                calls[index]["id"] = json!(id);
            }
            if let Some(name) = call["function"]["name"].as_str() {
                calls[index]["function"]["name"] = json!(name);
            }
            if let Some(piece) = call["function"]["arguments"].as_str() {
                let mut args = calls[index]["function"]["arguments"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                args.push_str(piece);
                calls[index]["function"]["arguments"] = json!(args);
            }
        }
    }
    if !done {
        return None;
    }
    let content = content.filter(|c| !c.is_empty());
    let mut message = json!({"role": "assistant", "content": content});
    if !calls.is_empty() {
        message["tool_calls"] = Value::Array(calls);
    }
    Some((message, finish))
}

/// A Responses stream read back: the `response` of its last `response.completed`,
/// `response.incomplete` or `response.failed` event, and the items of its
/// `response.output_item.done` events in `output_index` order (what a client such as Codex
/// reads: it ignores the final response's `output`); `None` without such a last event.
pub fn responses_of_sse(body: &[u8]) -> Option<(Value, Vec<Value>)> {
    let mut response = None;
    let mut items: Vec<(u64, Value)> = Vec::new();
    for event in parse_sse(body) {
        let Ok(data) = serde_json::from_str::<Value>(&event.data) else {
            continue;
        };
        match data["type"].as_str().unwrap_or_default() {
            "response.completed" | "response.incomplete" | "response.failed" => {
                response = Some(data["response"].clone());
            }
            "response.output_item.done" => {
                items.push((data["output_index"].as_u64()?, data["item"].clone()));
            }
            _ => {}
        }
    }
    items.sort_by_key(|(index, _)| *index);
    Some((response?, items.into_iter().map(|(_, item)| item).collect()))
}
