//! The options of `ctxd serve`, in groups (gateway, storage, summarizer, limits, security), and
//! what each group becomes for the server; security is checked before anything is opened.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use tonic::transport::ServerTlsConfig;

use crate::auth::ApiKeys;
use crate::limits::Limits;
use crate::provider::codec::Upstream;
use crate::provider::models::Window;
use crate::server::Shutdown;
use crate::summarizer::{Config as SummarizerConfig, Summarizer};

/// The model gateway: agents that speak a provider's HTTP API point their base URL here.
#[derive(Debug, clap::Args)]
pub(super) struct GatewayArgs {
    /// Serve the model gateway on this address too (Anthropic Messages, OpenAI chat
    /// completions and Responses, Gemini), recorded as sessions and forwarded with ctxd's
    /// render; its bound address is printed as `ctxd gateway on ADDR`.
    #[arg(long, env = "CTXD_GATEWAY", value_name = "ADDR")]
    pub(super) gateway: Option<SocketAddr>,
    /// Where the gateway forwards Anthropic calls.
    #[arg(
        long,
        env = "CTXD_ANTHROPIC_UPSTREAM",
        value_name = "URL",
        default_value = Upstream::Anthropic.default_url()
    )]
    pub(super) anthropic_upstream: String,
    /// Where the gateway forwards OpenAI calls.
    #[arg(
        long,
        env = "CTXD_OPENAI_UPSTREAM",
        value_name = "URL",
        default_value = Upstream::OpenAi.default_url()
    )]
    pub(super) openai_upstream: String,
    /// Where the gateway forwards Gemini calls.
    #[arg(
        long,
        env = "CTXD_GEMINI_UPSTREAM",
        value_name = "URL",
        default_value = Upstream::Google.default_url()
    )]
    pub(super) gemini_upstream: String,
    /// What the gateway forwards: `stepped` (ctxd's render of the branch) or `passthrough`
    /// (the client's request as it came, still recorded); a request's `x-ctxd-policy` header
    /// overrides it.
    #[arg(long, env = "CTXD_GATEWAY_POLICY", default_value = "stepped", value_parser = ["stepped", "passthrough"])]
    pub(super) gateway_policy: String,
    /// The context window of a model, in tokens, in place of ctxd's table (`MODEL=TOKENS`;
    /// `MODEL` may end in `*` to name every model it starts; repeatable). A model neither names
    /// is budgeted by the table, and one the table does not know is never cut by budget.
    #[arg(long = "context-window", value_name = "MODEL=TOKENS", value_parser = Window::parse)]
    pub(super) context_windows: Vec<Window>,
    /// For a model that binds its thinking blocks to what precedes them (Anthropic's current
    /// models): `keep` every thinking block valid, each step said as the provider's own edit
    /// (`clear_tool_uses_20250919`), or `drop` the thinking a step invalidates, to save more.
    #[arg(long, env = "CTXD_GATEWAY_REASONING", default_value = "keep", value_parser = ["keep", "drop"])]
    pub(super) gateway_reasoning: String,
    /// A JSON file of model entries over ctxd's model table: `[{"model": "claude-opus-5-5",
    /// "window": 200000, "cache_read": 0.05, "cache_write": 1.25, "cache_write_long": 2.0,
    /// "ttl_minutes": 5, "long_ttl_minutes": 60, "binds_thinking": true}]`, every field but
    /// `model` optional (a model name prefix: dated ids match). Prices the gateway, `Render`
    /// and `ContextStats` for the models it names.
    #[arg(long, env = "CTXD_MODELS", value_name = "FILE")]
    pub(super) models: Option<PathBuf>,
}

impl GatewayArgs {
    /// The model table: ctxd's, with the `--models` file's entries over it.
    pub(super) fn models(&self) -> anyhow::Result<crate::provider::models::ModelTable> {
        let table = crate::provider::models::ModelTable::default();
        let Some(path) = &self.models else {
            return Ok(table);
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("--models {}: {e}", path.display()))?;
        table
            .with_file(&text)
            .map_err(|e| anyhow::anyhow!("--models {}: {e}", path.display()))
    }
}

