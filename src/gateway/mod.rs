//! The model gateway (`ctxd serve --gateway ADDR`): a third front door, beside gRPC and the
//! inspector, for agents that only speak a provider's HTTP API (Anthropic Messages, OpenAI chat
//! completions and Responses). Each call is recorded as a session (`record`), forwarded with
//! ctxd's render of its branch in place of the client's `messages` or `input` (every other
//! field byte-identical), and
//! answered exactly as the provider answered, relayed as it arrives; the assembled answer is
//! appended once it is whole. A request it cannot record is forwarded as it came (fail open);
//! ctxd's own keys guard it (fail closed); provider credentials pass through, never kept.

mod forward;
mod json;
mod ledger;

use std::sync::Arc;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::serve::ListenerExt as _;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use crate::auth::{ApiKeys, gateway_tenant};
use crate::domain::{
    self, Budget, GatewayCall, Hash, Node, NodeContent, NodeId, Part, PathView, ProviderUsage,
    Tenant, node_hash,
};
use crate::provider::conversation::{Conversation, Refusal, estimate};
use crate::provider::{anthropic, chat, responses};
use crate::render::{self, Message, Policy};
use crate::store::{self, AppendRequest, AppendTarget, PathTarget, Scoped, now_ms};
use crate::tokens::Tokenizer;
use crate::workflow::Workflows;
use crate::workflow::compaction::{Compactions, PrepareArgs, PrepareOutcome};
use crate::workflow::record::{self, Recorded, Unrecorded};

/// The gateway's listener and where it forwards.
pub struct Gateway {
    pub listener: TcpListener,
    /// Base URLs without `/v1`, e.g. `https://api.anthropic.com`.
    pub anthropic_upstream: String,
    pub openai_upstream: String,
    pub policy: GatewayPolicy,
    /// Context windows the operator set (`--context-window`), before ctxd's table.
    pub windows: Vec<Window>,
    /// The largest request body read; a longer one is `413`.
    pub max_body_bytes: usize,
}

impl Gateway {
    pub fn new(
        listener: TcpListener,
        anthropic_upstream: impl Into<String>,
        openai_upstream: impl Into<String>,
    ) -> Self {
        Self {
            listener,
            anthropic_upstream: anthropic_upstream.into(),
            openai_upstream: openai_upstream.into(),
            policy: GatewayPolicy::default(),
            windows: Vec::new(),
            max_body_bytes: MAX_BODY_BYTES,
        }
    }
}

/// A model's context window set by the operator: `MODEL=TOKENS`, `MODEL` ending in `*` for
/// every model it starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    pub model: String,
    pub prefix: bool,
    pub tokens: u32,
}

impl Window {
    pub fn parse(s: &str) -> Result<Self, String> {
        let (model, tokens) = s
            .split_once('=')
            .ok_or_else(|| format!("--context-window {s:?}: must be MODEL=TOKENS"))?;
        let model = model.trim();
        let tokens: u32 = tokens.trim().parse().map_err(|_| {
            format!("--context-window {s:?}: TOKENS must be a whole number of tokens")
        })?;
        if tokens < 1024 {
            return Err(format!(
                "--context-window {s:?}: TOKENS must be at least 1024"
            ));
        }
        let (model, prefix) = match model.strip_suffix('*') {
            Some(m) => (m, true),
            None => (model, false),
        };
        if model.is_empty() && !prefix {
            return Err(format!("--context-window {s:?}: MODEL must not be empty"));
        }
        Ok(Self {
            model: model.to_ascii_lowercase(),
            prefix,
            tokens,
        })
    }

    fn names(&self, model: &str) -> bool {
        if self.prefix {
            model.starts_with(&self.model)
        } else {
            model == self.model
        }
    }
}

/// What the gateway forwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GatewayPolicy {
    /// ctxd's render of the branch under the gateway's policy (old tool output cleared in
    /// steps, old inputs stubbed, never a result of the newest turns cut).
    #[default]
    Stepped,
    /// The client's body as it came (still recorded).
    Passthrough,
}

impl GatewayPolicy {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "stepped" => Some(Self::Stepped),
            "passthrough" => Some(Self::Passthrough),
            _ => None,
        }
    }
}

/// The default render policy of the gateway: the stepped default, except that what arrived
/// since the last step is never capped or stubbed (an agent edits files by quoting what it just
/// read, and its next edit builds on the last one), and that its first step comes at 10 results
/// keeping the newest 5, then every 10: an agent's calls resend the whole history under the
/// client's breakpoints, so an earlier, smaller step is read back at a tenth of its size by
/// every later call (in `cargo bench --bench gateway`, 0.434x of direct over the 23 traces
/// against 0.467x for 20, 10 and 10; a scripted 26-call Claude Code session, 0.81x against
/// 0.92x).
pub fn policy() -> Policy {
    Policy {
        recent_tool_result_chars: usize::MAX,
        recent_tool_input_chars: usize::MAX,
        recent_assistant_text_chars: usize::MAX,
        microcompact_first: 10,
        microcompact_every: 10,
        microcompact_keep: 5,
        ..Policy::default()
    }
}

/// The largest request body the gateway reads by default (a long session resent whole, with
/// images).
pub const MAX_BODY_BYTES: usize = 256 * 1024 * 1024;

/// Headers never forwarded either way: hop-by-hop ones, those the HTTP stack sets, ctxd's own.
/// `accept-encoding` too: the gateway reads the answer it relays, so it asks for it plain.
const DROPPED: &[&str] = &[
    "host",
    "content-length",
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "accept-encoding",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Api {
    Anthropic,
    OpenAi,
    /// OpenAI's Responses API (`/v1/responses`), forwarded to the OpenAI upstream.
    Responses,
}

impl Api {
    fn name(self) -> &'static str {
        match self {
            Api::Anthropic => "anthropic",
            Api::OpenAi => "openai",
            Api::Responses => "responses",
        }
    }

    fn format(self) -> forward::Format {
        match self {
            Api::Anthropic => forward::Format::Anthropic,
            Api::OpenAi => forward::Format::Chat,
            Api::Responses => forward::Format::Responses,
        }
    }

    /// The body field that holds the conversation, replaced by the render.
    fn field(self) -> &'static str {
        match self {
            Api::Anthropic | Api::OpenAi => "messages",
            Api::Responses => "input",
        }
    }

    /// Reads a parsed request body, taking its texts rather than copying them where it can.
    fn read(self, mut body: Value) -> Result<Conversation, Refusal> {
        match self {
            Api::Anthropic => anthropic::read(&mut body),
            Api::OpenAi => chat::read(&body),
            Api::Responses => responses::read(&body),
        }
    }

    /// An error answer in the API's own shape.
    fn error(self, status: StatusCode, kind: &str, message: &str, param: Option<&str>) -> Response {
        let body = match self {
            Api::Anthropic => anthropic::error(kind, message),
            Api::OpenAi => chat::error(kind, message, param),
            Api::Responses => responses::error(kind, message, param),
        };
        let mut response = (status, body.to_string()).into_response();
        response.headers_mut().insert(
            axum::http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        response
    }

    fn invalid(self, field: &str, message: &str) -> Response {
        let text = format!("{field}: {message}");
        self.error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            &text,
            Some(field),
        )
    }
}

