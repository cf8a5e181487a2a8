//! The command line: `ctxd serve` runs the service; the other commands are its client.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

mod client;
mod compact;
mod connect;
mod context;
mod options;
mod panel;
mod sessions;
mod show;
mod summaries;
mod transfer;

use crate::auth::ApiKeys;
use crate::store::Store;
use crate::summarizer::Summarizer;
use options::{GatewayArgs, LimitsArgs, SecurityArgs, StorageArgs, SummarizerArgs};

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
        /// The database: a SQLite file (created and migrated on first start), or a
        /// `postgres://user@host/db` URL (migrated on start; several servers may share it).
        #[arg(long, env = "CTXD_DB", default_value = "ctxd.db")]
        db: String,
        /// Serve Prometheus metrics on this address too (its bound address is printed as a second
        /// line, `ctxd metrics on ADDR`).
        #[arg(long, env = "CTXD_METRICS_LISTEN")]
        metrics_listen: Option<SocketAddr>,
        /// Serve the read-only web inspector and its JSON API (`/api/…`) on this address too,
        /// behind the same API keys (its bound address is printed as `ctxd http on ADDR`).
        #[arg(long, env = "CTXD_HTTP", value_name = "ADDR")]
        http: Option<SocketAddr>,
        #[command(flatten)]
        gateway: Box<GatewayArgs>,
        #[command(flatten)]
        storage: StorageArgs,
        #[command(flatten)]
        summarizer: SummarizerArgs,
        #[command(flatten)]
        limits: LimitsArgs,
        #[command(flatten)]
        security: SecurityArgs,
    },
    /// Copies a SQLite database, consistent at one moment, while a server keeps writing to it
    /// (`VACUUM INTO`); restore by starting `ctxd serve --db` on the copy.
    Backup {
        /// The SQLite file to copy.
        #[arg(long, env = "CTXD_DB", default_value = "ctxd.db")]
        db: String,
        /// The new file to write; it must not exist.
        #[arg(long, value_name = "FILE")]
        to: PathBuf,
    },
    #[command(flatten)]
    Client(client::Command),
}

pub fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_new(&cli.log).context("--log is not a valid filter")?)
        .with_writer(std::io::stderr)
        // Colour codes only where a terminal shows them, never into a log file or a pipe.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
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
            http,
            gateway,
            storage,
            summarizer,
            limits,
            security,
        } => {
            let served = security
                .build(listen, http, gateway.gateway)
                .and_then(|security| {
                    let (limits, shutdown) = limits.build();
                    let options = crate::server::Options {
                        summarizer: summarizer.build()?,
                        limits,
                        shutdown,
                        api_keys: security.keys,
                        tls: security.tls,
                        http: None,
                        http_tls: security.http_tls,
                        retention: storage.retention(),
                        gateway: None,
                        models: gateway.models()?,
                    };
                    let addrs = Addrs {
                        listen,
                        metrics: metrics_listen,
                        http,
                        gateway,
                    };
                    runtime.block_on(serve(addrs, db, storage.config(), options))
                });
            // Calls abandoned after the grace period end here, without holding up the exit.
            runtime.shutdown_timeout(RUNTIME_SHUTDOWN);
            if let Err(e) = served {
                // One line, e.g. `ctxd: /x/ctxd.db: not a SQLite database (bad header)`.
                let _ = writeln!(std::io::stderr(), "ctxd: {e:#}");
                std::process::exit(1);
            }
            Ok(())
        }
        Command::Backup { db, to } => match runtime.block_on(crate::store::backup(&db, &to)) {
            Ok(bytes) => {
                writeln!(
                    std::io::stdout(),
                    "ctxd backup of {db}: {} ({bytes} bytes)",
                    to.display()
                )?;
                Ok(())
            }
            Err(e) => {
                let _ = writeln!(std::io::stderr(), "ctxd: {e}");
                std::process::exit(1);
            }
        },
        Command::Client(command) => client::run(&runtime, command),
    }
}

