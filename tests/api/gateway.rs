//! The model gateway (`serve --gateway`) through the real server: an HTTP client on the
//! gateway's listener, the scripted fake provider (tests/common/fake_provider.rs) behind it,
//! and the recorded session read back over gRPC. Both APIs (Anthropic Messages, OpenAI chat
//! completions), streamed and not; recording, forks, cache markers, session keys, passthrough,
//! bad input, upstream failures, API keys and provider credentials. One suite for both backends.

use std::time::Duration;

use ctxd::api::pb;
use ctxd::auth::ApiKeys;
use ctxd::gateway::{Gateway, GatewayPolicy};
use ctxd::server::Options;
use reqwest::header::HeaderMap;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tonic::Code;

use crate::fake_provider::*;
use crate::helpers::*;

/// The most a test waits for an answer before failing (never a readiness sleep).
const PATIENCE: Duration = Duration::from_secs(30);

const MODEL: &str = "claude-test-1";
const PROVIDER_KEY: &str = "sk-ant-secret-XYZ";

// ---------------------------------------------------------------- harness

/// A server with a gateway in front of a fake provider, and an HTTP client.
pub(crate) struct Gw {
    pub(crate) app: TestApp,
    pub(crate) fake: FakeProvider,
    /// The gateway's base URL, e.g. `http://127.0.0.1:4000`.
    pub(crate) url: String,
    pub(crate) http: reqwest::Client,
}

/// What came back: status, headers, the body as received, and whether the body ended in a
/// broken connection rather than a clean end.
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Vec<u8>,
    pub(crate) cut: bool,
}

impl Answer {
    pub(crate) fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "the answer is JSON ({e}): {}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    pub(crate) fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    }

    /// `x-ctxd-session-id`, which must be a UUID.
    #[track_caller]
    pub(crate) fn session(&self) -> String {
        let id = self
            .header("x-ctxd-session-id")
            .unwrap_or_else(|| panic!("x-ctxd-session-id on the answer: {self:?}"));
        uuid::Uuid::parse_str(&id).unwrap_or_else(|_| panic!("session id {id:?} is a UUID"));
        id
    }

    #[track_caller]
    pub(crate) fn branch(&self) -> String {
        let branch = self
            .header("x-ctxd-branch")
            .unwrap_or_else(|| panic!("x-ctxd-branch on the answer: {self:?}"));
        assert!(!branch.is_empty(), "x-ctxd-branch is a branch name");
        branch
    }

    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    #[track_caller]
    pub(crate) fn ok(self) -> Self {
        assert_eq!(
            self.status,
            200,
            "200 expected, got {}: {}",
            self.status,
            self.text()
        );
        self
    }
}

fn install_crypto() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

pub(crate) fn http_client() -> reqwest::Client {
    install_crypto();
    reqwest::Client::builder().build().expect("an HTTP client")
}

/// A gateway over `fake` with `policy`, on a server with `options`.
pub(crate) async fn start_full(
    fake: FakeProvider,
    upstream: Option<String>,
    policy: GatewayPolicy,
    options: Options,
) -> Gw {
    start_configured(fake, upstream, options, |gateway| gateway.policy = policy).await
}

/// A gateway over `fake` (or `upstream`), as `configure` sets it, on a server with `options`.
pub(crate) async fn start_configured(
    fake: FakeProvider,
    upstream: Option<String>,
    options: Options,
    configure: impl FnOnce(&mut Gateway),
) -> Gw {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("local addr"));
    let upstream = upstream.unwrap_or_else(|| fake.url());
    let mut gateway = Gateway::new(listener, upstream.clone(), upstream);
    configure(&mut gateway);
    let app = spawn_app_with(Options {
        gateway: Some(gateway),
        ..options
    })
    .await;
    Gw {
        app,
        fake,
        url,
        http: http_client(),
    }
}

pub(crate) async fn start() -> Gw {
    start_full(
        FakeProvider::start().await,
        None,
        GatewayPolicy::default(),
        Options::default(),
    )
    .await
}

/// A port nothing listens on: bound, read, released.
pub(crate) async fn dead_url() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("local addr");
    drop(listener);
    format!("http://{addr}")
}

impl Gw {
    /// Sends `body` to `path` with `headers`; the response (headers received).
    pub(crate) async fn send(
        &self,
        path: &str,
        headers: &[(&str, &str)],
        body: Vec<u8>,
    ) -> reqwest::Response {
        let mut request = self
            .http
            .post(format!("{}{path}", self.url))
            .header("content-type", "application/json")
            .body(body);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        tokio::time::timeout(PATIENCE, request.send())
            .await
            .expect("the gateway answers in time")
            .expect("the gateway answers")
    }

    pub(crate) async fn post(&self, path: &str, headers: &[(&str, &str)], body: Vec<u8>) -> Answer {
        read_answer(self.send(path, headers, body).await).await
    }

    /// `POST /v1/messages` as an Anthropic SDK sends it, with `extra` headers.
    pub(crate) async fn messages_with(&self, body: &Value, extra: &[(&str, &str)]) -> Answer {
        let mut headers = vec![
            ("anthropic-version", "2023-06-01"),
            ("x-api-key", PROVIDER_KEY),
        ];
        headers.extend_from_slice(extra);
        self.post("/v1/messages", &headers, body.to_string().into_bytes())
            .await
    }

    pub(crate) async fn messages(&self, body: &Value) -> Answer {
        self.messages_with(body, &[]).await
    }

    /// `POST /v1/chat/completions` as an OpenAI SDK sends it.
    pub(crate) async fn chat_with(&self, body: &Value, extra: &[(&str, &str)]) -> Answer {
        let bearer = format!("Bearer {PROVIDER_KEY}");
        let mut headers = vec![("authorization", bearer.as_str())];
        headers.extend_from_slice(extra);
        self.post(
            "/v1/chat/completions",
            &headers,
            body.to_string().into_bytes(),
        )
        .await
    }

    pub(crate) async fn chat(&self, body: &Value) -> Answer {
        self.chat_with(body, &[]).await
    }

    /// The nodes of `branch`, oldest first, one line each (see [`describe`]).
    pub(crate) async fn transcript(&mut self, session: &str, branch: &str) -> Vec<String> {
        let mut nodes = self.app.log(session, branch).await;
        nodes.reverse();
        nodes.iter().map(describe).collect()
    }

    pub(crate) async fn node_count(&mut self, session: &str, branch: &str) -> usize {
        self.app.log(session, branch).await.len()
    }

    /// The transcript of `branch` once `done` holds for it (see [`wait_for_transcript`]).
    pub(crate) async fn wait_for(
        &mut self,
        session: &str,
        branch: &str,
        done: impl Fn(&[String]) -> bool,
    ) -> Vec<String> {
        wait_for_transcript(&mut self.app.client, session, branch, done).await
    }

    /// The transcript of `branch` once it holds `n` nodes, the last an assistant's answer.
    pub(crate) async fn answered(&mut self, session: &str, branch: &str, n: usize) -> Vec<String> {
        self.wait_for(session, branch, |lines| {
            lines.len() >= n && lines.last().is_some_and(|l| l.starts_with("assistant"))
        })
        .await
    }

    /// The upstream requests to `path`.
    pub(crate) fn upstream(&self, path: &str) -> Vec<Recorded> {
        self.fake
            .requests()
            .into_iter()
            .filter(|r| r.path == path)
            .collect()
    }

    #[track_caller]
    pub(crate) fn last_upstream(&self) -> Recorded {
        self.fake.last_request()
    }
}

/// The session's gateway ledger once it holds `n` rows (at most [`PATIENCE`]): a call's usage
/// is recorded once its answer is relayed whole, so the last may trail the answer.
pub(crate) async fn gateway_calls(
    client: &mut Client,
    session: &str,
    n: usize,
) -> Vec<pb::GatewayCall> {
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        let calls = client
            .list_gateway_calls(pb::ListGatewayCallsRequest {
                session_id: session.to_owned(),
                page_size: 0,
                page_token: String::new(),
            })
            .await
            .expect("ListGatewayCalls")
            .into_inner()
            .calls;
        if calls.len() >= n || std::time::Instant::now() > deadline {
            return calls;
        }
        tokio::task::yield_now().await;
    }
}

/// The nodes of `branch` as `client`'s server reads them, oldest first, one line each (see
/// [`describe`]).
pub(crate) async fn transcript_of(client: &mut Client, session: &str, branch: &str) -> Vec<String> {
    let mut request = pb::LogRequest {
        session_id: session.into(),
        branch: branch.into(),
        ..Default::default()
    };
    let mut nodes = Vec::new();
    loop {
        let page = client.log(request.clone()).await.expect("Log").into_inner();
        nodes.extend(page.nodes);
        if page.next_page_token.is_empty() {
            return nodes.iter().rev().map(describe).collect();
        }
        request.page_token = page.next_page_token;
    }
}

/// The transcript of `branch` once `done` holds for it, as `client`'s server reads it. The
/// gateway appends an answer after relaying it, so this waits on the session's Watch stream for
/// the append (a server is signalled by its own commits; no sleeping, at most [`PATIENCE`]).
pub(crate) async fn wait_for_transcript(
    client: &mut Client,
    session: &str,
    branch: &str,
    done: impl Fn(&[String]) -> bool,
) -> Vec<String> {
    let mut watch = client
        .watch(pb::WatchRequest {
            session_id: session.into(),
            branch: branch.into(),
            ..Default::default()
        })
        .await
        .expect("Watch")
        .into_inner();
    let mut last = Vec::new();
    let wait = async {
        loop {
            last = transcript_of(client, session, branch).await;
            if done(&last) {
                return last.clone();
            }
            watch
                .message()
                .await
                .expect("the watch goes on")
                .expect("the watch does not end");
        }
    };
    match tokio::time::timeout(PATIENCE, wait).await {
        Ok(lines) => lines,
        Err(_) => panic!("{branch} of {session} never got there: {last:?}"),
    }
}

