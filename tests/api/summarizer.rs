//! `Compact`: the server's own summarizer, pointed at a scripted chat-completions endpoint
//! served by the test itself on 127.0.0.1:0 (a tiny HTTP/1.1 server on a tokio listener).
//!
//! Every test checks what the RPC answers, what `ListSummaries` shows (summaries and events),
//! the session's `compaction_count`, and the render before and after.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ctxd::api::pb;
use prost::Message as _;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tonic::Code;

use crate::chat_http;
use crate::helpers::*;

// ---------------------------------------------------------------- the scripted provider

/// One scripted answer of the fake provider.
#[derive(Debug, Clone)]
struct Reply {
    status: u16,
    body: String,
    delay: Duration,
}

impl Reply {
    /// A 200 chat completion whose assistant message is `content`.
    fn ok(content: &str) -> Self {
        Self::status(200, &chat_http::completion(content))
    }

    fn status(status: u16, body: &str) -> Self {
        Self {
            status,
            body: body.to_owned(),
            delay: Duration::ZERO,
        }
    }

    fn after(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// OpenAI's answer to a prompt longer than the model's window.
    fn context_length_exceeded() -> Self {
        Self::status(
            400,
            r#"{"error":{"message":"This model's maximum context length is 8192 tokens","type":"invalid_request_error","code":"context_length_exceeded"}}"#,
        )
    }
}

/// One request the fake provider received.
#[derive(Debug, Clone)]
struct Recorded {
    method: String,
    path: String,
    /// Header names lowercased.
    headers: HashMap<String, String>,
    body: serde_json::Value,
}

impl Recorded {
    /// The content of the first message with `role`.
    fn content(&self, role: &str) -> String {
        self.body["messages"]
            .as_array()
            .expect("a chat request has messages")
            .iter()
            .find(|m| m["role"] == role)
            .and_then(|m| m["content"].as_str())
            .unwrap_or_else(|| panic!("no {role} message in {}", self.body))
            .to_owned()
    }

    /// Characters of every message's content.
    fn message_chars(&self) -> usize {
        self.body["messages"]
            .as_array()
            .expect("a chat request has messages")
            .iter()
            .map(|m| m["content"].as_str().unwrap_or("").chars().count())
            .sum()
    }
}

#[derive(Default)]
struct ProviderState {
    script: VecDeque<Reply>,
    /// Answers once the script is used up.
    fallback: Option<Reply>,
    requests: Vec<Recorded>,
}

/// The fake provider's shared state: what it will answer and what it was asked.
#[derive(Clone, Default)]
struct Provider(Arc<Mutex<ProviderState>>);

const MAX_CONNECTIONS: usize = 256;
const MAX_REQUESTS_PER_CONNECTION: usize = 256;

impl Provider {
    /// Binds 127.0.0.1:0 and answers from the script in the background.
    async fn start() -> (SocketAddr, Provider) {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the fake provider");
        let addr = listener.local_addr().expect("local addr");
        let provider = Provider::default();
        let shared = provider.clone();
        tokio::spawn(async move {
            for _ in 0..MAX_CONNECTIONS {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(shared.clone().serve_connection(stream));
            }
        });
        (addr, provider)
    }

    fn push(&self, reply: Reply) {
        self.0.lock().unwrap().script.push_back(reply);
    }

    fn set_fallback(&self, reply: Reply) {
        self.0.lock().unwrap().fallback = Some(reply);
    }

    fn requests(&self) -> Vec<Recorded> {
        self.0.lock().unwrap().requests.clone()
    }

    fn request_count(&self) -> usize {
        self.0.lock().unwrap().requests.len()
    }

    /// Records `request` and picks its answer.
    fn answer(&self, request: Recorded) -> Reply {
        let mut state = self.0.lock().unwrap();
        state.requests.push(request);
        state
            .script
            .pop_front()
            .or_else(|| state.fallback.clone())
            .unwrap_or_else(|| {
                Reply::status(
                    500,
                    r#"{"error":{"message":"the test scripted no answer"}}"#,
                )
            })
    }