#[derive(Clone)]
struct App {
    workflows: Workflows,
    keys: Option<Arc<ApiKeys>>,
    http: reqwest::Client,
    anthropic: Arc<str>,
    openai: Arc<str>,
    policy: GatewayPolicy,
    windows: Arc<[Window]>,
    max_body_bytes: usize,
    max_part_bytes: usize,
    /// Sessions by the keys that named them.
    keys_seen: Arc<record::SessionKeys>,
    /// Where an agent's own summaries are laid over the history they replaced.
    compactions: Arc<Compactions>,
    /// Each conversation's newest forwarded request, for the next call's ledger.
    ledger: Arc<ledger::Ledger>,
}

/// Serves the gateway on its listener until the task is dropped. A call in flight when it is
/// dropped appends nothing of its answer.
pub async fn serve(
    gateway: Gateway,
    workflows: Workflows,
    keys: Option<Arc<ApiKeys>>,
    max_part_bytes: usize,
) -> std::io::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::builder()
        .build()
        .map_err(std::io::Error::other)?;
    let trim = |s: &str| -> Arc<str> { Arc::from(s.trim_end_matches('/')) };
    let app = App {
        compactions: Arc::clone(&workflows.compactions),
        keys_seen: Arc::clone(&workflows.session_keys),
        ledger: Arc::default(),
        workflows,
        keys,
        http,
        anthropic: trim(&gateway.anthropic_upstream),
        openai: trim(&gateway.openai_upstream),
        policy: gateway.policy,
        windows: gateway.windows.into(),
        max_body_bytes: gateway.max_body_bytes,
        max_part_bytes,
    };
    let router = Router::new()
        .route("/v1/messages", post(messages))
        .route("/v1/messages/count_tokens", post(count_tokens))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/responses", post(responses_api))
        .fallback(other)
        .layer(DefaultBodyLimit::disable())
        .with_state(app);
    // Without TCP_NODELAY a body written after its head waits ~40 ms for a delayed ACK.
    let listener = gateway.listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "gateway: TCP_NODELAY not set");
        }
    });
    axum::serve(listener, router).await
}

async fn messages(State(app): State<App>, uri: Uri, headers: HeaderMap, body: Body) -> Response {
    match read_body(Api::Anthropic, body, app.max_body_bytes).await {
        Ok(body) => app.handle(Api::Anthropic, uri, headers, body).await,
        Err(response) => response,
    }
}

async fn chat_completions(
    State(app): State<App>,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    match read_body(Api::OpenAi, body, app.max_body_bytes).await {
        Ok(body) => app.handle(Api::OpenAi, uri, headers, body).await,
        Err(response) => response,
    }
}

async fn responses_api(
    State(app): State<App>,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    match read_body(Api::Responses, body, app.max_body_bytes).await {
        Ok(body) => app.handle(Api::Responses, uri, headers, body).await,
        Err(response) => response,
    }
}

/// The request body, at most `limit` bytes; a longer one is `413` in the API's shape (an agent
/// reads the provider's error shape, not the HTTP stack's plain text).
#[allow(clippy::result_large_err)]
async fn read_body(api: Api, body: Body, limit: usize) -> Result<Bytes, Response> {
    match axum::body::to_bytes(body, limit).await {
        Ok(bytes) => Ok(bytes),
        Err(e) => {
            let too_large = std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
            count(api, "invalid");
            Err(if too_large {
                api.error(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    match api {
                        Api::Anthropic => "request_too_large",
                        Api::OpenAi | Api::Responses => "invalid_request_error",
                    },
                    &format!("body: the request is over the ctxd gateway's limit of {limit} bytes"),
                    Some("body"),
                )
            } else {
                api.error(
                    StatusCode::BAD_REQUEST,
                    "invalid_request_error",
                    &format!("body: could not be read: {e}"),
                    Some("body"),
                )
            })
        }
    }
}

/// Any other request: forwarded unchanged, to the Anthropic upstream when it carries
/// Anthropic's headers, else to OpenAI's. Only `/v1/` paths are served.
async fn other(
    State(app): State<App>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let api = if headers.contains_key("anthropic-version") || headers.contains_key("x-api-key") {
        Api::Anthropic
    } else {
        Api::OpenAi
    };
    let body = match read_body(api, body, app.max_body_bytes).await {
        Ok(body) => body,
        Err(response) => return response,
    };
    if !uri.path().starts_with("/v1/") {
        return api.error(
            StatusCode::NOT_FOUND,
            "not_found_error",
            "the ctxd gateway serves /v1/ paths only",
            None,
        );
    }
    if let Err(response) = app.tenant(api, &headers) {
        return response;
    }
    count(api, "forwarded");
    app.forward(api, method, &uri, &headers, body, None).await
}

/// `count_tokens` answers for the context the gateway would forward: the stored branch with
/// the request's new messages after it, rendered; nothing is recorded.
async fn count_tokens(
    State(app): State<App>,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let api = Api::Anthropic;
    let body = match read_body(api, body, app.max_body_bytes).await {
        Ok(body) => body,
        Err(response) => return response,
    };
    let tenant = match app.tenant(api, &headers) {
        Ok(t) => t,
        Err(response) => return response,
    };
    let value: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return api.invalid("body", &format!("not JSON: {e}")),
    };
    let conv = match api.read(value) {
        Ok(conv) => with_client_session(conv, &headers),
        Err(Refusal::Invalid { field, message }) => return api.invalid(&field, &message),
        Err(Refusal::Unrecordable(reason)) => {
            passthrough(reason);
            return app
                .forward(api, Method::POST, &uri, &headers, body, None)
                .await;
        }
    };
    let policy = match request_policy(app.policy, &headers) {
        Ok(p) => p,
        Err(()) => return api.invalid("x-ctxd-policy", "must be \"stepped\" or \"passthrough\""),
    };
    if policy == GatewayPolicy::Passthrough {
        return app
            .forward(api, Method::POST, &uri, &headers, body, None)
            .await;
    }
    let named = match session_header(&headers) {
        Ok(n) => n,
        Err(()) => return api.invalid("x-ctxd-session", "must be visible ASCII"),
    };
    let forwarded = app
        .counted_body(&tenant, named.as_deref(), &conv, &headers, &body)
        .await;
    let body = forwarded.map_or(body, Bytes::from);
    app.forward(api, Method::POST, &uri, &headers, body, None)
        .await
}

