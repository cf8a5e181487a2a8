//! Prometheus metrics: RPC counts and latencies (a hook on every server call), the recorder, and
//! a `/metrics` endpoint on its own listener.
//!
//! Without an installed recorder (tests, embedders) every metric call is a no-op.

use std::future::Future;
use std::time::{Duration, Instant};

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Installs the process-wide Prometheus recorder.
pub fn install() -> anyhow::Result<PrometheusHandle> {
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(
            metrics_exporter_prometheus::Matcher::Suffix("_seconds".to_owned()),
            &[
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
            ],
        )?
        .install_recorder()?;
    describe();
    Ok(handle)
}

fn describe() {
    use metrics::{describe_counter, describe_histogram};
    describe_counter!(
        "ctxd_rpc_requests_total",
        "RPCs by method and gRPC status code; the inspector's HTTP calls carry via=\"http\""
    );
    describe_histogram!(
        "ctxd_rpc_duration_seconds",
        "RPC latency until the response head, by method"
    );
    describe_counter!("ctxd_appended_nodes_total", "nodes appended");
    describe_counter!(
        "ctxd_renders_total",
        "renders (Render and ContextStats), by tokenizer"
    );
    describe_counter!(
        "ctxd_paths_from_memory_total",
        "branch paths a render loaded from memory alone, reading nothing from the database"
    );
    describe_counter!(
        "ctxd_rendered_tokens_total",
        "tokens rendered, by tokenizer"
    );
    describe_counter!(
        "ctxd_summaries_total",
        "summary commits by outcome: applied, empty, no_gain, stale, failed, cancelled"
    );
    describe_counter!(
        "ctxd_sqlite_busy_total",
        "requests that found the database busy past its timeout"
    );
    describe_counter!(
        "ctxd_sqlite_full_total",
        "writes refused because the database reached --max-db-bytes or its disk is full"
    );
    describe_counter!("ctxd_imported_sessions_total", "sessions imported");
    describe_counter!(
        "ctxd_deleted_sessions_total",
        "sessions deleted, by who: request or retention"
    );
    describe_counter!(
        "ctxd_deleted_nodes_total",
        "nodes removed with deleted sessions"
    );
    describe_counter!(
        "ctxd_reclaimed_blob_bytes_total",
        "bytes of content blobs no session referred to any more, removed"
    );
    describe_counter!(
        "ctxd_retention_batches_total",
        "batches the retention policy ran (--retain-idle-days)"
    );
    describe_counter!(
        "ctxd_commit_retries_total",
        "group-commit transactions rolled back and tried again (a lock cycle broken, a key taken first)"
    );
    metrics::describe_gauge!("ctxd_sessions", "live sessions, as last counted");
    metrics::describe_gauge!(
        "ctxd_database_bytes",
        "the database's size, as last measured"
    );
    metrics::describe_gauge!(
        "ctxd_database_free_bytes",
        "free pages of deleted rows that later writes reuse (SQLite), as last measured"
    );
}

/// Serves the metrics text on `listener` (any path) until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    handle: PrometheusHandle,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    loop {
        let (mut socket, _) = tokio::select! {
            _ = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!(error = %e, "metrics listener");
                    continue;
                }
            },
        };
        let body = handle.render();
        tokio::spawn(async move {
            // A scrape is one small GET: read its head, answer, close.
            let mut head = [0u8; 4096];
            let _ = socket.read(&mut head).await;
            let response = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = socket.write_all(response.as_bytes()).await;
            let _ = socket.shutdown().await;
        });
    }
}

/// The hook (under `crate::hook::Layer`) counting and timing every RPC by method and status.
#[derive(Debug, Clone, Copy, Default)]
pub struct Meter;

impl crate::hook::Hook for Meter {
    /// The method and when the call started.
    type Seen = (String, Instant);

    fn request<B>(&self, request: &http::Request<B>) -> Self::Seen {
        let method = request.uri().path().trim_start_matches('/').to_owned();
        (method, Instant::now())
    }

    fn response<R, E>((method, start): Self::Seen, response: &mut Result<http::Response<R>, E>) {
        // Errors come trailers-only, with the status in the head; a success sends it in the
        // trailers, after the head.
        let code = match response {
            Ok(r) => r
                .headers()
                .get("grpc-status")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<i32>().ok())
                .map_or("OK", |c| tonic::Code::from_i32(c).description_name()),
            Err(_) => "transport_error",
        };
        metrics::counter!("ctxd_rpc_requests_total", "method" => method.clone(), "code" => code)
            .increment(1);
        metrics::histogram!("ctxd_rpc_duration_seconds", "method" => method)
            .record(start.elapsed().as_secs_f64());
    }
}

trait CodeName {
    fn description_name(self) -> &'static str;
}

impl CodeName for tonic::Code {
    /// The canonical upper-case name, as gRPC documents it.
    fn description_name(self) -> &'static str {
        use tonic::Code::*;
        match self {
            Ok => "OK",
            Cancelled => "CANCELLED",
            Unknown => "UNKNOWN",
            InvalidArgument => "INVALID_ARGUMENT",
            DeadlineExceeded => "DEADLINE_EXCEEDED",
            NotFound => "NOT_FOUND",
            AlreadyExists => "ALREADY_EXISTS",
            PermissionDenied => "PERMISSION_DENIED",
            ResourceExhausted => "RESOURCE_EXHAUSTED",
            FailedPrecondition => "FAILED_PRECONDITION",
            Aborted => "ABORTED",
            OutOfRange => "OUT_OF_RANGE",
            Unimplemented => "UNIMPLEMENTED",
            Internal => "INTERNAL",
            Unavailable => "UNAVAILABLE",
            DataLoss => "DATA_LOSS",
            Unauthenticated => "UNAUTHENTICATED",
        }
    }
}

/// Counts and times a call that came by another front door than gRPC (`via`, e.g. the
/// inspector's `http`) in the RPC metrics, under the RPC it called.
pub fn count_call(method: &'static str, code: tonic::Code, via: &'static str, elapsed: Duration) {
    metrics::counter!(
        "ctxd_rpc_requests_total",
        "method" => method,
        "code" => code.description_name(),
        "via" => via
    )
    .increment(1);
    metrics::histogram!("ctxd_rpc_duration_seconds", "method" => method, "via" => via)
        .record(elapsed.as_secs_f64());
}
