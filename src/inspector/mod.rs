//! The web inspector (`ctxd serve --http ADDR`): a read-only JSON API under `/api/` and the
//! embedded pages that read it.
//!
//! Every `/api/` handler builds a `tonic::Request` carrying the caller's tenant (from the same
//! API keys and `authorization: Bearer` header as gRPC, `auth::http_tenant`) and asks its
//! [`Source`]: the contract's read calls, which the assembly (`server`) answers with the gRPC
//! service in process; the response is converted by `proto::json::ToJson`, as the CLI's
//! `--json` is. Parsing, tenant scoping, limits
//! and error messages are therefore the RPCs' own: this module only maps query strings to
//! requests and gRPC codes to HTTP statuses. Calls are admitted under the gRPC server's
//! concurrency limit and counted in its metrics (`via="http"`); `events` follows a session
//! (Watch as server-sent events) and `savings` replays what the context policy saved.

mod live;
mod query;
mod tls;

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{FromRequest, FromRequestParts, Path, RawQuery, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::serve::ListenerExt as _;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tonic::Code;

use crate::auth::{ApiKeys, http_tenant};
use crate::domain::Tenant;
use crate::limits::Admission;
use crate::proto::json::ToJson;
use crate::proto::pb;
use crate::workflow::SavingsReport;
use query::Query;

/// A gRPC answer as the contract gives it.
pub type Reply<T> = Result<tonic::Response<T>, tonic::Status>;

/// The events a Watch streams.
pub type Events = std::pin::Pin<
    Box<dyn futures_util::Stream<Item = Result<pb::WatchEvent, tonic::Status>> + Send>,
>;

/// What the inspector reads: the contract's read calls and the savings replay, each answered
/// (with its parsing, tenant scoping, limits and error messages) as the gRPC door answers it.
#[async_trait::async_trait]
pub trait Source: Send + Sync + 'static {
    async fn list_sessions(
        &self,
        r: tonic::Request<pb::ListSessionsRequest>,
    ) -> Reply<pb::ListSessionsResponse>;
    async fn get_session(&self, r: tonic::Request<pb::GetSessionRequest>) -> Reply<pb::Session>;
    async fn log(&self, r: tonic::Request<pb::LogRequest>) -> Reply<pb::LogResponse>;
    async fn get_nodes(
        &self,
        r: tonic::Request<pb::GetNodesRequest>,
    ) -> Reply<pb::GetNodesResponse>;
    async fn render(&self, r: tonic::Request<pb::RenderRequest>) -> Reply<pb::RenderResponse>;
    async fn list_summaries(
        &self,
        r: tonic::Request<pb::ListSummariesRequest>,
    ) -> Reply<pb::ListSummariesResponse>;
    async fn list_gateway_calls(
        &self,
        r: tonic::Request<pb::ListGatewayCallsRequest>,
    ) -> Reply<pb::ListGatewayCallsResponse>;
    async fn watch(&self, r: tonic::Request<pb::WatchRequest>) -> Result<Events, tonic::Status>;
    async fn savings(
        &self,
        r: tonic::Request<pb::RenderRequest>,
        calls: usize,
    ) -> Result<SavingsReport, tonic::Status>;
}

/// What every handler shares: what it reads, the keys the gRPC server checks and its admission
/// (one pool of call slots for both front doors).
#[derive(Clone)]
pub struct App {
    service: Arc<dyn Source>,
    keys: Option<Arc<ApiKeys>>,
    admission: Admission,
}

impl App {
    pub fn new(service: Arc<dyn Source>, keys: Option<Arc<ApiKeys>>, admission: Admission) -> Self {
        Self {
            service,
            keys,
            admission,
        }
    }
}

/// Serves the inspector on `listener` until the task is dropped, over TLS with `tls`: it holds
/// no state of its own, so stopping it mid-request loses nothing.
pub async fn serve(
    listener: TcpListener,
    app: App,
    tls: Option<Arc<rustls::ServerConfig>>,
) -> std::io::Result<()> {
    let router = router(app);
    if let Some(config) = tls {
        return tls::serve(listener, router, config).await;
    }
    // Without TCP_NODELAY a body written after its head waits ~40 ms for a delayed ACK.
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "inspector: TCP_NODELAY not set");
        }
    });
    axum::serve(listener, router).await
}