impl App {
    /// The caller's tenant, or the refusal in the API's shape.
    #[allow(clippy::result_large_err)]
    fn tenant(&self, api: Api, headers: &HeaderMap) -> Result<Tenant, Response> {
        gateway_tenant(self.keys.as_deref(), headers).map_err(|reason| {
            count(api, "unauthenticated");
            api.error(
                StatusCode::UNAUTHORIZED,
                "authentication_error",
                reason,
                None,
            )
        })
    }

    async fn handle(&self, api: Api, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
        let t0 = std::time::Instant::now();
        let tenant = match self.tenant(api, &headers) {
            Ok(t) => t,
            Err(response) => return response,
        };
        // The parsed body lives only while it is read: a large body is not held twice more.
        let read = match serde_json::from_slice::<Value>(&body) {
            Ok(value) => api.read(value),
            Err(e) => {
                count(api, "invalid");
                return api.invalid("body", &format!("not JSON: {e}"));
            }
        };
        let policy = match request_policy(self.policy, &headers) {
            Ok(p) => p,
            Err(()) => {
                count(api, "invalid");
                return api.invalid("x-ctxd-policy", "must be \"stepped\" or \"passthrough\"");
            }
        };
        let named = match session_header(&headers) {
            Ok(n) => n,
            Err(()) => {
                count(api, "invalid");
                return api.invalid("x-ctxd-session", "must be visible ASCII and not empty");
            }
        };
        let conv = match read {
            Ok(conv) => with_client_session(conv, &headers),
            Err(Refusal::Invalid { field, message }) => {
                count(api, "invalid");
                return api.invalid(&field, &message);
            }
            Err(Refusal::Unrecordable(reason)) => {
                passthrough(reason);
                count(api, "passthrough");
                return self
                    .forward(api, Method::POST, &uri, &headers, body, None)
                    .await;
            }
        };
        let t_read = t0.elapsed();
        if policy == GatewayPolicy::Stepped {
            let located = record::locate(
                &self.workflows.store,
                &self.keys_seen,
                &tenant,
                named.as_deref(),
                &conv,
                self.max_part_bytes,
            )
            .await;
            tracing::debug!(
                read_us = t_read.as_micros() as u64,
                locate_us = (t0.elapsed() - t_read).as_micros() as u64,
                "gateway: a request's time to read and locate"
            );
            match located {
                Ok(Some(located)) => {
                    return self
                        .handle_located(api, uri, headers, body, tenant, named, conv, located)
                        .await;
                }
                Ok(None) => {}
                Err(Unrecorded(reason)) => {
                    passthrough(reason);
                    count(api, "passthrough");
                    return self
                        .forward(api, Method::POST, &uri, &headers, body, None)
                        .await;
                }
            }
        }
        let recorded = match record::record(
            &self.workflows.store,
            &self.keys_seen,
            &tenant,
            named.as_deref(),
            &conv,
            self.max_part_bytes,
        )
        .await
        {
            Ok(r) => r,
            Err(Unrecorded(reason)) => {
                passthrough(reason);
                count(api, "passthrough");
                return self
                    .forward(api, Method::POST, &uri, &headers, body, None)
                    .await;
            }
        };
        if let Some(summary) = &recorded.agent_summary {
            self.lay_agent_summary(&recorded, summary).await;
        }
        let t_record = t0.elapsed();
        let (outgoing, forwarded_tokens, verdict) = match policy {
            GatewayPolicy::Passthrough => (body, conv.client_tokens, None),
            GatewayPolicy::Stepped => {
                match self
                    .rendered_body(api, &conv, &recorded, &headers, &body)
                    .await
                {
                    Ok(forwarded) => {
                        let key = (recorded.session.id(), recorded.function.map(|(id, _)| id));
                        let verdict = self.judge(api, &conv, key, &forwarded);
                        let outgoing = forwarded.body.map_or(body, Bytes::from);
                        (outgoing, forwarded.tokens, Some(verdict))
                    }
                    Err(reason) => {
                        passthrough(reason);
                        (body, conv.client_tokens, None)
                    }
                }
            }
        };
        tracing::debug!(
            read_us = t_read.as_micros() as u64,
            record_us = (t_record - t_read).as_micros() as u64,
            render_us = (t0.elapsed() - t_record).as_micros() as u64,
            "gateway: a request's time before forwarding"
        );
        count(api, "recorded");
        metrics::counter!("ctxd_gateway_tokens_total", "kind" => "client")
            .increment(conv.client_tokens);
        metrics::counter!("ctxd_gateway_tokens_total", "kind" => "forwarded")
            .increment(forwarded_tokens);
        let sink = Sink {
            workflows: self.workflows.clone(),
            api,
            stream: conv.stream,
            model: conv.model.clone(),
            client_tokens: conv.client_tokens,
            forwarded_tokens,
            named: Named {
                session: recorded.session,
                branch: recorded.branch.clone(),
                function: recorded.function.map(|(id, _)| id),
            },
            recording: Recording::Done(Box::new(recorded)),
            verdict,
            gate: None,
        };
        self.forward(api, Method::POST, &uri, &headers, outgoing, Some(sink))
            .await
    }

