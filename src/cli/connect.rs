//! Reaching the server from the command line: where it is (`Conn`: URL, API key, TLS files),
//! connecting, and turning a failed call into one line naming the RPC, the status code and the
//! server's message.

use std::time::Duration;

use clap::Args;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

use super::client::{Failure, Result};
use crate::proto::pb::context_store_client::ContextStoreClient;

pub(super) type Client = ContextStoreClient<InterceptedService<Channel, Credentials>>;

/// Room for large renders and logs, as on the server.
const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// What every client command takes: where the server is and how to print.
#[derive(Debug, Args)]
pub struct Conn {
    /// The ctxd server.
    #[arg(long, env = "CTXD_SERVER", default_value = "http://127.0.0.1:50051")]
    pub(super) server: String,
    /// The API key, sent as `authorization: Bearer <key>`; prefer the environment variable,
    /// which stays out of process lists.
    #[arg(long, env = "CTXD_API_KEY", hide_env_values = true, value_name = "KEY")]
    api_key: Option<String>,
    /// The CA certificate (PEM) to trust for an `https://` server, instead of the system's roots.
    #[arg(long, env = "CTXD_TLS_CA", value_name = "FILE")]
    tls_ca: Option<std::path::PathBuf>,
    /// A client certificate (PEM), for a server that requires one (mutual TLS).
    #[arg(
        long,
        env = "CTXD_CLIENT_CERT",
        value_name = "FILE",
        requires = "tls_key"
    )]
    tls_cert: Option<std::path::PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(
        long,
        env = "CTXD_CLIENT_KEY",
        value_name = "FILE",
        requires = "tls_cert"
    )]
    tls_key: Option<std::path::PathBuf>,
    /// Print the response as JSON, for scripts.
    #[arg(long)]
    pub(super) json: bool,
}

/// Adds the API key, if any, to every call.
#[derive(Clone)]
pub struct Credentials(Option<MetadataValue<Ascii>>);

impl tonic::service::Interceptor for Credentials {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> std::result::Result<tonic::Request<()>, Status> {
        if let Some(value) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        Ok(request)
    }
}

pub(super) async fn connect(conn: &Conn) -> Result<Client> {
    let url = if conn.server.contains("://") {
        conn.server.clone()
    } else {
        format!("http://{}", conn.server)
    };
    let mut endpoint = Endpoint::from_shared(url.clone())
        .map_err(|e| Failure(format!("invalid server URL {:?}: {e}", conn.server)))?
        .connect_timeout(Duration::from_secs(10));
    let identity = conn.tls_cert.as_deref().zip(conn.tls_key.as_deref());
    if url.starts_with("https://") {
        let tls = crate::tls::client(conn.tls_ca.as_deref(), identity)
            .map_err(|e| Failure(e.to_string()))?;
        endpoint = endpoint
            .tls_config(tls)
            .map_err(|e| Failure(format!("TLS for {url}: {}", chain(&e))))?;
    } else if conn.tls_ca.is_some() || identity.is_some() {
        return Err(Failure(format!(
            "--tls-ca and --tls-cert need an https:// server URL, not {url}"
        )));
    }
    let credentials = match &conn.api_key {
        Some(key) => {
            let mut value: MetadataValue<Ascii> = format!("Bearer {key}")
                .parse()
                .map_err(|_| Failure("the API key has characters a header cannot carry".into()))?;
            value.set_sensitive(true);
            Credentials(Some(value))
        }
        None => Credentials(None),
    };
    let channel = endpoint.connect().await.map_err(|e| {
        Failure(format!(
            "cannot connect to the server at {url}: {}",
            chain(&e)
        ))
    })?;
    Ok(ContextStoreClient::with_interceptor(channel, credentials)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES))
}

/// Awaits one RPC; a failure names it, the status code and the server's message.
pub(super) async fn call<T>(
    rpc: &str,
    future: impl Future<Output = std::result::Result<tonic::Response<T>, Status>>,
) -> Result<T> {
    future
        .await
        .map(tonic::Response::into_inner)
        .map_err(|s| failure(rpc, &s))
}

/// A failed call (or a stream that failed midway) as the one line a command prints.
pub(super) fn failure(rpc: &str, s: &Status) -> Failure {
    let message = s.message().split_whitespace().collect::<Vec<_>>().join(" ");
    let mut line = format!("{rpc} failed: {}", code_name(s.code()));
    if !message.is_empty() {
        line.push_str(": ");
        line.push_str(&message);
    }
    Failure(line)
}

/// An error and its sources, `a: b: c`, each said once.
fn chain(error: &dyn std::error::Error) -> String {
    let mut parts: Vec<String> = vec![error.to_string()];
    let mut source = error.source();
    while let Some(e) = source {
        let text = e.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        source = e.source();
    }
    parts.join(": ")
}

fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}
