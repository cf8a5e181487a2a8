//! Serving: the ContextStore service, health checking and reflection on a bound listener, behind
//! API keys and TLS when configured.

use std::future::Future;

use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Server, ServerTlsConfig};

use crate::api::auth::{ApiKeys, AuthLayer};
use crate::api::{ContextStoreService, pb};
use crate::metrics::MeterLayer;
use crate::store::Store;
use crate::summarizer::Summarizer;

/// The largest request or response message: room for media parts and long tool output.
const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// Serves on `listener` until `shutdown` resolves, then finishes in-flight requests.
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
    /// API keys: every RPC but health checks then needs `authorization: Bearer <key>` and acts
    /// for the key's tenant. Without them every caller is `Tenant::local()`.
    pub api_keys: Option<ApiKeys>,
    /// TLS, mutual when it has a client CA (see [`crate::tls::server`]). Without it, plaintext.
    pub tls: Option<ServerTlsConfig>,
}

/// [`serve`], with every option.
pub async fn serve_with(
    listener: TcpListener,
    store: Store,
    options: Options,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), tonic::transport::Error> {
    let Options {
        summarizer,
        api_keys,
        tls,
    } = options;
    let service = ContextStoreService::new(store, summarizer);
    let service = pb::context_store_server::ContextStoreServer::new(service)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_serving::<pb::context_store_server::ContextStoreServer<ContextStoreService>>()
        .await;
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
    let mut builder = Server::builder();
    if let Some(tls) = tls {
        builder = builder.tls_config(tls)?;
    }
    builder
        // Metering outside authentication, so refused requests are counted too.
        .layer(MeterLayer)
        .layer(AuthLayer::new(api_keys))
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(service)
        // Without TCP_NODELAY a response written in pieces waits ~40 ms for a delayed ACK.
        .serve_with_incoming_shutdown(
            TcpIncoming::from(listener).with_nodelay(Some(true)),
            shutdown,
        )
        .await
}