    /// A request located without writing: forwarded at once, its render made in memory, and
    /// recorded beside the upstream call once the upstream has answered (a request that never
    /// reaches it records nothing). The answer's append waits for the recording.
    #[allow(clippy::too_many_arguments)]
    async fn handle_located(
        &self,
        api: Api,
        uri: Uri,
        headers: HeaderMap,
        body: Bytes,
        tenant: Tenant,
        named: Option<String>,
        conv: Conversation,
        located: record::Located,
    ) -> Response {
        let (mut conv, mut located) = (conv, located);
        let (outgoing, forwarded_tokens, verdict) = match self
            .located_body(api, &mut conv, &mut located, &headers, &body)
            .await
        {
            Ok(forwarded) => {
                let verdict = self.judge(api, &conv, (located.session.id(), None), &forwarded);
                // Only what is forwarded is held from here on.
                let outgoing = forwarded.body.map_or(body, Bytes::from);
                (outgoing, forwarded.tokens, Some(verdict))
            }
            Err(reason) => {
                passthrough(reason);
                (body, conv.client_tokens, None)
            }
        };
        count(api, "recorded");
        metrics::counter!("ctxd_gateway_tokens_total", "kind" => "client")
            .increment(conv.client_tokens);
        metrics::counter!("ctxd_gateway_tokens_total", "kind" => "forwarded")
            .increment(forwarded_tokens);
        let (gate, opened) = tokio::sync::oneshot::channel::<()>();
        let (stream, model, client_tokens) = (conv.stream, conv.model.clone(), conv.client_tokens);
        let store = self.workflows.store.clone();
        let keys = Arc::clone(&self.keys_seen);
        let max_part_bytes = self.max_part_bytes;
        let (session, branch) = (located.session, located.branch.clone());
        let task = tokio::spawn(async move {
            // The upstream answered (any status): the request is recorded; unreachable, not.
            opened.await.ok()?;
            let mut conv = conv;
            match record::record_located(
                &store,
                &keys,
                &tenant,
                named.as_deref(),
                &mut conv,
                max_part_bytes,
                located,
            )
            .await
            {
                Ok(recorded) => Some(recorded),
                Err(Unrecorded(reason)) => {
                    tracing::info!(reason, "gateway: a forwarded request was not recorded");
                    metrics::counter!("ctxd_gateway_passthrough_total", "reason" => reason)
                        .increment(1);
                    None
                }
            }
        });
        let sink = Sink {
            workflows: self.workflows.clone(),
            api,
            stream,
            model,
            client_tokens,
            forwarded_tokens,
            named: Named {
                session,
                branch,
                function: None,
            },
            recording: Recording::Pending(task),
            verdict,
            gate: Some(gate),
        };
        self.forward(api, Method::POST, &uri, &headers, outgoing, Some(sink))
            .await
    }

    /// The ledger's verdict on a forwarded request: what it kept of its conversation's previous
    /// one, and why not the rest.
    fn judge(
        &self,
        api: Api,
        conv: &Conversation,
        key: (domain::SessionId, Option<NodeId>),
        forwarded: &ForwardedBody,
    ) -> ledger::Verdict {
        let long_ttl = conv
            .markers
            .iter()
            .any(|(_, m)| m.get("ttl").and_then(Value::as_str) == Some("1h"));
        let fixed = (conv.system_tokens as usize + conv.tools_tokens as usize) * 4;
        let now = ledger::Forwarded::new(
            now_ms(),
            long_ttl,
            fixed,
            &forwarded.kept,
            api == Api::Anthropic,
        );
        self.ledger
            .record(key, now, forwarded.trigger, forwarded.boundary)
    }

    /// The body to forward: the client's, with `messages` replaced by the branch's render.
    async fn rendered_body(
        &self,
        api: Api,
        conv: &Conversation,
        recorded: &Recorded,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Result<ForwardedBody, &'static str> {
        let mut options = self.options(conv, headers, recorded.seen)?;
        let target = match recorded.function {
            // A sub-agent sees its own conversation, as its client sent it.
            Some((id, _)) => {
                options.callers = render::Callers::None;
                PathTarget::Function(id)
            }
            None => match (recorded.behind, recorded.head) {
                (true, Some((head, _))) => PathTarget::Node(head),
                _ => PathTarget::Branch(recorded.branch.clone()),
            },
        };
        let path = self
            .workflows
            .store
            .load_path(recorded.session, &target)
            .await
            .map_err(|e| {
                tracing::warn!(error = %e, "gateway: a path was not loaded");
                "render"
            })?;
        let key = (recorded.session.id(), recorded.function.map(|(id, _)| id));
        self.forwarded_body(api, conv, path, options, body, key)
            .await
    }