/// How the database is used when another process holds it or the disk fills up.
#[derive(Debug, clap::Args)]
pub(super) struct StorageArgs {
    /// Milliseconds a write waits (retrying) for a lock another process holds before it is
    /// refused as UNAVAILABLE; on PostgreSQL, also how long a call waits for a connection.
    #[arg(long, env = "CTXD_BUSY_TIMEOUT_MS", default_value_t = 10_000)]
    busy_timeout_ms: u64,
    /// The most bytes the database may take; past it writes are refused as RESOURCE_EXHAUSTED
    /// while reads keep working.
    #[arg(long, env = "CTXD_MAX_DB_BYTES", value_parser = clap::value_parser!(u64).range(1..))]
    max_db_bytes: Option<u64>,
    /// Connections to PostgreSQL for reads and writes (the group committer keeps one more per
    /// commit lane, 8).
    #[arg(long, env = "CTXD_PG_POOL_SIZE", default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..))]
    pg_pool_size: u32,
    /// On a PostgreSQL database with the `citus` extension, do not distribute ctxd's tables
    /// at start: the operator distributes them (docs/scaling.md). By default ctxd distributes
    /// by session, co-located, every table not yet distributed, those of later migrations
    /// included.
    #[arg(long, env = "CTXD_NO_DISTRIBUTE")]
    no_distribute: bool,
    /// On Citus, send every append through the coordinator, even those the committer would
    /// send straight to the worker that holds the session's shard (for replicas that cannot
    /// reach the workers at the addresses the coordinator knows them by).
    #[arg(long, env = "CTXD_PG_COORDINATOR_ONLY")]
    pg_coordinator_only: bool,
    /// Deletes sessions no branch of which moved for this many days, in the background (at
    /// start, then hourly), at most --retention-batch at a time; each batch is logged and
    /// counted in `ctxd_retention_batches_total`. Off by default. A tenant's `retain=DAYS` (or
    /// `retain=never`) in the keys file takes the place of this for its sessions.
    #[arg(long, env = "CTXD_RETAIN_IDLE_DAYS", value_parser = clap::value_parser!(u32).range(1..))]
    retain_idle_days: Option<u32>,
    /// Sessions the retention policy deletes per batch.
    #[arg(long, env = "CTXD_RETENTION_BATCH", default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
    retention_batch: u32,
}

impl StorageArgs {
    /// The default policy; the server adds the tenants' own from the keys file.
    pub(super) fn retention(&self) -> Option<crate::workflow::retention::Retention> {
        let policy = match self.retain_idle_days {
            Some(days) => crate::workflow::retention::Retention::idle_days(days),
            None => crate::workflow::retention::Retention::default(),
        };
        Some(crate::workflow::retention::Retention {
            batch: self.retention_batch,
            ..policy
        })
    }

    pub(super) fn config(&self) -> crate::store::Config {
        crate::store::Config {
            busy_timeout: std::time::Duration::from_millis(self.busy_timeout_ms),
            pg_pool_size: self.pg_pool_size,
            max_db_bytes: self.max_db_bytes,
            distribute: !self.no_distribute,
            pg_direct_to_workers: !self.pg_coordinator_only,
            ..crate::store::Config::default()
        }
    }
}

/// The server's own summarizer, for the `Compact` RPC.
#[derive(Debug, clap::Args)]
pub(super) struct SummarizerArgs {
    /// An OpenAI-compatible chat-completions URL (or its base, e.g. `https://host/v1`).
    #[arg(long, env = "CTXD_SUMMARIZER_URL", requires = "summarizer_model")]
    summarizer_url: Option<String>,
    /// The model to ask for summaries.
    #[arg(long, env = "CTXD_SUMMARIZER_MODEL")]
    summarizer_model: Option<String>,
    /// Sent as a bearer token; from the environment only, so it stays out of process lists.
    #[arg(skip = std::env::var("CTXD_SUMMARIZER_API_KEY").ok())]
    summarizer_api_key: Option<String>,
    /// The summarizer model's context window, in tokens: larger inputs go in chunks.
    #[arg(long, env = "CTXD_SUMMARIZER_WINDOW", default_value_t = 128_000)]
    summarizer_window: u32,
    /// Tokens a summary may take.
    #[arg(long, env = "CTXD_SUMMARIZER_MAX_OUTPUT", default_value_t = 4096)]
    summarizer_max_output: u32,
    /// Model calls one compaction may make.
    #[arg(long, env = "CTXD_SUMMARIZER_MAX_CALLS", default_value_t = 8)]
    summarizer_max_calls: usize,
    /// Seconds one compaction may take, all calls included.
    #[arg(long, env = "CTXD_SUMMARIZER_TIMEOUT_SECS", default_value_t = 300)]
    summarizer_timeout_secs: u64,
}