/// Reads the whole body; a broken connection ends it with `cut`.
pub(crate) async fn read_answer(mut response: reqwest::Response) -> Answer {
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let mut body = Vec::new();
    let mut cut = false;
    let read = async {
        loop {
            match response.chunk().await {
                Ok(Some(chunk)) => body.extend_from_slice(&chunk),
                Ok(None) => break,
                Err(_) => {
                    cut = true;
                    break;
                }
            }
        }
    };
    tokio::time::timeout(PATIENCE, read)
        .await
        .expect("the answer's body ends in time");
    Answer {
        status,
        headers,
        body,
        cut,
    }
}

/// A node as one line: `user: hello`, `assistant: text -> call1,call2`, `tool[call1]: out`.
pub(crate) fn describe(node: &pb::Node) -> String {
    use pb::node_input::Kind;
    match node.content.as_ref().and_then(|c| c.kind.as_ref()) {
        Some(Kind::Message(m)) => {
            let role = match pb::Role::try_from(m.role) {
                Ok(pb::Role::System) => "system",
                Ok(pb::Role::Developer) => "developer",
                Ok(pb::Role::User) => "user",
                Ok(pb::Role::Assistant) => "assistant",
                Ok(pb::Role::Tool) => "tool",
                _ => "role?",
            };
            let mut line = format!("{role}: {}", text_of(&m.parts));
            if !m.tool_calls.is_empty() {
                let ids: Vec<&str> = m.tool_calls.iter().map(|c| c.call_id.as_str()).collect();
                line.push_str(&format!(" -> {}", ids.join(",")));
            }
            line
        }
        Some(Kind::ToolResult(r)) => format!("tool[{}]: {}", r.call_id, text_of(&r.parts)),
        other => format!("{other:?}"),
    }
}

/// A Messages API request of `messages`.
pub(crate) fn anthropic(messages: Value) -> Value {
    json!({"model": MODEL, "max_tokens": 1024, "messages": messages})
}

pub(crate) fn anthropic_stream(messages: Value) -> Value {
    json!({"model": MODEL, "max_tokens": 1024, "stream": true, "messages": messages})
}

/// A chat completions request of `messages`.
pub(crate) fn openai(messages: Value) -> Value {
    json!({"model": "gpt-test", "messages": messages})
}

pub(crate) fn openai_stream(messages: Value) -> Value {
    json!({
        "model": "gpt-test",
        "stream": true,
        "stream_options": {"include_usage": true},
        "messages": messages,
    })
}

pub(crate) fn user_msg(text: &str) -> Value {
    json!({"role": "user", "content": text})
}

pub(crate) fn assistant_msg(text: &str) -> Value {
    json!({"role": "assistant", "content": [{"type": "text", "text": text}]})
}

/// How many `cache_control` keys `value` holds, at any depth.
pub(crate) fn markers(value: &Value) -> usize {
    match value {
        Value::Object(map) => map
            .iter()
            .map(|(k, v)| usize::from(k == "cache_control") + markers(v))
            .sum(),
        Value::Array(items) => items.iter().map(markers).sum(),
        _ => 0,
    }
}

/// The request headers the gateway keeps to itself.
#[track_caller]
fn assert_no_ctxd_headers(request: &Recorded) {
    for name in ["x-ctxd-session", "x-ctxd-policy", "x-ctxd-api-key"] {
        assert!(
            request.headers.get(name).is_none(),
            "{name} is not forwarded upstream: {:?}",
            request.headers
        );
    }
}

/// Sessions the unkeyed client lists.
pub(crate) async fn sessions(app: &mut TestApp) -> Vec<String> {
    app.client
        .list_sessions(pb::ListSessionsRequest {
            page_size: 1000,
            ..Default::default()
        })
        .await
        .expect("ListSessions")
        .into_inner()
        .sessions
        .into_iter()
        .map(|s| s.session_id)
        .collect()
}

// ---------------------------------------------------------------- the fake provider itself

