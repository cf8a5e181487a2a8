//! The model gateway (`ctxd serve --gateway ADDR`): a third front door, beside gRPC and the
//! inspector, for agents that only speak a provider's HTTP API (Anthropic Messages, OpenAI chat
//! completions and Responses). Each call is recorded as a session (`record`), forwarded with
//! ctxd's render of its branch in place of the client's `messages` or `input` (every other
//! field byte-identical), and
//! answered exactly as the provider answered, relayed as it arrives; the assembled answer is
//! appended once it is whole. A request it cannot record is forwarded as it came (fail open);
//! ctxd's own keys guard it (fail closed); provider credentials pass through, never kept.
//!
//! This module holds the routes, `serve` and what a request's headers say; a call goes through
//! `call` (read, record, forward), `body` (the render written into the client's body), `relay`
//! (upstream and back) and `answer` (appended once whole). `count_tokens` previews a call,
//! `config` holds the policy and the context windows; `forward`, `json` and `ledger` serve `body`
//! and `call`.

mod answer;
mod body;
mod call;
mod config;
mod count_tokens;
mod forward;
mod json;
mod ledger;
mod relay;

use std::sync::Arc;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, post};
use axum::serve::ListenerExt as _;
use serde_json::Value;
use tokio::net::TcpListener;

use crate::auth::{ApiKeys, gateway_tenant};
use crate::domain::Tenant;
use crate::provider::conversation::{Conversation, Refusal};
use crate::provider::models::ModelTable;
use crate::provider::{anthropic, chat, responses};
use crate::workflow::Workflows;
use crate::workflow::compaction::Compactions;
use crate::workflow::record;
use crate::workflow::render::Reasoning;

pub use config::{GatewayPolicy, MAX_BODY_BYTES, Window, policy};

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
    /// For a model that binds its thinking to its prefix: keep every thinking block valid
    /// (steps as the provider's edit), or drop what a step invalidates (`--gateway-reasoning`).
    pub reasoning: Reasoning,
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
            reasoning: Reasoning::default(),
        }
    }
}

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
    /// The server's model table with the operator's windows over it.
    models: Arc<ModelTable>,
    reasoning: Reasoning,
    max_body_bytes: usize,
    max_part_bytes: usize,
    /// Sessions by the keys that named them.
    keys_seen: Arc<record::SessionKeys>,
    /// Where an agent's own summaries are laid over the history they replaced.
    compactions: Arc<Compactions>,
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
        models: Arc::new(config::table(&workflows.models, &gateway.windows)),
        workflows,
        keys,
        http,
        anthropic: trim(&gateway.anthropic_upstream),
        openai: trim(&gateway.openai_upstream),
        policy: gateway.policy,
        reasoning: gateway.reasoning,
        max_body_bytes: gateway.max_body_bytes,
        max_part_bytes,
    };
    let router = Router::new()
        .route("/v1/messages", endpoint(Api::Anthropic))
        .route(
            "/v1/messages/count_tokens",
            post(count_tokens::count_tokens),
        )
        .route("/v1/chat/completions", endpoint(Api::OpenAi))
        .route("/v1/responses", endpoint(Api::Responses))
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

/// The endpoint of one API: its body read within the limit, then handled as that API's.
fn endpoint(api: Api) -> MethodRouter<App> {
    post(
        move |State(app): State<App>, uri: Uri, headers: HeaderMap, body: Body| async move {
            match read_body(api, body, app.max_body_bytes).await {
                Ok(body) => app.handle(api, uri, headers, body).await,
                Err(response) => response,
            }
        },
    )
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
