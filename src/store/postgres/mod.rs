//! The PostgreSQL backend: connecting (a pool for reads and writes, one for the group
//! committer), its migrations, and its SQL of the store's seam (`reads`, `writes`,
//! `committer`; the statements both engines run alike are in `store::sql`).
//!
//! Several ctxd processes may serve one database: all state is in it. Writes do not take a
//! process-wide lock as on SQLite; a write transaction locks the rows it reads to decide
//! (`SELECT … FOR UPDATE`: the branch whose head it checks, the plan it commits, the session
//! it pins in), so two writers of the same branch or plan, in one process or two, queue on the
//! row and the second decides on what the first committed. Every statement on a session's
//! data names the session, so the schema can be distributed by it (docs/scaling.md).

mod committer;
mod distribute;
mod fault;
mod reads;
mod writes;

use std::sync::Arc;

use async_trait::async_trait;
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions, PgRow};
use sqlx::{PgConnection, Postgres};

use super::append::commit::{CommitQueue, CommitStats};
use super::backend::{Backend, Footprint, Reads, WriteTx};
use super::read::changes::Changes;
use super::sql::driver::message;
use super::sql::{Tx, run_on_sqlx};
use super::{Config, Error, Result};

pub use distribute::TABLES as DISTRIBUTION;
pub(super) use fault::classify;

/// Opens the database at `url` (a `postgres://` URL), runs the migrations and starts the group
/// committer. An unreachable server or a failed migration is [`Error::Unusable`], naming the
/// server (without its password).
pub(super) async fn open(
    url: &str,
    config: &Config,
    changes: Changes,
    stats: Arc<CommitStats>,
) -> Result<(Arc<dyn Backend>, CommitQueue)> {
    let shown = redact(url);
    let unusable = |problem: String| Error::Unusable {
        path: shown.clone().into(),
        problem,
    };
    let unreachable = |e: sqlx::Error| unusable(format!("cannot be reached: {}", message(&e)));
    let options: PgConnectOptions = url
        .parse()
        .map_err(|e| unusable(format!("not a PostgreSQL URL: {e}")))?;
    // Named in pg_stat_activity, unless the URL names it (an operator telling replicas apart).
    let options = match options.get_application_name() {
        Some(_) => options,
        None => options.application_name("ctxd"),
    };
    // One connection first: an unreachable server is told at once, where a pool would retry
    // until its acquire timeout.
    let probe = <PgConnection as sqlx::Connection>::connect_with(&options)
        .await
        .map_err(unreachable)?;
    let _ = sqlx::Connection::close(probe).await;
    let pool = |size: u32| {
        // No ping before each use: it is a round trip, and a connection found dead fails its
        // statement (UNAVAILABLE, nothing written) and is replaced.
        PgPoolOptions::new()
            .max_connections(size)
            .acquire_timeout(config.busy_timeout)
            .test_before_acquire(false)
    };
    let main = pool(config.pg_pool_size)
        .connect_with(options.clone())
        .await
        .map_err(unreachable)?;
    sqlx::migrate!("./migrations/postgres")
        .run(&main)
        .await
        .map_err(|e| unusable(format!("cannot be migrated: {e}")))?;
    let citus = distribute::citus(&main).await?;
    if citus && config.distribute {
        let done = distribute::distribute(&main)
            .await
            .map_err(|e| unusable(format!("cannot be distributed: {e}")))?;
        if done > 0 {
            tracing::info!(
                tables = done,
                "distributed the tables over the Citus cluster"
            );
        }
    }
    let batching = if citus && distribute::distributed(&main).await? {
        committer::Batching::ByShard
    } else if config.pg_batch_per_session {
        committer::Batching::BySession
    } else {
        committer::Batching::Spread
    };
    let lanes = COMMIT_LANES;
    let workers = (batching == committer::Batching::ByShard && config.pg_direct_to_workers)
        .then(|| Arc::new(committer::Workers::new(options.clone(), lanes)));
    // The committer's own connections: a batch never waits behind the pool's readers.
    let batches = pool(lanes)
        .connect_with(options)
        .await
        .map_err(unreachable)?;
    let lanes = (0..lanes)
        .map(|_| {
            Box::new(Conn(committer::Committer::new(
                batches.clone(),
                batching,
                workers.clone(),
            ))) as Box<dyn super::backend::CommitterConnection>
        })
        .collect();
    let (appends, committer) = CommitQueue::start(lanes, changes, stats, false);
    tokio::spawn(committer);
    let routed = batching != committer::Batching::Spread;
    let backend = PostgresBackend {
        pool: main,
        batches,
        citus,
        routed,
    };
    Ok((Arc::new(backend), appends))
}

