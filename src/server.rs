//! Serving: the ContextStore service, health checking and reflection on a bound listener, behind
//! API keys and TLS when configured.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tonic::server::NamedService;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Server, ServerTlsConfig};
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use crate::api::auth::AuthLayer;
use crate::api::{ContextStoreService, Framing, Watchers};
use crate::auth::ApiKeys;
use crate::hook;
use crate::inspector::Reply;
use crate::limits::{Admission, Limits};
use crate::metrics::Meter;
use crate::proto::pb;
use crate::proto::pb::context_store_server::ContextStore;
use crate::store::Store;
use crate::summarizer::Summarizer;
use crate::workflow::{SavingsReport, Workflows};

/// The model gateway as `ctxd serve`'s flags set it; the assembly builds the door from it.
pub struct GatewayFlags {
    /// Base URLs without a version, by upstream.
    pub anthropic_upstream: String,
    pub openai_upstream: String,
    pub gemini_upstream: String,
    /// `stepped` or `passthrough` (anything else: stepped).
    pub policy: String,
    /// Context windows the operator set, before ctxd's table.
    pub windows: Vec<crate::provider::models::Window>,
    pub reasoning: crate::workflow::render::Reasoning,
}

/// The gateway door on `listener`, as `flags` set it.
pub fn gateway(listener: TcpListener, flags: GatewayFlags) -> crate::gateway::Gateway {
    use crate::gateway::{Gateway, GatewayPolicy};
    let mut gateway = Gateway::new(listener, flags.anthropic_upstream, flags.openai_upstream);
    gateway.gemini_upstream = flags.gemini_upstream;
    gateway.policy = GatewayPolicy::parse(&flags.policy).unwrap_or_default();
    gateway.windows = flags.windows;
    gateway.reasoning = flags.reasoning;
    gateway
}

/// Serves on `listener` until `shutdown` resolves, then finishes in-flight requests (see
/// [`Shutdown`]).
///
/// The caller binds the listener (port 0 in tests) and picks the shutdown signal.
pub async fn serve(
    listener: TcpListener,
    store: Store,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), tonic::transport::Error> {
    serve_with_summarizer(listener, store, None, shutdown).await
}

/// [`serve`], with a summarizer for the `Compact` RPC.
pub async fn serve_with_summarizer(
    listener: TcpListener,
    store: Store,
    summarizer: Option<Summarizer>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), tonic::transport::Error> {
    let options = Options {
        summarizer,
        ..Options::default()
    };
    serve_with(listener, store, options, shutdown).await
}

/// How the server runs, beyond its listener and store: `ctxd serve`'s flags.
#[derive(Default)]
pub struct Options {
    /// The summarizer for the `Compact` RPC; without one, `Compact` answers FAILED_PRECONDITION.
    pub summarizer: Option<Summarizer>,
    /// Request, part and response sizes, and calls served at once.
    pub limits: Limits,
    /// What happens between the shutdown signal and `serve` returning.
    pub shutdown: Shutdown,
    /// API keys: every RPC but health checks then needs `authorization: Bearer <key>` and acts
    /// for the key's tenant. Without them every caller is `Tenant::local()`.
    pub api_keys: Option<ApiKeys>,
    /// TLS, mutual when it has a client CA (see [`crate::tls::server`]). Without it, plaintext.
    pub tls: Option<ServerTlsConfig>,
    /// The web inspector's listener (`--http`): its read-only JSON API calls this server's
    /// service in process, behind the same keys, the same concurrency limit and the same
    /// metrics. Stops when `serve_with` returns.
    pub http: Option<TcpListener>,
    /// HTTPS for `http` (see [`crate::tls::http_server`]); without it, plain HTTP.
    pub http_tls: Option<std::sync::Arc<rustls::ServerConfig>>,
    /// Deletes idle sessions in the background (`--retain-idle-days`, and the tenants' own
    /// `retain=` in the keys file, which run it even when this is `None`); stops with the
    /// server.
    pub retention: Option<crate::workflow::retention::Retention>,
    /// The model gateway (`--gateway`): records and forwards provider API calls, over this
    /// server's store and behind the same keys (sent as `x-ctxd-api-key`); stops when
    /// `serve_with` returns.
    pub gateway: Option<crate::gateway::Gateway>,
    /// The model table (`--models`): windows, cache prices and reasoning rules by model, for
    /// the gateway, `Render` and `ContextStats`. Default: ctxd's own.
    pub models: crate::provider::models::ModelTable,
}

