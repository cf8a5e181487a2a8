//! The command line: `ctxd serve` runs the service; the other commands are its client.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use tonic::transport::ServerTlsConfig;
use tracing_subscriber::EnvFilter;

mod client;
mod json;
mod panel;
mod show;

use crate::api::auth::ApiKeys;
use crate::store::Store;
use crate::summarizer::{Config as SummarizerConfig, Summarizer};

#[derive(Debug, Parser)]
#[command(
    name = "ctxd",
    version,
    about = "A persistent session store for LLM agents"
)]
struct Cli {
    /// Log filter, in RUST_LOG syntax (e.g. `info`, `ctxd=debug,sqlx=warn`).
    #[arg(long, env = "CTXD_LOG", default_value = "info", global = true)]
    log: String,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Runs the gRPC service.
    Serve {
        /// Address to listen on; port 0 picks a free port (the bound address is printed).
        #[arg(long, env = "CTXD_LISTEN", default_value = "127.0.0.1:50051")]
        listen: SocketAddr,
        /// SQLite file, created and migrated on first start.
        #[arg(long, env = "CTXD_DB", default_value = "ctxd.db")]
        db: PathBuf,
        /// Serve Prometheus metrics on this address too (its bound address is printed as a second
        /// line, `ctxd metrics on ADDR`).
        #[arg(long, env = "CTXD_METRICS_LISTEN")]
        metrics_listen: Option<SocketAddr>,
        #[command(flatten)]
        summarizer: SummarizerArgs,
        #[command(flatten)]
        security: SecurityArgs,
    },
    #[command(flatten)]
    Client(client::Command),
}

/// The server's own summarizer, for the `Compact` RPC.
#[derive(Debug, clap::Args)]
struct SummarizerArgs {
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

/// Who may call the server, and over what.
#[derive(Debug, clap::Args)]
struct SecurityArgs {
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
    /// The server's certificate chain (PEM): serve TLS.
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
    fn build(
        self,
        listen: SocketAddr,
    ) -> anyhow::Result<(Option<ApiKeys>, Option<ServerTlsConfig>)> {
        let keys = self
            .api_keys_file
            .as_deref()
            .map(ApiKeys::load)
            .transpose()?;
        if keys.is_none() && !self.insecure_no_auth && !listen.ip().to_canonical().is_loopback() {
            anyhow::bail!(
                "refusing to listen on {listen} without API keys: anyone who can reach it could \
                 read and write every session; give --api-keys-file FILE, or --insecure-no-auth \
                 to serve it open anyway"
            );
        }
        let tls = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some(crate::tls::server(
                cert,
                key,
                self.tls_client_ca.as_deref(),
            )?),
            _ => None,
        };
        Ok((keys, tls))
    }
}

impl SummarizerArgs {
    fn build(self) -> anyhow::Result<Option<Summarizer>> {
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
            timeout: std::time::Duration::from_secs(self.summarizer_timeout_secs),
        })?))
    }
}

pub fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_new(&cli.log).context("--log is not a valid filter")?)
        .with_writer(std::io::stderr)
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    match cli.command {
        Command::Serve {
            listen,
            db,
            metrics_listen,
            summarizer,
            security,
        } => {
            let served = security.build(listen).and_then(|(api_keys, tls)| {
                let options = crate::server::Options {
                    summarizer: summarizer.build()?,
                    api_keys,
                    tls,
                };
                runtime.block_on(serve(listen, db, metrics_listen, options))
            });
            if let Err(e) = served {
                // One line, causes included: the operator's terminal or a unit's journal.
                let _ = writeln!(std::io::stderr(), "ctxd: {e:#}");
                std::process::exit(1);
            }
            Ok(())
        }
        Command::Client(command) => client::run(&runtime, command),
    }
}

async fn serve(
    listen: SocketAddr,
    db: PathBuf,
    metrics_listen: Option<SocketAddr>,
    options: crate::server::Options,
) -> anyhow::Result<()> {
    let store = Store::open(&db)
        .await
        .with_context(|| format!("opening {}", db.display()))?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("listening on {listen}"))?;
    let bound = listener.local_addr()?;
    // The one line on stdout: scripts and tests read the bound address from it.
    let mut stdout = std::io::stdout();
    writeln!(stdout, "ctxd listening on {bound}")?;
    if let Some(addr) = metrics_listen {
        let handle = crate::metrics::install()?;
        let metrics = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("listening for metrics on {addr}"))?;
        writeln!(stdout, "ctxd metrics on {}", metrics.local_addr()?)?;
        // Ends with the process: scrapes need no draining.
        tokio::spawn(crate::metrics::serve(
            metrics,
            handle,
            std::future::pending(),
        ));
    }
    stdout.flush()?;
    tracing::info!(
        %bound,
        db = %db.display(),
        summarizer = options.summarizer.as_ref().map(Summarizer::model),
        api_keys = options.api_keys.as_ref().map_or(0, ApiKeys::len),
        tls = options.tls.is_some(),
        "serving"
    );
    if options.api_keys.is_none() && !bound.ip().to_canonical().is_loopback() {
        tracing::warn!(%bound, "serving without API keys on a non-loopback address");
    }
    crate::server::serve_with(listener, store.clone(), options, shutdown_signal()).await?;
    store.close().await;
    tracing::info!("stopped");
    Ok(())
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut terminate = match tokio::signal::unix::signal(
            tokio::signal::unix::SignalKind::terminate(),
        ) {
            Ok(signal) => signal,
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch SIGTERM; only SIGINT stops the server");
                let _ = interrupt.await;
                return;
            }
        };
        tokio::select! {
            _ = interrupt => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = interrupt.await;
    tracing::info!("shutting down");
}