#[tokio::test]
async fn gateway_fake_provider_speaks_both_apis() {
    let fake = FakeProvider::start().await;
    let http = http_client();
    fake.script(Reply::thinking(
        "hmm",
        "sig+/=",
        Reply::tool_use_id("t1", "calc", json!({"x": 1})),
    ));
    // A breakpoint on the message: the imitated cache writes and reads only at one.
    let hi = json!({"role": "user", "content": [
        {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]});
    let body = anthropic_stream(json!([hi]));
    let response = http
        .post(format!("{}/v1/messages", fake.url()))
        .body(body.to_string())
        .send()
        .await
        .expect("send");
    let answer = read_answer(response).await.ok();
    let names: Vec<String> = parse_sse(&answer.body)
        .into_iter()
        .map(|e| e.event)
        .collect();
    assert_eq!(names.first().map(String::as_str), Some("message_start"));
    assert_eq!(names.last().map(String::as_str), Some("message_stop"));
    let message = anthropic_message_of_sse(&answer.body).expect("a whole message");
    assert_eq!(
        message["content"],
        json!([
            {"type": "thinking", "thinking": "hmm", "signature": "sig+/="},
            {"type": "tool_use", "id": "t1", "name": "calc", "input": {"x": 1}},
        ])
    );
    assert_eq!(message["stop_reason"], "tool_use");
    assert_eq!(answer.body, fake.last_request().response.to_vec());

    // The same request again: its whole prompt is read from the imitated cache.
    let response = http
        .post(format!("{}/v1/messages", fake.url()))
        .body(anthropic(json!([hi])).to_string())
        .send()
        .await
        .expect("send");
    let answer = read_answer(response).await.ok().json();
    let usage = &answer["usage"];
    assert_eq!(usage["input_tokens"], 0);
    assert_eq!(usage["cache_creation_input_tokens"], 0);
    assert_eq!(
        usage["cache_read_input_tokens"].as_u64(),
        Some(tokens_of(&json!({"type": "text", "text": "hi"})))
    );
    assert_eq!(
        answer["content"],
        json!([{"type": "text", "text": DEFAULT_TEXT}])
    );

    fake.script(Reply::text_and_tool_use("look", "read", json!({"p": "a"})));
    let response = http
        .post(format!("{}/v1/chat/completions", fake.url()))
        .body(openai_stream(json!([user_msg("hi")])).to_string())
        .send()
        .await
        .expect("send");
    let answer = read_answer(response).await.ok();
    let (message, finish) = openai_message_of_sse(&answer.body).expect("a whole completion");
    assert_eq!(finish, "tool_calls");
    assert_eq!(message["content"], "look");
    assert_eq!(
        message["tool_calls"][0]["function"]["arguments"],
        r#"{"p":"a"}"#
    );
    assert!(answer.text().ends_with("data: [DONE]\n\n"));

    let response = http
        .post(format!("{}/v1/elsewhere", fake.url()))
        .send()
        .await
        .expect("send");
    assert_eq!(response.status().as_u16(), 404);
    assert_eq!(fake.request_count(), 4);
}

// ---------------------------------------------------------------- Anthropic

#[tokio::test]
async fn gateway_anthropic_answer_is_relayed_and_recorded() {
    let mut gw = start().await;
    gw.fake.script(Reply::text("Hello from the model."));
    let answer = gw
        .messages(&anthropic(json!([user_msg("hello")])))
        .await
        .ok();
    let upstream = gw.last_upstream();
    assert_eq!(upstream.path, "/v1/messages");
    assert_eq!(
        answer.body,
        upstream.response.to_vec(),
        "the body is relayed byte for byte"
    );
    assert_eq!(answer.json()["content"][0]["text"], "Hello from the model.");
    let (session, branch) = (answer.session(), answer.branch());
    assert_eq!(
        gw.answered(&session, &branch, 2).await,
        ["user: hello", "assistant: Hello from the model."]
    );
    // The upstream got the conversation and the provider headers, not ctxd's.
    assert_eq!(upstream.messages().len(), 1);
    assert_eq!(upstream.body["model"], MODEL);
    assert_eq!(upstream.body["max_tokens"], 1024);
    assert_eq!(upstream.header("anthropic-version"), Some("2023-06-01"));
    assert_no_ctxd_headers(&upstream);
    assert_eq!(sessions(&mut gw.app).await, [session]);
}

#[tokio::test]
async fn gateway_anthropic_stream_is_relayed_event_by_event() {
    let mut gw = start().await;
    gw.fake
        .script(Reply::text("A streamed answer, in several pieces."));
    let answer = gw
        .messages(&anthropic_stream(json!([user_msg("stream please")])))
        .await
        .ok();
    assert!(!answer.cut);
    assert!(
        answer
            .header("content-type")
            .is_some_and(|t| t.starts_with("text/event-stream")),
        "an event stream: {:?}",
        answer.headers
    );
    let sent = gw.last_upstream().response;
    let events = parse_sse(&answer.body);
    assert_eq!(events, parse_sse(&sent), "the same events, in order");
    assert!(events.len() >= 7, "the whole stream: {events:?}");
    let (session, branch) = (answer.session(), answer.branch());
    assert_eq!(
        gw.answered(&session, &branch, 2).await,
        [
            "user: stream please",
            "assistant: A streamed answer, in several pieces."
        ]
    );
}

#[tokio::test]
async fn gateway_anthropic_stream_events_arrive_before_the_stream_ends() {
    let mut gw = start().await;
    // The provider sends message_start and ping, then holds the rest until the gate opens.
    let (reply, gate) = Reply::text("first half, second half").paused_after(2);
    gw.fake.script(reply);
    let mut response = gw
        .send(
            "/v1/messages",
            &[
                ("anthropic-version", "2023-06-01"),
                ("x-api-key", PROVIDER_KEY),
            ],
            anthropic_stream(json!([user_msg("hold on")]))
                .to_string()
                .into_bytes(),
        )
        .await;
    assert_eq!(response.status().as_u16(), 200);
    let mut body = Vec::new();
    let first = async {
        while !parse_sse(&body).iter().any(|e| e.event == "message_start") {
            let chunk = response
                .chunk()
                .await
                .expect("the stream goes on")
                .expect("more of the stream");
            body.extend_from_slice(&chunk);
        }
    };
    tokio::time::timeout(PATIENCE, first)
        .await
        .expect("message_start reaches the client while the provider holds the rest");
    gate.open();
    let rest = read_answer(response).await;
    body.extend_from_slice(&rest.body);
    assert!(!rest.cut);
    assert_eq!(parse_sse(&body), parse_sse(&gw.last_upstream().response));
    let session = rest.session();
    assert_eq!(
        gw.answered(&session, &rest.branch(), 2).await,
        ["user: hold on", "assistant: first half, second half"]
    );
}

/// What the client has whole is recorded: once an answer's body has ended for the client, the
/// session holds it (an agent sends its next request at once, and a reader of the session
/// right after a turn must see it). Checked on turns streamed and not, reading the log as soon
/// as each body ends, without waiting.
#[tokio::test]
async fn gateway_answer_is_recorded_when_the_client_has_it() {
    let mut gw = start().await;
    let mut history = vec![user_msg("Turn 0.")];
    let mut session = String::new();
    for turn in 0..6 {
        let text = format!("Answer {turn}.");
        gw.fake.script(Reply::text(text.clone()));
        let body = if turn % 2 == 0 {
            anthropic_stream(Value::Array(history.clone()))
        } else {
            anthropic(Value::Array(history.clone()))
        };
        let answer = gw.messages(&body).await.ok();
        session = answer.session();
        let lines = gw.transcript(&session, &answer.branch()).await;
        assert_eq!(
            lines.last().map(String::as_str),
            Some(format!("assistant: {text}").as_str()),
            "turn {turn}: the answer the client holds is recorded by the time its body ends"
        );
        history.push(assistant_msg(&text));
        history.push(user_msg(&format!("Turn {}.", turn + 1)));
    }
    assert_eq!(gw.app.branches(&session).await.len(), 1);
}

#[tokio::test]
async fn gateway_resent_history_appends_only_what_is_new() {
    let mut gw = start().await;
    gw.fake.script(Reply::tool_use_id(
        "toolu_01",
        "list_files",
        json!({"dir": "."}),
    ));
    let first_user = user_msg("which files are here?");
    let first = gw.messages(&anthropic(json!([first_user]))).await.ok();
    let (session, branch) = (first.session(), first.branch());
    assert_eq!(
        gw.answered(&session, &branch, 2).await,
        ["user: which files are here?", "assistant:  -> toolu_01"]
    );

    // The client resends the whole history, the call as it came back, and the result.
    let call = json!({"role": "assistant", "content": first.json()["content"]});
    let result = json!({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_01", "content": "a.txt\nb.txt"},
    ]});
    gw.fake.script(Reply::text("There are two files."));
    let history = json!([first_user, call, result]);
    let second = gw.messages(&anthropic(history.clone())).await.ok();
    assert_eq!(second.session(), session);
    assert_eq!(second.branch(), branch);
    assert_eq!(
        gw.answered(&session, &branch, 4).await,
        [
            "user: which files are here?",
            "assistant:  -> toolu_01",
            "tool[toolu_01]: a.txt\nb.txt",
            "assistant: There are two files.",
        ]
    );

    // The identical history again, answered by an error: nothing is appended.
    gw.fake.script(Reply::anthropic_error(
        529,
        "overloaded_error",
        "Overloaded",
    ));
    let again = gw.messages(&anthropic(history.clone())).await;
    assert_eq!(again.status, 529);
    assert_eq!(gw.node_count(&session, &branch).await, 4);
    // And again, answered as before: the same nodes, so nothing new.
    gw.fake.script(Reply::text("There are two files."));
    let retry = gw.messages(&anthropic(history.clone())).await.ok();
    assert_eq!(retry.session(), session);
    // The conversation goes on (which also orders the check after the retry's answer was
    // handled): two new nodes, and no others.
    let mut longer = history.as_array().expect("history").clone();
    longer.push(assistant_msg("There are two files."));
    longer.push(user_msg("Thanks."));
    let next = gw.messages(&anthropic(Value::Array(longer))).await.ok();
    let lines = gw.answered(&session, &next.branch(), 6).await;
    assert_eq!(lines.len(), 6, "{lines:?}");
    let branches = gw.app.branches(&session).await;
    assert_eq!(
        gw.app.node_count().await,
        6,
        "the resent history and its identical answer append nothing; branches: {branches:?}"
    );
    assert_eq!(
        retry.branch(),
        branch,
        "the resent history stays on its branch"
    );
    assert_eq!(next.branch(), branch);
    assert_eq!(branches.len(), 1, "{branches:?}");
    assert_eq!(sessions(&mut gw.app).await, [session]);
}

#[tokio::test]
async fn gateway_edited_earlier_message_forks_a_branch() {
    let mut gw = start().await;
    let u1 = user_msg("Plan a trip to Lisbon.");
    gw.fake.script(Reply::text("Day one: Alfama."));
    let first = gw.messages(&anthropic(json!([u1]))).await.ok();
    let (session, main) = (first.session(), first.branch());
    let a1 = assistant_msg("Day one: Alfama.");
    gw.fake.script(Reply::text("Day two: Belém."));
    gw.messages(&anthropic(json!([u1, a1, user_msg("And day two?")])))
        .await
        .ok();
    gw.answered(&session, &main, 4).await;
    let before = gw.app.log(&session, &main).await;
    assert_eq!(before.len(), 4);

    // The client edits its second message and sends the history again.
    gw.fake.script(Reply::text("Day two: Sintra."));
    let edited = gw
        .messages(&anthropic(json!([
            u1,
            a1,
            user_msg("And day two, outside the city?")
        ])))
        .await
        .ok();
    assert_eq!(edited.session(), session, "an edit stays in its session");
    let fork = edited.branch();
    assert_ne!(fork, main, "the edit is recorded on a new branch");
    let branches = gw.app.branches(&session).await;
    assert_eq!(branches.len(), 2, "{branches:?}");
    assert_eq!(
        gw.answered(&session, &fork, 4).await,
        [
            "user: Plan a trip to Lisbon.",
            "assistant: Day one: Alfama.",
            "user: And day two, outside the city?",
            "assistant: Day two: Sintra.",
        ]
    );
    // The fork shares the first two nodes; the original branch is untouched.
    let forked = gw.app.log(&session, &fork).await;
    assert_eq!(forked[2].node_id, before[2].node_id);
    assert_eq!(forked[3].node_id, before[3].node_id);
    assert_eq!(gw.app.log(&session, &main).await, before);
    // What went upstream is the edited history.
    let upstream = gw.last_upstream().messages();
    assert_eq!(upstream.len(), 3);
    assert!(upstream[2].to_string().contains("outside the city"));
}

#[tokio::test]
async fn gateway_tool_use_round_trip_reaches_the_provider_paired() {
    let mut gw = start().await;
    gw.fake.script(Reply::text_and_tool_use(
        "Let me read it.",
        "read_file",
        json!({"path": "src/main.rs", "lines": [1, 20]}),
    ));
    let question = user_msg("What does main.rs do?");
    let first = gw.messages(&anthropic_stream(json!([question]))).await.ok();
    let message = anthropic_message_of_sse(&first.body).expect("a whole streamed message");
    let tool_use = message["content"][1].clone();
    assert_eq!(tool_use["type"], "tool_use");
    let id = tool_use["id"].as_str().expect("a tool_use id").to_owned();
    let (session, branch) = (first.session(), first.branch());
    assert_eq!(
        gw.answered(&session, &branch, 2).await,
        [
            "user: What does main.rs do?".to_owned(),
            format!("assistant: Let me read it. -> {id}"),
        ]
    );

    gw.fake.script(Reply::text("It prints a greeting."));
    let history = json!([
        question,
        {"role": "assistant", "content": message["content"]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": id, "content": "fn main() { println!(\"hi\"); }"},
        ]},
    ]);
    let second = gw.messages(&anthropic(history)).await.ok();
    assert_eq!(second.session(), session);
    assert_eq!(second.json()["content"][0]["text"], "It prints a greeting.");

    let upstream = gw.upstream("/v1/messages");
    assert_eq!(upstream.len(), 2);
    let sent = upstream[1].messages();
    let at = sent
        .iter()
        .position(|m| {
            m["role"] == "assistant"
                && m["content"]
                    .as_array()
                    .is_some_and(|c| c.iter().any(|b| b["type"] == "tool_use" && b["id"] == id))
        })
        .unwrap_or_else(|| panic!("the tool call is forwarded: {sent:?}"));
    let call = sent[at]["content"]
        .as_array()
        .and_then(|c| c.iter().find(|b| b["type"] == "tool_use"))
        .expect("the call");
    assert_eq!(call["name"], "read_file");
    assert_eq!(
        call["input"],
        json!({"path": "src/main.rs", "lines": [1, 20]})
    );
    let answer = sent.get(at + 1).expect("a message after the call");
    assert_eq!(answer["role"], "user");
    let result = answer["content"]
        .as_array()
        .and_then(|c| c.first())
        .expect("the result block");
    assert_eq!(result["type"], "tool_result");
    assert_eq!(result["tool_use_id"], id.as_str());
    assert!(
        result["content"].to_string().contains("println!"),
        "the result's content is forwarded: {result}"
    );
    let transcript = gw.answered(&session, &branch, 4).await;
    assert_eq!(transcript.len(), 4, "{transcript:?}");
    assert_eq!(
        transcript[2],
        format!("tool[{id}]: fn main() {{ println!(\"hi\"); }}")
    );
}