    /// The render options of a request whose model has read `seen`; the agent's own summary
    /// request reads everything it sent, so nothing of it is reduced.
    fn options(
        &self,
        conv: &Conversation,
        headers: &HeaderMap,
        seen: render::Seen,
    ) -> Result<render::Options, &'static str> {
        let mut options = render_options(conv, &self.window(conv, headers))
            .ok_or("a budget that leaves the history nothing")?;
        options.seen = if crate::provider::agents::is_summary_request(conv) {
            render::Seen::Nothing
        } else {
            seen
        };
        Ok(options)
    }

    /// The body to forward for a request located but not yet recorded: the stored path it
    /// reaches with what it adds after it, in memory, rendered. What the request adds is moved
    /// from the conversation into that path and back into `located` once the body is written,
    /// so a large request is held once, not once per copy (see [`record::Located::lent`]).
    async fn located_body(
        &self,
        api: Api,
        conv: &mut Conversation,
        located: &mut record::Located,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Result<ForwardedBody, &'static str> {
        let t0 = std::time::Instant::now();
        let options = self.options(conv, headers, located.seen())?;
        let stored = match located.expected {
            Some((node, _)) => self
                .workflows
                .store
                .load_path(located.session, &PathTarget::Node(node))
                .await
                .map_err(|e| {
                    tracing::warn!(error = %e, "gateway: a path was not loaded");
                    "render"
                })?,
            None => PathView::default(),
        };
        let key = (located.session.id(), None);
        if located.behind {
            let (path, rendered) = self.rendered(stored, options, key).await?;
            let contents: Vec<&NodeContent> = conv.items.iter().map(|i| &i.content).collect();
            return written(api, conv, &contents, &path, rendered, body);
        }
        let t_load = t0.elapsed();
        located.lend(conv);
        let added = located.rest.len();
        let path = extended(stored, std::mem::take(&mut located.rest));
        let (path, rendered) = match self.rendered(path, options, key).await {
            Ok(r) => r,
            Err(reason) => {
                // What was lent went with the path: the request cannot be recorded.
                located.lost = true;
                return Err(reason);
            }
        };
        let forwarded = {
            let lent = located.lent;
            let held = conv.items.len() - lent;
            let contents: Vec<&NodeContent> = conv.items[..held]
                .iter()
                .map(|i| &i.content)
                .chain(
                    path.nodes[path.nodes.len() - lent..]
                        .iter()
                        .map(|n| &n.content),
                )
                .collect();
            let t_render = t0.elapsed();
            let forwarded = written(api, conv, &contents, &path, rendered, body);
            tracing::debug!(
                load_us = t_load.as_micros() as u64,
                render_us = (t_render - t_load).as_micros() as u64,
                write_us = (t0.elapsed() - t_render).as_micros() as u64,
                "gateway: a located request's time to load, render and write"
            );
            forwarded
        };
        let at = path.nodes.len() - added;
        let mut nodes = path.nodes;
        located.rest = nodes
            .drain(at..)
            .map(|n| Arc::try_unwrap(n).map_or_else(|n| n.content.clone(), |n| n.content))
            .collect();
        forwarded
    }

    /// The render of `path` for the next call of conversation `key`.
    /// A step reduces only what the model had read when the step was taken: between steps
    /// the conversation renders with what was seen at its last step (`ledger::Ledger::horizon`),
    /// so a result that arrived with the step is not cut the call after it, which would write the
    /// prefix the step just wrote again; a call that takes a new step renders with what the
    /// model has seen now, and that becomes the horizon.
    async fn rendered(
        &self,
        path: PathView,
        options: render::Options,
        key: (domain::SessionId, Option<NodeId>),
    ) -> Result<(PathView, render::Rendered), &'static str> {
        let render = |path: PathView, options: render::Options| async move {
            self.workflows
                .render_path(path, Tokenizer::Heuristic, options)
                .await
                .map_err(|e| {
                    tracing::warn!(error = %e, "gateway: render failed");
                    "render"
                })
        };
        let horizon = self.ledger.horizon(key);
        let held = match (horizon, options.seen) {
            (Some((_, seen)), render::Seen::Through(_))
                if path.nodes.iter().any(|n| n.id == seen) =>
            {
                Some(render::Options {
                    seen: render::Seen::Through(seen),
                    ..options
                })
            }
            _ => None,
        };
        let (path, rendered) = match held {
            Some(held) => {
                let (path, rendered) = render(path, held).await?;
                if horizon.is_some_and(|(b, _)| b == rendered.report.microcompact_boundary) {
                    (path, rendered)
                } else {
                    render(path, options).await?
                }
            }
            None => render(path, options).await?,
        };
        let boundary = rendered.report.microcompact_boundary;
        if boundary > 0
            && horizon.is_none_or(|(b, _)| b != boundary)
            && let render::Seen::Through(seen) = options.seen
        {
            self.ledger.set_horizon(key, (boundary, seen));
        }
        Ok((path, rendered))
    }

    /// `body` with its conversation replaced by the render of `path`.
    async fn forwarded_body(
        &self,
        api: Api,
        conv: &Conversation,
        path: PathView,
        options: render::Options,
        body: &[u8],
        key: (domain::SessionId, Option<NodeId>),
    ) -> Result<ForwardedBody, &'static str> {
        let (path, rendered) = self.rendered(path, options, key).await?;
        let contents: Vec<&NodeContent> = conv.items.iter().map(|i| &i.content).collect();
        written(api, conv, &contents, &path, rendered, body)
    }

    /// Lays the agent's summary over the history it replaced (a segment summary, through the
    /// compaction workflow, so it is judged, stored and audited as any summary is). A summary
    /// not laid leaves the branch whole; its next request is then recorded as before.
    async fn lay_agent_summary(&self, recorded: &Recorded, summary: &record::AgentSummary) {
        let args = PrepareArgs {
            session: recorded.session.id(),
            branch: recorded.branch.clone(),
            // Any budget the range is over: the agent, not ctxd, decided to summarize.
            budget: Budget {
                context_window: 1,
                ..Budget::default()
            },
            tokenizer: Tokenizer::Heuristic,
            retain_turns: 0,
            instructions: String::new(),
            max_tool_result_chars: policy().max_tool_result_chars,
            segment: Some((summary.from, summary.to)),
            request_policy: None,
        };
        let why = match self.compactions.prepare(recorded.session, args).await {
            Ok(PrepareOutcome::Needed { scoped, .. }) => match self
                .compactions
                .commit(
                    recorded.session,
                    scoped,
                    summary.text.clone(),
                    summary.model.to_owned(),
                    false,
                )
                .await
            {
                Ok(outcome) if outcome.applied() => {
                    metrics::counter!("ctxd_gateway_agent_summaries_total").increment(1);
                    return;
                }
                Ok(outcome) => outcome.message,
                Err(e) => e.to_string(),
            },
            Ok(PrepareOutcome::NotNeeded { reason, .. }) => reason,
            Err(e) => e.to_string(),
        };
        tracing::warn!(reason = %why, "gateway: the agent's summary was not laid over its history");
    }

    /// The count_tokens body: what the next request's forwarded body would be.
    async fn counted_body(
        &self,
        tenant: &Tenant,
        named: Option<&str>,
        conv: &Conversation,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Option<Vec<u8>> {
        let store = &self.workflows.store;
        let (mut path, stored) = match record::peek(store, tenant, named, conv).await {
            Some((session, Some((k, node)))) => (
                store
                    .load_path(session, &PathTarget::Node(node))
                    .await
                    .ok()?,
                k + 1,
            ),
            _ => (PathView::default(), 0),
        };
        let seen = path
            .nodes
            .last()
            .map_or(render::Seen::Nothing, |n| render::Seen::Through(n.id));
        let rest: Vec<NodeContent> = conv.items[stored..]
            .iter()
            .map(|i| i.content.clone())
            .collect();
        path = extended(path, rest);
        let mut options = render_options(conv, &self.window(conv, headers))?;
        options.seen = seen;
        let (path, mut rendered) = self
            .workflows
            .render_path(path, Tokenizer::Heuristic, options)
            .await
            .ok()?;
        let members = json::Members::of(body)?;
        let client = forward::client_entries(&members, "messages");
        let contents: Vec<&NodeContent> = conv.items.iter().map(|i| &i.content).collect();
        let (entries, _) = forward::conversation(
            forward::Format::Anthropic,
            conv,
            &contents,
            client.as_deref(),
            &path,
            &mut rendered.messages,
        );
        members.with_entries("messages", &entries)
    }

    /// The window a request is budgeted in: the operator's setting for its model, the
    /// million-token beta when the client asks for it, else ctxd's table.
    fn window(&self, conv: &Conversation, headers: &HeaderMap) -> Window {
        let model = conv.model.to_ascii_lowercase();
        let set = self
            .windows
            .iter()
            .find(|w| w.names(&model))
            .map(|w| w.tokens);
        let beta = headers
            .get_all("anthropic-beta")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|b| b.trim().starts_with("context-1m"));
        Window {
            model,
            prefix: false,
            tokens: set
                .or(beta.then_some(1_000_000))
                .or_else(|| context_window(&conv.model))
                .unwrap_or(UNKNOWN_WINDOW),
        }
    }

    /// Sends `body` upstream and relays the answer as it arrives; with a `sink`, the answer is
    /// assembled on the way and appended once whole.
    async fn forward(
        &self,
        api: Api,
        method: Method,
        uri: &Uri,
        headers: &HeaderMap,
        body: Bytes,
        sink: Option<Sink>,
    ) -> Response {
        let base = match api {
            Api::Anthropic => &self.anthropic,
            Api::OpenAi | Api::Responses => &self.openai,
        };
        let path = uri.path_and_query().map_or("/", |p| p.as_str());
        let url = format!("{base}{path}");
        let mut request = self.http.request(method, &url).body(body);
        for (name, value) in headers {
            if forwarded(name) {
                request = request.header(name, value);
            }
        }
        let mut sink = sink;
        let upstream = match request.send().await {
            Ok(r) => {
                if let Some(gate) = sink.as_mut().and_then(|s| s.gate.take()) {
                    let _ = gate.send(());
                }
                r
            }
            Err(e) => {
                tracing::warn!(api = api.name(), error = %without_url(&e), "gateway: the upstream cannot be reached");
                count(api, "upstream_unreachable");
                let mut response = api.error(
                    StatusCode::BAD_GATEWAY,
                    match api {
                        Api::Anthropic => "api_error",
                        Api::OpenAi | Api::Responses => "upstream_error",
                    },
                    &format!(
                        "the ctxd gateway could not reach the upstream: {}",
                        without_url(&e)
                    ),
                    None,
                );
                // The client can still find the session its request went to.
                if let Some(sink) = &sink {
                    sink.name(response.headers_mut());
                }
                return response;
            }
        };
        let status = upstream.status();
        let mut response = Response::builder().status(status);
        if let Some(h) = response.headers_mut() {
            for (name, value) in upstream.headers() {
                if forwarded(name) || name == "content-length" {
                    h.append(name, value.clone());
                }
            }
            if let Some(sink) = &sink {
                sink.name(h);
            }
        }
        let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(16);
        tokio::spawn(relay(upstream, tx, sink, status.is_success()));
        let body = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
        response.body(body).unwrap_or_else(|_| {
            api.error(
                StatusCode::BAD_GATEWAY,
                "api_error",
                "the upstream's answer could not be relayed",
                None,
            )
        })
    }
}