impl SummarizerArgs {
    pub(super) fn build(self) -> anyhow::Result<Option<Summarizer>> {
        let (Some(url), Some(model)) = (self.summarizer_url, self.summarizer_model) else {
            return Ok(None);
        };
        Ok(Some(Summarizer::new(SummarizerConfig {
            url,
            model,
            api_key: self.summarizer_api_key,
            window_tokens: self.summarizer_window,
            max_output_tokens: self.summarizer_max_output,
            max_calls: self.summarizer_max_calls,
            timeout: Duration::from_secs(self.summarizer_timeout_secs),
        })?))
    }
}

/// Sizes, calls at once, and how a shutdown goes.
#[derive(Debug, clap::Args)]
pub(super) struct LimitsArgs {
    /// The largest request message in bytes (for `ImportSession`, each chunk); over it the call
    /// fails with RESOURCE_EXHAUSTED.
    #[arg(
        long,
        env = "CTXD_MAX_REQUEST_BYTES",
        default_value_t = Limits::DEFAULT_MAX_REQUEST_BYTES as u64,
        value_parser = clap::value_parser!(u64).range(1024..=u64::from(u32::MAX)),
    )]
    max_request_bytes: u64,
    /// The largest single part of a node in bytes (a text or media part, tool call arguments, a
    /// function's input or output); over it the append fails with INVALID_ARGUMENT.
    #[arg(
        long,
        env = "CTXD_MAX_PART_BYTES",
        default_value_t = Limits::DEFAULT_MAX_PART_BYTES as u64,
        value_parser = clap::value_parser!(u64).range(1..=u64::from(u32::MAX)),
    )]
    max_part_bytes: u64,
    /// The largest response message in bytes; a bigger one is refused with RESOURCE_EXHAUSTED
    /// before anything is sent.
    #[arg(
        long,
        env = "CTXD_MAX_RESPONSE_BYTES",
        default_value_t = Limits::DEFAULT_MAX_RESPONSE_BYTES as u64,
        value_parser = clap::value_parser!(u64).range(1024..=u64::from(u32::MAX)),
    )]
    max_response_bytes: u64,
    /// Calls served at once; past it a call is refused at once with RESOURCE_EXHAUSTED.
    #[arg(
        long,
        env = "CTXD_MAX_CONCURRENT_REQUESTS",
        default_value_t = Limits::DEFAULT_MAX_CONCURRENT_REQUESTS as u64,
        value_parser = clap::value_parser!(u64).range(1..=1_000_000),
    )]
    max_concurrent_requests: u64,
    /// After SIGTERM or SIGINT: the least time health answers NOT_SERVING before the listener
    /// closes, for load balancers to notice.
    #[arg(long, env = "CTXD_SHUTDOWN_DRAIN_MS", default_value_t = 0)]
    shutdown_drain_ms: u64,
    /// After SIGTERM or SIGINT: the most time calls in flight get to finish; then they are
    /// abandoned and the process exits.
    #[arg(long, env = "CTXD_SHUTDOWN_GRACE_SECS", default_value_t = 30)]
    shutdown_grace_secs: u64,
    /// How long a Watch stream may stay full (its client reads nothing) before it is ended
    /// with RESOURCE_EXHAUSTED and the cursor to resume from.
    #[arg(long, env = "CTXD_WATCH_FALL_BEHIND_SECS", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    watch_fall_behind_secs: u64,
}