/// A graceful shutdown: at the signal health turns NOT_SERVING and new calls are refused with
/// UNAVAILABLE while calls in flight finish; then the listener closes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shutdown {
    /// The least time health keeps answering NOT_SERVING before the listener closes, for load
    /// balancers to notice; zero closes it as soon as no call is in flight.
    pub drain: Duration,
    /// The most time calls in flight get after the signal; past it they are abandoned and
    /// `serve` returns. An append is acknowledged only after it commits, so an abandoned one
    /// is either wholly stored or absent, and never acknowledged unless stored.
    pub grace: Duration,
}

impl Default for Shutdown {
    fn default() -> Self {
        Self {
            drain: Duration::ZERO,
            grace: Duration::from_secs(30),
        }
    }
}

type ContextStoreServer = pb::context_store_server::ContextStoreServer<ContextStoreService>;

/// [`serve`], with every option.
pub async fn serve_with(
    listener: TcpListener,
    store: Store,
    options: Options,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), tonic::transport::Error> {
    let Options {
        summarizer,
        limits,
        shutdown: timing,
        api_keys,
        tls,
        http,
        http_tls,
        retention,
        gateway,
        models,
    } = options;
    // A tenant's `retain=` in the keys file runs the policy even without a default limit.
    let _retention = retention
        .unwrap_or_default()
        .with_keys(api_keys.as_ref())
        .map(|policy| {
            AbortOnDrop(tokio::spawn(crate::workflow::retention::run(
                store.clone(),
                policy,
            )))
        });
    // The state every door shares, built once.
    let mut workflows = Workflows::new(store, summarizer);
    workflows.models = Arc::new(models);
    let service = ContextStoreService::new(workflows.clone()).with_limits(limits);
    let watchers = service.watchers();
    let api_keys = api_keys.map(Arc::new);
    let admission = Admission::new(&limits);
    // Aborted when this function returns (the guard drops), with the gRPC server.
    let _inspector = http.map(|listener| {
        let served = crate::inspector::serve(
            listener,
            crate::inspector::App::new(
                Arc::new(service.clone()),
                api_keys.clone(),
                admission.clone(),
            ),
            http_tls,
        );
        AbortOnDrop(tokio::spawn(async move {
            if let Err(e) = served.await {
                tracing::error!(error = %e, "the inspector's HTTP server failed");
            }
        }))
    });
    let _gateway = gateway.map(|gateway| {
        let served = crate::gateway::serve(
            gateway,
            workflows.clone(),
            api_keys.clone(),
            admission.clone(),
            limits.max_part_bytes,
        );
        AbortOnDrop(tokio::spawn(async move {
            if let Err(e) = served.await {
                tracing::error!(error = %e, "the model gateway failed");
            }
        }))
    });
    // The request limit is enforced (as RESOURCE_EXHAUSTED) by `Admission`; replies are
    // measured before they are sent. tonic's own checks stay as a backstop.
    let service = ContextStoreServer::new(service)
        .max_decoding_message_size(limits.max_request_bytes)
        .max_encoding_message_size(limits.max_response_bytes);
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<ContextStoreServer>().await;
    // Both reflection versions: grpcurl speaks v1, Python's grpcio-reflection only v1alpha.
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection_v1 = reflection()
        .build_v1()
        .expect("the compiled-in descriptors are valid");
    let reflection_v1alpha = reflection()
        .build_v1alpha()
        .expect("the compiled-in descriptors are valid");
    let (began, grace_starts) = oneshot::channel();
    let signal = drain(
        shutdown,
        health,
        admission.clone(),
        watchers,
        timing.drain,
        began,
    );
    // Health is not admitted through the limits: an orchestrator must always see the truth.
    let mut builder = Server::builder();
    if let Some(tls) = tls {
        builder = builder.tls_config(tls)?;
    }
    let server = builder
        // A client resets a call whose deadline passes before the server took it up; past h2's
        // default of 20 such at once the whole connection is closed, failing its other calls,
        // so a burst of short deadlines would hurt callers that have none. Bounded by the
        // concurrency limit instead, which still caps the memory held for them.
        .http2_max_pending_accept_reset_streams(Some(limits.max_concurrent_requests.max(20)))
        // Metering outside authentication, so refused requests are counted too.
        .layer(hook::Layer(Meter))
        .layer(AuthLayer::shared(api_keys))
        // Inside the meter, so it counts the code the caller gets.
        .layer(hook::Layer(Framing))
        .add_service(health_service)
        .add_service(admission.wrap(reflection_v1))
        .add_service(admission.wrap(reflection_v1alpha))
        .add_service(admission.wrap(service))
        // Without TCP_NODELAY a response written in pieces waits ~40 ms for a delayed ACK.
        .serve_with_incoming_shutdown(TcpIncoming::from(listener).with_nodelay(Some(true)), signal);
    let mut server = Box::pin(server);
    let grace_over = async {
        match grace_starts.await {
            Ok(()) => tokio::time::sleep(timing.grace).await,
            // The server ended before any signal.
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        served = &mut server => return served,
        () = grace_over => {}
    }
    // Dropping the server stops it from accepting and waiting; the connections still open
    // end with the runtime.
    drop(server);
    tracing::warn!(
        abandoned = admission.in_flight(),
        grace = ?timing.grace,
        "calls still in flight after the shutdown grace period are abandoned"
    );
    Ok(())
}

/// The shutdown signal as tonic sees it: resolves (and tonic stops accepting) once `shutdown`
/// has resolved, health said NOT_SERVING for `drain`, and no call is in flight.
async fn drain(
    shutdown: impl Future<Output = ()>,
    mut health: HealthReporter,
    admission: Admission,
    watchers: Watchers,
    drain: Duration,
    began: oneshot::Sender<()>,
) {
    shutdown.await;
    let _ = began.send(());
    admission.drain();
    // Watch streams never finish by themselves; each ends now with the cursor to resume from.
    watchers.stop();
    for service in SERVICES {
        health
            .set_service_status(service, ServingStatus::NotServing)
            .await;
    }
    tracing::info!(
        in_flight = admission.in_flight(),
        "shutting down: health says NOT_SERVING, new calls are refused"
    );
    tokio::join!(tokio::time::sleep(drain), admission.idle());
    // Ends health Watch streams (they end when their service is removed), which would
    // otherwise keep their connections, and so the server, open until the grace period ends.
    for service in SERVICES {
        health.clear_service_status(service).await;
    }
}

/// The names health reports on: the server as a whole, and the ContextStore service.
const SERVICES: [&str; 2] = ["", <ContextStoreServer as NamedService>::NAME];

/// A task that ends when this is dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The inspector reads through the gRPC service in process: its parsing, scoping and limits.
/// Each read is the RPC of the same name; Watch's stream is boxed, and the savings replay is the
/// service's own (both written out in the braces).
macro_rules! inspector_source {
    ($($rpc:ident($request:ty) -> $response:ty;)* {$($rest:tt)*}) => {
        #[async_trait::async_trait]
        impl crate::inspector::Source for ContextStoreService {
            $(
                async fn $rpc(&self, r: tonic::Request<$request>) -> Reply<$response> {
                    ContextStore::$rpc(self, r).await
                }
            )*
            $($rest)*
        }
    };
}

inspector_source! {
    list_sessions(pb::ListSessionsRequest) -> pb::ListSessionsResponse;
    get_session(pb::GetSessionRequest) -> pb::Session;
    log(pb::LogRequest) -> pb::LogResponse;
    get_nodes(pb::GetNodesRequest) -> pb::GetNodesResponse;
    render(pb::RenderRequest) -> pb::RenderResponse;
    list_summaries(pb::ListSummariesRequest) -> pb::ListSummariesResponse;
    list_gateway_calls(pb::ListGatewayCallsRequest) -> pb::ListGatewayCallsResponse;
    {
        async fn watch(
            &self,
            r: tonic::Request<pb::WatchRequest>,
        ) -> Result<crate::inspector::Events, tonic::Status> {
            let stream = ContextStore::watch(self, r).await?.into_inner();
            Ok(Box::pin(stream))
        }
        async fn savings(
            &self,
            r: tonic::Request<pb::RenderRequest>,
            calls: usize,
        ) -> Result<SavingsReport, tonic::Status> {
            ContextStoreService::savings(self, r, calls).await
        }
    }
}