#[tokio::test]
async fn gateway_thinking_and_signature_come_back_byte_identical() {
    let gw = start().await;
    let thinking = "Let me think: \"x\" → 1, then λ…\nStep 2: \\escape\\ and a tab\t.";
    let signature = "EqQBCkYIBxgCKkDu+/pGMvz7Jfl8+K9Q0nTTQc=";
    let redacted = "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr3qpP";
    gw.fake.script(Reply::blocks(vec![
        Block::Thinking {
            thinking: thinking.into(),
            signature: signature.into(),
        },
        Block::RedactedThinking(redacted.into()),
        Block::ToolUse {
            id: "toolu_think".into(),
            name: "calc".into(),
            input: json!({"expr": "6*7"}),
        },
    ]));
    let question = user_msg("What is six times seven?");
    let first = gw.messages(&anthropic_stream(json!([question]))).await.ok();
    let message = anthropic_message_of_sse(&first.body).expect("a whole streamed message");
    let content = message["content"].as_array().expect("content").clone();
    assert_eq!(
        content[0],
        json!({"type": "thinking", "thinking": thinking, "signature": signature})
    );
    assert_eq!(
        content[1],
        json!({"type": "redacted_thinking", "data": redacted})
    );

    gw.fake.script(Reply::text("42."));
    let history = json!([
        question,
        {"role": "assistant", "content": content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_think", "content": "42"}]},
    ]);
    gw.messages(&anthropic(history)).await.ok();
    let sent = gw.last_upstream().messages();
    let assistant = sent
        .iter()
        .find(|m| m["role"] == "assistant")
        .unwrap_or_else(|| panic!("the assistant turn is forwarded: {sent:?}"));
    let blocks = assistant["content"].as_array().expect("blocks");
    assert_eq!(blocks[0]["type"], "thinking");
    assert_eq!(blocks[0]["thinking"].as_str(), Some(thinking));
    assert_eq!(blocks[0]["signature"].as_str(), Some(signature));
    assert_eq!(
        blocks[0],
        json!({"type": "thinking", "thinking": thinking, "signature": signature}),
        "nothing added to or dropped from the thinking block"
    );
    assert_eq!(
        blocks[1],
        json!({"type": "redacted_thinking", "data": redacted})
    );
    assert_eq!(blocks[2]["id"], "toolu_think");
    // The raw bytes carry the same escaped strings the client sent.
    let raw = String::from_utf8_lossy(&gw.last_upstream().raw).into_owned();
    assert!(raw.contains(&Value::String(signature.into()).to_string()));
}

#[tokio::test]
async fn gateway_moving_cache_markers_forks_nothing() {
    let mut gw = start().await;
    let ephemeral = json!({"type": "ephemeral"});
    let system = json!([{"type": "text", "text": "You are a careful coding agent.", "cache_control": ephemeral}]);
    let tools = json!([{
        "name": "read_file",
        "description": "Reads a file.",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
        "cache_control": ephemeral,
    }]);
    // Plain history: turns as blocks, markers added per call.
    let mut history: Vec<Value> = Vec::new();
    let mut session = None;
    let mut previous_read = 0;
    for turn in 0..4 {
        history.push(json!({"role": "user", "content": [{"type": "text", "text": format!("Question number {turn}, please answer at length.")}]}));
        // Claude Code's placement: system, tools and the last two messages, 4 in all.
        let mut messages = history.clone();
        let n = messages.len();
        for m in messages.iter_mut().skip(n.saturating_sub(2)) {
            let blocks = m["content"].as_array_mut().expect("blocks");
            let last = blocks.last_mut().expect("a block");
            last["cache_control"] = ephemeral.clone();
        }
        let body = json!({
            "model": MODEL,
            "max_tokens": 1024,
            "system": system,
            "tools": tools,
            "messages": messages,
        });
        assert_eq!(markers(&body), 4.min(2 + n));
        let text = format!("Answer number {turn}.");
        gw.fake.script(Reply::text(text.clone()));
        let answer = gw.messages(&body).await.ok();
        let id = answer.session();
        assert_eq!(*session.get_or_insert(id.clone()), id, "one session");
        let branch = answer.branch();
        let lines = gw.answered(&id, &branch, 2 * (turn + 1)).await;
        assert_eq!(lines.len(), 2 * (turn + 1), "{lines:?}");
        assert_eq!(
            gw.app.branches(&id).await.len(),
            1,
            "moving markers forks nothing (turn {turn})"
        );

        let upstream = gw.last_upstream();
        let forwarded = markers(&upstream.body);
        assert!(
            forwarded <= 4,
            "at most 4 cache markers forwarded, got {forwarded}: {}",
            upstream.body
        );
        let newest = upstream.messages().last().cloned().expect("messages");
        assert!(
            markers(&newest) > 0,
            "the newest message keeps its marker: {newest}"
        );
        // The forwarded prefix stays stable, so the provider's cache reads grow.
        let read = upstream.usage["cache_read_input_tokens"]
            .as_u64()
            .expect("usage");
        if turn > 0 {
            assert!(
                read > previous_read,
                "turn {turn}: cache read {read} should exceed {previous_read}"
            );
        }
        previous_read = read;
        history.push(assistant_msg(&text));
    }
}

// ---------------------------------------------------------------- sessions

#[tokio::test]
async fn gateway_session_header_keys_group_calls() {
    let mut gw = start().await;
    let u1 = user_msg("Refactor the parser.");
    let alpha = gw
        .messages_with(&anthropic(json!([u1])), &[("x-ctxd-session", "alpha")])
        .await
        .ok();
    assert_no_ctxd_headers(&gw.last_upstream());
    let again = gw
        .messages_with(
            &anthropic(json!([
                u1,
                assistant_msg(DEFAULT_TEXT),
                user_msg("Now the lexer.")
            ])),
            &[("x-ctxd-session", "alpha")],
        )
        .await
        .ok();
    assert_eq!(
        again.session(),
        alpha.session(),
        "the same key: one session"
    );
    // The same messages under another key: another session.
    let beta = gw
        .messages_with(&anthropic(json!([u1])), &[("x-ctxd-session", "beta")])
        .await
        .ok();
    assert_ne!(
        beta.session(),
        alpha.session(),
        "another key: another session"
    );
    let mut listed = sessions(&mut gw.app).await;
    listed.sort();
    let mut expected = vec![alpha.session(), beta.session()];
    expected.sort();
    assert_eq!(listed, expected);
    let session = alpha.session();
    assert_eq!(gw.answered(&session, &again.branch(), 4).await.len(), 4);
    assert_eq!(
        gw.answered(&beta.session(), &beta.branch(), 2).await.len(),
        2
    );
}

#[tokio::test]
async fn gateway_session_header_naming_a_session_records_into_it() {
    let mut gw = start().await;
    let session = gw.app.create_session().await;
    let answer = gw
        .messages_with(
            &anthropic(json!([user_msg("into an existing session")])),
            &[("x-ctxd-session", session.as_str())],
        )
        .await
        .ok();
    assert_eq!(answer.session(), session);
    assert_eq!(
        gw.answered(&session, &answer.branch(), 2).await,
        [
            "user: into an existing session".to_owned(),
            format!("assistant: {DEFAULT_TEXT}"),
        ]
    );
    assert_eq!(sessions(&mut gw.app).await, [session]);
}

#[tokio::test]
async fn gateway_claude_code_metadata_names_the_session() {
    let mut gw = start().await;
    let user_id = |session: &str| {
        json!({"device_id": "x", "account_uuid": "", "session_id": session}).to_string()
    };
    let cc = |messages: Value, session: &str| {
        let mut body = anthropic(messages);
        body["metadata"] = json!({"user_id": user_id(session)});
        body
    };
    let (s1, s2) = (unknown_id(), unknown_id());
    let u1 = user_msg("Fix the failing test.");
    let first = gw.messages(&cc(json!([u1]), &s1)).await.ok();
    let next = gw
        .messages(&cc(
            json!([
                u1,
                assistant_msg(DEFAULT_TEXT),
                user_msg("And the other one.")
            ]),
            &s1,
        ))
        .await
        .ok();
    assert_eq!(
        next.session(),
        first.session(),
        "one Claude Code session, one ctxd session"
    );
    // The very same opening from another Claude Code session is another session.
    let other = gw.messages(&cc(json!([u1]), &s2)).await.ok();
    assert_ne!(other.session(), first.session());
    // The older `user_<hash>_account__session_<uuid>` form.
    let s3 = unknown_id();
    let old = |messages: Value| {
        let mut body = anthropic(messages);
        body["metadata"] = json!({"user_id": format!("user_0123abcd_account__session_{s3}")});
        body
    };
    let third = gw.messages(&old(json!([u1]))).await.ok();
    let fourth = gw
        .messages(&old(json!([
            u1,
            assistant_msg(DEFAULT_TEXT),
            user_msg("Again.")
        ])))
        .await
        .ok();
    assert_eq!(third.session(), fourth.session());
    assert_ne!(third.session(), first.session());
    assert_ne!(third.session(), other.session());
    assert_eq!(sessions(&mut gw.app).await.len(), 3);
}

#[tokio::test]
async fn gateway_count_tokens_is_forwarded() {
    let mut gw = start().await;
    let u1 = user_msg("Count me in.");
    let first = gw.messages(&anthropic(json!([u1]))).await.ok();
    let session = first.session();
    let before = gw.answered(&session, &first.branch(), 2).await;
    let body = anthropic(json!([
        u1,
        assistant_msg(DEFAULT_TEXT),
        user_msg("How long is this?")
    ]));
    let counted = gw
        .post(
            "/v1/messages/count_tokens",
            &[
                ("anthropic-version", "2023-06-01"),
                ("x-api-key", PROVIDER_KEY),
            ],
            body.to_string().into_bytes(),
        )
        .await
        .ok();
    let upstream = gw.upstream("/v1/messages/count_tokens");
    assert_eq!(upstream.len(), 1, "count_tokens reaches the provider once");
    assert_eq!(counted.body, upstream[0].response.to_vec());
    assert!(
        counted.json()["input_tokens"]
            .as_u64()
            .is_some_and(|n| n > 0)
    );
    assert!(upstream[0].body["messages"].is_array());
    assert_eq!(upstream[0].header("x-api-key"), Some(PROVIDER_KEY));
    let counted_messages = upstream[0].messages();
    assert!(
        counted_messages
            .last()
            .is_some_and(|m| m.to_string().contains("How long is this?")),
        "the count covers the new message: {counted_messages:?}"
    );
    // Counting records nothing.
    assert_eq!(gw.transcript(&session, &first.branch()).await, before);
    assert_eq!(sessions(&mut gw.app).await, [session]);
}

// ---------------------------------------------------------------- OpenAI

#[tokio::test]
async fn gateway_openai_completions_are_relayed_and_recorded() {
    let mut gw = start().await;
    gw.fake.script(Reply::text_and_tool_use(
        "Let me look.",
        "read_file",
        json!({"path": "notes.txt"}),
    ));
    let question = user_msg("What is in notes.txt?");
    let first = gw.chat(&openai_stream(json!([question]))).await.ok();
    assert!(!first.cut);
    assert_eq!(
        parse_sse(&first.body),
        parse_sse(&gw.last_upstream().response),
        "the chunks, in order"
    );
    assert!(first.text().ends_with("data: [DONE]\n\n"));
    let (message, finish) = openai_message_of_sse(&first.body).expect("a whole stream");
    assert_eq!(finish, "tool_calls");
    assert_eq!(message["content"], "Let me look.");
    let call = message["tool_calls"][0].clone();
    let id = call["id"].as_str().expect("a call id").to_owned();
    assert_eq!(call["function"]["name"], "read_file");
    let (session, branch) = (first.session(), first.branch());
    assert_eq!(
        gw.answered(&session, &branch, 2).await,
        [
            "user: What is in notes.txt?".to_owned(),
            format!("assistant: Let me look. -> {id}"),
        ]
    );

    // Not streamed: the history, the call and its result.
    gw.fake.script(Reply::text("It says: buy milk."));
    let history = json!([
        question,
        message,
        {"role": "tool", "tool_call_id": id, "content": "buy milk"},
    ]);
    let second = gw.chat(&openai(history)).await.ok();
    assert_eq!(second.body, gw.last_upstream().response.to_vec());
    assert_eq!(
        second.json()["choices"][0]["message"]["content"],
        "It says: buy milk."
    );
    assert_eq!(second.session(), session);
    assert_eq!(second.branch(), branch);
    assert_eq!(
        gw.answered(&session, &branch, 4).await,
        [
            "user: What is in notes.txt?".to_owned(),
            format!("assistant: Let me look. -> {id}"),
            format!("tool[{id}]: buy milk"),
            "assistant: It says: buy milk.".to_owned(),
        ]
    );
    let sent = gw.last_upstream().messages();
    let at = sent
        .iter()
        .position(|m| m["role"] == "assistant")
        .unwrap_or_else(|| panic!("the call is forwarded: {sent:?}"));
    assert_eq!(sent[at]["tool_calls"][0]["id"], id.as_str());
    assert_eq!(
        serde_json::from_str::<Value>(
            sent[at]["tool_calls"][0]["function"]["arguments"]
                .as_str()
                .expect("arguments as a string")
        )
        .expect("JSON arguments"),
        json!({"path": "notes.txt"})
    );
    assert_eq!(sent[at + 1]["role"], "tool");
    assert_eq!(sent[at + 1]["tool_call_id"], id.as_str());
    assert_eq!(
        gw.last_upstream().header("authorization"),
        Some(format!("Bearer {PROVIDER_KEY}").as_str())
    );
    assert_no_ctxd_headers(&gw.last_upstream());
}

#[tokio::test]
async fn gateway_openai_system_message_and_plain_answer() {
    let mut gw = start().await;
    gw.fake.script(Reply::text("Bonjour."));
    let body = openai(json!([
        {"role": "system", "content": "You translate to French."},
        user_msg("Hello."),
    ]));
    let answer = gw.chat(&body).await.ok();
    assert_eq!(answer.body, gw.last_upstream().response.to_vec());
    let transcript = gw
        .wait_for(&answer.session(), &answer.branch(), |lines| {
            lines.last().is_some_and(|l| l.starts_with("assistant"))
        })
        .await;
    assert_eq!(
        transcript[transcript.len() - 2..],
        ["user: Hello.", "assistant: Bonjour."]
    );
    let sent = gw.last_upstream().messages();
    assert!(
        sent.iter()
            .any(|m| m["role"] == "system" && m["content"].to_string().contains("French")),
        "the system prompt is forwarded: {sent:?}"
    );
}

// ---------------------------------------------------------------- passthrough

/// A body with formatting no serialiser would reproduce: spaces, key order, escapes.
const ODD_BODY: &str = "{\n  \"model\" : \"claude-test-1\",   \"max_tokens\": 64,\n  \"zz_unknown\": {\"b\": 1, \"a\": 2.50},\n  \"messages\": [ {\"role\":\"user\",\"content\":\"caf\\u00e9 \\/ \u{2713}\"} ]\n}";

#[tokio::test]
async fn gateway_passthrough_header_forwards_the_body_exactly() {
    let mut gw = start().await;
    gw.fake.script(Reply::text("Passed through."));
    let answer = gw
        .post(
            "/v1/messages",
            &[
                ("anthropic-version", "2023-06-01"),
                ("x-api-key", PROVIDER_KEY),
                ("x-ctxd-policy", "passthrough"),
            ],
            ODD_BODY.as_bytes().to_vec(),
        )
        .await
        .ok();
    let upstream = gw.last_upstream();
    assert_eq!(
        upstream.raw.as_ref(),
        ODD_BODY.as_bytes(),
        "the body goes upstream byte for byte"
    );
    assert_no_ctxd_headers(&upstream);
    assert_eq!(answer.body, upstream.response.to_vec());
    // Still recorded.
    let (session, branch) = (answer.session(), answer.branch());
    assert_eq!(
        gw.answered(&session, &branch, 2).await,
        ["user: café / ✓", "assistant: Passed through."]
    );
}

#[tokio::test]
async fn gateway_passthrough_policy_forwards_the_body_exactly() {
    let fake = FakeProvider::start().await;
    let mut gw = start_full(fake, None, GatewayPolicy::Passthrough, Options::default()).await;
    let answer = gw
        .post(
            "/v1/messages",
            &[
                ("anthropic-version", "2023-06-01"),
                ("x-api-key", PROVIDER_KEY),
            ],
            ODD_BODY.as_bytes().to_vec(),
        )
        .await
        .ok();
    assert_eq!(gw.last_upstream().raw.as_ref(), ODD_BODY.as_bytes());
    let session = answer.session();
    assert_eq!(
        gw.answered(&session, &answer.branch(), 2).await,
        [
            "user: café / ✓".to_owned(),
            format!("assistant: {DEFAULT_TEXT}")
        ]
    );
}

#[tokio::test]
async fn gateway_unrecordable_request_is_forwarded_as_received() {
    let gw = start().await;
    // A tool result answering no call: the store would refuse it; the agent must keep working.
    let body = anthropic(json!([
        user_msg("hi"),
        assistant_msg("hello"),
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_nowhere", "content": "orphan"}]},
    ]));
    let raw = serde_json::to_vec_pretty(&body).expect("JSON");
    gw.fake.script(Reply::text("Still working."));
    let answer = gw
        .post(
            "/v1/messages",
            &[
                ("anthropic-version", "2023-06-01"),
                ("x-api-key", PROVIDER_KEY),
            ],
            raw.clone(),
        )
        .await
        .ok();
    assert_eq!(answer.json()["content"][0]["text"], "Still working.");
    assert_eq!(
        gw.last_upstream().raw.to_vec(),
        raw,
        "forwarded exactly as received"
    );
    assert_eq!(gw.fake.request_count(), 1);

    // OpenAI: a tool message answering no call.
    let body = openai(json!([
        user_msg("hi"),
        {"role": "tool", "tool_call_id": "call_nowhere", "content": "orphan"},
    ]));
    let raw = serde_json::to_vec_pretty(&body).expect("JSON");
    let answer = gw
        .post(
            "/v1/chat/completions",
            &[("authorization", "Bearer sk-test")],
            raw.clone(),
        )
        .await
        .ok();
    assert_eq!(answer.body, gw.last_upstream().response.to_vec());
    assert_eq!(gw.last_upstream().raw.to_vec(), raw);
}

// ---------------------------------------------------------------- bad input

/// Expects a 400 in the Anthropic shape whose message names `field`.
#[track_caller]
fn assert_anthropic_400(answer: &Answer, field: &str) {
    assert_eq!(answer.status, 400, "400 naming {field}, got {answer:?}");
    let body = answer.json();
    assert_eq!(body["type"], "error", "{body}");
    assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
    let message = body["error"]["message"].as_str().expect("a message");
    assert!(
        message.to_lowercase().contains(&field.to_lowercase()),
        "the message names `{field}`: {message:?}"
    );
}

/// Expects a 400 in the OpenAI shape naming `field` (in `param` and the message).
#[track_caller]
fn assert_openai_400(answer: &Answer, field: &str) {
    assert_eq!(answer.status, 400, "400 naming {field}, got {answer:?}");
    let body = answer.json();
    let error = &body["error"];
    assert_eq!(error["type"], "invalid_request_error", "{body}");
    assert_eq!(error["param"], field, "{body}");
    assert!(error.get("code").is_some_and(Value::is_null), "{body}");
    let message = error["message"].as_str().expect("a message");
    assert!(
        message.to_lowercase().contains(&field.to_lowercase()),
        "the message names `{field}`: {message:?}"
    );
}

#[tokio::test]
async fn gateway_bad_anthropic_requests_are_refused_naming_the_field() {
    let mut gw = start().await;
    let headers = [
        ("anthropic-version", "2023-06-01"),
        ("x-api-key", PROVIDER_KEY),
    ];
    let cases: [(&str, Vec<u8>, &str); 5] = [
        (
            "not JSON",
            b"{\"model\": \"m\", \"messages\": [".to_vec(),
            "body",
        ),
        (
            "no messages",
            json!({"model": MODEL, "max_tokens": 10})
                .to_string()
                .into_bytes(),
            "messages",
        ),
        (
            "messages not an array",
            json!({"model": MODEL, "max_tokens": 10, "messages": "hello"})
                .to_string()
                .into_bytes(),
            "messages",
        ),
        (
            "a bogus role",
            anthropic(json!([{"role": "bogus", "content": "hi"}]))
                .to_string()
                .into_bytes(),
            "messages[0].role",
        ),
        (
            "a bogus role, streamed",
            anthropic_stream(json!([user_msg("fine"), {"role": "bogus", "content": "hi"}]))
                .to_string()
                .into_bytes(),
            "messages[1].role",
        ),
    ];
    for (case, body, field) in cases {
        let answer = gw.post("/v1/messages", &headers, body).await;
        assert!(answer.status == 400, "{case}: 400 expected, got {answer:?}");
        assert_anthropic_400(&answer, field);
    }
    assert!(gw.fake.requests().is_empty(), "nothing forwarded");
    assert!(sessions(&mut gw.app).await.is_empty(), "nothing recorded");
}

#[tokio::test]
async fn gateway_bad_openai_requests_are_refused_naming_the_field() {
    let mut gw = start().await;
    let headers = [("authorization", "Bearer sk-test")];
    let cases: [(&str, Vec<u8>, &str); 4] = [
        ("not JSON", b"this is not JSON".to_vec(), "body"),
        (
            "no messages",
            json!({"model": "gpt-test"}).to_string().into_bytes(),
            "messages",
        ),
        (
            "messages not an array",
            json!({"model": "gpt-test", "messages": {"role": "user"}})
                .to_string()
                .into_bytes(),
            "messages",
        ),
        (
            "a bogus role",
            openai(json!([{"role": "bogus", "content": "hi"}]))
                .to_string()
                .into_bytes(),
            "messages[0].role",
        ),
    ];
    for (case, body, field) in cases {
        let answer = gw.post("/v1/chat/completions", &headers, body).await;
        assert!(answer.status == 400, "{case}: 400 expected, got {answer:?}");
        assert_openai_400(&answer, field);
    }
    assert!(gw.fake.requests().is_empty(), "nothing forwarded");
    assert!(sessions(&mut gw.app).await.is_empty(), "nothing recorded");
}

// ---------------------------------------------------------------- upstream failures

#[tokio::test]
async fn gateway_unreachable_upstream_is_a_502_in_the_provider_shape() {
    let fake = FakeProvider::start().await;
    let dead = dead_url().await;
    // Anthropic's upstream cannot be reached; OpenAI's (the fake) can.
    let mut gw = start_configured(fake, None, Options::default(), |gateway| {
        gateway.anthropic_upstream = dead;
    })
    .await;
    let mut named = Vec::new();
    for body in [
        anthropic(json!([user_msg("anyone there?")])),
        anthropic_stream(json!([user_msg("anyone there?")])),
    ] {
        let answer = gw.messages(&body).await;
        assert_eq!(answer.status, 502, "{answer:?}");
        named.push(answer.session());
        let error = answer.json();
        assert_eq!(error["type"], "error");
        assert_eq!(error["error"]["type"], "api_error", "{error}");
    }
    // A request that never reached the provider records nothing and leaves no session behind,
    // though its answer names the session it would have made (one conversation: both alike).
    assert_eq!(named[0], named[1], "one conversation, one session named");
    assert!(sessions(&mut gw.app).await.is_empty(), "no session left");
    assert_eq!(gw.app.node_count().await, 0, "nothing recorded");
    // The same conversation reaching its provider makes the session the 502s named.
    let answer = gw
        .chat(&openai(json!([user_msg("anyone there?")])))
        .await
        .ok();
    assert_eq!(answer.session(), named[0], "the session the 502 named");
    assert_eq!(sessions(&mut gw.app).await, vec![named[0].clone()]);
    assert_eq!(gw.answered(&named[0], "main", 2).await.len(), 2);
}

#[tokio::test]
async fn gateway_unreachable_openai_upstream_is_a_502_in_its_shape() {
    let fake = FakeProvider::start().await;
    let dead = dead_url().await;
    let mut gw = start_full(
        fake,
        Some(dead),
        GatewayPolicy::default(),
        Options::default(),
    )
    .await;
    let answer = gw.chat(&openai(json!([user_msg("anyone there?")]))).await;
    assert_eq!(answer.status, 502, "{answer:?}");
    assert_eq!(answer.json()["error"]["type"], "upstream_error");
    answer.session();
    assert!(sessions(&mut gw.app).await.is_empty(), "no session left");
}

#[tokio::test]
async fn gateway_upstream_errors_are_relayed_and_append_no_answer() {
    let mut gw = start().await;
    let u1 = user_msg("Summarise the log.");
    let first = gw.messages(&anthropic(json!([u1]))).await.ok();
    let (session, branch) = (first.session(), first.branch());
    assert_eq!(gw.answered(&session, &branch, 2).await.len(), 2);

    let rate_limited = r#"{"type":"error","error":{"type":"rate_limit_error","message":"Number of request tokens has exceeded your per-minute rate limit"}}"#;
    gw.fake
        .script(Reply::error(429, rate_limited).header("retry-after", "7"));
    let history = json!([
        u1,
        assistant_msg(DEFAULT_TEXT),
        user_msg("Shorter, please.")
    ]);
    let answer = gw.messages(&anthropic(history.clone())).await;
    assert_eq!(answer.status, 429);
    assert_eq!(answer.text(), rate_limited, "the error body, unchanged");

    let broken = "upstream exploded: <html>500</html>";
    gw.fake.script(Reply::error(500, broken));
    let answer = gw.messages(&anthropic_stream(history.clone())).await;
    assert_eq!(answer.status, 500);
    assert_eq!(answer.text(), broken);

    let openai_limited = r#"{"error":{"message":"Rate limit reached","type":"requests","param":null,"code":"rate_limit_exceeded"}}"#;
    gw.fake.script(Reply::error(429, openai_limited));
    let answer = gw.chat(&openai(json!([user_msg("OpenAI side")]))).await;
    assert_eq!(answer.status, 429);
    assert_eq!(answer.text(), openai_limited);

    // No answer was appended for any of them: the history ends in the user's message.
    let transcript = gw.transcript(&session, &branch).await;
    assert_eq!(
        transcript,
        [
            "user: Summarise the log.".to_owned(),
            format!("assistant: {DEFAULT_TEXT}"),
            "user: Shorter, please.".to_owned(),
        ]
    );
    // The retry that succeeds continues the same branch: nothing of the errors is in the way.
    gw.fake.script(Reply::text("Short."));
    gw.messages(&anthropic(history)).await.ok();
    assert_eq!(
        gw.answered(&session, &branch, 4).await,
        [
            "user: Summarise the log.".to_owned(),
            format!("assistant: {DEFAULT_TEXT}"),
            "user: Shorter, please.".to_owned(),
            "assistant: Short.".to_owned(),
        ]
    );
    assert_eq!(gw.app.branches(&session).await.len(), 1);
    // The OpenAI call's session holds no answer either.
    for id in sessions(&mut gw.app).await {
        if id == session {
            continue;
        }
        for b in gw.app.branches(&id).await {
            let lines = gw.transcript(&id, &b.name).await;
            assert_eq!(lines, ["user: OpenAI side"], "{id}");
        }
    }
}

#[tokio::test]
async fn gateway_cut_stream_is_seen_and_appends_nothing() {
    let mut gw = start().await;
    let u1 = user_msg("Tell me a long story.");
    // message_start, ping, content_block_start, the first text delta: then the connection breaks.
    gw.fake.script(
        Reply::text("Once upon a time, in a land far away, there lived a fox.").cut_after(4),
    );
    let answer = gw.messages(&anthropic_stream(json!([u1]))).await;
    assert_eq!(answer.status, 200);
    let events = parse_sse(&answer.body);
    assert!(
        !events.iter().any(|e| e.event == "message_stop"),
        "{events:?}"
    );
    assert!(
        answer.cut,
        "the client sees the stream broken, not ended: {answer:?}"
    );
    assert_eq!(
        events,
        parse_sse(&gw.last_upstream().response),
        "what the provider sent before the cut is relayed"
    );
    let (session, branch) = (answer.session(), answer.branch());
    let transcript = gw.transcript(&session, &branch).await;
    assert_eq!(transcript, ["user: Tell me a long story."]);
    // The client retries and gets the whole answer: the branch goes on, nothing of the cut
    // answer is in the way.
    gw.fake.script(Reply::text("Once upon a time, a fox."));
    gw.messages(&anthropic_stream(json!([u1]))).await.ok();
    assert_eq!(
        gw.answered(&session, &branch, 2).await,
        [
            "user: Tell me a long story.",
            "assistant: Once upon a time, a fox."
        ]
    );
    assert_eq!(gw.app.branches(&session).await.len(), 1);

    // OpenAI: cut after the role chunk and the first content chunk.
    gw.fake
        .script(Reply::text("A story that never ends properly.").cut_after(2));
    let answer = gw
        .chat(&openai_stream(json!([user_msg("Another story.")])))
        .await;
    assert_eq!(answer.status, 200);
    assert!(answer.cut, "{answer:?}");
    assert!(!answer.text().contains("[DONE]"));
    let transcript = gw.transcript(&answer.session(), &answer.branch()).await;
    assert_eq!(transcript, ["user: Another story."]);
}

// ---------------------------------------------------------------- keys and credentials

#[tokio::test]
async fn gateway_needs_the_ctxd_key_and_records_for_its_tenant() {
    let keys = tempfile::NamedTempFile::new().expect("keys file");
    std::fs::write(&keys, "acme key-acme\nglobex key-globex\n").expect("keys");
    let options = Options {
        api_keys: Some(ApiKeys::load(keys.path()).expect("keys")),
        ..Options::default()
    };
    let fake = FakeProvider::start().await;
    let gw = start_full(fake, None, GatewayPolicy::default(), options).await;
    let body = anthropic(json!([user_msg("tenant work")]));
    for extra in [vec![], vec![("x-ctxd-api-key", "key-wrong")]] {
        let answer = gw.messages_with(&body, &extra).await;
        assert_eq!(answer.status, 401, "{extra:?}: {answer:?}");
        let error = answer.json();
        assert_eq!(error["type"], "error");
        assert_eq!(error["error"]["type"], "authentication_error", "{error}");
        let answer = gw.chat_with(&openai(json!([user_msg("x")])), &extra).await;
        assert_eq!(answer.status, 401, "{extra:?}: {answer:?}");
        assert_eq!(answer.json()["error"]["type"], "authentication_error");
    }
    assert!(
        gw.fake.requests().is_empty(),
        "nothing forwarded without the key"
    );

    let answer = gw
        .messages_with(&body, &[("x-ctxd-api-key", "key-acme")])
        .await
        .ok();
    let session = answer.session();
    assert_no_ctxd_headers(&gw.last_upstream());
    let mut acme = keyed_client(gw.app.addr, "key-acme").await;
    let mut globex = keyed_client(gw.app.addr, "key-globex").await;
    let listed = acme
        .list_sessions(pb::ListSessionsRequest::default())
        .await
        .expect("ListSessions")
        .into_inner()
        .sessions;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].session_id, session);
    // The answer is appended after it is relayed: wait for it on acme's Watch stream.
    let mut watch = acme
        .watch(pb::WatchRequest {
            session_id: session.clone(),
            ..Default::default()
        })
        .await
        .expect("Watch")
        .into_inner();
    let log = tokio::time::timeout(PATIENCE, async {
        loop {
            let nodes = acme
                .log(log_req(&session))
                .await
                .expect("Log")
                .into_inner()
                .nodes;
            if nodes.len() >= 2 {
                return nodes;
            }
            watch
                .message()
                .await
                .expect("the watch goes on")
                .expect("the watch does not end");
        }
    })
    .await
    .expect("the answer is recorded for acme");
    assert_eq!(log.len(), 2);
    let theirs = globex.get_session(get_session_req(&session)).await;
    assert_code(theirs, Code::NotFound);
    let none = globex
        .list_sessions(pb::ListSessionsRequest::default())
        .await
        .expect("ListSessions")
        .into_inner()
        .sessions;
    assert!(none.is_empty(), "globex sees nothing: {none:?}");
}