/// `path` with `rest` after its last node, in memory (new ids, the hashes the store would give).
fn extended(mut path: PathView, rest: Vec<NodeContent>) -> PathView {
    let now = now_ms();
    let mut parent: Option<(NodeId, Hash)> = path.nodes.last().map(|n| (n.id, n.hash));
    for content in rest {
        let hash = node_hash(parent.as_ref().map(|p| &p.1), None, &content);
        let node = Node {
            id: NodeId::new(),
            parent_id: parent.map(|p| p.0),
            function_id: None,
            content,
            created_at_ms: now,
            hash,
        };
        parent = Some((node.id, hash));
        path.nodes.push(Arc::new(node));
    }
    path
}

/// The body to forward: `body` with its conversation the render of `path` (`contents` are the
/// request's items' contents). The render is let go before the body is written, so a large
/// request's text is not held three times over while it is.
fn written(
    api: Api,
    conv: &Conversation,
    contents: &[&NodeContent],
    path: &PathView,
    mut rendered: render::Rendered,
    body: &[u8],
) -> Result<ForwardedBody, &'static str> {
    let members = json::Members::of(body).ok_or("a body that is not an object")?;
    let client = forward::client_entries(&members, api.field());
    let tokens = forwarded_tokens(&rendered.messages);
    let (trigger, boundary) = (
        rendered.report.trigger,
        rendered.report.microcompact_boundary,
    );
    // The common case, a render that changed nothing: the client's body goes as sent, found
    // without building the forwarded conversation (debug builds check it against that build).
    let as_sent = forward::as_sent(conv, contents, client.as_deref(), path, &rendered.messages);
    #[cfg(debug_assertions)]
    if let Some(kept) = &as_sent {
        let (entries, built) = forward::conversation(
            api.format(),
            conv,
            contents,
            client.as_deref(),
            path,
            &mut rendered.messages,
        );
        assert_eq!(&built, kept, "as_sent keeps what the full build keeps");
        assert!(
            forward::all_client_entries(&entries, client.as_deref()),
            "as_sent forwards what the full build forwards"
        );
    }
    let (body, kept) = match as_sent {
        Some(kept) => (None, kept),
        None => {
            let (entries, kept) = forward::conversation(
                api.format(),
                conv,
                contents,
                client.as_deref(),
                path,
                &mut rendered.messages,
            );
            drop(rendered);
            if kept.forwarded_markers < kept.client_markers.min(MAX_MESSAGE_MARKERS) {
                tracing::debug!(
                    ?kept,
                    "gateway: fewer breakpoints forwarded than the client sent"
                );
            }
            let body = if forward::all_client_entries(&entries, client.as_deref()) {
                None
            } else {
                Some(
                    members
                        .with_entries(api.field(), &entries)
                        .ok_or("a body that is not an object")?,
                )
            };
            (body, kept)
        }
    };
    Ok(ForwardedBody {
        body,
        tokens,
        kept,
        trigger,
        boundary,
    })
}

/// A forwarded body and what the ledger needs of it.
struct ForwardedBody {
    /// `None`: the client's body, as sent.
    body: Option<Vec<u8>>,
    tokens: u64,
    kept: forward::Kept,
    trigger: Option<render::Trigger>,
    boundary: usize,
}

/// The window of a model ctxd does not know: no budget cuts it, only steps do.
const UNKNOWN_WINDOW: u32 = u32::MAX;

/// The most of the window kept for the answer. A client's `max_tokens` is a ceiling, not a
/// forecast (Claude Code asks for 128,000, which would leave a 200k window 72k of history):
/// an answer rarely takes more than this, and one that would, ends where the provider stops it.
const OUTPUT_RESERVE: u32 = 32_000;

/// Breakpoints a client can place on messages at most (the API's four).
const MAX_MESSAGE_MARKERS: usize = anthropic::MAX_MARKERS;

/// The render options of a request: its window, its answer's reserve, its system prompt and
/// tools; `None` when they leave the history nothing.
fn render_options(conv: &Conversation, window: &Window) -> Option<render::Options> {
    let budget = Budget {
        context_window: window.tokens,
        output_reserve: conv.output_reserve.min(OUTPUT_RESERVE),
        system: conv.system_tokens,
        tools: conv.tools_tokens,
        schema: 0,
    };
    budget.history().ok()?;
    Some(render::Options {
        callers: render::Callers::All,
        budget: Some(budget),
        policy: policy(),
        now_ms: now_ms(),
        seen: render::Seen::All,
    })
}