    async fn serve_connection(self, mut stream: TcpStream) {
        let mut buf = Vec::new();
        for _ in 0..MAX_REQUESTS_PER_CONNECTION {
            let Some(request) = chat_http::read_request(&mut stream, &mut buf)
                .await
                .and_then(|(head, body)| parse_request(&head, &body))
            else {
                return;
            };
            let reply = self.answer(request);
            if !reply.delay.is_zero() {
                tokio::time::sleep(reply.delay).await;
            }
            if chat_http::respond(&mut stream, reply.status, &reply.body, false)
                .await
                .is_err()
            {
                return;
            }
        }
    }
}

fn parse_request(head: &[u8], body: &[u8]) -> Option<Recorded> {
    let head = String::from_utf8_lossy(head);
    let mut lines = head.split("\r\n");
    let mut request_line = lines.next()?.split(' ');
    let method = request_line.next()?.to_owned();
    let path = request_line.next()?.to_owned();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let body = serde_json::from_slice(body).unwrap_or(serde_json::Value::Null);
    Some(Recorded {
        method,
        path,
        headers,
        body,
    })
}

// ---------------------------------------------------------------- ctxd with a summarizer

/// The summarizer's bounds, as `serve --summarizer-*` would set them.
#[derive(Debug, Clone, Copy)]
struct Limits {
    window_tokens: u32,
    max_output_tokens: u32,
    max_calls: usize,
    timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            window_tokens: 8000,
            max_output_tokens: 512,
            max_calls: 8,
            timeout: Duration::from_secs(10),
        }
    }
}

/// One test's world: a temp dir with the SQLite file, ctxd with a summarizer, the provider.
struct App {
    _dir: tempfile::TempDir,
    _shutdown: oneshot::Sender<()>,
    client: Client,
    provider: Provider,
}

async fn spawn(limits: Limits) -> App {
    let (provider_addr, provider) = Provider::start().await;
    let summarizer = ctxd::summarizer::Summarizer::new(ctxd::summarizer::Config {
        url: format!("http://{provider_addr}/v1"),
        model: "test-model".into(),
        api_key: Some("sk-test".into()),
        window_tokens: limits.window_tokens,
        max_output_tokens: limits.max_output_tokens,
        max_calls: limits.max_calls,
        timeout: limits.timeout,
    })
    .expect("build the summarizer");
    let dir = tempfile::tempdir().expect("create temp dir");
    let store = ctxd::store::Store::open(&dir.path().join("ctxd.db"))
        .await
        .expect("open the store");
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("local addr");
    let (shutdown, signal) = oneshot::channel::<()>();
    tokio::spawn(ctxd::server::serve_with_summarizer(
        listener,
        store,
        Some(summarizer),
        async move {
            let _ = signal.await;
        },
    ));
    App {
        _dir: dir,
        _shutdown: shutdown,
        client: connect(addr).await,
        provider,
    }
}

/// History budget 2,600 tokens: the four-turn session is ~3,200, its newest two turns ~1,600.
fn tight_budget() -> pb::Budget {
    pb::Budget {
        context_window: 3600,
        output_reserve: 1000,
        ..Default::default()
    }
}

fn compact_req(session: &str) -> pb::CompactRequest {
    pb::CompactRequest {
        session_id: session.into(),
        budget: Some(tight_budget()),
        ..Default::default()
    }
}

const TURNS: usize = 4;

fn request_text(turn: usize) -> String {
    format!("Request {turn}: open src/module_{turn}.rs and fix the off-by-one in its parser")
}

impl App {
    async fn create_session(&mut self) -> String {
        self.client
            .create_session(pb::CreateSessionRequest::default())
            .await
            .expect("CreateSession")
            .into_inner()
            .session_id
    }

