//! The web inspector (`ctxd serve --http ADDR`): a read-only JSON API under `/api/` and the
//! embedded pages that read it.
//!
//! Every `/api/` handler builds a `tonic::Request` carrying the caller's tenant (from the same
//! API keys and `authorization: Bearer` header as gRPC, `api::auth::http_tenant`) and calls the
//! `ContextStore` method of the server's own `ContextStoreService` in process; the response is
//! converted by `api::json::ToJson`, as the CLI's `--json` is. Parsing, tenant scoping, limits
//! and error messages are therefore the RPCs' own: this module only maps query strings to
//! requests and gRPC codes to HTTP statuses.

mod query;

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, RawQuery, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::serve::ListenerExt as _;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tonic::Code;

use crate::api::auth::{ApiKeys, http_tenant};
use crate::api::json::ToJson;
use crate::api::pb::context_store_server::ContextStore;
use crate::api::{ContextStoreService, pb};
use crate::domain::Tenant;
use query::Query;

/// What every handler shares: the service the gRPC server runs, and the keys it checks.
#[derive(Clone)]
struct App {
    service: ContextStoreService,
    keys: Option<Arc<ApiKeys>>,
}

/// Serves the inspector on `listener` until the task is dropped: it holds no state of its own,
/// so stopping it mid-request loses nothing.
pub async fn serve(
    listener: TcpListener,
    service: ContextStoreService,
    keys: Option<Arc<ApiKeys>>,
) -> std::io::Result<()> {
    // Without TCP_NODELAY a body written after its head waits ~40 ms for a delayed ACK.
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "inspector: TCP_NODELAY not set");
        }
    });
    axum::serve(listener, router(service, keys)).await
}

/// The inspector's routes: the pages, their assets, and `/api/`.
pub fn router(service: ContextStoreService, keys: Option<Arc<ApiKeys>>) -> Router {
    let app = App { service, keys };
    let api = Router::new()
        .route("/sessions", get(list_sessions))
        .route("/sessions/{id}", get(get_session))
        .route("/sessions/{id}/log", get(log))
        .route("/sessions/{id}/nodes", get(get_nodes))
        .route("/sessions/{id}/render", get(render))
        .route("/sessions/{id}/summaries", get(list_summaries))
        .fallback(|| async { error(StatusCode::NOT_FOUND, "NOT_FOUND", "no such API route") })
        .layer(middleware::from_fn_with_state(app.clone(), authenticate))
        .with_state(app);
    Router::new()
        .route("/", get(|| asset(INDEX_HTML, "text/html; charset=utf-8")))
        .route(
            "/app.js",
            get(|| asset(APP_JS, "text/javascript; charset=utf-8")),
        )
        .route(
            "/app.css",
            get(|| asset(APP_CSS, "text/css; charset=utf-8")),
        )
        .nest("/api", api)
        .fallback(|| async { error(StatusCode::NOT_FOUND, "NOT_FOUND", "no such page") })
}

// Embedded, so the inspector works offline and `cargo build` needs no front-end toolchain.
const INDEX_HTML: &str = include_str!("assets/index.html");
const APP_JS: &str = include_str!("assets/app.js");
const APP_CSS: &str = include_str!("assets/app.css");

/// The page content policy: scripts and styles only from this server and no inline script, so
/// content that slipped past escaping still could not run.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

async fn asset(body: &'static str, content_type: &'static str) -> Response {
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
        Err(status) => {
            let mut response = failure(&status).into_response();
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"ctxd\""),
            );
            response
        }
    }
}

/// A handler's answer: the response as JSON, or the RPC's status as an HTTP error.
type Answer = Result<Response, Failure>;

/// An error answer: an HTTP status and `{"error": {"code", "message"}}`.
struct Failure {
    status: StatusCode,
    body: Value,
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        json_response(self.status, &self.body)
    }
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

fn error(status: StatusCode, name: &str, message: &str) -> Failure {
    Failure {
        status,
        body: json!({"error": {"code": name, "message": message}}),
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
    let name = format!("{:?}", status.code());
    error(code, &screaming(&name), status.message())
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
    error(StatusCode::BAD_REQUEST, "INVALID_ARGUMENT", &message)
}

async fn list_sessions(State(app): State<App>, RawQuery(q): RawQuery, request: Request) -> Answer {
    let q = Query::parse(q.as_deref(), &["page_size", "page_token"]).map_err(bad)?;
    let message = pb::ListSessionsRequest {
        page_size: q.u32("page_size").map_err(bad)?.unwrap_or(0),
        page_token: q.string("page_token"),
    };
    ok(app.service.list_sessions(rpc(&request, message)).await)
}

async fn get_session(
    State(app): State<App>,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
    request: Request,
) -> Answer {
    Query::parse(q.as_deref(), &[]).map_err(bad)?;
    let message = pb::GetSessionRequest { session_id: id };
    ok(app.service.get_session(rpc(&request, message)).await)
}

async fn log(
    State(app): State<App>,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
    request: Request,
) -> Answer {
    let q =
        Query::parse(q.as_deref(), &["branch", "node_id", "limit", "page_token"]).map_err(bad)?;
    let message = pb::LogRequest {
        session_id: id,
        branch: q.string("branch"),
        node_id: q.string("node_id"),
        limit: q.u32("limit").map_err(bad)?.unwrap_or(0),
        page_token: q.string("page_token"),
    };
    ok(app.service.log(rpc(&request, message)).await)
}

async fn get_nodes(
    State(app): State<App>,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
    request: Request,
) -> Answer {
    let q = Query::parse(q.as_deref(), &["ids"]).map_err(bad)?;
    let ids = q.string("ids");
    let message = pb::GetNodesRequest {
        session_id: id,
        node_ids: ids
            .split(',')
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect(),
    };
    ok(app.service.get_nodes(rpc(&request, message)).await)
}

async fn render(
    State(app): State<App>,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
    request: Request,
) -> Answer {
    let q = Query::parse(q.as_deref(), query::RENDER_KEYS).map_err(bad)?;
    let message = query::render_request(id, &q).map_err(bad)?;
    ok(app.service.render(rpc(&request, message)).await)
}

async fn list_summaries(
    State(app): State<App>,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
    request: Request,
) -> Answer {
    let q = Query::parse(q.as_deref(), &["branch"]).map_err(bad)?;
    let message = pb::ListSummariesRequest {
        session_id: id,
        branch: q.string("branch"),
    };
    ok(app.service.list_summaries(rpc(&request, message)).await)
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