/// The input window of a model by its name (the standard window of its family as the providers
/// state it; a larger one a client must ask for, as Anthropic's 1M beta, is taken from the
/// request). `None` for a model not in the table.
fn context_window(model: &str) -> Option<u32> {
    let m = model.to_ascii_lowercase();
    let m = m.rsplit('/').next().unwrap_or(&m);
    const TABLE: &[(&str, u32)] = &[
        // Claude: every current model (Opus 4.x, Sonnet 4.x, Haiku 4.5, and the 3.x still
        // served) has 200k; Sonnet's 1M is the beta header's.
        ("claude", 200_000),
        // GPT-5 family (gpt-5, -mini, -nano, -codex, 5.1, 5.2): 400k of which 128k output.
        ("gpt-5", 272_000),
        ("gpt-4.1", 1_047_576),
        ("gpt-4o", 128_000),
        ("gpt-4-turbo", 128_000),
        ("o1", 200_000),
        ("o3", 200_000),
        ("o4", 200_000),
        ("codex-mini", 200_000),
        ("gpt-oss", 131_072),
        // Gemini 2.5 and 3 (Pro, Flash, Flash-Lite): 1M input.
        ("gemini-2.5", 1_048_576),
        ("gemini-3", 1_048_576),
        ("gemini-2.0", 1_048_576),
    ];
    TABLE
        .iter()
        .find(|(prefix, _)| m.starts_with(prefix))
        .map(|(_, tokens)| *tokens)
}

/// Tokens of the forwarded messages, counted as the client's are.
fn forwarded_tokens(messages: &[Message]) -> u64 {
    messages
        .iter()
        .map(|m| {
            let parts: usize = m.parts.iter().map(Part::byte_len).sum();
            let calls: usize = m
                .tool_calls
                .iter()
                .map(|c| c.name.len() + c.arguments_json.len())
                .sum();
            estimate(parts + calls) + 4
        })
        .sum()
}

fn forwarded(name: &HeaderName) -> bool {
    let n = name.as_str();
    !DROPPED.contains(&n) && !n.starts_with("x-ctxd-")
}

/// A transport error without its URL, which may carry credentials in a query.
fn without_url(e: &reqwest::Error) -> String {
    let mut e = e.to_string();
    if let Some(i) = e.find(" for url") {
        e.truncate(i);
    }
    e
}

fn request_policy(default: GatewayPolicy, headers: &HeaderMap) -> Result<GatewayPolicy, ()> {
    match headers.get("x-ctxd-policy") {
        None => Ok(default),
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|s| GatewayPolicy::parse(s.trim()))
            .ok_or(()),
    }
}

fn session_header(headers: &HeaderMap) -> Result<Option<String>, ()> {
    match headers.get("x-ctxd-session") {
        None => Ok(None),
        Some(v) => {
            let s = v.to_str().map_err(|_| ())?.trim();
            if s.is_empty() {
                return Err(());
            }
            Ok(Some(s.to_owned()))
        }
    }
}

/// Claude Code names its session in a header too; `metadata.user_id` wins when both are there.
fn with_client_session(mut conv: Conversation, headers: &HeaderMap) -> Conversation {
    if conv.client_session.is_none() {
        conv.client_session = headers
            .get("x-claude-code-session-id")
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned);
    }
    conv
}

fn count(api: Api, outcome: &'static str) {
    metrics::counter!("ctxd_gateway_requests_total", "api" => api.name(), "outcome" => outcome)
        .increment(1);
}

fn passthrough(reason: &'static str) {
    tracing::info!(reason, "gateway: forwarding a request unchanged");
    metrics::counter!("ctxd_gateway_passthrough_total", "reason" => reason).increment(1);
}

/// Where an answer goes once whole.
struct Sink {
    workflows: Workflows,
    api: Api,
    stream: bool,
    model: String,
    client_tokens: u64,
    forwarded_tokens: u64,
    /// Where the request goes, as the answer's headers name it.
    named: Named,
    recording: Recording,
    verdict: Option<ledger::Verdict>,
    /// Opened once the upstream has answered: a request located without writing is recorded
    /// then (dropped unopened, it records nothing).
    gate: Option<tokio::sync::oneshot::Sender<()>>,
}

/// The session, branch and function a request goes to.
struct Named {
    session: Scoped,
    branch: domain::BranchName,
    function: Option<NodeId>,
}

/// A request recorded, or being recorded beside its upstream call.
enum Recording {
    Done(Box<Recorded>),
    Pending(tokio::task::JoinHandle<Option<Recorded>>),
    /// Its recording failed or never began.
    Lost,
}

impl Recording {
    async fn get(&mut self) -> Option<&Recorded> {
        if let Recording::Pending(task) = self {
            *self = match task.await {
                Ok(Some(recorded)) => Recording::Done(Box::new(recorded)),
                _ => Recording::Lost,
            };
        }
        match self {
            Recording::Done(recorded) => Some(recorded),
            Recording::Pending(_) | Recording::Lost => None,
        }
    }
}

enum Assembly {
    Anthropic(anthropic::Answer),
    OpenAi(chat::Answer),
    Responses(responses::Answer),
}

impl Assembly {
    fn feed(&mut self, bytes: &[u8]) {
        match self {
            Assembly::Anthropic(a) => a.feed(bytes),
            Assembly::OpenAi(a) => a.feed(bytes),
            Assembly::Responses(a) => a.feed(bytes),
        }
    }

    fn finish(self) -> Option<(Option<NodeContent>, ProviderUsage)> {
        match self {
            Assembly::Anthropic(a) => a.finish(),
            Assembly::OpenAi(a) => a.finish(),
            Assembly::Responses(a) => a.finish(),
        }
    }

    /// A streamed answer's terminal event has arrived.
    fn complete(&self) -> bool {
        match self {
            Assembly::Anthropic(a) => a.complete(),
            Assembly::OpenAi(a) => a.complete(),
            Assembly::Responses(a) => a.complete(),
        }
    }
}