/// The inspector's routes: the pages, their assets, and `/api/`.
pub fn router(app: App) -> Router {
    let api = Router::new()
        .route("/sessions", get(list_sessions))
        .route("/sessions/{id}", get(get_session))
        .route("/sessions/{id}/log", get(log))
        .route("/sessions/{id}/nodes", get(get_nodes))
        .route("/sessions/{id}/render", get(render))
        .route("/sessions/{id}/savings", get(savings))
        .route("/sessions/{id}/summaries", get(list_summaries))
        .route("/sessions/{id}/gateway-calls", get(list_gateway_calls))
        .route("/sessions/{id}/events", get(live::events))
        .fallback(|| async { error(StatusCode::NOT_FOUND, Code::NotFound, "no such API route") })
        // Outermost last: counted, then authenticated, then admitted, as gRPC calls are.
        .layer(middleware::from_fn_with_state(app.clone(), admit))
        .layer(middleware::from_fn_with_state(app.clone(), authenticate))
        .layer(middleware::from_fn(meter))
        .with_state(app);
    let assets = Assets::from_env();
    let page = |name: &'static str| {
        let assets = assets.clone();
        get(move || async move { assets.serve(name).await })
    };
    Router::new()
        .route("/", page("index.html"))
        .route("/app.js", page("app.js"))
        .route("/app.css", page("app.css"))
        .nest("/api", api)
        .fallback(|| async { error(StatusCode::NOT_FOUND, Code::NotFound, "no such page") })
}

// Embedded, so the inspector works offline and `cargo build` needs no front-end toolchain.
const INDEX_HTML: &str = include_str!("assets/index.html");
const APP_JS: &str = include_str!("assets/app.js");
const APP_CSS: &str = include_str!("assets/app.css");

/// Where the pages come from: the embedded copies, or (for working on them) the files of the
/// directory `CTXD_INSPECTOR_ASSETS` names, read at every request.
#[derive(Clone)]
enum Assets {
    Embedded,
    Dir(Arc<std::path::Path>),
}

impl Assets {
    fn from_env() -> Self {
        match std::env::var_os("CTXD_INSPECTOR_ASSETS") {
            Some(dir) if !dir.is_empty() => Self::Dir(Arc::from(std::path::Path::new(&dir))),
            _ => Self::Embedded,
        }
    }

    async fn serve(&self, name: &'static str) -> Response {
        let content_type = match name.rsplit('.').next() {
            Some("html") => "text/html; charset=utf-8",
            Some("js") => "text/javascript; charset=utf-8",
            _ => "text/css; charset=utf-8",
        };
        let body = match self {
            Self::Embedded => match name {
                "index.html" => INDEX_HTML.to_owned(),
                "app.js" => APP_JS.to_owned(),
                _ => APP_CSS.to_owned(),
            },
            Self::Dir(dir) => match tokio::fs::read_to_string(dir.join(name)).await {
                Ok(body) => body,
                Err(e) => {
                    let message = format!("{}: {e}", dir.join(name).display());
                    return error(StatusCode::NOT_FOUND, Code::NotFound, &message).into_response();
                }
            },
        };
        asset(body, content_type)
    }
}

/// The page content policy: scripts and styles only from this server and no inline script, so
/// content that slipped past escaping still could not run.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

fn asset(body: String, content_type: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    // Revalidated on every load: an upgraded binary serves its own script, never a cached one.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// Puts the caller's tenant into the request, or answers 401 before any handler runs.
async fn authenticate(State(app): State<App>, mut request: Request, next: Next) -> Response {
    let path = request.uri().path().to_owned();
    match http_tenant(app.keys.as_deref(), request.headers(), &path) {
        Ok(tenant) => {
            // Handlers get the tenant, never the credential.
            request.headers_mut().remove(header::AUTHORIZATION);
            request.extensions_mut().insert(tenant);
            next.run(request).await
        }
        Err(refusal) => {
            let status = tonic::Status::unauthenticated(refusal.message());
            let mut response = failure(&status).into_response();
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"ctxd\""),
            );
            response
        }
    }
}

/// Takes one of the server's call slots for the request, or answers as a gRPC call past the
/// limit (or during shutdown) is answered. A stream (`events`) gives its slot back once it has
/// started, as a gRPC stream does.
async fn admit(State(app): State<App>, request: Request, next: Next) -> Response {
    match app.admission.try_admit() {
        Ok(_slot) => next.run(request).await,
        Err(status) => failure(&status).into_response(),
    }
}

/// Counts and times the request in the RPC metrics, under the RPC its route calls.
async fn meter(request: Request, next: Next) -> Response {
    let method = rpc_name(request.uri().path());
    let start = std::time::Instant::now();
    let response = next.run(request).await;
    let code = response
        .extensions()
        .get::<Code>()
        .copied()
        .unwrap_or(Code::Ok);
    crate::metrics::count_call(method, code, "http", start.elapsed());
    response
}

