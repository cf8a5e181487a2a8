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
mod resend;

use std::sync::Arc;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, post};
use axum::serve::ListenerExt as _;
use tokio::net::TcpListener;

use futures_util::StreamExt as _;
use tokio::sync::OwnedSemaphorePermit;

use crate::auth::{ApiKeys, gateway_tenant};
use crate::domain::Tenant;
use crate::domain::WireFormat;
use crate::limits::{Admission, Refused};
use crate::provider::codec::{Action, Codec, Failure, Upstream, codec, codecs};
use crate::provider::models::ModelTable;
use crate::workflow::Workflows;
use crate::workflow::render::Reasoning;

pub use crate::provider::models::Window;
pub use config::{GatewayPolicy, MAX_BODY_BYTES, policy};

/// The gateway's listener and where it forwards.
pub struct Gateway {
    pub listener: TcpListener,
    /// Base URLs without `/v1`, e.g. `https://api.anthropic.com`.
    pub anthropic_upstream: String,
    pub openai_upstream: String,
    /// Google's Gemini API, e.g. `https://generativelanguage.googleapis.com`.
    pub gemini_upstream: String,
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
            gemini_upstream: Upstream::Google.default_url().to_owned(),
            policy: GatewayPolicy::default(),
            windows: Vec::new(),
            max_body_bytes: MAX_BODY_BYTES,
            reasoning: Reasoning::default(),
        }
    }
}

/// A wire format's codec, as the gateway holds it: all it knows of the format.
type Api = &'static dyn Codec;