impl LimitsArgs {
    pub(super) fn build(&self) -> (Limits, Shutdown) {
        // The ranges above keep every value within usize.
        let size = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
        let limits = Limits {
            max_request_bytes: size(self.max_request_bytes),
            max_part_bytes: size(self.max_part_bytes),
            max_response_bytes: size(self.max_response_bytes),
            max_concurrent_requests: size(self.max_concurrent_requests),
            watch_fall_behind: Duration::from_secs(self.watch_fall_behind_secs),
        };
        let shutdown = Shutdown {
            drain: Duration::from_millis(self.shutdown_drain_ms),
            grace: Duration::from_secs(self.shutdown_grace_secs),
        };
        (limits, shutdown)
    }
}

/// Who may call the server, and over what.
#[derive(Debug, clap::Args)]
pub(super) struct SecurityArgs {
    /// API keys, one `tenant key` a line: every RPC but health checks then needs
    /// `authorization: Bearer <key>` and acts for the key's tenant.
    #[arg(long, env = "CTXD_API_KEYS_FILE", value_name = "FILE")]
    api_keys_file: Option<PathBuf>,
    /// Serve a non-loopback address without API keys: anyone who reaches it can read and write
    /// every session.
    #[arg(
        long,
        env = "CTXD_INSECURE_NO_AUTH",
        conflicts_with = "api_keys_file",
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    insecure_no_auth: bool,
    /// The server's certificate chain (PEM): serve TLS (gRPC, and HTTPS for --http).
    #[arg(long, env = "CTXD_TLS_CERT", value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, env = "CTXD_TLS_KEY", value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Require client certificates signed by this CA (PEM): mutual TLS.
    #[arg(
        long,
        env = "CTXD_TLS_CLIENT_CA",
        value_name = "FILE",
        requires = "tls_cert"
    )]
    tls_client_ca: Option<PathBuf>,
}

impl SecurityArgs {
    /// Reads the keys and TLS files, and refuses to expose an open server: all before the
    /// database is opened or a port bound.
    pub(super) fn build(
        self,
        listen: SocketAddr,
        http: Option<SocketAddr>,
        gateway: Option<SocketAddr>,
    ) -> anyhow::Result<Security> {
        let keys = self
            .api_keys_file
            .as_deref()
            .map(ApiKeys::load)
            .transpose()?;
        // Every door that listens beyond loopback needs keys, unless the operator opens it.
        let open = |addr: SocketAddr| {
            keys.is_none() && !self.insecure_no_auth && !addr.ip().to_canonical().is_loopback()
        };
        if open(listen) {
            anyhow::bail!(
                "refusing to listen on {listen} without API keys: anyone who can reach it could \
                 read and write every session; give --api-keys-file FILE, or --insecure-no-auth \
                 to serve it open anyway"
            );
        }
        if let Some(http) = http
            && open(http)
        {
            anyhow::bail!(
                "refusing to serve the inspector on {http} without API keys: anyone who can \
                 reach it could read every session; give --api-keys-file FILE, or \
                 --insecure-no-auth to serve it open anyway"
            );
        }
        if let Some(gateway) = gateway
            && open(gateway)
        {
            anyhow::bail!(
                "refusing to serve the gateway on {gateway} without API keys: anyone who can \
                 reach it could read every session and spend the provider credentials sent \
                 through it; give --api-keys-file FILE, or --insecure-no-auth to serve it open \
                 anyway"
            );
        }
        let pair = self.tls_cert.as_deref().zip(self.tls_key.as_deref());
        let client_ca = self.tls_client_ca.as_deref();
        let tls = pair
            .map(|(cert, key)| crate::tls::server(cert, key, client_ca))
            .transpose()?;
        // The inspector serves HTTPS with the same certificate, key and client CA.
        let http_tls = pair
            .filter(|_| http.is_some())
            .map(|(cert, key)| crate::tls::http_server(cert, key, client_ca))
            .transpose()?;
        Ok(Security {
            keys,
            tls,
            http_tls,
        })
    }
}

/// What [`SecurityArgs::build`] read: the keys, and TLS for gRPC and for the inspector.
pub(super) struct Security {
    pub(super) keys: Option<ApiKeys>,
    pub(super) tls: Option<ServerTlsConfig>,
    pub(super) http_tls: Option<std::sync::Arc<rustls::ServerConfig>>,
}