/// How long the runtime waits for its remaining tasks at exit.
const RUNTIME_SHUTDOWN: Duration = Duration::from_secs(1);
/// How long closing the database (which checkpoints the WAL) may take at exit.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// The addresses `ctxd serve` listens on.
struct Addrs {
    listen: SocketAddr,
    metrics: Option<SocketAddr>,
    http: Option<SocketAddr>,
    gateway: Box<GatewayArgs>,
}

async fn serve(
    addrs: Addrs,
    db: String,
    storage: crate::store::Config,
    mut options: crate::server::Options,
) -> anyhow::Result<()> {
    let Addrs {
        listen,
        metrics: metrics_listen,
        http,
        gateway,
    } = addrs;
    // Its errors name the file and the problem; nothing has been written to a refused file.
    let store = Store::connect(&db, storage).await?;
    // Watched from before the address line: whoever reads it may signal at once.
    let shutdown = shutdown_signal();
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("listening on {listen}"))?;
    let bound = listener.local_addr()?;
    // The first line on stdout: scripts and tests read the bound address from it (and those
    // of metrics and the inspector from the lines after it).
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
    if let Some(addr) = http {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("listening for the inspector on {addr}"))?;
        writeln!(stdout, "ctxd http on {}", listener.local_addr()?)?;
        options.http = Some(listener);
    }
    if let Some(addr) = gateway.gateway {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("listening for the gateway on {addr}"))?;
        writeln!(stdout, "ctxd gateway on {}", listener.local_addr()?)?;
        let reasoning = match gateway.gateway_reasoning.as_str() {
            "drop" => crate::workflow::render::Reasoning::Drop,
            _ => crate::workflow::render::Reasoning::Keep,
        };
        let flags = crate::server::GatewayFlags {
            anthropic_upstream: gateway.anthropic_upstream,
            openai_upstream: gateway.openai_upstream,
            gemini_upstream: gateway.gemini_upstream,
            policy: gateway.gateway_policy,
            windows: gateway.context_windows,
            reasoning,
        };
        options.gateway = Some(crate::server::gateway(listener, flags));
    }
    stdout.flush()?;
    tracing::info!(
        %bound,
        db = %crate::store::Database::parse(&db).shown(),
        summarizer = options.summarizer.as_ref().map(Summarizer::model),
        api_keys = options.api_keys.as_ref().map_or(0, ApiKeys::len),
        tls = options.tls.is_some(),
        "serving"
    );
    if options.api_keys.is_none() && !bound.ip().to_canonical().is_loopback() {
        tracing::warn!(%bound, "serving without API keys on a non-loopback address");
    }
    crate::server::serve_with(listener, store.clone(), options, shutdown).await?;
    // Closing waits for connections still in use; after an abandoned grace period one may be
    // held by a call that will never finish. The WAL holds every commit either way.
    if tokio::time::timeout(CLOSE_TIMEOUT, store.close())
        .await
        .is_err()
    {
        tracing::warn!(
            "the database did not close in time; every commit is in its WAL all the same"
        );
    }
    tracing::info!("stopped");
    Ok(())
}

/// Resolves on SIGINT or SIGTERM.
fn shutdown_signal() -> impl Future<Output = ()> {
    // Registered now, not when first awaited: a SIGTERM sent right after the address line is
    // printed must stop the server cleanly rather than kill it with the default action.
    #[cfg(unix)]
    let signals = {
        use tokio::signal::unix::{SignalKind, signal};
        (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
        )
    };
    async move {
        #[cfg(unix)]
        match signals {
            (Ok(mut interrupt), Ok(mut terminate)) => {
                tokio::select! {
                    _ = interrupt.recv() => {}
                    _ = terminate.recv() => {}
                }
            }
            (interrupt, terminate) => {
                if let Some(e) = [interrupt.err(), terminate.err()]
                    .into_iter()
                    .flatten()
                    .next()
                {
                    tracing::warn!(error = %e, "cannot watch SIGTERM; only SIGINT stops the server");
                }
                let _ = tokio::signal::ctrl_c().await;
            }
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
        tracing::info!("shutting down");
    }
}