/// Relays the upstream's body to the client chunk by chunk. A client that goes away ends the
/// relay and drops the upstream call; a cut upstream cuts the client's answer too; only a
/// whole answer is appended. The chunk that ends a recorded answer (its terminal event; for a
/// whole JSON body, the last chunk) is held until the answer is appended, so a client that has
/// the whole answer finds it in the session, and its next request never races the append.
async fn relay(
    mut upstream: reqwest::Response,
    tx: mpsc::Sender<Result<Bytes, std::io::Error>>,
    mut sink: Option<Sink>,
    answered: bool,
) {
    // An error status is relayed as it came; only an answer is assembled and appended.
    let mut assembly = sink.as_ref().filter(|_| answered).map(|s| match s.api {
        Api::Anthropic => Assembly::Anthropic(anthropic::Answer::new(s.stream)),
        Api::OpenAi => Assembly::OpenAi(chat::Answer::new(s.stream)),
        Api::Responses => Assembly::Responses(responses::Answer::new(s.stream)),
    });
    let streamed = sink.as_ref().is_none_or(|s| s.stream);
    let mut held: Vec<Bytes> = Vec::new();
    loop {
        match upstream.chunk().await {
            Ok(Some(bytes)) => {
                let Some(a) = assembly.as_mut() else {
                    if tx.send(Ok(bytes)).await.is_err() {
                        return gone();
                    }
                    continue;
                };
                a.feed(&bytes);
                let out = if streamed {
                    if a.complete() || !held.is_empty() {
                        held.push(bytes);
                        continue;
                    }
                    vec![bytes]
                } else {
                    // A whole body ends with its last chunk: keep one chunk back.
                    std::mem::replace(&mut held, vec![bytes])
                };
                for b in out {
                    if tx.send(Ok(b)).await.is_err() {
                        return gone();
                    }
                }
            }
            Ok(None) => break,
            Err(e) => {
                tracing::warn!(error = %without_url(&e), "gateway: the upstream's answer was cut");
                // The client sees the end once its request is recorded, whatever the end.
                if let Some(sink) = sink.as_mut() {
                    sink.recording.get().await;
                }
                for b in held {
                    let _ = tx.send(Ok(b)).await;
                }
                let _ = tx
                    .send(Err(std::io::Error::other("the upstream's answer was cut")))
                    .await;
                return;
            }
        }
    }
    let answer = match (&sink, assembly) {
        (Some(_), Some(assembly)) => assembly.finish(),
        _ => None,
    };
    if let Some(sink) = sink.as_mut() {
        match &answer {
            Some((Some(content), _)) => sink.append(content.clone()).await,
            _ => {
                sink.recording.get().await;
            }
        }
    }
    for b in held {
        if tx.send(Ok(b)).await.is_err() {
            break;
        }
    }
    drop(tx);
    match (sink, answer) {
        (Some(sink), Some((_, usage))) => sink.usage(usage).await,
        (Some(_), None) if answered => {
            tracing::info!("gateway: an answer that is not whole is not recorded");
        }
        _ => {}
    }
}

fn gone() {
    tracing::debug!("gateway: the client went away; the upstream call is dropped");
}

impl Sink {
    /// Names the session, branch and function the request goes to.
    fn name(&self, h: &mut HeaderMap) {
        let id = self.named.session.id().to_string();
        if let Ok(v) = HeaderValue::from_str(&id) {
            h.insert("x-ctxd-session-id", v);
        }
        if let Ok(v) = HeaderValue::from_str(self.named.branch.as_str()) {
            h.insert("x-ctxd-branch", v);
        }
        if let Some(function) = self.named.function
            && let Ok(v) = HeaderValue::from_str(&function.to_string())
        {
            h.insert("x-ctxd-function-id", v);
        }
    }

    /// Appends the answer after the request, once the request is recorded.
    async fn append(&mut self, content: NodeContent) {
        let store = self.workflows.store.clone();
        let Some(recorded) = self.recording.get().await else {
            tracing::info!("gateway: the request was not recorded, so neither is its answer");
            return;
        };
        append_answer(&store, recorded.session, recorded, content).await;
    }

    async fn usage(mut self, usage: ProviderUsage) {
        // A call whose request was never recorded leaves no record of its usage either.
        if self.recording.get().await.is_none() {
            return;
        }
        let store = &self.workflows.store;
        let session = self.named.session;
        for (kind, n) in [
            ("upstream_input", usage.input),
            ("cache_read", usage.cache_read),
            ("cache_write", usage.cache_write),
            ("output", usage.output),
        ] {
            metrics::counter!("ctxd_gateway_tokens_total", "kind" => kind).increment(n);
        }
        let call = GatewayCall {
            at_ms: now_ms(),
            api: self.api.name().to_owned(),
            model: self.model,
            client_tokens: self.client_tokens,
            forwarded_tokens: self.forwarded_tokens,
            usage,
            kept_tokens: self.verdict.map_or(0, |v| {
                let prompt = usage.input + usage.cache_read + usage.cache_write;
                (prompt as f64 * v.kept_share).round() as u64
            }),
            change: self.verdict.and_then(|v| v.change),
        };
        if let Err(e) = store.record_gateway_call(session, &call).await {
            tracing::warn!(error = %e, "gateway: the call's usage was not recorded");
        }
    }
}

/// Appends the answer after the request's history. When the branch moved meanwhile (the
/// client's next request, carrying this answer, came first), the answer is already stored, or
/// it goes on a branch of its own at the request's head (a function's chain cannot fork: there
/// it is left out).
async fn append_answer(
    store: &store::Store,
    session: Scoped,
    recorded: &Recorded,
    content: NodeContent,
) {
    let append = |target: AppendTarget, content: NodeContent| AppendRequest {
        session,
        target,
        expected_head: Some(recorded.head.map(|(id, _)| id)),
        idempotency_key: None,
        nodes: vec![content],
        pinned: Vec::new(),
    };
    // The answer chains from the request's head (or, first in a function's chain, from the
    // function's call node), whose hash recording already knew.
    let scope = recorded.function.map(|(_, hash)| hash);
    let parent = recorded.head.map(|(_, hash)| hash).or(scope);
    // The same answer after the same history is stored already (a retry answered alike).
    let hash = node_hash(parent.as_ref(), scope.as_ref(), &content);
    if matches!(store.node_by_hash(session, &hash).await, Ok(Some(_))) {
        return;
    }
    match store
        .append(append(recorded.target(), content.clone()))
        .await
    {
        Ok(_) => {}
        Err(store::Error::Domain(domain::Error::Aborted(_))) => {
            if matches!(store.node_by_hash(session, &hash).await, Ok(Some(_))) {
                return;
            }
            if recorded.function.is_some() {
                tracing::info!("gateway: a sub-agent's chain moved on; its answer is not recorded");
                return;
            }
            let name = format!("gw-{}", &hash.to_hex()[..12]);
            let Ok(name) = domain::BranchName::parse("branch", &name) else {
                return;
            };
            let forked = store
                .create_branch(session, name.clone(), recorded.head.map(|(id, _)| id))
                .await;
            if forked.is_ok()
                && let Err(e) = store
                    .append(append(AppendTarget::Branch(name), content))
                    .await
            {
                tracing::warn!(error = %e, "gateway: the answer was not recorded");
            }
        }
        Err(e) => tracing::warn!(error = %e, "gateway: the answer was not recorded"),
    }
}