/// Transactions of one batch that run at once (a shard's, a session's, or a share of the
/// sessions each).
const COMMIT_LANES: u32 = 8;

/// `url` without its password, for messages and logs.
pub(super) fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    match rest.split_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:****@{host}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

/// A PostgreSQL database, connected.
struct PostgresBackend {
    pool: PgPool,
    batches: PgPool,
    /// The database has the `citus` extension: its size is the cluster's.
    citus: bool,
    /// Writes name one session per statement (see [`Connection::routed`]).
    routed: bool,
}

#[async_trait]
impl Backend for PostgresBackend {
    async fn read(&self) -> Result<Box<dyn Reads>> {
        Ok(Box::new(Conn(self.pool.acquire().await?)))
    }

    async fn begin_write(&self) -> Result<Box<dyn WriteTx>> {
        Ok(Box::new(Conn(Write {
            tx: self.pool.begin().await?,
            kept: self.routed,
        })))
    }

    fn diagnose(&self, error: Error) -> Error {
        error
    }

    async fn set_max_db_bytes(&self, _bytes: Option<u64>) -> Result<u64> {
        Err(crate::domain::Error::FailedPrecondition(
            "max_db_bytes: a size limit applies to a SQLite file; on PostgreSQL, limit the \
             database's tablespace or disk instead"
                .into(),
        )
        .into())
    }

    async fn backup(&self, _to: &std::path::Path) -> Result<u64> {
        Err(crate::domain::Error::FailedPrecondition(
            "to: the database is PostgreSQL: back it up with pg_dump (or the server's own \
             backups)"
                .into(),
        )
        .into())
    }

    async fn footprint(&self) -> Result<Footprint> {
        // On Citus the shards are on the workers: the coordinator's database plus every
        // distributed table's shards, as Citus measures them.
        let sql = if self.citus {
            "SELECT (pg_database_size(current_database())
                     + coalesce((SELECT sum(citus_total_relation_size(logicalrelid))
                                 FROM pg_dist_partition), 0))::BIGINT"
        } else {
            "SELECT pg_database_size(current_database())"
        };
        let bytes: i64 = sqlx::query_scalar(sql).fetch_one(&self.pool).await?;
        Ok(Footprint {
            bytes: u64::try_from(bytes).unwrap_or(0),
            free_bytes: 0,
        })
    }

    /// PostgreSQL's autovacuum reclaims deleted rows by itself.
    async fn release_free_space(&self) -> Result<()> {
        Ok(())
    }

    async fn close(&self) {
        self.batches.close().await;
        self.pool.close().await;
    }
}

/// A transaction on the pool, and whether its writes are routed (see [`Connection::routed`]).
type Write = Tx<Postgres, bool>;

/// A connection the reads run on: a reader's, a write's or the committer's. In a write, the
/// rows a decision reads are locked until it ends.
trait Connection: Send {
    fn conn(&mut self) -> &mut PgConnection;
    fn locks(&self) -> bool;

    /// Every write names one session with constants (a distributed database, where a
    /// statement over rows of several sessions goes to every shard): a batch's head updates
    /// are one statement per head, not one over a VALUES list.
    fn routed(&self) -> bool {
        false
    }
}

/// A connection as the store's seam sees it (this backend's, so its impls of the seam's
/// traits stay apart from another backend's).
struct Conn<C>(C);

impl<C: Connection> Conn<C> {
    fn conn(&mut self) -> &mut PgConnection {
        self.0.conn()
    }

    fn routed(&self) -> bool {
        self.0.routed()
    }
}

impl Connection for PoolConnection<Postgres> {
    fn conn(&mut self) -> &mut PgConnection {
        self
    }

    fn locks(&self) -> bool {
        false
    }
}

impl Connection for Write {
    fn conn(&mut self) -> &mut PgConnection {
        &mut self.tx
    }

    fn locks(&self) -> bool {
        true
    }

    fn routed(&self) -> bool {
        self.kept
    }
}

run_on_sqlx!(Conn, Connection, Postgres, PgRow, |texts| texts);