/// The RPC a route under `/api` calls (the savings replay is the inspector's own).
fn rpc_name(path: &str) -> &'static str {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    match segments.as_slice() {
        ["sessions"] => "ctxd.v1.ContextStore/ListSessions",
        ["sessions", _] => "ctxd.v1.ContextStore/GetSession",
        ["sessions", _, "log"] => "ctxd.v1.ContextStore/Log",
        ["sessions", _, "nodes"] => "ctxd.v1.ContextStore/GetNodes",
        ["sessions", _, "render"] => "ctxd.v1.ContextStore/Render",
        ["sessions", _, "summaries"] => "ctxd.v1.ContextStore/ListSummaries",
        ["sessions", _, "gateway-calls"] => "ctxd.v1.ContextStore/ListGatewayCalls",
        ["sessions", _, "events"] => "ctxd.v1.ContextStore/Watch",
        ["sessions", _, "savings"] => "inspector/Savings",
        _ => "inspector/unknown",
    }
}

/// A handler's answer: the response as JSON, or the RPC's status as an HTTP error.
type Answer = Result<Response, Failure>;

/// What each `/api/sessions/{id}…` handler takes: the app, the session id of the path, the
/// query string, and the request (its tenant, its headers).
struct OnSession {
    app: App,
    id: String,
    query: Option<String>,
    request: Request,
}

impl FromRequest<App> for OnSession {
    type Rejection = Response;

    async fn from_request(request: Request, app: &App) -> Result<Self, Response> {
        let (mut parts, body) = request.into_parts();
        let Path(id) = Path::<String>::from_request_parts(&mut parts, app)
            .await
            .map_err(IntoResponse::into_response)?;
        let query = parts.uri.query().map(str::to_owned);
        Ok(Self {
            app: app.clone(),
            id,
            query,
            request: Request::from_parts(parts, body),
        })
    }
}

impl OnSession {
    /// The query string, which may hold only the `known` parameters.
    fn query(&self, known: &[&str]) -> Result<Query, Failure> {
        Query::parse(self.query.as_deref(), known).map_err(bad)
    }
}

/// An error answer: an HTTP status and `{"error": {"code", "message"}}`, where `code` is the
/// gRPC code's proto name.
struct Failure {
    status: StatusCode,
    code: Code,
    message: String,
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        let name = screaming(&format!("{:?}", self.code));
        let body = json!({"error": {"code": name, "message": self.message}});
        let mut response = json_response(self.status, &body);
        // For the meter: the code a gRPC caller would have seen.
        response.extensions_mut().insert(self.code);
        response
    }
}

/// The answer of the service's `method` to `message`, called for `call`'s caller: the shape of
/// every handler that turns its query into one request (a macro, so a handler keeps moving
/// fields out of `call` into the message).
macro_rules! answer {
    ($call:ident, $method:ident, $message:expr) => {
        ok($call
            .app
            .service
            .$method(rpc(&$call.request, $message))
            .await)
    };
}

/// `message` as a `tonic::Request` acting for the tenant `authenticate` found.
fn rpc<T>(request: &Request, message: T) -> tonic::Request<T> {
    let tenant = request
        .extensions()
        .get::<Tenant>()
        .cloned()
        .expect("authenticate runs before every /api handler");
    let mut rpc = tonic::Request::new(message);
    rpc.extensions_mut().insert(tenant);
    rpc
}

fn ok<T: ToJson>(reply: Result<tonic::Response<T>, tonic::Status>) -> Answer {
    let reply = reply.map_err(|s| failure(&s))?;
    Ok(json_response(StatusCode::OK, &reply.into_inner().to_json()))
}

fn json_response(code: StatusCode, value: &Value) -> Response {
    let mut response = (code, Body::from(value.to_string())).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    // Session content is private to its tenant: no shared cache may keep it.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    response
}

fn error(status: StatusCode, code: Code, message: &str) -> Failure {
    Failure {
        status,
        code,
        message: message.to_owned(),
    }
}

/// A gRPC status as the HTTP status of the usual mapping (as gRPC-HTTP gateways use), with the
/// RPC's own message, which names the field at fault.
fn failure(status: &tonic::Status) -> Failure {
    let code = match status.code() {
        Code::Ok => StatusCode::OK,
        Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => {
            StatusCode::BAD_REQUEST
        }
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::Cancelled => StatusCode::REQUEST_TIMEOUT,
        Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        Code::Unknown | Code::Internal | Code::DataLoss => StatusCode::INTERNAL_SERVER_ERROR,
    };
    error(code, status.code(), status.message())
}

/// `InvalidArgument` → `INVALID_ARGUMENT`, the code's name in the proto.
fn screaming(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 4);
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_uppercase());
    }
    out
}

fn bad(message: String) -> Failure {
    error(StatusCode::BAD_REQUEST, Code::InvalidArgument, &message)
}