#[tokio::test]
async fn gateway_provider_key_is_forwarded_and_never_stored() {
    let mut gw = start().await;
    let u1 = user_msg("Secret-free, I hope.");
    let answer = gw.messages(&anthropic(json!([u1]))).await.ok();
    assert_eq!(gw.last_upstream().header("x-api-key"), Some(PROVIDER_KEY));
    let streamed = gw
        .messages(&anthropic_stream(json!([
            u1,
            assistant_msg(DEFAULT_TEXT),
            user_msg("More.")
        ])))
        .await
        .ok();
    assert_eq!(streamed.session(), answer.session());
    assert_eq!(gw.last_upstream().header("x-api-key"), Some(PROVIDER_KEY));
    let chat = gw
        .chat(&openai(json!([user_msg("OpenAI, secretly.")])))
        .await
        .ok();
    assert_eq!(
        gw.last_upstream().header("authorization"),
        Some(format!("Bearer {PROVIDER_KEY}").as_str())
    );
    gw.answered(&streamed.session(), &streamed.branch(), 4)
        .await;
    gw.answered(&chat.session(), &chat.branch(), 2).await;
    assert_eq!(gw.app.node_count().await, 6);

    let Some(path) = gw.app.db.sqlite_path().map(std::path::Path::to_path_buf) else {
        return; // PostgreSQL: no file to read.
    };
    let mut files = vec![path.clone()];
    let wal = path.with_file_name(format!(
        "{}-wal",
        path.file_name().expect("a file name").to_string_lossy()
    ));
    if wal.exists() {
        files.push(wal);
    }
    for file in files {
        let bytes = std::fs::read(&file).expect("read the database file");
        let found = bytes
            .windows(PROVIDER_KEY.len())
            .any(|w| w == PROVIDER_KEY.as_bytes());
        assert!(!found, "{} holds the provider key", file.display());
    }
}

