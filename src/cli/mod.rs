//! The command line: `ctxd serve` runs the service.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

use crate::store::Store;

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
    },
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
        Command::Serve { listen, db } => runtime.block_on(serve(listen, db)),
    }
}

async fn serve(listen: SocketAddr, db: PathBuf) -> anyhow::Result<()> {
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
    stdout.flush()?;
    tracing::info!(%bound, db = %db.display(), "serving");
    crate::server::serve(listener, store.clone(), shutdown_signal()).await?;
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