    /// A system message and four turns (user request, assistant call, a ~3,000-character tool
    /// result, assistant answer): 17 top-level messages of ~3,200 tokens.
    async fn build_session(&mut self) -> String {
        let s = self.create_session().await;
        self.append(&s, vec![system("You are a careful coding agent.")])
            .await;
        for t in 0..TURNS {
            let id = format!("call_{t}");
            let nodes = vec![
                user(&request_text(t)),
                assistant_calls(
                    "Let me read the file.",
                    vec![call(
                        &id,
                        "read_file",
                        &format!(r#"{{"path":"src/module_{t}.rs"}}"#),
                    )],
                ),
                tool_result(&id, &big_text(3600, &format!("module_{t}"))),
                assistant(&format!("Fixed the off-by-one in module {t}.")),
            ];
            self.append(&s, nodes).await;
        }
        s
    }

    async fn append(&mut self, session: &str, nodes: Vec<pb::NodeInput>) {
        self.client
            .append(append_req(session, nodes))
            .await
            .expect("Append");
    }

    async fn compact(&mut self, session: &str) -> pb::CompactionOutcome {
        self.client
            .compact(compact_req(session))
            .await
            .expect("Compact")
            .into_inner()
    }

    async fn render(&mut self, session: &str) -> pb::RenderResponse {
        self.client
            .render(render_req(session, Target::Branch("main".into())))
            .await
            .expect("Render")
            .into_inner()
    }

    async fn summaries(&mut self, session: &str) -> pb::ListSummariesResponse {
        summaries(&mut self.client, session).await
    }

    async fn compaction_count(&mut self, session: &str) -> u32 {
        self.client
            .get_session(pb::GetSessionRequest {
                session_id: session.into(),
            })
            .await
            .expect("GetSession")
            .into_inner()
            .compaction_count
    }
}

fn reason_of(outcome: &pb::CompactionOutcome) -> pb::CompactionReason {
    pb::CompactionReason::try_from(outcome.reason).expect("a known reason")
}

fn event_reason(event: &pb::CompactionEvent) -> pb::CompactionReason {
    pb::CompactionReason::try_from(event.reason).expect("a known reason")
}

/// `(kind, reason)` of each event of compaction `id`, oldest first.
fn events_of(list: &pb::ListSummariesResponse, id: &str) -> Vec<(String, pb::CompactionReason)> {
    list.events
        .iter()
        .filter(|e| e.compaction_id == id)
        .map(|e| (e.kind.clone(), event_reason(e)))
        .collect()
}

fn bytes(render: &pb::RenderResponse) -> Vec<u8> {
    render.encode_to_vec()
}

/// Asserts that the Compact behind `outcome` left exactly two events, prepared and rejected for
/// `reason`; returns the audit trail.
async fn assert_prepared_then_rejected(
    app: &mut App,
    session: &str,
    outcome: &pb::CompactionOutcome,
    reason: pb::CompactionReason,
) -> pb::ListSummariesResponse {
    let list = app.summaries(session).await;
    assert_eq!(
        events_of(&list, &outcome.compaction_id),
        vec![
            ("prepared".to_owned(), pb::CompactionReason::Unspecified),
            ("rejected".to_owned(), reason),
        ]
    );
    list
}

/// Asserts a Compact that wrote nothing: no summary, the count and the render as before.
async fn assert_nothing_written(
    app: &mut App,
    session: &str,
    before: &pb::RenderResponse,
    count_before: u32,
) {
    let list = app.summaries(session).await;
    assert!(
        list.summaries.is_empty(),
        "no summary: {:?}",
        list.summaries
    );
    assert_eq!(app.compaction_count(session).await, count_before);
    let after = app.render(session).await;
    assert!(
        bytes(&after) == bytes(before),
        "the render is byte-identical to before:\n{:#?}\nvs\n{:#?}",
        transcript(&before.messages),
        transcript(&after.messages)
    );
}

const GOOD_SUMMARY: &str = "The user asked to fix off-by-one bugs in modules 0 and 1; both \
files were read and both parsers fixed.";

// ---------------------------------------------------------------- 1. applied

#[tokio::test]
async fn a_short_summary_is_applied_over_the_older_turns() {
    let mut app = spawn(Limits::default()).await;
    let s = app.build_session().await;
    let before = app.render(&s).await;
    assert_eq!(before.messages.len(), 1 + 4 * TURNS);
    // What the host sends its model under the same budget, before any summary.
    let host = app
        .client
        .render(pb::RenderRequest {
            budget: Some(tight_budget()),
            format: pb::Format::OpenaiChat as i32,
            ..render_req(&s, Target::Branch("main".into()))
        })
        .await
        .expect("Render")
        .into_inner();

    // Prepare says the budget needs a summary over the two older turns.
    let prepared = app
        .client
        .prepare_compaction(pb::PrepareCompactionRequest {
            session_id: s.clone(),
            budget: Some(tight_budget()),
            ..Default::default()
        })
        .await
        .expect("PrepareCompaction")
        .into_inner();
    assert!(prepared.needed, "{}", prepared.reason);
    assert_eq!(prepared.retained_turns, 2);
    assert_eq!(prepared.covers_ids.len(), 8, "two turns of four nodes");
    app.client
        .cancel_compaction(pb::CancelCompactionRequest {
            compaction_id: prepared.compaction_id.clone(),
            reason: "the test only looked".into(),
        })
        .await
        .expect("CancelCompaction");

    app.provider.push(Reply::ok(GOOD_SUMMARY));
    let outcome = app.compact(&s).await;
    assert!(outcome.applied, "{outcome:?}");
    assert_eq!(reason_of(&outcome), pb::CompactionReason::Applied);
    assert!(
        outcome.tokens_after < outcome.tokens_before,
        "{} → {}",
        outcome.tokens_before,
        outcome.tokens_after
    );
    assert_eq!(outcome.tokens_before, prepared.tokens_before);
    assert!(!outcome.summary_id.is_empty());
    assert!(!outcome.compaction_id.is_empty());

    // The stored summary and the audit trail.
    let list = app.summaries(&s).await;
    assert_eq!(list.summaries.len(), 1);
    let summary = &list.summaries[0];
    assert_eq!(summary.summary_id, outcome.summary_id);
    assert_eq!(summary.compaction_id, outcome.compaction_id);
    assert_eq!(summary.text, GOOD_SUMMARY);
    assert_eq!(summary.model, "test-model");
    assert_eq!(summary.covers_ids, prepared.covers_ids);
    assert_eq!(summary.prior_summary_id, "");
    assert_eq!(summary.base_head_id, before.head_id);
    assert_eq!(summary.tokens_before, outcome.tokens_before);
    assert_eq!(summary.tokens_after, outcome.tokens_after);
    assert!(summary.applies && summary.active);
    assert_eq!(
        events_of(&list, &outcome.compaction_id),
        vec![
            ("prepared".to_owned(), pb::CompactionReason::Unspecified),
            ("committed".to_owned(), pb::CompactionReason::Applied),
        ]
    );
    let committed = list
        .events
        .iter()
        .find(|e| e.kind == "committed")
        .expect("a committed event");
    assert_eq!(committed.summary_id, outcome.summary_id);
    assert_eq!(committed.tokens_after, outcome.tokens_after);
    assert_eq!(
        events_of(&list, &prepared.compaction_id),
        vec![
            ("prepared".to_owned(), pb::CompactionReason::Unspecified),
            ("cancelled".to_owned(), pb::CompactionReason::Cancelled),
        ]
    );
    assert_eq!(app.compaction_count(&s).await, 1);

    // The render: system, the summary, then the newest two turns exactly as before.
    let after = app.render(&s).await;
    assert_eq!(
        after.messages.len(),
        2 + 4 * 2,
        "{:#?}",
        transcript(&after.messages)
    );
    assert_eq!(after.messages[0], before.messages[0]);
    let rendered_summary = text_of(&after.messages[1].parts);
    assert!(
        rendered_summary.starts_with("[Summary of the earlier conversation"),
        "{rendered_summary}"
    );
    assert!(rendered_summary.contains(GOOD_SUMMARY));
    assert_eq!(after.messages[1].role, pb::Role::User as i32);
    assert_eq!(
        after.messages[2..],
        before.messages[before.messages.len() - 8..]
    );
    assert_eq!(after.head_id, before.head_id);

    // The one model call: the context as the host renders it, byte for byte, then the
    // instruction, so the provider reads the context from its cache.
    let requests = app.provider.requests();
    assert_eq!(requests.len(), 1);
    let request = &requests[0];
    assert_eq!(request.method, "POST");
    assert_eq!(request.path, "/v1/chat/completions");
    assert_eq!(
        request.headers.get("authorization").map(String::as_str),
        Some("Bearer sk-test")
    );
    assert_eq!(request.body["model"], "test-model");
    assert_eq!(request.body["max_tokens"], 512);
    let context: serde_json::Value = serde_json::from_str(&host.messages_json).expect("JSON");
    let sent = request.body["messages"].as_array().expect("messages");
    let context = context.as_array().expect("an array");
    assert_eq!(sent.len(), context.len() + 1);
    assert_eq!(&sent[..context.len()], &context[..]);
    let ask = sent.last().expect("the instruction");
    assert_eq!(ask["role"], "user");
    let ask = ask["content"].as_str().expect("text");
    assert!(ask.starts_with("[Summary request]"), "{ask}");
    assert!(
        ask.contains(&format!("begins {:?}", request_text(2))),
        "where the summary ends: {ask}"
    );
    // The model is shown the evidence ledger the store keeps after its summary, so it need not
    // restate it.
    assert!(
        ask.contains("[Evidence kept from the summarized range]"),
        "{ask}"
    );
    let files = ctxd::domain::paths_in(ask);
    assert_eq!(files, ["src/module_0.rs", "src/module_1.rs"], "{ask}");
}

/// `request_form: RANGE` asks as before: the summarizer's own prompt and the covered range.
#[tokio::test]
async fn the_range_form_sends_the_covered_range_alone() {
    let mut app = spawn(Limits::default()).await;
    let s = app.build_session().await;
    app.provider.push(Reply::ok(GOOD_SUMMARY));
    let outcome = app
        .client
        .compact(pb::CompactRequest {
            request_form: pb::SummaryRequestForm::Range as i32,
            ..compact_req(&s)
        })
        .await
        .expect("Compact")
        .into_inner();
    assert!(outcome.applied, "{outcome:?}");
    let requests = app.provider.requests();
    assert_eq!(requests.len(), 1);
    let request = &requests[0];
    let prompt = request.content("user");
    for t in 0..2 {
        assert!(prompt.contains(&request_text(t)), "request {t} in {prompt}");
    }
    for t in 2..TURNS {
        assert!(!prompt.contains(&request_text(t)), "retained request {t}");
    }
    assert!(prompt.contains("module_0 line 0000000"), "tool output");
    let system = request.content("system");
    assert!(
        system.contains("[Evidence kept from the summarized range]"),
        "{system}"
    );
    let files = ctxd::domain::paths_in(&system);
    assert_eq!(files, ["src/module_0.rs", "src/module_1.rs"], "{system}");
}

/// PrepareCompaction's cache-sharing request: the render a host just sent, byte-identical (as
/// messages and as a provider document), then one user message; a segment is refused.
#[tokio::test]
async fn prepare_returns_the_cache_sharing_request() {
    let mut app = spawn(Limits::default()).await;
    let s = app.build_session().await;
    let policy = pb::RenderPolicy {
        microcompact_first: 2,
        microcompact_every: 1,
        microcompact_keep: 1,
        clear_at_least_tokens: Some(0),
        ..Default::default()
    };
    for format in [pb::Format::OpenaiChat, pb::Format::AnthropicMessages] {
        let host = app
            .client
            .render(pb::RenderRequest {
                budget: Some(tight_budget()),
                policy: Some(policy),
                format: format as i32,
                ..render_req(&s, Target::Branch("main".into()))
            })
            .await
            .expect("Render")
            .into_inner();
        assert!(host.messages.iter().any(|m| m.cleared), "the policy steps");
        let prepared = app
            .client
            .prepare_compaction(pb::PrepareCompactionRequest {
                session_id: s.clone(),
                budget: Some(tight_budget()),
                cache_sharing_request: true,
                policy: Some(policy),
                format: format as i32,
                ..Default::default()
            })
            .await
            .expect("PrepareCompaction")
            .into_inner();
        assert!(prepared.needed, "{}", prepared.reason);
        let request = &prepared.summary_request;
        assert_eq!(request.len(), host.messages.len() + 1);
        assert_eq!(request[..host.messages.len()], host.messages[..]);
        let ask = request.last().expect("the instruction");
        assert_eq!(ask.role, pb::Role::User as i32);
        assert!(text_of(&ask.parts).contains(&prepared.ledger_text));
        // As a document: the host's messages, then the instruction.
        let doc = |json: &str| -> (serde_json::Value, Vec<serde_json::Value>) {
            let v: serde_json::Value = serde_json::from_str(json).expect("a document");
            match v {
                serde_json::Value::Array(messages) => (serde_json::Value::Null, messages),
                mut object => {
                    let messages = object["messages"].take();
                    (object, messages.as_array().expect("messages").clone())
                }
            }
        };
        let (host_rest, host_messages) = doc(&host.messages_json);
        let (rest, messages) = doc(&prepared.summary_request_json);
        assert_eq!(rest, host_rest, "{format:?}: the same system prompt");
        assert_eq!(messages.len(), host_messages.len() + 1, "{format:?}");
        assert_eq!(
            messages[..host_messages.len()],
            host_messages[..],
            "{format:?}"
        );
        // The range is what it was: the summary input without the request.
        assert!(!prepared.summary_input.is_empty());
        app.client
            .cancel_compaction(pb::CancelCompactionRequest {
                compaction_id: prepared.compaction_id,
                reason: "looked".into(),
            })
            .await
            .expect("CancelCompaction");
    }
    // Without the flag, no request is built.
    let plain = app
        .client
        .prepare_compaction(pb::PrepareCompactionRequest {
            session_id: s.clone(),
            budget: Some(tight_budget()),
            ..Default::default()
        })
        .await
        .expect("PrepareCompaction")
        .into_inner();
    assert!(plain.needed && plain.summary_request.is_empty());
    // A segment is summarized from its range.
    let nodes = app.render(&s).await.messages;
    assert_status(
        app.client
            .prepare_compaction(pb::PrepareCompactionRequest {
                session_id: s.clone(),
                from_node_id: nodes[1].node_ids[0].clone(),
                to_node_id: nodes[4].node_ids[0].clone(),
                cache_sharing_request: true,
                ..Default::default()
            })
            .await,
        Code::InvalidArgument,
        "cache_sharing_request",
    );
    assert_status(
        app.client
            .compact(pb::CompactRequest {
                request_form: 7,
                ..compact_req(&s)
            })
            .await,
        Code::InvalidArgument,
        "request_form",
    );
}

// ---------------------------------------------------------------- 2, 3. rejected

#[tokio::test]
async fn a_summary_longer_than_its_input_is_rejected_as_no_gain() {
    let mut app = spawn(Limits::default()).await;
    let s = app.build_session().await;
    let before = app.render(&s).await;
    app.provider
        .push(Reply::ok(&"very long summary ".repeat(2000)));

    let outcome = app.compact(&s).await;
    assert!(!outcome.applied, "{outcome:?}");
    assert_eq!(reason_of(&outcome), pb::CompactionReason::NoGain);
    assert!(outcome.tokens_before > 0);
    assert!(
        outcome.tokens_after >= outcome.tokens_before,
        "{} → {}",
        outcome.tokens_before,
        outcome.tokens_after
    );
    assert!(outcome.summary_id.is_empty());
    assert_eq!(app.provider.request_count(), 1);

    let list =
        assert_prepared_then_rejected(&mut app, &s, &outcome, pb::CompactionReason::NoGain).await;
    let rejected = list.events.last().expect("events");
    assert_eq!(rejected.tokens_before, outcome.tokens_before);
    assert_eq!(rejected.tokens_after, outcome.tokens_after);
    assert_nothing_written(&mut app, &s, &before, 0).await;
}

#[tokio::test]
async fn a_whitespace_summary_is_rejected_as_empty() {
    let mut app = spawn(Limits::default()).await;
    let s = app.build_session().await;
    let before = app.render(&s).await;
    app.provider.push(Reply::ok(" \n\t \n"));

    let outcome = app.compact(&s).await;
    assert!(!outcome.applied, "{outcome:?}");
    assert_eq!(reason_of(&outcome), pb::CompactionReason::Empty);
    assert_eq!(outcome.tokens_after, outcome.tokens_before);
    assert!(outcome.summary_id.is_empty());

    assert_prepared_then_rejected(&mut app, &s, &outcome, pb::CompactionReason::Empty).await;
    assert_nothing_written(&mut app, &s, &before, 0).await;
}

/// A text the commit rule rejected is no summary of its source: the next Compact on the same
/// source asks the model again instead of replaying the rejected text.
#[tokio::test]
async fn a_rejected_text_is_not_reused_for_the_same_source() {
    let mut app = spawn(Limits::default()).await;
    let s = app.build_session().await;
    app.provider
        .push(Reply::ok(&"very long summary ".repeat(2000)));
    let first = app.compact(&s).await;
    assert_eq!(reason_of(&first), pb::CompactionReason::NoGain);
    assert_eq!(app.provider.request_count(), 1);

    app.provider.push(Reply::ok(GOOD_SUMMARY));
    let second = app.compact(&s).await;
    assert_eq!(
        app.provider.request_count(),
        2,
        "the second Compact asks the model again; it answered {second:?}"
    );
    assert!(second.applied, "{second:?}");
    assert_eq!(app.compaction_count(&s).await, 1);
}

// ---------------------------------------------------------------- 4. provider errors

#[tokio::test]
async fn a_prompt_too_long_is_retried_in_smaller_chunks() {
    // A prompt budget of ~2,300 tokens: the ~1,600-token range is one chunk, half of it is not.
    let mut app = spawn(Limits {
        window_tokens: 3000,
        max_output_tokens: 300,
        ..Limits::default()
    })
    .await;
    let s = app.build_session().await;
    app.provider.push(Reply::context_length_exceeded());
    app.provider.set_fallback(Reply::ok(GOOD_SUMMARY));

    let outcome = app.compact(&s).await;
    assert!(outcome.applied, "{outcome:?}");
    assert_eq!(reason_of(&outcome), pb::CompactionReason::Applied);
    assert!(outcome.tokens_after < outcome.tokens_before);

    let requests = app.provider.requests();
    assert!(
        requests.len() >= 3,
        "one refused call, then at least two smaller ones: {}",
        requests.len()
    );
    let first = requests[0].content("user").chars().count();
    for (i, retried) in requests[1..].iter().enumerate() {
        let chars = retried.content("user").chars().count();
        assert!(
            chars < first,
            "retried request {} has {chars} characters, the refused one {first}",
            i + 1
        );
    }
    for t in 0..2 {
        assert!(requests[0].content("user").contains(&request_text(t)));
        assert!(
            requests[1..]
                .iter()
                .any(|r| r.content("user").contains(&request_text(t))),
            "request {t} is in the retried chunks"
        );
    }

    let list = app.summaries(&s).await;
    assert_eq!(list.summaries.len(), 1);
    assert_eq!(list.summaries[0].text, GOOD_SUMMARY);
    assert_eq!(
        events_of(&list, &outcome.compaction_id),
        vec![
            ("prepared".to_owned(), pb::CompactionReason::Unspecified),
            ("committed".to_owned(), pb::CompactionReason::Applied),
        ]
    );
    assert_eq!(app.compaction_count(&s).await, 1);
    let after = app.render(&s).await;
    assert!(text_of(&after.messages[1].parts).starts_with("[Summary of the earlier conversation"));
}

#[tokio::test]
async fn a_persistent_provider_error_fails_and_writes_nothing() {
    let mut app = spawn(Limits::default()).await;
    let s = app.build_session().await;
    let before = app.render(&s).await;
    app.provider.set_fallback(Reply::status(
        500,
        r#"{"error":{"message":"upstream overloaded"}}"#,
    ));

    let outcome = app.compact(&s).await;
    assert!(!outcome.applied, "{outcome:?}");
    assert_eq!(reason_of(&outcome), pb::CompactionReason::Failed);
    assert!(outcome.message.contains("500"), "{}", outcome.message);
    assert_eq!(outcome.tokens_after, outcome.tokens_before);
    assert!(outcome.summary_id.is_empty());
    assert!(app.provider.request_count() >= 1);

    let list = app.summaries(&s).await;
    let events = events_of(&list, &outcome.compaction_id);
    assert_eq!(events.len(), 2, "{events:?}");
    assert_eq!(events[0].0, "prepared");
    assert_eq!(events[1].1, pb::CompactionReason::Failed);
    assert_nothing_written(&mut app, &s, &before, 0).await;
}

// ---------------------------------------------------------------- 5. chunking

#[tokio::test]
async fn an_input_larger_than_the_window_is_summarized_in_rolling_chunks() {
    const WINDOW: u32 = 1500;
    let mut app = spawn(Limits {
        window_tokens: WINDOW,
        max_output_tokens: 200,
        ..Limits::default()
    })
    .await;
    let s = app.build_session().await;
    let answers: Vec<String> = (0..8)
        .map(|i| format!("Rolling summary number {i}: modules read and fixed so far."))
        .collect();
    for a in &answers {
        app.provider.push(Reply::ok(a));
    }

    let outcome = app.compact(&s).await;
    assert!(outcome.applied, "{outcome:?}");
    assert_eq!(reason_of(&outcome), pb::CompactionReason::Applied);

    let requests = app.provider.requests();
    assert!(
        requests.len() >= 2,
        "{} requests for a ~1,600-token input under a {WINDOW}-token window",
        requests.len()
    );
    for (i, r) in requests.iter().enumerate() {
        let chars = r.message_chars();
        assert!(
            chars / 4 <= WINDOW as usize,
            "request {i}: {chars} characters exceed a {WINDOW}-token window"
        );
        assert_eq!(r.body["max_tokens"], 200);
        let prompt = r.content("user");
        if i == 0 {
            assert!(!prompt.contains("Summary so far:"), "{prompt}");
        } else {
            assert!(
                prompt.contains(&format!("Summary so far:\n{}", answers[i - 1])),
                "request {i} carries the previous answer: {prompt}"
            );
        }
    }
    for t in 0..2 {
        assert!(
            requests
                .iter()
                .any(|r| r.content("user").contains(&request_text(t))),
            "request {t} is in some chunk"
        );
    }

    let last = &answers[requests.len() - 1];
    let list = app.summaries(&s).await;
    assert_eq!(list.summaries.len(), 1);
    assert_eq!(&list.summaries[0].text, last);
    assert_eq!(app.compaction_count(&s).await, 1);
    let after = app.render(&s).await;
    assert!(text_of(&after.messages[1].parts).contains(last.as_str()));
}

// ---------------------------------------------------------------- 6. bounds

#[tokio::test]
async fn a_compact_past_its_deadline_is_recorded_as_cancelled() {
    let mut app = spawn(Limits::default()).await;
    let s = app.build_session().await;
    let before = app.render(&s).await;
    app.provider
        .push(Reply::ok(GOOD_SUMMARY).after(Duration::from_secs(5)));

    let mut request = tonic::Request::new(compact_req(&s));
    request.set_timeout(Duration::from_millis(300));
    let started = Instant::now();
    let result = tokio::time::timeout(Duration::from_secs(4), app.client.compact(request))
        .await
        .expect("the deadline ends the call well before the provider answers");
    let status = result.expect_err("the deadline passes before the summary");
    assert!(
        matches!(status.code(), Code::DeadlineExceeded | Code::Cancelled),
        "{status:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(3));
    assert_eq!(app.provider.request_count(), 1);

    // The server records the cancellation once the dropped call has been cleaned up.
    let deadline = Instant::now() + Duration::from_secs(5);
    let list = loop {
        let list = app.summaries(&s).await;
        if list.events.iter().any(|e| e.kind != "prepared") || Instant::now() > deadline {
            break list;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(list.events.len(), 2, "{:?}", list.events);
    assert_eq!(list.events[0].kind, "prepared");
    assert_eq!(list.events[1].kind, "cancelled");
    assert_eq!(
        event_reason(&list.events[1]),
        pb::CompactionReason::Cancelled
    );
    assert_eq!(list.events[1].compaction_id, list.events[0].compaction_id);
    assert_nothing_written(&mut app, &s, &before, 0).await;
}

#[tokio::test]
async fn exhausting_max_calls_fails() {
    let mut app = spawn(Limits {
        window_tokens: 1500,
        max_output_tokens: 200,
        max_calls: 1,
        ..Limits::default()
    })
    .await;
    let s = app.build_session().await;
    let before = app.render(&s).await;
    app.provider.set_fallback(Reply::ok(GOOD_SUMMARY));

    let outcome = app.compact(&s).await;
    assert!(!outcome.applied, "{outcome:?}");
    assert_eq!(reason_of(&outcome), pb::CompactionReason::Failed);
    assert!(outcome.message.contains("calls"), "{}", outcome.message);
    assert_eq!(app.provider.request_count(), 1, "max_calls = 1");

    assert_prepared_then_rejected(&mut app, &s, &outcome, pb::CompactionReason::Failed).await;
    assert_nothing_written(&mut app, &s, &before, 0).await;
}

#[tokio::test]
async fn the_summarizer_timeout_fails() {
    let mut app = spawn(Limits {
        timeout: Duration::from_millis(300),
        ..Limits::default()
    })
    .await;
    let s = app.build_session().await;
    let before = app.render(&s).await;
    app.provider
        .push(Reply::ok(GOOD_SUMMARY).after(Duration::from_secs(5)));

    let outcome = tokio::time::timeout(Duration::from_secs(4), app.compact(&s))
        .await
        .expect("the summarizer's own timeout ends the call");
    assert!(!outcome.applied, "{outcome:?}");
    assert_eq!(reason_of(&outcome), pb::CompactionReason::Failed);

    assert_prepared_then_rejected(&mut app, &s, &outcome, pb::CompactionReason::Failed).await;
    assert_nothing_written(&mut app, &s, &before, 0).await;
}

// ---------------------------------------------------------------- 7. reuse

#[tokio::test]
async fn an_identical_source_reuses_the_summary_without_calling_the_model() {
    let mut app = spawn(Limits::default()).await;
    let a = app.build_session().await;
    let b = app.build_session().await;
    app.provider.push(Reply::ok(GOOD_SUMMARY));

    let first = app.compact(&a).await;
    assert!(first.applied, "{first:?}");
    assert_eq!(app.provider.request_count(), 1);

    let second = app.compact(&b).await;
    assert!(second.applied, "{second:?}");
    assert_eq!(reason_of(&second), pb::CompactionReason::Applied);
    assert_eq!(app.provider.request_count(), 1, "no second model call");
    assert_eq!(second.tokens_before, first.tokens_before);
    assert_eq!(second.tokens_after, first.tokens_after);
    assert_ne!(second.summary_id, first.summary_id);

    let list_a = app.summaries(&a).await;
    let list_b = app.summaries(&b).await;
    assert_eq!(list_b.summaries.len(), 1);
    assert_eq!(list_b.summaries[0].text, GOOD_SUMMARY);
    assert_eq!(list_b.summaries[0].text, list_a.summaries[0].text);
    assert_eq!(list_b.summaries[0].model, "test-model");
    assert_eq!(
        events_of(&list_b, &second.compaction_id),
        vec![
            ("prepared".to_owned(), pb::CompactionReason::Unspecified),
            ("committed".to_owned(), pb::CompactionReason::Applied),
        ]
    );
    assert_eq!(app.compaction_count(&a).await, 1);
    assert_eq!(app.compaction_count(&b).await, 1);
    let render_a = app.render(&a).await;
    let render_b = app.render(&b).await;
    assert_eq!(
        text_of(&render_a.messages[1].parts),
        text_of(&render_b.messages[1].parts)
    );
    assert_eq!(
        transcript(&render_a.messages),
        transcript(&render_b.messages)
    );
}

// ---------------------------------------------------------------- 8, 9. preconditions

#[tokio::test]
async fn compact_without_a_summarizer_says_how_to_configure_one() {
    let mut app = spawn_app().await;
    let s = app.create_session().await;
    app.append(&s, vec![user("hello"), assistant("hi")]).await;
    let result = app.client.compact(compact_req(&s)).await;
    assert_status(result, Code::FailedPrecondition, "--summarizer-url");
    let list = summaries(&mut app.client, &s).await;
    assert!(list.events.is_empty() && list.summaries.is_empty());
    assert_eq!(app.get_session(&s).await.compaction_count, 0);
}

#[tokio::test]
async fn a_session_within_budget_needs_no_compaction_and_no_model_call() {
    let mut app = spawn(Limits::default()).await;
    let s = app.create_session().await;
    app.append(
        &s,
        vec![
            system("You are a careful coding agent."),
            user(&request_text(0)),
            assistant("Done."),
        ],
    )
    .await;
    let before = app.render(&s).await;

    let outcome = app.compact(&s).await;
    assert!(!outcome.applied, "{outcome:?}");
    assert_eq!(reason_of(&outcome), pb::CompactionReason::NotNeeded);
    assert_eq!(outcome.tokens_after, outcome.tokens_before);
    assert!(outcome.tokens_before > 0);
    assert!(outcome.compaction_id.is_empty());
    assert_eq!(app.provider.request_count(), 0);

    let list = app.summaries(&s).await;
    assert!(list.events.is_empty(), "{:?}", list.events);
    assert_nothing_written(&mut app, &s, &before, 0).await;
}