// ---------------------------------------------------------------- sub-agents

/// Claude Code's session id as its `metadata.user_id` carries it.
fn claude_code_metadata(session: &str) -> Value {
    json!({"user_id": json!({"device_id": "d", "account_uuid": "", "session_id": session}).to_string()})
}

#[tokio::test]
async fn gateway_sub_agent_conversation_is_its_calls_function() {
    let mut gw = start().await;
    let client_session = "6f1c2a34-0000-4000-8000-000000000001";
    let prompt = "Find where the config is loaded and report the file.";
    // In the foreground: its answer is the call's result (a background agent: see
    // `gateway_fidelity::a_background_sub_agent_is_a_function_of_its_parent`).
    let task = json!({"description": "find config", "prompt": prompt,
                      "subagent_type": "general-purpose", "run_in_background": false});
    let with_session = |mut body: Value| {
        body["metadata"] = claude_code_metadata(client_session);
        body
    };

    // The parent asks; the model starts a sub-agent.
    gw.fake
        .script(Reply::tool_use_id("toolu_agent", "Agent", task.clone()));
    let u1 = user_msg("Where is the config loaded?");
    let first = gw
        .messages(&with_session(anthropic(json!([u1]))))
        .await
        .ok();
    let (session, branch) = (first.session(), first.branch());
    gw.answered(&session, &branch, 2).await;

    // The sub-agent's own conversation, under the same client session, opens with the prompt.
    gw.fake
        .script(Reply::text("It is loaded in src/config.rs."));
    let sub = with_session(anthropic(json!([{"role": "user", "content": [
        {"type": "text", "text": "<system-reminder>context</system-reminder>"},
        {"type": "text", "text": prompt},
    ]}])));
    let answer = gw.messages(&sub).await.ok();
    assert_eq!(
        answer.session(),
        session,
        "recorded in the parent's session"
    );
    assert_eq!(answer.branch(), branch);
    let function = answer
        .header("x-ctxd-function-id")
        .expect("the sub-agent's function is named");
    assert_eq!(
        gw.last_upstream().messages().len(),
        1,
        "the sub-agent's upstream request is its own conversation, not its parent's"
    );
    // Its next call resends its conversation: only what is new is appended, in the chain.
    gw.fake.script(Reply::text("Confirmed."));
    let sub_again = with_session(anthropic(json!([
        sub["messages"][0],
        assistant_msg("It is loaded in src/config.rs."),
        user_msg("Are you sure?"),
    ])));
    let again = gw.messages(&sub_again).await.ok();
    assert_eq!(
        again.header("x-ctxd-function-id").as_deref(),
        Some(function.as_str())
    );

    // The parent gets the sub-agent's result and goes on.
    gw.fake
        .script(Reply::text("The config is loaded in src/config.rs."));
    let call = json!({"role": "assistant", "content": [
        {"type": "tool_use", "id": "toolu_agent", "name": "Agent", "input": task},
    ]});
    let result = json!({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_agent", "content": "Confirmed."},
    ]});
    let third = gw
        .messages(&with_session(anthropic(json!([u1, call, result]))))
        .await
        .ok();
    assert_eq!(
        (third.session(), third.branch()),
        (session.clone(), branch.clone())
    );
    let upstream = gw.last_upstream().messages();
    assert_eq!(upstream.len(), 3, "{upstream:?}");
    assert_eq!(upstream[1]["content"][0]["id"], "toolu_agent");
    assert_eq!(upstream[2]["content"][0]["tool_use_id"], "toolu_agent");
    assert_eq!(upstream[2]["content"][0]["content"], "Confirmed.");

    // Resent once more with a new message: one branch, nothing forked, nothing twice.
    gw.fake.script(Reply::text("Done."));
    let fourth = gw
        .messages(&with_session(anthropic(json!([
            u1,
            call,
            result,
            assistant_msg("The config is loaded in src/config.rs."),
            user_msg("Thanks."),
        ]))))
        .await
        .ok();
    assert_eq!(fourth.branch(), branch);
    let branches = gw.app.branches(&session).await;
    assert_eq!(branches.len(), 1, "no fork: {branches:?}");
    let kinds: Vec<String> = gw
        .app
        .log(&session, &branch)
        .await
        .iter()
        .rev()
        .map(|n| {
            use pb::node_input::Kind;
            match n.content.as_ref().and_then(|c| c.kind.as_ref()) {
                Some(Kind::FunctionCall(f)) => format!("function_call[{}]", f.call_id),
                Some(Kind::FunctionResult(r)) => {
                    format!("function_result[{}]: {}", r.call_id, r.output)
                }
                _ => describe(n),
            }
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "user: Where is the config loaded?",
            "assistant:  -> toolu_agent",
            "function_call[toolu_agent]",
            "function_result[toolu_agent]: Confirmed.",
            "assistant: The config is loaded in src/config.rs.",
            "user: Thanks.",
            "assistant: Done.",
        ]
    );
    // The function's chain is the sub-agent's conversation.
    let chain = gw
        .app
        .client
        .render(pb::RenderRequest {
            session_id: session.clone(),
            target: Some(pb::render_request::Target::FunctionId(function)),
            callers: pb::Callers::None as i32,
            ..Default::default()
        })
        .await
        .expect("render the function")
        .into_inner();
    let roles: Vec<i32> = chain.messages.iter().map(|m| m.role).collect();
    assert_eq!(
        roles,
        [
            pb::Role::User as i32,
            pb::Role::Assistant as i32,
            pb::Role::User as i32,
            pb::Role::Assistant as i32
        ]
    );
}