async fn list_sessions(State(app): State<App>, RawQuery(q): RawQuery, request: Request) -> Answer {
    let q = Query::parse_repeating(
        q.as_deref(),
        &["page_size", "page_token", "id_prefix"],
        &["metadata"],
    )
    .map_err(bad)?;
    let message = pb::ListSessionsRequest {
        page_size: q.u32("page_size").map_err(bad)?.unwrap_or(0),
        page_token: q.string("page_token"),
        id_prefix: q.string("id_prefix"),
        metadata: q.pairs("metadata").map_err(bad)?.into_iter().collect(),
    };
    ok(app.service.list_sessions(rpc(&request, message)).await)
}

async fn get_session(call: OnSession) -> Answer {
    call.query(&[])?;
    let message = pb::GetSessionRequest {
        session_id: call.id,
    };
    answer!(call, get_session, message)
}

async fn log(call: OnSession) -> Answer {
    let q = call.query(&["branch", "node_id", "limit", "page_token"])?;
    let message = pb::LogRequest {
        session_id: call.id,
        branch: q.string("branch"),
        node_id: q.string("node_id"),
        limit: q.u32("limit").map_err(bad)?.unwrap_or(0),
        page_token: q.string("page_token"),
    };
    answer!(call, log, message)
}

async fn get_nodes(call: OnSession) -> Answer {
    let q = call.query(&["ids"])?;
    let ids = q.string("ids");
    let message = pb::GetNodesRequest {
        session_id: call.id,
        node_ids: ids
            .split(',')
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect(),
    };
    answer!(call, get_nodes, message)
}

async fn render(call: OnSession) -> Answer {
    let q = call.query(query::RENDER_KEYS)?;
    let message = query::render_request(call.id, &q).map_err(bad)?;
    answer!(call, render, message)
}

/// Calls a savings replay covers when the query does not say, and at most.
const DEFAULT_SAVINGS_CALLS: u32 = 100;
const MAX_SAVINGS_CALLS: u32 = 1000;

async fn savings(call: OnSession) -> Answer {
    let mut known = query::RENDER_KEYS.to_vec();
    known.push("calls");
    let q = call.query(&known)?;
    let calls = match q.u32("calls").map_err(bad)? {
        None => DEFAULT_SAVINGS_CALLS,
        Some(n @ 1..=MAX_SAVINGS_CALLS) => n,
        Some(n) => {
            return Err(bad(format!(
                "query parameter calls: {n} is not between 1 and {MAX_SAVINGS_CALLS}"
            )));
        }
    };
    let message = query::render_request(call.id, &q).map_err(bad)?;
    let report = call
        .app
        .service
        .savings(rpc(&call.request, message), calls as usize)
        .await
        .map_err(|s| failure(&s))?;
    let figures = |f: &crate::economy::Figures| {
        json!({
            "sent_tokens": f.sent_tokens,
            "unpruned_tokens": f.unpruned_tokens,
            "sent_cost": f.sent_cost,
            "unpruned_cost": f.unpruned_cost,
        })
    };
    let s = &report.savings;
    // The gateway's figures as `ListGatewayCalls` words them, and their cache-weighted sum.
    let gateway = report.gateway.as_ref().map(|g| {
        let u = &g.usage;
        json!({
            "calls": g.calls,
            "client_tokens": g.client_tokens,
            "forwarded_tokens": g.forwarded_tokens,
            "input_tokens": u.input,
            "cache_read_tokens": u.cache_read,
            "cache_write_tokens": u.cache_write,
            "output_tokens": u.output,
            "weighted_input": u.input as f64
                + crate::economy::CACHE_READ * u.cache_read as f64
                + crate::economy::CACHE_WRITE * u.cache_write as f64,
        })
    });
    let body = json!({
        "head_id": report.head_id.map(|id| id.to_string()).unwrap_or_default(),
        "tokenizer": report.tokenizer,
        "calls_total": s.calls_total,
        "calls_replayed": s.calls_replayed,
        "replayed": figures(&s.replayed),
        "next": figures(&s.next),
        "gateway": gateway,
    });
    Ok(json_response(StatusCode::OK, &body))
}

async fn list_summaries(call: OnSession) -> Answer {
    let q = call.query(&["branch"])?;
    let message = pb::ListSummariesRequest {
        session_id: call.id,
        branch: q.string("branch"),
    };
    answer!(call, list_summaries, message)
}

async fn list_gateway_calls(call: OnSession) -> Answer {
    let q = call.query(&["page_size", "page_token"])?;
    let message = pb::ListGatewayCallsRequest {
        session_id: call.id,
        page_size: q.u32("page_size").map_err(bad)?.unwrap_or(0),
        page_token: q.string("page_token"),
    };
    answer!(call, list_gateway_calls, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_print_by_their_proto_names() {
        assert_eq!(screaming("InvalidArgument"), "INVALID_ARGUMENT");
        assert_eq!(screaming("NotFound"), "NOT_FOUND");
        assert_eq!(screaming("Internal"), "INTERNAL");
    }
}
