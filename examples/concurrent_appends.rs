//! Concurrent appends through one or several ctxd replicas on one database, as docs/scaling.md
//! measures them on PostgreSQL and on a Citus cluster: each replica is a real gRPC server (in
//! this process, each with its own store, pools and group committer) on 127.0.0.1:0, and
//! `--threads` clients append `--appends` times each, spread over the replicas.
//!
//! ```sh
//! cargo run --release --example concurrent_appends -- --db postgres://… --replicas 2
//! cargo run --release --example concurrent_appends -- --db postgres://… --replicas 2 \
//!     --sessions 8 --shared
//! ```
//!
//! Without `--shared` thread `t` appends to session `t mod --sessions` only; with it, every
//! thread appends round all the sessions, those of the second replica the other way round. It
//! prints the wall time and what each replica's committer counted (batches, transactions,
//! conflict retries).

use std::time::Instant;

use clap::Parser;
use ctxd::api::pb::{self, context_store_client::ContextStoreClient};
use ctxd::server::Options;
use ctxd::store::{Config, Store};
use tokio::net::TcpListener;
use tonic::transport::Channel;

#[derive(Parser)]
struct Args {
    /// The database every replica serves (a `postgres://` URL, or a SQLite file for one).
    #[arg(long)]
    db: String,
    #[arg(long, default_value_t = 1)]
    replicas: usize,
    #[arg(long, default_value_t = 16)]
    threads: usize,
    #[arg(long, default_value_t = 50)]
    appends: usize,
    #[arg(long, default_value_t = 16)]
    sessions: usize,
    /// Every thread appends round all the sessions (the second replica's the other way).
    #[arg(long)]
    shared: bool,
    /// Leave distributing the tables to the operator (as `ctxd serve --no-distribute`).
    #[arg(long)]
    no_distribute: bool,
    /// Send every append through the coordinator (as `ctxd serve --pg-coordinator-only`).
    #[arg(long)]
    coordinator_only: bool,
}

fn user(text: String) -> pb::NodeInput {
    pb::NodeInput {
        kind: Some(pb::node_input::Kind::Message(pb::Message {
            role: pb::Role::User.into(),
            parts: vec![pb::ContentPart {
                part: Some(pb::content_part::Part::Text(text)),
            }],
            tool_calls: vec![],
        })),
        pinned: false,
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let config = Config {
        distribute: !args.no_distribute,
        pg_direct_to_workers: !args.coordinator_only,
        ..Config::default()
    };
    let mut stores = Vec::new();
    let mut clients = Vec::new();
    let mut stops = Vec::new();
    for _ in 0..args.replicas.max(1) {
        let store = Store::connect(&args.db, config.clone()).await?;
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(ctxd::server::serve_with(
            listener,
            store.clone(),
            Options::default(),
            async move {
                let _ = stopped.await;
            },
        ));
        let channel = Channel::from_shared(format!("http://{addr}"))?
            .connect()
            .await?;
        clients.push(ContextStoreClient::new(channel));
        stores.push(store);
        stops.push(stop);
    }
    let mut sessions = Vec::new();
    for _ in 0..args.sessions.max(1) {
        let created = clients[0]
            .create_session(pb::CreateSessionRequest::default())
            .await?;
        sessions.push(created.into_inner().session_id);
    }

    let started = Instant::now();
    let mut tasks = Vec::new();
    for thread in 0..args.threads {
        let replica = thread % clients.len();
        let mut client = clients[replica].clone();
        let order: Vec<String> = if args.shared {
            let mut order = sessions.clone();
            order.rotate_left(thread % sessions.len());
            if replica % 2 == 1 {
                order.reverse();
            }
            order
        } else {
            vec![sessions[thread % sessions.len()].clone()]
        };
        let appends = args.appends;
        tasks.push(tokio::spawn(async move {
            for i in 0..appends {
                let session = &order[i % order.len()];
                client
                    .append(pb::AppendRequest {
                        session_id: session.clone(),
                        nodes: vec![user(format!(
                            "thread {thread} append {i}: read the file and say what it does"
                        ))],
                        ..Default::default()
                    })
                    .await?;
            }
            Ok::<_, tonic::Status>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    let wall = started.elapsed();
    let total = args.threads * args.appends;
    println!(
        "{total} appends ({} threads × {}) over {} sessions{} on {} replica(s): {:.3} s, {:.0} appends/s",
        args.threads,
        args.appends,
        sessions.len(),
        if args.shared { " (shared)" } else { "" },
        stores.len(),
        wall.as_secs_f64(),
        total as f64 / wall.as_secs_f64()
    );
    for (i, store) in stores.iter().enumerate() {
        let c = store.commit_counts();
        println!(
            "replica {i}: {} batches, {} transactions ({} written at once), {} conflict retries",
            c.batches, c.transactions, c.at_once, c.conflict_retries
        );
    }
    drop(clients);
    for stop in stops {
        let _ = stop.send(());
    }
    for store in &stores {
        store.close().await;
    }
    Ok(())
}