#[tokio::test]
async fn gateway_usage_is_recorded_per_session() {
    let mut gw = start().await;
    // As Claude Code marks them: a breakpoint on the newest message's last block, each call
    // (the provider caches only at one).
    let ephemeral = json!({"type": "ephemeral"});
    let u1 = json!({"role": "user", "content": [{"type": "text", "text": "Count to three."}]});
    let mut marked_u1 = u1.clone();
    marked_u1["content"][0]["cache_control"] = ephemeral.clone();
    let first = gw.messages(&anthropic(json!([marked_u1]))).await.ok();
    let (session, branch) = (first.session(), first.branch());
    gw.answered(&session, &branch, 2).await;
    let u2 = json!({"role": "user", "content": [
        {"type": "text", "text": "Now to four.", "cache_control": ephemeral}]});
    let second = gw
        .messages(&anthropic_stream(json!([
            u1,
            assistant_msg(DEFAULT_TEXT),
            u2
        ])))
        .await
        .ok();
    assert_eq!(second.session(), session);
    gw.answered(&session, &branch, 4).await;
    // The usage row is written after the answer: read until both calls are in.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let usage = loop {
        let s = gw.app.get_session(&session).await;
        if let Some(g) = s.gateway.filter(|g| g.calls == 2) {
            break g;
        }
        assert!(tokio::time::Instant::now() < deadline, "two calls recorded");
        tokio::task::yield_now().await;
    };
    let reported: u64 = gw
        .fake
        .requests()
        .iter()
        .map(|r| r.usage["cache_read_input_tokens"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(
        usage.cache_read_tokens, reported,
        "the provider's own report"
    );
    assert!(
        usage.cache_read_tokens > 0,
        "the second call read the first's prefix"
    );
    assert!(usage.client_tokens > 0 && usage.forwarded_tokens > 0);
    assert!(usage.output_tokens > 0);
}

// ---------------------------------------------------------------- malformed input

/// A JSON value of a random kind, small.
fn random_value(rng: &mut impl rand::Rng, depth: u32) -> Value {
    match rng.random_range(0..if depth > 2 { 5 } else { 7 }) {
        0 => Value::Null,
        1 => json!(rng.random::<bool>()),
        2 => json!(rng.random_range(-3i64..100_000)),
        3 => json!(
            [
                "",
                "user",
                "assistant",
                "system",
                "tool",
                "text",
                "tool_use",
                "x\u{0}y"
            ][rng.random_range(0..8)]
        ),
        4 => json!(rng.random::<f64>()),
        5 => Value::Array(
            (0..rng.random_range(0..3))
                .map(|_| random_value(rng, depth + 1))
                .collect(),
        ),
        _ => {
            let keys = [
                "role",
                "content",
                "type",
                "text",
                "id",
                "name",
                "input",
                "tool_use_id",
                "call_id",
                "arguments",
                "output",
                "tool_calls",
                "index",
                "cache_control",
            ];
            Value::Object(
                (0..rng.random_range(0..4))
                    .map(|_| {
                        (
                            keys[rng.random_range(0..keys.len())].to_owned(),
                            random_value(rng, depth + 1),
                        )
                    })
                    .collect(),
            )
        }
    }
}

/// Replaces one value somewhere inside `value` by a random one.
fn mutate(rng: &mut impl rand::Rng, value: &mut Value) {
    match value {
        Value::Object(map) if !map.is_empty() && rng.random_bool(0.7) => {
            let k = map
                .keys()
                .nth(rng.random_range(0..map.len()))
                .cloned()
                .unwrap_or_default();
            if rng.random_bool(0.2) {
                map.remove(&k);
            } else if let Some(v) = map.get_mut(&k) {
                mutate(rng, v);
            }
        }
        Value::Array(items) if !items.is_empty() && rng.random_bool(0.7) => {
            let i = rng.random_range(0..items.len());
            mutate(rng, &mut items[i]);
        }
        other => *other = random_value(rng, 0),
    }
}

#[tokio::test]
async fn gateway_never_fails_on_malformed_requests() {
    use rand::{Rng, SeedableRng};
    let seed: u64 = std::env::var("CTXD_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("CTXD_FUZZ_SEED={seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let gw = start().await;
    let tool_use = json!({"role": "assistant", "content": [
        {"type": "thinking", "thinking": "t", "signature": "s"},
        {"type": "tool_use", "id": "t1", "name": "Read", "input": {"path": "a"}}]});
    let tool_result = json!({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "x"}]}]});
    let seeds: [(&str, Value); 3] = [
        (
            "/v1/messages",
            anthropic_stream(json!([user_msg("hi"), tool_use, tool_result])),
        ),
        (
            "/v1/chat/completions",
            openai(json!([
                {"role": "system", "content": "s"},
                user_msg("hi"),
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "ok"},
            ])),
        ),
        (
            "/v1/responses",
            json!({"model": "gpt-test", "stream": true, "input": [
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
                {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "e"},
                {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "ok"},
            ]}),
        ),
    ];
    for round in 0..300 {
        let (path, seed_body) = &seeds[round % seeds.len()];
        let mut body = seed_body.clone();
        for _ in 0..rng.random_range(1..4) {
            mutate(&mut rng, &mut body);
        }
        let mut bytes = body.to_string().into_bytes();
        if rng.random_bool(0.1) {
            bytes.truncate(rng.random_range(0..bytes.len().max(1)));
        }
        let answer = gw
            .post(path, &[("anthropic-version", "2023-06-01")], bytes.clone())
            .await;
        assert!(
            !answer.cut,
            "round {round}: a whole answer to {}",
            String::from_utf8_lossy(&bytes)
        );
        match answer.status {
            // Forwarded (the fake answers what it takes), or refused naming a field.
            200 | 404 => {}
            400 => {
                let error = answer.json();
                let message = error["error"]["message"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                assert!(
                    message.contains(": "),
                    "round {round}: a message naming a field: {error}"
                );
            }
            status => panic!(
                "round {round}: status {status} for {}: {}",
                String::from_utf8_lossy(&bytes),
                answer.text()
            ),
        }
    }
    // Still serving, and still recording.
    let answer = gw
        .messages(&anthropic(json!([user_msg("still there?")])))
        .await
        .ok();
    answer.session();
}