/// An answer the gateway gives itself, in the shape of `api`'s provider.
fn refuse(api: Api, failure: Failure, message: &str, param: Option<&str>) -> Response {
    let status = match failure {
        Failure::Invalid => StatusCode::BAD_REQUEST,
        Failure::Unauthenticated => StatusCode::UNAUTHORIZED,
        Failure::NotFound => StatusCode::NOT_FOUND,
        Failure::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        Failure::Upstream => StatusCode::BAD_GATEWAY,
        Failure::Busy => StatusCode::TOO_MANY_REQUESTS,
        Failure::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
    };
    let body = api.error(failure, message, param);
    let mut response = (status, body.to_string()).into_response();
    response.headers_mut().insert(
        axum::http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// A 400 naming the field at fault.
fn invalid(api: Api, field: &str, message: &str) -> Response {
    refuse(
        api,
        Failure::Invalid,
        &format!("{field}: {message}"),
        Some(field),
    )
}

#[derive(Clone)]
struct App {
    workflows: Workflows,
    keys: Option<Arc<ApiKeys>>,
    http: reqwest::Client,
    anthropic: Arc<str>,
    openai: Arc<str>,
    google: Arc<str>,
    policy: GatewayPolicy,
    /// The server's model table with the operator's windows over it.
    models: Arc<ModelTable>,
    reasoning: Reasoning,
    max_body_bytes: usize,
    max_part_bytes: usize,
    /// The server's call slots, shared with the other doors: a call holds one until its answer
    /// is relayed whole, so a shutdown drains the gateway's calls with the rest.
    admission: Admission,
    /// Each conversation's previous request, so the next is read from what changed.
    resends: Arc<resend::Resends>,
}

/// Serves the gateway on its listener until the task is dropped. A call in flight when it is
/// dropped appends nothing of its answer.
pub async fn serve(
    gateway: Gateway,
    workflows: Workflows,
    keys: Option<Arc<ApiKeys>>,
    admission: Admission,
    max_part_bytes: usize,
) -> std::io::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::builder()
        .build()
        .map_err(std::io::Error::other)?;
    let trim = |s: &str| -> Arc<str> { Arc::from(s.trim_end_matches('/')) };
    let app = App {
        models: Arc::new(config::table(&workflows.models, &gateway.windows)),
        workflows,
        keys,
        http,
        anthropic: trim(&gateway.anthropic_upstream),
        openai: trim(&gateway.openai_upstream),
        google: trim(&gateway.gemini_upstream),
        policy: gateway.policy,
        reasoning: gateway.reasoning,
        max_body_bytes: gateway.max_body_bytes,
        max_part_bytes,
        admission,
        resends: Arc::default(),
    };
    let mut router = Router::new();
    for api in codecs() {
        for route in api.routes() {
            router = router.route(route, endpoint(api));
        }
    }
    let router = router
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

/// The endpoint of one API: its body read within the limit, then handled as what its path
/// asks for.
fn endpoint(api: Api) -> MethodRouter<App> {
    post(
        move |State(app): State<App>, uri: Uri, headers: HeaderMap, body: Body| async move {
            if let Some(response) = announced_over(api, &headers, app.max_body_bytes) {
                return response;
            }
            let slot = match app.admit(api) {
                Ok(slot) => slot,
                Err(response) => return response,
            };
            let body = match read_body(api, body, app.max_body_bytes).await {
                Ok(body) => body,
                Err(response) => return response,
            };
            // A model call and a count read their request alike, once.
            let response = match api.action(uri.path()) {
                Action::Other => app.as_sent(api, Method::POST, uri, headers, body).await,
                action => match app.parsed(api, &uri, &headers, &body).await {
                    Err(response) => response,
                    Ok(parsed) if action == Action::Count => {
                        app.count_tokens(api, uri, headers, body, parsed).await
                    }
                    Ok(parsed) => app.handle(api, uri, headers, body, parsed).await,
                },
            };
            held(response, slot)
        },
    )
}

/// `response` with the call's slot held until its body is relayed whole (or the client goes).
fn held(response: Response, slot: OwnedSemaphorePermit) -> Response {
    let (parts, body) = response.into_parts();
    let stream = body.into_data_stream().map(move |chunk| {
        let _slot = &slot;
        chunk
    });
    Response::from_parts(parts, Body::from_stream(stream))
}

/// The request body, at most `limit` bytes; a longer one is `413` in the API's shape (an agent
/// reads the provider's error shape, not the HTTP stack's plain text).
#[allow(clippy::result_large_err)]
async fn read_body(api: Api, body: Body, limit: usize) -> Result<Bytes, Response> {
    match axum::body::to_bytes(body, limit).await {
        Ok(bytes) => Ok(bytes),
        Err(e) => {
            let over = std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
            count(api, "invalid");
            Err(if over {
                too_large(api, limit)
            } else {
                invalid(api, "body", &format!("could not be read: {e}"))
            })
        }
    }
}

/// The 413 of a request whose `content-length` announces a body over `limit`: answered before
/// a byte of the body is read (or a call slot taken), so a client that announces more than it
/// may send holds nothing.
fn announced_over(api: Api, headers: &HeaderMap, limit: usize) -> Option<Response> {
    let announced = headers
        .get(axum::http::header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .parse::<u64>()
        .ok()?;
    (announced > limit as u64).then(|| {
        count(api, "invalid");
        too_large(api, limit)
    })
}

fn too_large(api: Api, limit: usize) -> Response {
    refuse(
        api,
        Failure::TooLarge,
        &format!("body: the request is over the ctxd gateway's limit of {limit} bytes"),
        Some("body"),
    )
}

/// Any other request: forwarded unchanged, to the provider whose codec claims it (by its path or
/// its headers), else to OpenAI's. Only the provider's API paths are served.
async fn other(
    State(app): State<App>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let has = |name: &str| headers.contains_key(name);
    let api = codecs()
        .into_iter()
        .find(|c| c.claims(uri.path(), &has))
        .unwrap_or(codec(WireFormat::ChatCompletions));
    if let Some(response) = announced_over(api, &headers, app.max_body_bytes) {
        return response;
    }
    let slot = match app.admit(api) {
        Ok(slot) => slot,
        Err(response) => return response,
    };
    let response = other_of(&app, api, method, uri, headers, body).await;
    held(response, slot)
}

/// An unrouted request of `api`'s provider.
async fn other_of(
    app: &App,
    api: Api,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let body = match read_body(api, body, app.max_body_bytes).await {
        Ok(body) => body,
        Err(response) => return response,
    };
    if !api.serves(uri.path()) {
        return refuse(
            api,
            Failure::NotFound,
            "the ctxd gateway serves the providers' API paths only (/v1/, and /v1beta/ for Gemini)",
            None,
        );
    }
    app.as_sent(api, method, uri, headers, body).await
}

impl App {
    /// A request the gateway only relays: the caller's key checked, counted, forwarded as it
    /// came.
    async fn as_sent(
        &self,
        api: Api,
        method: Method,
        uri: Uri,
        headers: HeaderMap,
        body: Bytes,
    ) -> Response {
        if let Err(response) = self.tenant(api, &headers) {
            return response;
        }
        count(api, "forwarded");
        self.forward(api, method, &uri, &headers, body, None).await
    }

    /// One of the server's call slots, or the refusal, in the API's shape.
    #[allow(clippy::result_large_err)]
    fn admit(&self, api: Api) -> Result<OwnedSemaphorePermit, Response> {
        self.admission.admit().map_err(|refused| {
            count(api, "refused");
            let failure = match refused {
                Refused::Draining => Failure::Unavailable,
                Refused::Full => Failure::Busy,
            };
            refuse(api, failure, &self.admission.refusal(refused), None)
        })
    }

    /// The caller's tenant, or the refusal in the API's shape.
    #[allow(clippy::result_large_err)]
    fn tenant(&self, api: Api, headers: &HeaderMap) -> Result<Tenant, Response> {
        gateway_tenant(self.keys.as_deref(), headers).map_err(|reason| {
            count(api, "unauthenticated");
            refuse(api, Failure::Unauthenticated, reason, None)
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

/// The request's headers whose values are text, as a codec reads them.
fn text_headers(headers: &HeaderMap) -> Vec<(&str, &str)> {
    headers
        .iter()
        .filter_map(|(name, value)| Some((name.as_str(), value.to_str().ok()?)))
        .collect()
}

fn count(api: Api, outcome: &'static str) {
    metrics::counter!("ctxd_gateway_requests_total", "api" => api.name(), "outcome" => outcome)
        .increment(1);
}

fn passthrough(reason: &'static str) {
    tracing::info!(reason, "gateway: forwarding a request unchanged");
    metrics::counter!("ctxd_gateway_passthrough_total", "reason" => reason).increment(1);
}
